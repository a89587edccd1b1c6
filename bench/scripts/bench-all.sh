#!/usr/bin/env bash
# bench-all.sh: every benchmark of issue 7, cairn beside etcd, in one command.
#
# Starts a fresh etcd (the one on PATH, Debian's etcd-server 3.4, default
# flags: every write fsynced) and a fresh cairn (<build>/cairn; it fsyncs a
# write before acknowledging it), both with their data under one temp dir on
# $TMPDIR's filesystem (default /tmp), on random loopback ports in
# 20000-40000, and measures, alternating the two (etcd, cairn, etcd, cairn,
# ... for every case and repetition):
#   1. peak closed-loop throughput and latency: put, range (linearizable and
#      serializable), range over a 100-key prefix, txn-cas (Kubernetes-style
#      read + compare-and-swap), on a preloaded key space of 10,000 keys;
#   2. YCSB A (50% read, 50% update) open loop at increasing target rates,
#      until both saturate (throughput-latency curve). A server holds a rate
#      when its median achieved throughput is >= 95% of it and no request
#      slot went unsent; the sweep ends at the first rate neither holds;
#   3. watch event latency (put sent -> event received, bench/scripts/probe.py);
#   4. a 1,000,000-key load into a second pair of fresh servers: load time,
#      resident memory (VmRSS) after the load, bytes on disk (du of the data
#      dir), and restart time (SIGTERM, start again, first answered Range),
#      then RSS, the key count (checked against the load) and the data dir's
#      bytes after the restarts (cairn's then include the checkpoint its clean
#      stops wrote).
# It writes, under bench/results/<UTC time>/: results.md (the table: medians
# and the cairn/etcd ratio of every figure, targets marked), summary.csv,
# raw.tsv (every measurement), loadgen.csv (every loadgen row), CDF files,
# PNG plots (when gnuplot is installed), command.txt and run.log; and a full
# run adds an entry at the top of bench/results/LATEST.md's list.
#
# CPU placement: with 2+ cores every server runs on CPU 0 and every client
# (cairn-loadgen, probe.py) on CPU 1 (taskset), so that client and server do
# not take time from each other; both servers get the same core. The other
# server of the pair is idle while one is measured.
#
# Bounded: each loadgen run stops by itself (--duration, hard cap inside);
# server start and restart wait at most 120 s; probe.py has an alarm. Only
# the PIDs this script started are ever stopped.
#
# Usage: bench/scripts/bench-all.sh [--quick] [--build DIR] [--reps N]
#          [--duration S] [--big-keys N] [--rates "500 1000 ..."] [--no-pin]
#          [--out DIR] [--keep-data DIR] [--parts "peak ycsb watch big"]
#   --parts   which parts to run (default all four; e.g. "ycsb" alone to
#             repeat the throughput-latency sweep).
#   --keep-data DIR  move the big-load data dirs (DIR/etcd.data, DIR/cairn.data)
#             there at the end, e.g. to profile a restart afterwards.
#   --quick   smoke run of a few minutes: 1 repetition, 2 s runs, 2 rates,
#             20,000 keys for the load/restart part. Not a measurement.
#   default   3 repetitions of 5 s runs, rates 250..12000, 1,000,000 keys:
#             about 11 minutes on a 2-core machine (2026-11-30).
# Needs: <build>/cairn and <build>/cairn-loadgen (cmake --build build
#        --target cairn cairn-loadgen), etcd and etcdctl 3.4 on PATH, protoc,
#        /usr/bin/python3 with python3-grpcio and python3-protobuf; gnuplot
#        (Debian package gnuplot-nox) for the plots, skipped without it.
set -euo pipefail

QUICK=0
BUILD=build
REPS=""
DURATION=""
BIG_KEYS=""
RATES=""
PIN=1
OUTDIR=""
KEEP=""
PARTS="peak ycsb watch big"
ARGS=("$@")

while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --build) BUILD=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --big-keys) BIG_KEYS=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --no-pin) PIN=0; shift ;;
    --out) OUTDIR=$2; shift 2 ;;
    --keep-data) KEEP=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^set -euo/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "bench-all: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$QUICK" = 1 ]; then
  : "${REPS:=1}" "${DURATION:=2}" "${BIG_KEYS:=20000}" "${RATES:=1000 4000}"
  WATCH_COUNT=100
