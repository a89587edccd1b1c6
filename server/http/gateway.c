/*
 * etcd's JSON gateway (gateway.h), as etcd 3.4 runs it: grpc-gateway
 * dials etcd's own gRPC server and forwards each POST as a unary call.
 * cairn does the same without a TCP port: a socketpair whose one end the
 * engine serves (rpc_engine_adopt_fd) and whose other end is a gRPC
 * channel (grpc_channel_create_from_fd). A request's JSON becomes protobuf
 * bytes on the front thread (json.c, from the method's descriptor); the
 * call's completion arrives on this module's thread, which turns the
 * answer, or the gRPC status, into etcd's JSON and hands it to the front.
 *
 * etcd: errors are {"error":m,"message":m,"code":c} with grpc-gateway
 * v1's HTTP status for the gRPC code (NotFound 404, ResourceExhausted 429,
 * InvalidArgument and OutOfRange 400 measured); a request that is not
 * valid JSON gets code 3 and 400 before any call.
 *
 * Streams (/v3/watch, /v3/lease/keepalive), as measured on etcd 3.4: the
 * body is a sequence of JSON requests, each sent on one bidirectional
 * call (a first one that does not parse is answered 500, code 2; a later
 * one ends the sending); the answer is chunked, one chunk per response,
 * {"result":...} and a newline; the stream ends with the call (a last
 * error as a {"error":{"grpc_code":...}} chunk). etcd's gateway closes
 * its sending side after the body: etcd's Watch goes on, its
 * LeaseKeepAlive ends, and cairn's do the same; a watch here keeps its
 * side open until the HTTP client goes all the same.
 * /v3/election/observe (server streaming) decodes its one request as a
 * unary call's (a bad body: code 3, 400) and streams like /v3/watch.
 * /v3/lock/lock and /v3/election/campaign may wait for minutes: they run
 * on the stream machinery without a deadline, so that a client that goes
 * away cancels the call (etcd's gateway cancels its context, and the
 * waiter's key is deleted), and are answered whole as unary calls.
 * A call receives its next response only while less than
 * GATEWAY_STREAM_HIGH bytes of its answer wait for the client (front_flow):
 * a slow reader holds back the gRPC stream (its flow control, then the
 * watch's own slow-stream handling), never this process's memory.
 */
#include "server/http/gateway.h"

#include "crdt/error.h"
#include "etcdserverpb/rpc.pb-c.h"
#include "server/http/front.h"
#include "server/http/json.h"
#include "server/rpc/rpc.h"
#include "server/rpc/unary_ops.h"
#include "server/server.h"
#include "v3electionpb/v3election.pb-c.h"
#include "v3lockpb/v3lock.pb-c.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A gateway call that takes longer is answered DeadlineExceeded (504),
 * unless its Grpc-Timeout header says otherwise. */
#define GATEWAY_DEADLINE_S 60
/* A stream stops receiving while this much of its answer is unsent. */
#define GATEWAY_STREAM_HIGH (1u << 20)
/* Requests one stream's body may hold. */
#define GATEWAY_STREAM_MAX_REQS 1024

/* UNARY_WAIT: a unary call that may wait long (Lock, Campaign): no
 * deadline, and cancelled when the client goes away, as etcd's gateway
 * cancels the call's context (run on the stream machinery, answered
 * whole). SERVER_STREAM: one request decoded as a unary one's, then a
 * stream of answers (Observe). */
enum { UNARY = 0, STREAM_OPEN = 1, STREAM_CLOSE = 2, UNARY_WAIT = 3, SERVER_STREAM = 4 };

typedef struct route {
    const char *path; /* after /v3 */
    const char *method;
    const ProtobufCMessageDescriptor *req, *resp;
    int kind; /* UNARY, UNARY_WAIT, SERVER_STREAM, or a bidi stream that keeps
                 (STREAM_OPEN) or closes its sending side */
} route;

