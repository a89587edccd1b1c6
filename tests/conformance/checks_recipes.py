"""The v3lock and v3election services' conformance checks (suite "recipes"):
Lock, Unlock, Campaign, Proclaim, Leader, Observe and Resign over gRPC on
one server, beside etcd 3.4.

What etcd 3.4.23 answered (measured with these checks and with curl through
its gateway; server/etcd/recipes.c says how cairn does the same):

- Lock(name, lease) creates name/<lease in hex> with the lease and answers
  it once no key under name/ has a lower create revision; the header is the
  Txn's when the lock was free (or held by the same lease: locking twice
  with one lease answers the same key and header), else the header of the
  look that found the way clear. Lease 0 grants a lease of 60 s that is
  never kept alive. An unknown lease: Unknown "etcdserver: requested lease
  not found". Unlock is a plain delete (unknown key: the header; empty key:
  Unknown "etcdserver: key is not provided").
- A waiting Lock or Campaign whose call dies (deadline, cancel) deletes its
  key (Campaign: resigns).
- A waiting Lock whose own key goes (its lease revoked) goes on waiting and
  then answers the key as if held; cairn fails it at once (ledgered).
- Campaign answers {header of its Txn, leader {name, key, rev = the key's
  create revision, lease}}; a second Campaign with the same lease and
  another value proclaims it (a new revision) and answers the old header.
- Proclaim and Resign without a leader: Unknown "\\"leader\\" field must be
  provided"; Proclaim when the key's create revision is not the leader's:
  Unknown "election: not leader"; Resign then answers the header and
  deletes nothing. Leader with no key under the prefix: Unknown "election:
  no leader".
- Observe sends the leader (or waits for the first put under the prefix:
  header revision = its mod revision), each put of the leader's key, and,
  when it is deleted, the next leader with the header of the look.

Lease ids are shown as L1, L2 (granted here) and S1, S2 (granted by a Lock
or Campaign with lease 0), also inside keys (<L1>); revisions, LeaderKey's
rev included, relative to the check's start.
"""

import queue
import threading
import time

import grpc

from checks_kv import check

LOCK = "/v3lockpb.Lock/"
ELECT = "/v3electionpb.Election/"
WAIT = 0.4      # seconds a waiter is given to (wrongly) return
DONE = 5.0      # seconds a waiter that must return is given


def rcheck(name):
    return check("recipes", name)


def stub(c, path, resp):
    return c.server.channel.unary_unary(
        path, request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=c.M(resp).FromString)


def learn(c, key):
    """A key name/<hex> of a lease not granted here: remember it as S<n>."""
    try:
        lid = int(key.rsplit(b"/", 1)[1].decode(), 16)
    except (ValueError, IndexError):
        return
    if lid not in c.leases:
        n = 1 + len([v for v in c.leases.values() if v.startswith("S")])
        c.leases[lid] = "S%d" % n


def norm(c, x):
    """c.norm's answer with lease hex in keys and LeaderKey.rev made stable."""
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if k == "rev" and isinstance(v, int):
                out[k] = "r%+d" % (v - c.base)
            else:
                out[k] = norm(c, v)
        return out
    if isinstance(x, list):
        return [norm(c, v) for v in x]
    if isinstance(x, str):
        for lid, sym in sorted(c.leases.items(), key=lambda kv: -len("%x" % kv[0])):
            x = x.replace("/%x" % lid, "/<%s>" % sym)
        return x
    return x


def answer(c, fut):
    """A finished call's normalised answer (or its error)."""
    try:
        m = fut.result()
    except grpc.RpcError as e:
        return {"error": [e.code().name, e.details()]}
    for f in ("key",):
        if hasattr(m, f) and getattr(m, f):
            learn(c, getattr(m, f))
    if hasattr(m, "leader") and m.HasField("leader"):
        learn(c, m.leader.key)
    return norm(c, c.norm(m))


def call(c, path, resp, req, timeout=10):
    return answer(c, stub(c, path, resp).future(req, timeout=timeout))


def start(c, path, resp, req, timeout=10):
    return stub(c, path, resp).future(req, timeout=timeout)


def waits(fut, t=WAIT):
    """True if |fut| is still running after |t| seconds."""
    try:
        fut.result(timeout=t)
    except grpc.FutureTimeoutError:
        return True
    except grpc.RpcError:
        return False
    return False


def done_within(fut, t=DONE):
    try:
        fut.result(timeout=t)
    except grpc.FutureTimeoutError:
        return False
    except grpc.RpcError:
        return True
    return True


