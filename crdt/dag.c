/*
 * The hash DAG of changes: which changes this node has, in which order it
 * applied them, which wait for dependencies, and the ancestry queries that
 * sync needs.
 *
 * Two kinds of record. A change that is not ordered yet is a node in one
 * open-addressing table of pointers (crdt/htab.h: linear probing,
 * backward-shift deletion): READY (all deps ordered, queued for the caller), PENDING (some
 * dep not ordered yet), a STUB (a hash that pending changes depend on but
 * that we have never seen) or REJECTED (a change found invalid, remembered
 * so that it is neither asked for nor judged again: see reject()). Every such node
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
 *
 * This file adds and orders changes; the queries are in dag_query.c, the
 * checkpoint section and the invariant check in dag_ckpt.c, the layout and
 * the small helpers they share in dag_int.h.
 */

#include "crdt/dag.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/dag_int.h"
#include "crdt/error.h"
#include "crdt/htab.h"
#include "crdt/wire.h"

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

/* ---- the ordered table ------------------------------------------------- */

/* It grows as crdt/htab.h's tables do: the bigger table is allocated and
 * every insert copies OTAB_STEP more slots of the old one across
 * (rehashing their changes), so no insert rehashes the whole table (at
 * 196,608 changes that held one insert 33 to 49 ms). Nothing is ever
 * deleted, so the old table needs no marks: lookups try the new table,
 * then the old one. It is drained after old_cap / OTAB_STEP inserts, long
 * before the new one (twice its size, at 3/8 load) is 3/4 full. */
#define OTAB_STEP 4

static void otab_insert(uint64_t *tab, size_t cap, int shift, uint64_t x, uint64_t index)
{
    size_t i = (size_t)(x >> shift), mask = cap - 1;
    while (tab[i])
        i = (i + 1) & mask;
    tab[i] = ((x & FP_MASK) << IDX_BITS) | (index + 1);
}

/* Copies up to |n| more old slots across; frees the old table once done. */
static void otab_move(cairn_dag *d, size_t n)
{
    for (; n && d->otab_moved < d->otab_old_cap; n--, d->otab_moved++) {
        uint64_t s = d->otab_old[d->otab_moved];
        if (!s)
            continue;
        uint64_t ix = (s & IDX_MASK) - 1;
        otab_insert(d->otab, d->otab_cap, d->otab_shift, sip(d, d->ohash[ix].b, CAIRN_HASH_LEN),
                    ix);
    }
    if (d->otab_moved == d->otab_old_cap) {
        free(d->otab_old);
        d->otab_old = NULL;
        d->otab_old_cap = d->otab_moved = 0;
    }
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
    if (d->otab_old) /* not reached with OTAB_STEP >= 2: see above */
        otab_move(d, SIZE_MAX);
    if (d->norder) {
        d->otab_old = d->otab;
        d->otab_old_cap = d->otab_cap;
        d->otab_old_shift = d->otab_shift;
        d->otab_moved = 0;
    } else {
        free(d->otab);
    }
    d->otab = t;
    d->otab_cap = cap;
    d->otab_shift = shift_for(cap);
    return 0;
}

