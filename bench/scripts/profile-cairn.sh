#!/usr/bin/env bash
# profile-cairn.sh: perf profiles of cairn for the targets bench-all.sh
# misses. Writes into OUT (default bench/results/latest-profile):
#   put.perf.txt      cairn under closed-loop put (64 clients, --seconds),
#                     perf record -g on the server, flat and caller reports;
#   restart.perf.txt  cairn starting on DATA (a data dir kept by
#                     bench-all.sh --keep-data, copied first so the original
#                     is untouched) until the first Range is answered.
# Server on CPU 0, loadgen on CPU 1, as in bench-all.sh. Only PIDs started
# here are stopped. Needs perf (linux-perf), a RelWithDebInfo build.
#
# Usage: bench/scripts/profile-cairn.sh [--build DIR] [--data DIR]
#          [--seconds S] [--out DIR]
set -euo pipefail
BUILD=build
DATA=""
SECS=10
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "profile-cairn: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
REPO=$(pwd)
. bench/scripts/lib-servers.sh
command -v perf >/dev/null || { echo "profile-cairn: perf not installed (Debian: linux-perf)" >&2; exit 2; }
[ -n "$OUT" ] || OUT=bench/results/latest-profile
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SERVER_PIN=(taskset -c 0)
LOAD_PIN=(taskset -c 1)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/profile-cairn.XXXXXX")
trap 'lib_cleanup; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

# 1. put
lib_start_server cairn "$REPO/$BUILD/cairn"
pid=${LIB_PIDS[${#LIB_PIDS[@]}-1]}
"${LOAD_PIN[@]}" "$BUILD/cairn-loadgen" --endpoint "$ENDPOINT" --workload put --clients 64 \
  --duration $((SECS + 4)) >"$WORK/put.txt" 2>&1 &
lgpid=$!
sleep 2
perf record -g -F 499 -p "$pid" -o "$WORK/put.data" -- sleep "$SECS" >/dev/null 2>&1 || true
wait "$lgpid" || true
grep -E 'throughput|p50' "$WORK/put.txt" | head -3
lib_perf_report "$WORK/put.data" "cairn under closed-loop put, 64 clients, ${SECS} s ($(grep -m1 throughput "$WORK/put.txt" | sed 's/^ *//'))" "$OUT/put.perf.txt" 2
lib_cleanup
echo "profile-cairn: $OUT/put.perf.txt"

# 2. restart
if [ -n "$DATA" ]; then
  cp -a "$DATA" "$WORK/restart.data"
  port=$(lib_pick_port)
  t0=$(date +%s.%N)
  perf record -g -F 999 -o "$WORK/restart.data.perf" -- "${SERVER_PIN[@]}" "$REPO/$BUILD/cairn" --name default \
    --data-dir "$WORK/restart.data" --listen-client-urls "http://127.0.0.1:$port" \
    --advertise-client-urls "http://127.0.0.1:$port" --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-cluster "default=http://127.0.0.1:$((port + 1))" >"$WORK/restart.log" 2>&1 &
  ppid=$!
  LIB_PIDS+=("$ppid")
  for _ in $(seq 1200); do
    if ETCDCTL_API=3 timeout 2 etcdctl --endpoints "127.0.0.1:$port" --dial-timeout=1s get bench-probe >/dev/null 2>&1; then break; fi
    sleep 0.05
  done
  t1=$(date +%s.%N)
  # perf forwards SIGINT to the server and writes its data when it exits.
  kill -INT "$ppid" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$ppid" 2>/dev/null || break; sleep 0.1; done
  lib_perf_report "$WORK/restart.data.perf" "cairn restart on a copy of $DATA: first answer after $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s under perf (profile runs until shutdown)" "$OUT/restart.perf.txt" 2
  echo "profile-cairn: $OUT/restart.perf.txt"
fi
