/*
 * etcd's Cluster service over the store's member table (store/members.c):
 * the table is the document's members map, so MemberAdd, MemberRemove,
 * MemberUpdate and MemberPromote are changes that replicate like writes,
 * and MemberList answers what this node's document says. Each call blocks
 * its worker until its change is durable (membership changes are rare).
 *
 * etcd's answers were measured on a three-node etcd 3.4 (the findings are
 * in tests/conformance/checks_member.py, which pins them): every response
 * lists all members by id, the header has no revision, an added member has
 * no name and no client URLs until it starts, and a learner serves only
 * serializable Range and Status.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* Whether this member is a learner now (re-read when the member table
 * moved). */
static int is_learner(cairn_server *srv)
{
    uint64_t gen = cairn_store_members_gen(srv->store) + 1; /* 0: never read */
    if (atomic_load(&srv->learner_gen) != gen) {
        int st = cairn_store_member_state(srv->store, cairn_store_member_id(srv->store));
        atomic_store(&srv->learner, st == 1);
        atomic_store(&srv->learner_gen, gen);
    }
    return atomic_load(&srv->learner);
}

int etcd_admit(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!is_learner(etcd_node(c)))
        return 0;
    /* etcd: isRPCSupportedForLearner, in the interceptors of every service
     * on etcd's gRPC server, v3lock and v3election included (measured:
     * Put, Watch, LeaseKeepAlive, Lock, Leader, HashKV, MemberList... on a
     * 3.4 learner). A Range is served when serializable: kv_range looks. */
    const char *path = c->method->path;
    if (strcmp(path, "/etcdserverpb.Maintenance/Status") == 0 ||
        strcmp(path, "/etcdserverpb.KV/Range") == 0)
        return 0;
    /* etcd (grpc-go): a unary request is decoded before the interceptors
     * run, a stream's after (measured on a 3.4.23 learner: a malformed
     * Put, LeaseLeases, HashKV, Lock or Status fails INTERNAL "grpc: error
     * unmarshalling request: ...", a malformed Snapshot, Observe or Watch
     * with the learner's error, and so does a Put past
     * --max-request-bytes, before "request is too large") */
    if (req && !etcd_request_decodes(c->method, req, len))
        return CAIRN_EUNMARSHAL;
    return CAIRN_ENOTFORLEARNER;
}

int etcd_learner_refuses(rpc_call *c)
{
    if (!is_learner(etcd_node(c)))
        return 0;
    rpc_fail(c, CAIRN_ENOTFORLEARNER, NULL);
    return 1;
}

/* etcd: types.NewURLs trims each URL (measured: " http://h:1 " is added
 * as "http://h:1"). In place: the strings are the unpacked request's. */
static void trim_urls(char **urls, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *u = urls[i];
        size_t l = strlen(u);
        while (l && isspace((unsigned char)u[l - 1]))
            u[--l] = 0;
        size_t k = 0;
        while (u[k] && isspace((unsigned char)u[k]))
            k++;
        memmove(u, u + k, l - k + 1);
    }
}

/* The member table as protobuf members (pointers borrowed from |v|). */
static int to_pb(Etcdserverpb__Member **ms, Etcdserverpb__Member ***mp, cairn_member_info *v,
                 size_t n)
{
    *ms = calloc(n ? n : 1, sizeof **ms);
    *mp = calloc(n ? n : 1, sizeof **mp);
    if (!*ms || !*mp) {
        free(*ms);
        free(*mp);
        return CAIRN_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        Etcdserverpb__Member *e = &(*ms)[i];
        etcdserverpb__member__init(e);
        e->id = v[i].id;
        e->name = v[i].name;
        e->peerurls = v[i].peer_urls;
        e->n_peerurls = v[i].npeer_urls;
        e->clienturls = v[i].client_urls;
        e->n_clienturls = v[i].nclient_urls;
        e->islearner = v[i].learner;
        (*mp)[i] = e;
    }
    return 0;
}

/* Every membership answer: header (no revision) and the member list; for
 * MemberAdd also the added member (|added| != 0). The four response types
 * share their first fields' layout but not their descriptors. */
