#!/usr/bin/env bash
# loadgen-smoke.sh: checks cairn-loadgen end to end against a real server.
#
# Starts a fresh etcd (or, with --server cairn, build/cairn) on random
# loopback ports, then asserts: a non-loopback endpoint is refused; the load
# phase inserts every key; every workload runs for a second with no error
# and, for reads, --verify finds every key it expects; the open loop sends
# exactly rate x duration requests; JSON output parses. About 15 s; stops
# only the PID it started. Registered with ctest as loadgen_smoke_etcd and,
# when the cairn target exists, loadgen_smoke_cairn.
#
# Usage: bench/scripts/loadgen-smoke.sh LOADGEN [--server etcd|cairn BINARY]
set -euo pipefail

LOADGEN=${1:?usage: loadgen-smoke.sh LOADGEN [--server NAME BINARY]}
NAME=etcd
BIN=$(command -v etcd || true)
if [ "${2:-}" = --server ]; then NAME=$3; BIN=$4; fi
[ -x "$BIN" ] || { echo "loadgen-smoke: no $NAME binary" >&2; exit 1; }

. "$(dirname "$0")/lib.sh"
SERVER_PIN=()
WORK=$(mktemp -d "${TMPDIR:-/tmp}/loadgen-smoke.XXXXXX")
trap 'lib_cleanup; rm -rf "$WORK"' EXIT

fail() { echo "loadgen-smoke: FAIL: $*" >&2; exit 1; }

# 1. the loopback rule
if "$LOADGEN" --endpoint 192.0.2.1:2379 --duration 1 >"$WORK/out" 2>&1; then fail "remote endpoint accepted"; fi
grep -q "refusing to send load" "$WORK/out" || fail "no refusal message"

lib_start_server "$NAME" "$BIN"
KEYS=1000
run() { "$LOADGEN" --endpoint "$ENDPOINT" --keys "$KEYS" --format csv --no-header "$@" 2>"$WORK/err"; }
field() { echo "$1" | cut -d, -f"$2"; }

# 2. load phase inserts every key once
row=$(run --workload load --clients 8 --duration 30) || { cat "$WORK/err" >&2; fail "load"; }
[ "$(field "$row" 15)" = "$KEYS" ] || fail "load inserted $(field "$row" 15) of $KEYS: $row"
grep -q "load: $KEYS of $KEYS keys inserted" "$WORK/err" || fail "load report"

# 3. every workload, closed loop, no errors, reads verified
for w in a b c put range range-prefix txn-cas; do
  row=$(run --workload "$w" --clients 8 --duration 1 --verify) || { cat "$WORK/err" >&2; fail "$w exited non-zero"; }
  ok=$(field "$row" 15); errs=$(field "$row" 16)
  [ "$ok" -gt 0 ] && [ "$errs" = 0 ] || { cat "$WORK/err" >&2; fail "$w: ok=$ok errors=$errs"; }
  echo "loadgen-smoke: $w ok ($ok ops/s)"
done
row=$(run --workload txn-cas --clients 8 --duration 1 --dist zipfian --serializable) || fail "txn-cas zipfian"

# 4. open loop holds a modest rate exactly: 200/s for 2 s is 400 requests
row=$(run --workload a --rate 200 --duration 2 --verify) || { cat "$WORK/err" >&2; fail "open loop"; }
ok=$(field "$row" 15); unsent=$(field "$row" 29)
[ "$ok" = 400 ] && [ "$unsent" = 0 ] || fail "open loop sent $ok (unsent $unsent), want 400"

# 5. JSON output is one valid object with the fields plots need
"$LOADGEN" --endpoint "$ENDPOINT" --keys "$KEYS" --workload range --clients 2 --duration 0.5 --format json \
  2>/dev/null >"$WORK/out.json" || fail "json run"
python3 -c '
import json, sys, time
d = json.load(open(sys.argv[1]))
assert d["workload"] == "range" and d["ok"] > 0, d
l = d["latency"]["all"]
assert 0 < l["p50_us"] <= l["p99_us"] <= l["max_us"], l
assert len(d["timeline_ops_per_s"]) >= 1
t = d["timeline_by_slot"]
assert len(t["ok"]) == len(t["errors"]) == len(t["mean_ms"]) == len(t["max_ms"]) == 1, t
assert t["ok"][0] == d["ok"] and t["errors"][0] == d["errors_total"], (t, d["ok"])
assert 0 < t["mean_ms"][0] <= t["max_ms"][0], t
assert abs(d["window_start_unix"] - time.time()) < 60, d["window_start_unix"]
' "$WORK/out.json" || fail "json content"

echo "loadgen-smoke: all checks passed against $NAME"
