/*
 * etcd's Watch service: a hub of watchers keyed by range, fed by the
 * store's events callback, and one bidirectional stream per client call.
 *
 * History. The store calls watch_events_cb on its committer thread, in
 * apply order, for every durable change (DESIGN: no event before it is
 * durable). The hub copies the events into a ring of recent revisions
 * (bounded: RING_MAX_EVENTS events and RING_MAX_BYTES bytes); a watcher
 * whose start revision is in the ring catches up from it, then follows the
 * live stream. A start revision older than the ring (before this process
 * started, or evicted) but not below the store's compaction floor catches
 * up from disk instead (cairn_store_history, read by the pump outside the
 * hub lock): each disk batch covers exactly the revisions [next_rev, until]
 * (until <= the hub's last revision, capped at what the store's snapshot
 * saw), and next_rev moves to until + 1, so the ring or the live stream
 * goes on from there with no gap and no duplicate. Tests may shrink the
 * ring with the environment variables CAIRN_WATCH_RING_EVENTS and
 * CAIRN_WATCH_RING_BYTES (values above the defaults are ignored), and set
 * the live lag bounds below with CAIRN_WATCH_LAG_REVS and _LAG_BYTES.
 *
 * Semantics measured on etcd 3.4 / read in its watch.go and
 * watchable_store.go: a created response first (header at the current
 * revision, watch ids auto-assigned per stream from 0, a duplicate
 * explicit id or an empty range is "created" and "canceled" with id -1 and
 * the mvcc error as cancel_reason); a live watcher gets one response per
 * revision; a catching-up watcher gets the revisions up to the current one
 * in one response (at most 1000 revisions) with the current revision in its
 * header; a start below the compaction floor gets a response with
 * compact_revision, canceled, and header revision 0; prev_kv is read at
 * mod_revision - 1 (not for creations); a cancel of an unknown id answers
 * nothing; a progress request answers watch_id -1 at the current revision;
 * a request without a union member is ignored.
 *
 * Threads. Every stream has two tags: one receive and at most one send in
 * flight. A stream's next message is chosen under the hub lock (control
 * responses first, in order, then events per watcher) and copied out, so
 * the ring may move on; prev_kv reads happen outside the lock (they read
 * the store, which the committer thread must never wait for). Work comes
 * from workers (after a receive or a send) and from the pump thread, which
 * the events callback wakes — the callback itself never sends or reads.
 *
 * Slow watchers. Watchers do not own queues: every watcher pulls from the
 * one shared ring at its next_rev, so a stream that stops reading holds
 * one message in flight (gRPC completes it once HTTP/2 flow control lets
 * it out) and nothing else, and neither writers nor other streams wait for
 * it. What one stream may hold is bounded: one message in flight (a live
 * response is one revision; a catch-up response ends at the first
 * revision boundary past CATCHUP_MAX_BYTES), and at most CTL_MAX queued
 * control responses, after which its requests are not read until the
 * queue drains (back-pressure to the client, as etcd's full ctrlStream
 * channel blocks its receive loop). A live watcher that falls more than
 * LIVE_MAX_LAG_REVS revisions or LIVE_MAX_LAG_BYTES of ring behind, or
 * whose next revision the ring has evicted, is demoted to catching up
 * with next_rev kept (etcd: victim, then unsynced): it is served batches
 * from the ring or from disk like any catching-up watcher and is live
 * again once caught up. It is cancelled only where etcd cancels it: when
 * next_rev falls below the compaction floor.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The ring is a cache for watchers a little behind, not the history (that
 * is on disk): 16,384 events is about half a second of peak puts and about
 * 2 MiB at 18-byte keys and 32-byte values. It was 100,000 events / 64 MiB,
 * which at a million keys held 12 MiB more than it served. */
#define RING_MAX_EVENTS 16384
#define RING_MAX_BYTES (16u << 20)
#define CATCHUP_MAX_REVS 1000 /* etcd: watchBatchMaxRevs */
/* A catch-up response ends at the first revision boundary past this many
 * bytes of events (at least one revision), so that one message and one
 * disk read stay bounded however large the values. */
#define CATCHUP_MAX_BYTES (1u << 20)
/* A live watcher more than this many revisions, or bytes of ring events,
 * behind the hub's last revision has fallen behind: it catches up (etcd:
 * a watcher whose stream's send channel of chanBufLen = 128 responses is
 * full becomes a victim, then unsynced, and catches up from the store). */
#define LIVE_MAX_LAG_REVS 128
#define LIVE_MAX_LAG_BYTES (4u << 20)
/* Control responses queued on a stream before it stops reading requests
 * (etcd: ctrlStreamBufLen; its receive loop blocks on the full channel). */
#define CTL_MAX 16
/* etcd serves watchers that catch up from a loop that runs every 100 ms,
 * so their first answer (events or "compacted") comes after the created
 * answers of requests sent right behind it; cairn waits SYNC_DELAY_MS. */
#define SYNC_DELAY_MS 20

/* One event in the ring, owning its bytes. */
typedef struct ring_ev {
    int64_t rev;
    int type;
    uint8_t *key;
    size_t key_len;
    uint8_t *value;
    size_t value_len;
    int64_t create_revision;
    int64_t version;
    int64_t lease;
    uint64_t cum; /* bytes put into the ring before this event */
} ring_ev;

typedef struct watcher {
    struct watcher *next;
    int64_t id;
    uint8_t *key;
    size_t key_len;
    uint8_t *end; /* NULL: the single key; end_len 0: every key >= key */
    size_t end_len;
    int noput, nodelete, prev_kv, fragment;
    uint64_t serial;        /* unique in the hub: found again after a disk read */
    int64_t next_rev;       /* first revision not yet delivered */
    int synced;             /* caught up: one response per revision */
    uint64_t not_before_ms; /* catching up: not served before this */
} watcher;

