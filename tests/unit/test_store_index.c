/*
 * The key index (store/index.c) against a sorted reference: random inserts
 * across many chunk splits, lookups, seeks at and between keys and across
 * chunk boundaries, iteration order, history positions, and the sweep that
 * compaction uses to drop keys without history.
 */

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "store/store_int.h"

#define NKEYS 20000

static char keys[NKEYS][16];
static int order[NKEYS];

static int cmp_idx(const void *a, const void *b)
{
    return strcmp(keys[*(const int *)a], keys[*(const int *)b]);
}

START_TEST(matches_a_sorted_reference)
{
    kindex x;
    ck_assert_int_eq(cairn_kindex_init(&x), 0);
    kiter it;
    ck_assert_ptr_null(cairn_kindex_first(&it, &x));
    ck_assert_ptr_null(cairn_kindex_seek(&it, &x, (const uint8_t *)"a", 1));
    ck_assert_ptr_null(cairn_kindex_find(&x, (const uint8_t *)"a", 1));
    uint64_t seed = 42;
    for (int i = 0; i < NKEYS; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        /* distinct keys: a random prefix, then the index */
        snprintf(keys[i], sizeof keys[i], "%04x%06d", (unsigned)(seed >> 48), i);
        order[i] = i;
        kentry *e = cairn_kindex_upsert(&x, (const uint8_t *)keys[i], strlen(keys[i]));
        ck_assert_ptr_nonnull(e);
        ck_assert_int_eq(cairn_kindex_push(e, (uint64_t)i + 2), 0);
        /* upsert of an existing key returns the same entry */
        ck_assert_ptr_eq(cairn_kindex_upsert(&x, (const uint8_t *)keys[i], strlen(keys[i])), e);
    }
    ck_assert_uint_eq(x.nkeys, NKEYS);
    ck_assert_uint_gt(x.nc, NKEYS / CAIRN_IDX_CHUNK); /* it split */
    qsort(order, NKEYS, sizeof *order, cmp_idx);
    int n = 0;
    for (kentry *e = cairn_kindex_first(&it, &x); e; e = cairn_kindex_next(&it), n++) {
        const char *k = keys[order[n]];
        ck_assert_uint_eq(e->key_len, strlen(k));
        ck_assert_mem_eq(e->key, k, e->key_len);
    }
    ck_assert_int_eq(n, NKEYS);
    for (int i = 0; i < NKEYS; i += 7) {
        const char *k = keys[order[i]];
        kentry *e = cairn_kindex_find(&x, (const uint8_t *)k, strlen(k));
        ck_assert_ptr_nonnull(e);
        ck_assert_int_eq(e->hist[0], order[i] + 2);
        /* seek at the key finds it; seek just past it finds the next */
        ck_assert_ptr_eq(cairn_kindex_seek(&it, &x, (const uint8_t *)k, strlen(k)), e);
        char past[20];
        snprintf(past, sizeof past, "%s%c", k, 0x01);
        kentry *nx = cairn_kindex_seek(&it, &x, (const uint8_t *)past, strlen(past));
        if (i + 1 < NKEYS)
            ck_assert_mem_eq(nx->key, keys[order[i + 1]], nx->key_len);
        else
            ck_assert_ptr_null(nx);
        /* a prefix of a key is not the key */
        ck_assert_ptr_null(cairn_kindex_find(&x, (const uint8_t *)k, strlen(k) - 1));
    }
    /* before everything, after everything */
    ck_assert_mem_eq(cairn_kindex_seek(&it, &x, (const uint8_t *)"", 0)->key, keys[order[0]], 10);
    ck_assert_ptr_null(cairn_kindex_seek(&it, &x, (const uint8_t *)"\xff", 1));
    /* history positions */
    kentry *e = cairn_kindex_find(&x, (const uint8_t *)keys[0], strlen(keys[0]));
    ck_assert_int_eq(cairn_kindex_push(e, 100000 | CAIRN_IDX_TOMB), 0);
    ck_assert_int_eq(cairn_kindex_push(e, 100005), 0);
    uint32_t pos;
    ck_assert_uint_eq(cairn_kindex_at(e, 1, &pos), 0);
    ck_assert_uint_eq(cairn_kindex_at(e, 99999, &pos), 2);
    ck_assert_uint_eq(pos, 0);
    ck_assert_uint_eq(cairn_kindex_at(e, 100003, &pos), 100000 | CAIRN_IDX_TOMB);
    ck_assert_uint_eq(cairn_kindex_at(e, 200000, &pos), 100005);
    ck_assert_uint_eq(pos, 2);
    /* sweep drops every key with no history, keeps order */
    for (int i = 0; i < NKEYS; i += 2)
        cairn_kindex_find(&x, (const uint8_t *)keys[i], strlen(keys[i]))->nhist = 0;
    cairn_kindex_sweep(&x);
    ck_assert_uint_eq(x.nkeys, NKEYS / 2);
    n = 0;
    const kentry *prev = NULL;
    for (kentry *k = cairn_kindex_first(&it, &x); k; k = cairn_kindex_next(&it), n++) {
        if (prev)
            ck_assert_int_lt(cairn_store_keycmp(prev->key, prev->key_len, k->key, k->key_len), 0);
        char num[8] = {0};
        memcpy(num, k->key + 4, 6);
        ck_assert_int_ne(atoi(num) % 2, 0);
        prev = k;
    }
    ck_assert_int_eq(n, NKEYS / 2);
    /* inserting after a sweep still works */
    ck_assert_ptr_nonnull(cairn_kindex_upsert(&x, (const uint8_t *)keys[0], strlen(keys[0])));
    ck_assert_ptr_nonnull(cairn_kindex_find(&x, (const uint8_t *)keys[0], strlen(keys[0])));
    /* sweeping everything leaves an empty, usable index */
    for (kentry *k = cairn_kindex_first(&it, &x); k; k = cairn_kindex_next(&it))
        k->nhist = 0;
    cairn_kindex_sweep(&x);
    ck_assert_uint_eq(x.nkeys, 0);
    ck_assert_ptr_null(cairn_kindex_first(&it, &x));
    ck_assert_ptr_nonnull(cairn_kindex_upsert(&x, (const uint8_t *)"z", 1));
    cairn_kindex_destroy(&x);
}
END_TEST

