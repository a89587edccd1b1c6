#ifndef CAIRN_STORE_H
#define CAIRN_STORE_H

/*
 * The node's database underneath the etcd API: a durable view of the CRDT
 * document. Every write becomes one change in the cairn_doc (begin / put /
 * delete / commit); the key index, revisions and history are derived from
 * the document's observer callbacks, on the same path that changes from
 * peers take (cairn_store_receive_changes). No path writes a key without a
 * change. store.c lists the files that implement it.
 *
 * Request and response types mirror etcd's v3 messages (RangeRequest,
 * PutRequest, DeleteRangeRequest, TxnRequest, Compare, RequestOp,
 * ResponseOp, KeyValue, ResponseHeader) field for field, so the server maps
 * them 1:1. Enum values are etcd's wire numbers.
 *
 * REVISIONS. Exactly as etcd numbers them on one node: 1 on a fresh store,
 * +1 per change that makes at least one visible change to a key (a Put, a
 * Txn with writes, a DeleteRange that deleted something, or a merged remote
 * change that changed a visible key). Reads, failed requests, deletes of
 * nothing and changes that touch only leases/members take no revision. A
 * merged remote change that changes no visible key (e.g. a concurrent write
 * that lost to the current winner) takes NO revision either: a revision with
 * no event would be a revision no watcher can see.
 *
 * DURABILITY. A write completes (callback / blocking return) only after its
 * change is in LevelDB, written with sync=true; concurrent writers share one
 * fsync (group commit by one committer thread). Reads are served at the
 * visible revision = the highest durable one, so no read and no event ever
 * shows a change before it is durable. A Txn that writes nothing still
 * completes only once everything it read is durable.
 *
 * THREADS. Every function may be called from any thread. Writers are
 * serialised by one write lock, held only for in-memory work (compares,
 * building the change, applying it to the doc and the index), never across
 * an fsync. Readers run beside the writer. Completion callbacks run on the
 * completer thread (the committer hands it each durable group): they must
 * not block and must not call the blocking write functions (the async ones
 * are fine).
 *
 * FAILURE. A LevelDB error on the write path (disk full, read-only dir, I/O
 * error) fails every write of that group with CAIRN_EIO and puts the store
 * in a failed state: from then on every call returns CAIRN_EIO (reads too —
 * memory already holds the unwritten changes). A record that fails its
 * checksum or hash gives CAIRN_ECORRUPT; corrupted data is never served.
 *
 * ON-DISK LAYOUT, format 3 (one LevelDB database in <dir>/db; keys start
 * with a tag byte; integers in keys are big-endian so that LevelDB order =
 * numeric). Per change: its body and one history record per event, all
 * under 'O' and its apply index, so every record a group commit writes
 * sorts after every record written before: LevelDB's tables never overlap
 * and its compactions move them down without rewriting them (format 2 kept
 * history under 'K' rev, a second ascending stream, and its compactions
 * rewrote level 1 over and over: 15% of the server's CPU under put load).
 * About 125-130 bytes a key on disk for one-Put changes of 18-byte keys and
 * 32-byte values (store_bench load: the change body is ~100 of them).
 * records.c writes and reads these records, recover.c replays them and
 * moves those of older formats, history.c scans and compacts them.
 *
 *   key                               value
 *   'M' "format"                      u32 BE format version (3)
 *   'M' "actor"                       16 bytes: this node's actor id (random,
 *                                     made once per data dir, and anew when
 *                                     a restored copy first opens)
 *   'M' "member"                      u64 BE member id
 *   'M' "cluster"                     u64 BE cluster id
 *   'M' "token"                       the cluster token (genesis input)
 *   'M' "joined"                      present (empty) in a dir made by a join:
 *                                     it may hold no change yet, and its
 *                                     member table is never seeded
 *   'M' "compact"                     u64 BE compacted revision (absent: none)
 *   'O' index u64 BE                  rev u64 BE (0 = took no revision) ++
 *                                     the change's canonical bytes: the local
 *                                     apply order (genesis = index 0), read
 *                                     sequentially at reopen
 *   'O' index u64 BE 'K' key bytes    history record: the key's state made
 *                                     by the revision of change |index|:
 *                                     u8 flags ++ varint sub (position among
 *                                     the change's events) ++ varint
 *                                     create_rev ++ varint version ++ varint
 *                                     lease, then by flags:
 *                                       0  value bytes (rest; the value came
 *                                          from an older change, e.g. a
 *                                          remote delete uncovered a
 *                                          concurrent write)
 *                                       1  nothing (the key was deleted;
 *                                          create_rev, version, lease are 0)
 *                                       2  varint op position: the value is
 *                                          that op's (a SET of kvs[key]) in
 *                                          the body of the same change
 *                                     A scan of 'O' in order is the event
 *                                     history: each body says the revision
 *                                     of the history records after it.
 *
 * Which change made a revision is not stored: replay rebuilds a run-length
 * map rev -> apply index in memory (store_int.h, revmap), and the change's
 * hash (cairn_store_rev_hash) is BLAKE2b of its 'O' body. The DAG rebuilds
 * hash -> index from the bodies at replay.
 *
 * Format 2 kept history records under 'K' rev u64 BE ++ key. Format 1 also
 * had 'C' hash[32] -> index and 'R' rev -> hash[32], and kept every value
 * inline in history records (flags 0 or 1 only). A format-1 or -2 dir
 * opens: after the replay (which reads only bodies) the format marker is
 * set to 3 (an older build then refuses the dir with CAIRN_EBADVERSION),
 * then each 'K' record moves under its change (the revision map gives the
 * index; the value is unchanged) and 'C' and 'R' records are deleted. Every
 * open does that last step, so a crash part-way is finished by the next.
 * Any other format: CAIRN_EBADVERSION, with a log line naming the format
 * found.
 *
 * Every record of one group commit is in one WriteBatch, so after a crash
 * the database holds a prefix of the apply order. Reopen replays 'O' in order
 * (LevelDB block checksums verified, every change decoded and hashed)
 * through cairn_doc_receive; the observer re-derives the index and must
 * re-derive the same revision that 'O' recorded (CAIRN_ECORRUPT otherwise).
 * A reader thread scans and decodes 'O' while the opening thread replays.
 * With a checkpoint (below) only the records after it, and change N-1, are
 * read at open: a damaged older record is found when something reads it
 * (block checksum, body hash, CAIRN_ECORRUPT), never served, but no longer
 * at open.
 * Compaction deletes the history records it no longer needs; change bodies
 * stay (peers, and replay when no checkpoint applies, need them), so
 * a compacted revision's values still read from them. A history record that
 * names an op which did not set its key is CAIRN_ECORRUPT.
 *
 * CHECKPOINT (format 1 of the file <data dir>/checkpoint, next to db/;
 * checkpoint.c). A memo of everything replay derives after the first N
 * changes of the apply order, written by cairn_store_close, so that open
 * loads it and replays only 'O' records N.. (the tail written after it, e.g.
 * before a crash). It is a cache: the 'O' records stay the truth. Integers
 * are big-endian; varints LEB128 as in history records.
 *
 *   offset  size  field
 *   0       8     magic "cairnCKP"
 *   8       4     u32 file format version (1)
 *   12      8     u64 payload length P (the file is 52 + P bytes)
 *   20      32    BLAKE2b-256 (crypto_generichash, unkeyed) of the payload
 *   52      P     payload:
 *     +0    16    actor id          } must equal the 'M' records
 *     +16   8     member id         }
 *     +24   8     cluster id        }
 *     +32   8     N, changes covered (apply indexes 0..N-1), >= 1
 *     +40   32    hash of change N-1: the stored 'O' record N-1 must hash to it
 *     +72   8     revision after change N-1 (i64, >= 1)
 *     +80   8     compacted revision (i64; -1 = never): must equal 'M' "compact"
 *     +88   8     D, length of the document part
 *     +96   D     cairn_doc_checkpoint bytes (crdt/doc.h: document and DAG)
 *     +96+D ...   state section, varints:
 *                   nruns, then per run: first rev, its apply index (the
 *                   revision map); last revision added (0 if no runs)
 *                   nkeys, then per key in key order: shared prefix length
 *                   with the previous key, suffix length, suffix bytes,
 *                   create_rev, version, lease (i64 as u64), nhist, then
 *                   nhist x ((rev - previous rev) << 1 | deleted)
 *
 * Leases are not in it: open re-derives the lease table from the loaded
 * document and key index through the observer's own code. Open uses a
 * checkpoint only in a format-2 or -3 dir, when the checksum, identity, N
 * and the hash of change N-1, the compacted revision, the document (its DAG
 * must end at change N-1) and the state section all check out and the
 * document and the index agree on the number of live keys; anything else,
 * or a tail that does not replay onto it (a revision that differs from the
 * stored one), is a full replay with one log line saying why. Open
 * never writes or removes the file, except: a new data dir and a restored
 * one (the RESTORED marker; snapshots hold db/ only) remove it. Close
 * writes it (temp file, fsync, rename, dir fsync) unless the store failed
 * or the one on disk already covers every change at the same compaction.
 *
 * DOCUMENT LAYOUT. A genesis change, byte-identical on every node of a
 * cluster: actor = first 16 bytes of BLAKE2b-256("cairn-genesis" || token),
 * seq 1, start_op 1, time 0, no deps, four ops making root maps "kvs",
 * "leases", "members", "cluster". It takes no revision. kvs[key] is one
 * CAIRN_V_BYTES scalar: varint lease id ++ value bytes; a delete is a DEL op
 * on kvs[key]. leases[u64 BE id] exists while the lease does: a map
 *   "ttl"      CAIRN_V_INT granted TTL in seconds (set once, at grant)
 *   "deadline" CAIRN_V_INT wall-clock ms after which any node may revoke
 * made by the grant (make-map + two sets, one change); a keepalive sets
 * "deadline" (coalesced); a revoke deletes leases[id] — the whole map, so a
 * keepalive concurrent with a revoke sets a field of a deleted map and the
 * revoke wins. A scalar at leases[id] (older data dirs) is a lease with
 * that INT as TTL and deadline 0; a non-INT field reads as 0.
 * members[u64 BE member id] is a map (members.c)
 *   "name"    CAIRN_V_STR  the member's --name ("" until it published)
 *   "peer"    CAIRN_V_STR  peer URLs, sorted, joined by '\n'
 *   "client"  CAIRN_V_STR  client URLs joined by '\n' (set by the member)
 *   "learner" CAIRN_V_BOOL 1 for a learner until promoted
 * A new cluster's initial members are set by a second deterministic change
 * (after the genesis, same on every node: members.c); add makes a map,
 * remove deletes the key, update/promote/publish set one field each.
 *
 * IDENTITY. member id = first 8 bytes (BE) of SHA-1(sorted peer URLs
 * concatenated ++ cluster token); cluster id = first 8 bytes of SHA-1(the
 * sorted member ids, 8 bytes BE each) — etcd's rule, so a default cairn has
 * etcd's default ids. Both are persisted at creation; a reopened store keeps
 * its stored identity whatever the options say (like etcd's data dir).
 *
 * OWNERSHIP. Request structs are borrowed for the duration of the call (the
 * async calls copy what they need before returning). Response structs are
 * caller-embedded: the store fills them and they own their memory until
 * cairn_*_resp_destroy; a zeroed response is safe to destroy.
 */

