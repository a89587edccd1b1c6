/*
 * The on-disk format (store.h: ON-DISK LAYOUT), checked on the raw LevelDB
 * records as well as through the API:
 * - format 3 writes only records under 'O' index: the change body, then a
 *   history record per event ('O' index 'K' key), so every record of a
 *   change sorts after every record of the changes before it; a history
 *   record of a local Put names the op in the change body and holds no copy
 *   of the value, and history (cairn_store_history, reads at an old
 *   revision) gets the value back from the body, before and after a reopen;
 * - a value that comes from an older change (a remote delete uncovering a
 *   concurrent write) is kept inline in its history record;
 * - revision -> change hash survives without 'R' records;
 * - a format-1 data dir opens, reads its inline values, loses its 'C' and
 *   'R' records and is marked format 3; a format-2 dir (history under 'K'
 *   rev ++ key) opens from its checkpoint and has its records moved; an open
 *   finishes a move a crash cut short; an unknown format is refused;
 * - compaction deletes the history records it no longer needs, and old
 *   values still read from the bodies that stay;
 * - a history record that names an op that did not set its key is
 *   corruption, and so is an 'O' record whose stored revision replay does
 *   not re-derive.
 */

#include <leveldb/c.h>

#include "../store/store_test.h"
#include "store/store_int.h"

/* ---- raw access to the database (store closed) ---------------------------- */

static leveldb_t *raw_open(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/db", dir);
    leveldb_options_t *o = leveldb_options_create();
    char *err = NULL;
    leveldb_t *db = leveldb_open(o, path, &err);
    leveldb_options_destroy(o);
    ck_assert_msg(!err, "leveldb: %s", err ? err : "");
    return db;
}

static void raw_close(leveldb_t *db)
{
    leveldb_close(db);
}

static void raw_put(leveldb_t *db, const void *k, size_t kl, const void *v, size_t vl)
{
    leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
    char *err = NULL;
    leveldb_put(db, wo, k, kl, v, vl, &err);
    leveldb_writeoptions_destroy(wo);
    ck_assert_ptr_null(err);
}

/* Calls |cb| for each record whose key starts with |tag|; counts them.
 * BODY and HIST are the two kinds under 'O': a change body ('O' index) and
 * a history record ('O' index 'K' key). */
typedef void (*rec_cb)(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl);
#define BODY 1
#define HIST 2

static size_t raw_scan(leveldb_t *db, char tag, rec_cb cb, void *arg)
{
    char t = tag == BODY || tag == HIST ? 'O' : tag;
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    leveldb_iterator_t *it = leveldb_create_iterator(db, ro);
    size_t n = 0;
    for (leveldb_iter_seek(it, &t, 1); leveldb_iter_valid(it); leveldb_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *k = (const uint8_t *)leveldb_iter_key(it, &kl);
        if (!kl || k[0] != (uint8_t)t)
            break;
        if ((tag == BODY && kl != 9) || (tag == HIST && (kl < 10 || k[9] != 'K')))
            continue;
        const uint8_t *v = (const uint8_t *)leveldb_iter_value(it, &vl);
        if (cb)
            cb(arg, k, kl, v, vl);
        n++;
    }
    leveldb_iter_destroy(it);
    leveldb_readoptions_destroy(ro);
    return n;
}

static size_t count_tag(const char *dir, char tag)
{
    leveldb_t *db = raw_open(dir);
    size_t n = raw_scan(db, tag, NULL, NULL);
    raw_close(db);
    return n;
}

/* Format 3's order: every history record follows the body of its change,
 * and that change made a revision. */
typedef struct order_check {
    uint64_t body;
    int64_t rev;
    size_t nbody, nhist;
} order_check;

static void order_cb(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
    order_check *o = arg;
    if (kl == 9) {
        ck_assert_uint_ge(vl, 8);
        ck_assert(o->nbody == 0 || cairn_store_get_be64(k + 1) == o->body + 1);
        o->body = cairn_store_get_be64(k + 1);
        o->rev = (int64_t)cairn_store_get_be64(v);
        o->nbody++;
        return;
    }
    ck_assert_uint_ge(kl, 10);
    ck_assert_int_eq(k[9], 'K');
    ck_assert_uint_eq(cairn_store_get_be64(k + 1), o->body);
    ck_assert_int_gt(o->rev, 0);
    o->nhist++;
}

