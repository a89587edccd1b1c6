#!/usr/bin/env bash
# plot.sh DIR: the PNG plots of a scripts/bench.sh results dir, with gnuplot
# (Debian package gnuplot-nox; skipped without it):
#   ycsb-a.png      YCSB A throughput-latency curve (p50 and p99 against the
#                   achieved throughput), etcd and cairn;
#   cdf-<case>.png  latency CDF of etcd and cairn for each peak and mixed
#                   case, the watch latency and YCSB A at etcd's saturation
#                   rate (repetition 1 of each).
set -euo pipefail
DIR=${1:?usage: plot.sh RESULT-DIR}
command -v gnuplot >/dev/null || { echo "plot: gnuplot not installed (Debian: gnuplot-nox); no plots"; exit 0; }
cd "$DIR"

if [ -s ycsb.dat ]; then
  gnuplot <<'EOF'
set terminal pngcairo size 1000,600 noenhanced
set output 'ycsb-a.png'
set title 'YCSB A (50% read, 50% update), open loop: latency against achieved throughput'
set xlabel 'achieved throughput (ops/s)'
set ylabel 'latency (ms, log scale)'
set logscale y
set grid
set key outside right top
plot 'ycsb.dat' index 0 using 3:5 with linespoints lw 2 lc rgb '#d62728' title 'etcd p99', \
     ''         index 0 using 3:4 with linespoints lw 1 dt 2 lc rgb '#d62728' title 'etcd p50', \
     ''         index 1 using 3:5 with linespoints lw 2 lc rgb '#1f77b4' title 'cairn p99', \
     ''         index 1 using 3:4 with linespoints lw 1 dt 2 lc rgb '#1f77b4' title 'cairn p50'
EOF
  echo "plot: ycsb-a.png"
fi

sat=$(cat etcd-saturation-rate.txt 2>/dev/null || true)
cases="put range range-ser range-prefix-ser txn-cas mixed-a mixed-b watch"
[ -n "$sat" ] && cases="$cases ycsb-a-$sat"
for c in $cases; do
  e=cdf/$c.etcd.1.txt
  k=cdf/$c.cairn.1.txt
  [ -s "$e" ] && [ -s "$k" ] || continue
  gnuplot <<EOF
set terminal pngcairo size 800,500 noenhanced
set output 'cdf-$c.png'
set title 'latency CDF: $c (repetition 1)'
set xlabel 'latency (ms, log scale)'
set ylabel 'fraction of operations at or below'
set logscale x
set yrange [0:1]
set grid
set key bottom right
plot '$e' using 1:2 with steps lw 2 lc rgb '#d62728' title 'etcd', \
     '$k' using 1:2 with steps lw 2 lc rgb '#1f77b4' title 'cairn'
EOF
  echo "plot: cdf-$c.png"
done
