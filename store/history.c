/*
 * History: the events of past revisions for a watcher catching up, and
 * compaction, which forgets them. The history scan reads 'O' in apply
 * order through a LevelDB snapshot, with no lock held while its callback
 * runs: each body says which revision its history records belong to.
 * Compaction drops index entries below the revision and deletes their
 * history records in the next group commit; change bodies stay. With
 * |physical|, LevelDB compacts the freed range on a thread of its own.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crdt/error.h"
#include "store/store_int.h"

/* Applies compaction at |c| to the index; when |b| is not NULL, adds the
 * deletes of the history records it no longer needs. */
int cairn_store_compact_index(cairn_store *s, int64_t c, leveldb_writebatch_t *b, uint64_t *ndel)
{
    store_buf kb = {0};
    int rc = 0;
    kiter it;
    for (kentry *e = cairn_kindex_first(&it, &s->idx); e; e = cairn_kindex_next(&it)) {
        uint32_t pos;
        uint64_t h = cairn_kindex_at(e, c, &pos);
        if (!h)
            continue;
        /* keep hist[pos] if live, drop everything before it; a delete at or
         * below the compaction revision goes too (etcd: a watch from the
         * compaction revision does not see a delete made at it) */
        uint32_t drop = (h & CAIRN_IDX_TOMB) ? pos + 1 : pos;
        for (uint32_t i = 0; i < drop && b; i++) {
            uint64_t index;
            if (cairn_revmap_find(&s->rm, &index, (int64_t)(e->hist[i] & ~CAIRN_IDX_TOMB))) {
                rc = cairn_store_corrupt(s, "no change made a revision with history");
                goto out;
            }
            uint8_t k[KREC_KEY_HDR];
            krec_key_hdr(k, index);
            kb.len = 0;
            rc = cairn_store_buf_put(&kb, k, KREC_KEY_HDR);
            if (!rc)
                rc = cairn_store_buf_put(&kb, kentry_key(e), e->key_len);
            if (rc)
                goto out;
            leveldb_writebatch_delete(b, (const char *)kb.p, kb.len);
            (*ndel)++;
        }
        if (drop) {
            memmove(e->hist, e->hist + drop, (e->nhist - drop) * sizeof *e->hist);
            e->nhist -= drop;
        }
    }
out:
    cairn_kindex_sweep(&s->idx); /* keys with no history left */
    cairn_store_buf_free(&kb);
    return rc;
}

/* A compaction between its records' durability and its completion: with
 * |physical|, LevelDB compacts the freed range on a thread of its own (it
 * may take seconds; the committer must not wait for it). */
typedef struct compact_job {
    cairn_store *s;
    int64_t revision;
    int physical;
    cairn_store_done_cb cb;
    void *arg;
} compact_job;

static void compact_physical(compact_job *j)
{
    cairn_store *s = j->s;
    uint64_t last;
    if (cairn_revmap_find(&s->rm, &last, j->revision) == 0) {
        /* every record of the changes up to the one that made |revision| */
        uint8_t lo[9], hi[9];
        lo[0] = hi[0] = 'O';
        cairn_store_be64(lo + 1, 0);
        cairn_store_be64(hi + 1, last + 1);
        leveldb_compact_range(s->db, (const char *)lo, 9, (const char *)hi, 9);
    }
}

static void compact_job_end(compact_job *j, int rc)
{
    cairn_store *s = j->s;
    j->cb(j->arg, rc);
    free(j);
    pthread_mutex_lock(&s->qmu);
    s->compact_jobs--;
    pthread_cond_broadcast(&s->dcv);
    pthread_mutex_unlock(&s->qmu);
}

static void *compact_main(void *arg)
{
    compact_job *j = arg;
    compact_physical(j);
    compact_job_end(j, 0);
    return NULL;
}

/* On the completer: the compaction record is durable. */
static void compact_durable(void *arg, int rc)
{
    compact_job *j = arg;
    if (!rc && j->physical) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int started = pthread_create(&th, &at, compact_main, j) == 0;
        pthread_attr_destroy(&at);
        if (started)
            return;
        compact_physical(j); /* no thread to be had: here, late rather than never */
    }
    compact_job_end(j, rc);
}

