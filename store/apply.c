/*
 * The document observer: how an applied change — local, a peer's or
 * replayed — becomes revisions, key index entries, lease table updates and
 * disk records. One path for all three: the doc reports the change to the
 * observer, which decides the revision (the next one iff a key's visible
 * value changed), updates the index and appends the change's records to the
 * pending WriteBatch (records.c), with its events for the subscribers.
 * Because recovery runs the same code over the same order, it re-derives
 * the same revisions and checks them against the stored ones.
 *
 * Everything here runs under the rwlock's write side; the batch and the
 * queue are appended to under the queue mutex (commit.c).
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crdt/error.h"
#include "store/store_int.h"

int cairn_store_find_root_map(cairn_doc *d, cairn_objid *out, const char *name)
{
    cairn_read r;
    int rc = cairn_doc_get(d, &r, CAIRN_ROOT, (const uint8_t *)name, strlen(name));
    if (rc)
        return rc;
    if (r.kind != CAIRN_READ_MAP)
        return CAIRN_ECORRUPT;
    *out = r.obj;
    return 0;
}

void cairn_store_ev_clear(cairn_store *s)
{
    for (size_t i = 0; i < s->cur_nev; i++) {
        free(s->cur_ev[i].key);
        free(s->cur_ev[i].value);
    }
    s->cur_nev = 0;
}

/* The position of the op in the change being applied that set kvs[key] to
 * the patch's winner, or -1 when the winner is an older change's op. Checks
 * everything a reader of the body will rely on (SET, on kvs, of this key). */
static int64_t own_op(cairn_store *s, const cairn_patch *p)
{
    const cairn_change *c = s->cur_change;
    cairn_opid w = p->value.id;
    if (!c || w.counter < c->start_op || w.counter - c->start_op >= c->nops)
        return -1;
    cairn_actor a;
    if (cairn_doc_actor_of(s->doc, &a, w) || memcmp(a.b, c->actor.b, CAIRN_ACTOR_LEN))
        return -1;
    uint64_t pos = w.counter - c->start_op;
    const cairn_op *op = &c->ops[pos];
    if (op->action != CAIRN_OP_SET || op->insert || op->key_len != p->key_len ||
        (p->key_len && memcmp(op->key, p->key, p->key_len)) || op->obj.counter != s->kvs.counter ||
        op->obj.actor >= c->nactors ||
        memcmp(c->actors[op->obj.actor].b, s->kvs_actor.b, CAIRN_ACTOR_LEN))
        return -1;
    return (int64_t)pos;
}

static void on_patch(void *arg, const cairn_patch *p)
{
    cairn_store *s = arg;
    if (s->obs_rc || !s->kvs_known)
        return;
    if (p->obj.counter != s->kvs.counter || p->obj.actor != s->kvs.actor) {
        /* leases / members / cluster: no revision; the lease table
         * follows. members_gen moves for what is not a lease (a member's
         * add, removal or field; at worst a keepalive on a lease revoked
         * concurrently), so that keepalives do not make the peer thread
         * and the learner check re-read the table. */
        int rc = cairn_store_lease_patch(s, p);
        if (rc < 0)
            s->obs_rc = rc;
        else if (rc == 0)
            atomic_fetch_add(&s->members_gen, 1);
        return;
    }
    if (p->action != CAIRN_PATCH_PUT && p->action != CAIRN_PATCH_DEL)
        return;
    if (s->cur_nev == s->cur_cap) {
        size_t cap = s->cur_cap ? s->cur_cap * 2 : 16;
        pend_event *n = realloc(s->cur_ev, cap * sizeof *n);
        if (!n) {
            s->obs_rc = CAIRN_ENOMEM;
            return;
        }
        s->cur_ev = n;
        s->cur_cap = cap;
    }
    pend_event *e = &s->cur_ev[s->cur_nev];
    memset(e, 0, sizeof *e);
    e->key = malloc(p->key_len ? p->key_len : 1);
    if (!e->key) {
        s->obs_rc = CAIRN_ENOMEM;
        return;
    }
    if (p->key_len)
        memcpy(e->key, p->key, p->key_len);
    e->key_len = p->key_len;
    if (p->action == CAIRN_PATCH_PUT) {
        const uint8_t *val;
        size_t vl;
        if (p->value.kind == CAIRN_READ_SCALAR) {
            cairn_store_parse_record(&p->value.value, &e->lease, &val, &vl);
        } else {
            /* a nested object at kvs[key] (JSON mode, later): empty value */
            val = (const uint8_t *)"";
            vl = 0;
        }
        e->type = CAIRN_EVENT_PUT;
        e->oppos = p->value.kind == CAIRN_READ_SCALAR ? own_op(s, p) : -1;
        /* replay rebuilds the index only; a value set by this change is
         * read back from its body, so only listeners and values that came
         * from an older change (a delete that uncovered a conflict) need a
         * copy */
        if (!s->recovering && (atomic_load(&s->has_subs) || e->oppos < 0)) {
            e->value = malloc(vl ? vl : 1);
            if (!e->value) {
                free(e->key);
                s->obs_rc = CAIRN_ENOMEM;
                return;
            }
            if (vl)
                memcpy(e->value, val, vl);
            e->value_len = vl;
        }
    } else {
        e->type = CAIRN_EVENT_DELETE;
    }
    s->cur_nev++;
}

