#ifndef CAIRN_DOC_INT_H
#define CAIRN_DOC_INT_H

/*
 * Internals of the document, shared by doc.c (state, the op code),
 * doc_edit.c (local edits), doc_receive.c (changes from peers), doc_query.c
 * (reads), doc_ckpt.c (checkpoints) and doc_dump.c (canonical dump,
 * new_at). Nothing outside crdt/doc*.c includes this header but the tests.
 */

#include <stddef.h>
#include <stdint.h>

#include <sodium.h>

#include "crdt/doc.h"
#include "crdt/htab.h"

/* Op counters and clocks stay below this (a hostile change cannot push the
 * clock to overflow). */
#define COUNTER_LIMIT (UINT64_C(1) << 62)

enum { VK_SCALAR = 1, VK_MAP = 2, VK_LIST = 3 };

/* One visible op: its id and what it holds. Bytes/str values are the
 * document's own copies (change bodies are not kept in memory): v.p points
 * either at the bytes of a vbytes, shared by reference count among the vsets
 * that hold the op (a vset being computed, the current one, the undo log's
 * saved one), or (VF_INLINE) into the tail of the map record that holds it
 * (the op created the record, or the record took the value in later), whose
 * allocation carries the bytes for the record's lifetime and which every vset
 * holding the op belongs to, so no count is needed; an empty value points at
 * a static "" and owns nothing. A counter keeps its running total in i.
 *
 * The layout has no padding: 28 bytes of op and the 4-byte count of the vset
 * whose head this op is, so that a vset is 32 bytes. */
enum { VF_INLINE = 1 };
typedef struct vop {
    uint64_t counter;
    union {
        int64_t i;
        uint64_t u;
        double f;
        const uint8_t *p;
    } v;
    uint32_t actor; /* document actor index */
    uint32_t len;   /* bytes/str length */
    uint8_t kind;   /* VK_* */
    uint8_t vtype;  /* cairn_vtype when kind == VK_SCALAR */
    uint8_t flags;  /* VF_* */
    uint8_t spare_;
    uint32_t setn_; /* vset.n when this is a vset's head, else unused */
} vop;

typedef struct vbytes {
    uint32_t refs;
    uint8_t b[];
} vbytes;

/* The ops of one key or list element that nothing overwrote, greatest op id
 * first. One op (the common case) is stored inline as |one|; from two on,
 * |many| points at an array. The count |n| overlays one.setn_, so assign
 * |one| or |many| before |n|. */
typedef union vset {
    vop one;
    struct {
        uint64_t c_;
        vop *many;
        uint32_t a_, l_;
        uint8_t k_[4];
        uint32_t n;
    };
} vset;

_Static_assert(sizeof(vop) == 32 && sizeof(vset) == 32, "vop/vset are 32 bytes");
_Static_assert(offsetof(vset, n) == offsetof(vop, setn_), "vset.n overlays the head op");
_Static_assert(offsetof(vset, many) == offsetof(vop, v), "vset.many overlays the head op");

/* A map key: one allocation holding the record, the key and, when the op
 * that created the record was a non-empty bytes/str value, that value's
 * bytes (VF_INLINE) right after the key (|tail|). Once no vset holds that op
 * any more, the record takes its current single bytes value into the tail,
 * or drops the tail (rec_settle in doc.c: a realloc that may move it, done
 * only where no undo entry points at it). The record has no stored
 * hash (the table recomputes it when it moves entries): 37 bytes + key +
 * value. */
typedef struct mkey {
    vset vs; /* n >= 1 while the record is in its map's table */
    uint32_t key_len;
    uint8_t tail : 1;    /* the allocation holds a value after the key */
    uint8_t in_undo : 1; /* hint: an undo entry of the edit in progress names it */
    uint8_t key[];
} mkey;

/* 37 bytes: an 18-byte key and the store's 33-byte value record fit the
 * 96-byte malloc chunk (88 usable). */
_Static_assert(offsetof(mkey, key) == 37, "mkey header is 37 bytes");

/* A list element, identified by the id of the op that inserted it. Deleted
 * elements stay (vs.n == 0) as tombstones so that later inserts can follow
 * them. */
typedef struct elem {
    uint64_t counter;
    uint32_t actor;
    vset vs;
} elem;

/* The document's object table (entries are obj, whose first field is their
 * hash) and each map's keys (mkey, hashed from the key): crdt/htab.h. */
typedef cairn_htab ptab;

typedef struct obj {
    uint32_t hash;
    uint8_t type; /* CAIRN_OBJ_MAP / CAIRN_OBJ_LIST */
    uint32_t actor;
    uint64_t counter;
    size_t nvis;  /* visible keys / elements */
    ptab keys;    /* maps: mkey* */
    elem **items; /* lists: RGA order, tombstones included */
    size_t n, cap;
} obj;

