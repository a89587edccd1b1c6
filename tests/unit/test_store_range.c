/*
 * Range, Put and DeleteRange rules of the store, each written from what
 * etcd 3.4.23 answered (probed through its gRPC gateway on 127.0.0.1; the
 * measured answer is quoted next to each assertion as "etcd:").
 *
 * Fixture, as probed on etcd: put a=1 (rev 2), b=2 (3), c=3 (4), b=22 (5),
 * delete c (6), put d=4 (7), a=11 (8).
 */

#include "../store/store_test.h"

static char *dir;
static cairn_store *st;

static void fixture(void)
{
    dir = make_tmpdir();
    st = open_store(dir);
    /* etcd: a fresh store is at revision 1 */
    ck_assert_int_eq(cur_rev(st), 1);
    ck_assert_int_eq(put_kv(st, "a", "1"), 2);
    ck_assert_int_eq(put_kv(st, "b", "2"), 3);
    ck_assert_int_eq(put_kv(st, "c", "3"), 4);
    ck_assert_int_eq(put_kv(st, "b", "22"), 5);
    int64_t rev;
    ck_assert_int_eq(del_range(st, "c", NULL, &rev), 1);
    ck_assert_int_eq(rev, 6);
    ck_assert_int_eq(put_kv(st, "d", "4"), 7);
    ck_assert_int_eq(put_kv(st, "a", "11"), 8);
}

static void teardown(void)
{
    cairn_store_close(st);
    rm_rf(dir);
    free(dir);
}

static int rng(cairn_range_resp *r, const cairn_range_req *q)
{
    return cairn_store_range(st, r, q);
}

static cairn_range_req from(const char *k, const char *end)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)k;
    q.key_len = strlen(k);
    if (end) {
        q.range_end = (const uint8_t *)(end[0] ? end : "\0");
        q.range_end_len = end[0] ? strlen(end) : 1;
    }
    return q;
}

START_TEST(single_and_ranges)
{
    cairn_range_resp r;
    cairn_range_req q = from("a", "c");
    /* etcd: [a,c) -> a(c2,m8,v2)=11 b(c3,m5,v2)=22 count 2, header 8 */
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.header.revision, 8);
    ck_assert_int_eq(r.nkvs, 2);
    ck_assert_int_eq(r.count, 2);
    ck_assert_int_eq(r.more, 0);
    ck_kv(&r.kvs[0], "a", "11", 2, 8, 2);
    ck_kv(&r.kvs[1], "b", "22", 3, 5, 2);
    cairn_range_resp_destroy(&r);

    /* etcd: from "a" with range_end "\0" -> a, b, d */
    q = from("a", "");
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 3);
    ck_kv(&r.kvs[2], "d", "4", 7, 7, 1);
    cairn_range_resp_destroy(&r);

    /* etcd: key "\0" range_end "\0" -> every key */
    q = from("", "");
    q.key = (const uint8_t *)"\0";
    q.key_len = 1;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.count, 3);
    cairn_range_resp_destroy(&r);

    /* etcd: single key; a missing key -> no kvs, no count */
    q = from("b", NULL);
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 1);
    ck_kv(&r.kvs[0], "b", "22", 3, 5, 2);
    cairn_range_resp_destroy(&r);
    q = from("zz", NULL);
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 0);
    ck_assert_int_eq(r.count, 0);
    cairn_range_resp_destroy(&r);
    /* a deleted key is absent; a prefix of an existing key does not match */
    q = from("c", NULL);
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 0);
    cairn_range_resp_destroy(&r);
    put_kv(st, "abc", "x");
    q = from("ab", NULL);
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 0);
    cairn_range_resp_destroy(&r);

    /* etcd: reversed range [c,a) -> empty */
    q = from("c", "a");
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 0);
    ck_assert_int_eq(r.count, 0);
    cairn_range_resp_destroy(&r);

    /* etcd: empty key -> "etcdserver: key is not provided" (InvalidArgument) */
    q = from("", NULL);
    ck_assert_int_eq(rng(&r, &q), CAIRN_EEMPTYKEY);
}
END_TEST

