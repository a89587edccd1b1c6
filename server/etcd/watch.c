/*
 * etcd's Watch service: one bidirectional stream per client call, served
 * from the store's watch hub (store/hub.h: the ring of recent events,
 * range matching, catch-up from history). This file turns the hub's
 * batches into WatchResponse messages and runs the streams.
 *
 * Semantics measured on etcd 3.4 / read in its watch.go: a created
 * response first (header at the current revision, watch ids auto-assigned
 * per stream from 0, a duplicate explicit id or an empty range is
 * "created" and "canceled" with id -1 and the mvcc error as
 * cancel_reason); events as the hub batches them; a start below the
 * compaction floor gets a response with compact_revision, canceled, and
 * header revision 0; a cancel of an unknown id answers nothing; a
 * progress request answers watch_id -1 at the current revision; a request
 * without a union member is ignored. A watcher that asked for fragments
 * gets a response of max-request-bytes + 512 KiB or more cut into several
 * (etcd's sendFragments); any other response goes out whole.
 *
 * Threads. Every stream has two tags: one receive and at most one send in
 * flight. A stream's next message is chosen in order: control responses
 * first (created, canceled, progress, compacted, the rest of a fragmented
 * response), then the hub's next batch (cairn_hub_next, called with no
 * lock held: it may read the disk). A watcher is served by the hub only
 * once its created response has been taken off the control queue, so no
 * event overtakes it. Work comes from workers (after a receive or a send)
 * and from the hub's thread, which calls watch_notify when a stream may
 * have events — the store's events callback itself never sends or reads.
 * One lock (struct watch_hub.mu) guards every stream's state; the hub's
 * own lock is taken after it, never before.
 *
 * Slow streams. A stream holds at most one message in flight (gRPC
 * completes it once HTTP/2 flow control lets it out) and at most CTL_MAX
 * queued control responses, after which its requests are not read until
 * the queue drains (back-pressure to the client, as etcd's full ctrlStream
 * channel blocks its receive loop). The hub keeps no queue per watcher, so
 * neither writers nor other streams wait for it.
 *
 * Tests may shrink the hub's ring with the environment variables
 * CAIRN_WATCH_RING_EVENTS and CAIRN_WATCH_RING_BYTES (values above the
 * defaults are ignored), and set its live lag bounds with
 * CAIRN_WATCH_LAG_REVS and _LAG_BYTES.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"
#include "store/hub.h"

#include <stdlib.h>
#include <string.h>

/* Control responses queued on a stream before it stops reading requests
 * (etcd: ctrlStreamBufLen; its receive loop blocks on the full channel). */
#define CTL_MAX 16

/* etcd: a fragmenting watcher's limit is --max-request-bytes plus
 * grpcOverheadBytes (512 KiB): measured, a response of exactly 624,288
 * bytes at --max-request-bytes=100000 is cut, one of 624,286 is not
 * (watch.fragment.* in the conformance checks). */
#define FRAGMENT_OVERHEAD_BYTES (512u * 1024u)

typedef struct ctl_msg {
    struct ctl_msg *next;
    grpc_byte_buffer *bb;
    int starts;       /* a created answer: the hub serves the watcher once */
    int64_t start_id; /* it leaves the queue */
} ctl_msg;

typedef struct wstream {
    struct wstream *next; /* list of the server's streams */
    rpc_call *c;
    cairn_hub_stream *hs;
    rpc_side recv_tag, send_tag;
    ctl_msg *ctl_head, **ctl_tail;
    size_t nctl;     /* messages on ctl_head */
    int recv_paused; /* nctl reached CTL_MAX: no receive posted */
    grpc_byte_buffer *sending_bb;
    int sending; /* a message in flight, or pump() asking the hub */
    int kick;    /* pump() was called while sending: look again */
    int recv_pending;
    int closing; /* no more sends; finish once idle */
    int finished;
    int refs; /* threads between the lock and pump(): no finish */
    int sent_md;
} wstream;

struct watch_hub {
    pthread_mutex_t mu;
    cairn_hub *hub;
    wstream *streams;
    int stop;
};

/* ---- building responses -------------------------------------------------- */

static void header_at(cairn_server *srv, Etcdserverpb__ResponseHeader *ph, int64_t rev)
{
    cairn_header h;
    cairn_store_header(srv->store, &h);
    h.revision = rev;
    etcd_header(srv, ph, &h);
}

/* Queues a control response (created, canceled, progress); a created one
 * with |starts| starts watcher |id| when it leaves. Stream lock held. */
