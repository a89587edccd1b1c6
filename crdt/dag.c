/*
 * The hash DAG of changes: which changes this node has, in which order it
 * applied them, which wait for dependencies, and the ancestry queries that
 * sync needs.
 *
 * Two kinds of record. A change that is not ordered yet is a node in one
 * open-addressing table of pointers (crdt/htab.h: linear probing,
 * backward-shift deletion): READY (all deps ordered, queued for the caller), PENDING (some
 * dep not ordered yet), a STUB (a hash that pending changes depend on but
 * that we have never seen) or REJECTED (a change that broke the sequence
 * rule and that pending changes still wait for, forever). Every such node
 * keeps the list of pending nodes waiting for it; ordering it decrements
 * their missing-counts and queues those that reach zero. So delivery in any
 * order costs O(deps) per change, with no rescans of the pending buffer.
 *
 * An ORDERED change is no node at all but one row of parallel arrays indexed
 * by its apply index: its hash (32 bytes), the offset of its deps in one
 * shared byte string (deps as apply indices, each a varint of "my index minus
 * the dep's", so the common dep, the change just before, is one byte), and a
 * slot in a second hash table whose 8-byte slots hold the index and 24 bits
 * of the slot hash (a probe rarely touches the hash array). That is about 60
 * bytes per change, whatever the change carried. Its body is not kept: a
 * loader (cairn_dag_set_loader) reads it back from storage on demand and the
 * DAG checks it against the hash. Without a loader (tests, benchmarks, the
 * in-memory replicas of the fuzzers) the DAG keeps the canonical bytes of
 * every ordered change in one append-only log instead, never decoded structs.
 *
 * The sequence rule (seq n needs the author's n-1 among its ancestors) is
 * checked against the author's last ordered change: ordered changes of one
 * author always form the contiguous run 1..max, so n <= max is a fork, n >
 * max+1 a gap, and n == max+1 needs change max (at apply index L) among the
 * ancestors. The common case finds it among the deps directly; otherwise a
 * walk back from the deps never visits an index below L (an ancestor always
 * has a smaller index), so it visits at most the changes ordered since the
 * author's previous one: few in honest histories, O(n) in a hostile one.
 * Walks use explicit stacks and bitmaps over the span they may visit, never
 * recursion.
 *
 * Table slots are placed by SipHash with a per-DAG random key, so a peer
 * that picks dependency hashes (or grinds change hashes) cannot make probe
 * chains long.
 */
#include "crdt/dag.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

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
    uint32_t nwaiters, capwaiters;
    uint32_t nmissing; /* PENDING: deps not ordered yet */
    uint32_t pos;      /* STUB: slot in stubs */
    uint8_t state;
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
};

/* ---- small containers ---------------------------------------------- */

static int vec_push(struct vec *v, void *p)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        void **np = realloc(v->p, cap * sizeof *np);
        if (!np)
            return CAIRN_ENOMEM;
        v->p = np;
        v->cap = cap;
    }
    v->p[v->n++] = p;
    return 0;
}

/* Grows array *p of |size|-byte elements to hold at least |need|. */
static int reserve(void **p, size_t *cap, size_t need, size_t size)
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

/* Reads a varint this file wrote (trusted: no bounds beyond the writer's). */
static uint64_t get_uv(const uint8_t **pp)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int s = 0;
    while (*p & 0x80) {
        v |= (uint64_t)(*p++ & 0x7F) << s;
        s += 7;
    }
    v |= (uint64_t)*p++ << s;
    *pp = p;
    return v;
}

/* SipHash-2-4 with a per-DAG random key over all of the key's bytes (a peer
 * chooses dep hashes freely, so any byte left out could be used to pile
 * entries onto one slot). */
static uint64_t sip(const cairn_dag *d, const uint8_t *key, size_t klen)
{
    return cairn_htab_sip64(d->key, key, klen);
}

/* The tables (crdt/htab.h): entries (node, actor_rec) start with their key. */
static uint32_t node_hash(const void *arg, const void *e)
{
    return cairn_htab_sip(((const cairn_dag *)arg)->key, e, CAIRN_HASH_LEN);
}

static uint32_t actor_hash(const void *arg, const void *e)
{
    return cairn_htab_sip(((const cairn_dag *)arg)->key, e, CAIRN_ACTOR_LEN);
}

static void *tab_get(const cairn_dag *d, const cairn_htab *t, const uint8_t *key, size_t klen)
{
    if (!t->cap)
        return NULL;
    for (uint32_t i = cairn_htab_at(t, cairn_htab_sip(d->key, key, klen)); t->slots[i];
         i = cairn_htab_next(t, i))
        if (memcmp(t->slots[i], key, klen) == 0)
            return t->slots[i];
    return NULL;
}

static int shift_for(size_t cap)
{
    int shift = 64;
    for (size_t c = cap; c > 1; c >>= 1)
        shift--;
    return shift;
}

static node *get_node(const cairn_dag *d, const cairn_hash *h)
{
    return tab_get(d, &d->nodes, h->b, CAIRN_HASH_LEN);
}

/* ---- the ordered table ------------------------------------------------- */

