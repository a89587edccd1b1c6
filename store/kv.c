/*
 * etcd's KV semantics over the store: Range, Put, DeleteRange and Txn, with
 * the rules measured against etcd 3.4 (the tests quote what etcd answered).
 *
 * Reads. A range first gathers lightweight references to the keys live at
 * the read revision (from the index; a reference is an index entry and the
 * position of the history entry in effect), which gives etcd's count (every
 * live key in the range, whatever the limit and the min/max filters). Only
 * the references that can be returned are then materialised: the current
 * value comes from the document, an older one from its history record on disk
 * (and, for most, from the body of the change its history record names).
 * Plain readers read at the visible (durable) revision and hold the
 * rwlock's read side only to take their view: the references, the count and
 * the values that memory holds (range_view_take), and a LevelDB snapshot
 * when some result lives in a history record. Reading those records, the
 * filters, the sort and the response are built after the unlock, so a
 * writer waits for a reader's walk of the index, never for its disk reads.
 *
 * Writes and transactions. A write takes the rwlock's write side for its
 * in-memory work. A Txn follows etcd's order exactly: static checks (op
 * counts, empty keys, value/lease provided, overlapping writes) before the
 * lock; then under it the compares of every level are evaluated against the
 * state before the transaction (etcd evaluates nested compares up front too,
 * so a nested compare does not see the outer level's writes), then the puts
 * on the chosen path are checked (ignore_* needs the key to exist before the
 * transaction; the lease must exist), then the ranges (future / compacted
 * revision), and only then is anything applied. The ops become edits of one
 * document change; reads inside see those edits through an overlay of the
 * keys written so far (the document already holds their values). The change
 * takes one revision, predicted as current + 1 at the first write and
 * checked against what the observer assigns. An error part-way rolls the
 * document back, so nothing is applied. The blocking Put, DeleteRange and
 * Txn are the async calls plus a wait, at the end of this file.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "crdt/wire.h"
#include "store/store_int.h"

/* ---- key ranges ----------------------------------------------------------------- */

typedef struct krange {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *end; /* NULL = single key; end_len 0 = unbounded */
    size_t end_len;
    int single;
    int unbounded;
} krange;

static void krange_of(krange *r, const uint8_t *key, size_t key_len, const uint8_t *end,
                      size_t end_len)
{
    r->key = key;
    r->key_len = key_len;
    r->end = end;
    r->end_len = end_len;
    r->single = end_len == 0;
    /* etcd: range_end "\0" means every key >= key */
    r->unbounded = end_len == 1 && end[0] == 0;
}

/* 1 if |k| is past the range (iteration can stop). */
static int krange_past(const krange *r, const uint8_t *k, size_t kl)
{
    if (r->single)
        return cairn_store_keycmp(k, kl, r->key, r->key_len) > 0;
    if (r->unbounded)
        return 0;
    return cairn_store_keycmp(k, kl, r->end, r->end_len) >= 0;
}

static int krange_has(const krange *r, const uint8_t *k, size_t kl)
{
    return cairn_store_keycmp(k, kl, r->key, r->key_len) >= 0 && !krange_past(r, k, kl);
}

/* ---- transaction overlay --------------------------------------------------------- */

typedef struct ov_entry {
    const uint8_t *key; /* in the txn arena */
    size_t key_len;
    int live;
    int64_t create_rev, version, lease;
    int seen; /* scratch for gather */
} ov_entry;

typedef struct txctx {
    cairn_store *s;
    store_arena *arena;
    int64_t pre;   /* revision before the transaction */
    int64_t rev;   /* the transaction's revision once it wrote, else 0 */
    int begun;     /* cairn_doc_begin called */
    ov_entry **ov; /* sorted by key */
    size_t nov, ovcap;
} txctx;

static ov_entry *ov_find(const txctx *t, const uint8_t *k, size_t kl, size_t *pos)
{
    size_t lo = 0, hi = t->nov;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = cairn_store_keycmp(t->ov[mid]->key, t->ov[mid]->key_len, k, kl);
        if (c == 0) {
            if (pos)
                *pos = mid;
            return t->ov[mid];
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (pos)
        *pos = lo;
    return NULL;
}

static ov_entry *ov_upsert(txctx *t, const uint8_t *k, size_t kl)
{
    size_t pos;
    ov_entry *e = ov_find(t, k, kl, &pos);
    if (e)
        return e;
    if (t->nov == t->ovcap) {
        size_t cap = t->ovcap ? t->ovcap * 2 : 16;
        ov_entry **n = realloc(t->ov, cap * sizeof *n);
        if (!n)
            return NULL;
        t->ov = n;
        t->ovcap = cap;
    }
    e = cairn_store_arena_alloc(t->arena, sizeof *e);
    if (!e)
        return NULL;
    memset(e, 0, sizeof *e);
    e->key = cairn_store_arena_dup(t->arena, k, kl);
    if (!e->key)
        return NULL;
    e->key_len = kl;
    memmove(t->ov + pos + 1, t->ov + pos, (t->nov - pos) * sizeof *t->ov);
    t->ov[pos] = e;
    t->nov++;
    return e;
}

/* ---- gathering --------------------------------------------------------------------- */

typedef struct kref {
    const uint8_t *key;
    size_t key_len;
    const kentry *e;    /* NULL for an overlay-only key */
    const ov_entry *ov; /* the overlay state, if the txn wrote the key */
    int64_t mod_rev;
    int current; /* the key's latest state: metadata in e/ov, value in the doc */
} kref;

typedef struct kref_vec {
    kref *v;
    size_t n, cap;
} kref_vec;

static int kref_push(kref_vec *r, const kref *k)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        kref *n = realloc(r->v, cap * sizeof *n);
        if (!n)
            return CAIRN_ENOMEM;
        r->v = n;
        r->cap = cap;
    }
    r->v[r->n++] = *k;
    return 0;
}