static void reply_members(rpc_call *c, const ProtobufCMessageDescriptor *d, uint64_t added)
{
    cairn_server *srv = etcd_node(c);
    cairn_member_info *v;
    size_t n;
    int rc = cairn_store_member_list(srv->store, &v, &n);
    if (rc) {
        rpc_fail(c, rc, NULL);
        return;
    }
    Etcdserverpb__Member *ms, **mp;
    rc = to_pb(&ms, &mp, v, n);
    if (rc) {
        cairn_store_member_list_free(v, n);
        rpc_fail(c, rc, NULL);
        return;
    }
    /* etcd: the Cluster service's header has no revision. */
    Etcdserverpb__ResponseHeader ph;
    etcd_header(srv, &ph, NULL);
    ph.revision = 0;
    if (d == &etcdserverpb__member_add_response__descriptor) {
        Etcdserverpb__MemberAddResponse out;
        etcdserverpb__member_add_response__init(&out);
        out.header = &ph;
        out.members = mp;
        out.n_members = n;
        for (size_t i = 0; i < n; i++)
            if (ms[i].id == added)
                out.member = &ms[i];
        rpc_reply(c, &out.base);
    } else {
        /* List, Remove, Update and Promote responses are the same message
         * on the wire (header = 1, members = 2) */
        Etcdserverpb__MemberListResponse out;
        etcdserverpb__member_list_response__init(&out);
        out.header = &ph;
        out.members = mp;
        out.n_members = n;
        rpc_reply(c, &out.base);
    }
    free(mp);
    free(ms);
    cairn_store_member_list_free(v, n);
}

static void cluster_member_list(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__member_list_request__descriptor, req, len))
        return;
    reply_members(c, &etcdserverpb__member_list_response__descriptor, 0);
}

static void cluster_member_add(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__MemberAddRequest *m = (Etcdserverpb__MemberAddRequest *)rpc_unpack(
        c, &etcdserverpb__member_add_request__descriptor, req, len);
    if (!m)
        return;
    uint64_t id;
    trim_urls(m->peerurls, m->n_peerurls);
    int rc = cairn_store_member_add(etcd_node(c)->store, &id, (const char *const *)m->peerurls,
                                    m->n_peerurls, m->islearner);
    if (rc) {
        rpc_fail(c, rc, NULL);
        return;
    }
    reply_members(c, &etcdserverpb__member_add_response__descriptor, id);
}

static void cluster_member_remove(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__MemberRemoveRequest *m = (Etcdserverpb__MemberRemoveRequest *)rpc_unpack(
        c, &etcdserverpb__member_remove_request__descriptor, req, len);
    if (!m)
        return;
    int rc = cairn_store_member_remove(etcd_node(c)->store, m->id);
    if (rc) {
        rpc_fail(c, rc, NULL);
        return;
    }
    reply_members(c, &etcdserverpb__member_remove_response__descriptor, 0);
}

static void cluster_member_update(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__MemberUpdateRequest *m = (Etcdserverpb__MemberUpdateRequest *)rpc_unpack(
        c, &etcdserverpb__member_update_request__descriptor, req, len);
    if (!m)
        return;
    trim_urls(m->peerurls, m->n_peerurls);
    int rc = cairn_store_member_update(etcd_node(c)->store, m->id, (const char *const *)m->peerurls,
                                       m->n_peerurls);
    if (rc) {
        rpc_fail(c, rc, NULL);
        return;
    }
    reply_members(c, &etcdserverpb__member_update_response__descriptor, 0);
}

static void cluster_member_promote(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__MemberPromoteRequest *m = (Etcdserverpb__MemberPromoteRequest *)rpc_unpack(
        c, &etcdserverpb__member_promote_request__descriptor, req, len);
    if (!m)
        return;
    int rc = cairn_store_member_promote(etcd_node(c)->store, m->id);
    if (rc) {
        rpc_fail(c, rc, NULL);
        return;
    }
    reply_members(c, &etcdserverpb__member_promote_response__descriptor, 0);
}

static const rpc_method cluster_methods[] = {
    {"/etcdserverpb.Cluster/MemberAdd", RPC_UNARY, cluster_member_add, 1,
     &etcdserverpb__member_add_request__descriptor},
    {"/etcdserverpb.Cluster/MemberRemove", RPC_UNARY, cluster_member_remove, 1,
     &etcdserverpb__member_remove_request__descriptor},
    {"/etcdserverpb.Cluster/MemberUpdate", RPC_UNARY, cluster_member_update, 1,
     &etcdserverpb__member_update_request__descriptor},
    {"/etcdserverpb.Cluster/MemberList", RPC_UNARY, cluster_member_list, 2,
     &etcdserverpb__member_list_request__descriptor},
    {"/etcdserverpb.Cluster/MemberPromote", RPC_UNARY, cluster_member_promote, 1,
     &etcdserverpb__member_promote_request__descriptor},
};

const rpc_service etcd_cluster_service = {"etcdserverpb.Cluster", cluster_methods,
                                          sizeof cluster_methods / sizeof cluster_methods[0], NULL,
                                          etcd_admit};
