/*
 * Convergence property test for crdt/doc.c: N replicas (2..5) with fixed
 * seeds make random edits (map sets and deletes on a small shared key space,
 * nested maps, lists, counters, rolled-back edits) while their changes travel
 * through a simulated network that delivers them late, out of order and more
 * than once, always as bytes (encode -> decode). After full delivery every
 * replica, and one fresh replica fed every change in yet another order, must
 * have byte-identical heads and cairn_doc_dump. Honest changes must never be
 * rejected. cairn_doc_new_at, on another replica, must rebuild exactly the
 * state replica 0 had at a random earlier step. With checkpoints on, replica
 * 0 is checkpointed at a random step and restored (for its own actor and for
 * another), and the restored replicas must then receive, edit and commit
 * exactly as the replicas they mirror: same dumps, heads, DAG rows, seqs and
 * change bytes.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_test.h"
#include "crdt/change.h"
#include "crdt/dag.h"
#include "crdt/doc.h"
#include "crdt/doc_int.h"
#include "crdt/error.h"

#define MAX_REPLICAS 6

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static uint32_t below(uint32_t n)
{
    return n ? (uint32_t)(rnd() % n) : 0;
}

struct msg {
    uint8_t *bytes;
    size_t len;
    cairn_hash hash;
};

struct net {
    struct msg *all;
    size_t n, cap;
    /* per replica: indices into |all| still to deliver (with repeats) */
    size_t *inbox[MAX_REPLICAS];
    size_t nin[MAX_REPLICAS], capin[MAX_REPLICAS];
    /* what replica 0 was delivered, in order (indices into |all|) */
    size_t *hist0;
    size_t nhist0, caphist0;
};

static void inbox_push(struct net *net, int r, size_t m)
{
    if (net->nin[r] == net->capin[r]) {
        net->capin[r] = net->capin[r] ? net->capin[r] * 2 : 64;
        net->inbox[r] = realloc(net->inbox[r], net->capin[r] * sizeof *net->inbox[r]);
        ck_assert_ptr_nonnull(net->inbox[r]);
    }
    net->inbox[r][net->nin[r]++] = m;
}

static void broadcast(struct net *net, int from, int nrep, const cairn_change *c)
{
    if (net->n == net->cap) {
        net->cap = net->cap ? net->cap * 2 : 64;
        net->all = realloc(net->all, net->cap * sizeof *net->all);
        ck_assert_ptr_nonnull(net->all);
    }
    struct msg *m = &net->all[net->n];
    m->bytes = malloc(c->len);
    ck_assert_ptr_nonnull(m->bytes);
    memcpy(m->bytes, c->bytes, c->len);
    m->len = c->len;
    m->hash = c->hash;
    for (int r = 0; r < nrep; r++)
        if (r != from)
            inbox_push(net, r, net->n);
    net->n++;
}

static void deliver_msg(cairn_doc *d, const struct msg *m)
{
    cairn_change *c;
    ck_assert_int_eq(cairn_change_decode(&c, m->bytes, m->len, &m->hash), 0);
    ck_assert_int_eq(cairn_doc_receive(d, c, NULL), 0);
}

/* Delivers one random message of replica |r|'s inbox; sometimes keeps it
 * there to be delivered again later (a duplicate). Returns the message, or
 * NULL if the inbox was empty. */
static const struct msg *deliver_one(struct net *net, cairn_doc *d, int r)
{
    if (!net->nin[r])
        return NULL;
    size_t i = below((uint32_t)net->nin[r]);
    size_t m = net->inbox[r][i];
    deliver_msg(d, &net->all[m]);
    if (r == 0) {
        if (net->nhist0 == net->caphist0) {
            net->caphist0 = net->caphist0 ? net->caphist0 * 2 : 64;
            net->hist0 = realloc(net->hist0, net->caphist0 * sizeof *net->hist0);
            ck_assert_ptr_nonnull(net->hist0);
        }
        net->hist0[net->nhist0++] = m;
    }
    if (below(8) != 0)
        net->inbox[r][i] = net->inbox[r][--net->nin[r]];
    return &net->all[m];
}