static int kref_keycmp(const void *a, const void *b)
{
    const kref *x = a, *y = b;
    return cairn_store_keycmp(x->key, x->key_len, y->key, y->key_len);
}

/* Every key live in |r| at revision |at|; with |t|, at the latest state as
 * modified by the transaction so far. With |hist| (a read at an explicit
 * revision inside a txn), |t| only marks the keys whose document value the
 * txn has already replaced, which must then be read from disk. */
static int gather_x(kref_vec *out, cairn_store *s, const krange *r, int64_t at, txctx *t, int hist)
{
    out->n = 0;
    if (!r->single && !r->unbounded &&
        cairn_store_keycmp(r->key, r->key_len, r->end, r->end_len) >= 0)
        return 0;
    if (t)
        for (size_t i = 0; i < t->nov; i++)
            t->ov[i]->seen = 0;
    int rc = 0;
    kiter it;
    for (kentry *e = cairn_kindex_seek(&it, &s->idx, r->key, r->key_len); e;
         e = cairn_kindex_next(&it)) {
        if (krange_past(r, kentry_key(e), e->key_len))
            break;
        kref k = {kentry_key(e), e->key_len, e, NULL, 0, 0};
        ov_entry *o = t && t->nov ? ov_find(t, k.key, k.key_len, NULL) : NULL;
        if (o && hist) {
            uint32_t pos = 0;
            uint64_t h = cairn_kindex_at(e, at, &pos);
            if (!h || (h & CAIRN_IDX_TOMB))
                continue;
            k.mod_rev = (int64_t)(h & ~CAIRN_IDX_TOMB);
            k.current = 0;
        } else if (o) {
            o->seen = 1;
            if (!o->live)
                continue;
            k.ov = o;
            k.mod_rev = t->rev;
            k.current = 1;
        } else {
            uint32_t pos = 0;
            uint64_t h = cairn_kindex_at(e, at, &pos);
            if (!h || (h & CAIRN_IDX_TOMB))
                continue;
            k.mod_rev = (int64_t)(h & ~CAIRN_IDX_TOMB);
            k.current = pos == e->nhist - 1;
        }
        if ((rc = kref_push(out, &k)))
            return rc;
    }
    if (t && t->nov && !hist) {
        size_t before = out->n;
        for (size_t i = 0; i < t->nov; i++) {
            ov_entry *o = t->ov[i];
            if (o->seen || !o->live || !krange_has(r, o->key, o->key_len))
                continue;
            kref k = {o->key, o->key_len, NULL, o, t->rev, 1};
            if ((rc = kref_push(out, &k)))
                return rc;
        }
        if (out->n != before)
            qsort(out->v, out->n, sizeof *out->v, kref_keycmp);
    }
    return 0;
}

static int gather(kref_vec *out, cairn_store *s, const krange *r, int64_t at, txctx *t)
{
    return gather_x(out, s, r, at, t, 0);
}

/* Fills |kv| for |k| from memory when |k| is its key's latest state
 * (metadata from the index or the overlay, the value from the document) and
 * returns 0; otherwise fills only the key and the mod revision and returns
 * 1: the rest is in the history record on disk (materialise_disk).
 * Values only if |want_value|. Caller holds the lock. */
static int materialise_mem(cairn_store *s, store_arena *a, const kref *k, cairn_kv *kv,
                           int want_value)
{
    memset(kv, 0, sizeof *kv);
    kv->key = cairn_store_arena_dup(a, k->key, k->key_len);
    if (!kv->key)
        return CAIRN_ENOMEM;
    kv->key_len = k->key_len;
    kv->mod_revision = k->mod_rev;
    if (!k->current)
        return 1;
    if (k->ov) {
        kv->create_revision = k->ov->create_rev;
        kv->version = k->ov->version;
        kv->lease = k->ov->lease;
    } else {
        kv->create_revision = k->e->create_rev;
        kv->version = k->e->version;
        kv->lease = k->e->lease;
    }
    if (want_value) {
        cairn_read rd;
        int rc = cairn_doc_get(s->doc, &rd, s->kvs, k->key, k->key_len);
        if (rc)
            return rc;
        if (rd.kind == CAIRN_READ_NONE) {
            cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "index and document disagree on a key");
            return CAIRN_ECORRUPT;
        }
        const uint8_t *val = (const uint8_t *)"";
        size_t vl = 0;
        int64_t lease;
        if (rd.kind == CAIRN_READ_SCALAR)
            cairn_store_parse_record(&rd.value, &lease, &val, &vl);
        kv->value = cairn_store_arena_dup(a, val, vl);
        if (!kv->value)
            return CAIRN_ENOMEM;
        kv->value_len = vl;
    }
    return 0;
}

/* The rest of a |kv| that materialise_mem left to the disk: its history
 * record at kv->mod_revision, read through |ro|. Needs no lock: history
 * records never change, and |ro|'s snapshot (or the caller's lock) keeps
 * compaction from deleting them. */
static int materialise_disk(cairn_store *s, store_arena *a, const leveldb_readoptions_t *ro,
                            cairn_kv *kv, int want_value)
{
    /* an older revision: its record must be durable before we read it (a
     * txn reads at the applied revision, ahead of the visible one) */
    if (kv->mod_revision > atomic_load(&s->visible)) {
        int rc = cairn_store_wait_visible(s, kv->mod_revision);
        if (rc)
            return rc;
    }
    return cairn_store_read_hist(s, a, ro, kv->mod_revision, kv->key, kv->key_len, kv, want_value);
}

/* Fills |kv| for |k|; values only if |want_value|. Caller holds the lock. */
static int materialise(cairn_store *s, store_arena *a, const kref *k, cairn_kv *kv, int want_value)
{
    int rc = materialise_mem(s, a, k, kv, want_value);
    if (rc == 1)
        rc = materialise_disk(s, a, s->ropt, kv, want_value);
    return rc;
}

/* ---- Range ------------------------------------------------------------------------- */

