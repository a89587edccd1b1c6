/*
 * Concurrency: many threads run compare-and-swap increments (a Txn whose
 * compare is mod_revision == what they read, whose success branch puts the
 * value + 1) on a few shared counters. The final state must match a serial
 * history: every successful CAS took its own revision, the revisions of all
 * successful CAS form exactly the range after the setup, each counter ends
 * at the number of its successful increments (no lost update), and its
 * version is that plus one. Beside them, readers check that a read never
 * shows a revision above its header (nothing before it is durable) and that
 * the header never goes backwards.
 */

#include <pthread.h>
#include <stdatomic.h>

#include "../store/store_test.h"

#define THREADS 8
#define ITERS 80
#define COUNTERS 3

static cairn_store *st;
static _Atomic int stop_readers;
static _Atomic long successes[COUNTERS];
static int64_t revs[THREADS][ITERS];
static int nrevs[THREADS];
static _Atomic int reader_errors;

static int64_t read_counter(int c, int64_t *mod)
{
    char k[16];
    snprintf(k, sizeof k, "ctr%d", c);
    cairn_range_req q = {0};
    q.key = (const uint8_t *)k;
    q.key_len = strlen(k);
    cairn_range_resp r;
    if (cairn_store_range(st, &r, &q) != 0 || r.nkvs != 1)
        return -1;
    char buf[32] = {0};
    memcpy(buf, r.kvs[0].value, r.kvs[0].value_len < 31 ? r.kvs[0].value_len : 31);
    *mod = r.kvs[0].mod_revision;
    cairn_range_resp_destroy(&r);
    return atoll(buf);
}

static void *cas_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t seed = 0x1234567 + (uint64_t)id;
    for (int i = 0; i < ITERS; i++) {
        seed = seed * 6364136223846793005ull + 1;
        int c = (int)((seed >> 33) % COUNTERS);
        char k[16], v[32];
        snprintf(k, sizeof k, "ctr%d", c);
        for (;;) {
            int64_t mod;
            int64_t val = read_counter(c, &mod);
            ck_assert_int_ge(val, 0);
            snprintf(v, sizeof v, "%lld", (long long)val + 1);
            cairn_compare cmp = {0};
            cmp.key = (const uint8_t *)k;
            cmp.key_len = strlen(k);
            cmp.target = CAIRN_CMP_MOD;
            cmp.result = CAIRN_CMP_EQUAL;
            cmp.mod_revision = mod;
            cairn_request_op op = {0};
            op.type = CAIRN_REQ_PUT;
            op.u.put.key = cmp.key;
            op.u.put.key_len = cmp.key_len;
            op.u.put.value = (const uint8_t *)v;
            op.u.put.value_len = strlen(v);
            cairn_txn_req t = {&cmp, 1, &op, 1, NULL, 0};
            cairn_txn_resp r;
            ck_assert_int_eq(cairn_store_txn(st, &r, &t), 0);
            int ok = r.succeeded;
            int64_t rev = r.header.revision;
            cairn_txn_resp_destroy(&r);
            if (ok) {
                revs[id][nrevs[id]++] = rev;
                atomic_fetch_add(&successes[c], 1);
                break;
            }
        }
    }
    return NULL;
}