static order_check raw_order(const char *dir)
{
    order_check o;
    memset(&o, 0, sizeof o);
    leveldb_t *db = raw_open(dir);
    raw_scan(db, 'O', order_cb, &o);
    raw_close(db);
    return o;
}

static uint32_t raw_format(const char *dir)
{
    leveldb_t *db = raw_open(dir);
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    char *err = NULL;
    size_t vl = 0;
    char *v = leveldb_get(db, ro, "Mformat", 7, &vl, &err);
    ck_assert_ptr_null(err);
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(vl, 4);
    const uint8_t *f = (const uint8_t *)v;
    uint32_t ver = (uint32_t)f[0] << 24 | (uint32_t)f[1] << 16 | (uint32_t)f[2] << 8 | f[3];
    leveldb_free(v);
    leveldb_readoptions_destroy(ro);
    raw_close(db);
    return ver;
}

/* ---- API helpers ------------------------------------------------------------ */

typedef struct hist_log {
    char text[4096];
} hist_log;

static int log_hist(void *arg, int64_t rev, const cairn_event *ev, size_t nev)
{
    hist_log *l = arg;
    for (size_t i = 0; i < nev; i++) {
        size_t n = strlen(l->text);
        snprintf(l->text + n, sizeof l->text - n, "%lld%s%.*s%s%.*s ", (long long)rev,
                 ev[i].type == CAIRN_EVENT_PUT ? "+" : "-", (int)ev[i].kv.key_len,
                 (const char *)ev[i].kv.key, ev[i].type == CAIRN_EVENT_PUT ? "=" : "",
                 (int)ev[i].kv.value_len, ev[i].kv.value ? (const char *)ev[i].kv.value : "");
    }
    return 0;
}

static int history_text(cairn_store *s, int64_t from, hist_log *l)
{
    memset(l, 0, sizeof *l);
    int64_t last;
    return cairn_store_history(s, &last, from, (const uint8_t *)"\0", 1, (const uint8_t *)"\0", 1,
                               log_hist, l);
}

/* The value of |k| at revision |rev| (a read of history), as a string. */
static int value_at(cairn_store *s, const char *k, int64_t rev, char *out, size_t cap)
{
    cairn_range_req q = {0};
    q.key = (const uint8_t *)k;
    q.key_len = strlen(k);
    q.revision = rev;
    cairn_range_resp r;
    int rc = cairn_store_range(s, &r, &q);
    if (rc)
        return rc;
    out[0] = 0;
    if (r.nkvs == 1)
        snprintf(out, cap, "%.*s", (int)r.kvs[0].value_len, (const char *)r.kvs[0].value);
    cairn_range_resp_destroy(&r);
    return 0;
}

/* ---- history record inspection -------------------------------------------------- */

typedef struct kstat {
    size_t n, body, inl, tomb;
    size_t max_len;
    int saw_value; /* some record contains |needle| */
    const char *needle;
} kstat;

static void kstat_cb(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
    kstat *st = arg;
    (void)k;
    (void)kl;
    st->n++;
    ck_assert_uint_ge(vl, 1);
    if (v[0] == 2)
        st->body++;
    else if (v[0] == 1)
        st->tomb++;
    else
        st->inl++;
    if (vl > st->max_len)
        st->max_len = vl;
    size_t nl = st->needle ? strlen(st->needle) : 0;
    for (size_t i = 0; nl && i + nl <= vl; i++)
        if (memcmp(v + i, st->needle, nl) == 0)
            st->saw_value = 1;
}

static kstat k_records(const char *dir, const char *needle)
{
    kstat st;
    memset(&st, 0, sizeof st);
    st.needle = needle;
    leveldb_t *db = raw_open(dir);
    raw_scan(db, HIST, kstat_cb, &st);
    raw_close(db);
    return st;
}

/* ---- tests ---------------------------------------------------------------------- */

static const char LONGV[] = "a-value-long-enough-to-spot-in-a-record";

