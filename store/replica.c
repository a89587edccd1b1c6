/*
 * Per-peer sync sessions owned by the store (replica.h): crdt/sync's state
 * machine driven against the store's document, with the store's durability
 * rule in between.
 *
 * Why the wait in doc_read_lock is safe and bounded: with the rwlock's
 * read side held no writer can apply, so the committer's queue only
 * shrinks; the committer never takes the rwlock, and it broadcasts dcv
 * after every group. So the wait ends after at most the group in flight
 * and the one queued behind it, and then the document holds exactly what
 * LevelDB holds. The DAG has no lock of its own and its const calls fill
 * caches, so every replica's use of the document is also serialised by
 * doc_mu (Range readers do not touch the DAG; writers are kept out by the
 * rwlock).
 *
 * A receive's completion runs on the committer: it may not take the rwlock
 * (a reader can hold it while waiting for the committer, and the rwlock
 * prefers writers), so it only raises |applied_due|; the owed
 * cairn_sync_applied runs at the next call from the transport.
 */
#include "store/replica.h"

#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "store/store_int.h"

static pthread_mutex_t doc_mu = PTHREAD_MUTEX_INITIALIZER;

struct cairn_replica {
    cairn_store *s;
    pthread_mutex_t mu; /* the sync state */
    cairn_sync_state *st;
    atomic_int applied_due; /* a receive completed: cairn_sync_applied is owed */
    atomic_int refs;        /* the owner's + one per receive in flight */
};

/* One receive waiting for the committer. */
typedef struct recv_wait {
    cairn_replica *r;
    cairn_replica_done_cb cb;
    void *arg;
} recv_wait;

static void replica_unref(cairn_replica *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    cairn_sync_state_free(r->st);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Takes the read side, with |durable| once everything the document holds
 * is durable; then doc_mu. Returns the store's failure code (nothing held)
 * or 0. */
static int doc_read_lock(cairn_store *s, int durable)
{
    pthread_rwlock_rdlock(&s->rw);
    pthread_mutex_lock(&s->qmu);
    while (durable && (s->batch_n || s->writing) && !cairn_store_failed_rc(s))
        pthread_cond_wait(&s->dcv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
    int rc = cairn_store_failed_rc(s);
    if (rc) {
        pthread_rwlock_unlock(&s->rw);
        return rc;
    }
    pthread_mutex_lock(&doc_mu);
    return 0;
}

static void doc_read_unlock(cairn_store *s)
{
    pthread_mutex_unlock(&doc_mu);
    pthread_rwlock_unlock(&s->rw);
}

/* Pays the cairn_sync_applied a completed receive left owed (caller holds
 * r->mu, the read side and doc_mu). */
static int settle_applied(cairn_replica *r)
{
    if (!atomic_exchange(&r->applied_due, 0))
        return 0;
    return cairn_sync_applied(r->st, r->s->doc);
}

int cairn_replica_new(cairn_replica **out, cairn_store *s, const cairn_sync_limits *limits)
{
    *out = NULL;
    cairn_replica *r = calloc(1, sizeof *r);
    if (!r)
        return CAIRN_ENOMEM;
    int rc = cairn_sync_state_new(&r->st, limits);
    if (rc) {
        free(r);
        return rc;
    }
    r->s = s;
    pthread_mutex_init(&r->mu, NULL);
    atomic_init(&r->applied_due, 0);
    atomic_init(&r->refs, 1);
    *out = r;
    return 0;
}

void cairn_replica_free(cairn_replica *r)
{
    if (r)
        replica_unref(r);
}

void cairn_replica_reset(cairn_replica *r)
{
    pthread_mutex_lock(&r->mu);
    cairn_sync_reset(r->st);
    pthread_mutex_unlock(&r->mu);
}

int cairn_replica_generate(cairn_replica *r, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    uint8_t salt[CAIRN_BLOOM_SALT_LEN];
    randombytes_buf(salt, sizeof salt);
    pthread_mutex_lock(&r->mu);
    int rc = doc_read_lock(r->s, 1);
    if (!rc) {
        rc = settle_applied(r);
        if (!rc)
            rc = cairn_sync_generate(out, len, r->s->doc, r->st, salt);
        doc_read_unlock(r->s);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int cairn_replica_push(cairn_replica *r, uint8_t **out, size_t *len,
                       const cairn_change *const *chs, size_t n)
{
    *out = NULL;
    *len = 0;
    pthread_mutex_lock(&r->mu);
    int rc = doc_read_lock(r->s, 1);
    if (!rc) {
        rc = settle_applied(r);
        /* more than the limits' worth: the rest follow through generate */
        size_t npushed = 0;
        if (!rc)
            rc = cairn_sync_push(out, len, &npushed, r->s->doc, r->st, chs, n);
        doc_read_unlock(r->s);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static void receive_done(void *arg, int rc, const cairn_hash *heads, size_t nheads)
{
    (void)heads;
    (void)nheads;
    recv_wait *w = arg;
    if (!rc)
        atomic_store(&w->r->applied_due, 1);
    if (w->cb)
        w->cb(w->arg, rc);
    replica_unref(w->r);
    free(w);
}

int cairn_replica_receive(cairn_replica *r, const uint8_t *msg, size_t len, int *rejected,
                          cairn_replica_done_cb cb, void *arg)
{
    if (rejected)
        *rejected = 0;
    cairn_change **chs = NULL;
    size_t n = 0;
    pthread_mutex_lock(&r->mu);
    /* receive only reads the document; what the session then says goes
     * out through generate or push, which wait for durability */
    int rc = doc_read_lock(r->s, 0);
    if (!rc) {
        rc = settle_applied(r);
        if (!rc)
            rc = cairn_sync_receive(&chs, &n, r->st, r->s->doc, msg, len);
        doc_read_unlock(r->s);
    }
    pthread_mutex_unlock(&r->mu);
    if (rc)
        return rc;
    if (n == 0) {
        if (cb)
            cb(arg, 0);
        return 0;
    }
    /* Not under r->mu: the committer's completion must never wait on it. */
    int *verdicts = calloc(n, sizeof *verdicts);
    recv_wait *w = malloc(sizeof *w);
    if (!verdicts || !w) {
        free(verdicts);
        free(w);
        cairn_sync_changes_free(chs, n);
        return CAIRN_ENOMEM;
    }
    *w = (recv_wait){r, cb, arg};
    atomic_fetch_add(&r->refs, 1);
    rc = cairn_store_receive_changes(r->s, chs, n, verdicts, receive_done, w);
    free(chs); /* the changes are the store's now */
    if (rc) {
        atomic_fetch_sub(&r->refs, 1);
        free(w);
    } else if (rejected) {
        for (size_t i = 0; i < n && !*rejected; i++)
            *rejected = verdicts[i] < 0 ? verdicts[i] : 0;
    }
    free(verdicts);
    return rc;
}

int cairn_store_heads(cairn_store *s, cairn_hash **heads, size_t *n)
{
    *heads = NULL;
    *n = 0;
    int rc = doc_read_lock(s, 1);
    if (rc)
        return rc;
    const cairn_hash *h;
    size_t nh = cairn_dag_heads(cairn_doc_dag(s->doc), &h);
    if (nh) {
        *heads = malloc(nh * sizeof **heads);
        if (*heads) {
            memcpy(*heads, h, nh * sizeof **heads);
            *n = nh;
        } else {
            rc = CAIRN_ENOMEM;
        }
    }
    doc_read_unlock(s);
    return rc;
}
