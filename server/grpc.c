/*
 * The gRPC engine: etcd's services on the gRPC core C API.
 *
 * Every method of etcd's API is registered with the server, so a new call
 * arrives with its request bytes already read (GRPC_SRM_PAYLOAD_READ_
 * INITIAL_BYTE_BUFFER); anything else arrives through grpc_server_request_
 * call and is answered UNIMPLEMENTED with grpc-go's words. There are N
 * workers, each with its own completion queue; each keeps a few requests
 * posted per method, so calls spread over the cores without a shared queue.
 * A tag is always an rpc_call whose |state| says what completed.
 *
 * Reads answer on the worker. Writes hand the request to the store and
 * return; the store's committer calls back once the change is durable and
 * the callback sends the response (grpc_call_start_batch is thread-safe),
 * so no worker ever waits for an fsync and no lock is held across I/O.
 *
 * Every error leaves through rpc_fail, with the status and message of the
 * CAIRN_ERRORS row. etcd: sizes are checked as etcd 3.4 does: grpc-go's
 * receive limit is --max-request-bytes + 512 KiB ("grpc: received message
 * larger than max (N vs. M)", RESOURCE_EXHAUSTED); below it, a write whose
 * raft entry would exceed --max-request-bytes fails with "etcdserver:
 * request is too large" (measured: the entry is the request plus 17 bytes).
 * gRPC core's own limit is set to twice the grpc-go one, so a flood is cut
 * off early while etcd's texts hold for every size a client can notice.
 *
 * Shutdown: stop accepting (grpc_server_shutdown_and_notify), let calls in
 * flight finish for a grace period, cancel the rest, then close the store
 * (which completes or fails every pending write) and the queues.
 */
#include "server/rpc.h"

#include "crdt/error.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

enum { ST_NEW = 1, ST_ACTIVE, ST_STREAM, ST_DONE };

/* etcd: grpc-go's receive limit is --max-request-bytes plus this. */
#define GRPC_OVERHEAD_BYTES (512u * 1024u)
/* etcd: InternalRaftRequest = request + header (13 bytes with the 9-byte
 * request id etcd's default member gets) + field tag + length varint. */
#define RAFT_HEADER_BYTES 13u

struct rpc_worker {
    cairn_server *srv;
    grpc_completion_queue *cq;
    pthread_t thread;
    int running;
};

#define UNARY(path, fn, checked, slots) {path, RPC_UNARY, fn, checked, slots}
#define NOPE(path) {path, RPC_UNARY, unimplemented, 0, 1}

