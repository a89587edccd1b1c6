#!/usr/bin/python3
"""probe.py: two small measurements of an etcd-compatible server for
scripts/bench.sh, made the same way against etcd and cairn.

probe.py watch-latency: put -> watch event latency. Opens one Watch stream
on a key prefix, then makes --count Puts one after another on keys under
that prefix. For each Put it records the time from just before the Put request is sent until the Watch event for that key arrives on
the stream (whichever comes last of the Put's reply and the event does not
matter: the clock stops at the event). Prints p50/p90/p99/max in ms as one
CSV row (label,count,p50_ms,p90_ms,p99_ms,max_ms,mean_ms) and, with --cdf,
writes the CDF (latency_ms fraction per line) for plotting.

With --watch-endpoint the Watch stream is on another node of a cluster (the
Puts still go to --endpoint), and with --from-ack the clock starts when the
Put's reply arrives instead: replication lag, from a put's acknowledgement
on node A to its watch event on node B (negative when the event came
first); the row then ends with the p50 and p99 from the Put's sending to
the event as well (sent_p50_ms, sent_p99_ms).

Both servers are measured with the same client, so the Python client's own
cost (tens of microseconds a message) is in both numbers alike.

probe.py first-answer: restart time. Starts the server command given after
"--" itself (so the clock starts at exec, with the client already loaded),
writes its PID to --pidfile, polls a KV Range (linearizable, as a client
would send it) every 5 ms until one is answered, prints the seconds from exec
to that answer, and exits leaving the server running (the caller stops it by
the PID in --pidfile). Gives up after --timeout seconds (exit 1).

Needs Debian's python3-grpcio and python3-protobuf (run with /usr/bin/python3)
and protoc; the message classes are generated at run time from the repo's
proto/ (etcd's v3 API) into a temp dir. Loopback endpoints only. Bounded: every
RPC has a deadline and the whole run an alarm (--timeout, default 120 s).

Usage: probe.py watch-latency --endpoint 127.0.0.1:PORT [--count N]
                        [--watch-endpoint 127.0.0.1:PORT] [--from-ack]
                        [--label S] [--cdf FILE] [--header]
       probe.py first-answer --endpoint 127.0.0.1:PORT --pidfile F
                        [--timeout S] -- SERVER-COMMAND...
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import grpc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from watchtimer import WatchTimer  # noqa: E402


def load_pb(workdir):
    proto = os.path.join(ROOT, "proto")
    files = ["etcdserverpb/rpc.proto", "mvccpb/kv.proto", "authpb/auth.proto"]
    subprocess.run(["protoc", "--python_out=" + workdir, "-I", proto, "-I", "/usr/include"] + files,
                   check=True)
    sys.path.insert(0, workdir)
    import etcdserverpb.rpc_pb2 as rpc  # noqa: E402  (generated just above)
    return rpc


def percentile(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, int(-(-p / 100.0 * len(sorted_vals) // 1)) - 1))
    return sorted_vals[k]


def first_answer(a, rpc, cmd):
    # A fresh channel for every attempt once the port accepts: a channel that
    # met a refused connection waits out gRPC's reconnect backoff (1 s and
    # growing), which would be measured instead of the server.
    target = a.endpoint.replace("http://", "")
    host, port = target.rsplit(":", 1)
    req = rpc.RangeRequest(key=b"bench-probe")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=a.log, stderr=subprocess.STDOUT)
    with open(a.pidfile, "w") as f:
        f.write("%d\n" % proc.pid)
    while time.monotonic() - t0 < a.timeout:
        if proc.poll() is not None:
            sys.exit("first-answer: server exited with status %d" % proc.returncode)
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=0.2).close()
        except OSError:
            time.sleep(0.005)
            continue
        ch = grpc.insecure_channel(target)
        rng = ch.unary_unary("/etcdserverpb.KV/Range",
                             request_serializer=rpc.RangeRequest.SerializeToString,
                             response_deserializer=rpc.RangeResponse.FromString)
        try:
            rng(req, timeout=1.0)
            print("%.3f" % (time.monotonic() - t0))
            return
        except grpc.RpcError:
            time.sleep(0.005)
        finally:
            ch.close()
    sys.exit("first-answer: no answer within %.0f s" % a.timeout)


def main():
    argv = sys.argv[1:]
    cmd = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["watch-latency", "first-answer"])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--label", default="")
    ap.add_argument("--cdf")
    ap.add_argument("--header", action="store_true")
    ap.add_argument("--watch-endpoint")
    ap.add_argument("--from-ack", action="store_true")
    ap.add_argument("--pidfile")
    ap.add_argument("--log", type=argparse.FileType("ab"), default=subprocess.DEVNULL)
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    for ep in (a.endpoint, a.watch_endpoint or a.endpoint):
        host = ep.replace("http://", "").rsplit(":", 1)[0]
        if host not in ("127.0.0.1", "localhost", "[::1]"):
            sys.exit("probe: loopback endpoints only")
    signal.signal(signal.SIGALRM, lambda *_: os._exit(3))
    signal.alarm(int(a.timeout) + 10)

    with tempfile.TemporaryDirectory() as tmp:
        rpc = load_pb(tmp)
    if a.mode == "first-answer":
        if not cmd or not a.pidfile:
            sys.exit("probe: first-answer needs --pidfile and -- SERVER-COMMAND")
        first_answer(a, rpc, cmd)
        return
    ch = grpc.insecure_channel(a.endpoint.replace("http://", ""))
    put = ch.unary_unary("/etcdserverpb.KV/Put",
                         request_serializer=rpc.PutRequest.SerializeToString,
                         response_deserializer=rpc.PutResponse.FromString)
    wch = ch
    if a.watch_endpoint:
        wch = grpc.insecure_channel(a.watch_endpoint.replace("http://", ""))

    prefix = b"watchlat/%d/" % os.getpid()
    w = WatchTimer(wch, rpc.WatchRequest, rpc.WatchCreateRequest, rpc.WatchResponse,
                   prefix, prefix[:-1] + bytes([prefix[-1] + 1]), timeout=a.timeout)
    if not w.created(10):
        sys.exit("watch-latency: watch not created within 10 s")

    value = b"v" * 32
    lat, sent = [], []
    for i in range(a.count + 20):  # the first 20 warm up and are not counted
        key = prefix + b"%08d" % i
        t0 = time.perf_counter_ns()
        put(rpc.PutRequest(key=key, value=value), timeout=10)
        t_ack = time.perf_counter_ns()
        t1 = w.arrival(key)
        if i >= 20:
            lat.append((t1 - (t_ack if a.from_ack else t0)) / 1e6)
            sent.append((t1 - t0) / 1e6)
    w.close()
    ch.close()
    if wch is not ch:
        wch.close()

    s = sorted(lat)
    row = "%s,%d,%.3f,%.3f,%.3f,%.3f,%.3f" % (a.label, len(s), percentile(s, 50), percentile(s, 90),
                                            percentile(s, 99), s[-1], sum(s) / len(s))
    header = "label,count,p50_ms,p90_ms,p99_ms,max_ms,mean_ms"
    if a.from_ack:
        s2 = sorted(sent)
        row += ",%.3f,%.3f" % (percentile(s2, 50), percentile(s2, 99))
        header += ",sent_p50_ms,sent_p99_ms"
    if a.header:
        print(header)
    print(row)
    if a.cdf:
        with open(a.cdf, "w") as f:
            f.write("# latency_ms fraction (%d puts)\n" % len(s))
            for i, v in enumerate(s):
                f.write("%.4f %.6f\n" % (v, (i + 1) / len(s)))


if __name__ == "__main__":
    main()