/* Looks |h| up among ordered changes: 1 and *index, or 0. */
static int get_ordered(const cairn_dag *d, const cairn_hash *h, uint64_t *index)
{
    if (!d->otab_cap)
        return 0;
    uint64_t x = sip(d, h->b, CAIRN_HASH_LEN), fp = x & FP_MASK;
    size_t mask = d->otab_cap - 1;
    for (size_t i = (size_t)(x >> d->otab_shift); d->otab[i]; i = (i + 1) & mask) {
        uint64_t s = d->otab[i];
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

static void otab_insert(uint64_t *tab, size_t cap, int shift, uint64_t x, uint64_t index)
{
    size_t i = (size_t)(x >> shift), mask = cap - 1;
    while (tab[i])
        i = (i + 1) & mask;
    tab[i] = ((x & FP_MASK) << IDX_BITS) | (index + 1);
}

/* Room for one more ordered change at load <= 3/4. */
static int otab_reserve(cairn_dag *d)
{
    if (d->otab_cap && (d->norder + 1) * 4 <= d->otab_cap * 3)
        return 0;
    size_t cap = d->otab_cap ? d->otab_cap * 2 : 64;
    uint64_t *t = calloc(cap, sizeof *t);
    if (!t)
        return CAIRN_ENOMEM;
    int shift = shift_for(cap);
    for (size_t i = 0; i < d->norder; i++)
        otab_insert(t, cap, shift, sip(d, d->ohash[i].b, CAIRN_HASH_LEN), i);
    free(d->otab);
    d->otab = t;
    d->otab_cap = cap;
    d->otab_shift = shift;
    return 0;
}

/* Deps of ordered change |i|: [*p, *end) of varint index deltas. */
static void deps_range(const cairn_dag *d, uint64_t i, const uint8_t **p, const uint8_t **end)
{
    if (!d->dep_bytes) { /* no change has a dep yet: no offset into NULL */
        *p = *end = NULL;
        return;
    }
    *p = d->dep_bytes + d->dep_off[i];
    *end = d->dep_bytes + d->dep_off[i + 1];
}

/* ---- life cycle ------------------------------------------------------ */

int cairn_dag_new(cairn_dag **out)
{
    *out = NULL;
    if (sodium_init() < 0)
        return CAIRN_EINVAL;
    cairn_dag *d = calloc(1, sizeof *d);
    if (!d)
        return CAIRN_ENOMEM;
    randombytes_buf(d->key, sizeof d->key);
    *out = d;
    return 0;
}

int cairn_dag_set_loader(cairn_dag *d, cairn_dag_load_cb fn, void *arg)
{
    if (d->norder > d->nbodyless)
        return CAIRN_ESTATE;
    d->load = fn;
    d->load_arg = arg;
    return 0;
}

static void node_free(node *n)
{
    cairn_change_free(n->c);
    free(n->waiters);
    free(n);
}

void cairn_dag_free(cairn_dag *d)
{
    if (!d)
        return;
    for (uint32_t i = 0; i < d->nodes.cap; i++)
        if (d->nodes.slots[i])
            node_free(d->nodes.slots[i]);
    for (uint32_t i = 0; i < d->actors.cap; i++)
        free(d->actors.slots[i]);
    cairn_htab_destroy(&d->nodes);
    cairn_htab_destroy(&d->actors);
    free(d->ohash);
    free(d->dep_off);
    free(d->dep_bytes);
    free(d->otab);
    free(d->body_off);
    free(d->body);
    free(d->ready);
    free(d->heads);
    free(d->stubs.p);
    free(d->sorted_heads);
    free(d);
}

/* ---- membership lists ------------------------------------------------ */

static void list_remove(struct vec *v, node *n)
{
    if (n->pos == NO_POS)
        return;
    node *last = v->p[--v->n];
    v->p[n->pos] = last;
    last->pos = n->pos;
    n->pos = NO_POS;
}

static int list_add(struct vec *v, node *n)
{
    int rc = vec_push(v, n);
    if (!rc)
        n->pos = (uint32_t)(v->n - 1);
    return rc;
}

static int add_waiter(node *dep, node *w)
{
    if (dep->nwaiters == dep->capwaiters) {
        uint32_t cap = dep->capwaiters ? dep->capwaiters * 2 : 2;
        node **np = realloc(dep->waiters, cap * sizeof *np);
        if (!np)
            return CAIRN_ENOMEM;
        dep->waiters = np;
        dep->capwaiters = cap;
    }
    dep->waiters[dep->nwaiters++] = w;
    return 0;
}

/* Makes room in the ready ring for |extra| more nodes. */
static int ready_reserve(cairn_dag *d, size_t extra)
{
    if (d->rcap - d->rlen >= extra)
        return 0;
    size_t cap = d->rcap ? d->rcap : 16;
    while (cap - d->rlen < extra)
        cap *= 2;
    node **np = malloc(cap * sizeof *np);
    if (!np)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < d->rlen; i++)
        np[i] = d->ready[(d->rhead + i) % d->rcap];
    free(d->ready);
    d->ready = np;
    d->rhead = 0;
    d->rcap = cap;
    return 0;
}

/* Queues |n|; room must be reserved. */
static void ready_push(cairn_dag *d, node *n)
{
    d->ready[(d->rhead + d->rlen) % d->rcap] = n;
    d->rlen++;
    n->state = ST_READY;
}

/* Removes a node that nothing refers to from the table and frees it. */
static void drop_node(cairn_dag *d, node *n)
{
    cairn_htab_del(&d->nodes, n, node_hash(d, n), node_hash, d);
    node_free(n);
}

/* ---- add ------------------------------------------------------------- */

int cairn_dag_add(cairn_dag *d, cairn_change *c, int *state)
{
    int rc;
    *state = CAIRN_DAG_KNOWN;
    if (!c)
        return CAIRN_EINVAL;
    if (get_ordered(d, &c->hash, NULL)) {
        cairn_change_free(c);
        return 0;
    }
    node *n = get_node(d, &c->hash);
    if (n && n->state != ST_STUB) {
        cairn_change_free(c);
        return 0;
    }
    /* Room for this node and a stub per dep, so no insert below fails. */
    if ((rc = cairn_htab_reserve(&d->nodes, c->ndeps + 1, 64, node_hash, d)))
        goto fail;

    uint32_t missing = 0;
    for (uint32_t i = 0; i < c->ndeps; i++)
        if (!get_ordered(d, &c->deps[i], NULL))
            missing++;
    if (missing) {
        if (d->npending >= CAIRN_DAG_MAX_PENDING ||
            d->pending_edges + missing > MAX_PENDING_EDGES ||
            c->len > MAX_PENDING_BYTES - d->pending_bytes) {
            rc = CAIRN_ELIMIT;
            goto fail;
        }
    }

    int fresh = !n;
    if (fresh) {
        n = calloc(1, sizeof *n);
        if (!n) {
            rc = CAIRN_ENOMEM;
            goto fail;
        }
        n->hash = c->hash;
        n->pos = NO_POS;
        cairn_htab_put(&d->nodes, n, node_hash(d, n));
    }

    if (missing) {
        /* Register with every dep that is not ordered, creating stubs. */
        uint32_t done = 0;
        for (; done < c->ndeps; done++) {
            if (get_ordered(d, &c->deps[done], NULL))
                continue;
            node *dep = get_node(d, &c->deps[done]);
            if (!dep) {
                dep = calloc(1, sizeof *dep);
                if (!dep || list_add(&d->stubs, dep)) {
                    free(dep);
                    rc = CAIRN_ENOMEM;
                    break;
                }
                dep->hash = c->deps[done];
                dep->state = ST_STUB;
                cairn_htab_put(&d->nodes, dep, node_hash(d, dep));
            }
            if ((rc = add_waiter(dep, n))) {
                if (dep->state == ST_STUB && dep->nwaiters == 0) {
                    list_remove(&d->stubs, dep);
                    drop_node(d, dep);
                }
                break;
            }
        }
        if (done < c->ndeps) {
            /* Undo: we are the last waiter of each dep registered so far. */
            for (uint32_t i = 0; i < done; i++) {
                node *dep = get_node(d, &c->deps[i]);
                if (!dep)
                    continue; /* ordered */
                dep->nwaiters--;
                if (dep->state == ST_STUB && dep->nwaiters == 0) {
                    list_remove(&d->stubs, dep);
                    drop_node(d, dep);
                }
            }
            goto fail_node;
        }
        if (!fresh)
            list_remove(&d->stubs, n);
        n->c = c;
        n->state = ST_PENDING;
        n->nmissing = missing;
        d->npending++;
        d->pending_edges += missing;
        d->pending_bytes += c->len;
        *state = CAIRN_DAG_PENDING;
        return 0;
    }

    if ((rc = ready_reserve(d, 1)))
        goto fail_node;
    ready_push(d, n);
    if (!fresh)
        list_remove(&d->stubs, n);
    n->c = c;
    *state = CAIRN_DAG_READY;
    return 0;

fail_node:
    if (fresh)
        drop_node(d, n);
    else
        n->state = ST_STUB;
fail:
    cairn_change_free(c);
    return rc;
}

/* ---- ready / order / discard ---------------------------------------- */

const cairn_change *cairn_dag_peek_ready(const cairn_dag *d)
{
    return d->rlen ? d->ready[d->rhead]->c : NULL;
}

static node *ready_pop(cairn_dag *d)
{
    node *n = d->ready[d->rhead];
    d->rhead = (d->rhead + 1) % d->rcap;
    d->rlen--;
    return n;
}

void cairn_dag_discard(cairn_dag *d)
{
    if (!d->rlen)
        return;
    node *n = ready_pop(d);
    cairn_change_free(n->c);
    n->c = NULL;
    /* Pending changes that wait for it keep waiting: it is unknown again. */
    if (n->nwaiters && list_add(&d->stubs, n) == 0) {
        n->state = ST_STUB;
        return;
    }
    if (n->nwaiters) {
        /* Out of memory for the stub list: keep it as a stub that missing()
         * does not report rather than lose its waiters. */
        n->state = ST_STUB;
        n->pos = NO_POS;
        return;
    }
    drop_node(d, n);
}

/* Drops the front ready change for breaking the sequence rule. That verdict
 * is final (its ancestors are fixed, and the change it forks stays ordered),
 * so if pending changes wait for it a body-less REJECTED node stays: has()
 * reports it known, missing() does not ask for it again, add() drops it. */
static void reject(cairn_dag *d)
{
    node *n = ready_pop(d);
    cairn_change_free(n->c);
    n->c = NULL;
    if (n->nwaiters) {
        n->state = ST_REJECTED;
        return;
    }
    drop_node(d, n);
}

/* A growable stack of apply indices. */
struct ustack {
    uint64_t *v;
    size_t n, cap;
};

static int us_push(struct ustack *s, uint64_t x)
{
    if (s->n == s->cap && reserve((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v))
        return CAIRN_ENOMEM;
    s->v[s->n++] = x;
    return 0;
}

#define BIT(b, i) ((b)[(i) >> 6] >> ((i)&63) & 1)
#define SETBIT(b, i) ((b)[(i) >> 6] |= (uint64_t)1 << ((i)&63))

/* Is the ordered change at index |target| an ancestor of |c|'s deps?
 * 1 / 0, or CAIRN_ENOMEM. */
static int reaches(const cairn_dag *d, const cairn_change *c, uint64_t target)
{
    uint64_t ix;
    for (uint32_t i = 0; i < c->ndeps; i++)
        if (get_ordered(d, &c->deps[i], &ix) && ix == target)
            return 1;
    /* Only indices in [target, norder) can lead to target. */
    uint64_t span = d->norder - target;
    uint64_t *seen = calloc(span / 64 + 1, sizeof *seen);
    struct ustack st = {0};
    int rc = CAIRN_ENOMEM;
    if (!seen)
        goto out;
    for (uint32_t i = 0; i < c->ndeps; i++) {
        if (get_ordered(d, &c->deps[i], &ix) && ix > target && !BIT(seen, ix - target)) {
            SETBIT(seen, ix - target);
            if (us_push(&st, ix))
                goto out;
        }
    }
    rc = 0;
    while (st.n && !rc) {
        uint64_t x = st.v[--st.n];
        const uint8_t *p, *end;
        deps_range(d, x, &p, &end);
        while (p < end) {
            uint64_t dep = x - get_uv(&p);
            if (dep < target || BIT(seen, dep - target))
                continue;
            if (dep == target) {
                rc = 1;
                break;
            }
            SETBIT(seen, dep - target);
            if (us_push(&st, dep)) {
                rc = CAIRN_ENOMEM;
                break;
            }
        }
    }
out:
    free(seen);
    free(st.v);
    return rc;
}

/* Binary search for head |ix| (flagged or not); its position or -1. */
static ptrdiff_t head_find(const cairn_dag *d, uint64_t ix)
{
    size_t lo = 0, hi = d->nheads;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t v = d->heads[mid] & ~HEAD_DEAD;
        if (v == ix)
            return (ptrdiff_t)mid;
        if (v < ix)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static void heads_sweep(cairn_dag *d)
{
    size_t k = 0;
    for (size_t i = 0; i < d->nheads; i++)
        if (!(d->heads[i] & HEAD_DEAD))
            d->heads[k++] = d->heads[i];
    d->nheads = k;
}

int cairn_dag_order(cairn_dag *d, uint64_t *index, cairn_change **body)
{
    int rc;
    if (index)
        *index = 0;
    if (body)
        *body = NULL;
    if (!d->rlen)
        return CAIRN_ESTATE;
    node *n = d->ready[d->rhead];
    cairn_change *c = n->c;

    struct actor_rec *a = tab_get(d, &d->actors, c->actor.b, CAIRN_ACTOR_LEN);
    uint64_t max = a ? a->max_seq : 0;
    if (c->seq <= max) {
        reject(d);
        return CAIRN_EFORK;
    }
    if (c->seq > max + 1) {
        reject(d);
        return CAIRN_ESEQGAP;
    }
    if (max > 0) {
        rc = reaches(d, c, a->last_index);
        if (rc < 0)
            return rc; /* ENOMEM: still ready, may be retried */
        if (rc == 0) {
            reject(d);
            return CAIRN_ESEQGAP;
        }
    }
    if (d->norder >= MAX_ORDERED)
        return CAIRN_ELIMIT;

    /* Reserve everything first so that the state changes below cannot fail
     * half-way. */
    if (!a) {
        if ((rc = cairn_htab_reserve(&d->actors, 1, 64, actor_hash, d)))
            return rc;
        a = calloc(1, sizeof *a);
        if (!a)
            return CAIRN_ENOMEM;
        a->actor = c->actor;
        cairn_htab_put(&d->actors, a, actor_hash(d, a));
    }
    size_t cap = d->caporder;
    if ((rc = reserve((void **)&d->ohash, &cap, d->norder + 1, sizeof *d->ohash)))
        return rc;
    if (cap != d->caporder) {
        size_t c2 = d->caporder ? d->caporder + 1 : 0;
        if ((rc = reserve((void **)&d->dep_off, &c2, cap + 1, sizeof *d->dep_off)))
            return rc;
        d->caporder = cap;
    }
    if (!d->load && (rc = reserve((void **)&d->body_off, &d->capbody_off,
                                  d->norder - d->nbodyless + 2, sizeof *d->body_off)))
        return rc;
    if ((rc = reserve((void **)&d->dep_bytes, &d->capdep_bytes,
                      d->ndep_bytes + (size_t)c->ndeps * 10, 1)))
        return rc;
    if (!d->load && (rc = reserve((void **)&d->body, &d->capbody, d->nbody + c->len, 1)))
        return rc;
    if ((rc = otab_reserve(d)))
        return rc;
    if ((rc = reserve((void **)&d->heads, &d->capheads, d->nheads + 1, sizeof *d->heads)))
        return rc;
    size_t unblocked = 0;
    for (uint32_t i = 0; i < n->nwaiters; i++)
        unblocked += n->waiters[i]->nmissing == 1;
    if ((rc = ready_reserve(d, unblocked)))
        return rc;

    /* Nothing fails from here on. */
    ready_pop(d);
    uint64_t ix = d->norder++;
    d->ohash[ix] = c->hash;
    if (ix == 0)
        d->dep_off[0] = 0;
    if (!d->load && ix == d->nbodyless)
        d->body_off[0] = 0;
    for (uint32_t i = 0; i < c->ndeps; i++) {
        uint64_t di;
        get_ordered(d, &c->deps[i], &di); /* ready: every dep is ordered */
        d->ndep_bytes = (size_t)(wire_put_uv(d->dep_bytes + d->ndep_bytes, ix - di) - d->dep_bytes);
        ptrdiff_t hp = head_find(d, di);
        if (hp >= 0 && !(d->heads[hp] & HEAD_DEAD)) {
            d->heads[hp] |= HEAD_DEAD;
            d->nlive_heads--;
        }
    }
    d->dep_off[ix + 1] = d->ndep_bytes;
    if (!d->load) {
        memcpy(d->body + d->nbody, c->bytes, c->len);
        d->nbody += c->len;
        d->body_off[ix - d->nbodyless + 1] = d->nbody;
    }
    otab_insert(d->otab, d->otab_cap, d->otab_shift, sip(d, c->hash.b, CAIRN_HASH_LEN), ix);
    if (d->nheads > 2 * d->nlive_heads + 16)
        heads_sweep(d);
    d->heads[d->nheads++] = ix; /* room reserved above; sweeping only shrinks */
    d->nlive_heads++;
    d->heads_dirty = 1;
    a->max_seq = c->seq;
    a->last_index = ix;

    for (uint32_t i = 0; i < n->nwaiters; i++) {
        node *w = n->waiters[i];
        d->pending_edges--;
        if (--w->nmissing == 0) {
            d->npending--;
            d->pending_bytes -= w->c->len;
            ready_push(d, w); /* room reserved above */
        }
    }
    /* The node's work is done: the row above is all that stays. */
    n->c = NULL;
    drop_node(d, n);
    if (body)
        *body = c;
    else
        cairn_change_free(c);
    if (index)
        *index = ix;
    return 0;
}

/* ---- queries --------------------------------------------------------- */

uint64_t cairn_dag_count(const cairn_dag *d)
{
    return d->norder;
}

const cairn_hash *cairn_dag_hash_at(const cairn_dag *d, uint64_t index)
{
    return index < d->norder ? &d->ohash[index] : NULL;
}

size_t cairn_dag_deps_at(uint64_t *out, size_t cap, const cairn_dag *d, uint64_t index)
{
    if (index >= d->norder)
        return 0;
    const uint8_t *p, *end;
    deps_range(d, index, &p, &end);
    size_t n = 0;
    while (p < end) {
        uint64_t dep = index - get_uv(&p);
        if (n < cap)
            out[n] = dep;
        n++;
    }
    return n;
}

int cairn_dag_load_bytes(uint8_t **bytes, size_t *len, const cairn_dag *d, uint64_t index)
{
    *bytes = NULL;
    *len = 0;
    if (index >= d->norder)
        return CAIRN_ENOTFOUND;
    uint8_t *b = NULL;
    size_t n = 0;
    if (!d->load) {
        if (index < d->nbodyless)
            return CAIRN_ENOTFOUND; /* restored from a checkpoint: no body here */
        const uint64_t *off = d->body_off + (index - d->nbodyless);
        n = (size_t)(off[1] - off[0]);
        b = malloc(n ? n : 1);
        if (!b)
            return CAIRN_ENOMEM;
        memcpy(b, d->body + off[0], n);
    } else {
        int rc = d->load(d->load_arg, index, &b, &n);
        if (rc) {
            free(b);
            return rc < 0 ? rc : CAIRN_EIO;
        }
        /* Storage is not trusted to hand back what was ordered. */
        cairn_hash h;
        if (b)
            cairn_hash_bytes(&h, b, n);
        if (!b || cairn_hash_cmp(&h, &d->ohash[index]) != 0) {
            free(b);
            return CAIRN_ECORRUPT;
        }
    }
    *bytes = b;
    *len = n;
    return 0;
}

int cairn_dag_load(cairn_change **out, const cairn_dag *d, uint64_t index)
{
    *out = NULL;
    uint8_t *b;
    size_t n;
    int rc = cairn_dag_load_bytes(&b, &n, d, index);
    if (rc)
        return rc;
    rc = cairn_change_decode(out, b, n, &d->ohash[index]);
    free(b);
    if (rc && rc != CAIRN_ENOMEM)
        rc = CAIRN_ECORRUPT; /* it hashed right, so it was never canonical */
    return rc;
}

int cairn_dag_find(const cairn_dag *d, const cairn_hash *h, uint64_t *index)
{
    uint64_t ix;
    if (!get_ordered(d, h, &ix))
        return CAIRN_ENOTFOUND;
    if (index)
        *index = ix;
    return 0;
}

int cairn_dag_has(const cairn_dag *d, const cairn_hash *h)
{
    if (get_ordered(d, h, NULL))
        return 1;
    node *n = get_node(d, h);
    return !n || n->state == ST_STUB ? 0 : 2;
}

static int cmp_hash(const void *a, const void *b)
{
    return cairn_hash_cmp(a, b);
}

size_t cairn_dag_heads(const cairn_dag *d, const cairn_hash **heads)
{
    /* The sorted copy is a cache; rebuilding it changes nothing observable. */
    cairn_dag *m = (cairn_dag *)d;
    if (m->heads_dirty) {
        size_t k = d->nlive_heads;
        if (m->capsorted < k) {
            cairn_hash *np = realloc(m->sorted_heads, k * sizeof *np);
            if (!np) {
                *heads = NULL;
                return 0;
            }
            m->sorted_heads = np;
            m->capsorted = k;
        }
        k = 0;
        for (size_t i = 0; i < d->nheads; i++)
            if (!(d->heads[i] & HEAD_DEAD))
                m->sorted_heads[k++] = d->ohash[d->heads[i]];
        qsort(m->sorted_heads, k, sizeof(cairn_hash), cmp_hash);
        m->nsorted = k;
        m->heads_dirty = 0;
    }
    *heads = m->nsorted ? m->sorted_heads : NULL;
    return m->nsorted;
}

uint64_t cairn_dag_actor_seq(const cairn_dag *d, const cairn_actor *actor)
{
    struct actor_rec *a = tab_get(d, &d->actors, actor->b, CAIRN_ACTOR_LEN);
    return a ? a->max_seq : 0;
}

/* Marks in |bits| (indices >= |floor|, bit i - floor) every ordered ancestor
 * of the ordered changes among |heads|, inclusive. Unknown heads: ENOTFOUND
 * if |strict|, else skipped. With |target| != UINT64_MAX, stops with 1 as
 * soon as it is marked. */
static int mark_ancestors(uint64_t *bits, const cairn_dag *d, const cairn_hash *heads,
                          size_t nheads, int strict, uint64_t floor, uint64_t target)
{
    struct ustack st = {0};
    int rc = 0;
#define SEEN(i) (bits[((i)-floor) >> 6] >> (((i)-floor) & 63) & 1)
#define SET(i) (bits[((i)-floor) >> 6] |= (uint64_t)1 << (((i)-floor) & 63))
    for (size_t i = 0; i < nheads; i++) {
        uint64_t ix;
        if (!get_ordered(d, &heads[i], &ix)) {
            if (strict) {
                rc = CAIRN_ENOTFOUND;
                goto out;
            }
            continue;
        }
        if (ix < floor || SEEN(ix))
            continue;
        SET(ix);
        if (ix == target) {
            rc = 1;
            goto out;
        }
        if ((rc = us_push(&st, ix)))
            goto out;
    }
    while (st.n) {
        uint64_t x = st.v[--st.n];
        const uint8_t *p, *end;
        deps_range(d, x, &p, &end);
        while (p < end) {
            uint64_t dep = x - get_uv(&p);
            if (dep < floor || SEEN(dep))
                continue;
            SET(dep);
            if (dep == target) {
                rc = 1;
                goto out;
            }
            if ((rc = us_push(&st, dep)))
                goto out;
        }
    }
#undef SEEN
#undef SET
out:
    free(st.v);
    return rc;
}

/* Collects the indices whose bit equals |want|, ascending. */
static int collect(uint64_t **out, size_t *n, const uint64_t *bits, uint64_t count, int want)
{
    size_t k = 0;
    for (uint64_t i = 0; i < count; i++)
        k += ((bits[i >> 6] >> (i & 63)) & 1) == (uint64_t)want;
    uint64_t *v = malloc((k ? k : 1) * sizeof *v);
    if (!v)
        return CAIRN_ENOMEM;
    k = 0;
    for (uint64_t i = 0; i < count; i++)
        if (((bits[i >> 6] >> (i & 63)) & 1) == (uint64_t)want)
            v[k++] = i;
    *out = v;
    *n = k;
    return 0;
}

int cairn_dag_ancestors(uint64_t **out, size_t *n, const cairn_dag *d, const cairn_hash *heads,
                        size_t nheads)
{
    *out = NULL;
    *n = 0;
    uint64_t *bits = calloc(d->norder / 64 + 1, sizeof *bits);
    if (!bits)
        return CAIRN_ENOMEM;
    int rc = mark_ancestors(bits, d, heads, nheads, 1, 0, UINT64_MAX);
    if (rc == 0)
        rc = collect(out, n, bits, d->norder, 1);
    free(bits);
    return rc;
}

/* A max-heap of apply indices. */
struct heap {
    uint64_t *v;
    size_t n, cap;
};

static int heap_push(struct heap *h, uint64_t x)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        uint64_t *nv = realloc(h->v, cap * sizeof *nv);
        if (!nv)
            return CAIRN_ENOMEM;
        h->v = nv;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && h->v[(i - 1) / 2] < x) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = x;
    return 0;
}

static uint64_t heap_pop(struct heap *h)
{
    uint64_t top = h->v[0], x = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1] > h->v[c])
            c++;
        if (h->v[c] <= x)
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = x;
    return top;
}

