/*
 * Changes from peers (cairn_doc_receive). A change is validated as a whole
 * against the document — objects and list elements exist or are made
 * earlier in the same change, actions fit the object, references obey the
 * Lamport rule and lie in the change's causal past, op ids do not reuse the
 * author's — before the DAG orders it and any op is applied (doc.c), so a
 * rejected change is never applied in part. Then every buffered change it
 * unblocks follows, in order.
 *
 * The causal past. Every reference a change makes to another change's op
 * (an object, a list element, a predecessor) must name an op of one of its
 * ancestors, so that the verdict depends only on the change and its past,
 * never on which concurrent changes this replica happens to hold. An
 * actor's changes form a chain (the DAG's sequence rule), so the past holds
 * a prefix of each actor's changes, and op (g, a) lies in it iff g is at
 * most the last op counter of a's last change in it. The changes ordered
 * here that are not ancestors — the concurrent ones — are a suffix of each
 * actor's chain; the document's per-actor runs (doc_int.h) give, walking
 * back over that suffix, the bound. The concurrent set costs nothing when
 * the change's deps are our heads (the common case: then it is empty) or
 * its one dep is the change whose set the memo holds (a peer's run of
 * changes while local writes interleave), and otherwise about the changes
 * made since the fork (cairn_dag_not_ancestors stops when only ancestors
 * are left).
 */
#include "crdt/doc.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define CAIRN_DOC_IMPL
#include "crdt/doc_int.h"
#include "crdt/error.h"

/* ---- remote changes -------------------------------------------------------------- */

/* Resolves a reference made inside change |c| by op |i|: checks the actor
 * index and the Lamport rule (an op may name only ops with smaller counters
 * than the change's, or earlier ops of its own change). *own = op index
 * within |c| or -1. */
static int check_ref(const cairn_change *c, size_t i, cairn_opid r, ptrdiff_t *own)
{
    *own = -1;
    if (r.counter == 0)
        return 0;
    if (r.actor >= c->nactors)
        return CAIRN_EBADOP;
    if (r.counter >= c->start_op) {
        if (r.actor != 0 || r.counter - c->start_op >= i)
            return CAIRN_EBADOP;
        *own = (ptrdiff_t)(r.counter - c->start_op);
    }
    return 0;
}

/* What validate knows of a ready change's causal past. The concurrent set
 * itself lives in the document's memo (doc->cc), which this change's
 * becomes once it is ordered. */
typedef struct past {
    int known;       /* doc->cc is this change's concurrent set */
    int empty;       /* no deps: the past is empty */
    uint64_t *bound; /* per actor index of the change; UINT64_MAX = not yet */
} past;

/* The memo's range that holds |x|, or d->ncc. */
static size_t cc_find(const cairn_doc *d, uint64_t x)
{
    size_t lo = 0, hi = d->ncc;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x < d->cc[mid].lo)
            hi = mid;
        else if (x >= d->cc[mid].hi)
            lo = mid + 1;
        else
            return mid;
    }
    return d->ncc;
}

static int cc_has(const cairn_doc *d, uint64_t x)
{
    return cc_find(d, x) < d->ncc;
}

/* Appends [lo, hi) (lo >= the last range's end). */
static int cc_add(cairn_doc *d, uint64_t lo, uint64_t hi)
{
    if (d->ncc && d->cc[d->ncc - 1].hi == lo) {
        d->cc[d->ncc - 1].hi = hi;
        return 0;
    }
    int rc = grow((void **)&d->cc, &d->cc_cap, d->ncc + 1, sizeof *d->cc);
    if (rc)
        return rc;
    d->cc[d->ncc++] = (irange){lo, hi};
    return 0;
}

/* Takes out of the memo the other deps of |c| (all but deps[skip]) and
 * their ancestors. The walk stops at changes the memo does not hold: they
 * are in the past already, and so are their ancestors. So it costs what
 * the other deps add to the past (for a peer's change made on top of ours
 * and of the peer's own run: the changes in between). */
