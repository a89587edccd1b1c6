"""The Cluster service's conformance checks (suite "member"): MemberAdd,
MemberRemove, MemberUpdate, MemberPromote and MemberList on one server.

What etcd 3.4.23 answered, measured on a three-node cluster on 127.0.0.1
(etcdctl and raw gRPC) and on the single node these checks run on:

- Every membership answer carries the header without a revision and the
  whole member list, sorted by id. An added member has no name and no client
  URLs until it starts (it publishes them); a learner is flagged isLearner.
- Added member ids: SHA-1(sorted peer URLs ++ cluster token ++ the unix time
  in seconds, decimal), first 8 bytes big-endian (membership.NewMember), so
  adding the same URL again within one second is "member ID already exist"
  and a second later "Peer URLs already exists" (not checked: it depends on
  the clock). Peer URLs are trimmed; each must be http/https/unix/unixs with
  host:port and no path, and at least one given, else INVALID_ARGUMENT
  "etcdserver: given member URLs are invalid".
- MemberUpdate does not check the URLs at the API: etcd 3.4.23 panics
  applying an update to "x" ("newURLs [x] should never fail") and exits,
  so no check here does it; cairn answers "given member URLs are invalid"
  (tests/unit/test_members.c).
- One learner at most: "etcdserver: too many learner members in cluster".
- Unknown (or removed) id on remove, update or promote: NOT_FOUND
  "etcdserver: member not found". Promoting a voter: "etcdserver: can only
  promote a learner member"; a learner that never started: "... which is in
  sync with leader" (cairn: a learner is ready once its own first change, the
  publish of its name, has reached the node that promotes it).
- MemberUpdate of a learner drops its learner flag in etcd 3.4 (the answer
  and later lists show it as a voter; afterwards a single node counts it as
  an unstarted voter and answers "unhealthy cluster"). cairn keeps the flag:
  ledger entry member.update.learner_keeps_flag.
- Adding a voter to a single-node etcd succeeds and loses the quorum: every
  later write hangs, so no check adds a voter here (the integration test
  adds voters to three cairn nodes).
- A learner refuses everything but serializable Range and Status with
  UNAVAILABLE "etcdserver: rpc not supported for learner" (Put, linearizable
  Range, MemberList, MemberAdd measured); after MemberPromote it writes.
- A removed member logs "the member has been permanently removed from the
  cluster" and exits, whether it was removed through itself or another.

Each check removes what it added, so the suite's one server stays a single
member. Ids are shown as SELF (the server), A1, A2... (added members); the
server's own URLs as SELF-PEER and SELF-CLIENT.
"""

import grpc

from checks_kv import check

CLUSTER = "/etcdserverpb.Cluster/"


def mcheck(name):
    return check("member", name)


class Members:
    def __init__(self, c):
        self.c = c
        self.ids = {}
        r = c.raw(CLUSTER + "MemberList", c.M("MemberListRequest")(), "MemberListResponse")
        me = r.header.member_id
        self.ids[me] = "SELF"
        self.self_id = me
        self.urls = {}
        for m in r.members:
            if m.ID == me:
                for u in m.peerURLs:
                    self.urls[u] = "SELF-PEER"
                for u in m.clientURLs:
                    self.urls[u] = "SELF-CLIENT"
                self.self_peer = list(m.peerURLs)

    def sym(self, i):
        if i not in self.ids:
            self.ids[i] = "A%d" % (1 + len([v for v in self.ids.values() if v.startswith("A")]))
        return self.ids[i]

    def member(self, m):
        out = {"ID": self.sym(m.ID), "name": m.name,
               "peerURLs": [self.urls.get(u, u) for u in m.peerURLs],
               "clientURLs": [self.urls.get(u, u) for u in m.clientURLs]}
        if m.isLearner:
            out["isLearner"] = True
        return out

    def norm(self, r):
        # ids are drawn from the clock: the order is shown as "sorted by
        # id", the members in symbol order
        ids = [m.ID for m in r.members]
        out = {"header.revision": r.header.revision, "sorted by id": ids == sorted(ids),
               "members": sorted((self.member(m) for m in r.members), key=lambda x: x["ID"])}
        if hasattr(r, "member") and r.HasField("member"):
            out["member"] = self.member(r.member)
        return out

    def call(self, meth, **kw):
        c = self.c
        try:
            r = c.raw(CLUSTER + meth, c.M(meth + "Request")(**kw), meth + "Response")
        except grpc.RpcError as e:
            code = e.code()
            return {"error": [code.name if code else "UNKNOWN", e.details()]}
        return self.norm(r)

    def add(self, urls, learner=True):
        c = self.c
        r = c.raw(CLUSTER + "MemberAdd", c.M("MemberAddRequest")(peerURLs=urls, isLearner=learner),
                  "MemberAddResponse")
        self.sym(r.member.ID)
        return r.member.ID

    def remove(self, i):
        return self.call("MemberRemove", ID=i)