static void queue_ctl(cairn_server *srv, wstream *ws, int64_t id, int created, int canceled,
                      const char *reason, int64_t header_rev, int64_t compact_rev, int starts)
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
    m->starts = starts;
    m->start_id = id;
    *ws->ctl_tail = m;
    ws->ctl_tail = &m->next;
    ws->nctl++;
}

/* Packs |b| into one response, or, for a watcher that asked for fragments
 * and a response of at least the fragment limit, into several (etcd's
 * sendFragments: as many events as fit, at least one, "fragment" set on
 * all but the last). No lock held. Returns the number of buffers in out[]
 * (0: out of memory). */
static size_t pack_batch(cairn_server *srv, const cairn_hub_batch *b, grpc_byte_buffer ***out)
{
    size_t n = b->nevents, nout = 0;
    *out = NULL;
    Mvccpb__Event *evs = calloc(n, sizeof *evs);
    Mvccpb__Event **ptrs = calloc(n, sizeof *ptrs);
    Mvccpb__KeyValue *kvs = calloc(n, sizeof *kvs);
    Mvccpb__KeyValue *prev = calloc(n, sizeof *prev);
    grpc_byte_buffer **bbs = calloc(n + 1, sizeof *bbs);
    if (!evs || !ptrs || !kvs || !prev || !bbs)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const cairn_event *e = &b->events[i];
        mvccpb__event__init(&evs[i]);
        evs[i].type = e->type == CAIRN_EVENT_DELETE ? MVCCPB__EVENT__EVENT_TYPE__DELETE
                                                    : MVCCPB__EVENT__EVENT_TYPE__PUT;
        kv_to_pb(&kvs[i], &e->kv);
        evs[i].kv = &kvs[i];
        if (b->prev_kvs && b->prev_kvs[i]) {
            kv_to_pb(&prev[i], b->prev_kvs[i]);
            evs[i].prev_kv = &prev[i];
        }
        ptrs[i] = &evs[i];
    }
    Etcdserverpb__ResponseHeader ph;
    header_at(srv, &ph, b->revision);
    Etcdserverpb__WatchResponse resp;
    etcdserverpb__watch_response__init(&resp);
    resp.header = &ph;
    resp.watch_id = b->watch_id;
    resp.events = ptrs;
    resp.n_events = n;
    uint64_t limit = srv->cfg->max_request_bytes + FRAGMENT_OVERHEAD_BYTES;
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

/* ---- the stream ---------------------------------------------------------- */

static void pump(cairn_server *srv, wstream *ws);

