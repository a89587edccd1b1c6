#ifndef CAIRN_SERVER_METRICS_H
#define CAIRN_SERVER_METRICS_H

/*
 * Internal to server/: /metrics in Prometheus' text format 0.0.4
 * (metrics.c). Nothing is counted here: each value is read, when scraped,
 * from the module that counts it (the gRPC engine's per-method atomics,
 * the store's stats, /proc/self), so the hot paths take no lock for it.
 * doc/metrics.md lists etcd 3.4's metrics and what cairn serves of each.
 */

#include "server/http/http.h"
#include "server/node.h"

/* Appends every metric of |srv| to |out|. Any thread. */
void metrics_write(cairn_server *srv, http_buf *out);

#endif
