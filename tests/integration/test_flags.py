#!/usr/bin/python3
"""Every etcd 3.4 flag, its ETCD_* variable, --config-file, Go's flag syntax
and unix:// listeners (issue 13; docs/FLAGS.md is the table).

- The flag list is read from the real `etcd --help` at test time, so a flag
  that a new etcd adds fails here until cairn's table (server/config.c,
  printed by `cairn --help`) has it.
- Each flag alone, with a value etcd accepts, is given to cairn: it starts
  (an ignored flag is logged once with its reason) or is refused with the
  message its section of `cairn --help` documents. A refused-when-set flag
  starts at etcd's default value. All of them together (an etcd command
  line from a deployment) start cairn, and the same line passes etcd's own
  flag parsing.
- Go's syntax edge cases give cairn and etcd the same verdict and message.
- ETCD_* variables are used when their flag is not given; beside their flag
  they stop both servers with etcd's message; an unknown one is warned about.
- A config file in the shape of etcd's etcd.conf.yml.sample starts both;
  flags and ETCD_* variables beside it are ignored by both.
- unix://host:port client and peer URLs serve etcdctl, and a restart binds
  again over the socket file left behind.

Usage: test_flags.py --cairn build/cairn --etcd /usr/bin/etcd
"""

import argparse
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import free_port  # noqa: E402
from verdict import check, finish  # noqa: E402

# cairn's line, etcd's capnslog line, etcd's zap line (zap has no "ready").
READY = ("ready to serve client requests", "serving client traffic insecurely")
START_TIMEOUT = 15  # seconds for one cairn start (a loaded machine)
TLS = "TLS is not implemented yet"
REFUSED = "is not supported"


def etcd_flags(etcd):
    """name -> default as `etcd --help` prints it ('' when it prints '')."""
    out = subprocess.run([etcd, "--help"], capture_output=True, timeout=20)
    text = (out.stdout + out.stderr).decode()
    flags = {}
    for m in re.finditer(r"^  --([a-z0-9-]+) ?(.*)$", text, re.M):
        flags[m.group(1)] = m.group(2).strip().strip("'")
    return flags


def cairn_sections(cairn):
    """(implemented, ignored, refused) flag names from `cairn --help`."""
    text = subprocess.run([cairn, "--help"], capture_output=True, timeout=20).stdout.decode()
    head, _, rest = text.partition("Accepted for compatibility")
    ignored_txt, _, refused_txt = rest.partition("Accepted only at")
    impl = set(re.findall(r"^  --([a-z0-9-]+)$", head, re.M))
    ignored = set(re.findall(r"^  --([a-z0-9-]+):", ignored_txt, re.M))
    refused = set(re.findall(r"^  --([a-z0-9-]+):", refused_txt, re.M))
    return impl, ignored, refused


class Run:
    """One server process in its own directory (unix sockets are relative
    to it); returns when it is ready or has exited."""

    def __init__(self, binary, args, env=None, ready=READY):
        self.dir = tempfile.mkdtemp(prefix="cairn-it-flags-")
        self.log_path = os.path.join(self.dir, "log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([binary] + args, cwd=self.dir, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env if env is not None else clean_env())
        deadline = time.time() + START_TIMEOUT
        self.ready = False
        while time.time() < deadline and self.proc.poll() is None:
            if any(r in self.log() for r in ready):
                self.ready = True
                break
            time.sleep(0.05)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self, settle=0):
        """settle: seconds to let it exit by itself before it is signalled."""
        try:
            self.proc.wait(timeout=settle)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.rc = self.proc.returncode  # negative: stopped by our signal
        log = self.log()
        shutil.rmtree(self.dir, ignore_errors=True)
        return log


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}