const rpc_method rpc_methods[] = {
    UNARY("/etcdserverpb.KV/Range", kv_range, 0, 8),
    UNARY("/etcdserverpb.KV/Put", kv_put, 1, 8),
    UNARY("/etcdserverpb.KV/DeleteRange", kv_delete_range, 1, 4),
    UNARY("/etcdserverpb.KV/Txn", kv_txn, 0, 8), /* kv_txn checks writes itself */
    UNARY("/etcdserverpb.KV/Compact", kv_compact, 1, 1),
    {"/etcdserverpb.Watch/Watch", RPC_BIDI, watch_stream, 0, 2},
    UNARY("/etcdserverpb.Lease/LeaseGrant", lease_grant, 1, 2),
    UNARY("/etcdserverpb.Lease/LeaseRevoke", lease_revoke, 1, 2),
    {"/etcdserverpb.Lease/LeaseKeepAlive", RPC_BIDI, lease_keep_alive, 0, 2},
    UNARY("/etcdserverpb.Lease/LeaseTimeToLive", lease_time_to_live, 0, 1),
    UNARY("/etcdserverpb.Lease/LeaseLeases", lease_leases, 0, 1),
    NOPE("/etcdserverpb.Cluster/MemberAdd"),
    NOPE("/etcdserverpb.Cluster/MemberRemove"),
    NOPE("/etcdserverpb.Cluster/MemberUpdate"),
    UNARY("/etcdserverpb.Cluster/MemberList", cluster_member_list, 0, 2),
    NOPE("/etcdserverpb.Cluster/MemberPromote"),
    UNARY("/etcdserverpb.Maintenance/Alarm", maint_alarm, 0, 2),
    UNARY("/etcdserverpb.Maintenance/Status", maint_status, 0, 2),
    UNARY("/etcdserverpb.Maintenance/Defragment", maint_defragment, 0, 1),
    UNARY("/etcdserverpb.Maintenance/Hash", maint_hash, 0, 1),
    UNARY("/etcdserverpb.Maintenance/HashKV", maint_hash_kv, 0, 1),
    {"/etcdserverpb.Maintenance/Snapshot", RPC_SERVER_STREAM, maint_snapshot, 0, 1},
    UNARY("/etcdserverpb.Maintenance/MoveLeader", maint_move_leader, 0, 1),
    NOPE("/etcdserverpb.Auth/AuthEnable"),
    NOPE("/etcdserverpb.Auth/AuthDisable"),
    NOPE("/etcdserverpb.Auth/Authenticate"),
    NOPE("/etcdserverpb.Auth/UserAdd"),
    NOPE("/etcdserverpb.Auth/UserGet"),
    NOPE("/etcdserverpb.Auth/UserList"),
    NOPE("/etcdserverpb.Auth/UserDelete"),
    NOPE("/etcdserverpb.Auth/UserChangePassword"),
    NOPE("/etcdserverpb.Auth/UserGrantRole"),
    NOPE("/etcdserverpb.Auth/UserRevokeRole"),
    NOPE("/etcdserverpb.Auth/RoleAdd"),
    NOPE("/etcdserverpb.Auth/RoleGet"),
    NOPE("/etcdserverpb.Auth/RoleList"),
    NOPE("/etcdserverpb.Auth/RoleDelete"),
    NOPE("/etcdserverpb.Auth/RoleGrantPermission"),
    NOPE("/etcdserverpb.Auth/RoleRevokePermission"),
};
const size_t rpc_nmethods = sizeof rpc_methods / sizeof rpc_methods[0];

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- posting requests ---------------------------------------------------- */

static void post(struct rpc_worker *w, int method)
{
    cairn_server *srv = w->srv;
    if (atomic_load(&srv->stopping))
        return;
    rpc_call *c = malloc(sizeof *c);
    if (!c) {
        cairn_log(CAIRN_LOG_ERROR, "out of memory posting a call slot");
        return;
    }
    memset(c, 0, offsetof(rpc_call, unpack_mem)); /* the arena needs no zeros */
    c->state = ST_NEW;
    c->srv = srv;
    c->w = w;
    c->method = method;
    grpc_metadata_array_init(&c->md);
    grpc_call_error e;
    if (method < 0) {
        grpc_call_details_init(&c->details);
        e = grpc_server_request_call(srv->grpc, &c->call, &c->details, &c->md, w->cq, w->cq, c);
    } else {
        int bidi = rpc_methods[method].kind == RPC_BIDI;
        e = grpc_server_request_registered_call(srv->grpc, srv->registered[method], &c->call,
                                                &c->deadline, &c->md, bidi ? NULL : &c->payload,
                                                w->cq, w->cq, c);
    }
    if (e != GRPC_CALL_OK) {
        if (!atomic_load(&srv->stopping))
            cairn_log(CAIRN_LOG_ERROR, "grpc: cannot post a call slot (%d)", (int)e);
        grpc_metadata_array_destroy(&c->md);
        if (method < 0)
            grpc_call_details_destroy(&c->details);
        free(c);
    }
}

