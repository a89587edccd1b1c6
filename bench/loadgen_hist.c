/* Log-bucketed latency histogram (the idea of HdrHistogram, our own code).
 *
 * A value v with most significant bit b >= SUB_BITS is shifted right by
 * e = b - SUB_BITS, which keeps its top SUB_BITS+1 bits m in
 * [2^SUB_BITS, 2^(SUB_BITS+1)); its bucket is e*2^SUB_BITS + m. Values below
 * 2^SUB_BITS use e = 0 and are their own bucket. Every bucket therefore spans
 * 2^e values out of at least 2^(SUB_BITS+e), a relative width below
 * 2^-SUB_BITS, and the index grows monotonically with v, so a percentile is
 * one walk over the counters. */
#include "loadgen_hist.h"

#include <string.h>

static unsigned msb64(uint64_t v)
{
    return 63u - (unsigned)__builtin_clzll(v);
}

size_t lg_hist_index(uint64_t v)
{
    if (v < (1ull << LG_HIST_SUB_BITS))
        return (size_t)v;
    unsigned e = msb64(v) - LG_HIST_SUB_BITS;
    return ((size_t)e << LG_HIST_SUB_BITS) + (size_t)(v >> e);
}

static void split(size_t index, unsigned *e, uint64_t *m)
{
    if (index < (2u << LG_HIST_SUB_BITS)) {
        *e = 0;
        *m = index;
        return;
    }
    *e = (unsigned)(index >> LG_HIST_SUB_BITS) - 1u;
    *m = (uint64_t)index - ((uint64_t)*e << LG_HIST_SUB_BITS);
}

uint64_t lg_hist_lowest(size_t index)
{
    unsigned e;
    uint64_t m;
    split(index, &e, &m);
    return m << e;
}

uint64_t lg_hist_highest(size_t index)
{
    unsigned e;
    uint64_t m;
    split(index, &e, &m);
    /* The top bucket ends at UINT64_MAX; avoid shifting past it. */
    if (e > 0 && m == (2ull << LG_HIST_SUB_BITS) - 1 && e == 64 - LG_HIST_SUB_BITS - 1)
        return UINT64_MAX;
    return ((m + 1) << e) - 1;
}

void lg_hist_init(lg_hist *h)
{
    memset(h, 0, sizeof *h);
    h->min = UINT64_MAX;
}

void lg_hist_record(lg_hist *h, uint64_t v)
{
    h->buckets[lg_hist_index(v)]++;
    h->count++;
    h->sum = (h->sum > UINT64_MAX - v) ? UINT64_MAX : h->sum + v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

void lg_hist_merge(lg_hist *dst, const lg_hist *src)
{
    for (size_t i = 0; i < LG_HIST_BUCKETS; i++)
        dst->buckets[i] += src->buckets[i];
    dst->count += src->count;
    dst->sum = (dst->sum > UINT64_MAX - src->sum) ? UINT64_MAX : dst->sum + src->sum;
    if (src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
}

uint64_t lg_hist_percentile(const lg_hist *h, double p)
{
    if (h->count == 0)
        return 0;
    if (p <= 0)
        return h->min;
    /* shave off rounding error: 99.9% of 1000 must be rank 999, not 1000 */
    double want = p / 100.0 * (double)h->count * (1.0 - 1e-12);
    uint64_t rank = (uint64_t)want;
    if ((double)rank < want)
        rank++;
    if (rank < 1)
        rank = 1;
    if (rank > h->count)
        rank = h->count;
    uint64_t seen = 0;
    for (size_t i = 0; i < LG_HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            uint64_t v = lg_hist_highest(i);
            if (v > h->max)
                v = h->max;
            if (v < h->min)
                v = h->min;
            return v;
        }
    }
    return h->max;
}

double lg_hist_mean(const lg_hist *h)
{
    return h->count ? (double)h->sum / (double)h->count : 0.0;
}
