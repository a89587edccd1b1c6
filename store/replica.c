/*
 * The store's side of replication. Changes from peers go through the same
 * observer path as local writes (apply.c): a burst of them is applied in
 * slices of about a millisecond, each one write lock and one group commit
 * (local writers go between them), and its completion reports the store's heads
 * once everything it applied is durable, so a node never tells a peer it
 * has a change before its disk does. The sync protocol itself stays in
 * crdt/, sans I/O; the per-peer sessions below (replica.h) drive it
 * against the store's document with the store's durability rule between.
 *
 * Sessions. Why the wait in doc_read_lock is safe and bounded: with the
 * rwlock's read side held no writer can apply, so the committer's queue
 * only shrinks; the committer never takes the rwlock, and it broadcasts dcv
 * after every group. So the wait ends after at most the group in flight
 * and the one queued behind it, and then the document holds exactly what
 * LevelDB holds. The DAG has no lock of its own and its const calls fill
 * caches, so every session's use of the document is also serialised by
 * doc_mu (Range readers do not touch the DAG; writers are kept out by the
 * rwlock).
 *
 * A receive's completion runs on the completer: it may not take the rwlock
 * (a reader can hold it while waiting for the committer, and the rwlock
 * prefers writers), so it only raises |applied_due|; the owed
 * cairn_sync_applied runs at the next call from the transport.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "crdt/error.h"
#include "store/replica.h"
#include "store/store_int.h"

/* A burst is applied in slices, each under its own write lock and in its
 * own group: a slice takes at least RECV_SLICE_MIN changes (so a burst is
 * still a few group commits, not one per change), then stops once
 * RECV_SLICE_NS have passed or RECV_SLICE_MAX changes are in. Between
 * slices the committer takes the slice, then the writers waiting for the
 * lock (local clients) go first, in a group of their own, so a catch-up of
 * a million changes costs a local put about one slice of waiting for the
 * lock and one slice's group write, which RECV_SLICE_MAX bounds (a
 * catch-up still runs at ~100,000 changes/s with 256; bench figure f). */
#define RECV_SLICE_MIN 16
#define RECV_SLICE_MAX 256
#define RECV_SLICE_NS 1000000 /* 1 ms */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Applies one slice of chs[*i..n) under the write lock (caller holds it),
 * taking ownership of each change it reaches and moving *i past them;
 * verdicts[j] (may be NULL) as in cairn_store_receive_changes. Returns
 * CAIRN_EIO / ENOMEM when the store broke. The slice's records are held
 * back from the committer until its last one is batched: one group. The
 * first fork the burst meets goes to |note| (may be NULL). */
static int receive_slice(cairn_store *s, cairn_change **chs, size_t n, size_t *i, int *verdicts,
                         cairn_store_fork *note)
{
    int rc = cairn_store_failed_rc(s);
    s->fork_note = note;
    pthread_mutex_lock(&s->qmu);
    s->holding++;
    pthread_mutex_unlock(&s->qmu);
    size_t first = *i;
    uint64_t t0 = n - first > RECV_SLICE_MIN ? mono_ns() : 0;
    s->applying_remote = 1;
    for (; *i < n && !rc; ++*i) {
        size_t done = *i - first;
        if (done >= RECV_SLICE_MIN && (done >= RECV_SLICE_MAX || mono_ns() - t0 >= RECV_SLICE_NS))
            break;
        cairn_doc_observer obs;
        int v = cairn_doc_receive(s->doc, chs[*i], cairn_store_observer(s, &obs));
        rc = s->obs_rc;
        if (verdicts)
            verdicts[*i] = rc ? rc : v;
    }
    s->applying_remote = 0;
    /* metrics (cairn_store_stats.pending): the slice's changes are applied,
     * buffered or refused now */
    atomic_store_explicit(&s->recv_buffered, cairn_dag_pending_count(cairn_doc_dag(s->doc)),
                          memory_order_relaxed);
    atomic_fetch_sub_explicit(&s->recv_waiting, *i - first, memory_order_relaxed);
    s->fork_note = NULL;
    pthread_mutex_lock(&s->qmu);
    s->holding--;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return rc;
}

