/*
 * etcd's Cluster service. MemberList answers from the initial cluster in
 * the flags (which the genesis change fixes) and what the peers' hellos
 * said.
 * Membership changes are refused UNIMPLEMENTED until the replicated node
 * brings them.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"

#include <stdlib.h>
#include <string.h>

#include "server/peer/peer.h"

/* etcd lists members by id. */
static int by_id(const void *a, const void *b)
{
    uint64_t x = (*(Etcdserverpb__Member *const *)a)->id;
    uint64_t y = (*(Etcdserverpb__Member *const *)b)->id;
    return x < y ? -1 : x > y;
}

static void cluster_member_list(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__member_list_request__descriptor, req, len))
        return;
    cairn_server *srv = etcd_node(c);
    const cairn_config *cfg = srv->cfg;
    /* etcd: the Cluster service's header has no revision. */
    Etcdserverpb__ResponseHeader ph;
    etcd_header(srv, &ph, NULL);
    ph.revision = 0;
    size_t n = cfg->ninitial_cluster;
    Etcdserverpb__Member *ms = calloc(n, sizeof *ms);
    Etcdserverpb__Member **mp = calloc(n, sizeof *mp);
    char ***urls = calloc(n, sizeof *urls);
    size_t *nurls = calloc(n, sizeof *nurls);
    if (!ms || !mp || !urls || !nurls) {
        free(ms);
        free(mp);
        free(urls);
        free(nurls);
        rpc_fail(c, CAIRN_ENOMEM, NULL);
        return;
    }
    /* The members of the initial cluster (the genesis fixes them); another
     * member's client URLs are the ones its hello gave, none before it
     * connected (as etcd lists a member that has not published yet). */
    for (size_t i = 0; i < n; i++) {
        const cairn_config_member *m = &cfg->initial_cluster[i];
        Etcdserverpb__Member *e = &ms[i];
        etcdserverpb__member__init(e);
        e->name = m->name;
        e->peerurls = m->peer_urls;
        e->n_peerurls = m->npeer_urls;
        if (strcmp(m->name, cfg->name) == 0) {
            e->id = cairn_store_member_id(srv->store);
            e->peerurls = cfg->initial_advertise_peer_urls;
            e->n_peerurls = cfg->ninitial_advertise_peer_urls;
            e->clienturls = cfg->advertise_client_urls;
            e->n_clienturls = cfg->nadvertise_client_urls;
        } else {
            e->id = cairn_store_member_id_of((const char *const *)m->peer_urls, m->npeer_urls,
                                             cfg->initial_cluster_token);
            if (peer_net_client_urls(srv->peer, e->id, &urls[i], &nurls[i]) == 0) {
                e->clienturls = urls[i];
                e->n_clienturls = nurls[i];
            }
        }
        mp[i] = e;
    }
    qsort(mp, n, sizeof *mp, by_id);
    Etcdserverpb__MemberListResponse out;
    etcdserverpb__member_list_response__init(&out);
    out.header = &ph;
    out.members = mp;
    out.n_members = n;
    rpc_reply(c, &out.base);
    for (size_t i = 0; i < n; i++)
        peer_net_urls_free(urls[i], nurls[i]);
    free(urls);
    free(nurls);
    free(mp);
    free(ms);
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