static void call_free(rpc_call *c)
{
    if (atomic_load(&c->srv->stopping) && c->live)
        cairn_log(CAIRN_LOG_DEBUG, "freed during shutdown: %s",
                  c->method >= 0 ? rpc_methods[c->method].path : "(unregistered)");
    if (c->live) {
        cairn_server *srv = c->srv;
        pthread_mutex_lock(&srv->shut_mu);
        if (--srv->live_calls == 0)
            pthread_cond_broadcast(&srv->shut_cv);
        pthread_mutex_unlock(&srv->shut_mu);
    }
    if (c->cleanup)
        c->cleanup(c);
    if (c->snap)
        snapshot_stream_free(c->snap);
    if (c->req_msg && c->unpack_spilled)
        protobuf_c_message_free_unpacked(c->req_msg, &c->unpack_alloc);
    grpc_slice_unref(c->req_bytes);
    free(c->scratch);
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    if (c->send)
        grpc_byte_buffer_destroy(c->send);
    grpc_slice_unref(c->status_details);
    grpc_metadata_array_destroy(&c->md);
    if (c->method < 0)
        grpc_call_details_destroy(&c->details);
    if (c->call)
        grpc_call_unref(c->call);
    free(c);
}

/* ---- answering ----------------------------------------------------------- */

grpc_byte_buffer *rpc_pack(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Ends |c| with |status| (|msg| its text) after |send| (owned from here;
 * NULL: no message). */
static void finish(rpc_call *c, grpc_status_code status, const char *msg, grpc_byte_buffer *send)
{
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->sent_initial_md) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
        c->sent_initial_md = 1;
    }
    if (send) {
        if (c->send)
            grpc_byte_buffer_destroy(c->send);
        c->send = send;
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->send;
        n++;
    }
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
    n++;
    grpc_slice_unref(c->status_details);
    c->status_details = grpc_slice_from_copied_string(msg ? msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = status;
    ops[n].data.send_status_from_server.status_details = msg ? &c->status_details : NULL;
    n++;
    c->state = ST_DONE;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        /* Only a programming error gets here; never leak the call. */
        cairn_log(CAIRN_LOG_ERROR, "grpc: start_batch failed (%d)", (int)e);
        call_free(c);
    }
}

void rpc_reply(rpc_call *c, const ProtobufCMessage *msg)
{
    finish(c, GRPC_STATUS_OK, NULL, msg ? rpc_pack(msg) : NULL);
}

size_t rpc_pack_header_only(uint8_t out[RPC_HEADER_ONLY_MAX], const Etcdserverpb__ResponseHeader *h)
{
    /* proto3: a field at its default (0) is left out, in field order. */
    const uint64_t v[4] = {h->cluster_id, h->member_id, (uint64_t)h->revision, h->raft_term};
    size_t n = 2;
    for (unsigned i = 0; i < 4; i++) {
        if (v[i] == 0)
            continue;
        out[n++] = (uint8_t)((i + 1) << 3); /* field i+1, varint */
        n += cairn_store_put_varint(out + n, v[i]);
    }
    out[0] = (1 << 3) | 2; /* field 1 (header), length-delimited */
    out[1] = (uint8_t)(n - 2); /* at most 44: one byte */
    return n;
}

void rpc_reply_header_only(rpc_call *c, const Etcdserverpb__ResponseHeader *h)
{
    uint8_t buf[RPC_HEADER_ONLY_MAX];
    size_t n = rpc_pack_header_only(buf, h);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    finish(c, GRPC_STATUS_OK, NULL, bb);
}

void rpc_fail(rpc_call *c, int rc, const char *detail)
{
    int status = cairn_error_grpc_status(rc);
    const char *msg = detail ? detail : cairn_strerror(rc);
    const char *path = c->method >= 0 ? rpc_methods[c->method].path : "(unregistered)";
    cairn_log(status == GRPC_STATUS_INTERNAL || status == GRPC_STATUS_DATA_LOSS ? CAIRN_LOG_WARN
                                                                                 : CAIRN_LOG_DEBUG,
              "%s: %s (%s)", path, msg, cairn_error_name(rc));
    finish(c, (grpc_status_code)status, msg, NULL);
}

void rpc_stream_send(rpc_call *c, const ProtobufCMessage *msg, rpc_next_fn next)
{
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->sent_initial_md) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
        c->sent_initial_md = 1;
    }
    if (c->send)
        grpc_byte_buffer_destroy(c->send);
    c->send = rpc_pack(msg);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->send;
    n++;
    c->state = ST_STREAM;
    c->next = next;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        cairn_log(CAIRN_LOG_ERROR, "grpc: start_batch (stream) failed (%d)", (int)e);
        rpc_fail(c, CAIRN_EIO, NULL);
    }
}

