/*
 * Unit tests for crdt/change.c: round trips of many change shapes, the
 * documented byte layout, and every rejection path of the decoder with its
 * specific error code. Hand-crafted inputs are assembled with a small raw
 * writer here, independent of the encoder under test.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crdt/change.h"
#include "crdt/error.h"

/* ---- helpers --------------------------------------------------------- */

static cairn_actor actor_n(uint8_t n)
{
    cairn_actor a;
    memset(a.b, 0, sizeof a.b);
    a.b[0] = n;
    a.b[15] = (uint8_t)(n * 7 + 1);
    return a;
}

static cairn_hash hash_n(uint32_t n)
{
    cairn_hash h;
    memset(h.b, 0, sizeof h.b);
    h.b[0] = (uint8_t)(n >> 24);
    h.b[1] = (uint8_t)(n >> 16);
    h.b[2] = (uint8_t)(n >> 8);
    h.b[3] = (uint8_t)n;
    h.b[31] = 0xAA;
    return h;
}

/* A raw byte builder for hand-crafted inputs. */
struct raw {
    uint8_t b[4096];
    size_t n;
};

static void r_byte(struct raw *r, uint8_t v)
{
    ck_assert_uint_lt(r->n, sizeof r->b);
    r->b[r->n++] = v;
}

static void r_bytes(struct raw *r, const void *p, size_t n)
{
    ck_assert_uint_le(r->n + n, sizeof r->b);
    memcpy(r->b + r->n, p, n);
    r->n += n;
}

static void r_var(struct raw *r, uint64_t v)
{
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        r_byte(r, (uint8_t)(b | (v ? 0x80 : 0)));
    } while (v);
}

/* Header with author actor_n(1), given seq/start, time 5, no deps, no other
 * actors (unless |other|), then nops. */
static void r_head(struct raw *r, uint64_t seq, uint64_t start, int other, uint64_t nops)
{
    cairn_actor a = actor_n(1), b = actor_n(2);
    r->n = 0;
    r_byte(r, 0xC1);
    r_bytes(r, a.b, 16);
    r_var(r, seq);
    r_var(r, start);
    r_var(r, 5);
    r_var(r, 0);
    r_var(r, other ? 1 : 0);
    if (other)
        r_bytes(r, b.b, 16);
    r_var(r, nops);
}

static int dec(const struct raw *r)
{
    cairn_change *c = (cairn_change *)1;
    int rc = cairn_change_decode(&c, r->b, r->n, NULL);
    if (rc)
        ck_assert_ptr_null(c);
    else
        cairn_change_free(c);
    return rc;
}

#define ck_assert_rc(got, want)                                                                    \
    ck_assert_msg((got) == (want), "rc %s, want %s", cairn_error_name(got), cairn_error_name(want))

static void check_equal(const cairn_change *a, const cairn_change *b)
{
    ck_assert_mem_eq(a->actor.b, b->actor.b, 16);
    ck_assert_uint_eq(a->seq, b->seq);
    ck_assert_uint_eq(a->start_op, b->start_op);
    ck_assert_uint_eq(a->time_ms, b->time_ms);
    ck_assert_uint_eq(a->ndeps, b->ndeps);
    if (a->ndeps)
        ck_assert_mem_eq(a->deps, b->deps, a->ndeps * sizeof(cairn_hash));
    ck_assert_uint_eq(a->nactors, b->nactors);
    ck_assert_mem_eq(a->actors, b->actors, a->nactors * sizeof(cairn_actor));
    ck_assert_uint_eq(a->nops, b->nops);
    for (uint32_t i = 0; i < a->nops; i++) {
        const cairn_op *x = &a->ops[i], *y = &b->ops[i];
        ck_assert_uint_eq(x->action, y->action);
        ck_assert_uint_eq(x->insert, y->insert);
        ck_assert_uint_eq(x->obj.counter, y->obj.counter);
        ck_assert_uint_eq(x->obj.actor, y->obj.actor);
        ck_assert_uint_eq(x->key_len, y->key_len);
        if (x->key_len)
            ck_assert_mem_eq(x->key, y->key, x->key_len);
        ck_assert_uint_eq(x->elem.counter, y->elem.counter);
        ck_assert_uint_eq(x->elem.actor, y->elem.actor);
        ck_assert_uint_eq(x->value.type, y->value.type);
        switch (x->value.type) {
        case CAIRN_V_BOOL:
            ck_assert_int_eq(x->value.v.b, y->value.v.b);
            break;
        case CAIRN_V_INT:
        case CAIRN_V_COUNTER:
            ck_assert(x->value.v.i == y->value.v.i);
            break;
        case CAIRN_V_UINT:
            ck_assert(x->value.v.u == y->value.v.u);
            break;
        case CAIRN_V_F64:
            ck_assert_mem_eq(&x->value.v.f, &y->value.v.f, 8);
            break;
        case CAIRN_V_BYTES:
        case CAIRN_V_STR:
            ck_assert_uint_eq(x->value.v.bytes.len, y->value.v.bytes.len);
            if (x->value.v.bytes.len)
                ck_assert_mem_eq(x->value.v.bytes.ptr, y->value.v.bytes.ptr, x->value.v.bytes.len);
            break;
        }
        ck_assert_uint_eq(x->npred, y->npred);
        for (uint32_t j = 0; j < x->npred; j++) {
            ck_assert_uint_eq(x->pred[j].counter, y->pred[j].counter);
            ck_assert_uint_eq(x->pred[j].actor, y->pred[j].actor);
        }
    }
}

