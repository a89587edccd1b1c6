#!/usr/bin/env bash
# bench.sh: cairn beside etcd 3.4, every benchmark, one command.
#
# Installs what the benchmarks need (scripts/deps.sh --bench), builds cairn,
# cairn-loadgen and, once, etcd's own load generator from Debian's sources,
# then starts fresh etcd and cairn servers on the same machine and filesystem
# (data under $TMPDIR, default /tmp; random loopback ports in 20000-40000;
# only the PIDs it started are ever stopped) and runs each part against the
# two in alternation (etcd, cairn, etcd, cairn, ... for every case and
# repetition). Parts, in the order they run:
#   peak        closed-loop peak with cairn-loadgen on 10,000 preloaded keys:
#               put and txn-cas (Kubernetes' read + compare-and-swap) with 64
#               clients; range of one key (linearizable, serializable) and
#               of a 100-key prefix with 32 clients
#   mixed       YCSB A (50% read / 50% update) and YCSB B (95% / 5%), closed
#               loop at peak, 64 clients, same servers and keys: throughput,
#               read and write latency (the before/after figure for store
#               changes such as "readers never block the writer")
#   ycsb        YCSB A open loop at rising rates until neither server holds
#               the rate: the throughput-latency curve
#   watch       put -> watch event latency (bench/scripts/probe.py)
#   etcd-bench  etcd's tools/benchmark, the tool etcd users quote, against a
#               fresh pair of servers NOT pinned: `--conns=10 --clients=100
#               put --key-size=18 --val-size=32` and `range KEY
#               --consistency=s` and `=l`, a fixed --total per case
#   batch       one change per Put against cairn's benchmark-only batching
#               mode (--experimental-batch-writes 64): cairn against cairn
#   big         1,000,000 keys into a fresh pair: load time, RSS and disk
#               after the load, restart time (exec -> first answered Range),
#               RSS, disk and the key count after the restarts
#   cluster     cairn clusters beside etcd clusters of the same size whose
#               peer links all go through tests/integration/netproxy.py
#               (bench/scripts/cluster_bench.py; its opening comment says
#               exactly what and how): a. YCSB A open loop at
#               --cluster-rate on one node, 3 and 5 nodes, 0 and 10 ms
#               one-way links, p50/p99 beside each system's single node;
#               b. the client's node cut off 5 s then healed: share of its
#               requests that succeed in the cut, a per-second timeline
#               (cluster-cut.png), heal -> the other side has the cut's
#               writes; c. replication lag, put ack on node 1 -> watch
#               event on node 2, 0 and 10 ms; d. wire bytes per replicated
#               change over its own bytes (cairnpb.Replication/ChangeBytes),
#               steady push and the exchange after a partition with 1,000
#               changes a side; e. aggregate put throughput, clients on all
#               3 nodes; f. one node cut off while the others take
#               --catchup-changes puts, then healed: its local put p99
#               during the catch-up vs idle, and the catch-up time; g.
#               WaitReplicated latency, as waitrepl below. Each
#               system's clusters run one after the other (not alternating
#               run by run), nothing pinned. Table: results.md's "Cluster"
#               section (also cluster.md), raw rows cl-* in raw.tsv,
#               timelines in cluster/.
#   waitrepl    the cluster part's figure g alone (not one of the default
#               parts: cluster runs it): 3-node cairn and etcd through the
#               same proxies, 0 and 10 ms one-way links; one client on node
#               1 puts, then cairn's WaitReplicated for that revision, n=1
#               and n=2 alternating (5 s timeout), a put every 40 ms,
#               --wait-samples per n: p50/p99 of put ack -> WaitReplicated
#               returns and of put sent -> it returns, beside etcd's put
#               (sent -> ack: a quorum holds it) on a follower, same pacing.
#               Its rows land in the cluster table; LATEST.md's cluster
#               section is rewritten only by a run of the cluster part.
#   tls         client TLS: fresh etcd and cairn on an https:// client URL
#               with the same certificates (made by
#               tests/integration/tls_fixtures.py with openssl: a CA, the
#               server's, a client's; --client-cert-auth), cairn-loadgen
#               with --cacert/--cert/--key: put (64 clients) and
#               serializable range (32 clients) closed loop, and the
#               handshake cost, new TLS connections per second from
#               `openssl s_time -new` (a full handshake each, client
#               certificate included) for --duration seconds. Medians,
#               ratios against etcd's.
# With 2+ cores every part but etcd-bench pins the servers to CPU 0 and the
# clients to CPU 1 (taskset).
#
# Options:
#   --quick              smoke run: 1 repetition, 2 s runs, 2 rates, 20,000
#                        keys for big, etcd-bench totals / 20; cluster: 3
#                        nodes only, 500 ops/s, a 3 s cut, 20,000 catch-up
#                        changes. Not a measurement.
#   --parts "P ..."      the parts to run (default: all nine)
#   --reps N             repetitions, medians over them (default 3)
#   --duration S         seconds per cairn-loadgen run (default 5)
#   --rates "R ..."      YCSB A rates (default 250 500 1000 ... 12000)
#   --big-keys N         keys for big (default 1000000)
#   --cluster-rate R     cluster: YCSB A rate for figure a (default 2000)
#   --wait-samples N     cluster, waitrepl: samples per setting of figure g
#                        (default 300; --quick 50)
#   --catchup-changes N  cluster: puts made while a node is cut off for
#                        figure f (default 200000; 1000000 is the issue's
#                        figure and adds about 2 x 1.5 minutes)
#   --eb-put-total N     etcd-bench put requests per run (default 250000)
#   --eb-range-total N   etcd-bench range requests per run (default 200000);
#                        each run prints its seconds: on a quiet machine
#                        etcd's should take 10-20 s (cairn's less)
#   --build DIR          build dir (default build)
#   --etcd-benchmark F   etcd's benchmark binary (default DIR/etcd-benchmark,
#                        built from Debian's sources when missing)
#   --no-setup           neither install nor build: use what DIR holds
#   --no-pin             pin nothing
#   --out DIR            results dir (default bench/results/<UTC time>...)
#   --keep-data DIR      keep big's data dirs in DIR (to profile a restart)
#
# Writes into the results dir: results.md (medians, cairn/etcd ratios,
# targets), summary.csv, raw.tsv (every measurement), loadgen.csv (every
# cairn-loadgen row), etcd-bench/ (every benchmark output), cdf/ (latency
# CDFs of repetition 1), PNG plots (gnuplot), env.txt, command.txt, run.log.
# A full run of every part also puts its table at the top of
# bench/results/LATEST.md and its link first in the list there.
#
# How long, 2 cores: it prints every part's seconds and the total at the
# end (and into env.txt). A full run takes about 18 minutes on a quiet
# machine: peak 2.5, ycsb 5, watch 0.1 and big 3.2 minutes as measured in
# the run 2026-11-30T0351Z; mixed about 1.2 (12 runs of 5 s), batch about 1
# (6 runs of 5 s, a server start each) and etcd-bench about 4 (18 runs of
# 4-20 s), estimated from their runs, not yet measured on a quiet machine.
# --quick took 2.2 and 4.1 minutes in two runs on a loaded machine (load
# average 8-15; parts 117 and 216 s: peak 25-34, mixed 12, ycsb 11-16,
# watch 2-7, etcd-bench 14-44, batch 8-24, big 31-52; setup 15-32 s with
# everything built). Building etcd's benchmark the first time adds about 3
# minutes, installing its Go packages (deps.sh --bench) a few more.
# cluster took 912 s (15 minutes) on a quiet machine in the run
# 2026-12-02T0216Z-cluster, 196 s of it cairn's 200,000-change catch-up
# (etcd's: 3 s), so a full run of all eight parts takes about 33 minutes
# (tls, the ninth, about 2 more, estimated: its --quick form took 69 s loaded);
# --catchup-changes 1000000 adds cairn's catch-up five times over until
# that is fixed.
# Its --quick form took 176 s on this machine at load average 12-45 (one
# repetition, 3 nodes only); expect 1-2 minutes on a quiet one. Both were
# measured before figure g (WaitReplicated), which adds its waitrepl time
# less the cluster starts: waitrepl took 110 and 113 s at load average
# 4-10 (2026-12-02T1407Z and T1410Z), 75-88 s of it the samples (1,200 cairn
# and 600 etcd puts, 40 ms apart).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
. bench/scripts/lib.sh

