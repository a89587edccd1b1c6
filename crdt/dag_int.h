#ifndef CAIRN_DAG_INT_H
#define CAIRN_DAG_INT_H

/*
 * Internals of the DAG, shared by dag.c (add, order), dag_query.c (queries)
 * and dag_ckpt.c (the checkpoint section, the invariant check). Nothing
 * outside crdt/dag*.c includes this header. The layout is explained at the
 * top of dag.c.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/dag.h"
#include "crdt/error.h"
#include "crdt/htab.h"
#include "crdt/wire.h"

/* Beyond CAIRN_DAG_MAX_PENDING changes, pending changes are also bounded by
 * their dependency edges and their bytes, so a hostile peer cannot make the
 * buffer hold more than a few hundred MB. */
#define MAX_PENDING_EDGES (8u * CAIRN_DAG_MAX_PENDING)
#define MAX_PENDING_BYTES ((size_t)256 << 20)

enum { ST_STUB = 0, ST_PENDING = 1, ST_READY = 2, ST_REJECTED = 4 };

#define NO_POS UINT32_MAX

/* A change that is not ordered (or a hash we only heard of). */
typedef struct node {
    cairn_hash hash;
    cairn_change *c; /* NULL for a stub or a rejected change */
    /* Pending nodes that wait for this one. */
    struct node **waiters;
    struct node *next; /* reject_tree's work list */
    uint32_t nwaiters, capwaiters;
    uint32_t nmissing; /* PENDING: deps not ordered yet */
    uint32_t pos;      /* STUB: slot in stubs */
    int why;           /* REJECTED: the verdict (a CAIRN_E* code) */
    uint8_t state;
    /* PENDING: the DAG's clock when it arrived, and its neighbours in the
     * pending list (oldest first; see cairn_dag_expire) */
    uint64_t since;
    struct node *older, *newer;
} node;

struct actor_rec {
    cairn_actor actor;
    uint64_t max_seq;
    uint64_t last_index; /* apply index of change max_seq */
};

struct vec { /* a growable array of pointers */
    void **p;
    size_t n, cap;
};

/* Ordered-table slot: 0 = empty, else (fingerprint << IDX_BITS) | (index + 1). */
#define IDX_BITS 40
#define IDX_MASK ((UINT64_C(1) << IDX_BITS) - 1)
#define FP_MASK UINT64_C(0xFFFFFF)
#define MAX_ORDERED (IDX_MASK - 1)

/* Heads: apply indices, ascending (a new head always has the greatest index,
 * so appending keeps the order); a removed head is flagged and swept out
 * once the flagged ones outnumber the live ones. */
#define HEAD_DEAD (UINT64_C(1) << 63)

struct cairn_dag {
    unsigned char key[CAIRN_HTAB_KEYBYTES]; /* SipHash key of every table */
    cairn_htab nodes;                       /* changes not ordered yet */
    cairn_htab actors;

    /* Ordered changes, by apply index. */
    cairn_hash *ohash;
    uint64_t *dep_off; /* norder + 1 offsets into dep_bytes */
    uint8_t *dep_bytes;
    size_t norder, caporder, ndep_bytes, capdep_bytes;
    uint64_t *otab; /* hash -> index */
    size_t otab_cap;
    int otab_shift;
    /* While otab grows (dag.c): the table it grows from (NULL otherwise),
     * whose slots from |otab_moved| on are still to be copied across. */
    uint64_t *otab_old;
    size_t otab_old_cap, otab_moved;
    int otab_old_shift;

    /* Bodies: a loader, or (no loader) every canonical encoding, appended. */
    cairn_dag_load_cb load;
    void *load_arg;
    /* Changes below |nbodyless| (those a checkpoint restored) have no body
     * here: only a loader can serve them. */
    uint64_t nbodyless;
    uint64_t *body_off; /* norder - nbodyless + 1 offsets into body */
    uint8_t *body;
    size_t nbody, capbody, capbody_off;

    /* Ready FIFO: a ring buffer. */
    node **ready;
    size_t rhead, rlen, rcap;
    uint64_t *heads;
    size_t nheads, capheads, nlive_heads;
    struct vec stubs;
    cairn_hash *sorted_heads;
    size_t nsorted, capsorted;
    int heads_dirty;
    size_t npending, pending_edges, pending_bytes;
    /* Every PENDING node, in the order they arrived (cairn_dag_expire);
     * |now_ms| is the clock of the last expire, |clock_set| once there
     * was one. */
    node *pend_oldest, *pend_newest;
    uint64_t now_ms;
    int clock_set;
    /* The last CAIRN_DAG_MAX_REJECTED changes rejected for good, oldest at
     * |rej_head|, in a ring of |rej_cap| slots that doubles on demand up
     * to that cap: each is a body-less REJECTED node while it is here,
     * which nothing waits for (its waiters were rejected with it). */
    cairn_hash *rej;
    size_t rej_head, rej_n, rej_cap;
    /* Changes the ancestry walks visited (a cost counter the tests read;
     * the walks are const, callers serialise them). */
    uint64_t walk_steps;
};

