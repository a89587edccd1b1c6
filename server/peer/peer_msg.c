/*
 * One message of a peer stream (peer_msg.h): protobuf-c decodes it, the
 * stream's state says which bodies may come, and the hello's own fields
 * are checked against this node before the owner sees it.
 */
#include "server/peer/peer_msg.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "crdt/change.h"
#include "crdt/error.h"

int peer_hello_check(const Cairnpb__Hello *h, const peer_self *self, char *why, size_t whylen)
{
    const char *name = h->name ? h->name : "?";
    if (h->protocol_version != PEER_PROTOCOL_VERSION) {
        snprintf(why, whylen, "peer protocol version %" PRIu32 ", this node speaks %u",
                 h->protocol_version, PEER_PROTOCOL_VERSION);
        return -1;
    }
    if (h->cluster_id != self->cluster_id) {
        snprintf(why, whylen,
                 "member %s is in cluster %016" PRIx64 ", this node in cluster %016" PRIx64, name,
                 h->cluster_id, self->cluster_id);
        return -1;
    }
    if (h->token_hash.len != 32 || memcmp(h->token_hash.data, self->token_hash, 32) != 0) {
        snprintf(why, whylen, "member %s has another --initial-cluster-token", name);
        return -1;
    }
    if (h->actor_id.len != CAIRN_ACTOR_LEN) {
        snprintf(why, whylen, "the hello's actor id is not 16 bytes");
        return -1;
    }
    return 0;
}

int peer_verdict_refuses(int rc)
{
    return rc < 0 && rc != CAIRN_EFORK && rc != CAIRN_EFORKPAST;
}

void peer_msg_dispatch(const uint8_t *buf, size_t len, int hello_in, const peer_self *self,
                       const peer_handlers *h)
{
    Cairnpb__PeerMessage *m = cairnpb__peer_message__unpack(NULL, len, buf);
    if (!m) {
        h->refuse(h->arg, "a peer message that does not decode");
        return;
    }
    char why[256];
    if (!hello_in) {
        if (m->body_case != CAIRNPB__PEER_MESSAGE__BODY_HELLO)
            h->refuse(h->arg, "the first message is not a hello");
        else if (peer_hello_check(m->hello, self, why, sizeof why))
            h->refuse(h->arg, why);
        else
            h->hello(h->arg, m->hello);
    } else if (m->body_case == CAIRNPB__PEER_MESSAGE__BODY_SYNC) {
        h->sync(h->arg, m->sync->msg.data, m->sync->msg.len);
    } else if (m->body_case == CAIRNPB__PEER_MESSAGE__BODY_MEMBERS) {
        h->members(h->arg, m->members);
    } else if (m->body_case == CAIRNPB__PEER_MESSAGE__BODY_GOODBYE) {
        h->goodbye(h->arg, m->goodbye->reason ? m->goodbye->reason : "");
    } else {
        h->reset(h->arg, "an unexpected peer message");
    }
    cairnpb__peer_message__free_unpacked(m, NULL);
}
