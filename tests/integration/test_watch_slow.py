#!/usr/bin/python3
"""Slow watchers (issue 6): a watcher that stops reading must block neither
the writers nor the other watchers, and must get every event afterwards:
exactly once, in revision order, nothing lost, while the server's memory
stays bounded.

Two cases, each run on a server started here (the conformance harness's
Server: random free 127.0.0.1 ports, a temporary data dir, setpriv
--pdeathsig, stopped by its own PID on every exit path):

  stalled  Several Watch streams, each on a connection of its own, create a
           live watch of a prefix and then read nothing while writers put
           1,500 values of 64 KiB (about 96 MiB, more than cairn's ring of
           recent events holds) at the fastest rate the server takes. A
           watcher on the main connection reads throughout and must have
           every event within a few seconds of the last put. Then the
           stalled streams read, and each must receive exactly the
           acknowledged puts, and an answer to each of the progress
           requests it sent while stalled. The server's RSS is sampled
           throughout; the same puts made before under another prefix,
           with a reading watcher but no stalled stream, are the control:
           the stalled streams may add less than one copy of the puts to
           the RSS growth (a queue per stalled stream would add one each),
           and the writers must keep at least half the control's rate.
  evict    cairn is started with a tiny ring (CAIRN_WATCH_RING_EVENTS, a
           test knob documented in server/etcd/watch.c; etcd ignores it) and
           without the live lag bounds (CAIRN_WATCH_LAG_REVS/BYTES), and a
           stalled live watcher lags by far more revisions than the ring
           holds while small and large values are put; afterwards it must
           receive every revision (from disk), exactly once, in order.
           A second watch on the same stream starts in the past, so a
           catch-up and a live watcher interleave (and fill the connection's
           flow-control window sooner).
  lag      A live watcher stalls while 600 values of 64 KiB are put (all
           within the ring); afterwards it must receive them all, exactly
           once and in order, in batches: at most one response per two
           revisions (etcd: victim, then unsynced, then batches).

Nothing expected is hard-coded: the expectation is what the server itself
acknowledged (every put's header revision). A hard timeout bounds the run.

Usage: test_watch_slow.py --case stalled|evict|lag [--cairn build/cairn]
       [--etcd /usr/bin/etcd] [--target cairn|etcd|both]
"""

import argparse
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "conformance"))

import grpc  # noqa: E402

from harness import HarnessError, Server, load_messages, prefix_end  # noqa: E402

HARD_TIMEOUT = 110   # seconds for the whole run (ctest allows 120)
RPC_TIMEOUT = 10.0
DRAIN_WAIT = 40.0    # after release, every stalled watch must be complete by then
QUIET = 0.5          # then this long without anything more
LIVE_LAG = 5.0       # the reading watcher: complete this long after the last put
# What stalled streams may add to the server's RSS: less than one copy of
# the puts (96 MiB), which a queue per stalled stream would hold each.
RSS_EXTRA_MAX = 64 << 20
PROGRESS_ASKS = 100  # progress requests a stalled stream sends
WRITE_RATE_MIN = 0.5 # writers keep this share of their rate without watchers


class HardTimeout(BaseException):
    pass


class Failure(Exception):
    pass


def rss_of(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.base = rss_of(pid)
        self.peak = self.base
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, rss_of(self.pid))