typedef int (*kv_cmp_fn)(const cairn_kv *a, const cairn_kv *b);

static int cmp_i64(int64_t a, int64_t b)
{
    return a < b ? -1 : a > b;
}
static int by_key(const cairn_kv *a, const cairn_kv *b)
{
    return cairn_store_keycmp(a->key, a->key_len, b->key, b->key_len);
}
static int by_version(const cairn_kv *a, const cairn_kv *b)
{
    return cmp_i64(a->version, b->version);
}
static int by_create(const cairn_kv *a, const cairn_kv *b)
{
    return cmp_i64(a->create_revision, b->create_revision);
}
static int by_mod(const cairn_kv *a, const cairn_kv *b)
{
    return cmp_i64(a->mod_revision, b->mod_revision);
}
static int by_value(const cairn_kv *a, const cairn_kv *b)
{
    return cairn_store_keycmp(a->value, a->value_len, b->value, b->value_len);
}

/* Stable merge sort: equal elements keep key order, which is what etcd's
 * sort gives for small results (insertion sort below 12 elements). */
static void msort(cairn_kv *v, cairn_kv *tmp, size_t n, kv_cmp_fn cmp, int desc)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    msort(v, tmp, h, cmp, desc);
    msort(v + h, tmp, n - h, cmp, desc);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = cmp(&v[i], &v[j]);
        if (desc)
            c = -c;
        if (c <= 0)
            tmp[k++] = v[i++];
        else
            tmp[k++] = v[j++];
    }
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static int check_rev(cairn_store *s, int64_t rev, int64_t cur)
{
    /* etcd: a revision above the current one is a future revision; one below
     * the compacted one has been compacted (reading AT it is fine) */
    if (rev > cur)
        return CAIRN_EFUTUREREV;
    if (rev > 0 && rev < s->compacted)
        return CAIRN_ECOMPACTED;
    return 0;
}

/* A range in two halves, so that a plain read holds the lock only for
 * what lives in memory. range_view (caller holds the lock) checks the
 * revision, gathers the references, counts them and materialises the ones
 * that can be returned from memory; those whose state is in a history
 * record get only their key and mod revision and are marked in |disk|.
 * range_finish reads those records through |ro| (no lock needed: see
 * materialise_disk), then applies the filters, the sort and the limit. */
typedef struct range_view {
    cairn_kv *kvs; /* |n|, in key order */
    uint8_t *disk; /* disk[i]: kvs[i] waits for its history record */
    size_t n, ndisk;
    int want_value;
} range_view;

static int range_view_take(cairn_store *s, store_arena *a, range_view *v, cairn_range_resp *resp,
                           const cairn_range_req *req, int64_t cur, txctx *t)
{
    memset(v, 0, sizeof *v);
    if (req->key_len == 0)
        return CAIRN_EEMPTYKEY;
    int rc = check_rev(s, req->revision, cur);
    if (rc)
        return rc;
    int64_t at = req->revision > 0 ? req->revision : cur;
    krange r;
    krange_of(&r, req->key, req->key_len, req->range_end, req->range_end_len);
    kref_vec refs = {0};
    /* history never sees the txn's writes */
    rc = gather_x(&refs, s, &r, at, t, req->revision > 0);
    if (rc)
        goto out;
    resp->count = (int64_t)refs.n;
    if (req->count_only || refs.n == 0)
        goto out;
    int filters = req->min_mod_revision || req->max_mod_revision || req->min_create_revision ||
                  req->max_create_revision;
    size_t take = refs.n;
    /* etcd: without sort or filters, fetch limit+1 to learn |more| */
    if (req->sort_order == CAIRN_SORT_NONE && !filters && req->limit > 0 &&
        (uint64_t)req->limit + 1 < take)
        take = (size_t)req->limit + 1;
    v->want_value = !req->keys_only || req->sort_target == CAIRN_SORT_VALUE;
    v->kvs = cairn_store_arena_alloc(a, take * sizeof *v->kvs);
    v->disk = cairn_store_arena_alloc(a, take);
    if (!v->kvs || !v->disk) {
        rc = CAIRN_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < take; i++) {
        rc = materialise_mem(s, a, &refs.v[i], &v->kvs[i], v->want_value);
        if (rc < 0)
            goto out;
        v->disk[i] = (uint8_t)rc;
        v->ndisk += (size_t)rc;
        rc = 0;
    }
    v->n = take;
out:
    free(refs.v);
    return rc;
}

static int range_finish(cairn_store *s, store_arena *a, cairn_range_resp *resp,
                        const cairn_range_req *req, range_view *v, const leveldb_readoptions_t *ro)
{
    if (v->n == 0)
        return 0;
    cairn_kv *kvs = v->kvs;
    size_t n = 0;
    for (size_t i = 0; i < v->n; i++) {
        if (v->disk[i]) {
            int rc = materialise_disk(s, a, ro, &kvs[i], v->want_value);
            if (rc)
                return rc;
        }
        const cairn_kv *kv = &kvs[i];
        /* etcd: the filters prune after counting, so count ignores them */
        if (req->max_mod_revision && kv->mod_revision > req->max_mod_revision)
            continue;
        if (req->min_mod_revision && kv->mod_revision < req->min_mod_revision)
            continue;
        if (req->max_create_revision && kv->create_revision > req->max_create_revision)
            continue;
        if (req->min_create_revision && kv->create_revision < req->min_create_revision)
            continue;
        kvs[n++] = *kv;
    }
    int order = req->sort_order;
    /* etcd: a sort target other than KEY with order NONE sorts ascending */
    if (req->sort_target != CAIRN_SORT_KEY && order == CAIRN_SORT_NONE)
        order = CAIRN_SORT_ASCEND;
    /* etcd: only ASCEND and DESCEND sort; an unknown order leaves key order */
    if ((order == CAIRN_SORT_ASCEND || order == CAIRN_SORT_DESCEND) && n > 1) {
        static const kv_cmp_fn fns[5] = {by_key, by_version, by_create, by_mod, by_value};
        kv_cmp_fn f =
            req->sort_target >= 0 && req->sort_target < 5 ? fns[req->sort_target] : by_key;
        int desc = order == CAIRN_SORT_DESCEND;
        if (f != by_key || desc) {
            cairn_kv *tmp = malloc(n * sizeof *tmp);
            if (!tmp)
                return CAIRN_ENOMEM;
            msort(kvs, tmp, n, f, desc);
            free(tmp);
        }
    }
    if (req->limit > 0 && n > (uint64_t)req->limit) {
        n = (size_t)req->limit;
        resp->more = 1;
    }
    if (req->keys_only)
        for (size_t i = 0; i < n; i++) {
            kvs[i].value = NULL;
            kvs[i].value_len = 0;
        }
    resp->kvs = kvs;
    resp->nkvs = n;
    return 0;
}

