/*
 * Reads of the document (get, get_all, list_get, length, map_foreach) and
 * the heap accounting for tests and benchmarks. Values handed out are
 * borrowed from the document's state (doc.h).
 */
#include "crdt/doc.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define CAIRN_DOC_IMPL
#include "crdt/doc_int.h"
#include "crdt/error.h"

/* ---- reads --------------------------------------------------------------------- */

static const obj *read_obj(const cairn_doc *d, cairn_objid id, int type, int *rc)
{
    const obj *o = NULL;
    if (id.counter == 0 || id.actor < d->nactors)
        o = cairn_doc_find_obj_(d, id.counter, id.actor);
    *rc = !o ? CAIRN_ENOOBJ : (type && o->type != type) ? CAIRN_EINVAL : 0;
    return *rc ? NULL : o;
}

int cairn_doc_get(const cairn_doc *doc, cairn_read *out, cairn_objid obj_id, const uint8_t *key,
                  size_t key_len)
{
    size_t n;
    return cairn_doc_get_all(doc, out, 1, &n, obj_id, key, key_len);
}

int cairn_doc_get_all(const cairn_doc *doc, cairn_read *out, size_t cap, size_t *n,
                      cairn_objid obj_id, const uint8_t *key, size_t key_len)
{
    *n = 0;
    if (cap)
        memset(out, 0, sizeof *out);
    int rc;
    const obj *o = read_obj(doc, obj_id, CAIRN_OBJ_MAP, &rc);
    if (!o)
        return rc;
    if (key_len > UINT32_MAX || (!key && key_len))
        return CAIRN_EINVAL;
    const mkey *r = map_lookup(o, key, (uint32_t)key_len, hash_bytes(doc, key, key_len));
    if (!r)
        return 0;
    const vop *v = vs_ops(&r->vs);
    for (size_t i = 0; i < r->vs.n && i < cap; i++)
        read_of(&out[i], &v[i]);
    *n = r->vs.n;
    return 0;
}

int cairn_doc_list_get(const cairn_doc *doc, cairn_read *out, cairn_objid obj_id, size_t index)
{
    memset(out, 0, sizeof *out);
    int rc;
    const obj *o = read_obj(doc, obj_id, CAIRN_OBJ_LIST, &rc);
    if (!o)
        return rc;
    ptrdiff_t at = list_pos(o, index);
    if (at < 0)
        return CAIRN_ENOTFOUND;
    read_of(out, &vs_ops(&o->items[at]->vs)[0]);
    return 0;
}

int cairn_doc_length(const cairn_doc *doc, size_t *n, cairn_objid obj_id)
{
    *n = 0;
    int rc;
    const obj *o = read_obj(doc, obj_id, 0, &rc);
    if (!o)
        return rc;
    *n = o->nvis;
    return 0;
}

int cairn_doc_map_foreach(const cairn_doc *doc, cairn_objid obj_id, cairn_doc_key_cb cb, void *arg)
{
    int rc;
    const obj *o = read_obj(doc, obj_id, CAIRN_OBJ_MAP, &rc);
    if (!o)
        return rc;
    const mkey *r;
    for (size_t i = 0; (r = cairn_htab_each(&o->keys, &i));) {
        if (r->vs.n == 0)
            continue;
        cairn_read rd;
        read_of(&rd, &vs_ops(&r->vs)[0]);
        if ((rc = cb(arg, r->key, r->key_len, &rd)) != 0)
            return rc;
    }
    return 0;
}

/* ---- accounting ----------------------------------------------------------- */

static double vs_bytes(const vset *s)
{
    double b = 0;
    const vop *v = vs_ops(s);
    for (uint32_t i = 0; i < s->n; i++)
        if (vop_has_bytes(&v[i]))
            b += (double)malloc_usable_size(vop_bytes(&v[i])) / vop_bytes(&v[i])->refs;
    if (s->n >= 2)
        b += (double)malloc_usable_size(s->many);
    return b;
}

static double obj_bytes(const obj *o)
{
    double b = (double)malloc_usable_size(o->keys.slots) + (double)malloc_usable_size(o->keys.old) +
               (double)malloc_usable_size(o->items);
    const mkey *r;
    for (size_t i = 0; (r = cairn_htab_each(&o->keys, &i));)
        b += (double)malloc_usable_size((void *)r) + vs_bytes(&r->vs);
    for (size_t i = 0; i < o->n; i++)
        b += (double)malloc_usable_size(o->items[i]) + vs_bytes(&o->items[i]->vs);
    return b;
}

size_t cairn_doc_state_bytes_(const cairn_doc *d)
{
    double b = (double)malloc_usable_size((void *)d) + obj_bytes(&d->root) +
               (double)malloc_usable_size(d->objs.slots) + (double)malloc_usable_size(d->objs.old);
    const obj *o;
    for (size_t i = 0; (o = cairn_htab_each(&d->objs, &i));)
        b += (double)malloc_usable_size((void *)o) + obj_bytes(o);
    b += (double)malloc_usable_size(d->actors) + (double)malloc_usable_size(d->actor_max) +
         (double)malloc_usable_size(d->aslots);
    return (size_t)(b + 0.5);
}
