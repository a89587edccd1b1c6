/*
 * cairn's Replication service on the client URLs (proto/cairnpb/
 * replication.proto): the node's heads, revision <-> change hash, Range at
 * a set of heads (store/causal.c), and which members hold a state durably,
 * optionally waiting until n of them do.
 *
 * Who holds what. A peer's heads, as its last message reported them
 * (peer_net_acked_heads), are durable on it: a node tells its heads only
 * once the changes are on its disk (DESIGN.md, "Durability"). A member
 * holds a state when every head of the state is an ancestor of (or equal
 * to) one of its acked heads, judged by this node's DAG: a peer head this
 * node has not got yet is ignored, so the answer can come late, never
 * early.
 *
 * WaitReplicated never holds a gRPC worker. The handler checks once and,
 * if too few members hold the state, parks the call with the waiter thread
 * below and returns; the call stays alive until it is answered (rpc.h).
 * The transport's ack callback (a peer's acked heads changed) only raises
 * a flag and signals the thread, which re-judges every parked call and
 * answers those now held or past their deadline, from its own thread
 * (grpc_call_start_batch is thread-safe). So a waiter wakes on the ack
 * itself, not on a poll. Work per wake: parked calls x members coverage
 * checks; the parked calls are bounded (REPL_MAX_WAITERS, beyond it
 * RESOURCE_EXHAUSTED) and so are their timeouts (REPL_MAX_TIMEOUT_MS).
 * At shutdown the engine's stopping hook answers every parked call
 * (UNAVAILABLE, etcd's "server stopped") and joins the thread.
 */
#include "server/cairn/cairn.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cairnpb/replication.pb-c.h"
#include "crdt/error.h"
#include "server/node.h"
#include "server/peer/peer.h"
#include "store/replica.h"

#define REPL_DEFAULT_TIMEOUT_MS 5000u
#define REPL_MAX_TIMEOUT_MS 600000u
#define REPL_MAX_WAITERS 10000u
#define REPL_MAX_HEADS 4096u
#define REPL_MAX_MEMBERS 1024u

/* ---- small helpers ------------------------------------------------------------ */

static void hex_of(char out[65], const cairn_hash *h)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof h->b; i++) {
        out[2 * i] = d[h->b[i] >> 4];
        out[2 * i + 1] = d[h->b[i] & 15];
    }
    out[64] = 0;
}

/* "not here yet", naming the change: FAILED_PRECONDITION for a state to
 * read or judge (rc CAIRN_ENOTHERE), NOT_FOUND for a lookup (ENOTFOUND). */
static void fail_not_here(rpc_call *c, int rc, const cairn_hash *missing)
{
    char hex[65], msg[160];
    hex_of(hex, missing);
    snprintf(msg, sizeof msg, "cairn: not here yet: change %s is not on this member", hex);
    rpc_fail(c, rc, msg);
}

/* Views of hashes as protobuf bytes (borrowed from |h|). */
static ProtobufCBinaryData *bytes_of(const cairn_hash *h, size_t n)
{
    ProtobufCBinaryData *b = calloc(n ? n : 1, sizeof *b);
    for (size_t i = 0; b && i < n; i++) {
        b[i].data = (uint8_t *)h[i].b;
        b[i].len = sizeof h[i].b;
    }
    return b;
}

/* Heads from a request into a new array (*out, caller frees; NULL for
 * none): each 32 bytes, at most REPL_MAX_HEADS. *why gets the reason of
 * an EINVAL. No store, so the fuzz target reaches it. */
static int heads_of(cairn_hash **out, const char **why, const ProtobufCBinaryData *hb, size_t nh)
{
    *out = NULL;
    *why = NULL;
    if (nh > REPL_MAX_HEADS) {
        *why = "cairn: too many heads";
        return CAIRN_EINVAL;
    }
    for (size_t i = 0; i < nh; i++)
        if (hb[i].len != sizeof((cairn_hash *)0)->b) {
            *why = "cairn: a head is a 32-byte change hash";
            return CAIRN_EINVAL;
        }
    if (!nh)
        return 0;
    cairn_hash *h = malloc(nh * sizeof *h);
    if (!h)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < nh; i++)
        memcpy(h[i].b, hb[i].data, sizeof h[i].b);
    *out = h;
    return 0;
}

