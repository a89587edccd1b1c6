/*
 * The store's answers to the Replication service (replica.h): local
 * revision <-> change hash, the key space at a set of heads, and whether a
 * peer's acknowledged heads cover a state. A revision names a state only on
 * this node; a set of heads names it on every node that has those changes.
 *
 * Range at heads. The heads' causal past is a set of changes. When it is a
 * prefix of this node's apply order (the usual case: the heads are ours, or
 * an older state of ours), the state is a local revision — the newest one
 * made inside the prefix, since the changes after it made no revision and
 * so left the key space alone — and history serves it like any read at a
 * revision. Otherwise some change outside the past was applied here before
 * one inside it, and no revision is that state: the past is replayed, in
 * apply order (a topological order, so the same document on every node,
 * whatever order each applied concurrent changes in), into a scratch
 * document. A replay costs the whole past, so it is bounded (EREPLAY); a
 * compacted revision falls back to it too, since change bodies outlive
 * compaction.
 *
 * Locks: the DAG is read under cairn_store_doc_read_lock (replica.c); the
 * history read and the replay's reads of the scratch document run after it
 * is released (the scratch document is ours alone).
 */

#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "store/replica.h"
#include "store/store_int.h"

int cairn_store_rev_to_hash(cairn_store *s, cairn_hash *out, int64_t rev)
{
    memset(out, 0, sizeof *out);
    if (rev > atomic_load(&s->visible))
        return CAIRN_EFUTUREREV;
    uint64_t index;
    if (rev <= 1 || cairn_revmap_find(&s->rm, &index, rev))
        return CAIRN_ENOTFOUND;
    int rc = cairn_store_doc_read_lock(s, 0);
    if (rc)
        return rc;
    const cairn_hash *h = cairn_dag_hash_at(cairn_doc_dag(s->doc), index);
    if (h)
        *out = *h;
    else
        rc = CAIRN_ECORRUPT;
    cairn_store_doc_read_unlock(s);
    return rc;
}

int cairn_store_hash_to_rev(cairn_store *s, int64_t *rev, int *took, const cairn_hash *h)
{
    *rev = 0;
    *took = 0;
    int rc = cairn_store_doc_read_lock(s, 1);
    if (rc)
        return rc;
    uint64_t index;
    if (cairn_dag_find(cairn_doc_dag(s->doc), h, &index))
        rc = CAIRN_ENOTHERE;
    else
        *took = cairn_revmap_rev_of(&s->rm, rev, index);
    cairn_store_doc_read_unlock(s);
    return rc;
}

/* Under the doc lock: the first of |heads| not ordered here. */
static int find_missing(const cairn_dag *d, const cairn_hash *heads, size_t n, cairn_hash *missing)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t ix;
        if (cairn_dag_find(d, &heads[i], &ix)) {
            if (missing)
                *missing = heads[i];
            return CAIRN_ENOTHERE;
        }
    }
    return 0;
}

int cairn_store_heads_here(cairn_store *s, const cairn_hash *heads, size_t n, cairn_hash *missing)
{
    int rc = cairn_store_doc_read_lock(s, 1);
    if (rc)
        return rc;
    rc = find_missing(cairn_doc_dag(s->doc), heads, n, missing);
    cairn_store_doc_read_unlock(s);
    return rc;
}

int cairn_store_heads_cover(cairn_store *s, const cairn_hash *want, size_t nwant,
                            const cairn_hash *have, size_t nhave)
{
    int rc = cairn_store_doc_read_lock(s, 0);
    if (rc)
        return rc;
    const cairn_dag *d = cairn_doc_dag(s->doc);
    int all = 1;
    for (size_t i = 0; i < nwant && all; i++)
        all = cairn_dag_has(d, &want[i]) == 1 && cairn_dag_is_ancestor(d, &want[i], have, nhave);
    cairn_store_doc_read_unlock(s);
    return all;
}

/* ---- range at heads --------------------------------------------------------- */

void cairn_heads_range_destroy(cairn_heads_range *r)
{
    for (size_t i = 0; i < r->nkvs; i++) {
        free(r->kvs[i].key);
        free(r->kvs[i].value);
    }
    free(r->kvs);
    memset(r, 0, sizeof *r);
}

/* etcd's range rules: range_end empty = |key| alone; "\0" = every key >=
 * |key|; else [key, range_end). */
static int in_range(const cairn_range_req *q, const uint8_t *k, size_t kl)
{
    if (!q->range_end_len)
        return cairn_store_keycmp(k, kl, q->key, q->key_len) == 0;
    if (cairn_store_keycmp(k, kl, q->key, q->key_len) < 0)
        return 0;
    if (q->range_end_len == 1 && q->range_end[0] == 0)
        return 1;
    return cairn_store_keycmp(k, kl, q->range_end, q->range_end_len) < 0;
}

static int push_kv(cairn_heads_range *r, size_t *cap, const uint8_t *k, size_t kl, const uint8_t *v,
                   size_t vl, int64_t lease, int keys_only)
{
    if (r->nkvs == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        cairn_heads_kv *p = realloc(r->kvs, nc * sizeof *p);
        if (!p)
            return CAIRN_ENOMEM;
        r->kvs = p;
        *cap = nc;
    }
    cairn_heads_kv *e = &r->kvs[r->nkvs];
    memset(e, 0, sizeof *e);
    e->key = malloc(kl ? kl : 1);
    if (!e->key)
        return CAIRN_ENOMEM;
    memcpy(e->key, k, kl);
    e->key_len = kl;
    e->lease = lease;
    r->nkvs++;
    if (!keys_only) {
        e->value = malloc(vl ? vl : 1);
        if (!e->value)
            return CAIRN_ENOMEM;
        if (vl)
            memcpy(e->value, v, vl);
        e->value_len = vl;
    }
    return 0;
}

