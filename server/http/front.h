#ifndef CAIRN_SERVER_FRONT_H
#define CAIRN_SERVER_FRONT_H

/*
 * Internal to server/: the front listener (front.c). cairn binds every
 * client URL (and --listen-metrics-urls) itself, accepts, and looks at the
 * first bytes of each connection: HTTP/2's client preface hands the socket
 * to gRPC (rpc_engine_adopt_fd, after which gRPC alone owns it and pays
 * nothing for the sharing), anything else is read as HTTP/1.1 and answered
 * by the front's own thread through the |serve| callback (serve.c: /health,
 * /version, /metrics, the JSON gateway). As etcd does on one port.
 *
 * TLS plugs in per listener (front_tls): an https:// listener hands each
 * accepted socket to the TLS module, which runs the handshake off the
 * front thread and gives back a plaintext socket (a socketpair end it
 * pumps) with front_adopt; that socket then goes through the same sniff.
 * Without a front_tls, https:// URLs are refused.
 */

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "server/http/http.h"

struct rpc_engine;
typedef struct front front;

/* What a listener serves. */
enum {
    FRONT_GRPC = 1,    /* HTTP/2 connections go to gRPC */
    FRONT_GATEWAY = 2, /* etcd's JSON gateway (/v3/...) */
    FRONT_OPS = 4,     /* /health, /version, /metrics */
    FRONT_CLIENT = FRONT_GRPC | FRONT_GATEWAY | FRONT_OPS,
    FRONT_METRICS = FRONT_OPS, /* --listen-metrics-urls */
};

/* The TLS hook of an https:// listener. */
typedef struct front_tls {
    /* Called on the front thread for each connection accepted on listener
     * |listener|; owns |fd| (non-blocking) from here. Must not block: it
     * runs the handshake elsewhere, then calls front_adopt(f, listener,
     * plain) with the plaintext side, or closes |fd|. */
    void (*accept_cb)(void *arg, front *f, int listener, int fd);
    void *arg; /* borrowed; outlives the front */
} front_tls;

/* Answers one whole HTTP/1.1 request |req| that arrived on a listener
 * serving |flags|: either appends the whole answer (http_answer) to |out|
 * and returns 0, or returns FRONT_PENDING and later hands the answer to
 * front_complete with |token| (the connection reads no further request
 * meanwhile). Runs on the front thread: must not block. |req| is
 * borrowed for the call only. */
typedef int (*front_serve_cb)(void *arg, int flags, const http_request *req, http_buf *out,
                              uint64_t token);
enum { FRONT_PENDING = 1 };

typedef struct front_options {
    uint64_t max_body;    /* --max-request-bytes */
    int max_http_conns;   /* HTTP/1.1 connections open at once (more wait in accept) */
    int sniff_timeout_ms; /* a connection that says nothing for this long is closed */
    int idle_timeout_ms;  /* an HTTP connection between (or inside) requests */
} front_options;

/* |rpc| (borrowed, outlives the front) receives the HTTP/2 connections;
 * |serve|, |arg| answer HTTP/1.1. */
int front_new(front **out, const front_options *o, struct rpc_engine *rpc, front_serve_cb serve,
              void *arg);
/* Binds |url| (http://host:port, https://host:port with |tls|, unix://path)
 * for |flags|; the port bound (0 for unix://) in |*port|. Returns the
 * listener's index, or a negative code (CAIRN_EINVAL: a URL it cannot
 * serve; CAIRN_EIO: cannot bind) with a message in |err|. Before
 * front_start. */
int front_listen(front *f, const char *url, int flags, const front_tls *tls, int *port, char *err,
                 size_t errlen);
/* Starts the front thread (after rpc_engine_start: gRPC takes sockets only
 * once started). */
int front_start(front *f);
/* A plaintext connection for listener |listener| (a TLS handshake done):
 * sniffed like an accepted one. Takes |fd|. Any thread. */
void front_adopt(front *f, int listener, int fd);
/* The answer to the request that was left pending with |token|: takes
 * |answer| (its contents; *answer is zeroed), which is dropped if the
 * connection has closed meanwhile. Any thread. */
void front_complete(front *f, uint64_t token, http_buf *answer);
/* A streaming answer (the gateway's /v3/watch): flow control shared by the
 * front and the producer, which embeds it. The producer adds each chunk's
 * length to |unsent| before front_send; the front takes it off as the
 * socket accepts the bytes, so the producer can stop making chunks while
 * |unsent| is high (bounded memory for a slow client). */
typedef struct front_flow {
    atomic_size_t unsent;
    atomic_int closed; /* the connection is gone: produce nothing more */
    int close_at_end;  /* set before the first part: the end is the close
                          (an HTTP/1.0 answer without a length) */
    /* Front thread (or front_stop's): |unsent| fell below FRONT_FLOW_LOW
     * after a write, or |closed| was set. Must not block, nor call into
     * the front. */
    void (*wake_cb)(struct front_flow *fl);
    /* The front's reference (see front_send) is dropped; once. */
    void (*release_cb)(struct front_flow *fl);
} front_flow;
#define FRONT_FLOW_LOW (64u * 1024u)

/* Part of the answer to the request left pending with |token|: takes
 * |chunk|'s contents like front_complete, but the request stays pending
 * (more parts follow) unless |last|. The first part of a stream passes
 * |fl| and hands the front one reference to it, given back through
 * fl->release_cb when the last part is out or the connection closes
 * (fl->closed set, fl->wake_cb called first); later parts pass NULL. Any
 * thread, never with a lock wake_cb takes. */
void front_send(front *f, uint64_t token, http_buf *chunk, int last, front_flow *fl);
/* Stops accepting, closes every HTTP/1.1 connection and joins the thread
 * (before rpc_engine_stop). Idempotent. */
void front_stop(front *f);
void front_free(front *f);

#endif
