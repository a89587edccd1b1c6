/*
 * The watch hub: a ring of recent events, watchers keyed by range, and
 * catch-up from history (see hub.h for the model and the threads).
 *
 * History. The store calls cairn_hub_events_cb on its completer thread, in
 * apply order, for every durable change (DESIGN: no event before it is
 * durable). While any stream has a watcher, the hub copies the events
 * into a ring of recent revisions (bounded in events and bytes; with no
 * watcher it empties the ring and copies nothing); a watcher whose start
 * revision is in the ring catches up from it, then follows the live
 * stream. A start revision
 * older than the ring (before this process started, or evicted) but not
 * below the store's compaction floor catches up from disk instead
 * (cairn_store_history, read outside the hub lock): each disk batch covers
 * exactly the revisions [next_rev, until] (until <= the hub's last
 * revision, capped at what the store's snapshot saw), and next_rev moves
 * to until + 1, so the ring or the live stream goes on from there with no
 * gap and no duplicate.
 *
 * Semantics measured on etcd 3.4 / read in its watchable_store.go: a live
 * watcher gets one batch per revision; a catching-up watcher gets the
 * revisions up to the current one in one batch (at most 1000 revisions)
 * with the current revision in its header; a start below the compaction
 * floor is answered "compacted"; prev_kv is read at mod_revision - 1 (not
 * for creations).
 *
 * Slow watchers. Watchers do not own queues: every watcher pulls from the
 * one shared ring at its next_rev, so a stream that stops pulling holds
 * nothing in the hub but its position. A live watcher that falls more than
 * lag_revs revisions or lag_bytes of ring behind, or whose next revision
 * the ring has evicted, is demoted to catching up with next_rev kept
 * (etcd: victim, then unsynced): it is served batches from the ring or
 * from disk like any catching-up watcher and is live again once caught up.
 * It is cancelled only where etcd cancels it: when next_rev falls below
 * the compaction floor.
 */
#include "store/hub.h"

#include "crdt/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The ring is a cache for watchers a little behind, not the history (that
 * is on disk): 16,384 events is about half a second of peak puts and about
 * 2 MiB at 18-byte keys and 32-byte values. */
#define RING_MAX_EVENTS 16384
#define RING_MAX_BYTES (16u << 20)
#define LIVE_MAX_LAG_REVS 128
#define LIVE_MAX_LAG_BYTES (4u << 20)
/* etcd: a catch-up response holds up to 1000 revisions whatever its size
 * (measured: 60 values of 1.4 MB replayed in one response of 84 MB).
 * cairn ends one at the first revision boundary past 4 MiB instead, so
 * that what one stream holds stays bounded (a stalled stream holds one
 * batch: tests/integration/test_watch_slow.py). Below that the answers are
 * etcd's (watch.fragment.catchup_*), above it they differ (ledgered:
 * watch.start.catchup_past_cairn_bound). */
#define CATCHUP_MAX_BYTES (4u << 20)
#define SYNC_DELAY_MS 20

/* One event in the ring or in a batch, owning its bytes. */
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
    int started;            /* cairn_hub_start called: may be served */
    uint64_t serial;        /* unique in the hub: found again after a disk read */
    int64_t next_rev;       /* first revision not yet delivered */
    int synced;             /* caught up: one batch per revision */
    uint64_t not_before_ms; /* catching up: not served before this */
} watcher;

struct cairn_hub_stream {
    cairn_hub_stream *next; /* hub list */
    cairn_hub *hub;
    cairn_hub_notify_cb cb;
    void *arg;
    watcher *watchers;
    int64_t next_auto_id;
    int dirty;     /* the hub's thread should notify */
    int notifying; /* the hub's thread is in cb */
    int dead;      /* freed from inside its own cb: the thread frees it */
};

