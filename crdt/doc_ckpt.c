/*
 * Checkpoints: the whole replica (DAG and document state) as one buffer, and
 * a replica rebuilt from one without applying a single op. A restart that
 * would replay a million changes through cairn_doc_receive instead reads the
 * checkpoint of its first N changes and replays only the rest. The store
 * keeps the changes as the truth; a checkpoint is a cache of what replaying
 * them gives, so it holds exactly the state (visible ops, counters, list
 * tombstones, every object ever made, the clocks) and nothing derived that
 * is cheaper to rebuild (hash tables, heads, visible counts).
 *
 *   "CKPT" u8 version (2)
 *   DAG section (dag.c: hashes, deps, authors' seqs)
 *   uv nactors (>= 1), nactors x 16 B actor (the writer's index order;
 *      [0] is the writer), nactors x uv greatest op counter applied
 *   nactors x run: uv n, then n x (uv apply index, uv last op counter) of
 *      the actor's ordered changes that have ops, in order; each pair after
 *      the first as deltas (>= 1) from the one before, within the actor's
 *      clock (doc_int.h's arun; receive validation needs it)
 *   uv max_counter
 *   map  root
 *   uv nobjs, then nobjs x (id, u8 type (1 map, 2 list), map | list),
 *      ascending by op id (counter, then actor bytes)
 *
 *   map     uv nkeys, then nkeys x (uv key_len, key, vset with n >= 1),
 *           in the writer's table order (not sorted: sorting a million keys
 *           would cost more than the whole load; duplicates are rejected)
 *   list    uv nelems, then in RGA order, tombstones included, nelems x
 *           (id, vset with n >= 0)
 *   vset    uv n, then n ops strictly descending by op id: id, u8 kind
 *           (1 scalar, 2 map, 3 list); scalar: u8 vtype, payload
 *   payload NULL nothing, BOOL u8 0/1, INT/UINT/F64/COUNTER 8 B little-endian,
 *           BYTES/STR uv len + bytes
 *   id      uv counter (>= 1), uv actor index (< nactors)
 *
 * Canonical where it is cheap: minimal varints, bools 0/1, sorted objects,
 * vsets and authors, no trailing bytes. The loader checks everything that
 * the document's code relies on (indices in range, op ids within their
 * author's clock, references to objects of the right kind that form trees,
 * no duplicate keys or hashes, counts bounded by the bytes left before
 * anything is allocated for them), so hostile bytes give an error, never a
 * crash. It cannot check that the state is the one the DAG's changes
 * produce: the changes are not in the checkpoint.
 *
 * A restored record holds its value the way a settled record of a replayed
 * document does: a single bytes value inline in the record's allocation,
 * several in their own buffers. Speed (a million keys in about a quarter
 * of a second, see crdt_bench checkpoint): tables are sized from the counts
 * up front, so nothing rehashes; slots are hashed some keys ahead and
 * prefetched; probing for duplicates compares a few hash bits kept in the
 * slot pointers while loading instead of touching other records; the big
 * arrays ask for huge pages.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define CAIRN_DOC_IMPL
#include "crdt/doc_int.h"
#include "crdt/error.h"
#include "crdt/wire.h"

#define CKPT_VERSION 2
#define MIN_OP_BYTES 3  /* counter, actor, kind */
#define MIN_KEY_BYTES 5 /* key_len, a one-op vset */
#define MIN_OBJ_BYTES 4 /* id, type, an empty body */

static const uint8_t magic[4] = {'C', 'K', 'P', 'T'};

/* ---- writing ---------------------------------------------------------- */

static void put_u64le(wire_wr *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    wire_bytes_w(w, b, 8);
}