else
  : "${REPS:=3}" "${DURATION:=5}" "${BIG_KEYS:=1000000}" "${RATES:=250 500 1000 1500 2000 3000 4000 6000 8000 12000}"
  WATCH_COUNT=500
fi
KEYS=10000
LOAD_CHUNK=200000

cd "$(dirname "$0")/../.."
REPO=$(pwd)
. bench/scripts/lib-servers.sh
LOADGEN=$REPO/$BUILD/cairn-loadgen
CAIRN=$REPO/$BUILD/cairn
PY=/usr/bin/python3
PROBE=$REPO/bench/scripts/probe.py
for f in "$LOADGEN" "$CAIRN"; do
  [ -x "$f" ] || { echo "bench-all: $f not found; build: cmake -S . -B $BUILD && cmake --build $BUILD --target cairn cairn-loadgen" >&2; exit 2; }
done
ETCD=$(command -v etcd) || { echo "bench-all: etcd not on PATH (Debian: etcd-server)" >&2; exit 2; }
command -v etcdctl >/dev/null || { echo "bench-all: etcdctl not on PATH (Debian: etcd-client)" >&2; exit 2; }
command -v protoc >/dev/null || { echo "bench-all: protoc not on PATH" >&2; exit 2; }
"$PY" -c 'import grpc, google.protobuf' 2>/dev/null ||
  { echo "bench-all: $PY lacks grpc/protobuf (Debian: python3-grpcio python3-protobuf)" >&2; exit 2; }

STAMP=$(date -u +%Y-%m-%dT%H%MZ)
SUFFIX=""
[ "$QUICK" = 0 ] || SUFFIX=-quick
[ "$PARTS" = "peak ycsb watch big" ] || SUFFIX=$SUFFIX-$(echo "$PARTS" | tr ' ' '-')
[ -n "$OUTDIR" ] || OUTDIR=bench/results/$STAMP$SUFFIX
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/run.log
exec > >(tee "$LOG") 2>&1

SERVER_PIN=()
LOAD_PIN=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  SERVER_PIN=(taskset -c 0)
  LOAD_PIN=(taskset -c 1)
  PINNING="servers pinned to CPU 0 (taskset -c 0), cairn-loadgen and probe.py to CPU 1 (taskset -c 1)"
else
  PINNING="not pinned (no taskset, one core, or --no-pin)"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-all.XXXXXX")
trap 'lib_cleanup; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

RAW=$OUTDIR/raw.tsv          # figure <tab> system <tab> rep <tab> value
LGCSV=$OUTDIR/loadgen.csv
: >"$RAW"
echo "label,workload,mode,rate,clients,conns,threads,duration_s,window_s,keys,key_size,value_size,dist,serializable,ok,errors,throughput,p50_us,p90_us,p99_us,p999_us,max_us,mean_us,read_p50_us,read_p99_us,write_p50_us,write_p99_us,late,unsent,cas_conflicts" >"$LGCSV"
mkdir -p "$OUTDIR/cdf"

T_BEGIN=$(date +%s)
{
  echo "command: bench/scripts/bench-all.sh ${ARGS[*]}"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- server store crdt bench 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "started: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(awk '/MemTotal/ { printf "%.1f GiB RAM", $2 / 1048576 }' /proc/meminfo)"
  echo "filesystem of the data dirs: $(df -T "$WORK" | awk 'NR == 2 { print $2 " (" $1 ")" }') at $WORK"
  echo "etcd: $("$ETCD" --version | head -1)"
  echo "cairn: $("$CAIRN" --version 2>&1 | head -1)"
  echo "placement: $PINNING"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "mode: $([ "$QUICK" = 1 ] && echo quick || echo full), $REPS repetitions, ${DURATION} s per run, $KEYS keys for the sweeps, $BIG_KEYS keys for the load; parts: $PARTS"
} | tee "$OUTDIR/env.txt"

say() { echo "[$(date -u +%H:%M:%S)] $*"; }
rec() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RAW"; }

# stop_pid PID: SIGTERM, wait up to 30 s, then SIGKILL.
stop_pid() {
  local pid=$1
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  sleep 0.2
}

