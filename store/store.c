/*
 * The store's spine: opening and recovering the LevelDB database, the
 * document observer that turns applied changes into revisions, index entries
 * and disk records, the group-commit thread, compaction and the replication
 * entry point. Ranges and transactions live in kv.c, leases in lease.c.
 *
 * One path for every change. A local write is built with cairn_doc_begin /
 * put / delete / commit; a peer's change goes through cairn_doc_receive;
 * recovery replays the stored apply order through cairn_doc_receive. In all
 * three the doc reports the change to the observer below, which decides the
 * revision (the next one iff a key's visible value changed), updates the key
 * index and appends the change's records to the pending WriteBatch: its
 * body and one history record per event, which names the op in the body that
 * set the value instead of copying it (store.h: ON-DISK LAYOUT). Because
 * recovery runs the same code over the same order, it re-derives the same
 * revisions (and the revision -> change map); it checks them against the
 * stored ones. A checkpoint (checkpoint.c) memoises what that replay derives
 * up to some change; open loads it after checking it against the stored
 * changes and replays the rest the same way, or replays everything.
 *
 * Concurrency. Writers take the rwlock's write side for in-memory work only;
 * the observer appends records to the shared batch under the queue mutex.
 * The committer thread swaps the batch out, writes it with sync=true (one
 * fsync for everything queued meanwhile: group commit), then publishes the
 * new visible revision and completes the waiting callers in order. Readers
 * hold the read side and filter by the visible revision, so they never see
 * a change whose batch is not durable; the committer never takes the
 * rwlock, so a writer may wait for it while holding the write side.
 */

#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np: writers must not starve */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crdt/error.h"
#include "crdt/wire.h"
#include "store/store_int.h"

#define FORMAT_VERSION 3u
#define FORMAT_V1 1u    /* older: also 'C' and 'R' records, values in 'K' (opens; see open) */
#define FORMAT_V2 2u    /* older: history records under 'K' rev (opens; see open) */
#define KREC_TOMB 1     /* history record flag: the key was deleted at this revision */
#define KREC_BODY 2     /* history record flag: the value is op |pos| of the change's body */
#define KREC_KEY_HDR 10 /* a history record's key: 'O' index u64 BE 'K', then the key */

/* Writes the first KREC_KEY_HDR bytes of the history record key of change
 * |index| (store.h: ON-DISK LAYOUT). */
static void krec_key_hdr(uint8_t *k, uint64_t index)
{
    k[0] = 'O';
    cairn_store_be64(k + 1, index);
    k[9] = 'K';
}

static const char GENESIS_SALT[] = "cairn-genesis";

/* ---- identity ---------------------------------------------------------------- */

static int strcmp_p(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

uint64_t cairn_store_member_id_of(const char *const *peer_urls, size_t n, const char *token)
{
    /* etcd: sha1(sorted peer URLs ++ cluster token), first 8 bytes BE */
    const char **s = malloc((n ? n : 1) * sizeof *s);
    store_buf b = {0};
    uint64_t id = 0;
    if (!s)
        return 0;
    memcpy(s, peer_urls, n * sizeof *s);
    qsort(s, n, sizeof *s, strcmp_p);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = cairn_store_buf_put(&b, s[i], strlen(s[i]));
    if (!rc && token)
        rc = cairn_store_buf_put(&b, token, strlen(token));
    if (!rc) {
        uint8_t h[20];
        cairn_store_sha1(h, b.p ? b.p : (const uint8_t *)"", b.len);
        id = cairn_store_get_be64(h);
    }
    cairn_store_buf_free(&b);
    free(s);
    return id;
}

static int u64cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t cairn_store_cluster_id_of(const uint64_t *member_ids, size_t n)
{
    /* etcd: sha1(sorted member ids, 8 bytes BE each), first 8 bytes BE */
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    uint8_t *b = malloc((n ? n : 1) * 8);
    uint64_t id = 0;
    if (ids && b) {
        memcpy(ids, member_ids, n * sizeof *ids);
        qsort(ids, n, sizeof *ids, u64cmp);
        for (size_t i = 0; i < n; i++)
            cairn_store_be64(b + 8 * i, ids[i]);
        uint8_t h[20];
        cairn_store_sha1(h, b, 8 * n);
        id = cairn_store_get_be64(h);
    }
    free(ids);
    free(b);
    return id;
}

/* ---- small pieces --------------------------------------------------------------- */

void cairn_store_options_init(cairn_store_options *o)
{
    memset(o, 0, sizeof *o);
    o->name = "default";
    o->cluster_token = "etcd-cluster";
    o->max_txn_ops = 128;              /* etcd: --max-txn-ops default */
    o->lease_min_ttl = 2;              /* etcd: 1.5 x the 1 s election timeout, rounded up */
    o->lease_restart_extend_ms = 1000; /* etcd: Promote(election timeout) */
    o->cache_bytes = 8u << 20;
    o->write_buffer_bytes = 4u << 20; /* LevelDB's default; 16 MiB held ~13 MB more at 1M keys */
}

static uint64_t real_clock_ms(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void cairn_store_log(cairn_store *s, int level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s->log_cb)
        s->log_cb(s->log_arg, level, msg);
    else
        fprintf(stderr, "cairn store: %s\n", msg);
}

uint64_t cairn_store_now_ms(cairn_store *s)
{
    return s->clock_ms(s->clock_arg);
}

int cairn_store_failed_rc(cairn_store *s)
{
    return atomic_load(&s->failed);
}

void cairn_store_fill_header(const cairn_store *s, cairn_header *h, int64_t rev)
{
    h->cluster_id = s->cluster_id;
    h->member_id = s->member_id;
    h->revision = rev;
    h->raft_term = 2; /* etcd: a fresh single-member cluster answers raft_term 2 */
}

void cairn_store_header(cairn_store *s, cairn_header *h)
{
    cairn_store_fill_header(s, h, atomic_load(&s->visible));
}

uint64_t cairn_store_member_id(const cairn_store *s)
{
    return s->member_id;
}

uint64_t cairn_store_cluster_id(const cairn_store *s)
{
    return s->cluster_id;
}

void cairn_store_actor(const cairn_store *s, cairn_actor *out)
{
    *out = s->actor;
}

int64_t cairn_store_compacted_rev(cairn_store *s)
{
    pthread_rwlock_rdlock(&s->rw);
    int64_t c = s->compacted;
    pthread_rwlock_unlock(&s->rw);
    return c < 0 ? 0 : c;
}

void cairn_store_parse_record(const cairn_value *v, int64_t *lease, const uint8_t **val,
                              size_t *val_len)
{
    *lease = 0;
    *val = (const uint8_t *)"";
    *val_len = 0;
    if (v->type != CAIRN_V_BYTES && v->type != CAIRN_V_STR)
        return;
    wire_rd r = {v->v.bytes.ptr, v->v.bytes.ptr + v->v.bytes.len};
    uint64_t l;
    if (wire_uv(&r, &l) != 0) { /* truncated, overlong or past 64 bits */
        *val = v->v.bytes.ptr;
        *val_len = v->v.bytes.len;
        return;
    }
    *lease = (int64_t)l;
    *val = r.p;
    *val_len = wire_left(&r);
}

/* ---- LevelDB helpers -------------------------------------------------------------- */

static int db_err(cairn_store *s, char *err)
{
    if (!err)
        return 0;
    int rc = (strstr(err, "Corruption") || strstr(err, "corrupt")) ? CAIRN_ECORRUPT : CAIRN_EIO;
    cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "leveldb: %s", err);
    leveldb_free(err);
    return rc;
}

/* Every corruption is reported with what was wrong, then returned. */
static int corrupt(cairn_store *s, const char *what)
{
    cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "corrupt database: %s", what);
    return CAIRN_ECORRUPT;
}

static void meta_key(uint8_t *k, size_t *kl, const char *name)
{
    k[0] = 'M';
    size_t n = strlen(name);
    memcpy(k + 1, name, n);
    *kl = n + 1;
}

/* Gets 'M' name into a new buffer (*v, caller frees with leveldb_free). */
static int meta_get(cairn_store *s, const char *name, char **v, size_t *vl)
{
    uint8_t k[64];
    size_t kl;
    meta_key(k, &kl, name);
    char *err = NULL;
    *v = leveldb_get(s->db, s->ropt, (const char *)k, kl, vl, &err);
    return db_err(s, err);
}

static void meta_put(leveldb_writebatch_t *b, const char *name, const void *v, size_t vl)
{
    uint8_t k[64];
    size_t kl;
    meta_key(k, &kl, name);
    leveldb_writebatch_put(b, (const char *)k, kl, v, vl);
}

/* The 'O' record of change |index| (rev u64 BE ++ canonical bytes): *v is
 * NULL if there is none (leveldb_free it otherwise). */
static int get_orec(cairn_store *s, const leveldb_readoptions_t *ro, uint64_t index, char **v,
                    size_t *vl)
{
    uint8_t k[9];
    k[0] = 'O';
    cairn_store_be64(k + 1, index);
    char *err = NULL;
    *vl = 0;
    *v = leveldb_get(s->db, ro, (const char *)k, 9, vl, &err);
    return db_err(s, err);
}

/* get_orec for the change that made |rev|: a missing record, or one that
 * made another revision, is corruption ('O' is never deleted). */
static int get_orec_of_rev(cairn_store *s, const leveldb_readoptions_t *ro, uint64_t index,
                           int64_t rev, char **v, size_t *vl)
{
    int rc = get_orec(s, ro, index, v, vl);
    if (rc)
        return rc;
    if (!*v || *vl < 8 || (int64_t)cairn_store_get_be64((const uint8_t *)*v) != rev) {
        leveldb_free(*v);
        *v = NULL;
        return corrupt(s, "the change of a revision is missing or made another revision");
    }
    return 0;
}

/* The document's body loader (cairn_dag_load_cb): the DAG keeps no change
 * bodies, so sync and reads at past heads get them from the 'O' record of
 * their apply index; the DAG checks the hash. Only durable changes are
 * there: a change still in the pending batch reads as CAIRN_ENOTFOUND. */
static int load_body(void *arg, uint64_t index, uint8_t **bytes, size_t *len)
{
    cairn_store *s = arg;
    char *v;
    size_t vl;
    int rc = get_orec(s, s->ropt, index, &v, &vl);
    if (rc)
        return rc;
    if (!v)
        return CAIRN_ENOTFOUND;
    uint8_t *b = vl > 8 ? malloc(vl - 8) : NULL;
    if (b)
        memcpy(b, v + 8, vl - 8);
    leveldb_free(v);
    if (!b)
        return vl > 8 ? CAIRN_ENOMEM : corrupt(s, "short change record");
    *bytes = b;
    *len = vl - 8;
    return 0;
}

/* A new document for |s| that loads change bodies from 'O'. */
static int new_doc(cairn_store *s)
{
    int rc = cairn_doc_new(&s->doc, &s->actor);
    if (!rc)
        rc = cairn_doc_set_loader(s->doc, load_body, s);
    return rc;
}

static void meta_put_u64(leveldb_writebatch_t *b, const char *name, uint64_t v)
{
    uint8_t x[8];
    cairn_store_be64(x, v);
    meta_put(b, name, x, 8);
}

/* The change that made a revision, decoded, kept while the next lookups
 * name the same one (a history scan reads every event of a revision). */
typedef struct body_cache {
    uint64_t index;
    cairn_change *c;
} body_cache;