typedef struct ctl_msg {
    struct ctl_msg *next;
    grpc_byte_buffer *bb;
} ctl_msg;

typedef struct wstream {
    struct wstream *next; /* hub list */
    rpc_call *c;
    rpc_side recv_tag, send_tag;
    watcher *watchers;
    int64_t next_auto_id;
    ctl_msg *ctl_head, **ctl_tail;
    size_t nctl;     /* messages on ctl_head */
    int recv_paused; /* nctl reached CTL_MAX: no receive posted */
    grpc_byte_buffer *sending_bb;
    int sending;
    int recv_pending;
    int closing; /* no more sends; finish once idle */
    int finished;
    int dirty; /* the pump thread should look */
    int refs;  /* threads between the lock and pump(): no finish */
    int sent_md;
} wstream;

struct watch_hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ring_ev *ring; /* circular */
    size_t cap, head, n;
    size_t bytes;
    uint64_t added;    /* bytes ever put into the ring (ring_ev.cum) */
    int64_t last_rev;  /* newest revision the hub knows (the store's) */
    int64_t floor;     /* revisions below this cannot be replayed */
    size_t max_events; /* RING_MAX_EVENTS, or the test knob */
    size_t max_bytes;  /* RING_MAX_BYTES, or the test knob */
    size_t lag_revs;   /* LIVE_MAX_LAG_REVS, or the test knob */
    size_t lag_bytes;  /* LIVE_MAX_LAG_BYTES, or the test knob */
    wstream *streams;
    int wait_catchup; /* a watcher waits for its catch-up time */
    uint64_t next_serial;
    int stop;
    pthread_t pump;
    int pump_running;
};

static ring_ev *ring_at(struct watch_hub *h, size_t i)
{
    return &h->ring[(h->head + i) % h->cap];
}

static void ring_drop_oldest(struct watch_hub *h)
{
    /* Drops every event of the oldest revision, so no revision is partial. */
    if (h->n == 0)
        return;
    int64_t rev = ring_at(h, 0)->rev;
    while (h->n > 0 && ring_at(h, 0)->rev == rev) {
        ring_ev *e = ring_at(h, 0);
        h->bytes -= e->key_len + e->value_len;
        free(e->key);
        free(e->value);
        h->head = (h->head + 1) % h->cap;
        h->n--;
    }
    h->floor = rev + 1;
}

/* ---- matching ------------------------------------------------------------ */

static int cmp_bytes(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    int r = memcmp(a, b, an < bn ? an : bn);
    if (r)
        return r;
    return an < bn ? -1 : an > bn;
}

static int matches(const watcher *w, const ring_ev *e)
{
    if ((e->type == CAIRN_EVENT_PUT && w->noput) || (e->type == CAIRN_EVENT_DELETE && w->nodelete))
        return 0;
    if (!w->end)
        return cmp_bytes(e->key, e->key_len, w->key, w->key_len) == 0;
    if (cmp_bytes(e->key, e->key_len, w->key, w->key_len) < 0)
        return 0;
    return w->end_len == 0 || cmp_bytes(e->key, e->key_len, w->end, w->end_len) < 0;
}

/* ---- building responses -------------------------------------------------- */

static void header_at(cairn_server *srv, Etcdserverpb__ResponseHeader *ph, int64_t rev)
{
    cairn_header h;
    cairn_store_header(srv->store, &h);
    h.revision = rev;
    etcd_header(srv, ph, &h);
}

/* Queues a control response (created, canceled, progress). Hub locked. */
static void queue_ctl(cairn_server *srv, wstream *ws, int64_t id, int created, int canceled,
                      const char *reason, int64_t header_rev, int64_t compact_rev)
{
    Etcdserverpb__ResponseHeader ph;
    header_at(srv, &ph, header_rev);
    Etcdserverpb__WatchResponse r;
    etcdserverpb__watch_response__init(&r);
    r.header = &ph;
    r.watch_id = id;
    r.created = created;
    r.canceled = canceled;
    r.cancel_reason = (char *)(reason ? reason : "");
    r.compact_revision = compact_rev;
    ctl_msg *m = calloc(1, sizeof *m);
    if (!m) {
        ws->closing = 1; /* cannot keep the protocol: end the stream */
        return;
    }
    m->bb = rpc_pack(&r.base);
    *ws->ctl_tail = m;
    ws->ctl_tail = &m->next;
    ws->nctl++;
}

/* Events picked for one response, copied out of the ring. */
typedef struct batch {
    int64_t watch_id;
    int64_t header_rev;
    int prev_kv;
    int fragment;
    size_t n;
    ring_ev *ev; /* borrowed pointers are copied: own key/value */
} batch;

static void batch_free(batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free(b->ev[i].key);
        free(b->ev[i].value);
    }
    free(b->ev);
    memset(b, 0, sizeof *b);
}

static int copy_ev(ring_ev *dst, const ring_ev *src)
{
    *dst = *src;
    dst->key = malloc(src->key_len ? src->key_len : 1);
    dst->value = malloc(src->value_len ? src->value_len : 1);
    if (!dst->key || !dst->value) {
        free(dst->key);
        free(dst->value);
        return CAIRN_ENOMEM;
    }
    if (src->key_len) /* a history DELETE has no value (NULL) */
        memcpy(dst->key, src->key, src->key_len);
    if (src->value_len)
        memcpy(dst->value, src->value, src->value_len);
    return 0;
}

