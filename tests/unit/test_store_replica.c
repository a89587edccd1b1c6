/*
 * store/replica: per-peer sessions between stores in temp dirs, messages
 * carried in memory.
 * - two stores that wrote apart converge to equal heads and key space;
 * - a burst of 1000 changes crosses in few messages and few group commits;
 * - three stores in a line (a - b - c) converge transitively;
 * - a message with one corrupt change applies nothing (not even its good
 *   changes) and says why;
 * - an optimistic push carries a fresh change and is answered;
 * - a local put made while a big burst is applied completes between its
 *   slices, not after the whole burst, and no group commit holds more than
 *   about one slice (the catch-up's bound on local latency);
 * - a received change whose dependency does not come within 30 s leaves
 *   the pending buffer (by the store's clock), and is taken when sent again.
 */

#include <pthread.h>

#include "../store/replica_test.h"
#include "../store/store_test.h"

/* Runs the two sessions of a link (ab: a's session for b; ba: b's for a)
 * until neither has anything to say; returns the messages exchanged. */
static int sync_link(cairn_replica *ab, cairn_replica *ba)
{
    int msgs = 0;
    for (int round = 0; round < 50; round++) {
        int quiet = 1;
        cairn_replica *from[2] = {ab, ba}, *to[2] = {ba, ab};
        for (int i = 0; i < 2; i++) {
            uint8_t *m;
            size_t len;
            ck_assert_int_eq(cairn_replica_generate(from[i], &m, &len), 0);
            if (m) {
                replica_deliver(to[i], m, len);
                free(m);
                quiet = 0;
                msgs++;
            }
        }
        if (quiet)
            return msgs;
    }
    ck_abort_msg("the link did not go quiet in 50 rounds");
    return msgs;
}

static void ck_same_heads(cairn_store *a, cairn_store *b)
{
    cairn_hash *ha, *hb;
    size_t na, nb;
    ck_assert_int_eq(cairn_store_heads(a, &ha, &na), 0);
    ck_assert_int_eq(cairn_store_heads(b, &hb, &nb), 0);
    ck_assert_uint_eq(na, nb);
    ck_assert(na > 0);
    ck_assert(memcmp(ha, hb, na * sizeof *ha) == 0);
    free(ha);
    free(hb);
}

/* Every key and value of |s|, "k=v;" in key order. */
static char *dump(cairn_store *s)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"\0";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"\0";
    q.range_end_len = 1;
    cairn_range_resp r;
    ck_assert_int_eq(cairn_store_range(s, &r, &q), 0);
    size_t cap = 16;
    for (size_t i = 0; i < r.nkvs; i++)
        cap += r.kvs[i].key_len + r.kvs[i].value_len + 2;
    char *out = calloc(1, cap), *p = out;
    for (size_t i = 0; i < r.nkvs; i++) {
        memcpy(p, r.kvs[i].key, r.kvs[i].key_len);
        p += r.kvs[i].key_len;
        *p++ = '=';
        memcpy(p, r.kvs[i].value, r.kvs[i].value_len);
        p += r.kvs[i].value_len;
        *p++ = ';';
    }
    cairn_range_resp_destroy(&r);
    return out;
}

static void ck_same_keys(cairn_store *a, cairn_store *b)
{
    char *da = dump(a), *db = dump(b);
    ck_assert_str_eq(da, db);
    free(da);
    free(db);
}

/* cairn_replica_push of captured changes [0, n). */
static void push_captured(cairn_replica *r, uint8_t **m, size_t *len, const captured *cap, int n)
{
    cairn_change *chs[CAPTURED_MAX];
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(cairn_change_decode(&chs[i], cap->bytes[i], cap->len[i], NULL), 0);
    ck_assert_int_eq(cairn_replica_push(r, m, len, (const cairn_change *const *)chs, (size_t)n), 0);
    for (int i = 0; i < n; i++)
        cairn_change_free(chs[i]);
}

static cairn_replica *session(cairn_store *s)
{
    cairn_replica *r;
    ck_assert_int_eq(cairn_replica_new(&r, s, NULL), 0);
    return r;
}

