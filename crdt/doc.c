/*
 * The document: an op-based CRDT of maps and lists (crdt/doc.h). Every op has
 * an id (counter, actor); the state of a map key or list element is the set
 * of its ops that no applied op lists among its predecessors ("visible"
 * ops). Because an honest op only names ops from its causal past as
 * predecessors, "apply = remove my preds, add myself" commutes for
 * concurrent ops, which is why any causal delivery order gives one state.
 * The winner of a key is its greatest visible op id (counter, then actor
 * BYTES: actor indices are local to each replica and to each change).
 *
 * Counters: a SET of a CAIRN_V_COUNTER value creates a counter op; an INC op
 * does not overwrite, it adds its delta to each visible counter op it names
 * as predecessor. Addition commutes, and an INC whose counter was overwritten
 * concurrently is dropped whichever arrives first, so increments converge.
 *
 * Lists are RGA: an element is named by the id of the op that inserted it and
 * follows the element it was inserted after; concurrent inserts after one
 * element are ordered greatest id first. Validation requires every reference
 * inside a change to name an op with a smaller counter than the change's
 * start_op (the Lamport property the HLC gives honest peers), so an element's
 * descendants always carry greater ids than it, and "skip the following
 * elements with a greater id" puts an insert in the same place on every
 * replica. Deleted elements stay as tombstones, and every object ever made
 * stays addressable, so a concurrent op on something deleted still applies.
 *
 * This file holds the state and the op code that local edits and received
 * changes share; local edits and their undo log are in doc_edit.c, the
 * validation and application of changes from peers in doc_receive.c, reads
 * in doc_query.c, checkpoints in doc_ckpt.c, the canonical dump and new_at
 * in doc_dump.c (internals shared through doc_int.h).
 *
 * Patches: a map key reports PUT when its winner's id changes (new key or a
 * new winner), DEL when nothing stays visible, INC when the winner is a
 * counter whose total changed. An op that loses to the current winner, or
 * only removes a losing conflict, reports nothing even though nconflicts
 * changed: the store cares about winners. Lists report INSERT / REMOVE when
 * an element becomes visible / invisible, SET when its winner changes, INC.
 */
#include "crdt/doc.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define CAIRN_DOC_IMPL
#include "crdt/doc_int.h"
#include "crdt/error.h"

/* Allocation failure injection for tests (SQLite's test_malloc idea): while
 * cairn_doc_fail_alloc_ > 0 it counts down on every allocation made here,
 * and the allocation that brings it to zero fails. Not thread-safe; only
 * tests set it. */
long cairn_doc_fail_alloc_;

static int alloc_fails(void)
{
    return cairn_doc_fail_alloc_ > 0 && --cairn_doc_fail_alloc_ == 0;
}

void *xmalloc(size_t n)
{
    return alloc_fails() ? NULL : malloc(n);
}

void *xcalloc(size_t n, size_t size)
{
    return alloc_fails() ? NULL : calloc(n, size);
}

void *xrealloc(void *p, size_t n)
{
    return alloc_fails() ? NULL : realloc(p, n);
}