/*
 * Walks down from their heads and ours at once, newest index first. A change
 * reached from theirs is their ancestor; one reached only from ours, once
 * popped, cannot be reached from theirs any more (its descendants all have
 * larger indices and were popped before it), so it is in the answer. The walk
 * stops as soon as no change of ours is left on the heap: everything older
 * is reachable from theirs. So a peer that is nearly up to date costs about
 * the size of the difference, not of the history.
 */
int cairn_dag_not_ancestors(uint64_t **out, size_t *n, const cairn_dag *d, const cairn_hash *heads,
                            size_t nheads)
{
    struct heap h = {0};
    uint64_t *v = NULL;
    size_t nv = 0, capv = 0, mine = 0;
    int rc = CAIRN_ENOMEM;
    *out = NULL;
    *n = 0;
    /* calloc of large zeroed blocks is lazy: untouched pages cost nothing. */
    size_t words = d->norder / 64 + 1;
    uint64_t *seen = calloc(words, sizeof *seen), *theirs = calloc(words, sizeof *theirs);
    if (!seen || !theirs)
        goto out;
    for (size_t i = 0; i < nheads; i++) {
        uint64_t x;
        if (!get_ordered(d, &heads[i], &x) || BIT(seen, x))
            continue;
        SETBIT(seen, x);
        SETBIT(theirs, x);
        if (heap_push(&h, x))
            goto out;
    }
    if (h.n == 0) { /* nothing in common known: everything */
        rc = collect(out, n, seen, d->norder, 0);
        goto out;
    }
    for (size_t i = 0; i < d->nheads; i++) {
        uint64_t x = d->heads[i];
        if ((x & HEAD_DEAD) || BIT(seen, x))
            continue;
        SETBIT(seen, x);
        mine++;
        if (heap_push(&h, x))
            goto out;
    }
    while (mine) {
        uint64_t i = heap_pop(&h);
        int t = BIT(theirs, i);
        if (!t) {
            mine--;
            if (nv == capv) {
                size_t cap = capv ? capv * 2 : 64;
                uint64_t *nw = realloc(v, cap * sizeof *nw);
                if (!nw)
                    goto out;
                v = nw;
                capv = cap;
            }
            v[nv++] = i;
        }
        const uint8_t *p, *end;
        deps_range(d, i, &p, &end);
        while (p < end) {
            uint64_t y = i - get_uv(&p);
            if (!BIT(seen, y)) {
                SETBIT(seen, y);
                if (t)
                    SETBIT(theirs, y);
                else
                    mine++;
                if (heap_push(&h, y))
                    goto out;
            } else if (t && !BIT(theirs, y)) {
                SETBIT(theirs, y); /* still on the heap, now theirs */
                mine--;
            }
        }
    }
    /* Popped newest first: reverse into ascending order. */
    for (size_t i = 0; i < nv / 2; i++) {
        uint64_t tmp = v[i];
        v[i] = v[nv - 1 - i];
        v[nv - 1 - i] = tmp;
    }
    if (!v && !(v = malloc(sizeof *v)))
        goto out;
    *out = v;
    *n = nv;
    v = NULL;
    rc = 0;
out:
    free(v);
    free(h.v);
    free(seen);
    free(theirs);
    return rc;
}

