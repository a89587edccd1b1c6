/*
 * The on-disk records (store.h: ON-DISK LAYOUT): 'M' metadata, each
 * change's 'O' body and its history records, the body loader the document
 * reads change bodies through, and the readers of history records (a value
 * either inline or a reference to the op in the change's body that set it).
 * Every error of LevelDB and every corruption is reported here, once, with
 * what was wrong.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crdt/error.h"
#include "crdt/wire.h"
#include "store/store_int.h"

int cairn_store_db_err(cairn_store *s, char *err)
{
    if (!err)
        return 0;
    int rc = (strstr(err, "Corruption") || strstr(err, "corrupt")) ? CAIRN_ECORRUPT : CAIRN_EIO;
    cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "leveldb: %s", err);
    leveldb_free(err);
    return rc;
}

/* Every corruption is reported with what was wrong, then returned. */
int cairn_store_corrupt(cairn_store *s, const char *what)
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
int cairn_store_meta_get(cairn_store *s, const char *name, char **v, size_t *vl)
{
    uint8_t k[64];
    size_t kl;
    meta_key(k, &kl, name);
    char *err = NULL;
    *v = leveldb_get(s->db, s->ropt, (const char *)k, kl, vl, &err);
    return cairn_store_db_err(s, err);
}

void cairn_store_meta_put(leveldb_writebatch_t *b, const char *name, const void *v, size_t vl)
{
    uint8_t k[64];
    size_t kl;
    meta_key(k, &kl, name);
    leveldb_writebatch_put(b, (const char *)k, kl, v, vl);
}

void cairn_store_meta_put_u64(leveldb_writebatch_t *b, const char *name, uint64_t v)
{
    uint8_t x[8];
    cairn_store_be64(x, v);
    cairn_store_meta_put(b, name, x, 8);
}

/* Reads the 'M' record |name| as a u64. With |present| NULL the record must
 * exist; otherwise *present says whether it does (and *out is 0 if not). */
int cairn_store_get_meta_u64(cairn_store *s, const char *name, uint64_t *out, int *present)
{
    char *v;
    size_t vl;
    int rc = cairn_store_meta_get(s, name, &v, &vl);
    if (rc)
        return rc;
    if (present)
        *present = v != NULL;
    if (!v) {
        *out = 0;
        return present ? 0 : cairn_store_corrupt(s, name);
    }
    if (vl != 8) {
        leveldb_free(v);
        return cairn_store_corrupt(s, name);
    }
    *out = cairn_store_get_be64((const uint8_t *)v);
    leveldb_free(v);
    return 0;
}

/* The 'O' record of change |index| (rev u64 BE ++ canonical bytes): *v is
 * NULL if there is none (leveldb_free it otherwise). */
int cairn_store_get_orec(cairn_store *s, const leveldb_readoptions_t *ro, uint64_t index, char **v,
                         size_t *vl)
{
    uint8_t k[9];
    k[0] = 'O';
    cairn_store_be64(k + 1, index);
    char *err = NULL;
    *vl = 0;
    *v = leveldb_get(s->db, ro, (const char *)k, 9, vl, &err);
    return cairn_store_db_err(s, err);
}

/* get_orec for the change that made |rev|: a missing record, or one that
 * made another revision, is corruption ('O' is never deleted). */
int cairn_store_get_orec_of_rev(cairn_store *s, const leveldb_readoptions_t *ro, uint64_t index,
                                int64_t rev, char **v, size_t *vl)
{
    int rc = cairn_store_get_orec(s, ro, index, v, vl);
    if (rc)
        return rc;
    if (!*v || *vl < 8 || (int64_t)cairn_store_get_be64((const uint8_t *)*v) != rev) {
        leveldb_free(*v);
        *v = NULL;
        return cairn_store_corrupt(s,
                                   "the change of a revision is missing or made another revision");
    }
    return 0;
}

/* The document's body loader (cairn_dag_load_cb): the DAG keeps no change
 * bodies, so sync and reads at past heads get them from the 'O' record of
 * their apply index; the DAG checks the hash. Only durable changes are
 * there: a change still in the pending batch reads as CAIRN_ENOTFOUND. */
