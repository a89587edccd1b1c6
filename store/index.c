/*
 * The key index: every key with history, in byte order, in a skip list
 * (p = 1/4, so about 1.33 next pointers per key). Each entry carries the
 * key's current create_revision / version / lease and its revision history
 * (8 bytes a revision, the top bit marking a delete), which is what a
 * historical read or a compaction needs; values stay out of memory (the
 * document holds the current one, LevelDB the older ones).
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

static kentry *entry_new(int level, const uint8_t *key, size_t len)
{
    kentry *e = calloc(1, sizeof *e + (size_t)level * sizeof(kentry *) + len);
    if (!e)
        return NULL;
    e->level = (uint8_t)level;
    e->key_len = (uint32_t)len;
    if (len)
        memcpy((uint8_t *)&e->next[level], key, len);
    return e;
}

int cairn_kindex_init(kindex *x)
{
    memset(x, 0, sizeof *x);
    x->head = entry_new(CAIRN_IDX_MAXLVL, NULL, 0);
    if (!x->head)
        return CAIRN_ENOMEM;
    x->level = 1;
    x->rng = 0x9E3779B97F4A7C15ull;
    return 0;
}

void cairn_kindex_destroy(kindex *x)
{
    if (!x->head)
        return;
    kentry *e = x->head->next[0];
    while (e) {
        kentry *n = e->next[0];
        free(e->hist);
        free(e);
        e = n;
    }
    free(x->head);
    x->head = NULL;
}

static int cmp_entry(const kentry *e, const uint8_t *key, size_t len)
{
    return cairn_store_keycmp(kentry_key(e), e->key_len, key, len);
}

/* Fills |upd| with the last entry < key at each level; returns the first >=. */
static kentry *descend(const kindex *x, const uint8_t *key, size_t len, kentry **upd)
{
    kentry *p = x->head;
    for (int l = x->level - 1; l >= 0; l--) {
        while (p->next[l] && cmp_entry(p->next[l], key, len) < 0)
            p = p->next[l];
        if (upd)
            upd[l] = p;
    }
    return p->next[0];
}

kentry *cairn_kindex_seek(const kindex *x, const uint8_t *key, size_t len)
{
    return descend(x, key, len, NULL);
}

kentry *cairn_kindex_find(const kindex *x, const uint8_t *key, size_t len)
{
    kentry *e = descend(x, key, len, NULL);
    return e && cmp_entry(e, key, len) == 0 ? e : NULL;
}

static int random_level(kindex *x)
{
    /* xorshift64: deterministic, no global state */
    uint64_t r = x->rng;
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    x->rng = r;
    int l = 1;
    while (l < CAIRN_IDX_MAXLVL && (r & 3) == 0) {
        l++;
        r >>= 2;
    }
    return l;
}

kentry *cairn_kindex_upsert(kindex *x, const uint8_t *key, size_t len)
{
    kentry *upd[CAIRN_IDX_MAXLVL];
    kentry *e = descend(x, key, len, upd);
    if (e && cmp_entry(e, key, len) == 0)
        return e;
    int lvl = random_level(x);
    if (lvl > x->level) {
        for (int l = x->level; l < lvl; l++)
            upd[l] = x->head;
        x->level = lvl;
    }
    e = entry_new(lvl, key, len);
    if (!e)
        return NULL;
    for (int l = 0; l < lvl; l++) {
        e->next[l] = upd[l]->next[l];
        upd[l]->next[l] = e;
    }
    x->nkeys++;
    return e;
}

int cairn_kindex_remove(kindex *x, const uint8_t *key, size_t len)
{
    kentry *upd[CAIRN_IDX_MAXLVL];
    kentry *e = descend(x, key, len, upd);
    if (!e || cmp_entry(e, key, len) != 0)
        return CAIRN_ENOTFOUND;
    for (int l = 0; l < e->level; l++)
        if (upd[l]->next[l] == e)
            upd[l]->next[l] = e->next[l];
    while (x->level > 1 && !x->head->next[x->level - 1])
        x->level--;
    free(e->hist);
    free(e);
    x->nkeys--;
    return 0;
}

int cairn_kindex_push(kentry *e, uint64_t h)
{
    if (e->nhist == e->cap) {
        uint32_t cap = e->cap ? e->cap * 2 : 1;
        uint64_t *n = realloc(e->hist, cap * sizeof *n);
        if (!n)
            return CAIRN_ENOMEM;
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
