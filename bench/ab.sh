#!/bin/sh
# bench/ab.sh: the harness behind `make bench-ab`: the bench of the same
# specs generated from two template trees (BEFORE, e.g. a git revision's
# templates/, and this build's own, or AFTER), timed on one GPU in one
# session with the sides alternating (before, after, before, after, ...),
# then compared row by row (bench/compare.py: each side's lowest median,
# the change, and whether it exceeds the spread of the side's own runs).
# Why: timings move by up to 25% between GPU machines and drift within a
# session; a change is only measured against the other side of the same
# machine and the same minutes.
#
#   make bench-ab BENCH_BEFORE=DIR [BENCH_SPECS=...] [BENCH_AB_ROUNDS=2]
#   git archive REV templates | tar -x -C /tmp/old   # DIR = /tmp/old/templates
#
# Round 1 builds each side's packages (bench/run.sh with BENCH_TEMPLATES);
# later rounds rerun the built bench programs. Output in OUTDIR:
# before-N/, after-N/ (results.csv per round), compare.txt, compare.csv.
# Env: as bench/run.sh (MG, MG_DEVINFO, MG_RUNTIME_*; BENCH_ARGS, e.g.
# "--only train"), BENCH_AB_AFTER (templates of the after side; default
# the ones built into mamba-gen), BENCH_AB_ROUNDS (default 2),
# BENCH_BEFORE_COMMIT / MG_BENCH_COMMIT (the commit columns of the two
# sides; default "before" / this tree's, as bench/run.sh names it),
# BENCH_AB_AFTER_SPECS (the after side's specs instead of the same ones:
# one per spec, in order, each with the same file name and `name:`, e.g. a
# copy with another chunk_size; with BEFORE = this tree's templates it
# times two spec choices against each other), BENCH_AB_MORE ("NAME=DIR
# ...": more sides, each the before side's specs from the templates in DIR,
# timed in the same rounds after the two sides, before, after, NAME1,
# NAME2, ..., and each compared with the before side in compare-NAME.txt
# and compare-NAME.csv, its commit column NAME: one session builds the
# before side once for several candidate changes). No CUDA device: exit 77.
set -u
[ $# -ge 3 ] || { echo "usage: $0 OUTDIR BEFORE_TEMPLATES SPEC.yaml..." >&2; exit 2; }
out=$1 before=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$before" ] || { echo "$0: $before: not a directory of templates" >&2; exit 2; }
after=${BENCH_AB_AFTER:-}
[ -z "$after" ] || [ -d "$after" ] || { echo "$0: $after: not a directory of templates" >&2; exit 2; }
# more sides: "NAME=DIR ..." -> names in $more, DIR of each in more_dir_NAME
more=
for m in ${BENCH_AB_MORE:-}; do
  mn=${m%%=*} md=${m#*=}
  case $m in *=*) ;; *) mn=;; esac
  case $mn in
    ''|*[!A-Za-z0-9_]*|before|after) echo "$0: BENCH_AB_MORE: '$m': want NAME=DIR, NAME of letters, digits and _ (not before or after)" >&2; exit 2;;
  esac
  [ -d "$md" ] || { echo "$0: BENCH_AB_MORE: $md: not a directory of templates" >&2; exit 2; }
  case " $more " in *" $mn "*) echo "$0: BENCH_AB_MORE: the side $mn is named twice" >&2; exit 2;; esac
  more="$more $mn"
  eval "more_dir_$mn=\$md"
