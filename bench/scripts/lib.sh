# shellcheck shell=bash disable=SC2034
# Sourced by scripts/bench.sh, bench/scripts/put-cpu.sh and
# bench/scripts/loadgen-smoke.sh: option parsing, etcd-compatible servers on
# random loopback ports with data in $WORK (only the PIDs started here are
# ever stopped), medians, perf reports.
# The caller sets WORK (a temp dir it owns) and SERVER_PIN (an array, e.g.
# (taskset -c 0) or ()), and calls lib_cleanup from its EXIT trap.

LIB_PIDS=()

# lib_parse PROG SPEC ARGS...: sets shell variables from --options. SPEC is
# words "name:VAR" (--name VALUE sets VAR=VALUE) and "name=VAR" (--name sets
# VAR=1). Other words go to the array LIB_ARGS. -h or --help prints the
# calling script's opening comment and exits.
lib_parse() {
  local prog=$1 spec=" ${2//$'\n'/ } " name rest var
  shift 2
  LIB_ARGS=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -h|--help)
        awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"
        exit 0 ;;
      --*)
        name=${1#--}
        if [[ $spec == *" $name:"* ]]; then
          rest=${spec#*" $name:"}
          var=${rest%% *}
          [ $# -ge 2 ] || { echo "$prog: $1 needs a value" >&2; exit 2; }
          printf -v "$var" '%s' "$2"
          shift 2
        elif [[ $spec == *" $name="* ]]; then
          rest=${spec#*" $name="}
          var=${rest%% *}
          printf -v "$var" 1
          shift
        else
          echo "$prog: unknown option $1 (--help lists them)" >&2
          exit 2
        fi ;;
      *) LIB_ARGS+=("$1"); shift ;;
    esac
  done
}

# lib_pins PIN: sets SERVER_PIN and LOAD_PIN (arrays) and PINNING (a
# sentence). With PIN=1, taskset and 2+ cores, servers go to CPU 0 and the
# clients to CPU 1, so that neither takes time from the other.
lib_pins() {
  SERVER_PIN=()
  LOAD_PIN=()
  if [ "$1" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    SERVER_PIN=(taskset -c 0)
    LOAD_PIN=(taskset -c 1)
    PINNING="servers pinned to CPU 0 (taskset -c 0), their clients to CPU 1 (taskset -c 1)"
  else
    PINNING="not pinned (no taskset, one core, or --no-pin)"
  fi
}

# lib_stop PID: SIGTERM, wait up to 30 s, then SIGKILL; PID leaves
# LIB_PIDS, so that a PID the system hands out again later is never touched.
lib_stop() {
  local pid=$1 p
  local -a keep=()
  for p in "${LIB_PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  LIB_PIDS=("${keep[@]}")
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null || true
}

lib_cleanup() {
  local pid
  for pid in "${LIB_PIDS[@]}"; do lib_stop "$pid"; done
}

lib_port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

lib_pick_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 19999))
    if lib_port_free "$p" && lib_port_free $((p + 1)); then echo "$p"; return 0; fi
  done
  echo "no free port found in 20000-40000" >&2
  return 1
}

# lib_server_args CPORT DATADIR: etcd's flags for a one-member cluster on
# 127.0.0.1 (cairn takes the same names), one word a line.
lib_server_args() {
  local c=http://127.0.0.1:$1 p=http://127.0.0.1:$(($1 + 1))
  printf '%s\n' --name default --data-dir "$2" --listen-client-urls "$c" --advertise-client-urls "$c" \
    --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" --initial-cluster "default=$p"
}

# lib_start_server NAME BINARY [FLAGS...]: starts BINARY (under SERVER_PIN)
# with data in $WORK/NAME.data and any extra FLAGS, waits until a KV Range
# succeeds (at most 30 s), and sets ENDPOINT and SERVER_PID. Returns
# non-zero, with the log's tail on stderr, on failure.
lib_start_server() {
  local name=$1 bin=$2 cport dir pid
  local -a args
  shift 2
  cport=$(lib_pick_port) || return 1
  dir=$WORK/$name.data
  mapfile -t args < <(lib_server_args "$cport" "$dir")
  "${SERVER_PIN[@]}" "$bin" "${args[@]}" "$@" >"$WORK/$name.log" 2>&1 &
  pid=$!
  LIB_PIDS+=("$pid")
  SERVER_PID=$pid
  ENDPOINT=127.0.0.1:$cport
  for _ in $(seq 60); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name exited during start-up; log:" >&2
      tail -n 20 "$WORK/$name.log" >&2
      return 1
    fi
    if ETCDCTL_API=3 timeout 3 etcdctl --endpoints "$ENDPOINT" --dial-timeout=1s --command-timeout=1s \
      get bench-probe >/dev/null 2>&1; then
      echo "$name (pid $pid) ready on $ENDPOINT, data in $dir"
      return 0
    fi
    sleep 0.5
  done
  echo "$name not ready after 30 s; log:" >&2
  tail -n 20 "$WORK/$name.log" >&2
  return 1
}

# lib_median: median of the numbers on stdin, one a line.
lib_median() {
  sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# lib_cpu_ticks PID: utime + stime of every thread of PID, in clock ticks.
lib_cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# lib_perf_report PERFDATA TITLE OUTFILE CHILDREN_MIN: a perf profile as text,
# self time by symbol and library (>= 0.5%), then inclusive time by symbol
# (>= CHILDREN_MIN %).
lib_perf_report() {
  {
    echo "# $2"
    echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "## self time by symbol (dso), >= 0.5%"
    perf report -i "$1" --no-children --sort dso,symbol -g none --percent-limit 0.5 --stdio 2>/dev/null |
      grep -v '^#' | grep '%' | cut -c1-160 || true
    echo "## inclusive time (children) by symbol, >= $4%"
    perf report -i "$1" --children --sort symbol -g none --percent-limit "$4" --stdio 2>/dev/null |
      grep -v '^#' | grep '%' | cut -c1-160 || true
  } >"$3"
}
