#ifndef CAIRN_WIRE_H
#define CAIRN_WIRE_H

/*
 * The varint codec and the byte reader and writer of cairn: crdt/ reads and
 * writes changes' varints, checkpoints and sync messages with it, and the
 * layers above use it too (header-only, so no layer links another's
 * internals): store/ reads and writes its records with it, server/ packs
 * and scans protobuf with wire_put_uv, wire_uv_len and wire_uv_pb. Varints
 * are unsigned LEB128, canonical: at most 10 bytes, value < 2^64, no
 * overlong form (a trailing 0x00 group is CAIRN_ENONCANON); wire_uv_pb is
 * protobuf's laxer reading. A reader never passes |end|; a writer that
 * runs out of memory remembers it and ignores every later write, so
 * callers check once at the end.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

typedef struct wire_rd {
    const uint8_t *p, *end;
} wire_rd;

/* A reader over |n| bytes at |p| (|p| may be NULL when |n| is 0). */
static inline wire_rd wire_rd_of(const uint8_t *p, size_t n)
{
    wire_rd r = {p, p ? p + n : p};
    return r;
}

static inline size_t wire_left(const wire_rd *r)
{
    return (size_t)(r->end - r->p);
}

static inline int wire_uv(wire_rd *r, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned i = 0;; i++) {
        if (r->p == r->end)
            return CAIRN_ETRUNCATED;
        uint8_t b = *r->p++;
        if (i == 9 && b > 1)
            return CAIRN_ENONCANON; /* more than 64 bits */
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (b == 0 && i > 0)
                return CAIRN_ENONCANON; /* overlong */
            *out = v;
            return 0;
        }
    }
}

/* A varint this process wrote itself (in memory, never from outside): no
 * bounds, no canonical check. */
static inline uint64_t wire_uv_trusted(const uint8_t **pp)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int s = 0;
    while (*p & 0x80) {
        v |= (uint64_t)(*p++ & 0x7F) << s;
        s += 7;
    }
    v |= (uint64_t)*p++ << s;
    *pp = p;
    return v;
}

/* Protobuf's varint as protobuf-c and grpc-go read it, for messages from
 * clients: at most 10 bytes, an overlong form accepted, bits past 64
 * dropped. CAIRN_ETRUNCATED at |end|, CAIRN_EUNMARSHAL past 10 bytes. */
static inline int wire_uv_pb(wire_rd *r, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < 10; i++) {
        if (r->p == r->end)
            return CAIRN_ETRUNCATED;
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return CAIRN_EUNMARSHAL;
}

/* A count of items that each take at least |min| bytes, at most |max|:
 * beyond either it is CAIRN_ELIMIT, before anything is allocated for them. */
static inline int wire_count(wire_rd *r, uint64_t *out, uint64_t max, size_t min)
{
    int rc = wire_uv(r, out);
    if (rc)
        return rc;
    return *out > max || *out > wire_left(r) / min ? CAIRN_ELIMIT : 0;
}

static inline int wire_take(wire_rd *r, const uint8_t **out, size_t n)
{
    if (wire_left(r) < n)
        return CAIRN_ETRUNCATED;
    *out = r->p;
    r->p += n;
    return 0;
}

static inline int wire_u8(wire_rd *r, uint8_t *out)
{
    if (r->p == r->end)
        return CAIRN_ETRUNCATED;
    *out = *r->p++;
    return 0;
}

typedef struct wire_wr {
    uint8_t *p;
    size_t len, cap;
    int err;
} wire_wr;

/* Room for |n| more bytes (doubling). */
static inline int wire_reserve(wire_wr *w, size_t n)
{
    if (w->err || w->cap - w->len >= n)
        return w->err;
    size_t cap = w->cap ? w->cap : 4096;
    while (cap - w->len < n) {
        if (cap > SIZE_MAX / 2) {
            w->err = CAIRN_ENOMEM;
            return w->err;
        }
        cap *= 2;
    }
    uint8_t *np = realloc(w->p, cap);
    if (!np) {
        w->err = CAIRN_ENOMEM;
        return w->err;
    }
    w->p = np;
    w->cap = cap;
    return 0;
}

static inline size_t wire_uv_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes without a bounds check: room must be reserved. */
static inline uint8_t *wire_put_uv(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline void wire_uv_w(wire_wr *w, uint64_t v)
{
    if (wire_reserve(w, 10))
        return;
    w->len = (size_t)(wire_put_uv(w->p + w->len, v) - w->p);
}

static inline void wire_bytes_w(wire_wr *w, const void *b, size_t n)
{
    if (wire_reserve(w, n) || !n)
        return;
    memcpy(w->p + w->len, b, n);
    w->len += n;
}

static inline void wire_u8_w(wire_wr *w, uint8_t v)
{
    wire_bytes_w(w, &v, 1);
}

/* Asks for transparent huge pages under a big array that is about to be
 * filled at once (a restored table): one fault per 2 MiB instead of per
 * 4 KiB. Only the 2 MiB-aligned interior; a hint, failures ignored. */
static inline void wire_huge(void *p, size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + n) & ~(huge - 1);
    if (n >= 2 * huge && hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

#endif
