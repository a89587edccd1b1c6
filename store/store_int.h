#ifndef CAIRN_STORE_INT_H
#define CAIRN_STORE_INT_H

/* store/ internals: shared by the store's .c files and its unit tests only. */

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <leveldb/c.h>

#include "crdt/doc.h"
#include "store/store.h"

/* ---- small helpers (util.c) --------------------------------------------- */

void cairn_store_be64(uint8_t out[8], uint64_t v);
uint64_t cairn_store_get_be64(const uint8_t *p);
/* Varints: crdt/wire.h (canonical LEB128: at most 10 bytes, no overlong
 * form), in every record and the checkpoint; cairn_store_put_varint
 * (store.h) is its writer for the server. */

/* SHA-1 (FIPS 180-4), for etcd's member/cluster id rule only. */
void cairn_store_sha1(uint8_t out[20], const uint8_t *buf, size_t len);

/* A bump allocator: responses own their memory through one of these. */
typedef struct arena_blk arena_blk;
typedef struct store_arena {
    arena_blk *head;
} store_arena;
void *cairn_store_arena_alloc(store_arena *a, size_t n);
void *cairn_store_arena_dup(store_arena *a, const void *p, size_t n);
void cairn_store_arena_free(store_arena *a);

/* A growable byte buffer. */
typedef struct store_buf {
    uint8_t *p;
    size_t len, cap;
} store_buf;
int cairn_store_buf_put(store_buf *b, const void *p, size_t n);
void cairn_store_buf_free(store_buf *b);

/* ---- the key index (index.c) ---------------------------------------------
 * Every key that has history, in byte order: a sorted array of chunks, each
 * a sorted array of up to CAIRN_IDX_CHUNK entry pointers (two levels, so a
 * lookup is two binary searches and an insert a memmove inside one chunk).
 * Each entry holds the key's current metadata and its revision history:
 * ascending revisions, TOMB set on the ones that deleted the key. Values are
 * not here: the current value is read from the document, older ones from
 * the history records on disk. */

#define CAIRN_IDX_TOMB (1ull << 63)
#define CAIRN_IDX_CHUNK 128

typedef struct kentry {
    uint64_t *hist; /* ascending; rev | TOMB. Points at |h1| until a key
                       has a second revision: most keys need no allocation */
    uint32_t nhist, cap;
    uint64_t h1;
    int64_t create_rev; /* current generation (when the last entry is live) */
    int64_t version;
    int64_t lease;
    uint32_t key_len;
    uint8_t key[];
} kentry;

static inline const uint8_t *kentry_key(const kentry *e)
{
    return e->key;
}
static inline int kentry_live(const kentry *e)
{
    return e->nhist > 0 && !(e->hist[e->nhist - 1] & CAIRN_IDX_TOMB);
}
static inline int64_t kentry_mod(const kentry *e)
{
    return e->nhist ? (int64_t)(e->hist[e->nhist - 1] & ~CAIRN_IDX_TOMB) : 0;
}

typedef struct kchunk {
    uint32_t n;
    kentry *e[CAIRN_IDX_CHUNK];
} kchunk;

typedef struct kindex {
    kchunk **c;
    kentry **first; /* first[i] = c[i]->e[0]: the top search touches one line */
    size_t nc, cap;
    uint64_t nkeys;
} kindex;

/* A position in the index; valid until the index changes. */
typedef struct kiter {
    const kindex *x;
    size_t ci;
    uint32_t pos;
} kiter;

int cairn_kindex_init(kindex *x);
void cairn_kindex_destroy(kindex *x);
/* Positions |it| at the first entry with key >= |key| and returns it (NULL
 * = none). */
