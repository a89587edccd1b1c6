#ifndef CAIRN_SERVER_ETCD_H
#define CAIRN_SERVER_ETCD_H

/*
 * Internal to server/: etcd's v3 services, one file each (kv, watch, lease,
 * cluster, maintenance with its snapshot, auth, and recipes: v3lock and
 * v3election), each a table of methods
 * that server.c registers with the gRPC engine (rpc/rpc.h) with the node
 * (node.h) as their argument, and what they share (etcd.c): the response
 * header and etcd's size rules.
 */

#include <stddef.h>
#include <stdint.h>

#include "etcdserverpb/rpc.pb-c.h"
#include "server/node.h"
#include "server/rpc/rpc.h"
#include "store/store.h"

/* The node a call of an etcd service is served from. */
static inline cairn_server *etcd_node(const rpc_call *c)
{
    return (cairn_server *)c->arg;
}

/* ---- the services -------------------------------------------------------- */

extern const rpc_service etcd_kv_service;
extern const rpc_service etcd_watch_service;
extern const rpc_service etcd_lease_service;
extern const rpc_service etcd_cluster_service;
extern const rpc_service etcd_maintenance_service;
extern const rpc_service etcd_auth_service;
extern const rpc_service etcd_lock_service;     /* recipes.c */
extern const rpc_service etcd_election_service; /* recipes.c */

/* ---- shared (etcd.c) ----------------------------------------------------- */

/* etcd: grpc-go's receive limit is --max-request-bytes plus this. */
#define ETCD_GRPC_OVERHEAD_BYTES (512u * 1024u)

/* etcd: a request that goes through raft (a write) fails with "etcdserver:
 * request is too large" when its raft entry would pass --max-request-bytes
 * (measured: the entry is the request plus 17 bytes at these sizes). Fails
 * |c| and returns 1 if this |len|-byte request is such a write. */
int etcd_entry_too_large(rpc_call *c, size_t len);

/* etcd (grpc-go): a malformed message on a stream ends it with INTERNAL and
 * "grpc: failed to unmarshal the received message <proto's reason>" (a
 * unary call's says "grpc: error unmarshalling request: ..."). */
#define ETCD_STREAM_UNMARSHAL "grpc: failed to unmarshal the received message malformed message"

/* Fails |c| UNIMPLEMENTED with "cairn: <Method> is not supported<why>". */
void etcd_unsupported(rpc_call *c, const char *why);

/* The admit hook of every etcd service (rpc_admit_fn; cluster.c): etcd's
 * learner serves only serializable Range and Status; anything else fails
 * UNAVAILABLE "etcdserver: rpc not supported for learner" before its
 * handler runs. A Range is let in, for kv_range to decide. */
int etcd_admit(rpc_call *c, const uint8_t *req, size_t len);
/* For kv_range, once it read the request: fails |c| as etcd_admit would
 * and returns 1 if this member is a learner. */
int etcd_learner_refuses(rpc_call *c);
/* 1 if |len| bytes of |m|'s request decode as its handler decodes them
 * (kv.c: a Txn's nesting is bounded first), else 0; 1 when |m| names no
 * request type. */
int etcd_request_decodes(const rpc_method *m, const uint8_t *req, size_t len);
/* Fills a protobuf ResponseHeader from the store's (|h| NULL: current). */
void etcd_header(cairn_server *srv, Etcdserverpb__ResponseHeader *out, const cairn_header *h);
/* Sends a response whose only field is the header (field 1 of every etcd
 * response), packed here without protobuf-c, with status OK, and ends the
 * call. The bytes are protobuf-c's for the same message. */
void etcd_reply_header_only(rpc_call *c, const Etcdserverpb__ResponseHeader *h);
/* Those bytes into |out|; returns their length. */
#define ETCD_HEADER_ONLY_MAX 46
size_t etcd_pack_header_only(uint8_t out[ETCD_HEADER_ONLY_MAX],
                             const Etcdserverpb__ResponseHeader *h);

/* ---- KV (kv.c, kv_batch.c) ----------------------------------------------- */

/* Converts a store KeyValue into protobuf (pointers borrowed from |kv|). */
void kv_to_pb(Mvccpb__KeyValue *out, const cairn_kv *kv);

/* The Put batcher of --experimental-batch-writes (benchmarks only; see
 * kv_batch.c): made before the server serves, freed once no call is live.
 * With the flag off kv_batcher_new leaves srv->batcher NULL. */
int kv_batcher_new(cairn_server *srv);
void kv_batcher_free(cairn_server *srv);
/* Takes over |c|, a plain Put |r| (pointers into c's request): it joins a
 * batch and is answered when that is durable. */
void kv_batch_put(rpc_call *c, const cairn_put_req *r);

/* Decodes and checks one request of |kind| (0 Range, 1 Put, 2 DeleteRange,
 * 3 Txn, 4 Compaction, 5 WatchRequest, 6 LeaseKeepAliveRequest) exactly as
 * the handlers do, without a store: for the fuzz target. 0 or the error
 * the client would get, or ETCD_DECODE_DISAGREE (> 0, a bug) if kv_put's
 * own PutRequest decoder and protobuf-c's read the bytes differently. */
#define ETCD_DECODE_DISAGREE 1
int etcd_decode_request(int kind, const uint8_t *req, size_t len, uint32_t max_txn_ops);

/* ---- Watch (watch.c) ----------------------------------------------------- */

/* The hub (store/hub.h) exists before the store opens (it subscribes to
 * the store's events) and after it closes. */
int watch_hub_new(cairn_server *srv);
/* Called once the store is open: the ring starts at its revision. */
void watch_hub_ready(cairn_server *srv);
/* Cancels every Watch stream (shutdown: the service's stopping hook). */
void watch_hub_cancel_all(void *srv);
void watch_hub_free(cairn_server *srv);
/* The hub itself, for the recipes' waiters (recipes.c). */
struct cairn_hub *watch_hub_of(cairn_server *srv);
/* The store subscriber that feeds the hub (cairn_hub_events_cb with the
 * hub as its argument); valid once watch_hub_new succeeded. */
cairn_store_subscriber watch_hub_subscriber(cairn_server *srv);

/* ---- Maintenance (maintenance.c, snapshot.c) ----------------------------- */

/* crc32c (Castagnoli), etcd's hash for HashKV. */
uint32_t etcd_crc32c(uint32_t crc, const void *buf, size_t len);
/* Maintenance.Snapshot (snapshot.c). */
void maint_snapshot(rpc_call *c, const uint8_t *req, size_t len);

#endif
