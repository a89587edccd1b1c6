#ifndef CAIRN_SERVER_RPC_H
#define CAIRN_SERVER_RPC_H

/*
 * Internal to server/: one gRPC call in flight and the helpers the service
 * files (kv.c, maintenance.c, snapshot.c) use to answer it. The engine
 * (grpc.c) owns the call; a handler must end every call exactly once, with
 * rpc_reply (a message and status OK), rpc_fail (the single exit for
 * errors), or, for server-streaming calls, rpc_stream_send ... rpc_reply.
 *
 * A handler may answer later from another thread (the store's completion
 * callback): grpc_call_start_batch is thread-safe. The call stays alive
 * until it is answered.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "etcdserverpb/rpc.pb-c.h"
#include "server/server.h"
#include "store/store.h"

typedef struct rpc_call rpc_call;
typedef struct snapshot_stream snapshot_stream;

/* A second completion tag for a call that has several operations in
 * flight at once (a Watch stream receives and sends concurrently). Its
 * first member matches rpc_call's, so the engine tells them apart. */
typedef struct rpc_side {
    int state; /* RPC_SIDE_STATE */
    void (*fn)(void *arg, int ok);
    void *arg;
} rpc_side;
#define RPC_SIDE_STATE 99

/* Server streaming: called (on a worker) when a message sent with
 * rpc_stream_send is on the wire (ok = 1) or the call died (ok = 0). */
typedef void (*rpc_next_fn)(rpc_call *c, int ok);

/* Handles one request: |req|, |len| are the request bytes (borrowed for the
 * duration of the handler). */
typedef void (*rpc_handler_fn)(rpc_call *c, const uint8_t *req, size_t len);

enum { RPC_UNARY = 0, RPC_SERVER_STREAM = 1, RPC_BIDI = 2 };

typedef struct rpc_method {
    const char *path; /* "/etcdserverpb.KV/Put" */
    int kind;         /* RPC_* */
    rpc_handler_fn fn;
    /* etcd: whether etcd checks --max-request-bytes on this request (it
     * does for every request that goes through raft: writes). */
    int size_checked;
    int slots; /* requests kept posted per worker */
} rpc_method;

/* An etcd alarm (AlarmMember). */
typedef struct rpc_alarm {
    uint64_t member_id;
    int type; /* etcdserverpb AlarmType */
} rpc_alarm;

struct cairn_server {
    const cairn_config *cfg;
    cairn_store *store;
    grpc_server *grpc;
    int *ports;
    size_t nports;
    struct rpc_worker *workers;
    int nworkers;
    void **registered; /* one handle per method of rpc_methods */
    atomic_int stopping;
    int started;

    /* shutdown notification */
    pthread_mutex_t shut_mu;
    pthread_cond_t shut_cv;
    int shut_done;

    /* alarms (etcd keeps them in its backend; cairn in memory) */
    pthread_mutex_t alarm_mu;
    rpc_alarm *alarms;
    size_t nalarms;
    atomic_int nospace; /* a NOSPACE alarm is active */
    int64_t quota;      /* bytes; < 0 = no quota */
    atomic_uint_least64_t disk_bytes;
    atomic_uint_least64_t disk_checked_ms;

    struct watch_hub *watch;    /* watch.c */
    struct kv_batcher *batcher; /* kv.c; NULL unless --experimental-batch-writes */
    char shutdown_tag; /* its address is the shutdown notification's tag */
    int64_t live_calls; /* accepted and not yet freed (shut_mu) */
};

/* Bytes per call for decoding its request without malloc (a Range takes
 * about 120 of them). With them an rpc_call stays under 1 KiB, so that
 * glibc serves it from its per-thread cache (up to 1032 bytes): past
 * that, a malloc costs more than the arena saves. */
#define RPC_UNPACK_MEM 608

struct rpc_call {
    int state; /* grpc.c's */
    cairn_server *srv;
    struct rpc_worker *w;
    int method; /* index into rpc_methods; -1 = unregistered */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
    grpc_call_details details; /* unregistered calls only */
    int cancelled;             /* from RECV_CLOSE_ON_SERVER */
    int sent_initial_md;
    grpc_slice status_details;
    grpc_byte_buffer *send;

