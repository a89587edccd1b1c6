/*
 * Leases in the document (store/lease.c): grant, revoke, keepalive,
 * TimeToLive, Leases, expiry with an injected clock, keepalive coalescing,
 * the restart rule, convergence of concurrent revokes, key sets, and the
 * async grant / revoke / compact (completion on the committer).
 *
 * "etcd:" comments quote what etcd 3.4.23 answered (one member, default
 * flags) on 127.0.0.1, asked with etcdctl 3.4:
 *   etcd --data-dir D --listen-client-urls http://127.0.0.1:20184 ...
 *   etcdctl --endpoints 127.0.0.1:20184 -w json lease grant 1   (etc.)
 * and tests/conformance/WATCH-LEASE-MEASURED.md (server branch).
 */

#include <pthread.h>
#include <stdatomic.h>

#include "../store/store_test.h"
#include "store/store_int.h"

/* ---- an injectable clock and an event log -------------------------------- */

static _Atomic uint64_t now_ms = 1700000000000ull;

static uint64_t clock_fn(void *arg)
{
    (void)arg;
    return atomic_load(&now_ms);
}

#define MAXCH 4096

typedef struct evlog {
    pthread_mutex_t mu;
    cairn_actor actor; /* the store's: only its own changes are shipped */
    size_t n;          /* changes reported */
    int64_t rev[MAXCH];
    size_t nev[MAXCH];
    char keys[MAXCH][64]; /* event keys of the change, "type:key," each */
    size_t nown;          /* changes made here, with their bytes */
    uint8_t *bytes[MAXCH];
    size_t len[MAXCH];
} evlog;

static void log_cb(void *arg, int64_t rev, const cairn_hash *hash, const uint8_t *change,
                   size_t change_len, const cairn_event *ev, size_t nev)
{
    (void)hash;
    evlog *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n < MAXCH) {
        l->rev[l->n] = rev;
        l->nev[l->n] = nev;
        char *p = l->keys[l->n];
        p[0] = 0;
        for (size_t i = 0; i < nev; i++) {
            size_t used = strlen(p);
            snprintf(p + used, sizeof l->keys[0] - used, "%c:%.*s,",
                     ev[i].type == CAIRN_EVENT_DELETE ? 'D' : 'P', (int)ev[i].kv.key_len,
                     (const char *)ev[i].kv.key);
        }
        l->n++;
    }
    cairn_change *c;
    ck_assert_int_eq(cairn_change_decode(&c, change, change_len, NULL), 0);
    int own = memcmp(c->actor.b, l->actor.b, CAIRN_ACTOR_LEN) == 0;
    cairn_change_free(c);
    if (own && l->nown < MAXCH) {
        l->bytes[l->nown] = malloc(change_len);
        memcpy(l->bytes[l->nown], change, change_len);
        l->len[l->nown++] = change_len;
    }
    pthread_mutex_unlock(&l->mu);
}

static void log_free(evlog *l)
{
    for (size_t i = 0; i < l->nown; i++)
        free(l->bytes[i]);
    free(l);
}

static evlog *log_new(const cairn_actor *actor)
{
    evlog *l = calloc(1, sizeof *l);
    l->actor = *actor;
    pthread_mutex_init(&l->mu, NULL);
    return l;
}

static size_t log_count(evlog *l)
{
    pthread_mutex_lock(&l->mu);
    size_t n = l->n;
    pthread_mutex_unlock(&l->mu);
    return n;
}

static cairn_store *open_lease_store(const char *dir, evlog *l, const cairn_actor *actor)
{
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.clock_ms = clock_fn;
    o.actor = actor;
    cairn_store_subscriber sub = {log_cb, l};
    o.subscribers = &sub;
    o.nsubscribers = l ? 1 : 0;
    return open_store_opts(dir, &o);
}

/* Ships every change |from| made since *cursor to |to|. */
static void flush_done(void *arg, int rc)
{
    ck_assert_int_eq(rc, 0);
    atomic_store((_Atomic int *)arg, 1);
}

/* Waits until every change |s| applied so far is durable and reported
 * (keepalive and expiry do not wait themselves). */
static void flush(cairn_store *s)
{
    _Atomic int done = 0;
    ck_assert_int_eq(cairn_store_enqueue_wait(s, flush_done, (void *)&done, NULL), 0);
    while (!atomic_load(&done))
        usleep(1000);
}

static void ship(cairn_store *src, evlog *from, size_t *cursor, cairn_store *to)
{
    flush(src);
    for (;;) {
        pthread_mutex_lock(&from->mu);
        int more = *cursor < from->nown;
        pthread_mutex_unlock(&from->mu);
        if (!more)
            break;
        int rc = cairn_store_receive(to, from->bytes[*cursor], from->len[*cursor]);
        ck_assert_msg(rc == 0, "receive: %s", cairn_strerror(rc));
        (*cursor)++;
    }
}

static int64_t put_lease(cairn_store *s, const char *k, int64_t lease)
{
    cairn_put_req r = {0};
    r.key = (const uint8_t *)k;
    r.key_len = strlen(k);
    r.value = (const uint8_t *)"v";
    r.value_len = 1;
    r.lease = lease;
    cairn_put_resp resp;
    int rc = cairn_store_put(s, &resp, &r);
    if (rc)
        return rc;
    int64_t rev = resp.header.revision;
    cairn_put_resp_destroy(&resp);
    return rev;
}

static int64_t grant(cairn_store *s, int64_t id, int64_t ttl)
{
    cairn_lease_grant_resp g;
    int rc = cairn_store_lease_create(s, &g, id, ttl);
    ck_assert_msg(rc == 0, "grant: %s", cairn_strerror(rc));
    return g.id;
}

