/* Self-test of cairn-loadgen's pure parts: the histogram's bucket
 * arithmetic and percentiles, the key format, and the key distributions.
 * Runs under ctest as loadgen_selftest; exits non-zero on the first
 * failed check. Fixed seeds, no network. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen_hist.h"
#include "loadgen_keys.h"

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void test_hist_buckets(void)
{
    /* every value lies inside its bucket, buckets are ordered and narrow */
    uint64_t samples[] = {0,
                          1,
                          2,
                          127,
                          128,
                          129,
                          255,
                          256,
                          257,
                          1000,
                          123456,
                          999999937ull,
                          (1ull << 40) + 12345,
                          UINT64_MAX / 3,
                          UINT64_MAX - 1,
                          UINT64_MAX};
    size_t prev = 0;
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
        uint64_t v = samples[i];
        size_t idx = lg_hist_index(v);
        CHECK(idx < LG_HIST_BUCKETS);
        CHECK(lg_hist_lowest(idx) <= v && v <= lg_hist_highest(idx));
        CHECK(idx >= prev);
        prev = idx;
        uint64_t width = lg_hist_highest(idx) - lg_hist_lowest(idx);
        CHECK(v < 128 ? width == 0 : (double)width <= (double)lg_hist_lowest(idx) / 128.0);
    }
    CHECK(lg_hist_index(UINT64_MAX) == LG_HIST_BUCKETS - 1);
    /* consecutive buckets tile the line without gaps */
    for (size_t i = 0; i + 1 < LG_HIST_BUCKETS; i++) {
        if (lg_hist_highest(i) + 1 != lg_hist_lowest(i + 1)) {
            fprintf(stderr, "gap after bucket %zu\n", i);
            failures++;
            break;
        }
    }
}

static void test_hist_percentiles(void)
{
    lg_hist *h = malloc(sizeof *h);
    lg_hist_init(h);
    CHECK(lg_hist_percentile(h, 50) == 0);
    /* 1..100000 us in ns: pN must be within 1% of N% of the range */
    for (uint64_t v = 1; v <= 100000; v++)
        lg_hist_record(h, v * 1000);
    CHECK(h->count == 100000);
    CHECK(h->min == 1000 && h->max == 100000000ull);
    double ps[] = {50, 90, 99, 99.9};
    for (size_t i = 0; i < 4; i++) {
        double want = ps[i] / 100.0 * 100000 * 1000;
        double got = (double)lg_hist_percentile(h, ps[i]);
        CHECK(fabs(got - want) / want < 0.01);
    }
    CHECK(lg_hist_percentile(h, 100) == h->max);
    CHECK(fabs(lg_hist_mean(h) - 50000.5 * 1000) < 1);
    /* one slow outlier among fast ops shows at p99.9 only when it is >0.1% */
    lg_hist *g = malloc(sizeof *g);
    lg_hist_init(g);
    for (int i = 0; i < 999; i++)
        lg_hist_record(g, 1000000);
    lg_hist_record(g, 5000000000ull);
    CHECK(lg_hist_percentile(g, 99.9) <= 1000000 * 1.01);
    CHECK(lg_hist_percentile(g, 100) == 5000000000ull);
    lg_hist_record(g, 5000000000ull);
    CHECK(lg_hist_percentile(g, 99.9) >= 5000000000ull * 0.99);
    /* merge adds counts and keeps extremes */
    lg_hist_merge(h, g);
    CHECK(h->count == 101001 && h->min == 1000 && h->max == 5000000000ull);
    free(h);
    free(g);
}

static void test_key_format(void)
{
    char k[32];
    lg_key_format(k, 18, 42);
    CHECK(memcmp(k, "k00000000000000042", 18) == 0);
    lg_key_format(k, 5, 9999);
    CHECK(memcmp(k, "k9999", 5) == 0);
    CHECK(lg_key_min_size(1) == 2);
    CHECK(lg_key_min_size(10) == 2);
    CHECK(lg_key_min_size(11) == 3);
    CHECK(lg_key_min_size(10000) == 5);
    /* the 100-key prefix: ids 4200..4299 share all but the last two bytes */
    char a[18], b[18], c[18];
    lg_key_format(a, 18, 4200);
    lg_key_format(b, 18, 4299);
    lg_key_format(c, 18, 4300);
    CHECK(memcmp(a, b, 16) == 0 && memcmp(a, c, 16) != 0);
}

static void test_uniform(void)
{
    lg_keygen g;
    uint64_t rng = 7;
    CHECK(lg_keygen_init(&g, 10, LG_DIST_UNIFORM, 0) == 0);
    int counts[10] = {0};
    for (int i = 0; i < 100000; i++) {
        uint64_t k = lg_keygen_next(&g, &rng);
        CHECK(k < 10);
        if (k < 10)
            counts[k]++;
    }
    for (int i = 0; i < 10; i++)
        CHECK(counts[i] > 9500 && counts[i] < 10500);
    CHECK(lg_keygen_init(&g, 0, LG_DIST_UNIFORM, 0) == -1);
    CHECK(lg_keygen_init(&g, 10, LG_DIST_ZIPFIAN, 1.0) == -1);
}

static void test_zipfian(void)
{
    lg_keygen g;
    uint64_t rng = 11;
    const uint64_t n = 1000;
    CHECK(lg_keygen_init(&g, n, LG_DIST_ZIPFIAN, 0.99) == 0);
    int *counts = calloc(n, sizeof *counts);
    const int draws = 200000;
    for (int i = 0; i < draws; i++) {
        uint64_t r = lg_keygen_zipf_rank(&g, &rng);
        CHECK(r < n);
        if (r < n)
            counts[r]++;
    }
    /* P(rank 0) = 1/zeta(n, theta); about 13% for n=1000, theta=0.99 */
    double p0 = 1.0 / g.zetan;
    CHECK(fabs((double)counts[0] / draws - p0) < 0.01);
    /* rank 1 is about half as likely as rank 0, rank 9 about a tenth */
    CHECK(fabs((double)counts[1] / counts[0] - pow(2, -0.99)) < 0.05);
    CHECK(fabs((double)counts[9] / counts[0] - pow(10, -0.99)) < 0.03);
    /* scrambled ids stay in range, and the hottest id is not id 0 */
    memset(counts, 0, n * sizeof *counts);
    for (int i = 0; i < draws; i++) {
        uint64_t k = lg_keygen_next(&g, &rng);
        CHECK(k < n);
        if (k < n)
            counts[k]++;
    }
    uint64_t hot = 0;
    for (uint64_t i = 1; i < n; i++)
        if (counts[i] > counts[hot])
            hot = i;
    CHECK(hot != 0);
    CHECK((double)counts[hot] / draws > 0.1);
    free(counts);
}

int main(void)
{
    test_hist_buckets();
    test_hist_percentiles();
    test_key_format();
    test_uniform();
    test_zipfian();
    if (failures) {
        fprintf(stderr, "loadgen_selftest: %d failures\n", failures);
        return 1;
    }
    printf("loadgen_selftest: ok\n");
    return 0;
}
