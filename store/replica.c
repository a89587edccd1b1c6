/*
 * The store's side of replication: changes from peers go through the same
 * observer path as local writes (apply.c). A burst of them takes one write
 * lock and one group commit; its completion reports the store's heads once
 * everything it applied is durable, so a node never tells a peer it has a
 * change before its disk does. Per-peer sessions (coming) call these; the
 * sync protocol itself stays in crdt/, sans I/O.
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

/* Applies |n| received changes under the write lock (caller holds it),
 * taking ownership of them; verdicts[i] (may be NULL) as in
 * cairn_store_receive_changes. Returns CAIRN_EIO / ENOMEM when the store
 * broke (the rest are freed unapplied). The burst's records are held back
 * from the committer until the last one is batched: one group commit. */
static int receive_locked(cairn_store *s, cairn_change **chs, size_t n, int *verdicts)
{
    int rc = cairn_store_failed_rc(s);
    pthread_mutex_lock(&s->qmu);
    s->holding++;
    pthread_mutex_unlock(&s->qmu);
    size_t i = 0;
    for (; i < n && !rc; i++) {
        cairn_doc_observer obs;
        int v = cairn_doc_receive(s->doc, chs[i], cairn_store_observer(s, &obs));
        rc = s->obs_rc;
        if (verdicts)
            verdicts[i] = rc ? rc : v;
    }
    for (; i < n; i++) {
        cairn_change_free(chs[i]);
        if (verdicts)
            verdicts[i] = rc;
    }
    pthread_mutex_lock(&s->qmu);
    s->holding--;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return rc;
}

int cairn_store_receive_changes(cairn_store *s, cairn_change **chs, size_t n, int *verdicts,
                                cairn_store_heads_cb cb, void *arg)
{
    pend_wait *w = calloc(1, sizeof *w);
    pthread_rwlock_wrlock(&s->rw);
    int rc = w ? 0 : CAIRN_ENOMEM;
    if (rc) { /* still ours: free them unapplied */
        for (size_t i = 0; i < n; i++)
            cairn_change_free(chs[i]);
        if (verdicts)
            for (size_t i = 0; i < n; i++)
                verdicts[i] = rc;
    } else {
        rc = receive_locked(s, chs, n, verdicts);
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

int cairn_store_receive_async(cairn_store *s, const uint8_t *bytes, size_t len,
                              cairn_store_done_cb cb, void *arg)
{
    cairn_change *c;
    int rc = cairn_change_decode(&c, bytes, len, NULL);
    if (rc)
        return rc;
    pthread_rwlock_wrlock(&s->rw);
    int v = 0;
    rc = receive_locked(s, &c, 1, &v);
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
