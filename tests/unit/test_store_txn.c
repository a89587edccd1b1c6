/*
 * Txn rules of the store, written from what etcd 3.4.23 answered (probed
 * through its gRPC gateway; quoted as "etcd:" beside each assertion).
 * Fixture, as on etcd: put a=1 (rev 2), b=2 (3), c=3 (4).
 */

#include "../store/store_test.h"

static char *dir;
static cairn_store *st;

static void fixture(void)
{
    dir = make_tmpdir();
    st = open_store(dir);
    put_kv(st, "a", "1");
    put_kv(st, "b", "2");
    ck_assert_int_eq(put_kv(st, "c", "3"), 4);
}

static void teardown(void)
{
    cairn_store_close(st);
    rm_rf(dir);
    free(dir);
}

/* ---- builders ---------------------------------------------------------------- */

static cairn_request_op P(const char *k, const char *v)
{
    cairn_request_op o = {0};
    o.type = CAIRN_REQ_PUT;
    o.u.put.key = (const uint8_t *)k;
    o.u.put.key_len = strlen(k);
    o.u.put.value = (const uint8_t *)v;
    o.u.put.value_len = strlen(v);
    return o;
}

static cairn_request_op G(const char *k)
{
    cairn_request_op o = {0};
    o.type = CAIRN_REQ_RANGE;
    o.u.range.key = (const uint8_t *)k;
    o.u.range.key_len = strlen(k);
    return o;
}

static cairn_request_op D(const char *k, const char *end)
{
    cairn_request_op o = {0};
    o.type = CAIRN_REQ_DELETE;
    o.u.del.key = (const uint8_t *)k;
    o.u.del.key_len = strlen(k);
    if (end) {
        o.u.del.range_end = (const uint8_t *)(end[0] ? end : "\0");
        o.u.del.range_end_len = end[0] ? strlen(end) : 1;
    }
    return o;
}

static cairn_request_op T(const cairn_txn_req *t)
{
    cairn_request_op o = {0};
    o.type = CAIRN_REQ_TXN;
    o.u.txn = t;
    return o;
}

static cairn_compare C(const char *k, int result, int target, int64_t num, const char *val)
{
    cairn_compare c = {0};
    c.key = (const uint8_t *)k;
    c.key_len = strlen(k);
    c.result = result;
    c.target = target;
    c.version = c.create_revision = c.mod_revision = c.lease = num;
    if (val) {
        c.value = (const uint8_t *)val;
        c.value_len = strlen(val);
    }
    return c;
}

#define N(a) (sizeof(a) / sizeof((a)[0]))
#define TXN(cmp, ncmp, suc, nsuc, fail, nfail)                                                     \
    ((cairn_txn_req){(cmp), (ncmp), (suc), (nsuc), (fail), (nfail)})

static int run(cairn_txn_resp *r, cairn_txn_req q)
{
    return cairn_store_txn(st, r, &q);
}

static void expect_get(const char *k, const char *v, int64_t c, int64_t m, int64_t ver)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)k;
    q.key_len = strlen(k);
    cairn_range_resp r;
    ck_assert_int_eq(cairn_store_range(st, &r, &q), 0);
    if (!v) {
        ck_assert_int_eq(r.nkvs, 0);
    } else {
        ck_assert_int_eq(r.nkvs, 1);
        ck_kv(&r.kvs[0], k, v, c, m, ver);
    }
    cairn_range_resp_destroy(&r);
}

/* Does compare |c| hold? (a read-only txn with one compare) */
static int holds(cairn_compare c)
{
    cairn_txn_resp r;
    ck_assert_int_eq(run(&r, TXN(&c, 1, NULL, 0, NULL, 0)), 0);
    int ok = r.succeeded;
    cairn_txn_resp_destroy(&r);
    return ok;
}