static void save_vset(wire_wr *w, const vset *s)
{
    const vop *v = vs_ops(s);
    wire_uv_w(w, s->n);
    for (uint32_t i = 0; i < s->n; i++) {
        wire_uv_w(w, v[i].counter);
        wire_uv_w(w, v[i].actor);
        wire_u8_w(w, v[i].kind);
        if (v[i].kind != VK_SCALAR)
            continue;
        wire_u8_w(w, v[i].vtype);
        switch (v[i].vtype) {
        case CAIRN_V_BOOL:
            wire_u8_w(w, v[i].v.i != 0);
            break;
        case CAIRN_V_INT:
        case CAIRN_V_UINT:
        case CAIRN_V_F64:
        case CAIRN_V_COUNTER:
            put_u64le(w, v[i].v.u);
            break;
        case CAIRN_V_BYTES:
        case CAIRN_V_STR:
            wire_uv_w(w, v[i].len);
            wire_bytes_w(w, v[i].v.p, v[i].len);
            break;
        default:
            break;
        }
    }
}

static void save_obj(wire_wr *w, const obj *o)
{
    if (o->type == CAIRN_OBJ_LIST) {
        wire_uv_w(w, o->n);
        for (size_t i = 0; i < o->n; i++) {
            wire_uv_w(w, o->items[i]->counter);
            wire_uv_w(w, o->items[i]->actor);
            save_vset(w, &o->items[i]->vs);
        }
        return;
    }
    wire_uv_w(w, o->keys.count);
    const mkey *r;
    for (size_t i = 0; !w->err && (r = cairn_htab_each(&o->keys, &i));) {
        wire_uv_w(w, r->key_len);
        wire_bytes_w(w, r->key, r->key_len);
        save_vset(w, &r->vs);
    }
}

/* An object with its id in bytes, for sorting without the document. */
typedef struct objkey {
    uint64_t counter;
    cairn_actor actor;
    const obj *o;
} objkey;

static int cmp_objkey(const void *a, const void *b)
{
    const objkey *x = a, *y = b;
    if (x->counter != y->counter)
        return x->counter < y->counter ? -1 : 1;
    return cairn_actor_cmp(&x->actor, &y->actor);
}

int cairn_doc_checkpoint(uint8_t **out, size_t *len, const cairn_doc *doc)
{
    *out = NULL;
    *len = 0;
    if (doc->broken)
        return doc->broken;
    if (doc->in_edit)
        return CAIRN_ESTATE;
    objkey *objs = malloc(((size_t)doc->objs.count + 1) * sizeof *objs);
    if (!objs)
        return CAIRN_ENOMEM;
    size_t nobjs = 0;
    const obj *o;
    for (size_t i = 0; (o = cairn_htab_each(&doc->objs, &i));)
        objs[nobjs++] = (objkey){o->counter, doc->actors[o->actor], o};
    qsort(objs, nobjs, sizeof *objs, cmp_objkey);

    wire_wr w = {0};
    /* About 64 bytes per change for DAG and a small key: one realloc at most. */
    wire_reserve(&w, (size_t)cairn_dag_count(doc->dag) * 64 + 4096);
    wire_bytes_w(&w, magic, sizeof magic);
    wire_u8_w(&w, CKPT_VERSION);
    cairn_dag_save_(&w, doc->dag);
    wire_uv_w(&w, doc->nactors);
    wire_bytes_w(&w, doc->actors, (size_t)doc->nactors * sizeof *doc->actors);
    for (uint32_t i = 0; i < doc->nactors; i++)
        wire_uv_w(&w, doc->actor_max[i]);
    for (uint32_t i = 0; i < doc->nactors; i++) {
        const arun *r = &doc->runs[i];
        wire_uv_w(&w, r->n);
        aspan prev = {0, 0};
        for (size_t k = 0; k < r->n; k++) {
            wire_uv_w(&w, k ? r->v[k].index - prev.index : r->v[k].index);
            wire_uv_w(&w, r->v[k].end - prev.end);
            prev = r->v[k];
        }
    }
    wire_uv_w(&w, doc->max_counter);
    save_obj(&w, &doc->root);
    wire_uv_w(&w, nobjs);
    for (size_t i = 0; i < nobjs; i++) {
        wire_uv_w(&w, objs[i].counter);
        wire_uv_w(&w, objs[i].o->actor);
        wire_u8_w(&w, objs[i].o->type);
        save_obj(&w, objs[i].o);
    }
    free(objs);
    if (w.err) {
        free(w.p);
        return w.err;
    }
    uint8_t *shrunk = realloc(w.p, w.len ? w.len : 1);
    *out = shrunk ? shrunk : w.p;
    *len = w.len;
    return 0;
}

