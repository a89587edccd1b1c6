#ifndef CAIRN_SERVER_RPC_CLIENT_H
#define CAIRN_SERVER_RPC_CLIENT_H

/*
 * One unary gRPC call made as a client and waited for, with a deadline:
 * the joiner's Peer/Join (peer/peer.c) and cairnctl's calls, which have
 * nothing else to drive while they wait. gRPC only (no other part of
 * server/), so that cairnctl links it without the server
 * (cairn_rpc_client). Calls that must not block their thread (the JSON
 * gateway's, the load generator's) start rpc_unary_ops (unary_ops.h) on
 * a queue of their own instead.
 */

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

typedef struct rpc_client_reply {
    grpc_status_code status; /* DEADLINE_EXCEEDED past the deadline */
    char *details;           /* the status message (malloc'd, "" if none) */
    uint8_t *bytes;          /* the answer (malloc'd; NULL if none came) */
    size_t len;
} rpc_client_reply;

/* Calls |method| ("/cairnpb.Peer/Join") on |ch| with the |len| bytes of
 * |req| and waits until it ends, at most |timeout_ms| (the call's
 * deadline; < 0: none). 0 with *out filled, whatever the status (free it
 * with rpc_client_reply_destroy); CAIRN_EIO if the call could not be made
 * or CAIRN_ENOMEM, with *out zeroed. The thread blocks meanwhile. */
int rpc_client_unary(rpc_client_reply *out, grpc_channel *ch, const char *method,
                     const uint8_t *req, size_t len, int64_t timeout_ms);
void rpc_client_reply_destroy(rpc_client_reply *r);

#endif