int cairn_dag_is_ancestor(const cairn_dag *d, const cairn_hash *h, const cairn_hash *heads,
                          size_t nheads)
{
    uint64_t t;
    if (!get_ordered(d, h, &t))
        return 0;
    /* Only indices >= t's can lead to t. */
    uint64_t span = d->norder - t;
    uint64_t *bits = calloc(span / 64 + 1, sizeof *bits);
    if (!bits)
        return 0; /* out of memory: "not known to be", the safe answer for sync */
    int rc = mark_ancestors(bits, d, heads, nheads, 0, t, t);
    free(bits);
    return rc == 1;
}

int cairn_dag_missing(cairn_hash **out, size_t *n, const cairn_dag *d)
{
    *out = NULL;
    *n = 0;
    cairn_hash *v = malloc((d->stubs.n ? d->stubs.n : 1) * sizeof *v);
    if (!v)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < d->stubs.n; i++)
        v[i] = ((node *)d->stubs.p[i])->hash;
    qsort(v, d->stubs.n, sizeof *v, cmp_hash);
    *out = v;
    *n = d->stubs.n;
    return 0;
}

size_t cairn_dag_mem_bytes(const cairn_dag *d)
{
    return d->caporder * sizeof *d->ohash + (d->caporder + 1) * sizeof *d->dep_off +
           d->capdep_bytes + d->otab_cap * sizeof *d->otab + d->capheads * sizeof *d->heads +
           (d->load ? 0 : d->capbody_off * sizeof *d->body_off + d->capbody);
}

