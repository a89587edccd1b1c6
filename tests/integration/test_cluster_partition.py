#!/usr/bin/python3
"""Real etcdctl (ETCDCTL_API=3) against a cairn cluster cut in two, and the
etcd recipes that keep their guarantee only within one node (README, "What
differs from etcd"). N cairn processes (default 3) on cluster.py's harness,
partitioned {n1} | {n2..nN} through the link proxies.

During the partition, against n1 and against n2 (one node of each side):
- put, get, txn (stdin), watch (the event of a later put arrives), lease
  grant, put --lease, lease keep-alive --once, lease timetolive, and
  `etcdctl lock L -- echo` all work; a put on n1 is not on n2 (the cut is
  real).
The recipes, measured:
- compare-and-swap (create-if-absent: ver(key) = "0", then put) run at once
  through n1 and through n2 succeeds on both; two run at once through one
  node (n2): exactly one succeeds.
- `etcdctl lock L` through n1 and through n2: both hold it at once; two
  through one node: the second waits until the first lets go.
- `etcdctl elect E` through n1 and through n2: both are leader at once; two
  through one node: the second waits until the first resigns.
After the heal (every node converged: equal heads and key space):
- a key written by a create-if-absent on each side resolves on every node to
  the write made later in wall-clock time (the documented rule: greater op
  id, a hybrid logical clock); the key run "at once" has the same value on
  every node, one of the two; a create-if-absent on any node now fails.
- both lock holders and both leaders are still running (nobody told them),
  both keys are under the lock's and the election's prefix on every node,
  a new `etcdctl lock L` on n3 waits, and an observer (`elect -l`) on n1 names n1's candidate while one on n2
  names n2's: each node orders the contenders by its own create revisions,
  and the one it saw first came from its own side.

Usage: test_cluster_partition.py --cairn build/cairn [--nodes N]
Needs the peer transport (exit 77, skipped, otherwise).
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster as clusterlib  # noqa: E402
from test_lock_elect import Ctl, Fail  # noqa: E402
from verdict import check, failures, finish  # noqa: E402

SKIP = 77
WAIT = 15.0        # seconds for something that must happen
QUIET = 3.0        # seconds something must not happen in
CONVERGE_S = 60
HARD_TIMEOUT = 170


def ctl(node, *args, stdin=None, check_rc=True):
    """etcdctl against |node| (a cluster.Node, procs.Server's etcdctl)."""
    return node.etcdctl(*args, stdin=stdin, check=check_rc)


def out(r):
    return r.stdout.decode("utf-8", "replace")


def create_if_absent(node, key, value):
    """A compare-and-swap Txn: put key=value if the key has no version."""
    r = ctl(node, "txn", stdin=('ver("%s") = "0"\n\nput %s %s\n\n\n' % (key, key, value))
            .encode())
    return out(r).split("\n")[0]


def at_once(fns):
    """Runs the callables in threads started together; their results."""
    res = [None] * len(fns)
    go = threading.Event()

    def run(i):
        go.wait()
        try:
            res[i] = fns[i]()
        except Exception as e:  # noqa: BLE001  reported by the caller
            res[i] = e
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    go.set()
    for t in ts:
        t.join(60)
    return res


def revision(node):
    return int(json.loads(out(ctl(node, "get", "x", "-w", "json")))["header"]["revision"])


def side_works(node, tag):
    """put, get, txn, watch, lease and lock through etcdctl on |node|."""
    k = "side/%s" % tag
    check(out(ctl(node, "put", k, "v1")).strip() == "OK", "%s: put" % tag)
    check(out(ctl(node, "get", k, "--print-value-only")).strip() == "v1", "%s: get" % tag)
    txn = out(ctl(node, "txn", stdin=('value("%s") = "v1"\n\nput %s v2\n\nput %s never\n\n'
                                      % (k, k, k)).encode()))
    check(txn.split("\n")[0] == "SUCCESS" and
          out(ctl(node, "get", k, "--print-value-only")).strip() == "v2", "%s: txn" % tag)
    # watch from the next revision, so the event arrives however soon the
    # watch registers
    w = Ctl(node, "watch", "--rev=%d" % (revision(node) + 1), k)
    try:
        time.sleep(0.3)
        ctl(node, "put", k, "v3")
        w.wait_lines(3, WAIT)
        check(w.text()[:3] == ["PUT", k, "v3"], "%s: watch event %r" % (tag, w.text()))
    except Fail as e:
        check(False, "%s: watch: %s" % (tag, e))
    finally:
        w.stop()
    g = out(ctl(node, "lease", "grant", "60"))
    lid = g.split()[1] if g.startswith("lease ") else None
    check(lid is not None, "%s: lease grant: %r" % (tag, g))
    if lid:
        ctl(node, "put", "--lease=" + lid, k + "/leased", "x")
        ka = out(ctl(node, "lease", "keep-alive", "--once", lid))
        check("keepalived with TTL" in ka, "%s: lease keep-alive --once: %r" % (tag, ka))
        ttl = out(ctl(node, "lease", "timetolive", "--keys", lid))
        check("granted with TTL(60s)" in ttl and (k + "/leased") in ttl,
              "%s: lease timetolive: %r" % (tag, ttl))
    lk = out(ctl(node, "lock", "side-lock", "--", "echo", "held-" + tag))
    check("held-" + tag in lk, "%s: lock -- echo: %r" % (tag, lk))


def quiet(proc, seconds):
    """True if |proc| printed nothing within |seconds|."""
    try:
        proc.wait_lines(1, seconds)
        return False
    except Fail:
        return True


def two_holders(a, b, procs, cmd, name, tag):
    """`etcdctl <cmd> name ...` through |a| and |b| at once: do both get it?"""
    extra = {"lock": [], "elect": ["p-" + a.name]}
    pa = Ctl(a, cmd, name, *extra[cmd])
    extra["elect"] = ["p-" + b.name]
    pb = Ctl(b, cmd, name, *extra[cmd])
    procs += [pa, pb]
    try:
        pa.wait_lines(1, WAIT)
        pb.wait_lines(1, WAIT)
        got = True
    except Fail as e:
        print("%s: %s" % (tag, e))
        got = False
    return got, pa, pb


def one_node_waits(node, procs, cmd, name, tag):
    """Two `etcdctl <cmd> name` through one node: the second waits for the
    first to let go."""
    args1 = [cmd, name] + (["p1"] if cmd == "elect" else [])
    args2 = [cmd, name] + (["p2"] if cmd == "elect" else [])
    p1 = Ctl(node, *args1)
    procs.append(p1)
    try:
        p1.wait_lines(1, WAIT)
    except Fail as e:
        check(False, "%s: the first gets it: %s" % (tag, e))
        return
    p2 = Ctl(node, *args2)
    procs.append(p2)
    check(quiet(p2, QUIET), "%s: the second waits while the first holds (printed %r)"
          % (tag, p2.text()))
    p1.signal(signal.SIGTERM)
    try:
        p1.wait_exit(WAIT)
        p2.wait_lines(1, WAIT)
    except Fail as e:
        check(False, "%s: the second gets it once the first let go: %s" % (tag, e))
    p2.signal(signal.SIGTERM)


def keys_under(node, prefix):
    r = ctl(node, "get", prefix + "/", "--prefix", "--keys-only")
    return sorted(l for l in out(r).split("\n") if l)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--nodes", type=int, default=3)
    args = ap.parse_args()
    if "--experimental-peer-dial" not in clusterlib.help_text(args.cairn):
        print("SKIP: this cairn has no --experimental-peer-dial (no peer transport)")
        return SKIP

    def on_alarm(_sig, _frm):
        raise SystemExit("FAIL: hard timeout of %ds reached" % HARD_TIMEOUT)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(HARD_TIMEOUT)
    procs = []
    with clusterlib.Cluster(args.cairn, args.nodes) as c:
        try:
            run(c, procs)
        finally:
            for p in procs:
                p.stop()
            if failures:
                print(clusterlib.logs(c))
    signal.alarm(0)
    return finish("OK")


def run(c, procs):
    n = len(c.nodes)
    a, b = c.nodes[0], c.nodes[1]
    ctl(a, "put", "before", "cut")
    ok, rep = c.converge(CONVERGE_S)
    check(ok, "converged before the cut: %s" % rep)
    c.partition([[0], list(range(1, n))])
    t_cut = time.monotonic()
    ctl(a, "put", "cut/probe", "n1")
    time.sleep(1.0)
    check(out(ctl(b, "get", "cut/probe")) == "", "the cut is real: n1's put is not on n2")

    # ---- etcdctl works on each side
    side_works(a, "n1")
    side_works(b, "n2")

    # ---- compare-and-swap
    res = at_once([lambda: create_if_absent(a, "cas/once", "from-n1"),
                   lambda: create_if_absent(b, "cas/once", "from-n2")])
    print("create-if-absent at once through n1 and n2 (cut): %s" % res)
    check(res == ["SUCCESS", "SUCCESS"],
          "create-if-absent through two nodes of a cut cluster succeeds on both: %s" % res)
    res = at_once([lambda: create_if_absent(b, "cas/one", "first"),
                   lambda: create_if_absent(b, "cas/one", "second")])
    print("create-if-absent at once twice through n2: %s" % sorted(res))
    check(sorted(res) == ["FAILURE", "SUCCESS"],
          "create-if-absent twice at once through one node: one winner: %s" % res)
    # one side first, the other later in wall-clock time
    check(create_if_absent(a, "cas/later", "from-n1") == "SUCCESS", "cas/later on n1")
    time.sleep(0.5)
    check(create_if_absent(b, "cas/later", "from-n2") == "SUCCESS", "cas/later on n2")

    # ---- lock and elect through two nodes, then through one
    got, la, lb = two_holders(a, b, procs, "lock", "L", "lock")
    print("etcdctl lock L through n1 and n2 (cut): %s" % ("two holders" if got else "one"))
    check(got, "lock through two nodes of a cut cluster: two holders")
    got, ea, eb = two_holders(a, b, procs, "elect", "E", "elect")
    print("etcdctl elect E through n1 and n2 (cut): %s" % ("two leaders" if got else "one"))
    check(got, "elect through two nodes of a cut cluster: two leaders")
    one_node_waits(b, procs, "lock", "L1", "lock through one node")
    one_node_waits(b, procs, "elect", "E1", "elect through one node")
    print("partition: %.1f s of etcdctl on both sides" % (time.monotonic() - t_cut))

    # ---- heal
    c.heal()
    ok, rep = c.converge(CONVERGE_S)
    print("after the heal: %s" % rep)
    check(ok, "converged after the heal: %s" % rep)
    for node in c.nodes:
        later = out(ctl(node, "get", "cas/later", "--print-value-only")).strip()
        check(later == "from-n2", "%s: cas/later resolves to the later write (from-n2): %r"
              % (node.name, later))
    once = [out(ctl(node, "get", "cas/once", "--print-value-only")).strip() for node in c.nodes]
    print("cas/once after the heal: %s" % once)
    check(once[0] in ("from-n1", "from-n2") and all(v == once[0] for v in once),
          "cas/once has one of the two values, the same on every node: %s" % once)
    for node in c.nodes:
        check(create_if_absent(node, "cas/later", "again") == "FAILURE",
              "%s: create-if-absent fails once the key exists" % node.name)
    for p, what in ((la, "lock holder via n1"), (lb, "lock holder via n2"),
                    (ea, "leader via n1"), (eb, "leader via n2")):
        check(p.proc.poll() is None, "%s still running after the heal" % what)
    for node in c.nodes:
        check(len(keys_under(node, "L")) == 2, "%s: both lock keys under L/: %r"
              % (node.name, keys_under(node, "L")))
        check(len(keys_under(node, "E")) == 2, "%s: both candidates under E/: %r"
              % (node.name, keys_under(node, "E")))
    w = Ctl(c.nodes[-1], "lock", "L")
    procs.append(w)
    check(quiet(w, QUIET), "after the heal a new waiter for L on %s waits (printed %r)"
          % (c.nodes[-1].name, w.text()))
    w.stop()
    seen = {}
    for node in (a, b):
        o = Ctl(node, "elect", "-l", "E")
        procs.append(o)
        try:
            o.wait_lines(2, WAIT)
            seen[node.name] = o.text()[1]
        except Fail as e:
            check(False, "observer on %s: %s" % (node.name, e))
        o.stop()
    print("after the heal, elect -l E: %s" % seen)
    check(seen.get(a.name) == "p-" + a.name and seen.get(b.name) == "p-" + b.name,
          "after the heal each node names the leader from its own side: %s" % seen)


if __name__ == "__main__":
    sys.exit(main())