def base_flags(name="n1"):
    c = "http://127.0.0.1:%d" % free_port()
    p = "http://127.0.0.1:%d" % free_port()
    return {"name": name, "data-dir": "data", "listen-client-urls": c,
            "advertise-client-urls": c, "listen-peer-urls": p,
            "initial-advertise-peer-urls": p, "initial-cluster": "%s=%s" % (name, p)}


def argv(flags):
    return ["--%s=%s" % kv for kv in flags.items()]


# A value etcd accepts for each flag whose --help default is not one
# (empty, or not a literal), or whose default would not exercise it.
VALUES = {
    "wal-dir": "wal", "backend-batch-interval": "10ms", "max-concurrent-streams": "1000",
    "discovery": "http://127.0.0.1:1/v2/keys/d", "discovery-proxy": "http://127.0.0.1:1",
    "discovery-srv": "example.com", "discovery-srv-name": "x",
    "auto-compaction-retention": "1h", "cert-file": "c.pem", "key-file": "k.pem",
    "client-crl-file": "crl.pem", "client-cert-allowed-hostname": "h", "trusted-ca-file": "ca.pem",
    "peer-cert-file": "pc.pem", "peer-key-file": "pk.pem", "peer-trusted-ca-file": "pca.pem",
    "peer-cert-allowed-cn": "n1", "peer-cert-allowed-hostname": "h", "peer-crl-file": "pcrl.pem",
    "cipher-suites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "cors": "http://a.example:80",
    "host-whitelist": "a.example", "listen-metrics-urls": "http://127.0.0.1:%d" % free_port(),
    "log-outputs": "stderr", "logger": "zap", "log-package-levels": "etcdmain=INFO",
    "log-level": "debug", "proxy": "on", "experimental-enable-v2v3": "/v2",
    "experimental-corrupt-check-time": "1m", "auth-token": "simple", "metrics": "extensive",
}
# TLS is implemented (server/tls): a TLS flag alone, on the http:// URLs the
# walk uses, starts cairn as it starts etcd (test_tls / test_peer_tls cover
# https). Kept empty so a flag that must be refused again can be listed.
TLS_FLAGS = set()
SKIP = {"config-file"}  # its own test below


def value_for(name, default):
    if name in VALUES:
        return VALUES[name]
    if default in ("true", "false"):
        return "true"
    return {"math.MaxUint32": "4294967295"}.get(default, default)


def expect(name, default, impl, ignored, refused):
    """(value given, what must happen: 'ready' or a message fragment)."""
    v = value_for(name, default)
    if name in TLS_FLAGS:
        return v, TLS
    if name in refused:
        return v, REFUSED
    return v, "ready"


def walk_one(cairn, name, value, want, ignored):
    flags = base_flags()
    bare = value == "true"
    # The flags every run gives (--name, the URLs, ...) are walked by every run.
    extra = [] if name in flags else ["--" + name] if bare else ["--%s=%s" % (name, value)]
    args = argv(flags) + extra
    if name in flags:
        value, bare = flags[name], False
    r = Run(cairn, args)
    ready = r.ready
    log = r.stop()
    what = "--%s%s" % (name, "" if bare else "=" + value)
    if want == "ready":
        check(ready, "%s: cairn did not start:\n%s" % (what, log[-800:]))
        if name in ignored:
            check("flag --%s=%s does not apply to cairn" % (name, value) in log,
                  "%s: not logged as ignored:\n%s" % (what, log[-800:]))
    else:
        check(not ready and want in log, "%s: expected a refusal with '%s':\n%s" %
              (what, want, log[-800:]))