/* ---- checkpoint section ------------------------------------------------
 *
 *   uv    norder
 *   32 B  hash, norder times, in apply order
 *   uv    nbytes, then nbytes of deps: per change, uv ndeps and ndeps uv
 *         (index - dep's index), deps ascending by hash as in the change
 *   uv    nauthors, then per author, ascending by actor bytes:
 *         16 B actor, uv max_seq (>= 1), uv apply index of change max_seq
 *
 * The deltas are exactly the DAG's own dep bytes, so both directions copy
 * them wholesale. Heads are not written: they are the changes no change
 * depends on. The ordered table is rebuilt under the new DAG's own hash key
 * (a checkpoint must not choose slots), finding duplicate hashes on the way.
 */

/* Number of varints in [p, end): bytes without a continuation bit. */
static size_t uv_count(const uint8_t *p, const uint8_t *end)
{
    size_t n = 0;
    for (; p < end; p++)
        n += !(*p & 0x80);
    return n;
}

static int cmp_actor_rec(const void *a, const void *b)
{
    const struct actor_rec *x = *(const struct actor_rec *const *)a;
    const struct actor_rec *y = *(const struct actor_rec *const *)b;
    return cairn_actor_cmp(&x->actor, &y->actor);
}

void cairn_dag_save_(wire_wr *w, const cairn_dag *d)
{
    wire_uv_w(w, d->norder);
    wire_bytes_w(w, d->ohash, d->norder * sizeof *d->ohash);
    size_t blob = d->ndep_bytes;
    for (uint64_t i = 0; i < d->norder; i++) {
        const uint8_t *s, *e;
        deps_range(d, i, &s, &e);
        blob += wire_uv_len(uv_count(s, e));
    }
    wire_uv_w(w, blob);
    if (wire_reserve(w, blob))
        return;
    uint8_t *p = w->p + w->len;
    for (uint64_t i = 0; i < d->norder; i++) {
        const uint8_t *s, *e;
        deps_range(d, i, &s, &e);
        p = wire_put_uv(p, uv_count(s, e));
        if (e > s)
            memcpy(p, s, (size_t)(e - s));
        p += e - s;
    }
    w->len += blob;

    const struct actor_rec **as = malloc((d->actors.count + 1) * sizeof *as);
    if (!as) {
        w->err = CAIRN_ENOMEM;
        return;
    }
    size_t na = 0;
    for (uint32_t i = 0; i < d->actors.cap; i++)
        if (d->actors.slots[i])
            as[na++] = d->actors.slots[i];
    qsort(as, na, sizeof *as, cmp_actor_rec);
    wire_uv_w(w, na);
    for (size_t i = 0; i < na; i++) {
        wire_bytes_w(w, as[i]->actor.b, CAIRN_ACTOR_LEN);
        wire_uv_w(w, as[i]->max_seq);
        wire_uv_w(w, as[i]->last_index);
    }
    free(as);
}