/* etcd 3.4's rpc.proto google.api.http bindings */
static const route routes[] = {
    {"/kv/range", "/etcdserverpb.KV/Range", &etcdserverpb__range_request__descriptor,
     &etcdserverpb__range_response__descriptor, UNARY},
    {"/kv/put", "/etcdserverpb.KV/Put", &etcdserverpb__put_request__descriptor,
     &etcdserverpb__put_response__descriptor, UNARY},
    {"/kv/deleterange", "/etcdserverpb.KV/DeleteRange",
     &etcdserverpb__delete_range_request__descriptor,
     &etcdserverpb__delete_range_response__descriptor, UNARY},
    {"/kv/txn", "/etcdserverpb.KV/Txn", &etcdserverpb__txn_request__descriptor,
     &etcdserverpb__txn_response__descriptor, UNARY},
    {"/kv/compaction", "/etcdserverpb.KV/Compact", &etcdserverpb__compaction_request__descriptor,
     &etcdserverpb__compaction_response__descriptor, UNARY},
    {"/lease/grant", "/etcdserverpb.Lease/LeaseGrant",
     &etcdserverpb__lease_grant_request__descriptor,
     &etcdserverpb__lease_grant_response__descriptor, UNARY},
    {"/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke",
     &etcdserverpb__lease_revoke_request__descriptor,
     &etcdserverpb__lease_revoke_response__descriptor, UNARY},
    {"/kv/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke",
     &etcdserverpb__lease_revoke_request__descriptor,
     &etcdserverpb__lease_revoke_response__descriptor, UNARY},
    {"/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive",
     &etcdserverpb__lease_time_to_live_request__descriptor,
     &etcdserverpb__lease_time_to_live_response__descriptor, UNARY},
    {"/kv/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive",
     &etcdserverpb__lease_time_to_live_request__descriptor,
     &etcdserverpb__lease_time_to_live_response__descriptor, UNARY},
    {"/lease/leases", "/etcdserverpb.Lease/LeaseLeases",
     &etcdserverpb__lease_leases_request__descriptor,
     &etcdserverpb__lease_leases_response__descriptor, UNARY},
    {"/kv/lease/leases", "/etcdserverpb.Lease/LeaseLeases",
     &etcdserverpb__lease_leases_request__descriptor,
     &etcdserverpb__lease_leases_response__descriptor, UNARY},
    {"/maintenance/status", "/etcdserverpb.Maintenance/Status",
     &etcdserverpb__status_request__descriptor, &etcdserverpb__status_response__descriptor, UNARY},
    {"/maintenance/alarm", "/etcdserverpb.Maintenance/Alarm",
     &etcdserverpb__alarm_request__descriptor, &etcdserverpb__alarm_response__descriptor, UNARY},
    {"/cluster/member/list", "/etcdserverpb.Cluster/MemberList",
     &etcdserverpb__member_list_request__descriptor,
     &etcdserverpb__member_list_response__descriptor, UNARY},
    {"/watch", "/etcdserverpb.Watch/Watch", &etcdserverpb__watch_request__descriptor,
     &etcdserverpb__watch_response__descriptor, STREAM_OPEN},
    {"/lease/keepalive", "/etcdserverpb.Lease/LeaseKeepAlive",
     &etcdserverpb__lease_keep_alive_request__descriptor,
     &etcdserverpb__lease_keep_alive_response__descriptor, STREAM_CLOSE},
    /* etcd 3.4's v3lock.proto and v3election.proto bindings */
    {"/lock/lock", "/v3lockpb.Lock/Lock", &v3lockpb__lock_request__descriptor,
     &v3lockpb__lock_response__descriptor, UNARY_WAIT},
    {"/lock/unlock", "/v3lockpb.Lock/Unlock", &v3lockpb__unlock_request__descriptor,
     &v3lockpb__unlock_response__descriptor, UNARY},
    {"/election/campaign", "/v3electionpb.Election/Campaign",
     &v3electionpb__campaign_request__descriptor, &v3electionpb__campaign_response__descriptor,
     UNARY_WAIT},
    {"/election/proclaim", "/v3electionpb.Election/Proclaim",
     &v3electionpb__proclaim_request__descriptor, &v3electionpb__proclaim_response__descriptor,
     UNARY},
    {"/election/leader", "/v3electionpb.Election/Leader", &v3electionpb__leader_request__descriptor,
     &v3electionpb__leader_response__descriptor, UNARY},
    {"/election/observe", "/v3electionpb.Election/Observe",
     &v3electionpb__leader_request__descriptor, &v3electionpb__leader_response__descriptor,
     SERVER_STREAM},
    {"/election/resign", "/v3electionpb.Election/Resign", &v3electionpb__resign_request__descriptor,
     &v3electionpb__resign_response__descriptor, UNARY},
};

typedef struct gw_stream gw_stream;

typedef struct gw_call {
    gateway *g;
    const route *rt;
    uint64_t token;
    int minor;
    int close; /* the client asked to close after the answer */
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array md, trailing;
    grpc_status_code status;
    grpc_slice details;
    gw_stream *st; /* a streaming call's state, or NULL */
    struct gw_tag {
        struct gw_call *c;
        int kind; /* T_UNARY, T_SEND, T_RECV, T_STATUS */
    } tunary;
} gw_call;