static int cc_remove_past(cairn_doc *d, const cairn_change *c, size_t skip)
{
    uint64_t *stack = NULL, deps[CAIRN_CHANGE_MAX_DEPS];
    size_t nst = 0, capst = 0;
    int rc = 0;
    for (size_t k = 0; k < c->ndeps && !rc; k++) {
        uint64_t x;
        if (k != skip && cairn_dag_find(d->dag, &c->deps[k], &x) == 0 &&
            !(rc = grow((void **)&stack, &capst, nst + 1, sizeof *stack)))
            stack[nst++] = x;
    }
    while (nst && !rc) {
        uint64_t x = stack[--nst];
        size_t lo = cc_find(d, x);
        if (lo == d->ncc)
            continue;
        /* out now, so it is not visited twice */
        irange *g = &d->cc[lo];
        if (g->lo == x) {
            g->lo++;
        } else if (g->hi == x + 1) {
            g->hi--;
        } else {
            if ((rc = grow((void **)&d->cc, &d->cc_cap, d->ncc + 1, sizeof *d->cc)))
                break;
            g = &d->cc[lo];
            memmove(g + 1, g, (d->ncc - lo) * sizeof *g);
            d->ncc++;
            g[0].hi = x;
            g[1].lo = x + 1;
        }
        if (d->cc[lo].lo == d->cc[lo].hi) {
            memmove(&d->cc[lo], &d->cc[lo + 1], (d->ncc - lo - 1) * sizeof *d->cc);
            d->ncc--;
        }
        size_t nd = cairn_dag_deps_at(deps, CAIRN_CHANGE_MAX_DEPS, d->dag, x);
        if (nd > CAIRN_CHANGE_MAX_DEPS)
            nd = CAIRN_CHANGE_MAX_DEPS;
        if ((rc = grow((void **)&stack, &capst, nst + nd, sizeof *stack)))
            break;
        for (size_t j = 0; j < nd; j++)
            stack[nst++] = deps[j];
    }
    free(stack);
    return rc;
}

/*
 * The cheap ways to a ready change's concurrent set, tried before it is
 * validated: no deps (an empty past); deps equal to our heads (nothing is
 * concurrent); or a dep that is the change the memo describes: its
 * concurrent set plus everything ordered after it (none of which can be
 * its ancestor), less what the other deps bring into the past. The last is what makes a long run of
 * a peer's changes cheap while local writes interleave (a catch-up): each one's past is the
 * previous one's plus the previous one, so the memo carries over at the
 * cost of one range, where a walk would cost every change since the fork.
 * Extending the memo in place keeps it right for its own change too: what
 * it adds lies above that change. Out of memory here only means the walk.
 */
static void past_quick(cairn_doc *d, const cairn_change *c, past *p)
{
    if (c->ndeps == 0) {
        p->known = p->empty = 1;
        return;
    }
    const cairn_hash *h;
    size_t nh = cairn_dag_heads(d->dag, &h);
    if (nh == c->ndeps && memcmp(h, c->deps, nh * sizeof *h) == 0) {
        d->cc_ok = 0;
        d->ncc = 0;
        p->known = 1;
        return;
    }
    if (!d->cc_ok)
        return;
    size_t k = 0;
    uint64_t at = UINT64_MAX;
    for (; k < c->ndeps; k++)
        if (cairn_dag_find(d->dag, &c->deps[k], &at) == 0 && at == d->cc_at)
            break;
    if (k == c->ndeps)
        return;
    uint64_t n = cairn_dag_count(d->dag);
    if (c->ndeps > 1)
        d->cc_ok = 0; /* no longer the memo's change's set: until this one is ordered */
    if ((at + 1 < n && cc_add(d, at + 1, n)) || (c->ndeps > 1 && cc_remove_past(d, c, k))) {
        d->cc_ok = 0;
        return;
    }
    p->known = 1;
}

