/*
 * The gRPC engine: services on the gRPC core C API. It knows no service:
 * each registers a table of methods (rpc_engine_add), and the engine
 * answers everything else UNIMPLEMENTED with grpc-go's words.
 *
 * Every registered method is registered with the gRPC server, so a new
 * call arrives with its request bytes already read (GRPC_SRM_PAYLOAD_READ_
 * INITIAL_BYTE_BUFFER); anything else arrives through grpc_server_request_
 * call. There are N workers, each with its own completion queue; each keeps
 * a few requests posted per method, so calls spread over the cores without
 * a shared queue. A tag is always an rpc_call whose |state| says what
 * completed, or an rpc_side (a stream's second operation in flight).
 *
 * Reads answer on the worker. A handler that writes hands the request to
 * the store and returns; the store's completer calls back once the change
 * is durable, and the callback queues the answer back to the call's worker
 * (rpc_later), so a worker need not wait for an fsync and no lock is held
 * across I/O. The completer could answer itself (grpc_call_start_batch is
 * thread-safe), but then two threads write to each connection: gRPC's
 * transport lock is contended and gRPC hands the contended reads to its
 * executor thread, which passes each new call back to the worker with a
 * wakeup. Measured under etcd's benchmark put (1 worker, 2 loaded CPUs):
 * the executor's context switches fell from ~2,000 to ~20 a run of 40,000
 * Puts, server context switches from 0.48-0.55 to 0.39-0.41 a Put.
 *
 * A service may admit or refuse each call before its handler runs (its
 * admit hook, grpc-go's interceptors: etcd's learner refuses most calls
 * there), so that no handler has to remember to ask.
 *
 * Every error leaves through rpc_fail, with the status and message of the
 * CAIRN_ERRORS row. etcd: a request bigger than grpc-go's receive limit
 * (max_recv_bytes) fails with "grpc: received message larger than max (N
 * vs. M)", RESOURCE_EXHAUSTED, before its handler runs. gRPC core's own
 * limit is set to twice that, so a flood is cut off early while etcd's
 * texts hold for every size a client can notice.
 *
 * What the engine cannot check. etcd (grpc-go) refuses a request with a
 * content-type other than application/grpc[+...] or none, or a malformed
 * grpc-timeout, with RST_STREAM(PROTOCOL_ERROR), and one whose compressed
 * flag is set without a grpc-encoding, or with an unknown grpc-encoding,
 * with INTERNAL / UNIMPLEMENTED and no message — all before its handler
 * runs. gRPC core 1.51 accepts all five and shows none of it through its
 * public C API (content-type and grpc-encoding are not in the request's
 * metadata, the message arrives as plain bytes, a bad timeout reads as no
 * deadline), so cairn serves such a request like a well-formed one
 * (measured; tests/integration/test_faults.py pins it). The front listener
 * (server/http/front.c) cannot check them either without changing what it
 * is: it hands a connection to gRPC whole once the preface is read, and
 * checking headers would mean relaying every byte through an HTTP/2 frame
 * parser keeping HPACK's table in step, a copy and a thread hop on every
 * request. Re-checked 2026-12-02 with gRPC core 1.51.1: unchanged.
 *
 * Shutdown: stop accepting (grpc_server_shutdown_and_notify), tell the
 * services, let calls in flight finish for a grace period, cancel the rest,
 * and free the queues once every call is freed.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "server/rpc/rpc.h"

#include "crdt/error.h"
#include "server/server.h"

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

enum { ST_NEW = 1, ST_ACTIVE, ST_STREAM, ST_DONE };

_Static_assert(sizeof(rpc_call) <= 1024, "an rpc_call must stay in glibc's per-thread cache");

/* What /metrics reports of one method (grpc_server_*), per worker: relaxed
 * atomics on lines that only the worker's calls touch (mostly from the
 * worker's own thread; a write's answer comes from the store's), summed
 * when scraped (rpc_engine_stats). */
typedef struct rpc_method_stats {
    atomic_uint_least64_t started;
    atomic_uint_least64_t handled[RPC_NCODES];
    atomic_uint_least64_t msg_received, msg_sent;
    atomic_uint_least64_t bytes_received, bytes_sent;
} rpc_method_stats;

struct rpc_worker {
    rpc_engine *e;
    grpc_completion_queue *cq;
    pthread_t thread;
    int running;
    rpc_method_stats *stats; /* nentries + 1 (the last: unregistered methods) */
    /* rpc_later's queue; |later_tag| is on the queue while |later_posted| */
    pthread_mutex_t later_mu;
    rpc_call *later_head, **later_tail;
    int later_posted;
    rpc_side later_tag;
};

