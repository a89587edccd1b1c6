/*
 * The member table, kept in the document's members map (store.h, DOCUMENT
 * LAYOUT): add, remove, update, promote and a member's own publish are
 * changes, so membership replicates like writes and merges by the map rules
 * (store.h, membership). The table is never cached: MemberList and the peer
 * thread read the map (a handful of entries) under the read lock, and
 * members_gen tells the peer thread when to look again.
 *
 * The initial members of a new cluster come from a second deterministic
 * change, built the same way on every node from the cluster token and the
 * initial cluster alone: its author is an actor derived from those (so its
 * hash is the same everywhere), it depends on the genesis only, its clock
 * is 0, and the members come sorted by id. It is built on a scratch
 * document (so the ops name the genesis's maps exactly as any replica would
 * see them) and received into the store's document like a peer's change.
 * Nodes started apart hence agree on the initial table without talking, as
 * etcd's nodes agree on their initial raft configuration. Names and client
 * URLs are each member's own to publish (etcd: publish at start).
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "store/store_int.h"

static const char MEMBERS_SALT[] = "cairn-members";
#define F_NAME "name"
#define F_PEER "peer"
#define F_CLIENT "client"
#define F_LEARNER "learner"

static int strcmp_p(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* |urls| sorted (when |sort|) and joined by '\n'; new string. */
static char *join_urls(const char *const *urls, size_t n, int sort)
{
    const char **v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return NULL;
    size_t len = 1;
    for (size_t i = 0; i < n; i++) {
        v[i] = urls[i];
        len += strlen(urls[i]) + 1;
    }
    if (sort)
        qsort(v, n, sizeof *v, strcmp_p);
    char *out = malloc(len);
    if (out) {
        char *p = out;
        for (size_t i = 0; i < n; i++) {
            size_t l = strlen(v[i]);
            if (i)
                *p++ = '\n';
            memcpy(p, v[i], l);
            p += l;
        }
        *p = 0;
    }
    free(v);
    return out;
}

static int split_urls(char ***out, size_t *n, const uint8_t *p, size_t len)
{
    *out = NULL;
    *n = 0;
    if (!len)
        return 0;
    size_t k = 1;
    for (size_t i = 0; i < len; i++)
        k += p[i] == '\n';
    char **v = calloc(k, sizeof *v);
    if (!v)
        return CAIRN_ENOMEM;
    size_t start = 0, j = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && p[i] != '\n')
            continue;
        v[j] = malloc(i - start + 1);
        if (!v[j]) {
            for (size_t x = 0; x < j; x++)
                free(v[x]);
            free(v);
            return CAIRN_ENOMEM;
        }
        memcpy(v[j], p + start, i - start);
        v[j][i - start] = 0;
        j++;
        start = i + 1;
    }
    *out = v;
    *n = j;
    return 0;
}

int cairn_store_member_urls_valid(const char *const *urls, size_t n)
{
    /* etcd: types.NewURLs (measured: "notaurl", "http://127.0.0.1" with no
     * port, "ftp://..." and an empty list are all "given member URLs are
     * invalid") */
    if (!n)
        return CAIRN_EMEMBERBADURLS;
    static const char *const schemes[] = {"http://", "https://", "unix://", "unixs://"};
    for (size_t i = 0; i < n; i++) {
        const char *u = urls[i];
        const char *host = NULL;
        for (size_t k = 0; k < 4 && !host; k++)
            if (strncmp(u, schemes[k], strlen(schemes[k])) == 0)
                host = u + strlen(schemes[k]);
        if (!host || strchr(u, '\n'))
            return CAIRN_EMEMBERBADURLS;
        size_t hl = strcspn(host, "/?#");
        if (host[hl] == '/') /* a path */
            return CAIRN_EMEMBERBADURLS;
        /* host:port, the port after the last ':' outside brackets */
        const char *close = memchr(host, ']', hl);
        const char *from = close ? close : host;
        const char *colon = NULL;
        for (const char *q = from; q < host + hl; q++)
            if (*q == ':')
                colon = q;
        if (!colon || (host[0] == '[' && !close))
            return CAIRN_EMEMBERBADURLS;
    }
    return 0;
}

