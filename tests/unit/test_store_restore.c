/*
 * A data dir restored from a snapshot gets a new actor id.
 *
 * A snapshot (cairn_store_snapshot, streamed by server/etcd/snapshot.c) is
 * the database's files plus the marker CAIRN_STORE_RESTORE_MARKER; this
 * suite makes the same thing with `cp -a` and the marker file, then opens
 * the copy. The copy keeps every key,
 * revision, lease, member and cluster id, but has a new actor, written
 * before the marker is removed; a plain reopen keeps the actor; a marker
 * found again (a crash between the two steps) only draws another actor.
 * The reason for it all: the original and the copy both write, exchange
 * their changes, and converge — with one actor id they would fork (same
 * actor and seq, different changes) and the exchange would be refused.
 * cairn_store_snapshot, taken while writers run, gives a consistent cut.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "../store/store_test.h"

static const cairn_actor orig_actor = {{0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa,
                                        0xab, 0xac, 0xad, 0xae, 0xaf, 0xb0}};

/* Opens |dir| with the original's options, so a copy that kept the stored
 * actor would show it. */
static cairn_store *open_node(const char *dir, captured *cap)
{
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.actor = &orig_actor;
    cairn_store_subscriber sub = {capture, cap};
    o.subscribers = &sub;
    o.nsubscribers = cap ? 1 : 0;
    return open_store_opts(dir, &o);
}

static char *marker_path(const char *dir)
{
    size_t n = strlen(dir) + sizeof CAIRN_STORE_RESTORE_MARKER + 2;
    char *p = malloc(n);
    ck_assert_ptr_nonnull(p);
    snprintf(p, n, "%s/%s", dir, CAIRN_STORE_RESTORE_MARKER);
    return p;
}

static void touch_marker(const char *dir)
{
    char *p = marker_path(dir);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs("restored\n", f);
    ck_assert_int_eq(fclose(f), 0);
    free(p);
}

static int has_marker(const char *dir)
{
    char *p = marker_path(dir);
    struct stat st;
    int r = stat(p, &st) == 0;
    free(p);
    return r;
}

/* A copy of |from|'s data dir with the marker: what `tar -xf` of a
 * snapshot makes. */
static char *restore_copy(const char *from)
{
    char *to = make_tmpdir();
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp -a '%s/db' '%s/db'", from, to);
    ck_assert_int_eq(system(cmd), 0);
    touch_marker(to);
    return to;
}

static void get_all(cairn_store *s, cairn_range_resp *r)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"\0";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"\0";
    q.range_end_len = 1;
    ck_assert_int_eq(cairn_store_range(s, r, &q), 0);
}

static void same_kvs(const cairn_range_resp *a, const cairn_range_resp *b)
{
    ck_assert_int_eq(a->nkvs, b->nkvs);
    ck_assert_int_eq(a->header.revision, b->header.revision);
    for (size_t i = 0; i < a->nkvs; i++) {
        const cairn_kv *x = &a->kvs[i], *y = &b->kvs[i];
        ck_assert_int_eq(x->key_len, y->key_len);
        ck_assert_mem_eq(x->key, y->key, x->key_len);
        ck_assert_int_eq(x->value_len, y->value_len);
        ck_assert_mem_eq(x->value, y->value, x->value_len);
        ck_assert_int_eq(x->create_revision, y->create_revision);
        ck_assert_int_eq(x->mod_revision, y->mod_revision);
        ck_assert_int_eq(x->version, y->version);
        ck_assert_int_eq(x->lease, y->lease);
    }
}

static int actor_eq(const cairn_actor *a, const cairn_actor *b)
{
    return memcmp(a->b, b->b, CAIRN_ACTOR_LEN) == 0;
}

