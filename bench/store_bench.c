/*
 * store_bench: the store's numbers, measured through its C API.
 *
 *   store_bench writers <dir> [seconds]   durable Put/s with 1 and 64 writer
 *                                         threads (blocking puts, each one
 *                                         acknowledged only after fsync)
 *   store_bench load <dir> [keys]         loads N keys (18-byte keys, 32-byte
 *                                         values, one Put = one change, 64
 *                                         writers), then reports resident
 *                                         memory, disk bytes, and the reopen
 *                                         time and memory of a fresh process
 *
 *   store_bench reopen <dir>              opens an existing store, reports the
 *                                         time and resident memory, then the
 *                                         close time and the size of the
 *                                         checkpoint the close wrote (remove
 *                                         <dir>/checkpoint first to time a
 *                                         full replay)
 *   store_bench compact <dir> [keys] [rounds]
 *                                         overwrites each key |rounds| times
 *                                         (256-byte values), then compacts to
 *                                         the current revision and reports the
 *                                         disk bytes before and after
 *
 * Every run starts from an empty <dir> it creates (and removes at the end
 * unless CAIRN_BENCH_KEEP=1).
 */

#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "crdt/error.h"
#include "store/store.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds (user + system) of this process so far: the machine may be
 * shared, so wall time alone overstates what the store costs. */
static double ru_s(int who)
{
    struct rusage ru;
    getrusage(who, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static double cpu_s(void)
{
    return ru_s(RUSAGE_SELF);
}

static long status_kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0)
            v = atol(line + n);
    if (f)
        fclose(f);
    return v;
}

static long rss_kib(void)
{
    return status_kib("VmRSS:");
}

/* Of the RSS, pages of mapped files (LevelDB mmaps its table files). */
static long rss_file_kib(void)
{
    return status_kib("RssFile:");
}

static unsigned long long du_bytes(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "du -sb '%s' 2>/dev/null", dir);
    FILE *p = popen(cmd, "r");
    unsigned long long b = 0;
    if (p) {
        if (fscanf(p, "%llu", &b) != 1)
            b = 0;
        pclose(p);
    }
    return b;
}

static void rm_rf(const char *dir)
{
    if (getenv("CAIRN_BENCH_KEEP"))
        return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static cairn_store *open_or_die(const char *dir)
{
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.dir = dir;
    /* LevelDB settings to compare (MiB; files); unset = the store's defaults */
    const char *e;
    if ((e = getenv("CAIRN_BENCH_CACHE_MIB")))
        o.cache_bytes = (size_t)atoi(e) << 20;
    if ((e = getenv("CAIRN_BENCH_WBUF_MIB")))
        o.write_buffer_bytes = (size_t)atoi(e) << 20;
    if ((e = getenv("CAIRN_BENCH_MAX_OPEN")))
        o.max_open_files = atoi(e);
    cairn_store *s;
    int rc = cairn_store_open(&s, &o);
    if (rc) {
        fprintf(stderr, "open %s: %s\n", dir, cairn_strerror(rc));
        exit(1);
    }
    return s;
}

typedef struct wctx {
    cairn_store *s;
    int id;
    double until;
    uint64_t from, to; /* load: key numbers [from, to) */
    uint64_t ops;
} wctx;

static void fill_kv(char key[19], char val[33], uint64_t n)
{
    snprintf(key, 19, "key-%014llu", (unsigned long long)n);
    uint64_t x = n * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < 32; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        val[i] = "0123456789abcdef"[x & 15];
    }
    val[32] = 0;
}

static int put1(cairn_store *s, const char *key, const char *val)
{
    cairn_put_req r = {0};
    r.key = (const uint8_t *)key;
    r.key_len = 18;
    r.value = (const uint8_t *)val;
    r.value_len = 32;
    cairn_put_resp resp;
    int rc = cairn_store_put(s, &resp, &r);
    if (!rc)
        cairn_put_resp_destroy(&resp);
    return rc;
}

static void *timed_writer(void *arg)
{
    wctx *w = arg;
    char key[19], val[33];
    uint64_t n = (uint64_t)w->id << 32;
    while (now_s() < w->until) {
        fill_kv(key, val, n++);
        if (put1(w->s, key, val)) {
            fprintf(stderr, "put failed\n");
            exit(1);
        }
        w->ops++;
    }
    return NULL;
}

