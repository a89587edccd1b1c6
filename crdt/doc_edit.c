/*
 * Local edits of the document (crdt/doc.h: begin .. commit / rollback).
 * Each edit applies at once through the same op code as a received change
 * (doc.c), so reads see it, and pushes an undo-log entry: rollback walks the
 * log backwards, restoring the exact previous records without allocating.
 * Every edit allocates what it needs before it changes anything, so a
 * failing edit changes nothing. Commit turns the pending ops into one
 * change (actor indices translated to the change's own table, preds
 * sorted by op id) and orders it in the DAG.
 */
#include "crdt/doc.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define CAIRN_DOC_IMPL
#include "crdt/doc_int.h"
#include "crdt/error.h"

/* ---- local edits ----------------------------------------------------------------- */

int cairn_doc_begin(cairn_doc *doc, uint64_t now_ms)
{
    if (doc->broken)
        return doc->broken;
    if (doc->in_edit || doc->readonly)
        return CAIRN_ESTATE;
    drop_last_commit(doc);
    uint64_t start = doc->max_counter + 1;
    if (now_ms > start)
        start = now_ms;
    if (start >= COUNTER_LIMIT)
        return CAIRN_EINVAL;
    doc->p_start = start;
    doc->p_time = now_ms;
    doc->in_edit = 1;
    return 0;
}

static int value_ok(const cairn_value *v)
{
    if (!v || v->type > CAIRN_V_COUNTER)
        return 0;
    if (v->type == CAIRN_V_BYTES || v->type == CAIRN_V_STR)
        return v->v.bytes.len <= CAIRN_CHANGE_MAX_BYTES && (v->v.bytes.ptr || !v->v.bytes.len);
    return 1;
}

/* Checks the edit state and reserves the per-edit buffers, so that the apply
 * functions never fail for want of log space. */
static int edit_prepare(cairn_doc *d)
{
    if (d->broken)
        return d->broken;
    if (!d->in_edit)
        return CAIRN_ESTATE;
    if (d->p_start + d->npops >= COUNTER_LIMIT || d->npops >= UINT32_MAX)
        return CAIRN_ELIMIT;
    int rc = grow((void **)&d->pops, &d->pops_cap, d->npops + 1, sizeof *d->pops);
    if (!rc)
        rc = grow((void **)&d->undo, &d->undo_cap, d->nundo + 2, sizeof *d->undo);
    if (!rc)
        rc = grow((void **)&d->pp, &d->pp_cap, d->npp + 1, sizeof *d->pp);
    return rc;
}

/* Builds pending op |p| with copies of key, value bytes and the preds taken
 * from |vs| (all visible ops, or only the winner when |winner_only|). */
static int pop_build(pop *p, uint8_t action, uint8_t insert, cairn_objid objid, const uint8_t *key,
                     size_t key_len, cairn_opid elem_id, const cairn_value *v, const vset *vs,
                     int winner_only)
{
    memset(p, 0, sizeof *p);
    size_t vlen = 0;
    if (v && (v->type == CAIRN_V_BYTES || v->type == CAIRN_V_STR))
        vlen = v->v.bytes.len;
    p->buf = xmalloc(key_len + vlen + 1);
    if (!p->buf)
        return CAIRN_ENOMEM;
    uint32_t npred = vs ? (winner_only && vs->n ? 1 : vs->n) : 0;
    if (npred) {
        p->op.pred = xmalloc(npred * sizeof *p->op.pred);
        if (!p->op.pred) {
            free(p->buf);
            p->buf = NULL;
            return CAIRN_ENOMEM;
        }
        const vop *o = vs_ops(vs);
        for (uint32_t i = 0; i < npred; i++) {
            p->op.pred[i].counter = o[i].counter;
            p->op.pred[i].actor = o[i].actor;
        }
    }
    if (key_len)
        memcpy(p->buf, key, key_len);
    p->op.action = action;
    p->op.insert = insert;
    p->op.obj = objid.counter ? objid : CAIRN_ROOT;
    p->op.key = p->buf;
    p->op.key_len = (uint32_t)key_len;
    p->op.elem = elem_id;
    if (v) {
        p->op.value = *v;
        if (vlen) {
            memcpy(p->buf + key_len, v->v.bytes.ptr, vlen);
            p->op.value.v.bytes.ptr = p->buf + key_len;
        }
    }
    p->op.npred = npred;
    return 0;
}