static void stream_cleanup(rpc_call *c)
{
    wstream *ws = c->ctx;
    if (!ws)
        return;
    /* After this no notify for |ws| runs (hub.h). */
    cairn_hub_stream_free(ws->hs);
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

/* Ends the call once nothing is in flight. Stream lock held; returns 1 if
 * the caller must call rpc_reply (outside the lock). */
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
 * queue is below CTL_MAX again. Stream lock held. */
static grpc_byte_buffer *ctl_pop(wstream *ws)
{
    ctl_msg *m = ws->ctl_head;
    ws->ctl_head = m->next;
    if (!ws->ctl_head)
        ws->ctl_tail = &ws->ctl_head;
    ws->nctl--;
    grpc_byte_buffer *bb = m->bb;
    if (m->starts)
        cairn_hub_start(ws->hs, m->start_id);
    free(m);
    if (ws->recv_paused && ws->nctl < CTL_MAX && !ws->closing) {
        ws->recv_paused = 0;
        post_recv(ws);
    }
    return bb;
}

/* Puts the fragments after the first at the head of the control queue:
 * they go out before anything else. Stream lock held. */
static void queue_fragments(wstream *ws, grpc_byte_buffer **frags, size_t nfrags)
{
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
}

/* Sends the stream's next message if it is idle; finishes it if closing. */
static void pump(cairn_server *srv, wstream *ws)
{
    struct watch_hub *wh = srv->watch;
again:
    pthread_mutex_lock(&wh->mu);
    if (ws->sending || ws->finished) {
        ws->kick = 1;
        pthread_mutex_unlock(&wh->mu);
        return;
    }
    ws->kick = 0;
    grpc_byte_buffer *bb = NULL;
    if (!ws->closing && ws->ctl_head) {
        bb = ctl_pop(ws);
    } else if (!ws->closing) {
        /* The hub may read the disk: no lock held; ws->sending keeps every
         * other pump of this stream out (hub.h: one cairn_hub_next at a
         * time). */
        ws->sending = 1;
        pthread_mutex_unlock(&wh->mu);
        cairn_hub_batch b;
        int rc = cairn_hub_next(ws->hs, &b);
        grpc_byte_buffer **frags = NULL;
        size_t nfrags = 0;
        if (rc == CAIRN_HUB_BATCH && b.compact_revision == 0)
            nfrags = pack_batch(srv, &b, &frags);
        pthread_mutex_lock(&wh->mu);
        ws->sending = 0;
        if (ws->closing) {
            for (size_t i = 0; i < nfrags; i++) /* no more sends */
                grpc_byte_buffer_destroy(frags[i]);
            nfrags = 0;
        } else if (rc < 0) {
            ws->closing = 1; /* cannot keep the protocol: end the stream */
        } else if (rc == CAIRN_HUB_AGAIN || (rc == CAIRN_HUB_NONE && ws->kick)) {
            pthread_mutex_unlock(&wh->mu);
            goto again;
        } else if (rc == CAIRN_HUB_BATCH && b.compact_revision) {
            /* etcd: compacted answers carry header revision 0. */
            queue_ctl(srv, ws, b.watch_id, 0, 1, NULL, 0, b.compact_revision, 0);
            cairn_hub_batch_destroy(&b);
            pthread_mutex_unlock(&wh->mu);
            goto again;
        } else if (rc == CAIRN_HUB_BATCH) {
            if (nfrags == 0)
                ws->closing = 1;
            else
                bb = frags[0];
            queue_fragments(ws, frags, nfrags);
        }
        free(frags);
        cairn_hub_batch_destroy(&b);
    }
    if (!bb) {
        int fin = maybe_finish(srv, ws);
        pthread_mutex_unlock(&wh->mu);
        if (fin)
            rpc_reply(ws->c, NULL);
        return;
    }
    ws->sending = 1;
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
    rpc_count_sent(ws->c, grpc_byte_buffer_length(bb));
    if (rpc_side_batch(ws->c, ops, n, &ws->send_tag) != 0) {
        ws->sending = 0;
        ws->closing = 1;
        int fin = maybe_finish(srv, ws);
        pthread_mutex_unlock(&wh->mu);
        if (fin)
            rpc_reply(ws->c, NULL);
        return;
    }
    pthread_mutex_unlock(&wh->mu);
}

/* pump() for a caller that took a reference under the stream lock: drops
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

/* The hub's notify callback (on the hub's thread): the stream may have
 * events. |ws| stays valid while this runs (cairn_hub_stream_free). */
static void watch_notify(void *arg)
{
    wstream *ws = arg;
    cairn_server *srv = etcd_node(ws->c);
    pthread_mutex_lock(&srv->watch->mu);
    if (ws->finished) {
        pthread_mutex_unlock(&srv->watch->mu);
        return;
    }
    ws->refs++;
    pthread_mutex_unlock(&srv->watch->mu);
    pump_release(srv, ws);
}

static void handle_create(cairn_server *srv, wstream *ws, const Etcdserverpb__WatchCreateRequest *r)
{
    cairn_hub_watch_req q;
    memset(&q, 0, sizeof q);
    q.watch_id = r->watch_id;
    q.key = r->key.data;
    q.key_len = r->key.len;
    q.range_end = r->range_end.data;
    q.range_end_len = r->range_end.len;
    q.start_revision = r->start_revision;
    for (size_t i = 0; i < r->n_filters; i++) {
        if (r->filters[i] == ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NOPUT)
            q.noput = 1;
        else if (r->filters[i] == ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NODELETE)
            q.nodelete = 1;
    }
    q.prev_kv = r->prev_kv;
    q.fragment = r->fragment;
    int64_t id = -1, rev = 0;
    int rc = cairn_hub_watch(ws->hs, &id, &rev, &q);
    if (rc == CAIRN_EWATCHEMPTYRANGE || rc == CAIRN_EWATCHDUPID)
        queue_ctl(srv, ws, -1, 1, 1, cairn_strerror(rc), rev, 0, 0);
    else if (rc)
        ws->closing = 1;
    else
        queue_ctl(srv, ws, id, 1, 0, NULL, rev, 0, 1);
}

static void on_recv(void *arg, int ok);

/* The client ended the call (cancel, deadline, broken connection). Stream
 * lock held. etcd: such a stream is counted in grpc_server_handled_total
 * with code Canceled (its handler returns "etcdserver: watch canceled"),
 * whether it was reading or half-closed, and for a client's deadline too;
 * measured on etcd 3.4.23 with etcdctl watch and SIGINT, a client cancel
 * and a deadline. */
static void ended_by_client(wstream *ws)
{
    if (!ws->c->end_rc)
        rpc_fail_on_end(ws->c, CAIRN_EWATCHCANCELED, NULL);
    ws->closing = 1;
}

/* rpc_notify_close's callback: the call is over (on a worker). */
static void on_closed(rpc_call *c)
{
    wstream *ws = c->ctx;
    cairn_server *srv = etcd_node(c);
    pthread_mutex_lock(&srv->watch->mu);
    if (ws->finished || !c->cancelled) { /* our status went out */
        pthread_mutex_unlock(&srv->watch->mu);
        return;
    }
    ended_by_client(ws);
    ws->refs++;
    pthread_mutex_unlock(&srv->watch->mu);
    pump_release(srv, ws);
}

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
    int half = ok && !c->payload; /* the client closed its side */
    int closed = !ok || half;
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
    if (!ok) {
        /* the call died: the client cancelled it, its deadline passed or
         * its connection broke */
        ended_by_client(ws);
    } else if (half) {
        /* etcd: a client's half-close does not end the stream (the
         * gateway closes its side and reads on): events go on until the
         * client cancels, which rpc_notify_close reports. No more
         * receives. Measured on etcd 3.4.23. */
    } else if (closed) {
        ws->closing = 1;
    } else {
        switch (req->request_union_case) {
        case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST:
            handle_create(srv, ws, req->create_request);
            break;
        case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CANCEL_REQUEST: {
            int64_t id = req->cancel_request->watch_id, rev = 0;
            if (cairn_hub_cancel(ws->hs, &rev, id) == 0)
                queue_ctl(srv, ws, id, 0, 1, NULL, rev, 0, 0);
            break;
        }
        case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_PROGRESS_REQUEST:
            queue_ctl(srv, ws, -1, 0, 0, NULL, cairn_hub_revision(h->hub), 0, 0);
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
    if (cairn_hub_stream_new(&ws->hs, h->hub, watch_notify, ws) != 0) {
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    pthread_mutex_lock(&h->mu);
    if (h->stop) {
        pthread_mutex_unlock(&h->mu);
        rpc_fail(c, CAIRN_ESTOPPED, NULL);
        return;
    }
    ws->next = h->streams;
    h->streams = ws;
    if (rpc_notify_close(c, on_closed, GRPC_STATUS_CANCELLED) != 0)
        ws->closing = 1;
    post_recv(ws);
    int fail = ws->closing;
    if (fail)
        ws->refs++;
    pthread_mutex_unlock(&h->mu);
    if (fail)
        pump_release(srv, ws);
}

/* ---- the server's side of the hub --------------------------------------- */

struct cairn_hub *watch_hub_of(cairn_server *srv)
{
    return srv->watch->hub;
}

cairn_store_subscriber watch_hub_subscriber(cairn_server *srv)
{
    cairn_store_subscriber sub = {cairn_hub_events_cb, srv->watch->hub};
    return sub;
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
    cairn_hub_options o;
    cairn_hub_options_init(&o);
    knob(&o.ring_events, "CAIRN_WATCH_RING_EVENTS", o.ring_events);
    knob(&o.ring_bytes, "CAIRN_WATCH_RING_BYTES", o.ring_bytes);
    knob(&o.lag_revs, "CAIRN_WATCH_LAG_REVS", 1ull << 40);
    knob(&o.lag_bytes, "CAIRN_WATCH_LAG_BYTES", 1ull << 40);
    int rc = cairn_hub_new(&h->hub, &o);
    if (rc) {
        free(h);
        return rc;
    }
    pthread_mutex_init(&h->mu, NULL);
    srv->watch = h;
    return 0;
}

void watch_hub_ready(cairn_server *srv)
{
    cairn_hub_attach(srv->watch->hub, srv->store);
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
    pthread_mutex_unlock(&h->mu);
    cairn_hub_free(h->hub);
    pthread_mutex_destroy(&h->mu);
    free(h);
    srv->watch = NULL;
}

static const rpc_method watch_methods[] = {
    {"/etcdserverpb.Watch/Watch", RPC_BIDI, watch_stream, 2,
     &etcdserverpb__watch_request__descriptor},
};

const rpc_service etcd_watch_service = {"etcdserverpb.Watch", watch_methods, 1,
                                        watch_hub_cancel_all, etcd_admit};
