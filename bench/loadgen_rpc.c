/* The engine of cairn-loadgen: etcd KV calls over the gRPC core C API.
 *
 * Each operation is one unary call (two or more for the CAS workload) made
 * of a single batch — send metadata, message and close, receive metadata,
 * message and status — whose completion arrives on the completion queue of
 * one poller thread. Channels are opened with a local subchannel pool, so
 * --conns channels really are --conns TCP connections, and channel c always
 * reports to poller c % --threads; each poller records into its own
 * histograms, merged at the end, so the hot path takes no lock.
 *
 * Open loop: the calling thread is the pacer. It sleeps until the next slot
 * of the fixed-rate schedule (clock_nanosleep on an absolute time, so the
 * schedule does not drift), takes a free request context and sends. When no
 * context is free it waits, and the overdue slots are sent as soon as one
 * frees, each still timed from its slot: that is what keeps a stalled server
 * from hiding as "coordinated omission". Slots that never got a context
 * before the end are reported as unsent. Closed loop: each context is a
 * client that issues its next operation from the completion of the last.
 *
 * Every call has a deadline (--timeout), so the drain after the measured
 * window is bounded without cancelling calls from another thread. */
#include "loadgen.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcdserverpb/rpc.pb-c.h"
#include "mvccpb/kv.pb-c.h"
#include "server/rpc/unary_ops.h"

#define NS_PER_S 1000000000ull
#define LATE_NS 1000000ull
/* Random offsets into the value pool, so that values differ between puts. */
#define VALUE_POOL_SLACK 256

typedef struct engine engine;

typedef struct poller {
    engine *eng;
    grpc_completion_queue *cq;
    pthread_t tid;
    lg_result stats;
} poller;

typedef struct op_ctx {
    engine *eng;
    int chan;
    grpc_call *call;
    grpc_metadata_array md_init, md_trail;
    grpc_byte_buffer *send_bb, *recv_bb;
    grpc_status_code status;
    grpc_slice details;
    uint64_t sched_ns, sent_ns;
    uint64_t key;
    lg_kind kind;
    int prefix;   /* read: range over the key's 100-key prefix */
    int cas_step; /* 0: initial Range, 1: Txn */
    int attempts;
    int64_t seen_mod;
    uint64_t rng;
    char *keybuf, *endbuf;
    uint8_t *buf;
    size_t buf_cap;
    struct op_ctx *next_free;
} op_ctx;

struct engine {
    const lg_config *cfg;
    grpc_channel **chans;
    poller *pollers;
    op_ctx *ctxs;
    int nctx;
    lg_keygen kg;
    uint8_t *value_pool;
    uint64_t t0, w0, w1;
    atomic_int stop;      /* no new operations */
    atomic_int hard_stop; /* abandon multi-step operations too */
    atomic_int inflight;  /* contexts with an operation under way */
    atomic_uint_fast64_t next_insert;
    atomic_int load_exhausted;
    atomic_uint_fast64_t last_done_ns;
    atomic_uint rr;
    atomic_uint_fast64_t late;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op_ctx *free_list;
    op_ctx *parked; /* closed loop: clients waiting out an UNAVAILABLE */
};

static const char *const workload_names[LG_WL_COUNT] = {
    "a", "b", "c", "load", "put", "range", "range-prefix", "txn-cas"};

const char *lg_workload_name(lg_workload w)
{
    return (unsigned)w < LG_WL_COUNT ? workload_names[w] : "?";
}

int lg_workload_parse(lg_workload *out, const char *s)
{
    for (int i = 0; i < LG_WL_COUNT; i++) {
        if (strcmp(s, workload_names[i]) == 0) {
            *out = (lg_workload)i;
            return 0;
        }
    }
    if (strcmp(s, "ycsb-a") == 0)
        return *out = LG_WL_A, 0;
    if (strcmp(s, "ycsb-b") == 0)
        return *out = LG_WL_B, 0;
    if (strcmp(s, "ycsb-c") == 0)
        return *out = LG_WL_C, 0;
    return -1;
}

const char *lg_kind_name(lg_kind k)
{
    static const char *const names[LG_KIND_COUNT] = {"read", "write", "cas"};
    return (unsigned)k < LG_KIND_COUNT ? names[k] : "?";
}