/* Applies a built pending op and keeps it, or frees it on failure. */
static int pop_apply(cairn_doc *d, pop *p, cairn_objid *out)
{
    uint64_t counter = d->p_start + d->npops;
    d->local = 1;
    int rc = apply_op(d, &p->op, counter, 0);
    d->local = 0;
    if (rc) {
        free(p->buf);
        free(p->op.pred);
        return rc;
    }
    d->pops[d->npops++] = *p;
    if (out) {
        out->counter = counter;
        out->actor = 0;
    }
    return 0;
}

static int map_edit(cairn_doc *d, cairn_objid *out, cairn_objid objid, const uint8_t *key,
                    size_t key_len, uint8_t action, const cairn_value *v)
{
    if (out)
        *out = CAIRN_ROOT;
    int rc = edit_prepare(d);
    if (rc)
        return rc;
    obj *o = find_obj(d, objid);
    if (!o)
        return CAIRN_ENOOBJ;
    if (o->type != CAIRN_OBJ_MAP || key_len > CAIRN_CHANGE_MAX_BYTES || (!key && key_len))
        return CAIRN_EINVAL;
    if (v && !value_ok(v))
        return CAIRN_EINVAL;
    mkey *rec = map_lookup(o, key, (uint32_t)key_len, hash_bytes(d, key, key_len));
    const vset *vs = rec ? &rec->vs : NULL;
    if ((action == CAIRN_OP_DEL || action == CAIRN_OP_INC) && !vs)
        return CAIRN_ENOTFOUND;
    if (action == CAIRN_OP_INC) {
        const vop *w = &vs_ops(vs)[0];
        if (w->kind != VK_SCALAR || w->vtype != CAIRN_V_COUNTER)
            return CAIRN_EINVAL;
    }
    pop p;
    rc = pop_build(&p, action, 0, objid, key, key_len, CAIRN_ROOT, v, vs, action == CAIRN_OP_INC);
    if (rc)
        return rc;
    return pop_apply(d, &p, out);
}

int cairn_doc_put(cairn_doc *doc, cairn_objid obj_id, const uint8_t *key, size_t key_len,
                  const cairn_value *v)
{
    if (!v)
        return CAIRN_EINVAL;
    return map_edit(doc, NULL, obj_id, key, key_len, CAIRN_OP_SET, v);
}

int cairn_doc_put_object(cairn_doc *doc, cairn_objid *out, cairn_objid obj_id, const uint8_t *key,
                         size_t key_len, int kind)
{
    if (kind != CAIRN_OBJ_MAP && kind != CAIRN_OBJ_LIST) {
        if (out)
            *out = CAIRN_ROOT;
        return CAIRN_EINVAL;
    }
    return map_edit(doc, out, obj_id, key, key_len,
                    kind == CAIRN_OBJ_MAP ? CAIRN_OP_MAKE_MAP : CAIRN_OP_MAKE_LIST, NULL);
}

int cairn_doc_delete(cairn_doc *doc, cairn_objid obj_id, const uint8_t *key, size_t key_len)
{
    return map_edit(doc, NULL, obj_id, key, key_len, CAIRN_OP_DEL, NULL);
}

int cairn_doc_increment(cairn_doc *doc, cairn_objid obj_id, const uint8_t *key, size_t key_len,
                        int64_t delta)
{
    cairn_value v = {.type = CAIRN_V_INT, .v.i = delta};
    return map_edit(doc, NULL, obj_id, key, key_len, CAIRN_OP_INC, &v);
}

/* List edits. |insert|: a new element at |index| (after the visible element
 * index-1); otherwise acts on the element at |index|. */
