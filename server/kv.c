/*
 * etcd's KV service (Range, Put, DeleteRange, Txn, Compact) mapped 1:1 onto
 * the store: each handler unpacks the protobuf request, fills the store's
 * mirror struct with pointers into it (no copies), calls the store and packs
 * the answer. Reads answer on the worker thread. Writes are asynchronous:
 * the store calls back on its committer thread once the change is durable,
 * and the callback answers the call; the worker never waits for an fsync.
 *
 * Nested transactions are converted recursively. protobuf-c's unpacker
 * recurses once per nesting level, so the raw bytes are scanned first and a
 * Txn nested deeper than TXN_MAX_DEPTH is refused as malformed: a 2 MiB
 * request could otherwise nest half a million levels and overflow the
 * stack.
 *
 * BATCHING (benchmarks only, --experimental-batch-writes N). The issue asks
 * what one change per client write costs against a build that coalesces
 * writes, so this file can be that build: a plain Put (no lease, prev_kv,
 * ignore_value or ignore_lease) that arrives while an earlier batch is
 * still being written joins the open batch instead of becoming a change of
 * its own; when the batch in flight completes, the open one goes to the
 * store as one Txn of up to N puts (one change, one revision) and each Put
 * is answered with that Txn's header. A Put arriving with nothing in flight
 * goes at once, alone, so a lone client sees no added latency. It is off by
 * default and not etcd's behaviour: N Puts share one revision.
 *
 * Why it is safe: the batcher's lock is held only to move calls between
 * the open batch and a local list, never across a store call; batches are
 * submitted from a worker (the first Put, or a full batch) or from the
 * completion callback on the store's committer thread, which may call the
 * async writes (store.h). Every open batch has a batch in flight ahead of
 * it (inflight > 0), and that batch's completion submits it, so no Put is
 * stranded; shutdown waits for every live call, hence for both. Two Puts to
 * one key cannot share a Txn (etcd: duplicate key), so a repeated key
 * closes the open batch and starts the next.
 */
#include "server/rpc.h"

#include "crdt/error.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define TXN_MAX_DEPTH 64

/* Allocations that live as long as the call: a chain of blocks. */
struct arena {
    struct arena *next;
    _Alignas(16) unsigned char data[];
};

static void *arena_alloc(struct arena **a, size_t n)
{
    struct arena *b = calloc(1, sizeof *b + (n ? n : 1));
    if (!b)
        return NULL;
    b->next = *a;
    *a = b;
    return b->data;
}

static void arena_free(struct arena *a)
{
    while (a) {
        struct arena *next = a->next;
        free(a);
        a = next;
    }
}

static ProtobufCBinaryData bin(const uint8_t *p, size_t n)
{
    ProtobufCBinaryData b = {n, (uint8_t *)p};
    return b;
}

void kv_to_pb(Mvccpb__KeyValue *out, const cairn_kv *kv)
{
    mvccpb__key_value__init(out);
    out->key = bin(kv->key, kv->key_len);
    out->create_revision = kv->create_revision;
    out->mod_revision = kv->mod_revision;
    out->version = kv->version;
    out->value = bin(kv->value, kv->value_len);
    out->lease = kv->lease;
}

/* ---- request conversion -------------------------------------------------- */

static void range_from_pb(cairn_range_req *r, const Etcdserverpb__RangeRequest *m)
{
    memset(r, 0, sizeof *r);
    r->key = m->key.data;
    r->key_len = m->key.len;
    r->range_end = m->range_end.data;
    r->range_end_len = m->range_end.len;
    r->limit = m->limit;
    r->revision = m->revision;
    r->sort_order = (int)m->sort_order;
    r->sort_target = (int)m->sort_target;
    r->serializable = m->serializable;
    r->keys_only = m->keys_only;
    r->count_only = m->count_only;
    r->min_mod_revision = m->min_mod_revision;
    r->max_mod_revision = m->max_mod_revision;
    r->min_create_revision = m->min_create_revision;
    r->max_create_revision = m->max_create_revision;
}

static void put_from_pb(cairn_put_req *r, const Etcdserverpb__PutRequest *m)
{
    memset(r, 0, sizeof *r);
    r->key = m->key.data;
    r->key_len = m->key.len;
    r->value = m->value.data;
    r->value_len = m->value.len;
    r->lease = m->lease;
    r->prev_kv = m->prev_kv;
    r->ignore_value = m->ignore_value;
    r->ignore_lease = m->ignore_lease;
}

