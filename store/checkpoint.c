/*
 * The checkpoint file: a memo of the store's derived state after its first
 * N changes in apply order, so a reopen loads it and replays only the tail
 * (store.h, CHECKPOINT, has the byte layout). It is a cache, never the
 * truth: the 'O' records stay the truth, and every doubt about the memo
 * (checksum, format, identity, the stored change N-1, compaction since)
 * sends the store back to a full replay. This file only encodes and decodes
 * bytes and writes them atomically; recover.c decides when a memo applies.
 *
 * The store's part of the payload is the revision map (a handful of runs)
 * and the key index in key order: keys front-coded against the previous
 * key (sorted keys share long prefixes), every history revision as a delta
 * from the one before it with the delete mark in the low bit. The decoder
 * treats the bytes as hostile (the checksum catches accidents, not
 * malice): every count is bounded by the bytes left, keys must ascend
 * strictly, histories must ascend and stay at or below the stored revision,
 * and the revision map must be one the observer could have built. Trailing
 * bytes are an error. Allocation is bounded by a constant times the input.
 *
 * Leases are not in the file: recover.c re-derives the lease table from the
 * loaded document and key index with the observer's own code (lease_table.c,
 * cairn_store_lease_rebuild), so the two cannot disagree.
 *
 * Writing: temp file in the data dir, write, fsync, rename over the old
 * one, fsync the dir. A crash at any point leaves the old file or the new
 * one, never a torn one under the final name (and a torn one would fail its
 * checksum anyway).
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "crdt/error.h"
#include "crdt/wire.h"
#include "store/store_int.h"

static const uint8_t MAGIC[8] = {'c', 'a', 'i', 'r', 'n', 'C', 'K', 'P'};

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* ---- the store's state section ---------------------------------------------- */

static int put_v(store_buf *b, uint64_t v)
{
    uint8_t x[10];
    return cairn_store_buf_put(b, x, (size_t)(wire_put_uv(x, v) - x));
}

int cairn_ckpt_encode_state(store_buf *b, const kindex *x, revmap *m)
{
    int rc;
    pthread_mutex_lock(&m->mu);
    rc = put_v(b, m->n);
    for (size_t i = 0; i < m->n && !rc; i++) {
        rc = put_v(b, (uint64_t)m->rev[i]);
        if (!rc)
            rc = put_v(b, m->idx[i]);
    }
    if (!rc)
        rc = put_v(b, (uint64_t)m->last);
    pthread_mutex_unlock(&m->mu);
    if (!rc)
        rc = put_v(b, x->nkeys);
    kiter it;
    const kentry *prev = NULL;
    for (const kentry *e = cairn_kindex_first(&it, x); e && !rc; e = cairn_kindex_next(&it)) {
        size_t shared = 0;
        if (prev) {
            size_t n = prev->key_len < e->key_len ? prev->key_len : e->key_len;
            while (shared < n && prev->key[shared] == e->key[shared])
                shared++;
        }
        if ((rc = put_v(b, shared)) || (rc = put_v(b, e->key_len - shared)) ||
            (rc = cairn_store_buf_put(b, e->key + shared, e->key_len - shared)) ||
            (rc = put_v(b, (uint64_t)e->create_rev)) || (rc = put_v(b, (uint64_t)e->version)) ||
            (rc = put_v(b, (uint64_t)e->lease)) || (rc = put_v(b, e->nhist)))
            break;
        uint64_t last = 0;
        for (uint32_t i = 0; i < e->nhist && !rc; i++) {
            uint64_t r = e->hist[i] & ~CAIRN_IDX_TOMB;
            rc = put_v(b, (r - last) << 1 | (e->hist[i] & CAIRN_IDX_TOMB ? 1 : 0));
            last = r;
        }
        prev = e;
    }
    return rc;
}

/* The state section's reader: crdt/wire.h's, canonical varints only (an
 * overlong one is corruption, as the header documents). */
typedef wire_rd rd;

static int get_v(rd *r, uint64_t *v)
{
    int rc = wire_uv(r, v);
    return rc == CAIRN_ENONCANON ? CAIRN_ECORRUPT : rc;
}

