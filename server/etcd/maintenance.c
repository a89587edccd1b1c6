/*
 * etcd's Maintenance service: Status, Alarm, Defragment, Hash, HashKV and
 * MoveLeader here, Snapshot in snapshot.c.
 *
 * There is no raft: this node is its own leader, raft_term is the store's
 * constant, and the raft indexes report the revision (the count of applied
 * key-changing changes), which grows as etcd's do. Alarms live in memory
 * (etcd keeps them in its backend; a restart clears cairn's). HashKV hashes
 * what two nodes holding the same changes agree on — each visible key with
 * its value and lease at the revision — and not revisions, which are local
 * to a node (DESIGN: revisions are per node).
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- crc32c -------------------------------------------------------------- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0x82f63b78u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t etcd_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = buf;
    crc = ~crc;
    while (len--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ---- Status -------------------------------------------------------------- */

static const char *alarm_name(int type)
{
    switch (type) {
    case ETCDSERVERPB__ALARM_TYPE__NONE:
        return "NONE";
    case ETCDSERVERPB__ALARM_TYPE__NOSPACE:
        return "NOSPACE";
    case ETCDSERVERPB__ALARM_TYPE__CORRUPT:
        return "CORRUPT";
    default:
        return "UNKNOWN";
    }
}

static void maint_status(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__status_request__descriptor, req, len))
        return;
    cairn_server *srv = etcd_node(c);
    cairn_header h;
    cairn_store_header(srv->store, &h);
    Etcdserverpb__ResponseHeader ph;
    etcd_header(srv, &ph, &h);
    Etcdserverpb__StatusResponse out;
    etcdserverpb__status_response__init(&out);
    out.header = &ph;
    out.version = (char *)CAIRN_ETCD_VERSION;
    uint64_t size = node_disk_bytes(srv, 1);
    out.dbsize = (int64_t)size;
    out.dbsizeinuse = (int64_t)size;
    out.leader = h.member_id; /* no raft: every node leads itself */
    out.raftindex = (uint64_t)h.revision;
    out.raftappliedindex = (uint64_t)h.revision;
    out.raftterm = h.raft_term;

    /* etcd: each active alarm appears in errors as its compact text form. */
    char **errors = NULL;
    size_t nerrors = 0;
    pthread_mutex_lock(&srv->alarm_mu);
    if (srv->nalarms > 0 && (errors = calloc(srv->nalarms, sizeof *errors)) != NULL) {
        for (size_t i = 0; i < srv->nalarms; i++) {
            char buf[96];
            snprintf(buf, sizeof buf, "memberID:%" PRIu64 " alarm:%s ", srv->alarms[i].member_id,
                     alarm_name(srv->alarms[i].type));
            errors[i] = strdup(buf);
            if (errors[i])
                nerrors++;
            else
                break;
        }
    }
    pthread_mutex_unlock(&srv->alarm_mu);
    out.errors = errors;
    out.n_errors = nerrors;
    rpc_reply(c, &out.base);
    for (size_t i = 0; i < nerrors; i++)
        free(errors[i]);
    free(errors);
}

/* ---- Alarm --------------------------------------------------------------- */

static int alarm_cmp(const void *a, const void *b)
{
    const node_alarm *x = a, *y = b;
    if (x->member_id != y->member_id)
        return x->member_id < y->member_id ? -1 : 1;
    return x->type - y->type;
}

