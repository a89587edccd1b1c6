/*
 * The checkpoint (store.h: CHECKPOINT). The property under test: a store
 * opened from its checkpoint answers exactly as the same data dir with the
 * checkpoint removed (a full replay). "Answers" is a fingerprint of
 * everything observable and everything derived: a range of every key at
 * every revision (what HashKV hashes), the watch history, the hash of every
 * revision, revision and compacted revision, leases with their keys and
 * TTLs, the document's canonical dump and heads, and the internal key
 * index, revision map and lease table.
 *
 * Then: a checkpoint older than the database (a crash after the clean
 * close) loads and replays the tail; every reason to refuse one (corrupt
 * byte, truncation, bad checksum, another actor, N beyond the stored
 * changes, a last hash that is not the stored change's, compaction since,
 * a state section that does not decode, a document and index that
 * disagree, a tail that does not replay onto it, the RESTORED marker)
 * falls back to a full replay and loses nothing.
 */

#include <sys/stat.h>

#include "../store/store_test.h"
#include "store/store_int.h"

/* ---- fingerprint ---------------------------------------------------------- */

static void hex(FILE *f, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", p[i]);
}

static void kv_line(FILE *f, const cairn_kv *kv)
{
    fprintf(f, " [");
    hex(f, kv->key, kv->key_len);
    fprintf(f, "=");
    hex(f, kv->value, kv->value_len);
    fprintf(f, " c%lld m%lld v%lld l%lld]", (long long)kv->create_revision,
            (long long)kv->mod_revision, (long long)kv->version, (long long)kv->lease);
}

static int hist_cb(void *arg, int64_t rev, const cairn_event *ev, size_t nev)
{
    FILE *f = arg;
    fprintf(f, "h%lld:", (long long)rev);
    for (size_t i = 0; i < nev; i++) {
        fprintf(f, " t%d", ev[i].type);
        kv_line(f, &ev[i].kv);
    }
    fprintf(f, "\n");
    return 0;
}

static int i64cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Everything a client or the next layer can see, and everything replay
 * derives. |with_actor| = 0 leaves the actor out (a restored copy). */
