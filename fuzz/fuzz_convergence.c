/*
 * Convergence fuzzer for crdt/doc.c. The input bytes are a script: which of
 * three replicas edits (map sets/deletes on a small key space, nested maps,
 * lists, counters, rollbacks), with which clock, and which pending message
 * each replica receives next (out of order, duplicated, late). Changes travel
 * as bytes through the codec. At the end everything is delivered everywhere
 * and the replicas must have identical heads and dumps, else abort().
 *
 * A replica's pending buffer may age out (cairn_doc_expire_pending): what
 * it dropped comes again as sync would send it, every change once more in
 * the order they were made, before the property is checked.
 *
 * A fourth replica, the victim, receives every honest change plus changes
 * decoded from byte-flipped copies of them (hostile input). It is never
 * compared (a flipped copy is a second change with an honest change's
 * (actor, seq), and of two such forks the first to arrive wins; see dag.h),
 * but it must not crash, leak or end up unable to dump itself.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/change.h"
#include "crdt/dag.h"
#include "crdt/doc.h"
#include "crdt/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char *__asan_default_options(void);

/* For runs under ASan (the corpus replay in the sanitizer leg; the fuzz
 * binary itself is built without ASan, see fuzz/CMakeLists.txt): an exec
 * allocates and frees a few hundred KB (four replicas); ASan's default 256 MB
 * quarantine then makes every allocation touch a fresh page, and page faults
 * were half of the run's time. 16 MB still holds the frees of the last ~50
 * execs, so a use after free within an exec is caught as before.
 * ASAN_OPTIONS overrides it. */
const char *__asan_default_options(void)
{
    return "quarantine_size_mb=16";
}

#define NREP 3
#define VICTIM NREP
#define MAX_MSGS 512
#define MAX_CMDS 400

struct in {
    const uint8_t *p;
    size_t n;
};