/* Puts ordered change |index| (slot hash |x|) into reserved room. */
static void otab_add(cairn_dag *d, uint64_t x, uint64_t index)
{
    if (d->otab_old)
        otab_move(d, OTAB_STEP);
    otab_insert(d->otab, d->otab_cap, d->otab_shift, x, index);
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
    void *e;
    for (size_t i = 0; (e = cairn_htab_each(&d->nodes, &i));)
        node_free(e);
    for (size_t i = 0; (e = cairn_htab_each(&d->actors, &i));)
        free(e);
    cairn_htab_destroy(&d->nodes);
    cairn_htab_destroy(&d->actors);
    free(d->ohash);
    free(d->dep_off);
    free(d->dep_bytes);
    free(d->otab);
    free(d->otab_old);
    free(d->body_off);
    free(d->body);
    free(d->ready);
    free(d->heads);
    free(d->stubs.p);
    free(d->sorted_heads);
    free(d->rej);
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

/* A new node for |h| (a stub: state 0, in no list), in the table; NULL
 * when out of memory. */
static node *new_node(cairn_dag *d, const cairn_hash *h)
{
    node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->hash = *h;
    n->pos = NO_POS;
    cairn_htab_put(&d->nodes, n, node_hash(d, n), node_hash, d);
    return n;
}

/* ---- the pending list --------------------------------------------- */

/* |n| became PENDING: it goes at the new end, stamped with the clock. */
static void pend_link(cairn_dag *d, node *n)
{
    n->since = d->now_ms;
    n->older = d->pend_newest;
    n->newer = NULL;
    if (d->pend_newest)
        d->pend_newest->newer = n;
    else
        d->pend_oldest = n;
    d->pend_newest = n;
}

/* |n| is PENDING no more (ready, refused or dropped). */
static void pend_unlink(cairn_dag *d, node *n)
{
    if (n->older)
        n->older->newer = n->newer;
    else
        d->pend_oldest = n->newer;
    if (n->newer)
        n->newer->older = n->older;
    else
        d->pend_newest = n->older;
    n->older = n->newer = NULL;
}

/* ---- add ------------------------------------------------------------- */

static int inherited(int why);
static void reject_tree(cairn_dag *d, node *n, int why);

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
    int why = 0;
    for (uint32_t i = 0; i < c->ndeps; i++) {
        if (get_ordered(d, &c->deps[i], NULL))
            continue;
        missing++;
        const node *dep = get_node(d, &c->deps[i]);
        if (dep && dep->state == ST_REJECTED && (!why || why == CAIRN_EFORKPAST))
            why = inherited(dep->why);
    }
    if (why) {
        /* a dep was refused: so is this change, and what waits for it */
        if (!n) {
            if (!(n = new_node(d, &c->hash))) {
                rc = CAIRN_ENOMEM;
                goto fail;
            }
        } else {
            list_remove(&d->stubs, n);
        }
        cairn_change_free(c);
        reject_tree(d, n, why);
        *state = CAIRN_DAG_REJECTED;
        return why;
    }
    if (missing) {
        if (d->npending >= CAIRN_DAG_MAX_PENDING ||
            d->pending_edges + missing > MAX_PENDING_EDGES ||
            c->len > MAX_PENDING_BYTES - d->pending_bytes) {
            rc = CAIRN_ELIMIT;
            goto fail;
        }
    }

    int fresh = !n;
    if (fresh && !(n = new_node(d, &c->hash))) {
        rc = CAIRN_ENOMEM;
        goto fail;
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
                cairn_htab_put(&d->nodes, dep, node_hash(d, dep), node_hash, d);
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
        pend_link(d, n);
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

/* ---- rejection -------------------------------------------------------- */

/* The verdict a descendant of a change refused with |why| gets: refused
 * too, whatever else it holds, since its causal past does. A fork's side
 * is kept apart: the peer that sends it may be honest (it took the other
 * side first), the transport treats it so. */
static int inherited(int why)
{
    return why == CAIRN_EFORK || why == CAIRN_EFORKPAST ? CAIRN_EFORKPAST : CAIRN_EPASTREFUSED;
}

/* Puts |n|'s hash in the ring of remembered rejections, growing it (up to
 * CAIRN_DAG_MAX_REJECTED) or, full, forgetting the oldest. Out of memory
 * with no ring at all: CAIRN_ENOMEM (the caller forgets |n|). */
static int remember(cairn_dag *d, node *n)
{
    if (d->rej_n == d->rej_cap && d->rej_cap < CAIRN_DAG_MAX_REJECTED) {
        size_t cap = d->rej_cap ? d->rej_cap * 2 : 64;
        if (cap > CAIRN_DAG_MAX_REJECTED)
            cap = CAIRN_DAG_MAX_REJECTED;
        cairn_hash *r = malloc(cap * sizeof *r);
        if (r) {
            for (size_t i = 0; i < d->rej_n; i++)
                r[i] = d->rej[(d->rej_head + i) % d->rej_cap];
            free(d->rej);
            d->rej = r;
            d->rej_head = 0;
            d->rej_cap = cap;
        }
    }
    if (!d->rej_cap)
        return CAIRN_ENOMEM;
    if (d->rej_n == d->rej_cap) {
        /* full (at the cap, or out of memory to grow): the oldest goes */
        node *old = get_node(d, &d->rej[d->rej_head]);
        if (old && old->state == ST_REJECTED && !old->nwaiters)
            drop_node(d, old);
        d->rej[d->rej_head] = n->hash;
        d->rej_head = (d->rej_head + 1) % d->rej_cap;
        return 0;
    }
    d->rej[(d->rej_head + d->rej_n++) % d->rej_cap] = n->hash;
    return 0;
}

/* Takes pending |w| out of the waiter lists of its deps other than |skip|
 * (a stub nothing waits for any more goes) and out of the pending counts,
 * and frees its body. */
static void unlink_pending(cairn_dag *d, node *w, const node *skip)
{
    const cairn_change *c = w->c;
    for (uint32_t i = 0; i < c->ndeps; i++) {
        node *dep = get_node(d, &c->deps[i]);
        if (!dep || dep == skip)
            continue; /* ordered, or the one being rejected */
        for (uint32_t k = 0; k < dep->nwaiters; k++)
            if (dep->waiters[k] == w) {
                dep->waiters[k] = dep->waiters[--dep->nwaiters];
                break;
            }
        if (dep->state == ST_STUB && dep->nwaiters == 0) {
            list_remove(&d->stubs, dep);
            drop_node(d, dep);
        }
    }
    pend_unlink(d, w);
    d->npending--;
    d->pending_edges -= w->nmissing;
    d->pending_bytes -= c->len;
    cairn_change_free(w->c);
    w->c = NULL;
    w->nmissing = 0;
}

/* Marks body-less |n| REJECTED with verdict |why|, and with it every
 * pending change that waits for it, transitively (their verdict:
 * inherited()): a descendant of a refused change is refused the moment
 * its ancestor is, whichever came first, so none is ever ordered and none
 * sits in the pending buffer. The walk is a list threaded through the
 * nodes (no allocation, so it cannot fail half-way); each node is visited
 * once, since a rejected node leaves every waiter list it was on. Then
 * each is remembered (remember()); one that cannot be, out of memory, is
 * forgotten (judged again if it comes back). */
static void reject_tree(cairn_dag *d, node *n, int why)
{
    n->state = ST_REJECTED;
    n->why = why;
    n->next = NULL;
    node *work = n;
    while (work) {
        node *x = work;
        work = x->next;
        node **ws = x->waiters;
        uint32_t nw = x->nwaiters;
        x->waiters = NULL;
        x->nwaiters = x->capwaiters = 0;
        for (uint32_t i = 0; i < nw; i++) {
            node *w = ws[i];
            if (w->state != ST_PENDING)
                continue;
            unlink_pending(d, w, x);
            w->state = ST_REJECTED;
            w->why = inherited(x->why);
            w->next = work;
            work = w;
        }
        free(ws);
        if (remember(d, x))
            drop_node(d, x);
    }
}

/* Drops the front ready change for good with verdict |why|. The verdict
 * is final (it depends on the change and its ancestors, which are fixed),
 * so a body-less REJECTED node stays while the hash is among the last
 * CAIRN_DAG_MAX_REJECTED rejected: has() reports it known, missing() does
 * not ask for it again, add() drops it without the document judging it
 * again and refuses every change that names it as a dep. */
static void reject(cairn_dag *d, int why)
{
    node *n = ready_pop(d);
    cairn_change_free(n->c);
    n->c = NULL;
    reject_tree(d, n, why);
}

void cairn_dag_reject(cairn_dag *d, int why)
{
    if (d->rlen)
        reject(d, why < 0 ? why : CAIRN_EINVAL);
}

int cairn_dag_rejected(const cairn_dag *d, const cairn_hash *h)
{
    const node *n = get_node(d, h);
    return n && n->state == ST_REJECTED ? n->why : 0;
}

size_t cairn_dag_rejected_count(const cairn_dag *d)
{
    return d->rej_n;
}

/* ---- ageing the pending buffer ----------------------------------------- */

/* Drops pending |n|: out of its deps' waiter lists and the counts, its
 * body freed. Pending changes that wait for it wait for it as for any
 * hash not had: a stub, which missing() asks peers for. */
static void evict(cairn_dag *d, node *n)
{
    unlink_pending(d, n, NULL);
    if (!n->nwaiters) {
        drop_node(d, n);
        return;
    }
    n->state = ST_STUB;
    if (list_add(&d->stubs, n) != 0)
        n->pos = NO_POS; /* out of memory: a stub missing() does not report (as discard) */
}

size_t cairn_dag_expire(cairn_dag *d, uint64_t now_ms, uint64_t max_age_ms)
{
    if (!d->clock_set) {
        /* the clock starts now: what came before arrived now */
        d->clock_set = 1;
        d->now_ms = now_ms;
        for (node *n = d->pend_oldest; n; n = n->newer)
            n->since = now_ms;
        return 0;
    }
    if (now_ms > d->now_ms)
        d->now_ms = now_ms; /* never backwards */
    size_t k = 0;
    while (d->pend_oldest && d->now_ms - d->pend_oldest->since >= max_age_ms) {
        evict(d, d->pend_oldest);
        k++;
    }
    return k;
}

/* A growable stack of apply indices. */

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
            uint64_t dep = x - wire_uv_trusted(&p);
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
        reject(d, CAIRN_EFORK);
        return CAIRN_EFORK;
    }
    if (c->seq > max + 1) {
        reject(d, CAIRN_ESEQGAP);
        return CAIRN_ESEQGAP;
    }
    if (max > 0) {
        rc = reaches(d, c, a->last_index);
        if (rc < 0)
            return rc; /* ENOMEM: still ready, may be retried */
        if (rc == 0) {
            reject(d, CAIRN_ESEQGAP);
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
        cairn_htab_put(&d->actors, a, actor_hash(d, a), actor_hash, d);
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
        uint64_t di = 0;
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
    otab_add(d, sip(d, c->hash.b, CAIRN_HASH_LEN), ix);
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
            pend_unlink(d, w);
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
