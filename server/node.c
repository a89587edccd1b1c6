/*
 * The node: its data dir and store, and the state etcd keeps beside its
 * backend — alarms and the --quota-backend-bytes check. (The write gate a
 * snapshot closes is the store's: cairn_store_snapshot.)
 * Nothing here talks gRPC; server.c wires the node to the engine and the
 * services.
 */
#include "server/node.h"

#include "crdt/error.h"
#include "etcdserverpb/rpc.pb-c.h"
#include "server/peer/peer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void node_init(cairn_server *srv)
{
    pthread_mutex_init(&srv->alarm_mu, NULL);
    /* etcd: --quota-backend-bytes 0 means the 2 GiB default; < 0 none. */
    srv->quota =
        srv->cfg->quota_backend_bytes > 0 ? srv->cfg->quota_backend_bytes : (int64_t)2 << 30;
}

void node_destroy(cairn_server *srv)
{
    if (srv->store) {
        cairn_store_close(srv->store);
        srv->store = NULL;
    }
    free(srv->alarms);
    srv->alarms = NULL;
    if (srv->join) {
        peer_join_destroy(srv->join);
        free(srv->join);
        srv->join = NULL;
    }
    pthread_mutex_destroy(&srv->alarm_mu);
}

/* ---- the store ----------------------------------------------------------- */

static int ensure_dir(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    if (strlen(dir) >= sizeof path) {
        snprintf(err, errlen, "cannot access data directory %s: path too long", dir);
        return CAIRN_EIO;
    }
    strcpy(path, dir);
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(path, 0700) != 0 && errno != EEXIST) {
                snprintf(err, errlen, "cannot access data directory: mkdir %s: %s", path,
                         strerror(errno));
                return CAIRN_EIO;
            }
            *p = saved;
            if (saved == '\0')
                break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "cannot access data directory %s: not a directory", dir);
        return CAIRN_EIO;
    }
    if (access(dir, R_OK | W_OK | X_OK) != 0) {
        snprintf(err, errlen, "cannot access data directory %s: %s", dir, strerror(errno));
        return CAIRN_EIO;
    }
    return 0;
}

/* The store's log lines go through the server's logger (--log-level). */
static void store_log(void *arg, int level, const char *msg)
{
    (void)arg;
    cairn_log(level, "store: %s", msg);
}

int node_open_store(cairn_server *srv, const cairn_store_subscriber *subs, size_t nsubs, char *err,
                    size_t errlen)
{
    const cairn_config *cfg = srv->cfg;
    int rc = ensure_dir(cfg->data_dir, err, errlen);
    if (rc != 0)
        return rc;
    /* etcd: a restart on an existing data dir ignores --initial-cluster*;
     * a new one with "existing" joins a running cluster: a member of it
     * answers this node's ids and the member table (peer/peer.h), and the
     * store starts with no change at all, so that it never builds a
     * document of its own; the history comes from the peers */
    char db[4096];
    struct stat dst;
    snprintf(db, sizeof db, "%s/db/CURRENT", cfg->data_dir);
    if (cfg->initial_cluster_state && strcmp(cfg->initial_cluster_state, "existing") == 0 &&
        stat(db, &dst) != 0) {
        srv->join = calloc(1, sizeof *srv->join);
        if (!srv->join)
            return CAIRN_ENOMEM;
        srv->join_started_ms = now_ms();
        rc = peer_net_join(srv->join, cfg, err, errlen);
        if (rc) {
            free(srv->join);
            srv->join = NULL;
            return rc;
        }
        cairn_log(CAIRN_LOG_INFO,
                  "joining cluster %016" PRIx64 " as member %016" PRIx64
                  " (answered by %s: %zu members, %zu heads to catch up with)",
                  srv->join->cluster_id, srv->join->member_id, srv->join->from, srv->join->nmembers,
                  srv->join->nheads);
    }
    cairn_store_member *members = calloc(cfg->ninitial_cluster, sizeof *members);
    if (!members)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < cfg->ninitial_cluster; i++) {
        members[i].name = cfg->initial_cluster[i].name;
        members[i].peer_urls = (const char *const *)cfg->initial_cluster[i].peer_urls;
        members[i].npeer_urls = cfg->initial_cluster[i].npeer_urls;
    }
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.dir = cfg->data_dir;
    o.name = cfg->name;
    o.cluster_token = cfg->initial_cluster_token;
    o.initial_cluster = members;
    o.ninitial_cluster = cfg->ninitial_cluster;
    o.max_txn_ops = cfg->max_txn_ops;
    o.subscribers = subs;
    o.nsubscribers = nsubs;
    o.lease_tick_ms = 100; /* the store revokes expired leases itself */
    if (srv->join) {
        o.join = 1;
        o.join_member_id = srv->join->member_id;
        o.join_cluster_id = srv->join->cluster_id;
    }
    o.log_cb = store_log;
    rc = cairn_store_open(&srv->store, &o);
    free(members);
    if (rc != 0) {
        snprintf(err, errlen, "cannot open the store in %s: %s", cfg->data_dir, cairn_strerror(rc));
        return rc;
    }
    /* A dir a join made that holds nothing yet (stopped before the first
     * change came): it never joined as far as the cluster's history goes,
     * so it asks again for the heads to catch up with (its ids stay). */
    if (!srv->join && cairn_store_awaiting_genesis(srv->store)) {
        peer_join *j = calloc(1, sizeof *j);
        char why[1024];
        rc = j ? peer_net_join(j, cfg, why, sizeof why) : CAIRN_ENOMEM;
        if (!rc && j->member_id != cairn_store_member_id(srv->store)) {
            snprintf(why, sizeof why, "the cluster answered member %016" PRIx64, j->member_id);
            rc = CAIRN_EINVAL;
        }
        if (rc) {
            cairn_log(CAIRN_LOG_WARN,
                      "%s was made by a join and holds no change yet; asking the cluster "
                      "again failed (%s): catching up from --initial-cluster's members",
                      cfg->data_dir, j ? why : "out of memory");
            if (j)
                peer_join_destroy(j);
            free(j);
        } else {
            srv->join = j;
            srv->join_started_ms = now_ms();
            cairn_log(CAIRN_LOG_INFO,
                      "joining again (the data dir holds no change yet): %zu heads "
                      "to catch up with, answered by %s",
                      j->nheads, j->from);
        }
    }
    /* a joining node publishes once it caught up (its entry comes with
     * the history) */
    if (!srv->join)
        node_publish(srv);
    return 0;
}