struct cairn_hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* wakes the hub's thread */
    pthread_cond_t idle_cv; /* a notify callback returned */
    cairn_store *store;
    ring_ev *ring; /* circular */
    size_t cap, head, n;
    size_t bytes;
    uint64_t added;   /* bytes ever put into the ring (ring_ev.cum) */
    int64_t last_rev; /* newest revision the hub knows (the store's) */
    int64_t floor;    /* revisions below this cannot be replayed */
    cairn_hub_options o;
    cairn_hub_stream *streams;
    int wait_catchup; /* a watcher waits for its catch-up time */
    uint64_t next_serial;
    int stop;
    pthread_t thread;
    int thread_running;
};

static uint64_t mono_ms(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t now_ms(const cairn_hub *h)
{
    return h->o.clock_ms(h->o.clock_arg);
}

/* ---- the ring ------------------------------------------------------------ */

static ring_ev *ring_at(cairn_hub *h, size_t i)
{
    return &h->ring[(h->head + i) % h->cap];
}

static void ring_drop_oldest(cairn_hub *h)
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

/* Index of the first ring event with rev >= |rev|. Hub locked. */
static size_t ring_find(cairn_hub *h, int64_t rev)
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

void cairn_hub_events_cb(void *arg, int64_t rev, const cairn_hash *hash, const uint8_t *change,
                         size_t change_len, const cairn_event *ev, size_t nev)
{
    (void)hash;
    (void)change;
    (void)change_len;
    cairn_hub *h = arg;
    if (!h || rev == 0 || nev == 0)
        return;
    pthread_mutex_lock(&h->mu);
    int wake = 0;
    for (cairn_hub_stream *st = h->streams; st; st = st->next)
        if (st->watchers)
            st->dirty = wake = 1;
    if (!wake) {
        /* No watcher: nobody reads the ring now, and a watcher created
         * later with an older start revision reads the store's history
         * (below the floor) just as after a restart. Copying would cost
         * two mallocs and a copy per event on the completer's path. */
        while (h->n > 0)
            ring_drop_oldest(h);
        h->floor = rev + 1;
        nev = 0;
    }
    for (size_t i = 0; i < nev; i++) {
        const cairn_kv *kv = &ev[i].kv;
        size_t need = kv->key_len + kv->value_len;
        while (h->n > 0 &&
               (h->n + 1 > h->cap || h->n >= h->o.ring_events || h->bytes + need > h->o.ring_bytes))
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
    /* Wake the thread only when a watcher may want these events (|wake|,
     * above): with no watchers it would wake (a context switch per change),
     * find nothing to do and sleep again. */
    if (wake)
        pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
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

/* ---- batches ------------------------------------------------------------- */

/* What a cairn_hub_batch owns (its mem_). */
typedef struct batch_mem {
    ring_ev *ev;
    size_t n, cap;
    size_t bytes;          /* keys and values in ev */
    cairn_range_resp *pr;  /* prev_kv reads, one per event */
    const cairn_kv **prev; /* the batch's prev_kvs */
} batch_mem;

static void mem_clear(batch_mem *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->ev[i].key);
        free(m->ev[i].value);
        if (m->pr)
            cairn_range_resp_destroy(&m->pr[i]);
    }
    free(m->ev);
    free(m->pr);
    free(m->prev);
    memset(m, 0, sizeof *m);
}

static void mem_free(batch_mem *m)
{
    if (!m)
        return;
    mem_clear(m);
    free(m);
}

void cairn_hub_batch_destroy(cairn_hub_batch *b)
{
    if (!b)
        return;
    mem_free(b->mem_);
    free(b->events);
    memset(b, 0, sizeof *b);
}

/* Appends a copy of |src| (its bytes too). */
static int mem_push(batch_mem *m, const ring_ev *src)
{
    if (m->n == m->cap) {
        size_t nc = m->cap ? 2 * m->cap : 8;
        ring_ev *grown = realloc(m->ev, nc * sizeof *grown);
        if (!grown)
            return CAIRN_ENOMEM;
        m->ev = grown;
        m->cap = nc;
    }
    ring_ev *dst = &m->ev[m->n];
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
    m->n++;
    m->bytes += src->key_len + src->value_len;
    return 0;
}

/* Gives the events their public form and reads prev_kv (no lock held). */
static int batch_finish(cairn_hub *h, cairn_hub_batch *b, int prev_kv)
{
    batch_mem *m = b->mem_;
    b->nevents = m->n;
    b->events = calloc(m->n, sizeof *b->events);
    if (!b->events)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < m->n; i++) {
        const ring_ev *e = &m->ev[i];
        cairn_event *o = &b->events[i];
        o->type = e->type;
        o->kv.key = e->key;
        o->kv.key_len = e->key_len;
        o->kv.mod_revision = e->rev;
        if (e->type == CAIRN_EVENT_PUT) {
            o->kv.value = e->value;
            o->kv.value_len = e->value_len;
            o->kv.create_revision = e->create_revision;
            o->kv.version = e->version;
            o->kv.lease = e->lease;
        }
    }
    if (!prev_kv)
        return 0;
    m->pr = calloc(m->n, sizeof *m->pr);
    m->prev = calloc(m->n, sizeof *m->prev);
    if (!m->pr || !m->prev)
        return CAIRN_ENOMEM;
    b->prev_kvs = m->prev;
    for (size_t i = 0; i < m->n; i++) {
        const ring_ev *e = &m->ev[i];
        /* etcd: prev_kv is the key at mod_revision - 1, except for a
         * creation (a PUT with version 1); missing if compacted. */
        if (e->type == CAIRN_EVENT_PUT && e->version == 1)
            continue;
        cairn_range_req r;
        memset(&r, 0, sizeof r);
        r.key = e->key;
        r.key_len = e->key_len;
        r.revision = e->rev - 1;
        if (cairn_store_range(h->store, &m->pr[i], &r) == 0 && m->pr[i].nkvs > 0)
            m->prev[i] = &m->pr[i].kvs[0];
    }
    return 0;
}

