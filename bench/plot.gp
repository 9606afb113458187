# bench/plot.gp: the benchmark plots, as SVG (gnuplot, Debian package
# gnuplot-nox). Called by bench/plot.sh, which turns the CSVs into the data
# files read here:
#   gnuplot -e "kind='sweep'; data='F'; out='X.svg'; ttl='...'; nblocks=N" bench/plot.gp
#     F: one block per (batch, seqlen) (blocks separated by two blank lines),
#        a header line "batch x seqlen", then "chunk median_ms" rows (the
#        fastest scan block size per chunk); the block's sequential-scan time
#        is in the third column of every row (a dashed line), the generic
#        variant's time (model dims as kernel arguments) in the fourth (a
#        dotted line); NaN where there is none. hasseq=0/1, hasgen=0/1 (default
#        1): whether the legend names the dashed and the dotted lines.
#   gnuplot -e "kind='roofline'; data='F'; out='X.svg'; ttl='...'; bw=GBPS; peak=TFLOPS; peak2=TFLOPS; nblocks=N" bench/plot.gp
#     F: one block per kind of work (a header line naming it), "intensity
#        tflops" rows (intensity in flop/byte); peak is the bf16 GEMM
#        ceiling, peak2 the f32 one (0: not measured, no roof drawn; with
#        peak 0, the f32 one is the roof).
#   gnuplot -e "kind='latency'; data='F'; out='X.svg'; ttl='...'; nblocks=N" bench/plot.gp
#     F: one block per model (a header line), "batch p50_us p99_us" rows.
# subttl='...' (optional, all kinds): a second title line, the run the data
# comes from (file, GPU, commit, date).
# The line styles (dashed, dotted) are explained in the legend, by entries
# drawn in grey: no free-standing notes to collide with the axis labels.
# noenhanced: model names contain underscores, which enhanced text would
# turn into subscripts.
set terminal svg size 900,600 dynamic noenhanced font "sans,12" background "white"
set output out
if (exists("subttl") && strlen(subttl) > 0) {
  set title ttl . "\n" . subttl noenhanced
} else {
  set title ttl noenhanced
}
set grid
set key outside right top noenhanced

if (kind eq 'sweep') {
  if (!exists("hasseq")) { hasseq = 1 }
  if (!exists("hasgen")) { hasgen = 1 }
  set logscale x 2
  set logscale y
  set xlabel "chunk size (timesteps)"
  set ylabel "scan time (ms, median, L2 flushed)"
  set xrange [12:340]
  set xtics (16, 32, 64, 128, 256)
  # the legend under the plot, in columns: the plot keeps the picture's width
  set key below center horizontal maxcols 3 width 1
  plot for [i=0:nblocks-1] data index i using 1:2 with linespoints lw 2 pt 7 lc i+1 title columnheader(1), \
       for [i=0:nblocks-1] data index i using 1:3 with lines dt 2 lc i+1 notitle, \
       for [i=0:nblocks-1] data index i using 1:4 with lines dt 3 lc i+1 notitle, \
       NaN with lines lw 2 lc rgb "#666666" title "chunked scan, best block size", \
       NaN with lines dt 2 lc rgb "#666666" title (hasseq ? "sequential scan" : ""), \
       NaN with lines dt 3 lc rgb "#666666" title (hasgen ? "generic (dims as kernel arguments)" : "")
} else {
if (kind eq 'latency') {
  set logscale x 2
  set xlabel "batch (streams stepped together)"
  set ylabel "one decode step (microseconds)"
  set yrange [0:*]
  set key below center horizontal maxcols 3 width 1
  plot for [i=0:nblocks-1] data index i using 1:2 with linespoints lw 2 pt 7 lc i+1 title columnheader(1), \
       for [i=0:nblocks-1] data index i using 1:3 with linespoints lw 1 dt 2 pt 6 lc i+1 notitle, \
       NaN with linespoints lw 2 pt 7 lc rgb "#666666" title "p50", \
       NaN with linespoints lw 1 dt 2 pt 6 lc rgb "#666666" title "p99"
} else {
  set logscale xy
  set xlabel "arithmetic intensity (flop/byte moved)"
  set ylabel "achieved TFLOP/s"
  # a run of f32 specs only measured no bf16 rate: its roof is the f32 one
  gemm = sprintf("bf16 GEMM %.0f TFLOP/s", peak)
  if (peak <= 0 && peak2 > 0) { peak = peak2; peak2 = 0; gemm = sprintf("f32 GEMM %.1f TFLOP/s", peak) }
  roof(x) = (bw * x / 1000.0 < peak) ? bw * x / 1000.0 : peak
  roof2(x) = (bw * x / 1000.0 < peak2) ? bw * x / 1000.0 : peak2
  set samples 400
  set xrange [0.01:10000]
  # the legend inside, bottom right (below the roof, where no point lies):
  # the plot keeps the picture's width
  set key inside right bottom box opaque
  if (peak2 > 0) {
    plot roof(x) with lines lw 2 lc rgb "#444444" title sprintf("roof: copy %.0f GB/s, %s", bw, gemm), \
         roof2(x) with lines lw 1 dt 2 lc rgb "#888888" title sprintf("roof: f32 GEMM %.1f TFLOP/s", peak2), \
         for [i=0:nblocks-1] data index i using 1:2 with points pt (5 + 2 * i) ps 1.3 lc i+1 title columnheader(1)
  } else {
    plot roof(x) with lines lw 2 lc rgb "#444444" title sprintf("roof: copy %.0f GB/s, %s", bw, gemm), \
         for [i=0:nblocks-1] data index i using 1:2 with points pt (5 + 2 * i) ps 1.3 lc i+1 title columnheader(1)
  }
}
}