/* TimeToLive: remaining TTL, and the keys as "a,b,c," into |keys|. */
static int64_t ttl_of(cairn_store *s, int64_t id, int64_t *granted, char *keys, size_t cap)
{
    cairn_lease_ttl_resp r;
    ck_assert_int_eq(cairn_store_lease_ttl(s, &r, id, keys != NULL), 0);
    ck_assert_int_eq(r.id, id);
    if (granted)
        *granted = r.granted_ttl;
    if (keys) {
        keys[0] = 0;
        for (size_t i = 0; i < r.nkeys; i++) {
            size_t used = strlen(keys);
            snprintf(keys + used, cap - used, "%.*s,", (int)r.keys[i].key_len,
                     (const char *)r.keys[i].key);
        }
    }
    int64_t t = r.ttl;
    cairn_lease_ttl_resp_destroy(&r);
    return t;
}

static int64_t nkeys_live(cairn_store *s)
{
    cairn_range_req r = {0};
    static const uint8_t zero = 0;
    r.key = &zero;
    r.key_len = 1;
    r.range_end = &zero;
    r.range_end_len = 1;
    r.count_only = 1;
    cairn_range_resp resp;
    ck_assert_int_eq(cairn_store_range(s, &resp, &r), 0);
    int64_t n = resp.count;
    cairn_range_resp_destroy(&resp);
    return n;
}

static const cairn_actor actor_a = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
static const cairn_actor actor_b = {{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}};

static char *dir, *dir2;
static evlog *la, *lb;
static cairn_store *st;

static void setup(void)
{
    atomic_store(&now_ms, 1700000000000ull);
    dir = make_tmpdir();
    dir2 = make_tmpdir();
    la = log_new(&actor_a);
    lb = log_new(&actor_b);
    st = open_lease_store(dir, la, &actor_a);
}

static void teardown(void)
{
    cairn_store_close(st);
    rm_rf(dir);
    rm_rf(dir2);
    free(dir);
    free(dir2);
    log_free(la);
    log_free(lb);
}

/* ---- grant ------------------------------------------------------------------ */

START_TEST(grant_rules)
{
    cairn_lease_grant_resp g;
    /* etcd: grant takes no revision; header = current revision (1) */
    ck_assert_int_eq(cairn_store_lease_create(st, &g, 100, 30), 0);
    ck_assert_int_eq(g.id, 100);
    ck_assert_int_eq(g.ttl, 30);
    ck_assert_int_eq(g.header.revision, 1);
    ck_assert_int_eq(cur_rev(st), 1);
    /* etcd: duplicate -> FAILED_PRECONDITION "etcdserver: lease already exists" */
    ck_assert_int_eq(cairn_store_lease_create(st, &g, 100, 30), CAIRN_ELEASEEXIST);
    /* etcd: `lease grant 1`, `0`, `-5` -> TTL 2 (the minimum, no error) */
    ck_assert_int_eq(cairn_store_lease_create(st, &g, 101, 1), 0);
    ck_assert_int_eq(g.ttl, 2);
    ck_assert_int_eq(cairn_store_lease_create(st, &g, 102, 0), 0);
    ck_assert_int_eq(g.ttl, 2);
    ck_assert_int_eq(cairn_store_lease_create(st, &g, 103, -5), 0);
    ck_assert_int_eq(g.ttl, 2);
    int64_t granted;
    ck_assert_int_eq(ttl_of(st, 103, &granted, NULL, 0), 2);
    ck_assert_int_eq(granted, 2);
    /* etcd: 9000000000 accepted; 9000000001 -> OUT_OF_RANGE "etcdserver: too
     * large lease TTL" */
    ck_assert_int_eq(cairn_store_lease_create(st, &g, 104, 9000000000LL), 0);
    ck_assert_int_eq(g.ttl, 9000000000LL);
    ck_assert_int_eq(cairn_store_lease_create(st, &g, 105, 9000000001LL), CAIRN_ELEASETTLTOOLARGE);
    /* etcd: negative explicit ids are accepted */
    ck_assert_int_eq(cairn_store_lease_create(st, &g, -7, 5), 0);
    ck_assert_int_eq(g.id, -7);
    /* etcd ids (member 0x5eb6366c87bbbf4f): 0x3f4fa228dd0a8005, ...8007 —
     * low 16 bits of the member id (top bit cleared), 40 bits of unix ms,
     * an 8-bit counter; consecutive grants count up (etcd by 2: its request
     * ids share the generator) */
    int64_t a = grant(st, 0, 10), b = grant(st, 0, 10);
    uint64_t mem = cairn_store_member_id(st);
    uint64_t want =
        ((mem & 0xffffu) << 48 | (1700000000000ull & ((1ull << 40) - 1)) << 8) & ((1ull << 63) - 1);
    ck_assert_uint_eq((uint64_t)a, want + 1);
    ck_assert_uint_eq((uint64_t)b, want + 2);
    ck_assert_int_gt(a, 0);
    /* an explicit id in the generator's way is skipped */
    ck_assert_int_eq(cairn_store_lease_create(st, &g, (int64_t)want + 3, 10), 0);
    ck_assert_int_eq(grant(st, 0, 10), (int64_t)want + 4);
    ck_assert_int_eq(cur_rev(st), 1);

    int64_t *ids;
    size_t n;
    ck_assert_int_eq(cairn_store_lease_list(st, &ids, &n), 0);
    ck_assert_uint_eq(n, 10);
    ck_assert_int_eq(ids[0], -7);
    ck_assert_int_eq(ids[1], 100);
    for (size_t i = 1; i < n; i++)
        ck_assert_int_lt(ids[i - 1], ids[i]);
    free(ids);
}
END_TEST