static char *fingerprint(cairn_store *s, int with_actor)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    cairn_header h;
    cairn_store_header(s, &h);
    int64_t comp = cairn_store_compacted_rev(s);
    fprintf(f, "rev %lld compacted %lld member %llx cluster %llx\n", (long long)h.revision,
            (long long)comp, (unsigned long long)h.member_id, (unsigned long long)h.cluster_id);
    if (with_actor) {
        cairn_actor a;
        cairn_store_actor(s, &a);
        fprintf(f, "actor ");
        hex(f, a.b, CAIRN_ACTOR_LEN);
        fprintf(f, "\n");
    }
    /* every key at every revision still readable */
    for (int64_t r = comp > 1 ? comp : 1; r <= h.revision; r++) {
        cairn_range_req q = {0};
        q.key = (const uint8_t *)"\0";
        q.key_len = 1;
        q.range_end = (const uint8_t *)"\0";
        q.range_end_len = 1;
        q.revision = r;
        cairn_range_resp resp;
        int rc = cairn_store_range(s, &resp, &q);
        fprintf(f, "r%lld rc%d n%lld:", (long long)r, rc, rc ? 0 : (long long)resp.count);
        for (size_t i = 0; !rc && i < resp.nkvs; i++)
            kv_line(f, &resp.kvs[i]);
        fprintf(f, "\n");
        if (!rc)
            cairn_range_resp_destroy(&resp);
        cairn_hash rh;
        rc = cairn_store_rev_hash(s, &rh, r);
        fprintf(f, "rh%lld rc%d ", (long long)r, rc);
        hex(f, rh.b, CAIRN_HASH_LEN);
        fprintf(f, "\n");
    }
    int64_t last;
    ck_assert_int_eq(cairn_store_history(s, &last, comp > 1 ? comp : 1, (const uint8_t *)"\0", 1,
                                         (const uint8_t *)"\0", 1, hist_cb, f),
                     0);
    fprintf(f, "history to %lld\n", (long long)last);
    int64_t *ids;
    size_t nids;
    ck_assert_int_eq(cairn_store_lease_list(s, &ids, &nids), 0);
    for (size_t i = 0; i < nids; i++) {
        cairn_lease_ttl_resp t;
        ck_assert_int_eq(cairn_store_lease_ttl(s, &t, ids[i], 1), 0);
        fprintf(f, "lease %lld ttl %lld granted %lld keys:", (long long)ids[i], (long long)t.ttl,
                (long long)t.granted_ttl);
        for (size_t k = 0; k < t.nkeys; k++) {
            fprintf(f, " ");
            hex(f, t.keys[k].key, t.keys[k].key_len);
        }
        fprintf(f, "\n");
        cairn_lease_ttl_resp_destroy(&t);
    }
    free(ids);

    /* the document and its DAG */
    uint8_t *dump;
    size_t dl;
    ck_assert_int_eq(cairn_doc_dump(&dump, &dl, s->doc), 0);
    cairn_hash dh;
    cairn_hash_bytes(&dh, dump, dl);
    free(dump);
    const cairn_dag *dag = cairn_doc_dag(s->doc);
    fprintf(f, "doc ");
    hex(f, dh.b, CAIRN_HASH_LEN);
    fprintf(f, " changes %llu heads", (unsigned long long)cairn_dag_count(dag));
    const cairn_hash *heads;
    size_t nh = cairn_dag_heads(dag, &heads);
    for (size_t i = 0; i < nh; i++) {
        fprintf(f, " ");
        hex(f, heads[i].b, CAIRN_HASH_LEN);
    }
    fprintf(f, "\n");
    for (uint64_t i = 0; i < cairn_dag_count(dag); i++) {
        fprintf(f, "c%llu ", (unsigned long long)i);
        hex(f, cairn_dag_hash_at(dag, i)->b, CAIRN_HASH_LEN);
        fprintf(f, "\n");
    }

    /* what replay derives, as it is in memory */
    kiter it;
    fprintf(f, "index %llu\n", (unsigned long long)s->idx.nkeys);
    for (const kentry *e = cairn_kindex_first(&it, &s->idx); e; e = cairn_kindex_next(&it)) {
        hex(f, e->key, e->key_len);
        fprintf(f, " c%lld v%lld l%lld:", (long long)e->create_rev, (long long)e->version,
                (long long)e->lease);
        for (uint32_t i = 0; i < e->nhist; i++)
            fprintf(f, " %llx", (unsigned long long)e->hist[i]);
        fprintf(f, "\n");
    }
    fprintf(f, "revmap last %lld:", (long long)s->rm.last);
    for (size_t i = 0; i < s->rm.n; i++)
        fprintf(f, " %lld@%llu", (long long)s->rm.rev[i], (unsigned long long)s->rm.idx[i]);
    fprintf(f, "\n");
    int64_t lids[256];
    size_t nl = 0;
    for (size_t b = 0; b < s->lt.nb; b++)
        for (lease_ent *l = s->lt.by_id[b]; l; l = l->next_id) {
            ck_assert_uint_lt(nl, 256);
            lids[nl++] = l->id;
        }
    qsort(lids, nl, sizeof *lids, i64cmp);
    for (size_t i = 0; i < nl; i++)
        for (size_t b = 0; b < s->lt.nb; b++)
            for (lease_ent *l = s->lt.by_id[b]; l; l = l->next_id)
                if (l->id == lids[i])
                    fprintf(f, "lt %lld live%d obj%d/%d ttl%lld dl%lld local%lld keys%zu\n",
                            (long long)l->id, l->live, l->has_obj, l->in_obj, (long long)l->ttl,
                            (long long)l->deadline, (long long)atomic_load(&l->local_deadline),
                            l->nkeys);
    fprintf(f, "lt n%zu\n", s->lt.n);
    fclose(f);
    return buf;
}

static void same_text(const char *a, const char *b, const char *what)
{
    if (strcmp(a, b) == 0)
        return;
    size_t i = 0;
    while (a[i] && a[i] == b[i])
        i++;
    size_t from = i > 200 ? i - 200 : 0;
    ck_abort_msg("%s differ at byte %zu:\n--- checkpoint:\n%.400s\n--- full replay:\n%.400s", what,
                 i, a + from, b + from);
}

/* ---- workload -------------------------------------------------------------- */

static void txn_puts(cairn_store *s, const char *k1, const char *k2, const char *v)
{
    cairn_request_op ops[2];
    memset(ops, 0, sizeof ops);
    const char *ks[2] = {k1, k2};
    for (int i = 0; i < 2; i++) {
        ops[i].type = CAIRN_REQ_PUT;
        ops[i].u.put.key = (const uint8_t *)ks[i];
        ops[i].u.put.key_len = strlen(ks[i]);
        ops[i].u.put.value = (const uint8_t *)v;
        ops[i].u.put.value_len = strlen(v);
    }
    cairn_txn_req t = {0};
    t.success = ops;
    t.nsuccess = 2;
    cairn_txn_resp resp;
    ck_assert_int_eq(cairn_store_txn(s, &resp, &t), 0);
    cairn_txn_resp_destroy(&resp);
}

