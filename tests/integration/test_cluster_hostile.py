#!/usr/bin/python3
"""A hostile peer against real cairn processes (issue 16, "Hostile or
broken peers"). n1 and n2 run with an --initial-cluster that also names
n3; this test is n3: it dials n1's (and n2's) peer URL, says a valid hello
as n3 (cluster id and member id from MemberList, the token's BLAKE2b-256)
and sends forged sync messages built by hand (crdt/sync.c and
crdt/change.c have the byte tables):

- an honest op-less change of a fresh actor (the control: it is applied,
  so the forgery itself is right), and an honest chain of two sent as
  version 2 spells it (the second without the id of the first);
- a change whose seq skips (the DAG's sequence rule), a change that is not
  canonical (an overlong varint), a sync message over a count limit, a
  chain spelt in full (version 2 allows only the cut), and a PeerMessage
  that does not decode;
- a descendant of the refused change, sent later on a new stream, and to
  n2 before the refused change reaches n2 at all.

For each refusal: nothing of it is applied (HashToRevision: not here, on
both nodes, also after they synced), n1 logs a line naming n3 and the
reason, our stream gets a Goodbye "refused: <why>" and ends with
PERMISSION_DENIED, n1's hellos from n3 are refused for ~2 s after (then
accepted again), and n1 keeps serving clients and replicating to n2.

Usage: test_cluster_hostile.py --cairn build/cairn
"""

import argparse
import hashlib
import os
import queue
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from system_python import grpc  # noqa: E402
from procs import Server, free_port  # noqa: E402
from verdict import check, failures, finish  # noqa: E402
import wire  # noqa: E402

SKIP = 77
WAIT_S = 20
HOLD_S = 2.0  # server/peer: PEER_REFUSE_MS
PEER_VERSION = 2  # server/peer/peer_msg.h: PEER_PROTOCOL_VERSION


def field_fixed64(num, v):
    return wire.varint(num << 3 | 1) + struct.pack("<Q", v)


def hello(cluster_id, member_id, actor, token):
    h = (wire.field_int(1, PEER_VERSION) + field_fixed64(2, cluster_id)
         + field_fixed64(3, member_id) + wire.field_bytes(4, actor)
         + wire.field_bytes(5, hashlib.blake2b(token.encode(), digest_size=32).digest())
         + wire.field_bytes(6, b"n3") + wire.field_int(8, int(time.time() * 1000)))
    return wire.field_bytes(1, h)


def sync_msg(changes, nchanges=None, heads_last=False):
    """A crdt/sync message (version 2): no heads (or, with |heads_last|,
    flags bit 3: the heads are the last change), no need, then |changes|:
    raw bytes each, in full, or (bytes, "cut"): a change less the id of the
    one before it (cut()); |nchanges| overrides the count."""
    body = b"\x02" + (b"\x08" if heads_last else b"\x00" + wire.varint(0)) + wire.varint(0)
    body += wire.varint(len(changes) if nchanges is None else nchanges)
    for c in changes:
        c, p = c if isinstance(c, tuple) else (c, None)
        body += wire.varint(len(c) << 1 | (p == "cut")) + c
    return wire.field_bytes(2, wire.field_bytes(1, body))


def cut(c, dep):
    """Change bytes |c| without its dependency |dep| (crdt/sync.c's cut)."""
    i = c.index(dep)
    return c[:i] + c[i + len(dep):]


def change(actor, seq, deps=(), seq_bytes=None):
    """An op-less change (crdt/change.c's encoding, version 0xC1)."""
    b = b"\xc1" + actor + (seq_bytes or wire.varint(seq)) + wire.varint(1)
    b += wire.varint(1) + wire.varint(len(deps)) + b"".join(sorted(deps))
    return b + wire.varint(0) + wire.varint(0)


def change_hash(c):
    return hashlib.blake2b(c, digest_size=32).digest()


