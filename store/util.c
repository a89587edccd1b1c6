/*
 * Small helpers for the store: big-endian integers (LevelDB keys sort by
 * bytes, so numbers in keys are big-endian), the public varint writer
 * (crdt/wire.h's, for the server), SHA-1 (only because etcd derives member
 * and cluster ids from it; written from FIPS 180-4), a bump arena that lets
 * a response own all its memory through one pointer, a growable buffer, and
 * the store's log line.
 */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "crdt/wire.h"
#include "store/store_int.h"

void cairn_store_be64(uint8_t out[8], uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        out[i] = (uint8_t)v;
        v >>= 8;
    }
}

uint64_t cairn_store_get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

size_t cairn_store_put_varint(uint8_t *out, uint64_t v)
{
    return (size_t)(wire_put_uv(out, v) - out);
}

void cairn_store_log(cairn_store *s, int level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s->log_cb)
        s->log_cb(s->log_arg, level, msg);
    else
        fprintf(stderr, "cairn store: %s\n", msg);
}

/* ---- SHA-1 ---------------------------------------------------------------- */

static uint32_t rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

static void sha1_block(uint32_t h[5], const uint8_t *p)
{
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) {
            f = (b & c) | (~b & d);
            k = 0x5A827999;
        } else if (i < 40) {
            f = b ^ c ^ d;
            k = 0x6ED9EBA1;
        } else if (i < 60) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8F1BBCDC;
        } else {
            f = b ^ c ^ d;
            k = 0xCA62C1D6;
        }
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d;
        d = c;
        c = rol(b, 30);
        b = a;
        a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

void cairn_store_sha1(uint8_t out[20], const uint8_t *buf, size_t len)
{
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    size_t i = 0;
    for (; i + 64 <= len; i += 64)
        sha1_block(h, buf + i);
    uint8_t tail[128] = {0};
    size_t rem = len - i;
    if (rem)
        memcpy(tail, buf + i, rem);
    tail[rem] = 0x80;
    size_t tl = rem + 1 + 8 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;
    cairn_store_be64(tail + tl - 8, bits);
    sha1_block(h, tail);
    if (tl == 128)
        sha1_block(h, tail + 64);
    for (int j = 0; j < 5; j++) {
        out[4 * j] = (uint8_t)(h[j] >> 24);
        out[4 * j + 1] = (uint8_t)(h[j] >> 16);
        out[4 * j + 2] = (uint8_t)(h[j] >> 8);
        out[4 * j + 3] = (uint8_t)h[j];
    }
}

/* ---- arena ------------------------------------------------------------------ */

struct arena_blk {
    arena_blk *next;
    size_t used, cap;
    _Alignas(16) uint8_t mem[];
};

void *cairn_store_arena_alloc(store_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    arena_blk *b = a->head;
    if (!b || b->cap - b->used < n) {
        /* small first (most responses hold one kv or none), then doubling
         * up to 1 MiB blocks */
        size_t want = b ? (b->cap < (1u << 20) ? b->cap * 2 : b->cap) : 512;
        size_t cap = n > want ? n : want;
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->mem + b->used;
    b->used += n;
    return p;
}

void *cairn_store_arena_dup(store_arena *a, const void *p, size_t n)
{
    void *q = cairn_store_arena_alloc(a, n ? n : 1);
    if (q && n)
        memcpy(q, p, n);
    return q;
}

void cairn_store_arena_free(store_arena *a)
{
    arena_blk *b = a->head;
    while (b) {
        arena_blk *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
}

int cairn_store_buf_put(store_buf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q)
            return CAIRN_ENOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

void cairn_store_buf_free(store_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}