static int list_edit(cairn_doc *d, cairn_objid *out, cairn_objid objid, size_t index, int insert,
                     uint8_t action, const cairn_value *v)
{
    if (out)
        *out = CAIRN_ROOT;
    int rc = edit_prepare(d);
    if (rc)
        return rc;
    obj *o = find_obj(d, objid);
    if (!o)
        return CAIRN_ENOOBJ;
    if (o->type != CAIRN_OBJ_LIST)
        return CAIRN_EINVAL;
    if (v && !value_ok(v))
        return CAIRN_EINVAL;
    cairn_opid target = CAIRN_ROOT;
    const vset *vs = NULL;
    if (insert) {
        if (index > o->nvis)
            return CAIRN_EINVAL;
        if (index > 0) {
            const elem *e = o->items[list_pos(o, index - 1)];
            target.counter = e->counter;
            target.actor = e->actor;
        }
    } else {
        ptrdiff_t at = list_pos(o, index);
        if (at < 0)
            return CAIRN_ENOTFOUND;
        const elem *e = o->items[at];
        target.counter = e->counter;
        target.actor = e->actor;
        vs = &e->vs;
        if (action == CAIRN_OP_INC) {
            const vop *w = &vs_ops(vs)[0];
            if (w->kind != VK_SCALAR || w->vtype != CAIRN_V_COUNTER)
                return CAIRN_EINVAL;
        }
    }
    pop p;
    rc = pop_build(&p, action, (uint8_t)insert, objid, NULL, 0, target, v, vs,
                   action == CAIRN_OP_INC);
    if (rc)
        return rc;
    return pop_apply(d, &p, out);
}

int cairn_doc_list_insert(cairn_doc *doc, cairn_objid obj_id, size_t index, const cairn_value *v)
{
    if (!v)
        return CAIRN_EINVAL;
    return list_edit(doc, NULL, obj_id, index, 1, CAIRN_OP_SET, v);
}

int cairn_doc_list_insert_object(cairn_doc *doc, cairn_objid *out, cairn_objid obj_id, size_t index,
                                 int kind)
{
    if (kind != CAIRN_OBJ_MAP && kind != CAIRN_OBJ_LIST) {
        if (out)
            *out = CAIRN_ROOT;
        return CAIRN_EINVAL;
    }
    return list_edit(doc, out, obj_id, index, 1,
                     kind == CAIRN_OBJ_MAP ? CAIRN_OP_MAKE_MAP : CAIRN_OP_MAKE_LIST, NULL);
}

int cairn_doc_list_set(cairn_doc *doc, cairn_objid obj_id, size_t index, const cairn_value *v)
{
    if (!v)
        return CAIRN_EINVAL;
    return list_edit(doc, NULL, obj_id, index, 0, CAIRN_OP_SET, v);
}

int cairn_doc_list_delete(cairn_doc *doc, cairn_objid obj_id, size_t index)
{
    return list_edit(doc, NULL, obj_id, index, 0, CAIRN_OP_DEL, NULL);
}

int cairn_doc_list_increment(cairn_doc *doc, cairn_objid obj_id, size_t index, int64_t delta)
{
    cairn_value v = {.type = CAIRN_V_INT, .v.i = delta};
    return list_edit(doc, NULL, obj_id, index, 0, CAIRN_OP_INC, &v);
}

/* Undoes the log from its end down to |keep| entries, without allocating. */
static void undo_to(cairn_doc *d, size_t keep)
{
    while (d->nundo > keep) {
        undo *u = &d->undo[--d->nundo];
        obj *o = u->o;
        switch (u->what) {
        case U_MAP: {
            mkey *r = u->rec;
            if (u->rec_new) {
                ptab_del_ptr(d, &o->keys, r);
                o->nvis -= r->vs.n > 0;
                vs_free(&r->vs);
                free(r);
            } else {
                r->in_undo = 0;
                if (u->rec_removed) {
                    ptab_put(d, &o->keys, r); /* its old slot's room is still there */
                } else {
                    o->nvis -= r->vs.n > 0;
                    vs_free(&r->vs);
                }
                o->nvis += u->saved.n > 0;
                r->vs = u->saved;
            }
            break;
        }
        case U_ELEM:
            o->nvis -= u->e->vs.n > 0;
            vs_free(&u->e->vs);
            u->e->vs = u->saved;
            o->nvis += u->saved.n > 0;
            break;
        case U_INSERT: {
            ptrdiff_t at = -1;
            for (size_t i = o->n; i-- > 0;)
                if (o->items[i] == u->e) {
                    at = (ptrdiff_t)i;
                    break;
                }
            if (at >= 0) {
                memmove(&o->items[at], &o->items[at + 1],
                        (o->n - (size_t)at - 1) * sizeof *o->items);
                o->n--;
            }
            o->nvis -= u->e->vs.n > 0;
            vs_free(&u->e->vs);
            free(u->e);
            break;
        }
        case U_OBJ:
            ptab_del_ptr(d, &d->objs, o);
            obj_clear(o);
            free(o);
            break;
        }
    }
}