START_TEST(two_stores_converge)
{
    char *da = make_tmpdir(), *db = make_tmpdir();
    cairn_store *a = open_store_actor(da, 1, NULL), *b = open_store_actor(db, 2, NULL);
    cairn_replica *ab = session(a), *ba = session(b);
    put_kv(a, "a1", "x");
    put_kv(a, "same", "from-a");
    put_kv(b, "b1", "y");
    put_kv(b, "same", "from-b");
    ck_assert_int_gt(sync_link(ab, ba), 0);
    ck_same_heads(a, b);
    ck_same_keys(a, b);
    /* a quiet link stays quiet */
    ck_assert_int_eq(sync_link(ab, ba), 0);
    /* a later write crosses again */
    put_kv(b, "b2", "z");
    ck_assert_int_gt(sync_link(ab, ba), 0);
    ck_same_heads(a, b);
    ck_same_keys(a, b);
    cairn_replica_free(ab);
    cairn_replica_free(ba);
    close_and_remove(a, da);
    close_and_remove(b, db);
}
END_TEST

/* cairn_store_change_bytes: every change counted once, with its encoded
 * size; two stores with equal heads hold the same count and bytes. */
START_TEST(change_bytes_counts_every_change)
{
    char *da = make_tmpdir(), *db = make_tmpdir();
    cairn_store *a = open_store_actor(da, 1, NULL), *b = open_store_actor(db, 2, NULL);
    cairn_replica *ab = session(a), *ba = session(b);
    uint64_t n0, b0, n1, b1, n2, b2;
    ck_assert_int_eq(cairn_store_change_bytes(a, &n0, &b0), 0);
    ck_assert_uint_gt(n0, 0); /* the genesis change */
    put_kv(a, "a1", "x");
    ck_assert_int_eq(cairn_store_change_bytes(a, &n1, &b1), 0);
    ck_assert_uint_eq(n1, n0 + 1);
    ck_assert_uint_gt(b1, b0 + 4); /* at least the key and value */
    put_kv(b, "b1", "a-longer-value");
    ck_assert_int_gt(sync_link(ab, ba), 0);
    ck_same_heads(a, b);
    ck_assert_int_eq(cairn_store_change_bytes(a, &n1, &b1), 0);
    ck_assert_int_eq(cairn_store_change_bytes(b, &n2, &b2), 0);
    ck_assert_uint_eq(n1, n2);
    ck_assert_uint_eq(b1, b2);
    cairn_replica_free(ab);
    cairn_replica_free(ba);
    close_and_remove(a, da);
    close_and_remove(b, db);
}
END_TEST

START_TEST(burst_of_1000)
{
    char *da = make_tmpdir(), *db = make_tmpdir();
    cairn_store *a = open_store_actor(da, 1, NULL), *b = open_store_actor(db, 2, NULL);
    cairn_replica *ab = session(a), *ba = session(b);
    for (int i = 0; i < 1000; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%04d", i);
        put_kv(a, k, "v");
    }
    cairn_store_stats before, after;
    cairn_store_get_stats(b, &before);
    int msgs = sync_link(ab, ba);
    cairn_store_get_stats(b, &after);
    ck_assert_int_le(msgs, 8);
    /* a few group commits per message (its slices of at least 16 changes),
     * not one per change */
    ck_assert_uint_le(after.syncs - before.syncs, (uint64_t)msgs + 1000 / 16);
    ck_assert_uint_ge(after.changes - before.changes, 1000);
    ck_same_heads(a, b);
    ck_same_keys(a, b);
    ck_assert_int_eq(cur_rev(b), 1001);
    cairn_replica_free(ab);
    cairn_replica_free(ba);
    close_and_remove(a, da);
    close_and_remove(b, db);
}
END_TEST