typedef struct collect {
    const cairn_range_req *q;
    cairn_heads_range *r;
    size_t cap;
    int rc;
} collect;

static int collect_cb(void *arg, const uint8_t *key, size_t key_len, const cairn_read *value)
{
    collect *c = arg;
    if (!in_range(c->q, key, key_len))
        return 0;
    const uint8_t *v = (const uint8_t *)"";
    size_t vl = 0;
    int64_t lease = 0;
    if (value->kind == CAIRN_READ_SCALAR)
        cairn_store_parse_record(&value->value, &lease, &v, &vl);
    c->rc = push_kv(c->r, &c->cap, key, key_len, v, vl, lease, c->q->keys_only);
    return c->rc ? 1 : 0;
}

static int kv_order(const void *a, const void *b)
{
    const cairn_heads_kv *x = a, *y = b;
    return cairn_store_keycmp(x->key, x->key_len, y->key, y->key_len);
}

/* The key space of the scratch document |d| in |q|'s range. */
static int read_scratch(cairn_heads_range *r, cairn_doc *d, const cairn_range_req *q)
{
    cairn_objid kvs;
    if (cairn_store_find_root_map(d, &kvs, "kvs"))
        return 0; /* before the genesis: no keys */
    collect c = {q, r, 0, 0};
    int rc = cairn_doc_map_foreach(d, kvs, collect_cb, &c);
    if (c.rc)
        return c.rc;
    if (rc)
        return rc;
    qsort(r->kvs, r->nkvs, sizeof *r->kvs, kv_order);
    r->count = (int64_t)r->nkvs;
    if (q->limit > 0 && r->nkvs > (size_t)q->limit) {
        for (size_t i = (size_t)q->limit; i < r->nkvs; i++) {
            free(r->kvs[i].key);
            free(r->kvs[i].value);
        }
        r->nkvs = (size_t)q->limit;
        r->more = 1;
    }
    return 0;
}

/* History at |rev|, copied out. */
static int read_history(cairn_heads_range *r, cairn_store *s, const cairn_range_req *q, int64_t rev)
{
    cairn_range_req h = {0};
    h.key = q->key;
    h.key_len = q->key_len;
    h.range_end = q->range_end;
    h.range_end_len = q->range_end_len;
    h.limit = q->limit;
    h.keys_only = q->keys_only;
    h.revision = rev;
    cairn_range_resp resp;
    memset(&resp, 0, sizeof resp);
    int rc = cairn_store_range(s, &resp, &h);
    size_t cap = 0;
    for (size_t i = 0; !rc && i < resp.nkvs; i++) {
        const cairn_kv *kv = &resp.kvs[i];
        rc = push_kv(r, &cap, kv->key, kv->key_len, kv->value, kv->value_len, kv->lease,
                     q->keys_only);
    }
    if (!rc) {
        r->more = resp.more;
        r->count = resp.count;
        r->revision = rev;
    }
    cairn_range_resp_destroy(&resp);
    return rc;
}

int cairn_store_range_at_heads(cairn_store *s, cairn_heads_range *out, const cairn_hash *heads,
                               size_t nheads, const cairn_range_req *req, uint64_t max_replay,
                               cairn_hash *missing)
{
    memset(out, 0, sizeof *out);
    if (!nheads)
        return CAIRN_EINVAL;
    if (!req->key_len)
        return CAIRN_EEMPTYKEY;
    if (!max_replay)
        max_replay = CAIRN_STORE_REPLAY_MAX;
    int rc = cairn_store_doc_read_lock(s, 1);
    if (rc)
        return rc;
    const cairn_dag *d = cairn_doc_dag(s->doc);
    uint64_t *anc = NULL;
    size_t n = 0;
    int64_t rev = 0;
    rc = find_missing(d, heads, nheads, missing);
    if (!rc)
        rc = cairn_dag_ancestors(&anc, &n, d, heads, nheads);
    if (!rc && n && anc[n - 1] == n - 1) /* ascending and distinct: 0..n-1 */
        cairn_revmap_rev_of(&s->rm, &rev, n - 1);
    cairn_doc *scratch = NULL;
    if (!rc && !rev) {
        if (n > max_replay)
            rc = CAIRN_EREPLAY;
        else
            rc = cairn_doc_new_at(&scratch, s->doc, heads, nheads);
    }
    cairn_store_doc_read_unlock(s);
    free(anc);
    if (!rc && rev) {
        rc = read_history(out, s, req, rev);
        if (rc == CAIRN_ECOMPACTED) { /* bodies outlive compaction: replay */
            cairn_heads_range_destroy(out);
            rc = cairn_store_doc_read_lock(s, 0);
            if (!rc) {
                rc = n > max_replay ? CAIRN_EREPLAY
                                    : cairn_doc_new_at(&scratch, s->doc, heads, nheads);
                cairn_store_doc_read_unlock(s);
            }
        }
    }
    if (!rc && scratch) {
        rc = read_scratch(out, scratch, req);
        out->replayed = 1;
    }
    cairn_doc_free(scratch);
    if (rc)
        cairn_heads_range_destroy(out);
    return rc;
}
