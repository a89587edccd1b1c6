/* Key choice for cairn-loadgen: a small PRNG, uniform and zipfian key ids,
 * and the fixed-width key format that makes 100-key prefixes.
 *
 * Key id i is written as 'k' followed by i in decimal, zero-padded to fill
 * the key size (18 bytes by default: "k00000000000000042"). Keys 100*g ..
 * 100*g+99 then share the prefix made of the first key_size-2 bytes, which is
 * what the range-prefix workload asks for. */
#ifndef CAIRN_BENCH_LOADGEN_KEYS_H
#define CAIRN_BENCH_LOADGEN_KEYS_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64: one 64-bit word of state per thread, seeded by the caller. */
uint64_t lg_rng_next(uint64_t *state);
/* Uniform double in [0, 1). */
double lg_rng_unit(uint64_t *state);
/* Uniform integer in [0, n), n > 0 (multiply-shift; bias below 2^-32 for
 * the key counts we use). */
uint64_t lg_rng_below(uint64_t *state, uint64_t n);

typedef enum lg_dist { LG_DIST_UNIFORM = 0, LG_DIST_ZIPFIAN = 1 } lg_dist;

typedef struct lg_keygen {
    uint64_t n;
    lg_dist dist;
    double theta, alpha, zetan, eta, half_pow_theta;
} lg_keygen;

/* Prepares a generator of ids in [0, n). For zipfian, 0 < theta < 1 (YCSB
 * uses 0.99) and setup costs O(n). Returns 0, or -1 on bad arguments. */
int lg_keygen_init(lg_keygen *g, uint64_t n, lg_dist dist, double theta);
/* Next key id. Zipfian ranks are scrambled with a hash so that the popular
 * keys are spread over the key space, as YCSB's ScrambledZipfian does.
 * Reentrant: all mutable state is |rng|. */
uint64_t lg_keygen_next(const lg_keygen *g, uint64_t *rng);
/* The unscrambled zipfian rank (0 = most popular); for the self-test. */
uint64_t lg_keygen_zipf_rank(const lg_keygen *g, uint64_t *rng);

/* Smallest key size that can hold ids below n ('k' + digits). */
size_t lg_key_min_size(uint64_t n);
/* Writes key |id| into out[0..key_size) (no terminator). key_size must be
 * at least lg_key_min_size(id + 1). */
void lg_key_format(char *out, size_t key_size, uint64_t id);

#endif