const char *lg_status_name(int code)
{
    static const char *const names[LG_NCODES] = {"OK",
                                                 "CANCELLED",
                                                 "UNKNOWN",
                                                 "INVALID_ARGUMENT",
                                                 "DEADLINE_EXCEEDED",
                                                 "NOT_FOUND",
                                                 "ALREADY_EXISTS",
                                                 "PERMISSION_DENIED",
                                                 "RESOURCE_EXHAUSTED",
                                                 "FAILED_PRECONDITION",
                                                 "ABORTED",
                                                 "OUT_OF_RANGE",
                                                 "UNIMPLEMENTED",
                                                 "INTERNAL",
                                                 "UNAVAILABLE",
                                                 "DATA_LOSS",
                                                 "UNAUTHENTICATED",
                                                 "BAD_RESPONSE"};
    return (unsigned)code < LG_NCODES ? names[code] : "?";
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / NS_PER_S), (long)(t % NS_PER_S)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static gpr_timespec deadline_in(double seconds)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_micros((int64_t)(seconds * 1e6), GPR_TIMESPAN));
}

static int in_window(const engine *e, uint64_t sched)
{
    return sched >= e->w0 && sched < e->w1;
}

static ProtobufCBinaryData bin(const void *p, size_t n)
{
    ProtobufCBinaryData b = {n, (uint8_t *)p};
    return b;
}

static ProtobufCBinaryData pick_value(op_ctx *c)
{
    size_t off = (size_t)lg_rng_below(&c->rng, VALUE_POOL_SLACK);
    return bin(c->eng->value_pool + off, c->eng->cfg->value_size);
}

/* Packs |m| into the context's buffer, growing it if request_cap() guessed
 * short (it should not). */
static size_t pack(op_ctx *c, const ProtobufCMessage *m)
{
    size_t need = protobuf_c_message_get_packed_size(m);
    if (need > c->buf_cap) {
        uint8_t *nb = realloc(c->buf, need);
        if (nb == NULL) {
            fprintf(stderr, "cairn-loadgen: out of memory\n");
            abort();
        }
        c->buf = nb;
        c->buf_cap = need;
    }
    return protobuf_c_message_pack(m, c->buf);
}

/* ---- building requests ------------------------------------------------ */

static const char *build_request(op_ctx *c, size_t *len)
{
    const lg_config *cfg = c->eng->cfg;
    size_t ks = cfg->key_size;
    ProtobufCBinaryData key = bin(c->keybuf, ks);
    if (c->kind == LG_KIND_READ) {
        Etcdserverpb__RangeRequest r = ETCDSERVERPB__RANGE_REQUEST__INIT;
        r.key = key;
        if (c->prefix) {
            /* keys 100g..100g+99 share their first ks-2 bytes; the last of those
             * is a digit, so +1 cannot carry */
            memcpy(c->endbuf, c->keybuf, ks - 2);
            c->endbuf[ks - 3]++;
            r.key = bin(c->keybuf, ks - 2);
            r.range_end = bin(c->endbuf, ks - 2);
        }
        r.serializable = cfg->serializable != 0;
        *len = pack(c, &r.base);
        return "/etcdserverpb.KV/Range";
    }
    if (c->kind == LG_KIND_WRITE) {
        Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
        p.key = key;
        p.value = pick_value(c);
        *len = pack(c, &p.base);
        return "/etcdserverpb.KV/Put";
    }
    if (c->cas_step == 0) {
        /* Kubernetes' GuaranteedUpdate reads the current object first. */
        Etcdserverpb__RangeRequest r = ETCDSERVERPB__RANGE_REQUEST__INIT;
        r.key = key;
        r.serializable = cfg->serializable != 0;
        *len = pack(c, &r.base);
        return "/etcdserverpb.KV/Range";
    }
    /* If(mod_revision(key) == seen) Then(Put) Else(Get): the else branch
     * hands back the fresh revision for the retry, as Kubernetes does. */
    Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
    cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
    cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD;
    cmp.key = key;
    cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
    cmp.mod_revision = c->seen_mod;
    Etcdserverpb__Compare *cmps[1] = {&cmp};
    Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
    put.key = key;
    put.value = pick_value(c);
    Etcdserverpb__RequestOp on_ok = ETCDSERVERPB__REQUEST_OP__INIT;
    on_ok.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
    on_ok.request_put = &put;
    Etcdserverpb__RangeRequest get = ETCDSERVERPB__RANGE_REQUEST__INIT;
    get.key = key;
    Etcdserverpb__RequestOp on_fail = ETCDSERVERPB__REQUEST_OP__INIT;
    on_fail.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
    on_fail.request_range = &get;
    Etcdserverpb__RequestOp *oks[1] = {&on_ok}, *fails[1] = {&on_fail};
    Etcdserverpb__TxnRequest t = ETCDSERVERPB__TXN_REQUEST__INIT;
    t.n_compare = 1;
    t.compare = cmps;
    t.n_success = 1;
    t.success = oks;
    t.n_failure = 1;
    t.failure = fails;
    *len = pack(c, &t.base);
    return "/etcdserverpb.KV/Txn";
}

