#!/bin/sh
# bench/plot.sh: SVG plots of the benchmark results with gnuplot
# (bench/plot.gp), behind `make plots`:
#   DIR/plots/roofline.svg        every row of DIR/results.csv (make bench) on
#                                 a roofline: achieved TFLOP/s against flop per
#                                 byte, under the measured copy-bandwidth and
#                                 GEMM ceilings of the run (one marker per
#                                 kind of work)
#   DIR/plots/decode-latency.svg  the decode latency curve: p50 and p99 of
#                                 one step against batch size, per model
#   DIR/plots/sweep-MODEL.svg     for each DIR/tune-MODEL.csv (mamba-tune
#                                 --csv; make bench writes them): scan time
#                                 against chunk size, one line per batch x
#                                 seqlen (the fastest block size per chunk),
#                                 the sequential scan dashed, the generic
#                                 variant (model dims as kernel arguments)
#                                 dotted; and on stdout one line per shape:
#                                 "specialized best vs generic: X.XXx"
# The run's GPU, mamba-gen commit and date (the provenance columns of the
# 22-column format) go under the title.
#
#   bench/plot.sh [DIR]            (default bench-out)
#   PLOT_CSV="F.csv ..." bench/plot.sh [DIR]
#     stored runs (bench/results/): each F.csv, a results CSV (`make bench`)
#     or a sweep CSV (mamba-tune --csv; told apart by the header), drawn into
#     DIR/plots/ (default: the plots/ folder beside the first F.csv) as
#     F-roofline.svg and F-decode-latency.svg, or F-sweep.svg; the file name
#     goes under the title too. Shell patterns in PLOT_CSV are expanded.
# Needs gnuplot (Debian: apt-get install gnuplot-nox). Exit 77 without it.
set -u
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plots: gnuplot not found (Debian: apt-get install gnuplot-nox)" >&2
  exit 77
fi
status=0 made=0

