#ifndef CAIRN_SYNC_H
#define CAIRN_SYNC_H

/*
 * The sync protocol between two replicas, sans-I/O: it turns (document,
 * per-peer state, incoming bytes) into (changes to apply, outgoing bytes).
 * The session never applies anything: the caller owns the document. The
 * caller calls, per peer:
 *
 *   cairn_sync_generate()  whenever something may have changed (after a
 *                          receive, after local commits, on a timer); it says
 *                          "nothing to send" (*out == NULL) when the peer is
 *                          known to be up to date and nothing is in flight;
 *   cairn_sync_receive()   for every message from the peer: updates the
 *                          per-peer state and hands back the changes the
 *                          message carried;
 *   cairn_sync_applied()   after it applied those changes;
 *   cairn_sync_push()      optionally, to broadcast fresh local changes at
 *                          once (no filter computed);
 *   cairn_sync_tick()      optionally, on the caller's sync timer: holds
 *                          back relayed changes one period (full mesh);
 *   cairn_sync_reset()     when a message may have been lost (timer,
 *                          reconnect): forgets what is in flight, keeps the
 *                          shared heads. A new state (restart) also works.
 *                          The next message says so ("hello"), and the peer
 *                          then forgets what it had in flight to us too.
 *
 * THE DURABILITY CONTRACT. Everything the session tells the peer about us
 * — our heads, what we need, what we send — it reads from the document it
 * is given at that call; it keeps no copy of a received change and never
 * claims one on its own. So the caller keeps the peer from ever hearing
 * "I have it" before it is durable by this one rule: a change is applied to
 * the document (cairn_doc_receive) only after it is durable. Between
 * receive and applied the caller may generate or push freely: those speak
 * of what the document held, which is what is durable. A change the caller
 * drops (full disk, rejected) is simply not had: the peer is asked for it
 * again (need) or offers it again after a reset.
 *
 * A message carries the sender's heads, the hashes it knows it is missing
 * (need), optionally a Bloom filter of the sender's changes since a set of
 * base hashes both sides have, and changes (see the byte table in sync.c).
 * A replica answers with every change the filter says the peer lacks plus
 * all their descendants, in apply order; once the peer's heads are all
 * known, what it lacks is computed exactly and no filter is needed. False
 * positives surface as a missing dependency or an unknown head and are
 * asked for by hash in the next message. A filter answers for the heads
 * it came with only: once the peer names new heads without one, it is
 * dropped. Right after a message that carried changes, the next message
 * is heads only (an acknowledgement): the peer is sending, and the heads
 * it named but we lack are asked for (need, filter) one round later if
 * still missing. Two diverged replicas converge in
 * one round trip when each still knows the other's heads from the last sync,
 * else in two (the data arrives after one and a half; a fresh session over a
 * long history trades log-size history samples first, see sync.c).
 * Transitive: changes received from one peer are offered to the others.
 *
 * Messages from a peer are untrusted: decoding bounds every count and
 * length by cairn_sync_limits and the input length before allocating, and a
 * change's hash is always computed from its bytes.
 */

#include <stddef.h>
#include <stdint.h>

#include "crdt/bloom.h"
#include "crdt/change.h"
#include "crdt/doc.h"

#define CAIRN_SYNC_VERSION 2
/* Most hashes in a message's history sample (log2 of any history, +1). */
#define CAIRN_SYNC_MAX_SAMPLE 65u

typedef struct cairn_sync_limits {
    /* Hard caps: a message beyond them is never produced and is rejected
     * with CAIRN_ELIMIT on receipt. */
    size_t max_msg_bytes;    /* whole encoded message */
    uint32_t max_heads;      /* heads, and filter base hashes */
    uint32_t max_need;       /* need hashes */
    uint32_t max_changes;    /* changes in one message */
    size_t max_filter_bytes; /* Bloom filter bits / 8 */
    /* Generation only: stop adding changes once a message reaches this many
     * bytes (at least one change is sent if it fits max_msg_bytes); the rest
     * follow in later messages. */
    size_t target_msg_bytes;
    /* Filter shape for messages we generate. */
    uint32_t bloom_bits_per_entry;
    uint32_t bloom_probes;
    /* With no common base and more than this many changes, the first message
     * carries a history sample instead of a whole-history filter. */
    uint64_t sample_min_changes;
} cairn_sync_limits;

/* Defaults: 80 MiB / 4096 heads / 4096 need / 4096 changes / 4 MiB filter;
 * target 1 MiB; 10 bits per entry, 7 probes (~1% false positives); sample
 * above 512 changes. */
