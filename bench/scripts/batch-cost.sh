#!/usr/bin/env bash
# batch-cost.sh: what one change per client write costs at the server.
#
# Issue 7 asks that one change per client write cost <= 10% of peak put
# throughput against a build that batches several writes into one change.
# That build is cairn itself with --experimental-batch-writes N (benchmarks
# only: concurrent plain Puts share one change and one revision; see
# server/kv.c). This script measures both in one run: for each repetition
# it starts a fresh cairn without the flag ("single": one change per Put),
# drives peak closed-loop put with cairn-loadgen, stops it, then does the
# same with the flag ("batched"), so the two alternate (A B A B ...). It
# prints each run, the medians, and cost = 1 - single/batched.
#
# For each run it also records how many Puts went into each change
# (writes/change = Puts answered OK / revisions the run made: every change
# of a Put takes exactly one revision, a batched one too) and the server's
# CPU time per Put (utime + stime from /proc, so that a CPU-bound server's
# cost per change shows even when throughput is noisy).
#
# With --profile DIR it then records perf (-g) on one server of each mode
# under the same load and writes DIR/{single,batched}.perf.txt (self time
# by symbol, inclusive time by symbol).
#
# Bounded: every loadgen run stops by itself (--duration), each server
# start waits at most 30 s, and the script stops only the PIDs it started.
# With 2+ cores the server is pinned to CPU 0 and cairn-loadgen to CPU 1.
# Data dirs in a temp dir under $TMPDIR (default /tmp), removed at exit.
#
# Usage: bench/scripts/batch-cost.sh [--build DIR] [--reps N] [--duration S]
#          [--clients N] [--conns N] [--keys N] [--batch N] [--out FILE]
#          [--profile DIR] [--profile-seconds S] [--no-pin]
# Needs: <build>/cairn and <build>/cairn-loadgen, etcdctl 3.4 on PATH
# (readiness probe), python3 (revision read), perf for --profile.
set -euo pipefail

BUILD=build
REPS=3
DURATION=5
CLIENTS=64
CONNS=4
KEYS=10000
BATCH=64
OUT=""
PROFILE=""
PSECS=8
PIN=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    --keys) KEYS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    --profile-seconds) PSECS=$2; shift 2 ;;
    --no-pin) PIN=0; shift ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "batch-cost: unknown argument $1" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/../.."
REPO=$(pwd)
. bench/scripts/lib-servers.sh
CAIRN=$REPO/$BUILD/cairn
LOADGEN=$REPO/$BUILD/cairn-loadgen
for f in "$CAIRN" "$LOADGEN"; do
  [ -x "$f" ] || { echo "batch-cost: $f not found (cmake --build $BUILD --target cairn cairn-loadgen)" >&2; exit 2; }
done
command -v etcdctl >/dev/null || { echo "batch-cost: etcdctl not on PATH" >&2; exit 2; }
if [ -n "$PROFILE" ]; then
  command -v perf >/dev/null || { echo "batch-cost: perf not installed" >&2; exit 2; }
  mkdir -p "$PROFILE"
  PROFILE=$(cd "$PROFILE" && pwd)
fi

SERVER_PIN=()
LOAD_PIN=()
PINNING="not pinned"
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  SERVER_PIN=(taskset -c 0)
  LOAD_PIN=(taskset -c 1)
  PINNING="server on CPU 0, cairn-loadgen on CPU 1"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/batch-cost.XXXXXX")
trap 'lib_cleanup; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

CLK_TCK=$(getconf CLK_TCK)
# revision EP: the header revision a Status answers.
revision() {
  ETCDCTL_API=3 etcdctl --endpoints "$1" --dial-timeout=2s --command-timeout=5s endpoint status -w json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])'
}
# cpu_ticks PID: utime + stime of every thread of PID, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

flags_of() { # flags_of MODE
  if [ "$1" = batched ]; then echo "--experimental-batch-writes $BATCH"; fi
}

say() { echo "$@" | tee -a "$WORK/log.txt"; }

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
say "batch-cost: $REPS reps x $DURATION s, put, $CLIENTS clients, $CONNS conns, $KEYS keys, batch <= $BATCH;" \
  "$PINNING; load average $LOAD0"
: >"$WORK/rows.tsv"
for rep in $(seq "$REPS"); do
  for mode in single batched; do
    # shellcheck disable=SC2046
    lib_start_server "$mode-$rep" "$CAIRN" $(flags_of "$mode") >/dev/null ||
      { echo "batch-cost: could not start cairn ($mode)" >&2; exit 1; }
    pid=$SERVER_PID
    r0=$(revision "$ENDPOINT")
    c0=$(cpu_ticks "$pid")
    "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "$ENDPOINT" --workload put --clients "$CLIENTS" --conns "$CONNS" \
      --keys "$KEYS" --duration "$DURATION" --seed "$rep" --format csv --no-header --label "$mode" \
      >"$WORK/row.csv" 2>"$WORK/lg.txt" || { echo "batch-cost: loadgen failed ($mode):" >&2; cat "$WORK/lg.txt" >&2; exit 1; }
    c1=$(cpu_ticks "$pid")
    r1=$(revision "$ENDPOINT")
    lib_cleanup
    IFS=, read -r _ _ _ _ _ _ _ _ _ _ _ _ _ _ ok errors tput p50 _ p99 _ <"$WORK/row.csv"
    line=$(grep -m1 'puts in' "$WORK/$mode-$rep.log" | sed 's/.*experimental-batch-writes: //' || true)
    awk -v rep="$rep" -v mode="$mode" -v ok="$ok" -v err="$errors" -v tput="$tput" -v p50="$p50" -v p99="$p99" \
      -v dr=$((r1 - r0)) -v dc=$((c1 - c0)) -v hz="$CLK_TCK" 'BEGIN {
        wpc = dr > 0 ? ok / dr : 0; cpu = ok > 0 ? dc * 1e6 / hz / ok : 0
        printf "%s\t%d\t%.1f\t%d\t%d\t%d\t%.2f\t%.1f\t%.0f\t%.0f\n", mode, rep, tput, ok, err, dr, wpc, cpu, p50, p99 }' \
      >>"$WORK/rows.tsv"
    tail -n 1 "$WORK/rows.tsv" | awk -F'\t' -v srv="$line" '{
      printf "  rep %d %-7s %9.1f puts/s  %7d ok %3d err  %7d revisions = %6.2f puts/change  %6.1f CPU us/put  p50 %6.2f ms  p99 %7.2f ms%s\n",
        $2, $1, $3, $4, $5, $6, $7, $8, $9 / 1000, $10 / 1000, (srv != "" ? "  [server: " srv "]" : "") }' |
      tee -a "$WORK/log.txt"
  done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