int cairn_doc_grow_(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *np = xrealloc(*p, nc * size);
    if (!np)
        return CAIRN_ENOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

/* ---- ids, hashing ------------------------------------------------------ */

int cairn_doc_opcmp_(const cairn_doc *d, uint64_t c1, uint32_t a1, uint64_t c2, uint32_t a2)
{
    if (c1 != c2)
        return c1 < c2 ? -1 : 1;
    if (a1 == a2)
        return 0;
    return memcmp(d->actors[a1].b, d->actors[a2].b, CAIRN_ACTOR_LEN);
}

uint32_t cairn_doc_hash_bytes_(const cairn_doc *d, const void *p, size_t len)
{
    return cairn_htab_sip(d->hkey, p, len);
}

uint32_t cairn_doc_hash_id_(const cairn_doc *d, uint64_t counter, uint32_t actor)
{
    uint8_t b[12];
    memcpy(b, &counter, 8);
    memcpy(b + 8, &actor, 4);
    return hash_bytes(d, b, sizeof b);
}

/* ---- the object and key tables (crdt/htab.h) -------------------------------- */

/* Objects store their hash; map records are hashed from their key (a few
 * tens of ns; records do not spend 4 bytes each on it). */
uint32_t cairn_doc_obj_hash_(const void *arg, const void *e)
{
    (void)arg;
    return ((const obj *)e)->hash;
}

uint32_t cairn_doc_key_hash_(const void *arg, const void *e)
{
    const mkey *r = e;
    return hash_bytes(arg, r->key, r->key_len);
}

static cairn_htab_hash_cb ent_hash_cb(const cairn_doc *d, const ptab *t)
{
    return t == &d->objs ? cairn_doc_obj_hash_ : cairn_doc_key_hash_;
}

static uint32_t ent_hash(const cairn_doc *d, const ptab *t, const void *e)
{
    return ent_hash_cb(d, t)(d, e);
}

void ptab_put(const cairn_doc *d, ptab *t, void *e)
{
    cairn_htab_put(t, e, ent_hash(d, t, e), ent_hash_cb(d, t), d);
}

/* Room for |extra| more entries; a growth counts as one allocation for the
 * failure injection. */
int cairn_doc_ptab_reserve_(const cairn_doc *d, ptab *t, uint32_t extra)
{
    if (cairn_htab_full(t, extra) && alloc_fails())
        return CAIRN_ENOMEM;
    return cairn_htab_reserve(t, extra, 4, ent_hash_cb(d, t), d);
}

void ptab_del_ptr(const cairn_doc *d, ptab *t, const void *e)
{
    cairn_htab_del(t, e, ent_hash(d, t, e), ent_hash_cb(d, t), d);
}

/* ---- actors ---------------------------------------------------------------- */

int cairn_doc_actor_find_(const cairn_doc *d, const cairn_actor *a, uint32_t *idx)
{
    if (!d->acap)
        return 0;
    uint32_t mask = d->acap - 1;
    for (uint32_t i = hash_bytes(d, a->b, CAIRN_ACTOR_LEN) & mask; d->aslots[i];
         i = (i + 1) & mask) {
        uint32_t x = d->aslots[i] - 1;
        if (memcmp(d->actors[x].b, a->b, CAIRN_ACTOR_LEN) == 0) {
            *idx = x;
            return 1;
        }
    }
    return 0;
}

int cairn_doc_run_reserve_(cairn_doc *d, uint32_t a)
{
    arun *r = &d->runs[a];
    return grow((void **)&r->v, &r->cap, r->n + 1, sizeof *r->v);
}

void cairn_doc_run_push_(cairn_doc *d, uint32_t a, uint64_t index, uint64_t end)
{
    arun *r = &d->runs[a];
    r->v[r->n++] = (aspan){index, end};
}

int cairn_doc_actor_intern_(cairn_doc *d, const cairn_actor *a, uint32_t *idx)
{
    if (actor_find(d, a, idx))
        return 0;
    if (d->nactors == d->actors_cap) {
        uint32_t cap = d->actors_cap ? d->actors_cap * 2 : 8;
        cairn_actor *na = xrealloc(d->actors, (size_t)cap * sizeof *na);
        if (!na)
            return CAIRN_ENOMEM;
        d->actors = na;
        uint64_t *nm = xrealloc(d->actor_max, (size_t)cap * sizeof *nm);
        if (!nm)
            return CAIRN_ENOMEM;
        d->actor_max = nm;
        arun *nr = xrealloc(d->runs, (size_t)cap * sizeof *nr);
        if (!nr)
            return CAIRN_ENOMEM;
        d->runs = nr;
        d->actors_cap = cap;
    }
    if ((uint64_t)(d->nactors + 1) * 2 > d->acap) {
        uint32_t cap = d->acap ? d->acap * 2 : 16;
        uint32_t *ns = xcalloc(cap, sizeof *ns);
        if (!ns)
            return CAIRN_ENOMEM;
        for (uint32_t x = 0; x < d->nactors; x++) {
            uint32_t i = hash_bytes(d, d->actors[x].b, CAIRN_ACTOR_LEN) & (cap - 1);
            while (ns[i])
                i = (i + 1) & (cap - 1);
            ns[i] = x + 1;
        }
        free(d->aslots);
        d->aslots = ns;
        d->acap = cap;
    }
    uint32_t x = d->nactors++;
    d->actors[x] = *a;
    d->actor_max[x] = 0;
    d->runs[x] = (arun){0};
    uint32_t i = hash_bytes(d, a->b, CAIRN_ACTOR_LEN) & (d->acap - 1);
    while (d->aslots[i])
        i = (i + 1) & (d->acap - 1);
    d->aslots[i] = x + 1;
    *idx = x;
    return 0;
}

/* ---- objects ----------------------------------------------------------- */

const obj *cairn_doc_find_obj_(const cairn_doc *d, uint64_t counter, uint32_t actor)
{
    if (counter == 0)
        return &d->root;
    cairn_htab_probe p;
    for (void **s = cairn_htab_probe_start(&d->objs, hash_id(d, counter, actor), &p); s;
         s = cairn_htab_probe_next(&d->objs, &p)) {
        const obj *o = *s;
        if (o->counter == counter && o->actor == actor)
            return o;
    }
    return NULL;
}

obj *find_obj(cairn_doc *d, cairn_objid id)
{
    if (id.counter != 0 && id.actor >= d->nactors)
        return NULL;
    return (obj *)cairn_doc_find_obj_(d, id.counter, id.actor);
}

/* ---- value bytes ------------------------------------------------------- */

static void vop_ref(const vop *o)
{
    if (vop_has_bytes(o))
        vop_bytes(o)->refs++;
}

static void vop_unref(const vop *o)
{
    if (vop_has_bytes(o) && --vop_bytes(o)->refs == 0)
        free(vop_bytes(o));
}

/* Releases the set: its ops' bytes and the array. */
void cairn_doc_vs_free_(vset *s)
{
    const vop *v = vs_ops(s);
    for (uint32_t i = 0; i < s->n; i++)
        vop_unref(&v[i]);
    if (s->n >= 2)
        free(s->many);
    s->n = 0;
}

void obj_clear(obj *o)
{
    mkey *r;
    for (size_t i = 0; (r = cairn_htab_each(&o->keys, &i));) {
        vs_free(&r->vs);
        free(r);
    }
    cairn_htab_destroy(&o->keys);
    for (size_t i = 0; i < o->n; i++) {
        vs_free(&o->items[i]->vs);
        free(o->items[i]);
    }
    free(o->items);
}

/* ---- visible sets -------------------------------------------------------------- */

static int in_preds(const vop *v, const cairn_opid *pred, uint32_t npred)
{
    for (uint32_t k = 0; k < npred; k++)
        if (pred[k].counter == v->counter && pred[k].actor == v->actor)
            return 1;
    return 0;
}

/* Computes into |out| (fresh; |in| untouched) the set after an op: INC adds
 * |delta| to the named counters; otherwise the named preds go and |add| (if
 * any) joins in id order. The ops taken from |in| gain a reference; |add|'s
 * bytes move into |out| on success (the caller releases them on failure). */
static int vs_compute(const cairn_doc *d, vset *out, const vset *in, const vop *add,
                      const cairn_opid *pred, uint32_t npred, int inc, int64_t delta)
{
    const vop *src = vs_ops(in);
    vop tmp[2];
    vop *dst = tmp;
    size_t total = 0;
    if (inc) {
        total = in->n;
    } else {
        for (uint32_t i = 0; i < in->n; i++)
            total += !in_preds(&src[i], pred, npred);
        total += add != NULL;
    }
    memset(out, 0, sizeof *out);
    if (total >= 2) {
        dst = xmalloc(total * sizeof *dst);
        if (!dst)
            return CAIRN_ENOMEM;
    }
    size_t k = 0;
    int added = 0;
    for (uint32_t i = 0; i < in->n; i++) {
        if (inc) {
            dst[k] = src[i];
            if (src[i].kind == VK_SCALAR && src[i].vtype == CAIRN_V_COUNTER &&
                in_preds(&src[i], pred, npred))
                dst[k].v.i = (int64_t)((uint64_t)src[i].v.i + (uint64_t)delta);
            vop_ref(&dst[k]);
            k++;
            continue;
        }
        if (in_preds(&src[i], pred, npred))
            continue;
        if (add && !added && opcmp(d, add->counter, add->actor, src[i].counter, src[i].actor) > 0) {
            dst[k++] = *add;
            added = 1;
        }
        vop_ref(&src[i]);
        dst[k++] = src[i];
    }
    if (add && !added && !inc)
        dst[k++] = *add;
    if (total == 1)
        out->one = dst[0];
    else if (total >= 2)
        out->many = dst;
    out->n = (uint32_t)total; /* after |one|, which it overlays */
    return 0;
}

void read_of(cairn_read *r, const vop *v)
{
    memset(r, 0, sizeof *r);
    r->id.counter = v->counter;
    r->id.actor = v->actor;
    if (v->kind == VK_MAP || v->kind == VK_LIST) {
        r->kind = v->kind == VK_MAP ? CAIRN_READ_MAP : CAIRN_READ_LIST;
        r->obj = r->id;
        return;
    }
    r->kind = CAIRN_READ_SCALAR;
    r->value.type = v->vtype;
    switch (v->vtype) {
    case CAIRN_V_BOOL:
        r->value.v.b = v->v.i != 0;
        break;
    case CAIRN_V_INT:
    case CAIRN_V_COUNTER:
        r->value.v.i = v->v.i;
        break;
    case CAIRN_V_UINT:
        r->value.v.u = v->v.u;
        break;
    case CAIRN_V_F64:
        r->value.v.f = v->v.f;
        break;
    case CAIRN_V_BYTES:
    case CAIRN_V_STR:
        r->value.v.bytes.ptr = v->v.p;
        r->value.v.bytes.len = v->len;
        break;
    default:
        break;
    }
}

/* Fills |o| for op (counter, actor); a bytes/str value is copied into |inl|
 * when not NULL (room for it is the caller's: a new map record's tail), else
 * into a new vbytes that |o| holds one reference to. */
static int vop_make(vop *o, uint64_t counter, uint32_t actor, uint8_t action, const cairn_value *v,
                    uint8_t *inl)
{
    memset(o, 0, sizeof *o);
    o->counter = counter;
    o->actor = actor;
    if (action == CAIRN_OP_MAKE_MAP) {
        o->kind = VK_MAP;
        return 0;
    }
    if (action == CAIRN_OP_MAKE_LIST) {
        o->kind = VK_LIST;
        return 0;
    }
    o->kind = VK_SCALAR;
    o->vtype = v->type;
    switch (v->type) {
    case CAIRN_V_BOOL:
        o->v.i = v->v.b ? 1 : 0;
        break;
    case CAIRN_V_INT:
    case CAIRN_V_COUNTER:
        o->v.i = v->v.i;
        break;
    case CAIRN_V_UINT:
        o->v.u = v->v.u;
        break;
    case CAIRN_V_F64:
        o->v.f = v->v.f;
        break;
    case CAIRN_V_BYTES:
    case CAIRN_V_STR:
        o->len = (uint32_t)v->v.bytes.len;
        o->v.p = (const uint8_t *)"";
        if (o->len && inl) {
            memcpy(inl, v->v.bytes.ptr, o->len);
            o->v.p = inl;
            o->flags = VF_INLINE;
        } else if (o->len) {
            vbytes *b = xmalloc(sizeof *b + o->len);
            if (!b)
                return CAIRN_ENOMEM;
            b->refs = 1;
            memcpy(b->b, v->v.bytes.ptr, o->len);
            o->v.p = b->b;
        }
        break;
    default:
        break;
    }
    return 0;
}

/* ---- patches ---------------------------------------------------------------- */

static void emit(cairn_doc *d, const cairn_patch *p)
{
    if (d->local) {
        d->pp[d->npp++] = *p; /* room reserved by the edit */
        return;
    }
    if (d->obs && d->obs->patch_cb)
        d->obs->patch_cb(d->obs->arg, p);
}

/* Compares the winner before and after; fills |p| and returns 1 if there is
 * something to report. List: 1 = element patch kinds. */
static int winner_patch(cairn_patch *p, const vop *before, const vset *after, int list)
{
    const vop *w = after->n ? &vs_ops(after)[0] : NULL;
    p->nconflicts = after->n;
    if (!before && !w)
        return 0;
    if (w)
        read_of(&p->value, w);
    if (!before) {
        p->action = list ? CAIRN_PATCH_INSERT : CAIRN_PATCH_PUT;
        return 1;
    }
    if (!w) {
        p->action = list ? CAIRN_PATCH_REMOVE : CAIRN_PATCH_DEL;
        return 1;
    }
    if (before->counter != w->counter || before->actor != w->actor) {
        p->action = list ? CAIRN_PATCH_SET : CAIRN_PATCH_PUT;
        return 1;
    }
    if (w->kind == VK_SCALAR && w->vtype == CAIRN_V_COUNTER && before->v.i != w->v.i) {
        p->action = CAIRN_PATCH_INC;
        return 1;
    }
    return 0;
}

/* ---- applying one op ----------------------------------------------------------- */

/* An object made by op (counter, actor), allocated and reserved in the table
 * but not inserted. */
static int obj_prepare(cairn_doc *d, obj **out, uint8_t action, uint64_t counter, uint32_t actor)
{
    *out = NULL;
    if (action != CAIRN_OP_MAKE_MAP && action != CAIRN_OP_MAKE_LIST)
        return 0;
    obj *o = xcalloc(1, sizeof *o);
    if (!o)
        return CAIRN_ENOMEM;
    int rc = ptab_reserve(d, &d->objs, 1);
    if (rc) {
        free(o);
        return rc;
    }
    o->type = action == CAIRN_OP_MAKE_MAP ? CAIRN_OBJ_MAP : CAIRN_OBJ_LIST;
    o->counter = counter;
    o->actor = actor;
    o->hash = hash_id(d, counter, actor);
    *out = o;
    return 0;
}

static void obj_commit(cairn_doc *d, obj *no)
{
    if (!no)
        return;
    ptab_put(d, &d->objs, no);
    if (d->local) {
        undo *u = &d->undo[d->nundo++];
        memset(u, 0, sizeof *u);
        u->what = U_OBJ;
        u->o = no;
    }
}

static int vs_has_inline(const vset *s)
{
    const vop *v = vs_ops(s);
    for (uint32_t i = 0; i < s->n; i++)
        if (v[i].flags & VF_INLINE)
            return 1;
    return 0;
}

/* Once the record's first value is dead (no vset holds it), the record
 * takes its single bytes value into the tail, resizing the allocation to fit
 * when it is off by 32 bytes or more, so a key overwritten any number of
 * times still costs one allocation; with no such value the tail is dropped.
 * Returns the record, maybe moved. |h| is its hash (0: compute it). The
 * caller guarantees that nothing but the table points at |r| or at the
 * value's vbytes (no undo entry, no vset being computed). The tail's room
 * is malloc_usable_size's (glibc lets the caller use it). A failed realloc
 * changes nothing. */
mkey *rec_settle(cairn_doc *d, obj *o, mkey *r, uint32_t h)
{
    if (!r->tail || vs_has_inline(&r->vs))
        return r;
    const vop *w = r->vs.n == 1 ? &r->vs.one : NULL;
    vbytes *b = w && vop_has_bytes(w) && vop_bytes(w)->refs == 1 ? vop_bytes(w) : NULL;
    size_t vlen = b ? w->len : 0;
    size_t head = offsetof(mkey, key) + (size_t)r->key_len;
    size_t room = malloc_usable_size(r) - head;
    mkey *nr = r;
    if (!b || vlen > room || room - vlen >= 32) {
        cairn_htab_probe p;
        void **s = cairn_htab_probe_start(&o->keys, h ? h : ent_hash(d, &o->keys, r), &p);
        while (s && *s != r)
            s = cairn_htab_probe_next(&o->keys, &p);
        if (!s)
            return r;
        nr = xrealloc(r, head + vlen);
        if (!nr)
            return r;
        *s = nr;
    }
    nr->tail = b != NULL;
    if (b) {
        memcpy(nr->key + nr->key_len, b->b, vlen);
        nr->vs.one.v.p = nr->key + nr->key_len;
        nr->vs.one.flags |= VF_INLINE;
        free(b);
    }
    return nr;
}

mkey *cairn_doc_map_lookup_(const obj *o, const uint8_t *key, uint32_t key_len, uint32_t h)
{
    cairn_htab_probe p;
    for (void **s = cairn_htab_probe_start(&o->keys, h, &p); s;
         s = cairn_htab_probe_next(&o->keys, &p)) {
        mkey *r = *s;
        if (r->key_len == key_len && (!key_len || memcmp(r->key, key, key_len) == 0))
            return r;
    }
    return NULL;
}

/* Applies one map op with id (counter, actor); preds in document indices. */
static int apply_map(cairn_doc *d, obj *o, const uint8_t *key, uint32_t key_len, uint64_t counter,
                     uint32_t actor, uint8_t action, const cairn_value *v, const cairn_opid *pred,
                     uint32_t npred)
{
    uint32_t h = hash_bytes(d, key, key_len);
    mkey *rec = map_lookup(o, key, key_len, h);
    static const vset empty;
    const vset *in = rec ? &rec->vs : &empty;
    int inc = action == CAIRN_OP_INC;
    if (inc && !rec)
        return 0; /* the counter was overwritten concurrently */
    vop add;
    int adds = action != CAIRN_OP_DEL && !inc;
    int rc;
    /* A new record (only an adding op makes one) carries its first value's
     * bytes: one allocation per key. */
    mkey *nrec = NULL;
    uint8_t *inl = NULL;
    if (!rec && adds) {
        size_t vlen = 0;
        if (action == CAIRN_OP_SET && (v->type == CAIRN_V_BYTES || v->type == CAIRN_V_STR))
            vlen = v->v.bytes.len;
        nrec = xmalloc(offsetof(mkey, key) + (size_t)key_len + vlen);
        if (!nrec)
            return CAIRN_ENOMEM;
        if ((rc = ptab_reserve(d, &o->keys, 1)) != 0) {
            free(nrec);
            return rc;
        }
        memset(&nrec->vs, 0, sizeof nrec->vs);
        nrec->key_len = key_len;
        nrec->tail = vlen > 0;
        nrec->in_undo = 0;
        if (key_len)
            memcpy(nrec->key, key, key_len);
        if (vlen)
            inl = nrec->key + key_len;
    }
    if (adds && (rc = vop_make(&add, counter, actor, action, v, inl)) != 0) {
        free(nrec);
        return rc;
    }
    vset out;
    rc = vs_compute(d, &out, in, adds ? &add : NULL, pred, npred, inc, inc ? v->v.i : 0);
    if (rc) {
        if (adds)
            vop_unref(&add);
        free(nrec);
        return rc;
    }
    obj *no = NULL;
    if ((rc = obj_prepare(d, &no, action, counter, actor)) != 0) {
        free(nrec);
        vs_free(&out);
        return rc;
    }

    /* Nothing fails from here on. */
    vop before;
    int had = in->n > 0;
    if (had)
        before = vs_ops(in)[0];
    mkey *r = rec ? rec : nrec;
    int removed = rec && out.n == 0;
    if (d->local && r) {
        undo *u = &d->undo[d->nundo++];
        memset(u, 0, sizeof *u);
        u->what = U_MAP;
        u->o = o;
        u->rec = r;
        u->rec_new = nrec != NULL;
        u->rec_removed = removed;
        u->rec_hash = h;
        u->saved = rec ? rec->vs : empty;
        r->in_undo = 1;
    } else if (rec) {
        vs_free(&rec->vs);
    }
    if (r) {
        r->vs = out;
        if (nrec)
            cairn_htab_put(&o->keys, nrec, h, cairn_doc_key_hash_, d);
        if (removed)
            ptab_del_ptr(d, &o->keys, rec);
    }
    if (rec && !removed && !d->local) /* no undo entry can name it */
        r = rec_settle(d, o, rec, h);
    o->nvis += (size_t)(out.n > 0) - (size_t)had;
    obj_commit(d, no);

    cairn_patch p;
    memset(&p, 0, sizeof p);
    if (winner_patch(&p, had ? &before : NULL, r ? &r->vs : &out, 0)) { /* settled */
        p.obj.counter = o->counter;
        p.obj.actor = o->actor;
        p.key = r ? r->key : key;
        p.key_len = key_len;
        emit(d, &p);
    }
    if (removed && !d->local)
        free(rec);
    return 0;
}

ptrdiff_t list_find(const obj *o, uint64_t counter, uint32_t actor)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->items[i]->counter == counter && o->items[i]->actor == actor)
            return (ptrdiff_t)i;
    return -1;
}

