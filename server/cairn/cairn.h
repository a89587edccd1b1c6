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

#endif
