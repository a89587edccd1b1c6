/*
 * /metrics (metrics.h): etcd's metric names, types and labels wherever
 * cairn has the same concept, cairn_* for its own. Each family is written
 * as "# HELP", "# TYPE", then its samples, as Go's Prometheus client does.
 * process_* come from /proc/self as the Go client reads them.
 */
#include "server/http/metrics.h"

#include "server/peer/peer.h"
#include "server/rpc/rpc.h"
#include "store/store.h"

#include <dirent.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static void family(http_buf *b, const char *name, const char *type, const char *help)
{
    http_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A value as Go's client prints it: integers in full, others shortest. */
static void value(http_buf *b, double v)
{
    if (v == (double)(int64_t)v && v < 9e15 && v > -9e15)
        http_buf_printf(b, " %lld\n", (long long)v);
    else
        http_buf_printf(b, " %.15g\n", v);
}

/* A family of one sample without labels. */
static void metric(http_buf *b, const char *type, const char *name, const char *help, double v)
{
    family(b, name, type, help);
    http_buf_printf(b, "%s", name);
    value(b, v);
}
#define gauge(b, name, help, v) metric(b, "gauge", name, help, v)
#define counter(b, name, help, v) metric(b, "counter", name, help, v)

/* A field of a stats struct, described by its offset and size (an int or
 * a uint64_t), as a sample value. */
typedef struct field {
    const char *name, *type, *help;
    size_t off, size;
} field;
#define FIELD(st, m) offsetof(st, m), sizeof(((st *)0)->m)

static double field_value(const void *base, const field *f)
{
    const char *p = (const char *)base + f->off;
    if (f->size == sizeof(int)) {
        int v;
        memcpy(&v, p, sizeof v);
        return (double)v;
    }
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return (double)v;
}

/* A label value as the exposition format wants it: \\, \" and \n escaped. */
static void label_value(http_buf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            http_buf_printf(b, "\\%c", *v);
        else if (*v == '\n')
            http_buf_printf(b, "\\n");
        else
            http_buf_printf(b, "%c", *v);
    }
}

/* The counters of server/peer (peer_net_stats), one sample per other
 * member, labelled with its --name. */
static void peer_metrics(http_buf *b, peer_net *n)
{
    size_t np = n ? peer_net_stats(n, NULL, 0) : 0;
    peer_stats *ps = np ? calloc(np, sizeof *ps) : NULL;
    if (!ps)
        return;
    np = peer_net_stats(n, ps, np);
    static const field fs[] = {
        {"cairn_peer_connected", "gauge", "1 while a stream to the member is up.",
         FIELD(peer_stats, connected)},
        {"cairn_peer_connects_total", "counter",
         "Streams to the member that passed both hellos and went live.",
         FIELD(peer_stats, connects)},
        {"cairn_peer_sent_messages_total", "counter", "Peer messages sent to the member.",
         FIELD(peer_stats, msgs_sent)},
        {"cairn_peer_sent_bytes_total", "counter", "Bytes of those messages (protobuf framing).",
         FIELD(peer_stats, bytes_sent)},
        {"cairn_peer_received_messages_total", "counter",
         "Peer messages received from the member and decoded.", FIELD(peer_stats, msgs_received)},
        {"cairn_peer_received_bytes_total", "counter", "Bytes of those messages.",
         FIELD(peer_stats, bytes_received)},
        {"cairn_peer_pushes_total", "counter", "Optimistic pushes sent to the member.",
         FIELD(peer_stats, pushes)},
        {"cairn_peer_pushes_dropped_total", "counter",
         "Changes not queued for the member because its queue was full (periodic sync sent "
         "them later).",
         FIELD(peer_stats, pushes_dropped)},
        {"cairn_peer_sync_rounds_total", "counter",
         "Sync messages sent to the member: periodic, after a reconnect, and answers.",
         FIELD(peer_stats, sync_rounds)},
    };
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++) {
        family(b, fs[f].name, fs[f].type, fs[f].help);
        for (size_t i = 0; i < np; i++) {
            http_buf_printf(b, "%s{peer=\"", fs[f].name);
            label_value(b, ps[i].name);
            http_buf_printf(b, "\"}");
            value(b, field_value(&ps[i], &fs[f]));
        }
    }
    free(ps);
}

