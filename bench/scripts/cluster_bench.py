#!/usr/bin/python3
"""cluster_bench.py: the `cluster` part of scripts/bench.sh, cairn's
multi-node figures beside a 3-node (and 5-node) etcd cluster whose peer
links go through the same fault proxies (tests/integration/netproxy.py).

cairn's cluster is tests/integration/cluster.py's: one proxy per directed
peer link (A dials B through proxy A->B). etcd's members advertise a front
listener each; the front reads the first HTTP request of every peer
connection (etcd's rafthttp names its sender in X-Server-From, a member id
computed the way etcd does from the peer URLs and the cluster token) and
hands the connection to the proxy of that link (dialer -> member), so a cut
or a delay applies per link exactly as for cairn. A connection without the
header (etcd's /version probes) goes to the member's own catch-all proxy,
which a cut of the member blackholes too. Every message of both systems
crosses one proxy in one direction, so "10 ms" is 10 ms one way.

Figures (medians over --reps, each system's runs grouped per cluster):
  a  YCSB A open loop at --rate against node 1, 3 and 5 nodes, links with 0
     and --delay-ms: p50/p99, beside each system's single node (no proxy)
  b  node 1 (the client's) cut off from every peer for --cut-s, then healed,
     YCSB A open loop at --cut-rate on node 1 with a 1 s deadline: the share
     of requests scheduled inside the cut that succeed, a per-second timeline
     (cut.dat, cut.png), and the time from heal until the other side holds
     the cut's writes (a marker key written just before the heal on the side
     that can write: node 1 for cairn, node 2 for etcd)
  c  replication lag: Put acknowledged on node 1 -> watch event on node 2
     (probe.py --from-ack), 0 and --delay-ms links
  d  bytes on the wire (every proxy, both directions) per replicated change
     over the change's own encoded bytes (cairnpb.Replication/ChangeBytes:
     exact, the sum of the canonical change encodings the nodes hold):
     steady push (a put stream on node 1) and the exchange after a partition
     {1} | {2, 3} in which node 1 and node 2 each made --part-changes
     changes. etcd's column: its wire bytes per put per follower over the
     put's key + value bytes (steady only; its minority cannot write)
  e  aggregate closed-loop put throughput, a client on every node at once
  f  node 3 cut off while node 1 takes --catchup-changes puts, then healed:
     node 3's local put p99 (open loop, --local-rate) during the catch-up
     against idle, and the catch-up time (heal -> node 3 sees a marker
     written on node 1 after the load)
  g  WaitReplicated latency: one client on node 1 puts, then calls
     cairnpb.Replication/WaitReplicated for the put's revision (n=1 and
     n=2 alternating, --wait-timeout-ms), one sample every --wait-period-ms
     (a late one starts at once), --wait-samples per n, 0 and --delay-ms
     links: p50/p99 of put ack -> WaitReplicated returns and of put sent ->
     it returns. etcd's column: its put (sent -> ack) with the same pacing,
     the client on a follower, since etcd acks a put once a quorum (2 of 3,
     cairn's n=1) holds it
One figure alone, one system: e.g. figure f for cairn only,
  cluster_bench.py --cairn build/cairn --etcd $(command -v etcd) \
    --loadgen build/cairn-loadgen --out DIR --figures f --systems cairn --sizes 3
(figure f also logs node 3's group commits during the catch-up by size).
Writes DIR/raw.tsv rows (figure, system, rep, value; figures cl-*),
DIR/cluster.md (the table), DIR/cluster/*.dat and, with gnuplot, cut.png.
Stops everything it started, by PID, also on errors and signals.
"""

import argparse
import hashlib
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, HERE)

import cluster as cl  # noqa: E402
import netproxy  # noqa: E402
import procs  # noqa: E402
import wire  # noqa: E402
from system_python import grpc  # noqa: E402
from report import median  # noqa: E402  (bench/scripts/report.py)

KEY_BYTES, VALUE_BYTES = 18, 32   # cairn-loadgen's defaults


def log(*a):
    print("[%s] %s" % (time.strftime("%H:%M:%S", time.gmtime()), " ".join(str(x) for x in a)),
          flush=True)


class Client:
    """A gRPC client of one node: puts, serializable gets, cairn's Heads."""

    def __init__(self, msgs, endpoint):
        self.m = msgs
        self.ch = grpc.insecure_channel(endpoint)

    def _call(self, method, req, resp, timeout=5.0):
        f = self.ch.unary_unary(method, request_serializer=lambda x: x.SerializeToString(),
                                response_deserializer=self.m[resp].FromString)
        return f(req, timeout=timeout)

    def put(self, key, value, timeout=5.0):
        return self._call("/etcdserverpb.KV/Put", self.m["etcdserverpb.PutRequest"](
            key=key, value=value), "etcdserverpb.PutResponse", timeout)

    def get_local(self, key, timeout=2.0):
        r = self._call("/etcdserverpb.KV/Range", self.m["etcdserverpb.RangeRequest"](
            key=key, serializable=True), "etcdserverpb.RangeResponse", timeout)
        return r.kvs[0].value if r.kvs else None

    def raw(self, method, timeout=30.0):
        f = self.ch.unary_unary(method, request_serializer=lambda x: x,
                                response_deserializer=lambda x: x)
        return wire.decode(f(b"", timeout=timeout))

    def heads(self):
        return sorted(bytes(h) for h in self.raw(cl.HEADS_METHOD, 5.0).get(1, []))

    def wait_replicated(self, revision, n, timeout_ms):
        """cairnpb.Replication/WaitReplicated for a local revision; raises
        grpc.RpcError (DEADLINE_EXCEEDED) when fewer than n peers hold it."""
        return self._call("/cairnpb.Replication/WaitReplicated", self.m["cairnpb.WaitRequest"](
            revision=revision, n=n, timeout_ms=timeout_ms), "cairnpb.WaitResponse",
            timeout_ms / 1000.0 + 2)

    def change_bytes(self):
        d = self.raw("/cairnpb.Replication/ChangeBytes")
        return (d.get(1, [0])[0], d.get(2, [0])[0])

    def close(self):
        self.ch.close()


def pctl(xs, p):
    """The p-th percentile of xs by nearest rank (NaN for no samples)."""
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, int(math.ceil(p / 100.0 * len(xs))) - 1))]


def wait_for(pred, timeout, step=0.02):
    """Seconds until pred() is true, or None after timeout."""
    t0 = time.monotonic()
    while True:
        try:
            if pred():
                return time.monotonic() - t0
        except grpc.RpcError:
            pass
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(step)


def writer_split(cluster):
    """(bytes node 1 sent to its peers, bytes its peers sent to it) over
    cairn's links (a pair's stream rides on either proxy of the pair)."""
    out, back = 0, 0
    for (a, b), p in cluster.c.proxies.items():
        st = p.stats()["bytes"]
        if a == 0:
            out, back = out + st["a2b"]["sent"], back + st["b2a"]["sent"]
        elif b == 0:
            out, back = out + st["b2a"]["sent"], back + st["a2b"]["sent"]
    return out, back