#include <stddef.h>
#include <stdint.h>

#include "crdt/change.h"

typedef struct cairn_store cairn_store;

/* ---- etcd message mirrors ------------------------------------------------ */

typedef struct cairn_header {
    uint64_t cluster_id;
    uint64_t member_id;
    int64_t revision;
    uint64_t raft_term; /* always 2, what a fresh single-node etcd answers
                           (there is no raft; the ledger says so) */
} cairn_header;

/* mvccpb.KeyValue. key/value point into the owning response. */
typedef struct cairn_kv {
    const uint8_t *key;
    size_t key_len;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t version;
    const uint8_t *value;
    size_t value_len;
    int64_t lease;
} cairn_kv;

/* etcd RangeRequest.SortOrder / SortTarget (wire numbers). */
enum { CAIRN_SORT_NONE = 0, CAIRN_SORT_ASCEND = 1, CAIRN_SORT_DESCEND = 2 };
enum {
    CAIRN_SORT_KEY = 0,
    CAIRN_SORT_VERSION = 1,
    CAIRN_SORT_CREATE = 2,
    CAIRN_SORT_MOD = 3,
    CAIRN_SORT_VALUE = 4
};

/* A key range as etcd gives it: range_end empty = the single key; range_end
 * "\0" (one zero byte) = every key >= key; otherwise [key, range_end). */