START_TEST(unknown_lease)
{
    /* etcd: timetolive 12345 -> {"id":74565,"ttl":-1,"granted-ttl":0} */
    int64_t granted = 99;
    ck_assert_int_eq(ttl_of(st, 12345, &granted, NULL, 0), -1);
    ck_assert_int_eq(granted, 0);
    /* etcd: keep-alive --once 12345 -> "etcdserver: requested lease not found" */
    int64_t t = 99;
    ck_assert_int_eq(cairn_store_lease_keepalive(st, &t, 12345), CAIRN_ELEASENOTFOUND);
    ck_assert_int_eq(t, 0);
    /* etcd: revoke 12345 -> NOT_FOUND "etcdserver: requested lease not found" */
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 12345), CAIRN_ELEASENOTFOUND);
    /* etcd: put k v --lease=12345 -> "etcdserver: requested lease not found" */
    ck_assert_int_eq(put_lease(st, "k", 12345), CAIRN_ELEASENOTFOUND);
    ck_assert_int_eq(cur_rev(st), 1);
    int64_t *ids;
    size_t n;
    ck_assert_int_eq(cairn_store_lease_list(st, &ids, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_null(ids);
}
END_TEST

/* ---- revoke ------------------------------------------------------------------- */

START_TEST(revoke_revisions)
{
    cairn_header h;
    /* etcd: revoke of a lease without keys: revision stays 1, header 1 */
    grant(st, 1, 30);
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 1), 0);
    ck_assert_int_eq(h.revision, 1);
    ck_assert_int_eq(cur_rev(st), 1);
    /* etcd: put c, a, b with the lease (revs 2..4); revoke -> header 5,
     * revision 5: all three deletes in one revision */
    grant(st, 2, 30);
    ck_assert_int_eq(put_lease(st, "c", 2), 2);
    ck_assert_int_eq(put_lease(st, "a", 2), 3);
    ck_assert_int_eq(put_lease(st, "b", 2), 4);
    put_kv(st, "other", "x"); /* 5: not attached */
    size_t before = log_count(la);
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 2), 0);
    ck_assert_int_eq(h.revision, 6);
    ck_assert_int_eq(cur_rev(st), 6);
    ck_assert_int_eq(nkeys_live(st), 1);
    /* one change, one revision, DELETE events in key order (etcd: a watch
     * sees one response a, b, c) */
    ck_assert_uint_eq(log_count(la), before + 1);
    ck_assert_int_eq(la->rev[before], 6);
    ck_assert_str_eq(la->keys[before], "D:a,D:b,D:c,");
    ck_assert_int_eq(ttl_of(st, 2, NULL, NULL, 0), -1);
    /* etcd: second revoke -> "requested lease not found"; a revoked id can
     * be granted again; a put with it before that fails */
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 2), CAIRN_ELEASENOTFOUND);
    ck_assert_int_eq(put_lease(st, "a", 2), CAIRN_ELEASENOTFOUND);
    grant(st, 2, 30);
    ck_assert_int_eq(put_lease(st, "a", 2), 7);
    char keys[256];
    ck_assert_int_eq(ttl_of(st, 2, NULL, keys, sizeof keys), 30);
    ck_assert_str_eq(keys, "a,");
    /* etcd: keys deleted before the revoke: the revoke takes no revision */
    del_range(st, "a", NULL, NULL);
    ck_assert_int_eq(cur_rev(st), 8);
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 2), 0);
    ck_assert_int_eq(h.revision, 8);
    ck_assert_int_eq(cur_rev(st), 8);
}
END_TEST

START_TEST(key_moves)
{
    /* etcd: a put with another lease moves the key; revoking the old lease
     * then deletes nothing and takes no revision. A plain put and a delete
     * detach; ignore_lease keeps it. */
    grant(st, 1, 30);
    grant(st, 2, 30);
    put_lease(st, "k", 1);
    put_lease(st, "j", 1);
    char keys[256];
    ttl_of(st, 1, NULL, keys, sizeof keys);
    ck_assert_str_eq(keys, "j,k,");
    ck_assert_int_eq(put_lease(st, "k", 2), 4);
    ttl_of(st, 1, NULL, keys, sizeof keys);
    ck_assert_str_eq(keys, "j,");
    ttl_of(st, 2, NULL, keys, sizeof keys);
    ck_assert_str_eq(keys, "k,");
    cairn_put_req r = {0};
    r.key = (const uint8_t *)"k";
    r.key_len = 1;
    r.value = (const uint8_t *)"w";
    r.value_len = 1;
    r.ignore_lease = 1;
    cairn_put_resp pr;
    ck_assert_int_eq(cairn_store_put(st, &pr, &r), 0);
    cairn_put_resp_destroy(&pr);
    ttl_of(st, 2, NULL, keys, sizeof keys);
    ck_assert_str_eq(keys, "k,");
    put_kv(st, "k", "plain"); /* rev 6: detaches k */
    ttl_of(st, 2, NULL, keys, sizeof keys);
    ck_assert_str_eq(keys, "");
    del_range(st, "j", NULL, NULL); /* rev 7: detaches j */
    ttl_of(st, 1, NULL, keys, sizeof keys);
    ck_assert_str_eq(keys, "");
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 1), 0);
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 2), 0);
    ck_assert_int_eq(h.revision, 7);
    ck_assert_int_eq(nkeys_live(st), 1); /* k = plain stays */
}
END_TEST

/* ---- keepalive and TimeToLive -------------------------------------------------- */

