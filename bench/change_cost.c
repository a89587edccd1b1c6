/*
 * change_cost: what "one change per client write" costs, measured in the
 * store through its C API (no gRPC, no network).
 *
 * cairn makes every client write its own CRDT change (hashed, encoded,
 * appended to the DAG, made durable). The research systems batched several
 * writes into one change. The server-level comparison is the batch part of
 * scripts/bench.sh (cairn --experimental-batch-writes); this tool
 * measures the store alone, with the nearest thing the store offers: a Txn
 * of N Puts to N distinct keys is exactly one change holding N writes. It
 * runs W writer threads for S
 * seconds doing either plain Puts (one change per write) or Txns of N Puts
 * (one change per N writes), each acknowledged only after fsync (group
 * commit shares fsyncs between threads in both modes), and reports writes
 * (keys) per second and CPU microseconds per write for each.
 *
 * With a fifth argument "async" it also measures N plain Puts issued
 * asynchronously per round and waited for together: N changes per round,
 * but the same one wait (thread hand-off) per N writes as the Txn mode, so
 * the difference between the two is the cost of the changes themselves and
 * not of the requests (line "async_puts_per_round=N ...").
 *
 * What it does not measure: a real batching build would also merge writes of
 * different clients into one change, and the gRPC cost per request (the
 * same in both modes at the server) is absent here, so the relative cost it
 * shows is an upper bound of the cost at the server.
 *
 * Usage: change_cost DIR [seconds=5] [writers=64] [batch=8] [async]
 * DIR must not exist; it is created and removed.
 */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

typedef struct writer {
    cairn_store *s;
    int id;
    int batch; /* 1: plain Put; N > 1: Txn of N Puts; -N: N async Puts */
    double until;
    uint64_t writes;
    int failed;
} writer;

#define MAX_BATCH 64

static void fill(char key[19], char val[33], uint64_t n)
{
    snprintf(key, 19, "key-%014llu", (unsigned long long)(n % 100000000000000ull));
    for (int i = 0; i < 32; i++)
        val[i] = "0123456789abcdef"[(n >> (i % 16)) & 15];
    val[32] = 0;
}

/* N async completions counted down on the committer thread. */
typedef struct round_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int left, rc;
} round_wait;

static void round_done(void *arg, int rc)
{
    round_wait *r = arg;
    pthread_mutex_lock(&r->mu);
    if (rc)
        r->rc = rc;
    if (--r->left == 0)
        pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int async_round(writer *w, int nput, uint64_t *n)
{
    char keys[MAX_BATCH][19], vals[MAX_BATCH][33];
    cairn_put_resp resp[MAX_BATCH];
    round_wait r = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, nput, 0};
    int rc = 0, issued = 0;
    for (int i = 0; i < nput; i++) {
        fill(keys[i], vals[i], (*n)++);
        cairn_put_req q = {0};
        q.key = (const uint8_t *)keys[i];
        q.key_len = 18;
        q.value = (const uint8_t *)vals[i];
        q.value_len = 32;
        rc = cairn_store_put_async(w->s, &resp[i], &q, round_done, &r);
        if (rc)
            break;
        issued++;
    }
    pthread_mutex_lock(&r.mu);
    r.left -= nput - issued;
    while (r.left > 0)
        pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    for (int i = 0; i < issued; i++)
        cairn_put_resp_destroy(&resp[i]);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
    return rc ? rc : r.rc;
}