START_TEST(limit_count_keys_only)
{
    cairn_range_resp r;
    cairn_range_req q = from("a", "");
    q.limit = 1;
    /* etcd: limit 1 -> [a], more true, count 3 */
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 1);
    ck_assert_int_eq(r.more, 1);
    ck_assert_int_eq(r.count, 3);
    cairn_range_resp_destroy(&r);
    /* etcd: limit 3 (= all) -> more false */
    q.limit = 3;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 3);
    ck_assert_int_eq(r.more, 0);
    cairn_range_resp_destroy(&r);
    /* etcd: limit -1 behaves as no limit */
    q.limit = -1;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 3);
    cairn_range_resp_destroy(&r);
    /* etcd: count_only -> count 3, no kvs; with limit 1 still count 3, no more */
    q.limit = 1;
    q.count_only = 1;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 0);
    ck_assert_int_eq(r.count, 3);
    ck_assert_int_eq(r.more, 0);
    cairn_range_resp_destroy(&r);
    /* etcd: keys_only -> metadata without values */
    q = from("a", "");
    q.keys_only = 1;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 3);
    ck_kv(&r.kvs[0], "a", NULL, 2, 8, 2);
    ck_assert_int_eq(r.kvs[0].value_len, 0);
    cairn_range_resp_destroy(&r);
}
END_TEST

static void expect_order(int order, int target, const char *want, int64_t limit, int more)
{
    cairn_range_resp r;
    cairn_range_req q = from("a", "");
    q.sort_order = order;
    q.sort_target = target;
    q.keys_only = 1;
    q.limit = limit;
    ck_assert_int_eq(rng(&r, &q), 0);
    char got[8] = {0};
    for (size_t i = 0; i < r.nkvs && i < 7; i++)
        got[i] = (char)r.kvs[i].key[0];
    ck_assert_msg(strcmp(got, want) == 0, "order %d target %d: got %s want %s", order, target, got,
                  want);
    ck_assert_int_eq(r.more, more);
    ck_assert_int_eq(r.count, 3);
    cairn_range_resp_destroy(&r);
}

START_TEST(sorting)
{
    /* etcd (a: v2 c2 m8 "11", b: v2 c3 m5 "22", d: v1 c7 m7 "4"):
     * KEY asc abd, desc dba; VERSION asc dab, desc abd; CREATE asc abd,
     * desc dba; MOD asc bda, desc adb; VALUE asc abd ("11"<"22"<"4"),
     * desc dba; order NONE with target MOD sorts ascending: bda. */
    expect_order(CAIRN_SORT_ASCEND, CAIRN_SORT_KEY, "abd", 0, 0);
    expect_order(CAIRN_SORT_DESCEND, CAIRN_SORT_KEY, "dba", 0, 0);
    expect_order(CAIRN_SORT_ASCEND, CAIRN_SORT_VERSION, "dab", 0, 0);
    expect_order(CAIRN_SORT_DESCEND, CAIRN_SORT_VERSION, "abd", 0, 0);
    expect_order(CAIRN_SORT_ASCEND, CAIRN_SORT_CREATE, "abd", 0, 0);
    expect_order(CAIRN_SORT_DESCEND, CAIRN_SORT_CREATE, "dba", 0, 0);
    expect_order(CAIRN_SORT_ASCEND, CAIRN_SORT_MOD, "bda", 0, 0);
    expect_order(CAIRN_SORT_DESCEND, CAIRN_SORT_MOD, "adb", 0, 0);
    expect_order(CAIRN_SORT_ASCEND, CAIRN_SORT_VALUE, "abd", 0, 0);
    expect_order(CAIRN_SORT_DESCEND, CAIRN_SORT_VALUE, "dba", 0, 0);
    expect_order(CAIRN_SORT_NONE, CAIRN_SORT_MOD, "bda", 0, 0);
    /* etcd: DESCEND by key with limit 1 -> [d], more, count 3 */
    expect_order(CAIRN_SORT_DESCEND, CAIRN_SORT_KEY, "d", 1, 1);
    /* etcd: ASCEND by version, limit 2 -> [d, a], more */
    expect_order(CAIRN_SORT_ASCEND, CAIRN_SORT_VERSION, "da", 2, 1);
    /* etcd's odd corner: target MOD with order NONE and limit fetches
     * limit+1 keys in key order, THEN sorts and truncates: limit 1 -> [b]
     * (from a, b), more; limit 2 -> [b, d] (from a, b, d), more */
    expect_order(CAIRN_SORT_NONE, CAIRN_SORT_MOD, "b", 1, 1);
    expect_order(CAIRN_SORT_NONE, CAIRN_SORT_MOD, "bd", 2, 1);
}
END_TEST

