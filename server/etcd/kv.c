/*
 * etcd's KV service (Range, Put, DeleteRange, Txn, Compact) mapped 1:1 onto
 * the store: each handler unpacks the protobuf request, fills the store's
 * mirror struct with pointers into it (no copies), calls the store and packs
 * the answer. Reads answer on the worker thread. Put, DeleteRange and Txn
 * are asynchronous: the store calls back on its completer thread once the
 * change is durable, and the callback answers the call; the worker never
 * waits for their fsync (Compact still blocks its worker, see kv_compact).
 *
 * Nested transactions are converted recursively. protobuf-c's unpacker
 * recurses once per nesting level, so the raw bytes are scanned first and a
 * Txn nested deeper than TXN_MAX_DEPTH is refused as malformed: a 2 MiB
 * request could otherwise nest half a million levels and overflow the
 * stack.
 *
 * The benchmark-only Put batcher (--experimental-batch-writes) is in
 * kv_batch.c.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"
#include "crdt/wire.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define TXN_MAX_DEPTH 64

/* A write's response from the store, kept in the call until it is
 * answered. */
union kv_resp {
    cairn_put_resp put;
    cairn_delete_resp del;
    cairn_txn_resp txn;
    cairn_header compact;
};
_Static_assert(sizeof(union kv_resp) <= RPC_CALL_SCRATCH, "a KV response fits in the call");