static void body_cache_free(body_cache *bc)
{
    if (bc->c)
        cairn_change_free(bc->c);
    bc->c = NULL;
}

/* Makes |bc| hold change |index|, decoded from its 'O' value |v| (rev u64
 * BE ++ canonical bytes; |vl| >= 8). */
static int body_cache_load(cairn_store *s, body_cache *bc, uint64_t index, const uint8_t *v,
                           size_t vl)
{
    body_cache_free(bc);
    int rc = cairn_change_decode(&bc->c, v + 8, vl - 8, NULL);
    if (rc) {
        bc->c = NULL;
        return rc == CAIRN_ENOMEM ? rc : corrupt(s, "a stored change does not decode");
    }
    bc->index = index;
    return 0;
}

int cairn_store_krec_body_value(const cairn_change *c, uint64_t kvs_counter, uint64_t pos,
                                const uint8_t *key, size_t key_len, const uint8_t **val, size_t *vl)
{
    *val = NULL;
    *vl = 0;
    if (pos >= c->nops)
        return CAIRN_ECORRUPT;
    const cairn_op *op = &c->ops[pos];
    if (op->action != CAIRN_OP_SET || op->key_len != key_len ||
        (key_len && memcmp(op->key, key, key_len)) || op->obj.counter != kvs_counter)
        return CAIRN_ECORRUPT;
    int64_t lease;
    cairn_store_parse_record(&op->value, &lease, val, vl);
    return 0;
}

/* The value of |key| written by op |pos| of change |index|, which made
 * |rev|: a view into bc's change, valid until |bc| changes. The body is read
 * from 'O' unless |bc| holds it already. */
static int body_value(cairn_store *s, const leveldb_readoptions_t *ro, body_cache *bc,
                      uint64_t index, int64_t rev, uint64_t pos, const uint8_t *key,
                      size_t key_len, const uint8_t **val, size_t *vl)
{
    if (!bc->c || bc->index != index) {
        char *v;
        size_t n;
        int rc = get_orec_of_rev(s, ro, index, rev, &v, &n);
        if (!rc) {
            rc = body_cache_load(s, bc, index, (const uint8_t *)v, n);
            leveldb_free(v);
        }
        if (rc)
            return rc;
    }
    if (cairn_store_krec_body_value(bc->c, s->kvs.counter, pos, key, key_len, val, vl))
        return corrupt(s, "history record names an op that did not set its key");
    return 0;
}

int cairn_store_krec_parse(cairn_store_krec *r, const uint8_t *p, size_t len)
{
    memset(r, 0, sizeof *r);
    if (len < 1 || p[0] > KREC_BODY)
        return CAIRN_ECORRUPT;
    r->del = p[0] == KREC_TOMB;
    r->body = p[0] == KREC_BODY;
    wire_rd rd = {p + 1, p + len};
    if (wire_uv(&rd, &r->sub) || wire_uv(&rd, &r->cr) || wire_uv(&rd, &r->ver) ||
        wire_uv(&rd, &r->lease) || (r->body && wire_uv(&rd, &r->pos)) ||
        ((r->body || r->del) && wire_left(&rd)))
        return CAIRN_ECORRUPT;
    if (r->cr > INT64_MAX || r->ver > INT64_MAX) /* read back as int64: never negative */
        return CAIRN_ECORRUPT;
    r->val = rd.p;
    r->val_len = wire_left(&rd);
    return 0;
}

int cairn_store_read_hist(cairn_store *s, store_arena *a, int64_t rev, const uint8_t *key,
                          size_t key_len, cairn_kv *out, int want_value)
{
    uint64_t index;
    if (cairn_revmap_find(&s->rm, &index, rev))
        return corrupt(s, "no change made a revision with history");
    uint8_t stackk[256];
    uint8_t *k = key_len + KREC_KEY_HDR <= sizeof stackk ? stackk : malloc(key_len + KREC_KEY_HDR);
    if (!k)
        return CAIRN_ENOMEM;
    krec_key_hdr(k, index);
    if (key_len)
        memcpy(k + KREC_KEY_HDR, key, key_len);
    char *err = NULL;
    size_t vl = 0;
    char *v = leveldb_get(s->db, s->ropt, (const char *)k, key_len + KREC_KEY_HDR, &vl, &err);
    if (k != stackk)
        free(k);
    int rc = db_err(s, err);
    if (rc)
        return rc;
    if (!v) {
        cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "history record of revision %lld missing",
                        (long long)rev);
        return CAIRN_ECORRUPT;
    }
    cairn_store_krec r;
    body_cache bc = {0, NULL};
    rc = cairn_store_krec_parse(&r, (const uint8_t *)v, vl) ? corrupt(s, "history record") : 0;
    if (!rc && r.del) /* a tombstone is never read as a value */
        rc = corrupt(s, "history read of a deleted key");
    if (rc)
        goto out;
    out->create_revision = (int64_t)r.cr;
    out->version = (int64_t)r.ver;
    out->lease = (int64_t)r.lease;
    out->mod_revision = rev;
    out->value = NULL;
    out->value_len = 0;
    if (want_value) {
        const uint8_t *val = r.val;
        size_t len = r.val_len;
        if (r.body &&
            (rc = body_value(s, s->ropt, &bc, index, rev, r.pos, key, key_len, &val, &len)))
            goto out;
        out->value_len = len;
        out->value = cairn_store_arena_dup(a, val, len);
        if (!out->value) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
    }
    rc = 0;
out:
    body_cache_free(&bc);
    leveldb_free(v);
    return rc;
}

static int find_root_map(cairn_doc *d, cairn_objid *out, const char *name)
{
    cairn_read r;
    int rc = cairn_doc_get(d, &r, CAIRN_ROOT, (const uint8_t *)name, strlen(name));
    if (rc)
        return rc;
    if (r.kind != CAIRN_READ_MAP)
        return CAIRN_ECORRUPT;
    *out = r.obj;
    return 0;
}

/* ---- the observer ----------------------------------------------------------------- */

static void ev_clear(cairn_store *s)
{
    for (size_t i = 0; i < s->cur_nev; i++) {
        free(s->cur_ev[i].key);
        free(s->cur_ev[i].value);
    }
    s->cur_nev = 0;
}

/* The position of the op in the change being applied that set kvs[key] to
 * the patch's winner, or -1 when the winner is an older change's op. Checks
 * everything a reader of the body will rely on (SET, on kvs, of this key). */
static int64_t own_op(cairn_store *s, const cairn_patch *p)
{
    const cairn_change *c = s->cur_change;
    cairn_opid w = p->value.id;
    if (!c || w.counter < c->start_op || w.counter - c->start_op >= c->nops)
        return -1;
    cairn_actor a;
    if (cairn_doc_actor_of(s->doc, &a, w) || memcmp(a.b, c->actor.b, CAIRN_ACTOR_LEN))
        return -1;
    uint64_t pos = w.counter - c->start_op;
    const cairn_op *op = &c->ops[pos];
    if (op->action != CAIRN_OP_SET || op->insert || op->key_len != p->key_len ||
        (p->key_len && memcmp(op->key, p->key, p->key_len)) || op->obj.counter != s->kvs.counter ||
        op->obj.actor >= c->nactors ||
        memcmp(c->actors[op->obj.actor].b, s->kvs_actor.b, CAIRN_ACTOR_LEN))
        return -1;
    return (int64_t)pos;
}

static void on_patch(void *arg, const cairn_patch *p)
{
    cairn_store *s = arg;
    if (s->obs_rc || !s->kvs_known)
        return;
    if (p->obj.counter != s->kvs.counter || p->obj.actor != s->kvs.actor) {
        /* leases / members / cluster: no revision; the lease table follows */
        int rc = cairn_store_lease_patch(s, p);
        if (rc)
            s->obs_rc = rc;
        return;
    }
    if (p->action != CAIRN_PATCH_PUT && p->action != CAIRN_PATCH_DEL)
        return;
    if (s->cur_nev == s->cur_cap) {
        size_t cap = s->cur_cap ? s->cur_cap * 2 : 16;
        pend_event *n = realloc(s->cur_ev, cap * sizeof *n);
        if (!n) {
            s->obs_rc = CAIRN_ENOMEM;
            return;
        }
        s->cur_ev = n;
        s->cur_cap = cap;
    }
    pend_event *e = &s->cur_ev[s->cur_nev];
    memset(e, 0, sizeof *e);
    e->key = malloc(p->key_len ? p->key_len : 1);
    if (!e->key) {
        s->obs_rc = CAIRN_ENOMEM;
        return;
    }
    if (p->key_len)
        memcpy(e->key, p->key, p->key_len);
    e->key_len = p->key_len;
    if (p->action == CAIRN_PATCH_PUT) {
        const uint8_t *val;
        size_t vl;
        if (p->value.kind == CAIRN_READ_SCALAR) {
            cairn_store_parse_record(&p->value.value, &e->lease, &val, &vl);
        } else {
            /* a nested object at kvs[key] (JSON mode, later): empty value */
            val = (const uint8_t *)"";
            vl = 0;
        }
        e->type = CAIRN_EVENT_PUT;
        e->oppos = p->value.kind == CAIRN_READ_SCALAR ? own_op(s, p) : -1;
        /* replay rebuilds the index only; a value set by this change is
         * read back from its body, so only listeners and values that came
         * from an older change (a delete that uncovered a conflict) need a
         * copy */
        if (!s->recovering && (atomic_load(&s->has_subs) || e->oppos < 0)) {
            e->value = malloc(vl ? vl : 1);
            if (!e->value) {
                free(e->key);
                s->obs_rc = CAIRN_ENOMEM;
                return;
            }
            if (vl)
                memcpy(e->value, val, vl);
            e->value_len = vl;
        }
    } else {
        e->type = CAIRN_EVENT_DELETE;
    }
    s->cur_nev++;
}

typedef struct ev_ref {
    size_t i;
    const pend_event *e;
} ev_ref;

