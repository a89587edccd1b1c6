/*
 * Unit tests for crdt/dag.c: delivery in any order reaches the same apply
 * order invariants and heads, duplicates are dropped, pending changes
 * cascade, the sequence rule rejects gaps and forks, ancestry queries on
 * hand-built diamonds, missing(), limits, and long chains (to catch
 * quadratic behaviour and deep recursion). Seeds are fixed.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crdt/change.h"
#include "crdt/dag.h"
#include "crdt/dag_int.h" /* the ordered table's growth */
#include "crdt/error.h"

#define ck_assert_rc(got, want)                                                                    \
    ck_assert_msg((got) == (want), "rc %s, want %s", cairn_error_name(got), cairn_error_name(want))

/* For hot loops: unlike ck_assert_*, costs nothing when it holds (Check's
 * asserts record a checkpoint, a syscall, every time). */
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_abort_msg("%s:%d: %s", __FILE__, __LINE__, #cond);                                  \
    } while (0)

static cairn_actor actor_n(uint32_t n)
{
    cairn_actor a;
    memset(a.b, 0, sizeof a.b);
    memcpy(a.b, &n, sizeof n);
    a.b[15] = 0x5A;
    return a;
}

static int cmp_hash(const void *a, const void *b)
{
    return cairn_hash_cmp(a, b);
}

/* A change by actor |who| with one op; |salt| makes otherwise equal changes
 * differ. Deps are sorted here. */
static cairn_change *mk(uint32_t who, uint64_t seq, const cairn_hash *deps, size_t ndeps,
                        uint64_t salt)
{
    cairn_hash sorted[64];
    REQUIRE(ndeps <= 64);
    if (ndeps)
        memcpy(sorted, deps, ndeps * sizeof *deps);
    qsort(sorted, ndeps, sizeof *sorted, cmp_hash);
    cairn_actor a = actor_n(who);
    cairn_op op = {.action = CAIRN_OP_SET,
                   .key = (const uint8_t *)"k",
                   .key_len = 1,
                   .value = {.type = CAIRN_V_UINT, .v.u = salt}};
    cairn_change t = {0};
    t.actor = a;
    t.seq = seq;
    t.start_op = seq;
    t.time_ms = salt;
    t.ndeps = (uint32_t)ndeps;
    t.deps = sorted;
    t.nactors = 1;
    t.actors = &a;
    t.nops = 1;
    t.ops = &op;
    cairn_change *c = NULL;
    REQUIRE(cairn_change_new(&c, &t) == 0);
    return c;
}

static cairn_change *copy(const cairn_change *c)
{
    cairn_change *d = NULL;
    ck_assert_int_eq(cairn_change_decode(&d, c->bytes, c->len, &c->hash), 0);
    return d;
}

static int add(cairn_dag *d, const cairn_change *c)
{
    int state = -1;
    int rc = cairn_dag_add(d, copy(c), &state);
    ck_assert_rc(rc, 0);
    return state;
}

/* Orders every ready change; returns how many. */
static size_t drain(cairn_dag *d)
{
    size_t n = 0;
    while (cairn_dag_peek_ready(d)) {
        REQUIRE(cairn_dag_order(d, NULL, NULL) == 0);
        n++;
    }
    return n;
}

static void check_heads(const cairn_dag *d, const cairn_hash *want, size_t n)
{
    const cairn_hash *h;
    size_t k = cairn_dag_heads(d, &h);
    ck_assert_uint_eq(k, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_mem_eq(h[i].b, want[i].b, 32);
}

/* Every change's deps come earlier in the apply order. */
static void check_topological(const cairn_dag *d)
{
    uint64_t n = cairn_dag_count(d);
    for (uint64_t i = 0; i < n; i++) {
        cairn_change *c;
        ck_assert_rc(cairn_dag_load(&c, d, i), 0);
        ck_assert_mem_eq(c->hash.b, cairn_dag_hash_at(d, i)->b, CAIRN_HASH_LEN);
        uint64_t idx;
        ck_assert_rc(cairn_dag_find(d, &c->hash, &idx), 0);
        ck_assert_uint_eq(idx, i);
        uint64_t deps[64];
        size_t nd = cairn_dag_deps_at(deps, 64, d, i);
        ck_assert_uint_eq(nd, c->ndeps);
        for (uint32_t j = 0; j < c->ndeps; j++) {
            ck_assert_rc(cairn_dag_find(d, &c->deps[j], &idx), 0);
            ck_assert_uint_lt(idx, i);
            /* the compact deps name the same changes */
            int found = 0;
            for (size_t k = 0; k < nd; k++)
                found |= deps[k] == idx;
            ck_assert(found);
        }
        cairn_change_free(c);
    }
    ck_assert_ptr_null(cairn_dag_hash_at(d, n));
    cairn_change *none;
    ck_assert_rc(cairn_dag_load(&none, d, n), CAIRN_ENOTFOUND);
    ck_assert_ptr_null(none);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* ---- basic ------------------------------------------------------------ */

START_TEST(linear_in_order)
{
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    const cairn_hash *h;
    ck_assert_uint_eq(cairn_dag_heads(d, &h), 0);
    ck_assert_ptr_null(cairn_dag_peek_ready(d));
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), CAIRN_ESTATE);
    cairn_change *c[5];
    for (int i = 0; i < 5; i++) {
        c[i] = mk(1, (uint64_t)i + 1, i ? &c[i - 1]->hash : NULL, i ? 1 : 0, 0);
        ck_assert_int_eq(add(d, c[i]), CAIRN_DAG_READY);
        ck_assert_int_eq(cairn_dag_has(d, &c[i]->hash), 2);
        const cairn_change *r = cairn_dag_peek_ready(d);
        ck_assert_mem_eq(r->hash.b, c[i]->hash.b, 32);
        uint64_t idx = 99;
        ck_assert_rc(cairn_dag_order(d, &idx, NULL), 0);
        ck_assert_uint_eq(idx, (uint64_t)i);
        ck_assert_int_eq(cairn_dag_has(d, &c[i]->hash), 1);
        check_heads(d, &c[i]->hash, 1);
        cairn_actor a = actor_n(1);
        ck_assert_uint_eq(cairn_dag_actor_seq(d, &a), (uint64_t)i + 1);
    }
    cairn_actor other = actor_n(2);
    ck_assert_uint_eq(cairn_dag_actor_seq(d, &other), 0);
    ck_assert_uint_eq(cairn_dag_count(d), 5);
    check_topological(d);
    uint64_t idx;
    cairn_change *x = mk(9, 1, NULL, 0, 0);
    ck_assert_rc(cairn_dag_find(d, &x->hash, &idx), CAIRN_ENOTFOUND);
    ck_assert_int_eq(cairn_dag_has(d, &x->hash), 0);
    cairn_change_free(x);
    for (int i = 0; i < 5; i++)
        cairn_change_free(c[i]);
    cairn_dag_free(d);
}
END_TEST

START_TEST(duplicates_dropped)
{
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_change *a = mk(1, 1, NULL, 0, 0);
    cairn_change *b = mk(1, 2, &a->hash, 1, 0);
    cairn_change *c = mk(1, 3, &b->hash, 1, 0);
    ck_assert_int_eq(add(d, c), CAIRN_DAG_PENDING);
    ck_assert_int_eq(add(d, c), CAIRN_DAG_KNOWN); /* pending duplicate */
    ck_assert_int_eq(add(d, a), CAIRN_DAG_READY);
    ck_assert_int_eq(add(d, a), CAIRN_DAG_KNOWN); /* ready duplicate */
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), 0);
    ck_assert_int_eq(add(d, a), CAIRN_DAG_KNOWN); /* ordered duplicate */
    ck_assert_ptr_null(cairn_dag_peek_ready(d));
    ck_assert_int_eq(add(d, b), CAIRN_DAG_READY);
    ck_assert_uint_eq(drain(d), 2);
    ck_assert_uint_eq(cairn_dag_count(d), 3);
    check_heads(d, &c->hash, 1);
    /* NULL change */
    int state;
    ck_assert_rc(cairn_dag_add(d, NULL, &state), CAIRN_EINVAL);
    cairn_change_free(a);
    cairn_change_free(b);
    cairn_change_free(c);
    cairn_dag_free(d);
}
END_TEST

