#ifndef CAIRN_SERVER_RPC_H
#define CAIRN_SERVER_RPC_H

/*
 * Internal to server/: the gRPC engine (rpc/engine.c) and one call in
 * flight. The engine knows no service: a service registers a table of
 * methods with rpc_engine_add, and the engine hands each call of them to
 * its handler with the argument given at registration (rpc_call.arg). A
 * handler must end every call exactly once, with rpc_reply (a message and
 * status OK), rpc_fail (the single exit for errors), or, for streaming
 * calls, rpc_stream_send / rpc_stream_recv ... rpc_reply.
 *
 * A handler may answer later from another thread (the store's completion
 * callback): grpc_call_start_batch is thread-safe. The call stays alive
 * until it is answered. Per-call state of a service lives in |scratch|
 * (zeroed, RPC_CALL_SCRATCH bytes, no malloc) or in a context of its own
 * (|ctx|), which the engine hands to |ctx_free| when the call ends.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

typedef struct rpc_call rpc_call;
typedef struct rpc_engine rpc_engine;

/* A second completion tag for a call that has several operations in
 * flight at once (a Watch stream receives and sends concurrently). Its
 * first member matches rpc_call's, so the engine tells them apart. */
typedef struct rpc_side {
    int state; /* RPC_SIDE_STATE */
    void (*fn)(void *arg, int ok);
    void *arg;
} rpc_side;
#define RPC_SIDE_STATE 99
#define RPC_CLOSE_STATE 98

/* Streaming: called (on a worker) when a message sent with rpc_stream_send
 * is on the wire, or one asked for with rpc_stream_recv arrived (ok = 1),
 * or the call died (ok = 0). */
typedef void (*rpc_next_fn)(rpc_call *c, int ok);

/* Handles one request: |req|, |len| are the request bytes (borrowed until
 * the call ends). Bidi methods get none: they read with rpc_stream_recv. */
typedef void (*rpc_handler_fn)(rpc_call *c, const uint8_t *req, size_t len);

enum { RPC_UNARY = 0, RPC_SERVER_STREAM = 1, RPC_BIDI = 2 };

typedef struct rpc_method {
    const char *path; /* "/etcdserverpb.KV/Put" */
    int kind;         /* RPC_* */
    rpc_handler_fn fn;
    int slots; /* requests kept posted per worker */
    /* The request's type, for the service's admit hook (NULL: not said). */
    const ProtobufCMessageDescriptor *req;
} rpc_method;

/* Decides, before the handler runs, whether a call of the service is
 * served at all (grpc-go's interceptors): 0 lets it in; anything else is
 * the CAIRN_E* code the engine fails it with, and its handler never runs.
 * When grpc-go runs them: a unary call's once its request is read and
 * decoded (|req|, |len|: its bytes, past the receive limit; the hook
 * judges whether they decode, if that matters to what it answers), a
 * stream's before anything is read (|req| NULL). On the call's worker. */
typedef int (*rpc_admit_fn)(rpc_call *c, const uint8_t *req, size_t len);

/* A service: its methods, an optional hook called once when the engine
 * stops accepting calls (so that long-lived streams can end), and an
 * optional admit hook. The table is borrowed and must outlive the
 * engine. */
typedef struct rpc_service {
    const char *name; /* "etcdserverpb.KV": for grpc-go's "unknown method" */
    const rpc_method *methods;
    size_t nmethods;
    void (*stopping)(void *arg);
    rpc_admit_fn admit;
} rpc_service;

/* Bytes per call for decoding its request without malloc (a Range takes
 * about 120 of them). With them an rpc_call stays under 1 KiB, so that
 * glibc serves it from its per-thread cache (up to 1032 bytes): past
 * that, a malloc costs more than the arena saves. */
#define RPC_UNPACK_MEM 608
/* Bytes of per-call service state kept in the call itself (a KV write's
 * response from the store). */
#define RPC_CALL_SCRATCH 64

