/*
 * /metrics (metrics.h): etcd's metric names, types and labels wherever
 * cairn has the same concept, cairn_* for its own. Each family is written
 * as "# HELP", "# TYPE", then its samples, as Go's Prometheus client does.
 * process_* come from /proc/self as the Go client reads them.
 */
#include "server/http/metrics.h"

#include "store/store.h"

#include <dirent.h>
#include <stdatomic.h>
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

static void gauge(http_buf *b, const char *name, const char *help, double v)
{
    family(b, name, "gauge", help);
    http_buf_printf(b, "%s %.17g\n", name, v);
}

static void counter(http_buf *b, const char *name, const char *help, double v)
{
    family(b, name, "counter", help);
    http_buf_printf(b, "%s %.17g\n", name, v);
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

    counter(b, "cairn_store_syncs_total",
            "Group commits written to disk (one fsync each) since the store opened.",
            (double)st.syncs);
    counter(b, "cairn_store_changes_total",
            "Changes carried by those group commits (changes / syncs is the batch factor).",
            (double)st.changes);
    gauge(b, "cairn_alarm_nospace", "1 while a NOSPACE alarm is raised.",
          (double)atomic_load(&srv->nospace));
    family(b, "cairn_version", "gauge", "cairn's own version. 1 for 'version' label.");
    http_buf_printf(b, "cairn_version{version=\"%s\"} 1\n", CAIRN_VERSION);
    process_metrics(b);
}