#define COUNT(field, n) atomic_fetch_add_explicit(&(field), (n), memory_order_relaxed)

/* One registered method. */
typedef struct rpc_entry {
    const rpc_method *m;
    const rpc_service *svc;
    void *arg;
    void *handle; /* grpc_server_register_method's */
} rpc_entry;

typedef struct rpc_svc_entry {
    const rpc_service *svc;
    void *arg;
} rpc_svc_entry;

struct rpc_engine {
    rpc_engine_options opts;
    grpc_server *grpc;
    struct rpc_worker *workers;
    int nworkers;
    rpc_entry *entries;
    size_t nentries;
    rpc_svc_entry *svcs;
    size_t nsvcs;
    atomic_int stopping;
    int started;

    /* shutdown notification */
    pthread_mutex_t shut_mu;
    pthread_cond_t shut_cv;
    int shut_done;
    char shutdown_tag;  /* its address is the shutdown notification's tag */
    int64_t live_calls; /* accepted and not yet freed (shut_mu) */
};

static rpc_method_stats *stats_of(rpc_call *c)
{
    return &c->w->stats[c->entry >= 0 ? (size_t)c->entry : c->e->nentries];
}

/* ---- posting requests ---------------------------------------------------- */

/* Posts a call slot for entry |i| of the worker's engine (-1: any
 * unregistered method). */
static void post(struct rpc_worker *w, int i)
{
    rpc_engine *e = w->e;
    if (atomic_load(&e->stopping))
        return;
    rpc_call *c = malloc(sizeof *c);
    if (!c) {
        cairn_log(CAIRN_LOG_ERROR, "out of memory posting a call slot");
        return;
    }
    memset(c, 0, offsetof(rpc_call, unpack_mem)); /* the arena needs no zeros */
    c->state = ST_NEW;
    c->entry = i;
    c->e = e;
    c->w = w;
    grpc_metadata_array_init(&c->md);
    grpc_call_error ce;
    if (i < 0) {
        grpc_call_details_init(&c->details);
        ce = grpc_server_request_call(e->grpc, &c->call, &c->details, &c->md, w->cq, w->cq, c);
    } else {
        const rpc_entry *en = &e->entries[i];
        c->method = en->m;
        c->arg = en->arg;
        int bidi = en->m->kind == RPC_BIDI;
        ce =
            grpc_server_request_registered_call(e->grpc, en->handle, &c->call, &c->deadline, &c->md,
                                                bidi ? NULL : &c->payload, w->cq, w->cq, c);
    }
    if (ce != GRPC_CALL_OK) {
        if (!atomic_load(&e->stopping))
            cairn_log(CAIRN_LOG_ERROR, "grpc: cannot post a call slot (%d)", (int)ce);
        grpc_metadata_array_destroy(&c->md);
        if (i < 0)
            grpc_call_details_destroy(&c->details);
        free(c);
    }
}

static void call_free(rpc_call *c)
{
    rpc_engine *e = c->e;
    if (atomic_load(&e->stopping) && c->live)
        cairn_log(CAIRN_LOG_DEBUG, "freed during shutdown: %s",
                  c->method ? c->method->path : "(unregistered)");
    if (c->live) {
        pthread_mutex_lock(&e->shut_mu);
        if (--e->live_calls == 0)
            pthread_cond_broadcast(&e->shut_cv);
        pthread_mutex_unlock(&e->shut_mu);
    }
    if (c->ctx_free)
        c->ctx_free(c);
    if (c->req_msg && c->unpack_spilled)
        protobuf_c_message_free_unpacked(c->req_msg, &c->unpack_alloc);
    grpc_slice_unref(c->req_bytes);
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    if (c->send)
        grpc_byte_buffer_destroy(c->send);
    grpc_slice_unref(c->status_details);
    grpc_metadata_array_destroy(&c->md);
    if (!c->method)
        grpc_call_details_destroy(&c->details);
    if (c->call)
        grpc_call_unref(c->call);
    free(c);
}

/* ---- answering ----------------------------------------------------------- */

