/*
 * The store's spine: opening (creating a data dir or recovering one),
 * starting and stopping its threads, closing. Each part lives in a file of
 * its own, every one of them below this one:
 *   identity.c  ids, genesis, a new or restored dir's identity
 *   records.c   the on-disk records and their readers
 *   apply.c     the observer: applied change -> revision, index, records
 *   commit.c    the committer (group commit), completions, subscribers
 *   recover.c   replay and the checkpoint at open and close
 *   history.c   the history scan and compaction
 *   replica.c   changes from peers
 *   kv.c        Range, Put, DeleteRange, Txn
 *   lease.c     lease grant, keepalive, revoke, expiry (lease_table.c: the
 *               derived table the observer keeps)
 *   snapshot.c  consistent copies of the files, the size on disk
 * Concurrency (commit.c has the essay): writers take the rwlock's write
 * side for in-memory work only; the committer writes, the completer
 * delivers and completes.
 */

#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np: writers must not starve */

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "crdt/error.h"
#include "store/store_int.h"

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

static uint64_t mono_clock_ms(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
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
    return cairn_store_db_err(s, err);
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
    pthread_cond_init(&s->tcv, NULL);
    pthread_mutex_init(&s->cmu, NULL);
    pthread_cond_init(&s->ccv, NULL);
    pthread_cond_init(&s->cdone, NULL);
    s->g_tail = &s->g_head;
    pthread_mutex_init(&s->lease_mu, NULL);
    pthread_mutex_init(&s->sub_mu, NULL);
    pthread_cond_init(&s->lease_cv, NULL);
    s->ch_tail = &s->ch_head;
    s->w_tail = &s->w_head;
    s->rev = 1;        /* etcd: a fresh store is at revision 1; the first write is 2 */
    s->compacted = -1; /* etcd: nothing compacted yet, so compact(0) succeeds */
    s->max_txn_ops = o->max_txn_ops ? o->max_txn_ops : 128;
    s->clock_ms = o->clock_ms ? o->clock_ms : real_clock_ms;
    s->age_clock_ms = o->clock_ms ? o->clock_ms : mono_clock_ms;
    s->clock_arg = o->clock_arg;
    s->before_write_cb = o->before_write_cb;
    s->before_write_arg = o->before_write_arg;
    s->range_view_cb = o->range_view_cb;
    s->range_view_arg = o->range_view_arg;
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
    rc = cairn_store_db_err(s, err);
    if (rc)
        goto fail;

    char *fv;
    size_t fvl;
    rc = cairn_store_meta_get(s, "format", &fv, &fvl);
    if (rc)
        goto fail;
    rc = cairn_store_renew_restored_actor(s, o->dir, fv != NULL);
    if (rc) {
        leveldb_free(fv);
        goto fail;
    }
    int replayed = fv != NULL;
    if (!fv) {
        rc = cairn_store_create_fresh(s, o);
    } else {
        const uint8_t *f = (const uint8_t *)fv;
        uint32_t ver =
            fvl == 4 ? (uint32_t)f[0] << 24 | (uint32_t)f[1] << 16 | (uint32_t)f[2] << 8 | f[3] : 0;
        leveldb_free(fv);
        if (ver == STORE_FORMAT || ver == STORE_FORMAT_V2) {
            /* format 2's checkpoints hold nothing that depends on where
             * history records are */
            rc = cairn_store_recover(s, 1);
        } else if (ver == STORE_FORMAT_V1) {
            /* no build that wrote format 1 wrote checkpoints: one here is
             * not trusted (the next clean close writes a new one) */
            rc = cairn_store_recover(s, 0);
        } else {
            cairn_store_log(s, CAIRN_STORE_LOG_ERROR,
                            "%s has data format %u; this build reads 1 to %u", s->dir, ver,
                            STORE_FORMAT);
            rc = CAIRN_EBADVERSION;
        }
        if (!rc && ver != STORE_FORMAT)
            rc = cairn_store_upgrade_format(s);
        if (!rc)
            rc = cairn_store_move_old_records(s);
    }
    /* a joined dir's table comes from the peers, never from its flags */
    if (!rc && replayed && s->kvs_known && !s->joined)
        rc = cairn_store_members_upgrade(s, o);
    if (!rc && replayed)
        rc = reopen_db(s);
    if (rc)
        goto fail;
    if (!s->kvs_known && !s->joined) {
        rc = cairn_store_corrupt(s, "no kvs map");
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
    /* metrics: what is on disk (all but a group still queued) */
    uint64_t nch = cairn_dag_count(cairn_doc_dag(s->doc));
    s->batch_end = nch;
    atomic_store(&s->durable_count, nch - s->batch_local - s->batch_remote);
    s->open_ms = cairn_store_now_ms(s);
    rc = cairn_store_commit_start(s);
    if (rc)
        goto fail;
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

int cairn_store_awaiting_genesis(const cairn_store *s)
{
    /* kvs_known is the observer's, set under the write lock: a read here
     * may lag by one receive, which only delays the caller's next look */
    cairn_store *m = (cairn_store *)s;
    pthread_rwlock_rdlock(&m->rw);
    int r = !m->kvs_known;
    pthread_rwlock_unlock(&m->rw);
    return r;
}

void cairn_store_close(cairn_store *s)
{
    if (!s)
        return;
    cairn_store_lease_thread_stop(s); /* its revokes go through the committer */
    cairn_store_commit_stop(s);
    /* physical compactions still running on their threads */
    pthread_mutex_lock(&s->qmu);
    while (s->compact_jobs)
        pthread_cond_wait(&s->dcv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
    cairn_store_ev_clear(s);
    free(s->cur_ev);
    /* nothing runs any more and every applied change is durable (unless
     * the store failed): memoise the state for the next open */
    if (s->opened && !atomic_load(&s->failed))
        cairn_store_write_checkpoint(s);
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
    pthread_cond_destroy(&s->tcv);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->ccv);
    pthread_cond_destroy(&s->cdone);
    free(s->dir);
    free(s->datadir);
    free(s);
}
