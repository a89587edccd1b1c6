/*
 * The hash table of crdt/ (see htab.h): growth and deletion. Deletion
 * shifts back the entries of the run after the hole whose home slot is not
 * cyclically in (hole, their slot], so every entry stays reachable from its
 * home without tombstones. In the old array of a growth a deleted entry
 * becomes CAIRN_HTAB_MOVED instead: nothing is put there any more, and
 * shifting could carry an entry back behind the slots already moved.
 */
#include "crdt/htab.h"

#include <stdlib.h>

#include "crdt/error.h"

char cairn_htab_moved_;

void cairn_htab_move_(cairn_htab *t, uint32_t n, cairn_htab_hash_cb hash, const void *arg)
{
    for (; n && t->opos < t->ocap; n--, t->opos++) {
        void *e = t->old[t->opos];
        if (!e || e == CAIRN_HTAB_MOVED)
            continue;
        cairn_htab_place_(t, e, hash(arg, e));
        t->old[t->opos] = CAIRN_HTAB_MOVED;
    }
    if (t->opos == t->ocap) {
        free(t->old);
        t->old = NULL;
        t->ocap = t->opos = 0;
    }
}

int cairn_htab_reserve(cairn_htab *t, uint32_t extra, uint32_t min_cap, cairn_htab_hash_cb hash,
                       const void *arg)
{
    uint64_t need = (uint64_t)t->count + extra;
    if (t->cap && need * 4 <= (uint64_t)t->cap * 3)
        return 0;
    uint64_t cap = t->cap ? t->cap : (min_cap ? min_cap : 4);
    while (need * 4 > cap * 3)
        cap *= 2;
    if (cap > (UINT64_C(1) << 31))
        return CAIRN_ELIMIT;
    void **slots = calloc((size_t)cap, sizeof *slots);
    if (!slots)
        return CAIRN_ENOMEM;
    if (t->old)
        cairn_htab_move_(t, UINT32_MAX, hash, arg);
    if (t->count) {
        t->old = t->slots;
        t->ocap = t->cap;
        t->opos = 0;
    } else {
        free(t->slots);
    }
    t->slots = slots;
    t->cap = (uint32_t)cap;
    return 0;
}

/* Empties slot |i| of the new array and closes the gap. */
static void del_at(cairn_htab *t, uint32_t i, cairn_htab_hash_cb hash, const void *arg)
{
    uint32_t mask = t->cap - 1;
    t->slots[i] = NULL;
    t->count--;
    for (uint32_t j = (i + 1) & mask; t->slots[j]; j = (j + 1) & mask) {
        uint32_t k = cairn_htab_home(t->cap, hash(arg, t->slots[j]));
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays)
            continue;
        t->slots[i] = t->slots[j];
        t->slots[j] = NULL;
        i = j;
    }
}

void cairn_htab_del(cairn_htab *t, const void *e, uint32_t h, cairn_htab_hash_cb hash,
                    const void *arg)
{
    cairn_htab_probe p;
    for (void **s = cairn_htab_probe_start(t, h, &p); s; s = cairn_htab_probe_next(t, &p)) {
        if (*s != e)
            continue;
        if (p.in_old) {
            *s = CAIRN_HTAB_MOVED;
            t->count--;
        } else {
            del_at(t, (uint32_t)(s - t->slots), hash, arg);
        }
        return;
    }
}

void cairn_htab_destroy(cairn_htab *t)
{
    free(t->slots);
    free(t->old);
    *t = (cairn_htab){0};
}