START_TEST(records_of_format_3)
{
    char *d = make_tmpdir();
    captured cap = {0};
    cairn_store *s = open_store_actor(d, 0x11, &cap);
    ck_assert_int_eq(put_kv(s, "a", "1"), 2);
    ck_assert_int_eq(put_kv(s, "a", "2"), 3);
    ck_assert_int_eq(put_kv(s, "b", LONGV), 4);
    ck_assert_int_eq(del_range(s, "b", NULL, NULL), 1);
    ck_assert_int_eq(cap.n, 4);
    char want[512];
    snprintf(want, sizeof want, "2+a=1 3+a=2 4+b=%s 5-b ", LONGV);
    for (int round = 0; round < 2; round++) {
        hist_log l;
        ck_assert_int_eq(history_text(s, 1, &l), 0);
        ck_assert_str_eq(l.text, want);
        char v[128];
        ck_assert_int_eq(value_at(s, "a", 2, v, sizeof v), 0);
        ck_assert_str_eq(v, "1");
        ck_assert_int_eq(value_at(s, "b", 4, v, sizeof v), 0);
        ck_assert_str_eq(v, LONGV);
        /* revision -> change hash, without 'R' records */
        for (int i = 0; i < cap.n; i++) {
            cairn_hash h;
            ck_assert_int_eq(cairn_store_rev_hash(s, &h, cap.rev[i]), 0);
            ck_assert_mem_eq(h.b, cap.hash[i].b, CAIRN_HASH_LEN);
        }
        cairn_hash h;
        ck_assert_int_eq(cairn_store_rev_hash(s, &h, 1), CAIRN_ENOTFOUND);
        ck_assert_int_eq(cairn_store_rev_hash(s, &h, 6), CAIRN_EFUTUREREV);
        cairn_store_close(s);
        /* the raw records: a body per change (genesis + members + 4), a history
         * record per event after the body of its change, nothing under
         * 'C', 'K' or 'R'; Puts point into the body and hold no value */
        ck_assert_uint_eq(count_tag(d, BODY), 6);
        order_check o = raw_order(d);
        ck_assert_uint_eq(o.nbody, 6);
        ck_assert_uint_eq(o.nhist, 4);
        ck_assert_uint_eq(count_tag(d, 'C'), 0);
        ck_assert_uint_eq(count_tag(d, 'K'), 0);
        ck_assert_uint_eq(count_tag(d, 'R'), 0);
        kstat st = k_records(d, LONGV);
        ck_assert_uint_eq(st.n, 4);
        ck_assert_uint_eq(st.body, 3);
        ck_assert_uint_eq(st.tomb, 1);
        ck_assert_uint_eq(st.inl, 0);
        ck_assert_int_eq(st.saw_value, 0);
        ck_assert_uint_le(st.max_len, 1 + 5 * 10);
        ck_assert_uint_eq(raw_format(d), 3);
        s = open_store_actor(d, 0x11, NULL);
    }
    cairn_store_close(s);
    captured_free(&cap);
    rm_rf(d);
    free(d);
}
END_TEST

/* A delete from a third node that saw only the winning write removes the
 * winner on a node that holds both: the loser becomes visible again, with a
 * value no op of the delete's change carries. */
