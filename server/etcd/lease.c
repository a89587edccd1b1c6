/*
 * etcd's Lease service mapped onto the store's leases (store/lease.c keeps
 * each lease in the document with its TTL and deadline, extends them on
 * keepalive, revokes them on expiry from its own thread, and re-arms them
 * after a restart as etcd does). This file only converts messages; etcd's
 * rules (minimum TTL, id choice, "too large lease TTL") live in the store.
 *
 * Grant and revoke are answered from the store's completer once their
 * change is durable, like a Put: no worker waits for an fsync; a keepalive
 * never waits for one either.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(cairn_lease_grant_resp) <= RPC_CALL_SCRATCH, "a grant's answer fits in the call");
_Static_assert(sizeof(cairn_header) <= RPC_CALL_SCRATCH, "a revoke's header fits in the call");

/* On the completer: the grant is durable (or the store failed). */
static void grant_done(void *arg, int rc)
{
    rpc_call *c = arg;
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    const cairn_lease_grant_resp *g = (const cairn_lease_grant_resp *)(void *)c->scratch;
    Etcdserverpb__ResponseHeader ph;
    etcd_header(etcd_node(c), &ph, &g->header);
    Etcdserverpb__LeaseGrantResponse out;
    etcdserverpb__lease_grant_response__init(&out);
    out.header = &ph;
    out.id = g->id;
    out.ttl = g->ttl;
    rpc_reply(c, &out.base);
}

static void lease_grant(rpc_call *c, const uint8_t *req, size_t len)
{
    if (etcd_entry_too_large(c, len))
        return;
    Etcdserverpb__LeaseGrantRequest *m = (Etcdserverpb__LeaseGrantRequest *)rpc_unpack(
        c, &etcdserverpb__lease_grant_request__descriptor, req, len);
    if (!m)
        return;
    cairn_server *srv = etcd_node(c);
    /* etcd: LeaseGrant is refused while NOSPACE is raised. */
    int rc = node_quota_check(srv, len);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    /* the answer, kept in the call's scratch for grant_done */
    cairn_lease_grant_resp *g = (cairn_lease_grant_resp *)(void *)c->scratch;
    rc = cairn_store_lease_create_async(srv->store, g, m->id, m->ttl, grant_done, c);
    if (rc != 0) /* grant_done will not be called */
        rpc_fail(c, rc, NULL);
}

static void revoke_done(void *arg, int rc)
{
    rpc_call *c = arg;
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    Etcdserverpb__ResponseHeader ph;
    etcd_header(etcd_node(c), &ph, (const cairn_header *)(void *)c->scratch);
    Etcdserverpb__LeaseRevokeResponse out;
    etcdserverpb__lease_revoke_response__init(&out);
    out.header = &ph;
    rpc_reply(c, &out.base);
}

static void lease_revoke(rpc_call *c, const uint8_t *req, size_t len)
{
    if (etcd_entry_too_large(c, len))
        return;
    Etcdserverpb__LeaseRevokeRequest *m = (Etcdserverpb__LeaseRevokeRequest *)rpc_unpack(
        c, &etcdserverpb__lease_revoke_request__descriptor, req, len);
    if (!m)
        return;
    cairn_header *h = (cairn_header *)(void *)c->scratch;
    int rc = cairn_store_lease_revoke_async(etcd_node(c)->store, h, m->id, revoke_done, c);
    if (rc != 0)
        rpc_fail(c, rc, NULL);
}

static void lease_time_to_live(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__LeaseTimeToLiveRequest *m = (Etcdserverpb__LeaseTimeToLiveRequest *)rpc_unpack(
        c, &etcdserverpb__lease_time_to_live_request__descriptor, req, len);
    if (!m)
        return;
    cairn_lease_ttl_resp t;
    memset(&t, 0, sizeof t);
    int rc = cairn_store_lease_ttl(etcd_node(c)->store, &t, m->id, m->keys);
    if (rc != 0) {
        cairn_lease_ttl_resp_destroy(&t);
        rpc_fail(c, rc, NULL);
        return;
    }
    ProtobufCBinaryData *keys = t.nkeys ? calloc(t.nkeys, sizeof *keys) : NULL;
    if (t.nkeys && !keys) {
        cairn_lease_ttl_resp_destroy(&t);
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    for (size_t i = 0; i < t.nkeys; i++) {
        keys[i].data = (uint8_t *)t.keys[i].key;
        keys[i].len = t.keys[i].key_len;
    }
    Etcdserverpb__ResponseHeader ph;
    etcd_header(etcd_node(c), &ph, &t.header);
    Etcdserverpb__LeaseTimeToLiveResponse out;
    etcdserverpb__lease_time_to_live_response__init(&out);
    out.header = &ph;
    out.id = m->id;
    out.ttl = t.ttl;
    out.grantedttl = t.granted_ttl;
    out.keys = keys;
    out.n_keys = t.nkeys;
    rpc_reply(c, &out.base);
    free(keys);
    cairn_lease_ttl_resp_destroy(&t);
}

static void lease_leases(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__lease_leases_request__descriptor, req, len))
        return;
    int64_t *ids = NULL;
    size_t n = 0;
    int rc = cairn_store_lease_list(etcd_node(c)->store, &ids, &n);
    Etcdserverpb__LeaseStatus *st = calloc(n + 1, sizeof *st);
    Etcdserverpb__LeaseStatus **ptrs = calloc(n + 1, sizeof *ptrs);
    if (rc == 0 && (!st || !ptrs))
        rc = CAIRN_ENOMEM;
    if (rc != 0) {
        free(ids);
        free(st);
        free(ptrs);
        rpc_fail(c, rc, NULL);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        etcdserverpb__lease_status__init(&st[i]);
        st[i].id = ids[i];
        ptrs[i] = &st[i];
    }
    Etcdserverpb__ResponseHeader ph;
    etcd_header(etcd_node(c), &ph, NULL);
    Etcdserverpb__LeaseLeasesResponse out;
    etcdserverpb__lease_leases_response__init(&out);
    out.header = &ph;
    out.leases = ptrs;
    out.n_leases = n;
    rpc_reply(c, &out.base);
    free(ids);
    free(st);
    free(ptrs);
}