/* etcd's buckets for disk latencies: 1 ms, 2 ms, ... 8.192 s. */
static void sync_histogram(http_buf *b, const char *name, const char *help,
                           const cairn_store_stats *st)
{
    family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < CAIRN_STORE_SYNC_BUCKETS; i++) {
        cum += st->sync_le[i];
        http_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, 0.001 * (double)(1u << i),
                        (unsigned long long)cum);
    }
    cum += st->sync_le[CAIRN_STORE_SYNC_BUCKETS];
    http_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
                    (unsigned long long)cum, name, (double)st->sync_ns / 1e9, name,
                    (unsigned long long)cum);
}

/* Changes per group write: buckets 1, 2, 4 ... 4096 (store.h). */
static void batch_histogram(http_buf *b, const cairn_store_stats *st)
{
    const char *name = "cairn_store_batch_changes";
    family(b, name, "histogram",
           "Changes per group commit (one fsync each): the group-commit batch sizes.");
    uint64_t cum = 0;
    for (int i = 0; i < CAIRN_STORE_BATCH_BUCKETS; i++) {
        cum += st->batch_le[i];
        http_buf_printf(b, "%s_bucket{le=\"%u\"} %llu\n", name, 1u << i, (unsigned long long)cum);
    }
    cum += st->batch_le[CAIRN_STORE_BATCH_BUCKETS];
    http_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %llu\n%s_count %llu\n", name,
                    (unsigned long long)cum, name, (unsigned long long)st->changes, name,
                    (unsigned long long)cum);
}

/* Replication lag per other member (peer_net_lag); a member nothing is
 * known of yet has no sample. */
static void lag_metrics(http_buf *b, peer_net *n)
{
    size_t np = n ? peer_net_stats(n, NULL, 0) : 0;
    peer_stats *ps = np ? calloc(np, sizeof *ps) : NULL;
    uint64_t *lag = np ? calloc(2 * np, sizeof *lag) : NULL;
    int *known = np ? calloc(np, sizeof *known) : NULL;
    if (ps && lag && known) {
        np = peer_net_stats(n, ps, np);
        for (size_t i = 0; i < np; i++)
            known[i] = peer_net_lag(n, i, &lag[2 * i], &lag[2 * i + 1]) == 0;
        static const struct {
            const char *name, *help;
        } fs[] = {
            {"cairn_peer_lag_changes",
             "Changes applied here that the member has not acknowledged as durable."},
            {"cairn_peer_lag_seconds", "Age of the first of those changes, by its author's clock "
                                       "(0 when the member has them all)."},
        };
        for (size_t f = 0; f < 2; f++) {
            family(b, fs[f].name, "gauge", fs[f].help);
            for (size_t i = 0; i < np; i++) {
                if (!known[i])
                    continue;
                http_buf_printf(b, "%s{peer=\"", fs[f].name);
                label_value(b, ps[i].name);
                http_buf_printf(b, "\"}");
                value(b, f == 0 ? (double)lag[2 * i] : (double)lag[2 * i + 1] / 1000.0);
            }
        }
    }
    free(ps);
    free(lag);
    free(known);
}

/* ---- grpc_server_* (grpc-go's Prometheus interceptor) -------------------- */

static const char *const code_names[RPC_NCODES] = {
    "OK",       "Canceled",        "Unknown",          "InvalidArgument",   "DeadlineExceeded",
    "NotFound", "AlreadyExists",   "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
    "Aborted",  "OutOfRange",      "Unimplemented",    "Internal",          "Unavailable",
    "DataLoss", "Unauthenticated",
};

static const char *const type_names[] = {"unary", "server_stream", "bidi_stream"};

/* "/etcdserverpb.KV/Put" -> its labels */
static void method_labels(http_buf *b, const rpc_method_counts *m)
{
    const char *p = m->path + 1, *slash = strchr(p, '/');
    http_buf_printf(b, "grpc_method=\"%s\",grpc_service=\"%.*s\",grpc_type=\"%s\"", slash + 1,
                    (int)(slash - p), p, type_names[m->kind]);
}

