#ifndef CAIRN_DOC_H
#define CAIRN_DOC_H

/*
 * The document: a tree of maps and lists, built by applying changes. A
 * cairn_doc owns the DAG of every change it has applied, so it is a whole
 * replica: local edits become a change (cairn_doc_commit), changes from peers
 * are received in any order (cairn_doc_receive), and two docs that received
 * the same set of changes have identical state and heads.
 *
 * Object ids returned by this API use the document's own interned actor
 * table (see cairn_opid in change.h); CAIRN_ROOT is the root map.
 *
 * Map keys are arbitrary bytes. A key's value is the set of its ops that
 * nothing overwrote; with several (concurrent writes) the greatest op id wins
 * and the rest are conflicts. Lists are RGA. Counters merge by adding.
 *
 * Op counters are a hybrid logical clock: a new change's start_op is
 * max(greatest counter seen + 1, now_ms).
 *
 * Performance: set/get of one key in a map of n keys is O(1) expected.
 *
 * Values returned by reads are borrowed: valid until the next write to, or
 * receive into, the document. The document keeps its own copy of every
 * bytes/str value it holds; nothing it serves points into a change body.
 *
 * Observer callbacks get the change being applied, borrowed for the call.
 */

#include <stddef.h>
#include <stdint.h>

#include "crdt/change.h"
#include "crdt/dag.h"

typedef struct cairn_doc cairn_doc;
typedef cairn_opid cairn_objid;

static const cairn_objid CAIRN_ROOT = {0, 0};

enum { CAIRN_OBJ_MAP = 1, CAIRN_OBJ_LIST = 2 };

typedef enum cairn_read_kind {
    CAIRN_READ_NONE = 0, /* absent / deleted */
    CAIRN_READ_SCALAR = 1,
    CAIRN_READ_MAP = 2,
    CAIRN_READ_LIST = 3
} cairn_read_kind;

typedef struct cairn_read {
    uint8_t kind;      /* cairn_read_kind */
    cairn_value value; /* SCALAR (a counter reads as its current total) */
    cairn_objid obj;   /* MAP / LIST: the object's id */
    cairn_opid id;     /* the winning op's id */
} cairn_read;

typedef enum cairn_patch_action {
    CAIRN_PATCH_PUT = 1,    /* map key: visible value new or changed */
    CAIRN_PATCH_DEL = 2,    /* map key: now absent */
    CAIRN_PATCH_INSERT = 3, /* list: element inserted at index */
    CAIRN_PATCH_SET = 4,    /* list: element at index changed */
    CAIRN_PATCH_REMOVE = 5, /* list: element at index removed */
    CAIRN_PATCH_INC = 6     /* counter changed (map key or list index) */
} cairn_patch_action;

/* Patches report changes of the visible winner only: PUT (maps) / SET
 * (lists) when the winning op id changes, DEL / REMOVE when nothing stays
 * visible, INSERT when a list element becomes visible (also a tombstone
 * revived by a concurrent set), INC when the winner is a counter whose total
 * changed. An op that loses to the current winner, or only removes a losing
 * conflict, reports nothing (nconflicts changed, the winner did not). Local
 * edits are reported at commit, in edit order, with the indexes each edit
 * saw. */
typedef struct cairn_patch {
    uint8_t action; /* cairn_patch_action */
    cairn_objid obj;
    const uint8_t *key; /* maps */
    size_t key_len;
    uint64_t index;      /* lists */
    cairn_read value;    /* PUT / INSERT / SET / INC: the new visible winner */
    uint32_t nconflicts; /* values now visible at this key, winner included */
} cairn_patch;

/* What applying changes did, reported as it happens. Any callback may be NULL.
 * change_cb(begin=1) precedes the patches of one change and change_cb(begin=0)
 * follows them, even when the change changed nothing visible. */
typedef struct cairn_doc_observer {
    void *arg;
    void (*change_cb)(void *arg, const cairn_change *c, uint64_t index, int begin);
    void (*patch_cb)(void *arg, const cairn_patch *p);
    /* cairn_doc_receive met a fork: |c| (borrowed, about to be rejected)
     * has the (actor, seq) of a change already applied here, whose hash is
     * *held (NULL when it cannot be found: the author's change held no op,
     * or its body did not load). May be NULL. */
    void (*fork_cb)(void *arg, const cairn_change *c, const cairn_hash *held);
} cairn_doc_observer;

int cairn_doc_new(cairn_doc **out, const cairn_actor *actor);
void cairn_doc_free(cairn_doc *doc);

/* The DAG of applied changes. Borrowed; do not add to it directly. */
const cairn_dag *cairn_doc_dag(const cairn_doc *doc);