static void delete_from_pb(cairn_delete_req *r, const Etcdserverpb__DeleteRangeRequest *m)
{
    memset(r, 0, sizeof *r);
    r->key = m->key.data;
    r->key_len = m->key.len;
    r->range_end = m->range_end.data;
    r->range_end_len = m->range_end.len;
    r->prev_kv = m->prev_kv;
}

static void compare_from_pb(cairn_compare *r, const Etcdserverpb__Compare *m)
{
    memset(r, 0, sizeof *r);
    r->result = (int)m->result;
    r->target = (int)m->target;
    r->key = m->key.data;
    r->key_len = m->key.len;
    r->range_end = m->range_end.data;
    r->range_end_len = m->range_end.len;
    /* etcd: a target whose oneof field is unset compares against zero. */
    switch (m->target_union_case) {
    case ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION:
        r->version = m->version;
        break;
    case ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION:
        r->create_revision = m->create_revision;
        break;
    case ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION:
        r->mod_revision = m->mod_revision;
        break;
    case ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE:
        r->value = m->value.data;
        r->value_len = m->value.len;
        break;
    case ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE:
        r->lease = m->lease;
        break;
    default:
        break;
    }
}

struct txn_info {
    int writes; /* any Put or DeleteRange, at any depth */
    int puts;   /* any Put */
};

static int ops_from_pb(struct arena **a, const cairn_request_op **out, size_t *nout,
                       Etcdserverpb__RequestOp **ops, size_t n, struct txn_info *info);

static int txn_from_pb(struct arena **a, cairn_txn_req *t, const Etcdserverpb__TxnRequest *m,
                       struct txn_info *info)
{
    memset(t, 0, sizeof *t);
    cairn_compare *cmp = arena_alloc(a, m->n_compare * sizeof *cmp);
    if (!cmp)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < m->n_compare; i++)
        compare_from_pb(&cmp[i], m->compare[i]);
    t->compare = cmp;
    t->ncompare = m->n_compare;
    int rc = ops_from_pb(a, &t->success, &t->nsuccess, m->success, m->n_success, info);
    if (rc == 0)
        rc = ops_from_pb(a, &t->failure, &t->nfailure, m->failure, m->n_failure, info);
    return rc;
}

static int ops_from_pb(struct arena **a, const cairn_request_op **out, size_t *nout,
                       Etcdserverpb__RequestOp **ops, size_t n, struct txn_info *info)
{
    cairn_request_op *v = arena_alloc(a, n * sizeof *v);
    if (!v)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const Etcdserverpb__RequestOp *op = ops[i];
        switch (op->request_case) {
        case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE:
            v[i].type = CAIRN_REQ_RANGE;
            range_from_pb(&v[i].u.range, op->request_range);
            break;
        case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT:
            v[i].type = CAIRN_REQ_PUT;
            put_from_pb(&v[i].u.put, op->request_put);
            info->writes = info->puts = 1;
            break;
        case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE:
            v[i].type = CAIRN_REQ_DELETE;
            delete_from_pb(&v[i].u.del, op->request_delete_range);
            info->writes = 1;
            break;
        case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN: {
            cairn_txn_req *t = arena_alloc(a, sizeof *t);
            if (!t)
                return CAIRN_ENOMEM;
            int rc = txn_from_pb(a, t, op->request_txn, info);
            if (rc != 0)
                return rc;
            v[i].type = CAIRN_REQ_TXN;
            v[i].u.txn = t;
            break;
        }
        default:
            /* An empty RequestOp: check_txn refused it already. */
            v[i].type = 0;
            break;
        }
    }
    *out = v;
    *nout = n;
    return 0;
}

/* etcd's gRPC-layer checks (v3rpc/key.go), in etcd's order, before the
 * request reaches the store: the first failing check names the error. A
 * nested Txn gets the ops budget its parent left (etcd: maxTxnOps - opc). */
static int check_put(const Etcdserverpb__PutRequest *r)
{
    if (r->key.len == 0)
        return CAIRN_EEMPTYKEY;
    if (r->ignore_value && r->value.len != 0)
        return CAIRN_EVALUEPROVIDED;
    if (r->ignore_lease && r->lease != 0)
        return CAIRN_ELEASEPROVIDED;
    return 0;
}

static int check_txn(const Etcdserverpb__TxnRequest *r, int64_t max_ops);

static int check_op(const Etcdserverpb__RequestOp *u, int64_t max_ops)
{
    switch (u->request_case) {
    case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE:
        return u->request_range->key.len == 0 ? CAIRN_EEMPTYKEY : 0;
    case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT:
        return check_put(u->request_put);
    case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE:
        return u->request_delete_range->key.len == 0 ? CAIRN_EEMPTYKEY : 0;
    case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN:
        return check_txn(u->request_txn, max_ops);
    default:
        return CAIRN_EKEYNOTFOUND; /* etcd: an empty RequestOp */
    }
}

