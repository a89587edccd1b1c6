/*
 * Fuzz target: a two-replica sync session driven by the input. The input's
 * first byte picks the limits (a tiny, almost always false-positive filter;
 * tiny messages; history samples even for short histories); every following byte is an operation:
 * local edits on either side (keys from the input, so writes conflict), optimistic pushes,
 * generating a message into the network, delivering any in-flight message
 * (reordering) — applying what it carried at once, or holding it back like
 * a store whose commit is still in flight (applied before that node's next
 * delivery, while the session goes on talking) —, dropping or duplicating one, a timer reset, a
 * restart that loses the sync state or reloads its saved form. Then the network becomes reliable:
 * after one reset on each side, ping-pong must go quiet within a bound and both replicas must hold
 * the same heads and the same state. Honest messages are never rejected.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/doc.h"
#include "crdt/error.h"
#include "crdt/sync.h"
#include "tests/unit/sync_apply.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char *__asan_default_options(void);

/* An exec allocates and frees a few hundred KB (its replicas); ASan's default
 * 256 MB quarantine then makes every allocation touch a fresh page, and
 * page faults were half of the run's time. 16 MB still holds the frees of
 * the last ~50 execs, so a use after free within an exec is caught as
 * before. ASAN_OPTIONS overrides it. */
const char *__asan_default_options(void)
{
    return "quarantine_size_mb=16";
}

#define WIRE 16
#define MAX_OPS 200

struct wire {
    uint8_t *m[WIRE];
    size_t len[WIRE];
    size_t n;
};

struct sim {
    cairn_doc *doc[2];
    cairn_sync_state *st[2];
    struct wire w[2]; /* w[i]: to node i */
    cairn_sync_limits lim;
    uint64_t clock;
    uint8_t salt_ctr;
    /* Received but not applied yet (the session must not claim them). */
    cairn_change **held[2];
    size_t nheld[2], capheld[2];
};

static void wire_put(struct wire *w, uint8_t *m, size_t len)
{
    if (w->n == WIRE) {
        free(m);
        return;
    }
    w->m[w->n] = m;
    w->len[w->n++] = len;
}

static void wire_take(struct wire *w, size_t i, uint8_t **m, size_t *len)
{
    *m = w->m[i];
    *len = w->len[i];
    memmove(&w->m[i], &w->m[i + 1], (w->n - i - 1) * sizeof w->m[0]);
    memmove(&w->len[i], &w->len[i + 1], (w->n - i - 1) * sizeof w->len[0]);
    w->n--;
}

static void salt(struct sim *s, uint8_t out[CAIRN_BLOOM_SALT_LEN])
{
    memset(out, 0, CAIRN_BLOOM_SALT_LEN);
    out[0] = s->salt_ctr++;
    out[1] = 0x5C;
}

static void new_state(struct sim *s, int node)
{
    cairn_sync_state_free(s->st[node]);
    s->st[node] = NULL;
    if (cairn_sync_state_new(&s->st[node], &s->lim))
        abort();
}

static void edit(struct sim *s, int node, uint8_t key, int n, int push)
{
    cairn_doc *d = s->doc[node];
    cairn_change *made[4];
    int k = 0;
    for (int i = 0; i < n; i++) {
        uint8_t kb[2] = {'k', (uint8_t)(key + i)};
        if (cairn_doc_begin(d, ++s->clock))
            abort();
        int rc;
        if (key & 0x80) {
            rc = cairn_doc_delete(d, CAIRN_ROOT, kb, 2);
        } else if (key & 0x40) {
            rc = cairn_doc_increment(d, CAIRN_ROOT, kb, 2, 1);
        } else {
            cairn_value v = {.type = CAIRN_V_UINT};
            v.v.u = s->clock;
            rc = cairn_doc_put(d, CAIRN_ROOT, kb, 2, &v);
        }
        if (rc) { /* e.g. increment of a non-counter: nothing to commit */
            cairn_doc_rollback(d);
            continue;
        }
        const cairn_change *c = NULL;
        if (cairn_doc_commit(d, &c, NULL))
            abort();
        /* commit's change is borrowed only until the next begin: keep a copy */
        if (c && cairn_change_decode(&made[k++], c->bytes, c->len, &c->hash))
            abort();
    }
    if (push && k) {
        uint8_t *m = NULL;
        size_t len = 0, np = 0;
        /* push 2: naming only the last change as the heads (the server's) */
        if (push == 2 ? cairn_sync_push_heads(&m, &len, &np, d, s->st[node],
                                              (const cairn_change *const *)made, (size_t)k,
                                              &made[k - 1]->hash, 1)
                      : cairn_sync_push(&m, &len, &np, d, s->st[node],
                                        (const cairn_change *const *)made, (size_t)k))
            abort();
        if (m)
            wire_put(&s->w[1 - node], m, len);
    }
    for (int i = 0; i < k; i++)
        cairn_change_free(made[i]);
}