static int evref_cmp(const void *a, const void *b)
{
    const ev_ref *x = a, *y = b;
    int c = cairn_store_keycmp(x->e->key, x->e->key_len, y->e->key, y->e->key_len);
    if (c)
        return c;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Keeps the last event per key (a hostile change may touch one key twice)
 * and drops deletes of keys that are not live. Deterministic, so recovery
 * and every node agree. */
static int ev_normalise(cairn_store *s)
{
    size_t n = s->cur_nev;
    if (n > 1) {
        ev_ref *r = malloc(n * sizeof *r);
        if (!r)
            return CAIRN_ENOMEM;
        for (size_t i = 0; i < n; i++) {
            r[i].i = i;
            r[i].e = &s->cur_ev[i];
        }
        qsort(r, n, sizeof *r, evref_cmp);
        for (size_t i = 0; i + 1 < n; i++)
            if (cairn_store_keycmp(r[i].e->key, r[i].e->key_len, r[i + 1].e->key,
                                   r[i + 1].e->key_len) == 0)
                s->cur_ev[r[i].i].type = -1;
        free(r);
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        pend_event *e = &s->cur_ev[i];
        if (e->type == CAIRN_EVENT_DELETE) {
            kentry *k = cairn_kindex_find(&s->idx, e->key, e->key_len);
            if (!k || !kentry_live(k))
                e->type = -1;
        }
        if (e->type < 0) {
            free(e->key);
            free(e->value);
            continue;
        }
        s->cur_ev[w++] = *e;
    }
    s->cur_nev = w;
    return 0;
}

static int apply_events(cairn_store *s, int64_t rev)
{
    for (size_t i = 0; i < s->cur_nev; i++) {
        pend_event *e = &s->cur_ev[i];
        kentry *k = cairn_kindex_upsert(&s->idx, e->key, e->key_len);
        if (!k)
            return CAIRN_ENOMEM;
        int64_t from = kentry_live(k) ? k->lease : 0;
        int rc = cairn_store_lease_key_move(s, k, from, e->type == CAIRN_EVENT_PUT ? e->lease : 0);
        if (rc)
            return rc;
        if (e->type == CAIRN_EVENT_PUT) {
            if (kentry_live(k)) {
                k->version++;
            } else {
                k->create_rev = rev;
                k->version = 1;
            }
            k->lease = e->lease;
            if (cairn_kindex_push(k, (uint64_t)rev))
                return CAIRN_ENOMEM;
            e->create_rev = k->create_rev;
            e->version = k->version;
        } else {
            if (cairn_kindex_push(k, (uint64_t)rev | CAIRN_IDX_TOMB))
                return CAIRN_ENOMEM;
            k->version = 0;
            k->lease = 0;
        }
    }
    return 0;
}

/* Appends the change's records to the shared batch (caller holds qmu): its
 * body under 'O' and one history record per event. */
static int batch_change(cairn_store *s, const cairn_change *c, uint64_t index, int64_t rev)
{
    leveldb_writebatch_t *b = s->batch;
    uint8_t k[9];
    k[0] = 'O';
    cairn_store_be64(k + 1, index);
    uint8_t stackv[512];
    uint8_t *v = 8 + c->len <= sizeof stackv ? stackv : malloc(8 + c->len);
    if (!v)
        return CAIRN_ENOMEM;
    cairn_store_be64(v, (uint64_t)rev);
    memcpy(v + 8, c->bytes, c->len);
    leveldb_writebatch_put(b, (const char *)k, 9, (const char *)v, 8 + c->len);
    if (v != stackv)
        free(v);
    int rc = 0;
    for (size_t i = 0; i < s->cur_nev && !rc; i++) {
        const pend_event *e = &s->cur_ev[i];
        int del = e->type != CAIRN_EVENT_PUT;
        int body = !del && e->oppos >= 0;
        size_t inl = !del && !body ? e->value_len : 0;
        uint8_t hdr[1 + 50];
        hdr[0] = del ? KREC_TOMB : body ? KREC_BODY : 0;
        uint8_t *h = hdr + 1;
        h = wire_put_uv(h, (uint64_t)i); /* order in the change */
        h = wire_put_uv(h, del ? 0 : (uint64_t)e->create_rev);
        h = wire_put_uv(h, del ? 0 : (uint64_t)e->version);
        h = wire_put_uv(h, del ? 0 : (uint64_t)e->lease);
        if (body)
            h = wire_put_uv(h, (uint64_t)e->oppos);
        size_t hl = (size_t)(h - hdr);
        /* key and value side by side: on the stack unless large */
        uint8_t stackr[512];
        size_t kl = KREC_KEY_HDR + e->key_len, need = kl + hl + inl;
        uint8_t *r = need <= sizeof stackr ? stackr : malloc(need);
        if (!r) {
            rc = CAIRN_ENOMEM;
            break;
        }
        krec_key_hdr(r, index);
        if (e->key_len)
            memcpy(r + KREC_KEY_HDR, e->key, e->key_len);
        memcpy(r + kl, hdr, hl);
        if (inl)
            memcpy(r + kl + hl, e->value, inl);
        leveldb_writebatch_put(b, (const char *)r, kl, (const char *)r + kl, hl + inl);
        if (r != stackr)
            free(r);
    }
    s->batch_n++;
    return rc;
}

static void on_change(void *arg, const cairn_change *c, uint64_t index, int begin)
{
    cairn_store *s = arg;
    if (begin) {
        ev_clear(s);
        s->cur_change = c;
        if (s->recovering && index != s->rec_expect_index && !s->rec_rc)
            s->rec_rc = CAIRN_ECORRUPT;
        return;
    }
    s->last_change_rev = 0;
    s->cur_change = NULL;
    if (!s->kvs_known) {
        /* the genesis made the root maps: learn their ids once */
        if (find_root_map(s->doc, &s->kvs, "kvs") == 0 &&
            find_root_map(s->doc, &s->leases, "leases") == 0 &&
            cairn_doc_actor_of(s->doc, &s->kvs_actor, s->kvs) == 0)
            s->kvs_known = 1;
    }
    if (s->obs_rc)
        goto fail;
    int rc = ev_normalise(s);
    if (rc)
        goto fail_rc;
    int64_t rev = 0;
    if (s->cur_nev) {
        rev = s->rev + 1;
        rc = apply_events(s, rev);
        if (!rc)
            rc = cairn_revmap_add(&s->rm, rev, index);
        if (rc)
            goto fail_rc;
        s->rev = rev;
    }
    rc = cairn_store_lease_settle(s);
    if (rc)
        goto fail_rc;
    s->last_change_rev = rev;
    if (s->recovering) {
        if (rev != s->rec_expect_rev && !s->rec_rc) {
            cairn_store_log(
                s, CAIRN_STORE_LOG_ERROR, "replay of change %llu gave revision %lld, stored %lld",
                (unsigned long long)index, (long long)rev, (long long)s->rec_expect_rev);
            s->rec_rc = CAIRN_ECORRUPT;
        }
        ev_clear(s);
        return;
    }
    pend_change *pc = NULL;
    if (atomic_load(&s->has_subs)) {
        pc = calloc(1, sizeof *pc);
        if (!pc)
            goto fail_nomem;
        pc->rev = rev;
        pc->hash = c->hash;
        pc->bytes = malloc(c->len ? c->len : 1); /* the doc frees |c| after this call */
        if (!pc->bytes) {
            free(pc);
            goto fail_nomem;
        }
        memcpy(pc->bytes, c->bytes, c->len);
        pc->len = c->len;
    }
    pthread_mutex_lock(&s->qmu);
    rc = batch_change(s, c, index, rev);
    if (pc) {
        /* the events move to the committer, which hands them to subscribers */
        pc->ev = s->cur_ev;
        pc->nev = s->cur_nev;
        s->cur_ev = NULL;
        s->cur_nev = s->cur_cap = 0;
        *s->ch_tail = pc;
        s->ch_tail = &pc->next;
    }
    if (rev)
        s->queued_rev = rev;
    if (s->obs_wait && !rc) {
        *s->w_tail = s->obs_wait;
        s->w_tail = &s->obs_wait->next;
        s->obs_wait = NULL;
    }
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    ev_clear(s);
    if (rc)
        goto fail_rc;
    return;
fail_nomem:
    rc = CAIRN_ENOMEM;
fail_rc:
    s->obs_rc = rc;
fail:
    /* The document applied a change the store could not index: the memory
     * state is no longer one the disk can reproduce. Stop serving. */
    atomic_store(&s->failed, s->obs_rc ? s->obs_rc : CAIRN_EIO);
    ev_clear(s);
}

const cairn_doc_observer *cairn_store_observer(cairn_store *s, cairn_doc_observer *o)
{
    o->arg = s;
    o->change_cb = on_change;
    o->patch_cb = on_patch;
    s->obs_rc = 0;
    return o;
}

/* ---- committer -------------------------------------------------------------------- */

static void free_pend_change(pend_change *c)
{
    for (size_t i = 0; i < c->nev; i++) {
        free(c->ev[i].key);
        free(c->ev[i].value);
    }
    free(c->ev);
    free(c->bytes);
    free(c);
}

static void *committer_main(void *arg)
{
    cairn_store *s = arg;
    pthread_mutex_lock(&s->qmu);
    for (;;) {
        while (!s->stop && (s->holding || (s->batch_n == 0 && !s->w_head)))
            pthread_cond_wait(&s->qcv, &s->qmu);
        if (s->stop && s->batch_n == 0 && !s->w_head)
            break;
        leveldb_writebatch_t *b = NULL;
        size_t nb = s->batch_n;
        if (s->batch_n) {
            b = s->batch;
            s->batch = leveldb_writebatch_create();
            s->batch_n = 0;
        }
        s->writing = b != NULL;
        pend_change *chs = s->ch_head;
        s->ch_head = NULL;
        s->ch_tail = &s->ch_head;
        pend_wait *ws = s->w_head;
        s->w_head = NULL;
        s->w_tail = &s->w_head;
        int64_t target = s->queued_rev;
        pthread_mutex_unlock(&s->qmu);

        int rc = atomic_load(&s->failed);
        if (b && !rc && s->before_write_cb && s->before_write_cb(s->before_write_arg, nb)) {
            cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "write of %zu changes failed (injected)", nb);
            rc = CAIRN_EIO;
            atomic_store(&s->failed, CAIRN_EIO);
        }
        if (b && !rc) {
            char *err = NULL;
            leveldb_write(s->db, s->wopt_sync, b, &err);
            rc = db_err(s, err);
            if (!rc) {
                atomic_fetch_add(&s->n_syncs, 1);
                atomic_fetch_add(&s->n_changes, nb);
            }
            if (rc)
                atomic_store(&s->failed, CAIRN_EIO);
        }
        if (b)
            leveldb_writebatch_destroy(b);
        pthread_mutex_lock(&s->qmu);
        if (!rc && target > atomic_load(&s->visible))
            atomic_store(&s->visible, target);
        s->writing = 0;
        pthread_cond_broadcast(&s->dcv);
        pthread_mutex_unlock(&s->qmu);
        pthread_mutex_lock(&s->sub_mu);
        while (chs) {
            pend_change *n = chs->next;
            if (!rc && s->nsubs) {
                cairn_event *ev = chs->nev ? calloc(chs->nev, sizeof *ev) : NULL;
                for (size_t i = 0; ev && i < chs->nev; i++) {
                    const pend_event *e = &chs->ev[i];
                    ev[i].type = e->type;
                    ev[i].kv.key = e->key;
                    ev[i].kv.key_len = e->key_len;
                    ev[i].kv.mod_revision = chs->rev;
                    if (e->type == CAIRN_EVENT_PUT) {
                        ev[i].kv.create_revision = e->create_rev;
                        ev[i].kv.version = e->version;
                        ev[i].kv.lease = e->lease;
                        ev[i].kv.value = e->value;
                        ev[i].kv.value_len = e->value_len;
                    }
                }
                for (size_t i = 0; i < s->nsubs; i++)
                    s->subs[i].cb(s->subs[i].arg, chs->rev, &chs->hash, chs->bytes, chs->len, ev,
                                  ev ? chs->nev : 0);
                free(ev);
            }
            free_pend_change(chs);
            chs = n;
        }
        pthread_mutex_unlock(&s->sub_mu);
        while (ws) {
            pend_wait *n = ws->next;
            if (ws->hcb)
                ws->hcb(ws->arg, rc, rc ? NULL : ws->heads, rc ? 0 : ws->nheads);
            else if (ws->cb)
                ws->cb(ws->arg, rc);
            free(ws->heads);
            free(ws);
            ws = n;
        }
        pthread_mutex_lock(&s->qmu);
    }
    pthread_mutex_unlock(&s->qmu);
    return NULL;
}

