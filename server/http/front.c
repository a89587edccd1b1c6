/*
 * The front listener (front.h): cairn's own sockets for the client URLs,
 * shared by gRPC and HTTP/1.1 as etcd shares its port (etcd uses cmux).
 *
 * One thread polls the listening sockets, the connections not yet
 * classified and the HTTP/1.1 connections. A new connection is peeked at
 * (MSG_PEEK: nothing is consumed) until its first bytes either are HTTP/2's
 * 24-byte client preface — the socket then goes to gRPC whole and is never
 * looked at again, so a gRPC call pays one poll round per connection and
 * nothing per request — or stop matching it: then it is HTTP/1.1, read and
 * answered here. A connection that has sent nothing decisive within
 * sniff_timeout_ms is closed.
 *
 * Bounds: at most FRONT_MAX_SNIFF connections being classified (past that
 * the listeners are not polled: new ones wait in the kernel's backlog), at
 * most max_http_conns HTTP/1.1 connections (one more is answered 503 and
 * closed), each holding at most its head and --max-request-bytes of body;
 * a request must arrive whole within idle_timeout_ms of the previous
 * answer (slow clients are cut off; trickling bytes does not extend it).
 * Answers are built synchronously by the serve callback, which must not
 * block; the thread never waits on a socket.
 */
#define _GNU_SOURCE
#include "server/http/front.h"

#include "crdt/error.h"
#include "server/rpc/rpc.h"
#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define FRONT_MAX_SNIFF 1024
#define FRONT_MAX_LISTENERS 64
/* An HTTP connection stops reading while this much of its answers waits. */
#define FRONT_OUT_HIGH (4u << 20)
/* How long a refused connection's remaining bytes are read and dropped. */
#define FRONT_LINGER_MS 2000

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define PREFACE_LEN (sizeof preface - 1)

typedef struct listener {
    int fd;
    int flags;
    int has_tls;
    front_tls tls;
    char *unix_path; /* unlinked when the front is freed */
} listener;

enum { C_SNIFF = 0, C_HTTP = 1 };

typedef struct conn {
    uint64_t id; /* the token of its pending answer */
    int pending; /* an answer is being made elsewhere (front_complete) */
    int fd;
    int listener;
    int state;
    int closing;       /* close once |out| is written */
    int closing_after; /* set |closing| when the pending answer comes */
    int lingering;     /* answered and shut for writing: what still comes is dropped */
    int64_t deadline_ms;
    uint8_t *in;
    size_t inlen, incap;
    http_buf out;
    size_t outoff;
    front_flow *flow; /* a streaming answer's: one reference */
} conn;

typedef struct adopted {
    int listener;
    int fd;
} adopted;

typedef struct completed {
    uint64_t token;
    http_buf answer;
    int last;       /* the answer is whole: the request is no longer pending */
    front_flow *fl; /* the first part of a stream: one reference */
} completed;

struct front {
    front_options o;
    rpc_engine *rpc;
    front_serve_cb serve;
    void *serve_arg;
    listener ls[FRONT_MAX_LISTENERS];
    int nls;
    conn **conns;
    size_t nconns, capconns;
    int nsniff, nhttp;
    int wake;
    pthread_t thread;
    int running;
    atomic_int stopping;
    pthread_mutex_t mu; /* guards |adopt| */
    adopted *adopt;
    size_t nadopt, capadopt;
    completed *done; /* guarded by |mu| too */
    size_t ndone, capdone;
    uint64_t next_id;
    int64_t accept_pause_until; /* after running out of descriptors */
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int front_new(front **out, const front_options *o, rpc_engine *rpc, front_serve_cb serve, void *arg)
{
    *out = NULL;
    front *f = calloc(1, sizeof *f);
    if (!f)
        return CAIRN_ENOMEM;
    f->o = *o;
    if (f->o.max_http_conns <= 0)
        f->o.max_http_conns = 256;
    if (f->o.sniff_timeout_ms <= 0)
        f->o.sniff_timeout_ms = 10000;
    if (f->o.idle_timeout_ms <= 0)
        f->o.idle_timeout_ms = 30000;
    f->rpc = rpc;
    f->serve = serve;
    f->serve_arg = arg;
    pthread_mutex_init(&f->mu, NULL);
    f->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (f->wake < 0) {
        front_free(f);
        return CAIRN_EIO;
    }
    *out = f;
    return 0;
}

/* ---- binding ------------------------------------------------------------- */

static int bind_unix(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) == 0 || strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "unix socket path too long or empty: %s", path);
        return CAIRN_EINVAL;
    }
    strcpy(sa.sun_path, path);
    struct stat st;
    /* a socket left by an earlier run (gRPC and etcd replace it too) */
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0) {
        snprintf(err, errlen, "cannot listen on unix socket %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return CAIRN_EIO;
    }
    return fd;
}

