/*
 * What etcd's services share: the ResponseHeader every response carries
 * (packed by hand for the answers that carry nothing else, the common Put)
 * and etcd's size rule for writes.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"
#include "crdt/wire.h"

#include <stdio.h>
#include <string.h>

/* etcd: InternalRaftRequest = request + header (13 bytes with the 9-byte
 * request id etcd's default member gets) + field tag + length varint. */
#define RAFT_HEADER_BYTES 13u

int etcd_entry_too_large(rpc_call *c, size_t len)
{
    if (RAFT_HEADER_BYTES + 1 + (uint64_t)wire_uv_len(len) + len <=
        etcd_node(c)->cfg->max_request_bytes)
        return 0;
    rpc_fail(c, CAIRN_EREQUESTTOOLARGE, NULL);
    return 1;
}

void etcd_header(cairn_server *srv, Etcdserverpb__ResponseHeader *out, const cairn_header *h)
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

size_t etcd_pack_header_only(uint8_t out[ETCD_HEADER_ONLY_MAX],
                             const Etcdserverpb__ResponseHeader *h)
{
    /* proto3: a field at its default (0) is left out, in field order. */
    const uint64_t v[4] = {h->cluster_id, h->member_id, (uint64_t)h->revision, h->raft_term};
    uint8_t *p = out + 2;
    for (unsigned i = 0; i < 4; i++) {
        if (v[i] == 0)
            continue;
        *p++ = (uint8_t)((i + 1) << 3); /* field i+1, varint */
        p = wire_put_uv(p, v[i]);
    }
    size_t n = (size_t)(p - out);
    out[0] = (1 << 3) | 2;     /* field 1 (header), length-delimited */
    out[1] = (uint8_t)(n - 2); /* at most 44: one byte */
    return n;
}

void etcd_reply_header_only(rpc_call *c, const Etcdserverpb__ResponseHeader *h)
{
    uint8_t buf[ETCD_HEADER_ONLY_MAX];
    rpc_reply_raw(c, buf, etcd_pack_header_only(buf, h));
}

void etcd_unsupported(rpc_call *c, const char *why)
{
    char detail[256];
    snprintf(detail, sizeof detail, "cairn: %s is not supported%s",
             strrchr(c->method->path, '/') + 1, why);
    rpc_fail(c, CAIRN_EUNIMPLEMENTED, detail);
}
