#!/usr/bin/python3
"""A one-sided --peer-links: n1 lists n2 and n3, n2 lists n1 and n3, n3
lists n2 only (so n1 -> n3 is named on one end). Before, n3 refused n1's
stream with a cancel, n1 took it for a lost connection and redialed at its
shortest backoff: dozens of refusals and connect/close lines a second on
both, forever. Now n3's refusal is a Goodbye naming the reason, and:

- n3 logs the refusal once (later ones at debug level), n1 logs once that
  n3 does not list it, and neither logs n1 -> n3 connects or closes again;
- n1 dials n3 at its longest backoff (2 s, jittered down to 1 s): over
  WATCH_S seconds, /metrics on n1 counts at most WATCH_S + 2 streams to n3
  (the shortest backoff would make hundreds);
- the cluster works through n2: a put on n1 is read on n3 and one on n3 on
  n1, and all three converge.

Usage: test_cluster_peer_links.py --cairn build/cairn
Needs the peer transport, --peer-links and --experimental-peer-dial (exit
77, skipped, otherwise).
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster as clusterlib  # noqa: E402
from verdict import check, failures, finish  # noqa: E402

SKIP = 77
WATCH_S = 8
CONVERGE_S = 60


def count(log, s):
    return sum(1 for ln in log.splitlines() if s in ln)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    args = ap.parse_args()
    helptext = clusterlib.help_text(args.cairn)
    if "--peer-links" not in helptext or "--experimental-peer-dial" not in helptext:
        print("SKIP: this cairn has no --peer-links or --experimental-peer-dial")
        return SKIP
    links = [(0, 1), (1, 0), (0, 2), (1, 2), (2, 1)]  # (i, j): i names j
    with clusterlib.Cluster(args.cairn, n=3, links=links, directed=True) as c:
        n1, _, n3 = c.nodes
        time.sleep(WATCH_S)
        l1, l3 = n1.read_log(), n3.read_log()
        refused = count(l3, "peer n1: refused: not in this node's --peer-links")
        told = count(l1, "peer n3: it does not list this node in its --peer-links")
        connects = c.metric(n1, 'cairn_peer_connects_total{peer="n3"} ')
        print("over %d s: n3 logged %d refusals, n1 %d 'does not list' lines, "
              "%s streams n1 -> n3, %d lines naming n3 on n1"
              % (WATCH_S, refused, told, connects, count(l1, "peer n3")))
        check(refused == 1, "n3 logs the refusal once: %d lines" % refused)
        check(told == 1, "n1 logs once that n3 does not list it: %d lines" % told)
        check(count(l1, "peer n3 ") + count(l1, "peer n3:") <= 3,
              "n1 logs n3's comings and goings at most at first: %d lines"
              % (count(l1, "peer n3 ") + count(l1, "peer n3:")))
        check(connects is not None and connects <= WATCH_S + 2,
              "n1 dials n3 at its longest backoff: %s streams in %d s" % (connects, WATCH_S))

        # the cluster works through n2, both ways
        c.put(0, b"one/sided/from1", b"1")
        c.put(2, b"one/sided/from3", b"3")
        check(c.wait_value(2, b"one/sided/from1", b"1", 20), "n1's put reaches n3 through n2")
        check(c.wait_value(0, b"one/sided/from3", b"3", 20), "n3's put reaches n1 through n2")
        ok, rep = c.converge(CONVERGE_S)
        print("converged: %s" % rep)
        check(ok, "the three converge: %s" % rep)
        if failures:
            print(clusterlib.logs(c))
    return finish("OK")


if __name__ == "__main__":
    sys.exit(main())
