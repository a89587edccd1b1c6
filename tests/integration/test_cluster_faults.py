#!/usr/bin/python3
"""Multi-node cairn under link faults (issue 16, "Tests with real
processes"), on the harness of cluster.py: N cairn processes with a
netproxy on every directed peer link.

Default (the bounded CI form, about a minute): 3 nodes, a client writing
on every node at once (puts, deletes, txns), a random fault schedule drawn
from a fixed seed (printed; --seed to replay): partitions of every shape,
one-way cuts, delay and jitter, a bandwidth cap, resets and drops, and a
kill -9 and restart of one node; then the final heal, and within a bounded
time:
- convergence: every node has equal heads (when the server tells them
  through cairnpb.Replication/Heads), an equal key space (keys and values)
  and equal HashKV;
- no acknowledged write lost (conservative, since concurrent writes on two
  nodes resolve by the greater op id, which a client cannot see): the final
  value of each key is one of the values written to it (acknowledged, or
  unanswered when a node died under the call), and a key with an
  acknowledged put is absent only if a delete of it was sent;
- every node's watcher (on the whole key space from revision 1, resumed
  after the restart) got every event of that node exactly once, in
  revision order, with no gap, and the events replay to the node's Range;
- after convergence, one new key per node reaches every node.
Needs the peer transport: when `cairn --help` lists no
--experimental-peer-dial the run is skipped (exit 77, ctest's
SKIP_RETURN_CODE) and says why.

--soak SECONDS: the same, with the schedule running SECONDS (e.g. 600),
--nodes 5 for five nodes.

--harness: checks the harness itself, and runs on today's single-node
cairn too: three nodes cut apart from the start (every proxy refuses), the
client helpers and their answers, the partition wiring of the proxies,
watchers across a kill -9 and restart with no gap, converge() reporting the
keys that differ and agreeing on equal key spaces, and close() killing
every process. With the transport present it also heals and converges.
"""

import argparse
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster as clusterlib  # noqa: E402
from system_python import grpc  # noqa: E402
from verdict import check, failures  # noqa: E402

SKIP = 77
KEYS = 24
CONVERGE_TIMEOUT = 60.0


def hashkv(c, n):
    m = c.msgs
    r = c._unary(n, "/etcdserverpb.Maintenance/HashKV", m["etcdserverpb.HashKVRequest"](),
                 "etcdserverpb.HashKVResponse")
    return r.hash


# --------------------------------------------------------------------------
# Clients

