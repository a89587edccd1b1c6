/*
 * Changes from peers go through the same observer path as local writes.
 * Two stores of one cluster (same token, so byte-identical genesis, different
 * actors) exchange the changes their events callback hands out:
 * - a merged change that changes a visible key takes the next local
 *   revision, with the same create/version rules as a local write;
 * - a merged change that changes no visible key (a concurrent write that
 *   loses to the current winner) takes no revision (documented choice);
 * - both converge to the same visible value;
 * - merged changes are durable (they survive a reopen with their revisions)
 *   and a duplicate is harmless;
 * - a burst (cairn_store_receive_changes) is one group commit, leaves the
 *   state one-by-one receives leave, and reports the heads once durable; a
 *   rejected change in it applies nothing and the others still apply.
 */

#include <pthread.h>

#include "../store/store_test.h"

static void expect(cairn_store *s, const char *k, const char *v, int64_t c, int64_t m, int64_t ver)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)k;
    q.key_len = strlen(k);
    cairn_range_resp r;
    ck_assert_int_eq(cairn_store_range(s, &r, &q), 0);
    ck_assert_int_eq(r.nkvs, 1);
    ck_kv(&r.kvs[0], k, v, c, m, ver);
    cairn_range_resp_destroy(&r);
}

START_TEST(merge_through_the_observer)
{
    char *da = make_tmpdir(), *db = make_tmpdir();
    captured ca = {0}, cb = {0};
    cairn_store *a = open_store_actor(da, 0x11, &ca);
    cairn_store *b = open_store_actor(db, 0x22, &cb);

    /* a writes x; b merges it: next local revision on b (2), version 1 */
    ck_assert_int_eq(put_kv(a, "x", "from-a"), 2);
    ck_assert_int_eq(ca.n, 1);
    ck_assert_int_eq(cairn_store_receive(b, ca.bytes[0], ca.len[0]), 0);
    expect(b, "x", "from-a", 2, 2, 1);
    ck_assert_int_eq(cur_rev(b), 2);
    ck_assert_int_eq(cb.n, 1); /* the merged change reaches b's listeners */
    ck_assert_int_eq(cb.rev[0], 2);
    /* a duplicate changes nothing */
    ck_assert_int_eq(cairn_store_receive(b, ca.bytes[0], ca.len[0]), 0);
    ck_assert_int_eq(cur_rev(b), 2);
    captured_free(&ca);
    captured_free(&cb);

    /* b writes y locally first: revision 3 on b; a's next change arrives
     * as revision 4 on b */
    ck_assert_int_eq(put_kv(b, "y", "b-local"), 3);
    ck_assert_int_eq(put_kv(a, "x", "a-second"), 3);
    ck_assert_int_eq(cairn_store_receive(b, ca.bytes[0], ca.len[0]), 0);
    expect(b, "x", "a-second", 2, 4, 2);
    /* and b's y arrives on a as revision 4 there */
    ck_assert_int_eq(cairn_store_receive(a, cb.bytes[0], cb.len[0]), 0);
    expect(a, "y", "b-local", 4, 4, 1);
    captured_free(&ca);
    captured_free(&cb);

    /* concurrent writes to z: the greater op id wins on both nodes. The
     * node where the incoming write wins takes a revision for it; the node
     * where it loses takes none. */
    ck_assert_int_eq(put_kv(a, "z", "za"), 5);
    ck_assert_int_eq(put_kv(b, "z", "zb"), 5);
    int64_t ra = cur_rev(a), rb = cur_rev(b);
    ck_assert_int_eq(cairn_store_receive(a, cb.bytes[0], cb.len[0]), 0);
    ck_assert_int_eq(cairn_store_receive(b, ca.bytes[0], ca.len[0]), 0);
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"z";
    q.key_len = 1;
    cairn_range_resp za, zb;
    ck_assert_int_eq(cairn_store_range(a, &za, &q), 0);
    ck_assert_int_eq(cairn_store_range(b, &zb, &q), 0);
    ck_assert_int_eq(za.kvs[0].value_len, 2);
    ck_assert_mem_eq(za.kvs[0].value, zb.kvs[0].value, 2); /* converged */
    int b_won = za.kvs[0].value[1] == 'b';
    if (b_won) {
        ck_assert_int_eq(cur_rev(a), ra + 1);
        ck_assert_int_eq(cur_rev(b), rb);
        expect(a, "z", "zb", 5, 6, 2);
        expect(b, "z", "zb", 5, 5, 1);
    } else {
        ck_assert_int_eq(cur_rev(a), ra);
        ck_assert_int_eq(cur_rev(b), rb + 1);
        expect(a, "z", "za", 5, 5, 1);
        expect(b, "z", "za", 5, 6, 2);
        rb++;
    }
    cairn_range_resp_destroy(&za);
    cairn_range_resp_destroy(&zb);
    captured_free(&ca);
    captured_free(&cb);

    /* merged changes are durable with their revisions */
    cairn_store_close(b);
    b = open_store_actor(db, 0x22, &cb);
    ck_assert_int_eq(cur_rev(b), rb);
    expect(b, "x", "a-second", 2, 4, 2);
    /* a change whose dependency is missing is buffered, not an error */
    ck_assert_int_eq(put_kv(a, "w1", "1"), 7);
    ck_assert_int_eq(put_kv(a, "w2", "2"), 8);
    ck_assert_int_eq(cairn_store_receive(b, ca.bytes[1], ca.len[1]), 0);
    ck_assert_int_eq(cur_rev(b), rb);
    ck_assert_int_eq(cairn_store_receive(b, ca.bytes[0], ca.len[0]), 0);
    ck_assert_int_eq(cur_rev(b), rb + 2);
    expect(b, "w2", "2", rb + 2, rb + 2, 1);
    /* garbage is rejected with a code, nothing applied */
    uint8_t junk[16] = {1, 2, 3};
    ck_assert_int_lt(cairn_store_receive(b, junk, sizeof junk), 0);
    ck_assert_int_eq(cur_rev(b), rb + 2);
    captured_free(&ca);
    captured_free(&cb);
    close_and_remove(a, da);
    close_and_remove(b, db);
}
END_TEST