START_TEST(pending_cascade)
{
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_change *c[6];
    for (int i = 0; i < 6; i++)
        c[i] = mk(1, (uint64_t)i + 1, i ? &c[i - 1]->hash : NULL, i ? 1 : 0, 0);
    for (int i = 5; i >= 1; i--)
        ck_assert_int_eq(add(d, c[i]), CAIRN_DAG_PENDING);
    ck_assert_int_eq(cairn_dag_has(d, &c[3]->hash), 2);
    ck_assert_ptr_null(cairn_dag_peek_ready(d));
    cairn_hash *miss;
    size_t n;
    ck_assert_rc(cairn_dag_missing(&miss, &n, d), 0);
    ck_assert_uint_eq(n, 1); /* only c0 is unknown; c1..c4 are pending */
    ck_assert_mem_eq(miss[0].b, c[0]->hash.b, 32);
    free(miss);
    ck_assert_int_eq(cairn_dag_has(d, &c[0]->hash), 0);

    ck_assert_int_eq(add(d, c[0]), CAIRN_DAG_READY);
    ck_assert_rc(cairn_dag_missing(&miss, &n, d), 0);
    ck_assert_uint_eq(n, 0);
    free(miss);
    /* Each order makes exactly the next one ready, oldest first. */
    for (int i = 0; i < 6; i++) {
        const cairn_change *r = cairn_dag_peek_ready(d);
        ck_assert_ptr_nonnull(r);
        ck_assert_mem_eq(r->hash.b, c[i]->hash.b, 32);
        ck_assert_rc(cairn_dag_order(d, NULL, NULL), 0);
    }
    ck_assert_ptr_null(cairn_dag_peek_ready(d));
    check_heads(d, &c[5]->hash, 1);
    check_topological(d);
    for (int i = 0; i < 6; i++)
        cairn_change_free(c[i]);
    cairn_dag_free(d);
}
END_TEST

/* ---- the sequence rule ------------------------------------------------ */

/* Adds a copy of |c| and returns the state; *rc gets add's code. */
static int add_rc(cairn_dag *d, const cairn_change *c, int *rc)
{
    int state = -1;
    *rc = cairn_dag_add(d, copy(c), &state);
    return state;
}

START_TEST(rejected_memory_grows_to_its_cap)
{
    /* A peer sending ever new invalid changes: the DAG remembers them in
     * a ring that grows on demand up to CAIRN_DAG_MAX_REJECTED (the old
     * fixed ring held 4096), then forgets the oldest. A descendant of one
     * still remembered is refused on arrival; one of a forgotten one
     * waits for it as pending, and missing() asks for it. */
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_change *a1 = mk(1, 1, NULL, 0, 0);
    ck_assert_int_eq(add(d, a1), CAIRN_DAG_READY);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), 0);
    const uint64_t total = CAIRN_DAG_MAX_REJECTED + 10, old = 5000;
    cairn_hash first = {{0}}, kept = {{0}}, gone = {{0}}, h_old = {{0}}, last = {{0}};
    size_t mem0 = 0;
    for (uint64_t k = 1; k <= total; k++) {
        cairn_change *f = mk(1, 1, NULL, 0, k);
        if (k == 1)
            first = f->hash;
        if (k == 10)
            gone = f->hash;
        if (k == 11)
            kept = f->hash;
        if (k == total - old)
            h_old = f->hash;
        last = f->hash;
        int state = -1;
        REQUIRE(cairn_dag_add(d, f, &state) == 0 && state == CAIRN_DAG_READY);
        REQUIRE(cairn_dag_order(d, NULL, NULL) == CAIRN_EFORK);
        if (k == 64)
            mem0 = cairn_dag_rejected_count(d);
    }
    ck_assert_uint_eq(mem0, 64);
    ck_assert_uint_eq(cairn_dag_rejected_count(d), CAIRN_DAG_MAX_REJECTED);
    ck_assert_int_eq(cairn_dag_has(d, &first), 0); /* forgotten: judged again */
    ck_assert_int_eq(cairn_dag_rejected(d, &gone), 0);
    ck_assert_int_eq(cairn_dag_rejected(d, &kept), CAIRN_EFORK);
    ck_assert_int_eq(cairn_dag_rejected(d, &h_old), CAIRN_EFORK);
    ck_assert_int_eq(cairn_dag_has(d, &last), 2);
    ck_assert_int_eq(cairn_dag_rejected(d, &last), CAIRN_EFORK);
    /* a descendant of a change refused 5000 refusals ago */
    cairn_change *desc = mk(2, 1, &h_old, 1, 0);
    int rc;
    ck_assert_int_eq(add_rc(d, desc, &rc), CAIRN_DAG_REJECTED);
    ck_assert_rc(rc, CAIRN_EFORKPAST);
    ck_assert_int_eq(cairn_dag_rejected(d, &desc->hash), CAIRN_EFORKPAST);
    /* one of a forgotten one: pending, its dep asked for */
    cairn_change *lost = mk(3, 1, &first, 1, 0);
    ck_assert_int_eq(add(d, lost), CAIRN_DAG_PENDING);
    cairn_hash *miss;
    size_t nmiss;
    ck_assert_rc(cairn_dag_missing(&miss, &nmiss, d), 0);
    ck_assert_uint_eq(nmiss, 1);
    ck_assert_mem_eq(miss[0].b, first.b, 32);
    free(miss);
    ck_assert_rc(cairn_dag_check_(d), 0);
    cairn_change_free(a1);
    cairn_change_free(desc);
    cairn_change_free(lost);
    cairn_dag_free(d);
}
END_TEST

START_TEST(descendants_of_a_rejected_change_are_rejected)
{
    /* x skips a seq (ESEQGAP). y depends on x, z on y and on an unknown
     * stub u, w on z: in every arrival order none is ordered, all are
     * remembered as refused, nothing stays pending, and u is no longer
     * asked for. An honest change h beside them is ordered. */
    cairn_change *a1 = mk(1, 1, NULL, 0, 0);
    cairn_change *x = mk(1, 3, &a1->hash, 1, 0);
    cairn_change *u = mk(5, 1, NULL, 0, 0);
    cairn_change *y = mk(2, 1, &x->hash, 1, 0);
    cairn_change *z = mk(3, 1, (cairn_hash[]){y->hash, u->hash}, 2, 0);
    cairn_change *w = mk(4, 1, &z->hash, 1, 0);
    cairn_change *h = mk(6, 1, &a1->hash, 1, 0);
    const cairn_change *order[][5] = {
        {x, y, z, w, h}, {w, z, y, x, h}, {y, w, x, z, h}, {z, x, w, h, y}, {h, w, y, z, x}};
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++) {
        cairn_dag *d;
        ck_assert_rc(cairn_dag_new(&d), 0);
        ck_assert_int_eq(add(d, a1), CAIRN_DAG_READY);
        ck_assert_uint_eq(drain(d), 1);
        for (int i = 0; i < 5; i++) {
            const cairn_change *c = order[o][i];
            int rc;
            int state = add_rc(d, c, &rc);
            if (state == CAIRN_DAG_REJECTED) {
                ck_assert_rc(rc, CAIRN_EPASTREFUSED);
            } else {
                ck_assert_rc(rc, 0);
            }
            while (cairn_dag_peek_ready(d)) {
                const cairn_change *r = cairn_dag_peek_ready(d);
                int want = memcmp(r->hash.b, x->hash.b, 32) == 0 ? CAIRN_ESEQGAP : 0;
                ck_assert_rc(cairn_dag_order(d, NULL, NULL), want);
            }
        }
        ck_assert_uint_eq(cairn_dag_count(d), 2); /* a1 and h */
        ck_assert_rc(cairn_dag_find(d, &h->hash, NULL), 0);
        ck_assert_int_eq(cairn_dag_rejected(d, &x->hash), CAIRN_ESEQGAP);
        const cairn_change *desc[] = {y, z, w};
        for (int i = 0; i < 3; i++) {
            ck_assert_int_eq(cairn_dag_rejected(d, &desc[i]->hash), CAIRN_EPASTREFUSED);
            ck_assert_int_eq(cairn_dag_has(d, &desc[i]->hash), 2);
        }
        ck_assert_uint_eq(cairn_dag_rejected_count(d), 4);
        ck_assert_int_eq(cairn_dag_has(d, &u->hash), 0);
        cairn_hash *miss;
        size_t nmiss;
        ck_assert_rc(cairn_dag_missing(&miss, &nmiss, d), 0);
        ck_assert_uint_eq(nmiss, 0);
        free(miss);
        /* u arriving now orders alone: nothing waited for it any more */
        ck_assert_int_eq(add(d, u), CAIRN_DAG_READY);
        ck_assert_uint_eq(drain(d), 1);
        ck_assert_rc(cairn_dag_check_(d), 0);
        cairn_dag_free(d);
    }
    cairn_change *all[] = {a1, x, u, y, z, w, h};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cairn_change_free(all[i]);
}
END_TEST

