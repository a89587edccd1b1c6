#ifndef CAIRN_SYNC_APPLY_H
#define CAIRN_SYNC_APPLY_H

/* What the store does with a sync message, minus durability: receive it,
 * apply the changes it hands back through cairn_doc_receive, tell the
 * session. Shared by the sync suites, the sync fuzzers and sync_bench.
 * Returns the receive's error, else the first change the document
 * rejected (the others still apply), else cairn_sync_applied's. */

#include <stdlib.h>

#include "crdt/doc.h"
#include "crdt/sync.h"

static inline int sync_apply(cairn_doc *doc, cairn_sync_state *s, const uint8_t *msg, size_t len,
                             const cairn_doc_observer *obs)
{
    cairn_change **c;
    size_t n;
    int rc = cairn_sync_receive(&c, &n, s, doc, msg, len);
    if (rc)
        return rc;
    int first = 0;
    for (size_t i = 0; i < n; i++) {
        int r = cairn_doc_receive(doc, c[i], obs); /* takes c[i] */
        if (r && !first)
            first = r;
    }
    free(c);
    rc = cairn_sync_applied(s, doc);
    return first ? first : rc;
}

#endif
