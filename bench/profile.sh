#!/bin/sh
# bench/profile.sh: the harness behind `make profile`. Where a bench row's
# time goes, kernel by kernel, measured with Nsight Compute: for one spec,
# its bench program is built (bench/lib.sh), run once to read the ceilings
# of this GPU, then once per requested row under
#   ncu --clock-control none --profile-from-start off --metrics ...
# with `--only ROW --profile` (the bench program runs that row's warm-up,
# then exactly one run between cudaProfilerStart/Stop, so ncu sees that
# run's kernels and nothing else). bench/ncu_summary.py sums each row's
# launches per kernel and launch shape: time, share, achieved DRAM
# bandwidth and f32 FLOP rate as fractions of the ceilings of the same run,
# SM throughput, achieved occupancy, the largest warp stall reasons
# (per-reason stall metrics, as ncu's WarpStateStats section charts them). Table on the terminal, CSV in
# $BENCH_OUT/profile-NAME.csv, ncu's raw CSV per row beside it.
#
#   make profile PROFILE_SPEC=specs/mamba1_rl.yaml PROFILE_ROWS="prefill b64 T256;train step (graph) b64 T256"
#
# PROFILE_KERNEL=REGEX (e.g. scan_fused): also one launch of the kernels
# matching REGEX in each row under `ncu --set full --import-source yes`
# (every section, PC sampling), kept as $BENCH_OUT/profile-NAME-I.ncu-rep
# for the Nsight Compute GUI, with two text digests beside it: its details
# page (-I.details.txt: speed of light, occupancy, warp state, memory),
# bench/ncu_hotspots.py over its SASS source page (-I.hotspots.txt: the
# instructions where the warps wait, and on what) and bench/ncu_lines.py
# over its CUDA source page correlated with the SASS (-I.lines.txt: the
# samples per source line and per phase, the regions between the kernels'
# phase marker comments). The bench program is built with -lineinfo for
# this (line tables only: the same machine code).
#
# ROWS: row labels "WHAT bBATCH TSEQLEN" as the bench names them (the CSV's
# what, batch and seqlen columns), separated by ';' (a label matches where it
# is not followed by a digit: "prefill b64" is every prefill row at batch 64).
# Needs a CUDA device and ncu ($NCU, else ncu on PATH, else
# $CUDA_HOME/bin/ncu); without either it says so and exits 77 (skipped).
set -u
: "${MG:?MG must point at the mamba-gen binary}"
. "$(dirname "$0")/lib.sh"
spec=${1:?usage: profile.sh SPEC 'ROW[;ROW...]'}
rows=${2:?usage: profile.sh SPEC 'ROW[;ROW...]'}
out=${BENCH_OUT:-bench-out}
ncu=${NCU:-$(command -v ncu || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")}
here=$(cd "$(dirname "$0")" && pwd)
if ! "${MG_DEVINFO:-mg-devinfo}" -q; then
  echo "profile: no CUDA device; nothing measured"; exit 77
fi
if [ ! -x "$ncu" ]; then
  echo "profile: no ncu (set NCU or put Nsight Compute's ncu on PATH)"; exit 77
fi
name=$(basename "$spec" .yaml)
dir=$out/$name
mkdir -p "$out"
BENCH_NVCCFLAGS=${BENCH_NVCCFLAGS:-"-O3 -lineinfo"} bench_build "$spec" "$dir" || exit 1
bin=$dir/${name}_bench
# The ceilings of this GPU (the program prints them before any row; no row
# has this label, so it stops there).
ceil=$("$bin" --only "no row has this label" | sed -n 's/^ceilings: copy \([0-9.]*\) GB\/s.* f32 GEMM \([0-9.]*\) TFLOP\/s.*/\1 \2/p')
copy=${ceil% *}
f32=${ceil#* }
[ -n "$ceil" ] || { echo "profile: could not read the ceilings from $bin"; exit 1; }
echo "== $spec on $("${MG_DEVINFO:-mg-devinfo}" | sed -n 's/^device 0: //p'): copy $copy GB/s, f32 GEMM $f32 TFLOP/s"
csv=$out/profile-$name.csv
rm -f "$csv"
metrics=$(python3 -c "import sys; sys.path.insert(0, '$here'); import ncu_summary; print(','.join(ncu_summary.METRICS))")
status=0
i=0
old_ifs=$IFS
IFS=';'
for row in $rows; do
  IFS=$old_ifs
  i=$((i + 1))
  raw=$out/ncu-$name-$i.csv
  rm -f "$raw"
  if ! "$ncu" --clock-control none --profile-from-start off --print-units base --csv --log-file "$raw" \
       --metrics "$metrics" "$bin" --only "$row" --profile --iters 1 > "$out/profile-$name-$i.txt" 2>&1; then
    echo "profile: ncu failed on row '$row':"; tail -20 "$out/profile-$name-$i.txt"; status=1; continue
  fi
  python3 "$here/ncu_summary.py" --row "$row" --copy-gbps "$copy" --f32-tflops "$f32" --csv "$csv" "$raw" || status=1
  if [ -n "${PROFILE_KERNEL:-}" ]; then
    rep=$out/profile-$name-$i
    if "$ncu" --clock-control none --profile-from-start off -k "regex:$PROFILE_KERNEL" -c 1 --set full \
         --import-source yes -f -o "$rep" "$bin" --only "$row" --profile --iters 1 > "$rep.log" 2>&1 &&
       [ -f "$rep.ncu-rep" ]; then
      "$ncu" --import "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
      "$ncu" --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.sass.csv" 2>&1
      echo "-- $PROFILE_KERNEL in '$row': $rep.ncu-rep, $rep.details.txt"
      python3 "$here/ncu_hotspots.py" "$rep.sass.csv" > "$rep.hotspots.txt" 2>&1
      head -n 32 "$rep.hotspots.txt"
      "$ncu" --import "$rep.ncu-rep" --page source --print-source cuda,sass --csv > "$rep.lines.csv" 2>&1
      python3 "$here/ncu_lines.py" --src-dir "$dir" "$rep.lines.csv" > "$rep.lines.txt" 2>&1
      echo "-- by phase and source line ($rep.lines.txt):"
      head -n 64 "$rep.lines.txt"
    else
      echo "profile: ncu captured no kernel matching '$PROFILE_KERNEL' in row '$row' ($rep.log):"
      tail -n 5 "$rep.log"
      status=1
    fi
  fi
  echo
done
IFS=$old_ifs
echo "CSV: $csv"
exit $status