int cairn_store_subscribe(cairn_store *s, cairn_store_events_cb cb, void *arg)
{
    pthread_mutex_lock(&s->sub_mu);
    int rc = 0;
    if (s->nsubs == s->subcap) {
        size_t cap = s->subcap ? s->subcap * 2 : 4;
        cairn_store_subscriber *n = realloc(s->subs, cap * sizeof *n);
        if (n) {
            s->subs = n;
            s->subcap = cap;
        } else {
            rc = CAIRN_ENOMEM;
        }
    }
    if (!rc) {
        s->subs[s->nsubs++] = (cairn_store_subscriber){cb, arg};
        atomic_store(&s->has_subs, 1);
    }
    pthread_mutex_unlock(&s->sub_mu);
    return rc;
}

int cairn_store_unsubscribe(cairn_store *s, cairn_store_events_cb cb, void *arg)
{
    pthread_mutex_lock(&s->sub_mu);
    int rc = CAIRN_ENOTFOUND;
    for (size_t i = 0; i < s->nsubs; i++) {
        if (s->subs[i].cb == cb && s->subs[i].arg == arg) {
            memmove(&s->subs[i], &s->subs[i + 1], (s->nsubs - i - 1) * sizeof *s->subs);
            s->nsubs--;
            rc = 0;
            break;
        }
    }
    atomic_store(&s->has_subs, s->nsubs > 0);
    pthread_mutex_unlock(&s->sub_mu);
    return rc;
}

int cairn_store_enqueue_wait(cairn_store *s, cairn_store_done_cb cb, void *arg, int *rcp)
{
    pend_wait *w = calloc(1, sizeof *w);
    if (!w)
        return CAIRN_ENOMEM;
    w->cb = cb;
    w->arg = arg;
    w->rcp = rcp;
    pthread_mutex_lock(&s->qmu);
    *s->w_tail = w;
    s->w_tail = &w->next;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return 0;
}

int cairn_store_wait_visible(cairn_store *s, int64_t rev)
{
    pthread_mutex_lock(&s->qmu);
    while (atomic_load(&s->visible) < rev && !atomic_load(&s->failed))
        pthread_cond_wait(&s->dcv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
    return atomic_load(&s->visible) >= rev ? 0 : CAIRN_EIO;
}

/* ---- genesis and open ------------------------------------------------------------- */

static int make_genesis(cairn_change **out, const char *token)
{
    cairn_change t;
    memset(&t, 0, sizeof t);
    uint8_t h[CAIRN_HASH_LEN];
    store_buf b = {0};
    int rc = cairn_store_buf_put(&b, GENESIS_SALT, sizeof GENESIS_SALT - 1);
    if (!rc)
        rc = cairn_store_buf_put(&b, token, strlen(token));
    if (rc)
        return rc;
    cairn_hash_bytes((cairn_hash *)h, b.p, b.len);
    cairn_store_buf_free(&b);
    cairn_actor a;
    memcpy(a.b, h, CAIRN_ACTOR_LEN);
    static const char *names[4] = {"kvs", "leases", "members", "cluster"};
    cairn_op ops[4];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < 4; i++) {
        ops[i].action = CAIRN_OP_MAKE_MAP;
        ops[i].obj = CAIRN_ROOT;
        ops[i].key = (const uint8_t *)names[i];
        ops[i].key_len = (uint32_t)strlen(names[i]);
    }
    t.actor = a;
    t.seq = 1;
    t.start_op = 1;
    t.time_ms = 0;
    t.nactors = 1;
    t.actors = &a;
    t.nops = 4;
    t.ops = ops;
    return cairn_change_new(out, &t);
}

static int mkdir_p(const char *dir)
{
    char *p = strdup(dir);
    if (!p)
        return CAIRN_ENOMEM;
    for (char *q = p + 1; *q; q++) {
        if (*q != '/')
            continue;
        *q = 0;
        if (mkdir(p, 0700) && errno != EEXIST) {
            free(p);
            return CAIRN_EIO;
        }
        *q = '/';
    }
    int rc = (mkdir(p, 0700) && errno != EEXIST) ? CAIRN_EIO : 0;
    free(p);
    return rc;
}

static int create_fresh(cairn_store *s, const cairn_store_options *o)
{
    /* a checkpoint left beside a database that is gone memoises nothing */
    if (cairn_ckpt_remove(s, s->datadir))
        return CAIRN_EIO;
    const char *token = o->cluster_token ? o->cluster_token : "etcd-cluster";
    const char *name = o->name ? o->name : "default";
    if (o->actor) {
        s->actor = *o->actor;
    } else if (getrandom(s->actor.b, CAIRN_ACTOR_LEN, 0) != CAIRN_ACTOR_LEN) {
        return CAIRN_EIO;
    }
    /* identity, as etcd derives it */
    static const char *const def_urls[1] = {"http://localhost:2380"};
    cairn_store_member def = {name, def_urls, 1};
    const cairn_store_member *mem = o->ninitial_cluster ? o->initial_cluster : &def;
    size_t nmem = o->ninitial_cluster ? o->ninitial_cluster : 1;
    uint64_t *ids = calloc(nmem, sizeof *ids);
    if (!ids)
        return CAIRN_ENOMEM;
    int found = 0;
    for (size_t i = 0; i < nmem; i++) {
        ids[i] = cairn_store_member_id_of(mem[i].peer_urls, mem[i].npeer_urls, token);
        if (mem[i].name && strcmp(mem[i].name, name) == 0) {
            s->member_id = ids[i];
            found = 1;
        }
    }
    s->cluster_id = cairn_store_cluster_id_of(ids, nmem);
    free(ids);
    if (!found)
        return CAIRN_EINVAL;

    int rc = new_doc(s);
    if (rc)
        return rc;
    cairn_change *g;
    rc = make_genesis(&g, token);
    if (rc)
        return rc;
    cairn_doc_observer obs;
    rc = cairn_doc_receive(s->doc, g, cairn_store_observer(s, &obs));
    if (!rc)
        rc = s->obs_rc;
    if (rc)
        return rc;
    /* The genesis records are in s->batch; add the identity and write it all
     * at once, so a crash leaves either nothing or a whole new store. */
    uint8_t fv[4] = {0, 0, 0, FORMAT_VERSION};
    meta_put(s->batch, "actor", s->actor.b, CAIRN_ACTOR_LEN);
    meta_put_u64(s->batch, "member", s->member_id);
    meta_put_u64(s->batch, "cluster", s->cluster_id);
    meta_put(s->batch, "token", token, strlen(token));
    meta_put(s->batch, "format", fv, 4);
    char *err = NULL;
    leveldb_write(s->db, s->wopt_sync, s->batch, &err);
    rc = db_err(s, err);
    leveldb_writebatch_clear(s->batch);
    s->batch_n = 0;
    return rc;
}

/* Reads the 'M' record |name| as a u64. With |present| NULL the record must
 * exist; otherwise *present says whether it does (and *out is 0 if not). */
static int get_meta_u64(cairn_store *s, const char *name, uint64_t *out, int *present)
{
    char *v;
    size_t vl;
    int rc = meta_get(s, name, &v, &vl);
    if (rc)
        return rc;
    if (present)
        *present = v != NULL;
    if (!v) {
        *out = 0;
        return present ? 0 : corrupt(s, name);
    }
    if (vl != 8) {
        leveldb_free(v);
        return corrupt(s, name);
    }
    *out = cairn_store_get_be64((const uint8_t *)v);
    leveldb_free(v);
    return 0;
}

/* Applies compaction at |c| to the index; when |b| is not NULL, adds the
 * deletes of the history records it no longer needs. */
static int compact_index(cairn_store *s, int64_t c, leveldb_writebatch_t *b, uint64_t *ndel)
{
    store_buf kb = {0};
    int rc = 0;
    kiter it;
    for (kentry *e = cairn_kindex_first(&it, &s->idx); e; e = cairn_kindex_next(&it)) {
        uint32_t pos;
        uint64_t h = cairn_kindex_at(e, c, &pos);
        if (!h)
            continue;
        /* keep hist[pos] if live, drop everything before it; a delete at or
         * below the compaction revision goes too (etcd: a watch from the
         * compaction revision does not see a delete made at it) */
        uint32_t drop = (h & CAIRN_IDX_TOMB) ? pos + 1 : pos;
        for (uint32_t i = 0; i < drop && b; i++) {
            uint64_t index;
            if (cairn_revmap_find(&s->rm, &index, (int64_t)(e->hist[i] & ~CAIRN_IDX_TOMB))) {
                rc = corrupt(s, "no change made a revision with history");
                goto out;
            }
            uint8_t k[KREC_KEY_HDR];
            krec_key_hdr(k, index);
            kb.len = 0;
            rc = cairn_store_buf_put(&kb, k, KREC_KEY_HDR);
            if (!rc)
                rc = cairn_store_buf_put(&kb, kentry_key(e), e->key_len);
            if (rc)
                goto out;
            leveldb_writebatch_delete(b, (const char *)kb.p, kb.len);
            (*ndel)++;
        }
        if (drop) {
            memmove(e->hist, e->hist + drop, (e->nhist - drop) * sizeof *e->hist);
            e->nhist -= drop;
        }
    }
out:
    cairn_kindex_sweep(&s->idx); /* keys with no history left */
    cairn_store_buf_free(&kb);
    return rc;
}

/* ---- recovery ----------------------------------------------------------------- */

#define REC_BLOCK 256
#define REC_MAX_BLOCKS 16

typedef struct rec_item {
    cairn_change *c;
    int64_t rev;
} rec_item;

typedef struct rec_block {
    struct rec_block *next;
    uint32_t n;
    rec_item it[REC_BLOCK];
} rec_block;

typedef struct rec_reader {
    cairn_store *s; /* for its log */
    leveldb_t *db;
    uint64_t start; /* the first apply index to read */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rec_block *head, **tail;
    int nblocks;
    int done, stop, rc;
} rec_reader;

static void rec_block_free(rec_block *b)
{
    for (uint32_t i = 0; i < b->n; i++)
        if (b->it[i].c)
            cairn_change_free(b->it[i].c);
    free(b);
}

