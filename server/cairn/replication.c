/*
 * cairn's Replication service on the client URLs (proto/cairnpb/
 * replication.proto). Heads: the node's heads as far as they are durable
 * (store/replica.h, cairn_store_heads), so a client or a test can tell two
 * nodes hold the same changes without reading their key spaces.
 * ChangeBytes: the count and encoded size of the node's changes, for the
 * cluster benchmark's bytes-on-the-wire figure.
 */
#include "server/cairn/cairn.h"

#include <stdlib.h>

#include "cairnpb/replication.pb-c.h"
#include "crdt/error.h"
#include "server/node.h"
#include "store/replica.h"

static void replication_heads(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &cairnpb__heads_request__descriptor, req, len))
        return;
    cairn_server *srv = c->arg;
    cairn_hash *heads;
    size_t n;
    int rc = cairn_store_heads(srv->store, &heads, &n);
    ProtobufCBinaryData *hb = n ? calloc(n, sizeof *hb) : NULL;
    if (!rc && n && !hb)
        rc = CAIRN_ENOMEM;
    if (rc) {
        free(heads);
        rpc_fail(c, rc, NULL);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        hb[i].data = heads[i].b;
        hb[i].len = sizeof heads[i].b;
    }
    Cairnpb__HeadsResponse out = CAIRNPB__HEADS_RESPONSE__INIT;
    out.member_id = cairn_store_member_id(srv->store);
    out.heads = hb;
    out.n_heads = n;
    rpc_reply(c, &out.base);
    free(hb);
    free(heads);
}

static void replication_change_bytes(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &cairnpb__change_bytes_request__descriptor, req, len))
        return;
    cairn_server *srv = c->arg;
    Cairnpb__ChangeBytesResponse out = CAIRNPB__CHANGE_BYTES_RESPONSE__INIT;
    int rc = cairn_store_change_bytes(srv->store, &out.changes, &out.bytes);
    if (rc) {
        rpc_fail(c, rc, NULL);
        return;
    }
    rpc_reply(c, &out.base);
}

static const rpc_method replication_methods[] = {
    {"/cairnpb.Replication/Heads", RPC_UNARY, replication_heads, 1},
    {"/cairnpb.Replication/ChangeBytes", RPC_UNARY, replication_change_bytes, 1},
};

const rpc_service cairn_replication_service = {
    "cairnpb.Replication", replication_methods,
    sizeof replication_methods / sizeof replication_methods[0], NULL};