/* ---- reading the table ---------------------------------------------------- */

typedef struct list_ctx {
    cairn_store *s;
    cairn_member_info *v;
    size_t n, cap;
    int rc;
} list_ctx;

static int field_str(cairn_store *s, cairn_objid obj, const char *f, const uint8_t **p, size_t *len)
{
    cairn_read r;
    *p = (const uint8_t *)"";
    *len = 0;
    int rc = cairn_doc_get(s->doc, &r, obj, (const uint8_t *)f, strlen(f));
    if (rc)
        return rc;
    if (r.kind == CAIRN_READ_SCALAR &&
        (r.value.type == CAIRN_V_STR || r.value.type == CAIRN_V_BYTES)) {
        *p = r.value.v.bytes.ptr;
        *len = r.value.v.bytes.len;
    }
    return 0;
}

static int list_cb(void *arg, const uint8_t *key, size_t key_len, const cairn_read *value)
{
    list_ctx *x = arg;
    if (key_len != 8 || value->kind != CAIRN_READ_MAP)
        return 0; /* not a member (no honest node writes one) */
    if (x->n == x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 8;
        cairn_member_info *nv = realloc(x->v, cap * sizeof *nv);
        if (!nv)
            return CAIRN_ENOMEM;
        x->v = nv;
        x->cap = cap;
    }
    cairn_member_info *m = &x->v[x->n];
    memset(m, 0, sizeof *m);
    m->id = cairn_store_get_be64(key);
    x->n++;
    const uint8_t *p;
    size_t len;
    int rc = field_str(x->s, value->obj, F_NAME, &p, &len);
    if (!rc) {
        m->name = malloc(len + 1);
        if (!m->name)
            return CAIRN_ENOMEM;
        memcpy(m->name, p, len);
        m->name[len] = 0;
        rc = field_str(x->s, value->obj, F_PEER, &p, &len);
    }
    if (!rc)
        rc = split_urls(&m->peer_urls, &m->npeer_urls, p, len);
    if (!rc)
        rc = field_str(x->s, value->obj, F_CLIENT, &p, &len);
    if (!rc)
        rc = split_urls(&m->client_urls, &m->nclient_urls, p, len);
    cairn_read r;
    if (!rc)
        rc =
            cairn_doc_get(x->s->doc, &r, value->obj, (const uint8_t *)F_LEARNER, strlen(F_LEARNER));
    if (!rc)
        m->learner = r.kind == CAIRN_READ_SCALAR && r.value.type == CAIRN_V_BOOL && r.value.v.b;
    return rc;
}

static int by_id(const void *a, const void *b)
{
    uint64_t x = ((const cairn_member_info *)a)->id, y = ((const cairn_member_info *)b)->id;
    return x < y ? -1 : x > y;
}

/* Caller holds rw (read or write). */
static int list_locked(cairn_store *s, cairn_member_info **out, size_t *n)
{
    list_ctx x = {s, NULL, 0, 0, 0};
    int rc = s->kvs_known ? cairn_doc_map_foreach(s->doc, s->members, list_cb, &x) : 0;
    if (rc) {
        cairn_store_member_list_free(x.v, x.n);
        *out = NULL;
        *n = 0;
        return rc;
    }
    if (x.n)
        qsort(x.v, x.n, sizeof *x.v, by_id);
    *out = x.v;
    *n = x.n;
    return 0;
}

int cairn_store_member_list(cairn_store *s, cairn_member_info **out, size_t *n)
{
    pthread_rwlock_rdlock(&s->rw);
    int rc = list_locked(s, out, n);
    pthread_rwlock_unlock(&s->rw);
    return rc;
}

