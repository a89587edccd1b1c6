#!/usr/bin/python3
"""etcdctl watch and lease end to end: the same etcdctl commands against a
real etcd and a real cairn, both started here on random free 127.0.0.1
ports, their outputs compared.

etcdctl is a clientv3 program, so this exercises what the conformance
suites (tests/conformance/checks_watch.py, checks_lease.py) cannot: that Go's
watch client accepts cairn's created/canceled/compacted responses and
prints the same events, and that the lease commands print the same text.

Both servers start empty and receive the same writes in the same order, so
revisions agree. Every watch starts at an explicit --rev, so an event
written before etcdctl's stream is set up is replayed rather than lost: the
outputs do not depend on timing. Lease ids differ between servers and are
replaced by "<id>". Every wait is bounded; the watch processes are ours and
are stopped by their PID.

Usage:
    test_etcdctl_watch_lease.py --cairn build/cairn [--etcd etcd]
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import Server  # noqa: E402
from verdict import check, failures, strip_ids, finish  # noqa: E402

HARD_TIMEOUT = 170   # seconds for the whole test
LINE_WAIT = 8.0      # seconds a watch may take to print what it must

def hide_ids(text):
    """Lease ids (16 hex digits or fewer, as etcdctl prints them) -> <id>."""
    return re.sub(r"\blease [0-9a-f]+\b", "lease <id>", text)


class Watch:
    """`etcdctl watch ARGS` in the background; its stdout lines collected."""

    def __init__(self, srv, *args):
        env = dict(os.environ, ETCDCTL_API="3")
        self.proc = subprocess.Popen(
            ["etcdctl", "--endpoints=" + srv.endpoint, "watch"] + list(args),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        self.lines = []
        self.err = b""
        self.cv = threading.Condition()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cv:
                self.lines.append(line.decode("utf-8", "replace").rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def wait_lines(self, n, wait=LINE_WAIT):
        deadline = time.monotonic() + wait
        with self.cv:
            while len(self.lines) < n and time.monotonic() < deadline:
                if self.proc.poll() is not None and not self.t.is_alive():
                    break
                self.cv.wait(0.1)
            return list(self.lines)

    def wait_exit(self, wait=LINE_WAIT):
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None
        self.t.join(2)
        self.err = self.proc.stderr.read()
        return self.proc.returncode

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.t.join(2)


def events_of(responses):
    """The events of JSON watch responses, flattened: how etcd groups them
    into responses depends on whether the watch caught up from history (one
    response) or was live (one per revision), which depends on timing."""
    out = []
    for r in responses:
        if isinstance(r, dict):
            for e in r.get("Events") or []:
                out.append(e)
            if r.get("Canceled") or r.get("CompactRevision"):
                out.append({k: v for k, v in r.items() if k not in ("Header", "Events")})
        else:
            out.append(r)
    return out


def errors_only(stderr):
    """etcdctl's own error lines (its client logs carry times and uuids)."""
    return [ln for ln in stderr.decode("utf-8", "replace").splitlines()
            if not ln.startswith("{")]


def sort_attached(text):
    """TimeToLive lists the attached keys in Go map order: sort them."""
    return re.sub(r"attached keys\(\[([^\]]*)\]\)",
                  lambda m: "attached keys([%s])" % " ".join(sorted(m.group(1).split())), text)


def rev(srv):
    return srv.json("get", "rev-probe")["header"]["revision"]


def both(etcd, cairn, fn, what):
    """fn(server) -> comparable output; compared between the servers."""
    a, b = fn(etcd), fn(cairn)
    check(a == b, "%s:\n  etcd : %r\n  cairn: %r" % (what, a, b))
    return a


def watch_script(srv, wargs, writes, n_lines, json_out=False):
    """Start a watch from the next revision, make the writes, collect
    n_lines lines (and a little more, to see nothing extra comes)."""
    start = rev(srv) + 1
    w = Watch(srv, "--rev=%d" % start, *wargs, *(["-w", "json"] if json_out else []))
    try:
        for args in writes:
            srv.etcdctl(*args)
        lines = w.wait_lines(n_lines)
        time.sleep(0.3)
        lines = w.wait_lines(len(lines) + 1, wait=0.3)
    finally:
        w.stop()
    if json_out:
        out = []
        for ln in lines:
            try:
                out.append(strip_ids(json.loads(ln)))
            except ValueError:
                out.append(ln)
        return start, out
    return start, lines