static int check_txn(const Etcdserverpb__TxnRequest *r, int64_t max_ops)
{
    int64_t opc = (int64_t)r->n_compare;
    if (opc < (int64_t)r->n_success)
        opc = (int64_t)r->n_success;
    if (opc < (int64_t)r->n_failure)
        opc = (int64_t)r->n_failure;
    if (opc > max_ops)
        return CAIRN_ETOOMANYOPS;
    for (size_t i = 0; i < r->n_compare; i++)
        if (r->compare[i]->key.len == 0)
            return CAIRN_EEMPTYKEY;
    for (size_t i = 0; i < r->n_success; i++) {
        int rc = check_op(r->success[i], max_ops - opc);
        if (rc != 0)
            return rc;
    }
    for (size_t i = 0; i < r->n_failure; i++) {
        int rc = check_op(r->failure[i], max_ops - opc);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Wire scan of a TxnRequest (fields 2, 3: RequestOp) and RequestOp (field 4:
 * TxnRequest) for nesting depth; every other field is skipped. Returns 0 if
 * well-formed as far as it looks and no deeper than TXN_MAX_DEPTH. */
static int scan_msg(const uint8_t *p, size_t n, int depth, int is_txn);

static int read_varint(uint64_t *v, const uint8_t **p, const uint8_t *end)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p == end)
            return -1;
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

static int scan_msg(const uint8_t *p, size_t n, int depth, int is_txn)
{
    if (depth > TXN_MAX_DEPTH)
        return -1;
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t tag, v;
        if (read_varint(&tag, &p, end) != 0)
            return -1;
        uint64_t field = tag >> 3;
        switch (tag & 7) {
        case 0:
            if (read_varint(&v, &p, end) != 0)
                return -1;
            break;
        case 1:
            if ((size_t)(end - p) < 8)
                return -1;
            p += 8;
            break;
        case 5:
            if ((size_t)(end - p) < 4)
                return -1;
            p += 4;
            break;
        case 2:
            if (read_varint(&v, &p, end) != 0 || v > (uint64_t)(end - p))
                return -1;
            if (is_txn && (field == 2 || field == 3) && scan_msg(p, v, depth, 0) != 0)
                return -1;
            if (!is_txn && field == 4 && scan_msg(p, v, depth + 1, 1) != 0)
                return -1;
            p += v;
            break;
        default:
            return -1;
        }
    }
    return 0;
}

/* etcd's PutRequest read in place, without protobuf-c: key and value point
 * into |p| (the call keeps those bytes until it ends), so a Put costs no
 * allocation and no copy. It accepts and rejects exactly what protobuf-c
 * 1.4's unpack does, and gives the same fields; rpc_decode_request (the
 * fuzz target) compares the two on every input. protobuf-c's rules: a tag
 * is at most 5 bytes and its first byte must name a field other than 0; a
 * varint is at most 10 bytes (bits past 64 dropped); a length prefix is at
 * most 5 bytes, at most 2^31 - 1 and must fit in what is left; wire
 * types 3, 4, 6 and 7 are malformed; bytes and int64 fields in another
 * wire type are malformed, bools are not (see below); unknown fields are
 * skipped; the last of a repeated field wins; an empty bytes field has no
 * data pointer. Returns 0 or -1 (malformed). */