int cairn_store_load_body(void *arg, uint64_t index, uint8_t **bytes, size_t *len)
{
    cairn_store *s = arg;
    char *v;
    size_t vl;
    int rc = cairn_store_get_orec(s, s->ropt, index, &v, &vl);
    if (rc)
        return rc;
    if (!v)
        return CAIRN_ENOTFOUND;
    uint8_t *b = vl > 8 ? malloc(vl - 8) : NULL;
    if (b)
        memcpy(b, v + 8, vl - 8);
    leveldb_free(v);
    if (!b)
        return vl > 8 ? CAIRN_ENOMEM : cairn_store_corrupt(s, "short change record");
    *bytes = b;
    *len = vl - 8;
    return 0;
}

/* A new document for |s| that loads change bodies from 'O'. */
int cairn_store_new_doc(cairn_store *s)
{
    int rc = cairn_doc_new(&s->doc, &s->actor);
    if (!rc)
        rc = cairn_doc_set_loader(s->doc, cairn_store_load_body, s);
    return rc;
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

void cairn_store_body_cache_free(body_cache *bc)
{
    if (bc->c)
        cairn_change_free(bc->c);
    bc->c = NULL;
}

/* Makes |bc| hold change |index|, decoded from its 'O' value |v| (rev u64
 * BE ++ canonical bytes; |vl| >= 8). */
int cairn_store_body_cache_load(cairn_store *s, body_cache *bc, uint64_t index, const uint8_t *v,
                                size_t vl)
{
    cairn_store_body_cache_free(bc);
    int rc = cairn_change_decode(&bc->c, v + 8, vl - 8, NULL);
    if (rc) {
        bc->c = NULL;
        return rc == CAIRN_ENOMEM ? rc : cairn_store_corrupt(s, "a stored change does not decode");
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
                      uint64_t index, int64_t rev, uint64_t pos, const uint8_t *key, size_t key_len,
                      const uint8_t **val, size_t *vl)
{
    if (!bc->c || bc->index != index) {
        char *v;
        size_t n;
        int rc = cairn_store_get_orec_of_rev(s, ro, index, rev, &v, &n);
        if (!rc) {
            rc = cairn_store_body_cache_load(s, bc, index, (const uint8_t *)v, n);
            leveldb_free(v);
        }
        if (rc)
            return rc;
    }
    if (cairn_store_krec_body_value(bc->c, s->kvs.counter, pos, key, key_len, val, vl))
        return cairn_store_corrupt(s, "history record names an op that did not set its key");
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

int cairn_store_read_hist(cairn_store *s, store_arena *a, const leveldb_readoptions_t *ro,
                          int64_t rev, const uint8_t *key, size_t key_len, cairn_kv *out,
                          int want_value)
{
    uint64_t index;
    if (cairn_revmap_find(&s->rm, &index, rev))
        return cairn_store_corrupt(s, "no change made a revision with history");
    uint8_t stackk[256];
    uint8_t *k = key_len + KREC_KEY_HDR <= sizeof stackk ? stackk : malloc(key_len + KREC_KEY_HDR);
    if (!k)
        return CAIRN_ENOMEM;
    krec_key_hdr(k, index);
    if (key_len)
        memcpy(k + KREC_KEY_HDR, key, key_len);
    char *err = NULL;
    size_t vl = 0;
    char *v = leveldb_get(s->db, ro, (const char *)k, key_len + KREC_KEY_HDR, &vl, &err);
    if (k != stackk)
        free(k);
    int rc = cairn_store_db_err(s, err);
    if (rc)
        return rc;
    if (!v) {
        cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "history record of revision %lld missing",
                        (long long)rev);
        return CAIRN_ECORRUPT;
    }
    cairn_store_krec r;
    body_cache bc = {0, NULL};
    rc = cairn_store_krec_parse(&r, (const uint8_t *)v, vl)
             ? cairn_store_corrupt(s, "history record")
             : 0;
    if (!rc && r.del) /* a tombstone is never read as a value */
        rc = cairn_store_corrupt(s, "history read of a deleted key");
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
        if (r.body && (rc = body_value(s, ro, &bc, index, rev, r.pos, key, key_len, &val, &len)))
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
    cairn_store_body_cache_free(&bc);
    leveldb_free(v);
    return rc;
}

/* Appends the change's records to the shared batch (caller holds qmu): its
 * body under 'O' and one history record per event. */
int cairn_store_batch_change(cairn_store *s, const cairn_change *c, uint64_t index, int64_t rev)
{
    leveldb_writebatch_t *b = s->batch;
    s->batch_bytes += c->len;
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
