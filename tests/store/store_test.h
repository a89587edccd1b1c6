#ifndef CAIRN_STORE_TEST_H
#define CAIRN_STORE_TEST_H

/* Helpers shared by the store's Check suites (static: each suite is its own
 * executable). Fixed actor and clock so runs are reproducible. */

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crdt/error.h"
#include "store/store.h"

static inline uint64_t test_clock_ms(void *arg)
{
    (void)arg;
    return 1700000000000ull;
}

static inline void rm_rf(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static inline char *make_tmpdir(void)
{
    char tmpl[] = "/tmp/cairn-store-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    ck_assert_ptr_nonnull(d);
    return strdup(d);
}

/* Closes |s| and removes and frees its dir (from make_tmpdir). */
static inline void close_and_remove(cairn_store *s, char *dir)
{
    cairn_store_close(s);
    rm_rf(dir);
    free(dir);
}

static inline cairn_store *open_store_opts(const char *dir, cairn_store_options *o)
{
    static const cairn_actor actor = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
    o->dir = dir;
    if (!o->clock_ms)
        o->clock_ms = test_clock_ms;
    if (!o->actor)
        o->actor = &actor;
    cairn_store *s = NULL;
    int rc = cairn_store_open(&s, o);
    ck_assert_msg(rc == 0, "open: %s", cairn_strerror(rc));
    return s;
}

static inline cairn_store *open_store(const char *dir)
{
    cairn_store_options o;
    cairn_store_options_init(&o);
    return open_store_opts(dir, &o);
}

#define B(s) (const uint8_t *)(s), strlen(s)

/* A Put that must succeed, attached to |lease| (0: none); its revision. */
static inline int64_t put_leased(cairn_store *s, const char *k, const char *v, int64_t lease)
{
    cairn_put_req r = {0};
    r.key = (const uint8_t *)k;
    r.key_len = strlen(k);
    r.value = (const uint8_t *)v;
    r.value_len = strlen(v);
    r.lease = lease;
    cairn_put_resp resp;
    int rc = cairn_store_put(s, &resp, &r);
    ck_assert_msg(rc == 0, "put %s: %s", k, cairn_strerror(rc));
    int64_t rev = resp.header.revision;
    cairn_put_resp_destroy(&resp);
    return rev;
}

static inline int64_t put_kv(cairn_store *s, const char *k, const char *v)
{
    return put_leased(s, k, v, 0);
}

static inline int64_t del_range(cairn_store *s, const char *k, const char *end, int64_t *rev)
{
    cairn_delete_req r = {0};
    r.key = (const uint8_t *)k;
    r.key_len = strlen(k);
    if (end) {
        r.range_end = (const uint8_t *)end;
        r.range_end_len = end[0] ? strlen(end) : 1; /* "" means "\0" */
    }
    cairn_delete_resp resp;
    int rc = cairn_store_delete(s, &resp, &r);
    ck_assert_msg(rc == 0, "delete %s: %s", k, cairn_strerror(rc));
    int64_t n = resp.deleted;
    if (rev)
        *rev = resp.header.revision;
    cairn_delete_resp_destroy(&resp);
    return n;
}

static inline int64_t cur_rev(cairn_store *s)
{
    cairn_header h;
    cairn_store_header(s, &h);
    return h.revision;
}

static inline int kv_is(const cairn_kv *kv, const char *k, const char *v, int64_t create,
                        int64_t mod, int64_t ver)
{
    return kv->key_len == strlen(k) && memcmp(kv->key, k, kv->key_len) == 0 &&
           (!v || (kv->value_len == strlen(v) && memcmp(kv->value, v, kv->value_len) == 0)) &&
           kv->create_revision == create && kv->mod_revision == mod && kv->version == ver;
}

#define ck_kv(kv, k, v, c, m, ver)                                                                 \
    ck_assert_msg(kv_is((kv), (k), (v), (c), (m), (ver)),                                          \
                  "kv %.*s=%.*s c%lld m%lld v%lld, want %s=%s c%d m%d v%d", (int)(kv)->key_len,    \
                  (const char *)(kv)->key, (int)(kv)->value_len,                                   \
                  (kv)->value ? (const char *)(kv)->value : "", (long long)(kv)->create_revision,  \
                  (long long)(kv)->mod_revision, (long long)(kv)->version, (k), (v) ? (v) : "-",   \
                  (int)(c), (int)(m), (int)(ver))

/* Every change a store reports to a subscriber (the first
 * CAPTURED_MAX): its bytes, hash and revision, to hand to another store's
 * cairn_store_receive. Subscribe capture with a zeroed captured as its
 * argument; captured_free releases the bytes. */
#define CAPTURED_MAX 64

typedef struct captured {
    uint8_t *bytes[CAPTURED_MAX];
    size_t len[CAPTURED_MAX];
    cairn_hash hash[CAPTURED_MAX];
    int64_t rev[CAPTURED_MAX];
    int n;
} captured;

static inline void capture(void *arg, int64_t rev, const cairn_hash *h, const uint8_t *ch,
                           size_t len, const cairn_event *ev, size_t nev)
{
    captured *c = arg;
    (void)ev;
    (void)nev;
    if (c->n == CAPTURED_MAX)
        return;
    c->bytes[c->n] = malloc(len);
    memcpy(c->bytes[c->n], ch, len);
    c->len[c->n] = len;
    c->hash[c->n] = *h;
    c->rev[c->n] = rev;
    c->n++;
}

static inline void captured_free(captured *c)
{
    for (int i = 0; i < c->n; i++)
        free(c->bytes[i]);
    c->n = 0;
}

/* A store whose actor is |actor_byte| repeated, every change captured into
 * |cap|: one of two peers of one cluster (the actor's storage is shared by
 * the bytes with the same low bit). */
static inline cairn_store *open_capturing(const char *dir, uint8_t actor_byte, captured *cap)
{
    static cairn_actor actors[2];
    cairn_actor *a = &actors[actor_byte & 1];
    memset(a->b, actor_byte, CAIRN_ACTOR_LEN);
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.actor = a;
    cairn_store_subscriber sub = {capture, cap};
    o.subscribers = &sub;
    o.nsubscribers = 1;
    return open_store_opts(dir, &o);
}

/* The genesis as every node of cluster |token| builds it (store.h:
 * DOCUMENT LAYOUT), to build peers' changes on. *ga gets its actor. */
static inline cairn_change *genesis(const char *token, cairn_actor *ga)
{
    uint8_t buf[128];
    size_t n = strlen("cairn-genesis");
    memcpy(buf, "cairn-genesis", n);
    memcpy(buf + n, token, strlen(token));
    cairn_hash h;
    cairn_hash_bytes(&h, buf, n + strlen(token));
    memcpy(ga->b, h.b, CAIRN_ACTOR_LEN);
    static const char *names[4] = {"kvs", "leases", "members", "cluster"};
    cairn_op ops[4];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < 4; i++) {
        ops[i].action = CAIRN_OP_MAKE_MAP;
        ops[i].key = (const uint8_t *)names[i];
        ops[i].key_len = (uint32_t)strlen(names[i]);
    }
    cairn_change t;
    memset(&t, 0, sizeof t);
    t.actor = *ga;
    t.seq = 1;
    t.start_op = 1;
    t.nactors = 1;
    t.actors = ga;
    t.nops = 4;
    t.ops = ops;
    cairn_change *c;
    ck_assert_int_eq(cairn_change_new(&c, &t), 0);
    return c;
}

#endif