START_TEST(compares)
{
    /* etcd: value == "1" on a -> true; put+get in the branch reads its own
     * write: a(c2 m5 v2)=9; header 5 */
    cairn_compare c = C("a", CAIRN_CMP_EQUAL, CAIRN_CMP_VALUE, 0, "1");
    cairn_request_op s1[] = {P("a", "9"), G("a")}, f1[] = {G("b")};
    cairn_txn_resp r;
    ck_assert_int_eq(run(&r, TXN(&c, 1, s1, 2, f1, 1)), 0);
    ck_assert_int_eq(r.succeeded, 1);
    ck_assert_int_eq(r.header.revision, 5);
    ck_assert_int_eq(r.nresponses, 2);
    ck_assert_int_eq(r.responses[0].type, CAIRN_REQ_PUT);
    ck_assert_int_eq(r.responses[0].u.put.header.revision, 5);
    ck_assert_int_eq(r.responses[1].u.range.header.revision, 5);
    ck_kv(&r.responses[1].u.range.kvs[0], "a", "9", 2, 5, 2);
    cairn_txn_resp_destroy(&r);
    /* etcd: the same compare now fails -> failure branch (read only), header
     * 5, succeeded false, b(c3 m3 v1)=2 */
    ck_assert_int_eq(run(&r, TXN(&c, 1, s1, 2, f1, 1)), 0);
    ck_assert_int_eq(r.succeeded, 0);
    ck_assert_int_eq(r.header.revision, 5);
    ck_kv(&r.responses[0].u.range.kvs[0], "b", "2", 3, 3, 1);
    cairn_txn_resp_destroy(&r);
    ck_assert_int_eq(cur_rev(st), 5);

    /* etcd, a missing key: version/create/mod/lease compare as 0 (== 0 true),
     * a VALUE compare is always false (== "", != "x", < "x") */
    ck_assert(holds(C("zz", CAIRN_CMP_EQUAL, CAIRN_CMP_VERSION, 0, NULL)));
    ck_assert(holds(C("zz", CAIRN_CMP_EQUAL, CAIRN_CMP_CREATE, 0, NULL)));
    ck_assert(holds(C("zz", CAIRN_CMP_EQUAL, CAIRN_CMP_MOD, 0, NULL)));
    ck_assert(holds(C("zz", CAIRN_CMP_EQUAL, CAIRN_CMP_LEASE, 0, NULL)));
    ck_assert(!holds(C("zz", CAIRN_CMP_EQUAL, CAIRN_CMP_VALUE, 0, "")));
    ck_assert(!holds(C("zz", CAIRN_CMP_NOT_EQUAL, CAIRN_CMP_VALUE, 0, "x")));
    ck_assert(!holds(C("zz", CAIRN_CMP_LESS, CAIRN_CMP_VALUE, 0, "x")));
    /* etcd: lease == 0 on a; b mod > 2 true, < 2 false; b create != 3 false;
     * b value > "1" true */
    ck_assert(holds(C("a", CAIRN_CMP_EQUAL, CAIRN_CMP_LEASE, 0, NULL)));
    ck_assert(holds(C("b", CAIRN_CMP_GREATER, CAIRN_CMP_MOD, 2, NULL)));
    ck_assert(!holds(C("b", CAIRN_CMP_LESS, CAIRN_CMP_MOD, 2, NULL)));
    ck_assert(!holds(C("b", CAIRN_CMP_NOT_EQUAL, CAIRN_CMP_CREATE, 3, NULL)));
    ck_assert(holds(C("b", CAIRN_CMP_GREATER, CAIRN_CMP_VALUE, 0, "1")));
    /* etcd, over a range [a,d): version > 0 true (all keys); value == "2"
     * false (not all); over an empty range [x,y): value false, version == 0
     * true */
    cairn_compare rc = C("a", CAIRN_CMP_GREATER, CAIRN_CMP_VERSION, 0, NULL);
    rc.range_end = (const uint8_t *)"d";
    rc.range_end_len = 1;
    ck_assert(holds(rc));
    rc = C("a", CAIRN_CMP_EQUAL, CAIRN_CMP_VALUE, 0, "2");
    rc.range_end = (const uint8_t *)"d";
    rc.range_end_len = 1;
    ck_assert(!holds(rc));
    rc = C("x", CAIRN_CMP_EQUAL, CAIRN_CMP_VALUE, 0, "2");
    rc.range_end = (const uint8_t *)"y";
    rc.range_end_len = 1;
    ck_assert(!holds(rc));
    rc = C("x", CAIRN_CMP_EQUAL, CAIRN_CMP_VERSION, 0, NULL);
    rc.range_end = (const uint8_t *)"y";
    rc.range_end_len = 1;
    ck_assert(holds(rc));
    /* etcd: from-key compare: mod > 0 on every key >= a -> true (header 18
     * there); an empty txn succeeds */
    rc = C("a", CAIRN_CMP_GREATER, CAIRN_CMP_MOD, 0, NULL);
    rc.range_end = (const uint8_t *)"\0";
    rc.range_end_len = 1;
    ck_assert(holds(rc));
    ck_assert_int_eq(run(&r, TXN(NULL, 0, NULL, 0, NULL, 0)), 0);
    ck_assert_int_eq(r.succeeded, 1);
    cairn_txn_resp_destroy(&r);
    ck_assert_int_eq(cur_rev(st), 5);
}
END_TEST