void cairn_doc_rollback(cairn_doc *doc)
{
    if (!doc->in_edit)
        return;
    undo_to(doc, 0);
    pending_clear(doc);
}

/* Forgets the undo log after a commit: frees what it kept alive, then
 * settles the records whose first value died in the edit. A record may have
 * several entries and may be freed by its last (a removal), so the records
 * to settle are picked first, each once (by its last entry), and settled
 * after every entry is done with. */
static void undo_forget(cairn_doc *d)
{
    for (size_t i = d->nundo; i-- > 0;) {
        undo *u = &d->undo[i];
        if (u->what == U_MAP) {
            u->rec_owner = u->rec->in_undo && !u->rec_removed;
            u->rec->in_undo = 0;
        }
    }
    for (size_t i = 0; i < d->nundo; i++) {
        undo *u = &d->undo[i];
        if (u->what == U_MAP || u->what == U_ELEM)
            vs_free(&u->saved);
        if (u->what == U_MAP && u->rec_removed)
            free(u->rec);
    }
    for (size_t i = 0; i < d->nundo; i++) {
        undo *u = &d->undo[i];
        if (u->what == U_MAP && u->rec_owner)
            rec_settle(d, u->o, u->rec, u->rec_hash);
    }
    d->nundo = 0;
}

struct actor_ix {
    cairn_actor a;
    uint32_t idx;
};

static int cmp_actor_ix(const void *x, const void *y)
{
    return memcmp(((const struct actor_ix *)x)->a.b, ((const struct actor_ix *)y)->a.b,
                  CAIRN_ACTOR_LEN);
}

/* Preds in document indices, ascending by (counter, actor bytes) as the
 * encoding wants; few, so insertion sort. */
static void sort_preds(const cairn_doc *d, cairn_opid *p, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        cairn_opid x = p[i];
        uint32_t j = i;
        while (j > 0 && opcmp(d, p[j - 1].counter, p[j - 1].actor, x.counter, x.actor) > 0) {
            p[j] = p[j - 1];
            j--;
        }
        p[j] = x;
    }
}

/* Document actor index |a| -> index in the change's table. */
static uint32_t tr_actor(const cairn_doc *d, const uint32_t *others, size_t nothers, uint32_t a)
{
    if (a == 0)
        return 0;
    size_t lo = 0, hi = nothers;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = memcmp(d->actors[others[mid]].b, d->actors[a].b, CAIRN_ACTOR_LEN);
        if (c == 0)
            return (uint32_t)mid + 1;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0; /* not reached: every referenced actor was collected */
}

static cairn_opid tr_id(const cairn_doc *d, const uint32_t *others, size_t nothers, cairn_opid id)
{
    cairn_opid r = {id.counter, 0};
    if (id.counter)
        r.actor = tr_actor(d, others, nothers, id.actor);
    return r;
}