START_TEST(keepalive_ttl)
{
    uint64_t t0 = atomic_load(&now_ms);
    grant(st, 5, 10);
    /* etcd: 2.2 s after a 10 s grant: timetolive ttl 7 (truncated), granted 10;
     * keep-alive answers TTL 10 (the granted TTL); timetolive then 9 (10
     * minus the few ms that passed) */
    atomic_store(&now_ms, t0 + 2200);
    int64_t granted;
    ck_assert_int_eq(ttl_of(st, 5, &granted, NULL, 0), 7);
    ck_assert_int_eq(granted, 10);
    int64_t t;
    ck_assert_int_eq(cairn_store_lease_keepalive(st, &t, 5), 0);
    ck_assert_int_eq(t, 10);
    atomic_store(&now_ms, t0 + 2210);
    ck_assert_int_eq(ttl_of(st, 5, NULL, NULL, 0), 9);
    ck_assert_int_eq(cur_rev(st), 1); /* etcd: keepalives take no revision */
    /* the keepalive moved the deadline: nothing expires at the old one */
    size_t n;
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t0 + 10000), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t0 + 12199), 0);
    ck_assert_uint_eq(n, 0);
    /* past the deadline but before the tick: keepalive says not found
     * (etcd: renewing an expired lease fails) */
    atomic_store(&now_ms, t0 + 12200);
    ck_assert_int_eq(cairn_store_lease_keepalive(st, &t, 5), CAIRN_ELEASENOTFOUND);
    ck_assert_int_eq(ttl_of(st, 5, NULL, NULL, 0), 0);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t0 + 12200), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ttl_of(st, 5, NULL, NULL, 0), -1);
}
END_TEST

START_TEST(keepalive_coalesced)
{
    /* A 10 s lease renewed every 100 ms for 60 s: 600 keepalives. The rule
     * (write only when the stored deadline is > TTL/2 behind now + TTL)
     * bounds the changes by 1 + 2 * 60 / 10 = 13; the lease never expires
     * meanwhile, and expires TTL after the last keepalive. */
    uint64_t t0 = atomic_load(&now_ms);
    grant(st, 9, 10);
    size_t before = log_count(la);
    uint64_t t = t0;
    for (int i = 0; i < 600; i++) {
        t += 100;
        atomic_store(&now_ms, t);
        int64_t ttl;
        ck_assert_int_eq(cairn_store_lease_keepalive(st, &ttl, 9), 0);
        ck_assert_int_eq(ttl, 10);
        size_t n;
        ck_assert_int_eq(cairn_store_lease_expire(st, &n, t), 0);
        ck_assert_uint_eq(n, 0);
    }
    /* the committer reports every change; close flushes them all */
    cairn_store_close(st);
    size_t changes = log_count(la) - before;
    ck_assert_uint_le(changes, 13);
    /* and the deadline did move in the document: about every TTL/2 */
    ck_assert_uint_ge(changes, 10);
    st = open_lease_store(dir, la, &actor_a);
    /* etcd's clients renew every TTL/3: every second keepalive writes */
    before = log_count(la);
    for (int i = 0; i < 30; i++) {
        t += 3333;
        atomic_store(&now_ms, t);
        int64_t ttl;
        ck_assert_int_eq(cairn_store_lease_keepalive(st, &ttl, 9), 0);
    }
    cairn_store_close(st);
    changes = log_count(la) - before;
    ck_assert_uint_le(changes, 16);
    ck_assert_uint_ge(changes, 14);
    st = open_lease_store(dir, la, &actor_a);
    /* after a restart the rule below applies; renew once more, then stop */
    int64_t ttl;
    ck_assert_int_eq(cairn_store_lease_keepalive(st, &ttl, 9), 0);
    size_t n;
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t + 9999), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t + 10000), 0);
    ck_assert_uint_eq(n, 1);
}
END_TEST

/* ---- expiry -------------------------------------------------------------------- */

START_TEST(expiry)
{
    uint64_t t0 = atomic_load(&now_ms);
    /* etcd: a 2 s lease with keys z, x, y (revs 2..4) was gone 2.16 s after
     * its keys were written; the three deletes came in one revision (5 here,
     * 9 there), one watch response x, y, z; timetolive then -1 */
    grant(st, 3, 2);
    grant(st, 4, 2); /* no keys: expires without a revision */
    put_lease(st, "z", 3);
    put_lease(st, "x", 3);
    put_lease(st, "y", 3);
    ck_assert_int_eq(cur_rev(st), 4);
    size_t n, before = log_count(la);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t0 + 1999), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t0 + 2000), 0);
    ck_assert_uint_eq(n, 2);
    /* expiry returns once durable: a read sees it */
    ck_assert_int_eq(cur_rev(st), 5);
    ck_assert_int_eq(cairn_store_lease_grant(st, 77, 5), 0);
    ck_assert_int_eq(nkeys_live(st), 0);
    ck_assert_int_eq(ttl_of(st, 3, NULL, NULL, 0), -1);
    ck_assert_int_eq(ttl_of(st, 4, NULL, NULL, 0), -1);
    /* watch-visible: one change with the three deletes at revision 5, one
     * change without a revision, then the grant */
    ck_assert_uint_eq(log_count(la), before + 3);
    int found = 0;
    for (size_t i = before; i < before + 2; i++) {
        if (la->rev[i] == 5) {
            ck_assert_str_eq(la->keys[i], "D:x,D:y,D:z,");
            found++;
        } else {
            ck_assert_int_eq(la->rev[i], 0);
            ck_assert_uint_eq(la->nev[i], 0);
        }
    }
    ck_assert_int_eq(found, 1);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t0 + 4999), 0);
    ck_assert_uint_eq(n, 0); /* 77 (5 s) is not due yet */
}
END_TEST

START_TEST(expiry_thread)
{
    /* the store's own tick, with the injected clock */
    cairn_store_close(st);
    rm_rf(dir);
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.clock_ms = clock_fn;
    o.lease_tick_ms = 5;
    st = open_store_opts(dir, &o);
    uint64_t t0 = atomic_load(&now_ms);
    grant(st, 8, 3);
    put_lease(st, "k", 8);
    usleep(50 * 1000);
    ck_assert_int_eq(ttl_of(st, 8, NULL, NULL, 0), 3);
    atomic_store(&now_ms, t0 + 3000);
    int i;
    for (i = 0; i < 400 && ttl_of(st, 8, NULL, NULL, 0) != -1; i++)
        usleep(5 * 1000);
    ck_assert_int_lt(i, 400);
    for (i = 0; i < 400 && nkeys_live(st) != 0; i++)
        usleep(5 * 1000);
    ck_assert_int_eq(nkeys_live(st), 0);
    ck_assert_int_eq(cur_rev(st), 3);
}
END_TEST

