"""The Watch conformance checks (suite "watch"): etcd's bidirectional
/etcdserverpb.Watch/Watch stream, measured against etcd 3.4.

A check opens one or more streams (WatchStream below: a writer queue and a
reader thread, every wait bounded), sends create / cancel / progress
requests, makes writes with the KV calls of the harness context, and returns
the normalised responses it received: revisions relative to the check's
start, keys in the check's namespace shown as "~key", lease ids as L1, L2,
event type always spelt out (PUT is proto3's default and would vanish).
"Nothing more arrived" is asserted by waiting a short, fixed time (QUIET)
and returning what came; against etcd that is always nothing, so a check
never depends on how fast a server is, only on what it sends.

No expected value is written here: etcd's answers are the expectation
(WATCH-LEASE-MEASURED.md summarises them). Opt-in: the harness runs this
suite only with --suite watch (or all) until cairn serves Watch.
"""

import queue
import threading

import grpc

from checks_kv import check, PREFIX, FROMKEY

RECV_TIMEOUT = 5.0    # seconds to wait for a response that must come
QUIET = 0.4           # seconds of silence that count as "nothing more"
STREAM_DEADLINE = 60  # seconds a stream may live at most


class Bidi:
    """One bidirectional stream on the check's server: requests go through a
    queue, a reader thread collects the responses; every wait is bounded."""

    PATH = None
    RESPONSE = None

    def __init__(self, c):
        self.c = c
        self.reqs = queue.Queue()
        self.resps = queue.Queue()
        self.closed = None
        stub = c.server.channel.stream_stream(
            self.PATH,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=c.M(self.RESPONSE).FromString)
        self.call = stub(self._requests(), timeout=STREAM_DEADLINE)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        c.__dict__.setdefault("_streams", []).append(self)

    def _requests(self):
        while True:
            r = self.reqs.get()
            if r is None:
                return
            yield r

    def _read(self):
        try:
            for m in self.call:
                self.resps.put(("msg", m))
            self.resps.put(("end", None))
        except grpc.RpcError as e:
            code = e.code()
            self.resps.put(("error", [code.name if code else "UNKNOWN", e.details()]))
        except Exception as e:  # noqa: BLE001  (reported as a result)
            self.resps.put(("error", ["HARNESS", repr(e)]))

    def send_raw(self, req):
        self.reqs.put(req)

    def norm(self, m):
        return self.c.norm(m)

    def _next(self, timeout):
        if self.closed is not None:
            return self.closed
        try:
            kind, v = self.resps.get(timeout=timeout)
        except queue.Empty:
            return {"timeout": True}
        if kind == "msg":
            return self.norm(v)
        self.closed = {"stream_end": True} if kind == "end" else {"error": v}
        return self.closed

    def recv(self, timeout=RECV_TIMEOUT):
        """The next response (normalised), {"timeout": True}, or how the
        stream ended."""
        return self._next(timeout)

    def recv_n(self, n, timeout=RECV_TIMEOUT):
        out = []
        for _ in range(n):
            r = self._next(timeout)
            out.append(r)
            if "timeout" in r or "error" in r or "stream_end" in r:
                break
        return out

    def quiet(self, wait=QUIET):
        """Whatever arrives within `wait` seconds (against etcd: nothing)."""
        out = []
        while True:
            r = self._next(wait)
            if "timeout" in r:
                return out
            out.append(r)
            if "error" in r or "stream_end" in r:
                return out

    def close(self):
        self.reqs.put(None)
        self.call.cancel()