void rpc_stream_recv(rpc_call *c, rpc_next_fn next)
{
    if (c->payload) {
        grpc_byte_buffer_destroy(c->payload);
        c->payload = NULL;
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->payload;
    c->state = ST_STREAM;
    c->next = next;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, c, NULL);
    if (e != GRPC_CALL_OK) {
        cairn_log(CAIRN_LOG_ERROR, "grpc: start_batch (recv) failed (%d)", (int)e);
        rpc_fail(c, CAIRN_EIO, NULL);
    }
}

int rpc_payload_take(rpc_call *c, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    size_t n = grpc_byte_buffer_length(c->payload);
    if (n > c->srv->cfg->max_request_bytes + GRPC_OVERHEAD_BYTES)
        return CAIRN_EMSGTOOLARGE;
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, c->payload))
        return CAIRN_EUNMARSHAL;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        grpc_byte_buffer_reader_destroy(&reader);
        return CAIRN_ENOMEM;
    }
    size_t off = 0;
    grpc_slice s;
    while (grpc_byte_buffer_reader_next(&reader, &s)) {
        size_t k = GRPC_SLICE_LENGTH(s);
        if (k > n - off)
            k = n - off;
        memcpy(buf + off, GRPC_SLICE_START_PTR(s), k);
        off += k;
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&reader);
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    *out = buf;
    *len = off;
    return 0;
}

/* The call's unpack allocator (see rpc_call): bump allocation in
 * c->unpack_mem, malloc past its end. */
static void *unpack_alloc(void *arg, size_t n)
{
    rpc_call *c = arg;
    size_t at = (c->unpack_used + 15) & ~(size_t)15;
    if (n <= sizeof c->unpack_mem && at <= sizeof c->unpack_mem - n) {
        c->unpack_used = at + n;
        return c->unpack_mem + at;
    }
    void *p = malloc(n ? n : 1);
    if (p)
        c->unpack_spilled++;
    return p;
}

static void unpack_free(void *arg, void *p)
{
    rpc_call *c = arg;
    unsigned char *b = p;
    if (b >= c->unpack_mem && b < c->unpack_mem + sizeof c->unpack_mem)
        return;
    free(p);
}

ProtobufCMessage *rpc_unpack(rpc_call *c, const ProtobufCMessageDescriptor *desc,
                             const uint8_t *req, size_t len)
{
    c->unpack_alloc.alloc = unpack_alloc;
    c->unpack_alloc.free = unpack_free;
    c->unpack_alloc.allocator_data = c;
    c->req_msg = protobuf_c_message_unpack(desc, &c->unpack_alloc, len, req);
    if (!c->req_msg)
        rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
    return c->req_msg;
}

void rpc_header(cairn_server *srv, Etcdserverpb__ResponseHeader *out, const cairn_header *h)
{
    cairn_header cur;
    if (!h) {
        cairn_store_header(srv->store, &cur);
        h = &cur;
    }
    etcdserverpb__response_header__init(out);
    out->cluster_id = h->cluster_id;
    out->member_id = h->member_id;
    out->revision = h->revision;
    out->raft_term = h->raft_term;
}

/* ---- quota, alarms ------------------------------------------- */

uint64_t rpc_disk_bytes(cairn_server *srv, int fresh)
{
    /* A directory walk: at most every 100 ms on the write path. */
    uint64_t now = now_ms();
    uint64_t last = atomic_load(&srv->disk_checked_ms);
    if (fresh || last == 0 || now - last >= 100) {
        atomic_store(&srv->disk_checked_ms, now);
        atomic_store(&srv->disk_bytes, cairn_store_disk_bytes(srv->store));
    }
    return atomic_load(&srv->disk_bytes);
}