/* ---- picking ------------------------------------------------------------- */

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

enum { PICK_NONE, PICK_BATCH, PICK_DISK, PICK_COMPACTED };

/* Picks the next events for |w| into |m| (and b->revision), plans a disk
 * read in |q|, or finds |w| compacted (b->compact_revision). PICK_* or
 * CAIRN_ENOMEM. Hub locked. */
static int pick(cairn_hub *h, watcher *w, batch_mem *m, hist_req *q, cairn_hub_batch *b)
{
    if (!w->started || w->next_rev > h->last_rev)
        return PICK_NONE;
    int live = w->synced;
    if (live) {
        /* A live watcher whose revisions the ring evicted, or that lags
         * beyond the bound (its stream does not take batches as fast as
         * they come), catches up instead: from disk or from the ring, in
         * batches, from next_rev on, so nothing is skipped or repeated. */
        size_t at = ring_find(h, w->next_rev);
        uint64_t lag = at < h->n ? h->added - ring_at(h, at)->cum : 0;
        if ((h->floor > 0 && w->next_rev < h->floor) ||
            (uint64_t)(h->last_rev - w->next_rev) >= h->o.lag_revs || lag > h->o.lag_bytes) {
            w->synced = 0;
            w->not_before_ms = 0;
            live = 0;
        }
    }
    if (!live && now_ms(h) < w->not_before_ms) {
        h->wait_catchup = 1; /* the hub's thread comes back */
        return PICK_NONE;
    }
    if (!live) {
        /* etcd: a start below the compact revision (-1 while never
         * compacted) is answered with it. */
        int64_t compacted = cairn_store_compacted_rev(h->store);
        int64_t eff = compacted > 0 ? compacted : -1;
        if (w->next_rev < eff) {
            b->compact_revision = eff;
            return PICK_COMPACTED;
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
                return CAIRN_ENOMEM;
            }
            memcpy(q->w.key, w->key, w->key_len);
            if (w->end)
                memcpy(q->w.end, w->end, w->end_len);
            q->from = w->next_rev;
            int64_t until = w->next_rev + CAIRN_HUB_CATCHUP_MAX_REVS - 1;
            if (until > h->last_rev)
                until = h->last_rev;
            q->until = until;
            return PICK_DISK;
        }
    }
    size_t i = ring_find(h, w->next_rev);
    int64_t until = live ? INT64_MAX : w->next_rev + CAIRN_HUB_CATCHUP_MAX_REVS - 1;
    size_t bytes = 0;
    for (; i < h->n; i++) {
        const ring_ev *e = ring_at(h, i);
        if (live && m->n > 0 && e->rev != m->ev[0].rev)
            break; /* live: one revision per batch */
        if (e->rev > until)
            break;
        if (bytes >= h->o.catchup_bytes && e->rev != m->ev[m->n - 1].rev) {
            until = e->rev - 1; /* catching up: the batch is full */
            break;
        }
        if (!matches(w, e))
            continue;
        if (mem_push(m, e) != 0)
            return CAIRN_ENOMEM;
        bytes += e->key_len + e->value_len;
    }
    int64_t done;
    if (live) {
        done = m->n ? m->ev[0].rev : h->last_rev;
    } else {
        done = until < h->last_rev ? until : h->last_rev;
        if (done >= h->last_rev)
            w->synced = 1;
    }
    w->next_rev = done + 1;
    /* etcd: a live response carries its revision; a catch-up batch the
     * revision the store was at. */
    b->revision = live && m->n ? m->ev[0].rev : h->last_rev;
    return m->n > 0 ? PICK_BATCH : PICK_NONE;
}