/* The concurrent set the long way: every ordered change that is not an
 * ancestor of the deps (cairn_dag_not_ancestors stops once only ancestors
 * are left, so it costs about the changes since the fork). */
static int past_walk(cairn_doc *d, const cairn_change *c, past *p)
{
    uint64_t *v;
    size_t n;
    d->cc_ok = 0;
    int rc = cairn_dag_not_ancestors(&v, &n, d->dag, c->deps, c->ndeps);
    if (rc)
        return rc;
    d->ncc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = cc_add(d, v[i], v[i] + 1);
    free(v);
    if (!rc)
        p->known = 1;
    return rc;
}

/* 0 if op |r| (change actor index, counter >= 1, not of |c| itself) lies in
 * the causal past of |c|, else CAIRN_ENOTPAST. */
static int in_past(cairn_doc *d, const cairn_change *c, past *p, const uint32_t *amap, cairn_opid r)
{
    int rc;
    if (!p->known && (rc = past_walk(d, c, p)) != 0)
        return rc;
    uint64_t b = p->bound[r.actor];
    if (b == UINT64_MAX) {
        /* The actor's changes in the past are a prefix of its run (each
         * has the one before among its ancestors): binary search. */
        const arun *run = &d->runs[amap[r.actor]];
        size_t lo = 0, hi = p->empty ? 0 : run->n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (cc_has(d, run->v[mid].index))
                hi = mid;
            else
                lo = mid + 1;
        }
        b = p->bound[r.actor] = lo ? run->v[lo - 1].end : 0;
    }
    return r.counter <= b ? 0 : CAIRN_ENOTPAST;
}

static int elem_exists(const cairn_change *c, size_t i, const obj *list, cairn_opid e,
                       const uint32_t *amap, cairn_doc *d, past *p)
{
    ptrdiff_t own;
    int rc = check_ref(c, i, e, &own);
    if (rc)
        return rc;
    if (own >= 0) {
        const cairn_op *mk = &c->ops[own];
        if (!mk->insert || mk->obj.counter != c->ops[i].obj.counter ||
            mk->obj.actor != c->ops[i].obj.actor)
            return CAIRN_ENOTFOUND;
        return 0;
    }
    if (!list)
        return CAIRN_ENOTFOUND; /* a list made in this change has only its own elements */
    if (list_find(list, e.counter, amap[e.actor]) < 0)
        return CAIRN_ENOTFOUND;
    return in_past(d, c, p, amap, e);
}

/* Validates the whole of |c| against the document before anything applies. */
static int validate(cairn_doc *d, const cairn_change *c, uint32_t *amap, past *p)
{
    if (c->nactors == 0 || c->start_op == 0 || c->start_op >= COUNTER_LIMIT ||
        c->nops > COUNTER_LIMIT - c->start_op || cairn_actor_cmp(&c->actors[0], &c->actor) != 0)
        return CAIRN_EBADOP;
    for (uint32_t k = 0; k < c->nactors; k++) {
        int rc = actor_intern(d, &c->actors[k], &amap[k]);
        if (rc)
            return rc;
    }
    if (c->nops && c->start_op <= d->actor_max[amap[0]])
        return CAIRN_EBADOP; /* reuses op ids of its author */
    for (size_t i = 0; i < c->nops; i++) {
        const cairn_op *op = &c->ops[i];
        ptrdiff_t own;
        int rc = check_ref(c, i, op->obj, &own);
        if (rc)
            return rc;
        int type;
        const obj *o = NULL;
        if (op->obj.counter == 0) {
            type = CAIRN_OBJ_MAP;
            o = &d->root;
        } else if (own >= 0) {
            uint8_t a = c->ops[own].action;
            if (a != CAIRN_OP_MAKE_MAP && a != CAIRN_OP_MAKE_LIST)
                return CAIRN_ENOOBJ;
            type = a == CAIRN_OP_MAKE_MAP ? CAIRN_OBJ_MAP : CAIRN_OBJ_LIST;
        } else {
            o = cairn_doc_find_obj_(d, op->obj.counter, amap[op->obj.actor]);
            if (!o)
                return CAIRN_ENOOBJ;
            if ((rc = in_past(d, c, p, amap, op->obj)) != 0)
                return rc;
            type = o->type;
        }
        if (op->action < CAIRN_OP_MAKE_MAP || op->action > CAIRN_OP_INC)
            return CAIRN_EBADOP;
        if (op->action == CAIRN_OP_SET && op->value.type > CAIRN_V_COUNTER)
            return CAIRN_EBADOP;
        if (op->action == CAIRN_OP_INC && op->value.type != CAIRN_V_INT)
            return CAIRN_EBADOP;
        if (type == CAIRN_OBJ_MAP) {
            if (op->insert || op->elem.counter)
                return CAIRN_EBADOP;
        } else {
            if (op->insert && (op->action == CAIRN_OP_DEL || op->action == CAIRN_OP_INC))
                return CAIRN_EBADOP;
            if (!op->insert && op->elem.counter == 0)
                return CAIRN_EBADOP;
            if (op->elem.counter != 0 && (rc = elem_exists(c, i, o, op->elem, amap, d, p)) != 0)
                return rc;
        }
        for (uint32_t k = 0; k < op->npred; k++) {
            if (op->pred[k].counter == 0)
                return CAIRN_EBADOP;
            if ((rc = check_ref(c, i, op->pred[k], &own)) != 0)
                return rc;
            if (own < 0 && (rc = in_past(d, c, p, amap, op->pred[k])) != 0)
                return rc;
        }
    }
    return 0;
}

