#ifndef CAIRN_REPLICA_H
#define CAIRN_REPLICA_H

/*
 * A store-owned sync session with one peer (DESIGN.md, "A store-owned
 * session per peer"): crdt/sync's per-peer state bound to this node's
 * store, so that the transport (server/peer/) only moves bytes.
 *
 * DURABILITY. Everything the session says — our heads, what we need, the
 * changes it sends — is read from the store's document, which holds a
 * change from the moment it is applied, up to one fsync before it is
 * durable. So generate reads the document under the store's read side
 * only once nothing applied is still waiting for the committer (no writer
 * can apply while the read side is held; the wait is at most the group
 * being written plus the one queued behind it). Push does not wait (it
 * would keep local writers out for as long): it sends only changes the
 * committer reported durable and names the last of them as its heads.
 * Received changes go to cairn_store_receive_changes (slices of one write
 * lock and one group commit each); only
 * after its durable completion is cairn_sync_applied called, so the peer is
 * never told we hold a change before it is on our disk.
 *
 * THREADS. One replica is driven by one thread at a time for generate,
 * push, receive and reset (the transport's; a mutex makes it safe anyway).
 * The receive's completion runs on the store's completer thread: it only
 * sets an atomic flag and calls the caller's callback; the cairn_sync_applied
 * it owes runs at the start of the next generate / push / receive, on the
 * caller's thread, under the read side — the completer must never wait for
 * the store's rwlock (a reader may be waiting for the committer, and the
 * committer, out of memory, for the completer).
 */

#include <stddef.h>
#include <stdint.h>

#include "crdt/sync.h"
#include "store/store.h"

typedef struct cairn_replica cairn_replica;

/* A session with one peer of |s| (borrowed: must outlive the replica).
 * |limits| copied; NULL = crdt/sync's defaults. ENOMEM / EINVAL. */
int cairn_replica_new(cairn_replica **out, cairn_store *s, const cairn_sync_limits *limits);
/* Frees the session. A receive still waiting for its completion keeps the
 * session alive until it completes (reference counted), so this may be
 * called at any time from the transport. */
void cairn_replica_free(cairn_replica *r);

/* Forgets what is in flight (after a reconnect, or a lost message): the
 * next generate is a full message saying "hello". */
void cairn_replica_reset(cairn_replica *r);

/* The transport's sync timer, once per period before that period's
 * generate (cairn_sync_tick: changes of other authors wait a period, so
 * that their authors' pushes reach the peer first). */
void cairn_replica_tick(cairn_replica *r);

/* 1 if the message last received asks for an immediate answer
 * (cairn_sync_wants_answer); else the next periodic generate will do. */
int cairn_replica_wants_answer(cairn_replica *r);

/* The next message for the peer in a new buffer (*out, caller frees), with
 * a fresh random Bloom salt; *out NULL when there is nothing to say.
 * Returns the store's CAIRN_EIO once it failed, ENOMEM, or sync's codes. */
int cairn_replica_generate(cairn_replica *r, uint8_t **out, size_t *len);

/* Optimistic push of |n| changes of this store already durable (decoded,
 * borrowed; e.g. what a cairn_store_subscribe callback handed out, decoded
 * off the committer thread), in apply order: *out NULL when the peer
 * already has them all. Changes lately received from this peer are left
 * out (it has them: a relay does not echo them back). At most the limits'
 * worth are taken; the rest follow through generate. Unlike generate it
 * does not wait for the committer: the heads it reports are the last of
 * |chs| (durable), not the document's. */
int cairn_replica_push(cairn_replica *r, uint8_t **out, size_t *len, const cairn_change *const *chs,
                       size_t n);

/* Completion of a receive: on the completer thread once what the message
 * carried is durable (rc 0) or the group failed (rc < 0); or on the
 * caller's thread, inside cairn_replica_receive, when the message carried
 * no change. Must not block and must not call into the replica. */
typedef void (*cairn_replica_done_cb)(void *arg, int rc);

/* Takes in one message from the peer (|msg| borrowed). The message is
 * decoded and checked whole first: a malformed one (sync's codes: bad
 * hash, not canonical, over the limits, truncated) applies nothing,
 * returns its code and |cb| is never called. Otherwise the changes go to
 * the store in one burst and |cb| is called exactly once; *rejected (may
 * be NULL) gets the first code of a change the document refused (a hostile
 * change: unknown object, bad sequence, a refused change in its past),
 * preferring one that is not a fork's (CAIRN_EFORK, CAIRN_EFORKPAST), 0 if
 * none — the others applied.
 * Returns 0, or < 0 with |cb| never called. */
int cairn_replica_receive(cairn_replica *r, const uint8_t *msg, size_t len, int *rejected,
                          cairn_replica_done_cb cb, void *arg);

/* 1 and *out if the last cairn_replica_receive met a fork (a change with
 * the author and seq of one held here: *rejected is CAIRN_EFORK then, or
 * an earlier change's code), the first of its burst; else 0. Call it on
 * the thread that called receive, before the next receive. */
int cairn_replica_last_fork(const cairn_replica *r, cairn_store_fork *out);

/* The peer's heads as its last message reported them (a new array,
 * *heads caller frees; NULL when *n == 0, before the first message). */
