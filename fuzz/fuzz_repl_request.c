/*
 * The Replication service's request decoding (server/cairn/replication.c):
 * the first byte picks the request (RevisionToHash, HashToRevision, Range,
 * ReplicationStatus, WaitReplicated), the rest is the message as a client
 * sends it. Every input must give 0 or a code of CAIRN_ERRORS — never a
 * crash, a leak, or an allocation beyond the heads' bound.
 */
#include <stddef.h>
#include <stdint.h>

#include "crdt/error.h"
#include "server/cairn/cairn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int rc = cairn_repl_decode_request(data[0] % 5, data + 1, size - 1);
    if (rc > 0 || (rc < 0 && cairn_error_grpc_status(rc) == 2))
        __builtin_trap(); /* every failure is a row of CAIRN_ERRORS */
    return 0;
}