/* ---- restart ---------------------------------------------------------------- */

/* Replay rebuilds the lease key sets: they must come out as the live path
 * left them (keys moved between leases, deleted, put without a lease). */
START_TEST(replay_rebuilds_key_sets)
{
    grant(st, 60, 100);
    grant(st, 61, 100);
    put_lease(st, "a", 60);
    put_lease(st, "b", 60);
    put_lease(st, "c", 61);
    put_lease(st, "d", 61);
    put_lease(st, "a", 61); /* moves */
    ck_assert_int_eq(del_range(st, "b", NULL, NULL), 1);
    put_lease(st, "d", 0); /* leaves its lease */
    char k60[64], k61[64];
    ttl_of(st, 60, NULL, k60, sizeof k60);
    ttl_of(st, 61, NULL, k61, sizeof k61);
    ck_assert_str_eq(k60, "");
    ck_assert_str_eq(k61, "a,c,");
    int64_t rev = cur_rev(st);
    cairn_store_close(st);
    st = open_lease_store(dir, la, &actor_a);
    ck_assert_int_eq(cur_rev(st), rev);
    char keys[64];
    ttl_of(st, 60, NULL, keys, sizeof keys);
    ck_assert_str_eq(keys, k60);
    ttl_of(st, 61, NULL, keys, sizeof keys);
    ck_assert_str_eq(keys, k61);
    /* the rebuilt set is the one a revoke deletes */
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 61), 0);
    ck_assert_int_eq(nkeys_live(st), 1); /* d */
    ck_assert_int_eq(h.revision, rev + 1);
}
END_TEST

START_TEST(restart_rule)
{
    uint64_t t0 = atomic_load(&now_ms);
    grant(st, 10, 10);
    grant(st, 11, 5);
    put_lease(st, "rk", 10);
    put_lease(st, "sk", 11);
    cairn_store_close(st);
    /* etcd: a 10 s lease with 5 s left, etcd stopped 3 s: 2 s after the
     * restart timetolive says 10 (granted 10, keys [rk]) — the lease
     * restarts at its full TTL plus one election timeout (lessor Promote:
     * expiry = now + 1 s + TTL). Lease 11's deadline passes while down:
     * still alive after the restart (WATCH-LEASE-MEASURED.md) */
    uint64_t t1 = t0 + 8000;
    atomic_store(&now_ms, t1);
    st = open_lease_store(dir, la, &actor_a);
    int64_t granted;
    char keys[64];
    ck_assert_int_eq(ttl_of(st, 10, &granted, keys, sizeof keys), 11);
    ck_assert_int_eq(granted, 10);
    ck_assert_str_eq(keys, "rk,");
    ck_assert_int_eq(ttl_of(st, 11, NULL, keys, sizeof keys), 6);
    ck_assert_str_eq(keys, "sk,");
    ck_assert_int_eq(nkeys_live(st), 2);
    size_t n;
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t1), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t1 + 5999), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t1 + 6000), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t1 + 11000), 0);
    ck_assert_uint_eq(n, 1);
    cairn_store_close(st);
    /* and the revokes survive the next restart */
    st = open_lease_store(dir, la, &actor_a);
    ck_assert_int_eq(ttl_of(st, 10, NULL, NULL, 0), -1);
    ck_assert_int_eq(ttl_of(st, 11, NULL, NULL, 0), -1);
    ck_assert_int_eq(nkeys_live(st), 0);
    ck_assert_int_eq(cur_rev(st), 5);
}
END_TEST

/* ---- two nodes ---------------------------------------------------------------- */

START_TEST(remote_keepalive_and_expiry)
{
    cairn_store *b = open_lease_store(dir2, lb, &actor_b);
    size_t ca = 0, cb = 0;
    uint64_t t0 = atomic_load(&now_ms);
    grant(st, 20, 10);
    put_lease(st, "k", 20);
    ship(st, la, &ca, b);
    ck_assert_int_eq(ttl_of(b, 20, NULL, NULL, 0), 10);
    /* a keepalive on B (6 s later: > TTL/2 behind, so written) extends the
     * lease on A */
    atomic_store(&now_ms, t0 + 6000);
    int64_t t;
    ck_assert_int_eq(cairn_store_lease_keepalive(b, &t, 20), 0);
    ship(b, lb, &cb, st);
    ck_assert_int_eq(ttl_of(st, 20, NULL, NULL, 0), 10);
    size_t n;
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, t0 + 10000), 0);
    ck_assert_uint_eq(n, 0);
    /* B expires it; A learns it from B's change: same revision count */
    ck_assert_int_eq(cairn_store_lease_expire(b, &n, t0 + 16000), 0);
    ck_assert_uint_eq(n, 1);
    ship(b, lb, &cb, st);
    ck_assert_int_eq(ttl_of(st, 20, NULL, NULL, 0), -1);
    ck_assert_int_eq(nkeys_live(st), 0);
    ck_assert_int_eq(cur_rev(st), 3);
    ck_assert_int_eq(cur_rev(b), 3);
    cairn_store_close(b);
}
END_TEST