/* Starts the current step of |c| as one call. On failure to even start
 * (out of memory, a gRPC usage error) the step completes at once with
 * status INTERNAL, via the same path as a server error. */
static void send_step(op_ctx *c)
{
    engine *e = c->eng;
    size_t len = 0;
    const char *method = build_request(c, &len);
    grpc_slice msg = grpc_slice_from_copied_buffer((const char *)c->buf, len);
    c->send_bb = grpc_raw_byte_buffer_create(&msg, 1);
    grpc_slice_unref(msg);
    c->recv_bb = NULL;
    c->status = GRPC_STATUS_OK;
    c->details = grpc_empty_slice();
    grpc_metadata_array_init(&c->md_init);
    grpc_metadata_array_init(&c->md_trail);
    poller *p = &e->pollers[c->chan % e->cfg->threads];
    c->call = grpc_channel_create_call(e->chans[c->chan], NULL, GRPC_PROPAGATE_DEFAULTS, p->cq,
                                       grpc_slice_from_static_string(method), NULL,
                                       deadline_in(e->cfg->timeout_s), NULL);
    grpc_op ops[6];
    rpc_unary_ops(ops, c->send_bb, &c->md_init, &c->recv_bb, &c->md_trail, &c->status, &c->details);
    c->sent_ns = now_ns();
    if (c->call == NULL || grpc_call_start_batch(c->call, ops, 6, c, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "cairn-loadgen: could not start a call\n");
        abort(); /* a usage error of ours, not a server behaviour */
    }
}

/* Chooses the next operation for |c| and sends it. Returns 0, or -1 when
 * there is nothing left to do (the load phase inserted every key). */
static int begin_op(op_ctx *c, uint64_t sched)
{
    engine *e = c->eng;
    const lg_config *cfg = e->cfg;
    c->sched_ns = sched;
    c->prefix = 0;
    c->cas_step = 0;
    c->attempts = 0;
    c->seen_mod = 0;
    double read_share = 0;
    switch (cfg->workload) {
    case LG_WL_A:
        read_share = 0.5;
        break;
    case LG_WL_B:
        read_share = 0.95;
        break;
    case LG_WL_C:
    case LG_WL_RANGE:
    case LG_WL_RANGE_PREFIX:
        read_share = 1.0;
        break;
    default:
        break;
    }
    if (cfg->workload == LG_WL_LOAD) {
        uint64_t k = atomic_fetch_add(&e->next_insert, 1);
        if (k >= cfg->keys) {
            atomic_store(&e->load_exhausted, 1);
            return -1;
        }
        c->key = k;
        c->kind = LG_KIND_WRITE;
    } else {
        c->key = lg_keygen_next(&e->kg, &c->rng);
        if (cfg->workload == LG_WL_TXN_CAS)
            c->kind = LG_KIND_CAS;
        else if (read_share >= 1.0 || (read_share > 0 && lg_rng_unit(&c->rng) < read_share))
            c->kind = LG_KIND_READ;
        else
            c->kind = LG_KIND_WRITE;
        if (cfg->workload == LG_WL_RANGE_PREFIX) {
            c->prefix = 1;
            c->key = c->key / 100 * 100;
        }
    }
    lg_key_format(c->keybuf, cfg->key_size, c->key);
    send_step(c);
    if (cfg->open_loop && in_window(e, sched) && c->sent_ns - sched > LATE_NS)
        atomic_fetch_add(&e->late, 1);
    return 0;
}

/* ---- completions -------------------------------------------------------- */

static void finish_call(op_ctx *c)
{
    grpc_call_unref(c->call);
    c->call = NULL;
    grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
    grpc_metadata_array_destroy(&c->md_init);
    grpc_metadata_array_destroy(&c->md_trail);
}

static void drop_reply(op_ctx *c)
{
    if (c->recv_bb)
        grpc_byte_buffer_destroy(c->recv_bb);
    c->recv_bb = NULL;
    grpc_slice_unref(c->details);
    c->details = grpc_empty_slice();
}