/* ---- reading ---------------------------------------------------------- */

/* An object reference found in a vset (of object |parent|), checked once
 * every object is read. */
typedef struct oref {
    uint64_t counter;
    uint32_t actor;
    uint8_t kind;
    const obj *parent;
} oref;

typedef struct loader {
    cairn_doc *d;
    wire_rd r;
    uint32_t *perm;   /* checkpoint actor index -> document index */
    uint32_t nactors; /* in the checkpoint */
    vop *ops;         /* the vset being read; bytes point into the input */
    size_t ops_cap;
    oref *refs;
    size_t nrefs, refs_cap;
    const obj *cur; /* the object being read */
} loader;

static int read_u64le(wire_rd *r, uint64_t *v)
{
    const uint8_t *b;
    int rc = wire_take(r, &b, 8);
    if (rc)
        return rc;
    *v = 0;
    for (int i = 7; i >= 0; i--)
        *v = *v << 8 | b[i];
    return 0;
}

/* An op id in document indices, within its author's clock. */
static int read_id(loader *l, uint64_t *counter, uint32_t *actor)
{
    uint64_t c, a;
    int rc = wire_uv(&l->r, &c);
    if (!rc)
        rc = wire_uv(&l->r, &a);
    if (rc)
        return rc;
    if (c == 0 || a >= l->nactors)
        return CAIRN_ECORRUPT;
    *actor = l->perm[a];
    if (c > l->d->actor_max[*actor])
        return CAIRN_ECORRUPT; /* an op its author never made */
    *counter = c;
    return 0;
}

/* Reads a vset's ops into l->ops (bytes values still pointing into the
 * input); *n of them. */
static int read_ops(loader *l, uint32_t *n, int need_one)
{
    uint64_t k;
    int rc = wire_count(&l->r, &k, UINT32_MAX, MIN_OP_BYTES);
    if (rc)
        return rc;
    if (need_one && k == 0)
        return CAIRN_ECORRUPT; /* a map key is in its table only while visible */
    if ((rc = cairn_doc_grow_((void **)&l->ops, &l->ops_cap, (size_t)k, sizeof *l->ops)))
        return rc;
    for (uint64_t i = 0; i < k; i++) {
        vop *o = &l->ops[i];
        memset(o, 0, sizeof *o);
        uint8_t kind, vt = 0, b;
        if ((rc = read_id(l, &o->counter, &o->actor)) || (rc = wire_u8(&l->r, &kind)))
            return rc;
        if (i && cairn_doc_opcmp_(l->d, o[-1].counter, o[-1].actor, o->counter, o->actor) <= 0)
            return CAIRN_EUNSORTED;
        if (kind < VK_SCALAR || kind > VK_LIST)
            return CAIRN_ECORRUPT;
        o->kind = kind;
        if (kind != VK_SCALAR) {
            if ((rc = cairn_doc_grow_((void **)&l->refs, &l->refs_cap, l->nrefs + 1,
                                      sizeof *l->refs)))
                return rc;
            l->refs[l->nrefs++] = (oref){o->counter, o->actor, kind, l->cur};
            continue;
        }
        if ((rc = wire_u8(&l->r, &vt)))
            return rc;
        o->vtype = vt;
        switch (vt) {
        case CAIRN_V_NULL:
            break;
        case CAIRN_V_BOOL:
            if ((rc = wire_u8(&l->r, &b)))
                return rc;
            if (b > 1)
                return CAIRN_ENONCANON;
            o->v.i = b;
            break;
        case CAIRN_V_INT:
        case CAIRN_V_UINT:
        case CAIRN_V_F64:
        case CAIRN_V_COUNTER:
            if ((rc = read_u64le(&l->r, &o->v.u)))
                return rc;
            break;
        case CAIRN_V_BYTES:
        case CAIRN_V_STR: {
            uint64_t len;
            if ((rc = wire_uv(&l->r, &len)))
                return rc;
            if (len > CAIRN_CHANGE_MAX_BYTES)
                return CAIRN_ELIMIT;
            if ((rc = wire_take(&l->r, &o->v.p, (size_t)len)))
                return rc;
            o->len = (uint32_t)len;
            if (!len)
                o->v.p = (const uint8_t *)"";
            break;
        }
        default:
            return CAIRN_ECORRUPT;
        }
    }
    *n = (uint32_t)k;
    return 0;
}

