/*
 * The watch hub (store/hub.h) on a real store, without gRPC: the ring
 * wrapping, catch-up from disk joining the ring and the live stream with
 * no gap and no duplicate, range matching (single key, prefix, the "\0"
 * forms), filters and prev_kv, a stream that never pulls (the writer goes
 * on; the stream gets everything afterwards), cancel and compaction while
 * a watcher catches up, and a stream freed from its own notify callback.
 *
 * The hub's catch-up delay is 0 here, so cairn_hub_next answers at once;
 * etcd's answers for the same shapes are pinned by the conformance checks
 * (tests/conformance/checks_watch.py), which drive the hub through the
 * server.
 */

#include "../store/store_test.h"

#include "store/hub.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <time.h>

static char *dir;
static cairn_hub *hub;
static cairn_store *st;
static atomic_int notified;

static void count_notify(void *arg)
{
    (void)arg;
    atomic_fetch_add(&notified, 1);
}

/* A store whose events feed a fresh hub with options |o| (NULL: tiny
 * defaults for tests: no catch-up delay). */
static void open_hub(const cairn_hub_options *o)
{
    cairn_hub_options d;
    cairn_hub_options_init(&d);
    d.sync_delay_ms = 0;
    ck_assert_int_eq(cairn_hub_new(&hub, o ? o : &d), 0);
    cairn_store_options so;
    cairn_store_options_init(&so);
    cairn_store_subscriber sub = {cairn_hub_events_cb, hub};
    so.subscribers = &sub;
    so.nsubscribers = 1;
    st = open_store_opts(dir, &so);
    cairn_hub_attach(hub, st);
}

/* open_hub with a ring of |ring_events|, catch-up batches of
 * |catchup_bytes| and a live lag bound of |lag_revs| (0: the default). */
static void open_hub_with(size_t ring_events, size_t catchup_bytes, size_t lag_revs)
{
    cairn_hub_options o;
    cairn_hub_options_init(&o);
    o.sync_delay_ms = 0;
    if (ring_events)
        o.ring_events = ring_events;
    if (catchup_bytes)
        o.catchup_bytes = catchup_bytes;
    if (lag_revs)
        o.lag_revs = lag_revs;
    open_hub(&o);
}

static void close_hub(void)
{
    cairn_store_close(st);
    st = NULL;
    cairn_hub_free(hub);
    hub = NULL;
}

static void setup(void)
{
    dir = make_tmpdir();
    atomic_store(&notified, 0);
}

static void teardown(void)
{
    if (hub)
        close_hub();
    rm_rf(dir);
    free(dir);
}

static cairn_hub_stream *new_stream(void)
{
    cairn_hub_stream *s;
    ck_assert_int_eq(cairn_hub_stream_new(&s, hub, count_notify, NULL), 0);
    return s;
}

/* Creates and starts a watcher; its id. end: NULL the key alone, "" the
 * "\0" form (every key >= key). */
static int64_t watch_full(cairn_hub_stream *s, const char *key, const char *end, int64_t start,
                          int noput, int nodelete, int prev_kv)
{
    cairn_hub_watch_req r;
    memset(&r, 0, sizeof r);
    r.key = (const uint8_t *)key;
    r.key_len = strlen(key);
    if (end) {
        r.range_end = (const uint8_t *)(end[0] ? end : "\0");
        r.range_end_len = end[0] ? strlen(end) : 1;
    }
    r.start_revision = start;
    r.noput = noput;
    r.nodelete = nodelete;
    r.prev_kv = prev_kv;
    int64_t id, rev;
    int rc = cairn_hub_watch(s, &id, &rev, &r);
    ck_assert_msg(rc == 0, "watch %s: %s", key, cairn_strerror(rc));
    ck_assert_int_eq(rev, cur_rev(st));
    cairn_hub_start(s, id);
    return id;
}

static int64_t watch(cairn_hub_stream *s, const char *key, const char *end, int64_t start)
{
    return watch_full(s, key, end, start, 0, 0, 0);
}

