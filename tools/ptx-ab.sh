#!/bin/sh
# tools/ptx-ab.sh: whether a change of the templates changed the device
# code, without a GPU: the same specs generated from two template trees
# (BEFORE, e.g. a git revision's templates/, and AFTER) and compiled to
# normalized PTX by tools/ptx-dump.sh (ptxas is deterministic: the same PTX
# gives the same machine code, so "same" proves the kernels unchanged).
# For a change meant to keep every kernel (a refactor), or to change only
# some specs' kernels (a choice that depends on the shape), before `make
# digest-ab` and `make bench-ab` on a GPU.
#
#   tools/ptx-ab.sh OUTDIR BEFORE_TEMPLATES AFTER_TEMPLATES SPEC.yaml...
#   git archive REV templates | tar -x -C /tmp/old   # BEFORE = /tmp/old/templates
#
# Prints one line per spec and compiled file: "NAME FILE.ptx: same" or
# "NAME FILE.ptx: DIFFERS (N of M lines)", with the kernels whose code
# differs; exit 0 when everything is the same, 1 when something differs or
# fails to generate or compile, 2 on usage errors. The normalized PTX stays
# in OUTDIR/before and OUTDIR/after (diff them for the details).
# Env: MG (the mamba-gen binary, default ./mamba-gen), NVCC,
# MG_RUNTIME_CFLAGS (`make ptx-ab` sets them), JOBS (compiles at a time).
set -u
[ $# -ge 4 ] || { echo "usage: $0 OUTDIR BEFORE_TEMPLATES AFTER_TEMPLATES SPEC.yaml..." >&2; exit 2; }
out=$1 before=$2 after=$3; shift 3
mg=${MG:-./mamba-gen}
here=$(cd "$(dirname "$0")" && pwd)
for d in "$before" "$after"; do
  [ -d "$d" ] || { echo "$0: $d: not a directory of templates" >&2; exit 2; }
done
for spec in "$@"; do
  [ -f "$spec" ] || { echo "$0: $spec: no such spec" >&2; exit 2; }
done
case $mg in /*) ;; *) mg=$(pwd)/$mg ;; esac
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
rm -f "$out/.differs"   # (the mark of a difference, below: none yet)
status=0
for side in before after; do
  tpl=$before; [ $side = after ] && tpl=$after
  tpl=$(cd "$tpl" && pwd)
  # the generator of this side: mamba-gen with the side's templates
  printf '#!/bin/sh\nexec "%s" --templates "%s" "$@"\n' "$mg" "$tpl" > "$out/mg-$side" && chmod +x "$out/mg-$side" || exit 2
  rm -rf "${out:?}/$side"
  if ! sh "$here/ptx-dump.sh" "$out/mg-$side" "$out/$side" "$@" > "$out/$side.log" 2>&1; then
    echo "ptx-ab: the $side side failed to generate or compile ($out/$side.log):"
    tail -n 15 "$out/$side.log"
    status=1
  fi
done
[ "$status" = 0 ] || exit 1
for spec in "$@"; do
  name=$(basename "$spec" .yaml)
  for f in "$out/before/$name"/*.ptx "$out/after/$name"/*.ptx; do
    [ -f "$f" ] && basename "$f"
  done | LC_ALL=C sort -u | while read -r file; do
    a=$out/before/$name/$file b=$out/after/$name/$file
    if [ ! -f "$a" ] || [ ! -f "$b" ]; then
      echo "$name $file: only in $([ -f "$a" ] && echo before || echo after)"
      echo x >> "$out/.differs"
    elif cmp -s "$a" "$b"; then
      echo "$name $file: same"
    else
      n=$(diff "$a" "$b" | grep -c '^[<>]')
      echo "$name $file: DIFFERS ($n of $(($(wc -l < "$a") + $(wc -l < "$b"))) lines)"
      # the functions whose code differs (ptx-dump sorted them by name; a
      # function's name: the word before its parameter list, after the
      # return value's parenthesis of a .func that has one)
      for side_f in "$a" "$b"; do
        awk '/^(\.visible |\.weak |\.extern )*\.(entry|func)/ {
               s = $0; if (s ~ /\.func[ \t]+\(/) sub(/^[^)]*\)[ \t]*/, "", s)
               sub(/\(.*/, "", s); sub(/.*[ \t]/, "", s); name = s }
             name != "" { print name "\t" $0 }' "$side_f" > "$side_f.byfn"
      done
      # (each side's functions gathered in one pass, then compared)
      awk -F'\t' 'FNR == NR { a[$1] = a[$1] "\n" substr($0, length($1) + 2); next }
                  { b[$1] = b[$1] "\n" substr($0, length($1) + 2) }
                  END { for (f in a) if (!(f in b) || a[f] != b[f]) print "  " f
                        for (f in b) if (!(f in a)) print "  " f }' "$a.byfn" "$b.byfn" | LC_ALL=C sort
      echo x >> "$out/.differs"
    fi
  done
done
if [ -f "$out/.differs" ]; then rm -f "$out/.differs"; exit 1; fi
exit 0
