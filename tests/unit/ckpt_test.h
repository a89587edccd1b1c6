#ifndef CAIRN_CKPT_TEST_H
#define CAIRN_CKPT_TEST_H

/* Checkpoint helpers shared by the doc and convergence suites. */

#include <check.h>
#include <stdlib.h>

#include "crdt/doc.h"
#include "crdt/doc_int.h"

/* |d| through cairn_doc_checkpoint and back, restored for |actor|; the
 * restored replica must pass its invariant check. */
static inline cairn_doc *ckpt_restore(const cairn_doc *d, const cairn_actor *actor)
{
    uint8_t *b;
    size_t n;
    cairn_doc *out;
    ck_assert_int_eq(cairn_doc_checkpoint(&b, &n, d), 0);
    ck_assert_int_eq(cairn_doc_from_checkpoint(&out, b, n, actor), 0);
    free(b);
    ck_assert_int_eq(cairn_doc_check_(out), 0);
    return out;
}

#endif