/* What a stream delivered, as text: per batch "[id@hdr: rev+key=value
 * rev-key ...]", or "[id compacted N]". */
typedef struct wlog {
    char text[65536];
    size_t len;
    int batches;
    int64_t revs[8192]; /* every event's revision, in order */
    int nrevs;
} wlog;

static void logf_(wlog *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(wlog *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->text + l->len, sizeof l->text - l->len, fmt, ap);
    va_end(ap);
    if (n > 0 && l->len + (size_t)n < sizeof l->text)
        l->len += (size_t)n;
}

/* Pulls until the hub has nothing (at most |max| batches); 0, or the
 * error cairn_hub_next gave. With |brief|, events are only counted. */
static int drain_n(cairn_hub_stream *s, wlog *l, int max, int brief)
{
    for (int i = 0; i < max;) {
        cairn_hub_batch b;
        int rc = cairn_hub_next(s, &b);
        if (rc < 0)
            return rc;
        if (rc == CAIRN_HUB_NONE)
            return 0;
        if (rc == CAIRN_HUB_AGAIN)
            continue;
        i++;
        l->batches++;
        if (b.compact_revision) {
            ck_assert_int_eq(b.nevents, 0);
            ck_assert_int_eq(b.revision, 0);
            logf_(l, "[%lld compacted %lld]", (long long)b.watch_id, (long long)b.compact_revision);
            continue;
        }
        ck_assert_uint_gt(b.nevents, 0);
        if (!brief)
            logf_(l, "[%lld@%lld:", (long long)b.watch_id, (long long)b.revision);
        for (size_t j = 0; j < b.nevents; j++) {
            const cairn_kv *kv = &b.events[j].kv;
            if (l->nrevs < (int)(sizeof l->revs / sizeof l->revs[0]))
                l->revs[l->nrevs++] = kv->mod_revision;
            if (brief)
                continue;
            int del = b.events[j].type == CAIRN_EVENT_DELETE;
            logf_(l, " %lld%c%.*s", (long long)kv->mod_revision, del ? '-' : '+', (int)kv->key_len,
                  (const char *)kv->key);
            if (!del)
                logf_(l, "=%.*s", (int)kv->value_len, (const char *)kv->value);
            if (b.prev_kvs)
                logf_(l, "(%.*s)", b.prev_kvs[j] ? (int)b.prev_kvs[j]->value_len : 1,
                      b.prev_kvs[j] ? (const char *)b.prev_kvs[j]->value : "-");
        }
        if (!brief)
            logf_(l, "]");
        cairn_hub_batch_destroy(&b);
    }
    return 0;
}

static void drain(cairn_hub_stream *s, wlog *l)
{
    ck_assert_int_eq(drain_n(s, l, 1 << 20, 0), 0);
}

/* Every revision in [from, to] exactly once, in order. */
static void ck_revs(const wlog *l, int64_t from, int64_t to)
{
    ck_assert_int_eq(l->nrevs, to - from + 1);
    for (int i = 0; i < l->nrevs; i++)
        ck_assert_int_eq(l->revs[i], from + i);
}

static void put_n(int n, const char *key_fmt, int vlen)
{
    char *v = malloc((size_t)vlen + 1);
    memset(v, 'v', (size_t)vlen);
    v[vlen] = 0;
    for (int i = 0; i < n; i++) {
        char k[64];
        snprintf(k, sizeof k, key_fmt, i);
        put_kv(st, k, v);
    }
    free(v);
}

/* ---- the ring ------------------------------------------------------------ */

START_TEST(live_one_revision_per_batch)
{
    open_hub(NULL);
    cairn_hub_stream *s = new_stream();
    int64_t id = watch(s, "p/", "p0", 0);
    ck_assert_int_eq(id, 0);
    wlog l = {0};
    drain(s, &l);
    ck_assert_str_eq(l.text, "");
    put_kv(st, "p/a", "1");
    put_kv(st, "q", "x"); /* outside the range */
    put_kv(st, "p/b", "2");
    int64_t rev;
    ck_assert_int_eq(del_range(st, "p/", "p0", &rev), 2);
    drain(s, &l);
    /* One batch per revision; the events of one change share one. */
    ck_assert_str_eq(l.text, "[0@2: 2+p/a=1][0@4: 4+p/b=2][0@5: 5-p/a 5-p/b]");
    /* The hub's thread notifies the stream; it may run after our pulls. */
    for (int i = 0; i < 500 && atomic_load(&notified) == 0; i++)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    ck_assert_int_gt(atomic_load(&notified), 0);
    cairn_hub_stream_free(s);
}
END_TEST

