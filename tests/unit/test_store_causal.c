/*
 * The store's answers to the Replication service (store/causal.c):
 * - revision <-> hash both ways, a change that made no revision, revision
 *   1 and future revisions, a compacted revision;
 * - Range at heads on two replicas that applied concurrent changes in
 *   different orders: the same answer, from history on one and from a
 *   replay on the other; a missing head and the replay bound;
 * - whether acknowledged heads cover a state.
 */

#include "../store/store_test.h"
#include "store/replica.h"
#include "store/store_int.h"

/* The run map both ways, with gaps (changes that made no revision). */
START_TEST(revmap_both_ways)
{
    revmap m;
    ck_assert_int_eq(cairn_revmap_init(&m), 0);
    int64_t rev;
    ck_assert_int_eq(cairn_revmap_rev_of(&m, &rev, 5), 0);
    ck_assert_int_eq(rev, 1); /* nothing made a revision yet: the fresh store's */
    /* index 1 -> rev 2, 2 -> 3, 3 none, 4 none, 5 -> 4, 6 -> 5 */
    ck_assert_int_eq(cairn_revmap_add(&m, 2, 1), 0);
    ck_assert_int_eq(cairn_revmap_add(&m, 3, 2), 0);
    ck_assert_int_eq(cairn_revmap_add(&m, 4, 5), 0);
    ck_assert_int_eq(cairn_revmap_add(&m, 5, 6), 0);
    static const int64_t want[8] = {1, 2, 3, 3, 3, 4, 5, 5};
    static const int took[8] = {0, 1, 1, 0, 0, 1, 1, 0};
    for (uint64_t i = 0; i < 8; i++) {
        ck_assert_int_eq(cairn_revmap_rev_of(&m, &rev, i), took[i]);
        ck_assert_int_eq(rev, want[i]);
        uint64_t back;
        if (took[i]) { /* and back again */
            ck_assert_int_eq(cairn_revmap_find(&m, &back, rev), 0);
            ck_assert_uint_eq(back, i);
        }
    }
    cairn_revmap_destroy(&m);
}
END_TEST

START_TEST(revision_and_hash)
{
    char *d = make_tmpdir();
    captured c = {0};
    cairn_store *s = open_capturing(d, 0x11, &c);
    ck_assert_int_eq(put_kv(s, "a", "1"), 2);
    ck_assert_int_eq(put_kv(s, "b", "2"), 3);
    ck_assert_int_eq(cairn_store_lease_grant(s, 7, 60), 0); /* takes no revision */
    ck_assert_int_eq(put_kv(s, "a", "3"), 4);
    ck_assert_int_eq(c.n, 4);

    cairn_hash h;
    ck_assert_int_eq(cairn_store_rev_to_hash(s, &h, 2), 0);
    ck_assert_mem_eq(h.b, c.hash[0].b, sizeof h.b);
    ck_assert_int_eq(cairn_store_rev_to_hash(s, &h, 4), 0);
    ck_assert_mem_eq(h.b, c.hash[3].b, sizeof h.b);
    ck_assert_int_eq(cairn_store_rev_to_hash(s, &h, 1), CAIRN_ENOTFOUND);
    ck_assert_int_eq(cairn_store_rev_to_hash(s, &h, 5), CAIRN_EFUTUREREV);

    int64_t rev;
    int took;
    ck_assert_int_eq(cairn_store_hash_to_rev(s, &rev, &took, &c.hash[1]), 0);
    ck_assert_int_eq(rev, 3);
    ck_assert_int_eq(took, 1);
    /* the lease grant made none: the revision whose key space it leaves */
    ck_assert_int_eq(cairn_store_hash_to_rev(s, &rev, &took, &c.hash[2]), 0);
    ck_assert_int_eq(rev, 3);
    ck_assert_int_eq(took, 0);
    cairn_hash unknown;
    memset(unknown.b, 0xab, sizeof unknown.b);
    ck_assert_int_eq(cairn_store_hash_to_rev(s, &rev, &took, &unknown), CAIRN_ENOTHERE);

    /* compaction forgets values, not which change made a revision */
    cairn_header hd;
    ck_assert_int_eq(cairn_store_compact(s, &hd, 4, 1), 0);
    ck_assert_int_eq(cairn_store_rev_to_hash(s, &h, 2), 0);
    ck_assert_mem_eq(h.b, c.hash[0].b, sizeof h.b);
    /* and a state before it is still readable at its heads, by replay */
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"a";
    q.key_len = 1;
    cairn_heads_range r;
    ck_assert_int_eq(cairn_store_range_at_heads(s, &r, &c.hash[0], 1, &q, 0, NULL), 0);
    ck_assert_int_eq(r.nkvs, 1);
    ck_assert_int_eq(r.replayed, 1);
    ck_assert_mem_eq(r.kvs[0].value, "1", 1);
    cairn_heads_range_destroy(&r);

    captured_free(&c);
    close_and_remove(s, d);
}
END_TEST

/* Every key in ["", "\0") at |heads| as "k=v;" text. */
static char *dump_at(cairn_store *s, const cairn_hash *heads, size_t n, int *replayed)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"\0";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"\0";
    q.range_end_len = 1;
    cairn_heads_range r;
    int rc = cairn_store_range_at_heads(s, &r, heads, n, &q, 0, NULL);
    ck_assert_msg(rc == 0, "range at heads: %s", cairn_strerror(rc));
    char *out = calloc(1, 4096);
    size_t len = 0;
    for (size_t i = 0; i < r.nkvs; i++)
        len += (size_t)snprintf(out + len, 4096 - len, "%.*s=%.*s;", (int)r.kvs[i].key_len,
                                (const char *)r.kvs[i].key, (int)r.kvs[i].value_len,
                                (const char *)r.kvs[i].value);
    ck_assert_int_eq(r.count, (int64_t)r.nkvs);
    *replayed = r.replayed;
    cairn_heads_range_destroy(&r);
    return out;
}