/* A streaming call: three batches in flight at most (sending, receiving,
 * the status), each completing with a tag that names it. */
typedef struct gw_tag gw_tag;
enum { T_UNARY = 0, T_SEND, T_RECV, T_STATUS };

struct gw_stream {
    front_flow fl; /* first: the front's callbacks find the stream */
    gw_tag tsend, trecv, tstatus;
    grpc_byte_buffer **reqs;  /* the body's requests, sent in order */
    grpc_byte_buffer *answer; /* UNARY_WAIT: the call's answer */
    size_t nreqs, nsent;
    int outstanding; /* batches in flight (g->mu) */
    int front_ref;   /* the front holds fl (g->mu) */
    int stalled;     /* a response waits for the client to read (g->mu) */
    int ended;       /* the status came (g->mu) */
    int md_sent;     /* the first send batch was started (g->mu) */
    int close_sent;  /* SEND_CLOSE_FROM_CLIENT was started (g->mu) */
    int finishing;   /* the answer's end is being made (g->mu) */
    int finished;    /* ... and this thread is done with the call (g->mu) */
    int head_sent;   /* the answer's head went to the front (gateway thread) */
};

struct gateway {
    rpc_engine *rpc;
    front *f;
    grpc_channel *ch;
    grpc_completion_queue *cq;
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inflight; /* mu */
};

int gateway_new(gateway **out, rpc_engine *rpc, front *f)
{
    *out = NULL;
    gateway *g = calloc(1, sizeof *g);
    if (!g)
        return CAIRN_ENOMEM;
    g->rpc = rpc;
    g->f = f;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return 0;
}

/* ---- answers ------------------------------------------------------------- */

/* grpc-gateway v1's runtime.HTTPStatusFromCode */
static int http_status_of(int code)
{
    static const int map[RPC_NCODES] = {200, 408, 500, 400, 504, 404, 409, 403, 429,
                                        412, 409, 400, 501, 500, 503, 500, 401};
    return code >= 0 && code < RPC_NCODES ? map[code] : 500;
}

static void json_error(http_buf *out, int minor, int close, int code, const char *msg, size_t len)
{
    /* the message as a JSON string: jansson escapes it */
    http_buf body = {0};
    http_buf_printf(&body, "{\"error\":");
    char *q = pbjson_quote(msg, len);
    http_buf_printf(&body, "%s,\"message\":%s,\"code\":%d}", q ? q : "\"\"", q ? q : "\"\"", code);
    free(q);
    http_answer(out, minor, http_status_of(code), "application/json", NULL, body.data, body.len,
                close);
    http_buf_free(&body);
}

/* etcd's gateway (grpc-gateway) reads a Grpc-Timeout header as gRPC's
 * timeout: an integer as Go's strconv.ParseInt takes it (sign allowed)
 * and one unit letter, H M S m u n. 0 with |*ns| = 0: none sent, or 0
 * (no deadline); -1: malformed. */
static int grpc_timeout_ns(const http_request *r, int64_t *ns)
{
    *ns = 0;
    if (!r->grpc_timeout)
        return 0;
    const char *s = r->grpc_timeout;
    size_t n = r->grpc_timeout_len;
    if (n < 2)
        return -1;
    static const char units[] = "HMSmun";
    static const int64_t per[] = {INT64_C(3600000000000), INT64_C(60000000000),
                                  INT64_C(1000000000),    INT64_C(1000000),
                                  INT64_C(1000),          1};
    const char *u = memchr(units, s[n - 1], sizeof units - 1);
    if (!u)
        return -1;
    int64_t unit = per[u - units];
    size_t i = 0;
    int neg = 0;
    if (s[0] == '+' || s[0] == '-') {
        neg = s[0] == '-';
        i = 1;
    }
    if (i == n - 1)
        return -1;
    uint64_t v = 0;
    for (; i < n - 1; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
        if (v > (uint64_t)INT64_MAX + (uint64_t)neg)
            return -1; /* ParseInt's range error */
    }
    /* Go multiplies in int64 and may wrap; past 100 years is as good as none */
    const uint64_t cap = UINT64_C(3155760000000000000);
    uint64_t d = v > cap / (uint64_t)unit ? cap : v * (uint64_t)unit;
    *ns = neg ? -(int64_t)d : (int64_t)d;
    return 0;
}

/* The deadline a gateway call gets: the Grpc-Timeout's, else |dflt| (a
 * gpr_inf_future for none). */
static gpr_timespec call_deadline(int64_t ns, gpr_timespec dflt)
{
    if (ns == 0)
        return dflt;
    return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_nanos(ns, GPR_TIMESPAN));
}

