#!/usr/bin/python3
"""A fault-injecting TCP proxy for the multi-node tests: it listens on
127.0.0.1 and forwards every accepted connection to one target on
127.0.0.1, and on the way can delay, jitter, stall ("blackhole"), throttle
or reset the bytes, each fault per direction.

Directions are named from the dialer's side: "a2b" carries the bytes the
accepted client (a) sends to the target (b), "b2a" the answer; "both" is
either. A peer link A->B in the cluster tests is one proxy whose a is A.

Faults (methods of Proxy, or the same words on the control protocol):
  delay(ms, d)        every chunk is held ms after it was read (one way)
  jitter(ms, d)       plus a uniform 0..ms extra, never reordering bytes
  bandwidth(bps, d)   a token bucket per direction, shared by the proxy's
                      connections (None or 0: no cap)
  blackhole(d)        stop forwarding without closing: bytes read are held
                      (up to the buffer cap, then the sender's kernel
                      buffers fill), as a cut link whose TCP retransmits
                      later; new connections are accepted and stall too
  drop(secs, d, then) blackhole for secs, then "resume" or "reset"
  partition()         blackhole both ways
  heal(reset=False)   lift every blackhole; with reset the connections are
                      reset so the endpoints reconnect
  reset()             RST (SO_LINGER 0) both sides of every connection
  refuse(on)          new connections are reset at once (a down link)
  clear()             no faults
  adopt(sock)         forward a socket some other listener accepted
Everything is bounded: a connection holds at most BUFFER_CAP bytes per
direction, every thread is a daemon that stops on close(), and the proxy
closes itself after |lifetime| seconds.

CLI: netproxy.py --listen 127.0.0.1:0 --target 127.0.0.1:P [--control
127.0.0.1:0] [--lifetime S] prints "port N" (and "control N") and then reads
commands, one a line, on stdin (and on each control connection), answering
"ok", "error: ..." or a JSON line for "stats":
  delay D MS | jitter D MS | bandwidth D BPS | blackhole D | unblackhole D
  drop D SECS [reset] | partition | heal [reset] | reset | refuse on|off
  clear | stats | quit
End of stdin closes the proxy unless --control is given.
"""

import argparse
import collections
import json
import random
import select
import socket
import struct
import sys
import threading
import time

BUFFER_CAP = 1 << 20        # bytes held per connection and direction
CHUNK = 64 << 10            # read size, and the largest send
POLL = 0.1               # seconds: how often blocked threads look at the stop flag
DEFAULT_LIFETIME = 3600.0   # seconds a proxy lives at most
DIRECTIONS = ("a2b", "b2a")


def _dirs(d):
    if d in ("both", None):
        return DIRECTIONS
    if d not in DIRECTIONS:
        raise ValueError("direction must be a2b, b2a or both, not %r" % (d,))
    return (d,)


def _loopback(host):
    try:
        addr = socket.gethostbyname(host)
    except OSError as e:
        raise ValueError("cannot resolve %r: %s" % (host, e))
    if not addr.startswith("127."):
        raise ValueError("only 127.0.0.0/8 is allowed, not %s" % addr)
    return addr


def _hostport(s):
    host, _, port = s.rpartition(":")
    return host, int(port)