/* Binds every address |hostport| resolves to ("localhost": 127.0.0.1 and
 * ::1, as gRPC's listener did), up to |max|, into |fds|; returns how many
 * (at least one) or a negative code. */
static int bind_tcp(const char *hostport, int *fds, int max, int *port, char *err, size_t errlen)
{
    char host[256];
    size_t len = strlen(hostport);
    while (len > 0 && hostport[len - 1] == '/')
        len--;
    const char *colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (hostport[i] == ':')
            colon = hostport + i;
    const char *bracket = memchr(hostport, ']', len);
    if (!colon || (bracket && colon < bracket) || colon == hostport + len - 1 ||
        (size_t)(colon - hostport) >= sizeof host || memchr(hostport, '/', len)) {
        snprintf(err, errlen, "expected host:port in %s", hostport);
        return CAIRN_EINVAL;
    }
    char portstr[8];
    size_t plen = (size_t)(hostport + len - colon - 1);
    if (plen >= sizeof portstr) {
        snprintf(err, errlen, "bad port in %s", hostport);
        return CAIRN_EINVAL;
    }
    memcpy(portstr, colon + 1, plen);
    portstr[plen] = '\0';
    for (size_t i = 0; i < plen; i++)
        if (portstr[i] < '0' || portstr[i] > '9') {
            snprintf(err, errlen, "bad port in %s", hostport);
            return CAIRN_EINVAL;
        }
    const char *h = hostport;
    size_t hlen = (size_t)(colon - hostport);
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';

    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(hlen ? host : NULL, portstr, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", hostport, gai_strerror(gai));
        return CAIRN_EINVAL;
    }
    int n = 0, saved = 0, failed = 0;
    *port = 0;
    for (struct addrinfo *ai = res; ai && n < max; ai = ai->ai_next) {
        if (n > 0 && strcmp(portstr, "0") == 0)
            break; /* port 0: one socket, one port */
        int fd =
            socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ai->ai_family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
            saved = errno;
            /* an address family the host lacks (no IPv6) is skipped; an
             * address in use fails the URL */
            failed |= saved == EADDRINUSE;
            close(fd);
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (n == 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
            *port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        fds[n++] = fd;
    }
    freeaddrinfo(res);
    if (n == 0 || failed) {
        while (n > 0)
            close(fds[--n]);
        snprintf(err, errlen, "cannot listen on %s: %s", hostport, strerror(saved));
        return CAIRN_EIO;
    }
    return n;
}

int front_listen(front *f, const char *url, int flags, const front_tls *tls, int *port, char *err,
                 size_t errlen)
{
    *port = 0;
    if (f->nls == FRONT_MAX_LISTENERS) {
        snprintf(err, errlen, "too many listen URLs");
        return CAIRN_EINVAL;
    }
    int secure = 0, is_unix = 0;
    const char *rest;
    if (strncmp(url, "http://", 7) == 0)
        rest = url + 7;
    else if (strncmp(url, "https://", 8) == 0)
        rest = url + 8, secure = 1;
    else if (strncmp(url, "unix://", 7) == 0)
        rest = url + 7, is_unix = 1;
    else if (strncmp(url, "unixs://", 8) == 0)
        rest = url + 8, is_unix = 1, secure = 1;
    else {
        snprintf(err, errlen, "cannot serve %s: expected http://host:port or unix://path", url);
        return CAIRN_EINVAL;
    }
    if (secure && !tls) {
        snprintf(err, errlen, "cannot serve %s: cairn does not serve TLS yet", url);
        return CAIRN_EINVAL;
    }
    int fds[4], n;
    if (is_unix) {
        fds[0] = bind_unix(rest, err, errlen);
        n = fds[0] < 0 ? fds[0] : 1;
    } else {
        int room = FRONT_MAX_LISTENERS - f->nls;
        n = bind_tcp(rest, fds, room < 4 ? room : 4, port, err, errlen);
    }
    if (n < 0)
        return n;
    int first = f->nls;
    for (int i = 0; i < n; i++) {
        listener *l = &f->ls[f->nls];
        memset(l, 0, sizeof *l);
        if (is_unix && !(l->unix_path = strdup(rest))) {
            while (i < n)
                close(fds[i++]);
            return CAIRN_ENOMEM;
        }
        l->fd = fds[i];
        l->flags = flags;
        if (secure) {
            l->has_tls = 1;
            l->tls = *tls;
        }
        f->nls++;
    }
    return first;
}

/* ---- connections --------------------------------------------------------- */

static int conn_add(front *f, int fd, int li)
{
    if (f->nconns == f->capconns) {
        size_t cap = f->capconns ? 2 * f->capconns : 64;
        conn **c = realloc(f->conns, cap * sizeof *c);
        if (!c)
            return CAIRN_ENOMEM;
        f->conns = c;
        f->capconns = cap;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return CAIRN_ENOMEM;
    c->id = ++f->next_id;
    c->fd = fd;
    c->listener = li;
    c->state = C_SNIFF;
    c->deadline_ms = now_ms() + f->o.sniff_timeout_ms;
    f->conns[f->nconns++] = c;
    f->nsniff++;
    return 0;
}

/* A stream's connection is gone: the producer stops, the reference goes. */
static void flow_gone(front_flow *fl)
{
    atomic_store(&fl->closed, 1);
    fl->wake_cb(fl);
    fl->release_cb(fl);
}

/* Removes conns[i] (the last one takes its place); closes its socket
 * unless it was handed over (|keep_fd|). */
static void conn_drop(front *f, size_t i, int keep_fd)
{
    conn *c = f->conns[i];
    if (c->flow)
        flow_gone(c->flow);
    if (c->state == C_SNIFF)
        f->nsniff--;
    else
        f->nhttp--;
    if (!keep_fd)
        close(c->fd);
    free(c->in);
    http_buf_free(&c->out);
    free(c);
    f->conns[i] = f->conns[--f->nconns];
}

/* A new socket for listener |li|: TLS first if the listener has it. */
static void take(front *f, int li, int fd)
{
    if (conn_add(f, fd, li) != 0)
        close(fd);
}

static void accept_all(front *f, int li)
{
    listener *l = &f->ls[li];
    while (f->nsniff < FRONT_MAX_SNIFF) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* out of descriptors: the listener stays readable, so stop
             * polling it for a moment rather than spin */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                f->accept_pause_until = now_ms() + 100;
            return;
        }
        if (!l->unix_path) {
            /* as gRPC's own listener does: small messages go out at once */
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        if (l->has_tls)
            l->tls.accept_cb(l->tls.arg, f, li, fd);
        else
            take(f, li, fd);
    }
}

/* 1: is HTTP/2 (gRPC), 0: is not, -1: cannot tell yet, -2: closed. */
static int sniff(conn *c)
{
    char buf[PREFACE_LEN];
    ssize_t n = recv(c->fd, buf, sizeof buf, MSG_PEEK);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return -2;
    if (n < 0)
        return -1;
    if (memcmp(buf, preface, (size_t)n) != 0)
        return 0;
    return (size_t)n == PREFACE_LEN ? 1 : -1;
}

static void answer_now(front *f, conn *c, int status, const char *why)
{
    (void)f;
    http_answer_error(&c->out, status, why);
    c->closing = 1;
}

/* Parses and answers every whole request in c->in. */
static void serve_input(front *f, conn *c)
{
    size_t off = 0;
    while (!c->closing && !c->pending && c->out.len - c->outoff < FRONT_OUT_HIGH) {
        http_request r;
        size_t used;
        int rc = http_parse(&r, &used, c->in + off, c->inlen - off, f->o.max_body);
        if (rc == HTTP_MORE)
            break;
        if (rc < 0) {
            answer_now(f, c, -rc, NULL);
            break;
        }
        off += used;
        if (r.minor >= 1 && !r.has_host) {
            /* etcd: Go's server */
            answer_now(f, c, 400, "missing required Host header");
            break;
        }
        int keep = r.keep_alive;
        if (f->serve(f->serve_arg, f->ls[c->listener].flags, &r, &c->out, c->id) == FRONT_PENDING) {
            c->pending = 1;
            c->closing_after = !keep;
            /* the pending call has its own deadline (the gateway's) */
            c->deadline_ms = INT64_MAX;
            break;
        }
        if (!keep)
            c->closing = 1;
        c->deadline_ms = now_ms() + f->o.idle_timeout_ms;
    }
    memmove(c->in, c->in + off, c->inlen - off);
    c->inlen -= off;
}

/* Reads what there is; 0, or -1 to close. */
static int http_read(front *f, conn *c)
{
    size_t limit = HTTP_MAX_HEAD + (size_t)f->o.max_body;
    int eof = 0;
    for (;;) {
        if (c->inlen == c->incap) {
            if (c->incap >= limit)
                break; /* the parser will say 413/431 */
            size_t cap = c->incap ? 2 * c->incap : 4096;
            if (cap > limit)
                cap = limit;
            uint8_t *in = realloc(c->in, cap);
            if (!in)
                return -1;
            c->in = in;
            c->incap = cap;
        }
        ssize_t n = recv(c->fd, c->in + c->inlen, c->incap - c->inlen, 0);
        if (n == 0) {
            /* the client is done sending: answer what came, then close */
            eof = 1;
            break;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return -1;
        }
        c->inlen += (size_t)n;
    }
    serve_input(f, c);
    if (eof) {
        if (c->pending)
            c->closing_after = 1;
        else if (c->outoff == c->out.len)
            return -1;
        else
            c->closing = 1;
    }
    return 0;
}

/* Writes what it can; 0, or -1 to close. */
static int http_write(conn *c)
{
    while (c->outoff < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->outoff, c->out.len - c->outoff, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        c->outoff += (size_t)n;
        if (c->flow && atomic_fetch_sub(&c->flow->unsent, (size_t)n) - (size_t)n < FRONT_FLOW_LOW)
            c->flow->wake_cb(c->flow);
    }
    c->out.len = c->outoff = 0;
    if (!c->closing)
        return 0;
    if (!c->lingering) {
        /* A close with unread bytes (a refused body still arriving) would
         * reset the connection and lose the answer: shut writing and drop
         * what comes for a moment instead, as web servers do. */
        shutdown(c->fd, SHUT_WR);
        c->lingering = 1;
        c->deadline_ms = now_ms() + FRONT_LINGER_MS;
    }
    return 0;
}

/* A lingering connection: 0, or -1 once the client closed too. */
static int linger_read(conn *c)
{
    char buf[16384];
    for (int n = 0; n < 64; n++) {
        ssize_t k = recv(c->fd, buf, sizeof buf, 0);
        if (k == 0)
            return -1;
        if (k < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    }
    return 0;
}

/* Handles readiness of conns[i]; 1 if it was removed. */
static int conn_event(front *f, size_t i, short rev)
{
    conn *c = f->conns[i];
    if (c->lingering) {
        if (linger_read(c) != 0 || (rev & (POLLERR | POLLHUP))) {
            conn_drop(f, i, 0);
            return 1;
        }
        return 0;
    }
    if (c->state == C_SNIFF) {
        int s = sniff(c);
        if (s == -1 && !(rev & (POLLHUP | POLLERR)))
            return 0;
        if (s == 1 && (f->ls[c->listener].flags & FRONT_GRPC)) {
            int fd = c->fd;
            conn_drop(f, i, 1);
            rpc_engine_adopt_fd(f->rpc, fd);
            return 1;
        }
        if (s != 0) {
            conn_drop(f, i, 0);
            return 1;
        }
        f->nsniff--;
        f->nhttp++;
        c->state = C_HTTP;
        if (f->nhttp > f->o.max_http_conns) {
            answer_now(f, c, 503, "too many HTTP connections");
            return http_write(c) < 0 ? (conn_drop(f, i, 0), 1) : 0;
        }
    }
    /* etcd (Go's server): a client that goes away cancels its stream */
    if (c->flow && (rev & (POLLRDHUP | POLLHUP | POLLERR))) {
        conn_drop(f, i, 0);
        return 1;
    }
    if ((rev & POLLIN) && !c->closing && !c->pending && c->out.len - c->outoff < FRONT_OUT_HIGH &&
        http_read(f, c) != 0) {
        conn_drop(f, i, 0);
        return 1;
    }
    if ((rev & (POLLERR | POLLHUP)) && !(rev & POLLIN)) {
        conn_drop(f, i, 0);
        return 1;
    }
    if (c->out.failed || http_write(c) != 0) {
        conn_drop(f, i, 0);
        return 1;
    }
    /* a request that waited behind a long answer */
    if (c->inlen > 0 && !c->closing && !c->pending && c->out.len == 0) {
        serve_input(f, c);
        if (c->out.failed || http_write(c) != 0) {
            conn_drop(f, i, 0);
            return 1;
        }
    }
    return 0;
}

/* The answers queued by front_send, in order (the caller frees the array). */
static completed *take_done(front *f, size_t *n)
{
    pthread_mutex_lock(&f->mu);
    completed *d = f->done;
    *n = f->ndone;
    f->done = NULL;
    f->ndone = f->capdone = 0;
    pthread_mutex_unlock(&f->mu);
    return d;
}

static void take_adopted(front *f)
{
    uint64_t v;
    (void)!read(f->wake, &v, sizeof v);
    pthread_mutex_lock(&f->mu);
    adopted *a = f->adopt;
    size_t n = f->nadopt;
    f->adopt = NULL;
    f->nadopt = f->capadopt = 0;
    pthread_mutex_unlock(&f->mu);
    for (size_t i = 0; i < n; i++)
        take(f, a[i].listener, a[i].fd);
    free(a);
    size_t nd;
    completed *d = take_done(f, &nd);
    for (size_t k = 0; k < nd; k++) {
        size_t i = 0;
        while (i < f->nconns && f->conns[i]->id != d[k].token)
            i++;
        if (i == f->nconns || !f->conns[i]->pending) {
            http_buf_free(&d[k].answer); /* its connection closed meanwhile */
            if (d[k].fl)
                flow_gone(d[k].fl);
            continue;
        }
        conn *c = f->conns[i];
        if (d[k].fl && !c->flow) {
            c->flow = d[k].fl;
            if (c->flow->close_at_end)
                c->closing_after = 1;
        } else if (d[k].fl)
            flow_gone(d[k].fl); /* one stream per request: not reached */
        http_buf_add(&c->out, d[k].answer.data, d[k].answer.len);
        if (d[k].answer.failed)
            c->out.failed = 1;
        http_buf_free(&d[k].answer);
        if (!d[k].last) {
            if (c->out.failed || http_write(c) != 0)
                conn_drop(f, i, 0);
            continue;
        }
        if (c->flow) {
            c->flow->release_cb(c->flow);
            c->flow = NULL;
        }
        c->pending = 0;
        c->closing = c->closing_after;
        c->deadline_ms = now_ms() + f->o.idle_timeout_ms;
        /* the next request may be waiting already */
        if (c->inlen > 0 && !c->closing)
            serve_input(f, c);
        if (c->out.failed || http_write(c) != 0)
            conn_drop(f, i, 0);
    }
    free(d);
}

void front_complete(front *f, uint64_t token, http_buf *answer)
{
    front_send(f, token, answer, 1, NULL);
}

void front_send(front *f, uint64_t token, http_buf *answer, int last, front_flow *fl)
{
    pthread_mutex_lock(&f->mu);
    if (atomic_load(&f->stopping)) {
        pthread_mutex_unlock(&f->mu);
        http_buf_free(answer);
        if (fl)
            flow_gone(fl);
        return;
    }
    if (f->ndone == f->capdone) {
        size_t cap = f->capdone ? 2 * f->capdone : 16;
        completed *d = realloc(f->done, cap * sizeof *d);
        if (!d) {
            pthread_mutex_unlock(&f->mu);
            http_buf_free(answer); /* the connection times out */
            if (fl)
                flow_gone(fl);
            return;
        }
        f->done = d;
        f->capdone = cap;
    }
    f->done[f->ndone].token = token;
    f->done[f->ndone].answer = *answer;
    f->done[f->ndone].last = last;
    f->done[f->ndone].fl = fl;
    f->ndone++;
    memset(answer, 0, sizeof *answer);
    pthread_mutex_unlock(&f->mu);
    uint64_t one = 1;
    (void)!write(f->wake, &one, sizeof one);
}

void front_adopt(front *f, int li, int fd)
{
    pthread_mutex_lock(&f->mu);
    if (atomic_load(&f->stopping) || li < 0 || li >= f->nls) {
        pthread_mutex_unlock(&f->mu);
        close(fd);
        return;
    }
    if (f->nadopt == f->capadopt) {
        size_t cap = f->capadopt ? 2 * f->capadopt : 16;
        adopted *a = realloc(f->adopt, cap * sizeof *a);
        if (!a) {
            pthread_mutex_unlock(&f->mu);
            close(fd);
            return;
        }
        f->adopt = a;
        f->capadopt = cap;
    }
    f->adopt[f->nadopt++] = (adopted){li, fd};
    pthread_mutex_unlock(&f->mu);
    uint64_t one = 1;
    (void)!write(f->wake, &one, sizeof one);
}

static void *front_main(void *arg)
{
    front *f = arg;
    struct pollfd *pfd = NULL;
    size_t cappfd = 0;
    while (!atomic_load(&f->stopping)) {
        size_t n = 1 + (size_t)f->nls + f->nconns;
        if (n > cappfd) {
            struct pollfd *p = realloc(pfd, n * sizeof *p);
            if (!p) {
                struct timespec ts = {0, 10000000};
                nanosleep(&ts, NULL);
                continue;
            }
            pfd = p;
            cappfd = n;
        }
        pfd[0] = (struct pollfd){f->wake, POLLIN, 0};
        int64_t now = now_ms(), next = now + 1000;
        int accepting = f->nsniff < FRONT_MAX_SNIFF && now >= f->accept_pause_until;
        if (!accepting && f->accept_pause_until > now && f->accept_pause_until < next)
            next = f->accept_pause_until;
        for (int i = 0; i < f->nls; i++)
            pfd[1 + i] = (struct pollfd){accepting ? f->ls[i].fd : -1, POLLIN, 0};
        size_t nc = f->nconns;
        for (size_t i = 0; i < nc; i++) {
            conn *c = f->conns[i];
            short ev = 0;
            if (c->state == C_SNIFF || c->lingering ||
                (!c->closing && !c->pending && c->out.len - c->outoff < FRONT_OUT_HIGH))
                ev |= POLLIN;
            if (c->outoff < c->out.len)
                ev |= POLLOUT;
            if (c->flow)
                ev |= POLLRDHUP;
            pfd[1 + f->nls + i] = (struct pollfd){c->fd, ev, 0};
            if (c->deadline_ms < next)
                next = c->deadline_ms;
        }
        int timeout = next > now ? (int)(next - now) : 0;
        int r = poll(pfd, 1 + (size_t)f->nls + nc, timeout);
        if (r < 0 && errno != EINTR)
            break;
        /* back to front: conn_drop moves the last connection into the
         * hole, and new connections are appended after |nc| */
        now = now_ms();
        for (size_t i = nc; i-- > 0;) {
            short rev = r > 0 ? pfd[1 + f->nls + i].revents : 0;
            if (rev && conn_event(f, i, rev))
                continue;
            if (f->conns[i]->deadline_ms <= now)
                conn_drop(f, i, 0);
        }
        /* after the loop: it may drop connections, which moves them */
        if (r > 0 && (pfd[0].revents & POLLIN))
            take_adopted(f);
        if (r > 0)
            for (int i = 0; i < f->nls; i++)
                if (pfd[1 + i].revents & POLLIN)
                    accept_all(f, i);
    }
    free(pfd);
    return NULL;
}

int front_start(front *f)
{
    if (pthread_create(&f->thread, NULL, front_main, f) != 0)
        return CAIRN_ENOMEM;
    f->running = 1;
    return 0;
}

void front_stop(front *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    atomic_store(&f->stopping, 1);
    pthread_mutex_unlock(&f->mu);
    if (f->running) {
        uint64_t one = 1;
        (void)!write(f->wake, &one, sizeof one);
        pthread_join(f->thread, NULL);
        f->running = 0;
    }
    while (f->nconns > 0)
        conn_drop(f, f->nconns - 1, 0);
    /* answers that came too late: their streams must hear of it now (the
     * gateway waits for them) */
    size_t nd;
    completed *d = take_done(f, &nd);
    for (size_t k = 0; k < nd; k++) {
        http_buf_free(&d[k].answer);
        if (d[k].fl)
            flow_gone(d[k].fl);
    }
    free(d);
    for (int i = 0; i < f->nls; i++)
        if (f->ls[i].fd >= 0) {
            close(f->ls[i].fd);
            f->ls[i].fd = -1;
        }
}

void front_free(front *f)
{
    if (!f)
        return;
    front_stop(f);
    for (size_t i = 0; i < f->nadopt; i++)
        close(f->adopt[i].fd);
    free(f->adopt);
    for (size_t i = 0; i < f->ndone; i++) {
        http_buf_free(&f->done[i].answer);
        if (f->done[i].fl)
            flow_gone(f->done[i].fl);
    }
    free(f->done);
    for (int i = 0; i < f->nls; i++) {
        if (f->ls[i].unix_path)
            unlink(f->ls[i].unix_path);
        free(f->ls[i].unix_path);
    }
    free(f->conns);
    if (f->wake >= 0)
        close(f->wake);
    pthread_mutex_destroy(&f->mu);
    free(f);
}
