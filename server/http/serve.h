#ifndef CAIRN_SERVER_SERVE_H
#define CAIRN_SERVER_SERVE_H

/*
 * Internal to server/: the HTTP/1.1 answers of the client and metrics URLs
 * (serve.c): /health, /version, /metrics, as etcd 3.4 answers them. The
 * front listener's serve callback (front.h), with the cairn_server as arg.
 */

#include "server/http/http.h"

void serve_http(void *srv, int flags, const http_request *req, http_buf *out);

#endif