def _rst(sock):
    """Closes sock with an RST instead of a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class Bucket:
    """A token bucket: rate bytes/s, burst of a tenth of a second (at least
    one chunk's worth is never required: take() hands out what it has)."""

    def __init__(self, rate):
        self.rate = float(rate)
        self.burst = max(1024.0, self.rate / 10)
        self.tokens = self.burst
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def take(self, want, stopped):
        """Up to |want| bytes' worth of tokens, waiting until at least one
        byte is available; 0 when stopped."""
        while not stopped():
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= 1:
                    n = int(min(want, self.tokens))
                    self.tokens -= n
                    return n
                wait = (1 - self.tokens) / self.rate
            time.sleep(min(POLL, max(wait, 0.001)))
        return 0


class Faults:
    """The fault settings of one direction of a proxy (all its connections)."""

    def __init__(self):
        self.delay = 0.0     # seconds
        self.jitter = 0.0    # seconds
        self.blackholed = False
        self.bucket = None


class Pipe:
    """One direction of one connection: a reader thread that reads src into
    a bounded queue of (due time, bytes), a writer thread that sends them
    to dst when due, not blackholed and the bucket allows."""

    def __init__(self, conn, name, src, dst, faults):
        self.conn = conn
        self.name = name
        self.src = src
        self.dst = dst
        self.faults = faults
        self.cv = conn.proxy.cv
        self.queue = collections.deque()   # (due, bytes) or (due, None) for EOF
        self.held = 0
        self.last_due = 0.0
        self.done = False
        self.threads = [threading.Thread(target=self._read, name="netproxy-read-" + name,
                                         daemon=True),
                        threading.Thread(target=self._write, name="netproxy-write-" + name,
                                         daemon=True)]

    def start(self):
        for t in self.threads:
            t.start()

    def _due(self):
        f = self.faults
        due = time.monotonic() + f.delay + (random.uniform(0, f.jitter) if f.jitter else 0)
        self.last_due = max(self.last_due, due)   # bytes keep their order
        return self.last_due

    def _read(self):
        stopped = self.conn.stopped
        while not stopped():
            with self.cv:
                while self.held >= BUFFER_CAP and not stopped():
                    self.cv.wait(POLL)
            if stopped():
                return
            try:
                r, _, _ = select.select([self.src], [], [], POLL)
                if not r:
                    continue
                data = self.src.recv(CHUNK)
            except (ConnectionResetError, BrokenPipeError):
                self.conn.abort("%s: reset by sender" % self.name)
                return
            except (OSError, ValueError):
                self.conn.abort("%s: read failed" % self.name)
                return
            with self.cv:
                self.queue.append((self._due(), data if data else None))
                self.held += len(data)
                self.conn.proxy.counters[self.name[-3:]]["read"] += len(data)
                self.cv.notify_all()
            if not data:
                return

    def _write(self):
        stopped = self.conn.stopped
        while not stopped():
            with self.cv:
                if not self.queue or self.faults.blackholed:
                    self.cv.wait(POLL)
                    continue
                due, data = self.queue[0]
            now = time.monotonic()
            if due > now:
                time.sleep(min(POLL, due - now))
                continue
            if data is None:
                try:
                    self.dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                with self.cv:
                    self.queue.popleft()
                self.done = True
                self.conn.pipe_done()
                return
            n = len(data)
            bucket = self.faults.bucket
            if bucket is not None:
                n = bucket.take(n, stopped)
                if n == 0:
                    return
            try:
                _, w, _ = select.select([], [self.dst], [], POLL)
                if not w:
                    if bucket is not None:   # give the tokens back
                        with bucket.lock:
                            bucket.tokens += n
                    continue
                sent = self.dst.send(data[:n])
            except (ConnectionResetError, BrokenPipeError):
                self.conn.abort("%s: reset by receiver" % self.name)
                return
            except (OSError, ValueError):
                self.conn.abort("%s: write failed" % self.name)
                return
            if bucket is not None and sent < n:
                with bucket.lock:
                    bucket.tokens += n - sent
            with self.cv:
                self.held -= sent
                self.conn.proxy.counters[self.name[-3:]]["sent"] += sent
                if sent == len(data):
                    self.queue.popleft()
                else:
                    self.queue[0] = (due, data[sent:])
                self.cv.notify_all()


class Conn:
    """One accepted connection and its connection to the target."""

    def __init__(self, proxy, cid, a, b):
        self.proxy = proxy
        self.cid = cid
        self.a = a
        self.b = b
        self.closed = False
        self.lock = threading.Lock()
        self.pipes = {"a2b": Pipe(self, "c%d-a2b" % cid, a, b, proxy.faults["a2b"]),
                      "b2a": Pipe(self, "c%d-b2a" % cid, b, a, proxy.faults["b2a"])}

    def stopped(self):
        return self.closed or self.proxy.closed

    def start(self):
        for p in self.pipes.values():
            p.start()

    def held(self):
        return sum(p.held for p in self.pipes.values())

    def pipe_done(self):
        if all(p.done for p in self.pipes.values()):
            self.close(rst=False)

    def abort(self, _why):
        self.close(rst=True)

    def close(self, rst):
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.a, self.b):
            if rst:
                _rst(s)
            else:
                try:
                    s.close()
                except OSError:
                    pass
        self.proxy.forget(self)

    def threads(self):
        return [t for p in self.pipes.values() for t in p.threads]


