/*
 * Bloom filter: no false negatives, a false-positive rate near the design
 * figure, salt-dependent probes, sizing and clamping, empty filters.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/bloom.h"
#include "crdt/error.h"

static void hash_of(cairn_hash *h, uint32_t i, uint32_t tag)
{
    uint8_t buf[8];
    memcpy(buf, &i, 4);
    memcpy(buf + 4, &tag, 4);
    cairn_hash_bytes(h, buf, sizeof buf);
}

static void salt_of(uint8_t salt[CAIRN_BLOOM_SALT_LEN], uint8_t v)
{
    for (int i = 0; i < CAIRN_BLOOM_SALT_LEN; i++)
        salt[i] = (uint8_t)(v * 31 + i);
}

START_TEST(no_false_negatives)
{
    uint8_t salt[CAIRN_BLOOM_SALT_LEN];
    salt_of(salt, 1);
    cairn_bloom b;
    ck_assert_int_eq(cairn_bloom_init(&b, 5000, 10, 7, 1u << 20, salt), 0);
    ck_assert_uint_eq(b.nbytes, 6250);
    for (uint32_t i = 0; i < 5000; i++) {
        cairn_hash h;
        hash_of(&h, i, 0);
        cairn_bloom_add(&b, &h);
    }
    for (uint32_t i = 0; i < 5000; i++) {
        cairn_hash h;
        hash_of(&h, i, 0);
        ck_assert_int_eq(cairn_bloom_contains(&b, &h), 1);
    }
    cairn_bloom_destroy(&b);
}
END_TEST

START_TEST(false_positive_rate)
{
    uint8_t salt[CAIRN_BLOOM_SALT_LEN];
    salt_of(salt, 2);
    cairn_bloom b;
    ck_assert_int_eq(cairn_bloom_init(&b, 10000, 10, 7, 1u << 20, salt), 0);
    for (uint32_t i = 0; i < 10000; i++) {
        cairn_hash h;
        hash_of(&h, i, 0);
        cairn_bloom_add(&b, &h);
    }
    unsigned fp = 0;
    for (uint32_t i = 0; i < 100000; i++) {
        cairn_hash h;
        hash_of(&h, i, 1);
        fp += (unsigned)cairn_bloom_contains(&b, &h);
    }
    /* Theory for m/n = 10, k = 7: 0.82%. */
    ck_assert_uint_gt(fp, 400);
    ck_assert_uint_lt(fp, 1300);
    cairn_bloom_destroy(&b);
}
END_TEST

START_TEST(salt_changes_positions)
{
    /* A tiny filter: many false positives, but a different set per salt, so
     * no hash is a false positive under every salt. */
    uint8_t s1[CAIRN_BLOOM_SALT_LEN], s2[CAIRN_BLOOM_SALT_LEN];
    salt_of(s1, 3);
    salt_of(s2, 4);
    cairn_bloom a, b;
    ck_assert_int_eq(cairn_bloom_init(&a, 4, 8, 2, 4, s1), 0);
    ck_assert_int_eq(cairn_bloom_init(&b, 4, 8, 2, 4, s2), 0);
    for (uint32_t i = 0; i < 4; i++) {
        cairn_hash h;
        hash_of(&h, i, 0);
        cairn_bloom_add(&a, &h);
        cairn_bloom_add(&b, &h);
    }
    ck_assert(memcmp(a.bits, b.bits, a.nbytes) != 0);
    unsigned fa = 0, fb = 0, both = 0;
    for (uint32_t i = 0; i < 2000; i++) {
        cairn_hash h;
        hash_of(&h, i, 9);
        int x = cairn_bloom_contains(&a, &h), y = cairn_bloom_contains(&b, &h);
        fa += (unsigned)x;
        fb += (unsigned)y;
        both += (unsigned)(x && y);
    }
    ck_assert_uint_gt(fa, 0);
    ck_assert_uint_gt(fb, 0);
    ck_assert_uint_lt(both, fa);
    /* Same salt, same bits: the receiver rebuilds the probes exactly. */
    cairn_bloom v;
    cairn_bloom_view(&v, a.bits, a.nbytes, a.probes, s1);
    for (uint32_t i = 0; i < 4; i++) {
        cairn_hash h;
        hash_of(&h, i, 0);
        ck_assert_int_eq(cairn_bloom_contains(&v, &h), 1);
    }
    cairn_bloom_destroy(&v);
    cairn_bloom_destroy(&a);
    cairn_bloom_destroy(&b);
}
END_TEST

START_TEST(sizing_and_empty)
{
    uint8_t salt[CAIRN_BLOOM_SALT_LEN];
    salt_of(salt, 5);
    cairn_bloom b;
    cairn_hash h;
    hash_of(&h, 1, 1);
    ck_assert_int_eq(cairn_bloom_init(&b, 0, 10, 7, 100, salt), 0);
    ck_assert_uint_eq(b.nbytes, 0);
    cairn_bloom_add(&b, &h);
    ck_assert_int_eq(cairn_bloom_contains(&b, &h), 0);
    cairn_bloom_destroy(&b);
    /* Clamped to max_bytes, and huge counts do not overflow. */
    ck_assert_int_eq(cairn_bloom_init(&b, 1000, 10, 7, 16, salt), 0);
    ck_assert_uint_eq(b.nbytes, 16);
    cairn_bloom_destroy(&b);
    ck_assert_int_eq(cairn_bloom_init(&b, SIZE_MAX / 2, 10, 7, 32, salt), 0);
    ck_assert_uint_eq(b.nbytes, 32);
    cairn_bloom_add(&b, &h);
    ck_assert_int_eq(cairn_bloom_contains(&b, &h), 1);
    cairn_bloom_destroy(&b);
    ck_assert_uint_eq(b.nbytes, 0);
    ck_assert_int_eq(cairn_bloom_init(&b, 3, 10, 0, 100, salt), CAIRN_EINVAL);
    ck_assert_int_eq(cairn_bloom_init(&b, 3, 10, CAIRN_BLOOM_MAX_PROBES + 1, 100, salt),
                     CAIRN_EINVAL);
    ck_assert_int_eq(cairn_bloom_init(&b, 3, 0, 7, 100, salt), CAIRN_EINVAL);
    cairn_bloom_destroy(&b);
    /* 1 bit per entry rounds up to a whole byte. */
    ck_assert_int_eq(cairn_bloom_init(&b, 3, 1, 1, 100, salt), 0);
    ck_assert_uint_eq(b.nbytes, 1);
    cairn_bloom_destroy(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bloom");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, no_false_negatives);
    tcase_add_test(tc, false_positive_rate);
    tcase_add_test(tc, salt_changes_positions);
    tcase_add_test(tc, sizing_and_empty);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