class Stream:
    """One peer stream to |target| as n3: sends |msgs| and keeps its side
    open; collects what comes back until the server ends it."""

    def __init__(self, target, msgs, timeout=10):
        self.q = queue.Queue()
        for m in msgs:
            self.q.put(m)
        self.got, self.code, self.details = [], None, ""
        self.ch = grpc.insecure_channel("127.0.0.1:%d" % target.peer_port)
        self.call = self.ch.stream_stream("/cairnpb.Peer/Stream")(self._gen(), timeout=timeout)
        self.th = threading.Thread(target=self._read)
        self.th.start()

    def _gen(self):
        while True:
            try:
                m = self.q.get(timeout=0.2)
            except queue.Empty:
                if self.code is not None:
                    return
                continue
            if m is None:
                return
            yield m

    def _read(self):
        try:
            for r in self.call:
                self.got.append(wire.decode(r))
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code, self.details = e.code(), e.details() or ""

    def send(self, m):
        self.q.put(m)

    def wait(self, timeout=10):
        self.th.join(timeout)
        self.q.put(None)
        return self.code

    def close(self):
        self.q.put(None)
        self.call.cancel()
        self.th.join(5)
        self.ch.close()

    def goodbyes(self):
        return [bytes(wire.decode(m[3][0]).get(1, [b""])[0]).decode() for m in self.got if 3 in m]

    def hello_seen(self):
        return any(1 in m for m in self.got)


def held(node, h):
    """True if |node| holds change |h| durably (Replication/HashToRevision)."""
    with grpc.insecure_channel(node.endpoint) as ch:
        try:
            ch.unary_unary("/cairnpb.Replication/HashToRevision")(wire.field_bytes(1, h),
                                                                  timeout=5)
            return True
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return False