static unsigned next(struct in *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

struct sim {
    cairn_doc *docs[NREP + 1];
    uint8_t *msg[MAX_MSGS];
    size_t len[MAX_MSGS];
    size_t nmsg;
    uint16_t inbox[NREP + 1][MAX_MSGS];
    size_t nin[NREP + 1];
    int evicted[NREP + 1]; /* its pending buffer dropped something */
};

static void check(int cond)
{
    if (!cond)
        abort();
}

static void deliver(struct sim *s, int r, size_t m)
{
    cairn_change *c;
    check(cairn_change_decode(&c, s->msg[m], s->len[m], NULL) == 0);
    int rc = cairn_doc_receive(s->docs[r], c, NULL);
    check(r == VICTIM || rc == 0);
}

static void deliver_pick(struct sim *s, int r, unsigned pick, int keep)
{
    if (!s->nin[r])
        return;
    size_t i = pick % s->nin[r];
    deliver(s, r, s->inbox[r][i]);
    if (!keep)
        s->inbox[r][i] = s->inbox[r][--s->nin[r]];
}

/* The victim gets a byte-flipped copy of message |m|. */
static void hostile(struct sim *s, size_t m, unsigned at, unsigned x)
{
    uint8_t *b = malloc(s->len[m]);
    if (!b)
        abort();
    memcpy(b, s->msg[m], s->len[m]);
    b[at % s->len[m]] ^= (uint8_t)(x | 1);
    cairn_change *c;
    if (cairn_change_decode(&c, b, s->len[m], NULL) == 0)
        (void)cairn_doc_receive(s->docs[VICTIM], c, NULL);
    free(b);
}

static int obj_at(cairn_doc *d, const char *key, int want, cairn_objid *out)
{
    cairn_read r;
    check(cairn_doc_get(d, &r, CAIRN_ROOT, (const uint8_t *)key, strlen(key)) == 0);
    *out = r.obj;
    return r.kind == want;
}

static void edit(cairn_doc *d, struct in *in)
{
    static const char *keys[] = {"a", "b", "", "k\0z", "m", "l", "n", "dd"};
    static const size_t klen[] = {1, 1, 0, 3, 1, 1, 1, 2};
    unsigned op = next(in), arg = next(in);
    char val[8] = {'v', (char)('a' + arg % 26), 0};
    cairn_value v = {.type = CAIRN_V_STR};
    v.v.bytes.ptr = (const uint8_t *)val;
    v.v.bytes.len = 2;
    unsigned k = arg % 8;
    cairn_objid o = CAIRN_ROOT, made;
    size_t n;
    int rc;
    switch (op % 10) {
    case 0:
    case 1:
        if ((op & 0x10) && !obj_at(d, "m", CAIRN_READ_MAP, &o))
            o = CAIRN_ROOT;
        check(cairn_doc_put(d, o, (const uint8_t *)keys[k], klen[k], &v) == 0);
        break;
    case 2:
        if ((op & 0x10) && !obj_at(d, "m", CAIRN_READ_MAP, &o))
            o = CAIRN_ROOT;
        rc = cairn_doc_delete(d, o, (const uint8_t *)keys[k], klen[k]);
        check(rc == 0 || rc == CAIRN_ENOTFOUND);
        break;
    case 3:
        check(cairn_doc_put_object(d, &made, CAIRN_ROOT, (const uint8_t *)(op & 0x20 ? "l" : "m"),
                                   1, op & 0x40 ? CAIRN_OBJ_LIST : CAIRN_OBJ_MAP) == 0);
        break;
    case 4:
    case 5:
        if (obj_at(d, "l", CAIRN_READ_LIST, &o)) {
            check(cairn_doc_length(d, &n, o) == 0);
            if (op & 0x80)
                check(cairn_doc_list_insert_object(d, &made, o, arg % (n + 1), CAIRN_OBJ_MAP) == 0);
            else
                check(cairn_doc_list_insert(d, o, arg % (n + 1), &v) == 0);
        }
        break;
    case 6:
        if (obj_at(d, "l", CAIRN_READ_LIST, &o)) {
            check(cairn_doc_length(d, &n, o) == 0);
            if (!n)
                break;
            if (op & 0x10)
                check(cairn_doc_list_delete(d, o, arg % n) == 0);
            else
                check(cairn_doc_list_set(d, o, arg % n, &v) == 0);
        }
        break;
    case 7:
    case 8: {
        cairn_read r;
        check(cairn_doc_get(d, &r, CAIRN_ROOT, (const uint8_t *)"n", 1) == 0);
        if (r.kind == CAIRN_READ_SCALAR && r.value.type == CAIRN_V_COUNTER) {
            check(cairn_doc_increment(d, CAIRN_ROOT, (const uint8_t *)"n", 1,
                                      (int64_t)(int8_t)arg) == 0);
        } else {
            cairn_value cv = {.type = CAIRN_V_COUNTER, .v.i = (int64_t)arg};
            check(cairn_doc_put(d, CAIRN_ROOT, (const uint8_t *)"n", 1, &cv) == 0);
        }
        break;
    }
    default: /* list counters and maps inside lists */
        if (obj_at(d, "l", CAIRN_READ_LIST, &o)) {
            check(cairn_doc_length(d, &n, o) == 0);
            if (!n)
                break;
            cairn_read r;
            check(cairn_doc_list_get(d, &r, o, arg % n) == 0);
            if (r.kind == CAIRN_READ_MAP) {
                check(cairn_doc_put(d, r.obj, (const uint8_t *)keys[k], klen[k], &v) == 0);
            } else if (r.kind == CAIRN_READ_SCALAR && r.value.type == CAIRN_V_COUNTER) {
                check(cairn_doc_list_increment(d, o, arg % n, 1) == 0);
            } else {
                cairn_value cv = {.type = CAIRN_V_COUNTER, .v.i = 1};
                check(cairn_doc_list_set(d, o, arg % n, &cv) == 0);
            }
        }
        break;
    }
}

static void same(cairn_doc *a, cairn_doc *b)
{
    uint8_t *da, *db;
    size_t la, lb;
    check(cairn_doc_dump(&da, &la, a) == 0);
    check(cairn_doc_dump(&db, &lb, b) == 0);
    check(la == lb && memcmp(da, db, la) == 0);
    free(da);
    free(db);
    const cairn_hash *ha, *hb;
    size_t na = cairn_dag_heads(cairn_doc_dag(a), &ha);
    size_t nb = cairn_dag_heads(cairn_doc_dag(b), &hb);
    check(na == nb && (na == 0 || memcmp(ha, hb, na * sizeof *ha) == 0));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct in in = {data, size};
    struct sim *s = calloc(1, sizeof *s);
    if (!s)
        return 0;
    for (int r = 0; r <= NREP; r++) {
        cairn_actor a;
        memset(a.b, 0, sizeof a.b);
        a.b[0] = (uint8_t)(0x40 * (r + 1) - 1);
        a.b[15] = (uint8_t)r;
        check(cairn_doc_new(&s->docs[r], &a) == 0);
    }
    uint64_t now = 100;
    for (int cmd = 0; cmd < MAX_CMDS && in.n; cmd++) {
        unsigned b = next(&in);
        int r = (int)((b >> 4) % NREP);
        switch (b & 15) {
        case 0:
        case 1:
        case 2:
        case 3:
        case 4:
        case 5: {
            if (s->nmsg >= MAX_MSGS)
                break;
            unsigned clock = next(&in);
            now += clock & 3;
            uint64_t t = clock & 0x80 ? 0 : now + (clock >> 4);
            check(cairn_doc_begin(s->docs[r], t) == 0);
            for (unsigned k = (b & 3) + 1; k > 0; k--)
                edit(s->docs[r], &in);
            if ((b & 15) == 5) {
                cairn_doc_rollback(s->docs[r]);
                break;
            }
            const cairn_change *c;
            check(cairn_doc_commit(s->docs[r], &c, NULL) == 0);
            if (!c)
                break;
            s->msg[s->nmsg] = malloc(c->len);
            if (!s->msg[s->nmsg])
                abort();
            memcpy(s->msg[s->nmsg], c->bytes, c->len);
            s->len[s->nmsg] = c->len;
            for (int q = 0; q <= NREP; q++)
                if (q != r)
                    s->inbox[q][s->nin[q]++] = (uint16_t)s->nmsg;
            s->nmsg++;
            break;
        }
        case 6:
        case 7:
        case 8:
        case 9:
        case 10:
        case 11:
            deliver_pick(s, r, next(&in), 0);
            break;
        case 12: /* a duplicate: deliver and keep */
            deliver_pick(s, r, next(&in), 1);
            break;
        case 13:
            deliver_pick(s, VICTIM, next(&in), 0);
            break;
        case 14: { /* the pending buffer ages (the victim's with 0xfe) */
            int q = b == 0xfe ? VICTIM : r;
            now++;
            size_t k = cairn_doc_expire_pending(s->docs[q], now, next(&in) & 3);
            check(cairn_dag_check_(cairn_doc_dag(s->docs[q])) == 0);
            s->evicted[q] |= k > 0;
            break;
        }
        default:
            if (s->nmsg) {
                unsigned m = next(&in), at = next(&in);
                at |= next(&in) << 8;
                hostile(s, m % s->nmsg, at, next(&in));
            }
            break;
        }
    }
    /* full delivery (a replica that dropped pending changes gets everything
     * again, as sync sends it: in the order it was made), then the property */
    for (int r = 0; r <= NREP; r++) {
        while (s->nin[r])
            deliver_pick(s, r, 0, 0);
        for (size_t m = 0; s->evicted[r] && m < s->nmsg; m++)
            deliver(s, r, m);
        check(r == VICTIM || cairn_dag_pending_count(cairn_doc_dag(s->docs[r])) == 0);
    }
    for (int r = 1; r < NREP; r++)
        same(s->docs[0], s->docs[r]);
    uint8_t *dv;
    size_t lv;
    check(cairn_doc_dump(&dv, &lv, s->docs[VICTIM]) == 0);
    free(dv);

    for (size_t m = 0; m < s->nmsg; m++)
        free(s->msg[m]);
    for (int r = 0; r <= NREP; r++)
        cairn_doc_free(s->docs[r]);
    free(s);
    return 0;
}
