#ifndef CAIRN_SERVER_PEER_MSG_H
#define CAIRN_SERVER_PEER_MSG_H

/*
 * Internal to server/peer/: what one message of a peer stream means, with
 * no gRPC in sight (peer_msg.c). peer.c hands every received message here;
 * fuzz/fuzz_peer_msg.c drives the same code from the network side.
 */

#include <stddef.h>
#include <stdint.h>

#include "cairnpb/peer.pb-c.h"
#include "store/store.h"

/* proto/cairnpb/peer.proto's PeerVersion: the framing and crdt/sync's
 * CAIRN_SYNC_VERSION together. */
#define PEER_PROTOCOL_VERSION 2u

/* The words a Goodbye's reason holds when its sender refuses the stream
 * because it does not list the receiver in its --peer-links: the receiver
 * then dials it only at its longest backoff, and says so once. */
#define PEER_BYE_NOT_LINKED "not in my --peer-links"

/* How a Goodbye's reason starts when its sender refuses the receiver
 * (peer.c, REFUSALS): the receiver does not dial it again for a while. */
#define PEER_BYE_REFUSED "refused: "

/* 1 if a received change's verdict |rc| (cairn_doc_receive's code, < 0)
 * refuses the stream it came on: every verdict but a fork's (CAIRN_EFORK,
 * CAIRN_EFORKPAST), which an honest peer may relay, having taken the other
 * side first, and but this node's own limits (CAIRN_ELIMIT: the pending
 * buffer is full, which another peer's changes with made-up dependencies
 * can do; CAIRN_ENOMEM): those say nothing of the change, which was not
 * judged, is neither kept nor remembered, and comes again with a later
 * sync. 0 for rc >= 0. */
int peer_verdict_refuses(int rc);

/* This node, as a hello is checked against it. */
typedef struct peer_self {
    uint64_t cluster_id;
    const uint8_t *token_hash; /* 32 bytes */
} peer_self;

/* 0 if hello |h| may open a stream to |self| (protocol version, cluster id,
 * cluster token, a 16-byte actor id); else -1 and the reason, words for a
 * log line, in |why|. Whether its member id is another member's is the
 * caller's to check (it knows the members). */
int peer_hello_check(const Cairnpb__Hello *h, const peer_self *self, char *why, size_t whylen);

/* What a received message asks the stream's owner to do. Each call is
 * borrowed data, valid for the call. */
typedef struct peer_handlers {
    void *arg;
    /* A hello that passed peer_hello_check, first on its stream. */
    void (*hello)(void *arg, const Cairnpb__Hello *h);
    /* One crdt/sync message, after the hello. */
    void (*sync)(void *arg, const uint8_t *msg, size_t len);
    /* The members' client URLs as the peer knows them, after the hello. */
    void (*members)(void *arg, const Cairnpb__Members *ms);
    /* The peer ends the stream. */
    void (*goodbye)(void *arg, const char *reason);
    /* The peer broke the protocol: log |why| as a refusal, end the stream. */
    void (*refuse)(void *arg, const char *why);
    /* A well-formed message that has no business here: end the stream. */
    void (*reset)(void *arg, const char *why);
} peer_handlers;

/* Decodes one message (|len| bytes, hostile) of a stream whose peer has
 * (|hello_in|) or has not yet sent an accepted hello, and calls exactly one
 * handler: a message that does not decode or a first message that is not a
 * hello is refused, a hello that fails peer_hello_check is refused with its
 * reason, a second hello is reset. */
void peer_msg_dispatch(const uint8_t *buf, size_t len, int hello_in, const peer_self *self,
                       const peer_handlers *h);

/* ---- Join (cairnpb.Peer/Join) ------------------------------------------ */

/* What a member of a running cluster answered a joining node: the ids,
 * the member table (sorted by id, the joiner in it) and the answering
 * member's heads, which the joiner holds once it has caught up. Owned:
 * peer_join_destroy (zeroed: safe to destroy). */
typedef struct peer_join {
    uint64_t cluster_id, member_id;
    cairn_member_info *members;
    size_t nmembers;
    cairn_hash *heads;
    size_t nheads;
    char from[64]; /* the answering member's --initial-cluster name */
} peer_join;
void peer_join_destroy(peer_join *j);

/* Bounds on what a join carries: a request or answer longer than
 * PEER_JOIN_MAX_BYTES is refused unread. */
#define PEER_JOIN_MAX_BYTES (256u << 10)
#define PEER_JOIN_MAX_MEMBERS 64
#define PEER_JOIN_MAX_URLS 64
#define PEER_JOIN_MAX_URL_LEN 1024
#define PEER_JOIN_MAX_HEADS 4096

/* The answering node, as a join request is checked against it (borrowed). */
typedef struct peer_join_self {
    uint64_t cluster_id;
    const uint8_t *token_hash;        /* 32 bytes */
    const cairn_member_info *members; /* the member table, sorted by id */
    size_t nmembers;
    const cairn_hash *heads;
    size_t nheads;
} peer_join_self;

/* Answers JoinRequest |req| (|len| bytes, hostile). 0: *out is a packed
 * JoinResponse (malloc'd, caller frees) and *who the joiner's member id.
 * -1: refused, the reason in |why| (etcd 3.4's words where it has them:
 * "error validating peerURLs {...}: member count is unequal").
 * CAIRN_ENOMEM. */
int peer_join_answer(uint8_t **out, size_t *outlen, uint64_t *who, const uint8_t *req, size_t len,
                     const peer_join_self *self, char *why, size_t whylen);

/* Decodes JoinResponse |buf| (hostile) into |out| (zeroed first): 0, or -1
 * with the reason in |why| (does not decode, out of bounds, no member with
 * the answered id), or CAIRN_ENOMEM. */
int peer_join_decode(peer_join *out, const uint8_t *buf, size_t len, char *why, size_t whylen);

#endif