START_TEST(seq_gap_and_fork)
{
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_change *a1 = mk(1, 1, NULL, 0, 0);
    cairn_change *a1b = mk(1, 1, NULL, 0, 1); /* fork of a1 */
    cairn_change *b1 = mk(2, 1, NULL, 0, 0);
    cairn_change *a3 = mk(1, 3, &a1->hash, 1, 0);  /* skips 2 */
    cairn_change *a2x = mk(1, 2, &b1->hash, 1, 0); /* a1 not an ancestor */
    cairn_change *c2 = mk(3, 2, NULL, 0, 0);       /* starts at 2 */

    ck_assert_int_eq(add(d, a1), CAIRN_DAG_READY);
    ck_assert_int_eq(add(d, a1b), CAIRN_DAG_READY);
    ck_assert_int_eq(add(d, b1), CAIRN_DAG_READY);
    ck_assert_int_eq(add(d, c2), CAIRN_DAG_READY);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), 0);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), CAIRN_EFORK);
    /* rejected for good: remembered, so neither asked for nor judged again */
    ck_assert_int_eq(cairn_dag_has(d, &a1b->hash), 2);
    ck_assert_int_eq(cairn_dag_rejected(d, &a1b->hash), CAIRN_EFORK);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), 0);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), CAIRN_ESEQGAP);
    ck_assert_int_eq(add(d, a3), CAIRN_DAG_READY);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), CAIRN_ESEQGAP);
    ck_assert_int_eq(add(d, a2x), CAIRN_DAG_READY);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), CAIRN_ESEQGAP);
    ck_assert_uint_eq(cairn_dag_count(d), 2);
    cairn_actor a = actor_n(1);
    ck_assert_uint_eq(cairn_dag_actor_seq(d, &a), 1);
    /* The fork offered again: dropped as known. */
    ck_assert_int_eq(add(d, a1b), CAIRN_DAG_KNOWN);
    ck_assert_ptr_null(cairn_dag_peek_ready(d));
    /* A fork arriving after the original is ordered. */
    cairn_change *a1c = mk(1, 1, NULL, 0, 5);
    ck_assert_int_eq(add(d, a1c), CAIRN_DAG_READY);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), CAIRN_EFORK);
    ck_assert_uint_eq(cairn_dag_count(d), 2);
    cairn_change_free(a1c);

    /* A rejected fork that others depend on is remembered, not asked for. */
    cairn_change *fork = mk(1, 1, NULL, 0, 2);
    cairn_change *child = mk(4, 1, &fork->hash, 1, 0);
    ck_assert_int_eq(add(d, child), CAIRN_DAG_PENDING);
    cairn_hash *miss;
    size_t nmiss;
    ck_assert_rc(cairn_dag_missing(&miss, &nmiss, d), 0);
    ck_assert_uint_eq(nmiss, 1);
    free(miss);
    ck_assert_int_eq(add(d, fork), CAIRN_DAG_READY);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), CAIRN_EFORK);
    ck_assert_int_eq(cairn_dag_has(d, &fork->hash), 2);
    ck_assert_int_eq(cairn_dag_has(d, &child->hash), 2);
    ck_assert_rc(cairn_dag_missing(&miss, &nmiss, d), 0);
    ck_assert_uint_eq(nmiss, 0);
    free(miss);
    ck_assert_int_eq(add(d, fork), CAIRN_DAG_KNOWN);
    ck_assert_ptr_null(cairn_dag_peek_ready(d));
    ck_assert_uint_eq(cairn_dag_count(d), 2);
    cairn_change_free(fork);
    cairn_change_free(child);

    /* a1 reached only through another actor's change: allowed. */
    cairn_change *b2 = mk(2, 2, (cairn_hash[]){a1->hash, b1->hash}, 2, 0);
    cairn_change *b3 = mk(2, 3, &b2->hash, 1, 0);
    cairn_change *a2 = mk(1, 2, &b3->hash, 1, 0);
    ck_assert_int_eq(add(d, b2), CAIRN_DAG_READY);
    ck_assert_int_eq(add(d, b3), CAIRN_DAG_PENDING);
    ck_assert_int_eq(add(d, a2), CAIRN_DAG_PENDING);
    ck_assert_uint_eq(drain(d), 3);
    ck_assert_uint_eq(cairn_dag_actor_seq(d, &a), 2);
    check_heads(d, &a2->hash, 1);

    cairn_change *all[] = {a1, a1b, b1, a3, a2x, c2, b2, b3, a2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cairn_change_free(all[i]);
    cairn_dag_free(d);
}
END_TEST