/* Index of the first ring event with rev >= |rev|. Hub locked. */
static size_t ring_find(struct watch_hub *h, int64_t rev)
{
    size_t lo = 0, hi = h->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ring_at(h, mid)->rev < rev)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A catch-up from disk, planned under the hub lock, read outside it. */
typedef struct hist_req {
    watcher w; /* a copy with its own key/end: the filters and range */
    int64_t from, until;
} hist_req;

static void hist_req_free(hist_req *q)
{
    free(q->w.key);
    free(q->w.end);
    memset(q, 0, sizeof *q);
}

/* Picks the next events for |w| into |b|; 1 if there are some, 2 if |w|
 * must catch up from disk first (|q| planned). May cancel |w| for
 * compaction (queues the response, returns 0). Hub locked. */
static int pick(cairn_server *srv, wstream *ws, watcher *w, batch *b, hist_req *q)
{
    struct watch_hub *h = srv->watch;
    if (w->next_rev > h->last_rev)
        return 0;
    int live = w->synced;
    if (live) {
        /* A live watcher whose revisions the ring evicted, or that lags
         * beyond the bound (its stream does not take messages as fast as
         * they come), catches up instead: from disk or from the ring, in
         * batches, from next_rev on, so nothing is skipped or repeated. */
        size_t at = ring_find(h, w->next_rev);
        uint64_t lag = at < h->n ? h->added - ring_at(h, at)->cum : 0;
        if ((h->floor > 0 && w->next_rev < h->floor) ||
            (uint64_t)(h->last_rev - w->next_rev) >= h->lag_revs || lag > h->lag_bytes) {
            w->synced = 0;
            w->not_before_ms = 0;
            live = 0;
        }
    }
    if (!live && mono_ms() < w->not_before_ms) {
        h->wait_catchup = 1; /* the pump thread comes back */
        return 0;
    }
    if (!live) {
        /* etcd: a start below the compact revision (-1 while never
         * compacted) is answered with it. */
        int64_t compacted = cairn_store_compacted_rev(srv->store);
        int64_t eff = compacted > 0 ? compacted : -1;
        if (w->next_rev < eff) {
            queue_ctl(srv, ws, w->id, 0, 1, NULL, 0, eff);
            w->next_rev = INT64_MAX; /* removed by the caller */
            return 0;
        }
        if (h->floor > 0 && w->next_rev < h->floor) {
            /* Older than the ring: from disk (etcd's batch of revisions). */
            memset(q, 0, sizeof *q);
            q->w = *w;
            q->w.next = NULL;
            q->w.key = malloc(w->key_len ? w->key_len : 1);
            q->w.end = w->end ? malloc(w->end_len ? w->end_len : 1) : NULL;
            if (!q->w.key || (w->end && !q->w.end)) {
                hist_req_free(q);
                ws->closing = 1;
                return 0;
            }
            memcpy(q->w.key, w->key, w->key_len);
            if (w->end)
                memcpy(q->w.end, w->end, w->end_len);
            q->from = w->next_rev;
            int64_t until = w->next_rev + CATCHUP_MAX_REVS - 1;
            if (until > h->last_rev)
                until = h->last_rev;
            q->until = until;
            b->watch_id = w->id;
            b->prev_kv = w->prev_kv;
            b->fragment = w->fragment;
            return 2;
        }
    }
    size_t i = ring_find(h, w->next_rev);
    int64_t until = live ? INT64_MAX : w->next_rev + CATCHUP_MAX_REVS - 1;
    size_t cap = 0, bytes = 0;
    for (; i < h->n; i++) {
        const ring_ev *e = ring_at(h, i);
        if (live && b->n > 0 && e->rev != b->ev[0].rev)
            break; /* live: one revision per response */
        if (e->rev > until)
            break;
        if (bytes >= CATCHUP_MAX_BYTES && e->rev != b->ev[b->n - 1].rev) {
            until = e->rev - 1; /* catching up: the batch is full */
            break;
        }
        if (!matches(w, e))
            continue;
        if (b->n == cap) {
            cap = cap ? 2 * cap : 8;
            ring_ev *grown = realloc(b->ev, cap * sizeof *grown);
            if (!grown)
                goto nomem;
            b->ev = grown;
        }
        if (copy_ev(&b->ev[b->n], e) != 0)
            goto nomem;
        b->n++;
        bytes += e->key_len + e->value_len;
    }
    int64_t done;
    if (live) {
        done = b->n ? b->ev[0].rev : h->last_rev;
    } else {
        done = until < h->last_rev ? until : h->last_rev;
        if (done >= h->last_rev)
            w->synced = 1;
    }
    w->next_rev = done + 1;
    b->watch_id = w->id;
    b->prev_kv = w->prev_kv;
    b->fragment = w->fragment;
    /* etcd: a live response carries its revision; a catch-up batch the
     * revision the store was at. */
    b->header_rev = live && b->n ? b->ev[0].rev : h->last_rev;
    return b->n > 0;
nomem:
    /* A partial revision cannot be sent: end the stream (its client sees
     * the end and may watch again from next_rev). */
    batch_free(b);
    ws->closing = 1;
    return 0;
}