kentry *cairn_kindex_seek(kiter *it, const kindex *x, const uint8_t *key, size_t len);
kentry *cairn_kindex_first(kiter *it, const kindex *x);
kentry *cairn_kindex_next(kiter *it);
kentry *cairn_kindex_find(const kindex *x, const uint8_t *key, size_t len);
/* Finds or inserts (with empty history). NULL on ENOMEM. */
kentry *cairn_kindex_upsert(kindex *x, const uint8_t *key, size_t len);
/* Frees every entry whose history is empty (after compaction). */
void cairn_kindex_sweep(kindex *x);
int cairn_kindex_push(kentry *e, uint64_t h);
/* Bulk load: appends |e| (key greater than every key in |x|; history set),
 * filling chunks fully. Takes ownership of |e| on success. */
int cairn_kindex_append(kindex *x, kentry *e);
/* The history entry in effect at |rev| (0 if none), and its position. */
uint64_t cairn_kindex_at(const kentry *e, int64_t rev, uint32_t *pos);

/* Byte-wise key comparison as etcd orders keys. */
int cairn_store_keycmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

/* ---- the lease table (lease_table.c) ---------------------------------------
 * The lease table: every lease id the document or the key index mentions.
 * Derived only from applied changes (the observer calls the hooks below), so
 * it is the same on every node that applied the same changes, and recovery
 * rebuilds it by replay. Two chained hash tables share the entries: by lease
 * id, and by the object id of the lease's map in the document (patches on
 * that map name the object, not the lease). Each entry holds the set of live
 * keys attached to it (open addressing over kentry pointers, which are
 * stable: a live key's entry is never freed). All of it is under rw. */

typedef struct lease_ent {
    struct lease_ent *next_id, *next_obj;
    int64_t id;
    int live;            /* leases[id] is present in the document */
    int has_obj, in_obj; /* leases[id] is a map (obj); linked by obj */
    int touched;         /* in the current change's touched list */
    cairn_objid obj;
    int64_t ttl;                    /* granted, seconds (document) */
    int64_t deadline;               /* wall-clock ms (document) */
    _Atomic int64_t local_deadline; /* wall-clock ms, memory only: the restart rule
                               and this node's last keepalive */
    kentry **keys;                  /* open addressing; NULL = empty slot */
    size_t nkeys, kcap;
} lease_ent;

typedef struct lease_table {
    lease_ent **by_id, **by_obj;
    size_t nb, n; /* buckets (power of two) in each, entries */
    lease_ent **touched;
    size_t ntouched, tcap;
    int64_t next_due;  /* no live lease is due before this (ms); 0 = scan */
    uint64_t next_gen; /* etcd's id generator state (suffix) */
    int64_t min_ttl;
    int64_t restart_extend_ms;
} lease_table;

/* The document's field names in leases[id]. */
#define LEASE_TTL_KEY "ttl"
#define LEASE_DEADLINE_KEY "deadline"

int cairn_lease_table_init(lease_table *t, int64_t min_ttl, int64_t restart_extend_ms);
/* The entry of lease |id| (live or not), or NULL. */
lease_ent *cairn_lease_find(const lease_table *t, int64_t id);
/* leases[id]'s key in the document: the id, 8 bytes BE. */
static inline void cairn_lease_doc_key(uint8_t k[8], int64_t id)
{
    cairn_store_be64(k, (uint64_t)id);
}
/* A lease's effective deadline: max(deadline, local_deadline). */
static inline int64_t cairn_lease_deadline(const lease_ent *l)
{
    int64_t local = atomic_load(&l->local_deadline);
    return l->deadline > local ? l->deadline : local;
}
void cairn_lease_table_destroy(lease_table *t);
/* Observer hooks (caller holds rw write). A patch on anything but kvs:
 * 1 if it was on the leases map or a live lease's map, 0 if not (members,
 * cluster, or a dead lease's map), < 0 an error. */