START_TEST(one_revision_and_own_writes)
{
    /* etcd: put a, put b, delete c, get a, get c -> all at rev 5: put
     * headers 5, deleted 1, a(c2 m5 v2)=10, c absent */
    cairn_request_op s1[] = {P("a", "10"), P("b", "20"), D("c", NULL), G("a"), G("c")};
    cairn_txn_resp r;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s1, N(s1), NULL, 0)), 0);
    ck_assert_int_eq(r.header.revision, 5);
    ck_assert_int_eq(r.responses[0].u.put.header.revision, 5);
    ck_assert_int_eq(r.responses[1].u.put.header.revision, 5);
    ck_assert_int_eq(r.responses[2].u.del.deleted, 1);
    ck_assert_int_eq(r.responses[2].u.del.header.revision, 5);
    ck_kv(&r.responses[3].u.range.kvs[0], "a", "10", 2, 5, 2);
    ck_assert_int_eq(r.responses[4].u.range.nkvs, 0);
    cairn_txn_resp_destroy(&r);
    expect_get("a", "10", 2, 5, 2);
    expect_get("b", "20", 3, 5, 2);
    expect_get("c", NULL, 0, 0, 0);
    ck_assert_int_eq(cur_rev(st), 5);
    /* etcd: no torn revision: reading at 4 shows the state before, at 5 all */
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"a";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"\0";
    q.range_end_len = 1;
    q.revision = 4;
    cairn_range_resp rr;
    ck_assert_int_eq(cairn_store_range(st, &rr, &q), 0);
    ck_assert_int_eq(rr.nkvs, 3);
    ck_kv(&rr.kvs[0], "a", "1", 2, 2, 1);
    cairn_range_resp_destroy(&rr);

    /* etcd: get a, put a, get a -> the first read has header 5 (before the
     * write) and the old value, the second header 6 and a(c2 m6 v3)=3 */
    cairn_request_op s2[] = {G("a"), P("a", "3"), G("a")};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s2, N(s2), NULL, 0)), 0);
    ck_assert_int_eq(r.header.revision, 6);
    ck_assert_int_eq(r.responses[0].u.range.header.revision, 5);
    ck_kv(&r.responses[0].u.range.kvs[0], "a", "10", 2, 5, 2);
    ck_assert_int_eq(r.responses[2].u.range.header.revision, 6);
    ck_kv(&r.responses[2].u.range.kvs[0], "a", "3", 2, 6, 3);
    cairn_txn_resp_destroy(&r);

    /* etcd: delete a, delete a -> allowed: deleted 1 then 0, one revision 7 */
    cairn_request_op s3[] = {D("a", NULL), D("a", NULL)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s3, N(s3), NULL, 0)), 0);
    ck_assert_int_eq(r.header.revision, 7);
    ck_assert_int_eq(r.responses[0].u.del.deleted, 1);
    ck_assert_int_eq(r.responses[1].u.del.deleted, 0);
    ck_assert_int_eq(r.responses[1].u.del.header.revision, 7);
    cairn_txn_resp_destroy(&r);

    /* etcd: a txn whose only write deletes nothing takes no revision */
    cairn_request_op s4[] = {D("nothing", NULL)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s4, 1, NULL, 0)), 0);
    ck_assert_int_eq(r.header.revision, 7);
    ck_assert_int_eq(r.responses[0].u.del.header.revision, 7);
    cairn_txn_resp_destroy(&r);
    ck_assert_int_eq(cur_rev(st), 7);

    /* etcd: delete b then get b in one txn -> deleted 1, the get sees nothing */
    cairn_request_op s5[] = {D("b", NULL), G("b")};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s5, N(s5), NULL, 0)), 0);
    ck_assert_int_eq(r.responses[1].u.range.nkvs, 0);
    cairn_txn_resp_destroy(&r);

    /* reads inside see new keys of the txn in range order; prev_kv works */
    cairn_request_op s6[] = {P("b2", "x"), P("a0", "y"), G("a")};
    s6[2].u.range.range_end = (const uint8_t *)"\0";
    s6[2].u.range.range_end_len = 1;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s6, N(s6), NULL, 0)), 0);
    cairn_range_resp *g = &r.responses[2].u.range;
    ck_assert_int_eq(g->nkvs, 2);
    ck_kv(&g->kvs[0], "a0", "y", 9, 9, 1);
    ck_kv(&g->kvs[1], "b2", "x", 9, 9, 1);
    ck_assert_int_eq(g->count, 2);
    cairn_txn_resp_destroy(&r);

    /* etcd: put with prev_kv inside a txn returns the previous kv */
    cairn_request_op s7[] = {P("a0", "z")};
    s7[0].u.put.prev_kv = 1;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s7, 1, NULL, 0)), 0);
    ck_kv(r.responses[0].u.put.prev_kv, "a0", "y", 9, 9, 1);
    cairn_txn_resp_destroy(&r);
}
END_TEST