static int decode_revmap(rd *r, revmap *m, uint64_t nchanges, int64_t rev)
{
    uint64_t n, last;
    int rc = get_v(r, &n);
    if (rc)
        return rc;
    if (n > wire_left(r) / 2) /* each run takes at least two bytes */
        return CAIRN_ETRUNCATED;
    int64_t prev_rev = 0;
    uint64_t prev_idx = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t rv, ix;
        if ((rc = get_v(r, &rv)) || (rc = get_v(r, &ix)))
            return rc;
        /* runs ascend, a change takes at most one revision, and a new run
         * starts only where a change took none (index - rev grows) */
        if (rv < 2 || rv > (uint64_t)rev || (int64_t)rv <= prev_rev || ix + 1 < rv ||
            ix >= nchanges || (i && ix - prev_idx <= rv - (uint64_t)prev_rev))
            return CAIRN_ECORRUPT;
        if ((rc = cairn_revmap_add(m, (int64_t)rv, ix)))
            return rc;
        prev_rev = (int64_t)rv;
        prev_idx = ix;
    }
    if ((rc = get_v(r, &last)))
        return rc;
    if (n == 0 ? (last != 0 || rev != 1) : (last != (uint64_t)rev))
        return CAIRN_ECORRUPT;
    if (n && prev_idx + (last - (uint64_t)prev_rev) >= nchanges)
        return CAIRN_ECORRUPT;
    if (n) {
        pthread_mutex_lock(&m->mu);
        m->last = (int64_t)last;
        pthread_mutex_unlock(&m->mu);
    }
    return 0;
}

static int note_live(cairn_ckpt_live *lv, kentry *e)
{
    if (!lv || !kentry_live(e))
        return 0;
    lv->nlive++;
    return e->lease ? cairn_store_buf_put(&lv->leased, &e, sizeof e) : 0;
}

static int decode_index(rd *r, kindex *x, cairn_ckpt_live *lv, int64_t rev)
{
    uint64_t nkeys;
    int rc = get_v(r, &nkeys);
    if (rc)
        return rc;
    if (nkeys > wire_left(r) / 7) /* shared, suffix, cr, ver, lease, nhist, one rev */
        return CAIRN_ETRUNCATED;
    /* front coding lets a few bytes name a long key: bound the total */
    uint64_t budget = (uint64_t)wire_left(r) * CAIRN_CKPT_KEY_RATIO + (1u << 20);
    const kentry *prev = NULL;
    for (uint64_t k = 0; k < nkeys; k++) {
        uint64_t shared, sfx, cr, ver, lease, nh;
        if ((rc = get_v(r, &shared)) || (rc = get_v(r, &sfx)))
            return rc;
        if (shared > (prev ? prev->key_len : 0))
            return CAIRN_ECORRUPT;
        if (sfx > wire_left(r))
            return CAIRN_ETRUNCATED;
        if (shared + sfx > budget || shared + sfx > UINT32_MAX)
            return CAIRN_ELIMIT;
        budget -= shared + sfx;
        const uint8_t *suffix = r->p;
        r->p += sfx;
        if ((rc = get_v(r, &cr)) || (rc = get_v(r, &ver)) || (rc = get_v(r, &lease)) ||
            (rc = get_v(r, &nh)))
            return rc;
        if (cr > (uint64_t)rev || ver > INT64_MAX)
            return CAIRN_ECORRUPT;
        if (nh == 0)
            return CAIRN_ECORRUPT;
        if (nh > wire_left(r)) /* one byte at least per revision */
            return CAIRN_ETRUNCATED;
        if (nh > UINT32_MAX)
            return CAIRN_ELIMIT;
        size_t kl = (size_t)(shared + sfx);
        kentry *e = calloc(1, sizeof *e + kl);
        if (!e)
            return CAIRN_ENOMEM;
        e->key_len = (uint32_t)kl;
        if (shared)
            memcpy(e->key, prev->key, (size_t)shared);
        if (sfx)
            memcpy(e->key + shared, suffix, (size_t)sfx);
        e->create_rev = (int64_t)cr;
        e->version = (int64_t)ver;
        e->lease = (int64_t)lease;
        if (nh == 1) {
            e->hist = &e->h1;
            e->cap = 1;
        } else if (!(e->hist = malloc((size_t)nh * sizeof *e->hist))) {
            free(e);
            return CAIRN_ENOMEM;
        } else {
            e->cap = (uint32_t)nh;
        }
        uint64_t last = 0;
        for (uint64_t i = 0; i < nh && !rc; i++) {
            uint64_t d;
            rc = get_v(r, &d);
            /* strictly ascending, within [1, rev] */
            if (!rc && ((d >> 1) == 0 || (d >> 1) > (uint64_t)rev - last))
                rc = CAIRN_ECORRUPT;
            if (!rc) {
                last += d >> 1;
                e->hist[i] = last | ((d & 1) ? CAIRN_IDX_TOMB : 0);
                e->nhist = (uint32_t)(i + 1);
            }
        }
        if (!rc && prev && cairn_store_keycmp(prev->key, prev->key_len, e->key, kl) >= 0)
            rc = CAIRN_ECORRUPT;
        if (!rc)
            rc = cairn_kindex_append(x, e);
        if (rc) {
            /* not appended: not in the index, so not in |lv| either */
            if (e->hist != &e->h1)
                free(e->hist);
            free(e);
            return rc;
        }
        prev = e;
        if ((rc = note_live(lv, e)))
            return rc;
    }
    return 0;
}

