/*
 * The daemon's lifecycle (server.h): a node (node.c) with its store, the
 * gRPC engine (rpc/) and etcd's services (etcd/) registered on it, one
 * listener per client URL. This file is the only one that knows all three;
 * none of them knows this file.
 *
 * Order. The watch hub exists before the store opens (the store's events
 * callback feeds it) and after it closes; the store closes only once the
 * engine has freed every call (closing it completes or fails every write
 * still pending); grpc_shutdown comes last.
 */
#include "server/server.h"

#include "crdt/error.h"
#include "server/cairn/cairn.h"
#include "server/etcd/etcd.h"
#include "server/http/front.h"
#include "server/http/gateway.h"
#include "server/http/serve.h"
#include "server/node.h"
#include "server/peer/peer.h"
#include "server/rpc/rpc.h"
#include "server/tls/tls.h"
#include "store/replica.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const rpc_service *const services[] = {
    &etcd_kv_service,      &etcd_watch_service,       &etcd_lease_service,
    &etcd_cluster_service, &etcd_maintenance_service, &etcd_auth_service,
    &etcd_lock_service,    &etcd_election_service,    &cairn_replication_service,
};

/* ---- TLS (tls/) ---- */

/* The TLS connections the client listeners hold at once. */
#define CLIENT_TLS_MAX_CONNS 4096

static int is_tls_url(const char *url)
{
    return strncmp(url, "https://", 8) == 0 || strncmp(url, "unixs://", 8) == 0;
}

/* --cipher-suites for gRPC's TLS (the peer links), then the client
 * listeners' context and pump when a client URL is https://. */
static int tls_setup(cairn_server *srv, char *err, size_t errlen)
{
    const cairn_config *cfg = srv->cfg;
    int rc = cairn_tls_grpc_ciphers(cfg, 1, err, errlen);
    if (rc)
        return rc;
    int any = 0;
    for (size_t i = 0; i < cfg->nlisten_client_urls; i++)
        any |= is_tls_url(cfg->listen_client_urls[i]);
    if (!any)
        return 0;
    cairn_tls_options o;
    cairn_tls_paths paths;
    rc = cairn_tls_options_from(&o, &paths, cfg, &cfg->client_tls, "client",
                                cfg->listen_client_urls, cfg->nlisten_client_urls, err, errlen);
    if (!rc && (!o.cert_file || !o.key_file)) {
        snprintf(err, errlen,
                 "cannot serve https:// client URLs without --cert-file and --key-file, or "
                 "--auto-tls");
        rc = CAIRN_EINVAL;
    }
    if (!rc)
        rc = cairn_tls_server_new(&srv->tls_client, &o, err, errlen);
    if (!rc)
        rc = cairn_tls_pump_new(&srv->tls_pump, CLIENT_TLS_MAX_CONNS);
    return rc;
}

/* front_tls: an accepted https:// connection goes to the pump, its
 * plaintext end back to the front's sniff at once. */
static void tls_accept(void *arg, front *f, int listener, int fd)
{
    cairn_server *srv = arg;
    int plain;
    if (cairn_tls_pump_add(srv->tls_pump, srv->tls_client, fd, &plain) == 0)
        front_adopt(f, listener, plain);
}