START_TEST(restored_copy_gets_a_new_actor)
{
    char *dir = make_tmpdir();
    cairn_store *s = open_node(dir, NULL);
    ck_assert_int_eq(cairn_store_lease_grant(s, 7, 600), 0);
    for (int i = 0; i < 30; i++) {
        char k[16], v[16];
        snprintf(k, sizeof k, "k%02d", i % 20);
        snprintf(v, sizeof v, "v%d", i);
        put_kv(s, k, v);
    }
    put_leased(s, "leased", "x", 7);
    ck_assert_int_eq(del_range(s, "k05", "k08", NULL), 3);
    cairn_range_resp before;
    get_all(s, &before);
    cairn_header hb;
    cairn_store_header(s, &hb);
    cairn_actor a0;
    cairn_store_actor(s, &a0);
    ck_assert(actor_eq(&a0, &orig_actor));
    cairn_store_close(s);

    char *copy = restore_copy(dir);
    ck_assert(has_marker(copy));
    s = open_node(copy, NULL);
    ck_assert(!has_marker(copy));
    cairn_actor a1;
    cairn_store_actor(s, &a1);
    ck_assert_msg(!actor_eq(&a1, &a0), "a restored copy kept the original's actor id");
    /* everything else is the original's */
    cairn_range_resp after;
    get_all(s, &after);
    same_kvs(&before, &after);
    cairn_header ha;
    cairn_store_header(s, &ha);
    ck_assert_int_eq(ha.revision, hb.revision);
    ck_assert_uint_eq(ha.member_id, hb.member_id);
    ck_assert_uint_eq(ha.cluster_id, hb.cluster_id);
    int64_t *ids;
    size_t nids;
    ck_assert_int_eq(cairn_store_lease_list(s, &ids, &nids), 0);
    ck_assert_int_eq(nids, 1);
    ck_assert_int_eq(ids[0], 7);
    free(ids);
    /* numbering continues from the copy's revision */
    ck_assert_int_eq(put_kv(s, "after", "restore"), hb.revision + 1);
    cairn_store_close(s);

    /* a plain reopen keeps the new actor and the write */
    s = open_node(copy, NULL);
    cairn_actor a2;
    cairn_store_actor(s, &a2);
    ck_assert(actor_eq(&a2, &a1));
    ck_assert_int_eq(cur_rev(s), hb.revision + 1);
    cairn_store_close(s);

    /* the marker found again (a crash after the new actor was written,
     * before the marker was removed): another new actor, nothing lost */
    touch_marker(copy);
    s = open_node(copy, NULL);
    cairn_actor a3;
    cairn_store_actor(s, &a3);
    ck_assert(!actor_eq(&a3, &a1));
    ck_assert(!actor_eq(&a3, &a0));
    ck_assert_int_eq(cur_rev(s), hb.revision + 1);
    ck_assert(!has_marker(copy));
    cairn_store_close(s);

    /* the original is untouched: a restart keeps its actor */
    s = open_node(dir, NULL);
    cairn_actor a4;
    cairn_store_actor(s, &a4);
    ck_assert(actor_eq(&a4, &a0));
    ck_assert_int_eq(cur_rev(s), hb.revision);
    cairn_store_close(s);

    cairn_range_resp_destroy(&before);
    cairn_range_resp_destroy(&after);
    rm_rf(dir);
    rm_rf(copy);
    free(dir);
    free(copy);
}
END_TEST

START_TEST(original_and_copy_converge)
{
    char *dir = make_tmpdir();
    cairn_store *s = open_node(dir, NULL);
    put_kv(s, "a", "1");
    put_kv(s, "b", "2");
    cairn_store_close(s);
    char *copy = restore_copy(dir);

    captured co = {0}, cc = {0};
    cairn_store *o = open_node(dir, &co);
    cairn_store *c = open_node(copy, &cc);
    /* both write after the snapshot: with one actor these two changes
     * would carry the same (actor, seq) */
    put_kv(o, "x", "from-original");
    put_kv(c, "y", "from-copy");
    ck_assert_int_eq(co.n, 1);
    ck_assert_int_eq(cc.n, 1);
    int rc = cairn_store_receive(o, cc.bytes[0], cc.len[0]);
    ck_assert_msg(rc == 0, "original refused the copy's change: %s", cairn_strerror(rc));
    rc = cairn_store_receive(c, co.bytes[0], co.len[0]);
    ck_assert_msg(rc == 0, "copy refused the original's change: %s", cairn_strerror(rc));
    cairn_range_resp ro, rcpy;
    get_all(o, &ro);
    get_all(c, &rcpy);
    ck_assert_int_eq(ro.nkvs, 4);
    ck_assert_int_eq(rcpy.nkvs, 4);
    for (size_t i = 0; i < ro.nkvs; i++) {
        ck_assert_int_eq(ro.kvs[i].key_len, rcpy.kvs[i].key_len);
        ck_assert_mem_eq(ro.kvs[i].key, rcpy.kvs[i].key, ro.kvs[i].key_len);
        ck_assert_int_eq(ro.kvs[i].value_len, rcpy.kvs[i].value_len);
        ck_assert_mem_eq(ro.kvs[i].value, rcpy.kvs[i].value, ro.kvs[i].value_len);
    }
    cairn_range_resp_destroy(&ro);
    cairn_range_resp_destroy(&rcpy);
    cairn_store_close(o);
    cairn_store_close(c);
    captured_free(&co);
    captured_free(&cc);
    rm_rf(dir);
    rm_rf(copy);
    free(dir);
    free(copy);
}
END_TEST