/* The whole range under the lock the caller holds (a txn's). |cur| is the
 * revision "now" means; |t| the transaction (NULL outside one). */
static int range_locked(cairn_store *s, store_arena *a, cairn_range_resp *resp,
                        const cairn_range_req *req, int64_t cur, txctx *t)
{
    range_view v;
    int rc = range_view_take(s, a, &v, resp, req, cur, t);
    if (!rc)
        rc = range_finish(s, a, resp, req, &v, s->ropt);
    return rc;
}

static store_arena *arena_new(void)
{
    return calloc(1, sizeof(store_arena));
}

static void arena_del(void *p)
{
    if (!p)
        return;
    cairn_store_arena_free(p);
    free(p);
}

int cairn_store_range(cairn_store *s, cairn_range_resp *resp, const cairn_range_req *req)
{
    memset(resp, 0, sizeof *resp);
    store_arena *a = arena_new();
    if (!a)
        return CAIRN_ENOMEM;
    /* The view: what memory holds at the visible revision, and a LevelDB
     * snapshot for the history records (compaction may delete them once
     * the lock is gone). Everything else runs with no lock held. */
    range_view view;
    const leveldb_snapshot_t *snap = NULL;
    pthread_rwlock_rdlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    int64_t v = atomic_load(&s->visible);
    if (!rc)
        rc = range_view_take(s, a, &view, resp, req, v, NULL);
    if (!rc && view.ndisk)
        snap = leveldb_create_snapshot(s->db);
    pthread_rwlock_unlock(&s->rw);
    if (!rc && s->range_view_cb)
        s->range_view_cb(s->range_view_arg);
    if (!rc) {
        leveldb_readoptions_t *ro = NULL;
        if (snap) {
            ro = leveldb_readoptions_create();
            leveldb_readoptions_set_verify_checksums(ro, 1);
            leveldb_readoptions_set_snapshot(ro, snap);
        }
        rc = range_finish(s, a, resp, req, &view, ro ? ro : s->ropt);
        if (ro)
            leveldb_readoptions_destroy(ro);
    }
    if (snap)
        leveldb_release_snapshot(s->db, snap);
    if (rc) {
        arena_del(a);
        memset(resp, 0, sizeof *resp);
        return rc;
    }
    cairn_store_fill_header(s, &resp->header, v);
    resp->mem_ = a;
    return 0;
}

void cairn_range_resp_destroy(cairn_range_resp *r)
{
    arena_del(r->mem_);
    memset(r, 0, sizeof *r);
}
void cairn_put_resp_destroy(cairn_put_resp *r)
{
    arena_del(r->mem_);
    memset(r, 0, sizeof *r);
}
void cairn_delete_resp_destroy(cairn_delete_resp *r)
{
    arena_del(r->mem_);
    memset(r, 0, sizeof *r);
}
void cairn_txn_resp_destroy(cairn_txn_resp *r)
{
    arena_del(r->mem_);
    memset(r, 0, sizeof *r);
}

/* ---- writes ------------------------------------------------------------------------- */

static int lease_exists(cairn_store *s, int64_t id)
{
    uint8_t k[8];
    cairn_store_be64(k, (uint64_t)id);
    cairn_read r;
    if (cairn_doc_get(s->doc, &r, s->leases, k, 8))
        return 0;
    return r.kind != CAIRN_READ_NONE;
}

/* The key's latest state (with the txn's overlay). 1 = live, 0 = absent. */
static int latest_state(cairn_store *s, txctx *t, const uint8_t *k, size_t kl, kref *out)
{
    ov_entry *o = t->nov ? ov_find(t, k, kl, NULL) : NULL;
    if (o) {
        if (!o->live)
            return 0;
        *out = (kref){o->key, o->key_len, NULL, o, t->rev, 1};
        return 1;
    }
    kentry *e = cairn_kindex_find(&s->idx, k, kl);
    if (!e || !kentry_live(e))
        return 0;
    *out = (kref){kentry_key(e), e->key_len, e, NULL, kentry_mod(e), 1};
    return 1;
}

static int tx_begin(txctx *t)
{
    if (t->begun)
        return 0;
    if (!t->s->kvs_known)
        return CAIRN_ESTATE; /* a joined store before its genesis came */
    int rc = cairn_doc_begin(t->s->doc, cairn_store_now_ms(t->s));
    if (!rc)
        t->begun = 1;
    return rc;
}