grpc_byte_buffer *rpc_pack(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Ends |c| with |status| (|msg| its text) after |send| (owned from here;
 * NULL: no message). */
static void finish(rpc_call *c, grpc_status_code status, const char *msg, grpc_byte_buffer *send)
{
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->sent_initial_md) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
        c->sent_initial_md = 1;
    }
    rpc_method_stats *st = stats_of(c);
    if (c->on_close)
        c->final_status = (int)status; /* counted once the close completed */
    else
        COUNT(st->handled[(unsigned)status < RPC_NCODES ? status : GRPC_STATUS_UNKNOWN], 1);
    if (send) {
        COUNT(st->msg_sent, 1);
        COUNT(st->bytes_sent, grpc_byte_buffer_length(send));
        if (c->send)
            grpc_byte_buffer_destroy(c->send);
        c->send = send;
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->send;
        n++;
    }
    if (!c->on_close) { /* else rpc_notify_close asked for it already */
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
        n++;
    }
    grpc_slice_unref(c->status_details);
    c->status_details = grpc_slice_from_copied_string(msg ? msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = status;
    ops[n].data.send_status_from_server.status_details = msg ? &c->status_details : NULL;
    n++;
    c->state = ST_DONE;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        /* Only a programming error gets here; never leak the call (with
         * rpc_notify_close's op in flight, its completion frees it). */
        cairn_log(CAIRN_LOG_ERROR, "grpc: start_batch failed (%d)", (int)e);
        if (c->close_state == RPC_CLOSE_STATE)
            c->done_seen = 1;
        else
            call_free(c);
    }
}

void rpc_reply(rpc_call *c, const ProtobufCMessage *msg)
{
    if (!msg && c->end_rc) {
        rpc_fail(c, c->end_rc, c->end_detail);
        return;
    }
    finish(c, GRPC_STATUS_OK, NULL, msg ? rpc_pack(msg) : NULL);
}

void rpc_fail_on_end(rpc_call *c, int rc, const char *detail)
{
    c->end_rc = rc;
    c->end_detail = detail;
}

void rpc_reply_raw(rpc_call *c, const uint8_t *msg, size_t n)
{
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)msg, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    finish(c, GRPC_STATUS_OK, NULL, bb);
}

void rpc_fail(rpc_call *c, int rc, const char *detail)
{
    int status = cairn_error_grpc_status(rc);
    const char *msg = detail ? detail : cairn_strerror(rc);
    const char *path = c->method ? c->method->path : "(unregistered)";
    cairn_log(status == GRPC_STATUS_INTERNAL || status == GRPC_STATUS_DATA_LOSS ? CAIRN_LOG_WARN
                                                                                : CAIRN_LOG_DEBUG,
              "%s: %s (%s)", path, msg, cairn_error_name(rc));
    finish(c, (grpc_status_code)status, msg, NULL);
}

void rpc_stream_send(rpc_call *c, const ProtobufCMessage *msg, rpc_next_fn next)
{
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->sent_initial_md) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
        c->sent_initial_md = 1;
    }
    if (c->send)
        grpc_byte_buffer_destroy(c->send);
    c->send = rpc_pack(msg);
    rpc_method_stats *st = stats_of(c);
    COUNT(st->msg_sent, 1);
    COUNT(st->bytes_sent, grpc_byte_buffer_length(c->send));
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->send;
    n++;
    c->state = ST_STREAM;
    c->next = next;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        cairn_log(CAIRN_LOG_ERROR, "grpc: start_batch (stream) failed (%d)", (int)e);
        rpc_fail(c, CAIRN_EIO, NULL);
    }
}

void rpc_stream_recv(rpc_call *c, rpc_next_fn next)
{
    if (c->payload) {
        grpc_byte_buffer_destroy(c->payload);
        c->payload = NULL;
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->payload;
    c->state = ST_STREAM;
    c->next = next;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, c, NULL);
    if (e != GRPC_CALL_OK) {
        cairn_log(CAIRN_LOG_ERROR, "grpc: start_batch (recv) failed (%d)", (int)e);
        rpc_fail(c, CAIRN_EIO, NULL);
    }
}

int rpc_payload_take(rpc_call *c, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    size_t n = grpc_byte_buffer_length(c->payload);
    rpc_method_stats *st = stats_of(c);
    COUNT(st->msg_received, 1);
    COUNT(st->bytes_received, n);
    if (n > c->e->opts.max_recv_bytes)
        return CAIRN_EMSGTOOLARGE;
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, c->payload))
        return CAIRN_EUNMARSHAL;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        grpc_byte_buffer_reader_destroy(&reader);
        return CAIRN_ENOMEM;
    }
    size_t off = 0;
    grpc_slice s;
    while (grpc_byte_buffer_reader_next(&reader, &s)) {
        size_t k = GRPC_SLICE_LENGTH(s);
        if (k > n - off)
            k = n - off;
        memcpy(buf + off, GRPC_SLICE_START_PTR(s), k);
        off += k;
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&reader);
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    *out = buf;
    *len = off;
    return 0;
}