/* ---- cairn_store_snapshot ---------------------------------------------- */

typedef struct writer_arg {
    cairn_store *s;
    atomic_int stop;
    int n;
} writer_arg;

static void *writer_main(void *arg)
{
    writer_arg *w = arg;
    char k[32], v[32];
    while (!atomic_load(&w->stop)) {
        snprintf(k, sizeof k, "w%03d", w->n % 50);
        snprintf(v, sizeof v, "v%d", w->n);
        put_kv(w->s, k, v);
        w->n++;
    }
    return NULL;
}

/* Puts the snapshot's files into a new data dir's db/ with the marker, as
 * the server's archive extracts. */
static char *dir_from_snapshot(const cairn_store_snap *sn)
{
    char *to = make_tmpdir();
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "mkdir '%s/db'", to);
    ck_assert_int_eq(system(cmd), 0);
    const cairn_store_snap_file *f;
    size_t n = cairn_store_snap_files(sn, &f);
    ck_assert_uint_gt(n, 2); /* CURRENT, a MANIFEST, a log at least */
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        ck_assert_int_eq(stat(f[i].path, &st), 0);
        ck_assert_uint_eq((uint64_t)st.st_size, f[i].size);
        snprintf(cmd, sizeof cmd, "cp '%s' '%s/db/%s'", f[i].path, to, f[i].name);
        ck_assert_int_eq(system(cmd), 0);
    }
    touch_marker(to);
    return to;
}

static void range_at(cairn_store *s, cairn_range_resp *r, int64_t rev)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"\0";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"\0";
    q.range_end_len = 1;
    q.revision = rev;
    ck_assert_int_eq(cairn_store_range(s, r, &q), 0);
}

/* Snapshots taken while a writer and the lease thread run: each copy opens
 * at some revision R with exactly the original's keys at R (a consistent
 * cut, nothing torn), and freeing it removes the copy. */
START_TEST(snapshot_while_writing)
{
    char *dir = make_tmpdir();
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.actor = &orig_actor;
    o.lease_tick_ms = 2; /* the expiry thread runs */
    cairn_store *s = open_store_opts(dir, &o);
    ck_assert_uint_gt(cairn_store_disk_bytes(s), 0); /* the log counts */
    ck_assert_int_eq(cairn_store_lease_grant(s, 9, 600), 0);
    put_leased(s, "leased", "x", 9);
    writer_arg w = {s, 0, 0};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, writer_main, &w), 0);
    for (int round = 0; round < 3; round++) {
        usleep(30000);
        cairn_store_snap *sn;
        ck_assert_int_eq(cairn_store_snapshot(s, &sn), 0);
        char *copy = dir_from_snapshot(sn);
        const cairn_store_snap_file *f;
        size_t n = cairn_store_snap_files(sn, &f);
        char *first = strdup(f[0].path);
        cairn_store_snap_free(sn);
        struct stat st;
        ck_assert_int_ne(stat(first, &st), 0); /* the working copy is gone */
        free(first);
        (void)n;
        cairn_store *c = open_node(copy, NULL);
        int64_t r = cur_rev(c);
        ck_assert_int_ge(r, 3);
        cairn_range_resp a, b;
        range_at(s, &a, r);
        range_at(c, &b, 0);
        a.header.revision = r; /* the header says the current revision */
        same_kvs(&a, &b);
        cairn_range_resp_destroy(&a);
        cairn_range_resp_destroy(&b);
        cairn_lease_ttl_resp t;
        ck_assert_int_eq(cairn_store_lease_ttl(c, &t, 9, 1), 0);
        ck_assert_int_eq(t.granted_ttl, 600);
        ck_assert_int_eq(t.nkeys, 1);
        cairn_lease_ttl_resp_destroy(&t);
        cairn_store_close(c);
        rm_rf(copy);
        free(copy);
    }
    atomic_store(&w.stop, 1);
    pthread_join(th, NULL);
    ck_assert_int_gt(w.n, 0);
    cairn_store_close(s);
    /* a working dir a crash left is removed at the next open */
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot.tmp.1.2", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/snapshot.tmp.1.2/db", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    s = open_node(dir, NULL);
    struct stat st;
    snprintf(path, sizeof path, "%s/snapshot.tmp.1.2", dir);
    ck_assert_int_ne(stat(path, &st), 0);
    cairn_store_close(s);
    rm_rf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_restore");
    TCase *tc = tcase_create("restore");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, restored_copy_gets_a_new_actor);
    tcase_add_test(tc, original_and_copy_converge);
    tcase_add_test(tc, snapshot_while_writing);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
