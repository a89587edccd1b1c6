/*
 * The revision -> apply index map (see store_int.h). It replaces the 'R'
 * records of format 1: which change made a revision is a pure function of
 * the apply order, so it is derived in memory at replay instead of being
 * written once per change. Runs: for revisions in [rev[i], rev[i+1]) the
 * index is idx[i] + (r - rev[i]); a lookup is one binary search.
 */

#include <stdlib.h>

#include "crdt/error.h"
#include "store/store_int.h"

int cairn_revmap_init(revmap *m)
{
    m->rev = NULL;
    m->idx = NULL;
    m->n = m->cap = 0;
    m->last = 0;
    return pthread_mutex_init(&m->mu, NULL) ? CAIRN_ENOMEM : 0;
}

void cairn_revmap_destroy(revmap *m)
{
    free(m->rev);
    free(m->idx);
    m->rev = NULL;
    m->idx = NULL;
    m->n = m->cap = 0;
    pthread_mutex_destroy(&m->mu);
}

int cairn_revmap_add(revmap *m, int64_t rev, uint64_t index)
{
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    size_t n = m->n;
    if (rev <= m->last) {
        rc = CAIRN_EINVAL; /* revisions only grow */
        goto out;
    }
    m->last = rev;
    if (n && m->idx[n - 1] + (uint64_t)(rev - m->rev[n - 1]) == index)
        goto out; /* continues the last run */
    if (n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        int64_t *r = realloc(m->rev, cap * sizeof *r);
        if (r)
            m->rev = r;
        uint64_t *x = r ? realloc(m->idx, cap * sizeof *x) : NULL;
        if (!x) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
        m->idx = x;
        m->cap = cap;
    }
    m->rev[n] = rev;
    m->idx[n] = index;
    m->n = n + 1;
out:
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* The index of the change that made |rev|, which must be in [rev[0], last];
 * the caller holds m->mu. */
static uint64_t index_of(const revmap *m, int64_t rev)
{
    size_t lo = 0, hi = m->n; /* first run with rev > |rev| */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->rev[mid] <= rev)
            lo = mid + 1;
        else
            hi = mid;
    }
    return m->idx[lo - 1] + (uint64_t)(rev - m->rev[lo - 1]);
}

int cairn_revmap_find(revmap *m, uint64_t *index, int64_t rev)
{
    *index = 0;
    pthread_mutex_lock(&m->mu);
    int rc = CAIRN_ENOTFOUND;
    if (m->n && rev >= m->rev[0] && rev <= m->last) {
        *index = index_of(m, rev);
        rc = 0;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int cairn_revmap_find_from(revmap *m, uint64_t *index, int64_t rev)
{
    *index = 0;
    pthread_mutex_lock(&m->mu);
    int rc = CAIRN_ENOTFOUND;
    if (m->n && rev <= m->last) {
        *index = index_of(m, rev < m->rev[0] ? m->rev[0] : rev);
        rc = 0;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int cairn_revmap_rev_of(revmap *m, int64_t *rev, uint64_t index)
{
    *rev = 1; /* etcd: a fresh store is at revision 1 */
    int took = 0;
    pthread_mutex_lock(&m->mu);
    size_t lo = 0, hi = m->n; /* first run with idx > |index| */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->idx[mid] <= index)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo) {
        size_t i = lo - 1;
        int64_t end = i + 1 < m->n ? m->rev[i + 1] - 1 : m->last; /* the run's last rev */
        uint64_t off = index - m->idx[i];
        if (off <= (uint64_t)(end - m->rev[i])) {
            *rev = m->rev[i] + (int64_t)off;
            took = 1;
        } else {
            *rev = end;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return took;
}
