/*
 * Readers never block the writer. A Range holds the store's lock only to
 * take its view (the index walk, the values memory holds, a LevelDB
 * snapshot); it reads history records and builds its response after. The
 * store's range_view_cb hook runs in that window, so a test can stall a
 * reader there: a Put, a Txn and a compaction that deletes the very records
 * the reader is about to read must all complete meanwhile, and the reader
 * must still answer with the state at its revision. The stress test runs
 * writers (two keys per txn, one value) against readers at the current and
 * at older revisions, with a compactor beside them: every read must see
 * both keys of every pair, with one value and one mod revision.
 */

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "../store/store_test.h"

/* ---- a reader stalled in its view window ------------------------------------ */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static _Atomic int armed; /* the next range to reach the hook stalls */
static int stalled, released;

static void stall_hook(void *arg)
{
    (void)arg;
    if (!atomic_exchange(&armed, 0))
        return;
    pthread_mutex_lock(&mu);
    stalled = 1;
    pthread_cond_broadcast(&cv);
    while (!released)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

/* Waits (bounded) until *flag is set under mu; 1 if it was. */
static int wait_flag(int *flag, int secs)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += secs;
    pthread_mutex_lock(&mu);
    int rc = 0;
    while (!*flag && rc == 0)
        rc = pthread_cond_timedwait(&cv, &mu, &dl);
    int ok = *flag;
    pthread_mutex_unlock(&mu);
    return ok;
}

static cairn_store *st;

typedef struct reader_job {
    int64_t revision;
    int rc;
    cairn_range_resp resp;
} reader_job;

static void *reader_main(void *arg)
{
    reader_job *j = arg;
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"a";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"c";
    q.range_end_len = 1;
    q.revision = j->revision;
    j->rc = cairn_store_range(st, &j->resp, &q);
    return NULL;
}

/* A put and a compaction to the put's revision, on a thread of their own
 * so that a writer stuck behind the reader shows as a timeout. */
static int writer_done;
static int64_t writer_rev;
static int writer_rc;

static void *writer_main(void *arg)
{
    (void)arg;
    int64_t rev = put_kv(st, "a", "3");
    cairn_header h;
    int rc = cairn_store_compact(st, &h, rev, 0);
    pthread_mutex_lock(&mu);
    writer_rev = rev;
    writer_rc = rc;
    writer_done = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void stalled_reader_case(int64_t at)
{
    char *dir;
    st = open_store_hooked(&dir, NULL, stall_hook);
    ck_assert_int_eq(put_kv(st, "a", "1"), 2);
    ck_assert_int_eq(put_kv(st, "b", "1"), 3);
    ck_assert_int_eq(put_kv(st, "a", "2"), 4);
    stalled = released = writer_done = 0;
    atomic_store(&armed, 1);
    reader_job j;
    memset(&j, 0, sizeof j);
    j.revision = at;
    pthread_t rt, wt;
    ck_assert_int_eq(pthread_create(&rt, NULL, reader_main, &j), 0);
    ck_assert_msg(wait_flag(&stalled, 10), "the reader never reached its view window");
    /* the reader holds its view; the writer must not wait for it */
    ck_assert_int_eq(pthread_create(&wt, NULL, writer_main, NULL), 0);
    int done = wait_flag(&writer_done, 10);
    pthread_mutex_lock(&mu);
    released = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    ck_assert_msg(done, "a put and a compaction waited for a stalled reader");
    pthread_join(rt, NULL);
    pthread_join(wt, NULL);
    ck_assert_int_eq(writer_rc, 0);
    ck_assert_int_eq(writer_rev, 5);
    /* the reader answers with its revision's state, though the compaction
     * has deleted the history records it read meanwhile */
    ck_assert_msg(j.rc == 0, "range: %s", cairn_strerror(j.rc));
    cairn_range_resp *r = &j.resp;
    ck_assert_int_eq(r->header.revision, 4);
    if (at == 2) {
        ck_assert_int_eq(r->count, 1);
        ck_assert_uint_eq(r->nkvs, 1);
        ck_kv(&r->kvs[0], "a", "1", 2, 2, 1);
    } else {
        ck_assert_int_eq(r->count, 2);
        ck_assert_uint_eq(r->nkvs, 2);
        ck_kv(&r->kvs[0], "a", "2", 2, 4, 2);
        ck_kv(&r->kvs[1], "b", "1", 3, 3, 1);
    }
    cairn_range_resp_destroy(r);
    /* and the store moved on: the old revision is compacted now */
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"a";
    q.key_len = 1;
    q.revision = 2;
    cairn_range_resp r2;
    ck_assert_int_eq(cairn_store_range(st, &r2, &q), CAIRN_ECOMPACTED);
    q.revision = 0;
    ck_assert_int_eq(cairn_store_range(st, &r2, &q), 0);
    ck_assert_uint_eq(r2.nkvs, 1);
    ck_kv(&r2.kvs[0], "a", "3", 2, 5, 3);
    cairn_range_resp_destroy(&r2);
    close_and_remove(st, dir);
}

START_TEST(stalled_history_reader_blocks_no_writer)
{
    stalled_reader_case(2); /* every result from a history record on disk */
}
END_TEST

START_TEST(stalled_current_reader_blocks_no_writer)
{
    stalled_reader_case(0); /* the values memory held at the visible revision */
}
END_TEST

/* ---- stress: pairs written together are read together ------------------------ */

#define WRITERS 3
#define READERS 3
#define PAIRS 8
#define TXNS 150

static _Atomic int writers_left;
static _Atomic int errors;
static _Atomic long reads_done, hist_reads_done;

static void jitter_hook(void *arg)
{
    (void)arg;
    /* widen the window between the view and the disk reads */
    if ((atomic_fetch_add(&reads_done, 1) & 3) == 0)
        sched_yield();
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        atomic_fetch_add(&errors, 1);                                                              \
    } while (0)

static void *pair_writer(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1);
    for (int i = 0; i < TXNS; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int p = (int)((seed >> 33) % PAIRS);
        char ka[16], kb[16], v[32];
        snprintf(ka, sizeof ka, "p%02d/a", p);
        snprintf(kb, sizeof kb, "p%02d/b", p);
        snprintf(v, sizeof v, "w%d-%d", id, i);
        cairn_request_op ops[2] = {{0}, {0}};
        const char *keys[2] = {ka, kb};
        for (int k = 0; k < 2; k++) {
            ops[k].type = CAIRN_REQ_PUT;
            ops[k].u.put.key = (const uint8_t *)keys[k];
            ops[k].u.put.key_len = strlen(keys[k]);
            ops[k].u.put.value = (const uint8_t *)v;
            ops[k].u.put.value_len = strlen(v);
        }
        cairn_txn_req t = {NULL, 0, ops, 2, NULL, 0};
        cairn_txn_resp r;
        int rc = cairn_store_txn(st, &r, &t);
        if (rc)
            FAIL("txn: %s", cairn_strerror(rc));
        else
            cairn_txn_resp_destroy(&r);
    }
    atomic_fetch_sub(&writers_left, 1);
    return NULL;
}