/* The state a request names: |heads| (each here), else the change that
 * made |revision|, else the current heads. *out new array (caller frees).
 * Fails the call itself and returns < 0. */
static int state_of(rpc_call *c, cairn_store *s, int64_t revision, const ProtobufCBinaryData *hb,
                    size_t nh, cairn_hash **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    int rc = 0;
    if (nh) {
        cairn_hash *h;
        const char *why;
        rc = heads_of(&h, &why, hb, nh);
        if (rc) {
            rpc_fail(c, rc, why);
            return rc;
        }
        cairn_hash missing;
        rc = cairn_store_heads_here(s, h, nh, &missing);
        if (rc) {
            free(h);
            if (rc == CAIRN_ENOTHERE)
                fail_not_here(c, CAIRN_ENOTHERE, &missing);
            else
                rpc_fail(c, rc, NULL);
            return rc;
        }
        *out = h;
        *n = nh;
        return 0;
    }
    if (revision) {
        cairn_hash *h = malloc(sizeof *h);
        rc = h ? cairn_store_rev_to_hash(s, h, revision) : CAIRN_ENOMEM;
        if (rc) {
            free(h);
            rpc_fail(c, rc, rc == CAIRN_ENOTFOUND ? "cairn: no change made this revision" : NULL);
            return rc;
        }
        *out = h;
        *n = 1;
        return 0;
    }
    rc = cairn_store_heads(s, out, n);
    if (rc)
        rpc_fail(c, rc, NULL);
    return rc;
}

static size_t other_members(cairn_server *srv)
{
    return srv->peer ? peer_net_stats(srv->peer, NULL, 0) : 0;
}

/* How many members other than this one hold |want|, their ids in |ids|
 * (up to |cap|). < 0: the store failed. */
static int holders(cairn_server *srv, const cairn_hash *want, size_t nwant, uint64_t *ids,
                   size_t cap)
{
    size_t np = other_members(srv);
    if (np > REPL_MAX_MEMBERS)
        np = REPL_MAX_MEMBERS;
    peer_stats *ps = np ? calloc(np, sizeof *ps) : NULL;
    if (np && !ps)
        return CAIRN_ENOMEM;
    size_t got = np ? peer_net_stats(srv->peer, ps, np) : 0;
    if (got < np)
        np = got;
    int k = 0;
    for (size_t i = 0; i < np; i++) {
        cairn_hash *acked;
        size_t na;
        if (peer_net_acked_heads(srv->peer, ps[i].id, &acked, &na))
            continue;
        int held = na ? cairn_store_heads_cover(srv->store, want, nwant, acked, na) : 0;
        free(acked);
        if (held < 0) {
            free(ps);
            return held;
        }
        if (held) {
            if ((size_t)k < cap)
                ids[k] = ps[i].id;
            k++;
        }
    }
    free(ps);
    return k;
}

/* ---- the unary calls ------------------------------------------------------------ */

static void replication_heads(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &cairnpb__heads_request__descriptor, req, len))
        return;
    cairn_server *srv = c->arg;
    cairn_hash *heads;
    size_t n;
    int rc = cairn_store_heads(srv->store, &heads, &n);
    ProtobufCBinaryData *hb = rc ? NULL : bytes_of(heads, n);
    if (!rc && !hb)
        rc = CAIRN_ENOMEM;
    if (rc) {
        free(heads);
        rpc_fail(c, rc, NULL);
        return;
    }
    Cairnpb__HeadsResponse out = CAIRNPB__HEADS_RESPONSE__INIT;
    out.member_id = cairn_store_member_id(srv->store);
    out.heads = hb;
    out.n_heads = n;
    rpc_reply(c, &out.base);
    free(hb);
    free(heads);
}

