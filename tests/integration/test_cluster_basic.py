#!/usr/bin/python3
"""Three real cairn processes on 127.0.0.1 that name each other in
--initial-cluster replicate (server/peer): a put on node 1 is read on nodes
2 and 3 within a bound; writes on all three at once (distinct keys and
shared ones) end in equal heads (cairnpb.Replication/Heads), an equal key
space (key -> value; revisions are local to a node) and an equal HashKV
hash (cairn's HashKV hashes keys, values and leases, not revisions: the
header's revision and the compact revision may differ, the hash may not);
a node killed with SIGKILL while the others write catches up after its
restart; a watch on node 2 sees a put made on node 1 exactly once; member
list on any node names all three with their peer and client URLs; endpoint
status and health answer on each, and with --cluster on all three through
one; each port serves only its own services; a garbage peer message and a
node of another cluster are refused with a log line.

Usage: test_cluster_basic.py --cairn build/cairn
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from system_python import grpc  # noqa: E402
from procs import Server  # noqa: E402
from verdict import check, failures, finish  # noqa: E402
import wire  # noqa: E402

CONVERGE_S = 20  # bound on every wait for replication


def heads(node):
    """The node's heads (HeadsResponse field 1), sorted."""
    with grpc.insecure_channel(node.endpoint) as ch:
        raw = ch.unary_unary("/cairnpb.Replication/Heads")(b"", timeout=5)
    return sorted(bytes(h) for h in wire.decode(raw).get(1, []))


def keyspace(node):
    out = node.json("get", "", "--from-key")
    return sorted((kv["key"], kv.get("value", "")) for kv in out.get("kvs", []))


def hashkv(node):
    out = node.json("endpoint", "hashkv")
    return out[0]["HashKV"]["hash"]


def wait_converged(nodes, what):
    deadline = time.time() + CONVERGE_S
    while time.time() < deadline:
        hs = [heads(n) for n in nodes]
        if all(h == hs[0] for h in hs) and hs[0]:
            break
        time.sleep(0.1)
    else:
        check(False, "%s: heads equal within %ds" % (what, CONVERGE_S))
        return
    ks = [keyspace(n) for n in nodes]
    check(all(k == ks[0] for k in ks), "%s: equal key spaces" % what)
    hk = [hashkv(n) for n in nodes]
    check(all(h == hk[0] for h in hk), "%s: equal HashKV (%s)" % (what, hk))


def wait_value(node, key, value):
    deadline = time.time() + CONVERGE_S
    while time.time() < deadline:
        r = node.etcdctl("get", key, "--print-value-only")
        if r.stdout.decode().strip() == value:
            return True
        time.sleep(0.05)
    return False


