/*
 * etcd's Lease service over the store's minimal leases (the store records
 * that a lease exists and its TTL; revoking deletes the lease and its keys
 * in one change). What the store does not keep yet — when a lease expires —
 * lives here, in memory: a table of lease id -> granted TTL and deadline,
 * and one expiry thread that revokes a lease once its deadline passes
 * (checked every 100 ms, so a lease lives at most 100 ms past its TTL).
 *
 * Known gap until the store's lease module persists deadlines: a restart
 * forgets the deadlines, so leases granted before it stay until revoked.
 *
 * Grant and revoke wait for their change to be durable (the store offers
 * only blocking calls for leases); they are rare next to KV writes. The
 * table is an array searched linearly: O(leases) per call, fine for the
 * hundreds of leases a node typically holds.
 */
#include "server/rpc.h"

#include "crdt/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>

/* etcd: TTLs are raised to the minimum (1.5 election timeouts: 2 s with the
 * defaults, measured) and refused above 9e9 s ("too large lease TTL"). */
#define LEASE_MIN_TTL 2
#define LEASE_MAX_TTL 9000000000LL
#define EXPIRY_TICK_MS 100

typedef struct lease {
    int64_t id;
    int64_t ttl;         /* granted */
    uint64_t deadline;   /* CLOCK_MONOTONIC ms */
} lease;

struct lease_table {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lease *v;
    size_t n;
    uint64_t next_id;
    int stop;
    pthread_t thread;
    int running;
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static lease *find(struct lease_table *t, int64_t id)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].id == id)
            return &t->v[i];
    return NULL;
}

static void forget(struct lease_table *t, int64_t id)
{
    lease *l = find(t, id);
    if (l)
        *l = t->v[--t->n];
}

static void *expiry_main(void *arg)
{
    cairn_server *srv = arg;
    struct lease_table *t = srv->leases;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        uint64_t now = mono_ms();
        int64_t due = 0;
        int found = 0;
        for (size_t i = 0; i < t->n; i++)
            if (t->v[i].deadline <= now) {
                due = t->v[i].id;
                found = 1;
                break;
            }
        if (found) {
            /* Revoke outside the lock: it waits for an fsync. */
            pthread_mutex_unlock(&t->mu);
            cairn_header h;
            int rc = cairn_store_lease_revoke(srv->store, &h, due);
            pthread_mutex_lock(&t->mu);
            lease *l = find(t, due);
            if (rc == 0 || rc == CAIRN_ELEASENOTFOUND) {
                forget(t, due); /* a keepalive racing with expiry loses */
                cairn_log(CAIRN_LOG_DEBUG, "lease %lld expired", (long long)due);
            } else {
                cairn_log(CAIRN_LOG_ERROR, "revoking expired lease %lld: %s", (long long)due,
                          cairn_strerror(rc));
                if (l)
                    l->deadline = mono_ms() + 1000; /* retry later */
            }
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += EXPIRY_TICK_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->cv, &t->mu, &until);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int lease_start(cairn_server *srv)
{
    struct lease_table *t = calloc(1, sizeof *t);
    if (!t)
        return CAIRN_ENOMEM;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    srv->leases = t;
    if (pthread_create(&t->thread, NULL, expiry_main, srv) != 0)
        return CAIRN_ENOMEM;
    t->running = 1;
    return 0;
}

void lease_stop(cairn_server *srv)
{
    struct lease_table *t = srv->leases;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (t->running)
        pthread_join(t->thread, NULL);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t->v);
    free(t);
    srv->leases = NULL;
}

/* etcd: a lease id the server picks is its request id generator's next
 * value with the top bit cleared: member id's low 16 bits, then time. */
static int64_t pick_id(cairn_server *srv, struct lease_table *t)
{
    if (t->next_id == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
        t->next_id = (cairn_store_member_id(srv->store) & 0xffffu) << 48 |
                     (ms & 0xffffffffffu) << 8;
    }
    int64_t id;
    do
        id = (int64_t)(++t->next_id & (((uint64_t)1 << 63) - 1));
    while (id == 0 || find(t, id));
    return id;
}

