/*
 * Who this store is: etcd's member and cluster id rule, the genesis change
 * every node of a cluster builds byte for byte, a new data dir's identity
 * records, the new actor a restored copy draws, and the header every answer
 * carries. store.h: IDENTITY and DOCUMENT LAYOUT.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crdt/error.h"
#include "store/store_int.h"

static const char GENESIS_SALT[] = "cairn-genesis";

static int strcmp_p(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* etcd: sha1(sorted peer URLs ++ cluster token [++ decimal unix seconds]),
 * first 8 bytes BE (membership.newMember; the time only for added members) */
static uint64_t member_id(const char *const *peer_urls, size_t n, const char *token,
                          const char *suffix)
{
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
    if (!rc && suffix)
        rc = cairn_store_buf_put(&b, suffix, strlen(suffix));
    if (!rc) {
        uint8_t h[20];
        cairn_store_sha1(h, b.p ? b.p : (const uint8_t *)"", b.len);
        id = cairn_store_get_be64(h);
    }
    cairn_store_buf_free(&b);
    free(s);
    return id;
}

uint64_t cairn_store_member_id_of(const char *const *peer_urls, size_t n, const char *token)
{
    return member_id(peer_urls, n, token, NULL);
}

uint64_t cairn_store_member_id_at(const char *const *peer_urls, size_t n, const char *token,
                                  int64_t unix_s)
{
    char sfx[24];
    snprintf(sfx, sizeof sfx, "%lld", (long long)unix_s);
    return member_id(peer_urls, n, token, sfx);
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

int cairn_store_make_genesis(cairn_change **out, const char *token)
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

/* A joining member's dir: the ids a member of the cluster answered and no
 * change, so that nothing this node writes can fork the cluster's
 * document (its genesis and members come from the peers with the rest). */
static int create_joined(cairn_store *s, const cairn_store_options *o, const char *token)
{
    s->member_id = o->join_member_id;
    s->cluster_id = o->join_cluster_id;
    s->joined = 1;
    int rc = cairn_store_new_doc(s);
    if (rc)
        return rc;
    uint8_t fv[4] = {0, 0, 0, STORE_FORMAT};
    leveldb_writebatch_t *b = leveldb_writebatch_create();
    cairn_store_meta_put(b, "actor", s->actor.b, CAIRN_ACTOR_LEN);
    cairn_store_meta_put_u64(b, "member", s->member_id);
    cairn_store_meta_put_u64(b, "cluster", s->cluster_id);
    cairn_store_meta_put(b, "token", token, strlen(token));
    cairn_store_meta_put(b, "joined", "", 0);
    /* last: a dir with a format marker is an existing one */
    cairn_store_meta_put(b, "format", fv, 4);
    char *err = NULL;
    leveldb_write(s->db, s->wopt_sync, b, &err);
    leveldb_writebatch_destroy(b);
    return cairn_store_db_err(s, err);
}

int cairn_store_create_fresh(cairn_store *s, const cairn_store_options *o)
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
    if (o->join)
        return create_joined(s, o, token);
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

    int rc = cairn_store_new_doc(s);
    if (rc)
        return rc;
    cairn_change *g;
    rc = cairn_store_make_genesis(&g, token);
    if (rc)
        return rc;
    cairn_doc_observer obs;
    rc = cairn_doc_receive(s->doc, g, cairn_store_observer(s, &obs));
    if (!rc)
        rc = s->obs_rc;
    if (!rc)
        rc = cairn_store_members_seed(s, o, token);
    if (rc)
        return rc;
    /* The genesis and members records are in s->batch; add the identity and write it all
     * at once, so a crash leaves either nothing or a whole new store. */
    uint8_t fv[4] = {0, 0, 0, STORE_FORMAT};
    cairn_store_meta_put(s->batch, "actor", s->actor.b, CAIRN_ACTOR_LEN);
    cairn_store_meta_put_u64(s->batch, "member", s->member_id);
    cairn_store_meta_put_u64(s->batch, "cluster", s->cluster_id);
    cairn_store_meta_put(s->batch, "token", token, strlen(token));
    cairn_store_meta_put(s->batch, "format", fv, 4);
    char *err = NULL;
    leveldb_write(s->db, s->wopt_sync, s->batch, &err);
    rc = cairn_store_db_err(s, err);
    leveldb_writebatch_clear(s->batch);
    s->batch_n = 0;
    s->batch_local = s->batch_remote = 0; /* written here, not by the committer */
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
int cairn_store_renew_restored_actor(cairn_store *s, const char *dir, int exists)
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
        int rc = cairn_store_meta_get(s, "actor", &old, &oldl);
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
        cairn_store_meta_put(b, "actor", a.b, CAIRN_ACTOR_LEN);
        char *err = NULL;
        leveldb_write(s->db, s->wopt_sync, b, &err);
        leveldb_writebatch_destroy(b);
        rc = cairn_store_db_err(s, err);
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
