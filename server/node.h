#ifndef CAIRN_SERVER_NODE_H
#define CAIRN_SERVER_NODE_H

/*
 * Internal to server/: the node — its configuration, its store, and what
 * etcd keeps beside the store and cairn keeps in memory: alarms and the
 * backend quota. node.c opens the store and implements these; server.c
 * puts a node, the gRPC engine and the services together; etcd/ serves
 * from a node.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "server/server.h"
#include "store/store.h"

/* An etcd alarm (AlarmMember). */
typedef struct node_alarm {
    uint64_t member_id;
    int type; /* etcdserverpb AlarmType */
} node_alarm;

struct cairn_server {
    const cairn_config *cfg;
    cairn_store *store;
    struct rpc_engine *rpc;
    int *ports;
    size_t nports;

    /* alarms (etcd keeps them in its backend; cairn in memory) */
    pthread_mutex_t alarm_mu;
    node_alarm *alarms;
    size_t nalarms;
    atomic_int nospace; /* a NOSPACE alarm is active */
    int64_t quota;      /* bytes; < 0 = no quota */
    atomic_uint_least64_t disk_bytes;
    atomic_uint_least64_t disk_checked_ms;
    /* the costs node_quota_check let through since disk_bytes was read */
    atomic_uint_least64_t disk_since;

    struct watch_hub *watch;    /* etcd/watch.c */
    struct kv_batcher *batcher; /* etcd/kv_batch.c; NULL unless --experimental-batch-writes */
    struct peer_net *peer;      /* peer/peer.c: the other members */
    struct repl_hub *repl;      /* cairn/replication.c: WaitReplicated's waiter */
    struct cairn_tls_server *tls_client; /* tls/: https:// client URLs; else NULL */
    struct cairn_tls_pump *tls_pump;
    struct front *front;     /* http/front.c: the client URLs' sockets */
    struct gateway *gateway; /* http/gateway.c: etcd's JSON gateway */
    /* this member is a learner (etcd/cluster.c: etcd_admit);
     * recomputed when the store's members_gen moves past learner_gen */
    atomic_int learner;
    atomic_uint_least64_t learner_gen;
    /* a join's answer (peer/peer.h) while this node catches up; NULL for
     * a node that did not join at this start */
    struct peer_join *join;
    uint64_t join_started_ms;
};

/* Sets up the node's locks and quota from srv->cfg (srv zeroed before). */
void node_init(cairn_server *srv);
void node_destroy(cairn_server *srv);
/* This member's name and client URLs into the member table (etcd: a
 * member publishes them when it starts); a failure is a log line. */
void node_publish(cairn_server *srv);
/* Makes the data dir if needed and opens the store in it, with |subs|
 * (a new dir with --initial-cluster-state existing: after asking a member
 * of the cluster for this node's ids, srv->join, so the store starts with
 * no change of its own)
 * (borrowed for the call) as its first subscribers, in that order. On
 * failure writes a message to |err|: CAIRN_EIO, CAIRN_ECORRUPT, CAIRN_ENOMEM. */
int node_open_store(cairn_server *srv, const cairn_store_subscriber *subs, size_t nsubs, char *err,
                    size_t errlen);

/* etcd's quota: CAIRN_ENOSPACE if a NOSPACE alarm is active or this write
 * of about |cost| bytes would pass --quota-backend-bytes (which raises the
 * alarm, as etcd does). 0 otherwise. */
int node_quota_check(cairn_server *srv, uint64_t cost);
/* Raises (|on|) or clears an alarm; returns 1 if the set changed. */
int node_alarm_set(cairn_server *srv, uint64_t member, int type, int on);
/* Current backend size in bytes (cached for 100 ms unless |fresh|). */
uint64_t node_disk_bytes(cairn_server *srv, int fresh);

#endif