# ---- sweeps: tune-*.csv columns
# model,precision,gpu,mode,chunk,threads,channels,batch,seqlen,median_ms,min_ms,verified,status[,speedup_vs_generic]
# (mode chunked | sequential | generic; column 14 on the generic's rows: the
# specialized best vs generic ratio of the shape)
# sweep CSV SVG MODEL FILE: FILE, when not empty, named under the title
sweep() {
  csv=$1 svg=$2 model=$3
  data=${svg%.svg}.dat
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
  sub=${4:+$4: }$gpu
  # which of the dashed (sequential) and dotted (generic) lines there are
  set -- $(awk '$1 ~ /^[0-9]/ { if ($3 != "NaN") s = 1; if ($4 != "NaN") g = 1 }
      END { print s + 0, g + 0 }' "$data")
  if [ "${n:-0}" -gt 0 ] && gnuplot -e "kind='sweep'; data='$data'; out='$svg'; \
        ttl='$model: selective scan vs chunk size'; subttl='$sub'; nblocks=$n; hasseq=$1; hasgen=$2" "$here/plot.gp"; then
    echo "plots: $svg"; made=$((made + 1))
  else
    echo "plots: no verified measurements in $csv (or gnuplot failed)" >&2; status=1
  fi
}

# ---- roofline: results.csv columns
# model,precision,what,batch,seqlen,median_ms,min_ms,tokens_per_s,gbps,frac_copy,tflops,frac_gemm,
# p99_ms,ceil_copy_gbps,ceil_bf16_tflops,ceil_f32_tflops,gpu,driver_cuda,runtime_cuda,commit,date_utc,spec_sha256
# The roofs are the ceilings the run measured (columns 14-16); a CSV of the
# 12-column format (before they were stored) gets them back from the
# fractions. One marker per kind of work (prefill, decode, SSM core,
# training, other), named in the legend: no per-point labels to overlap.
# results CSV ROOFLINE_SVG LATENCY_SVG FILE: FILE, when not empty, named
# under the titles
results() {
  csv=$1 roof=$2 lat=$3
  # the run's provenance (22-column format): "GPU, commit C, YYYY-MM-DD"
  sub=$(awk -F, 'NR > 1 && NF == 22 && $17 != "" {
      printf "%s, commit %s, %s", $17, $20, substr($21, 1, 10); exit }' "$csv")
  sub=${4:-}${4:+${sub:+: }}$sub
  data=${roof%.svg}.dat
  awk -F, '
    function kind(w) {
      sub(/^ +/, "", w)
      if (w ~ /^prefill/) return "prefill"
      if (w ~ /^decode/) return "decode"
      if (w ~ /^ssm core/ || w ~ /^(fwd|bwd|scan|prep|angles|gate)/) return "SSM core"
      if (w ~ /train/ || w ~ /backward/) return "training"
      return "other"
    }
    NR > 1 && (NF == 12 || NF == 22) && $9 > 0 && $11 > 0 {   # (older CSVs have rows split by a comma in "what")
      k = kind($3)
      if (!(k in n)) { n[k] = 0; order[++nk] = k }
      pts[k, ++n[k]] = sprintf("%.6g %.6g", $11 * 1000 / $9, $11)
      if ($14 > 0) { bw = $14; bf = $15; f32 = $16 }
      else {
        # the largest fraction has the fewest rounded digits lost
        if ($10 > fb) { fb = $10; bw = $9 / $10 }
        if ($12 > 0) {
          if ($2 == "f32") { if ($12 > ff) { ff = $12; f32 = $11 / $12 } }
          else if ($12 > fg) { fg = $12; bf = $11 / $12 }
        }
      }
    }
    END {
      for (i = 1; i <= nk; i++) {
        k = order[i]
        if (i > 1) printf "\n\n"
        printf "\"%s\"\n", k
        for (j = 1; j <= n[k]; j++) print pts[k, j]
      }
      printf "%g %g %g %d\n", bw, bf, f32, nk > "/dev/stderr"
    }' "$csv" > "$data" 2> "$data.c"
  set -- $(cat "$data.c"); rm -f "$data.c"
  if [ -s "$data" ] && [ "${1:-0}" != 0 ] && gnuplot -e "kind='roofline'; data='$data'; out='$roof'; \
        ttl='mamba-gen benchmarks on the measured roofline of the GPU'; subttl='$sub'; \
        bw=$1; peak=$2; peak2=$3; nblocks=$4" "$here/plot.gp"; then
    echo "plots: $roof"; made=$((made + 1))
  else
    echo "plots: no usable rows in $csv (or gnuplot failed)" >&2; status=1
  fi
  # ---- decode latency: the "decode latency (graph)" rows, p50 (median_ms)
  # and p99 (p99_ms) against batch, one block per model
  data=${lat%.svg}.dat
  awk -F, 'NR > 1 && $3 == "decode latency (graph)" && $13 != "" {
      m = $1 " (" $2 ")"
      if (!(m in seen)) { seen[m] = 1; order[++n] = m }
      rows[m] = rows[m] sprintf("%d %.6g %.6g\n", $4, $6 * 1000, $13 * 1000)
    }
    END {
      for (i = 1; i <= n; i++) { if (i > 1) printf "\n\n"; printf "\"%s\"\n%s", order[i], rows[order[i]] }
      print n > "/dev/stderr"
    }' "$csv" > "$data" 2> "$data.n"
  n=$(cat "$data.n"); rm -f "$data.n"
  [ "${n:-0}" -gt 0 ] || rm -f "$data"
  if [ "${n:-0}" -gt 0 ]; then
    if gnuplot -e "kind='latency'; data='$data'; out='$lat'; \
          ttl='decode step latency (CUDA Graph replay, L2 flushed)'; subttl='$sub'; nblocks=$n" "$here/plot.gp"; then
      echo "plots: $lat"; made=$((made + 1))
    else
      echo "plots: gnuplot failed on $data" >&2; status=1
    fi
  fi
}

if [ -n "${PLOT_CSV:-}" ]; then
  set -- ${1:-}
  first=
  for csv in $PLOT_CSV; do first=$csv; break; done
  dir=${1:-$(dirname "$first")}
  mkdir -p "$dir/plots"
  for csv in $PLOT_CSV; do
    if [ ! -f "$csv" ]; then echo "plots: $csv: no such file" >&2; status=1; continue; fi
    base=$(basename "$csv" .csv)
    case $(head -1 "$csv") in
      model,precision,what,*) results "$csv" "$dir/plots/$base-roofline.svg" "$dir/plots/$base-decode-latency.svg" "$base.csv" ;;
      model,precision,gpu,mode,*)
        model=$(awk -F, 'NR == 2 { print $1; exit }' "$csv")
        sweep "$csv" "$dir/plots/$base-sweep.svg" "${model:-$base}" "$base.csv" ;;
      *) echo "plots: $csv: neither a bench CSV (make bench) nor a sweep CSV (mamba-tune --csv)" >&2; status=1 ;;
    esac
  done
  [ "$made" -gt 0 ] || { echo "plots: nothing plotted from $PLOT_CSV" >&2; status=1; }
  exit $status
fi

dir=${1:-bench-out}
mkdir -p "$dir/plots"
for csv in "$dir"/tune-*.csv; do
  [ -f "$csv" ] || continue
  model=$(basename "$csv" .csv); model=${model#tune-}
  sweep "$csv" "$dir/plots/sweep-$model.svg" "$model" ""
done
[ -f "$dir/results.csv" ] && results "$dir/results.csv" "$dir/plots/roofline.svg" "$dir/plots/decode-latency.svg" ""
[ "$made" -gt 0 ] || { echo "plots: nothing to plot in $dir (run make bench first)" >&2; status=1; }
exit $status
