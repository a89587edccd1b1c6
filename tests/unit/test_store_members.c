/*
 * The member table (store/members.c) on real LevelDB dirs:
 * - nodes of one cluster started apart build the same initial table (the
 *   members change is byte-identical: same heads), a different initial
 *   cluster a different one;
 * - add/remove/update/promote/publish and their etcd errors, no revision
 *   taken, the table survives a reopen;
 * - concurrent changes on two replicas merge deterministically: a remove
 *   wins over a concurrent update, two updates of one member's peer URLs
 *   go to the later clock;
 * - leases (grant, keepalive, revoke) leave members_gen alone;
 * - a store made by a join holds no change until the cluster's arrive
 *   (refusing writes meanwhile, reopening empty), then the cluster's
 *   genesis, table and keys, with the ids it was given.
 */


#include "../store/replica_test.h"
#include "../store/store_test.h"

static const char *const U1[] = {"http://127.0.0.1:2380"};
static const char *const U2[] = {"http://127.0.0.1:2381"};
static const char *const U3[] = {"http://127.0.0.1:2382"};
static const cairn_store_member INITIAL[3] = {{"n1", U1, 1}, {"n2", U2, 1}, {"n3", U3, 1}};

static uint64_t clock_of(void *arg)
{
    return *(uint64_t *)arg;
}

static cairn_store *open_node(const char *dir, const char *name, uint8_t ab, uint64_t *clock,
                              captured *cap, const cairn_store_member *ini, size_t nini)
{
    static cairn_actor actors[4];
    cairn_actor *a = &actors[ab & 3];
    memset(a->b, ab, CAIRN_ACTOR_LEN);
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.actor = a;
    o.name = name;
    o.cluster_token = "tok";
    o.initial_cluster = ini;
    o.ninitial_cluster = nini;
    o.clock_ms = clock_of;
    o.clock_arg = clock;
    cairn_store_subscriber sub = {capture, cap};
    if (cap) {
        o.subscribers = &sub;
        o.nsubscribers = 1;
    }
    return open_store_opts(dir, &o);
}

/* Every change |from| captured, received by |to|. */
static void deliver(cairn_store *to, captured *from)
{
    for (int i = 0; i < from->n; i++)
        ck_assert_int_eq(cairn_store_receive(to, from->bytes[i], from->len[i]), 0);
    captured_free(from);
}

static void same_table(cairn_store *a, cairn_store *b)
{
    cairn_member_info *x, *y;
    size_t nx, ny;
    ck_assert_int_eq(cairn_store_member_list(a, &x, &nx), 0);
    ck_assert_int_eq(cairn_store_member_list(b, &y, &ny), 0);
    ck_assert_uint_eq(nx, ny);
    for (size_t i = 0; i < nx; i++) {
        ck_assert_uint_eq(x[i].id, y[i].id);
        ck_assert_str_eq(x[i].name, y[i].name);
        ck_assert_uint_eq(x[i].npeer_urls, y[i].npeer_urls);
        for (size_t j = 0; j < x[i].npeer_urls; j++)
            ck_assert_str_eq(x[i].peer_urls[j], y[i].peer_urls[j]);
        ck_assert_uint_eq(x[i].nclient_urls, y[i].nclient_urls);
        ck_assert_int_eq(x[i].learner, y[i].learner);
    }
    cairn_store_member_list_free(x, nx);
    cairn_store_member_list_free(y, ny);
}

static const cairn_member_info *member(cairn_member_info *v, size_t n, uint64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].id == id)
            return &v[i];
    return NULL;
}

