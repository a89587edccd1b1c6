#!/usr/bin/python3
"""watchlat: watch event latency of one etcd-compatible endpoint.

One Watch stream on a key prefix; then N puts to keys under that prefix
(after --warmup puts that are checked but not counted),
open loop at a fixed rate (each Put is sent at its scheduled time whether or
not the previous one has been answered). For every put the latency is the
time from just before the Put is sent to the moment the watcher receives
its event (so it includes the write's commit, as etcd's own
`benchmark watch-latency` does); the ack latency (Put sent -> Put answered)
is measured beside it, and the gap (event received - Put answered: what
the watch path adds after the commit; negative when the event overtakes the
answer). Every event must arrive exactly once, carrying the
value that was put; anything else fails the run. One line of results:

  puts=N rate=R achieved=.. event_p50_ms=.. event_p99_ms=.. event_max_ms=..
  ack_p50_ms=.. ack_p99_ms=.. gap_p50_ms=.. gap_p99_ms=..

Message classes are generated at run time from the repository's proto/ with
protoc into a temporary directory. Bounded: every RPC has a timeout, the run
waits at most --timeout seconds for the last event.

Usage: watchlat.py --endpoint 127.0.0.1:PORT [--puts 3000] [--rate 300]
       [--value-size 64] [--timeout 30] [--proto DIR]
Needs Debian's python3-grpcio (run with /usr/bin/python3).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import grpc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(proto_dir, out):
    files = ["etcdserverpb/rpc.proto", "mvccpb/kv.proto", "authpb/auth.proto"]
    subprocess.run(["protoc", "--python_out=" + out, "-I", proto_dir, "-I", "/usr/include"]
                   + files, check=True)
    sys.path.insert(0, out)
    from etcdserverpb import rpc_pb2  # noqa: E402
    return rpc_pb2


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--puts", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=300.0, help="puts per second (open loop)")
    ap.add_argument("--value-size", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=100,
                    help="puts sent (and checked) first but left out of the percentiles")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--prefix", default="/watchlat/")
    ap.add_argument("--proto", default=os.path.join(REPO, "proto"))
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="watchlat-")
    try:
        pb = load(args.proto, tmp)
        ch = grpc.insecure_channel(args.endpoint)
        ser = lambda m: m.SerializeToString()  # noqa: E731
        put = ch.unary_unary("/etcdserverpb.KV/Put", request_serializer=ser,
                             response_deserializer=pb.PutResponse.FromString)
        watch = ch.stream_stream("/etcdserverpb.Watch/Watch", request_serializer=ser,
                                 response_deserializer=pb.WatchResponse.FromString)
        prefix = args.prefix.encode()
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        n = args.warmup + args.puts
        sent = [0] * n
        acked = [0] * n
        got = [0] * n
        problems = []
        created = threading.Event()
        done = threading.Event()
        count = [0]

        reqs = [pb.WatchRequest(create_request=pb.WatchCreateRequest(key=prefix,
                                                                     range_end=end))]
        stop_reqs = threading.Event()

        def requests():
            for r in reqs:
                yield r
            stop_reqs.wait()

        call = watch(requests(), timeout=args.timeout + n / args.rate + 30)

        def reader():
            try:
                for m in call:
                    t = time.perf_counter()
                    if m.created:
                        created.set()
                        continue
                    for ev in m.events:
                        i = int(ev.kv.key[len(prefix):])
                        if got[i]:
                            problems.append("event for put %d twice" % i)
                        got[i] = t
                        if ev.kv.value[:10] != b"%010d" % i:
                            problems.append("put %d: event carries %r" % (i, ev.kv.value[:10]))
                        count[0] += 1
                        if count[0] == n:
                            done.set()
            except grpc.RpcError as e:
                if not done.is_set():
                    problems.append("watch stream: %s %s" % (e.code(), e.details()))
            done.set()
            created.set()

        threading.Thread(target=reader, daemon=True).start()
        if not created.wait(10):
            raise SystemExit("watchlat: no created response within 10 s")

        pad = b"x" * max(0, args.value_size - 10)

        def on_ack(i):
            def cb(fut):
                acked[i] = time.perf_counter()
                if fut.exception() is not None:
                    problems.append("put %d: %s" % (i, fut.exception()))
            return cb

        t0 = time.perf_counter()
        period = 1.0 / args.rate
        futs = []
        for i in range(n):
            target = t0 + i * period
            d = target - time.perf_counter()
            if d > 0:
                time.sleep(d)
            req = pb.PutRequest(key=prefix + b"%08d" % i, value=b"%010d" % i + pad)
            sent[i] = time.perf_counter()
            f = put.future(req, timeout=10)
            f.add_done_callback(on_ack(i))
            futs.append(f)
        t_sent = time.perf_counter()
        done.wait(args.timeout)
        for f in futs:
            try:
                f.result(timeout=max(0.1, args.timeout))
            except Exception:  # noqa: BLE001  (recorded by the callback)
                pass
        stop_reqs.set()
        call.cancel()
        missing = sum(1 for t in got if not t)
        if missing:
            problems.append("%d of %d events never arrived" % (missing, n))
        w = args.warmup
        ev = [(got[i] - sent[i]) * 1000 for i in range(w, n) if got[i]]
        ack = [(acked[i] - sent[i]) * 1000 for i in range(w, n) if acked[i]]
        # event received minus Put answered: what the watch path adds after
        # the commit (negative when the event overtakes the answer)
        gap = [(got[i] - acked[i]) * 1000 for i in range(w, n) if got[i] and acked[i]]
        achieved = n / (t_sent - t0) if t_sent > t0 else 0
        print("puts=%d rate=%.0f achieved=%.0f event_p50_ms=%.3f event_p99_ms=%.3f "
              "event_max_ms=%.3f ack_p50_ms=%.3f ack_p99_ms=%.3f gap_p50_ms=%.3f gap_p99_ms=%.3f"
              % (args.puts, args.rate, achieved, pct(ev, 50), pct(ev, 99), max(ev) if ev else float("nan"),
                 pct(ack, 50), pct(ack, 99), pct(gap, 50), pct(gap, 99)))
        for p in problems[:10]:
            print("watchlat: %s" % p, file=sys.stderr)
        return 1 if problems else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
