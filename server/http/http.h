#ifndef CAIRN_SERVER_HTTP_H
#define CAIRN_SERVER_HTTP_H

/*
 * Internal to server/: HTTP/1.1 requests and answers as bytes (http.c), no
 * I/O, so that the parser can be fuzzed (fuzz/fuzz_http_request.c). The
 * front listener (front.c) owns the sockets; serve.c answers the requests.
 *
 * The parser is strict and bounded: a request line and headers of at most
 * HTTP_MAX_HEAD bytes and HTTP_MAX_HEADERS fields, a body only by
 * Content-Length (no chunked uploads: etcd's clients send none), of at most
 * the caller's cap (--max-request-bytes).
 */

#include <stddef.h>
#include <stdint.h>

#define HTTP_MAX_HEAD (16 * 1024)
#define HTTP_MAX_HEADERS 64

/* One request; every pointer is into the buffer given to http_parse
 * (borrowed, valid while that buffer is). Strings are not NUL-terminated. */
typedef struct http_request {
    const char *method;
    size_t method_len;
    const char *path; /* the target up to '?' */
    size_t path_len;
    const char *query; /* after '?', or NULL */
    size_t query_len;
    int minor;      /* HTTP/1.<minor> */
    int has_host;   /* a Host header was sent */
    int keep_alive; /* the connection stays open after the answer */
    const char *content_type;
    size_t content_type_len;
    const char *grpc_timeout; /* the first Grpc-Timeout header's value, or NULL */
    size_t grpc_timeout_len;
    const uint8_t *body;
    size_t body_len;
} http_request;

/* http_parse's answers besides 0 (a whole request) */
enum { HTTP_MORE = 1 };

/* Parses one request from the |len| bytes at |buf|. Returns 0 with |*used|
 * (the request's bytes, head and body) set, HTTP_MORE if the request is not
 * whole yet, or minus the HTTP status to answer before closing: -400
 * (malformed), -413 (body over |max_body|), -431 (head too big), -501
 * (Transfer-Encoding), -505 (not HTTP/1.x). */
int http_parse(http_request *r, size_t *used, const uint8_t *buf, size_t len, uint64_t max_body);

/* 1 if |r|'s method is |m| / its path is |p| (NUL-terminated). */
int http_method_is(const http_request *r, const char *m);
int http_path_is(const http_request *r, const char *p);

/* A growing byte buffer (an answer being built). */
typedef struct http_buf {
    char *data;
    size_t len, cap;
    int failed; /* an allocation failed: the contents are incomplete */
} http_buf;

void http_buf_add(http_buf *b, const void *p, size_t n);
void http_buf_printf(http_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void http_buf_free(http_buf *b);

/* The reason phrase for |status| ("Not Found"). */
const char *http_reason(int status);

/* Appends a whole answer: status line, etcd's CORS headers, Date, the
 * |ctype| Content-Type, |extra| (whole "Name: value\r\n" lines, or NULL),
 * Content-Length and |body|. |close| adds "Connection: close". */
void http_answer(http_buf *out, int minor, int status, const char *ctype, const char *extra,
                 const void *body, size_t len, int close);
/* A streaming answer: the head of http_answer with "Transfer-Encoding:
 * chunked" for Content-Length (HTTP/1.0: neither, and the connection
 * closes after it), then http_chunk for each part (framed as a chunk;
 * empty parts are skipped) and http_chunk_end once. */
void http_stream_head(http_buf *out, int minor, int status, const char *ctype, const char *extra,
                      int close);
void http_chunk(http_buf *out, int minor, const void *data, size_t len);
void http_chunk_end(http_buf *out, int minor);
/* Go's net/http answer to a request it could not parse: "400 Bad
 * Request" in plain text, then close. */
void http_answer_error(http_buf *out, int status, const char *why);

#endif
