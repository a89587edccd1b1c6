/*
 * Fuzz target: sync message decoding and receiving. Any input must either be
 * rejected with an error code or decode to a message whose re-encoding is
 * byte-identical (one canonical form); likewise as a saved sync state. The input is then received
 * by a small document as if from a peer, and the reply it generates must decode.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/doc.h"
#include "crdt/error.h"
#include "crdt/sync.h"
#include "tests/unit/sync_apply.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cairn_doc *small_doc(void)
{
    cairn_actor a;
    memset(a.b, 0x5A, sizeof a.b);
    cairn_doc *d = NULL;
    if (cairn_doc_new(&d, &a))
        abort();
    for (int i = 0; i < 2; i++) {
        uint8_t key = (uint8_t)('k' + i);
        cairn_value v = {.type = CAIRN_V_INT};
        v.v.i = i;
        if (cairn_doc_begin(d, 1000 + (uint64_t)i) || cairn_doc_put(d, CAIRN_ROOT, &key, 1, &v) ||
            cairn_doc_commit(d, NULL, NULL))
            abort();
    }
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cairn_sync_msg m;
    int rc = cairn_sync_msg_decode(&m, data, size, NULL);
    if (rc == 0) {
        uint8_t *re = NULL;
        size_t relen = 0;
        if (cairn_sync_msg_encode(&re, &relen, &m) != 0)
            abort();
        if (relen != size || memcmp(re, data, size) != 0)
            abort(); /* two encodings of one message */
        free(re);
        cairn_sync_msg_destroy(&m);
    } else if (m.heads || m.changes || m.nchanges) {
        abort(); /* failure must leave *out zeroed */
    }

    /* Small limits too: every limit is enforced, never exceeded. */
    cairn_sync_limits l;
    cairn_sync_limits_default(&l);
    l.max_heads = 2;
    l.max_need = 2;
    l.max_changes = 2;
    l.max_filter_bytes = 8;
    rc = cairn_sync_msg_decode(&m, data, size, &l);
    if (rc == 0) {
        if (m.nheads > 2 || m.nneed > 2 || m.nchanges > 2 || m.filter.nbytes > 8)
            abort();
        cairn_sync_msg_destroy(&m);
    }

    /* The same bytes as a saved per-peer state. */
    cairn_sync_state *ls = NULL;
    if (cairn_sync_state_load(&ls, data, size, NULL) == 0) {
        uint8_t *re = NULL;
        size_t relen = 0;
        if (cairn_sync_state_save(&re, &relen, ls) != 0 || relen != size ||
            memcmp(re, data, size) != 0)
            abort();
        free(re);
        cairn_sync_state_free(ls);
    } else if (ls) {
        abort();
    }

    cairn_doc *d = small_doc();
    cairn_sync_state *s = NULL;
    if (cairn_sync_state_new(&s, NULL))
        abort();
    (void)sync_apply(d, s, data, size, NULL);
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {7};
    uint8_t *out = NULL;
    size_t olen = 0;
    rc = cairn_sync_generate(&out, &olen, d, s, salt);
    if (rc == 0 && out) {
        if (cairn_sync_msg_decode(&m, out, olen, NULL) != 0)
            abort(); /* we produced something we would reject */
        cairn_sync_msg_destroy(&m);
    }
    free(out);
    const cairn_hash *h;
    size_t nh = cairn_sync_their_heads(s, &h);
    for (size_t i = 0; i < nh; i++)
        (void)cairn_sync_peer_has(s, d, &h[i]);
    cairn_sync_state_free(s);
    cairn_doc_free(d);
    return 0;
}
