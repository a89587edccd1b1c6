/*
 * Sync protocol: two replicas that diverged converge in two round trips;
 * several replicas converge transitively over a line, a ring and a star;
 * lossy transport (drops, duplicates, reordering, lost sync state) still
 * converges; forced Bloom false positives and tiny message bounds still
 * converge; push; peer_has; the decoder rejects bad bytes with the right
 * code and the encoding is canonical; a rejected change (a fork) crosses
 * once and is neither asked for nor judged again.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/dag.h"
#include "crdt/doc.h"
#include "crdt/error.h"
#include "crdt/sync.h"
#include "tests/unit/sync_apply.h"

/* ---- helpers -------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

static void salt_next(uint8_t salt[CAIRN_BLOOM_SALT_LEN], uint64_t *rng)
{
    for (int i = 0; i < CAIRN_BLOOM_SALT_LEN; i += 8) {
        uint64_t v = rng_next(rng);
        memcpy(salt + i, &v, 8);
    }
}

static cairn_doc *new_doc(uint8_t id)
{
    cairn_actor a;
    memset(a.b, 0, sizeof a.b);
    a.b[0] = id;
    a.b[15] = (uint8_t)(id * 7 + 1);
    cairn_doc *d = NULL;
    ck_assert_int_eq(cairn_doc_new(&d, &a), 0);
    return d;
}

static uint64_t test_clock = 1000;

/* |n| local changes on |d|, each one Put of a ~40-byte value, reported to
 * |obs| (may be NULL); their encoded bytes are added to *bytes (may be NULL). */
static void edit_seen(cairn_doc *d, const char *tag, int n, size_t *bytes,
                      const cairn_doc_observer *obs)
{
    for (int i = 0; i < n; i++) {
        char key[64], val[64];
        int kl = snprintf(key, sizeof key, "%s/%d", tag, i);
        int vl = snprintf(val, sizeof val, "value of %s number %d ........", tag, i);
        cairn_value v = {.type = CAIRN_V_BYTES};
        v.v.bytes.ptr = (const uint8_t *)val;
        v.v.bytes.len = (size_t)vl;
        ck_assert_int_eq(cairn_doc_begin(d, ++test_clock), 0);
        ck_assert_int_eq(cairn_doc_put(d, CAIRN_ROOT, (const uint8_t *)key, (size_t)kl, &v), 0);
        const cairn_change *c = NULL;
        ck_assert_int_eq(cairn_doc_commit(d, &c, obs), 0);
        ck_assert_ptr_nonnull(c);
        if (bytes)
            *bytes += c->len;
    }
}

static void edit(cairn_doc *d, const char *tag, int n, size_t *bytes)
{
    edit_seen(d, tag, n, bytes, NULL);
}

/* Copies every change of |from| into |to| directly (a common base). */
static void copy_all(cairn_doc *to, const cairn_doc *from)
{
    const cairn_dag *d = cairn_doc_dag(from);
    for (uint64_t i = 0; i < cairn_dag_count(d); i++) {
        cairn_change *copy = NULL;
        ck_assert_int_eq(cairn_dag_load(&copy, d, i), 0);
        ck_assert_int_eq(cairn_doc_receive(to, copy, NULL), 0);
    }
}

static int same_heads(const cairn_doc *a, const cairn_doc *b)
{
    const cairn_hash *ha, *hb;
    size_t na = cairn_dag_heads(cairn_doc_dag(a), &ha);
    size_t nb = cairn_dag_heads(cairn_doc_dag(b), &hb);
    return na == nb && (na == 0 || memcmp(ha, hb, na * sizeof *ha) == 0);
}

static void assert_same_state(const cairn_doc *a, const cairn_doc *b)
{
    ck_assert(same_heads(a, b));
    ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(a)), cairn_dag_count(cairn_doc_dag(b)));
    uint8_t *da = NULL, *db = NULL;
    size_t la = 0, lb = 0;
    ck_assert_int_eq(cairn_doc_dump(&da, &la, a), 0);
    ck_assert_int_eq(cairn_doc_dump(&db, &lb, b), 0);
    ck_assert_uint_eq(la, lb);
    ck_assert(memcmp(da, db, la) == 0);
    free(da);
    free(db);
}

struct stats {
    size_t msgs, bytes, rounds_to_converge, rounds;
};

/* Until neither side has anything to send: each round is one flight A->B
 * then one B->A (a flight: generate until it says nothing to send).
 * Returns 0 when quiescent within |max| rounds. */
static int sync_pair_obs(cairn_doc *a, const cairn_doc_observer *oa, cairn_sync_state *sa,
                         cairn_doc *b, const cairn_doc_observer *ob, cairn_sync_state *sb,
                         uint64_t *rng, size_t max, struct stats *st)
{
    memset(st, 0, sizeof *st);
    for (size_t r = 1; r <= max; r++) {
        int any = 0;
        for (int dir = 0; dir < 2; dir++) {
            cairn_doc *from = dir ? b : a, *to = dir ? a : b;
            cairn_sync_state *sf = dir ? sb : sa, *stt = dir ? sa : sb;
            const cairn_doc_observer *oto = dir ? oa : ob;
            /* A flight: everything |from| has to say before an answer. */
            for (int burst = 0;; burst++) {
                uint8_t salt[CAIRN_BLOOM_SALT_LEN], *m = NULL;
                size_t len = 0;
                ck_assert_int_lt(burst, 1000);
                salt_next(salt, rng);
                ck_assert_int_eq(cairn_sync_generate(&m, &len, from, sf, salt), 0);
                if (!m)
                    break;
                any = 1;
                st->msgs++;
                st->bytes += len;
                ck_assert_int_eq(sync_apply(to, stt, m, len, oto), 0);
                free(m);
            }
            if (!st->rounds_to_converge && same_heads(a, b))
                st->rounds_to_converge = r;
        }
        if (!any) {
            st->rounds = r - 1;
            return 0;
        }
    }
    return -1;
}

static int sync_pair(cairn_doc *a, cairn_sync_state *sa, cairn_doc *b, cairn_sync_state *sb,
                     uint64_t *rng, size_t max, struct stats *st)
{
    return sync_pair_obs(a, NULL, sa, b, NULL, sb, rng, max, st);
}

static cairn_sync_state *new_state(const cairn_sync_limits *l)
{
    cairn_sync_state *s = NULL;
    ck_assert_int_eq(cairn_sync_state_new(&s, l), 0);
    return s;
}

/* ---- two replicas ---------------------------------------------------------- */

START_TEST(empty_docs)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 1;
    struct stats st;
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 5, &st), 0);
    ck_assert_uint_le(st.msgs, 2);
    ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(a)), 0);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST

static void diverged(int k, int base, int keep_state)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 42 + (uint64_t)k;
    struct stats st;
    size_t ideal = 0;
    edit(a, "base", base, NULL);
    if (keep_state) {
        ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    } else {
        copy_all(b, a);
    }
    edit(a, "a", k, &ideal);
    edit(b, "b", k, &ideal);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 20, &st), 0);
    assert_same_state(a, b);
    ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(a)), (uint64_t)(base + 2 * k));
    /* Two round trips; the data is there after one and a half. A fresh
     * session over a long history first trades samples (one more message). */
    int sampled = !keep_state && base > 512;
    ck_assert_uint_le(st.rounds_to_converge, 2);
    ck_assert_uint_le(st.msgs, sampled ? 5 : 4);
    /* Bytes: the changes themselves, Bloom filters over the k new changes
     * (and the base when there is no shared state and it is short, else a
     * log-size sample), heads, framing. */
    size_t slack = 400 + (sampled ? 1200 : (size_t)(keep_state ? 0 : base) * 3);
    ck_assert_uint_le(st.bytes, ideal + ideal / 20 + slack);
    /* Each change crossed the link once (one that depends on the change
     * before it in its message without that dependency's id). */
    ck_assert_uint_ge(st.bytes + 2 * (size_t)k * CAIRN_HASH_LEN, ideal);
    /* Both now know the other has everything. */
    const cairn_dag *d = cairn_doc_dag(a);
    for (uint64_t i = 0; i < cairn_dag_count(d); i++) {
        ck_assert_int_eq(cairn_sync_peer_has(sa, a, cairn_dag_hash_at(d, i)), 1);
        ck_assert_int_eq(cairn_sync_peer_has(sb, b, cairn_dag_hash_at(d, i)), 1);
    }
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}

START_TEST(diverged_small)
{
    diverged(1, 0, 0);
    diverged(3, 1, 0);
    diverged(10, 5, 1);
}
END_TEST

START_TEST(diverged_large)
{
    diverged(300, 50, 1);
    diverged(300, 50, 0);
}
END_TEST

START_TEST(fresh_session_long_history)
{
    /* 1500 common changes, no sync state: the whole-history filters would
     * cost ~3.7 KB; the samples cost ~0.8 KB. */
    diverged(10, 1500, 0);
    diverged(200, 1500, 0);
    /* The first message carries a sample, not a filter. */
    cairn_doc *a = new_doc(1);
    edit(a, "h", 1000, NULL);
    cairn_sync_state *s = new_state(NULL);
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {0}, *m;
    size_t len;
    ck_assert_int_eq(cairn_sync_generate(&m, &len, a, s, salt), 0);
    cairn_sync_msg dm;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, NULL), 0);
    ck_assert_int_eq(dm.has_sample, 1);
    ck_assert_int_eq(dm.has_filter, 0);
    ck_assert_uint_ge(dm.nsample, 10); /* 1, 2, 4, ... 512 back, and the first */
    ck_assert_uint_le(dm.nsample, 12);
    uint8_t *re;
    size_t relen;
    ck_assert_int_eq(cairn_sync_msg_encode(&re, &relen, &dm), 0);
    ck_assert(relen == len && memcmp(re, m, len) == 0);
    free(re);
    cairn_sync_msg_destroy(&dm);
    free(m);
    /* Sent once per session: the next message without news is nothing; after
     * a reset the sample goes again. */
    ck_assert_int_eq(cairn_sync_generate(&m, &len, a, s, salt), 0);
    ck_assert_ptr_null(m);
    cairn_sync_reset(s);
    ck_assert_int_eq(cairn_sync_generate(&m, &len, a, s, salt), 0);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, NULL), 0);
    ck_assert_int_eq(dm.has_sample, 1);
    cairn_sync_msg_destroy(&dm);
    free(m);
    cairn_sync_state_free(s);
    cairn_doc_free(a);
}
END_TEST

