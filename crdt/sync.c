/*
 * The Bloom-filter sync protocol (see sync.h for the model).
 *
 * Each side keeps, per peer: the heads it last had in common with the peer
 * (shared), the peer's last reported heads, need and filter, and which of
 * its own changes it already sent and has not seen acknowledged (a bitmap
 * over apply-order indices, so a hostile peer cannot degrade it). What the
 * peer lacks is computed exactly when all its heads are known to us
 * (everything that is not an ancestor of them); otherwise from its filter:
 * every change since the filter's base that the filter does not contain,
 * plus all their descendants, in apply order, so the receiver can apply them
 * in one pass. A false positive hides a change only if no ancestor of it
 * since the base was sent; it comes back as a missing dependency or an
 * unknown head, which the receiver puts in its next need.
 *
 * A filter is only sent while the peer has heads we do not know (it is the
 * peer's way to find what we lack); its base is the shared heads plus the
 * peer's heads we know, so after the first exchange it covers only the
 * changes since the last sync.
 *
 * A session without any common base (new peer, lost state) would have to
 * put the whole history in its first filter. Instead, when that history is
 * longer than sample_min_changes (512: below it a filter, 1.25 bytes per
 * change, is cheaper than a sample, 32 bytes per step), the first message
 * carries a sample: the changes 1, 2, 4, 8, ... back from the end of our
 * apply order (and the first one), about log2(n) hashes. Every sampled
 * change the peer knows is common, so the peer's answer already has a small
 * filter (its base: the known sample), whose base we adopt in turn. This
 * costs half a round trip once per session and saves 1.25 bytes per change
 * of history each way.
 *
 * Loss. A change is sent once and then counted as in flight until the
 * peer's heads show it; nothing is retransmitted on a timer of our own.
 * Requests by hash (need) are always answered, so a lost change the peer
 * knows of comes back; anything else waits for cairn_sync_reset (the
 * caller's timer) or the peer's hello after it restarts.
 *
 * WIRE FORMAT (version 2). varint = unsigned LEB128, minimal (no trailing
 * 0x80 groups), at most 10 bytes, value < 2^64. hash = 32 raw bytes.
 *
 *   size        field
 *   1           version = 0x02                        (else EBADVERSION)
 *   1           flags: bit 0 = filter present, bit 1 = sample present,
 *               bit 2 = hello (the sender's state for the receiver is new
 *               or was reset and has not heard from it since: the
 *               receiver forgets what it has in flight),
 *               bit 3 = the heads are the last change carried (below);
 *               the other bits are 0                  (else ENONCANON)
 *   -- unless flags bit 3:
 *   varint      nheads   (<= max_heads)
 *   32*nheads   heads, strictly ascending bytewise    (else EUNSORTED)
 *   -- always:
 *   varint      nneed    (<= max_need)
 *   32*nneed    need, strictly ascending
 *   -- only if flags bit 1:
 *   varint      nsample  (<= CAIRN_SYNC_MAX_SAMPLE)
 *   32*nsample  sample, strictly ascending
 *   -- only if flags bit 0:
 *   varint      nsince   (<= max_heads)
 *   32*nsince   since (filter base), strictly ascending
 *   1           probes   (1..32)
 *   16          salt     (SipHash key of the probes, see bloom.h)
 *   varint      nbytes   (<= max_filter_bytes)
 *   nbytes      filter bits (bit i = bit i%8 of byte i/8)
 *   -- always:
 *   varint      nchanges (<= max_changes)
 *   nchanges x  { varint tag = len << 1 | p (len >= 1); len bytes: p = 0:
 *                 one change's canonical encoding (change.h, at most
 *                 CAIRN_CHANGE_MAX_BYTES); p = 1: that encoding less one
 *                 dependency, the id of the change just before it in this
 *                 message, cut out of the deps where it sorts (the deps
 *                 count still counts it; at most CAIRN_CHANGE_MAX_BYTES
 *                 once it is put back) }
 *
 * Nothing may follow (ENONCANON); the whole message is <= max_msg_bytes
 * (ELIMIT), every count is checked against its limit and against the bytes
 * left (ETRUNCATED) before anything is allocated. A change's id is never
 * sent: the receiver computes it from the bytes, with a cut-out dependency
 * put back, and those bytes must be the change's canonical encoding (the
 * change decoder's verdict otherwise).
 *
 * Version 2's two abbreviations are what a push is: a run of one author's
 * changes, each depending on the one before, reported as the heads. One
 * spelling each, so a message still has one encoding: bit 3 is set exactly
 * when the heads are the one id of the last change carried (ENONCANON
 * otherwise, and with no change), and p = 1 exactly when the change depends
 * on the one before it (ENONCANON on the first change, and on a change in
 * full whose deps name the one before). A push of k chained changes so
 * costs 32 * k bytes less than in version 1: about a fifth of a put's
 * change (bench figure d).
 */
#include "crdt/sync.h"

#include <stdlib.h>
#include <string.h>

#include "crdt/dag.h"
#include "crdt/error.h"
#include "crdt/wire.h"

#define STATE_VERSION 0x01

struct cairn_sync_state {
    cairn_sync_limits lim;
    cairn_hash *shared;
    size_t nshared;
    int their_valid; /* a message from the peer arrived */
    cairn_hash *their;
    size_t ntheir;
    cairn_hash *their_need;
    size_t ntheir_need;
    int have_filter;
    cairn_hash *their_since;
    size_t ntheir_since;
    cairn_bloom their_filter; /* owned copy */
    int their_changed;        /* their heads changed since our last filter */
    int sent_any;             /* a message went out since new/reset */
    int sample_sent;          /* our sample went out since new/reset */
    int poke;                 /* the peer said hello: answer even if idle */
    int heard;                /* a message arrived since new/reset */
    cairn_hash *last_heads;
    size_t nlast_heads;
    cairn_hash *last_need;
    size_t nlast_need;
    uint8_t *sent;      /* bitmap over our apply indices: sent, not acknowledged */
    uint64_t floor;     /* every change below it is an ancestor of the peer's */
    uint64_t lag_floor; /* the same, for cairn_sync_lag; lowered on hello only */
    size_t sent_bytes;
    /* The last message's filter base and sample, sorted: hashes the peer
     * has, common as soon as we have them too (cairn_sync_applied). */
    cairn_hash *recv_common;
    size_t nrecv_common;
    /* The peer's last message carried changes: it is sending, so the heads
     * it named are on their way; the next generate does not ask for them. */
    int grace;
    /* cairn_sync_tick was called: changes of other authors at apply index
     * >= relay_cut are held back (see cairn_sync_tick). */
    int relay_defer;
    uint64_t relay_cut;
    uint64_t tick_count; /* the DAG's count at the last tick */
    int heard_since_tick;
    int moved_since_tick; /* the peer named new heads since the last tick */
    /* With ticks, news of our heads alone waits for the tick unless the
     * peer's last message asks for an answer (it carried changes: an
     * acknowledgement; or need, filter, sample, hello). */
    int tick_due;
    int want_answer;
    int wanted; /* the last message received asked for an answer */
};

int cairn_sync_wants_answer(const cairn_sync_state *s)
{
    return s->wanted || !s->relay_defer;
}

void cairn_sync_limits_default(cairn_sync_limits *l)
{
    l->max_msg_bytes = 80u << 20;
    l->max_heads = 4096;
    l->max_need = 4096;
    l->max_changes = 4096;
    l->max_filter_bytes = 4u << 20;
    l->target_msg_bytes = 1u << 20;
    l->bloom_bits_per_entry = 10;
    l->bloom_probes = 7;
    l->sample_min_changes = 512;
}

/* ---- small helpers ------------------------------------------------------ */

static int hash_cmp_q(const void *a, const void *b)
{
    return cairn_hash_cmp(a, b);
}