def deadline(x):
    """A call that ran out of time: etcd answers Unknown "context deadline
    exceeded" from its handler or the client's own Deadline Exceeded comes
    first, whichever wins the race; either is the deadline."""
    err = x.get("error") if isinstance(x, dict) else None
    if err and (err[0] == "DEADLINE_EXCEEDED" or err[1] == "context deadline exceeded"):
        return "deadline"
    return x


def lock(c, name, lease=0, **kw):
    return call(c, LOCK + "Lock", "v3lockpb.LockResponse",
                c.M("v3lockpb.LockRequest")(name=c.key(name), lease=lease), **kw)


def lock_start(c, name, lease=0, timeout=10):
    return start(c, LOCK + "Lock", "v3lockpb.LockResponse",
                 c.M("v3lockpb.LockRequest")(name=c.key(name), lease=lease), timeout)


def lock_key(c, name, lease):
    return c.key(name) + b"/%x" % lease


def unlock(c, key):
    return call(c, LOCK + "Unlock", "v3lockpb.UnlockResponse",
                c.M("v3lockpb.UnlockRequest")(key=key))


def keys_under(c, name):
    r = c.raw("/etcdserverpb.KV/Range",
              c.M("RangeRequest")(key=c.key(name) + b"/", range_end=c.key(name) + b"0"),
              "RangeResponse")
    return [norm(c, c.show(kv.key)) for kv in r.kvs]


def campaign_req(c, name, lease, value):
    return c.M("v3electionpb.CampaignRequest")(name=c.key(name), lease=lease,
                                               value=value.encode())


def campaign(c, name, lease, value, **kw):
    return call(c, ELECT + "Campaign", "v3electionpb.CampaignResponse",
                campaign_req(c, name, lease, value), **kw)


def campaign_start(c, name, lease, value, timeout=10):
    return start(c, ELECT + "Campaign", "v3electionpb.CampaignResponse",
                 campaign_req(c, name, lease, value), timeout)


def leader_key(c, name, lease, rev):
    return c.M("v3electionpb.LeaderKey")(name=c.key(name), key=lock_key(c, name, lease),
                                         rev=rev, lease=lease)


def leader(c, name):
    return call(c, ELECT + "Leader", "v3electionpb.LeaderResponse",
                c.M("v3electionpb.LeaderRequest")(name=c.key(name)))


def proclaim(c, lk, value):
    req = c.M("v3electionpb.ProclaimRequest")(value=value.encode())
    if lk is not None:
        req.leader.CopyFrom(lk)
    return call(c, ELECT + "Proclaim", "v3electionpb.ProclaimResponse", req)


def resign(c, lk):
    req = c.M("v3electionpb.ResignRequest")()
    if lk is not None:
        req.leader.CopyFrom(lk)
    return call(c, ELECT + "Resign", "v3electionpb.ResignResponse", req)


def create_rev(c, key):
    r = c.raw("/etcdserverpb.KV/Range", c.M("RangeRequest")(key=key), "RangeResponse")
    return r.kvs[0].create_revision if r.kvs else 0


class Observer:
    """An Observe stream read on a thread into a queue."""

    def __init__(self, c, name, timeout=20):
        self.c = c
        st = c.server.channel.unary_stream(
            ELECT + "Observe", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=c.M("v3electionpb.LeaderResponse").FromString)
        self.call = st(c.M("v3electionpb.LeaderRequest")(name=c.key(name)), timeout=timeout)
        self.q = queue.Queue()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        try:
            for m in self.call:
                self.q.put(m)
        except grpc.RpcError as e:
            self.q.put(e)
        self.q.put(None)

    def get(self, n, t=DONE):
        """The next |n| messages (fewer if they do not come within |t|)."""
        out = []
        end = time.monotonic() + t
        while len(out) < n:
            try:
                m = self.q.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if m is None:
                out.append("end")
                break
            if isinstance(m, grpc.RpcError):
                out.append({"error": [m.code().name, m.details()]})
                continue
            out.append(norm(self.c, self.c.norm(m)))
        return out

    def close(self):
        self.call.cancel()
        self.t.join(5)


# ==========================================================================
# Lock

@rcheck("recipes.lock.free_then_unlock")
def _(c):
    l1 = c.grant()
    out = {"lock": lock(c, "L", l1), "keys": keys_under(c, "L")}
    out["again"] = lock(c, "L", l1)
    out["unlock"] = unlock(c, lock_key(c, "L", l1))
    out["keys after"] = keys_under(c, "L")
    out["unlock again"] = unlock(c, lock_key(c, "L", l1))
    return out


