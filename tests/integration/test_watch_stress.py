#!/usr/bin/python3
"""Watch stress: many watchers on overlapping ranges while writers run.

For each server (a real etcd 3.4 and cairn, each started here on random free
127.0.0.1 ports with a temporary data dir), the test

 1. writes a first batch of puts, deletes and multi-key txns, then stops
    and restarts the server (SIGTERM, same data dir; --no-restart skips
    this), so that past starts must be served from persisted history;
 2. opens several Watch streams with many watches each (1,000 by default):
    single keys (some never written), prefixes, "\\0" from-key ranges, the
    whole key space, [a, b) ranges; start_revision 0 (from now), in the past
    (catch-up from history) or a little in the future; some with prev_kv,
    some with a NOPUT or NODELETE filter; plus, on a stream of its own
    connection that reads nothing until the writers stop (a slow watcher),
    a few watches of everything; some watches are canceled mid-run;
 3. runs a few writers concurrently for a bounded time (puts, deletes of one
    key, deletes of a small range, txns with a compare and several puts and
    deletes in either branch), recording every response: its revision and,
    since every delete asks for prev_kv, exactly which keys it removed;
 4. builds the full history from those records (every revision must come
    from exactly one recorded write, consecutive, none missing), checks it
    against the server's own MVCC view (a Range at every revision), derives
    for every watch the exact list of events it must see (kv fields,
    prev_kv, filters, its start), waits (bounded) until every watch has at
    least that many, then a short quiet time, and compares: same events, in
    revision order, none missing, none duplicated, none foreign (a watch
    canceled mid-run: a prefix of that, a canceled answer, nothing after
    it). The writers
    must also have kept at least half their rate: watchers, the stalled
    one included, must not slow writes down.

Nothing expected is written here: the expectation is the history the server
itself acknowledged. Both servers must pass. Message classes are generated at
run time from the repository's proto/ with the conformance harness's
load_messages; the servers are started with its Server class (setpriv
--pdeathsig, so they die with this test) and stopped by their own PIDs on
every exit path. A hard timeout bounds the whole run.

Usage: test_watch_stress.py [--cairn build/cairn] [--etcd /usr/bin/etcd]
       [--target both|etcd|cairn] [--watchers 1000] [--duration 12] [--seed 1]
       [--no-restart]
"""

import argparse
import os
import queue
import random
import shutil
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "conformance"))

try:
    import grpc