def wait_for(pred, timeout=WAIT_S):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    args = ap.parse_args()
    n1, n2 = (Server("cairn", args.cairn, name=n) for n in ("n1", "n2"))
    n3_port = free_port()  # named in --initial-cluster; nobody listens there
    cluster = "n1=http://127.0.0.1:%d,n2=http://127.0.0.1:%d,n3=http://127.0.0.1:%d" % (
        n1.peer_port, n2.peer_port, n3_port)
    for n in (n1, n2):
        n.extra = ["--initial-cluster", cluster, "--sync-interval-ms", "50"]
    streams = []

    def stream(target, msgs):
        s = Stream(target, msgs)
        streams.append(s)
        return s

    try:
        n1.start()
        n2.start()
        ml = n1.json("member", "list")
        ids = {m.get("name"): m["ID"] for m in ml["members"]}
        cid = ml["header"]["cluster_id"]
        if "n3" not in ids:
            print("SKIP: member list does not name n3: %s" % ml)
            return SKIP
        hi = hello(cid, ids["n3"], b"\x33" * 16, "etcd-cluster")
        evil = b"\xee" * 16

        # the control: an honest change of a fresh actor is applied
        good = change(b"\x44" * 16, 1)
        s = stream(n1, [hi, sync_msg([good])])
        check(wait_for(lambda: held(n1, change_hash(good))), "n1 applies an honest forged change")
        check(not s.goodbyes(), "no goodbye for an honest change: %s" % s.goodbyes())
        s.close()
        # a chain as version 2 spells it: the second change without the id
        # of the first, the heads the last change; n1 rebuilds it
        c1 = change(b"\x77" * 16, 1)
        c2 = change(b"\x77" * 16, 2, [change_hash(c1)])
        s = stream(n1, [hi, sync_msg([c1, (cut(c2, change_hash(c1)), "cut")], heads_last=True)])
        check(wait_for(lambda: held(n1, change_hash(c2))), "n1 applies a chain sent cut")
        check(not s.goodbyes(), "no goodbye for a cut chain: %s" % s.goodbyes())
        s.close()

        def refused(target, msg, reason, what):
            """|msg| after a hello: refused with |reason| in the log."""
            log0 = target.read_log()
            s = stream(target, [hi, msg])
            code = s.wait(10)
            bye = s.goodbyes()
            t_refused = time.time()
            check(code == grpc.StatusCode.PERMISSION_DENIED,
                  "%s: the stream ends with PERMISSION_DENIED (got %s %r)" % (what, code, s.details))
            check(len(bye) == 1 and bye[0].startswith("refused: ") and reason in bye[0],
                  "%s: a goodbye 'refused: ...%s...': %s" % (what, reason, bye))
            check(s.details.startswith("refused: ") and reason in s.details,
                  "%s: the status says it too: %r" % (what, s.details))
            new = target.read_log()[len(log0):]
            line = [ln for ln in new.splitlines() if "peer n3: refused: " in ln and reason in ln]
            check(line, "%s: %s logs a line naming n3 and '%s': %s" % (what, target.name, reason,
                                                                        new[-600:]))
            if line:
                print("%s: %s" % (target.name, line[0].strip()))
            s.close()
            return t_refused

        # a change whose seq skips (no seq 1 before it)
        gap = change(evil, 2)
        t = refused(n1, sync_msg([gap]), "sequence number skips", "seq gap")
        check(not held(n1, change_hash(gap)), "the seq-gap change is not applied on n1")

        # hellos from n3 are refused for ~2 s, then accepted
        s = stream(n1, [hi])
        code = s.wait(10)
        check(code == grpc.StatusCode.PERMISSION_DENIED and "refused lately" in s.details,
              "a hello right after the refusal is refused: %s %r" % (code, s.details))
        s.close()
        accepted_at = None
        while time.time() < t + 10:
            s = stream(n1, [hi])
            ok = wait_for(lambda: s.hello_seen() or s.code is not None, 5)
            if ok and s.code is None:
                time.sleep(0.2)
                if s.code is None:
                    accepted_at = time.time()
                    s.close()
                    break
            s.close()
            time.sleep(0.1)
        check(accepted_at is not None, "n3 is accepted again after the hold")
        if accepted_at:
            print("n3 accepted again %.2f s after the refusal" % (accepted_at - t))
            check(accepted_at - t >= HOLD_S - 0.3,
                  "n3 held off ~%.0f s: accepted after %.2f s" % (HOLD_S, accepted_at - t))
        attempts = n1.read_log().count("peer n3: refused: ")
        print("refusal lines for n3 in n1's log so far: %d" % attempts)

        # a descendant of the refused change, on a new stream, later
        desc = change(b"\x55" * 16, 1, [change_hash(gap)])
        refused(n1, sync_msg([desc]), "depends on a refused change", "descendant on n1")
        check(not held(n1, change_hash(desc)), "the descendant is not applied on n1")

        # on n2, the descendant first (its dep unknown there: buffered),
        # then the refused change itself: both refused, neither applied
        s = stream(n2, [hi, sync_msg([desc])])
        time.sleep(0.5)
        check(not s.goodbyes() and s.code is None,
              "n2 buffers a change whose dep it has not seen: %s %s" % (s.goodbyes(), s.code))
        s.close()
        refused(n2, sync_msg([gap]), "sequence number skips", "seq gap on n2")
        put_ok = n1.etcdctl("put", "after-hostile", "1").returncode == 0
        check(put_ok, "n1 serves a put")
        check(wait_for(lambda: n2.etcdctl("get", "after-hostile", "--print-value-only")
                       .stdout.strip() == b"1"), "n1 and n2 still replicate")
        for n in (n1, n2):
            for h, what in ((gap, "seq gap"), (desc, "descendant")):
                check(not held(n, change_hash(h)), "%s: the %s is not applied" % (n.name, what))
            check(held(n, change_hash(good)), "%s holds the honest change" % n.name)

        # not canonical: seq 1 as an overlong varint; the whole message goes
        time.sleep(HOLD_S + 0.2)
        bad = change(b"\x66" * 16, 1, seq_bytes=b"\x81\x00")
        refused(n1, sync_msg([bad]), "non-canonical", "non-canonical change")
        check(not held(n1, change_hash(bad)), "the non-canonical change is not applied")
        # a sync message over a count limit (max_changes 4096)
        time.sleep(HOLD_S + 0.2)
        refused(n1, sync_msg([], nchanges=1 << 20), "malformed sync message", "over a limit")
        # a chain in full: version 2 has one spelling, the dependency cut
        time.sleep(HOLD_S + 0.2)
        d1 = change(b"\x88" * 16, 1)
        d2 = change(b"\x88" * 16, 2, [change_hash(d1)])
        refused(n1, sync_msg([d1, d2]), "malformed sync message", "a chain in full")
        check(not held(n1, change_hash(d1)), "nothing of the chain in full is applied")
        # a PeerMessage that does not decode
        time.sleep(HOLD_S + 0.2)
        refused(n1, b"\x12\xff\xff\xff", "does not decode", "undecodable message")

        check(n1.etcdctl("put", "still", "serving").returncode == 0, "n1 serves clients")
        check(n1.etcdctl("get", "still", "--print-value-only").stdout.strip() == b"serving",
              "n1 answers a get")
        for n in (n1, n2):
            rc = n.stop()
            check(rc == 0, "%s exits 0 on SIGTERM (got %s)" % (n.name, rc))
    finally:
        for s in streams:
            try:
                s.close()
            except Exception:  # noqa: BLE001  best effort at teardown
                pass
        for n in (n1, n2):
            if failures:
                print("---- %s log ----\n%s" % (n.name, n.read_log()[-6000:]))
            n.cleanup()
    return finish("test_cluster_hostile: all checks passed")


if __name__ == "__main__":
    sys.exit(main())
