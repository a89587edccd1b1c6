#!/usr/bin/python3
"""cairn's Replication service on a real three-node cluster (cluster.py,
the link proxies for faults), partly through cairnctl:

- connected: a put is held by both peers (ReplicationStatus), WaitReplicated
  n=2 returns with both ids, and so does `cairnctl wait`; RevisionToHash and
  HashToRevision agree with Heads;
- n1 cut off from {n2, n3}: a put on n1 is reported as not held by either
  peer; WaitReplicated n=1 fails with DEADLINE_EXCEEDED saying 0 of 1, after
  its timeout, and `cairnctl wait` exits 1 with that text; several waits
  parked at once (more than the gRPC workers) do not keep a Range from
  being served at once; a wait started during the cut returns once the cut
  heals, and the status flips to held by both;
- Range at heads: n1's heads from during the cut read the same key space on
  every node after the heal, though n2 applied n2's concurrent write before
  n1's and n1 after (history on one, a replay on the other); a head a node
  lacks fails with FAILED_PRECONDITION naming it;
- a claim is durable: writes on n1, each waited for with n=2, while n2 is
  killed with -9 at a random moment; n2 is then cut off and restarted, and
  every change WaitReplicated claimed is on its disk (HashToRevision);
- cairnctl: -w json of status --heads and get-at-heads parse and say the
  same, -w table draws its table, bad arguments exit 128.

--latency measures WaitReplicated n=2 after a put (p50/p99) with 0 and
10 ms on every link (the proxies' delay); a rough figure on a loaded box.

Usage: test_replication.py --cairn build/cairn [--cairnctl build/cairnctl]
Needs the peer transport (exit 77, skipped, otherwise).
"""

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster as clusterlib  # noqa: E402
from system_python import grpc  # noqa: E402
from verdict import check, failures, finish  # noqa: E402

SKIP = 77
HARD_TIMEOUT = 150
R = "/cairnpb.Replication/"


def unary(c, who, method, req_type, resp_type, timeout=10.0, **fields):
    return c._unary(who, R + method, c.msgs["cairnpb." + req_type](**fields),
                    "cairnpb." + resp_type, timeout=timeout)


def status(c, n, **kw):
    return unary(c, n, "ReplicationStatus", "StatusRequest", "StatusResponse", **kw)


def wait(c, who, timeout=None, **kw):
    t = (kw.get("timeout_ms", 5000) / 1000.0) + 5 if timeout is None else timeout
    return unary(c, who, "WaitReplicated", "WaitRequest", "WaitResponse", timeout=t, **kw)


def heads(c, n):
    return list(unary(c, n, "Heads", "HeadsRequest", "HeadsResponse").heads)


def range_at(c, n, hs, key=b"\x00", range_end=b"\x00"):
    r = unary(c, n, "Range", "RangeRequest", "RangeResponse", heads=hs, key=key,
              range_end=range_end)
    return [(kv.key, kv.value) for kv in r.kvs], r.revision


def holds(st):
    """{member name: holds} of the peers in a StatusResponse."""
    return {m.name: m.holds for m in st.members if not m.is_self}