int cairn_store_lease_patch(cairn_store *s, const cairn_patch *p);
/* Key |k| moved from lease |from| to lease |to| (0 = none). */
int cairn_store_lease_key_move(cairn_store *s, kentry *k, int64_t from, int64_t to);
/* End of a change: re-reads every touched lease from the document. */
int cairn_store_lease_settle(cairn_store *s);
/* After a checkpoint load: builds the table from the document's leases map
 * and the live keys with a lease (|leased|, every one of them), through the
 * same hooks and settle as the observer, so it is the table a full replay
 * leaves. The table must be empty. */
int cairn_store_lease_rebuild(cairn_store *s, kentry *const *leased, size_t nleased);
/* After recovery: etcd's restart rule (lease.c says why). */
void cairn_store_lease_restart(cairn_store *s, uint64_t now_ms);
int cairn_store_lease_thread_start(cairn_store *s, uint32_t tick_ms);
void cairn_store_lease_thread_stop(cairn_store *s);

/* ---- the store ----------------------------------------------------------- */

typedef struct pend_event {
    int type;
    uint8_t *key;
    size_t key_len;
    int64_t create_rev, version, lease;
    uint8_t *value; /* NULL when nobody needs a copy (see on_patch) */
    size_t value_len;
    int64_t oppos; /* PUT: position of the op in this change that set the
                      value, or -1 (the value came from an older change) */
} pend_event;

/* ---- revision -> apply index (revmap.c) -----------------------------------
 * Which change made a revision. Every change takes at most one revision and
 * the apply index grows by one per change, so index - rev never decreases:
 * the map is a list of runs (first rev, its index), one more run per change
 * that took no revision right before one that did. A node whose changes all
 * take revisions holds one run; memory grows only with lease-only or losing
 * changes. Rebuilt by replay at reopen. Own lock: readers of history call it
 * from under rw's read side and from no lock at all. */
typedef struct revmap {
    pthread_mutex_t mu;
    int64_t *rev;
    uint64_t *idx;
    size_t n, cap;
    int64_t last; /* the newest revision added */
} revmap;

int cairn_revmap_init(revmap *m);
void cairn_revmap_destroy(revmap *m);
/* Records that |rev| (> every earlier one) was made by change |index|. */
int cairn_revmap_add(revmap *m, int64_t rev, uint64_t index);
/* The index of the change that made |rev|; CAIRN_ENOTFOUND if none did. */
int cairn_revmap_find(revmap *m, uint64_t *index, int64_t rev);
/* The index of the change that made the first revision >= |rev|;
 * CAIRN_ENOTFOUND if none did. */
int cairn_revmap_find_from(revmap *m, uint64_t *index, int64_t rev);
/* The other way: the newest revision made by a change at or before apply
 * index |index| (*rev; 1, the fresh store's, if none). Returns 1 if the
 * change at |index| made *rev itself, 0 if it took no revision. */
int cairn_revmap_rev_of(revmap *m, int64_t *rev, uint64_t index);

/* ---- the checkpoint file (checkpoint.c; layout in store.h) ----------------- */

#define CAIRN_CKPT_FILE "checkpoint"
#define CAIRN_CKPT_VERSION 1u
#define CAIRN_CKPT_HDR 52   /* magic, version, payload length, checksum */
#define CAIRN_CKPT_FIXED 96 /* the payload's fixed fields, before the doc */
/* Decoded key bytes may be at most this many times the state section's
 * size (+1 MiB): front coding would otherwise let a few bytes name huge
 * keys. A real index beyond it is only a checkpoint refused. */
#define CAIRN_CKPT_KEY_RATIO 256

/* A parsed checkpoint; the pointers are views into the file's bytes. */
typedef struct cairn_ckpt_head {
    uint8_t sum[CAIRN_HASH_LEN];
    const uint8_t *payload;
    size_t payload_len;
    cairn_actor actor;
    uint64_t member_id, cluster_id;
    uint64_t nchanges; /* N: apply indexes 0..N-1 are covered */
    cairn_hash last;   /* hash of change N-1 */
    int64_t rev;       /* the revision after change N-1 */
    int64_t compacted; /* -1: never compacted */
    const uint8_t *doc, *state;
    size_t doc_len, state_len;
} cairn_ckpt_head;

