#ifndef CAIRN_SERVER_GATEWAY_H
#define CAIRN_SERVER_GATEWAY_H

/*
 * Internal to server/: etcd 3.4's JSON gateway (gateway.c) — POST
 * /v3/kv/range and the other grpc-gateway paths (and /v3beta/...), JSON in
 * and out (json.h), each request made as a gRPC call to cairn's own
 * services over an in-process connection, so it reaches exactly the
 * handlers a gRPC client reaches, with the same errors.
 */

#include <stdint.h>

#include "server/http/http.h"

struct rpc_engine;
struct front;
typedef struct gateway gateway;

/* |rpc| and |f| are borrowed and outlive the gateway. */
int gateway_new(gateway **out, struct rpc_engine *rpc, struct front *f);
/* Connects to the engine and starts the completion thread (after
 * rpc_engine_start). */
int gateway_start(gateway *g);
/* 1 if |r| is a gateway path (/v3/..., /v3beta/...). */
int gateway_path(const http_request *r);
/* Answers |r| into |out| (0: an HTTP error, at once) or starts its call
 * and returns FRONT_PENDING (front_complete with |token| follows). Front
 * thread. */
int gateway_serve(gateway *g, const http_request *r, http_buf *out, uint64_t token);
/* Waits for the calls in flight, closes the connection, joins the thread
 * (after front_stop, before rpc_engine_stop). Idempotent. */
void gateway_stop(gateway *g);
void gateway_free(gateway *g);

#endif