int rpc_alarm_set(cairn_server *srv, uint64_t member, int type, int on)
{
    int changed = 0;
    pthread_mutex_lock(&srv->alarm_mu);
    size_t i = 0;
    while (i < srv->nalarms &&
           !(srv->alarms[i].member_id == member && srv->alarms[i].type == type))
        i++;
    if (on && i == srv->nalarms) {
        rpc_alarm *grown = realloc(srv->alarms, (srv->nalarms + 1) * sizeof *grown);
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

int rpc_quota_check(cairn_server *srv, uint64_t cost)
{
    /* etcd: with a NOSPACE alarm raised, Put, Txn with a Put and LeaseGrant
     * fail with "database space exceeded"; deletes and compaction work. */
    if (atomic_load(&srv->nospace))
        return CAIRN_ENOSPACE;
    if (srv->quota < 0)
        return 0;
    if (rpc_disk_bytes(srv, 0) + cost > (uint64_t)srv->quota) {
        if (rpc_alarm_set(srv, cairn_store_member_id(srv->store),
                          ETCDSERVERPB__ALARM_TYPE__NOSPACE, 1))
            cairn_log(CAIRN_LOG_WARN,
                      "backend size %" PRIu64 " + %" PRIu64 " exceeds --quota-backend-bytes %" PRId64
                      ": NOSPACE alarm raised",
                      rpc_disk_bytes(srv, 0), cost, srv->quota);
        return CAIRN_ENOSPACE;
    }
    return 0;
}

/* ---- dispatch ------------------------------------------------------------ */

static int varint_len(uint64_t v)
{
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* The six etcd services, for grpc-go's "unknown method" vs "unknown
 * service" distinction. */
static int known_service(const char *s, size_t len)
{
    static const char *const names[] = {"etcdserverpb.KV",      "etcdserverpb.Watch",
                                        "etcdserverpb.Lease",   "etcdserverpb.Cluster",
                                        "etcdserverpb.Maintenance", "etcdserverpb.Auth"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0)
            return 1;
    return 0;
}

static void unknown_method(rpc_call *c)
{
    /* etcd (grpc-go): "unknown service foo.Bar" / "unknown method Nope for
     * service etcdserverpb.KV", both UNIMPLEMENTED. */
    char detail[512];
    const char *p = (const char *)GRPC_SLICE_START_PTR(c->details.method);
    size_t len = GRPC_SLICE_LENGTH(c->details.method);
    if (len > 0 && p[0] == '/') {
        p++;
        len--;
    }
    const char *slash = memchr(p, '/', len);
    if (!slash) {
        snprintf(detail, sizeof detail, "malformed method name: \"%.*s\"", (int)(len > 200 ? 200 : len), p);
    } else {
        size_t slen = (size_t)(slash - p), mlen = len - slen - 1;
        if (slen > 200)
            slen = 200;
        if (mlen > 200)
            mlen = 200;
        if (known_service(p, slen))
            snprintf(detail, sizeof detail, "unknown method %.*s for service %.*s", (int)mlen,
                     slash + 1, (int)slen, p);
        else
            snprintf(detail, sizeof detail, "unknown service %.*s", (int)slen, p);
    }
    rpc_fail(c, CAIRN_ENOSUCHMETHOD, detail);
}

static void dispatch(rpc_call *c)
{
    c->state = ST_ACTIVE;
    if (c->method < 0) {
        unknown_method(c);
        return;
    }
    const rpc_method *m = &rpc_methods[c->method];
    if (m->kind == RPC_BIDI) {
        m->fn(c, NULL, 0);
        return;
    }
    if (!c->payload) {
        rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
        return;
    }
    size_t len = grpc_byte_buffer_length(c->payload);
    uint64_t grpc_limit = c->srv->cfg->max_request_bytes + GRPC_OVERHEAD_BYTES;
    if (len > grpc_limit) {
        char detail[128];
        snprintf(detail, sizeof detail, "grpc: received message larger than max (%zu vs. %" PRIu64 ")",
                 len, grpc_limit);
        rpc_fail(c, CAIRN_EMSGTOOLARGE, detail);
        return;
    }
    if (m->size_checked &&
        RAFT_HEADER_BYTES + 1 + (uint64_t)varint_len(len) + len > c->srv->cfg->max_request_bytes) {
        rpc_fail(c, CAIRN_EREQUESTTOOLARGE, NULL);
        return;
    }
    grpc_byte_buffer *bb = c->payload;
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
        bb->data.raw.slice_buffer.count == 1) {
        /* One piece, as almost every small request arrives: no copy. */
        c->req_bytes = grpc_slice_ref(bb->data.raw.slice_buffer.slices[0]);
    } else {
        grpc_byte_buffer_reader reader;
        if (!grpc_byte_buffer_reader_init(&reader, bb)) {
            rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
            return;
        }
        c->req_bytes = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);
    }
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    m->fn(c, GRPC_SLICE_START_PTR(c->req_bytes), GRPC_SLICE_LENGTH(c->req_bytes));
}

int rpc_side_batch(rpc_call *c, const grpc_op *ops, size_t n, rpc_side *tag)
{
    tag->state = RPC_SIDE_STATE;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        cairn_log(CAIRN_LOG_ERROR, "grpc: start_batch (side) failed (%d)", (int)e);
        return CAIRN_EIO;
    }
    return 0;
}