/* Seals the pending ops into a change (in the change's actor indices). */
static int build_change(cairn_doc *d, cairn_change **out)
{
    *out = NULL;
    int rc = CAIRN_ENOMEM;
    size_t nref = 0, ntot = 0;
    for (size_t i = 0; i < d->npops; i++)
        nref += 2 + d->pops[i].op.npred, ntot += d->pops[i].op.npred;
    struct actor_ix *ax = xmalloc((nref + 1) * sizeof *ax);
    uint32_t *others = xmalloc((nref + 1) * sizeof *others);
    cairn_op *ops = xmalloc(d->npops * sizeof *ops);
    cairn_opid *preds = xmalloc((ntot + 1) * sizeof *preds);
    cairn_actor *actors = NULL;
    if (!ax || !others || !ops || !preds)
        goto out;
    size_t n = 0;
    for (size_t i = 0; i < d->npops; i++) {
        const cairn_op *op = &d->pops[i].op;
        if (op->obj.counter && op->obj.actor)
            ax[n++].idx = op->obj.actor;
        if (op->elem.counter && op->elem.actor)
            ax[n++].idx = op->elem.actor;
        for (uint32_t k = 0; k < op->npred; k++)
            if (op->pred[k].actor)
                ax[n++].idx = op->pred[k].actor;
    }
    for (size_t i = 0; i < n; i++)
        ax[i].a = d->actors[ax[i].idx];
    qsort(ax, n, sizeof *ax, cmp_actor_ix);
    size_t nothers = 0;
    for (size_t i = 0; i < n; i++)
        if (nothers == 0 || others[nothers - 1] != ax[i].idx)
            others[nothers++] = ax[i].idx;
    if (nothers + 1 > CAIRN_CHANGE_MAX_ACTORS) {
        rc = CAIRN_ELIMIT;
        goto out;
    }
    actors = xmalloc((nothers + 1) * sizeof *actors);
    if (!actors)
        goto out;
    actors[0] = d->actors[0];
    for (size_t i = 0; i < nothers; i++)
        actors[i + 1] = d->actors[others[i]];
    size_t pk = 0;
    for (size_t i = 0; i < d->npops; i++) {
        const cairn_op *src = &d->pops[i].op;
        cairn_op *op = &ops[i];
        *op = *src;
        op->obj = tr_id(d, others, nothers, src->obj);
        op->elem = tr_id(d, others, nothers, src->elem);
        op->pred = &preds[pk];
        if (src->npred)
            memcpy(op->pred, src->pred, src->npred * sizeof *op->pred);
        sort_preds(d, op->pred, src->npred);
        for (uint32_t k = 0; k < src->npred; k++)
            preds[pk + k] = tr_id(d, others, nothers, preds[pk + k]);
        pk += src->npred;
        if (!op->npred)
            op->pred = NULL;
    }
    cairn_change t;
    memset(&t, 0, sizeof t);
    t.actor = d->actors[0];
    t.seq = cairn_dag_actor_seq(d->dag, &d->actors[0]) + 1;
    t.start_op = d->p_start;
    t.time_ms = d->p_time;
    const cairn_hash *heads;
    t.ndeps = (uint32_t)cairn_dag_heads(d->dag, &heads);
    t.deps = (cairn_hash *)heads;
    t.nactors = (uint32_t)(nothers + 1);
    t.actors = actors;
    t.nops = (uint32_t)d->npops;
    t.ops = ops;
    rc = cairn_change_new(out, &t);
out:
    free(ax);
    free(others);
    free(ops);
    free(preds);
    free(actors);
    return rc;
}

int cairn_doc_commit(cairn_doc *doc, const cairn_change **out, const cairn_doc_observer *obs)
{
    if (out)
        *out = NULL;
    drop_last_commit(doc);
    if (doc->broken)
        return doc->broken;
    if (!doc->in_edit)
        return CAIRN_ESTATE;
    if (doc->npops == 0) {
        pending_clear(doc);
        return 0;
    }
    cairn_change *c;
    int rc = run_reserve(doc, 0);
    if (rc || (rc = build_change(doc, &c)) != 0)
        goto fail;
    cairn_hash h = c->hash;
    int state;
    rc = cairn_dag_add(doc->dag, c, &state);
    if (rc)
        goto fail;
    const cairn_change *peek = cairn_dag_peek_ready(doc->dag);
    if (state != CAIRN_DAG_READY || !peek || cairn_hash_cmp(&peek->hash, &h) != 0) {
        rc = CAIRN_ESTATE; /* our own change must be ready at once */
        goto fail;
    }
    uint64_t index;
    cairn_change *r;
    rc = cairn_dag_order(doc->dag, &index, &r);
    if (rc) {
        if (rc == CAIRN_ENOMEM)
            cairn_dag_discard(doc->dag); /* else it would stay ready */
        goto fail;
    }
    /* The DAG keeps no body; the doc holds this one for |out| until its next
     * write. The edits' values are already the doc's own copies. */
    doc->last_commit = r;
    uint64_t last = doc->p_start + doc->npops - 1;
    if (last > doc->max_counter)
        doc->max_counter = last;
    doc->actor_max[0] = last;
    run_push(doc, 0, index, last);
    if (obs && obs->change_cb)
        obs->change_cb(obs->arg, r, index, 1);
    if (obs && obs->patch_cb)
        for (size_t i = 0; i < doc->npp; i++)
            obs->patch_cb(obs->arg, &doc->pp[i]);
    if (obs && obs->change_cb)
        obs->change_cb(obs->arg, r, index, 0);
    undo_forget(doc);
    pending_clear(doc);
    if (out)
        *out = r;
    return 0;
fail:
    cairn_doc_rollback(doc);
    return rc;
}