START_TEST(discard_keeps_dependents_pending)
{
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_change *a1 = mk(1, 1, NULL, 0, 0);
    cairn_change *a2 = mk(1, 2, &a1->hash, 1, 0);
    ck_assert_int_eq(add(d, a2), CAIRN_DAG_PENDING);
    ck_assert_int_eq(add(d, a1), CAIRN_DAG_READY);
    cairn_dag_discard(d);
    ck_assert_ptr_null(cairn_dag_peek_ready(d));
    ck_assert_int_eq(cairn_dag_has(d, &a1->hash), 0);
    ck_assert_int_eq(cairn_dag_has(d, &a2->hash), 2);
    cairn_hash *miss;
    size_t n;
    ck_assert_rc(cairn_dag_missing(&miss, &n, d), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_mem_eq(miss[0].b, a1->hash.b, 32);
    free(miss);
    /* Offered again, it can still be ordered and unblocks a2. */
    ck_assert_int_eq(add(d, a1), CAIRN_DAG_READY);
    ck_assert_uint_eq(drain(d), 2);
    /* Discarding with nothing ready does nothing. */
    cairn_dag_discard(d);
    ck_assert_uint_eq(cairn_dag_count(d), 2);
    /* A discarded change that nobody waits for is forgotten entirely. */
    cairn_change *b1 = mk(2, 1, NULL, 0, 0);
    ck_assert_int_eq(add(d, b1), CAIRN_DAG_READY);
    cairn_dag_discard(d);
    ck_assert_int_eq(cairn_dag_has(d, &b1->hash), 0);
    ck_assert_rc(cairn_dag_missing(&miss, &n, d), 0);
    ck_assert_uint_eq(n, 0);
    free(miss);
    cairn_change_free(a1);
    cairn_change_free(a2);
    cairn_change_free(b1);
    cairn_dag_free(d);
}
END_TEST

/* ---- ancestry --------------------------------------------------------- */

static void check_indices(uint64_t *v, size_t n, const uint64_t *want, size_t nwant)
{
    ck_assert_uint_eq(n, nwant);
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(v[i], want[i]);
    free(v);
}

START_TEST(diamond_ancestry)
{
    /*      a (A1)
     *     /      \
     *  b (A2)   c (B1)
     *     \      /
     *      e (A3)       f (C1, unrelated)
     */
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_change *a = mk(1, 1, NULL, 0, 0);
    cairn_change *b = mk(1, 2, &a->hash, 1, 0);
    cairn_change *c = mk(2, 1, &a->hash, 1, 0);
    cairn_change *e = mk(1, 3, (cairn_hash[]){b->hash, c->hash}, 2, 0);
    cairn_change *f = mk(3, 1, NULL, 0, 0);
    cairn_change *order[] = {a, b, c};
    for (int i = 0; i < 3; i++)
        add(d, order[i]);
    ck_assert_uint_eq(drain(d), 3);
    cairn_hash bc[2] = {b->hash, c->hash};
    qsort(bc, 2, sizeof *bc, cmp_hash);
    check_heads(d, bc, 2);
    add(d, e);
    add(d, f);
    ck_assert_uint_eq(drain(d), 2);
    cairn_hash ef[2] = {e->hash, f->hash};
    qsort(ef, 2, sizeof *ef, cmp_hash);
    check_heads(d, ef, 2);
    /* indices: a0 b1 c2 e3 f4 */
    uint64_t *v;
    size_t n;
    ck_assert_rc(cairn_dag_ancestors(&v, &n, d, &b->hash, 1), 0);
    check_indices(v, n, (uint64_t[]){0, 1}, 2);
    ck_assert_rc(cairn_dag_ancestors(&v, &n, d, &c->hash, 1), 0);
    check_indices(v, n, (uint64_t[]){0, 2}, 2);
    ck_assert_rc(cairn_dag_ancestors(&v, &n, d, bc, 2), 0);
    check_indices(v, n, (uint64_t[]){0, 1, 2}, 3);
    ck_assert_rc(cairn_dag_ancestors(&v, &n, d, &e->hash, 1), 0);
    check_indices(v, n, (uint64_t[]){0, 1, 2, 3}, 4);
    ck_assert_rc(cairn_dag_ancestors(&v, &n, d, ef, 2), 0);
    check_indices(v, n, (uint64_t[]){0, 1, 2, 3, 4}, 5);
    ck_assert_rc(cairn_dag_ancestors(&v, &n, d, NULL, 0), 0);
    check_indices(v, n, NULL, 0);

    ck_assert_rc(cairn_dag_not_ancestors(&v, &n, d, &b->hash, 1), 0);
    check_indices(v, n, (uint64_t[]){2, 3, 4}, 3);
    ck_assert_rc(cairn_dag_not_ancestors(&v, &n, d, &e->hash, 1), 0);
    check_indices(v, n, (uint64_t[]){4}, 1);
    ck_assert_rc(cairn_dag_not_ancestors(&v, &n, d, ef, 2), 0);
    check_indices(v, n, NULL, 0);

    cairn_change *unknown = mk(7, 1, NULL, 0, 0);
    ck_assert_rc(cairn_dag_not_ancestors(&v, &n, d, &unknown->hash, 1), 0);
    check_indices(v, n, (uint64_t[]){0, 1, 2, 3, 4}, 5);
    cairn_hash mixed[2] = {unknown->hash, c->hash};
    ck_assert_rc(cairn_dag_not_ancestors(&v, &n, d, mixed, 2), 0);
    check_indices(v, n, (uint64_t[]){1, 3, 4}, 3);
    v = (uint64_t *)1;
    ck_assert_rc(cairn_dag_ancestors(&v, &n, d, mixed, 2), CAIRN_ENOTFOUND);
    ck_assert_ptr_null(v);

    ck_assert_int_eq(cairn_dag_is_ancestor(d, &a->hash, &c->hash, 1), 1);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &c->hash, &c->hash, 1), 1);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &b->hash, &c->hash, 1), 0);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &c->hash, &b->hash, 1), 0);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &e->hash, bc, 2), 0);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &c->hash, &e->hash, 1), 1);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &a->hash, &f->hash, 1), 0);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &a->hash, mixed, 2), 1);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &unknown->hash, ef, 2), 0);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &a->hash, NULL, 0), 0);

    cairn_change *all[] = {a, b, c, e, f, unknown};
    for (size_t i = 0; i < 6; i++)
        cairn_change_free(all[i]);
    cairn_dag_free(d);
}
END_TEST

START_TEST(missing_lists_unknown_deps)
{
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_change *x = mk(1, 1, NULL, 0, 0), *y = mk(2, 1, NULL, 0, 0), *z = mk(3, 1, NULL, 0, 0);
    cairn_change *p = mk(4, 1, (cairn_hash[]){x->hash, y->hash}, 2, 0);
    cairn_change *q = mk(5, 1, (cairn_hash[]){y->hash, z->hash, p->hash}, 3, 0);
    ck_assert_int_eq(add(d, z), CAIRN_DAG_READY);
    ck_assert_uint_eq(drain(d), 1);
    ck_assert_int_eq(add(d, q), CAIRN_DAG_PENDING);
    ck_assert_int_eq(add(d, p), CAIRN_DAG_PENDING);
    cairn_hash *miss;
    size_t n;
    ck_assert_rc(cairn_dag_missing(&miss, &n, d), 0);
    cairn_hash want[2] = {x->hash, y->hash};
    qsort(want, 2, sizeof *want, cmp_hash);
    ck_assert_uint_eq(n, 2);
    ck_assert_mem_eq(miss, want, sizeof want);
    free(miss);
    ck_assert_int_eq(add(d, y), CAIRN_DAG_READY);
    ck_assert_uint_eq(drain(d), 1);
    ck_assert_rc(cairn_dag_missing(&miss, &n, d), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_mem_eq(miss[0].b, x->hash.b, 32);
    free(miss);
    ck_assert_int_eq(add(d, x), CAIRN_DAG_READY);
    ck_assert_uint_eq(drain(d), 3);
    check_heads(d, &q->hash, 1);
    cairn_change *all[] = {x, y, z, p, q};
    for (size_t i = 0; i < 5; i++)
        cairn_change_free(all[i]);
    cairn_dag_free(d);
}
END_TEST

/* ---- random histories, any delivery order ------------------------------ */

/* A history of |n| changes by |nact| actors: each change depends on its
 * author's previous change and, now and then, on other actors' latest. */
static cairn_change **history(size_t n, uint32_t nact, uint64_t seed)
{
    cairn_change **v = calloc(n, sizeof *v);
    cairn_change *last[8] = {0};
    uint64_t seq[8] = {0};
    uint64_t s = seed;
    ck_assert_uint_le(nact, 8);
    for (size_t i = 0; i < n; i++) {
        uint32_t a = (uint32_t)(rng_next(&s) % nact);
        cairn_hash deps[8];
        size_t nd = 0;
        if (last[a])
            deps[nd++] = last[a]->hash;
        for (uint32_t b = 0; b < nact; b++)
            if (b != a && last[b] && rng_next(&s) % 3 == 0)
                deps[nd++] = last[b]->hash;
        v[i] = mk(a + 1, ++seq[a], deps, nd, i);
        last[a] = v[i];
    }
    return v;
}

static void free_history(cairn_change **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cairn_change_free(v[i]);
    free(v);
}

START_TEST(random_permutations_converge)
{
    const size_t n = 300;
    cairn_change **h = history(n, 4, 0x1234);
    cairn_dag *ref;
    ck_assert_rc(cairn_dag_new(&ref), 0);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(add(ref, h[i]), CAIRN_DAG_READY);
        ck_assert_uint_eq(drain(ref), 1);
    }
    const cairn_hash *rh;
    size_t nrh = cairn_dag_heads(ref, &rh);
    ck_assert_uint_ge(nrh, 1);

    size_t *perm = malloc(n * sizeof *perm);
    for (uint64_t seed = 1; seed <= 20; seed++) {
        uint64_t s = seed * 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < n; i++)
            perm[i] = i;
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = (size_t)(rng_next(&s) % (i + 1));
            size_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        cairn_dag *d;
        ck_assert_rc(cairn_dag_new(&d), 0);
        for (size_t i = 0; i < n; i++) {
            add(d, h[perm[i]]);
            /* Duplicates mixed in are dropped. */
            if (rng_next(&s) % 10 == 0)
                ck_assert_int_eq(add(d, h[perm[rng_next(&s) % (i + 1)]]), CAIRN_DAG_KNOWN);
            /* Order eagerly only sometimes, so ready queues build up. */
            if (rng_next(&s) % 2)
                drain(d);
        }
        drain(d);
        ck_assert_uint_eq(cairn_dag_count(d), n);
        check_heads(d, rh, nrh);
        check_topological(d);
        cairn_hash *miss;
        size_t nm;
        ck_assert_rc(cairn_dag_missing(&miss, &nm, d), 0);
        ck_assert_uint_eq(nm, 0);
        free(miss);
        for (uint32_t a = 1; a <= 4; a++) {
            cairn_actor act = actor_n(a);
            ck_assert_uint_eq(cairn_dag_actor_seq(d, &act), cairn_dag_actor_seq(ref, &act));
        }
        /* The same ancestry as the reference, in index-independent terms. */
        uint64_t *v;
        size_t nv;
        const cairn_change *mid = h[n / 2];
        ck_assert_rc(cairn_dag_ancestors(&v, &nv, d, &mid->hash, 1), 0);
        uint64_t *w;
        size_t nw;
        ck_assert_rc(cairn_dag_ancestors(&w, &nw, ref, &mid->hash, 1), 0);
        ck_assert_uint_eq(nv, nw);
        for (size_t i = 0; i < nv; i++)
            ck_assert_int_eq(cairn_dag_is_ancestor(ref, cairn_dag_hash_at(d, v[i]), &mid->hash, 1),
                             1);
        free(v);
        free(w);
        cairn_dag_free(d);
    }
    free(perm);
    cairn_dag_free(ref);
    free_history(h, n);
}
END_TEST

