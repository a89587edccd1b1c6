/*
 * The committer: group commit and completions. Writers append their
 * change's records to the shared batch and queue their completion (apply.c,
 * under the queue mutex); one thread swaps the batch out, writes it with
 * sync=true (one fsync for everything queued meanwhile), then publishes the
 * new visible revision, hands each change's events to every subscriber in
 * apply order, and completes the waiting callers in order.
 *
 * Readers hold the rwlock's read side and filter by the visible revision,
 * so they never see a change whose batch is not durable; the committer
 * never takes the rwlock, so a writer may wait for it while holding the
 * write side. Subscribers are delivered under sub_mu, so an unsubscribe
 * that returns has seen its last delivery.
 *
 * The completer. Delivering a group and completing its callers is most of
 * a group's CPU (each completion answers a gRPC call: a send per call), so
 * the committer does not do it: it hands the durable group to the completer
 * thread and goes straight on to write the next one, whose fsync then
 * overlaps the previous group's answers. The completer takes the groups in
 * order, so subscribers still see every change in apply order and callers
 * complete in order; nothing is delivered or completed before it is
 * durable. Neither thread takes the rwlock.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crdt/error.h"
#include "store/store_int.h"

static void free_pend_change(pend_change *c)
{
    for (size_t i = 0; i < c->nev; i++) {
        free(c->ev[i].key);
        free(c->ev[i].value);
    }
    free(c->ev);
    free(c->bytes);
    free(c);
}

static void hand_over(cairn_store *s, const pend_group *g);
static void complete_group(cairn_store *s, pend_change *chs, pend_wait *ws, int rc);

static void *committer_main(void *arg)
{
    cairn_store *s = arg;
    pthread_mutex_lock(&s->qmu);
    for (;;) {
        while (!s->stop && (s->holding || (s->batch_n == 0 && !s->w_head)))
            pthread_cond_wait(&s->qcv, &s->qmu);
        if (s->stop && s->batch_n == 0 && !s->w_head)
            break;
        leveldb_writebatch_t *b = NULL;
        size_t nb = s->batch_n;
        uint64_t nbytes = s->batch_bytes;
        s->batch_bytes = 0;
        if (s->batch_n) {
            b = s->batch;
            s->batch = leveldb_writebatch_create();
            s->batch_n = 0;
            s->batch_gen++;
        }
        s->writing = b != NULL;
        size_t nlocal = s->batch_local, nremote = s->batch_remote;
        if (b)
            pthread_cond_broadcast(&s->tcv);
        s->batch_local = s->batch_remote = 0;
        uint64_t end = s->batch_end;
        pend_change *chs = s->ch_head;
        s->ch_head = NULL;
        s->ch_tail = &s->ch_head;
        pend_wait *ws = s->w_head;
        s->w_head = NULL;
        s->w_tail = &s->w_head;
        int64_t target = s->queued_rev;
        pthread_mutex_unlock(&s->qmu);

        int rc = atomic_load(&s->failed);
        if (b && !rc && s->before_write_cb && s->before_write_cb(s->before_write_arg, nb)) {
            cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "write of %zu changes failed (injected)", nb);
            rc = CAIRN_EIO;
            atomic_store(&s->failed, CAIRN_EIO);
        }
        if (b && !rc) {
            char *err = NULL;
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            leveldb_write(s->db, s->wopt_sync, b, &err);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            rc = cairn_store_db_err(s, err);
            if (!rc) {
                size_t nch = nlocal + nremote;
                atomic_fetch_add(&s->n_syncs, 1);
                atomic_fetch_add(&s->n_changes, nch);
                atomic_fetch_add(&s->n_change_bytes, nbytes);
                atomic_fetch_add_explicit(&s->n_local, nlocal, memory_order_relaxed);
                atomic_fetch_add_explicit(&s->n_remote, nremote, memory_order_relaxed);
                atomic_store(&s->durable_count, end);
                size_t k = 0;
                while (k < CAIRN_STORE_BATCH_BUCKETS && nch > ((size_t)1 << k))
                    k++;
                atomic_fetch_add_explicit(&s->batch_le[k], 1, memory_order_relaxed);
                uint64_t ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u +
                              (uint64_t)(t1.tv_nsec - t0.tv_nsec);
                size_t i = 0;
                while (i < CAIRN_STORE_SYNC_BUCKETS && ns > (1000000ull << i))
                    i++;
                atomic_fetch_add_explicit(&s->sync_le[i], 1, memory_order_relaxed);
                atomic_fetch_add_explicit(&s->sync_ns, ns, memory_order_relaxed);
            }
            if (rc)
                atomic_store(&s->failed, CAIRN_EIO);
        }
        if (b)
            leveldb_writebatch_destroy(b);
        /* durable now, or never (the store failed): pending no more */
        atomic_fetch_sub_explicit(&s->recv_unsynced, nremote, memory_order_relaxed);
        pthread_mutex_lock(&s->qmu);
        if (!rc && target > atomic_load(&s->visible))
            atomic_store(&s->visible, target);
        s->writing = 0;
        pthread_cond_broadcast(&s->dcv);
        pthread_mutex_unlock(&s->qmu);
        if (chs || ws) {
            pend_group g = {NULL, chs, ws, rc};
            hand_over(s, &g);
        }
        pthread_mutex_lock(&s->qmu);
    }
    pthread_mutex_unlock(&s->qmu);
    return NULL;
}