typedef struct ev_ref {
    size_t i;
    const pend_event *e;
} ev_ref;

static int evref_cmp(const void *a, const void *b)
{
    const ev_ref *x = a, *y = b;
    int c = cairn_store_keycmp(x->e->key, x->e->key_len, y->e->key, y->e->key_len);
    if (c)
        return c;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Keeps the last event per key (a hostile change may touch one key twice)
 * and drops deletes of keys that are not live. Deterministic, so recovery
 * and every node agree. */
static int ev_normalise(cairn_store *s)
{
    size_t n = s->cur_nev;
    if (n > 1) {
        ev_ref *r = malloc(n * sizeof *r);
        if (!r)
            return CAIRN_ENOMEM;
        for (size_t i = 0; i < n; i++) {
            r[i].i = i;
            r[i].e = &s->cur_ev[i];
        }
        qsort(r, n, sizeof *r, evref_cmp);
        for (size_t i = 0; i + 1 < n; i++)
            if (cairn_store_keycmp(r[i].e->key, r[i].e->key_len, r[i + 1].e->key,
                                   r[i + 1].e->key_len) == 0)
                s->cur_ev[r[i].i].type = -1;
        free(r);
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        pend_event *e = &s->cur_ev[i];
        if (e->type == CAIRN_EVENT_DELETE) {
            kentry *k = cairn_kindex_find(&s->idx, e->key, e->key_len);
            if (!k || !kentry_live(k))
                e->type = -1;
        }
        if (e->type < 0) {
            free(e->key);
            free(e->value);
            continue;
        }
        s->cur_ev[w++] = *e;
    }
    s->cur_nev = w;
    return 0;
}

static int apply_events(cairn_store *s, int64_t rev)
{
    for (size_t i = 0; i < s->cur_nev; i++) {
        pend_event *e = &s->cur_ev[i];
        kentry *k = cairn_kindex_upsert(&s->idx, e->key, e->key_len);
        if (!k)
            return CAIRN_ENOMEM;
        int64_t from = kentry_live(k) ? k->lease : 0;
        int rc = cairn_store_lease_key_move(s, k, from, e->type == CAIRN_EVENT_PUT ? e->lease : 0);
        if (rc)
            return rc;
        if (e->type == CAIRN_EVENT_PUT) {
            if (kentry_live(k)) {
                k->version++;
            } else {
                k->create_rev = rev;
                k->version = 1;
            }
            k->lease = e->lease;
            if (cairn_kindex_push(k, (uint64_t)rev))
                return CAIRN_ENOMEM;
            e->create_rev = k->create_rev;
            e->version = k->version;
        } else {
            if (cairn_kindex_push(k, (uint64_t)rev | CAIRN_IDX_TOMB))
                return CAIRN_ENOMEM;
            k->version = 0;
            k->lease = 0;
        }
    }
    return 0;
}

static void on_change(void *arg, const cairn_change *c, uint64_t index, int begin)
{
    cairn_store *s = arg;
    if (begin) {
        cairn_store_ev_clear(s);
        s->cur_change = c;
        if (s->recovering && index != s->rec_expect_index && !s->rec_rc)
            s->rec_rc = CAIRN_ECORRUPT;
        return;
    }
    s->last_change_rev = 0;
    s->cur_change = NULL;
    if (!s->kvs_known) {
        /* the genesis made the root maps: learn their ids once */
        if (cairn_store_find_root_map(s->doc, &s->kvs, "kvs") == 0 &&
            cairn_store_find_root_map(s->doc, &s->leases, "leases") == 0 &&
            cairn_store_find_root_map(s->doc, &s->members, "members") == 0 &&
            cairn_doc_actor_of(s->doc, &s->kvs_actor, s->kvs) == 0)
            s->kvs_known = 1;
    }
    if (s->obs_rc)
        goto fail;
    int rc = ev_normalise(s);
    if (rc)
        goto fail_rc;
    int64_t rev = 0;
    if (s->cur_nev) {
        rev = s->rev + 1;
        rc = apply_events(s, rev);
        if (!rc)
            rc = cairn_revmap_add(&s->rm, rev, index);
        if (rc)
            goto fail_rc;
        s->rev = rev;
    }
    rc = cairn_store_lease_settle(s);
    if (rc)
        goto fail_rc;
    s->last_change_rev = rev;
    if (s->recovering) {
        if (rev != s->rec_expect_rev && !s->rec_rc) {
            cairn_store_log(
                s, CAIRN_STORE_LOG_ERROR, "replay of change %llu gave revision %lld, stored %lld",
                (unsigned long long)index, (long long)rev, (long long)s->rec_expect_rev);
            s->rec_rc = CAIRN_ECORRUPT;
        }
        cairn_store_ev_clear(s);
        return;
    }
    pend_change *pc = NULL;
    if (atomic_load(&s->has_subs)) {
        pc = calloc(1, sizeof *pc);
        if (!pc)
            goto fail_nomem;
        pc->rev = rev;
        pc->hash = c->hash;
        pc->bytes = malloc(c->len ? c->len : 1); /* the doc frees |c| after this call */
        if (!pc->bytes) {
            free(pc);
            goto fail_nomem;
        }
        memcpy(pc->bytes, c->bytes, c->len);
        pc->len = c->len;
    }
    pthread_mutex_lock(&s->qmu);
    rc = cairn_store_batch_change(s, c, index, rev);
    /* metrics: counted by origin once the committer made the group durable */
    if (s->applying_remote) {
        s->batch_remote++;
        atomic_fetch_add_explicit(&s->recv_unsynced, 1, memory_order_relaxed);
    } else {
        s->batch_local++;
    }
    s->batch_end = index + 1;
    if (pc) {
        /* the events move to the committer, which hands them to subscribers */
        pc->ev = s->cur_ev;
        pc->nev = s->cur_nev;
        s->cur_ev = NULL;
        s->cur_nev = s->cur_cap = 0;
        *s->ch_tail = pc;
        s->ch_tail = &pc->next;
    }
    if (rev)
        s->queued_rev = rev;
    if (s->obs_wait && !rc) {
        *s->w_tail = s->obs_wait;
        s->w_tail = &s->obs_wait->next;
        s->obs_wait = NULL;
    }
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    cairn_store_ev_clear(s);
    if (rc)
        goto fail_rc;
    return;
fail_nomem:
    rc = CAIRN_ENOMEM;
fail_rc:
    s->obs_rc = rc;
fail:
    /* The document applied a change the store could not index: the memory
     * state is no longer one the disk can reproduce. Stop serving. */
    atomic_store(&s->failed, s->obs_rc ? s->obs_rc : CAIRN_EIO);
    cairn_store_ev_clear(s);
}

/* A fork: counted, and the first of a burst noted for its receiver. */
static void on_fork(void *arg, const cairn_change *c, const cairn_hash *held)
{
    cairn_store *s = arg;
    atomic_fetch_add(&s->n_forks, 1);
    cairn_store_fork *f = s->fork_note;
    if (!f || f->seq)
        return; /* not noted, or not the burst's first */
    f->rejected = c->hash;
    f->actor = c->actor;
    f->seq = c->seq;
    f->held_known = held != NULL;
    if (held)
        f->held = *held;
}

const cairn_doc_observer *cairn_store_observer(cairn_store *s, cairn_doc_observer *o)
{
    o->arg = s;
    o->change_cb = on_change;
    o->patch_cb = on_patch;
    o->fork_cb = on_fork;
    s->obs_rc = 0;
    return o;
}