static void remove_watcher(wstream *ws, watcher *w)
{
    for (watcher **p = &ws->watchers; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    free(w->key);
    free(w->end);
    free(w);
}

static void fill_kv(Mvccpb__KeyValue *kv, const ring_ev *e)
{
    mvccpb__key_value__init(kv);
    kv->key.data = e->key;
    kv->key.len = e->key_len;
    kv->mod_revision = e->rev;
    if (e->type == CAIRN_EVENT_PUT) {
        kv->value.data = e->value;
        kv->value.len = e->value_len;
        kv->create_revision = e->create_revision;
        kv->version = e->version;
        kv->lease = e->lease;
    }
}

/* Packs |b| into one response, or, for a watcher that asked for fragments
 * and a response of at least --max-request-bytes, into several (etcd's
 * sendFragments: as many events as fit, at least one, "fragment" set on
 * all but the last). Outside the hub lock: prev_kv reads the store.
 * Returns the number of buffers in out[] (0: out of memory). */
static size_t pack_batch(cairn_server *srv, batch *b, grpc_byte_buffer ***out)
{
    size_t n = b->n, nout = 0;
    *out = NULL;
    Mvccpb__Event *evs = calloc(n, sizeof *evs);
    Mvccpb__Event **ptrs = calloc(n, sizeof *ptrs);
    Mvccpb__KeyValue *kvs = calloc(n, sizeof *kvs);
    Mvccpb__KeyValue *prev = calloc(n, sizeof *prev);
    cairn_range_resp *pr = calloc(n, sizeof *pr);
    grpc_byte_buffer **bbs = calloc(n + 1, sizeof *bbs);
    if (!evs || !ptrs || !kvs || !prev || !pr || !bbs)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const ring_ev *e = &b->ev[i];
        mvccpb__event__init(&evs[i]);
        evs[i].type = e->type == CAIRN_EVENT_DELETE ? MVCCPB__EVENT__EVENT_TYPE__DELETE
                                                    : MVCCPB__EVENT__EVENT_TYPE__PUT;
        fill_kv(&kvs[i], e);
        evs[i].kv = &kvs[i];
        /* etcd: prev_kv is the key at mod_revision - 1, except for a
         * creation (a PUT with version 1); missing if compacted. */
        if (b->prev_kv && !(e->type == CAIRN_EVENT_PUT && e->version == 1)) {
            cairn_range_req r;
            memset(&r, 0, sizeof r);
            r.key = e->key;
            r.key_len = e->key_len;
            r.revision = e->rev - 1;
            if (cairn_store_range(srv->store, &pr[i], &r) == 0 && pr[i].nkvs > 0) {
                kv_to_pb(&prev[i], &pr[i].kvs[0]);
                evs[i].prev_kv = &prev[i];
            }
        }
        ptrs[i] = &evs[i];
    }
    Etcdserverpb__ResponseHeader ph;
    header_at(srv, &ph, b->header_rev);
    Etcdserverpb__WatchResponse resp;
    etcdserverpb__watch_response__init(&resp);
    resp.header = &ph;
    resp.watch_id = b->watch_id;
    resp.events = ptrs;
    resp.n_events = n;
    uint64_t limit = srv->cfg->max_request_bytes;
    if (!b->fragment || n < 2 || protobuf_c_message_get_packed_size(&resp.base) < limit) {
        bbs[nout++] = rpc_pack(&resp.base);
        goto out;
    }
    size_t idx = 0;
    while (idx < n) {
        resp.events = ptrs + idx;
        resp.n_events = 0;
        resp.fragment = 1;
        while (idx + resp.n_events < n) {
            resp.n_events++;
            if (resp.n_events > 1 && protobuf_c_message_get_packed_size(&resp.base) >= limit) {
                resp.n_events--;
                break;
            }
        }
        idx += resp.n_events;
        if (idx == n)
            resp.fragment = 0;
        bbs[nout++] = rpc_pack(&resp.base);
    }
out:
    for (size_t i = 0; pr && i < n; i++)
        cairn_range_resp_destroy(&pr[i]);
    free(pr);
    free(prev);
    free(kvs);
    free(ptrs);
    free(evs);
    if (nout == 0) {
        free(bbs);
        return 0;
    }
    *out = bbs;
    return nout;
}

/* ---- catching up from disk ---------------------------------------------- */

typedef struct hist_ctx {
    hist_req *q;
    batch *b;
    size_t cap;
    size_t bytes; /* of the events in b */
    int full;     /* saw a revision past q->until: [from, until] all read */
} hist_ctx;

#define HIST_STOP 1 /* not a cairn error code: the scan went past until */

static int hist_cb(void *arg, int64_t rev, const cairn_event *ev, size_t nev)
{
    hist_ctx *x = arg;
    if (rev > x->q->until || x->bytes >= CATCHUP_MAX_BYTES) {
        if (rev <= x->q->until) /* the batch is full before |rev| */
            x->q->until = rev - 1;
        x->full = 1;
        return HIST_STOP;
    }
    for (size_t i = 0; i < nev; i++) {
        const cairn_kv *kv = &ev[i].kv;
        ring_ev e;
        memset(&e, 0, sizeof e);
        e.rev = rev;
        e.type = ev[i].type;
        e.key = (uint8_t *)kv->key;
        e.key_len = kv->key_len;
        e.value = (uint8_t *)kv->value;
        e.value_len = ev[i].type == CAIRN_EVENT_PUT ? kv->value_len : 0;
        e.create_revision = kv->create_revision;
        e.version = kv->version;
        e.lease = kv->lease;
        if (!matches(&x->q->w, &e))
            continue;
        if (x->b->n == x->cap) {
            size_t nc = x->cap ? 2 * x->cap : 8;
            ring_ev *grown = realloc(x->b->ev, nc * sizeof *grown);
            if (!grown)
                return CAIRN_ENOMEM;
            x->b->ev = grown;
            x->cap = nc;
        }
        if (copy_ev(&x->b->ev[x->b->n], &e) != 0)
            return CAIRN_ENOMEM;
        x->b->n++;
        x->bytes += e.key_len + e.value_len;
    }
    return 0;
}