START_TEST(ring_wraps)
{
    /* A ring of 4 events: a live reader that keeps up sees every revision
     * while the ring wraps many times. */
    open_hub_with(4, 0, 0);
    cairn_hub_stream *s = new_stream();
    watch(s, "k", "", 0);
    wlog l = {0};
    for (int i = 0; i < 50; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%02d", i);
        put_kv(st, k, "v");
        ck_assert_int_eq(drain_n(s, &l, 1 << 20, 1), 0);
    }
    ck_revs(&l, 2, 51);
    ck_assert_int_eq(l.batches, 50);
    /* A watcher from the start: the ring holds the last 4 revisions, the
     * rest comes from disk; all 50, once each, in order. */
    cairn_hub_stream *s2 = new_stream();
    watch(s2, "k", "", 2);
    wlog l2 = {0};
    ck_assert_int_eq(drain_n(s2, &l2, 1 << 20, 1), 0);
    ck_revs(&l2, 2, 51);
    cairn_hub_stream_free(s);
    cairn_hub_stream_free(s2);
}
END_TEST

/* ---- catching up --------------------------------------------------------- */

START_TEST(catch_up_from_disk_then_live)
{
    /* History from disk in batches of one revision (catchup_bytes 1),
     * the ring (2 events), then live: at every boundary, a write between
     * two pulls must come exactly once. */
    open_hub_with(2, 1, 0);
    put_n(10, "a%d", 3); /* revisions 2..11 */
    cairn_hub_stream *s = new_stream();
    watch(s, "a", "b", 2);
    wlog l = {0};
    for (int i = 0; i < 40; i++) {
        ck_assert_int_eq(drain_n(s, &l, 1, 1), 0);
        if (i % 3 == 0) {
            char k[16];
            snprintf(k, sizeof k, "a%d", 100 + i);
            put_kv(st, k, "w");
        }
    }
    ck_assert_int_eq(drain_n(s, &l, 1 << 20, 1), 0);
    int64_t last = cur_rev(st);
    ck_assert_int_eq(last, 11 + 14);
    ck_revs(&l, 2, last);
    cairn_hub_stream_free(s);
}
END_TEST

START_TEST(catch_up_batches)
{
    /* etcd: a catch-up batch holds the revisions up to the current one
     * (at most 1000) with the current revision in its header. */
    open_hub(NULL);
    put_kv(st, "a", "1");
    put_kv(st, "b", "2");
    put_kv(st, "a", "3");
    cairn_hub_stream *s = new_stream();
    watch(s, "a", NULL, 1);
    wlog l = {0};
    drain(s, &l);
    ck_assert_str_eq(l.text, "[0@4: 2+a=1 4+a=3]");
    /* More than 1000 revisions: 1000, then the rest. */
    put_n(1100, "c%d", 1);
    cairn_hub_stream *s2 = new_stream();
    watch(s2, "c", "d", 1);
    wlog l2 = {0};
    ck_assert_int_eq(drain_n(s2, &l2, 1 << 20, 1), 0);
    ck_assert_int_eq(l2.batches, 2);
    ck_revs(&l2, 5, 1104);
    cairn_hub_stream_free(s);
    cairn_hub_stream_free(s2);
}
END_TEST