void cairn_store_member_list_free(cairn_member_info *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(m[i].name);
        for (size_t j = 0; j < m[i].npeer_urls; j++)
            free(m[i].peer_urls[j]);
        free(m[i].peer_urls);
        for (size_t j = 0; j < m[i].nclient_urls; j++)
            free(m[i].client_urls[j]);
        free(m[i].client_urls);
    }
    free(m);
}

uint64_t cairn_store_members_gen(const cairn_store *s)
{
    return atomic_load(&((cairn_store *)s)->members_gen);
}

static cairn_member_info *find(cairn_member_info *v, size_t n, uint64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].id == id)
            return &v[i];
    return NULL;
}

/* 1 if a member other than |except| has one of |urls|. */
static int url_taken(cairn_member_info *v, size_t n, uint64_t except, const char *const *urls,
                     size_t nurls)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i].id == except)
            continue;
        for (size_t j = 0; j < v[i].npeer_urls; j++)
            for (size_t k = 0; k < nurls; k++)
                if (strcmp(v[i].peer_urls[j], urls[k]) == 0)
                    return 1;
    }
    return 0;
}

int cairn_store_member_state(cairn_store *s, uint64_t id)
{
    cairn_member_info *v;
    size_t n;
    int rc = cairn_store_member_list(s, &v, &n);
    if (rc)
        return rc;
    cairn_member_info *m = find(v, n, id);
    rc = m ? m->learner : CAIRN_ENOTFOUND;
    cairn_store_member_list_free(v, n);
    return rc;
}

/* ---- writing it ----------------------------------------------------------- */

static int set_str(cairn_doc *d, cairn_objid obj, const char *f, const char *str)
{
    cairn_value v = {.type = CAIRN_V_STR};
    v.v.bytes.ptr = (const uint8_t *)str;
    v.v.bytes.len = strlen(str);
    return cairn_doc_put(d, obj, (const uint8_t *)f, strlen(f), &v);
}

/* members[id] = {name, peer, [learner]} on |d| inside an open change. */
static int put_member(cairn_doc *d, cairn_objid members, uint64_t id, const char *name,
                      const char *const *urls, size_t n, int learner)
{
    uint8_t k[8];
    cairn_store_be64(k, id);
    cairn_objid obj;
    char *peer = join_urls(urls, n, 1);
    if (!peer)
        return CAIRN_ENOMEM;
    int rc = cairn_doc_put_object(d, &obj, members, k, 8, CAIRN_OBJ_MAP);
    if (!rc)
        rc = set_str(d, obj, F_NAME, name);
    if (!rc)
        rc = set_str(d, obj, F_PEER, peer);
    if (!rc && learner) {
        cairn_value v = {.type = CAIRN_V_BOOL};
        v.v.b = 1;
        rc = cairn_doc_put(d, obj, (const uint8_t *)F_LEARNER, strlen(F_LEARNER), &v);
    }
    free(peer);
    return rc;
}

/* The member's map object (caller holds rw). */
static int member_obj(cairn_store *s, cairn_objid *obj, uint64_t id)
{
    uint8_t k[8];
    cairn_store_be64(k, id);
    cairn_read r;
    int rc = cairn_doc_get(s->doc, &r, s->members, k, 8);
    if (rc)
        return rc;
    if (r.kind != CAIRN_READ_MAP)
        return CAIRN_EMEMBERNOTFOUND;
    *obj = r.obj;
    return 0;
}

typedef int (*edit_fn)(cairn_store *s, void *arg);