START_TEST(nested)
{
    /* etcd: put a; txn{put b; get a} -> one revision 5; the nested txn's
     * header is empty; its get sees the outer write a(c2 m5 v2)=4 */
    cairn_request_op in1[] = {P("b", "5"), G("a")};
    cairn_txn_req t1 = TXN(NULL, 0, in1, N(in1), NULL, 0);
    cairn_request_op s1[] = {P("a", "4"), T(&t1)};
    cairn_txn_resp r;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s1, N(s1), NULL, 0)), 0);
    ck_assert_int_eq(r.header.revision, 5);
    cairn_txn_resp *n = r.responses[1].u.txn;
    ck_assert_int_eq(n->header.revision, 0);
    ck_assert_int_eq(n->header.member_id, 0);
    ck_assert_int_eq(n->succeeded, 1);
    ck_assert_int_eq(n->responses[0].u.put.header.revision, 5);
    ck_kv(&n->responses[1].u.range.kvs[0], "a", "4", 2, 5, 2);
    cairn_txn_resp_destroy(&r);
    expect_get("b", "5", 3, 5, 2);

    /* etcd: a nested compare is evaluated before the txn runs: put a=77;
     * txn{a == "77" ? put b : put c} takes the FAILURE branch (c created) */
    cairn_compare c = C("a", CAIRN_CMP_EQUAL, CAIRN_CMP_VALUE, 0, "77");
    cairn_request_op ok2[] = {P("b", "78")}, ko2[] = {P("c", "79")};
    cairn_txn_req t2 = TXN(&c, 1, ok2, 1, ko2, 1);
    cairn_request_op s2[] = {P("a", "77"), T(&t2)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s2, N(s2), NULL, 0)), 0);
    ck_assert_int_eq(r.responses[1].u.txn->succeeded, 0);
    cairn_txn_resp_destroy(&r);
    expect_get("c", "79", 4, 6, 2);
    expect_get("b", "5", 3, 5, 2);
}
END_TEST

