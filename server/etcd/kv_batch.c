/*
 * The Put batcher, for benchmarks only (--experimental-batch-writes N).
 * The issue asks what one change per client write costs against a build
 * that coalesces writes, and with this flag cairn is that build: a plain
 * Put (no lease, prev_kv, ignore_value or ignore_lease) that arrives while
 * an earlier batch is still being written joins the open batch instead of
 * becoming a change of its own; when the batch in flight completes, the open one goes to the
 * store as one Txn of up to N puts (one change, one revision) and each Put
 * is answered with that Txn's header. A Put arriving with nothing in flight
 * goes at once, alone, so a lone client sees no added latency. It is off by
 * default and not etcd's behaviour: N Puts share one revision.
 *
 * Why it is safe: the batcher's lock is held only to move calls between
 * the open batch and a local list, never across a store call; batches are
 * submitted from a worker (the first Put, or a full batch) or from the
 * completion callback on the store's completer thread, which may call the
 * async writes (store.h). Every open batch has a batch in flight ahead of
 * it (inflight > 0), and that batch's completion submits it, so no Put is
 * stranded; shutdown waits for every live call, hence for both. Two Puts to
 * one key cannot share a Txn (etcd: duplicate key), so a repeated key
 * closes the open batch and starts the next.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct kv_batch {
    cairn_server *srv;
    size_t n;
    rpc_call **calls;      /* [cap] */
    cairn_request_op *ops; /* [cap]: Puts borrowed from each call's req_msg */
    cairn_txn_req req;
    cairn_txn_resp resp;
};

struct kv_batcher {
    pthread_mutex_t mu;
    size_t cap;
    int inflight;           /* batches submitted and not yet completed */
    struct kv_batch *open;  /* Puts waiting for the batch in flight */
    uint64_t puts, changes; /* since start, for the log line at exit */
};

int kv_batcher_new(cairn_server *srv)
{
    srv->batcher = NULL;
    if (srv->cfg->batch_writes == 0)
        return 0;
    struct kv_batcher *b = calloc(1, sizeof *b);
    if (!b)
        return CAIRN_ENOMEM;
    pthread_mutex_init(&b->mu, NULL);
    b->cap = srv->cfg->batch_writes;
    srv->batcher = b;
    cairn_log(CAIRN_LOG_WARN,
              "--experimental-batch-writes %zu: up to %zu Puts share one change and one "
              "revision (benchmarks only; not etcd's numbering)",
              b->cap, b->cap);
    return 0;
}

void kv_batcher_free(cairn_server *srv)
{
    struct kv_batcher *b = srv->batcher;
    if (!b)
        return;
    cairn_log(CAIRN_LOG_INFO,
              "experimental-batch-writes: %" PRIu64 " puts in %" PRIu64
              " changes (%.2f per change)",
              b->puts, b->changes, b->changes ? (double)b->puts / (double)b->changes : 0.0);
    pthread_mutex_destroy(&b->mu);
    free(b);
    srv->batcher = NULL;
}

static struct kv_batch *batch_new(cairn_server *srv, size_t cap)
{
    struct kv_batch *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->srv = srv;
    k->calls = calloc(cap, sizeof *k->calls);
    k->ops = calloc(cap, sizeof *k->ops);
    if (!k->calls || !k->ops) {
        free(k->calls);
        free(k->ops);
        free(k);
        return NULL;
    }
    return k;
}

static void batch_free(struct kv_batch *k)
{
    cairn_txn_resp_destroy(&k->resp);
    free(k->calls);
    free(k->ops);
    free(k);
}

static int batch_has_key(const struct kv_batch *k, const cairn_put_req *p)
{
    for (size_t i = 0; i < k->n; i++) {
        const cairn_put_req *q = &k->ops[i].u.put;
        if (q->key_len == p->key_len && memcmp(q->key, p->key, p->key_len) == 0)
            return 1;
    }
    return 0;
}

static void batch_submit(struct kv_batch *k);

/* Committer thread (or the submitting thread when the store refused the
 * batch): answers every Put of |k|, then sends the open batch, if any, now
 * that nothing is ahead of it. */
static void batch_done(void *arg, int rc)
{
    struct kv_batch *k = arg;
    struct kv_batcher *b = k->srv->batcher;
    for (size_t i = 0; i < k->n; i++) {
        rpc_call *c = k->calls[i];
        if (rc != 0) {
            rpc_fail(c, rc, NULL);
            continue;
        }
        Etcdserverpb__ResponseHeader h;
        Etcdserverpb__PutResponse out;
        etcdserverpb__put_response__init(&out);
        etcd_header(k->srv, &h, &k->resp.header);
        out.header = &h;
        rpc_reply(c, &out.base);
    }
    batch_free(k);
    struct kv_batch *next = NULL;
    pthread_mutex_lock(&b->mu);
    b->inflight--;
    if (b->inflight == 0 && b->open) {
        next = b->open;
        b->open = NULL;
        b->inflight++;
    }
    pthread_mutex_unlock(&b->mu);
    if (next)
        batch_submit(next);
}

/* |k| is counted in b->inflight by the caller. */
static void batch_submit(struct kv_batch *k)
{
    struct kv_batcher *b = k->srv->batcher;
    pthread_mutex_lock(&b->mu);
    b->puts += k->n;
    b->changes++;
    pthread_mutex_unlock(&b->mu);
    memset(&k->req, 0, sizeof k->req);
    k->req.success = k->ops;
    k->req.nsuccess = k->n;
    int rc = cairn_store_txn_async(k->srv->store, &k->resp, &k->req, batch_done, k);
    if (rc != 0) /* batch_done was not called: answer the batch with |rc| */
        batch_done(k, rc);
}

void kv_batch_put(rpc_call *c, const cairn_put_req *r)
{
    cairn_server *srv = etcd_node(c);
    struct kv_batcher *b = srv->batcher;
    struct kv_batch *go[2] = {NULL, NULL};
    int ngo = 0;
    pthread_mutex_lock(&b->mu);
    if (b->open && batch_has_key(b->open, r)) {
        go[ngo++] = b->open; /* etcd: a Txn may not put one key twice */
        b->open = NULL;
    }
    if (!b->open)
        b->open = batch_new(srv, b->cap);
    struct kv_batch *k = b->open;
    if (k) {
        k->calls[k->n] = c;
        k->ops[k->n].type = CAIRN_REQ_PUT;
        k->ops[k->n].u.put = *r;
        k->n++;
        if (b->inflight + ngo == 0 || k->n == b->cap) {
            go[ngo++] = k;
            b->open = NULL;
        }
    }
    b->inflight += ngo;
    pthread_mutex_unlock(&b->mu);
    if (!k) {
        rpc_fail(c, CAIRN_ENOMEM, NULL);
    }
    for (int i = 0; i < ngo; i++)
        batch_submit(go[i]);
}
