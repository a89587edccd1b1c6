/*
 * libFuzzer target for the checkpoint decoder (cairn_doc_from_checkpoint).
 * Arbitrary bytes must either be rejected with a named error code and no
 * document, or give a document whose internal invariants hold
 * (cairn_doc_check_) and that works: it dumps, its own checkpoint restores
 * to the same dump, and it takes a local edit and commit after which the
 * invariants still hold. The seed corpus is real checkpoints
 * (fuzz/corpus/gen_doc_checkpoint.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/doc.h"
#include "crdt/doc_int.h"
#include "crdt/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cairn_actor me;
    memset(me.b, 0x5A, sizeof me.b);
    cairn_doc *d = NULL;
    int rc = cairn_doc_from_checkpoint(&d, data, size, &me);
    if (rc) {
        check(d == NULL);
        check(rc < 0 && strcmp(cairn_error_name(rc), "EUNKNOWN") != 0);
        return 0;
    }
    check(cairn_doc_check_(d) == 0);
    uint8_t *dump, *dump2, *ck;
    size_t dl, dl2, cl;
    check(cairn_doc_dump(&dump, &dl, d) == 0);
    /* Its own checkpoint restores to the same state. */
    check(cairn_doc_checkpoint(&ck, &cl, d) == 0);
    cairn_doc *again;
    check(cairn_doc_from_checkpoint(&again, ck, cl, &me) == 0);
    check(cairn_doc_dump(&dump2, &dl2, again) == 0);
    check(dl == dl2 && memcmp(dump, dump2, dl) == 0);
    check(cairn_dag_count(cairn_doc_dag(d)) == cairn_dag_count(cairn_doc_dag(again)));
    free(dump2);
    free(ck);
    cairn_doc_free(again);
    free(dump);
    /* A local edit: clocks and the sequence rule must allow it or refuse it
     * cleanly (a clock at its limit). */
    if (cairn_doc_begin(d, 1) == 0) {
        cairn_value v = {.type = CAIRN_V_STR};
        v.v.bytes.ptr = (const uint8_t *)"fz";
        v.v.bytes.len = 2;
        rc = cairn_doc_put(d, CAIRN_ROOT, (const uint8_t *)"k", 1, &v);
        check(rc == 0 || rc == CAIRN_ELIMIT);
        const cairn_change *c;
        rc = cairn_doc_commit(d, &c, NULL);
        check(rc == 0 || rc < 0);
        check(cairn_doc_check_(d) == 0);
    }
    cairn_doc_free(d);
    return 0;
}