/* The reply as one contiguous slice (the caller unrefs it). */
static grpc_slice reply_bytes(op_ctx *c)
{
    grpc_byte_buffer_reader r;
    if (c->recv_bb == NULL || !grpc_byte_buffer_reader_init(&r, c->recv_bb))
        return grpc_empty_slice();
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    return s;
}

static int64_t first_mod_revision(const Etcdserverpb__RangeResponse *rr)
{
    if (rr == NULL || rr->n_kvs == 0 || rr->kvs[0] == NULL)
        return 0;
    return rr->kvs[0]->mod_revision;
}

/* Advances a CAS operation by one reply. Returns 1 when another call was
 * started, 0 when the operation is over with *code set (OK, or
 * LG_CODE_BAD_RESPONSE / the exhausted marker -1 / abandoned -2). */
static int cas_advance(op_ctx *c, poller *p, int *code)
{
    engine *e = c->eng;
    grpc_slice s = reply_bytes(c);
    const uint8_t *bytes = GRPC_SLICE_START_PTR(s);
    size_t n = GRPC_SLICE_LENGTH(s);
    if (c->cas_step == 0) {
        Etcdserverpb__RangeResponse *rr = etcdserverpb__range_response__unpack(NULL, n, bytes);
        grpc_slice_unref(s);
        if (rr == NULL)
            return *code = LG_CODE_BAD_RESPONSE, 0;
        c->seen_mod = first_mod_revision(rr);
        etcdserverpb__range_response__free_unpacked(rr, NULL);
    } else {
        Etcdserverpb__TxnResponse *tr = etcdserverpb__txn_response__unpack(NULL, n, bytes);
        grpc_slice_unref(s);
        if (tr == NULL)
            return *code = LG_CODE_BAD_RESPONSE, 0;
        if (tr->succeeded) {
            etcdserverpb__txn_response__free_unpacked(tr, NULL);
            return *code = 0, 0;
        }
        int ok =
            tr->n_responses == 1 && tr->responses[0] != NULL &&
            tr->responses[0]->response_case == ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE;
        if (ok)
            c->seen_mod = first_mod_revision(tr->responses[0]->response_range);
        etcdserverpb__txn_response__free_unpacked(tr, NULL);
        if (!ok)
            return *code = LG_CODE_BAD_RESPONSE, 0;
        if (in_window(e, c->sched_ns))
            p->stats.cas_conflicts++;
        if (c->attempts >= LG_CAS_MAX_ATTEMPTS)
            return *code = -1, 0;
    }
    if (atomic_load(&e->hard_stop))
        return *code = -2, 0;
    c->cas_step = 1;
    c->attempts++;
    drop_reply(c);
    send_step(c);
    return 1;
}

/* --verify: a single-key read must return exactly that key; a prefix read
 * the 100 keys of the prefix (fewer in the last, partial group). */
static void verify_read(op_ctx *c, poller *p)
{
    const lg_config *cfg = c->eng->cfg;
    grpc_slice s = reply_bytes(c);
    Etcdserverpb__RangeResponse *rr =
        etcdserverpb__range_response__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    uint64_t want = 1;
    if (c->prefix)
        want = cfg->keys - c->key < 100 ? cfg->keys - c->key : 100;
    const char *why = NULL;
    if (rr == NULL)
        why = "reply does not decode";
    else if (rr->n_kvs != want || rr->count != (int64_t)want)
        why = "wrong number of keys";
    else if (!c->prefix && (rr->kvs[0]->key.len != cfg->key_size ||
                            memcmp(rr->kvs[0]->key.data, c->keybuf, cfg->key_size) != 0))
        why = "wrong key";
    else if (rr->kvs[0]->value.len != cfg->value_size && cfg->workload != LG_WL_RANGE_PREFIX)
        why = "wrong value size";
    if (why && in_window(c->eng, c->sched_ns)) {
        p->stats.verify_failures++;
        if (p->stats.first_verify_failure[0] == '\0')
            snprintf(p->stats.first_verify_failure, sizeof p->stats.first_verify_failure,
                     "%s: key %.*s, want %llu keys, got %lld (%zu kvs)", why, (int)cfg->key_size,
                     c->keybuf, (unsigned long long)want, rr ? (long long)rr->count : -1LL,
                     rr ? rr->n_kvs : (size_t)0);
    }
    if (rr)
        etcdserverpb__range_response__free_unpacked(rr, NULL);
}

