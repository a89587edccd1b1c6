/*
 * crdt/htab: the inlined SipHash-2-4 equals libsodium's crypto_shorthash;
 * entries put, found and deleted in any order stay reachable, including
 * probe runs that wrap around the end of the table and a hash that sends
 * every entry to one slot; reserve grows only when it must and keeps
 * every entry. A growth moves at most CAIRN_HTAB_STEP old slots per put and
 * ends within the bound htab.h gives; while it runs, lookups, deletes (of
 * entries moved and not), puts back of deleted entries and iteration see
 * exactly the entries the table holds.
 */
#include <check.h>
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "crdt/htab.h"

START_TEST(sip_matches_libsodium)
{
    ck_assert_int_ge(sodium_init(), 0);
    ck_assert_int_eq(CAIRN_HTAB_KEYBYTES, crypto_shorthash_KEYBYTES);
    unsigned char key[CAIRN_HTAB_KEYBYTES];
    uint8_t buf[80];
    for (int round = 0; round < 20; round++) {
        randombytes_buf(key, sizeof key);
        randombytes_buf(buf, sizeof buf);
        for (size_t len = 0; len <= sizeof buf; len++) {
            uint8_t out[crypto_shorthash_BYTES];
            uint64_t want;
            crypto_shorthash(out, buf, len, key);
            memcpy(&want, out, sizeof want);
            ck_assert_uint_eq(cairn_htab_sip64(key, buf, len), want);
            ck_assert_uint_eq(cairn_htab_sip(key, buf, len), (uint32_t)want);
        }
    }
}
END_TEST

/* Entries: a 4-byte id at the start; the hash is chosen by the test. */
struct ent {
    uint32_t id;
    uint32_t h;
};

static uint32_t ent_hash(const void *arg, const void *e)
{
    (void)arg;
    return ((const struct ent *)e)->h;
}

static struct ent *find(const cairn_htab *t, uint32_t id, uint32_t h)
{
    cairn_htab_probe p;
    for (void **s = cairn_htab_probe_start(t, h, &p); s; s = cairn_htab_probe_next(t, &p))
        if (((struct ent *)*s)->id == id)
            return *s;
    return NULL;
}

/* For hot loops: unlike ck_assert_*, costs nothing when it holds (Check's
 * asserts record a checkpoint, a syscall, every time). */
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_abort_msg("%s:%d: %s", __FILE__, __LINE__, #cond);                                  \
    } while (0)

/* Every entry is found iff it is in, iteration yields each one in exactly
 * once, and count agrees. */
static void check_all(const cairn_htab *t, const struct ent *e, const uint8_t *in, uint32_t n)
{
    uint8_t *seen = calloc(n, 1);
    REQUIRE(seen);
    uint32_t count = 0;
    for (uint32_t j = 0; j < n; j++) {
        REQUIRE(find(t, j, e[j].h) == (in[j] ? &e[j] : NULL));
        count += in[j];
    }
    REQUIRE(count == t->count);
    struct ent *x;
    uint32_t walked = 0;
    for (size_t i = 0; (x = cairn_htab_each(t, &i));) {
        REQUIRE(x->id < n && x == &e[x->id]);
        REQUIRE(in[x->id] && !seen[x->id]);
        seen[x->id] = 1;
        walked++;
    }
    REQUIRE(walked == count);
    free(seen);
}

static void churn(uint32_t (*hash_of)(uint32_t id), uint32_t n)
{
    cairn_htab t = {0};
    struct ent *e = calloc(n, sizeof *e);
    uint8_t *in = calloc(n, 1);
    ck_assert_ptr_nonnull(e);
    ck_assert_ptr_nonnull(in);
    for (uint32_t i = 0; i < n; i++)
        e[i] = (struct ent){i, hash_of(i)};
    uint64_t rng = 88172645463325252u;
    for (int step = 0; step < 20000; step++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        uint32_t i = (uint32_t)(rng % n);
        if (in[i]) {
            cairn_htab_del(&t, &e[i], e[i].h, ent_hash, NULL);
            in[i] = 0;
        } else {
            uint32_t cap = t.cap;
            int full = cairn_htab_full(&t, 1);
            ck_assert_int_eq(cairn_htab_reserve(&t, 1, 8, ent_hash, NULL), 0);
            ck_assert(full || t.cap == cap);
            cairn_htab_put(&t, &e[i], e[i].h, ent_hash, NULL);
            in[i] = 1;
        }
        ck_assert_uint_le((uint64_t)t.count * 4, (uint64_t)t.cap * 3);
        if (step % 997 == 0 || step > 19900)
            check_all(&t, e, in, n);
    }
    /* Deleting what is absent changes nothing. */
    for (uint32_t j = 0; j < n; j++)
        if (!in[j]) {
            uint32_t c = t.count;
            cairn_htab_del(&t, &e[j], e[j].h, ent_hash, NULL);
            ck_assert_uint_eq(t.count, c);
            break;
        }
    cairn_htab_destroy(&t);
    ck_assert_ptr_null(t.slots);
    ck_assert_uint_eq(t.cap, 0);
    free(e);
    free(in);
}