static void expect_at(int64_t rev, const char *keys)
{
    cairn_range_resp r;
    cairn_range_req q = from("a", "");
    q.revision = rev;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.header.revision, cur_rev(st));
    char got[8] = {0};
    for (size_t i = 0; i < r.nkvs && i < 7; i++)
        got[i] = (char)r.kvs[i].key[0];
    ck_assert_msg(strcmp(got, keys) == 0, "rev %lld: got %s want %s", (long long)rev, got, keys);
    ck_assert_int_eq(r.count, (int64_t)strlen(keys));
    cairn_range_resp_destroy(&r);
}

START_TEST(history)
{
    /* etcd: rev 1 -> nothing; 2 -> a; 3 -> a b; 4 -> a b c; 5 -> a b(22) c;
     * 6 -> a b; 7 -> a b d; 8 -> a(11) b d; header is always the current 8 */
    expect_at(1, "");
    expect_at(2, "a");
    expect_at(3, "ab");
    expect_at(4, "abc");
    expect_at(5, "abc");
    expect_at(6, "ab");
    expect_at(7, "abd");
    expect_at(8, "abd");
    expect_at(-1, "abd"); /* etcd: a negative revision reads the current one */
    cairn_range_resp r;
    cairn_range_req q = from("a", "");
    q.revision = 5;
    ck_assert_int_eq(rng(&r, &q), 0);
    /* etcd at 5: a(c2,m2,v1)=1 b(c3,m5,v2)=22 c(c4,m4,v1)=3 */
    ck_kv(&r.kvs[0], "a", "1", 2, 2, 1);
    ck_kv(&r.kvs[1], "b", "22", 3, 5, 2);
    ck_kv(&r.kvs[2], "c", "3", 4, 4, 1);
    cairn_range_resp_destroy(&r);
    /* etcd: revision 9 -> "mvcc: required revision is a future revision" */
    q.revision = 9;
    ck_assert_int_eq(rng(&r, &q), CAIRN_EFUTUREREV);
    /* etcd: after deleting [a,c) at 9, reading at 8 still gives a b d */
    ck_assert_int_eq(del_range(st, "a", "c", NULL), 2);
    expect_at(8, "abd");
    expect_at(9, "d");
}
END_TEST

START_TEST(filters_do_not_change_count)
{
    cairn_range_resp r;
    cairn_range_req q = from("a", "");
    struct {
        int64_t minm, maxm, minc, maxc, limit;
        const char *keys;
        int more;
    } cases[] = {
        /* etcd: min_mod 6 -> a d, count 3 */
        {6, 0, 0, 0, 0, "ad", 0},
        /* etcd: max_mod 6 -> b, count 3 */
        {0, 6, 0, 0, 0, "b", 0},
        /* etcd: min_create 3 -> b d, count 3 */
        {0, 0, 3, 0, 0, "bd", 0},
        /* etcd: max_create 3 -> a b, count 3 */
        {0, 0, 0, 3, 0, "ab", 0},
        /* etcd: min_mod 6 limit 1 -> a, more true */
        {6, 0, 0, 0, 1, "a", 1},
        /* etcd: max_mod 6 limit 1 -> b, more FALSE (filters apply before limit) */
        {0, 6, 0, 0, 1, "b", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        q.min_mod_revision = cases[i].minm;
        q.max_mod_revision = cases[i].maxm;
        q.min_create_revision = cases[i].minc;
        q.max_create_revision = cases[i].maxc;
        q.limit = cases[i].limit;
        ck_assert_int_eq(rng(&r, &q), 0);
        char got[8] = {0};
        for (size_t j = 0; j < r.nkvs && j < 7; j++)
            got[j] = (char)r.kvs[j].key[0];
        ck_assert_msg(strcmp(got, cases[i].keys) == 0, "case %zu: %s", i, got);
        ck_assert_int_eq(r.count, 3);
        ck_assert_int_eq(r.more, cases[i].more);
        cairn_range_resp_destroy(&r);
    }
    /* etcd: min_mod 6 count_only -> count 3 */
    q = from("a", "");
    q.min_mod_revision = 6;
    q.count_only = 1;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.count, 3);
    cairn_range_resp_destroy(&r);
    /* etcd: min_mod 6 at revision 7 -> d only, count 3 */
    q.count_only = 0;
    q.revision = 7;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 1);
    ck_kv(&r.kvs[0], "d", "4", 7, 7, 1);
    ck_assert_int_eq(r.count, 3);
    cairn_range_resp_destroy(&r);
}
END_TEST