struct rpc_call {
    int state; /* engine.c's */
    int entry; /* engine.c's: the registered method's index; -1 = unregistered */
    rpc_engine *e;
    struct rpc_worker *w;
    const rpc_method *method; /* NULL: unregistered */
    void *arg;                /* the service's, from rpc_engine_add */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
    int cancelled; /* from RECV_CLOSE_ON_SERVER */
    /* rpc_notify_close's: RPC_CLOSE_STATE while its op is in flight (the
     * field's address is that op's tag), then 0; |done_seen|: the status
     * batch completed first, so the call is freed when the close is. */
    int close_state;
    int done_seen;
    int close_code, final_status; /* handled as: cancelled ? close_code : final_status */
    void (*on_close)(rpc_call *c);
    int sent_initial_md;
    int live;   /* counted in the engine's live calls */
    int end_rc; /* rpc_fail_on_end's */
    const char *end_detail;
    grpc_slice status_details;
    grpc_byte_buffer *send;
    rpc_next_fn next;
    /* rpc_later's: queued on the call's worker */
    struct rpc_call *later_next;
    void (*later_fn)(struct rpc_call *c, int rc);
    int later_rc;

    /* The request's bytes (a unary call's payload as one slice, referenced
     * rather than copied when it arrived in one piece); kept until the call
     * ends, so a handler may leave pointers into them with the store. */
    grpc_slice req_bytes;

    /* protobuf-c's allocations for req_msg come from |unpack_mem| while
     * they fit (bump allocation; freeing them is a no-op), else from
     * malloc; |unpack_spilled| counts the latter, and only then is req_msg
     * walked by protobuf_c_message_free_unpacked. */
    ProtobufCMessage *req_msg;
    ProtobufCAllocator unpack_alloc;
    size_t unpack_used;
    size_t unpack_spilled;

    /* The service's: |ctx| is handed to |ctx_free| (if set) when the call
     * ends; |scratch| is zeroed when the call is made. An unregistered
     * call has no service, and its method's name in |details| instead. */
    void *ctx;
    void (*ctx_free)(rpc_call *c);
    union {
        _Alignas(16) unsigned char scratch[RPC_CALL_SCRATCH];
        grpc_call_details details;
    };

    /* Last, and not zeroed when the call is made (see post in engine.c). */
    _Alignas(16) unsigned char unpack_mem[RPC_UNPACK_MEM];
};

/* ---- the engine ---------------------------------------------------------- */

typedef struct rpc_engine_options {
    int threads; /* workers, each with its own completion queue; 0 = one per core */
    /* etcd: grpc-go's receive limit (--max-request-bytes + 512 KiB): a
     * bigger request fails with RESOURCE_EXHAUSTED before its handler. */
    uint64_t max_recv_bytes;
    /* etcd's --grpc-keepalive-min-time, -interval, -timeout (ms) and
     * --max-concurrent-streams, with etcd's meaning: a value etcd would
     * not give grpc-go (0 or less; no stream limit past INT32_MAX, or 0)
     * leaves gRPC's default, which is grpc-go's. */
    int64_t keepalive_min_time_ms, keepalive_interval_ms, keepalive_timeout_ms;
    uint64_t max_concurrent_streams;
} rpc_engine_options;

/* Calls grpc_init (rpc_engine_free the matching grpc_shutdown). */
int rpc_engine_new(rpc_engine **out, const rpc_engine_options *o);
/* Registers |svc|'s methods, handled with |arg|; before rpc_engine_start. */
int rpc_engine_add(rpc_engine *e, const rpc_service *svc, void *arg);
/* Listens on |addr| ("127.0.0.1:2379"); the port bound, 0 on failure. */
int rpc_engine_listen(rpc_engine *e, const char *addr);
/* Serves gRPC on the connected socket |fd| (its HTTP/2 preface unread),
 * which gRPC owns from here: the front listener (http/front.c) hands over
 * the client URLs' connections this way. After rpc_engine_start. */
void rpc_engine_adopt_fd(rpc_engine *e, int fd);
/* Starts the workers; calls are served from here on. */
int rpc_engine_start(rpc_engine *e);
int rpc_engine_workers(const rpc_engine *e);

/* gRPC's status codes, OK (0) to UNAUTHENTICATED (16). */
#define RPC_NCODES 17

/* Counts of one method since rpc_engine_start (grpc-go's
 * grpc_server_* metrics): calls started, calls ended with each status
 * code (the status cairn answered with; for a stream that asked
 * rpc_notify_close and was cancelled, its cancel code), messages and
 * their bytes both ways. */
typedef struct rpc_method_counts {
    const char *path; /* NULL: every unregistered method */
    int kind;         /* RPC_* */
    uint64_t started;
    uint64_t handled[RPC_NCODES];
    uint64_t msg_received, msg_sent;
    uint64_t bytes_received, bytes_sent;
} rpc_method_counts;

