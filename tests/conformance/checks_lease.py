"""The Lease conformance checks (suite "lease"): LeaseGrant, LeaseRevoke,
LeaseKeepAlive (a bidirectional stream), LeaseTimeToLive, LeaseLeases, keys
under leases, expiry, and what a restart does to a lease, measured against
etcd 3.4.

Lease ids are shown as L1, L2, ... (ids the server chose) or X1, X2, ...
(ids the check chose; each check derives its own from its name, so checks
never collide on the one server the suite shares). Remaining TTLs depend on
the clock, so they are shown against an expected window: "~N" when the
value is in [N-2, N], else the raw number with "!". LeaseLeases lists every
lease on the server; a check shows only its own.

Timing: expiry is waited for with bounded polls (etcd revokes an expired
lease within about half a second of its deadline); every lease that holds
keys is revoked or expired before its check ends, so no later check sees a
stray revision. No expected value is written here: etcd's answers are the
expectation (WATCH-LEASE-MEASURED.md summarises them). Opt-in: the harness
runs this suite only with --suite lease (or all) until cairn serves Lease.
"""

import time
import zlib

import grpc

from checks_kv import PREFIX
from checks_watch import Bidi, wcheck, created

EXPIRY_WAIT = 10.0   # seconds a short lease may take to expire, at most


def lcheck(name):
    return wcheck(name, suite="lease")


def xid(c, n):
    """The n-th id this check chooses itself (shown as X<n>)."""
    lid = ((zlib.crc32(c.ns) & 0x7fffff) << 16) | n
    c.leases[lid] = "X%d" % n
    return lid


def lgrant(c, ttl, lease_id=0):
    """LeaseGrant, normalised; a new server-chosen id becomes L<n>."""
    try:
        r = c.raw("/etcdserverpb.Lease/LeaseGrant",
                  c.M("LeaseGrantRequest")(TTL=ttl, ID=lease_id), "LeaseGrantResponse")
    except grpc.RpcError as e:
        code = e.code()
        return {"error": [code.name if code else "UNKNOWN", e.details()]}
    if r.ID not in c.leases:
        c.leases[r.ID] = "L%d" % (len([v for v in c.leases.values() if v[0] == "L"]) + 1)
    return c.norm(r)


def grant(c, ttl=600, lease_id=0):
    """LeaseGrant that must succeed; the id."""
    r = c.raw("/etcdserverpb.Lease/LeaseGrant",
              c.M("LeaseGrantRequest")(TTL=ttl, ID=lease_id), "LeaseGrantResponse")
    if r.ID not in c.leases:
        c.leases[r.ID] = "L%d" % (len([v for v in c.leases.values() if v[0] == "L"]) + 1)
    return r.ID


def window(v, n, above=0):
    """A remaining TTL against the expected n: '~n' when in [n-2, n+above]."""
    if isinstance(v, int) and n - 2 <= v <= n + above:
        return "~%d" % n
    return "%s!" % v


def ttl(c, lid, keys=False, expect=None, above=0):
    """LeaseTimeToLive, normalised; TTL shown against `expect` (the granted
    TTL unless given), keys sorted (etcd lists them in map order)."""
    r = c.call("/etcdserverpb.Lease/LeaseTimeToLive",
               c.M("LeaseTimeToLiveRequest")(ID=lid, keys=keys), "LeaseTimeToLiveResponse")
    if "error" in r:
        return r
    if "keys" in r:
        r["keys"] = sorted(r["keys"])
    t = r.get("TTL", 0)
    if t > 0:
        r["TTL"] = window(t, expect if expect is not None else r.get("grantedTTL", 0),
                          above)
    return r


def leases(c):
    """LeaseLeases, only this check's leases, by label."""
    r = c.call("/etcdserverpb.Lease/LeaseLeases", c.M("LeaseLeasesRequest")(),
               "LeaseLeasesResponse")
    if "error" in r:
        return r
    mine = sorted(x["ID"] for x in r.get("leases", [])
                  if not str(x.get("ID", "")).startswith("lease?"))
    return {"header": r.get("header"), "leases": mine}


def revoke(c, lid):
    return c.revoke(lid)


class KeepAlive(Bidi):
    PATH = "/etcdserverpb.Lease/LeaseKeepAlive"
    RESPONSE = "LeaseKeepAliveResponse"

    def send(self, lid):
        self.reqs.put(self.c.M("LeaseKeepAliveRequest")(ID=lid))


def keepalive_once(c, lid):
    k = KeepAlive(c)
    k.send(lid)
    return k.recv()


