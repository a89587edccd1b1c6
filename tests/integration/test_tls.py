#!/usr/bin/python3
"""Client TLS (server/tls) against etcd 3.4 with the same certificates, made
at test time (tls_fixtures.py): an https:// and an http:// listener side by
side with --cert-file/--key-file/--trusted-ca-file/--client-cert-auth/
--client-crl-file; etcdctl (--cacert/--cert/--key) and python3-etcd3 with
TLS work over https and plain etcdctl over http; a wrong CA, no client
cert, an expired, a revoked or another CA's cert, and a plaintext client on
the TLS port each fail in etcdctl as they do against etcd, and the server
logs the reason etcd logs. Then --auto-tls (etcd's file layout), and
--cipher-suites (an unknown name stops the server at start with etcd's
message; a known one is what a TLS 1.2 handshake gets).

Usage: test_tls.py --cairn build/cairn [--etcd /usr/bin/etcd]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from system_python import grpc  # noqa: E402,F401  (python3-etcd3 needs Debian's grpc)
from procs import Server, free_port  # noqa: E402
from verdict import check, finish  # noqa: E402
import tls_fixtures  # noqa: E402


class TLSServer(Server):
    """A server whose first client URL is https:// (with |tls| flags) and
    whose second is http://."""

    def __init__(self, kind, binary, fx, tls_args):
        super().__init__(kind, binary)
        self.fx = fx
        self.tls_args = list(tls_args)
        self.http_port = free_port()
        self.ctl = ["--cacert", fx.ca, "--cert", fx.leaf["good"][0], "--key", fx.leaf["good"][1]]

    def args(self):
        c = "https://127.0.0.1:%d" % self.client_port
        h = "http://127.0.0.1:%d" % self.http_port
        p = "http://127.0.0.1:%d" % self.peer_port
        return [self.binary, "--name", self.name, "--data-dir", self.data_dir,
                "--listen-client-urls", c + "," + h, "--advertise-client-urls", c,
                "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                "--initial-cluster", "%s=%s" % (self.name, p)] + self.tls_args

    def etcdctl(self, *args, **kw):
        return super().etcdctl(*(self.ctl + ["--endpoints=https://" + self.endpoint] +
                                 list(args)), **kw)


def ctl(endpoint, *args):
    env = dict(os.environ, ETCDCTL_API="3")
    cmd = ["etcdctl", "--endpoints=" + endpoint, "--dial-timeout=2s",
           "--command-timeout=3s"] + list(args)
    return subprocess.run(cmd, capture_output=True, env=env, timeout=30)


def failure_kind(r):
    """What etcdctl reported: "ok", or the last line of its error."""
    if r.returncode == 0:
        return "ok"
    lines = [ln for ln in r.stderr.decode(errors="replace").splitlines()
             if ln.startswith("Error:")]
    return lines[-1] if lines else "exit %d" % r.returncode


def cases(fx):
    g, rv, ex, ot = fx.leaf["good"], fx.leaf["revoked"], fx.leaf["expired"], fx.leaf["other"]
    return [
        # name, etcdctl TLS args, scheme, the reason the server logs
        ("good", ["--cacert", fx.ca, "--cert", g[0], "--key", g[1]], "https", None),
        ("wrong CA", ["--cacert", fx.other_ca, "--cert", g[0], "--key", g[1]], "https",
         "remote error: tls: bad certificate"),
        ("no client cert", ["--cacert", fx.ca], "https",
         "tls: client didn't provide a certificate"),
        ("expired", ["--cacert", fx.ca, "--cert", ex[0], "--key", ex[1]], "https",
         "x509: certificate has expired or is not yet valid"),
        ("revoked", ["--cacert", fx.ca, "--cert", rv[0], "--key", rv[1]], "https",
         "transport: certificate serial 1002 revoked"),
        ("other CA", ["--cacert", fx.ca, "--cert", ot[0], "--key", ot[1]], "https",
         "x509: certificate signed by unknown authority"),
        ("plaintext on the TLS port", [], "http",
         "tls: first record does not look like a TLS handshake"),
    ]


def run_client_cases(srv, fx):
    """{case: (etcdctl's outcome, the reason was logged)}"""
    out = {}
    for name, args, scheme, reason in cases(fx):
        r = ctl("%s://%s" % (scheme, srv.endpoint), *(args + ["put", "tls-" + name, "v"]))
        time.sleep(0.3)  # the log line
        logged = reason is None or ('(error "%s' % reason) in srv.read_log() or \
            reason in srv.read_log()
        out[name] = (failure_kind(r), logged)
    return out


def python_etcd3(srv, fx):
    """A put and a get through python3-etcd3 with TLS."""
    import etcd3
    c = etcd3.client(host="127.0.0.1", port=srv.client_port, ca_cert=fx.ca,
                     cert_key=fx.leaf["good"][1], cert_cert=fx.leaf["good"][0], timeout=10)
    c.put("py-key", "py-value")
    v, _ = c.get("py-key")
    c.close()
    return v


def client_tls(kind, binary, fx):
    tls = ["--cert-file", fx.server_cert, "--key-file", fx.server_key,
           "--trusted-ca-file", fx.ca, "--client-cert-auth", "--client-crl-file", fx.crl]
    srv = TLSServer(kind, binary, fx, tls)
    try:
        srv.start()
        res = run_client_cases(srv, fx)
        # the http listener beside it serves without certificates
        h = ctl("http://127.0.0.1:%d" % srv.http_port, "get", "tls-good", "--print-value-only")
        res["http listener"] = (h.stdout.decode().strip(), True)
        res["python3-etcd3"] = (python_etcd3(srv, fx), True)
        return res
    finally:
        srv.stop()
        srv.cleanup()


def auto_tls(kind, binary):
    """--auto-tls: the files etcd writes, and a client that skips
    verification gets through."""
    srv = Server(kind, binary)
    c = "https://127.0.0.1:%d" % srv.client_port
    srv.extra = ["--listen-client-urls", c, "--advertise-client-urls", c, "--auto-tls"]
    srv.etcdctl = lambda *a, **kw: Server.etcdctl(
        srv, *(["--insecure-transport=false", "--insecure-skip-tls-verify"] + list(a)), **kw)
    try:
        srv.start()
        files = sorted(os.path.relpath(os.path.join(d, f), srv.data_dir)
                       for d, _, fs in os.walk(os.path.join(srv.data_dir, "fixtures"))
                       for f in fs)
        key = open(os.path.join(srv.data_dir, "fixtures/client/key.pem")).read()
        mode = os.stat(os.path.join(srv.data_dir, "fixtures/client/key.pem")).st_mode & 0o777
        cert = subprocess.run(["openssl", "x509", "-noout", "-text", "-in",
                               os.path.join(srv.data_dir, "fixtures/client/cert.pem")],
                              capture_output=True, text=True).stdout
        shape = (files, key.splitlines()[0], oct(mode), "P-521" in cert, "O = etcd" in cert,
                 "IP Address:127.0.0.1" in cert)
        ok = srv.etcdctl("put", "a", "b", check=False).returncode == 0
        return shape, ok
    finally:
        srv.stop()
        srv.cleanup()


def cipher_start(kind, binary, fx, suites):
    """(exit code or None if it kept running, log) for --cipher-suites."""
    srv = TLSServer(kind, binary, fx, ["--cert-file", fx.server_cert, "--key-file",
                                       fx.server_key, "--cipher-suites", suites])
    srv.log = open(srv.log_path, "ab")
    p = subprocess.Popen(srv.args(), stdout=srv.log, stderr=subprocess.STDOUT)
    try:
        p.wait(timeout=4)
        return p.returncode, srv.read_log()
    except subprocess.TimeoutExpired:
        r = subprocess.run(["openssl", "s_client", "-connect", srv.endpoint, "-tls1_2"],
                           input=b"", capture_output=True, timeout=20)
        m = re.search(rb"Cipher is (\S+)", r.stdout)
        return None, m.group(1).decode() if m else r.stdout.decode(errors="replace")[-300:]
    finally:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=20)
        srv.log.close()
        srv.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--etcd")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cairn-it-tls-")
    try:
        fx = tls_fixtures.make(os.path.join(tmp, "fx"))
        cairn = client_tls("cairn", a.cairn, fx)
        for k, v in cairn.items():
            print("cairn %-28s %s" % (k, v))
        check(cairn["good"][0] == "ok", "cairn: etcdctl with a good cert works")
        check(cairn["http listener"][0] == "v", "cairn: the http listener beside https serves")
        check(cairn["python3-etcd3"][0] == b"py-value", "cairn: python3-etcd3 with TLS")
        for name, _, _, _ in cases(fx)[1:]:
            check(cairn[name][0] != "ok", "cairn: %s is refused" % name)
            check(cairn[name][1], "cairn: the reason for '%s' is logged as etcd logs it" % name)
        if a.etcd:
            etcd = client_tls("etcd", a.etcd, fx)
            for k, v in etcd.items():
                print("etcd  %-28s %s" % (k, v))
            for name, _, _, _ in cases(fx):
                check(cairn[name][0] == etcd[name][0],
                      "%s: etcdctl sees %r on cairn, %r on etcd" %
                      (name, cairn[name][0], etcd[name][0]))
                check(etcd[name][1], "etcd logged the reason for '%s' (the test's premise)"
                      % name)

        shape, ok = auto_tls("cairn", a.cairn)
        print("cairn auto-tls", shape, ok)
        check(ok, "cairn --auto-tls serves a client that skips verification")
        check(shape[0] == ["fixtures/client/cert.pem", "fixtures/client/key.pem"],
              "cairn --auto-tls writes fixtures/client/{cert,key}.pem: %s" % shape[0])
        check(shape[1:] == ("-----BEGIN EC PRIVATE KEY-----", "0o600", True, True, True),
              "cairn --auto-tls key and cert as etcd makes them: %s" % (shape[1:],))
        if a.etcd:
            eshape, _ = auto_tls("etcd", a.etcd)
            print("etcd  auto-tls", eshape)
            check(shape == eshape, "auto-tls: cairn %s, etcd %s" % (shape, eshape))

        rc, log = cipher_start("cairn", a.cairn, fx, "TLS_FOO")
        check(rc not in (None, 0) and 'unexpected TLS cipher suite "TLS_FOO"' in log,
              "cairn refuses an unknown cipher suite at start: %s %s" % (rc, log[-200:]))
        rc, got = cipher_start("cairn", a.cairn, fx, "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384")
        check(rc is None and got == "ECDHE-ECDSA-AES256-GCM-SHA384",
              "cairn --cipher-suites is what TLS 1.2 gets: %s %s" % (rc, got))
        if a.etcd:
            rc, log = cipher_start("etcd", a.etcd, fx, "TLS_FOO")
            check(rc not in (None, 0) and 'unexpected TLS cipher suite "TLS_FOO"' in log,
                  "etcd refuses an unknown cipher suite at start (premise)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