START_TEST(no_watcher_history_from_disk)
{
    /* With no watcher the hub keeps no ring: revisions written then come
     * from disk, written with a watcher from the ring, and a watcher
     * created after either sees each exactly once (a small ring, so the
     * disk batches and the ring meet several times). */
    open_hub_with(8, 64, 0);
    put_n(20, "a%d", 3); /* revisions 2..21, no watcher */
    cairn_hub_stream *s = new_stream();
    int64_t id = watch(s, "a", "b", 2);
    wlog l = {0};
    for (int i = 0; i < 30; i++) {
        ck_assert_int_eq(drain_n(s, &l, 1, 1), 0);
        char k[16];
        snprintf(k, sizeof k, "a%d", 100 + i);
        put_kv(st, k, "w"); /* 22..51, while s catches up, then live */
    }
    ck_assert_int_eq(drain_n(s, &l, 1 << 20, 1), 0);
    ck_revs(&l, 2, 51);
    int64_t rev;
    ck_assert_int_eq(cairn_hub_cancel(s, &rev, id), 0);
    put_n(5, "a2%d", 3); /* 52..56: no watcher again */
    cairn_hub_stream *s2 = new_stream();
    watch(s2, "a", "b", 40);
    put_kv(st, "a9", "x"); /* 57 */
    wlog l2 = {0};
    ck_assert_int_eq(drain_n(s2, &l2, 1 << 20, 1), 0);
    ck_revs(&l2, 40, 57);
    cairn_hub_stream_free(s);
    cairn_hub_stream_free(s2);
}
END_TEST

START_TEST(catch_up_bytes_bound)
{
    /* A catch-up batch ends at the first revision boundary past
     * catchup_bytes (4 MiB): eight 700 KiB values come as 6 + 2, from the
     * ring and from disk alike; four (2.8 MB) as one batch, as etcd. */
    open_hub(NULL);
    put_n(8, "big%d", 700 << 10); /* revisions 2..9 */
    cairn_hub_stream *s = new_stream();
    watch(s, "big", "bih", 2);
    wlog l = {0};
    ck_assert_int_eq(drain_n(s, &l, 1 << 20, 1), 0);
    ck_assert_int_eq(l.batches, 2);
    ck_revs(&l, 2, 9);
    cairn_hub_stream *s4 = new_stream();
    watch(s4, "big", "bih", 6);
    wlog l4 = {0};
    ck_assert_int_eq(drain_n(s4, &l4, 1 << 20, 1), 0);
    ck_assert_int_eq(l4.batches, 1);
    ck_revs(&l4, 6, 9);
    cairn_hub_stream_free(s);
    cairn_hub_stream_free(s4);
    /* The same from disk after a restart (the ring starts empty). */
    close_hub();
    open_hub(NULL);
    s = new_stream();
    watch(s, "big", "bih", 2);
    wlog ld = {0};
    ck_assert_int_eq(drain_n(s, &ld, 1 << 20, 1), 0);
    ck_assert_int_eq(ld.batches, 2);
    ck_revs(&ld, 2, 9);
    cairn_hub_stream_free(s);
}
END_TEST

START_TEST(catch_up_after_restart)
{
    open_hub(NULL);
    put_kv(st, "a", "1");
    put_kv(st, "a", "2");
    ck_assert_int_eq(del_range(st, "a", NULL, NULL), 1);
    close_hub();
    open_hub(NULL);
    cairn_hub_stream *s = new_stream();
    watch_full(s, "a", NULL, 2, 0, 0, 1);
    wlog l = {0};
    drain(s, &l);
    ck_assert_str_eq(l.text, "[0@4: 2+a=1(-) 3+a=2(1) 4-a(2)]");
    put_kv(st, "a", "5");
    drain(s, &l);
    ck_assert_str_eq(l.text, "[0@4: 2+a=1(-) 3+a=2(1) 4-a(2)][0@5: 5+a=5(-)]");
    cairn_hub_stream_free(s);
}
END_TEST

/* ---- ranges and filters -------------------------------------------------- */

