#ifndef CAIRN_BLOOM_H
#define CAIRN_BLOOM_H

/*
 * A Bloom filter over change hashes, for the sync protocol (crdt/sync.h).
 *
 * A filter is m = 8 * nbytes bits and k probes. The k probe positions of a
 * hash are derived by double hashing from SipHash-2-4 (128-bit output,
 * libsodium crypto_shorthash_siphashx24) of the 32 hash bytes, keyed by a
 * 16-byte salt that the sender draws at random for every message. Without
 * the salt nobody can precompute a change that collides with a filter, and a
 * fresh salt each round means one unlucky false positive is not repeated.
 *
 * Bit i of the filter is bit (i % 8), least significant first, of byte i / 8;
 * this is also the wire layout (see sync.c).
 *
 * Sizing: ceil(n * bits_per_entry / 8) bytes, at most |max_bytes| (a fuller
 * filter only has more false positives, never false negatives). With 10 bits
 * per entry and 7 probes the false-positive rate is about 0.8%. An empty
 * filter (0 bytes) contains nothing.
 */

#include <stddef.h>
#include <stdint.h>

#include "crdt/change.h"

#define CAIRN_BLOOM_SALT_LEN 16
#define CAIRN_BLOOM_MAX_PROBES 32u

typedef struct cairn_bloom {
    uint8_t salt[CAIRN_BLOOM_SALT_LEN];
    uint32_t probes; /* 1 .. CAIRN_BLOOM_MAX_PROBES */
    size_t nbytes;
    uint8_t *bits; /* owned (init) or borrowed (view) */
    int owned_;
} cairn_bloom;

/* An empty filter sized for |nentries| entries. Fails with CAIRN_EINVAL for
 * probes outside 1..CAIRN_BLOOM_MAX_PROBES or bits_per_entry == 0,
 * CAIRN_ENOMEM. On failure |b| is left as an empty filter (safe to destroy). */
int cairn_bloom_init(cairn_bloom *b, size_t nentries, uint32_t bits_per_entry, uint32_t probes,
                     size_t max_bytes, const uint8_t salt[CAIRN_BLOOM_SALT_LEN]);

/* A read-only filter over |bits| (borrowed: must outlive |b|). */
void cairn_bloom_view(cairn_bloom *b, const uint8_t *bits, size_t nbytes, uint32_t probes,
                      const uint8_t salt[CAIRN_BLOOM_SALT_LEN]);

/* Frees the bits if owned; |b| becomes an empty filter. */
void cairn_bloom_destroy(cairn_bloom *b);

/* Adds |h|; a no-op on an empty (0-byte) filter. Only for owned filters. */
void cairn_bloom_add(cairn_bloom *b, const cairn_hash *h);

/* 1 if |h| may be in the filter, 0 if it certainly is not. */
int cairn_bloom_contains(const cairn_bloom *b, const cairn_hash *h);

#endif
