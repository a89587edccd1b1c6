#!/usr/bin/python3
"""etcdctl lock and etcdctl elect against cairn as against etcd.

Both commands are clientv3 concurrency recipes: a session (a lease kept
alive by a KeepAlive stream), a key under the name's prefix created with
that lease, a Range for the owner (lowest create revision), a Watch on the
predecessor's deletion, and, for elect -l, a watch on the whole prefix. So
this exercises Lease, Watch, Txn and Range together, the way real clients
use them.

The same scenarios run on a real etcd and a real cairn (each started here on
random free 127.0.0.1 ports with a temporary data dir):

 lock.exec     A runs `etcdctl lock L -- sh -c 'echo A-start ...; sleep 2;
               echo A-end'`; B runs the same once A holds the lock. B must
               wait (its key visible under L/, nothing printed) and start
               only after A ended.
 lock.signal   C holds `etcdctl lock L2` (no command); D waits with
               `etcdctl lock L2 -- echo D`; SIGTERM to C unlocks; D runs.
 lock.queue    four contenders queued in order run one at a time, in order.
 lock.crash    E holds `etcdctl lock --ttl=3 L3` and is SIGKILLed (no
               unlock, no revoke); F gets the lock only when the lease has
               expired: not at once, and within a bound.
 elect         an observer `etcdctl elect -l E`, a campaign `elect E p1`
               (leader), a second `elect E p2` (waits); SIGTERM to p1 makes
               p2 leader; the observer prints both leaders in order; an
               observer started while p1 leads prints p1 at once, then p2.

Per server, the ordering and timing rules above are asserted; across the two
servers, every output is compared after lease ids are replaced by <id>
(revisions agree: both start empty and see the same writes). Every wait is
bounded, etcdctl processes are ours and are stopped by PID on every path,
and the whole run has a hard timeout.

Usage: test_lock_elect.py --cairn build/cairn [--etcd /usr/bin/etcd]
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import Server  # noqa: E402

HARD_TIMEOUT = 150   # seconds for the whole run
WAIT = 10.0          # seconds for something that must happen
SETPRIV = ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--"] \
    if os.access("/usr/bin/setpriv", os.X_OK) else []


class HardTimeout(BaseException):
    pass


class Fail(Exception):
    pass


class Ctl:
    """`etcdctl ARGS` in the background, its output lines time-stamped."""

    def __init__(self, srv, *args):
        env = dict(os.environ, ETCDCTL_API="3")
        self.args = args
        self.proc = subprocess.Popen(
            SETPRIV + ["etcdctl", "--endpoints=" + srv.endpoint] + list(args),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        self.lines = []     # (monotonic time, line)
        self.cv = threading.Condition()
        self.err = b""
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()
        self.te = threading.Thread(target=self._read_err, daemon=True)
        self.te.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cv:
                self.lines.append((time.monotonic(), line.decode("utf-8", "replace")
                                   .rstrip("\n")))
                self.cv.notify_all()

    def _read_err(self):
        self.err = self.proc.stderr.read()

    def text(self):
        with self.cv:
            return [l for _t, l in self.lines]

    def wait_lines(self, n, timeout=WAIT):
        """The time the n-th line arrived; Fail if it does not in time."""
        end = time.monotonic() + timeout
        with self.cv:
            while len(self.lines) < n:
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.t.is_alive()):
                    raise Fail("etcdctl %s: %d lines within %.0fs, expected %d: %r (stderr %r)"
                               % (" ".join(self.args), len(self.lines), timeout, n,
                                  [l for _t, l in self.lines], self.err[-300:]))
                self.cv.wait(min(left, 0.2))
            return self.lines[n - 1][0]

    def wait_exit(self, timeout=WAIT):
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise Fail("etcdctl %s did not exit within %.0fs" % (" ".join(self.args), timeout))
        self.t.join(2)
        self.te.join(2)
        return rc, time.monotonic()

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def keys_under(srv, prefix):
    r = srv.etcdctl("get", prefix + "/", "--prefix", "--keys-only")
    return [l for l in r.stdout.decode().split("\n") if l]


def wait_keys(srv, prefix, n):
    end = time.monotonic() + WAIT
    while True:
        ks = keys_under(srv, prefix)
        if len(ks) == n:
            return ks
        if time.monotonic() > end:
            raise Fail("%d keys under %s/ within %.0fs, expected %d: %r"
                       % (len(ks), prefix, WAIT, n, ks))
        time.sleep(0.1)


def norm(lines):
    return [re.sub(r"/[0-9a-f]{1,16}\b", "/<id>", l) for l in lines]


# --------------------------------------------------------------------------
# Scenarios: each returns its normalised outputs; Fail on a broken rule

def lock_exec(srv, procs):
    """B waits for A's lock and runs only after A's command ended. The
    commands write their own start and end times (as in lock_queue: when
    this test reads their output says nothing on a loaded machine)."""
    tmp = tempfile.mkdtemp(prefix="cairn-lock-exec-")
    try:
        stamps = {n: os.path.join(tmp, n) for n in ("A", "B")}
        script = ('date +%%s.%%N >%s; echo %s-start $ETCD_LOCK_KEY $ETCD_LOCK_REV; sleep 2; '
                  'echo %s-end; date +%%s.%%N >>%s')
        a = Ctl(srv, "lock", "L", "--", "sh", "-c", script % (stamps["A"], "A", "A", stamps["A"]))
        procs.append(a)
        a.wait_lines(1)
        b = Ctl(srv, "lock", "L", "--", "sh", "-c", script % (stamps["B"], "B", "B", stamps["B"]))
        procs.append(b)
        ks = wait_keys(srv, "L", 2)      # B's key is there: B is waiting
        if b.text():
            raise Fail("B printed %r while A held the lock" % b.text())
        rc_a, _ = a.wait_exit()
        b.wait_lines(1)
        rc_b, _ = b.wait_exit()
        span = {}
        for n, path in stamps.items():
            with open(path) as f:
                t = [float(x) for x in f.read().split()]
            if len(t) != 2:
                raise Fail("%s wrote %d time stamps" % (n, len(t)))
            span[n] = t
        if span["B"][0] < span["A"][1]:
            raise Fail("B started %.3fs before A ended" % (span["A"][1] - span["B"][0]))
        if span["B"][0] - span["A"][0] < 1.8:
            raise Fail("B started %.2fs after A, inside A's 2 s critical section"
                       % (span["B"][0] - span["A"][0]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    a_key, b_key = a.text()[0].split()[1], b.text()[0].split()[1]
    if a_key == b_key or sorted([a_key, b_key]) != sorted(ks):
        raise Fail("lock keys: A %s, B %s, under L/ while waiting: %r" % (a_key, b_key, ks))
    if rc_a or rc_b:
        raise Fail("exit codes A %d, B %d" % (rc_a, rc_b))
    left = keys_under(srv, "L")
    if left:
        raise Fail("keys left under L/ after both unlocked: %r" % left)
    return {"A": norm(a.text()), "B": norm(b.text())}


def lock_signal(srv, procs):
    c = Ctl(srv, "lock", "L2")
    procs.append(c)
    c.wait_lines(1)
    d = Ctl(srv, "lock", "L2", "--", "echo", "D")
    procs.append(d)
    wait_keys(srv, "L2", 2)
    time.sleep(0.5)
    if d.text():
        raise Fail("D printed %r while C held the lock" % d.text())
    t_sig = time.monotonic()
    c.signal(signal.SIGTERM)
    rc_c, _ = c.wait_exit()
    t_d = d.wait_lines(1)
    rc_d, _ = d.wait_exit()
    if t_d - t_sig > 5:
        raise Fail("D ran %.1fs after C was told to unlock" % (t_d - t_sig))
    if rc_d:
        raise Fail("D exited with %d" % rc_d)
    wait_keys(srv, "L2", 0)
    return {"C": norm(c.text()), "C.rc": rc_c, "D": norm(d.text())}


def lock_queue(srv, procs):
    """Four contenders queue up in order; each runs alone, in that order.
    Each contender's command writes its own start and end time (the
    clock of the command itself, not when this test happened to read its
    output, which a loaded machine delays by more than the margin)."""
    tmp = tempfile.mkdtemp(prefix="cairn-lock-queue-")
    try:
        cs = []
        for i in range(4):
            # the first holds long enough for the others to queue up behind it
            stamps = os.path.join(tmp, "c%d" % i)
            c = Ctl(srv, "lock", "Q", "--", "sh", "-c",
                    "date +%%s.%%N >%s; echo %d-start $ETCD_LOCK_REV; sleep %s; "
                    "echo %d-end; date +%%s.%%N >>%s"
                    % (stamps, i, "3" if i == 0 else "0.3", i, stamps))
            procs.append(c)
            cs.append(c)
            if i == 0:
                c.wait_lines(1)
            else:
                wait_keys(srv, "Q", i + 1)
        spans = []
        for i, c in enumerate(cs):
            rc, _ = c.wait_exit(WAIT + 2)
            if rc or len(c.lines) != 2:
                raise Fail("contender %d: exit %d, printed %r" % (i, rc, c.text()))
            with open(os.path.join(tmp, "c%d" % i)) as f:
                t = [float(x) for x in f.read().split()]
            if len(t) != 2:
                raise Fail("contender %d: wrote %d time stamps" % (i, len(t)))
            spans.append((t[0], t[1]))
        for i in range(1, 4):
            if spans[i][0] < spans[i - 1][1]:
                raise Fail("contender %d started %.3fs before contender %d ended"
                           % (i, spans[i - 1][1] - spans[i][0], i - 1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wait_keys(srv, "Q", 0)
    return {"out": [c.text() for c in cs]}


def lock_crash(srv, procs):
    e = Ctl(srv, "lock", "--ttl=3", "L3")
    procs.append(e)
    e.wait_lines(1)
    f = Ctl(srv, "lock", "L3", "--", "echo", "F")
    procs.append(f)
    wait_keys(srv, "L3", 2)
    e.proc.kill()
    e.proc.wait(5)
    t_kill = time.monotonic()
    t_f = f.wait_lines(1, timeout=15)
    rc_f, _ = f.wait_exit()
    waited = t_f - t_kill
    # TTL 3 s, kept alive every TTL/3: the lease has at least ~2 s to run.
    if waited < 1.0:
        raise Fail("F got the lock %.2fs after the holder was killed: before its lease "
                   "(TTL 3 s) could expire" % waited)
    if rc_f:
        raise Fail("F exited with %d" % rc_f)
    wait_keys(srv, "L3", 0)
    return {"E": norm(e.text()), "F": norm(f.text()), "waited": "%.0f s" % waited,
            "_waited": waited}


def elect(srv, procs):
    o = Ctl(srv, "elect", "-l", "E")
    procs.append(o)
    time.sleep(0.5)
    if o.text():
        raise Fail("observer printed %r with no leader" % o.text())
    p1 = Ctl(srv, "elect", "E", "p1")
    procs.append(p1)
    p1.wait_lines(2)
    o.wait_lines(2)
    o2 = Ctl(srv, "elect", "-l", "E")   # a late observer sees the leader at once
    procs.append(o2)
    o2.wait_lines(2)
    p2 = Ctl(srv, "elect", "E", "p2")
    procs.append(p2)
    wait_keys(srv, "E", 2)
    time.sleep(0.5)
    if p2.text():
        raise Fail("p2 printed %r while p1 led" % p2.text())
    if len(o.text()) != 2:
        raise Fail("observer printed %r with p1 leading and p2 waiting" % o.text())
    p1.signal(signal.SIGTERM)
    rc1, _ = p1.wait_exit()
    p2.wait_lines(2)
    o.wait_lines(4)
    p2.signal(signal.SIGTERM)
    rc2, _ = p2.wait_exit()
    time.sleep(0.5)
    o.signal(signal.SIGTERM)
    rco, _ = o.wait_exit()
    o2.signal(signal.SIGTERM)
    o2.wait_exit()
    t1, t2, to = p1.text(), p2.text(), o.text()
    if to != t1 + t2:
        raise Fail("observer printed %r; leaders printed %r then %r" % (to, t1, t2))
    if o2.text() != t1 + t2:
        raise Fail("late observer printed %r; leaders printed %r then %r" % (o2.text(), t1, t2))
    if t1[1:] != ["p1"] or t2[1:] != ["p2"] or t1[0] == t2[0]:
        raise Fail("leaders printed %r and %r" % (t1, t2))
    wait_keys(srv, "E", 0)
    return {"p1": norm(t1), "p2": norm(t2), "observer": norm(to), "rc": [rc1, rc2, rco]}


SCENARIOS = [("lock.exec", lock_exec), ("lock.signal", lock_signal), ("lock.queue", lock_queue),
             ("lock.crash", lock_crash), ("elect", elect)]


def run_server(kind, binary):
    srv = Server(kind, binary)
    results = {}
    failures = []
    try:
        srv.start()
        for name, fn in SCENARIOS:
            procs = []
            t0 = time.monotonic()
            try:
                results[name] = fn(srv, procs)
                print("%s %s: ok (%.1fs) %r" % (kind, name, time.monotonic() - t0,
                                                results[name]))
            except (Fail, AssertionError, subprocess.TimeoutExpired) as e:
                failures.append("%s %s: %s" % (kind, name, e))
                print("FAIL %s %s: %s" % (kind, name, e))
            finally:
                for p in procs:
                    p.stop()
    finally:
        srv.stop()
        if failures:
            print("%s log tail:\n%s" % (kind, srv.read_log()[-2000:]))
        srv.cleanup()
    return results, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--etcd", default="/usr/bin/etcd")
    args = ap.parse_args()

    def on_alarm(_sig, _frm):
        raise HardTimeout()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_alarm)
    signal.alarm(HARD_TIMEOUT)
    try:
        etcd_res, etcd_fail = run_server("etcd", args.etcd)
        cairn_res, cairn_fail = run_server("cairn", args.cairn)
        failures = etcd_fail + cairn_fail
        for name, _fn in SCENARIOS:
            e, c = etcd_res.get(name), cairn_res.get(name)
            if e is None or c is None:
                continue
            e = {k: v for k, v in e.items() if not k.startswith("_")}
            c = {k: v for k, v in c.items() if not k.startswith("_")}
            if name == "lock.crash":
                # how long the lease took to expire is timing, not output
                e.pop("waited"), c.pop("waited")
            if e != c:
                failures.append("%s: etcd printed %r, cairn %r" % (name, e, c))
                print("FAIL %s: etcd %r\n     cairn %r" % (name, e, c))
        if "lock.crash" in etcd_res and "lock.crash" in cairn_res:
            print("lock.crash: lease expiry took %.1fs on etcd, %.1fs on cairn"
                  % (etcd_res["lock.crash"]["_waited"], cairn_res["lock.crash"]["_waited"]))
        print("FAIL (%d)" % len(failures) if failures else "ok")
        return 1 if failures else 0
    except HardTimeout:
        print("FAIL: hard timeout of %ds reached" % HARD_TIMEOUT)
        return 2
    finally:
        signal.alarm(0)


if __name__ == "__main__":
    sys.exit(main())
