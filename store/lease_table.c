/*
 * The lease table: every lease id the document or the key index mentions,
 * derived only from applied changes on the observer path (local, merged or
 * replayed), so it is the same on every node that applied the same changes
 * and recovery rebuilds it by replay (or from a checkpoint's document and
 * index, through the same hooks). The table (id -> ttl, deadline) is re-read
 * from the document for every lease a change touched, and the per-lease key
 * sets follow the key index (a put with a lease attaches, a put without or
 * a delete detaches), so revoke and TimeToLive-with-keys cost O(keys of the
 * lease), not O(all keys). Two chained hash tables share the entries: by
 * lease id, and by the object id of the lease's map in the document.
 *
 * The only memory-only state is local_deadline (lease.c says why); the
 * restart rule that sets it at open lives here because it walks the table.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "store/store_int.h"

#define DEADLINE_MAX (INT64_MAX / 4) /* far beyond any now + TTL, no overflow */

static size_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

static size_t hash_obj(cairn_objid o)
{
    return hash_u64(o.counter * 31 + o.actor);
}

static int obj_eq(cairn_objid a, cairn_objid b)
{
    return a.counter == b.counter && a.actor == b.actor;
}

int cairn_lease_table_init(lease_table *t, int64_t min_ttl, int64_t restart_extend_ms)
{
    memset(t, 0, sizeof *t);
    t->nb = 64;
    t->by_id = calloc(t->nb, sizeof *t->by_id);
    t->by_obj = calloc(t->nb, sizeof *t->by_obj);
    if (!t->by_id || !t->by_obj)
        return CAIRN_ENOMEM;
    t->min_ttl = min_ttl;
    t->restart_extend_ms = restart_extend_ms;
    return 0;
}

void cairn_lease_table_destroy(lease_table *t)
{
    for (size_t i = 0; t->by_id && i < t->nb; i++) {
        lease_ent *l = t->by_id[i];
        while (l) {
            lease_ent *n = l->next_id;
            free(l->keys);
            free(l);
            l = n;
        }
    }
    free(t->by_id);
    free(t->by_obj);
    free(t->touched);
    memset(t, 0, sizeof *t);
}

lease_ent *cairn_lease_find(const lease_table *t, int64_t id)
{
    lease_ent *l = t->by_id[hash_u64((uint64_t)id) & (t->nb - 1)];
    while (l && l->id != id)
        l = l->next_id;
    return l;
}

static lease_ent *find_obj(const lease_table *t, cairn_objid o)
{
    lease_ent *l = t->by_obj[hash_obj(o) & (t->nb - 1)];
    while (l && !obj_eq(l->obj, o))
        l = l->next_obj;
    return l;
}

static void obj_unlink(lease_table *t, lease_ent *l)
{
    if (!l->in_obj)
        return;
    lease_ent **pp = &t->by_obj[hash_obj(l->obj) & (t->nb - 1)];
    while (*pp != l)
        pp = &(*pp)->next_obj;
    *pp = l->next_obj;
    l->in_obj = 0;
}

static void obj_link(lease_table *t, lease_ent *l, cairn_objid o)
{
    if (l->in_obj && obj_eq(l->obj, o))
        return;
    obj_unlink(t, l);
    l->obj = o;
    l->has_obj = 1;
    size_t b = hash_obj(o) & (t->nb - 1);
    l->next_obj = t->by_obj[b];
    t->by_obj[b] = l;
    l->in_obj = 1;
}

/* Doubles both bucket arrays when the table is fuller than one per bucket. */
static int grow(lease_table *t)
{
    size_t nb = t->nb * 2;
    lease_ent **bi = calloc(nb, sizeof *bi), **bo = calloc(nb, sizeof *bo);
    if (!bi || !bo) {
        free(bi);
        free(bo);
        return CAIRN_ENOMEM;
    }
    for (size_t i = 0; i < t->nb; i++) {
        for (lease_ent *l = t->by_id[i], *n; l; l = n) {
            n = l->next_id;
            size_t b = hash_u64((uint64_t)l->id) & (nb - 1);
            l->next_id = bi[b];
            bi[b] = l;
        }
        for (lease_ent *l = t->by_obj[i], *n; l; l = n) {
            n = l->next_obj;
            size_t b = hash_obj(l->obj) & (nb - 1);
            l->next_obj = bo[b];
            bo[b] = l;
        }
    }
    free(t->by_id);
    free(t->by_obj);
    t->by_id = bi;
    t->by_obj = bo;
    t->nb = nb;
    return 0;
}