/* The call's unpack allocator (see rpc_call): bump allocation in
 * c->unpack_mem, malloc past its end. */
static void *unpack_alloc(void *arg, size_t n)
{
    rpc_call *c = arg;
    size_t at = (c->unpack_used + 15) & ~(size_t)15;
    if (n <= sizeof c->unpack_mem && at <= sizeof c->unpack_mem - n) {
        c->unpack_used = at + n;
        return c->unpack_mem + at;
    }
    void *p = malloc(n ? n : 1);
    if (p)
        c->unpack_spilled++;
    return p;
}

static void unpack_free(void *arg, void *p)
{
    rpc_call *c = arg;
    unsigned char *b = p;
    if (b >= c->unpack_mem && b < c->unpack_mem + sizeof c->unpack_mem)
        return;
    free(p);
}

ProtobufCMessage *rpc_unpack(rpc_call *c, const ProtobufCMessageDescriptor *desc,
                             const uint8_t *req, size_t len)
{
    c->unpack_alloc.alloc = unpack_alloc;
    c->unpack_alloc.free = unpack_free;
    c->unpack_alloc.allocator_data = c;
    c->req_msg = protobuf_c_message_unpack(desc, &c->unpack_alloc, len, req);
    if (!c->req_msg)
        rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
    return c->req_msg;
}

/* ---- dispatch ------------------------------------------------------------ */

static int known_service(const rpc_engine *e, const char *s, size_t len)
{
    for (size_t i = 0; i < e->nsvcs; i++) {
        const char *name = e->svcs[i].svc->name;
        if (strlen(name) == len && memcmp(name, s, len) == 0)
            return 1;
    }
    return 0;
}

static void unknown_method(rpc_call *c)
{
    /* etcd (grpc-go): "unknown service foo.Bar" / "unknown method Nope for
     * service etcdserverpb.KV", both UNIMPLEMENTED. */
    char detail[512];
    const char *p = (const char *)GRPC_SLICE_START_PTR(c->details.method);
    size_t len = GRPC_SLICE_LENGTH(c->details.method);
    if (len > 0 && p[0] == '/') {
        p++;
        len--;
    }
    const char *slash = memchr(p, '/', len);
    if (!slash) {
        snprintf(detail, sizeof detail, "malformed method name: \"%.*s\"",
                 (int)(len > 200 ? 200 : len), p);
    } else {
        size_t slen = (size_t)(slash - p), mlen = len - slen - 1;
        if (slen > 200)
            slen = 200;
        if (mlen > 200)
            mlen = 200;
        if (known_service(c->e, p, slen))
            snprintf(detail, sizeof detail, "unknown method %.*s for service %.*s", (int)mlen,
                     slash + 1, (int)slen, p);
        else
            snprintf(detail, sizeof detail, "unknown service %.*s", (int)slen, p);
    }
    rpc_fail(c, CAIRN_ENOSUCHMETHOD, detail);
}

/* The service's admit hook on |c| (see rpc_admit_fn): 1 if the call may
 * go on, else 0 with the call failed. */
static int admitted(rpc_call *c, const uint8_t *req, size_t len)
{
    rpc_admit_fn admit = c->e->entries[c->entry].svc->admit;
    int rc = admit ? admit(c, req, len) : 0;
    if (rc)
        rpc_fail(c, rc, NULL);
    return rc == 0;
}

static void dispatch(rpc_call *c)
{
    c->state = ST_ACTIVE;
    COUNT(stats_of(c)->started, 1);
    if (!c->method) {
        unknown_method(c);
        return;
    }
    const rpc_method *m = c->method;
    /* etcd (grpc-go): a stream's interceptors run before its handler reads
     * the request (so before the receive limit too); a unary call's once
     * its request is read and decoded, below */
    if (m->kind != RPC_UNARY && !admitted(c, NULL, 0))
        return;
    if (m->kind == RPC_BIDI) {
        m->fn(c, NULL, 0);
        return;
    }
    if (!c->payload) {
        rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
        return;
    }
    size_t len = grpc_byte_buffer_length(c->payload);
    COUNT(stats_of(c)->msg_received, 1);
    COUNT(stats_of(c)->bytes_received, len);
    uint64_t limit = c->e->opts.max_recv_bytes;
    if (len > limit) {
        char detail[128];
        snprintf(detail, sizeof detail,
                 "grpc: received message larger than max (%zu vs. %" PRIu64 ")", len, limit);
        rpc_fail(c, CAIRN_EMSGTOOLARGE, detail);
        return;
    }
    grpc_byte_buffer *bb = c->payload;
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
        bb->data.raw.slice_buffer.count == 1) {
        /* One piece, as almost every small request arrives: no copy. */
        c->req_bytes = grpc_slice_ref(bb->data.raw.slice_buffer.slices[0]);
    } else {
        grpc_byte_buffer_reader reader;
        if (!grpc_byte_buffer_reader_init(&reader, bb)) {
            rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
            return;
        }
        c->req_bytes = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);
    }
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    const uint8_t *req = GRPC_SLICE_START_PTR(c->req_bytes);
    size_t n = GRPC_SLICE_LENGTH(c->req_bytes);
    if (m->kind == RPC_UNARY && !admitted(c, req, n))
        return;
    m->fn(c, req, n);
}