def test_walk(cairn, etcd):
    ef = etcd_flags(etcd)
    check(len(ef) >= 80, "etcd --help lists %d flags" % len(ef))
    impl, ignored, refused = cairn_sections(cairn)
    for name in ef:
        check(name in impl | ignored | refused,
              "etcd flag --%s is not in cairn's table (server/config.c)" % name)
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        for name, default in ef.items():
            if name in SKIP or name not in impl | ignored | refused:
                continue
            value, want = expect(name, default, impl, ignored, refused)
            jobs.append(pool.submit(walk_one, cairn, name, value, want, ignored))
            # A refused or TLS flag at etcd's default (empty, false, off)
            # changes nothing, so it starts.
            if want != "ready":
                dflt = {"proxy": "off"}.get(name, "false" if default == "false" else "")
                jobs.append(pool.submit(walk_one, cairn, name, dflt, "ready", set()))
        for j in jobs:
            j.result()
    print("walked %d etcd flags (%d runs)" % (len(ef), len(jobs)))

    # Everything that starts, in one command line: cairn starts, and etcd's
    # own parser accepts every value (it exits 2 on a flag it cannot parse).
    line = base_flags()
    for name, default in ef.items():
        if name in SKIP or name in line:
            continue
        value, want = expect(name, default, impl, ignored, refused)
        if want == "ready":
            line[name] = value
    line["wal-dir"] = "wal"
    r = Run(cairn, argv(line))
    ready = r.ready
    log = r.stop()
    check(ready, "cairn with every accepted etcd flag at once did not start:\n%s" % log[-1500:])
    e = Run(etcd, argv(line))
    elog = e.stop()
    check(not re.search(r"invalid (boolean )?value|flag provided but not defined", elog),
          "etcd refused the all-flags line's values:\n%s" % elog[-1500:])


def verdict(binary, args, env=None):
    """(started, log) for a short run."""
    return verdict_rc(binary, args, env)[:2]


def verdict_rc(binary, args, env=None, settle=0):
    """(started, log, exit code) for a short run."""
    r = Run(binary, args, env=env)
    ready = r.ready
    log = r.stop(settle)
    return ready, log, r.rc