static uint32_t spread(uint32_t id)
{
    return id * 2654435761u;
}

static uint32_t one_slot(uint32_t id)
{
    (void)id;
    return 0xFFFFFFFFu; /* the last slot: every run wraps around */
}

static uint32_t few_slots(uint32_t id)
{
    return (id % 5) * 0x10000001u + 0xFFFFFFF0u;
}

START_TEST(put_find_delete)
{
    churn(spread, 3000);
    churn(one_slot, 200);
    churn(few_slots, 300);
}
END_TEST

/* A table of |n| entries grown from 64 slots with every put and delete
 * checked while each growth runs: deletes of entries still in the old
 * array and of moved or new ones, and deleted entries put back (what a
 * rolled-back edit does). */
static void grow_checked(uint32_t (*hash_of)(uint32_t id), uint32_t n)
{
    cairn_htab t = {0};
    struct ent *e = calloc(n, sizeof *e);
    uint8_t *in = calloc(n, 1);
    ck_assert_ptr_nonnull(e);
    ck_assert_ptr_nonnull(in);
    for (uint32_t i = 0; i < n; i++)
        e[i] = (struct ent){i, hash_of(i)};
    uint64_t rng = 2463534242u;
    uint32_t next = 0, growths = 0, checked_mid = 0, puts_in_growth = 0;
    while (next < n) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        uint32_t j = (uint32_t)(rng % (next + 1));
        int del = next && rng % 4 == 0;
        if (del && in[j]) {
            uint32_t opos = t.opos;
            cairn_htab_del(&t, &e[j], e[j].h, ent_hash, NULL);
            in[j] = 0;
            ck_assert_uint_eq(t.opos, opos); /* only puts move entries */
        } else {
            uint32_t i = del ? j : next; /* a deleted one back, or a new one */
            if (in[i])
                continue;
            void **old = t.old;
            uint32_t cap = t.cap;
            ck_assert_int_eq(cairn_htab_reserve(&t, 1, 64, ent_hash, NULL), 0);
            if (t.cap != cap && cap) {
                /* a growth starts: the full old array stays beside */
                ck_assert_ptr_null(old);
                ck_assert_ptr_nonnull(t.old);
                ck_assert_uint_eq(t.ocap, cap);
                ck_assert_uint_eq(t.opos, 0);
                ck_assert_uint_eq(t.cap, 2 * cap);
                growths++;
                puts_in_growth = 0;
            }
            uint32_t opos = t.opos, left = t.ocap - t.opos;
            int growing = t.old != NULL;
            cairn_htab_put(&t, &e[i], e[i].h, ent_hash, NULL);
            in[i] = 1;
            if (i == next)
                next++;
            if (growing) {
                puts_in_growth++;
                if (left > CAIRN_HTAB_STEP) {
                    ck_assert_ptr_nonnull(t.old);
                    ck_assert_uint_eq(t.opos, opos + CAIRN_HTAB_STEP);
                } else {
                    ck_assert_ptr_null(t.old); /* drained and freed */
                    ck_assert_uint_eq(t.opos, 0);
                    /* within the bound: the old capacity / STEP puts */
                    ck_assert_uint_le(puts_in_growth,
                                      (t.cap / 2 + CAIRN_HTAB_STEP - 1) / CAIRN_HTAB_STEP);
                }
            }
        }
        ck_assert_uint_le((uint64_t)t.count * 4, (uint64_t)t.cap * 3);
        check_all(&t, e, in, n);
        checked_mid += t.old != NULL;
    }
    ck_assert_uint_ge(growths, 3);
    ck_assert_uint_gt(checked_mid, 100);
    cairn_htab_destroy(&t);
    ck_assert_ptr_null(t.old);
    free(e);
    free(in);
}