med() { # med MODE COLUMN
  awk -F'\t' -v m="$1" -v c="$2" '$1 == m { print $c }' "$WORK/rows.tsv" | lib_median
}
s_t=$(med single 3); b_t=$(med batched 3)
s_w=$(med single 7); b_w=$(med batched 7)
s_c=$(med single 8); b_c=$(med batched 8)
s_50=$(med single 9); b_50=$(med batched 9)
s_99=$(med single 10); b_99=$(med batched 10)
{
  echo
  echo "medians of $REPS runs ($DURATION s each; load average $LOAD0 before, $LOAD1 after):"
  printf "%-8s %12s %12s %12s %10s %10s\n" mode "puts/s" "puts/change" "CPU us/put" "p50 ms" "p99 ms"
  awk -v t="$s_t" -v w="$s_w" -v c="$s_c" -v a="$s_50" -v b="$s_99" 'BEGIN { printf "%-8s %12.1f %12.2f %12.1f %10.2f %10.2f\n", "single", t, w, c, a / 1000, b / 1000 }'
  awk -v t="$b_t" -v w="$b_w" -v c="$b_c" -v a="$b_50" -v b="$b_99" 'BEGIN { printf "%-8s %12.1f %12.2f %12.1f %10.2f %10.2f\n", "batched", t, w, c, a / 1000, b / 1000 }'
  awk -v s="$s_t" -v b="$b_t" -v sc="$s_c" -v bc="$b_c" 'BEGIN {
    printf "cost of one change per Put: %.1f%% of peak put throughput (1 - single/batched medians; target <= 10%%)\n",
      100 * (1 - s / b)
    printf "server CPU per Put: %.2fx (single/batched); a CPU-bound server would lose %.1f%%\n",
      (bc > 0 ? sc / bc : 0), (sc > 0 ? 100 * (1 - bc / sc) : 0) }'
  # Runs next to each other share the machine'"'"'s load: the median of the
  # per-rep costs is steadier than the cost of the medians on a busy box.
  paired=$(awk -F'\t' '$1 == "single" { s[$2] = $3 } $1 == "batched" { b[$2] = $3 }
    END { for (r in s) if (b[r] > 0) print 1 - s[r] / b[r] }' "$WORK/rows.tsv" | lib_median)
  busy=$(awk -F'\t' '{ printf "%s %.0f%%  ", $1 $2, $3 * $8 / 1e4 }' "$WORK/rows.tsv")
  awk -v p="$paired" 'BEGIN { printf "median of the per-rep costs (1 - single_i/batched_i): %.1f%%\n", 100 * p }'
  echo "server CPU busy (puts/s x CPU us/put) per run: $busy"
} | tee -a "$WORK/log.txt"

if [ -n "$PROFILE" ]; then
  for mode in single batched; do
    # shellcheck disable=SC2046
    lib_start_server "profile-$mode" "$CAIRN" $(flags_of "$mode") >/dev/null ||
      { echo "batch-cost: could not start cairn ($mode)" >&2; exit 1; }
    pid=$SERVER_PID
    "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "$ENDPOINT" --workload put --clients "$CLIENTS" --conns "$CONNS" \
      --keys "$KEYS" --duration $((PSECS + 3)) >"$WORK/prof-$mode.txt" 2>&1 &
    lgpid=$!
    sleep 1.5
    perf record -g -F 499 -p "$pid" -o "$WORK/$mode.perf" -- sleep "$PSECS" >/dev/null 2>&1 || true
    wait "$lgpid" || true
    lib_cleanup
    cp "$WORK/$mode.perf" "$PROFILE/$mode.perf.data"
    lib_perf_report "$WORK/$mode.perf" "cairn $mode under closed-loop put, $CLIENTS clients, ${PSECS} s of perf ($(grep -m1 throughput "$WORK/prof-$mode.txt" | sed 's/^ *//'))" \
      "$PROFILE/$mode.perf.txt" 1
    say "batch-cost: profile of $mode in $PROFILE/$mode.perf.txt ($(grep -m1 throughput "$WORK/prof-$mode.txt" | sed 's/^ *//'))"
  done
fi

if [ -n "$OUT" ]; then
  { echo "# bench/scripts/batch-cost.sh --build $BUILD --reps $REPS --duration $DURATION --clients $CLIENTS --conns $CONNS --keys $KEYS --batch $BATCH"
    cat "$WORK/log.txt"
    echo "# mode rep puts_per_s ok errors revisions puts_per_change cpu_us_per_put p50_us p99_us"
    cat "$WORK/rows.tsv"; } >"$OUT"
  echo "batch-cost: written to $OUT"
fi