static int u64_cmp_q(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts and removes duplicates in place; returns the new count. */
static size_t hashes_normalise(cairn_hash *h, size_t n)
{
    if (n < 2)
        return n;
    qsort(h, n, sizeof *h, hash_cmp_q);
    size_t w = 1;
    for (size_t i = 1; i < n; i++)
        if (cairn_hash_cmp(&h[i], &h[w - 1]) != 0)
            h[w++] = h[i];
    return w;
}

static int hashes_eq(const cairn_hash *a, size_t na, const cairn_hash *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* *dst = copy of src[0..n). */
static int hashes_set(cairn_hash **dst, size_t *ndst, const cairn_hash *src, size_t n)
{
    cairn_hash *p = NULL;
    if (n) {
        p = malloc(n * sizeof *p);
        if (!p)
            return CAIRN_ENOMEM;
        memcpy(p, src, n * sizeof *p);
    }
    free(*dst);
    *dst = p;
    *ndst = n;
    return 0;
}

static int hashes_contain(const cairn_hash *h, size_t n, const cairn_hash *x)
{
    return n && bsearch(x, h, n, sizeof *h, hash_cmp_q) != NULL;
}

static int is_ordered(const cairn_dag *d, const cairn_hash *h)
{
    uint64_t i;
    return cairn_dag_find(d, h, &i) == 0;
}

static int bit_get(const uint8_t *b, size_t nbytes, uint64_t i)
{
    return (i >> 3) < nbytes && (b[i >> 3] >> (i & 7)) & 1;
}

static int sent_mark(cairn_sync_state *s, uint64_t i)
{
    if ((i >> 3) >= s->sent_bytes) {
        size_t nb = s->sent_bytes ? s->sent_bytes : 64;
        while (nb <= (i >> 3))
            nb *= 2;
        uint8_t *p = realloc(s->sent, nb);
        if (!p)
            return CAIRN_ENOMEM;
        memset(p + s->sent_bytes, 0, nb - s->sent_bytes);
        s->sent = p;
        s->sent_bytes = nb;
    }
    s->sent[i >> 3] |= (uint8_t)(1u << (i & 7));
    return 0;
}

/* ---- bytes in and out: crdt/wire.h ------------------------------------- */

static void put_hashes(wire_wr *o, const cairn_hash *h, size_t n)
{
    wire_uv_w(o, n);
    wire_bytes_w(o, h, n * sizeof *h);
}

static int strictly_sorted(const cairn_hash *h, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (cairn_hash_cmp(&h[i - 1], &h[i]) >= 0)
            return 0;
    return 1;
}

/* A list of hashes: count <= |max| (ELIMIT), bytes present (ETRUNCATED),
 * strictly ascending (EUNSORTED). *h points into the input. */
static int get_hashes(wire_rd *r, const uint8_t **h, size_t *n, uint64_t max)
{
    uint64_t c;
    int rc = wire_uv(r, &c);
    if (rc)
        return rc;
    if (c > max)
        return CAIRN_ELIMIT;
    if (c > wire_left(r) / CAIRN_HASH_LEN)
        return CAIRN_ETRUNCATED;
    *h = r->p;
    *n = (size_t)c;
    for (size_t i = 1; i < c; i++)
        if (memcmp(r->p + (i - 1) * CAIRN_HASH_LEN, r->p + i * CAIRN_HASH_LEN, CAIRN_HASH_LEN) >= 0)
            return CAIRN_EUNSORTED;
    r->p += c * CAIRN_HASH_LEN;
    return 0;
}

/* ---- message encode / decode --------------------------------------------- */

#define FLAG_FILTER 1
#define FLAG_SAMPLE 2
#define FLAG_HELLO 4
#define FLAG_HEADS_LAST 8 /* the heads are the last change carried */

/* The most bytes a change of |len| bytes takes in a message: its tag and
 * its bytes (less when a dependency is cut out). */
static size_t change_wire_max(size_t len)
{
    return wire_uv_len((uint64_t)len << 1) + len;
}

/* Where the deps of change bytes |b| start (*at) and how many the count
 * says (*n): after the version byte, the author, seq, start_op and time_ms
 * (change.c's table). The varint reader's codes on bytes that end early or
 * are overlong. */
static int change_deps_at(size_t *at, uint64_t *n, const uint8_t *b, size_t len)
{
    if (len < 1 + CAIRN_ACTOR_LEN)
        return CAIRN_ETRUNCATED;
    wire_rd r = wire_rd_of(b + 1 + CAIRN_ACTOR_LEN, len - 1 - CAIRN_ACTOR_LEN);
    uint64_t v = 0;
    for (int i = 0; i < 4; i++) { /* seq, start_op, time_ms, ndeps */
        int rc = wire_uv(&r, &v);
        if (rc)
            return rc;
    }
    *at = (size_t)(r.p - b);
    *n = v;
    return 0;
}

/* The offset in canonical change bytes |b| of the dependency |prev|, or 0
 * if it is not one of its deps (a dependency never starts at offset 0). */
static size_t dep_offset(const uint8_t *b, size_t len, const cairn_hash *prev)
{
    size_t at;
    uint64_t n;
    if (change_deps_at(&at, &n, b, len) || n > (len - at) / CAIRN_HASH_LEN)
        return 0;
    for (uint64_t i = 0; i < n; i++) {
        int c = memcmp(b + at + i * CAIRN_HASH_LEN, prev->b, CAIRN_HASH_LEN);
        if (c == 0)
            return at + (size_t)i * CAIRN_HASH_LEN;
        if (c > 0)
            break; /* sorted: it is not there */
    }
    return 0;
}

/* A p = 1 change's bytes |b| with |prev| put back into its deps where it
 * sorts, in |*buf| (grown as needed; the caller frees it), *outlen long:
 * bytes for the change decoder to judge. ENONCANON when the deps count is
 * 0 (nothing was cut out), ELIMIT over CAIRN_CHANGE_MAX_DEPS, ETRUNCATED
 * when the deps left are not all there, ENOMEM. */
static int change_uncut(uint8_t **buf, size_t *cap, size_t *outlen, const uint8_t *b, size_t len,
                        const cairn_hash *prev)
{
    size_t at;
    uint64_t n;
    int rc = change_deps_at(&at, &n, b, len);
    if (rc)
        return rc;
    if (n == 0)
        return CAIRN_ENONCANON;
    if (n > CAIRN_CHANGE_MAX_DEPS)
        return CAIRN_ELIMIT;
    if (n - 1 > (len - at) / CAIRN_HASH_LEN)
        return CAIRN_ETRUNCATED;
    size_t k = 0; /* the deps that sort before |prev| */
    while (k < n - 1 && memcmp(b + at + k * CAIRN_HASH_LEN, prev->b, CAIRN_HASH_LEN) < 0)
        k++;
    if (*cap < len + CAIRN_HASH_LEN) {
        uint8_t *p = realloc(*buf, len + CAIRN_HASH_LEN);
        if (!p)
            return CAIRN_ENOMEM;
        *buf = p;
        *cap = len + CAIRN_HASH_LEN;
    }
    size_t cut = at + k * CAIRN_HASH_LEN;
    memcpy(*buf, b, cut);
    memcpy(*buf + cut, prev->b, CAIRN_HASH_LEN);
    memcpy(*buf + cut + CAIRN_HASH_LEN, b + cut, len - cut);
    *outlen = len + CAIRN_HASH_LEN;
    return 0;
}

/* Bit 3's condition: the heads are the one id of the last change. */
static int heads_are_last(const cairn_sync_msg *m)
{
    return m->nchanges && m->nheads == 1 &&
           cairn_hash_cmp(&m->heads[0], &m->changes[m->nchanges - 1]->hash) == 0;
}

/* Changes are written from their ->bytes, and their ->hash names them to
 * the next one (a change depending on the one before it is cut). */
static int encode_msg(uint8_t **out, size_t *len, const cairn_sync_msg *m)
{
    wire_wr o = {0};
    int last = heads_are_last(m);
    wire_u8_w(&o, CAIRN_SYNC_VERSION);
    wire_u8_w(&o, (uint8_t)((m->has_filter ? FLAG_FILTER : 0) | (m->has_sample ? FLAG_SAMPLE : 0) |
                            (m->hello ? FLAG_HELLO : 0) | (last ? FLAG_HEADS_LAST : 0)));
    if (!last)
        put_hashes(&o, m->heads, m->nheads);
    put_hashes(&o, m->need, m->nneed);
    if (m->has_sample)
        put_hashes(&o, m->sample, m->nsample);
    if (m->has_filter) {
        put_hashes(&o, m->since, m->nsince);
        wire_u8_w(&o, (uint8_t)m->filter.probes);
        wire_bytes_w(&o, m->filter.salt, CAIRN_BLOOM_SALT_LEN);
        wire_uv_w(&o, m->filter.nbytes);
        wire_bytes_w(&o, m->filter.bits, m->filter.nbytes);
    }
    wire_uv_w(&o, m->nchanges);
    for (size_t i = 0; i < m->nchanges; i++) {
        const cairn_change *c = m->changes[i];
        size_t cut = i ? dep_offset(c->bytes, c->len, &m->changes[i - 1]->hash) : 0;
        if (cut) {
            wire_uv_w(&o, (uint64_t)(c->len - CAIRN_HASH_LEN) << 1 | 1);
            wire_bytes_w(&o, c->bytes, cut);
            wire_bytes_w(&o, c->bytes + cut + CAIRN_HASH_LEN, c->len - cut - CAIRN_HASH_LEN);
        } else {
            wire_uv_w(&o, (uint64_t)c->len << 1);
            wire_bytes_w(&o, c->bytes, c->len);
        }
    }
    if (o.err) {
        free(o.p);
        return o.err;
    }
    *out = o.p;
    *len = o.len;
    return 0;
}

int cairn_sync_msg_encode(uint8_t **out, size_t *len, const cairn_sync_msg *m)
{
    *out = NULL;
    *len = 0;
    if (!strictly_sorted(m->heads, m->nheads) || !strictly_sorted(m->need, m->nneed))
        return CAIRN_EINVAL;
    if (m->has_sample && !strictly_sorted(m->sample, m->nsample))
        return CAIRN_EINVAL;
    if (m->has_filter && (!strictly_sorted(m->since, m->nsince) || m->filter.probes == 0 ||
                          m->filter.probes > CAIRN_BLOOM_MAX_PROBES))
        return CAIRN_EINVAL;
    for (size_t i = 0; i < m->nchanges; i++)
        if (!m->changes[i] || !m->changes[i]->bytes || m->changes[i]->len == 0)
            return CAIRN_EINVAL;
    return encode_msg(out, len, m);
}

/* A validated message whose variable parts point into the input. */
struct view {
    const uint8_t *heads, *need, *sample, *since, *bits, *salt;
    size_t nheads, nneed, nsample, nsince, nbytes;
    uint32_t probes;
    int has_filter, has_sample, hello, heads_last;
    const uint8_t *changes; /* the first change's length varint */
    size_t nchanges;
    size_t changes_len;
};

static int parse(struct view *v, const uint8_t *buf, size_t len, const cairn_sync_limits *l)
{
    memset(v, 0, sizeof *v);
    if (len > l->max_msg_bytes)
        return CAIRN_ELIMIT;
    wire_rd r = wire_rd_of(buf, len);
    if (wire_left(&r) < 2)
        return CAIRN_ETRUNCATED;
    if (buf[0] != CAIRN_SYNC_VERSION)
        return CAIRN_EBADVERSION;
    if (buf[1] & ~15u)
        return CAIRN_ENONCANON;
    v->hello = !!(buf[1] & FLAG_HELLO);
    v->has_filter = !!(buf[1] & FLAG_FILTER);
    v->has_sample = !!(buf[1] & FLAG_SAMPLE);
    v->heads_last = !!(buf[1] & FLAG_HEADS_LAST);
    r.p += 2;
    int rc;
    if (v->heads_last)
        v->nheads = 1; /* the last change's id, once it is decoded (build) */
    else if ((rc = get_hashes(&r, &v->heads, &v->nheads, l->max_heads)))
        return rc;
    if ((rc = get_hashes(&r, &v->need, &v->nneed, l->max_need)))
        return rc;
    if (v->has_sample && (rc = get_hashes(&r, &v->sample, &v->nsample, CAIRN_SYNC_MAX_SAMPLE)))
        return rc;
    if (v->has_filter) {
        if ((rc = get_hashes(&r, &v->since, &v->nsince, l->max_heads)))
            return rc;
        if (wire_left(&r) < 1 + CAIRN_BLOOM_SALT_LEN)
            return CAIRN_ETRUNCATED;
        v->probes = r.p[0];
        if (v->probes == 0 || v->probes > CAIRN_BLOOM_MAX_PROBES)
            return CAIRN_ENONCANON;
        v->salt = r.p + 1;
        r.p += 1 + CAIRN_BLOOM_SALT_LEN;
        uint64_t nb;
        if ((rc = wire_uv(&r, &nb)))
            return rc;
        if (nb > l->max_filter_bytes)
            return CAIRN_ELIMIT;
        if (nb > wire_left(&r))
            return CAIRN_ETRUNCATED;
        v->bits = r.p;
        v->nbytes = (size_t)nb;
        r.p += nb;
    }
    uint64_t nc;
    if ((rc = wire_uv(&r, &nc)))
        return rc;
    if (nc > l->max_changes)
        return CAIRN_ELIMIT;
    if (nc > wire_left(&r) / 2) /* each change takes at least 2 bytes */
        return CAIRN_ETRUNCATED;
    if (v->heads_last && nc == 0)
        return CAIRN_ENONCANON; /* no last change to be the heads */
    v->changes = r.p;
    v->nchanges = (size_t)nc;
    for (uint64_t i = 0; i < nc; i++) {
        uint64_t tag;
        if ((rc = wire_uv(&r, &tag)))
            return rc;
        uint64_t cl = tag >> 1, cut = tag & 1;
        if (cl == 0 || (cut && i == 0)) /* the first has no change before it */
            return CAIRN_ENONCANON;
        if (cl > CAIRN_CHANGE_MAX_BYTES - (cut ? CAIRN_HASH_LEN : 0))
            return CAIRN_ELIMIT;
        if (cl > wire_left(&r))
            return CAIRN_ETRUNCATED;
        r.p += cl;
    }
    v->changes_len = (size_t)(r.p - v->changes);
    if (wire_left(&r))
        return CAIRN_ENONCANON; /* trailing bytes */
    return 0;
}

void cairn_sync_msg_destroy(cairn_sync_msg *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nchanges; i++)
        if (m->changes && m->changes[i])
            cairn_change_free(m->changes[i]);
    free(m->changes);
    free(m->heads);
    free(m->need);
    free(m->sample);
    free(m->since);
    cairn_bloom_destroy(&m->filter);
    memset(m, 0, sizeof *m);
}

static int copy_hashes(cairn_hash **out, const uint8_t *src, size_t n)
{
    *out = NULL;
    if (!n)
        return 0;
    *out = malloc(n * sizeof **out);
    if (!*out)
        return CAIRN_ENOMEM;
    memcpy(*out, src, n * sizeof **out);
    return 0;
}

/* Builds an owning message from a parsed view: every change is decoded (its
 * hash computed from its bytes) before anything is returned. */
static int build(cairn_sync_msg *m, const struct view *v)
{
    memset(m, 0, sizeof *m);
    m->hello = v->hello;
    uint8_t *whole = NULL; /* a cut change's bytes, its dependency put back */
    size_t cap = 0;
    int rc;
    if (!v->heads_last) {
        if ((rc = copy_hashes(&m->heads, v->heads, v->nheads)))
            goto fail;
        m->nheads = v->nheads;
    }
    if ((rc = copy_hashes(&m->need, v->need, v->nneed)))
        goto fail;
    m->nneed = v->nneed;
    if (v->has_sample) {
        m->has_sample = 1;
        if ((rc = copy_hashes(&m->sample, v->sample, v->nsample)))
            goto fail;
        m->nsample = v->nsample;
    }
    if (v->has_filter) {
        m->has_filter = 1;
        if ((rc = copy_hashes(&m->since, v->since, v->nsince)))
            goto fail;
        m->nsince = v->nsince;
        if (v->nbytes) {
            uint8_t *bits = malloc(v->nbytes);
            if (!bits) {
                rc = CAIRN_ENOMEM;
                goto fail;
            }
            memcpy(bits, v->bits, v->nbytes);
            cairn_bloom_view(&m->filter, bits, v->nbytes, v->probes, v->salt);
            m->filter.owned_ = 1;
        } else {
            cairn_bloom_view(&m->filter, NULL, 0, v->probes, v->salt);
        }
    }
    if (v->nchanges) {
        m->changes = calloc(v->nchanges, sizeof *m->changes);
        if (!m->changes) {
            rc = CAIRN_ENOMEM;
            goto fail;
        }
        wire_rd r = wire_rd_of(v->changes, v->changes_len);
        for (size_t i = 0; i < v->nchanges; i++) {
            uint64_t tag = 0;
            wire_uv(&r, &tag); /* validated by parse() */
            size_t cl = (size_t)(tag >> 1), wl;
            const cairn_hash *prev = i ? &m->changes[i - 1]->hash : NULL;
            if (tag & 1) { /* parse(): never the first */
                if ((rc = change_uncut(&whole, &cap, &wl, r.p, cl, prev)))
                    goto fail;
                rc = cairn_change_decode(&m->changes[i], whole, wl, NULL);
            } else {
                rc = cairn_change_decode(&m->changes[i], r.p, cl, NULL);
            }
            m->nchanges = i + 1;
            if (rc)
                goto fail;
            const cairn_change *c = m->changes[i];
            if (!(tag & 1) && prev && hashes_contain(c->deps, c->ndeps, prev)) {
                rc = CAIRN_ENONCANON; /* it should have been cut */
                goto fail;
            }
            r.p += cl;
        }
    }
    if (v->heads_last) {
        if ((rc = copy_hashes(&m->heads, m->changes[m->nchanges - 1]->hash.b, 1)))
            goto fail;
        m->nheads = 1;
    } else if (heads_are_last(m)) {
        rc = CAIRN_ENONCANON; /* bit 3 says it */
        goto fail;
    }
    free(whole);
    return 0;
fail:
    free(whole);
    cairn_sync_msg_destroy(m);
    return rc;
}

int cairn_sync_msg_decode(cairn_sync_msg *out, const uint8_t *buf, size_t len,
                          const cairn_sync_limits *limits)
{
    cairn_sync_limits def;
    if (!limits) {
        cairn_sync_limits_default(&def);
        limits = &def;
    }
    memset(out, 0, sizeof *out);
    struct view v;
    int rc = parse(&v, buf, len, limits);
    if (rc)
        return rc;
    return build(out, &v);
}

/* ---- state ------------------------------------------------------------- */

int cairn_sync_state_new(cairn_sync_state **out, const cairn_sync_limits *limits)
{
    *out = NULL;
    cairn_sync_limits l;
    if (limits)
        l = *limits;
    else
        cairn_sync_limits_default(&l);
    if (l.max_msg_bytes < 64 || l.max_heads == 0 || l.max_changes == 0 ||
        l.bloom_bits_per_entry == 0 || l.bloom_probes == 0 ||
        l.bloom_probes > CAIRN_BLOOM_MAX_PROBES)
        return CAIRN_EINVAL;
    cairn_sync_state *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    s->lim = l;
    *out = s;
    return 0;
}

void cairn_sync_state_free(cairn_sync_state *s)
{
    if (!s)
        return;
    free(s->shared);
    free(s->their);
    free(s->their_need);
    free(s->their_since);
    cairn_bloom_destroy(&s->their_filter);
    free(s->last_heads);
    free(s->last_need);
    free(s->sent);
    free(s->recv_common);
    free(s);
}

int cairn_sync_state_save(uint8_t **out, size_t *len, const cairn_sync_state *s)
{
    *out = NULL;
    *len = 0;
    wire_wr o = {0};
    wire_u8_w(&o, STATE_VERSION);
    put_hashes(&o, s->shared, s->nshared);
    if (o.err) {
        free(o.p);
        return o.err;
    }
    *out = o.p;
    *len = o.len;
    return 0;
}

int cairn_sync_state_load(cairn_sync_state **out, const uint8_t *buf, size_t len,
                          const cairn_sync_limits *limits)
{
    *out = NULL;
    cairn_sync_state *s;
    int rc = cairn_sync_state_new(&s, limits);
    if (rc)
        return rc;
    wire_rd r = wire_rd_of(buf, len);
    const uint8_t *h;
    size_t n;
    if (wire_left(&r) < 1)
        rc = CAIRN_ETRUNCATED;
    else if (buf[0] != STATE_VERSION)
        rc = CAIRN_EBADVERSION;
    if (!rc) {
        r.p++;
        rc = get_hashes(&r, &h, &n, s->lim.max_heads);
    }
    if (!rc && wire_left(&r))
        rc = CAIRN_ENONCANON;
    if (!rc && (rc = copy_hashes(&s->shared, h, n)) == 0)
        s->nshared = n;
    if (rc) {
        cairn_sync_state_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void cairn_sync_reset(cairn_sync_state *s)
{
    s->sent_any = 0;
    s->sample_sent = 0;
    s->heard = 0;
    free(s->last_heads);
    s->last_heads = NULL;
    s->nlast_heads = 0;
    free(s->last_need);
    s->last_need = NULL;
    s->nlast_need = 0;
    if (s->sent)
        memset(s->sent, 0, s->sent_bytes);
    s->their_changed = 1;
    s->grace = 0;
    s->relay_cut = 0;
    s->tick_count = 0;
    s->heard_since_tick = 0;
    s->moved_since_tick = 0;
    s->floor = 0;
}

void cairn_sync_tick(cairn_sync_state *s, const cairn_doc *doc)
{
    s->relay_defer = 1;
    s->tick_due = 1;
    /* Relay only to a peer that spoke and stood still for a period: one
     * whose heads move is being fed by someone (the author, mostly). */
    if (s->heard_since_tick && !s->moved_since_tick)
        s->relay_cut = s->tick_count;
    s->moved_since_tick = 0;
    s->tick_count = cairn_dag_count(cairn_doc_dag(doc));
    s->heard_since_tick = 0;
}

size_t cairn_sync_their_heads(const cairn_sync_state *s, const cairn_hash **heads)
{
    *heads = s->their;
    return s->ntheir;
}

size_t cairn_sync_shared_heads(const cairn_sync_state *s, const cairn_hash **heads)
{
    *heads = s->shared;
    return s->nshared;
}

/* Every peer head is an ordered change here: we can compute exactly what
 * the peer lacks. */
static int their_all_known(const cairn_dag *d, const cairn_sync_state *s)
{
    if (!s->their_valid)
        return 0;
    for (size_t i = 0; i < s->ntheir; i++)
        if (!is_ordered(d, &s->their[i]))
            return 0;
    return 1;
}

/* Hashes the peer surely has: |a| plus the peer's heads we have ordered,
 * sorted and unique, at most |max| (the peer heads win if it overflows). */
static int peer_base(cairn_hash **out, size_t *n, const cairn_dag *d, const cairn_sync_state *s,
                     const cairn_hash *a, size_t na, size_t max)
{
    *out = NULL;
    *n = 0;
    size_t cap = na + s->ntheir;
    if (!cap)
        return 0;
    cairn_hash *b = malloc(cap * sizeof *b);
    if (!b)
        return CAIRN_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < s->ntheir; i++)
        if (is_ordered(d, &s->their[i]))
            b[k++] = s->their[i];
    if (na && k + na <= max) {
        memcpy(b + k, a, na * sizeof *b);
        k += na;
    }
    k = hashes_normalise(b, k);
    if (k > max)
        k = max; /* any subset of common hashes is still a valid base */
    *out = b;
    *n = k;
    return 0;
}

/*
 * What the peer has acknowledged is every ordered ancestor of its last
 * reported heads and of our shared heads (peer_base). As in
 * changes_to_send, the walk stops at lag_floor, below which everything is
 * known to be acknowledged, and the floor then moves up over the prefix
 * the peer has: a call costs about the changes since the peer's
 * acknowledged prefix (one bit each, and the ancestors marked above it),
 * not the history. The acknowledged set only grows while the peer stays
 * the same copy, so only its hello lowers the floor again (a reset,
 * which is about messages in flight, does not).
 */
int cairn_sync_lag(uint64_t *nlag, uint64_t *first, cairn_sync_state *s, const cairn_doc *doc)
{
    *nlag = 0;
    *first = 0;
    if (!s->their_valid)
        return CAIRN_ENOTFOUND;
    const cairn_dag *d = cairn_doc_dag(doc);
    uint64_t count = cairn_dag_count(d);
    uint64_t floor = s->lag_floor <= count ? s->lag_floor : 0;
    cairn_hash *base = NULL;
    size_t nbase = 0;
    int rc = peer_base(&base, &nbase, d, s, s->shared, s->nshared, SIZE_MAX);
    if (rc)
        return rc;
    uint64_t *anc = calloc((size_t)((count - floor) / 64 + 1), sizeof *anc);
    if (!anc) {
        free(base);
        return CAIRN_ENOMEM;
    }
    if (nbase)
        rc = cairn_dag_mark_ancestors(anc, d, base, nbase, floor);
    free(base);
    if (!rc) {
#define LAG_BIT(i) (anc[((i)-floor) >> 6] >> (((i)-floor) & 63) & 1)
        uint64_t w = floor, n = 0;
        while (w < count && LAG_BIT(w))
            w++;
        s->lag_floor = w;
        for (uint64_t i = w; i < count; i++)
            n += !LAG_BIT(i);
#undef LAG_BIT
        *nlag = n;
        *first = w;
    }
    free(anc);
    return rc;
}

/* What we ask the peer for: dependencies of our pending changes that we do
 * not have at all, and peer heads we have never seen. */
static int compute_need(cairn_hash **out, size_t *n, const cairn_dag *d, const cairn_sync_state *s,
                        int grace)
{
    cairn_hash *miss = NULL;
    size_t nmiss = 0;
    int rc = cairn_dag_missing(&miss, &nmiss, d);
    if (rc)
        return rc;
    size_t cap = nmiss + (grace ? 0 : s->ntheir);
    cairn_hash *all = cap ? malloc(cap * sizeof *all) : NULL;
    if (cap && !all) {
        free(miss);
        return CAIRN_ENOMEM;
    }
    if (nmiss)
        memcpy(all, miss, nmiss * sizeof *all);
    free(miss);
    size_t k = nmiss;
    for (size_t i = 0; !grace && i < s->ntheir; i++)
        if (cairn_dag_has(d, &s->their[i]) == 0)
            all[k++] = s->their[i];
    k = hashes_normalise(all, k);
    if (k > s->lim.max_need)
        k = s->lim.max_need;
    *out = all;
    *n = k;
    return 0;
}

/*
 * Apply-order indices of the changes to send now, ascending: the first
 * max_changes the peer lacks that are not in flight, then what it asked for
 * by hash. What it lacks is every change that is not an ancestor of its
 * heads, when we know them all; otherwise every change since the filter's
 * base that the filter does not contain, and their descendants.
 *
 * Cost. Everything below s->floor is known to be an ancestor of what the
 * peer has (it only ever gains changes within a session), so the walk marks
 * only the peer's ancestors above it, and the floor then moves up over the
 * prefix the peer has. The scan stops at max_changes. So a round costs
 * about what the peer lacks and what is in flight, up to one message, not
 * the history nor the whole backlog of a peer far behind.
 */
static int changes_to_send(uint64_t **out, size_t *n, const cairn_dag *d, cairn_sync_state *s)
{
    *out = NULL;
    *n = 0;
    uint64_t *cand = NULL, *anc = NULL, *mark = NULL;
    cairn_hash *base = NULL;
    size_t ncand = 0, nbase = 0;
    int rc = 0;
    uint64_t count = cairn_dag_count(d);
    int known = their_all_known(d, s);

    if (known || s->have_filter) {
        if (known)
            rc = hashes_set(&base, &nbase, s->their, s->ntheir);
        else
            rc = peer_base(&base, &nbase, d, s, s->their_since, s->ntheir_since,
                           s->ntheir + s->ntheir_since);
        if (rc)
            goto done;
        uint64_t floor = s->floor <= count ? s->floor : 0;
        size_t words = (size_t)((count - floor) / 64 + 1);
        anc = calloc(words, sizeof *anc);
        mark = known ? NULL : calloc(words, sizeof *mark);
        if (!anc || (!known && !mark)) {
            rc = CAIRN_ENOMEM;
            goto done;
        }
        if ((rc = cairn_dag_mark_ancestors(anc, d, base, nbase, floor)))
            goto done;
#define SPAN_BIT(b, i) ((b)[((i)-floor) >> 6] >> (((i)-floor) & 63) & 1)
        uint64_t w = floor;
        while (w < count && SPAN_BIT(anc, w))
            w++;
        s->floor = w;
        uint64_t cap = s->lim.max_changes, left = count - w;
        cand = malloc((size_t)(left < cap ? left : cap) * sizeof *cand + sizeof *cand);
        if (!cand) {
            rc = CAIRN_ENOMEM;
            goto done;
        }
        /* Not in the filter, or a descendant of one that is not. Indices are
         * a topological order, so deps are decided before their dependents;
         * a dep below the floor is the peer's. */
        uint64_t deps[CAIRN_CHANGE_MAX_DEPS];
        for (uint64_t i = w; i < count && ncand < cap; i++) {
            if (SPAN_BIT(anc, i))
                continue;
            if (!known) {
                int send = !cairn_bloom_contains(&s->their_filter, cairn_dag_hash_at(d, i));
                size_t nd = send ? 0 : cairn_dag_deps_at(deps, CAIRN_CHANGE_MAX_DEPS, d, i);
                for (size_t j = 0; !send && j < nd; j++)
                    if (deps[j] >= floor && SPAN_BIT(mark, deps[j]))
                        send = 1;
                if (!send)
                    continue;
                mark[(i - floor) >> 6] |= (uint64_t)1 << ((i - floor) & 63);
            }
            if (!bit_get(s->sent, s->sent_bytes, i)) /* in flight: not again */
                cand[ncand++] = i;
        }
#undef SPAN_BIT
    }

    /* Add what the peer asked for by hash. */
    if (s->ntheir_need) {
        uint64_t *nc = realloc(cand, (ncand + s->ntheir_need) * sizeof *nc);
        if (!nc) {
            rc = CAIRN_ENOMEM;
            goto done;
        }
        cand = nc;
        for (size_t i = 0; i < s->ntheir_need; i++) {
            uint64_t idx;
            if (cairn_dag_find(d, &s->their_need[i], &idx) == 0)
                cand[ncand++] = idx;
        }
        qsort(cand, ncand, sizeof *cand, u64_cmp_q);
        size_t k = 0;
        for (size_t i = 0; i < ncand; i++)
            if (k == 0 || cand[k - 1] != cand[i])
                cand[k++] = cand[i];
        ncand = k;
    }
    *out = cand;
    *n = ncand;
    cand = NULL;
done:
    free(cand);
    free(anc);
    free(mark);
    free(base);
    return rc;
}

static size_t hashes_wire(size_t n)
{
    return wire_uv_len(n) + n * CAIRN_HASH_LEN;
}

static void shells_free(cairn_change *sh, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(sh[i].bytes);
    free(sh);
}

/* 1 if change |idx| (canonical |bytes|) waits for a later tick: another
 * author's, come after the relay cut, and not asked for by hash. The author
 * is the encoding's bytes 1..16 (change.c). */
static int held_back(const cairn_sync_state *s, const cairn_dag *d, const cairn_actor *own,
                     uint64_t idx, const uint8_t *bytes, size_t len)
{
    if (!s->relay_defer || idx < s->relay_cut || !own)
        return 0;
    if (len > CAIRN_ACTOR_LEN && memcmp(bytes + 1, own->b, CAIRN_ACTOR_LEN) == 0)
        return 0;
    return !hashes_contain(s->their_need, s->ntheir_need, cairn_dag_hash_at(d, idx));
}

/* Loads from the DAG the prefix of |idx| that fits the limits, given |used|
 * bytes of header, leaving out what held_back() keeps for later (|idx| is
 * compacted to the indices taken): *out gets one shell per change (only
 * bytes, len and hash set; shells_free), *k their count. CAIRN_ELIMIT if even
 * the first change cannot fit a message; the DAG's load errors (CAIRN_EIO,
 * CAIRN_ECORRUPT). */
static int fit_changes(cairn_change **out, size_t *k, const cairn_dag *d,
                       const cairn_sync_state *s, const cairn_actor *own, uint64_t *idx, size_t n,
                       size_t used)
{
    const cairn_sync_limits *l = &s->lim;
    size_t total = used + 10, m = n < l->max_changes ? n : l->max_changes;
    *out = NULL;
    *k = 0;
    if (m == 0)
        return 0;
    cairn_change *sh = calloc(m, sizeof *sh);
    if (!sh)
        return CAIRN_ENOMEM;
    size_t i = 0;
    int rc = 0;
    for (size_t j = 0; i < m && j < n; j++) {
        if ((rc = cairn_dag_load_bytes(&sh[i].bytes, &sh[i].len, d, idx[j])))
            break;
        if (held_back(s, d, own, idx[j], sh[i].bytes, sh[i].len)) {
            free(sh[i].bytes);
            sh[i].bytes = NULL;
            continue;
        }
        idx[i] = idx[j];
        sh[i].hash = *cairn_dag_hash_at(d, idx[i]); /* the encoder's (a cut) */
        size_t sz = change_wire_max(sh[i].len);
        if ((i > 0 && total + sz > l->target_msg_bytes) || total + sz > l->max_msg_bytes) {
            if (i == 0)
                rc = CAIRN_ELIMIT;
            break;
        }
        total += sz;
        i++;
    }
    if (rc) {
        shells_free(sh, m);
        return rc;
    }
    for (size_t j = i; j < m; j++) { /* the one that did not fit */
        free(sh[j].bytes);
        sh[j].bytes = NULL;
    }
    *out = sh;
    *k = i;
    return 0;
}

/*
 * What a filter holds: our changes that are not ancestors of its base.
 * The peer sends back every change of its own since the base that the
 * filter lacks, so the filter is only worth the changes the peer may have;
 * those it lacks (a backlog we are sending it) cost a bloom entry each and
 * a walk over them every round, for nothing. Above the floor (below it the
 * peer has everything, and the base covers it), the peer has what reached
 * it from elsewhere: the other members stream the same backlog from the
 * same end and relay the newest changes, so the filter takes the oldest
 * and the newest max_changes of them. A change the peer has from the
 * middle of a larger backlog comes back once more: bytes, never a loss.
 * Costs the base's ancestors above the floor plus those entries.
 */
static int filter_entries(uint64_t **out, size_t *n, const cairn_dag *d, const cairn_sync_state *s,
                          const cairn_hash *base, size_t nbase)
{
    *out = NULL;
    *n = 0;
    uint64_t count = cairn_dag_count(d), floor = s->floor <= count ? s->floor : 0;
    size_t edge = s->lim.max_changes, k = 0;
    uint64_t *anc = calloc((size_t)((count - floor) / 64 + 1), sizeof *anc);
    uint64_t *v = malloc((2 * edge + 1) * sizeof *v);
    int rc = anc && v ? cairn_dag_mark_ancestors(anc, d, base, nbase, floor) : CAIRN_ENOMEM;
    if (rc) {
        free(anc);
        free(v);
        return rc;
    }
#define ANC(i) (anc[((i)-floor) >> 6] >> (((i)-floor) & 63) & 1)
    uint64_t i = floor;
    for (; i < count && k < edge; i++)
        if (!ANC(i))
            v[k++] = i;
    for (uint64_t j = count; j > i && k < 2 * edge;) {
        j--;
        if (!ANC(j))
            v[k++] = j;
    }
#undef ANC
    free(anc);
    *out = v;
    *n = k;
    return 0;
}

int cairn_sync_generate(uint8_t **out, size_t *len, const cairn_doc *doc, cairn_sync_state *s,
                        const uint8_t salt[CAIRN_BLOOM_SALT_LEN])
{
    *out = NULL;
    *len = 0;
    const cairn_dag *d = cairn_doc_dag(doc);
    const cairn_hash *heads;
    size_t nheads = cairn_dag_heads(d, &heads);
    if (nheads > s->lim.max_heads)
        return CAIRN_ELIMIT;

    cairn_hash *need = NULL, *base = NULL;
    size_t nneed = 0, nbase = 0, nsend = 0;
    uint64_t *send = NULL, *fidx = NULL;
    cairn_change **chg = NULL, *shells = NULL;
    cairn_sync_msg m = {0};
    cairn_hash sample[CAIRN_SYNC_MAX_SAMPLE];
    size_t nsample = 0;
    int rc;

    /* Right after a message that carried changes the peer's heads are
     * mostly on their way: answer with our heads, ask at the next round. */
    int grace = s->grace, answer = s->want_answer || s->tick_due || !s->relay_defer;
    s->grace = 0;
    s->want_answer = 0;
    s->tick_due = 0;
    if ((rc = compute_need(&need, &nneed, d, s, grace)))
        goto done;
    if ((rc = changes_to_send(&send, &nsend, d, s)))
        goto done;

    /* A filter is new information only when the peer's heads or ours moved
     * (or after a reset); the peer keeps the last one it got. */
    int want_filter =
        !grace && !their_all_known(d, s) && (s->their_changed || !s->sent_any ||
                                   !hashes_eq(heads, nheads, s->last_heads, s->nlast_heads));
    size_t used = 2 + hashes_wire(nheads) + hashes_wire(nneed);
    if (want_filter) {
        if ((rc = peer_base(&base, &nbase, d, s, s->shared, s->nshared, s->lim.max_heads)))
            goto done;
        size_t nf = 0;
        if (nbase)
            rc = filter_entries(&fidx, &nf, d, s, base, nbase);
        else
            rc = cairn_dag_not_ancestors(&fidx, &nf, d, base, nbase);
        if (rc)
            goto done;
        if (nbase == 0 && nf > s->lim.sample_min_changes && !s->sample_sent) {
            /* No common base yet: a sample instead of a whole-history filter. */
            uint64_t count = cairn_dag_count(d);
            for (unsigned i = 0; i < 64 && ((uint64_t)1 << i) - 1 < count; i++)
                sample[nsample++] =
                    *cairn_dag_hash_at(d, count - (uint64_t)1 - (((uint64_t)1 << i) - 1));
            sample[nsample++] = *cairn_dag_hash_at(d, 0);
            nsample = hashes_normalise(sample, nsample);
            m.has_sample = 1;
            m.sample = sample;
            m.nsample = nsample;
            used += hashes_wire(nsample);
            goto filter_done;
        }
        used += hashes_wire(nbase) + 1 + CAIRN_BLOOM_SALT_LEN + 10;
        size_t fmax = s->lim.max_filter_bytes;
        if (used + 64 < s->lim.max_msg_bytes && fmax > s->lim.max_msg_bytes - used - 64)
            fmax = s->lim.max_msg_bytes - used - 64;
        if ((rc = cairn_bloom_init(&m.filter, nf, s->lim.bloom_bits_per_entry, s->lim.bloom_probes,
                                   fmax, salt)))
            goto done;
        for (size_t i = 0; i < nf; i++)
            cairn_bloom_add(&m.filter, cairn_dag_hash_at(d, fidx[i]));
        used += m.filter.nbytes;
        m.has_filter = 1;
        m.since = base;
        m.nsince = nbase;
    }
filter_done:
    if (used > s->lim.max_msg_bytes) {
        rc = CAIRN_ELIMIT;
        goto done;
    }
    if ((rc = fit_changes(&shells, &nsend, d, s, cairn_doc_actor(doc), send, nsend, used)))
        goto done;

    int go = nsend > 0 || !s->sent_any ||
             (answer && !hashes_eq(heads, nheads, s->last_heads, s->nlast_heads)) ||
             !hashes_eq(need, nneed, s->last_need, s->nlast_need) || want_filter || s->poke;
    if (!go)
        goto done;

    if (nsend) {
        chg = malloc(nsend * sizeof *chg);
        if (!chg) {
            rc = CAIRN_ENOMEM;
            goto done;
        }
        /* The encoder only reads the changes' bytes; the message does not own
         * them. */
        for (size_t i = 0; i < nsend; i++)
            chg[i] = &shells[i];
    }
    /* Only a state that has neither sent nor heard anything says hello: a
     * reply to the peer's first message need not make it start over. */
    m.hello = !s->sent_any && !s->heard;
    m.heads = (cairn_hash *)heads;
    m.nheads = nheads;
    m.need = need;
    m.nneed = nneed;
    m.changes = chg;
    m.nchanges = nsend;
    if ((rc = encode_msg(out, len, &m)))
        goto done;
    for (size_t i = 0; i < nsend; i++)
        if ((rc = sent_mark(s, send[i])))
            goto fail_out;
    if ((rc = hashes_set(&s->last_heads, &s->nlast_heads, heads, nheads)) ||
        (rc = hashes_set(&s->last_need, &s->nlast_need, need, nneed)))
        goto fail_out;
    s->sent_any = 1;
    s->poke = 0;
    if (m.has_sample)
        s->sample_sent = 1;
    /* The peer's requests are answered (what we have of them is in this
     * message); it repeats any it still misses in its next message. */
    free(s->their_need);
    s->their_need = NULL;
    s->ntheir_need = 0;
    if (want_filter)
        s->their_changed = 0;
    goto done;
fail_out:
    free(*out);
    *out = NULL;
    *len = 0;
done:
    cairn_bloom_destroy(&m.filter);
    free(chg);
    if (shells)
        shells_free(shells, nsend);
    free(send);
    free(fidx);
    free(need);
    free(base);
    return rc;
}

int cairn_sync_push(uint8_t **out, size_t *len, size_t *npushed, const cairn_doc *doc,
                    cairn_sync_state *s, const cairn_change *const *changes, size_t n)
{
    const cairn_hash *heads;
    size_t nheads = cairn_dag_heads(cairn_doc_dag(doc), &heads);
    return cairn_sync_push_heads(out, len, npushed, doc, s, changes, n, heads, nheads);
}

int cairn_sync_push_heads(uint8_t **out, size_t *len, size_t *npushed, const cairn_doc *doc,
                          cairn_sync_state *s, const cairn_change *const *changes, size_t n,
                          const cairn_hash *heads, size_t nheads)
{
    *out = NULL;
    *len = 0;
    *npushed = 0;
    const cairn_dag *d = cairn_doc_dag(doc);
    if (nheads > s->lim.max_heads || !strictly_sorted(heads, nheads))
        return CAIRN_ELIMIT;
    uint64_t *idx = n ? malloc(n * sizeof *idx) : NULL;
    size_t *pos = n ? malloc(n * sizeof *pos) : NULL;
    if (n && (!idx || !pos)) {
        free(idx);
        free(pos);
        return CAIRN_ENOMEM;
    }
    size_t k = 0, taken = 0;
    int rc = 0;
    size_t used = 2 + hashes_wire(nheads) + hashes_wire(0) + 10, i;
    for (i = 0; i < n; i++) {
        uint64_t ix;
        if (cairn_dag_find(d, &changes[i]->hash, &ix) != 0) {
            rc = CAIRN_ENOTFOUND;
            goto done;
        }
        if (bit_get(s->sent, s->sent_bytes, ix))
            continue;
        if (k >= s->lim.max_changes)
            break;
        /* The caller's change is the ordered one (same hash): send its bytes. */
        const cairn_change *c = changes[i];
        size_t sz = change_wire_max(c->len);
        if ((k > 0 && used + sz > s->lim.target_msg_bytes) || used + sz > s->lim.max_msg_bytes)
            break;
        used += sz;
        pos[k] = i;
        idx[k++] = ix;
    }
    taken = i;
    if (k) {
        cairn_change **chg = malloc(k * sizeof *chg);
        if (!chg) {
            rc = CAIRN_ENOMEM;
            goto done;
        }
        for (size_t j = 0; j < k; j++)
            chg[j] = (cairn_change *)changes[pos[j]];
        cairn_sync_msg m = {0};
        m.heads = (cairn_hash *)heads;
        m.nheads = nheads;
        m.changes = chg;
        m.nchanges = k;
        rc = encode_msg(out, len, &m);
        free(chg);
        if (rc)
            goto done;
        for (size_t j = 0; j < k; j++)
            if ((rc = sent_mark(s, idx[j])))
                goto done;
        /* The peer learns these heads from the push: a later generate need
         * not repeat them. */
        if ((rc = hashes_set(&s->last_heads, &s->nlast_heads, heads, nheads)))
            goto done;
    }
    *npushed = taken;
done:
    if (rc) {
        free(*out);
        *out = NULL;
        *len = 0;
    }
    free(idx);
    free(pos);
    return rc;
}

/* Moves the shared heads forward with what the peer just told us. If we
 * know all its heads, they are the common point. Otherwise every hash of the
 * message that we have is common: its known heads, its filter base (hashes
 * it has and believes we have) and its known sample. */
static int advance_shared(cairn_sync_state *s, const cairn_dag *d, const cairn_sync_msg *m)
{
    size_t cap = s->nshared + m->nheads + m->nsince + m->nsample;
    if (!cap)
        return hashes_set(&s->shared, &s->nshared, NULL, 0);
    cairn_hash *b = malloc(cap * sizeof *b);
    if (!b)
        return CAIRN_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < m->nheads; i++)
        if (is_ordered(d, &m->heads[i]))
            b[k++] = m->heads[i];
    if (k < m->nheads) {
        for (size_t i = 0; i < m->nsince; i++)
            if (is_ordered(d, &m->since[i]))
                b[k++] = m->since[i];
        for (size_t i = 0; i < m->nsample; i++)
            if (is_ordered(d, &m->sample[i]))
                b[k++] = m->sample[i];
        k = hashes_normalise(b, k);
        /* Keep the old common point too, if it fits and nothing newer
         * was learnt (old points would pile up in every filter's base). */
        if (s->nshared && k == 0 &&
            k + s->nshared <= s->lim.max_heads) {
            memcpy(b + k, s->shared, s->nshared * sizeof *b);
            k = hashes_normalise(b, k + s->nshared);
        }
        if (k > s->lim.max_heads)
            k = s->lim.max_heads; /* any subset of common hashes will do */
    }
    free(s->shared);
    s->shared = b;
    s->nshared = k;
    return 0;
}

/* A stable topological order of a message's changes: each comes after the
 * changes of the same message it depends on, and otherwise keeps its place
 * (a generated message is already in the sender's apply order, so it stays
 * as it is). Changes whose dependencies are elsewhere are not held back:
 * the document buffers them. Duplicates keep their first place. Iterative
 * depth-first, so a hostile chain cannot exhaust the stack. */
struct pos {
    const cairn_hash *h;
    size_t i;
};

static int pos_cmp_q(const void *a, const void *b)
{
    const struct pos *x = a, *y = b;
    int c = cairn_hash_cmp(x->h, y->h);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

static int pos_hash_cmp_q(const void *a, const void *b)
{
    return cairn_hash_cmp(((const struct pos *)a)->h, ((const struct pos *)b)->h);
}

static int dep_order(cairn_change **c, size_t n)
{
    if (n < 2)
        return 0;
    struct pos *byh = malloc(n * sizeof *byh);
    size_t *stack = malloc(n * sizeof *stack), *dep = malloc(n * sizeof *dep);
    uint8_t *seen = calloc(n, 1);
    cairn_change **out = malloc(n * sizeof *out);
    int rc = CAIRN_ENOMEM;
    if (!byh || !stack || !dep || !seen || !out)
        goto done;
    for (size_t i = 0; i < n; i++)
        byh[i] = (struct pos){&c[i]->hash, i};
    qsort(byh, n, sizeof *byh, pos_cmp_q);
    size_t k = 0;
    for (size_t root = 0; root < n; root++) {
        if (seen[root])
            continue;
        size_t top = 0;
        stack[top] = root;
        dep[top++] = 0;
        seen[root] = 1;
        while (top) {
            size_t i = stack[top - 1];
            const cairn_change *ch = c[i];
            size_t next = n;
            while (dep[top - 1] < ch->ndeps && next == n) {
                struct pos key = {&ch->deps[dep[top - 1]++], 0};
                struct pos *hit = bsearch(&key, byh, n, sizeof *byh, pos_hash_cmp_q);
                if (!hit)
                    continue;
                while (hit > byh && cairn_hash_cmp(hit[-1].h, key.h) == 0)
                    hit--; /* the first copy */
                if (!seen[hit->i])
                    next = hit->i;
            }
            if (next == n) {
                out[k++] = c[i];
                top--;
            } else {
                seen[next] = 1;
                stack[top] = next;
                dep[top++] = 0;
            }
        }
    }
    memcpy(c, out, n * sizeof *c);
    rc = 0;
done:
    free(byh);
    free(stack);
    free(dep);
    free(seen);
    free(out);
    return rc;
}

/* The doc-dependent half of a receive, run on a receive (against what the
 * caller had applied before the message) and again on cairn_sync_applied
 * (against what it has applied since). */
static int settle(cairn_sync_state *s, const cairn_dag *d)
{
    cairn_sync_msg view = {0};
    view.heads = s->their;
    view.nheads = s->ntheir;
    view.since = s->recv_common;
    view.nsince = s->nrecv_common;
    int rc = advance_shared(s, d, &view);
    if (rc)
        return rc;
    const cairn_hash *heads;
    size_t nheads = cairn_dag_heads(d, &heads);
    if (hashes_eq(heads, nheads, s->their, s->ntheir) && s->sent)
        memset(s->sent, 0, s->sent_bytes); /* all acknowledged */
    return 0;
}

void cairn_sync_changes_free(cairn_change **changes, size_t n)
{
    for (size_t i = 0; changes && i < n; i++)
        cairn_change_free(changes[i]);
    free(changes);
}

int cairn_sync_receive_decode(cairn_sync_msg *m, const cairn_sync_state *s, const uint8_t *msg,
                              size_t len)
{
    int rc = cairn_sync_msg_decode(m, msg, len, &s->lim);
    if (!rc && (rc = dep_order(m->changes, m->nchanges)))
        cairn_sync_msg_destroy(m);
    return rc;
}

int cairn_sync_receive(cairn_change ***changes, size_t *nchanges, cairn_sync_state *s,
                       const cairn_doc *doc, const uint8_t *msg, size_t len)
{
    *changes = NULL;
    *nchanges = 0;
    cairn_sync_msg m;
    int rc = cairn_sync_receive_decode(&m, s, msg, len);
    return rc ? rc : cairn_sync_receive_msg(changes, nchanges, s, doc, &m);
}

int cairn_sync_receive_msg(cairn_change ***changes, size_t *nchanges, cairn_sync_state *s,
                           const cairn_doc *doc, cairn_sync_msg *mp)
{
    *changes = NULL;
    *nchanges = 0;
    cairn_sync_msg m = *mp;
    memset(mp, 0, sizeof *mp);
    int rc;
    /* Everything that can fail comes before the state changes. Common
     * ground once we have it: the filter base, the sample, and the last of
     * the changes carried (nothing else carried depends on it), so that a
     * peer always ahead of us (a stream of pushes) still moves the base of
     * our filters forward. */
    cairn_hash *common = NULL;
    size_t ncommon = m.nsince + m.nsample + (m.nchanges ? 1 : 0);
    if (ncommon) {
        if (!(common = malloc(ncommon * sizeof *common))) {
            rc = CAIRN_ENOMEM;
            goto done;
        }
        if (m.nsince)
            memcpy(common, m.since, m.nsince * sizeof *common);
        if (m.nsample)
            memcpy(common + m.nsince, m.sample, m.nsample * sizeof *common);
        if (m.nchanges)
            common[m.nsince + m.nsample] = m.changes[m.nchanges - 1]->hash;
        ncommon = hashes_normalise(common, ncommon);
    }
    free(s->recv_common);
    s->recv_common = common;
    s->nrecv_common = ncommon;
    if (m.hello) {
        /* The peer lost or reset its state for us: what we sent may never
         * have arrived, and it needs our heads again. Not echoed as a hello
         * of our own, so two peers cannot keep resetting each other. */
        if (s->sent)
            memset(s->sent, 0, s->sent_bytes);
        s->lag_floor = 0;
        s->poke = 1;
        s->floor = 0; /* it may be a new copy of the member, with less */
    }
    s->heard = 1;
    s->heard_since_tick = 1;
    s->grace = m.nchanges > 0;
    s->want_answer = m.nchanges > 0 || m.nneed > 0 || m.has_filter || m.has_sample || m.hello;
    s->wanted = s->want_answer;
    int moved = !s->their_valid || !hashes_eq(m.heads, m.nheads, s->their, s->ntheir);
    if (moved) {
        s->their_changed = 1;
        s->moved_since_tick = 1;
    }
    s->their_valid = 1;
    if ((rc = hashes_set(&s->their, &s->ntheir, m.heads, m.nheads)) ||
        (rc = hashes_set(&s->their_need, &s->ntheir_need, m.need, m.nneed)))
        goto done;
    if (m.has_filter) {
        if ((rc = hashes_set(&s->their_since, &s->ntheir_since, m.since, m.nsince)))
            goto done;
        cairn_bloom_destroy(&s->their_filter);
        s->their_filter = m.filter; /* moves the bits */
        memset(&m.filter, 0, sizeof m.filter);
        s->have_filter = 1;
    } else if (moved && s->have_filter) {
        /* A filter speaks of the heads it came with: once the peer has
         * moved on, the changes it made since are not in it, and answering
         * it would send the peer its own changes back. */
        cairn_bloom_destroy(&s->their_filter);
        free(s->their_since);
        s->their_since = NULL;
        s->ntheir_since = 0;
        s->have_filter = 0;
    }
    if ((rc = settle(s, cairn_doc_dag(doc))))
        goto done;
    *changes = m.changes;
    *nchanges = m.nchanges;
    m.changes = NULL;
    m.nchanges = 0;
done:
    cairn_sync_msg_destroy(&m);
    return rc;
}

int cairn_sync_applied(cairn_sync_state *s, const cairn_doc *doc)
{
    return s->their_valid ? settle(s, cairn_doc_dag(doc)) : 0;
}

int cairn_sync_peer_has(const cairn_sync_state *s, const cairn_doc *doc, const cairn_hash *h)
{
    if (hashes_contain(s->their, s->ntheir, h))
        return 1;
    const cairn_dag *d = cairn_doc_dag(doc);
    if (!is_ordered(d, h))
        return 0;
    cairn_hash *base;
    size_t nbase;
    if (peer_base(&base, &nbase, d, s, s->shared, s->nshared, s->ntheir + s->nshared) != 0)
        return 0;
    int r = nbase && cairn_dag_is_ancestor(d, h, base, nbase);
    free(base);
    return r;
}
