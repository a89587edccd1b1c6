#!/usr/bin/env bash
# kv-compare.sh: cairn beside etcd on the same machine and filesystem.
#
# Starts one fresh etcd and (when build/cairn exists) one fresh cairn, each
# with its data dir in one temp dir and random loopback ports in 20000-40000,
# preloads the key space into each, then runs cairn-loadgen closed-loop
# workloads (put and range by default) against them in alternation
# (etcd, cairn, etcd, cairn, ...) for a few short repetitions, and prints the
# median throughput and latency of each with the cairn/etcd ratio.
#
# Bounded: every loadgen run stops by itself (--duration, hard cap inside),
# server start-up waits at most 30 s, and the script only ever stops the
# PIDs it started. With 2 or more cores, servers are pinned to CPU 0 and the
# load generator to CPU 1 (taskset), so they do not fight for one core.
#
# Usage: bench/scripts/kv-compare.sh [--reps N] [--duration S] [--clients N]
#          [--conns N] [--keys N] [--workloads "put range"] [--build DIR]
#          [--out FILE] [--no-pin] [--etcd-only] [-- extra cairn-loadgen flags]
# Data dirs go under $TMPDIR (default /tmp): set it to put both servers on
# another filesystem.
# Needs: <build>/cairn-loadgen (cmake --build build --target cairn-loadgen),
#        etcd and etcdctl 3.4 on PATH; <build>/cairn optional.
set -euo pipefail

REPS=3
DURATION=5
CLIENTS=16
CONNS=4
KEYS=10000
WORKLOADS="put range"
BUILD=build
OUT=""
PIN=1
ETCD_ONLY=0
EXTRA=()

while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    --keys) KEYS=$2; shift 2 ;;
    --workloads) WORKLOADS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-pin) PIN=0; shift ;;
    --etcd-only) ETCD_ONLY=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "kv-compare: unknown argument $1" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/../.."
. bench/scripts/lib-servers.sh
LOADGEN=$BUILD/cairn-loadgen
CAIRN=$BUILD/cairn
if [ ! -x "$LOADGEN" ]; then
  echo "kv-compare: $LOADGEN not found; build it: cmake --build $BUILD --target cairn-loadgen" >&2
  exit 2
fi
command -v etcd >/dev/null || { echo "kv-compare: etcd not on PATH" >&2; exit 2; }
command -v etcdctl >/dev/null || { echo "kv-compare: etcdctl not on PATH" >&2; exit 2; }

SERVER_PIN=()
LOAD_PIN=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  SERVER_PIN=(taskset -c 0)
  LOAD_PIN=(taskset -c 1)
  echo "kv-compare: servers pinned to CPU 0, cairn-loadgen to CPU 1"
else
  echo "kv-compare: not pinning (no taskset, one core, or --no-pin)"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kv-compare.XXXXXX")
trap 'lib_cleanup; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

SYSTEMS=(etcd)
declare -A EP
lib_start_server etcd "$(command -v etcd)"
EP[etcd]=$ENDPOINT
if [ "$ETCD_ONLY" = 1 ]; then
  echo "kv-compare: --etcd-only: measuring etcd only"
elif [ -x "$CAIRN" ]; then
  lib_start_server cairn "$CAIRN"
  EP[cairn]=$ENDPOINT
  SYSTEMS+=(cairn)
else
  echo "kv-compare: $CAIRN does not exist yet: measuring etcd only (no ratio)"
fi

for s in "${SYSTEMS[@]}"; do
  echo "kv-compare: preloading $KEYS keys into $s"
  "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "${EP[$s]}" --workload load --keys "$KEYS" --clients 32 \
    --conns "$CONNS" --duration 120 --format csv --no-header --label "$s-preload" "${EXTRA[@]}" \
    >/dev/null 2>"$WORK/preload-$s.txt" || { cat "$WORK/preload-$s.txt" >&2; exit 1; }
done

RESULTS=$WORK/results.csv
for rep in $(seq "$REPS"); do
  for w in $WORKLOADS; do
    for s in "${SYSTEMS[@]}"; do
      "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "${EP[$s]}" --workload "$w" --clients "$CLIENTS" \
        --conns "$CONNS" --keys "$KEYS" --duration "$DURATION" --seed "$rep" --format csv --no-header \
        --label "$s" "${EXTRA[@]}" >>"$RESULTS" 2>"$WORK/last.txt" ||
        { echo "kv-compare: loadgen failed against $s:" >&2; cat "$WORK/last.txt" >&2; exit 1; }
      tail -n 1 "$RESULTS" | awk -F, -v rep="$rep" \
        '{ printf "  rep %d %-6s %-13s %10.1f ops/s  p50 %8.3f ms  p99 %8.3f ms  errors %s\n", rep, $1, $2, $17, $18/1000, $20/1000, $16 }'
    done
  done
done

if [ -n "$OUT" ]; then
  {
    echo "label,workload,mode,rate,clients,conns,threads,duration_s,window_s,keys,key_size,value_size,dist,serializable,ok,errors,throughput,p50_us,p90_us,p99_us,p999_us,max_us,mean_us,read_p50_us,read_p99_us,write_p50_us,write_p99_us,late,unsent,cas_conflicts"
    cat "$RESULTS"
  } >"$OUT"
  echo "kv-compare: raw results in $OUT"
fi

echo
echo "medians of $REPS runs, $DURATION s each, $CLIENTS clients, $CONNS conns, closed loop:"
awk -F, -v workloads="$WORKLOADS" '
  function median(key,   n, i, j, t, a) {
    n = cnt[key]
    if (n == 0) return -1
    for (i = 1; i <= n; i++) a[i] = val[key, i]
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function add(key, v) { val[key, ++cnt[key]] = v }
  { add($1 SUBSEP $2 SUBSEP "tput", $17); add($1 SUBSEP $2 SUBSEP "p50", $18); add($1 SUBSEP $2 SUBSEP "p99", $20) }
  END {
    printf "%-13s %-6s %12s %10s %10s\n", "workload", "system", "ops/s", "p50 ms", "p99 ms"
    nw = split(workloads, ws, " ")
    for (i = 1; i <= nw; i++) {
      w = ws[i]
      for (s = 1; s <= 2; s++) {
        sys = (s == 1) ? "etcd" : "cairn"
        t = median(sys SUBSEP w SUBSEP "tput")
        if (t < 0) continue
        m[sys, "t"] = t; m[sys, "50"] = median(sys SUBSEP w SUBSEP "p50"); m[sys, "99"] = median(sys SUBSEP w SUBSEP "p99")
        printf "%-13s %-6s %12.1f %10.3f %10.3f\n", w, sys, t, m[sys, "50"] / 1000, m[sys, "99"] / 1000
      }
      if (cnt["cairn" SUBSEP w SUBSEP "tput"] > 0 && m["etcd", "t"] > 0)
        printf "%-13s %-6s %12.2fx %9.2fx %9.2fx\n", w, "ratio", m["cairn", "t"] / m["etcd", "t"],
               (m["etcd", "50"] > 0 ? m["cairn", "50"] / m["etcd", "50"] : 0),
               (m["etcd", "99"] > 0 ? m["cairn", "99"] / m["etcd", "99"] : 0)
      delete m
    }
    print "(ratio = cairn / etcd: above 1 is better for ops/s, below 1 is better for latency)"
  }' "$RESULTS"
