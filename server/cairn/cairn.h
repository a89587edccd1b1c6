#ifndef CAIRN_SERVER_CAIRN_H
#define CAIRN_SERVER_CAIRN_H

/*
 * Internal to server/: cairn's own client-facing services (cairn/), served
 * on the client URLs beside etcd's, with the node as their argument.
 */

#include "server/rpc/rpc.h"

extern const rpc_service cairn_replication_service;

struct cairn_server;
/* WaitReplicated's waiter thread (replication.c), in srv->repl; listens to
 * srv->peer's acks, so after peer_net_new and before peer_net_start.
 * ENOMEM. The service's stopping hook answers its parked calls; free after
 * the engine stopped. */
int cairn_repl_hub_new(struct cairn_server *srv);
void cairn_repl_hub_free(struct cairn_server *srv);

/* The Replication service's request checks without a store, for
 * fuzz/fuzz_repl_request.c: |kind| 0 RevisionToHash, 1 HashToRevision,
 * 2 Range, 3 ReplicationStatus, 4 WaitReplicated. 0, or the code the call
 * would fail with before touching the store (EUNMARSHAL, EINVAL, ENOMEM). */
int cairn_repl_decode_request(int kind, const uint8_t *req, size_t len);

#endif
