/*
 * The key index: every key with history, in byte order, in a two-level
 * sorted array. The top level is an array of chunks (and, beside it, each
 * chunk's first entry, so the top binary search reads one pointer per step);
 * a chunk is a sorted array of at most CAIRN_IDX_CHUNK entry pointers. A
 * lookup is two binary searches (about log2(n) key comparisons, each one
 * cache miss for the entry), an insert a memmove of at most one chunk, and
 * a full chunk splits in two (a memmove of the top array, once per
 * CAIRN_IDX_CHUNK/2 inserts at worst). A skip list did the same job first
 * and spent 14 us per random insert at a million keys, chasing ~40 cold
 * pointers; this layout needs about 20 and keeps iteration sequential.
 *
 * Each entry carries the key's current create_revision / version / lease
 * and its revision history (8 bytes a revision, the top bit marking a
 * delete), which is what a historical read or a compaction needs; values
 * stay out of memory (the document holds the current one, LevelDB the
 * older ones).
 *
 * Locking is the caller's: the store mutates the index only under its
 * rwlock's write side and reads it under the read side.
 */

#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "store/store_int.h"

int cairn_store_keycmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen;
    int c = n ? memcmp(a, b, n) : 0;
    if (c)
        return c;
    return alen < blen ? -1 : alen > blen;
}

static int cmp_entry(const kentry *e, const uint8_t *key, size_t len)
{
    return cairn_store_keycmp(e->key, e->key_len, key, len);
}

int cairn_kindex_init(kindex *x)
{
    memset(x, 0, sizeof *x);
    return 0;
}

void cairn_kindex_destroy(kindex *x)
{
    for (size_t i = 0; i < x->nc; i++) {
        kchunk *c = x->c[i];
        for (uint32_t j = 0; j < c->n; j++) {
            if (c->e[j]->hist != &c->e[j]->h1)
                free(c->e[j]->hist);
            free(c->e[j]);
        }
        free(c);
    }
    free(x->c);
    free(x->first);
    memset(x, 0, sizeof *x);
}

/* The chunk that holds |key| or would: the last one whose first key is
 * <= key (0 if key precedes everything). nc > 0. */
static size_t chunk_for(const kindex *x, const uint8_t *key, size_t len)
{
    size_t lo = 1, hi = x->nc; /* invariant: answer in [lo-1, hi-1] */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cmp_entry(x->first[mid], key, len) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - 1;
}

/* First position in |c| with key >= |key|; *eq set if equal. */
static uint32_t pos_in(const kchunk *c, const uint8_t *key, size_t len, int *eq)
{
    uint32_t lo = 0, hi = c->n;
    *eq = 0;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        int r = cmp_entry(c->e[mid], key, len);
        if (r < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
            if (r == 0) {
                *eq = 1;
                return mid;
            }
        }
    }
    return lo;
}

kentry *cairn_kindex_first(kiter *it, const kindex *x)
{
    it->x = x;
    it->ci = 0;
    it->pos = 0;
    return x->nc ? x->c[0]->e[0] : NULL;
}

kentry *cairn_kindex_seek(kiter *it, const kindex *x, const uint8_t *key, size_t len)
{
    it->x = x;
    it->ci = 0;
    it->pos = 0;
    if (!x->nc)
        return NULL;
    size_t ci = chunk_for(x, key, len);
    int eq;
    uint32_t pos = pos_in(x->c[ci], key, len, &eq);
    if (pos == x->c[ci]->n) {
        ci++;
        pos = 0;
        if (ci == x->nc) {
            it->ci = ci;
            return NULL;
        }
    }
    it->ci = ci;
    it->pos = pos;
    return x->c[ci]->e[pos];
}

kentry *cairn_kindex_next(kiter *it)
{
    const kindex *x = it->x;
    if (it->ci >= x->nc)
        return NULL;
    if (++it->pos >= x->c[it->ci]->n) {
        it->ci++;
        it->pos = 0;
        if (it->ci >= x->nc)
            return NULL;
    }
    return x->c[it->ci]->e[it->pos];
}

kentry *cairn_kindex_find(const kindex *x, const uint8_t *key, size_t len)
{
    if (!x->nc)
        return NULL;
    const kchunk *c = x->c[chunk_for(x, key, len)];
    int eq;
    uint32_t pos = pos_in(c, key, len, &eq);
    return eq ? c->e[pos] : NULL;
}

static int top_insert(kindex *x, size_t at, kchunk *c)
{
    if (x->nc == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 16;
        kchunk **nc = realloc(x->c, cap * sizeof *nc);
        if (!nc)
            return CAIRN_ENOMEM;
        x->c = nc;
        kentry **nf = realloc(x->first, cap * sizeof *nf);
        if (!nf)
            return CAIRN_ENOMEM;
        x->first = nf;
        x->cap = cap;
    }
    memmove(x->c + at + 1, x->c + at, (x->nc - at) * sizeof *x->c);
    memmove(x->first + at + 1, x->first + at, (x->nc - at) * sizeof *x->first);
    x->c[at] = c;
    x->first[at] = c->n ? c->e[0] : NULL;
    x->nc++;
    return 0;
}