/* With the write side released: lets the writers that wait for it go
 * first. The rwlock prefers writers (store.c), so its read side is granted
 * only once none waits; bounded, so a steady stream of local writes slows
 * a catch-up down but cannot stop it. */
static void let_writers_in(cairn_store *s)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 2 * RECV_SLICE_NS;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    if (pthread_rwlock_timedrdlock(&s->rw, &until) == 0)
        pthread_rwlock_unlock(&s->rw);
}

/* Before a slice (after let_writers_in between two): waits until the
 * committer has taken the remote changes queued (|min| or more of them:
 * before a burst's first slice only a slice's worth, so a stream of single
 * pushes does not wait), i.e. the last slice; with |all|, everything
 * queued (the local writes let in after it). Without this the next slice
 * would often raise |holding| again before the committer woke, and the
 * slices of a whole message (or of several) piled up into one group that a
 * local write queued among them waited for: groups of 4096 changes and
 * more were seen during a catch-up. The committer takes a batch as soon as
 * the group before it is written and never waits on the rwlock, so the
 * wait is bounded by one group's write, and the next slice is applied
 * while this one is written. */
static void let_committer_take(cairn_store *s, size_t min, int all)
{
    pthread_mutex_lock(&s->qmu);
    /* one batch taken is enough: local writers may fill the next at once */
    uint64_t gen = s->batch_gen;
    while ((s->batch_remote >= min || (all && s->batch_n)) && s->batch_gen == gen &&
           !cairn_store_failed_rc(s))
        pthread_cond_wait(&s->tcv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
}

/* A received change that has waited this long for its dependencies leaves
 * the DAG's pending buffer (cairn_doc_expire_pending) at the next receive,
 * by the store's age clock (monotonic, or a test's); a peer sends it again. An honest gap is asked for by the next sync
 * (every 100 ms by default) and filled within a few, so only changes
 * whose dependencies never come (made up by a hostile peer) are dropped:
 * they hold the buffer this long at most, instead of for good. */
#define RECV_PENDING_MAX_AGE_MS 30000

/* Applies |n| received changes slice by slice (the caller holds the write
 * lock, and holds it again on return), taking ownership of them. Returns
 * CAIRN_EIO / ENOMEM when the store broke (the rest are freed unapplied). */
static int receive_locked(cairn_store *s, cairn_change **chs, size_t n, int *verdicts,
                          cairn_store_fork *note)
{
    size_t i = 0;
    int rc;
    cairn_doc_expire_pending(s->doc, s->age_clock_ms(s->clock_arg), RECV_PENDING_MAX_AGE_MS);
    atomic_fetch_add_explicit(&s->recv_waiting, n, memory_order_relaxed);
    for (;;) {
        rc = receive_slice(s, chs, n, &i, verdicts, note);
        if (rc || i == n)
            break;
        pthread_rwlock_unlock(&s->rw);
        /* local writes first: the slice goes to the committer, then the
         * writers waiting are let in, and their records are taken as a
         * group of their own (written right after the slice's) before the
         * next slice may join them */
        let_committer_take(s, 1, 0);
        let_writers_in(s);
        let_committer_take(s, 1, 1);
        /* on a busy machine the receiving thread is otherwise preempted
         * mostly while it holds the write lock (it holds it nearly all the
         * time it runs), and a local writer waits the preemption out */
        sched_yield();
        pthread_rwlock_wrlock(&s->rw);
    }
    atomic_fetch_sub_explicit(&s->recv_waiting, n - i, memory_order_relaxed);
    for (; i < n; i++) {
        cairn_change_free(chs[i]);
        if (verdicts)
            verdicts[i] = rc;
    }
    return rc;
}

/* cairn_store_receive_changes, noting the burst's first fork in |note|
 * (may be NULL; its seq stays 0 when there was none). */
static int receive_changes(cairn_store *s, cairn_change **chs, size_t n, int *verdicts,
                           cairn_store_fork *note, cairn_store_heads_cb cb, void *arg)
{
    pend_wait *w = calloc(1, sizeof *w);
    let_committer_take(s, RECV_SLICE_MIN, 0); /* the last burst's last slice goes alone */
    pthread_rwlock_wrlock(&s->rw);
    int rc = w ? 0 : CAIRN_ENOMEM;
    if (rc) { /* still ours: free them unapplied */
        for (size_t i = 0; i < n; i++)
            cairn_change_free(chs[i]);
        if (verdicts)
            for (size_t i = 0; i < n; i++)
                verdicts[i] = rc;
    } else {
        rc = receive_locked(s, chs, n, verdicts, note);
    }
    if (!rc) {
        /* the heads now name only changes queued before this completion */
        const cairn_hash *h;
        size_t nh = cairn_dag_heads(cairn_doc_dag(s->doc), &h);
        w->heads = nh ? malloc(nh * sizeof *w->heads) : NULL;
        if (nh && !w->heads)
            rc = CAIRN_ENOMEM;
        else if (nh)
            memcpy(w->heads, h, nh * sizeof *w->heads);
        w->nheads = nh;
    }
    if (!rc) {
        w->hcb = cb;
        w->arg = arg;
        pthread_mutex_lock(&s->qmu);
        *s->w_tail = w;
        s->w_tail = &w->next;
        pthread_cond_signal(&s->qcv);
        pthread_mutex_unlock(&s->qmu);
        w = NULL;
    }
    pthread_rwlock_unlock(&s->rw);
    if (w)
        free(w->heads);
    free(w);
    return rc;
}

int cairn_store_receive_changes(cairn_store *s, cairn_change **chs, size_t n, int *verdicts,
                                cairn_store_heads_cb cb, void *arg)
{
    return receive_changes(s, chs, n, verdicts, NULL, cb, arg);
}

int cairn_store_receive_async(cairn_store *s, const uint8_t *bytes, size_t len,
                              cairn_store_done_cb cb, void *arg)
{
    cairn_change *c;
    int rc = cairn_change_decode(&c, bytes, len, NULL);
    if (rc)
        return rc;
    pthread_rwlock_wrlock(&s->rw);
    int v = 0;
    rc = receive_locked(s, &c, 1, &v, NULL);
    if (!rc)
        rc = v;
    if (!rc)
        rc = cairn_store_enqueue_wait(s, cb, arg, NULL);
    pthread_rwlock_unlock(&s->rw);
    return rc;
}

int cairn_store_receive(cairn_store *s, const uint8_t *bytes, size_t len)
{
    SYNC_CALL(cairn_store_receive_async(s, bytes, len, cairn_store_sync_done, &w_), (void)0);
}

int cairn_store_rev_hash(cairn_store *s, cairn_hash *out, int64_t rev)
{
    memset(out, 0, sizeof *out);
    if (rev > atomic_load(&s->visible))
        return CAIRN_EFUTUREREV;
    if (rev <= 0)
        return CAIRN_ENOTFOUND;
    uint64_t index;
    int rc = cairn_revmap_find(&s->rm, &index, rev);
    if (rc)
        return rc;
    /* the body's hash is the change's name */
    char *v;
    size_t vl;
    rc = cairn_store_get_orec_of_rev(s, s->ropt, index, rev, &v, &vl);
    if (rc)
        return rc;
    cairn_hash_bytes(out, (const uint8_t *)v + 8, vl - 8);
    leveldb_free(v);
    return 0;
}

/* ---- per-peer sessions (replica.h) ---------------------------------------- */

static pthread_mutex_t doc_mu = PTHREAD_MUTEX_INITIALIZER;

struct cairn_replica {
    cairn_store *s;
    pthread_mutex_t mu; /* the sync state */
    cairn_sync_state *st;
    atomic_int applied_due; /* a receive completed: cairn_sync_applied is owed */
    atomic_int refs;        /* the owner's + one per receive in flight */
    /* The hashes of changes lately received from the peer, direct-mapped
     * by their first bytes (a collision only forgets one): push leaves
     * them out, so a change relayed on is not echoed to its sender. */
    cairn_hash *from_peer;
    cairn_store_fork fork; /* the last receive's first fork (seq 0: none) */
};

#define REPLICA_FROM_PEER 4096u /* slots, a power of two */

static uint32_t from_peer_slot(const cairn_hash *h)
{
    uint32_t v;
    memcpy(&v, h->b, sizeof v);
    return v & (REPLICA_FROM_PEER - 1);
}

/* 1 if |h| is remembered as received from the peer (caller holds r->mu). */
static int from_peer_has(const cairn_replica *r, const cairn_hash *h)
{
    return r->from_peer && memcmp(r->from_peer[from_peer_slot(h)].b, h->b, sizeof h->b) == 0;
}

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
    free(r->from_peer);
    free(r);
}

