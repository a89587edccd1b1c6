/*
 * etcd's v3lock and v3election services: a lock and a leader election
 * served on the client URL, built, as etcd builds them, from the KV, Lease
 * and Watch API (etcd runs clientv3's concurrency recipes inside the
 * server). Every write goes through the store's Txn, Put, DeleteRange and
 * lease grant, so the recipes are changes like any client's and replicate.
 *
 * The recipe, as etcd 3.4 runs it (measured through its gateway and gRPC;
 * tests/conformance/checks_recipes.py): a contender's key is
 * name/<its lease id in hex>, created with its lease by a Txn "if the key
 * was never created"; the contender with the lowest create revision under
 * name/ holds the lock (leads). A contender waits until no key under the
 * prefix has a lower create revision. Lease 0 means a new lease of 60 s,
 * never kept alive (etcd's session with its default TTL, orphaned at once).
 * Errors of the KV calls reach the client with code Unknown and the
 * store's text (etcd's in-process client turns them into plain errors), as
 * do the recipes' own ("election: not leader"). A contender whose call
 * dies while it waits (the client cancels, its deadline passes) deletes its
 * key (Lock) or resigns (Campaign), as etcd does.
 *
 * Waiting never holds a worker. A waiting call has a stream of the watch
 * hub (store/hub.h) with one watcher: on the prefix for deletes (Lock,
 * Campaign), on the leader's key or the prefix (Observe). The hub's notify
 * (its thread) only schedules the call's state machine on the call's
 * worker (rpc_later); there it drains the hub's batches and looks again
 * with a Range. A watcher made before the Range, live from the hub's
 * revision (never past the store's visible one), cannot miss a change the
 * Range did not see.
 *
 * Threads. Everything of a call runs on its worker: the handler, the store
 * completions and hub notifies (through rpc_later), the close callback
 * (rpc_notify_close) and the stream's send completions. rpc_later keeps one
 * entry per call, so |mu| guards the only state other threads touch: the
 * reasons to run (|ev|) and whether a run is queued (|queued|). A call is
 * answered only from a run with nothing queued (|deferred| otherwise), so
 * no queued run outlives its call.
 *
 * Differences from etcd 3.4, in tests/conformance/ledger.json: a waiting
 * Lock or Campaign whose own key is deleted (its lease revoked or
 * expired) fails at once ("mutex: session is expired", etcd 3.5's text;
 * "election: session is expired"), where etcd 3.4 goes on waiting and
 * then answers the lock or the leadership of a key that no longer exists.
 * Resign with lease 0 grants no lease (etcd grants one it never uses).
 * The lock and the election hold only among the clients of one node: see
 * the README's "Recipes that keep their guarantee only within one node".
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"
#include "store/hub.h"
#include "v3electionpb/v3election.pb-c.h"
#include "v3lockpb/v3lock.pb-c.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* etcd: concurrency's default session TTL, for lease 0 */
#define SESSION_TTL 60

enum { R_LOCK, R_CAMPAIGN, R_OBSERVE, R_PROCLAIM };

/* What the state machine does next. */
enum {
    P_GRANT = 1, /* a lease of SESSION_TTL is being granted */
    P_TXN,       /* the contender's Txn */
    P_PROCLAIM,  /* Campaign: the key existed with another value */
    P_RESIGN,    /* Campaign: that proclaim failed; resigning */
    P_WAIT,      /* waiting for the lower keys to go */
    P_CLEANUP,   /* the call died: deleting the key */
    P_FIND,      /* Observe: look for the leader */
    P_FOLLOW,    /* Observe: following the leader's key */
    P_WAITPUT,   /* Observe: no leader; the first put under the prefix */
};

/* reasons to run (recipe.ev) */
#define EV_STORE 1
#define EV_HUB 2

typedef struct recipe {
    struct recipe *next, **pprev; /* |waiting|, while on it */
    rpc_call *c;
    int kind, phase;
    pthread_mutex_t mu;
    int ev;       /* mu */
    int store_rc; /* mu: the store completion's */
    int queued;   /* mu: a run is queued with rpc_later */
    int ended;    /* mu: answered, or the answer is deferred */
    int deferred; /* the answer waits for the queued run */
    int busy;     /* a store write is in flight */
    int cancelled;
    int sending; /* Observe: a message is in flight */
    int done;    /* end() was called */
    cairn_hub_stream *hs;
    int64_t watch_id;
    /* name/, the prefix's end, the contender's (or followed) key */
    uint8_t *pfx, *pfx_end, *key, *value;
    size_t name_len, pfx_len, key_len, value_len;
    int64_t lease, rev;
    int created; /* the key was created by this call */
    cairn_header hdr;
    cairn_txn_resp txn;
    cairn_lease_grant_resp grant;
    cairn_delete_resp del;
    cairn_hub_batch batch; /* Observe: the batch being sent */
    size_t batch_at;
    /* the answer */
    int ans_rc;
    const char *ans_detail;
    uint8_t *ans;
    size_t ans_len;
} recipe;