START_TEST(overlapping_writes)
{
    cairn_txn_resp r;
    /* etcd: put a + put a -> "duplicate key given in txn request" */
    cairn_request_op s1[] = {P("a", "1"), P("a", "2")};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s1, 2, NULL, 0)), CAIRN_EDUPKEY);
    /* etcd: delete [a,c) + put b -> duplicate */
    cairn_request_op s2[] = {D("a", "c"), P("b", "2")};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s2, 2, NULL, 0)), CAIRN_EDUPKEY);
    /* etcd: delete from a with range_end "\0" + put b -> ALLOWED (the
     * interval [a, "\0") is empty to etcd's check): deleted 3, rev 5 */
    cairn_request_op s3[] = {D("a", ""), P("b", "2")};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s3, 2, NULL, 0)), 0);
    ck_assert_int_eq(r.responses[0].u.del.deleted, 3);
    ck_assert_int_eq(r.header.revision, 5);
    cairn_txn_resp_destroy(&r);
    /* etcd: get a + put a -> allowed */
    cairn_request_op s4[] = {G("a"), P("a", "3")};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s4, 2, NULL, 0)), 0);
    cairn_txn_resp_destroy(&r);
    /* etcd: outer put a + nested put a -> duplicate; also when the nested
     * put is in a branch that will not run */
    cairn_request_op in5[] = {P("a", "5")};
    cairn_txn_req t5 = TXN(NULL, 0, in5, 1, NULL, 0);
    cairn_request_op s5[] = {P("a", "4"), T(&t5)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s5, 2, NULL, 0)), CAIRN_EDUPKEY);
    cairn_compare never = C("a", CAIRN_CMP_EQUAL, CAIRN_CMP_VALUE, 0, "zzz");
    cairn_request_op ok6[] = {P("b", "5")}, ko6[] = {P("a", "6")};
    cairn_txn_req t6 = TXN(&never, 1, ok6, 1, ko6, 1);
    cairn_request_op s6[] = {P("a", "4"), T(&t6)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s6, 2, NULL, 0)), CAIRN_EDUPKEY);
    /* etcd: nested delete [a,c) + outer put b -> duplicate */
    cairn_request_op in7[] = {D("a", "c")};
    cairn_txn_req t7 = TXN(NULL, 0, in7, 1, NULL, 0);
    cairn_request_op s7[] = {T(&t7), P("b", "2")};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s7, 2, NULL, 0)), CAIRN_EDUPKEY);
    /* etcd: put b in both branches of one nested txn -> allowed */
    cairn_request_op ok8[] = {P("b", "3")}, ko8[] = {P("b", "4")};
    cairn_txn_req t8 = TXN(NULL, 0, ok8, 1, ko8, 1);
    cairn_request_op s8[] = {T(&t8)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s8, 1, NULL, 0)), 0);
    cairn_txn_resp_destroy(&r);
    /* etcd: put b in two nested txns -> duplicate; outer delete b + nested
     * put b -> duplicate; nested delete b + another nested put b -> duplicate */
    cairn_request_op in9[] = {P("b", "3")}, in9b[] = {P("b", "4")};
    cairn_txn_req t9 = TXN(NULL, 0, in9, 1, NULL, 0), t9b = TXN(NULL, 0, in9b, 1, NULL, 0);
    cairn_request_op s9[] = {T(&t9), T(&t9b)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s9, 2, NULL, 0)), CAIRN_EDUPKEY);
    cairn_request_op s10[] = {D("b", NULL), T(&t9)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s10, 2, NULL, 0)), CAIRN_EDUPKEY);
    cairn_request_op in11[] = {D("b", NULL)};
    cairn_txn_req t11 = TXN(NULL, 0, in11, 1, NULL, 0);
    cairn_request_op s11[] = {T(&t11), T(&t9)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s11, 2, NULL, 0)), CAIRN_EDUPKEY);
    /* etcd: the failure branch is checked statically too: failure {put a,
     * put a} -> duplicate even when success runs */
    cairn_request_op ko12[] = {P("a", "1"), P("a", "2")};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, NULL, 0, ko12, 2)), CAIRN_EDUPKEY);
    ck_assert_int_eq(cur_rev(st), 7);
}
END_TEST

