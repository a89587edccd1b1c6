"""What the cluster tests of leases and compaction share (test_cluster_leases,
test_cluster_compaction), on cluster.py's harness: bounded polling, reading
a node's whole log, HashKV, the check that every live node agrees at equal
heads on what must agree across nodes (README, "What agrees across nodes
at equal heads"), and the main() that bounds a run and reports it."""

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


def wait_for(pred, timeout, step=0.05):
    """Polls pred() until it is true or |timeout| s passed; True if it was.
    A call that fails (a node not answering yet) counts as false."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if pred():
                return True
        except grpc.RpcError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)


def log_has(node, text, after=None):
    """Whether |text| is in node's whole log (after the first |after|)."""
    with open(node.log_path, "rb") as f:
        log = f.read().decode("utf-8", "replace")
    if after is not None:
        i = log.find(after)
        log = log[i:] if i >= 0 else ""
    return text in log


def hashkv(c, n):
    r = c._unary(n, "/etcdserverpb.Maintenance/HashKV", c.msgs["etcdserverpb.HashKVRequest"](),
                 "etcdserverpb.HashKVResponse")
    return r.hash


def lease_list(c, n):
    r = c._unary(n, "/etcdserverpb.Lease/LeaseLeases",
                 c.msgs["etcdserverpb.LeaseLeasesRequest"](),
                 "etcdserverpb.LeaseLeasesResponse")
    return sorted(x.ID for x in r.leases)


def call(c, n, meth, **kw):
    """etcd's Cluster service on node |n|: call(c, 0, "MemberList")."""
    return c._unary(n, "/etcdserverpb.Cluster/" + meth,
                    c.msgs["etcdserverpb.%sRequest" % meth](**kw),
                    "etcdserverpb.%sResponse" % meth)


def members(c, n):
    """Node |n|'s member list: (ID, name, peer URLs, client URLs, learner), by ID."""
    r = call(c, n, "MemberList")
    return sorted((m.ID, m.name, tuple(m.peerURLs), tuple(m.clientURLs), m.isLearner)
                  for m in r.members)


def same_lists(c, nodes):
    """(whether |nodes| hold the same member list, their lists)"""
    ls = [members(c, n) for n in nodes]
    return all(x == ls[0] for x in ls), ls


def check_equal_state(c, what):
    """Every live node converges (heads, key space); then each KeyValue's
    key, value and lease, HashKV and LeaseLeases are equal on all of them.
    Prints how many keys have a version that differs (local, like the
    revisions). Returns whether they converged."""
    ok, report = c.converge(CONVERGE_S)
    print("%s: %s" % (what, report))
    check(ok, "%s: every live node converges: %s" % (what, report))
    live = [n for n in c.nodes if n.proc is not None]
    kvs = {n.name: c.range_kvs(n) for n in live}
    first = live[0].name
    fields = {name: {k: (v, lease) for k, (v, lease, _ver) in x.items()}
              for name, x in kvs.items()}
    check(all(f == fields[first] for f in fields.values()),
          "%s: equal key, value and lease of every KeyValue: %s"
          % (what, clusterlib.diff_spaces(fields)))
    differ = [k for k in kvs[first] if len({x.get(k, (0, 0, 0))[2] for x in kvs.values()}) > 1]
    print("%s: %d of %d keys have a version that differs between nodes"
          % (what, len(differ), len(kvs[first])))
    hashes = {n.name: hashkv(c, n) for n in live}
    check(len(set(hashes.values())) == 1, "%s: equal HashKV: %s" % (what, hashes))
    leases = {n.name: lease_list(c, n) for n in live}
    check(all(v == leases[first] for v in leases.values()),
          "%s: equal LeaseLeases: %s" % (what, leases))
    return ok


def run_cluster(binary, scenarios):
    """Runs each scenario(c) in turn on one 3-node cluster with watchers on
    every node, then checks every watch; prints the nodes' logs on a
    failure. 0, 1, or SKIP without the peer transport."""
    if not clusterlib.capabilities(binary)["peer_dial"]:
        print("SKIP: %s --help lists no --experimental-peer-dial" % binary)
        return SKIP
    with clusterlib.Cluster(binary, 3, sync_interval_ms=100) as c:
        try:
            c.watch_all()
            for scenario in scenarios:
                scenario(c)
            for name, probs in c.check_watches().items():
                for p in probs:
                    check(False, "watch on %s: %s" % (name, p))
        except BaseException:
            print(clusterlib.logs(c))
            raise
        if failures:
            print(clusterlib.logs(c))
    return 1 if failures else 0


def main(name, doc, scenarios, hard_timeout=150):
    """Parses --cairn and --hard-timeout, runs the scenarios under an alarm,
    prints the failure count; the exit code."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--cairn", default=os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                    "build", "cairn"))
    ap.add_argument("--hard-timeout", type=float, default=hard_timeout)
    args = ap.parse_args()

    def on_alarm(_sig, _frm):
        print("FAIL: hard timeout of %.0f s" % args.hard_timeout, flush=True)
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda *_: on_alarm(None, None))
    signal.alarm(int(args.hard_timeout))
    t0 = time.monotonic()
    try:
        rc = run_cluster(args.cairn, scenarios)
    except KeyboardInterrupt:
        rc = 1
    except (AssertionError, RuntimeError, grpc.RpcError) as e:
        check(False, "%s: %s" % (type(e).__name__, e))
        rc = 1
    if rc != SKIP:
        print("%s: %d failures in %.1f s" % (name, len(failures), time.monotonic() - t0))
    return rc