class WatchStream(Bidi):
    """One Watch stream."""

    PATH = "/etcdserverpb.Watch/Watch"
    RESPONSE = "WatchResponse"

    def norm(self, m):
        return norm_watch(self.c, m)

    # ---- requests
    def create(self, key, end=None, start=None, absstart=None, prev_kv=False,
               filters=(), progress_notify=False, watch_id=None, fragment=False):
        """start: revision relative to the check's start (absstart: as is)."""
        c = self.c
        k = c.key(key)
        W = c.M("WatchCreateRequest")
        r = W(key=k, range_end=c.end(k, end), prev_kv=prev_kv,
              progress_notify=progress_notify, fragment=fragment)
        if absstart is not None:
            r.start_revision = absstart
        elif start is not None:
            r.start_revision = c.absrev(start)
        for f in filters:
            r.filters.append(W.FilterType.Value(f))
        if watch_id is not None:
            r.watch_id = watch_id
        self.reqs.put(c.M("WatchRequest")(create_request=r))

    def cancel(self, watch_id):
        c = self.c
        self.reqs.put(c.M("WatchRequest")(
            cancel_request=c.M("WatchCancelRequest")(watch_id=watch_id)))

    def progress(self):
        c = self.c
        self.reqs.put(c.M("WatchRequest")(progress_request=c.M("WatchProgressRequest")()))

    def events(self, n, timeout=RECV_TIMEOUT):
        """Responses until n events have come (or a wait runs out)."""
        out, got = [], 0
        while got < n:
            r = self._next(timeout)
            out.append(r)
            if "timeout" in r or "error" in r or "stream_end" in r:
                break
            got += len(r.get("events", []))
        return out


def norm_watch(c, m):
    out = c.norm(m)
    for ev in out.get("events", []):
        ev.setdefault("type", "PUT")
    return out


def close_streams(c):
    for s in c.__dict__.get("_streams", []):
        try:
            s.close()
        except Exception:  # noqa: BLE001
            pass


def wcheck(name, suite="watch"):
    """check() that closes the check's streams afterwards."""
    def deco(fn):
        def run(c):
            try:
                return fn(c)
            finally:
                close_streams(c)
        run.__name__ = fn.__name__
        return check(suite, name)(run)
    return deco


def created(c, **kw):
    """A new stream with one watch created; (stream, created response)."""
    w = WatchStream(c)
    w.create(**kw)
    return w, w.recv()


def grant(c, ttl=600, lease_id=0):
    """LeaseGrant, the id registered as L<n> for the results."""
    r = c.raw("/etcdserverpb.Lease/LeaseGrant",
              c.M("LeaseGrantRequest")(TTL=ttl, ID=lease_id), "LeaseGrantResponse")
    c.leases[r.ID] = "L%d" % (len(c.leases) + 1)
    return r.ID


# ==========================================================================
# create: the created response, ids

@wcheck("watch.fresh.negative_start_never_compacted")
def _(c):
    # First in the suite, so the server has never compacted: the
    # compact_revision etcd reports is shown as it is, not relative.
    w, r = created(c, key="a", absstart=-3)
    rs = w.recv_n(1)
    for x in rs:
        if "compact_revision" in x:
            x["compact_revision"] = "abs %d" % (int(x["compact_revision"][1:]) + c.base)
    return [r, rs, w.quiet()]


@wcheck("watch.create.response")
def _(c):
    w, r = created(c, key="a")
    return [r, w.quiet()]


@wcheck("watch.create.auto_ids_per_stream")
def _(c):
    w1 = WatchStream(c)
    for k in ("a", "b", "c"):
        w1.create(key=k)
    first = w1.recv_n(3)
    w2 = WatchStream(c)
    w2.create(key="a")
    return [first, w2.recv()]


@wcheck("watch.create.explicit_id")
def _(c):
    w = WatchStream(c)
    w.create(key="a", watch_id=7)
    r1 = w.recv()
    c.put("a", "1")
    return [r1, w.recv()]


@wcheck("watch.create.explicit_id_duplicate")
def _(c):
    w = WatchStream(c)
    w.create(key="a", watch_id=7)
    w.create(key="b", watch_id=7)
    rs = w.recv_n(2)
    c.put("a", "1")
    c.put("b", "2")
    return [rs, w.events(1), w.quiet()]


@wcheck("watch.create.explicit_zero_means_auto")
def _(c):
    w = WatchStream(c)
    w.create(key="a")
    w.create(key="b", watch_id=0)
    return [w.recv_n(2), w.quiet()]


@wcheck("watch.create.auto_then_explicit_taken")
def _(c):
    w = WatchStream(c)
    w.create(key="a")
    w.create(key="b")
    w.create(key="c", watch_id=1)
    return [w.recv_n(3), w.quiet()]