/* A change of peer actor |ab| (all bytes |ab|) setting |key| to |v| in the
 * object made by op counter |obj| of the genesis (1 = kvs; anything else
 * names no object). */
static cairn_change *peer_change(uint8_t ab, uint64_t seq, const cairn_hash *dep, uint64_t obj,
                                 const char *key, cairn_value v)
{
    cairn_actor actors[2];
    memset(actors[0].b, ab, CAIRN_ACTOR_LEN);
    cairn_change_free(genesis("etcd-cluster", &actors[1]));
    cairn_op op;
    memset(&op, 0, sizeof op);
    op.action = CAIRN_OP_SET;
    op.obj.counter = obj;
    op.obj.actor = 1;
    op.key = (const uint8_t *)key;
    op.key_len = (uint32_t)strlen(key);
    op.value = v;
    cairn_change t;
    memset(&t, 0, sizeof t);
    t.actor = actors[0];
    t.seq = seq;
    t.start_op = 1000 + seq;
    t.time_ms = 5;
    t.ndeps = 1;
    t.deps = (cairn_hash *)dep;
    t.nactors = 2;
    t.actors = actors;
    t.nops = 1;
    t.ops = &op;
    cairn_change *c;
    ck_assert_int_eq(cairn_change_new(&c, &t), 0);
    return c;
}

/* A peer's change setting kvs[key] to |v|. */
static cairn_change *remote_set(uint64_t seq, const cairn_hash *dep, const char *key, cairn_value v)
{
    return peer_change(0x99, seq, dep, 1, key, v);
}