static double run_writers(const char *base, int nthreads, double secs)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/writers-%d", base, nthreads);
    rm_rf(dir);
    cairn_store *s = open_or_die(dir);
    wctx *w = calloc((size_t)nthreads, sizeof *w);
    pthread_t *th = calloc((size_t)nthreads, sizeof *th);
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < nthreads; i++) {
        w[i] = (wctx){s, i, t0 + secs, 0, 0, 0};
        pthread_create(&th[i], NULL, timed_writer, &w[i]);
    }
    uint64_t ops = 0;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(th[i], NULL);
        ops += w[i].ops;
    }
    double el = now_s() - t0, cpu = cpu_s() - c0;
    cairn_header h;
    cairn_store_header(s, &h);
    cairn_store_stats st;
    cairn_store_get_stats(s, &st);
    cairn_store_close(s);
    rm_rf(dir);
    free(w);
    free(th);
    double rate = (double)ops / el;
    printf("writers=%d durable_puts=%llu seconds=%.2f puts_per_second=%.0f cpu_seconds=%.2f "
           "fsyncs=%llu puts_per_fsync=%.1f final_revision=%lld\n",
           nthreads, (unsigned long long)ops, el, rate, cpu, (unsigned long long)st.syncs,
           st.syncs ? (double)st.changes / (double)st.syncs : 0.0, (long long)h.revision);
    return rate;
}

static void *load_writer(void *arg)
{
    wctx *w = arg;
    char key[19], val[33];
    for (uint64_t n = w->from; n < w->to; n++) {
        fill_kv(key, val, n);
        if (put1(w->s, key, val)) {
            fprintf(stderr, "put failed\n");
            exit(1);
        }
        w->ops++;
    }
    return NULL;
}

/* The checkpoint file a close leaves in |dir| (store.h: CHECKPOINT). */
static void print_close(const char *dir, double secs, double cpu)
{
    char p[600];
    snprintf(p, sizeof p, "%s/checkpoint", dir);
    struct stat st;
    long long sz = stat(p, &st) == 0 ? (long long)st.st_size : -1;
    printf("close: seconds=%.2f cpu_seconds=%.2f checkpoint_bytes=%lld\n", secs, cpu, sz);
}

static int cmd_load(const char *base, uint64_t keys)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/load", base);
    rm_rf(dir);
    long rss0 = rss_kib();
    cairn_store *s = open_or_die(dir);
    enum { T = 64 };
    wctx w[T];
    pthread_t th[T];
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < T; i++) {
        w[i] = (wctx){s, i, 0, keys * (uint64_t)i / T, keys * (uint64_t)(i + 1) / T, 0};
        pthread_create(&th[i], NULL, load_writer, &w[i]);
    }
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    double el = now_s() - t0;
    long rss1 = rss_kib();
    cairn_header h;
    cairn_store_header(s, &h);
    printf("load: keys=%llu seconds=%.1f cpu_seconds=%.1f puts_per_second=%.0f revision=%lld\n",
           (unsigned long long)keys, el, cpu_s() - c0, (double)keys / el, (long long)h.revision);
    printf("load: rss_kib=%ld rss_file_kib=%ld peak_rss_kib=%ld (process before open %ld) "
           "leveldb_approx_bytes=%llu\n",
           rss1, rss_file_kib(), status_kib("VmHWM:"), rss0,
           (unsigned long long)cairn_store_disk_bytes(s));
    double t2 = now_s(), c2 = cpu_s();
    cairn_store_close(s);
    print_close(dir, now_s() - t2, cpu_s() - c2);
    printf("disk: du_bytes=%llu (%.1f bytes/key)\n", du_bytes(dir),
           (double)du_bytes(dir) / (double)keys);

    /* reopen in a fresh process (exec, not just fork: LevelDB's background
     * thread does not survive a fork): its RSS is what a restarted node holds */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "store_bench", "reopen", dir, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!getenv("CAIRN_BENCH_KEEP")) /* keep: to time reopen again */
        rm_rf(dir);
    return 0;
}

typedef struct cctx {
    cairn_store *s;
    int id, nthreads;
    uint64_t keys, rounds;
} cctx;

static void *compact_writer(void *arg)
{
    cctx *c = arg;
    char key[32], val[257];
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(c->id + 1);
    val[256] = 0;
    for (uint64_t r = 0; r < c->rounds; r++)
        for (uint64_t k = (uint64_t)c->id; k < c->keys; k += (uint64_t)c->nthreads) {
            snprintf(key, sizeof key, "key-%014llu", (unsigned long long)(k % 100000000000000ull));
            for (int i = 0; i < 256; i++) { /* incompressible, like real data */
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                val[i] = (char)(x >> 24);
            }
            cairn_put_req q = {0};
            q.key = (const uint8_t *)key;
            q.key_len = 18;
            q.value = (const uint8_t *)val;
            q.value_len = 256;
            cairn_put_resp resp;
            if (cairn_store_put(c->s, &resp, &q)) {
                fprintf(stderr, "put failed\n");
                exit(1);
            }
            cairn_put_resp_destroy(&resp);
        }
    return NULL;
}