/* new(tmpl) → bytes; decode(bytes) equals tmpl; encode(decoded) == bytes. */
static cairn_change *roundtrip(const cairn_change *tmpl)
{
    cairn_change *c = NULL, *d = NULL;
    ck_assert_rc(cairn_change_new(&c, tmpl), 0);
    check_equal(tmpl, c);
    cairn_hash h;
    cairn_hash_bytes(&h, c->bytes, c->len);
    ck_assert_mem_eq(h.b, c->hash.b, 32);
    ck_assert_rc(cairn_change_decode(&d, c->bytes, c->len, &c->hash), 0);
    check_equal(tmpl, d);
    ck_assert_mem_eq(d->hash.b, c->hash.b, 32);
    ck_assert_rc(cairn_change_encode(d), 0);
    ck_assert_uint_eq(d->len, c->len);
    ck_assert_mem_eq(d->bytes, c->bytes, c->len);
    ck_assert_mem_eq(d->hash.b, c->hash.b, 32);
    /* A second encode replaces the first without leaking. */
    ck_assert_rc(cairn_change_encode(d), 0);
    ck_assert_mem_eq(d->bytes, c->bytes, c->len);
    cairn_change_free(d);
    return c;
}

/* A change with every action, flag and value type. Arrays are static so the
 * template can be returned by value. */
static cairn_change rich_tmpl(void)
{
    static cairn_actor actors[3];
    static cairn_hash deps[3];
    static cairn_op ops[16];
    static cairn_opid p1[2], p2[1], p3[3];
    static uint8_t blob[300];
    actors[0] = actor_n(5);
    actors[1] = actor_n(2);
    actors[2] = actor_n(9);
    for (int i = 0; i < 3; i++)
        deps[i] = hash_n((uint32_t)(i * 1000 + 1));
    for (size_t i = 0; i < sizeof blob; i++)
        blob[i] = (uint8_t)(i * 31);
    memset(ops, 0, sizeof ops);
    int k = 0;
    /* 100: make a map at root["m"] overwriting two earlier ops */
    p1[0] = (cairn_opid){7, 1}; /* counter tie: actor bytes 2.. < 9.. */
    p1[1] = (cairn_opid){7, 2};
    ops[k++] = (cairn_op){.action = CAIRN_OP_MAKE_MAP,
                          .key = (const uint8_t *)"m",
                          .key_len = 1,
                          .npred = 2,
                          .pred = p1};
    /* 101: make a list at m["l"] (refers back to op 100) */
    ops[k++] = (cairn_op){
        .action = CAIRN_OP_MAKE_LIST, .obj = {100, 0}, .key = (const uint8_t *)"l", .key_len = 1};
    /* 102..: inserts into the list, each value type */
    cairn_value vals[8];
    memset(vals, 0, sizeof vals);
    vals[0].type = CAIRN_V_NULL;
    vals[1].type = CAIRN_V_BOOL;
    vals[1].v.b = 1;
    vals[2].type = CAIRN_V_INT;
    vals[2].v.i = INT64_MIN;
    vals[3].type = CAIRN_V_UINT;
    vals[3].v.u = UINT64_MAX;
    vals[4].type = CAIRN_V_F64;
    vals[4].v.f = -0.0;
    vals[5].type = CAIRN_V_BYTES;
    vals[5].v.bytes.ptr = blob;
    vals[5].v.bytes.len = sizeof blob;
    vals[6].type = CAIRN_V_STR;
    vals[6].v.bytes.ptr = (const uint8_t *)"h\xc3\xa9llo";
    vals[6].v.bytes.len = 6;
    vals[7].type = CAIRN_V_COUNTER;
    vals[7].v.i = -3;
    for (int i = 0; i < 8; i++) {
        cairn_opid after = i == 0 ? (cairn_opid){0, 0} : (cairn_opid){(uint64_t)(101 + i), 0};
        ops[k++] = (cairn_op){
            .action = CAIRN_OP_SET, .insert = 1, .obj = {101, 0}, .elem = after, .value = vals[i]};
    }
    /* 110: insert an object as a list element */
    ops[k++] =
        (cairn_op){.action = CAIRN_OP_MAKE_MAP, .insert = 1, .obj = {101, 0}, .elem = {109, 0}};
    /* 111: set an existing element of someone else's list */
    p2[0] = (cairn_opid){40, 2};
    ops[k++] = (cairn_op){.action = CAIRN_OP_SET,
                          .obj = {30, 1},
                          .elem = {40, 2},
                          .value = vals[2],
                          .npred = 1,
                          .pred = p2};
    /* 112: delete a list element; 113: increment a list counter */
    ops[k++] =
        (cairn_op){.action = CAIRN_OP_DEL, .obj = {30, 1}, .elem = {41, 1}, .npred = 1, .pred = p2};
    ops[k++] = (cairn_op){.action = CAIRN_OP_INC,
                          .obj = {30, 1},
                          .elem = {42, 2},
                          .value = {.type = CAIRN_V_INT, .v.i = 12345},
                          .npred = 1,
                          .pred = p2};
    /* 114: delete a map key with an empty, NUL-containing key variant */
    p3[0] = (cairn_opid){3, 1}; /* actor_n(2) sorts before the author actor_n(5) */
    p3[1] = (cairn_opid){3, 0};
    p3[2] = (cairn_opid){113, 0};
    ops[k++] = (cairn_op){.action = CAIRN_OP_DEL,
                          .key = (const uint8_t *)"a\0b",
                          .key_len = 3,
                          .npred = 3,
                          .pred = p3};
    /* 115: increment a map counter at an empty key */
    ops[k++] = (cairn_op){.action = CAIRN_OP_INC,
                          .obj = {100, 0},
                          .key = (const uint8_t *)"",
                          .value = {.type = CAIRN_V_INT, .v.i = -1}};
    cairn_change t = {0};
    t.actor = actors[0];
    t.seq = 3;
    t.start_op = 100;
    t.time_ms = 1764440000000ull;
    t.ndeps = 3;
    t.deps = deps;
    t.nactors = 3;
    t.actors = actors;
    t.nops = (uint32_t)k;
    t.ops = ops;
    return t;
}