int cairn_ckpt_decode_state(kindex *x, revmap *m, cairn_ckpt_live *live, const uint8_t *p,
                            size_t len, uint64_t nchanges, int64_t rev)
{
    rd r = {p, p + len};
    int rc = decode_revmap(&r, m, nchanges, rev);
    if (!rc)
        rc = decode_index(&r, x, live, rev);
    if (!rc && r.p != r.end)
        rc = CAIRN_ECORRUPT; /* trailing bytes */
    return rc;
}

/* ---- the file ------------------------------------------------------------------- */

int cairn_ckpt_parse(cairn_ckpt_head *h, const uint8_t *p, size_t len)
{
    memset(h, 0, sizeof *h);
    if (len < CAIRN_CKPT_HDR + CAIRN_CKPT_FIXED)
        return CAIRN_ETRUNCATED;
    if (memcmp(p, MAGIC, sizeof MAGIC))
        return CAIRN_ECORRUPT;
    if (get_be32(p + 8) != CAIRN_CKPT_VERSION)
        return CAIRN_EBADVERSION;
    uint64_t plen = cairn_store_get_be64(p + 12);
    if (plen != len - CAIRN_CKPT_HDR)
        return plen > len - CAIRN_CKPT_HDR ? CAIRN_ETRUNCATED : CAIRN_ECORRUPT;
    memcpy(h->sum, p + 20, sizeof h->sum);
    const uint8_t *q = p + CAIRN_CKPT_HDR;
    h->payload = q;
    h->payload_len = (size_t)plen;
    memcpy(h->actor.b, q, CAIRN_ACTOR_LEN);
    h->member_id = cairn_store_get_be64(q + 16);
    h->cluster_id = cairn_store_get_be64(q + 24);
    h->nchanges = cairn_store_get_be64(q + 32);
    memcpy(h->last.b, q + 40, CAIRN_HASH_LEN);
    h->rev = (int64_t)cairn_store_get_be64(q + 72);
    h->compacted = (int64_t)cairn_store_get_be64(q + 80);
    uint64_t dl = cairn_store_get_be64(q + 88);
    if (h->nchanges == 0 || h->rev < 1 || h->compacted < -1 || h->compacted > h->rev)
        return CAIRN_ECORRUPT;
    if (dl > plen - CAIRN_CKPT_FIXED)
        return CAIRN_ETRUNCATED;
    h->doc = q + CAIRN_CKPT_FIXED;
    h->doc_len = (size_t)dl;
    h->state = h->doc + dl;
    h->state_len = (size_t)(plen - CAIRN_CKPT_FIXED - dl);
    return 0;
}