START_TEST(puts_and_deletes)
{
    int64_t rev;
    /* etcd: deleting a missing key -> deleted 0, no new revision (8) */
    ck_assert_int_eq(del_range(st, "zz", NULL, &rev), 0);
    ck_assert_int_eq(rev, 8);
    ck_assert_int_eq(cur_rev(st), 8);
    /* etcd: delete [a,c) prev_kv -> rev 9, deleted 2, prev a(c2 m8 v2)=11, b(c3 m5 v2)=22 */
    cairn_delete_req d = {0};
    d.key = (const uint8_t *)"a";
    d.key_len = 1;
    d.range_end = (const uint8_t *)"c";
    d.range_end_len = 1;
    d.prev_kv = 1;
    cairn_delete_resp dr;
    ck_assert_int_eq(cairn_store_delete(st, &dr, &d), 0);
    ck_assert_int_eq(dr.header.revision, 9);
    ck_assert_int_eq(dr.deleted, 2);
    ck_assert_int_eq(dr.nprev_kvs, 2);
    ck_kv(&dr.prev_kvs[0], "a", "11", 2, 8, 2);
    ck_kv(&dr.prev_kvs[1], "b", "22", 3, 5, 2);
    cairn_delete_resp_destroy(&dr);
    /* etcd: re-creating a: create 10, version 1 */
    ck_assert_int_eq(put_kv(st, "a", "x"), 10);
    cairn_range_resp r;
    cairn_range_req q = from("a", NULL);
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_kv(&r.kvs[0], "a", "x", 10, 10, 1);
    cairn_range_resp_destroy(&r);
    /* etcd: putting the same value again is a new revision: m11 v2 */
    ck_assert_int_eq(put_kv(st, "a", "x"), 11);
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_kv(&r.kvs[0], "a", "x", 10, 11, 2);
    cairn_range_resp_destroy(&r);

    /* etcd: put prev_kv -> prev a(c10 m11 v2)=x; on a new key no prev_kv */
    cairn_put_req p = {0};
    p.key = (const uint8_t *)"a";
    p.key_len = 1;
    p.value = (const uint8_t *)"y";
    p.value_len = 1;
    p.prev_kv = 1;
    cairn_put_resp pr;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), 0);
    ck_assert_int_eq(pr.header.revision, 12);
    ck_assert_ptr_nonnull(pr.prev_kv);
    ck_kv(pr.prev_kv, "a", "x", 10, 11, 2);
    cairn_put_resp_destroy(&pr);
    p.key = (const uint8_t *)"nn";
    p.key_len = 2;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), 0);
    ck_assert_ptr_null(pr.prev_kv);
    cairn_put_resp_destroy(&pr);

    /* etcd: ignore_value on a missing key -> "etcdserver: key not found" */
    memset(&p, 0, sizeof p);
    p.key = (const uint8_t *)"missing";
    p.key_len = 7;
    p.ignore_value = 1;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), CAIRN_EKEYNOTFOUND);
    ck_assert_int_eq(cur_rev(st), 13);
    /* etcd: ignore_value on a -> rev 14, value kept, v4 */
    p.key = (const uint8_t *)"a";
    p.key_len = 1;
    p.prev_kv = 1;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), 0);
    ck_assert_int_eq(pr.header.revision, 14);
    ck_kv(pr.prev_kv, "a", "y", 10, 12, 3);
    cairn_put_resp_destroy(&pr);
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_kv(&r.kvs[0], "a", "y", 10, 14, 4);
    cairn_range_resp_destroy(&r);
    /* etcd: ignore_value with a value -> "etcdserver: value is provided" */
    p.value = (const uint8_t *)"v";
    p.value_len = 1;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), CAIRN_EVALUEPROVIDED);
    /* etcd: ignore_lease on a missing key -> key not found; with a lease ->
     * "etcdserver: lease is provided" */
    memset(&p, 0, sizeof p);
    p.key = (const uint8_t *)"missing";
    p.key_len = 7;
    p.value = (const uint8_t *)"v";
    p.value_len = 1;
    p.ignore_lease = 1;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), CAIRN_EKEYNOTFOUND);
    p.lease = 5;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), CAIRN_ELEASEPROVIDED);
    /* etcd: an unknown lease -> "etcdserver: requested lease not found"
     * (NotFound), checked before the key for a plain Put */
    memset(&p, 0, sizeof p);
    p.key = (const uint8_t *)"missing";
    p.key_len = 7;
    p.lease = 12345;
    p.ignore_value = 1;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), CAIRN_ELEASENOTFOUND);
    /* etcd: empty key on put / delete -> key is not provided */
    p.key_len = 0;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), CAIRN_EEMPTYKEY);
    d.key_len = 0;
    ck_assert_int_eq(cairn_store_delete(st, &dr, &d), CAIRN_EEMPTYKEY);
    ck_assert_int_eq(cur_rev(st), 14);
}
END_TEST

