/*
 * Bloom filter of change hashes for the sync protocol.
 *
 * Probe positions come from one keyed 128-bit SipHash of the change hash
 * (Kirsch-Mitzenmacher double hashing: position_i = h1 + i * h2 mod m, with
 * h2 odd), so k probes cost one short hash. The key is the per-message salt:
 * change hashes are public, and without a secret key a peer could grind
 * changes that hit the same bits in every filter and so are never sent.
 */
#include "crdt/bloom.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"

static void probes_of(uint64_t *h1, uint64_t *h2, const cairn_bloom *b, const cairn_hash *h)
{
    unsigned char out[crypto_shorthash_siphashx24_BYTES];
    crypto_shorthash_siphashx24(out, h->b, CAIRN_HASH_LEN, b->salt);
    uint64_t a = 0, c = 0;
    for (int i = 7; i >= 0; i--) {
        a = (a << 8) | out[i];
        c = (c << 8) | out[8 + i];
    }
    *h1 = a;
    *h2 = c | 1;
}

int cairn_bloom_init(cairn_bloom *b, size_t nentries, uint32_t bits_per_entry, uint32_t probes,
                     size_t max_bytes, const uint8_t salt[CAIRN_BLOOM_SALT_LEN])
{
    memset(b, 0, sizeof *b);
    if (probes == 0 || probes > CAIRN_BLOOM_MAX_PROBES || bits_per_entry == 0)
        return CAIRN_EINVAL;
    memcpy(b->salt, salt, CAIRN_BLOOM_SALT_LEN);
    b->probes = probes;
    size_t nbytes;
    if (nentries > (SIZE_MAX - 7) / bits_per_entry)
        nbytes = max_bytes;
    else
        nbytes = (nentries * bits_per_entry + 7) / 8;
    if (nbytes > max_bytes)
        nbytes = max_bytes;
    if (nbytes == 0)
        return 0;
    b->bits = calloc(nbytes, 1);
    if (!b->bits)
        return CAIRN_ENOMEM;
    b->nbytes = nbytes;
    b->owned_ = 1;
    return 0;
}

void cairn_bloom_view(cairn_bloom *b, const uint8_t *bits, size_t nbytes, uint32_t probes,
                      const uint8_t salt[CAIRN_BLOOM_SALT_LEN])
{
    memset(b, 0, sizeof *b);
    memcpy(b->salt, salt, CAIRN_BLOOM_SALT_LEN);
    b->probes = probes;
    b->bits = (uint8_t *)bits; /* read-only: add() refuses views */
    b->nbytes = nbytes;
}

void cairn_bloom_destroy(cairn_bloom *b)
{
    if (b->owned_)
        free(b->bits);
    memset(b, 0, sizeof *b);
}

void cairn_bloom_add(cairn_bloom *b, const cairn_hash *h)
{
    if (b->nbytes == 0 || !b->owned_)
        return;
    uint64_t h1, h2, m = (uint64_t)b->nbytes * 8;
    probes_of(&h1, &h2, b, h);
    for (uint32_t i = 0; i < b->probes; i++) {
        uint64_t pos = (h1 + i * h2) % m;
        b->bits[pos >> 3] |= (uint8_t)(1u << (pos & 7));
    }
}

int cairn_bloom_contains(const cairn_bloom *b, const cairn_hash *h)
{
    if (b->nbytes == 0)
        return 0;
    uint64_t h1, h2, m = (uint64_t)b->nbytes * 8;
    probes_of(&h1, &h2, b, h);
    for (uint32_t i = 0; i < b->probes; i++) {
        uint64_t pos = (h1 + i * h2) % m;
        if (!(b->bits[pos >> 3] & (1u << (pos & 7))))
            return 0;
    }
    return 1;
}
