#!/usr/bin/python3
"""Peer TLS (server/peer on gRPC's TLS, server/tls's checks): three cairn
members on https:// peer URLs with --peer-cert-file/--peer-key-file/
--peer-trusted-ca-file/--peer-client-cert-auth/--peer-crl-file/
--peer-cert-allowed-cn replicate a put on one to the others. Then an
impostor of member n3 (the same --initial-cluster, so the same member and
cluster ids and token: only its certificate differs) dials n1 and n2 with
no certificate, another CA's, a revoked one, one whose CN is not the
allowed one, and one whose SANs do not name its address: each is refused, n1 logs the reason, and the key the impostor
wrote never reaches n1 or n2. Then n3 stops and members serving a revoked
certificate, another CA's, a disallowed CN or SANs without 127.0.0.1 take
its peer URL:
n1's dials to each are refused and logged. Every certificate is made at
test time.

Usage: test_peer_tls.py --cairn build/cairn
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from procs import free_port  # noqa: E402
from verdict import check, finish  # noqa: E402
import tls_fixtures  # noqa: E402

PEER_CN = "cairn-peer"


class Node:
    def __init__(self, binary, tmp, name, listen, advertise, cluster, tls):
        self.name = name
        self.client_port = free_port()
        self.dir = os.path.join(tmp, "%s-%d" % (name, self.client_port))
        os.makedirs(self.dir)
        self.log_path = os.path.join(self.dir, "log")
        c = "http://127.0.0.1:%d" % self.client_port
        self.args = [binary, "--name", name, "--data-dir", os.path.join(self.dir, "data"),
                     "--listen-client-urls", c, "--advertise-client-urls", c,
                     "--listen-peer-urls", listen, "--initial-advertise-peer-urls", advertise,
                     "--initial-cluster", cluster, "--sync-interval-ms", "50"] + tls
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def ctl(self, *args):
        env = dict(os.environ, ETCDCTL_API="3")
        return subprocess.run(["etcdctl", "--endpoints=127.0.0.1:%d" % self.client_port,
                               "--dial-timeout=2s", "--command-timeout=3s"] + list(args),
                              capture_output=True, env=env, timeout=30)

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited: %s" % (self.name, self.read_log()))
            if self.ctl("get", "probe").returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("%s did not answer: %s" % (self.name, self.read_log()))

    def get(self, key):
        r = self.ctl("get", key, "--print-value-only")
        return r.stdout.decode().strip() if r.returncode == 0 else None

    def read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def wait_for(pred, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--etcd", default=None, help="etcd 3.4, for the checks beside it")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cairn-it-peer-tls-")
    nodes = []
    try:
        fx = tls_fixtures.make(os.path.join(tmp, "fx"), ("n1", "n2", "n3"), peer_cn=PEER_CN)
        ports = [free_port() for _ in range(3)]
        names = ["n1", "n2", "n3"]
        cluster = ",".join("%s=https://127.0.0.1:%d" % (n, p) for n, p in zip(names, ports))

        def tls(cert, key, ca=fx.ca):
            t = ["--peer-client-cert-auth", "--peer-crl-file", fx.crl,
                 "--peer-cert-allowed-cn", PEER_CN]
            if ca:
                t += ["--peer-trusted-ca-file", ca]
            if cert:
                t += ["--peer-cert-file", cert, "--peer-key-file", key]
            return t

        urls = ["https://127.0.0.1:%d" % p for p in ports]
        for n, u in zip(names, urls):
            nodes.append(Node(a.cairn, tmp, n, u, u, cluster, tls(*fx.leaf[n])))
        for n in nodes:
            n.wait_ready()
        r = nodes[0].ctl("put", "over-tls", "yes")
        check(r.returncode == 0, "put on n1")
        for n in nodes[1:]:
            check(wait_for(lambda: n.get("over-tls") == "yes", 30),
                  "%s has n1's put through the TLS peer links" % n.name)
        for n in nodes:
            check("refused" not in n.read_log(), "%s refused nothing among members" % n.name)

        impostors = [
            # what it presents, the reason n1 logs
            ("no certificate", None, None, "the peer presented no certificate"),
            ("another CA's certificate", fx.leaf["other"][0], fx.leaf["other"][1],
             "x509: certificate signed by unknown authority"),
            ("a revoked certificate", fx.leaf["revoked"][0], fx.leaf["revoked"][1],
             "transport: certificate serial 1002 revoked"),
            ("a disallowed CN", fx.leaf["intruder"][0], fx.leaf["intruder"][1],
             'certificate CN \\"intruder\\" is not the allowed CN \\"cairn-peer\\"'.replace(
                 "\\", "")),
            # etcd: the listener checks a dialing member's SANs against its
            # address (CA, CN and CRL all pass here)
            ("SANs that do not name its address", fx.leaf["wrongsan"][0], fx.leaf["wrongsan"][1],
             'tls: "127.0.0.1" does not match any of DNSNames ["elsewhere.invalid"]'),
        ]
        for i, (what, cert, key, reason) in enumerate(impostors):
            # n3's name and peer URL in the cluster, a port of its own to
            # listen on (plain http without a certificate to serve with)
            own = "%s://127.0.0.1:%d" % ("https" if cert else "http", free_port())
            t = tls(cert, key) if cert else ["--peer-trusted-ca-file", fx.ca]
            x = Node(a.cairn, tmp, "n3", own, urls[2], cluster, t)
            before = nodes[0].read_log().count(reason)
            started = time.monotonic()
            try:
                x.wait_ready()
                evil = "evil-%d" % i
                check(x.ctl("put", evil, "applied").returncode == 0, "the impostor's own put")
                logged = wait_for(lambda: reason in nodes[0].read_log(), 20)
                check(logged, "n1 logs the refusal of an impostor with %s: %r" % (what, reason))
                time.sleep(1.0)  # a sync interval or twenty
                for n in nodes:
                    check(n.get(evil) == "", "%s did not apply the impostor's key (%s)" %
                          (n.name, what))
                # a refused impostor redials with a growing backoff (tens
                # of ms doubling to 2 s), not at the shortest one: it used
                # to come back about 30 times a second
                refusals = nodes[0].read_log().count(reason) - before
                spent = time.monotonic() - started
                check(refusals <= 8 + 2 * spent,
                      "the impostor with %s is backed off: %d refusals in %.1f s" %
                      (what, refusals, spent))
            finally:
                x.stop()
        lines = [ln for ln in nodes[0].read_log().splitlines() if "certificate refused" in ln]
        for ln in lines[:4]:
            print(ln)
        check(all(n.proc.poll() is None for n in nodes), "every member still runs")
        check(nodes[2].get("over-tls") == "yes", "n3 still has the data")

        # etcd: --peer-cert-allowed-cn and --peer-cert-allowed-hostname at
        # once stop the member at start, exit code 1 (measured)
        both = tls(*fx.leaf["n1"]) + ["--peer-cert-allowed-hostname", "127.0.0.1"]
        for kind, binary in (("cairn", a.cairn), ("etcd", a.etcd)):
            if not binary:
                continue
            own = "https://127.0.0.1:%d" % free_port()
            c = "http://127.0.0.1:%d" % free_port()
            d = tempfile.mkdtemp(prefix="both-", dir=tmp)
            r = subprocess.run([binary, "--name", "x", "--data-dir", os.path.join(d, "data"),
                                "--listen-client-urls", c, "--advertise-client-urls", c,
                                "--listen-peer-urls", own, "--initial-advertise-peer-urls", own,
                                "--initial-cluster", "x=" + own] + both,
                               capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
            out = (r.stdout + r.stderr).decode("utf-8", "replace")
            check(r.returncode == 1 and 'AllowedCN and AllowedHostname are mutually exclusive '
                  '(cn="cairn-peer", hostname="127.0.0.1")' in out,
                  "%s with both allowed flags: exit code %s, want 1 with etcd's message:\n%s" %
                  (kind, r.returncode, out[-400:]))

        # The dialing end: n3 stops and a member with a bad certificate
        # serves at n3's peer URL. n1's own dials to it are refused (the
        # line names n3, not an address and a hello), and nothing it wrote
        # reaches n1. etcd refuses a server whose certificate is another
        # CA's, does not name the URL's host or fails the allowed CN as
        # here; a revoked one cairn refuses on this end too, where etcd
        # 3.4 does not (docs/FLAGS.md says why). A failed handshake is
        # logged once until a dial passes one: the disallowed CN's comes
        # between the two handshake cases.
        nodes[2].stop()
        servers = [
            ("a revoked certificate", "revoked",
             "peer n3: refused: certificate refused: transport: certificate serial 1002 revoked"),
            ("another CA's certificate", "other",
             "peer n3: refused: certificate refused: the TLS handshake failed: "),
            ("a disallowed CN", "intruder",
             'peer n3: refused: certificate refused: client certificate authentication failed '
             '(certificate CN "intruder"'),
            ("SANs that do not name the URL's host", "wrongsan",
             "peer n3: refused: certificate refused: the TLS handshake failed: "),
        ]
        for i, (what, leaf, reason) in enumerate(servers):
            cert, key = fx.leaf[leaf]
            x = Node(a.cairn, tmp, "n3", urls[2], urls[2], cluster, tls(cert, key))
            before = nodes[0].read_log().count(reason)
            try:
                x.wait_ready()
                evil = "evil-served-%d" % i
                check(x.ctl("put", evil, "applied").returncode == 0, "the bad server's own put")
                check(wait_for(lambda: nodes[0].read_log().count(reason) > before, 20),
                      "n1 refuses its dial to a member serving %s: %r" % (what, reason))
                time.sleep(1.0)
                check(nodes[0].get(evil) == "" and nodes[1].get(evil) == "",
                      "n1 and n2 did not apply the key of a member serving %s" % what)
            finally:
                x.stop()
    finally:
        for n in nodes:
            n.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