void node_publish(cairn_server *srv)
{
    const cairn_config *cfg = srv->cfg;
    /* etcd: a member publishes its name and client URLs when it starts */
    int prc = cairn_store_member_publish(srv->store, cfg->name,
                                         (const char *const *)cfg->advertise_client_urls,
                                         cfg->nadvertise_client_urls);
    if (prc != 0)
        cairn_log(CAIRN_LOG_WARN, "cannot publish this member's client URLs: %s",
                  cairn_strerror(prc));
}

/* ---- quota, alarms ------------------------------------------------------- */

uint64_t node_disk_bytes(cairn_server *srv, int fresh)
{
    /* A directory walk (the store's): at most every 100 ms on the write path. */
    uint64_t now = now_ms();
    uint64_t last = atomic_load(&srv->disk_checked_ms);
    if (fresh || last == 0 || now - last >= 100) {
        atomic_store(&srv->disk_checked_ms, now);
        /* the writes admitted before the walk are (mostly) in it */
        uint64_t since = atomic_load(&srv->disk_since);
        atomic_store(&srv->disk_bytes, cairn_store_disk_bytes(srv->store));
        atomic_fetch_sub(&srv->disk_since, since);
    }
    return atomic_load(&srv->disk_bytes);
}

int node_alarm_set(cairn_server *srv, uint64_t member, int type, int on)
{
    int changed = 0;
    pthread_mutex_lock(&srv->alarm_mu);
    size_t i = 0;
    while (i < srv->nalarms && !(srv->alarms[i].member_id == member && srv->alarms[i].type == type))
        i++;
    if (on && i == srv->nalarms) {
        node_alarm *grown = realloc(srv->alarms, (srv->nalarms + 1) * sizeof *grown);
        if (grown) {
            srv->alarms = grown;
            srv->alarms[srv->nalarms].member_id = member;
            srv->alarms[srv->nalarms].type = type;
            srv->nalarms++;
            changed = 1;
        }
    } else if (!on && i < srv->nalarms) {
        srv->alarms[i] = srv->alarms[srv->nalarms - 1];
        srv->nalarms--;
        changed = 1;
    }
    int nospace = 0;
    for (size_t j = 0; j < srv->nalarms; j++)
        nospace |= srv->alarms[j].type == ETCDSERVERPB__ALARM_TYPE__NOSPACE;
    atomic_store(&srv->nospace, nospace);
    pthread_mutex_unlock(&srv->alarm_mu);
    return changed;
}

int node_quota_check(cairn_server *srv, uint64_t cost)
{
    /* etcd: with a NOSPACE alarm raised, Put, Txn with a Put and LeaseGrant
     * fail with "database space exceeded"; deletes and compaction work. */
    if (atomic_load(&srv->nospace))
        return CAIRN_ENOSPACE;
    if (srv->quota < 0)
        return 0;
    /* The walk is at most 100 ms old: the writes admitted since count as
     * their cost, else a burst inside one window would pass the quota by
     * as many writes as fit in it (measured: five 60 KB puts past a
     * 100,000-byte quota, where etcd refuses the second). */
    uint64_t size = node_disk_bytes(srv, 0) + atomic_load(&srv->disk_since);
    if (size + cost > (uint64_t)srv->quota) {
        if (node_alarm_set(srv, cairn_store_member_id(srv->store),
                           ETCDSERVERPB__ALARM_TYPE__NOSPACE, 1))
            cairn_log(CAIRN_LOG_WARN,
                      "backend size %" PRIu64 " + %" PRIu64
                      " exceeds --quota-backend-bytes %" PRId64 ": NOSPACE alarm raised",
                      size, cost, srv->quota);
        return CAIRN_ENOSPACE;
    }
    atomic_fetch_add(&srv->disk_since, cost);
    return 0;
}