static int put_locked(txctx *t, cairn_put_resp *resp, const cairn_put_req *req)
{
    cairn_store *s = t->s;
    kref prev;
    int had = latest_state(s, t, req->key, req->key_len, &prev);
    cairn_kv pkv;
    memset(&pkv, 0, sizeof pkv);
    int rc = 0;
    if (had && (req->prev_kv || req->ignore_value || req->ignore_lease)) {
        rc = materialise(s, t->arena, &prev, &pkv, 1);
        if (rc)
            return rc;
    }
    if ((req->ignore_value || req->ignore_lease) && !had)
        return CAIRN_EKEYNOTFOUND;
    const uint8_t *val = req->ignore_value ? pkv.value : req->value;
    size_t vl = req->ignore_value ? pkv.value_len : req->value_len;
    int64_t lease = req->ignore_lease ? pkv.lease : req->lease;
    uint8_t *rec = malloc(10 + vl);
    if (!rec)
        return CAIRN_ENOMEM;
    size_t rl = (size_t)(wire_put_uv(rec, (uint64_t)lease) - rec);
    if (vl)
        memcpy(rec + rl, val, vl);
    rl += vl;
    rc = tx_begin(t);
    if (!rc) {
        cairn_value v = {.type = CAIRN_V_BYTES};
        v.v.bytes.ptr = rec;
        v.v.bytes.len = rl;
        rc = cairn_doc_put(s->doc, s->kvs, req->key, req->key_len, &v);
    }
    free(rec);
    if (rc)
        return rc;
    if (!t->rev)
        t->rev = t->pre + 1;
    ov_entry *o = ov_upsert(t, req->key, req->key_len);
    if (!o)
        return CAIRN_ENOMEM;
    o->create_rev = had ? (prev.ov ? prev.ov->create_rev : prev.e->create_rev) : t->rev;
    o->version = had ? (prev.ov ? prev.ov->version : prev.e->version) + 1 : 1;
    o->lease = lease;
    o->live = 1;
    resp->header.revision = t->rev;
    if (had && req->prev_kv) {
        resp->prev_kv = cairn_store_arena_alloc(t->arena, sizeof *resp->prev_kv);
        if (!resp->prev_kv)
            return CAIRN_ENOMEM;
        *resp->prev_kv = pkv;
    }
    return 0;
}

static int delete_locked(txctx *t, cairn_delete_resp *resp, const cairn_delete_req *req)
{
    cairn_store *s = t->s;
    if (req->key_len == 0)
        return CAIRN_EEMPTYKEY;
    krange r;
    krange_of(&r, req->key, req->key_len, req->range_end, req->range_end_len);
    kref_vec refs = {0};
    int rc = gather(&refs, s, &r, s->rev, t);
    if (rc)
        goto out;
    if (refs.n && req->prev_kv) {
        resp->prev_kvs = cairn_store_arena_alloc(t->arena, refs.n * sizeof *resp->prev_kvs);
        if (!resp->prev_kvs) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < refs.n && !rc; i++)
            rc = materialise(s, t->arena, &refs.v[i], &resp->prev_kvs[i], 1);
        if (rc)
            goto out;
        resp->nprev_kvs = refs.n;
    }
    if (refs.n && (rc = tx_begin(t)))
        goto out;
    for (size_t i = 0; i < refs.n; i++) {
        /* refs point into the index or the overlay, neither of which the
         * document edit touches; copy the key before the overlay grows */
        const uint8_t *k = refs.v[i].key;
        size_t kl = refs.v[i].key_len;
        rc = cairn_doc_delete(s->doc, s->kvs, k, kl);
        if (rc)
            goto out;
        ov_entry *o = refs.v[i].ov ? (ov_entry *)refs.v[i].ov : ov_upsert(t, k, kl);
        if (!o) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
        o->live = 0;
        o->version = 0;
        o->lease = 0;
    }
    resp->deleted = (int64_t)refs.n;
    if (refs.n && !t->rev)
        t->rev = t->pre + 1;
    resp->header.revision = t->rev ? t->rev : t->pre;
out:
    free(refs.v);
    return rc;
}

/* Commits the document change (if any), checks the revision the observer
 * gave it, and queues the caller's completion. Rolls back on error. */
static int tx_finish(txctx *t, int rc, cairn_store_done_cb cb, void *arg)
{
    cairn_store *s = t->s;
    if (rc) {
        if (t->begun)
            cairn_doc_rollback(s->doc);
        return rc;
    }
    if (t->begun) {
        /* The observer queues the completion with the change's records, in
         * the one queue-lock round it takes anyway (one change per commit). */
        pend_wait *w = calloc(1, sizeof *w);
        if (!w) {
            cairn_doc_rollback(s->doc);
            return CAIRN_ENOMEM;
        }
        w->cb = cb;
        w->arg = arg;
        s->obs_wait = w;
        cairn_doc_observer obs;
        const cairn_change *c = NULL;
        rc = cairn_doc_commit(s->doc, &c, cairn_store_observer(s, &obs));
        w = s->obs_wait; /* NULL once queued */
        s->obs_wait = NULL;
        if (!rc)
            rc = s->obs_rc;
        if (rc) {
            free(w);
            return rc;
        }
        int64_t got = c ? s->last_change_rev : 0;
        if (got != t->rev) {
            cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "change took revision %lld, expected %lld",
                            (long long)got, (long long)t->rev);
            atomic_store(&s->failed, CAIRN_ECORRUPT);
            if (!w)
                return 0; /* queued: the completion reports the failure */
            free(w);
            return CAIRN_ECORRUPT;
        }
        if (!w)
            return 0;
        free(w);
    }
    return cairn_store_enqueue_wait(s, cb, arg, NULL);
}

static void tx_init(txctx *t, cairn_store *s, store_arena *a)
{
    memset(t, 0, sizeof *t);
    t->s = s;
    t->arena = a;
    t->pre = s->rev;
}

static int check_put(const cairn_put_req *req)
{
    /* etcd (v3rpc checkPutRequest) */
    if (req->key_len == 0)
        return CAIRN_EEMPTYKEY;
    if (req->ignore_value && req->value_len != 0)
        return CAIRN_EVALUEPROVIDED;
    if (req->ignore_lease && req->lease != 0)
        return CAIRN_ELEASEPROVIDED;
    return 0;
}

