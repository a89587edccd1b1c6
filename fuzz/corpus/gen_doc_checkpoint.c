/*
 * Writes the seed corpus of fuzz_doc_checkpoint: checkpoints of real
 * replicas (empty; one key; maps, lists with tombstones, counters, every
 * value type and a conflict between two replicas; a few hundred keys with
 * deletes). Build and run from the repository root after building cairn:
 *   cc -I. fuzz/corpus/gen_doc_checkpoint.c build/crdt/libcairn_crdt.a -lsodium -lpthread \
 *      -o /tmp/gen && /tmp/gen fuzz/corpus/doc_checkpoint
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/doc.h"
#include "crdt/error.h"

static void ok(int rc)
{
    if (rc) {
        fprintf(stderr, "gen: error %d\n", rc);
        exit(1);
    }
}

static cairn_doc *doc(uint8_t who)
{
    cairn_actor a;
    memset(a.b, who, sizeof a.b);
    cairn_doc *d;
    ok(cairn_doc_new(&d, &a));
    return d;
}

static void put(cairn_doc *d, cairn_objid o, const char *k, const char *v)
{
    cairn_value x = {.type = CAIRN_V_BYTES};
    x.v.bytes.ptr = (const uint8_t *)v;
    x.v.bytes.len = strlen(v);
    ok(cairn_doc_put(d, o, (const uint8_t *)k, strlen(k), &x));
}

static void sync_to(cairn_doc *to, const cairn_doc *from)
{
    const cairn_dag *fd = cairn_doc_dag(from);
    for (uint64_t i = 0; i < cairn_dag_count(fd); i++) {
        if (cairn_dag_has(cairn_doc_dag(to), cairn_dag_hash_at(fd, i)))
            continue;
        cairn_change *c;
        ok(cairn_dag_load(&c, fd, i));
        ok(cairn_doc_receive(to, c, NULL));
    }
}

static void save(const char *dir, const char *name, const cairn_doc *d)
{
    uint8_t *b;
    size_t n;
    char path[512];
    ok(cairn_doc_checkpoint(&b, &n, d));
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "gen: cannot write %s\n", path);
        exit(1);
    }
    free(b);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "fuzz/corpus/doc_checkpoint";
    cairn_doc *a = doc(1), *b = doc(2);
    save(dir, "empty", a);
    ok(cairn_doc_begin(a, 100));
    put(a, CAIRN_ROOT, "/registry/k0000001", "value-00000001-00000000-xxxxxxxx");
    ok(cairn_doc_commit(a, NULL, NULL));
    save(dir, "one_key", a);

    cairn_objid m, l, inner;
    cairn_value c = {.type = CAIRN_V_COUNTER, .v.i = 3}, t = {.type = CAIRN_V_BOOL, .v.b = 1},
                f = {.type = CAIRN_V_F64, .v.f = 0.5}, u = {.type = CAIRN_V_UINT, .v.u = 9},
                n = {.type = CAIRN_V_NULL}, s = {.type = CAIRN_V_STR};
    s.v.bytes.ptr = (const uint8_t *)"text";
    s.v.bytes.len = 4;
    ok(cairn_doc_begin(a, 200));
    ok(cairn_doc_put_object(a, &m, CAIRN_ROOT, (const uint8_t *)"m", 1, CAIRN_OBJ_MAP));
    ok(cairn_doc_put_object(a, &l, CAIRN_ROOT, (const uint8_t *)"l", 1, CAIRN_OBJ_LIST));
    ok(cairn_doc_put(a, CAIRN_ROOT, (const uint8_t *)"n", 1, &c));
    ok(cairn_doc_put(a, m, (const uint8_t *)"t", 1, &t));
    ok(cairn_doc_put(a, m, (const uint8_t *)"f", 1, &f));
    ok(cairn_doc_put(a, m, (const uint8_t *)"u", 1, &u));
    ok(cairn_doc_put(a, m, (const uint8_t *)"", 0, &n));
    ok(cairn_doc_list_insert(a, l, 0, &s));
    ok(cairn_doc_list_insert(a, l, 1, &c));
    ok(cairn_doc_list_insert_object(a, &inner, l, 2, CAIRN_OBJ_MAP));
    put(a, inner, "deep", "x");
    ok(cairn_doc_list_delete(a, l, 0));
    ok(cairn_doc_commit(a, NULL, NULL));
    sync_to(b, a);
    ok(cairn_doc_begin(a, 300));
    put(a, CAIRN_ROOT, "x", "from a");
    ok(cairn_doc_increment(a, CAIRN_ROOT, (const uint8_t *)"n", 1, 2));
    ok(cairn_doc_commit(a, NULL, NULL));
    ok(cairn_doc_begin(b, 300));
    put(b, CAIRN_ROOT, "x", "from b, concurrently");
    ok(cairn_doc_increment(b, CAIRN_ROOT, (const uint8_t *)"n", 1, 5));
    ok(cairn_doc_put_object(b, &m, CAIRN_ROOT, (const uint8_t *)"m", 1, CAIRN_OBJ_MAP));
    ok(cairn_doc_commit(b, NULL, NULL));
    sync_to(a, b);
    sync_to(b, a);
    save(dir, "objects_conflicts", a);
    save(dir, "objects_conflicts_b", b);

    for (int i = 0; i < 300; i++) {
        char k[32], v[40];
        snprintf(k, sizeof k, "/registry/k%07d", i % 120);
        snprintf(v, sizeof v, "value-%08d", i);
        cairn_doc *w = i % 3 ? a : b;
        ok(cairn_doc_begin(w, 1000 + (uint64_t)i));
        if (i % 7 == 6) { /* deletes leave nothing in a map: the key is gone */
            snprintf(k, sizeof k, "/registry/k%07d", (i / 7) % 120);
            int rc = cairn_doc_delete(w, CAIRN_ROOT, (const uint8_t *)k, strlen(k));
            ok(rc == CAIRN_ENOTFOUND ? 0 : rc);
        } else {
            put(w, CAIRN_ROOT, k, v);
        }
        ok(cairn_doc_commit(w, NULL, NULL));
        if (i % 10 == 9) {
            sync_to(a, b);
            sync_to(b, a);
        }
    }
    save(dir, "many_keys", a);
    cairn_doc_free(a);
    cairn_doc_free(b);
    return 0;
}