START_TEST(three_in_a_line)
{
    char *d[3];
    cairn_store *s[3];
    for (int i = 0; i < 3; i++) {
        d[i] = make_tmpdir();
        s[i] = open_store_actor(d[i], (uint8_t)(i + 1), NULL);
    }
    /* links a-b and b-c only */
    cairn_replica *ab = session(s[0]), *ba = session(s[1]);
    cairn_replica *bc = session(s[1]), *cb = session(s[2]);
    put_kv(s[0], "from-a", "1");
    put_kv(s[2], "from-c", "3");
    put_kv(s[1], "k", "b");
    put_kv(s[2], "k", "c");
    for (int i = 0; i < 3; i++) {
        sync_link(ab, ba);
        sync_link(bc, cb);
    }
    ck_same_heads(s[0], s[1]);
    ck_same_heads(s[1], s[2]);
    ck_same_keys(s[0], s[2]);
    cairn_replica_free(ab);
    cairn_replica_free(ba);
    cairn_replica_free(bc);
    cairn_replica_free(cb);
    for (int i = 0; i < 3; i++)
        close_and_remove(s[i], d[i]);
}
END_TEST

START_TEST(corrupt_change_applies_nothing)
{
    char *da = make_tmpdir(), *db = make_tmpdir();
    captured ca = {0};
    cairn_store *a = open_store_actor(da, 1, &ca), *b = open_store_actor(db, 2, NULL);
    cairn_replica *ab = session(a), *ba = session(b);
    put_kv(a, "good", "1");
    put_kv(a, "bad", "2");
    ck_assert_int_eq(ca.n, 2);
    uint8_t *m;
    size_t len;
    push_captured(ab, &m, &len, &ca, 2);
    ck_assert_ptr_nonnull(m);

    /* the same message with a byte appended to its second change's
     * encoding: that change no longer decodes (not canonical) */
    cairn_sync_msg msg;
    ck_assert_int_eq(cairn_sync_msg_decode(&msg, m, len, NULL), 0);
    ck_assert_uint_eq(msg.nchanges, 2);
    cairn_change *c = msg.changes[1];
    uint8_t *grown = malloc(c->len + 1);
    memcpy(grown, c->bytes, c->len);
    grown[c->len] = 0x00;
    uint8_t *orig = c->bytes;
    size_t orig_len = c->len;
    c->bytes = grown;
    c->len++;
    uint8_t *bad;
    size_t bad_len;
    ck_assert_int_eq(cairn_sync_msg_encode(&bad, &bad_len, &msg), 0);
    c->bytes = orig;
    c->len = orig_len;
    free(grown);
    cairn_sync_msg_destroy(&msg);

    int64_t rev = cur_rev(b);
    int called = 0;
    int rc = cairn_replica_receive(ba, bad, bad_len, NULL, on_done, &called);
    ck_assert_msg(rc < 0, "a corrupt change was accepted");
    ck_assert_int_eq(called, 0);
    ck_assert_int_eq(cur_rev(b), rev); /* not even the good change */
    free(bad);

    /* the intact message still goes through after a reset */
    cairn_replica_reset(ab);
    cairn_replica_reset(ba);
    replica_deliver(ba, m, len);
    free(m);
    sync_link(ab, ba);
    ck_same_heads(a, b);
    ck_same_keys(a, b);
    captured_free(&ca);
    cairn_replica_free(ab);
    cairn_replica_free(ba);
    close_and_remove(a, da);
    close_and_remove(b, db);
}
END_TEST

START_TEST(push_then_quiet)
{
    char *da = make_tmpdir(), *db = make_tmpdir();
    captured ca = {0};
    cairn_store *a = open_store_actor(da, 1, &ca), *b = open_store_actor(db, 2, NULL);
    cairn_replica *ab = session(a), *ba = session(b);
    sync_link(ab, ba);
    put_kv(a, "pushed", "v");
    ck_assert_int_eq(ca.n, 1);
    uint8_t *m;
    size_t len;
    push_captured(ab, &m, &len, &ca, 1);
    ck_assert_ptr_nonnull(m);
    replica_deliver(ba, m, len);
    free(m);
    ck_same_keys(a, b);
    /* pushed again: already sent, nothing to say */
    push_captured(ab, &m, &len, &ca, 1);
    ck_assert_ptr_null(m);
    sync_link(ab, ba);
    ck_same_heads(a, b);
    captured_free(&ca);
    cairn_replica_free(ab);
    cairn_replica_free(ba);
    close_and_remove(a, da);
    close_and_remove(b, db);
}
END_TEST