START_TEST(value_from_an_older_change)
{
    char *da = make_tmpdir(), *db = make_tmpdir(), *dc = make_tmpdir();
    captured ca = {0}, cb = {0}, cc = {0};
    cairn_store *a = open_store_actor(da, 0x11, &ca);
    cairn_store *b = open_store_actor(db, 0x22, &cb);
    cairn_store *c = open_store_actor(dc, 0x33, &cc);
    ck_assert_int_eq(put_kv(a, "z", "from-a"), 2);
    ck_assert_int_eq(put_kv(b, "z", "from-b"), 2);
    ck_assert_int_eq(cairn_store_receive(a, cb.bytes[0], cb.len[0]), 0);
    char v[64];
    ck_assert_int_eq(value_at(a, "z", 0, v, sizeof v), 0);
    int b_won = strcmp(v, "from-b") == 0;
    const char *loser = b_won ? "from-a" : "from-b";
    captured *win = b_won ? &cb : &ca;
    /* c learns only the winner, then deletes z */
    ck_assert_int_eq(cairn_store_receive(c, win->bytes[0], win->len[0]), 0);
    int64_t drev;
    ck_assert_int_eq(del_range(c, "z", NULL, &drev), 1);
    ck_assert_int_eq(cc.n, 2);
    int64_t before = cur_rev(a);
    ck_assert_int_eq(cairn_store_receive(a, cc.bytes[1], cc.len[1]), 0);
    int64_t r = cur_rev(a);
    ck_assert_int_eq(r, before + 1);
    ck_assert_int_eq(value_at(a, "z", 0, v, sizeof v), 0);
    ck_assert_str_eq(v, loser);
    cairn_store_close(a);
    kstat st = k_records(da, loser);
    ck_assert_uint_eq(st.inl, 1); /* only the uncovered value is inline */
    ck_assert_int_eq(st.saw_value, 1);
    a = open_store_actor(da, 0x11, NULL);
    hist_log l;
    ck_assert_int_eq(history_text(a, r, &l), 0);
    char want[64];
    snprintf(want, sizeof want, "%lld+z=%s ", (long long)r, loser);
    ck_assert_str_eq(l.text, want);
    ck_assert_int_eq(value_at(a, "z", r, v, sizeof v), 0);
    ck_assert_str_eq(v, loser);
    cairn_store_close(a);
    cairn_store_close(b);
    cairn_store_close(c);
    captured_free(&ca);
    captured_free(&cb);
    captured_free(&cc);
    rm_rf(da);
    rm_rf(db);
    rm_rf(dc);
    free(da);
    free(db);
    free(dc);
}
END_TEST

/* Moves a format-3 dir's history records back under 'K' rev ++ key, as
 * formats 1 and 2 kept them (the revision comes from the body before them),
 * the first |limit| of them, and sets the format marker to |format|. With
 * |v1| they are also as format 1 wrote them: values inline (flags 0, no op
 * position; the values of that test's puts are known: key kI has value
 * vI), with 'C' and 'R' records. */
typedef struct old_ctx {
    leveldb_writebatch_t *b;
    int v1;
    size_t limit, n;
    uint64_t rev; /* of the body seen last */
} old_ctx;

static void to_old_cb(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
    old_ctx *x = arg;
    if (kl == 9) {
        x->rev = cairn_store_get_be64(v);
        return;
    }
    if (x->n == x->limit)
        return;
    x->n++;
    uint8_t ok[64];
    ck_assert_uint_lt(kl, sizeof ok);
    ok[0] = 'K';
    for (int i = 0; i < 8; i++)
        ok[1 + i] = (uint8_t)(x->rev >> (56 - 8 * i));
    memcpy(ok + 9, k + 10, kl - 10);
    size_t okl = kl - 1;
    leveldb_writebatch_delete(x->b, (const char *)k, kl);
    if (!x->v1 || v[0] != 2) {
        leveldb_writebatch_put(x->b, (const char *)ok, okl, (const char *)v, vl);
        return;
    }
    uint8_t nv[128];
    ck_assert_uint_lt(vl, 64);
    memcpy(nv, v, vl - 1); /* the op position is one byte here */
    nv[0] = 0;
    char val[32];
    snprintf(val, sizeof val, "v%.*s", (int)(okl - 10), (const char *)ok + 10);
    memcpy(nv + vl - 1, val, strlen(val));
    leveldb_writebatch_put(x->b, (const char *)ok, okl, (const char *)nv, vl - 1 + strlen(val));
    /* 'R' rev -> some hash, 'C' hash -> index: contents are not read */
    uint8_t rk[9] = {'R'};
    memcpy(rk + 1, ok + 1, 8);
    uint8_t h[32];
    memset(h, 0x5a, sizeof h);
    leveldb_writebatch_put(x->b, (const char *)rk, 9, (const char *)h, 32);
    uint8_t ck[33] = {'C'};
    memcpy(ck + 1, h, 32);
    ck[32] = ok[8];
    leveldb_writebatch_put(x->b, (const char *)ck, 33, (const char *)ok + 1, 8);
}