/* not_ancestors (a bounded two-sided walk) against the complement of
 * ancestors (a full walk), for random head sets of random histories. */
START_TEST(not_ancestors_matches_complement)
{
    const size_t n = 400;
    for (uint64_t seed = 1; seed <= 5; seed++) {
        cairn_change **h = history(n, 5, seed * 77);
        cairn_dag *d;
        ck_assert_rc(cairn_dag_new(&d), 0);
        for (size_t i = 0; i < n; i++)
            add(d, h[i]);
        ck_assert_uint_eq(drain(d), n);
        uint64_t s = seed;
        for (int round = 0; round < 50; round++) {
            cairn_hash pick[6];
            size_t np = (size_t)(rng_next(&s) % 6);
            for (size_t i = 0; i < np; i++)
                pick[i] = h[rng_next(&s) % n]->hash;
            uint64_t *anc, *not ;
            size_t na, nn;
            ck_assert_rc(cairn_dag_ancestors(&anc, &na, d, pick, np), 0);
            ck_assert_rc(cairn_dag_not_ancestors(&not, &nn, d, pick, np), 0);
            ck_assert_uint_eq(na + nn, n);
            size_t ia = 0, in = 0;
            for (uint64_t i = 0; i < n; i++) {
                if (ia < na && anc[ia] == i)
                    ia++;
                else
                    ck_assert_uint_eq(not [in++], i);
            }
            free(anc);
            free(not );
        }
        cairn_dag_free(d);
        free_history(h, n);
    }
}
END_TEST

/* ---- limits and scale ------------------------------------------------- */

START_TEST(pending_limit)
{
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_hash unknown;
    memset(unknown.b, 0xEE, 32);
    for (uint32_t i = 0; i < CAIRN_DAG_MAX_PENDING; i++) {
        int state;
        REQUIRE(cairn_dag_add(d, mk(i + 1, 1, &unknown, 1, 0), &state) == 0);
        REQUIRE(state == CAIRN_DAG_PENDING);
    }
    cairn_change *over = mk(CAIRN_DAG_MAX_PENDING + 1, 1, &unknown, 1, 0);
    cairn_hash over_hash = over->hash;
    int state;
    ck_assert_rc(cairn_dag_add(d, over, &state), CAIRN_ELIMIT);
    ck_assert_int_eq(cairn_dag_has(d, &over_hash), 0);
    /* A change whose deps are all ordered is not pending: still accepted. */
    cairn_change *ok = mk(CAIRN_DAG_MAX_PENDING + 2, 1, NULL, 0, 0);
    ck_assert_int_eq(add(d, ok), CAIRN_DAG_READY);
    cairn_change_free(ok);
    cairn_dag_free(d);
}
END_TEST

/* ---- ageing the pending buffer (cairn_dag_expire) ------------------------- */

#define AGE 30000u

/* Changes with made-up deps fill the buffer; once they are AGE old they go
 * (the stubs they made too), and an honest change out of order is
 * buffered again. */
START_TEST(expire_drops_changes_with_made_up_deps)
{
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    ck_assert_uint_eq(cairn_dag_expire(d, 1000, AGE), 0); /* the clock starts */
    for (uint32_t i = 0; i < CAIRN_DAG_MAX_PENDING; i++) {
        cairn_hash made_up;
        memset(made_up.b, 0xEE, 32);
        memcpy(made_up.b, &i, sizeof i);
        int state;
        REQUIRE(cairn_dag_add(d, mk(i + 1, 1, &made_up, 1, 0), &state) == 0);
        REQUIRE(state == CAIRN_DAG_PENDING);
    }
    cairn_change *root = mk(CAIRN_DAG_MAX_PENDING + 7, 1, NULL, 0, 0);
    cairn_change *child = mk(CAIRN_DAG_MAX_PENDING + 7, 2, &root->hash, 1, 0);
    int state;
    ck_assert_rc(cairn_dag_add(d, copy(child), &state), CAIRN_ELIMIT);
    /* not old enough yet, however often asked */
    for (uint64_t t = 1000; t < 1000 + AGE; t += 1000)
        ck_assert_uint_eq(cairn_dag_expire(d, t, AGE), 0);
    ck_assert_uint_eq(cairn_dag_pending_count(d), CAIRN_DAG_MAX_PENDING);
    ck_assert_uint_eq(cairn_dag_expire(d, 1000 + AGE, AGE), CAIRN_DAG_MAX_PENDING);
    ck_assert_uint_eq(cairn_dag_pending_count(d), 0);
    cairn_hash *miss;
    size_t nmiss;
    ck_assert_rc(cairn_dag_missing(&miss, &nmiss, d), 0);
    ck_assert_uint_eq(nmiss, 0); /* nobody is asked for the made-up deps any more */
    free(miss);
    ck_assert_rc(cairn_dag_check_(d), 0);
    ck_assert_int_eq(add(d, child), CAIRN_DAG_PENDING);
    ck_assert_int_eq(add(d, root), CAIRN_DAG_READY);
    ck_assert_uint_eq(drain(d), 2);
    check_heads(d, &child->hash, 1);
    cairn_change_free(root);
    cairn_change_free(child);
    cairn_dag_free(d);
}
END_TEST

/* The oldest go first; a pending change that waits for a dropped one waits
 * for it as a stub (asked for), and nothing stays behind once all are
 * dropped. Dropped changes offered again are ordered. */