typedef struct cairn_range_req {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *range_end;
    size_t range_end_len;
    int64_t limit;    /* 0 = no limit */
    int64_t revision; /* 0 = current */
    int sort_order;   /* CAIRN_SORT_NONE.. */
    int sort_target;  /* CAIRN_SORT_KEY.. */
    int serializable; /* accepted and ignored: every read is local */
    int keys_only;
    int count_only;
    int64_t min_mod_revision;
    int64_t max_mod_revision;
    int64_t min_create_revision;
    int64_t max_create_revision;
} cairn_range_req;

typedef struct cairn_range_resp {
    cairn_header header;
    cairn_kv *kvs;
    size_t nkvs;
    int more;
    int64_t count;
    void *mem_; /* private */
} cairn_range_resp;

typedef struct cairn_put_req {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *value;
    size_t value_len;
    int64_t lease;
    int prev_kv;
    int ignore_value;
    int ignore_lease;
} cairn_put_req;

typedef struct cairn_put_resp {
    cairn_header header;
    cairn_kv *prev_kv; /* NULL when not asked or the key did not exist */
    void *mem_;
} cairn_put_resp;

typedef struct cairn_delete_req {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *range_end;
    size_t range_end_len;
    int prev_kv;
} cairn_delete_req;

typedef struct cairn_delete_resp {
    cairn_header header;
    int64_t deleted;
    cairn_kv *prev_kvs;
    size_t nprev_kvs;
    void *mem_;
} cairn_delete_resp;

/* etcd Compare.CompareResult / CompareTarget (wire numbers). */
enum { CAIRN_CMP_EQUAL = 0, CAIRN_CMP_GREATER = 1, CAIRN_CMP_LESS = 2, CAIRN_CMP_NOT_EQUAL = 3 };
enum {
    CAIRN_CMP_VERSION = 0,
    CAIRN_CMP_CREATE = 1,
    CAIRN_CMP_MOD = 2,
    CAIRN_CMP_VALUE = 3,
    CAIRN_CMP_LEASE = 4
};

/* etcd Compare. Only the field named by |target| is read. */
typedef struct cairn_compare {
    int result; /* CAIRN_CMP_EQUAL.. */
    int target; /* CAIRN_CMP_VERSION.. */
    const uint8_t *key;
    size_t key_len;
    const uint8_t *range_end;
    size_t range_end_len;
    int64_t version;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t lease;
    const uint8_t *value;
    size_t value_len;
} cairn_compare;

/* RequestOp / ResponseOp kinds (the oneof's field numbers). */
enum { CAIRN_REQ_RANGE = 1, CAIRN_REQ_PUT = 2, CAIRN_REQ_DELETE = 3, CAIRN_REQ_TXN = 4 };

struct cairn_txn_req;
struct cairn_txn_resp;

typedef struct cairn_request_op {
    int type; /* CAIRN_REQ_* */
    union {
        cairn_range_req range;
        cairn_put_req put;
        cairn_delete_req del;
        const struct cairn_txn_req *txn;
    } u;
} cairn_request_op;

typedef struct cairn_txn_req {
    const cairn_compare *compare;
    size_t ncompare;
    const cairn_request_op *success;
    size_t nsuccess;
    const cairn_request_op *failure;
    size_t nfailure;
} cairn_txn_req;

/* Inner responses are owned by the outermost cairn_txn_resp (their own mem_
 * is NULL); destroy only the outermost. */
typedef struct cairn_response_op {
    int type; /* CAIRN_REQ_* */
    union {
        cairn_range_resp range;
        cairn_put_resp put;
        cairn_delete_resp del;
        struct cairn_txn_resp *txn;
    } u;
} cairn_response_op;

typedef struct cairn_txn_resp {
    cairn_header header;
    int succeeded;
    cairn_response_op *responses;
    size_t nresponses;
    void *mem_;
} cairn_txn_resp;