/* gRPC core's text for a call whose own deadline passed, in Go's words as
 * etcd's gateway answers it. */
static void go_deadline_text(gw_call *c)
{
    static const char core[] = "Deadline Exceeded";
    if (c->status == GRPC_STATUS_DEADLINE_EXCEEDED &&
        GRPC_SLICE_LENGTH(c->details) == sizeof core - 1 &&
        memcmp(GRPC_SLICE_START_PTR(c->details), core, sizeof core - 1) == 0) {
        grpc_slice_unref(c->details);
        c->details = grpc_slice_from_static_string("context deadline exceeded");
    }
}

/* The response in |bb| as JSON text (malloc()ed), or NULL. */
static char *response_json(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb)
{
    ProtobufCMessage *m = NULL;
    grpc_byte_buffer_reader rd;
    if (bb && grpc_byte_buffer_reader_init(&rd, bb)) {
        grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
        m = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
        grpc_slice_unref(s);
    }
    char *json = m ? pbjson_encode(m) : NULL;
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    return json;
}

static void answer_call(gw_call *c, int ok)
{
    http_buf out = {0};
    if (!ok) {
        static const char m[] = "gateway call failed";
        json_error(&out, c->minor, c->close, GRPC_STATUS_UNAVAILABLE, m, sizeof m - 1);
    } else if (c->status != GRPC_STATUS_OK) {
        json_error(&out, c->minor, c->close, (int)c->status,
                   (const char *)GRPC_SLICE_START_PTR(c->details), GRPC_SLICE_LENGTH(c->details));
    } else {
        char *json = response_json(c->rt->resp, c->recv);
        if (json)
            /* etcd: grpc-gateway forwards the call's metadata */
            http_answer(&out, c->minor, 200, "application/json",
                        "Grpc-Metadata-Content-Type: application/grpc\r\n", json, strlen(json),
                        c->close);
        else {
            static const char e[] = "cannot encode the answer";
            json_error(&out, c->minor, c->close, GRPC_STATUS_INTERNAL, e, sizeof e - 1);
        }
        free(json);
    }
    front_complete(c->g->f, c->token, &out);
    http_buf_free(&out);
}

static void stream_free(gw_stream *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->nreqs; i++)
        grpc_byte_buffer_destroy(st->reqs[i]);
    if (st->answer)
        grpc_byte_buffer_destroy(st->answer);
    free(st->reqs);
    free(st);
}

static void call_free(gw_call *c)
{
    stream_free(c->st);
    if (c->call)
        grpc_call_unref(c->call);
    if (c->send)
        grpc_byte_buffer_destroy(c->send);
    if (c->recv)
        grpc_byte_buffer_destroy(c->recv);
    grpc_metadata_array_destroy(&c->md);
    grpc_metadata_array_destroy(&c->trailing);
    grpc_slice_unref(c->details);
    free(c);
}

/* ---- streams ------------------------------------------------------------- */

static void call_done(gateway *g, gw_call *c)
{
    call_free(c);
    pthread_mutex_lock(&g->mu);
    if (--g->inflight == 0)
        pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Starts the next send: the initial metadata with the first request, a
 * request, or the close of the sending side. g->mu held. */
static void post_send(gw_call *c)
{
    gw_stream *st = c->st;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!st->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        st->md_sent = 1;
    }
    if (st->nsent < st->nreqs) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = st->reqs[st->nsent++];
    } else if (c->rt->kind != STREAM_OPEN && !st->close_sent) {
        ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        st->close_sent = 1;
    }
    if (n > 0 && grpc_call_start_batch(c->call, ops, n, &st->tsend, NULL) == GRPC_CALL_OK)
        st->outstanding++;
}

/* Asks for the next response (with the initial metadata the first time).
 * g->mu held. */
static void post_recv(gw_call *c, int first)
{
    gw_stream *st = c->st;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (first) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &c->md;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &c->recv;
    if (grpc_call_start_batch(c->call, ops, n, &st->trecv, NULL) == GRPC_CALL_OK)
        st->outstanding++;
}

/* Front thread: the client read enough, or went away. */
static void flow_wake(front_flow *fl)
{
    gw_stream *st = (gw_stream *)fl;
    gw_call *c = st->tsend.c;
    pthread_mutex_lock(&c->g->mu);
    if (atomic_load(&fl->closed)) {
        if (!st->ended)
            grpc_call_cancel(c->call, NULL);
    } else if (st->stalled && atomic_load(&fl->unsent) < FRONT_FLOW_LOW) {
        st->stalled = 0;
        post_recv(c, 0);
    }
    pthread_mutex_unlock(&c->g->mu);
}