START_TEST(range_matching)
{
    open_hub(NULL);
    cairn_hub_stream *s = new_stream();
    /* All on one stream, live: every watcher gets its own batches. */
    ck_assert_int_eq(watch(s, "a", NULL, 0), 0);
    watch(s, "p/", "p0", 0);
    watch(s, "m", "", 0);
    watch(s, "\0", "", 0); /* "\0" with "\0": every key */
    ck_assert_int_eq(watch(s, "b", "c", 0), 4);
    static const char *keys[] = {"a", "ab", "b", "bz", "c", "m", "p/", "p/x", "p0", "z"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        put_kv(st, keys[i], "v");
    wlog l = {0};
    drain(s, &l);
    ck_assert_int_eq(l.nrevs, 1 + 2 + 5 + 10 + 2);
    cairn_hub_stream_free(s);

    /* Per watcher, on a stream of its own. */
    static const struct {
        const char *key, *end, *got;
    } cases[] = {
        {"a", NULL, "2+a"},
        {"p/", "p0", "8+p/ 9+p/x"},
        {"m", "", "7+m 8+p/ 9+p/x 10+p0 11+z"},
        {"", "", "2+a 3+ab 4+b 5+bz 6+c 7+m 8+p/ 9+p/x 10+p0 11+z"},
        {"b", "c", "4+b 5+bz"},
        {"ab", "b", "3+ab"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cairn_hub_stream *si = new_stream();
        watch(si, cases[i].key, cases[i].end, 2);
        wlog li = {0};
        drain(si, &li);
        /* Strip the batch framing and the values: only "rev+key". */
        char got[2048] = "";
        size_t gl = 0;
        for (const char *p = li.text; *p; p++) {
            if (*p == '[') {
                while (*p && *p != ':')
                    p++;
                continue;
            }
            if (*p == ']' || *p == '=') {
                if (*p == '=')
                    p++; /* the value "v" */
                continue;
            }
            if (gl + 1 < sizeof got)
                got[gl++] = *p;
        }
        got[gl] = 0;
        const char *g = got[0] == ' ' ? got + 1 : got;
        ck_assert_msg(strcmp(g, cases[i].got) == 0, "watch [%s, %s): got \"%s\", want \"%s\"",
                      cases[i].key, cases[i].end ? cases[i].end : "(key)", g, cases[i].got);
        cairn_hub_stream_free(si);
    }
}
END_TEST

START_TEST(create_errors_and_ids)
{
    open_hub(NULL);
    cairn_hub_stream *s = new_stream();
    cairn_hub_watch_req r;
    memset(&r, 0, sizeof r);
    int64_t id, rev;
    /* etcd: key >= range_end is an empty range; answered with id -1. */
    r.key = (const uint8_t *)"b";
    r.key_len = 1;
    r.range_end = (const uint8_t *)"a";
    r.range_end_len = 1;
    ck_assert_int_eq(cairn_hub_watch(s, &id, &rev, &r), CAIRN_EWATCHEMPTYRANGE);
    ck_assert_int_eq(id, -1);
    ck_assert_int_eq(rev, 1);
    r.range_end = (const uint8_t *)"b";
    ck_assert_int_eq(cairn_hub_watch(s, &id, &rev, &r), CAIRN_EWATCHEMPTYRANGE);
    ck_assert_str_eq(cairn_strerror(CAIRN_EWATCHEMPTYRANGE), "mvcc: watcher range is empty");
    /* etcd: ids per stream from 0, skipping explicit ones; a taken
     * explicit id is refused. */
    r.range_end_len = 0;
    r.watch_id = 1;
    ck_assert_int_eq(cairn_hub_watch(s, &id, &rev, &r), 0);
    ck_assert_int_eq(id, 1);
    ck_assert_int_eq(cairn_hub_watch(s, &id, &rev, &r), CAIRN_EWATCHDUPID);
    ck_assert_str_eq(cairn_strerror(CAIRN_EWATCHDUPID),
                     "mvcc: duplicate watch ID provided on the WatchStream");
    r.watch_id = 0;
    ck_assert_int_eq(cairn_hub_watch(s, &id, &rev, &r), 0);
    ck_assert_int_eq(id, 0);
    ck_assert_int_eq(cairn_hub_watch(s, &id, &rev, &r), 0);
    ck_assert_int_eq(id, 2);
    /* Another stream counts from 0 again. */
    cairn_hub_stream *s2 = new_stream();
    ck_assert_int_eq(cairn_hub_watch(s2, &id, &rev, &r), 0);
    ck_assert_int_eq(id, 0);
    /* Cancel: known once, then not found. */
    ck_assert_int_eq(cairn_hub_cancel(s, &rev, 2), 0);
    ck_assert_int_eq(cairn_hub_cancel(s, &rev, 2), CAIRN_ENOTFOUND);
    ck_assert_int_eq(cairn_hub_revision(hub), 1);
    cairn_hub_stream_free(s);
    cairn_hub_stream_free(s2);
}
END_TEST

START_TEST(not_served_before_start)
{
    open_hub(NULL);
    put_kv(st, "a", "1");
    cairn_hub_stream *s = new_stream();
    cairn_hub_watch_req r;
    memset(&r, 0, sizeof r);
    r.key = (const uint8_t *)"a";
    r.key_len = 1;
    r.start_revision = 2;
    int64_t id, rev;
    ck_assert_int_eq(cairn_hub_watch(s, &id, &rev, &r), 0);
    wlog l = {0};
    drain(s, &l);
    ck_assert_str_eq(l.text, "");
    cairn_hub_start(s, id);
    drain(s, &l);
    ck_assert_str_eq(l.text, "[0@2: 2+a=1]");
    cairn_hub_stream_free(s);
}
END_TEST

START_TEST(filters_and_prev_kv)
{
    open_hub(NULL);
    cairn_hub_stream *np = new_stream(), *nd = new_stream(), *pk = new_stream();
    watch_full(np, "k", NULL, 0, 1, 0, 0);
    watch_full(nd, "k", NULL, 0, 0, 1, 0);
    watch_full(pk, "k", NULL, 0, 0, 0, 1);
    put_kv(st, "k", "1");
    put_kv(st, "k", "2");
    ck_assert_int_eq(del_range(st, "k", NULL, NULL), 1);
    put_kv(st, "k", "3");
    wlog a = {0}, b = {0}, c = {0};
    drain(np, &a);
    drain(nd, &b);
    drain(pk, &c);
    ck_assert_str_eq(a.text, "[0@4: 4-k]");
    ck_assert_str_eq(b.text, "[0@2: 2+k=1][0@3: 3+k=2][0@5: 5+k=3]");
    /* etcd: prev_kv at mod_revision - 1; none for a creation. */
    ck_assert_str_eq(c.text, "[0@2: 2+k=1(-)][0@3: 3+k=2(1)][0@4: 4-k(2)][0@5: 5+k=3(-)]");
    /* A catch-up whose every event is filtered out sends nothing. */
    cairn_hub_stream *f = new_stream();
    watch_full(f, "k", NULL, 2, 1, 1, 0);
    wlog d = {0};
    drain(f, &d);
    ck_assert_str_eq(d.text, "");
    cairn_hub_stream_free(np);
    cairn_hub_stream_free(nd);
    cairn_hub_stream_free(pk);
    cairn_hub_stream_free(f);
}
END_TEST

/* ---- slow watchers ------------------------------------------------------- */

START_TEST(slow_stream_does_not_block_writer)
{
    /* A stream that pulls nothing while 3,000 revisions are written: the
     * writer completes them all (it would hang if the hub waited for the
     * stream), the ring (100 events) evicts what the watcher needs, and
     * afterwards the stream gets every revision once, in order, in
     * catch-up batches rather than one per revision. */
    open_hub_with(100, 0, 0);
    cairn_hub_stream *slow = new_stream(), *fast = new_stream();
    watch(slow, "s", "t", 0);
    watch(fast, "s", "t", 0);
    wlog lf = {0};
    for (int i = 0; i < 30; i++) {
        put_n(100, "s%d", 16);
        ck_assert_int_eq(drain_n(fast, &lf, 1 << 20, 1), 0);
    }
    ck_revs(&lf, 2, 3001);
    wlog ls = {0};
    ck_assert_int_eq(drain_n(slow, &ls, 1 << 20, 1), 0);
    ck_revs(&ls, 2, 3001);
    ck_assert_int_le(ls.batches, 4);
    /* Live again afterwards: one batch per revision. */
    put_kv(st, "s", "x");
    wlog l2 = {0};
    drain(slow, &l2);
    ck_assert_int_eq(l2.batches, 1);
    ck_revs(&l2, 3002, 3002);
    cairn_hub_stream_free(slow);
    cairn_hub_stream_free(fast);
}
END_TEST

START_TEST(lagging_live_watcher_catches_up)
{
    /* Within the ring but more than lag_revs behind: demoted to catching
     * up (etcd: victim, then unsynced), so it gets batches. */
    open_hub_with(0, 0, 8);
    cairn_hub_stream *s = new_stream();
    watch(s, "x", "y", 0);
    put_n(5, "x%d", 1);
    wlog l = {0};
    drain(s, &l);
    ck_assert_int_eq(l.batches, 5); /* within the bound: one per revision */
    put_n(20, "x%d", 1);
    wlog l2 = {0};
    drain(s, &l2);
    ck_assert_int_eq(l2.batches, 1);
    ck_revs(&l2, 7, 26);
    cairn_hub_stream_free(s);
}
END_TEST

/* ---- cancel and compaction during catch-up -------------------------------- */

START_TEST(cancel_during_catch_up)
{
    open_hub_with(2, 1, 0);
    put_n(10, "c%d", 1);
    cairn_hub_stream *s = new_stream();
    int64_t a = watch(s, "c", "d", 2);
    int64_t b = watch(s, "c0", NULL, 0); /* live, on the same stream */
    wlog l = {0};
    ck_assert_int_eq(drain_n(s, &l, 2, 0), 0);
    ck_assert_str_eq(l.text, "[0@11: 2+c0=v][0@11: 3+c1=v]");
    int64_t rev;
    ck_assert_int_eq(cairn_hub_cancel(s, &rev, a), 0);
    ck_assert_int_eq(rev, 11);
    put_kv(st, "c0", "w");
    drain(s, &l);
    /* Nothing more for the cancelled one; the other goes on. */
    ck_assert_str_eq(l.text, "[0@11: 2+c0=v][0@11: 3+c1=v][1@12: 12+c0=w]");
    (void)b;
    cairn_hub_stream_free(s);
}
END_TEST

typedef struct racer {
    cairn_hub_stream *s;
    atomic_int stop;
    int64_t last; /* the last revision pulled */
    int bad;      /* a revision out of order or repeated */
} racer;

static void *pull_loop(void *arg)
{
    racer *r = arg;
    while (!atomic_load(&r->stop)) {
        cairn_hub_batch b;
        int rc = cairn_hub_next(r->s, &b);
        if (rc == CAIRN_HUB_BATCH) {
            for (size_t i = 0; i < b.nevents; i++) {
                if (b.events[i].kv.mod_revision <= r->last)
                    r->bad = 1;
                r->last = b.events[i].kv.mod_revision;
            }
            cairn_hub_batch_destroy(&b);
        } else if (rc < 0) {
            r->bad = 1;
        }
    }
    return NULL;
}

START_TEST(cancel_while_pulling)
{
    /* A cancel from another thread while the owner pulls (the server's
     * receive beside its send): the pulls stay in order and stop. */
    open_hub_with(2, 64, 0);
    put_n(2000, "r%d", 8);
    for (int round = 0; round < 5; round++) {
        cairn_hub_stream *s = new_stream();
        int64_t id = watch(s, "r", "s", 2);
        racer r = {s, 0, 0, 0};
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, pull_loop, &r), 0);
        struct timespec d = {0, (round + 1) * 2000000L};
        nanosleep(&d, NULL);
        int64_t rev;
        ck_assert_int_eq(cairn_hub_cancel(s, &rev, id), 0);
        atomic_store(&r.stop, 1);
        pthread_join(t, NULL);
        ck_assert_int_eq(r.bad, 0);
        cairn_hub_batch b;
        ck_assert_int_eq(cairn_hub_next(s, &b), CAIRN_HUB_NONE);
        cairn_hub_stream_free(s);
    }
}
END_TEST