/* Undo-log entry of a local edit. */
enum { U_MAP = 1, U_ELEM = 2, U_INSERT = 3, U_OBJ = 4 };
typedef struct undo {
    uint8_t what;
    uint8_t rec_new;     /* U_MAP: record created by this edit */
    uint8_t rec_removed; /* U_MAP: record taken out of its table */
    uint8_t rec_owner;   /* U_MAP: the record's last entry, and it stays */
    uint32_t rec_hash;   /* U_MAP: the record's key hash */
    obj *o;
    mkey *rec;
    elem *e;
    vset saved; /* U_MAP / U_ELEM: the state before the edit */
} undo;

/* An actor's ordered changes that carry ops, in its seq order (which is
 * also apply order): each one's apply index and last op counter. Receive
 * validation reads it to bound which of the actor's ops lie in a change's
 * causal past (doc_receive.c). About 16 bytes per change. */
typedef struct aspan {
    uint64_t index, end;
} aspan;
typedef struct arun {
    aspan *v;
    size_t n, cap;
} arun;

/* A set of apply indices as ascending disjoint ranges [lo, hi). */
typedef struct irange {
    uint64_t lo, hi;
} irange;

/* A pending local op in document actor indices; key/value bytes and preds
 * are owned here until commit. */
typedef struct pop {
    cairn_op op;
    uint8_t *buf;
} pop;

struct cairn_doc {
    cairn_dag *dag;
    cairn_actor *actors; /* interned; [0] is this replica's actor */
    uint64_t *actor_max; /* greatest op counter applied per actor */
    arun *runs;          /* per actor: its ordered changes with ops */
    uint32_t nactors, actors_cap;
    uint32_t *aslots; /* actor intern table: index + 1, 0 = empty */
    uint32_t acap;
    unsigned char hkey[CAIRN_HTAB_KEYBYTES];

    obj root;
    ptab objs;
    uint64_t max_counter;
    int readonly;
    int broken; /* an apply failed half-way: the doc is unusable */

    /* the local edit in progress */
    int in_edit;
    uint64_t p_start, p_time;
    pop *pops;
    size_t npops, pops_cap;
    undo *undo;
    size_t nundo, undo_cap;
    cairn_patch *pp;
    size_t npp, pp_cap;

    cairn_change *last_commit; /* what cairn_doc_commit handed out */

    /* Receive's memo of one change's concurrent set (doc_receive.c): while
     * |cc_ok|, the ordered changes not in the causal past of the change at
     * apply index |cc_at| are those below cc_at in |cc|, plus all above. */
    int cc_ok;
    uint64_t cc_at;
    irange *cc;
    size_t ncc, cc_cap;

    /* while applying */
    int local;
    const cairn_doc_observer *obs;
    cairn_opid *tpred;
    size_t tpred_cap;
};

/* Test hook: fail the n-th allocation of doc.c from now (0 = off). */
extern long cairn_doc_fail_alloc_;

/* Op id order: counter, then actor bytes. */
int cairn_doc_opcmp_(const cairn_doc *d, uint64_t c1, uint32_t a1, uint64_t c2, uint32_t a2);
const obj *cairn_doc_find_obj_(const cairn_doc *d, uint64_t counter, uint32_t actor);
/* cairn_doc_receive without the read-only check (new_at replays through it). */
int cairn_doc_receive_(cairn_doc *doc, cairn_change *c, const cairn_doc_observer *obs);

/* doc.c's building blocks, shared with doc_ckpt.c (which builds a whole
 * document from a checkpoint without applying ops). */
uint32_t cairn_doc_hash_bytes_(const cairn_doc *d, const void *p, size_t len);
uint32_t cairn_doc_hash_id_(const cairn_doc *d, uint64_t counter, uint32_t actor);
/* Room for |extra| more entries at load <= 3/4 (CAIRN_ELIMIT past 2^31 slots). */
int cairn_doc_ptab_reserve_(const cairn_doc *d, ptab *t, uint32_t extra);
/* The tables' rehash callbacks (arg: the document). */
uint32_t cairn_doc_obj_hash_(const void *arg, const void *e);
uint32_t cairn_doc_key_hash_(const void *arg, const void *e);
int cairn_doc_actor_find_(const cairn_doc *d, const cairn_actor *a, uint32_t *idx);
int cairn_doc_actor_intern_(cairn_doc *d, const cairn_actor *a, uint32_t *idx);
/* Room for one more span in actor |a|'s run; appends one (room reserved). */
int cairn_doc_run_reserve_(cairn_doc *d, uint32_t a);
void cairn_doc_run_push_(cairn_doc *d, uint32_t a, uint64_t index, uint64_t end);
/* Releases a vset: its ops' bytes (by reference count) and its array. */
void cairn_doc_vs_free_(vset *s);
/* Grows array *p of |size|-byte elements to hold |need| (doubling). */
int cairn_doc_grow_(void **p, size_t *cap, size_t need, size_t size);
mkey *cairn_doc_map_lookup_(const obj *o, const uint8_t *key, uint32_t key_len, uint32_t h);