int cairn_store_compact_async(cairn_store *s, cairn_header *h, int64_t revision, int physical,
                              cairn_store_done_cb cb, void *arg)
{
    memset(h, 0, sizeof *h);
    compact_job *j = calloc(1, sizeof *j);
    if (!j)
        return CAIRN_ENOMEM;
    *j = (compact_job){s, revision, physical, cb, arg};
    pthread_rwlock_wrlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    if (rc)
        goto unlock;
    /* etcd: compact(r) with r <= the compacted revision -> compacted (on a
     * fresh store compact(0) succeeds once); r > current -> future */
    if (revision <= s->compacted) {
        rc = CAIRN_ECOMPACTED;
        goto unlock;
    }
    if (revision > s->rev) {
        rc = CAIRN_EFUTUREREV;
        goto unlock;
    }
    uint64_t ndel = 0;
    pthread_mutex_lock(&s->qmu);
    rc = cairn_store_compact_index(s, revision, s->batch, &ndel);
    cairn_store_meta_put_u64(s->batch, "compact", (uint64_t)revision);
    s->batch_n++;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    if (rc) {
        atomic_store(&s->failed, rc);
        goto unlock;
    }
    s->compacted = revision;
    pthread_mutex_lock(&s->qmu);
    s->compact_jobs++;
    pthread_mutex_unlock(&s->qmu);
    cairn_store_fill_header(s, h, s->rev); /* before the completion can run */
    rc = cairn_store_enqueue_wait(s, compact_durable, j, NULL);
    if (rc) {
        memset(h, 0, sizeof *h);
        pthread_mutex_lock(&s->qmu);
        s->compact_jobs--;
        pthread_mutex_unlock(&s->qmu);
        goto unlock;
    }
    pthread_rwlock_unlock(&s->rw);
    return 0;
unlock:
    pthread_rwlock_unlock(&s->rw);
    free(j);
    return rc;
}

int cairn_store_compact(cairn_store *s, cairn_header *h, int64_t revision, int physical)
{
    SYNC_CALL(cairn_store_compact_async(s, h, revision, physical, cairn_store_sync_done, &w_),
              memset(h, 0, sizeof *h));
}

int64_t cairn_store_compacted_rev(cairn_store *s)
{
    int64_t c = atomic_load(&s->compacted); /* no lock: the watch hub asks */
    return c < 0 ? 0 : c;
}

typedef struct hist_ev {
    uint64_t sub;
    cairn_event ev;
} hist_ev;

static int hist_ev_cmp(const void *a, const void *b)
{
    const hist_ev *x = a, *y = b;
    return x->sub < y->sub ? -1 : x->sub > y->sub;
}

static int in_range(const uint8_t *k, size_t kl, const uint8_t *key, size_t key_len,
                    const uint8_t *end, size_t end_len)
{
    int c = cairn_store_keycmp(k, kl, key, key_len);
    if (end_len == 0)
        return c == 0;
    if (c < 0)
        return 0;
    if (end_len == 1 && end[0] == 0)
        return 1;
    return cairn_store_keycmp(k, kl, end, end_len) < 0;
}

/* Emits the collected events of one revision in their original order. */
static int hist_flush(hist_ev *v, size_t n, int64_t rev, cairn_store_history_cb cb, void *arg)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, hist_ev_cmp);
    cairn_event *ev = malloc(n * sizeof *ev);
    if (!ev)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < n; i++)
        ev[i] = v[i].ev;
    int rc = cb(arg, rev, ev, n);
    free(ev);
    return rc;
}