/* Copies every bytes value of |v| still pointing into the input into a
 * vbytes of its own. On failure the copies made so far are freed. */
static int own_bytes(vop *v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (!vop_has_bytes(&v[i]))
            continue;
        vbytes *b = malloc(sizeof *b + v[i].len);
        if (!b) {
            for (uint32_t j = 0; j < i; j++)
                if (vop_has_bytes(&v[j]))
                    free(vop_bytes(&v[j]));
            return CAIRN_ENOMEM;
        }
        b->refs = 1;
        memcpy(b->b, v[i].v.p, v[i].len);
        v[i].v.p = b->b;
    }
    return 0;
}

/* Makes |s| from the n ops in l->ops (owning copies of their bytes). */
static int make_vset(loader *l, vset *s, uint32_t n)
{
    memset(s, 0, sizeof *s);
    if (n == 0)
        return 0;
    if (n == 1) {
        s->one = l->ops[0];
        int rc = own_bytes(&s->one, 1);
        s->n = rc ? 0 : 1;
        return rc;
    }
    vop *many = malloc((size_t)n * sizeof *many);
    if (!many)
        return CAIRN_ENOMEM;
    memcpy(many, l->ops, (size_t)n * sizeof *many);
    int rc = own_bytes(many, n);
    if (rc) {
        free(many);
        return rc;
    }
    s->many = many;
    s->n = n; /* after |many|, which it overlays */
    return 0;
}

/* Reads one key into a new record (*out) and its hash. */
static int read_key(loader *l, mkey **out, uint32_t *hash)
{
    uint64_t klen;
    const uint8_t *key;
    uint32_t n;
    int rc = wire_uv(&l->r, &klen);
    if (rc)
        return rc;
    if (klen > CAIRN_CHANGE_MAX_BYTES)
        return CAIRN_ELIMIT;
    if ((rc = wire_take(&l->r, &key, (size_t)klen)) || (rc = read_ops(l, &n, 1)))
        return rc;
    /* One bytes value lives in the record, as a settled record keeps it. */
    const vop *v0 = &l->ops[0];
    int inl = n == 1 && vop_has_bytes(v0);
    size_t vlen = inl ? v0->len : 0;
    mkey *rec = malloc(offsetof(mkey, key) + (size_t)klen + vlen);
    if (!rec)
        return CAIRN_ENOMEM;
    rec->key_len = (uint32_t)klen;
    rec->tail = inl;
    rec->in_undo = 0;
    if (klen)
        memcpy(rec->key, key, (size_t)klen);
    if (inl) {
        memset(&rec->vs, 0, sizeof rec->vs);
        rec->vs.one = *v0;
        memcpy(rec->key + klen, v0->v.p, vlen);
        rec->vs.one.v.p = rec->key + klen;
        rec->vs.one.flags = VF_INLINE;
        rec->vs.n = 1;
    } else if ((rc = make_vset(l, &rec->vs, n))) {
        free(rec);
        return rc;
    }
    *out = rec;
    *hash = cairn_doc_hash_bytes_(l->d, key, (size_t)klen);
    return 0;
}

/* While a map loads, its slots carry a few bits of their record's hash in
 * the low bits of the pointer (malloc aligns to max_align_t, so they are
 * zero): a probe touches another record only when those bits match, and a
 * table of a million keys is far bigger than the cache. They are cleared
 * before anything else sees the table. */