/* One change made by |fn| under the write lock, durable on return. */
static int member_change(cairn_store *s, edit_fn fn, void *arg)
{
    cairn_store_sync_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    pthread_rwlock_wrlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    if (!rc && !s->kvs_known)
        rc = CAIRN_ESTATE;
    if (!rc)
        rc = cairn_doc_begin(s->doc, cairn_store_now_ms(s));
    int open = !rc;
    if (!rc)
        rc = fn(s, arg);
    if (rc && open)
        cairn_doc_rollback(s->doc);
    int queued = 0;
    if (!rc && open) {
        cairn_doc_observer obs;
        const cairn_change *c = NULL;
        rc = cairn_doc_commit(s->doc, &c, cairn_store_observer(s, &obs));
        if (!rc)
            rc = s->obs_rc;
        if (!rc) {
            rc = cairn_store_enqueue_wait(s, cairn_store_sync_done, &w, NULL);
            queued = !rc;
        }
    }
    pthread_rwlock_unlock(&s->rw);
    if (queued)
        return cairn_store_sync_wait_for(&w);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return rc;
}

typedef struct add_arg {
    uint64_t *id;
    const char *const *urls;
    size_t n;
    int learner;
} add_arg;

static int add_fn(cairn_store *s, void *arg)
{
    add_arg *a = arg;
    cairn_member_info *v;
    size_t n;
    int rc = list_locked(s, &v, &n);
    if (rc)
        return rc;
    char *token = NULL;
    size_t tl = 0;
    rc = cairn_store_meta_get(s, "token", &token, &tl);
    char tok[256];
    snprintf(tok, sizeof tok, "%.*s", token ? (int)(tl < 255 ? tl : 255) : 0, token ? token : "");
    leveldb_free(token);
    uint64_t id =
        rc ? 0
           : cairn_store_member_id_at(a->urls, a->n, tok, (int64_t)(cairn_store_now_ms(s) / 1000));
    /* etcd: ValidateConfigurationChange checks the id first, then the URLs;
     * then the learner count */
    if (!rc && find(v, n, id))
        rc = CAIRN_EMEMBEREXIST;
    if (!rc && url_taken(v, n, 0, a->urls, a->n))
        rc = CAIRN_EPEERURLEXIST;
    if (!rc && a->learner) {
        size_t nl = 0;
        for (size_t i = 0; i < n; i++)
            nl += v[i].learner;
        if (nl >= 1) /* etcd: maxLearners = 1 */
            rc = CAIRN_ETOOMANYLEARNERS;
    }
    cairn_store_member_list_free(v, n);
    if (!rc)
        rc = put_member(s->doc, s->members, id, "", a->urls, a->n, a->learner);
    if (!rc)
        *a->id = id;
    return rc;
}

int cairn_store_member_add(cairn_store *s, uint64_t *id, const char *const *peer_urls, size_t n,
                           int learner)
{
    *id = 0;
    int rc = cairn_store_member_urls_valid(peer_urls, n);
    if (rc)
        return rc;
    add_arg a = {id, peer_urls, n, learner};
    return member_change(s, add_fn, &a);
}

static int remove_fn(cairn_store *s, void *arg)
{
    uint64_t id = *(uint64_t *)arg;
    cairn_objid obj;
    int rc = member_obj(s, &obj, id);
    uint8_t k[8];
    cairn_store_be64(k, id);
    if (!rc)
        rc = cairn_doc_delete(s->doc, s->members, k, 8);
    return rc;
}

int cairn_store_member_remove(cairn_store *s, uint64_t id)
{
    return member_change(s, remove_fn, &id);
}

typedef struct update_arg {
    uint64_t id;
    const char *const *urls;
    size_t n;
} update_arg;

static int update_fn(cairn_store *s, void *arg)
{
    update_arg *a = arg;
    cairn_objid obj;
    int rc = member_obj(s, &obj, a->id);
    cairn_member_info *v = NULL;
    size_t n = 0;
    if (!rc)
        rc = list_locked(s, &v, &n);
    if (!rc && url_taken(v, n, a->id, a->urls, a->n))
        rc = CAIRN_EPEERURLEXIST;
    cairn_store_member_list_free(v, n);
    char *peer = rc ? NULL : join_urls(a->urls, a->n, 1);
    if (!rc && !peer)
        rc = CAIRN_ENOMEM;
    if (!rc)
        rc = set_str(s->doc, obj, F_PEER, peer);
    free(peer);
    return rc;
}

