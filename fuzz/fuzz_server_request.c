/*
 * The server's request decoding: the first byte picks the request kind
 * (Range, Put, DeleteRange, Txn, Compaction, WatchRequest, LeaseKeepAlive),
 * the rest is the message as a client would send it. Every input must give
 * 0 or an error code — never a crash, a leak, or deep recursion (a Txn is
 * depth-scanned before protobuf-c unpacks it).
 */
#include <stddef.h>
#include <stdint.h>

#include "crdt/error.h"
#include "server/etcd/etcd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int rc = etcd_decode_request(data[0] % 7, data + 1, size - 1, 128);
    if (rc > 0 || (rc < 0 && cairn_error_grpc_status(rc) == 2))
        __builtin_trap(); /* every failure is a row of CAIRN_ERRORS */
    return 0;
}