void cairn_range_resp_destroy(cairn_range_resp *r);
void cairn_put_resp_destroy(cairn_put_resp *r);
void cairn_delete_resp_destroy(cairn_delete_resp *r);
void cairn_txn_resp_destroy(cairn_txn_resp *r);

/* ---- events (for the watch hub and the peer broadcaster) ----------------- */

enum { CAIRN_EVENT_PUT = 0, CAIRN_EVENT_DELETE = 1 }; /* mvccpb.Event.EventType */

typedef struct cairn_event {
    int type;    /* CAIRN_EVENT_* */
    cairn_kv kv; /* DELETE: key and mod_revision only */
} cairn_event;

/* A subscriber (the watch hub, the peer broadcaster): called on the
 * completer thread, in apply order, for every change once it is durable
 * (local or merged), before the writers of its group complete; every
 * subscriber gets each change, in the order they subscribed. |rev| is 0 for
 * a change that took no revision (then nev == 0). Everything is borrowed
 * for the call. Must not block and must not call back into the store except
 * async writes (not cairn_store_subscribe / unsubscribe). */
typedef void (*cairn_store_events_cb)(void *arg, int64_t rev, const cairn_hash *hash,
                                      const uint8_t *change, size_t change_len,
                                      const cairn_event *ev, size_t nev);

typedef struct cairn_store_subscriber {
    cairn_store_events_cb cb;
    void *arg;
} cairn_store_subscriber;

/* Adds a subscriber: it hears of every change applied from now on (a
 * change applied before the call may or may not reach it; the ones given
 * in cairn_store_options.subscribers hear of everything after recovery).
 * CAIRN_ENOMEM. */
int cairn_store_subscribe(cairn_store *s, cairn_store_events_cb cb, void *arg);
/* Removes the first subscriber with |cb| and |arg|; once it returns, |cb|
 * runs no more for it. CAIRN_ENOTFOUND if there is none. */
int cairn_store_unsubscribe(cairn_store *s, cairn_store_events_cb cb, void *arg);

/* Called once per revision with its events (etcd's order: as the change
 * made them), borrowed for the call. Non-zero stops the scan and is
 * returned. */
typedef int (*cairn_store_history_cb)(void *arg, int64_t rev, const cairn_event *ev, size_t nev);

/* The history a watcher catching up needs: every revision in [from, the
 * visible revision at the call] with at least one event on a key in the
 * range (etcd range rules; key "\0" with range_end "\0" = all keys), from
 * disk, through a LevelDB snapshot (no lock is held while |cb| runs).
 * CAIRN_ECOMPACTED if from < the compacted revision (etcd: watching from a
 * compacted revision). *last (may be NULL) = the last revision covered, so
 * a watcher joins the live stream (its subscriber) after it. */
int cairn_store_history(cairn_store *s, int64_t *last, int64_t from, const uint8_t *key,
                        size_t key_len, const uint8_t *range_end, size_t range_end_len,
                        cairn_store_history_cb cb, void *arg);

/* ---- opening ------------------------------------------------------------- */

typedef struct cairn_store_member {
    const char *name;
    const char *const *peer_urls;
    size_t npeer_urls;
} cairn_store_member;

/* Log levels, the server's (server/log.c) numbers. */
enum {
    CAIRN_STORE_LOG_DEBUG = 0,
    CAIRN_STORE_LOG_INFO = 1,
    CAIRN_STORE_LOG_WARN = 2,
    CAIRN_STORE_LOG_ERROR = 3
};

/* One line of the store's log: |msg| (no newline) borrowed for the call.
 * Called from any of the store's threads, possibly with its locks held:
 * must not call into the store. */
typedef void (*cairn_store_log_cb)(void *arg, int level, const char *msg);

typedef struct cairn_store_options {
    const char *dir;           /* data dir; created if missing */
    const char *name;          /* this member's name; "default" */
    const char *cluster_token; /* "etcd-cluster" */
    /* The initial cluster, this member included (matched by |name|). Empty:
     * this member alone with peer URL "http://localhost:2380" (etcd's
     * default). Only read when the data dir is new. */
    const cairn_store_member *initial_cluster;
    size_t ninitial_cluster;
    uint32_t max_txn_ops; /* etcd's --max-txn-ops; 128 */
    /* Wall clock in ms for new changes (injectable for tests); NULL = real.
     * A test's clock also ages received changes waiting for their
     * dependencies (otherwise a monotonic clock does). */
    uint64_t (*clock_ms)(void *arg);
    void *clock_arg;
    /* Actor for a new data dir (tests); NULL = 16 random bytes. */
    const cairn_actor *actor;
    /* Subscribers from the first change after recovery on (copied; see
     * cairn_store_subscribe for later ones). */
    const cairn_store_subscriber *subscribers;
    size_t nsubscribers;
    /* Test hook: called on the committer thread before each group is
     * written, with the number of changes in it; a non-zero return fails
     * the group as an I/O error would. NULL in production. */
    int (*before_write_cb)(void *arg, size_t nchanges);
    void *before_write_arg;
    /* Test hook: called by every cairn_store_range once it has taken its
     * view and released the store's lock, before it reads history records
     * and builds the response. NULL in production. */
    void (*range_view_cb)(void *arg);
    void *range_view_arg;
    /* Leases: the minimum TTL in seconds (etcd: 1.5 election timeouts, 2 s
     * with etcd's defaults); the extension every lease gets on open (etcd:
     * one election timeout, 1000 ms; see lease.c); the expiry tick period of
     * the store's own thread (0 = no thread: call cairn_store_lease_expire). */
    int64_t lease_min_ttl;
    int64_t lease_restart_extend_ms;
    uint32_t lease_tick_ms;
    /* Where the store's log lines go; NULL = stderr, every level, each
     * line prefixed "cairn store: ". */
    cairn_store_log_cb log_cb;
    void *log_arg;
    size_t cache_bytes;        /* LevelDB block cache; 8 MiB */
    size_t write_buffer_bytes; /* LevelDB memtable; 4 MiB */
    int max_open_files;        /* LevelDB table files kept open (mmap'd); 0 = LevelDB's 1000 */
    /* A new member joining a running cluster (--initial-cluster-state
     * existing on a new data dir): the ids a member answered
     * (server/peer's Join). The new dir gets them and no change at all:
     * no genesis and no initial members (it would fork the cluster's
     * document); the whole history comes from the peers. Only read when
     * the data dir is new; |initial_cluster| is then ignored. */
    int join;
    uint64_t join_member_id;
    uint64_t join_cluster_id;
} cairn_store_options;

