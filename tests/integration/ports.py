"""Ports on 127.0.0.1 for the servers a test starts, which no other test on
this machine will take meanwhile.

Binding port 0 and closing the socket gives a port from the kernel's ephemeral
range: between that pick and the server's own bind, a client connection or a
proxy of a test running beside it can be given the same port, and the server
then exits with "address in use" (CI saw it under ctest -j2). So ports come
from below the ephemeral range, where the kernel hands out nothing by itself,
and each one is reserved by an flock on a file under LOCK_DIR for as long as
the process that picked it lives. The lock goes with the process, so a killed
test leaves no reservation behind. tests/unit/test_peer.c follows the same
convention (same directory, same range), so C and Python tests share it."""

import fcntl
import os
import random
import socket
import tempfile

LOCK_DIR = os.path.join(tempfile.gettempdir(), "cairn-test-ports")
LOWEST = 10000

_held = []  # descriptors whose locks are this process's reservations
_rnd = random.SystemRandom()


def port_range():
    """[lo, hi) of ports outside the kernel's ephemeral range."""
    lo, hi = 32768, 60999
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        pass
    if lo - LOWEST >= 2048:
        return LOWEST, lo
    if 65536 - (hi + 1) >= 2048:
        return hi + 1, 65536
    return LOWEST, 32768  # an ephemeral range covering nearly everything


def _bindable(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port():
    """A port nobody listens on, reserved for this process's lifetime."""
    os.makedirs(LOCK_DIR, exist_ok=True)
    try:
        os.chmod(LOCK_DIR, 0o1777)
    except OSError:
        pass  # another user's directory: its mode is already usable
    lo, hi = port_range()
    for _ in range(1000):
        port = _rnd.randrange(lo, hi)
        try:
            fd = os.open(os.path.join(LOCK_DIR, str(port)), os.O_CREAT | os.O_RDWR, 0o666)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # reserved by another test
            continue
        if _bindable(port):
            _held.append(fd)
            return port
        os.close(fd)
    raise RuntimeError("no free port on 127.0.0.1 in [%d, %d)" % (lo, hi))
