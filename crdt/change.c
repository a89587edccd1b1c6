/*
 * Changes: their one canonical binary encoding, its decoder and the change's
 * id (BLAKE2b-256 of the encoding, libsodium crypto_generichash).
 *
 * The encoding has exactly one form per change value: every integer is a
 * minimal LEB128 varint, every set is sorted and unique, every flag has one
 * spelling. The decoder rejects anything else, so a change's hash is a
 * function of its meaning and two nodes can never disagree on an id for the
 * same change. encode(decode(b)) == b and decode(encode(c)) == c.
 *
 * The decoder treats its input as hostile. It runs twice over the bytes: a
 * validating pass that counts what needs storing, then one allocation (the
 * arena) sized from those counts, then a filling pass. The arena holds the
 * change struct, its arrays and a copy of the bytes; keys, values and deps
 * point into that copy. Nothing is allocated before the counts are shown to
 * fit in the input (count * minimum encoded size <= bytes left), so the arena
 * is at most about 20 times the input (a 5-byte op becomes a 96-byte
 * cairn_op; a 2-byte pred a 16-byte cairn_opid).
 *
 * ENCODING, version 1. "v" is an unsigned LEB128 varint (7 bits per byte, low
 * group first, high bit = more), at most 10 bytes, minimal: a multi-byte
 * varint may not end in 0x00 and the 10th byte may only be 0x01. "z" is a
 * zigzag varint for signed values ((n << 1) ^ (n >> 63)).
 *
 *   offset  size    field
 *   0       1       version: 0xC1                      else EBADVERSION
 *   1       16      author actor (= actors[0])
 *   17      v       seq, >= 1                          else EBADOP
 *           v       start_op, >= 1, and start_op + nops - 1 must fit in
 *                   64 bits                            else EBADOP
 *           v       time_ms (informational)
 *           v       ndeps, <= CAIRN_CHANGE_MAX_DEPS    else ELIMIT
 *           32*n    deps, strictly ascending bytes     else EUNSORTED
 *           v       nothers = nactors - 1, <= CAIRN_CHANGE_MAX_ACTORS - 1
 *           16*n    actors[1..], strictly ascending, none equal to the
 *                   author                             else ENONCANON
 *           v       nops (each op takes >= 5 bytes)     else ELIMIT
 *           ...     nops ops, each:
 *
 *   op      size    field
 *           1       action: 1 MAKE_MAP, 2 MAKE_LIST, 3 SET, 4 DEL, 5 INC
 *                                                      else EBADOP
 *           1       flags: bit 0 = insert, bit 1 = list (an element id
 *                   follows, not a key); other bits set → ENONCANON;
 *                   insert without list → EBADOP
 *           id      obj (counter 0 = root)
 *     map:  v, n    key length, key bytes (any bytes, may be empty)
 *     list: id      elem: insert → the element to follow (counter 0 = head);
 *                   otherwise the element acted on (counter must be >= 1)
 *     SET:  value   the scalar
 *     INC:  value   the delta, type INT                else EBADOP
 *           v       npred, <= CAIRN_CHANGE_MAX_PRED    else ELIMIT
 *           id*n    preds: counters >= 1, strictly ascending by (counter,
 *                   actor bytes)                       else EBADOP
 *
 *   id      v       counter; if it is not 0:
 *           v       actor index into the actor table   else EBADOP
 *           An id whose counter is 0 has no index byte; it decodes as
 *           (0, 0). An id naming the author (index 0) with a counter >= the
 *           referring op's own counter (start_op + its position) is EBADOP:
 *           a change may only refer back to its own earlier ops.
 *
 *   value   1       type tag (cairn_vtype)             unknown → EBADOP
 *           NULL    nothing
 *           BOOL    1 byte, 0 or 1                     else ENONCANON
 *           INT     z
 *           UINT    v
 *           F64     8 bytes, IEEE-754 bits little-endian
 *           BYTES   v length, bytes
 *           STR     v length, bytes (UTF-8 not checked)
 *           COUNTER z (initial value)
 *
 * Op shape rules (EBADOP): DEL and INC never insert; an insert overwrites
 * nothing (npred == 0). Ops without a value (MAKE_*, DEL) carry none.
 * Nothing may follow the last op (ENONCANON). Whole input larger than
 * CAIRN_CHANGE_MAX_BYTES → ELIMIT. The input ending inside a field →
 * ETRUNCATED; a count or length that cannot fit in the bytes left → ELIMIT.
 *
 * In a cairn_op, an op addresses a list element iff insert != 0 or
 * elem.counter != 0; otherwise it addresses map key |key|.
 */
