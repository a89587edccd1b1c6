/*
 * HTTP/1.1 requests parsed from bytes, answers written to bytes (http.h).
 *
 * The parser works on whatever has arrived: it looks for the end of the
 * head (a blank line), checks the request line and every header field
 * against RFC 9112's grammar, and only then waits for the body that
 * Content-Length announced. Anything it does not accept is an HTTP status
 * to answer before closing, never a guess: a bare LF ends a line as Go's
 * net/http allows (etcd's server), but folded lines, a Content-Length that
 * is not digits or disagrees with itself, and Transfer-Encoding (a chunked
 * upload, or request smuggling) are refused. Nothing is allocated.
 */
#include "server/http/http.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* RFC 9110's tchar */
static int is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int ieq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    if (alen != blen)
        return 0;
    for (size_t i = 0; i < alen; i++) {
        unsigned char x = (unsigned char)a[i], y = (unsigned char)b[i];
        if (x >= 'A' && x <= 'Z')
            x = (unsigned char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z')
            y = (unsigned char)(y - 'A' + 'a');
        if (x != y)
            return 0;
    }
    return 1;
}

/* Does the comma-separated list |v| hold the token |tok| (any case)? */
static int has_token(const char *v, size_t len, const char *tok)
{
    size_t i = 0;
    while (i < len) {
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t s = i;
        while (i < len && v[i] != ',')
            i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e > s && ieq(v + s, e - s, tok))
            return 1;
    }
    return 0;
}

/* The end of the line starting at |p| (before CRLF or LF), and |*next|
 * after it; NULL if no line end is in [p, end). */
static const char *line_end(const char *p, const char *end, const char **next)
{
    const char *lf = memchr(p, '\n', (size_t)(end - p));
    if (!lf)
        return NULL;
    *next = lf + 1;
    return lf > p && lf[-1] == '\r' ? lf - 1 : lf;
}

static int parse_request_line(http_request *r, const char *p, const char *e)
{
    const char *s = p;
    while (p < e && is_tchar((unsigned char)*p))
        p++;
    if (p == s || p == e || *p != ' ')
        return -400;
    r->method = s;
    r->method_len = (size_t)(p - s);
    s = ++p;
    while (p < e && (unsigned char)*p > ' ' && (unsigned char)*p < 0x7f)
        p++;
    if (p == s || p == e || *p != ' ' || *s != '/')
        return -400;
    const char *q = memchr(s, '?', (size_t)(p - s));
    r->path = s;
    r->path_len = (size_t)((q ? q : p) - s);
    r->query = q ? q + 1 : NULL;
    r->query_len = q ? (size_t)(p - q - 1) : 0;
    p++;
    if (e - p != 8 || memcmp(p, "HTTP/", 5) != 0 || p[6] != '.' || p[5] < '0' || p[5] > '9' ||
        p[7] < '0' || p[7] > '9')
        return -400;
    if (p[5] != '1')
        return -505;
    r->minor = p[7] - '0';
    return 0;
}

int http_parse(http_request *r, size_t *used, const uint8_t *buf, size_t len, uint64_t max_body)
{
    memset(r, 0, sizeof *r);
    *used = 0;
    const char *p = (const char *)buf, *end = p + len;
    /* etcd: Go's server skips blank lines before a request line */
    while (p < end && (*p == '\r' || *p == '\n'))
        p++;
    const char *head_end = NULL;
    for (const char *x = p; x < end;) {
        const char *lf = memchr(x, '\n', (size_t)(end - x));
        if (!lf)
            break;
        if (lf + 1 < end && lf[1] == '\n') {
            head_end = lf + 2;
            break;
        }
        if (lf + 2 < end && lf[1] == '\r' && lf[2] == '\n') {
            head_end = lf + 3;
            break;
        }
        x = lf + 1;
    }
    if (!head_end) {
        if (len >= HTTP_MAX_HEAD)
            return -431;
        /* a request line already broken need not wait for its end */
        for (const char *x = p; x < end && *x != ' ' && *x != '\r' && *x != '\n'; x++)
            if (!is_tchar((unsigned char)*x))
                return -400;
        return HTTP_MORE;
    }
    if ((size_t)(head_end - (const char *)buf) > HTTP_MAX_HEAD)
        return -431;

    const char *next;
    const char *e = line_end(p, head_end, &next);
    int rc = parse_request_line(r, p, e);
    if (rc != 0)
        return rc;
    r->keep_alive = r->minor >= 1;
    int64_t clen = -1;
    int nfields = 0;
    for (p = next; p < head_end;) {
        e = line_end(p, head_end, &next);
        if (e == p)
            break; /* the blank line */
        if (++nfields > HTTP_MAX_HEADERS)
            return -431;
        const char *n = p;
        while (p < e && is_tchar((unsigned char)*p))
            p++;
        if (p == n || p == e || *p != ':')
            return -400; /* no name, a space before ':', or a folded line */
        size_t nlen = (size_t)(p - n);
        p++;
        while (p < e && (*p == ' ' || *p == '\t'))
            p++;
        const char *v = p, *ve = e;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        for (const char *x = v; x < ve; x++)
            if ((unsigned char)*x < ' ' && *x != '\t')
                return -400;
        size_t vlen = (size_t)(ve - v);
        if (ieq(n, nlen, "content-length")) {
            if (vlen == 0 || vlen > 18)
                return -400;
            int64_t x = 0;
            for (size_t i = 0; i < vlen; i++) {
                if (v[i] < '0' || v[i] > '9')
                    return -400;
                x = x * 10 + (v[i] - '0');
            }
            if (clen >= 0 && clen != x)
                return -400;
            clen = x;
        } else if (ieq(n, nlen, "transfer-encoding")) {
            return -501;
        } else if (ieq(n, nlen, "host")) {
            r->has_host = 1;
        } else if (ieq(n, nlen, "connection")) {
            if (has_token(v, vlen, "close"))
                r->keep_alive = 0;
            else if (has_token(v, vlen, "keep-alive"))
                r->keep_alive = 1;
        } else if (ieq(n, nlen, "content-type")) {
            r->content_type = v;
            r->content_type_len = vlen;
        } else if (ieq(n, nlen, "grpc-timeout") && !r->grpc_timeout) {
            r->grpc_timeout = v; /* Go's Header.Get: the first */
            r->grpc_timeout_len = vlen;
        }
        p = next;
    }
    if (clen < 0)
        clen = 0;
    if ((uint64_t)clen > max_body)
        return -413;
    size_t head = (size_t)(head_end - (const char *)buf);
    if (len - head < (size_t)clen)
        return HTTP_MORE;
    r->body = (const uint8_t *)head_end;
    r->body_len = (size_t)clen;
    *used = head + (size_t)clen;
    return 0;
}