static void to_old_format(const char *dir, uint8_t format, int v1, size_t limit)
{
    leveldb_t *db = raw_open(dir);
    old_ctx x = {leveldb_writebatch_create(), v1, limit, 0, 0};
    raw_scan(db, 'O', to_old_cb, &x);
    uint8_t f[4] = {0, 0, 0, format};
    leveldb_writebatch_put(x.b, "Mformat", 7, (const char *)f, 4);
    leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
    char *err = NULL;
    leveldb_write(db, wo, x.b, &err);
    ck_assert_ptr_null(err);
    leveldb_writeoptions_destroy(wo);
    leveldb_writebatch_destroy(x.b);
    raw_close(db);
}

/* Opens the store in |dir| and puts kI = vI for I < 20 (revisions 2..21). */
static cairn_store *open_with_20_puts(const char *dir)
{
    cairn_store *s = open_store(dir);
    char k[16], v[16];
    for (int i = 0; i < 20; i++) {
        snprintf(k, sizeof k, "k%d", i);
        snprintf(v, sizeof v, "v%d", i);
        ck_assert_int_eq(put_kv(s, k, v), i + 2);
    }
    return s;
}

START_TEST(format_1_opens_and_upgrades)
{
    char *d = make_tmpdir();
    cairn_store *s = open_with_20_puts(d);
    cairn_store_close(s);
    to_old_format(d, 1, 1, SIZE_MAX);
    ck_assert_uint_eq(count_tag(d, 'K'), 20);
    ck_assert_uint_eq(count_tag(d, HIST), 0);
    ck_assert_uint_eq(count_tag(d, 'R'), 20);
    ck_assert_uint_eq(raw_format(d), 1);

    s = open_store(d);
    /* the format-3 close left a valid checkpoint; a format-1 dir never
     * trusts one (store.h: CHECKPOINT) */
    ck_assert_uint_eq(s->ckpt_n, 0);
    ck_assert_int_eq(cur_rev(s), 21);
    char got[32];
    ck_assert_int_eq(value_at(s, "k7", 9, got, sizeof got), 0);
    ck_assert_str_eq(got, "v7");
    /* the records moved at the open; new writes land after them */
    ck_assert_int_eq(put_kv(s, "k7", "new"), 22);
    hist_log l;
    ck_assert_int_eq(history_text(s, 20, &l), 0);
    ck_assert_str_eq(l.text, "20+k18=v18 21+k19=v19 22+k7=new ");
    uint64_t n = cairn_dag_count(cairn_doc_dag(s->doc));
    cairn_store_close(s);
    /* upgraded: the checkpoint of that close is used */
    s = open_store(d);
    ck_assert_uint_eq(s->ckpt_n, n);
    ck_assert_int_eq(value_at(s, "k7", 0, got, sizeof got), 0);
    ck_assert_str_eq(got, "new");
    cairn_store_close(s);
    ck_assert_uint_eq(count_tag(d, 'R'), 0);
    ck_assert_uint_eq(count_tag(d, 'C'), 0);
    ck_assert_uint_eq(count_tag(d, 'K'), 0);
    ck_assert_uint_eq(raw_format(d), 3);
    kstat st = k_records(d, NULL);
    ck_assert_uint_eq(st.inl, 20);
    ck_assert_uint_eq(st.body, 1);
    ck_assert_uint_eq(raw_order(d).nhist, 21);
    rm_rf(d);
    free(d);
}
END_TEST

/* A format-2 dir (history under 'K' rev ++ key) opens from its checkpoint,
 * reads the same history, and leaves format 3 with every record moved; so
 * does a dir whose move a crash cut short (marker 3, some records still
 * under 'K'). */
