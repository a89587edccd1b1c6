#!/usr/bin/python3
"""Hostile and unusual input against a real cairn process: bad flags, an
unusable data dir, a port in use, malformed protobuf, random bytes to every
method, a Txn nested 100000 deep, oversized messages, unknown methods and
services, unserved services (Auth, membership changes), malformed Watch
and LeaseKeepAlive requests, bad HTTP/2 request headers (content-type,
grpc-encoding, the compressed flag, grpc-timeout), concurrent writers, the
NOSPACE quota alarm, and SIGTERM under load. Every error must be the gRPC status etcd 3.4 gives
(measured against etcd; texts in crdt/error.h) and the server must keep
serving and exit 0 on SIGTERM.

Requests are encoded by hand (a few protobuf fields), so no generated code
is needed; RPCs use grpc's generic unary_unary, and the header cases a raw
HTTP/2 client (python3-h2), since no gRPC client sends them.

Usage: test_faults.py --cairn build/cairn [--etcd etcd]
"""

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import h2.config  # noqa: E402  python3-h2 (scripts/deps.sh)
import h2.connection  # noqa: E402
import h2.events  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from system_python import grpc  # noqa: E402
from procs import Server, free_port  # noqa: E402
from wire import field_bytes, field_int, varint  # noqa: E402
from verdict import check, failures, finish  # noqa: E402

HARD_TIMEOUT = 170
SEED = 20261129

# ---- protobuf by hand -----------------------------------------------------

def put_req(key, value):
    return field_bytes(1, key) + field_bytes(2, value)


def range_req(key, range_end=b"", count_only=False):
    m = field_bytes(1, key)
    if range_end:
        m += field_bytes(2, range_end)
    if count_only:
        m += field_int(9, 1)
    return m


def nested_txn(depth):
    """TxnRequest{success: [RequestOp{request_txn: TxnRequest{...}}]}, built
    from the lengths outward (concatenating inward would be quadratic)."""
    heads = []
    txn_len = 0                                        # innermost: empty
    for _ in range(depth):
        op_len = 1 + len(varint(txn_len)) + txn_len    # RequestOp.request_txn (4)
        heads.append(b"\x22" + varint(txn_len))
        txn_len = 1 + len(varint(op_len)) + op_len     # TxnRequest.success (2)
        heads.append(b"\x12" + varint(op_len))
    return b"".join(reversed(heads))


def call(ch, method, payload, timeout=10):
    f = ch.unary_unary(method, request_serializer=lambda b: b,
                       response_deserializer=lambda b: b)
    try:
        return ("OK", f(payload, timeout=timeout))
    except grpc.RpcError as e:
        return (e.code().name, e.details())


KV = "/etcdserverpb.KV/"
UNARY_METHODS = [KV + m for m in ("Range", "Put", "DeleteRange", "Txn", "Compact")] + [
    "/etcdserverpb.Maintenance/" + m for m in ("Status", "Alarm", "Hash", "HashKV",
                                               "Defragment", "MoveLeader")] + [
    "/etcdserverpb.Cluster/MemberList", "/etcdserverpb.Lease/LeaseGrant",
    "/etcdserverpb.Auth/UserAdd"]


# ---- flags and start-up ---------------------------------------------------