/* Installs the DAG's body loader (cairn_dag_set_loader): applied changes'
 * bodies are then read back from storage when sync or cairn_doc_new_at need
 * them, instead of being kept in memory. Before the first change only
 * (CAIRN_ESTATE after). */
int cairn_doc_set_loader(cairn_doc *doc, cairn_dag_load_cb fn, void *arg);
const cairn_actor *cairn_doc_actor(const cairn_doc *doc);

/* ---- local edits -----------------------------------------------------
 * Edits between begin and commit form one change. Each edit is applied (and
 * visible to reads) at once; commit seals them into a change, rollback undoes
 * them all. A failing edit changes nothing. Only one pending change at a
 * time (CAIRN_ESTATE otherwise; also for edits outside begin/commit and on a
 * read-only doc). Errors: CAIRN_ENOOBJ unknown object; CAIRN_EINVAL wrong
 * object kind, bad value, insert index > length, increment of a non-counter;
 * CAIRN_ENOTFOUND delete/increment of an absent key, list index >= length.
 * A bytes/str value is copied; |key| is copied. */
int cairn_doc_begin(cairn_doc *doc, uint64_t now_ms);
int cairn_doc_put(cairn_doc *doc, cairn_objid obj, const uint8_t *key, size_t key_len,
                  const cairn_value *v);
int cairn_doc_put_object(cairn_doc *doc, cairn_objid *out, cairn_objid obj, const uint8_t *key,
                         size_t key_len, int kind /* CAIRN_OBJ_* */);
int cairn_doc_delete(cairn_doc *doc, cairn_objid obj, const uint8_t *key, size_t key_len);
int cairn_doc_increment(cairn_doc *doc, cairn_objid obj, const uint8_t *key, size_t key_len,
                        int64_t delta);
int cairn_doc_list_insert(cairn_doc *doc, cairn_objid obj, size_t index, const cairn_value *v);
int cairn_doc_list_insert_object(cairn_doc *doc, cairn_objid *out, cairn_objid obj, size_t index,
                                 int kind);
int cairn_doc_list_set(cairn_doc *doc, cairn_objid obj, size_t index, const cairn_value *v);
int cairn_doc_list_delete(cairn_doc *doc, cairn_objid obj, size_t index);
int cairn_doc_list_increment(cairn_doc *doc, cairn_objid obj, size_t index, int64_t delta);

/* Seals the pending edits into one change (deps = heads, next seq), orders
 * it in the DAG and reports it to |obs| (may be NULL) as if received. *out
 * is the change, or NULL when there were no edits (then nothing is
 * committed); borrowed, valid until the next begin, commit or receive on
 * this document (the DAG does not keep change bodies). On failure the
 * pending edits are rolled back. */
int cairn_doc_commit(cairn_doc *doc, const cairn_change **out, const cairn_doc_observer *obs);
void cairn_doc_rollback(cairn_doc *doc);

/* ---- changes from peers ------------------------------------------------
 * Takes ownership of |c| (decoded, so hash-verified). Buffers it if its
 * dependencies are missing; otherwise validates and applies it and then every
 * buffered change it unblocks, in order, reporting each to |obs|. A change
 * that is invalid against the document (unknown object, bad reference, wrong
 * seq) is rejected with nothing applied; the return code is the first such
 * error while valid ones still apply. CAIRN_ESTATE during a local edit.
 *
 * Whether a change is accepted depends only on the change and its causal
 * past (its deps and their ancestors), never on what else this replica
 * holds or in which order it came: every op it names — an object, a list
 * element, a predecessor — must be an op of one of its ancestors (or an
 * earlier op of its own), else CAIRN_ENOTPAST (after the existence checks,
 * so naming an op this replica has never seen stays ENOOBJ / ENOTFOUND: the
 * code may differ between replicas, the verdict "rejected" does not). An
 * honest change names only ops it has seen, so it always passes. So every
 * replica accepts or rejects a given change alike, and the state stays a
 * function of the set of accepted changes. A rejected change is not
 * ordered, and neither is anything that depends on it: its descendants
 * (among them every later change of its author, by the sequence rule) are
 * rejected with it, identically on every replica and in any arrival order
 * — those already pending at once, a later one when it is offered
 * (CAIRN_EPASTREFUSED) — and offering it again is dropped as known: the
 * DAG remembers the last CAIRN_DAG_MAX_REJECTED rejected hashes (dag.h
 * says what happens past them), so a peer that sends one again costs a
 * hash lookup, and sync never asks for it. Cost: nothing extra
 * when the change's deps are this replica's heads; otherwise about the
 * changes ordered here since it forked (see doc_receive.c).
 *
 * Not covered: two changes with one (actor, seq), a fork that only a buggy
 * or hostile author makes. The first to arrive stays; the other is
 * rejected with CAIRN_EFORK, reported to obs->fork_cb, and its descendants
 * are rejected here (CAIRN_EFORKPAST) — so two replicas that hold different forks never
 * accept each other's changes made after them (README, "What differs from
 * etcd"). */