/* One read of every pair at |rev| (0: current); checks the pairs. */
static void check_pairs(int64_t rev)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"p";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"q";
    q.range_end_len = 1;
    q.revision = rev;
    cairn_range_resp r;
    int rc = cairn_store_range(st, &r, &q);
    if (rc == CAIRN_ECOMPACTED && rev)
        return; /* the compactor got there first */
    if (rc) {
        FAIL("range at %lld: %s", (long long)rev, cairn_strerror(rc));
        return;
    }
    if (rev)
        atomic_fetch_add(&hist_reads_done, 1);
    if (r.count != (int64_t)r.nkvs || r.nkvs % 2)
        FAIL("range at %lld: count %lld, %zu kvs", (long long)rev, (long long)r.count, r.nkvs);
    for (size_t i = 0; i + 1 < r.nkvs; i += 2) {
        const cairn_kv *a = &r.kvs[i], *b = &r.kvs[i + 1];
        if (a->key_len != 5 || b->key_len != 5 || memcmp(a->key, b->key, 4) != 0 ||
            a->key[4] != 'a' || b->key[4] != 'b') {
            FAIL("range at %lld: %.*s and %.*s are not a pair", (long long)rev, (int)a->key_len,
                 (const char *)a->key, (int)b->key_len, (const char *)b->key);
            break;
        }
        if (a->mod_revision != b->mod_revision || a->version != b->version ||
            a->create_revision != b->create_revision || a->value_len != b->value_len ||
            memcmp(a->value, b->value, a->value_len) != 0)
            FAIL("range at %lld: pair %.4s torn: mod %lld/%lld", (long long)rev,
                 (const char *)a->key, (long long)a->mod_revision, (long long)b->mod_revision);
        int64_t top = rev ? rev : r.header.revision;
        if (a->mod_revision > top)
            FAIL("range at %lld: mod %lld above %lld", (long long)rev, (long long)a->mod_revision,
                 (long long)top);
    }
    cairn_range_resp_destroy(&r);
}

static void *pair_reader(void *arg)
{
    uint64_t seed = 0x51ed27u + (uint64_t)(intptr_t)arg;
    while (atomic_load(&writers_left) > 0) {
        seed = seed * 6364136223846793005ull + 1;
        int64_t cur = cur_rev(st);
        int64_t back = (int64_t)((seed >> 33) % 40);
        check_pairs((seed >> 40) & 1 && cur - back > 1 ? cur - back : 0);
    }
    return NULL;
}

static void *compactor(void *arg)
{
    (void)arg;
    while (atomic_load(&writers_left) > 0) {
        int64_t cur = cur_rev(st);
        if (cur > 30) {
            cairn_header h;
            int rc = cairn_store_compact(st, &h, cur - 30, 0);
            if (rc && rc != CAIRN_ECOMPACTED)
                FAIL("compact: %s", cairn_strerror(rc));
        }
        usleep(2000);
    }
    return NULL;
}

START_TEST(pairs_are_read_together)
{
    char *dir;
    st = open_store_hooked(&dir, NULL, jitter_hook);
    atomic_store(&writers_left, WRITERS);
    pthread_t w[WRITERS], r[READERS], c;
    for (int i = 0; i < WRITERS; i++)
        ck_assert_int_eq(pthread_create(&w[i], NULL, pair_writer, (void *)(intptr_t)i), 0);
    for (int i = 0; i < READERS; i++)
        ck_assert_int_eq(pthread_create(&r[i], NULL, pair_reader, (void *)(intptr_t)i), 0);
    ck_assert_int_eq(pthread_create(&c, NULL, compactor, NULL), 0);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(w[i], NULL);
    for (int i = 0; i < READERS; i++)
        pthread_join(r[i], NULL);
    pthread_join(c, NULL);
    ck_assert_int_eq(atomic_load(&errors), 0);
    ck_assert_int_eq(cur_rev(st), 1 + WRITERS * TXNS);
    ck_assert_int_gt(atomic_load(&hist_reads_done), 0);
    check_pairs(0);
    ck_assert_int_eq(atomic_load(&errors), 0);
    close_and_remove(st, dir);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_readers");
    TCase *tc = tcase_create("readers");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stalled_history_reader_blocks_no_writer);
    tcase_add_test(tc, stalled_current_reader_blocks_no_writer);
    tcase_add_test(tc, pairs_are_read_together);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