START_TEST(range_at_heads_same_on_both_orders)
{
    char *da = make_tmpdir(), *db = make_tmpdir();
    captured ca = {0}, cb = {0};
    cairn_store *a = open_capturing(da, 0x11, &ca);
    cairn_store *b = open_capturing(db, 0x22, &cb);
    /* concurrent: a writes x and z, b writes y and z */
    put_kv(a, "x", "ax");
    put_kv(a, "z", "az");
    put_kv(b, "y", "by");
    put_kv(b, "z", "bz");
    ck_assert_int_eq(ca.n, 2);
    ck_assert_int_eq(cb.n, 2);
    cairn_hash a_last = ca.hash[1], b_last = cb.hash[1], a_first = ca.hash[0];
    /* each applies its own first, the other's after: different orders */
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(cairn_store_receive(b, ca.bytes[i], ca.len[i]), 0);
        ck_assert_int_eq(cairn_store_receive(a, cb.bytes[i], cb.len[i]), 0);
    }
    int ra, rb;
    /* a's own state before the merge: history on a, a replay on b */
    char *sa = dump_at(a, &a_last, 1, &ra), *sb = dump_at(b, &a_last, 1, &rb);
    ck_assert_str_eq(sa, "x=ax;z=az;");
    ck_assert_str_eq(sa, sb);
    ck_assert_int_eq(ra, 0);
    ck_assert_int_eq(rb, 1);
    free(sa);
    free(sb);
    /* b's own state: the other way round */
    sa = dump_at(a, &b_last, 1, &ra);
    sb = dump_at(b, &b_last, 1, &rb);
    ck_assert_str_eq(sb, "y=by;z=bz;");
    ck_assert_str_eq(sa, sb);
    ck_assert_int_eq(ra, 1);
    ck_assert_int_eq(rb, 0);
    free(sa);
    free(sb);
    /* a's first change only */
    sa = dump_at(a, &a_first, 1, &ra);
    sb = dump_at(b, &a_first, 1, &rb);
    ck_assert_str_eq(sa, "x=ax;");
    ck_assert_str_eq(sa, sb);
    free(sa);
    free(sb);
    /* both heads: the merged state, the same current value of z on both */
    cairn_hash both[2] = {a_last, b_last};
    if (memcmp(both[0].b, both[1].b, sizeof both[0].b) > 0) {
        both[0] = b_last;
        both[1] = a_last;
    }
    sa = dump_at(a, both, 2, &ra);
    sb = dump_at(b, both, 2, &rb);
    ck_assert_str_eq(sa, sb);
    ck_assert_int_eq(ra, 0); /* the whole of both: a prefix everywhere */
    ck_assert_int_eq(rb, 0);
    free(sa);
    free(sb);

    /* limit and keys_only */
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"a";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"zz";
    q.range_end_len = 2;
    q.limit = 1;
    q.keys_only = 1;
    cairn_heads_range r;
    ck_assert_int_eq(cairn_store_range_at_heads(b, &r, &a_last, 1, &q, 0, NULL), 0);
    ck_assert_int_eq(r.nkvs, 1);
    ck_assert_int_eq(r.count, 2);
    ck_assert_int_eq(r.more, 1);
    ck_assert_ptr_null(r.kvs[0].value);
    ck_assert_mem_eq(r.kvs[0].key, "x", 1);
    cairn_heads_range_destroy(&r);

    /* a head this node lacks names itself; the replay bound */
    cairn_hash missing, unknown[2] = {a_last, a_last};
    memset(unknown[1].b, 0xee, sizeof unknown[1].b);
    ck_assert_int_eq(cairn_store_range_at_heads(a, &r, unknown, 2, &q, 0, &missing),
                     CAIRN_ENOTHERE);
    ck_assert_mem_eq(missing.b, unknown[1].b, sizeof missing.b);
    ck_assert_int_eq(cairn_store_range_at_heads(b, &r, &a_last, 1, &q, 2, NULL), CAIRN_EREPLAY);
    q.key_len = 0;
    ck_assert_int_eq(cairn_store_range_at_heads(b, &r, &a_last, 1, &q, 0, NULL), CAIRN_EEMPTYKEY);

    /* coverage: b's heads hold a's state; a's first alone does not hold b's */
    ck_assert_int_eq(cairn_store_heads_cover(a, &a_last, 1, both, 2), 1);
    ck_assert_int_eq(cairn_store_heads_cover(a, &b_last, 1, &a_first, 1), 0);
    ck_assert_int_eq(cairn_store_heads_cover(a, &a_first, 1, &a_last, 1), 1);
    ck_assert_int_eq(cairn_store_heads_cover(a, &unknown[1], 1, both, 2), 0);
    ck_assert_int_eq(cairn_store_heads_here(a, unknown, 2, &missing), CAIRN_ENOTHERE);
    ck_assert_int_eq(cairn_store_heads_here(a, both, 2, &missing), 0);

    captured_free(&ca);
    captured_free(&cb);
    close_and_remove(a, da);
    close_and_remove(b, db);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_causal");
    TCase *tc = tcase_create("causal");
    tcase_add_test(tc, revmap_both_ways);
    tcase_add_test(tc, revision_and_hash);
    tcase_add_test(tc, range_at_heads_same_on_both_orders);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