static void handle(void *tag, int ok)
{
    if (*(int *)tag == RPC_SIDE_STATE) {
        rpc_side *side = tag;
        side->fn(side->arg, ok);
        return;
    }
    rpc_call *c = tag;
    switch (c->state) {
    case ST_NEW:
        if (!ok) { /* the server is shutting down */
            call_free(c);
            return;
        }
        pthread_mutex_lock(&c->srv->shut_mu);
        c->srv->live_calls++;
        c->live = 1;
        pthread_mutex_unlock(&c->srv->shut_mu);
        post(c->w, c->method);
        dispatch(c);
        return;
    case ST_STREAM:
        c->state = ST_ACTIVE;
        c->next(c, ok);
        return;
    case ST_DONE:
        call_free(c);
        return;
    default:
        cairn_log(CAIRN_LOG_ERROR, "grpc: completion for a call in state %d", c->state);
        return;
    }
}

static void *worker_main(void *arg)
{
    struct rpc_worker *w = arg;
    cairn_server *srv = w->srv;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &srv->shutdown_tag) {
            pthread_mutex_lock(&srv->shut_mu);
            srv->shut_done = 1;
            pthread_cond_broadcast(&srv->shut_cv);
            pthread_mutex_unlock(&srv->shut_mu);
            continue;
        }
        handle(ev.tag, ev.success);
    }
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------- */

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

static int open_store(cairn_server *srv, char *err, size_t errlen)
{
    const cairn_config *cfg = srv->cfg;
    int rc = ensure_dir(cfg->data_dir, err, errlen);
    if (rc != 0)
        return rc;
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
    cairn_store_subscriber hub = {watch_events_cb, srv};
    o.subscribers = &hub;
    o.nsubscribers = 1;
    o.lease_tick_ms = 100; /* the store revokes expired leases itself */
    o.log_cb = store_log;
    rc = cairn_store_open(&srv->store, &o);
    free(members);
    if (rc == 0)
        watch_hub_ready(srv);
    if (rc != 0)
        snprintf(err, errlen, "cannot open the store in %s: %s", cfg->data_dir, cairn_strerror(rc));
    return rc;
}