/* The ordered table for |n| changes, built from ohash; CAIRN_EDUPLICATE if
 * a hash repeats. */
static int otab_build(cairn_dag *d, uint64_t n)
{
    size_t cap = 64;
    while ((n + 1) * 4 > cap * 3)
        cap *= 2;
    d->otab = calloc(cap, sizeof *d->otab);
    if (!d->otab)
        return CAIRN_ENOMEM;
    wire_huge(d->otab, cap * sizeof *d->otab);
    d->otab_cap = cap;
    d->otab_shift = shift_for(cap);
    size_t mask = cap - 1;
    /* Slots are hashed LAG changes ahead and prefetched: the table is far
     * bigger than the cache. */
    enum { LAG = 64 };
    uint64_t ahead[LAG];
    for (uint64_t ix = 0; ix < n + LAG; ix++) {
        if (ix >= LAG) { /* change ix - LAG goes in: its slot was fetched */
            uint64_t at = ix - LAG;
            const uint8_t *h = d->ohash[at].b;
            uint64_t x = ahead[at % LAG], fp = x & FP_MASK;
            size_t i = (size_t)(x >> d->otab_shift);
            for (; d->otab[i]; i = (i + 1) & mask)
                if (d->otab[i] >> IDX_BITS == fp &&
                    memcmp(d->ohash[(d->otab[i] & IDX_MASK) - 1].b, h, CAIRN_HASH_LEN) == 0)
                    return CAIRN_EDUPLICATE;
            d->otab[i] = (fp << IDX_BITS) | (at + 1);
        }
        if (ix < n) { /* reuses the ring entry just consumed */
            ahead[ix % LAG] = sip(d, d->ohash[ix].b, CAIRN_HASH_LEN);
            __builtin_prefetch(&d->otab[ahead[ix % LAG] >> d->otab_shift], 1);
        }
    }
    return 0;
}