@wcheck("watch.create.explicit_then_auto")
def _(c):
    w = WatchStream(c)
    w.create(key="a", watch_id=1)
    w.create(key="b")
    w.create(key="c")
    return w.recv_n(3)


@wcheck("watch.create.explicit_large_and_negative_id")
def _(c):
    w = WatchStream(c)
    w.create(key="a", watch_id=1 << 40)
    w.create(key="b", watch_id=-5)
    return [w.recv_n(2), w.quiet()]


@wcheck("watch.create.same_key_twice_one_stream")
def _(c):
    w = WatchStream(c)
    w.create(key="a")
    w.create(key="a")
    rs = w.recv_n(2)
    c.put("a", "1")
    evs = w.recv_n(2)
    return [rs, sorted(evs, key=lambda r: r.get("watch_id", 0)), w.quiet()]


@wcheck("watch.create.empty_key")
def _(c):
    w, r = created(c, key=b"")
    return [r, w.quiet()]


@wcheck("watch.create.request_without_union")
def _(c):
    w = WatchStream(c)
    w.send_raw(c.M("WatchRequest")())
    q = w.quiet()
    w.create(key="a")
    return [q, w.recv()]


@wcheck("watch.create.progress_notify_flag")
def _(c):
    w, r = created(c, key="a", progress_notify=True)
    c.put("a", "1")
    return [r, w.events(1), w.quiet()]


# ==========================================================================
# events: kinds and kv fields

@wcheck("watch.event.put_new_key")
def _(c):
    w, _r = created(c, key="a")
    c.put("a", "1")
    return [w.events(1), w.quiet()]


@wcheck("watch.event.put_existing_key")
def _(c):
    c.put("a", "1")
    w, _r = created(c, key="a")
    c.put("a", "2")
    c.put("a", "3")
    return [w.events(2), w.quiet()]


@wcheck("watch.event.delete")
def _(c):
    c.put("a", "1")
    w, _r = created(c, key="a")
    c.delete("a")
    return [w.events(1), w.quiet()]


@wcheck("watch.event.delete_missing_key_none")
def _(c):
    w, _r = created(c, key="a")
    c.delete("a")
    c.put("b", "x")
    return w.quiet()


@wcheck("watch.event.put_after_delete")
def _(c):
    c.put("a", "1")
    c.delete("a")
    w, _r = created(c, key="a")
    c.put("a", "2")
    return w.events(1)


@wcheck("watch.event.prev_kv_put")
def _(c):
    w, _r = created(c, key="a", prev_kv=True)
    c.put("a", "1")
    c.put("a", "2")
    return w.events(2)


@wcheck("watch.event.prev_kv_delete")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    w, _r = created(c, key="a", prev_kv=True)
    c.delete("a")
    return w.events(1)


@wcheck("watch.event.lease_field")
def _(c):
    lid = grant(c)
    w, _r = created(c, key="a", prev_kv=True)
    c.put("a", "1", lease=lid)
    c.put("a", "2")
    c.delete("a")
    return w.events(3)


@wcheck("watch.event.ignore_value_and_lease")
def _(c):
    lid = grant(c)
    c.put("a", "v", lease=lid)
    w, _r = created(c, key="a", prev_kv=True)
    c.put("a", ignore_value=True, ignore_lease=True)
    return w.events(1)


@wcheck("watch.event.empty_value")
def _(c):
    w, _r = created(c, key="a")
    c.put("a", "")
    return w.events(1)


@wcheck("watch.event.lease_revoke_deletes")
def _(c):
    lid = grant(c)
    c.put("b", "1", lease=lid)
    c.put("a", "2", lease=lid)
    c.put("c", "3")
    w, _r = created(c, key=c.ns, end=PREFIX, prev_kv=True)
    c.revoke(lid)
    return [w.events(2), w.quiet()]


# ==========================================================================
# ranges

@wcheck("watch.range.prefix")
def _(c):
    w, r = created(c, key="p/", end=PREFIX)
    c.put("p", "no")
    c.put("p/a", "1")
    c.put("p0", "no")
    c.put("p/b/c", "2")
    c.put("q", "no")
    return [r, w.events(2), w.quiet()]