static void *run(void *arg)
{
    writer *w = arg;
    char keys[MAX_BATCH][19], vals[MAX_BATCH][33];
    cairn_request_op ops[MAX_BATCH];
    uint64_t n = (uint64_t)w->id * 1000000000ull;
    while (now_s() < w->until) {
        int rc;
        if (w->batch < 0) {
            rc = async_round(w, -w->batch, &n);
        } else if (w->batch == 1) {
            fill(keys[0], vals[0], n++);
            cairn_put_req r = {0};
            r.key = (const uint8_t *)keys[0];
            r.key_len = 18;
            r.value = (const uint8_t *)vals[0];
            r.value_len = 32;
            cairn_put_resp resp;
            rc = cairn_store_put(w->s, &resp, &r);
            if (!rc)
                cairn_put_resp_destroy(&resp);
        } else {
            memset(ops, 0, sizeof ops);
            for (int i = 0; i < w->batch; i++) {
                fill(keys[i], vals[i], n++);
                ops[i].type = CAIRN_REQ_PUT;
                ops[i].u.put.key = (const uint8_t *)keys[i];
                ops[i].u.put.key_len = 18;
                ops[i].u.put.value = (const uint8_t *)vals[i];
                ops[i].u.put.value_len = 32;
            }
            cairn_txn_req t = {0};
            t.success = ops;
            t.nsuccess = (size_t)w->batch;
            cairn_txn_resp resp;
            rc = cairn_store_txn(w->s, &resp, &t);
            if (!rc)
                cairn_txn_resp_destroy(&resp);
        }
        if (rc) {
            fprintf(stderr, "change_cost: write failed: %s\n", cairn_strerror(rc));
            w->failed = 1;
            return NULL;
        }
        w->writes += (uint64_t)(w->batch < 0 ? -w->batch : w->batch);
    }
    return NULL;
}

static int measure(const char *base, int nwriters, int batch, double secs)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/batch-%d", base, batch);
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.dir = dir;
    cairn_store *s;
    int rc = cairn_store_open(&s, &o);
    if (rc) {
        fprintf(stderr, "change_cost: open %s: %s\n", dir, cairn_strerror(rc));
        return 1;
    }
    writer *w = calloc((size_t)nwriters, sizeof *w);
    pthread_t *th = calloc((size_t)nwriters, sizeof *th);
    if (w == NULL || th == NULL)
        return 1;
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < nwriters; i++) {
        w[i] = (writer){s, i, batch, t0 + secs, 0, 0};
        pthread_create(&th[i], NULL, run, &w[i]);
    }
    uint64_t writes = 0;
    int failed = 0;
    for (int i = 0; i < nwriters; i++) {
        pthread_join(th[i], NULL);
        writes += w[i].writes;
        failed |= w[i].failed;
    }
    double el = now_s() - t0, cpu = cpu_s() - c0;
    cairn_store_stats st;
    cairn_store_get_stats(s, &st);
    cairn_store_close(s);
    free(w);
    free(th);
    printf("%s=%d writers=%d writes=%llu changes=%llu seconds=%.2f writes_per_second=%.0f "
           "cpu_us_per_write=%.1f fsyncs=%llu\n",
           batch < 0 ? "async_puts_per_round" : "writes_per_change", batch < 0 ? -batch : batch,
           nwriters, (unsigned long long)writes,
           (unsigned long long)(batch < 0 ? writes : writes / (uint64_t)batch), el,
           (double)writes / el, writes ? cpu * 1e6 / (double)writes : 0.0,
           (unsigned long long)st.syncs);
    return failed;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [seconds=5] [writers=64] [batch=8] [async]\n", argv[0]);
        return 2;
    }
    double secs = argc > 2 ? atof(argv[2]) : 5;
    int nwriters = argc > 3 ? atoi(argv[3]) : 64;
    int batch = argc > 4 ? atoi(argv[4]) : 8;
    if (secs <= 0 || secs > 120 || nwriters < 1 || nwriters > 1024 || batch < 2 ||
        batch > MAX_BATCH) {
        fprintf(stderr, "change_cost: seconds in (0,120], writers 1..1024, batch 2..%d\n",
                MAX_BATCH);
        return 2;
    }
    int async = argc > 5 && strcmp(argv[5], "async") == 0;
    int rc = measure(argv[1], nwriters, 1, secs);
    rc |= measure(argv[1], nwriters, batch, secs);
    if (async)
        rc |= measure(argv[1], nwriters, -batch, secs);
    return rc;
}