/* A call that asked rpc_notify_close: its status batch and its close both
 * completed. */
static void closed_free(rpc_call *c)
{
    int code = c->cancelled ? c->close_code : c->final_status;
    COUNT(stats_of(c)->handled[(unsigned)code < RPC_NCODES ? code : GRPC_STATUS_UNKNOWN], 1);
    call_free(c);
}

int rpc_notify_close(rpc_call *c, void (*fn)(rpc_call *c), int cancel_code)
{
    c->close_code = cancel_code;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    c->close_state = RPC_CLOSE_STATE;
    c->on_close = fn;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->close_state, NULL);
    if (e != GRPC_CALL_OK) {
        cairn_log(CAIRN_LOG_ERROR, "grpc: start_batch (close) failed (%d)", (int)e);
        c->close_state = 0;
        c->on_close = NULL;
        return CAIRN_EIO;
    }
    return 0;
}

void rpc_count_sent(rpc_call *c, size_t bytes)
{
    rpc_method_stats *st = stats_of(c);
    COUNT(st->msg_sent, 1);
    COUNT(st->bytes_sent, bytes);
}

int rpc_side_batch(rpc_call *c, const grpc_op *ops, size_t n, rpc_side *tag)
{
    tag->state = RPC_SIDE_STATE;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        cairn_log(CAIRN_LOG_ERROR, "grpc: start_batch (side) failed (%d)", (int)e);
        return CAIRN_EIO;
    }
    return 0;
}

/* The worker's rpc_later tag came out of its queue: runs every call
 * queued so far (later ones post the tag again). */
static void run_later(void *arg, int ok)
{
    (void)ok; /* an empty batch always succeeds */
    struct rpc_worker *w = arg;
    pthread_mutex_lock(&w->later_mu);
    rpc_call *c = w->later_head;
    w->later_head = NULL;
    w->later_tail = &w->later_head;
    w->later_posted = 0;
    pthread_mutex_unlock(&w->later_mu);
    while (c) {
        rpc_call *n = c->later_next;
        c->later_next = NULL;
        c->later_fn(c, c->later_rc);
        c = n;
    }
}

void rpc_later(rpc_call *c, void (*fn)(rpc_call *c, int rc), int rc)
{
    struct rpc_worker *w = c->w;
    c->later_fn = fn;
    c->later_rc = rc;
    c->later_next = NULL;
    pthread_mutex_lock(&w->later_mu);
    *w->later_tail = c;
    w->later_tail = &c->later_next;
    int post_tag = !w->later_posted;
    w->later_posted = 1;
    pthread_mutex_unlock(&w->later_mu);
    /* An empty batch completes at once on the call's queue, the worker's;
     * |c| is alive (its answer is not sent) and the queue too (it is shut
     * down only once every call is freed). */
    if (post_tag && rpc_side_batch(c, NULL, 0, &w->later_tag) != 0) {
        run_later(w, 1); /* cannot happen on a live call; never strand one */
    }
}

static void handle(void *tag, int ok)
{
    if (*(int *)tag == RPC_SIDE_STATE) {
        rpc_side *side = tag;
        side->fn(side->arg, ok);
        return;
    }
    if (*(int *)tag == RPC_CLOSE_STATE) {
        /* Every completion of a call comes out of its worker's queue, on
         * that worker: this and ST_DONE cannot race. */
        rpc_call *c = (rpc_call *)(void *)((char *)tag - offsetof(rpc_call, close_state));
        c->close_state = 0;
        c->on_close(c);
        if (c->done_seen)
            closed_free(c);
        return;
    }
    rpc_call *c = tag;
    switch (c->state) {
    case ST_NEW:
        if (!ok) { /* the server is shutting down */
            call_free(c);
            return;
        }
        pthread_mutex_lock(&c->e->shut_mu);
        c->e->live_calls++;
        c->live = 1;
        pthread_mutex_unlock(&c->e->shut_mu);
        post(c->w, c->entry);
        dispatch(c);
        return;
    case ST_STREAM:
        c->state = ST_ACTIVE;
        c->next(c, ok);
        return;
    case ST_DONE:
        if (c->close_state == RPC_CLOSE_STATE) {
            c->done_seen = 1; /* freed once the close completes */
            return;
        }
        if (c->on_close)
            closed_free(c);
        else
            call_free(c);
        return;
    default:
        cairn_log(CAIRN_LOG_ERROR, "grpc: completion for a call in state %d", c->state);
        return;
    }
}