static const uint8_t *key_of(int i, size_t *len)
{
    static const char *keys[] = {"a", "b", "c", "dd", "", "k\0z", "m", "l", "n"};
    static const size_t lens[] = {1, 1, 1, 2, 0, 3, 1, 1, 1};
    *len = lens[i];
    return (const uint8_t *)keys[i];
}

/* A random nested object of kind |kind| reachable from the root via keys
 * "m"/"l" (or root itself for maps). */
static int find_obj(cairn_doc *d, int kind, cairn_objid *out)
{
    cairn_read r;
    const char *k = kind == CAIRN_OBJ_MAP ? "m" : "l";
    *out = CAIRN_ROOT;
    if (kind == CAIRN_OBJ_MAP && below(2))
        return 1;
    ck_assert_int_eq(cairn_doc_get(d, &r, CAIRN_ROOT, (const uint8_t *)k, 1), 0);
    int want = kind == CAIRN_OBJ_MAP ? CAIRN_READ_MAP : CAIRN_READ_LIST;
    if (r.kind != want)
        return kind == CAIRN_OBJ_MAP;
    *out = r.obj;
    /* sometimes go one level deeper: a map inside the list */
    if (kind == CAIRN_OBJ_MAP && below(3) == 0) {
        ck_assert_int_eq(cairn_doc_get(d, &r, CAIRN_ROOT, (const uint8_t *)"l", 1), 0);
        if (r.kind == CAIRN_READ_LIST) {
            size_t n;
            ck_assert_int_eq(cairn_doc_length(d, &n, r.obj), 0);
            if (n) {
                cairn_read e;
                ck_assert_int_eq(cairn_doc_list_get(d, &e, r.obj, below((uint32_t)n)), 0);
                if (e.kind == CAIRN_READ_MAP)
                    *out = e.obj;
            }
        }
    }
    return 1;
}

static void random_op(cairn_doc *d)
{
    char val[32];
    snprintf(val, sizeof val, "v%u", below(1000));
    cairn_value v = {.type = CAIRN_V_STR};
    v.v.bytes.ptr = (const uint8_t *)val;
    v.v.bytes.len = strlen(val);
    size_t klen;
    const uint8_t *key = key_of((int)below(6), &klen);
    cairn_objid o, made;
    int rc;
    switch (below(12)) {
    case 0:
    case 1:
    case 2:
        if (find_obj(d, CAIRN_OBJ_MAP, &o))
            ck_assert_int_eq(cairn_doc_put(d, o, key, klen, &v), 0);
        break;
    case 3:
        if (find_obj(d, CAIRN_OBJ_MAP, &o)) {
            rc = cairn_doc_delete(d, o, key, klen);
            ck_assert(rc == 0 || rc == CAIRN_ENOTFOUND);
        }
        break;
    case 4: {
        int kind = below(4) ? CAIRN_OBJ_MAP : CAIRN_OBJ_LIST;
        ck_assert_int_eq(cairn_doc_put_object(d, &made, CAIRN_ROOT, (const uint8_t *)"m", 1, kind),
                         0);
        if (kind == CAIRN_OBJ_MAP && below(2))
            ck_assert_int_eq(cairn_doc_put(d, made, (const uint8_t *)"x", 1, &v), 0);
        break;
    }
    case 5: {
        cairn_read r;
        ck_assert_int_eq(cairn_doc_get(d, &r, CAIRN_ROOT, (const uint8_t *)"l", 1), 0);
        if (r.kind != CAIRN_READ_LIST || below(6) == 0)
            ck_assert_int_eq(
                cairn_doc_put_object(d, &made, CAIRN_ROOT, (const uint8_t *)"l", 1, CAIRN_OBJ_LIST),
                0);
        break;
    }
    case 6:
    case 7:
        if (find_obj(d, CAIRN_OBJ_LIST, &o) && o.counter) {
            size_t n;
            ck_assert_int_eq(cairn_doc_length(d, &n, o), 0);
            size_t at = below((uint32_t)n + 1);
            if (below(5) == 0)
                ck_assert_int_eq(cairn_doc_list_insert_object(d, &made, o, at, CAIRN_OBJ_MAP), 0);
            else
                ck_assert_int_eq(cairn_doc_list_insert(d, o, at, &v), 0);
        }
        break;
    case 8:
        if (find_obj(d, CAIRN_OBJ_LIST, &o) && o.counter) {
            size_t n;
            ck_assert_int_eq(cairn_doc_length(d, &n, o), 0);
            if (n) {
                if (below(2))
                    ck_assert_int_eq(cairn_doc_list_delete(d, o, below((uint32_t)n)), 0);
                else
                    ck_assert_int_eq(cairn_doc_list_set(d, o, below((uint32_t)n), &v), 0);
            }
        }
        break;
    case 9:
    case 10: {
        cairn_read r;
        ck_assert_int_eq(cairn_doc_get(d, &r, CAIRN_ROOT, (const uint8_t *)"n", 1), 0);
        if (r.kind == CAIRN_READ_SCALAR && r.value.type == CAIRN_V_COUNTER) {
            ck_assert_int_eq(
                cairn_doc_increment(d, CAIRN_ROOT, (const uint8_t *)"n", 1, (int64_t)below(9) - 4),
                0);
        } else {
            cairn_value cv = {.type = CAIRN_V_COUNTER, .v.i = (int64_t)below(10)};
            ck_assert_int_eq(cairn_doc_put(d, CAIRN_ROOT, (const uint8_t *)"n", 1, &cv), 0);
        }
        break;
    }
    default:
        if (below(4) == 0) {
            rc = cairn_doc_delete(d, CAIRN_ROOT, (const uint8_t *)"n", 1);
            ck_assert(rc == 0 || rc == CAIRN_ENOTFOUND);
        } else if (find_obj(d, CAIRN_OBJ_MAP, &o)) {
            ck_assert_int_eq(cairn_doc_put(d, o, key, klen, &v), 0);
        }
        break;
    }
}

