/*
 * cairn-demo: two replicas of one document, cut off from each other, take
 * concurrent writes, then sync by exchanging their changes as bytes, and
 * converge. Runs from scripts/run.sh until the server exists.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/change.h"
#include "crdt/dag.h"
#include "crdt/doc.h"
#include "crdt/error.h"

static void check(int rc, const char *what)
{
    if (rc) {
        fprintf(stderr, "cairn-demo: %s: %s\n", what, cairn_strerror(rc));
        exit(1);
    }
}

static void put(cairn_doc *d, const char *k, const char *v)
{
    cairn_value val = {.type = CAIRN_V_STR};
    val.v.bytes.ptr = (const uint8_t *)v;
    val.v.bytes.len = strlen(v);
    check(cairn_doc_put(d, CAIRN_ROOT, (const uint8_t *)k, strlen(k), &val), "put");
}

static void commit(cairn_doc *d)
{
    check(cairn_doc_commit(d, NULL, NULL), "commit");
}

/* Sorted printing: keys are few, so a selection by strcmp will do. */
struct kv {
    char key[64];
    char text[160];
};
struct kvs {
    struct kv e[32];
    int n;
};

static int collect(void *arg, const uint8_t *key, size_t key_len, const cairn_read *v)
{
    struct kvs *s = arg;
    if (s->n == 32)
        return 1;
    struct kv *e = &s->e[s->n++];
    snprintf(e->key, sizeof e->key, "%.*s", (int)key_len, (const char *)key);
    if (v->value.type == CAIRN_V_COUNTER)
        snprintf(e->text, sizeof e->text, "%lld (counter)", (long long)v->value.v.i);
    else
        snprintf(e->text, sizeof e->text, "\"%.*s\"", (int)v->value.v.bytes.len,
                 (const char *)v->value.v.bytes.ptr);
    return 0;
}

static int cmp_kv(const void *a, const void *b)
{
    return strcmp(((const struct kv *)a)->key, ((const struct kv *)b)->key);
}

static void show(const char *name, const cairn_doc *d)
{
    struct kvs s = {.n = 0};
    check(cairn_doc_map_foreach(d, CAIRN_ROOT, collect, &s), "read");
    qsort(s.e, (size_t)s.n, sizeof s.e[0], cmp_kv);
    printf("  %s:\n", name);
    for (int i = 0; i < s.n; i++) {
        cairn_read all[4];
        size_t n;
        check(cairn_doc_get_all(d, all, 4, &n, CAIRN_ROOT, (const uint8_t *)s.e[i].key,
                                strlen(s.e[i].key)),
              "get");
        printf("    %-14s = %s", s.e[i].key, s.e[i].text);
        for (size_t k = 1; k < n && k < 4; k++)
            printf("   (conflict, lost: \"%.*s\")", (int)all[k].value.v.bytes.len,
                   (const char *)all[k].value.v.bytes.ptr);
        printf("\n");
    }
    const cairn_hash *heads;
    size_t nh = cairn_dag_heads(cairn_doc_dag(d), &heads);
    printf("    heads (%zu):", nh);
    for (size_t i = 0; i < nh; i++) {
        char hex[2 * CAIRN_HASH_LEN + 1];
        cairn_hash_hex(hex, &heads[i]);
        printf(" %.12s", hex);
    }
    printf("   changes: %llu\n", (unsigned long long)cairn_dag_count(cairn_doc_dag(d)));
}

/* Sends |from|'s changes that |to| lacks, as encoded bytes. */
static size_t sync_to(cairn_doc *to, const cairn_doc *from)
{
    const cairn_dag *fd = cairn_doc_dag(from);
    size_t sent = 0;
    for (uint64_t i = 0; i < cairn_dag_count(fd); i++) {
        if (cairn_dag_has(cairn_doc_dag(to), cairn_dag_hash_at(fd, i)))
            continue;
        cairn_change *copy;
        check(cairn_dag_load(&copy, fd, i), "load");
        check(cairn_doc_receive(to, copy, NULL), "receive");
        sent++;
    }
    return sent;
}

int main(void)
{
    cairn_actor aa, ab;
    memset(aa.b, 0xA0, sizeof aa.b);
    memset(ab.b, 0xB0, sizeof ab.b);
    cairn_doc *a, *b;
    check(cairn_doc_new(&a, &aa), "new");
    check(cairn_doc_new(&b, &ab), "new");

    printf("cairn-demo: two sites share one CRDT document.\n\n");
    check(cairn_doc_begin(a, 1000), "begin");
    put(a, "/app/color", "red");
    put(a, "/app/mode", "safe");
    cairn_value zero = {.type = CAIRN_V_COUNTER};
    check(cairn_doc_put(a, CAIRN_ROOT, (const uint8_t *)"/app/visits", 11, &zero), "put");
    commit(a);
    sync_to(b, a);
    printf("1. site-a writes; site-b syncs:\n");
    show("site-a", a);
    show("site-b", b);

    printf("\n2. the link fails; both sites keep taking writes:\n");
    check(cairn_doc_begin(a, 2000), "begin");
    put(a, "/app/color", "blue");
    check(cairn_doc_delete(a, CAIRN_ROOT, (const uint8_t *)"/app/mode", 9), "delete");
    check(cairn_doc_increment(a, CAIRN_ROOT, (const uint8_t *)"/app/visits", 11, 3), "inc");
    commit(a);
    check(cairn_doc_begin(b, 2500), "begin");
    put(b, "/app/color", "green"); /* later in real time: wins */
    put(b, "/app/size", "large");
    check(cairn_doc_increment(b, CAIRN_ROOT, (const uint8_t *)"/app/visits", 11, 4), "inc");
    commit(b);
    show("site-a", a);
    show("site-b", b);

    printf("\n3. the link is back; each site sends the changes the other lacks:\n");
    size_t to_b = sync_to(b, a), to_a = sync_to(a, b);
    printf("  site-a -> site-b: %zu change(s), site-b -> site-a: %zu change(s)\n", to_b, to_a);
    show("site-a", a);
    show("site-b", b);

    uint8_t *da, *db;
    size_t la, lb;
    check(cairn_doc_dump(&da, &la, a), "dump");
    check(cairn_doc_dump(&db, &lb, b), "dump");
    const cairn_hash *ha, *hb;
    size_t na = cairn_dag_heads(cairn_doc_dag(a), &ha);
    size_t nb = cairn_dag_heads(cairn_doc_dag(b), &hb);
    int same =
        la == lb && memcmp(da, db, la) == 0 && na == nb && memcmp(ha, hb, na * sizeof *ha) == 0;
    printf("\n%s: same state (%zu-byte canonical dump) and same heads on both sites.\n",
           same ? "CONVERGED" : "DIVERGED", la);
    free(da);
    free(db);
    cairn_doc_free(a);
    cairn_doc_free(b);
    return same ? 0 : 1;
}