START_TEST(leases)
{
    /* a granted lease can be attached; ignore_lease keeps it; revoking
     * deletes the key at a new revision */
    ck_assert_int_eq(cairn_store_lease_grant(st, 77, 60), 0);
    ck_assert_int_eq(cairn_store_lease_grant(st, 77, 60), CAIRN_ELEASEEXIST);
    ck_assert_int_eq(cur_rev(st), 8); /* a lease takes no revision */
    cairn_put_req p = {0};
    p.key = (const uint8_t *)"L";
    p.key_len = 1;
    p.value = (const uint8_t *)"v";
    p.value_len = 1;
    p.lease = 77;
    cairn_put_resp pr;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), 0);
    cairn_put_resp_destroy(&pr);
    p.lease = 0;
    p.ignore_lease = 1;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), 0);
    cairn_put_resp_destroy(&pr);
    cairn_range_resp r;
    cairn_range_req q = from("L", NULL);
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.kvs[0].lease, 77);
    ck_kv(&r.kvs[0], "L", "v", 9, 10, 2);
    cairn_range_resp_destroy(&r);
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 77), 0);
    ck_assert_int_eq(h.revision, 11);
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 0);
    cairn_range_resp_destroy(&r);
    ck_assert_int_eq(cairn_store_lease_revoke(st, &h, 77), CAIRN_ELEASENOTFOUND);
}
END_TEST

START_TEST(compaction)
{
    cairn_header h;
    /* etcd on this fixture: compact(0) and compact(1) succeed once each
     * (nothing was compacted yet); compact(1) again -> compacted */
    ck_assert_int_eq(cairn_store_compact(st, &h, 0, 0), 0);
    ck_assert_int_eq(cairn_store_compact(st, &h, 1, 0), 0);
    ck_assert_int_eq(cairn_store_compact(st, &h, 1, 0), CAIRN_ECOMPACTED);
    cairn_range_resp r;
    cairn_range_req q = from("a", NULL);
    /* etcd: compact 3 ok; again 3 or 2 -> compacted; 1000 -> future */
    ck_assert_int_eq(cairn_store_compact(st, &h, 3, 0), 0);
    ck_assert_int_eq(h.revision, 8);
    ck_assert_int_eq(cairn_store_compact(st, &h, 3, 0), CAIRN_ECOMPACTED);
    ck_assert_int_eq(cairn_store_compact(st, &h, 2, 0), CAIRN_ECOMPACTED);
    ck_assert_int_eq(cairn_store_compact(st, &h, 1000, 0), CAIRN_EFUTUREREV);
    /* etcd: reading at the compacted revision works; below it ->
     * "mvcc: required revision has been compacted" (OutOfRange), also with
     * count_only */
    q.revision = 3;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_kv(&r.kvs[0], "a", "1", 2, 2, 1);
    cairn_range_resp_destroy(&r);
    q.revision = 2;
    ck_assert_int_eq(rng(&r, &q), CAIRN_ECOMPACTED);
    q.count_only = 1;
    ck_assert_int_eq(rng(&r, &q), CAIRN_ECOMPACTED);
    /* history above the compaction point is intact */
    expect_at(5, "abc");
    expect_at(4, "abc");
    /* compact to the current revision: reading at it works, below fails;
     * etcd: compact(current+1) -> future, compact(0) after that -> compacted */
    ck_assert_int_eq(cairn_store_compact(st, &h, 8, 1), 0);
    expect_at(8, "abd");
    q.count_only = 0;
    q.revision = 7;
    ck_assert_int_eq(rng(&r, &q), CAIRN_ECOMPACTED);
    ck_assert_int_eq(cairn_store_compact(st, &h, 9, 0), CAIRN_EFUTUREREV);
    ck_assert_int_eq(cairn_store_compact(st, &h, 0, 0), CAIRN_ECOMPACTED);
    /* the current state is untouched */
    expect_at(0, "abd");
    /* and survives a reopen */
    cairn_store_close(st);
    st = open_store(dir);
    ck_assert_int_eq(cairn_store_compacted_rev(st), 8);
    expect_at(8, "abd");
    q.revision = 7;
    ck_assert_int_eq(rng(&r, &q), CAIRN_ECOMPACTED);
}
END_TEST