int cairn_server_new(cairn_server **out, const cairn_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    cairn_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return CAIRN_ENOMEM;
    srv->cfg = cfg;
    pthread_mutex_init(&srv->shut_mu, NULL);
    pthread_cond_init(&srv->shut_cv, NULL);
    pthread_mutex_init(&srv->alarm_mu, NULL);
    /* etcd: --quota-backend-bytes 0 means the 2 GiB default; < 0 none. */
    srv->quota = cfg->quota_backend_bytes > 0 ? cfg->quota_backend_bytes : (int64_t)2 << 30;
    grpc_init();

    int rc = watch_hub_new(srv);
    if (rc == 0)
        rc = kv_batcher_new(srv);
    if (rc == 0)
        rc = open_store(srv, err, errlen);
    if (rc != 0)
        goto fail;

    uint64_t limit = 2 * (cfg->max_request_bytes + GRPC_OVERHEAD_BYTES);
    if (limit > INT32_MAX)
        limit = INT32_MAX;
    grpc_arg args[3];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)limit;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = -1;
    /* Two servers on one port would split the clients: never share. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
    args[2].value.integer = 0;
    grpc_channel_args cargs = {3, args};
    srv->grpc = grpc_server_create(&cargs, NULL);

    srv->registered = calloc(rpc_nmethods, sizeof *srv->registered);
    if (!srv->registered) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < rpc_nmethods; i++) {
        srv->registered[i] = grpc_server_register_method(
            srv->grpc, rpc_methods[i].path, NULL,
            rpc_methods[i].kind == RPC_BIDI ? GRPC_SRM_PAYLOAD_NONE
                                            : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
            0);
        if (!srv->registered[i]) {
            snprintf(err, errlen, "grpc: cannot register %s", rpc_methods[i].path);
            rc = CAIRN_EIO;
            goto fail;
        }
    }

    int n = cfg->threads > 0 ? cfg->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    srv->workers = calloc((size_t)n, sizeof *srv->workers);
    if (!srv->workers) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    srv->nworkers = n;
    for (int i = 0; i < n; i++) {
        srv->workers[i].srv = srv;
        srv->workers[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(srv->grpc, srv->workers[i].cq, NULL);
    }

    srv->ports = calloc(cfg->nlisten_client_urls, sizeof *srv->ports);
    if (!srv->ports) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    for (size_t i = 0; i < cfg->nlisten_client_urls; i++) {
        char addr[256];
        if (cairn_url_to_addr(addr, sizeof addr, cfg->listen_client_urls[i]) != 0) {
            snprintf(err, errlen, "invalid listen client URL %s", cfg->listen_client_urls[i]);
            rc = CAIRN_EINVAL;
            break;
        }
        srv->ports[i] = grpc_server_add_http2_port(srv->grpc, addr, creds);
        if (srv->ports[i] == 0) {
            snprintf(err, errlen, "cannot listen for client traffic on %s (address in use?)",
                     cfg->listen_client_urls[i]);
            rc = CAIRN_EIO;
            break;
        }
        srv->nports++;
    }
    grpc_server_credentials_release(creds);
    if (rc != 0)
        goto fail;
    *out = srv;
    return 0;
fail:
    cairn_server_free(srv);
    return rc;
}

int cairn_server_port(const cairn_server *srv, size_t i)
{
    return i < srv->nports ? srv->ports[i] : 0;
}

int cairn_server_start(cairn_server *srv)
{
    grpc_server_start(srv->grpc);
    srv->started = 1;
    for (int i = 0; i < srv->nworkers; i++) {
        struct rpc_worker *w = &srv->workers[i];
        for (size_t m = 0; m < rpc_nmethods; m++)
            for (int k = 0; k < rpc_methods[m].slots; k++)
                post(w, (int)m);
        post(w, -1);
    }
    for (int i = 0; i < srv->nworkers; i++) {
        if (pthread_create(&srv->workers[i].thread, NULL, worker_main, &srv->workers[i]) != 0) {
            cairn_log(CAIRN_LOG_ERROR, "cannot start worker thread %d", i);
            return CAIRN_ENOMEM;
        }
        srv->workers[i].running = 1;
    }
    cairn_log(CAIRN_LOG_INFO, "serving etcd's v3 API on %s (%d workers)",
              srv->cfg->listen_client_urls[0], srv->nworkers);
    return 0;
}

void cairn_server_stop(cairn_server *srv, int grace_ms)
{
    if (!srv->started)
        return;
    atomic_store(&srv->stopping, 1);
    grpc_server_shutdown_and_notify(srv->grpc, srv->workers[0].cq, &srv->shutdown_tag);
    /* etcd: watch streams end when the server stops; they would otherwise
     * hold the shutdown for the whole grace period. */
    watch_hub_cancel_all(srv);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += grace_ms / 1000;
    until.tv_nsec += (long)(grace_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    /* gRPC's notification also waits for every client connection to
     * close; once no call of ours is in flight there is nothing left to
     * finish, so the connections are closed then instead of after the
     * grace period. */
    pthread_mutex_lock(&srv->shut_mu);
    while (!srv->shut_done && srv->live_calls > 0)
        if (pthread_cond_timedwait(&srv->shut_cv, &srv->shut_mu, &until) == ETIMEDOUT)
            break;
    int done = srv->shut_done;
    int64_t live = srv->live_calls;
    pthread_mutex_unlock(&srv->shut_mu);
    if (!done) {
        if (live > 0)
            cairn_log(CAIRN_LOG_WARN, "%lld calls still in flight after %d ms: cancelling them",
                      (long long)live, grace_ms);
        grpc_server_cancel_all_calls(srv->grpc);
        pthread_mutex_lock(&srv->shut_mu);
        while (!srv->shut_done)
            pthread_cond_wait(&srv->shut_cv, &srv->shut_mu);
        pthread_mutex_unlock(&srv->shut_mu);
    }
    /* gRPC's notification says no call is being serviced any more, but a
     * call of ours may still start its last batch (a Watch stream ending,
     * a write the store just completed). The queues must outlive that:
     * wait until every call we accepted is freed. */
    pthread_mutex_lock(&srv->shut_mu);
    while (srv->live_calls > 0)
        pthread_cond_wait(&srv->shut_cv, &srv->shut_mu);
    pthread_mutex_unlock(&srv->shut_mu);
    grpc_server_destroy(srv->grpc);
    srv->grpc = NULL;
    for (int i = 0; i < srv->nworkers; i++)
        grpc_completion_queue_shutdown(srv->workers[i].cq);
    for (int i = 0; i < srv->nworkers; i++)
        if (srv->workers[i].running) {
            pthread_join(srv->workers[i].thread, NULL);
            srv->workers[i].running = 0;
        }
    for (int i = 0; i < srv->nworkers; i++) {
        grpc_completion_queue_destroy(srv->workers[i].cq);
        srv->workers[i].cq = NULL;
    }
    srv->started = 0;
    if (srv->store) {
        cairn_store_close(srv->store);
        srv->store = NULL;
    }
}