/* Appends the revision map and the key index (store.h, CHECKPOINT). The
 * caller keeps both from changing. */
int cairn_ckpt_encode_state(store_buf *b, const kindex *x, revmap *m);
/* What the loader needs besides the index, gathered while decoding it (the
 * entries are in cache then; a second pass over a million would not be). */
typedef struct cairn_ckpt_live {
    uint64_t nlive;   /* keys whose newest history entry is not a delete */
    store_buf leased; /* kentry *: the live keys with a lease, in key order */
} cairn_ckpt_live;
static inline kentry *const *cairn_ckpt_leased(const cairn_ckpt_live *lv, size_t *n)
{
    *n = lv->leased.len / sizeof(kentry *);
    return (kentry *const *)(const void *)lv->leased.p;
}

/* Decodes a state section into an empty |x| and |m| (left partly filled on
 * error: the caller destroys them); fills |live| (may be NULL; zero it
 * first). Errors: CAIRN_ETRUNCATED, ELIMIT, ECORRUPT (out of order, out of
 * range, trailing bytes), ENOMEM. */
int cairn_ckpt_decode_state(kindex *x, revmap *m, cairn_ckpt_live *live, const uint8_t *p,
                            size_t len, uint64_t nchanges, int64_t rev);
/* Checks the header and the fixed fields of file bytes |p| and fills |h|
 * (views into |p|); does not check the checksum. Errors: CAIRN_ETRUNCATED,
 * ECORRUPT, EBADVERSION. */
int cairn_ckpt_parse(cairn_ckpt_head *h, const uint8_t *p, size_t len);
/* 0 if the payload hashes to the header's checksum, else CAIRN_EBADHASH. */
int cairn_ckpt_verify(const cairn_ckpt_head *h);
/* Writes <dir>/checkpoint atomically (temp file, fsync, rename, dir fsync)
 * from |h|'s fixed fields, the doc bytes and the state section. */
int cairn_ckpt_write(const char *dir, const cairn_ckpt_head *h, const uint8_t *doc, size_t doc_len,
                     const uint8_t *state, size_t state_len);
/* Maps <dir>/checkpoint read-only (CAIRN_ENOTFOUND if absent); unmap with
 * cairn_ckpt_unmap. */
int cairn_ckpt_map(const uint8_t **p, size_t *len, const char *dir);
void cairn_ckpt_unmap(const uint8_t *p, size_t len);
/* Removes <dir>/checkpoint (absent is fine; a removal is logged) and syncs
 * the dir. */
int cairn_ckpt_remove(cairn_store *s, const char *dir);

/* One applied change waiting to become durable (only kept for subscribers). */
typedef struct pend_change {
    struct pend_change *next;
    int64_t rev;
    cairn_hash hash;
    uint8_t *bytes; /* a copy: the doc keeps no change bodies */
    size_t len;
    pend_event *ev;
    size_t nev;
} pend_change;

/* A durable group on its way to the completer (commit.c). */
typedef struct pend_group {
    struct pend_group *next;
    pend_change *chs;
    struct pend_wait *ws;
    int rc; /* the group's write: 0, or why it failed */
} pend_group;

/* A caller waiting for durability of everything queued before it. */
typedef struct pend_wait {
    struct pend_wait *next;
    cairn_store_done_cb cb;
    void *arg;
    int64_t rev;              /* the visible revision once it completes */
    int *rcp;                 /* optional: where to store an error for the response */
    cairn_store_heads_cb hcb; /* instead of |cb|: a batched receive's */
    cairn_hash *heads;        /* owned; handed to |hcb| */
    size_t nheads;
} pend_wait;

