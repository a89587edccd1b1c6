#!/usr/bin/python3
"""A fork made by real processes: n3's data dir copied while it was
stopped (a plain copy: no restore marker, so the copy keeps n3's actor id)
and both the copy and the original, each in its own partition, write the
same next (actor, seq): the copy's change reaches n1, the original's n2.
After the heal (README, "Forks"):

- every node that sees both detects it: /metrics counts it in
  cairn_store_forks_total, and n1's log names the author, both hashes and
  the peer the refused one came from;
- the refused change is remembered: over WATCH_S seconds after the heal no
  peer stream is reset or reconnected any more, and the peer links carry
  only a bounded number of bytes (before, each node refused the other
  fork, reset the stream, was sent it again after the reconnect, forever);
- every node keeps serving puts and gets, and the split is the documented
  one: a put on n1 (built on the copy's fork) never reaches n2, one on n2
  reaches n3 (they hold the same fork).

Usage: test_cluster_fork.py --cairn build/cairn
Needs the peer transport (exit 77, skipped, otherwise).
"""

import argparse
import os
import re
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster as clusterlib  # noqa: E402
from verdict import check, failures, finish  # noqa: E402

SKIP = 77
WATCH_S = 5
SETTLE_S = 3
# generous for a few sync rounds between three nodes at rest
QUIET_BYTES = 64 << 10


def link_bytes(c):
    return sum(s["bytes"]["a2b"]["sent"] + s["bytes"]["b2a"]["sent"]
               for s in c.link_stats().values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    args = ap.parse_args()
    if "--experimental-peer-dial" not in clusterlib.help_text(args.cairn):
        print("SKIP: this cairn has no --experimental-peer-dial")
        return SKIP
    with clusterlib.Cluster(args.cairn, n=3) as c:
        n1, n2, n3 = c.nodes
        c.put(0, b"base", b"0")
        ok, rep = c.converge(30)
        check(ok, "the three converge first: %s" % rep)

        # a copy of n3's data dir, made while n3 is stopped
        orig = n3.data_dir
        copy = orig + "-copy"
        n3.stop()
        shutil.copytree(orig, copy, symlinks=True)
        # the copy, with n1 only, writes n3's next change
        c.partition([[0, 2], [1]])
        n3.data_dir = copy
        c.restart(2)
        c.put(2, b"fork", b"copy")
        check(c.wait_value(0, b"fork", b"copy", 20), "the copy's put reaches n1")
        n3.stop()
        # the original, with n2 only, writes its own
        c.partition([[1, 2], [0]])
        n3.data_dir = orig
        c.restart(2)
        c.put(2, b"fork", b"orig")
        check(c.wait_value(1, b"fork", b"orig", 20), "the original's put reaches n2")

        c.heal()
        time.sleep(SETTLE_S)
        forks = {n.name: (c.metric(n, "cairn_store_forks_total ") or 0) for n in c.nodes}
        print("forks counted: %s" % forks)
        for n in c.nodes:
            check(forks[n.name] >= 1, "%s counts the fork: %s" % (n.name, forks[n.name]))
        hexre = r"[0-9a-f]{64}"
        line = re.search(r"peer (n2|n3): fork: author [0-9a-f]{32} made two changes with seq \d+: "
                         r"%s \(from this peer, refused\) and %s \(held here, kept\)"
                         % (hexre, hexre), n1.read_log())
        check(line is not None, "n1 logs the fork with both hashes and the peer")
        if line:
            print("n1: %s" % line.group(0))

        # at rest: no more resets, reconnects or resends
        c0 = {n.name: c.metric(n, "cairn_peer_connects_total") for n in c.nodes}
        b0 = link_bytes(c)
        r0 = sum(n.read_log().count("a change the document refuses") for n in c.nodes)
        time.sleep(WATCH_S)
        c1 = {n.name: c.metric(n, "cairn_peer_connects_total") for n in c.nodes}
        b1 = link_bytes(c)
        r1 = sum(n.read_log().count("a change the document refuses") for n in c.nodes)
        print("over %d s at rest: %d bytes on the peer links, connects %s -> %s, "
              "refusal resets %d -> %d" % (WATCH_S, b1 - b0, c0, c1, r0, r1))
        check(c1 == c0, "no stream is reconnected at rest: %s -> %s" % (c0, c1))
        check(r1 == r0, "no stream is reset for the fork again: %d -> %d" % (r0, r1))
        check(b1 - b0 <= QUIET_BYTES, "the peer links are quiet: %d bytes in %d s"
              % (b1 - b0, WATCH_S))

        # every node serves; the split is the documented one
        for i in range(3):
            c.put(i, b"after/%d" % i, b"x")
            check(c.get(i, b"after/%d" % i) == b"x", "n%d serves after the fork" % (i + 1))
        check(c.wait_value(2, b"after/1", b"x", 20), "n2's put reaches n3 (same fork)")
        time.sleep(2)
        check(c.get(1, b"after/0") is None,
              "n1's put, built on the other fork, does not reach n2 (README: no convergence)")
        if failures:
            print(clusterlib.logs(c))
        shutil.rmtree(copy, ignore_errors=True)
    return finish("OK")


if __name__ == "__main__":
    sys.exit(main())