int http_method_is(const http_request *r, const char *m)
{
    return r->method_len == strlen(m) && memcmp(r->method, m, r->method_len) == 0;
}

int http_path_is(const http_request *r, const char *p)
{
    return r->path_len == strlen(p) && memcmp(r->path, p, r->path_len) == 0;
}

/* ---- answers ------------------------------------------------------------- */

static int buf_reserve(http_buf *b, size_t n)
{
    if (b->failed)
        return -1;
    if (b->len + n + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = 1;
        return -1;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

void http_buf_add(http_buf *b, const void *p, size_t n)
{
    if (n == 0 || buf_reserve(b, n) != 0)
        return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void http_buf_printf(http_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        http_buf_add(b, small, (size_t)n);
        return;
    }
    if (buf_reserve(b, (size_t)n) != 0)
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void http_buf_free(http_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

const char *http_reason(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 412:
        return "Precondition Failed";
    case 413:
        return "Request Entity Too Large";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Unknown";
    }
}

/* The status line and headers; |len| is the Content-Length, or SIZE_MAX
 * for a chunked answer (none on HTTP/1.0, which the close delimits). */
static void head(http_buf *out, int minor, int status, const char *ctype, const char *extra,
                 size_t len, int close)
{
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    char length[48] = "";
    if (len != SIZE_MAX)
        snprintf(length, sizeof length, "Content-Length: %zu\r\n", len);
    /* etcd: every answer on the client URL passes its CORS handler; Go
     * puts Transfer-Encoding last, and closes an HTTP/1.0 connection
     * without saying so */
    http_buf_printf(out,
                    "HTTP/1.%d %d %s\r\n"
                    "Access-Control-Allow-Headers: accept, content-type, authorization\r\n"
                    "Access-Control-Allow-Methods: POST, GET, OPTIONS, PUT, DELETE\r\n"
                    "Access-Control-Allow-Origin: *\r\n"
                    "Content-Type: %s\r\n%sDate: %s\r\n%s%s%s\r\n",
                    minor, status, http_reason(status), ctype, extra ? extra : "", date, length,
                    close && minor >= 1 ? "Connection: close\r\n" : "",
                    len == SIZE_MAX && minor >= 1 ? "Transfer-Encoding: chunked\r\n" : "");
}

void http_answer(http_buf *out, int minor, int status, const char *ctype, const char *extra,
                 const void *body, size_t len, int close)
{
    head(out, minor, status, ctype, extra, len, close);
    http_buf_add(out, body, len);
}

void http_stream_head(http_buf *out, int minor, int status, const char *ctype, const char *extra,
                      int close)
{
    head(out, minor, status, ctype, extra, SIZE_MAX, close || minor < 1);
}

void http_chunk(http_buf *out, int minor, const void *data, size_t len)
{
    if (len == 0)
        return; /* a zero-length chunk would end the answer */
    if (minor >= 1)
        http_buf_printf(out, "%zx\r\n", len);
    http_buf_add(out, data, len);
    if (minor >= 1)
        http_buf_add(out, "\r\n", 2);
}

void http_chunk_end(http_buf *out, int minor)
{
    if (minor >= 1)
        http_buf_add(out, "0\r\n\r\n", 5);
}

void http_answer_error(http_buf *out, int status, const char *why)
{
    /* etcd: Go's server writes the reason into the status line and the
     * body alike, and no Content-Length (it closes) */
    char text[160];
    snprintf(text, sizeof text, "%d %s%s%s", status, http_reason(status), why ? ": " : "",
             why ? why : "");
    http_buf_printf(out,
                    "HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                    "Connection: close\r\n\r\n%s",
                    text, text);
}