struct cairn_store {
    leveldb_t *db;
    leveldb_options_t *dbopt;
    leveldb_cache_t *cache;
    leveldb_filterpolicy_t *bloom;
    leveldb_readoptions_t *ropt;
    leveldb_writeoptions_t *wopt_sync;
    char *dir;     /* <data dir>/db */
    char *datadir; /* the data dir: the checkpoint file lives here */
    int opened;    /* open succeeded: close may write a checkpoint */
    /* The checkpoint on disk matches the state after this many changes
     * with this compaction (0: none known to match; close writes one). */
    uint64_t ckpt_n;
    int64_t ckpt_compacted;

    cairn_doc *doc;
    cairn_objid kvs, leases, members;
    /* Bumped by every applied patch outside kvs (members, leases): the peer
     * thread re-reads the member table when it moved (members.c). */
    _Atomic uint64_t members_gen;
    cairn_actor kvs_actor; /* the author of kvs's make-map op (genesis) */
    int kvs_known;         /* set once the genesis is applied */
    int joined;            /* made by a join: 'M' "joined" (store.h) */
    kindex idx;
    revmap rm;

    uint64_t member_id, cluster_id;
    cairn_actor actor;
    uint32_t max_txn_ops;
    uint64_t (*clock_ms)(void *);
    uint64_t (*age_clock_ms)(void *); /* ages the DAG's pending buffer */
    void *clock_arg;
    /* Subscribers: the committer delivers a group's events under sub_mu;
     * has_subs tells the observer whether anyone needs a change's copy. */
    pthread_mutex_t sub_mu;
    cairn_store_subscriber *subs;
    size_t nsubs, subcap;
    _Atomic int has_subs;
    int (*before_write_cb)(void *arg, size_t nchanges);
    void *before_write_arg;
    void (*range_view_cb)(void *arg);
    void *range_view_arg;
    cairn_store_log_cb log_cb;
    void *log_arg;

    /* Writers: the rwlock's write side covers the doc and the index. */
    pthread_rwlock_t rw;
    int64_t rev;               /* latest applied revision (under rw) */
    _Atomic int64_t compacted; /* written under rw's write side; read anywhere */
    _Atomic int64_t visible;   /* durable, readable revision */
    _Atomic int failed;        /* CAIRN_EIO / ECORRUPT once the store broke */

    /* Observer state (under rw write). */
    int recovering;
    uint64_t rec_expect_index;
    int64_t rec_expect_rev;
    int rec_rc;
    const cairn_change *cur_change; /* the change being applied */
    pend_event *cur_ev;
    size_t cur_nev, cur_cap;
    int obs_rc;
    int64_t last_change_rev;    /* revision taken by the last observed change */
    struct pend_wait *obs_wait; /* a local commit's completion: queued by the
                                   observer right after its change */

    /* Committer queue (under qmu). */
    pthread_mutex_t qmu;
    pthread_cond_t qcv; /* committer: work arrived */
    pthread_cond_t dcv; /* waiters: visible advanced */
    pthread_cond_t tcv; /* a receive: the committer took the batch */
    uint64_t batch_gen; /* batches the committer took */
    leveldb_writebatch_t *batch;
    size_t batch_n;
    pend_change *ch_head, **ch_tail;
    pend_wait *w_head, **w_tail;
    int64_t queued_rev; /* highest revision whose records are queued */
    int holding;        /* a burst is being applied: its records go in one group */
    int writing;        /* the committer is writing a group (snapshot.c waits it out) */
    int compact_jobs;   /* compactions queued or compacting physically (close waits) */
    int stop;
    _Atomic uint64_t n_syncs, n_changes; /* cairn_store_get_stats */
    _Atomic uint64_t n_change_bytes;
    uint64_t batch_bytes; /* the batch's change bodies (under qmu) */
    _Atomic uint64_t n_forks;
    /* The changes in |batch| by origin, and the apply index after the last
     * of them (under qmu; the committer takes them with the batch). */
    size_t batch_local, batch_remote;
    uint64_t batch_end;
    int applying_remote; /* under rw write: a receive is applying */
    _Atomic uint64_t n_local, n_remote;
    _Atomic uint64_t batch_le[CAIRN_STORE_BATCH_BUCKETS + 1];
    /* Changes on disk: the DAG's count at open, then batch_end after each
     * group write. */
    _Atomic uint64_t durable_count;
    /* cairn_store_stats.pending, in three parts: received changes a burst
     * has not reached yet, the DAG's pending count after the last receive
     * (written under rw write), and received changes applied but not yet
     * durable. Only the receive path and the committer touch them. */
    _Atomic uint64_t recv_waiting, recv_buffered, recv_unsynced;
    uint64_t open_ms, ckpt_ms; /* wall ms: open, the loaded checkpoint's mtime */
    /* Where the observer notes the first fork of a burst (under rw
     * write; NULL: only counted). */
    cairn_store_fork *fork_note;
    _Atomic uint64_t sync_le[CAIRN_STORE_SYNC_BUCKETS + 1], sync_ns;
    pthread_t committer;
    int committer_started;