static cairn_opid map_id(const uint32_t *amap, cairn_opid id)
{
    cairn_opid r = {id.counter, 0};
    if (id.counter)
        r.actor = amap[id.actor];
    return r;
}

/* Applies a validated, ordered change. */
static int apply_change(cairn_doc *d, const cairn_change *c, const uint32_t *amap)
{
    for (size_t i = 0; i < c->nops; i++) {
        const cairn_op *src = &c->ops[i];
        int rc = grow((void **)&d->tpred, &d->tpred_cap, src->npred + 1, sizeof *d->tpred);
        if (rc)
            return rc;
        cairn_op op = *src;
        op.obj = map_id(amap, src->obj);
        op.elem = map_id(amap, src->elem);
        for (uint32_t k = 0; k < src->npred; k++)
            d->tpred[k] = map_id(amap, src->pred[k]);
        op.pred = d->tpred;
        if ((rc = apply_op(d, &op, c->start_op + i, amap[0])) != 0)
            return rc;
    }
    if (c->nops) {
        uint64_t last = c->start_op + c->nops - 1;
        if (last > d->max_counter)
            d->max_counter = last;
        if (last > d->actor_max[amap[0]])
            d->actor_max[amap[0]] = last;
    }
    return 0;
}

/* A change ordered here with |c|'s author and seq: its hash in *out, or
 * 0 when it cannot be found. The author's run lists its changes that hold
 * ops, in seq order (an author's ordered changes are its seqs 1..max, in
 * order), so a binary search loads O(log n) bodies. Only when a fork is
 * met, which an honest cluster never sees. */
