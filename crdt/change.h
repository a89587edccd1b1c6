#ifndef CAIRN_CHANGE_H
#define CAIRN_CHANGE_H

/*
 * A change: the unit of replication and of atomicity. One client write (a
 * Put, a DeleteRange, a whole Txn, a lease grant) is exactly one change.
 *
 * A change's id is BLAKE2b-256 of its one canonical encoding; since the
 * dependencies (hashes) are inside the hashed bytes, changes form a Merkle DAG.
 *
 * Op ids. Every op has an id (counter, actor). The ops of one change are
 * numbered start_op, start_op+1, ... in order, all by the change's author, so
 * an op's own id is implicit. References to other ops (the object an op acts
 * on, the list element it follows or targets, the ops it overwrites) name
 * their actor by index into the change's actor table: index 0 is always the
 * author, the others are sorted ascending by bytes and unique. Op ids order
 * by counter, then by actor bytes; the greatest wins a concurrent map write.
 *
 * The root object has id (0, _) — counter 0 never names an op. The head of a
 * list (the position before its first element) is likewise elem (0, _).
 * An id with counter 0 must have actor 0 (encode checks).
 *
 * Map or list: an op addresses a list element iff insert != 0 or
 * elem.counter != 0; otherwise it addresses map key |key| (then elem must be
 * {0, 0}; a list op has key_len 0). A change may refer to its own ops only
 * backwards: an id (counter, author) used by op i needs counter <
 * start_op + i. Inserts have no preds; DEL and INC never insert. Ops other
 * than SET and INC leave |value| zeroed (type CAIRN_V_NULL).
 *
 * ENCODING (byte by byte): see the table in change.c's header comment, which
 * is the normative description; cairn_change_decode accepts exactly the
 * output of cairn_change_encode and nothing else.
 */

#include <stddef.h>
#include <stdint.h>

#define CAIRN_ACTOR_LEN 16
#define CAIRN_HASH_LEN 32

/* Hostile-input limits: a decoder never allocates beyond what these and the
 * input length justify. */
#define CAIRN_CHANGE_MAX_BYTES (64u << 20)
#define CAIRN_CHANGE_MAX_DEPS 1024u
#define CAIRN_CHANGE_MAX_ACTORS 1024u
#define CAIRN_CHANGE_MAX_PRED 1024u

typedef struct cairn_actor {
    uint8_t b[CAIRN_ACTOR_LEN];
} cairn_actor;

typedef struct cairn_hash {
    uint8_t b[CAIRN_HASH_LEN];
} cairn_hash;

/* An op id. |actor| indexes an actor table whose meaning depends on where the
 * id lives: the change's |actors| inside a cairn_change, the document's
 * interned table in the cairn_doc API. counter == 0 means root / list head. */
typedef struct cairn_opid {
    uint64_t counter;
    uint32_t actor;
} cairn_opid;

typedef enum cairn_vtype {
    CAIRN_V_NULL = 0,
    CAIRN_V_BOOL = 1,
    CAIRN_V_INT = 2,   /* int64 */
    CAIRN_V_UINT = 3,  /* uint64 */
    CAIRN_V_F64 = 4,
    CAIRN_V_BYTES = 5, /* arbitrary bytes */
    CAIRN_V_STR = 6,   /* UTF-8 text (not validated by the CRDT) */
    CAIRN_V_COUNTER = 7 /* int64 that merges by adding increments */
} cairn_vtype;

/* A scalar. bytes/str point into memory owned by whoever holds the value
 * (a decoded change owns its buffers; the doc owns what it returns). */
typedef struct cairn_value {
    uint8_t type; /* cairn_vtype */
    union {
        int b;
        int64_t i;
        uint64_t u;
        double f;
        struct {
            const uint8_t *ptr;
            size_t len;
        } bytes;
    } v;
} cairn_value;

