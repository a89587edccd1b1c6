#!/usr/bin/python3
"""--experimental-batch-writes (benchmarks only; server/etcd/kv_batch.c): with the flag,
concurrent plain Puts share changes, yet every Put is answered OK with the
revision of the change that holds it, and every key reads back with the
value and mod_revision its Put was told. Without the flag each Put keeps
its own revision (etcd's numbering). Also: the flag's checks, a Put with
prev_kv bypassing the batch, repeated keys in flight (a Txn may not put one
key twice, so they must land in different changes), and a clean exit with
the batcher's count in the log.

Requests are encoded by hand; RPCs use grpc's generic unary_unary futures,
so many Puts are in flight at once without threads.

Usage: test_batch_writes.py --cairn build/cairn
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from system_python import grpc  # noqa: E402
from procs import Server  # noqa: E402
from verdict import check, finish  # noqa: E402
from wire import decode, field_bytes, field_int  # noqa: E402

PUT = "/etcdserverpb.KV/Put"
RANGE = "/etcdserverpb.KV/Range"
NKEYS = 1500      # distinct keys, one Put each
WAVE = 96         # Puts in flight at once
HOT = 8           # Puts of one key per wave, in flight together

# ---- protobuf by hand -------------------------------------------------------

def put_req(key, value, prev_kv=False):
    m = field_bytes(1, key) + field_bytes(2, value)
    if prev_kv:
        m += field_int(4, 1)
    return m


def header_revision(resp):
    """ResponseHeader.revision (3) of a Put/Range response's header (1)."""
    h = decode(resp).get(1, [b""])[0]
    return decode(h).get(3, [0])[0]


def rpc(ch, method):
    return ch.unary_unary(method, request_serializer=lambda b: b,
                          response_deserializer=lambda b: b)


def range_all(ch, prefix):
    """{key: (value, mod_revision)} for every key starting with |prefix|."""
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    resp = rpc(ch, RANGE)(field_bytes(1, prefix) + field_bytes(2, end), timeout=20)
    kvs = {}
    for kv in decode(resp).get(2, []):
        d = decode(kv)
        kvs[d[1][0]] = (d.get(5, [b""])[0], d.get(3, [0])[0])
    return kvs


def current_revision(ch):
    return header_revision(rpc(ch, RANGE)(field_bytes(1, b"no-such-key"), timeout=10))


def put_many(chans, items):
    """Sends every (key, value) Put, WAVE at a time over |chans|; returns a
    list of (key, value, status, revision)."""
    out = []
    for start in range(0, len(items), WAVE):
        futs = []
        for j, (k, v) in enumerate(items[start:start + WAVE]):
            f = rpc(chans[j % len(chans)], PUT).future(put_req(k, v), timeout=30)
            futs.append((k, v, f))
        for k, v, f in futs:
            try:
                out.append((k, v, "OK", header_revision(f.result())))
            except grpc.RpcError as e:
                out.append((k, v, e.code().name, 0))
    return out


def workload():
    """Distinct keys interleaved with waves of Puts to one hot key."""
    items = []
    hot = 0
    for i in range(NKEYS):
        items.append((b"bw/k%05d" % i, b"v%05d" % i))
        if i % WAVE == 0:
            for _ in range(HOT):
                items.append((b"bw/hot", b"h%05d" % hot))
                hot += 1
    return items


def flag_checks(binary):
    r = subprocess.run([binary, "--help"], capture_output=True, timeout=20)
    check(r.returncode == 0 and b"--experimental-batch-writes" in r.stdout and
          b"benchmarks only" in r.stdout, "--help lists --experimental-batch-writes as for benchmarks only")
    for bad, what in (("abc", "a non-number"), ("-1", "a negative size"),
                      ("129", "more than --max-txn-ops (128)")):
        r = subprocess.run([binary, "--experimental-batch-writes", bad], capture_output=True,
                           timeout=20, stdin=subprocess.DEVNULL)
        check(r.returncode != 0 and b"experimental-batch-writes" in r.stderr,
              "--experimental-batch-writes %s (%s) is refused (%r)" % (bad, what, r.stderr))