int cairn_store_put_async(cairn_store *s, cairn_put_resp *resp, const cairn_put_req *req,
                          cairn_store_done_cb cb, void *arg)
{
    memset(resp, 0, sizeof *resp);
    int rc = check_put(req);
    if (rc)
        return rc;
    store_arena *a = arena_new();
    if (!a)
        return CAIRN_ENOMEM;
    pthread_rwlock_wrlock(&s->rw);
    txctx t;
    tx_init(&t, s, a);
    rc = cairn_store_failed_rc(s);
    /* etcd: a Put outside a txn checks the lease before the key */
    if (!rc && req->lease != 0 && !lease_exists(s, req->lease))
        rc = CAIRN_ELEASENOTFOUND;
    if (!rc)
        rc = put_locked(&t, resp, req);
    cairn_store_fill_header(s, &resp->header, t.rev);
    resp->mem_ = a;
    rc = tx_finish(&t, rc, cb, arg);
    pthread_rwlock_unlock(&s->rw);
    free(t.ov);
    if (rc)
        cairn_put_resp_destroy(resp);
    return rc;
}

int cairn_store_delete_async(cairn_store *s, cairn_delete_resp *resp, const cairn_delete_req *req,
                             cairn_store_done_cb cb, void *arg)
{
    memset(resp, 0, sizeof *resp);
    if (req->key_len == 0)
        return CAIRN_EEMPTYKEY;
    store_arena *a = arena_new();
    if (!a)
        return CAIRN_ENOMEM;
    pthread_rwlock_wrlock(&s->rw);
    txctx t;
    tx_init(&t, s, a);
    int rc = cairn_store_failed_rc(s);
    if (!rc)
        rc = delete_locked(&t, resp, req);
    cairn_store_fill_header(s, &resp->header, t.rev ? t.rev : t.pre);
    resp->mem_ = a;
    rc = tx_finish(&t, rc, cb, arg);
    pthread_rwlock_unlock(&s->rw);
    free(t.ov);
    if (rc)
        cairn_delete_resp_destroy(resp);
    return rc;
}

/* ---- Txn ---------------------------------------------------------------------------- */

/* etcd (v3rpc checkTxnRequest): the largest of compares / success / failure
 * counts against the limit, and a nested txn gets what is left of it. */
static int check_txn_static(const cairn_txn_req *r, int64_t max_ops);

static int check_op_static(const cairn_request_op *op, int64_t max_ops)
{
    switch (op->type) {
    case CAIRN_REQ_RANGE:
        return op->u.range.key_len ? 0 : CAIRN_EEMPTYKEY;
    case CAIRN_REQ_PUT:
        return check_put(&op->u.put);
    case CAIRN_REQ_DELETE:
        return op->u.del.key_len ? 0 : CAIRN_EEMPTYKEY;
    case CAIRN_REQ_TXN:
        return op->u.txn ? check_txn_static(op->u.txn, max_ops) : CAIRN_EINVAL;
    default:
        return CAIRN_EINVAL;
    }
}

static int check_txn_static(const cairn_txn_req *r, int64_t max_ops)
{
    size_t opc = r->ncompare;
    if (opc < r->nsuccess)
        opc = r->nsuccess;
    if (opc < r->nfailure)
        opc = r->nfailure;
    if ((int64_t)opc > max_ops)
        return CAIRN_ETOOMANYOPS;
    for (size_t i = 0; i < r->ncompare; i++)
        if (r->compare[i].key_len == 0)
            return CAIRN_EEMPTYKEY;
    int rc;
    for (size_t i = 0; i < r->nsuccess; i++)
        if ((rc = check_op_static(&r->success[i], max_ops - (int64_t)opc)))
            return rc;
    for (size_t i = 0; i < r->nfailure; i++)
        if ((rc = check_op_static(&r->failure[i], max_ops - (int64_t)opc)))
            return rc;
    return 0;
}

/* Overlapping writes (etcd's checkIntervals): a put may not hit a key put
 * elsewhere in the same request or inside a deleted range; reads and
 * delete/delete overlaps are fine; the success and failure branches of one
 * nested txn may put the same key. A delete's interval is [key, range_end)
 * taken literally, so range_end "\0" covers nothing here (measured). */
typedef struct ivl {
    const uint8_t *k, *e;
    size_t kl, el; /* el == 0 && !e: point */
} ivl;
typedef struct ivset {
    ivl *v;
    size_t n, cap;
} ivset;