/* Hands a block to the replaying thread; 0 if told to stop. */
static int rec_put(rec_reader *r, rec_block *b)
{
    pthread_mutex_lock(&r->mu);
    while (r->nblocks >= REC_MAX_BLOCKS && !r->stop)
        pthread_cond_wait(&r->cv, &r->mu);
    int ok = !r->stop;
    if (ok) {
        b->next = NULL;
        *r->tail = b;
        r->tail = &b->next;
        r->nblocks++;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    if (!ok)
        rec_block_free(b);
    return ok;
}

/* The next block, or NULL at the end of the stream. */
static rec_block *rec_take(rec_reader *r)
{
    pthread_mutex_lock(&r->mu);
    while (!r->head && !r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    rec_block *b = r->head;
    if (b) {
        r->head = b->next;
        if (!r->head)
            r->tail = &r->head;
        r->nblocks--;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return b;
}

static void *rec_reader_main(void *arg)
{
    rec_reader *r = arg;
    cairn_store *s = r->s;
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    leveldb_readoptions_set_verify_checksums(ro, 1);
    leveldb_readoptions_set_fill_cache(ro, 0);
    leveldb_iterator_t *it = leveldb_create_iterator(r->db, ro);
    uint64_t want = r->start;
    int rc = 0;
    rec_block *b = NULL;
    uint8_t first[9];
    first[0] = 'O';
    cairn_store_be64(first + 1, want);
    for (leveldb_iter_seek(it, (const char *)first, 9); leveldb_iter_valid(it);
         leveldb_iter_next(it)) {
        size_t kl, dl;
        const char *k = leveldb_iter_key(it, &kl);
        if (kl < 1 || k[0] != 'O')
            break;
        if (kl >= KREC_KEY_HDR && k[9] == 'K')
            continue; /* a history record of the change before */
        const uint8_t *d = (const uint8_t *)leveldb_iter_value(it, &dl);
        if (kl != 9 || dl < 8 || cairn_store_get_be64((const uint8_t *)k + 1) != want) {
            char *err = NULL;
            leveldb_iter_get_error(it, &err); /* LevelDB skips a bad block */
            rc = err ? db_err(s, err) : corrupt(s, "apply order has a gap or a malformed record");
            if (rc == CAIRN_EIO)
                rc = CAIRN_ECORRUPT;
            break;
        }
        cairn_change *ch;
        rc = cairn_change_decode(&ch, d + 8, dl - 8, NULL);
        if (rc) {
            cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "change %llu does not decode: %s",
                            (unsigned long long)want, cairn_strerror(rc));
            rc = rc == CAIRN_ENOMEM ? rc : CAIRN_ECORRUPT;
            break;
        }
        if (!b && !(b = calloc(1, sizeof *b))) {
            cairn_change_free(ch);
            rc = CAIRN_ENOMEM;
            break;
        }
        b->it[b->n].c = ch;
        b->it[b->n].rev = (int64_t)cairn_store_get_be64(d);
        if (++b->n == REC_BLOCK) {
            int ok = rec_put(r, b);
            b = NULL;
            if (!ok)
                break;
        }
        want++;
    }
    if (!rc) {
        char *err = NULL;
        leveldb_iter_get_error(it, &err);
        rc = db_err(s, err);
    }
    if (b && b->n)
        rec_put(r, b);
    else
        free(b);
    leveldb_iter_destroy(it);
    leveldb_readoptions_destroy(ro);
    pthread_mutex_lock(&r->mu);
    r->rc = rc;
    r->done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Replays the stored apply order from index |start| (0: everything, into
 * a new document; otherwise onto the state a checkpoint loaded). */
static int replay(cairn_store *s, uint64_t start)
{
    int rc = 0;
    /* A reader thread scans and decodes the apply order (LevelDB checksums,
     * canonical decoding, hashing) while this one replays: the two halves
     * of the work run on two cores. */
    rec_reader rr;
    memset(&rr, 0, sizeof rr);
    rr.s = s;
    rr.db = s->db;
    rr.start = start;
    rr.tail = &rr.head;
    pthread_mutex_init(&rr.mu, NULL);
    pthread_cond_init(&rr.cv, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, rec_reader_main, &rr)) {
        pthread_mutex_destroy(&rr.mu);
        pthread_cond_destroy(&rr.cv);
        return CAIRN_ENOMEM;
    }
    s->recovering = 1;
    uint64_t want = start;
    cairn_doc_observer obs;
    rec_block *blk = NULL;
    for (;;) {
        blk = rec_take(&rr);
        if (!blk)
            break;
        for (uint32_t i = 0; i < blk->n && !rc; i++) {
            rec_item *it = &blk->it[i];
            cairn_change *ch = it->c;
            it->c = NULL;
            s->rec_expect_index = want;
            s->rec_expect_rev = it->rev;
            s->rec_rc = 0;
            rc = cairn_doc_receive(s->doc, ch, cairn_store_observer(s, &obs));
            if (!rc)
                rc = s->obs_rc ? s->obs_rc : s->rec_rc;
            if (!rc && cairn_dag_count(cairn_doc_dag(s->doc)) != want + 1)
                rc = corrupt(s, "a change's dependencies are not before it");
            if (rc) {
                cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "replay of change %llu failed: %s",
                                (unsigned long long)want, cairn_strerror(rc));
                if (rc != CAIRN_ENOMEM)
                    rc = CAIRN_ECORRUPT;
            }
            want++;
        }
        rec_block_free(blk);
        if (rc)
            break;
    }
    /* stop the reader (it may be blocked on a full queue) and collect its
     * verdict: a scan or decode error ends the stream early */
    pthread_mutex_lock(&rr.mu);
    rr.stop = 1;
    pthread_cond_broadcast(&rr.cv);
    pthread_mutex_unlock(&rr.mu);
    pthread_join(th, NULL);
    while ((blk = rr.head)) {
        rr.head = blk->next;
        rec_block_free(blk);
    }
    if (!rc)
        rc = rr.rc;
    pthread_mutex_destroy(&rr.mu);
    pthread_cond_destroy(&rr.cv);
    s->recovering = 0;
    if (!rc && want == 0)
        rc = corrupt(s, "no genesis change");
    return rc;
}

/* Back to the state of a store that has replayed nothing (after a refused
 * checkpoint or a failed tail replay): everything replay derives. */
static int reset_derived(cairn_store *s)
{
    if (s->doc)
        cairn_doc_free(s->doc);
    s->doc = NULL;
    cairn_kindex_destroy(&s->idx);
    cairn_revmap_destroy(&s->rm);
    int64_t min_ttl = s->lt.min_ttl, ext = s->lt.restart_extend_ms;
    cairn_lease_table_destroy(&s->lt);
    s->kvs_known = 0;
    s->rev = 1;
    s->compacted = -1;
    int rc = cairn_kindex_init(&s->idx);
    if (!rc)
        rc = cairn_revmap_init(&s->rm);
    if (!rc)
        rc = cairn_lease_table_init(&s->lt, min_ttl, ext);
    if (!rc)
        rc = new_doc(s);
    return rc;
}

/* The half of a checkpoint load that does not need the document: the
 * checksum and the state section (key index, revision map), run on a
 * second core while the opening thread loads the document. */
typedef struct ckpt_side {
    cairn_store *s;
    const cairn_ckpt_head *h;
    cairn_ckpt_live live;
    int vrc, drc;
} ckpt_side;

static void *ckpt_side_main(void *arg)
{
    ckpt_side *c = arg;
    c->vrc = cairn_ckpt_verify(c->h);
    if (!c->vrc)
        c->drc = cairn_ckpt_decode_state(&c->s->idx, &c->s->rm, &c->live, c->h->state,
                                         c->h->state_len, c->h->nchanges, c->h->rev);
    return NULL;
}

/* Loads the state a checkpoint memoises, when it is this store's and
 * matches the stored changes: *start = the number of changes it covers (0,
 * with one log line saying why, when it is not used; the state is
 * then as before). |compacted| is the stored compaction (-1 none). Only
 * allocation failure is an error: every doubt is a full replay. */
static int load_checkpoint(cairn_store *s, uint64_t *start, int64_t compacted)
{
    *start = 0;
    const uint8_t *p;
    size_t len;
    const char *why = NULL;
    char whybuf[160];
    int rc = cairn_ckpt_map(&p, &len, s->datadir);
    if (rc) {
        cairn_store_log(s, CAIRN_STORE_LOG_INFO, "%s: %s; replaying every stored change",
                        rc == CAIRN_ENOTFOUND ? "no checkpoint" : "checkpoint unreadable",
                        s->datadir);
        return 0;
    }
    cairn_ckpt_head h;
    ckpt_side side;
    memset(&side, 0, sizeof side);
    side.s = s;
    side.h = &h;
    pthread_t th;
    int threaded = 0;
    rc = cairn_ckpt_parse(&h, p, len);
    if (rc) {
        snprintf(whybuf, sizeof whybuf, "header: %s", cairn_strerror(rc));
        why = whybuf;
        goto out;
    }
    /* nothing the side thread builds is kept unless every check passes */
    threaded = pthread_create(&th, NULL, ckpt_side_main, &side) == 0;
    if (!threaded)
        ckpt_side_main(&side);
    if (memcmp(h.actor.b, s->actor.b, CAIRN_ACTOR_LEN) || h.member_id != s->member_id ||
        h.cluster_id != s->cluster_id) {
        why = "written by another actor or member";
        goto out;
    }
    if (h.compacted != compacted) {
        why = "compacted since it was written";
        goto out;
    }
    /* the change it ends at must be the stored one at that index */
    char *v;
    size_t vl;
    if ((rc = get_orec(s, s->ropt, h.nchanges - 1, &v, &vl))) {
        why = "cannot read the stored change it ends at";
        goto out;
    }
    if (!v || vl < 8) {
        leveldb_free(v);
        snprintf(whybuf, sizeof whybuf, "covers %llu changes, more than are stored",
                 (unsigned long long)h.nchanges);
        why = whybuf;
        goto out;
    }
    cairn_hash hv;
    cairn_hash_bytes(&hv, (const uint8_t *)v + 8, vl - 8);
    int64_t last_rev = (int64_t)cairn_store_get_be64((const uint8_t *)v);
    leveldb_free(v);
    if (memcmp(hv.b, h.last.b, CAIRN_HASH_LEN)) {
        why = "its last change is not the stored one";
        goto out;
    }
    cairn_doc *d = NULL;
    rc = cairn_doc_from_checkpoint(&d, h.doc, h.doc_len, &s->actor);
    if (rc) {
        snprintf(whybuf, sizeof whybuf, "document: %s", cairn_strerror(rc));
        why = whybuf;
        goto out;
    }
    cairn_doc_free(s->doc);
    s->doc = d;
    const cairn_dag *dag = cairn_doc_dag(d);
    const cairn_hash *lh = cairn_dag_count(dag) == h.nchanges
                               ? cairn_dag_hash_at(dag, h.nchanges - 1)
                               : NULL;
    if (!lh || memcmp(lh->b, h.last.b, CAIRN_HASH_LEN)) {
        why = "its document does not end at its last change";
        goto out;
    }
    if ((rc = cairn_doc_set_loader(d, load_body, s)))
        goto out;
    if (threaded) {
        pthread_join(th, NULL);
        threaded = 0;
    }
    if (side.vrc) {
        why = "checksum mismatch";
        goto out;
    }
    if ((rc = side.drc)) {
        snprintf(whybuf, sizeof whybuf, "key index: %s", cairn_strerror(rc));
        why = whybuf;
        goto out;
    }
    /* the revision the stored change N-1 took: the map's last one, or none */
    uint64_t ix;
    int took = cairn_revmap_find(&s->rm, &ix, h.rev) == 0 && ix == h.nchanges - 1;
    if (last_rev != (took ? h.rev : 0)) {
        why = "its revisions disagree with the stored change it ends at";
        goto out;
    }
    s->rev = h.rev;
    s->compacted = h.compacted;
    size_t ndoc = 0;
    if (find_root_map(d, &s->kvs, "kvs") || find_root_map(d, &s->leases, "leases") ||
        cairn_doc_actor_of(d, &s->kvs_actor, s->kvs) || cairn_doc_length(d, &ndoc, s->kvs) ||
        ndoc != side.live.nlive) {
        why = "its document and key index disagree";
        goto out;
    }
    s->kvs_known = 1;
    size_t nleased;
    kentry *const *leased = cairn_ckpt_leased(&side.live, &nleased);
    rc = cairn_store_lease_rebuild(s, leased, nleased);
out:
    if (threaded)
        pthread_join(th, NULL);
    cairn_store_buf_free(&side.live.leased);
    cairn_ckpt_unmap(p, len);
    if (why || rc) {
        if (!why) {
            snprintf(whybuf, sizeof whybuf, "loading it: %s", cairn_strerror(rc));
            why = whybuf;
        }
        cairn_store_log(s, CAIRN_STORE_LOG_WARN,
                        "checkpoint in %s not used (%s); replaying every stored "
                        "change",
                        s->datadir, why);
        int rrc = reset_derived(s);
        return rc == CAIRN_ENOMEM ? rc : rrc;
    }
    *start = h.nchanges;
    s->ckpt_n = h.nchanges;
    s->ckpt_compacted = h.compacted;
    return 0;
}

static int recover(cairn_store *s, int use_checkpoint)
{
    char *v;
    size_t vl;
    int rc = meta_get(s, "actor", &v, &vl);
    if (rc)
        return rc;
    if (!v || vl != CAIRN_ACTOR_LEN) {
        leveldb_free(v);
        return corrupt(s, "actor id");
    }
    memcpy(s->actor.b, v, CAIRN_ACTOR_LEN);
    leveldb_free(v);
    uint64_t c;
    int have_c;
    if ((rc = get_meta_u64(s, "member", &s->member_id, NULL)) ||
        (rc = get_meta_u64(s, "cluster", &s->cluster_id, NULL)) ||
        (rc = get_meta_u64(s, "compact", &c, &have_c)))
        return rc;
    rc = new_doc(s);
    if (rc)
        return rc;
    uint64_t start = 0;
    if (use_checkpoint && (rc = load_checkpoint(s, &start, have_c ? (int64_t)c : -1)))
        return rc;
    rc = replay(s, start);
    if (rc && start && rc != CAIRN_ENOMEM) {
        /* the tail did not replay onto the memo: trust only the changes */
        cairn_store_log(s, CAIRN_STORE_LOG_WARN,
                        "replay after the checkpoint failed (%s); replaying every "
                        "stored change",
                        cairn_strerror(rc));
        s->ckpt_n = 0;
        rc = reset_derived(s);
        if (!rc)
            rc = replay(s, 0);
    }
    if (rc)
        return rc;
    s->compacted = have_c ? (int64_t)c : -1;
    if (have_c && c) {
        uint64_t nd = 0;
        rc = compact_index(s, (int64_t)c, NULL, &nd);
    }
    return rc;
}

/* Writes the checkpoint of the store as it is (close: nothing else runs).
 * Skipped when it would be the one already on disk. */
static int write_checkpoint(cairn_store *s)
{
    const cairn_dag *dag = cairn_doc_dag(s->doc);
    uint64_t n = cairn_dag_count(dag);
    if (n == 0 || (n == s->ckpt_n && s->compacted == s->ckpt_compacted))
        return 0;
    cairn_ckpt_head h;
    memset(&h, 0, sizeof h);
    h.actor = s->actor;
    h.member_id = s->member_id;
    h.cluster_id = s->cluster_id;
    h.nchanges = n;
    h.last = *cairn_dag_hash_at(dag, n - 1);
    h.rev = s->rev;
    h.compacted = s->compacted;
    uint8_t *doc = NULL;
    size_t dl = 0;
    store_buf st = {0};
    int rc = cairn_doc_checkpoint(&doc, &dl, s->doc);
    if (!rc)
        rc = cairn_ckpt_encode_state(&st, &s->idx, &s->rm);
    if (!rc)
        rc = cairn_ckpt_write(s->datadir, &h, doc, dl, st.p ? st.p : (const uint8_t *)"", st.len);
    free(doc);
    cairn_store_buf_free(&st);
    if (rc)
        cairn_store_log(s, CAIRN_STORE_LOG_WARN, "cannot write the checkpoint in %s: %s",
                        s->datadir, cairn_strerror(rc));
    return rc;
}

/* Formats 1 and 2 -> 3, after a successful replay (which reads only the
 * bodies, wherever the history records are). Format 2 kept history records
 * under 'K' rev ++ key: two streams of ascending keys in one database, so
 * every LevelDB compaction of new tables rewrote all the older records of
 * the other stream in level 1. Format 1 also had 'C' (hash -> index) and
 * 'R' (rev -> hash) records, no longer read (the DAG and the revision map
 * rebuild both at replay), and values inline in 'K' (flags 0), which read
 * as they are. The marker goes first, synced: from then on an older build
 * refuses the dir (CAIRN_EBADVERSION) instead of misreading it. */
static int upgrade_format(cairn_store *s)
{
    leveldb_writebatch_t *b = leveldb_writebatch_create();
    uint8_t fv[4] = {0, 0, 0, FORMAT_VERSION};
    meta_put(b, "format", fv, 4);
    char *err = NULL;
    leveldb_write(s->db, s->wopt_sync, b, &err);
    leveldb_writebatch_destroy(b);
    return db_err(s, err);
}

/* Then the records move: each 'K' rev ++ key to 'O' index 'K' key (the
 * revision map gives the index; the value is unchanged), and 'C' and 'R'
 * go, a bounded batch at a time, and LevelDB compacts each emptied range.
 * Every open of a format-3 dir does this (one seek per tag when there is
 * nothing left), so a crash part-way is finished by the next open. */
static int move_old_records(cairn_store *s)
{
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    leveldb_readoptions_set_fill_cache(ro, 0);
    leveldb_writebatch_t *b = leveldb_writebatch_create();
    store_buf nk = {0};
    int rc = 0;
    static const char tags[3] = {'C', 'K', 'R'};
    for (int t = 0; t < 3 && !rc; t++) {
        leveldb_iterator_t *it = leveldb_create_iterator(s->db, ro);
        size_t n = 0;
        for (leveldb_iter_seek(it, &tags[t], 1); leveldb_iter_valid(it) && !rc;
             leveldb_iter_next(it)) {
            size_t kl, vl;
            const char *k = leveldb_iter_key(it, &kl);
            if (kl < 1 || k[0] != tags[t])
                break;
            if (tags[t] == 'K') {
                uint64_t index;
                if (kl < 9 ||
                    cairn_revmap_find(&s->rm, &index,
                                      (int64_t)cairn_store_get_be64((const uint8_t *)k + 1))) {
                    rc = corrupt(s, "a history record of a revision no change made");
                    break;
                }
                uint8_t h[KREC_KEY_HDR];
                krec_key_hdr(h, index);
                nk.len = 0;
                rc = cairn_store_buf_put(&nk, h, KREC_KEY_HDR);
                if (!rc)
                    rc = cairn_store_buf_put(&nk, k + 9, kl - 9);
                if (rc)
                    break;
                const char *v = leveldb_iter_value(it, &vl);
                leveldb_writebatch_put(b, (const char *)nk.p, nk.len, v, vl);
            }
            leveldb_writebatch_delete(b, k, kl);
            if (++n % 4096 == 0) {
                char *err = NULL;
                leveldb_write(s->db, s->wopt_sync, b, &err);
                rc = db_err(s, err);
                leveldb_writebatch_clear(b);
            }
        }
        if (!rc) {
            char *err = NULL;
            leveldb_iter_get_error(it, &err);
            rc = db_err(s, err);
        }
        if (!rc && n % 4096) {
            char *err = NULL;
            leveldb_write(s->db, s->wopt_sync, b, &err);
            rc = db_err(s, err);
            leveldb_writebatch_clear(b);
        }
        leveldb_iter_destroy(it);
        if (!rc && n) {
            /* drop the deletes now: until LevelDB compacts them, every
             * later open's seek to the tag would step over all of them */
            char hi = (char)(tags[t] + 1);
            leveldb_compact_range(s->db, &tags[t], 1, &hi, 1);
        }
    }
    cairn_store_buf_free(&nk);
    leveldb_writebatch_destroy(b);
    leveldb_readoptions_destroy(ro);
    return rc;
}

/* A data dir restored from a snapshot (server/etcd/snapshot.c puts
 * CAIRN_STORE_RESTORE_MARKER in the archive) is a copy of another node: with
 * that node's actor id, both would write (actor, seq) pairs the other never
 * saw, forks the CRDT's sequence rule rejects. So the copy draws a new actor
 * before it writes anything; keys, revisions, leases, member and cluster id
 * stay. Order: the new actor is durable (sync write) before the marker goes,
 * so a crash in between only draws another actor at the next open, and
 * nothing was ever written with the first. An existing dir only (|exists|):
 * a new dir gets a random actor anyway. */
static int renew_restored_actor(cairn_store *s, const char *dir, int exists)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/" CAIRN_STORE_RESTORE_MARKER, dir) >= (int)sizeof path)
        return CAIRN_EINVAL;
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : CAIRN_EIO;
    if (exists) {
        char *old;
        size_t oldl;
        int rc = meta_get(s, "actor", &old, &oldl);
        if (rc)
            return rc;
        char was[2 * CAIRN_ACTOR_LEN + 1] = "none", now[2 * CAIRN_ACTOR_LEN + 1];
        if (old && oldl == CAIRN_ACTOR_LEN)
            for (size_t i = 0; i < CAIRN_ACTOR_LEN; i++)
                snprintf(was + 2 * i, 3, "%02x", (uint8_t)old[i]);
        leveldb_free(old);
        cairn_actor a;
        if (getrandom(a.b, CAIRN_ACTOR_LEN, 0) != CAIRN_ACTOR_LEN)
            return CAIRN_EIO;
        for (size_t i = 0; i < CAIRN_ACTOR_LEN; i++)
            snprintf(now + 2 * i, 3, "%02x", a.b[i]);
        leveldb_writebatch_t *b = leveldb_writebatch_create();
        meta_put(b, "actor", a.b, CAIRN_ACTOR_LEN);
        char *err = NULL;
        leveldb_write(s->db, s->wopt_sync, b, &err);
        leveldb_writebatch_destroy(b);
        rc = db_err(s, err);
        if (rc)
            return rc;
        cairn_store_log(s, CAIRN_STORE_LOG_INFO,
                        "%s was restored from a snapshot: actor %s replaced by %s", dir, was, now);
    }
    /* Snapshots hold db/ only, but a copied data dir may bring a checkpoint
     * of the old actor: it goes before the marker, so the next open either
     * sees the marker again or no checkpoint (the actor check would refuse
     * it anyway). */
    int crc = cairn_ckpt_remove(s, dir);
    if (crc)
        return crc;
    if (unlink(path) != 0 && errno != ENOENT)
        return CAIRN_EIO;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd); /* best effort: a marker that comes back only renews again */
        close(dfd);
    }
    return 0;
}