static cairn_change minimal_tmpl(void)
{
    static cairn_actor a[1];
    a[0] = actor_n(1);
    cairn_change t = {0};
    t.actor = a[0];
    t.seq = 1;
    t.start_op = 1;
    t.nactors = 1;
    t.actors = a;
    return t;
}

/* ---- round trips ------------------------------------------------------ */

START_TEST(roundtrip_empty)
{
    cairn_change t = minimal_tmpl();
    cairn_change *c = roundtrip(&t);
    /* version, actor, seq, start, time, ndeps, nothers, nops */
    ck_assert_uint_eq(c->len, 1 + 16 + 1 + 1 + 1 + 1 + 1 + 1);
    ck_assert_ptr_null(c->ops);
    ck_assert_ptr_null(c->deps);
    cairn_change_free(c);
}
END_TEST

START_TEST(roundtrip_rich)
{
    cairn_change t = rich_tmpl();
    cairn_change *c = roundtrip(&t);
    ck_assert_uint_eq(c->nops, 16);
    /* Decoded keys and values point into the change's own memory. */
    ck_assert(c->ops[0].key >= c->bytes && c->ops[0].key < c->bytes + c->len);
    cairn_change_free(c);
}
END_TEST

START_TEST(roundtrip_many_deps_big_key)
{
    static cairn_hash deps[CAIRN_CHANGE_MAX_DEPS];
    for (uint32_t i = 0; i < CAIRN_CHANGE_MAX_DEPS; i++)
        deps[i] = hash_n(i * 3 + 1);
    size_t klen = 200000;
    uint8_t *key = malloc(klen);
    for (size_t i = 0; i < klen; i++)
        key[i] = (uint8_t)(i ^ (i >> 8));
    cairn_op op = {.action = CAIRN_OP_SET,
                   .key = key,
                   .key_len = (uint32_t)klen,
                   .value = {.type = CAIRN_V_BYTES, .v.bytes = {key, klen}}};
    cairn_change t = minimal_tmpl();
    t.ndeps = CAIRN_CHANGE_MAX_DEPS;
    t.deps = deps;
    t.nops = 1;
    t.ops = &op;
    t.seq = UINT64_MAX;
    t.start_op = UINT64_MAX; /* the only op takes the last counter */
    t.time_ms = UINT64_MAX;
    cairn_change *c = roundtrip(&t);
    ck_assert_uint_gt(c->len, 2 * klen);
    cairn_change_free(c);
    free(key);
}
END_TEST

START_TEST(roundtrip_values)
{
    /* Boundary integers and floats, each as its own change. */
    int64_t ints[] = {0, 1, -1, 63, -64, 64, -65, INT64_MAX, INT64_MIN};
    uint64_t uints[] = {0, 127, 128, 16383, 16384, UINT64_MAX};
    double fs[] = {0.0, -0.0, 1.5, -1e300, INFINITY, NAN};
    cairn_change t = minimal_tmpl();
    cairn_op op = {.action = CAIRN_OP_SET, .key = (const uint8_t *)"k", .key_len = 1};
    t.nops = 1;
    t.ops = &op;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        op.value.type = (i & 1) ? CAIRN_V_INT : CAIRN_V_COUNTER;
        op.value.v.i = ints[i];
        cairn_change_free(roundtrip(&t));
    }
    for (size_t i = 0; i < sizeof uints / sizeof uints[0]; i++) {
        op.value.type = CAIRN_V_UINT;
        op.value.v.u = uints[i];
        cairn_change_free(roundtrip(&t));
    }
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
        op.value.type = CAIRN_V_F64;
        op.value.v.f = fs[i];
        cairn_change_free(roundtrip(&t));
    }
    op.value.type = CAIRN_V_BOOL;
    op.value.v.b = 0;
    cairn_change_free(roundtrip(&t));
    op.value.type = CAIRN_V_BYTES;
    op.value.v.bytes.ptr = NULL;
    op.value.v.bytes.len = 0;
    cairn_change_free(roundtrip(&t));
}
END_TEST

/* The documented layout, byte by byte, for a small change. */
START_TEST(layout_matches_table)
{
    cairn_actor a[2] = {actor_n(3), actor_n(1)};
    cairn_hash dep = hash_n(7);
    cairn_opid pred = {300, 1};
    cairn_op op = {.action = CAIRN_OP_SET,
                   .obj = {0, 0},
                   .key = (const uint8_t *)"ab",
                   .key_len = 2,
                   .value = {.type = CAIRN_V_INT, .v.i = -2},
                   .npred = 1,
                   .pred = &pred};
    cairn_change t = {0};
    t.actor = a[0];
    t.seq = 2;
    t.start_op = 300;
    t.time_ms = 1;
    t.ndeps = 1;
    t.deps = &dep;
    t.nactors = 2;
    t.actors = a;
    t.nops = 1;
    t.ops = &op;
    cairn_change *c;
    ck_assert_rc(cairn_change_new(&c, &t), 0);
    struct raw r = {.n = 0};
    r_byte(&r, 0xC1);
    r_bytes(&r, a[0].b, 16);
    r_byte(&r, 2);                   /* seq */
    r_byte(&r, 0xAC), r_byte(&r, 2); /* start_op 300 */
    r_byte(&r, 1);                   /* time */
    r_byte(&r, 1);                   /* ndeps */
    r_bytes(&r, dep.b, 32);
    r_byte(&r, 1); /* one other actor */
    r_bytes(&r, a[1].b, 16);
    r_byte(&r, 1);                       /* nops */
    r_byte(&r, 3), r_byte(&r, 0);        /* SET, flags */
    r_byte(&r, 0);                       /* obj root */
    r_byte(&r, 2), r_bytes(&r, "ab", 2); /* key */
    r_byte(&r, 2), r_byte(&r, 3);        /* INT, zigzag(-2) = 3 */
    r_byte(&r, 1);                       /* npred */
    r_byte(&r, 0xAC), r_byte(&r, 2);     /* pred counter 300 */
    r_byte(&r, 1);                       /* actor index 1 */
    ck_assert_uint_eq(c->len, r.n);
    ck_assert_mem_eq(c->bytes, r.b, r.n);
    cairn_change_free(c);
}
END_TEST