/* Reads the deps blob of |n| changes into dep_bytes / dep_off, marking in
 * |isdep| every change some change depends on. */
static int deps_restore(cairn_dag *d, wire_rd *b, uint64_t n, uint64_t *isdep)
{
    size_t nd = 0;
    d->dep_off[0] = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k;
        int rc = wire_count(b, &k, CAIRN_CHANGE_MAX_DEPS, 1);
        if (rc)
            return rc;
        const uint8_t *start = b->p;
        const cairn_hash *prev = NULL;
        for (uint64_t j = 0; j < k; j++) {
            uint64_t delta;
            if ((rc = wire_uv(b, &delta)))
                return rc;
            if (delta == 0 || delta > i)
                return CAIRN_ECORRUPT; /* a dep must come earlier */
            const cairn_hash *h = &d->ohash[i - delta];
            if (prev && cairn_hash_cmp(prev, h) >= 0)
                return CAIRN_EUNSORTED;
            prev = h;
            SETBIT(isdep, i - delta);
        }
        memcpy(d->dep_bytes + nd, start, (size_t)(b->p - start));
        nd += (size_t)(b->p - start);
        d->dep_off[i + 1] = nd;
    }
    if (b->p != b->end)
        return CAIRN_ENONCANON; /* bytes after the last change's deps */
    d->ndep_bytes = nd;
    return 0;
}