static void run(rpc_call *c, int unused);
static void step(recipe *r, int ev, int store_rc);

/* Every call that may wait (Lock, Campaign, Observe), of every server in
 * the process, so that a stopping server cancels its own at once rather
 * than after the engine's grace period. */
static pthread_mutex_t waiting_mu = PTHREAD_MUTEX_INITIALIZER;
static recipe *waiting;

static void waiting_add(recipe *r)
{
    pthread_mutex_lock(&waiting_mu);
    r->next = waiting;
    if (waiting)
        waiting->pprev = &r->next;
    r->pprev = &waiting;
    waiting = r;
    pthread_mutex_unlock(&waiting_mu);
}

/* The services' stopping hook: every waiting call of server |arg| is
 * cancelled (it cleans up as a call whose client left). */
static void recipes_stopping(void *arg)
{
    pthread_mutex_lock(&waiting_mu);
    for (recipe *r = waiting; r; r = r->next)
        if (etcd_node(r->c) == arg)
            grpc_call_cancel(r->c->call, NULL);
    pthread_mutex_unlock(&waiting_mu);
}

/* ---- plumbing ------------------------------------------------------------ */

static void recipe_free(rpc_call *c)
{
    recipe *r = c->ctx;
    if (!r)
        return;
    if (r->pprev) {
        pthread_mutex_lock(&waiting_mu);
        *r->pprev = r->next;
        if (r->next)
            r->next->pprev = r->pprev;
        pthread_mutex_unlock(&waiting_mu);
    }
    cairn_hub_stream_free(r->hs);
    cairn_hub_batch_destroy(&r->batch);
    cairn_txn_resp_destroy(&r->txn);
    cairn_delete_resp_destroy(&r->del);
    pthread_mutex_destroy(&r->mu);
    free(r->pfx);
    free(r->key);
    free(r->value);
    free(r->ans);
    free(r);
    c->ctx = NULL;
}

/* Schedules a run on the call's worker; any thread. */
static void kick(recipe *r, int ev, int store_rc)
{
    pthread_mutex_lock(&r->mu);
    if (!r->ended || ev == EV_STORE) {
        r->ev |= ev;
        if (ev == EV_STORE)
            r->store_rc = store_rc;
        if (!r->queued) {
            r->queued = 1;
            rpc_later(r->c, run, 0);
        }
    }
    pthread_mutex_unlock(&r->mu);
}

static void store_done(void *arg, int rc)
{
    kick(arg, EV_STORE, rc);
}

static void hub_notify(void *arg)
{
    kick(arg, EV_HUB, 0);
}

static void deliver(recipe *r)
{
    if (r->ans_rc)
        rpc_fail(r->c, r->ans_rc, r->ans_detail);
    else if (r->kind == R_OBSERVE)
        rpc_reply(r->c, NULL);
    else
        rpc_reply_raw(r->c, r->ans, r->ans_len);
}

static void run(rpc_call *c, int unused)
{
    (void)unused;
    recipe *r = c->ctx;
    pthread_mutex_lock(&r->mu);
    r->queued = 0;
    int ev = r->ev, rc = r->store_rc;
    r->ev = 0;
    pthread_mutex_unlock(&r->mu);
    if (r->deferred) {
        deliver(r);
        return;
    }
    step(r, ev, rc);
}

/* Ends the call with |rc| (0: the packed |msg|). Worker. */
static void end(recipe *r, int rc, const char *detail, const ProtobufCMessage *msg)
{
    if (r->done)
        return;
    r->done = 1;
    r->ans_rc = rc;
    r->ans_detail = detail;
    if (!rc && msg) {
        r->ans_len = protobuf_c_message_get_packed_size(msg);
        r->ans = malloc(r->ans_len ? r->ans_len : 1);
        if (!r->ans)
            r->ans_rc = CAIRN_ENOMEM;
        else
            protobuf_c_message_pack(msg, r->ans);
    }
    pthread_mutex_lock(&r->mu);
    r->ended = 1;
    int q = r->queued;
    pthread_mutex_unlock(&r->mu);
    if (q) {
        r->deferred = 1;
        return;
    }
    deliver(r);
}

/* etcd: an error of the recipe's KV calls reaches the client as a plain
 * error: code Unknown with the store's text */
static void end_store_error(recipe *r, int rc)
{
    if (r->cancelled)
        end(r, CAIRN_ECANCELLED, NULL, NULL);
    else
        end(r, CAIRN_EPASSED, cairn_strerror(rc), NULL);
}

/* rpc_notify_close's callback: the call is over. Before it was answered,
 * that means it died. */
static void on_close(rpc_call *c)
{
    recipe *r = c->ctx;
    if (!c->cancelled || r->done || r->cancelled)
        return;
    r->cancelled = 1;
    step(r, 0, 0);
}

static uint8_t *dup_bytes(const uint8_t *p, size_t n)
{
    uint8_t *d = malloc(n ? n : 1);
    if (d && n)
        memcpy(d, p, n);
    return d;
}