void lease_grant(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__LeaseGrantRequest *m = (Etcdserverpb__LeaseGrantRequest *)rpc_unpack(
        c, &etcdserverpb__lease_grant_request__descriptor, req, len);
    if (!m)
        return;
    cairn_server *srv = c->srv;
    if (m->ttl > LEASE_MAX_TTL) {
        rpc_fail(c, CAIRN_ELEASETTLTOOLARGE, NULL);
        return;
    }
    int rc = rpc_quota_check(srv, len);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    int64_t ttl = m->ttl < LEASE_MIN_TTL ? LEASE_MIN_TTL : m->ttl;
    struct lease_table *t = srv->leases;
    pthread_mutex_lock(&t->mu);
    int64_t id = m->id != 0 ? m->id : pick_id(srv, t);
    pthread_mutex_unlock(&t->mu);
    rpc_write_begin(c);
    rc = cairn_store_lease_grant(srv->store, id, ttl);
    rpc_write_end(c);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    pthread_mutex_lock(&t->mu);
    lease *l = find(t, id);
    if (!l) {
        lease *grown = realloc(t->v, (t->n + 1) * sizeof *grown);
        if (grown) {
            t->v = grown;
            l = &t->v[t->n++];
        }
    }
    if (l) {
        l->id = id;
        l->ttl = ttl;
        l->deadline = mono_ms() + (uint64_t)ttl * 1000u;
    }
    pthread_mutex_unlock(&t->mu);
    if (!l)
        cairn_log(CAIRN_LOG_ERROR, "out of memory: lease %lld will not expire", (long long)id);
    Etcdserverpb__ResponseHeader ph;
    rpc_header(srv, &ph, NULL);
    Etcdserverpb__LeaseGrantResponse out;
    etcdserverpb__lease_grant_response__init(&out);
    out.header = &ph;
    out.id = id;
    out.ttl = ttl;
    rpc_reply(c, &out.base);
}

void lease_revoke(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__LeaseRevokeRequest *m = (Etcdserverpb__LeaseRevokeRequest *)rpc_unpack(
        c, &etcdserverpb__lease_revoke_request__descriptor, req, len);
    if (!m)
        return;
    cairn_server *srv = c->srv;
    cairn_header h;
    rpc_write_begin(c);
    int rc = cairn_store_lease_revoke(srv->store, &h, m->id);
    rpc_write_end(c);
    pthread_mutex_lock(&srv->leases->mu);
    if (rc == 0 || rc == CAIRN_ELEASENOTFOUND)
        forget(srv->leases, m->id);
    pthread_mutex_unlock(&srv->leases->mu);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    Etcdserverpb__ResponseHeader ph;
    rpc_header(srv, &ph, &h);
    Etcdserverpb__LeaseRevokeResponse out;
    etcdserverpb__lease_revoke_response__init(&out);
    out.header = &ph;
    rpc_reply(c, &out.base);
}

/* Remaining whole seconds (etcd truncates), or -1 if unknown. */
static int64_t remaining(struct lease_table *t, int64_t id, int64_t *granted)
{
    lease *l = find(t, id);
    if (!l)
        return -1;
    uint64_t now = mono_ms();
    *granted = l->ttl;
    return l->deadline > now ? (int64_t)((l->deadline - now) / 1000u) : 0;
}

/* The keys attached to |id|, paging through the key space. */
static int lease_keys(cairn_server *srv, ProtobufCBinaryData **out, size_t *nout, int64_t id)
{
    static const uint8_t zero = 0;
    ProtobufCBinaryData *keys = NULL;
    size_t n = 0;
    uint8_t *next = NULL;
    size_t next_len = 0;
    int rc = 0;
    for (;;) {
        cairn_range_req r;
        memset(&r, 0, sizeof r);
        r.key = next ? next : &zero;
        r.key_len = next ? next_len : 1;
        r.range_end = &zero;
        r.range_end_len = 1;
        r.limit = 1000;
        r.keys_only = 1;
        cairn_range_resp resp;
        memset(&resp, 0, sizeof resp);
        rc = cairn_store_range(srv->store, &resp, &r);
        for (size_t i = 0; rc == 0 && i < resp.nkvs; i++) {
            if (resp.kvs[i].lease != id)
                continue;
            ProtobufCBinaryData *grown = realloc(keys, (n + 1) * sizeof *grown);
            uint8_t *k = malloc(resp.kvs[i].key_len + 1);
            if (!grown || !k) {
                free(k);
                if (grown)
                    keys = grown;
                rc = CAIRN_ENOMEM;
                break;
            }
            keys = grown;
            memcpy(k, resp.kvs[i].key, resp.kvs[i].key_len);
            keys[n].data = k;
            keys[n].len = resp.kvs[i].key_len;
            n++;
        }
        int more = rc == 0 && resp.more && resp.nkvs > 0;
        if (more) {
            const cairn_kv *last = &resp.kvs[resp.nkvs - 1];
            uint8_t *k = realloc(next, last->key_len + 1);
            if (!k)
                rc = CAIRN_ENOMEM, more = 0;
            else {
                memcpy(k, last->key, last->key_len);
                k[last->key_len] = 0;
                next = k;
                next_len = last->key_len + 1;
            }
        }
        cairn_range_resp_destroy(&resp);
        if (!more)
            break;
    }
    free(next);
    *out = keys;
    *nout = n;
    return rc;
}