START_TEST(format_2_opens_and_moves_its_records)
{
    for (int crash = 0; crash < 2; crash++) {
        char *d = make_tmpdir();
        cairn_store *s = open_with_20_puts(d);
        ck_assert_int_eq(del_range(s, "k3", NULL, NULL), 1);
        hist_log before, after;
        ck_assert_int_eq(history_text(s, 1, &before), 0);
        uint64_t n = cairn_dag_count(cairn_doc_dag(s->doc));
        cairn_store_close(s);
        to_old_format(d, crash ? 3 : 2, 0, crash ? 8 : SIZE_MAX);
        ck_assert_uint_eq(count_tag(d, 'K'), crash ? 8 : 21);
        ck_assert_uint_eq(count_tag(d, HIST), crash ? 13 : 0);

        s = open_store(d);
        ck_assert_uint_eq(s->ckpt_n, n); /* nothing in it depends on the layout */
        ck_assert_int_eq(history_text(s, 1, &after), 0);
        ck_assert_str_eq(after.text, before.text);
        char got[32];
        ck_assert_int_eq(value_at(s, "k7", 9, got, sizeof got), 0);
        ck_assert_str_eq(got, "v7");
        ck_assert_int_eq(value_at(s, "k3", 21, got, sizeof got), 0);
        ck_assert_str_eq(got, "v3");
        ck_assert_int_eq(value_at(s, "k3", 22, got, sizeof got), 0);
        ck_assert_str_eq(got, "");
        ck_assert_int_eq(put_kv(s, "k7", "new"), 23);
        cairn_store_close(s);
        ck_assert_uint_eq(raw_format(d), 3);
        ck_assert_uint_eq(count_tag(d, 'K'), 0);
        order_check o = raw_order(d);
        ck_assert_uint_eq(o.nbody, 24); /* genesis, members, 22 writes */
        ck_assert_uint_eq(o.nhist, 22);
        rm_rf(d);
        free(d);
    }
}
END_TEST

START_TEST(unknown_format_is_refused)
{
    char *d = make_tmpdir();
    cairn_store *s = open_store(d);
    put_kv(s, "a", "1");
    cairn_store_close(s);
    static const uint8_t bad[2][5] = {{0, 0, 0, 4}, {0, 0, 3}};
    static const size_t badlen[2] = {4, 3};
    for (int i = 0; i < 2; i++) {
        leveldb_t *db = raw_open(d);
        raw_put(db, "Mformat", 7, bad[i], badlen[i]);
        raw_close(db);
        cairn_store_options o;
        cairn_store_options_init(&o);
        o.dir = d;
        o.clock_ms = test_clock_ms;
        ck_assert_int_eq(cairn_store_open(&s, &o), CAIRN_EBADVERSION);
        ck_assert_ptr_null(s);
    }
    rm_rf(d);
    free(d);
}
END_TEST

START_TEST(compaction_deletes_history_records)
{
    char *d = make_tmpdir();
    cairn_store *s = open_store(d);
    char v[32];
    for (int i = 0; i < 300; i++) {
        snprintf(v, sizeof v, "value-%d", i);
        put_kv(s, i % 3 == 0 ? "x" : i % 3 == 1 ? "y" : "z", v);
    }
    ck_assert_int_eq(cur_rev(s), 301);
    cairn_store_close(s);
    ck_assert_uint_eq(k_records(d, NULL).n, 300);
    s = open_store(d);
    cairn_header h;
    ck_assert_int_eq(cairn_store_compact(s, &h, 250, 1), 0);
    /* x, y and z each keep the last record at or below 250 and the ones
     * after it: revisions 248..301 */
    char got[32];
    ck_assert_int_eq(value_at(s, "x", 250, got, sizeof got), 0);
    ck_assert_str_eq(got, "value-246"); /* made revision 248 */
    ck_assert_int_eq(value_at(s, "x", 249, got, sizeof got), CAIRN_ECOMPACTED);
    hist_log l;
    ck_assert_int_eq(history_text(s, 2, &l), CAIRN_ECOMPACTED);
    ck_assert_int_eq(history_text(s, 300, &l), 0);
    ck_assert_str_eq(l.text, "300+y=value-298 301+z=value-299 ");
    cairn_store_close(s);
    ck_assert_uint_eq(k_records(d, NULL).n, 301 - 248 + 1);
    /* the bodies stay: peers and replay need them */
    ck_assert_uint_eq(count_tag(d, BODY), 302);
    s = open_store(d);
    ck_assert_int_eq(value_at(s, "y", 250, got, sizeof got), 0);
    ck_assert_str_eq(got, "value-247");
    cairn_store_close(s);
    rm_rf(d);
    free(d);
}
END_TEST

static void bad_pos_cb(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
    leveldb_writebatch_t *b = arg;
    if (v[0] != 2)
        return;
    uint8_t nv[64];
    ck_assert_uint_lt(vl, sizeof nv);
    memcpy(nv, v, vl);
    nv[vl - 1] = 7; /* past the one op of the change */
    leveldb_writebatch_put(b, (const char *)k, kl, (const char *)nv, vl);
}