/* Delivers a durable group's changes to the subscribers and completes its
 * callers (on the completer; on the committer if it could not be handed
 * over). */
static void complete_group(cairn_store *s, pend_change *chs, pend_wait *ws, int rc)
{
    pthread_mutex_lock(&s->sub_mu);
    while (chs) {
        pend_change *n = chs->next;
        if (!rc && s->nsubs) {
            cairn_event *ev = chs->nev ? calloc(chs->nev, sizeof *ev) : NULL;
            for (size_t i = 0; ev && i < chs->nev; i++) {
                const pend_event *e = &chs->ev[i];
                ev[i].type = e->type;
                ev[i].kv.key = e->key;
                ev[i].kv.key_len = e->key_len;
                ev[i].kv.mod_revision = chs->rev;
                if (e->type == CAIRN_EVENT_PUT) {
                    ev[i].kv.create_revision = e->create_rev;
                    ev[i].kv.version = e->version;
                    ev[i].kv.lease = e->lease;
                    ev[i].kv.value = e->value;
                    ev[i].kv.value_len = e->value_len;
                }
            }
            for (size_t i = 0; i < s->nsubs; i++)
                s->subs[i].cb(s->subs[i].arg, chs->rev, &chs->hash, chs->bytes, chs->len, ev,
                              ev ? chs->nev : 0);
            free(ev);
        }
        free_pend_change(chs);
        chs = n;
    }
    pthread_mutex_unlock(&s->sub_mu);
    while (ws) {
        pend_wait *n = ws->next;
        if (ws->hcb)
            ws->hcb(ws->arg, rc, rc ? NULL : ws->heads, rc ? 0 : ws->nheads);
        else if (ws->cb)
            ws->cb(ws->arg, rc);
        free(ws->heads);
        free(ws);
        ws = n;
    }
}

static void *completer_main(void *arg)
{
    cairn_store *s = arg;
    pthread_mutex_lock(&s->cmu);
    for (;;) {
        while (!s->g_head && !s->cstop)
            pthread_cond_wait(&s->ccv, &s->cmu);
        pend_group *g = s->g_head;
        if (!g)
            break; /* stopping, and everything handed over is completed */
        s->g_head = NULL;
        s->g_tail = &s->g_head;
        s->completing = 1;
        pthread_mutex_unlock(&s->cmu);
        while (g) {
            pend_group *n = g->next;
            complete_group(s, g->chs, g->ws, g->rc);
            free(g);
            g = n;
        }
        pthread_mutex_lock(&s->cmu);
        s->completing = 0;
        pthread_cond_broadcast(&s->cdone);
    }
    pthread_mutex_unlock(&s->cmu);
    return NULL;
}

/* Queues group |g| (a template: copied) for the completer; without memory
 * for the copy, completes it here, which keeps the order: everything handed
 * over before is completed first. */
