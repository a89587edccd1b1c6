#ifndef CAIRN_DAG_H
#define CAIRN_DAG_H

/*
 * The hash DAG of changes. Changes arrive in any order; one whose
 * dependencies are not all present waits in a pending buffer. A change whose
 * dependencies are all *ordered* becomes ready; the caller (the document)
 * validates it and then either orders it — appends it to the apply order, a
 * topological order of the DAG that is this node's local apply order — or
 * discards it. Every prefix of the apply order is causally complete.
 *
 * Indices: the i-th change of the apply order has index i (0-based); indices
 * never change once given.
 *
 * Bodies. The DAG keeps, per ordered change, only its hash, its deps (as
 * indices) and the bookkeeping of heads and authors — not the change. Bodies
 * come back through cairn_dag_load*: from a loader the owner installs
 * (storage that already holds every ordered change), or, with no loader,
 * from the canonical bytes the DAG keeps itself (in-memory replicas). A body
 * read back must hash to its id: anything else is CAIRN_ECORRUPT, never
 * handed out. Pending and ready changes keep their decoded bodies.
 *
 * Sequence rule (checked in cairn_dag_order): a change with seq n > 1 must
 * have the author's change n-1 among its ancestors, and no other change with
 * the same (actor, seq) may be known (CAIRN_ESEQGAP / CAIRN_EFORK).
 *
 * Threads: a DAG has no lock. Callers serialise every call, the const ones
 * included (cairn_dag_heads fills a cache).
 */

#include <stddef.h>
#include <stdint.h>

#include "crdt/change.h"

typedef struct cairn_dag cairn_dag;

enum {
    CAIRN_DAG_READY = 0,   /* all deps ordered: queued for the caller */
    CAIRN_DAG_PENDING = 1, /* some dep missing: buffered */
    CAIRN_DAG_KNOWN = 2,   /* already ordered, ready or pending: dropped */
    CAIRN_DAG_REJECTED = 3 /* a dep was refused: refused too (see cairn_dag_reject) */
};

/* Bound on buffered pending changes (hostile peers): beyond it, add fails with
 * CAIRN_ELIMIT and nothing is kept. dag.c also bounds the pending buffer's
 * total dependency edges (8x this) and bytes (256 MiB) the same way. */
#define CAIRN_DAG_MAX_PENDING 100000u

int cairn_dag_new(cairn_dag **out);
void cairn_dag_free(cairn_dag *d);

/* Reads the canonical bytes of the ordered change at apply index |index|
 * from storage into a new malloc'd buffer (*bytes; the DAG frees it) of
 * *len bytes. Returns 0 or a negative code (CAIRN_EIO, CAIRN_ECORRUPT,
 * CAIRN_ENOTFOUND, CAIRN_ENOMEM); on failure *bytes is left NULL or is
 * freed. Called under the DAG's caller's serialisation; it must not call
 * back into the DAG. */
typedef int (*cairn_dag_load_cb)(void *arg, uint64_t index, uint8_t **bytes, size_t *len);

/* Installs the body loader: from then on ordered changes' bytes are not kept
 * in memory. Only before the first change is ordered, or right after a
 * checkpoint restored the DAG (CAIRN_ESTATE after): the loader must be able
 * to serve every ordered index. A restored DAG without a loader answers
 * CAIRN_ENOTFOUND for the bodies of the changes the checkpoint held. */
int cairn_dag_set_loader(cairn_dag *d, cairn_dag_load_cb fn, void *arg);

/* Offers a decoded (hence hash-verified) change. Takes ownership of |c| in
 * every case, freeing it when it is a duplicate or on error. *state is one of
 * CAIRN_DAG_*. A pending change becomes ready when its last missing
 * dependency is ordered. A change with a refused dep is refused at once:
 * *state CAIRN_DAG_REJECTED and the verdict returned (CAIRN_EPASTREFUSED,
 * or CAIRN_EFORKPAST when the refusal goes back to a fork only). */
int cairn_dag_add(cairn_dag *d, cairn_change *c, int *state);

/* The oldest ready change, or NULL. Borrowed: valid until cairn_dag_order
 * (which may hand this very pointer to its caller) or cairn_dag_discard. */
const cairn_change *cairn_dag_peek_ready(const cairn_dag *d);