except ImportError:  # pyenv python without Debian's python3-grpcio
    if (not os.environ.get("CAIRN_STRESS_REEXEC") and os.path.exists("/usr/bin/python3")
            and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3")):
        os.environ["CAIRN_STRESS_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

from harness import HarnessError, Server, load_messages, prefix_end  # noqa: E402

HARD_TIMEOUT = 170       # seconds for the whole run (ctest allows 180)
RPC_TIMEOUT = 10.0       # every unary RPC
CREATE_WAIT = 20.0       # all watches of a stream must be created by then
DRAIN_WAIT = 60.0        # after the writers stop, every watch must be complete by then
QUIET = 1.0              # then this long without anything more
STREAM_DEADLINE = 150    # a stream lives at most this long

NS = b"/w/"
GROUPS = 10
KEYS_PER_GROUP = 20


def key_of(g, i):
    return b"/w/g%d/k%02d" % (g, i)


ALL_KEYS = [key_of(g, i) for g in range(GROUPS) for i in range(KEYS_PER_GROUP)]


class HardTimeout(BaseException):
    pass


class Failure(Exception):
    pass


# --------------------------------------------------------------------------
# RPC plumbing

class Rpc:
    def __init__(self, srv, msgs):
        self.srv = srv
        self.msgs = msgs
        self._stubs = {}

    def M(self, name):
        return self.msgs["etcdserverpb." + name]

    def call(self, method, req, resp):
        path = "/etcdserverpb.KV/" + method
        stub = self._stubs.get(path)
        if stub is None:
            stub = self.srv.channel.unary_unary(
                path, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=self.M(resp).FromString)
            self._stubs[path] = stub
        return stub(req, timeout=RPC_TIMEOUT)

    def put(self, key, value):
        return self.call("Put", self.M("PutRequest")(key=key, value=value), "PutResponse")

    def delete(self, key, end=b""):
        return self.call("DeleteRange", self.M("DeleteRangeRequest")(
            key=key, range_end=end, prev_kv=True), "DeleteRangeResponse")

    def txn(self, req):
        return self.call("Txn", req, "TxnResponse")

    def range(self, key, end, rev=0):
        return self.call("Range", self.M("RangeRequest")(key=key, range_end=end,
                                                          revision=rev), "RangeResponse")


# --------------------------------------------------------------------------
# Writers: every acknowledged write becomes a record (revision, ops)

class Writer:
    """Random writes at a bounded rate; records (revision, [op]) where an op
    is ("put", key, value) or ("del", key) for every key a delete removed."""

    def __init__(self, rpc, wid, seed, rate):
        self.rpc = rpc
        self.wid = wid
        self.rnd = random.Random(seed)
        self.rate = rate
        self.seq = 0
        self.records = []
        self.error = None

    def value(self):
        self.seq += 1
        return b"w%d-%d" % (self.wid, self.seq)

    def one(self):
        rnd, rpc = self.rnd, self.rpc
        x = rnd.random()
        if x < 0.40:
            k, v = rnd.choice(ALL_KEYS), self.value()
            r = rpc.put(k, v)
            self.records.append((r.header.revision, [("put", k, v)]))
        elif x < 0.55:
            r = rpc.delete(rnd.choice(ALL_KEYS))
            self.records.append((r.header.revision, [("del", kv.key) for kv in r.prev_kvs]))
        elif x < 0.65:
            g, a = rnd.randrange(GROUPS), rnd.randrange(KEYS_PER_GROUP - 1)
            b = min(KEYS_PER_GROUP, a + 1 + rnd.randrange(6))
            end = key_of(g, b) if b < KEYS_PER_GROUP else prefix_end(b"/w/g%d/" % g)
            r = rpc.delete(key_of(g, a), end)
            self.records.append((r.header.revision, [("del", kv.key) for kv in r.prev_kvs]))
        else:
            self.txn()

    def txn(self):
        """A compare on one key; either branch puts and deletes several
        distinct keys (etcd forbids overlapping writes in one txn)."""
        rnd, M = self.rnd, self.rpc.M
        keys = rnd.sample(ALL_KEYS, 7)
        ck = keys[0]
        C = M("Compare")
        cmp = C(key=ck, target=C.CompareTarget.Value("VERSION"),
                result=C.CompareResult.Value(rnd.choice(["GREATER", "EQUAL"])), version=0)

        def branch(ks):
            ops, plan = [], []
            for k in ks:
                if rnd.random() < 0.7:
                    v = self.value()
                    ops.append(M("RequestOp")(request_put=M("PutRequest")(key=k, value=v)))
                    plan.append(("put", k, v))
                else:
                    ops.append(M("RequestOp")(request_delete_range=M("DeleteRangeRequest")(
                        key=k, prev_kv=True)))
                    plan.append(("del", k))
            return ops, plan

        s_ops, s_plan = branch(keys[1:1 + rnd.randint(1, 3)])
        f_ops, f_plan = branch(keys[4:4 + rnd.randint(1, 3)])
        r = self.rpc.txn(M("TxnRequest")(compare=[cmp], success=s_ops, failure=f_ops))
        plan = s_plan if r.succeeded else f_plan
        if len(r.responses) != len(plan):
            raise Failure("txn: %d responses for %d ops" % (len(r.responses), len(plan)))
        ops = []
        for p, resp in zip(plan, r.responses):
            if p[0] == "put":
                if not resp.HasField("response_put"):
                    raise Failure("txn: put answered by %s" % resp.WhichOneof("response"))
                ops.append(p)
            else:
                if not resp.HasField("response_delete_range"):
                    raise Failure("txn: delete answered by %s" % resp.WhichOneof("response"))
                ops += [("del", kv.key) for kv in resp.response_delete_range.prev_kvs]
        self.records.append((r.header.revision, ops))

    def run(self, stop_at):
        period = 1.0 / self.rate
        nxt = time.monotonic()
        try:
            while time.monotonic() < stop_at:
                self.one()
                nxt += period
                d = nxt - time.monotonic()
                if d > 0:
                    time.sleep(d)
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            self.error = e

    def run_n(self, n):
        for _ in range(n):
            self.one()


# --------------------------------------------------------------------------
# The history, as the writers' acknowledged records say it is

class History:
    """events[rev] = [(type, key, kv tuple, prev kv tuple or None)], in the
    order the write made them; a kv tuple is (key, value, create, mod,
    version); a DELETE event's kv is (key, b"", 0, rev, 0) as etcd sends it."""

    def __init__(self, records, first_rev):
        self.first = first_rev
        by_rev = {}
        for rev, ops in records:
            if not ops:
                continue        # a delete that removed nothing: no revision
            if rev in by_rev:
                raise Failure("two acknowledged writes share revision %d: %r and %r"
                              % (rev, by_rev[rev], ops))
            by_rev[rev] = ops
        self.last = max(by_rev) if by_rev else first_rev - 1
        missing = [r for r in range(first_rev, self.last + 1) if r not in by_rev]
        if missing or (by_rev and min(by_rev) < first_rev):
            raise Failure("revisions not consecutive from %d: missing %s, lowest %d"
                          % (first_rev, missing[:10], min(by_rev)))
        self.events = {}
        self.states = {}        # rev -> {key: kv tuple} after rev
        state = {}
        for rev in range(first_rev, self.last + 1):
            evs = []
            for op in by_rev[rev]:
                k = op[1]
                prev = state.get(k)
                if op[0] == "put":
                    kv = (k, op[2], prev[2] if prev else rev, rev, prev[4] + 1 if prev else 1)
                    state[k] = kv
                    evs.append(("PUT", k, kv, prev))
                else:
                    if prev is None:
                        raise Failure("rev %d deletes %r, which the history says is absent"
                                      % (rev, k))
                    del state[k]
                    evs.append(("DELETE", k, (k, b"", 0, rev, 0), prev))
            self.events[rev] = evs
            self.states[rev] = dict(state)

    def expected(self, w):
        out = []
        for rev in range(max(w.start, self.first), self.last + 1):
            for typ, k, kv, prev in self.events[rev]:
                if not w.covers(k):
                    continue
                if typ == "PUT" and "NOPUT" in w.filters:
                    continue
                if typ == "DELETE" and "NODELETE" in w.filters:
                    continue
                out.append((typ, kv, prev if w.prev_kv else None))
        return out


def check_mvcc(rpc, hist, deadline):
    """A Range of the whole key space at every revision must show exactly
    the state the history says."""
    end = prefix_end(NS)
    for rev in range(hist.first, hist.last + 1):
        if time.monotonic() > deadline:
            raise Failure("MVCC check out of time at revision %d of %d" % (rev, hist.last))
        r = rpc.range(NS, end, rev)
        got = {kv.key: (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version)
               for kv in r.kvs}
        want = hist.states[rev]
        if got != want:
            diff = sorted(set(got) ^ set(want)) or \
                sorted(k for k in got if got[k] != want[k])
            k = diff[0]
            raise Failure("Range at revision %d differs from the acknowledged history at %r: "
                          "server %r, history %r" % (rev, k, got.get(k), want.get(k)))


# --------------------------------------------------------------------------
# Watches

class Watch:
    def __init__(self, key, end, start, prev_kv, filters, desc):
        self.key, self.end, self.start_req = key, end, start
        self.prev_kv, self.filters, self.desc = prev_kv, filters, desc
        self.start = None       # effective first revision
        self.id = None
        self.got = []           # (type, kv tuple, prev tuple or None)
        self.problems = []
        self.cancel_sent = False    # a cancel request went out mid-run
        self.canceled_at = None     # len(got) when the canceled answer came

    def covers(self, k):
        if self.end == b"":
            return k == self.key
        if self.end == b"\x00":
            return k >= self.key
        return self.key <= k < self.end


def plan_watches(rnd, n, quiet_rev):
    ws = []
    for i in range(n):
        x = rnd.random()
        if x < 0.38:
            if rnd.random() < 0.1:
                k, desc = b"/w/g%d/never" % rnd.randrange(GROUPS), "never-written key"
            else:
                k, desc = rnd.choice(ALL_KEYS), "key"
            key, end = k, b""
        elif x < 0.63:
            y = rnd.random()
            if y < 0.8:
                key = b"/w/g%d/" % rnd.randrange(GROUPS)
            elif y < 0.9:
                key = b"/w/g%d/k1" % rnd.randrange(GROUPS)
            else:
                key = NS
            key, end, desc = key, prefix_end(key), "prefix"
        elif x < 0.78:
            if rnd.random() < 0.1:
                key, desc = b"\x00", "from \\0 (everything)"
            else:
                key, desc = rnd.choice(ALL_KEYS), "from-key"
            end = b"\x00"
        else:
            a, b = sorted(rnd.sample(range(len(ALL_KEYS) + 1), 2))
            key = ALL_KEYS[a]
            end = ALL_KEYS[b] if b < len(ALL_KEYS) else prefix_end(NS)
            desc = "range"
        y = rnd.random()
        if y < 0.4:
            start = 0
        elif y < 0.9:
            start = rnd.randint(1, quiet_rev)
        else:
            start = quiet_rev + rnd.randint(1, 300)
        z = rnd.random()
        filters = ("NOPUT",) if z < 0.05 else ("NODELETE",) if z < 0.10 else ()
        prev_kv = rnd.random() < 0.25
        ws.append(Watch(key, end, start, prev_kv, filters,
                        "%s %r..%r start=%d%s%s" % (desc, key, end, start,
                                                    " prev_kv" if prev_kv else "",
                                                    "".join(" " + f for f in filters))))
    return ws


class Stream:
    """One Watch stream: a request queue, a reader thread that files every
    event under its watch, created responses matched to creates in order."""

    def __init__(self, srv, msgs, watches, channel=None, stalled=False):
        self.msgs = msgs
        self.watches = watches
        self.by_id = {}
        self.created = 0
        self.created_ev = threading.Event()
        self.problems = []
        self.reqs = queue.Queue()
        self.lock = threading.Lock()
        self.ended = None
        # A stalled stream reads nothing once its watches are created, until
        # released: a slow watcher, which must block neither the writers
        # nor the other watchers, and must still get everything later.
        self.release = threading.Event()
        if not stalled:
            self.release.set()
        stub = (channel or srv.channel).stream_stream(
            "/etcdserverpb.Watch/Watch",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=msgs["etcdserverpb.WatchResponse"].FromString)
        self.call = stub(self._requests(), timeout=STREAM_DEADLINE)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _requests(self):
        while True:
            r = self.reqs.get()
            if r is None:
                return
            yield r

    def create_all(self):
        W = self.msgs["etcdserverpb.WatchCreateRequest"]
        WR = self.msgs["etcdserverpb.WatchRequest"]
        for w in self.watches:
            r = W(key=w.key, range_end=w.end, start_revision=w.start_req, prev_kv=w.prev_kv)
            for f in w.filters:
                r.filters.append(W.FilterType.Value(f))
            self.reqs.put(WR(create_request=r))

    def _read(self):
        PUT = 0
        try:
            for m in self.call:
                if m.created:
                    if self.created >= len(self.watches):
                        self.problems.append("created response beyond the creates: %s" % m)
                        continue
                    w = self.watches[self.created]
                    w.id = m.watch_id
                    w.created_rev = m.header.revision
                    if m.watch_id in self.by_id:
                        self.problems.append("watch id %d created twice" % m.watch_id)
                    self.by_id[m.watch_id] = w
                    self.created += 1
                    if m.canceled:
                        w.problems.append("created and canceled: %r" % m.cancel_reason)
                    if m.events:
                        w.problems.append("events in the created response")
                    if self.created == len(self.watches):
                        self.created_ev.set()
                        self.release.wait(STREAM_DEADLINE)
                    continue
                w = self.by_id.get(m.watch_id)
                if w is None:
                    self.problems.append("response for unknown watch id %d (canceled=%s)"
                                         % (m.watch_id, m.canceled))
                    continue
                if w.canceled_at is not None and (m.events or m.canceled):
                    w.problems.append("%s after the canceled answer"
                                      % ("events" if m.events else "a second canceled answer"))
                if m.compact_revision or (m.canceled and not w.cancel_sent):
                    w.problems.append("canceled (%r) compact_revision=%d" %
                                      (m.cancel_reason, m.compact_revision))
                if m.canceled and m.events:
                    w.problems.append("events in the canceled answer")
                if m.canceled:
                    w.canceled_at = len(w.got)
                for ev in m.events:
                    kv = ev.kv
                    t = (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version)
                    if kv.lease:
                        w.problems.append("event with lease %d" % kv.lease)
                    p = None
                    if ev.HasField("prev_kv"):
                        pk = ev.prev_kv
                        p = (pk.key, pk.value, pk.create_revision, pk.mod_revision, pk.version)
                    w.got.append(("PUT" if ev.type == PUT else "DELETE", t, p))
            self.ended = "stream ended"
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.ended = "stream error %s: %s" % (e.code(), e.details())
        except Exception as e:  # noqa: BLE001
            self.ended = "reader raised %r" % e
        self.created_ev.set()

    def close(self):
        self.reqs.put(None)
        self.call.cancel()


# --------------------------------------------------------------------------
# One server

def run_one(kind, binary, msgs, workdir, args, deadline):
    t0 = time.monotonic()
    srv = None
    streams = []
    slow_ch = None
    try:
        for attempt in (1, 2):   # a port picked as free may be taken meanwhile
            srv = Server(kind, binary, workdir)
            try:
                srv.start(msgs, min(20.0, deadline - time.monotonic()))
                break
            except HarnessError as e:
                print("  %s: start attempt %d: %s" % (kind, attempt, e), file=sys.stderr)
                srv.stop()
                srv = None
        if srv is None:
            raise Failure("%s did not start" % kind)
        rpc = Rpc(srv, msgs)
        first = rpc.range(b"\x00", b"\x00").header.revision + 1

        # 1. a history to catch up from
        writers = [Writer(Rpc(srv, msgs), i, args.seed * 1000 + i, args.rate)
                   for i in range(args.writers)]
        for w in writers:
            w.run_n(args.pre_writes)
        if args.restart:
            # past starts must then come from the persisted history
            srv.restart(msgs)
            rpc = Rpc(srv, msgs)
            for w in writers:
                w.rpc = Rpc(srv, msgs)
        quiet_rev = rpc.range(b"\x00", b"\x00").header.revision

        # 2. the watches, created while nothing is written
        rnd = random.Random(args.seed)
        watches = plan_watches(rnd, args.watchers, quiet_rev)
        per = (len(watches) + args.streams - 1) // args.streams
        for i in range(0, len(watches), per):
            streams.append(Stream(srv, msgs, watches[i:i + per]))
            for w in watches[i:i + per]:
                w.stream = len(streams) - 1
        if args.stalled:
            # its own connection, so that only the server can be in the way
            slow_ch = grpc.insecure_channel(srv.target, options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.max_receive_message_length", 64 << 20)])
            slow = [Watch(b"\x00", b"\x00", 0, i % 2 == 0, (),
                          "stalled stream: everything%s" % (" prev_kv" if i % 2 == 0 else ""))
                    for i in range(args.stalled)]
            for w in slow:
                w.stream = len(streams)
            streams.append(Stream(srv, msgs, slow, channel=slow_ch, stalled=True))
            watches += slow
        for s in streams:
            s.create_all()
        for s in streams:
            s.created_ev.wait(max(0.1, min(CREATE_WAIT, deadline - time.monotonic())))
            if s.created != len(s.watches):
                raise Failure("stream created %d of %d watches within %.0fs (%s)"
                              % (s.created, len(s.watches), CREATE_WAIT, s.ended))
        for w in watches:
            if w.start_req == 0:
                if w.created_rev != quiet_rev:
                    raise Failure("created header revision %d, expected %d (nothing written)"
                                  % (w.created_rev, quiet_rev))
                w.start = quiet_rev + 1
            else:
                w.start = w.start_req
        t_created = time.monotonic()

        # 3. concurrent writers
        stop_at = time.monotonic() + args.duration
        ts = [threading.Thread(target=w.run, args=(stop_at,), daemon=True) for w in writers]
        n_before = sum(len(w.records) for w in writers)
        # some watches are canceled at random moments while the writers run:
        # each must then have a prefix of its events, a canceled answer,
        # and nothing after it
        to_cancel = rnd.sample([w for w in watches if w.stream < args.streams],
                               args.cancels)
        WR = msgs["etcdserverpb.WatchRequest"]
        WC = msgs["etcdserverpb.WatchCancelRequest"]

        def canceller():
            for w in sorted(to_cancel, key=lambda _w: rnd.random()):
                time.sleep(args.duration * 0.9 / max(1, len(to_cancel)))
                w.cancel_sent = True
                streams[w.stream].reqs.put(WR(cancel_request=WC(watch_id=w.id)))
        ts.append(threading.Thread(target=canceller, daemon=True))
        for t in ts:
            t.start()
        for t in ts:
            t.join(max(0.1, deadline - time.monotonic()))
            if t.is_alive():
                raise Failure("a writer did not finish by the deadline")
        for w in writers:
            if w.error is not None:
                raise Failure("writer %d failed: %r" % (w.wid, w.error))
        t_written = time.monotonic()
        for s in streams:
            s.release.set()
        n_during = sum(len(w.records) for w in writers) - n_before
        n_target = args.rate * args.duration * len(writers)

        # 4. the history and what every watch must have seen
        hist = History([r for w in writers for r in w.records], first)
        for w in watches:
            w.want = hist.expected(w)
        n_want = sum(len(w.want) for w in watches)
        drain_end = min(deadline, time.monotonic() + DRAIN_WAIT)
        while time.monotonic() < drain_end:
            if all(w.canceled_at is not None if w.cancel_sent else len(w.got) >= len(w.want)
                   for w in watches):
                break
            if any(s.ended for s in streams):
                break
            time.sleep(0.1)
        t_drained = time.monotonic()
        time.sleep(QUIET)
        n_got = sum(len(w.got) for w in watches)
        check_mvcc(rpc, hist, deadline)

        failures = []
        for s in streams:
            if s.ended:
                failures.append("a stream ended early: %s" % s.ended)
            failures += s.problems
        for w in watches:
            name = "stream %d watch %d (%s)" % (w.stream, w.id, w.desc)
            failures += ["%s: %s" % (name, p) for p in w.problems]
            if w.cancel_sent:
                if w.canceled_at is None:
                    failures.append("%s: canceled mid-run, no canceled answer" % name)
                # etcd 3.4 may send the last events before a cancel without
                # their prev_kv (its send loop forgets the watch's prev_kv
                # flag when the cancel arrives): prev_kv, when there, must
                # be right; it may be missing.
                want = [(wv[0], wv[1], None) if g[2] is None and g[:2] == wv[:2] else wv
                        for g, wv in zip(w.got, w.want)]
                if len(w.got) > len(w.want) or w.got != want:
                    failures.append("%s: canceled mid-run, events not a prefix of the expected: "
                                    "%s" % (name, explain(w.got, want + w.want[len(want):])))
            elif w.got != w.want:
                failures.append("%s: %s" % (name, explain(w.got, w.want)))
        n_writes = sum(len(w.records) for w in writers)
        print("%s: %d watches on %d streams (%d on a stalled one); %d writes, revisions %d..%d (%d before the "
              "watches); %d events expected (all of them for the %d watches canceled mid-run), %d received; created in %.1fs, writes %.1fs, "
              "drained %.1fs after; %.1fs in all"
              % (kind, len(watches), len(streams), args.stalled, n_writes, hist.first, hist.last,
                 quiet_rev - first + 1, n_want, len(to_cancel), n_got, t_created - t0, t_written - t_created,
                 t_drained - t_written, time.monotonic() - t0))
        if n_during < 0.5 * n_target:
            failures.append("writers made %d writes while watched, half their target is %.0f: "
                            "are watchers (the stalled stream?) slowing writes down?"
                            % (n_during, 0.5 * n_target))
        if hist.last - quiet_rev < 50:
            failures.append("only %d revisions written while watching: too few to mean much"
                            % (hist.last - quiet_rev))
        return failures
    finally:
        for s in streams:
            s.release.set()
            try:
                s.close()
            except Exception:  # noqa: BLE001
                pass
        if slow_ch is not None:
            slow_ch.close()
        if srv is not None:
            srv.stop()
            if kind == "cairn":
                rep = srv.sanitizer_report()
                if rep:
                    print("cairn sanitizer report:\n" + rep)


def explain(got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            extra = ""
            if g in want:
                j = want.index(g)
                extra = " (received event is expected at position %d: %s)" % (
                    j, "duplicate or out of order" if j < i else "events skipped")
            return ("%d received, %d expected; first difference at event %d: received %r, "
                    "expected %r%s" % (len(got), len(want), i, g, w, extra))
    if len(got) < len(want):
        return "%d received, %d expected; missing from %r on" % (len(got), len(want),
                                                                  want[len(got)])
    return "%d received, %d expected; extra from %r on" % (len(got), len(want), got[len(want)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cairn", default=os.path.join(REPO, "build", "cairn"))
    ap.add_argument("--etcd", default="/usr/bin/etcd")
    ap.add_argument("--target", choices=("both", "etcd", "cairn"), default="both")
    ap.add_argument("--proto", default=os.path.join(REPO, "proto"))
    ap.add_argument("--watchers", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--rate", type=float, default=40.0, help="writes/s per writer")
    ap.add_argument("--pre-writes", type=int, default=60, help="per writer, before watching")
    ap.add_argument("--duration", type=float, default=12.0, help="seconds of concurrent writes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-restart", dest="restart", action="store_false",
                    help="do not restart the server (SIGTERM, same data dir) after the "
                         "first writes (by default past starts are served from the "
                         "history persisted before the restart)")
    ap.add_argument("--cancels", type=int, default=50,
                    help="watches canceled at random moments while the writers run")
    ap.add_argument("--stalled", type=int, default=20,
                    help="watches of everything on one extra stream that reads nothing "
                         "until the writers stop")
    args = ap.parse_args()

    def on_alarm(_sig, _frm):
        raise HardTimeout()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_alarm)
    signal.alarm(HARD_TIMEOUT)
    t_start = time.monotonic()
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    workdir = tempfile.mkdtemp(prefix="cairn-watch-stress-", dir=shm)
    ok = True
    try:
        msgs = load_messages(args.proto, workdir)
        targets = []
        if args.target in ("both", "etcd"):
            targets.append(("etcd", args.etcd))
        if args.target in ("both", "cairn"):
            targets.append(("cairn", args.cairn))
        for i, (kind, binary) in enumerate(targets):
            if not os.access(binary, os.X_OK):
                print("FAIL %s: binary %s not found" % (kind, binary))
                ok = False
                continue
            left = HARD_TIMEOUT - 10 - (time.monotonic() - t_start)
            deadline = time.monotonic() + left / (len(targets) - i)
            try:
                failures = run_one(kind, binary, msgs, workdir, args, deadline)
            except (Failure, HarnessError, grpc.RpcError) as e:
                failures = ["%s: %s" % (type(e).__name__, e)]
            for f in failures[:30]:
                print("FAIL %s: %s" % (kind, f))
            if len(failures) > 30:
                print("FAIL %s: ... and %d more" % (kind, len(failures) - 30))
            print("%s: %s" % (kind, "FAIL" if failures else "ok"))
            ok = ok and not failures
        return 0 if ok else 1
    except HardTimeout:
        print("FAIL: hard timeout of %ds reached" % HARD_TIMEOUT)
        return 2
    finally:
        signal.alarm(0)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