/* Fills up to |max| counts (one per registered method, then one for the
 * unregistered ones) and returns how many. Any thread; values are
 * relaxed reads, each consistent on its own. */
size_t rpc_engine_stats(const rpc_engine *e, rpc_method_counts *out, size_t max);
/* Stops accepting calls, calls every service's |stopping| hook, lets calls
 * in flight finish (cancelling those that take longer than |grace_ms|),
 * waits until every accepted call is freed and joins the workers. */
void rpc_engine_stop(rpc_engine *e, int grace_ms);
void rpc_engine_free(rpc_engine *e);

/* ---- answering ----------------------------------------------------------- */

/* Sends |msg| (packed here; NULL: none, as a stream ends) with status OK
 * and ends the call. */
void rpc_reply(rpc_call *c, const ProtobufCMessage *msg);
/* Sends |n| bytes already packed as the message, with status OK, and ends
 * the call. */
void rpc_reply_raw(rpc_call *c, const uint8_t *msg, size_t n);
/* The one exit for errors: sends |rc|'s gRPC status and message from
 * CAIRN_ERRORS (|detail|, when not NULL, replaces the message: for texts
 * that carry a value, like grpc-go's size errors) and ends the call. */
void rpc_fail(rpc_call *c, int rc, const char *detail);
/* A stream whose end is decided before it can be sent (a message is still
 * in flight): the rpc_reply(c, NULL) that ends it fails with |rc| and
 * |detail| (static, or NULL for the CAIRN_ERRORS text) instead. */
void rpc_fail_on_end(rpc_call *c, int rc, const char *detail);

/* Runs fn(c, rc) soon on |c|'s worker; callable from any thread (a store
 * callback on the completer). The answer then leaves from the thread that
 * reads the call's connection: a second thread writing to the connection
 * contends with it for the transport, and gRPC hands the contended work
 * to its executor thread, a thread hop per read. One wakeup of the worker
 * (an empty batch on its queue) carries every call queued before it runs. */
void rpc_later(rpc_call *c, void (*fn)(rpc_call *c, int rc), int rc);
/* Streaming: sends one message; |next| follows (see rpc_next_fn). */
void rpc_stream_send(rpc_call *c, const ProtobufCMessage *msg, rpc_next_fn next);
/* Bidi streaming: receives the next message into c->payload (NULL when the
 * client has closed its side); |next| follows. */
void rpc_stream_recv(rpc_call *c, rpc_next_fn next);
/* Starts |ops| on c's call with |tag| as the completion tag. */
int rpc_side_batch(rpc_call *c, const grpc_op *ops, size_t n, rpc_side *tag);
/* Streaming: |fn| runs on c's worker once the call is over — with
 * c->cancelled set when the client cancelled it, its deadline passed or
 * its connection broke before its status went out, else after the status
 * went out — so a stream that has stopped reading (the client
 * half-closed) still learns of its client's going. The engine keeps the
 * call until both that and its status batch completed (rpc_reply and
 * rpc_fail do not ask again), and only then counts it in
 * grpc_server_handled_total: with |cancel_code| (a gRPC status) if it was
 * cancelled, else with the status it was answered with. (gRPC completes
 * a receive on a cancelled call like a half-close, with no message: only
 * this tells them apart.) At most once per call, before it is answered. */
int rpc_notify_close(rpc_call *c, void (*fn)(rpc_call *c), int cancel_code);
/* Counts a message of |bytes| sent outside rpc_stream_send (a side batch)
 * in the method's grpc_server_msg_sent_total. */
void rpc_count_sent(rpc_call *c, size_t bytes);

/* |msg| serialised into a new byte buffer (the caller owns it). */
grpc_byte_buffer *rpc_pack(const ProtobufCMessage *msg);

/* Takes c->payload as one malloc()ed buffer (*out, *len), applying the
 * receive limit. CAIRN_EMSGTOOLARGE / CAIRN_ENOMEM / CAIRN_EUNMARSHAL. */
int rpc_payload_take(rpc_call *c, uint8_t **out, size_t *len);

/* Unpacks |len| bytes of |desc| into c->req_msg (freed with the call).
 * Returns NULL and fails the call (CAIRN_EUNMARSHAL) on bad bytes. */
ProtobufCMessage *rpc_unpack(rpc_call *c, const ProtobufCMessageDescriptor *desc,
                             const uint8_t *req, size_t len);

#endif