static void *reader_main(void *arg)
{
    (void)arg;
    int64_t last = 0;
    while (!atomic_load(&stop_readers)) {
        cairn_range_req q = {0};
        q.key = (const uint8_t *)"ctr";
        q.key_len = 3;
        q.range_end = (const uint8_t *)"cts";
        q.range_end_len = 3;
        cairn_range_resp r;
        if (cairn_store_range(st, &r, &q) != 0) {
            atomic_fetch_add(&reader_errors, 1);
            continue;
        }
        if (r.header.revision < last)
            atomic_fetch_add(&reader_errors, 1);
        last = r.header.revision;
        for (size_t i = 0; i < r.nkvs; i++)
            if (r.kvs[i].mod_revision > r.header.revision)
                atomic_fetch_add(&reader_errors, 1);
        cairn_range_resp_destroy(&r);
    }
    return NULL;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

START_TEST(cas_has_no_lost_update)
{
    char *dir = make_tmpdir();
    st = open_store(dir);
    for (int c = 0; c < COUNTERS; c++) {
        char k[16];
        snprintf(k, sizeof k, "ctr%d", c);
        put_kv(st, k, "0");
    }
    int64_t base = cur_rev(st);
    pthread_t th[THREADS], rd[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&rd[i], NULL, reader_main, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, cas_main, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    atomic_store(&stop_readers, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(rd[i], NULL);
    ck_assert_int_eq(atomic_load(&reader_errors), 0);

    /* every success has its own revision: exactly base+1 .. base+N */
    static int64_t all[THREADS * ITERS];
    size_t n = 0;
    for (int i = 0; i < THREADS; i++)
        for (int j = 0; j < nrevs[i]; j++)
            all[n++] = revs[i][j];
    ck_assert_uint_eq(n, THREADS * ITERS);
    qsort(all, n, sizeof *all, cmp64);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(all[i], base + 1 + (int64_t)i);
    ck_assert_int_eq(cur_rev(st), base + (int64_t)n);
    long total = 0;
    for (int c = 0; c < COUNTERS; c++) {
        int64_t mod;
        int64_t v = read_counter(c, &mod);
        ck_assert_int_eq(v, atomic_load(&successes[c]));
        total += v;
        char k[16];
        snprintf(k, sizeof k, "ctr%d", c);
        cairn_range_req q = {0};
        q.key = (const uint8_t *)k;
        q.key_len = strlen(k);
        cairn_range_resp r;
        ck_assert_int_eq(cairn_store_range(st, &r, &q), 0);
        ck_assert_int_eq(r.kvs[0].version, v + 1);
        cairn_range_resp_destroy(&r);
    }
    ck_assert_int_eq(total, THREADS * ITERS);
    cairn_store_close(st);
    rm_rf(dir);
    free(dir);
}
END_TEST

/* Group commit: the committer batches concurrent writers; async writes
 * complete in order and only once durable (checked by reopening). */
typedef struct async_ctx {
    _Atomic int done;
    _Atomic int64_t max_rev;
    _Atomic int order_errors;
    cairn_put_resp resp[64];
    int64_t last_done;
} async_ctx;

static async_ctx actx;

static void async_done(void *arg, int rc)
{
    cairn_put_resp *r = arg;
    ck_assert_int_eq(rc, 0);
    /* callbacks come from the one committer thread, in revision order */
    if (r->header.revision <= actx.last_done)
        atomic_fetch_add(&actx.order_errors, 1);
    actx.last_done = r->header.revision;
    atomic_fetch_add(&actx.done, 1);
}

START_TEST(async_writes_complete_in_order)
{
    char *dir = make_tmpdir();
    st = open_store(dir);
    memset(&actx, 0, sizeof actx);
    for (int i = 0; i < 64; i++) {
        char k[16];
        snprintf(k, sizeof k, "async%02d", i);
        cairn_put_req r = {0};
        r.key = (const uint8_t *)k;
        r.key_len = strlen(k);
        r.value = (const uint8_t *)"v";
        r.value_len = 1;
        ck_assert_int_eq(cairn_store_put_async(st, &actx.resp[i], &r, async_done, &actx.resp[i]),
                         0);
    }
    while (atomic_load(&actx.done) < 64)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&actx.order_errors), 0);
    for (int i = 0; i < 64; i++) {
        ck_assert_int_eq(actx.resp[i].header.revision, 2 + i);
        cairn_put_resp_destroy(&actx.resp[i]);
    }
    cairn_store_close(st);
    st = open_store(dir);
    ck_assert_int_eq(cur_rev(st), 65);
    cairn_store_close(st);
    rm_rf(dir);
    free(dir);
}
END_TEST

/* Events reach the callback once durable, one call per change, in order. */
static _Atomic int64_t ev_last;
static _Atomic int ev_errors, ev_count;
static void on_events(void *arg, int64_t rev, const cairn_hash *h, const uint8_t *ch, size_t len,
                      const cairn_event *ev, size_t nev)
{
    cairn_store *s = *(cairn_store **)arg;
    (void)h;
    (void)ch;
    (void)len;
    if (rev == 0)
        return;
    if (rev != atomic_load(&ev_last) + 1 || nev == 0)
        atomic_fetch_add(&ev_errors, 1);
    for (size_t i = 0; i < nev; i++)
        if (ev[i].kv.mod_revision != rev)
            atomic_fetch_add(&ev_errors, 1);
    (void)s;
    atomic_store(&ev_last, rev);
    atomic_fetch_add(&ev_count, 1);
}

START_TEST(events_follow_durability)
{
    char *dir = make_tmpdir();
    static cairn_store *holder;
    cairn_store_options o;
    cairn_store_options_init(&o);
    cairn_store_subscriber sub = {on_events, &holder};
    o.subscribers = &sub;
    o.nsubscribers = 1;
    atomic_store(&ev_last, 1);
    holder = st = open_store_opts(dir, &o);
    put_kv(st, "e1", "a");
    put_kv(st, "e2", "b");
    ck_assert_int_eq(del_range(st, "e", "f", NULL), 2);
    del_range(st, "e", "f", NULL); /* deletes nothing: no change, no event */
    ck_assert_int_eq(atomic_load(&ev_count), 3);
    ck_assert_int_eq(atomic_load(&ev_errors), 0);
    cairn_store_close(st);
    rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- durability gate: the committer blocks before writing --------------- */

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_armed, gate_entered, gate_fail;

static int gate_hook(void *arg, size_t n)
{
    (void)arg;
    (void)n;
    pthread_mutex_lock(&gate_mu);
    if (gate_armed) {
        gate_entered = 1;
        pthread_cond_broadcast(&gate_cv);
        while (gate_armed)
            pthread_cond_wait(&gate_cv, &gate_mu);
    }
    int fail = gate_fail;
    pthread_mutex_unlock(&gate_mu);
    return fail;
}

static _Atomic int done_count;
static _Atomic int done_rc;
static void count_done(void *arg, int rc)
{
    (void)arg;
    if (rc)
        atomic_store(&done_rc, rc);
    atomic_fetch_add(&done_count, 1);
}

static int visible(cairn_store *s, const char *k)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)k;
    q.key_len = strlen(k);
    cairn_range_resp r;
    ck_assert_int_eq(cairn_store_range(s, &r, &q), 0);
    int n = (int)r.nkvs;
    cairn_range_resp_destroy(&r);
    return n;
}