@rcheck("recipes.lock.lease_zero")
def _(c):
    out = {"lock": lock(c, "L")}
    sess = [lid for lid, s in c.leases.items() if s == "S1"]
    if sess:
        r = c.raw("/etcdserverpb.Lease/LeaseTimeToLive",
                  c.M("LeaseTimeToLiveRequest")(ID=sess[0]), "LeaseTimeToLiveResponse")
        out["granted TTL"] = r.grantedTTL
        out["TTL within it"] = 0 < r.TTL <= r.grantedTTL
    out["keys"] = keys_under(c, "L")
    return out


@rcheck("recipes.lock.errors")
def _(c):
    return {"unknown lease": lock(c, "L", 123456789),
            "negative lease": lock(c, "L", -1),
            "unlock unknown": unlock(c, c.key("nope")),
            "unlock empty": unlock(c, b""),
            "keys": keys_under(c, "L")}


@rcheck("recipes.lock.contended_in_order")
def _(c):
    l1, l2, l3 = c.grant(), c.grant(), c.grant()
    out = {"A": lock(c, "L", l1)}
    b = lock_start(c, "L", l2)
    out["B waits"] = waits(b)
    cc = lock_start(c, "L", l3)
    out["C waits"] = waits(cc)
    out["keys"] = keys_under(c, "L")
    c.put("other", "x")
    out["B waits after an unrelated put"] = waits(b, 0.2)
    out["unlock A"] = unlock(c, lock_key(c, "L", l1))
    out["B done"] = done_within(b)
    out["B"] = answer(c, b)
    out["C still waits"] = waits(cc)
    out["unlock B"] = unlock(c, lock_key(c, "L", l2))
    out["C done"] = done_within(cc)
    out["C"] = answer(c, cc)
    return out


@rcheck("recipes.lock.waiter_deadline_deletes_its_key")
def _(c):
    l1, l2 = c.grant(), c.grant()
    out = {"A": lock(c, "L", l1)}
    b = lock_start(c, "L", l2, timeout=0.5)
    out["B"] = deadline(answer(c, b))
    time.sleep(0.3)
    out["keys"] = keys_under(c, "L")
    return out


@rcheck("recipes.lock.waiter_lease_revoked")
def _(c):
    l1, l2 = c.grant(), c.grant()
    out = {"A": lock(c, "L", l1)}
    b = lock_start(c, "L", l2)
    out["B waits"] = waits(b)
    out["revoke B's lease"] = c.revoke(l2)
    out["B waits after the revoke"] = waits(b)
    out["unlock A"] = unlock(c, lock_key(c, "L", l1))
    out["B done"] = done_within(b)
    out["B"] = answer(c, b)
    out["keys"] = keys_under(c, "L")
    return out


# ==========================================================================
# Election

@rcheck("recipes.election.leader_none")
def _(c):
    return {"leader": leader(c, "E"), "empty name": leader(c, "")}


@rcheck("recipes.election.campaign_proclaim_resign")
def _(c):
    l1 = c.grant()
    out = {"campaign": campaign(c, "E", l1, "v1")}
    rev = create_rev(c, lock_key(c, "E", l1))
    lk = leader_key(c, "E", l1, rev)
    out["leader"] = leader(c, "E")
    out["proclaim"] = proclaim(c, lk, "v2")
    out["leader after proclaim"] = leader(c, "E")
    out["campaign again, same value"] = campaign(c, "E", l1, "v2")
    out["campaign again, new value"] = campaign(c, "E", l1, "v3")
    out["leader after"] = leader(c, "E")
    out["resign"] = resign(c, lk)
    out["leader after resign"] = leader(c, "E")
    out["resign again"] = resign(c, lk)
    out["proclaim after resign"] = proclaim(c, lk, "v4")
    return out


@rcheck("recipes.election.errors")
def _(c):
    l1, l2 = c.grant(), c.grant()
    out = {"campaign": campaign(c, "E", l1, "v1")}
    rev = create_rev(c, lock_key(c, "E", l1))
    out["proclaim wrong rev"] = proclaim(c, leader_key(c, "E", l1, rev - 1), "x")
    out["proclaim other key"] = proclaim(c, leader_key(c, "E", l2, rev), "x")
    out["proclaim no leader"] = proclaim(c, None, "x")
    out["resign no leader"] = resign(c, None)
    out["resign wrong rev"] = resign(c, leader_key(c, "E", l1, rev + 1))
    out["campaign unknown lease"] = campaign(c, "E", 987654321, "v")
    out["leader"] = leader(c, "E")
    out["keys"] = keys_under(c, "E")
    return out


@rcheck("recipes.election.campaign_lease_zero")
def _(c):
    return {"campaign": campaign(c, "E", 0, "v"), "leader": leader(c, "E")}


