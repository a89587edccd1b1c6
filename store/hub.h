#ifndef CAIRN_HUB_H
#define CAIRN_HUB_H

/*
 * The watch hub: watchers keyed by range, fed by the store's events, each
 * served batches of events per revision (DESIGN: "Watches"). It knows no
 * gRPC and no protobuf: server/etcd/watch.c turns its batches into etcd's
 * WatchResponse messages and runs the streams.
 *
 * MODEL. A hub stream (cairn_hub_stream) is a set of watchers delivered in
 * one order: one client Watch stream. Its owner pulls: cairn_hub_next
 * hands back the next batch of one watcher (one revision for a live
 * watcher; up to 1,000 revisions for one catching up), copied out and
 * owned by the caller. Watchers have no queues of their own: they read
 * the one shared ring of recent events at their next revision, or, when
 * the ring no longer holds it, the history on disk (cairn_store_history),
 * so a stream that stops pulling costs nothing but its position and never
 * blocks a writer or another stream. When a stream may have something to
 * pull, the hub calls its notify callback from the hub's own thread.
 *
 * THREADS. cairn_hub_events_cb runs on the store's completer thread: it
 * copies the events into the ring under the hub lock and only marks the
 * streams; it never reads the store and never calls out. Every other
 * function may be called from any thread. For one stream, cairn_hub_next
 * must not run twice at once (the server's per-stream "sending" flag
 * guarantees it), but watch, start and cancel may run beside it: a watcher
 * cancelled while its batch is read from disk is found gone afterwards and
 * the batch dropped. cairn_hub_stream_free must not run beside any other
 * call for its stream. Different streams run in parallel. cairn_hub_next
 * reads the store (history, prev_kv) with no lock held. The notify callback runs
 * on the hub's thread with no hub lock held; it may call any function of
 * this header except cairn_hub_free, and should only schedule work (it
 * delays the notifications of the other streams while it runs).
 * cairn_hub_stream_free waits for a notify callback of that stream that is
 * running on another thread, so its caller must not hold a lock that the
 * callback takes.
 */

#include "store/store.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cairn_hub cairn_hub;
typedef struct cairn_hub_stream cairn_hub_stream;

/* etcd: watchBatchMaxRevs, the most revisions in one catch-up response. */
#define CAIRN_HUB_CATCHUP_MAX_REVS 1000

typedef struct cairn_hub_options {
    /* The ring of recent revisions: at most this many events and bytes of
     * keys and values (whole revisions are dropped, oldest first). */
    size_t ring_events; /* 16,384 */
    size_t ring_bytes;  /* 16 MiB */
    /* A live watcher this many revisions, or bytes of ring events, behind
     * the newest revision catches up instead (etcd: a watcher whose send
     * channel is full becomes a victim, then unsynced). */
    size_t lag_revs;  /* 128 */
    size_t lag_bytes; /* 4 MiB */
    /* A catch-up batch ends at the first revision boundary past this many
     * bytes of keys and values (at least one revision), which bounds what
     * one stream holds in memory. */
    size_t catchup_bytes; /* 4 MiB */
    /* A watcher that must catch up is not served before this many ms
     * (etcd serves them from a loop that runs every 100 ms). */
    uint64_t sync_delay_ms; /* 20 */
    /* Monotonic ms (injectable for tests); NULL = CLOCK_MONOTONIC. */
    uint64_t (*clock_ms)(void *arg);
    void *clock_arg;
} cairn_hub_options;

/* Fills the defaults above. */
void cairn_hub_options_init(cairn_hub_options *o);

/* A hub with no store yet (the store's events callback needs the hub
 * before the store opens); starts the hub's thread. |o| NULL: defaults.
 * CAIRN_ENOMEM. */
int cairn_hub_new(cairn_hub **out, const cairn_hub_options *o);
/* Once the store is open: history starts at its revision (everything can
 * be replayed from a fresh store). |s| is borrowed and must stay open
 * while any stream exists. */
void cairn_hub_attach(cairn_hub *h, cairn_store *s);
/* Stops the hub's thread and frees the ring; every stream must have been
 * freed. */
void cairn_hub_free(cairn_hub *h);