static int ivs_push(ivset *s, ivl x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        ivl *n = realloc(s->v, cap * sizeof *n);
        if (!n)
            return CAIRN_ENOMEM;
        s->v = n;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

static int ivs_has_key(const ivset *s, const uint8_t *k, size_t kl)
{
    for (size_t i = 0; i < s->n; i++)
        if (cairn_store_keycmp(s->v[i].k, s->v[i].kl, k, kl) == 0)
            return 1;
    return 0;
}

static int dels_hit(const ivset *d, const uint8_t *k, size_t kl)
{
    for (size_t i = 0; i < d->n; i++) {
        const ivl *x = &d->v[i];
        if (!x->e) {
            if (cairn_store_keycmp(x->k, x->kl, k, kl) == 0)
                return 1;
        } else if (cairn_store_keycmp(k, kl, x->k, x->kl) >= 0 &&
                   cairn_store_keycmp(k, kl, x->e, x->el) < 0) {
            return 1;
        }
    }
    return 0;
}

static int check_intervals(const cairn_request_op *ops, size_t n, ivset *puts, ivset *dels)
{
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (ops[i].type != CAIRN_REQ_DELETE)
            continue;
        const cairn_delete_req *d = &ops[i].u.del;
        ivl x = {d->key, d->range_end_len ? d->range_end : NULL, d->key_len, d->range_end_len};
        if ((rc = ivs_push(dels, x)))
            return rc;
    }
    for (size_t i = 0; i < n; i++) {
        if (ops[i].type != CAIRN_REQ_TXN || !ops[i].u.txn)
            continue;
        const cairn_txn_req *t = ops[i].u.txn;
        ivset pt = {0}, dt = {0}, pe = {0}, de = {0};
        rc = check_intervals(t->success, t->nsuccess, &pt, &dt);
        if (!rc)
            rc = check_intervals(t->failure, t->nfailure, &pe, &de);
        for (size_t j = 0; j < pt.n && !rc; j++) {
            if (ivs_has_key(puts, pt.v[j].k, pt.v[j].kl) || dels_hit(dels, pt.v[j].k, pt.v[j].kl))
                rc = CAIRN_EDUPKEY;
            else
                rc = ivs_push(puts, pt.v[j]);
        }
        for (size_t j = 0; j < pe.n && !rc; j++) {
            const ivl *x = &pe.v[j];
            if ((ivs_has_key(puts, x->k, x->kl) && !ivs_has_key(&pt, x->k, x->kl)) ||
                dels_hit(dels, x->k, x->kl))
                rc = CAIRN_EDUPKEY;
            else
                rc = ivs_push(puts, *x);
        }
        for (size_t j = 0; j < dt.n && !rc; j++)
            rc = ivs_push(dels, dt.v[j]);
        for (size_t j = 0; j < de.n && !rc; j++)
            rc = ivs_push(dels, de.v[j]);
        free(pt.v);
        free(dt.v);
        free(pe.v);
        free(de.v);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < n; i++) {
        if (ops[i].type != CAIRN_REQ_PUT)
            continue;
        const cairn_put_req *p = &ops[i].u.put;
        if (ivs_has_key(puts, p->key, p->key_len) || dels_hit(dels, p->key, p->key_len))
            return CAIRN_EDUPKEY;
        ivl x = {p->key, NULL, p->key_len, 0};
        if ((rc = ivs_push(puts, x)))
            return rc;
    }
    return 0;
}

static int check_intervals_top(const cairn_request_op *ops, size_t n)
{
    ivset p = {0}, d = {0};
    int rc = check_intervals(ops, n, &p, &d);
    free(p.v);
    free(d.v);
    return rc;
}

static int txn_is_write(const cairn_txn_req *r)
{
    for (int b = 0; b < 2; b++) {
        const cairn_request_op *ops = b ? r->failure : r->success;
        size_t n = b ? r->nfailure : r->nsuccess;
        for (size_t i = 0; i < n; i++) {
            if (ops[i].type == CAIRN_REQ_PUT || ops[i].type == CAIRN_REQ_DELETE)
                return 1;
            if (ops[i].type == CAIRN_REQ_TXN && ops[i].u.txn && txn_is_write(ops[i].u.txn))
                return 1;
        }
    }
    return 0;
}

/* One compare against the state before the transaction (etcd applyCompare). */
static int compare_one(cairn_store *s, store_arena *a, const cairn_compare *c, int *ok)
{
    krange r;
    krange_of(&r, c->key, c->key_len, c->range_end, c->range_end_len);
    kref_vec refs = {0};
    int rc = gather(&refs, s, &r, s->rev, NULL);
    if (rc)
        goto out;
    cairn_kv zero;
    memset(&zero, 0, sizeof zero);
    size_t n = refs.n ? refs.n : 1;
    if (refs.n == 0 && c->target == CAIRN_CMP_VALUE) {
        /* etcd: a value compare on a missing key is always false */
        *ok = 0;
        goto out;
    }
    *ok = 1;
    for (size_t i = 0; i < n && *ok; i++) {
        cairn_kv kv = zero;
        if (refs.n) {
            rc = materialise(s, a, &refs.v[i], &kv, c->target == CAIRN_CMP_VALUE);
            if (rc)
                goto out;
        }
        int res = 0;
        switch (c->target) {
        case CAIRN_CMP_VALUE:
            res = cairn_store_keycmp(kv.value, kv.value_len, c->value, c->value_len);
            break;
        case CAIRN_CMP_CREATE:
            res = cmp_i64(kv.create_revision, c->create_revision);
            break;
        case CAIRN_CMP_MOD:
            res = cmp_i64(kv.mod_revision, c->mod_revision);
            break;
        case CAIRN_CMP_VERSION:
            res = cmp_i64(kv.version, c->version);
            break;
        case CAIRN_CMP_LEASE:
            res = cmp_i64(kv.lease, c->lease);
            break;
        default:
            break;
        }
        switch (c->result) {
        case CAIRN_CMP_EQUAL:
            *ok = res == 0;
            break;
        case CAIRN_CMP_NOT_EQUAL:
            *ok = res != 0;
            break;
        case CAIRN_CMP_GREATER:
            *ok = res > 0;
            break;
        case CAIRN_CMP_LESS:
            *ok = res < 0;
            break;
        default:
            break; /* etcd: an unknown result compares true */
        }
    }
out:
    free(refs.v);
    return rc;
}

/* The path: for the txn and every nested txn on the executed branches (in
 * depth-first order), whether its compares held. */
typedef struct tpath {
    uint8_t *v;
    size_t n, cap;
} tpath;

static int path_build(cairn_store *s, store_arena *a, const cairn_txn_req *r, tpath *p)
{
    int ok = 1, rc;
    for (size_t i = 0; i < r->ncompare && ok; i++)
        if ((rc = compare_one(s, a, &r->compare[i], &ok)))
            return rc;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        uint8_t *n = realloc(p->v, cap);
        if (!n)
            return CAIRN_ENOMEM;
        p->v = n;
        p->cap = cap;
    }
    p->v[p->n++] = (uint8_t)ok;
    const cairn_request_op *ops = ok ? r->success : r->failure;
    size_t n = ok ? r->nsuccess : r->nfailure;
    for (size_t i = 0; i < n; i++)
        if (ops[i].type == CAIRN_REQ_TXN && (rc = path_build(s, a, ops[i].u.txn, p)))
            return rc;
    return 0;
}