static int stream_over(const gw_stream *st)
{
    return st->finished && st->outstanding == 0 && !st->front_ref;
}

static void flow_release(front_flow *fl)
{
    gw_stream *st = (gw_stream *)fl;
    gw_call *c = st->tsend.c;
    gateway *g = c->g;
    pthread_mutex_lock(&g->mu);
    st->front_ref = 0;
    int over = stream_over(st);
    pthread_mutex_unlock(&g->mu);
    if (over)
        call_done(g, c);
}

/* grpc-gateway v1's stream error chunk (runtime.streamChunk) */
static void error_chunk(http_buf *out, int minor, int code, const char *msg, size_t len)
{
    int http = http_status_of(code);
    char *q = pbjson_quote(msg, len);
    http_buf body = {0};
    http_buf_printf(&body,
                    "{\"error\":{\"grpc_code\":%d,\"http_code\":%d,\"message\":%s,"
                    "\"http_status\":\"%s\"}}",
                    code, http, q ? q : "\"\"", http_reason(http));
    free(q);
    http_chunk(out, minor, body.data, body.len);
    http_buf_free(&body);
}

/* The end of the answer, once the call is over. Gateway thread. */
static void stream_finish(gw_call *c)
{
    gw_stream *st = c->st;
    if (atomic_load(&st->fl.closed))
        return;
    http_buf out = {0};
    const char *m = (const char *)GRPC_SLICE_START_PTR(c->details);
    size_t mlen = GRPC_SLICE_LENGTH(c->details);
    if (c->rt->kind == UNARY_WAIT) {
        /* answered whole, as a unary call */
        char *json = c->status == GRPC_STATUS_OK ? response_json(c->rt->resp, st->answer) : NULL;
        if (json)
            http_answer(&out, c->minor, 200, "application/json",
                        "Grpc-Metadata-Content-Type: application/grpc\r\n", json, strlen(json),
                        c->close);
        else if (c->status != GRPC_STATUS_OK)
            json_error(&out, c->minor, c->close, (int)c->status, m, mlen);
        else {
            static const char e[] = "cannot encode the answer";
            json_error(&out, c->minor, c->close, GRPC_STATUS_INTERNAL, e, sizeof e - 1);
        }
        free(json);
    } else if (c->status != GRPC_STATUS_OK && !st->head_sent) {
        /* etcd: the call failed before its headers: an HTTP error */
        json_error(&out, c->minor, c->close, (int)c->status, m, mlen);
    } else {
        if (!st->head_sent) /* etcd: no response at all, Trailers-Only */
            http_stream_head(&out, c->minor, 200, "application/json", NULL, c->close);
        if (c->status != GRPC_STATUS_OK)
            error_chunk(&out, c->minor, (int)c->status, m, mlen);
        http_chunk_end(&out, c->minor);
    }
    front_send(c->g->f, c->token, &out, 1, NULL);
    http_buf_free(&out);
}

/* A response: one chunk to the front. Gateway thread. */
static void stream_response(gw_call *c, grpc_byte_buffer *bb)
{
    gw_stream *st = c->st;
    char *json = response_json(c->rt->resp, bb);
    if (!json) {
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_INTERNAL, "cannot encode the answer",
                                     NULL);
        return;
    }
    http_buf out = {0};
    if (!st->head_sent) {
        /* etcd: grpc-gateway forwards the call's metadata */
        http_stream_head(&out, c->minor, 200, "application/json",
                         "Grpc-Metadata-Content-Type: application/grpc\r\n", c->close);
        st->head_sent = 1;
    }
    http_buf body = {0};
    http_buf_printf(&body, "{\"result\":%s}\n", json);
    free(json);
    http_chunk(&out, c->minor, body.data, body.len);
    http_buf_free(&body);
    atomic_fetch_add(&st->fl.unsent, out.len);
    front_send(c->g->f, c->token, &out, 0, NULL);
    http_buf_free(&out);
}