int cairn_replica_their_heads(cairn_replica *r, cairn_hash **heads, size_t *n);

/* Replication lag behind the peer, for metrics: *changes = the changes
 * this store has applied that the peer has not acknowledged as durable
 * (cairn_sync_lag: not among or ancestors of its last reported heads),
 * and *age_ms = the store's clock now less the wall-clock time its author
 * stamped on the first of them in apply order (0 if in the future; both
 * 0 when nothing is owed). Changes applied and still waiting for their
 * fsync count too (at most a group). CAIRN_ENOTFOUND before the peer's
 * first message since this session was made (nothing is known of it);
 * EIO, ENOMEM. Cost: the changes since the peer's acknowledged prefix,
 * under the store's read side, and one change body read. */
int cairn_replica_lag(cairn_replica *r, uint64_t *changes, uint64_t *age_ms);

/* The store's heads as the document holds them (for tests and the
 * Replication service): a new sorted array (*heads, caller frees; NULL when
 * *n == 0), read under the read side once everything applied is durable.
 * ENOMEM / EIO. */
int cairn_store_heads(cairn_store *s, cairn_hash **heads, size_t *n);

/* For the cluster benchmark (bytes on the wire per change's own bytes):
 * how many changes the document holds and the sum of their canonical
 * encoded sizes, every body loaded from storage under the read side.
 * CAIRN_ELIMIT past CAIRN_STORE_CHANGE_BYTES_MAX changes (the walk holds
 * the read side for its whole length), or the loader's errors. */
#define CAIRN_STORE_CHANGE_BYTES_MAX 200000
int cairn_store_change_bytes(cairn_store *s, uint64_t *count, uint64_t *bytes);

/* ---- the Replication service's questions (causal.c) ----------------------
 * A revision is local; a change's hash is its global name. All of these
 * answer from durable changes only (the document is read once nothing
 * applied waits for the committer). */

/* The change that made local revision |rev| (*out). Compaction does not
 * forget it: the DAG keeps every hash. CAIRN_EFUTUREREV above the visible
 * revision; CAIRN_ENOTFOUND for revision 1 and below (the fresh store's,
 * which no change made). */
int cairn_store_rev_to_hash(cairn_store *s, cairn_hash *out, int64_t rev);

/* The local revision of change |h|: *rev is the revision it made (*took 1),
 * or, for a change that made none (lease-only, membership, a write that
 * lost to a concurrent one everywhere it touched), the newest revision
 * made before it in the apply order (*took 0), whose key space is the one
 * the change leaves. CAIRN_ENOTHERE if this node has not got |h| durably. */
int cairn_store_hash_to_rev(cairn_store *s, int64_t *rev, int *took, const cairn_hash *h);

/* One key as it was at a set of heads. Owned by the cairn_heads_range. */
typedef struct cairn_heads_kv {
    uint8_t *key;
    size_t key_len;
    uint8_t *value; /* NULL with keys_only */
    size_t value_len;
    int64_t lease;
} cairn_heads_kv;

typedef struct cairn_heads_range {
    cairn_heads_kv *kvs; /* ascending by key */
    size_t nkvs;
    int more;         /* |limit| cut the answer */
    int64_t count;    /* keys in the range at the heads, whatever the limit */
    int64_t revision; /* the local revision that is this state, 0 if none is */
    int replayed;     /* 1: rebuilt by replaying the heads' past, 0: history */
} cairn_heads_range;
void cairn_heads_range_destroy(cairn_heads_range *r);

/* Replays at most this many changes for one Range at heads (CAIRN_EREPLAY
 * beyond). */
#define CAIRN_STORE_REPLAY_MAX 100000u

/* The key space in |req|'s range (key, range_end, limit, keys_only; etcd's
 * range rules; the other fields are ignored) exactly as it was at |heads|
 * (with their causal past). When that past is a prefix of this node's
 * apply order it is a local revision and history serves it; otherwise
 * (concurrent changes were applied in between) the past is replayed into
 * a scratch document, at most |max_replay| changes (0: the default).
 * CAIRN_ENOTHERE if a head is not here durably (*missing names it; may be
 * NULL), CAIRN_EREPLAY past the bound, CAIRN_EEMPTYKEY, CAIRN_EINVAL for
 * no heads. *out zeroed on failure. */
int cairn_store_range_at_heads(cairn_store *s, cairn_heads_range *out, const cairn_hash *heads,
                               size_t nheads, const cairn_range_req *req, uint64_t max_replay,
                               cairn_hash *missing);

/* 1 if every one of |want| is here and an ancestor of (or equal to) one of
 * |have| (a peer's acknowledged heads), else 0. Heads of |have| this node
 * has not got are ignored, so the answer can be a late 1, never a wrong 1.
 * < 0: the store failed. */
int cairn_store_heads_cover(cairn_store *s, const cairn_hash *want, size_t nwant,
                            const cairn_hash *have, size_t nhave);

/* CAIRN_ENOTHERE unless every one of |heads| is here durably (*missing
 * names the first that is not). */
int cairn_store_heads_here(cairn_store *s, const cairn_hash *heads, size_t n, cairn_hash *missing);

#endif
