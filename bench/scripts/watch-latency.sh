#!/usr/bin/env bash
# watch-latency.sh: watch event latency (put -> event received), cairn beside
# etcd on the same machine and filesystem.
#
# Starts one fresh etcd and one fresh cairn (data dirs in one temp dir,
# random loopback ports in 20000-40000), then runs bench/watchlat.py against
# them in alternation (etcd, cairn, etcd, cairn, ...): one watcher on a
# prefix, PUTS puts under it, open loop at RATE puts/s; each run uses its own
# prefix. Prints every run, then the medians over the runs of each system's
# p50 and p99 and the cairn/etcd ratio.
#
# Bounded: watchlat waits at most 30 s for the last event and every RPC has
# a timeout; server start-up waits at most 30 s; the script stops only the
# PIDs it started. With 2 or more cores, servers are pinned to CPU 0 and
# watchlat to CPU 1 (taskset).
#
# Usage: bench/scripts/watch-latency.sh [--reps 3] [--puts 3000] [--rate 300]
#          [--value-size 64] [--build build] [--no-pin]
# Data dirs go under $TMPDIR (default /tmp).
# Needs: etcd and etcdctl 3.4 on PATH, <build>/cairn, /usr/bin/python3 with
#        python3-grpcio and python3-protobuf, protoc.
set -euo pipefail

REPS=3
PUTS=3000
RATE=300
VSIZE=64
BUILD=build
PIN=1

while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --puts) PUTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --value-size) VSIZE=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --no-pin) PIN=0; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "watch-latency: unknown argument $1" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/../.."
. bench/scripts/lib-servers.sh
CAIRN=$BUILD/cairn
PY=/usr/bin/python3
[ -x "$CAIRN" ] || { echo "watch-latency: $CAIRN not found (cmake --build $BUILD)" >&2; exit 2; }
command -v etcd >/dev/null || { echo "watch-latency: etcd not on PATH" >&2; exit 2; }
command -v etcdctl >/dev/null || { echo "watch-latency: etcdctl not on PATH" >&2; exit 2; }
"$PY" -c 'import grpc' 2>/dev/null || { echo "watch-latency: $PY has no grpc" >&2; exit 2; }

SERVER_PIN=()
LOAD_PIN=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  SERVER_PIN=(taskset -c 0)
  LOAD_PIN=(taskset -c 1)
  echo "watch-latency: servers pinned to CPU 0, watchlat to CPU 1"
else
  echo "watch-latency: not pinning (no taskset, one core, or --no-pin)"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/watch-latency.XXXXXX")
trap 'lib_cleanup; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

declare -A EP
lib_start_server etcd "$(command -v etcd)"
EP[etcd]=$ENDPOINT
lib_start_server cairn "$CAIRN"
EP[cairn]=$ENDPOINT

RESULTS=$WORK/results.txt
for rep in $(seq "$REPS"); do
  for s in etcd cairn; do
    line=$("${LOAD_PIN[@]}" "$PY" bench/watchlat.py --endpoint "${EP[$s]}" --puts "$PUTS" \
      --rate "$RATE" --value-size "$VSIZE" --prefix "/watchlat/$rep/" 2>"$WORK/last.txt") ||
      { echo "watch-latency: watchlat failed against $s: $line" >&2; cat "$WORK/last.txt" >&2; exit 1; }
    echo "  rep $rep $s $line"
    echo "$s $line" >>"$RESULTS"
  done
done

field() { # field SYSTEM NAME -> the values of NAME=... for SYSTEM, one a line
  awk -v s="$1" -v f="$2" '$1 == s { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == f) print kv[2] } }' "$RESULTS"
}

echo
echo "watch event latency (put sent -> event received), medians of $REPS runs,"
echo "$PUTS puts at $RATE/s open loop, one watcher, values of $VSIZE bytes:"
printf "%-6s %12s %12s %12s %12s %12s %12s\n" system "event p50 ms" "event p99 ms" "ack p50 ms" \
  "ack p99 ms" "gap p50 ms" "gap p99 ms"
declare -A M
for s in etcd cairn; do
  for f in event_p50_ms event_p99_ms ack_p50_ms ack_p99_ms gap_p50_ms gap_p99_ms; do
    M[$s,$f]=$(field "$s" "$f" | lib_median)
  done
  printf "%-6s %12.3f %12.3f %12.3f %12.3f %12.3f %12.3f\n" "$s" "${M[$s,event_p50_ms]}" \
    "${M[$s,event_p99_ms]}" "${M[$s,ack_p50_ms]}" "${M[$s,ack_p99_ms]}" "${M[$s,gap_p50_ms]}" \
    "${M[$s,gap_p99_ms]}"
done
awk -v a="${M[cairn,event_p50_ms]}" -v b="${M[etcd,event_p50_ms]}" \
    -v c="${M[cairn,event_p99_ms]}" -v d="${M[etcd,event_p99_ms]}" \
    -v e="${M[cairn,ack_p50_ms]}" -v f="${M[etcd,ack_p50_ms]}" \
    -v g="${M[cairn,ack_p99_ms]}" -v h="${M[etcd,ack_p99_ms]}" \
  'BEGIN { printf "%-6s %11.2fx %11.2fx %11.2fx %11.2fx\n", "ratio", a / b, c / d, e / f, g / h }'
echo "(ratio = cairn / etcd; below 1 means cairn is faster. gap = event received minus"
echo " Put answered: what the watch path adds after the commit; no ratio, it can be negative)"
