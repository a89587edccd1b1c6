/*
 * libFuzzer target for the store's checkpoint decoders (store/checkpoint.c):
 * the file header parser (cairn_ckpt_parse, cairn_ckpt_verify) and the state
 * section decoder (cairn_ckpt_decode_state: revision map and key index).
 * The file is read from disk at open, so damaged or hostile bytes must be a
 * specific error code, never a crash, a read outside the input or an
 * allocation out of proportion to it. The document part is crdt's
 * (cairn_doc_from_checkpoint has its own target).
 *
 * Input: u8 mode, then
 *   mode even: a whole checkpoint file. A header that parses has its
 *              checksum checked, and its state section is decoded anyway
 *              (with the header's N and revision), so the fuzzer reaches
 *              the decoder without forging BLAKE2b.
 *   mode odd:  u32 BE N ++ u32 BE revision ++ a state section.
 *
 * Checked: every result is 0 or one of the decoder's codes; a decoded
 * state is one the store could have built (keys strictly ascending, every
 * history non-empty, ascending and within [1, revision], the revision map's
 * lookups inside [0, N)); the live count and the list of live leased keys
 * the loader is handed match the index; its re-encoding is no longer than the input and
 * decodes to the same state.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "store/store_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static int known_rc(int rc)
{
    return rc == 0 || rc == CAIRN_ETRUNCATED || rc == CAIRN_ECORRUPT || rc == CAIRN_ELIMIT ||
           rc == CAIRN_ENOMEM || rc == CAIRN_EBADVERSION;
}

static void check_state(const kindex *x, revmap *m, const cairn_ckpt_live *lv, uint64_t n,
                        int64_t rev)
{
    kiter it;
    const kentry *prev = NULL;
    uint64_t count = 0, nlive = 0;
    size_t nleased = 0, n_list;
    kentry *const *list = cairn_ckpt_leased(lv, &n_list);
    for (const kentry *e = cairn_kindex_first(&it, x); e; e = cairn_kindex_next(&it)) {
        check(!prev || cairn_store_keycmp(prev->key, prev->key_len, e->key, e->key_len) < 0);
        check(e->nhist >= 1 && e->nhist <= e->cap);
        uint64_t last = 0;
        for (uint32_t i = 0; i < e->nhist; i++) {
            uint64_t r = e->hist[i] & ~CAIRN_IDX_TOMB;
            check(r > last && r <= (uint64_t)rev);
            last = r;
        }
        check(cairn_kindex_find(x, e->key, e->key_len) == e);
        if (kentry_live(e)) {
            nlive++;
            if (e->lease) /* the loader's list: every live leased key, in order */
                check(nleased < n_list && list[nleased++] == e);
        }
        prev = e;
        count++;
    }
    check(count == x->nkeys && nlive == lv->nlive && nleased == n_list);
    for (size_t i = 0; i < m->n; i++) {
        uint64_t ix;
        check(cairn_revmap_find(m, &ix, m->rev[i]) == 0 && ix < n);
    }
    uint64_t ix;
    if (m->n)
        check(cairn_revmap_find(m, &ix, m->last) == 0 && ix < n);
}

static void decode(const uint8_t *p, size_t len, uint64_t n, int64_t rev)
{
    /* an exact-size copy, so ASan sees a read past the section */
    uint8_t *b = malloc(len ? len : 1);
    if (!b)
        return;
    memcpy(b, p, len);
    kindex x;
    revmap m;
    cairn_kindex_init(&x);
    cairn_revmap_init(&m);
    cairn_ckpt_live lv;
    memset(&lv, 0, sizeof lv);
    int rc = cairn_ckpt_decode_state(&x, &m, &lv, b, len, n, rev);
    check(known_rc(rc) && rc != CAIRN_EBADVERSION);
    if (rc == 0) {
        check_state(&x, &m, &lv, n, rev);
        store_buf e = {0};
        if (cairn_ckpt_encode_state(&e, &x, &m) == 0) {
            check(e.len <= len);
            kindex y;
            revmap m2;
            cairn_kindex_init(&y);
            cairn_revmap_init(&m2);
            check(cairn_ckpt_decode_state(&y, &m2, NULL, e.p ? e.p : b, e.len, n, rev) == 0);
            store_buf e2 = {0};
            check(cairn_ckpt_encode_state(&e2, &y, &m2) == 0);
            check(e2.len == e.len && (!e.len || memcmp(e.p, e2.p, e.len) == 0));
            cairn_store_buf_free(&e2);
            cairn_kindex_destroy(&y);
            cairn_revmap_destroy(&m2);
        }
        cairn_store_buf_free(&e);
    }
    cairn_store_buf_free(&lv.leased);
    cairn_kindex_destroy(&x);
    cairn_revmap_destroy(&m);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    if (mode & 1) {
        if (size < 8)
            return 0;
        uint64_t n = (uint64_t)data[0] << 24 | (uint64_t)data[1] << 16 | data[2] << 8 | data[3];
        int64_t rev = (int64_t)((uint64_t)data[4] << 24 | (uint64_t)data[5] << 16 |
                                (uint64_t)data[6] << 8 | data[7]);
        decode(data + 8, size - 8, n, rev);
        return 0;
    }
    uint8_t *f = malloc(size ? size : 1);
    if (!f)
        return 0;
    memcpy(f, data, size);
    cairn_ckpt_head h;
    int rc = cairn_ckpt_parse(&h, f, size);
    check(known_rc(rc) && rc != CAIRN_ELIMIT && rc != CAIRN_ENOMEM);
    if (rc == 0) {
        check(h.payload == f + CAIRN_CKPT_HDR && h.payload_len == size - CAIRN_CKPT_HDR);
        check(h.doc == h.payload + CAIRN_CKPT_FIXED && h.state == h.doc + h.doc_len &&
              h.state + h.state_len == f + size);
        check(h.nchanges >= 1 && h.rev >= 1 && h.compacted >= -1 && h.compacted <= h.rev);
        rc = cairn_ckpt_verify(&h);
        check(rc == 0 || rc == CAIRN_EBADHASH);
        decode(h.state, h.state_len, h.nchanges, h.rev);
    }
    free(f);
    return 0;
}