def cairnctl(args, node, *rest):
    r = subprocess.run([args.cairnctl, "--endpoints=127.0.0.1:1," + node.endpoint,
                        "--dial-timeout=1s"] + list(rest),
                       capture_output=True, timeout=40)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def grpc_error(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e
    return None


def phase_connected(c, args):
    r = c.put(0, b"k0", b"v0")
    rev = r
    w = wait(c, 0, revision=rev, n=2, timeout_ms=10000)
    check(w.holding == 2 and len(w.members) == 2, "connected: WaitReplicated n=2 -> %s" % w)
    st = status(c, 0, revision=rev)
    check(all(holds(st).values()) and len(holds(st)) == 2, "connected: both peers hold k0: %s"
          % holds(st))
    h = unary(c, 0, "RevisionToHash", "RevisionToHashRequest", "RevisionToHashResponse",
              revision=rev).hash
    back = unary(c, 0, "HashToRevision", "HashToRevisionRequest", "HashToRevisionResponse",
                 hash=h)
    check(back.revision == rev and back.took_revision, "HashToRevision(RevisionToHash(%d)) = %s"
          % (rev, back))
    check(heads(c, 0) == [h], "the put is n1's only head")
    on2 = unary(c, 1, "HashToRevision", "HashToRevisionRequest", "HashToRevisionResponse", hash=h)
    check(on2.revision > 0, "n2 maps the change to a revision of its own (%d)" % on2.revision)
    if args.cairnctl:
        rc, out, err = cairnctl(args, c.nodes[0], "wait", str(rev), "--n", "2", "--timeout", "5s")
        check(rc == 0 and out.startswith("replicated on 2 members"),
              "cairnctl wait (first endpoint unreachable): rc %d %r %r" % (rc, out, err))
        rc, out, err = cairnctl(args, c.nodes[0], "rev-to-hash", str(rev))
        check(rc == 0 and out.strip() == h.hex(), "cairnctl rev-to-hash: %r %r" % (out, err))


def phase_partition(c, args):
    c.partition([[0], [1, 2]])
    time.sleep(0.5)
    r = c.put(0, b"k1", b"cut-off")
    rev1 = r
    c.put(1, b"k2", b"other-side")  # concurrent with k1
    st = status(c, 0, revision=rev1)
    check(holds(st) == {"n2": False, "n3": False}, "cut off: no peer holds k1: %s" % holds(st))
    t0 = time.monotonic()
    e = grpc_error(lambda: wait(c, 0, revision=rev1, n=1, timeout_ms=1500))
    took = time.monotonic() - t0
    check(e is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
          and "0 of the 1" in (e.details() or ""),
          "cut off: WaitReplicated n=1 fails with DEADLINE_EXCEEDED, 0 of 1: %s"
          % ((e and (e.code(), e.details())),))
    check(1.4 <= took < 6, "the failed wait took its timeout (%.2f s)" % took)
    if args.cairnctl:
        rc, out, err = cairnctl(args, c.nodes[0], "wait", str(rev1), "--n", "1", "--timeout",
                                "1s")
        check(rc == 1 and err.startswith("Error: cairn: not replicated before the deadline: 0 of"),
              "cairnctl wait on the cut side: rc %d %r" % (rc, err))
        rc, out, err = cairnctl(args, c.nodes[0], "status", str(rev1))
        check(rc == 0 and out.count("lacks") == 2, "cairnctl status: %r" % out)

    # parked waits do not hold the workers: 8 waits at once, then a Range
    results = []

    def parked():
        results.append(grpc_error(lambda: wait(c, 0, revision=rev1, n=1, timeout_ms=3000)))
    ts = [threading.Thread(target=parked) for _ in range(8)]
    for t in ts:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    got = c.get(0, b"k1")
    fast = time.monotonic() - t0
    check(got == b"cut-off" and fast < 1.0,
          "a Get with 8 waits parked is served at once (%.3f s)" % fast)
    for t in ts:
        t.join()
    check(len(results) == 8 and all(x is not None and x.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                                    for x in results), "the 8 parked waits timed out")

    cut_heads = heads(c, 0)
    before, _ = range_at(c, 0, cut_heads)
    check(before == [(b"k0", b"v0"), (b"k1", b"cut-off")], "n1's key space at its heads: %s"
          % before)

    # a wait started during the cut returns once it heals
    out = {}

    def healing():
        t = time.monotonic()
        try:
            out["r"] = wait(c, 0, revision=rev1, n=2, timeout_ms=30000)
        except grpc.RpcError as ex:
            out["e"] = ex
        out["t"] = time.monotonic() - t
    th = threading.Thread(target=healing)
    th.start()
    time.sleep(1.0)
    check("r" not in out and "e" not in out, "the wait is still parked before the heal")
    t_heal = time.monotonic()
    c.heal()
    th.join(40)
    check("r" in out and out["r"].holding == 2, "after the heal the parked wait returns: %s" % out)
    print("parked WaitReplicated returned %.2f s after the heal"
          % (time.monotonic() - t_heal if "t" not in out else out["t"] - 1.0))
    st = status(c, 0, revision=rev1)
    check(holds(st) == {"n2": True, "n3": True}, "healed: both peers hold k1: %s" % holds(st))
    ok, rep = c.converge(30)
    check(ok, "converged after the heal: %s" % rep)

    # Range at the cut-time heads: the same everywhere, without n2's k2
    for n in range(3):
        got, rev = range_at(c, n, cut_heads)
        check(got == before, "%s: Range at n1's cut-time heads = %s (revision %d)"
              % (c.nodes[n].name, got, rev))
        if n == 0:
            check(rev > 0, "on n1 that state is a local revision (%d)" % rev)
        if n == 1:
            check(rev == 0, "on n2 it is none (k2 came first there): replayed (%d)" % rev)
    missing = bytes(range(32))
    e = grpc_error(lambda: range_at(c, 1, cut_heads + [missing]))
    check(e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION
          and missing.hex() in (e.details() or ""),
          "a missing head: FAILED_PRECONDITION naming it: %s" % (e and e.details()))
    if args.cairnctl:
        rc, out_, err = cairnctl(args, c.nodes[2], "get-at-heads", "k", "--prefix", "--heads",
                                 ",".join(h.hex() for h in cut_heads))
        check(rc == 0 and out_ == "k0\nv0\nk1\ncut-off\n", "cairnctl get-at-heads on n3: %r %r"
              % (out_, err))
        hs = ",".join(h.hex() for h in cut_heads)
        rc, out_, err = cairnctl(args, c.nodes[0], "status", "--heads", hs, "-w", "json")
        try:
            js = json.loads(out_)
        except ValueError:
            js = {}
        check(rc == 0 and js.get("holding") == 2 and len(js.get("members", [])) == 3
              and sorted(js.get("heads", [])) == sorted(h.hex() for h in cut_heads),
              "cairnctl status --heads -w json: %r %r" % (out_, err))
        rc, out_, err = cairnctl(args, c.nodes[1], "get-at-heads", "k0", "--heads", hs, "-w",
                                 "json")
        try:
            js = json.loads(out_)
        except ValueError:
            js = {}
        check(rc == 0 and js.get("kvs") == [{"key": "k0", "value": "v0", "lease": 0}]
              and js.get("count") == 1, "cairnctl get-at-heads -w json on n2: %r %r"
              % (out_, err))
        rc, out_, err = cairnctl(args, c.nodes[0], "heads", "-w", "table")
        check(rc == 0 and out_.count("+--") == 3 and "| HEAD" in out_,
              "cairnctl heads -w table: %r" % out_)
        rc, out_, err = cairnctl(args, c.nodes[0], "get-at-heads", "k0")
        check(rc == 128 and err.startswith("Error: "), "cairnctl bad arguments exit 128: %d %r"
              % (rc, err))


def phase_kill9(c, args):
    """Writes on n1 each waited for with n=2; n2 is killed with -9 in the
    middle. Every claimed change must be on n2's disk after its restart
    (cut off, so it cannot have fetched it since)."""
    claimed = []
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            try:
                rev = c.put(0, b"d/%04d" % i, b"x" * 100)
                h = unary(c, 0, "RevisionToHash", "RevisionToHashRequest",
                          "RevisionToHashResponse", revision=rev).hash
                w = wait(c, 0, revision=rev, n=2, timeout_ms=2000)
                if w.holding >= 2:
                    claimed.append((h, time.monotonic()))
            except grpc.RpcError:
                pass
    th = threading.Thread(target=writer)
    th.start()
    time.sleep(1.0 + random.random())
    c.kill9(1)
    t_kill = time.monotonic()
    time.sleep(0.5)
    stop.set()
    th.join(20)
    before_kill = [h for h, t in claimed if t < t_kill]
    check(len(before_kill) >= 3, "claims made before the kill: %d" % len(before_kill))
    c.partition([[0, 2], [1]])
    c.restart(1)
    lost = []
    for h in [h for h, _ in claimed]:
        try:
            unary(c, 1, "HashToRevision", "HashToRevisionRequest", "HashToRevisionResponse",
                  hash=h)
        except grpc.RpcError as e:
            lost.append((h.hex()[:12], e.code()))
    print("kill -9: %d claims (%d before the kill), %d missing on n2 after restart"
          % (len(claimed), len(before_kill), len(lost)))
    check(not lost, "every claimed change is on n2's disk after kill -9: missing %s" % lost[:5])
    c.heal()


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def latency(c, samples):
    for delay in (0, 10):
        for p in c.proxies.values():
            p.delay(delay)
        time.sleep(0.5)
        lat = []
        for i in range(samples):
            rev = c.put(0, b"lat/%d" % i, b"v")
            t = time.monotonic()
            wait(c, 0, revision=rev, n=2, timeout_ms=10000)
            lat.append((time.monotonic() - t) * 1000)
        print("WaitReplicated n=2, 3 nodes, %d ms links: p50 %.1f ms p99 %.1f ms (%d samples)"
              % (delay, percentile(lat, 50), percentile(lat, 99), samples))
    for p in c.proxies.values():
        p.delay(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--cairnctl")
    ap.add_argument("--latency", type=int, default=0, help="samples per delay (0: skip)")
    args = ap.parse_args()
    if not clusterlib.capabilities(args.cairn)["peer_dial"]:
        print("no --experimental-peer-dial: skipped")
        return SKIP
    timer = threading.Timer(HARD_TIMEOUT, lambda: os._exit(3))
    timer.daemon = True
    timer.start()
    with clusterlib.Cluster(args.cairn, 3) as c:
        try:
            if args.latency:
                latency(c, args.latency)
            else:
                # each member's start writes changes of its own (its client
                # URLs): let them settle, or one arriving late is a second head
                ok, rep = c.converge(30)
                check(ok, "the fresh cluster converges: %s" % rep)
                phase_connected(c, args)
                phase_partition(c, args)
                phase_kill9(c, args)
        except Exception:
            print(clusterlib.logs(c, 40))
            raise
        if failures:
            print(clusterlib.logs(c, 40))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