void lease_time_to_live(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__LeaseTimeToLiveRequest *m = (Etcdserverpb__LeaseTimeToLiveRequest *)rpc_unpack(
        c, &etcdserverpb__lease_time_to_live_request__descriptor, req, len);
    if (!m)
        return;
    cairn_server *srv = c->srv;
    int64_t granted = 0;
    pthread_mutex_lock(&srv->leases->mu);
    int64_t ttl = remaining(srv->leases, m->id, &granted);
    pthread_mutex_unlock(&srv->leases->mu);
    Etcdserverpb__LeaseTimeToLiveResponse out;
    etcdserverpb__lease_time_to_live_response__init(&out);
    ProtobufCBinaryData *keys = NULL;
    size_t nkeys = 0;
    /* etcd: an unknown lease is not an error here: TTL -1, no keys. */
    if (ttl >= 0 && m->keys) {
        int rc = lease_keys(srv, &keys, &nkeys, m->id);
        if (rc != 0) {
            for (size_t i = 0; i < nkeys; i++)
                free(keys[i].data);
            free(keys);
            rpc_fail(c, rc, NULL);
            return;
        }
    }
    Etcdserverpb__ResponseHeader ph;
    rpc_header(srv, &ph, NULL);
    out.header = &ph;
    out.id = m->id;
    out.ttl = ttl;
    out.grantedttl = granted;
    out.keys = keys;
    out.n_keys = nkeys;
    rpc_reply(c, &out.base);
    for (size_t i = 0; i < nkeys; i++)
        free(keys[i].data);
    free(keys);
}

void lease_leases(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__lease_leases_request__descriptor, req, len))
        return;
    cairn_server *srv = c->srv;
    struct lease_table *t = srv->leases;
    pthread_mutex_lock(&t->mu);
    size_t n = t->n;
    Etcdserverpb__LeaseStatus *st = calloc(n + 1, sizeof *st);
    Etcdserverpb__LeaseStatus **ptrs = calloc(n + 1, sizeof *ptrs);
    for (size_t i = 0; st && ptrs && i < n; i++) {
        etcdserverpb__lease_status__init(&st[i]);
        st[i].id = t->v[i].id;
        ptrs[i] = &st[i];
    }
    pthread_mutex_unlock(&t->mu);
    if (!st || !ptrs) {
        free(st);
        free(ptrs);
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    Etcdserverpb__ResponseHeader ph;
    rpc_header(srv, &ph, NULL);
    Etcdserverpb__LeaseLeasesResponse out;
    etcdserverpb__lease_leases_response__init(&out);
    out.header = &ph;
    out.leases = ptrs;
    out.n_leases = n;
    rpc_reply(c, &out.base);
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
    if (!ok || !c->payload) { /* the client closed its side */
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
        rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
        return;
    }
    cairn_server *srv = c->srv;
    struct lease_table *t = srv->leases;
    int64_t ttl = 0;
    pthread_mutex_lock(&t->mu);
    lease *l = find(t, m->id);
    if (l) { /* etcd: renewing answers the granted TTL; unknown: TTL 0 */
        l->deadline = mono_ms() + (uint64_t)l->ttl * 1000u;
        ttl = l->ttl;
    }
    pthread_mutex_unlock(&t->mu);
    Etcdserverpb__ResponseHeader ph;
    rpc_header(srv, &ph, NULL);
    Etcdserverpb__LeaseKeepAliveResponse out;
    etcdserverpb__lease_keep_alive_response__init(&out);
    out.header = &ph;
    out.id = m->id;
    out.ttl = ttl;
    etcdserverpb__lease_keep_alive_request__free_unpacked(m, NULL);
    rpc_stream_send(c, &out.base, ka_sent);
}

void lease_keep_alive(rpc_call *c, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    rpc_stream_recv(c, ka_recv);
}
