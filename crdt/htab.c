/*
 * The hash table of crdt/ (see htab.h): growth and deletion. Deletion
 * shifts back the entries of the run after the hole whose home slot is not
 * cyclically in (hole, their slot], so every entry stays reachable from its
 * home without tombstones.
 */
#include "crdt/htab.h"

#include <stdlib.h>

#include "crdt/error.h"

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
    void **old = t->slots;
    uint32_t ocap = t->cap;
    *t = (cairn_htab){slots, (uint32_t)cap, 0};
    for (uint32_t i = 0; i < ocap; i++)
        if (old[i])
            cairn_htab_put(t, old[i], hash(arg, old[i]));
    free(old);
    return 0;
}

void cairn_htab_del_at(cairn_htab *t, uint32_t i, cairn_htab_hash_cb hash, const void *arg)
{
    t->slots[i] = NULL;
    t->count--;
    for (uint32_t j = cairn_htab_next(t, i); t->slots[j]; j = cairn_htab_next(t, j)) {
        uint32_t k = cairn_htab_at(t, hash(arg, t->slots[j]));
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
    if (!t->cap)
        return;
    for (uint32_t i = cairn_htab_at(t, h); t->slots[i]; i = cairn_htab_next(t, i)) {
        if (t->slots[i] == e) {
            cairn_htab_del_at(t, i, hash, arg);
            return;
        }
    }
}

void cairn_htab_destroy(cairn_htab *t)
{
    free(t->slots);
    *t = (cairn_htab){0};
}
