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
   n2 restarts and all three converge. n2's stop is a clean departure: it
   says goodbye, n1 logs that n2 left (not a broken stream) and connects
   to it again once it is back.
Every node's watcher got each of its node's revisions once, in order, no
gap. Bounded (about 40 s); needs the peer transport (exit 77 otherwise).

Usage: test_cluster_compaction.py --cairn build/cairn
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster_checks import check_equal_state, log_has, main, wait_for  # noqa: E402
from system_python import grpc  # noqa: E402
from verdict import check  # noqa: E402

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


def write(c, n, tag, count):
    """|count| writes on node n over KEYS shared keys: puts, and every
    fifth a delete."""
    for i in range(count):
        k = b"c/%02d" % (i % KEYS)
        if i % 5 == 4:
            c.delete(n, k)
        else:
            c.put(n, k, b"%s-%d" % (tag.encode(), i))


def compact_then_heal(c):
    n1, n2, n3 = c.nodes
    c.partition([[0, 1], [2]])
    write(c, n3, "n3", 40)          # first: n1's and n2's later writes win on n3
    write(c, n1, "n1", 120)
    write(c, n2, "n2", 80)
    check(wait_for(lambda: same_heads(c, [n1, n2]), 30),
          "compact: n1 and n2 converge beside the cut-off n3")
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
    check(wait_for(lambda: same_heads(c, [n1, n2]), 30),
          "restart: n1 and n2 converge beside the cut-off n3")
    for n in (n1, n2):
        compact(c, n, c.range_all(n)[0])
    n2.stop()                        # only n1 holds what n3 lacks
    # server/peer: a stopping node says goodbye; its peer logs a departure
    check(wait_for(lambda: log_has(
        n1, "peer n2: stream closed: the peer left (goodbye: shutting down)"), 5),
          "restart: n1 logs n2's stop as a clean departure (a Goodbye)")
    check(wait_for(lambda: log_has(n2, "peer n1: stream closed: shutting down (said goodbye)"), 5),
          "restart: n2 logs that it said goodbye to n1")
    c.restart(n1)                    # reopens after a compaction
    c.heal()
    check_equal_state(c, "restart: n3 catches up from the restarted n1 alone")
    c.restart(n2)
    check_equal_state(c, "restart: n2 back")
    check(wait_for(lambda: log_has(n1, "peer n2 (", after="the peer left"), 5),
          "restart: n1 connects to n2 again after its departure")


def same_heads(c, nodes):
    hs = [c.heads(n) for n in nodes]
    return all(h == hs[0] for h in hs)


if __name__ == "__main__":
    sys.exit(main("test_cluster_compaction", __doc__,
                  [compact_then_heal, restart_after_compaction]))
