/*
 * Leases kept in the CRDT document. leases[id] is a map {ttl, deadline}
 * (store.h, DOCUMENT LAYOUT): grant, keepalive and revoke are changes, so
 * they replicate like writes, a keepalive on any node pushes the deadline
 * out for every node, and any node whose clock passes the deadline revokes
 * the lease with one change deleting the lease and all its keys. Two nodes
 * revoking the same lease concurrently both delete things the other deleted
 * too: the merge changes nothing visible and takes no revision.
 *
 * Everything in memory is derived from applied changes on the observer
 * path (local, merged or replayed): the lease table (id -> ttl, deadline)
 * is re-read from the document for every lease a change touched, and the
 * per-lease key sets follow the key index (a put with a lease attaches, a
 * put without or a delete detaches), so revoke and TimeToLive-with-keys
 * cost O(keys of the lease), not O(all keys). The only memory-only state is
 * local_deadline, the two things etcd keeps out of its log too:
 *
 *  - Keepalive coalescing. Writing every keepalive would turn a client's
 *    stream into a flood of replicated changes. A keepalive at time t sets
 *    local_deadline = t + TTL (what the client is promised, so this node
 *    never expires the lease early) and writes deadline = t + TTL into the
 *    document only when the stored deadline is more than TTL/2 behind it.
 *    Bound: two writes for one lease are more than TTL/2 apart in time, so a
 *    keepalive stream of any rate over T ms writes at most 1 + 2T/TTL_ms
 *    changes (etcd's clients renew every TTL/3: every second keepalive
 *    writes). A peer that only sees the document may expire the lease up to
 *    TTL/2 before this node would — within the slack of a partition anyway.
 *  - The restart rule. etcd does not persist remaining TTLs: on start (its
 *    lessor's Promote on becoming leader) every lease is refreshed to its
 *    full TTL plus one election timeout, and time spent down is forgotten
 *    (measured: a 10 s lease with 5 s left answers 10 s right after a
 *    restart). cairn follows it: open sets local_deadline = now + TTL +
 *    lease_restart_extend_ms for every recovered lease, without writing a
 *    change (a restart must not extend the lease on other nodes).
 *
 * A lease's effective deadline is max(deadline, local_deadline). The expiry
 * tick is O(1) while nothing is due (next_due) and O(leases) when it scans.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crdt/error.h"
#include "store/store_int.h"

#define LEASE_TTL_KEY "ttl"
#define LEASE_DEADLINE_KEY "deadline"
#define DEADLINE_MAX (INT64_MAX / 4) /* far beyond any now + TTL, no overflow */

/* ---- hashing -------------------------------------------------------------- */

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

static lease_ent *find_id(const lease_table *t, int64_t id)
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
    lease_ent *l = find_id(t, id);
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

/* ---- per-lease key sets (linear probing over kentry pointers) -------------- */

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

/* ---- observer hooks ---------------------------------------------------------- */

static void lease_key(uint8_t k[8], int64_t id)
{
    cairn_store_be64(k, (uint64_t)id);
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
        return 0;
    }
    l = find_obj(t, p->obj);
    return l ? touch(t, l) : 0; /* members, cluster, or a dead lease map */
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

static int64_t eff_deadline(const lease_ent *l)
{
    int64_t local = atomic_load(&l->local_deadline);
    return l->deadline > local ? l->deadline : local;
}