int cairn_doc_receive(cairn_doc *doc, cairn_change *c, const cairn_doc_observer *obs);

/* Drops the received changes that have waited |max_age_ms| or more for
 * their dependencies (cairn_dag_expire: |now_ms| is the caller's clock;
 * each is received again when a peer sends it). Returns how many. */
size_t cairn_doc_expire_pending(cairn_doc *doc, uint64_t now_ms, uint64_t max_age_ms);

/* ---- reads ----------------------------------------------------------------
 * An absent map key reads as kind CAIRN_READ_NONE (rc 0); a list index out
 * of range is CAIRN_ENOTFOUND; an unknown object CAIRN_ENOOBJ; a map read on
 * a list (or the reverse) CAIRN_EINVAL. */
int cairn_doc_get(const cairn_doc *doc, cairn_read *out, cairn_objid obj, const uint8_t *key,
                  size_t key_len);
/* All visible values at a key, greatest op id first; *n = total (may exceed
 * cap). */
int cairn_doc_get_all(const cairn_doc *doc, cairn_read *out, size_t cap, size_t *n, cairn_objid obj,
                      const uint8_t *key, size_t key_len);
int cairn_doc_list_get(const cairn_doc *doc, cairn_read *out, cairn_objid obj, size_t index);
/* Visible keys of a map / elements of a list. */
int cairn_doc_length(const cairn_doc *doc, size_t *n, cairn_objid obj);

/* Calls |cb| for every visible key of map |obj| in unspecified order;
 * stops early if |cb| returns non-zero (that value is returned). */
typedef int (*cairn_doc_key_cb)(void *arg, const uint8_t *key, size_t key_len,
                                const cairn_read *value);
int cairn_doc_map_foreach(const cairn_doc *doc, cairn_objid obj, cairn_doc_key_cb cb, void *arg);

/* A canonical, deterministic serialisation of the whole visible state
 * (sorted keys, conflicts included, actor bytes instead of indices): two
 * docs with the same state give the same bytes. New buffer, caller frees. */
int cairn_doc_dump(uint8_t **out, size_t *len, const cairn_doc *doc);

/* A new read-only document holding exactly the state as of |heads| (replays
 * their ancestors: O(history)). */
int cairn_doc_new_at(cairn_doc **out, const cairn_doc *doc, const cairn_hash *heads, size_t nheads);

/* ---- checkpoints ----------------------------------------------------------
 * A checkpoint memoises a replica so that a restart need not replay every
 * change: load it, then receive only the changes ordered after it. It is a
 * cache; the changes stay the truth. Format: doc_ckpt.c (versioned).
 *
 * cairn_doc_checkpoint encodes the whole replica — the DAG's ordered changes
 * (hashes, dependency edges, per-actor sequence numbers, heads) and the
 * document's state (every object, key, value, op id, conflict, counter,
 * list element and tombstone, clock) — into one new malloc'd buffer (*out,
 * caller frees; *len bytes). Change bodies are not included (they stay with
 * the loader). Only valid with no open local transaction (CAIRN_ESTATE);
 * changes the DAG holds pending or ready are not included (the restored
 * replica has not seen them). A broken document returns its error. */
int cairn_doc_checkpoint(uint8_t **out, size_t *len, const cairn_doc *doc);

/* Builds a replica from a checkpoint, for local actor |actor| (which may
 * differ from the one that wrote it). The result is equal in every
 * observable way to the document the checkpoint came from: cairn_doc_dump,
 * heads, count, hash_at/deps_at, actor_seq, find, ancestors, the next local
 * op id and clock, and what later cairn_doc_receive / begin..commit do (op
 * ids handed out use this document's own actor indices). No loader is set:
 * the caller sets one with cairn_doc_set_loader (allowed on a restored
 * document); without one, bodies of the restored changes are
 * CAIRN_ENOTFOUND. |bytes| is borrowed for the call. Hostile bytes are
 * rejected with a specific code (CAIRN_ETRUNCATED, CAIRN_ELIMIT,
 * CAIRN_ENONCANON, CAIRN_EBADVERSION, CAIRN_EUNSORTED, CAIRN_EDUPLICATE,
 * CAIRN_ECORRUPT for references out of range), never a crash or an
 * allocation beyond a small multiple of |len|. *out is NULL on failure. */
int cairn_doc_from_checkpoint(cairn_doc **out, const uint8_t *bytes, size_t len,
                              const cairn_actor *actor);

/* Translate between document op ids and (counter, actor bytes). */
int cairn_doc_actor_of(const cairn_doc *doc, cairn_actor *out, cairn_opid id);

#endif
