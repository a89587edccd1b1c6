/*
 * Recovery: rebuilding everything in memory from the database at open.
 * The stored apply order ('O' bodies) is replayed through the observer
 * (apply.c), which re-derives revisions and checks them against the stored
 * ones; a reader thread scans and decodes the records while the opening
 * thread replays. A checkpoint (checkpoint.c) memoises what that replay
 * derives up to some change: open checks it against the stored changes,
 * loads it and replays only the tail, or replays everything. Close writes
 * the checkpoint. Data dirs of formats 1 and 2 are brought to format 3
 * here, after their replay.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crdt/error.h"
#include "store/store_int.h"

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
            rc = err ? cairn_store_db_err(s, err)
                     : cairn_store_corrupt(s, "apply order has a gap or a malformed record");
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
        rc = cairn_store_db_err(s, err);
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
                rc = cairn_store_corrupt(s, "a change's dependencies are not before it");
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
    if (!rc && want == 0 && !s->joined)
        rc = cairn_store_corrupt(s, "no genesis change");
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
        rc = cairn_store_new_doc(s);
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

/* When <dir>/checkpoint was written (wall ms; 0 if it cannot be told). */
static uint64_t ckpt_mtime_ms(const char *dir)
{
    char path[4096];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/" CAIRN_CKPT_FILE, dir) >= (int)sizeof path ||
        stat(path, &st) != 0)
        return 0;
    return (uint64_t)st.st_mtim.tv_sec * 1000u + (uint64_t)st.st_mtim.tv_nsec / 1000000u;
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
    if ((rc = cairn_store_get_orec(s, s->ropt, h.nchanges - 1, &v, &vl))) {
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
    const cairn_hash *lh =
        cairn_dag_count(dag) == h.nchanges ? cairn_dag_hash_at(dag, h.nchanges - 1) : NULL;
    if (!lh || memcmp(lh->b, h.last.b, CAIRN_HASH_LEN)) {
        why = "its document does not end at its last change";
        goto out;
    }
    if ((rc = cairn_doc_set_loader(d, cairn_store_load_body, s)))
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
    if (cairn_store_find_root_map(d, &s->kvs, "kvs") ||
        cairn_store_find_root_map(d, &s->leases, "leases") ||
        cairn_store_find_root_map(d, &s->members, "members") ||
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
    s->ckpt_ms = ckpt_mtime_ms(s->datadir);
    return 0;
}

int cairn_store_recover(cairn_store *s, int use_checkpoint)
{
    char *v;
    size_t vl;
    int rc = cairn_store_meta_get(s, "actor", &v, &vl);
    if (rc)
        return rc;
    if (!v || vl != CAIRN_ACTOR_LEN) {
        leveldb_free(v);
        return cairn_store_corrupt(s, "actor id");
    }
    memcpy(s->actor.b, v, CAIRN_ACTOR_LEN);
    leveldb_free(v);
    uint64_t c;
    int have_c;
    if ((rc = cairn_store_get_meta_u64(s, "member", &s->member_id, NULL)) ||
        (rc = cairn_store_get_meta_u64(s, "cluster", &s->cluster_id, NULL)) ||
        (rc = cairn_store_get_meta_u64(s, "compact", &c, &have_c)))
        return rc;
    char *j;
    size_t jl;
    if ((rc = cairn_store_meta_get(s, "joined", &j, &jl)))
        return rc;
    s->joined = j != NULL;
    leveldb_free(j);
    rc = cairn_store_new_doc(s);
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
        rc = cairn_store_compact_index(s, (int64_t)c, NULL, &nd);
    }
    return rc;
}

/* Writes the checkpoint of the store as it is (close: nothing else runs).
 * Skipped when it would be the one already on disk. */
int cairn_store_write_checkpoint(cairn_store *s)
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
int cairn_store_upgrade_format(cairn_store *s)
{
    leveldb_writebatch_t *b = leveldb_writebatch_create();
    uint8_t fv[4] = {0, 0, 0, STORE_FORMAT};
    cairn_store_meta_put(b, "format", fv, 4);
    char *err = NULL;
    leveldb_write(s->db, s->wopt_sync, b, &err);
    leveldb_writebatch_destroy(b);
    return cairn_store_db_err(s, err);
}

/* Then the records move: each 'K' rev ++ key to 'O' index 'K' key (the
 * revision map gives the index; the value is unchanged), and 'C' and 'R'
 * go, a bounded batch at a time, and LevelDB compacts each emptied range.
 * Every open of a format-3 dir does this (one seek per tag when there is
 * nothing left), so a crash part-way is finished by the next open. */
int cairn_store_move_old_records(cairn_store *s)
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
                    rc = cairn_store_corrupt(s, "a history record of a revision no change made");
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
                rc = cairn_store_db_err(s, err);
                leveldb_writebatch_clear(b);
            }
        }
        if (!rc) {
            char *err = NULL;
            leveldb_iter_get_error(it, &err);
            rc = cairn_store_db_err(s, err);
        }
        if (!rc && n % 4096) {
            char *err = NULL;
            leveldb_write(s->db, s->wopt_sync, b, &err);
            rc = cairn_store_db_err(s, err);
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