START_TEST(hostile_values_from_peers)
{
    char *d = make_tmpdir();
    captured cap = {0};
    cairn_store *s = open_store_actor(d, 0x11, &cap);
    cairn_actor ga;
    cairn_change *g = genesis("etcd-cluster", &ga);
    /* a value that is not bytes, and bytes whose lease varint never ends */
    cairn_value vi = {.type = CAIRN_V_INT, .v.i = 5};
    static const uint8_t bad[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                    0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    cairn_value vb = {.type = CAIRN_V_BYTES};
    vb.v.bytes.ptr = bad;
    vb.v.bytes.len = sizeof bad;
    cairn_change *c1 = remote_set(1, &g->hash, "int", vi);
    cairn_change *c2 = remote_set(2, &c1->hash, "bad", vb);
    ck_assert_int_eq(cairn_store_receive(s, c1->bytes, c1->len), 0);
    ck_assert_int_eq(cairn_store_receive(s, c2->bytes, c2->len), 0);
    /* deterministic readings: a non-bytes value reads as empty with no
     * lease; a record whose varint is malformed reads as its raw bytes */
    expect(s, "int", "", 2, 2, 1);
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"bad";
    q.key_len = 3;
    cairn_range_resp r;
    ck_assert_int_eq(cairn_store_range(s, &r, &q), 0);
    ck_assert_int_eq(r.nkvs, 1);
    ck_assert_int_eq(r.kvs[0].lease, 0);
    ck_assert_int_eq(r.kvs[0].value_len, sizeof bad);
    ck_assert_mem_eq(r.kvs[0].value, bad, sizeof bad);
    ck_assert_int_eq(r.kvs[0].mod_revision, 3);
    cairn_range_resp_destroy(&r);
    /* and the same after a replay */
    cairn_store_close(s);
    s = open_store_actor(d, 0x11, &cap);
    expect(s, "int", "", 2, 2, 1);
    ck_assert_int_eq(cur_rev(s), 3);
    cairn_change_free(c1);
    cairn_change_free(c2);
    cairn_change_free(g);
    captured_free(&cap);
    cairn_store_close(s);
    rm_rf(d);
    free(d);
}
END_TEST

/* peer_change with a kvs record: lease 0 ++ |val|. */
static cairn_change *peer_set(uint8_t ab, uint64_t seq, const cairn_hash *dep, uint64_t obj,
                              const char *key, const char *val)
{
    uint8_t rec[64];
    size_t vl = strlen(val);
    rec[0] = 0; /* lease 0 */
    memcpy(rec + 1, val, vl);
    cairn_value v = {.type = CAIRN_V_BYTES};
    v.v.bytes.ptr = rec;
    v.v.bytes.len = vl + 1;
    return peer_change(ab, seq, dep, obj, key, v);
}

typedef struct heads_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, rc;
    cairn_hash heads[8];
    size_t nheads;
    int64_t visible; /* the store's visible revision when it ran */
    cairn_store *s;
} heads_wait;