START_TEST(initial_table_same_on_every_node)
{
    uint64_t t = 1700000000000ull;
    char *d1 = make_tmpdir(), *d2 = make_tmpdir(), *d3 = make_tmpdir();
    cairn_store *a = open_node(d1, "n1", 1, &t, NULL, INITIAL, 3);
    cairn_store *b = open_node(d2, "n2", 2, &t, NULL, INITIAL, 3);
    cairn_member_info *v;
    size_t n;
    ck_assert_int_eq(cairn_store_member_list(a, &v, &n), 0);
    ck_assert_uint_eq(n, 3);
    for (size_t i = 0; i < 3; i++) {
        uint64_t id = cairn_store_member_id_of(INITIAL[i].peer_urls, 1, "tok");
        const cairn_member_info *m = member(v, n, id);
        ck_assert_ptr_nonnull(m);
        ck_assert_str_eq(m->name, INITIAL[i].name);
        ck_assert_uint_eq(m->npeer_urls, 1);
        ck_assert_str_eq(m->peer_urls[0], INITIAL[i].peer_urls[0]);
        ck_assert_uint_eq(m->nclient_urls, 0);
        ck_assert_int_eq(m->learner, 0);
        if (i)
            ck_assert_uint_lt(v[i - 1].id, v[i].id); /* sorted by id */
    }
    cairn_store_member_list_free(v, n);
    same_table(a, b);
    /* byte-identical: the heads (genesis + members change) are equal */
    cairn_hash *ha, *hb, *hc;
    size_t nha = 0, nhb = 0, nhc = 0;
    ck_assert_int_eq(cairn_store_heads(a, &ha, &nha), 0);
    ck_assert_int_eq(cairn_store_heads(b, &hb, &nhb), 0);
    ck_assert_uint_eq(nha, 1);
    ck_assert_uint_eq(nhb, 1);
    ck_assert_mem_eq(ha[0].b, hb[0].b, CAIRN_HASH_LEN);
    /* another initial cluster (n3's URL differs): other heads */
    static const char *const U3b[] = {"http://127.0.0.1:2399"};
    cairn_store_member other[3] = {INITIAL[0], INITIAL[1], {"n3", U3b, 1}};
    cairn_store *c = open_node(d3, "n1", 3, &t, NULL, other, 3);
    ck_assert_int_eq(cairn_store_heads(c, &hc, &nhc), 0);
    ck_assert_uint_eq(nhc, 1);
    ck_assert(memcmp(ha[0].b, hc[0].b, CAIRN_HASH_LEN) != 0);
    free(ha);
    free(hb);
    free(hc);
    /* the revision stays etcd's fresh 1: membership takes none */
    cairn_header h;
    cairn_store_header(a, &h);
    ck_assert_int_eq(h.revision, 1);
    close_and_remove(a, d1);
    close_and_remove(b, d2);
    close_and_remove(c, d3);
}
END_TEST