START_TEST(errors_leave_nothing)
{
    cairn_txn_resp r;
    /* etcd: put a=100; put missingkey ignore_value -> "key not found",
     * a unchanged, no revision */
    cairn_request_op s1[] = {P("a", "100"), P("missingkey", "")};
    s1[1].u.put.ignore_value = 1;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s1, 2, NULL, 0)), CAIRN_EKEYNOTFOUND);
    expect_get("a", "1", 2, 2, 1);
    /* etcd: put a; put b with unknown lease 999 -> "requested lease not
     * found", nothing applied */
    cairn_request_op s2[] = {P("a", "100"), P("b", "100")};
    s2[1].u.put.lease = 999;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s2, 2, NULL, 0)), CAIRN_ELEASENOTFOUND);
    expect_get("a", "1", 2, 2, 1);
    /* etcd: inside a txn the key check comes first: put a; put nokey
     * lease 77 ignore_value -> key not found */
    cairn_request_op s3[] = {P("a", "1"), P("nokey", "")};
    s3[1].u.put.lease = 77;
    s3[1].u.put.ignore_value = 1;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s3, 2, NULL, 0)), CAIRN_EKEYNOTFOUND);
    /* etcd: ignore_value with a value -> value is provided */
    cairn_request_op s5[] = {P("a", "x")};
    s5[0].u.put.ignore_value = 1;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s5, 1, NULL, 0)), CAIRN_EVALUEPROVIDED);
    /* etcd: txn range at a future revision -> future revision, even after a
     * write in the same txn; nothing applied */
    cairn_request_op s6[] = {P("a", "7"), G("a")};
    s6[1].u.range.revision = 999;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s6, 2, NULL, 0)), CAIRN_EFUTUREREV);
    expect_get("a", "1", 2, 2, 1);
    /* etcd: a txn range at an old revision reads history: put a=6; get a
     * rev 2 -> a(c2 m2 v1)=1, header 5 */
    cairn_request_op s7[] = {P("a", "6"), G("a")};
    s7[1].u.range.revision = 2;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s7, 2, NULL, 0)), 0);
    ck_assert_int_eq(r.header.revision, 5);
    ck_kv(&r.responses[1].u.range.kvs[0], "a", "1", 2, 2, 1);
    cairn_txn_resp_destroy(&r);
    /* etcd: after compact(3), a txn range at 2 -> compacted, with or
     * without a write */
    cairn_header h;
    ck_assert_int_eq(cairn_store_compact(st, &h, 3, 0), 0);
    cairn_request_op s8[] = {G("a")};
    s8[0].u.range.revision = 2;
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s8, 1, NULL, 0)), CAIRN_ECOMPACTED);
    /* etcd: empty key in a compare or a put -> key is not provided */
    cairn_compare ce = C("", CAIRN_CMP_EQUAL, CAIRN_CMP_VERSION, 0, NULL);
    ck_assert_int_eq(run(&r, TXN(&ce, 1, NULL, 0, NULL, 0)), CAIRN_EEMPTYKEY);
    cairn_request_op s9[] = {P("", "x")};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s9, 1, NULL, 0)), CAIRN_EEMPTYKEY);
    /* etcd: a failing put in the executed failure branch -> key not found */
    cairn_compare cf = C("a", CAIRN_CMP_EQUAL, CAIRN_CMP_VALUE, 0, "nope");
    cairn_request_op ko[] = {P("missingkey", "")};
    ko[0].u.put.ignore_value = 1;
    cairn_request_op ok[] = {G("a")};
    ck_assert_int_eq(run(&r, TXN(&cf, 1, ok, 1, ko, 1)), CAIRN_EKEYNOTFOUND);
    ck_assert_int_eq(cur_rev(st), 5);
}
END_TEST