static void stream_event(gw_tag *t, int ok)
{
    gw_call *c = t->c;
    gw_stream *st = c->st;
    gateway *g = c->g;
    grpc_byte_buffer *bb = NULL;
    if (t->kind == T_RECV) {
        bb = c->recv;
        c->recv = NULL;
        if (ok && bb && !atomic_load(&st->fl.closed)) {
            if (c->rt->kind == UNARY_WAIT) {
                if (!st->answer) {
                    st->answer = bb; /* answered whole by stream_finish */
                    bb = NULL;
                }
            } else
                stream_response(c, bb);
        }
    }
    pthread_mutex_lock(&g->mu);
    st->outstanding--;
    if (t->kind == T_SEND && ok && !st->ended)
        post_send(c);
    else if (t->kind == T_RECV && c->rt->kind == UNARY_WAIT) {
        /* one answer: nothing more to read; the status follows */
    } else if (t->kind == T_RECV && bb && !atomic_load(&st->fl.closed)) {
        if (atomic_load(&st->fl.unsent) >= GATEWAY_STREAM_HIGH)
            st->stalled = 1; /* flow_wake goes on */
        else
            post_recv(c, 0);
    } else if (t->kind == T_STATUS) {
        go_deadline_text(c);
        st->ended = 1;
    }
    /* a stalled stream's responses are still to be read, unless no one is
     * there to read them */
    int finish = st->ended && st->outstanding == 0 && !st->finishing &&
                 (!st->stalled || atomic_load(&st->fl.closed));
    if (finish)
        st->finishing = 1;
    pthread_mutex_unlock(&g->mu);
    if (bb)
        grpc_byte_buffer_destroy(bb);
    if (!finish)
        return;
    stream_finish(c);
    /* |finished| is set last, in the same hold of the lock as the check,
     * so that this thread or flow_release frees the call, once */
    pthread_mutex_lock(&g->mu);
    st->finished = 1;
    int over = stream_over(st);
    pthread_mutex_unlock(&g->mu);
    if (over)
        call_done(g, c);
}

static void *gateway_main(void *arg)
{
    gateway *g = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        gw_tag *t = ev.tag;
        if (t->kind != T_UNARY) {
            stream_event(t, ev.success);
            continue;
        }
        go_deadline_text(t->c);
        answer_call(t->c, ev.success);
        call_done(g, t->c);
    }
    return NULL;
}

int gateway_start(gateway *g)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        return CAIRN_EIO;
    rpc_engine_adopt_fd(g->rpc, sv[0]);
    grpc_arg args[2];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = -1;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = -1;
    grpc_channel_args cargs = {2, args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    g->ch = grpc_channel_create_from_fd("cairn-gateway", sv[1], creds, &cargs);
    grpc_channel_credentials_release(creds);
    /* Not polling: a thread waiting in grpc_completion_queue_next on a
     * polling queue is one of gRPC's pollers (epoll1 polls one epoll set
     * for every fd) and takes client connections' I/O, handing each request
     * on to a worker with a wakeup; the workers poll this channel's socket
     * as well. */
    grpc_completion_queue_attributes qa = {GRPC_CQ_CURRENT_VERSION, GRPC_CQ_NEXT,
                                           GRPC_CQ_NON_POLLING, NULL};
    g->cq = grpc_completion_queue_create(grpc_completion_queue_factory_lookup(&qa), &qa, NULL);
    if (!g->ch || !g->cq)
        return CAIRN_EIO;
    if (pthread_create(&g->thread, NULL, gateway_main, g) != 0)
        return CAIRN_ENOMEM;
    g->running = 1;
    return 0;
}

int gateway_path(const http_request *r)
{
    return (r->path_len >= 4 && memcmp(r->path, "/v3/", 4) == 0) ||
           (r->path_len >= 8 && memcmp(r->path, "/v3beta/", 8) == 0);
}

/* Go's http.Error, as grpc-gateway's mux answers unknown paths and
 * methods */
static void text_error(http_buf *out, const http_request *r, int status, const char *text)
{
    http_buf body = {0};
    http_buf_printf(&body, "%s\n", text);
    http_answer(out, r->minor, status, "text/plain; charset=utf-8",
                "X-Content-Type-Options: nosniff\r\n", body.data, body.len, !r->keep_alive);
    http_buf_free(&body);
}

static void call_init(gw_call *c, gateway *g, const route *rt, const http_request *r,
                      uint64_t token)
{
    c->g = g;
    c->rt = rt;
    c->token = token;
    c->minor = r->minor;
    c->close = !r->keep_alive;
    c->tunary.c = c;
    grpc_metadata_array_init(&c->md);
    grpc_metadata_array_init(&c->trailing);
    c->details = grpc_empty_slice();
}

/* The body's JSON requests as protobuf messages into |st|: 0; or, if the
 * first does not parse, CAIRN_EINVAL with etcd's message in |err| (a
 * later one ends the list, as etcd's gateway stops sending there). */