START_TEST(one_side_ahead)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 7;
    struct stats st;
    edit(a, "a", 20, NULL);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    assert_same_state(a, b);
    /* Fresh peers: one round to learn b's heads, then everything at once. */
    ck_assert_uint_le(st.rounds_to_converge, 2);
    ck_assert_uint_le(st.msgs, 4);
    /* Then b moves on alone: with a's heads known, its first message
     * carries the changes. */
    edit(b, "b", 5, NULL);
    ck_assert_int_eq(sync_pair(b, sb, a, sa, &rng, 10, &st), 0);
    assert_same_state(a, b);
    ck_assert_uint_le(st.rounds_to_converge, 1);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST

START_TEST(peer_has_tracks_acknowledgement)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 9;
    struct stats st;
    edit(a, "a", 3, NULL);
    const cairn_hash *h;
    ck_assert_uint_eq(cairn_dag_heads(cairn_doc_dag(a), &h), 1);
    cairn_hash first = *cairn_dag_hash_at(cairn_doc_dag(a), 0);
    cairn_hash head = h[0];
    ck_assert_int_eq(cairn_sync_peer_has(sa, a, &head), 0);
    ck_assert_int_eq(cairn_sync_peer_has(sa, a, &first), 0);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    ck_assert_int_eq(cairn_sync_peer_has(sa, a, &head), 1);
    ck_assert_int_eq(cairn_sync_peer_has(sa, a, &first), 1);
    /* A new change is not had until acknowledged. */
    edit(a, "a2", 1, NULL);
    ck_assert_uint_eq(cairn_dag_heads(cairn_doc_dag(a), &h), 1);
    cairn_hash fresh = h[0];
    ck_assert_int_eq(cairn_sync_peer_has(sa, a, &fresh), 0);
    ck_assert_int_eq(cairn_sync_peer_has(sa, a, &head), 1);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    ck_assert_int_eq(cairn_sync_peer_has(sa, a, &fresh), 1);
    /* b's change is not known to a's view of b until b reports it. */
    cairn_hash unknown;
    memset(unknown.b, 0xAB, sizeof unknown.b);
    ck_assert_int_eq(cairn_sync_peer_has(sa, a, &unknown), 0);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST

/* cairn_sync_lag: what the peer has not acknowledged, exactly, and the
 * floor that keeps a call's walk to what came since. */
START_TEST(lag_counts_unacknowledged)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 11, n = 99, first = 99;
    struct stats st;
    edit(a, "a", 5, NULL);
    /* nothing heard from the peer yet: unknown */
    ck_assert_int_eq(cairn_sync_lag(&n, &first, sa, a), CAIRN_ENOTFOUND);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    ck_assert_int_eq(cairn_sync_lag(&n, &first, sa, a), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(first, 5);
    /* three new changes, none acknowledged: the first is at index 5 */
    edit(a, "a2", 3, NULL);
    ck_assert_int_eq(cairn_sync_lag(&n, &first, sa, a), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(first, 5);
    /* a change of b's that a has: b has it too (its heads say so) */
    edit(b, "b", 2, NULL);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    ck_assert_int_eq(cairn_sync_lag(&n, &first, sa, a), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(first, cairn_dag_count(cairn_doc_dag(a)));
    /* the next call walks only what came since: one change, one step */
    edit(a, "a3", 1, NULL);
    uint64_t steps = cairn_dag_walk_steps_(cairn_doc_dag(a));
    ck_assert_int_eq(cairn_sync_lag(&n, &first, sa, a), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_le(cairn_dag_walk_steps_(cairn_doc_dag(a)) - steps, 4);
    /* b's lag for a: what b holds that a has not acknowledged */
    ck_assert_int_eq(cairn_sync_lag(&n, &first, sb, b), 0);
    ck_assert_uint_eq(n, 0);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST

START_TEST(push_then_sync)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 11;
    struct stats st;
    edit(a, "base", 4, NULL);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    /* Three fresh changes pushed at once. */
    cairn_change *fresh[3];
    edit(a, "p", 3, NULL);
    const cairn_dag *da = cairn_doc_dag(a);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(cairn_dag_load(&fresh[i], da, cairn_dag_count(da) - 3 + (uint64_t)i), 0);
    uint8_t *m = NULL;
    size_t len = 0, np = 0;
    ck_assert_int_eq(cairn_sync_push(&m, &len, &np, a, sa, (const cairn_change *const *)fresh, 3),
                     0);
    ck_assert_ptr_nonnull(m);
    ck_assert_uint_eq(np, 3);
    cairn_sync_msg dm;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, NULL), 0);
    ck_assert_int_eq(dm.has_filter, 0);
    ck_assert_uint_eq(dm.nchanges, 3);
    cairn_sync_msg_destroy(&dm);
    ck_assert_int_eq(sync_apply(b, sb, m, len, NULL), 0);
    free(m);
    assert_same_state(a, b);
    /* Pushing them again sends nothing: they are in flight already. */
    ck_assert_int_eq(cairn_sync_push(&m, &len, &np, a, sa, (const cairn_change *const *)fresh, 3),
                     0);
    ck_assert_ptr_null(m);
    /* b acknowledges; a has nothing more to send. */
    ck_assert_int_eq(sync_pair(b, sb, a, sa, &rng, 10, &st), 0);
    ck_assert_uint_le(st.msgs, 2);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(cairn_sync_peer_has(sa, a, &fresh[i]->hash), 1);
    for (int i = 0; i < 3; i++)
        cairn_change_free(fresh[i]);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST

/* ---- bounds and false positives ------------------------------------------- */

START_TEST(bounded_messages)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_limits l;
    cairn_sync_limits_default(&l);
    l.max_changes = 3;
    l.target_msg_bytes = 300;
    cairn_sync_state *sa = new_state(&l), *sb = new_state(&l);
    uint64_t rng = 5;
    edit(a, "a", 25, NULL);
    edit(b, "b", 17, NULL);
    /* Drive by hand to check each message respects the bound. */
    size_t rounds = 0;
    for (; rounds < 100; rounds++) {
        int any = 0;
        for (int dir = 0; dir < 2; dir++) {
            cairn_doc *from = dir ? b : a, *to = dir ? a : b;
            cairn_sync_state *sf = dir ? sb : sa, *stt = dir ? sa : sb;
            uint8_t salt[CAIRN_BLOOM_SALT_LEN], *m = NULL;
            size_t len = 0;
            salt_next(salt, &rng);
            ck_assert_int_eq(cairn_sync_generate(&m, &len, from, sf, salt), 0);
            if (!m)
                continue;
            any = 1;
            cairn_sync_msg dm;
            ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, &l), 0);
            ck_assert_uint_le(dm.nchanges, 3);
            cairn_sync_msg_destroy(&dm);
            ck_assert_int_eq(sync_apply(to, stt, m, len, NULL), 0);
            free(m);
        }
        if (!any)
            break;
    }
    ck_assert_uint_lt(rounds, 100);
    assert_same_state(a, b);
    /* The stream is bounded too: a message with more changes is refused. */
    cairn_sync_limits tiny = l;
    tiny.max_changes = 1;
    cairn_sync_state *st1 = new_state(&l), *st2 = new_state(&tiny);
    cairn_doc *c = new_doc(3);
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {0}, *m = NULL;
    size_t len;
    ck_assert_int_eq(cairn_sync_generate(&m, &len, c, st2, salt), 0);
    ck_assert_int_eq(sync_apply(a, st1, m, len, NULL), 0);
    free(m);
    ck_assert_int_eq(cairn_sync_generate(&m, &len, a, st1, salt), 0);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(sync_apply(c, st2, m, len, NULL), CAIRN_ELIMIT);
    free(m);
    cairn_sync_state_free(st1);
    cairn_sync_state_free(st2);
    cairn_doc_free(c);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST

START_TEST(forced_false_positives)
{
    /* A one-byte filter with 1 probe: most changes look present, so they are
     * recovered through need and the exact mode. */
    for (int variant = 0; variant < 3; variant++) {
        cairn_doc *a = new_doc(1), *b = new_doc(2);
        cairn_sync_limits l;
        cairn_sync_limits_default(&l);
        l.max_filter_bytes = 1;
        l.bloom_probes = variant == 2 ? 3 : 1;
        cairn_sync_state *sa = new_state(&l), *sb = new_state(&l);
        uint64_t rng = 77 + (uint64_t)variant;
        struct stats st;
        edit(a, "base", 3, NULL);
        copy_all(b, a);
        edit(a, "a", 12 + variant, NULL);
        edit(b, "b", 9, NULL);
        if (variant == 1) {
            /* and a third writer's branch merged into b only */
            cairn_doc *c = new_doc(3);
            copy_all(c, a);
            edit(c, "c", 6, NULL);
            copy_all(b, c);
            cairn_doc_free(c);
        }
        ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 60, &st), 0);
        assert_same_state(a, b);
        cairn_sync_state_free(sa);
        cairn_sync_state_free(sb);
        cairn_doc_free(a);
        cairn_doc_free(b);
    }
}
END_TEST

/* ---- several replicas ------------------------------------------------------ */

#define NODES 5

struct net {
    cairn_doc *doc[NODES];
    cairn_sync_state *st[NODES][NODES]; /* st[i][j]: i's state for peer j */
    int link[NODES][NODES];
};

static void net_init(struct net *n, int topo, const cairn_sync_limits *l)
{
    memset(n, 0, sizeof *n);
    for (int i = 0; i < NODES; i++) {
        n->doc[i] = new_doc((uint8_t)(i + 1));
        for (int j = 0; j < NODES; j++)
            n->st[i][j] = new_state(l);
    }
    for (int i = 0; i < NODES; i++)
        for (int j = 0; j < NODES; j++) {
            int on = 0;
            if (topo == 0) /* line */
                on = (j == i + 1 || i == j + 1);
            else if (topo == 1) /* ring */
                on = (j == (i + 1) % NODES || i == (j + 1) % NODES);
            else /* star around node 0 */
                on = i != j && (i == 0 || j == 0);
            n->link[i][j] = on;
        }
}