QUICK=0 BUILD=build REPS="" DURATION="" BIG_KEYS="" RATES="" NOPIN=0 NOSETUP=0 OUTDIR="" KEEP=""
EB_PUT_TOTAL="" EB_RANGE_TOTAL="" EB="" CLUSTER_RATE="" CATCHUP="" WAIT_SAMPLES=""
ALL_PARTS="peak mixed ycsb watch etcd-bench batch big cluster tls"
EXTRA_PARTS="waitrepl"   # known, not in a default run (cluster includes it)
PARTS=$ALL_PARTS
ARGS=("$@")
lib_parse bench.sh "quick=QUICK parts:PARTS reps:REPS duration:DURATION rates:RATES big-keys:BIG_KEYS
  eb-put-total:EB_PUT_TOTAL eb-range-total:EB_RANGE_TOTAL build:BUILD etcd-benchmark:EB no-setup=NOSETUP
  cluster-rate:CLUSTER_RATE catchup-changes:CATCHUP wait-samples:WAIT_SAMPLES
  no-pin=NOPIN out:OUTDIR keep-data:KEEP" "$@"
[ ${#LIB_ARGS[@]} -eq 0 ] || { echo "bench.sh: unexpected argument ${LIB_ARGS[0]}" >&2; exit 2; }
for p in $PARTS; do
  case " $ALL_PARTS $EXTRA_PARTS " in
    *" $p "*) ;;
    *) echo "bench.sh: unknown part $p (parts: $ALL_PARTS $EXTRA_PARTS)" >&2; exit 2 ;;
  esac
