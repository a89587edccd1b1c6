/*
 * libFuzzer target for the change decoder. Arbitrary bytes must either be
 * rejected with an error code from the table, or decode to a change whose
 * re-encoding is byte-identical (the encoding is canonical) with the same
 * hash. Every accepted change is also offered to a fresh DAG, twice, and the
 * DAG's answers are checked against what the change says.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/change.h"
#include "crdt/dag.h"
#include "crdt/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static void feed_dag(const cairn_change *c)
{
    cairn_dag *d;
    cairn_change *copy;
    int state;
    if (cairn_dag_new(&d) != 0)
        return;
    if (cairn_change_decode(&copy, c->bytes, c->len, &c->hash) != 0)
        abort();
    int rc = cairn_dag_add(d, copy, &state);
    check(rc == 0);
    if (cairn_change_decode(&copy, c->bytes, c->len, NULL) != 0)
        abort();
    check(cairn_dag_add(d, copy, &state) == 0 && state == CAIRN_DAG_KNOWN);
    check(cairn_dag_has(d, &c->hash) == 2);

    cairn_hash *miss;
    size_t n;
    check(cairn_dag_missing(&miss, &n, d) == 0);
    if (c->ndeps) {
        /* Nothing else is known: every dep is missing, in sorted order. */
        check(n == c->ndeps && memcmp(miss, c->deps, n * sizeof *miss) == 0);
        check(cairn_dag_peek_ready(d) == NULL);
    } else {
        check(n == 0);
        check(cairn_dag_peek_ready(d) != NULL);
        rc = cairn_dag_order(d, NULL, NULL);
        /* A first change of its actor must have seq 1. */
        check(c->seq == 1 ? rc == 0 : rc == CAIRN_ESEQGAP);
        check(cairn_dag_count(d) == (c->seq == 1 ? 1u : 0u));
        const cairn_hash *heads;
        size_t nh = cairn_dag_heads(d, &heads);
        check(nh == cairn_dag_count(d));
        if (nh)
            check(cairn_hash_cmp(&heads[0], &c->hash) == 0);
    }
    free(miss);
    cairn_dag_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cairn_change *c = NULL;
    int rc = cairn_change_decode(&c, data, size, NULL);
    if (rc != 0) {
        check(c == NULL);
        check(rc < 0 && rc > CAIRN_ERROR_BASE_ && strcmp(cairn_error_name(rc), "EUNKNOWN") != 0);
        return 0;
    }
    cairn_hash h;
    cairn_hash_bytes(&h, data, size);
    check(cairn_hash_cmp(&h, &c->hash) == 0);
    check(c->len == size && memcmp(c->bytes, data, size) == 0);

    /* Re-encode the decoded struct: identical bytes, identical hash. */
    check(cairn_change_encode(c) == 0);
    check(c->len == size && memcmp(c->bytes, data, size) == 0);
    check(cairn_hash_cmp(&h, &c->hash) == 0);

    /* A deep copy through cairn_change_new encodes the same way. */
    cairn_change *d = NULL;
    rc = cairn_change_new(&d, c);
    check(rc == 0 || rc == CAIRN_ENOMEM);
    if (d) {
        check(d->len == size && memcmp(d->bytes, data, size) == 0);
        cairn_change_free(d);
    }

    feed_dag(c);
    cairn_change_free(c);
    return 0;
}