static void net_free(struct net *n)
{
    for (int i = 0; i < NODES; i++) {
        for (int j = 0; j < NODES; j++)
            cairn_sync_state_free(n->st[i][j]);
        cairn_doc_free(n->doc[i]);
    }
}

/* Every link syncs until nothing moves anywhere; returns passes used. */
static int net_run(struct net *n, uint64_t *rng, int max_passes)
{
    for (int pass = 1; pass <= max_passes; pass++) {
        int any = 0;
        for (int i = 0; i < NODES; i++)
            for (int j = 0; j < NODES; j++) {
                if (!n->link[i][j])
                    continue;
                uint8_t salt[CAIRN_BLOOM_SALT_LEN], *m = NULL;
                size_t len = 0;
                salt_next(salt, rng);
                ck_assert_int_eq(cairn_sync_generate(&m, &len, n->doc[i], n->st[i][j], salt), 0);
                if (!m)
                    continue;
                any = 1;
                ck_assert_int_eq(sync_apply(n->doc[j], n->st[j][i], m, len, NULL), 0);
                free(m);
            }
        if (!any)
            return pass;
    }
    return -1;
}

START_TEST(topologies)
{
    cairn_sync_limits l;
    cairn_sync_limits_default(&l);
    for (int variant = 0; variant < 6; variant++) {
        int topo = variant % 3;
        if (variant >= 3)
            l.sample_min_changes = 2; /* sample on first contact */
        struct net n;
        net_init(&n, topo, &l);
        uint64_t rng = 100 + (uint64_t)variant;
        char tag[16];
        for (int i = 0; i < NODES; i++) {
            snprintf(tag, sizeof tag, "n%d", i);
            edit(n.doc[i], tag, 4 + i, NULL);
        }
        ck_assert_int_gt(net_run(&n, &rng, 40), 0);
        for (int i = 1; i < NODES; i++)
            assert_same_state(n.doc[0], n.doc[i]);
        ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(n.doc[0])), 4 + 5 + 6 + 7 + 8);
        /* Edits at the ends travel across again. */
        edit(n.doc[NODES - 1], "late", 3, NULL);
        edit(n.doc[1], "late1", 2, NULL);
        ck_assert_int_gt(net_run(&n, &rng, 40), 0);
        for (int i = 1; i < NODES; i++)
            assert_same_state(n.doc[0], n.doc[i]);
        net_free(&n);
    }
}
END_TEST

/* ---- lossy transport ---------------------------------------------------- */

struct wire {
    uint8_t *m[64];
    size_t len[64];
    size_t n;
};

static void wire_push(struct wire *w, uint8_t *m, size_t len)
{
    if (w->n == 64) {
        free(m); /* the network is full: dropped */
        return;
    }
    w->m[w->n] = m;
    w->len[w->n] = len;
    w->n++;
}

static void wire_clear(struct wire *w)
{
    for (size_t i = 0; i < w->n; i++)
        free(w->m[i]);
    w->n = 0;
}

/* Delivers message |i| of |w| (removing it) to (doc, state). */
static void wire_deliver(struct wire *w, size_t i, cairn_doc *d, cairn_sync_state *s)
{
    uint8_t *m = w->m[i];
    size_t len = w->len[i];
    memmove(&w->m[i], &w->m[i + 1], (w->n - i - 1) * sizeof w->m[0]);
    memmove(&w->len[i], &w->len[i + 1], (w->n - i - 1) * sizeof w->len[0]);
    w->n--;
    ck_assert_int_eq(sync_apply(d, s, m, len, NULL), 0);
    free(m);
}

static void lossy_run(uint64_t seed, const cairn_sync_limits *l)
{
    cairn_doc *doc[2] = {new_doc(1), new_doc(2)};
    cairn_sync_state *st[2] = {new_state(l), new_state(l)};
    struct wire w[2] = {0}; /* w[i]: messages to node i */
    uint64_t rng = seed;
    edit(doc[0], "base", 5, NULL);
    copy_all(doc[1], doc[0]);
    for (int step = 0; step < 400; step++) {
        uint64_t r = rng_next(&rng);
        int node = (int)(r & 1), other = 1 - node;
        switch ((r >> 1) % 8) {
        case 0: /* local edit */
        {
            char tag[32];
            snprintf(tag, sizeof tag, "s%d-%d", node, step);
            edit(doc[node], tag, 1 + (int)((r >> 8) % 3), NULL);
            break;
        }
        case 1:
        case 2:
        case 3: { /* generate; the network drops 1 in 4 and duplicates 1 in 8 */
            uint8_t salt[CAIRN_BLOOM_SALT_LEN], *m = NULL;
            size_t len = 0;
            salt_next(salt, &rng);
            ck_assert_int_eq(cairn_sync_generate(&m, &len, doc[node], st[node], salt), 0);
            if (!m)
                break;
            uint64_t fate = (r >> 12) % 8;
            if (fate < 2) {
                free(m);
            } else {
                if (fate == 2) {
                    uint8_t *dup = malloc(len);
                    memcpy(dup, m, len);
                    wire_push(&w[other], dup, len);
                }
                wire_push(&w[other], m, len);
            }
            break;
        }
        case 4:
        case 5:
        case 6: /* deliver one in-flight message, in any order */
            if (w[node].n)
                wire_deliver(&w[node], (size_t)((r >> 16) % w[node].n), doc[node], st[node]);
            break;
        case 7: /* a timer fires, or the node restarts and loses its sync state */
            if ((r >> 20) % 4 == 0) {
                cairn_sync_state_free(st[node]);
                st[node] = new_state(l);
            } else {
                cairn_sync_reset(st[node]);
            }
            break;
        }
    }
    /* The network heals: FIFO, no loss. A timer resets in-flight state once. */
    wire_clear(&w[0]);
    wire_clear(&w[1]);
    cairn_sync_reset(st[0]);
    cairn_sync_reset(st[1]);
    struct stats s;
    ck_assert_int_eq(sync_pair(doc[0], st[0], doc[1], st[1], &rng, 50, &s), 0);
    assert_same_state(doc[0], doc[1]);
    for (int i = 0; i < 2; i++) {
        cairn_sync_state_free(st[i]);
        cairn_doc_free(doc[i]);
    }
}

START_TEST(lossy_transport)
{
    cairn_sync_limits l;
    cairn_sync_limits_default(&l);
    for (uint64_t seed = 1; seed <= 8; seed++)
        lossy_run(seed * 0x9E3779B97F4A7C15ull, &l);
    /* Samples on every fresh start, and a tiny filter. */
    l.sample_min_changes = 4;
    for (uint64_t seed = 9; seed <= 12; seed++)
        lossy_run(seed * 0x9E3779B97F4A7C15ull, &l);
    l.max_filter_bytes = 2;
    for (uint64_t seed = 13; seed <= 16; seed++)
        lossy_run(seed * 0x9E3779B97F4A7C15ull, &l);
}
END_TEST

START_TEST(restart_from_scratch)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 3;
    struct stats st;
    edit(a, "a", 10, NULL);
    edit(b, "b", 10, NULL);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    edit(a, "a2", 4, NULL);
    /* b restarts: its state for a is gone; a keeps its own. */
    cairn_sync_state_free(sb);
    sb = new_state(NULL);
    ck_assert_int_eq(sync_pair(b, sb, a, sa, &rng, 10, &st), 0);
    assert_same_state(a, b);
    ck_assert_uint_le(st.rounds_to_converge, 2);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST

START_TEST(restart_after_lost_message)
{
    /* a's changes are lost on the wire; b restarts. b's hello makes a send
     * them again, without a's timer ever firing. */
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 21;
    struct stats st;
    edit(a, "a", 5, NULL);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    edit(a, "lost", 4, NULL);
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {0}, *m;
    size_t len;
    ck_assert_int_eq(cairn_sync_generate(&m, &len, a, sa, salt), 0);
    ck_assert_ptr_nonnull(m); /* carries the 4 changes: dropped */
    free(m);
    ck_assert_int_eq(cairn_sync_generate(&m, &len, a, sa, salt), 0);
    ck_assert_ptr_null(m); /* a believes they are in flight */
    cairn_sync_state_free(sb);
    sb = new_state(NULL);
    ck_assert_int_eq(sync_pair(b, sb, a, sa, &rng, 10, &st), 0);
    assert_same_state(a, b);
    /* One round: not one need round trip per lost change. */
    ck_assert_uint_le(st.rounds_to_converge, 1);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST

static cairn_sync_state *save_load(cairn_sync_state *s)
{
    uint8_t *buf;
    size_t len;
    ck_assert_int_eq(cairn_sync_state_save(&buf, &len, s), 0);
    cairn_sync_state_free(s);
    cairn_sync_state *t = NULL;
    ck_assert_int_eq(cairn_sync_state_load(&t, buf, len, NULL), 0);
    uint8_t *again;
    size_t alen;
    ck_assert_int_eq(cairn_sync_state_save(&again, &alen, t), 0);
    ck_assert(alen == len && memcmp(again, buf, len) == 0);
    free(again);
    free(buf);
    return t;
}

START_TEST(saved_state_restart)
{
    /* Both restart with their saved states: the first filters cover only
     * the changes since the last sync, not the 600-change history. */
    size_t bytes[2];
    for (int saved = 0; saved < 2; saved++) {
        cairn_doc *a = new_doc(1), *b = new_doc(2);
        cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
        uint64_t rng = 31;
        struct stats st;
        size_t ideal = 0;
        edit(a, "base", 600, NULL);
        ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
        const cairn_hash *sh;
        ck_assert_uint_ge(cairn_sync_shared_heads(sa, &sh), 1);
        if (saved) {
            sa = save_load(sa);
            sb = save_load(sb);
            ck_assert_uint_ge(cairn_sync_shared_heads(sa, &sh), 1);
        } else {
            cairn_sync_state_free(sa);
            cairn_sync_state_free(sb);
            sa = new_state(NULL);
            sb = new_state(NULL);
        }
        edit(a, "a", 20, &ideal);
        edit(b, "b", 20, &ideal);
        ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
        assert_same_state(a, b);
        ck_assert_uint_le(st.rounds_to_converge, 2);
        bytes[saved] = st.bytes;
        if (saved)
            ck_assert_uint_le(st.bytes, ideal + 500);
        cairn_sync_state_free(sa);
        cairn_sync_state_free(sb);
        cairn_doc_free(a);
        cairn_doc_free(b);
    }
    ck_assert_uint_lt(bytes[1], bytes[0]);
}
END_TEST

START_TEST(state_load_rejects)
{
    cairn_sync_state *s = NULL;
    static const uint8_t empty_ok[] = {1, 0};
    ck_assert_int_eq(cairn_sync_state_load(&s, empty_ok, sizeof empty_ok, NULL), 0);
    cairn_sync_state_free(s);
    ck_assert_int_eq(cairn_sync_state_load(&s, empty_ok, 0, NULL), CAIRN_ETRUNCATED);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(cairn_sync_state_load(&s, empty_ok, 1, NULL), CAIRN_ETRUNCATED);
    static const uint8_t badver[] = {2, 0};
    ck_assert_int_eq(cairn_sync_state_load(&s, badver, sizeof badver, NULL), CAIRN_EBADVERSION);
    static const uint8_t trailing[] = {1, 0, 0};
    ck_assert_int_eq(cairn_sync_state_load(&s, trailing, sizeof trailing, NULL), CAIRN_ENONCANON);
    static const uint8_t many[] = {1, 0xff, 0xff, 0x03};
    ck_assert_int_eq(cairn_sync_state_load(&s, many, sizeof many, NULL), CAIRN_ELIMIT);
    static const uint8_t shortb[] = {1, 1, 7, 7};
    ck_assert_int_eq(cairn_sync_state_load(&s, shortb, sizeof shortb, NULL), CAIRN_ETRUNCATED);
    uint8_t uns[2 + 64] = {1, 2};
    memset(uns + 2, 5, 32);
    memset(uns + 34, 4, 32);
    ck_assert_int_eq(cairn_sync_state_load(&s, uns, sizeof uns, NULL), CAIRN_EUNSORTED);
    ck_assert_ptr_null(s);
}
END_TEST

/* ---- encoding ----------------------------------------------------------- */

/* A message with heads, need, filter and two changes. */
static void sample_msg(uint8_t **m, size_t *len, cairn_doc **keep)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    edit(a, "a", 2, NULL);
    edit(b, "b", 2, NULL);
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {1, 2, 3};
    ck_assert_int_eq(cairn_sync_generate(m, len, a, sa, salt), 0);
    ck_assert_int_eq(sync_apply(b, sb, *m, *len, NULL), 0);
    free(*m);
    ck_assert_int_eq(cairn_sync_generate(m, len, b, sb, salt), 0);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(b);
    *keep = a;
}

START_TEST(decode_canonical_roundtrip)
{
    uint8_t *m;
    size_t len;
    cairn_doc *a;
    sample_msg(&m, &len, &a);
    cairn_sync_msg dm;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, NULL), 0);
    ck_assert_uint_eq(dm.nheads, 1);
    ck_assert_uint_eq(dm.nneed, 1); /* a's head, unknown to b */
    ck_assert_int_eq(dm.has_filter, 1);
    ck_assert_uint_eq(dm.nchanges, 2);
    uint8_t *re;
    size_t relen;
    ck_assert_int_eq(cairn_sync_msg_encode(&re, &relen, &dm), 0);
    ck_assert_uint_eq(relen, len);
    ck_assert(memcmp(re, m, len) == 0);
    free(re);
    /* The encoder refuses non-canonical input. */
    cairn_hash tmp[2];
    memset(tmp[0].b, 2, 32);
    memset(tmp[1].b, 1, 32);
    cairn_hash *saved = dm.heads;
    size_t savedn = dm.nheads;
    dm.heads = tmp;
    dm.nheads = 2;
    ck_assert_int_eq(cairn_sync_msg_encode(&re, &relen, &dm), CAIRN_EINVAL);
    dm.heads = saved;
    dm.nheads = savedn;
    cairn_sync_msg_destroy(&dm);
    free(m);
    cairn_doc_free(a);
}
END_TEST

START_TEST(decode_rejects)
{
    uint8_t *m;
    size_t len;
    cairn_doc *a;
    sample_msg(&m, &len, &a);
    cairn_sync_msg dm;
    /* Every strict prefix fails (never accepted, never crashes). */
    for (size_t n = 0; n < len; n++) {
        int rc = cairn_sync_msg_decode(&dm, m, n, NULL);
        ck_assert_int_lt(rc, 0);
        ck_assert_ptr_null(dm.heads);
    }
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, 1, NULL), CAIRN_ETRUNCATED);
    /* Trailing byte. */
    uint8_t *big = malloc(len + 1);
    memcpy(big, m, len);
    big[len] = 0;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, big, len + 1, NULL), CAIRN_ENONCANON);
    free(big);
    uint8_t *c = malloc(len);
    /* Version and flags. */
    memcpy(c, m, len);
    c[0] = CAIRN_SYNC_VERSION + 1;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, c, len, NULL), CAIRN_EBADVERSION);
    memcpy(c, m, len);
    c[0] = 1; /* version 1: the same fields, other rules */
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, c, len, NULL), CAIRN_EBADVERSION);
    memcpy(c, m, len);
    c[1] |= 16;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, c, len, NULL), CAIRN_ENONCANON);
    memcpy(c, m, len);
    c[1] |= 0x80;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, c, len, NULL), CAIRN_ENONCANON);
    /* Over the size limit. */
    cairn_sync_limits l;
    cairn_sync_limits_default(&l);
    l.max_msg_bytes = len - 1;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, &l), CAIRN_ELIMIT);
    cairn_sync_limits_default(&l);
    l.max_changes = 1;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, &l), CAIRN_ELIMIT);
    cairn_sync_limits_default(&l);
    l.max_filter_bytes = 1;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, &l), CAIRN_ELIMIT);
    /* A change whose bytes were altered: never accepted under its old id. */
    cairn_sync_msg good;
    ck_assert_int_eq(cairn_sync_msg_decode(&good, m, len, NULL), 0);
    cairn_hash orig = good.changes[1]->hash;
    cairn_sync_msg_destroy(&good);
    for (size_t i = len - 30; i < len; i++) {
        memcpy(c, m, len);
        c[i] ^= 0x01;
        int rc = cairn_sync_msg_decode(&dm, c, len, NULL);
        if (rc == 0) {
            ck_assert(cairn_hash_cmp(&dm.changes[1]->hash, &orig) != 0);
            cairn_sync_msg_destroy(&dm);
        }
    }
    free(c);
    /* Hand-made messages. */
    static const uint8_t huge_heads[] = {CAIRN_SYNC_VERSION, 0, 0xff, 0xff, 0xff, 0xff, 0x0f};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, huge_heads, sizeof huge_heads, NULL), CAIRN_ELIMIT);
    static const uint8_t trunc_heads[] = {CAIRN_SYNC_VERSION, 0, 2, 0, 0, 0};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, trunc_heads, sizeof trunc_heads, NULL),
                     CAIRN_ETRUNCATED);
    static const uint8_t nonmin[] = {CAIRN_SYNC_VERSION, 0, 0x80, 0x00, 0, 0};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, nonmin, sizeof nonmin, NULL), CAIRN_ENONCANON);
    static const uint8_t over64[] = {
        CAIRN_SYNC_VERSION, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, over64, sizeof over64, NULL), CAIRN_ENONCANON);
    static const uint8_t empty_ok[] = {CAIRN_SYNC_VERSION, 0, 0, 0, 0};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, empty_ok, sizeof empty_ok, NULL), 0);
    cairn_sync_msg_destroy(&dm);
    static const uint8_t zero_probes[] = {CAIRN_SYNC_VERSION,
                                          1,
                                          0,
                                          0,
                                          0,
                                          0,
                                          1,
                                          2,
                                          3,
                                          4,
                                          5,
                                          6,
                                          7,
                                          8,
                                          9,
                                          10,
                                          11,
                                          12,
                                          13,
                                          14,
                                          15,
                                          16,
                                          0,
                                          0};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, zero_probes, sizeof zero_probes, NULL),
                     CAIRN_ENONCANON);
    static const uint8_t big_sample[] = {CAIRN_SYNC_VERSION, 2, 0, 0, 66};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, big_sample, sizeof big_sample, NULL), CAIRN_ELIMIT);
    static const uint8_t trunc_sample[] = {CAIRN_SYNC_VERSION, 2, 0, 0, 1, 5};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, trunc_sample, sizeof trunc_sample, NULL),
                     CAIRN_ETRUNCATED);
    static const uint8_t many_changes[] = {CAIRN_SYNC_VERSION, 0, 0, 0, 0xff, 0x7f, 1, 1};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, many_changes, sizeof many_changes, NULL),
                     CAIRN_ELIMIT);
    static const uint8_t long_change[] = {CAIRN_SYNC_VERSION, 0, 0, 0, 1, 0x7e, 1, 2};
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, long_change, sizeof long_change, NULL),
                     CAIRN_ETRUNCATED);
    static const uint8_t empty_change[] = {CAIRN_SYNC_VERSION, 0, 0, 0, 1, 0, 0};
    ck_assert_int_lt(cairn_sync_msg_decode(&dm, empty_change, sizeof empty_change, NULL), 0);
    /* Unsorted heads. */
    uint8_t uns[2 + 1 + 64 + 2] = {CAIRN_SYNC_VERSION, 0, 2};
    memset(uns + 3, 9, 32);
    memset(uns + 35, 8, 32);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, uns, sizeof uns, NULL), CAIRN_EUNSORTED);
    memset(uns + 35, 9, 32); /* duplicate */
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, uns, sizeof uns, NULL), CAIRN_EUNSORTED);
    /* receive() of a bad message leaves the document untouched. */
    cairn_sync_state *s = new_state(NULL);
    uint64_t before = cairn_dag_count(cairn_doc_dag(a));
    ck_assert_int_eq(sync_apply(a, s, m, len - 1, NULL), CAIRN_ETRUNCATED);
    ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(a)), before);
    const cairn_hash *th;
    ck_assert_uint_eq(cairn_sync_their_heads(s, &th), 0);
    cairn_sync_state_free(s);
    free(m);
    cairn_doc_free(a);
}
END_TEST