    /* The completer (commit.c): durable groups to deliver and complete. */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;   /* completer: a group arrived, or stop */
    pthread_cond_t cdone; /* the queue is empty and nothing is completing */
    pend_group *g_head, **g_tail;
    int completing, cstop;
    pthread_t completer;
    int completer_started;

    /* Leases (lease_table.c, lease.c): the table is under rw; the expiry thread's own
     * state under lease_mu. */
    lease_table lt;
    pthread_mutex_t lease_mu;
    pthread_cond_t lease_cv;
    int lease_stop;
    uint32_t lease_tick_ms;
    pthread_t lease_thread;
    int lease_thread_started;

    atomic_uint snap_seq; /* names snapshot working dirs (snapshot.c) */
};

/* ---- small accessors ----------------------------------------------------- */

/* One line of the store's log (options.log_cb, or stderr). util.c */
void cairn_store_log(cairn_store *s, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline int cairn_store_failed_rc(cairn_store *s)
{
    return atomic_load(&s->failed);
}

static inline uint64_t cairn_store_now_ms(cairn_store *s)
{
    return s->clock_ms(s->clock_arg);
}

static inline void cairn_store_fill_header(const cairn_store *s, cairn_header *h, int64_t rev)
{
    h->cluster_id = s->cluster_id;
    h->member_id = s->member_id;
    h->revision = rev;
    h->raft_term = 2; /* etcd: a fresh single-member cluster answers raft_term 2 */
}

/* ---- the store's parts (store.c lists them) ------------------------------ */

/* snapshot.c: removes snapshot working dirs a crash left in |data_dir|. */
void cairn_store_snap_cleanup(const char *data_dir);

/* identity.c */
/* A new data dir: identity from the options, the genesis and the identity
 * records, written at once. CAIRN_EINVAL if |name| is not a member. */
int cairn_store_create_fresh(cairn_store *s, const cairn_store_options *o);
/* A restored dir (CAIRN_STORE_RESTORE_MARKER in |dir|) draws a new actor;
 * |exists|: the database holds a store already. */
int cairn_store_renew_restored_actor(cairn_store *s, const char *dir, int exists);

/* records.c (layout: store.h) */
#define STORE_FORMAT 3u    /* the format this build writes */
#define STORE_FORMAT_V1 1u /* older: also 'C' and 'R' records, values in 'K' (opens; see open) */
#define STORE_FORMAT_V2 2u /* older: history records under 'K' rev (opens; see open) */
#define KREC_TOMB 1        /* history record flag: the key was deleted at this revision */
#define KREC_BODY 2        /* history record flag: the value is op |pos| of the change's body */
#define KREC_KEY_HDR 10    /* a history record's key: 'O' index u64 BE 'K', then the key */

/* Writes the first KREC_KEY_HDR bytes of the history record key of change
 * |index|. */
static inline void krec_key_hdr(uint8_t *k, uint64_t index)
{
    k[0] = 'O';
    cairn_store_be64(k + 1, index);
    k[9] = 'K';
}

/* A LevelDB error (NULL: none) -> 0, CAIRN_EIO or CAIRN_ECORRUPT, logged;
 * frees |err|. */
int cairn_store_db_err(cairn_store *s, char *err);
/* Logs what was corrupt; returns CAIRN_ECORRUPT. */
int cairn_store_corrupt(cairn_store *s, const char *what);
/* 'M' name: get into a new buffer (*v NULL if absent; leveldb_free it), put
 * into a batch. */
int cairn_store_meta_get(cairn_store *s, const char *name, char **v, size_t *vl);
void cairn_store_meta_put(leveldb_writebatch_t *b, const char *name, const void *v, size_t vl);
void cairn_store_meta_put_u64(leveldb_writebatch_t *b, const char *name, uint64_t v);
/* 'M' name as a u64. With |present| NULL the record must exist; otherwise
 * *present says whether it does (and *out is 0 if not). */
int cairn_store_get_meta_u64(cairn_store *s, const char *name, uint64_t *out, int *present);
/* The 'O' record of change |index| (rev u64 BE ++ canonical bytes): *v is
 * NULL if there is none (leveldb_free it otherwise). */
int cairn_store_get_orec(cairn_store *s, const leveldb_readoptions_t *ro, uint64_t index, char **v,
                         size_t *vl);
/* The same for the change that made |rev|: missing, or made another
 * revision, is corruption ('O' is never deleted). */
int cairn_store_get_orec_of_rev(cairn_store *s, const leveldb_readoptions_t *ro, uint64_t index,
                                int64_t rev, char **v, size_t *vl);
/* The document's body loader (cairn_dag_load_cb): change |index|'s body
 * from its 'O' record. */
int cairn_store_load_body(void *arg, uint64_t index, uint8_t **bytes, size_t *len);
/* A new document for |s| whose change bodies load from 'O'. */
int cairn_store_new_doc(cairn_store *s);
/* The change that made a revision, decoded, kept while the next lookups
 * name the same one (a history scan reads every event of a revision). */
typedef struct body_cache {
    uint64_t index;
    cairn_change *c;
} body_cache;
void cairn_store_body_cache_free(body_cache *bc);
/* Makes |bc| hold change |index|, decoded from its 'O' value |v| (rev u64
 * BE ++ canonical bytes; |vl| >= 8). */
int cairn_store_body_cache_load(cairn_store *s, body_cache *bc, uint64_t index, const uint8_t *v,
                                size_t vl);
/* Appends the change's records to the shared batch (caller holds qmu): its
 * body under 'O' and one history record per event of the change being
 * applied. */
int cairn_store_batch_change(cairn_store *s, const cairn_change *c, uint64_t index, int64_t rev);

/* replica.c: the read side and the lock that serialises the DAG's const
 * calls (replica.c says why); with |durable|, once nothing applied waits
 * for the committer, so the document holds exactly what is on disk.
 * Returns the store's error once it failed (nothing held then). */
int cairn_store_doc_read_lock(cairn_store *s, int durable);
void cairn_store_doc_read_unlock(cairn_store *s);

/* apply.c */
/* The observer every change is applied with (resets obs_rc). */
extern const cairn_doc_observer *cairn_store_observer(cairn_store *s, cairn_doc_observer *o);
/* The root map |name| of |d|. */
int cairn_store_find_root_map(cairn_doc *d, cairn_objid *out, const char *name);
/* Frees the events of the change being applied. */
void cairn_store_ev_clear(cairn_store *s);

/* members.c: the members change every node of a new cluster builds alike
 * from |o|'s token and initial cluster, received into s->doc (its records
 * go to s->batch like the genesis's). */
/* identity.c: the genesis change for |token| (new, caller frees). */
int cairn_store_make_genesis(cairn_change **out, const char *token);
int cairn_store_members_seed(cairn_store *s, const cairn_store_options *o, const char *token);
/* An existing dir whose members map is empty gets the members change
 * (written at once). */
int cairn_store_members_upgrade(cairn_store *s, const cairn_store_options *o);

/* commit.c */
int cairn_store_commit_start(cairn_store *s);
/* Stops the committer once everything queued is written and completed. */
void cairn_store_commit_stop(cairn_store *s);
/* Queues a completion after everything applied so far (caller holds rw
 * write). */
int cairn_store_enqueue_wait(cairn_store *s, cairn_store_done_cb cb, void *arg, int *rcp);
/* Blocks until visible >= rev (no lock held by the caller except maybe rw:
 * the committer never takes rw). Returns CAIRN_EIO if the store failed. */
int cairn_store_wait_visible(cairn_store *s, int64_t rev);

/* recover.c */
/* Rebuilds the state from the database (with the checkpoint if
 * |use_checkpoint| and it checks out). */
int cairn_store_recover(cairn_store *s, int use_checkpoint);
/* Writes the checkpoint of the store as it is (close: nothing else runs);
 * skipped when it would be the one already on disk. */
int cairn_store_write_checkpoint(cairn_store *s);
/* Formats 1 and 2 -> 3 after their replay: the marker, then the records. */
int cairn_store_upgrade_format(cairn_store *s);
int cairn_store_move_old_records(cairn_store *s);

/* history.c */
/* Applies compaction at |c| to the index; when |b| is not NULL, adds the
 * deletes of the history records it no longer needs. */
int cairn_store_compact_index(cairn_store *s, int64_t c, leveldb_writebatch_t *b, uint64_t *ndel);

/* records.c, readers */
/* Decodes a kvs record: varint lease ++ value. Malformed records read as
 * lease 0 and the raw bytes as value (deterministic on every node). */
void cairn_store_parse_record(const cairn_value *v, int64_t *lease, const uint8_t **val,
                              size_t *val_len);
/* A history record's value (layout: store.h): u8 flags, varint sub, create_rev,
 * version, lease, then for a body reference varint op position, else (live
 * key) the value bytes. |val| points into the parsed bytes (borrowed). */
typedef struct cairn_store_krec {
    int del, body;
    uint64_t sub, cr, ver, lease, pos;
    const uint8_t *val; /* inline value (not body, not del); empty otherwise */
    size_t val_len;
} cairn_store_krec;
/* 0, or CAIRN_ECORRUPT (bad flags, truncated varint, trailing bytes,
 * create_rev or version above INT64_MAX). */
int cairn_store_krec_parse(cairn_store_krec *r, const uint8_t *p, size_t len);
/* The value a body reference names: op |pos| of |c| must be a SET of
 * kvs[key] (kvs is the map made by op counter |kvs_counter|), else
 * CAIRN_ECORRUPT. |val| is a view into |c|. */
int cairn_store_krec_body_value(const cairn_change *c, uint64_t kvs_counter, uint64_t pos,
                                const uint8_t *key, size_t key_len, const uint8_t **val,
                                size_t *vl);
/* Reads the history record of (rev, key) through |ro| (s->ropt, or one
 * with a snapshot); fills every field of |out| but the key. */
int cairn_store_read_hist(cairn_store *s, store_arena *a, const leveldb_readoptions_t *ro,
                          int64_t rev, const uint8_t *key, size_t key_len, cairn_kv *out,
                          int want_value);

/* Blocking on an async write: initialise with
 * {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0}, pass
 * cairn_store_sync_done and the struct as the completion, then wait. */
typedef struct cairn_store_sync_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, rc;
} cairn_store_sync_wait;
void cairn_store_sync_done(void *arg, int rc);
/* Waits for the completion, destroys the struct's lock and returns its rc. */
int cairn_store_sync_wait_for(cairn_store_sync_wait *w);

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

#endif