def run_batched(binary):
    srv = Server("cairn", binary, extra=["--experimental-batch-writes", "16"]).start()
    try:
        chans = [grpc.insecure_channel(srv.endpoint) for _ in range(4)]
        rev0 = current_revision(chans[0])
        items = workload()
        t0 = time.time()
        res = put_many(chans, items)
        dt = time.time() - t0
        bad = [(k, st) for k, _, st, _ in res if st != "OK"]
        check(not bad, "every batched Put answered OK (%d failed, first %r)" % (len(bad), bad[:3]))
        rev1 = current_revision(chans[0])
        revs = [r for _, _, st, r in res if st == "OK"]
        distinct = set(revs)
        # Each change takes exactly one revision and every Put's answer names
        # the change that holds it.
        check(distinct == set(range(rev0 + 1, rev1 + 1)),
              "the Puts' revisions are exactly the revisions made (%d..%d; %d distinct)" %
              (rev0 + 1, rev1, len(distinct)))
        per_rev = {}
        for r in revs:
            per_rev[r] = per_rev.get(r, 0) + 1
        print("batched: %d Puts in %.1f s, %d changes, %.2f Puts per change, largest %d" %
              (len(res), dt, len(distinct), len(res) / max(1, len(distinct)), max(per_rev.values())))
        check(len(distinct) < len(res) and max(per_rev.values()) > 1,
              "concurrent Puts shared changes (%d Puts, %d changes)" % (len(res), len(distinct)))
        check(max(per_rev.values()) <= 16, "no change holds more than 16 Puts (%d)" % max(per_rev.values()))
        # Every key reads back with its value and the revision its Put got.
        kvs = range_all(chans[0], b"bw/")
        want = {k: (v, r) for k, v, st, r in res if st == "OK" and k != b"bw/hot"}
        missing = [k for k in want if k not in kvs]
        check(not missing, "every key is readable (%d missing, first %r)" % (len(missing), missing[:3]))
        wrong = [k for k in want if k in kvs and kvs[k] != want[k]]
        check(not wrong, "every key holds its value at its Put's revision (%d wrong, first %r: %r vs %r)" %
              (len(wrong), wrong[:1], kvs.get(wrong[0]) if wrong else None,
               want.get(wrong[0]) if wrong else None))
        # Puts of one key in flight together never share a change (a Txn may
        # not put one key twice); the hot key holds the value of its last.
        hot = [(v, r) for k, v, st, r in res if k == b"bw/hot" and st == "OK"]
        check(len(set(r for _, r in hot)) == len(hot),
              "Puts of one key in flight together went to different changes")
        last = max(hot, key=lambda x: x[1])
        check(kvs.get(b"bw/hot") == last, "the hot key holds its latest Put (%r vs %r)" %
              (kvs.get(b"bw/hot"), last))
        # A Put with prev_kv bypasses the batch and still answers prev_kv.
        resp = rpc(chans[0], PUT)(put_req(b"bw/k00000", b"again", prev_kv=True), timeout=10)
        prev = decode(decode(resp).get(2, [b""])[0])
        check(prev.get(5, [b""])[0] == b"v00000", "a prev_kv Put answers the previous value (%r)" % prev)
        check(header_revision(resp) == rev1 + 1, "a prev_kv Put takes the next revision")
        for ch in chans:
            ch.close()
        rc = srv.stop()
        log = srv.read_log()
        check(rc == 0, "the batching server exits 0 on SIGTERM (%r)" % rc)
        n = len(res) + 1
        check(("%d puts in %d changes" % (n - 1, len(distinct))) in log,
              "the log counts the batched Puts and their changes:\n%s" % log[-600:])
    finally:
        srv.cleanup()


def run_default(binary):
    """Flag off: one revision per Put, even with many in flight."""
    srv = Server("cairn", binary).start()
    try:
        ch = grpc.insecure_channel(srv.endpoint)
        rev0 = current_revision(ch)
        items = [(b"bd/k%04d" % i, b"v") for i in range(300)]
        res = put_many([ch], items)
        check(all(st == "OK" for _, _, st, _ in res), "every unbatched Put answered OK")
        revs = sorted(r for _, _, _, r in res)
        check(revs == list(range(rev0 + 1, rev0 + 1 + len(items))),
              "without the flag every Put has a revision of its own")
        ch.close()
        srv.stop()
        check("puts in" not in srv.read_log(), "without the flag there is no batcher")
    finally:
        srv.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    a = ap.parse_args()
    flag_checks(a.cairn)
    run_batched(a.cairn)
    run_default(a.cairn)
    sys.exit(finish())


if __name__ == "__main__":
    main()
