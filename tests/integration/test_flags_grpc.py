#!/usr/bin/python3
"""etcd's gRPC flags on the client links, cairn beside etcd with the same
client (issue 13):

- --max-concurrent-streams 2: with two Watch streams open on one
  connection a Range waits (its deadline passes) on both servers; once a
  watch is cancelled the Range is answered.
- --grpc-keepalive-min-time: a client pinging every second with a watch
  open is sent GOAWAY (too_many_pings) after its strikes when the minimum is
  10s, and is left alone at 300ms (gRPC core's default would be 5 minutes).
- --grpc-keepalive-interval / --grpc-keepalive-timeout 1s: once the
  client's bytes stop reaching the server (netproxy blackholes that way),
  the server's unanswered ping closes the connection within seconds; at the
  defaults (2h) the watch lives to its deadline.

Each case runs on etcd and cairn at once; every outcome is compared with
etcd's and with the expected one.

Usage: test_flags_grpc.py --cairn build/cairn --etcd /usr/bin/etcd
"""

import argparse
import concurrent.futures
import os
import queue
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from system_python import grpc  # noqa: E402
from procs import Server  # noqa: E402
from netproxy import Proxy  # noqa: E402
from verdict import check, finish  # noqa: E402

from etcd3.etcdrpc import rpc_pb2 as pb  # noqa: E402
from etcd3.etcdrpc import rpc_pb2_grpc as stubs  # noqa: E402


def watch(stub, timeout=None):
    """A Watch stream on |stub|'s channel with one watcher created."""
    q = queue.Queue()
    q.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"a")))
    call = stub.Watch(iter(q.get, None), timeout=timeout)
    first = next(call)
    return call, q, first.created


def until_end(call):
    """(status code name, seconds) once |call| ends."""
    t = time.time()
    try:
        for _ in call:
            pass
        return "OK", time.time() - t
    except grpc.RpcError as e:
        return e.code().name, time.time() - t


def streams(kind, binary):
    srv = Server(kind, binary, extra=["--max-concurrent-streams", "2"])
    srv.start()
    try:
        ch = grpc.insecure_channel(srv.endpoint)
        kv, w = stubs.KVStub(ch), stubs.WatchStub(ch)
        kv.Put(pb.PutRequest(key=b"a", value=b"1"), timeout=10)
        calls = [watch(w) for _ in range(2)]
        out = {"created": all(c[2] for c in calls)}
        try:
            kv.Range(pb.RangeRequest(key=b"a"), timeout=2)
            out["range, two streams open"] = "OK"
        except grpc.RpcError as e:
            out["range, two streams open"] = e.code().name
        calls[0][0].cancel()
        time.sleep(0.3)
        try:
            r = kv.Range(pb.RangeRequest(key=b"a"), timeout=5)
            out["range, one stream open"] = r.kvs[0].value.decode()
        except grpc.RpcError as e:
            out["range, one stream open"] = e.code().name
        calls[1][0].cancel()
        ch.close()
        return out
    finally:
        srv.stop()
        srv.cleanup()


# A client that pings every second, with or without calls.
PINGING = [("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 5000),
           ("grpc.http2.max_pings_without_data", 0),
           ("grpc.http2.min_time_between_pings_ms", 1000),
           ("grpc.keepalive_permit_without_calls", 1)]


def min_time(kind, binary, value, deadline):
    srv = Server(kind, binary, extra=["--grpc-keepalive-min-time", value])
    srv.start()
    try:
        ch = grpc.insecure_channel(srv.endpoint, options=PINGING)
        call, _, _ = watch(stubs.WatchStub(ch), timeout=deadline)
        code, secs = until_end(call)
        ch.close()
        return code, secs
    finally:
        srv.stop()
        srv.cleanup()


def interval(kind, binary, flags, deadline):
    srv = Server(kind, binary, extra=flags)
    srv.start()
    try:
        with Proxy(("127.0.0.1", srv.client_port), lifetime=30) as px:
            ch = grpc.insecure_channel("127.0.0.1:%d" % px.port)
            call, _, _ = watch(stubs.WatchStub(ch), timeout=deadline)
            px.blackhole("a2b")  # the client's pings acks stop here
            code, secs = until_end(call)
            ch.close()
            return code, secs
    finally:
        srv.stop()
        srv.cleanup()


def both(pool, fn, cairn, etcd, *args):
    """fn on cairn and etcd at once: {kind: result}."""
    jobs = {k: pool.submit(fn, k, b, *args) for k, b in (("cairn", cairn), ("etcd", etcd))}
    return {k: j.result() for k, j in jobs.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--etcd", default="etcd")
    a = ap.parse_args()
    cairn = os.path.abspath(a.cairn)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        s = both(pool, streams, cairn, a.etcd)
        want = {"created": True, "range, two streams open": "DEADLINE_EXCEEDED",
                "range, one stream open": "1"}
        for k in ("etcd", "cairn"):
            check(s[k] == want, "%s --max-concurrent-streams 2: %r, want %r" % (k, s[k], want))

        strict = both(pool, min_time, cairn, a.etcd, "10s", 8)
        lax = both(pool, min_time, cairn, a.etcd, "300ms", 4)
        for k in ("etcd", "cairn"):
            code, secs = strict[k]
            check(code == "UNAVAILABLE" and secs < 7,
                  "%s --grpc-keepalive-min-time 10s, pings every 1s: %s after %.1fs, want "
                  "UNAVAILABLE (too_many_pings) within 7s" % (k, code, secs))
            check(lax[k][0] == "DEADLINE_EXCEEDED",
                  "%s --grpc-keepalive-min-time 300ms, pings every 1s: %s after %.1fs, want the "
                  "watch to live to its deadline" % (k, lax[k][0], lax[k][1]))

        short = both(pool, interval, cairn, a.etcd,
                     ["--grpc-keepalive-interval=1s", "--grpc-keepalive-timeout=1s"], 10)
        dflt = both(pool, interval, cairn, a.etcd, [], 4)
        for k in ("etcd", "cairn"):
            code, secs = short[k]
            check(code == "UNAVAILABLE" and secs < 6,
                  "%s keepalive interval/timeout 1s, client's bytes cut: %s after %.1fs, want "
                  "UNAVAILABLE within 6s" % (k, code, secs))
            check(dflt[k][0] == "DEADLINE_EXCEEDED",
                  "%s keepalive defaults, client's bytes cut: %s after %.1fs, want the watch to "
                  "live to its deadline" % (k, dflt[k][0], dflt[k][1]))
    print("streams %r; min-time 10s %r, 300ms %r; interval 1s %r, default %r" %
          (s, strict, lax, short, dflt))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