static void *worker_main(void *arg)
{
    struct rpc_worker *w = arg;
    rpc_engine *e = w->e;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &e->shutdown_tag) {
            pthread_mutex_lock(&e->shut_mu);
            e->shut_done = 1;
            pthread_cond_broadcast(&e->shut_cv);
            pthread_mutex_unlock(&e->shut_mu);
            continue;
        }
        handle(ev.tag, ev.success);
    }
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------- */

/* An integer channel argument, clamped to gRPC's int. */
static void add_int_arg(grpc_arg *args, size_t *n, const char *key, int64_t v)
{
    args[*n].type = GRPC_ARG_INTEGER;
    args[*n].key = (char *)key;
    args[*n].value.integer = v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int)v;
    (*n)++;
}

/* One worker per CPU this process may run on, less the one that the
 * store's committer and completer keep busy between them, and at least
 * one. Every worker waits in grpc_completion_queue_next and so is one of
 * epoll1's pollers: the worker that reads a request is often not the one
 * whose queue the call is on, and hands it over with a wakeup. On two
 * CPUs, under etcd's benchmark put (100 clients), one worker took 0.6
 * context switches a Put to two workers' 0.9, and 52 us of server CPU a
 * Put to 60; Range (serializable) 18 to 22 us. */
static int default_workers(void)
{
    int ncpu = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        ncpu = CPU_COUNT(&set);
    if (ncpu < 1)
        ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return ncpu > 2 ? ncpu - 1 : 1;
}

int rpc_engine_new(rpc_engine **out, const rpc_engine_options *o)
{
    *out = NULL;
    rpc_engine *e = calloc(1, sizeof *e);
    if (!e)
        return CAIRN_ENOMEM;
    e->opts = *o;
    pthread_mutex_init(&e->shut_mu, NULL);
    pthread_cond_init(&e->shut_cv, NULL);
    grpc_init();

    uint64_t limit = 2 * o->max_recv_bytes;
    if (limit > INT32_MAX)
        limit = INT32_MAX;
    grpc_arg args[7];
    size_t na = 0;
    memset(args, 0, sizeof args);
    add_int_arg(args, &na, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int64_t)limit);
    add_int_arg(args, &na, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1);
    /* Two servers on one port would split the clients: never share. */
    add_int_arg(args, &na, GRPC_ARG_ALLOW_REUSEPORT, 0);
    /* etcd: grpc-go's keepalive EnforcementPolicy{MinTime, PermitWithout-
     * Stream: false} when --grpc-keepalive-min-time > 0: a client that
     * pings more often (or, with no call open, at all within 2 h) is
     * struck, and after two strikes gets GOAWAY ENHANCE_YOUR_CALM
     * "too_many_pings" — gRPC core's policy is the same. */
    if (o->keepalive_min_time_ms > 0)
        add_int_arg(args, &na, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                    o->keepalive_min_time_ms);
    /* etcd: ServerParameters{Time, Timeout} only when both are > 0 */
    if (o->keepalive_interval_ms > 0 && o->keepalive_timeout_ms > 0) {
        add_int_arg(args, &na, GRPC_ARG_KEEPALIVE_TIME_MS, o->keepalive_interval_ms);
        add_int_arg(args, &na, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, o->keepalive_timeout_ms);
    }
    /* etcd: grpc.MaxConcurrentStreams, advertised in SETTINGS; clients
     * wait for a free stream. 0 is no limit to grpc-go; gRPC core's
     * integer stops at INT32_MAX, which no connection reaches. */
    if (o->max_concurrent_streams > 0 && o->max_concurrent_streams <= INT32_MAX)
        add_int_arg(args, &na, GRPC_ARG_MAX_CONCURRENT_STREAMS, (int64_t)o->max_concurrent_streams);
    grpc_channel_args cargs = {na, args};
    e->grpc = grpc_server_create(&cargs, NULL);

    int n = o->threads > 0 ? o->threads : default_workers();
    e->workers = calloc((size_t)n, sizeof *e->workers);
    if (!e->workers) {
        rpc_engine_free(e);
        return CAIRN_ENOMEM;
    }
    e->nworkers = n;
    for (int i = 0; i < n; i++) {
        struct rpc_worker *w = &e->workers[i];
        w->e = e;
        pthread_mutex_init(&w->later_mu, NULL);
        w->later_tail = &w->later_head;
        w->later_tag.fn = run_later;
        w->later_tag.arg = w;
        e->workers[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(e->grpc, e->workers[i].cq, NULL);
    }
    *out = e;
    return 0;
}