static void replication_change_bytes(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &cairnpb__change_bytes_request__descriptor, req, len))
        return;
    cairn_server *srv = c->arg;
    Cairnpb__ChangeBytesResponse out = CAIRNPB__CHANGE_BYTES_RESPONSE__INIT;
    int rc = cairn_store_change_bytes(srv->store, &out.changes, &out.bytes);
    if (rc) {
        rpc_fail(c, rc, NULL);
        return;
    }
    rpc_reply(c, &out.base);
}

static void replication_rev_to_hash(rpc_call *c, const uint8_t *req, size_t len)
{
    Cairnpb__RevisionToHashRequest *q = (Cairnpb__RevisionToHashRequest *)rpc_unpack(
        c, &cairnpb__revision_to_hash_request__descriptor, req, len);
    if (!q)
        return;
    cairn_server *srv = c->arg;
    cairn_hash h;
    int rc = cairn_store_rev_to_hash(srv->store, &h, q->revision);
    if (rc) {
        rpc_fail(c, rc, rc == CAIRN_ENOTFOUND ? "cairn: no change made this revision" : NULL);
        return;
    }
    Cairnpb__RevisionToHashResponse out = CAIRNPB__REVISION_TO_HASH_RESPONSE__INIT;
    out.hash.data = h.b;
    out.hash.len = sizeof h.b;
    out.member_id = cairn_store_member_id(srv->store);
    rpc_reply(c, &out.base);
}

static void replication_hash_to_rev(rpc_call *c, const uint8_t *req, size_t len)
{
    Cairnpb__HashToRevisionRequest *q = (Cairnpb__HashToRevisionRequest *)rpc_unpack(
        c, &cairnpb__hash_to_revision_request__descriptor, req, len);
    if (!q)
        return;
    cairn_server *srv = c->arg;
    cairn_hash h;
    if (q->hash.len != sizeof h.b) {
        rpc_fail(c, CAIRN_EINVAL, "cairn: a change hash is 32 bytes");
        return;
    }
    memcpy(h.b, q->hash.data, sizeof h.b);
    Cairnpb__HashToRevisionResponse out = CAIRNPB__HASH_TO_REVISION_RESPONSE__INIT;
    int took;
    int rc = cairn_store_hash_to_rev(srv->store, &out.revision, &took, &h);
    if (rc == CAIRN_ENOTHERE) {
        fail_not_here(c, CAIRN_ENOTFOUND, &h);
        return;
    }
    if (rc) {
        rpc_fail(c, rc, NULL);
        return;
    }
    out.took_revision = took;
    out.member_id = cairn_store_member_id(srv->store);
    rpc_reply(c, &out.base);
}