int cairn_store_history(cairn_store *s, int64_t *last, int64_t from, const uint8_t *key,
                        size_t key_len, const uint8_t *range_end, size_t range_end_len,
                        cairn_store_history_cb cb, void *arg)
{
    if (last)
        *last = 0;
    pthread_rwlock_rdlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    int64_t upto = atomic_load(&s->visible);
    if (!rc && from > 0 && from < s->compacted)
        rc = CAIRN_ECOMPACTED;
    /* the snapshot pins what compaction may delete once the lock is gone */
    const leveldb_snapshot_t *snap = rc ? NULL : leveldb_create_snapshot(s->db);
    pthread_rwlock_unlock(&s->rw);
    if (rc)
        return rc;
    if (from < 1)
        from = 1;
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    leveldb_readoptions_set_verify_checksums(ro, 1);
    leveldb_readoptions_set_fill_cache(ro, 0);
    leveldb_readoptions_set_snapshot(ro, snap);
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, ro);
    /* the changes in apply order from the one that made |from| (or the
     * first revision after it): each body record heads its history
     * records and says which revision they belong to */
    uint64_t first;
    int any = cairn_revmap_find_from(&s->rm, &first, from) == 0;
    uint8_t start[9];
    start[0] = 'O';
    cairn_store_be64(start + 1, first);
    hist_ev *v = NULL;
    size_t n = 0, cap = 0;
    store_arena a = {0};
    body_cache bc = {0, NULL};
    store_buf cur_body = {0}; /* the 'O' value of the change being read */
    int64_t cur = 0;
    uint64_t cur_index = 0;
    if (any)
        leveldb_iter_seek(it, (const char *)start, 9);
    for (; any && leveldb_iter_valid(it) && !rc; leveldb_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *k = (const uint8_t *)leveldb_iter_key(it, &kl);
        if (kl < 9 || k[0] != 'O')
            break;
        uint64_t index = cairn_store_get_be64(k + 1);
        if (kl == 9) {
            rc = hist_flush(v, n, cur, cb, arg);
            n = 0;
            cairn_store_arena_free(&a);
            if (rc)
                break;
            const uint8_t *bv = (const uint8_t *)leveldb_iter_value(it, &vl);
            if (vl < 8) {
                rc = cairn_store_corrupt(s, "short change record");
                break;
            }
            cur = (int64_t)cairn_store_get_be64(bv);
            cur_index = index;
            if (cur > upto)
                break;
            /* kept for its history records: they may name its ops */
            cur_body.len = 0;
            rc = cairn_store_buf_put(&cur_body, bv, vl);
            continue;
        }
        if (kl < KREC_KEY_HDR || k[9] != 'K' || index != cur_index || cur == 0) {
            rc = cairn_store_corrupt(s, "a history record without the change that made it");
            break;
        }
        const uint8_t *hk = k + KREC_KEY_HDR;
        size_t hkl = kl - KREC_KEY_HDR;
        if (!in_range(hk, hkl, key, key_len, range_end, range_end_len))
            continue;
        cairn_store_krec r;
        const uint8_t *rv = (const uint8_t *)leveldb_iter_value(it, &vl);
        if (cairn_store_krec_parse(&r, rv, vl)) {
            rc = cairn_store_corrupt(s, "history record");
            break;
        }
        int del = r.del;
        const uint8_t *val = r.val;
        size_t val_len = r.val_len;
        if (r.body) { /* the body is the one this scan just passed */
            if (!bc.c || bc.index != cur_index)
                rc = cairn_store_body_cache_load(s, &bc, cur_index, cur_body.p, cur_body.len);
            if (!rc &&
                cairn_store_krec_body_value(bc.c, s->kvs.counter, r.pos, hk, hkl, &val, &val_len))
                rc = cairn_store_corrupt(s, "history record names an op that did not set its key");
            if (rc)
                break;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            hist_ev *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                rc = CAIRN_ENOMEM;
                break;
            }
            v = nv;
            cap = nc;
        }
        hist_ev *h = &v[n];
        memset(h, 0, sizeof *h);
        h->sub = r.sub;
        h->ev.type = del ? CAIRN_EVENT_DELETE : CAIRN_EVENT_PUT;
        h->ev.kv.key = cairn_store_arena_dup(&a, hk, hkl);
        h->ev.kv.key_len = hkl;
        h->ev.kv.mod_revision = cur;
        if (!del) {
            h->ev.kv.create_revision = (int64_t)r.cr;
            h->ev.kv.version = (int64_t)r.ver;
            h->ev.kv.lease = (int64_t)r.lease;
            h->ev.kv.value_len = val_len;
            h->ev.kv.value = cairn_store_arena_dup(&a, val, val_len);
        }
        if (!h->ev.kv.key || (!del && !h->ev.kv.value)) {
            rc = CAIRN_ENOMEM;
            break;
        }
        n++;
    }
    if (!rc)
        rc = hist_flush(v, n, cur, cb, arg);
    if (!rc) {
        char *err = NULL;
        leveldb_iter_get_error(it, &err);
        rc = cairn_store_db_err(s, err);
    }
    free(v);
    cairn_store_body_cache_free(&bc);
    cairn_store_buf_free(&cur_body);
    cairn_store_arena_free(&a);
    leveldb_iter_destroy(it);
    leveldb_readoptions_destroy(ro);
    leveldb_release_snapshot(s->db, snap);
    if (!rc && last)
        *last = upto;
    return rc;
}
