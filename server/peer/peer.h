#ifndef CAIRN_SERVER_PEER_H
#define CAIRN_SERVER_PEER_H

/*
 * Internal to server/: the peer transport (peer.c). One bidirectional
 * cairnpb.Peer/Stream per pair of members on the peer URLs, carrying
 * store/replica's sync sessions; a gRPC server of its own on
 * --listen-peer-urls (so etcd's services are never served there, and the
 * Peer service never on a client URL) and a channel to every other member
 * of the initial cluster, all driven by one thread.
 */

#include <stddef.h>

#include "server/server.h"
#include "store/store.h"

typedef struct peer_net peer_net;

/* Binds every --listen-peer-urls address and subscribes to |store|'s
 * durable changes (the pushes). |cfg| and |store| are borrowed and must
 * outlive it. On failure writes a message to |err|: CAIRN_EIO (cannot
 * listen), CAIRN_EINVAL, CAIRN_ENOMEM. */
int peer_net_new(peer_net **out, const cairn_config *cfg, cairn_store *store, char *err,
                 size_t errlen);
/* Starts the thread: dialing, accepting, syncing. */
int peer_net_start(peer_net *n);
/* The client URLs member |id| advertised in its last hello (copies:
 * peer_net_urls_free), none before it connected. CAIRN_ENOTFOUND if |id| is
 * not another member; ENOMEM. Any thread. */
int peer_net_client_urls(peer_net *n, uint64_t id, char ***urls, size_t *nurls);
void peer_net_urls_free(char **urls, size_t nurls);

/* The port bound for listen peer URL |i| (0 if none). */
int peer_net_port(const peer_net *n, size_t i);
/* Ends every stream and joins the thread; the store is not touched after
 * it returns, except by the subscriber (which only queues bytes) and the
 * completions of receives still in the store: free only after the store
 * closed. Idempotent. */
void peer_net_stop(peer_net *n);
void peer_net_free(peer_net *n);

#endif