START_TEST(expire_oldest_first_and_dependents_ask_again)
{
    cairn_change *c[4];
    for (int i = 0; i < 4; i++)
        c[i] = mk(1, (uint64_t)i + 1, i ? &c[i - 1]->hash : NULL, i ? 1 : 0, 0);
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    ck_assert_int_eq(add(d, c[1]), CAIRN_DAG_PENDING); /* before the clock: arrives at its start */
    ck_assert_uint_eq(cairn_dag_expire(d, 5000, AGE), 0);
    ck_assert_uint_eq(cairn_dag_expire(d, 5020, AGE), 0);
    ck_assert_int_eq(add(d, c[2]), CAIRN_DAG_PENDING); /* at 5020 */
    ck_assert_uint_eq(cairn_dag_expire(d, 5000 + AGE - 1, AGE), 0);
    ck_assert_uint_eq(cairn_dag_expire(d, 100, AGE), 0); /* a clock that goes back is ignored */
    ck_assert_uint_eq(cairn_dag_expire(d, 5000 + AGE, AGE), 1); /* c[1], the oldest */
    ck_assert_rc(cairn_dag_check_(d), 0);
    ck_assert_uint_eq(cairn_dag_pending_count(d), 1);
    ck_assert_int_eq(cairn_dag_has(d, &c[1]->hash), 0);
    cairn_hash *miss;
    size_t nmiss;
    ck_assert_rc(cairn_dag_missing(&miss, &nmiss, d), 0);
    ck_assert_uint_eq(nmiss, 1); /* c[2] waits for c[1] now, not for c[0] */
    ck_assert_mem_eq(miss[0].b, c[1]->hash.b, 32);
    free(miss);
    ck_assert_uint_eq(cairn_dag_expire(d, 5020 + AGE, AGE), 1);
    ck_assert_uint_eq(cairn_dag_pending_count(d), 0);
    ck_assert_rc(cairn_dag_missing(&miss, &nmiss, d), 0);
    ck_assert_uint_eq(nmiss, 0);
    free(miss);
    ck_assert_rc(cairn_dag_check_(d), 0);
    for (int i = 3; i >= 0; i--)
        ck_assert_int_eq(add(d, c[i]), i ? CAIRN_DAG_PENDING : CAIRN_DAG_READY);
    ck_assert_uint_eq(drain(d), 4);
    check_heads(d, &c[3]->hash, 1);
    for (int i = 0; i < 4; i++)
        cairn_change_free(c[i]);
    cairn_dag_free(d);
}
END_TEST

/* An honest burst bigger than the buffer, its first change late: the
 * buffer keeps the oldest (refusing the newest), ageing drops nothing while
 * the gap is filled in time, and everything is ordered once the refused
 * ones come again. */
START_TEST(expire_keeps_an_honest_burst)
{
    const size_t n = CAIRN_DAG_MAX_PENDING + 20000;
    cairn_change **v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = mk(1, i + 1, i ? &v[i - 1]->hash : NULL, i ? 1 : 0, 0);
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    uint64_t t = 1;
    cairn_dag_expire(d, t, AGE);
    size_t refused = 0;
    for (size_t i = 1; i < n; i++) {
        if (i % 1000 == 0) /* a receive every so often, 100 ms apart */
            REQUIRE(cairn_dag_expire(d, t += 100, AGE) == 0);
        int state;
        int rc = cairn_dag_add(d, copy(v[i]), &state);
        REQUIRE(rc == 0 || rc == CAIRN_ELIMIT);
        refused += rc == CAIRN_ELIMIT;
        REQUIRE(rc != CAIRN_ELIMIT || i > CAIRN_DAG_MAX_PENDING); /* only the newest */
    }
    ck_assert_uint_eq(refused, n - 1 - CAIRN_DAG_MAX_PENDING);
    ck_assert_uint_lt(t, AGE);
    ck_assert_uint_eq(cairn_dag_expire(d, t, AGE), 0);
    ck_assert_int_eq(add(d, v[0]), CAIRN_DAG_READY);
    ck_assert_uint_eq(drain(d), CAIRN_DAG_MAX_PENDING + 1);
    for (size_t i = CAIRN_DAG_MAX_PENDING + 1; i < n; i++) {
        REQUIRE(add(d, v[i]) == CAIRN_DAG_READY);
        REQUIRE(cairn_dag_order(d, NULL, NULL) == 0);
    }
    ck_assert_uint_eq(cairn_dag_count(d), n);
    check_heads(d, &v[n - 1]->hash, 1);
    for (size_t i = 0; i < n; i++)
        cairn_change_free(v[i]);
    free(v);
    cairn_dag_free(d);
}
END_TEST

START_TEST(pending_edge_limit)
{
    /* Changes that each wait for 1024 unknown hashes: the buffer holds at
     * most 8 * CAIRN_DAG_MAX_PENDING such edges, far fewer than
     * CAIRN_DAG_MAX_PENDING changes. */
    static cairn_hash deps[CAIRN_CHANGE_MAX_DEPS];
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    const uint32_t per = CAIRN_CHANGE_MAX_DEPS, fits = 8u * CAIRN_DAG_MAX_PENDING / per;
    for (uint32_t i = 0; i <= fits; i++) {
        for (uint32_t j = 0; j < per; j++) {
            /* Ascending in j (bytes 0-1), distinct per change (bytes 4-7). */
            memset(deps[j].b, 0, 32);
            deps[j].b[0] = (uint8_t)(j >> 8);
            deps[j].b[1] = (uint8_t)j;
            memcpy(deps[j].b + 4, &i, sizeof i);
        }
        cairn_actor a = actor_n(i + 1);
        cairn_change t = {0};
        t.actor = a;
        t.seq = 1;
        t.start_op = 1;
        t.ndeps = per;
        t.deps = deps;
        t.nactors = 1;
        t.actors = &a;
        cairn_change *c;
        ck_assert_rc(cairn_change_new(&c, &t), 0);
        cairn_hash h = c->hash;
        int state;
        int rc = cairn_dag_add(d, c, &state);
        if (i < fits) {
            ck_assert_rc(rc, 0);
            ck_assert_int_eq(state, CAIRN_DAG_PENDING);
        } else {
            ck_assert_rc(rc, CAIRN_ELIMIT);
            ck_assert_int_eq(cairn_dag_has(d, &h), 0);
        }
    }
    cairn_hash *miss;
    size_t n;
    ck_assert_rc(cairn_dag_missing(&miss, &n, d), 0);
    ck_assert_uint_eq(n, (size_t)fits * per); /* no stubs left by the refused one */
    free(miss);
    cairn_dag_free(d);
}
END_TEST

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

START_TEST(long_chain_linear_time)
{
    /* 100k changes, 3 interleaved actors; quadratic work here would take
     * minutes. Changes are handed over directly (no copies). */
    const size_t n = 100000;
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_hash prev;
    uint64_t seq[3] = {0};
    cairn_hash first, last;
    double t0 = now_s();
    for (size_t i = 0; i < n; i++) {
        uint32_t a = (uint32_t)(i % 3);
        cairn_change *c = mk(a + 1, ++seq[a], i ? &prev : NULL, i ? 1 : 0, i);
        if (i == 0)
            first = c->hash;
        last = c->hash;
        int state;
        REQUIRE(cairn_dag_add(d, c, &state) == 0);
        REQUIRE(state == CAIRN_DAG_READY);
        REQUIRE(cairn_dag_order(d, NULL, NULL) == 0);
        prev = *cairn_dag_hash_at(d, i);
    }
    double t1 = now_s();
    ck_assert_uint_eq(cairn_dag_count(d), n);
    check_heads(d, &last, 1);
    /* Deep ancestry walks are iterative. */
    uint64_t *v;
    size_t nv;
    ck_assert_rc(cairn_dag_ancestors(&v, &nv, d, &last, 1), 0);
    ck_assert_uint_eq(nv, n);
    free(v);
    ck_assert_int_eq(cairn_dag_is_ancestor(d, &first, &last, 1), 1);
    fprintf(stderr, "dag: %zu chained changes built+added+ordered in %.3f s (CPU time)\n", n,
            t1 - t0);
    cairn_dag_free(d);
}
END_TEST