/* Takes the read side, with |durable| once everything the document holds
 * is durable; then doc_mu. Returns the store's failure code (nothing held)
 * or 0. With |durable| it first waits for the committer without the read
 * side (at most two of its groups: writers keep coming), so that what is
 * left to wait for under it, where it holds writers up, is only what they
 * queued meanwhile: during a catch-up the groups are large. */
static int doc_read_lock(cairn_store *s, int durable)
{
    if (durable) {
        pthread_mutex_lock(&s->qmu);
        for (int i = 0; i < 2 && (s->batch_n || s->writing) && !cairn_store_failed_rc(s); i++)
            pthread_cond_wait(&s->dcv, &s->qmu);
        pthread_mutex_unlock(&s->qmu);
    }
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

int cairn_store_doc_read_lock(cairn_store *s, int durable)
{
    return doc_read_lock(s, durable);
}

void cairn_store_doc_read_unlock(cairn_store *s)
{
    doc_read_unlock(s);
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

void cairn_replica_tick(cairn_replica *r)
{
    pthread_mutex_lock(&r->mu);
    if (doc_read_lock(r->s, 0) == 0) { /* the count: what was applied by now */
        cairn_sync_tick(r->st, r->s->doc);
        doc_read_unlock(r->s);
    }
    pthread_mutex_unlock(&r->mu);
}

int cairn_replica_wants_answer(cairn_replica *r)
{
    pthread_mutex_lock(&r->mu);
    int w = cairn_sync_wants_answer(r->st);
    pthread_mutex_unlock(&r->mu);
    return w;
}

void cairn_replica_reset(cairn_replica *r)
{
    pthread_mutex_lock(&r->mu);
    cairn_sync_reset(r->st);
    pthread_mutex_unlock(&r->mu);
}

int cairn_replica_their_heads(cairn_replica *r, cairn_hash **heads, size_t *n)
{
    *heads = NULL;
    *n = 0;
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    const cairn_hash *h;
    size_t nh = cairn_sync_their_heads(r->st, &h);
    if (nh) {
        *heads = malloc(nh * sizeof **heads);
        if (*heads) {
            memcpy(*heads, h, nh * sizeof **heads);
            *n = nh;
        } else {
            rc = CAIRN_ENOMEM;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
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

int cairn_replica_push(cairn_replica *r, uint8_t **out, size_t *len, const cairn_change *const *chs,
                       size_t n)
{
    *out = NULL;
    *len = 0;
    pthread_mutex_lock(&r->mu);
    /* Not waiting for the committer: holding the read side through a group
     * commit would keep every local writer out of it (the put path's
     * latency in a cluster). The changes pushed are durable, and so is
     * every change before them in apply order; the heads reported are the
     * last of them (durable, unlike the document's heads), so the peer
     * hears of no change before it is on our disk. */
    int rc = doc_read_lock(r->s, 0);
    if (!rc) {
        rc = settle_applied(r);
        /* more than the limits' worth: the rest follow through generate */
        size_t npushed = 0, k = 0;
        const cairn_change **keep = n ? malloc(n * sizeof *keep) : NULL;
        if (!rc && n && !keep)
            rc = CAIRN_ENOMEM;
        for (size_t i = 0; !rc && i < n; i++)
            if (!from_peer_has(r, &chs[i]->hash))
                keep[k++] = chs[i];
        if (!rc && k)
            rc = cairn_sync_push_heads(out, len, &npushed, r->s->doc, r->st, keep, k,
                                       &keep[k - 1]->hash, 1);
        free(keep);
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
    memset(&r->fork, 0, sizeof r->fork);
    cairn_change **chs = NULL;
    size_t n = 0;
    /* Decoding (hashing every change) needs no lock: a long message does
     * not hold writers up. */
    cairn_sync_msg m;
    int rc = cairn_sync_receive_decode(&m, r->st, msg, len);
    if (rc)
        return rc;
    pthread_mutex_lock(&r->mu);
    /* receive only reads the document; what the session then says goes
     * out through generate or push, which wait for durability */
    rc = doc_read_lock(r->s, 0);
    if (rc)
        cairn_sync_msg_destroy(&m);
    if (!rc) {
        rc = settle_applied(r);
        if (rc)
            cairn_sync_msg_destroy(&m);
        else
            rc = cairn_sync_receive_msg(&chs, &n, r->st, r->s->doc, &m);
        doc_read_unlock(r->s);
    }
    if (!rc && n && !r->from_peer)
        r->from_peer = calloc(REPLICA_FROM_PEER, sizeof *r->from_peer);
    for (size_t i = 0; !rc && r->from_peer && i < n; i++)
        r->from_peer[from_peer_slot(&chs[i]->hash)] = chs[i]->hash;
    pthread_mutex_unlock(&r->mu);
    if (rc)
        return rc;
    if (n == 0) {
        if (cb)
            cb(arg, 0);
        return 0;
    }
    /* Not under r->mu: the completer must never wait on it. */
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
    rc = receive_changes(r->s, chs, n, verdicts, &r->fork, receive_done, w);
    free(chs); /* the changes are the store's now */
    if (rc) {
        atomic_fetch_sub(&r->refs, 1);
        free(w);
    } else if (rejected) {
        /* the first refusal, one that is not a fork's if there is one */
        for (size_t i = 0; i < n; i++) {
            int v = verdicts[i];
            int fork = v == CAIRN_EFORK || v == CAIRN_EFORKPAST;
            int held_fork = *rejected == CAIRN_EFORK || *rejected == CAIRN_EFORKPAST;
            if (v < 0 && (!*rejected || (held_fork && !fork)))
                *rejected = v;
        }
    }
    free(verdicts);
    return rc;
}

int cairn_replica_lag(cairn_replica *r, uint64_t *changes, uint64_t *age_ms)
{
    *changes = 0;
    *age_ms = 0;
    pthread_mutex_lock(&r->mu);
    /* not waiting for the committer: a scrape must not hold writers out */
    int rc = doc_read_lock(r->s, 0);
    if (!rc) {
        uint64_t n, first;
        rc = cairn_sync_lag(&n, &first, r->st, r->s->doc);
        cairn_change *c = NULL;
        if (!rc && n && !(rc = cairn_dag_load(&c, cairn_doc_dag(r->s->doc), first))) {
            uint64_t now = cairn_store_now_ms(r->s);
            *changes = n;
            *age_ms = now > c->time_ms ? now - c->time_ms : 0;
            cairn_change_free(c);
        }
        doc_read_unlock(r->s);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int cairn_replica_last_fork(const cairn_replica *r, cairn_store_fork *out)
{
    if (!r->fork.seq)
        return 0;
    *out = r->fork;
    return 1;
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

int cairn_store_change_bytes(cairn_store *s, uint64_t *count, uint64_t *bytes)
{
    *count = 0;
    *bytes = 0;
    int rc = doc_read_lock(s, 1);
    if (rc)
        return rc;
    const cairn_dag *d = cairn_doc_dag(s->doc);
    uint64_t n = cairn_dag_count(d);
    if (n > CAIRN_STORE_CHANGE_BYTES_MAX)
        rc = CAIRN_ELIMIT;
    for (uint64_t i = 0; !rc && i < n; i++) {
        uint8_t *b;
        size_t len;
        rc = cairn_dag_load_bytes(&b, &len, d, i);
        if (!rc) {
            free(b);
            *bytes += len;
            ++*count;
        }
    }
    doc_read_unlock(s);
    return rc;
}
