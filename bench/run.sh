#!/bin/sh
# bench/run.sh: the benchmark harness behind `make bench`. For each spec:
# generate the package, build its bench program against this build tree's
# runtime, run it; every figure goes to the terminal table and to one CSV
# (bench-out/results.csv), with the GPU's own ceilings measured in the run.
#
#   make bench                         # the specs in BENCH_SPECS
#   make bench BENCH_SPECS="specs/x.yaml specs/y.yaml"
#
# Needs a CUDA device; without one it says so and exits 77 (skipped).
set -u
: "${MG:?MG must point at the mamba-gen binary}"
out=${BENCH_OUT:-bench-out}
mkdir -p "$out"
csv=$out/results.csv
echo "model,precision,what,batch,seqlen,median_ms,min_ms,tokens_per_s,gbps,frac_copy,tflops,frac_gemm" > "$csv"
if ! "${MG_DEVINFO:-mg-devinfo}" -q; then
  echo "bench: no CUDA device; nothing measured"
  exit 77
fi
status=0
for spec in "$@"; do
  name=$(basename "$spec" .yaml)
  dir=$out/$name
  echo "== $spec"
  if ! "$MG" -q "$spec" -o "$dir"; then status=1; continue; fi
  if ! make -s -C "$dir" "${name}_bench" NVCC="${NVCC:-nvcc}" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
       MG_RUNTIME_CFLAGS="$MG_RUNTIME_CFLAGS" MG_RUNTIME_LIBS="$MG_RUNTIME_LIBS" >"$dir/build.log" 2>&1; then
    echo "bench: build of $name failed:"; tail -30 "$dir/build.log"; status=1; continue
  fi
  "$dir/${name}_bench" --csv "$csv" ${BENCH_ARGS:-} || status=1
  echo
done
echo "CSV: $csv"
exit $status