START_TEST(too_many_ops)
{
    static cairn_request_op ops[200];
    static char keys[200][8];
    for (int i = 0; i < 200; i++) {
        snprintf(keys[i], sizeof keys[i], "k%d", i);
        ops[i] = P(keys[i], "v");
    }
    static cairn_compare cmps[129];
    for (int i = 0; i < 129; i++)
        cmps[i] = C(keys[i], CAIRN_CMP_EQUAL, CAIRN_CMP_VERSION, 0, NULL);
    cairn_txn_resp r;
    /* etcd: 129 puts -> "too many operations in txn request"; 128 fine */
    ck_assert_int_eq(run(&r, TXN(NULL, 0, ops, 129, NULL, 0)), CAIRN_ETOOMANYOPS);
    ck_assert_int_eq(run(&r, TXN(NULL, 0, ops, 128, NULL, 0)), 0);
    ck_assert_int_eq(r.nresponses, 128);
    ck_assert_int_eq(r.header.revision, 5);
    cairn_txn_resp_destroy(&r);
    /* etcd: 129 compares -> too many */
    ck_assert_int_eq(run(&r, TXN(cmps, 129, NULL, 0, NULL, 0)), CAIRN_ETOOMANYOPS);
    /* etcd: 100 success + 100 failure is fine (the largest counts) */
    ck_assert_int_eq(run(&r, TXN(NULL, 0, ops, 100, ops + 100, 100)), 0);
    cairn_txn_resp_destroy(&r);
    /* etcd: a nested txn of 129 -> too many; 100 outer puts + a nested txn
     * of 100 -> too many (the nested one gets 128 - 101) */
    cairn_txn_req t1 = TXN(NULL, 0, ops, 129, NULL, 0);
    cairn_request_op s1[] = {T(&t1)};
    ck_assert_int_eq(run(&r, TXN(NULL, 0, s1, 1, NULL, 0)), CAIRN_ETOOMANYOPS);
    static cairn_request_op outer[101];
    for (int i = 0; i < 100; i++)
        outer[i] = ops[i];
    cairn_txn_req t2 = TXN(NULL, 0, ops + 100, 100, NULL, 0);
    outer[100] = T(&t2);
    ck_assert_int_eq(run(&r, TXN(NULL, 0, outer, 101, NULL, 0)), CAIRN_ETOOMANYOPS);
    /* the limit is an option */
    cairn_store_close(st);
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.max_txn_ops = 4;
    st = open_store_opts(dir, &o);
    ck_assert_int_eq(run(&r, TXN(NULL, 0, ops, 5, NULL, 0)), CAIRN_ETOOMANYOPS);
    ck_assert_int_eq(run(&r, TXN(NULL, 0, ops, 4, NULL, 0)), 0);
    cairn_txn_resp_destroy(&r);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_txn");
    TCase *tc = tcase_create("txn");
    tcase_add_checked_fixture(tc, fixture, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, compares);
    tcase_add_test(tc, one_revision_and_own_writes);
    tcase_add_test(tc, nested);
    tcase_add_test(tc, overlapping_writes);
    tcase_add_test(tc, errors_leave_nothing);
    tcase_add_test(tc, too_many_ops);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