void cairn_server_free(cairn_server *srv)
{
    if (!srv)
        return;
    if (srv->started)
        cairn_server_stop(srv, 0);
    if (srv->grpc) {
        /* Never started: nothing is in flight, but a server with listeners
         * must be shut down before it is destroyed. */
        if (srv->nworkers > 0) {
            grpc_server_shutdown_and_notify(srv->grpc, srv->workers[0].cq, &srv->shutdown_tag);
            for (;;) {
                grpc_event ev = grpc_completion_queue_next(
                    srv->workers[0].cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
                if (ev.type != GRPC_OP_COMPLETE || ev.tag == &srv->shutdown_tag)
                    break;
            }
        }
        grpc_server_destroy(srv->grpc);
    }
    for (int i = 0; i < srv->nworkers; i++)
        if (srv->workers[i].cq) {
            grpc_completion_queue_shutdown(srv->workers[i].cq);
            while (grpc_completion_queue_next(srv->workers[i].cq,
                                              gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
                       .type != GRPC_QUEUE_SHUTDOWN)
                ;
            grpc_completion_queue_destroy(srv->workers[i].cq);
        }
    if (srv->store)
        cairn_store_close(srv->store);
    free(srv->workers);
    free(srv->registered);
    free(srv->ports);
    free(srv->alarms);
    watch_hub_free(srv);
    kv_batcher_free(srv);
    pthread_mutex_destroy(&srv->shut_mu);
    pthread_cond_destroy(&srv->shut_cv);
    pthread_mutex_destroy(&srv->alarm_mu);
    free(srv);
    grpc_shutdown();
}
