#!/usr/bin/python3
"""A new member joins a running three-node cairn cluster (issue 12), on
cluster.py's harness (a netproxy on every peer link the joiner dials), with
a writer on every node the whole time:

1. MemberAdd of n4 on n1 (etcdctl member add's RPC). Starts of n4 with
   --initial-cluster-state existing on a new data dir that do not fit are
   refused with the reason and exit code 1, and leave no store behind: a
   wrong --initial-cluster-token (cairn's text: etcd 3.4 does not check it
   and then fails to find its peers), peer URLs no member has (etcd's
   "PeerURLs: no match found for existing member"), an --initial-cluster
   that leaves a member out (etcd's "member count is unequal").
2. n4 started right: it joins (Peer/Join, then the whole history through
   the peer streams; no change of its own before it), serves clients only
   once caught up, and ends with the same heads, key space, HashKV and
   member list (n4 named, with its client URLs) as the others. A restart
   on its data dir ignores --initial-cluster* as any restart does.
3. A learner n5 added with --learner joins the same way, refuses writes
   with etcd's learner error, and takes them once promoted.
4. n2 removed (it exits by itself) and n3 re-addressed (MemberUpdate to a
   new proxy in front of its peer port): n1, n3, n4 and n5 end with the
   same member list and the same key space (issue 12, Tests bullet 1).
5. A joiner that got its answer but no change before it stopped (n6,
   linked only to n5, which is down) asks the cluster again at its next
   start and catches up. No joiner took a member added after the
   cluster's start for removed while it replayed the history (the table's
   past lacks them), and no live member was told it was removed.

Bounded: about a minute and a half.

Usage: test_cluster_join.py --cairn build/cairn
"""

import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cluster as clusterlib  # noqa: E402
import cluster_checks  # noqa: E402
import netproxy  # noqa: E402
from cluster_checks import (SKIP, call, log_has, main, members,  # noqa: E402
                            same_lists, wait_for)
from system_python import grpc  # noqa: E402
from ports import free_port  # noqa: E402
from verdict import check, failures  # noqa: E402

BOUND = 30.0   # s: a join or a membership change reaching every node, on a loaded machine
LEARNER_ERR = "etcdserver: rpc not supported for learner"


class Writers:
    """One writer per node, distinct keys, a put every 20 ms."""

    def __init__(self, c, nodes):
        self.c = c
        self.stop = threading.Event()
        self.count = 0
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in nodes]
        for t in self.threads:
            t.start()

    def run(self, n):
        i = 0
        while not self.stop.is_set():
            try:
                self.c.put(n, b"w/%d/%06d" % (n, i), b"v%d" % i)
                self.count += 1
            except Exception:  # noqa: BLE001  the node went away (removed)
                if self.stop.wait(0.2):
                    return
            i += 1
            time.sleep(0.02)

    def halt(self):
        self.stop.set()
        for t in self.threads:
            t.join(10)


def new_node(c, idx):
    """Node idx of the cluster, not started, with proxies on the links it
    dials to the members before it."""
    node = clusterlib.Node(c, idx, c.binary)
    for other in c.nodes:
        c.proxies[(idx, other.idx)] = netproxy.Proxy(
            ("127.0.0.1", other.peer_port), lifetime=600, name="%s-%s" % (node.name, other.name))
    c.nodes.append(node)
    node.extra = ["--initial-cluster-state", "existing"]
    return node