static void generate(struct sim *s, int node, int *sent)
{
    uint8_t sl[CAIRN_BLOOM_SALT_LEN], *m = NULL;
    size_t len = 0;
    salt(s, sl);
    if (cairn_sync_generate(&m, &len, s->doc[node], s->st[node], sl))
        abort();
    if (sent)
        *sent = m != NULL;
    if (m)
        wire_put(&s->w[1 - node], m, len);
}

/* Applies what |node| held back, then tells its session. */
static void apply_held(struct sim *s, int node)
{
    for (size_t i = 0; i < s->nheld[node]; i++)
        if (cairn_doc_receive(s->doc[node], s->held[node][i], NULL))
            abort(); /* an honest peer's change was refused */
    s->nheld[node] = 0;
    if (cairn_sync_applied(s->st[node], s->doc[node]))
        abort();
}

static void deliver(struct sim *s, int node, size_t i, int hold)
{
    uint8_t *m;
    size_t len;
    wire_take(&s->w[node], i, &m, &len);
    if (!hold) {
        apply_held(s, node);
        if (sync_apply(s->doc[node], s->st[node], m, len, NULL))
            abort(); /* an honest peer's message was refused */
        free(m);
        return;
    }
    cairn_change **c;
    size_t n;
    if (cairn_sync_receive(&c, &n, s->st[node], s->doc[node], m, len))
        abort();
    free(m);
    if (s->nheld[node] + n > s->capheld[node]) {
        size_t cap = 2 * (s->nheld[node] + n);
        cairn_change **p = realloc(s->held[node], cap * sizeof *p);
        if (!p)
            abort();
        s->held[node] = p;
        s->capheld[node] = cap;
    }
    if (n)
        memcpy(s->held[node] + s->nheld[node], c, n * sizeof *c);
    s->nheld[node] += n;
    free(c);
}