static void maint_alarm(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__AlarmRequest *m =
        (Etcdserverpb__AlarmRequest *)rpc_unpack(c, &etcdserverpb__alarm_request__descriptor, req, len);
    if (!m)
        return;
    cairn_server *srv = etcd_node(c);
    /* etcd: GET lists every alarm of the type asked (NONE: all); ACTIVATE
     * and DEACTIVATE answer with the alarm they changed (none if nothing
     * changed). The response has no header. */
    node_alarm *list = NULL;
    size_t n = 0;
    int rc = 0;
    if (m->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__GET) {
        pthread_mutex_lock(&srv->alarm_mu);
        list = calloc(srv->nalarms + 1, sizeof *list);
        if (!list)
            rc = CAIRN_ENOMEM;
        for (size_t i = 0; list && i < srv->nalarms; i++)
            if (m->alarm == ETCDSERVERPB__ALARM_TYPE__NONE || (int)m->alarm == srv->alarms[i].type)
                list[n++] = srv->alarms[i];
        pthread_mutex_unlock(&srv->alarm_mu);
        if (n > 1)
            qsort(list, n, sizeof *list, alarm_cmp);
    } else if (m->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE ||
               m->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__DEACTIVATE) {
        int on = m->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE;
        list = calloc(1, sizeof *list);
        if (!list)
            rc = CAIRN_ENOMEM;
        else if (m->alarm != ETCDSERVERPB__ALARM_TYPE__NONE &&
                 node_alarm_set(srv, m->memberid, (int)m->alarm, on)) {
            list[0].member_id = m->memberid;
            list[0].type = (int)m->alarm;
            n = 1;
            cairn_log(CAIRN_LOG_WARN, "alarm %s %s for member %" PRIx64, alarm_name((int)m->alarm),
                      on ? "activated" : "deactivated", m->memberid);
        }
    } else {
        rc = CAIRN_EINVAL;
    }
    if (rc != 0) {
        free(list);
        rpc_fail(c, rc, NULL);
        return;
    }
    Etcdserverpb__AlarmResponse out;
    etcdserverpb__alarm_response__init(&out);
    Etcdserverpb__AlarmMember *members = calloc(n + 1, sizeof *members);
    Etcdserverpb__AlarmMember **ptrs = calloc(n + 1, sizeof *ptrs);
    if (!members || !ptrs) {
        free(members);
        free(ptrs);
        free(list);
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        etcdserverpb__alarm_member__init(&members[i]);
        members[i].memberid = list[i].member_id;
        members[i].alarm = (Etcdserverpb__AlarmType)list[i].type;
        ptrs[i] = &members[i];
    }
    out.alarms = ptrs;
    out.n_alarms = n;
    rpc_reply(c, &out.base);
    free(members);
    free(ptrs);
    free(list);
}

/* ---- Defragment, MoveLeader ---------------------------------------------- */

static void maint_defragment(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__defragment_request__descriptor, req, len))
        return;
    /* etcd rewrites its bolt file to give back free pages. LevelDB has no
     * free pages: its background compactions already rewrite and drop
     * dead data, so there is nothing to do. etcd: the response has no
     * header. */
    Etcdserverpb__DefragmentResponse out;
    etcdserverpb__defragment_response__init(&out);
    rpc_reply(c, &out.base);
}

static void maint_move_leader(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__move_leader_request__descriptor, req, len))
        return;
    rpc_fail(c, CAIRN_EUNIMPLEMENTED,
             "cairn: MoveLeader is not supported: there is no raft leader, every node accepts "
             "writes");
}

/* ---- Hash, HashKV -------------------------------------------------------- */

static void put_u64(uint8_t out[8], uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        out[i] = (uint8_t)v;
        v >>= 8;
    }
}

/* crc32c over every visible key at |rev|, in key order: key length, key,
 * value length, value, lease (lengths and lease 8 bytes big-endian). Pages
 * through the key space 1000 keys at a time so memory stays bounded. */
static int hash_keyspace(cairn_server *srv, uint32_t *out, int64_t rev)
{
    uint32_t crc = 0;
    static const uint8_t zero = 0;
    uint8_t *next = NULL;
    size_t next_len = 0;
    int rc = 0;
    for (;;) {
        cairn_range_req r;
        memset(&r, 0, sizeof r);
        r.key = next ? next : &zero;
        r.key_len = next ? next_len : 1;
        r.range_end = &zero;
        r.range_end_len = 1;
        r.limit = 1000;
        r.revision = rev;
        cairn_range_resp resp;
        memset(&resp, 0, sizeof resp);
        rc = cairn_store_range(srv->store, &resp, &r);
        if (rc != 0) {
            cairn_range_resp_destroy(&resp);
            break;
        }
        for (size_t i = 0; i < resp.nkvs; i++) {
            const cairn_kv *kv = &resp.kvs[i];
            uint8_t n[8];
            put_u64(n, kv->key_len);
            crc = etcd_crc32c(crc, n, 8);
            crc = etcd_crc32c(crc, kv->key, kv->key_len);
            put_u64(n, kv->value_len);
            crc = etcd_crc32c(crc, n, 8);
            crc = etcd_crc32c(crc, kv->value, kv->value_len);
            put_u64(n, (uint64_t)kv->lease);
            crc = etcd_crc32c(crc, n, 8);
        }
        int more = resp.more && resp.nkvs > 0;
        if (more) {
            const cairn_kv *last = &resp.kvs[resp.nkvs - 1];
            uint8_t *k = realloc(next, last->key_len + 1);
            if (!k) {
                rc = CAIRN_ENOMEM;
                cairn_range_resp_destroy(&resp);
                break;
            }
            memcpy(k, last->key, last->key_len);
            k[last->key_len] = 0; /* the smallest key after |last| */
            next = k;
            next_len = last->key_len + 1;
        }
        cairn_range_resp_destroy(&resp);
        if (!more)
            break;
    }
    free(next);
    *out = rc == 0 ? crc : 0;
    return rc;
}