int rpc_engine_add(rpc_engine *e, const rpc_service *svc, void *arg)
{
    rpc_svc_entry *svcs = realloc(e->svcs, (e->nsvcs + 1) * sizeof *svcs);
    if (!svcs)
        return CAIRN_ENOMEM;
    e->svcs = svcs;
    rpc_entry *en = realloc(e->entries, (e->nentries + svc->nmethods) * sizeof *en);
    if (!en)
        return CAIRN_ENOMEM;
    e->entries = en;
    svcs[e->nsvcs].svc = svc;
    svcs[e->nsvcs].arg = arg;
    e->nsvcs++;
    for (size_t i = 0; i < svc->nmethods; i++) {
        const rpc_method *m = &svc->methods[i];
        void *h = grpc_server_register_method(
            e->grpc, m->path, NULL,
            m->kind == RPC_BIDI ? GRPC_SRM_PAYLOAD_NONE : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
            0);
        if (!h) {
            cairn_log(CAIRN_LOG_ERROR, "grpc: cannot register %s", m->path);
            return CAIRN_EIO;
        }
        e->entries[e->nentries].m = m;
        e->entries[e->nentries].svc = svc;
        e->entries[e->nentries].arg = arg;
        e->entries[e->nentries].handle = h;
        e->nentries++;
    }
    return 0;
}

int rpc_engine_listen(rpc_engine *e, const char *addr)
{
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    int port = grpc_server_add_http2_port(e->grpc, addr, creds);
    grpc_server_credentials_release(creds);
    return port;
}

void rpc_engine_adopt_fd(rpc_engine *e, int fd)
{
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    grpc_server_add_channel_from_fd(e->grpc, fd, creds);
    grpc_server_credentials_release(creds);
}

size_t rpc_engine_stats(const rpc_engine *e, rpc_method_counts *out, size_t max)
{
    size_t n = e->nentries + 1 < max ? e->nentries + 1 : max;
    for (size_t m = 0; m < n; m++) {
        rpc_method_counts *o = &out[m];
        memset(o, 0, sizeof *o);
        o->path = m < e->nentries ? e->entries[m].m->path : NULL;
        o->kind = m < e->nentries ? e->entries[m].m->kind : RPC_UNARY;
        for (int i = 0; i < e->nworkers; i++) {
            rpc_method_stats *st = e->workers[i].stats;
            if (!st)
                continue;
            st += m;
            o->started += atomic_load_explicit(&st->started, memory_order_relaxed);
            for (int k = 0; k < RPC_NCODES; k++)
                o->handled[k] += atomic_load_explicit(&st->handled[k], memory_order_relaxed);
            o->msg_received += atomic_load_explicit(&st->msg_received, memory_order_relaxed);
            o->msg_sent += atomic_load_explicit(&st->msg_sent, memory_order_relaxed);
            o->bytes_received += atomic_load_explicit(&st->bytes_received, memory_order_relaxed);
            o->bytes_sent += atomic_load_explicit(&st->bytes_sent, memory_order_relaxed);
        }
    }
    return n;
}

int rpc_engine_workers(const rpc_engine *e)
{
    return e->nworkers;
}

int rpc_engine_start(rpc_engine *e)
{
    for (int i = 0; i < e->nworkers; i++)
        if (!e->workers[i].stats &&
            !(e->workers[i].stats = calloc(e->nentries + 1, sizeof(rpc_method_stats))))
            return CAIRN_ENOMEM;
    grpc_server_start(e->grpc);
    e->started = 1;
    for (int i = 0; i < e->nworkers; i++) {
        struct rpc_worker *w = &e->workers[i];
        for (size_t m = 0; m < e->nentries; m++)
            for (int k = 0; k < e->entries[m].m->slots; k++)
                post(w, (int)m);
        post(w, -1);
    }
    for (int i = 0; i < e->nworkers; i++) {
        if (pthread_create(&e->workers[i].thread, NULL, worker_main, &e->workers[i]) != 0) {
            cairn_log(CAIRN_LOG_ERROR, "cannot start worker thread %d", i);
            return CAIRN_ENOMEM;
        }
        e->workers[i].running = 1;
    }
    return 0;
}

