/*
 * crdt/htab: the inlined SipHash-2-4 equals libsodium's crypto_shorthash;
 * entries put, found and deleted in any order stay reachable, including
 * probe runs that wrap around the end of the table and a hash that sends
 * every entry to one slot; reserve grows only when it must and keeps
 * every entry.
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
    if (!t->cap)
        return NULL;
    for (uint32_t i = cairn_htab_at(t, h); t->slots[i]; i = cairn_htab_next(t, i))
        if (((struct ent *)t->slots[i])->id == id)
            return t->slots[i];
    return NULL;
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
            cairn_htab_put(&t, &e[i], e[i].h);
            in[i] = 1;
        }
        ck_assert_uint_le((uint64_t)t.count * 4, (uint64_t)t.cap * 3);
        if (step % 997 == 0 || step > 19900) {
            uint32_t count = 0;
            for (uint32_t j = 0; j < n; j++) {
                ck_assert_ptr_eq(find(&t, j, e[j].h), in[j] ? &e[j] : NULL);
                count += in[j];
            }
            ck_assert_uint_eq(count, t.count);
        }
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
    tcase_add_test(tc, reserve_sizes);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