/* Changes from another node of the same cluster, merged in: two of its
 * writes conflict with ours (same keys), one deletes a key of ours. */
static void merge_peer(cairn_store *s, int round)
{
    char *pd = make_tmpdir();
    cairn_store_options o;
    cairn_store_options_init(&o);
    cairn_actor peer; /* one per round: a second life of one actor would fork */
    memset(peer.b, 9, CAIRN_ACTOR_LEN);
    peer.b[0] = (uint8_t)round;
    o.actor = &peer;
    captured cap;
    memset(&cap, 0, sizeof cap);
    cairn_store_subscriber sub = {capture, &cap};
    o.subscribers = &sub;
    o.nsubscribers = 1;
    cairn_store *p = open_store_opts(pd, &o);
    char k[32], v[32];
    for (int i = 0; i < 4; i++) {
        snprintf(k, sizeof k, "k%03d", i * 7);
        snprintf(v, sizeof v, "peer-%d-%d", round, i);
        put_kv(p, k, v);
    }
    put_kv(p, "k003", "doomed");
    del_range(p, "k003", NULL, NULL);
    cairn_store_close(p);
    for (int i = 0; i < cap.n; i++)
        ck_assert_int_eq(cairn_store_receive(s, cap.bytes[i], cap.len[i]), 0);
    captured_free(&cap);
    rm_rf(pd);
    free(pd);
}

/* A history with everything replay derives: overwrites, deletes, a range
 * delete, a Txn, leases with keys (one revoked, one live), a merged peer,
 * optionally a compaction in the middle. */
static void workload(cairn_store *s, int round, int compact)
{
    char k[32], v[32];
    for (int i = 0; i < 40; i++) {
        snprintf(k, sizeof k, "k%03d", (i * 13 + round) % 30);
        snprintf(v, sizeof v, "v%d-%d", round, i);
        put_kv(s, k, v);
    }
    del_range(s, "k010", "k014", NULL);
    snprintf(k, sizeof k, "t%d", round);
    txn_puts(s, k, "k001", "txn");
    int64_t l1 = 1000 + round, l2 = 2000 + round;
    ck_assert_int_eq(cairn_store_lease_grant(s, l1, 600), 0);
    ck_assert_int_eq(cairn_store_lease_grant(s, l2, 30), 0);
    snprintf(k, sizeof k, "leased-%d-a", round);
    put_leased(s, k, "la", l1);
    snprintf(k, sizeof k, "leased-%d-b", round);
    put_leased(s, k, "lb", l1);
    snprintf(k, sizeof k, "short-%d", round);
    put_leased(s, k, "s", l2);
    put_leased(s, "k020", "moved-to-lease", l2);
    cairn_header h;
    ck_assert_int_eq(cairn_store_lease_revoke(s, &h, l2), 0);
    merge_peer(s, round);
    if (compact) {
        int64_t r = cur_rev(s) - 15;
        ck_assert_int_eq(cairn_store_compact(s, &h, r, 0), 0);
    }
    for (int i = 0; i < 10; i++) {
        snprintf(k, sizeof k, "z%d-%02d", round, i);
        put_kv(s, k, "after");
    }
    put_kv(s, "k001", "last");
}

/* ---- helpers ------------------------------------------------------------------ */

static char *path_in(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static int exists(const char *dir, const char *name)
{
    char *p = path_in(dir, name);
    struct stat st;
    int r = stat(p, &st) == 0;
    free(p);
    return r;
}

static void sh(const char *fmt, const char *a, const char *b)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    ck_assert_int_eq(system(cmd), 0);
}

/* A copy of |dir| without its checkpoint: the reference, fully replayed. */
static char *copy_without(const char *dir)
{
    char *d = make_tmpdir();
    sh("cp -a '%s/.' '%s/'", dir, d);
    char *p = path_in(d, CAIRN_CKPT_FILE);
    unlink(p);
    free(p);
    return d;
}

static uint8_t *read_file(const char *dir, size_t *len)
{
    char *p = path_in(dir, CAIRN_CKPT_FILE);
    FILE *f = fopen(p, "rb");
    free(p);
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void write_file(const char *dir, const uint8_t *b, size_t len)
{
    char *p = path_in(dir, CAIRN_CKPT_FILE);
    FILE *f = fopen(p, "wb");
    free(p);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(b, 1, len, f), len);
    fclose(f);
}

/* Opens |dir| and its checkpoint-less copy; checks that the first used (or
 * refused: |want_n| == 0) the checkpoint and that both answer the same. */
