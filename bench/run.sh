#!/bin/sh
# bench/run.sh: the benchmark harness behind `make bench`. For each spec:
# generate the package, build its bench program against this build tree's
# runtime, run it; every figure goes to the terminal table and to one CSV
# (bench-out/results.csv), with the GPU's own ceilings measured in the run.
# Then, for Mamba-1 and Mamba-3 SISO specs, the autotuning sweep of the scan
# (mamba-tune, at $MG_TUNE): every chunk size x block size, and the generic
# variant (the same kernel with the model dims as kernel arguments), verified
# and timed, into bench-out/tune-NAME.csv (the cache is not touched:
# --no-cache); its "specialized best vs generic: X.XXx" lines are repeated in
# a summary at the end. `make plots` draws both (bench/plot.sh).
#
#   make bench                         # the specs in BENCH_SPECS
#   make bench BENCH_SPECS="specs/x.yaml specs/y.yaml"
#   make bench BENCH_TUNE=0            # no sweep
#   make bench BENCH_PRECISIONS="f32 bf16"   # each spec in each storage dtype
#                                      # (variants NAME_bf16 in bench-out/specs/)
#   make bench TUNE_ARGS="--seqlen 1024,4096 --batch 1,8"
#   make bench BENCH_TEMPLATES=DIR BENCH_OUT=bench-b
#                                      # generate from the template tree DIR
#                                      # (e.g. another branch's), into bench-b/
#
# Needs a CUDA device; without one it says so and exits 77 (skipped).
set -u
: "${MG:?MG must point at the mamba-gen binary}"
. "$(dirname "$0")/lib.sh"
out=${BENCH_OUT:-bench-out}
mkdir -p "$out"
csv=$out/results.csv
rm -f "$out/speedup.txt"
echo "model,precision,what,batch,seqlen,median_ms,min_ms,tokens_per_s,gbps,frac_copy,tflops,frac_gemm,p99_ms,ceil_copy_gbps,ceil_bf16_tflops,ceil_f32_tflops,gpu,driver_cuda,runtime_cuda,commit,date_utc,spec_sha256" > "$csv"
if ! "${MG_DEVINFO:-mg-devinfo}" -q; then
  echo "bench: no CUDA device; nothing measured"
  exit 77
fi
# The mamba-gen commit every CSV row names: $MG_BENCH_COMMIT when set, else
# the source tree's git HEAD, else the .commit file of a `make dist` tarball.
if [ -z "${MG_BENCH_COMMIT:-}" ]; then
  MG_BENCH_COMMIT=$(bench_commit "$(cd "$(dirname "$0")/.." && pwd)")
fi
export MG_BENCH_COMMIT
status=0
for spec0 in "$@"; do
 for prec in ${BENCH_PRECISIONS:-own}; do
  spec=$(bench_variant "$spec0" "$prec" "$out/specs") || { status=1; continue; }
  name=$(basename "$spec" .yaml)
  dir=$out/$name
  echo "== $spec"
  if ! bench_build "$spec" "$dir"; then status=1; continue; fi
  "$dir/${name}_bench" --csv "$csv" ${BENCH_ARGS:-} || status=1
  echo
  if [ "${BENCH_TUNE:-1}" != 0 ] && [ -n "${MG_TUNE:-}" ] && [ -x "$MG_TUNE" ] && \
     grep -Eq '^arch: *(mamba1|mamba3_siso)( |#|$)' "$spec"; then
    echo "== sweep (mamba-tune) $spec"
    "$MG_TUNE" --no-cache ${BENCH_TEMPLATES:+--templates "$BENCH_TEMPLATES"} --csv "$out/tune-$name.csv" ${TUNE_ARGS:-} "$spec" > "$out/tune-$name.txt" || status=1
    cat "$out/tune-$name.txt"
    grep '^specialized best vs generic: ' "$out/tune-$name.txt" | sed "s/^/$name: /" >> "$out/speedup.txt"
  fi
 done
done
if [ -s "$out/speedup.txt" ]; then
  echo "== speedup of the specialized kernels over the generic variant (same templates, dims as runtime arguments)"
  cat "$out/speedup.txt"
fi
echo "CSV: $csv"
ls "$out"/tune-*.csv 2>/dev/null | sed 's/^/sweep CSV: /'
echo "plots: make plots (gnuplot)"
exit $status