declare -A EP PID PORT
# start NAME BIN: fresh data dir $WORK/NAME.data, via lib_start_server.
start() {
  local name=$1 bin=$2
  lib_start_server "$name" "$bin" || { echo "bench-all: could not start $name" >&2; exit 1; }
  EP[$name]=$ENDPOINT
  PORT[$name]=${ENDPOINT##*:}
  PID[$name]=${LIB_PIDS[${#LIB_PIDS[@]}-1]}
}

# lg SYSTEM CASE REP FLAGS...: one loadgen run; appends its row to loadgen.csv
# and prints a one-line summary. A failed run is reported and skipped.
lg() {
  local sys=$1 case=$2 rep=$3
  shift 3
  if "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "${EP[$sys]}" --keys "$KEYS" --duration "$DURATION" \
    --seed "$rep" --format csv --no-header --label "$sys/$case/$rep" \
    --cdf "$OUTDIR/cdf/$case.$sys.$rep.txt" "$@" >"$WORK/row.csv" 2>"$WORK/lg.txt"; then
    cat "$WORK/row.csv" >>"$LGCSV"
    awk -F, '{ printf "  %-28s %9.1f ops/s  p50 %8.3f ms  p99 %8.3f ms  errors %s unsent %s\n", $1, $17, $18/1000, $20/1000, $16, $29 }' "$WORK/row.csv"
    return 0
  fi
  echo "  $sys/$case/$rep FAILED:"; tail -n 5 "$WORK/lg.txt"
  return 1
}

want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
SYSTEMS=(etcd cairn)
# ---------------------------------------------------------------- sweeps
if want peak || want ycsb || want watch; then
say "starting fresh servers for the sweeps"
start etcd "$ETCD"
start cairn "$CAIRN"
for s in "${SYSTEMS[@]}"; do
  "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "${EP[$s]}" --workload load --keys "$KEYS" --clients 32 \
    --duration 120 >"$WORK/preload.txt" 2>&1 || { cat "$WORK/preload.txt"; exit 1; }
  say "$s: $(grep '^load:' "$WORK/preload.txt")"
done

# name | flags. Clients: 64 for writes (group commit needs concurrency),
# 32 for reads; both past the knee on this machine for both servers.
PEAK='
put|--workload put --clients 64
range|--workload range --clients 32
range-ser|--workload range --clients 32 --serializable
range-prefix-ser|--workload range-prefix --clients 32 --serializable
txn-cas|--workload txn-cas --clients 64
'
fi
if want peak; then
say "peak closed-loop throughput, $REPS x $DURATION s, alternating etcd/cairn"
for rep in $(seq "$REPS"); do
  while IFS='|' read -r c flags; do
    [ -n "$c" ] || continue
    for s in "${SYSTEMS[@]}"; do
      # shellcheck disable=SC2086
      if lg "$s" "$c" "$rep" $flags; then
        rec "$c.tput" "$s" "$rep" "$(cut -d, -f17 "$WORK/row.csv")"
        rec "$c.p50" "$s" "$rep" "$(awk -F, '{ print $18 / 1000 }' "$WORK/row.csv")"
        rec "$c.p99" "$s" "$rep" "$(awk -F, '{ print $20 / 1000 }' "$WORK/row.csv")"
      fi
    done
  done <<<"$PEAK"
done

fi
if want ycsb; then
say "YCSB A open loop, rates: $RATES (stops when neither server holds the rate)"
for r in $RATES; do
  for rep in $(seq "$REPS"); do
    for s in "${SYSTEMS[@]}"; do
      if lg "$s" "ycsb-a-$r" "$rep" --workload a --rate "$r"; then
        rec "ycsb-a-$r.tput" "$s" "$rep" "$(cut -d, -f17 "$WORK/row.csv")"
        rec "ycsb-a-$r.p50" "$s" "$rep" "$(awk -F, '{ print $18 / 1000 }' "$WORK/row.csv")"
        rec "ycsb-a-$r.p99" "$s" "$rep" "$(awk -F, '{ print $20 / 1000 }' "$WORK/row.csv")"
        rec "ycsb-a-$r.unsent" "$s" "$rep" "$(cut -d, -f29 "$WORK/row.csv")"
      fi
    done
  done
  held=0
  for s in "${SYSTEMS[@]}"; do
    med=$(awk -F'\t' -v f="ycsb-a-$r.tput" -v s="$s" '$1 == f && $2 == s { print $4 }' "$RAW" | lib_median)
    uns=$(awk -F'\t' -v f="ycsb-a-$r.unsent" -v s="$s" '$1 == f && $2 == s { print $4 }' "$RAW" | lib_median)
    if awk -v m="$med" -v r="$r" -v u="$uns" 'BEGIN { exit !(m >= 0.95 * r && u == 0) }'; then
      held=1
    fi
  done
  [ "$held" = 1 ] || { say "neither server held $r ops/s: sweep ends"; break; }
done

fi
if want watch; then
say "watch event latency, $WATCH_COUNT puts a run"
for rep in $(seq "$REPS"); do
  for s in "${SYSTEMS[@]}"; do
    if row=$("${LOAD_PIN[@]}" "$PY" "$PROBE" watch-latency --endpoint "${EP[$s]}" --count "$WATCH_COUNT" \
      --label "$s/watch/$rep" --cdf "$OUTDIR/cdf/watch.$s.$rep.txt" 2>"$WORK/probe.txt"); then
      echo "  $row"
      rec watch.p50 "$s" "$rep" "$(echo "$row" | cut -d, -f3)"
      rec watch.p99 "$s" "$rep" "$(echo "$row" | cut -d, -f5)"
    else
      echo "  $s/watch/$rep FAILED"; tail -n 5 "$WORK/probe.txt"
    fi
  done
done

fi
if want peak || want ycsb || want watch; then
say "stopping the sweep servers"
for s in "${SYSTEMS[@]}"; do stop_pid "${PID[$s]}"; done
rm -rf "$WORK/etcd.data" "$WORK/cairn.data"
fi

# ---------------------------------------------------------- big load
if want big; then
say "$BIG_KEYS-key load into fresh servers (in runs of $LOAD_CHUNK keys, 64 clients)"
start etcd "$ETCD"
start cairn "$CAIRN"
for s in "${SYSTEMS[@]}"; do
  t0=$(date +%s.%N)
  first=0
  ok=1
  while [ "$first" -lt "$BIG_KEYS" ]; do
    end=$((first + LOAD_CHUNK))
    [ "$end" -le "$BIG_KEYS" ] || end=$BIG_KEYS
    "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "${EP[$s]}" --workload load --keys "$end" \
      --first-key "$first" --clients 64 --duration 300 --timeout 10 >"$WORK/load.txt" 2>&1 || ok=0
    line=$(grep '^load:' "$WORK/load.txt" || echo "load: failed")
    say "  $s keys $first..$((end - 1)): $line, $(grep -m1 'throughput' "$WORK/load.txt" | sed 's/^ *//')"
    case "$line" in *INCOMPLETE*|*failed*) ok=0 ;; esac
    [ "$ok" = 1 ] || break
    first=$end
  done
  t1=$(date +%s.%N)
  if [ "$ok" = 1 ]; then
    rec load.seconds "$s" 1 "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
    rec load.tput "$s" 1 "$(awk -v a="$t0" -v b="$t1" -v n="$BIG_KEYS" 'BEGIN { printf "%.1f", n / (b - a) }')"
  else
    say "  $s: the load did not complete; no load figures for $s"
  fi
done

rss_mib() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo nan; }
disk_mib() { du -sb "$1" | awk '{ printf "%.1f", $1 / 1048576 }'; }
sleep 2
for s in "${SYSTEMS[@]}"; do
  rec big.rss_mib "$s" 1 "$(rss_mib "${PID[$s]}")"
  rec big.disk_mib "$s" 1 "$(disk_mib "$WORK/$s.data")"
  say "  $s after the load: VmRSS $(rss_mib "${PID[$s]}") MiB, data dir $(disk_mib "$WORK/$s.data") MiB"
  du -ab "$WORK/$s.data" | sort -n | tail -n 6 | sed 's/^/    /'
done

# restart NAME REP: SIGTERM the server, start it again on the same data dir
# and ports; records the seconds from exec to the first answered Range.
restart() {
  local s=$1 rep=$2 bin cport pport secs
  bin=$ETCD
  [ "$s" = cairn ] && bin=$CAIRN
  cport=${PORT[$s]}
  pport=$((cport + 1))
  stop_pid "${PID[$s]}"
  sync
  if secs=$("${LOAD_PIN[@]}" "$PY" "$PROBE" first-answer --endpoint "127.0.0.1:$cport" \
      --pidfile "$WORK/$s.pid" --log "$WORK/$s.log" --timeout 120 -- "${SERVER_PIN[@]}" "$bin" \
      --name default --data-dir "$WORK/$s.data" \
      --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
      --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
      --initial-cluster "default=http://127.0.0.1:$pport" 2>"$WORK/probe.txt"); then
    PID[$s]=$(cat "$WORK/$s.pid")
    LIB_PIDS+=("${PID[$s]}")
    rec restart.seconds "$s" "$rep" "$secs"
    say "  $s restart $rep: first Range answered $secs s after exec"
  else
    [ -s "$WORK/$s.pid" ] && { PID[$s]=$(cat "$WORK/$s.pid"); LIB_PIDS+=("${PID[$s]}"); }
    say "  $s restart $rep FAILED: $(tail -n 3 "$WORK/probe.txt")"
    tail -n 5 "$WORK/$s.log"
  fi
}
say "restart time with $BIG_KEYS keys (SIGTERM, start, first answered Range), $REPS x alternating"
for rep in $(seq "$REPS"); do
  for s in "${SYSTEMS[@]}"; do restart "$s" "$rep"; done
done
sleep 2
for s in "${SYSTEMS[@]}"; do
  rec big.rss_restart_mib "$s" 1 "$(rss_mib "${PID[$s]}")"
  n=$({ ETCDCTL_API=3 timeout 60 etcdctl --endpoints "${EP[$s]}" --command-timeout=50s get k --prefix \
    --limit 1 -w json 2>"$WORK/count.txt" || true; } | sed -n 's/.*"count":\([0-9]*\).*/\1/p')
  [ -n "$n" ] || { say "  $s: counting the keys failed: $(head -c 300 "$WORK/count.txt")"; n=nan; }
  rec big.keys_after_restart "$s" 1 "${n:-nan}"
  rec big.disk_restart_mib "$s" 1 "$(disk_mib "$WORK/$s.data")"
  say "  $s after restarts: VmRSS $(rss_mib "${PID[$s]}") MiB, $n keys, data dir $(disk_mib "$WORK/$s.data") MiB"
  du -ab "$WORK/$s.data" | sort -n | tail -n 6 | sed 's/^/    /'
done
for s in "${SYSTEMS[@]}"; do stop_pid "${PID[$s]}"; done
if [ -n "$KEEP" ]; then
  mkdir -p "$KEEP" && mv "$WORK/etcd.data" "$WORK/cairn.data" "$KEEP/" && say "data dirs kept in $KEEP"
fi
fi

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUTDIR/env.txt"
echo "finished: $(date -u '+%Y-%m-%d %H:%M:%S UTC') ($(( $(date +%s) - T_BEGIN )) s)" | tee -a "$OUTDIR/env.txt"

# ---------------------------------------------------------- report
"$PY" "$REPO/bench/scripts/bench-report.py" --dir "$OUTDIR" --rates "$RATES" --big-keys "$BIG_KEYS"
if command -v gnuplot >/dev/null; then
  bash "$REPO/bench/scripts/bench-plot.sh" "$OUTDIR" || say "plotting failed"
else
  say "gnuplot not installed (Debian package gnuplot-nox): plots skipped"
fi
echo "bench/scripts/bench-all.sh ${ARGS[*]}" >"$OUTDIR/command.txt"
REL=${OUTDIR#"$REPO/"}
if [ "$QUICK" = 0 ] && [ "$PARTS" = "peak ycsb watch big" ] && [ "${REL#bench/results/}" != "$REL" ]; then
  # a new entry at the top of the curated list (after the marker line)
  L=bench/results/LATEST.md
  MARK='<!-- newest runs below; bench-all.sh adds full runs here -->'
  grep -qxF "$MARK" "$L" 2>/dev/null || printf '# Latest benchmark results\n\n%s\n' "$MARK" >"$L"
  ENTRY="- Full run, commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown): [${REL#bench/results/}/results.md](${REL#bench/results/}/results.md)"
  awk -v m="$MARK" -v e="$ENTRY" '{ print } $0 == m { print ""; print e }' "$L" >"$L.tmp" && mv "$L.tmp" "$L"
fi
say "results: $OUTDIR/results.md"
cat "$OUTDIR/results.md"