/* A store subscriber (cairn_store_events_cb); |arg| is the hub. */
void cairn_hub_events_cb(void *arg, int64_t rev, const cairn_hash *hash, const uint8_t *change,
                         size_t change_len, const cairn_event *ev, size_t nev);

/* The newest revision the hub knows (the store's, once attached): the
 * header revision of created, canceled and progress answers. */
int64_t cairn_hub_revision(cairn_hub *h);

/* ---- streams ----------------------------------------------------------- */

typedef void (*cairn_hub_notify_cb)(void *arg);

/* A stream of watchers. |cb| (with |arg|) is called on the hub's thread
 * whenever the stream may have a batch to pull (new events, a catch-up
 * delay over). CAIRN_ENOMEM. */
int cairn_hub_stream_new(cairn_hub_stream **out, cairn_hub *h, cairn_hub_notify_cb cb, void *arg);
/* Frees the stream and its watchers; no notify for it runs after this
 * returns (see THREADS). NULL is fine. */
void cairn_hub_stream_free(cairn_hub_stream *st);

/* A WatchCreateRequest, etcd's range forms: key empty = "\0"; range_end
 * empty = the key alone, "\0" = every key >= key. Borrowed for the call. */
typedef struct cairn_hub_watch_req {
    int64_t watch_id; /* 0: the stream's next free id */
    const uint8_t *key;
    size_t key_len;
    const uint8_t *range_end;
    size_t range_end_len;
    int64_t start_revision; /* 0 or in the future: live from there */
    int noput, nodelete;    /* filters */
    int prev_kv;            /* batches carry each event's previous kv */
    int fragment;           /* passed through in the batches */
} cairn_hub_watch_req;

/* Adds a watcher; *id its id, *rev the revision of the created answer (set
 * on failure too). The watcher is not served before cairn_hub_start (the
 * created answer must leave first). Errors: CAIRN_EWATCHEMPTYRANGE (key >=
 * range_end), CAIRN_EWATCHDUPID (the id is taken on this stream),
 * CAIRN_ENOMEM; etcd answers the first two with id -1. */
int cairn_hub_watch(cairn_hub_stream *st, int64_t *id, int64_t *rev, const cairn_hub_watch_req *r);
/* The created answer of watcher |id| is on its way: serve it from now. */
void cairn_hub_start(cairn_hub_stream *st, int64_t id);
/* Removes watcher |id|; *rev the revision of the canceled answer.
 * CAIRN_ENOTFOUND (etcd answers nothing then). */
int cairn_hub_cancel(cairn_hub_stream *st, int64_t *rev, int64_t id);

/* One answer for one watcher. Either events (nevents > 0) or, with
 * compact_revision > 0 and no events, "compacted": the watcher's next
 * revision fell below the compaction (etcd answers compact_revision,
 * canceled, header revision 0), and the hub removed the watcher. */
typedef struct cairn_hub_batch {
    int64_t watch_id;
    int64_t revision; /* the header revision: a live batch's own; a
                         catch-up batch's the hub's newest */
    int64_t compact_revision;
    int fragment; /* the watcher asked for fragments */
    size_t nevents;
    cairn_event *events; /* DELETE: key and mod_revision only */
    /* prev_kvs[i]: the key at events[i]'s mod_revision - 1, NULL for a
     * creation or when compacted away; prev_kvs itself NULL unless the
     * watcher asked for prev_kv. */
    const cairn_kv **prev_kvs;
    void *mem_;
} cairn_hub_batch;

/* Everything a batch points to is owned by it. NULL-safe, idempotent. */
void cairn_hub_batch_destroy(cairn_hub_batch *b);

enum {
    CAIRN_HUB_NONE = 0,  /* nothing to send now (the stream is notified) */
    CAIRN_HUB_BATCH = 1, /* *b filled */
    CAIRN_HUB_AGAIN = 2, /* progress made, nothing to send: call again
                            (after any answer of the caller's own) */
};

/* The next answer of the stream's first watcher (in creation order) that
 * has one. Returns CAIRN_HUB_*, or CAIRN_ENOMEM / CAIRN_EIO /
 * CAIRN_ECORRUPT, after which the stream cannot keep its promise (no gap,
 * no duplicate) and must end. Reads the store without any lock held. */
int cairn_hub_next(cairn_hub_stream *st, cairn_hub_batch *b);

#endif