def wire_bytes(proxies):
    total = 0
    for p in proxies:
        st = p.stats()["bytes"]
        total += st["a2b"]["sent"] + st["b2a"]["sent"]
    return total


# --------------------------------------------------------------- clusters

class CairnCluster:
    kind = "cairn"

    def __init__(self, binary, n, workdir):
        self.c = cl.Cluster(binary, n, log=log, workdir=workdir)
        if not self.c.peer_dial:
            self.c.close()
            raise RuntimeError("%s has no --experimental-peer-dial: no proxied links" % binary)
        self.msgs = self.c.msgs
        self.endpoints = [x.endpoint for x in self.c.nodes]
        self.proxies = list(self.c.proxies.values())
        self.pids = [x.pid for x in self.c.nodes]

    def cut(self, groups):
        self.c.partition(groups)

    def heal(self):
        self.c.heal()

    def delay(self, ms):
        for p in self.proxies:
            p.delay(ms)

    def converged(self, clients):
        h = [c.heads() for c in clients]
        return all(x == h[0] for x in h)

    def close(self):
        self.c.close()


def etcd_member_id(peer_urls, token):
    """etcd's member id: the first 8 bytes (big-endian) of the SHA-1 of the
    sorted peer URLs joined, then the cluster token."""
    h = hashlib.sha1(("".join(sorted(peer_urls)) + token).encode()).digest()
    return struct.unpack(">Q", h[:8])[0]