#define TAG_MASK ((uintptr_t) _Alignof(max_align_t) - 1)

static uintptr_t tag_of(uint32_t h)
{
    return (uintptr_t)(h >> 28) & TAG_MASK; /* bits a slot index rarely uses */
}

/* Puts |rec| (hash |h|) into a table presized for every key, unless its key
 * is there already. The table was empty, so it has no old array. */
static int put_key(ptab *t, mkey *rec, uint32_t h)
{
    uint32_t mask = t->cap - 1, i = h & mask;
    uintptr_t tag = tag_of(h);
    for (; t->slots[i]; i = (i + 1) & mask) {
        uintptr_t s = (uintptr_t)t->slots[i];
        if ((s & TAG_MASK) != tag)
            continue;
        const mkey *o = (const mkey *)(s & ~TAG_MASK);
        if (o->key_len == rec->key_len && memcmp(o->key, rec->key, rec->key_len) == 0)
            return CAIRN_EDUPLICATE;
    }
    t->slots[i] = (void *)((uintptr_t)rec | tag);
    t->count++;
    return 0;
}

/* Keys are read LAG ahead of their insertion and their slots prefetched. */
#define LAG 16

static int load_map(loader *l, obj *o)
{
    uint64_t nkeys;
    int rc = wire_count(&l->r, &nkeys, UINT32_MAX / 2, MIN_KEY_BYTES);
    if (rc || (rc = cairn_doc_ptab_reserve_(l->d, &o->keys, (uint32_t)nkeys)))
        return rc;
    wire_huge(o->keys.slots, (size_t)o->keys.cap * sizeof *o->keys.slots);
    mkey *ring[LAG];
    uint32_t rh[LAG], mask = o->keys.cap - 1;
    uint64_t nread = 0, done = 0;
    while (done < nkeys) {
        if (nread < nkeys && nread - done < LAG) {
            uint64_t k = nread % LAG;
            if ((rc = read_key(l, &ring[k], &rh[k])))
                break;
            __builtin_prefetch(&o->keys.slots[rh[k] & mask], 1);
            nread++;
            continue;
        }
        uint64_t k = done % LAG;
        if ((rc = put_key(&o->keys, ring[k], rh[k])))
            break;
        done++;
    }
    /* Records read but not in the table are still this function's. */
    for (uint64_t i = done; rc && i < nread; i++) {
        cairn_doc_vs_free_(&ring[i % LAG]->vs);
        free(ring[i % LAG]);
    }
    for (uint32_t i = 0; i < o->keys.cap; i++)
        o->keys.slots[i] = (void *)((uintptr_t)o->keys.slots[i] & ~TAG_MASK);
    o->nvis = o->keys.count;
    return rc;
}

static int load_list(loader *l, obj *o)
{
    uint64_t n;
    int rc = wire_count(&l->r, &n, SIZE_MAX / sizeof(elem *), MIN_OP_BYTES);
    if (rc)
        return rc;
    if (n && !(o->items = malloc((size_t)n * sizeof *o->items)))
        return CAIRN_ENOMEM;
    o->cap = (size_t)n;
    for (uint64_t i = 0; i < n; i++) {
        elem *e = malloc(sizeof *e);
        if (!e)
            return CAIRN_ENOMEM;
        uint32_t k;
        if ((rc = read_id(l, &e->counter, &e->actor)) || (rc = read_ops(l, &k, 0)) ||
            (rc = make_vset(l, &e->vs, k))) {
            free(e);
            return rc;
        }
        o->items[o->n++] = e;
        o->nvis += k > 0;
    }
    return 0;
}

static int load_obj(loader *l, obj *o)
{
    l->cur = o;
    return o->type == CAIRN_OBJ_MAP ? load_map(l, o) : load_list(l, o);
}

