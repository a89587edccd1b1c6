/*
 * The DAG's section of a checkpoint (cairn_dag_save_ / cairn_dag_restore_,
 * the format below) and the invariant check (cairn_dag_check_) that tests
 * and fuzzers run on restored and live DAGs.
 */
#include "crdt/dag.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/dag_int.h"
#include "crdt/error.h"
#include "crdt/htab.h"
#include "crdt/wire.h"

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
    const struct actor_rec *ar;
    for (size_t i = 0; (ar = cairn_htab_each(&d->actors, &i));)
        as[na++] = ar;
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
        cairn_htab_put(&d->actors, ar, actor_hash(d, ar), actor_hash, d);
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
            uint64_t delta = wire_uv_trusted(&p);
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
    const struct actor_rec *a;
    for (size_t i = 0; (a = cairn_htab_each(&d->actors, &i));) {
        if (a->last_index >= n)
            goto out;
        sum += a->max_seq;
    }
    if (sum != n)
        goto out;
    /* Refused changes: body-less, waited for by nothing (their waiters
     * were refused with them), each in the ring exactly once; a pending
     * change waits for no refused one. */
    size_t nrej = 0;
    const node *nx;
    for (size_t i = 0; (nx = cairn_htab_each(&d->nodes, &i));) {
        if (nx->state == ST_REJECTED && (nx->c || nx->nwaiters || nx->why >= 0))
            goto out;
        nrej += nx->state == ST_REJECTED;
        for (uint32_t k = 0; k < nx->nwaiters; k++)
            if (nx->waiters[k]->state != ST_PENDING)
                goto out;
    }
    if (nrej != d->rej_n || d->rej_n > d->rej_cap || d->rej_cap > CAIRN_DAG_MAX_REJECTED)
        goto out;
    /* The pending list: every pending change once, oldest first. */
    size_t npend = 0, nlisted = 0;
    for (size_t i = 0; (nx = cairn_htab_each(&d->nodes, &i));)
        npend += nx->state == ST_PENDING;
    for (const node *x = d->pend_oldest; x; x = x->newer) {
        if (x->state != ST_PENDING || !x->c || ++nlisted > npend ||
            (x->newer ? x->newer->older != x || x->newer->since < x->since : d->pend_newest != x))
            goto out;
    }
    if (nlisted != npend || npend != d->npending || (d->pend_oldest && d->pend_oldest->older))
        goto out;
    for (size_t i = 0; i < d->rej_n; i++) {
        const node *x = get_node(d, &d->rej[(d->rej_head + i) % d->rej_cap]);
        if (!x || x->state != ST_REJECTED)
            goto out;
    }
    rc = 0;
out:
    free(isdep);
    free(head);
    return rc;
}