int cairn_store_lease_settle(cairn_store *s)
{
    lease_table *t = &s->lt;
    for (size_t i = 0; i < t->ntouched; i++) {
        lease_ent *l = t->touched[i];
        l->touched = 0;
        uint8_t k[8];
        lease_key(k, l->id);
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
        if (l->live && eff_deadline(l) < t->next_due)
            t->next_due = eff_deadline(l);
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

/* ---- writes ------------------------------------------------------------------- */

static int commit(cairn_store *s)
{
    cairn_doc_observer obs;
    int rc = cairn_doc_commit(s->doc, NULL, cairn_store_observer(s, &obs));
    return rc ? rc : s->obs_rc;
}

/* Sets the lease map's fields; makes the map first when |make|. */
static int write_lease(cairn_store *s, int64_t id, int make, cairn_objid obj, int64_t ttl,
                       int64_t deadline)
{
    uint8_t k[8];
    lease_key(k, id);
    int rc = cairn_doc_begin(s->doc, cairn_store_now_ms(s));
    if (rc)
        return rc;
    cairn_value v = {.type = CAIRN_V_INT};
    if (make) {
        rc = cairn_doc_put_object(s->doc, &obj, s->leases, k, 8, CAIRN_OBJ_MAP);
        v.v.i = ttl;
        if (!rc)
            rc = cairn_doc_put(s->doc, obj, (const uint8_t *)LEASE_TTL_KEY, strlen(LEASE_TTL_KEY),
                               &v);
    }
    v.v.i = deadline;
    if (!rc)
        rc = cairn_doc_put(s->doc, obj, (const uint8_t *)LEASE_DEADLINE_KEY,
                           strlen(LEASE_DEADLINE_KEY), &v);
    if (rc) {
        cairn_doc_rollback(s->doc);
        return rc;
    }
    return commit(s);
}

static int kentry_cmp(const void *a, const void *b)
{
    const kentry *x = *(const kentry *const *)a, *y = *(const kentry *const *)b;
    return cairn_store_keycmp(kentry_key(x), x->key_len, kentry_key(y), y->key_len);
}

/* One change: every key attached to |l| (in key order: etcd's event order)
 * and leases[id] if it exists. The observer may free |l|. */
static int revoke_locked(cairn_store *s, lease_ent *l)
{
    kentry **ks = NULL;
    size_t n = 0;
    if (l->nkeys) {
        ks = malloc(l->nkeys * sizeof *ks);
        if (!ks)
            return CAIRN_ENOMEM;
        for (size_t i = 0; i < l->kcap; i++)
            if (l->keys[i])
                ks[n++] = l->keys[i];
        qsort(ks, n, sizeof *ks, kentry_cmp);
    }
    int live = l->live;
    uint8_t k[8];
    lease_key(k, l->id);
    int rc = cairn_doc_begin(s->doc, cairn_store_now_ms(s));
    for (size_t i = 0; i < n && !rc; i++) {
        rc = cairn_doc_delete(s->doc, s->kvs, kentry_key(ks[i]), ks[i]->key_len);
        if (rc == CAIRN_ENOTFOUND)
            rc = 0;
    }
    if (!rc && live)
        rc = cairn_doc_delete(s->doc, s->leases, k, 8);
    free(ks);
    if (rc) {
        cairn_doc_rollback(s->doc);
        return rc;
    }
    return commit(s);
}

/* etcd's id generator (pkg/idutil): the low 16 bits of the member id, then
 * 40 bits of the time in ms and an 8-bit counter, incremented as one 48-bit
 * suffix; a lease id is that with the top bit cleared, never 0 and never
 * one in use. */
static int64_t next_id(cairn_store *s)
{
    lease_table *t = &s->lt;
    if (!t->next_gen)
        t->next_gen = (cairn_store_now_ms(s) & ((1ull << 40) - 1)) << 8;
    for (;;) {
        t->next_gen = (t->next_gen + 1) & ((1ull << 48) - 1);
        uint64_t v = ((s->member_id & 0xffffu) << 48 | t->next_gen) & ((1ull << 63) - 1);
        lease_ent *l = find_id(t, (int64_t)v);
        if (v && !(l && l->live))
            return (int64_t)v;
    }
}

int cairn_store_lease_create_async(cairn_store *s, cairn_lease_grant_resp *resp, int64_t id,
                                   int64_t ttl, cairn_store_done_cb cb, void *arg)
{
    memset(resp, 0, sizeof *resp);
    /* etcd: > 9e9 s -> "too large lease TTL"; below the minimum (also 0 and
     * negative) -> raised to it, no error */
    if (ttl > CAIRN_LEASE_MAX_TTL)
        return CAIRN_ELEASETTLTOOLARGE;
    pthread_rwlock_wrlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    if (ttl < s->lt.min_ttl)
        ttl = s->lt.min_ttl;
    if (!rc && id == 0)
        id = next_id(s);
    lease_ent *l = rc ? NULL : find_id(&s->lt, id);
    if (!rc && l && l->live)
        rc = CAIRN_ELEASEEXIST;
    cairn_objid none = {0, 0};
    if (!rc)
        rc = write_lease(s, id, 1, none, ttl, (int64_t)cairn_store_now_ms(s) + ttl * 1000);
    if (!rc) {
        /* filled before the completion is queued: it may run at once. A
         * grant takes no revision: the one everything before it made. */
        cairn_store_fill_header(s, &resp->header, s->rev);
        resp->id = id;
        resp->ttl = ttl;
        rc = cairn_store_enqueue_wait(s, cb, arg, NULL);
        if (rc)
            memset(resp, 0, sizeof *resp);
    }
    pthread_rwlock_unlock(&s->rw);
    return rc;
}

int cairn_store_lease_create(cairn_store *s, cairn_lease_grant_resp *resp, int64_t id, int64_t ttl)
{
    cairn_store_sync_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    int rc = cairn_store_lease_create_async(s, resp, id, ttl, cairn_store_sync_done, &w);
    if (!rc)
        rc = cairn_store_sync_wait_for(&w);
    if (rc)
        memset(resp, 0, sizeof *resp);
    return rc;
}

int cairn_store_lease_grant(cairn_store *s, int64_t id, int64_t ttl)
{
    cairn_lease_grant_resp r;
    if (id == 0)
        return CAIRN_EINVAL;
    return cairn_store_lease_create(s, &r, id, ttl);
}

int cairn_store_lease_revoke_async(cairn_store *s, cairn_header *h, int64_t id,
                                   cairn_store_done_cb cb, void *arg)
{
    memset(h, 0, sizeof *h);
    pthread_rwlock_wrlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    lease_ent *l = rc ? NULL : find_id(&s->lt, id);
    if (!rc && !(l && l->live))
        rc = CAIRN_ELEASENOTFOUND;
    if (!rc)
        rc = revoke_locked(s, l);
    if (!rc) {
        cairn_store_fill_header(s, h, s->rev); /* before the completion can run */
        rc = cairn_store_enqueue_wait(s, cb, arg, NULL);
        if (rc)
            memset(h, 0, sizeof *h);
    }
    pthread_rwlock_unlock(&s->rw);
    return rc;
}

int cairn_store_lease_revoke(cairn_store *s, cairn_header *h, int64_t id)
{
    cairn_store_sync_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    int rc = cairn_store_lease_revoke_async(s, h, id, cairn_store_sync_done, &w);
    if (!rc)
        rc = cairn_store_sync_wait_for(&w);
    if (rc)
        memset(h, 0, sizeof *h);
    return rc;
}

int cairn_store_lease_keepalive(cairn_store *s, int64_t *ttl, int64_t id)
{
    *ttl = 0;
    /* Most keepalives write nothing (coalescing), so they run under the read
     * side beside reads and other keepalives (local_deadline is atomic);
     * one that must write takes the write side and decides again. */
    for (int wr = 0;; wr = 1) {
        if (wr)
            pthread_rwlock_wrlock(&s->rw);
        else
            pthread_rwlock_rdlock(&s->rw);
        int rc = cairn_store_failed_rc(s);
        int64_t now = (int64_t)cairn_store_now_ms(s);
        lease_ent *l = rc ? NULL : find_id(&s->lt, id);
        /* etcd: renewing a lease that is unknown, or expired and waiting for
         * its revoke, is "requested lease not found" */
        if (!rc && !(l && l->live && eff_deadline(l) > now))
            rc = CAIRN_ELEASENOTFOUND;
        if (!rc) {
            int64_t ttl_ms = l->ttl * 1000, target = now + ttl_ms;
            int64_t granted = l->ttl;
            int need = !l->has_obj || target - l->deadline > ttl_ms / 2;
            if (need && !wr) {
                pthread_rwlock_unlock(&s->rw);
                continue;
            }
            atomic_store(&l->local_deadline, target);
            if (need)
                rc = write_lease(s, id, !l->has_obj, l->obj, granted, target);
            if (!rc)
                *ttl = granted; /* etcd: the granted TTL, not what remained */
        }
        pthread_rwlock_unlock(&s->rw);
        return rc;
    }
}

int cairn_store_lease_ttl(cairn_store *s, cairn_lease_ttl_resp *resp, int64_t id, int keys)
{
    memset(resp, 0, sizeof *resp);
    resp->id = id;
    pthread_rwlock_rdlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    lease_ent *l = rc ? NULL : find_id(&s->lt, id);
    if (!rc && !(l && l->live)) {
        resp->ttl = -1; /* etcd: unknown lease: TTL -1, no error */
    } else if (!rc) {
        int64_t left = eff_deadline(l) - (int64_t)cairn_store_now_ms(s);
        resp->ttl = left > 0 ? left / 1000 : 0; /* etcd truncates */
        resp->granted_ttl = l->ttl;
        if (keys && l->nkeys) {
            size_t bytes = l->nkeys * sizeof(cairn_lease_key) + l->nkeys * sizeof(kentry *);
            for (size_t i = 0; i < l->kcap; i++)
                if (l->keys[i])
                    bytes += l->keys[i]->key_len;
            uint8_t *mem = malloc(bytes);
            if (!mem) {
                rc = CAIRN_ENOMEM;
            } else {
                kentry **ks = (kentry **)mem;
                size_t n = 0;
                for (size_t i = 0; i < l->kcap; i++)
                    if (l->keys[i])
                        ks[n++] = l->keys[i];
                qsort(ks, n, sizeof *ks, kentry_cmp);
                cairn_lease_key *out = (cairn_lease_key *)(mem + n * sizeof(kentry *));
                uint8_t *p = (uint8_t *)(out + n);
                for (size_t i = 0; i < n; i++) {
                    memcpy(p, kentry_key(ks[i]), ks[i]->key_len);
                    out[i].key = p;
                    out[i].key_len = ks[i]->key_len;
                    p += ks[i]->key_len;
                }
                resp->keys = out;
                resp->nkeys = n;
                resp->mem_ = mem;
            }
        }
    }
    pthread_rwlock_unlock(&s->rw);
    if (rc) {
        cairn_lease_ttl_resp_destroy(resp);
        return rc;
    }
    cairn_store_header(s, &resp->header);
    return 0;
}

void cairn_lease_ttl_resp_destroy(cairn_lease_ttl_resp *r)
{
    free(r->mem_);
    memset(r, 0, sizeof *r);
}

static int i64cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int cairn_store_lease_list(cairn_store *s, int64_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    pthread_rwlock_rdlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    lease_table *t = &s->lt;
    int64_t *v = rc || !t->n ? NULL : malloc(t->n * sizeof *v);
    size_t m = 0;
    if (!rc && t->n && !v)
        rc = CAIRN_ENOMEM;
    for (size_t i = 0; v && i < t->nb; i++)
        for (lease_ent *l = t->by_id[i]; l; l = l->next_id)
            if (l->live)
                v[m++] = l->id;
    pthread_rwlock_unlock(&s->rw);
    if (rc || !m) {
        free(v);
        return rc;
    }
    qsort(v, m, sizeof *v, i64cmp);
    *ids = v;
    *n = m;
    return 0;
}

int cairn_store_lease_expire(cairn_store *s, size_t *nrevoked, uint64_t now_ms)
{
    if (nrevoked)
        *nrevoked = 0;
    int64_t now = (int64_t)now_ms;
    lease_table *t = &s->lt;
    /* the common tick finds nothing due: decide that under the read side, so
     * a tick never stalls readers behind a writer-preferring lock */
    pthread_rwlock_rdlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    int idle = rc || (t->next_due && now < t->next_due);
    pthread_rwlock_unlock(&s->rw);
    if (idle)
        return rc;
    pthread_rwlock_wrlock(&s->rw);
    rc = cairn_store_failed_rc(s);
    if (rc || (t->next_due && now < t->next_due))
        goto out;
    /* collect first: each revoke's observer may free entries */
    int64_t due[CAIRN_LEASE_REVOKE_BATCH];
    size_t nd = 0;
    int64_t next = INT64_MAX;
    for (size_t i = 0; i < t->nb; i++) {
        for (lease_ent *l = t->by_id[i]; l; l = l->next_id) {
            int d = l->live ? eff_deadline(l) <= now : l->nkeys > 0;
            if (d && nd < CAIRN_LEASE_REVOKE_BATCH)
                due[nd++] = l->id;
            else if (d)
                next = 0; /* more than one batch is due: come back at once */
            else if (l->live && eff_deadline(l) < next)
                next = eff_deadline(l);
        }
    }
    t->next_due = next;
    for (size_t i = 0; i < nd && !rc; i++) {
        lease_ent *l = find_id(t, due[i]);
        if (!l)
            continue;
        rc = revoke_locked(s, l);
        if (!rc && nrevoked)
            (*nrevoked)++;
    }
    /* return once the revokes are durable, as a revoke call does */
    cairn_store_sync_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    int waiting = !rc && nd && cairn_store_enqueue_wait(s, cairn_store_sync_done, &w, NULL) == 0;
    pthread_rwlock_unlock(&s->rw);
    return waiting ? cairn_store_sync_wait_for(&w) : rc;
out:
    pthread_rwlock_unlock(&s->rw);
    return rc;
}

/* ---- the expiry thread ------------------------------------------------------------ */

static void *lease_main(void *arg)
{
    cairn_store *s = arg;
    pthread_mutex_lock(&s->lease_mu);
    while (!s->lease_stop) {
        pthread_mutex_unlock(&s->lease_mu);
        size_t n = 0;
        int rc = cairn_store_lease_expire(s, &n, cairn_store_now_ms(s));
        pthread_mutex_lock(&s->lease_mu);
        if (rc || n == CAIRN_LEASE_REVOKE_BATCH) {
            if (rc)
                break; /* the store failed: every later call would too */
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)s->lease_tick_ms % 1000 * 1000000L;
        until.tv_sec += s->lease_tick_ms / 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (!s->lease_stop)
            pthread_cond_timedwait(&s->lease_cv, &s->lease_mu, &until);
    }
    pthread_mutex_unlock(&s->lease_mu);
    return NULL;
}

int cairn_store_lease_thread_start(cairn_store *s, uint32_t tick_ms)
{
    s->lease_tick_ms = tick_ms;
    if (!tick_ms)
        return 0;
    if (pthread_create(&s->lease_thread, NULL, lease_main, s))
        return CAIRN_ENOMEM;
    s->lease_thread_started = 1;
    return 0;
}

void cairn_store_lease_thread_stop(cairn_store *s)
{
    if (!s->lease_thread_started)
        return;
    pthread_mutex_lock(&s->lease_mu);
    s->lease_stop = 1;
    pthread_cond_broadcast(&s->lease_cv);
    pthread_mutex_unlock(&s->lease_mu);
    pthread_join(s->lease_thread, NULL);
    s->lease_thread_started = 0;
}