static int load_actors(loader *l)
{
    cairn_doc *d = l->d;
    uint64_t n;
    const uint8_t *bytes;
    int rc = wire_count(&l->r, &n, UINT32_MAX / 4, CAIRN_ACTOR_LEN + 1);
    if (rc || (rc = wire_take(&l->r, &bytes, (size_t)n * CAIRN_ACTOR_LEN)))
        return rc;
    if (n == 0)
        return CAIRN_ECORRUPT; /* [0] is the writer */
    if (!(l->perm = malloc((size_t)n * sizeof *l->perm)))
        return CAIRN_ENOMEM;
    l->nactors = (uint32_t)n;
    /* The local actor is [0] already; the checkpoint's join in their order. */
    int local_seen = 0;
    for (uint64_t i = 0; i < n; i++) {
        cairn_actor a;
        memcpy(a.b, bytes + i * CAIRN_ACTOR_LEN, CAIRN_ACTOR_LEN);
        uint32_t before = d->nactors, idx;
        if ((rc = cairn_doc_actor_intern_(d, &a, &idx)))
            return rc;
        if (idx < before) {
            if (idx != 0 || local_seen)
                return CAIRN_EDUPLICATE;
            local_seen = 1;
        }
        l->perm[i] = idx;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t m;
        if ((rc = wire_uv(&l->r, &m)))
            return rc;
        if (m >= COUNTER_LIMIT)
            return CAIRN_ECORRUPT;
        d->actor_max[l->perm[i]] = m;
    }
    uint64_t norder = cairn_dag_count(d->dag);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t cnt;
        if ((rc = wire_count(&l->r, &cnt, norder, 2)))
            return rc;
        arun *run = &d->runs[l->perm[i]];
        if (cnt && !(run->v = malloc((size_t)cnt * sizeof *run->v)))
            return CAIRN_ENOMEM;
        run->cap = (size_t)cnt;
        aspan prev = {0, 0};
        for (uint64_t k = 0; k < cnt; k++) {
            uint64_t di, de;
            if ((rc = wire_uv(&l->r, &di)) || (rc = wire_uv(&l->r, &de)))
                return rc;
            if ((k && di == 0) || de == 0 || di >= norder - prev.index ||
                de >= COUNTER_LIMIT - prev.end)
                return CAIRN_ECORRUPT;
            prev = (aspan){prev.index + di, prev.end + de};
            run->v[run->n++] = prev;
        }
        if (prev.end > d->actor_max[l->perm[i]])
            return CAIRN_ECORRUPT; /* the run stays within the actor's clock */
    }
    if ((rc = wire_uv(&l->r, &d->max_counter)))
        return rc;
    if (d->max_counter >= COUNTER_LIMIT)
        return CAIRN_ECORRUPT;
    for (uint32_t i = 0; i < d->nactors; i++)
        if (d->actor_max[i] > d->max_counter)
            return CAIRN_ECORRUPT;
    return 0;
}

static int cmp_oref(const void *a, const void *b)
{
    const oref *x = a, *y = b;
    if (x->counter != y->counter)
        return x->counter < y->counter ? -1 : 1;
    return x->actor < y->actor ? -1 : x->actor > y->actor;
}

/* Objects form trees, as in a replayed document: each is referenced at most
 * once (by the visible op that made it), by an object of the right kind,
 * and following references upwards ends at the root or at an object nothing
 * references any more (overwritten), never in a loop. O(refs log refs). */