def url(c, n):
    """A peer URL no process listens on, distinct per check."""
    return "http://127.0.0.1:%d" % (1000 + (sum(c.ns) * 7 + n) % 20000)


@mcheck("member.list.fresh")
def _list_fresh(c):
    m = Members(c)
    return m.call("MemberList")


@mcheck("member.add.learner")
def _add_learner(c):
    m = Members(c)
    out = {"add": m.call("MemberAdd", peerURLs=[url(c, 1)], isLearner=True)}
    out["list"] = m.call("MemberList")
    added = [i for i, s in m.ids.items() if s == "A1"]
    out["remove"] = m.remove(added[0]) if added else "not added"
    out["remove again"] = m.remove(added[0]) if added else "not added"
    out["list after"] = m.call("MemberList")
    return out


@mcheck("member.add.too_many_learners")
def _too_many(c):
    m = Members(c)
    a = m.add([url(c, 1)])
    out = {"second": m.call("MemberAdd", peerURLs=[url(c, 2)], isLearner=True)}
    out["remove"] = m.remove(a)
    return out


@mcheck("member.add.duplicate_peer_url")
def _dup(c):
    m = Members(c)
    return {"self's URL": m.call("MemberAdd", peerURLs=m.self_peer, isLearner=True),
            "self's URL and another": m.call("MemberAdd", peerURLs=[url(c, 1)] + m.self_peer,
                                             isLearner=True)}


@mcheck("member.add.bad_urls")
def _bad(c):
    m = Members(c)
    out = {}
    for label, urls in (("none", []), ("not a URL", ["notaurl"]), ("no port", ["http://127.0.0.1"]),
                        ("ftp", ["ftp://127.0.0.1:1"]), ("path", ["http://127.0.0.1:1/x"]),
                        ("one bad of two", [url(c, 1), "bad"])):
        out[label] = m.call("MemberAdd", peerURLs=urls, isLearner=True)
    return out


@mcheck("member.add.url_trimmed")
def _trim(c):
    m = Members(c)
    out = {"add": m.call("MemberAdd", peerURLs=["  " + url(c, 1) + " "], isLearner=True)}
    added = [i for i, s in m.ids.items() if s == "A1"]
    if added:
        out["remove"] = m.remove(added[0])
    return out


@mcheck("member.remove.unknown")
def _remove_unknown(c):
    m = Members(c)
    return {"unknown": m.call("MemberRemove", ID=12345), "zero": m.call("MemberRemove", ID=0)}


@mcheck("member.update.errors")
def _update_errors(c):
    m = Members(c)
    a = m.add([url(c, 1)])
    out = {"unknown": m.call("MemberUpdate", ID=12345, peerURLs=[url(c, 2)]),
           "taken by self": m.call("MemberUpdate", ID=a, peerURLs=m.self_peer),
           "self to its own URLs": m.call("MemberUpdate", ID=m.self_id, peerURLs=m.self_peer)}
    out["remove"] = m.remove(a)
    return out


@mcheck("member.update.learner_keeps_flag")
def _update_learner(c):
    m = Members(c)
    a = m.add([url(c, 1)])
    m.urls[url(c, 2)] = "U2"
    out = {"update": m.call("MemberUpdate", ID=a, peerURLs=[url(c, 2)])}
    out["remove"] = m.remove(a)
    return out


@mcheck("member.promote.errors")
def _promote(c):
    m = Members(c)
    a = m.add([url(c, 1)])
    out = {"voter": m.call("MemberPromote", ID=m.self_id),
           "unknown": m.call("MemberPromote", ID=12345),
           "learner never started": m.call("MemberPromote", ID=a)}
    out["remove"] = m.remove(a)
    return out