/* The size the lead asked for: one key (18 bytes), a 32-byte value, one dep,
 * no preds, with realistic HLC counters (ms since 1970: 6-byte varints). */
START_TEST(size_one_key_put)
{
    cairn_actor a = actor_n(1);
    cairn_hash dep = hash_n(1);
    uint8_t key[18], val[32];
    memset(key, 'k', sizeof key);
    memset(val, 'v', sizeof val);
    cairn_op op = {.action = CAIRN_OP_SET,
                   .key = key,
                   .key_len = 18,
                   .value = {.type = CAIRN_V_BYTES, .v.bytes = {val, 32}}};
    cairn_change t = {0};
    t.actor = a;
    t.seq = 100;
    t.start_op = 1764440000000ull;
    t.time_ms = 1764440000000ull;
    t.ndeps = 1;
    t.deps = &dep;
    t.nactors = 1;
    t.actors = &a;
    t.nops = 1;
    t.ops = &op;
    cairn_change *c;
    ck_assert_rc(cairn_change_new(&c, &t), 0);
    /* 1+16+1+6+6 header, 1+32 deps, 1 actors, 1 nops,
     * op: 1+1+1+(1+18)+(1+1+32)+1 */
    ck_assert_uint_eq(c->len, 30 + 33 + 1 + 1 + 57);
    cairn_change_free(c);
}
END_TEST

/* CPU time of this process: the rate printed below is not diluted by other
 * processes sharing the machine. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Decode + hash check of the one-key change, and of the 16-op rich one,
 * many times over; prints the rate (informational, no time assertion). */
START_TEST(decode_throughput)
{
    cairn_actor a = actor_n(1);
    cairn_hash dep = hash_n(1);
    uint8_t key[18], val[32];
    memset(key, 'k', sizeof key);
    memset(val, 'v', sizeof val);
    cairn_op op = {.action = CAIRN_OP_SET,
                   .key = key,
                   .key_len = 18,
                   .value = {.type = CAIRN_V_BYTES, .v.bytes = {val, 32}}};
    cairn_change t = {0};
    t.actor = a;
    t.seq = 100;
    t.start_op = 1764440000000ull;
    t.time_ms = 1764440000000ull;
    t.ndeps = 1;
    t.deps = &dep;
    t.nactors = 1;
    t.actors = &a;
    t.nops = 1;
    t.ops = &op;
    cairn_change rich = rich_tmpl();
    const cairn_change *tmpls[2] = {&t, &rich};
    const char *names[2] = {"one-key", "16-op"};
    for (int k = 0; k < 2; k++) {
        cairn_change *c;
        ck_assert_rc(cairn_change_new(&c, tmpls[k]), 0);
        const int rounds = 100000;
        int bad = 0; /* ck_assert in the loop would cost a syscall per round */
        double t0 = now_s();
        for (int i = 0; i < rounds; i++) {
            cairn_change *d;
            bad |= cairn_change_decode(&d, c->bytes, c->len, &c->hash);
            cairn_change_free(d);
        }
        double dt = now_s() - t0;
        ck_assert_int_eq(bad, 0);
        fprintf(stderr, "change: decode+hash %s (%zu B): %.0f changes/s, %.1f MB/s (CPU time)\n",
                names[k], c->len, rounds / dt, rounds * (double)c->len / dt / 1e6);
        cairn_change_free(c);
    }
}
END_TEST

/* ---- helpers ---------------------------------------------------------- */