void cairn_sync_limits_default(cairn_sync_limits *l);

typedef struct cairn_sync_state cairn_sync_state;

/* Per-peer state. |limits| is copied; NULL means the defaults. Fails with
 * CAIRN_EINVAL on limits that make no sense (zero caps, bad bloom shape). */
int cairn_sync_state_new(cairn_sync_state **out, const cairn_sync_limits *limits);
void cairn_sync_state_free(cairn_sync_state *s);

/* Persisting a state across restarts: only the shared heads are kept (what
 * was in flight is meaningless after a restart). Encoding: byte 0x01, then
 * varint n (<= limits' max_heads) and n hashes strictly ascending; nothing
 * after. save: new buffer, caller frees. load: a new state with |limits|
 * (NULL = defaults); rejects bad bytes with ETRUNCATED, ELIMIT, ENONCANON,
 * EUNSORTED or EBADVERSION. */
int cairn_sync_state_save(uint8_t **out, size_t *len, const cairn_sync_state *s);
int cairn_sync_state_load(cairn_sync_state **out, const uint8_t *buf, size_t len,
                          const cairn_sync_limits *limits);

/* Forget everything in flight (changes sent but not acknowledged, what was
 * last sent), so that the next generate sends a full message again. Call it
 * when a message may have been lost. The shared heads are kept. */
void cairn_sync_reset(cairn_sync_state *s);

/* The caller's sync timer, called once per period before that period's
 * generate. From the first call on, a change of another author is sent to
 * this peer by generate only once it was held here at the tick before
 * last, and the peer has sent a message since that tick without showing it
 * and without naming new heads for a whole period (a peer whose heads move
 * is being fed, mostly by the author: so in a full mesh each change
 * reaches a peer from its author, and two members do not both relay it,
 * also after a reconnect); this node's own changes and changes the peer
 * asks for by hash are never held back. A held change costs a few periods
 * in a partial mesh, where the transport relays pushes anyway. Without
 * calls, nothing is held. */
void cairn_sync_tick(cairn_sync_state *s, const cairn_doc *doc);

/* The next message for the peer, in a new buffer (*out, caller frees), or
 * *out == NULL and *len == 0 when there is nothing to send. |salt| keys this
 * message's Bloom filter: pass fresh random bytes (randombytes_buf) for
 * every call; crdt/ has no randomness of its own. */
int cairn_sync_generate(uint8_t **out, size_t *len, const cairn_doc *doc, cairn_sync_state *s,
                        const uint8_t salt[CAIRN_BLOOM_SALT_LEN]);

/* Takes in a message from the peer. Decodes it completely first (a
 * malformed message changes nothing: ETRUNCATED, ELIMIT, ENONCANON,
 * EUNSORTED, EBADVERSION, or the change decoder's code), then updates |s|
 * with what the peer said and hands back the changes it carried: *changes
 * is a new array of *n decoded (hash-verified) changes, array and changes
 * owned by the caller (cairn_sync_changes_free frees what is left of it),
 * ordered so that each comes after the changes of the same message it
 * depends on. Nothing is applied: |doc| is only read. *changes is NULL and
 * *n 0 on failure or when the message carried none. */
int cairn_sync_receive(cairn_change ***changes, size_t *n, cairn_sync_state *s,
                       const cairn_doc *doc, const uint8_t *msg, size_t len);

/* Frees |changes| and the first |n| changes in it (NULL entries skipped). */
void cairn_sync_changes_free(cairn_change **changes, size_t n);

/* The caller has applied (some of) what receive handed back: the session
 * looks at |doc| again, so that the peer's heads and hashes it now has
 * become common ground (the base of later filters, what the peer is known
 * to hold). Optional for correctness — without it the session learns the
 * same at the next receive — but it saves a round of filters. ENOMEM. */
int cairn_sync_applied(cairn_sync_state *s, const cairn_doc *doc);

/* Optimistic push: a message carrying our heads and |changes| (changes of
 * |doc|, e.g. just committed, in apply order, with their canonical bytes:
 * those are what is sent; the doc does not read them back), without a
 * filter. Changes
 * already sent to this peer are skipped; at most the limits' worth are
 * included (*npushed says how many of |changes| were taken, the rest
 * follow through generate). *out is NULL when nothing was left to push. */
int cairn_sync_push(uint8_t **out, size_t *len, size_t *npushed, const cairn_doc *doc,
                    cairn_sync_state *s, const cairn_change *const *changes, size_t n);

