"""A local cairn cluster for the multi-node tests: N cairn processes on
random 127.0.0.1 ports with a netproxy.Proxy on every directed peer link.

Node A reaches member B through proxy(A->B) (--experimental-peer-dial
B=127.0.0.1:<proxy port>), which forwards to B's real peer port; so a test
can delay, throttle, cut or reset each direction of each link. A partition
of {A} from {B} cuts proxy(A->B) and proxy(B->A) both ways (the pair's one
bidirectional stream rides on whichever of them won the dial).

    with Cluster(binary, 3) as c:
        c.put(0, b"k", b"v"); c.partition([[0], [1, 2]]); c.heal()
        ok, report = c.converge(30)

Exposes: nodes (name, endpoint, pid), put/get/delete/txn/range_all through
python grpc, per-node watchers that collect every event (resuming after a
restart from the next revision), partition(groups) / cut_one_way / heal,
kill9(node) / restart(node), heads(node) through cairnpb.Replication/Heads
when the server has it, and converge(timeout): every node with equal heads
(when available) and an equal key space (keys and values; revisions differ
per node by design), or a report of the differences. Every wait is bounded
and close() (also on __exit__ and at interpreter exit) kills every process
it started, by PID.

Cluster(binary, 4, links=[(0, 1), (1, 2), (2, 3)]) starts a partial mesh
(a line): each node gets --peer-links naming its partners.

Capabilities are read from `cairn --help`: without --experimental-peer-dial
the proxies are created but the nodes dial each other directly (so faults do
not apply) and `peer_dial` is False; tests that need faults skip on that.
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "conformance"))

from system_python import grpc  # noqa: E402
import netproxy  # noqa: E402
import procs  # noqa: E402
from harness import load_messages  # noqa: E402
import wire  # noqa: E402

RPC_TIMEOUT = 5.0
ALL_KEYS = (b"\x00", b"\x00")     # key, range_end: the whole key space
HEADS_METHOD = "/cairnpb.Replication/Heads"


def help_text(binary):
    r = subprocess.run([binary, "--help"], capture_output=True, timeout=20)
    return (r.stdout + r.stderr).decode("utf-8", "replace")


def capabilities(binary):
    text = help_text(binary)
    return {"peer_dial": "--experimental-peer-dial" in text,
            "sync_interval": "--sync-interval-ms" in text}


def _parse_heads(data):
    """The heads (field 1, repeated bytes) of a HeadsResponse, sorted."""
    return sorted(bytes(h) for h in wire.decode(data).get(1, []))


class NodeDown(grpc.RpcError):
    """A call to a node this harness has stopped (it is not dialed)."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE


class Node(procs.Server):
    """One member: procs.Server with the cluster's flags."""

    def __init__(self, cluster, idx, binary):
        super().__init__("cairn", binary, name="n%d" % (idx + 1))
        self.cluster = cluster
        self.idx = idx
        self.channel = None
        self.killed = 0

    @property
    def peer_url(self):
        return "http://127.0.0.1:%d" % self.peer_port

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def args(self):
        c = self.cluster
        a = super().args()
        i = a.index("--initial-cluster")
        a[i + 1] = ",".join("%s=%s" % (n.name, n.peer_url) for n in c.nodes)
        a += ["--initial-cluster-token", c.token]
        if c.links is not None:
            a += ["--peer-links", ",".join(c.nodes[j].name for j in sorted(c.links[self.idx]))]
        if c.caps["sync_interval"] and c.sync_interval_ms is not None:
            a += ["--sync-interval-ms", str(c.sync_interval_ms)]
        if c.peer_dial:
            for other in c.nodes:
                if other is not self:
                    a += ["--experimental-peer-dial", "%s=127.0.0.1:%d"
                          % (other.name, c.proxies[(self.idx, other.idx)].port)]
        return a

    def start(self, timeout=30):
        super().start(timeout)
        self.channel = grpc.insecure_channel(self.endpoint, options=[
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", 256 << 20),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500)])
        return self

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        return super().stop(sig, timeout)


class Watcher:
    """Every event one node sends to a watch on the whole key space, from
    revision 1; after the stream breaks (the node was killed) it watches
    again from the revision after the last one it got."""

    def __init__(self, cluster, node):
        self.cluster = cluster
        self.node = node
        self.events = []        # (revision, "PUT"|"DELETE", key, value) in arrival order
        self.problems = []
        self.streams = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.call = None
        self.thread = threading.Thread(target=self._run, name="watch-" + node.name, daemon=True)
        self.thread.start()

    def last_revision(self):
        with self.lock:
            return self.events[-1][0] if self.events else 0

    def _run(self):
        m = self.cluster.msgs
        WR, WC = m["etcdserverpb.WatchRequest"], m["etcdserverpb.WatchCreateRequest"]
        while not self.stop.is_set():
            ch = self.node.channel
            if ch is None:
                self.stop.wait(0.1)
                continue
            start = self.last_revision() + 1
            hold = threading.Event()

            def reqs():
                yield WR(create_request=WC(key=ALL_KEYS[0], range_end=ALL_KEYS[1],
                                           start_revision=max(1, start)))
                while not hold.wait(0.2) and not self.stop.is_set():
                    pass
            try:
                stub = ch.stream_stream(
                    "/etcdserverpb.Watch/Watch", request_serializer=lambda x: x.SerializeToString(),
                    response_deserializer=m["etcdserverpb.WatchResponse"].FromString)
                self.call = stub(reqs())
                self.streams += 1
                for r in self.call:
                    if r.canceled or r.compact_revision:
                        self.problems.append("watch canceled (%r, compact_revision %d)"
                                             % (r.cancel_reason, r.compact_revision))
                        break
                    with self.lock:
                        for ev in r.events:
                            self.events.append((ev.kv.mod_revision,
                                                "DELETE" if ev.type == 1 else "PUT",
                                                ev.kv.key, ev.kv.value))
            except (grpc.RpcError, ValueError):
                pass
            finally:
                hold.set()
            self.stop.wait(0.1)

    def close(self):
        self.stop.set()
        if self.call is not None:
            self.call.cancel()
        self.thread.join(5)

    def check(self, final_revision, final_space):
        """Problems of this node's watch: every revision up to final_revision
        exactly once, in order, no gap, and the events replay to the final
        key space."""
        probs = list(self.problems)
        with self.lock:
            evs = list(self.events)
        seen = set()
        replay = {}
        prev = 1
        for rev, typ, key, value in evs:
            if (rev, key) in seen:
                probs.append("event (rev %d, key %r) delivered twice" % (rev, key))
                continue
            seen.add((rev, key))
            if rev < prev:
                probs.append("event rev %d after rev %d (out of order)" % (rev, prev))
            elif rev > prev + 1:
                probs.append("gap: no event for revisions %d..%d" % (prev + 1, rev - 1))
            prev = max(prev, rev)
            if typ == "PUT":
                replay[key] = value
            else:
                replay.pop(key, None)
        if prev != final_revision:
            probs.append("last event at rev %d, the node is at rev %d" % (prev, final_revision))
        if replay != final_space:
            probs.append("events replay to a key space other than the node's Range: %s"
                         % diff_spaces({"events": replay, "range": final_space}))
        return probs


def diff_spaces(spaces, most=10):
    """A short text of how the key spaces {name: {key: value}} differ."""
    names = list(spaces)
    keys = sorted(set().union(*[set(s) for s in spaces.values()]))
    lines = []
    for k in keys:
        vals = [spaces[n].get(k) for n in names]
        if any(v != vals[0] for v in vals):
            lines.append("%r: %s" % (k, ", ".join("%s=%r" % (n, v) for n, v in zip(names, vals))))
    more = len(lines) - most
    return "; ".join(lines[:most]) + (" (and %d more)" % more if more > 0 else "")


class Cluster:
    def __init__(self, binary, n=3, sync_interval_ms=None, lifetime=3600, log=print,
                 workdir=None, links=None, directed=False):
        self.binary = binary
        self.log = log
        self.caps = capabilities(binary)
        self.peer_dial = self.caps["peer_dial"]
        self.sync_interval_ms = sync_interval_ms
        # links: None = full mesh; else pairs (i, j) of node indices, each
        # node started with --peer-links naming its partners (directed: i
        # names j, j does not name i unless (j, i) is listed too)
        self.links = None
        if links is not None:
            self.links = {i: set() for i in range(n)}
            for i, j in links:
                self.links[i].add(j)
                if not directed:
                    self.links[j].add(i)
        self.token = "cairn-it-%d" % os.getpid()
        self.own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="cairn-cluster-")
        self.msgs = load_messages(os.path.join(REPO, "proto"), self.workdir)
        self.nodes = []
        self.proxies = {}
        self.watchers = {}
        self.heads_ok = None     # unknown until asked
        self.closed = False
        atexit.register(self.close)
        try:
            self.nodes = [Node(self, i, binary) for i in range(n)]
            for a in self.nodes:
                for b in self.nodes:
                    if a is not b:
                        self.proxies[(a.idx, b.idx)] = netproxy.Proxy(
                            ("127.0.0.1", b.peer_port), lifetime=lifetime,
                            name="%s-%s" % (a.name, b.name))
            if not self.peer_dial:
                log("cluster: %s has no --experimental-peer-dial: the nodes dial each other "
                    "directly and link faults do not apply" % binary)
            for node in self.nodes:
                node.start()
        except BaseException:
            self.close()
            raise
        log("cluster: %s" % ", ".join("%s client %s peer %d pid %d"
                                      % (x.name, x.endpoint, x.peer_port, x.pid)
                                      for x in self.nodes))

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()

    def node(self, n):
        return n if isinstance(n, Node) else self.nodes[n]

    # ---- links
    def link(self, a, b):
        """The proxy A's dials of B go through."""
        return self.proxies[(self.node(a).idx, self.node(b).idx)]

    def partition(self, groups):
        """Cuts every link between nodes of different groups (both ways) and
        heals the links within a group; a node in no group is alone."""
        group_of = {}
        for gi, g in enumerate(groups):
            for n in g:
                group_of[self.node(n).idx] = gi
        for (a, b), p in self.proxies.items():
            ga, gb = group_of.get(a, ("alone", a)), group_of.get(b, ("alone", b))
            if ga == gb:
                p.unblackhole()
            else:
                p.blackhole()

    def cut_one_way(self, src, dst):
        """src's bytes stop reaching dst, on both proxies of the pair."""
        self.link(src, dst).blackhole("a2b")
        self.link(dst, src).blackhole("b2a")

    def heal(self, reset=False):
        for p in self.proxies.values():
            p.clear()
        if reset:
            for p in self.proxies.values():
                p.reset()

    def link_stats(self):
        return {"%s->%s" % (self.nodes[a].name, self.nodes[b].name): p.stats()
                for (a, b), p in self.proxies.items()}

    # ---- processes
    def kill9(self, n):
        node = self.node(n)
        self.log("cluster: kill -9 %s (pid %s)" % (node.name, node.pid))
        node.killed += 1
        return node.stop(signal.SIGKILL)

    def restart(self, n, timeout=30):
        node = self.node(n)
        if node.proc is not None:
            node.stop()
        node.start(timeout)
        self.log("cluster: restarted %s (pid %d)" % (node.name, node.pid))
        return node

    # ---- client calls
    def _unary(self, n, method, req, resp, timeout=RPC_TIMEOUT):
        node = self.node(n)
        if node.channel is None:
            raise NodeDown("node %s is down" % node.name)
        m = self.msgs
        call = node.channel.unary_unary(
            method, request_serializer=lambda x: x.SerializeToString(),
            response_deserializer=m[resp].FromString)
        return call(req, timeout=timeout)

    def put(self, n, key, value, lease=0):
        r = self._unary(n, "/etcdserverpb.KV/Put",
                        self.msgs["etcdserverpb.PutRequest"](key=key, value=value, lease=lease),
                        "etcdserverpb.PutResponse")
        return r.header.revision

    def get(self, n, key):
        r = self._unary(n, "/etcdserverpb.KV/Range",
                        self.msgs["etcdserverpb.RangeRequest"](key=key),
                        "etcdserverpb.RangeResponse")
        return r.kvs[0].value if r.kvs else None

    def delete(self, n, key):
        r = self._unary(n, "/etcdserverpb.KV/DeleteRange",
                        self.msgs["etcdserverpb.DeleteRangeRequest"](key=key),
                        "etcdserverpb.DeleteRangeResponse")
        return r.deleted

    def txn(self, n, compare, success, failure):
        """compare: [(key, "version"|"value", "=="|">"|"<"|"!=", operand)];
        success/failure: [("put", key, value) | ("delete", key) | ("get", key)].
        Returns the TxnResponse."""
        m = self.msgs
        C, Op = m["etcdserverpb.Compare"], m["etcdserverpb.RequestOp"]
        results = {"==": 0, ">": 1, "<": 2, "!=": 3}
        targets = {"version": 0, "create": 1, "mod": 2, "value": 3}
        cmps = []
        for key, target, res, operand in compare:
            c = C(key=key, result=results[res], target=targets[target])
            if target == "value":
                c.value = operand
            elif target == "version":
                c.version = operand
            elif target == "create":
                c.create_revision = operand
            else:
                c.mod_revision = operand
            cmps.append(c)

        def ops(lst):
            out = []
            for op in lst:
                if op[0] == "put":
                    out.append(Op(request_put=m["etcdserverpb.PutRequest"](key=op[1], value=op[2])))
                elif op[0] == "delete":
                    out.append(Op(request_delete_range=m["etcdserverpb.DeleteRangeRequest"](
                        key=op[1])))
                else:
                    out.append(Op(request_range=m["etcdserverpb.RangeRequest"](key=op[1])))
            return out
        req = m["etcdserverpb.TxnRequest"](compare=cmps, success=ops(success),
                                          failure=ops(failure))
        return self._unary(n, "/etcdserverpb.KV/Txn", req, "etcdserverpb.TxnResponse")

    def range_all(self, n):
        """(header revision, {key: value}) of the node's whole key space."""
        r = self._unary(n, "/etcdserverpb.KV/Range",
                        self.msgs["etcdserverpb.RangeRequest"](key=ALL_KEYS[0],
                                                               range_end=ALL_KEYS[1]),
                        "etcdserverpb.RangeResponse", timeout=RPC_TIMEOUT * 2)
        return r.header.revision, {kv.key: kv.value for kv in r.kvs}

    def range_kvs(self, n):
        """{key: (value, lease, version)} of the node's whole key space: the
        KeyValue fields beside its revisions (create/mod revision are local
        to a node; README, "What differs from etcd")."""
        r = self._unary(n, "/etcdserverpb.KV/Range",
                        self.msgs["etcdserverpb.RangeRequest"](key=ALL_KEYS[0],
                                                               range_end=ALL_KEYS[1]),
                        "etcdserverpb.RangeResponse", timeout=RPC_TIMEOUT * 2)
        return {kv.key: (kv.value, kv.lease, kv.version) for kv in r.kvs}

    def heads(self, n):
        """The node's heads (sorted), or None when the server has no
        cairnpb.Replication/Heads (checked once, then remembered)."""
        if self.heads_ok is False:
            return None
        node = self.node(n)
        call = node.channel.unary_unary(HEADS_METHOD, request_serializer=lambda x: x,
                                        response_deserializer=lambda x: x)
        try:
            data = call(b"", timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                if self.heads_ok is None:
                    self.log("cluster: the server has no %s: convergence is checked on the "
                             "key space only" % HEADS_METHOD)
                self.heads_ok = False
                return None
            raise
        self.heads_ok = True
        return _parse_heads(data)

    # ---- watches
    def watch_all(self):
        for node in self.nodes:
            if node.idx not in self.watchers:
                self.watchers[node.idx] = Watcher(self, node)
        return self.watchers

    def check_watches(self, settle=10.0):
        """{node name: [problems]} after the watchers had up to |settle|
        seconds to catch up with each node's final revision."""
        out = {}
        finals = {}
        for node in self.nodes:
            finals[node.idx] = self.range_all(node)
        deadline = time.monotonic() + settle
        for idx, w in self.watchers.items():
            while (w.last_revision() < finals[idx][0] and time.monotonic() < deadline):
                time.sleep(0.05)
        for idx, w in self.watchers.items():
            out[self.nodes[idx].name] = w.check(*finals[idx])
        return out

    # ---- convergence
    def snapshot(self):
        """{name: (heads or None, revision, key space)} of every live node."""
        out = {}
        for node in self.nodes:
            if node.proc is None:
                continue
            rev, space = self.range_all(node)
            out[node.name] = (self.heads(node), rev, space)
        return out

    def wait_value(self, n, key, value, timeout):
        """True once node n reads value at key (polled every 20 ms), False
        after timeout seconds."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.get(n, key) == value:
                return True
            time.sleep(0.02)
        return False

    def metric(self, n, prefix):
        """The sum of node n's /metrics samples whose line starts with
        prefix (e.g. 'name{peer="n2"} ' for one sample), or None if none."""
        url = "http://%s/metrics" % self.node(n).endpoint
        with urllib.request.urlopen(url, timeout=RPC_TIMEOUT) as resp:
            lines = resp.read().decode().splitlines()
        got = [float(ln.split()[-1]) for ln in lines if ln.startswith(prefix)]
        return int(sum(got)) if got else None

    def converge(self, timeout):
        """Waits until every node has equal heads (if the server tells them)
        and an equal key space. Returns (True, summary) or (False, report of
        the differences at the deadline)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        last = None
        while True:
            try:
                snap = self.snapshot()
            except grpc.RpcError as e:
                snap, last = None, "a node did not answer: %s" % e.code()
            if snap:
                names = list(snap)
                heads = [snap[x][0] for x in names]
                spaces = {x: snap[x][2] for x in names}
                same_heads = all(h == heads[0] for h in heads)
                same_space = all(s == spaces[names[0]] for s in spaces.values())
                if same_heads and same_space:
                    return True, ("converged in %.2f s: %d keys, heads %s, revisions %s"
                                  % (time.monotonic() - t0, len(spaces[names[0]]),
                                     "n/a" if heads[0] is None else len(heads[0]),
                                     {x: snap[x][1] for x in names}))
                last = []
                if not same_heads:
                    last.append("heads differ: %s" % {x: [h.hex()[:12] for h in (snap[x][0] or [])]
                                                      for x in names})
                if not same_space:
                    last.append("key spaces differ: " + diff_spaces(spaces))
                last = "; ".join(last)
            if time.monotonic() >= deadline:
                return False, "no convergence within %.0f s: %s" % (timeout, last)
            time.sleep(0.2)

    def close(self):
        if self.closed:
            return
        self.closed = True
        for w in self.watchers.values():
            w.close()
        for node in self.nodes:
            try:
                node.cleanup()
            except Exception as e:  # noqa: BLE001  keep killing the others
                self.log("cluster: cleanup of %s: %s" % (node.name, e))
        for p in self.proxies.values():
            p.close()
        if self.own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def logs(cluster, tail=2000):
    """The last bytes of each node's log, for a failure report."""
    return "\n".join("---- %s (%s)\n%s" % (n.name, n.log_path, n.read_log()[-tail:])
                     for n in cluster.nodes)