static void assert_same(const cairn_doc *a, const cairn_doc *b)
{
    uint8_t *da, *db;
    size_t la, lb;
    ck_assert_int_eq(cairn_doc_dump(&da, &la, a), 0);
    ck_assert_int_eq(cairn_doc_dump(&db, &lb, b), 0);
    ck_assert_uint_eq(la, lb);
    ck_assert_mem_eq(da, db, la);
    free(da);
    free(db);
    const cairn_hash *ha, *hb;
    size_t na = cairn_dag_heads(cairn_doc_dag(a), &ha);
    size_t nb = cairn_dag_heads(cairn_doc_dag(b), &hb);
    ck_assert_uint_eq(na, nb);
    if (na) /* none: both NULL */
        ck_assert_mem_eq(ha, hb, na * sizeof *ha);
    ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(a)), cairn_dag_count(cairn_doc_dag(b)));
}

/* One local edit step: begin at |t|, 1-4 random ops, then (mostly) commit.
 * Returns the committed change (borrowed from |d|) or NULL. */
static const cairn_change *local_step(cairn_doc *d, uint64_t t)
{
    ck_assert_int_eq(cairn_doc_begin(d, t), 0);
    for (int k = (int)below(4) + 1; k > 0; k--)
        random_op(d);
    if (below(10) == 0) {
        cairn_doc_rollback(d);
        return NULL;
    }
    const cairn_change *c;
    ck_assert_int_eq(cairn_doc_commit(d, &c, NULL), 0);
    return c;
}

static void assert_same_change(const cairn_change *a, const cairn_change *b)
{
    ck_assert_int_eq(a == NULL, b == NULL);
    if (!a)
        return;
    ck_assert_uint_eq(a->len, b->len);
    ck_assert_mem_eq(a->bytes, b->bytes, a->len);
}

