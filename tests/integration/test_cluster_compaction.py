#!/usr/bin/python3
"""Compaction against sync between real cairn nodes (issue 16, "Leases,
compaction and hashes across nodes"), on cluster.py's harness.

Compaction is per node (revisions are local) and removes history records,
never the change bodies that sync sends (store.h): a node that compacted
everything still hands a peer that is behind every change it lacks.

1. n3 cut off; n1 and n2 write (puts, overwrites, deletes) and compact at
   their current revision with physical (the Compact RPC), n3 writes and
   compacts too; heal: every node ends with equal heads, key space,
   KeyValue value/lease and HashKV, and a read below a node's own
   compaction is refused as compacted on that node.
2. n3 cut off again; n1 writes and compacts; n2 stopped (SIGTERM) so that
   only n1 holds the changes n3 lacks; n1 restarted (it reopens from its
   checkpoint after a compaction); heal: n3 catches up from n1 alone; then
   n2 restarts and all three converge.
Every node's watcher got each of its node's revisions once, in order, no
gap. Bounded (about 40 s); needs the peer transport (exit 77 otherwise).

Usage: test_cluster_compaction.py --cairn build/cairn
"""

import argparse
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster as clusterlib  # noqa: E402
from system_python import grpc  # noqa: E402
from verdict import check, failures  # noqa: E402

SKIP = 77
CONVERGE_S = 30.0
KEYS = 20


def compact(c, n, rev):
    c._unary(n, "/etcdserverpb.KV/Compact",
             c.msgs["etcdserverpb.CompactionRequest"](revision=rev, physical=True),
             "etcdserverpb.CompactionResponse", timeout=20)


def get_at(c, n, key, rev):
    """Range of |key| at revision |rev|: the gRPC status code (OK or not)."""
    try:
        c._unary(n, "/etcdserverpb.KV/Range",
                 c.msgs["etcdserverpb.RangeRequest"](key=key, revision=rev),
                 "etcdserverpb.RangeResponse")
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def hashkv(c, n):
    r = c._unary(n, "/etcdserverpb.Maintenance/HashKV", c.msgs["etcdserverpb.HashKVRequest"](),
                 "etcdserverpb.HashKVResponse")
    return r.hash


def write(c, n, tag, count):
    """|count| writes on node n over KEYS shared keys: puts, and every
    fifth a delete."""
    for i in range(count):
        k = b"c/%02d" % (i % KEYS)
        if i % 5 == 4:
            c.delete(n, k)
        else:
            c.put(n, k, b"%s-%d" % (tag.encode(), i))


def check_equal_state(c, what):
    ok, report = c.converge(CONVERGE_S)
    print("%s: %s" % (what, report))
    check(ok, "%s: every live node converges: %s" % (what, report))
    live = [n for n in c.nodes if n.proc is not None]
    fields = {n.name: {k: (v, lease) for k, (v, lease, _ver) in c.range_kvs(n).items()}
              for n in live}
    check(all(f == fields[live[0].name] for f in fields.values()),
          "%s: equal key, value and lease of every KeyValue" % what)
    versions = {n.name: {k: ver for k, (_v, _l, ver) in c.range_kvs(n).items()} for n in live}
    differ = sorted(k for k in versions[live[0].name]
                    if len({v.get(k) for v in versions.values()}) > 1)
    print("%s: %d of %d keys have a version that differs between nodes (local, like "
          "revisions)" % (what, len(differ), len(versions[live[0].name])))
    hashes = {n.name: hashkv(c, n) for n in live}
    check(len(set(hashes.values())) == 1, "%s: equal HashKV: %s" % (what, hashes))
    return ok


def compact_then_heal(c):
    n1, n2, n3 = c.nodes
    c.partition([[0, 1], [2]])
    write(c, n3, "n3", 40)          # first: n1's and n2's later writes win on n3
    write(c, n1, "n1", 120)
    write(c, n2, "n2", 80)
    ok, _ = wait_same(c, [n1, n2])
    check(ok, "compact: n1 and n2 converge beside the cut-off n3")
    for n in c.nodes:
        rev = c.range_all(n)[0]
        compact(c, n, rev)
        check(get_at(c, n, b"c/00", rev - 1) == grpc.StatusCode.OUT_OF_RANGE,
              "compact: %s refuses a read below its compaction (%d) as compacted"
              % (n.name, rev))
    c.heal()
    check_equal_state(c, "compact: after the heal")


def restart_after_compaction(c):
    n1, n2, n3 = c.nodes
    c.partition([[0, 1], [2]])
    write(c, n1, "again", 100)
    ok, _ = wait_same(c, [n1, n2])
    check(ok, "restart: n1 and n2 converge beside the cut-off n3")
    for n in (n1, n2):
        compact(c, n, c.range_all(n)[0])
    n2.stop()                        # only n1 holds what n3 lacks
    c.restart(n1)                    # reopens after a compaction
    c.heal()
    check_equal_state(c, "restart: n3 catches up from the restarted n1 alone")
    c.restart(n2)
    check_equal_state(c, "restart: n2 back")


def wait_same(c, nodes, timeout=CONVERGE_S):
    deadline = time.monotonic() + timeout
    while True:
        try:
            hs = [c.heads(n) for n in nodes]
            if all(h == hs[0] for h in hs):
                return True, hs[0]
        except grpc.RpcError:
            pass
        if time.monotonic() >= deadline:
            return False, None
        time.sleep(0.1)


def run(args):
    caps = clusterlib.capabilities(args.cairn)
    if not caps["peer_dial"]:
        print("SKIP: %s --help lists no --experimental-peer-dial" % args.cairn)
        return SKIP
    with clusterlib.Cluster(args.cairn, 3, sync_interval_ms=100) as c:
        try:
            c.watch_all()
            compact_then_heal(c)
            restart_after_compaction(c)
            for name, probs in c.check_watches().items():
                for p in probs:
                    check(False, "watch on %s: %s" % (name, p))
        except BaseException:
            print(clusterlib.logs(c))
            raise
        if failures:
            print(clusterlib.logs(c))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cairn", default=os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                    "build", "cairn"))
    ap.add_argument("--hard-timeout", type=float, default=150)
    args = ap.parse_args()

    def on_alarm(_sig, _frm):
        print("FAIL: hard timeout of %.0f s" % args.hard_timeout, flush=True)
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda *_: on_alarm(None, None))
    signal.alarm(int(args.hard_timeout))
    t0 = time.monotonic()
    try:
        rc = run(args)
    except KeyboardInterrupt:
        rc = 1
    except (AssertionError, RuntimeError, grpc.RpcError) as e:
        check(False, "%s: %s" % (type(e).__name__, e))
        rc = 1
    if rc != SKIP:
        print("test_cluster_compaction: %d failures in %.1f s"
              % (len(failures), time.monotonic() - t0))
    return rc


if __name__ == "__main__":
    sys.exit(main())
