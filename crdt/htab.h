#ifndef CAIRN_HTAB_H
#define CAIRN_HTAB_H

/*
 * Internal to crdt/: the one hash table of the document and the DAG (the
 * document's objects and each map's keys, the DAG's unordered changes and
 * authors). Open addressing over pointers to entries, linear probing,
 * backward-shift deletion (no tombstones), load at most 3/4.
 *
 * The table stores no hashes: its owner hashes keys — with SipHash under a
 * random key of its own (cairn_htab_sip), so that a peer choosing keys or change
 * hashes cannot pile them onto one probe chain — and gives the functions
 * that move entries (reserve, del) a callback that rehashes one. A lookup
 * is the owner's loop: from cairn_htab_at(t, h), cairn_htab_next while the
 * slot is not NULL, comparing its own way.
 *
 * Not thread-safe; the owner serialises every call.
 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct cairn_htab {
    void **slots;
    uint32_t cap; /* 0 or a power of two, at most 2^31 */
    uint32_t count;
} cairn_htab;

/* The hash of entry |e| (as given to put). */
typedef uint32_t (*cairn_htab_hash_cb)(const void *arg, const void *e);

/* SipHash-2-4 (Aumasson and Bernstein) of |len| bytes under a 16-byte
 * |key|: the same function as libsodium's crypto_shorthash, inlined. Table
 * keys are 12 to 32 bytes, where the library call's dispatch costs about
 * as much as the hash. test_htab checks it against crypto_shorthash. */
#define CAIRN_HTAB_KEYBYTES 16

static inline uint64_t cairn_htab_rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static inline uint64_t cairn_htab_le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

#define CAIRN_SIPROUND                                                                             \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = cairn_htab_rotl(v1, 13);                                                              \
        v1 ^= v0;                                                                                  \
        v0 = cairn_htab_rotl(v0, 32);                                                              \
        v2 += v3;                                                                                  \
        v3 = cairn_htab_rotl(v3, 16);                                                              \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = cairn_htab_rotl(v3, 21);                                                              \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = cairn_htab_rotl(v1, 17);                                                              \
        v1 ^= v2;                                                                                  \
        v2 = cairn_htab_rotl(v2, 32);                                                              \
    } while (0)

static inline uint64_t cairn_htab_sip64(const unsigned char key[CAIRN_HTAB_KEYBYTES],
                                        const void *data, size_t len)
{
    const uint8_t *p = data;
    uint64_t k0 = cairn_htab_le64(key), k1 = cairn_htab_le64(key + 8);
    uint64_t v0 = k0 ^ UINT64_C(0x736f6d6570736575), v1 = k1 ^ UINT64_C(0x646f72616e646f6d);
    uint64_t v2 = k0 ^ UINT64_C(0x6c7967656e657261), v3 = k1 ^ UINT64_C(0x7465646279746573);
    size_t n = len & ~(size_t)7;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t m = cairn_htab_le64(p + i);
        v3 ^= m;
        CAIRN_SIPROUND;
        CAIRN_SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)len << 56;
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)p[n + i] << (8 * i);
    v3 ^= b;
    CAIRN_SIPROUND;
    CAIRN_SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    CAIRN_SIPROUND;
    CAIRN_SIPROUND;
    CAIRN_SIPROUND;
    CAIRN_SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}
#undef CAIRN_SIPROUND

/* The table hash: SipHash's low 32 bits. */
static inline uint32_t cairn_htab_sip(const unsigned char key[CAIRN_HTAB_KEYBYTES], const void *p,
                                      size_t len)
{
    return (uint32_t)cairn_htab_sip64(key, p, len);
}

/* The home slot of hash |h| (cap > 0) and the one after |i|. */
static inline uint32_t cairn_htab_at(const cairn_htab *t, uint32_t h)
{
    return h & (t->cap - 1);
}

static inline uint32_t cairn_htab_next(const cairn_htab *t, uint32_t i)
{
    return (i + 1) & (t->cap - 1);
}

/* 1 if |extra| more entries would make reserve allocate. */
static inline int cairn_htab_full(const cairn_htab *t, uint32_t extra)
{
    return !t->cap || ((uint64_t)t->count + extra) * 4 > (uint64_t)t->cap * 3;
}

/* Room for |extra| more entries without passing 3/4 load, so that the
 * puts that follow cannot fail. Grows to the smallest power of two that
 * fits (at least |min_cap|, a power of two), rehashing every entry with
 * |hash|. CAIRN_ENOMEM, or CAIRN_ELIMIT past 2^31 slots; on failure the
 * table is unchanged. */
int cairn_htab_reserve(cairn_htab *t, uint32_t extra, uint32_t min_cap, cairn_htab_hash_cb hash,
                       const void *arg);

/* Puts |e| (hash |h|; not in the table) into reserved room. */
static inline void cairn_htab_put(cairn_htab *t, void *e, uint32_t h)
{
    uint32_t i = cairn_htab_at(t, h);
    while (t->slots[i])
        i = cairn_htab_next(t, i);
    t->slots[i] = e;
    t->count++;
}

/* Empties slot |i| and closes the gap (entries are rehashed with |hash|). */
void cairn_htab_del_at(cairn_htab *t, uint32_t i, cairn_htab_hash_cb hash, const void *arg);

/* Takes entry |e| (hash |h|) out, if it is in the table. */
void cairn_htab_del(cairn_htab *t, const void *e, uint32_t h, cairn_htab_hash_cb hash,
                    const void *arg);

/* Frees the slots (not the entries) and zeroes |t|. */
void cairn_htab_destroy(cairn_htab *t);

#endif