static size_t visible_before(const obj *o, size_t pos)
{
    size_t k = 0;
    for (size_t i = 0; i < pos; i++)
        k += o->items[i]->vs.n > 0;
    return k;
}

/* Position of the |index|-th visible element, or -1. */
ptrdiff_t list_pos(const obj *o, size_t index)
{
    if (index >= o->nvis)
        return -1;
    for (size_t i = 0; i < o->n; i++) {
        if (o->items[i]->vs.n == 0)
            continue;
        if (index-- == 0)
            return (ptrdiff_t)i;
    }
    return -1;
}

static int apply_list_insert(cairn_doc *d, obj *o, cairn_opid after, uint64_t counter,
                             uint32_t actor, uint8_t action, const cairn_value *v)
{
    size_t p = 0;
    if (after.counter != 0) {
        ptrdiff_t at = list_find(o, after.counter, after.actor);
        if (at < 0)
            return CAIRN_ENOTFOUND;
        p = (size_t)at + 1;
    }
    while (p < o->n && opcmp(d, o->items[p]->counter, o->items[p]->actor, counter, actor) > 0)
        p++;
    elem *e = xmalloc(sizeof *e);
    if (!e)
        return CAIRN_ENOMEM;
    e->counter = counter;
    e->actor = actor;
    int rc = vop_make(&e->vs.one, counter, actor, action, v, NULL);
    if (rc) {
        free(e);
        return rc;
    }
    e->vs.n = 1; /* after |one|, which it overlays */
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 4;
        elem **ni = xrealloc(o->items, cap * sizeof *ni);
        if (!ni) {
            vs_free(&e->vs);
            free(e);
            return CAIRN_ENOMEM;
        }
        o->items = ni;
        o->cap = cap;
    }
    obj *no = NULL;
    rc = obj_prepare(d, &no, action, counter, actor);
    if (rc) {
        vs_free(&e->vs);
        free(e);
        return rc;
    }
    memmove(&o->items[p + 1], &o->items[p], (o->n - p) * sizeof *o->items);
    o->items[p] = e;
    o->n++;
    o->nvis++;
    if (d->local) {
        undo *u = &d->undo[d->nundo++];
        memset(u, 0, sizeof *u);
        u->what = U_INSERT;
        u->o = o;
        u->e = e;
    }
    obj_commit(d, no);
    cairn_patch pt;
    memset(&pt, 0, sizeof pt);
    winner_patch(&pt, NULL, &e->vs, 1);
    pt.obj.counter = o->counter;
    pt.obj.actor = o->actor;
    pt.index = visible_before(o, p);
    emit(d, &pt);
    return 0;
}