class EtcdCluster:
    kind = "etcd"

    def __init__(self, binary, n, workdir, msgs):
        self.msgs = msgs
        self.token = "cairn-bench-%d-%d" % (os.getpid(), n)
        self.closed = False
        self.procs = []
        self.fronts = []
        self.links = {}           # (dialer idx or None, member idx) -> Proxy
        self.dir = tempfile.mkdtemp(prefix="etcd-cluster-", dir=workdir)
        m = []
        for i in range(n):
            front = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            front.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            front.bind(("127.0.0.1", 0))
            front.listen(64)
            self.fronts.append(front)
            m.append({"name": "e%d" % (i + 1), "client": procs.free_port(),
                      "peer": procs.free_port(), "front": front.getsockname()[1]})
        self.members = m
        self.ids = {}
        for i, x in enumerate(m):
            x["url"] = "http://127.0.0.1:%d" % x["front"]
            self.ids["%x" % etcd_member_id([x["url"]], self.token)] = i
        try:
            for b in range(n):
                for a in [None] + [j for j in range(n) if j != b]:
                    self.links[(a, b)] = netproxy.Proxy(("127.0.0.1", m[b]["peer"]),
                                                        name="e%s-e%d" % (a, b))
            for i in range(n):
                threading.Thread(target=self._front, args=(i,), daemon=True).start()
            init = ",".join("%s=%s" % (x["name"], x["url"]) for x in m)
            for x in m:
                c = "http://127.0.0.1:%d" % x["client"]
                data = os.path.join(self.dir, x["name"])
                x["log"] = open(os.path.join(self.dir, x["name"] + ".log"), "ab")
                x["proc"] = subprocess.Popen(
                    [binary, "--name", x["name"], "--data-dir", data,
                     "--listen-client-urls", c, "--advertise-client-urls", c,
                     "--listen-peer-urls", "http://127.0.0.1:%d" % x["peer"],
                     "--initial-advertise-peer-urls", x["url"], "--initial-cluster", init,
                     "--initial-cluster-token", self.token, "--initial-cluster-state", "new"],
                    stdout=x["log"], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                self.procs.append(x["proc"])
            self.endpoints = ["127.0.0.1:%d" % x["client"] for x in m]
            self.pids = [p.pid for p in self.procs]
            cls = [Client(msgs, e) for e in self.endpoints]
            for i, c in enumerate(cls):
                if wait_for(lambda: c.put(b"bench-probe", b"1", timeout=2) is not None, 60,
                            0.2) is None:
                    raise RuntimeError("etcd member %d not ready within 60 s" % (i + 1))
            for c in cls:
                c.close()
            self._check_ids()
            self._not_leader(0)
        except BaseException:
            self.close()
            raise
        self.proxies = list(self.links.values())
        log("etcd cluster: %s" % ", ".join("%s client %d pid %d" % (x["name"], x["client"],
                                                                    x["proc"].pid) for x in m))

    def _etcdctl(self, i, *args):
        env = dict(os.environ, ETCDCTL_API="3")
        r = subprocess.run(["etcdctl", "--endpoints=" + self.endpoints[i], "--command-timeout=10s",
                            "-w", "json"] + list(args), capture_output=True, env=env, timeout=30)
        if r.returncode != 0:
            raise RuntimeError("etcdctl %s: %s" % (" ".join(args), r.stderr.decode()[-300:]))
        return json.loads(r.stdout)

    def _check_ids(self):
        got = {"%x" % x["ID"]: x["name"] for x in self._etcdctl(0, "member", "list")["members"]}
        want = {h: self.members[i]["name"] for h, i in self.ids.items()}
        if got != want:
            raise RuntimeError("etcd member ids %s, computed %s: the link proxies cannot tell "
                               "dialers apart" % (got, want))

    def leader(self):
        st = self._etcdctl(0, "endpoint", "status")[0]["Status"]
        return self.ids.get("%x" % st["leader"])

    def _not_leader(self, i):
        """Moves the leadership away from member i (the client's node is a
        follower, as for 2 of 3 clients of a real cluster)."""
        ld = self.leader()
        if ld == i:
            other = (i + 1) % len(self.members)
            hexid = [h for h, j in self.ids.items() if j == other][0]
            env = dict(os.environ, ETCDCTL_API="3")
            subprocess.run(["etcdctl", "--endpoints=" + self.endpoints[i], "move-leader", hexid],
                           capture_output=True, env=env, timeout=30)
            wait_for(lambda: self.leader() not in (None, i), 10, 0.2)

    def _front(self, b):
        s = self.fronts[b]
        while not self.closed:
            try:
                r, _, _ = netproxy.select.select([s], [], [], 0.2)
                if not r:
                    continue
                a, _ = s.accept()
            except (OSError, ValueError):
                return
            threading.Thread(target=self._route, args=(a, b), daemon=True).start()

    def _route(self, a, b):
        head = b""
        deadline = time.monotonic() + 2
        try:
            while b"\r\n\r\n" not in head and len(head) < 8192 and time.monotonic() < deadline:
                r, _, _ = netproxy.select.select([a], [], [], 0.1)
                if r:
                    got = a.recv(8192, socket.MSG_PEEK)
                    if not got or len(got) == len(head):
                        if not got:
                            break
                        time.sleep(0.005)
                    head = got
        except OSError:
            a.close()
            return
        mt = re.search(rb"(?i)\r\nX-Server-From: *([0-9a-f]+)\r\n", head)
        dialer = self.ids.get(mt.group(1).decode()) if mt else None
        p = self.links.get((dialer, b))
        if p is None or self.closed:
            a.close()
            return
        p.adopt(a)

    def cut(self, groups):
        group_of = {}
        for gi, g in enumerate(groups):
            for x in g:
                group_of[x] = gi
        for (a, b), p in self.links.items():
            if a is None:
                # the catch-all of b (dialers without the header): cut when
                # b is on the first group's side (the side cut off)
                if b in groups[0]:
                    p.blackhole()
                else:
                    p.unblackhole()
            elif group_of.get(a, ("alone", a)) != group_of.get(b, ("alone", b)):
                p.blackhole()
            else:
                p.unblackhole()

    def heal(self):
        for p in self.links.values():
            p.clear()

    def delay(self, ms):
        for p in self.links.values():
            p.delay(ms)

    def converged(self, clients):
        return True

    def close(self):
        if self.closed:
            return
        self.closed = True
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for x in self.members:
            if "log" in x:
                x["log"].close()
        for p in self.links.values():
            p.close()
        for s in self.fronts:
            s.close()
        subprocess.run(["rm", "-rf", self.dir])


class Single:
    """One server without proxies, for the single-node baseline."""

    def __init__(self, kind, binary):
        self.s = procs.Server(kind, binary).start(60)
        self.endpoints = [self.s.endpoint]
        self.pids = [self.s.proc.pid]

    def close(self):
        self.s.cleanup()


# ------------------------------------------------------------------- bench

class Bench:
    def __init__(self, a):
        self.a = a
        self.out = a.out
        self.dat = os.path.join(a.out, "cluster")
        os.makedirs(self.dat, exist_ok=True)
        self.raw = open(os.path.join(a.out, "raw.tsv"), "a")
        self.work = tempfile.mkdtemp(prefix="cluster-bench-", dir=a.work)
        self.msgs = cl.load_messages(os.path.join(REPO, "proto"), self.work)
        self.pin = a.load_pin.split() if a.load_pin else []
        self.live = []
        self.children = set()   # loadgens running now (threads start them too)

    def rec(self, fig, system, rep, value):
        self.raw.write("%s\t%s\t%s\t%s\n" % (fig, system, rep, value))
        self.raw.flush()

    def loadgen(self, ep, args, duration, label, cdf=None):
        cmd = self.pin + [self.a.loadgen, "--endpoint", ep, "--format", "json", "--duration",
                          str(duration), "--label", label] + list(args)
        if cdf:
            cmd += ["--cdf", cdf]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL)
        self.children.add(p)
        try:
            out, err = p.communicate(timeout=duration + 120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        finally:
            self.children.discard(p)
        try:
            return json.loads(out)
        except ValueError:
            log("  %s FAILED (%d): %s" % (label, p.returncode, err.decode()[-400:]))
            return None

    def lg_async(self, ep, args, duration, label, cdf=None):
        """Starts a loadgen in a thread; .join() then .result."""
        t = threading.Thread(target=lambda: setattr(t, "result", self.loadgen(
            ep, args, duration, label, cdf)), daemon=True)
        t.result = None
        t.start()
        return t

    def summary(self, j):
        if not j:
            return "failed"
        lat = j["latency"]["all"]
        return "%.1f ops/s p50 %.3f ms p99 %.3f ms errors %d unsent %d" % (
            j["throughput"], lat["p50_us"] / 1000, lat["p99_us"] / 1000, j["errors_total"],
            j["unsent"])

    def preload(self, cluster):
        j = self.loadgen(cluster.endpoints[0], ["--workload", "load", "--keys", str(self.a.keys),
                                                "--clients", "32"], 120, "preload")
        log("  preload: %s" % (j and "%d keys" % j["inserted"]))

    def start(self, kind, n):
        if n == 1:
            c = Single(kind, self.a.cairn if kind == "cairn" else self.a.etcd)
        elif kind == "cairn":
            c = CairnCluster(self.a.cairn, n, self.work)
        else:
            c = EtcdCluster(self.a.etcd, n, self.work, self.msgs)
        self.live.append(c)
        log("%s, %d node%s: pids %s" % (kind, n, "s" * (n > 1), c.pids))
        return c

    def stop(self, c):
        c.close()
        self.live.remove(c)

    def close(self):
        for p in list(self.children):
            if p.poll() is None:
                p.kill()
                p.wait()
        for c in list(self.live):
            try:
                c.close()
            except Exception as e:  # noqa: BLE001  keep stopping the others
                log("cleanup: %s" % e)
        self.live = []

    def clients(self, c):
        return [Client(self.msgs, e) for e in c.endpoints]

    # ---- a
    def fig_a(self, c, kind, case):
        for rep in range(1, self.a.reps + 1):
            j = self.loadgen(c.endpoints[0], ["--workload", "a", "--rate", str(self.a.rate),
                                              "--keys", str(self.a.keys), "--seed", str(rep)],
                             self.a.duration, "%s/%s/%d" % (kind, case, rep))
            log("  %s/%s/%d: %s" % (kind, case, rep, self.summary(j)))
            if j:
                self.rec("cl-a-%s.p50" % case, kind, rep, j["latency"]["all"]["p50_us"] / 1000)
                self.rec("cl-a-%s.p99" % case, kind, rep, j["latency"]["all"]["p99_us"] / 1000)
                self.rec("cl-a-%s.tput" % case, kind, rep, j["throughput"])

    # ---- c
    def fig_c(self, c, kind, case):
        for rep in range(1, self.a.reps + 1):
            r = subprocess.run(self.pin + ["/usr/bin/python3", os.path.join(HERE, "probe.py"),
                                           "watch-latency", "--endpoint", c.endpoints[0],
                                           "--watch-endpoint", c.endpoints[1], "--from-ack",
                                           "--count", str(self.a.lag_count), "--label",
                                           "%s/%s/%d" % (kind, case, rep)],
                               capture_output=True, timeout=300)
            row = r.stdout.decode().strip().split(",")
            if r.returncode != 0 or len(row) < 9:
                log("  %s/%s/%d FAILED: %s" % (kind, case, rep, r.stderr.decode()[-300:]))
                continue
            log("  %s/%s/%d: ack on 1 -> event on 2 p50 %s ms p99 %s ms; put sent -> event "
                "p50 %s ms p99 %s ms" % (kind, case, rep, row[2], row[4], row[7], row[8]))
            self.rec("cl-lag-%s.p50" % case, kind, rep, row[2])
            self.rec("cl-lag-%s.p99" % case, kind, rep, row[4])
            self.rec("cl-lag-%s.sent_p50" % case, kind, rep, row[7])
            self.rec("cl-lag-%s.sent_p99" % case, kind, rep, row[8])

    # ---- g
    def fig_g(self, c, kind, case):
        """One client on node 1, one sample at a time on a fixed schedule
        (--wait-period-ms apart; a late sample starts at once): cairn puts,
        then waits with WaitReplicated for the put's revision, n = 1 and
        n = 2 in turn; etcd only puts (its ack already means a quorum, 2 of
        3, holds the put). Records put sent -> ack, ack -> WaitReplicated
        returns and sent -> returns, in ms; a failed call counts as failed
        and is not a sample."""
        if kind == "etcd":
            c._not_leader(0)
            ld = c.leader()
            log("  etcd/wait/%s: the leader is member %s, the client's is member 1" % (
                case, "unknown" if ld is None else ld + 1))
        cli = Client(self.msgs, c.endpoints[0])
        ns = (1, 2) if kind == "cairn" else (0,)
        tmo = int(self.a.wait_timeout_ms)
        value = b"v" * VALUE_BYTES

        def sample(i, n):
            key = (b"wait-%s-%d" % (case.encode(), i)).ljust(KEY_BYTES, b"-")
            t_sent = time.perf_counter()
            r = cli.put(key, value, timeout=tmo / 1000.0 + 2)
            t_ack = time.perf_counter()
            if n:
                w = cli.wait_replicated(r.header.revision, n, tmo)
                if w.holding < n:
                    raise RuntimeError("WaitReplicated n=%d answered holding %d" % (n, w.holding))
            t_ret = time.perf_counter()
            return t_sent, t_ack, t_ret
        # warm-up, not sampled: the channel's connection, the first waits
        for i in range(10):
            try:
                sample(-1 - i, ns[i % len(ns)])
            except (grpc.RpcError, RuntimeError):
                pass
        lat = {n: {"put": [], "ack": [], "sent": []} for n in ns}
        failed = {n: 0 for n in ns}
        errors = []
        rows = []       # every sample, for cluster/wait.KIND.CASE.dat
        period = self.a.wait_period_ms / 1000.0
        total = self.a.wait_samples * len(ns)
        t0, t0_perf = time.monotonic(), time.perf_counter()
        for i in range(total):
            due = t0 + i * period
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            n = ns[i % len(ns)]
            try:
                t_sent, t_ack, t_ret = sample(i, n)
            except (grpc.RpcError, RuntimeError) as e:
                failed[n] += 1
                if len(errors) < 3:
                    errors.append(str(e.code()) if isinstance(e, grpc.RpcError) else str(e))
                rows.append("%d %d %.3f nan nan nan" % (i, n, (due - t0) * 1000))
                continue
            rows.append("%d %d %.3f %.3f %.3f %.3f" % (
                i, n, (t_sent - t0_perf) * 1000, (t_ack - t_sent) * 1000, (t_ret - t_ack) * 1000,
                (t_ret - t_sent) * 1000))
            lat[n]["put"].append((t_ack - t_sent) * 1000)
            lat[n]["ack"].append((t_ret - t_ack) * 1000)
            lat[n]["sent"].append((t_ret - t_sent) * 1000)
        secs = time.monotonic() - t0
        cli.close()
        with open(os.path.join(self.dat, "wait.%s.%s.dat" % (kind, case)), "w") as f:
            f.write("# sample n(0: etcd put only) sent_ms(since the first) put_ms ack_to_return_ms "
                    "sent_to_return_ms\n" + "\n".join(rows) + "\n")
        for n in ns:
            fig = "cl-wait-%s" % case if n == 0 else "cl-wait-%s-n%d" % (case, n)
            parts = ("put",) if n == 0 else ("put", "ack", "sent")
            for what in parts:
                for p in (50, 99):
                    self.rec("%s.%s_p%d" % (fig, what, p), kind, 1, pctl(lat[n][what], p))
            self.rec("%s.samples" % fig, kind, 1, len(lat[n]["put"]))
            self.rec("%s.failed" % fig, kind, 1, failed[n])
            x = lat[n]
            if n == 0:
                log("  %s/wait/%s: put sent -> ack p50 %.3f ms p99 %.3f ms (%d samples, %d failed)"
                    % (kind, case, pctl(x["put"], 50), pctl(x["put"], 99), len(x["put"]),
                       failed[n]))
            else:
                log("  %s/wait/%s n=%d: ack -> WaitReplicated returns p50 %.3f ms p99 %.3f ms; "
                    "put sent -> returns p50 %.3f ms p99 %.3f ms; put p50 %.3f ms (%d samples, "
                    "%d failed)" % (kind, case, n, pctl(x["ack"], 50), pctl(x["ack"], 99),
                                    pctl(x["sent"], 50), pctl(x["sent"], 99),
                                    pctl(x["put"], 50), len(x["put"]), failed[n]))
        log("  %s/wait/%s: %d samples in %.1f s (%.0f ms apart)%s" % (
            kind, case, total, secs, self.a.wait_period_ms,
            "; failures: " + ", ".join(errors) if errors else ""))

    # ---- d
    def settle(self, c, cls, timeout=60):
        return wait_for(lambda: c.converged(cls), timeout, 0.05)

    def fig_d(self, c, kind):
        cls = self.clients(c)
        n = len(cls)
        for rep in range(1, self.a.reps + 1):
            self.settle(c, cls)
            # idle: what the links carry with no writes (periodic sync, heartbeats)
            w0 = wire_bytes(c.proxies)
            time.sleep(2)
            idle = (wire_bytes(c.proxies) - w0) / 2.0
            self.rec("cl-wire-idle.bytes_per_s", kind, rep, idle)
            w0 = wire_bytes(c.proxies)
            t0 = time.monotonic()
            cb0 = cls[0].change_bytes() if kind == "cairn" else (0, 0)
            sp0 = writer_split(c) if kind == "cairn" else (0, 0)
            j = self.loadgen(c.endpoints[0], ["--workload", "put", "--rate", "1000",
                                              "--keys", str(self.a.keys), "--seed", str(rep)],
                             self.a.push_s, "%s/push/%d" % (kind, rep))
            if kind == "cairn" and self.settle(c, cls) is None:
                log("  cairn/push/%d: no equal heads within 60 s" % rep)
                continue
            time.sleep(0.3)     # etcd: the followers' acks and commits land
            w1 = wire_bytes(c.proxies)
            secs = time.monotonic() - t0
            log("  %s/push/%d: idle links carry %.0f bytes/s; %.1f s of push" % (
                kind, rep, idle, secs))
            if not j:
                continue
            if kind == "cairn":
                cb1 = cls[0].change_bytes()
                own = (cb1[1] - cb0[1]) * (n - 1)
                sp1 = writer_split(c)
                log("  cairn/push/%d: node 1 sent %d bytes to its peers, they sent %d back" % (
                    rep, sp1[0] - sp0[0], sp1[1] - sp0[1]))
                self.rec("cl-bytes-push.out_ratio", kind, rep, (sp1[0] - sp0[0]) / max(own, 1))
                log("  cairn/push/%d: %d changes of %d bytes, %d wire bytes: %.3f x" % (
                    rep, cb1[0] - cb0[0], cb1[1] - cb0[1], w1 - w0, (w1 - w0) / max(own, 1)))
                self.rec("cl-bytes-push.ratio", kind, rep, (w1 - w0) / max(own, 1))
                self.rec("cl-bytes-push.net_ratio", kind, rep,
                         (w1 - w0 - idle * secs) / max(own, 1))
                self.rec("cl-bytes-push.change_bytes", kind, rep,
                         (cb1[1] - cb0[1]) / max(cb1[0] - cb0[0], 1))
            else:
                puts = j["ok"] + j["errors_total"]
                own = puts * (n - 1) * (KEY_BYTES + VALUE_BYTES)
                log("  etcd/push/%d: %d puts, %d wire bytes: %.3f x key+value" % (
                    rep, puts, w1 - w0, (w1 - w0) / max(own, 1)))
                self.rec("cl-bytes-push.ratio", kind, rep, (w1 - w0) / max(own, 1))
                self.rec("cl-bytes-push.net_ratio", kind, rep,
                         (w1 - w0 - idle * secs) / max(own, 1))
        if kind != "cairn":
            for x in cls:
                x.close()
            return
        # the exchange after a partition {1} | {2, 3}
        for rep in range(1, self.a.reps + 1):
            self.settle(c, cls)
            c.cut([[0], list(range(1, n))])
            t0 = self.lg_async(c.endpoints[0], ["--workload", "load", "--keys",
                                                str(self.a.part_changes), "--clients", "8"],
                               120, "cairn/part-a/%d" % rep)
            t1 = self.lg_async(c.endpoints[1], ["--workload", "load", "--keys",
                                                str(self.a.part_changes), "--first-key", "0",
                                                "--clients", "8", "--key-size", "19"],
                               120, "cairn/part-b/%d" % rep)
            t0.join()
            t1.join()
            side = [cls[i] for i in range(1, n)]
            wait_for(lambda: all(x.heads() == side[0].heads() for x in side), 30, 0.05)
            before = [x.change_bytes() for x in cls]
            w0 = wire_bytes(c.proxies)
            c.heal()
            secs = self.settle(c, cls)
            w1 = wire_bytes(c.proxies)
            if secs is None:
                log("  cairn/partition/%d: no equal heads within 60 s" % rep)
                continue
            total = cls[0].change_bytes()
            own = sum(total[1] - b[1] for b in before)
            moved = sum(total[0] - b[0] for b in before)
            log("  cairn/partition/%d: %d changes moved, %d own bytes, %d wire bytes: %.3f x, "
                "equal heads %.2f s after heal" % (rep, moved, own, w1 - w0,
                                                   (w1 - w0) / max(own, 1), secs))
            self.rec("cl-bytes-partition.ratio", kind, rep, (w1 - w0) / max(own, 1))
        for x in cls:
            x.close()

    # ---- b
    def fig_b(self, c, kind):
        cls = self.clients(c)
        n = len(cls)
        pre, cut, post = 2.0, self.a.cut_s, self.a.cut_post_s
        for rep in range(1, self.a.reps + 1):
            self.settle(c, cls)
            lg = self.lg_async(c.endpoints[0], ["--workload", "a", "--rate", str(self.a.cut_rate),
                                                "--keys", str(self.a.keys), "--timeout", "1",
                                                "--seed", str(rep)],
                               pre + cut + post, "%s/cut/%d" % (kind, rep))
            time.sleep(pre)
            c.cut([[0], list(range(1, n))])
            t_cut = time.time()
            time.sleep(cut)
            # the marker: written on the side that can write, just before the heal
            writer, reader = (0, 1) if kind == "cairn" else (1, 0)
            marker = b"cut-marker-%d" % rep
            val = b"%d-%f" % (rep, time.time())
            try:
                cls[writer].put(marker, val, timeout=2)
            except grpc.RpcError as e:
                log("  %s/cut/%d: marker put failed: %s" % (kind, rep, e.code()))
            c.heal()
            t_heal = time.time()
            secs = wait_for(lambda: cls[reader].get_local(marker) == val, 60, 0.01)
            lg.join()
            j = lg.result
            eq = self.settle(c, cls)
            if not j:
                continue
            tl = j["timeline_by_slot"]
            # the slots (seconds of scheduled starts) wholly inside the cut
            ws = j["window_start_unix"]
            lo = int(math.ceil(t_cut - ws))
            hi = int(math.floor(t_heal - ws)) - 1
            ok = sum(tl["ok"][lo:hi + 1])
            err = sum(tl["errors"][lo:hi + 1])
            share = 100.0 * ok / max(ok + err, 1)
            log("  %s/cut/%d: %.1f%% of %d requests in slots %d..%d succeeded; heal -> other "
                "side has the marker %s s; equal heads %s; %s" % (
                    kind, rep, share, ok + err, lo, hi,
                    "%.3f" % secs if secs is not None else "never",
                    "yes" if eq is not None else "NO", self.summary(j)))
            self.rec("cl-cut.success_pct", kind, rep, share)
            if secs is not None:
                self.rec("cl-cut.heal_s", kind, rep, secs)
            if rep == 1:
                with open(os.path.join(self.dat, "cut.%s.dat" % kind), "w") as f:
                    f.write("# second ok errors success_pct mean_ms max_ms (cut %.2f..%.2f s "
                            "into the window)\n" % (t_cut - ws, t_heal - ws))
                    for s in range(len(tl["ok"])):
                        o, e = tl["ok"][s], tl["errors"][s]
                        f.write("%d %d %d %.1f %.3f %.3f\n" % (s, o, e, 100.0 * o / max(o + e, 1),
                                                              tl["mean_ms"][s], tl["max_ms"][s]))
                with open(os.path.join(self.dat, "cut.%s.window" % kind), "w") as f:
                    f.write("%.2f %.2f\n" % (t_cut - ws, t_heal - ws))
        for x in cls:
            x.close()

    # ---- e
    def fig_e(self, c, kind):
        for rep in range(1, self.a.reps + 1):
            ts = [self.lg_async(ep, ["--workload", "put", "--clients", str(self.a.agg_clients),
                                     "--keys", str(self.a.keys), "--seed", str(rep * 10 + i)],
                                self.a.duration, "%s/agg/%d/n%d" % (kind, rep, i + 1))
                  for i, ep in enumerate(c.endpoints)]
            for t in ts:
                t.join()
            if any(t.result is None for t in ts):
                continue
            tput = sum(t.result["throughput"] for t in ts)
            log("  %s/agg/%d: %.1f puts/s (%s)" % (kind, rep, tput, ", ".join(
                "%.0f" % t.result["throughput"] for t in ts)))
            self.rec("cl-agg-put.tput", kind, rep, tput)

    # ---- f
    def local_runs(self, ep, label, until, cap_s):
        """Consecutive 2 s open-loop put runs on ep until until() (or cap_s);
        returns (latencies merged from the runs' CDFs as [(ms, count)], ops)."""
        merged, ops, k = [], 0, 0
        t0 = time.monotonic()
        while True:
            k += 1
            cdf = os.path.join(self.work, "local.cdf")
            j = self.loadgen(ep, ["--workload", "put", "--rate", str(self.a.local_rate),
                                  "--keys", str(self.a.keys), "--seed", str(k)], 2,
                             "%s/%d" % (label, k), cdf)
            if j and os.path.exists(cdf):
                n = j["latency"]["all"]["count"]
                ops += n
                prev = 0.0
                with open(cdf) as f:
                    for line in f:
                        if line.startswith("#"):
                            continue
                        ms, frac = (float(x) for x in line.split()[:2])
                        merged.append((ms, (frac - prev) * n))
                        prev = frac
            if until() or time.monotonic() - t0 > cap_s:
                return merged, ops

    @staticmethod
    def pct(merged, p):
        tot = sum(c for _, c in merged)
        if tot <= 0:
            return math.nan
        acc = 0.0
        for ms, c in sorted(merged):
            acc += c
            if acc >= tot * p / 100.0:
                return ms
        return sorted(merged)[-1][0]

    @staticmethod
    def batch_hist(c, i):
        """cairn node i's group commits by size, {le: count} (not cumulative),
        or None (etcd, or no /metrics)."""
        if c.kind != "cairn":
            return None
        try:
            url = "http://%s/metrics" % c.c.node(i).endpoint
            with urllib.request.urlopen(url, timeout=5) as resp:
                lines = resp.read().decode().splitlines()
        except OSError:
            return None
        out, prev = {}, 0
        for ln in lines:
            m = re.match(r'cairn_store_batch_changes_bucket\{le="([^"]+)"\} (\S+)', ln)
            if m:
                cum = int(float(m.group(2)))
                out[m.group(1)] = cum - prev
                prev = cum
        return out or None

    def fig_f(self, c, kind):
        cls = self.clients(c)
        n = len(cls)
        cut_node = n - 1
        if kind == "etcd":
            c._not_leader(cut_node)
        self.settle(c, cls)
        idle, _ = self.local_runs(c.endpoints[cut_node], "%s/local-idle" % kind, lambda: False,
                                  self.a.idle_s)
        c.cut([[cut_node], [i for i in range(n) if i != cut_node]])
        t = time.monotonic()
        # the load: in runs of at most 200,000 keys (loadgen's 300 s cap)
        first, inserted = 0, 0
        while first < self.a.catchup_changes:
            end = min(first + 200000, self.a.catchup_changes)
            j = self.loadgen(c.endpoints[0], ["--workload", "load", "--keys", str(end),
                                              "--first-key", str(first), "--clients", "32",
                                              "--key-size", "20"], 290, "%s/catchup-load" % kind)
            if not j:
                break
            inserted += j["inserted"]
            if j["inserted"] < end - first:
                break
            first = end
        log("  %s: %d puts on node 1 in %.1f s while node %d was cut off" % (
            kind, inserted, time.monotonic() - t, cut_node + 1))
        marker, val = b"catchup-marker", b"%f" % time.time()
        cls[0].put(marker, val, timeout=10)
        b0 = self.batch_hist(c, cut_node)
        c.heal()
        t_heal = time.monotonic()
        done = {}

        def caught_up():
            if "t" not in done and cls[cut_node].get_local(marker) == val:
                done["t"] = time.monotonic() - t_heal
            return "t" in done
        poll = threading.Thread(target=lambda: wait_for(caught_up, self.a.catchup_cap_s, 0.05),
                                daemon=True)
        poll.start()
        during, ops = self.local_runs(c.endpoints[cut_node], "%s/local-catchup" % kind,
                                      lambda: "t" in done, self.a.catchup_cap_s)
        poll.join()
        p_idle, p_during = self.pct(idle, 99), self.pct(during, 99)
        b1 = self.batch_hist(c, cut_node)
        if b0 and b1:
            log("  %s: node %d group commits during the catch-up by size (le: count): %s" % (
                kind, cut_node + 1, ", ".join("%s: %d" % (le, b1[le] - b0.get(le, 0))
                                              for le in b1 if b1[le] - b0.get(le, 0))))
        log("  %s: catch-up of %d changes %s s; node %d local put p99 idle %.3f ms, during the "
            "catch-up %.3f ms (%d puts)" % (kind, inserted, "%.2f" % done["t"] if "t" in done
                                            else "> cap", cut_node + 1, p_idle, p_during, ops))
        self.rec("cl-catchup.changes", kind, 1, inserted)
        if "t" in done:
            self.rec("cl-catchup.seconds", kind, 1, done["t"])
        self.rec("cl-catchup.idle_p99", kind, 1, p_idle)
        self.rec("cl-catchup.during_p99", kind, 1, p_during)
        if kind == "cairn":
            eq = self.settle(c, cls, 120)
            log("  cairn: equal heads on every node %s" % ("yes" if eq is not None else "NO"))
        for x in cls:
            x.close()

    # ---- the run
    def run(self):
        a = self.a
        figs = a.figures
        for kind in a.systems:
            if "a" in figs:
                s = self.start(kind, 1)
                self.preload(s)
                self.fig_a(s, kind, "single")
                self.stop(s)
            # only figure a runs on clusters of other sizes than 3
            for n in [x for x in a.sizes if x == 3 or "a" in figs]:
                c = self.start(kind, n)
                self.preload(c)
                cls = self.clients(c)
                self.settle(c, cls)
                for x in cls:
                    x.close()
                if "a" in figs:
                    self.fig_a(c, kind, "n%d-0ms" % n)
                if n == 3:
                    if "c" in figs:
                        self.fig_c(c, kind, "0ms")
                    if "g" in figs:
                        self.fig_g(c, kind, "0ms")
                    if "d" in figs:
                        self.fig_d(c, kind)
                    if "b" in figs:
                        self.fig_b(c, kind)
                    if "e" in figs:
                        self.fig_e(c, kind)
                    if "f" in figs:
                        self.fig_f(c, kind)
                if a.delay_ms > 0 and ("a" in figs or (n == 3 and ("c" in figs or "g" in figs))):
                    c.delay(a.delay_ms)
                    if "a" in figs:
                        self.fig_a(c, kind, "n%d-%gms" % (n, a.delay_ms))
                    if "c" in figs and n == 3:
                        self.fig_c(c, kind, "%gms" % a.delay_ms)
                    if "g" in figs and n == 3:
                        time.sleep(0.5)   # the delay reaches bytes already queued
                        self.fig_g(c, kind, "%gms" % a.delay_ms)
                self.stop(c)
        self.raw.close()


# ----------------------------------------------------------------- report

def report(out, a):
    vals = {}
    with open(os.path.join(out, "raw.tsv")) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) == 4 and p[0].startswith("cl-"):
                try:
                    vals.setdefault((p[0], p[1]), []).append(float(p[3]))
                except ValueError:
                    pass

    def med(fig, s):
        return median(vals.get((fig, s), []))

    def fmt(x):
        if x is None or math.isnan(x):
            return "–"
        return "{:,.0f}".format(x) if abs(x) >= 100 else ("%.1f" % x if abs(x) >= 10
                                                          else "%.3f" % x)
    rows = []

    def add(label, e, k, ratio=None, target="", ok=None, count=False):
        if math.isnan(e) and math.isnan(k):
            return
        if ratio is None:
            ratio = k / e if e > 0 and k > 0 else math.nan   # NaN compares false
        verdict = "" if ok is None else (" met" if ok else " MISSED")
        f = (lambda x: "–" if math.isnan(x) else "{:,.0f}".format(x)) if count else fmt
        rows.append("| %s | %s | %s | %s | %s%s |" % (
            label, f(e), f(k), "–" if math.isnan(ratio) else "%.2f×" % ratio, target,
            verdict if target else ""))
    d = a.delay_ms
    for stat in ("p50", "p99"):
        e1, k1 = med("cl-a-single.%s" % stat, "etcd"), med("cl-a-single.%s" % stat, "cairn")
        add("YCSB A %d ops/s, single node, %s ms" % (a.rate, stat), e1, k1)
        for n in a.sizes:
            for case in ("n%d-0ms" % n, "n%d-%gms" % (n, d)):
                e, k = med("cl-a-%s.%s" % (case, stat), "etcd"), med("cl-a-%s.%s" % (case, stat),
                                                                      "cairn")
                r1 = k / k1 if k1 and not math.isnan(k1) and not math.isnan(k) else math.nan
                add("YCSB A %d ops/s, %d nodes, %s links, %s ms (ratio: cairn / its single "
                    "node)" % (a.rate, n, case.split("-")[1], stat), e, k, r1, "≤ 1.1×",
                    None if math.isnan(r1) else r1 <= 1.1)
    e, k = med("cl-cut.success_pct", "etcd"), med("cl-cut.success_pct", "cairn")
    add("client's node cut off %g s: requests in the cut that succeed, %%" % a.cut_s, e, k,
        math.nan, "cairn 100, etcd 0", None if math.isnan(k) else k >= 99.99)
    add("cut: heal → the other side holds the cut's writes, s (marker key)",
        med("cl-cut.heal_s", "etcd"), med("cl-cut.heal_s", "cairn"))
    for case in ("0ms", "%gms" % d):
        for stat in ("p50", "p99"):
            add("replication lag, put ack on node 1 → watch event on node 2, %s links, %s ms "
                "(negative: the event came first)" % (case, stat),
                med("cl-lag-%s.%s" % (case, stat), "etcd"),
                med("cl-lag-%s.%s" % (case, stat), "cairn"), math.nan)
        for stat in ("p50", "p99"):
            add("put sent on node 1 → watch event on node 2, %s links, %s ms" % (case, stat),
                med("cl-lag-%s.sent_%s" % (case, stat), "etcd"),
                med("cl-lag-%s.sent_%s" % (case, stat), "cairn"))
    for case in ("0ms", "%gms" % d):
        for stat in ("p50", "p99"):
            add("WaitReplicated n=1 (2 of 3 hold it), %s links: put ack on node 1 → it returns, "
                "%s ms" % (case, stat), math.nan,
                med("cl-wait-%s-n1.ack_%s" % (case, stat), "cairn"))
            add("WaitReplicated n=1, %s links: put sent → it returns (etcd: put sent → ack, a "
                "quorum holds it), %s ms" % (case, stat), med("cl-wait-%s.put_%s" % (case, stat),
                                                              "etcd"),
                med("cl-wait-%s-n1.sent_%s" % (case, stat), "cairn"))
            add("WaitReplicated n=2 (all 3 hold it), %s links: put ack on node 1 → it returns, "
                "%s ms" % (case, stat), math.nan,
                med("cl-wait-%s-n2.ack_%s" % (case, stat), "cairn"))
            add("WaitReplicated n=2, %s links: put sent → it returns, %s ms" % (case, stat),
                math.nan, med("cl-wait-%s-n2.sent_%s" % (case, stat), "cairn"))
    counts = {}     # (system, "samples" | "failed") -> sum over the settings
    for case in ("0ms", "%gms" % d):
        for s, figs in (("etcd", ["cl-wait-%s" % case]),
                        ("cairn", ["cl-wait-%s-n1" % case, "cl-wait-%s-n2" % case])):
            for fig in figs:
                for what in ("samples", "failed"):
                    x = med("%s.%s" % (fig, what), s)
                    if not math.isnan(x):
                        counts[(s, what)] = counts.get((s, what), 0) + x

    def calls(s):
        return counts.get((s, "samples"), 0) + counts.get((s, "failed"), 0)
    if counts:
        add("WaitReplicated figure: calls that failed (timeout %g s; cairn: put + "
            "WaitReplicated, of %d; etcd: put, of %d)" % (a.wait_timeout_ms / 1000.0,
                                                          calls("cairn"), calls("etcd")),
            counts.get(("etcd", "failed"), math.nan), counts.get(("cairn", "failed"), math.nan),
            math.nan, count=True)
    k = med("cl-bytes-push.ratio", "cairn")
    add("wire bytes per replicated change / its own bytes, steady push (etcd: per put per "
        "follower / key+value)", med("cl-bytes-push.ratio", "etcd"), k, math.nan, "≤ 1.2×",
        None if math.isnan(k) else k <= 1.2)
    add("the same, node 1's own sending only (its peers' answers left out)", math.nan,
        med("cl-bytes-push.out_ratio", "cairn"), math.nan)
    add("the same, less what the idle links carry in as long", med("cl-bytes-push.net_ratio",
        "etcd"), med("cl-bytes-push.net_ratio", "cairn"), math.nan)
    add("idle links (no writes), bytes/s over all peer links", med("cl-wire-idle.bytes_per_s",
        "etcd"), med("cl-wire-idle.bytes_per_s", "cairn"))
    add("cairn's change size in the push figure, bytes", math.nan,
        med("cl-bytes-push.change_bytes", "cairn"), math.nan)
    k = med("cl-bytes-partition.ratio", "cairn")
    add("wire bytes / own bytes, exchange after a partition with %d changes a side"
        % a.part_changes, math.nan, k, math.nan, "≤ 1.2×", None if math.isnan(k) else k <= 1.2)
    add("aggregate put throughput, 3 nodes, %d clients on every node, ops/s" % a.agg_clients,
        med("cl-agg-put.tput", "etcd"), med("cl-agg-put.tput", "cairn"))
    add("catch-up: changes made while node 3 was cut off", med("cl-catchup.changes", "etcd"),
        med("cl-catchup.changes", "cairn"))
    add("catch-up time, heal → node 3 has them, s", med("cl-catchup.seconds", "etcd"),
        med("cl-catchup.seconds", "cairn"))
    add("node 3 local put p99 (%d ops/s), idle, ms" % a.local_rate,
        med("cl-catchup.idle_p99", "etcd"), med("cl-catchup.idle_p99", "cairn"))
    ki, kd = med("cl-catchup.idle_p99", "cairn"), med("cl-catchup.during_p99", "cairn")
    r = kd / ki if ki and not math.isnan(ki) and not math.isnan(kd) else math.nan
    add("node 3 local put p99 during the catch-up, ms (ratio: cairn / its idle)",
        med("cl-catchup.during_p99", "etcd"), kd, r, "≤ 2×", None if math.isnan(r) else r <= 2)
    md = ["## cluster", "",
          "Medians of %d runs (the catch-up rows: one run; the WaitReplicated rows: one run of "
          "%d samples a row, one client on node 1 (an etcd follower), a put every %g ms, cairn's "
          "alternating n=1 and n=2, in-process Python gRPC); ratio = cairn/etcd unless the row "
          "says otherwise. Peer links "
          "through tests/integration/netproxy.py (Python, one process) for both systems; "
          "nothing pinned. %s" % (a.reps, a.wait_samples, a.wait_period_ms,
                                  "QUICK: a smoke run, not a measurement." if a.quick
                                  else ""), "",
          "| figure | etcd | cairn | ratio | target |", "|---|---:|---:|---:|---|"] + rows
    if os.path.exists(os.path.join(out, "cluster-cut.png")):
        md += ["", "![latency and success during the cut](cluster-cut.png)"]
    with open(os.path.join(out, "cluster.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def plot(out):
    d = os.path.join(out, "cluster")
    e, k = os.path.join(d, "cut.etcd.dat"), os.path.join(d, "cut.cairn.dat")
    if not (os.path.exists(e) and os.path.exists(k)):
        return
    try:
        with open(os.path.join(d, "cut.cairn.window")) as f:
            c0, c1 = f.read().split()
        with open(os.path.join(d, "cut.etcd.window")) as f:
            e0, e1 = f.read().split()
    except (OSError, ValueError):
        c0, c1, e0, e1 = "2", "7", "2", "7"
    script = """set terminal pngcairo size 1000,700 noenhanced
set output '%s'
set multiplot layout 2,1 title 'client node cut off from its peers (shaded: cairn %s-%s s, etcd %s-%s s), YCSB A open loop'
set object 1 rect from %s, graph 0 to %s, graph 1 fillcolor rgb '#eeeeee' behind
set xrange [0:*]
set ylabel 'latency of ok requests (ms, log)'
set logscale y
set grid
set key outside right top
plot '%s' using 1:5 with linespoints lc rgb '#d62728' title 'etcd mean', \\
     '%s' using 1:6 with lines dt 2 lc rgb '#d62728' title 'etcd max', \\
     '%s' using 1:5 with linespoints lc rgb '#1f77b4' title 'cairn mean', \\
     '%s' using 1:6 with lines dt 2 lc rgb '#1f77b4' title 'cairn max'
unset logscale y
set ylabel 'requests that succeed (%%)'
set xlabel 'second of the run (by scheduled start)'
set yrange [-5:105]
plot '%s' using 1:4 with linespoints lw 2 lc rgb '#d62728' title 'etcd', \\
     '%s' using 1:4 with linespoints lw 2 lc rgb '#1f77b4' title 'cairn'
unset multiplot
""" % (os.path.join(out, "cluster-cut.png"), c0, c1, e0, e1, c0, c1, e, e, k, k, e, k)
    try:
        subprocess.run(["gnuplot"], input=script.encode(), check=True, timeout=60)
        log("plot: cluster-cut.png")
    except (OSError, subprocess.SubprocessError) as ex:
        log("plot failed: %s" % ex)


CLUSTER_BEGIN = "<!-- cluster: scripts/bench.sh --parts cluster rewrites it after a full run -->"
CLUSTER_END = "<!-- end of cluster -->"


def write_latest(path, out, commit):
    """Puts this run's cluster table, with its link, between the cluster
    marks of LATEST.md (added before "## The runs" when missing)."""
    rel = os.path.relpath(out, os.path.dirname(os.path.abspath(path)))
    table = open(os.path.join(out, "cluster.md")).read().split("\n", 2)[2]
    table = table.replace("](cluster-cut.png)", "](%s/cluster-cut.png)" % rel)
    body = ("%s\n## Cluster\n\nNewest cluster run: [%s/results.md](%s/results.md), commit %s "
            "(`scripts/bench.sh --parts cluster`).\n\n%s%s" % (CLUSTER_BEGIN, rel, rel, commit,
                                                               table, CLUSTER_END))
    text = open(path).read() if os.path.exists(path) else "# Latest benchmark results\n"
    if CLUSTER_BEGIN in text and CLUSTER_END in text:
        head, rest = text.split(CLUSTER_BEGIN, 1)
        text = head + body + rest.split(CLUSTER_END, 1)[1]
    elif "\n## The runs" in text:
        head, rest = text.split("\n## The runs", 1)
        text = head + "\n" + body + "\n\n## The runs" + rest
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cairn")
    ap.add_argument("--etcd")
    ap.add_argument("--loadgen")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--load-pin", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--figures", default="abcdefg")
    ap.add_argument("--sizes", default="3 5")
    ap.add_argument("--systems", default="etcd cairn",
                    help="which systems to run, e.g. 'cairn' (figure f alone: --figures f "
                         "--systems cairn)")
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--delay-ms", type=float, default=10)
    ap.add_argument("--cut-s", type=float, default=5)
    ap.add_argument("--cut-post-s", type=float, default=4)
    ap.add_argument("--cut-rate", type=int, default=1000)
    ap.add_argument("--lag-count", type=int, default=200)
    ap.add_argument("--push-s", type=float, default=2)
    ap.add_argument("--part-changes", type=int, default=1000)
    ap.add_argument("--agg-clients", type=int, default=32)
    ap.add_argument("--catchup-changes", type=int, default=200000)
    ap.add_argument("--catchup-cap-s", type=float, default=300)
    ap.add_argument("--local-rate", type=int, default=200)
    ap.add_argument("--idle-s", type=float, default=4)
    ap.add_argument("--wait-samples", type=int, default=300)
    ap.add_argument("--wait-period-ms", type=float, default=40)
    ap.add_argument("--wait-timeout-ms", type=float, default=5000)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--latest", help="also put the table into this LATEST.md")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    a.sizes = [int(x) for x in a.sizes.split()]
    a.systems = a.systems.split()
    if not a.systems or any(x not in ("etcd", "cairn") for x in a.systems):
        ap.error("--systems: a list of etcd and cairn")
    if a.latest:
        write_latest(a.latest, a.out, a.commit)
        return 0
    if a.report_only:
        plot(a.out)
        report(a.out, a)
        return 0
    if not (a.cairn and a.etcd and a.loadgen):
        ap.error("--cairn, --etcd and --loadgen are needed for a run")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    b = Bench(a)
    t0 = time.monotonic()
    try:
        b.run()
    finally:
        b.close()
        subprocess.run(["rm", "-rf", b.work])
    log("cluster: %.0f s" % (time.monotonic() - t0))
    plot(a.out)
    report(a.out, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
