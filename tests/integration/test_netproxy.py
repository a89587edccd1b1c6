#!/usr/bin/python3
"""Self-test of netproxy.py against a local echo server on 127.0.0.1: each
fault measurably does what it says.

- forwarding: bytes arrive intact both ways, half-close is passed on;
- delay: a one-way delay adds at least that much to a round trip, both ways
  twice that;
- jitter: round trips spread over the jitter, bytes keep their order;
- bandwidth: a capped direction's throughput stays under the cap (plus the
  bucket's burst) and the other direction is not capped;
- blackhole / partition: no byte passes while cut, the connection stays
  open, and heal delivers what was held; heal with reset resets it;
- one direction: a cut a2b stops the request, a cut b2a only the answer;
- drop: bytes stall for the given time, then flow again;
- reset: the client sees ECONNRESET (or EOF) and so does the server;
- refuse: new connections are reset at once;
- bounds: a blackholed connection holds at most BUFFER_CAP bytes, close()
  ends every thread, and the lifetime cap closes the proxy by itself;
- the CLI: port printed, commands on stdin answered and obeyed.

Tolerances are wide (a loaded 2-core machine): lower bounds are what a
fault guarantees; upper bounds are loose. The run is bounded (HARD_TIMEOUT).
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import netproxy  # noqa: E402
from verdict import check, failures  # noqa: E402

HARD_TIMEOUT = 28        # seconds for the whole run (ctest allows 40)
IO_TIMEOUT = 5.0


class Echo:
    """An echo server that also counts the bytes it received."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.received = 0
        self.events = []        # "eof" / "reset" per connection end
        self.lock = threading.Lock()
        self.stop = False
        self.echo = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.1)
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        c.settimeout(0.2)
        with c:
            while not self.stop:
                try:
                    data = c.recv(65536)
                except socket.timeout:
                    continue
                except ConnectionResetError:
                    with self.lock:
                        self.events.append("reset")
                    return
                except OSError:
                    return
                if not data:
                    with self.lock:
                        self.events.append("eof")
                    c.shutdown(socket.SHUT_WR)
                    return
                with self.lock:
                    self.received += len(data)
                if self.echo:
                    try:
                        c.sendall(data)
                    except OSError:
                        return

    def close(self):
        self.stop = True
        self.sock.close()