int cairn_ckpt_verify(const cairn_ckpt_head *h)
{
    uint8_t sum[CAIRN_HASH_LEN];
    crypto_generichash(sum, sizeof sum, h->payload, h->payload_len, NULL, 0);
    return sodium_memcmp(sum, h->sum, sizeof sum) ? CAIRN_EBADHASH : 0;
}

static int write_all(int fd, const void *p, size_t n, off_t off)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = pwrite(fd, b, n, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return CAIRN_EIO;
        b += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

int cairn_ckpt_write(const char *dir, const cairn_ckpt_head *h, const uint8_t *doc, size_t doc_len,
                     const uint8_t *state, size_t state_len)
{
    char path[4096], tmp[4096];
    if (snprintf(path, sizeof path, "%s/" CAIRN_CKPT_FILE, dir) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/" CAIRN_CKPT_FILE ".tmp", dir) >= (int)sizeof tmp)
        return CAIRN_EINVAL;
    uint8_t hdr[CAIRN_CKPT_HDR], fixed[CAIRN_CKPT_FIXED];
    memcpy(fixed, h->actor.b, CAIRN_ACTOR_LEN);
    cairn_store_be64(fixed + 16, h->member_id);
    cairn_store_be64(fixed + 24, h->cluster_id);
    cairn_store_be64(fixed + 32, h->nchanges);
    memcpy(fixed + 40, h->last.b, CAIRN_HASH_LEN);
    cairn_store_be64(fixed + 72, (uint64_t)h->rev);
    cairn_store_be64(fixed + 80, (uint64_t)h->compacted);
    cairn_store_be64(fixed + 88, doc_len);
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, CAIRN_HASH_LEN);
    crypto_generichash_update(&st, fixed, sizeof fixed);
    crypto_generichash_update(&st, doc, doc_len);
    crypto_generichash_update(&st, state, state_len);
    memcpy(hdr, MAGIC, sizeof MAGIC);
    be32(hdr + 8, CAIRN_CKPT_VERSION);
    cairn_store_be64(hdr + 12, CAIRN_CKPT_FIXED + doc_len + state_len);
    crypto_generichash_final(&st, hdr + 20, CAIRN_HASH_LEN);

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return CAIRN_EIO;
    off_t off = 0;
    int rc = write_all(fd, hdr, sizeof hdr, off);
    off += (off_t)sizeof hdr;
    if (!rc)
        rc = write_all(fd, fixed, sizeof fixed, off);
    off += (off_t)sizeof fixed;
    if (!rc)
        rc = write_all(fd, doc, doc_len, off);
    off += (off_t)doc_len;
    if (!rc)
        rc = write_all(fd, state, state_len, off);
    if (!rc && fsync(fd) != 0)
        rc = CAIRN_EIO;
    if (close(fd) != 0 && !rc)
        rc = CAIRN_EIO;
    if (!rc && rename(tmp, path) != 0)
        rc = CAIRN_EIO;
    if (rc) {
        unlink(tmp);
        return rc;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return CAIRN_EIO;
    rc = fsync(dfd) ? CAIRN_EIO : 0;
    close(dfd);
    return rc;
}

int cairn_ckpt_map(const uint8_t **p, size_t *len, const char *dir)
{
    *p = NULL;
    *len = 0;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/" CAIRN_CKPT_FILE, dir) >= (int)sizeof path)
        return CAIRN_EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? CAIRN_ENOTFOUND : CAIRN_EIO;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = CAIRN_EIO;
    } else if (st.st_size == 0) {
        rc = CAIRN_ETRUNCATED;
    } else {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (m == MAP_FAILED) {
            rc = CAIRN_EIO;
        } else {
            *p = m;
            *len = (size_t)st.st_size;
        }
    }
    close(fd);
    return rc;
}

void cairn_ckpt_unmap(const uint8_t *p, size_t len)
{
    if (p)
        munmap((void *)(uintptr_t)p, len);
}

int cairn_ckpt_remove(cairn_store *s, const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/" CAIRN_CKPT_FILE, dir) >= (int)sizeof path)
        return CAIRN_EINVAL;
    if (unlink(path) != 0)
        return errno == ENOENT ? 0 : CAIRN_EIO;
    cairn_store_log(s, CAIRN_STORE_LOG_INFO, "removed %s", path);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}