START_TEST(concurrent_revokes_converge)
{
    cairn_store *b = open_lease_store(dir2, lb, &actor_b);
    size_t ca = 0, cb = 0;
    uint64_t t0 = atomic_load(&now_ms);
    grant(st, 30, 10);
    grant(st, 31, 10);
    put_lease(st, "a1", 30);
    put_lease(st, "a2", 30);
    put_lease(st, "b1", 31);
    ship(st, la, &ca, b);
    ck_assert_int_eq(cur_rev(b), 4);
    /* lease 30: A revokes by hand while B expires it (concurrently) */
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 30), 0);
    ck_assert_int_eq(h.revision, 5);
    size_t n;
    ck_assert_int_eq(cairn_store_lease_expire(b, &n, t0 + 10000), 0);
    ck_assert_uint_eq(n, 2); /* B expires 31 too */
    /* lease 31 on A: a keepalive concurrent with B's expiry (A's clock is
     * behind) — the revoke deletes the whole lease map, so it wins */
    atomic_store(&now_ms, t0 + 6000);
    int64_t t;
    ck_assert_int_eq(cairn_store_lease_keepalive(st, &t, 31), 0);
    size_t a_rev = (size_t)cur_rev(st), b_rev = (size_t)cur_rev(b);
    ship(b, lb, &cb, st);
    ship(st, la, &ca, b);
    /* the merged revoke of 30 changes nothing visible: no revision; B's
     * revoke of 31 deletes b1 on A (one revision) */
    ck_assert_int_eq(cur_rev(st), (int64_t)a_rev + 1);
    ck_assert_int_eq(cur_rev(b), (int64_t)b_rev);
    for (int i = 0; i < 2; i++) {
        cairn_store *s = i ? b : st;
        ck_assert_int_eq(ttl_of(s, 30, NULL, NULL, 0), -1);
        ck_assert_int_eq(ttl_of(s, 31, NULL, NULL, 0), -1);
        ck_assert_int_eq(nkeys_live(s), 0);
        int64_t *ids;
        size_t nl;
        ck_assert_int_eq(cairn_store_lease_list(s, &ids, &nl), 0);
        ck_assert_uint_eq(nl, 0);
        ck_assert_int_eq(cairn_store_lease_expire(s, &n, t0 + 100000), 0);
        ck_assert_uint_eq(n, 0);
    }
    cairn_store_close(b);
}
END_TEST

START_TEST(put_concurrent_with_revoke)
{
    /* B attaches a key to lease 40 while A revokes it: after the merge the
     * key's lease is gone on both; the next tick on either deletes it and
     * both converge (a second delete of it merges harmlessly) */
    cairn_store *b = open_lease_store(dir2, lb, &actor_b);
    size_t ca = 0, cb = 0;
    grant(st, 40, 30);
    ship(st, la, &ca, b);
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 40), 0);
    ck_assert_int_eq(put_lease(b, "late", 40), 2);
    ship(b, lb, &cb, st);
    ship(st, la, &ca, b);
    ck_assert_int_eq(nkeys_live(st), 1);
    ck_assert_int_eq(ttl_of(st, 40, NULL, NULL, 0), -1);
    uint64_t now = atomic_load(&now_ms);
    size_t n;
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, now), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(cairn_store_lease_expire(b, &n, now), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(nkeys_live(st), 0);
    ck_assert_int_eq(nkeys_live(b), 0);
    ship(b, lb, &cb, st);
    ship(st, la, &ca, b);
    ck_assert_int_eq(cur_rev(st), 3);
    ck_assert_int_eq(cur_rev(b), 3);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, now), 0);
    ck_assert_uint_eq(n, 0);
    cairn_store_close(b);
}
END_TEST

START_TEST(many_keys_one_revision)
{
    /* a lease holding 2000 keys: one revoke, one revision, key set cleared */
    grant(st, 50, 30);
    char k[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(k, sizeof k, "key%05d", i);
        put_lease(st, k, 50);
    }
    for (int i = 0; i < 2000; i += 2) { /* half move to no lease */
        snprintf(k, sizeof k, "key%05d", i);
        put_kv(st, k, "free");
    }
    cairn_lease_ttl_resp r;
    ck_assert_int_eq(cairn_store_lease_ttl(st, &r, 50, 1), 0);
    ck_assert_uint_eq(r.nkeys, 1000);
    ck_assert_int_eq(r.keys[0].key_len, 8);
    ck_assert_int_eq(memcmp(r.keys[0].key, "key00001", 8), 0);
    ck_assert_int_eq(memcmp(r.keys[999].key, "key01999", 8), 0);
    cairn_lease_ttl_resp_destroy(&r);
    int64_t rev = cur_rev(st);
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 50), 0);
    ck_assert_int_eq(h.revision, rev + 1);
    ck_assert_int_eq(nkeys_live(st), 1000);
}
END_TEST

/* ---- a peer's lease records ---------------------------------------------------- */