/* Everything a replica shows of its DAG and state, compared. */
static void assert_twin(const cairn_doc *a, const cairn_doc *b, const cairn_actor *actors,
                        int nactors)
{
    assert_same(a, b);
    const cairn_dag *da = cairn_doc_dag(a), *db = cairn_doc_dag(b);
    for (uint64_t i = 0; i < cairn_dag_count(da); i++) {
        ck_assert_mem_eq(cairn_dag_hash_at(da, i), cairn_dag_hash_at(db, i), sizeof(cairn_hash));
        uint64_t pa[CAIRN_CHANGE_MAX_DEPS], pb[CAIRN_CHANGE_MAX_DEPS];
        size_t na = cairn_dag_deps_at(pa, CAIRN_CHANGE_MAX_DEPS, da, i);
        ck_assert_uint_eq(na, cairn_dag_deps_at(pb, CAIRN_CHANGE_MAX_DEPS, db, i));
        ck_assert_mem_eq(pa, pb, na * sizeof *pa);
        uint64_t ix;
        ck_assert_int_eq(cairn_dag_find(db, cairn_dag_hash_at(da, i), &ix), 0);
        ck_assert_uint_eq(ix, i);
    }
    for (int i = 0; i < nactors; i++)
        ck_assert_uint_eq(cairn_dag_actor_seq(da, &actors[i]), cairn_dag_actor_seq(db, &actors[i]));
    ck_assert_int_eq(cairn_doc_check_(a), 0);
    ck_assert_int_eq(cairn_doc_check_(b), 0);
}

/* Replicas that must behave exactly like another from a checkpoint on:
 * |ck|, restored from replica 0's checkpoint for replica 0's actor, mirrors
 * replica 0; |ck2|, restored from it for another actor, mirrors |full|, a
 * replica of that actor that replayed every change. Both pairs receive what
 * replica 0 receives and make the edits replica 0 makes (the same random
 * choices), and must produce byte-identical changes. */
struct twins {
    cairn_doc *ck, *full, *ck2;
    int edits2; /* 0 when ck2's actor is another replica's: its edits would fork */
    uint64_t nck;
    cairn_actor actors[MAX_REPLICAS + 1];
    int nactors;
};

static void twins_deliver(struct twins *tw, const struct msg *m);

static void twins_make(struct twins *tw, const struct net *net, cairn_doc **docs, int nrep)
{
    memset(tw, 0, sizeof *tw);
    const cairn_dag *dag = cairn_doc_dag(docs[0]);
    tw->ck = ckpt_restore(docs[0], cairn_doc_actor(docs[0]));
    cairn_actor a2;
    tw->edits2 = below(2);
    if (tw->edits2)
        for (size_t i = 0; i < sizeof a2.b; i++)
            a2.b[i] = (uint8_t)rnd();
    else
        a2 = *cairn_doc_actor(docs[1 + below((uint32_t)nrep - 1)]);
    ck_assert_int_eq(cairn_doc_new(&tw->full, &a2), 0);
    tw->nck = cairn_dag_count(dag);
    for (uint64_t i = 0; i < tw->nck; i++) {
        cairn_change *c;
        ck_assert_int_eq(cairn_dag_load(&c, dag, i), 0);
        ck_assert_int_eq(cairn_doc_receive(tw->full, c, NULL), 0);
    }
    tw->ck2 = ckpt_restore(docs[0], &a2);
    for (int r = 0; r < nrep; r++)
        tw->actors[tw->nactors++] = *cairn_doc_actor(docs[r]);
    tw->actors[tw->nactors++] = a2;
    assert_twin(docs[0], tw->ck, tw->actors, tw->nactors);
    assert_twin(tw->full, tw->ck2, tw->actors, tw->nactors);
    /* No loader and no bodies: what the checkpoint held has no body here. */
    uint8_t *body;
    size_t blen;
    if (tw->nck)
        ck_assert_int_eq(cairn_dag_load_bytes(&body, &blen, cairn_doc_dag(tw->ck), 0),
                         CAIRN_ENOTFOUND);
    /* A checkpoint leaves out the changes replica 0 holds pending: hand them
     * over as a peer would resend them, in the order replica 0 got them (the
     * order in which they become ready depends on it). */
    for (size_t i = 0; i < net->nhist0; i++)
        if (cairn_dag_has(dag, &net->all[net->hist0[i]].hash) == 2)
            twins_deliver(tw, &net->all[net->hist0[i]]);
}