/* ---- LeaseKeepAlive: receive a request, answer it, receive the next ---- */

static void ka_recv(rpc_call *c, int ok);

static void ka_sent(rpc_call *c, int ok)
{
    if (!ok) {
        rpc_fail(c, CAIRN_ESTOPPED, "cairn: keepalive stream closed");
        return;
    }
    rpc_stream_recv(c, ka_recv);
}

static void ka_recv(rpc_call *c, int ok)
{
    if (!ok || !c->payload) { /* the client closed its side, or cancelled */
        rpc_reply(c, NULL);
        return;
    }
    uint8_t *bytes;
    size_t len;
    int rc = rpc_payload_take(c, &bytes, &len);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    Etcdserverpb__LeaseKeepAliveRequest *m = etcdserverpb__lease_keep_alive_request__unpack(
        NULL, len, bytes);
    free(bytes);
    if (!m) {
        rpc_fail(c, CAIRN_EUNMARSHAL, ETCD_STREAM_UNMARSHAL);
        return;
    }
    int64_t ttl = 0;
    rc = cairn_store_lease_keepalive(etcd_node(c)->store, &ttl, m->id);
    int64_t id = m->id;
    etcdserverpb__lease_keep_alive_request__free_unpacked(m, NULL);
    if (rc == CAIRN_ELEASENOTFOUND) /* etcd: an unknown lease answers TTL 0 */
        ttl = 0;
    else if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    Etcdserverpb__ResponseHeader ph;
    etcd_header(etcd_node(c), &ph, NULL);
    Etcdserverpb__LeaseKeepAliveResponse out;
    etcdserverpb__lease_keep_alive_response__init(&out);
    out.header = &ph;
    out.id = id;
    out.ttl = ttl;
    rpc_stream_send(c, &out.base, ka_sent);
}

/* The call is over; its receive completes too (ka_recv ends it). */
static void ka_closed(rpc_call *c)
{
    (void)c;
}

static void lease_keep_alive(rpc_call *c, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    /* etcd: a stream its client cancelled, or whose deadline passed, ends
     * as "no leader" (its only server-side cancel) and is counted in
     * grpc_server_handled_total as Unavailable; one the client half-closed
     * ends with OK. Measured on etcd 3.4.23 (etcdctl lease keep-alive and
     * SIGINT, a deadline, a half-close). */
    if (rpc_notify_close(c, ka_closed, GRPC_STATUS_UNAVAILABLE) != 0) {
        rpc_fail(c, CAIRN_EIO, NULL);
        return;
    }
    rpc_stream_recv(c, ka_recv);
}

static const rpc_method lease_methods[] = {
    {"/etcdserverpb.Lease/LeaseGrant", RPC_UNARY, lease_grant, 2,
     &etcdserverpb__lease_grant_request__descriptor},
    {"/etcdserverpb.Lease/LeaseRevoke", RPC_UNARY, lease_revoke, 2,
     &etcdserverpb__lease_revoke_request__descriptor},
    {"/etcdserverpb.Lease/LeaseKeepAlive", RPC_BIDI, lease_keep_alive, 2,
     &etcdserverpb__lease_keep_alive_request__descriptor},
    {"/etcdserverpb.Lease/LeaseTimeToLive", RPC_UNARY, lease_time_to_live, 1,
     &etcdserverpb__lease_time_to_live_request__descriptor},
    {"/etcdserverpb.Lease/LeaseLeases", RPC_UNARY, lease_leases, 1,
     &etcdserverpb__lease_leases_request__descriptor},
};

const rpc_service etcd_lease_service = {"etcdserverpb.Lease", lease_methods,
                                        sizeof lease_methods / sizeof lease_methods[0], NULL,
                                        etcd_admit};