START_TEST(identity)
{
    /* etcd 3.4 with --initial-cluster default=http://127.0.0.1:27382 and the
     * default token answered member_id 10243851325789666559 and cluster_id
     * 5859174340979111270. */
    const char *urls[] = {"http://127.0.0.1:27382"};
    uint64_t m = cairn_store_member_id_of(urls, 1, "etcd-cluster");
    ck_assert_uint_eq(m, 10243851325789666559ull);
    ck_assert_uint_eq(cairn_store_cluster_id_of(&m, 1), 5859174340979111270ull);
    char *d2 = make_tmpdir();
    cairn_store_options o;
    cairn_store_options_init(&o);
    cairn_store_member mem = {"default", urls, 1};
    o.initial_cluster = &mem;
    o.ninitial_cluster = 1;
    cairn_store *s2 = open_store_opts(d2, &o);
    cairn_header h;
    cairn_store_header(s2, &h);
    ck_assert_uint_eq(h.member_id, 10243851325789666559ull);
    ck_assert_uint_eq(h.cluster_id, 5859174340979111270ull);
    ck_assert_int_eq(h.revision, 1);
    cairn_actor a1, a2;
    cairn_store_actor(s2, &a1);
    cairn_store_close(s2);
    /* reopening with other options keeps the stored identity */
    cairn_store_options_init(&o);
    s2 = open_store_opts(d2, &o);
    cairn_store_header(s2, &h);
    ck_assert_uint_eq(h.member_id, 10243851325789666559ull);
    cairn_store_actor(s2, &a2);
    ck_assert_mem_eq(a1.b, a2.b, CAIRN_ACTOR_LEN);
    cairn_store_close(s2);
    /* a name that is not in the initial cluster is refused */
    char *d3 = make_tmpdir();
    cairn_store_options_init(&o);
    o.dir = d3;
    o.name = "other";
    o.initial_cluster = &mem;
    o.ninitial_cluster = 1;
    ck_assert_int_eq(cairn_store_open(&s2, &o), CAIRN_EINVAL);
    rm_rf(d2);
    rm_rf(d3);
    free(d2);
    free(d3);
}
END_TEST

typedef struct hist_log {
    char text[512];
    int64_t revs[32];
    int n;
} hist_log;

static int log_hist(void *arg, int64_t rev, const cairn_event *ev, size_t nev)
{
    hist_log *l = arg;
    l->revs[l->n++] = rev;
    char *t = l->text + strlen(l->text);
    for (size_t i = 0; i < nev; i++) {
        ck_assert_int_eq(ev[i].kv.mod_revision, rev);
        t += sprintf(t, "%lld%s%.*s%s%.*s ", (long long)rev,
                     ev[i].type == CAIRN_EVENT_PUT ? "+" : "-", (int)ev[i].kv.key_len,
                     (const char *)ev[i].kv.key, ev[i].type == CAIRN_EVENT_PUT ? "=" : "",
                     (int)ev[i].kv.value_len, ev[i].kv.value ? (const char *)ev[i].kv.value : "");
    }
    return 0;
}

