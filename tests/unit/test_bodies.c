/*
 * The store's body loader (the hook the document's DAG reads change bodies
 * through, since it keeps none in memory): every ordered change loads back
 * from its 'O' record and hashes to its id, before and after a reopen; a
 * replica that syncs from the store's document converges on bodies read from
 * disk; a corrupted, truncated or missing 'O' record is CAIRN_ECORRUPT /
 * CAIRN_ENOTFOUND and never served.
 */
#include "../store/store_test.h"
#include "crdt/sync.h"
#include "tests/unit/sync_apply.h"
#include "store/store_int.h"

static void load_all(cairn_store *s)
{
    const cairn_dag *d = cairn_doc_dag(s->doc);
    uint64_t n = cairn_dag_count(d);
    ck_assert_uint_gt(n, 1);
    for (uint64_t i = 0; i < n; i++) {
        cairn_change *c = NULL;
        ck_assert_int_eq(cairn_dag_load(&c, d, i), 0);
        ck_assert_mem_eq(c->hash.b, cairn_dag_hash_at(d, i)->b, CAIRN_HASH_LEN);
        cairn_change_free(c);
    }
}

/* Syncs a fresh in-memory replica from the store's document (nothing flows
 * back: the replica makes no changes) and checks it has the same state. */
static void sync_replica_from(cairn_store *s)
{
    cairn_actor ra;
    memset(ra.b, 0x77, sizeof ra.b);
    cairn_doc *r;
    ck_assert_int_eq(cairn_doc_new(&r, &ra), 0);
    cairn_sync_state *ss, *sr;
    ck_assert_int_eq(cairn_sync_state_new(&ss, NULL), 0);
    ck_assert_int_eq(cairn_sync_state_new(&sr, NULL), 0);
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {1};
    for (int round = 0; round < 10; round++) {
        uint8_t *m = NULL;
        size_t len = 0;
        int any = 0;
        ck_assert_int_eq(cairn_sync_generate(&m, &len, s->doc, ss, salt), 0);
        if (m) {
            any = 1;
            ck_assert_int_eq(sync_apply(r, sr, m, len, NULL), 0);
            free(m);
        }
        ck_assert_int_eq(cairn_sync_generate(&m, &len, r, sr, salt), 0);
        if (m) {
            any = 1;
            ck_assert_int_eq(sync_apply(s->doc, ss, m, len, NULL), 0);
            free(m);
        }
        if (!any)
            break;
    }
    uint8_t *da, *db;
    size_t la, lb;
    ck_assert_int_eq(cairn_doc_dump(&da, &la, s->doc), 0);
    ck_assert_int_eq(cairn_doc_dump(&db, &lb, r), 0);
    ck_assert_uint_eq(la, lb);
    ck_assert(memcmp(da, db, la) == 0);
    free(da);
    free(db);
    cairn_sync_state_free(ss);
    cairn_sync_state_free(sr);
    cairn_doc_free(r);
}

static void put_record(cairn_store *s, uint64_t index, const uint8_t *v, size_t vl)
{
    uint8_t k[9];
    k[0] = 'O';
    cairn_store_be64(k + 1, index);
    char *err = NULL;
    leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
    if (v)
        leveldb_put(s->db, wo, (const char *)k, 9, (const char *)v, vl, &err);
    else
        leveldb_delete(s->db, wo, (const char *)k, 9, &err);
    leveldb_writeoptions_destroy(wo);
    ck_assert_ptr_null(err);
}

START_TEST(bodies_come_from_disk)
{
    char *dir = make_tmpdir();
    cairn_store *s = open_store(dir);
    char k[32], v[64];
    for (int i = 0; i < 40; i++) {
        snprintf(k, sizeof k, "key-%02d", i % 25);
        snprintf(v, sizeof v, "value %d of a key, padded out a little", i);
        put_kv(s, k, v);
    }
    /* the genesis, the initial members and the 40 puts */
    ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(s->doc)), 42);
    load_all(s);
    sync_replica_from(s);
    cairn_store_close(s);

    /* after a reopen (replay), the loader is in place again */
    s = open_store(dir);
    ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(s->doc)), 42);
    load_all(s);
    sync_replica_from(s);
    const cairn_dag *d = cairn_doc_dag(s->doc);

    /* a flipped bit in a stored body */
    uint8_t *b;
    size_t bl;
    ck_assert_int_eq(cairn_dag_load_bytes(&b, &bl, d, 5), 0);
    uint8_t *rec = malloc(8 + bl);
    ck_assert_ptr_nonnull(rec);
    memset(rec, 0, 8);
    memcpy(rec + 8, b, bl);
    rec[8 + bl / 2] ^= 0x04;
    put_record(s, 5, rec, 8 + bl);
    cairn_change *c = (cairn_change *)1;
    ck_assert_int_eq(cairn_dag_load(&c, d, 5), CAIRN_ECORRUPT);
    ck_assert_ptr_null(c);
    /* a truncated record */
    put_record(s, 6, rec, 8);
    ck_assert_int_eq(cairn_dag_load(&c, d, 6), CAIRN_ECORRUPT);
    /* another change's body under this index */
    memcpy(rec + 8, b, bl);
    put_record(s, 7, rec, 8 + bl);
    ck_assert_int_eq(cairn_dag_load(&c, d, 7), CAIRN_ECORRUPT);
    /* a missing record */
    put_record(s, 8, NULL, 0);
    ck_assert_int_eq(cairn_dag_load(&c, d, 8), CAIRN_ENOTFOUND);
    ck_assert_int_eq(cairn_dag_load(&c, d, 9), 0);
    cairn_change_free(c);
    free(rec);
    free(b);
    cairn_store_close(s);
    rm_rf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("bodies");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, bodies_come_from_disk);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