static void replication_range(rpc_call *c, const uint8_t *req, size_t len)
{
    Cairnpb__RangeRequest *q =
        (Cairnpb__RangeRequest *)rpc_unpack(c, &cairnpb__range_request__descriptor, req, len);
    if (!q)
        return;
    cairn_server *srv = c->arg;
    if (!q->n_heads) {
        rpc_fail(c, CAIRN_EINVAL, "cairn: Range needs the heads to read at");
        return;
    }
    cairn_hash *heads;
    size_t nh;
    if (state_of(c, srv->store, 0, q->heads, q->n_heads, &heads, &nh))
        return;
    cairn_range_req rq = {0};
    rq.key = q->key.data;
    rq.key_len = q->key.len;
    rq.range_end = q->range_end.data;
    rq.range_end_len = q->range_end.len;
    rq.limit = q->limit;
    rq.keys_only = q->keys_only;
    cairn_heads_range r;
    cairn_hash missing;
    int rc = cairn_store_range_at_heads(srv->store, &r, heads, nh, &rq, 0, &missing);
    free(heads);
    if (rc == CAIRN_ENOTHERE) {
        fail_not_here(c, CAIRN_ENOTHERE, &missing);
        return;
    }
    if (rc) {
        rpc_fail(c, rc, NULL);
        return;
    }
    Cairnpb__KeyValue *kv = calloc(r.nkvs ? r.nkvs : 1, sizeof *kv);
    Cairnpb__KeyValue **kvp = calloc(r.nkvs ? r.nkvs : 1, sizeof *kvp);
    if (!kv || !kvp) {
        free(kv);
        free(kvp);
        cairn_heads_range_destroy(&r);
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    for (size_t i = 0; i < r.nkvs; i++) {
        cairnpb__key_value__init(&kv[i]);
        kv[i].key.data = r.kvs[i].key;
        kv[i].key.len = r.kvs[i].key_len;
        kv[i].value.data = r.kvs[i].value;
        kv[i].value.len = r.kvs[i].value_len;
        kv[i].lease = r.kvs[i].lease;
        kvp[i] = &kv[i];
    }
    Cairnpb__RangeResponse out = CAIRNPB__RANGE_RESPONSE__INIT;
    out.kvs = kvp;
    out.n_kvs = r.nkvs;
    out.more = r.more;
    out.count = r.count;
    out.revision = r.revision;
    out.member_id = cairn_store_member_id(srv->store);
    rpc_reply(c, &out.base);
    free(kvp);
    free(kv);
    cairn_heads_range_destroy(&r);
}

static void replication_status(rpc_call *c, const uint8_t *req, size_t len)
{
    Cairnpb__StatusRequest *q =
        (Cairnpb__StatusRequest *)rpc_unpack(c, &cairnpb__status_request__descriptor, req, len);
    if (!q)
        return;
    cairn_server *srv = c->arg;
    cairn_hash *want;
    size_t nw;
    if (state_of(c, srv->store, q->revision, q->heads, q->n_heads, &want, &nw))
        return;
    peer_stats *ps = NULL;
    size_t np = other_members(srv);
    if (np > REPL_MAX_MEMBERS)
        np = REPL_MAX_MEMBERS;
    size_t nm = np + 1;
    Cairnpb__MemberStatus *ms = calloc(nm, sizeof *ms);
    Cairnpb__MemberStatus **msp = calloc(nm, sizeof *msp);
    cairn_hash **acked = calloc(nm, sizeof *acked);
    ProtobufCBinaryData **ab = calloc(nm, sizeof *ab);
    ProtobufCBinaryData *wb = bytes_of(want, nw);
    ps = calloc(np ? np : 1, sizeof *ps);
    int rc = ms && msp && acked && ab && wb && ps ? 0 : CAIRN_ENOMEM;
    if (!rc && np) {
        size_t got = peer_net_stats(srv->peer, ps, np);
        if (got < np) { /* cannot shrink today; be safe if it ever does */
            np = got;
            nm = np + 1;
        }
    }
    uint32_t holding = 0;
    for (size_t i = 0; !rc && i < nm; i++) {
        cairnpb__member_status__init(&ms[i]);
        msp[i] = &ms[i];
        if (i == np) { /* this member: it is on its disk */
            ms[i].id = cairn_store_member_id(srv->store);
            ms[i].name = (char *)(srv->cfg && srv->cfg->name ? srv->cfg->name : "");
            ms[i].holds = 1;
            ms[i].is_self = 1;
            ms[i].connected = 1;
            continue;
        }
        ms[i].id = ps[i].id;
        ms[i].name = ps[i].name;
        ms[i].connected = ps[i].connected;
        size_t na = 0;
        rc = peer_net_acked_heads(srv->peer, ps[i].id, &acked[i], &na);
        if (rc)
            break;
        int held = na ? cairn_store_heads_cover(srv->store, want, nw, acked[i], na) : 0;
        if (held < 0) {
            rc = held;
            break;
        }
        ms[i].holds = held;
        holding += (uint32_t)held;
        ab[i] = bytes_of(acked[i], na);
        if (!ab[i]) {
            rc = CAIRN_ENOMEM;
            break;
        }
        ms[i].acked_heads = ab[i];
        ms[i].n_acked_heads = na;
    }
    if (rc) {
        rpc_fail(c, rc, NULL);
    } else {
        Cairnpb__StatusResponse out = CAIRNPB__STATUS_RESPONSE__INIT;
        out.heads = wb;
        out.n_heads = nw;
        out.members = msp;
        out.n_members = nm;
        out.holding = holding;
        out.member_id = cairn_store_member_id(srv->store);
        rpc_reply(c, &out.base);
    }
    for (size_t i = 0; acked && ab && i < nm; i++) {
        free(acked[i]);
        free(ab[i]);
    }
    free(acked);
    free(ab);
    free(wb);
    free(ms);
    free(msp);
    free(ps);
    free(want);
}

/* ---- WaitReplicated: the waiter thread ------------------------------------------- */

typedef struct repl_waiter {
    struct repl_waiter *next;
    rpc_call *c;
    cairn_hash *want;
    size_t nwant;
    uint32_t n;
    uint64_t deadline_ms;
} repl_waiter;

struct repl_hub {
    cairn_server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    repl_waiter *head;
    size_t nwaiters;
    int dirty; /* an ack arrived, or a call was parked */
    int stop;
    int started;
    pthread_t th;
    uint64_t ids[REPL_MAX_MEMBERS]; /* the waiter thread's */
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void wait_reply(rpc_call *c, const cairn_hash *want, size_t nw, const uint64_t *ids,
                       size_t cap, int k)
{
    ProtobufCBinaryData *wb = bytes_of(want, nw);
    if (!wb) {
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    Cairnpb__WaitResponse out = CAIRNPB__WAIT_RESPONSE__INIT;
    out.heads = wb;
    out.n_heads = nw;
    out.holding = (uint32_t)k;
    out.members = (uint64_t *)ids;
    out.n_members = (size_t)k < cap ? (size_t)k : cap;
    rpc_reply(c, &out.base);
    free(wb);
}

static void wait_timeout(rpc_call *c, int k, uint32_t n)
{
    char msg[160];
    snprintf(msg, sizeof msg,
             "cairn: not replicated before the deadline: %d of the %" PRIu32
             " members needed hold it durably",
             k, n);
    rpc_fail(c, CAIRN_ENOTREPLICATED, msg);
}

static void waiter_free(repl_waiter *w)
{
    free(w->want);
    free(w);
}

/* Judges every parked call and answers the settled ones. Runs on the
 * waiter thread: it takes the whole list, judges it without the lock (the
 * coverage checks read the store), and puts back what is still waiting
 * before the calls parked meanwhile. */
static void judge_all(struct repl_hub *h, uint64_t now)
{
    pthread_mutex_lock(&h->mu);
    repl_waiter *w = h->head;
    h->head = NULL;
    pthread_mutex_unlock(&h->mu);
    repl_waiter *keep = NULL, **tail = &keep;
    size_t settled = 0;
    while (w) {
        repl_waiter *next = w->next;
        int k = holders(h->srv, w->want, w->nwant, h->ids, REPL_MAX_MEMBERS);
        if (k >= 0 && (uint32_t)k < w->n && now < w->deadline_ms) {
            w->next = NULL;
            *tail = w;
            tail = &w->next;
        } else {
            if (k < 0)
                rpc_fail(w->c, k, NULL);
            else if ((uint32_t)k >= w->n)
                wait_reply(w->c, w->want, w->nwant, h->ids, REPL_MAX_MEMBERS, k);
            else
                wait_timeout(w->c, k, w->n);
            waiter_free(w);
            settled++;
        }
        w = next;
    }
    pthread_mutex_lock(&h->mu);
    *tail = h->head;
    h->head = keep;
    h->nwaiters -= settled;
    pthread_mutex_unlock(&h->mu);
}

static void *waiter_main(void *arg)
{
    struct repl_hub *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        if (!h->dirty) {
            uint64_t next = 0;
            for (repl_waiter *w = h->head; w; w = w->next)
                if (!next || w->deadline_ms < next)
                    next = w->deadline_ms;
            if (!next) {
                pthread_cond_wait(&h->cv, &h->mu);
            } else {
                uint64_t now = mono_ms();
                if (next > now) {
                    struct timespec ts;
                    clock_gettime(CLOCK_MONOTONIC, &ts);
                    uint64_t wait = next - now;
                    ts.tv_sec += (time_t)(wait / 1000u);
                    ts.tv_nsec += (long)(wait % 1000u) * 1000000L;
                    if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                    }
                    pthread_cond_timedwait(&h->cv, &h->mu, &ts);
                }
            }
        }
        if (h->stop)
            break;
        h->dirty = 0;
        pthread_mutex_unlock(&h->mu);
        judge_all(h, mono_ms());
        pthread_mutex_lock(&h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* The transport's ack callback (peer thread): wake the waiter thread. */
static void on_ack(void *arg)
{
    struct repl_hub *h = arg;
    pthread_mutex_lock(&h->mu);
    h->dirty = 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

int cairn_repl_hub_new(cairn_server *srv)
{
    struct repl_hub *h = calloc(1, sizeof *h);
    if (!h)
        return CAIRN_ENOMEM;
    h->srv = srv;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&h->th, NULL, waiter_main, h)) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return CAIRN_ENOMEM;
    }
    h->started = 1;
    srv->repl = h;
    if (srv->peer)
        peer_net_set_ack_cb(srv->peer, on_ack, h);
    return 0;
}

/* Answers every parked call (etcd's "server stopped") and joins the
 * thread. Idempotent. */
static void hub_stop(struct repl_hub *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (h->started) {
        pthread_join(h->th, NULL);
        h->started = 0;
    }
    pthread_mutex_lock(&h->mu);
    repl_waiter *w = h->head;
    h->head = NULL;
    h->nwaiters = 0;
    pthread_mutex_unlock(&h->mu);
    while (w) {
        repl_waiter *next = w->next;
        rpc_fail(w->c, CAIRN_ESTOPPED, NULL);
        waiter_free(w);
        w = next;
    }
}

void cairn_repl_hub_free(cairn_server *srv)
{
    struct repl_hub *h = srv->repl;
    if (!h)
        return;
    hub_stop(h);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
    srv->repl = NULL;
}

static void replication_stopping(void *arg)
{
    cairn_server *srv = arg;
    hub_stop(srv->repl);
}

static void replication_wait(rpc_call *c, const uint8_t *req, size_t len)
{
    Cairnpb__WaitRequest *q =
        (Cairnpb__WaitRequest *)rpc_unpack(c, &cairnpb__wait_request__descriptor, req, len);
    if (!q)
        return;
    cairn_server *srv = c->arg;
    size_t others = other_members(srv);
    if (q->n > others) {
        char msg[120];
        snprintf(msg, sizeof msg, "cairn: n is %" PRIu32 " but this cluster has %zu other members",
                 q->n, others);
        rpc_fail(c, CAIRN_EINVAL, msg);
        return;
    }
    cairn_hash *want;
    size_t nw;
    if (state_of(c, srv->store, q->revision, q->heads, q->n_heads, &want, &nw))
        return;
    uint64_t ids[64];
    int k = q->n ? holders(srv, want, nw, ids, 64) : 0;
    if (k < 0 || (uint32_t)k >= q->n) {
        if (k < 0)
            rpc_fail(c, k, NULL);
        else
            wait_reply(c, want, nw, ids, 64, k);
        free(want);
        return;
    }
    uint64_t timeout = q->timeout_ms ? q->timeout_ms : REPL_DEFAULT_TIMEOUT_MS;
    if (timeout > REPL_MAX_TIMEOUT_MS)
        timeout = REPL_MAX_TIMEOUT_MS;
    /* the call's own deadline, when sooner */
    gpr_timespec dl = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(dl, gpr_inf_future(GPR_CLOCK_MONOTONIC)) != 0) {
        int64_t left = gpr_time_to_millis(gpr_time_sub(dl, now));
        if (left < 0)
            left = 0;
        if ((uint64_t)left < timeout)
            timeout = (uint64_t)left;
    }
    struct repl_hub *h = srv->repl;
    repl_waiter *w = calloc(1, sizeof *w);
    if (!w || !h) {
        free(w);
        free(want);
        rpc_fail(c, h ? CAIRN_ENOMEM : CAIRN_ESTOPPED, NULL);
        return;
    }
    w->c = c;
    w->want = want;
    w->nwant = nw;
    w->n = q->n;
    w->deadline_ms = mono_ms() + timeout;
    pthread_mutex_lock(&h->mu);
    int refuse = h->stop                           ? CAIRN_ESTOPPED
                 : h->nwaiters >= REPL_MAX_WAITERS ? CAIRN_ETOOMANYREQUESTS
                                                   : 0;
    if (!refuse) {
        w->next = h->head;
        h->head = w;
        h->nwaiters++;
        h->dirty = 1; /* an ack may have come between the check and now */
        pthread_cond_signal(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    if (refuse) {
        waiter_free(w);
        rpc_fail(c, refuse, NULL);
    }
}

static const rpc_method replication_methods[] = {
    {"/cairnpb.Replication/Heads", RPC_UNARY, replication_heads, 1, NULL},
    {"/cairnpb.Replication/ChangeBytes", RPC_UNARY, replication_change_bytes, 1, NULL},
    {"/cairnpb.Replication/RevisionToHash", RPC_UNARY, replication_rev_to_hash, 1, NULL},
    {"/cairnpb.Replication/HashToRevision", RPC_UNARY, replication_hash_to_rev, 1, NULL},
    {"/cairnpb.Replication/Range", RPC_UNARY, replication_range, 1, NULL},
    {"/cairnpb.Replication/ReplicationStatus", RPC_UNARY, replication_status, 1, NULL},
    {"/cairnpb.Replication/WaitReplicated", RPC_UNARY, replication_wait, 1, NULL},
};

const rpc_service cairn_replication_service = {
    "cairnpb.Replication", replication_methods,
    sizeof replication_methods / sizeof replication_methods[0], replication_stopping, NULL};

/* ---- for the fuzz target: a request's decoding and checks, no store ---- */

int cairn_repl_decode_request(int kind, const uint8_t *req, size_t len)
{
    static const ProtobufCMessageDescriptor *const descs[] = {
        &cairnpb__revision_to_hash_request__descriptor,
        &cairnpb__hash_to_revision_request__descriptor,
        &cairnpb__range_request__descriptor,
        &cairnpb__status_request__descriptor,
        &cairnpb__wait_request__descriptor,
    };
    if (kind < 0 || (size_t)kind >= sizeof descs / sizeof descs[0])
        return CAIRN_EINVAL;
    ProtobufCMessage *m = protobuf_c_message_unpack(descs[kind], NULL, len, req);
    if (!m)
        return CAIRN_EUNMARSHAL;
    const ProtobufCBinaryData *hb = NULL;
    size_t nh = 0;
    int rc = 0;
    if (kind == 1) {
        const Cairnpb__HashToRevisionRequest *q = (const void *)m;
        rc = q->hash.len == 32 ? 0 : CAIRN_EINVAL;
    } else if (kind == 2) {
        const Cairnpb__RangeRequest *q = (const void *)m;
        hb = q->heads;
        nh = q->n_heads;
        rc = nh ? 0 : CAIRN_EINVAL;
    } else if (kind == 3) {
        const Cairnpb__StatusRequest *q = (const void *)m;
        hb = q->heads;
        nh = q->n_heads;
    } else if (kind == 4) {
        const Cairnpb__WaitRequest *q = (const void *)m;
        hb = q->heads;
        nh = q->n_heads;
    }
    if (!rc) {
        cairn_hash *h;
        const char *why;
        rc = heads_of(&h, &why, hb, nh);
        free(h);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}