done
rounds=${BENCH_AB_ROUNDS:-2}
case $rounds in ''|*[!0-9]*|0) echo "$0: BENCH_AB_ROUNDS must be a positive integer" >&2; exit 2;; esac
command -v python3 >/dev/null 2>&1 || { echo "$0: python3 is needed for the comparison" >&2; exit 2; }
. "$here/lib.sh"
[ -n "${MG_BENCH_COMMIT:-}" ] || MG_BENCH_COMMIT=$(bench_commit "$here/..")
after_commit=$MG_BENCH_COMMIT
before_commit=${BENCH_BEFORE_COMMIT:-before}
# the after side's specs: by default the same files
specs="$*"
after_specs=${BENCH_AB_AFTER_SPECS:-$specs}
spec_name() { sed -n 's/^name: *\([A-Za-z0-9_]*\).*/\1/p' "$1"; }
if [ "$after_specs" != "$specs" ]; then
  set -- $after_specs
  n=$(echo $specs | wc -w)
  [ $# -eq "$n" ] || { echo "$0: BENCH_AB_AFTER_SPECS names $# specs, the comparison $n" >&2; exit 2; }
  # pairwise, in order: the rows of the two sides meet by model name, and
  # round 2 finds a side's bench program by the file name
  for b in $specs; do
    a=$1; shift
    [ -f "$a" ] || { echo "$0: $a: no such spec (BENCH_AB_AFTER_SPECS)" >&2; exit 2; }
    [ "$(basename "$a")" = "$(basename "$b")" ] ||
      { echo "$0: $a: the after spec must have the file name of $b (the rows are matched by it)" >&2; exit 2; }
    na=$(spec_name "$a") nb=$(spec_name "$b")
    [ "$na" = "$nb" ] || { echo "$0: $a: name '$na', $b: name '$nb' (the rows are matched by it)" >&2; exit 2; }
  done
fi
mkdir -p "$out" || exit 2
rm -rf "$out"/before-* "$out"/after-* "$out"/more-* "$out"/compare-*

# side NAME TEMPLATES COMMIT ROUND: one side's bench of every spec
side() {
  sd=$1 stpl=$2 scm=$3 srd=$4; shift 4
  d=$out/$sd-$srd
  if [ "$srd" = 1 ]; then
    BENCH_OUT=$d BENCH_TEMPLATES=$stpl BENCH_TUNE=0 BENCH_PRECISIONS=own MG_BENCH_COMMIT=$scm \
      "${SHELL:-sh}" "$here/run.sh" "$@" > "$d.log" 2>&1
    return $?
  fi
  mkdir -p "$d" && head -n 1 "$out/$sd-1/results.csv" > "$d/results.csv" || return 1
  for spec in "$@"; do
    n=$(basename "$spec" .yaml)
    # shellcheck disable=SC2086
    MG_BENCH_COMMIT=$scm "$out/$sd-1/$n/${n}_bench" --csv "$d/results.csv" ${BENCH_ARGS:-} >> "$d.log" 2>&1 || return 1
  done
}
i=1
while [ "$i" -le "$rounds" ]; do
  for s in before after $more; do
    case $s in
      before) sd=before tpl=$before c=$before_commit sp=$specs;;
      after) sd=after tpl=$after c=$after_commit sp=$after_specs;;
      *) sd=more-$s c=$s sp=$specs; eval "tpl=\$more_dir_$s";;
    esac
    # shellcheck disable=SC2086
    side $sd "$tpl" "$c" "$i" $sp
    st=$?
    if [ $st = 77 ]; then echo "bench-ab: no CUDA device; nothing measured"; exit 77; fi
    if [ $st != 0 ]; then echo "bench-ab: the $s side of round $i failed (see $out/$sd-$i.log):"; tail -20 "$out/$sd-$i.log"; exit 1; fi
    echo "bench-ab: round $i, $s: done"
  done
  i=$((i + 1))
done
# results SD: the results files of side SD, one per round
results() { r=1; while [ "$r" -le "$rounds" ]; do printf ' %s' "$out/$1-$r/results.csv"; r=$((r + 1)); done; }
# compare SD NAME: side SD's runs against the before side's, into NAME.txt and NAME.csv
compare() {
  # shellcheck disable=SC2046
  python3 "$here/compare.py" --before $(results before) --after $(results "$1") --csv "$out/$2.csv" > "$out/$2.txt" || exit 1
  cat "$out/$2.txt"
  echo "CSV: $out/$2.csv"
}
compare after compare
for s in $more; do
  echo "== $s against before"
  compare "more-$s" "compare-$s"
done