static int next_round = 10; /* workload rounds after a check: leases differ */

static void check_against_replay(const char *dir, uint64_t want_n, int with_actor)
{
    int round = next_round++;
    char *ref = copy_without(dir);
    cairn_store *a = open_store(dir);
    ck_assert_msg(a->ckpt_n == want_n, "opened from a checkpoint of %llu changes, want %llu",
                  (unsigned long long)a->ckpt_n, (unsigned long long)want_n);
    cairn_store *b = open_store(ref);
    ck_assert_uint_eq(b->ckpt_n, 0);
    char *fa = fingerprint(a, with_actor), *fb = fingerprint(b, with_actor);
    same_text(fa, fb, "open with and without the checkpoint");
    free(fa);
    free(fb);
    /* and they go on alike: the same writes make the same changes */
    workload(a, round, 0);
    workload(b, round, 0);
    fa = fingerprint(a, with_actor);
    fb = fingerprint(b, with_actor);
    same_text(fa, fb, "writes after the open");
    free(fa);
    free(fb);
    cairn_store_close(a);
    cairn_store_close(b);
    rm_rf(ref);
    free(ref);
}

/* A data dir after two rounds of the workload, closed cleanly. *n = the
 * changes its checkpoint covers. */
static char *prepared(int compact, uint64_t *n)
{
    char *dir = make_tmpdir();
    cairn_store *s = open_store(dir);
    workload(s, 0, compact);
    workload(s, 1, 0);
    *n = cairn_dag_count(cairn_doc_dag(s->doc));
    cairn_store_close(s);
    ck_assert(exists(dir, CAIRN_CKPT_FILE));
    ck_assert(!exists(dir, CAIRN_CKPT_FILE ".tmp"));
    return dir;
}

static void done(char *dir)
{
    rm_rf(dir);
    free(dir);
}

/* ---- tests ---------------------------------------------------------------------- */

START_TEST(identical_to_full_replay)
{
    uint64_t n;
    char *dir = prepared(_i, &n);
    check_against_replay(dir, n, 1);
    done(dir);
}
END_TEST

START_TEST(fresh_store_and_unchanged_reopen)
{
    char *dir = make_tmpdir();
    cairn_store *s = open_store(dir);
    cairn_store_close(s); /* only the genesis */
    ck_assert(exists(dir, CAIRN_CKPT_FILE));
    check_against_replay(dir, 2, 1); /* genesis and initial members */
    /* check_against_replay wrote more: reopen twice; the second close has
     * nothing new and leaves the file as it was */
    s = open_store(dir);
    uint64_t n = s->ckpt_n;
    ck_assert_uint_gt(n, 1);
    cairn_store_close(s);
    size_t l1, l2;
    uint8_t *b1 = read_file(dir, &l1);
    s = open_store(dir);
    ck_assert_uint_eq(s->ckpt_n, n);
    cairn_store_close(s);
    uint8_t *b2 = read_file(dir, &l2);
    ck_assert(l1 == l2 && memcmp(b1, b2, l1) == 0);
    free(b1);
    free(b2);
    done(dir);
}
END_TEST

START_TEST(tail_after_crash)
{
    uint64_t n;
    char *dir = prepared(0, &n);
    size_t len;
    uint8_t *old = read_file(dir, &len);
    /* more writes after the checkpoint; then the newer checkpoint is lost
     * (as after a crash: the clean close never happened) */
    cairn_store *s = open_store(dir);
    ck_assert_uint_eq(s->ckpt_n, n);
    workload(s, 2, 1); /* compacts: the old checkpoint is refused */
    cairn_store_close(s);
    s = open_store(dir);
    workload(s, 3, 0);
    uint64_t n2 = cairn_dag_count(cairn_doc_dag(s->doc));
    cairn_store_close(s);
    size_t len2;
    uint8_t *mid = read_file(dir, &len2);
    s = open_store(dir);
    workload(s, 4, 0);
    cairn_store_close(s);
    write_file(dir, mid, len2);
    check_against_replay(dir, n2, 1);
    /* the first one predates a compaction: refused */
    write_file(dir, old, len);
    check_against_replay(dir, 0, 1);
    free(old);
    free(mid);
    done(dir);
}
END_TEST

/* Rewrites the checkpoint with a valid checksum after |edit| changed its
 * fields or sections. */
typedef struct ckpt_copy {
    cairn_ckpt_head h;
    uint8_t *file;
    size_t len;
    uint8_t *doc, *state;
    size_t doc_len, state_len;
} ckpt_copy;