/* cairn_sync_push with the heads to report given (sorted, unique; EINVAL
 * otherwise) instead of the document's: e.g. the last of |changes|, when
 * the caller knows those durable but not everything the document holds.
 * The heads a node reports must be durable there (the peer takes them as
 * acknowledged); reporting fewer than its heads only costs duplicates. */
int cairn_sync_push_heads(uint8_t **out, size_t *len, size_t *npushed, const cairn_doc *doc,
                          cairn_sync_state *s, const cairn_change *const *changes, size_t n,
                          const cairn_hash *heads, size_t nheads);

/* 1 if the last message received asks for an answer (it carried changes,
 * to be acknowledged, or need, a filter, a sample or a hello), or when the
 * session is not ticked (cairn_sync_tick): the caller may then skip the
 * immediate generate and leave the rest to its timer. */
int cairn_sync_wants_answer(const cairn_sync_state *s);

/* 1 if the peer has acknowledged change |h|: it is one of the peer's last
 * reported heads or an ancestor of them (or of our shared heads); 0
 * otherwise. This is the basis of replication status. */
int cairn_sync_peer_has(const cairn_sync_state *s, const cairn_doc *doc, const cairn_hash *h);

/* Replication lag: *nlag = the ordered changes of |doc| the peer has not
 * acknowledged (neither among nor ancestors of its last reported heads
 * and our shared heads), *first = the apply index of the first of them
 * (cairn_dag_count when none). CAIRN_ENOTFOUND before the peer's first
 * message (nothing is known of it), ENOMEM. Not const: it keeps a floor
 * that makes the next call cost only what came since (sync.c). */
int cairn_sync_lag(uint64_t *nlag, uint64_t *first, cairn_sync_state *s, const cairn_doc *doc);

/* The peer's last reported heads (borrowed, valid until the next receive
 * or reset); returns their count, 0 before the first message. */
size_t cairn_sync_their_heads(const cairn_sync_state *s, const cairn_hash **heads);

/* The heads we last had in common with the peer (borrowed, as above). */
size_t cairn_sync_shared_heads(const cairn_sync_state *s, const cairn_hash **heads);

/* ---- the message itself (for tests, fuzzing and tools) ------------------ */

typedef struct cairn_sync_msg {
    int hello; /* the sender's state for us is new or reset */
    size_t nheads;
    cairn_hash *heads; /* sorted ascending, unique */
    size_t nneed;
    cairn_hash *need; /* sorted ascending, unique */
    int has_sample;
    size_t nsample;
    cairn_hash *sample; /* some of the sender's changes; sorted, unique */
    int has_filter;
    size_t nsince;
    cairn_hash *since;  /* filter base: hashes both sides have; sorted, unique */
    cairn_bloom filter; /* the sender's changes that are not ancestors of |since| */
    size_t nchanges;
    cairn_change **changes;
} cairn_sync_msg;

/* Decodes and fully validates a message; *out owns copies of everything
 * (its changes are decoded, i.e. hash-computed and canonical). On failure
 * *out is zeroed. |limits| NULL = defaults. */
int cairn_sync_msg_decode(cairn_sync_msg *out, const uint8_t *buf, size_t len,
                          const cairn_sync_limits *limits);

/* Encodes |m| canonically (fields must be sorted and unique: CAIRN_EINVAL
 * otherwise) into a new buffer. Changes are taken from their ->bytes, and
 * their ->hash must be those bytes' id (a change that depends on the one
 * before it is sent without that dependency: sync.c). */
int cairn_sync_msg_encode(uint8_t **out, size_t *len, const cairn_sync_msg *m);

/* Frees what decode allocated (changes still in ->changes included; set an
 * entry to NULL to keep it). */
void cairn_sync_msg_destroy(cairn_sync_msg *m);

/* cairn_sync_receive in two steps, so that the costly one (decoding and
 * hashing every change, ordering them) needs neither the document nor a
 * lock on it: cairn_sync_receive_decode reads only |s|'s limits (fixed at
 * creation) and fills |m| (empty on failure), its changes ordered as
 * cairn_sync_receive orders them; cairn_sync_receive_msg does the rest and
 * takes what |m| owns (|m| is left empty, also on failure). */
int cairn_sync_receive_decode(cairn_sync_msg *m, const cairn_sync_state *s, const uint8_t *msg,
                              size_t len);
int cairn_sync_receive_msg(cairn_change ***changes, size_t *n, cairn_sync_state *s,
                           const cairn_doc *doc, cairn_sync_msg *m);

#endif