/* Closes and reopens the LevelDB handle after a replay. The replay read every
 * table file, and LevelDB reads table files through mmap: each stays mapped
 * (and its touched pages in our RSS, ~105 MiB at 1,000,000 keys) while the
 * table cache holds it open, i.e. for the life of the handle. A fresh handle
 * opens tables lazily, so afterwards only what reads touch is mapped. Costs
 * a manifest read; nothing else holds the handle yet (the reader thread has
 * been joined, the committer is not started). */
static int reopen_db(cairn_store *s)
{
    leveldb_close(s->db);
    char *err = NULL;
    s->db = leveldb_open(s->dbopt, s->dir, &err);
    return db_err(s, err);
}

int cairn_store_open(cairn_store **out, const cairn_store_options *o)
{
    *out = NULL;
    if (!o || !o->dir)
        return CAIRN_EINVAL;
    cairn_store *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    int rc = CAIRN_ENOMEM;
    /* glibc's rwlock prefers readers by default: a steady stream of reads
     * would starve every writer. */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->rw, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    pthread_cond_init(&s->dcv, NULL);
    pthread_mutex_init(&s->lease_mu, NULL);
    pthread_mutex_init(&s->sub_mu, NULL);
    pthread_cond_init(&s->lease_cv, NULL);
    s->ch_tail = &s->ch_head;
    s->w_tail = &s->w_head;
    s->rev = 1;        /* etcd: a fresh store is at revision 1; the first write is 2 */
    s->compacted = -1; /* etcd: nothing compacted yet, so compact(0) succeeds */
    s->max_txn_ops = o->max_txn_ops ? o->max_txn_ops : 128;
    s->clock_ms = o->clock_ms ? o->clock_ms : real_clock_ms;
    s->clock_arg = o->clock_arg;
    s->before_write_cb = o->before_write_cb;
    s->before_write_arg = o->before_write_arg;
    s->log_cb = o->log_cb;
    s->log_arg = o->log_arg;
    if (cairn_kindex_init(&s->idx) || cairn_revmap_init(&s->rm))
        goto fail;
    /* etcd: minimum TTL 2 s, restart extension 1 s (election timeout) */
    if (cairn_lease_table_init(&s->lt, o->lease_min_ttl > 0 ? o->lease_min_ttl : 2,
                               o->lease_restart_extend_ms))
        goto fail;
    s->batch = leveldb_writebatch_create();
    s->dir = malloc(strlen(o->dir) + 4);
    s->datadir = strdup(o->dir);
    if (!s->dir || !s->datadir)
        goto fail;
    rc = mkdir_p(o->dir);
    if (rc) {
        cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "cannot create %s: %s", o->dir, strerror(errno));
        goto fail;
    }
    sprintf(s->dir, "%s/db", o->dir);
    cairn_store_snap_cleanup(o->dir); /* working dirs of snapshots a crash left */

    s->dbopt = leveldb_options_create();
    s->cache = leveldb_cache_create_lru(o->cache_bytes ? o->cache_bytes : (8u << 20));
    s->bloom = leveldb_filterpolicy_create_bloom(10);
    leveldb_options_set_create_if_missing(s->dbopt, 1);
    leveldb_options_set_paranoid_checks(s->dbopt, 1);
    leveldb_options_set_cache(s->dbopt, s->cache);
    leveldb_options_set_filter_policy(s->dbopt, s->bloom);
    leveldb_options_set_write_buffer_size(s->dbopt, o->write_buffer_bytes ? o->write_buffer_bytes
                                                                          : (16u << 20));
    if (o->max_open_files > 0)
        leveldb_options_set_max_open_files(s->dbopt, o->max_open_files);
    leveldb_options_set_compression(s->dbopt, leveldb_snappy_compression);
    s->ropt = leveldb_readoptions_create();
    leveldb_readoptions_set_verify_checksums(s->ropt, 1);
    s->wopt_sync = leveldb_writeoptions_create();
    leveldb_writeoptions_set_sync(s->wopt_sync, 1);
    char *err = NULL;
    s->db = leveldb_open(s->dbopt, s->dir, &err);
    rc = db_err(s, err);
    if (rc)
        goto fail;

    char *fv;
    size_t fvl;
    rc = meta_get(s, "format", &fv, &fvl);
    if (rc)
        goto fail;
    rc = renew_restored_actor(s, o->dir, fv != NULL);
    if (rc) {
        leveldb_free(fv);
        goto fail;
    }
    int replayed = fv != NULL;
    if (!fv) {
        rc = create_fresh(s, o);
    } else {
        const uint8_t *f = (const uint8_t *)fv;
        uint32_t ver =
            fvl == 4 ? (uint32_t)f[0] << 24 | (uint32_t)f[1] << 16 | (uint32_t)f[2] << 8 | f[3] : 0;
        leveldb_free(fv);
        if (ver == FORMAT_VERSION || ver == FORMAT_V2) {
            /* format 2's checkpoints hold nothing that depends on where
             * history records are */
            rc = recover(s, 1);
        } else if (ver == FORMAT_V1) {
            /* no build that wrote format 1 wrote checkpoints: one here is
             * not trusted (the next clean close writes a new one) */
            rc = recover(s, 0);
        } else {
            cairn_store_log(s, CAIRN_STORE_LOG_ERROR,
                            "%s has data format %u; this build reads 1 to %u", s->dir, ver,
                            FORMAT_VERSION);
            rc = CAIRN_EBADVERSION;
        }
        if (!rc && ver != FORMAT_VERSION)
            rc = upgrade_format(s);
        if (!rc)
            rc = move_old_records(s);
    }
    if (!rc && replayed)
        rc = reopen_db(s);
    if (rc)
        goto fail;
    if (!s->kvs_known) {
        rc = corrupt(s, "no kvs map");
        goto fail;
    }
    atomic_store(&s->visible, s->rev);
    s->queued_rev = s->rev;
    cairn_store_lease_restart(s, cairn_store_now_ms(s));
    /* subscribers hear of changes from now on (not of the genesis or replay) */
    for (size_t i = 0; i < o->nsubscribers && !rc; i++)
        rc = cairn_store_subscribe(s, o->subscribers[i].cb, o->subscribers[i].arg);
    if (rc)
        goto fail;
    if (pthread_create(&s->committer, NULL, committer_main, s)) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    s->committer_started = 1;
    rc = cairn_store_lease_thread_start(s, o->lease_tick_ms);
    if (rc)
        goto fail;
    s->opened = 1;
    *out = s;
    return 0;
