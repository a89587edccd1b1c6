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

#define PEER_PROTOCOL_VERSION 1u

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
 * side first. 0 for rc >= 0. */
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

#endif