START_TEST(changes_and_errors)
{
    uint64_t t = 1700000000000ull;
    char *d = make_tmpdir();
    cairn_store *s = open_node(d, "n1", 1, &t, NULL, INITIAL, 3);
    uint64_t n1 = cairn_store_member_id_of(U1, 1, "tok");
    static const char *const L[] = {"http://127.0.0.1:2390"};
    static const char *const L2[] = {"http://127.0.0.1:2391"};
    static const char *const BAD[] = {"x"};
    uint64_t id = 0;
    ck_assert_int_eq(cairn_store_member_add(s, &id, BAD, 1, 1), CAIRN_EMEMBERBADURLS);
    ck_assert_int_eq(cairn_store_member_add(s, &id, U2, 1, 1), CAIRN_EPEERURLEXIST);
    ck_assert_int_eq(cairn_store_member_add(s, &id, L, 1, 1), 0);
    /* etcd's id: the URLs, the token and the time in seconds */
    ck_assert_uint_eq(id, cairn_store_member_id_at(L, 1, "tok", 1700000000));
    ck_assert_uint_ne(id, cairn_store_member_id_of(L, 1, "tok"));
    uint64_t id2;
    /* the same URL in the same second: the same id, which exists */
    ck_assert_int_eq(cairn_store_member_add(s, &id2, L, 1, 0), CAIRN_EMEMBEREXIST);
    t += 1000;
    ck_assert_int_eq(cairn_store_member_add(s, &id2, L, 1, 0), CAIRN_EPEERURLEXIST);
    ck_assert_int_eq(cairn_store_member_add(s, &id2, L2, 1, 1), CAIRN_ETOOMANYLEARNERS);
    ck_assert_int_eq(cairn_store_member_state(s, id), 1);
    ck_assert_int_eq(cairn_store_member_state(s, n1), 0);
    ck_assert_int_eq(cairn_store_member_state(s, 42), CAIRN_ENOTFOUND);

    ck_assert_int_eq(cairn_store_member_update(s, 42, L2, 1), CAIRN_EMEMBERNOTFOUND);
    ck_assert_int_eq(cairn_store_member_update(s, id, U1, 1), CAIRN_EPEERURLEXIST);
    /* etcd 3.4 panics applying this; cairn refuses it */
    ck_assert_int_eq(cairn_store_member_update(s, id, BAD, 1), CAIRN_EMEMBERBADURLS);
    ck_assert_int_eq(cairn_store_member_update(s, id, L2, 1), 0);
    ck_assert_int_eq(cairn_store_member_state(s, id), 1); /* still a learner */

    ck_assert_int_eq(cairn_store_member_promote(s, 42), CAIRN_EMEMBERNOTFOUND);
    ck_assert_int_eq(cairn_store_member_promote(s, n1), CAIRN_EMEMBERNOTLEARNER);
    ck_assert_int_eq(cairn_store_member_promote(s, id), CAIRN_ELEARNERNOTREADY);

    /* publish: this node's name and client URLs; nothing if unchanged */
    static const char *const C[] = {"http://127.0.0.1:2379"};
    uint64_t g = cairn_store_members_gen(s);
    ck_assert_int_eq(cairn_store_member_publish(s, "n1", C, 1), 0);
    ck_assert_uint_ne(cairn_store_members_gen(s), g);
    g = cairn_store_members_gen(s);
    ck_assert_int_eq(cairn_store_member_publish(s, "n1", C, 1), 0);
    ck_assert_uint_eq(cairn_store_members_gen(s), g);

    ck_assert_int_eq(cairn_store_member_remove(s, 42), CAIRN_EMEMBERNOTFOUND);
    ck_assert_int_eq(cairn_store_member_remove(s, id), 0);
    ck_assert_int_eq(cairn_store_member_remove(s, id), CAIRN_EMEMBERNOTFOUND);
    cairn_header h;
    cairn_store_header(s, &h);
    ck_assert_int_eq(h.revision, 1);

    /* the table survives a reopen (recovery path) */
    ck_assert_int_eq(cairn_store_member_add(s, &id2, L2, 1, 0), 0);
    cairn_store_close(s);
    s = open_node(d, "n1", 1, &t, NULL, INITIAL, 3);
    cairn_member_info *v;
    size_t n;
    ck_assert_int_eq(cairn_store_member_list(s, &v, &n), 0);
    ck_assert_uint_eq(n, 4);
    const cairn_member_info *me = member(v, n, n1);
    ck_assert_ptr_nonnull(me);
    ck_assert_uint_eq(me->nclient_urls, 1);
    ck_assert_str_eq(me->client_urls[0], C[0]);
    ck_assert_ptr_nonnull(member(v, n, id2));
    ck_assert_ptr_null(member(v, n, id));
    cairn_store_member_list_free(v, n);
    close_and_remove(s, d);
}
END_TEST