START_TEST(peer_lease_records)
{
    /* A peer writes: leases[61] = INT 7 (the scalar form of older data
     * dirs), leases["short"] (not a lease id), and leases[62] = a map whose
     * ttl and deadline are out of range. Every node reads them the same
     * way: 61 is a 7 s lease with deadline 0, "short" is ignored, 62 has the
     * maximum TTL and deadline 0. */
    cairn_actor ga;
    cairn_change *g = genesis("etcd-cluster", &ga);
    cairn_actor actors[2];
    memset(actors[0].b, 0x99, CAIRN_ACTOR_LEN);
    actors[1] = ga;
    uint8_t k61[8] = {0, 0, 0, 0, 0, 0, 0, 61}, k62[8] = {0, 0, 0, 0, 0, 0, 0, 62};
    cairn_opid leases = {2, 1}; /* op 2 of the genesis */
    cairn_opid map62 = {1003, 0};
    cairn_op ops[5];
    memset(ops, 0, sizeof ops);
    ops[0].action = CAIRN_OP_SET;
    ops[0].obj = leases;
    ops[0].key = k61;
    ops[0].key_len = 8;
    ops[0].value.type = CAIRN_V_INT;
    ops[0].value.v.i = 7;
    ops[1] = ops[0];
    ops[1].key = (const uint8_t *)"short";
    ops[1].key_len = 5;
    ops[2].action = CAIRN_OP_MAKE_MAP;
    ops[2].obj = leases;
    ops[2].key = k62;
    ops[2].key_len = 8;
    ops[3].action = CAIRN_OP_SET;
    ops[3].obj = map62;
    ops[3].key = (const uint8_t *)"ttl";
    ops[3].key_len = 3;
    ops[3].value.type = CAIRN_V_INT;
    ops[3].value.v.i = INT64_MAX;
    ops[4] = ops[3];
    ops[4].key = (const uint8_t *)"deadline";
    ops[4].key_len = 8;
    ops[4].value.v.i = INT64_MIN;
    cairn_change t;
    memset(&t, 0, sizeof t);
    t.actor = actors[0];
    t.seq = 1;
    t.start_op = 1001;
    t.ndeps = 1;
    t.deps = &g->hash;
    t.nactors = 2;
    t.actors = actors;
    t.nops = 5;
    t.ops = ops;
    cairn_change *c;
    ck_assert_int_eq(cairn_change_new(&c, &t), 0);
    ck_assert_int_eq(cairn_store_receive(st, c->bytes, c->len), 0);
    cairn_change_free(c);
    cairn_change_free(g);
    ck_assert_int_eq(cur_rev(st), 1);
    int64_t *ids;
    size_t n;
    ck_assert_int_eq(cairn_store_lease_list(st, &ids, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(ids[0], 61);
    ck_assert_int_eq(ids[1], 62);
    free(ids);
    int64_t granted, ttl;
    /* deadline 0: due at once (keepalive refuses it) */
    ck_assert_int_eq(ttl_of(st, 61, &granted, NULL, 0), 0);
    ck_assert_int_eq(granted, 7);
    ck_assert_int_eq(ttl_of(st, 62, &granted, NULL, 0), 0);
    ck_assert_int_eq(granted, CAIRN_LEASE_MAX_TTL);
    ck_assert_int_eq(cairn_store_lease_keepalive(st, &ttl, 61), CAIRN_ELEASENOTFOUND);
    /* a restart gives both their full TTL + 1 s (the restart rule) */
    cairn_store_close(st);
    st = open_lease_store(dir, la, &actor_a);
    uint64_t now = atomic_load(&now_ms);
    ck_assert_int_eq(ttl_of(st, 61, NULL, NULL, 0), 8);
    ck_assert_int_eq(ttl_of(st, 62, NULL, NULL, 0), CAIRN_LEASE_MAX_TTL + 1);
    /* a keepalive turns the scalar into a lease map */
    ck_assert_int_eq(cairn_store_lease_keepalive(st, &ttl, 61), 0);
    ck_assert_int_eq(ttl, 7);
    ck_assert_int_eq(ttl_of(st, 61, NULL, NULL, 0), 7);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, now + 6999), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(cairn_store_lease_expire(st, &n, now + 7000), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ttl_of(st, 61, NULL, NULL, 0), -1);
    ck_assert_int_eq(ttl_of(st, 62, NULL, NULL, 0), CAIRN_LEASE_MAX_TTL + 1); /* untouched */
}
END_TEST

/* ---- keepalives from many threads --------------------------------------------- */

typedef struct ka_arg {
    cairn_store *s;
    int64_t id;
    int errors;
} ka_arg;

static void *ka_thread(void *p)
{
    ka_arg *a = p;
    for (int i = 0; i < 2000; i++) {
        atomic_fetch_add(&now_ms, 1);
        int64_t ttl;
        if (cairn_store_lease_keepalive(a->s, &ttl, a->id) || ttl != 10)
            a->errors++;
        /* alive (the other threads may have moved the clock meanwhile) */
        if (ttl_of(a->s, a->id, NULL, NULL, 0) < 0)
            a->errors++;
    }
    return NULL;
}

START_TEST(concurrent_keepalives)
{
    /* 4 threads renew two 10 s leases 8000 times while the clock moves
     * 8 s and the expiry tick runs: nothing expires, and the coalescing
     * bound holds across threads (1 + 2 * 8 / 10 -> at most 2 writes per
     * lease; the write side re-decides, so racing keepalives write once),
     * and each lease is written at least once by the time the clock is
     * past half its TTL */
    grant(st, 1, 10);
    grant(st, 2, 10);
    size_t before = log_count(la);
    pthread_t th[4];
    ka_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (ka_arg){st, 1 + i % 2, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, ka_thread, &args[i]), 0);
    }
    size_t revoked = 0;
    for (int i = 0; i < 200; i++) {
        size_t n;
        ck_assert_int_eq(cairn_store_lease_expire(st, &n, atomic_load(&now_ms)), 0);
        revoked += n;
        usleep(100);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(args[i].errors, 0);
    }
    ck_assert_uint_eq(revoked, 0);
    /* The clock is now 8 s on. A lease whose threads all ran before it
     * passed 5 s (a scheduling accident on a loaded machine) has not been
     * written yet and must be now; one already written must not be again. */
    for (int64_t id = 1; id <= 2; id++) {
        int64_t ttl;
        ck_assert_int_eq(cairn_store_lease_keepalive(st, &ttl, id), 0);
        ck_assert_int_eq(ttl, 10);
    }
    cairn_store_close(st);
    ck_assert_uint_le(log_count(la) - before, 4);
    ck_assert_uint_ge(log_count(la) - before, 2);
    st = open_lease_store(dir, la, &actor_a);
}
END_TEST

/* ---- async grant, revoke, compact ---------------------------------------- */

/* A completion the test waits for: its rc, whether it ran on the calling
 * thread, and whether the store had written its group by then. */