START_TEST(long_chain_reverse_delivery)
{
    /* Everything but the root arrives first: one long pending cascade. */
    const size_t n = 50000;
    cairn_change **v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = mk(1, i + 1, i ? &v[i - 1]->hash : NULL, i ? 1 : 0, 0);
    cairn_hash last = v[n - 1]->hash;
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    for (size_t i = n; i-- > 0;) {
        int state;
        REQUIRE(cairn_dag_add(d, v[i], &state) == 0);
        REQUIRE(state == (i ? CAIRN_DAG_PENDING : CAIRN_DAG_READY));
    }
    ck_assert_uint_eq(drain(d), n);
    check_heads(d, &last, 1);
    free(v);
    cairn_dag_free(d);
}
END_TEST

START_TEST(ordered_table_grows_in_steps)
{
    /* The ordered table grows by copying a few slots per order (dag.c):
     * after every order, mid-growth or not, each ordered change is found
     * at its index (cairn_dag_check_ looks every one up) and a change not
     * added is not, and every growth has ended before the next. */
    const size_t n = 3000;
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_hash prev;
    size_t mid = 0, growths = 0;
    for (size_t i = 0; i < n; i++) {
        cairn_change *c = mk(1, i + 1, i ? &prev : NULL, i ? 1 : 0, i);
        cairn_change *absent = mk(2, 1, NULL, 0, i);
        int state;
        const uint64_t *old = d->otab_old;
        size_t cap = d->otab_cap;
        REQUIRE(cairn_dag_add(d, c, &state) == 0);
        REQUIRE(state == CAIRN_DAG_READY);
        uint64_t ix;
        REQUIRE(cairn_dag_order(d, &ix, NULL) == 0);
        REQUIRE(ix == i);
        if (cap && d->otab_cap != cap) {
            REQUIRE(old == NULL); /* the last growth had ended */
            REQUIRE(d->otab_old != NULL);
            growths++;
        }
        mid += d->otab_old != NULL;
        prev = *cairn_dag_hash_at(d, i);
        REQUIRE(cairn_dag_find(d, &prev, &ix) == 0 && ix == i);
        REQUIRE(cairn_dag_find(d, &absent->hash, &ix) == CAIRN_ENOTFOUND);
        REQUIRE(cairn_dag_check_(d) == 0);
        cairn_change_free(absent);
    }
    ck_assert_uint_ge(growths, 5);
    ck_assert_uint_gt(mid, 500);
    ck_assert_ptr_null(d->otab_old); /* the last growth (at 1536) has ended */
    cairn_dag_free(d);
}
END_TEST

START_TEST(seq_check_walks_back)
{
    /* Actor 1 writes once, then 2000 changes by actor 2 pile on top; actor
     * 1's next change depends only on the newest, so its predecessor is
     * found by walking back (bounded by its index), not among its deps. */
    cairn_dag *d;
    ck_assert_rc(cairn_dag_new(&d), 0);
    cairn_change *a1 = mk(1, 1, NULL, 0, 0);
    cairn_hash prev = a1->hash;
    ck_assert_int_eq(add(d, a1), CAIRN_DAG_READY);
    drain(d);
    for (uint64_t i = 0; i < 2000; i++) {
        cairn_change *b = mk(2, i + 1, &prev, 1, 0);
        prev = b->hash;
        int state;
        ck_assert_rc(cairn_dag_add(d, b, &state), 0);
        ck_assert_rc(cairn_dag_order(d, NULL, NULL), 0);
    }
    cairn_change *a2 = mk(1, 2, &prev, 1, 0);
    ck_assert_int_eq(add(d, a2), CAIRN_DAG_READY);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), 0);
    /* An actor-3 branch off a1 that skips actor 1's newer changes. */
    cairn_change *c1 = mk(3, 1, &a1->hash, 1, 0);
    cairn_change *a3 = mk(1, 3, &c1->hash, 1, 0);
    add(d, c1);
    add(d, a3);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), 0);
    ck_assert_rc(cairn_dag_order(d, NULL, NULL), CAIRN_ESEQGAP);
    cairn_change_free(a1);
    cairn_change_free(a2);
    cairn_change_free(c1);
    cairn_change_free(a3);
    cairn_dag_free(d);
}
END_TEST

/* ---- allocation failure ------------------------------------------------
 * Outside sanitizer builds, this executable replaces malloc/calloc/realloc
 * (glibc supports that; free stays glibc's) so that the n-th allocation made
 * inside a DAG or change call can be made to fail. ASan builds skip it. */
#if defined(__SANITIZE_ADDRESS__)
#define NO_MALLOC_HOOK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define NO_MALLOC_HOOK 1
#endif
#endif

#ifndef NO_MALLOC_HOOK
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);

static int armed;       /* count allocations only inside library calls */
static long fail_at;    /* index of the armed allocation to fail, or -1 */
static long armed_seen; /* armed allocations so far */
static int injected;    /* the failure was injected */

static int should_fail(void)
{
    if (!armed)
        return 0;
    if (armed_seen++ == fail_at) {
        injected = 1;
        return 1;
    }
    return 0;
}

void *malloc(size_t n)
{
    return should_fail() ? NULL : __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    return should_fail() ? NULL : __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    return should_fail() ? NULL : __libc_realloc(p, n);
}

/* Evaluates a library call with allocation counting on; its value is rc. */
#define ARMED(expr) (armed = 1, rc = (expr), armed = 0, rc)

/* A fixed script over a DAG; every library call that fails with ENOMEM is
 * retried. The result (apply order) must not depend on where it injected. */
static void script(cairn_change **h, size_t n, cairn_hash *order_out, size_t *enomem)
{
    cairn_dag *d;
    int rc;
    while (ARMED(cairn_dag_new(&d)) == CAIRN_ENOMEM)
        ++*enomem;
    REQUIRE(rc == 0);
    for (size_t k = 0; k < n; k++) {
        /* Deliver newest-first in blocks of 5, so pending chains build up. */
        size_t i = (k / 5) * 5 + (4 - k % 5);
        if (i >= n)
            i = k;
        int state;
        for (;;) {
            cairn_change *c = copy(h[i]);
            if (ARMED(cairn_dag_add(d, c, &state)) != CAIRN_ENOMEM)
                break;
            ++*enomem;
            REQUIRE(cairn_dag_has(d, &h[i]->hash) == 0);
        }
        REQUIRE(rc == 0);
        while (cairn_dag_peek_ready(d)) {
            uint64_t before = cairn_dag_count(d);
            if (ARMED(cairn_dag_order(d, NULL, NULL)) == CAIRN_ENOMEM) {
                ++*enomem;
                REQUIRE(cairn_dag_count(d) == before);
                continue;
            }
            REQUIRE(rc == 0);
        }
        cairn_hash *miss;
        size_t nm;
        while (ARMED(cairn_dag_missing(&miss, &nm, d)) == CAIRN_ENOMEM)
            ++*enomem;
        REQUIRE(rc == 0);
        free(miss);
    }
    REQUIRE(cairn_dag_count(d) == n);
    const cairn_hash *heads;
    size_t nh;
    while ((nh = (armed = 1, cairn_dag_heads(d, &heads))) == 0) {
        armed = 0;
        ++*enomem;
    }
    armed = 0;
    uint64_t *v;
    size_t nv;
    while (ARMED(cairn_dag_ancestors(&v, &nv, d, heads, nh)) == CAIRN_ENOMEM)
        ++*enomem;
    REQUIRE(rc == 0 && nv == n);
    free(v);
    while (ARMED(cairn_dag_not_ancestors(&v, &nv, d, &h[n / 2]->hash, 1)) == CAIRN_ENOMEM)
        ++*enomem;
    REQUIRE(rc == 0 && nv > 0);
    free(v);
    for (size_t i = 0; i < n; i++)
        order_out[i] = *cairn_dag_hash_at(d, i);
    cairn_dag_free(d);
}