static int authors_restore(cairn_dag *d, wire_rd *r, uint64_t n)
{
    uint64_t na, sum = 0;
    int rc = wire_count(r, &na, n, CAIRN_ACTOR_LEN + 2);
    if (rc || (rc = cairn_htab_reserve(&d->actors, (uint32_t)na, 64, actor_hash, d)))
        return rc;
    const uint8_t *prev = NULL;
    for (uint64_t i = 0; i < na; i++) {
        const uint8_t *a;
        uint64_t seq, last;
        if ((rc = wire_take(r, &a, CAIRN_ACTOR_LEN)) || (rc = wire_uv(r, &seq)) ||
            (rc = wire_uv(r, &last)))
            return rc;
        if (prev && memcmp(prev, a, CAIRN_ACTOR_LEN) >= 0)
            return CAIRN_EUNSORTED;
        prev = a;
        /* One author's changes are its seqs 1..max: the maxima add up to n. */
        if (seq == 0 || seq > n - sum || last >= n)
            return CAIRN_ECORRUPT;
        sum += seq;
        struct actor_rec *ar = calloc(1, sizeof *ar);
        if (!ar)
            return CAIRN_ENOMEM;
        memcpy(ar->actor.b, a, CAIRN_ACTOR_LEN);
        ar->max_seq = seq;
        ar->last_index = last;
        cairn_htab_put(&d->actors, ar, actor_hash(d, ar));
    }
    return sum == n ? 0 : CAIRN_ECORRUPT;
}

int cairn_dag_restore_(cairn_dag **out, wire_rd *r)
{
    *out = NULL;
    cairn_dag *d;
    uint64_t *isdep = NULL;
    uint64_t n, blen;
    const uint8_t *hashes, *blob;
    int rc = cairn_dag_new(&d);
    if (rc)
        return rc;
    if ((rc = wire_count(r, &n, MAX_ORDERED, CAIRN_HASH_LEN + 1)) ||
        (rc = wire_take(r, &hashes, (size_t)n * CAIRN_HASH_LEN)) || (rc = wire_uv(r, &blen)) ||
        (rc = blen > wire_left(r) ? CAIRN_ETRUNCATED : 0) ||
        (rc = wire_take(r, &blob, (size_t)blen)))
        goto fail;
    rc = CAIRN_ENOMEM;
    /* The capacity ordering n changes one by one would have reached, so
     * that the next change does not double the arrays (an untouched tail
     * costs no resident memory). */
    size_t cap = 16;
    while (cap < n)
        cap *= 2;
    d->ohash = malloc(cap * sizeof *d->ohash);
    d->dep_off = malloc((cap + 1) * sizeof *d->dep_off);
    d->dep_bytes = malloc((size_t)(blen ? blen : 1));
    isdep = calloc((size_t)(n / 64 + 1), sizeof *isdep);
    if (!d->ohash || !d->dep_off || !d->dep_bytes || !isdep)
        goto fail;
    wire_huge(d->ohash, (size_t)n * sizeof *d->ohash);
    wire_huge(d->dep_off, (size_t)(n + 1) * sizeof *d->dep_off);
    d->caporder = cap;
    d->capdep_bytes = (size_t)blen;
    if (n)
        memcpy(d->ohash, hashes, (size_t)n * CAIRN_HASH_LEN);
    if ((rc = otab_build(d, n)))
        goto fail;
    wire_rd b = {blob, blob + blen};
    if ((rc = deps_restore(d, &b, n, isdep)) || (rc = authors_restore(d, r, n)))
        goto fail;
    /* The blob also held the counts: give back what the deltas do not use,
     * down to the capacity ordering them one by one would have reached. */
    size_t dcap = 16;
    while (dcap < d->ndep_bytes)
        dcap *= 2;
    if (dcap < d->capdep_bytes) {
        uint8_t *np = realloc(d->dep_bytes, dcap);
        if (np) {
            d->dep_bytes = np;
            d->capdep_bytes = dcap;
        }
    }
    size_t nh = 0;
    for (uint64_t i = 0; i < n; i++)
        nh += !BIT(isdep, i);
    if ((rc = reserve((void **)&d->heads, &d->capheads, nh, sizeof *d->heads)))
        goto fail;
    for (uint64_t i = 0; i < n; i++)
        if (!BIT(isdep, i))
            d->heads[d->nheads++] = i;
    d->nlive_heads = d->nheads;
    d->heads_dirty = d->nheads > 0; /* no cache to build for none */
    d->norder = (size_t)n;
    d->nbodyless = n;
    free(isdep);
    *out = d;
    return 0;
fail:
    free(isdep);
    cairn_dag_free(d);
    return rc;
}

int cairn_dag_check_(const cairn_dag *d)
{
    uint64_t n = d->norder, sum = 0;
    uint64_t *isdep = calloc((size_t)(n / 64 + 1), sizeof *isdep);
    uint64_t *head = calloc((size_t)(n / 64 + 1), sizeof *head);
    int rc = CAIRN_ENOMEM;
    if (!isdep || !head)
        goto out;
    rc = CAIRN_ECORRUPT;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t ix;
        if (!get_ordered(d, &d->ohash[i], &ix) || ix != i)
            goto out;
        const uint8_t *p, *end;
        deps_range(d, i, &p, &end);
        while (p < end) {
            uint64_t delta = get_uv(&p);
            if (delta == 0 || delta > i)
                goto out;
            SETBIT(isdep, i - delta);
        }
    }
    for (size_t i = 0; i < d->nheads; i++) {
        uint64_t x = d->heads[i] & ~HEAD_DEAD;
        if (x >= n || (i && x <= (d->heads[i - 1] & ~HEAD_DEAD)))
            goto out;
        if (!(d->heads[i] & HEAD_DEAD))
            SETBIT(head, x);
    }
    for (uint64_t i = 0; i < n; i++)
        if (BIT(head, i) == BIT(isdep, i))
            goto out;
    for (uint32_t i = 0; i < d->actors.cap; i++) {
        const struct actor_rec *a = d->actors.slots[i];
        if (!a)
            continue;
        if (a->last_index >= n)
            goto out;
        sum += a->max_seq;
    }
    rc = sum == n ? 0 : CAIRN_ECORRUPT;
out:
    free(isdep);
    free(head);
    return rc;
}