typedef struct done_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, rc, same_thread;
    pthread_t caller;
    cairn_store *s;
    uint64_t syncs;
} done_wait;

static void done_init(done_wait *w, cairn_store *s)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->caller = pthread_self();
    w->s = s;
}

static void on_done(void *arg, int rc)
{
    done_wait *w = arg;
    cairn_store_stats st_;
    cairn_store_get_stats(w->s, &st_);
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->same_thread = pthread_equal(pthread_self(), w->caller);
    w->syncs = st_.syncs;
    w->done++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static int done_wait_for(done_wait *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    ck_assert_int_eq(w->done, 1);
    ck_assert(!w->same_thread);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    return w->rc;
}

static uint64_t syncs_of(cairn_store *s)
{
    cairn_store_stats x;
    cairn_store_get_stats(s, &x);
    return x.syncs;
}

START_TEST(async_grant_revoke_compact)
{
    done_wait w;
    cairn_lease_grant_resp g;
    /* grant: answered now, completed by the committer once written */
    done_init(&w, st);
    uint64_t s0 = syncs_of(st);
    ck_assert_int_eq(cairn_store_lease_create_async(st, &g, 0, 1, on_done, &w), 0);
    ck_assert_int_ne(g.id, 0);
    ck_assert_int_eq(g.ttl, 2); /* raised to the minimum, as the blocking call */
    ck_assert_int_eq(g.header.revision, 1);
    ck_assert_int_eq(done_wait_for(&w), 0);
    ck_assert_uint_gt(w.syncs, s0); /* durable before it completed */
    int64_t id = g.id;
    /* refusals are immediate, the completion never runs */
    done_init(&w, st);
    ck_assert_int_eq(cairn_store_lease_create_async(st, &g, id, 30, on_done, &w),
                     CAIRN_ELEASEEXIST);
    ck_assert_int_eq(
        cairn_store_lease_create_async(st, &g, 5, CAIRN_LEASE_MAX_TTL + 1, on_done, &w),
        CAIRN_ELEASETTLTOOLARGE);
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke_async(st, &h, 424242, on_done, &w),
                     CAIRN_ELEASENOTFOUND);
    ck_assert_int_eq(cairn_store_compact_async(st, &h, 99, 0, on_done, &w), CAIRN_EFUTUREREV);
    ck_assert_int_eq(w.done, 0);
    /* revoke: one revision for its keys, in the header at once */
    ck_assert_int_eq(put_lease(st, "k1", id), 2);
    ck_assert_int_eq(put_lease(st, "k2", id), 3);
    done_init(&w, st);
    ck_assert_int_eq(cairn_store_lease_revoke_async(st, &h, id, on_done, &w), 0);
    ck_assert_int_eq(h.revision, 4);
    ck_assert_int_eq(done_wait_for(&w), 0);
    ck_assert_int_eq(nkeys_live(st), 0);
    ck_assert_int_eq(ttl_of(st, id, NULL, NULL, 0), -1);
    /* compact, logical and physical */
    put_kv(st, "x", "1"); /* 5 */
    put_kv(st, "x", "2"); /* 6 */
    done_init(&w, st);
    ck_assert_int_eq(cairn_store_compact_async(st, &h, 5, 0, on_done, &w), 0);
    ck_assert_int_eq(h.revision, 6);
    ck_assert_int_eq(done_wait_for(&w), 0);
    ck_assert_int_eq(cairn_store_compacted_rev(st), 5);
    done_init(&w, st);
    ck_assert_int_eq(cairn_store_compact_async(st, &h, 5, 0, on_done, &w), CAIRN_ECOMPACTED);
    ck_assert_int_eq(cairn_store_compact_async(st, &h, 6, 1, on_done, &w), 0);
    ck_assert_int_eq(done_wait_for(&w), 0);
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"x";
    q.key_len = 1;
    q.revision = 5;
    cairn_range_resp r;
    ck_assert_int_eq(cairn_store_range(st, &r, &q), CAIRN_ECOMPACTED);
    /* all of it durable */
    cairn_store_close(st);
    st = open_lease_store(dir, la, &actor_a);
    ck_assert_int_eq(cairn_store_compacted_rev(st), 6);
    ck_assert_int_eq(cur_rev(st), 6);
    ck_assert_int_eq(ttl_of(st, id, NULL, NULL, 0), -1);
    /* a physical compaction still running when the store closes is waited
     * for: its completion runs before close returns */
    put_kv(st, "x", "3");
    done_init(&w, st);
    ck_assert_int_eq(cairn_store_compact_async(st, &h, 7, 1, on_done, &w), 0);
    cairn_store_close(st);
    ck_assert_int_eq(w.done, 1);
    ck_assert_int_eq(w.rc, 0);
    st = open_lease_store(dir, la, &actor_a);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_lease");
    TCase *tc = tcase_create("lease");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, grant_rules);
    tcase_add_test(tc, unknown_lease);
    tcase_add_test(tc, revoke_revisions);
    tcase_add_test(tc, key_moves);
    tcase_add_test(tc, keepalive_ttl);
    tcase_add_test(tc, keepalive_coalesced);
    tcase_add_test(tc, expiry);
    tcase_add_test(tc, expiry_thread);
    tcase_add_test(tc, restart_rule);
    tcase_add_test(tc, replay_rebuilds_key_sets);
    tcase_add_test(tc, remote_keepalive_and_expiry);
    tcase_add_test(tc, concurrent_revokes_converge);
    tcase_add_test(tc, put_concurrent_with_revoke);
    tcase_add_test(tc, many_keys_one_revision);
    tcase_add_test(tc, peer_lease_records);
    tcase_add_test(tc, concurrent_keepalives);
    tcase_add_test(tc, async_grant_revoke_compact);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