def writer(node, prefix, n, errors):
    try:
        for i in range(n):
            node.etcdctl("put", "%s-%03d" % (prefix, i), "v%d" % i)
            if i % 5 == 0:
                node.etcdctl("put", "shared-%d" % (i % 3), "%s-%d" % (node.name, i))
    except Exception as e:  # noqa: BLE001  reported as a check
        errors.append(str(e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    args = ap.parse_args()
    nodes = [Server("cairn", args.cairn, name="n%d" % i) for i in (1, 2, 3)]
    cluster = ",".join("%s=http://127.0.0.1:%d" % (n.name, n.peer_port) for n in nodes)
    for n in nodes:
        n.extra = ["--initial-cluster", cluster, "--sync-interval-ms", "50"]
    watch = None
    try:
        for n in nodes:
            n.start()
        n1, n2, n3 = nodes

        # member list on any node names all three once they said hello
        deadline = time.time() + CONVERGE_S
        members = []
        while time.time() < deadline:
            members = n3.json("member", "list")["members"]
            if all(m.get("clientURLs") for m in members):
                break
            time.sleep(0.1)
        want = sorted((n.name, "http://127.0.0.1:%d" % n.peer_port,
                       "http://127.0.0.1:%d" % n.client_port) for n in nodes)
        got = sorted((m.get("name"), m["peerURLs"][0], (m.get("clientURLs") or [""])[0])
                     for m in members)
        check(got == want, "member list: %s, want %s" % (got, want))
        st = n1.json("endpoint", "status", "--cluster")
        check(sorted(e["Endpoint"] for e in st) ==
              sorted("http://%s" % n.endpoint for n in nodes),
              "endpoint status --cluster reaches all three: %s" % [e["Endpoint"] for e in st])
        r = n2.etcdctl("endpoint", "health", "--cluster", check=False)
        check(r.returncode == 0 and (r.stdout + r.stderr).count(b"is healthy") == 3,
              "endpoint health --cluster: %r" % (r.stdout + r.stderr))
        for n in nodes:
            st = n.json("endpoint", "status")
            check(st and st[0]["Status"]["header"]["member_id"] > 0, "endpoint status " + n.name)
            r = n.etcdctl("endpoint", "health", check=False)
            check(r.returncode == 0 and b"is healthy" in r.stderr + r.stdout,
                  "endpoint health " + n.name)
        # /metrics on the client URL: one cairn_peer_* sample per other member
        with urllib.request.urlopen("http://%s/metrics" % n1.endpoint, timeout=10) as resp:
            text = resp.read().decode()
        for other in ("n2", "n3"):
            line = 'cairn_peer_connected{peer="%s"} 1' % other
            check(line in text.splitlines(), "/metrics on n1 has %r" % line)
            sent = [ln for ln in text.splitlines()
                    if ln.startswith('cairn_peer_sent_bytes_total{peer="%s"} ' % other)]
            check(len(sent) == 1 and int(sent[0].split()[-1]) > 0,
                  "/metrics on n1 counts bytes sent to %s: %s" % (other, sent))

        # each port serves its own services only; a peer message that does
        # not decode resets that stream and the node goes on serving
        peer1 = "127.0.0.1:%d" % n1.peer_port
        with grpc.insecure_channel(peer1) as ch:
            try:
                ch.unary_unary("/etcdserverpb.KV/Range")(b"\x0a\x01a", timeout=5)
                check(False, "the peer port serves etcd's KV")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.UNIMPLEMENTED,
                      "KV on the peer port: %s" % e.code())
            try:
                list(ch.stream_stream("/cairnpb.Peer/Stream")(iter([b"\xff\xff\xff"]),
                                                              timeout=5))
                check(False, "a garbage peer message was accepted")
            except grpc.RpcError as e:
                check(e.code() != grpc.StatusCode.OK, "garbage peer message: %s" % e.code())
        with grpc.insecure_channel(n1.endpoint) as ch:
            try:
                list(ch.stream_stream("/cairnpb.Peer/Stream")(iter([b""]), timeout=5))
                check(False, "the client port serves cairnpb.Peer")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.UNIMPLEMENTED,
                      "Peer on the client port: %s" % e.code())
        check("does not decode" in n1.read_log(), "n1 logs the garbage peer message")
        check(n1.etcdctl("put", "still", "serving").returncode == 0,
              "n1 serves clients after a bad peer message")

        # a node of another cluster (another token) is refused with a log
        # line that says why
        stranger = Server("cairn", args.cairn, name="x")
        stranger.extra = ["--initial-cluster-token", "another",
                          "--initial-cluster", "x=http://127.0.0.1:%d,n1=http://127.0.0.1:%d"
                          % (stranger.peer_port, n1.peer_port)]
        try:
            stranger.start()
            deadline = time.time() + CONVERGE_S
            while (time.time() < deadline
                   and "refused: member x is in cluster" not in n1.read_log()):
                time.sleep(0.1)
            log = n1.read_log()
            check("refused: member x is in cluster" in log, "n1 refuses another cluster")
            check(stranger.etcdctl("get", "watched").stdout == b"", "nothing crossed to x")
        finally:
            stranger.cleanup()

        # a watch on node 2 before the put on node 1
        env = dict(os.environ, ETCDCTL_API="3")
        watch = subprocess.Popen(["etcdctl", "--endpoints=" + n2.endpoint, "watch", "watched"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        time.sleep(1.0)
        t0 = time.time()
        n1.etcdctl("put", "watched", "from-n1")
        check(wait_value(n2, "watched", "from-n1"), "put on n1 read on n2")
        check(wait_value(n3, "watched", "from-n1"), "put on n1 read on n3")
        print("put on n1 -> read on n2 and n3: %.2f s" % (time.time() - t0))

        # writes on all three at once
        errors = []
        ths = [threading.Thread(target=writer, args=(n, n.name, 30, errors)) for n in nodes]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        check(not errors, "concurrent writes: %s" % errors[:1])
        wait_converged(nodes, "after concurrent writes")
        check(len(keyspace(n1)) == 2 + 3 * 30 + 3, "key count after concurrent writes")

        # the watch saw the put exactly once (the later writes are other keys)
        time.sleep(0.5)
        watch.send_signal(signal.SIGTERM)
        out = watch.communicate(timeout=10)[0].decode()
        watch = None
        check(out.split("\n").count("watched") == 1 and out.count("from-n1") == 1,
              "watch on n2 saw n1's put exactly once: %r" % out)

        # kill -9 one node, write on the others, restart it
        n3.stop(signal.SIGKILL)
        for i in range(20):
            n1.etcdctl("put", "while-down-%02d" % i, "n1")
            n2.etcdctl("put", "while-down-%02d" % (i + 20), "n2")
        n2.etcdctl("put", "shared-0", "after-kill")
        n3.start()
        wait_converged(nodes, "after kill -9 and restart")
        check(wait_value(n3, "shared-0", "after-kill"), "restarted n3 has the last shared-0")

        for n in nodes:
            rc = n.stop()
            check(rc == 0, "%s exits 0 on SIGTERM (got %s)" % (n.name, rc))
    finally:
        if watch is not None:
            watch.kill()
            watch.wait()
        for n in nodes:
            if failures:
                print("---- %s log ----\n%s" % (n.name, n.read_log()))
            n.cleanup()
    return finish("test_cluster_basic: all checks passed")


if __name__ == "__main__":
    sys.exit(main())