static int touch(lease_table *t, lease_ent *l)
{
    if (l->touched)
        return 0;
    if (t->ntouched == t->tcap) {
        size_t cap = t->tcap ? t->tcap * 2 : 8;
        lease_ent **n = realloc(t->touched, cap * sizeof *n);
        if (!n)
            return CAIRN_ENOMEM;
        t->touched = n;
        t->tcap = cap;
    }
    t->touched[t->ntouched++] = l;
    l->touched = 1;
    return 0;
}

/* Finds or creates the entry of |id| (touched, so settle decides its fate). */
static int upsert(lease_table *t, lease_ent **out, int64_t id)
{
    lease_ent *l = cairn_lease_find(t, id);
    if (!l) {
        if (t->n >= t->nb && grow(t))
            return CAIRN_ENOMEM;
        l = calloc(1, sizeof *l);
        if (!l)
            return CAIRN_ENOMEM;
        l->id = id;
        size_t b = hash_u64((uint64_t)id) & (t->nb - 1);
        l->next_id = t->by_id[b];
        t->by_id[b] = l;
        t->n++;
    }
    int rc = touch(t, l);
    *out = rc ? NULL : l;
    return rc;
}

static void remove_ent(lease_table *t, lease_ent *l)
{
    obj_unlink(t, l);
    lease_ent **pp = &t->by_id[hash_u64((uint64_t)l->id) & (t->nb - 1)];
    while (*pp != l)
        pp = &(*pp)->next_id;
    *pp = l->next_id;
    t->n--;
    free(l->keys);
    free(l);
}

static size_t hash_ptr(const kentry *k)
{
    return hash_u64((uint64_t)(uintptr_t)k);
}

static int kset_add(lease_ent *l, kentry *k)
{
    if ((l->nkeys + 1) * 4 > l->kcap * 3) {
        size_t cap = l->kcap ? l->kcap * 2 : 8;
        kentry **n = calloc(cap, sizeof *n);
        if (!n)
            return CAIRN_ENOMEM;
        for (size_t i = 0; i < l->kcap; i++) {
            if (!l->keys[i])
                continue;
            size_t j = hash_ptr(l->keys[i]) & (cap - 1);
            while (n[j])
                j = (j + 1) & (cap - 1);
            n[j] = l->keys[i];
        }
        free(l->keys);
        l->keys = n;
        l->kcap = cap;
    }
    size_t j = hash_ptr(k) & (l->kcap - 1);
    while (l->keys[j]) {
        if (l->keys[j] == k)
            return 0;
        j = (j + 1) & (l->kcap - 1);
    }
    l->keys[j] = k;
    l->nkeys++;
    return 0;
}

/* Backward-shift deletion: no tombstones, so probes stay short. */
static void kset_del(lease_ent *l, kentry *k)
{
    if (!l->kcap)
        return;
    size_t m = l->kcap - 1, j = hash_ptr(k) & m;
    while (l->keys[j] && l->keys[j] != k)
        j = (j + 1) & m;
    if (!l->keys[j])
        return;
    l->keys[j] = NULL;
    l->nkeys--;
    for (size_t i = (j + 1) & m; l->keys[i]; i = (i + 1) & m) {
        size_t h = hash_ptr(l->keys[i]) & m;
        /* move keys[i] into the hole at j if its home is not in (j, i] */
        if ((i > j && (h <= j || h > i)) || (i < j && h <= j && h > i)) {
            l->keys[j] = l->keys[i];
            l->keys[i] = NULL;
            j = i;
        }
    }
}

int cairn_store_lease_patch(cairn_store *s, const cairn_patch *p)
{
    lease_table *t = &s->lt;
    lease_ent *l;
    if (obj_eq(p->obj, s->leases)) {
        if (p->key_len != 8)
            return 0; /* not a lease id: ignored on every node alike */
        int rc = upsert(t, &l, (int64_t)cairn_store_get_be64(p->key));
        if (rc)
            return rc;
        /* link the map now: the same change sets its fields next */
        if (p->action == CAIRN_PATCH_PUT && p->value.kind == CAIRN_READ_MAP)
            obj_link(t, l, p->value.obj);
        return 1;
    }
    l = find_obj(t, p->obj);
    if (!l)
        return 0; /* members, cluster, or a dead lease map */
    int rc = touch(t, l);
    return rc ? rc : 1;
}

