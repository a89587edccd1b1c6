#ifndef CAIRN_HTAB_H
#define CAIRN_HTAB_H

/*
 * Internal to crdt/: the one hash table of the document and the DAG (the
 * document's objects and each map's keys, the DAG's unordered changes and
 * authors). Open addressing over pointers to entries, linear probing,
 * backward-shift deletion (no tombstones where puts go), load at most 3/4.
 *
 * The table stores no hashes: its owner hashes keys — with SipHash under a
 * random key of its own (cairn_htab_sip), so that a peer choosing keys or change
 * hashes cannot pile them onto one probe chain — and gives the functions
 * that move entries (reserve, put, del) a callback that rehashes one. A
 * lookup is the owner's loop over the candidates cairn_htab_probe_start
 * and cairn_htab_probe_next give, comparing its own way.
 *
 * Growth is incremental (Redis's dict does the same): reserve allocates
 * the bigger array and keeps the old one beside it, and every put moves
 * the entries of at most CAIRN_HTAB_STEP more old slots across, so no call
 * rehashes more than that many entries (a map growing past 196,608 keys
 * took one put 42 to 69 ms when it rehashed them all). Until the old array
 * is drained, a probe
 * goes on into it after the new one, and a slot already moved (or an entry
 * deleted there) holds CAIRN_HTAB_MOVED, which probes pass over: the old
 * array takes no puts, so its runs never need closing. At the switch the
 * old array is at most 3/4 full and the new one, at least twice its size,
 * has room for 3/4 of the old capacity more entries, while the old array
 * is drained after 1/CAIRN_HTAB_STEP of its capacity in puts: a growth ends
 * long before the next one is due (a reserve of more room than that, a
 * bulk load, finishes the running one first).
 *
 * Not thread-safe; the owner serialises every call.
 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct cairn_htab {
    void **slots;
    uint32_t cap;   /* 0 or a power of two, at most 2^31 */
    uint32_t count; /* entries, in both arrays */
    /* While the table grows: the array it grows from (NULL otherwise),
     * moved from slot |opos| on. */
    void **old;
    uint32_t ocap, opos;
} cairn_htab;

/* Old slots a put moves across while the table grows. */
#define CAIRN_HTAB_STEP 4

/* An old slot whose entry moved to the new array or was deleted. */
extern char cairn_htab_moved_;
#define CAIRN_HTAB_MOVED ((void *)&cairn_htab_moved_)

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

/* The home slot of hash |h| in an array of |cap| slots (cap > 0). */
static inline uint32_t cairn_htab_home(uint32_t cap, uint32_t h)
{
    return h & (cap - 1);
}

/* 1 if |extra| more entries would make reserve allocate. */
static inline int cairn_htab_full(const cairn_htab *t, uint32_t extra)
{
    return !t->cap || ((uint64_t)t->count + extra) * 4 > (uint64_t)t->cap * 3;
}

/* Room for |extra| more entries without passing 3/4 load, so that the
 * puts that follow cannot fail. Grows to the smallest power of two that
 * fits (at least |min_cap|, a power of two); the entries move across with
 * the puts that follow (|hash| rehashes them), except that a growth still
 * running is finished first. CAIRN_ENOMEM, or CAIRN_ELIMIT past 2^31
 * slots; on failure the table is unchanged. */
int cairn_htab_reserve(cairn_htab *t, uint32_t extra, uint32_t min_cap, cairn_htab_hash_cb hash,
                       const void *arg);

/* Moves the entries of up to |n| more old slots to the new array, and
 * frees the old one once it is drained. */
void cairn_htab_move_(cairn_htab *t, uint32_t n, cairn_htab_hash_cb hash, const void *arg);

/* Puts |e| into the new array at the end of |h|'s run; no count. */
static inline void cairn_htab_place_(cairn_htab *t, void *e, uint32_t h)
{
    uint32_t i = cairn_htab_home(t->cap, h);
    while (t->slots[i])
        i = (i + 1) & (t->cap - 1);
    t->slots[i] = e;
}

/* Puts |e| (hash |h|; not in the table) into reserved room, and moves up
 * to CAIRN_HTAB_STEP old slots' entries across (rehashed with |hash|). */
static inline void cairn_htab_put(cairn_htab *t, void *e, uint32_t h, cairn_htab_hash_cb hash,
                                  const void *arg)
{
    if (t->old)
        cairn_htab_move_(t, CAIRN_HTAB_STEP, hash, arg);
    cairn_htab_place_(t, e, h);
    t->count++;
}

/* A lookup in progress: the run of hash |h| in the new array, then in the
 * old one. */
typedef struct cairn_htab_probe {
    void **slots;
    uint32_t mask, i, h;
    int in_old;
} cairn_htab_probe;

/* The next slot of the probe that holds an entry (the candidates for hash
 * |h|, each entry of the table at most once), or NULL at the end. The
 * owner may overwrite the slot with an entry of the same hash (one it
 * moved in memory); nothing else may change the table during the probe. */
static inline void **cairn_htab_probe_next(const cairn_htab *t, cairn_htab_probe *p)
{
    for (;;) {
        void **s = &p->slots[p->i];
        if (!*s) {
            if (p->in_old || !t->old)
                return NULL;
            p->in_old = 1;
            p->slots = t->old;
            p->mask = t->ocap - 1;
            p->i = cairn_htab_home(t->ocap, p->h);
            continue;
        }
        p->i = (p->i + 1) & p->mask;
        if (*s != CAIRN_HTAB_MOVED)
            return s;
    }
}

/* Starts the probe for hash |h|; its first candidate slot, or NULL. */
static inline void **cairn_htab_probe_start(const cairn_htab *t, uint32_t h, cairn_htab_probe *p)
{
    if (!t->cap)
        return NULL;
    *p = (cairn_htab_probe){t->slots, t->cap - 1, cairn_htab_home(t->cap, h), h, 0};
    return cairn_htab_probe_next(t, p);
}

/* The entries, each once, in no particular order:
 *   for (size_t i = 0; (e = cairn_htab_each(t, &i));) ...
 * The table may not change during the walk. */
static inline void *cairn_htab_each(const cairn_htab *t, size_t *i)
{
    for (; *i < t->cap; ++*i)
        if (t->slots[*i])
            return t->slots[(*i)++];
    for (; *i - t->cap < t->ocap; ++*i) {
        void *e = t->old[*i - t->cap];
        if (e && e != CAIRN_HTAB_MOVED) {
            ++*i;
            return e;
        }
    }
    return NULL;
}

/* Takes entry |e| (hash |h|) out, if it is in the table; |hash| rehashes
 * the entries that shift back into the gap. */
void cairn_htab_del(cairn_htab *t, const void *e, uint32_t h, cairn_htab_hash_cb hash,
                    const void *arg);

/* Frees the arrays (not the entries) and zeroes |t|. */
void cairn_htab_destroy(cairn_htab *t);

#endif