/* 1 while a store made by a join (cairn_store_options.join) has not yet
 * received the cluster's genesis from a peer: it holds no document, so
 * every write fails with CAIRN_ESTATE. 0 otherwise. */
int cairn_store_awaiting_genesis(const cairn_store *s);

/* Fills |o| with the defaults above (dir = NULL: the caller must set it). */
void cairn_store_options_init(cairn_store_options *o);

/* Opens (creating or recovering) the store in o->dir. The options are
 * borrowed for the call. Recovery loads the checkpoint (CHECKPOINT above)
 * and replays the changes after it, or replays every stored change: time
 * linear in the checkpoint's size plus the tail, or in the history. Fails with CAIRN_EIO (cannot
 * open / lock the database), CAIRN_ECORRUPT (a record fails its checksum, hash or replay check), or
 * CAIRN_EINVAL (|name| not in the initial cluster). */
int cairn_store_open(cairn_store **out, const cairn_store_options *o);

/* A file of this name in the data dir (next to db/) says the dir was
 * restored from a snapshot: the open that finds it gives the dir a new
 * random actor id (written with sync before anything else), removes any
 * checkpoint (it is the old actor's: the open replays every change), then
 * removes the file. Keys, revisions, leases, member and cluster id are
 * kept. */
#define CAIRN_STORE_RESTORE_MARKER "RESTORED"

/* Waits for pending writes to complete, stops the committer, writes the
 * checkpoint (unless the store failed or nothing changed since the one on
 * disk; a write error is a log line, the next open replays), closes. */
void cairn_store_close(cairn_store *s);

/* ---- reads --------------------------------------------------------------- */

/* Range at the visible revision (or req->revision). Errors: CAIRN_EEMPTYKEY,
 * CAIRN_ECOMPACTED, CAIRN_EFUTUREREV, CAIRN_EIO / ECORRUPT (history read). */
int cairn_store_range(cairn_store *s, cairn_range_resp *resp, const cairn_range_req *req);

/* The header at the visible revision. */
void cairn_store_header(cairn_store *s, cairn_header *h);

/* ---- writes -------------------------------------------------------------- */

/* Completion of an async write: called exactly once, on the completer
 * thread, when the write is durable (rc == 0) or failed (rc < 0). The
 * response was filled when the async call returned 0; the caller destroys
 * it after the callback in both cases (destroy is always safe). */
typedef void (*cairn_store_done_cb)(void *arg, int rc);

/* The async writes validate and apply under the write lock, then queue the
 * change for the committer. Return 0 if queued (|cb| will be called; |resp|
 * must stay alive until then), or a negative code with |cb| never called:
 * CAIRN_EEMPTYKEY, CAIRN_EKEYNOTFOUND (ignore_value/ignore_lease on a missing
 * key), CAIRN_EVALUEPROVIDED, CAIRN_ELEASEPROVIDED, CAIRN_ELEASENOTFOUND,
 * CAIRN_ETOOMANYOPS, CAIRN_EDUPKEY, CAIRN_ECOMPACTED / CAIRN_EFUTUREREV
 * (Txn range at a revision), CAIRN_ENOMEM, CAIRN_EIO (failed store). */
int cairn_store_put_async(cairn_store *s, cairn_put_resp *resp, const cairn_put_req *req,
                          cairn_store_done_cb cb, void *arg);
int cairn_store_delete_async(cairn_store *s, cairn_delete_resp *resp, const cairn_delete_req *req,
                             cairn_store_done_cb cb, void *arg);
int cairn_store_txn_async(cairn_store *s, cairn_txn_resp *resp, const cairn_txn_req *req,
                          cairn_store_done_cb cb, void *arg);

/* Blocking wrappers: return when durable. On an error return the response
 * holds nothing (no destroy needed; it is still safe). */
int cairn_store_put(cairn_store *s, cairn_put_resp *resp, const cairn_put_req *req);
int cairn_store_delete(cairn_store *s, cairn_delete_resp *resp, const cairn_delete_req *req);
int cairn_store_txn(cairn_store *s, cairn_txn_resp *resp, const cairn_txn_req *req);

/* etcd Compact: reads below |revision| then fail with CAIRN_ECOMPACTED;
 * the history below it is deleted from disk (and, with |physical|, LevelDB
 * compacts the freed range before returning). Errors: CAIRN_ECOMPACTED
 * (revision <= the compacted one), CAIRN_EFUTUREREV (> current). *h gets the
 * header. */
