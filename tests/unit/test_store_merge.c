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
 *   and a duplicate is harmless.
 */

#include "../store/store_test.h"

static cairn_store *open_peer(const char *dir, uint8_t actor_byte, captured *cap)
{
    static cairn_actor actors[2];
    cairn_actor *a = &actors[actor_byte & 1];
    memset(a->b, actor_byte, CAIRN_ACTOR_LEN);
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.actor = a;
    o.events_cb = capture;
    o.events_arg = cap;
    return open_store_opts(dir, &o);
}

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
    cairn_store *a = open_peer(da, 0x11, &ca);
    cairn_store *b = open_peer(db, 0x22, &cb);

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
    b = open_peer(db, 0x22, &cb);
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
    cairn_store_close(a);
    cairn_store_close(b);
    rm_rf(da);
    rm_rf(db);
    free(da);
    free(db);
}
END_TEST

/* A peer's change setting kvs[key] to |v| (kvs = op 1 of the genesis). */
static cairn_change *remote_set(const cairn_change *g, const cairn_actor *ga, uint64_t seq,
                                const cairn_hash *dep, const char *key, cairn_value v)
{
    cairn_actor actors[2];
    memset(actors[0].b, 0x99, CAIRN_ACTOR_LEN);
    actors[1] = *ga;
    (void)g;
    cairn_op op;
    memset(&op, 0, sizeof op);
    op.action = CAIRN_OP_SET;
    op.obj.counter = 1;
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

START_TEST(hostile_values_from_peers)
{
    char *d = make_tmpdir();
    captured cap = {0};
    cairn_store *s = open_peer(d, 0x11, &cap);
    cairn_actor ga;
    cairn_change *g = genesis("etcd-cluster", &ga);
    /* a value that is not bytes, and bytes whose lease varint never ends */
    cairn_value vi = {.type = CAIRN_V_INT, .v.i = 5};
    static const uint8_t bad[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                    0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    cairn_value vb = {.type = CAIRN_V_BYTES};
    vb.v.bytes.ptr = bad;
    vb.v.bytes.len = sizeof bad;
    cairn_change *c1 = remote_set(g, &ga, 1, &g->hash, "int", vi);
    cairn_change *c2 = remote_set(g, &ga, 2, &c1->hash, "bad", vb);
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
    s = open_peer(d, 0x11, &cap);
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

int main(void)
{
    Suite *su = suite_create("store_merge");
    TCase *tc = tcase_create("merge");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, merge_through_the_observer);
    tcase_add_test(tc, hostile_values_from_peers);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