kentry *cairn_kindex_upsert(kindex *x, const uint8_t *key, size_t len)
{
    size_t ci = 0;
    uint32_t pos = 0;
    if (x->nc) {
        ci = chunk_for(x, key, len);
        int eq;
        pos = pos_in(x->c[ci], key, len, &eq);
        if (eq)
            return x->c[ci]->e[pos];
    }
    kentry *e = calloc(1, sizeof *e + len);
    if (!e)
        return NULL;
    e->key_len = (uint32_t)len;
    e->hist = &e->h1;
    e->cap = 1;
    if (len)
        memcpy(e->key, key, len);
    if (!x->nc) {
        kchunk *c = calloc(1, sizeof *c);
        if (!c || top_insert(x, 0, c)) {
            free(c);
            free(e);
            return NULL;
        }
    }
    kchunk *c = x->c[ci];
    if (c->n == CAIRN_IDX_CHUNK && pos == c->n && ci + 1 < x->nc &&
        x->c[ci + 1]->n < CAIRN_IDX_CHUNK) {
        /* past the end of a full chunk and before the next one's first key:
         * the next chunk's front is the same place in the order, and has
         * room (an ascending run with neighbours swapped lands here) */
        ci++;
        pos = 0;
        c = x->c[ci];
    }
    if (c->n == CAIRN_IDX_CHUNK) {
        /* split: the entries from |half| on move to a new chunk after this
         * one. Usually the upper half; but an insert in the last eighth is
         * most likely one of an ascending run (a load, time-ordered keys),
         * which would leave every chunk half full for good, so there the
         * split is at the insert position and the old chunk stays full. */
        kchunk *n = calloc(1, sizeof *n);
        if (!n) {
            free(e);
            return NULL;
        }
        uint32_t half = CAIRN_IDX_CHUNK / 2;
        int to_new = pos > half; /* the new entry goes to the new chunk */
        if (pos >= CAIRN_IDX_CHUNK - CAIRN_IDX_CHUNK / 8) {
            half = pos;
            to_new = 1;
        }
        memcpy(n->e, c->e + half, (CAIRN_IDX_CHUNK - half) * sizeof *n->e);
        n->n = CAIRN_IDX_CHUNK - half;
        if (top_insert(x, ci + 1, n)) {
            free(n);
            free(e);
            return NULL;
        }
        c->n = half;
        if (to_new) {
            ci++;
            pos -= half;
            c = n;
        }
    }
    memmove(c->e + pos + 1, c->e + pos, (c->n - pos) * sizeof *c->e);
    c->e[pos] = e;
    c->n++;
    x->first[ci] = c->e[0];
    x->nkeys++;
    return e;
}

int cairn_kindex_append(kindex *x, kentry *e)
{
    kchunk *c = x->nc ? x->c[x->nc - 1] : NULL;
    if (!c || c->n == CAIRN_IDX_CHUNK) {
        c = calloc(1, sizeof *c);
        if (!c)
            return CAIRN_ENOMEM;
        c->e[0] = e;
        c->n = 1;
        if (top_insert(x, x->nc, c)) {
            free(c);
            return CAIRN_ENOMEM;
        }
    } else {
        c->e[c->n++] = e;
    }
    x->nkeys++;
    return 0;
}

void cairn_kindex_sweep(kindex *x)
{
    size_t w = 0;
    for (size_t i = 0; i < x->nc; i++) {
        kchunk *c = x->c[i];
        uint32_t k = 0;
        for (uint32_t j = 0; j < c->n; j++) {
            kentry *e = c->e[j];
            if (e->nhist == 0) {
                if (e->hist != &e->h1)
                    free(e->hist);
                free(e);
                x->nkeys--;
            } else {
                c->e[k++] = e;
            }
        }
        c->n = k;
        if (k == 0) {
            free(c);
            continue;
        }
        x->c[w] = c;
        x->first[w] = c->e[0];
        w++;
    }
    x->nc = w;
}

int cairn_kindex_push(kentry *e, uint64_t h)
{
    if (e->nhist == e->cap) {
        uint32_t cap = e->cap * 2;
        int inl = e->hist == &e->h1;
        uint64_t *n = realloc(inl ? NULL : e->hist, cap * sizeof *n);
        if (!n)
            return CAIRN_ENOMEM;
        if (inl)
            memcpy(n, &e->h1, e->nhist * sizeof *n);
        e->hist = n;
        e->cap = cap;
    }
    e->hist[e->nhist++] = h;
    return 0;
}

uint64_t cairn_kindex_at(const kentry *e, int64_t rev, uint32_t *pos)
{
    /* last entry with revision <= rev */
    uint32_t lo = 0, hi = e->nhist;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if ((int64_t)(e->hist[mid] & ~CAIRN_IDX_TOMB) <= rev)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return 0;
    if (pos)
        *pos = lo - 1;
    return e->hist[lo - 1];
}