static int apply_list_elem(cairn_doc *d, obj *o, cairn_opid target, uint64_t counter,
                           uint32_t actor, uint8_t action, const cairn_value *v,
                           const cairn_opid *pred, uint32_t npred)
{
    ptrdiff_t at = list_find(o, target.counter, target.actor);
    if (at < 0)
        return CAIRN_ENOTFOUND;
    elem *e = o->items[at];
    int inc = action == CAIRN_OP_INC;
    vop add;
    int adds = action != CAIRN_OP_DEL && !inc;
    int rc;
    if (adds && (rc = vop_make(&add, counter, actor, action, v, NULL)) != 0)
        return rc;
    vset out;
    rc = vs_compute(d, &out, &e->vs, adds ? &add : NULL, pred, npred, inc, inc ? v->v.i : 0);
    if (rc) {
        if (adds)
            vop_unref(&add);
        return rc;
    }
    obj *no = NULL;
    if ((rc = obj_prepare(d, &no, action, counter, actor)) != 0) {
        vs_free(&out);
        return rc;
    }
    vop before;
    int had = e->vs.n > 0;
    if (had)
        before = vs_ops(&e->vs)[0];
    if (d->local) {
        undo *u = &d->undo[d->nundo++];
        memset(u, 0, sizeof *u);
        u->what = U_ELEM;
        u->o = o;
        u->e = e;
        u->saved = e->vs;
    } else {
        vs_free(&e->vs);
    }
    e->vs = out;
    o->nvis += (size_t)(out.n > 0) - (size_t)had;
    obj_commit(d, no);
    cairn_patch pt;
    memset(&pt, 0, sizeof pt);
    if (winner_patch(&pt, had ? &before : NULL, &out, 1)) {
        pt.obj.counter = o->counter;
        pt.obj.actor = o->actor;
        pt.index = visible_before(o, (size_t)at);
        emit(d, &pt);
    }
    return 0;
}