class WatchStream:
    """One Watch stream with one or more watches. A stalled stream reads the
    created answers, then nothing until released."""

    def __init__(self, msgs, channel, creates, stalled):
        self.msgs = msgs
        self.creates = creates
        self.ids = []
        self.events = {}        # watch index -> [(rev, key, value)]
        self.problems = []
        self.created = threading.Event()
        self.release = threading.Event()
        if not stalled:
            self.release.set()
        self.last_at = time.monotonic()
        self.done = threading.Event()
        stub = channel.stream_stream(
            "/etcdserverpb.Watch/Watch",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=msgs["etcdserverpb.WatchResponse"].FromString)
        WR = msgs["etcdserverpb.WatchRequest"]
        W = msgs["etcdserverpb.WatchCreateRequest"]
        self.reqs = queue.Queue()
        for c in creates:
            self.reqs.put(WR(create_request=W(**c)))
        self.progress = 0       # progress answers (watch_id -1)
        self.responses = 0      # answers with events
        self.hold = threading.Event()
        self.call = stub(self._requests(), timeout=HARD_TIMEOUT)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _requests(self):
        while True:
            r = self.reqs.get()
            if r is None:
                self.hold.wait(HARD_TIMEOUT)
                return
            yield r

    def ask_progress(self, n):
        WR = self.msgs["etcdserverpb.WatchRequest"]
        P = self.msgs["etcdserverpb.WatchProgressRequest"]
        for _ in range(n):
            self.reqs.put(WR(progress_request=P()))

    def _read(self):
        try:
            for m in self.call:
                if m.created:
                    if m.canceled:
                        self.problems.append("created and canceled: %r" % m.cancel_reason)
                    self.ids.append(m.watch_id)
                    self.events[len(self.ids) - 1] = []
                    if len(self.ids) == len(self.creates):
                        self.created.set()
                        self.release.wait(HARD_TIMEOUT)
                    continue
                if m.canceled or m.compact_revision:
                    self.problems.append("canceled: %r compact_revision=%d"
                                         % (m.cancel_reason, m.compact_revision))
                    continue
                if m.watch_id == -1 and not m.events:
                    self.progress += 1
                    self.last_at = time.monotonic()
                    continue
                if m.watch_id not in self.ids:
                    self.problems.append("events for unknown watch id %d" % m.watch_id)
                    continue
                got = self.events[self.ids.index(m.watch_id)]
                self.responses += 1
                for ev in m.events:
                    got.append((ev.kv.mod_revision, ev.kv.key, ev.kv.value))
                self.last_at = time.monotonic()
        except grpc.RpcError as e:
            if not self.hold.is_set():
                self.problems.append("stream ended: %s" % e.code())
        finally:
            self.done.set()

    def close(self):
        self.release.set()
        self.reqs.put(None)
        self.hold.set()
        self.call.cancel()