@wcheck("watch.range.explicit_end")
def _(c):
    w, _r = created(c, key="b", end="d")
    for k in ("a", "b", "bz", "c", "d", "e"):
        c.put(k, k)
    return [w.events(3), w.quiet()]


@wcheck("watch.range.fromkey")
def _(c):
    w, _r = created(c, key=c.ns + b"m", end=FROMKEY)
    c.put("a", "no")
    c.put("m", "1")
    c.put("z", "2")
    c.put(c.ns + b"\xff\xff", "3")
    return [w.events(3), w.quiet()]


@wcheck("watch.range.end_before_key")
def _(c):
    w, r = created(c, key="d", end="b")
    c.put("a", "1")
    c.put("c", "2")
    c.put("d", "3")
    c.put("e", "4")
    return [r, w.quiet()]


@wcheck("watch.range.end_equals_key")
def _(c):
    w, r = created(c, key="d", end="d")
    c.put("d", "3")
    return [r, w.quiet()]


@wcheck("watch.range.prefix_past_replay_of_range")
def _(c):
    c.put("r/a", "1")
    c.put("s", "no")
    c.put("r/b", "2")
    w, r = created(c, key="r/", end=PREFIX, start=1)
    return [r, w.events(2), w.quiet()]


# ==========================================================================
# one revision, one response: txn and multi-key deletes

@wcheck("watch.batch.txn_puts_one_response")
def _(c):
    w, _r = created(c, key=c.ns, end=PREFIX)
    c.txn(success=[c.op_put("c", "3"), c.op_put("a", "1"), c.op_put("b", "2")])
    return [w.events(3), w.quiet()]


@wcheck("watch.batch.txn_put_and_delete")
def _(c):
    c.put("d", "old")
    w, _r = created(c, key=c.ns, end=PREFIX, prev_kv=True)
    c.txn(success=[c.op_put("e", "1"), c.op_del("d"), c.op_put("a", "2")])
    return [w.events(3), w.quiet()]


@wcheck("watch.batch.txn_delete_then_put_same_key")
def _(c):
    c.put("a", "old")
    w, _r = created(c, key=c.ns, end=PREFIX, prev_kv=True)
    r = c.txn(success=[c.op_del("a"), c.op_put("a", "new")])
    return [r.get("error"), w.quiet()]


@wcheck("watch.batch.prefix_delete_one_response")
def _(c):
    for k in ("k/c", "k/a", "k/b"):
        c.put(k, k)
    w, _r = created(c, key="k/", end=PREFIX)
    c.delete("k/", end=PREFIX)
    return [w.events(3), w.quiet()]


@wcheck("watch.batch.partial_range_watch_of_txn")
def _(c):
    w, _r = created(c, key="b")
    c.txn(success=[c.op_put("a", "1"), c.op_put("b", "2"), c.op_put("c", "3")])
    return [w.events(1), w.quiet()]


@wcheck("watch.batch.read_only_txn_none")
def _(c):
    c.put("a", "1")
    w, _r = created(c, key=c.ns, end=PREFIX)
    c.txn(success=[c.op_range("a")])
    c.txn(compare=[c.cmp("a", "VALUE", "EQUAL", "zzz")], success=[c.op_put("a", "x")])
    return w.quiet()


# ==========================================================================
# start_revision: replay, now, future, compacted

@wcheck("watch.start.past_replay_then_live")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    c.delete("a")
    c.put("a", "3")
    w, r = created(c, key="a", start=1)
    replay = w.events(4)
    c.put("a", "4")
    return [r, replay, w.events(1), w.quiet()]


@wcheck("watch.start.past_replay_grouping")
def _(c):
    c.txn(success=[c.op_put("a", "1"), c.op_put("b", "1")])
    c.put("a", "2")
    c.txn(success=[c.op_put("a", "3"), c.op_put("b", "3")])
    w, r = created(c, key=c.ns, end=PREFIX, start=1)
    return [r, w.events(5), w.quiet()]


@wcheck("watch.start.past_middle")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    c.put("a", "3")
    w, r = created(c, key="a", start=2)
    return [r, w.events(2), w.quiet()]