START_TEST(nothing_visible_before_durable)
{
    char *dir;
    st = open_store_hooked(&dir, gate_hook, NULL);
    ck_assert_int_eq(put_kv(st, "k0", "v0"), 2);

    pthread_mutex_lock(&gate_mu);
    gate_armed = 1;
    gate_entered = 0;
    pthread_mutex_unlock(&gate_mu);
    cairn_put_req p = {0};
    p.key = (const uint8_t *)"k1";
    p.key_len = 2;
    p.value = (const uint8_t *)"v1";
    p.value_len = 2;
    cairn_put_resp pr;
    ck_assert_int_eq(cairn_store_put_async(st, &pr, &p, count_done, NULL), 0);
    ck_assert_int_eq(pr.header.revision, 3); /* its revision is known already */
    pthread_mutex_lock(&gate_mu);
    while (!gate_entered)
        pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);

    /* the write is applied in memory but not durable: readers do not see it */
    ck_assert_int_eq(visible(st, "k1"), 0);
    ck_assert_int_eq(cur_rev(st), 2);
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"k1";
    q.key_len = 2;
    q.revision = 3;
    cairn_range_resp rr;
    ck_assert_int_eq(cairn_store_range(st, &rr, &q), CAIRN_EFUTUREREV);
    /* a writer sees the pending state (compares must), but its completion
     * waits for the fsync: a CAS on k1's version 1 succeeds at rev 4 */
    cairn_compare c = {0};
    c.key = (const uint8_t *)"k1";
    c.key_len = 2;
    c.target = CAIRN_CMP_VERSION;
    c.result = CAIRN_CMP_EQUAL;
    c.version = 1;
    cairn_request_op op = {0};
    op.type = CAIRN_REQ_PUT;
    op.u.put = p;
    op.u.put.value = (const uint8_t *)"v2";
    cairn_txn_req t = {&c, 1, &op, 1, NULL, 0};
    cairn_txn_resp tr;
    ck_assert_int_eq(cairn_store_txn_async(st, &tr, &t, count_done, NULL), 0);
    ck_assert_int_eq(tr.succeeded, 1);
    ck_assert_int_eq(tr.header.revision, 4);
    /* a read-only txn that read the pending state completes only after it */
    cairn_request_op g = {0};
    g.type = CAIRN_REQ_RANGE;
    g.u.range.key = (const uint8_t *)"k1";
    g.u.range.key_len = 2;
    cairn_txn_req tg = {NULL, 0, &g, 1, NULL, 0};
    cairn_txn_resp tgr;
    ck_assert_int_eq(cairn_store_txn_async(st, &tgr, &tg, count_done, NULL), 0);
    usleep(50000);
    ck_assert_int_eq(atomic_load(&done_count), 0); /* nothing acknowledged */
    ck_assert_int_eq(visible(st, "k1"), 0);

    pthread_mutex_lock(&gate_mu);
    gate_armed = 0;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    while (atomic_load(&done_count) < 3)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&done_rc), 0);
    ck_assert_int_eq(visible(st, "k1"), 1);
    ck_assert_int_eq(cur_rev(st), 4);
    cairn_put_resp_destroy(&pr);
    cairn_txn_resp_destroy(&tr);
    cairn_txn_resp_destroy(&tgr);
    cairn_store_close(st);
    rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(group_commit_shares_fsyncs)
{
    /* while the committer is held in its first write, 63 more writers
     * queue up: they all go out in the next group, one fsync */
    gate_fail = 0;
    char *dir;
    st = open_store_hooked(&dir, gate_hook, NULL);
    pthread_mutex_lock(&gate_mu);
    gate_armed = 1;
    gate_entered = 0;
    pthread_mutex_unlock(&gate_mu);
    atomic_store(&done_count, 0);
    atomic_store(&done_rc, 0);
    static cairn_put_resp resp[64];
    static char keys[64][8];
    for (int i = 0; i < 64; i++) {
        snprintf(keys[i], sizeof keys[i], "g%02d", i);
        cairn_put_req p = {0};
        p.key = (const uint8_t *)keys[i];
        p.key_len = strlen(keys[i]);
        p.value = (const uint8_t *)"v";
        p.value_len = 1;
        ck_assert_int_eq(cairn_store_put_async(st, &resp[i], &p, count_done, NULL), 0);
        if (i == 0) {
            pthread_mutex_lock(&gate_mu);
            while (!gate_entered)
                pthread_cond_wait(&gate_cv, &gate_mu);
            pthread_mutex_unlock(&gate_mu);
        }
    }
    pthread_mutex_lock(&gate_mu);
    gate_armed = 0;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    while (atomic_load(&done_count) < 64)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&done_rc), 0);
    cairn_store_stats stats;
    cairn_store_get_stats(st, &stats);
    ck_assert_uint_eq(stats.changes, 64);
    ck_assert_uint_eq(stats.syncs, 2);
    for (int i = 0; i < 64; i++)
        cairn_put_resp_destroy(&resp[i]);
    cairn_store_close(st);
    rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(failed_write_fails_the_store)
{
    char *dir = make_tmpdir();
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.before_write_cb = gate_hook;
    gate_armed = 0;
    gate_fail = 0;
    st = open_store_opts(dir, &o);
    ck_assert_int_eq(put_kv(st, "ok", "1"), 2);
    gate_fail = 1; /* the next group's write fails, as a full disk would */
    cairn_put_req p = {0};
    p.key = (const uint8_t *)"lost";
    p.key_len = 4;
    p.value = (const uint8_t *)"x";
    p.value_len = 1;
    cairn_put_resp pr;
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), CAIRN_EIO);
    /* from now on every call says so; nothing unwritten is ever served */
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"ok";
    q.key_len = 2;
    cairn_range_resp rr;
    ck_assert_int_eq(cairn_store_range(st, &rr, &q), CAIRN_EIO);
    ck_assert_int_eq(cairn_store_put(st, &pr, &p), CAIRN_EIO);
    cairn_txn_req t = {NULL, 0, NULL, 0, NULL, 0};
    cairn_txn_resp tr;
    ck_assert_int_eq(cairn_store_txn(st, &tr, &t), CAIRN_EIO);
    cairn_header h;
    ck_assert_int_eq(cairn_store_compact(st, &h, 1, 0), CAIRN_EIO);
    cairn_store_close(st);
    gate_fail = 0;
    /* after a restart the acknowledged write is there, the failed one not */
    st = open_store_opts(dir, &o);
    ck_assert_int_eq(cur_rev(st), 2);
    ck_assert_int_eq(visible(st, "ok"), 1);
    ck_assert_int_eq(visible(st, "lost"), 0);
    ck_assert_int_eq(put_kv(st, "again", "1"), 3);
    cairn_store_close(st);
    rm_rf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_concurrency");
    TCase *tc = tcase_create("concurrency");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, cas_has_no_lost_update);
    tcase_add_test(tc, async_writes_complete_in_order);
    tcase_add_test(tc, events_follow_durability);
    tcase_add_test(tc, nothing_visible_before_durable);
    tcase_add_test(tc, group_commit_shares_fsyncs);
    tcase_add_test(tc, failed_write_fails_the_store);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