START_TEST(hash_and_hex)
{
    cairn_hash h;
    char hex[65];
    cairn_hash_bytes(&h, (const uint8_t *)"", 0);
    cairn_hash_hex(hex, &h);
    /* BLAKE2b-256 of the empty string. */
    ck_assert_str_eq(hex, "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
    cairn_hash_bytes(&h, (const uint8_t *)"abc", 3);
    cairn_hash_hex(hex, &h);
    ck_assert_str_eq(hex, "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
    cairn_hash x = hash_n(1), y = hash_n(2);
    ck_assert_int_lt(cairn_hash_cmp(&x, &y), 0);
    ck_assert_int_gt(cairn_hash_cmp(&y, &x), 0);
    ck_assert_int_eq(cairn_hash_cmp(&x, &x), 0);
    cairn_actor p = actor_n(1), q = actor_n(2);
    ck_assert_int_lt(cairn_actor_cmp(&p, &q), 0);
    ck_assert_int_eq(cairn_actor_cmp(&q, &q), 0);
}
END_TEST

/* ---- rejections ------------------------------------------------------- */

START_TEST(reject_every_prefix)
{
    cairn_change t = rich_tmpl();
    cairn_change *c;
    ck_assert_rc(cairn_change_new(&c, &t), 0);
    size_t limit = 0, trunc = 0;
    for (size_t n = 0; n < c->len; n++) {
        cairn_change *d = (cairn_change *)1;
        int rc = cairn_change_decode(&d, c->bytes, n, NULL);
        ck_assert_ptr_null(d);
        /* The input ends inside a field (ETRUNCATED) or a count/length says
         * more than is left (ELIMIT); nothing else. */
        ck_assert_msg(rc == CAIRN_ETRUNCATED || rc == CAIRN_ELIMIT, "prefix %zu: %s", n,
                      cairn_error_name(rc));
        if (n < 1 + 16 + 3)
            ck_assert_rc(rc, CAIRN_ETRUNCATED);
        limit += rc == CAIRN_ELIMIT;
        trunc += rc == CAIRN_ETRUNCATED;
    }
    /* Cutting inside the 300-byte blob is a length beyond the input. */
    ck_assert_uint_gt(limit, 300);
    ck_assert_uint_gt(trunc, 20);
    cairn_change_free(c);
}
END_TEST

START_TEST(flip_every_byte)
{
    /* Any single-byte corruption is either rejected with a table code or
     * decodes to something that re-encodes to the same bytes. */
    cairn_change t = rich_tmpl();
    cairn_change *c;
    ck_assert_rc(cairn_change_new(&c, &t), 0);
    uint8_t *buf = malloc(c->len);
    static const uint8_t xs[] = {0x01, 0x02, 0x80, 0xFF, 0x40};
    size_t accepted = 0;
    for (size_t i = 0; i < c->len; i++) {
        for (size_t k = 0; k < sizeof xs; k++) {
            memcpy(buf, c->bytes, c->len);
            buf[i] ^= xs[k];
            cairn_change *d = NULL;
            int rc = cairn_change_decode(&d, buf, c->len, NULL);
            if (rc == 0) {
                accepted++;
                ck_assert_rc(cairn_change_encode(d), 0);
                ck_assert_uint_eq(d->len, c->len);
                ck_assert_mem_eq(d->bytes, buf, c->len);
                cairn_change_free(d);
            } else {
                ck_assert_ptr_null(d);
                ck_assert(rc < 0 && rc > CAIRN_ERROR_BASE_);
                ck_assert_str_ne(cairn_error_name(rc), "EUNKNOWN");
            }
            /* With the original hash expected, any accepted flip is EBADHASH. */
            rc = cairn_change_decode(&d, buf, c->len, &c->hash);
            ck_assert_int_ne(rc, 0);
        }
    }
    ck_assert_uint_gt(accepted, 0); /* e.g. flips inside the blob */
    free(buf);
    cairn_change_free(c);
}
END_TEST

START_TEST(reject_header)
{
    struct raw r;
    ck_assert_rc(cairn_change_decode(&(cairn_change *){NULL}, NULL, 0, NULL), CAIRN_ETRUNCATED);
    r_head(&r, 1, 1, 0, 0);
    ck_assert_rc(dec(&r), 0);
    r.b[0] = 0xC2;
    ck_assert_rc(dec(&r), CAIRN_EBADVERSION);
    r.b[0] = 0x01;
    ck_assert_rc(dec(&r), CAIRN_EBADVERSION);
    r_head(&r, 0, 1, 0, 0);
    ck_assert_rc(dec(&r), CAIRN_EBADOP); /* seq 0 */
    r_head(&r, 1, 0, 0, 0);
    ck_assert_rc(dec(&r), CAIRN_EBADOP); /* start_op 0 */
    /* Trailing bytes. */
    r_head(&r, 1, 1, 0, 0);
    r_byte(&r, 0);
    ck_assert_rc(dec(&r), CAIRN_ENONCANON);
    /* The whole input above the size limit. */
    cairn_change *c = (cairn_change *)1;
    ck_assert_rc(cairn_change_decode(&c, r.b, (size_t)CAIRN_CHANGE_MAX_BYTES + 1, NULL),
                 CAIRN_ELIMIT);
    ck_assert_ptr_null(c);
}
END_TEST

START_TEST(reject_varints)
{
    struct raw r;
    cairn_actor a = actor_n(1);
    /* seq = 1 written overlong as 0x81 0x00 */
    r.n = 0;
    r_byte(&r, 0xC1);
    r_bytes(&r, a.b, 16);
    r_byte(&r, 0x81), r_byte(&r, 0x00);
    r_var(&r, 1), r_var(&r, 0), r_var(&r, 0), r_var(&r, 0), r_var(&r, 0);
    ck_assert_rc(dec(&r), CAIRN_ENONCANON);
    /* 10-byte varint carrying more than 64 bits */
    r.n = 17;
    for (int i = 0; i < 9; i++)
        r_byte(&r, 0xFF);
    r_byte(&r, 0x02);
    r_var(&r, 1), r_var(&r, 0), r_var(&r, 0), r_var(&r, 0), r_var(&r, 0);
    ck_assert_rc(dec(&r), CAIRN_ENONCANON);
    /* ... and exactly UINT64_MAX is fine */
    r.n = 17;
    for (int i = 0; i < 9; i++)
        r_byte(&r, 0xFF);
    r_byte(&r, 0x01);
    r_var(&r, 1), r_var(&r, 0), r_var(&r, 0), r_var(&r, 0), r_var(&r, 0);
    ck_assert_rc(dec(&r), 0);
    /* An 11-byte varint */
    r.n = 17;
    for (int i = 0; i < 10; i++)
        r_byte(&r, 0x80);
    r_byte(&r, 0x00);
    ck_assert_rc(dec(&r), CAIRN_ENONCANON);
    /* Overlong zero in an op's key length. */
    r_head(&r, 1, 1, 0, 1);
    r_byte(&r, CAIRN_OP_DEL), r_byte(&r, 0), r_var(&r, 0);
    r_byte(&r, 0x80), r_byte(&r, 0x00); /* key length 0, overlong */
    r_var(&r, 0);
    ck_assert_rc(dec(&r), CAIRN_ENONCANON);
}
END_TEST

START_TEST(reject_deps)
{
    struct raw r;
    cairn_actor a = actor_n(1);
    cairn_hash h1 = hash_n(1), h2 = hash_n(2);
    const cairn_hash *orders[][2] = {{&h2, &h1}, {&h1, &h1}};
    for (int k = 0; k < 2; k++) {
        r.n = 0;
        r_byte(&r, 0xC1);
        r_bytes(&r, a.b, 16);
        r_var(&r, 1), r_var(&r, 1), r_var(&r, 0);
        r_var(&r, 2);
        r_bytes(&r, orders[k][0]->b, 32);
        r_bytes(&r, orders[k][1]->b, 32);
        r_var(&r, 0), r_var(&r, 0);
        ck_assert_rc(dec(&r), CAIRN_EUNSORTED);
    }
    /* Sorted is fine. */
    r.n = 0;
    r_byte(&r, 0xC1);
    r_bytes(&r, a.b, 16);
    r_var(&r, 1), r_var(&r, 1), r_var(&r, 0);
    r_var(&r, 2);
    r_bytes(&r, h1.b, 32);
    r_bytes(&r, h2.b, 32);
    r_var(&r, 0), r_var(&r, 0);
    ck_assert_rc(dec(&r), 0);
}
END_TEST

START_TEST(reject_counts_beyond_input)
{
    struct raw r;
    cairn_actor a = actor_n(1);
    uint64_t big[] = {2, 1000, CAIRN_CHANGE_MAX_DEPS + 1, UINT64_MAX};
    for (size_t k = 0; k < 4; k++) {
        /* ndeps */
        r.n = 0;
        r_byte(&r, 0xC1);
        r_bytes(&r, a.b, 16);
        r_var(&r, 1), r_var(&r, 1), r_var(&r, 0);
        r_var(&r, big[k]);
        r_bytes(&r, hash_n(1).b, 32);
        ck_assert_rc(dec(&r), CAIRN_ELIMIT);
        /* other actors */
        r.n = 0;
        r_byte(&r, 0xC1);
        r_bytes(&r, a.b, 16);
        r_var(&r, 1), r_var(&r, 1), r_var(&r, 0), r_var(&r, 0);
        r_var(&r, big[k]);
        r_bytes(&r, actor_n(2).b, 16);
        ck_assert_rc(dec(&r), CAIRN_ELIMIT);
        /* ops: 4 bytes follow, less than one op's minimum of 5 per op */
        r_head(&r, 1, 1, 0, big[k]);
        r_bytes(&r, "\x04\x00\x00\x00", 4);
        ck_assert_rc(dec(&r), CAIRN_ELIMIT);
    }
    /* Actor count above the table limit, even if the bytes were there. */
    r.n = 0;
    r_byte(&r, 0xC1);
    r_bytes(&r, a.b, 16);
    r_var(&r, 1), r_var(&r, 1), r_var(&r, 0), r_var(&r, 0);
    r_var(&r, CAIRN_CHANGE_MAX_ACTORS);
    ck_assert_rc(dec(&r), CAIRN_ELIMIT);
    /* Key length, value length, pred count beyond the input. */
    r_head(&r, 1, 1, 0, 1);
    r_byte(&r, CAIRN_OP_DEL), r_byte(&r, 0), r_var(&r, 0);
    r_var(&r, 1000), r_bytes(&r, "abc", 3);
    ck_assert_rc(dec(&r), CAIRN_ELIMIT);
    r_head(&r, 1, 1, 0, 1);
    r_byte(&r, CAIRN_OP_SET), r_byte(&r, 0), r_var(&r, 0), r_var(&r, 0);
    r_byte(&r, CAIRN_V_BYTES), r_var(&r, UINT64_MAX), r_var(&r, 0);
    ck_assert_rc(dec(&r), CAIRN_ELIMIT);
    r_head(&r, 1, 1, 0, 1);
    r_byte(&r, CAIRN_OP_DEL), r_byte(&r, 0), r_var(&r, 0), r_var(&r, 0);
    r_var(&r, 3), r_var(&r, 1), r_var(&r, 0);
    ck_assert_rc(dec(&r), CAIRN_ELIMIT);
    r_head(&r, 10, 10, 0, 1);
    r_byte(&r, CAIRN_OP_DEL), r_byte(&r, 0), r_var(&r, 0), r_var(&r, 0);
    r_var(&r, CAIRN_CHANGE_MAX_PRED + 1);
    for (uint32_t i = 0; i < CAIRN_CHANGE_MAX_PRED + 1; i++)
        r_var(&r, 1 + i / 4), r_var(&r, 0);
    ck_assert_rc(dec(&r), CAIRN_ELIMIT);
}
END_TEST

START_TEST(reject_actor_table)
{
    struct raw r;
    cairn_actor a = actor_n(1), b = actor_n(2), c = actor_n(3);
    const cairn_actor *sets[][2] = {{&c, &b}, {&b, &b}, {&a, &b}};
    for (int k = 0; k < 3; k++) {
        r.n = 0;
        r_byte(&r, 0xC1);
        r_bytes(&r, a.b, 16);
        r_var(&r, 1), r_var(&r, 1), r_var(&r, 0), r_var(&r, 0);
        r_var(&r, 2);
        r_bytes(&r, sets[k][0]->b, 16);
        r_bytes(&r, sets[k][1]->b, 16);
        r_var(&r, 0);
        ck_assert_rc(dec(&r), CAIRN_ENONCANON);
    }
}
END_TEST

/* One op after a header with start_op 10, seq 1, and one other actor. */
static int dec_op(const uint8_t *op, size_t n)
{
    struct raw r;
    r_head(&r, 1, 10, 1, 1);
    r_bytes(&r, op, n);
    return dec(&r);
}

#define OP(...) dec_op((const uint8_t[]){__VA_ARGS__}, sizeof((const uint8_t[]){__VA_ARGS__}))

START_TEST(reject_ops)
{
    /* Baselines that decode: map SET root["k"] = INT 1; list insert at head. */
    ck_assert_rc(OP(3, 0, 0, 1, 'k', 2, 2, 0), 0);
    ck_assert_rc(OP(3, 3, 5, 1, 0, 0, 0), 0);
    /* Unknown actions. */
    ck_assert_rc(OP(0, 0, 0, 1, 'k', 0), CAIRN_EBADOP);
    ck_assert_rc(OP(6, 0, 0, 1, 'k', 0), CAIRN_EBADOP);
    /* Flag bits: unknown bit, insert without list, insert DEL / INC. */
    ck_assert_rc(OP(4, 4, 0, 1, 'k', 0), CAIRN_ENONCANON);
    ck_assert_rc(OP(4, 0x80, 0, 1, 'k', 0), CAIRN_ENONCANON);
    ck_assert_rc(OP(3, 1, 0, 1, 'k', 0, 0), CAIRN_EBADOP);
    ck_assert_rc(OP(4, 3, 5, 1, 0, 0), CAIRN_EBADOP);
    ck_assert_rc(OP(5, 3, 5, 1, 0, 2, 2, 0), CAIRN_EBADOP);
    /* Actor index out of the table (2 actors: index 2 is out). */
    ck_assert_rc(OP(4, 0, 5, 2, 1, 'k', 0), CAIRN_EBADOP);
    ck_assert_rc(OP(4, 2, 0, 5, 2, 0), CAIRN_EBADOP);
    ck_assert_rc(OP(4, 0, 0, 1, 'k', 1, 5, 2), CAIRN_EBADOP);
    /* Non-insert list op on elem counter 0 (the head). */
    ck_assert_rc(OP(4, 2, 5, 1, 0, 0), CAIRN_EBADOP);
    /* INC needs an INT delta. */
    ck_assert_rc(OP(5, 0, 0, 1, 'k', 7, 2, 0), CAIRN_EBADOP);
    ck_assert_rc(OP(5, 0, 0, 1, 'k', 3, 2, 0), CAIRN_EBADOP);
    ck_assert_rc(OP(5, 0, 0, 1, 'k', 2, 2, 0), 0);
    /* Unknown value tag; BOOL other than 0/1. */
    ck_assert_rc(OP(3, 0, 0, 1, 'k', 8, 0), CAIRN_EBADOP);
    ck_assert_rc(OP(3, 0, 0, 1, 'k', 1, 2, 0), CAIRN_ENONCANON);
    ck_assert_rc(OP(3, 0, 0, 1, 'k', 1, 1, 0), 0);
    /* Preds: counter 0, unsorted, duplicate, sorted by actor bytes. */
    ck_assert_rc(OP(4, 0, 0, 1, 'k', 1, 0, 0), CAIRN_EBADOP);
    ck_assert_rc(OP(4, 0, 0, 1, 'k', 2, 5, 1, 4, 1), CAIRN_EBADOP);
    ck_assert_rc(OP(4, 0, 0, 1, 'k', 2, 5, 1, 5, 1), CAIRN_EBADOP);
    /* author actor_n(1) < actor_n(2): at one counter, index 0 sorts first */
    ck_assert_rc(OP(4, 0, 0, 1, 'k', 2, 5, 0, 5, 1), 0);
    ck_assert_rc(OP(4, 0, 0, 1, 'k', 2, 5, 1, 5, 0), CAIRN_EBADOP);
    /* An insert overwrites nothing. */
    ck_assert_rc(OP(3, 3, 5, 1, 0, 0, 1, 4, 1), CAIRN_EBADOP);
    /* Forward / self references to the author's own ops (op counter 10). */
    ck_assert_rc(OP(4, 0, 10, 0, 1, 'k', 0), CAIRN_EBADOP);
    ck_assert_rc(OP(4, 0, 11, 0, 1, 'k', 0), CAIRN_EBADOP);
    ck_assert_rc(OP(4, 0, 0, 1, 'k', 1, 10, 0), CAIRN_EBADOP);
    ck_assert_rc(OP(4, 2, 5, 1, 10, 0, 0), CAIRN_EBADOP);
    ck_assert_rc(OP(4, 0, 9, 0, 1, 'k', 1, 9, 0), 0);
    /* ... but another actor's counters are not limited. */
    ck_assert_rc(OP(4, 0, 99, 1, 1, 'k', 1, 99, 1), 0);
    /* Fewer bytes than one op's minimum; an op cut short. */
    ck_assert_rc(OP(3), CAIRN_ELIMIT);
    ck_assert_rc(OP(3, 0, 0, 1, 'k', 2), CAIRN_ETRUNCATED);
}
END_TEST

START_TEST(reject_counter_overflow)
{
    struct raw r;
    /* Two ops from start_op UINT64_MAX: the second counter would wrap. */
    r_head(&r, 1, UINT64_MAX, 0, 2);
    for (int i = 0; i < 2; i++)
        r_bytes(&r, "\x04\x00\x00\x00\x00", 5);
    ck_assert_rc(dec(&r), CAIRN_EBADOP);
    r_head(&r, 1, UINT64_MAX - 1, 0, 2);
    for (int i = 0; i < 2; i++)
        r_bytes(&r, "\x04\x00\x00\x00\x00", 5);
    ck_assert_rc(dec(&r), 0);
}
END_TEST

START_TEST(reject_expect_hash)
{
    cairn_change t = rich_tmpl();
    cairn_change *c, *d = (cairn_change *)1;
    ck_assert_rc(cairn_change_new(&c, &t), 0);
    cairn_hash wrong = c->hash;
    wrong.b[31] ^= 1;
    ck_assert_rc(cairn_change_decode(&d, c->bytes, c->len, &wrong), CAIRN_EBADHASH);
    ck_assert_ptr_null(d);
    ck_assert_rc(cairn_change_decode(&d, c->bytes, c->len, &c->hash), 0);
    cairn_change_free(d);
    cairn_change_free(c);
}
END_TEST

START_TEST(encode_rejects_noncanonical)
{
    cairn_change *c = (cairn_change *)1;
    cairn_actor actors[3] = {actor_n(5), actor_n(2), actor_n(9)};
    cairn_hash deps[2] = {hash_n(2), hash_n(1)};
    cairn_change t = minimal_tmpl();

    cairn_change u = t; /* unsorted deps */
    u.ndeps = 2;
    u.deps = deps;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    ck_assert_ptr_null(c);
    deps[1] = deps[0]; /* duplicate deps */
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);

    u = t; /* seq 0, start_op 0 */
    u.seq = 0;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    u = t;
    u.start_op = 0;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);

    u = t; /* actors[0] != author; unsorted others; duplicate of author */
    u.actors = actors;
    u.nactors = 1;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    u.actor = actors[0];
    u.nactors = 3;
    actors[1] = actor_n(9), actors[2] = actor_n(2);
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    actors[1] = actor_n(5), actors[2] = actor_n(9);
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    actors[1] = actor_n(2);
    ck_assert_rc(cairn_change_new(&c, &u), 0);
    cairn_change_free(c);
    u.nactors = 0;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);

    /* Op shapes. */
    cairn_opid preds[2] = {{5, 0}, {4, 0}};
    cairn_op op = {.action = CAIRN_OP_DEL, .key = (const uint8_t *)"k", .key_len = 1};
    u = t;
    u.start_op = 10;
    u.nops = 1;
    u.ops = &op;
    ck_assert_rc(cairn_change_new(&c, &u), 0);
    cairn_change_free(c);
    op.npred = 2, op.pred = preds; /* unsorted preds */
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    op.npred = 0;
    op.value.type = CAIRN_V_INT; /* a value on DEL */
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    op.value.type = CAIRN_V_NULL;
    op.elem = (cairn_opid){3, 0}; /* list op with a key */
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    op.elem = (cairn_opid){0, 1}; /* counter 0 with an actor */
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    op.elem = (cairn_opid){0, 0};
    op.obj = (cairn_opid){10, 0}; /* self reference */
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    op.obj = (cairn_opid){0, 0};
    op.action = CAIRN_OP_SET;
    op.value.type = CAIRN_V_BOOL;
    op.value.v.b = 2;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    op.value.type = 42;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    op.action = CAIRN_OP_INC;
    op.value.type = CAIRN_V_UINT;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);
    op.action = 9;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_EINVAL);

    /* Larger than CAIRN_CHANGE_MAX_BYTES once encoded. */
    size_t big = CAIRN_CHANGE_MAX_BYTES;
    uint8_t *blob = calloc(1, big);
    ck_assert_ptr_nonnull(blob);
    cairn_op bigop = {.action = CAIRN_OP_SET,
                      .key = (const uint8_t *)"k",
                      .key_len = 1,
                      .value = {.type = CAIRN_V_BYTES, .v.bytes = {blob, big}}};
    u = t;
    u.nops = 1;
    u.ops = &bigop;
    ck_assert_rc(cairn_change_new(&c, &u), CAIRN_ELIMIT);
    ck_assert_ptr_null(c);
    bigop.value.v.bytes.len = big - 100; /* just fits */
    ck_assert_rc(cairn_change_new(&c, &u), 0);
    ck_assert_uint_le(c->len, CAIRN_CHANGE_MAX_BYTES);
    cairn_change_free(c);
    free(blob);

    /* encode on a caller-built change owns its bytes (freed by free()). */
    u = t;
    ck_assert_rc(cairn_change_encode(&u), 0);
    ck_assert_uint_eq(u.len, 23);
    ck_assert_rc(cairn_change_encode(&u), 0); /* replaces, no leak */
    free(u.bytes);
}
END_TEST

static Suite *change_suite(void)
{
    Suite *s = suite_create("change");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, roundtrip_empty);
    tcase_add_test(tc, roundtrip_rich);
    tcase_add_test(tc, roundtrip_many_deps_big_key);
    tcase_add_test(tc, roundtrip_values);
    tcase_add_test(tc, layout_matches_table);
    tcase_add_test(tc, size_one_key_put);
    tcase_add_test(tc, decode_throughput);
    tcase_add_test(tc, hash_and_hex);
    tcase_add_test(tc, reject_every_prefix);
    tcase_add_test(tc, flip_every_byte);
    tcase_add_test(tc, reject_header);
    tcase_add_test(tc, reject_varints);
    tcase_add_test(tc, reject_deps);
    tcase_add_test(tc, reject_counts_beyond_input);
    tcase_add_test(tc, reject_actor_table);
    tcase_add_test(tc, reject_ops);
    tcase_add_test(tc, reject_counter_overflow);
    tcase_add_test(tc, reject_expect_hash);
    tcase_add_test(tc, encode_rejects_noncanonical);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(change_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