static void ckpt_load(ckpt_copy *c, const char *dir)
{
    c->file = read_file(dir, &c->len);
    ck_assert_int_eq(cairn_ckpt_parse(&c->h, c->file, c->len), 0);
    ck_assert_int_eq(cairn_ckpt_verify(&c->h), 0);
    c->doc = malloc(c->h.doc_len + 1);
    memcpy(c->doc, c->h.doc, c->h.doc_len);
    c->doc_len = c->h.doc_len;
    c->state = malloc(c->h.state_len + 1);
    memcpy(c->state, c->h.state, c->h.state_len);
    c->state_len = c->h.state_len;
}

static void ckpt_store(const ckpt_copy *c, const char *dir)
{
    ck_assert_int_eq(cairn_ckpt_write(dir, &c->h, c->doc, c->doc_len, c->state, c->state_len), 0);
}

/* Replaces the state section with a copy of |p|. */
static void set_state(ckpt_copy *c, const uint8_t *p, size_t n)
{
    free(c->state);
    c->state = malloc(n + 1);
    memcpy(c->state, p, n);
    c->state_len = n;
}

static void ckpt_drop(ckpt_copy *c)
{
    free(c->file);
    free(c->doc);
    free(c->state);
}

/* A data dir after round 0 of the workload (and, with |lease|, a grant:
 * a change that takes no revision), closed; *c = its checkpoint. */
static char *round0(ckpt_copy *c, int64_t lease)
{
    char *dir = make_tmpdir();
    cairn_store *s = open_store(dir);
    workload(s, 0, 0);
    if (lease)
        ck_assert_int_eq(cairn_store_lease_grant(s, lease, 100), 0);
    cairn_store_close(s);
    ckpt_load(c, dir);
    return dir;
}

/* The checkpoint now in |dir| must be refused and nothing lost. */
static void refused(char *dir, ckpt_copy *c)
{
    check_against_replay(dir, 0, 1);
    ckpt_drop(c);
    done(dir);
}

enum {
    BAD_BYTE_DOC,
    BAD_BYTE_STATE,
    BAD_BYTE_HEADER,
    TRUNCATED,
    EMPTY,
    EXTENDED,
    BAD_VERSION,
    N_BEYOND,
    N_SHORTER,
    WRONG_LAST,
    WRONG_ACTOR,
    WRONG_MEMBER,
    STATE_TRAILING,
    STATE_CUT,
    DOC_CUT,
    NREJECT
};

START_TEST(refused_falls_back)
{
    uint64_t n;
    char *dir = prepared(1, &n);
    ckpt_copy c;
    ckpt_load(&c, dir);
    uint8_t *b = malloc(c.len + 16);
    memcpy(b, c.file, c.len);
    switch (_i) {
    case BAD_BYTE_DOC:
        b[CAIRN_CKPT_HDR + CAIRN_CKPT_FIXED + c.doc_len / 2] ^= 0x40;
        write_file(dir, b, c.len);
        break;
    case BAD_BYTE_STATE:
        b[c.len - c.state_len / 2] ^= 0x01;
        write_file(dir, b, c.len);
        break;
    case BAD_BYTE_HEADER:
        b[3] ^= 0x20;
        write_file(dir, b, c.len);
        break;
    case TRUNCATED:
        write_file(dir, b, c.len - 100);
        break;
    case EMPTY:
        write_file(dir, b, 0);
        break;
    case EXTENDED:
        memset(b + c.len, 0, 16);
        write_file(dir, b, c.len + 16);
        break;
    case BAD_VERSION:
        b[11] = 99;
        write_file(dir, b, c.len);
        break;
    case N_BEYOND:
        c.h.nchanges = n + 5;
        ckpt_store(&c, dir);
        break;
    case N_SHORTER:
        c.h.nchanges = n - 1;
        ckpt_store(&c, dir);
        break;
    case WRONG_LAST:
        c.h.last.b[5] ^= 1;
        ckpt_store(&c, dir);
        break;
    case WRONG_ACTOR:
        c.h.actor.b[0] ^= 1;
        ckpt_store(&c, dir);
        break;
    case WRONG_MEMBER:
        c.h.member_id ^= 1;
        ckpt_store(&c, dir);
        break;
    case STATE_TRAILING:
        c.state[c.state_len++] = 0;
        ckpt_store(&c, dir);
        break;
    case STATE_CUT:
        c.state_len -= 3;
        ckpt_store(&c, dir);
        break;
    case DOC_CUT:
        c.doc_len -= 1;
        ckpt_store(&c, dir);
        break;
    default:
        break;
    }
    free(b);
    refused(dir, &c);
}
END_TEST

