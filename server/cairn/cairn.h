#ifndef CAIRN_SERVER_CAIRN_H
#define CAIRN_SERVER_CAIRN_H

/*
 * Internal to server/: cairn's own client-facing services (cairn/), served
 * on the client URLs beside etcd's, with the node as their argument.
 */

#include "server/rpc/rpc.h"

extern const rpc_service cairn_replication_service;

#endif