static int same_heads(const cairn_doc *a, const cairn_doc *b)
{
    const cairn_hash *ha, *hb;
    size_t na = cairn_dag_heads(cairn_doc_dag(a), &ha);
    size_t nb = cairn_dag_heads(cairn_doc_dag(b), &hb);
    return na == nb && (na == 0 || memcmp(ha, hb, na * sizeof *ha) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct sim s;
    memset(&s, 0, sizeof s);
    s.clock = 1000;
    cairn_sync_limits_default(&s.lim);
    if (data[0] & 1) {
        s.lim.max_filter_bytes = 1 + (data[0] >> 4 & 1);
        s.lim.bloom_probes = 1 + (data[0] >> 5 & 3);
    }
    if (data[0] & 2) {
        s.lim.max_changes = 2;
        s.lim.target_msg_bytes = 64;
    }
    if (data[0] & 4)
        s.lim.sample_min_changes = data[0] >> 3 & 1; /* samples from 1-2 changes on */
    for (int i = 0; i < 2; i++) {
        cairn_actor a;
        memset(a.b, 0, sizeof a.b);
        a.b[0] = (uint8_t)(i + 1);
        if (cairn_doc_new(&s.doc[i], &a))
            abort();
        new_state(&s, i);
    }
    size_t pos = 1, ops = 0;
    int ticked[2] = {0, 0};
    while (pos < size && ops++ < MAX_OPS) {
        uint8_t op = data[pos++];
        uint8_t arg = pos < size ? data[pos] : 0;
        int node = op >> 7;
        switch (op % 10) {
        case 0:
        case 1:
            pos++;
            edit(&s, node, arg, 1 + (op >> 4 & 3), op % 10 == 1 ? 1 + (op >> 6 & 1) : 0);
            break;
        case 3: /* with bit 6: the timer's tick first (the server's mode) */
            if (op & 0x40) {
                cairn_sync_tick(s.st[node], s.doc[node]);
                ticked[node] = 1;
            }
            /* fall through */
        case 2:
            generate(&s, node, NULL);
            break;
        case 4:
        case 5: /* 5: hold back what it carried */
            pos++;
            if (s.w[node].n)
                deliver(&s, node, arg % s.w[node].n, op % 10 == 5);
            break;
        case 6: /* drop */
            pos++;
            if (s.w[node].n) {
                uint8_t *m;
                size_t len;
                wire_take(&s.w[node], arg % s.w[node].n, &m, &len);
                free(m);
            }
            break;
        case 7: /* duplicate */
            pos++;
            if (s.w[node].n && s.w[node].n < WIRE) {
                size_t i = arg % s.w[node].n;
                uint8_t *c = malloc(s.w[node].len[i]);
                if (!c)
                    abort();
                memcpy(c, s.w[node].m[i], s.w[node].len[i]);
                wire_put(&s.w[node], c, s.w[node].len[i]);
            }
            break;
        case 8:
            cairn_sync_reset(s.st[node]);
            break;
        case 9: /* restart: the state is lost, or reloaded from its saved form */
            if (op & 0x40) {
                uint8_t *buf = NULL;
                size_t len = 0;
                cairn_sync_state *t = NULL;
                if (cairn_sync_state_save(&buf, &len, s.st[node]) ||
                    cairn_sync_state_load(&t, buf, len, &s.lim))
                    abort();
                free(buf);
                cairn_sync_state_free(s.st[node]);
                s.st[node] = t;
            } else {
                new_state(&s, node);
            }
            ticked[node] = 0;
            break;
        }
    }

    /* Reliable from now on. Every change needs at most a few rounds even when
     * each one is a false positive and recovered by hash. */
    for (int i = 0; i < 2; i++) {
        while (s.w[i].n) {
            uint8_t *m;
            size_t len;
            wire_take(&s.w[i], 0, &m, &len);
            free(m);
        }
        apply_held(&s, i);
        cairn_sync_reset(s.st[i]);
    }
    uint64_t total =
        cairn_dag_count(cairn_doc_dag(s.doc[0])) + cairn_dag_count(cairn_doc_dag(s.doc[1]));
    uint64_t bound = 8 + 2 * total, r;
    for (r = 0; r < bound; r++) {
        int a = 0, b = 0;
        for (int i = 0; i < 2; i++)
            if (ticked[i])
                cairn_sync_tick(s.st[i], s.doc[i]);
        generate(&s, 0, &a);
        if (a)
            deliver(&s, 1, 0, 0);
        generate(&s, 1, &b);
        if (b)
            deliver(&s, 0, 0, 0);
        if (!a && !b)
            break;
    }
    if (r == bound)
        abort(); /* never went quiet */
    if (!same_heads(s.doc[0], s.doc[1]))
        abort(); /* quiet but not converged */
    uint8_t *da = NULL, *db = NULL;
    size_t la = 0, lb = 0;
    if (cairn_doc_dump(&da, &la, s.doc[0]) || cairn_doc_dump(&db, &lb, s.doc[1]))
        abort();
    if (la != lb || memcmp(da, db, la) != 0)
        abort(); /* same heads, different state */
    free(da);
    free(db);
    /* Both know the other has everything. */
    const cairn_hash *h;
    size_t nh = cairn_dag_heads(cairn_doc_dag(s.doc[0]), &h);
    for (size_t i = 0; i < nh; i++)
        if (!cairn_sync_peer_has(s.st[0], s.doc[0], &h[i]) ||
            !cairn_sync_peer_has(s.st[1], s.doc[1], &h[i]))
            abort();
    for (int i = 0; i < 2; i++) {
        cairn_sync_state_free(s.st[i]);
        cairn_doc_free(s.doc[i]);
        free(s.held[i]);
    }
    return 0;
}