    /* The request's bytes (a unary call's payload as one slice, referenced
     * rather than copied when it arrived in one piece); kept until the call
     * ends, so a handler may leave pointers into them with the store. */
    grpc_slice req_bytes;

    /* handler scratch: freed by the engine when the call ends */
    ProtobufCMessage *req_msg;
    /* protobuf-c's allocations for req_msg come from |unpack_mem| while
     * they fit (bump allocation; freeing them is a no-op), else from
     * malloc; |unpack_spilled| counts the latter, and only then is req_msg
     * walked by protobuf_c_message_free_unpacked. */
    ProtobufCAllocator unpack_alloc;
    size_t unpack_used;
    size_t unpack_spilled;
    void *scratch;                      /* free()d */
    void (*cleanup)(rpc_call *c);       /* called first, if set */
    union {
        cairn_put_resp put;
        cairn_delete_resp del;
        cairn_txn_resp txn;
    } resp;
    int live;          /* counted in srv->live_calls */
    snapshot_stream *snap;
    rpc_next_fn next;

    /* Last, and not zeroed when the call is made (see post in grpc.c). */
    _Alignas(16) unsigned char unpack_mem[RPC_UNPACK_MEM];
};

extern const rpc_method rpc_methods[];
extern const size_t rpc_nmethods;

/* Sends |msg| (packed here; NULL: none, as a stream ends) with status OK
 * and ends the call. */
void rpc_reply(rpc_call *c, const ProtobufCMessage *msg);
/* The one exit for errors: sends |rc|'s gRPC status and message from
 * CAIRN_ERRORS (|detail|, when not NULL, replaces the message: for texts
 * that carry a value, like grpc-go's size errors) and ends the call. */
void rpc_fail(rpc_call *c, int rc, const char *detail);
/* Server streaming: sends one message; |next| follows (see rpc_next_fn). */
void rpc_stream_send(rpc_call *c, const ProtobufCMessage *msg, rpc_next_fn next);

/* Bidi streaming: receives the next message into c->payload (NULL when the
 * client has closed its side); |next| follows. */
void rpc_stream_recv(rpc_call *c, rpc_next_fn next);
/* Starts |ops| on c's call with |tag| as the completion tag. */
int rpc_side_batch(rpc_call *c, const grpc_op *ops, size_t n, rpc_side *tag);

/* Sends a response whose only field is the header (field 1 of every etcd
 * response), packed here without protobuf-c, with status OK, and ends the
 * call. The bytes are protobuf-c's for the same message. */
void rpc_reply_header_only(rpc_call *c, const Etcdserverpb__ResponseHeader *h);
/* Those bytes into |out|; returns their length. */
#define RPC_HEADER_ONLY_MAX 46
size_t rpc_pack_header_only(uint8_t out[RPC_HEADER_ONLY_MAX], const Etcdserverpb__ResponseHeader *h);

/* |msg| serialised into a new byte buffer (the caller owns it). */
grpc_byte_buffer *rpc_pack(const ProtobufCMessage *msg);

/* Takes c->payload as one malloc()ed buffer (*out, *len), applying the
 * message size limit. CAIRN_EMSGTOOLARGE / CAIRN_ENOMEM / CAIRN_EUNMARSHAL. */
int rpc_payload_take(rpc_call *c, uint8_t **out, size_t *len);

/* Unpacks |len| bytes of |desc| into c->req_msg (freed with the call).
 * Returns NULL and fails the call (CAIRN_EUNMARSHAL) on bad bytes. */
ProtobufCMessage *rpc_unpack(rpc_call *c, const ProtobufCMessageDescriptor *desc,
                             const uint8_t *req, size_t len);

/* Fills a protobuf ResponseHeader from the store's (|h| NULL: current). */
void rpc_header(cairn_server *srv, Etcdserverpb__ResponseHeader *out, const cairn_header *h);