int cairn_store_member_update(cairn_store *s, uint64_t id, const char *const *peer_urls, size_t n)
{
    int rc = cairn_store_member_urls_valid(peer_urls, n);
    if (rc)
        return rc;
    update_arg a = {id, peer_urls, n};
    return member_change(s, update_fn, &a);
}

static int promote_fn(cairn_store *s, void *arg)
{
    uint64_t id = *(uint64_t *)arg;
    cairn_member_info *v;
    size_t n;
    int rc = list_locked(s, &v, &n);
    if (rc)
        return rc;
    cairn_member_info *m = find(v, n, id);
    if (!m)
        rc = CAIRN_EMEMBERNOTFOUND;
    else if (!m->learner)
        rc = CAIRN_EMEMBERNOTLEARNER;
    else if (!m->name[0])
        rc = CAIRN_ELEARNERNOTREADY; /* it never published here: not started or not synced */
    cairn_store_member_list_free(v, n);
    cairn_objid obj;
    if (!rc)
        rc = member_obj(s, &obj, id);
    if (!rc)
        rc = cairn_doc_delete(s->doc, obj, (const uint8_t *)F_LEARNER, strlen(F_LEARNER));
    return rc;
}

int cairn_store_member_promote(cairn_store *s, uint64_t id)
{
    return member_change(s, promote_fn, &id);
}

typedef struct publish_arg {
    const char *name;
    const char *const *urls;
    size_t n;
} publish_arg;

static int publish_fn(cairn_store *s, void *arg)
{
    publish_arg *a = arg;
    cairn_objid obj;
    int rc = member_obj(s, &obj, s->member_id);
    if (rc)
        return rc == CAIRN_EMEMBERNOTFOUND ? CAIRN_ENOTFOUND : rc;
    const uint8_t *p;
    size_t len;
    rc = field_str(s, obj, F_NAME, &p, &len);
    if (!rc && (len != strlen(a->name) || memcmp(p, a->name, len)))
        rc = set_str(s->doc, obj, F_NAME, a->name);
    char *client = rc ? NULL : join_urls(a->urls, a->n, 0);
    if (!rc && !client)
        rc = CAIRN_ENOMEM;
    if (!rc)
        rc = field_str(s, obj, F_CLIENT, &p, &len);
    if (!rc && (len != strlen(client) || memcmp(p, client, len)))
        rc = set_str(s->doc, obj, F_CLIENT, client);
    free(client);
    return rc;
}

int cairn_store_member_publish(cairn_store *s, const char *name, const char *const *client_urls,
                               size_t n)
{
    publish_arg a = {name, client_urls, n};
    return member_change(s, publish_fn, &a); /* no edit: commit writes nothing */
}

/* ---- the initial members ---------------------------------------------------- */

typedef struct seed_ent {
    uint64_t id;
    const cairn_store_member *m;
} seed_ent;

static int seed_cmp(const void *a, const void *b)
{
    uint64_t x = ((const seed_ent *)a)->id, y = ((const seed_ent *)b)->id;
    return x < y ? -1 : x > y;
}