#include "crdt/change.h"

#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "crdt/wire.h"

#define VERSION_1 0xC1
#define FLAG_INSERT 0x01
#define FLAG_LIST 0x02
#define OP_MIN_BYTES 5   /* action, flags, obj, key len or elem, npred */
#define PRED_MIN_BYTES 2 /* counter (>= 1) and actor index */

/* ---- helpers ---------------------------------------------------------- */

/* libsodium wants sodium_init() before use (it picks the fastest BLAKE2b
 * code for this CPU); once per process, whoever hashes first. */
static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;

static void init_sodium(void)
{
    if (sodium_init() < 0)
        return; /* no entropy source: hashing still works, unaccelerated */
}

void cairn_hash_bytes(cairn_hash *out, const uint8_t *buf, size_t len)
{
    pthread_once(&sodium_once, init_sodium);
    crypto_generichash(out->b, CAIRN_HASH_LEN, buf, len, NULL, 0);
}

int cairn_hash_cmp(const cairn_hash *a, const cairn_hash *b)
{
    return memcmp(a->b, b->b, CAIRN_HASH_LEN);
}

int cairn_actor_cmp(const cairn_actor *a, const cairn_actor *b)
{
    return memcmp(a->b, b->b, CAIRN_ACTOR_LEN);
}

void cairn_hash_hex(char out[2 * CAIRN_HASH_LEN + 1], const cairn_hash *h)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < CAIRN_HASH_LEN; i++) {
        out[2 * i] = digits[h->b[i] >> 4];
        out[2 * i + 1] = digits[h->b[i] & 15];
    }
    out[2 * CAIRN_HASH_LEN] = '\0';
}

static uint64_t zigzag(int64_t n)
{
    return ((uint64_t)n << 1) ^ (uint64_t)(n < 0 ? -1 : 0);
}

