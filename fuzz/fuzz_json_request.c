/*
 * The JSON gateway's request decoder (server/http/json.c): the first byte
 * picks the request message (Range, Put, DeleteRange, Txn, Compaction,
 * LeaseGrant, LeaseRevoke, LeaseTimeToLive, Alarm, then v3lock's Lock and
 * Unlock and v3election's Campaign, Proclaim, Leader and Resign: the
 * gateway's recipe paths, whose LeaderKey nests), the rest is the body a
 * client POSTs. Every input must give protobuf bytes that the message's
 * own descriptor unpacks, or CAIRN_EINVAL with a reason — never a crash,
 * a leak or unbounded recursion.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "crdt/error.h"
#include "etcdserverpb/rpc.pb-c.h"
#include "server/http/json.h"
#include "v3electionpb/v3election.pb-c.h"
#include "v3lockpb/v3lock.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const ProtobufCMessageDescriptor *const descs[] = {
        &etcdserverpb__range_request__descriptor,
        &etcdserverpb__put_request__descriptor,
        &etcdserverpb__delete_range_request__descriptor,
        &etcdserverpb__txn_request__descriptor,
        &etcdserverpb__compaction_request__descriptor,
        &etcdserverpb__lease_grant_request__descriptor,
        &etcdserverpb__lease_revoke_request__descriptor,
        &etcdserverpb__lease_time_to_live_request__descriptor,
        &etcdserverpb__alarm_request__descriptor,
        &v3lockpb__lock_request__descriptor,
        &v3lockpb__unlock_request__descriptor,
        &v3electionpb__campaign_request__descriptor,
        &v3electionpb__proclaim_request__descriptor,
        &v3electionpb__leader_request__descriptor,
        &v3electionpb__resign_request__descriptor,
    };
    if (size < 1)
        return 0;
    const ProtobufCMessageDescriptor *d = descs[data[0] % (sizeof descs / sizeof descs[0])];
    wire_wr w = {0};
    char err[256];
    int rc = pbjson_decode(&w, d, (const char *)data + 1, size - 1, err, sizeof err);
    if (rc == 0) {
        ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, w.len, w.p);
        if (!m)
            __builtin_trap(); /* what it encodes must decode */
        char *json = pbjson_encode(m);
        free(json);
        protobuf_c_message_free_unpacked(m, NULL);
    } else if (rc != CAIRN_EINVAL && rc != CAIRN_ENOMEM) {
        __builtin_trap();
    }
    free(w.p);
    return 0;
}