class Proxy:
    """The proxy: Proxy(("127.0.0.1", port)).port is where to dial."""

    def __init__(self, target, listen=("127.0.0.1", 0), lifetime=DEFAULT_LIFETIME, name="proxy"):
        self.target = (_loopback(target[0]), int(target[1]))
        self.name = name
        self.cv = threading.Condition()
        self.faults = {d: Faults() for d in DIRECTIONS}
        self.counters = {d: {"read": 0, "sent": 0} for d in DIRECTIONS}
        self.conns = {}
        self.next_id = 0
        self.accepted = 0
        self.refusing = False
        self.closed = False
        self.timers = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((_loopback(listen[0]), int(listen[1])))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.acceptor = threading.Thread(target=self._accept, name="netproxy-accept-" + name,
                                         daemon=True)
        self.acceptor.start()
        self._timer(lifetime, self.close)

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()

    def _timer(self, secs, fn):
        t = threading.Timer(secs, fn)
        t.daemon = True
        t.name = "netproxy-timer-" + self.name
        with self.cv:
            if self.closed:
                return
            self.timers.append(t)
        t.start()

    def _accept(self):
        while not self.closed:
            try:
                r, _, _ = select.select([self.sock], [], [], POLL)
                if not r:
                    continue
                a, _ = self.sock.accept()
            except (OSError, ValueError):
                if self.closed:
                    return
                time.sleep(POLL)
                continue
            self.adopt(a)

    def adopt(self, a):
        """Forwards the accepted socket |a| as if this proxy had accepted it
        (a front listener that picks a proxy per dialer hands it over)."""
        self.accepted += 1
        if self.refusing or self.closed:
            _rst(a)
            return
        b = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        b.settimeout(2.0)
        try:
            b.connect(self.target)
        except OSError:
            _rst(b)
            _rst(a)
            return
        for s in (a, b):
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.cv:
            if self.closed:
                _rst(a)
                _rst(b)
                return
            self.next_id += 1
            c = Conn(self, self.next_id, a, b)
            self.conns[c.cid] = c
        c.start()

    def forget(self, conn):
        with self.cv:
            self.conns.pop(conn.cid, None)
            self.cv.notify_all()

    def _each(self, d, fn):
        with self.cv:
            for x in _dirs(d):
                fn(self.faults[x])
            self.cv.notify_all()

    # ---- faults
    def delay(self, ms, d="both"):
        self._each(d, lambda f: setattr(f, "delay", max(0.0, ms / 1000.0)))

    def jitter(self, ms, d="both"):
        self._each(d, lambda f: setattr(f, "jitter", max(0.0, ms / 1000.0)))

    def bandwidth(self, bps, d="both"):
        self._each(d, lambda f: setattr(f, "bucket", Bucket(bps) if bps else None))

    def blackhole(self, d="both"):
        self._each(d, lambda f: setattr(f, "blackholed", True))

    def unblackhole(self, d="both", reset=False):
        self._each(d, lambda f: setattr(f, "blackholed", False))
        if reset:
            self.reset()

    def drop(self, secs, d="both", then="resume"):
        if then not in ("resume", "reset"):
            raise ValueError("then must be resume or reset")
        self.blackhole(d)
        self._timer(secs, lambda: self.unblackhole(d, reset=(then == "reset")))

    def partition(self):
        self.blackhole("both")

    def heal(self, reset=False):
        self.unblackhole("both", reset=reset)

    def refuse(self, on=True):
        self.refusing = bool(on)
        if on:
            self.reset()

    def reset(self):
        with self.cv:
            conns = list(self.conns.values())
        for c in conns:
            c.close(rst=True)

    def clear(self):
        self.refusing = False
        for f in self.faults.values():
            f.delay = f.jitter = 0.0
            f.bucket = None
        self.heal()

    def stats(self):
        with self.cv:
            return {"port": self.port, "target": self.target[1], "accepted": self.accepted,
                    "open": len(self.conns), "held": sum(c.held() for c in self.conns.values()),
                    "bytes": {d: dict(v) for d, v in self.counters.items()},
                    "faults": {d: {"delay_ms": f.delay * 1000, "jitter_ms": f.jitter * 1000,
                                   "blackholed": f.blackholed,
                                   "bandwidth": f.bucket.rate if f.bucket else 0}
                               for d, f in self.faults.items()},
                    "refusing": self.refusing, "closed": self.closed}

    def threads(self):
        with self.cv:
            conns = list(self.conns.values())
        return [self.acceptor] + [t for c in conns for t in c.threads()]

    def close(self, timeout=5.0):
        """Stops accepting, resets every connection, and waits (bounded) for
        every thread of this proxy to end."""
        with self.cv:
            if self.closed:
                return
            self.closed = True
            timers = list(self.timers)
            self.cv.notify_all()
        for t in timers:
            t.cancel()
        threads = self.threads()
        try:
            self.sock.close()
        except OSError:
            pass
        self.reset()
        deadline = time.monotonic() + timeout
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))


