# bench/plot.gp: the benchmark plots, as SVG (gnuplot, Debian package
# gnuplot-nox). Called by bench/plot.sh, which turns the CSVs into the data
# files read here:
#   gnuplot -e "kind='sweep'; data='F'; out='X.svg'; ttl='...'; nblocks=N" bench/plot.gp
#     F: one block per (batch, seqlen) (blocks separated by two blank lines),
#        a header line "batch x seqlen", then "chunk median_ms" rows (the
#        fastest scan block size per chunk); the block's sequential-scan time
#        is in the third column of every row (a dashed line), the generic
#        variant's time (model dims as kernel arguments) in the fourth (a
#        dotted line); NaN where there is none.
#   gnuplot -e "kind='roofline'; data='F'; out='X.svg'; ttl='...'; bw=GBPS; peak=TFLOPS; peak2=TFLOPS; nblocks=N" bench/plot.gp
#     F: one block per kind of work (a header line naming it), "intensity
#        tflops" rows (intensity in flop/byte); peak is the bf16 GEMM
#        ceiling, peak2 the f32 one (0: not measured, no roof drawn).
#   gnuplot -e "kind='latency'; data='F'; out='X.svg'; ttl='...'; nblocks=N" bench/plot.gp
#     F: one block per model (a header line), "batch p50_us p99_us" rows.
# noenhanced: model names contain underscores, which enhanced text would
# turn into subscripts.
set terminal svg size 900,600 dynamic noenhanced font "sans,12" background "white"
set output out
set title ttl noenhanced
set grid
set key outside right top noenhanced

if (kind eq 'sweep') {
  set logscale x 2
  set logscale y
  set xlabel "chunk size (timesteps)"
  set ylabel "scan time (ms, median, L2 flushed)"
  set label 1 "dashed: sequential scan; dotted: generic (dims as kernel arguments)" at screen 0.01, screen 0.02 font ",9"
  set xrange [12:340]
  set xtics (16, 32, 64, 128, 256)
  plot for [i=0:nblocks-1] data index i using 1:2 with linespoints lw 2 pt 7 lc i+1 title columnheader(1), \
       for [i=0:nblocks-1] data index i using 1:3 with lines dt 2 lc i+1 notitle, \
       for [i=0:nblocks-1] data index i using 1:4 with lines dt 3 lc i+1 notitle
} else {
if (kind eq 'latency') {
  set logscale x 2
  set xlabel "batch (streams stepped together)"
  set ylabel "one decode step (microseconds)"
  set yrange [0:*]
  set label 1 "solid: p50; dashed: p99" at screen 0.01, screen 0.02 font ",9"
  plot for [i=0:nblocks-1] data index i using 1:2 with linespoints lw 2 pt 7 lc i+1 title columnheader(1), \
       for [i=0:nblocks-1] data index i using 1:3 with linespoints lw 1 dt 2 pt 6 lc i+1 notitle
} else {
  set logscale xy
  set xlabel "arithmetic intensity (flop/byte moved)"
  set ylabel "achieved TFLOP/s"
  roof(x) = (bw * x / 1000.0 < peak) ? bw * x / 1000.0 : peak
  roof2(x) = (bw * x / 1000.0 < peak2) ? bw * x / 1000.0 : peak2
  set samples 400
  set xrange [0.01:10000]
  if (peak2 > 0) {
    plot roof(x) with lines lw 2 lc rgb "#444444" title sprintf("roof: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s", bw, peak), \
         roof2(x) with lines lw 1 dt 2 lc rgb "#888888" title sprintf("roof: f32 GEMM %.1f TFLOP/s", peak2), \
         for [i=0:nblocks-1] data index i using 1:2 with points pt (5 + 2 * i) ps 1.3 lc i+1 title columnheader(1)
  } else {
    plot roof(x) with lines lw 2 lc rgb "#444444" title sprintf("roof: copy %.0f GB/s, GEMM %.0f TFLOP/s", bw, peak), \
         for [i=0:nblocks-1] data index i using 1:2 with points pt (5 + 2 * i) ps 1.3 lc i+1 title columnheader(1)
  }
}
}
