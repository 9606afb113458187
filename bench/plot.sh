#!/bin/sh
# bench/plot.sh: SVG plots of the benchmark results with gnuplot
# (bench/plot.gp), behind `make plots`:
#   DIR/plots/roofline.svg        every row of DIR/results.csv (make bench) on
#                                 a roofline: achieved TFLOP/s against flop per
#                                 byte, under the measured copy-bandwidth and
#                                 GEMM ceilings of the run
#   DIR/plots/sweep-MODEL.svg     for each DIR/tune-MODEL.csv (mamba-tune
#                                 --csv; make bench writes them): scan time
#                                 against chunk size, one line per batch x
#                                 seqlen (the fastest block size per chunk),
#                                 the sequential scan dashed, the generic
#                                 variant (model dims as kernel arguments)
#                                 dotted; and on stdout one line per shape:
#                                 "specialized best vs generic: X.XXx"
#
#   bench/plot.sh [DIR]            (default bench-out)
# Needs gnuplot (Debian: apt-get install gnuplot-nox). Exit 77 without it.
set -u
dir=${1:-bench-out}
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plots: gnuplot not found (Debian: apt-get install gnuplot-nox)" >&2
  exit 77
fi
mkdir -p "$dir/plots"
status=0 made=0

# ---- sweeps: tune-*.csv columns
# model,precision,gpu,mode,chunk,threads,channels,batch,seqlen,median_ms,min_ms,verified,status[,speedup_vs_generic]
# (mode chunked | sequential | generic; column 14 on the generic's rows: the
# specialized best vs generic ratio of the shape)
for csv in "$dir"/tune-*.csv; do
  [ -f "$csv" ] || continue
  model=$(basename "$csv" .csv); model=${model#tune-}
  data=$dir/plots/sweep-$model.dat
  awk -F, 'NR > 1 && $12 == 1 && $10 != "" {
      k = $8 "x" $9
      if (!(k in seen)) { seen[k] = 1; order[++n] = k; bat[k] = $8; sl[k] = $9 }
      if ($4 == "chunked") { c = k SUBSEP $5; if (!(c in best) || $10 < best[c]) best[c] = $10; ch[$5] = 1 }
      else if ($4 == "generic") gen[k] = $10
      else if (!(k in seq) || $10 < seq[k]) seq[k] = $10
      gpu = $3; name = $1 " (" $2 ")"
    }
    END {
      for (i = 1; i <= n; i++) {
        k = order[i]
        if (i > 1) printf "\n\n"
        printf "\"batch %s x seqlen %s\"\n", bat[k], sl[k]
        for (c = 16; c <= 256; c *= 2)
          if ((k SUBSEP c) in best)
            printf "%d %s %s %s\n", c, best[k SUBSEP c], (k in seq) ? seq[k] : "NaN", (k in gen) ? gen[k] : "NaN"
      }
      print n > "/dev/stderr"
    }' "$csv" > "$data" 2> "$data.n"
  n=$(cat "$data.n"); rm -f "$data.n"
  awk -F, -v m="$model" 'NR > 1 && $4 == "generic" && $14 != "" {
      printf "plots: %s %sx%s: specialized best vs generic: %.2fx\n", m, $8, $9, $14 }' "$csv"
  gpu=$(awk -F, 'NR == 2 { print $3; exit }' "$csv")
  if [ "${n:-0}" -gt 0 ] && gnuplot -e "kind='sweep'; data='$data'; out='$dir/plots/sweep-$model.svg'; \
        ttl='$model: selective scan vs chunk size ($gpu)'; nblocks=$n" "$here/plot.gp"; then
    echo "plots: $dir/plots/sweep-$model.svg"; made=$((made + 1))
  else
    echo "plots: no verified measurements in $csv (or gnuplot failed)" >&2; status=1
  fi
done

# ---- roofline: results.csv columns
# model,precision,what,batch,seqlen,median_ms,min_ms,tokens_per_s,gbps,frac_copy,tflops,frac_gemm
if [ -f "$dir/results.csv" ]; then
  data=$dir/plots/roofline.dat
  awk -F, 'NR > 1 && $9 > 0 && $11 > 0 {
      printf "\"%s %s %dx%d\" %.6g %.6g\n", $1, $3, $4, $5, $11 * 1000 / $9, $11
      if ($10 > 0 && $9 / $10 > bw) bw = $9 / $10
      if ($12 > 0) { p = $11 / $12; if (p > hi) hi = p; if (lo == 0 || p < lo) lo = p }
    }
    END { printf "%g %g %g\n", bw, hi, lo > "/dev/stderr" }' "$dir/results.csv" > "$data" 2> "$data.c"
  set -- $(cat "$data.c"); rm -f "$data.c"
  if [ -s "$data" ] && [ "${1:-0}" != 0 ] && gnuplot -e "kind='roofline'; data='$data'; out='$dir/plots/roofline.svg'; \
        ttl='mamba-gen benchmarks on the roofline of this GPU'; bw=$1; peak=$2; peak2=$3" "$here/plot.gp"; then
    echo "plots: $dir/plots/roofline.svg"; made=$((made + 1))
  else
    echo "plots: no usable rows in $dir/results.csv (or gnuplot failed)" >&2; status=1
  fi
fi
[ "$made" -gt 0 ] || { echo "plots: nothing to plot in $dir (run make bench first)" >&2; status=1; }
exit $status