static void maint_hash_kv(rpc_call *c, const uint8_t *req, size_t len)
{
    Etcdserverpb__HashKVRequest *m = (Etcdserverpb__HashKVRequest *)rpc_unpack(
        c, &etcdserverpb__hash_kvrequest__descriptor, req, len);
    if (!m)
        return;
    cairn_server *srv = etcd_node(c);
    cairn_header h;
    cairn_store_header(srv->store, &h);
    int64_t compacted = cairn_store_compacted_rev(srv->store);
    int64_t rev = m->revision;
    /* etcd: at or below the compacted revision is compacted; above the
     * current one is a future revision; 0 is the current one. */
    if (rev > 0 && rev <= compacted) {
        rpc_fail(c, CAIRN_ECOMPACTED, NULL);
        return;
    }
    if (rev > h.revision) {
        rpc_fail(c, CAIRN_EFUTUREREV, NULL);
        return;
    }
    if (rev <= 0)
        rev = h.revision;
    uint32_t hash;
    int rc = hash_keyspace(srv, &hash, rev);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    Etcdserverpb__ResponseHeader ph;
    etcd_header(srv, &ph, &h);
    Etcdserverpb__HashKVResponse out;
    etcdserverpb__hash_kvresponse__init(&out);
    out.header = &ph;
    out.hash = hash;
    /* etcd: -1 until the first compaction. */
    out.compact_revision = compacted > 0 ? compacted : -1;
    rpc_reply(c, &out.base);
}

static void maint_hash(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__hash_request__descriptor, req, len))
        return;
    /* etcd hashes its whole bolt file; cairn's backend files differ from
     * node to node, so Hash is the key-space hash at the current revision. */
    cairn_header h;
    cairn_store_header(etcd_node(c)->store, &h);
    uint32_t hash;
    int rc = hash_keyspace(etcd_node(c), &hash, h.revision);
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    Etcdserverpb__ResponseHeader ph;
    etcd_header(etcd_node(c), &ph, &h);
    Etcdserverpb__HashResponse out;
    etcdserverpb__hash_response__init(&out);
    out.header = &ph;
    out.hash = hash;
    rpc_reply(c, &out.base);
}

/* ---- the service --------------------------------------------------------- */

static const rpc_method maintenance_methods[] = {
    {"/etcdserverpb.Maintenance/Alarm", RPC_UNARY, maint_alarm, 2,
     &etcdserverpb__alarm_request__descriptor},
    {"/etcdserverpb.Maintenance/Status", RPC_UNARY, maint_status, 2,
     &etcdserverpb__status_request__descriptor},
    {"/etcdserverpb.Maintenance/Defragment", RPC_UNARY, maint_defragment, 1,
     &etcdserverpb__defragment_request__descriptor},
    {"/etcdserverpb.Maintenance/Hash", RPC_UNARY, maint_hash, 1,
     &etcdserverpb__hash_request__descriptor},
    {"/etcdserverpb.Maintenance/HashKV", RPC_UNARY, maint_hash_kv, 1,
     &etcdserverpb__hash_kvrequest__descriptor},
    {"/etcdserverpb.Maintenance/Snapshot", RPC_SERVER_STREAM, maint_snapshot, 1,
     &etcdserverpb__snapshot_request__descriptor},
    {"/etcdserverpb.Maintenance/MoveLeader", RPC_UNARY, maint_move_leader, 1,
     &etcdserverpb__move_leader_request__descriptor},
};

const rpc_service etcd_maintenance_service = {
    "etcdserverpb.Maintenance", maintenance_methods,
    sizeof maintenance_methods / sizeof maintenance_methods[0], NULL, etcd_admit};