fail:
    cairn_store_close(s);
    return rc;
}

void cairn_store_close(cairn_store *s)
{
    if (!s)
        return;
    cairn_store_lease_thread_stop(s); /* its revokes go through the committer */
    if (s->committer_started) {
        pthread_mutex_lock(&s->qmu);
        s->stop = 1;
        pthread_cond_signal(&s->qcv);
        pthread_mutex_unlock(&s->qmu);
        pthread_join(s->committer, NULL);
    }
    /* physical compactions still running on their threads */
    pthread_mutex_lock(&s->qmu);
    while (s->compact_jobs)
        pthread_cond_wait(&s->dcv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
    while (s->ch_head) {
        pend_change *n = s->ch_head->next;
        free_pend_change(s->ch_head);
        s->ch_head = n;
    }
    ev_clear(s);
    free(s->cur_ev);
    /* nothing runs any more and every applied change is durable (unless
     * the store failed): memoise the state for the next open */
    if (s->opened && !atomic_load(&s->failed))
        write_checkpoint(s);
    if (s->db)
        leveldb_close(s->db);
    if (s->batch)
        leveldb_writebatch_destroy(s->batch);
    if (s->dbopt)
        leveldb_options_destroy(s->dbopt);
    if (s->cache)
        leveldb_cache_destroy(s->cache);
    if (s->bloom)
        leveldb_filterpolicy_destroy(s->bloom);
    if (s->ropt)
        leveldb_readoptions_destroy(s->ropt);
    if (s->wopt_sync)
        leveldb_writeoptions_destroy(s->wopt_sync);
    if (s->doc)
        cairn_doc_free(s->doc);
    cairn_kindex_destroy(&s->idx);
    cairn_revmap_destroy(&s->rm);
    cairn_lease_table_destroy(&s->lt);
    pthread_rwlock_destroy(&s->rw);
    pthread_mutex_destroy(&s->lease_mu);
    pthread_mutex_destroy(&s->sub_mu);
    free(s->subs);
    pthread_cond_destroy(&s->lease_cv);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    pthread_cond_destroy(&s->dcv);
    free(s->dir);
    free(s->datadir);
    free(s);
}

/* ---- blocking helper ------------------------------------------------------------- */

void cairn_store_sync_done(void *arg, int rc)
{
    cairn_store_sync_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int cairn_store_sync_wait_for(cairn_store_sync_wait *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    return w->rc;
}

/* Blocking = async + wait. On failure the response is destroyed here, so a
 * failed blocking call leaves nothing to free. */
#define SYNC_CALL(call_async, destroy)                                                             \
    do {                                                                                           \
        cairn_store_sync_wait w_ = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};    \
        int rc_ = (call_async);                                                                    \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
        rc_ = cairn_store_sync_wait_for(&w_);                                                      \
        if (rc_)                                                                                   \
            destroy;                                                                               \
        return rc_;                                                                                \
    } while (0)

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

int cairn_store_receive(cairn_store *s, const uint8_t *bytes, size_t len)
{
    SYNC_CALL(cairn_store_receive_async(s, bytes, len, cairn_store_sync_done, &w_), (void)0);
}

/* ---- compaction ------------------------------------------------------------------- */

/* A compaction between its records' durability and its completion: with
 * |physical|, LevelDB compacts the freed range on a thread of its own (it
 * may take seconds; the committer must not wait for it). */
typedef struct compact_job {
    cairn_store *s;
    int64_t revision;
    int physical;
    cairn_store_done_cb cb;
    void *arg;
} compact_job;

static void compact_physical(compact_job *j)
{
    cairn_store *s = j->s;
    uint64_t last;
    if (cairn_revmap_find(&s->rm, &last, j->revision) == 0) {
        /* every record of the changes up to the one that made |revision| */
        uint8_t lo[9], hi[9];
        lo[0] = hi[0] = 'O';
        cairn_store_be64(lo + 1, 0);
        cairn_store_be64(hi + 1, last + 1);
        leveldb_compact_range(s->db, (const char *)lo, 9, (const char *)hi, 9);
    }
}

static void compact_job_end(compact_job *j, int rc)
{
    cairn_store *s = j->s;
    j->cb(j->arg, rc);
    free(j);
    pthread_mutex_lock(&s->qmu);
    s->compact_jobs--;
    pthread_cond_broadcast(&s->dcv);
    pthread_mutex_unlock(&s->qmu);
}

static void *compact_main(void *arg)
{
    compact_job *j = arg;
    compact_physical(j);
    compact_job_end(j, 0);
    return NULL;
}

/* On the committer: the compaction record is durable. */
static void compact_durable(void *arg, int rc)
{
    compact_job *j = arg;
    if (!rc && j->physical) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int started = pthread_create(&th, &at, compact_main, j) == 0;
        pthread_attr_destroy(&at);
        if (started)
            return;
        compact_physical(j); /* no thread to be had: here, late rather than never */
    }
    compact_job_end(j, rc);
}

int cairn_store_compact_async(cairn_store *s, cairn_header *h, int64_t revision, int physical,
                              cairn_store_done_cb cb, void *arg)
{
    memset(h, 0, sizeof *h);
    compact_job *j = calloc(1, sizeof *j);
    if (!j)
        return CAIRN_ENOMEM;
    *j = (compact_job){s, revision, physical, cb, arg};
    pthread_rwlock_wrlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    if (rc)
        goto unlock;
    /* etcd: compact(r) with r <= the compacted revision -> compacted (on a
     * fresh store compact(0) succeeds once); r > current -> future */
    if (revision <= s->compacted) {
        rc = CAIRN_ECOMPACTED;
        goto unlock;
    }
    if (revision > s->rev) {
        rc = CAIRN_EFUTUREREV;
        goto unlock;
    }
    uint64_t ndel = 0;
    pthread_mutex_lock(&s->qmu);
    rc = compact_index(s, revision, s->batch, &ndel);
    meta_put_u64(s->batch, "compact", (uint64_t)revision);
    s->batch_n++;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    if (rc) {
        atomic_store(&s->failed, rc);
        goto unlock;
    }
    s->compacted = revision;
    pthread_mutex_lock(&s->qmu);
    s->compact_jobs++;
    pthread_mutex_unlock(&s->qmu);
    cairn_store_fill_header(s, h, s->rev); /* before the completion can run */
    rc = cairn_store_enqueue_wait(s, compact_durable, j, NULL);
    if (rc) {
        memset(h, 0, sizeof *h);
        pthread_mutex_lock(&s->qmu);
        s->compact_jobs--;
        pthread_mutex_unlock(&s->qmu);
        goto unlock;
    }
    pthread_rwlock_unlock(&s->rw);
    return 0;
unlock:
    pthread_rwlock_unlock(&s->rw);
    free(j);
    return rc;
}