static void grpc_metrics(http_buf *b, const rpc_method_counts *ms, size_t n, uint64_t *rx,
                         uint64_t *tx)
{
    *rx = *tx = 0;
    for (size_t i = 0; i < n; i++) {
        *rx += ms[i].bytes_received;
        *tx += ms[i].bytes_sent;
    }
    /* etcd: every method's series exist from the start, zeros included;
     * unregistered methods have none */
    family(b, "grpc_server_handled_total", "counter",
           "Total number of RPCs completed on the server, regardless of success or failure.");
    for (int k = 0; k < RPC_NCODES; k++)
        for (size_t i = 0; i < n; i++)
            if (ms[i].path) {
                http_buf_printf(b, "grpc_server_handled_total{grpc_code=\"%s\",", code_names[k]);
                method_labels(b, &ms[i]);
                http_buf_printf(b, "} %llu\n", (unsigned long long)ms[i].handled[k]);
            }
    static const field simple[] = {
        {"grpc_server_msg_received_total", "counter",
         "Total number of RPC stream messages received on the server.",
         FIELD(rpc_method_counts, msg_received)},
        {"grpc_server_msg_sent_total", "counter",
         "Total number of gRPC stream messages sent by the server.",
         FIELD(rpc_method_counts, msg_sent)},
        {"grpc_server_started_total", "counter", "Total number of RPCs started on the server.",
         FIELD(rpc_method_counts, started)},
    };
    for (size_t s = 0; s < sizeof simple / sizeof simple[0]; s++) {
        family(b, simple[s].name, simple[s].type, simple[s].help);
        for (size_t i = 0; i < n; i++)
            if (ms[i].path) {
                http_buf_printf(b, "%s{", simple[s].name);
                method_labels(b, &ms[i]);
                http_buf_printf(b, "}");
                value(b, field_value(&ms[i], &simple[s]));
            }
    }
}

/* ---- process_* ----------------------------------------------------------- */

static double boot_time(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    char line[256];
    double bt = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "btime %lf", &bt) == 1)
            break;
    fclose(f);
    return bt;
}

static void process_metrics(http_buf *b)
{
    long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/stat", "r");
    if (f) {
        char buf[1024];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        /* fields after the ')' closing the command name */
        char *p = strrchr(buf, ')');
        unsigned long utime = 0, stime = 0, vsize = 0;
        long rss = 0;
        unsigned long long start = 0;
        if (p &&
            sscanf(p + 2,
                   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %*d "
                   "%*d %llu %lu %ld",
                   &utime, &stime, &start, &vsize, &rss) == 5 &&
            tck > 0) {
            counter(b, "process_cpu_seconds_total",
                    "Total user and system CPU time spent in seconds.",
                    (double)(utime + stime) / (double)tck);
            gauge(b, "process_resident_memory_bytes", "Resident memory size in bytes.",
                  (double)rss * (double)page);
            gauge(b, "process_start_time_seconds",
                  "Start time of the process since unix epoch in seconds.",
                  boot_time() + (double)start / (double)tck);
            gauge(b, "process_virtual_memory_bytes", "Virtual memory size in bytes.",
                  (double)vsize);
        }
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        gauge(b, "process_max_fds", "Maximum number of open file descriptors.",
              (double)rl.rlim_cur);
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        long n = 0;
        while (readdir(d))
            n++;
        closedir(d);
        /* ".", ".." and the directory's own descriptor */
        gauge(b, "process_open_fds", "Number of open file descriptors.", (double)(n - 3));
    }
}