/* Appends the peeked ready change to the apply order (it becomes a head) and
 * makes ready every pending change whose dependencies are now all ordered.
 * Fails (and rejects the change as cairn_dag_reject does, its descendants
 * with it) with CAIRN_ESEQGAP or CAIRN_EFORK. *index (if not
 * NULL) receives its index. The DAG lets go of the decoded change: *body
 * (if not NULL) receives it, owned by the caller (the pointer
 * cairn_dag_peek_ready gave); with |body| NULL it is freed. CAIRN_ESTATE if
 * nothing is ready; CAIRN_ENOMEM leaves the change ready and the DAG
 * unchanged (retry or discard it). */
int cairn_dag_order(cairn_dag *d, uint64_t *index, cairn_change **body);

/* Drops the peeked ready change for now (the document could not take it:
 * out of memory). It is unknown again: offered later, it is judged again.
 * Changes that depend on it stay pending (bounded by CAIRN_DAG_MAX_PENDING). */
void cairn_dag_discard(cairn_dag *d);

/* Drops the peeked ready change for good with verdict |why| (a negative
 * CAIRN_E* code; anything else is taken as CAIRN_EINVAL): the document
 * found it invalid, a verdict that depends only on the change and its
 * causal past, so every honest node gives the same and it is never worth
 * fetching or checking again. Every change that depends on it is refused
 * with it: those pending now at once, those offered later by
 * cairn_dag_add (CAIRN_EPASTREFUSED, or CAIRN_EFORKPAST below a fork), so
 * no descendant of a refused change is ever ordered or buffered, whatever
 * the order things came in. The sequence rule's rejections in
 * cairn_dag_order are the same.
 *
 * Memory: the hashes of the last CAIRN_DAG_MAX_REJECTED refused changes
 * (descendants included) are remembered, in a ring that starts at 64 and
 * doubles on demand up to that cap (about 140 bytes each with its node
 * and table slot: at most ~36 MiB). Offering one again is CAIRN_DAG_KNOWN,
 * cairn_dag_has says 2 and cairn_dag_missing never asks for it. Past the
 * cap the oldest is forgotten: offered again it is judged again (the same
 * verdict), and a descendant offered after its ancestor was forgotten
 * waits as pending for a dep it names (missing() asks for it; the peer
 * that sends it has it judged, and the descendant refused, again). */
void cairn_dag_reject(cairn_dag *d, int why);

#define CAIRN_DAG_MAX_REJECTED (1u << 18)

/* The verdict |h| was refused with (a negative code) while it is
 * remembered, else 0. */
int cairn_dag_rejected(const cairn_dag *d, const cairn_hash *h);

/* How many refused hashes are remembered now (<= CAIRN_DAG_MAX_REJECTED). */
size_t cairn_dag_rejected_count(const cairn_dag *d);

/* Number of ordered changes. */
uint64_t cairn_dag_count(const cairn_dag *d);

/* Number of changes buffered until their dependencies are ordered (the
 * pending buffer, bounded by CAIRN_DAG_MAX_PENDING). */
size_t cairn_dag_pending_count(const cairn_dag *d);

/* Ages the pending buffer. |now_ms| is the caller's clock (any origin; a
 * value below the last one counts as the last one). A pending change
 * arrived at the clock of the last call before it (the first call starts
 * the clock: everything pending then counts as arrived then); one that
 * has waited |max_age_ms| or more for its dependencies is dropped, the
 * oldest first, and is unknown again: nothing is lost, since a peer that
 * has it sends it again (the change's descendants, or the peer's heads,
 * name it, and missing() asks for it by hash). So changes with made-up
 * dependencies do not hold the buffer for good, while an honest burst
 * whose gap is filled within |max_age_ms| is never dropped, however big
 * (past CAIRN_DAG_MAX_PENDING its newest are refused, never its oldest:
 * those are the ones the gap's arrival orders first). Costs the dropped
 * changes' deps and waiters. Returns how many were dropped. */
size_t cairn_dag_expire(cairn_dag *d, uint64_t now_ms, uint64_t max_age_ms);

/* The hash of the change at apply-order |index|, or NULL if out of range.
 * Borrowed: valid until the next cairn_dag_order. */
const cairn_hash *cairn_dag_hash_at(const cairn_dag *d, uint64_t index);

/* The deps of the change at |index| as apply indices (each < index), in no
 * particular order: fills up to |cap| of |out| and returns how many there
 * are (<= CAIRN_CHANGE_MAX_DEPS; 0 if out of range). */
size_t cairn_dag_deps_at(uint64_t *out, size_t cap, const cairn_dag *d, uint64_t index);

/* The canonical bytes of the change at |index|, hash-verified, in a new
 * buffer (*bytes, caller frees). CAIRN_ENOTFOUND out of range; the loader's
 * CAIRN_EIO / CAIRN_ENOMEM; CAIRN_ECORRUPT if what storage returned does not
 * hash to the change's id. */