struct ustack {
    uint64_t *v;
    size_t n, cap;
};

#define BIT(b, i) ((b)[(i) >> 6] >> ((i)&63) & 1)
#define SETBIT(b, i) ((b)[(i) >> 6] |= (uint64_t)1 << ((i)&63))

/* Grows array *p of |size|-byte elements to hold at least |need|. */
static inline int reserve(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, nc * size);
    if (!np)
        return CAIRN_ENOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

/* SipHash-2-4 with a per-DAG random key over all of the key's bytes (a peer
 * chooses dep hashes freely, so any byte left out could be used to pile
 * entries onto one slot). */
static inline uint64_t sip(const cairn_dag *d, const uint8_t *key, size_t klen)
{
    return cairn_htab_sip64(d->key, key, klen);
}

/* The tables (crdt/htab.h): entries (node, actor_rec) start with their key. */
static inline uint32_t node_hash(const void *arg, const void *e)
{
    return cairn_htab_sip(((const cairn_dag *)arg)->key, e, CAIRN_HASH_LEN);
}

static inline uint32_t actor_hash(const void *arg, const void *e)
{
    return cairn_htab_sip(((const cairn_dag *)arg)->key, e, CAIRN_ACTOR_LEN);
}

static inline void *tab_get(const cairn_dag *d, const cairn_htab *t, const uint8_t *key,
                            size_t klen)
{
    cairn_htab_probe p;
    for (void **s = cairn_htab_probe_start(t, cairn_htab_sip(d->key, key, klen), &p); s;
         s = cairn_htab_probe_next(t, &p))
        if (memcmp(*s, key, klen) == 0)
            return *s;
    return NULL;
}

static inline int shift_for(size_t cap)
{
    int shift = 64;
    for (size_t c = cap; c > 1; c >>= 1)
        shift--;
    return shift;
}

static inline node *get_node(const cairn_dag *d, const cairn_hash *h)
{
    return tab_get(d, &d->nodes, h->b, CAIRN_HASH_LEN);
}

/* Looks |h| (slot hash |x|) up in one ordered table: 1 and *index, or 0. */
static inline int otab_find(const cairn_dag *d, const uint64_t *tab, size_t cap, int shift,
                            uint64_t x, const cairn_hash *h, uint64_t *index)
{
    uint64_t fp = x & FP_MASK;
    size_t mask = cap - 1;
    for (size_t i = (size_t)(x >> shift); tab[i]; i = (i + 1) & mask) {
        uint64_t s = tab[i];
        if (s >> IDX_BITS != fp)
            continue;
        uint64_t ix = (s & IDX_MASK) - 1;
        if (memcmp(d->ohash[ix].b, h->b, CAIRN_HASH_LEN) == 0) {
            if (index)
                *index = ix;
            return 1;
        }
    }
    return 0;
}

/* Looks |h| up among ordered changes: 1 and *index, or 0. While the table
 * grows, a change not copied across yet is found in the old one (where
 * every change ordered before the growth stays: nothing is deleted). */
static inline int get_ordered(const cairn_dag *d, const cairn_hash *h, uint64_t *index)
{
    if (!d->otab_cap)
        return 0;
    uint64_t x = sip(d, h->b, CAIRN_HASH_LEN);
    return otab_find(d, d->otab, d->otab_cap, d->otab_shift, x, h, index) ||
           (d->otab_old &&
            otab_find(d, d->otab_old, d->otab_old_cap, d->otab_old_shift, x, h, index));
}

/* Deps of ordered change |i|: [*p, *end) of varint index deltas. */
static inline void deps_range(const cairn_dag *d, uint64_t i, const uint8_t **p,
                              const uint8_t **end)
{
    if (!d->dep_bytes) { /* no change has a dep yet: no offset into NULL */
        *p = *end = NULL;
        return;
    }
    *p = d->dep_bytes + d->dep_off[i];
    *end = d->dep_bytes + d->dep_off[i + 1];
}

static inline int us_push(struct ustack *s, uint64_t x)
{
    if (s->n == s->cap && reserve((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v))
        return CAIRN_ENOMEM;
    s->v[s->n++] = x;
    return 0;
}

#endif