int cairn_store_lease_key_move(cairn_store *s, kentry *k, int64_t from, int64_t to)
{
    if (from == to)
        return 0;
    lease_table *t = &s->lt;
    lease_ent *l;
    int rc;
    if (from) {
        if ((rc = upsert(t, &l, from)))
            return rc;
        kset_del(l, k);
    }
    if (to) {
        if ((rc = upsert(t, &l, to)) || (rc = kset_add(l, k)))
            return rc;
    }
    return 0;
}

static int64_t field_int(const cairn_doc *d, cairn_objid obj, const char *name)
{
    cairn_read r;
    if (cairn_doc_get(d, &r, obj, (const uint8_t *)name, strlen(name)) ||
        r.kind != CAIRN_READ_SCALAR || r.value.type != CAIRN_V_INT)
        return 0;
    return r.value.v.i;
}

int cairn_store_lease_settle(cairn_store *s)
{
    lease_table *t = &s->lt;
    for (size_t i = 0; i < t->ntouched; i++) {
        lease_ent *l = t->touched[i];
        l->touched = 0;
        uint8_t k[8];
        cairn_lease_doc_key(k, l->id);
        cairn_read r;
        int rc = cairn_doc_get(s->doc, &r, s->leases, k, 8);
        if (rc)
            return rc;
        int was_live = l->live;
        l->live = r.kind != CAIRN_READ_NONE;
        if (r.kind == CAIRN_READ_MAP) {
            obj_link(t, l, r.obj);
            l->ttl = field_int(s->doc, r.obj, LEASE_TTL_KEY);
            l->deadline = field_int(s->doc, r.obj, LEASE_DEADLINE_KEY);
        } else {
            obj_unlink(t, l);
            l->has_obj = 0;
            l->ttl = r.kind == CAIRN_READ_SCALAR && r.value.type == CAIRN_V_INT ? r.value.v.i : 0;
            l->deadline = 0;
        }
        /* a peer's numbers are not trusted: keep the arithmetic in range */
        if (l->ttl < 0 || l->ttl > CAIRN_LEASE_MAX_TTL)
            l->ttl = l->ttl < 0 ? 0 : CAIRN_LEASE_MAX_TTL;
        if (l->deadline < 0 || l->deadline > DEADLINE_MAX)
            l->deadline = l->deadline < 0 ? 0 : DEADLINE_MAX;
        if (!l->live) {
            l->local_deadline = 0;
            if (l->nkeys == 0) {
                remove_ent(t, l);
                continue;
            }
            t->next_due = 0; /* keys of a lease that is gone: clean up */
        } else if (!was_live) {
            l->local_deadline = 0; /* a (re)grant starts from the document */
        }
        if (l->live && cairn_lease_deadline(l) < t->next_due)
            t->next_due = cairn_lease_deadline(l);
    }
    t->ntouched = 0;
    return 0;
}

static int rebuild_cb(void *arg, const uint8_t *key, size_t key_len, const cairn_read *value)
{
    (void)value;
    cairn_store *s = arg;
    lease_ent *l;
    /* what cairn_store_lease_patch does for a patch on leases[key] */
    return key_len == 8 ? upsert(&s->lt, &l, (int64_t)cairn_store_get_be64(key)) : 0;
}

int cairn_store_lease_rebuild(cairn_store *s, kentry *const *leased, size_t nleased)
{
    int rc = cairn_doc_map_foreach(s->doc, s->leases, rebuild_cb, s);
    for (size_t i = 0; i < nleased && !rc; i++)
        rc = cairn_store_lease_key_move(s, leased[i], 0, leased[i]->lease);
    return rc ? rc : cairn_store_lease_settle(s);
}

void cairn_store_lease_restart(cairn_store *s, uint64_t now_ms)
{
    lease_table *t = &s->lt;
    for (size_t i = 0; i < t->nb; i++)
        for (lease_ent *l = t->by_id[i]; l; l = l->next_id)
            if (l->live)
                l->local_deadline = (int64_t)now_ms + l->ttl * 1000 + t->restart_extend_ms;
    t->next_due = 0;
}