/* A checkpoint that passes every check at load but is not the state its
 * header names: its revision is one ahead (the revision map extended by a
 * run that is still a valid map). Nothing at load can tell; the tail replay
 * re-derives revisions that differ from the stored ones, and the store
 * starts over with a full replay. */
START_TEST(tail_mismatch_falls_back)
{
    /* a lease grant takes no revision, so the map has room for one more */
    ckpt_copy c;
    char *dir = round0(&c, 4242);
    cairn_store *s = open_store(dir);
    put_kv(s, "after-1", "x");
    put_kv(s, "after-2", "y");
    cairn_store_close(s);

    kindex x;
    revmap m;
    cairn_kindex_init(&x);
    cairn_revmap_init(&m);
    ck_assert_int_eq(
        cairn_ckpt_decode_state(&x, &m, NULL, c.state, c.state_len, c.h.nchanges, c.h.rev), 0);
    uint64_t i;
    ck_assert_int_eq(cairn_revmap_find(&m, &i, c.h.rev), 0);
    ck_assert_uint_lt(i + 1, c.h.nchanges);
    ck_assert_int_eq(cairn_revmap_add(&m, c.h.rev + 1, i + 1), 0);
    store_buf b = {0};
    ck_assert_int_eq(cairn_ckpt_encode_state(&b, &x, &m), 0);
    cairn_kindex_destroy(&x);
    cairn_revmap_destroy(&m);
    set_state(&c, b.p, b.len);
    cairn_store_buf_free(&b);
    c.h.rev++;
    ckpt_store(&c, dir);
    refused(dir, &c);
}
END_TEST

START_TEST(older_state_section)
{
    /* the state section of an earlier checkpoint under a later header and
     * document: keys were added since, so document and index disagree */
    ckpt_copy early;
    char *dir = round0(&early, 0);
    cairn_store *s = open_store(dir);
    workload(s, 1, 0);
    cairn_store_close(s);
    ckpt_copy late;
    ckpt_load(&late, dir);
    set_state(&late, early.state, early.state_len);
    late.h.rev = early.h.rev; /* so the revision map itself is consistent */
    ckpt_store(&late, dir);
    ckpt_drop(&early);
    refused(dir, &late);
}
END_TEST

/* A data dir rolled back (an older copy) and written again: it holds as
 * many changes as the checkpoint covers, with another history. The
 * checkpoint agrees with itself; only the stored change N-1 tells. */
START_TEST(rolled_back_dir_refuses)
{
    uint64_t n;
    char *dir = prepared(0, &n);
    char *old = make_tmpdir();
    sh("cp -a '%s/.' '%s/'", dir, old);
    cairn_store *s = open_store(dir);
    for (int i = 0; i < 5; i++)
        put_kv(s, "rolled", "original");
    uint64_t n1 = cairn_dag_count(cairn_doc_dag(s->doc));
    cairn_store_close(s);
    s = open_store(old);
    for (int i = 0; i < 5; i++)
        put_kv(s, "rolled", "rewritten");
    ck_assert_uint_eq(cairn_dag_count(cairn_doc_dag(s->doc)), n1);
    cairn_store_close(s);
    sh("cp '%s/checkpoint' '%s/checkpoint'", dir, old);
    check_against_replay(old, 0, 1);
    done(old);
    done(dir);
}
END_TEST