/* ---- version 2's abbreviations (sync.c) ---------------------------------- */

/* Bytes built by hand: a change's encoding or a whole sync message. */
struct raw {
    uint8_t b[1024];
    size_t n;
};

static void raw_uv(struct raw *r, uint64_t v)
{
    do {
        ck_assert_uint_lt(r->n, sizeof r->b);
        r->b[r->n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
}

static void raw_put(struct raw *r, const void *p, size_t n)
{
    ck_assert_uint_le(r->n + n, sizeof r->b);
    memcpy(r->b + r->n, p, n);
    r->n += n;
}

/* An op-less change of actor 7 (change.c's encoding) with deps |deps|
 * (sorted here), and its id. */
static struct raw raw_change(uint64_t seq, const cairn_hash *deps, size_t ndeps, cairn_hash *id)
{
    cairn_hash d[4];
    ck_assert_uint_le(ndeps, 4);
    if (ndeps > 0) { /* a genesis change passes no array at all */
        memcpy(d, deps, ndeps * sizeof *d);
        qsort(d, ndeps, sizeof *d, (int (*)(const void *, const void *))cairn_hash_cmp);
    }
    struct raw r = {.n = 0};
    uint8_t head[1 + CAIRN_ACTOR_LEN];
    head[0] = 0xC1;
    memset(head + 1, 7, CAIRN_ACTOR_LEN);
    raw_put(&r, head, sizeof head);
    raw_uv(&r, seq);
    raw_uv(&r, 1);          /* start_op */
    raw_uv(&r, 1000 + seq); /* time_ms */
    raw_uv(&r, ndeps);
    raw_put(&r, d, ndeps * sizeof *d);
    raw_uv(&r, 0); /* no other actors */
    raw_uv(&r, 0); /* no ops */
    cairn_hash_bytes(id, r.b, r.n);
    return r;
}

/* |r| less the 32 bytes of dependency |h| (which must be in it). */
static struct raw raw_cut(const struct raw *r, const cairn_hash *h)
{
    for (size_t i = 0; i + CAIRN_HASH_LEN <= r->n; i++)
        if (memcmp(r->b + i, h->b, CAIRN_HASH_LEN) == 0) {
            struct raw c = {.n = 0};
            raw_put(&c, r->b, i);
            raw_put(&c, r->b + i + CAIRN_HASH_LEN, r->n - i - CAIRN_HASH_LEN);
            return c;
        }
    ck_abort_msg("dependency not found");
    return *r;
}

/* The header of a message with no need, filter or sample: |flags|, the
 * heads unless |flags| has bit 3, and the changes' count. */
static struct raw rmsg_start(uint8_t flags, const cairn_hash *heads, size_t nheads,
                              size_t nchanges)
{
    struct raw m = {.n = 0};
    m.b[m.n++] = CAIRN_SYNC_VERSION;
    m.b[m.n++] = flags;
    if (!(flags & 8)) {
        raw_uv(&m, nheads);
        raw_put(&m, heads, nheads * sizeof *heads);
    }
    raw_uv(&m, 0); /* need */
    raw_uv(&m, nchanges);
    return m;
}

/* One change: in full (|cut| 0) or with a dependency cut out. */
static void rmsg_change(struct raw *m, const struct raw *c, int cut)
{
    raw_uv(m, (uint64_t)c->n << 1 | (cut ? 1 : 0));
    raw_put(m, c->b, c->n);
}

/*
 * A chain c1 <- c2 <- c3 of one author (c3 also depends on x, sorting
 * before or after c2 as |x_first| says), the heads c3: the encoder spells
 * c1 in full, c2 and c3 each without the id of the change before it, and
 * the heads as bit 3; the decoder puts the ids back, recomputes every id
 * from the bytes it rebuilt, and re-encodes to the same bytes.
 */
static void check_chain(int x_first)
{
    cairn_hash x, h1, h2, h3;
    memset(x.b, x_first ? 0x00 : 0xff, sizeof x.b);
    struct raw c1 = raw_change(1, NULL, 0, &h1);
    struct raw c2 = raw_change(2, &h1, 1, &h2);
    cairn_hash d3[2] = {h2, x};
    struct raw c3 = raw_change(3, d3, 2, &h3);
    cairn_change *ch[3];
    const struct raw *raws[3] = {&c1, &c2, &c3};
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(cairn_change_decode(&ch[i], raws[i]->b, raws[i]->n, NULL), 0);
    cairn_sync_msg m = {0};
    m.heads = &h3;
    m.nheads = 1;
    m.changes = ch;
    m.nchanges = 3;
    uint8_t *enc;
    size_t len;
    ck_assert_int_eq(cairn_sync_msg_encode(&enc, &len, &m), 0);

    struct raw want = rmsg_start(8, NULL, 0, 3);
    struct raw c2cut = raw_cut(&c2, &h1), c3cut = raw_cut(&c3, &h2);
    rmsg_change(&want, &c1, 0);
    rmsg_change(&want, &c2cut, 1);
    rmsg_change(&want, &c3cut, 1);
    ck_assert_uint_eq(len, want.n);
    ck_assert(memcmp(enc, want.b, len) == 0);
    /* version 1 spelt out the heads (a count and an id) and both deps;
     * every length here fits one varint byte */
    ck_assert_uint_eq(len + 1 + 3 * CAIRN_HASH_LEN,
                      2 + 1 + CAIRN_HASH_LEN + 1 + 1 + 3 + c1.n + c2.n + c3.n);

    cairn_sync_msg dm;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, enc, len, NULL), 0);
    ck_assert_uint_eq(dm.nchanges, 3);
    const cairn_hash *ids[3] = {&h1, &h2, &h3};
    for (int i = 0; i < 3; i++) {
        ck_assert(cairn_hash_cmp(&dm.changes[i]->hash, ids[i]) == 0);
        ck_assert_uint_eq(dm.changes[i]->len, raws[i]->n);
        ck_assert(memcmp(dm.changes[i]->bytes, raws[i]->b, raws[i]->n) == 0);
    }
    ck_assert_uint_eq(dm.nheads, 1);
    ck_assert(cairn_hash_cmp(&dm.heads[0], &h3) == 0);
    uint8_t *re;
    size_t relen;
    ck_assert_int_eq(cairn_sync_msg_encode(&re, &relen, &dm), 0);
    ck_assert_uint_eq(relen, len);
    ck_assert(memcmp(re, enc, len) == 0);
    free(re);
    cairn_sync_msg_destroy(&dm);

    /* Heads that are not the last change are spelt out. */
    m.heads = &h2;
    ck_assert_int_eq(cairn_sync_msg_encode(&re, &relen, &m), 0);
    ck_assert_uint_eq(re[1], 0);
    ck_assert_uint_eq(relen, len + 1 + CAIRN_HASH_LEN);
    free(re);
    free(enc);
    for (int i = 0; i < 3; i++)
        cairn_change_free(ch[i]);
}

START_TEST(chain_is_sent_cut)
{
    check_chain(0);
    check_chain(1);
}
END_TEST

START_TEST(cut_spellings_rejected)
{
    cairn_hash h1, h2, other;
    struct raw c1 = raw_change(1, NULL, 0, &h1);
    struct raw c2 = raw_change(2, &h1, 1, &h2);
    struct raw c2cut = raw_cut(&c2, &h1);
    struct raw lone = raw_change(5, NULL, 0, &other); /* depends on nothing */
    cairn_sync_msg dm;
    struct raw m;

    /* the good one, for reference */
    m = rmsg_start(8, NULL, 0, 2);
    rmsg_change(&m, &c1, 0);
    rmsg_change(&m, &c2cut, 1);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), 0);
    cairn_sync_msg_destroy(&dm);
    /* c2 in full although it depends on c1 */
    m = rmsg_start(8, NULL, 0, 2);
    rmsg_change(&m, &c1, 0);
    rmsg_change(&m, &c2, 0);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), CAIRN_ENONCANON);
    ck_assert_ptr_null(dm.changes);
    /* the heads spelt out although they are the last change */
    m = rmsg_start(0, &h2, 1, 2);
    rmsg_change(&m, &c1, 0);
    rmsg_change(&m, &c2cut, 1);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), CAIRN_ENONCANON);
    /* ... but other heads are fine */
    m = rmsg_start(0, &h1, 1, 2);
    rmsg_change(&m, &c1, 0);
    rmsg_change(&m, &c2cut, 1);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), 0);
    ck_assert(cairn_hash_cmp(&dm.heads[0], &h1) == 0);
    cairn_sync_msg_destroy(&dm);
    /* bit 3 with no change to be the heads */
    m = rmsg_start(8, NULL, 0, 0);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), CAIRN_ENONCANON);
    /* a cut on the first change: nothing before it */
    m = rmsg_start(8, NULL, 0, 1);
    rmsg_change(&m, &c2cut, 1);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), CAIRN_ENONCANON);
    /* a cut change with no dependency to put back */
    m = rmsg_start(8, NULL, 0, 2);
    rmsg_change(&m, &c1, 0);
    rmsg_change(&m, &lone, 1);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), CAIRN_ENONCANON);
    /* c2 cut, after another change than c1: that one's id goes back in,
     * and what arrives is another change than c2 (its id is computed
     * from the bytes rebuilt) */
    m = rmsg_start(8, NULL, 0, 2);
    rmsg_change(&m, &lone, 0);
    rmsg_change(&m, &c2cut, 1);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), 0);
    ck_assert(cairn_hash_cmp(&dm.changes[1]->hash, &h2) != 0);
    ck_assert(cairn_hash_cmp(&dm.changes[1]->deps[0], &other) == 0);
    cairn_sync_msg_destroy(&dm);
    /* a cut whose deps are not all there */
    cairn_hash h3, d3[2] = {h2, other};
    struct raw c3 = raw_change(3, d3, 2, &h3);
    struct raw c3short = raw_cut(&c3, &h2);
    /* version, author, seq, start_op, time_ms (2 bytes), the deps count,
     * then half of the dep left */
    c3short.n = 1 + CAIRN_ACTOR_LEN + 5 + 16;
    m = rmsg_start(8, NULL, 0, 2);
    rmsg_change(&m, &c2, 0);
    rmsg_change(&m, &c3short, 1);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), CAIRN_ETRUNCATED);
    /* the id put back twice: a duplicate dep, which the change decoder
     * refuses */
    cairn_hash d4[2] = {h2, other};
    cairn_hash h4;
    struct raw c4 = raw_change(3, d4, 2, &h4); /* deps h2 and other, */
    struct raw c4dup = raw_cut(&c4, &other);   /* less other: only h2 */
    m = rmsg_start(8, NULL, 0, 2);
    rmsg_change(&m, &c2, 0);
    /* declares 2 deps, holds h2, gets h2 back: {h2, h2} */
    rmsg_change(&m, &c4dup, 1);
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m.b, m.n, NULL), CAIRN_EUNSORTED);
}
END_TEST

