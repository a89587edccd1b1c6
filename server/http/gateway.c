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
 */
#include "server/http/gateway.h"

#include "crdt/error.h"
#include "etcdserverpb/rpc.pb-c.h"
#include "server/http/front.h"
#include "server/http/json.h"
#include "server/rpc/rpc.h"
#include "server/server.h"

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

/* A gateway call that takes longer is answered DeadlineExceeded (504). */
#define GATEWAY_DEADLINE_S 60

typedef struct route {
    const char *path; /* after /v3 */
    const char *method;
    const ProtobufCMessageDescriptor *req, *resp;
} route;

/* etcd 3.4's rpc.proto google.api.http bindings */
static const route routes[] = {
    {"/kv/range", "/etcdserverpb.KV/Range", &etcdserverpb__range_request__descriptor,
     &etcdserverpb__range_response__descriptor},
    {"/kv/put", "/etcdserverpb.KV/Put", &etcdserverpb__put_request__descriptor,
     &etcdserverpb__put_response__descriptor},
    {"/kv/deleterange", "/etcdserverpb.KV/DeleteRange",
     &etcdserverpb__delete_range_request__descriptor,
     &etcdserverpb__delete_range_response__descriptor},
    {"/kv/txn", "/etcdserverpb.KV/Txn", &etcdserverpb__txn_request__descriptor,
     &etcdserverpb__txn_response__descriptor},
    {"/kv/compaction", "/etcdserverpb.KV/Compact", &etcdserverpb__compaction_request__descriptor,
     &etcdserverpb__compaction_response__descriptor},
    {"/lease/grant", "/etcdserverpb.Lease/LeaseGrant",
     &etcdserverpb__lease_grant_request__descriptor,
     &etcdserverpb__lease_grant_response__descriptor},
    {"/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke",
     &etcdserverpb__lease_revoke_request__descriptor,
     &etcdserverpb__lease_revoke_response__descriptor},
    {"/kv/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke",
     &etcdserverpb__lease_revoke_request__descriptor,
     &etcdserverpb__lease_revoke_response__descriptor},
    {"/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive",
     &etcdserverpb__lease_time_to_live_request__descriptor,
     &etcdserverpb__lease_time_to_live_response__descriptor},
    {"/kv/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive",
     &etcdserverpb__lease_time_to_live_request__descriptor,
     &etcdserverpb__lease_time_to_live_response__descriptor},
    {"/lease/leases", "/etcdserverpb.Lease/LeaseLeases",
     &etcdserverpb__lease_leases_request__descriptor,
     &etcdserverpb__lease_leases_response__descriptor},
    {"/kv/lease/leases", "/etcdserverpb.Lease/LeaseLeases",
     &etcdserverpb__lease_leases_request__descriptor,
     &etcdserverpb__lease_leases_response__descriptor},
    {"/maintenance/status", "/etcdserverpb.Maintenance/Status",
     &etcdserverpb__status_request__descriptor, &etcdserverpb__status_response__descriptor},
    {"/maintenance/alarm", "/etcdserverpb.Maintenance/Alarm",
     &etcdserverpb__alarm_request__descriptor, &etcdserverpb__alarm_response__descriptor},
    {"/cluster/member/list", "/etcdserverpb.Cluster/MemberList",
     &etcdserverpb__member_list_request__descriptor,
     &etcdserverpb__member_list_response__descriptor},
};

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
} gw_call;

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
        ProtobufCMessage *m = NULL;
        if (c->recv) {
            grpc_byte_buffer_reader rd;
            if (grpc_byte_buffer_reader_init(&rd, c->recv)) {
                grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
                grpc_byte_buffer_reader_destroy(&rd);
                m = protobuf_c_message_unpack(c->rt->resp, NULL, GRPC_SLICE_LENGTH(s),
                                              GRPC_SLICE_START_PTR(s));
                grpc_slice_unref(s);
            }
        }
        char *json = m ? pbjson_encode(m) : NULL;
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
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

static void call_free(gw_call *c)
{
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

static void *gateway_main(void *arg)
{
    gateway *g = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        gw_call *c = ev.tag;
        answer_call(c, ev.success);
        call_free(c);
        pthread_mutex_lock(&g->mu);
        if (--g->inflight == 0)
            pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
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
    c->g = g;
    c->rt = rt;
    c->token = token;
    c->minor = r->minor;
    c->close = !r->keep_alive;
    grpc_metadata_array_init(&c->md);
    grpc_metadata_array_init(&c->trailing);
    c->details = grpc_empty_slice();
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)w.p, w.len);
    free(w.p);
    c->send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                         gpr_time_from_seconds(GATEWAY_DEADLINE_S, GPR_TIMESPAN));
    grpc_slice method = grpc_slice_from_static_string(rt->method);
    c->call = grpc_channel_create_call(g->ch, NULL, GRPC_PROPAGATE_DEFAULTS, g->cq, method, NULL,
                                       deadline, NULL);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = c->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &c->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &c->trailing;
    ops[5].data.recv_status_on_client.status = &c->status;
    ops[5].data.recv_status_on_client.status_details = &c->details;
    pthread_mutex_lock(&g->mu);
    g->inflight++;
    pthread_mutex_unlock(&g->mu);
    if (!c->call || grpc_call_start_batch(c->call, ops, 6, c, NULL) != GRPC_CALL_OK) {
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