static int cmd_compact(const char *base, uint64_t keys, uint64_t rounds)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/compact", base);
    rm_rf(dir);
    cairn_store *s = open_or_die(dir);
    enum { T = 32 };
    cctx c[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        c[i] = (cctx){s, i, T, keys, rounds};
        pthread_create(&th[i], NULL, compact_writer, &c[i]);
    }
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    cairn_header h;
    cairn_store_header(s, &h);
    /* let LevelDB settle so both figures are compacted tables */
    cairn_store_close(s);
    s = open_or_die(dir);
    unsigned long long before = du_bytes(dir);
    unsigned long long approx0 = cairn_store_disk_bytes(s);
    double t0 = now_s();
    int rc = cairn_store_compact(s, &h, h.revision, 1);
    double el = now_s() - t0;
    unsigned long long approx1 = cairn_store_disk_bytes(s);
    cairn_store_close(s);
    unsigned long long after = du_bytes(dir);
    printf("compact: keys=%llu rounds=%llu revision=%lld rc=%d seconds=%.2f\n",
           (unsigned long long)keys, (unsigned long long)rounds, (long long)h.revision, rc, el);
    printf("compact: du_bytes before=%llu after=%llu reclaimed=%llu (%.0f%%); "
           "leveldb_approx before=%llu after=%llu\n",
           before, after, before > after ? before - after : 0,
           before ? 100.0 * (double)(before > after ? before - after : 0) / (double)before : 0.0,
           approx0, approx1);
    rm_rf(dir);
    return rc ? 1 : 0;
}

static int cmd_reopen(const char *dir)
{
    long r0 = rss_kib();
    double a = now_s(), ca = cpu_s(), ta = ru_s(RUSAGE_THREAD);
    cairn_store *s = open_or_die(dir);
    double b = now_s(), cb = cpu_s(), tb = ru_s(RUSAGE_THREAD);
    cairn_header h;
    cairn_store_header(s, &h);
    cairn_range_req q = {0};
    q.key = (const uint8_t *)"\0";
    q.key_len = 1;
    q.range_end = (const uint8_t *)"\0";
    q.range_end_len = 1;
    q.count_only = 1;
    cairn_range_resp r;
    int rc = cairn_store_range(s, &r, &q);
    /* the opening thread's own CPU time is the replay's critical path, and
     * unlike the wall time it does not depend on what else the box runs */
    printf("reopen: seconds=%.2f cpu_seconds=%.2f opener_cpu_seconds=%.2f revision=%lld "
           "count=%lld rc=%d rss_kib=%ld rss_file_kib=%ld (before open %ld)\n",
           b - a, cb - ca, tb - ta, (long long)h.revision, (long long)r.count, rc, rss_kib(),
           rss_file_kib(), r0);
    cairn_range_resp_destroy(&r);
    double c0 = now_s(), cc = cpu_s();
    cairn_store_close(s);
    print_close(dir, now_s() - c0, cpu_s() - cc);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr,
                "usage: %s writers <dir> [seconds] | load <dir> [keys] | compact <dir> [keys] "
                "[rounds]\n",
                argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "reopen") != 0)
        mkdir(argv[2], 0700);
    if (strcmp(argv[1], "writers") == 0) {
        double secs = argc > 3 ? atof(argv[3]) : 5;
        double r1 = run_writers(argv[2], 1, secs);
        double r64 = run_writers(argv[2], 64, secs);
        printf("group commit: 64 writers = %.1fx one writer\n", r64 / r1);
        return 0;
    }
    if (strcmp(argv[1], "load") == 0)
        return cmd_load(argv[2], argc > 3 ? strtoull(argv[3], NULL, 10) : 1000000);
    if (strcmp(argv[1], "reopen") == 0)
        return cmd_reopen(argv[2]);
    if (strcmp(argv[1], "compact") == 0)
        return cmd_compact(argv[2], argc > 3 ? strtoull(argv[3], NULL, 10) : 5000,
                           argc > 4 ? strtoull(argv[4], NULL, 10) : 10);
    fprintf(stderr, "unknown command %s\n", argv[1]);
    return 2;
}