START_TEST(compaction_during_catch_up)
{
    open_hub_with(2, 1, 0);
    put_n(10, "c%d", 1); /* 2..11 */
    cairn_hub_stream *s = new_stream();
    watch(s, "c", "d", 2);
    int64_t live = watch(s, "c9", NULL, 0);
    wlog l = {0};
    ck_assert_int_eq(drain_n(s, &l, 1, 0), 0);
    ck_assert_str_eq(l.text, "[0@11: 2+c0=v]");
    cairn_header h;
    ck_assert_int_eq(cairn_store_compact(st, &h, 8, 0), 0);
    /* etcd: compact_revision, canceled, header revision 0; the watcher
     * is gone, the other one on the stream lives. */
    drain(s, &l);
    ck_assert_str_eq(l.text, "[0@11: 2+c0=v][0 compacted 8]");
    ck_assert_int_eq(cairn_hub_cancel(s, &h.revision, 0), CAIRN_ENOTFOUND);
    put_kv(st, "c9", "w");
    drain(s, &l);
    ck_assert_str_eq(l.text, "[0@11: 2+c0=v][0 compacted 8][1@12: 12+c9=w]");
    ck_assert_int_eq(live, 1);
    /* A start below the compaction is answered at once; at it, served. */
    cairn_hub_stream *s2 = new_stream();
    watch(s2, "c", "d", 7);
    watch(s2, "c", "d", 8);
    wlog l2 = {0};
    drain(s2, &l2);
    ck_assert_str_eq(l2.text, "[0 compacted 8][1@12: 8+c6=v][1@12: 9+c7=v][1@12: 10+c8=v]"
                              "[1@12: 11+c9=v][1@12: 12+c9=w]");
    cairn_hub_stream_free(s);
    cairn_hub_stream_free(s2);
}
END_TEST

