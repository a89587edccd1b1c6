#!/usr/bin/python3
"""A partial mesh (--peer-links): N cairn processes in a line
n1 - n2 - ... - nN (default 4), each linked to its neighbours only, on the
harness of cluster.py (a netproxy on every directed peer link).

- The links are the line's: no byte crosses the proxy of a pair that is not
  linked (neither side dials the other).
- Relay: a put on one end is read on the other end through N-2 relaying
  nodes; the delay (put acknowledged to value read, polled every 2 ms) is
  printed for each direction, p50 and max over ROUNDS puts, and bounded.
- member list on every node names every member with its client URLs (also
  those it has no link to), and endpoint status / health --cluster through
  n1 answer for all N.
- Writers on both ends at once (shared and distinct keys): every node ends
  with equal heads and an equal key space.
- n2 killed with SIGKILL: n1 and n3 keep serving (puts and gets answer); a
  put on n1 does not reach n3 while n2 is down (n1's only path to n3 is
  n2), and after n2's restart every node converges, n1's put included.

--shape star: the same with n2 as the hub and every other node a spoke
(n2's death then leaves every spoke alone).

Usage: test_cluster_mesh.py --cairn build/cairn [--nodes N] [--shape star]
Needs the peer transport and --peer-links (exit 77, skipped, otherwise).
"""

import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster as clusterlib  # noqa: E402
from verdict import check, failures, finish  # noqa: E402

SKIP = 77
ROUNDS = 20
RELAY_BOUND_S = 3.0     # per put, end to end (a loaded CI machine)
CONVERGE_S = 60


def wait_value(c, n, key, value, timeout):
    """Seconds until node n reads value at key (polled every 2 ms), or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if c.get(n, key) == value:
            return time.monotonic() - t0
        time.sleep(0.002)
    return None


def relay_delays(c, src, dst, tag):
    out = []
    for i in range(ROUNDS):
        key = b"relay/%s/%d" % (tag, i)
        value = b"v%d" % i
        c.put(src, key, value)
        d = wait_value(c, dst, key, value, RELAY_BOUND_S * 3)
        out.append(d)
    return out


def summary(ds):
    got = sorted(d for d in ds if d is not None)
    if not got:
        return "none arrived"
    return "p50 %.1f ms, max %.1f ms, %d/%d arrived" % (
        got[len(got) // 2] * 1000, got[-1] * 1000, len(got), len(ds))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--shape", choices=("line", "star"), default="line",
                    help="star: n2 is the hub, every other node a spoke")
    args = ap.parse_args()
    n = args.nodes
    if n < 3:
        ap.error("--nodes must be at least 3 (a line with a middle)")
    helptext = clusterlib.help_text(args.cairn)
    if "--peer-links" not in helptext or "--experimental-peer-dial" not in helptext:
        print("SKIP: this cairn has no --peer-links or --experimental-peer-dial")
        return SKIP
    if args.shape == "line":
        links = [(i, i + 1) for i in range(n - 1)]
    else:
        links = [(1, i) for i in range(n) if i != 1]
    with clusterlib.Cluster(args.cairn, n, links=links) as c:
        last = n - 1
        # ---- relay along the line, each way
        fwd = relay_delays(c, 0, last, b"fwd")
        back = relay_delays(c, last, 0, b"back")
        hops = n - 1 if args.shape == "line" else 2
        print("relay n1 -> n%d (%d hops): %s" % (n, hops, summary(fwd)))
        print("relay n%d -> n1 (%d hops): %s" % (n, hops, summary(back)))
        for name, ds in (("n1->n%d" % n, fwd), ("n%d->n1" % n, back)):
            check(all(d is not None for d in ds), "%s: every put arrives" % name)
            check(all(d is None or d < RELAY_BOUND_S for d in ds),
                  "%s: every put arrives within %.0f s" % (name, RELAY_BOUND_S))

        # ---- only the line's links carry bytes
        for (a, b), p in c.proxies.items():
            st = p.stats()
            moved = sum(sum(v.values()) for v in st["bytes"].values())
            linked = b in c.links[a]
            if not linked:
                check(st["accepted"] == 0 and moved == 0,
                      "no link n%d->n%d: its proxy accepted %d connections, %d bytes"
                      % (a + 1, b + 1, st["accepted"], moved))

        # ---- member list on every node names every member's client URLs,
        # also of members it has no link to (Members messages relay them)
        want = {x.name: ["http://" + x.endpoint] for x in c.nodes}
        for node in c.nodes:
            deadline = time.monotonic() + 20
            while True:
                ms = node.json("member", "list").get("members", [])
                got = {m.get("name"): sorted(m.get("clientURLs", [])) for m in ms}
                if got == want or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            check(got == want, "%s: member list names every member's client URLs: %r"
                  % (node.name, got))
        for what in ("status", "health"):
            r = c.nodes[0].etcdctl("endpoint", what, "--cluster", "-w", "json", check=False)
            try:
                got = json.loads(r.stdout)
            except ValueError:
                got = []
            check(r.returncode == 0 and len(got) == n,
                  "n1: endpoint %s --cluster answers for all %d members: rc %d, %r"
                  % (what, n, r.returncode, r.stdout[:300]))

        # ---- writers on both ends at once
        errors = []

        def writer(node, tag):
            try:
                for i in range(150):
                    c.put(node, b"end/%s/%d" % (tag, i), b"x%d" % i)
                    c.put(node, b"shared/%d" % (i % 10), b"%s-%d" % (tag, i))
            except Exception as e:  # noqa: BLE001  reported below
                errors.append("%s: %r" % (tag, e))
        ws = [threading.Thread(target=writer, args=(0, b"a")),
              threading.Thread(target=writer, args=(last, b"z"))]
        for w in ws:
            w.start()
        for w in ws:
            w.join(120)
        check(not errors, "writers on both ends: %s" % errors)
        ok, rep = c.converge(CONVERGE_S)
        print("after writers on both ends: %s" % rep)
        check(ok, "the line converges after writes on both ends: %s" % rep)

        # ---- the middle n2 killed: n1 and n3 keep serving, apart
        c.kill9(1)
        t0 = time.monotonic()
        try:
            c.put(0, b"down/n1", b"1")
            c.put(2, b"down/n3", b"3")
            check(c.get(0, b"down/n1") == b"1", "n1 reads its own put with n2 down")
            check(c.get(2, b"down/n3") == b"3", "n3 reads its own put with n2 down")
        except Exception as e:  # noqa: BLE001
            check(False, "n1 and n3 serve with n2 down: %r" % e)
        time.sleep(1.0)
        check(c.get(2, b"down/n1") is None,
              "n1's put does not reach n3 while n2 (its only path) is down")
        print("served with n2 down in %.2f s" % (time.monotonic() - t0))
        c.restart(1)
        ok, rep = c.converge(CONVERGE_S)
        print("after n2's restart: %s" % rep)
        check(ok, "the line converges after n2's restart: %s" % rep)
        for i in range(n):
            check(c.get(i, b"down/n1") == b"1" and c.get(i, b"down/n3") == b"3",
                  "n%d has both puts made while n2 was down" % (i + 1))
        if failures:
            print(clusterlib.logs(c))
    return finish("OK")


if __name__ == "__main__":
    sys.exit(main())
