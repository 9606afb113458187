#!/bin/sh
# tools/ptx-dump.sh: the device code of every kernel a spec's package
# compiles to, as normalized PTX, for proving that a refactor of the
# templates or kernel headers changed no device code (ptxas is
# deterministic: the same PTX gives the same machine code).
#
#   tools/ptx-dump.sh MAMBA_GEN OUTDIR SPEC.yaml...
#
# For each spec: generate the package with MAMBA_GEN into OUTDIR/NAME/pkg,
# compile each of its .cu files to PTX with the emitted Makefile's flags
# (-std=c++17 -O3, the spec's target) and write OUTDIR/NAME/FILE.ptx with
# comments dropped, the per-file hashes of anonymous-namespace and internal
# names replaced by ANON / INTERNAL, label numbers (which count functions in
# file order) dropped, and the functions sorted by name (so moving a kernel within or
# across files of the package shows no difference). Then
#   diff -r -x pkg BEFORE AFTER
# says whether two trees emit the same device code for these specs, and
#   tools/ptx-match.py BEFORE AFTER
# whether every kernel of BEFORE still has an instance with its exact code
# (for a change that turned kernels into templates or added parameters).
# MAMBA_GEN may be a wrapper script (e.g. one running mamba-gen --templates
# DIR of an older tree: git archive REV templates | tar -x -C DIR).
# Env: MG_RUNTIME_CFLAGS (-I of the runtime headers), NVCC (default nvcc),
# JOBS (default nproc).
set -eu
[ $# -ge 3 ] || { echo "usage: $0 MAMBA_GEN OUTDIR SPEC.yaml..." >&2; exit 2; }
mg=$1 out=$2; shift 2
NVCC=${NVCC:-nvcc}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
norm() {  # normalize PTX on stdin
  python3 -c '
import re, sys
t = sys.stdin.read()
# per-file hashes in the names of anonymous-namespace and internal symbols
t = re.sub(r"_GLOBAL__N__[0-9a-f]{8}_[0-9]+_[A-Za-z0-9_]+?_cu_[0-9a-f]{8}", "ANON", t)
t = re.sub(r"_INTERNAL_[0-9a-f]{8}_[0-9]+_[A-Za-z0-9_]+?_cu_[0-9a-f]{8}", "INTERNAL", t)
# label and local-depot numbers count functions in file order
t = re.sub(r"\$L__BB[0-9]+_", "$L__BB_", t)
t = re.sub(r"__local_depot[0-9]+", "__local_depot", t)
t = re.sub(r"//[^\n]*", "", t)
lines = [l.rstrip() for l in t.split("\n") if l.strip()]
head, funcs, cur = [], [], None
for l in lines:
    if re.match(r"^(\.visible |\.weak |\.extern )*\.(entry|func)\b", l):
        cur = [l]; funcs.append(cur)
    elif cur is not None:
        cur.append(l)
    else:
        head.append(l)
print("\n".join(head))
for f in sorted(funcs, key=lambda f: f[0]):
    print("\n".join(f))
'
}
one() {
  spec=$1 name=$(basename "$1" .yaml)
  dir=$out/$name
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  "$mg" -q --gpu none "$spec" -o "$dir/pkg" || return 1
  arch=$(sed -n 's/^ARCH ?= *//p' "$dir/pkg/Makefile")
  for cu in "$dir"/pkg/*.cu; do
    base=$(basename "$cu" .cu)
    (cd "$dir/pkg" && "$NVCC" -std=c++17 -arch="$arch" -O3 -I. ${MG_RUNTIME_CFLAGS:-} -ptx "$base.cu" -o "$base.ptx") ||
      return 1
    # one file per kind of code, whatever the .cu is called
    norm < "$dir/pkg/$base.ptx" > "$dir/${base#"$name"_}.ptx" || return 1
  done
}
# the specs JOBS at a time; a spec that fails to generate or compile is
# named in $out/.failed, and the exit status is 1
rm -f "$out/.failed"
n=0
for spec in "$@"; do
  ( one "$spec" || echo "$spec" >> "$out/.failed" ) &
  n=$((n + 1))
  if [ "$n" -ge "$jobs" ]; then wait; n=0; fi
done
wait
if [ -f "$out/.failed" ]; then
  echo "$0: failed to generate or compile: $(tr '\n' ' ' < "$out/.failed")" >&2
  rm -f "$out/.failed"
  exit 1
fi