def watch_checks(etcd, cairn):
    # Puts, an overwrite, a delete, a txn, a prefix delete; simple output.
    writes = [("put", "w/a", "1"), ("put", "w/b", "2"), ("put", "w/a", "3"),
              ("put", "x", "outside"), ("del", "w/b"),
              ("del", "w/", "--prefix")]
    both(etcd, cairn, lambda s: watch_script(s, ["--prefix", "w/"], writes, 15),
         "watch --prefix (simple output)")

    # --prev-kv, JSON output: every field of every response (ids stripped).
    writes = [("put", "p/a", "1"), ("put", "p/a", "2"), ("del", "p/a")]
    both(etcd, cairn,
         lambda s: (lambda r: (r[0], events_of(r[1])))(
             watch_script(s, ["--prev-kv", "p/a"], writes, 3, json_out=True)),
         "watch --prev-kv -w json (events)")

    # A range [r/b, r/d) given as two arguments.
    writes = [("put", "r/a", "x"), ("put", "r/b", "x"), ("put", "r/c", "x"), ("put", "r/d", "x")]
    both(etcd, cairn, lambda s: watch_script(s, ["r/b", "r/d"], writes, 6),
         "watch KEY RANGE_END")

    # A txn: its events in one response, in the txn's order.
    def txn(s):
        start = rev(s) + 1
        w = Watch(s, "--rev=%d" % start, "--prefix", "t/", "-w", "json")
        try:
            s.etcdctl("txn", stdin=b"\nput t/c 3\nput t/a 1\ndel t/zz\n\n\n")
            lines = w.wait_lines(1)
            time.sleep(0.3)
            lines = w.wait_lines(len(lines) + 1, wait=0.3)
        finally:
            w.stop()
        return [strip_ids(json.loads(ln)) for ln in lines]
    both(etcd, cairn, txn, "watch of a txn (-w json)")

    # Replay from an old revision, then live.
    def replay(s):
        s.etcdctl("put", "h/k", "1")
        first = rev(s)
        s.etcdctl("put", "h/k", "2")
        s.etcdctl("del", "h/k")
        w = Watch(s, "--rev=%d" % first, "h/k")
        try:
            # Three events of three lines each (type, key, value) replayed,
            # then the live one: wait for all of them, not for a count
            # the replay alone already reaches.
            w.wait_lines(9)
            s.etcdctl("put", "h/k", "3")
            lines = w.wait_lines(12)
        finally:
            w.stop()
        return lines
    both(etcd, cairn, replay, "watch --rev in the past: replay then live")

    # A compacted start revision: etcdctl reports the cancel and exits.
    def compacted(s):
        s.etcdctl("put", "c/k", "1")
        old = rev(s)
        s.etcdctl("put", "c/k", "2")
        s.etcdctl("compact", str(rev(s)))
        w = Watch(s, "--rev=%d" % old, "c/k")
        rc = w.wait_exit()
        if rc is None:
            w.stop()
        return {"rc": rc, "stdout": w.lines, "stderr": errors_only(w.err)}
    both(etcd, cairn, compacted, "watch from a compacted revision")

    # An empty range (end before key).
    def empty(s):
        w = Watch(s, "e/b", "e/a")
        rc = w.wait_exit(wait=3)
        if rc is None:
            w.stop()
        return {"rc": rc, "stdout": w.lines, "stderr": errors_only(w.err)}
    both(etcd, cairn, empty, "watch of an empty range")


def lease_checks(etcd, cairn):
    # The text of grant / keep-alive --once / timetolive / revoke, ids hidden,
    # and a watch that sees the revoke delete both keys in one revision.
    def script(s):
        out = []
        r = s.etcdctl("lease", "grant", "100").stdout.decode()
        out.append(hide_ids(r))
        lid = re.match(r"lease ([0-9a-f]+)", r).group(1)
        s.etcdctl("put", "l/b", "1", "--lease=" + lid)
        s.etcdctl("put", "l/a", "2", "--lease=" + lid)
        out.append(hide_ids(s.etcdctl("lease", "keep-alive", "--once", lid).stdout.decode()))
        ttl = s.etcdctl("lease", "timetolive", "--keys", lid).stdout.decode()
        out.append(sort_attached(re.sub(r"remaining\(\d+s\)", "remaining(Ns)", hide_ids(ttl))))
        start = rev(s) + 1
        w = Watch(s, "--rev=%d" % start, "--prefix", "l/", "-w", "json")
        try:
            out.append(hide_ids(s.etcdctl("lease", "revoke", lid).stdout.decode()))
            lines = w.wait_lines(1)
        finally:
            w.stop()
        out.append([strip_ids(json.loads(ln)) for ln in lines])
        out.append(hide_ids(s.etcdctl("lease", "timetolive", lid).stdout.decode()))
        r = s.etcdctl("lease", "keep-alive", "--once", lid, check=False)
        out.append([r.returncode, hide_ids(r.stdout.decode()), errors_only(r.stderr)])
        return out
    both(etcd, cairn, script, "lease grant / keep-alive --once / timetolive / revoke")

    def too_large(s):
        r = s.etcdctl("lease", "grant", "9000000001", check=False)
        return [r.returncode, r.stdout.decode(), errors_only(r.stderr)]
    both(etcd, cairn, too_large, "lease grant of a too large TTL")

    def small(s):
        r = s.etcdctl("lease", "grant", "1").stdout.decode()
        lid = re.match(r"lease ([0-9a-f]+)", r).group(1)
        out = [hide_ids(r), hide_ids(s.etcdctl("lease", "keep-alive", "--once", lid)
                                     .stdout.decode())]
        s.etcdctl("lease", "revoke", lid)
        return out
    both(etcd, cairn, small, "lease grant 1 (raised to the minimum TTL)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--etcd", default=shutil.which("etcd") or "etcd")
    a = ap.parse_args()

    def timeout(*_):
        raise SystemExit("FAIL: hard timeout of %ds" % HARD_TIMEOUT)
    signal.signal(signal.SIGALRM, timeout)
    signal.alarm(HARD_TIMEOUT)

    etcd = Server("etcd", a.etcd)
    cairn = Server("cairn", os.path.abspath(a.cairn))
    try:
        etcd.start()
        cairn.start()
        watch_checks(etcd, cairn)
        lease_checks(etcd, cairn)
    finally:
        for s in (etcd, cairn):
            if failures and s.proc is not None:
                print("---- %s log (tail) ----\n%s" % (s.kind, s.read_log()[-2000:]))
            s.stop()
            s.cleanup()
    sys.exit(finish("all etcdctl watch/lease checks passed"))


if __name__ == "__main__":
    main()