static void on_heads(void *arg, int rc, const cairn_hash *h, size_t n)
{
    heads_wait *w = arg;
    cairn_header hd;
    cairn_store_header(w->s, &hd);
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->nheads = n < 8 ? n : 8;
    if (n)
        memcpy(w->heads, h, w->nheads * sizeof *h);
    w->visible = hd.revision;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Receives a burst and waits for its completion. */
static void burst(cairn_store *s, cairn_change **chs, size_t n, int *verdicts, heads_wait *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->s = s;
    ck_assert_int_eq(cairn_store_receive_changes(s, chs, n, verdicts, on_heads, w), 0);
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static cairn_change **decode_all(const captured *c, int from, int n)
{
    cairn_change **v = calloc((size_t)n, sizeof *v);
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(cairn_change_decode(&v[i], c->bytes[from + i], c->len[from + i], NULL), 0);
    return v;
}

/* Every key of |a| and |b| with its revisions and value: equal state. */
static void same_state(cairn_store *a, cairn_store *b)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"\0";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"\0";
    q.range_end_len = 1;
    cairn_range_resp ra, rb;
    ck_assert_int_eq(cairn_store_range(a, &ra, &q), 0);
    ck_assert_int_eq(cairn_store_range(b, &rb, &q), 0);
    ck_assert_int_eq(ra.header.revision, rb.header.revision);
    ck_assert_int_eq(ra.nkvs, rb.nkvs);
    for (size_t i = 0; i < ra.nkvs; i++) {
        const cairn_kv *x = &ra.kvs[i], *y = &rb.kvs[i];
        ck_assert_int_eq(x->key_len, y->key_len);
        ck_assert_mem_eq(x->key, y->key, x->key_len);
        ck_assert_int_eq(x->value_len, y->value_len);
        ck_assert_mem_eq(x->value, y->value, x->value_len);
        ck_assert_int_eq(x->create_revision, y->create_revision);
        ck_assert_int_eq(x->mod_revision, y->mod_revision);
        ck_assert_int_eq(x->version, y->version);
    }
    cairn_range_resp_destroy(&ra);
    cairn_range_resp_destroy(&rb);
}

START_TEST(burst_is_one_group_commit)
{
    char *da = make_tmpdir(), *db = make_tmpdir(), *dc = make_tmpdir();
    captured ca = {0}, cb = {0}, cc = {0};
    cairn_store *a = open_store_actor(da, 0x11, &ca);
    cairn_store *b = open_store_actor(db, 0x22, &cb);
    cairn_store *c = open_store_actor(dc, 0x33, &cc);
    enum { N = 12 };
    char k[16], v[16];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "k%02d", i % 5); /* overwrites: versions move */
        snprintf(v, sizeof v, "v%d", i);
        put_kv(a, k, v);
    }
    ck_assert_int_eq(ca.n, N);
    /* c: one by one (N syncs); b: one burst, given in reverse order so all
     * but the last are buffered first */
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(cairn_store_receive(c, ca.bytes[i], ca.len[i]), 0);
    cairn_change **chs = decode_all(&ca, 0, N), *rev_chs[N];
    for (int i = 0; i < N; i++)
        rev_chs[i] = chs[N - 1 - i];
    free(chs);
    cairn_store_stats st0, st1;
    cairn_store_get_stats(b, &st0);
    int verdicts[N];
    heads_wait w;
    burst(b, rev_chs, N, verdicts, &w);
    cairn_store_get_stats(b, &st1);
    ck_assert_int_eq(w.rc, 0);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(verdicts[i], 0);
    ck_assert_uint_eq(st1.syncs - st0.syncs, 1);
    ck_assert_uint_eq(st1.changes - st0.changes, N);
    /* durable and visible when the completion runs */
    ck_assert_int_eq(w.visible, 1 + N);
    /* the heads it reports are a's, the change a made last */
    ck_assert_int_eq(w.nheads, 1);
    ck_assert_mem_eq(w.heads[0].b, ca.hash[N - 1].b, CAIRN_HASH_LEN);
    same_state(b, c);
    same_state(a, b);
    /* events as for local writes: one per change, in apply order */
    ck_assert_int_eq(cb.n, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(cb.rev[i], 2 + i);
        ck_assert_int_eq(cc.rev[i], 2 + i);
        ck_assert_mem_eq(cb.hash[i].b, cc.hash[i].b, CAIRN_HASH_LEN);
    }
    /* durable with its revisions */
    cairn_store_close(b);
    captured_free(&cb);
    b = open_store_actor(db, 0x22, &cb);
    same_state(b, c);
    /* an empty burst completes with the current heads */
    burst(b, NULL, 0, NULL, &w);
    ck_assert_int_eq(w.rc, 0);
    ck_assert_int_eq(w.nheads, 1);
    ck_assert_mem_eq(w.heads[0].b, ca.hash[N - 1].b, CAIRN_HASH_LEN);
    captured_free(&ca);
    captured_free(&cb);
    captured_free(&cc);
    cairn_store_close(a);
    cairn_store_close(b);
    cairn_store_close(c);
    rm_rf(da);
    rm_rf(db);
    rm_rf(dc);
    free(da);
    free(db);
    free(dc);
}
END_TEST

/* The metrics' counters (cairn_store_stats): changes applied by origin,
 * the batch histogram, pending received changes, the checkpoint's lag. */
