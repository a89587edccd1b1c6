#!/usr/bin/python3
"""How long a new member takes to join a running cairn cluster, and what it
receives for it (issue 12).

Starts --nodes cairn processes on 127.0.0.1 (a full mesh, no proxies),
loads --keys keys into the first with cairn-loadgen's `load` workload
(18-byte keys, 32-byte values, one Put per change, runs of --chunk keys),
waits until every node holds the same heads, then adds a member
(`etcdctl member add join --peer-urls=...`) and starts it with
--initial-cluster-state existing on an empty data dir. Reports:

- join time: from the joiner's spawn until it answers a linearizable get
  (it serves clients only once it caught up), and the catch-up time the
  joiner logs itself ("joined: caught up with ... in X s");
- bytes: what the joiner received on its peer streams (the sum of its
  cairn_peer_received_bytes_total, every peer) over the changes' own bytes
  (its cairn_store_change_bytes_total: the canonical encoding of every
  change it wrote, i.e. the whole history);
- that the joiner ends with the cluster's heads and key count.

Bounded: every wait has a deadline and --max-seconds caps the run. Only the
processes it started are stopped, by pid.

Usage: join_bench.py --cairn build/cairn --loadgen build/cairn-loadgen \\
           [--keys 1000000] [--nodes 3]
"""

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from ports import free_port  # noqa: E402

procs = []


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def wait(pred, timeout, step=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return True
        except Exception:  # noqa: BLE001  not answering yet
            pass
        time.sleep(step)
    return False


class Node:
    def __init__(self, work, name, cairn):
        self.name = name
        self.cairn = cairn
        self.cport, self.pport = free_port(), free_port()
        self.dir = os.path.join(work, name)
        self.log_path = os.path.join(work, name + ".log")
        self.proc = None

    @property
    def curl(self):
        return "http://127.0.0.1:%d" % self.cport

    @property
    def purl(self):
        return "http://127.0.0.1:%d" % self.pport

    def start(self, initial_cluster, state, token):
        self.proc = subprocess.Popen(
            [self.cairn, "--name", self.name, "--data-dir", self.dir,
             "--listen-client-urls", self.curl, "--advertise-client-urls", self.curl,
             "--listen-peer-urls", self.purl, "--initial-advertise-peer-urls", self.purl,
             "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
             "--initial-cluster-token", token],
            stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(self.proc)

    def ctl(self, *args, timeout=30):
        return subprocess.run(["etcdctl", "--endpoints=127.0.0.1:%d" % self.cport,
                               "--command-timeout=10s"] + list(args),
                              capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, ETCDCTL_API="3"))

    def serving(self):
        return self.ctl("get", "probe", timeout=15).returncode == 0

    def metric(self, prefix):
        with urllib.request.urlopen(self.curl + "/metrics", timeout=10) as r:
            lines = r.read().decode().splitlines()
        return sum(float(x.split()[-1]) for x in lines if x.startswith(prefix))

    def heads(self, cairnctl):
        r = subprocess.run([cairnctl, "--endpoints=127.0.0.1:%d" % self.cport, "heads"],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.split() if r.returncode == 0 else None

    def keys(self):
        """Keys under "k" (the load's), by the JSON gateway's count_only."""
        body = json.dumps({"key": base64.b64encode(b"k").decode(),
                           "range_end": base64.b64encode(b"l").decode(),
                           "count_only": True}).encode()
        with urllib.request.urlopen(self.curl + "/v3/kv/range", body, timeout=60) as r:
            return int(json.loads(r.read()).get("count", 0))

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cairn", default="build/cairn")
    ap.add_argument("--loadgen", default="build/cairn-loadgen")
    ap.add_argument("--cairnctl", default="build/cairnctl")
    ap.add_argument("--keys", type=int, default=1000000)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=200000)
    ap.add_argument("--max-seconds", type=int, default=3600)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(SystemExit("time cap")))
    signal.alarm(a.max_seconds)
    work = a.workdir or tempfile.mkdtemp(prefix="cairn-join-bench-")
    os.makedirs(work, exist_ok=True)
    token = "join-bench-%d" % os.getpid()
    nodes = [Node(work, "n%d" % (i + 1), a.cairn) for i in range(a.nodes)]
    joiner = Node(work, "join", a.cairn)
    try:
        ic = ",".join("%s=%s" % (n.name, n.purl) for n in nodes)
        for n in nodes:
            n.start(ic, "new", token)
        if not all(wait(n.serving, 60) for n in nodes):
            raise SystemExit("the cluster did not start")
        t0 = time.monotonic()
        first = 0
        while first < a.keys:
            end = min(first + a.chunk, a.keys)
            r = subprocess.run([a.loadgen, "--endpoint", "127.0.0.1:%d" % nodes[0].cport,
                                "--workload", "load", "--keys", str(end), "--first-key", str(first),
                                "--clients", "64", "--duration", "300", "--timeout", "10"],
                               capture_output=True, text=True, timeout=400)
            line = [x for x in r.stdout.splitlines() if x.startswith("load:")]
            log("load %d..%d: %s" % (first, end - 1, line[0] if line else r.stdout[-300:]))
            if r.returncode != 0 or not line or "INCOMPLETE" in line[0]:
                raise SystemExit("the load failed")
            first = end
        log("loaded %d keys in %.1f s" % (a.keys, time.monotonic() - t0))
        ok = wait(lambda: len({tuple(n.heads(a.cairnctl) or ()) for n in nodes}) == 1, 900, 1.0)
        log("the %d nodes %s equal heads" % (a.nodes, "hold" if ok else "do NOT hold"))
        r = nodes[0].ctl("member", "add", joiner.name, "--peer-urls=" + joiner.purl)
        log("member add: %s" % (r.stdout.splitlines()[0] if r.returncode == 0 else r.stderr))
        if r.returncode != 0:
            raise SystemExit("member add failed")
        ic += ",%s=%s" % (joiner.name, joiner.purl)
        t0 = time.monotonic()
        joiner.start(ic, "existing", token)
        ok = wait(joiner.serving, 1800, 0.05)
        t_serve = time.monotonic() - t0
        if not ok:
            raise SystemExit("the joiner did not serve within 1800 s")
        caught = [x for x in open(joiner.log_path, errors="replace").read().splitlines()
                  if "joined: caught up" in x]
        rx = joiner.metric("cairn_peer_received_bytes_total")
        own = joiner.metric("cairn_store_change_bytes_total")
        nch = joiner.metric("cairn_store_changes_total")
        same = wait(lambda: joiner.heads(a.cairnctl) == nodes[0].heads(a.cairnctl), 120, 0.5)
        keys = joiner.keys()
        print()
        print("join_bench: %d nodes holding %d keys (%d changes on the joiner)"
              % (a.nodes, a.keys, nch))
        print("join_bench: serving %.2f s after its spawn; %s"
              % (t_serve, caught[0].split("INFO ")[-1] if caught else "no catch-up line"))
        print("join_bench: received %.0f bytes on its peer streams for %.0f bytes of changes: "
              "%.3fx" % (rx, own, rx / own if own else float("nan")))
        print("join_bench: heads %s the first node's; %d keys" % ("equal to" if same else
                                                                   "DIFFERENT from", keys))
        return 0 if same and keys == a.keys else 1
    finally:
        for n in nodes + [joiner]:
            n.stop()
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