static void hand_over(cairn_store *s, const pend_group *g)
{
    pend_group *c = malloc(sizeof *c);
    pthread_mutex_lock(&s->cmu);
    if (c) {
        *c = *g;
        c->next = NULL;
        *s->g_tail = c;
        s->g_tail = &c->next;
        pthread_cond_signal(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
        return;
    }
    while (s->g_head || s->completing) /* everything handed over goes first */
        pthread_cond_wait(&s->cdone, &s->cmu);
    pthread_mutex_unlock(&s->cmu);
    complete_group(s, g->chs, g->ws, g->rc);
}

int cairn_store_subscribe(cairn_store *s, cairn_store_events_cb cb, void *arg)
{
    pthread_mutex_lock(&s->sub_mu);
    int rc = 0;
    if (s->nsubs == s->subcap) {
        size_t cap = s->subcap ? s->subcap * 2 : 4;
        cairn_store_subscriber *n = realloc(s->subs, cap * sizeof *n);
        if (n) {
            s->subs = n;
            s->subcap = cap;
        } else {
            rc = CAIRN_ENOMEM;
        }
    }
    if (!rc) {
        s->subs[s->nsubs++] = (cairn_store_subscriber){cb, arg};
        atomic_store(&s->has_subs, 1);
    }
    pthread_mutex_unlock(&s->sub_mu);
    return rc;
}

int cairn_store_unsubscribe(cairn_store *s, cairn_store_events_cb cb, void *arg)
{
    pthread_mutex_lock(&s->sub_mu);
    int rc = CAIRN_ENOTFOUND;
    for (size_t i = 0; i < s->nsubs; i++) {
        if (s->subs[i].cb == cb && s->subs[i].arg == arg) {
            memmove(&s->subs[i], &s->subs[i + 1], (s->nsubs - i - 1) * sizeof *s->subs);
            s->nsubs--;
            rc = 0;
            break;
        }
    }
    atomic_store(&s->has_subs, s->nsubs > 0);
    pthread_mutex_unlock(&s->sub_mu);
    return rc;
}

int cairn_store_enqueue_wait(cairn_store *s, cairn_store_done_cb cb, void *arg, int *rcp)
{
    pend_wait *w = calloc(1, sizeof *w);
    if (!w)
        return CAIRN_ENOMEM;
    w->cb = cb;
    w->arg = arg;
    w->rcp = rcp;
    pthread_mutex_lock(&s->qmu);
    *s->w_tail = w;
    s->w_tail = &w->next;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return 0;
}

int cairn_store_wait_visible(cairn_store *s, int64_t rev)
{
    pthread_mutex_lock(&s->qmu);
    while (atomic_load(&s->visible) < rev && !atomic_load(&s->failed))
        pthread_cond_wait(&s->dcv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
    return atomic_load(&s->visible) >= rev ? 0 : CAIRN_EIO;
}

void cairn_store_sync_done(void *arg, int rc)
{
    cairn_store_sync_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int cairn_store_sync_wait_for(cairn_store_sync_wait *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    return w->rc;
}

void cairn_store_get_stats(cairn_store *s, cairn_store_stats *out)
{
    out->syncs = atomic_load(&s->n_syncs);
    out->changes = atomic_load(&s->n_changes);
    out->change_bytes = atomic_load(&s->n_change_bytes);
    for (size_t i = 0; i <= CAIRN_STORE_SYNC_BUCKETS; i++)
        out->sync_le[i] = atomic_load_explicit(&s->sync_le[i], memory_order_relaxed);
    out->sync_ns = atomic_load_explicit(&s->sync_ns, memory_order_relaxed);
    out->forks = atomic_load(&s->n_forks);
    out->applied_local = atomic_load_explicit(&s->n_local, memory_order_relaxed);
    out->applied_remote = atomic_load_explicit(&s->n_remote, memory_order_relaxed);
    for (size_t i = 0; i <= CAIRN_STORE_BATCH_BUCKETS; i++)
        out->batch_le[i] = atomic_load_explicit(&s->batch_le[i], memory_order_relaxed);
    out->pending = atomic_load_explicit(&s->recv_waiting, memory_order_relaxed) +
                   atomic_load_explicit(&s->recv_buffered, memory_order_relaxed) +
                   atomic_load_explicit(&s->recv_unsynced, memory_order_relaxed);
    /* ckpt_n, ckpt_compacted and ckpt_ms are set while the store opens */
    int ckpt = s->ckpt_n && atomic_load(&s->compacted) == s->ckpt_compacted;
    uint64_t durable = atomic_load(&s->durable_count), covered = ckpt ? s->ckpt_n : 0;
    out->ckpt_behind = durable > covered ? durable - covered : 0;
    uint64_t now = cairn_store_now_ms(s), since = ckpt ? s->ckpt_ms : s->open_ms;
    out->ckpt_age_ms = now > since ? now - since : 0;
}

int cairn_store_commit_start(cairn_store *s)
{
    if (pthread_create(&s->completer, NULL, completer_main, s))
        return CAIRN_ENOMEM;
    s->completer_started = 1;
    if (pthread_create(&s->committer, NULL, committer_main, s))
        return CAIRN_ENOMEM;
    s->committer_started = 1;
    return 0;
}

void cairn_store_commit_stop(cairn_store *s)
{
    if (s->committer_started) {
        pthread_mutex_lock(&s->qmu);
        s->stop = 1;
        pthread_cond_signal(&s->qcv);
        pthread_mutex_unlock(&s->qmu);
        pthread_join(s->committer, NULL);
        s->committer_started = 0;
    }
    /* the committer has handed over its last group: the completer ends
     * once it has completed them all */
    if (s->completer_started) {
        pthread_mutex_lock(&s->cmu);
        s->cstop = 1;
        pthread_cond_signal(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
        pthread_join(s->completer, NULL);
        s->completer_started = 0;
    }
    while (s->ch_head) {
        pend_change *n = s->ch_head->next;
        free_pend_change(s->ch_head);
        s->ch_head = n;
    }
}