static int check_tree(loader *l)
{
    if (l->nrefs)
        qsort(l->refs, l->nrefs, sizeof *l->refs, cmp_oref);
    for (size_t i = 0; i < l->nrefs; i++) {
        const oref *x = &l->refs[i];
        const obj *o = cairn_doc_find_obj_(l->d, x->counter, x->actor);
        if (!o || o->type != (x->kind == VK_MAP ? CAIRN_OBJ_MAP : CAIRN_OBJ_LIST) ||
            (i && cmp_oref(&l->refs[i - 1], x) == 0))
            return CAIRN_ECORRUPT;
    }
    /* per reference: 0 unseen, 1 on the walk in progress, 2 leads out */
    uint8_t *st = calloc(l->nrefs + 1, 1);
    size_t *path = malloc((l->nrefs + 1) * sizeof *path);
    int rc = st && path ? 0 : CAIRN_ENOMEM;
    for (size_t i = 0; i < l->nrefs && !rc; i++) {
        size_t np = 0;
        for (size_t j = i; st[j] != 2;) {
            if (st[j] == 1) {
                rc = CAIRN_ECORRUPT; /* a loop */
                break;
            }
            st[j] = 1;
            path[np++] = j;
            const obj *p = l->refs[j].parent;
            oref key = {p->counter, p->actor, 0, NULL};
            const oref *up = p == &l->d->root
                                 ? NULL
                                 : bsearch(&key, l->refs, l->nrefs, sizeof *l->refs, cmp_oref);
            if (!up)
                break;
            j = (size_t)(up - l->refs);
        }
        while (np)
            st[path[--np]] = 2;
    }
    free(st);
    free(path);
    return rc;
}

static int load_objects(loader *l)
{
    cairn_doc *d = l->d;
    uint64_t n;
    int rc = wire_count(&l->r, &n, UINT32_MAX / 2, MIN_OBJ_BYTES);
    if (rc || (rc = cairn_doc_ptab_reserve_(d, &d->objs, (uint32_t)n)))
        return rc;
    const obj *prev = NULL;
    for (uint64_t i = 0; i < n; i++) {
        obj *o = calloc(1, sizeof *o);
        if (!o)
            return CAIRN_ENOMEM;
        uint8_t type;
        if ((rc = read_id(l, &o->counter, &o->actor)) || (rc = wire_u8(&l->r, &type))) {
            free(o);
            return rc;
        }
        if ((type != CAIRN_OBJ_MAP && type != CAIRN_OBJ_LIST) ||
            (prev && cairn_doc_opcmp_(d, prev->counter, prev->actor, o->counter, o->actor) >= 0)) {
            free(o);
            return type != CAIRN_OBJ_MAP && type != CAIRN_OBJ_LIST ? CAIRN_ECORRUPT
                                                                   : CAIRN_EUNSORTED;
        }
        o->type = type;
        o->hash = cairn_doc_hash_id_(d, o->counter, o->actor);
        /* In the table before its contents, so that the document frees it. */
        cairn_htab_put(&d->objs, o, o->hash, cairn_doc_obj_hash_, d);
        prev = o;
        if ((rc = load_obj(l, o)))
            return rc;
    }
    return check_tree(l);
}

int cairn_doc_from_checkpoint(cairn_doc **out, const uint8_t *bytes, size_t len,
                              const cairn_actor *actor)
{
    *out = NULL;
    if (!bytes && len)
        return CAIRN_EINVAL;
    loader l = {0};
    l.r = (wire_rd){bytes, bytes + len};
    const uint8_t *head;
    uint8_t version;
    int rc = wire_take(&l.r, &head, sizeof magic);
    if (rc)
        return rc;
    if (memcmp(head, magic, sizeof magic) != 0)
        return CAIRN_EBADVERSION;
    if ((rc = wire_u8(&l.r, &version)))
        return rc;
    if (version != CKPT_VERSION)
        return CAIRN_EBADVERSION;
    if ((rc = cairn_doc_new(&l.d, actor)))
        return rc;
    cairn_dag *dag;
    if ((rc = cairn_dag_restore_(&dag, &l.r)))
        goto fail;
    cairn_dag_free(l.d->dag);
    l.d->dag = dag;
    if ((rc = load_actors(&l)) || (rc = load_obj(&l, &l.d->root)) || (rc = load_objects(&l)))
        goto fail;
    if (l.r.p != l.r.end) {
        rc = CAIRN_ENONCANON; /* trailing bytes */
        goto fail;
    }
    *out = l.d;
    l.d = NULL;
fail:
    cairn_doc_free(l.d);
    free(l.perm);
    free(l.ops);
    free(l.refs);
    return rc;
}