/* A recipe for |c| on election or lock |name|: its prefix name/ and the
 * prefix's end. NULL (the call failed) without memory. */
static recipe *recipe_new(rpc_call *c, int kind, const ProtobufCBinaryData *name)
{
    recipe *r = calloc(1, sizeof *r);
    uint8_t *p = malloc(2 * (name->len + 1));
    if (!r || !p) {
        free(r);
        free(p);
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    r->c = c;
    r->kind = kind;
    r->name_len = name->len;
    r->pfx = p;
    r->pfx_len = name->len + 1;
    if (name->len)
        memcpy(p, name->data, name->len);
    p[name->len] = '/';
    r->pfx_end = p + r->pfx_len;
    memcpy(r->pfx_end, p, r->pfx_len);
    r->pfx_end[name->len] = '/' + 1;
    c->ctx = r;
    c->ctx_free = recipe_free;
    return r;
}

/* name/<lease in hex> as etcd's fmt %x of an int64 */
static int set_key(recipe *r, int64_t lease)
{
    char hex[24];
    int n = lease < 0 ? snprintf(hex, sizeof hex, "-%" PRIx64, (uint64_t)0 - (uint64_t)lease)
                      : snprintf(hex, sizeof hex, "%" PRIx64, (uint64_t)lease);
    free(r->key);
    r->key_len = r->pfx_len + (size_t)n;
    r->key = malloc(r->key_len);
    if (!r->key)
        return CAIRN_ENOMEM;
    memcpy(r->key, r->pfx, r->pfx_len);
    memcpy(r->key + r->pfx_len, hex, (size_t)n);
    return 0;
}

static void prefix_range(const recipe *r, cairn_range_req *q)
{
    memset(q, 0, sizeof *q);
    q->key = r->pfx;
    q->key_len = r->pfx_len;
    q->range_end = r->pfx_end;
    q->range_end_len = r->pfx_len;
}

/* etcd's WithFirstCreate: the key under the prefix created first */
static void first_create(const recipe *r, cairn_range_req *q)
{
    prefix_range(r, q);
    q->sort_target = CAIRN_SORT_CREATE;
    q->sort_order = CAIRN_SORT_ASCEND;
    q->limit = 1;
}

static Etcdserverpb__ResponseHeader *pb_header(recipe *r, Etcdserverpb__ResponseHeader *ph,
                                               const cairn_header *h)
{
    etcd_header(etcd_node(r->c), ph, h);
    return ph;
}

static int start_txn(recipe *r, const cairn_compare *cmp, const cairn_request_op *succ, size_t ns,
                     const cairn_request_op *fail, size_t nf, int puts)
{
    cairn_server *srv = etcd_node(r->c);
    int rc = puts ? node_quota_check(srv, r->key_len + r->value_len) : 0;
    cairn_txn_resp_destroy(&r->txn);
    memset(&r->txn, 0, sizeof r->txn);
    cairn_txn_req t = {cmp, 1, succ, ns, fail, nf};
    if (!rc)
        rc = cairn_store_txn_async(srv->store, &r->txn, &t, store_done, r);
    if (!rc)
        r->busy = 1;
    return rc;
}

static void create_cmp(const recipe *r, cairn_compare *cmp, int64_t rev)
{
    memset(cmp, 0, sizeof *cmp);
    cmp->result = CAIRN_CMP_EQUAL;
    cmp->target = CAIRN_CMP_CREATE;
    cmp->key = r->key;
    cmp->key_len = r->key_len;
    cmp->create_revision = rev;
}

static void put_op(const recipe *r, cairn_request_op *op)
{
    memset(op, 0, sizeof *op);
    op->type = CAIRN_REQ_PUT;
    op->u.put.key = r->key;
    op->u.put.key_len = r->key_len;
    op->u.put.value = r->value;
    op->u.put.value_len = r->value_len;
    op->u.put.lease = r->lease;
}

static void key_range_op(const recipe *r, cairn_request_op *op)
{
    memset(op, 0, sizeof *op);
    op->type = CAIRN_REQ_RANGE;
    op->u.range.key = r->key;
    op->u.range.key_len = r->key_len;
}

/* Lock and Campaign: "if the key was never created, create it with the
 * lease" (etcd's Mutex.Lock also reads the first holder in the same Txn) */
static int contend(recipe *r)
{
    cairn_compare cmp;
    create_cmp(r, &cmp, 0);
    cairn_request_op succ[2], fail[2];
    put_op(r, &succ[0]);
    key_range_op(r, &fail[0]);
    memset(&succ[1], 0, sizeof succ[1]);
    succ[1].type = CAIRN_REQ_RANGE;
    first_create(r, &succ[1].u.range);
    fail[1] = succ[1];
    size_t n = r->kind == R_LOCK ? 2 : 1;
    r->phase = P_TXN;
    return start_txn(r, &cmp, succ, n, fail, n, 1);
}

/* Grants the session lease when the request has none, then contends. */
static int begin(recipe *r, int64_t lease)
{
    if (lease != 0) {
        r->lease = lease;
        if (set_key(r, lease))
            return CAIRN_ENOMEM;
        return contend(r);
    }
    r->phase = P_GRANT;
    int rc = node_quota_check(etcd_node(r->c), 0);
    if (!rc)
        rc = cairn_store_lease_create_async(etcd_node(r->c)->store, &r->grant, 0, SESSION_TTL,
                                            store_done, r);
    if (!rc)
        r->busy = 1;
    return rc;
}

/* ---- waiting --------------------------------------------------------------- */

/* A hub stream with one watcher on [key, end) (end NULL: the key alone)
 * from |start| (0: live), started at once. */
static int watch(recipe *r, const uint8_t *key, size_t key_len, const uint8_t *end_, size_t end_len,
                 int64_t start, int noput, int nodelete)
{
    cairn_hub_stream_free(r->hs);
    r->hs = NULL;
    int rc = cairn_hub_stream_new(&r->hs, watch_hub_of(etcd_node(r->c)), hub_notify, r);
    if (rc)
        return rc;
    cairn_hub_watch_req q;
    memset(&q, 0, sizeof q);
    q.key = key;
    q.key_len = key_len;
    q.range_end = end_;
    q.range_end_len = end_ ? end_len : 0;
    q.start_revision = start;
    q.noput = noput;
    q.nodelete = nodelete;
    int64_t rev;
    rc = cairn_hub_watch(r->hs, &r->watch_id, &rev, &q);
    if (rc)
        return rc;
    cairn_hub_start(r->hs, r->watch_id);
    return 0;
}

/* Pulls every batch the hub has for a waiter (its content does not matter:
 * the waiter looks again with a Range). */
static int drain(recipe *r)
{
    for (;;) {
        cairn_hub_batch b;
        int rc = cairn_hub_next(r->hs, &b);
        if (rc == CAIRN_HUB_BATCH) {
            int compacted = b.compact_revision != 0;
            cairn_hub_batch_destroy(&b);
            /* etcd: the wait's watch fails, and the call with it */
            if (compacted)
                return CAIRN_ECOMPACTED;
        } else if (rc != CAIRN_HUB_AGAIN)
            return rc < 0 ? rc : 0;
    }
}

static void answer_lock(recipe *r, const cairn_header *h)
{
    Etcdserverpb__ResponseHeader ph;
    V3lockpb__LockResponse out = V3LOCKPB__LOCK_RESPONSE__INIT;
    out.header = pb_header(r, &ph, h);
    out.key.data = r->key;
    out.key.len = r->key_len;
    end(r, 0, NULL, &out.base);
}

static void answer_campaign(recipe *r)
{
    Etcdserverpb__ResponseHeader ph;
    V3electionpb__LeaderKey lk = V3ELECTIONPB__LEADER_KEY__INIT;
    lk.name.data = r->pfx;
    lk.name.len = r->name_len;
    lk.key.data = r->key;
    lk.key.len = r->key_len;
    lk.rev = r->rev;
    lk.lease = r->lease;
    V3electionpb__CampaignResponse out = V3ELECTIONPB__CAMPAIGN_RESPONSE__INIT;
    out.header = pb_header(r, &ph, &r->hdr);
    out.leader = &lk;
    end(r, 0, NULL, &out.base);
}

/* A waiter looks: is its key still there, is any key under the prefix
 * older? Answers or keeps waiting. */
static void look(recipe *r)
{
    cairn_store *s = etcd_node(r->c)->store;
    cairn_range_req q;
    memset(&q, 0, sizeof q);
    q.key = r->key;
    q.key_len = r->key_len;
    q.count_only = 1;
    cairn_range_resp mine = {0}, older = {0};
    int rc = cairn_store_range(s, &mine, &q);
    if (!rc && mine.count == 0) {
        /* cairn: the key is gone (its lease revoked or expired): the call
         * can no longer hold anything (etcd 3.4 waits on, then answers) */
        cairn_range_resp_destroy(&mine);
        end(r, r->kind == R_LOCK ? CAIRN_ESESSIONEXPIRED : CAIRN_ECAMPAIGNLOST, NULL, NULL);
        return;
    }
    prefix_range(r, &q);
    q.max_create_revision = r->rev - 1;
    q.limit = 1;
    q.keys_only = 1;
    if (!rc)
        rc = cairn_store_range(s, &older, &q);
    cairn_range_resp_destroy(&mine);
    if (rc) {
        end_store_error(r, rc);
        return;
    }
    int wait = older.nkvs > 0;
    cairn_header h = older.header;
    cairn_range_resp_destroy(&older);
    if (wait)
        return;
    /* etcd: a Lock answers the header of its last look, a Campaign the
     * header of its Txn */
    if (r->kind == R_LOCK)
        answer_lock(r, &h);
    else
        answer_campaign(r);
}

static void start_wait(recipe *r)
{
    r->phase = P_WAIT;
    int rc = watch(r, r->pfx, r->pfx_len, r->pfx_end, r->pfx_len, 0, 1, 0);
    if (rc) {
        end_store_error(r, rc);
        return;
    }
    look(r);
}

/* The call died while waiting: Lock deletes its key, Campaign resigns. */
static void cleanup(recipe *r)
{
    r->phase = P_CLEANUP;
    cairn_hub_stream_free(r->hs);
    r->hs = NULL;
    int rc;
    if (r->kind == R_LOCK) {
        cairn_delete_req d;
        memset(&d, 0, sizeof d);
        d.key = r->key;
        d.key_len = r->key_len;
        rc = cairn_store_delete_async(etcd_node(r->c)->store, &r->del, &d, store_done, r);
        if (!rc)
            r->busy = 1;
    } else {
        cairn_compare cmp;
        create_cmp(r, &cmp, r->rev);
        cairn_request_op del;
        memset(&del, 0, sizeof del);
        del.type = CAIRN_REQ_DELETE;
        del.u.del.key = r->key;
        del.u.del.key_len = r->key_len;
        rc = start_txn(r, &cmp, &del, 1, NULL, 0, 0);
    }
    if (rc)
        end(r, CAIRN_ECANCELLED, NULL, NULL);
}

/* ---- Observe --------------------------------------------------------------- */

static void observe_next(recipe *r);

static void observe_sent(rpc_call *c, int ok)
{
    recipe *r = c->ctx;
    r->sending = 0;
    if (!ok || r->cancelled) {
        r->cancelled = 1;
        end(r, CAIRN_ECANCELLED, NULL, NULL);
        return;
    }
    observe_next(r);
}

static void observe_send(recipe *r, int64_t rev, const cairn_kv *kv)
{
    cairn_header h;
    cairn_store_header(etcd_node(r->c)->store, &h);
    h.revision = rev;
    Etcdserverpb__ResponseHeader ph;
    Mvccpb__KeyValue pkv;
    kv_to_pb(&pkv, kv);
    V3electionpb__LeaderResponse out = V3ELECTIONPB__LEADER_RESPONSE__INIT;
    out.header = pb_header(r, &ph, &h);
    out.kv = &pkv;
    r->sending = 1;
    rpc_stream_send(r->c, &out.base, observe_sent);
}

/* etcd's Election.observe: the leader (first created key) at once, or the
 * first put under the prefix; then each put of the leader's key, until it
 * is deleted; then again. */
static void observe_find(recipe *r)
{
    cairn_range_req q;
    first_create(r, &q);
    cairn_range_resp resp = {0};
    int rc = cairn_store_range(etcd_node(r->c)->store, &resp, &q);
    if (rc) {
        end_store_error(r, rc);
        return;
    }
    int64_t h = resp.header.revision;
    if (resp.nkvs == 0) {
        r->phase = P_WAITPUT;
        rc = watch(r, r->pfx, r->pfx_len, r->pfx_end, r->pfx_len, h + 1, 0, 1);
    } else {
        free(r->key);
        r->key = dup_bytes(resp.kvs[0].key, resp.kvs[0].key_len);
        r->key_len = resp.kvs[0].key_len;
        r->phase = P_FOLLOW;
        rc = r->key ? watch(r, r->key, r->key_len, NULL, 0, h + 1, 0, 0) : CAIRN_ENOMEM;
        if (!rc)
            observe_send(r, h, &resp.kvs[0]);
    }
    cairn_range_resp_destroy(&resp);
    if (rc)
        end_store_error(r, rc);
}

/* Sends what the hub has, one message at a time. Worker. */
static void observe_next(recipe *r)
{
    while (!r->sending && !r->cancelled) {
        if (r->phase == P_FIND) {
            observe_find(r);
            continue;
        }
        if (r->batch_at < r->batch.nevents) {
            const cairn_event *e = &r->batch.events[r->batch_at++];
            if (r->phase == P_WAITPUT) {
                /* the first put: the leader, header at its revision */
                if (e->type != CAIRN_EVENT_PUT)
                    continue;
                r->batch_at = r->batch.nevents;
                free(r->key);
                r->key = dup_bytes(e->kv.key, e->kv.key_len);
                r->key_len = e->kv.key_len;
                r->phase = P_FOLLOW;
                int64_t rev = e->kv.mod_revision;
                int rc =
                    r->key ? watch(r, r->key, r->key_len, NULL, 0, rev + 1, 0, 0) : CAIRN_ENOMEM;
                if (rc) {
                    end_store_error(r, rc);
                    return;
                }
                observe_send(r, rev, &e->kv);
                continue;
            }
            if (e->type == CAIRN_EVENT_DELETE) {
                r->batch_at = r->batch.nevents;
                r->phase = P_FIND;
                continue;
            }
            observe_send(r, r->batch.revision, &e->kv);
            continue;
        }
        cairn_hub_batch_destroy(&r->batch);
        memset(&r->batch, 0, sizeof r->batch);
        r->batch_at = 0;
        int rc = cairn_hub_next(r->hs, &r->batch);
        if (rc == CAIRN_HUB_NONE)
            return;
        if (rc < 0) {
            end_store_error(r, rc);
            return;
        }
        if (rc == CAIRN_HUB_BATCH && r->batch.compact_revision) {
            /* etcd: the watch ends, and Observe's stream with it */
            end(r, 0, NULL, NULL);
            return;
        }
    }
}

/* ---- the state machine --------------------------------------------------- */

static void step(recipe *r, int ev, int store_rc)
{
    if (ev & EV_STORE) {
        r->busy = 0;
        if (store_rc && r->phase != P_CLEANUP && r->phase != P_RESIGN) {
            end_store_error(r, store_rc);
            return;
        }
        switch (r->phase) {
        case P_GRANT:
            r->lease = r->grant.id;
            if (set_key(r, r->lease)) {
                end(r, CAIRN_ENOMEM, NULL, NULL);
                return;
            }
            if (r->cancelled) {
                end(r, CAIRN_ECANCELLED, NULL, NULL);
                return;
            }
            int crc = contend(r);
            if (crc)
                end_store_error(r, crc);
            return;
        case P_TXN: {
            r->hdr = r->txn.header;
            if (r->txn.succeeded) {
                r->rev = r->txn.header.revision;
                r->created = 1;
            } else {
                const cairn_range_resp *k = &r->txn.responses[0].u.range;
                if (k->nkvs == 0) { /* cannot be: the compare saw the key */
                    end(r, CAIRN_ESTATE, NULL, NULL);
                    return;
                }
                r->rev = k->kvs[0].create_revision;
                int same = k->kvs[0].value_len == r->value_len &&
                           (!r->value_len || !memcmp(k->kvs[0].value, r->value, r->value_len));
                if (r->kind == R_CAMPAIGN && !same && !r->cancelled) {
                    /* etcd: the candidate proclaims its new value */
                    cairn_compare cmp;
                    create_cmp(r, &cmp, r->rev);
                    cairn_request_op put;
                    put_op(r, &put);
                    cairn_header keep = r->hdr;
                    r->phase = P_PROCLAIM;
                    int rc = start_txn(r, &cmp, &put, 1, NULL, 0, 1);
                    r->hdr = keep;
                    if (rc)
                        end_store_error(r, rc);
                    return;
                }
            }
            if (r->kind == R_LOCK) {
                const cairn_range_resp *o = &r->txn.responses[1].u.range;
                if (o->nkvs == 0 || o->kvs[0].create_revision == r->rev) {
                    answer_lock(r, &r->txn.header);
                    return;
                }
            }
            break;
        }
        case P_PROCLAIM:
            if (!r->txn.succeeded) {
                /* etcd: not leader; the candidate resigns */
                cairn_compare cmp;
                create_cmp(r, &cmp, r->rev);
                cairn_request_op del;
                memset(&del, 0, sizeof del);
                del.type = CAIRN_REQ_DELETE;
                del.u.del.key = r->key;
                del.u.del.key_len = r->key_len;
                r->phase = P_RESIGN;
                if (start_txn(r, &cmp, &del, 1, NULL, 0, 0))
                    end(r, CAIRN_ENOTLEADER, NULL, NULL);
                return;
            }
            break;
        case P_RESIGN:
            end(r, CAIRN_ENOTLEADER, NULL, NULL);
            return;
        case P_CLEANUP:
            end(r, CAIRN_ECANCELLED, NULL, NULL);
            return;
        default:
            break;
        }
        if (r->cancelled) {
            cleanup(r);
            return;
        }
        start_wait(r);
        return;
    }
    if (r->busy || r->ended)
        return; /* the write's completion comes back here */
    if (r->kind == R_OBSERVE) {
        if (r->cancelled) {
            if (!r->sending)
                end(r, CAIRN_ECANCELLED, NULL, NULL);
            return;
        }
        observe_next(r);
        return;
    }
    if (r->phase != P_WAIT)
        return;
    if (r->cancelled) {
        cleanup(r);
        return;
    }
    int rc = drain(r);
    if (rc) {
        end_store_error(r, rc);
        return;
    }
    look(r);
}

/* ---- Lock ------------------------------------------------------------------ */

static void lock_lock(rpc_call *c, const uint8_t *req, size_t len)
{
    V3lockpb__LockRequest *m =
        (V3lockpb__LockRequest *)rpc_unpack(c, &v3lockpb__lock_request__descriptor, req, len);
    if (!m)
        return;
    recipe *r = recipe_new(c, R_LOCK, &m->name);
    if (!r)
        return;
    if (rpc_notify_close(c, on_close, GRPC_STATUS_CANCELLED)) {
        rpc_fail(c, CAIRN_EIO, NULL);
        return;
    }
    waiting_add(r);
    int rc = begin(r, m->lease);
    if (rc)
        end_store_error(r, rc);
}

/* etcd: Unlock is a plain delete of the key */
static void unlock_done(rpc_call *c, int rc)
{
    cairn_delete_resp *d = c->ctx;
    if (rc) {
        rpc_fail(c, CAIRN_EPASSED, cairn_strerror(rc));
        return;
    }
    Etcdserverpb__ResponseHeader ph;
    etcd_header(etcd_node(c), &ph, &d->header);
    etcd_reply_header_only(c, &ph);
}

static void unlock_later(void *arg, int rc)
{
    rpc_later(arg, unlock_done, rc);
}

static void unlock_free(rpc_call *c)
{
    cairn_delete_resp_destroy(c->ctx);
    free(c->ctx);
    c->ctx = NULL;
}

static void lock_unlock(rpc_call *c, const uint8_t *req, size_t len)
{
    V3lockpb__UnlockRequest *m =
        (V3lockpb__UnlockRequest *)rpc_unpack(c, &v3lockpb__unlock_request__descriptor, req, len);
    if (!m)
        return;
    cairn_delete_resp *d = calloc(1, sizeof *d);
    if (!d) {
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    c->ctx = d;
    c->ctx_free = unlock_free;
    cairn_delete_req q;
    memset(&q, 0, sizeof q);
    q.key = m->key.data;
    q.key_len = m->key.len;
    int rc = cairn_store_delete_async(etcd_node(c)->store, d, &q, unlock_later, c);
    if (rc)
        rpc_fail(c, CAIRN_EPASSED, cairn_strerror(rc));
}

/* ---- Election ---------------------------------------------------------------- */

static void election_campaign(rpc_call *c, const uint8_t *req, size_t len)
{
    V3electionpb__CampaignRequest *m = (V3electionpb__CampaignRequest *)rpc_unpack(
        c, &v3electionpb__campaign_request__descriptor, req, len);
    if (!m)
        return;
    recipe *r = recipe_new(c, R_CAMPAIGN, &m->name);
    if (!r)
        return;
    r->value = dup_bytes(m->value.data, m->value.len);
    r->value_len = m->value.len;
    if (!r->value || rpc_notify_close(c, on_close, GRPC_STATUS_CANCELLED)) {
        rpc_fail(c, r->value ? CAIRN_EIO : CAIRN_ENOMEM, NULL);
        return;
    }
    waiting_add(r);
    int rc = begin(r, m->lease);
    if (rc)
        end_store_error(r, rc);
}

/* Proclaim and Resign: one Txn guarded by the key's create revision. */
static void guarded_done(rpc_call *c, int rc)
{
    recipe *r = c->ctx;
    if (rc) {
        rpc_fail(c, CAIRN_EPASSED, cairn_strerror(rc));
        return;
    }
    if (r->kind == R_PROCLAIM && !r->txn.succeeded) {
        rpc_fail(c, CAIRN_ENOTLEADER, NULL);
        return;
    }
    Etcdserverpb__ResponseHeader ph;
    etcd_header(etcd_node(c), &ph, &r->txn.header);
    etcd_reply_header_only(c, &ph);
}

static void guarded_later(void *arg, int rc)
{
    recipe *r = arg;
    rpc_later(r->c, guarded_done, rc);
}

static int guarded_txn(recipe *r, int resign)
{
    cairn_compare cmp;
    create_cmp(r, &cmp, r->rev);
    cairn_request_op op;
    if (resign) {
        memset(&op, 0, sizeof op);
        op.type = CAIRN_REQ_DELETE;
        op.u.del.key = r->key;
        op.u.del.key_len = r->key_len;
    } else
        put_op(r, &op);
    cairn_server *srv = etcd_node(r->c);
    int rc = resign ? 0 : node_quota_check(srv, r->key_len + r->value_len);
    cairn_txn_req t = {&cmp, 1, &op, 1, NULL, 0};
    if (!rc)
        rc = cairn_store_txn_async(srv->store, &r->txn, &t, guarded_later, r);
    return rc;
}

static void proclaim_granted(rpc_call *c, int rc)
{
    recipe *r = c->ctx;
    if (!rc) {
        r->lease = r->grant.id;
        rc = guarded_txn(r, 0);
    }
    if (rc)
        rpc_fail(c, CAIRN_EPASSED, cairn_strerror(rc));
}

static void proclaim_grant_later(void *arg, int rc)
{
    recipe *r = arg;
    rpc_later(r->c, proclaim_granted, rc);
}

/* A recipe holding a LeaderKey's key and revision (name unused, as etcd's
 * Proclaim and Resign use only the key). */
static recipe *leader_recipe(rpc_call *c, int kind, const V3electionpb__LeaderKey *lk)
{
    ProtobufCBinaryData none = {0, NULL};
    recipe *r = recipe_new(c, kind, &none);
    if (!r)
        return NULL;
    r->key = dup_bytes(lk->key.data, lk->key.len);
    r->key_len = lk->key.len;
    r->rev = lk->rev;
    r->lease = lk->lease;
    if (!r->key) {
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return NULL;
    }
    return r;
}

static void election_proclaim(rpc_call *c, const uint8_t *req, size_t len)
{
    V3electionpb__ProclaimRequest *m = (V3electionpb__ProclaimRequest *)rpc_unpack(
        c, &v3electionpb__proclaim_request__descriptor, req, len);
    if (!m)
        return;
    if (!m->leader) {
        rpc_fail(c, CAIRN_ENOLEADERKEY, NULL);
        return;
    }
    recipe *r = leader_recipe(c, R_PROCLAIM, m->leader);
    if (!r)
        return;
    r->value = dup_bytes(m->value.data, m->value.len);
    r->value_len = m->value.len;
    if (!r->value) {
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    int rc;
    if (r->lease == 0) {
        /* etcd: a session without a lease grants one, and the proclaimed
         * value is put with it */
        rc = node_quota_check(etcd_node(c), 0);
        if (!rc)
            rc = cairn_store_lease_create_async(etcd_node(c)->store, &r->grant, 0, SESSION_TTL,
                                                proclaim_grant_later, r);
    } else
        rc = guarded_txn(r, 0);
    if (rc)
        rpc_fail(c, CAIRN_EPASSED, cairn_strerror(rc));
}

static void election_resign(rpc_call *c, const uint8_t *req, size_t len)
{
    V3electionpb__ResignRequest *m = (V3electionpb__ResignRequest *)rpc_unpack(
        c, &v3electionpb__resign_request__descriptor, req, len);
    if (!m)
        return;
    if (!m->leader) {
        rpc_fail(c, CAIRN_ENOLEADERKEY, NULL);
        return;
    }
    recipe *r = leader_recipe(c, R_CAMPAIGN, m->leader);
    if (!r)
        return;
    int rc = guarded_txn(r, 1);
    if (rc)
        rpc_fail(c, CAIRN_EPASSED, cairn_strerror(rc));
}

static void election_leader(rpc_call *c, const uint8_t *req, size_t len)
{
    V3electionpb__LeaderRequest *m = (V3electionpb__LeaderRequest *)rpc_unpack(
        c, &v3electionpb__leader_request__descriptor, req, len);
    if (!m)
        return;
    recipe *r = recipe_new(c, R_CAMPAIGN, &m->name);
    if (!r)
        return;
    cairn_range_req q;
    first_create(r, &q);
    cairn_range_resp resp = {0};
    int rc = cairn_store_range(etcd_node(c)->store, &resp, &q);
    if (rc)
        rpc_fail(c, CAIRN_EPASSED, cairn_strerror(rc));
    else if (resp.nkvs == 0)
        rpc_fail(c, CAIRN_ENOLEADER, NULL);
    else {
        Etcdserverpb__ResponseHeader ph;
        Mvccpb__KeyValue kv;
        kv_to_pb(&kv, &resp.kvs[0]);
        V3electionpb__LeaderResponse out = V3ELECTIONPB__LEADER_RESPONSE__INIT;
        out.header = pb_header(r, &ph, &resp.header);
        out.kv = &kv;
        rpc_reply(c, &out.base);
    }
    cairn_range_resp_destroy(&resp);
}

static void election_observe(rpc_call *c, const uint8_t *req, size_t len)
{
    V3electionpb__LeaderRequest *m = (V3electionpb__LeaderRequest *)rpc_unpack(
        c, &v3electionpb__leader_request__descriptor, req, len);
    if (!m)
        return;
    recipe *r = recipe_new(c, R_OBSERVE, &m->name);
    if (!r)
        return;
    if (rpc_notify_close(c, on_close, GRPC_STATUS_CANCELLED)) {
        rpc_fail(c, CAIRN_EIO, NULL);
        return;
    }
    waiting_add(r);
    r->phase = P_FIND;
    observe_next(r);
}

static const rpc_method lock_methods[] = {
    {"/v3lockpb.Lock/Lock", RPC_UNARY, lock_lock, 1, &v3lockpb__lock_request__descriptor},
    {"/v3lockpb.Lock/Unlock", RPC_UNARY, lock_unlock, 1, &v3lockpb__unlock_request__descriptor},
};

const rpc_service etcd_lock_service = {"v3lockpb.Lock", lock_methods,
                                       sizeof lock_methods / sizeof lock_methods[0],
                                       recipes_stopping, etcd_admit};

static const rpc_method election_methods[] = {
    {"/v3electionpb.Election/Campaign", RPC_UNARY, election_campaign, 1,
     &v3electionpb__campaign_request__descriptor},
    {"/v3electionpb.Election/Proclaim", RPC_UNARY, election_proclaim, 1,
     &v3electionpb__proclaim_request__descriptor},
    {"/v3electionpb.Election/Leader", RPC_UNARY, election_leader, 1,
     &v3electionpb__leader_request__descriptor},
    {"/v3electionpb.Election/Observe", RPC_SERVER_STREAM, election_observe, 1,
     &v3electionpb__leader_request__descriptor},
    {"/v3electionpb.Election/Resign", RPC_UNARY, election_resign, 1,
     &v3electionpb__resign_request__descriptor},
};

const rpc_service etcd_election_service = {"v3electionpb.Election", election_methods,
                                           sizeof election_methods / sizeof election_methods[0],
                                           NULL, etcd_admit};