/* Reads the revisions [q->from, q->until] of q's range into |b| (no lock
 * held). Returns 0 and sets *done to the last revision covered (less than
 * q->until if the store's visible revision lags the hub's), or an error
 * (CAIRN_ECOMPACTED: compacted meanwhile). */
static int hist_read(cairn_server *srv, hist_req *q, batch *b, int64_t *done)
{
    static const uint8_t zero = 0;
    const uint8_t *end = NULL;
    size_t end_len = 0;
    if (q->w.end && q->w.end_len == 0) { /* every key >= key */
        end = &zero;
        end_len = 1;
    } else if (q->w.end) {
        end = q->w.end;
        end_len = q->w.end_len;
    }
    hist_ctx x = {q, b, 0, 0, 0};
    int64_t last = 0;
    int rc = cairn_store_history(srv->store, &last, q->from, q->w.key, q->w.key_len, end, end_len,
                                 hist_cb, &x);
    if (rc == HIST_STOP && x.full) {
        *done = q->until;
        return 0;
    }
    if (rc)
        return rc;
    *done = last < q->until ? last : q->until;
    return 0;
}

/* ---- the stream ---------------------------------------------------------- */

static void pump(cairn_server *srv, wstream *ws);

static void stream_cleanup(rpc_call *c)
{
    wstream *ws = c->ctx;
    if (!ws)
        return;
    while (ws->watchers)
        remove_watcher(ws, ws->watchers);
    while (ws->ctl_head) {
        ctl_msg *m = ws->ctl_head;
        ws->ctl_head = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    if (ws->sending_bb)
        grpc_byte_buffer_destroy(ws->sending_bb);
    free(ws);
    c->ctx = NULL;
}

/* Ends the call once nothing is in flight. Hub locked; returns 1 if the
 * caller must call rpc_reply (outside the lock). */
static int maybe_finish(cairn_server *srv, wstream *ws)
{
    if (!ws->closing || ws->finished || ws->sending || ws->refs > 0)
        return 0;
    if (ws->recv_pending) {
        /* Wake the receive so that it completes; we finish then. */
        grpc_call_cancel(ws->c->call, NULL);
        return 0;
    }
    ws->finished = 1;
    for (wstream **p = &srv->watch->streams; *p; p = &(*p)->next)
        if (*p == ws) {
            *p = ws->next;
            break;
        }
    return 1;
}

static void on_sent(void *arg, int ok);
static void post_recv(wstream *ws);

/* Takes the first control message; reading requests goes on once the
 * queue is below CTL_MAX again. Hub locked. */
static grpc_byte_buffer *ctl_pop(wstream *ws)
{
    ctl_msg *m = ws->ctl_head;
    ws->ctl_head = m->next;
    if (!ws->ctl_head)
        ws->ctl_tail = &ws->ctl_head;
    ws->nctl--;
    grpc_byte_buffer *bb = m->bb;
    free(m);
    if (ws->recv_paused && ws->nctl < CTL_MAX && !ws->closing) {
        ws->recv_paused = 0;
        post_recv(ws);
    }
    return bb;
}

/* Sends the stream's next message if it is idle; finishes it if closing. */
static void pump(cairn_server *srv, wstream *ws)
{
    struct watch_hub *h = srv->watch;
    hist_req q;
    memset(&q, 0, sizeof q);
again:
    pthread_mutex_lock(&h->mu);
    ws->dirty = 0;
    if (ws->sending || ws->finished) {
        pthread_mutex_unlock(&h->mu);
        return;
    }
    grpc_byte_buffer *bb = NULL;
    batch b;
    memset(&b, 0, sizeof b);
    int have_batch = 0, have_hist = 0;
    if (!ws->closing) {
        if (ws->ctl_head) {
            bb = ctl_pop(ws);
        } else {
            for (watcher *w = ws->watchers; w;) {
                watcher *next = w->next;
                have_batch = pick(srv, ws, w, &b, &q);
                if (ws->closing) { /* out of memory: nothing more to send */
                    batch_free(&b);
                    have_batch = 0;
                    break;
                }
                if (have_batch == 2) {
                    have_batch = 0;
                    have_hist = 1;
                    break;
                }
                if (w->next_rev == INT64_MAX) { /* compacted: its answer is queued */
                    remove_watcher(ws, w);
                    if (ws->ctl_head) {
                        bb = ctl_pop(ws);
                        break;
                    }
                }
                if (have_batch)
                    break;
                batch_free(&b);
                w = next;
            }
        }
    }
    if (!bb && !have_batch && !have_hist) {
        int fin = maybe_finish(srv, ws);
        pthread_mutex_unlock(&h->mu);
        if (fin)
            rpc_reply(ws->c, NULL);
        return;
    }
    ws->sending = 1;
    pthread_mutex_unlock(&h->mu);

    if (have_hist) {
        /* The disk read runs unlocked; ws->sending keeps every other pump
         * of this stream out, and the watcher is found again by serial
         * (a cancel may have removed it meanwhile). */
        int64_t done = 0;
        int rc = hist_read(srv, &q, &b, &done);
        pthread_mutex_lock(&h->mu);
        ws->sending = 0;
        watcher *w = ws->watchers;
        while (w && w->serial != q.w.serial)
            w = w->next;
        if (w && !ws->closing && w->next_rev == q.from) {
            if (rc == CAIRN_ECOMPACTED) {
                int64_t compacted = cairn_store_compacted_rev(srv->store);
                queue_ctl(srv, ws, w->id, 0, 1, NULL, 0, compacted);
                remove_watcher(ws, w);
            } else if (rc) {
                ws->closing = 1; /* cannot keep the protocol: end the stream */
            } else if (done >= q.from) {
                w->next_rev = done + 1;
                if (done >= h->last_rev)
                    w->synced = 1;
                if (b.n > 0) {
                    have_batch = 1;
                    b.header_rev = h->last_rev;
                }
            } else {
                /* The store's snapshot lagged the hub: try again later. */
                w->not_before_ms = mono_ms() + SYNC_DELAY_MS;
                h->wait_catchup = 1;
                pthread_cond_signal(&h->cv);
            }
        }
        hist_req_free(&q);
        if (!have_batch) {
            batch_free(&b);
            pthread_mutex_unlock(&h->mu);
            goto again;
        }
        ws->sending = 1;
        pthread_mutex_unlock(&h->mu);
    }

    grpc_byte_buffer **frags = NULL;
    size_t nfrags = 0;
    if (have_batch) {
        nfrags = pack_batch(srv, &b, &frags);
        bb = nfrags ? frags[0] : NULL;
        batch_free(&b);
    }
    pthread_mutex_lock(&h->mu);
    /* Fragments after the first go out before anything else. */
    for (size_t i = nfrags; i-- > 1;) {
        ctl_msg *m = calloc(1, sizeof *m);
        if (!m) {
            grpc_byte_buffer_destroy(frags[i]);
            ws->closing = 1;
            continue;
        }
        m->bb = frags[i];
        m->next = ws->ctl_head;
        if (!ws->ctl_head)
            ws->ctl_tail = &m->next;
        ws->ctl_head = m;
        ws->nctl++;
    }
    free(frags);
    if (!bb) {
        ws->sending = 0;
        ws->closing = 1;
        int fin = maybe_finish(srv, ws);
        pthread_mutex_unlock(&h->mu);
        if (fin)
            rpc_reply(ws->c, NULL);
        return;
    }
    ws->sending_bb = bb;
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!ws->sent_md) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        ws->sent_md = 1;
        ws->c->sent_initial_md = 1;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = bb;
    n++;
    ws->send_tag.fn = on_sent;
    ws->send_tag.arg = ws;
    if (rpc_side_batch(ws->c, ops, n, &ws->send_tag) != 0) {
        ws->sending = 0;
        ws->closing = 1;
        int fin = maybe_finish(srv, ws);
        pthread_mutex_unlock(&h->mu);
        if (fin)
            rpc_reply(ws->c, NULL);
        return;
    }
    pthread_mutex_unlock(&h->mu);
}

