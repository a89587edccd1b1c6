#!/usr/bin/python3
"""Differential conformance harness: etcd 3.4 beside cairn.

The same scripted KV operations (Range, Put, DeleteRange, Txn, Compact and
the lease field) run against a fresh etcd and a fresh cairn, each started by
this script on 127.0.0.1 with free ports reserved for the run and a
temporary data dir.
Every check yields a normalised, JSON-able result: revisions relative to the
revision the check started at (or to zero for the checks on a fresh store),
response headers without cluster/member ids and raft term, lease ids replaced
by symbols, errors as (gRPC status code name, message). The two results of a
check are compared; a difference fails the run unless the ledger
(ledger.json beside this file) accepts it with a reason, and a ledger entry
whose check no longer differs fails the run too, so the ledger stays honest.

The expected behaviour is never written here: it is whatever etcd answers.
The checks were written by running them against etcd first (--target etcd
--record FILE) and reading what it said; ETCD-MEASURED.md is the summary.

Message classes are generated at run time from the repository's proto/ with
protoc into a temporary directory; RPCs are made with grpc's generic
unary_unary, so no service stubs are needed.

Modes: default (etcd vs cairn); --target etcd (etcd vs the committed
recording etcd-recorded.json: the checks run and are deterministic, and
proto/ is wire-compatible); --target cairn (cairn vs the recording, no etcd
needed); --record FILE (write etcd's answers); --sanitizer-only (fail only
on ASan/UBSan reports in cairn's log). Each suite runs on its own fresh
server (a server that crashes or hangs is blamed on the check and replaced);
every RPC has a timeout, each target a deadline, the whole run a hard limit,
and the servers are killed on every exit path (and die with the harness).

A ledger entry names a check and a reason, and may pin cairn's answer
("cairn"); it never excuses a harness failure (crash, no start, timeout).
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

try:
    import grpc
except ImportError:  # pyenv or venv python without Debian's python3-grpcio
    if (not os.environ.get("CAIRN_HARNESS_REEXEC")
            and os.path.exists("/usr/bin/python3")
            and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3")):
        os.environ["CAIRN_HARNESS_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
import ports  # noqa: E402

RPC_TIMEOUT = 10.0          # seconds, every single RPC
START_TIMEOUT = 20.0        # seconds for a server to answer its first Range
HARD_TIMEOUT = 170          # seconds for the whole run (ctest allows 180)
# Checks not begun by a target's deadline are reported as not run, so that a
# hanging server still leaves time for the other target and the summary.
T_START = time.monotonic()

ETCD_PROTO_ROOT = "/usr/share/gocode/src/go.etcd.io/etcd"


class HarnessError(Exception):
    pass


class HardTimeout(BaseException):
    """Raised by SIGALRM; not an Exception, so no check can swallow it."""


# --------------------------------------------------------------------------
# Protobuf modules, generated at run time

def _strip_gogo(text):
    text = re.sub(r'import "gogoproto/gogo.proto";', "", text)
    text = re.sub(r'import "google/api/annotations.proto";', "", text)
    text = re.sub(r"option \(gogoproto\.[^;]*;", "", text)
    text = re.sub(r"option \(google\.api\.http\) = \{(?:[^{}]|\{[^{}]*\})*\};", "", text)
    text = re.sub(r"\[\(gogoproto[^\]]*\]", "", text)
    return text


def etcd_proto_copy(dst):
    """A stripped temporary copy of etcd's own protos (probing only)."""
    for rel in ("etcdserver/etcdserverpb/rpc.proto", "mvcc/mvccpb/kv.proto",
                "auth/authpb/auth.proto"):
        src = os.path.join(ETCD_PROTO_ROOT, rel)
        out = os.path.join(dst, "etcd", rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(src) as f:
            text = _strip_gogo(f.read())
        with open(out, "w") as f:
            f.write(text)
    return dst


def load_messages(proto_dir, workdir):
    """protoc every .proto under proto_dir; return {full name: class}."""
    files = []
    for root, _dirs, names in os.walk(proto_dir):
        for n in names:
            if n.endswith(".proto"):
                files.append(os.path.relpath(os.path.join(root, n), proto_dir))
    if not files:
        raise HarnessError("no .proto files under %s" % proto_dir)
    out = os.path.join(workdir, "pb")
    os.makedirs(out, exist_ok=True)
    cmd = ["protoc", "--python_out=" + out, "-I", proto_dir,
           "-I", "/usr/include"] + sorted(files)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise HarnessError("protoc failed: %s\n%s" % (" ".join(cmd), r.stderr))
    sys.path.insert(0, out)
    import importlib
    classes = {}
    for f in sorted(files):
        mod_name = f[:-len(".proto")].replace("/", ".").replace("-", "_") + "_pb2"
        mod = importlib.import_module(mod_name)
        for name in mod.DESCRIPTOR.message_types_by_name:
            cls = getattr(mod, name)
            classes[cls.DESCRIPTOR.full_name] = cls
    for need in ("etcdserverpb.RangeRequest", "etcdserverpb.TxnRequest",
                 "etcdserverpb.CompactionRequest", "mvccpb.KeyValue"):
        if need not in classes:
            raise HarnessError("proto files in %s lack %s" % (proto_dir, need))
    return classes


# --------------------------------------------------------------------------
# Servers

def free_port():
    """A port reserved for this run (tests/integration/ports.py), or HarnessError."""
    try:
        return ports.free_port()
    except RuntimeError as e:
        raise HarnessError(str(e))


# A server must die with the harness even if the harness is SIGKILLed: it is
# started through setpriv --pdeathsig KILL. Not a preexec_fn: that forces a
# real fork(), whose gRPC fork handlers deadlock or abort once a server has
# died mid-call; without one, subprocess uses vfork and skips them.
SETPRIV = ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--"] \
    if os.access("/usr/bin/setpriv", os.X_OK) else []


class Server:
    """One etcd or cairn process, started with etcd's flag names."""

    def __init__(self, kind, binary, workdir, extra_args=()):
        self.kind = kind
        self.binary = os.path.abspath(binary)
        self.extra_args = list(extra_args)
        self.dir = tempfile.mkdtemp(prefix=kind + "-", dir=workdir)
        self.proc = None
        self.channel = None
        self.hung = False
        self.log_path = os.path.join(self.dir, "server.log")
        self.log = None

    def start(self, msgs, limit=None):
        cport, pport = free_port(), free_port()
        curl = "http://127.0.0.1:%d" % cport
        purl = "http://127.0.0.1:%d" % pport
        self.target = "127.0.0.1:%d" % cport
        self.cport = cport
        self.args = [self.binary, "--name", "default",
                     "--data-dir", os.path.join(self.dir, "data"),
                     "--listen-client-urls", curl, "--advertise-client-urls", curl,
                     "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                     "--initial-cluster", "default=" + purl] + self.extra_args
        self._spawn(msgs, limit)

    def restart(self, msgs, kill=False):
        """Stop (SIGTERM, or SIGKILL when kill) and start again on the same
        data dir and ports."""
        self.stop(kill=kill)
        self._spawn(msgs)

    def _spawn(self, msgs, limit=None):
        limit = START_TIMEOUT if limit is None else max(1.0, min(limit, START_TIMEOUT))
        args = self.args
        cport = self.cport
        self.log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(SETPRIV + args, stdout=self.log,
                                         stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.dir)
        except OSError as e:
            raise HarnessError("cannot start %s: %s" % (self.binary, e))
        # Wait for the port first: a gRPC channel that meets a refused
        # connection backs off for seconds before it tries again.
        deadline = time.monotonic() + limit
        while True:
            if self.proc.poll() is not None:
                raise HarnessError("%s exited with %s at start; log:\n%s"
                                   % (self.kind, self.proc.returncode, self.log_tail()))
            try:
                socket.create_connection(("127.0.0.1", cport), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise HarnessError("%s did not listen on %s within %.0fs; log:\n%s"
                                       % (self.kind, self.target, limit,
                                          self.log_tail()))
                time.sleep(0.05)
        self.channel = grpc.insecure_channel(self.target, options=[
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500)])
        rng = self.channel.unary_unary(
            "/etcdserverpb.KV/Range",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=msgs["etcdserverpb.RangeResponse"].FromString)
        deadline = time.monotonic() + limit
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HarnessError("%s exited with %s at start; log:\n%s"
                                   % (self.kind, self.proc.returncode, self.log_tail()))
            try:
                rng(msgs["etcdserverpb.RangeRequest"](key=b"\x00"), timeout=1.0)
                return
            except grpc.RpcError as e:
                last = e
                time.sleep(0.1)
        raise HarnessError("%s did not answer Range within %.0fs (%s); log:\n%s"
                           % (self.kind, limit, last, self.log_tail()))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n=30):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError:
            return ""

    SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                       "runtime error:", "WARNING: ThreadSanitizer")

    def sanitizer_report(self):
        """The first sanitizer report in the server's log, or None."""
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return None
        for i, line in enumerate(lines):
            if any(m in line for m in self.SANITIZER_MARKS):
                return "\n".join(lines[i:i + 40])
        return None

    def stop(self, kill=False):
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc is not None and self.proc.poll() is None and kill:
            self.proc.kill()
            self.proc.wait(timeout=5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.log is not None:
            self.log.close()
            self.log = None


# --------------------------------------------------------------------------
# The check context: builds requests, calls RPCs, normalises answers

REV_FIELDS = {"revision", "create_revision", "mod_revision", "compact_revision"}
HEADER_DROP = {"cluster_id", "member_id", "raft_term"}
from checks_kv import PREFIX, Abs  # noqa: E402  (range_end marker; absolute revision)


def prefix_end(key):
    b = bytearray(key)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[:i + 1])
    return b"\x00"