# --------------------------------------------------------------------------
# Control protocol

def command(proxy, line):
    """Runs one control line; returns the answer line."""
    words = line.split()
    if not words:
        return "error: empty command"
    op, args = words[0], words[1:]
    try:
        if op == "delay" and len(args) == 2:
            proxy.delay(float(args[1]), args[0])
        elif op == "jitter" and len(args) == 2:
            proxy.jitter(float(args[1]), args[0])
        elif op == "bandwidth" and len(args) == 2:
            proxy.bandwidth(float(args[1]), args[0])
        elif op == "blackhole" and len(args) == 1:
            proxy.blackhole(args[0])
        elif op == "unblackhole" and len(args) in (1, 2):
            proxy.unblackhole(args[0], reset=args[1:] == ["reset"])
        elif op == "drop" and len(args) in (2, 3):
            proxy.drop(float(args[1]), args[0], then="reset" if args[2:] == ["reset"] else "resume")
        elif op == "partition" and not args:
            proxy.partition()
        elif op == "heal" and len(args) <= 1:
            proxy.heal(reset=args == ["reset"])
        elif op == "reset" and not args:
            proxy.reset()
        elif op == "refuse" and args in (["on"], ["off"]):
            proxy.refuse(args[0] == "on")
        elif op == "clear" and not args:
            proxy.clear()
        elif op == "stats" and not args:
            return json.dumps(proxy.stats(), sort_keys=True)
        elif op == "quit" and not args:
            proxy.close()
        else:
            return "error: unknown command or wrong arguments: %s" % line.strip()
    except ValueError as e:
        return "error: %s" % e
    return "ok"


def _serve_control(proxy, csock):
    def client(s):
        f = s.makefile("rw", encoding="utf-8", newline="\n")
        with s, f:
            for line in f:
                f.write(command(proxy, line) + "\n")
                f.flush()
                if proxy.closed:
                    return

    while not proxy.closed:
        r, _, _ = select.select([csock], [], [], POLL)
        if r:
            s, _ = csock.accept()
            threading.Thread(target=client, args=(s,), name="netproxy-control",
                             daemon=True).start()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--target", required=True)
    ap.add_argument("--control", help="also take commands on this 127.0.0.1 address")
    ap.add_argument("--lifetime", type=float, default=DEFAULT_LIFETIME)
    args = ap.parse_args(argv)
    try:
        proxy = Proxy(_hostport(args.target), _hostport(args.listen), lifetime=args.lifetime)
    except (ValueError, OSError) as e:
        print("error: %s" % e, flush=True)
        return 2
    print("port %d" % proxy.port, flush=True)
    if args.control:
        csock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        host, port = _hostport(args.control)
        csock.bind((_loopback(host), port))
        csock.listen(8)
        print("control %d" % csock.getsockname()[1], flush=True)
        threading.Thread(target=_serve_control, args=(proxy, csock), daemon=True).start()
    for line in sys.stdin:
        print(command(proxy, line), flush=True)
        if proxy.closed:
            break
    if args.control:
        while not proxy.closed:
            time.sleep(POLL * 4)
    proxy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
