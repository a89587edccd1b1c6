/*
 * CRDT document benchmark. Measures, for the store's typical write (one key
 * of 18 bytes set to a 32-byte value, one change per write):
 *
 *   1. the encoded size of such a change (first change: no deps; steady
 *      state: one dep);
 *   2. local commits per second: populating a document to N keys (default
 *      1,000,000), then overwriting random keys of the full document;
 *   3. remote changes per second: a second replica catching up on all N
 *      changes, then receiving the overwrites (decode + validate + DAG +
 *      apply, and apply without decode);
 *   4. memory per key: heap bytes in use (mallinfo2) of a whole replica per
 *      key, of a bare DAG holding the same changes (keeping their bytes, and
 *      with a body loader, as the store's DAG), and the difference (the
 *      document state itself); plus RSS.
 *
 * Usage: crdt_bench [nkeys [nupdates]]. Single-threaded; the document's
 * clock is fake; rates are per second of CPU time.
 *
 * crdt_bench checkpoint [nkeys [runs]] instead measures a restart: a replica
 * of nkeys one-key changes rebuilt by replaying every change (decode +
 * receive, bodies from a loader as in the store) against one restored from
 * cairn_doc_checkpoint, each in a forked child (a fresh heap, as after a
 * restart); the checkpoint's size, the median encode and load times of
 * |runs| runs, and the heap and RSS each restart added.
 */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "crdt/change.h"
#include "crdt/dag.h"
#include "crdt/doc.h"
#include "crdt/error.h"

#define KEY_LEN 18
#define VAL_LEN 32
#define BATCHES 10

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v)
{
    qsort(v, BATCHES, sizeof *v, cmp_double);
    return (v[BATCHES / 2 - 1] + v[BATCHES / 2]) / 2;
}

/* Rates use the process's CPU time: the bench is single-threaded and the
 * machines it runs on are often shared, which skews wall time. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t heap_bytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static size_t rss_bytes(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return (size_t)rss * 4096;
}

static _Noreturn void die(const char *what, int rc)
{
    fprintf(stderr, "crdt_bench: %s: %s\n", what, cairn_strerror(rc));
    exit(1);
}

/* "/registry/k%07u" is 18 bytes; values are 32 bytes. */
static void key_of(uint8_t key[KEY_LEN + 1], uint32_t i)
{
    char tmp[40];
    snprintf(tmp, sizeof tmp, "/registry/k%07u", i % 10000000u);
    memcpy(key, tmp, KEY_LEN + 1);
}

static void put_one(cairn_doc *d, uint64_t t, uint32_t k, uint32_t version,
                    const cairn_change **out)
{
    uint8_t key[KEY_LEN + 1], val[VAL_LEN + 1];
    char tmp[64];
    key_of(key, k);
    snprintf(tmp, sizeof tmp, "value-%08u-%08u-xxxxxxxxxxxxxx", k % 100000000u,
             version % 100000000u);
    memcpy(val, tmp, VAL_LEN);
    cairn_value v = {.type = CAIRN_V_BYTES};
    v.v.bytes.ptr = val;
    v.v.bytes.len = VAL_LEN;
    int rc = cairn_doc_begin(d, t);
    if (!rc)
        rc = cairn_doc_put(d, CAIRN_ROOT, key, KEY_LEN, &v);
    if (!rc)
        rc = cairn_doc_commit(d, out, NULL);
    if (rc)
        die("local write", rc);
}

/* The change at |index| of |d|, decoded afresh from the bytes the DAG keeps
 * (what a peer would receive). */
static cairn_change *copy_of(const cairn_dag *d, uint64_t index)
{
    cairn_change *copy;
    int rc = cairn_dag_load(&copy, d, index);
    if (rc)
        die("decode", rc);
    return copy;
}

/* A body loader serving another DAG's bytes (stands in for storage). */
static int load_from(void *arg, uint64_t index, uint8_t **bytes, size_t *len)
{
    return cairn_dag_load_bytes(bytes, len, arg, index);
}

