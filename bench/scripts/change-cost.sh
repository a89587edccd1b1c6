#!/usr/bin/env bash
# change-cost.sh: builds bench/scripts/change_cost.c against a build dir's
# store and crdt libraries and runs it --reps times (each run measures one
# change per write, then N writes per change: A B A B ...), printing the
# median writes/s and CPU us/write of each and the cost of one change per
# write (1 - single/batched). See change_cost.c for what it does and does not
# measure. Pinned to CPU 0 (like the servers in bench-all.sh) when taskset and
# 2+ cores exist. Data in a temp dir under $TMPDIR (default /tmp), removed.
#
# Usage: bench/scripts/change-cost.sh [--build DIR] [--reps N] [--seconds S]
#          [--writers W] [--batch N] [--out FILE]
set -euo pipefail
BUILD=build
REPS=3
SECS=5
WRITERS=64
BATCH=8
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    --writers) WRITERS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "change-cost: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
for l in "$BUILD/store/libcairn_store.a" "$BUILD/crdt/libcairn_crdt.a"; do
  [ -f "$l" ] || { echo "change-cost: $l missing (cmake --build $BUILD --target cairn)" >&2; exit 2; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/change-cost.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cc -std=c11 -O2 -Wall -Wextra -D_GNU_SOURCE -I. -I"$BUILD" -o "$WORK/change_cost" bench/scripts/change_cost.c \
  "$BUILD/store/libcairn_store.a" "$BUILD/crdt/libcairn_crdt.a" -lleveldb -lsodium -lpthread
PIN=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then PIN=(taskset -c 0); fi
echo "change-cost: ${PIN[*]:-not pinned}; $REPS reps of $SECS s, $WRITERS writers, batch $BATCH; load average $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$WORK/rows"
for rep in $(seq "$REPS"); do
  "${PIN[@]}" "$WORK/change_cost" "$WORK/run-$rep" "$SECS" "$WRITERS" "$BATCH" | tee -a "$WORK/rows"
  rm -rf "$WORK/run-$rep"
done
med() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
field() { grep "^writes_per_change=$1 " "$WORK/rows" | tr ' ' '\n' | sed -n "s/^$2=//p" | med; }
s_w=$(field 1 writes_per_second); b_w=$(field "$BATCH" writes_per_second)
s_c=$(field 1 cpu_us_per_write); b_c=$(field "$BATCH" cpu_us_per_write)
{
  echo "one change per write:      median $s_w writes/s, $s_c CPU us/write"
  echo "$BATCH writes per change:       median $b_w writes/s, $b_c CPU us/write"
  awk -v s="$s_w" -v b="$b_w" -v sc="$s_c" -v bc="$b_c" 'BEGIN {
    printf "cost of one change per write: %.1f%% of throughput (target <= 10%%), %.2fx CPU per write\n",
      100 * (1 - s / b), sc / bc }'
} | tee "$WORK/summary"
if [ -n "$OUT" ]; then
  { echo "# bench/scripts/change-cost.sh --build $BUILD --reps $REPS --seconds $SECS --writers $WRITERS --batch $BATCH"
    cat "$WORK/rows" "$WORK/summary"; } >"$OUT"
fi