static int put_decode(Etcdserverpb__PutRequest *m, const uint8_t *p, size_t n)
{
    etcdserverpb__put_request__init(m);
    const uint8_t *end = p + n;
    while (p < end) {
        size_t left = (size_t)(end - p), max = left < 5 ? left : 5, i = 0;
        if ((p[0] & 0xf8) == 0)
            return -1;
        uint32_t tag = (p[0] & 0x7f) >> 3;
        unsigned wire = p[0] & 7, shift = 4;
        if (p[0] & 0x80) {
            for (i = 1; i < max && (p[i] & 0x80); i++, shift += 7)
                tag |= (uint32_t)(p[i] & 0x7f) << shift;
            if (i == max)
                return -1;
            tag |= (uint32_t)p[i] << shift;
        }
        p += i + 1;
        left = (size_t)(end - p);
        const uint8_t *field = p; /* its bytes after the tag: [field, p) below */
        uint64_t v = 0;
        const uint8_t *data = NULL;
        size_t dlen = 0;
        switch (wire) {
        case 0: /* varint */
            max = left < 10 ? left : 10;
            for (i = 0; i < max; i++) {
                if (i < 10)
                    v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
                if (!(p[i] & 0x80))
                    break;
            }
            if (i == max)
                return -1;
            p += i + 1;
            break;
        case 1: /* 64-bit */
            if (left < 8)
                return -1;
            p += 8;
            break;
        case 5: /* 32-bit */
            if (left < 4)
                return -1;
            p += 4;
            break;
        case 2: { /* length-prefixed */
            uint64_t len64 = 0;
            max = left < 5 ? left : 5;
            for (i = 0; i < max; i++) {
                len64 |= (uint64_t)(p[i] & 0x7f) << (7 * i);
                if (!(p[i] & 0x80))
                    break;
            }
            if (i == max || len64 > INT32_MAX || len64 > left - (i + 1))
                return -1;
            data = p + i + 1;
            dlen = (size_t)len64;
            p = data + dlen;
            break;
        }
        default:
            return -1;
        }
        switch (tag) {
        case 1: /* key */
        case 2: /* value */
            if (wire != 2)
                return -1;
            (tag == 1 ? &m->key : &m->value)->data = dlen ? (uint8_t *)data : NULL;
            (tag == 1 ? &m->key : &m->value)->len = dlen;
            break;
        case 3: /* lease */
            if (wire != 0)
                return -1;
            m->lease = (int64_t)v;
            break;
        case 4: /* prev_kv */
        case 5: /* ignore_value */
        case 6: { /* ignore_lease */
            /* protobuf-c takes a bool in any wire type: true if any byte
             * of the field after its tag (a length prefix too) has one of
             * its low 7 bits set. */
            protobuf_c_boolean b = 0;
            for (const uint8_t *q = field; q < p; q++)
                b |= (*q & 0x7f) != 0;
            *(tag == 4 ? &m->prev_kv : tag == 5 ? &m->ignore_value : &m->ignore_lease) = b;
            break;
        }
        default:
            break; /* unknown: skipped */
        }
    }
    return 0;
}

/* ---- response conversion ------------------------------------------------- */

static int kvs_to_pb(struct arena **a, Mvccpb__KeyValue ***out, const cairn_kv *kvs, size_t n)
{
    *out = NULL;
    if (n == 0)
        return 0;
    Mvccpb__KeyValue **ptrs = arena_alloc(a, n * sizeof *ptrs);
    Mvccpb__KeyValue *v = arena_alloc(a, n * sizeof *v);
    if (!ptrs || !v)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        kv_to_pb(&v[i], &kvs[i]);
        ptrs[i] = &v[i];
    }
    *out = ptrs;
    return 0;
}

/* etcd: a response inside a Txn carries a header with the revision only. */
static Etcdserverpb__ResponseHeader *inner_header(struct arena **a, const cairn_header *h)
{
    Etcdserverpb__ResponseHeader *out = arena_alloc(a, sizeof *out);
    if (out) {
        etcdserverpb__response_header__init(out);
        out->revision = h->revision;
    }
    return out;
}

static int range_resp_to_pb(struct arena **a, Etcdserverpb__RangeResponse *out,
                            const cairn_range_resp *r)
{
    etcdserverpb__range_response__init(out);
    out->more = r->more;
    out->count = r->count;
    out->n_kvs = r->nkvs;
    return kvs_to_pb(a, &out->kvs, r->kvs, r->nkvs);
}

static int put_resp_to_pb(struct arena **a, Etcdserverpb__PutResponse *out, const cairn_put_resp *r)
{
    etcdserverpb__put_response__init(out);
    if (r->prev_kv) {
        out->prev_kv = arena_alloc(a, sizeof *out->prev_kv);
        if (!out->prev_kv)
            return CAIRN_ENOMEM;
        kv_to_pb(out->prev_kv, r->prev_kv);
    }
    return 0;
}

static int delete_resp_to_pb(struct arena **a, Etcdserverpb__DeleteRangeResponse *out,
                             const cairn_delete_resp *r)
{
    etcdserverpb__delete_range_response__init(out);
    out->deleted = r->deleted;
    out->n_prev_kvs = r->nprev_kvs;
    return kvs_to_pb(a, &out->prev_kvs, r->prev_kvs, r->nprev_kvs);
}