static int64_t unzigzag(uint64_t u)
{
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

static int action_valid(unsigned a)
{
    return a >= CAIRN_OP_MAKE_MAP && a <= CAIRN_OP_INC;
}

/* ---- decoding --------------------------------------------------------- */

/* The private header at the start of every arena. */
struct arena {
    uint8_t *ext; /* a later cairn_change_encode's buffer, or NULL */
};

struct rd {
    const uint8_t *p, *end;
};

static size_t left(const struct rd *r)
{
    return (size_t)(r->end - r->p);
}

static int rd_varint(struct rd *r, uint64_t *out)
{
    wire_rd w = {r->p, r->end};
    int rc = wire_uv(&w, out);
    r->p = w.p;
    return rc;
}

static int rd_bytes(struct rd *r, const uint8_t **out, size_t n)
{
    if (left(r) < n)
        return CAIRN_ETRUNCATED;
    *out = r->p;
    r->p += n;
    return 0;
}

/* A count of items that each take at least |min| bytes. */
static int rd_count(struct rd *r, uint32_t *out, uint64_t max, size_t min)
{
    uint64_t n;
    int rc = rd_varint(r, &n);
    if (rc)
        return rc;
    if (n > max || n > left(r) / min)
        return CAIRN_ELIMIT;
    *out = (uint32_t)n;
    return 0;
}

/* What the parser knows about the change while it reads its ops. */
struct ctx {
    const uint8_t *author;
    const uint8_t *others; /* actors[1..] in the input */
    uint32_t nactors;
    uint64_t own; /* counter of the op being read */
};

static const uint8_t *actor_bytes(const struct ctx *x, uint32_t i)
{
    return i == 0 ? x->author : x->others + (size_t)(i - 1) * CAIRN_ACTOR_LEN;
}

/* An op id; |required| means counter 0 is not allowed. */
static int rd_opid(struct rd *r, const struct ctx *x, cairn_opid *out, int required)
{
    uint64_t ctr, idx;
    int rc = rd_varint(r, &ctr);
    if (rc)
        return rc;
    if (ctr == 0) {
        if (required)
            return CAIRN_EBADOP;
        out->counter = 0;
        out->actor = 0;
        return 0;
    }
    if ((rc = rd_varint(r, &idx)))
        return rc;
    if (idx >= x->nactors)
        return CAIRN_EBADOP;
    if (idx == 0 && ctr >= x->own)
        return CAIRN_EBADOP;
    out->counter = ctr;
    out->actor = (uint32_t)idx;
    return 0;
}

static int opid_cmp(const struct ctx *x, const cairn_opid *a, const cairn_opid *b)
{
    if (a->counter != b->counter)
        return a->counter < b->counter ? -1 : 1;
    if (a->actor == b->actor)
        return 0;
    return memcmp(actor_bytes(x, a->actor), actor_bytes(x, b->actor), CAIRN_ACTOR_LEN);
}

static int rd_value(struct rd *r, cairn_value *v)
{
    uint8_t tag;
    uint64_t u;
    const uint8_t *p;
    int rc;
    if (left(r) < 1)
        return CAIRN_ETRUNCATED;
    tag = *r->p++;
    memset(v, 0, sizeof *v);
    v->type = tag;
    switch (tag) {
    case CAIRN_V_NULL:
        return 0;
    case CAIRN_V_BOOL:
        if ((rc = rd_bytes(r, &p, 1)))
            return rc;
        if (p[0] > 1)
            return CAIRN_ENONCANON;
        v->v.b = p[0];
        return 0;
    case CAIRN_V_INT:
    case CAIRN_V_COUNTER:
        if ((rc = rd_varint(r, &u)))
            return rc;
        v->v.i = unzigzag(u);
        return 0;
    case CAIRN_V_UINT:
        if ((rc = rd_varint(r, &u)))
            return rc;
        v->v.u = u;
        return 0;
    case CAIRN_V_F64:
        if ((rc = rd_bytes(r, &p, 8)))
            return rc;
        u = 0;
        for (int i = 7; i >= 0; i--)
            u = (u << 8) | p[i];
        memcpy(&v->v.f, &u, 8);
        return 0;
    case CAIRN_V_BYTES:
    case CAIRN_V_STR:
        if ((rc = rd_varint(r, &u)))
            return rc;
        if (u > left(r))
            return CAIRN_ELIMIT;
        v->v.bytes.ptr = r->p;
        v->v.bytes.len = (size_t)u;
        r->p += u;
        return 0;
    default:
        return CAIRN_EBADOP;
    }
}

/* Reads one op into |op|; its preds go to |preds| (room for
 * CAIRN_CHANGE_MAX_PRED) when not NULL, else are only validated. */
static int rd_op(struct rd *r, const struct ctx *x, cairn_op *op, cairn_opid *preds)
{
    int rc;
    uint64_t u;
    if (left(r) < 2)
        return CAIRN_ETRUNCATED;
    uint8_t action = r->p[0], flags = r->p[1];
    r->p += 2;
    memset(op, 0, sizeof *op);
    if (!action_valid(action))
        return CAIRN_EBADOP;
    if (flags & ~(FLAG_INSERT | FLAG_LIST))
        return CAIRN_ENONCANON;
    int insert = flags & FLAG_INSERT, list = flags & FLAG_LIST;
    if (insert && (!list || action == CAIRN_OP_DEL || action == CAIRN_OP_INC))
        return CAIRN_EBADOP;
    op->action = action;
    op->insert = insert ? 1 : 0;
    if ((rc = rd_opid(r, x, &op->obj, 0)))
        return rc;
    if (list) {
        if ((rc = rd_opid(r, x, &op->elem, !insert)))
            return rc;
    } else {
        if ((rc = rd_varint(r, &u)))
            return rc;
        if (u > left(r))
            return CAIRN_ELIMIT;
        op->key = r->p;
        op->key_len = (uint32_t)u;
        r->p += u;
    }
    if (action == CAIRN_OP_SET || action == CAIRN_OP_INC) {
        if ((rc = rd_value(r, &op->value)))
            return rc;
        if (action == CAIRN_OP_INC && op->value.type != CAIRN_V_INT)
            return CAIRN_EBADOP;
    }
    if ((rc = rd_count(r, &op->npred, CAIRN_CHANGE_MAX_PRED, PRED_MIN_BYTES)))
        return rc;
    if (insert && op->npred)
        return CAIRN_EBADOP;
    cairn_opid prev = {0, 0}, cur;
    for (uint32_t i = 0; i < op->npred; i++) {
        if ((rc = rd_opid(r, x, &cur, 1)))
            return rc;
        if (i > 0 && opid_cmp(x, &prev, &cur) >= 0)
            return CAIRN_EBADOP;
        if (preds)
            preds[i] = cur;
        prev = cur;
    }
    op->pred = preds;
    return 0;
}

struct counts {
    uint32_t ndeps, nactors, nops;
    size_t npreds;
};

/* Parses the whole input. With |c| NULL it only validates and fills |n|;
 * otherwise |c|'s arrays (and |preds|, room for every pred) are already sized
 * from a first pass and get filled. */
static int parse(const uint8_t *buf, size_t len, struct counts *n, cairn_change *c,
                 cairn_opid *preds)
{
    struct rd r = {buf, buf ? buf + len : buf}; /* no offset into NULL */
    struct ctx x;
    const uint8_t *p;
    uint64_t seq, start_op, time_ms;
    uint32_t nothers;
    int rc;

    if (len > CAIRN_CHANGE_MAX_BYTES)
        return CAIRN_ELIMIT;
    if (len < 1)
        return CAIRN_ETRUNCATED;
    if (buf[0] != VERSION_1)
        return CAIRN_EBADVERSION;
    r.p++;
    if ((rc = rd_bytes(&r, &x.author, CAIRN_ACTOR_LEN)))
        return rc;
    if ((rc = rd_varint(&r, &seq)) || (rc = rd_varint(&r, &start_op)) ||
        (rc = rd_varint(&r, &time_ms)))
        return rc;
    if (seq == 0 || start_op == 0)
        return CAIRN_EBADOP;

    if ((rc = rd_count(&r, &n->ndeps, CAIRN_CHANGE_MAX_DEPS, CAIRN_HASH_LEN)))
        return rc;
    const uint8_t *deps = r.p;
    r.p += (size_t)n->ndeps * CAIRN_HASH_LEN;
    for (uint32_t i = 1; i < n->ndeps; i++)
        if (memcmp(deps + (i - 1) * CAIRN_HASH_LEN, deps + i * CAIRN_HASH_LEN, CAIRN_HASH_LEN) >= 0)
            return CAIRN_EUNSORTED;

    if ((rc = rd_count(&r, &nothers, CAIRN_CHANGE_MAX_ACTORS - 1, CAIRN_ACTOR_LEN)))
        return rc;
    x.others = r.p;
    x.nactors = nothers + 1;
    n->nactors = x.nactors;
    r.p += (size_t)nothers * CAIRN_ACTOR_LEN;
    for (uint32_t i = 0; i < nothers; i++) {
        p = x.others + (size_t)i * CAIRN_ACTOR_LEN;
        if (memcmp(p, x.author, CAIRN_ACTOR_LEN) == 0)
            return CAIRN_ENONCANON;
        if (i > 0 && memcmp(p - CAIRN_ACTOR_LEN, p, CAIRN_ACTOR_LEN) >= 0)
            return CAIRN_ENONCANON;
    }

    if ((rc = rd_count(&r, &n->nops, UINT32_MAX, OP_MIN_BYTES)))
        return rc;
    if (n->nops > 0 && start_op - 1 > UINT64_MAX - n->nops)
        return CAIRN_EBADOP;

    if (c) {
        memcpy(c->actor.b, x.author, CAIRN_ACTOR_LEN);
        c->seq = seq;
        c->start_op = start_op;
        c->time_ms = time_ms;
        c->ndeps = n->ndeps;
        c->deps = (cairn_hash *)(uintptr_t)deps; /* cairn_hash has alignment 1 */
        c->nactors = x.nactors;
        memcpy(c->actors[0].b, x.author, CAIRN_ACTOR_LEN);
        if (nothers)
            memcpy(c->actors + 1, x.others, (size_t)nothers * CAIRN_ACTOR_LEN);
        c->nops = n->nops;
    }
    size_t npreds = 0;
    cairn_op scratch;
    for (uint32_t i = 0; i < n->nops; i++) {
        x.own = start_op + i;
        cairn_op *op = c ? &c->ops[i] : &scratch;
        if ((rc = rd_op(&r, &x, op, c ? preds + npreds : NULL)))
            return rc;
        if (!c || op->npred == 0)
            op->pred = NULL;
        npreds += op->npred;
    }
    if (r.p != r.end)
        return CAIRN_ENONCANON;
    n->npreds = npreds;
    return 0;
}

static size_t round_up(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Where the parts of a change's arena go for |n|: arena header, change,
 * ops, preds, actors, then the bytes at l->bytes. Each count is bounded
 * by the input length, so the total is O(len). */
struct layout {
    size_t change, ops, preds, actors, bytes;
};

static void layout_of(struct layout *l, const struct counts *n)
{
    l->change = round_up(sizeof(struct arena));
    l->ops = l->change + round_up(sizeof(cairn_change));
    l->preds = l->ops + round_up((size_t)n->nops * sizeof(cairn_op));
    l->actors = l->preds + round_up(n->npreds * sizeof(cairn_opid));
    l->bytes = l->actors + round_up((size_t)n->nactors * sizeof(cairn_actor));
}

/* Fills the change in arena |mem| (laid out by |l| for counts that match
 * the bytes, which are already at mem + l->bytes) by parsing those bytes,
 * so that pointers land in the arena. */
static int fill(cairn_change **out, uint8_t *mem, const struct layout *l, size_t len,
                const cairn_hash *h)
{
    struct arena *a = (struct arena *)mem;
    a->ext = NULL;
    cairn_change *c = (cairn_change *)(mem + l->change);
    memset(c, 0, sizeof *c);
    c->arena_ = mem;
    c->actors = (cairn_actor *)(mem + l->actors);
    c->bytes = mem + l->bytes;
    c->len = len;
    c->hash = *h;
    struct counts n;
    /* c->ops is set before the parse writes through it. */
    c->ops = (cairn_op *)(mem + l->ops);
    int rc = parse(c->bytes, len, &n, c, (cairn_opid *)(mem + l->preds));
    if (rc)
        return rc;
    if (n.nops == 0)
        c->ops = NULL;
    if (n.ndeps == 0)
        c->deps = NULL;
    *out = c;
    return 0;
}

int cairn_change_decode(cairn_change **out, const uint8_t *buf, size_t len,
                        const cairn_hash *expect)
{
    struct counts n = {0};
    cairn_hash h;
    int rc;

    *out = NULL;
    if (!buf && len)
        return CAIRN_EINVAL;
    if ((rc = parse(buf, len, &n, NULL, NULL)))
        return rc;
    cairn_hash_bytes(&h, buf, len);
    if (expect && cairn_hash_cmp(&h, expect) != 0)
        return CAIRN_EBADHASH;

    struct layout l;
    layout_of(&l, &n);
    uint8_t *mem = malloc(l.bytes + (len ? len : 1));
    if (!mem)
        return CAIRN_ENOMEM;
    memcpy(mem + l.bytes, buf, len);
    if ((rc = fill(out, mem, &l, len, &h))) {
        free(mem);
        return rc; /* cannot happen: the same bytes passed above */
    }
    return 0;
}

void cairn_change_free(cairn_change *c)
{
    if (!c)
        return;
    if (c->arena_) {
        struct arena *a = c->arena_;
        free(a->ext);
        free(a); /* |c| lives inside the arena */
    } else {
        free(c->bytes);
    }
}

/* ---- encoding --------------------------------------------------------- */

struct wbuf {
    uint8_t *p;
    size_t len, cap;
    int oom;
    int fixed; /* |p| is not ours to grow: running out is oom */
};

static void w_reserve(struct wbuf *w, size_t n)
{
    if (w->oom || w->cap - w->len >= n)
        return;
    if (w->fixed) {
        w->oom = 1;
        return;
    }
    size_t cap = w->cap ? w->cap : 64;
    while (cap - w->len < n) {
        if (cap > SIZE_MAX / 2) {
            w->oom = 1;
            return;
        }
        cap *= 2;
    }
    uint8_t *np = realloc(w->p, cap);
    if (!np) {
        w->oom = 1;
        return;
    }
    w->p = np;
    w->cap = cap;
}

static void w_bytes(struct wbuf *w, const void *src, size_t n)
{
    w_reserve(w, n);
    if (w->oom || n == 0)
        return;
    memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void w_byte(struct wbuf *w, uint8_t b)
{
    w_reserve(w, 1);
    if (w->oom)
        return;
    w->p[w->len++] = b;
}

static void w_varint(struct wbuf *w, uint64_t v)
{
    /* In place: most fields are one or two bytes, and the room for the
     * longest (10) is usually there already. */
    w_reserve(w, 10);
    if (w->oom)
        return;
    w->len = (size_t)(wire_put_uv(w->p + w->len, v) - w->p);
}

static void w_opid(struct wbuf *w, cairn_opid id)
{
    w_varint(w, id.counter);
    if (id.counter)
        w_varint(w, id.actor);
}

static void w_value(struct wbuf *w, const cairn_value *v)
{
    uint8_t le[8];
    uint64_t u;
    w_byte(w, v->type);
    switch (v->type) {
    case CAIRN_V_BOOL:
        w_byte(w, (uint8_t)v->v.b);
        break;
    case CAIRN_V_INT:
    case CAIRN_V_COUNTER:
        w_varint(w, zigzag(v->v.i));
        break;
    case CAIRN_V_UINT:
        w_varint(w, v->v.u);
        break;
    case CAIRN_V_F64:
        memcpy(&u, &v->v.f, 8);
        for (int i = 0; i < 8; i++)
            le[i] = (uint8_t)(u >> (8 * i));
        w_bytes(w, le, 8);
        break;
    case CAIRN_V_BYTES:
    case CAIRN_V_STR:
        w_varint(w, v->v.bytes.len);
        w_bytes(w, v->v.bytes.ptr, v->v.bytes.len);
        break;
    default:
        break;
    }
}

static int op_is_list(const cairn_op *op)
{
    return op->insert || op->elem.counter != 0;
}

/* What the bytes cannot show: fields that encode drops and must be unset. */
static int check_struct(const cairn_change *c)
{
    if (c->nactors < 1 || c->nactors > CAIRN_CHANGE_MAX_ACTORS || !c->actors ||
        cairn_actor_cmp(&c->actors[0], &c->actor) != 0)
        return CAIRN_EINVAL;
    if ((c->ndeps && !c->deps) || (c->nops && !c->ops))
        return CAIRN_EINVAL;
    for (uint32_t i = 0; i < c->nops; i++) {
        const cairn_op *op = &c->ops[i];
        if (op->insert > 1)
            return CAIRN_EINVAL;
        if ((op->obj.counter == 0 && op->obj.actor != 0) ||
            (op->elem.counter == 0 && op->elem.actor != 0))
            return CAIRN_EINVAL;
        if (op_is_list(op) && (op->key_len != 0))
            return CAIRN_EINVAL;
        if (!op_is_list(op) && op->key_len && !op->key)
            return CAIRN_EINVAL;
        if (op->npred && !op->pred)
            return CAIRN_EINVAL;
        if (op->action == CAIRN_OP_SET || op->action == CAIRN_OP_INC) {
            const cairn_value *v = &op->value;
            if (v->type == CAIRN_V_BOOL && (v->v.b != 0 && v->v.b != 1))
                return CAIRN_EINVAL;
            if ((v->type == CAIRN_V_BYTES || v->type == CAIRN_V_STR) && v->v.bytes.len &&
                !v->v.bytes.ptr)
                return CAIRN_EINVAL;
        } else if (op->value.type != CAIRN_V_NULL) {
            return CAIRN_EINVAL;
        }
    }
    return 0;
}

/* The bytes of |c| (check_struct passed) appended to |*w_out| (a growable
 * buffer starts zeroed; the caller frees w->p, also on failure; a fixed one
 * that runs out gives CAIRN_ENOMEM), not yet checked against the decoder. */
static int encode_bytes(const cairn_change *c, struct wbuf *w_out)
{
    struct wbuf w = *w_out;

    w_byte(&w, VERSION_1);
    w_bytes(&w, c->actor.b, CAIRN_ACTOR_LEN);
    w_varint(&w, c->seq);
    w_varint(&w, c->start_op);
    w_varint(&w, c->time_ms);
    w_varint(&w, c->ndeps);
    w_bytes(&w, c->deps, (size_t)c->ndeps * CAIRN_HASH_LEN);
    w_varint(&w, c->nactors - 1);
    w_bytes(&w, c->actors + 1, (size_t)(c->nactors - 1) * CAIRN_ACTOR_LEN);
    w_varint(&w, c->nops);
    for (uint32_t i = 0; i < c->nops; i++) {
        const cairn_op *op = &c->ops[i];
        int list = op_is_list(op);
        w_byte(&w, op->action);
        w_byte(&w, (uint8_t)((op->insert ? FLAG_INSERT : 0) | (list ? FLAG_LIST : 0)));
        w_opid(&w, op->obj);
        if (list) {
            w_opid(&w, op->elem);
        } else {
            w_varint(&w, op->key_len);
            w_bytes(&w, op->key, op->key_len);
        }
        if (op->action == CAIRN_OP_SET || op->action == CAIRN_OP_INC)
            w_value(&w, &op->value);
        w_varint(&w, op->npred);
        for (uint32_t j = 0; j < op->npred; j++)
            w_opid(&w, op->pred[j]);
        if (w.len > CAIRN_CHANGE_MAX_BYTES)
            break; /* parse below says ELIMIT */
    }
    *w_out = w;
    return w.oom ? CAIRN_ENOMEM : 0;
}

/* At least as many bytes as encode_bytes writes for |c| (varints counted
 * at their longest), and the counts the decoder will find in them. */
static size_t encoded_bound(const cairn_change *c, struct counts *n)
{
    size_t b = 1 + CAIRN_ACTOR_LEN + 4 * 10 + (size_t)c->ndeps * CAIRN_HASH_LEN + 10 +
               (size_t)(c->nactors - 1) * CAIRN_ACTOR_LEN + 10;
    n->ndeps = c->ndeps;
    n->nactors = c->nactors;
    n->nops = c->nops;
    n->npreds = 0;
    for (uint32_t i = 0; i < c->nops; i++) {
        const cairn_op *op = &c->ops[i];
        /* action, flags, obj, key or elem, value tag and scalar, npred */
        b += 2 + 20 + 20 + op->key_len + 1 + 10 + 10 + (size_t)op->npred * 20;
        if (op->value.type == CAIRN_V_BYTES || op->value.type == CAIRN_V_STR)
            b += op->value.v.bytes.len;
        n->npreds += op->npred;
    }
    return b;
}

/* What encode returns when the decoder rejects its bytes. */
static int refused(int rc, size_t len)
{
    return rc == CAIRN_ELIMIT && len > CAIRN_CHANGE_MAX_BYTES ? CAIRN_ELIMIT : CAIRN_EINVAL;
}

int cairn_change_encode(cairn_change *c)
{
    struct wbuf w = {0};
    int rc = check_struct(c);
    if (rc)
        return rc;
    rc = encode_bytes(c, &w);
    if (rc) {
        free(w.p);
        return rc;
    }

    /* The decoder is the definition of canonical: what it would reject,
     * encode refuses. */
    struct counts n;
    rc = parse(w.p, w.len, &n, NULL, NULL);
    if (rc) {
        free(w.p);
        return refused(rc, w.len);
    }

    if (c->arena_) {
        struct arena *a = c->arena_;
        free(a->ext);
        a->ext = w.p;
    } else {
        free(c->bytes);
    }
    c->bytes = w.p;
    c->len = w.len;
    cairn_hash_bytes(&c->hash, c->bytes, c->len);
    return 0;
}

int cairn_change_new(cairn_change **out, const cairn_change *tmpl)
{
    int rc;

    *out = NULL;
    if ((rc = check_struct(tmpl)))
        return rc;
    /* Encoded straight into the arena, at the place of its bytes, and
     * parsed once there: the parse fills the change (pointers land in the
     * arena) and is encode's canonical check, and the hash is taken once. */
    struct counts n;
    size_t bound = encoded_bound(tmpl, &n);
    int clamped = bound > CAIRN_CHANGE_MAX_BYTES;
    if (clamped)
        bound = CAIRN_CHANGE_MAX_BYTES + 1; /* more is refused anyway */
    struct layout l;
    layout_of(&l, &n);
    uint8_t *mem = malloc(l.bytes + bound);
    if (!mem)
        return CAIRN_ENOMEM;
    struct wbuf w = {mem + l.bytes, 0, bound, 0, 1};
    rc = encode_bytes(tmpl, &w);
    if (rc == 0) {
        cairn_hash h;
        cairn_hash_bytes(&h, w.p, w.len);
        rc = fill(out, mem, &l, w.len, &h);
        if (rc)
            rc = refused(rc, w.len);
    } else if (rc == CAIRN_ENOMEM && clamped) {
        rc = CAIRN_ELIMIT; /* the encoding passed the limit */
    }
    if (rc)
        free(mem);
    return rc;
}
