/* Log-bucketed latency histogram for cairn-loadgen.
 *
 * Values are unsigned 64-bit (the load generator records nanoseconds).
 * Below 2^LG_HIST_SUB_BITS a value has its own bucket; above, each power of
 * two is split into 2^LG_HIST_SUB_BITS equal buckets, so a reported value is
 * within 1/128 (0.8 %) of the recorded one, whatever its magnitude, with a
 * fixed 7424 counters. Count, sum, min and max are kept exactly.
 * Not thread-safe: each thread records into its own and they are merged. */
#ifndef CAIRN_BENCH_LOADGEN_HIST_H
#define CAIRN_BENCH_LOADGEN_HIST_H

#include <stddef.h>
#include <stdint.h>

#define LG_HIST_SUB_BITS 7
#define LG_HIST_BUCKETS ((64 - LG_HIST_SUB_BITS + 1) << LG_HIST_SUB_BITS)

typedef struct lg_hist {
    uint64_t count;
    uint64_t sum; /* saturates instead of wrapping */
    uint64_t min;
    uint64_t max;
    uint64_t buckets[LG_HIST_BUCKETS];
} lg_hist;

void lg_hist_init(lg_hist *h);
void lg_hist_record(lg_hist *h, uint64_t v);
/* Adds every value of |src| into |dst|. */
void lg_hist_merge(lg_hist *dst, const lg_hist *src);
/* The value at percentile |p| (0..100]: the highest value equivalent to the
 * bucket holding the ceil(p/100*count)-th smallest value, clipped to max.
 * 0 when the histogram is empty. */
uint64_t lg_hist_percentile(const lg_hist *h, double p);
double lg_hist_mean(const lg_hist *h);

/* Bucket arithmetic, exposed for the self-test. */
size_t lg_hist_index(uint64_t v);
uint64_t lg_hist_lowest(size_t index);
uint64_t lg_hist_highest(size_t index);

#endif