static int txn_resp_to_pb(struct arena **a, Etcdserverpb__TxnResponse *out, const cairn_txn_resp *r,
                          int depth)
{
    etcdserverpb__txn_response__init(out);
    out->succeeded = r->succeeded;
    if (r->nresponses == 0)
        return 0;
    Etcdserverpb__ResponseOp **ptrs = arena_alloc(a, r->nresponses * sizeof *ptrs);
    Etcdserverpb__ResponseOp *ops = arena_alloc(a, r->nresponses * sizeof *ops);
    if (!ptrs || !ops)
        return CAIRN_ENOMEM;
    out->responses = ptrs;
    out->n_responses = r->nresponses;
    for (size_t i = 0; i < r->nresponses; i++) {
        const cairn_response_op *ro = &r->responses[i];
        Etcdserverpb__ResponseOp *op = &ops[i];
        etcdserverpb__response_op__init(op);
        ptrs[i] = op;
        int rc = 0;
        switch (ro->type) {
        case CAIRN_REQ_RANGE: {
            Etcdserverpb__RangeResponse *m = arena_alloc(a, sizeof *m);
            if (!m)
                return CAIRN_ENOMEM;
            rc = range_resp_to_pb(a, m, &ro->u.range);
            m->header = inner_header(a, &ro->u.range.header);
            op->response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE;
            op->response_range = m;
            break;
        }
        case CAIRN_REQ_PUT: {
            Etcdserverpb__PutResponse *m = arena_alloc(a, sizeof *m);
            if (!m)
                return CAIRN_ENOMEM;
            rc = put_resp_to_pb(a, m, &ro->u.put);
            m->header = inner_header(a, &ro->u.put.header);
            op->response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT;
            op->response_put = m;
            break;
        }
        case CAIRN_REQ_DELETE: {
            Etcdserverpb__DeleteRangeResponse *m = arena_alloc(a, sizeof *m);
            if (!m)
                return CAIRN_ENOMEM;
            rc = delete_resp_to_pb(a, m, &ro->u.del);
            m->header = inner_header(a, &ro->u.del.header);
            op->response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_DELETE_RANGE;
            op->response_delete_range = m;
            break;
        }
        case CAIRN_REQ_TXN: {
            Etcdserverpb__TxnResponse *m = arena_alloc(a, sizeof *m);
            if (!m || !ro->u.txn)
                return CAIRN_ENOMEM;
            rc = txn_resp_to_pb(a, m, ro->u.txn, depth + 1);
            m->header = inner_header(a, &ro->u.txn->header);
            op->response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_TXN;
            op->response_txn = m;
            break;
        }
        default:
            break;
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- handlers ------------------------------------------------------------ */

/* Answers |c| with |out| (its header filled from the store's |sh|), or with
 * the error |rc| from the store or the conversion; frees the conversion's
 * arena |a| either way. */
static void reply_kv(rpc_call *c, int rc, ProtobufCMessage *out,
                     Etcdserverpb__ResponseHeader **hdr_slot, const cairn_header *sh,
                     struct arena *a)
{
    Etcdserverpb__ResponseHeader h;
    if (rc == 0) {
        rpc_header(c->srv, &h, sh);
        *hdr_slot = &h;
        rpc_reply(c, out);
    } else {
        rpc_fail(c, rc, NULL);
    }
    arena_free(a);
}

void kv_range(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__RangeRequest *m = (Etcdserverpb__RangeRequest *)rpc_unpack(
        c, &etcdserverpb__range_request__descriptor, req, len);
    if (!m)
        return;
    cairn_range_req r;
    range_from_pb(&r, m);
    cairn_range_resp resp;
    memset(&resp, 0, sizeof resp);
    int rc = cairn_store_range(c->srv->store, &resp, &r);
    if (rc != 0) {
        cairn_range_resp_destroy(&resp);
        rpc_fail(c, rc, NULL);
        return;
    }
    struct arena *a = NULL;
    Etcdserverpb__RangeResponse out;
    rc = range_resp_to_pb(&a, &out, &resp);
    reply_kv(c, rc, &out.base, &out.header, &resp.header, a);
    cairn_range_resp_destroy(&resp);
}

static void put_cleanup(rpc_call *c)
{
    cairn_put_resp_destroy(&c->resp.put);
}

static void put_done(void *arg, int rc)
{
    rpc_call *c = arg;
    if (rc == 0 && !c->resp.put.prev_kv) {
        /* The common Put: the answer is the header alone. */
        Etcdserverpb__ResponseHeader h;
        rpc_header(c->srv, &h, &c->resp.put.header);
        rpc_reply_header_only(c, &h);
        return;
    }
    struct arena *a = NULL;
    Etcdserverpb__PutResponse out;
    if (rc == 0)
        rc = put_resp_to_pb(&a, &out, &c->resp.put);
    reply_kv(c, rc, &out.base, &out.header, &c->resp.put.header, a);
}

/* ---- Put batching (--experimental-batch-writes; see the top) ------------- */

struct kv_batch {
    cairn_server *srv;
    size_t n;
    rpc_call **calls;      /* [cap] */
    cairn_request_op *ops; /* [cap]: Puts borrowed from each call's req_msg */
    cairn_txn_req req;
    cairn_txn_resp resp;
};

struct kv_batcher {
    pthread_mutex_t mu;
    size_t cap;
    int inflight;           /* batches submitted and not yet completed */
    struct kv_batch *open;  /* Puts waiting for the batch in flight */
    uint64_t puts, changes; /* since start, for the log line at exit */
};

int kv_batcher_new(cairn_server *srv)
{
    srv->batcher = NULL;
    if (srv->cfg->batch_writes == 0)
        return 0;
    struct kv_batcher *b = calloc(1, sizeof *b);
    if (!b)
        return CAIRN_ENOMEM;
    pthread_mutex_init(&b->mu, NULL);
    b->cap = srv->cfg->batch_writes;
    srv->batcher = b;
    cairn_log(CAIRN_LOG_WARN,
              "--experimental-batch-writes %zu: up to %zu Puts share one change and one "
              "revision (benchmarks only; not etcd's numbering)",
              b->cap, b->cap);
    return 0;
}

void kv_batcher_free(cairn_server *srv)
{
    struct kv_batcher *b = srv->batcher;
    if (!b)
        return;
    cairn_log(CAIRN_LOG_INFO,
              "experimental-batch-writes: %" PRIu64 " puts in %" PRIu64
              " changes (%.2f per change)",
              b->puts, b->changes, b->changes ? (double)b->puts / (double)b->changes : 0.0);
    pthread_mutex_destroy(&b->mu);
    free(b);
    srv->batcher = NULL;
}

static struct kv_batch *batch_new(cairn_server *srv, size_t cap)
{
    struct kv_batch *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->srv = srv;
    k->calls = calloc(cap, sizeof *k->calls);
    k->ops = calloc(cap, sizeof *k->ops);
    if (!k->calls || !k->ops) {
        free(k->calls);
        free(k->ops);
        free(k);
        return NULL;
    }
    return k;
}

static void batch_free(struct kv_batch *k)
{
    cairn_txn_resp_destroy(&k->resp);
    free(k->calls);
    free(k->ops);
    free(k);
}

static int batch_has_key(const struct kv_batch *k, const cairn_put_req *p)
{
    for (size_t i = 0; i < k->n; i++) {
        const cairn_put_req *q = &k->ops[i].u.put;
        if (q->key_len == p->key_len && memcmp(q->key, p->key, p->key_len) == 0)
            return 1;
    }
    return 0;
}

static void batch_submit(struct kv_batch *k);

/* Committer thread (or the submitting thread when the store refused the
 * batch): answers every Put of |k|, then sends the open batch, if any, now
 * that nothing is ahead of it. */
static void batch_done(void *arg, int rc)
{
    struct kv_batch *k = arg;
    struct kv_batcher *b = k->srv->batcher;
    for (size_t i = 0; i < k->n; i++) {
        rpc_call *c = k->calls[i];
        Etcdserverpb__PutResponse out;
        etcdserverpb__put_response__init(&out);
        reply_kv(c, rc, &out.base, &out.header, &k->resp.header, NULL);
    }
    batch_free(k);
    struct kv_batch *next = NULL;
    pthread_mutex_lock(&b->mu);
    b->inflight--;
    if (b->inflight == 0 && b->open) {
        next = b->open;
        b->open = NULL;
        b->inflight++;
    }
    pthread_mutex_unlock(&b->mu);
    if (next)
        batch_submit(next);
}

/* |k| is counted in b->inflight by the caller. */
static void batch_submit(struct kv_batch *k)
{
    struct kv_batcher *b = k->srv->batcher;
    pthread_mutex_lock(&b->mu);
    b->puts += k->n;
    b->changes++;
    pthread_mutex_unlock(&b->mu);
    memset(&k->req, 0, sizeof k->req);
    k->req.success = k->ops;
    k->req.nsuccess = k->n;
    int rc = cairn_store_txn_async(k->srv->store, &k->resp, &k->req, batch_done, k);
    if (rc != 0) /* batch_done was not called: answer the batch with |rc| */
        batch_done(k, rc);
}

/* Takes over |c|: it is answered by batch_done. */
static void batch_put(rpc_call *c, const Etcdserverpb__PutRequest *m)
{
    struct kv_batcher *b = c->srv->batcher;
    struct kv_batch *go[2] = {NULL, NULL};
    int ngo = 0;
    cairn_put_req r;
    put_from_pb(&r, m);
    pthread_mutex_lock(&b->mu);
    if (b->open && batch_has_key(b->open, &r)) {
        go[ngo++] = b->open; /* etcd: a Txn may not put one key twice */
        b->open = NULL;
    }
    if (!b->open)
        b->open = batch_new(c->srv, b->cap);
    struct kv_batch *k = b->open;
    if (k) {
        k->calls[k->n] = c;
        k->ops[k->n].type = CAIRN_REQ_PUT;
        k->ops[k->n].u.put = r;
        k->n++;
        if (b->inflight + ngo == 0 || k->n == b->cap) {
            go[ngo++] = k;
            b->open = NULL;
        }
    }
    b->inflight += ngo;
    pthread_mutex_unlock(&b->mu);
    if (!k) {
        rpc_fail(c, CAIRN_ENOMEM, NULL);
    }
    for (int i = 0; i < ngo; i++)
        batch_submit(go[i]);
}

void kv_put(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__PutRequest pm, *m = &pm;
    if (put_decode(m, req, len) != 0) {
        rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
        return;
    }
    int rc = check_put(m);
    if (rc == 0)
        rc = rpc_quota_check(c->srv, len);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    if (c->srv->batcher && !m->prev_kv && !m->ignore_value && !m->ignore_lease && m->lease == 0) {
        batch_put(c, m);
        return;
    }
    cairn_put_req r;
    put_from_pb(&r, m);
    c->cleanup = put_cleanup;
    rc = cairn_store_put_async(c->srv->store, &c->resp.put, &r, put_done, c);
    if (rc != 0) { /* put_done will not be called; |c| is still ours */
        rpc_fail(c, rc, NULL);
    }
}

static void delete_cleanup(rpc_call *c)
{
    cairn_delete_resp_destroy(&c->resp.del);
}

static void delete_done(void *arg, int rc)
{
    rpc_call *c = arg;
    struct arena *a = NULL;
    Etcdserverpb__DeleteRangeResponse out;
    if (rc == 0)
        rc = delete_resp_to_pb(&a, &out, &c->resp.del);
    reply_kv(c, rc, &out.base, &out.header, &c->resp.del.header, a);
}

void kv_delete_range(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__DeleteRangeRequest *m = (Etcdserverpb__DeleteRangeRequest *)rpc_unpack(
        c, &etcdserverpb__delete_range_request__descriptor, req, len);
    if (!m)
        return;
    cairn_delete_req r;
    delete_from_pb(&r, m);
    c->cleanup = delete_cleanup;
    int rc = cairn_store_delete_async(c->srv->store, &c->resp.del, &r, delete_done, c);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
    }
}

static void txn_cleanup(rpc_call *c)
{
    cairn_txn_resp_destroy(&c->resp.txn);
    arena_free(c->scratch);
    c->scratch = NULL;
}

static void txn_done(void *arg, int rc)
{
    rpc_call *c = arg;
    struct arena *a = NULL;
    Etcdserverpb__TxnResponse out;
    if (rc == 0)
        rc = txn_resp_to_pb(&a, &out, &c->resp.txn, 0);
    reply_kv(c, rc, &out.base, &out.header, &c->resp.txn.header, a);
}

static int varint_size(uint64_t v)
{
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

void kv_txn(rpc_call *c, const uint8_t *req, size_t len)
{
    if (scan_msg(req, len, 0, 1) != 0) {
        rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
        return;
    }
    Etcdserverpb__TxnRequest *m =
        (Etcdserverpb__TxnRequest *)rpc_unpack(c, &etcdserverpb__txn_request__descriptor, req, len);
    if (!m)
        return;
    int rc = check_txn(m, c->srv->cfg->max_txn_ops);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    struct arena *a = NULL;
    cairn_txn_req *t = arena_alloc(&a, sizeof *t);
    struct txn_info info = {0, 0};
    rc = t ? txn_from_pb(&a, t, m, &info) : CAIRN_ENOMEM;
    c->scratch = a; /* freed by txn_cleanup (not free(): it is a chain) */
    c->cleanup = txn_cleanup;
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    /* etcd: only a Txn that writes goes through raft and its size check;
     * a Txn with a Put is refused while NOSPACE is raised. */
    if (info.writes &&
        13u + 1u + (uint64_t)varint_size(len) + len > c->srv->cfg->max_request_bytes) {
        rpc_fail(c, CAIRN_EREQUESTTOOLARGE, NULL);
        return;
    }
    if (info.puts && (rc = rpc_quota_check(c->srv, len)) != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    rc = cairn_store_txn_async(c->srv->store, &c->resp.txn, t, txn_done, c);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
    }
}

/* Once the compaction is durable (and, physical, compacted on disk): from
 * the committer or the store's compaction thread, never a worker. */
static void compact_done(void *arg, int rc)
{
    rpc_call *c = arg;
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    Etcdserverpb__CompactionResponse out;
    Etcdserverpb__ResponseHeader ph;
    etcdserverpb__compaction_response__init(&out);
    rpc_header(c->srv, &ph, c->scratch);
    out.header = &ph;
    rpc_reply(c, &out.base);
}

void kv_compact(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__CompactionRequest *m = (Etcdserverpb__CompactionRequest *)rpc_unpack(
        c, &etcdserverpb__compaction_request__descriptor, req, len);
    if (!m)
        return;
    cairn_header *h = calloc(1, sizeof *h);
    if (!h) {
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    c->scratch = h;
    int rc = cairn_store_compact_async(c->srv->store, h, m->revision, m->physical, compact_done, c);
    if (rc != 0) /* compact_done will not be called */
        rpc_fail(c, rc, NULL);
}

/* ---- fuzzing ------------------------------------------------------------- */

int rpc_decode_request(int kind, const uint8_t *req, size_t len, uint32_t max_txn_ops)
{
    /* The same steps as the handlers, without a store: depth scan, unpack,
     * etcd's checks, conversion to the store's structs. */
    static const ProtobufCMessageDescriptor *const descs[] = {
        &etcdserverpb__range_request__descriptor,
        &etcdserverpb__put_request__descriptor,
        &etcdserverpb__delete_range_request__descriptor,
        &etcdserverpb__txn_request__descriptor,
        &etcdserverpb__compaction_request__descriptor,
        &etcdserverpb__watch_request__descriptor,
        &etcdserverpb__lease_keep_alive_request__descriptor,
    };
    if (kind < 0 || (size_t)kind >= sizeof descs / sizeof descs[0])
        return CAIRN_EINVAL;
    if (kind == 3 && scan_msg(req, len, 0, 1) != 0)
        return CAIRN_EUNMARSHAL;
    ProtobufCMessage *m = protobuf_c_message_unpack(descs[kind], NULL, len, req);
    if (!m) {
        Etcdserverpb__PutRequest hand;
        if (kind == 1 && put_decode(&hand, req, len) == 0)
            return RPC_DECODE_DISAGREE; /* put_decode took what protobuf-c refused */
        return CAIRN_EUNMARSHAL;
    }
    int rc = 0;
    if (kind == 0) {
        cairn_range_req r;
        range_from_pb(&r, (Etcdserverpb__RangeRequest *)m);
    } else if (kind == 1) {
        /* kv_put decodes with put_decode: it must agree with protobuf-c. */
        const Etcdserverpb__PutRequest *pb = (Etcdserverpb__PutRequest *)m;
        Etcdserverpb__PutRequest hand;
        if (put_decode(&hand, req, len) != 0 || hand.key.len != pb->key.len ||
            hand.value.len != pb->value.len || (hand.key.len && memcmp(hand.key.data, pb->key.data, pb->key.len)) ||
            (hand.value.len && memcmp(hand.value.data, pb->value.data, pb->value.len)) ||
            (!hand.key.data) != (!pb->key.data) || (!hand.value.data) != (!pb->value.data) ||
            hand.lease != pb->lease || hand.prev_kv != pb->prev_kv ||
            hand.ignore_value != pb->ignore_value || hand.ignore_lease != pb->ignore_lease)
            rc = RPC_DECODE_DISAGREE;
        cairn_put_req r;
        if (rc == 0)
            rc = check_put(pb);
        put_from_pb(&r, pb);
    } else if (kind == 2) {
        cairn_delete_req r;
        delete_from_pb(&r, (Etcdserverpb__DeleteRangeRequest *)m);
    } else if (kind == 3) {
        Etcdserverpb__TxnRequest *t = (Etcdserverpb__TxnRequest *)m;
        rc = check_txn(t, max_txn_ops);
        if (rc == 0) {
            struct arena *a = NULL;
            cairn_txn_req *ct = arena_alloc(&a, sizeof *ct);
            struct txn_info info = {0, 0};
            rc = ct ? txn_from_pb(&a, ct, t, &info) : CAIRN_ENOMEM;
            arena_free(a);
        }
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}
