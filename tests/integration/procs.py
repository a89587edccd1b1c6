"""Starting and stopping real cairn and etcd processes for the integration
tests: free ports on 127.0.0.1 reserved for the test (ports.py), a
temporary data dir, a bounded wait until the server answers, and a stop that
signals only the PID this module started (SIGTERM, then SIGKILL after a
deadline)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ports import free_port  # noqa: E402,F401  (re-exported for the tests)

ETCDCTL_TIMEOUT = 20  # seconds, every etcdctl invocation


class Server:
    """One etcd or cairn process. |kind| is "etcd" or "cairn"."""

    def __init__(self, kind, binary, data_dir=None, extra=(), name="default"):
        self.kind = kind
        self.binary = binary
        self.tmp = tempfile.mkdtemp(prefix="cairn-it-%s-" % kind)
        self.data_dir = data_dir or os.path.join(self.tmp, "data")
        self.name = name
        self.extra = list(extra)
        self.proc = None
        self.log_path = os.path.join(self.tmp, "server.log")
        self.client_port = free_port()
        self.peer_port = free_port()

    @property
    def endpoint(self):
        return "127.0.0.1:%d" % self.client_port

    def args(self):
        c = "http://127.0.0.1:%d" % self.client_port
        p = "http://127.0.0.1:%d" % self.peer_port
        return [self.binary, "--name", self.name, "--data-dir", self.data_dir,
                "--listen-client-urls", c, "--advertise-client-urls", c,
                "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                "--initial-cluster", "%s=%s" % (self.name, p)] + self.extra

    def start(self, timeout=30):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args(), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited with %d at start:\n%s" %
                                   (self.kind, self.proc.returncode, self.read_log()))
            try:
                r = self.etcdctl("get", "startup-probe", check=False, timeout=3)
                if r.returncode == 0:
                    return self
            except subprocess.TimeoutExpired:
                pass  # a probe slower than 3 s (a loaded machine): probe again
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("%s did not answer within %ds:\n%s" % (self.kind, timeout,
                                                                   self.read_log()))

    def read_log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-4000:]
        except OSError:
            return ""

    def etcdctl(self, *args, stdin=None, check=True, timeout=ETCDCTL_TIMEOUT):
        env = dict(os.environ, ETCDCTL_API="3")
        cmd = ["etcdctl", "--endpoints=" + self.endpoint, "--command-timeout=10s"] + list(args)
        r = subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError("%s: etcdctl %s failed (%d): %s" %
                                 (self.kind, " ".join(args), r.returncode,
                                  r.stderr.decode(errors="replace")))
        return r

    def json(self, *args):
        return json.loads(self.etcdctl(*args, "-w", "json").stdout)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        """Stops our own process; returns its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        self.proc = None
        self.log.close()
        return rc

    def cleanup(self):
        if self.proc is not None:
            self.stop(signal.SIGKILL)
        shutil.rmtree(self.tmp, ignore_errors=True)