START_TEST(bad_reference_is_corruption)
{
    char *d = make_tmpdir();
    cairn_store *s = open_store(d);
    put_kv(s, "a", "1");
    put_kv(s, "a", "2");
    cairn_store_close(s);
    leveldb_t *db = raw_open(d);
    leveldb_writebatch_t *b = leveldb_writebatch_create();
    raw_scan(db, HIST, bad_pos_cb, b);
    leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
    char *err = NULL;
    leveldb_write(db, wo, b, &err);
    ck_assert_ptr_null(err);
    leveldb_writeoptions_destroy(wo);
    leveldb_writebatch_destroy(b);
    raw_close(db);
    s = open_store(d); /* replay does not read history records */
    char got[16];
    ck_assert_int_eq(value_at(s, "a", 2, got, sizeof got), CAIRN_ECORRUPT);
    hist_log l;
    ck_assert_int_eq(history_text(s, 1, &l), CAIRN_ECORRUPT);
    /* the current value comes from the document, not from history */
    ck_assert_int_eq(value_at(s, "a", 0, got, sizeof got), 0);
    ck_assert_str_eq(got, "2");
    cairn_store_close(s);
    rm_rf(d);
    free(d);
}
END_TEST

/* With a checkpoint, open reads no older body; a body that went missing is
 * found by the reads that need it: the history scan meets that change's
 * history records with no body before them, and a read at its revision
 * finds no change to take the value from. */
START_TEST(history_without_its_body_is_corruption)
{
    char *d = make_tmpdir();
    cairn_store *s = open_store(d);
    /* change 0 is the genesis, 1 the initial members */
    put_kv(s, "a", "1"); /* change 2, revision 2 */
    put_kv(s, "b", "2"); /* change 3, revision 3 */
    put_kv(s, "c", "3"); /* change 4, revision 4 */
    put_kv(s, "b", "4"); /* change 5, revision 5: b at 3 is history now */
    uint64_t n = cairn_dag_count(cairn_doc_dag(s->doc));
    cairn_store_close(s);
    leveldb_t *db = raw_open(d);
    uint8_t k[9] = {'O', 0, 0, 0, 0, 0, 0, 0, 3};
    leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
    char *err = NULL;
    leveldb_delete(db, wo, (const char *)k, 9, &err);
    ck_assert_ptr_null(err);
    leveldb_writeoptions_destroy(wo);
    raw_close(db);
    s = open_store(d);
    ck_assert_uint_eq(s->ckpt_n, n);
    hist_log l;
    ck_assert_int_eq(history_text(s, 1, &l), CAIRN_ECORRUPT);
    char got[16];
    ck_assert_int_eq(value_at(s, "b", 3, got, sizeof got), CAIRN_ECORRUPT);
    /* the changes around it still read */
    ck_assert_int_eq(history_text(s, 4, &l), 0);
    ck_assert_str_eq(l.text, "4+c=3 5+b=4 ");
    ck_assert_int_eq(value_at(s, "a", 2, got, sizeof got), 0);
    ck_assert_str_eq(got, "1");
    cairn_store_close(s);
    rm_rf(d);
    free(d);
}
END_TEST

/* Replay re-derives every revision and checks it against the one its 'O'
 * record stored: a rewritten stored revision fails the open. */
static void set_stored_rev(const char *dir, uint64_t index, uint64_t rev)
{
    leveldb_t *db = raw_open(dir);
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    uint8_t k[9] = {'O'};
    for (int i = 0; i < 8; i++)
        k[1 + i] = (uint8_t)(index >> (56 - 8 * i));
    char *err = NULL;
    size_t vl = 0;
    char *v = leveldb_get(db, ro, (const char *)k, 9, &vl, &err);
    ck_assert_ptr_null(err);
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_ge(vl, 8);
    for (int i = 0; i < 8; i++)
        v[i] = (char)(rev >> (56 - 8 * i));
    raw_put(db, k, 9, v, vl);
    leveldb_free(v);
    leveldb_readoptions_destroy(ro);
    raw_close(db);
}

