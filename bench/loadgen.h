/* cairn-loadgen internals shared by its files: the run configuration, the
 * result of one run, and the engine that drives gRPC (loadgen_rpc.c).
 *
 * One run = connect, optional warm-up, a measured window of |duration_s|,
 * then a drain bounded by the per-request deadline. Latency is always
 * measured from the time an operation was scheduled: in open loop that is its
 * slot in the fixed-rate schedule, even if no request context was free at the
 * time (so a stalled server shows up as latency, not as a lower offered
 * rate); in closed loop it is the moment the client issued it. */
#ifndef CAIRN_BENCH_LOADGEN_H
#define CAIRN_BENCH_LOADGEN_H

#include <stddef.h>
#include <stdint.h>

#include "loadgen_hist.h"
#include "loadgen_keys.h"

/* Hard caps: the program never runs longer than this, whatever the flags. */
#define LG_MAX_SECONDS 300.0
#define LG_MAX_CLIENTS 4096
#define LG_MAX_INFLIGHT 65536
#define LG_MAX_CONNS 256
#define LG_MAX_THREADS 16
#define LG_MAX_KEY_SIZE 4096
#define LG_MAX_VALUE_SIZE (1024 * 1024)
#define LG_MAX_KEYS 100000000ull
/* A CAS operation that still conflicts after this many Txn attempts fails. */
#define LG_CAS_MAX_ATTEMPTS 100
/* gRPC status codes are 0..16; slot 17 counts responses we could not parse. */
#define LG_NCODES 18
#define LG_CODE_BAD_RESPONSE 17
#define LG_TIMELINE_MAX 600

typedef enum lg_workload {
    LG_WL_A,            /* YCSB A: 50% read, 50% update */
    LG_WL_B,            /* YCSB B: 95% read, 5% update */
    LG_WL_C,            /* YCSB C: read only */
    LG_WL_LOAD,         /* insert keys 0..keys-1 once each, in order */
    LG_WL_PUT,          /* put only */
    LG_WL_RANGE,        /* range of one key */
    LG_WL_RANGE_PREFIX, /* range over a 100-key prefix */
    LG_WL_TXN_CAS,      /* read, Txn(mod_revision == seen ? put : get), retry */
    LG_WL_COUNT
} lg_workload;

/* What one operation is, for per-kind latency. */
typedef enum lg_kind { LG_KIND_READ, LG_KIND_WRITE, LG_KIND_CAS, LG_KIND_COUNT } lg_kind;

typedef struct lg_config {
    char target[300];   /* gRPC target built from the endpoint */
    char endpoint[256]; /* as given, for the report */
    /* TLS (--cacert, --cert, --key): PEM file paths, borrowed from argv;
     * cacert NULL = plaintext */
    const char *cacert, *cert, *key;
    lg_workload workload;
    int open_loop;    /* 1: fixed --rate; 0: --clients as fast as possible */
    double rate;      /* ops/s, open loop */
    int clients;      /* closed loop */
    int max_inflight; /* open loop: request contexts */
    int conns;        /* gRPC channels, each its own TCP connection */
    int threads;      /* completion-queue threads */
    double duration_s, warmup_s, timeout_s;
    uint64_t keys;
    uint64_t first_key; /* load: insert keys first_key..keys-1 (default 0) */
    size_t key_size, value_size;
    lg_dist dist;
    double theta;
    int serializable;
    int verify; /* check read replies (assumes every key exists) */
    uint64_t seed;
} lg_config;

typedef struct lg_result {
    lg_hist all;
    lg_hist by_kind[LG_KIND_COUNT];
    uint64_t ok;                /* successful ops scheduled in the window */
    uint64_t errors[LG_NCODES]; /* failed ops by gRPC status code */
    char first_error[LG_NCODES][160];
    uint64_t cas_conflicts;   /* Txn attempts whose compare failed */
    uint64_t cas_exhausted;   /* CAS ops that gave up */
    uint64_t late;            /* open loop: sent >1 ms after their slot */
    uint64_t unsent;          /* open loop: slots in the window never sent */
    uint64_t abandoned;       /* CAS ops cut short by the end of the run */
    uint64_t inserted;        /* load: keys inserted */
    uint64_t verify_failures; /* --verify: reads with the wrong keys */
    char first_verify_failure[160];
    int load_done; /* load: every key inserted before the end */
    int drain_timed_out;
    double window_s;                    /* measured window actually used */
    double window_start_unix;           /* when the window began, wall clock (s) */
    uint64_t timeline[LG_TIMELINE_MAX]; /* ok ops per second of the window */
    int timeline_len;
    /* By the second of each op's slot (its scheduled start) in the window:
     * ok and failed ops, and the latency sum and max of the ok ones (ns) */
    uint64_t slot_ok[LG_TIMELINE_MAX];
    uint64_t slot_errors[LG_TIMELINE_MAX];
    uint64_t slot_lat_sum[LG_TIMELINE_MAX];
    uint64_t slot_lat_max[LG_TIMELINE_MAX];
} lg_result;

const char *lg_workload_name(lg_workload w);
int lg_workload_parse(lg_workload *out, const char *s);
const char *lg_kind_name(lg_kind k);
const char *lg_status_name(int code);

/* Runs one phase described by |cfg| and fills |res|. Returns 0, or -1 with a
 * message on stderr when the endpoint cannot be reached (nothing measured).
 * grpc_init() must have been called. */
int lg_run(lg_result *res, const lg_config *cfg);

#endif