/* ---- doc.c's building blocks for the other doc*.c files ---- */
/* Allocation through the failure injection (cairn_doc_fail_alloc_). */
void *cairn_doc_xmalloc_(size_t n);
void *cairn_doc_xcalloc_(size_t n, size_t size);
void *cairn_doc_xrealloc_(void *p, size_t n);
/* Puts |e| into room reserved in |t| (the doc's objects or a map's keys);
 * takes it out. */
void cairn_doc_ptab_put_(const cairn_doc *d, ptab *t, void *e);
void cairn_doc_ptab_del_ptr_(const cairn_doc *d, ptab *t, const void *e);
/* The object |id| or NULL. */
obj *cairn_doc_find_obj_mut_(cairn_doc *d, cairn_objid id);
/* Frees an object's records and elements (not the object). */
void cairn_doc_obj_clear_(obj *o);
/* A map record whose first value died takes its single value into its own
 * allocation (see doc.c); returns it, maybe moved. |h|: its hash or 0. */
mkey *cairn_doc_rec_settle_(cairn_doc *d, obj *o, mkey *r, uint32_t h);
/* What a read reports for visible op |v|. */
void cairn_doc_read_of_(cairn_read *r, const vop *v);
/* Position in o->items of element (counter, actor), or -1; of the
 * |index|-th visible element, or -1. */
ptrdiff_t cairn_doc_list_find_(const obj *o, uint64_t counter, uint32_t actor);
ptrdiff_t cairn_doc_list_pos_(const obj *o, size_t index);
/* Applies one op with id (counter, actor) (document actor indices). */
int cairn_doc_apply_op_(cairn_doc *d, const cairn_op *op, uint64_t counter, uint32_t actor);
/* Frees what cairn_doc_commit handed out; the pending local ops. */
void cairn_doc_drop_last_commit_(cairn_doc *d);
void cairn_doc_pending_clear_(cairn_doc *d);

/* Short names inside crdt/doc*.c (which define CAIRN_DOC_IMPL first). */
#ifdef CAIRN_DOC_IMPL
#define opcmp cairn_doc_opcmp_
#define hash_bytes cairn_doc_hash_bytes_
#define hash_id cairn_doc_hash_id_
#define ptab_reserve cairn_doc_ptab_reserve_
#define actor_find cairn_doc_actor_find_
#define actor_intern cairn_doc_actor_intern_
#define run_reserve cairn_doc_run_reserve_
#define run_push cairn_doc_run_push_
#define vs_free cairn_doc_vs_free_
#define grow cairn_doc_grow_
#define map_lookup cairn_doc_map_lookup_
#define xmalloc cairn_doc_xmalloc_
#define xcalloc cairn_doc_xcalloc_
#define xrealloc cairn_doc_xrealloc_
#define ptab_put cairn_doc_ptab_put_
#define ptab_del_ptr cairn_doc_ptab_del_ptr_
#define find_obj cairn_doc_find_obj_mut_
#define obj_clear cairn_doc_obj_clear_
#define rec_settle cairn_doc_rec_settle_
#define read_of cairn_doc_read_of_
#define list_find cairn_doc_list_find_
#define list_pos cairn_doc_list_pos_
#define apply_op cairn_doc_apply_op_
#define drop_last_commit cairn_doc_drop_last_commit_
#define pending_clear cairn_doc_pending_clear_
#endif

/* 0 if the document's internal invariants hold (tables find what they hold,
 * visible sets sorted and within the actors' clocks, object references
 * resolve, counts match, the DAG's own cairn_dag_check_), else
 * CAIRN_ECORRUPT (or CAIRN_ENOMEM). For tests and fuzzers. */
int cairn_doc_check_(const cairn_doc *d);

static inline const vop *vs_ops(const vset *s)
{
    return s->n <= 1 ? &s->one : s->many;
}

/* Whether the op holds a reference to a vbytes. */
static inline int vop_has_bytes(const vop *o)
{
    return o->kind == VK_SCALAR && (o->vtype == CAIRN_V_BYTES || o->vtype == CAIRN_V_STR) &&
           o->len > 0 && !(o->flags & VF_INLINE);
}

static inline vbytes *vop_bytes(const vop *o)
{
    return (vbytes *)(void *)((uintptr_t)o->v.p - offsetof(vbytes, b));
}

/* Heap bytes the document's state holds (malloc_usable_size of every
 * allocation; a shared vbytes counts once), not counting the DAG nor the
 * edit-in-progress buffers. For tests and benches. */
size_t cairn_doc_state_bytes_(const cairn_doc *d);

#endif