static int held_of(cairn_hash *out, const cairn_doc *d, const cairn_change *c)
{
    uint32_t a;
    if (!actor_find(d, &c->actor, &a))
        return 0;
    const arun *run = &d->runs[a];
    size_t lo = 0, hi = run->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        cairn_change *m = NULL;
        if (cairn_dag_load(&m, d->dag, run->v[mid].index) != 0)
            return 0;
        uint64_t seq = m->seq;
        cairn_change_free(m);
        if (seq == c->seq) {
            *out = *cairn_dag_hash_at(d->dag, run->v[mid].index);
            return 1;
        }
        if (seq < c->seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* The document's verdict codes: a change refused with one of them is
 * refused by every replica (its causal past decides), so the DAG may
 * forget it for good. Anything else (out of memory) may pass later. */
static int final_verdict(int rc)
{
    return rc == CAIRN_EBADOP || rc == CAIRN_ENOOBJ || rc == CAIRN_ENOTPAST ||
           rc == CAIRN_ENOTFOUND || rc == CAIRN_EFORK;
}

int cairn_doc_receive(cairn_doc *doc, cairn_change *c, const cairn_doc_observer *obs)
{
    if (doc->broken || doc->in_edit || doc->readonly) {
        cairn_change_free(c);
        return doc->broken ? doc->broken : CAIRN_ESTATE;
    }
    return cairn_doc_receive_(doc, c, obs);
}

size_t cairn_doc_expire_pending(cairn_doc *doc, uint64_t now_ms, uint64_t max_age_ms)
{
    return cairn_dag_expire(doc->dag, now_ms, max_age_ms);
}

/* Receive without the read-only check (new_at replays through it). */
int cairn_doc_receive_(cairn_doc *doc, cairn_change *c, const cairn_doc_observer *obs)
{
    drop_last_commit(doc);
    int state;
    int rc = cairn_dag_add(doc->dag, c, &state);
    if (rc)
        return rc;
    int first = 0;
    uint32_t *amap = NULL;
    size_t amap_cap = 0, bound_cap = 0;
    past p = {0};
    const cairn_change *r;
    while ((r = cairn_dag_peek_ready(doc->dag)) != NULL) {
        p = (past){.bound = p.bound};
        past_quick(doc, r, &p);
        rc = grow((void **)&amap, &amap_cap, r->nactors + 1, sizeof *amap);
        if (!rc)
            rc = grow((void **)&p.bound, &bound_cap, r->nactors + 1, sizeof *p.bound);
        if (!rc) {
            memset(p.bound, 0xff, (r->nactors + 1) * sizeof *p.bound);
            /* A fork before anything else: validate would often call it a
             * reuse of the author's op ids, and it must be reported. */
            if (r->seq <= cairn_dag_actor_seq(doc->dag, &r->actor)) {
                rc = CAIRN_EFORK;
                cairn_hash held;
                if (obs && obs->fork_cb)
                    obs->fork_cb(obs->arg, r, held_of(&held, doc, r) ? &held : NULL);
            } else {
                rc = validate(doc, r, amap, &p);
            }
        }
        if (!rc && r->nops)
            rc = run_reserve(doc, amap[0]); /* before ordering: nothing fails after */
        if (rc) {
            if (final_verdict(rc))
                cairn_dag_reject(doc->dag, rc);
            else
                cairn_dag_discard(doc->dag);
            if (!first)
                first = rc;
            continue;
        }
        uint64_t index;
        cairn_change *body;
        rc = cairn_dag_order(doc->dag, &index, &body);
        if (!rc && p.known && !p.empty) {
            doc->cc_ok = 1; /* the memo now describes this change */
            doc->cc_at = index;
        }
        if (rc) {
            /* the sequence rule discarded it; out of memory leaves it ready,
             * and retrying here could spin: drop it (a peer resends) */
            if (rc == CAIRN_ENOMEM)
                cairn_dag_discard(doc->dag);
            if (!first)
                first = rc;
            continue;
        }
        /* The body is ours now: applied, reported, then freed (the DAG or
         * its loader has the bytes; the doc copied the values it keeps). */
        if (obs && obs->change_cb)
            obs->change_cb(obs->arg, body, index, 1);
        doc->obs = obs;
        rc = apply_change(doc, body, amap);
        doc->obs = NULL;
        if (rc) {
            doc->broken = rc; /* half-applied: nothing can be trusted now */
            cairn_change_free(body);
            free(amap);
            free(p.bound);
            return rc;
        }
        if (body->nops)
            run_push(doc, amap[0], index, body->start_op + body->nops - 1);
        if (obs && obs->change_cb)
            obs->change_cb(obs->arg, body, index, 0);
        cairn_change_free(body);
    }
    free(amap);
    free(p.bound);
    return first;
}