@wcheck("watch.start.past_prev_kv_and_filter")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    c.delete("a")
    w, r = created(c, key="a", start=1, prev_kv=True, filters=["NOPUT"])
    return [r, w.events(1), w.quiet()]


@wcheck("watch.start.current_revision")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    w, r = created(c, key="a", start=2)
    return [r, w.events(1), w.quiet()]


@wcheck("watch.start.zero_is_now")
def _(c):
    c.put("a", "1")
    w, r = created(c, key="a", start=None)
    c.put("a", "2")
    return [r, w.events(1), w.quiet()]


@wcheck("watch.start.negative")
def _(c):
    c.put("a", "1")
    cr = c.compact(1)
    w, r = created(c, key="a", absstart=-3)
    return [cr, r, w.recv_n(1), w.quiet()]


@wcheck("watch.start.future")
def _(c):
    w, r = created(c, key="a", start=3)
    c.put("a", "1")
    c.put("a", "2")
    c.put("a", "3")
    c.put("a", "4")
    return [r, w.events(2), w.quiet()]


@wcheck("watch.start.compacted")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    c.put("a", "3")
    c.compact(3)
    w, r = created(c, key="a", start=1)
    return [r, w.recv_n(1), w.quiet()]


@wcheck("watch.start.compacted_other_watch_lives")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    c.compact(2)
    w = WatchStream(c)
    w.create(key="a", start=1)
    w.create(key="a")
    rs = w.recv_n(3)
    c.put("a", "3")
    return [rs, w.events(1), w.quiet()]


@wcheck("watch.start.at_compact_revision")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    c.put("a", "3")
    c.compact(2)
    w, r = created(c, key="a", start=2)
    return [r, w.events(2), w.quiet()]


@wcheck("watch.start.compaction_while_watching")
def _(c):
    w, r = created(c, key="a")
    c.put("a", "1")
    c.put("a", "2")
    c.compact(2)
    c.put("a", "3")
    return [r, w.events(3), w.quiet()]


# ==========================================================================
# filters

@wcheck("watch.filter.noput")
def _(c):
    w, r = created(c, key="a", filters=["NOPUT"])
    c.put("a", "1")
    c.delete("a")
    return [r, w.events(1), w.quiet()]


@wcheck("watch.filter.nodelete")
def _(c):
    w, r = created(c, key="a", filters=["NODELETE"])
    c.put("a", "1")
    c.delete("a")
    c.put("a", "2")
    return [r, w.events(2), w.quiet()]


@wcheck("watch.filter.both")
def _(c):
    w, r = created(c, key="a", filters=["NOPUT", "NODELETE"])
    c.put("a", "1")
    c.delete("a")
    return [r, w.quiet()]


@wcheck("watch.filter.noput_txn_mixed")
def _(c):
    c.put("b", "old")
    w, _r = created(c, key=c.ns, end=PREFIX, filters=["NOPUT"])
    c.txn(success=[c.op_put("a", "1"), c.op_del("b"), c.op_put("c", "1")])
    return [w.events(1), w.quiet()]


# ==========================================================================
# cancel

@wcheck("watch.cancel.response")
def _(c):
    w, r = created(c, key="a")
    w.cancel(0)
    cr = w.recv()
    c.put("a", "1")
    return [r, cr, w.quiet()]


@wcheck("watch.cancel.unknown_id")
def _(c):
    w, _r = created(c, key="a")
    w.cancel(42)
    q = w.quiet()
    c.put("a", "1")
    return [q, w.events(1)]


@wcheck("watch.cancel.twice")
def _(c):
    w, _r = created(c, key="a")
    w.cancel(0)
    first = w.recv()
    w.cancel(0)
    return [first, w.quiet()]


@wcheck("watch.cancel.id_not_reused_by_auto")
def _(c):
    w, _r = created(c, key="a")
    w.cancel(0)
    cr = w.recv()
    w.create(key="b")
    return [cr, w.recv()]


@wcheck("watch.cancel.explicit_id_reusable")
def _(c):
    w = WatchStream(c)
    w.create(key="a", watch_id=7)
    r1 = w.recv()
    w.cancel(7)
    r2 = w.recv()
    w.create(key="b", watch_id=7)
    r3 = w.recv()
    c.put("a", "1")
    c.put("b", "2")
    return [r1, r2, r3, w.events(1), w.quiet()]