START_TEST(stats_by_origin_pending_checkpoint)
{
    char *da = make_tmpdir(), *db = make_tmpdir();
    captured ca = {0}, cb = {0};
    cairn_store *a = open_store_actor(da, 0x11, &ca);
    cairn_store *b = open_store_actor(db, 0x22, &cb);
    enum { N = 6 };
    cairn_store_stats a0, a1, b0, b1;
    cairn_store_get_stats(a, &a0);
    char k[16];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "s%d", i);
        put_kv(a, k, "v");
    }
    cairn_store_get_stats(a, &a1);
    ck_assert_uint_eq(a1.applied_local - a0.applied_local, N);
    ck_assert_uint_eq(a1.applied_remote, a0.applied_remote);
    ck_assert_uint_eq(a1.ckpt_behind - a0.ckpt_behind, N);
    /* one change per blocking put: N groups of one */
    ck_assert_uint_eq(a1.batch_le[0] - a0.batch_le[0], N);
    cairn_store_get_stats(b, &b0);
    ck_assert_uint_eq(b0.pending, 0);
    /* all but the first: buffered, pending, not applied */
    cairn_change **chs = decode_all(&ca, 0, N);
    int verdicts[N];
    heads_wait w;
    burst(b, chs + 1, N - 1, verdicts, &w);
    cairn_store_get_stats(b, &b1);
    ck_assert_uint_eq(b1.pending, N - 1);
    ck_assert_uint_eq(b1.applied_remote, b0.applied_remote);
    /* the first completes them: one group of N, nothing pending */
    burst(b, chs, 1, verdicts, &w);
    free(chs);
    cairn_store_get_stats(b, &b1);
    ck_assert_uint_eq(b1.pending, 0);
    ck_assert_uint_eq(b1.applied_remote - b0.applied_remote, N);
    ck_assert_uint_eq(b1.applied_local, b0.applied_local);
    ck_assert_uint_eq(b1.changes, b1.applied_local + b1.applied_remote);
    uint64_t count = 0;
    for (int i = 0; i <= CAIRN_STORE_BATCH_BUCKETS; i++)
        count += b1.batch_le[i];
    ck_assert_uint_eq(count, b1.syncs);
    ck_assert_uint_eq(b1.batch_le[3] - b0.batch_le[3], 1); /* 6 changes: le 8 */
    /* a reopen loads the checkpoint close wrote: nothing behind, a fresh age */
    ck_assert_uint_ge(b1.ckpt_behind, N);
    cairn_store_close(b);
    captured_free(&cb);
    b = open_store_actor(db, 0x22, &cb);
    cairn_store_get_stats(b, &b1);
    ck_assert_uint_eq(b1.ckpt_behind, 0);
    ck_assert_uint_lt(b1.ckpt_age_ms, 60000);
    ck_assert_uint_eq(b1.applied_local + b1.applied_remote, 0);
    put_kv(b, "after", "v");
    cairn_store_get_stats(b, &b1);
    ck_assert_uint_eq(b1.ckpt_behind, 1);
    captured_free(&ca);
    captured_free(&cb);
    cairn_store_close(a);
    cairn_store_close(b);
    rm_rf(da);
    rm_rf(db);
    free(da);
    free(db);
}
END_TEST

START_TEST(burst_with_a_bad_change)
{
    char *d = make_tmpdir();
    captured cap = {0};
    cairn_store *s = open_store_actor(d, 0x11, &cap);
    cairn_actor ga;
    cairn_change *g = genesis("etcd-cluster", &ga);
    /* c1 good; bad names no object (seq 2 of c1's actor); c3 another
     * actor's good change; c4 depends on bad */
    cairn_change *c1 = peer_set(0x99, 1, &g->hash, 1, "k1", "one");
    cairn_change *bad = peer_set(0x99, 2, &c1->hash, 77, "kb", "bad");
    cairn_change *c3 = peer_set(0x98, 1, &g->hash, 1, "k3", "three");
    cairn_change *c4 = peer_set(0x99, 3, &bad->hash, 1, "k4", "four");
    cairn_hash h1 = c1->hash, h3 = c3->hash;
    cairn_change_free(g);
    cairn_change *chs[4] = {c1, bad, c3, c4};
    int verdicts[4] = {1, 1, 1, 1};
    cairn_store_stats st0, st1;
    cairn_store_get_stats(s, &st0);
    heads_wait w;
    burst(s, chs, 4, verdicts, &w);
    cairn_store_get_stats(s, &st1);
    ck_assert_int_eq(w.rc, 0);
    ck_assert_int_eq(verdicts[0], 0);
    ck_assert_int_lt(verdicts[1], 0); /* rejected */
    ck_assert_int_eq(verdicts[2], 0);
    /* its dependency was refused: refused on arrival, not buffered */
    ck_assert_int_eq(verdicts[3], CAIRN_EPASTREFUSED);
    ck_assert_uint_eq(st1.syncs - st0.syncs, 1);
    ck_assert_uint_eq(st1.changes - st0.changes, 2);
    /* the good ones applied in the order given, nothing of the bad one */
    expect(s, "k1", "one", 2, 2, 1);
    expect(s, "k3", "three", 3, 3, 1);
    ck_assert_int_eq(cur_rev(s), 3);
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"k4";
    q.key_len = 2;
    cairn_range_resp r;
    ck_assert_int_eq(cairn_store_range(s, &r, &q), 0);
    ck_assert_int_eq(r.nkvs, 0);
    cairn_range_resp_destroy(&r);
    ck_assert_int_eq(cap.n, 2);
    /* the heads: the two good changes and the initial members change (a
     * sibling of theirs: they depend on the genesis alone), sorted */
    ck_assert_int_eq(w.nheads, 3);
    int f1 = 0, f3 = 0;
    for (size_t i = 0; i < 3; i++) {
        f1 += memcmp(w.heads[i].b, h1.b, CAIRN_HASH_LEN) == 0;
        f3 += memcmp(w.heads[i].b, h3.b, CAIRN_HASH_LEN) == 0;
        if (i)
            ck_assert_int_lt(memcmp(w.heads[i - 1].b, w.heads[i].b, CAIRN_HASH_LEN), 0);
    }
    ck_assert_int_eq(f1, 1);
    ck_assert_int_eq(f3, 1);
    /* and so after a replay */
    cairn_store_close(s);
    captured_free(&cap);
    s = open_store_actor(d, 0x11, &cap);
    ck_assert_int_eq(cur_rev(s), 3);
    expect(s, "k3", "three", 3, 3, 1);
    captured_free(&cap);
    cairn_store_close(s);
    rm_rf(d);
    free(d);
}
END_TEST