def dial(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(s, n, timeout=IO_TIMEOUT):
    s.settimeout(timeout)
    out = bytearray()
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            raise EOFError("EOF after %d of %d bytes" % (len(out), n))
        out += b
    return bytes(out)


def rtt(s, msg=b"ping"):
    t = time.monotonic()
    s.sendall(msg)
    got = recv_exact(s, len(msg))
    assert got == msg, got
    return time.monotonic() - t


def nothing_for(s, secs):
    """True when nothing arrives on s within secs (and it is not closed)."""
    s.settimeout(secs)
    try:
        s.recv(1)
    except socket.timeout:
        return True
    return False


def wait_for(cond, secs):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# --------------------------------------------------------------------------

def case_forward(echo):
    with netproxy.Proxy(("127.0.0.1", echo.port)) as p, dial(p.port) as s:
        blob = os.urandom(1 << 20)
        threading.Thread(target=s.sendall, args=(blob,), daemon=True).start()
        check(recv_exact(s, len(blob)) == blob, "forward: 1 MiB comes back intact")
        s.shutdown(socket.SHUT_WR)
        s.settimeout(IO_TIMEOUT)
        check(s.recv(1) == b"", "forward: half-close reaches the server and its FIN comes back")
        st = p.stats()
        check(st["bytes"]["a2b"]["sent"] == len(blob) and st["bytes"]["b2a"]["sent"] == len(blob),
              "forward: counters count the bytes each way (%s)" % st["bytes"])


def case_adopt(echo):
    """A socket some other listener accepted, handed over with adopt(), is
    forwarded and faulted like the proxy's own."""
    front = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    front.bind(("127.0.0.1", 0))
    front.listen(1)
    with front, netproxy.Proxy(("127.0.0.1", echo.port)) as p, \
            dial(front.getsockname()[1]) as s:
        a, _ = front.accept()
        p.adopt(a)
        check(rtt(s) >= 0, "adopt: bytes come back through the adopted socket")
        p.delay(100, "a2b")
        check(rtt(s) >= 0.1, "adopt: the proxy's delay applies to it")
        st = p.stats()
        check(st["accepted"] == 1 and st["open"] == 1 and st["bytes"]["b2a"]["sent"] == 8,
              "adopt: counted as the proxy's connection (%s)" % st)


def case_delay(echo):
    with netproxy.Proxy(("127.0.0.1", echo.port)) as p, dial(p.port) as s:
        base = min(rtt(s) for _ in range(5))
        p.delay(150, "a2b")
        one = min(rtt(s) for _ in range(3))
        p.delay(150, "both")
        two = min(rtt(s) for _ in range(3))
        p.delay(0)
        after = min(rtt(s) for _ in range(3))
        print("delay: rtt base %.1f ms, 150 ms one way %.1f ms, both ways %.1f ms, off %.1f ms"
              % (base * 1e3, one * 1e3, two * 1e3, after * 1e3))
        check(0.150 <= one < 0.150 + 2.0, "delay: one way adds >= 150 ms (%.3f s)" % one)
        check(0.300 <= two < 0.300 + 2.0, "delay: both ways add >= 300 ms (%.3f s)" % two)
        check(after < 0.150, "delay: off again, a round trip is under 150 ms (%.3f s)" % after)


def case_jitter(echo):
    with netproxy.Proxy(("127.0.0.1", echo.port)) as p, dial(p.port) as s:
        p.delay(20, "a2b")
        p.jitter(100, "a2b")
        times = [rtt(s) for _ in range(20)]
        print("jitter: 20 ms + 0..100 ms: rtt min %.1f max %.1f ms"
              % (min(times) * 1e3, max(times) * 1e3))
        check(min(times) >= 0.020, "jitter: no round trip below the fixed delay")
        # P(all 20 uniform draws < 50 ms) = 2^-20.
        check(max(times) >= 0.070, "jitter: round trips spread over the jitter (max %.3f s)"
              % max(times))
        # Many small writes back to back: the bytes keep their order.
        msgs = b"".join(b"%06d" % i for i in range(2000))
        for i in range(2000):
            s.sendall(b"%06d" % i)
        check(recv_exact(s, len(msgs), timeout=10) == msgs, "jitter: bytes keep their order")


def case_bandwidth(echo):
    rate = 256 << 10
    total = 768 << 10
    echo.echo = False
    try:
        with netproxy.Proxy(("127.0.0.1", echo.port)) as p, dial(p.port) as s:
            p.bandwidth(rate, "a2b")
            start_recv = echo.received
            t = time.monotonic()
            threading.Thread(target=s.sendall, args=(b"x" * total,), daemon=True).start()
            ok = wait_for(lambda: echo.received - start_recv >= total, 15)
            el = time.monotonic() - t
            burst = rate / 10
            floor = (total - burst) / rate        # the cap's minimum time
            print("bandwidth: %d KiB at %d KiB/s took %.2f s (cap allows >= %.2f s)"
                  % (total >> 10, rate >> 10, el, floor))
            check(ok, "bandwidth: the capped transfer completes")
            check(el >= floor * 0.95, "bandwidth: throughput bounded by the cap (%.2f s)" % el)
            check(el <= floor * 3 + 2, "bandwidth: throughput near the cap, not far below (%.2f s)"
                  % el)
            # The other direction is not capped.
            p.bandwidth(0, "a2b")
            p.bandwidth(rate, "b2a")
            start_recv = echo.received
            t = time.monotonic()
            s.sendall(b"y" * total)
            ok = wait_for(lambda: echo.received - start_recv >= total, 10)
            el2 = time.monotonic() - t
            print("bandwidth: b2a capped, a2b took %.2f s" % el2)
            check(ok and el2 < floor * 0.8, "bandwidth: a cap on b2a leaves a2b uncapped (%.2f s)"
                  % el2)
    finally:
        echo.echo = True


def case_partition(echo):
    with netproxy.Proxy(("127.0.0.1", echo.port)) as p, dial(p.port) as s:
        rtt(s)
        p.partition()
        before = echo.received
        s.sendall(b"held")
        check(nothing_for(s, 0.6), "partition: nothing comes back while cut")
        check(echo.received == before, "partition: no byte reaches the server while cut")
        check(p.stats()["open"] == 1, "partition: the connection stays open")
        # A connection made during the partition is accepted and stalls too.
        with dial(p.port) as s2:
            s2.sendall(b"new")
            check(nothing_for(s2, 0.3), "partition: a new connection stalls too")
            p.heal()
            check(recv_exact(s2, 3) == b"new", "heal: the new connection's bytes flow")
        check(recv_exact(s, 4) == b"held", "heal: the held bytes are delivered")
        check(rtt(s) < 2.0, "heal: the connection works again")
        # heal(reset=True): the endpoints see a reset and must reconnect.
        p.partition()
        s.sendall(b"lost")
        time.sleep(0.1)
        p.heal(reset=True)
        check(sees_reset(s), "heal with reset: the client sees ECONNRESET or EOF")
        with dial(p.port) as s3:
            check(rtt(s3) < 2.0, "heal with reset: a new connection works")


def sees_reset(s, timeout=IO_TIMEOUT):
    s.settimeout(timeout)
    try:
        while True:
            b = s.recv(4096)
            if not b:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def case_one_direction(echo):
    with netproxy.Proxy(("127.0.0.1", echo.port)) as p, dial(p.port) as s:
        rtt(s)
        p.blackhole("b2a")
        before = echo.received
        s.sendall(b"req1")
        check(wait_for(lambda: echo.received >= before + 4, 3),
              "b2a cut: the request still reaches the server")
        check(nothing_for(s, 0.5), "b2a cut: the answer does not come back")
        p.unblackhole("b2a")
        check(recv_exact(s, 4) == b"req1", "b2a healed: the held answer arrives")
        p.blackhole("a2b")
        before = echo.received
        s.sendall(b"req2")
        check(nothing_for(s, 0.5) and echo.received == before,
              "a2b cut: the request does not reach the server")
        p.unblackhole("a2b")
        check(recv_exact(s, 4) == b"req2", "a2b healed: request and answer flow")


def case_drop(echo):
    with netproxy.Proxy(("127.0.0.1", echo.port)) as p, dial(p.port) as s:
        rtt(s)
        p.drop(0.5, "a2b")
        el = rtt(s)
        print("drop: 0.5 s a2b: round trip %.3f s" % el)
        check(el >= 0.45, "drop: bytes stall for the drop's time (%.3f s)" % el)
        check(rtt(s) < 0.5, "drop: afterwards they flow at once")
        p.drop(0.3, "both", then="reset")
        s.sendall(b"x")
        check(sees_reset(s), "drop then reset: the client sees the reset")


def case_reset(echo):
    with netproxy.Proxy(("127.0.0.1", echo.port)) as p, dial(p.port) as s:
        rtt(s)
        n = len(echo.events)
        p.reset()
        try:
            s.settimeout(IO_TIMEOUT)
            b = s.recv(1)
            seen = "eof" if b == b"" else "data"
        except ConnectionResetError:
            seen = "reset"
        print("reset: the client saw %s" % seen)
        check(seen in ("reset", "eof"), "reset: the client sees ECONNRESET or EOF (%s)" % seen)
        check(wait_for(lambda: len(echo.events) > n, 3) and echo.events[n] == "reset",
              "reset: the server sees ECONNRESET (%s)" % echo.events[n:])
        p.refuse(True)
        try:
            with dial(p.port) as s2:     # the RST may come before connect returns
                refused = sees_reset(s2)
        except ConnectionResetError:
            refused = True
        check(refused, "refuse: a new connection is reset at once")
        p.refuse(False)
        with dial(p.port) as s3:
            check(rtt(s3) < 2.0, "refuse off: connections work again")


def case_bounds(echo):
    echo.echo = False
    try:
        p = netproxy.Proxy(("127.0.0.1", echo.port), name="bounds")
        s = dial(p.port)
        p.blackhole("a2b")
        s.settimeout(0.2)
        sent = 0
        blob = b"z" * (256 << 10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and sent < (64 << 20):
            try:
                sent += s.send(blob)
            except socket.timeout:
                break
        held = p.stats()["held"]
        print("bounds: the client got %d KiB into a blackholed link, the proxy holds %d KiB"
              % (sent >> 10, held >> 10))
        check(held <= netproxy.BUFFER_CAP + netproxy.CHUNK,
              "bounds: the proxy holds at most its cap (%d bytes)" % held)
        check(sent < (64 << 20), "bounds: the sender is stopped by back-pressure")
        threads = p.threads()
        t = time.monotonic()
        p.close()
        el = time.monotonic() - t
        alive = [x.name for x in threads if x.is_alive()]
        check(not alive and el < 3, "close: every thread ends, in %.2f s (alive: %s)" % (el, alive))
        s.close()
        q = netproxy.Proxy(("127.0.0.1", echo.port), lifetime=0.5, name="lifetime")
        with dial(q.port) as s2:
            check(sees_reset(s2, timeout=3), "lifetime: the proxy closes itself and its connections")
        check(wait_for(lambda: not any(x.is_alive() for x in q.threads()), 3) and q.closed,
              "lifetime: its threads end")
        try:
            netproxy.Proxy(("10.0.0.1", echo.port))
            check(False, "a target off 127.0.0.0/8 is refused")
        except ValueError:
            pass
    finally:
        echo.echo = True


def case_cli(echo):
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "netproxy.py"),
                             "--listen", "127.0.0.1:0", "--target", "127.0.0.1:%d" % echo.port,
                             "--lifetime", "60"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        check(len(line) == 2 and line[0] == "port", "cli: prints its port (%s)" % line)
        port = int(line[1])

        def cmd(c):
            proc.stdin.write(c + "\n")
            proc.stdin.flush()
            return proc.stdout.readline().strip()

        with dial(port) as s:
            check(rtt(s) < 2.0, "cli: forwards")
            check(cmd("partition") == "ok", "cli: partition answered ok")
            s.sendall(b"abc")
            check(nothing_for(s, 0.4), "cli: partition stops the bytes")
            check(cmd("heal") == "ok", "cli: heal answered ok")
            check(recv_exact(s, 3) == b"abc", "cli: heal delivers them")
            check(cmd("delay a2b 200") == "ok", "cli: delay answered ok")
            check(rtt(s) >= 0.2, "cli: the delay applies")
            check(cmd("delay sideways 1").startswith("error:"), "cli: a bad direction is an error")
            check(cmd("frobnicate").startswith("error:"), "cli: an unknown command is an error")
            st = cmd("stats")
            check('"open": 1' in st, "cli: stats is JSON with the open connections (%s)" % st[:80])
        check(cmd("quit") == "ok", "cli: quit answered ok")
        check(proc.wait(timeout=5) == 0, "cli: exits 0 after quit")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


CASES = [case_forward, case_adopt, case_delay, case_jitter, case_bandwidth, case_partition,
         case_one_direction, case_drop, case_reset, case_bounds, case_cli]


def main():
    def on_alarm(_sig, _frm):
        print("FAIL: hard timeout of %d s" % HARD_TIMEOUT, flush=True)
        os._exit(1)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(HARD_TIMEOUT)
    t0 = time.monotonic()
    echo = Echo()
    try:
        for case in CASES:
            t = time.monotonic()
            try:
                case(echo)
            except (OSError, EOFError, AssertionError) as e:
                check(False, "%s: %s: %s" % (case.__name__, type(e).__name__, e))
            print("%s: %.2f s" % (case.__name__, time.monotonic() - t), flush=True)
    finally:
        echo.close()
    left = [t.name for t in threading.enumerate() if t.name.startswith("netproxy") and t.is_alive()]
    check(wait_for(lambda: not [t for t in threading.enumerate()
                                if t.name.startswith("netproxy") and t.is_alive()], 3),
          "no proxy thread outlives its proxy (%s)" % left)
    print("test_netproxy: %d failures in %.1f s" % (len(failures), time.monotonic() - t0))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
