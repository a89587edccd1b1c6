"""Certificates for the TLS tests, made at test time with the openssl CLI
(nothing private is checked in): a CA and a second, unrelated CA; server
and peer certificates for 127.0.0.1/localhost; client certificates that are
good, revoked (listed in the CA's CRL), expired, from the other CA, or
signed by an intermediate CA under the main one; peer certificates whose
SANs leave 127.0.0.1 out (none, wrong ones, a DNS name alone); one whose
only name is its CN "localhost" (no SAN).

    f = make(tmpdir)            # -> Fixtures; every path is under tmpdir
    f.ca, f.server_cert, f.server_key, f.client("good") -> (cert, key)
    f.crl                       # the CA's CRL, listing the "revoked" client

Certificates carry both serverAuth and clientAuth, as etcd's docs make
peer certificates, so one pair serves either end of a peer link.
"""

import os
import subprocess

CA_CONF = """
[ca]
default_ca = ca_default
[ca_default]
dir = {dir}
database = {dir}/index.txt
new_certs_dir = {dir}/newcerts
serial = {dir}/serial
crlnumber = {dir}/crlnumber
default_md = sha256
default_crl_days = 30
policy = policy_any
copy_extensions = copy
unique_subject = no
[policy_any]
commonName = supplied
[ext_leaf]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = {san}
[ext_leaf_nosan]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
[ext_leaf_wrongsan]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:10.9.9.9, DNS:elsewhere.invalid
[ext_leaf_dnssan]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:localhost
[ext_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
"""


def _run(*args):
    r = subprocess.run(["openssl"] + list(args), capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("openssl %s: %s" % (" ".join(args), r.stderr.decode()))


class CA:
    def __init__(self, root, name, san, parent=None):
        self.dir = os.path.join(root, name)
        os.makedirs(os.path.join(self.dir, "newcerts"))
        open(os.path.join(self.dir, "index.txt"), "w").close()
        with open(os.path.join(self.dir, "serial"), "w") as f:
            f.write("1000\n")
        with open(os.path.join(self.dir, "crlnumber"), "w") as f:
            f.write("1000\n")
        self.conf = os.path.join(self.dir, "ca.cnf")
        with open(self.conf, "w") as f:
            f.write(CA_CONF.format(dir=self.dir, san=san))
        self.key = os.path.join(self.dir, "ca-key.pem")
        self.cert = os.path.join(self.dir, "ca.pem")
        if parent is None:
            _run("req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", self.key, "-out", self.cert, "-days", "30",
                 "-subj", "/CN=%s" % name, "-config", self.conf, "-extensions", "ext_ca")
        else:  # an intermediate: |parent| signs it
            csr = os.path.join(self.dir, "ca.csr")
            _run("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", self.key, "-out", csr, "-subj", "/CN=%s" % name)
            _run("ca", "-batch", "-config", parent.conf, "-extensions", "ext_ca", "-days", "30",
                 "-cert", parent.cert, "-keyfile", parent.key, "-in", csr, "-out", self.cert,
                 "-notext")

    def leaf(self, cn, start=None, end=None, fname=None, ext="ext_leaf"):
        """A leaf cert and key signed by this CA (files named |fname|, the
        CN by default; |ext| the conf section: ext_leaf has the IP and DNS
        SANs, ext_leaf_nosan none, ext_leaf_wrongsan others', ext_leaf_dnssan
        DNS:localhost alone); returns (cert, key)."""
        fname = fname or cn
        key = os.path.join(self.dir, fname + "-key.pem")
        csr = os.path.join(self.dir, fname + ".csr")
        cert = os.path.join(self.dir, fname + ".pem")
        _run("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", csr, "-subj", "/CN=%s" % cn)
        args = ["ca", "-batch", "-config", self.conf, "-extensions", ext,
                "-cert", self.cert, "-keyfile", self.key, "-in", csr, "-out", cert, "-notext"]
        if start:
            args += ["-startdate", start, "-enddate", end]
        else:
            args += ["-days", "30"]
        _run(*args)
        return cert, key

    def revoke(self, cert):
        _run("ca", "-config", self.conf, "-cert", self.cert, "-keyfile", self.key,
             "-revoke", cert)

    def gen_crl(self):
        crl = os.path.join(self.dir, "crl.pem")
        _run("ca", "-config", self.conf, "-cert", self.cert, "-keyfile", self.key,
             "-gencrl", "-out", crl)
        return crl


class Fixtures:
    pass


def make(root, peers=(), peer_cn=None):
    """Writes every fixture under |root|; |peers| are extra leaves of the
    main CA (e.g. member names), available as f.leaf[name], with the CN
    |peer_cn| if given (else the name)."""
    san = "IP:127.0.0.1, DNS:localhost"
    f = Fixtures()
    ca = CA(root, "ca", san)
    other = CA(root, "other-ca", san)
    f.ca = ca.cert
    f.other_ca = other.cert
    f.server_cert, f.server_key = ca.leaf("server")
    f.leaf = {}
    for cn in ("good", "revoked", "intruder"):
        f.leaf[cn] = ca.leaf(cn)
    for name in peers:
        f.leaf[name] = ca.leaf(peer_cn or name, fname=name)
    # peer certificates whose SANs do not name 127.0.0.1: none, others',
    # DNS:localhost alone (CN n2, as a member's)
    for ext in ("nosan", "wrongsan", "dnssan"):
        f.leaf[ext] = ca.leaf(peer_cn or "n2", fname=ext, ext="ext_leaf_" + ext)
    # a name only in the subject's CN, no SAN (Go never falls back to it)
    f.leaf["cnonly"] = ca.leaf("localhost", fname="cnonly", ext="ext_leaf_nosan")
    # a certificate whose validity ended a year ago
    f.leaf["expired"] = ca.leaf("expired", "20240101000000Z", "20250101000000Z")
    f.leaf["other"] = other.leaf("other")
    # a leaf of an intermediate CA the main CA signed: "chained" is the
    # leaf alone, "chained-bundle" the leaf and the intermediate (as a
    # peer sends them)
    inter = CA(root, "inter-ca", san, parent=ca)
    f.leaf["chained"] = inter.leaf("chained")
    bundle = os.path.join(inter.dir, "chained-bundle.pem")
    with open(bundle, "w") as out:
        for part in (f.leaf["chained"][0], inter.cert):
            with open(part) as src:
                out.write(src.read())
    f.leaf["chained-bundle"] = (bundle, f.leaf["chained"][1])
    ca.revoke(f.leaf["revoked"][0])
    f.crl = ca.gen_crl()
    f.client = lambda cn: f.leaf[cn]
    return f


if __name__ == "__main__":
    import sys
    fx = make(sys.argv[1], tuple(sys.argv[2:]))
    print(fx.ca, fx.crl, fx.leaf)