/* The watch hub and the peer broadcaster both subscribe: each gets every
 * durable change, local and merged, in apply order; one that unsubscribes
 * hears no more. */
START_TEST(every_subscriber_gets_every_change)
{
    char *da = make_tmpdir(), *db = make_tmpdir();
    captured ca = {0}, hub = {0}, bc = {0}, late = {0};
    cairn_store *a = open_store_actor(da, 0x11, &ca);
    cairn_store_options o;
    cairn_store_options_init(&o);
    cairn_actor act;
    memset(act.b, 0x22, CAIRN_ACTOR_LEN);
    o.actor = &act;
    cairn_store_subscriber subs[2] = {{capture, &hub}, {capture, &bc}};
    o.subscribers = subs;
    o.nsubscribers = 2;
    cairn_store *b = open_store_opts(db, &o);
    put_kv(a, "x", "1");
    put_kv(b, "y", "2");
    ck_assert_int_eq(cairn_store_receive(b, ca.bytes[0], ca.len[0]), 0);
    ck_assert_int_eq(cairn_store_subscribe(b, capture, &late), 0);
    put_kv(b, "z", "3");
    ck_assert_int_eq(cairn_store_unsubscribe(b, capture, &bc), 0);
    ck_assert_int_eq(cairn_store_unsubscribe(b, capture, &bc), CAIRN_ENOTFOUND);
    put_kv(b, "w", "4");
    ck_assert_int_eq(hub.n, 4);
    ck_assert_int_eq(bc.n, 3);
    ck_assert_int_eq(late.n, 2);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(hub.rev[i], 2 + i);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(bc.rev[i], hub.rev[i]);
        ck_assert_mem_eq(bc.hash[i].b, hub.hash[i].b, CAIRN_HASH_LEN);
    }
    ck_assert_mem_eq(hub.hash[1].b, ca.hash[0].b, CAIRN_HASH_LEN); /* the merged one */
    ck_assert_int_eq(late.rev[0], 4);
    ck_assert_int_eq(late.rev[1], 5);
    captured_free(&ca);
    captured_free(&hub);
    captured_free(&bc);
    captured_free(&late);
    close_and_remove(a, da);
    close_and_remove(b, db);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_merge");
    TCase *tc = tcase_create("merge");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, merge_through_the_observer);
    tcase_add_test(tc, hostile_values_from_peers);
    tcase_add_test(tc, burst_is_one_group_commit);
    tcase_add_test(tc, stats_by_origin_pending_checkpoint);
    tcase_add_test(tc, burst_with_a_bad_change);
    tcase_add_test(tc, every_subscriber_gets_every_change);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