def test_syntax(cairn, etcd):
    # (extra args, phrase both servers print; None = both start)
    cases = [
        (["--bogus", "1"], "flag provided but not defined: -bogus"),
        (["extra"], "'extra' is not a valid flag"),
        (["--snapshot-count="], 'invalid value "" for flag -'),
        (["--max-txn-ops="], 'invalid value "" for flag -'),
        (["--auto-tls="], 'invalid boolean value ""'),
        (["--pre-vote=maybe"], 'invalid boolean value "maybe"'),
        (["---name", "x"], "bad flag syntax: ---name"),
        (["--", "--pre-vote"], "'--pre-vote' is not a valid flag"),
        (["--pre-vote", "false"], "'false' is not a valid flag"),  # a bare bool takes no value
        (["--grpc-keepalive-min-time=5"], 'invalid value "5" for flag -'),
        (["--pre-vote=false"], None),
        (["-pre-vote"], None),
        (["--snapshot-count", "0x10"], None),
        (["--max-concurrent-streams=4294967296"], 'invalid value "4294967296" for flag -'),
        (["--grpc-keepalive-interval=0"], None),
    ]
    # etcd's exit codes: 2 for what Go's flag package refuses on the
    # command line, 1 for what etcd checks after parsing (measured).
    exits = [
        (["--bogus"], 2), (["--snapshot-count=abc"], 2), (["--name"], 2),
        (["--listen-client-urls=ftp://127.0.0.1:1"], 2), (["--auto-tls=maybe"], 2),
        (["extra"], 1), (["--initial-cluster=foo"], 1), (["--cipher-suites=BOGUS"], 1),
        (["--config-file=/nonexistent/c.yml"], 1),
        (["--cert-file=/nonexistent/c.pem", "--key-file=/nonexistent/k.pem"], 1),
    ]

    def one(extra, phrase, kind, binary):
        ready, log = verdict(binary, argv(base_flags()) + extra)
        log = log.replace("for flag --", "for flag -")
        if phrase is None:
            check(ready, "%s %s: did not start:\n%s" % (kind, extra, log[-600:]))
        else:
            check(not ready and phrase in log,
                  "%s %s: expected a refusal with '%s':\n%s" % (kind, extra, phrase, log[-600:]))

    def exit_code(extra, want, kind, binary):
        flags = base_flags()
        if any(x.startswith("--cert-file") for x in extra):
            # https:// with files that do not exist: stops at start
            c = flags["listen-client-urls"].replace("http://", "https://")
            flags["listen-client-urls"] = flags["advertise-client-urls"] = c
        # etcd 3.4 may log "ready to serve client requests" before its https
        # listener fails on the missing files (seen in CI): it gets time to
        # exit by itself, and for etcd only the exit code is its answer
        ready, log, rc = verdict_rc(binary, argv(flags) + extra,
                                    settle=5 if kind == "etcd" else 0)
        check((kind == "etcd" or not ready) and rc == want,
              "%s %s: exit code %s, want %d (etcd's), ready logged: %s:\n%s" %
              (kind, extra, rc, want, ready, log[-400:]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        jobs = [pool.submit(one, extra, phrase, kind, binary) for extra, phrase in cases
                for kind, binary in (("cairn", cairn), ("etcd", etcd))]
        jobs += [pool.submit(exit_code, extra, want, kind, binary) for extra, want in exits
                 for kind, binary in (("cairn", cairn), ("etcd", etcd))]
        for j in jobs:
            j.result()
    # A flag that needs a value, last: "flag needs an argument: -name".
    for binary in (cairn, etcd):
        ready, log = verdict(binary, argv(base_flags()) + ["--wal-dir"])
        check(not ready and "flag needs an argument: -wal-dir" in log, "needs an argument: " + log[-300:])
    # Repeated flags: the last wins; -flag=value with one dash.
    f = base_flags("b")
    r = Run(cairn, argv(f) + ["--name", "a", "-name=b", "--max-txn-ops=1", "--max-txn-ops", "3"])
    out = subprocess.run(["etcdctl", "--endpoints", f["listen-client-urls"], "member", "list"],
                         capture_output=True, timeout=20).stdout.decode() if r.ready else ""
    r.stop()
    check(", b, " in out, "repeated --name: the last should win: %r" % out)


def test_env(cairn, etcd):
    f = base_flags("envname")
    env = clean_env()
    for k, v in f.items():
        env["ETCD_" + k.upper().replace("-", "_")] = v
    env["ETCD_SNAPSHOT_COUNT"] = "5000"
    env["ETCD_PRE_VOTE"] = "true"
    env["ETCD_NOT_A_FLAG"] = "1"
    r = Run(cairn, [], env=env)
    out = subprocess.run(["etcdctl", "--endpoints", f["listen-client-urls"], "member", "list"],
                         capture_output=True, timeout=20).stdout.decode() if r.ready else ""
    log = r.stop()
    check(", envname, " in out, "ETCD_NAME and the URLs from the environment: %r\n%s" %
          (out, log[-600:]))
    check("recognized and used environment variable ETCD_SNAPSHOT_COUNT=5000" in log,
          "ETCD_SNAPSHOT_COUNT not logged as used:\n" + log[-600:])
    check("flag --snapshot-count=5000 does not apply to cairn" in log,
          "ETCD_SNAPSHOT_COUNT not logged as ignored")
    check("unrecognized environment variable ETCD_NOT_A_FLAG=1" in log,
          "unknown ETCD_ variable not warned about")
    # A variable beside its flag: both stop with etcd's message.
    for kind, binary in (("cairn", cairn), ("etcd", etcd)):
        env = dict(clean_env(), ETCD_NAME="other")
        ready, log = verdict(binary, argv(base_flags()), env=env)
        check(not ready and 'conflicting environment variable "ETCD_NAME" is shadowed by '
              'corresponding command-line flag' in log, "%s: env beside flag:\n%s" %
              (kind, log[-600:]))
    # A bad value in a variable is refused like the flag's.
    # etcd: exit code 1 (an environment variable is checked after parsing).
    env = dict(clean_env(), ETCD_MAX_TXN_OPS="many")
    ready, log, rc = verdict_rc(cairn, argv({k: v for k, v in base_flags().items()}), env=env)
    check(not ready and "max-txn-ops" in log and rc == 1,
          "bad ETCD_MAX_TXN_OPS (exit code %s, want 1): %s" % (rc, log[-300:]))


# etcd.conf.yml.sample's keys and shape (maps for the TLS sides, a flow
# list for cipher suites, a block list for log outputs, empty values that
# mean the default), with this test's ports.
SAMPLE = """\
name: '{name}'
data-dir:
wal-dir:
snapshot-count: 10000
heartbeat-interval: 100
election-timeout: 1000
quota-backend-bytes: 0
listen-peer-urls: {peer}
listen-client-urls: {client}
max-snapshots: 5
max-wals: 5
cors:
initial-advertise-peer-urls: {peer}
advertise-client-urls: {client}
discovery:
discovery-fallback: 'proxy'
discovery-proxy:
discovery-srv:
initial-cluster:
initial-cluster-token: 'etcd-cluster'
initial-cluster-state: 'new'
strict-reconfig-check: false
enable-v2: false
enable-pprof: true
proxy: 'off'
proxy-failure-wait: 5000
proxy-refresh-interval: 30000
proxy-dial-timeout: 1000
proxy-write-timeout: 5000
proxy-read-timeout: 0
client-transport-security:
  cert-file:
  key-file:
  client-cert-auth: false
  trusted-ca-file:
  auto-tls: false
peer-transport-security:
  cert-file:
  key-file:
  client-cert-auth: false
  trusted-ca-file:
  auto-tls: false
self-signed-cert-validity: 1
log-level: debug
logger: zap
log-outputs:
  - stderr
force-new-cluster: false
auto-compaction-mode: periodic
auto-compaction-retention: "1"
cipher-suites: [
  TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
  TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
]
tls-min-version: 'TLS1.2'
"""


def test_config_file(cairn, etcd):
    for kind, binary in (("cairn", cairn), ("etcd", etcd)):
        c = "http://127.0.0.1:%d" % free_port()
        p = "http://127.0.0.1:%d" % free_port()
        text = SAMPLE.format(name="default", peer=p, client=c)
        if kind == "etcd":
            # etcd's empty initial-cluster is "default=http://localhost:2380"
            # whatever the file advertises; cairn's is name=advertised URLs.
            text = text.replace("initial-cluster:\n", "initial-cluster: default=%s\n" % p)
        path = tempfile.mktemp(prefix="cairn-it-flags-", suffix=".yml")
        with open(path, "w") as fh:
            fh.write(text)
        # Flags and variables beside the file are ignored (but a flag must
        # still parse): the member is "default" from the file.
        env = dict(clean_env(), ETCD_NAME="fromenv", ETCD_DATA_DIR="x")
        r = Run(binary, ["--config-file", path, "--name", "fromflag", "--max-txn-ops=3"], env=env)
        out = subprocess.run(["etcdctl", "--endpoints", c, "put", "k", "v"], capture_output=True,
                             timeout=20).stdout.decode() if r.ready else ""
        members = subprocess.run(["etcdctl", "--endpoints", c, "member", "list"],
                                 capture_output=True, timeout=20).stdout.decode() if r.ready else ""
        log = r.stop()
        check(out.strip() == "OK", "%s --config-file: put failed (%r):\n%s" % (kind, out,
                                                                              log[-1500:]))
        check(", default, " in members, "%s --config-file: flags beside the file must be "
              "ignored: %r" % (kind, members))
        if kind == "cairn":
            check("loading server configuration from" in log, "config file load not logged")
        os.unlink(path)
    # ETCD_CONFIG_FILE is read even though other variables are not; a bad
    # value in the file names the file and the key.
    path = tempfile.mktemp(prefix="cairn-it-flags-", suffix=".yml")
    c = "http://127.0.0.1:%d" % free_port()
    p = "http://127.0.0.1:%d" % free_port()
    with open(path, "w") as fh:
        fh.write("name: f\nlisten-client-urls: %s\nadvertise-client-urls: %s\n"
                 "listen-peer-urls: %s\ninitial-advertise-peer-urls: %s\n" % (c, c, p, p))
    ready, log = verdict(cairn, [], env=dict(clean_env(), ETCD_CONFIG_FILE=path))
    check(ready, "ETCD_CONFIG_FILE: did not start:\n" + log[-600:])
    with open(path, "w") as fh:
        fh.write("name: f\nmax-txn-ops: many\n")
    ready, log = verdict(cairn, ["--config-file=" + path])
    check(not ready and path in log and "max-txn-ops" in log, "bad key value: " + log[-400:])
    with open(path, "w") as fh:
        fh.write("name: [unclosed\n")
    ready, log = verdict(cairn, ["--config-file=" + path])
    check(not ready and path in log, "bad YAML: " + log[-400:])
    os.unlink(path)
    ready, log = verdict(cairn, ["--config-file=/nonexistent/c.yml"])
    check(not ready and "/nonexistent/c.yml" in log, "missing file: " + log[-400:])


def test_unix(cairn):
    c, p = free_port(), free_port()
    d = tempfile.mkdtemp(prefix="cairn-it-flags-unix-")
    args = ["--listen-client-urls", "unix://localhost:%d" % c,
            "--advertise-client-urls", "unix://localhost:%d" % c,
            "--listen-peer-urls", "unix://localhost:%d" % p,
            "--initial-advertise-peer-urls", "unix://localhost:%d" % p,
            "--data-dir", os.path.join(d, "data")]
    ep = "unix://localhost:%d" % c
    for round_ in range(2):  # the second start binds over the first's socket files
        log = open(os.path.join(d, "log"), "wb")
        proc = subprocess.Popen([cairn] + args, cwd=d, stdout=log, stderr=subprocess.STDOUT,
                                env=clean_env())
        try:
            deadline = time.time() + START_TIMEOUT
            ok = False
            while time.time() < deadline and proc.poll() is None and not ok:
                r = subprocess.run(["etcdctl", "--endpoints", ep, "put", "k%d" % round_, "v"],
                                   cwd=d, capture_output=True, timeout=20)
                ok = r.returncode == 0
                time.sleep(0.1)
            check(ok, "unix:// round %d: etcdctl put failed" % round_)
            got = subprocess.run(["etcdctl", "--endpoints", ep, "get", "k0", "--print-value-only"],
                                 cwd=d, capture_output=True, timeout=20).stdout.decode().strip()
            check(got == "v", "unix:// round %d: get k0 = %r" % (round_, got))
            m = subprocess.run(["etcdctl", "--endpoints", ep, "member", "list"], cwd=d,
                               capture_output=True, timeout=20).stdout.decode()
            check("unix://localhost:%d" % p in m, "unix:// peer URL in member list: %r" % m)
            check(os.path.exists(os.path.join(d, "localhost:%d" % p)), "no peer socket file")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
            log.close()
    shutil.rmtree(d, ignore_errors=True)
    # etcd refuses a unix URL without host:port; so does cairn.
    ready, log = verdict(cairn, ["--listen-client-urls", "unix:///tmp/x.sock"])
    check(not ready and "listen-client-urls" in log, "unix:///path: " + log[-300:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--etcd", default="etcd")
    a = ap.parse_args()
    cairn = os.path.abspath(a.cairn)
    for t in (lambda: test_walk(cairn, a.etcd), lambda: test_syntax(cairn, a.etcd),
              lambda: test_env(cairn, a.etcd), lambda: test_config_file(cairn, a.etcd),
              lambda: test_unix(cairn)):
        t()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