@wcheck("watch.cancel.one_of_two")
def _(c):
    w = WatchStream(c)
    w.create(key="a")
    w.create(key="a", prev_kv=True)
    rs = w.recv_n(2)
    w.cancel(0)
    cr = w.recv()
    c.put("a", "1")
    return [rs, cr, w.events(1), w.quiet()]


# ==========================================================================
# progress requests

@wcheck("watch.progress.request_with_watch")
def _(c):
    w, _r = created(c, key="a")
    c.put("b", "1")
    w.progress()
    return [w.recv(), w.quiet()]


@wcheck("watch.progress.request_no_watch")
def _(c):
    w = WatchStream(c)
    w.progress()
    return [w.recv(), w.quiet()]


@wcheck("watch.progress.request_two_watches")
def _(c):
    w = WatchStream(c)
    w.create(key="a")
    w.create(key="b", watch_id=9)
    rs = w.recv_n(2)
    w.progress()
    return [rs, w.recv(), w.quiet()]


# ==========================================================================
# several watches, several streams, headers

@wcheck("watch.multi.overlapping_on_one_stream")
def _(c):
    w = WatchStream(c)
    w.create(key=c.ns, end=PREFIX)
    w.create(key="a", prev_kv=True)
    w.create(key="b")
    rs = w.recv_n(3)
    c.put("a", "1")
    c.put("b", "2")
    c.put("a", "3")
    evs = w.recv_n(6)
    return [rs, sorted(evs, key=lambda r: (r.get("header", {}).get("revision", ""),
                                             r.get("watch_id", 0))), w.quiet()]


@wcheck("watch.multi.two_streams_same_key")
def _(c):
    w1, r1 = created(c, key="a")
    w2, r2 = created(c, key="a", prev_kv=True)
    c.put("a", "1")
    c.put("a", "2")
    return [r1, r2, w1.events(2), w2.events(2), w1.quiet(), w2.quiet()]


@wcheck("watch.multi.stream_close_other_stream_lives")
def _(c):
    w1, _r1 = created(c, key="a")
    w2, _r2 = created(c, key="a")
    w1.close()
    c.put("a", "1")
    return w2.events(1)


@wcheck("watch.header.event_revisions")
def _(c):
    w, r = created(c, key="a")
    c.put("b", "1")
    c.put("a", "1")
    c.put("b", "2")
    c.put("a", "2")
    return [r, w.events(2)]


@wcheck("watch.header.replay_header")
def _(c):
    c.put("a", "1")
    c.put("b", "1")
    c.put("b", "2")
    w, r = created(c, key="a", start=1)
    return [r, w.events(1)]


# ==========================================================================
# fragment: responses larger than the request limit (1.5 MiB in etcd)

def _big(c, n):
    for i in range(n):
        c.call("/etcdserverpb.KV/Put",
               c.M("PutRequest")(key=c.key("f/%d" % i), value=bytes([65 + i]) * (1 << 20)),
               "PutResponse")


def _frag_summary(rs):
    """Responses of a fragmented delivery in short: (fragment flag, number of
    events, their keys) each."""
    out = []
    for r in rs:
        if "events" not in r:
            out.append(r)
            continue
        out.append({"fragment": r.get("fragment", False), "watch_id": r.get("watch_id", 0),
                    "revision": r["header"]["revision"],
                    "events": [(e["type"], e["kv"]["key"], e.get("prev_kv", {}).get("value", "-"))
                               for e in r["events"]]})
    return out


@wcheck("watch.fragment.large_delete_fragmented")
def _(c):
    _big(c, 3)
    w, r = created(c, key="f/", end=PREFIX, prev_kv=True, fragment=True)
    c.delete("f/", end=PREFIX)
    return [r, _frag_summary(w.events(3)), w.quiet()]


@wcheck("watch.fragment.large_delete_unfragmented")
def _(c):
    _big(c, 3)
    w, r = created(c, key="f/", end=PREFIX, prev_kv=True)
    c.delete("f/", end=PREFIX)
    return [r, _frag_summary(w.events(3)), w.quiet()]