def run(args, timeout=20):
    return subprocess.run(args, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def flag_checks(binary):
    r = run([binary, "--help"])
    check(r.returncode == 0, "--help exits 0")
    for f in ("--name", "--data-dir", "--listen-client-urls", "--advertise-client-urls",
              "--listen-peer-urls", "--initial-advertise-peer-urls", "--initial-cluster",
              "--initial-cluster-state", "--initial-cluster-token", "--max-request-bytes",
              "--max-txn-ops", "--quota-backend-bytes", "--log-level"):
        check(f.encode() in r.stdout, "--help lists %s" % f)
    r = run([binary, "--no-such-flag", "1"])
    check(r.returncode != 0 and b"no-such-flag" in r.stderr,
          "an unknown flag: exit != 0 and a message (%r)" % r.stderr)
    r = run([binary, "--max-request-bytes=abc"])
    check(r.returncode != 0 and b"max-request-bytes" in r.stderr, "a bad flag value")
    with tempfile.TemporaryDirectory() as d:
        r = run([binary, "--data-dir", os.path.join(d, "x"), "--listen-client-urls",
                 "https://127.0.0.1:%d" % free_port()])
    check(r.returncode != 0 and b"--cert-file" in r.stderr,
          "an https URL without a certificate is refused (%r)" % r.stderr)
    r = run([binary, "--data-dir", "/proc/cairn-cannot-exist/x",
             "--listen-client-urls", "http://127.0.0.1:%d" % free_port()])
    check(r.returncode != 0 and b"data directory" in r.stderr,
          "an unusable data dir: exit != 0 and a message (%r)" % r.stderr)
    with tempfile.TemporaryDirectory() as d:
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        r = run([binary, "--data-dir", os.path.join(d, "x"), "--listen-client-urls",
                 "http://127.0.0.1:%d" % busy.getsockname()[1]])
        busy.close()
        check(r.returncode != 0 and b"listen" in r.stderr,
              "a port in use: exit != 0 and a message (%r)" % r.stderr[-300:])


# ---- gRPC faults ----------------------------------------------------------

def grpc_checks(srv):
    ch = grpc.insecure_channel(srv.endpoint, options=[
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.max_receive_message_length", 64 << 20)])

    check(call(ch, "/etcdserverpb.KV/Nope", b"") ==
          ("UNIMPLEMENTED", "unknown method Nope for service etcdserverpb.KV"),
          "unknown method")
    check(call(ch, "/foo.Bar/Baz", b"") == ("UNIMPLEMENTED", "unknown service foo.Bar"),
          "unknown service")
    for m in ("/etcdserverpb.Auth/AuthEnable", "/etcdserverpb.Maintenance/MoveLeader"):
        st, _ = call(ch, m, b"")
        check(st == "UNIMPLEMENTED", "%s is UNIMPLEMENTED (%s)" % (m, st))

    watch_checks(ch)

    for m in (KV + "Range", KV + "Put", KV + "Txn", "/etcdserverpb.Maintenance/Status"):
        for bad in (b"\xff\xff\xff", b"\x0a\x05ab", b"\x0b", b"\x0a\xff\xff\xff\xff\x0f"):
            st, msg = call(ch, m, bad)
            check(st == "INTERNAL" and msg.startswith("grpc: error unmarshalling request"),
                  "malformed %r to %s: %s %s" % (bad, m, st, msg))

    st, msg = call(ch, KV + "Txn", nested_txn(100000), timeout=30)
    check(st == "INTERNAL", "a Txn nested 100000 deep is refused (%s %s)" % (st, msg))
    st, msg = call(ch, KV + "Txn", nested_txn(3))
    check(st == "OK", "a Txn nested 3 deep is served (%s %s)" % (st, msg))

    # etcd: raft entry > --max-request-bytes: InvalidArgument; message >
    # --max-request-bytes + 512 KiB: grpc-go's ResourceExhausted.
    st, msg = call(ch, KV + "Put", put_req(b"big", b"x" * 1572764))
    check(st == "OK", "a Put just under the limit is served (%s %s)" % (st, msg))
    check(call(ch, KV + "Put", put_req(b"big", b"x" * 1600000)) ==
          ("INVALID_ARGUMENT", "etcdserver: request is too large"), "request is too large")
    st, msg = call(ch, KV + "Put", put_req(b"big", b"x" * 2100000))
    check(st == "RESOURCE_EXHAUSTED" and "larger than max" in msg,
          "a 2.1 MB message is refused by size (%s %s)" % (st, msg))
    st, msg = call(ch, KV + "Put", put_req(b"big", b"x" * 5000000))
    check(st == "RESOURCE_EXHAUSTED", "a 5 MB message is refused (%s %s)" % (st, msg))
    check(call(ch, KV + "Range", b"\x0a\x00")[0] == "INVALID_ARGUMENT", "empty key")

    rnd = random.Random(SEED)
    for i in range(400):
        n = rnd.choice([0, 1, 2, 3, 5, 8, 13, 40, 200])
        data = bytes(rnd.getrandbits(8) for _ in range(n))
        m = rnd.choice(UNARY_METHODS)
        st, _ = call(ch, m, data)
        if st in ("DEADLINE_EXCEEDED", "UNAVAILABLE"):
            check(False, "random bytes %r to %s: %s" % (data, m, st))
            break
    check(srv.proc.poll() is None, "the server survived the random bytes")

    # Still serving, and writes from many clients all land.
    check(call(ch, KV + "Put", put_req(b"after", b"still-here"))[0] == "OK", "Put after faults")
    st, body = call(ch, KV + "Range", range_req(b"after"))
    check(st == "OK" and b"still-here" in body, "Range after faults")

    errors = []

    def writer(t):
        c = grpc.insecure_channel(srv.endpoint)
        for i in range(100):
            st, msg = call(c, KV + "Put", put_req(b"w/%d/%d" % (t, i), b"v"))
            if st != "OK":
                errors.append((st, msg))
        c.close()
    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "800 concurrent Puts all succeed (%r)" % errors[:3])
    st, body = call(ch, KV + "Range", range_req(b"w/", b"w0", count_only=True))
    check(st == "OK" and field_int(4, 800) in body, "the 800 keys are there")
    ch.close()


# etcd: a malformed request on a stream ends it with INTERNAL, "grpc: failed
# to unmarshal the received message ...", whether the client keeps its side
# open or not (measured on etcd 3.4 with these bytes).
STREAM_UNMARSHAL = "grpc: failed to unmarshal the received message"
MALFORMED_WATCH = {
    "garbage": b"\xff\xff\xff",
    "truncated": b"\x0a\x05ab",
    "wrong wire type": b"\x08\x01",              # create_request as a varint
    "length 2^31": b"\x0a" + varint(1 << 31),
    "length 2^64-1": b"\x0a" + varint((1 << 64) - 1),
    "11-byte varint": b"\x0a" + b"\xff" * 10 + b"\x01",
    "field number 0": b"\x00\x01",
    "field number 2^32": varint((1 << 32) << 3) + b"\x01",
}


def stream_call(ch, method, first, keep_open, timeout=5):
    """Sends |first| on a bidi stream (and, with |keep_open|, leaves the
    client's side open); returns (status name, details) of how it ended."""
    f = ch.stream_stream(method, request_serializer=lambda b: b,
                         response_deserializer=lambda b: b)
    hold = threading.Event()

    def reqs():
        yield first
        if keep_open:
            hold.wait(10)
    try:
        list(f(reqs(), timeout=timeout))
        return ("OK", "")
    except grpc.RpcError as e:
        return (e.code().name, e.details())
    finally:
        hold.set()


def watch_checks(ch):
    for name, bad in MALFORMED_WATCH.items():
        for keep_open in (True, False):
            st, msg = stream_call(ch, "/etcdserverpb.Watch/Watch", bad, keep_open)
            check(st == "INTERNAL" and msg.startswith(STREAM_UNMARSHAL),
                  "a %s WatchRequest ends the stream (%s): %s %s" %
                  (name, "client side open" if keep_open else "half-closed", st, msg))
        st, msg = call(ch, "/etcdserverpb.Watch/Watch", bad)
        check(st == "INTERNAL" and msg.startswith(STREAM_UNMARSHAL),
              "Watch called as a unary call with a %s request: %s %s" % (name, st, msg))
    # etcd: a field number up to 2^31-1 is an unknown field, skipped; the
    # stream goes on, also after the client's half-close (as etcd's: until
    # the client ends it, here by its deadline).
    st, _ = stream_call(ch, "/etcdserverpb.Watch/Watch", varint((1 << 29) << 3) + b"\x01", False,
                        timeout=1)
    check(st == "DEADLINE_EXCEEDED", "a WatchRequest with only field 2^29 is skipped (%s)" % st)
    st, msg = stream_call(ch, "/etcdserverpb.Lease/LeaseKeepAlive", b"\x0a\x05ab", True)
    check(st == "INTERNAL" and msg.startswith(STREAM_UNMARSHAL),
          "a truncated LeaseKeepAliveRequest ends the stream: %s %s" % (st, msg))
    # A good Watch stream still works after all that.
    st, _ = stream_call(ch, "/etcdserverpb.Watch/Watch", field_bytes(1, field_bytes(1, b"k")),
                        False, timeout=1)
    check(st == "DEADLINE_EXCEEDED", "a well-formed Watch stream after the malformed ones goes on "
          "after the half-close (%s)" % st)


# ---- HTTP/2 request headers -------------------------------------------------

def h2_call(port, headers, flag=0, body=b"\x0a\x01a", path="/etcdserverpb.KV/Range"):
    """One request on a fresh HTTP/2 connection with exactly |headers| after
    the pseudo-headers and te, and a message with compressed flag |flag|.
    Returns what came back: ("rst", code), or ("status", grpc-status,
    whether a response message came)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding="utf-8", validate_outbound_headers=False,
        normalize_outbound_headers=False, validate_inbound_headers=False))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                            (":authority", "127.0.0.1:%d" % port), ("te", "trailers")] + headers)
    conn.send_data(sid, bytes([flag]) + len(body).to_bytes(4, "big") + body, end_stream=True)
    s.sendall(conn.data_to_send())
    status, data = None, False
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return ("eof",)
            for ev in conn.receive_data(chunk):
                if isinstance(ev, h2.events.StreamReset):
                    return ("rst", int(ev.error_code))
                if isinstance(ev, h2.events.DataReceived):
                    data = data or len(ev.data) > 0
                    conn.acknowledge_received_data(ev.flow_controlled_length, sid)
                if isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    for k, v in ev.headers:
                        if k == "grpc-status":
                            status = int(v)
                if isinstance(ev, h2.events.StreamEnded):
                    return ("status", status, data)
            s.sendall(conn.data_to_send())
    finally:
        s.close()


GRPC_CT = ("content-type", "application/grpc")
RST_PROTOCOL_ERROR = ("rst", 1)
# name: headers, compressed flag, etcd 3.4's answer (measured), cairn's.
# etcd refuses every one without running the method; gRPC core 1.51 hides
# all five from cairn (no content-type or grpc-encoding in the request's
# metadata, the message's bytes as sent, a bad grpc-timeout as none: see
# server/rpc/engine.c), so cairn serves them: a known difference, pinned
# here so that a gRPC core that starts refusing them is noticed.
FRONT_DOOR = {
    "content-type text/html": ([("content-type", "text/html")], 0,
                               RST_PROTOCOL_ERROR, ("status", 0, True)),
    "no content-type": ([], 0, RST_PROTOCOL_ERROR, ("status", 0, True)),
    "compressed, no grpc-encoding": ([GRPC_CT], 1, ("status", 13, False), ("status", 0, True)),
    "compressed, unknown grpc-encoding": ([GRPC_CT, ("grpc-encoding", "bogus")], 1,
                                          ("status", 12, False), ("status", 0, True)),
    "garbage grpc-timeout": ([GRPC_CT, ("grpc-timeout", "garbage")], 0,
                             RST_PROTOCOL_ERROR, ("status", 0, True)),
}


def front_door_checks(port, kind):
    check(h2_call(port, [GRPC_CT]) == ("status", 0, True),
          "%s: a well-formed raw HTTP/2 Range is served" % kind)
    for name, (headers, flag, etcd_answer, cairn_answer) in FRONT_DOOR.items():
        want = etcd_answer if kind == "etcd" else cairn_answer
        got = h2_call(port, headers, flag)
        check(got == want, "%s: a request with %s: %r (expected %r)" % (kind, name, got, want))


def quota_checks(binary):
    srv = Server("cairn", binary, extra=["--quota-backend-bytes", "300000"])
    try:
        srv.start()
        ch = grpc.insecure_channel(srv.endpoint)
        hit = None
        rnd = random.Random(SEED)  # incompressible: LevelDB compresses tables
        for i in range(100):
            value = bytes(rnd.getrandbits(8) for _ in range(20000))
            st, msg = call(ch, KV + "Put", put_req(b"q%d" % i, value))
            if st != "OK":
                hit = (st, msg)
                break
        check(hit == ("RESOURCE_EXHAUSTED", "etcdserver: mvcc: database space exceeded"),
              "writes past --quota-backend-bytes fail with NOSPACE (%r)" % (hit,))
        r = srv.etcdctl("alarm", "list")
        check(b"alarm:NOSPACE" in r.stdout, "alarm list shows NOSPACE (%r)" % r.stdout)
        r = srv.etcdctl("endpoint", "status")
        check(b"alarm:NOSPACE" in r.stdout, "endpoint status lists the alarm")
        check(call(ch, KV + "Range", range_req(b"q0"))[0] == "OK", "reads still work")
        check(call(ch, KV + "DeleteRange", range_req(b"q0"))[0] == "OK",
              "deletes still work under NOSPACE (as etcd)")
        check(call(ch, KV + "Put", put_req(b"small", b"1")) ==
              ("RESOURCE_EXHAUSTED", "etcdserver: mvcc: database space exceeded"),
              "a Put fails while the alarm is raised")
        r = srv.etcdctl("alarm", "disarm")
        check(b"alarm:NOSPACE" in r.stdout, "alarm disarm answers with the alarm")
        r = srv.etcdctl("alarm", "list")
        check(r.stdout.strip() == b"", "no alarm after disarm (%r)" % r.stdout)
        ch.close()
    finally:
        check(srv.stop() == 0, "quota cairn exits 0")
        srv.cleanup()


def sigterm_under_load(binary):
    srv = Server("cairn", binary)
    try:
        srv.start()
        stop = threading.Event()

        def load():
            c = grpc.insecure_channel(srv.endpoint)
            i = 0
            while not stop.is_set():
                call(c, KV + "Put", put_req(b"load%d" % (i % 50), b"v" * 100), timeout=5)
                i += 1
            c.close()
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        # An open Watch stream must not hold the shutdown (etcd ends them).
        wch = grpc.insecure_channel(srv.endpoint)
        wstream = wch.stream_stream("/etcdserverpb.Watch/Watch", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        def watch_reqs():
            yield field_bytes(1, field_bytes(1, b"load0"))
            stop.wait(30)  # keeps the stream open until the end
        wcall = wstream(watch_reqs(), timeout=30)
        first = next(wcall)  # the created response: the stream is open
        check(first.startswith(b"\x0a"), "watch created before SIGTERM")
        time.sleep(1.0)
        t0 = time.time()
        rc = srv.stop()
        took = time.time() - t0
        stop.set()
        for t in threads:
            t.join()
        wcall.cancel()
        wch.close()
        check(rc == 0, "SIGTERM under load: exit 0 (got %r)" % rc)
        check(took < 4, "SIGTERM under load with a watch open: stopped in %.1fs" % took)
        # Everything acknowledged is there after a restart.
        srv.start()
        r = srv.etcdctl("get", "load", "--prefix", "--keys-only")
        check(r.returncode == 0, "restart after SIGTERM under load")
    finally:
        check(srv.stop() == 0, "cairn exits 0")
        srv.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--etcd", help="etcd 3.4: the header cases are run against it too")
    a = ap.parse_args()
    binary = os.path.abspath(a.cairn)

    def timeout(*_):
        raise SystemExit("FAIL: hard timeout of %ds" % HARD_TIMEOUT)
    signal.signal(signal.SIGALRM, timeout)
    signal.alarm(HARD_TIMEOUT)

    flag_checks(binary)
    srv = Server("cairn", binary)
    try:
        srv.start()
        grpc_checks(srv)
        front_door_checks(srv.client_port, "cairn")
        check(srv.proc.poll() is None, "the server is alive after every fault")
    finally:
        if failures:
            print("---- cairn log (tail) ----\n" + srv.read_log()[-3000:])
        check(srv.stop() == 0, "cairn exits 0 on SIGTERM after the faults")
        srv.cleanup()
    if a.etcd:
        etcd = Server("etcd", a.etcd)
        try:
            etcd.start()
            front_door_checks(etcd.client_port, "etcd")
        finally:
            etcd.stop()
            etcd.cleanup()
    quota_checks(binary)
    sigterm_under_load(binary)
    sys.exit(finish("all fault checks passed"))


if __name__ == "__main__":
    main()