static void twins_deliver(struct twins *tw, const struct msg *m)
{
    if (!tw->ck || !m)
        return;
    deliver_msg(tw->ck, m);
    deliver_msg(tw->full, m);
    deliver_msg(tw->ck2, m);
}

/* Replays replica 0's edit step (|c0|, made from rng state |saved|) on the
 * twins. */
static void twins_edit(struct twins *tw, uint64_t saved, uint64_t t, const cairn_change *c0)
{
    if (!tw->ck)
        return;
    uint64_t after = rng_state;
    rng_state = saved;
    assert_same_change(c0, local_step(tw->ck, t));
    ck_assert_uint_eq(rng_state, after); /* the same choices were made */
    if (tw->edits2) {
        rng_state = saved;
        const cairn_change *cf = local_step(tw->full, t);
        rng_state = saved;
        assert_same_change(cf, local_step(tw->ck2, t));
    }
    rng_state = after;
}

static void twins_end(struct twins *tw, const cairn_doc *d0)
{
    if (!tw->ck)
        return;
    assert_twin(d0, tw->ck, tw->actors, tw->nactors);
    assert_twin(tw->full, tw->ck2, tw->actors, tw->nactors);
    /* Bodies ordered after the checkpoint are kept as usual. */
    const cairn_dag *dag = cairn_doc_dag(tw->ck);
    for (uint64_t i = tw->nck; i < cairn_dag_count(dag); i++) {
        uint8_t *x, *y;
        size_t nx, ny;
        ck_assert_int_eq(cairn_dag_load_bytes(&x, &nx, dag, i), 0);
        ck_assert_int_eq(cairn_dag_load_bytes(&y, &ny, cairn_doc_dag(d0), i), 0);
        ck_assert_uint_eq(nx, ny);
        ck_assert_mem_eq(x, y, nx);
        free(x);
        free(y);
    }
    /* A checkpoint of a restored replica restores the same replica. */
    cairn_doc *again = ckpt_restore(tw->ck, cairn_doc_actor(d0));
    assert_twin(d0, again, tw->actors, tw->nactors);
    cairn_doc_free(again);
    cairn_doc_free(tw->ck);
    cairn_doc_free(tw->full);
    cairn_doc_free(tw->ck2);
}

/* One simulated run; returns the number of changes made. With |ckpt|,
 * replica 0 is checkpointed at a random step and twins follow it. */