START_TEST(leases_leave_members_gen)
{
    uint64_t t = 1700000000000ull;
    char *d = make_tmpdir();
    cairn_store *s = open_node(d, "n1", 1, &t, NULL, INITIAL, 3);
    uint64_t g = cairn_store_members_gen(s);
    ck_assert_int_eq(cairn_store_lease_grant(s, 7, 10), 0);
    t += 8000; /* past TTL/2: the keepalive writes a change */
    int64_t ttl;
    ck_assert_int_eq(cairn_store_lease_keepalive(s, &ttl, 7), 0);
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke(s, &h, 7), 0);
    ck_assert_uint_eq(cairn_store_members_gen(s), g);
    static const char *const L[] = {"http://127.0.0.1:2390"};
    uint64_t id;
    ck_assert_int_eq(cairn_store_member_add(s, &id, L, 1, 0), 0);
    ck_assert_uint_ne(cairn_store_members_gen(s), g);
    close_and_remove(s, d);
}
END_TEST

START_TEST(joined_store)
{
    uint64_t t = 1700000000000ull;
    char *d1 = make_tmpdir(), *d4 = make_tmpdir();
    captured c1 = {0};
    cairn_store *s1 = open_node(d1, "n1", 1, &t, &c1, INITIAL, 3);
    static const char *const L[] = {"http://127.0.0.1:2390"};
    uint64_t id4;
    ck_assert_int_eq(cairn_store_member_add(s1, &id4, L, 1, 0), 0);
    cairn_put_req p = {
        .key = (const uint8_t *)"k", .key_len = 1, .value = (const uint8_t *)"v", .value_len = 1};
    cairn_put_resp pr;
    memset(&pr, 0, sizeof pr);
    ck_assert_int_eq(cairn_store_put(s1, &pr, &p), 0);
    cairn_put_resp_destroy(&pr);

    /* n4 joins: its own flags would make another table (itself alone) */
    static const cairn_store_member SELF[1] = {{"n4", L, 1}};
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.name = "n4";
    o.cluster_token = "tok";
    o.initial_cluster = SELF;
    o.ninitial_cluster = 1;
    o.clock_ms = clock_of;
    o.clock_arg = &t;
    o.join = 1;
    o.join_member_id = id4;
    o.join_cluster_id = cairn_store_cluster_id(s1);
    cairn_store *s4 = open_store_opts(d4, &o);
    ck_assert_int_eq(cairn_store_awaiting_genesis(s4), 1);
    cairn_hash *hs;
    size_t nh;
    ck_assert_int_eq(cairn_store_heads(s4, &hs, &nh), 0);
    ck_assert_uint_eq(nh, 0);
    memset(&pr, 0, sizeof pr);
    ck_assert_int_eq(cairn_store_put(s4, &pr, &p), CAIRN_ESTATE);
    cairn_put_resp_destroy(&pr);
    ck_assert_int_eq(cairn_store_lease_grant(s4, 7, 10), CAIRN_ESTATE);
    static const char *const C[] = {"http://127.0.0.1:2379"};
    ck_assert_int_ne(cairn_store_member_publish(s4, "n4", C, 1), 0);
    /* an empty joined dir reopens (a restart before anything came) */
    cairn_store_close(s4);
    s4 = open_store_opts(d4, &o);
    ck_assert_int_eq(cairn_store_awaiting_genesis(s4), 1);
    ck_assert_uint_eq(cairn_store_member_id(s4), id4);
    ck_assert_uint_eq(cairn_store_cluster_id(s4), cairn_store_cluster_id(s1));

    /* the cluster's history, from its first change: n1's genesis and
     * members change are not captured (they predate the subscriber), so
     * they go through a replica as a peer's would */
    cairn_replica *r1, *r4;
    ck_assert_int_eq(cairn_replica_new(&r1, s1, NULL), 0);
    ck_assert_int_eq(cairn_replica_new(&r4, s4, NULL), 0);
    for (int round = 0; round < 50; round++) {
        int quiet = 1;
        cairn_replica *from[2] = {r4, r1}, *to[2] = {r1, r4};
        for (int i = 0; i < 2; i++) {
            uint8_t *m;
            size_t len;
            ck_assert_int_eq(cairn_replica_generate(from[i], &m, &len), 0);
            if (!m)
                continue;
            quiet = 0;
            replica_deliver(to[i], m, len);
            free(m);
        }
        if (quiet)
            break;
    }
    cairn_replica_free(r1);
    cairn_replica_free(r4);
    captured_free(&c1);
    ck_assert_int_eq(cairn_store_awaiting_genesis(s4), 0);
    same_table(s1, s4);
    cairn_range_req rq = {.key = (const uint8_t *)"k", .key_len = 1};
    cairn_range_resp rr;
    memset(&rr, 0, sizeof rr);
    ck_assert_int_eq(cairn_store_range(s4, &rr, &rq), 0);
    ck_assert_uint_eq(rr.nkvs, 1);
    cairn_range_resp_destroy(&rr);
    /* it publishes into the entry member add made, and a reopen keeps it */
    ck_assert_int_eq(cairn_store_member_publish(s4, "n4", C, 1), 0);
    cairn_store_close(s4);
    s4 = open_store_opts(d4, &o);
    ck_assert_int_eq(cairn_store_awaiting_genesis(s4), 0);
    cairn_member_info *v;
    size_t n;
    ck_assert_int_eq(cairn_store_member_list(s4, &v, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_str_eq(member(v, n, id4)->name, "n4");
    cairn_store_member_list_free(v, n);
    close_and_remove(s4, d4);
    close_and_remove(s1, d1);
}
END_TEST

START_TEST(concurrent_changes_merge)
{
    uint64_t ta = 1700000000000ull, tb = 1700000000000ull;
    char *da = make_tmpdir(), *db = make_tmpdir();
    captured ca = {0}, cb = {0};
    cairn_store *a = open_node(da, "n1", 1, &ta, &ca, INITIAL, 3);
    cairn_store *b = open_node(db, "n2", 2, &tb, &cb, INITIAL, 3);
    static const char *const L[] = {"http://127.0.0.1:2390"};
    static const char *const LA[] = {"http://127.0.0.1:2391"};
    static const char *const LB[] = {"http://127.0.0.1:2392"};
    uint64_t x;
    ck_assert_int_eq(cairn_store_member_add(a, &x, L, 1, 1), 0);
    deliver(b, &ca);
    same_table(a, b);
    ck_assert_int_eq(cairn_store_member_state(b, x), 1);

    /* remove on a, update on b, concurrently: the remove wins on both */
    ta += 1000;
    tb += 5000; /* b's update is the later one in time, and still loses */
    ck_assert_int_eq(cairn_store_member_remove(a, x), 0);
    ck_assert_int_eq(cairn_store_member_update(b, x, LB, 1), 0);
    deliver(b, &ca);
    deliver(a, &cb);
    same_table(a, b);
    ck_assert_int_eq(cairn_store_member_state(a, x), CAIRN_ENOTFOUND);

    /* two updates of one member's peer URLs: the later clock wins */
    uint64_t n3 = cairn_store_member_id_of(U3, 1, "tok");
    ta += 10000;
    tb = ta + 1000;
    ck_assert_int_eq(cairn_store_member_update(a, n3, LA, 1), 0);
    ck_assert_int_eq(cairn_store_member_update(b, n3, LB, 1), 0);
    deliver(b, &ca);
    deliver(a, &cb);
    same_table(a, b);
    cairn_member_info *v;
    size_t n;
    ck_assert_int_eq(cairn_store_member_list(a, &v, &n), 0);
    ck_assert_str_eq(member(v, n, n3)->peer_urls[0], LB[0]);
    cairn_store_member_list_free(v, n);

    close_and_remove(a, da);
    close_and_remove(b, db);
    captured_free(&ca);
    captured_free(&cb);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("store_members");
    TCase *tc = tcase_create("members");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, initial_table_same_on_every_node);
    tcase_add_test(tc, changes_and_errors);
    tcase_add_test(tc, concurrent_changes_merge);
    tcase_add_test(tc, leases_leave_members_gen);
    tcase_add_test(tc, joined_store);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