/* pump() for a caller that took a reference under the hub lock: drops
 * it and finishes the stream if that reference was all that held it. */
static void pump_release(cairn_server *srv, wstream *ws)
{
    pump(srv, ws);
    pthread_mutex_lock(&srv->watch->mu);
    ws->refs--;
    int fin = maybe_finish(srv, ws);
    pthread_mutex_unlock(&srv->watch->mu);
    if (fin)
        rpc_reply(ws->c, NULL);
}

static void on_sent(void *arg, int ok)
{
    wstream *ws = arg;
    cairn_server *srv = etcd_node(ws->c);
    pthread_mutex_lock(&srv->watch->mu);
    ws->sending = 0;
    grpc_byte_buffer_destroy(ws->sending_bb);
    ws->sending_bb = NULL;
    if (!ok)
        ws->closing = 1;
    ws->refs++;
    pthread_mutex_unlock(&srv->watch->mu);
    pump_release(srv, ws);
}

static int set_bytes(uint8_t **dst, const ProtobufCBinaryData *src)
{
    *dst = malloc(src->len ? src->len : 1);
    if (!*dst)
        return CAIRN_ENOMEM;
    memcpy(*dst, src->data, src->len);
    return 0;
}

static void handle_create(cairn_server *srv, wstream *ws, const Etcdserverpb__WatchCreateRequest *r)
{
    struct watch_hub *h = srv->watch;
    static const uint8_t zero = 0;
    ProtobufCBinaryData key = r->key;
    if (key.len == 0) { /* etcd: an empty key is "\0", the smallest key */
        key.data = (uint8_t *)&zero;
        key.len = 1;
    }
    int single = r->range_end.len == 0;
    int fromkey = r->range_end.len == 1 && r->range_end.data[0] == 0;
    int64_t cur = h->last_rev;
    /* etcd: key >= range_end is an empty range. */
    if (!single && !fromkey &&
        cmp_bytes(key.data, key.len, r->range_end.data, r->range_end.len) >= 0) {
        queue_ctl(srv, ws, -1, 1, 1, "mvcc: watcher range is empty", cur, 0);
        return;
    }
    int64_t id = r->watch_id;
    if (id == 0) { /* etcd: the next free id of this stream */
        for (;;) {
            int taken = 0;
            for (watcher *w = ws->watchers; w; w = w->next)
                taken |= w->id == ws->next_auto_id;
            if (!taken)
                break;
            ws->next_auto_id++;
        }
        id = ws->next_auto_id++;
    } else {
        for (watcher *w = ws->watchers; w; w = w->next)
            if (w->id == id) {
                queue_ctl(srv, ws, -1, 1, 1, "mvcc: duplicate watch ID provided on the WatchStream",
                          cur, 0);
                return;
            }
    }
    watcher *w = calloc(1, sizeof *w);
    if (!w || set_bytes(&w->key, &key) != 0 ||
        (!single && set_bytes(&w->end, &r->range_end) != 0)) {
        if (w) {
            free(w->key);
            free(w);
        }
        ws->closing = 1;
        return;
    }
    w->id = id;
    w->serial = ++h->next_serial;
    w->key_len = key.len;
    w->end_len = fromkey ? 0 : r->range_end.len;
    for (size_t i = 0; i < r->n_filters; i++) {
        if (r->filters[i] == ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NOPUT)
            w->noput = 1;
        else if (r->filters[i] == ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NODELETE)
            w->nodelete = 1;
    }
    w->prev_kv = r->prev_kv;
    w->fragment = r->fragment;
    /* etcd: start 0 or in the future is live from there; else catch up. */
    int64_t start = r->start_revision == 0 ? cur + 1 : r->start_revision;
    w->next_rev = start;
    w->synced = start > cur;
    w->not_before_ms = mono_ms() + SYNC_DELAY_MS;
    queue_ctl(srv, ws, id, 1, 0, NULL, cur, 0);
    watcher **tail = &ws->watchers;
    while (*tail)
        tail = &(*tail)->next;
    *tail = w;
    if (!w->synced) {
        h->wait_catchup = 1;
        pthread_cond_signal(&h->cv);
    }
}