static size_t run_once(uint64_t seed, int nrep, int steps, int ckpt)
{
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    cairn_doc *docs[MAX_REPLICAS];
    int64_t skew[MAX_REPLICAS];
    struct net net;
    memset(&net, 0, sizeof net);
    for (int r = 0; r < nrep; r++) {
        cairn_actor a;
        for (size_t i = 0; i < sizeof a.b; i++)
            a.b[i] = (uint8_t)rnd();
        ck_assert_int_eq(cairn_doc_new(&docs[r], &a), 0);
        skew[r] = (int64_t)below(40) - 20;
    }
    uint64_t now = 1000;
    struct twins tw = {0};
    int ck_step = ckpt ? (int)below((uint32_t)steps + 1) : -1;
    /* replica 0's state at one step, to be rebuilt with new_at at the end */
    int snap_step = (int)below((uint32_t)steps);
    uint8_t *snap_dump = NULL;
    size_t snap_len = 0, snap_nheads = 0;
    cairn_hash *snap_heads = NULL;
    for (int s = 0; s < steps; s++) {
        if (s == ck_step)
            twins_make(&tw, &net, docs, nrep);
        if (s == snap_step) {
            const cairn_hash *h;
            snap_nheads = cairn_dag_heads(cairn_doc_dag(docs[0]), &h);
            snap_heads = malloc((snap_nheads + 1) * sizeof *h);
            ck_assert_ptr_nonnull(snap_heads);
            if (snap_nheads)
                memcpy(snap_heads, h, snap_nheads * sizeof *h);
            ck_assert_int_eq(cairn_doc_dump(&snap_dump, &snap_len, docs[0]), 0);
        }
        now += below(4);
        int r = (int)below((uint32_t)nrep);
        if (below(5) < 2) {
            for (int k = (int)below(3) + 1; k > 0; k--) {
                const struct msg *m = deliver_one(&net, docs[r], r);
                if (r == 0)
                    twins_deliver(&tw, m);
            }
            continue;
        }
        uint64_t t = below(10) == 0 ? 0 : (uint64_t)((int64_t)now + skew[r]);
        uint64_t saved = rng_state;
        const cairn_change *c = local_step(docs[r], t);
        if (r == 0)
            twins_edit(&tw, saved, t, c);
        if (c)
            broadcast(&net, r, nrep, c);
    }
    if (ck_step == steps)
        twins_make(&tw, &net, docs, nrep);
    /* full delivery: every replica gets every message, random order */
    for (int r = 0; r < nrep; r++) {
        while (net.nin[r]) {
            const struct msg *m = deliver_one(&net, docs[r], r);
            if (r == 0)
                twins_deliver(&tw, m);
        }
        ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(docs[r])), net.n);
    }
    for (int r = 1; r < nrep; r++)
        assert_same(docs[0], docs[r]);
    twins_end(&tw, docs[0]);
    /* a fresh replica fed everything backwards (worst case for pending) */
    cairn_doc *fresh;
    cairn_actor fa;
    memset(fa.b, 0xEE, sizeof fa.b);
    ck_assert_int_eq(cairn_doc_new(&fresh, &fa), 0);
    for (size_t i = net.n; i-- > 0;)
        deliver_msg(fresh, &net.all[i]);
    assert_same(docs[0], fresh);
    cairn_doc_free(fresh);
    /* reads at past heads: the snapshot, and the present */
    cairn_doc *past;
    ck_assert_int_eq(cairn_doc_new_at(&past, docs[1], snap_heads, snap_nheads), 0);
    uint8_t *pd;
    size_t pl;
    ck_assert_int_eq(cairn_doc_dump(&pd, &pl, past), 0);
    ck_assert_uint_eq(pl, snap_len);
    ck_assert_mem_eq(pd, snap_dump, pl);
    free(pd);
    cairn_doc_free(past);
    const cairn_hash *now_heads;
    size_t nnow = cairn_dag_heads(cairn_doc_dag(docs[0]), &now_heads);
    ck_assert_int_eq(cairn_doc_new_at(&past, docs[nrep - 1], now_heads, nnow), 0);
    assert_same(docs[0], past);
    cairn_doc_free(past);
    free(snap_dump);
    free(snap_heads);

    size_t made = net.n;
    for (size_t i = 0; i < net.n; i++)
        free(net.all[i].bytes);
    free(net.all);
    free(net.hist0);
    for (int r = 0; r < nrep; r++) {
        free(net.inbox[r]);
        cairn_doc_free(docs[r]);
    }
    return made;
}

START_TEST(random_replicas_converge)
{
    size_t total = 0;
    for (uint64_t seed = 1; seed <= 500; seed++)
        total += run_once(seed, 2 + (int)(seed % 4), 150, 0);
    ck_assert_uint_gt(total, 1000);
}
END_TEST

/* Checkpoint at a random step: the restored replicas (same actor, another
 * actor) then behave exactly like the replicas they were taken from. */
START_TEST(checkpoint_twins_match)
{
    size_t total = 0;
    for (uint64_t seed = 1; seed <= 300; seed++)
        total += run_once(seed * 7 + 3, 2 + (int)(seed % 4), 120, 1);
    ck_assert_uint_gt(total, 1000);
}
END_TEST

START_TEST(long_histories_converge)
{
    for (uint64_t seed = 1000; seed < 1006; seed++)
        run_once(seed, 3 + (int)(seed % 3), 1500, seed % 2);
}
END_TEST

static Suite *convergence_suite(void)
{
    Suite *s = suite_create("convergence");
    TCase *tc = tcase_create("property");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, random_replicas_converge);
    tcase_add_test(tc, long_histories_converge);
    tcase_add_test(tc, checkpoint_twins_match);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(convergence_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
