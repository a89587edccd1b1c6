/*
 * The HTTP/1.1 request parser of the client URLs (server/http/http.c): the
 * input is bytes as a client sends them on one connection, parsed request
 * after request (pipelining) with a small body cap. Every input must end
 * in "need more" or an HTTP status, with every pointer inside the input —
 * never a crash or a read past it.
 */
#include <stddef.h>
#include <stdint.h>

#include "server/http/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    for (int n = 0; n < 64; n++) {
        http_request r;
        size_t used;
        int rc = http_parse(&r, &used, data + off, size - off, 4096);
        if (rc == HTTP_MORE)
            break;
        if (rc < 0) {
            if (rc != -400 && rc != -413 && rc != -431 && rc != -501 && rc != -505)
                __builtin_trap();
            break;
        }
        const uint8_t *lo = data + off, *hi = data + off + used;
        if (rc != 0 || used == 0 || used > size - off || r.path_len == 0 || r.path[0] != '/' ||
            (const uint8_t *)r.path < lo || (const uint8_t *)r.path + r.path_len > hi ||
            r.body < lo || r.body + r.body_len != hi || r.body_len > 4096)
            __builtin_trap();
        off += used;
    }
    return 0;
}