int cairn_server_new(cairn_server **out, const cairn_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    cairn_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return CAIRN_ENOMEM;
    srv->cfg = cfg;
    node_init(srv);

    int rc = tls_setup(srv, err, errlen);
    if (rc != 0)
        goto fail;
    rpc_engine_options eo = {cfg->threads,
                             cfg->max_request_bytes + ETCD_GRPC_OVERHEAD_BYTES,
                             cfg->grpc_keepalive_min_time_ms,
                             cfg->grpc_keepalive_interval_ms,
                             cfg->grpc_keepalive_timeout_ms,
                             cfg->max_concurrent_streams};
    rc = rpc_engine_new(&srv->rpc, &eo);
    if (rc == 0)
        rc = watch_hub_new(srv);
    if (rc == 0)
        rc = kv_batcher_new(srv);
    if (rc == 0) {
        cairn_store_subscriber hub = watch_hub_subscriber(srv);
        rc = node_open_store(srv, &hub, 1, err, errlen);
    }
    if (rc != 0)
        goto fail;
    watch_hub_ready(srv);

    for (size_t i = 0; i < sizeof services / sizeof services[0]; i++)
        if ((rc = rpc_engine_add(srv->rpc, services[i], srv)) != 0) {
            snprintf(err, errlen, "grpc: cannot register the %s service", services[i]->name);
            goto fail;
        }

    srv->ports = calloc(cfg->nlisten_client_urls, sizeof *srv->ports);
    if (!srv->ports) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    /* the client URLs are cairn's own sockets, shared by gRPC and
     * HTTP/1.1 (http/front.c) */
    /* a gateway body is JSON with base64 inside (4/3 of the bytes, and
     * more): room for twice the request, the gRPC limit decides. 128
     * HTTP/1.1 connections at most: each may buffer one such body. */
    front_options fo = {2 * cfg->max_request_bytes + ETCD_GRPC_OVERHEAD_BYTES, 128, 0, 0};
    rc = front_new(&srv->front, &fo, srv->rpc, serve_http, srv);
    if (rc == 0)
        rc = gateway_new(&srv->gateway, srv->rpc, srv->front);
    if (rc != 0)
        goto fail;
    for (size_t i = 0; i < cfg->nlisten_client_urls; i++) {
        front_tls hook = {tls_accept, srv};
        rc = front_listen(srv->front, cfg->listen_client_urls[i], FRONT_CLIENT,
                          srv->tls_client ? &hook : NULL, &srv->ports[i], err, errlen);
        if (rc < 0)
            goto fail;
        srv->nports++;
    }
    /* etcd: --listen-metrics-urls serve /metrics and /health, no gRPC */
    for (size_t i = 0; i < cfg->nlisten_metrics_urls; i++) {
        int port;
        rc = front_listen(srv->front, cfg->listen_metrics_urls[i], FRONT_METRICS, NULL, &port, err,
                          errlen);
        if (rc < 0)
            goto fail;
    }
    rc = peer_net_new(&srv->peer, cfg, srv->store, srv->join, err, errlen);
    if (rc == 0)
        rc = cairn_repl_hub_new(srv);
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
    int rc = rpc_engine_start(srv->rpc);
    if (rc == 0)
        rc = gateway_start(srv->gateway);
    /* a joining node's client URLs are bound but not served until it
     * caught up (etcd's new member: the same) */
    if (rc == 0 && !srv->join)
        rc = front_start(srv->front);
    if (rc == 0)
        rc = peer_net_start(srv->peer);
    if (rc != 0)
        return rc;
    if (!srv->join)
        cairn_log(CAIRN_LOG_INFO, "serving etcd's v3 API on %s (%d workers)",
                  srv->cfg->listen_client_urls[0], rpc_engine_workers(srv->rpc));
    return 0;
}

int cairn_server_joining(const cairn_server *srv)
{
    return srv->join != NULL;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The join's heads are all here durably (and the genesis with them). */
static int caught_up(cairn_server *srv)
{
    if (cairn_store_awaiting_genesis(srv->store))
        return 0;
    cairn_hash missing;
    return cairn_store_heads_here(srv->store, srv->join->heads, srv->join->nheads, &missing) == 0;
}

int cairn_server_join_wait(cairn_server *srv, const sigset_t *sigs)
{
    uint64_t t0 = srv->join_started_ms, said = mono_ms();
    while (!caught_up(srv)) {
        /* 20 ms: the join's latency is what the bench measures */
        struct timespec ts = {0, 20 * 1000000L};
        int sig = sigtimedwait(sigs, NULL, &ts);
        if (sig > 0)
            return sig;
        if (mono_ms() - said >= 5000) {
            said = mono_ms();
            cairn_header h;
            cairn_store_header(srv->store, &h);
            cairn_log(CAIRN_LOG_INFO,
                      "joining: catching up from the peers (%.0f s so far, at revision %" PRId64
                      ")",
                      (double)(said - t0) / 1000.0, h.revision);
        }
    }
    peer_net_joined(srv->peer);
    node_publish(srv);
    int rc = front_start(srv->front);
    if (rc)
        return rc;
    cairn_header h;
    cairn_store_header(srv->store, &h);
    cairn_log(CAIRN_LOG_INFO,
              "joined: caught up with %s in %.2f s (revision %" PRId64
              "); serving etcd's v3 API on %s (%d workers)",
              srv->join->from, (double)(mono_ms() - t0) / 1000.0, h.revision,
              srv->cfg->listen_client_urls[0], rpc_engine_workers(srv->rpc));
    return 0;
}

void cairn_server_stop(cairn_server *srv, int grace_ms)
{
    /* the peer thread uses the store: it stops first */
    peer_net_stop(srv->peer);
    /* before gRPC's shutdown: no connection is handed over after it */
    front_stop(srv->front);
    /* its calls in flight end, and its connection closes, before gRPC's
     * shutdown (which waits for every connection) */
    gateway_stop(srv->gateway);
    if (srv->rpc)
        rpc_engine_stop(srv->rpc, grace_ms);
    /* after gRPC let go of the plaintext ends */
    cairn_tls_pump_free(srv->tls_pump);
    srv->tls_pump = NULL;
    if (srv->store) {
        cairn_store_close(srv->store);
        srv->store = NULL;
    }
}

void cairn_server_free(cairn_server *srv)
{
    if (!srv)
        return;
    cairn_server_stop(srv, 0);
    /* after the store closed: the store's subscriber and receive
     * completions point into it */
    cairn_repl_hub_free(srv); /* after the engine stopped: no call parks */
    peer_net_free(srv->peer);
    node_destroy(srv);
    watch_hub_free(srv);
    kv_batcher_free(srv);
    gateway_free(srv->gateway);
    front_free(srv->front);
    cairn_tls_server_free(srv->tls_client);
    free(srv->ports);
    rpc_engine_free(srv->rpc);
    free(srv);
}