/* ---- invariants ----------------------------------------------------------- */

static int vset_ok(const cairn_doc *d, const vset *s, const mkey *rec)
{
    const vop *v = vs_ops(s);
    for (uint32_t i = 0; i < s->n; i++) {
        const vop *o = &v[i];
        if (o->actor >= d->nactors || o->counter == 0 || o->counter > d->actor_max[o->actor])
            return 0;
        if (i && cairn_doc_opcmp_(d, v[i - 1].counter, v[i - 1].actor, o->counter, o->actor) <= 0)
            return 0;
        if (o->kind == VK_MAP || o->kind == VK_LIST) {
            const obj *c = cairn_doc_find_obj_(d, o->counter, o->actor);
            if (!c || c->type != (o->kind == VK_MAP ? CAIRN_OBJ_MAP : CAIRN_OBJ_LIST))
                return 0;
        } else if (o->kind != VK_SCALAR || o->vtype > CAIRN_V_COUNTER) {
            return 0;
        }
        if (o->flags & VF_INLINE) {
            const uint8_t *lo = rec ? rec->key + rec->key_len : NULL;
            if (!rec || !rec->tail || o->v.p != lo)
                return 0;
        } else if (vop_has_bytes(o) && vop_bytes(o)->refs != 1) {
            return 0; /* no edit in progress: one holder each */
        }
    }
    return 1;
}

static int obj_ok(const cairn_doc *d, const obj *o)
{
    size_t vis = 0;
    if (o->type == CAIRN_OBJ_LIST) {
        if (o->keys.count || o->n > o->cap)
            return 0;
        for (size_t i = 0; i < o->n; i++) {
            const elem *e = o->items[i];
            if (e->actor >= d->nactors || !vset_ok(d, &e->vs, NULL))
                return 0;
            vis += e->vs.n > 0;
        }
        return vis == o->nvis;
    }
    if (o->type != CAIRN_OBJ_MAP || o->n)
        return 0;
    const mkey *r;
    for (size_t i = 0; (r = cairn_htab_each(&o->keys, &i));) {
        vis++;
        if (r->vs.n == 0 || !vset_ok(d, &r->vs, r) ||
            cairn_doc_map_lookup_(o, r->key, r->key_len,
                                  cairn_doc_hash_bytes_(d, r->key, r->key_len)) != r)
            return 0;
    }
    return vis == o->keys.count && vis == o->nvis && (uint64_t)vis * 4 <= (uint64_t)o->keys.cap * 3;
}

int cairn_doc_check_(const cairn_doc *d)
{
    int rc = cairn_dag_check_(d->dag);
    if (rc)
        return rc;
    if (d->nactors == 0)
        return CAIRN_ECORRUPT;
    for (uint32_t i = 0; i < d->nactors; i++) {
        uint32_t x;
        if (!cairn_doc_actor_find_(d, &d->actors[i], &x) || x != i ||
            d->actor_max[i] > d->max_counter)
            return CAIRN_ECORRUPT;
        const arun *r = &d->runs[i];
        for (size_t k = 0; k < r->n; k++)
            if (r->v[k].index >= cairn_dag_count(d->dag) ||
                (k && (r->v[k].index <= r->v[k - 1].index || r->v[k].end <= r->v[k - 1].end)))
                return CAIRN_ECORRUPT;
        if (r->n && r->v[r->n - 1].end > d->actor_max[i])
            return CAIRN_ECORRUPT;
    }
    if (!obj_ok(d, &d->root))
        return CAIRN_ECORRUPT;
    uint32_t n = 0;
    const obj *o;
    for (size_t i = 0; (o = cairn_htab_each(&d->objs, &i));) {
        n++;
        if (o->counter == 0 || cairn_doc_find_obj_(d, o->counter, o->actor) != o ||
            o->hash != cairn_doc_hash_id_(d, o->counter, o->actor) || !obj_ok(d, o))
            return CAIRN_ECORRUPT;
    }
    return n == d->objs.count ? 0 : CAIRN_ECORRUPT;
}
