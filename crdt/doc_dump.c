/*
 * The document's canonical dump and its reads at past heads.
 *
 * cairn_doc_dump writes the visible state from the root down, in an order
 * that depends only on the state: map keys sorted by bytes (shorter first on
 * a common prefix), list elements in RGA order, the visible ops of a key
 * greatest op id first, and actors as their 16 bytes rather than indices.
 * Two replicas that applied the same changes, in any causal order, produce
 * identical bytes; the convergence tests and the fuzzer compare them.
 *
 *   object  'M' u64 nkeys, then per key: u32 key_len, key, vset
 *           'L' u64 nvisible, then per visible element: id, vset
 *   vset    u32 n, then n ops: id, kind (1 scalar, 2 map, 3 list), then
 *           scalar: vtype, payload | map/list: the object
 *   id      u64 counter, 16-byte actor
 *   payload NULL none, BOOL 1 byte, INT/COUNTER/UINT/F64 8 bytes,
 *           BYTES/STR u32 len + bytes           (all integers little-endian)
 *
 * cairn_doc_new_at replays, into a fresh document, the ancestors of the
 * given heads in this document's apply order (a topological order), loading
 * each change from the DAG (memory or its loader, hash-verified) and decoding
 * it again.
 */
#include <stdlib.h>
#include <string.h>

#define CAIRN_DOC_IMPL
#include "crdt/doc_int.h"
#include "crdt/error.h"

#define DUMP_MAX_DEPTH 1000 /* recursion; far beyond any real nesting */

typedef struct out {
    uint8_t *p;
    size_t len, cap;
    int err;
} out;

static void put(out *o, const void *b, size_t n)
{
    if (o->err)
        return;
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->len + n)
            cap *= 2;
        uint8_t *np = realloc(o->p, cap);
        if (!np) {
            o->err = CAIRN_ENOMEM;
            return;
        }
        o->p = np;
        o->cap = cap;
    }
    if (n)
        memcpy(o->p + o->len, b, n);
    o->len += n;
}

static void put_u64(out *o, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put(o, b, 8);
}

static void put_u32(out *o, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put(o, b, 4);
}

static void put_u8(out *o, uint8_t v)
{
    put(o, &v, 1);
}

static void put_id(out *o, const cairn_doc *d, uint64_t counter, uint32_t actor)
{
    put_u64(o, counter);
    put(o, d->actors[actor].b, CAIRN_ACTOR_LEN);
}

static void dump_obj(out *o, const cairn_doc *d, const obj *ob, int depth);

static void dump_vset(out *o, const cairn_doc *d, const vset *s, int depth)
{
    const vop *v = vs_ops(s);
    put_u32(o, s->n);
    for (uint32_t i = 0; i < s->n; i++) {
        put_id(o, d, v[i].counter, v[i].actor);
        put_u8(o, v[i].kind);
        if (v[i].kind != VK_SCALAR) {
            const obj *child = cairn_doc_find_obj_(d, v[i].counter, v[i].actor);
            if (!child) {
                o->err = CAIRN_ECORRUPT; /* every object made stays addressable */
                return;
            }
            dump_obj(o, d, child, depth + 1);
            continue;
        }
        put_u8(o, v[i].vtype);
        switch (v[i].vtype) {
        case CAIRN_V_BOOL:
            put_u8(o, v[i].v.i != 0);
            break;
        case CAIRN_V_INT:
        case CAIRN_V_COUNTER:
        case CAIRN_V_UINT:
            put_u64(o, v[i].v.u);
            break;
        case CAIRN_V_F64: {
            uint64_t bits;
            memcpy(&bits, &v[i].v.f, 8);
            put_u64(o, bits);
            break;
        }
        case CAIRN_V_BYTES:
        case CAIRN_V_STR:
            put_u32(o, v[i].len);
            put(o, v[i].v.p, v[i].len);
            break;
        default:
            break;
        }
    }
}

static int cmp_keys(const void *a, const void *b)
{
    const mkey *x = *(const mkey *const *)a, *y = *(const mkey *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = n ? memcmp(x->key, y->key, n) : 0;
    if (c)
        return c;
    return x->key_len < y->key_len ? -1 : x->key_len > y->key_len;
}

static void dump_obj(out *o, const cairn_doc *d, const obj *ob, int depth)
{
    if (o->err)
        return;
    if (depth > DUMP_MAX_DEPTH) {
        o->err = CAIRN_ELIMIT;
        return;
    }
    if (ob->type == CAIRN_OBJ_LIST) {
        put_u8(o, 'L');
        put_u64(o, ob->nvis);
        for (size_t i = 0; i < ob->n; i++) {
            const elem *e = ob->items[i];
            if (e->vs.n == 0)
                continue;
            put_id(o, d, e->counter, e->actor);
            dump_vset(o, d, &e->vs, depth);
        }
        return;
    }
    const mkey **keys = malloc((ob->keys.count + 1) * sizeof *keys);
    if (!keys) {
        o->err = CAIRN_ENOMEM;
        return;
    }
    size_t n = 0;
    const mkey *r;
    for (size_t i = 0; (r = cairn_htab_each(&ob->keys, &i));)
        keys[n++] = r;
    qsort(keys, n, sizeof *keys, cmp_keys);
    put_u8(o, 'M');
    put_u64(o, n);
    for (size_t i = 0; i < n; i++) {
        put_u32(o, keys[i]->key_len);
        put(o, keys[i]->key, keys[i]->key_len);
        dump_vset(o, d, &keys[i]->vs, depth);
    }
    free(keys);
}

int cairn_doc_dump(uint8_t **outp, size_t *len, const cairn_doc *doc)
{
    *outp = NULL;
    *len = 0;
    out o = {0};
    dump_obj(&o, doc, &doc->root, 0);
    if (o.err) {
        free(o.p);
        return o.err;
    }
    *outp = o.p;
    *len = o.len;
    return 0;
}

int cairn_doc_new_at(cairn_doc **outp, const cairn_doc *doc, const cairn_hash *heads, size_t nheads)
{
    *outp = NULL;
    uint64_t *idx = NULL;
    size_t n = 0;
    int rc;
    if (nheads && (rc = cairn_dag_ancestors(&idx, &n, doc->dag, heads, nheads)) != 0)
        return rc;
    cairn_doc *nd;
    if ((rc = cairn_doc_new(&nd, &doc->actors[0])) != 0)
        goto out;
    for (size_t i = 0; i < n && !rc; i++) {
        cairn_change *copy;
        rc = cairn_dag_load(&copy, doc->dag, idx[i]);
        if (!rc)
            rc = cairn_doc_receive_(nd, copy, NULL);
    }
    if (rc) {
        cairn_doc_free(nd);
        goto out;
    }
    nd->readonly = 1;
    *outp = nd;
out:
    free(idx);
    return rc;
}