done
if [ "$QUICK" = 1 ]; then
  : "${REPS:=1}" "${DURATION:=2}" "${BIG_KEYS:=20000}" "${RATES:=1000 4000}"
  : "${EB_PUT_TOTAL:=12500}" "${EB_RANGE_TOTAL:=10000}"
  : "${CLUSTER_RATE:=500}" "${CATCHUP:=20000}" "${WAIT_SAMPLES:=50}"
  WATCH_COUNT=100
  CLUSTER_FLAGS=(--quick --sizes 3 --cut-s 3 --cut-post-s 3 --lag-count 50 --idle-s 2 --keys 2000
    --agg-clients 16)
else
  : "${REPS:=3}" "${DURATION:=5}" "${BIG_KEYS:=1000000}" "${RATES:=250 500 1000 1500 2000 3000 4000 6000 8000 12000}"
  : "${EB_PUT_TOTAL:=250000}" "${EB_RANGE_TOTAL:=200000}"
  : "${CLUSTER_RATE:=2000}" "${CATCHUP:=200000}" "${WAIT_SAMPLES:=300}"
  WATCH_COUNT=500
  CLUSTER_FLAGS=()
fi
KEYS=10000
LOAD_CHUNK=200000
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

# ------------------------------------------------------------------ setup
T_SETUP=$(date +%s)
case "$BUILD" in /*) B=$BUILD ;; *) B=$REPO/$BUILD ;; esac
LOADGEN=$B/cairn-loadgen
CAIRN=$B/cairn
[ -n "$EB" ] || EB=$B/etcd-benchmark
if [ "$NOSETUP" = 0 ]; then
  bash scripts/deps.sh --bench
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target cairn cairn-loadgen
  if want etcd-bench && [ ! -x "$EB" ]; then
    bash bench/scripts/build-etcd-benchmark.sh "$EB"
  fi
fi
for f in "$LOADGEN" "$CAIRN"; do
  [ -x "$f" ] || { echo "bench.sh: $f not found (cmake --build $BUILD --target cairn cairn-loadgen)" >&2; exit 2; }
done
if want etcd-bench && [ ! -x "$EB" ]; then
  echo "bench.sh: $EB not found (bench/scripts/build-etcd-benchmark.sh $EB builds it)" >&2
  exit 2
fi
ETCD=$(command -v etcd) || { echo "bench.sh: etcd not on PATH (Debian: etcd-server)" >&2; exit 2; }
command -v etcdctl >/dev/null || { echo "bench.sh: etcdctl not on PATH (Debian: etcd-client)" >&2; exit 2; }
PY=/usr/bin/python3
"$PY" -c 'import grpc, google.protobuf' 2>/dev/null ||
  { echo "bench.sh: $PY lacks grpc/protobuf (Debian: python3-grpcio python3-protobuf)" >&2; exit 2; }
PROBE=$REPO/bench/scripts/probe.py
T_SETUP=$(($(date +%s) - T_SETUP))

STAMP=$(date -u +%Y-%m-%dT%H%MZ)
SUFFIX=""
[ "$QUICK" = 0 ] || SUFFIX=-quick
[ "$PARTS" = "$ALL_PARTS" ] || SUFFIX=$SUFFIX-$(echo "$PARTS" | tr ' ' '-')
[ -n "$OUTDIR" ] || OUTDIR=bench/results/$STAMP$SUFFIX
mkdir -p "$OUTDIR/cdf"
OUTDIR=$(cd "$OUTDIR" && pwd)
exec > >(tee "$OUTDIR/run.log") 2>&1

PIN=1
[ "$NOPIN" = 0 ] || PIN=0
lib_pins "$PIN"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench.XXXXXX")
trap 'lib_cleanup; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

RAW=$OUTDIR/raw.tsv          # figure <tab> system <tab> rep <tab> value
LGCSV=$OUTDIR/loadgen.csv
: >"$RAW"
echo "label,workload,mode,rate,clients,conns,threads,duration_s,window_s,keys,key_size,value_size,dist,serializable,ok,errors,throughput,p50_us,p90_us,p99_us,p999_us,max_us,mean_us,read_p50_us,read_p99_us,write_p50_us,write_p99_us,late,unsent,cas_conflicts" >"$LGCSV"

T_BEGIN=$(date +%s)
{
  echo "command: scripts/bench.sh ${ARGS[*]}"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- server store crdt bench 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "started: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(awk '/MemTotal/ { printf "%.1f GiB RAM", $2 / 1048576 }' /proc/meminfo)"
  echo "filesystem of the data dirs: $(df -T "$WORK" | awk 'NR == 2 { print $2 " (" $1 ")" }') at $WORK"
  echo "etcd: $("$ETCD" --version | head -1)"
  echo "cairn: $("$CAIRN" --version 2>&1 | head -1)"
  echo "placement: $PINNING; etcd-bench: not pinned"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "mode: $([ "$QUICK" = 1 ] && echo quick || echo full), $REPS repetitions, ${DURATION} s per cairn-loadgen run, $KEYS keys for peak/mixed/ycsb, $BIG_KEYS keys for big, etcd-bench totals $EB_PUT_TOTAL put / $EB_RANGE_TOTAL range; parts: $PARTS"
} | tee "$OUTDIR/env.txt"

say() { echo "[$(date -u +%H:%M:%S)] $*"; }
rec() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RAW"; }
TIMES=()
T_PART=0
part_begin() { T_PART=$(date +%s); say "== $1"; }
part_end() { TIMES+=("$1 $(($(date +%s) - T_PART)) s"); say "== $1 took $(($(date +%s) - T_PART)) s"; }

SYSTEMS=(etcd cairn)
declare -A EP PID PORT BIN
BIN[etcd]=$ETCD
BIN[cairn]=$CAIRN
# start SYSTEM: a fresh server with data in $WORK/SYSTEM.data.
start() {
  rm -rf "$WORK/$1.data"
  lib_start_server "$1" "${BIN[$1]}" || { echo "bench.sh: could not start $1" >&2; exit 1; }
  EP[$1]=$ENDPOINT
  PORT[$1]=${ENDPOINT##*:}
  PID[$1]=$SERVER_PID
}
stop_all() { for s in "${SYSTEMS[@]}"; do lib_stop "${PID[$s]}"; done; }

# lg SYSTEM CASE REP FLAGS...: one cairn-loadgen run on the KEYS key space;
# appends its row to loadgen.csv and $WORK/row.csv, prints a summary line.
# A failed run is reported and skipped (returns 1).
lg() {
  local sys=$1 case=$2 rep=$3 cdf=()
  shift 3
  [ "$rep" != 1 ] || cdf=(--cdf "$OUTDIR/cdf/$case.$sys.1.txt")
  if "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "${EP[$sys]}" --keys "$KEYS" --duration "$DURATION" \
    --seed "$rep" --format csv --no-header --label "$sys/$case/$rep" "${cdf[@]}" "$@" \
    </dev/null >"$WORK/row.csv" 2>"$WORK/lg.txt"; then
    cat "$WORK/row.csv" >>"$LGCSV"
    awk -F, '{ printf "  %-28s %9.1f ops/s  p50 %8.3f ms  p99 %8.3f ms  errors %s unsent %s\n", $1, $17, $18/1000, $20/1000, $16, $29 }' "$WORK/row.csv"
    return 0
  fi
  echo "  $sys/$case/$rep FAILED:"
  tail -n 5 "$WORK/lg.txt"
  return 1
}
# rec_row FIGURE SYSTEM REP COLUMN... : records columns of $WORK/row.csv as
# FIGURE.NAME (NAME from the loadgen.csv header; latencies in ms).
rec_cols() {
  local fig=$1 sys=$2 rep=$3 col
  shift 3
  for col in "$@"; do
    case "$col" in
      tput) rec "$fig.tput" "$sys" "$rep" "$(cut -d, -f17 "$WORK/row.csv")" ;;
      p50) rec "$fig.p50" "$sys" "$rep" "$(awk -F, '{ print $18 / 1000 }' "$WORK/row.csv")" ;;
      p99) rec "$fig.p99" "$sys" "$rep" "$(awk -F, '{ print $20 / 1000 }' "$WORK/row.csv")" ;;
      read_p50) rec "$fig.read_p50" "$sys" "$rep" "$(awk -F, '{ print $24 / 1000 }' "$WORK/row.csv")" ;;
      read_p99) rec "$fig.read_p99" "$sys" "$rep" "$(awk -F, '{ print $25 / 1000 }' "$WORK/row.csv")" ;;
      write_p50) rec "$fig.write_p50" "$sys" "$rep" "$(awk -F, '{ print $26 / 1000 }' "$WORK/row.csv")" ;;
      write_p99) rec "$fig.write_p99" "$sys" "$rep" "$(awk -F, '{ print $27 / 1000 }' "$WORK/row.csv")" ;;
      unsent) rec "$fig.unsent" "$sys" "$rep" "$(cut -d, -f29 "$WORK/row.csv")" ;;
    esac
  done
}
# cases CASES-TEXT: runs every "name|flags" line of CASES-TEXT, REPS times,
# etcd and cairn alternating, recording the COLS after it.
cases() {
  local text=$1 rep c flags s
  shift
  for rep in $(seq "$REPS"); do
    while IFS='|' read -r c flags; do
      [ -n "$c" ] || continue
      for s in "${SYSTEMS[@]}"; do
        # shellcheck disable=SC2086
        if lg "$s" "$c" "$rep" $flags; then rec_cols "$c" "$s" "$rep" "$@"; fi
      done
    done <<<"$text"
  done
}

# ------------------------------------------- peak, mixed, ycsb, watch
if want peak || want mixed || want ycsb || want watch; then
  say "fresh servers for peak/mixed/ycsb/watch, $KEYS keys preloaded"
  for s in "${SYSTEMS[@]}"; do
    start "$s"
    "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "${EP[$s]}" --workload load --keys "$KEYS" --clients 32 \
      --duration 120 >"$WORK/preload.txt" 2>&1 || { cat "$WORK/preload.txt"; exit 1; }
    say "$s: $(grep '^load:' "$WORK/preload.txt")"
  done
fi

if want peak; then
  part_begin "peak: closed loop, $REPS x $DURATION s a case"
  # 64 clients for writes (group commit needs concurrency), 32 for reads:
  # both past the knee on this machine for both servers.
  cases '
put|--workload put --clients 64
range|--workload range --clients 32
range-ser|--workload range --clients 32 --serializable
range-prefix-ser|--workload range-prefix --clients 32 --serializable
txn-cas|--workload txn-cas --clients 64
' tput p50 p99
  part_end peak
fi

if want mixed; then
  part_begin "mixed: YCSB A and B closed loop, 64 clients, $REPS x $DURATION s a case"
  cases '
mixed-a|--workload a --clients 64
mixed-b|--workload b --clients 64
' tput p50 p99 read_p50 read_p99 write_p50 write_p99
  part_end mixed
fi

if want ycsb; then
  part_begin "ycsb: YCSB A open loop at $RATES ops/s (ends at the first rate neither server holds)"
  for r in $RATES; do
    cases "ycsb-a-$r|--workload a --rate $r" tput p50 p99 unsent
    held=0
    for s in "${SYSTEMS[@]}"; do
      med=$(awk -F'\t' -v f="ycsb-a-$r.tput" -v s="$s" '$1 == f && $2 == s { print $4 }' "$RAW" | lib_median)
      uns=$(awk -F'\t' -v f="ycsb-a-$r.unsent" -v s="$s" '$1 == f && $2 == s { print $4 }' "$RAW" | lib_median)
      if awk -v m="$med" -v r="$r" -v u="$uns" 'BEGIN { exit !(m >= 0.95 * r && u == 0) }'; then held=1; fi
    done
    [ "$held" = 1 ] || { say "neither server held $r ops/s: the sweep ends"; break; }
  done
  part_end ycsb
fi

if want watch; then
  part_begin "watch: put -> event latency, $WATCH_COUNT puts a run"
  for rep in $(seq "$REPS"); do
    for s in "${SYSTEMS[@]}"; do
      cdf=()
      [ "$rep" != 1 ] || cdf=(--cdf "$OUTDIR/cdf/watch.$s.1.txt")
      if row=$("${LOAD_PIN[@]}" "$PY" "$PROBE" watch-latency --endpoint "${EP[$s]}" --count "$WATCH_COUNT" \
        --label "$s/watch/$rep" "${cdf[@]}" 2>"$WORK/probe.txt"); then
        echo "  $row"
        rec watch.p50 "$s" "$rep" "$(echo "$row" | cut -d, -f3)"
        rec watch.p99 "$s" "$rep" "$(echo "$row" | cut -d, -f5)"
      else
        echo "  $s/watch/$rep FAILED"
        tail -n 5 "$WORK/probe.txt"
      fi
    done
  done
  part_end watch
fi

if want peak || want mixed || want ycsb || want watch; then
  stop_all
fi

# ------------------------------------------------------------ etcd-bench
# name|benchmark arguments|total. One key for the ranges, put first: the
# issue's command names one; put runs on benchmark's default key space.
if want etcd-bench; then
  part_begin "etcd-bench: etcd's benchmark, $REPS x (put $EB_PUT_TOTAL, range $EB_RANGE_TOTAL x 2), servers not pinned"
  mkdir -p "$OUTDIR/etcd-bench"
  PIN_SAVED=("${SERVER_PIN[@]}")
  SERVER_PIN=()
  RKEY=bench-range-key-18
  for s in "${SYSTEMS[@]}"; do
    start "$s"
    ETCDCTL_API=3 etcdctl --endpoints "${EP[$s]}" put "$RKEY" "$(printf 'v%.0s' $(seq 32))" >/dev/null
  done
  SERVER_PIN=("${PIN_SAVED[@]}")
  for rep in $(seq "$REPS"); do
    while IFS='|' read -r c args total; do
      [ -n "$c" ] || continue
      for s in "${SYSTEMS[@]}"; do
        out=$OUTDIR/etcd-bench/$c.$s.$rep.txt
        # shellcheck disable=SC2086
        if timeout 300 "$EB" --endpoints="${EP[$s]}" --conns=10 --clients=100 $args --total="$total" \
          </dev/null >"$WORK/eb.out" 2>"$WORK/eb.err" && grep -q 'Requests/sec' "$WORK/eb.out"; then
          # Without the progress bar, the summary's lines: "Total: 12.3
          # secs.", "Requests/sec: 2436.9", "  99% in 0.0123 secs.".
          tr '\r' '\n' <"$WORK/eb.out" | grep -Ev '^ *[0-9]+ / [0-9]+ ' >"$out"
          awk -v f="eb-$c" -v s="$s" -v r="$rep" '
            $1 == "Total:" { printf "%s.seconds\t%s\t%s\t%s\n", f, s, r, $2 }
            $1 == "Requests/sec:" { printf "%s.tput\t%s\t%s\t%s\n", f, s, r, $2 }
            $1 == "Average:" { printf "%s.mean\t%s\t%s\t%s\n", f, s, r, $2 * 1000 }
            $1 == "50%" && $2 == "in" { printf "%s.p50\t%s\t%s\t%s\n", f, s, r, $3 * 1000 }
            $1 == "99%" && $2 == "in" { printf "%s.p99\t%s\t%s\t%s\n", f, s, r, $3 * 1000 }' "$out" >>"$RAW"
          awk -v l="$s/eb-$c/$rep" '
            $1 == "Total:" { t = $2 } $1 == "Requests/sec:" { q = $2 } $1 == "99%" && $2 == "in" { p = $3 * 1000 }
            END { printf "  %-28s %9.1f req/s  p99 %8.3f ms  (%.1f s)\n", l, q, p, t }' "$out"
        else
          echo "  $s/eb-$c/$rep FAILED:"
          tail -n 5 "$WORK/eb.err"
        fi
      done
    done <<EOF
put|put --key-size=18 --val-size=32|$EB_PUT_TOTAL
range-s|range $RKEY --consistency=s|$EB_RANGE_TOTAL
range-l|range $RKEY --consistency=l|$EB_RANGE_TOTAL
EOF
  done
  stop_all
  part_end etcd-bench
fi

# ------------------------------------------------------------------ batch
# cairn without and with --experimental-batch-writes, a fresh server for
# every run (single, batched, single, ...). Puts per change = Puts answered
# OK / revisions the run made (a batched change takes one revision too);
# CPU per Put from the server's utime + stime.
if want batch; then
  part_begin "batch: one change per Put against --experimental-batch-writes 64, $REPS x $DURATION s"
  CLK_TCK=$(getconf CLK_TCK)
  revision() {
    ETCDCTL_API=3 etcdctl --endpoints "$1" --dial-timeout=2s --command-timeout=5s endpoint status -w json |
      "$PY" -c 'import json, sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])'
  }
  for rep in $(seq "$REPS"); do
    for mode in single batched; do
      flags=()
      [ "$mode" = single ] || flags=(--experimental-batch-writes 64)
      rm -rf "$WORK/$mode.data"
      lib_start_server "$mode" "$CAIRN" "${flags[@]}" || { echo "bench.sh: could not start cairn ($mode)" >&2; exit 1; }
      EP[$mode]=$ENDPOINT
      r0=$(revision "$ENDPOINT")
      c0=$(lib_cpu_ticks "$SERVER_PID")
      if lg "$mode" batch-put "$rep" --workload put --clients 64; then
        c1=$(lib_cpu_ticks "$SERVER_PID")
        r1=$(revision "$ENDPOINT")
        rec_cols batch "$mode" "$rep" tput p50 p99
        ok=$(cut -d, -f15 "$WORK/row.csv")
        rec batch.puts_per_change "$mode" "$rep" "$(awk -v ok="$ok" -v d=$((r1 - r0)) 'BEGIN { printf "%.2f", (d > 0 ? ok / d : 0) }')"
        rec batch.cpu_us "$mode" "$rep" "$(awk -v ok="$ok" -v d=$((c1 - c0)) -v hz="$CLK_TCK" 'BEGIN { printf "%.1f", (ok > 0 ? d * 1e6 / hz / ok : 0) }')"
      fi
      lib_stop "$SERVER_PID"
    done
  done
  part_end batch
fi

# -------------------------------------------------------------------- big
if want big; then
  part_begin "big: $BIG_KEYS keys into fresh servers (runs of $LOAD_CHUNK keys, 64 clients), then restarts"
  for s in "${SYSTEMS[@]}"; do start "$s"; done
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

  # restart SYSTEM REP: SIGTERM, then start again on the same data dir and
  # ports; records the seconds from exec to the first answered Range.
  restart() {
    local s=$1 rep=$2 secs
    local -a args
    lib_stop "${PID[$s]}"
    sync
    mapfile -t args < <(lib_server_args "${PORT[$s]}" "$WORK/$s.data")
    if secs=$("${LOAD_PIN[@]}" "$PY" "$PROBE" first-answer --endpoint "127.0.0.1:${PORT[$s]}" \
        --pidfile "$WORK/$s.pid" --log "$WORK/$s.log" --timeout 120 -- "${SERVER_PIN[@]}" "${BIN[$s]}" \
        "${args[@]}" 2>"$WORK/probe.txt"); then
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
    rec big.keys_after_restart "$s" 1 "$n"
    rec big.disk_restart_mib "$s" 1 "$(disk_mib "$WORK/$s.data")"
    say "  $s after restarts: VmRSS $(rss_mib "${PID[$s]}") MiB, $n keys, data dir $(disk_mib "$WORK/$s.data") MiB"
    du -ab "$WORK/$s.data" | sort -n | tail -n 6 | sed 's/^/    /'
  done
  stop_all
  if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP" && mv "$WORK/etcd.data" "$WORK/cairn.data" "$KEEP/" && say "data dirs kept in $KEEP"
  fi
  part_end big
fi

# ---------------------------------------------------------------- cluster
if want cluster; then
  part_begin "cluster: 3- and 5-node cairn beside etcd through link proxies, $REPS repetitions"
  "$PY" "$REPO/bench/scripts/cluster_bench.py" --cairn "$CAIRN" --etcd "$ETCD" --loadgen "$LOADGEN" \
    --out "$OUTDIR" --work "$WORK" --reps "$REPS" --duration "$DURATION" --rate "$CLUSTER_RATE" \
    --catchup-changes "$CATCHUP" --wait-samples "$WAIT_SAMPLES" "${CLUSTER_FLAGS[@]}" </dev/null ||
    say "the cluster part failed"
  part_end cluster
fi

# --------------------------------------------------------------- waitrepl
if want waitrepl; then
  if want cluster; then
    say "waitrepl: skipped, the cluster part ran its figure g"
  else
    part_begin "waitrepl: WaitReplicated latency, 3-node cairn beside etcd through link proxies"
    "$PY" "$REPO/bench/scripts/cluster_bench.py" --cairn "$CAIRN" --etcd "$ETCD" --loadgen "$LOADGEN" \
      --out "$OUTDIR" --work "$WORK" --reps "$REPS" --figures g --sizes 3 \
      --wait-samples "$WAIT_SAMPLES" "${CLUSTER_FLAGS[@]}" </dev/null || say "the waitrepl part failed"
    part_end waitrepl
  fi
fi

# -------------------------------------------------------------------- tls
# The same certificates for both; the client URL is https:// only. Rows:
# tls-put and tls-range-ser (throughput, latency), tls-handshake.per_s (new
# connections per second).
if want tls; then
  part_begin "tls: client TLS, put and serializable range, $REPS x $DURATION s a case; handshakes"
  "$PY" "$REPO/tests/integration/tls_fixtures.py" "$WORK/tls" >/dev/null
  TCA=$WORK/tls/ca/ca.pem
  TCERT=$WORK/tls/ca/good.pem
  TKEY=$WORK/tls/ca/good-key.pem
  TLS_SRV=(--cert-file "$WORK/tls/ca/server.pem" --key-file "$WORK/tls/ca/server-key.pem"
    --trusted-ca-file "$TCA" --client-cert-auth)
  TLS_CLI=(--cacert "$TCA" --cert "$TCERT" --key "$TKEY")
  # tls_start SYSTEM: like start, on an https:// client URL.
  tls_start() {
    local s=$1 cport pid
    local -a args
    rm -rf "$WORK/$s.data"
    cport=$(lib_pick_port)
    mapfile -t args < <(lib_server_args "$cport" "$WORK/$s.data" |
      sed "s|^http://127.0.0.1:$cport\$|https://127.0.0.1:$cport|")
    "${SERVER_PIN[@]}" "${BIN[$s]}" "${args[@]}" "${TLS_SRV[@]}" >"$WORK/$s.log" 2>&1 &
    pid=$!
    LIB_PIDS+=("$pid")
    PID[$s]=$pid
    EP[$s]=https://127.0.0.1:$cport
    PORT[$s]=$cport
    for _ in $(seq 60); do
      kill -0 "$pid" 2>/dev/null || { tail -n 20 "$WORK/$s.log"; echo "bench.sh: $s exited" >&2; exit 1; }
      if ETCDCTL_API=3 timeout 3 etcdctl --endpoints "${EP[$s]}" --cacert "$TCA" --cert "$TCERT" \
        --key "$TKEY" --dial-timeout=1s --command-timeout=1s get bench-probe >/dev/null 2>&1; then
        echo "$s (pid $pid) ready on ${EP[$s]} (TLS)"
        return 0
      fi
      sleep 0.5
    done
    tail -n 20 "$WORK/$s.log"
    echo "bench.sh: $s not ready on TLS after 30 s" >&2
    exit 1
  }
  for s in "${SYSTEMS[@]}"; do
    tls_start "$s"
    "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "${EP[$s]}" "${TLS_CLI[@]}" --workload load --keys "$KEYS" \
      --clients 32 --duration 120 >"$WORK/preload.txt" 2>&1 || { cat "$WORK/preload.txt"; exit 1; }
  done
  for rep in $(seq "$REPS"); do
    while IFS='|' read -r c flags; do
      [ -n "$c" ] || continue
      for s in "${SYSTEMS[@]}"; do
        # shellcheck disable=SC2086
        if lg "$s" "$c" "$rep" "${TLS_CLI[@]}" $flags; then rec_cols "$c" "$s" "$rep" tput p50 p99; fi
      done
    done <<'EOF'
tls-put|--workload put --clients 64
tls-range-ser|--workload range --clients 32 --serializable
EOF
    for s in "${SYSTEMS[@]}"; do
      # "N connections in T real seconds; ...": one full handshake each
      out=$("${LOAD_PIN[@]}" timeout $((DURATION + 30)) openssl s_time -connect "127.0.0.1:${PORT[$s]}" \
        -new -time "$DURATION" -CAfile "$TCA" -cert "$TCERT" -key "$TKEY" </dev/null 2>&1 || true)
      n=$(echo "$out" | sed -n 's/^\([0-9]*\) connections in \([0-9.]*\) real seconds.*/\1 \2/p' | head -1)
      if [ -n "$n" ]; then
        v=$(echo "$n" | awk '{ printf "%.1f", ($2 > 0 ? $1 / $2 : 0) }')
        rec tls-handshake.per_s "$s" "$rep" "$v"
        echo "  $s/tls-handshake/$rep          $v new TLS connections/s"
      else
        echo "  $s/tls-handshake/$rep FAILED: $(echo "$out" | tail -n 2)"
      fi
    done
  done
  stop_all
  part_end tls
