/*
 * What cairn answers over HTTP/1.1 (serve.h), measured against etcd 3.4.23
 * with curl: status codes, bodies and headers byte for byte except the
 * Date. etcd's texts come from Go's net/http (http.Error appends a newline
 * and sets nosniff; the mux's 404 is "404 page not found").
 */
#include "server/http/serve.h"

#include "server/http/front.h"
#include "server/http/metrics.h"
#include "server/node.h"

#include <stdatomic.h>
#include <string.h>

#define TEXT "text/plain; charset=utf-8"
#define NOSNIFF "X-Content-Type-Options: nosniff\r\n"

/* Go's http.Error: the text, a newline, plain text, nosniff. */
static void go_error(http_buf *out, const http_request *r, int status, const char *extra,
                     const char *text)
{
    http_buf hdr = {0};
    if (extra)
        http_buf_printf(&hdr, "%s", extra);
    http_buf_printf(&hdr, NOSNIFF);
    http_buf body = {0};
    http_buf_printf(&body, "%s\n", text);
    http_answer(out, r->minor, status, TEXT, hdr.failed ? NOSNIFF : hdr.data, body.data, body.len,
                !r->keep_alive);
    http_buf_free(&hdr);
    http_buf_free(&body);
}

static int get_only(http_buf *out, const http_request *r)
{
    if (http_method_is(r, "GET"))
        return 1;
    /* etcd: /health and /version answer 405 "Method Not Allowed" to others */
    go_error(out, r, 405, "Allow: GET\r\n", "Method Not Allowed");
    return 0;
}

static void health(cairn_server *srv, const http_request *r, http_buf *out)
{
    if (!get_only(out, r))
        return;
    /* etcd: 503 {"health":"false"} (through http.Error) while a NOSPACE
     * alarm is raised; every cairn node has its "leader" */
    if (atomic_load(&srv->nospace)) {
        go_error(out, r, 503, NULL, "{\"health\":\"false\"}");
        return;
    }
    static const char ok[] = "{\"health\":\"true\"}";
    http_answer(out, r->minor, 200, TEXT, NULL, ok, sizeof ok - 1, !r->keep_alive);
}

static void version(const http_request *r, http_buf *out)
{
    if (!get_only(out, r))
        return;
    /* etcd: {"etcdserver":"3.4.23","etcdcluster":"3.4.0"}; cairn's own
     * version is a third field, which etcd's clients ignore */
    static const char v[] = "{\"etcdserver\":\"" CAIRN_ETCD_VERSION "\",\"etcdcluster\":\"3.4.0\","
                            "\"cairn\":\"" CAIRN_VERSION "\"}";
    http_answer(out, r->minor, 200, "application/json", NULL, v, sizeof v - 1, !r->keep_alive);
}

static void metrics(cairn_server *srv, const http_request *r, http_buf *out)
{
    http_buf body = {0};
    metrics_write(srv, &body);
    if (body.failed) {
        http_buf_free(&body);
        go_error(out, r, 500, NULL, "out of memory");
        return;
    }
    http_answer(out, r->minor, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, body.data,
                body.len, !r->keep_alive);
    http_buf_free(&body);
}

void serve_http(void *arg, int flags, const http_request *r, http_buf *out)
{
    cairn_server *srv = arg;
    if ((flags & FRONT_OPS) && http_path_is(r, "/health"))
        health(srv, r, out);
    else if ((flags & FRONT_OPS) && http_path_is(r, "/version"))
        version(r, out);
    else if ((flags & FRONT_OPS) && http_path_is(r, "/metrics"))
        metrics(srv, r, out);
    else
        go_error(out, r, 404, NULL, "404 page not found");
}