START_TEST(growth_in_steps)
{
    grow_checked(spread, 2000);
    grow_checked(one_slot, 400);
    grow_checked(few_slots, 600);
}
END_TEST

/* A reserve that needs more room than a running growth gives finishes it
 * first; one that fails leaves the growth as it was. */
START_TEST(reserve_during_growth)
{
    enum { N = 1000 };
    cairn_htab t = {0};
    struct ent e[N];
    uint8_t in[N] = {0};
    for (uint32_t i = 0; i < N; i++)
        e[i] = (struct ent){i, spread(i)};
    for (uint32_t i = 0; i < 49; i++) {
        ck_assert_int_eq(cairn_htab_reserve(&t, 1, 64, ent_hash, NULL), 0);
        cairn_htab_put(&t, &e[i], e[i].h, ent_hash, NULL);
        in[i] = 1;
    }
    /* 49 > 48: the 49th put started a growth 64 -> 128 and moved one step */
    ck_assert_ptr_nonnull(t.old);
    ck_assert_uint_eq(t.cap, 128);
    ck_assert_uint_eq(t.opos, CAIRN_HTAB_STEP);
    cairn_htab_del(&t, &e[0], e[0].h, ent_hash, NULL);
    cairn_htab_del(&t, &e[48], e[48].h, ent_hash, NULL);
    in[0] = in[48] = 0;
    void **old = t.old;
    ck_assert_int_eq(cairn_htab_reserve(&t, UINT32_MAX, 64, ent_hash, NULL), CAIRN_ELIMIT);
    ck_assert_ptr_eq(t.old, old);
    ck_assert_uint_eq(t.opos, CAIRN_HTAB_STEP);
    ck_assert_uint_eq(t.cap, 128);
    check_all(&t, e, in, N);
    /* 47 + 900 needs 2048 slots: the growth to 128 ends here, one from
     * 128 starts */
    ck_assert_int_eq(cairn_htab_reserve(&t, 900, 64, ent_hash, NULL), 0);
    ck_assert_uint_eq(t.cap, 2048);
    ck_assert_ptr_nonnull(t.old);
    ck_assert_uint_eq(t.ocap, 128);
    ck_assert_uint_eq(t.opos, 0);
    check_all(&t, e, in, N);
    for (uint32_t i = 49; i < 949; i++) {
        cairn_htab_put(&t, &e[i], e[i].h, ent_hash, NULL);
        in[i] = 1;
        if (i % 7 == 0)
            check_all(&t, e, in, N);
    }
    ck_assert_ptr_null(t.old);
    check_all(&t, e, in, N);
    /* emptied mid-growth, a growth keeps no old array */
    for (uint32_t i = 0; i < N; i++)
        if (in[i]) {
            cairn_htab_del(&t, &e[i], e[i].h, ent_hash, NULL);
            in[i] = 0;
        }
    ck_assert_uint_eq(t.count, 0);
    ck_assert_int_eq(cairn_htab_reserve(&t, 5000, 64, ent_hash, NULL), 0);
    ck_assert_ptr_null(t.old);
    check_all(&t, e, in, N);
    cairn_htab_destroy(&t);
}
END_TEST

START_TEST(reserve_sizes)
{
    cairn_htab t = {0};
    ck_assert(cairn_htab_full(&t, 0));
    ck_assert_int_eq(cairn_htab_reserve(&t, 0, 64, ent_hash, NULL), 0);
    ck_assert_uint_eq(t.cap, 64);
    ck_assert_int_eq(cairn_htab_reserve(&t, 48, 64, ent_hash, NULL), 0);
    ck_assert_uint_eq(t.cap, 64); /* 48/64 is 3/4 */
    ck_assert(cairn_htab_full(&t, 49));
    ck_assert_int_eq(cairn_htab_reserve(&t, 1000, 64, ent_hash, NULL), 0);
    ck_assert_uint_eq(t.cap, 2048);
    ck_assert_int_eq(cairn_htab_reserve(&t, UINT32_MAX, 64, ent_hash, NULL), CAIRN_ELIMIT);
    ck_assert_uint_eq(t.cap, 2048); /* unchanged */
    cairn_htab_destroy(&t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("htab");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, sip_matches_libsodium);
    tcase_add_test(tc, put_find_delete);
    tcase_add_test(tc, growth_in_steps);
    tcase_add_test(tc, reserve_during_growth);
    tcase_add_test(tc, reserve_sizes);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