int cairn_store_compact(cairn_store *s, cairn_header *h, int64_t revision, int physical);
/* The same, completing through |cb| instead of blocking: 0 = queued with
 * *h filled now; |cb| runs on the completer once the compaction is
 * durable, or, with |physical|, on a thread of its own once LevelDB has
 * compacted the range (close waits for it). < 0: refused, |cb| never
 * called. */
int cairn_store_compact_async(cairn_store *s, cairn_header *h, int64_t revision, int physical,
                              cairn_store_done_cb cb, void *arg);

/* ---- leases (lease.c) ----------------------------------------------------
 * A lease lives in the document (leases[id] = {ttl, deadline}; see DOCUMENT
 * LAYOUT), so a keepalive on any node extends it and any node whose clock
 * passes the deadline revokes it. Grant, keepalive and revoke are changes;
 * none takes a revision except a revoke (or expiry) that deleted keys — all
 * of them in ONE revision. Times are wall-clock ms from the store's clock
 * (cairn_store_options.clock_ms); TTLs are whole seconds. */

/* etcd: TTL above this -> CAIRN_ELEASETTLTOOLARGE ("too large lease TTL"). */
#define CAIRN_LEASE_MAX_TTL 9000000000LL

typedef struct cairn_lease_grant_resp {
    cairn_header header;
    int64_t id;
    int64_t ttl; /* granted: raised to the minimum TTL */
} cairn_lease_grant_resp;

/* Grants lease |id| (0 = pick one as etcd does: see lease.c) with |ttl|
 * seconds, raised to the minimum (options.lease_min_ttl). One change, no
 * revision; returns once durable. Errors: CAIRN_ELEASEEXIST,
 * CAIRN_ELEASETTLTOOLARGE. Negative ids are accepted (etcd does). */
int cairn_store_lease_create(cairn_store *s, cairn_lease_grant_resp *resp, int64_t id, int64_t ttl);
/* The same, completing on the completer (cairn_store_done_cb) instead of
 * blocking: 0 = queued, with |resp| filled now (header at the revision of
 * the grant, id, ttl); < 0 = refused as above, |cb| never called. */
int cairn_store_lease_create_async(cairn_store *s, cairn_lease_grant_resp *resp, int64_t id,
                                   int64_t ttl, cairn_store_done_cb cb, void *arg);
/* The same with an explicit id and no answer (kept for older callers). */
int cairn_store_lease_grant(cairn_store *s, int64_t id, int64_t ttl);

/* One change deleting leases[id] and every key attached to it, in key
 * order (one revision if a key was deleted, none otherwise); returns once
 * durable with *h at the revision then. CAIRN_ELEASENOTFOUND if absent. */
int cairn_store_lease_revoke(cairn_store *s, cairn_header *h, int64_t id);
/* The same, completing on the completer: 0 = queued with *h filled now. */
int cairn_store_lease_revoke_async(cairn_store *s, cairn_header *h, int64_t id,
                                   cairn_store_done_cb cb, void *arg);

/* Renews lease |id|: it now expires TTL seconds from now; *ttl = the
 * granted TTL (etcd answers that, not what remained). Coalesced: a change
 * is written only when the deadline in the document is more than TTL/2
 * behind now + TTL (see lease.c for the bound); never waits for an fsync.
 * CAIRN_ELEASENOTFOUND if unknown or already past its deadline. */
int cairn_store_lease_keepalive(cairn_store *s, int64_t *ttl, int64_t id);

typedef struct cairn_lease_key {
    const uint8_t *key; /* owned by the response */
    size_t key_len;
} cairn_lease_key;

typedef struct cairn_lease_ttl_resp {
    cairn_header header;
    int64_t id;
    int64_t ttl;           /* remaining whole seconds (truncated); -1 unknown */
    int64_t granted_ttl;   /* 0 when unknown */
    cairn_lease_key *keys; /* only when asked; in key order */
    size_t nkeys;
    void *mem_;
} cairn_lease_ttl_resp;

/* etcd TimeToLive: an unknown lease is no error (ttl -1, granted 0). Cost
 * O(keys of the lease) with |keys|, O(1) without. */
int cairn_store_lease_ttl(cairn_store *s, cairn_lease_ttl_resp *resp, int64_t id, int keys);
void cairn_lease_ttl_resp_destroy(cairn_lease_ttl_resp *r);

/* etcd Leases: every live lease id, ascending, in a new array (*ids, caller
 * frees with free(); NULL when *n == 0). */
int cairn_store_lease_list(cairn_store *s, int64_t **ids, size_t *n);

/* The expiry tick: revokes (one change each, exactly as revoke) every lease
 * whose deadline is <= |now_ms|, and deletes keys left attached to a lease
 * that no longer exists (a put merged concurrently with a revoke). At most
 * CAIRN_LEASE_REVOKE_BATCH leases per call; *nrevoked (may be NULL) = how
 * many. Returns once its changes are durable (like revoke). The store runs
 * it itself every options.lease_tick_ms when that is set.
 *
 * Lease reads (TimeToLive, Leases, keepalive's existence check, a Put's
 * lease check) see a grant or revoke as soon as it is applied, which may be
 * up to one fsync before it is durable (its caller is answered only after);
 * a crash in that window forgets it, as it forgets any unacknowledged
 * write. */
#define CAIRN_LEASE_REVOKE_BATCH 100
int cairn_store_lease_expire(cairn_store *s, size_t *nrevoked, uint64_t now_ms);

/* ---- replication --------------------------------------------------------- */

