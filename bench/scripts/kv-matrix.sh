#!/usr/bin/env bash
# kv-matrix.sh: one server, a fixed matrix of cairn-loadgen runs, medians.
#
# Starts a fresh etcd (default) or cairn (--server cairn) with its data in a
# temp dir (on $TMPDIR's filesystem, default /tmp) and random loopback ports,
# preloads the key space, then runs every case below --reps times, cases
# interleaved (1 2 3 .. 1 2 3 ..) so that drift in the machine's load hits
# all of them alike, and prints per case the median of each column.
# Closed-loop cases show peak throughput; open-loop cases (YCSB A at fixed
# rates) show latency from the scheduled send time.
#
# Bounded: each run stops by itself (--duration, hard cap in the loadgen);
# the script stops only the PID it started. With 2+ cores the server runs on
# CPU 0 and the loadgen on CPU 1.
#
# Usage: bench/scripts/kv-matrix.sh [--server etcd|cairn] [--reps N]
#          [--duration S] [--keys N] [--cases "put-c16 range-c16 ..."]
#          [--build DIR] [--out FILE.csv] [--no-pin]
set -euo pipefail

SERVER=etcd
REPS=3
DURATION=5
KEYS=10000
BUILD=build
OUT=""
PIN=1
CASES=""

# name | cairn-loadgen flags
MATRIX='
put-c16|--workload put --clients 16
put-c64|--workload put --clients 64
range-c16|--workload range --clients 16
range-c64|--workload range --clients 64
range-ser-c16|--workload range --clients 16 --serializable
range-prefix-c16|--workload range-prefix --clients 16
txn-cas-c16|--workload txn-cas --clients 16
txn-cas-zipf-c16|--workload txn-cas --clients 16 --dist zipfian
ycsb-a-r500|--workload a --rate 500
ycsb-a-r1000|--workload a --rate 1000
ycsb-a-r2000|--workload a --rate 2000
ycsb-a-r4000|--workload a --rate 4000
'

while [ $# -gt 0 ]; do
  case "$1" in
    --server) SERVER=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --keys) KEYS=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-pin) PIN=0; shift ;;
    -h|--help) sed -n '2,20p' "$0"; echo "cases:"; echo "$MATRIX" | sed '/^$/d; s/^/  /'; exit 0 ;;
    *) echo "kv-matrix: unknown argument $1" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/../.."
. bench/scripts/lib-servers.sh
LOADGEN=$BUILD/cairn-loadgen
[ -x "$LOADGEN" ] || { echo "kv-matrix: $LOADGEN not found (cmake --build $BUILD --target cairn-loadgen)" >&2; exit 2; }
case "$SERVER" in
  etcd) BIN=$(command -v etcd) || { echo "kv-matrix: etcd not on PATH" >&2; exit 2; } ;;
  cairn) BIN=$BUILD/cairn; [ -x "$BIN" ] || { echo "kv-matrix: $BIN not built yet" >&2; exit 2; } ;;
  *) echo "kv-matrix: --server etcd|cairn" >&2; exit 2 ;;
esac

SERVER_PIN=()
LOAD_PIN=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  SERVER_PIN=(taskset -c 0)
  LOAD_PIN=(taskset -c 1)
  echo "kv-matrix: $SERVER pinned to CPU 0, cairn-loadgen to CPU 1"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kv-matrix.XXXXXX")
trap 'lib_cleanup; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

lib_start_server "$SERVER" "$BIN"
"${LOAD_PIN[@]}" "$LOADGEN" --endpoint "$ENDPOINT" --workload load --keys "$KEYS" --clients 32 \
  --duration 120 >"$WORK/preload.txt" 2>&1 || { cat "$WORK/preload.txt" >&2; exit 1; }
grep '^load:' "$WORK/preload.txt"

[ -n "$CASES" ] || CASES=$(echo "$MATRIX" | sed '/^$/d; s/|.*//' | tr '\n' ' ')
RESULTS=$WORK/results.csv
echo "kv-matrix: machine load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq "$REPS"); do
  for c in $CASES; do
    flags=$(echo "$MATRIX" | awk -F'|' -v n="$c" '$1 == n { print $2 }')
    [ -n "$flags" ] || { echo "kv-matrix: unknown case $c" >&2; exit 2; }
    # shellcheck disable=SC2086
    "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "$ENDPOINT" $flags --keys "$KEYS" --duration "$DURATION" \
      --seed "$rep" --format csv --no-header --label "$c" >>"$RESULTS" 2>"$WORK/last.txt" ||
      { echo "kv-matrix: case $c failed:" >&2; cat "$WORK/last.txt" >&2; exit 1; }
    tail -n 1 "$RESULTS" | awk -F, -v rep="$rep" \
      '{ printf "  rep %d %-18s %9.1f ops/s  p50 %8.3f  p99 %8.3f ms  errors %s unsent %s\n", rep, $1, $17, $18/1000, $20/1000, $16, $29 }'
  done
done
echo "kv-matrix: machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ -n "$OUT" ]; then
  {
    echo "label,workload,mode,rate,clients,conns,threads,duration_s,window_s,keys,key_size,value_size,dist,serializable,ok,errors,throughput,p50_us,p90_us,p99_us,p999_us,max_us,mean_us,read_p50_us,read_p99_us,write_p50_us,write_p99_us,late,unsent,cas_conflicts"
    cat "$RESULTS"
  } >"$OUT"
fi

echo
echo "$SERVER: medians of $REPS runs of $DURATION s ($KEYS keys, 18 B keys, 32 B values; latency in ms)"
printf "%-18s %10s %8s %8s %8s %8s %8s %7s %7s\n" case ops/s p50 p90 p99 p99.9 max errors unsent
for c in $CASES; do
  col() { awk -F, -v n="$c" -v k="$1" '$1 == n { print $k }' "$RESULTS" | lib_median; }
  ms() { col "$1" | awk '{ printf "%.3f", $1 / 1000 }'; }
  printf "%-18s %10.1f %8s %8s %8s %8s %8s %7s %7s\n" "$c" "$(col 17)" "$(ms 18)" "$(ms 19)" "$(ms 20)" \
    "$(ms 21)" "$(ms 22)" "$(col 16)" "$(col 29)"
done