fi

# ----------------------------------------------------------------- report
{
  echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "seconds: setup (deps, build) $T_SETUP s; ${TIMES[*]/%/;} total $(($(date +%s) - T_BEGIN)) s"
  echo "finished: $(date -u '+%Y-%m-%d %H:%M:%S UTC') ($(($(date +%s) - T_BEGIN)) s)"
} | tee -a "$OUTDIR/env.txt"
rmdir "$OUTDIR/cdf" 2>/dev/null || true
"$PY" "$REPO/bench/scripts/report.py" --dir "$OUTDIR" --rates "$RATES" --big-keys "$BIG_KEYS"
bash "$REPO/bench/scripts/plot.sh" "$OUTDIR" || say "plotting failed"
echo "scripts/bench.sh ${ARGS[*]}" >"$OUTDIR/command.txt"
REL=${OUTDIR#"$REPO/"}
if [ "$QUICK" = 0 ] && [ "$PARTS" = "$ALL_PARTS" ] && [ "${REL#bench/results/}" != "$REL" ]; then
  "$PY" "$REPO/bench/scripts/report.py" --dir "$OUTDIR" --rates "$RATES" --big-keys "$BIG_KEYS" \
    --latest bench/results/LATEST.md --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
fi
if [ "$QUICK" = 0 ] && want cluster && [ -s "$OUTDIR/cluster.md" ] && [ "${REL#bench/results/}" != "$REL" ]; then
  "$PY" "$REPO/bench/scripts/cluster_bench.py" --out "$OUTDIR" --latest bench/results/LATEST.md \
    --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
fi
say "results: $OUTDIR/results.md"
cat "$OUTDIR/results.md"
say "bench.sh took $(($(date +%s) - T_BEGIN)) s after $T_SETUP s of setup (${TIMES[*]/%/;})"