/* etcd's quota: CAIRN_ENOSPACE if a NOSPACE alarm is active or this write
 * of about |cost| bytes would pass --quota-backend-bytes (which raises the
 * alarm, as etcd does). 0 otherwise. */
int rpc_quota_check(cairn_server *srv, uint64_t cost);
/* Raises (|on|) or clears an alarm; returns 1 if the set changed. */
int rpc_alarm_set(cairn_server *srv, uint64_t member, int type, int on);
/* Current backend size in bytes (cached for 100 ms unless |fresh|). */
uint64_t rpc_disk_bytes(cairn_server *srv, int fresh);

/* Handlers, by service file. */
void kv_range(rpc_call *c, const uint8_t *req, size_t len);
void kv_put(rpc_call *c, const uint8_t *req, size_t len);
void kv_delete_range(rpc_call *c, const uint8_t *req, size_t len);
void kv_txn(rpc_call *c, const uint8_t *req, size_t len);
void kv_compact(rpc_call *c, const uint8_t *req, size_t len);
/* The Put batcher of --experimental-batch-writes (benchmarks only; see
 * kv.c): made before the server serves, freed once no call is live. With
 * the flag off kv_batcher_new leaves srv->batcher NULL. */
int kv_batcher_new(cairn_server *srv);
void kv_batcher_free(cairn_server *srv);
void maint_status(rpc_call *c, const uint8_t *req, size_t len);
void maint_alarm(rpc_call *c, const uint8_t *req, size_t len);
void maint_defragment(rpc_call *c, const uint8_t *req, size_t len);
void maint_hash(rpc_call *c, const uint8_t *req, size_t len);
void maint_hash_kv(rpc_call *c, const uint8_t *req, size_t len);
void maint_move_leader(rpc_call *c, const uint8_t *req, size_t len);
void maint_snapshot(rpc_call *c, const uint8_t *req, size_t len);
void cluster_member_list(rpc_call *c, const uint8_t *req, size_t len);
void unimplemented(rpc_call *c, const uint8_t *req, size_t len);
void lease_grant(rpc_call *c, const uint8_t *req, size_t len);
void lease_revoke(rpc_call *c, const uint8_t *req, size_t len);
void lease_time_to_live(rpc_call *c, const uint8_t *req, size_t len);
void lease_leases(rpc_call *c, const uint8_t *req, size_t len);
void lease_keep_alive(rpc_call *c, const uint8_t *req, size_t len);

/* Watch (watch.c). The hub exists before the store opens (the store's
 * events callback feeds it) and after it closes. */
void watch_stream(rpc_call *c, const uint8_t *req, size_t len);
int watch_hub_new(cairn_server *srv);
/* Called once the store is open: the ring starts at its revision. */
void watch_hub_ready(cairn_server *srv);
/* Cancels every Watch stream (shutdown). */
void watch_hub_cancel_all(cairn_server *srv);
void watch_hub_free(cairn_server *srv);
void watch_events_cb(void *arg, int64_t rev, const cairn_hash *hash, const uint8_t *change,
                     size_t change_len, const cairn_event *ev, size_t nev);


/* Decodes and checks one request of |kind| (0 Range, 1 Put, 2 DeleteRange,
 * 3 Txn, 4 Compaction, 5 WatchRequest, 6 LeaseKeepAliveRequest) exactly as
 * the handlers do, without a store: for the fuzz target. 0 or the error
 * the client would get, or RPC_DECODE_DISAGREE (> 0, a bug) if kv_put's own
 * PutRequest decoder and protobuf-c's read the bytes differently. */
#define RPC_DECODE_DISAGREE 1
int rpc_decode_request(int kind, const uint8_t *req, size_t len, uint32_t max_txn_ops);

/* Converts a store KeyValue into protobuf (pointers borrowed from |kv|). */
void kv_to_pb(Mvccpb__KeyValue *out, const cairn_kv *kv);

/* crc32c (Castagnoli), etcd's hash for HashKV. */
uint32_t rpc_crc32c(uint32_t crc, const void *buf, size_t len);

/* Snapshot helpers (snapshot.c). */
void snapshot_stream_free(snapshot_stream *s);

#endif