void metrics_write(cairn_server *srv, http_buf *b)
{
    cairn_header h;
    cairn_store_header(srv->store, &h);
    cairn_store_stats st;
    cairn_store_get_stats(srv->store, &st);

    gauge(b, "etcd_debugging_mvcc_compact_revision",
          "The revision of the last compaction in store.",
          (double)cairn_store_compacted_rev(srv->store));
    gauge(b, "etcd_debugging_mvcc_current_revision", "The current revision of store.",
          (double)h.revision);
    gauge(b, "etcd_mvcc_db_total_size_in_bytes",
          "Total size of the underlying database physically allocated in bytes.",
          (double)node_disk_bytes(srv, 0));
    gauge(b, "etcd_server_has_leader", "Whether or not a leader exists. 1 is existence, 0 is not.",
          1);
    family(b, "etcd_server_id", "gauge",
           "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.");
    http_buf_printf(b, "etcd_server_id{server_id=\"%llx\"} 1\n", (unsigned long long)h.member_id);
    gauge(b, "etcd_server_is_leader",
          "Whether or not this member is a leader. 1 if is, 0 otherwise.", 1);
    gauge(b, "etcd_server_quota_backend_bytes", "Current backend storage quota size in bytes.",
          (double)srv->quota);
    family(b, "etcd_server_version", "gauge",
           "Which version is running. 1 for 'server_version' label with current version.");
    http_buf_printf(b, "etcd_server_version{server_version=\"%s\"} 1\n", CAIRN_ETCD_VERSION);
    family(b, "etcd_cluster_version", "gauge",
           "Which version is running. 1 for 'cluster_version' label with current cluster version");
    http_buf_printf(b, "etcd_cluster_version{cluster_version=\"3.4\"} 1\n");

    /* etcd: both are gauges there */
    gauge(b, "etcd_server_proposals_committed_total",
          "The total number of consensus proposals committed.", (double)st.changes);
    gauge(b, "etcd_server_proposals_applied_total",
          "The total number of consensus proposals applied.", (double)st.changes);
    gauge(b, "etcd_server_proposals_pending", "The current number of pending proposals to commit.",
          0);
    gauge(b, "etcd_debugging_mvcc_keys_total", "Total number of keys.",
          (double)cairn_store_key_count(srv->store));
    sync_histogram(b, "etcd_disk_backend_commit_duration_seconds",
                   "The latency distributions of commit called by backend.", &st);
    sync_histogram(b, "etcd_disk_wal_fsync_duration_seconds",
                   "The latency distributions of fsync called by WAL.", &st);

    rpc_method_counts ms[64];
    size_t nms = rpc_engine_stats(srv->rpc, ms, sizeof ms / sizeof ms[0]);
    uint64_t rx, tx;
    grpc_metrics(b, ms, nms, &rx, &tx);
    counter(b, "etcd_network_client_grpc_received_bytes_total",
            "The total number of bytes received from grpc clients.", (double)rx);
    counter(b, "etcd_network_client_grpc_sent_bytes_total",
            "The total number of bytes sent to grpc clients.", (double)tx);

    counter(b, "cairn_store_syncs_total",
            "Group commits written to disk (one fsync each) since the store opened.",
            (double)st.syncs);
    counter(b, "cairn_store_changes_total",
            "Changes carried by those group commits (changes / syncs is the batch factor).",
            (double)st.changes);
    counter(b, "cairn_store_change_bytes_total",
            "The changes' own bytes (canonical encoding) those group commits wrote.",
            (double)st.change_bytes);
    counter(b, "cairn_store_forks_total",
            "Changes refused for sharing an author and seq with a change held here (a fork).",
            (double)st.forks);
    family(b, "cairn_store_applied_changes_total", "counter",
           "Changes applied and made durable, by origin: local (made on this node) or remote "
           "(received from a peer).");
    http_buf_printf(b, "cairn_store_applied_changes_total{origin=\"local\"} %llu\n",
                    (unsigned long long)st.applied_local);
    http_buf_printf(b, "cairn_store_applied_changes_total{origin=\"remote\"} %llu\n",
                    (unsigned long long)st.applied_remote);
    batch_histogram(b, &st);
    gauge(b, "cairn_store_pending_changes",
          "Changes received from peers and not yet durable here (waiting for their dependencies "
          "or for their group commit).",
          (double)st.pending);
    gauge(b, "cairn_checkpoint_age_seconds",
          "Seconds since the checkpoint a restart would load was written (none: since the store "
          "opened).",
          (double)st.ckpt_age_ms / 1000.0);
    gauge(b, "cairn_checkpoint_behind_changes",
          "Durable changes that checkpoint does not cover (what a restart replays).",
          (double)st.ckpt_behind);
    peer_metrics(b, srv->peer);
    lag_metrics(b, srv->peer);
    gauge(b, "cairn_alarm_nospace", "1 while a NOSPACE alarm is raised.",
          (double)atomic_load(&srv->nospace));
    family(b, "cairn_version", "gauge", "cairn's own version. 1 for 'version' label.");
    http_buf_printf(b, "cairn_version{version=\"%s\"} 1\n", CAIRN_VERSION);
    process_metrics(b);
}