START_TEST(alloc_failure_anywhere)
{
    const size_t n = 40;
    cairn_change **h = history(n, 3, 99);
    cairn_hash clean[40], got[40];
    size_t enomem = 0;
    fail_at = -1;
    armed_seen = 0;
    script(h, n, clean, &enomem);
    ck_assert_uint_eq(enomem, 0);
    long total = armed_seen;
    fprintf(stderr, "dag: %ld allocations in the script, each made to fail once\n", total);
    ck_assert_int_gt(total, 50);
    for (long k = 0; k < total; k++) {
        fail_at = k;
        armed_seen = 0;
        injected = 0;
        enomem = 0;
        script(h, n, got, &enomem);
        ck_assert_msg(injected, "allocation %ld never happened", k);
        ck_assert_mem_eq(got, clean, sizeof clean);
    }
    fail_at = -1;
    free_history(h, n);
}
END_TEST

START_TEST(alloc_failure_change)
{
    cairn_change **h = history(3, 2, 5);
    for (long k = 0;; k++) {
        int rc;
        cairn_change *c = (cairn_change *)1;
        fail_at = k;
        armed_seen = 0;
        injected = 0;
        rc = ARMED(cairn_change_decode(&c, h[2]->bytes, h[2]->len, NULL));
        if (!injected) {
            ck_assert_int_eq(rc, 0);
            cairn_change_free(c);
            break;
        }
        ck_assert_rc(rc, CAIRN_ENOMEM);
        ck_assert_ptr_null(c);
        c = (cairn_change *)1;
        armed_seen = 0;
        injected = 0;
        rc = ARMED(cairn_change_new(&c, h[2]));
        if (injected) {
            ck_assert_rc(rc, CAIRN_ENOMEM);
            ck_assert_ptr_null(c);
        } else {
            cairn_change_free(c);
        }
    }
    fail_at = -1;
    free_history(h, 3);
}
END_TEST
#endif

/* ---- bodies ------------------------------------------------------------------- */

struct bodies {
    uint8_t **b;
    size_t *len;
    size_t n;
    size_t loads;
};

static int bodies_load(void *arg, uint64_t index, uint8_t **bytes, size_t *len)
{
    struct bodies *s = arg;
    s->loads++;
    if (index >= s->n)
        return CAIRN_ENOTFOUND;
    *bytes = malloc(s->len[index]);
    if (!*bytes)
        return CAIRN_ENOMEM;
    memcpy(*bytes, s->b[index], s->len[index]);
    *len = s->len[index];
    return 0;
}

START_TEST(loader_rows_are_compact)
{
    /* 100k ordered changes with a loader: the DAG holds well under 100 bytes
     * per change, tables included; bodies come back from the loader. Without
     * a loader it keeps the bytes (and only the bytes). */
    const size_t n = 100000;
    struct bodies s = {malloc(n * sizeof(uint8_t *)), malloc(n * sizeof(size_t)), 0, 0};
    ck_assert(s.b && s.len);
    cairn_dag *d, *plain;
    ck_assert_rc(cairn_dag_new(&d), 0);
    ck_assert_rc(cairn_dag_new(&plain), 0);
    ck_assert_rc(cairn_dag_set_loader(d, bodies_load, &s), 0);
    cairn_hash prev;
    uint64_t seq[3] = {0};
    size_t body_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = (uint32_t)(i % 3);
        cairn_change *c = mk(a + 1, ++seq[a], i ? &prev : NULL, i ? 1 : 0, i);
        s.b[i] = malloc(c->len);
        REQUIRE(s.b[i] != NULL);
        memcpy(s.b[i], c->bytes, c->len);
        s.len[i] = c->len;
        s.n++;
        body_bytes += c->len;
        int state;
        REQUIRE(cairn_dag_add(plain, copy(c), &state) == 0 && state == CAIRN_DAG_READY);
        REQUIRE(cairn_dag_order(plain, NULL, NULL) == 0);
        REQUIRE(cairn_dag_add(d, c, &state) == 0 && state == CAIRN_DAG_READY);
        cairn_change *body = NULL;
        uint64_t ix;
        REQUIRE(cairn_dag_order(d, &ix, &body) == 0);
        REQUIRE(ix == i && body != NULL && cairn_hash_cmp(&body->hash, &prev) != 0);
        prev = body->hash;
        cairn_change_free(body);
    }
    ck_assert_rc(cairn_dag_set_loader(d, bodies_load, &s), CAIRN_ESTATE);
    size_t per = cairn_dag_mem_bytes(d) / n;
    printf("dag: %zu bytes per ordered change with a loader, %zu without (bodies %zu)\n", per,
           cairn_dag_mem_bytes(plain) / n, body_bytes / n);
    ck_assert_msg(per < 100, "%zu bytes per ordered change", per);
    ck_assert_uint_ge(cairn_dag_mem_bytes(plain), body_bytes);
    ck_assert_uint_eq(s.loads, 0); /* ordering never reads a body back */
    uint64_t want[] = {0, 1, n / 2, n - 1};
    for (size_t k = 0; k < 4; k++) {
        cairn_change *c1, *c2;
        ck_assert_rc(cairn_dag_load(&c1, d, want[k]), 0);
        ck_assert_rc(cairn_dag_load(&c2, plain, want[k]), 0);
        ck_assert_mem_eq(c1->hash.b, cairn_dag_hash_at(d, want[k])->b, CAIRN_HASH_LEN);
        ck_assert_mem_eq(c1->hash.b, c2->hash.b, CAIRN_HASH_LEN);
        uint64_t deps[4];
        ck_assert_uint_eq(cairn_dag_deps_at(deps, 4, d, want[k]), want[k] ? 1 : 0);
        if (want[k])
            ck_assert_uint_eq(deps[0], want[k] - 1);
        cairn_change_free(c1);
        cairn_change_free(c2);
    }
    ck_assert_uint_eq(s.loads, 4);
    /* bytes that do not hash to the id are never handed out */
    s.b[7][s.len[7] - 1] ^= 1;
    cairn_change *bad = (cairn_change *)1;
    ck_assert_rc(cairn_dag_load(&bad, d, 7), CAIRN_ECORRUPT);
    ck_assert_ptr_null(bad);
    s.len[8]--; /* truncated */
    ck_assert_rc(cairn_dag_load(&bad, d, 8), CAIRN_ECORRUPT);
    s.n = 9; /* gone from storage */
    ck_assert_rc(cairn_dag_load(&bad, d, 9), CAIRN_ENOTFOUND);
    s.n = n;
    for (size_t i = 0; i < n; i++)
        free(s.b[i]);
    free(s.b);
    free(s.len);
    cairn_dag_free(d);
    cairn_dag_free(plain);
}
END_TEST

static Suite *dag_suite(void)
{
    Suite *s = suite_create("dag");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, linear_in_order);
    tcase_add_test(tc, duplicates_dropped);
    tcase_add_test(tc, pending_cascade);
    tcase_add_test(tc, seq_gap_and_fork);
    tcase_add_test(tc, rejected_memory_grows_to_its_cap);
    tcase_add_test(tc, descendants_of_a_rejected_change_are_rejected);
    tcase_add_test(tc, discard_keeps_dependents_pending);
    tcase_add_test(tc, diamond_ancestry);
    tcase_add_test(tc, missing_lists_unknown_deps);
    tcase_add_test(tc, random_permutations_converge);
    tcase_add_test(tc, not_ancestors_matches_complement);
    tcase_add_test(tc, pending_limit);
    tcase_add_test(tc, pending_edge_limit);
    tcase_add_test(tc, expire_drops_changes_with_made_up_deps);
    tcase_add_test(tc, expire_oldest_first_and_dependents_ask_again);
    tcase_add_test(tc, expire_keeps_an_honest_burst);
    tcase_add_test(tc, long_chain_linear_time);
    tcase_add_test(tc, loader_rows_are_compact);
    tcase_add_test(tc, long_chain_reverse_delivery);
    tcase_add_test(tc, seq_check_walks_back);
    tcase_add_test(tc, ordered_table_grows_in_steps);
#ifndef NO_MALLOC_HOOK
    tcase_add_test(tc, alloc_failure_anywhere);
    tcase_add_test(tc, alloc_failure_change);
#endif
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(dag_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
