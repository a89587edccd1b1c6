#!/usr/bin/python3
"""Membership changes on a running three-node cairn cluster (issue 12), on
cluster.py's harness (a netproxy on every peer link), with a writer on
every node the whole time:

1. MemberList on every node names the same three members (ids, names, peer
   URLs, and the client URLs each member published itself).
2. MemberAdd of a learner on n1 (a peer URL nothing listens on) reaches n2
   and n3 as a learner and their peer transports take it on ("added to the
   cluster"); MemberRemove of it on n2 takes it off every node's list.
3. MemberUpdate on n1 re-addresses n3: its peer URLs become a new netproxy
   in front of n3's peer port; every node lists the new URL, n1 and n2
   dial n3 there, and once the old links refuse, a put on n1 reaches n3
   through the new address.
4. MemberRemove of n3 on n1, under write load: n3 logs etcd's "the member
   has been permanently removed from the cluster" and exits by itself; n1
   and n2 list two members, stop syncing with n3 and end with equal key
   spaces holding every write they acknowledged.

5. --initial-cluster-state existing with a new data dir and no other
   member to ask is refused with etcd's message, exit code 1 (joining
   itself: test_cluster_join.py).

Bounded: about a minute.

Usage: test_cluster_members.py --cairn build/cairn
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cluster as clusterlib  # noqa: E402
import cluster_checks  # noqa: E402
import netproxy  # noqa: E402
from cluster_checks import (SKIP, call, log_has, main, members,  # noqa: E402
                            same_lists, wait_for)
from verdict import check, failures  # noqa: E402

BOUND = 20.0   # s: a membership change reaching every node, on a loaded machine


class Writers:
    """One writer per node, distinct keys; remembers every acknowledged put."""

    def __init__(self, c, nodes):
        self.c = c
        self.stop = threading.Event()
        self.acked = {n: {} for n in nodes}
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in nodes]
        for t in self.threads:
            t.start()

    def run(self, n):
        i = 0
        while not self.stop.is_set():
            k = b"w/%d/%06d" % (n, i)
            try:
                self.c.put(n, k, b"v%d" % i)
                self.acked[n][k] = b"v%d" % i
            except Exception:  # the node went away (n3 removed): stop writing there
                if self.stop.wait(0.2):
                    return
            i += 1
            time.sleep(0.02)

    def halt(self):
        self.stop.set()
        for t in self.threads:
            t.join(10)


def scenario(c):
    w = Writers(c, [0, 1, 2])
    try:
        # 1. the same three members everywhere, client URLs published
        ok = wait_for(lambda: same_lists(c, [0, 1, 2])[0] and
                      all(m[3] for m in members(c, 0)), BOUND)
        ls = same_lists(c, [0, 1, 2])[1]
        check(ok, "MemberList agrees on all three nodes with client URLs: %s" % ls)
        check(len(ls[0]) == 3 and sorted(m[1] for m in ls[0]) == ["n1", "n2", "n3"],
              "three members named n1 n2 n3: %s" % ls[0])
        ids = {m[1]: m[0] for m in ls[0]}

        # 2. a learner added on n1, removed on n2
        spare = netproxy.Proxy(("127.0.0.1", 9), lifetime=120, name="spare")
        lurl = "http://127.0.0.1:%d" % spare.port
        spare.close()    # nothing listens there now
        r = call(c, 0, "MemberAdd", peerURLs=[lurl], isLearner=True)
        lid = r.member.ID
        check(r.member.isLearner and not r.member.name, "MemberAdd answers the learner: %s" % r)
        ok = wait_for(lambda: all(any(m[0] == lid and m[4] for m in members(c, n))
                                  for n in (0, 1, 2)), BOUND)
        check(ok, "the learner is listed as one on every node")
        ok = wait_for(lambda: all(log_has(c.nodes[n], "added to the cluster") for n in (0, 1, 2)),
                      BOUND)
        check(ok, "every node's peer transport took the learner on")
        call(c, 1, "MemberRemove", ID=lid)
        ok = wait_for(lambda: all(not any(m[0] == lid for m in members(c, n))
                                  for n in (0, 1, 2)), BOUND)
        check(ok, "the learner is gone from every node's list")

        # 3. n3 re-addressed through a new proxy
        front = netproxy.Proxy(("127.0.0.1", c.nodes[2].peer_port), lifetime=120, name="n3-new")
        nurl = "http://127.0.0.1:%d" % front.port
        call(c, 0, "MemberUpdate", ID=ids["n3"], peerURLs=[nurl])
        ok = wait_for(lambda: all(any(m[0] == ids["n3"] and m[2] == (nurl,)
                                      for m in members(c, n)) for n in (0, 1, 2)), BOUND)
        check(ok, "every node lists n3 at its new peer URL")
        ok = wait_for(lambda: log_has(c.nodes[0], "dialing " + nurl) and
                      log_has(c.nodes[1], "dialing " + nurl), BOUND)
        check(ok, "n1 and n2 dial n3 at the new URL")
        # the old ways to and from n3 refuse (and reset what they carry): the
        # only link left is n1/n2 dialing n3 at its new URL
        for a, b in ((0, 2), (1, 2), (2, 0), (2, 1)):
            c.link(a, b).refuse(True)
        ok = wait_for(lambda: front.accepted > 0, BOUND)
        check(ok, "the new proxy in front of n3 was dialed (%d connections)" % front.accepted)
        c.put(0, b"after-update", b"1")
        ok = wait_for(lambda: c.get(2, b"after-update") is not None, BOUND)
        check(ok, "a put on n1 reaches n3 through its new address")
        for a, b in ((2, 0), (2, 1)):   # n3's own dials are legitimate again
            c.link(a, b).refuse(False)

        # 4. n3 removed under load: it exits by itself
        time.sleep(1.0)
        call(c, 0, "MemberRemove", ID=ids["n3"])
        n3 = c.nodes[2]
        ok = wait_for(lambda: n3.proc.poll() is not None, BOUND)
        check(ok, "n3 exited after its removal (rc %s)" % n3.proc.poll())
        check(log_has(n3, "the member has been permanently removed from the cluster"),
              "n3 logged etcd's removed-member line")
        ok = wait_for(lambda: same_lists(c, [0, 1])[0] and len(members(c, 0)) == 2, BOUND)
        check(ok, "n1 and n2 list two members: %s" % same_lists(c, [0, 1])[1])
        ok = wait_for(lambda: log_has(c.nodes[1], "n3 (%016x): removed from the cluster"
                                      % ids["n3"]), BOUND)
        check(ok, "n2's transport dropped n3")
        time.sleep(1.0)
    finally:
        w.halt()
    # n1 and n2 end with equal key spaces holding every write they acked
    ok = wait_for(lambda: c.range_all(0)[1] == c.range_all(1)[1], BOUND)
    check(ok, "n1 and n2 converge after n3's removal")
    space = c.range_all(0)[1]
    for n in (0, 1):
        lost = [k for k, v in w.acked[n].items() if space.get(k) != v]
        check(not lost, "every write acknowledged by n%d is on n1 (%d missing)" % (n + 1, len(lost)))
    # n3 is no longer synced with: no stream to it
    check(not log_has(c.nodes[0], "peer n3 (%016x): connected" % ids["n3"],
                      after="n3 (%016x): removed from the cluster" % ids["n3"]),
          "n1 never reconnected to n3 after its removal")



def join_refused(binary):
    """--initial-cluster-state existing on a new data dir with no other
    member in --initial-cluster: nobody to join, etcd's message and exit
    code 1, nothing made in the data dir's store."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        dd = os.path.join(d, "data")
        r = subprocess.run([binary, "--name", "n4", "--data-dir", dd,
                            "--initial-cluster-state", "existing",
                            "--listen-client-urls", "http://127.0.0.1:0",
                            "--initial-cluster", "n4=http://127.0.0.1:1"],
                           capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
        check(r.returncode == 1 and b"cannot fetch cluster info from peer urls" in r.stderr,
              "a new data dir with --initial-cluster-state existing and nobody to ask is "
              "refused (%d, %r)"
              % (r.returncode, r.stderr[-300:]))
        check(not os.path.exists(os.path.join(dd, "db")), "and no store was made")

def run(binary, scenarios):
    """The scenario on a fresh cluster (no watchers: n3 leaves for good)."""
    if not clusterlib.capabilities(binary)["peer_dial"]:
        print("SKIP: %s --help lists no --experimental-peer-dial" % binary)
        return SKIP
    join_refused(binary)
    with clusterlib.Cluster(binary, 3, sync_interval_ms=100) as c:
        try:
            for s in scenarios:
                s(c)
        except BaseException:
            print(clusterlib.logs(c))
            raise
        if failures:
            print(clusterlib.logs(c))
    return 1 if failures else 0


if __name__ == "__main__":
    cluster_checks.run_cluster = run  # main() runs the scenarios through it
    sys.exit(main("test_cluster_members", __doc__, [scenario], hard_timeout=110))
