#!/usr/bin/python3
"""Leases across real cairn nodes (issue 16, "Leases, compaction and hashes
across nodes"), on cluster.py's harness: three cairn processes with a
netproxy on every peer link, a watcher on every node.

1. Keepalives elsewhere. A lease granted on n1 with a key put on n1,
   renewed only through n2 and then only through n3 (one keepalive a
   second, coalesced by the store as usual: store/lease.c), stays alive on
   every node well past its TTL; LeaseTimeToLive answers the same ID,
   grantedTTL and keys on every node, remaining TTLs within the documented
   spread (README, "Leases across nodes"); LeaseLeases lists the same
   leases everywhere. Once the keepalives stop the key is deleted on every
   node, once.
2. The granting node dies. A lease granted on n1 with three keys, n1 killed
   with SIGKILL, n2 and n3 cut from each other so that each revokes on its
   own at the deadline: on each survivor the keys go at the deadline (not
   before), one delete event per key; after the heal the two concurrent
   revokes merge into nothing new (no second delete event, no revision
   bump), the lease is gone everywhere (TTL -1, not in LeaseLeases) while
   a plain key and a key on n2's live lease stay; n1 restarted catches up
   with one delete per key, and every node ends with equal heads, key
   space, KeyValue fields that must agree, HashKV and LeaseLeases.
3. A revoke (LeaseRevoke) on n2 while n3 revokes the same lease by expiry
   in a partition: the same, one delete per key per node.

4. Keepalives on one side of a partition, none on the other: n1, cut off
   from them, expires the lease at the deadline it knows while n2 and n3
   keep it; after the heal the revoke wins over the concurrent keepalives
   on every node (README, "Leases across nodes"): the key is gone
   everywhere, one delete per node, and a keepalive answers TTL 0.

Every watcher then checks its node's events: each revision once, in order,
no gap, replaying to the node's Range. Bounded: about a minute; needs the
peer transport (exit 77 otherwise).

Usage: test_cluster_leases.py --cairn build/cairn
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cluster as clusterlib  # noqa: E402
from cluster_checks import check_equal_state, lease_list, main, wait_for  # noqa: E402
from verdict import check  # noqa: E402

TTL = 6              # s: keepalives every second keep a 3 s margin on coalescing
SLACK = 4.0          # s: the expiry tick, a push and a loaded machine


# ---- lease calls ----------------------------------------------------------

def grant(c, n, ttl):
    r = c._unary(n, "/etcdserverpb.Lease/LeaseGrant",
                 c.msgs["etcdserverpb.LeaseGrantRequest"](TTL=ttl),
                 "etcdserverpb.LeaseGrantResponse")
    return r.ID


def revoke(c, n, lid):
    c._unary(n, "/etcdserverpb.Lease/LeaseRevoke",
             c.msgs["etcdserverpb.LeaseRevokeRequest"](ID=lid),
             "etcdserverpb.LeaseRevokeResponse")


def keepalive(c, n, lid):
    """One keepalive on a stream of its own; the TTL answered (0: unknown)."""
    m = c.msgs
    stub = c.node(n).channel.stream_stream(
        "/etcdserverpb.Lease/LeaseKeepAlive",
        request_serializer=lambda x: x.SerializeToString(),
        response_deserializer=m["etcdserverpb.LeaseKeepAliveResponse"].FromString)
    call = stub(iter([m["etcdserverpb.LeaseKeepAliveRequest"](ID=lid)]),
                timeout=clusterlib.RPC_TIMEOUT)
    try:
        for r in call:
            return r.TTL
        return 0
    finally:
        call.cancel()


def time_to_live(c, n, lid):
    """(ID, TTL, grantedTTL, sorted keys) as node n answers."""
    r = c._unary(n, "/etcdserverpb.Lease/LeaseTimeToLive",
                 c.msgs["etcdserverpb.LeaseTimeToLiveRequest"](ID=lid, keys=True),
                 "etcdserverpb.LeaseTimeToLiveResponse")
    return r.ID, r.TTL, r.grantedTTL, sorted(r.keys)


# ---- waits and checks -----------------------------------------------------

def has_keys(c, nodes, keys):
    return all(all(k in c.range_all(n)[1] for k in keys) for n in nodes)


def no_keys(c, nodes, keys):
    return all(not any(k in c.range_all(n)[1] for k in keys) for n in nodes)


def deletes_of(c, n, key):
    """The revisions of the DELETE events node n's watcher got for key."""
    w = c.watchers[c.node(n).idx]
    with w.lock:
        return [rev for rev, typ, k, _v in w.events if k == key and typ == "DELETE"]