/* Applies |op| (document indices) as op id (counter, actor). */
int apply_op(cairn_doc *d, const cairn_op *op, uint64_t counter, uint32_t actor)
{
    obj *o = find_obj(d, op->obj);
    if (!o)
        return CAIRN_ENOOBJ;
    if (o->type == CAIRN_OBJ_MAP)
        return apply_map(d, o, op->key, op->key_len, counter, actor, op->action, &op->value,
                         op->pred, op->npred);
    if (op->insert)
        return apply_list_insert(d, o, op->elem, counter, actor, op->action, &op->value);
    return apply_list_elem(d, o, op->elem, counter, actor, op->action, &op->value, op->pred,
                           op->npred);
}

/* ---- lifecycle ------------------------------------------------------------------ */

int cairn_doc_new(cairn_doc **out, const cairn_actor *actor)
{
    *out = NULL;
    if (!actor)
        return CAIRN_EINVAL;
    if (sodium_init() < 0)
        return CAIRN_ENOMEM;
    cairn_doc *d = xcalloc(1, sizeof *d);
    if (!d)
        return CAIRN_ENOMEM;
    randombytes_buf(d->hkey, sizeof d->hkey);
    d->root.type = CAIRN_OBJ_MAP;
    uint32_t idx;
    int rc = cairn_dag_new(&d->dag);
    if (rc == 0)
        rc = actor_intern(d, actor, &idx);
    if (rc) {
        cairn_doc_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void drop_last_commit(cairn_doc *d)
{
    cairn_change_free(d->last_commit);
    d->last_commit = NULL;
}

void pending_clear(cairn_doc *d)
{
    for (size_t i = 0; i < d->npops; i++) {
        free(d->pops[i].buf);
        free(d->pops[i].op.pred);
    }
    d->npops = 0;
    d->nundo = 0;
    d->npp = 0;
    d->in_edit = 0;
}

void cairn_doc_free(cairn_doc *d)
{
    if (!d)
        return;
    if (d->in_edit)
        cairn_doc_rollback(d);
    obj *o;
    for (size_t i = 0; (o = cairn_htab_each(&d->objs, &i));) {
        obj_clear(o);
        free(o);
    }
    cairn_htab_destroy(&d->objs);
    obj_clear(&d->root);
    free(d->pops);
    free(d->undo);
    free(d->pp);
    free(d->tpred);
    free(d->actors);
    free(d->actor_max);
    for (uint32_t i = 0; i < d->nactors; i++)
        free(d->runs[i].v);
    free(d->runs);
    free(d->cc);
    free(d->aslots);
    cairn_change_free(d->last_commit);
    cairn_dag_free(d->dag);
    free(d);
}

const cairn_dag *cairn_doc_dag(const cairn_doc *doc)
{
    return doc->dag;
}

int cairn_doc_set_loader(cairn_doc *doc, cairn_dag_load_cb fn, void *arg)
{
    return cairn_dag_set_loader(doc->dag, fn, arg);
}

const cairn_actor *cairn_doc_actor(const cairn_doc *doc)
{
    return &doc->actors[0];
}

int cairn_doc_actor_of(const cairn_doc *doc, cairn_actor *out, cairn_opid id)
{
    if (id.actor >= doc->nactors) {
        memset(out, 0, sizeof *out);
        return CAIRN_EINVAL;
    }
    *out = doc->actors[id.actor];
    return 0;
}