class Ctx:
    def __init__(self, server, msgs, check_name, base, deadline=None):
        self.server = server
        self.deadline = deadline
        self.msgs = msgs
        self.ns = ("/" + check_name + "/").encode()
        self.base = base
        self.leases = {}
        self._stubs = {}

    # ---- plumbing
    def M(self, name):
        return self.msgs[name if "." in name else "etcdserverpb." + name]

    def _call(self, path, req, resp_name):
        stub = self._stubs.get(path)
        if stub is None:
            stub = self.server.channel.unary_unary(
                path, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=self.M(resp_name).FromString)
            self._stubs[path] = stub
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise HarnessError("out of time")
        try:
            return stub(req, timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.server.hung = True     # restarted before the next check
            raise

    def call(self, path, req, resp_name):
        """The normalised answer, or {'error': [code, message]}."""
        try:
            return self.norm(self._call(path, req, resp_name))
        except grpc.RpcError as e:
            return err(e)

    def raw(self, path, req, resp_name):
        return self._call(path, req, resp_name)

    def key(self, k):
        if isinstance(k, bytes):
            return k
        return self.ns + k.encode()

    def end(self, key, end):
        if end is None:
            return b""
        if end is PREFIX:
            return prefix_end(key)
        return self.key(end)

    def absrev(self, rel):
        return 0 if rel is None else self.base + rel

    # ---- normalisation
    def norm(self, m):
        out = {}
        for fd, v in m.ListFields():
            name = fd.name
            if m.DESCRIPTOR.name == "ResponseHeader" and name in HEADER_DROP:
                continue
            out[name] = self._norm_field(fd, name, v)
        if m.DESCRIPTOR.name == "TxnResponse":
            out["succeeded"] = bool(m.succeeded)
        return out

    def _norm_field(self, fd, name, v):
        if fd.label == fd.LABEL_REPEATED:
            return [self._norm_value(fd, name, x) for x in v]
        return self._norm_value(fd, name, v)

    def _norm_value(self, fd, name, v):
        if fd.type == fd.TYPE_MESSAGE:
            return self.norm(v)
        if fd.type == fd.TYPE_BYTES:
            return self.show(v)
        if fd.type == fd.TYPE_ENUM:
            ev = fd.enum_type.values_by_number.get(v)
            return ev.name if ev else v
        if name in REV_FIELDS and isinstance(v, int):
            return "r%+d" % (v - self.base)
        if name in ("lease", "ID") and isinstance(v, int):
            return self.leases.get(v, "lease?%s" % ("0" if v == 0 else "unknown"))
        return v

    def show(self, b):
        if len(b) > 64:
            return "<%d bytes sha256:%s>" % (len(b), hashlib.sha256(b).hexdigest()[:16])
        if b.startswith(self.ns):
            b = b[len(self.ns):]
            prefix = "~"
        else:
            prefix = ""
        return prefix + b.decode("utf-8", "backslashreplace").replace("\x00", "\\0")

    # ---- requests
    def range_req(self, key, end=None, rev=None, limit=0, sort_order=None,
                  sort_target=None, serializable=False, keys_only=False,
                  count_only=False, min_mod=None, max_mod=None, min_create=None,
                  max_create=None, absrev=None):
        k = self.key(key)
        R = self.M("RangeRequest")
        r = R(key=k, range_end=self.end(k, end), limit=limit,
              serializable=serializable, keys_only=keys_only, count_only=count_only)
        if absrev is not None:
            r.revision = absrev
        elif rev is not None:
            r.revision = self.absrev(rev)
        if sort_order is not None:
            r.sort_order = R.SortOrder.Value(sort_order)
        if sort_target is not None:
            r.sort_target = R.SortTarget.Value(sort_target)
        for field, rel in (("min_mod_revision", min_mod), ("max_mod_revision", max_mod),
                           ("min_create_revision", min_create),
                           ("max_create_revision", max_create)):
            if rel is not None:
                setattr(r, field, self.absrev(rel))
        return r

    def put_req(self, key, value="", lease=None, prev_kv=False, ignore_value=False,
                ignore_lease=False):
        v = value.encode() if isinstance(value, str) else value
        r = self.M("PutRequest")(key=self.key(key), value=v, prev_kv=prev_kv,
                                 ignore_value=ignore_value, ignore_lease=ignore_lease)
        if lease is not None:
            r.lease = lease
        return r

    def del_req(self, key, end=None, prev_kv=False):
        k = self.key(key)
        return self.M("DeleteRangeRequest")(key=k, range_end=self.end(k, end),
                                            prev_kv=prev_kv)

    def txn_req(self, compare=(), success=(), failure=()):
        return self.M("TxnRequest")(compare=list(compare), success=list(success),
                                    failure=list(failure))

    # ---- ops inside a txn
    def op_range(self, key, **kw):
        return self.M("RequestOp")(request_range=self.range_req(key, **kw))

    def op_put(self, key, value="", **kw):
        return self.M("RequestOp")(request_put=self.put_req(key, value, **kw))

    def op_del(self, key, **kw):
        return self.M("RequestOp")(request_delete_range=self.del_req(key, **kw))

    def op_txn(self, compare=(), success=(), failure=()):
        return self.M("RequestOp")(request_txn=self.txn_req(compare, success, failure))

    def cmp(self, key, target, result, value, end=None):
        """value: version int, relative revision for CREATE/MOD (Abs(n) for an
        absolute one), str for VALUE, lease id for LEASE."""
        C = self.M("Compare")
        k = self.key(key)
        c = C(key=k, range_end=self.end(k, end),
              target=C.CompareTarget.Value(target),
              result=C.CompareResult.Value(result))
        if isinstance(value, Abs):
            setattr(c, {"VERSION": "version", "CREATE": "create_revision",
                        "MOD": "mod_revision", "LEASE": "lease"}[target], int(value))
        elif target == "VERSION":
            c.version = value
        elif target == "CREATE":
            c.create_revision = self.absrev(value)
        elif target == "MOD":
            c.mod_revision = self.absrev(value)
        elif target == "VALUE":
            c.value = value.encode() if isinstance(value, str) else value
        elif target == "LEASE":
            c.lease = value
        return c

    # ---- RPCs
    def range(self, key, **kw):
        return self.call("/etcdserverpb.KV/Range", self.range_req(key, **kw), "RangeResponse")

    def put(self, key, value="", **kw):
        return self.call("/etcdserverpb.KV/Put", self.put_req(key, value, **kw), "PutResponse")

    def delete(self, key, **kw):
        return self.call("/etcdserverpb.KV/DeleteRange", self.del_req(key, **kw),
                         "DeleteRangeResponse")

    def txn(self, compare=(), success=(), failure=()):
        return self.call("/etcdserverpb.KV/Txn", self.txn_req(compare, success, failure),
                         "TxnResponse")

    def compact(self, rel=None, physical=False, absrev=None):
        rev = absrev if absrev is not None else self.absrev(rel)
        return self.call("/etcdserverpb.KV/Compact",
                         self.M("CompactionRequest")(revision=rev, physical=physical),
                         "CompactionResponse")

    def restart(self, kill=False):
        """Restart the server on its data dir (SIGTERM, or SIGKILL)."""
        self.server.restart(self.msgs, kill=kill)
        self._stubs = {}

    def rev(self):
        """Current revision, relative ('r+N'), by a Range of a missing key."""
        return self.range(b"\x00rev-probe")["header"]["revision"]

    def absrev_now(self):
        r = self.raw("/etcdserverpb.KV/Range",
                     self.M("RangeRequest")(key=b"\x00rev-probe"), "RangeResponse")
        return r.header.revision

    def status(self):
        """Maintenance.Status, raw (the check picks what it compares)."""
        return self.raw("/etcdserverpb.Maintenance/Status",
                        self.M("StatusRequest")(), "StatusResponse")

    def grant(self, ttl=600):
        """Grant a lease; it is shown as L1, L2, ... in results."""
        r = self.raw("/etcdserverpb.Lease/LeaseGrant",
                     self.M("LeaseGrantRequest")(TTL=ttl), "LeaseGrantResponse")
        if r.error:
            raise HarnessError("LeaseGrant: %s" % r.error)
        self.leases[r.ID] = "L%d" % (len(self.leases) + 1)
        return r.ID

    def revoke(self, lease_id):
        return self.call("/etcdserverpb.Lease/LeaseRevoke",
                         self.M("LeaseRevokeRequest")(ID=lease_id), "LeaseRevokeResponse")


def err(e):
    code = e.code()
    return {"error": [code.name if code else "UNKNOWN", e.details()]}


# --------------------------------------------------------------------------
# The checks (checks_kv.py registers them, in order, into CHECKS)

from checks_kv import CHECKS, SUITES  # noqa: E402
import checks_watch  # noqa: E402,F401  (registers the suite "watch")
import checks_lease  # noqa: E402,F401  (registers the suite "lease")
import checks_member  # noqa: E402,F401  (registers the suite "member")
import checks_recipes  # noqa: E402,F401  (registers the suite "recipes")

# Suites run only when named with --suite (cairn does not serve Watch and
# Lease yet). Remove a name here to run that suite by default.
OPT_IN_SUITES = {"watch", "lease", "member", "recipes"}


# --------------------------------------------------------------------------
# Running

def run_target(kind, binary, msgs, workdir, selected, extra_args, deadline):
    """Run the selected checks on fresh servers of one kind; {name: result}.

    Each suite gets a new server. A server that dies during a check is
    blamed on that check, and a new one is started for the rest of the
    suite, so one crash does not hide every later answer."""
    results = {}
    problems = []

    def retire(srv):
        srv.stop()
        rep = srv.sanitizer_report() if kind == "cairn" else None
        if rep:
            problems.append("%s (suite %s): sanitizer report:\n%s" % (kind, suite, rep))

    gave_up = False     # a server that twice failed to start: not again
    for suite in SUITES:
        todo = [(n, f) for s, n, f in CHECKS if s == suite and n in selected]
        srv = None
        try:
            for n, f in todo:
                if time.monotonic() > deadline:
                    results[n] = {"harness": "not run: out of time"}
                    continue
                if gave_up:
                    results[n] = {"harness": "server did not start"}
                    continue
                if srv is None or not srv.alive() or srv.hung:
                    if srv is not None:
                        retire(srv)
                    # Twice: a port picked as free may be taken by a
                    # parallel test before the server binds it.
                    for attempt in (1, 2):
                        srv = Server(kind, binary, workdir, extra_args)
                        try:
                            srv.start(msgs, deadline - time.monotonic())
                            break
                        except HarnessError as e:
                            print("  %s: suite %s, attempt %d: %s" % (kind, suite, attempt, e),
                                  file=sys.stderr)
                            retire(srv)
                            srv = None
                    if srv is None:
                        results[n] = {"harness": "server did not start"}
                        gave_up = True
                        continue
                try:
                    # The "fresh" suite keeps absolute revisions: base 0.
                    base = 0 if suite == "fresh" else \
                        Ctx(srv, msgs, n, 0, deadline).absrev_now()
                    results[n] = f(Ctx(srv, msgs, n, base, deadline))
                except grpc.RpcError as e:
                    results[n] = {"harness": "unexpected rpc error", "error": err(e)["error"]}
                except Exception as e:  # a check that crashes is a result too
                    results[n] = {"harness": "check raised %s: %s" % (type(e).__name__, e)}
                    if os.environ.get("HARNESS_DEBUG"):
                        traceback.print_exc()
                if not srv.alive():
                    time.sleep(0.1)
                    results[n] = {"harness": "server exited during the check (%s)"
                                  % srv.proc.returncode}
                    print("  %s exited during %s; log tail:\n%s"
                          % (kind, n, srv.log_tail()), file=sys.stderr)
        finally:
            if srv is not None:
                retire(srv)
    return results, problems


def canon(x):
    return json.dumps(x, sort_keys=True)


def load_ledger(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        entries = json.load(f)
    ledger = {}
    for e in entries:
        if not e.get("check") or not e.get("reason"):
            raise HarnessError("ledger entry without check or reason: %r" % e)
        ledger[e["check"]] = e["reason"]
    return ledger


def load_ledger_pins(path):
    """{check: cairn's result} for the ledger entries that pin it ("cairn")."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {e["check"]: e["cairn"] for e in json.load(f) if "cairn" in e}


def clip(text, n=1200):
    return text if len(text) <= n else text[:n] + " ... (%d chars)" % len(text)


def first_diff(a, b, path=""):
    """Where two normalised results first differ: (path, a part, b part)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return (path + "." + k, a.get(k, "<absent>"), b.get(k, "<absent>"))
            d = first_diff(a[k], b[k], path + "." + k)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_diff(x, y, "%s[%d]" % (path, i))
            if d:
                return d
        if len(a) != len(b):
            return (path + ".length", len(a), len(b))
        return None
    return None if canon(a) == canon(b) else (path or "(top)", a, b)


def compare(left_name, left, right_name, right, ledger, names, all_names, pins=None):
    """Print the summary; True when every check matched or is ledgered and
    every ledger entry still deviates (and names an existing check). A
    ledger entry never excuses a harness failure (a crash, a server that did
    not start, a check that raised), and one that pins cairn's answer
    excuses only that answer."""
    pins = pins or {}
    matched, ledgered, failures = 0, [], []
    for n in names:
        a, b = left.get(n), right.get(n)
        same = canon(a) == canon(b)
        if n in ledger:
            if same:
                failures.append((n, "ledgered deviation no longer deviates "
                                    "(remove it from the ledger): " + ledger[n], a, b))
            elif isinstance(b, dict) and "harness" in b:
                failures.append((n, "deviation (a harness failure; the ledger does "
                                    "not excuse it)", a, b))
            elif n in pins and canon(pins[n]) != canon(b):
                failures.append((n, "ledgered deviation changed: cairn's answer is not "
                                    "the pinned one %s" % clip(canon(pins[n])), a, b))
            else:
                ledgered.append(n)
        elif same:
            matched += 1
        else:
            failures.append((n, "deviation", a, b))
    for n in ledger:
        if n not in all_names:
            failures.append((n, "ledger names a check that does not exist", None, None))
    print("\n%d checks, %d matched, %d ledgered deviations, %d failures"
          % (len(names), matched, len(ledgered), len(failures)))
    for n in ledgered:
        print("  ledgered: %s: %s" % (n, ledger[n]))
    for n, why, a, b in failures:
        print("\nFAIL %s: %s" % (n, why))
        print("  %-5s: %s" % (left_name, clip(canon(a))))
        print("  %-5s: %s" % (right_name, clip(canon(b))))
        d = first_diff(a, b) if why.startswith("deviation") else None
        if d:
            print("  first difference at %s: %s %s, %s %s"
                  % (d[0], left_name, clip(canon(d[1])), right_name, clip(canon(d[2]))))
    return not failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--etcd", default="/usr/bin/etcd")
    ap.add_argument("--cairn", default=os.path.join(REPO, "build", "cairn"))
    ap.add_argument("--target", choices=("both", "etcd", "cairn"), default="both",
                    help="both (default): etcd vs cairn; etcd: etcd only, compared "
                         "with the recording if one exists; cairn: cairn vs the recording")
    ap.add_argument("--record", metavar="FILE", help="write etcd's results to FILE")
    ap.add_argument("--recording", default=os.path.join(HERE, "etcd-recorded.json"),
                    help="etcd's recorded results (for --target etcd/cairn)")
    ap.add_argument("--ledger", default=os.path.join(HERE, "ledger.json"))
    ap.add_argument("--proto", default=os.path.join(REPO, "proto"),
                    help="directory of .proto files (default: the repository's proto/)")
    ap.add_argument("--etcd-protos", action="store_true",
                    help="use a stripped copy of etcd's own protos (probing only)")
    ap.add_argument("--only", metavar="REGEX", help="run only checks whose name matches")
    ap.add_argument("--suite", metavar="LIST",
                    help="comma-separated suites to run, or 'all' (default: every "
                         "suite but the opt-in ones: %s)" % ",".join(sorted(OPT_IN_SUITES)))
    ap.add_argument("--list", action="store_true", help="list the checks and exit")
    ap.add_argument("--show", action="store_true", help="print every result")
    ap.add_argument("--sanitizer-only", action="store_true",
                    help="fail only on sanitizer reports in the servers' logs "
                         "(for a cairn built with ASan/UBSan; deviations are "
                         "conformance_kv's business)")
    ap.add_argument("--cairn-arg", action="append", default=[],
                    help="extra argument for cairn (repeatable)")
    args = ap.parse_args()

    if args.list:
        for s, n, _f in CHECKS:
            print("%-8s %s" % (s, n))
        print("%d checks" % len(CHECKS))
        return 0

    all_names = [n for _s, n, _f in CHECKS]
    if args.suite is None:
        suites = set(SUITES) - OPT_IN_SUITES
    elif args.suite == "all":
        suites = set(SUITES)
    else:
        suites = set(args.suite.split(","))
        if suites - set(SUITES):
            raise SystemExit("unknown suite(s): %s (known: %s)"
                             % (",".join(sorted(suites - set(SUITES))), ",".join(SUITES)))
    names = [n for s, n, _f in CHECKS
             if s in suites and (not args.only or re.search(args.only, n))]
    selected = set(names)

    def on_alarm(_sig, _frm):
        raise HardTimeout()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_alarm)   # ctest's timeout: still clean up
    signal.alarm(HARD_TIMEOUT)

    # tmpfs when there is one: fsync is free there, and the run is about
    # behaviour, not durability.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    workdir = tempfile.mkdtemp(prefix="cairn-conformance-", dir=shm)
    try:
        if args.etcd_protos:
            proto_dir = etcd_proto_copy(os.path.join(workdir, "etcdproto"))
        else:
            proto_dir = args.proto
            if not os.path.isdir(proto_dir):
                raise HarnessError("no proto directory %s (use --etcd-protos to probe)"
                                   % proto_dir)
        msgs = load_messages(proto_dir, workdir)
        t0 = time.monotonic()
        etcd_res = cairn_res = None
        problems = []
        if args.target in ("both", "etcd"):
            if not os.access(args.etcd, os.X_OK):
                raise HarnessError("etcd binary %s not found" % args.etcd)
            budget = (HARD_TIMEOUT - 20) / (2 if args.target == "both" else 1)
            etcd_res, probs = run_target("etcd", args.etcd, msgs, workdir, selected, [],
                                         T_START + budget)
            problems += probs
            if args.record:
                # One check per line: greppable, and diffs stay per check.
                with open(args.record, "w") as f:
                    f.write("{\n" + ",\n".join(
                        "%s: %s" % (json.dumps(n), json.dumps(etcd_res[n], sort_keys=True))
                        for _s, n, _f in CHECKS if n in etcd_res) + "\n}\n")
        if args.target in ("both", "cairn"):
            if not os.access(args.cairn, os.X_OK):
                raise HarnessError("cairn binary %s not found" % args.cairn)
            cairn_res, probs = run_target("cairn", args.cairn, msgs, workdir, selected,
                                          args.cairn_arg, T_START + HARD_TIMEOUT - 20)
            problems += probs
        if args.show:
            for _s, n, _f in CHECKS:
                if n in selected:
                    print("%s\n  etcd : %s\n  cairn: %s" % (
                        n, canon(etcd_res.get(n)) if etcd_res else "-",
                        canon(cairn_res.get(n)) if cairn_res else "-"))
        print("ran in %.1fs" % (time.monotonic() - t0))
        for p in problems:
            print("\nFAIL server problem: %s" % p)
        if args.sanitizer_only:
            print("%d sanitizer reports" % len(problems))
            return 1 if problems else 0
        if args.target == "both":
            ok = compare("etcd", etcd_res, "cairn", cairn_res,
                         load_ledger(args.ledger), names, all_names,
                         load_ledger_pins(args.ledger))
        else:
            if not os.path.exists(args.recording):
                print("no recording at %s: nothing to compare with" % args.recording)
                return 0
            recorded = {}
            if args.recording == os.path.join(HERE, "etcd-recorded.json"):
                # The opt-in suites keep their recordings beside it
                # (etcd-recorded-<suites>.json); the main file wins.
                for extra in sorted(os.listdir(HERE)):
                    if extra.startswith("etcd-recorded-") and extra.endswith(".json"):
                        with open(os.path.join(HERE, extra)) as f:
                            recorded.update(json.load(f))
            with open(args.recording) as f:
                recorded.update(json.load(f))
            live = etcd_res if args.target == "etcd" else cairn_res
            ledger = load_ledger(args.ledger) if args.target == "cairn" else {}
            pins = load_ledger_pins(args.ledger) if args.target == "cairn" else {}
            ok = compare("rec", recorded, args.target, live, ledger, names, all_names, pins)
        return 0 if ok and not problems else 1
    except HarnessError as e:
        print("harness error: %s" % e, file=sys.stderr)
        return 2
    except HardTimeout:
        print("harness error: hard timeout of %ds reached" % HARD_TIMEOUT, file=sys.stderr)
        return 2
    finally:
        signal.alarm(0)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