/* etcd checkRequests over the path: |what| 0 = puts, 1 = ranges. */
static int path_check(cairn_store *s, const cairn_txn_req *r, const tpath *p, size_t *at, int what)
{
    int ok = p->v[(*at)++];
    const cairn_request_op *ops = ok ? r->success : r->failure;
    size_t n = ok ? r->nsuccess : r->nfailure;
    int rc;
    for (size_t i = 0; i < n; i++) {
        const cairn_request_op *op = &ops[i];
        if (op->type == CAIRN_REQ_TXN) {
            if ((rc = path_check(s, op->u.txn, p, at, what)))
                return rc;
        } else if (what == 0 && op->type == CAIRN_REQ_PUT) {
            const cairn_put_req *q = &op->u.put;
            if (q->ignore_value || q->ignore_lease) {
                /* etcd: against the state before the txn */
                kentry *e = cairn_kindex_find(&s->idx, q->key, q->key_len);
                if (!e || !kentry_live(e))
                    return CAIRN_EKEYNOTFOUND;
            }
            if (q->lease != 0 && !lease_exists(s, q->lease))
                return CAIRN_ELEASENOTFOUND;
        } else if (what == 1 && op->type == CAIRN_REQ_RANGE) {
            if ((rc = check_rev(s, op->u.range.revision, s->rev)))
                return rc;
        }
    }
    return 0;
}

static int txn_apply(txctx *t, const cairn_txn_req *r, cairn_txn_resp *resp, const tpath *p,
                     size_t *at)
{
    int ok = p->v[(*at)++];
    const cairn_request_op *ops = ok ? r->success : r->failure;
    size_t n = ok ? r->nsuccess : r->nfailure;
    resp->succeeded = ok;
    resp->nresponses = n;
    resp->responses = n ? cairn_store_arena_alloc(t->arena, n * sizeof *resp->responses) : NULL;
    if (n && !resp->responses)
        return CAIRN_ENOMEM;
    if (n)
        memset(resp->responses, 0, n * sizeof *resp->responses);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        cairn_response_op *ro = &resp->responses[i];
        ro->type = ops[i].type;
        switch (ops[i].type) {
        case CAIRN_REQ_RANGE: {
            int64_t cur = t->rev ? t->rev : t->pre;
            rc = range_locked(t->s, t->arena, &ro->u.range, &ops[i].u.range, cur, t);
            /* etcd: inner headers carry only the revision of that moment */
            ro->u.range.header.revision = cur;
            break;
        }
        case CAIRN_REQ_PUT:
            rc = put_locked(t, &ro->u.put, &ops[i].u.put);
            break;
        case CAIRN_REQ_DELETE:
            rc = delete_locked(t, &ro->u.del, &ops[i].u.del);
            break;
        case CAIRN_REQ_TXN:
            ro->u.txn = cairn_store_arena_alloc(t->arena, sizeof *ro->u.txn);
            if (!ro->u.txn)
                return CAIRN_ENOMEM;
            memset(ro->u.txn, 0, sizeof *ro->u.txn);
            /* etcd: a nested txn's header is empty */
            rc = txn_apply(t, ops[i].u.txn, ro->u.txn, p, at);
            break;
        default:
            rc = CAIRN_EINVAL;
        }
    }
    return rc;
}

int cairn_store_txn_async(cairn_store *s, cairn_txn_resp *resp, const cairn_txn_req *req,
                          cairn_store_done_cb cb, void *arg)
{
    memset(resp, 0, sizeof *resp);
    int rc = check_txn_static(req, s->max_txn_ops);
    if (!rc)
        rc = check_intervals_top(req->success, req->nsuccess);
    if (!rc)
        rc = check_intervals_top(req->failure, req->nfailure);
    if (rc)
        return rc;
    store_arena *a = arena_new();
    if (!a)
        return CAIRN_ENOMEM;
    tpath p = {0};
    pthread_rwlock_wrlock(&s->rw);
    txctx t;
    tx_init(&t, s, a);
    rc = cairn_store_failed_rc(s);
    if (!rc)
        rc = path_build(s, a, req, &p);
    size_t at = 0;
    if (!rc && txn_is_write(req))
        rc = path_check(s, req, &p, &at, 0);
    at = 0;
    if (!rc)
        rc = path_check(s, req, &p, &at, 1);
    at = 0;
    if (!rc)
        rc = txn_apply(&t, req, resp, &p, &at);
    cairn_store_fill_header(s, &resp->header, t.rev ? t.rev : t.pre);
    resp->mem_ = a;
    rc = tx_finish(&t, rc, cb, arg);
    pthread_rwlock_unlock(&s->rw);
    free(t.ov);
    free(p.v);
    if (rc)
        cairn_txn_resp_destroy(resp);
    return rc;
}

/* ---- blocking wrappers ------------------------------------------------------------- */

int cairn_store_put(cairn_store *s, cairn_put_resp *resp, const cairn_put_req *req)
{
    SYNC_CALL(cairn_store_put_async(s, resp, req, cairn_store_sync_done, &w_),
              cairn_put_resp_destroy(resp));
}

int cairn_store_delete(cairn_store *s, cairn_delete_resp *resp, const cairn_delete_req *req)
{
    SYNC_CALL(cairn_store_delete_async(s, resp, req, cairn_store_sync_done, &w_),
              cairn_delete_resp_destroy(resp));
}

int cairn_store_txn(cairn_store *s, cairn_txn_resp *resp, const cairn_txn_req *req)
{
    SYNC_CALL(cairn_store_txn_async(s, resp, req, cairn_store_sync_done, &w_),
              cairn_txn_resp_destroy(resp));
}

uint64_t cairn_store_key_count(cairn_store *s)
{
    size_t n = 0;
    pthread_rwlock_rdlock(&s->rw);
    if (s->kvs_known && cairn_doc_length(s->doc, &n, s->kvs) != 0)
        n = 0;
    pthread_rwlock_unlock(&s->rw);
    return n;
}