START_TEST(hostile_need_and_heads)
{
    /* A peer that asks for and claims hashes nobody has: no crash, no
     * endless exchange. */
    cairn_doc *a = new_doc(1);
    edit(a, "a", 3, NULL);
    cairn_sync_state *s = new_state(NULL);
    cairn_sync_msg hm = {0};
    cairn_hash fake[3];
    for (int i = 0; i < 3; i++)
        memset(fake[i].b, 0x10 * (i + 1), 32);
    hm.heads = fake;
    hm.nheads = 3;
    hm.need = fake;
    hm.nneed = 2;
    uint8_t *m;
    size_t len;
    ck_assert_int_eq(cairn_sync_msg_encode(&m, &len, &hm), 0);
    ck_assert_int_eq(sync_apply(a, s, m, len, NULL), 0);
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {0};
    uint8_t *out;
    size_t olen;
    ck_assert_int_eq(cairn_sync_generate(&out, &olen, a, s, salt), 0);
    ck_assert_ptr_nonnull(out);
    cairn_sync_msg dm;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, out, olen, NULL), 0);
    ck_assert_uint_eq(dm.nneed, 3); /* we ask for the unknown heads */
    ck_assert_int_eq(dm.has_filter, 1);
    cairn_sync_msg_destroy(&dm);
    free(out);
    /* Same message again: nothing new to say. */
    ck_assert_int_eq(sync_apply(a, s, m, len, NULL), 0);
    ck_assert_int_eq(cairn_sync_generate(&out, &olen, a, s, salt), 0);
    ck_assert_ptr_null(out);
    free(m);
    cairn_sync_state_free(s);
    cairn_doc_free(a);
}
END_TEST

/* ---- rejected changes ------------------------------------------------------------ */

static void count_fork(void *arg, const cairn_change *c, const cairn_hash *held)
{
    (void)c;
    (void)held;
    ++*(int *)arg;
}

/* How many of |m|'s changes are |h|. */
static int carries(const uint8_t *m, size_t len, const cairn_hash *h)
{
    cairn_sync_msg dm;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, NULL), 0);
    int k = 0;
    for (size_t i = 0; i < dm.nchanges; i++)
        k += cairn_hash_cmp(&dm.changes[i]->hash, h) == 0;
    cairn_sync_msg_destroy(&dm);
    return k;
}

START_TEST(rejected_not_refetched)
{
    /* One author forked (two data dirs with one actor): |a| holds one
     * change of (actor 1, seq 1), |b| the other and two changes of its own
     * on top. Each rejects the other's; before rejected hashes were
     * remembered, each asked for the other's head by hash every round and
     * got the same rejected change back, forever. Now each crosses once and
     * the pair goes quiet, and a hostile resend is not judged again. */
    cairn_doc *a = new_doc(1), *f = new_doc(1), *b = new_doc(2);
    edit(a, "a", 1, NULL);
    edit(f, "f", 1, NULL);
    copy_all(b, f);
    edit(b, "b", 2, NULL);
    const cairn_hash *ha, *hf;
    ck_assert_uint_eq(cairn_dag_heads(cairn_doc_dag(a), &ha), 1);
    ck_assert_uint_eq(cairn_dag_heads(cairn_doc_dag(f), &hf), 1);
    cairn_hash xa = ha[0], xf = hf[0];
    int forks_a = 0, forks_b = 0;
    cairn_doc_observer oa = {.arg = &forks_a, .fork_cb = count_fork};
    cairn_doc_observer ob = {.arg = &forks_b, .fork_cb = count_fork};
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 77;
    int crossed_a = 0, crossed_f = 0, quiet_from = 0;
    size_t late_msgs = 0;
    uint8_t *keep = NULL;
    size_t keep_len = 0;
    for (int r = 1; r <= 30; r++) {
        int any = 0;
        for (int dir = 0; dir < 2; dir++) {
            cairn_doc *from = dir ? b : a, *to = dir ? a : b;
            cairn_sync_state *sf = dir ? sb : sa, *st = dir ? sa : sb;
            for (int burst = 0;; burst++) {
                ck_assert_int_lt(burst, 100);
                uint8_t salt[CAIRN_BLOOM_SALT_LEN], *m = NULL;
                size_t len = 0;
                salt_next(salt, &rng);
                ck_assert_int_eq(cairn_sync_generate(&m, &len, from, sf, salt), 0);
                if (!m)
                    break;
                any = 1;
                if (r > 5)
                    late_msgs++;
                int k = carries(m, len, dir ? &xf : &xa);
                *(dir ? &crossed_f : &crossed_a) += k;
                int rc = sync_apply(to, st, m, len, dir ? &oa : &ob);
                ck_assert(rc == 0 || (k && rc == CAIRN_EFORK));
                if (!dir && k && !keep) {
                    keep = m;
                    keep_len = len;
                } else {
                    free(m);
                }
            }
        }
        if (!any && !quiet_from)
            quiet_from = r;
    }
    ck_assert_int_eq(crossed_a, 1);
    ck_assert_int_eq(crossed_f, 1);
    ck_assert_int_ne(quiet_from, 0);
    ck_assert_uint_eq(late_msgs, 0);
    ck_assert_int_eq(forks_a, 1);
    ck_assert_int_eq(forks_b, 1);
    /* Each holds its own fork; the other is remembered, not asked for. */
    ck_assert_int_eq(cairn_dag_has(cairn_doc_dag(b), &xa), 2);
    ck_assert_int_eq(cairn_dag_rejected(cairn_doc_dag(b), &xa), CAIRN_EFORK);
    ck_assert_int_eq(cairn_dag_has(cairn_doc_dag(a), &xf), 2);
    cairn_hash *miss = NULL;
    size_t nmiss = 9;
    ck_assert_int_eq(cairn_dag_missing(&miss, &nmiss, cairn_doc_dag(a)), 0);
    ck_assert_uint_eq(nmiss, 0);
    free(miss);
    /* A peer that sends it again (a fresh session): dropped as known, the
     * document does not judge it again. */
    cairn_sync_state *s2 = new_state(NULL);
    ck_assert_ptr_nonnull(keep);
    ck_assert_int_eq(sync_apply(b, s2, keep, keep_len, &ob), 0);
    ck_assert_int_eq(forks_b, 1);
    free(keep);
    cairn_sync_state_free(s2);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
    cairn_doc_free(f);
}
END_TEST

/* ---- bodies from a loader ------------------------------------------------------ */

/* A stand-in for the store: the canonical bytes of every change the doc
 * applied, by apply index, captured from the observer; the doc's DAG keeps
 * none and reads them back through bs_load. */
struct body_store {
    uint8_t **b;
    size_t *len;
    size_t n, cap;
    size_t loads;
    long corrupt_at; /* this index comes back with one bit flipped; -1 none */
    int fail_rc;     /* non-zero: every load fails with it */
};

static void bs_change(void *arg, const cairn_change *c, uint64_t index, int begin)
{
    struct body_store *s = arg;
    if (!begin)
        return;
    ck_assert_uint_eq(index, s->n);
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->b = realloc(s->b, s->cap * sizeof *s->b);
        s->len = realloc(s->len, s->cap * sizeof *s->len);
        ck_assert(s->b && s->len);
    }
    s->b[s->n] = malloc(c->len);
    ck_assert_ptr_nonnull(s->b[s->n]);
    memcpy(s->b[s->n], c->bytes, c->len);
    s->len[s->n++] = c->len;
}

static int bs_load(void *arg, uint64_t index, uint8_t **bytes, size_t *len)
{
    struct body_store *s = arg;
    s->loads++;
    if (s->fail_rc)
        return s->fail_rc;
    if (index >= s->n)
        return CAIRN_ENOTFOUND;
    uint8_t *b = malloc(s->len[index]);
    if (!b)
        return CAIRN_ENOMEM;
    memcpy(b, s->b[index], s->len[index]);
    if ((long)index == s->corrupt_at)
        b[s->len[index] / 2] ^= 0x10;
    *bytes = b;
    *len = s->len[index];
    return 0;
}

static void bs_free(struct body_store *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->b[i]);
    free(s->b);
    free(s->len);
}

static cairn_doc *loader_doc(uint8_t id, struct body_store *bs, cairn_doc_observer *obs)
{
    memset(bs, 0, sizeof *bs);
    bs->corrupt_at = -1;
    cairn_doc *d = new_doc(id);
    ck_assert_int_eq(cairn_doc_set_loader(d, bs_load, bs), 0);
    obs->arg = bs;
    obs->change_cb = bs_change;
    obs->patch_cb = NULL;
    return d;
}