def wait_gone(c, lid, limit=EXPIRY_WAIT):
    """Poll TimeToLive until the lease is gone (TTL -1); seconds waited,
    rounded down to whole seconds, or 'still alive'."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        r = c.raw("/etcdserverpb.Lease/LeaseTimeToLive",
                  c.M("LeaseTimeToLiveRequest")(ID=lid), "LeaseTimeToLiveResponse")
        if r.TTL == -1:
            return True
        time.sleep(0.1)
    return "still alive after %.0fs" % limit


# ==========================================================================
# grant

@lcheck("lease.grant.server_chosen_id")
def _(c):
    r = lgrant(c, 60)
    out = [r, ttl(c, next(iter(c.leases))), c.rev()]
    revoke(c, next(iter(c.leases)))
    return out


@lcheck("lease.grant.explicit_id")
def _(c):
    lid = xid(c, 1)
    return [lgrant(c, 60, lid), ttl(c, lid), revoke(c, lid)]


@lcheck("lease.grant.duplicate_id")
def _(c):
    lid = xid(c, 1)
    return [lgrant(c, 60, lid), lgrant(c, 120, lid), ttl(c, lid), revoke(c, lid)]


@lcheck("lease.grant.negative_id")
def _(c):
    lid = -(xid(c, 1))
    c.leases[lid] = "X-1"
    r = lgrant(c, 60, lid)
    if "error" not in r:
        revoke(c, lid)
    return r


@lcheck("lease.grant.ttl_below_minimum")
def _(c):
    out = []
    for t in (1, 2, 3):
        r = lgrant(c, t)
        out.append(r)
    for lid in list(c.leases):
        out.append(ttl(c, lid))
        revoke(c, lid)
    return out


@lcheck("lease.grant.ttl_zero")
def _(c):
    r = lgrant(c, 0)
    out = [r]
    for lid in list(c.leases):
        out.append(ttl(c, lid))
        revoke(c, lid)
    return out


@lcheck("lease.grant.ttl_negative")
def _(c):
    r = lgrant(c, -5)
    out = [r]
    for lid in list(c.leases):
        out.append(ttl(c, lid))
        revoke(c, lid)
    return out


@lcheck("lease.grant.ttl_maximum")
def _(c):
    out = [lgrant(c, 9000000000)]
    for lid in list(c.leases):
        out.append(ttl(c, lid))
        revoke(c, lid)
    return out


@lcheck("lease.grant.ttl_too_large")
def _(c):
    return [lgrant(c, 9000000001), lgrant(c, 1 << 62), c.rev()]


@lcheck("lease.grant.takes_no_revision")
def _(c):
    a = lgrant(c, 60)
    b = lgrant(c, 60, xid(c, 1))
    out = [a["header"], b["header"], c.rev(), c.put("k", "v")["header"]]
    for lid in list(c.leases):
        revoke(c, lid)
    return out


# ==========================================================================
# revoke

@lcheck("lease.revoke.unknown")
def _(c):
    return [revoke(c, xid(c, 1)), c.rev()]


@lcheck("lease.revoke.id_zero")
def _(c):
    return revoke(c, 0)


@lcheck("lease.revoke.twice")
def _(c):
    lid = grant(c)
    return [revoke(c, lid), revoke(c, lid)]


@lcheck("lease.revoke.keys_one_revision")
def _(c):
    lid = grant(c)
    c.put("b", "1", lease=lid)
    c.put("a", "2", lease=lid)
    c.put("c", "3", lease=lid)
    c.put("d", "4")
    r = revoke(c, lid)
    return [r, c.rev(), c.range("a", end="z"), ttl(c, lid)]


@lcheck("lease.revoke.no_keys_no_revision")
def _(c):
    lid = grant(c)
    c.put("a", "1")
    return [revoke(c, lid), c.rev()]


@lcheck("lease.revoke.keys_already_deleted")
def _(c):
    lid = grant(c)
    c.put("a", "1", lease=lid)
    c.delete("a")
    return [revoke(c, lid), c.rev()]


@lcheck("lease.revoke.then_put_with_it")
def _(c):
    lid = grant(c)
    revoke(c, lid)
    return [c.put("a", "1", lease=lid), c.rev(), lgrant(c, 60, lid)["header"], revoke(c, lid)]


# ==========================================================================
# time to live, leases

@lcheck("lease.ttl.basic")
def _(c):
    lid = grant(c, 100)
    out = [ttl(c, lid), ttl(c, lid, keys=True)]
    revoke(c, lid)
    return out


@lcheck("lease.ttl.with_keys")
def _(c):
    lid = grant(c, 100)
    for k in ("b", "a", "c"):
        c.put(k, k, lease=lid)
    out = [ttl(c, lid, keys=True), ttl(c, lid, keys=False)]
    revoke(c, lid)
    return out


@lcheck("lease.ttl.unknown")
def _(c):
    lid = xid(c, 1)
    return [ttl(c, lid), ttl(c, lid, keys=True)]


@lcheck("lease.ttl.id_zero")
def _(c):
    return ttl(c, 0)


@lcheck("lease.ttl.after_revoke")
def _(c):
    lid = grant(c)
    c.put("a", "1", lease=lid)
    revoke(c, lid)
    return ttl(c, lid, keys=True)


@lcheck("lease.leases.list")
def _(c):
    a = grant(c)
    b = grant(c)
    x = grant(c, 60, xid(c, 1))
    r1 = leases(c)
    revoke(c, b)
    r2 = leases(c)
    revoke(c, a)
    revoke(c, x)
    return [r1, r2, leases(c)]


# ==========================================================================
# keepalive

@lcheck("lease.keepalive.basic")
def _(c):
    lid = grant(c, 50)
    k = KeepAlive(c)
    k.send(lid)
    out = [k.recv(), k.quiet()]
    revoke(c, lid)
    return out


@lcheck("lease.keepalive.unknown")
def _(c):
    k = KeepAlive(c)
    k.send(xid(c, 1))
    k.send(0)
    return [k.recv_n(2), k.quiet()]


@lcheck("lease.keepalive.after_revoke")
def _(c):
    lid = grant(c, 50)
    k = KeepAlive(c)
    k.send(lid)
    r1 = k.recv()
    revoke(c, lid)
    k.send(lid)
    return [r1, k.recv(), k.quiet()]


@lcheck("lease.keepalive.several_on_one_stream")
def _(c):
    a = grant(c, 50)
    b = grant(c, 70)
    k = KeepAlive(c)
    for lid in (a, b, a, a):
        k.send(lid)
    out = [k.recv_n(4), k.quiet()]
    revoke(c, a)
    revoke(c, b)
    return out


@lcheck("lease.keepalive.min_ttl_lease")
def _(c):
    lid = grant(c, 1)
    r = keepalive_once(c, lid)
    revoke(c, lid)
    return r


@lcheck("lease.keepalive.refreshes_remaining")
def _(c):
    lid = grant(c, 10)
    time.sleep(3.2)
    before = ttl(c, lid, expect=7)
    r = keepalive_once(c, lid)
    after = ttl(c, lid)
    revoke(c, lid)
    return [before, r, after, c.rev()]


@lcheck("lease.keepalive.takes_no_revision")
def _(c):
    lid = grant(c, 50)
    c.put("a", "1", lease=lid)
    keepalive_once(c, lid)
    out = [c.rev(), c.range("a")]
    revoke(c, lid)
    return out


# ==========================================================================
# keys under leases

@lcheck("lease.keys.move_to_other_lease")
def _(c):
    a = grant(c)
    b = grant(c)
    c.put("k", "1", lease=a)
    c.put("k", "2", lease=b)
    return [ttl(c, a, keys=True).get("keys", []), ttl(c, b, keys=True).get("keys", []),
            revoke(c, a), c.range("k"), revoke(c, b), c.range("k")]


@lcheck("lease.keys.plain_put_detaches")
def _(c):
    lid = grant(c)
    c.put("k", "1", lease=lid)
    c.put("k", "2")
    return [ttl(c, lid, keys=True).get("keys", []), revoke(c, lid), c.range("k")]


@lcheck("lease.keys.delete_detaches")
def _(c):
    lid = grant(c)
    c.put("k", "1", lease=lid)
    c.delete("k")
    c.put("k", "2")
    return [ttl(c, lid, keys=True).get("keys", []), revoke(c, lid), c.range("k")]


@lcheck("lease.keys.ignore_lease_keeps")
def _(c):
    lid = grant(c)
    c.put("k", "1", lease=lid)
    c.put("k", "2", ignore_lease=True)
    return [ttl(c, lid, keys=True).get("keys", []), revoke(c, lid), c.range("k")]


@lcheck("lease.keys.txn_put_with_lease")
def _(c):
    lid = grant(c)
    r = c.txn(success=[c.op_put("a", "1", lease=lid), c.op_put("b", "2", lease=lid),
                       c.op_put("c", "3")])
    return [r["header"], ttl(c, lid, keys=True).get("keys", []), revoke(c, lid),
            c.range("a", end="z")]


@lcheck("lease.keys.same_key_many_leases_history")
def _(c):
    a = grant(c)
    b = grant(c)
    c.put("k", "1", lease=a)
    c.put("k", "2", lease=b)
    out = [c.range("k", rev=1), c.range("k")]
    revoke(c, a)
    revoke(c, b)
    return out


# ==========================================================================
# expiry (bounded waits)

@lcheck("lease.expiry.keys_deleted_in_one_revision")
def _(c):
    lid = grant(c, 2)
    c.put("b", "1", lease=lid)
    c.put("a", "2", lease=lid)
    c.put("z", "plain")
    w, _r = created(c, key=c.ns, end=PREFIX, prev_kv=True)
    evs = w.events(2, timeout=EXPIRY_WAIT)
    gone = wait_gone(c, lid)
    return [evs, w.quiet(), gone, c.rev(), c.range("a", end="z\x00"), ttl(c, lid, keys=True)]


@lcheck("lease.expiry.without_keys_takes_no_revision")
def _(c):
    lid = grant(c, 2)
    gone = wait_gone(c, lid)
    return [gone, c.rev(), ttl(c, lid), revoke(c, lid)]


@lcheck("lease.expiry.keepalive_prevents")
def _(c):
    lid = grant(c, 2)
    c.put("a", "1", lease=lid)
    k = KeepAlive(c)
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < 4.0:
        k.send(lid)
        n += 1
        time.sleep(0.5)
    got = k.recv_n(n)   # n varies with timing: compare the distinct answers
    keys_now = [kv["key"] for kv in c.range("a").get("kvs", [])]
    alive = [ttl(c, lid, keys=True), keys_now[0] if keys_now else None]
    return [sorted({canon_ka(x) for x in got}), alive, revoke(c, lid), c.rev()]


def canon_ka(x):
    return "%s ttl=%s" % (x.get("ID"), x.get("TTL"))


# ==========================================================================
# restart: etcd's lessor on a restarted server

@lcheck("lease.restart.remaining_ttl")
def _(c):
    lid = grant(c, 30)
    c.put("a", "1", lease=lid)
    time.sleep(3.2)
    before = ttl(c, lid, expect=27)
    c.restart()
    # etcd restarts every lease at its full TTL plus about a second (its
    # election timeout): 30, not 27; allow 31.
    out = [before, ttl(c, lid, keys=True, above=1), c.range("a")]
    revoke(c, lid)
    return out


def stop_wait_start(c, seconds):
    """Stop the server (SIGTERM), stay down `seconds`, start it again on the
    same data dir and ports."""
    c.server.stop()
    time.sleep(seconds)
    c.server._spawn(c.msgs)
    c._stubs = {}


@lcheck("lease.restart.expired_while_down")
def _(c):
    lid = grant(c, 5)
    c.put("a", "1", lease=lid)
    c.put("b", "2")
    stop_wait_start(c, 6.5)
    after = ttl(c, lid, keys=True, above=1)
    present = c.range("a").get("count", 0)
    rev_up = c.rev()
    gone = wait_gone(c, lid)
    return [after, present, rev_up, gone, c.rev(), c.range("a")]


@lcheck("lease.restart.leases_and_revocations_kept")
def _(c):
    a = grant(c, 600)
    b = grant(c, 600)
    x = grant(c, 600, xid(c, 1))
    c.put("k", "1", lease=b)
    revoke(c, b)
    c.restart()
    out = [leases(c), ttl(c, a), ttl(c, b), ttl(c, x), c.range("k"), c.rev()]
    revoke(c, a)
    revoke(c, x)
    return out


@lcheck("lease.keepalive.stream_outlives_lease")
def _(c):
    # One keepalive stream: while the lease lives, then after it expired.
    lid = grant(c, 2)
    k = KeepAlive(c)
    k.send(lid)
    first = k.recv()
    gone = wait_gone(c, lid)
    k.send(lid)
    return [first, gone, k.recv(), k.quiet(), c.rev()]


@lcheck("lease.ttl.keys_after_key_deleted")
def _(c):
    lid = grant(c)
    c.put("a", "1", lease=lid)
    c.put("b", "2", lease=lid)
    c.delete("a")
    out = [ttl(c, lid, keys=True), revoke(c, lid), c.rev()]
    return out


@lcheck("lease.grant.header_after_writes")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    out = [lgrant(c, 60)]
    for lid in list(c.leases):
        revoke(c, lid)
    return out