/* Keys arriving in ascending order (a load, time-ordered names), exactly or
 * with neighbours swapped as concurrent clients do, fill every chunk but
 * the last to at least 7/8; before, each split left the old chunk half full
 * for good. Descending order still splits in halves. Order is kept in all. */
static void insert_in_order(kindex *x, int n, int step, uint64_t swap_seed)
{
    int ord[NKEYS];
    for (int i = 0; i < n; i++)
        ord[i] = step > 0 ? i : n - 1 - i;
    for (int i = 0; swap_seed && i + 1 < n; i += 2) {
        swap_seed = swap_seed * 6364136223846793005ull + 1442695040888963407ull;
        if (swap_seed >> 63) {
            int s = ord[i];
            ord[i] = ord[i + 1];
            ord[i + 1] = s;
        }
    }
    for (int i = 0; i < n; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%08d", ord[i]);
        ck_assert_ptr_nonnull(cairn_kindex_upsert(x, (const uint8_t *)k, strlen(k)));
    }
}

static uint32_t least_fill(const kindex *x)
{
    uint32_t least = CAIRN_IDX_CHUNK;
    for (size_t i = 0; i + 1 < x->nc; i++)
        if (x->c[i]->n < least)
            least = x->c[i]->n;
    return least;
}

static void check_sorted(kindex *x, int n)
{
    kiter it;
    int i = 0;
    for (kentry *e = cairn_kindex_first(&it, x); e; e = cairn_kindex_next(&it), i++) {
        char k[16];
        snprintf(k, sizeof k, "k%08d", i);
        ck_assert_uint_eq(e->key_len, strlen(k));
        ck_assert_mem_eq(e->key, k, e->key_len);
        ck_assert_ptr_eq(cairn_kindex_find(x, (const uint8_t *)k, strlen(k)), e);
    }
    ck_assert_int_eq(i, n);
}

START_TEST(ascending_runs_fill_chunks)
{
    const uint64_t swaps[] = {0, 7};
    for (int s = 0; s < 2; s++) {
        kindex x;
        ck_assert_int_eq(cairn_kindex_init(&x), 0);
        insert_in_order(&x, NKEYS, 1, swaps[s]);
        check_sorted(&x, NKEYS);
        ck_assert_uint_ge(least_fill(&x), CAIRN_IDX_CHUNK - CAIRN_IDX_CHUNK / 8);
        ck_assert_uint_le(x.nc, NKEYS / (CAIRN_IDX_CHUNK - CAIRN_IDX_CHUNK / 8) + 1);
        cairn_kindex_destroy(&x);
    }
    kindex x;
    ck_assert_int_eq(cairn_kindex_init(&x), 0);
    insert_in_order(&x, NKEYS, -1, 0);
    check_sorted(&x, NKEYS);
    ck_assert_uint_ge(least_fill(&x), CAIRN_IDX_CHUNK / 2);
    cairn_kindex_destroy(&x);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_index");
    TCase *tc = tcase_create("index");
    tcase_add_test(tc, matches_a_sorted_reference);
    tcase_add_test(tc, ascending_runs_fill_chunks);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