/* Feeds a change from a peer (canonical bytes, borrowed) through the same
 * observer path as local writes. |cb| is called once it and every change it
 * unblocked are durable (or with the error). A change whose dependencies are
 * missing is buffered (not durable; *not* an error). Returns a negative code
 * for bytes that do not decode, with |cb| never called. */
int cairn_store_receive_async(cairn_store *s, const uint8_t *bytes, size_t len,
                              cairn_store_done_cb cb, void *arg);
int cairn_store_receive(cairn_store *s, const uint8_t *bytes, size_t len);

/* Completion of a batched receive: called exactly once, on the completer
 * thread. rc == 0: every change the burst applied (and every change applied
 * before it) is durable, and |heads| (sorted, borrowed for the call) are the
 * store's heads as the burst left them — what the peer may now be told we
 * have. rc < 0: the group failed (CAIRN_EIO); heads are NULL. */
typedef void (*cairn_store_heads_cb)(void *arg, int rc, const cairn_hash *heads, size_t nheads);

/* A burst of changes from a peer (decoded: hash and encoding checked), in
 * slices of about a millisecond of applying (at least 16 changes), each
 * under one write lock and in one group commit (one fsync; consecutive
 * slices may share one); writers waiting for the lock go between slices,
 * so a long burst does not hold local clients up. Takes ownership of chs[0..n-1] whatever it
 * returns. Each change goes through the same observer path as a local write (revisions, index,
 * events, leases), in the order given; one whose dependencies are missing
 * is buffered (not durable, not an error) and applied when a later change,
 * in this burst or another, completes its past.
 *
 * Each change is accepted or rejected on its own: a rejected change
 * (invalid against the document: unknown object, bad reference, wrong seq)
 * applies nothing, and the others of the burst apply as if it had not been
 * there (a change that depends on it stays buffered). verdicts (may be
 * NULL) gets one code per change: 0 applied or buffered, < 0 rejected (an
 * invalid buffered change that one of them unblocked counts against it).
 *
 * Returns 0 when |cb| is queued (also when some changes were rejected), or
 * CAIRN_EIO / CAIRN_ENOMEM (failed store) with |cb| never called. */
int cairn_store_receive_changes(cairn_store *s, cairn_change **chs, size_t n, int *verdicts,
                                cairn_store_heads_cb cb, void *arg);

/* A fork met while receiving: |rejected| has the author and seq of the
 * change |held| applied here earlier (held_known 0: not found, see
 * cairn_doc_observer's fork_cb). The held one stays; forks are counted in
 * cairn_store_stats.forks. */
typedef struct cairn_store_fork {
    cairn_hash rejected, held;
    cairn_actor actor;
    uint64_t seq;
    int held_known;
} cairn_store_fork;

/* The hash of the change that made |rev| (CAIRN_ENOTFOUND if none, or
 * CAIRN_EFUTUREREV above the visible revision). */
int cairn_store_rev_hash(cairn_store *s, cairn_hash *out, int64_t rev);

/* ---- identity and stats -------------------------------------------------- */

uint64_t cairn_store_member_id(const cairn_store *s);
uint64_t cairn_store_cluster_id(const cairn_store *s);
void cairn_store_actor(const cairn_store *s, cairn_actor *out);
int64_t cairn_store_compacted_rev(cairn_store *s);

/* etcd's id rules, exposed for the server and tests: the member id of a
 * member with |peer_urls| (sorted internally) in a cluster named |token|,
 * and the cluster id of |n| member ids. */
uint64_t cairn_store_member_id_of(const char *const *peer_urls, size_t n, const char *token);
uint64_t cairn_store_cluster_id_of(const uint64_t *member_ids, size_t n);

/* ---- membership (members.c) ----------------------------------------------
 * The member table is a view of the document's members map. Every change
 * below is one CRDT change taking no revision, durable before the call
 * returns (blocking; membership changes are rare). Merges of concurrent
 * changes follow the map rules: a remove deletes the member's whole map, so
 * it wins over a concurrent update, promote or publish of that member; two
 * updates of one field: the greater op id (the later clock) wins; changes
 * to different fields (update vs promote vs publish) all stay. */
typedef struct cairn_member_info {
    uint64_t id;
    char *name; /* "" until the member published */
    char **peer_urls;
    size_t npeer_urls;
    char **client_urls;
    size_t nclient_urls;
    int learner;
} cairn_member_info;

/* The members sorted by id (etcd's order). *out owned by the caller:
 * cairn_store_member_list_free. */
int cairn_store_member_list(cairn_store *s, cairn_member_info **out, size_t *n);
void cairn_store_member_list_free(cairn_member_info *m, size_t n);
/* etcd's URL rule for member peer URLs (types.NewURLs): at least one, each
 * scheme http/https/unix/unixs, host:port, no path. 0 or EMEMBERBADURLS. */
int cairn_store_member_urls_valid(const char *const *urls, size_t n);
/* etcd: the id of an added member is the member id rule with the time in
 * seconds (decimal) appended after the token. */
uint64_t cairn_store_member_id_at(const char *const *peer_urls, size_t n, const char *token,
                                  int64_t unix_s);
/* MemberAdd: *id is the new member's. EMEMBERBADURLS, EMEMBEREXIST,
 * EPEERURLEXIST, ETOOMANYLEARNERS (etcd allows one learner). */
int cairn_store_member_add(cairn_store *s, uint64_t *id, const char *const *peer_urls, size_t n,
                           int learner);