def refused(node, what, args, text):
    """A start of |node| with |args| on a fresh data dir exits 1 by itself,
    saying |text|, and makes no store."""
    dd = os.path.join(node.tmp, "refused")
    a = list(args)
    a[a.index("--data-dir") + 1] = dd
    r = subprocess.run(a, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    err = r.stderr.decode(errors="replace")
    check(r.returncode == 1 and text in err,
          "%s: refused with exit code 1 and %r (got %d: %s)" % (what, text, r.returncode,
                                                                err[-600:]))
    check(not os.path.exists(os.path.join(dd, "db")), "%s: no store was made" % what)


def with_flag(args, flag, value):
    a = list(args)
    a[a.index(flag) + 1] = value
    return a


def start_learner(node, timeout):
    """Node.start, but waiting for the log line: a learner refuses the
    start probe's linearizable get (as etcd's does)."""
    node.log = open(node.log_path, "ab")
    node.proc = subprocess.Popen(node.args(), stdout=node.log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    ok = wait_for(lambda: log_has(node, "ready to serve client requests") or
                  node.proc.poll() is not None, timeout)
    if not ok or node.proc.poll() is not None:
        raise RuntimeError("%s did not start:\n%s" % (node.name, node.read_log()))
    node.channel = grpc.insecure_channel(node.endpoint)


def put_fails(c, n):
    try:
        c.put(n, b"learner-put", b"x")
        return None
    except grpc.RpcError as e:
        return e.details()


def outcomes(tries):
    """Each named call's outcome: "answered", or its gRPC code and text."""
    got = {}
    for name, fn in tries.items():
        try:
            fn()
            got[name] = "answered"
        except grpc.RpcError as e:
            got[name] = (e.code(), e.details())
    return got


def learner_refusals(c, n):
    """What node |n|, a learner, answers beside a put. etcd 3.4 on a learner
    (measured): everything but Status and a serializable Range fails
    UNAVAILABLE with LEARNER_ERR, the streams and the lock service too."""
    m, ch = c.msgs, c.nodes[n].channel

    def unary(path, req, resp):
        return ch.unary_unary(path, request_serializer=lambda x: x.SerializeToString(),
                              response_deserializer=m[resp].FromString)(req, timeout=5)

    def bidi(path, req, resp):
        return list(ch.stream_stream(path, request_serializer=lambda x: x.SerializeToString(),
                                     response_deserializer=m[resp].FromString)(
            iter([req]), timeout=5))

    tries = {
        "HashKV": lambda: unary("/etcdserverpb.Maintenance/HashKV",
                                m["etcdserverpb.HashKVRequest"](), "etcdserverpb.HashKVResponse"),
        "LeaseLeases": lambda: unary("/etcdserverpb.Lease/LeaseLeases",
                                     m["etcdserverpb.LeaseLeasesRequest"](),
                                     "etcdserverpb.LeaseLeasesResponse"),
        "Lock": lambda: unary("/v3lockpb.Lock/Lock", m["v3lockpb.LockRequest"](name=b"l"),
                              "v3lockpb.LockResponse"),
        "Leader": lambda: unary("/v3electionpb.Election/Leader",
                                m["v3electionpb.LeaderRequest"](name=b"e"),
                                "v3electionpb.LeaderResponse"),
        "Watch": lambda: bidi("/etcdserverpb.Watch/Watch", m["etcdserverpb.WatchRequest"](
            create_request=m["etcdserverpb.WatchCreateRequest"](key=b"k")),
            "etcdserverpb.WatchResponse"),
        "LeaseKeepAlive": lambda: bidi("/etcdserverpb.Lease/LeaseKeepAlive",
                                       m["etcdserverpb.LeaseKeepAliveRequest"](ID=1),
                                       "etcdserverpb.LeaseKeepAliveResponse"),
        "Status": lambda: unary("/etcdserverpb.Maintenance/Status",
                                m["etcdserverpb.StatusRequest"](), "etcdserverpb.StatusResponse"),
        "serializable Range": lambda: unary("/etcdserverpb.KV/Range", m["etcdserverpb.RangeRequest"](
            key=b"k", serializable=True), "etcdserverpb.RangeResponse"),
    }
    return outcomes(tries)


def raw_on_learner(c, n):
    """What node |n|, a learner, answers to requests etcd's decoder refuses,
    and to a Put past --max-request-bytes. etcd 3.4.23 on a learner
    (measured): a unary request is decoded before the learner is checked,
    so a malformed one fails INTERNAL "grpc: error unmarshalling request:
    ..." (Status too); a stream is refused before it reads anything; the
    learner check comes before "request is too large"."""
    ch = c.nodes[n].channel
    same = dict(request_serializer=lambda x: x, response_deserializer=lambda b: b)
    big = b"\x0a\x01k\x12" + bytes([0xa0, 0xe1, 0x67]) + b"x" * 1700000  # a 1.7 MB value
    tries = {
        "malformed Put": lambda: ch.unary_unary("/etcdserverpb.KV/Put", **same)(b"\xff", timeout=5),
        "malformed LeaseLeases": lambda: ch.unary_unary("/etcdserverpb.Lease/LeaseLeases", **same)(
            b"\xff", timeout=5),
        "malformed Status": lambda: ch.unary_unary("/etcdserverpb.Maintenance/Status", **same)(
            b"\xff", timeout=5),
        "malformed Snapshot": lambda: list(ch.unary_stream("/etcdserverpb.Maintenance/Snapshot",
                                                           **same)(b"\xff", timeout=5)),
        "Put too large": lambda: ch.unary_unary("/etcdserverpb.KV/Put", **same)(big, timeout=10),
    }
    return outcomes(tries)


def scenario(c):
    w = Writers(c, [0, 1, 2])
    try:
        ok = wait_for(lambda: same_lists(c, [0, 1, 2])[0] and
                      all(m[3] for m in members(c, 0)), BOUND)
        check(ok, "the three members agree on the table")
        for i in range(300):
            c.put(0, b"pre/%04d" % i, b"x" * 40)

        # 1. n4 added; starts that do not fit are refused
        n4 = new_node(c, 3)
        r = call(c, 0, "MemberAdd", peerURLs=[n4.peer_url])
        id4 = r.member.ID
        check(not r.member.name and not r.member.isLearner, "MemberAdd answers n4: %s" % r)
        good = n4.args()
        refused(n4, "a wrong --initial-cluster-token",
                with_flag(good, "--initial-cluster-token", "not-the-token"),
                "the --initial-cluster-token differs from the cluster's")
        other = "http://127.0.0.1:%d" % free_port()
        ic = ",".join("%s=%s" % (x.name, x.peer_url) for x in c.nodes[:3]) + ",n4=" + other
        refused(n4, "peer URLs no member has",
                with_flag(with_flag(good, "--initial-advertise-peer-urls", other),
                          "--initial-cluster", ic),
                "PeerURLs: no match found for existing member (%x, [%s])" % (id4, n4.peer_url))
        ic = ",".join("%s=%s" % (x.name, x.peer_url) for x in (c.nodes[0], c.nodes[1], n4))
        refused(n4, "an --initial-cluster without n3", with_flag(good, "--initial-cluster", ic),
                "error validating peerURLs {ClusterID:")
        refused(n4, "an --initial-cluster without n3 (reason)",
                with_flag(good, "--initial-cluster", ic), ": member count is unequal")

        # 2. n4 joins under load
        t0 = time.monotonic()
        n4.start(timeout=BOUND * 2)
        print("n4 serves %.2f s after its start" % (time.monotonic() - t0))
        check(log_has(n4, "joining cluster") and log_has(n4, "joined: caught up with"),
              "n4 logged its join and its catch-up")
        check(not log_has(n4, "cannot publish"), "n4 published its name and client URLs")
        ok = wait_for(lambda: same_lists(c, [0, 1, 2, 3])[0] and
                      any(m[0] == id4 and m[1] == "n4" and m[3] for m in members(c, 0)), BOUND)
        check(ok, "all four list n4 by name with its client URLs: %s" % same_lists(c, [0, 1, 2, 3])[1])
        got = c.range_all(3)[1]
        check(all(got.get(b"pre/%04d" % i) == b"x" * 40 for i in range(300)),
              "n4 serves the keys written before it joined")
    finally:
        w.halt()
    print("writes during the join: %d" % w.count)
    cluster_checks.check_equal_state(c, "after n4 joined")

    # a restart on the data dir n4 made ignores --initial-cluster*
    rc = n4.stop()
    check(rc == 0, "the joined n4 stops cleanly (exit code %s)" % rc)
    n4.start(timeout=BOUND)
    check(not log_has(n4, "joining cluster", after="received SIGTERM"),
          "n4's restart did not join again")
    c.put(3, b"from-n4", b"1")
    check(c.wait_value(0, b"from-n4", b"1", BOUND), "a put on the restarted n4 reaches n1")

    # 3. a learner joins, refuses writes until promoted
    n5 = new_node(c, 4)
    r = call(c, 1, "MemberAdd", peerURLs=[n5.peer_url], isLearner=True)
    id5 = r.member.ID
    start_learner(n5, BOUND * 2)
    got = put_fails(c, 4)
    check(got == LEARNER_ERR, "the learner refuses a put with etcd's error: %r" % got)
    for name, ans in learner_refusals(c, 4).items():
        want = ("answered" if name in ("Status", "serializable Range")
                else (grpc.StatusCode.UNAVAILABLE, LEARNER_ERR))
        check(ans == want, "the learner's %s: %r (etcd: %r)" % (name, ans, want))
    for name, ans in raw_on_learner(c, 4).items():
        if name.startswith("malformed") and name != "malformed Snapshot":
            ok = ans != "answered" and ans[0] == grpc.StatusCode.INTERNAL and \
                ans[1].startswith("grpc: error unmarshalling request: ")
            want = "INTERNAL grpc: error unmarshalling request: ..."
        else:
            want = (grpc.StatusCode.UNAVAILABLE, LEARNER_ERR)
            ok = ans == want
        check(ok, "the learner's %s: %r (etcd: %r)" % (name, ans, want))
    ok = wait_for(lambda: any(m[0] == id5 and m[1] == "n5" for m in members(c, 1)), BOUND)
    check(ok, "n2 sees the learner's name (it published)")
    call(c, 1, "MemberPromote", ID=id5)
    ok = wait_for(lambda: put_fails(c, 4) is None, BOUND)
    check(ok, "the promoted n5 takes writes")

    # 4. n2 removed, n3 re-addressed
    ids = {m[1]: m[0] for m in members(c, 0)}
    front = netproxy.Proxy(("127.0.0.1", c.nodes[2].peer_port), lifetime=600, name="n3-new")
    nurl = "http://127.0.0.1:%d" % front.port
    call(c, 0, "MemberRemove", ID=ids["n2"])
    call(c, 3, "MemberUpdate", ID=ids["n3"], peerURLs=[nurl])
    n2 = c.nodes[1]
    ok = wait_for(lambda: n2.proc.poll() is not None, BOUND)
    check(ok, "n2 exited after its removal")
    n2.stop()
    for i in range(50):
        c.put(i % 4 if i % 4 != 1 else 0, b"post/%03d" % i, b"y")
    live = [0, 2, 3, 4]
    ok = wait_for(lambda: same_lists(c, live)[0] and len(members(c, 0)) == 4 and
                  any(m[0] == ids["n3"] and m[2] == (nurl,) for m in members(c, 0)), BOUND)
    check(ok, "n1 n3 n4 n5 list the same four members, n3 at its new URL: %s"
          % same_lists(c, live)[1])
    ok = wait_for(lambda: front.accepted > 0, BOUND)
    check(ok, "n3's new address was dialed (%d connections)" % front.accepted)
    cluster_checks.check_equal_state(c, "after the removal and the update")

    # 5. a joiner stopped before any change reached it asks again at its
    # next start: n6 links only to n5, which is down, so nothing comes
    n5.stop()
    n6 = new_node(c, 5)
    ic = ",".join("%s=%s" % (x.name, nurl if x.name == "n3" else x.peer_url)
                  for x in c.nodes if x is not n2)
    c.proxies[(4, 5)] = netproxy.Proxy(("127.0.0.1", n6.peer_port), lifetime=600, name="n5-n6")
    call(c, 0, "MemberAdd", peerURLs=[n6.peer_url])
    n6.extra = ["--initial-cluster-state", "existing", "--peer-links", "n5"]
    args = with_flag(n6.args(), "--initial-cluster", ic)
    n6.log = open(n6.log_path, "ab")
    n6.proc = subprocess.Popen(args, stdout=n6.log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    ok = wait_for(lambda: log_has(n6, "joining cluster"), BOUND)
    check(ok, "n6 got its join answered")
    time.sleep(1.0)
    check(not log_has(n6, "ready to serve client requests"), "n6 does not serve, empty")
    rc = n6.stop()
    check(rc == 0, "a SIGTERM while n6 waits to catch up stops it cleanly (exit code %s)" % rc)
    n6.extra = ["--initial-cluster-state", "existing"]
    n6.log = open(n6.log_path, "ab")
    n6.proc = subprocess.Popen(with_flag(n6.args(), "--initial-cluster", ic), stdout=n6.log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    ok = wait_for(lambda: log_has(n6, "ready to serve client requests"), BOUND)
    check(ok and log_has(n6, "joining again (the data dir holds no change yet)"),
          "n6's restart asked the cluster again and caught up")
    n6.channel = grpc.insecure_channel(n6.endpoint)
    n5.start(timeout=BOUND)
    cluster_checks.check_equal_state(c, "after n6 joined on its second start")
    # a joiner replays the table's past (members added since are missing
    # from it): it must not take them for removed, nor tell them so
    for node in c.nodes:
        if node is n2:
            continue
        with open(node.log_path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        if node in (n4, n5):
            # up to the first stop: the join (a restart's --initial-cluster
            # names members its table lacks, under the flags' ids: those
            # phantoms are marked removed, as on any restart)
            text = text.split("received SIGTERM")[0]
        wrong = re.findall(r"peer (n[013456]) \([0-9a-f]+\): removed from the cluster", text)
        check(not wrong, "%s took no live member for removed: %s" % (node.name, wrong))
        check("ERROR the member has been permanently removed" not in text,
              "%s was never told it is removed" % node.name)


def run(binary, scenarios):
    if not clusterlib.capabilities(binary)["peer_dial"]:
        print("SKIP: %s --help lists no --experimental-peer-dial" % binary)
        return SKIP
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
    sys.exit(main("test_cluster_join", __doc__, [scenario], hard_timeout=200))