typedef enum cairn_action {
    CAIRN_OP_MAKE_MAP = 1,  /* create a map at obj[key] (or a new list element) */
    CAIRN_OP_MAKE_LIST = 2, /* create a list at obj[key] (or a new list element) */
    CAIRN_OP_SET = 3,       /* set obj[key] (or a new list element) to value */
    CAIRN_OP_DEL = 4,       /* delete obj[key] or list element elem */
    CAIRN_OP_INC = 5        /* add value.v.i to the counter at obj[key] / elem */
} cairn_action;

typedef struct cairn_op {
    uint8_t action; /* cairn_action */
    uint8_t insert; /* lists: 1 = a new element after |elem|; 0 = acts on |elem| */
    cairn_opid obj; /* the container: a map or list object id, or root */
    /* Maps: key bytes (may be empty, may contain NUL). Lists: unused. */
    const uint8_t *key;
    uint32_t key_len;
    cairn_opid elem;   /* lists: element id (insert: the one to follow; 0 = head) */
    cairn_value value; /* SET: the scalar; INC: the delta (CAIRN_V_INT) */
    uint32_t npred;
    cairn_opid *pred; /* ops this op overwrites; sorted ascending, unique */
} cairn_op;

typedef struct cairn_change {
    cairn_actor actor; /* author; equal to actors[0] */
    uint64_t seq;      /* per-actor sequence number, starts at 1 */
    uint64_t start_op; /* counter of the first op (>= 1) */
    uint64_t time_ms;  /* wall clock of the author, informational */
    uint32_t ndeps;
    cairn_hash *deps; /* sorted ascending by bytes, unique */
    uint32_t nactors;
    cairn_actor *actors; /* [0] = author, then sorted ascending, unique */
    uint32_t nops;
    cairn_op *ops;
    /* Set by encode/decode: the canonical bytes and their BLAKE2b-256. */
    cairn_hash hash;
    uint8_t *bytes;
    size_t len;
    /* Private: one allocation holds everything a decoded change points at. */
    void *arena_;
} cairn_change;

/* Encodes |c| canonically into c->bytes / c->len (owned by |c|, replacing any
 * previous encoding) and sets c->hash. A change built by the caller (arena_
 * NULL) must start with bytes NULL; its bytes are then freed by
 * cairn_change_free or by the caller with free(). Too large: CAIRN_ELIMIT. Fails with CAIRN_EINVAL if |c| is not
 * canonical (unsorted deps/actors/preds, actor[0] != author, seq == 0,
 * start_op == 0, an op shape that the decoder would reject). */
int cairn_change_encode(cairn_change *c);

/* Decodes |len| bytes into a new change that owns a copy of them. Verifies
 * canonical form; if |expect| is not NULL, the computed hash must equal it
 * (CAIRN_EBADHASH otherwise). On failure *out is NULL and the return code says
 * why (ETRUNCATED, ELIMIT, ENONCANON, EBADVERSION, EUNSORTED, EBADOP, ...). */
int cairn_change_decode(cairn_change **out, const uint8_t *buf, size_t len,
                        const cairn_hash *expect);

/* Builds a change by deep-copying |tmpl| (its pointers are borrowed only for
 * the call), then encodes it. The result owns all its memory (one
 * allocation). |tmpl|'s hash, bytes, len and arena_ are ignored. */
int cairn_change_new(cairn_change **out, const cairn_change *tmpl);

void cairn_change_free(cairn_change *c);

/* BLAKE2b-256 of |len| bytes. */
void cairn_hash_bytes(cairn_hash *out, const uint8_t *buf, size_t len);

int cairn_hash_cmp(const cairn_hash *a, const cairn_hash *b);
int cairn_actor_cmp(const cairn_actor *a, const cairn_actor *b);

/* Lowercase hex of a hash into |out| (65 bytes incl. NUL). */
void cairn_hash_hex(char out[2 * CAIRN_HASH_LEN + 1], const cairn_hash *h);

#endif