def put_all(srv, msgs, items, nthreads):
    """Puts items [(key, value)] from nthreads threads; returns {rev: (key,
    value)} of what the server acknowledged and the seconds it took."""
    put = srv.channel.unary_unary(
        "/etcdserverpb.KV/Put", request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=msgs["etcdserverpb.PutResponse"].FromString)
    P = msgs["etcdserverpb.PutRequest"]
    acked = {}
    errors = []
    lock = threading.Lock()

    def writer(part):
        try:
            for k, v in part:
                r = put(P(key=k, value=v), timeout=RPC_TIMEOUT)
                with lock:
                    if r.header.revision in acked:
                        errors.append("revision %d acknowledged twice" % r.header.revision)
                    acked[r.header.revision] = (k, v)
        except grpc.RpcError as e:
            errors.append("put: %s" % e.code())

    t0 = time.monotonic()
    ts = [threading.Thread(target=writer, args=(items[i::nthreads],), daemon=True)
          for i in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise Failure("writers: %s" % errors[:5])
    return acked, time.monotonic() - t0


def wait_complete(streams, want, limit, progress=0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if all(len(evs) >= want[i] for s in streams for i, evs in s.events.items()) and \
                all(s.progress >= progress for s in streams):
            break
        if any(s.done.is_set() for s in streams):
            break
        time.sleep(0.02)
    time.sleep(QUIET)


def compare(name, got, expect):
    """got and expect: [(rev, key, value)]; returns a list of problems."""
    if got == expect:
        return []
    revs = [g[0] for g in got]
    exp_revs = [e[0] for e in expect]
    out = ["%s: %d events, expected %d" % (name, len(got), len(expect))]
    if revs != sorted(revs):
        out.append("%s: revisions out of order" % name)
    if len(set(revs)) != len(revs):
        out.append("%s: %d duplicated revisions" % (name, len(revs) - len(set(revs))))
    missing = sorted(set(exp_revs) - set(revs))
    if missing:
        out.append("%s: %d revisions missing, first %s" % (name, len(missing), missing[:10]))
    extra = sorted(set(revs) - set(exp_revs))
    if extra:
        out.append("%s: %d foreign revisions, first %s" % (name, len(extra), extra[:10]))
    for g, e in zip(got, expect):
        if g != e:
            out.append("%s: first difference at revision %d (got %r)"
                       % (name, e[0], (g[0], g[1], len(g[2]))))
            break
    return out


def own_channel(srv):
    # its own connection, so that only the server can be in the way
    return grpc.insecure_channel(srv.target, options=[
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", 256 << 20)])


def case_stalled(kind, srv, msgs, args):
    prefix = b"big/"
    items = [(b"big/%03d" % (i % 100), (b"%07d," % i) * (args.value_kib * 128))
             for i in range(args.puts)]
    # Control: the same puts under another prefix, with its own reading
    # watcher and no stalled stream. The server's RSS grows with what is
    # written whether or not anyone stalls (the ring of recent events
    # fills, and the store keeps data), so the stalled streams may add at
    # most RSS_EXTRA_MAX to that growth.
    ctl_live = WatchStream(msgs, srv.channel, [dict(key=b"ctl/", range_end=prefix_end(b"ctl/"))],
                           stalled=False)
    if not ctl_live.created.wait(10):
        raise Failure("control watch not created within 10 s (%s)" % ctl_live.problems)
    control = RssSampler(srv.proc.pid)
    control.start()
    _, secs_ctl = put_all(srv, msgs, [(b"ctl/" + k[4:], v) for k, v in items], args.writers)
    rate_ctl = len(items) / secs_ctl
    wait_complete([ctl_live], {0: len(items)}, LIVE_LAG)
    control.stop.set()
    control.join()
    ctl_live.close()
    growth_ctl = control.peak - control.base
    live = WatchStream(msgs, srv.channel, [dict(key=prefix, range_end=prefix_end(prefix))],
                       stalled=False)
    chans = [own_channel(srv) for _ in range(args.streams)]
    stalled = [WatchStream(msgs, ch, [dict(key=prefix, range_end=prefix_end(prefix))],
                           stalled=True) for ch in chans]
    streams = [live] + stalled
    try:
        for s in streams:
            if not s.created.wait(10):
                raise Failure("watch not created within 10 s (%s)" % s.problems)
        sampler = RssSampler(srv.proc.pid)
        sampler.start()
        acked, secs = put_all(srv, msgs, items, args.writers)
        t_put = time.monotonic()
        rate = len(acked) / secs
        print("%s: %d puts of %d KiB in %.1f s (%.0f/s) with %d stalled streams, "
              "%.0f/s without stalled streams"
              % (kind, len(acked), args.value_kib, secs, rate, len(stalled), rate_ctl))
        expect = [(r, acked[r][0], acked[r][1]) for r in sorted(acked)]
        want = {0: len(expect)}
        wait_complete([live], want, LIVE_LAG)
        problems = ["live watcher: " + p for p in compare("live watcher", live.events[0], expect)]
        if rate < WRITE_RATE_MIN * rate_ctl:
            problems.append("writers slowed down: %.0f puts/s with stalled streams, %.0f/s "
                            "without" % (rate, rate_ctl))
        if live.last_at - t_put > LIVE_LAG:
            problems.append("live watcher: last event %.1f s after the last put"
                            % (live.last_at - t_put))
        # Requests keep coming on the stalled streams: the server may stop
        # reading them (its answers cannot go out) but must answer them all.
        for s in stalled:
            s.ask_progress(PROGRESS_ASKS)
        time.sleep(0.5)
        t_rel = time.monotonic()
        for s in stalled:
            s.release.set()
        wait_complete(stalled, want, DRAIN_WAIT, PROGRESS_ASKS)
        print("%s: stalled streams drained in %.1f s, in %s responses"
              % (kind, max([s.last_at for s in stalled] + [t_rel]) - t_rel,
                 "/".join(str(s.responses) for s in stalled)))
        sampler.stop.set()
        sampler.join()
        growth = sampler.peak - sampler.base
        print("%s: server RSS grew by %.0f MiB for the puts without stalled streams, by "
              "%.0f MiB (to %.0f MiB) for the puts while %d streams stalled and drained"
              % (kind, growth_ctl / 2**20, growth / 2**20, sampler.peak / 2**20,
                 len(stalled)))
        if kind == "cairn" and growth > growth_ctl + RSS_EXTRA_MAX:
            problems.append("server RSS grew by %.0f MiB with stalled streams, %.0f MiB "
                            "without (bound: %.0f MiB more)"
                            % (growth / 2**20, growth_ctl / 2**20, RSS_EXTRA_MAX / 2**20))
        for n, s in enumerate(stalled):
            problems += s.problems
            if s.progress != PROGRESS_ASKS:
                problems.append("stalled stream %d: %d progress answers to %d requests"
                                % (n, s.progress, PROGRESS_ASKS))
            problems += compare("stalled stream %d" % n, s.events.get(0, []), expect)
        problems += live.problems
        return problems
    finally:
        for s in streams:
            s.close()
        for ch in chans:
            ch.close()


def case_evict(kind, srv, msgs, args):
    prefix = b"ev/"
    ch = own_channel(srv)
    creates = [dict(key=prefix, range_end=prefix_end(prefix))]
    # history to start from, written before the watches
    put = srv.channel.unary_unary(
        "/etcdserverpb.KV/Put", request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=msgs["etcdserverpb.PutResponse"].FromString)
    P = msgs["etcdserverpb.PutRequest"]
    pre = {}
    for i in range(40):
        k, v = b"ev/pre%02d" % (i % 7), b"pre-%d" % i
        pre[put(P(key=k, value=v), timeout=RPC_TIMEOUT).header.revision] = (k, v)
    first = min(pre)
    creates.append(dict(key=prefix, range_end=prefix_end(prefix), start_revision=first))
    s = WatchStream(msgs, ch, creates, stalled=True)
    try:
        if not s.created.wait(10):
            raise Failure("watch not created within 10 s (%s)" % s.problems)
        # Small values (many revisions, so the ring evicts by count) and
        # large ones (so the connection's flow control fills and the
        # server cannot send).
        items = []
        for i in range(args.puts):
            size = 96 * 1024 if i % 10 == 0 else 100
            items.append((b"ev/%02d" % (i % 50), (b"%06d;" % i) * (size // 7 + 1)))
        acked, secs = put_all(srv, msgs, items, args.writers)
        print("%s: %d puts in %.1f s while the watch stream stalls"
              % (kind, len(acked), secs))
        expect = [(r, acked[r][0], acked[r][1]) for r in sorted(acked)]
        want = {0: len(expect), 1: len(pre) + len(expect)}
        s.release.set()
        wait_complete([s], want, DRAIN_WAIT)
        problems = list(s.problems)
        problems += compare("live watcher", s.events.get(0, []), expect)
        hist = [(r, pre[r][0], pre[r][1]) for r in sorted(pre)] + expect
        problems += compare("catch-up watcher", s.events.get(1, []), hist)
        return problems
    finally:
        s.close()
        ch.close()


def case_lag(kind, srv, msgs, args):
    """A stalled live watcher whose backlog stays within the ring: once it
    reads again, the backlog must come in batches (etcd: a watcher whose
    send channel filled is a victim, then unsynced, and catches up in
    batches), not one response per revision."""
    prefix = b"lag/"
    ch = own_channel(srv)
    s = WatchStream(msgs, ch, [dict(key=prefix, range_end=prefix_end(prefix))], stalled=True)
    try:
        if not s.created.wait(10):
            raise Failure("watch not created within 10 s (%s)" % s.problems)
        items = [(b"lag/%02d" % (i % 30), (b"%07d," % i) * (args.value_kib * 128))
                 for i in range(args.puts)]
        acked, secs = put_all(srv, msgs, items, args.writers)
        expect = [(r, acked[r][0], acked[r][1]) for r in sorted(acked)]
        time.sleep(0.5)
        s.release.set()
        wait_complete([s], {0: len(expect)}, DRAIN_WAIT)
        print("%s: %d puts of %d KiB in %.1f s; the stalled watcher got them in %d responses"
              % (kind, len(acked), args.value_kib, secs, s.responses))
        problems = list(s.problems)
        problems += compare("stalled watcher", s.events.get(0, []), expect)
        if s.responses > len(expect) // 2:
            problems.append("stalled watcher: %d responses for %d revisions: its backlog "
                            "did not come in batches" % (s.responses, len(expect)))
        return problems
    finally:
        s.close()
        ch.close()


# Test knobs of cairn's watch hub (server/etcd/watch.c) per case: the evict case
# shrinks the ring and lifts the live lag bounds, so that only the ring's
# eviction can make the stalled watcher fall behind.
KNOBS = {"evict": {"CAIRN_WATCH_LAG_REVS": str(1 << 40), "CAIRN_WATCH_LAG_BYTES": str(1 << 40)}}


def run_one(kind, binary, msgs, workdir, args):
    env = dict(KNOBS.get(args.case, {}))
    if args.case == "evict":
        env["CAIRN_WATCH_RING_EVENTS"] = str(args.ring)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    srv = Server(kind, binary, workdir)
    problems = []
    try:
        srv.start(msgs)
        if args.case == "stalled":
            problems = case_stalled(kind, srv, msgs, args)
        elif args.case == "lag":
            problems = case_lag(kind, srv, msgs, args)
        else:
            problems = case_evict(kind, srv, msgs, args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.stop()
    if kind == "cairn":
        if srv.proc is not None and srv.proc.returncode != 0:
            problems.append("cairn exited with %s after SIGTERM" % srv.proc.returncode)
        report = srv.sanitizer_report()
        if report:
            problems.append("sanitizer report in the server log:\n" + report)
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=("stalled", "evict", "lag"), required=True)
    ap.add_argument("--cairn", default=os.path.join(REPO, "build", "cairn"))
    ap.add_argument("--etcd", default=shutil.which("etcd"))
    ap.add_argument("--target", choices=("cairn", "etcd", "both"), default="cairn")
    ap.add_argument("--proto", default=os.path.join(REPO, "proto"))
    ap.add_argument("--puts", type=int, default=None)
    ap.add_argument("--value-kib", type=int, default=64)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--streams", type=int, default=3, help="stalled streams (stalled case)")
    ap.add_argument("--ring", type=int, default=64, help="ring events (evict case)")
    args = ap.parse_args()
    if args.puts is None:
        args.puts = {"stalled": 1500, "evict": 600, "lag": 600}[args.case]

    def on_alarm(_sig, _frm):
        raise HardTimeout()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_alarm)
    signal.alarm(HARD_TIMEOUT)
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    workdir = tempfile.mkdtemp(prefix="cairn-watch-slow-", dir=shm)
    ok = True
    try:
        msgs = load_messages(args.proto, workdir)
        targets = []
        if args.target in ("both", "etcd"):
            targets.append(("etcd", args.etcd))
        if args.target in ("both", "cairn"):
            targets.append(("cairn", args.cairn))
        for kind, binary in targets:
            try:
                problems = run_one(kind, binary, msgs, workdir, args)
            except (Failure, HarnessError, grpc.RpcError) as e:
                problems = ["%s: %s" % (type(e).__name__, e)]
            for p in problems[:30]:
                print("FAIL %s %s: %s" % (kind, args.case, p))
            ok = ok and not problems
            if not problems:
                print("ok %s %s" % (kind, args.case))
    except HardTimeout:
        print("FAIL: hard timeout (%d s)" % HARD_TIMEOUT)
        ok = False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
