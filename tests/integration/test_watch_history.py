#!/usr/bin/env python3
"""Watch history across a restart (issue 6): keys are written, the server is
restarted on the same data dir (so its in-memory watch ring is empty), and
`etcdctl watch --rev=2 --prefix --prev-kv` must replay every event from
revision 2 (puts, overwrites, deletes) and then continue live with a write
made after the watch started: no gap, no duplicate. Run on etcd and on
cairn; the event streams must be identical.

usage: test_watch_history.py --cairn PATH [--etcd PATH]
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import Server  # noqa: E402

NKEYS = 30


def watch_events(srv, rev, want, timeout=20):
    """Runs etcdctl watch from |rev| until |want| events arrived (or the
    timeout); returns the events as dicts."""
    env = dict(os.environ, ETCDCTL_API="3")
    cmd = ["etcdctl", "--endpoints=" + srv.endpoint, "watch", "--prefix", "k",
           "--rev=%d" % rev, "--prev-kv", "-w", "json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    events = []
    done = threading.Event()

    def reader():
        dec = json.JSONDecoder()
        buf = ""
        for line in iter(p.stdout.readline, b""):
            buf += line.decode()
            while True:
                s = buf.lstrip()
                if not s:
                    buf = ""
                    break
                try:
                    obj, end = dec.raw_decode(s)
                except ValueError:
                    break
                buf = s[end:]
                events.extend(obj.get("Events") or [])
                if len(events) >= want:
                    done.set()
        done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    return p, events, done, t


def norm(ev):
    kv = ev.get("kv", {})
    prev = ev.get("prev_kv")
    f = lambda k: (k.get("key"), k.get("value"), k.get("mod_revision"),  # noqa: E731
                   k.get("create_revision"), k.get("version"))
    return (ev.get("type", 0), f(kv), f(prev) if prev else None)


def run(kind, binary):
    srv = Server(kind, binary)
    try:
        srv.start()
        for i in range(NKEYS):
            srv.etcdctl("put", "k%02d" % (i % 20), "v%d" % i)
        srv.etcdctl("del", "k03")
        srv.etcdctl("del", "k1", "--prefix")
        srv.etcdctl("put", "other", "x")  # outside the watched range
        srv.etcdctl("put", "k03", "again")
        last = srv.json("get", "k03")["header"]["revision"]
        rc = srv.stop()
        if kind == "cairn" and rc != 0:  # etcd dies by the SIGTERM
            raise AssertionError("%s: exit %s at the restart" % (kind, rc))
        srv.start()
        srv.etcdctl("put", "k99", "after-restart")
        # NKEYS puts, del k03, del k1* (10 keys, one revision), put k03, k99
        want_hist = NKEYS + 1 + 10 + 1 + 1
        p, events, done, t = watch_events(srv, 2, want_hist + 1)
        deadline = time.time() + 20
        while len(events) < want_hist and time.time() < deadline and p.poll() is None:
            time.sleep(0.05)
        srv.etcdctl("put", "k98", "live")
        done.wait(20)
        time.sleep(0.5)  # a duplicate would arrive now
        p.terminate()
        p.wait(5)
        err = p.stderr.read().decode(errors="replace")
        revs = [int(e["kv"]["mod_revision"]) for e in events]
        keys = [(r, e["kv"]["key"]) for r, e in zip(revs, events)]
        expect = [r for r in range(2, last + 3) if r != last - 1]
        if (sorted(set(revs)) != expect or revs != sorted(revs) or
                len(set(keys)) != len(keys) or len(events) != want_hist + 1):
            raise AssertionError("%s: %d events at revisions %s, expected %d at %s; "
                                 "stderr: %s" % (kind, len(events), revs, want_hist + 1,
                                                 expect, err))
        return [norm(e) for e in events]
    except Exception:
        print("%s log:\n%s" % (kind, srv.read_log()), file=sys.stderr)
        raise
    finally:
        srv.stop()
        srv.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--etcd")
    args = ap.parse_args()
    got = {"cairn": run("cairn", args.cairn)}
    print("cairn: %d events replayed across a restart, then live" % len(got["cairn"]))
    if args.etcd:
        got["etcd"] = run("etcd", args.etcd)
        print("etcd: %d events" % len(got["etcd"]))
        if got["etcd"] != got["cairn"]:
            for i, (a, b) in enumerate(zip(got["etcd"], got["cairn"])):
                if a != b:
                    print("first difference at event %d:\n etcd  %s\n cairn %s" % (i, a, b))
                    break
            print("FAIL: event streams differ (etcd %d, cairn %d)" %
                  (len(got["etcd"]), len(got["cairn"])))
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