int cairn_store_compact(cairn_store *s, cairn_header *h, int64_t revision, int physical)
{
    SYNC_CALL(cairn_store_compact_async(s, h, revision, physical, cairn_store_sync_done, &w_),
              memset(h, 0, sizeof *h));
}

/* ---- history (watch catch-up) ------------------------------------------------------ */

typedef struct hist_ev {
    uint64_t sub;
    cairn_event ev;
} hist_ev;

static int hist_ev_cmp(const void *a, const void *b)
{
    const hist_ev *x = a, *y = b;
    return x->sub < y->sub ? -1 : x->sub > y->sub;
}

static int in_range(const uint8_t *k, size_t kl, const uint8_t *key, size_t key_len,
                    const uint8_t *end, size_t end_len)
{
    int c = cairn_store_keycmp(k, kl, key, key_len);
    if (end_len == 0)
        return c == 0;
    if (c < 0)
        return 0;
    if (end_len == 1 && end[0] == 0)
        return 1;
    return cairn_store_keycmp(k, kl, end, end_len) < 0;
}

/* Emits the collected events of one revision in their original order. */
static int hist_flush(hist_ev *v, size_t n, int64_t rev, cairn_store_history_cb cb, void *arg)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, hist_ev_cmp);
    cairn_event *ev = malloc(n * sizeof *ev);
    if (!ev)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < n; i++)
        ev[i] = v[i].ev;
    int rc = cb(arg, rev, ev, n);
    free(ev);
    return rc;
}

int cairn_store_history(cairn_store *s, int64_t *last, int64_t from, const uint8_t *key,
                        size_t key_len, const uint8_t *range_end, size_t range_end_len,
                        cairn_store_history_cb cb, void *arg)
{
    if (last)
        *last = 0;
    pthread_rwlock_rdlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    int64_t upto = atomic_load(&s->visible);
    if (!rc && from > 0 && from < s->compacted)
        rc = CAIRN_ECOMPACTED;
    /* the snapshot pins what compaction may delete once the lock is gone */
    const leveldb_snapshot_t *snap = rc ? NULL : leveldb_create_snapshot(s->db);
    pthread_rwlock_unlock(&s->rw);
    if (rc)
        return rc;
    if (from < 1)
        from = 1;
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    leveldb_readoptions_set_verify_checksums(ro, 1);
    leveldb_readoptions_set_fill_cache(ro, 0);
    leveldb_readoptions_set_snapshot(ro, snap);
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, ro);
    /* the changes in apply order from the one that made |from| (or the
     * first revision after it): each body record heads its history
     * records and says which revision they belong to */
    uint64_t first;
    int any = cairn_revmap_find_from(&s->rm, &first, from) == 0;
    uint8_t start[9];
    start[0] = 'O';
    cairn_store_be64(start + 1, first);
    hist_ev *v = NULL;
    size_t n = 0, cap = 0;
    store_arena a = {0};
    body_cache bc = {0, NULL};
    store_buf cur_body = {0}; /* the 'O' value of the change being read */
    int64_t cur = 0;
    uint64_t cur_index = 0;
    if (any)
        leveldb_iter_seek(it, (const char *)start, 9);
    for (; any && leveldb_iter_valid(it) && !rc; leveldb_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *k = (const uint8_t *)leveldb_iter_key(it, &kl);
        if (kl < 9 || k[0] != 'O')
            break;
        uint64_t index = cairn_store_get_be64(k + 1);
        if (kl == 9) {
            rc = hist_flush(v, n, cur, cb, arg);
            n = 0;
            cairn_store_arena_free(&a);
            if (rc)
                break;
            const uint8_t *bv = (const uint8_t *)leveldb_iter_value(it, &vl);
            if (vl < 8) {
                rc = corrupt(s, "short change record");
                break;
            }
            cur = (int64_t)cairn_store_get_be64(bv);
            cur_index = index;
            if (cur > upto)
                break;
            /* kept for its history records: they may name its ops */
            cur_body.len = 0;
            rc = cairn_store_buf_put(&cur_body, bv, vl);
            continue;
        }
        if (kl < KREC_KEY_HDR || k[9] != 'K' || index != cur_index || cur == 0) {
            rc = corrupt(s, "a history record without the change that made it");
            break;
        }
        const uint8_t *hk = k + KREC_KEY_HDR;
        size_t hkl = kl - KREC_KEY_HDR;
        if (!in_range(hk, hkl, key, key_len, range_end, range_end_len))
            continue;
        cairn_store_krec r;
        const uint8_t *rv = (const uint8_t *)leveldb_iter_value(it, &vl);
        if (cairn_store_krec_parse(&r, rv, vl)) {
            rc = corrupt(s, "history record");
            break;
        }
        int del = r.del;
        const uint8_t *val = r.val;
        size_t val_len = r.val_len;
        if (r.body) { /* the body is the one this scan just passed */
            if (!bc.c || bc.index != cur_index)
                rc = body_cache_load(s, &bc, cur_index, cur_body.p, cur_body.len);
            if (!rc &&
                cairn_store_krec_body_value(bc.c, s->kvs.counter, r.pos, hk, hkl, &val, &val_len))
                rc = corrupt(s, "history record names an op that did not set its key");
            if (rc)
                break;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            hist_ev *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                rc = CAIRN_ENOMEM;
                break;
            }
            v = nv;
            cap = nc;
        }
        hist_ev *h = &v[n];
        memset(h, 0, sizeof *h);
        h->sub = r.sub;
        h->ev.type = del ? CAIRN_EVENT_DELETE : CAIRN_EVENT_PUT;
        h->ev.kv.key = cairn_store_arena_dup(&a, hk, hkl);
        h->ev.kv.key_len = hkl;
        h->ev.kv.mod_revision = cur;
        if (!del) {
            h->ev.kv.create_revision = (int64_t)r.cr;
            h->ev.kv.version = (int64_t)r.ver;
            h->ev.kv.lease = (int64_t)r.lease;
            h->ev.kv.value_len = val_len;
            h->ev.kv.value = cairn_store_arena_dup(&a, val, val_len);
        }
        if (!h->ev.kv.key || (!del && !h->ev.kv.value)) {
            rc = CAIRN_ENOMEM;
            break;
        }
        n++;
    }
    if (!rc)
        rc = hist_flush(v, n, cur, cb, arg);
    if (!rc) {
        char *err = NULL;
        leveldb_iter_get_error(it, &err);
        rc = db_err(s, err);
    }
    free(v);
    body_cache_free(&bc);
    cairn_store_buf_free(&cur_body);
    cairn_store_arena_free(&a);
    leveldb_iter_destroy(it);
    leveldb_readoptions_destroy(ro);
    leveldb_release_snapshot(s->db, snap);
    if (!rc && last)
        *last = upto;
    return rc;
}

void cairn_store_get_stats(cairn_store *s, cairn_store_stats *out)
{
    out->syncs = atomic_load(&s->n_syncs);
    out->changes = atomic_load(&s->n_changes);
}

/* ---- replication ------------------------------------------------------------------ */

/* Applies |n| received changes under the write lock (caller holds it),
 * taking ownership of them; verdicts[i] (may be NULL) as in
 * cairn_store_receive_changes. Returns CAIRN_EIO / ENOMEM when the store
 * broke (the rest are freed unapplied). The burst's records are held back
 * from the committer until the last one is batched: one group commit. */
static int receive_locked(cairn_store *s, cairn_change **chs, size_t n, int *verdicts)
{
    int rc = cairn_store_failed_rc(s);
    pthread_mutex_lock(&s->qmu);
    s->holding++;
    pthread_mutex_unlock(&s->qmu);
    size_t i = 0;
    for (; i < n && !rc; i++) {
        cairn_doc_observer obs;
        int v = cairn_doc_receive(s->doc, chs[i], cairn_store_observer(s, &obs));
        rc = s->obs_rc;
        if (verdicts)
            verdicts[i] = rc ? rc : v;
    }
    for (; i < n; i++) {
        cairn_change_free(chs[i]);
        if (verdicts)
            verdicts[i] = rc;
    }
    pthread_mutex_lock(&s->qmu);
    s->holding--;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return rc;
}

int cairn_store_receive_changes(cairn_store *s, cairn_change **chs, size_t n, int *verdicts,
                                cairn_store_heads_cb cb, void *arg)
{
    pend_wait *w = calloc(1, sizeof *w);
    pthread_rwlock_wrlock(&s->rw);
    int rc = w ? 0 : CAIRN_ENOMEM;
    if (rc) { /* still ours: free them unapplied */
        for (size_t i = 0; i < n; i++)
            cairn_change_free(chs[i]);
        if (verdicts)
            for (size_t i = 0; i < n; i++)
                verdicts[i] = rc;
    } else {
        rc = receive_locked(s, chs, n, verdicts);
    }
    if (!rc) {
        /* the heads now name only changes queued before this completion */
        const cairn_hash *h;
        size_t nh = cairn_dag_heads(cairn_doc_dag(s->doc), &h);
        w->heads = nh ? malloc(nh * sizeof *w->heads) : NULL;
        if (nh && !w->heads)
            rc = CAIRN_ENOMEM;
        else if (nh)
            memcpy(w->heads, h, nh * sizeof *w->heads);
        w->nheads = nh;
    }
    if (!rc) {
        w->hcb = cb;
        w->arg = arg;
        pthread_mutex_lock(&s->qmu);
        *s->w_tail = w;
        s->w_tail = &w->next;
        pthread_cond_signal(&s->qcv);
        pthread_mutex_unlock(&s->qmu);
        w = NULL;
    }
    pthread_rwlock_unlock(&s->rw);
    if (w)
        free(w->heads);
    free(w);
    return rc;
}

int cairn_store_receive_async(cairn_store *s, const uint8_t *bytes, size_t len,
                              cairn_store_done_cb cb, void *arg)
{
    cairn_change *c;
    int rc = cairn_change_decode(&c, bytes, len, NULL);
    if (rc)
        return rc;
    pthread_rwlock_wrlock(&s->rw);
    int v = 0;
    rc = receive_locked(s, &c, 1, &v);
    if (!rc)
        rc = v;
    if (!rc)
        rc = cairn_store_enqueue_wait(s, cb, arg, NULL);
    pthread_rwlock_unlock(&s->rw);
    return rc;
}

int cairn_store_rev_hash(cairn_store *s, cairn_hash *out, int64_t rev)
{
    memset(out, 0, sizeof *out);
    if (rev > atomic_load(&s->visible))
        return CAIRN_EFUTUREREV;
    if (rev <= 0)
        return CAIRN_ENOTFOUND;
    uint64_t index;
    int rc = cairn_revmap_find(&s->rm, &index, rev);
    if (rc)
        return rc;
    /* the body's hash is the change's name */
    char *v;
    size_t vl;
    rc = get_orec_of_rev(s, s->ropt, index, rev, &v, &vl);
    if (rc)
        return rc;
    cairn_hash_bytes(out, (const uint8_t *)v + 8, vl - 8);
    leveldb_free(v);
    return 0;
}