START_TEST(loader_sync_converges)
{
    struct body_store ba, bb;
    cairn_doc_observer oa, ob;
    cairn_doc *a = loader_doc(1, &ba, &oa), *b = loader_doc(2, &bb, &ob);
    edit_seen(a, "a", 30, NULL, &oa);
    /* only before the first change */
    ck_assert_int_eq(cairn_doc_set_loader(a, bs_load, &ba), CAIRN_ESTATE);
    edit_seen(b, "b", 20, NULL, &ob);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 77;
    struct stats st;
    ck_assert_int_eq(sync_pair_obs(a, &oa, sa, b, &ob, sb, &rng, 10, &st), 0);
    assert_same_state(a, b);
    ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(a)), 50);
    /* what each side sent came from its loader */
    ck_assert_uint_ge(ba.loads, 30);
    ck_assert_uint_ge(bb.loads, 20);
    /* more edits on both sides, and again */
    edit_seen(a, "a2", 7, NULL, &oa);
    edit_seen(b, "b2", 9, NULL, &ob);
    ck_assert_int_eq(sync_pair_obs(a, &oa, sa, b, &ob, sb, &rng, 10, &st), 0);
    assert_same_state(a, b);
    /* a state rebuilt from loaded bodies equals the live one */
    const cairn_hash *h;
    size_t nh = cairn_dag_heads(cairn_doc_dag(a), &h);
    cairn_doc *past;
    ck_assert_int_eq(cairn_doc_new_at(&past, a, h, nh), 0);
    assert_same_state(past, a);
    cairn_doc_free(past);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
    bs_free(&ba);
    bs_free(&bb);
}
END_TEST

START_TEST(loader_corrupt_body)
{
    struct body_store ba, bb;
    cairn_doc_observer oa, ob;
    cairn_doc *a = loader_doc(1, &ba, &oa), *b = loader_doc(2, &bb, &ob);
    edit_seen(a, "a", 6, NULL, &oa);
    const cairn_dag *da = cairn_doc_dag(a);
    cairn_hash bad = *cairn_dag_hash_at(da, 2);
    ba.corrupt_at = 2;
    cairn_change *c = (cairn_change *)1;
    ck_assert_int_eq(cairn_dag_load(&c, da, 2), CAIRN_ECORRUPT);
    ck_assert_ptr_null(c);
    uint8_t *bytes = (uint8_t *)1;
    size_t len = 1;
    ck_assert_int_eq(cairn_dag_load_bytes(&bytes, &len, da, 2), CAIRN_ECORRUPT);
    ck_assert_ptr_null(bytes);
    ck_assert_int_eq(cairn_dag_load(&c, da, 1), 0);
    cairn_change_free(c);
    /* a read at past heads needs it: the error surfaces, no doc */
    const cairn_hash *h;
    size_t nh = cairn_dag_heads(da, &h);
    cairn_doc *past = (cairn_doc *)1;
    ck_assert_int_eq(cairn_doc_new_at(&past, a, h, nh), CAIRN_ECORRUPT);
    ck_assert_ptr_null(past);

    /* Sync: a's generate fails once it must send change 2, with no message;
     * b never gets change 2 (nor anything built on it). */
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {0};
    int saw_corrupt = 0;
    for (int round = 0; round < 6; round++) {
        uint8_t *m = NULL;
        size_t ml = 0;
        int rc = cairn_sync_generate(&m, &ml, a, sa, salt);
        if (rc == CAIRN_ECORRUPT) {
            ck_assert_ptr_null(m);
            saw_corrupt = 1;
        } else {
            ck_assert_int_eq(rc, 0);
        }
        if (m) {
            ck_assert_int_eq(sync_apply(b, sb, m, ml, &ob), 0);
            free(m);
        }
        ck_assert_int_eq(cairn_sync_generate(&m, &ml, b, sb, salt), 0);
        if (m) {
            ck_assert_int_eq(sync_apply(a, sa, m, ml, &oa), 0);
            free(m);
        }
    }
    ck_assert(saw_corrupt);
    ck_assert_int_eq(cairn_dag_has(cairn_doc_dag(b), &bad), 0);
    ck_assert_uint_le(cairn_dag_count(cairn_doc_dag(b)), 2);

    /* storage that fails outright: its code comes through */
    ba.fail_rc = CAIRN_EIO;
    ck_assert_int_eq(cairn_dag_load(&c, da, 0), CAIRN_EIO);
    ck_assert_ptr_null(c);
    /* repaired storage: sync completes */
    ba.fail_rc = 0;
    ba.corrupt_at = -1;
    uint64_t rng = 5;
    struct stats st;
    ck_assert_int_eq(sync_pair_obs(a, &oa, sa, b, &ob, sb, &rng, 10, &st), 0);
    assert_same_state(a, b);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
    bs_free(&ba);
    bs_free(&bb);
}
END_TEST

/* The session hands the changes back and applies nothing; until the caller
 * applies them, what it tells the peer is what the document held. The
 * changes come back dependencies first even when the message has them
 * reversed. */
/* ---- quiet links (the server's mode: acks, stale filters, ticks) -------- */

/* A heads-only message from |d| (what an acknowledgement looks like). */
static void heads_msg(uint8_t **m, size_t *len, const cairn_doc *d)
{
    const cairn_hash *h;
    cairn_sync_msg msg = {0};
    msg.nheads = cairn_dag_heads(cairn_doc_dag(d), &h);
    msg.heads = (cairn_hash *)h;
    ck_assert_int_eq(cairn_sync_msg_encode(m, len, &msg), 0);
}

/* Copies the changes of |from| at indices >= |first| into |to|. */
static void copy_from(cairn_doc *to, const cairn_doc *from, uint64_t first)
{
    const cairn_dag *d = cairn_doc_dag(from);
    for (uint64_t i = first; i < cairn_dag_count(d); i++) {
        cairn_change *copy = NULL;
        ck_assert_int_eq(cairn_dag_load(&copy, d, i), 0);
        ck_assert_int_eq(cairn_doc_receive(to, copy, NULL), 0);
    }
}

START_TEST(stale_filter_not_answered)
{
    /* a sends b a filter, then moves on (changes b gets through a third
     * node, and one b lacks) and names its new heads without a filter: b
     * must not answer the old filter, which would send a its own changes. */
    cairn_doc *a = new_doc(1), *b = new_doc(2), *peer_b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 31;
    struct stats st;
    edit(a, "base", 3, NULL);
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    /* b's heads move (a change of its own): a asks with a filter */
    uint64_t nbase = cairn_dag_count(cairn_doc_dag(a));
    edit(b, "b", 1, NULL);
    uint8_t *m, salt[CAIRN_BLOOM_SALT_LEN];
    size_t len;
    heads_msg(&m, &len, b);
    ck_assert_int_eq(sync_apply(a, sa, m, len, NULL), 0);
    free(m);
    salt_next(salt, &rng);
    ck_assert_int_eq(cairn_sync_generate(&m, &len, a, sa, salt), 0);
    ck_assert_ptr_nonnull(m);
    cairn_sync_msg dm;
    ck_assert_int_eq(cairn_sync_msg_decode(&dm, m, len, NULL), 0);
    ck_assert_int_eq(dm.has_filter, 1);
    cairn_sync_msg_destroy(&dm);
    ck_assert_int_eq(sync_apply(b, sb, m, len, NULL), 0);
    free(m);
    /* a makes three changes b gets elsewhere, then one b lacks */
    edit(a, "relayed", 3, NULL);
    copy_from(b, a, nbase);
    edit(a, "ahead", 1, NULL);
    heads_msg(&m, &len, a);
    ck_assert_int_eq(sync_apply(b, sb, m, len, NULL), 0);
    free(m);
    salt_next(salt, &rng);
    ck_assert_int_eq(cairn_sync_generate(&m, &len, b, sb, salt), 0);
    ck_assert_ptr_nonnull(m); /* it asks for a's unknown head */
    const cairn_dag *dagb = cairn_doc_dag(b);
    for (uint64_t i = 0; i < cairn_dag_count(dagb); i++) {
        const cairn_hash *h = cairn_dag_hash_at(dagb, i);
        uint64_t ia;
        if (cairn_dag_find(cairn_doc_dag(a), h, &ia) == 0)
            ck_assert_msg(!carries(m, len, h), "b sends a its own change %llu back",
                          (unsigned long long)ia);
    }
    free(m);
    /* and they still converge */
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    assert_same_state(a, b);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
    cairn_doc_free(peer_b);
}
END_TEST

START_TEST(tick_holds_relayed_changes)
{
    /* b's session with c, ticked: a's changes (another author's) wait
     * until b held them at a tick and c spoke since without showing them;
     * b's own change goes at once. */
    cairn_doc *a = new_doc(1), *b = new_doc(2), *c = new_doc(3);
    cairn_sync_state *sbc = new_state(NULL), *scb = new_state(NULL);
    uint64_t rng = 41;
    struct stats st;
    ck_assert_int_eq(sync_pair(b, sbc, c, scb, &rng, 10, &st), 0);
    cairn_sync_tick(sbc, b);
    edit(a, "a", 2, NULL);
    copy_from(b, a, 0);
    edit(b, "own", 1, NULL);
    const cairn_dag *db = cairn_doc_dag(b);
    const cairn_hash *own = cairn_dag_hash_at(db, 2), *ha = cairn_dag_hash_at(db, 0);
    uint8_t *m, salt[CAIRN_BLOOM_SALT_LEN];
    size_t len;
    salt_next(salt, &rng);
    ck_assert_int_eq(cairn_sync_generate(&m, &len, b, sbc, salt), 0);
    ck_assert_ptr_nonnull(m);
    ck_assert(carries(m, len, own));
    ck_assert(!carries(m, len, ha));
    ck_assert_int_eq(sync_apply(c, scb, m, len, NULL), 0);
    free(m);
    /* c speaks, a tick: still held (b did not hold them at the tick before) */
    for (int round = 0; round < 2; round++) {
        heads_msg(&m, &len, c);
        ck_assert_int_eq(sync_apply(b, sbc, m, len, NULL), 0);
        free(m);
        cairn_sync_tick(sbc, b);
        salt_next(salt, &rng);
        ck_assert_int_eq(cairn_sync_generate(&m, &len, b, sbc, salt), 0);
        if (round == 0) {
            ck_assert(!m || !carries(m, len, ha));
        } else {
            ck_assert_ptr_nonnull(m);
            ck_assert(carries(m, len, ha));
            ck_assert_int_eq(sync_apply(c, scb, m, len, NULL), 0);
        }
        free(m);
    }
    ck_assert_int_eq(sync_pair(b, sbc, c, scb, &rng, 10, &st), 0);
    assert_same_state(b, c);
    cairn_sync_state_free(sbc);
    cairn_sync_state_free(scb);
    cairn_doc_free(a);
    cairn_doc_free(b);
    cairn_doc_free(c);
}
END_TEST