/* ---- a local write between the slices of a big burst ---- */

#define BIG_BURST 4000

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int burst;              /* the burst is on: slow groups down, start the put */
    int put_go;             /* the local put may start */
    size_t max_group;       /* the largest group written during the burst */
    uint64_t remote_at_put; /* remote changes durable once the put returned */
    cairn_store *b;
} big;

static int slow_groups(void *arg, size_t nchanges)
{
    (void)arg;
    pthread_mutex_lock(&big.mu);
    int on = big.burst;
    if (on) {
        if (nchanges > big.max_group)
            big.max_group = nchanges;
        big.put_go = 1;
        pthread_cond_broadcast(&big.cv);
    }
    pthread_mutex_unlock(&big.mu);
    if (on) /* a slow disk: without the wait between slices, they pile up */
        nanosleep(&(struct timespec){0, 3000000}, NULL);
    return 0;
}

static void *local_put(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&big.mu);
    while (!big.put_go)
        pthread_cond_wait(&big.cv, &big.mu);
    pthread_mutex_unlock(&big.mu);
    put_kv(big.b, "local", "during");
    cairn_store_stats st;
    cairn_store_get_stats(big.b, &st);
    big.remote_at_put = st.applied_remote;
    return NULL;
}

typedef struct count_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int left, rc;
} count_wait;

static void count_done(void *arg, int rc)
{
    count_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    if (rc)
        w->rc = rc;
    if (--w->left == 0)
        pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

START_TEST(local_put_between_slices)
{
    pthread_mutex_init(&big.mu, NULL);
    pthread_cond_init(&big.cv, NULL);
    char *da = make_tmpdir(), *db = make_tmpdir();
    cairn_store *a = open_store_actor(da, 1, NULL);
    static cairn_actor actor_b;
    memset(actor_b.b, 2, CAIRN_ACTOR_LEN);
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.actor = &actor_b;
    o.before_write_cb = slow_groups;
    cairn_store *b = open_store_opts(db, &o);
    big.b = b;
    cairn_replica *ab = session(a), *ba = session(b);
    put_kv(b, "hello", "b");
    sync_link(ab, ba);
    /* BIG_BURST changes on a, group-committed (async) to be quick */
    static cairn_put_resp resp[BIG_BURST];
    static char keys[BIG_BURST][16];
    count_wait cw = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, BIG_BURST, 0};
    for (int i = 0; i < BIG_BURST; i++) {
        snprintf(keys[i], sizeof keys[i], "k%05d", i);
        cairn_put_req r = {0};
        r.key = (const uint8_t *)keys[i];
        r.key_len = strlen(keys[i]);
        r.value = (const uint8_t *)"v";
        r.value_len = 1;
        ck_assert_int_eq(cairn_store_put_async(a, &resp[i], &r, count_done, &cw), 0);
    }
    pthread_mutex_lock(&cw.mu);
    while (cw.left)
        pthread_cond_wait(&cw.cv, &cw.mu);
    pthread_mutex_unlock(&cw.mu);
    ck_assert_int_eq(cw.rc, 0);
    for (int i = 0; i < BIG_BURST; i++)
        cairn_put_resp_destroy(&resp[i]);

    cairn_store_stats before;
    cairn_store_get_stats(b, &before);
    pthread_t th;
    pthread_mutex_lock(&big.mu);
    big.burst = 1;
    pthread_mutex_unlock(&big.mu);
    ck_assert_int_eq(pthread_create(&th, NULL, local_put, NULL), 0);
    sync_link(ab, ba);
    pthread_join(th, NULL);
    pthread_mutex_lock(&big.mu);
    big.burst = 0;
    pthread_mutex_unlock(&big.mu);

    uint64_t got = big.remote_at_put - before.applied_remote;
    /* the put went in between slices: it was durable (and answered) while
     * most of the burst was still to be written */
    ck_assert_msg(got < BIG_BURST / 2,
                  "the local put completed after %llu of the burst's %d changes",
                  (unsigned long long)got, BIG_BURST);
    /* one slice (at most 1024 changes) and the local put per group, not
     * slices piled up behind a slow write */
    ck_assert_msg(big.max_group <= 1024 + 1, "a group of %zu changes", big.max_group);
    sync_link(ab, ba);
    ck_same_heads(a, b);
    ck_same_keys(a, b);
    cairn_replica_free(ab);
    cairn_replica_free(ba);
    close_and_remove(a, da);
    close_and_remove(b, db);
}
END_TEST