class Ledger:
    """What the clients wrote, per key: values put and deletes sent, each
    acknowledged or unanswered (the node died under the call)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.puts = {}       # key -> {value: "acked"|"maybe"}
        self.deletes = {}    # key -> {"acked": n, "maybe": n}
        self.counts = {"acked": 0, "maybe": 0, "refused": 0}

    def put(self, key, value, how):
        with self.lock:
            self.puts.setdefault(key, {})[value] = how

    def delete(self, key, how):
        with self.lock:
            d = self.deletes.setdefault(key, {"acked": 0, "maybe": 0})
            d[how] += 1

    def count(self, how):
        with self.lock:
            self.counts[how] += 1

    def verify(self, space):
        """Problems of the final key space against what was written."""
        probs = []
        keys = set(self.puts) | set(self.deletes) | set(space)
        for k in sorted(keys):
            puts = self.puts.get(k, {})
            dels = self.deletes.get(k, {"acked": 0, "maybe": 0})
            if k in space:
                if space[k] not in puts:
                    probs.append("%r = %r, a value no client wrote to it" % (k, space[k]))
            elif "acked" in puts.values() and not (dels["acked"] or dels["maybe"]):
                probs.append("%r is absent, but puts of it were acknowledged (%d) and no "
                             "delete was sent: an acknowledged write is lost"
                             % (k, list(puts.values()).count("acked")))
        return probs


class Writer(threading.Thread):
    """One client on one node: puts, deletes and txns on a small key set, as
    fast as the node answers; errors (a killed node) are recorded as
    unanswered and retried after a pause."""

    def __init__(self, c, node, rng, ledger, stop):
        super().__init__(name="writer-" + node.name, daemon=True)
        self.c, self.node, self.rng, self.ledger, self.stop = c, node, rng, ledger, stop
        self.ops = 0

    def run(self):
        rng, L, name = self.rng, self.ledger, self.node.name.encode()
        seq = 0
        while not self.stop.is_set():
            seq += 1
            k1 = b"k%02d" % rng.randrange(KEYS)
            k2 = b"k%02d" % rng.randrange(KEYS)
            v = b"%s-%d" % (name, seq)
            r = rng.random()
            try:
                if r < 0.55:
                    kind = "put"
                    self.c.put(self.node, k1, v)
                    L.put(k1, v, "acked")
                elif r < 0.75:
                    kind = "delete"
                    self.c.delete(self.node, k1)
                    L.delete(k1, "acked")
                else:
                    kind = "txn"
                    resp = self.c.txn(self.node, [(k1, "version", ">", 0)],
                                      [("put", k1, v), ("delete", k2)],
                                      [("put", k1, v), ("put", k2, v + b"'")])
                    L.put(k1, v, "acked")
                    if resp.succeeded:
                        L.delete(k2, "acked")
                    else:
                        L.put(k2, v + b"'", "acked")
                L.count("acked")
                self.ops += 1
            except grpc.RpcError as e:
                if isinstance(e, clusterlib.NodeDown):
                    L.count("refused")      # never sent
                else:
                    L.count("maybe")
                    if kind == "put":
                        L.put(k1, v, "maybe")
                    elif kind == "delete":
                        L.delete(k1, "maybe")
                    else:
                        L.put(k1, v, "maybe")
                        L.delete(k2, "maybe")
                        L.put(k2, v + b"'", "maybe")
                self.stop.wait(0.1)
            self.stop.wait(rng.uniform(0, 0.01))


# --------------------------------------------------------------------------
# The fault schedule

def schedule(rng, n, seconds, kills=1):
    """[(duration, action, args)] drawn from rng, about |seconds| long;
    |kills| kill -9s of a random node spread over it (the first a third in
    for one), each restarted a step later."""
    steps, t = [], 0.0
    kill_at = [seconds * (i + 1) / (kills + 2) if kills == 1 else seconds * (i + 1) / (kills + 1)
               for i in range(kills)]
    while t < seconds:
        d = round(rng.uniform(0.5, 2.0), 2)
        if kill_at and t >= kill_at[0]:
            victim = rng.randrange(n)
            steps.append((d, "kill9", (victim,)))
            d2 = round(rng.uniform(0.5, 2.0), 2)
            steps.append((d2, "restart", (victim,)))
            kill_at.pop(0)
            t += d + d2
            continue
        a = rng.choice(["heal", "isolate", "split", "one_way", "delay", "bandwidth",
                        "reset", "drop"])
        if a == "isolate":
            args = (rng.randrange(n),)
        elif a == "split":
            nodes = list(range(n))
            rng.shuffle(nodes)
            cut = rng.randrange(1, n)
            args = (sorted(nodes[:cut]), sorted(nodes[cut:]))
        elif a in ("one_way", "drop"):
            src, dst = rng.sample(range(n), 2)
            args = (src, dst)
        elif a == "delay":
            args = (rng.choice([5, 10, 30]),)
        elif a == "bandwidth":
            src, dst = rng.sample(range(n), 2)
            args = (src, dst, rng.choice([16 << 10, 64 << 10]))
        else:
            args = ()
        steps.append((d, a, args))
        t += d
    return steps


def apply_step(c, action, args):
    if action == "heal":
        c.heal()
    elif action == "isolate":
        c.partition([[args[0]]] + [[x for x in range(len(c.nodes)) if x != args[0]]])
    elif action == "split":
        c.partition(list(args))
    elif action == "one_way":
        c.cut_one_way(*args)
    elif action == "delay":
        for p in c.proxies.values():
            p.delay(args[0])
            p.jitter(args[0] / 2)
    elif action == "bandwidth":
        c.link(args[0], args[1]).bandwidth(args[2])
    elif action == "reset":
        for p in c.proxies.values():
            p.reset()
    elif action == "drop":
        c.link(args[0], args[1]).drop(1.0, "both", then="resume")
        c.link(args[1], args[0]).drop(1.0, "both", then="resume")
    elif action == "kill9":
        c.kill9(args[0])
    elif action == "restart":
        c.restart(args[0])


def run_faults(args):
    caps = clusterlib.capabilities(args.cairn)
    if not caps["peer_dial"]:
        print("SKIP: %s --help lists no --experimental-peer-dial: the peer transport is not "
              "built in, so there is no link to put a proxy on" % args.cairn)
        return SKIP
    seconds = args.soak or args.seconds
    seed = args.seed if args.seed is not None else 16
    print("test_cluster_faults: seed %d, %d nodes, schedule %.0f s" % (seed, args.nodes, seconds))
    rng = random.Random(seed)
    # The CI form kills one node once; a soak one node a minute.
    steps = schedule(rng, args.nodes, seconds, kills=max(1, int(seconds // 60)) if args.soak else 1)
    for d, a, x in steps:
        print("  step %-9s %-24s %.2f s" % (a, x, d))
    with clusterlib.Cluster(args.cairn, args.nodes, sync_interval_ms=args.sync_interval_ms) as c:
        try:
            return faults_on(c, rng, steps, args)
        except BaseException:
            print(clusterlib.logs(c))
            raise


def faults_on(c, rng, steps, args):
    c.watch_all()
    ledger = Ledger()
    stop = threading.Event()
    writers = [Writer(c, node, random.Random(rng.random()), ledger, stop) for node in c.nodes]
    for w in writers:
        w.start()
    t0 = time.monotonic()
    for d, action, x in steps:
        apply_step(c, action, x)
        time.sleep(d)
    stop.set()
    for w in writers:
        w.join(10)
    print("writes: %s in %.1f s (%s)" % (ledger.counts, time.monotonic() - t0,
                                         ", ".join("%s %d" % (w.node.name, w.ops) for w in writers)))
    for node in c.nodes:
        if node.proc is None:
            c.restart(node)
    c.heal()
    ok, report = c.converge(CONVERGE_TIMEOUT)
    print("converge: %s" % report)
    check(ok, "every node converges within %.0f s after the final heal: %s"
          % (CONVERGE_TIMEOUT, report))
    # Per node, whether or not they converged.
    for name, probs in c.check_watches().items():
        for p in probs:
            check(False, "watch on %s: %s" % (name, p))
    if not ok:
        return 1
    _rev, space = c.range_all(0)
    for p in ledger.verify(space):
        check(False, "acknowledged writes: " + p)
    hashes = {n.name: hashkv(c, n) for n in c.nodes}
    print("hashkv: %s" % hashes)
    check(len(set(hashes.values())) == 1, "equal HashKV at equal heads: %s" % hashes)
    # Range's KeyValue at equal heads: key, value and lease agree; create and
    # mod revision and version are local to a node (README, "Across nodes").
    fields = {n.name: {k: (v, lease) for k, (v, lease, _ver) in c.range_kvs(n).items()}
              for n in c.nodes}
    check(all(f == fields[c.nodes[0].name] for f in fields.values()),
          "equal key, value and lease of every KeyValue at equal heads")
    for node in c.nodes:
        c.put(node, b"final/" + node.name.encode(), b"from " + node.name.encode())
    ok, report = c.converge(CONVERGE_TIMEOUT / 2)
    check(ok and all(b"final/" + n.name.encode() in c.range_all(0)[1] for n in c.nodes),
          "after convergence a new key per node reaches every node: %s" % report)
    links = c.link_stats()
    print("link bytes a2b/b2a: %s" % ", ".join(
        "%s %d/%d" % (k, v["bytes"]["a2b"]["sent"], v["bytes"]["b2a"]["sent"])
        for k, v in sorted(links.items())))
    return 1 if failures else 0


# --------------------------------------------------------------------------
# --harness

def run_harness(args):
    caps = clusterlib.capabilities(args.cairn)
    print("harness: capabilities %s" % caps)
    c = clusterlib.Cluster(args.cairn, 3, lifetime=300)
    pids = [n.pid for n in c.nodes]
    try:
        harness_on(c, caps)
    except BaseException:
        print(clusterlib.logs(c))
        raise
    finally:
        c.close()
    for pid in pids:
        try:
            os.kill(pid, 0)
            check(False, "close(): pid %d still runs" % pid)
        except ProcessLookupError:
            pass
    return 1 if failures else 0


def harness_on(c, caps):
    # Cut every node from every other; new peer connections are reset too.
    for p in c.proxies.values():
        p.refuse(True)
    c.partition([[0], [1], [2]])
    check(all(p.stats()["faults"]["a2b"]["blackholed"] and p.stats()["faults"]["b2a"]["blackholed"]
              for p in c.proxies.values()), "partition into singletons cuts all six links")
    c.watch_all()
    # Helpers and their answers.
    r1 = c.put(0, b"a", b"1")
    r2 = c.put(0, b"a", b"2")
    check(r2 == r1 + 1, "put answers the revision (%d then %d)" % (r1, r2))
    check(c.get(0, b"a") == b"2" and c.get(0, b"nope") is None, "get answers value or None")
    t = c.txn(0, [(b"a", "value", "==", b"2")], [("put", b"b", b"x")], [("put", b"b", b"y")])
    check(t.succeeded and c.get(0, b"b") == b"x", "txn takes the success branch when it holds")
    t = c.txn(0, [(b"a", "version", ">", 5)], [("put", b"b", b"x2")], [("delete", b"b")])
    check(not t.succeeded and c.get(0, b"b") is None, "txn takes the failure branch otherwise")
    check(c.delete(0, b"a") == 1 and c.delete(0, b"a") == 0, "delete answers the count")
    for i, node in enumerate(c.nodes):
        c.put(node, b"own/" + node.name.encode(), b"%d" % i)
        c.put(node, b"same", b"everywhere")
    # Kill -9 and restart one node: its data and its watcher survive.
    c.put(1, b"before-kill", b"x")
    c.kill9(1)
    try:
        c.put(1, b"x", b"y")
        check(False, "a call to a killed node fails")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE, "a killed node's call is UNAVAILABLE")
    c.put(0, b"while-down", b"z")
    c.restart(1)
    check(c.get(1, b"before-kill") == b"x", "a restarted node has what it acknowledged")
    c.put(1, b"after-restart", b"w")
    w1 = c.watchers[1]
    check(w1.streams >= 1, "the watcher of the killed node watches")
    # Partition wiring.
    c.partition([[0], [1, 2]])
    st = {k: (p.stats()["faults"]["a2b"]["blackholed"], p.stats()["faults"]["b2a"]["blackholed"])
          for k, p in c.proxies.items()}
    check(st[(0, 1)] == st[(1, 0)] == st[(0, 2)] == st[(2, 0)] == (True, True)
          and st[(1, 2)] == st[(2, 1)] == (False, False),
          "partition [[0], [1, 2]] cuts exactly the links across (%s)" % st)
    c.heal()
    for p in c.proxies.values():
        p.refuse(True)
    c.cut_one_way(0, 1)
    st = {k: (p.stats()["faults"]["a2b"]["blackholed"], p.stats()["faults"]["b2a"]["blackholed"])
          for k, p in c.proxies.items()}
    check(st[(0, 1)] == (True, False) and st[(1, 0)] == (False, True)
          and sum(a + b for a, b in st.values()) == 2,
          "cut_one_way(0, 1) cuts n1's bytes to n2 on both proxies, nothing else (%s)" % st)
    c.partition([[0], [1], [2]])
    # Every watcher has every event of its node exactly once, no gap.
    for name, probs in c.check_watches().items():
        check(not probs, "watch on %s: %s" % (name, probs))
    check(w1.streams >= 2, "the watcher of the killed node watched again after the restart "
          "(%d streams)" % w1.streams)
    # Apart, the nodes differ, and converge says where.
    ok, report = c.converge(2)
    print("converge while apart: %s" % report)
    check(not ok and "own/n1" in report and "key spaces differ" in report,
          "converge() reports the keys that differ")
    # Make the key spaces equal by hand: converge agrees (unless heads say otherwise).
    for node in c.nodes:
        _rev, space = c.range_all(node)
        for k in space:
            if k != b"same":
                c.delete(node, k)
    ok, report = c.converge(5)
    print("converge with equal key spaces: %s" % report)
    if c.heads_ok:
        check(not ok and "heads differ" in report,
              "nodes apart with equal key spaces still differ in heads")
    else:
        check(ok, "equal key spaces converge when the server has no heads (%s)" % report)
    if caps["peer_dial"]:
        c.heal()
        c.put(0, b"joined", b"1")
        ok, report = c.converge(30)
        print("converge after heal: %s" % report)
        check(ok, "after heal the three nodes converge: %s" % report)
        for name, probs in c.check_watches().items():
            check(not probs, "watch on %s after heal: %s" % (name, probs))
    else:
        print("harness: no peer transport (no --experimental-peer-dial): heal and converge "
              "across nodes not checked")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cairn", default=os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                    "build", "cairn"))
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--seconds", type=float, default=25.0, help="schedule length (CI form)")
    ap.add_argument("--soak", type=float, metavar="SECONDS", help="a longer schedule")
    ap.add_argument("--sync-interval-ms", type=int)
    ap.add_argument("--harness", action="store_true", help="check the harness itself")
    ap.add_argument("--hard-timeout", type=float, help="seconds for the whole run")
    args = ap.parse_args()
    limit = args.hard_timeout or ((args.soak or 0) + (150 if args.harness else 200))

    def on_alarm(_sig, _frm):
        print("FAIL: hard timeout of %.0f s" % limit, flush=True)
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda *_: on_alarm(None, None))
    signal.alarm(int(limit))
    t0 = time.monotonic()
    try:
        rc = run_harness(args) if args.harness else run_faults(args)
    except KeyboardInterrupt:
        rc = 1
    except (AssertionError, RuntimeError, grpc.RpcError) as e:
        check(False, "%s: %s" % (type(e).__name__, e))
        rc = 1
    if rc != SKIP:
        print("test_cluster_faults%s: %d failures in %.1f s"
              % (" --harness" if args.harness else "", len(failures), time.monotonic() - t0))
    return rc


if __name__ == "__main__":
    sys.exit(main())