/* ---- catching up from disk ---------------------------------------------- */

typedef struct hist_ctx {
    hist_req *q;
    batch_mem *m;
    size_t limit;
    int full; /* saw a revision past q->until: [from, until] all read */
} hist_ctx;

#define HIST_STOP 1 /* not a cairn error code: the scan went past until */

static int hist_cb(void *arg, int64_t rev, const cairn_event *ev, size_t nev)
{
    hist_ctx *x = arg;
    if (rev > x->q->until || x->m->bytes >= x->limit) {
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
        if (mem_push(x->m, &e) != 0)
            return CAIRN_ENOMEM;
    }
    return 0;
}

/* Reads the revisions [q->from, q->until] of q's range into |m| (no lock
 * held). Returns 0 and sets *done to the last revision covered (less than
 * q->until if the store's visible revision lags the hub's), or an error
 * (CAIRN_ECOMPACTED: compacted meanwhile). */
static int hist_read(cairn_hub *h, hist_req *q, batch_mem *m, int64_t *done)
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
    hist_ctx x = {q, m, h->o.catchup_bytes, 0};
    int64_t last = 0;
    int rc = cairn_store_history(h->store, &last, q->from, q->w.key, q->w.key_len, end, end_len,
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

/* ---- streams ------------------------------------------------------------- */

static void watcher_free(watcher *w)
{
    free(w->key);
    free(w->end);
    free(w);
}

static void remove_watcher(cairn_hub_stream *st, watcher *w)
{
    for (watcher **p = &st->watchers; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    watcher_free(w);
}

static void stream_destroy(cairn_hub_stream *st)
{
    while (st->watchers)
        remove_watcher(st, st->watchers);
    free(st);
}

int cairn_hub_stream_new(cairn_hub_stream **out, cairn_hub *h, cairn_hub_notify_cb cb, void *arg)
{
    *out = NULL;
    cairn_hub_stream *st = calloc(1, sizeof *st);
    if (!st)
        return CAIRN_ENOMEM;
    st->hub = h;
    st->cb = cb;
    st->arg = arg;
    pthread_mutex_lock(&h->mu);
    st->next = h->streams;
    h->streams = st;
    pthread_mutex_unlock(&h->mu);
    *out = st;
    return 0;
}

void cairn_hub_stream_free(cairn_hub_stream *st)
{
    if (!st)
        return;
    cairn_hub *h = st->hub;
    pthread_mutex_lock(&h->mu);
    for (cairn_hub_stream **p = &h->streams; *p; p = &(*p)->next)
        if (*p == st) {
            *p = st->next;
            break;
        }
    if (st->notifying && h->thread_running && pthread_equal(pthread_self(), h->thread)) {
        st->dead = 1; /* called from its own notify: the thread frees it */
        pthread_mutex_unlock(&h->mu);
        return;
    }
    while (st->notifying)
        pthread_cond_wait(&h->idle_cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    stream_destroy(st);
}

int cairn_hub_watch(cairn_hub_stream *st, int64_t *id, int64_t *rev, const cairn_hub_watch_req *r)
{
    cairn_hub *h = st->hub;
    static const uint8_t zero = 0;
    const uint8_t *key = r->key;
    size_t key_len = r->key_len;
    if (key_len == 0) { /* etcd: an empty key is "\0", the smallest key */
        key = &zero;
        key_len = 1;
    }
    int single = r->range_end_len == 0;
    int fromkey = r->range_end_len == 1 && r->range_end[0] == 0;
    *id = -1;
    pthread_mutex_lock(&h->mu);
    int64_t cur = h->last_rev;
    *rev = cur;
    int rc = 0;
    /* etcd: key >= range_end is an empty range. */
    if (!single && !fromkey && cmp_bytes(key, key_len, r->range_end, r->range_end_len) >= 0) {
        rc = CAIRN_EWATCHEMPTYRANGE;
        goto out;
    }
    int64_t wid = r->watch_id;
    if (wid == 0) { /* etcd: the next free id of this stream */
        for (;;) {
            int taken = 0;
            for (watcher *w = st->watchers; w; w = w->next)
                taken |= w->id == st->next_auto_id;
            if (!taken)
                break;
            st->next_auto_id++;
        }
        wid = st->next_auto_id++;
    } else {
        for (watcher *w = st->watchers; w; w = w->next)
            if (w->id == wid) {
                rc = CAIRN_EWATCHDUPID;
                goto out;
            }
    }
    watcher *w = calloc(1, sizeof *w);
    if (w) {
        w->key = malloc(key_len);
        w->end = single ? NULL : malloc(r->range_end_len);
    }
    if (!w || !w->key || (!single && !w->end)) {
        if (w)
            watcher_free(w);
        rc = CAIRN_ENOMEM;
        goto out;
    }
    memcpy(w->key, key, key_len);
    w->key_len = key_len;
    if (!single)
        memcpy(w->end, r->range_end, r->range_end_len);
    w->end_len = fromkey ? 0 : r->range_end_len;
    w->id = wid;
    w->serial = ++h->next_serial;
    w->noput = r->noput;
    w->nodelete = r->nodelete;
    w->prev_kv = r->prev_kv;
    w->fragment = r->fragment;
    /* etcd: start 0 or in the future is live from there; else catch up. */
    int64_t start = r->start_revision == 0 ? cur + 1 : r->start_revision;
    w->next_rev = start;
    w->synced = start > cur;
    w->not_before_ms = now_ms(h) + h->o.sync_delay_ms;
    watcher **tail = &st->watchers;
    while (*tail)
        tail = &(*tail)->next;
    *tail = w;
    *id = wid;
    if (!w->synced) {
        /* Its catch-up delay runs from now, as etcd's sync loop runs
         * beside the stream whatever the created answer does. */
        h->wait_catchup = 1;
        pthread_cond_signal(&h->cv);
    }
out:
    pthread_mutex_unlock(&h->mu);
    return rc;
}

void cairn_hub_start(cairn_hub_stream *st, int64_t id)
{
    cairn_hub *h = st->hub;
    pthread_mutex_lock(&h->mu);
    for (watcher *w = st->watchers; w; w = w->next)
        if (w->id == id && !w->started) {
            w->started = 1;
            /* A watcher catching up whose delay is over is due now (the
             * hub's thread skipped it while it was not started); before
             * that, the wake-up planned at its creation serves it. A live
             * one has nothing before the next event. */
            if (!w->synced && now_ms(h) >= w->not_before_ms) {
                st->dirty = 1;
                pthread_cond_signal(&h->cv);
            }
            break;
        }
    pthread_mutex_unlock(&h->mu);
}

int cairn_hub_cancel(cairn_hub_stream *st, int64_t *rev, int64_t id)
{
    cairn_hub *h = st->hub;
    pthread_mutex_lock(&h->mu);
    *rev = h->last_rev;
    int rc = CAIRN_ENOTFOUND;
    for (watcher *w = st->watchers; w; w = w->next)
        if (w->id == id) {
            remove_watcher(st, w);
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

int cairn_hub_next(cairn_hub_stream *st, cairn_hub_batch *b)
{
    cairn_hub *h = st->hub;
    memset(b, 0, sizeof *b);
    batch_mem m; /* on the heap only once there is a batch */
    memset(&m, 0, sizeof m);
    hist_req q;
    memset(&q, 0, sizeof q);
    int rc = CAIRN_HUB_NONE, prev_kv = 0, disk = 0;
    pthread_mutex_lock(&h->mu);
    for (watcher *w = st->watchers; w; w = w->next) {
        int p = pick(h, w, &m, &q, b);
        if (p == PICK_NONE)
            continue;
        b->watch_id = w->id;
        b->fragment = w->fragment;
        prev_kv = w->prev_kv;
        if (p < 0) {
            rc = p;
        } else if (p == PICK_COMPACTED) {
            remove_watcher(st, w);
            rc = CAIRN_HUB_BATCH;
        } else if (p == PICK_BATCH) {
            rc = CAIRN_HUB_BATCH;
        } else {
            disk = 1;
        }
        break;
    }
    pthread_mutex_unlock(&h->mu);
    if (disk) {
        /* The disk read runs unlocked; the watcher is found again by
         * serial (a cancel may have removed it meanwhile). */
        int64_t done = 0;
        int hrc = hist_read(h, &q, &m, &done);
        rc = CAIRN_HUB_AGAIN;
        pthread_mutex_lock(&h->mu);
        watcher *w = st->watchers;
        while (w && w->serial != q.w.serial)
            w = w->next;
        if (w && w->next_rev == q.from) {
            if (hrc == CAIRN_ECOMPACTED) {
                b->compact_revision = cairn_store_compacted_rev(h->store);
                remove_watcher(st, w);
                rc = CAIRN_HUB_BATCH;
            } else if (hrc) {
                rc = hrc; /* cannot keep the promise: the stream ends */
            } else if (done >= q.from) {
                w->next_rev = done + 1;
                if (done >= h->last_rev)
                    w->synced = 1;
                if (m.n > 0) {
                    rc = CAIRN_HUB_BATCH;
                    b->revision = h->last_rev;
                }
            } else {
                /* The store's snapshot lagged the hub: try again later. */
                w->not_before_ms = now_ms(h) + h->o.sync_delay_ms;
                h->wait_catchup = 1;
                pthread_cond_signal(&h->cv);
            }
        }
        pthread_mutex_unlock(&h->mu);
        hist_req_free(&q);
    }
    if (rc == CAIRN_HUB_BATCH && b->compact_revision) {
        /* etcd: a compacted answer has no events and header revision 0. */
        mem_clear(&m);
        b->revision = 0;
        return rc;
    }
    if (rc == CAIRN_HUB_BATCH) {
        batch_mem *hm = malloc(sizeof *hm);
        if (hm) {
            *hm = m;
            b->mem_ = hm;
            rc = batch_finish(h, b, prev_kv);
            if (rc == 0)
                return CAIRN_HUB_BATCH;
        } else {
            mem_clear(&m);
            rc = CAIRN_ENOMEM;
        }
        cairn_hub_batch_destroy(b);
        return rc;
    }
    mem_clear(&m);
    memset(b, 0, sizeof *b);
    return rc;
}

/* ---- the hub ------------------------------------------------------------- */

/* The hub's thread: calls the notify callback of every marked stream, and
 * marks the streams with a watcher catching up once its delay is over. */
static void *hub_main(void *arg)
{
    cairn_hub *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        cairn_hub_stream *todo = NULL;
        for (cairn_hub_stream *st = h->streams; st; st = st->next)
            if (st->dirty && !st->notifying) {
                todo = st;
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
            uint64_t delay = h->o.sync_delay_ms ? h->o.sync_delay_ms : 1;
            until.tv_sec += (time_t)(delay / 1000);
            until.tv_nsec += (long)(delay % 1000) * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&h->cv, &h->mu, &until);
            for (cairn_hub_stream *st = h->streams; st; st = st->next)
                for (watcher *w = st->watchers; w; w = w->next)
                    if (!w->synced && w->started)
                        st->dirty = 1;
            continue;
        }
        todo->dirty = 0;
        todo->notifying = 1;
        pthread_mutex_unlock(&h->mu);
        todo->cb(todo->arg);
        pthread_mutex_lock(&h->mu);
        todo->notifying = 0;
        pthread_cond_broadcast(&h->idle_cv);
        if (todo->dead) {
            pthread_mutex_unlock(&h->mu);
            stream_destroy(todo);
            pthread_mutex_lock(&h->mu);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

void cairn_hub_options_init(cairn_hub_options *o)
{
    memset(o, 0, sizeof *o);
    o->ring_events = RING_MAX_EVENTS;
    o->ring_bytes = RING_MAX_BYTES;
    o->lag_revs = LIVE_MAX_LAG_REVS;
    o->lag_bytes = LIVE_MAX_LAG_BYTES;
    o->catchup_bytes = CATCHUP_MAX_BYTES;
    o->sync_delay_ms = SYNC_DELAY_MS;
}

int cairn_hub_new(cairn_hub **out, const cairn_hub_options *o)
{
    *out = NULL;
    cairn_hub *h = calloc(1, sizeof *h);
    if (!h)
        return CAIRN_ENOMEM;
    if (o)
        h->o = *o;
    else
        cairn_hub_options_init(&h->o);
    if (h->o.ring_events == 0)
        h->o.ring_events = 1;
    if (!h->o.clock_ms)
        h->o.clock_ms = mono_ms;
    h->cap = h->o.ring_events + 1;
    h->ring = calloc(h->cap, sizeof *h->ring);
    if (!h->ring) {
        free(h);
        return CAIRN_ENOMEM;
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    pthread_cond_init(&h->idle_cv, NULL);
    if (pthread_create(&h->thread, NULL, hub_main, h) != 0) {
        cairn_hub_free(h);
        return CAIRN_ENOMEM;
    }
    h->thread_running = 1;
    *out = h;
    return 0;
}

void cairn_hub_attach(cairn_hub *h, cairn_store *s)
{
    cairn_header hd;
    cairn_store_header(s, &hd);
    pthread_mutex_lock(&h->mu);
    h->store = s;
    if (h->n == 0) {
        h->last_rev = hd.revision;
        /* etcd: a fresh store is at revision 1, which holds no event, so
         * everything can be replayed; otherwise history starts here. */
        h->floor = hd.revision <= 1 ? 0 : hd.revision + 1;
    }
    pthread_mutex_unlock(&h->mu);
}

int64_t cairn_hub_revision(cairn_hub *h)
{
    pthread_mutex_lock(&h->mu);
    int64_t rev = h->last_rev;
    pthread_mutex_unlock(&h->mu);
    return rev;
}

void cairn_hub_free(cairn_hub *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (h->thread_running)
        pthread_join(h->thread, NULL);
    while (h->streams) { /* the owner should have freed them */
        cairn_hub_stream *st = h->streams;
        h->streams = st->next;
        stream_destroy(st);
    }
    while (h->n > 0)
        ring_drop_oldest(h);
    free(h->ring);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    pthread_cond_destroy(&h->idle_cv);
    free(h);
}