START_TEST(stored_revision_mismatch_is_corruption)
{
    static const uint64_t bad[3] = {0, 9, 3}; /* none / a gap / a repeat */
    for (int i = 0; i < 3; i++) {
        char *d = make_tmpdir();
        cairn_store *s = open_store(d);
        /* change 0 is the genesis, 1 the initial members */
        put_kv(s, "a", "1"); /* change 2, revision 2 */
        put_kv(s, "b", "2"); /* change 3, revision 3 */
        put_kv(s, "c", "3"); /* change 4, revision 4 */
        cairn_store_close(s);
        set_stored_rev(d, 4, bad[i]);
        cairn_store_options o;
        cairn_store_options_init(&o);
        o.dir = d;
        o.clock_ms = test_clock_ms;
        ck_assert_int_eq(cairn_store_open(&s, &o), CAIRN_ECORRUPT);
        set_stored_rev(d, 4, 4); /* and the right one opens again */
        s = open_store(d);
        ck_assert_int_eq(cur_rev(s), 4);
        cairn_store_close(s);
        rm_rf(d);
        free(d);
    }
}
END_TEST

/* One varint codec (crdt/wire.h) reads every record: the canonical forms
 * every format wrote read back; an overlong or over-64-bit varint in a
 * history record is corruption, and a kvs value whose lease varint is
 * overlong reads as its raw bytes (the rule for malformed values). */
START_TEST(varints_are_canonical)
{
    cairn_store_krec r;
    static const uint8_t ok[] = {2, 3, 0x80, 0x01, 5, 0, 7}; /* body ref, cr 128 */
    ck_assert_int_eq(cairn_store_krec_parse(&r, ok, sizeof ok), 0);
    ck_assert_uint_eq(r.sub, 3);
    ck_assert_uint_eq(r.cr, 128);
    ck_assert_uint_eq(r.ver, 5);
    ck_assert_uint_eq(r.pos, 7);
    static const uint8_t overlong[] = {2, 0x83, 0x00, 2, 5, 0, 7}; /* sub 3 in two bytes */
    ck_assert_int_eq(cairn_store_krec_parse(&r, overlong, sizeof overlong), CAIRN_ECORRUPT);
    static const uint8_t wide[] = {1,    0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0x02, 0,    0,    0};
    ck_assert_int_eq(cairn_store_krec_parse(&r, wide, sizeof wide), CAIRN_ECORRUPT);
    static const uint8_t trunc[] = {0, 1, 0x80};
    ck_assert_int_eq(cairn_store_krec_parse(&r, trunc, sizeof trunc), CAIRN_ECORRUPT);
    /* a value record: lease varint ++ value */
    static const uint8_t rec[] = {0x85, 0x00, 'v'};
    cairn_value v = {.type = CAIRN_V_BYTES};
    v.v.bytes.ptr = rec;
    v.v.bytes.len = sizeof rec;
    int64_t lease;
    const uint8_t *val;
    size_t vl;
    cairn_store_parse_record(&v, &lease, &val, &vl);
    ck_assert_int_eq(lease, 0);
    ck_assert_uint_eq(vl, sizeof rec);
    v.v.bytes.ptr = rec + 1; /* 0x00 'v': lease 0, value "v" */
    v.v.bytes.len = 2;
    cairn_store_parse_record(&v, &lease, &val, &vl);
    ck_assert_int_eq(lease, 0);
    ck_assert_uint_eq(vl, 1);
    ck_assert_int_eq(val[0], 'v');
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_format");
    TCase *tc = tcase_create("format");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, records_of_format_3);
    tcase_add_test(tc, value_from_an_older_change);
    tcase_add_test(tc, format_1_opens_and_upgrades);
    tcase_add_test(tc, format_2_opens_and_moves_its_records);
    tcase_add_test(tc, unknown_format_is_refused);
    tcase_add_test(tc, compaction_deletes_history_records);
    tcase_add_test(tc, bad_reference_is_corruption);
    tcase_add_test(tc, history_without_its_body_is_corruption);
    tcase_add_test(tc, stored_revision_mismatch_is_corruption);
    tcase_add_test(tc, varints_are_canonical);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