int cairn_dag_load_bytes(uint8_t **bytes, size_t *len, const cairn_dag *d, uint64_t index);

/* The change at |index| decoded (owned by the caller; cairn_change_free).
 * Errors as cairn_dag_load_bytes. */
int cairn_dag_load(cairn_change **out, const cairn_dag *d, uint64_t index);

/* Ordered change by hash: 0 and *index set, or CAIRN_ENOTFOUND. */
int cairn_dag_find(const cairn_dag *d, const cairn_hash *h, uint64_t *index);

/* 1 if |h| is ordered, 2 if ready or pending (or rejected and remembered,
 * see cairn_dag_reject: known, never to be fetched again), 0 if unknown. */
int cairn_dag_has(const cairn_dag *d, const cairn_hash *h);

/* The heads (ordered changes no ordered change depends on), sorted ascending.
 * Borrowed: valid until the next cairn_dag_order. */
size_t cairn_dag_heads(const cairn_dag *d, const cairn_hash **heads);

/* Highest ordered seq of |actor| (0 if none). */
uint64_t cairn_dag_actor_seq(const cairn_dag *d, const cairn_actor *actor);

/* Apply-order indices of every ordered ancestor of |heads| (inclusive),
 * ascending, in a new array (*out, caller frees). Unknown heads fail with
 * CAIRN_ENOTFOUND. */
int cairn_dag_ancestors(uint64_t **out, size_t *n, const cairn_dag *d, const cairn_hash *heads,
                        size_t nheads);

/* Apply-order indices of every ordered change that is NOT an ancestor of
 * |heads|, ascending (a topological order). Heads this DAG does not know are
 * ignored (they cannot hide anything we have). */
int cairn_dag_not_ancestors(uint64_t **out, size_t *n, const cairn_dag *d, const cairn_hash *heads,
                            size_t nheads);

/* Sets bit i - |floor| of |bits| for every ordered ancestor i >= |floor| of
 * the ordered changes among |heads| (inclusive; unknown heads are skipped).
 * |bits| holds (count - floor) / 64 + 1 words, zeroed by the caller. The
 * walk never goes below |floor|, so it costs the ancestors it marks: with a
 * floor under which the caller knows everything is an ancestor, about the
 * changes since then. */
int cairn_dag_mark_ancestors(uint64_t *bits, const cairn_dag *d, const cairn_hash *heads,
                             size_t nheads, uint64_t floor);

/* 1 if ordered change |h| is an ancestor of (or equal to) one of |heads|,
 * else 0 (also when out of memory). Unknown heads are ignored. Cost: the
 * ancestors of |heads| ordered after |h|. */
int cairn_dag_is_ancestor(const cairn_dag *d, const cairn_hash *h, const cairn_hash *heads,
                          size_t nheads);

/* Bytes the DAG holds for its ordered changes (capacity of its arrays and
 * tables, bodies included when there is no loader); for tests and
 * benchmarks. */
size_t cairn_dag_mem_bytes(const cairn_dag *d);

/* Hashes that pending changes depend on and that are not known at all
 * (what to ask peers for), sorted, new array (*out, caller frees). */
int cairn_dag_missing(cairn_hash **out, size_t *n, const cairn_dag *d);

/* ---- internal to crdt/: the checkpoint's DAG section -------------------
 * (cairn_doc_checkpoint in doc.h is the public face; the format is in
 * dag.c.) Pending and ready changes are not saved. */
struct wire_wr;
struct wire_rd;
/* Appends the section to |w| (errors stay in w->err). */
void cairn_dag_save_(struct wire_wr *w, const cairn_dag *d);
/* Reads a section into a new DAG (no loader, no pending changes); hostile
 * bytes give a specific error and *out NULL. */
int cairn_dag_restore_(cairn_dag **out, struct wire_rd *r);
/* 0 if the ordered part's internal invariants hold (every hash found at its
 * index, deps point backwards, heads are exactly the changes no change
 * depends on, authors' seqs add up) and so do the refused changes' (each
 * remembered in the ring, none waited for by anything) and so does the
 * pending list (every pending change once, oldest first), else
 * CAIRN_ECORRUPT. Tests, fuzzers. */
int cairn_dag_check_(const cairn_dag *d);
/* Changes the ancestry walks have visited so far (a cost counter). */
uint64_t cairn_dag_walk_steps_(const cairn_dag *d);

#endif