int cairn_store_members_seed(cairn_store *s, const cairn_store_options *o, const char *token)
{
    static const char *const def_urls[1] = {"http://localhost:2380"};
    cairn_store_member def = {o->name ? o->name : "default", def_urls, 1};
    const cairn_store_member *mem = o->ninitial_cluster ? o->initial_cluster : &def;
    size_t n = o->ninitial_cluster ? o->ninitial_cluster : 1;
    seed_ent *e = calloc(n, sizeof *e);
    store_buf b = {0};
    cairn_doc *d = NULL;
    cairn_change *g = NULL, *c = NULL;
    int rc = e ? cairn_store_buf_put(&b, MEMBERS_SALT, sizeof MEMBERS_SALT - 1) : CAIRN_ENOMEM;
    if (!rc)
        rc = cairn_store_buf_put(&b, token, strlen(token) + 1);
    for (size_t i = 0; i < n && !rc; i++) {
        e[i].id = cairn_store_member_id_of(mem[i].peer_urls, mem[i].npeer_urls, token);
        e[i].m = &mem[i];
    }
    if (!rc)
        qsort(e, n, sizeof *e, seed_cmp);
    for (size_t i = 0; i < n && !rc; i++) {
        /* the author covers every field: two initial clusters that differ in
         * anything have different members changes */
        uint8_t k[8];
        cairn_store_be64(k, e[i].id);
        rc = cairn_store_buf_put(&b, k, 8);
        const char *name = e[i].m->name ? e[i].m->name : "";
        if (!rc)
            rc = cairn_store_buf_put(&b, name, strlen(name) + 1);
        for (size_t j = 0; j < e[i].m->npeer_urls && !rc; j++)
            rc = cairn_store_buf_put(&b, e[i].m->peer_urls[j], strlen(e[i].m->peer_urls[j]) + 1);
    }
    cairn_actor a;
    if (!rc) {
        uint8_t h[CAIRN_HASH_LEN];
        cairn_hash_bytes((cairn_hash *)h, b.p, b.len);
        memcpy(a.b, h, CAIRN_ACTOR_LEN);
        rc = cairn_doc_new(&d, &a);
    }
    if (!rc)
        rc = cairn_store_make_genesis(&g, token);
    if (!rc) {
        rc = cairn_doc_receive(d, g, NULL);
        g = NULL;
    }
    cairn_objid members;
    if (!rc)
        rc = cairn_store_find_root_map(d, &members, "members");
    if (!rc)
        rc = cairn_doc_begin(d, 0);
    for (size_t i = 0; i < n && !rc; i++)
        rc = put_member(d, members, e[i].id, e[i].m->name ? e[i].m->name : "", e[i].m->peer_urls,
                        e[i].m->npeer_urls, 0);
    const cairn_change *made = NULL;
    if (!rc)
        rc = cairn_doc_commit(d, &made, NULL);
    if (!rc && made)
        rc = cairn_change_decode(&c, made->bytes, made->len, &made->hash);
    if (!rc && c) {
        cairn_doc_observer obs;
        rc = cairn_doc_receive(s->doc, c, cairn_store_observer(s, &obs));
        c = NULL;
        if (!rc)
            rc = s->obs_rc;
    }
    cairn_change_free(g);
    cairn_doc_free(d);
    cairn_store_buf_free(&b);
    free(e);
    return rc;
}

int cairn_store_members_upgrade(cairn_store *s, const cairn_store_options *o)
{
    /* A data dir made before the members map was filled: its nodes all
     * started from one initial cluster (they share the genesis, so the
     * token), and build the same members change from it now. Written like
     * a new dir's records: the observer's batch, one sync write. */
    size_t n = 0;
    int rc = cairn_doc_length(s->doc, &n, s->members);
    if (rc || n)
        return rc;
    char *token = NULL;
    size_t tl = 0;
    rc = cairn_store_meta_get(s, "token", &token, &tl);
    if (rc || !token)
        return rc;
    char *tok = malloc(tl + 1);
    if (!tok) {
        leveldb_free(token);
        return CAIRN_ENOMEM;
    }
    memcpy(tok, token, tl);
    tok[tl] = 0;
    leveldb_free(token);
    rc = cairn_store_members_seed(s, o, tok);
    free(tok);
    if (rc)
        return rc;
    char *err = NULL;
    leveldb_write(s->db, s->wopt_sync, s->batch, &err);
    rc = cairn_store_db_err(s, err);
    leveldb_writebatch_clear(s->batch);
    s->batch_n = 0;
    s->batch_local = s->batch_remote = 0; /* written here, not by the committer */
    if (!rc)
        cairn_store_log(s, CAIRN_STORE_LOG_INFO,
                        "the member table was empty: filled from the initial cluster");
    return rc;
}