def wait_watch(c, n, rev, timeout=10.0):
    w = c.watchers[c.node(n).idx]
    return wait_for(lambda: w.last_revision() >= rev, timeout)


def check_once(c, nodes, keys, what):
    """Each key has exactly one DELETE event on each node's watch."""
    for n in nodes:
        node = c.node(n)
        wait_watch(c, node, c.range_all(node)[0])
        for k in keys:
            d = deletes_of(c, node, k)
            check(len(d) == 1, "%s: %s's watch has one delete of %r, not %s"
                  % (what, node.name, k, d))


def check_lease_gone(c, nodes, lid, what):
    for n in nodes:
        node = c.node(n)
        _id, ttl, _g, _k = time_to_live(c, node, lid)
        check(ttl == -1, "%s: %s answers TTL -1 for the revoked lease, not %d"
              % (what, node.name, ttl))
        check(lid not in lease_list(c, node), "%s: %s no longer lists the lease"
              % (what, node.name))


# ---- the scenarios --------------------------------------------------------

def keepalives_elsewhere(c):
    n1, n2, n3 = c.nodes
    lid = grant(c, n1, TTL)
    key = b"ka/key"
    c.put(n1, key, b"v", lease=lid)
    check(wait_for(lambda: has_keys(c, c.nodes, [key]), 10),
          "keepalive: the leased key reaches every node")
    t0 = time.monotonic()
    worst = 0
    for via, seconds in ((n2, TTL + 1), (n3, TTL)):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            got = keepalive(c, via, lid)
            check(got == TTL, "keepalive through %s answers TTL %d, not %d" % (via.name, TTL, got))
            time.sleep(1.0)
            missing = [n.name for n in c.nodes if key not in c.range_all(n)[1]]
            check(not missing, "keepalive through %s only: the key is alive on every node "
                  "%.1f s after the grant (TTL %d): missing on %s"
                  % (via.name, time.monotonic() - t0, TTL, missing))
            if missing:
                return
            answers = {n.name: time_to_live(c, n, lid) for n in c.nodes}
            ttls = [a[1] for a in answers.values()]
            worst = max(worst, max(ttls) - min(ttls))
            same = {(a[0], a[2], tuple(a[3])) for a in answers.values()}
            check(len(same) == 1 and min(ttls) > 0,
                  "LeaseTimeToLive: the same ID, grantedTTL and keys and a live TTL on every "
                  "node: %s" % answers)
            check(max(ttls) - min(ttls) <= TTL // 2 + 1,
                  "LeaseTimeToLive: remaining TTLs within TTL/2 + 1 s of each other: %s" % answers)
            lists = {n.name: lease_list(c, n) for n in c.nodes}
            check(all(lid in v for v in lists.values()), "LeaseLeases lists the lease on every "
                  "node: %s" % lists)
    alive_for = time.monotonic() - t0
    print("keepalive: lease alive on every node for %.1f s (TTL %d) through n2 then n3; "
          "largest spread of remaining TTLs %d s" % (alive_for, TTL, worst))
    check(alive_for > 2 * TTL, "keepalive: the run outlived two TTLs (%.1f s)" % alive_for)
    t1 = time.monotonic()
    gone = wait_for(lambda: no_keys(c, c.nodes, [key]), TTL + SLACK)
    print("keepalive: keepalives stopped, key gone everywhere after %.1f s"
          % (time.monotonic() - t1))
    check(gone, "keepalive: once the keepalives stop the key is deleted on every node within "
          "TTL + %.0f s" % SLACK)
    check_once(c, c.nodes, [key], "keepalive")
    check_lease_gone(c, c.nodes, lid, "keepalive")