@rcheck("recipes.election.contended")
def _(c):
    l1, l2 = c.grant(), c.grant()
    out = {"first": campaign(c, "E", l1, "one")}
    rev = create_rev(c, lock_key(c, "E", l1))
    second = campaign_start(c, "E", l2, "two")
    out["second waits"] = waits(second)
    out["leader"] = leader(c, "E")
    out["resign"] = resign(c, leader_key(c, "E", l1, rev))
    out["second done"] = done_within(second)
    out["second"] = answer(c, second)
    out["leader after"] = leader(c, "E")
    return out


@rcheck("recipes.election.campaign_deadline_resigns")
def _(c):
    l1, l2 = c.grant(), c.grant()
    out = {"first": campaign(c, "E", l1, "one")}
    second = campaign_start(c, "E", l2, "two", timeout=0.5)
    out["second"] = deadline(answer(c, second))
    time.sleep(0.3)
    out["keys"] = keys_under(c, "E")
    return out


@rcheck("recipes.election.campaign_lease_revoked")
def _(c):
    l1, l2 = c.grant(), c.grant()
    out = {"first": campaign(c, "E", l1, "one")}
    rev = create_rev(c, lock_key(c, "E", l1))
    second = campaign_start(c, "E", l2, "two")
    out["second waits"] = waits(second)
    out["revoke"] = c.revoke(l2)
    out["second waits after the revoke"] = waits(second)
    out["resign"] = resign(c, leader_key(c, "E", l1, rev))
    out["second done"] = done_within(second)
    out["second"] = answer(c, second)
    return out


@rcheck("recipes.election.observe_changes")
def _(c):
    l1, l2 = c.grant(), c.grant()
    o = Observer(c, "E")
    try:
        out = {"before any candidate": o.get(1, WAIT)}
        out["campaign"] = campaign(c, "E", l1, "one")
        out["seen"] = o.get(1)
        rev = create_rev(c, lock_key(c, "E", l1))
        lk = leader_key(c, "E", l1, rev)
        c.put("E-unrelated", "x")   # outside the prefix: not seen
        out["proclaim"] = proclaim(c, lk, "two")
        out["seen after proclaim"] = o.get(1)
        second = campaign_start(c, "E", l2, "three")
        out["second waits"] = waits(second)
        out["seen while second waits"] = o.get(1, WAIT)
        out["resign"] = resign(c, lk)
        out["second"] = answer(c, second) if done_within(second) else "still waiting"
        out["seen after resign"] = o.get(1)
        l2rev = create_rev(c, lock_key(c, "E", l2))
        out["resign second"] = resign(c, leader_key(c, "E", l2, l2rev))
        out["seen with nobody left"] = o.get(1, WAIT)
        c.put("E/x", "direct")
        out["seen: a put under the prefix"] = o.get(1)
    finally:
        o.close()
    return out


@rcheck("recipes.election.observe_existing_leader")
def _(c):
    l1 = c.grant()
    campaign(c, "E", l1, "one")
    o = Observer(c, "E")
    try:
        out = {"seen at once": o.get(1)}
        o2 = Observer(c, "E2")
        out["other name sees nothing"] = o2.get(1, WAIT)
        o2.close()
    finally:
        o.close()
    return out


def lease_count(c):
    r = c.raw("/etcdserverpb.Lease/LeaseLeases", c.M("LeaseLeasesRequest")(),
              "LeaseLeasesResponse")
    return len(r.leases)


@rcheck("recipes.election.proclaim_lease_zero")
def _(c):
    l1 = c.grant()
    out = {"campaign": campaign(c, "E", l1, "one")}
    rev = create_rev(c, lock_key(c, "E", l1))
    lk = leader_key(c, "E", l1, rev)
    lk.lease = 0
    before = lease_count(c)
    out["proclaim"] = proclaim(c, lk, "two")
    out["leases granted"] = lease_count(c) - before
    r = c.raw("/etcdserverpb.KV/Range", c.M("RangeRequest")(key=lock_key(c, "E", l1)),
              "RangeResponse")
    out["the key's lease is a new one"] = bool(r.kvs) and r.kvs[0].lease not in (0, l1)
    out["its TTL"] = c.raw("/etcdserverpb.Lease/LeaseTimeToLive",
                           c.M("LeaseTimeToLiveRequest")(ID=r.kvs[0].lease),
                           "LeaseTimeToLiveResponse").grantedTTL if r.kvs else None
    return out


@rcheck("recipes.election.resign_lease_zero")
def _(c):
    l1 = c.grant()
    out = {"campaign": campaign(c, "E", l1, "one")}
    rev = create_rev(c, lock_key(c, "E", l1))
    lk = leader_key(c, "E", l1, rev)
    lk.lease = 0
    before = lease_count(c)
    out["resign"] = resign(c, lk)
    out["leases granted"] = lease_count(c) - before
    out["leader"] = leader(c, "E")
    return out