/* ---- notify -------------------------------------------------------------- */

static cairn_hub_stream *self_freeing;
static atomic_int freed_in_cb;

static void free_self(void *arg)
{
    (void)arg;
    if (self_freeing) {
        cairn_hub_stream_free(self_freeing);
        self_freeing = NULL;
        atomic_store(&freed_in_cb, 1);
    }
}

START_TEST(stream_freed_from_its_notify)
{
    open_hub(NULL);
    cairn_hub_stream *s;
    ck_assert_int_eq(cairn_hub_stream_new(&s, hub, free_self, NULL), 0);
    self_freeing = s;
    watch(s, "n", NULL, 0);
    put_kv(st, "n", "1");
    for (int i = 0; i < 2000 && !atomic_load(&freed_in_cb); i++) {
        struct timespec d = {0, 1000000L};
        nanosleep(&d, NULL);
    }
    ck_assert_int_eq(atomic_load(&freed_in_cb), 1);
    put_kv(st, "n", "2"); /* the hub no longer knows the stream */
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_hub");
    TCase *tc = tcase_create("hub");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, live_one_revision_per_batch);
    tcase_add_test(tc, ring_wraps);
    tcase_add_test(tc, catch_up_from_disk_then_live);
    tcase_add_test(tc, catch_up_batches);
    tcase_add_test(tc, no_watcher_history_from_disk);
    tcase_add_test(tc, catch_up_bytes_bound);
    tcase_add_test(tc, catch_up_after_restart);
    tcase_add_test(tc, range_matching);
    tcase_add_test(tc, create_errors_and_ids);
    tcase_add_test(tc, not_served_before_start);
    tcase_add_test(tc, filters_and_prev_kv);
    tcase_add_test(tc, slow_stream_does_not_block_writer);
    tcase_add_test(tc, lagging_live_watcher_catches_up);
    tcase_add_test(tc, cancel_during_catch_up);
    tcase_add_test(tc, cancel_while_pulling);
    tcase_add_test(tc, compaction_during_catch_up);
    tcase_add_test(tc, stream_freed_from_its_notify);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