static void on_recv(void *arg, int ok);

static void post_recv(wstream *ws)
{
    rpc_call *c = ws->c;
    if (c->payload) {
        grpc_byte_buffer_destroy(c->payload);
        c->payload = NULL;
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->payload;
    ws->recv_tag.fn = on_recv;
    ws->recv_tag.arg = ws;
    ws->recv_pending = 1;
    if (rpc_side_batch(c, &op, 1, &ws->recv_tag) != 0) {
        ws->recv_pending = 0;
        ws->closing = 1;
    }
}

static void on_recv(void *arg, int ok)
{
    wstream *ws = arg;
    rpc_call *c = ws->c;
    cairn_server *srv = etcd_node(c);
    struct watch_hub *h = srv->watch;
    Etcdserverpb__WatchRequest *req = NULL;
    int closed = !ok || !c->payload;
    if (!closed) {
        uint8_t *bytes;
        size_t len;
        int rc = rpc_payload_take(c, &bytes, &len);
        if (rc == 0) {
            req = etcdserverpb__watch_request__unpack(NULL, len, bytes);
            free(bytes);
            rc = req ? 0 : CAIRN_EUNMARSHAL;
        }
        if (rc != 0) { /* etcd (grpc-go) fails the stream on a bad message */
            rpc_fail_on_end(c, rc, rc == CAIRN_EUNMARSHAL ? ETCD_STREAM_UNMARSHAL : NULL);
            closed = 1;
        }
    }
    pthread_mutex_lock(&h->mu);
    ws->recv_pending = 0;
    if (closed) {
        /* The client's close ends the stream. (etcd 3.4 does not: it goes
         * on sending events until the client cancels; measured.) */
        ws->closing = 1;
    } else {
        switch (req->request_union_case) {
        case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST:
            handle_create(srv, ws, req->create_request);
            break;
        case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CANCEL_REQUEST: {
            int64_t id = req->cancel_request->watch_id;
            for (watcher *w = ws->watchers; w; w = w->next)
                if (w->id == id) {
                    remove_watcher(ws, w);
                    queue_ctl(srv, ws, id, 0, 1, NULL, h->last_rev, 0);
                    break;
                }
            break;
        }
        case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_PROGRESS_REQUEST:
            queue_ctl(srv, ws, -1, 0, 0, NULL, h->last_rev, 0);
            break;
        default:
            break; /* etcd ignores a request without a member */
        }
        /* A client that sends requests but does not read the answers
         * is not read from either once CTL_MAX answers wait. */
        if (!ws->closing && ws->nctl >= CTL_MAX)
            ws->recv_paused = 1;
        else if (!ws->closing)
            post_recv(ws);
    }
    ws->refs++;
    pthread_mutex_unlock(&h->mu);
    if (req)
        etcdserverpb__watch_request__free_unpacked(req, NULL);
    pump_release(srv, ws);
}

static void watch_stream(rpc_call *c, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    cairn_server *srv = etcd_node(c);
    wstream *ws = calloc(1, sizeof *ws);
    if (!ws) {
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    ws->c = c;
    ws->ctl_tail = &ws->ctl_head;
    c->ctx = ws;
    c->ctx_free = stream_cleanup;
    struct watch_hub *h = srv->watch;
    pthread_mutex_lock(&h->mu);
    if (h->stop) {
        pthread_mutex_unlock(&h->mu);
        rpc_fail(c, CAIRN_ESTOPPED, NULL);
        return;
    }
    ws->next = h->streams;
    h->streams = ws;
    post_recv(ws);
    int fail = ws->closing;
    if (fail)
        ws->refs++;
    pthread_mutex_unlock(&h->mu);
    if (fail)
        pump_release(srv, ws);
}

/* ---- the hub ------------------------------------------------------------- */

static void *pump_main(void *arg)
{
    cairn_server *srv = arg;
    struct watch_hub *h = srv->watch;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        wstream *todo = NULL;
        for (wstream *ws = h->streams; ws; ws = ws->next)
            if (ws->dirty && !ws->sending && !ws->finished) {
                todo = ws;
                break;
            }
        if (!todo) {
            if (!h->wait_catchup) {
                pthread_cond_wait(&h->cv, &h->mu);
                continue;
            }
            h->wait_catchup = 0;
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += SYNC_DELAY_MS * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&h->cv, &h->mu, &until);
            for (wstream *ws = h->streams; ws; ws = ws->next)
                for (watcher *w = ws->watchers; w; w = w->next)
                    if (!w->synced)
                        ws->dirty = 1;
            continue;
        }
        todo->dirty = 0;
        todo->refs++; /* keeps |todo| from finishing while we pump it */
        pthread_mutex_unlock(&h->mu);
        pump_release(srv, todo);
        pthread_mutex_lock(&h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

void watch_events_cb(void *arg, int64_t rev, const cairn_hash *hash, const uint8_t *change,
                     size_t change_len, const cairn_event *ev, size_t nev)
{
    (void)hash;
    (void)change;
    (void)change_len;
    cairn_server *srv = arg;
    struct watch_hub *h = srv->watch;
    if (!h || rev == 0 || nev == 0)
        return;
    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < nev; i++) {
        const cairn_kv *kv = &ev[i].kv;
        size_t need = kv->key_len + kv->value_len;
        while (h->n > 0 &&
               (h->n + 1 > h->cap || h->n >= h->max_events || h->bytes + need > h->max_bytes))
            ring_drop_oldest(h);
        ring_ev *e = &h->ring[(h->head + h->n) % h->cap];
        memset(e, 0, sizeof *e);
        e->rev = rev;
        e->type = ev[i].type;
        e->key = malloc(kv->key_len ? kv->key_len : 1);
        e->value = malloc(kv->value_len ? kv->value_len : 1);
        if (!e->key || !e->value) {
            free(e->key);
            free(e->value);
            /* Out of memory: this revision cannot be replayed. */
            while (h->n > 0)
                ring_drop_oldest(h);
            h->floor = rev + 1;
            break;
        }
        memcpy(e->key, kv->key, kv->key_len);
        e->key_len = kv->key_len;
        if (kv->value_len)
            memcpy(e->value, kv->value, kv->value_len);
        e->value_len = kv->value_len;
        e->create_revision = kv->create_revision;
        e->version = kv->version;
        e->lease = kv->lease;
        e->cum = h->added;
        h->n++;
        h->bytes += need;
        h->added += need;
    }
    if (rev > h->last_rev)
        h->last_rev = rev;
    /* Wake the pump only when a watcher may want these events: with no
     * watchers it would wake (a context switch per change), find nothing to
     * do and sleep again. */
    int wake = 0;
    for (wstream *ws = h->streams; ws; ws = ws->next)
        if (ws->watchers)
            ws->dirty = wake = 1;
    if (wake)
        pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Test knobs: tests shrink the ring through the environment so that it
 * evicts revisions a watcher still needs, or move the lag bounds. Only
 * values in [1, max] are taken; anything else keeps the default. */
static void knob(size_t *out, const char *name, unsigned long long max)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end == 0 && n >= 1 && n <= max && n <= SIZE_MAX)
        *out = (size_t)n;
}

int watch_hub_new(cairn_server *srv)
{
    struct watch_hub *h = calloc(1, sizeof *h);
    if (!h)
        return CAIRN_ENOMEM;
    h->max_events = RING_MAX_EVENTS;
    h->max_bytes = RING_MAX_BYTES;
    h->lag_revs = LIVE_MAX_LAG_REVS;
    h->lag_bytes = LIVE_MAX_LAG_BYTES;
    knob(&h->max_events, "CAIRN_WATCH_RING_EVENTS", RING_MAX_EVENTS);
    knob(&h->max_bytes, "CAIRN_WATCH_RING_BYTES", RING_MAX_BYTES);
    knob(&h->lag_revs, "CAIRN_WATCH_LAG_REVS", 1ull << 40);
    knob(&h->lag_bytes, "CAIRN_WATCH_LAG_BYTES", 1ull << 40);
    h->cap = h->max_events + 1;
    h->ring = calloc(h->cap, sizeof *h->ring);
    if (!h->ring) {
        free(h);
        return CAIRN_ENOMEM;
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    srv->watch = h;
    if (pthread_create(&h->pump, NULL, pump_main, srv) != 0)
        return CAIRN_ENOMEM;
    h->pump_running = 1;
    return 0;
}

void watch_hub_ready(cairn_server *srv)
{
    struct watch_hub *h = srv->watch;
    cairn_header hd;
    cairn_store_header(srv->store, &hd);
    pthread_mutex_lock(&h->mu);
    if (h->n == 0) {
        h->last_rev = hd.revision;
        /* etcd: a fresh store is at revision 1, which holds no event, so
         * everything can be replayed; otherwise history starts here. */
        h->floor = hd.revision <= 1 ? 0 : hd.revision + 1;
    }
    pthread_mutex_unlock(&h->mu);
}

void watch_hub_cancel_all(void *arg)
{
    cairn_server *srv = arg;
    struct watch_hub *h = srv->watch;
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    for (wstream *ws = h->streams; ws; ws = ws->next)
        if (!ws->finished) {
            ws->closing = 1;
            grpc_call_cancel(ws->c->call, NULL);
        }
    pthread_mutex_unlock(&h->mu);
}

void watch_hub_free(cairn_server *srv)
{
    struct watch_hub *h = srv->watch;
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (h->pump_running)
        pthread_join(h->pump, NULL);
    while (h->n > 0)
        ring_drop_oldest(h);
    free(h->ring);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
    srv->watch = NULL;
}

static const rpc_method watch_methods[] = {
    {"/etcdserverpb.Watch/Watch", RPC_BIDI, watch_stream, 2},
};

const rpc_service etcd_watch_service = {"etcdserverpb.Watch", watch_methods, 1,
                                        watch_hub_cancel_all};
