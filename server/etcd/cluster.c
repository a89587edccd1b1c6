/*
 * etcd's Cluster service. There is one member: this node (MemberList
 * answers it from the flags, as etcd's single-member cluster does).
 * Membership changes are refused UNIMPLEMENTED until the replicated node
 * brings them.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"

#include <string.h>

static void cluster_member_list(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__member_list_request__descriptor, req, len))
        return;
    const cairn_config *cfg = etcd_node(c)->cfg;
    /* etcd: the Cluster service's header has no revision. */
    Etcdserverpb__ResponseHeader ph;
    etcd_header(etcd_node(c), &ph, NULL);
    ph.revision = 0;
    Etcdserverpb__Member me;
    etcdserverpb__member__init(&me);
    me.id = cairn_store_member_id(etcd_node(c)->store);
    me.name = cfg->name;
    me.peerurls = cfg->initial_advertise_peer_urls;
    me.n_peerurls = cfg->ninitial_advertise_peer_urls;
    me.clienturls = cfg->advertise_client_urls;
    me.n_clienturls = cfg->nadvertise_client_urls;
    Etcdserverpb__Member *members[1] = {&me};
    Etcdserverpb__MemberListResponse out;
    etcdserverpb__member_list_response__init(&out);
    out.header = &ph;
    out.members = members;
    out.n_members = 1;
    rpc_reply(c, &out.base);
}

static void cluster_unimplemented(rpc_call *c, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    etcd_unsupported(c, " yet: membership changes come with clustering");
}

static const rpc_method cluster_methods[] = {
    {"/etcdserverpb.Cluster/MemberAdd", RPC_UNARY, cluster_unimplemented, 1},
    {"/etcdserverpb.Cluster/MemberRemove", RPC_UNARY, cluster_unimplemented, 1},
    {"/etcdserverpb.Cluster/MemberUpdate", RPC_UNARY, cluster_unimplemented, 1},
    {"/etcdserverpb.Cluster/MemberList", RPC_UNARY, cluster_member_list, 2},
    {"/etcdserverpb.Cluster/MemberPromote", RPC_UNARY, cluster_unimplemented, 1},
};

const rpc_service etcd_cluster_service = {"etcdserverpb.Cluster", cluster_methods,
                                          sizeof cluster_methods / sizeof cluster_methods[0], NULL};
