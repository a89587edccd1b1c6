# Sourced by the bench scripts: start etcd-compatible servers on random
# loopback ports with data in $WORK, and stop exactly the PIDs started here.
# The caller sets WORK (a temp dir it owns) and SERVER_PIN (an array, e.g.
# (taskset -c 0) or ()), and calls lib_cleanup from its EXIT trap.

LIB_PIDS=()

lib_cleanup() {
  local pid
  for pid in "${LIB_PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  LIB_PIDS=()
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

# lib_start_server NAME BINARY [FLAGS...]: starts BINARY with etcd's flags
# (cairn takes the same names) and any extra FLAGS, waits until a KV Range
# succeeds (at most 30 s), and sets ENDPOINT and SERVER_PID. Returns
# non-zero, with the log's tail on stderr, on failure.
lib_start_server() {
  local name=$1 bin=$2 cport pport dir pid
  shift 2
  cport=$(lib_pick_port) || return 1
  pport=$((cport + 1))
  dir=$WORK/$name.data
  "${SERVER_PIN[@]}" "$bin" --name default --data-dir "$dir" \
    --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "default=http://127.0.0.1:$pport" "$@" >"$WORK/$name.log" 2>&1 &
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