void rpc_engine_stop(rpc_engine *e, int grace_ms)
{
    if (!e->started)
        return;
    atomic_store(&e->stopping, 1);
    grpc_server_shutdown_and_notify(e->grpc, e->workers[0].cq, &e->shutdown_tag);
    /* etcd: watch streams end when the server stops; they would otherwise
     * hold the shutdown for the whole grace period. */
    for (size_t i = 0; i < e->nsvcs; i++)
        if (e->svcs[i].svc->stopping)
            e->svcs[i].svc->stopping(e->svcs[i].arg);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += grace_ms / 1000;
    until.tv_nsec += (long)(grace_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    /* gRPC's notification also waits for every client connection to
     * close; once no call of ours is in flight there is nothing left to
     * finish, so the connections are closed then instead of after the
     * grace period. */
    pthread_mutex_lock(&e->shut_mu);
    while (!e->shut_done && e->live_calls > 0)
        if (pthread_cond_timedwait(&e->shut_cv, &e->shut_mu, &until) == ETIMEDOUT)
            break;
    int done = e->shut_done;
    int64_t live = e->live_calls;
    pthread_mutex_unlock(&e->shut_mu);
    if (!done) {
        if (live > 0)
            cairn_log(CAIRN_LOG_WARN, "%lld calls still in flight after %d ms: cancelling them",
                      (long long)live, grace_ms);
        grpc_server_cancel_all_calls(e->grpc);
        pthread_mutex_lock(&e->shut_mu);
        while (!e->shut_done)
            pthread_cond_wait(&e->shut_cv, &e->shut_mu);
        pthread_mutex_unlock(&e->shut_mu);
    }
    /* gRPC's notification says no call is being serviced any more, but a
     * call of ours may still start its last batch (a Watch stream ending,
     * a write the store just completed). The queues must outlive that:
     * wait until every call we accepted is freed. */
    pthread_mutex_lock(&e->shut_mu);
    while (e->live_calls > 0)
        pthread_cond_wait(&e->shut_cv, &e->shut_mu);
    pthread_mutex_unlock(&e->shut_mu);
    grpc_server_destroy(e->grpc);
    e->grpc = NULL;
    for (int i = 0; i < e->nworkers; i++)
        grpc_completion_queue_shutdown(e->workers[i].cq);
    for (int i = 0; i < e->nworkers; i++)
        if (e->workers[i].running) {
            pthread_join(e->workers[i].thread, NULL);
            e->workers[i].running = 0;
        }
    for (int i = 0; i < e->nworkers; i++) {
        grpc_completion_queue_destroy(e->workers[i].cq);
        e->workers[i].cq = NULL;
    }
    e->started = 0;
}

void rpc_engine_free(rpc_engine *e)
{
    if (!e)
        return;
    if (e->started)
        rpc_engine_stop(e, 0);
    if (e->grpc) {
        /* Never started: nothing is in flight, but a server with listeners
         * must be shut down before it is destroyed. */
        if (e->nworkers > 0) {
            grpc_server_shutdown_and_notify(e->grpc, e->workers[0].cq, &e->shutdown_tag);
            for (;;) {
                grpc_event ev = grpc_completion_queue_next(
                    e->workers[0].cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
                if (ev.type != GRPC_OP_COMPLETE || ev.tag == &e->shutdown_tag)
                    break;
            }
        }
        grpc_server_destroy(e->grpc);
    }
    for (int i = 0; i < e->nworkers; i++)
        if (e->workers[i].cq) {
            grpc_completion_queue_shutdown(e->workers[i].cq);
            while (grpc_completion_queue_next(e->workers[i].cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                              NULL)
                       .type != GRPC_QUEUE_SHUTDOWN)
                ;
            grpc_completion_queue_destroy(e->workers[i].cq);
        }
    for (int i = 0; i < e->nworkers; i++) {
        free(e->workers[i].stats);
        pthread_mutex_destroy(&e->workers[i].later_mu);
    }
    free(e->workers);
    free(e->entries);
    free(e->svcs);
    pthread_mutex_destroy(&e->shut_mu);
    pthread_cond_destroy(&e->shut_cv);
    free(e);
    grpc_shutdown();
}
