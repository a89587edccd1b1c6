/*
 * The JSON gateway's stream body decoder (pbjson_decode_next in
 * server/http/json.c): the first byte picks the request message
 * (WatchRequest, LeaseKeepAliveRequest), the rest is the body a client
 * POSTs to /v3/watch or /v3/lease/keepalive, read as etcd's gateway reads
 * it: one JSON value after another. Each value must give protobuf bytes
 * its descriptor unpacks, or CAIRN_EINVAL; each step must consume bytes
 * and stay inside the body; the end is PBJSON_END. Never a crash, a leak
 * or a loop that makes no progress.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "crdt/error.h"
#include "etcdserverpb/rpc.pb-c.h"
#include "server/http/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const ProtobufCMessageDescriptor *const descs[] = {
        &etcdserverpb__watch_request__descriptor,
        &etcdserverpb__lease_keep_alive_request__descriptor,
    };
    if (size < 1)
        return 0;
    const ProtobufCMessageDescriptor *d = descs[data[0] % (sizeof descs / sizeof descs[0])];
    const char *p = (const char *)data + 1;
    size_t left = size - 1;
    for (;;) {
        wire_wr w = {0};
        char err[256];
        size_t used;
        int rc = pbjson_decode_next(&w, &used, d, p, left, err, sizeof err);
        if (rc == 0) {
            ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, w.len, w.p);
            if (!m || used == 0 || used > left)
                __builtin_trap(); /* what it encodes must decode; progress */
            protobuf_c_message_free_unpacked(m, NULL);
            p += used;
            left -= used;
        } else if (rc != PBJSON_END && rc != CAIRN_EINVAL && rc != CAIRN_ENOMEM) {
            __builtin_trap();
        }
        free(w.p);
        if (rc != 0)
            break;
    }
    return 0;
}