static union kv_resp *resp_of(rpc_call *c)
{
    return (union kv_resp *)(void *)c->scratch;
}

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
static int scan_msg(const uint8_t *p, size_t n, int depth, int is_txn)
{
    if (depth > TXN_MAX_DEPTH)
        return -1;
    wire_rd r = {p, p + n};
    while (wire_left(&r) > 0) {
        uint64_t tag, v;
        const uint8_t *sub;
        if (wire_uv_pb(&r, &tag) != 0)
            return -1;
        uint64_t field = tag >> 3;
        switch (tag & 7) {
        case 0:
            if (wire_uv_pb(&r, &v) != 0)
                return -1;
            break;
        case 1:
            if (wire_take(&r, &sub, 8) != 0)
                return -1;
            break;
        case 5:
            if (wire_take(&r, &sub, 4) != 0)
                return -1;
            break;
        case 2:
            if (wire_uv_pb(&r, &v) != 0 || v > wire_left(&r) || wire_take(&r, &sub, (size_t)v) != 0)
                return -1;
            if (is_txn && (field == 2 || field == 3) && scan_msg(sub, (size_t)v, depth, 0) != 0)
                return -1;
            if (!is_txn && field == 4 && scan_msg(sub, (size_t)v, depth + 1, 1) != 0)
                return -1;
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
    wire_rd r = {p, p + n};
    while (wire_left(&r) > 0) {
        /* protobuf-c: a tag's first byte names a field other than 0 (a
         * longer form of 0 is an unknown field), and it is at most 5 bytes. */
        if ((r.p[0] & 0xf8) == 0)
            return -1;
        const uint8_t *at = r.p;
        uint64_t t;
        if (wire_uv_pb(&r, &t) != 0 || r.p - at > 5)
            return -1;
        uint32_t tag = (uint32_t)(t >> 3);
        unsigned wire = (unsigned)(t & 7);
        const uint8_t *field = r.p; /* its bytes after the tag: [field, r.p) below */
        uint64_t v = 0;
        const uint8_t *data = NULL;
        size_t dlen = 0;
        switch (wire) {
        case 0: /* varint */
            if (wire_uv_pb(&r, &v) != 0)
                return -1;
            break;
        case 1: /* 64-bit */
        case 5: /* 32-bit */
            if (wire_take(&r, &data, wire == 1 ? 8 : 4) != 0)
                return -1;
            data = NULL;
            break;
        case 2: { /* length-prefixed: at most 5 bytes and 2^31 - 1 */
            uint64_t len64;
            at = r.p;
            if (wire_uv_pb(&r, &len64) != 0 || r.p - at > 5 || len64 > INT32_MAX ||
                wire_take(&r, &data, (size_t)len64) != 0)
                return -1;
            dlen = (size_t)len64;
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
            for (const uint8_t *q = field; q < r.p; q++)
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
        etcd_header(etcd_node(c), &h, sh);
        *hdr_slot = &h;
        rpc_reply(c, out);
    } else {
        rpc_fail(c, rc, NULL);
    }
    arena_free(a);
}

static void kv_range(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__RangeRequest *m = (Etcdserverpb__RangeRequest *)rpc_unpack(
        c, &etcdserverpb__range_request__descriptor, req, len);
    if (!m || (!m->serializable && etcd_learner_refuses(c)))
        return;
    cairn_range_req r;
    range_from_pb(&r, m);
    cairn_range_resp resp;
    memset(&resp, 0, sizeof resp);
    int rc = cairn_store_range(etcd_node(c)->store, &resp, &r);
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
    cairn_put_resp_destroy(&resp_of(c)->put);
}

/* The Put's answer, on its worker (put_done). */
static void put_answer(rpc_call *c, int rc)
{
    if (rc == 0 && !resp_of(c)->put.prev_kv) {
        /* The common Put: the answer is the header alone. */
        Etcdserverpb__ResponseHeader h;
        etcd_header(etcd_node(c), &h, &resp_of(c)->put.header);
        etcd_reply_header_only(c, &h);
        return;
    }
    struct arena *a = NULL;
    Etcdserverpb__PutResponse out;
    if (rc == 0)
        rc = put_resp_to_pb(&a, &out, &resp_of(c)->put);
    reply_kv(c, rc, &out.base, &out.header, &resp_of(c)->put.header, a);
}

/* On the store's completer: the answer leaves from the worker (rpc_later). */
static void put_done(void *arg, int rc)
{
    rpc_later(arg, put_answer, rc);
}

static void kv_put(rpc_call *c, const uint8_t *req, size_t len)
{
    if (etcd_entry_too_large(c, len))
        return;
    Etcdserverpb__PutRequest pm, *m = &pm;
    if (put_decode(m, req, len) != 0) {
        rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
        return;
    }
    int rc = check_put(m);
    if (rc == 0)
        rc = node_quota_check(etcd_node(c), len);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    if (etcd_node(c)->batcher && !m->prev_kv && !m->ignore_value && !m->ignore_lease && m->lease == 0) {
        cairn_put_req r;
        put_from_pb(&r, m);
        kv_batch_put(c, &r);
        return;
    }
    cairn_put_req r;
    put_from_pb(&r, m);
    c->ctx_free = put_cleanup;
    rc = cairn_store_put_async(etcd_node(c)->store, &resp_of(c)->put, &r, put_done, c);
    if (rc != 0) { /* put_done will not be called; |c| is still ours */
        rpc_fail(c, rc, NULL);
    }
}

static void delete_cleanup(rpc_call *c)
{
    cairn_delete_resp_destroy(&resp_of(c)->del);
}

/* The answer, on the call's worker (delete_done). */
static void delete_answer(rpc_call *c, int rc)
{
    struct arena *a = NULL;
    Etcdserverpb__DeleteRangeResponse out;
    if (rc == 0)
        rc = delete_resp_to_pb(&a, &out, &resp_of(c)->del);
    reply_kv(c, rc, &out.base, &out.header, &resp_of(c)->del.header, a);
}

static void delete_done(void *arg, int rc)
{
    rpc_later(arg, delete_answer, rc);
}

static void kv_delete_range(rpc_call *c, const uint8_t *req, size_t len)
{
    if (etcd_entry_too_large(c, len))
        return;
    Etcdserverpb__DeleteRangeRequest *m = (Etcdserverpb__DeleteRangeRequest *)rpc_unpack(
        c, &etcdserverpb__delete_range_request__descriptor, req, len);
    if (!m)
        return;
    cairn_delete_req r;
    delete_from_pb(&r, m);
    c->ctx_free = delete_cleanup;
    int rc = cairn_store_delete_async(etcd_node(c)->store, &resp_of(c)->del, &r, delete_done, c);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
    }
}

static void txn_cleanup(rpc_call *c)
{
    cairn_txn_resp_destroy(&resp_of(c)->txn);
    arena_free(c->ctx);
    c->ctx = NULL;
}

/* The answer, on the call's worker (txn_done). */
static void txn_answer(rpc_call *c, int rc)
{
    struct arena *a = NULL;
    Etcdserverpb__TxnResponse out;
    if (rc == 0)
        rc = txn_resp_to_pb(&a, &out, &resp_of(c)->txn, 0);
    reply_kv(c, rc, &out.base, &out.header, &resp_of(c)->txn.header, a);
}

static void txn_done(void *arg, int rc)
{
    rpc_later(arg, txn_answer, rc);
}

static void kv_txn(rpc_call *c, const uint8_t *req, size_t len)
{
    if (scan_msg(req, len, 0, 1) != 0) {
        rpc_fail(c, CAIRN_EUNMARSHAL, NULL);
        return;
    }
    Etcdserverpb__TxnRequest *m =
        (Etcdserverpb__TxnRequest *)rpc_unpack(c, &etcdserverpb__txn_request__descriptor, req, len);
    if (!m)
        return;
    int rc = check_txn(m, etcd_node(c)->cfg->max_txn_ops);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    struct arena *a = NULL;
    cairn_txn_req *t = arena_alloc(&a, sizeof *t);
    struct txn_info info = {0, 0};
    rc = t ? txn_from_pb(&a, t, m, &info) : CAIRN_ENOMEM;
    c->ctx = a; /* freed by txn_cleanup */
    c->ctx_free = txn_cleanup;
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    /* etcd: only a Txn that writes goes through raft and its size check;
     * a Txn with a Put is refused while NOSPACE is raised. */
    if (info.writes && etcd_entry_too_large(c, len))
        return;
    if (info.puts && (rc = node_quota_check(etcd_node(c), len)) != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    rc = cairn_store_txn_async(etcd_node(c)->store, &resp_of(c)->txn, t, txn_done, c);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
    }
}

/* Once the compaction is durable (and, physical, compacted on disk): from
 * the completer or the store's compaction thread, never a worker. */
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
    etcd_header(etcd_node(c), &ph, &resp_of(c)->compact);
    out.header = &ph;
    rpc_reply(c, &out.base);
}

static void kv_compact(rpc_call *c, const uint8_t *req, size_t len)
{
    if (etcd_entry_too_large(c, len))
        return;
    Etcdserverpb__CompactionRequest *m = (Etcdserverpb__CompactionRequest *)rpc_unpack(
        c, &etcdserverpb__compaction_request__descriptor, req, len);
    if (!m)
        return;
    int rc = cairn_store_compact_async(etcd_node(c)->store, &resp_of(c)->compact, m->revision,
                                       m->physical, compact_done, c);
    if (rc != 0) /* compact_done will not be called */
        rpc_fail(c, rc, NULL);
}

int etcd_request_decodes(const rpc_method *m, const uint8_t *req, size_t len)
{
    if (!m->req)
        return 1;
    /* protobuf-c recurses into nested messages: a Txn's depth is scanned
     * first, as kv_txn does */
    if (m->req == &etcdserverpb__txn_request__descriptor && scan_msg(req, len, 0, 1) != 0)
        return 0;
    ProtobufCMessage *msg = protobuf_c_message_unpack(m->req, NULL, len, req);
    if (!msg)
        return 0;
    protobuf_c_message_free_unpacked(msg, NULL);
    return 1;
}

/* ---- fuzzing ------------------------------------------------------------- */

int etcd_decode_request(int kind, const uint8_t *req, size_t len, uint32_t max_txn_ops)
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
            return ETCD_DECODE_DISAGREE; /* put_decode took what protobuf-c refused */
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
            rc = ETCD_DECODE_DISAGREE;
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

/* ---- the service --------------------------------------------------------- */

static const rpc_method kv_methods[] = {
    {"/etcdserverpb.KV/Range", RPC_UNARY, kv_range, 8, &etcdserverpb__range_request__descriptor},
    {"/etcdserverpb.KV/Put", RPC_UNARY, kv_put, 8, &etcdserverpb__put_request__descriptor},
    {"/etcdserverpb.KV/DeleteRange", RPC_UNARY, kv_delete_range, 4,
     &etcdserverpb__delete_range_request__descriptor},
    {"/etcdserverpb.KV/Txn", RPC_UNARY, kv_txn, 8, &etcdserverpb__txn_request__descriptor},
    {"/etcdserverpb.KV/Compact", RPC_UNARY, kv_compact, 1,
     &etcdserverpb__compaction_request__descriptor},
};

const rpc_service etcd_kv_service = {"etcdserverpb.KV", kv_methods,
                                     sizeof kv_methods / sizeof kv_methods[0], NULL, etcd_admit};
