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
#include <stdint.h>

#include "server/peer/peer_msg.h"
#include "server/server.h"
#include "store/store.h"

typedef struct peer_net peer_net;

/* What a join answered (peer_msg.h). */
void peer_join_destroy(peer_join *j);

/* --initial-cluster-state existing on a new data dir: asks the members of
 * --initial-cluster other than this one, in turn, for this node's place in
 * the cluster (a member found by this node's advertised peer URLs, as
 * `etcdctl member add` made it). Blocking; each member gets a few seconds.
 * CAIRN_EINVAL with the member's reason in |err| (etcd's words where etcd
 * has them: "error validating peerURLs ...: member count is unequal") when
 * one refuses; CAIRN_EIO when none answered ("cannot fetch cluster info
 * from peer urls: ..."). */
int peer_net_join(peer_join *out, const cairn_config *cfg, char *err, size_t errlen);

/* Binds every --listen-peer-urls address and subscribes to |store|'s
 * durable changes (the pushes). |cfg| and |store| are borrowed and must
 * outlive it. |seed| (borrowed for the call; may be NULL): the member table
 * a join answered, which names the peers instead of --initial-cluster
 * (whose ids are not the added members' ids). On failure writes a message
 * to |err|: CAIRN_EIO (cannot listen), CAIRN_EINVAL, CAIRN_ENOMEM. */
int peer_net_new(peer_net **out, const cairn_config *cfg, cairn_store *store, const peer_join *seed,
                 char *err, size_t errlen);
/* A joining node caught up: from now on it syncs with every member (until
 * then only with the member that answered its join, whose stream carries
 * the history once; after PEER_JOIN_MS without that stream, with every
 * member anyway). Any thread. */
void peer_net_joined(peer_net *n);
/* Starts the thread: dialing, accepting, syncing. */
int peer_net_start(peer_net *n);
/* The client URLs member |id| advertised in its last hello (copies:
 * peer_net_urls_free), none before it connected. CAIRN_ENOTFOUND if |id| is
 * not another member; ENOMEM. Any thread. */
int peer_net_client_urls(peer_net *n, uint64_t id, char ***urls, size_t *nurls);
void peer_net_urls_free(char **urls, size_t nurls);

/* The heads member |id| last reported (new array, caller frees; none
 * before its first message): by the protocol they are durable on it, so
 * every ancestor of them is too. Kept across its restarts (what was on its
 * disk stays there). CAIRN_ENOTFOUND if |id| is not another member; ENOMEM.
 * Any thread. (The Replication service's accessor; a heads-only ack may
 * replace how they arrive, not what they mean.) */
int peer_net_acked_heads(peer_net *n, uint64_t id, cairn_hash **heads, size_t *nheads);
/* |cb| is called, on the peer thread, whenever a member's acked heads
 * change; it must not block or call back into the transport. Before
 * peer_net_start. */
void peer_net_set_ack_cb(peer_net *n, void (*cb)(void *arg), void *arg);

/* What the transport did with one other member since this node started
 * (peer_net_stats). Counters only grow; a stream counts from its hello on. */
typedef struct peer_stats {
    uint64_t id;             /* the member id */
    char name[64];           /* its --name (cut to fit) */
    int connected;           /* a stream is up now */
    uint64_t connects;       /* streams that passed the hellos and went live */
    uint64_t msgs_sent;      /* messages whose send completed (hellos included,
                                but for one sent before the peer's arrived) */
    uint64_t bytes_sent;     /* their bytes, as framed in protobuf */
    uint64_t msgs_received;  /* messages received and decoded */
    uint64_t bytes_received; /* their bytes */
    uint64_t pushes;         /* push messages sent (optimistic push) */
    uint64_t pushes_dropped; /* changes not queued for it: the queue was full
                                (or out of memory); periodic sync sent them */
    uint64_t sync_rounds;    /* sync messages sent: periodic, after a
                                reconnect, and answers */
} peer_stats;

/* Copies the counters of up to |max| other members, in --initial-cluster
 * order, into |out|; returns how many other members there are (call with
 * max 0 to size |out|). Lock-free reads of atomic counters: any thread, at
 * any time between peer_net_new and peer_net_free; counters of one member
 * are each exact but not one snapshot together. */
size_t peer_net_stats(peer_net *n, peer_stats *out, size_t max);

/* Replication lag behind the |i|th other member (peer_net_stats' order),
 * as cairn_replica_lag measures it: the changes this node applied that the
 * member has not acknowledged as durable, and the age of the first of
 * them by its author's clock. CAIRN_ENOTFOUND for no such member, one
 * removed from the member table, or one that has not sent a message since
 * this node started (nothing is known of what it holds). Takes the
 * session's lock and the store's read side: any thread but the peer
 * thread's own callbacks. */
int peer_net_lag(peer_net *n, size_t i, uint64_t *changes, uint64_t *age_ms);

/* The port bound for listen peer URL |i| (0 if none). */
int peer_net_port(const peer_net *n, size_t i);
/* Says goodbye on every live stream (a Goodbye message, then the stream's
 * clean close; waits at most PEER_GOODBYE_MS, 500 ms, for the peers to
 * close theirs), ends every stream and joins the thread; the store is not
 * touched after it returns, except by the subscriber (which only queues
 * bytes) and the completions of receives still in the store: free only
 * after the store closed. Idempotent. */
void peer_net_stop(peer_net *n);
void peer_net_free(peer_net *n);

#endif