static int stream_requests(gw_stream *st, const route *rt, const http_request *r, char *err,
                           size_t errlen)
{
    const char *p = (const char *)r->body;
    size_t left = r->body_len;
    if (rt->kind == UNARY_WAIT || rt->kind == SERVER_STREAM) {
        /* one request, decoded as a unary call's */
        wire_wr w = {0};
        int rc = pbjson_decode(&w, rt->req, p, left, err, errlen);
        if (rc == 0 && !(st->reqs = malloc(sizeof *st->reqs)))
            rc = CAIRN_ENOMEM;
        if (rc == 0) {
            grpc_slice s = grpc_slice_from_copied_buffer((const char *)w.p, w.len);
            st->reqs[st->nreqs++] = grpc_raw_byte_buffer_create(&s, 1);
            grpc_slice_unref(s);
        }
        free(w.p);
        return rc;
    }
    while (st->nreqs < GATEWAY_STREAM_MAX_REQS) {
        wire_wr w = {0};
        size_t used;
        int rc = pbjson_decode_next(&w, &used, rt->req, p, left, err, errlen);
        if (rc != 0) {
            free(w.p);
            if (rc == CAIRN_ENOMEM)
                return rc;
            return rc == PBJSON_END || st->nreqs > 0 ? 0 : rc;
        }
        if (st->nreqs % 16 == 0) {
            grpc_byte_buffer **q = realloc(st->reqs, (st->nreqs + 16) * sizeof *q);
            if (!q) {
                free(w.p);
                return CAIRN_ENOMEM;
            }
            st->reqs = q;
        }
        grpc_slice s = grpc_slice_from_copied_buffer((const char *)w.p, w.len);
        free(w.p);
        st->reqs[st->nreqs++] = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        p += used;
        left -= used;
    }
    return 0;
}

static int stream_start(gateway *g, const route *rt, const http_request *r, http_buf *out,
                        uint64_t token, int64_t timeout_ns)
{
    gw_call *c = calloc(1, sizeof *c);
    gw_stream *st = calloc(1, sizeof *st);
    if (!c || !st) {
        free(c);
        free(st);
        static const char m[] = "out of memory";
        json_error(out, r->minor, !r->keep_alive, GRPC_STATUS_RESOURCE_EXHAUSTED, m, sizeof m - 1);
        return 0;
    }
    call_init(c, g, rt, r, token);
    c->st = st;
    st->tsend = (gw_tag){c, T_SEND};
    st->trecv = (gw_tag){c, T_RECV};
    st->tstatus = (gw_tag){c, T_STATUS};
    st->fl.wake_cb = flow_wake;
    st->fl.release_cb = flow_release;
    st->fl.close_at_end = r->minor < 1 && rt->kind != UNARY_WAIT;
    char err[256];
    int rc = stream_requests(st, rt, r, err, sizeof err);
    if (rc != 0) {
        call_free(c);
        /* etcd: the stream's decoder fails with a plain error: Unknown,
         * 500; a unary request's is InvalidArgument, 400 */
        if (rc == CAIRN_ENOMEM)
            snprintf(err, sizeof err, "out of memory");
        int single = rt->kind == UNARY_WAIT || rt->kind == SERVER_STREAM;
        json_error(out, r->minor, !r->keep_alive,
                   rc == CAIRN_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                   : single           ? GRPC_STATUS_INVALID_ARGUMENT
                                      : GRPC_STATUS_UNKNOWN,
                   err, strlen(err));
        return 0;
    }
    grpc_slice method = grpc_slice_from_static_string(rt->method);
    c->call = grpc_channel_create_call(g->ch, NULL, GRPC_PROPAGATE_DEFAULTS, g->cq, method, NULL,
                                       call_deadline(timeout_ns, gpr_inf_future(GPR_CLOCK_REALTIME)),
                                       NULL);
    if (!c->call) {
        call_free(c);
        static const char m[] = "cannot start the gateway call";
        json_error(out, r->minor, !r->keep_alive, GRPC_STATUS_INTERNAL, m, sizeof m - 1);
        return 0;
    }
    /* the front learns of the stream first, so that a client that goes
     * away before any response cancels it */
    st->front_ref = 1;
    pthread_mutex_lock(&g->mu);
    g->inflight++;
    pthread_mutex_unlock(&g->mu);
    http_buf none = {0};
    front_send(g->f, token, &none, 0, &st->fl);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &c->trailing;
    op.data.recv_status_on_client.status = &c->status;
    op.data.recv_status_on_client.status_details = &c->details;
    pthread_mutex_lock(&g->mu);
    if (grpc_call_start_batch(c->call, &op, 1, &st->tstatus, NULL) != GRPC_CALL_OK) {
        /* not pending after all: the front gives the flow back, which
         * frees the call */
        st->ended = st->finishing = st->finished = 1;
        pthread_mutex_unlock(&g->mu);
        static const char m[] = "cannot start the gateway call";
        json_error(out, r->minor, !r->keep_alive, GRPC_STATUS_INTERNAL, m, sizeof m - 1);
        return 0;
    }
    st->outstanding++;
    post_send(c);
    post_recv(c, 1);
    pthread_mutex_unlock(&g->mu);
    return FRONT_PENDING;
}