static void record(op_ctx *c, poller *p, int code, uint64_t done)
{
    engine *e = c->eng;
    lg_result *st = &p->stats;
    uint64_t prev = atomic_load(&e->last_done_ns);
    while (done > prev && !atomic_compare_exchange_weak(&e->last_done_ns, &prev, done)) {
    }
    if (code == 0 && e->cfg->workload == LG_WL_LOAD)
        st->inserted++;
    if (!in_window(e, c->sched_ns))
        return;
    if (code == -1) {
        st->cas_exhausted++;
        return;
    }
    if (code == -2) {
        st->abandoned++;
        return;
    }
    uint64_t slot = (c->sched_ns - e->w0) / NS_PER_S;
    if (slot >= LG_TIMELINE_MAX)
        slot = LG_TIMELINE_MAX - 1;
    if (code != 0) {
        st->errors[code]++;
        st->slot_errors[slot]++;
        if (st->first_error[code][0] == '\0') {
            char *d = grpc_slice_to_c_string(c->details);
            const char *why = code == LG_CODE_BAD_RESPONSE
                                  ? "status OK, reply missing or undecodable"
                              : d[0] ? d
                                     : "(no message)";
            snprintf(st->first_error[code], sizeof st->first_error[code], "%s", why);
            gpr_free(d);
        }
        return;
    }
    uint64_t lat = done - c->sched_ns;
    lg_hist_record(&st->all, lat);
    lg_hist_record(&st->by_kind[c->kind], lat);
    st->ok++;
    st->slot_ok[slot]++;
    st->slot_lat_sum[slot] += lat;
    if (lat > st->slot_lat_max[slot])
        st->slot_lat_max[slot] = lat;
    if (done >= e->w0) {
        uint64_t sec = (done - e->w0) / NS_PER_S;
        if (sec < LG_TIMELINE_MAX)
            st->timeline[sec]++;
    }
}

static void release(op_ctx *c)
{
    engine *e = c->eng;
    if (e->cfg->open_loop) {
        pthread_mutex_lock(&e->mu);
        c->next_free = e->free_list;
        e->free_list = c;
        atomic_fetch_sub(&e->inflight, 1);
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
    } else {
        atomic_fetch_sub(&e->inflight, 1);
    }
}

static void on_complete(op_ctx *c, poller *p, int batch_ok)
{
    engine *e = c->eng;
    finish_call(c);
    int code = (int)c->status;
    if (!batch_ok && code == 0)
        code = GRPC_STATUS_UNKNOWN;
    if (code < 0 || code >= LG_NCODES)
        code = GRPC_STATUS_UNKNOWN;
    if (code == 0 && c->recv_bb == NULL)
        code = LG_CODE_BAD_RESPONSE; /* OK status but no reply message */
    if (code == 0 && c->kind == LG_KIND_CAS) {
        if (cas_advance(c, p, &code))
            return; /* next step under way; reply dropped there */
    }
    uint64_t done = now_ns();
    if (code == 0 && c->kind == LG_KIND_READ && e->cfg->verify)
        verify_read(c, p);
    record(c, p, code, done);
    drop_reply(c);
    if (!e->cfg->open_loop && code == GRPC_STATUS_UNAVAILABLE) {
        /* A server that is down fails calls at once; rather than spin on
         * a shared machine, the client waits for the next tick of
         * run_closed(). stop is read under the lock that unpark() takes. */
        pthread_mutex_lock(&e->mu);
        if (!atomic_load(&e->stop)) {
            c->next_free = e->parked;
            e->parked = c;
            pthread_mutex_unlock(&e->mu);
            return;
        }
        pthread_mutex_unlock(&e->mu);
    }
    if (!e->cfg->open_loop && !atomic_load(&e->stop) && begin_op(c, now_ns()) == 0)
        return;
    release(c);
}

static void *poll_main(void *arg)
{
    poller *p = arg;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE)
            on_complete(ev.tag, p, ev.success);
    }
    return NULL;
}

/* ---- setup ---------------------------------------------------------------- */