def granting_node_killed(c):
    n1, n2, n3 = c.nodes
    lid = grant(c, n1, TTL)
    granted = time.monotonic()
    keys = [b"kill/a", b"kill/b", b"kill/c"]
    for k in keys:
        c.put(n1, k, b"v-" + k, lease=lid)
    # what stays: a plain key and one on n2's long lease, so that the state
    # compared after the heal is not empty
    long_lid = grant(c, n2, 120)
    c.put(n2, b"kill/plain", b"p")
    c.put(n2, b"kill/long", b"l", lease=long_lid)
    stay = [b"kill/plain", b"kill/long"]
    check(wait_for(lambda: has_keys(c, c.nodes, keys + stay), 10),
          "kill: the keys reach every node")
    c.kill9(n1)
    c.partition([[1], [2]])         # n2 and n3 revoke each on its own
    early = TTL - 2 - (time.monotonic() - granted)
    if early > 0:
        time.sleep(early)
        check(has_keys(c, [n2, n3], keys), "kill: the keys are still there 2 s before the "
              "deadline on both survivors")
    gone = wait_for(lambda: no_keys(c, [n2, n3], keys), TTL + SLACK - (time.monotonic() - granted))
    print("kill: keys gone on n2 and n3 %.1f s after the grant (TTL %d)"
          % (time.monotonic() - granted, TTL))
    check(gone, "kill: with the granting node dead the lease still expires on both survivors "
          "within TTL + %.0f s" % SLACK)
    revs = {n.name: c.range_all(n)[0] for n in (n2, n3)}
    c.heal()
    ok = check_equal_state(c, "kill: after the heal")
    time.sleep(1.0)                 # sync rounds after the merge
    after = {n.name: c.range_all(n)[0] for n in (n2, n3)}
    print("kill: revisions at the revoke %s, after the heal and merge %s" % (revs, after))
    check(after == revs, "kill: merging the other survivor's revoke bumps no revision: before "
          "%s, after %s" % (revs, after))
    check_once(c, [n2, n3], keys, "kill, two concurrent revokes")
    check_lease_gone(c, [n2, n3], lid, "kill")
    c.restart(n1)
    ok = check_equal_state(c, "kill: n1 restarted") and ok
    check_once(c, c.nodes, keys, "kill, n1 restarted")
    check_lease_gone(c, c.nodes, lid, "kill, n1 restarted")
    check(has_keys(c, c.nodes, stay) and
          all(c.range_kvs(n)[b"kill/long"][1] == long_lid for n in c.nodes),
          "kill: the plain key and the key on n2's live lease stay on every node")
    check(all(long_lid in lease_list(c, n) for n in c.nodes),
          "kill: every node lists n2's live lease")
    return ok


def revoke_beside_expiry(c):
    n1, n2, n3 = c.nodes
    lid = grant(c, n1, TTL)
    granted = time.monotonic()
    keys = [b"rv/a", b"rv/b"]
    for k in keys:
        c.put(n1, k, b"x", lease=lid)
    check(wait_for(lambda: has_keys(c, c.nodes, keys), 10),
          "revoke: the leased keys reach every node")
    c.partition([[0, 1], [2]])      # n3 alone: it expires what n2 revokes
    revoke(c, n2, lid)
    check(wait_for(lambda: no_keys(c, [n1, n2], keys), 10),
          "revoke: LeaseRevoke on n2 deletes the keys on n1 and n2")
    check(has_keys(c, [n3], keys), "revoke: the cut-off n3 still has the keys before the deadline")
    gone = wait_for(lambda: no_keys(c, [n3], keys), TTL + SLACK - (time.monotonic() - granted))
    check(gone, "revoke: the cut-off n3 expires the lease itself")
    revs = {n.name: c.range_all(n)[0] for n in c.nodes}
    c.heal()
    check_equal_state(c, "revoke: after the heal")
    time.sleep(1.0)
    after = {n.name: c.range_all(n)[0] for n in c.nodes}
    check(after == revs, "revoke: merging a revoke with an expiry bumps no revision: before %s, "
          "after %s" % (revs, after))
    check_once(c, c.nodes, keys, "revoke beside an expiry")
    check_lease_gone(c, c.nodes, lid, "revoke")


def keepalive_beside_expiry(c):
    n1, n2, n3 = c.nodes
    lid = grant(c, n1, TTL)
    granted = time.monotonic()
    key = b"split/k"
    c.put(n1, key, b"v", lease=lid)
    check(wait_for(lambda: has_keys(c, c.nodes, [key]), 10),
          "split: the leased key reaches every node")
    c.partition([[0], [1, 2]])      # the keepalives reach n2 and n3, never n1
    expired = False
    while not expired and time.monotonic() - granted < TTL + SLACK:
        keepalive(c, n2, lid)
        time.sleep(1.0)
        expired = no_keys(c, [n1], [key])
    check(expired, "split: n1, cut off from the keepalives, expired the lease")
    check(has_keys(c, [n2, n3], [key]), "split: the keepalives kept the key on n2 and n3")
    c.heal()
    check_equal_state(c, "split: after the heal")
    # the revoke wins over the concurrent keepalives, on every node
    check(no_keys(c, c.nodes, [key]), "split: after the heal the expiry's delete holds everywhere")
    check_once(c, c.nodes, [key], "split")
    check_lease_gone(c, c.nodes, lid, "split")
    check(keepalive(c, n2, lid) == 0, "split: a keepalive of the revoked lease answers TTL 0")


if __name__ == "__main__":
    sys.exit(main("test_cluster_leases", __doc__,
                  [keepalives_elsewhere, granting_node_killed, revoke_beside_expiry,
                   keepalive_beside_expiry]))