@wcheck("watch.fragment.small_not_fragmented")
def _(c):
    w, r = created(c, key=c.ns, end=PREFIX, fragment=True)
    c.txn(success=[c.op_put("a", "1"), c.op_put("b", "2")])
    return [r, w.events(2), w.quiet()]


def _big_revs(c, n, size):
    """n Puts of `size` bytes each under f/, one revision each."""
    for i in range(n):
        c.call("/etcdserverpb.KV/Put",
               c.M("PutRequest")(key=c.key("f/%d" % i), value=bytes([65 + i]) * size),
               "PutResponse")


def _catchup(c, n, size, fragment):
    """The replay of n revisions of `size`-byte values, in short."""
    _big_revs(c, n, size)
    w, r = created(c, key="f/", end=PREFIX, start=1, fragment=fragment)
    return [r, _frag_summary(w.events(n)), w.quiet()]


@wcheck("watch.fragment.catchup_fragmented")
def _(c):
    # Four 700 KiB values (2.8 MB) replayed to a fragmenting watcher: cut
    # where a fragment would reach max-request-bytes + 512 KiB.
    return _catchup(c, 4, 700 << 10, True)


@wcheck("watch.fragment.catchup_unfragmented")
def _(c):
    # The same replay without fragment: one response, whatever its size.
    return _catchup(c, 4, 700 << 10, False)


@wcheck("watch.fragment.limit_past_request_limit")
def _(c):
    # Two 900 KiB events (1.8 MB) are past the request limit (1.5 MiB) but
    # under the limit plus etcd's 512 KiB of gRPC overhead: still one
    # fragment.
    return _catchup(c, 4, 900 << 10, True)


@wcheck("watch.start.catchup_past_cairn_bound")
def _(c):
    # Eight 700 KiB values (5.6 MB) replayed, without and with fragment.
    _big_revs(c, 8, 700 << 10)
    w1, r1 = created(c, key="f/", end=PREFIX, start=1)
    w2, r2 = created(c, key="f/", end=PREFIX, start=1, fragment=True)
    return [r1, _frag_summary(w1.events(8)), w1.quiet(),
            r2, _frag_summary(w2.events(8)), w2.quiet()]


# ==========================================================================
# more replay and delete shapes

def _events_per_response(rs):
    """Replayed responses in short: (header revision, number of events,
    first and last event's mod_revision)."""
    out = []
    for r in rs:
        evs = r.get("events")
        if not evs:
            out.append(r)
            continue
        out.append([r["header"]["revision"], len(evs), evs[0]["kv"]["mod_revision"],
                    evs[-1]["kv"]["mod_revision"]])
    return out


@wcheck("watch.start.replay_of_many_revisions")
def _(c):
    # More than a thousand revisions behind: how the replay is cut up.
    put = c.M("PutRequest")
    k = c.key("a")
    for i in range(1100):
        c.raw("/etcdserverpb.KV/Put", put(key=k, value=b"%d" % i), "PutResponse")
    w, r = created(c, key="a", start=1)
    rs = w.events(1100)
    return [r, _events_per_response(rs), w.quiet()]


@wcheck("watch.batch.prefix_delete_prev_kv")
def _(c):
    lid = grant(c)
    c.put("d/b", "2", lease=lid)
    c.put("d/a", "1")
    c.put("d/c", "3")
    c.put("d/c", "33")
    w, _r = created(c, key="d/", end=PREFIX, prev_kv=True)
    d = c.delete("d/", end=PREFIX)
    out = [d, w.events(3), w.quiet()]
    c.revoke(lid)
    return out


@wcheck("watch.start.past_all_filtered")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    w, r = created(c, key="a", start=1, filters=["NOPUT"])
    q = w.quiet()
    c.delete("a")
    return [r, q, w.events(1), w.quiet()]


@wcheck("watch.cancel.during_replay_then_live_none")
def _(c):
    c.put("a", "1")
    w, r = created(c, key="a", start=1)
    rep = w.events(1)
    w.cancel(0)
    cr = w.recv()
    c.put("a", "2")
    return [r, rep, cr, w.quiet()]