/* Dies with |what| unless the two replicas dump the same bytes. */
static void same_state(const cairn_doc *a, const cairn_doc *b, const char *what)
{
    uint8_t *da, *db;
    size_t la, lb;
    if (cairn_doc_dump(&da, &la, a) || cairn_doc_dump(&db, &lb, b) || la != lb ||
        memcmp(da, db, la) != 0)
        die(what, CAIRN_ECORRUPT);
    free(da);
    free(db);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* What one way of restarting cost, measured in a child process. */
struct restart {
    double wall, cpu;
    size_t heap, rss;
};

struct restart_arg {
    const cairn_doc *src; /* every change, bodies included */
    const uint8_t *ck;    /* its checkpoint */
    size_t cklen;
    cairn_actor actor; /* the restarting replica's */
};

/* Today's restart: every change decoded and received (bodies from a
 * loader, as in the store). */
static void restart_replay(const struct restart_arg *x)
{
    cairn_doc *d;
    const cairn_dag *da = cairn_doc_dag(x->src);
    int rc = cairn_doc_new(&d, &x->actor);
    if (!rc)
        rc = cairn_doc_set_loader(d, load_from, (void *)da);
    for (uint64_t i = 0; !rc && i < cairn_dag_count(da); i++)
        rc = cairn_doc_receive(d, copy_of(da, i), NULL);
    if (rc)
        die("replay", rc);
}

static void restart_checkpoint(const struct restart_arg *x)
{
    cairn_doc *d;
    int rc = cairn_doc_from_checkpoint(&d, x->ck, x->cklen, &x->actor);
    if (!rc)
        rc = cairn_doc_set_loader(d, load_from, (void *)cairn_doc_dag(x->src));
    if (rc)
        die("from_checkpoint", rc);
}

/* Runs |fn| in a child forked from this process, as a restarting process
 * would run it: from the same heap each time, its new pages its own (no
 * memory freed by an earlier run to reuse). Returns its wall and CPU time
 * and how much heap and resident memory it added. */
static struct restart in_child(void (*fn)(const struct restart_arg *), const struct restart_arg *x)
{
    struct restart r = {0};
    int fd[2];
    if (pipe(fd) != 0)
        die("pipe", CAIRN_EIO);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die("fork", CAIRN_EIO);
    if (pid == 0) {
        close(fd[0]);
        size_t h0 = heap_bytes(), s0 = rss_bytes();
        double w0 = wall_s(), c0 = now_s();
        fn(x);
        r.wall = wall_s() - w0;
        r.cpu = now_s() - c0;
        r.heap = heap_bytes() - h0;
        r.rss = rss_bytes() - s0;
        _exit(write(fd[1], &r, sizeof r) == sizeof r ? 0 : 1);
    }
    close(fd[1]);
    int st = 0;
    ssize_t got = read(fd[0], &r, sizeof r);
    close(fd[0]);
    if (waitpid(pid, &st, 0) != pid || got != (ssize_t)sizeof r || !WIFEXITED(st) ||
        WEXITSTATUS(st) != 0)
        die("child", CAIRN_EIO);
    return r;
}

static int cmp_restart(const void *a, const void *b)
{
    double x = ((const struct restart *)a)->wall, y = ((const struct restart *)b)->wall;
    return x < y ? -1 : x > y;
}

static int checkpoint_bench(uint32_t n, int runs)
{
    cairn_actor aa;
    memset(aa.b, 0xA1, sizeof aa.b);
    struct restart_arg x = {0};
    memset(x.actor.b, 0xB2, sizeof x.actor.b);
    cairn_doc *a, *loaded;
    int rc = cairn_doc_new(&a, &aa);
    if (rc)
        die("new", rc);
    uint64_t t = 1700000000000ull;
    for (uint32_t i = 0; i < n; i++)
        put_one(a, t++, i, 0, NULL);
    x.src = a;

    double *enc = malloc((size_t)runs * sizeof *enc), *enc_cpu = malloc((size_t)runs * sizeof *enc);
    struct restart *ld = malloc((size_t)runs * sizeof *ld);
    if (!enc || !enc_cpu || !ld)
        die("malloc", CAIRN_ENOMEM);
    uint8_t *ck = NULL;
    for (int r = 0; r < runs; r++) {
        free(ck);
        double w = wall_s(), c = now_s();
        if ((rc = cairn_doc_checkpoint(&ck, &x.cklen, a)))
            die("checkpoint", rc);
        enc[r] = wall_s() - w;
        enc_cpu[r] = now_s() - c;
    }
    x.ck = ck;
    struct restart rp = in_child(restart_replay, &x);
    for (int r = 0; r < runs; r++)
        ld[r] = in_child(restart_checkpoint, &x);
    qsort(ld, (size_t)runs, sizeof *ld, cmp_restart);
    struct restart lm = ld[runs / 2];
    if ((rc = cairn_doc_from_checkpoint(&loaded, ck, x.cklen, &x.actor)))
        die("from_checkpoint", rc);
    same_state(a, loaded, "restored replica differs");

    printf("crdt_bench checkpoint: %u keys (key %d B, value %d B), %d runs\n", n, KEY_LEN, VAL_LEN,
           runs);
    printf("restarts run in forked children; times are wall clock, then CPU time\n");
    printf("full replay (decode + receive): %.3f s, %.3f s CPU\n", rp.wall, rp.cpu);
    printf("checkpoint size:                %zu B (%.1f B/key)\n", x.cklen, (double)x.cklen / n);
    printf("cairn_doc_checkpoint:           %.3f s, %.3f s CPU (medians)\n", median_of(enc, runs),
           median_of(enc_cpu, runs));
    printf("cairn_doc_from_checkpoint:      %.3f s, %.3f s CPU (median run by wall; fastest "
           "%.3f s)\n",
           lm.wall, lm.cpu, ld[0].wall);
    printf("heap added, replay / restore:   %.1f / %.1f B/key\n", (double)rp.heap / n,
           (double)lm.heap / n);
    printf("RSS added, replay / restore:    %.1f / %.1f B/key\n", (double)rp.rss / n,
           (double)lm.rss / n);
    printf("DAG bytes, source / restored:   %zu / %zu (the source keeps its bodies)\n",
           cairn_dag_mem_bytes(cairn_doc_dag(a)), cairn_dag_mem_bytes(cairn_doc_dag(loaded)));
    free(ck);
    free(enc);
    free(enc_cpu);
    free(ld);
    cairn_doc_free(loaded);
    cairn_doc_free(a);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "checkpoint") == 0) {
        uint32_t n = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 1000000;
        int runs = argc > 3 ? atoi(argv[3]) : 5;
        if (n == 0 || runs < 1) {
            fprintf(stderr, "usage: crdt_bench checkpoint [nkeys [runs]]\n");
            return 2;
        }
        return checkpoint_bench(n, runs);
    }
    uint32_t n = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 1000000;
    uint32_t m = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 100000;
    if (n == 0 || m == 0) {
        fprintf(stderr, "usage: crdt_bench [nkeys [nupdates]]\n");
        return 2;
    }
    cairn_actor aa, ab;
    memset(aa.b, 0xA1, sizeof aa.b);
    memset(ab.b, 0xB2, sizeof ab.b);
    cairn_doc *a, *b;
    int rc = cairn_doc_new(&a, &aa);
    if (!rc)
        rc = cairn_doc_new(&b, &ab);
    if (rc)
        die("new", rc);
    uint64_t t = 1700000000000ull;
    const cairn_change *c;

    /* 1. size of a one-key change */
    size_t heap0 = heap_bytes(), rss0 = rss_bytes();
    double t0 = now_s();
    put_one(a, t++, 0, 0, &c);
    size_t first_len = c->len;
    put_one(a, t++, 1, 0, &c);
    size_t steady_len = c->len;

    /* 2a. populate to n keys, one change per key */
    for (uint32_t i = 2; i < n; i++)
        put_one(a, t++, i, 0, NULL);
    double t1 = now_s();
    size_t heap_a = heap_bytes() - heap0, rss_a = rss_bytes() - rss0;
    size_t len;
    if (cairn_doc_length(a, &len, CAIRN_ROOT) || len != n)
        die("populate", CAIRN_ECORRUPT);

    /* 3a. replica b catches up: decode + receive every change */
    size_t heap1 = heap_bytes();
    double t2 = now_s();
    const cairn_dag *da = cairn_doc_dag(a);
    for (uint64_t i = 0; i < cairn_dag_count(da); i++)
        if ((rc = cairn_doc_receive(b, copy_of(da, i), NULL)) != 0)
            die("receive", rc);
    double t3 = now_s();
    size_t heap_b = heap_bytes() - heap1;

    /* 2b. local overwrites of random keys in the full document, in batches:
     * the median batch is the steady state, the total includes one-off
     * costs such as a hash table doubling. */
    uint64_t first_update = cairn_dag_count(da);
    double local_b[BATCHES], dec_b[BATCHES], rec_b[BATCHES];
    uint32_t bs = m / BATCHES ? m / BATCHES : 1;
    uint32_t done = 0;
    double t4 = now_s();
    for (int k = 0; k < BATCHES; k++) {
        double x = now_s();
        for (uint32_t j = 0; j < bs; j++)
            put_one(a, t++, rnd(n), done + j + 1, NULL);
        local_b[k] = bs / (now_s() - x);
        done += bs;
    }
    double t5 = now_s();

    /* 3b. b receives the overwrites, batch by batch: decode, then receive */
    cairn_change **pre = malloc((size_t)bs * sizeof *pre);
    if (!pre)
        die("malloc", CAIRN_ENOMEM);
    double t6 = now_s(), trecv = 0;
    for (int k = 0; k < BATCHES; k++) {
        double x0 = now_s();
        for (uint32_t j = 0; j < bs; j++)
            pre[j] = copy_of(da, first_update + (uint64_t)k * bs + j);
        double x1 = now_s();
        for (uint32_t j = 0; j < bs; j++)
            if ((rc = cairn_doc_receive(b, pre[j], NULL)) != 0)
                die("receive", rc);
        double x2 = now_s();
        dec_b[k] = bs / (x2 - x0);
        rec_b[k] = bs / (x2 - x1);
        trecv += x2 - x1;
    }
    double t7 = now_s();
    free(pre);

    /* 4. the first n changes in a bare DAG, keeping their bytes (as every DAG
     * here does), then in one whose bodies a loader serves (as the store's:
     * here the loader reads them from replica a). Last: freeing fragments
     * the heap. */
    size_t heap_dag = 0, heap_dag_ld = 0;
    for (int with_loader = 0; with_loader < 2; with_loader++) {
        size_t heap2 = heap_bytes();
        cairn_dag *bare;
        if ((rc = cairn_dag_new(&bare)) != 0)
            die("dag", rc);
        if (with_loader && (rc = cairn_dag_set_loader(bare, load_from, (void *)da)) != 0)
            die("loader", rc);
        for (uint64_t i = 0; i < n; i++) {
            int st;
            if ((rc = cairn_dag_add(bare, copy_of(da, i), &st)) != 0 ||
                (rc = cairn_dag_order(bare, NULL, NULL)) != 0)
                die("dag add", rc);
        }
        cairn_change *back;
        if ((rc = cairn_dag_load(&back, bare, n / 2)) != 0)
            die("load", rc);
        cairn_change_free(back);
        *(with_loader ? &heap_dag_ld : &heap_dag) = heap_bytes() - heap2;
        cairn_dag_free(bare);
    }

    same_state(a, b, "replicas differ");

    printf("crdt_bench: %u keys (key %d B, value %d B), %u overwrites\n", n, KEY_LEN, VAL_LEN, m);
    printf("change size, one key:        %zu B (first change, no deps), %zu B (one dep)\n",
           first_len, steady_len);
    printf("local commits, 0 -> %u keys: %.0f changes/s\n", n, (double)n / (t1 - t0));
    printf("local commits into %u keys: %.0f changes/s (median batch), %.0f overall\n", n,
           median(local_b), (double)done / (t5 - t4));
    printf("remote catch-up 0 -> %u:     %.0f changes/s (decode + receive)\n", n,
           (double)n / (t3 - t2));
    printf("remote into %u keys:        %.0f changes/s decode + receive (median batch), %.0f "
           "overall\n",
           n, median(dec_b), (double)done / (t7 - t6));
    printf("                             %.0f changes/s receive only (median batch), %.0f "
           "overall\n",
           median(rec_b), (double)done / trecv);
    printf("memory, whole replica:       %.1f B/key heap (doc + DAG of one change per key), "
           "%.1f B/key RSS\n",
           (double)heap_a / n, (double)rss_a / n);
    printf("memory, bare DAG:            %.1f B/change heap (bodies kept as bytes), %.1f "
           "B/change (bodies from a loader)\n",
           (double)heap_dag / n, (double)heap_dag_ld / n);
    printf("memory, document state:      %.1f B/key heap (replica - DAG; values are the "
           "doc's copies)\n",
           ((double)heap_b - (double)heap_dag) / n);
    printf("memory, replica with loader: %.1f B/key heap (document state + loader DAG)\n",
           ((double)heap_b - (double)heap_dag + (double)heap_dag_ld) / n);
    cairn_doc_free(a);
    cairn_doc_free(b);
    return 0;
}