START_TEST(restored_dir_replays)
{
    uint64_t n;
    char *dir = prepared(0, &n);
    char *copy = make_tmpdir();
    sh("cp -a '%s/.' '%s/'", dir, copy);
    char *m = path_in(copy, CAIRN_STORE_RESTORE_MARKER);
    FILE *f = fopen(m, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    free(m);
    cairn_store *orig = open_store(dir);
    ck_assert_uint_eq(orig->ckpt_n, n);
    cairn_store *s = open_store(copy);
    ck_assert_uint_eq(s->ckpt_n, 0);
    ck_assert(!exists(copy, CAIRN_CKPT_FILE));
    ck_assert(!exists(copy, CAIRN_STORE_RESTORE_MARKER));
    char *fa = fingerprint(s, 0), *fb = fingerprint(orig, 0);
    same_text(fa, fb, "a restored copy and its original");
    free(fa);
    free(fb);
    cairn_actor a, b;
    cairn_store_actor(s, &a);
    cairn_store_actor(orig, &b);
    ck_assert(memcmp(a.b, b.b, CAIRN_ACTOR_LEN) != 0);
    cairn_store_close(orig);
    cairn_store_close(s);
    /* the copy's next checkpoint is its own */
    check_against_replay(copy, n, 1);
    done(copy);
    done(dir);
}
END_TEST

START_TEST(stale_checkpoint_beside_new_db)
{
    uint64_t n;
    char *dir = prepared(0, &n);
    char *db = path_in(dir, "db");
    rm_rf(db);
    free(db);
    cairn_store *s = open_store(dir);
    ck_assert_int_eq(cur_rev(s), 1);
    ck_assert_uint_eq(s->ckpt_n, 0);
    cairn_store_close(s);
    check_against_replay(dir, 2, 1); /* genesis and initial members */
    done(dir);
}
END_TEST

/* ---- the codec on its own --------------------------------------------------- */

START_TEST(state_codec_round_trip)
{
    kindex x;
    revmap m;
    cairn_kindex_init(&x);
    cairn_revmap_init(&m);
    /* keys sharing prefixes, an empty key, histories with deletes */
    const char *keys[] = {"", "a", "ab", "abc", "abd", "b", "b\xff", "c"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        kentry *e = cairn_kindex_upsert(&x, (const uint8_t *)keys[i], strlen(keys[i]));
        ck_assert_ptr_nonnull(e);
        for (uint32_t j = 0; j <= i % 3; j++)
            ck_assert_int_eq(cairn_kindex_push(e, (2 + i * 3 + j) | (j == 1 ? CAIRN_IDX_TOMB : 0)),
                             0);
        e->create_rev = 2 + (int64_t)i * 3;
        e->version = (int64_t)i;
        e->lease = i == 3 ? -5 : (int64_t)i * 1000;
    }
    int64_t rev = 2 + 7 * 3 + 2;
    ck_assert_int_eq(cairn_revmap_add(&m, 2, 1), 0);
    ck_assert_int_eq(cairn_revmap_add(&m, 10, 12), 0);
    ck_assert_int_eq(cairn_revmap_add(&m, rev, 12 + (uint64_t)(rev - 10)), 0);
    store_buf b = {0};
    ck_assert_int_eq(cairn_ckpt_encode_state(&b, &x, &m), 0);
    uint64_t nch = 12 + (uint64_t)(rev - 10) + 1;

    kindex y;
    revmap m2;
    cairn_kindex_init(&y);
    cairn_revmap_init(&m2);
    ck_assert_int_eq(cairn_ckpt_decode_state(&y, &m2, NULL, b.p, b.len, nch, rev), 0);
    ck_assert_uint_eq(y.nkeys, x.nkeys);
    kiter i1, i2;
    const kentry *e1 = cairn_kindex_first(&i1, &x), *e2 = cairn_kindex_first(&i2, &y);
    for (; e1; e1 = cairn_kindex_next(&i1), e2 = cairn_kindex_next(&i2)) {
        ck_assert_ptr_nonnull(e2);
        ck_assert(e1->key_len == e2->key_len && !memcmp(e1->key, e2->key, e1->key_len));
        ck_assert_int_eq(e1->nhist, e2->nhist);
        ck_assert(!memcmp(e1->hist, e2->hist, e1->nhist * sizeof *e1->hist));
        ck_assert(e1->create_rev == e2->create_rev && e1->version == e2->version &&
                  e1->lease == e2->lease);
        /* a loaded index is a working one */
        ck_assert_ptr_eq(cairn_kindex_find(&y, e1->key, e1->key_len), e2);
    }
    ck_assert_ptr_null(e2);
    ck_assert_uint_eq(m2.n, m.n);
    ck_assert_int_eq(m2.last, m.last);
    for (int64_t r = 1; r <= rev + 1; r++) {
        uint64_t a = 0, c = 0;
        ck_assert_int_eq(cairn_revmap_find(&m, &a, r), cairn_revmap_find(&m2, &c, r));
        ck_assert_uint_eq(a, c);
    }
    cairn_kindex_destroy(&y);
    cairn_revmap_destroy(&m2);

    /* rejections: each is a specific code and leaves nothing leaked */
    struct {
        uint64_t nch;
        int64_t rev;
        size_t cut;
        int rc;
    } bad[] = {
        {nch, rev, 1, CAIRN_ETRUNCATED},  {nch, rev + 1, 0, CAIRN_ECORRUPT},
        {10, rev, 0, CAIRN_ECORRUPT},     {nch, rev - 1, 0, CAIRN_ECORRUPT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cairn_kindex_init(&y);
        cairn_revmap_init(&m2);
        ck_assert_int_eq(
            cairn_ckpt_decode_state(&y, &m2, NULL, b.p, b.len - bad[i].cut, bad[i].nch, bad[i].rev),
            bad[i].rc);
        cairn_kindex_destroy(&y);
        cairn_revmap_destroy(&m2);
    }
    cairn_store_buf_free(&b);
    cairn_kindex_destroy(&x);
    cairn_revmap_destroy(&m);
}
END_TEST

START_TEST(bulk_loaded_index_takes_inserts)
{
    kindex x;
    cairn_kindex_init(&x);
    char k[16];
    for (int i = 0; i < 1000; i += 2) {
        snprintf(k, sizeof k, "k%05d", i);
        kentry *e = calloc(1, sizeof *e + strlen(k));
        e->key_len = (uint32_t)strlen(k);
        memcpy(e->key, k, e->key_len);
        e->hist = &e->h1;
        e->cap = 1;
        e->h1 = 2;
        e->nhist = 1;
        ck_assert_int_eq(cairn_kindex_append(&x, e), 0);
    }
    for (int i = 1; i < 1000; i += 2) {
        snprintf(k, sizeof k, "k%05d", i);
        ck_assert_ptr_nonnull(cairn_kindex_upsert(&x, (const uint8_t *)k, strlen(k)));
    }
    ck_assert_uint_eq(x.nkeys, 1000);
    kiter it;
    int i = 0;
    for (const kentry *e = cairn_kindex_first(&it, &x); e; e = cairn_kindex_next(&it), i++) {
        snprintf(k, sizeof k, "k%05d", i);
        ck_assert(e->key_len == strlen(k) && !memcmp(e->key, k, e->key_len));
    }
    ck_assert_int_eq(i, 1000);
    cairn_kindex_destroy(&x);
}
END_TEST

/* The store logs through options.log_cb, with levels: a missing checkpoint
 * is news (info), a damaged one a warning. */
typedef struct log_lines {
    int n;
    int level[16];
    char msg[16][256];
} log_lines;

static void log_line(void *arg, int level, const char *msg)
{
    log_lines *l = arg;
    if (l->n == 16)
        return;
    l->level[l->n] = level;
    snprintf(l->msg[l->n], sizeof l->msg[0], "%s", msg);
    l->n++;
}

static cairn_store *open_logged(const char *dir, log_lines *l)
{
    memset(l, 0, sizeof *l);
    cairn_store_options o;
    cairn_store_options_init(&o);
    o.log_cb = log_line;
    o.log_arg = l;
    return open_store_opts(dir, &o);
}

START_TEST(logs_through_the_callback)
{
    char *dir = make_tmpdir();
    log_lines l;
    cairn_store *s = open_logged(dir, &l);
    put_kv(s, "a", "1");
    cairn_store_close(s);
    ck_assert_int_eq(l.n, 0); /* a new store says nothing */
    char *p = path_in(dir, CAIRN_CKPT_FILE);
    unlink(p);
    s = open_logged(dir, &l);
    cairn_store_close(s);
    ck_assert_int_eq(l.n, 1);
    ck_assert_int_eq(l.level[0], CAIRN_STORE_LOG_INFO);
    ck_assert_ptr_nonnull(strstr(l.msg[0], "no checkpoint"));
    ck_assert_ptr_null(strchr(l.msg[0], '\n'));
    size_t len;
    uint8_t *b = read_file(dir, &len);
    b[len - 1] ^= 1;
    write_file(dir, b, len);
    free(b);
    s = open_logged(dir, &l);
    ck_assert_int_eq(cur_rev(s), 2);
    cairn_store_close(s);
    ck_assert_int_eq(l.n, 1);
    ck_assert_int_eq(l.level[0], CAIRN_STORE_LOG_WARN);
    ck_assert_ptr_nonnull(strstr(l.msg[0], "not used"));
    free(p);
    done(dir);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("store_checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, identical_to_full_replay, 0, 2);
    tcase_add_test(tc, fresh_store_and_unchanged_reopen);
    tcase_add_test(tc, logs_through_the_callback);
    tcase_add_test(tc, tail_after_crash);
    tcase_add_loop_test(tc, refused_falls_back, 0, NREJECT);
    tcase_add_test(tc, tail_mismatch_falls_back);
    tcase_add_test(tc, older_state_section);
    tcase_add_test(tc, rolled_back_dir_refuses);
    tcase_add_test(tc, restored_dir_replays);
    tcase_add_test(tc, stale_checkpoint_beside_new_db);
    tcase_add_test(tc, state_codec_round_trip);
    tcase_add_test(tc, bulk_loaded_index_takes_inserts);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
