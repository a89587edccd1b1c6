/*
 * The DAG's queries (crdt/dag.h): counts, hashes and deps by apply index,
 * bodies through the loader (hash-checked), lookups, heads, and the
 * ancestry walks sync needs (ancestors, not-ancestors, is-ancestor,
 * missing). Walks use explicit stacks or heaps and bitmaps over the span of
 * apply indices they may visit, never recursion.
 */
#include "crdt/dag.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/dag_int.h"
#include "crdt/error.h"
#include "crdt/htab.h"
#include "crdt/wire.h"

/* ---- queries --------------------------------------------------------- */

uint64_t cairn_dag_count(const cairn_dag *d)
{
    return d->norder;
}

size_t cairn_dag_pending_count(const cairn_dag *d)
{
    return d->npending;
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
        uint64_t dep = index - wire_uv_trusted(&p);
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
    uint64_t *steps = &((cairn_dag *)d)->walk_steps;
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
            uint64_t dep = x - wire_uv_trusted(&p);
            if (dep < floor || SEEN(dep))
                continue;
            SET(dep);
            ++*steps;
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

int cairn_dag_mark_ancestors(uint64_t *bits, const cairn_dag *d, const cairn_hash *heads,
                             size_t nheads, uint64_t floor)
{
    return mark_ancestors(bits, d, heads, nheads, 0, floor, UINT64_MAX);
}

uint64_t cairn_dag_walk_steps_(const cairn_dag *d)
{
    return d->walk_steps;
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
        ((cairn_dag *)d)->walk_steps++;
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
            uint64_t y = i - wire_uv_trusted(&p);
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
           d->capdep_bytes + (d->otab_cap + d->otab_old_cap) * sizeof *d->otab +
           d->capheads * sizeof *d->heads +
           (d->load ? 0 : d->capbody_off * sizeof *d->body_off + d->capbody);
}