/* ---- received changes that wait too long ---------------------------------- */

static uint64_t aging_now = 1700000000000ull;

static uint64_t aging_clock(void *arg)
{
    (void)arg;
    return aging_now;
}

/* b holds a's second change while its dependency is missing; the first
 * comes |wait_ms| later. Returns b's key space then; *heads_are_c1 says
 * whether b's heads are the first change alone (the second was dropped). */
static char *late_dependency(const captured *ca, uint64_t wait_ms, int *heads_are_c1)
{
    char *db = make_tmpdir();
    cairn_store_options o;
    cairn_store_options_init(&o);
    static const cairn_actor actor_b = {{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}};
    o.actor = &actor_b;
    o.clock_ms = aging_clock;
    cairn_store *b = open_store_opts(db, &o);
    ck_assert_int_eq(cairn_store_receive(b, ca->bytes[1], ca->len[1]), 0); /* buffered */
    char *before = dump(b);
    ck_assert_str_eq(before, "");
    free(before);
    aging_now += wait_ms;
    ck_assert_int_eq(cairn_store_receive(b, ca->bytes[0], ca->len[0]), 0);
    char *keys = dump(b);
    cairn_hash *h;
    size_t nh;
    ck_assert_int_eq(cairn_store_heads(b, &h, &nh), 0);
    *heads_are_c1 = nh == 1 && cairn_hash_cmp(&h[0], &ca->hash[0]) == 0;
    free(h);
    if (*heads_are_c1) { /* dropped, not refused: it is taken when sent again */
        ck_assert_int_eq(cairn_store_receive(b, ca->bytes[1], ca->len[1]), 0);
        char *again = dump(b);
        ck_assert_str_eq(again, "k=2;");
        free(again);
    }
    close_and_remove(b, db);
    return keys;
}

START_TEST(waiting_change_ages_out)
{
    char *da = make_tmpdir();
    captured ca = {0};
    cairn_store *a = open_store_actor(da, 1, &ca);
    put_kv(a, "k", "1");
    put_kv(a, "k", "2"); /* depends on the first */
    ck_assert_int_eq(ca.n, 2);
    int c1_only;
    /* within the age limit, the dependency's arrival applies both */
    char *keys = late_dependency(&ca, 29000, &c1_only);
    ck_assert_str_eq(keys, "k=2;");
    ck_assert_int_eq(c1_only, 0);
    free(keys);
    /* past it, the waiting change left the buffer before the dependency came */
    keys = late_dependency(&ca, 31000, &c1_only);
    ck_assert_str_eq(keys, "k=1;");
    ck_assert_int_eq(c1_only, 1);
    free(keys);
    captured_free(&ca);
    close_and_remove(a, da);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_replica");
    TCase *t = tcase_create("core");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, two_stores_converge);
    tcase_add_test(t, change_bytes_counts_every_change);
    tcase_add_test(t, burst_of_1000);
    tcase_add_test(t, three_in_a_line);
    tcase_add_test(t, corrupt_change_applies_nothing);
    tcase_add_test(t, push_then_quiet);
    tcase_add_test(t, local_put_between_slices);
    tcase_add_test(t, waiting_change_ages_out);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