START_TEST(history_for_watchers)
{
    hist_log l = {0};
    int64_t last;
    /* every event from revision 1, in order */
    ck_assert_int_eq(
        cairn_store_history(st, &last, 1, B("\0"), (const uint8_t *)"\0", 1, log_hist, &l), 0);
    ck_assert_str_eq(l.text, "2+a=1 3+b=2 4+c=3 5+b=22 6-c 7+d=4 8+a=11 ");
    ck_assert_int_eq(last, 8);
    /* one key, from 4 */
    memset(&l, 0, sizeof l);
    ck_assert_int_eq(cairn_store_history(st, &last, 4, B("b"), NULL, 0, log_hist, &l), 0);
    ck_assert_str_eq(l.text, "5+b=22 ");
    /* a txn's events share its revision and keep the order it wrote them
     * in (etcd: txn{put z, put y, delete a}; watch --prefix --rev=3 "" ->
     * PUT z, PUT y, DELETE a) */
    cairn_request_op ops[3] = {{0}, {0}, {0}};
    ops[0].type = ops[1].type = CAIRN_REQ_PUT;
    ops[0].u.put.key = (const uint8_t *)"z";
    ops[0].u.put.key_len = 1;
    ops[0].u.put.value = (const uint8_t *)"1";
    ops[0].u.put.value_len = 1;
    ops[1].u.put = ops[0].u.put;
    ops[1].u.put.key = (const uint8_t *)"y";
    ops[2].type = CAIRN_REQ_DELETE;
    ops[2].u.del.key = (const uint8_t *)"a";
    ops[2].u.del.key_len = 1;
    cairn_txn_req t = {NULL, 0, ops, 3, NULL, 0};
    cairn_txn_resp tr;
    ck_assert_int_eq(cairn_store_txn(st, &tr, &t), 0);
    cairn_txn_resp_destroy(&tr);
    memset(&l, 0, sizeof l);
    ck_assert_int_eq(
        cairn_store_history(st, &last, 9, B("\0"), (const uint8_t *)"\0", 1, log_hist, &l), 0);
    ck_assert_str_eq(l.text, "9+z=1 9+y=1 9-a ");
    ck_assert_int_eq(l.n, 1);
    /* after compact(6): from 5 -> compacted; from 6 the delete of c made AT
     * 6 is gone (etcd: put x (2), delete x (3), compact 3, watch --rev=3 x
     * -> no event; --rev=2 -> "required revision has been compacted") */
    cairn_header h;
    ck_assert_int_eq(cairn_store_compact(st, &h, 6, 1), 0);
    ck_assert_int_eq(
        cairn_store_history(st, &last, 5, B("\0"), (const uint8_t *)"\0", 1, log_hist, &l),
        CAIRN_ECOMPACTED);
    memset(&l, 0, sizeof l);
    ck_assert_int_eq(
        cairn_store_history(st, &last, 6, B("\0"), (const uint8_t *)"\0", 1, log_hist, &l), 0);
    ck_assert_str_eq(l.text, "7+d=4 8+a=11 9+z=1 9+y=1 9-a ");
    /* and c is still absent at every readable revision */
    cairn_range_resp r;
    cairn_range_req q = from("c", NULL);
    q.revision = 6;
    ck_assert_int_eq(rng(&r, &q), 0);
    ck_assert_int_eq(r.nkvs, 0);
    cairn_range_resp_destroy(&r);
    /* a later compaction keeps each key's last live state */
    ck_assert_int_eq(cairn_store_compact(st, &h, 8, 1), 0);
    memset(&l, 0, sizeof l);
    ck_assert_int_eq(
        cairn_store_history(st, &last, 8, B("\0"), (const uint8_t *)"\0", 1, log_hist, &l), 0);
    ck_assert_str_eq(l.text, "8+a=11 9+z=1 9+y=1 9-a ");
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_range");
    TCase *tc = tcase_create("range");
    tcase_add_checked_fixture(tc, fixture, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, single_and_ranges);
    tcase_add_test(tc, limit_count_keys_only);
    tcase_add_test(tc, sorting);
    tcase_add_test(tc, history);
    tcase_add_test(tc, filters_do_not_change_count);
    tcase_add_test(tc, puts_and_deletes);
    tcase_add_test(tc, leases);
    tcase_add_test(tc, compaction);
    tcase_add_test(tc, identity);
    tcase_add_test(tc, history_for_watchers);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