static char *read_pem(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = f ? malloc(1 << 20) : NULL;
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    if (f)
        fclose(f);
    if (!buf || !n) {
        fprintf(stderr, "cairn-loadgen: cannot read %s\n", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* Plaintext, or TLS with --cacert (and a client certificate with --cert
 * and --key). NULL with a message when a file does not read. */
static grpc_channel_credentials *channel_creds(const lg_config *cfg)
{
    if (!cfg->cacert)
        return grpc_insecure_credentials_create();
    char *ca = read_pem(cfg->cacert);
    char *cert = ca && cfg->cert ? read_pem(cfg->cert) : NULL;
    char *key = cert && cfg->key ? read_pem(cfg->key) : NULL;
    grpc_channel_credentials *cr = NULL;
    if (ca && (!cfg->cert || (cert && key))) {
        grpc_ssl_pem_key_cert_pair kp = {key, cert};
        cr = grpc_ssl_credentials_create_ex(ca, cert ? &kp : NULL, NULL, NULL);
    }
    free(ca);
    free(cert);
    free(key);
    return cr;
}

static int connect_all(engine *e)
{
    const lg_config *cfg = e->cfg;
    grpc_arg args[3];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[0].value.integer = 1;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_ENABLE_RETRIES;
    args[1].value.integer = 0;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[2].value.integer = -1;
    grpc_channel_args ca = {3, args};
    grpc_channel_credentials *creds = channel_creds(cfg);
    if (!creds)
        return -1;
    for (int i = 0; i < cfg->conns; i++)
        e->chans[i] = grpc_channel_create(cfg->target, creds, &ca);
    grpc_channel_credentials_release(creds);

    /* Wait until every connection is up, so that connecting is not measured. */
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    gpr_timespec deadline = deadline_in(5.0);
    int rc = 0;
    for (int i = 0; i < cfg->conns && rc == 0; i++) {
        for (;;) {
            grpc_connectivity_state st = grpc_channel_check_connectivity_state(e->chans[i], 1);
            if (st == GRPC_CHANNEL_READY)
                break;
            if (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), deadline) >= 0) {
                fprintf(stderr, "cairn-loadgen: cannot connect to %s within 5 s\n", cfg->endpoint);
                rc = -1;
                break;
            }
            grpc_channel_watch_connectivity_state(e->chans[i], st, deadline, cq, NULL);
            grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        }
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    return rc;
}

static size_t request_cap(const lg_config *cfg)
{
    /* a Txn carries the key three times and one value, plus framing */
    return 3 * cfg->key_size + cfg->value_size + 256;
}

static int engine_init(engine *e, const lg_config *cfg)
{
    memset(e, 0, sizeof *e);
    e->cfg = cfg;
    atomic_init(&e->next_insert, cfg->first_key);
    e->nctx = cfg->open_loop ? cfg->max_inflight : cfg->clients;
    pthread_mutex_init(&e->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (lg_keygen_init(&e->kg, cfg->keys, cfg->dist, cfg->theta) != 0)
        return -1;
    e->chans = calloc((size_t)cfg->conns, sizeof *e->chans);
    e->pollers = calloc((size_t)cfg->threads, sizeof *e->pollers);
    e->ctxs = calloc((size_t)e->nctx, sizeof *e->ctxs);
    e->value_pool = malloc(cfg->value_size + VALUE_POOL_SLACK);
    if (!e->chans || !e->pollers || !e->ctxs || !e->value_pool)
        return -1;
    uint64_t vr = cfg->seed ^ 0x76616c7565ull;
    for (size_t i = 0; i < cfg->value_size + VALUE_POOL_SLACK; i++)
        e->value_pool[i] = (uint8_t)('a' + lg_rng_below(&vr, 26));
    uint64_t seeder = cfg->seed;
    for (int i = 0; i < e->nctx; i++) {
        op_ctx *c = &e->ctxs[i];
        c->eng = e;
        c->chan = i % cfg->conns;
        c->rng = lg_rng_next(&seeder);
        c->buf_cap = request_cap(cfg);
        c->buf = malloc(c->buf_cap);
        c->keybuf = malloc(cfg->key_size);
        c->endbuf = malloc(cfg->key_size);
        if (!c->buf || !c->keybuf || !c->endbuf)
            return -1;
        c->details = grpc_empty_slice();
        c->next_free = e->free_list;
        e->free_list = c;
    }
    for (int i = 0; i < cfg->threads; i++) {
        e->pollers[i].eng = e;
        e->pollers[i].cq = grpc_completion_queue_create_for_next(NULL);
        lg_hist_init(&e->pollers[i].stats.all);
        for (int k = 0; k < LG_KIND_COUNT; k++)
            lg_hist_init(&e->pollers[i].stats.by_kind[k]);
    }
    return 0;
}

static void engine_destroy(engine *e)
{
    if (e->ctxs) {
        for (int i = 0; i < e->nctx; i++) {
            free(e->ctxs[i].buf);
            free(e->ctxs[i].keybuf);
            free(e->ctxs[i].endbuf);
        }
    }
    if (e->chans) {
        for (int i = 0; i < e->cfg->conns; i++)
            if (e->chans[i])
                grpc_channel_destroy(e->chans[i]);
    }
    free(e->chans);
    free(e->pollers);
    free(e->ctxs);
    free(e->value_pool);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
}

/* ---- the two loops -------------------------------------------------------- */

/* Takes a free context, waiting until one frees up or |until| passes. */
static op_ctx *take_free(engine *e, uint64_t until)
{
    struct timespec ts = {(time_t)(until / NS_PER_S), (long)(until % NS_PER_S)};
    pthread_mutex_lock(&e->mu);
    while (e->free_list == NULL) {
        if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT && e->free_list == NULL) {
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
    }
    op_ctx *c = e->free_list;
    e->free_list = c->next_free;
    atomic_fetch_add(&e->inflight, 1);
    pthread_mutex_unlock(&e->mu);
    return c;
}

static void give_back(engine *e, op_ctx *c)
{
    pthread_mutex_lock(&e->mu);
    c->next_free = e->free_list;
    e->free_list = c;
    atomic_fetch_sub(&e->inflight, 1);
    pthread_mutex_unlock(&e->mu);
}

static uint64_t run_open(engine *e)
{
    const lg_config *cfg = e->cfg;
    double interval = 1e9 / cfg->rate;
    uint64_t k = 0;
    for (;; k++) {
        uint64_t sched = e->t0 + (uint64_t)((double)k * interval);
        if (sched >= e->w1)
            break;
        sleep_until(sched);
        op_ctx *c = take_free(e, e->w1);
        if (c == NULL)
            break;
        c->chan = (int)(atomic_fetch_add(&e->rr, 1) % (unsigned)cfg->conns);
        if (begin_op(c, sched) != 0) {
            give_back(e, c);
            break;
        }
    }
    /* window slots that were never sent */
    uint64_t unsent = 0;
    if (!atomic_load(&e->load_exhausted)) {
        for (;; k++) {
            uint64_t sched = e->t0 + (uint64_t)((double)k * interval);
            if (sched >= e->w1)
                break;
            if (sched >= e->w0)
                unsent++;
        }
    }
    return unsent;
}

/* Restarts the parked clients, or (once stop is set) retires them. */
static void unpark(engine *e)
{
    pthread_mutex_lock(&e->mu);
    op_ctx *c = e->parked;
    e->parked = NULL;
    pthread_mutex_unlock(&e->mu);
    while (c) {
        op_ctx *next = c->next_free;
        if (atomic_load(&e->stop) || begin_op(c, now_ns()) != 0)
            atomic_fetch_sub(&e->inflight, 1);
        c = next;
    }
}

static void run_closed(engine *e)
{
    uint64_t start = now_ns();
    for (int i = 0; i < e->nctx; i++) {
        atomic_fetch_add(&e->inflight, 1);
        if (begin_op(&e->ctxs[i], start) != 0) {
            atomic_fetch_sub(&e->inflight, 1);
            break;
        }
    }
    for (;;) {
        uint64_t now = now_ns();
        if (now >= e->w1)
            break;
        if (atomic_load(&e->load_exhausted) && atomic_load(&e->inflight) == 0)
            break;
        uint64_t next = now + 10 * 1000 * 1000ull;
        sleep_until(next < e->w1 ? next : e->w1);
        unpark(e);
    }
}

static void wait_inflight(engine *e, uint64_t until)
{
    while (atomic_load(&e->inflight) > 0 && now_ns() < until)
        sleep_until(now_ns() + 1000000ull);
}

int lg_run(lg_result *res, const lg_config *cfg)
{
    engine *e = calloc(1, sizeof *e);
    int rc = -1;
    memset(res, 0, sizeof *res);
    lg_hist_init(&res->all);
    for (int k = 0; k < LG_KIND_COUNT; k++)
        lg_hist_init(&res->by_kind[k]);
    if (e == NULL || engine_init(e, cfg) != 0) {
        fprintf(stderr, "cairn-loadgen: out of memory or bad configuration\n");
        if (e) {
            e->cfg = cfg;
            engine_destroy(e);
        }
        free(e);
        return -1;
    }
    if (connect_all(e) != 0)
        goto out;
    for (int i = 0; i < cfg->threads; i++)
        pthread_create(&e->pollers[i].tid, NULL, poll_main, &e->pollers[i]);

    e->t0 = now_ns();
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    res->window_start_unix = (double)wall.tv_sec + (double)wall.tv_nsec / 1e9 + cfg->warmup_s;
    e->w0 = e->t0 + (uint64_t)(cfg->warmup_s * 1e9);
    e->w1 = e->w0 + (uint64_t)(cfg->duration_s * 1e9);
    uint64_t unsent = 0;
    if (cfg->open_loop)
        unsent = run_open(e);
    else
        run_closed(e);
    atomic_store(&e->stop, 1);
    unpark(e);
    /* Drain: calls in flight end by their deadline; multi-step operations
     * get one more deadline's worth, then are abandoned. */
    uint64_t grace = (uint64_t)((cfg->timeout_s + 1.0) * 1e9);
    wait_inflight(e, now_ns() + grace);
    atomic_store(&e->hard_stop, 1);
    wait_inflight(e, now_ns() + grace);
    if (atomic_load(&e->inflight) > 0) {
        /* Should not happen (every call has a deadline). Leave the pollers
         * running; the caller reports and exits without tearing gRPC down. */
        res->drain_timed_out = 1;
    } else {
        for (int i = 0; i < cfg->threads; i++)
            grpc_completion_queue_shutdown(e->pollers[i].cq);
        for (int i = 0; i < cfg->threads; i++) {
            pthread_join(e->pollers[i].tid, NULL);
            grpc_completion_queue_destroy(e->pollers[i].cq);
        }
    }

    for (int i = 0; i < cfg->threads; i++) {
        lg_result *s = &e->pollers[i].stats;
        lg_hist_merge(&res->all, &s->all);
        for (int k = 0; k < LG_KIND_COUNT; k++)
            lg_hist_merge(&res->by_kind[k], &s->by_kind[k]);
        res->ok += s->ok;
        for (int c = 0; c < LG_NCODES; c++) {
            res->errors[c] += s->errors[c];
            if (res->first_error[c][0] == '\0')
                memcpy(res->first_error[c], s->first_error[c], sizeof s->first_error[c]);
        }
        res->cas_conflicts += s->cas_conflicts;
        res->cas_exhausted += s->cas_exhausted;
        res->abandoned += s->abandoned;
        res->inserted += s->inserted;
        res->verify_failures += s->verify_failures;
        if (res->first_verify_failure[0] == '\0')
            memcpy(res->first_verify_failure, s->first_verify_failure,
                   sizeof s->first_verify_failure);
        for (int t = 0; t < LG_TIMELINE_MAX; t++) {
            res->timeline[t] += s->timeline[t];
            res->slot_ok[t] += s->slot_ok[t];
            res->slot_errors[t] += s->slot_errors[t];
            res->slot_lat_sum[t] += s->slot_lat_sum[t];
            if (s->slot_lat_max[t] > res->slot_lat_max[t])
                res->slot_lat_max[t] = s->slot_lat_max[t];
        }
    }
    res->unsent = unsent;
    res->late = atomic_load(&e->late);
    res->load_done = atomic_load(&e->load_exhausted) && res->inserted >= cfg->keys - cfg->first_key;
    uint64_t end = e->w1;
    uint64_t last = atomic_load(&e->last_done_ns);
    if (atomic_load(&e->load_exhausted) && last < end)
        end = last;
    res->window_s = end > e->w0 ? (double)(end - e->w0) / 1e9 : 0.0;
    double tl = res->window_s < (double)LG_TIMELINE_MAX ? res->window_s : (double)LG_TIMELINE_MAX;
    res->timeline_len = (int)tl + ((double)(int)tl < tl ? 1 : 0);
    rc = 0;
    if (res->drain_timed_out) {
        /* the pollers still use e: leak it on purpose */
        return rc;
    }
out:
    if (rc != 0) {
        /* pollers were never started */
        for (int i = 0; i < cfg->threads; i++) {
            grpc_completion_queue_shutdown(e->pollers[i].cq);
            while (grpc_completion_queue_next(e->pollers[i].cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                              NULL)
                       .type != GRPC_QUEUE_SHUTDOWN) {
            }
            grpc_completion_queue_destroy(e->pollers[i].cq);
        }
    }
    engine_destroy(e);
    free(e);
    return rc;
}