/* EMEMBERNOTFOUND for an id not in the table. */
int cairn_store_member_remove(cairn_store *s, uint64_t id);
/* Sets the peer URLs. EMEMBERBADURLS, EMEMBERNOTFOUND, EPEERURLEXIST (held
 * by another member). The learner flag stays (etcd 3.4 drops it; see
 * tests/conformance/checks_member.py). */
int cairn_store_member_update(cairn_store *s, uint64_t id, const char *const *peer_urls, size_t n);
/* EMEMBERNOTFOUND, EMEMBERNOTLEARNER, ELEARNERNOTREADY (the learner has
 * not published yet: it never started, or its first change has not
 * reached this node). */
int cairn_store_member_promote(cairn_store *s, uint64_t id);
/* This member's own name and client URLs, written only if they differ
 * (etcd publishes its attributes at start). ENOTFOUND if this member is not
 * in the table. */
int cairn_store_member_publish(cairn_store *s, const char *name, const char *const *client_urls,
                               size_t n);
/* 1 if |id| is in the table as a learner, 0 if a voter, ENOTFOUND if absent. */
int cairn_store_member_state(cairn_store *s, uint64_t id);
/* Moves whenever the member table may have changed. */
uint64_t cairn_store_members_gen(const cairn_store *s);

/* Counters since open, for metrics: group writes (one fsync each) and the
 * changes they carried; changes / syncs is the group-commit factor. A
 * change counts once its group is durable (a compaction's marker rides in
 * a group as a record, not as a change), so changes = applied_local +
 * applied_remote = the sum of the batch histogram. */
#define CAIRN_STORE_SYNC_BUCKETS 14
#define CAIRN_STORE_BATCH_BUCKETS 13
typedef struct cairn_store_stats {
    uint64_t syncs;
    uint64_t changes;
    /* The canonical bytes of the changes those group commits wrote (the
     * changes' own bytes: the join bench's denominator). */
    uint64_t change_bytes;
    /* Of those changes: made on this node (client writes, lease expiries
     * and keepalives, member changes: cairn_doc_commit here) and received
     * from peers (cairn_store_receive_changes / _receive_async). */
    uint64_t applied_local, applied_remote;
    /* Changes per group write: counts in buckets with upper bounds 1 << i
     * (1, 2, 4 ... 4096; the last: above); the count is syncs and the sum
     * is changes (a group with only a compaction marker counts as 0). */
    uint64_t batch_le[CAIRN_STORE_BATCH_BUCKETS + 1];
    /* Changes received from peers and not yet durable here: waiting for
     * their slice of a burst, buffered until their dependencies arrive
     * (the DAG's pending buffer, as of the last receive), or applied and
     * waiting for their group's fsync. */
    uint64_t pending;
    /* The checkpoint a reopen would load (store.h, CHECKPOINT): durable
     * changes it does not cover (those a reopen replays; all of them when
     * there is none: none was loaded at open or the store compacted
     * since), and ms since it was written (its file's mtime; with none,
     * since this store opened). Close writes one. */
    uint64_t ckpt_behind;
    uint64_t ckpt_age_ms;
    /* How long each group write took (the write with its fsync): counts in
     * etcd's buckets, upper bounds 1 ms << i (the last: above 8.192 s),
     * and the sum in nanoseconds. */
    uint64_t sync_le[CAIRN_STORE_SYNC_BUCKETS + 1];
    uint64_t sync_ns;
    /* Changes refused for sharing an (actor, seq) with one held here. */
    uint64_t forks;
} cairn_store_stats;
void cairn_store_get_stats(cairn_store *s, cairn_store_stats *out);
/* The live keys (etcd_debugging_mvcc_keys_total): the document's count
 * of its kvs map, O(1) under the read lock, so a scrape costs nothing per
 * key. Includes changes applied and not yet durable. */
uint64_t cairn_store_key_count(cairn_store *s);

/* Bytes of the database on disk: every file of <data dir>/db, LevelDB's
 * write-ahead log included, its info log not (etcd's backend size). One
 * directory walk per call. */
uint64_t cairn_store_disk_bytes(cairn_store *s);

/* ---- snapshots (snapshot.c) ---------------------------------------------- */

/* One file of a snapshot: |name| as in db/, |path| where its copy is. */
typedef struct cairn_store_snap_file {
    const char *name;
    const char *path;
    uint64_t size;
} cairn_store_snap_file;

typedef struct cairn_store_snap cairn_store_snap;

/* A consistent copy of the database files (db/ only: no checkpoint, no
 * marker) in a working dir inside the data dir, taken with every writer and
 * the store's own threads frozen (see snapshot.c): it holds exactly the
 * changes applied before the call, all durable. Open a store on a dir
 * whose db/ holds these files and it has the same keys, revisions and
 * leases. Tables are hard links, so the copy costs about the size of the
 * log and the MANIFEST. Errors: CAIRN_EIO (a file could not be copied, or
 * the store failed), CAIRN_ENOMEM. */
int cairn_store_snapshot(cairn_store *s, cairn_store_snap **out);
/* The files of |sn| (borrowed from it); returns their count. */
size_t cairn_store_snap_files(const cairn_store_snap *sn, const cairn_store_snap_file **files);
/* Removes the copy and frees |sn| (NULL is fine). Any thread, any time,
 * also after the store is closed. */
void cairn_store_snap_free(cairn_store_snap *sn);

/* Appends a LEB128 varint (protobuf's too); returns bytes written (<= 10).
 * Exposed for the server's hand-packed answers. */
size_t cairn_store_put_varint(uint8_t *out, uint64_t v);

#endif