int gateway_serve(gateway *g, const http_request *r, http_buf *out, uint64_t token)
{
    const char *p = r->path + 3;
    size_t n = r->path_len - 3;
    if (n >= 5 && memcmp(p, "beta/", 5) == 0) {
        p += 4;
        n -= 4;
    }
    const route *rt = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !rt; i++)
        if (strlen(routes[i].path) == n && memcmp(routes[i].path, p, n) == 0)
            rt = &routes[i];
    if (!rt) {
        text_error(out, r, 404, "Not Found");
        return 0;
    }
    if (!http_method_is(r, "POST")) {
        text_error(out, r, 405, "Method Not Allowed");
        return 0;
    }
    if (!g->running) {
        static const char m[] = "the gateway is not running";
        json_error(out, r->minor, !r->keep_alive, GRPC_STATUS_UNAVAILABLE, m, sizeof m - 1);
        return 0;
    }
    int64_t tmo;
    if (grpc_timeout_ns(r, &tmo) != 0) {
        char m[256];
        int l = snprintf(m, sizeof m, "invalid grpc-timeout: %.*s",
                         (int)(r->grpc_timeout_len > 200 ? 200 : r->grpc_timeout_len),
                         r->grpc_timeout);
        json_error(out, r->minor, !r->keep_alive, GRPC_STATUS_INVALID_ARGUMENT, m, (size_t)l);
        return 0;
    }
    if (rt->kind != UNARY)
        return stream_start(g, rt, r, out, token, tmo);
    wire_wr w = {0};
    char err[256];
    int rc = pbjson_decode(&w, rt->req, (const char *)r->body, r->body_len, err, sizeof err);
    if (rc != 0) {
        free(w.p);
        if (rc == CAIRN_ENOMEM)
            snprintf(err, sizeof err, "out of memory");
        json_error(out, r->minor, !r->keep_alive,
                   rc == CAIRN_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                      : GRPC_STATUS_INVALID_ARGUMENT,
                   err, strlen(err));
        return 0;
    }
    gw_call *c = calloc(1, sizeof *c);
    if (!c) {
        free(w.p);
        static const char m[] = "out of memory";
        json_error(out, r->minor, !r->keep_alive, GRPC_STATUS_RESOURCE_EXHAUSTED, m, sizeof m - 1);
        return 0;
    }
    call_init(c, g, rt, r, token);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)w.p, w.len);
    free(w.p);
    c->send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    gpr_timespec deadline = call_deadline(
        tmo, gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                          gpr_time_from_seconds(GATEWAY_DEADLINE_S, GPR_TIMESPAN)));
    grpc_slice method = grpc_slice_from_static_string(rt->method);
    c->call = grpc_channel_create_call(g->ch, NULL, GRPC_PROPAGATE_DEFAULTS, g->cq, method, NULL,
                                       deadline, NULL);
    grpc_op ops[6];
    rpc_unary_ops(ops, c->send, &c->md, &c->recv, &c->trailing, &c->status, &c->details);
    pthread_mutex_lock(&g->mu);
    g->inflight++;
    pthread_mutex_unlock(&g->mu);
    if (!c->call || grpc_call_start_batch(c->call, ops, 6, &c->tunary, NULL) != GRPC_CALL_OK) {
        pthread_mutex_lock(&g->mu);
        g->inflight--;
        pthread_mutex_unlock(&g->mu);
        call_free(c);
        static const char m[] = "cannot start the gateway call";
        json_error(out, r->minor, !r->keep_alive, GRPC_STATUS_INTERNAL, m, sizeof m - 1);
        return 0;
    }
    return FRONT_PENDING;
}

void gateway_stop(gateway *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    while (g->inflight > 0)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    if (g->ch) {
        grpc_channel_destroy(g->ch);
        g->ch = NULL;
    }
    if (g->cq) {
        grpc_completion_queue_shutdown(g->cq);
        if (g->running) {
            pthread_join(g->thread, NULL);
            g->running = 0;
        } else
            while (
                grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
                GRPC_QUEUE_SHUTDOWN)
                ;
        grpc_completion_queue_destroy(g->cq);
        g->cq = NULL;
    }
}

void gateway_free(gateway *g)
{
    if (!g)
        return;
    gateway_stop(g);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}