START_TEST(receive_hands_back)
{
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_sync_state *sa = new_state(NULL), *sb = new_state(NULL);
    uint64_t rng = 21;
    edit(a, "x", 3, NULL);
    const cairn_dag *da = cairn_doc_dag(a), *db = cairn_doc_dag(b);
    cairn_change *rev[3];
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(cairn_dag_load(&rev[i], da, (uint64_t)(2 - i)), 0);
    const cairn_hash *ha;
    ck_assert_uint_eq(cairn_dag_heads(da, &ha), 1);
    cairn_sync_msg m = {0};
    m.heads = (cairn_hash *)ha;
    m.nheads = 1;
    m.changes = rev;
    m.nchanges = 3;
    uint8_t *buf = NULL;
    size_t len = 0;
    ck_assert_int_eq(cairn_sync_msg_encode(&buf, &len, &m), 0);

    cairn_change **got = NULL;
    size_t n = 0;
    ck_assert_int_eq(cairn_sync_receive(&got, &n, sb, b, buf, len), 0);
    free(buf);
    ck_assert_uint_eq(n, 3);
    for (int i = 0; i < 3; i++)
        ck_assert(cairn_hash_cmp(&got[i]->hash, cairn_dag_hash_at(da, (uint64_t)i)) == 0);
    ck_assert_uint_eq(cairn_dag_count(db), 0); /* nothing applied */

    /* Not applied yet. Right after a message that carried changes, b's
     * answer is heads only (none here), no need, no filter: a is sending. */
    uint8_t salt[CAIRN_BLOOM_SALT_LEN];
    salt_next(salt, &rng);
    ck_assert_int_eq(cairn_sync_generate(&buf, &len, b, sb, salt), 0);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(cairn_sync_msg_decode(&m, buf, len, NULL), 0);
    ck_assert_uint_eq(m.nheads, 0);
    ck_assert_uint_eq(m.nneed, 0);
    ck_assert_int_eq(m.has_filter, 0);
    cairn_sync_msg_destroy(&m);
    free(buf);
    /* The next round, still not applied: it asks for a's head. */
    salt_next(salt, &rng);
    ck_assert_int_eq(cairn_sync_generate(&buf, &len, b, sb, salt), 0);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(cairn_sync_msg_decode(&m, buf, len, NULL), 0);
    ck_assert_uint_eq(m.nheads, 0);
    ck_assert_uint_eq(m.nneed, 1);
    ck_assert(cairn_hash_cmp(&m.need[0], ha) == 0);
    cairn_sync_msg_destroy(&m);
    free(buf);
    const cairn_hash *sh;
    ck_assert_uint_eq(cairn_sync_shared_heads(sb, &sh), 0);

    /* Applied (the first two only): the session learns it at once. */
    ck_assert_int_eq(cairn_doc_receive(b, got[0], NULL), 0);
    ck_assert_int_eq(cairn_doc_receive(b, got[1], NULL), 0);
    ck_assert_int_eq(cairn_sync_applied(sb, b), 0);
    ck_assert_uint_eq(cairn_sync_shared_heads(sb, &sh), 0); /* a's head still unknown */
    ck_assert_int_eq(cairn_doc_receive(b, got[2], NULL), 0);
    free(got);
    ck_assert_int_eq(cairn_sync_applied(sb, b), 0);
    ck_assert_uint_eq(cairn_sync_shared_heads(sb, &sh), 1);
    ck_assert(cairn_hash_cmp(sh, ha) == 0);

    /* A malformed message hands back nothing. */
    got = (cairn_change **)&got;
    n = 7;
    uint8_t junk[3] = {CAIRN_SYNC_VERSION, 0, 0x80};
    ck_assert_int_eq(cairn_sync_receive(&got, &n, sb, b, junk, sizeof junk), CAIRN_ETRUNCATED);
    ck_assert_ptr_null(got);
    ck_assert_uint_eq(n, 0);
    cairn_sync_changes_free(NULL, 0);

    struct stats st;
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 10, &st), 0);
    assert_same_state(a, b);
    for (int i = 0; i < 3; i++)
        cairn_change_free(rev[i]);
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST
/* ---- catch-up cost ---------------------------------------------------------- */

/* One Put into |d|'s "kvs" map (a change that names another change's
 * object, so receive validation needs its causal past). */
static void kvs_put(cairn_doc *d, const char *tag, int i)
{
    cairn_read r;
    ck_assert_int_eq(cairn_doc_get(d, &r, CAIRN_ROOT, (const uint8_t *)"kvs", 3), 0);
    ck_assert_int_eq(r.kind, CAIRN_READ_MAP);
    char key[64];
    int kl = snprintf(key, sizeof key, "%s/%d", tag, i);
    cairn_value v = {.type = CAIRN_V_BYTES};
    v.v.bytes.ptr = (const uint8_t *)"a value of some thirty bytes..";
    v.v.bytes.len = 30;
    ck_assert_int_eq(cairn_doc_begin(d, ++test_clock), 0);
    ck_assert_int_eq(cairn_doc_put(d, r.obj, (const uint8_t *)key, (size_t)kl, &v), 0);
    const cairn_change *c = NULL;
    ck_assert_int_eq(cairn_doc_commit(d, &c, NULL), 0);
}

/* A peer far behind catches up while it keeps writing locally: each sync
 * round and each received change costs about what is missing, not the
 * history. Counted in DAG walk steps (load-independent): the old code
 * walked, per received change, back to the first local write since the
 * catch-up began, and per round over the whole backlog (about N * N / 2
 * steps here). */
START_TEST(catch_up_work_is_what_is_missing)
{
    enum { N = 20000, SLICE = 256 };
    cairn_doc *a = new_doc(1), *b = new_doc(2);
    cairn_objid kvs;
    ck_assert_int_eq(cairn_doc_begin(a, ++test_clock), 0);
    ck_assert_int_eq(
        cairn_doc_put_object(a, &kvs, CAIRN_ROOT, (const uint8_t *)"kvs", 3, CAIRN_OBJ_MAP), 0);
    const cairn_change *c0 = NULL;
    ck_assert_int_eq(cairn_doc_commit(a, &c0, NULL), 0);
    copy_all(b, a);
    for (int i = 0; i < N; i++)
        kvs_put(a, "a", i);
    cairn_sync_limits l;
    cairn_sync_limits_default(&l);
    l.max_changes = SLICE;
    cairn_sync_state *sa = new_state(&l), *sb = new_state(&l);
    uint64_t rng = 11, sa0 = cairn_dag_walk_steps_(cairn_doc_dag(a)),
             sb0 = cairn_dag_walk_steps_(cairn_doc_dag(b));
    int local = 0;
    for (int round = 0; round < 4 * N / SLICE && !same_heads(a, b); round++) {
        for (int dir = 0; dir < 2; dir++) {
            cairn_doc *from = dir ? b : a, *to = dir ? a : b;
            cairn_sync_state *sf = dir ? sb : sa, *stt = dir ? sa : sb;
            uint8_t salt[CAIRN_BLOOM_SALT_LEN], *m = NULL;
            size_t len = 0;
            salt_next(salt, &rng);
            ck_assert_int_eq(cairn_sync_generate(&m, &len, from, sf, salt), 0);
            if (m)
                ck_assert_int_eq(sync_apply(to, stt, m, len, NULL), 0);
            free(m);
        }
        kvs_put(b, "b", local++); /* a local write between every two rounds */
    }
    struct stats st;
    ck_assert_int_eq(sync_pair(a, sa, b, sb, &rng, 20, &st), 0);
    assert_same_state(a, b);
    uint64_t wa = cairn_dag_walk_steps_(cairn_doc_dag(a)) - sa0,
             wb = cairn_dag_walk_steps_(cairn_doc_dag(b)) - sb0;
    /* linear in what was missing (N + the local writes), with room */
    ck_assert_uint_le(wa, (uint64_t)20 * (N + (uint64_t)local));
    ck_assert_uint_le(wb, (uint64_t)20 * (N + (uint64_t)local));
    cairn_sync_state_free(sa);
    cairn_sync_state_free(sb);
    cairn_doc_free(a);
    cairn_doc_free(b);
}
END_TEST

int main(void)
{

    Suite *s = suite_create("sync");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, empty_docs);
    tcase_add_test(tc, diverged_small);
    tcase_add_test(tc, diverged_large);
    tcase_add_test(tc, fresh_session_long_history);
    tcase_add_test(tc, one_side_ahead);
    tcase_add_test(tc, lag_counts_unacknowledged);
    tcase_add_test(tc, peer_has_tracks_acknowledgement);
    tcase_add_test(tc, push_then_sync);
    tcase_add_test(tc, bounded_messages);
    tcase_add_test(tc, forced_false_positives);
    tcase_add_test(tc, topologies);
    tcase_add_test(tc, lossy_transport);
    tcase_add_test(tc, restart_from_scratch);
    tcase_add_test(tc, restart_after_lost_message);
    tcase_add_test(tc, saved_state_restart);
    tcase_add_test(tc, state_load_rejects);
    tcase_add_test(tc, decode_canonical_roundtrip);
    tcase_add_test(tc, decode_rejects);
    tcase_add_test(tc, chain_is_sent_cut);
    tcase_add_test(tc, cut_spellings_rejected);
    tcase_add_test(tc, hostile_need_and_heads);
    tcase_add_test(tc, rejected_not_refetched);
    tcase_add_test(tc, loader_sync_converges);
    tcase_add_test(tc, loader_corrupt_body);
    tcase_add_test(tc, receive_hands_back);
    tcase_add_test(tc, stale_filter_not_answered);
    tcase_add_test(tc, tick_holds_relayed_changes);
    tcase_add_test(tc, catch_up_work_is_what_is_missing);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
