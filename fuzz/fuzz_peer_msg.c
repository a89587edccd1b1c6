/*
 * Fuzz target: one peer stream from the network side. The input is the
 * stream's messages as the peer's gRPC layer would hand them over, each a
 * 16-bit little-endian length and that many bytes of a cairnpb.PeerMessage;
 * every one goes through server/peer's decoder and dispatch
 * (peer_msg_dispatch, the code peer.c runs) into a sync session over a
 * replica that holds a few changes, as peer.c's handlers would: a hello is
 * checked against this node (cluster id and token hash below), sync
 * messages are received by the session, their changes applied and an
 * answer generated; a refusal, a reset, a goodbye or a message the session
 * or the document refuses ends the stream, and the next message starts a
 * new one (which must open with a hello again). Every failure must be a
 * named error and the replica must stay sound (cairn_doc_check_); never a
 * crash or a leak. A change the document refuses ends the stream as
 * peer.c's refusal does (peer_verdict_refuses: not a fork's other side).
 * And acceptance must not depend on arrival order: no change waits as
 * pending on a refused dep (a descendant is refused with its ancestor),
 * and a second replica fed every change the session handed out, in the
 * reverse order, ends with the same heads and the same verdict (ordered,
 * refused, pending) for each — unless a fork was met (first arrival wins,
 * README) or a pending bound refused one (ELIMIT: not a verdict). The store's own receive (group
 * commit, durability) is not here: it needs a disk, and it is fed exactly what this session hands
 * back.
 *
 * Built with -DPEER_MSG_GEN it is instead the seed writer: it plays a real
 * peer against the same replica and writes its streams as inputs:
 *   cc -DPEER_MSG_GEN -I. -Ibuild/proto-gen fuzz/fuzz_peer_msg.c \
 *      server/peer/peer_msg.c build/server/libcairn_proto.a \
 *      build/crdt/libcairn_crdt.a -lprotobuf-c -lsodium -lpthread -o /tmp/gen \
 *      && /tmp/gen fuzz/corpus/peer_msg
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/doc.h"
#include "crdt/doc_int.h"
#include "crdt/error.h"
#include "crdt/sync.h"
#include "server/peer/peer_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CLUSTER_ID UINT64_C(0x1122334455667788)
#define MAX_MSGS 64

static const uint8_t token[32] = {0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
                                  0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
                                  0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab};

static void check(int cond)
{
    if (!cond)
        abort();
}

/* A named error: a row of CAIRN_ERRORS (whose status is never UNKNOWN). */
static void named(int rc)
{
    check(rc < 0 && cairn_error_grpc_status(rc) != 2);
}

static cairn_actor actor(uint8_t b)
{
    cairn_actor a;
    memset(a.b, b, sizeof a.b);
    return a;
}

static void put(cairn_doc *d, uint64_t t, const char *k, const char *v)
{
    cairn_value val = {.type = CAIRN_V_STR};
    val.v.bytes.ptr = (const uint8_t *)v;
    val.v.bytes.len = strlen(v);
    check(cairn_doc_begin(d, t) == 0);
    check(cairn_doc_put(d, CAIRN_ROOT, (const uint8_t *)k, strlen(k), &val) == 0);
    check(cairn_doc_commit(d, NULL, NULL) == 0);
}

/* This node's replica: the same three changes in every exec. */
static cairn_doc *replica(void)
{
    cairn_doc *d;
    cairn_actor a = actor(1);
    check(cairn_doc_new(&d, &a) == 0);
    put(d, 100, "a", "1");
    put(d, 101, "b", "2");
    put(d, 102, "a", "3");
    return d;
}

/* Every change the session handed out, as bytes, in arrival order. */
#define MAX_OFFERED 1024

struct stream {
    cairn_doc *doc;
    cairn_sync_state *st;
    int hello_in;
    uint8_t salt_ctr;
    uint8_t *answer; /* the last message generated for the peer */
    size_t answer_len;
    uint8_t *offered[MAX_OFFERED];
    size_t offered_len[MAX_OFFERED], noffered;
    int forked, limited; /* a fork was met; a pending bound refused one */
};

static void on_fork(void *arg, const cairn_change *c, const cairn_hash *held)
{
    (void)c;
    (void)held;
    *(int *)arg = 1;
}

/* No change |d| holds as pending has a refused dep. */
static void check_no_pending_on_refused(cairn_doc *d, struct stream *s)
{
    const cairn_dag *dag = cairn_doc_dag(d);
    for (size_t i = 0; i < s->noffered; i++) {
        cairn_change *c;
        check(cairn_change_decode(&c, s->offered[i], s->offered_len[i], NULL) == 0);
        if (cairn_dag_has(dag, &c->hash) == 2 && !cairn_dag_rejected(dag, &c->hash))
            for (uint32_t k = 0; k < c->ndeps; k++)
                check(!cairn_dag_rejected(dag, &c->deps[k]));
        cairn_change_free(c);
    }
}

static void end_stream(struct stream *s)
{
    s->hello_in = 0;
    cairn_sync_reset(s->st); /* a new stream: what was in flight is lost */
}

static void on_hello(void *arg, const Cairnpb__Hello *h)
{
    struct stream *s = arg;
    check(h->protocol_version == PEER_PROTOCOL_VERSION && h->cluster_id == CLUSTER_ID &&
          h->actor_id.len == CAIRN_ACTOR_LEN);
    s->hello_in = 1;
}

static void on_sync(void *arg, const uint8_t *msg, size_t len)
{
    struct stream *s = arg;
    check(s->hello_in);
    cairn_change **cs;
    size_t n;
    int rc = cairn_sync_receive(&cs, &n, s->st, s->doc, msg, len);
    if (rc) {
        named(rc);
        end_stream(s);
        return;
    }
    int rejected = 0;
    cairn_doc_observer obs = {.arg = &s->forked, .fork_cb = on_fork};
    for (size_t i = 0; i < n; i++) {
        if (s->noffered < MAX_OFFERED) {
            uint8_t *b = malloc(cs[i]->len);
            check(b != NULL);
            memcpy(b, cs[i]->bytes, cs[i]->len);
            s->offered[s->noffered] = b;
            s->offered_len[s->noffered++] = cs[i]->len;
        } else {
            s->limited = 1; /* not compared: the shadow would lack it */
        }
        rc = cairn_doc_receive(s->doc, cs[i], &obs);
        cs[i] = NULL;
        if (rc) {
            named(rc);
            s->limited |= rc == CAIRN_ELIMIT || rc == CAIRN_ENOMEM;
            rejected |= peer_verdict_refuses(rc);
        }
    }
    check_no_pending_on_refused(s->doc, s);
    cairn_sync_changes_free(cs, n);
    check(cairn_sync_applied(s->st, s->doc) == 0);
    if (rejected) {
        end_stream(s);
        return;
    }
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {s->salt_ctr++};
    free(s->answer);
    s->answer = NULL;
    check(cairn_sync_generate(&s->answer, &s->answer_len, s->doc, s->st, salt) == 0);
}

static void on_goodbye(void *arg, const char *reason)
{
    check(reason != NULL);
    end_stream(arg);
}

/* peer.c bounds each entry before it keeps any URL; here every entry the
 * decoder hands out must at least be whole. */
static void on_members(void *arg, const Cairnpb__Members *ms)
{
    (void)arg;
    for (size_t i = 0; i < ms->n_members; i++)
        for (size_t j = 0; j < ms->members[i]->n_client_urls; j++)
            check(ms->members[i]->client_urls[j] != NULL);
}

static void on_refuse(void *arg, const char *why)
{
    check(why && *why);
    end_stream(arg);
}

static struct stream *stream_new(void)
{
    struct stream *s = calloc(1, sizeof *s);
    check(s != NULL);
    s->doc = replica();
    check(cairn_sync_state_new(&s->st, NULL) == 0);
    return s;
}

/* The order check: a fresh replica takes every offered change in reverse. */
static void check_order_free(struct stream *s)
{
    cairn_doc *shadow = replica();
    int forked = 0;
    cairn_doc_observer obs = {.arg = &forked, .fork_cb = on_fork};
    for (size_t i = s->noffered; i-- > 0;) {
        cairn_change *c;
        check(cairn_change_decode(&c, s->offered[i], s->offered_len[i], NULL) == 0);
        int rc = cairn_doc_receive(shadow, c, &obs);
        if (rc)
            named(rc);
        s->limited |= rc == CAIRN_ELIMIT || rc == CAIRN_ENOMEM;
    }
    check_no_pending_on_refused(shadow, s);
    check(cairn_doc_check_(shadow) == 0);
    if (!forked && !s->forked && !s->limited) {
        const cairn_dag *a = cairn_doc_dag(s->doc), *b = cairn_doc_dag(shadow);
        const cairn_hash *ha, *hb;
        size_t na = cairn_dag_heads(a, &ha), nb = cairn_dag_heads(b, &hb);
        check(na == nb && memcmp(ha, hb, na * sizeof *ha) == 0);
        check(cairn_dag_count(a) == cairn_dag_count(b));
        for (size_t i = 0; i < s->noffered; i++) {
            cairn_hash h;
            cairn_hash_bytes(&h, s->offered[i], s->offered_len[i]);
            check(cairn_dag_has(a, &h) == cairn_dag_has(b, &h));
            check(!cairn_dag_rejected(a, &h) == !cairn_dag_rejected(b, &h));
        }
    }
    cairn_doc_free(shadow);
}

static void stream_free(struct stream *s)
{
    for (size_t i = 0; i < s->noffered; i++)
        free(s->offered[i]);
    free(s->answer);
    cairn_sync_state_free(s->st);
    cairn_doc_free(s->doc);
    free(s);
}

static const peer_self self = {CLUSTER_ID, token};

static void dispatch(struct stream *s, const uint8_t *m, size_t len)
{
    const peer_handlers h = {.arg = s,
                             .hello = on_hello,
                             .sync = on_sync,
                             .members = on_members,
                             .goodbye = on_goodbye,
                             .refuse = on_refuse,
                             .reset = on_refuse};
    peer_msg_dispatch(m, len, s->hello_in, &self, &h);
}

#ifndef PEER_MSG_GEN

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct stream *s = stream_new();
    for (int k = 0; k < MAX_MSGS && size >= 2; k++) {
        size_t len = (size_t)data[0] | (size_t)data[1] << 8;
        data += 2;
        size -= 2;
        if (len > size)
            len = size;
        dispatch(s, data, len);
        data += len;
        size -= len;
    }
    check(cairn_doc_check_(s->doc) == 0);
    check_order_free(s);
    stream_free(s);
    return 0;
}

#else /* the seed writer */

#include "crdt/change.h"

struct out {
    uint8_t b[1 << 20];
    size_t n;
};

static void frame(struct out *o, const Cairnpb__PeerMessage *m)
{
    size_t len = cairnpb__peer_message__get_packed_size(m);
    check(len < 65536 && o->n + 2 + len <= sizeof o->b);
    o->b[o->n++] = (uint8_t)len;
    o->b[o->n++] = (uint8_t)(len >> 8);
    cairnpb__peer_message__pack(m, o->b + o->n);
    o->n += len;
}

static void hello(struct out *o, uint32_t version, uint64_t cluster, size_t actor_len)
{
    Cairnpb__Hello h = CAIRNPB__HELLO__INIT;
    uint8_t a[CAIRN_ACTOR_LEN];
    memset(a, 2, sizeof a);
    static char name[] = "n2", url[] = "http://127.0.0.1:2379";
    char *urls[] = {url};
    h.protocol_version = version;
    h.cluster_id = cluster;
    h.member_id = 2;
    h.actor_id = (ProtobufCBinaryData){actor_len, a};
    h.token_hash = (ProtobufCBinaryData){sizeof token, (uint8_t *)token};
    h.name = name;
    h.n_client_urls = 1;
    h.client_urls = urls;
    Cairnpb__PeerMessage m = CAIRNPB__PEER_MESSAGE__INIT;
    m.body_case = CAIRNPB__PEER_MESSAGE__BODY_HELLO;
    m.hello = &h;
    frame(o, &m);
}

static void sync_msg(struct out *o, const uint8_t *b, size_t len)
{
    Cairnpb__Sync sy = CAIRNPB__SYNC__INIT;
    sy.msg = (ProtobufCBinaryData){len, (uint8_t *)b};
    Cairnpb__PeerMessage m = CAIRNPB__PEER_MESSAGE__INIT;
    m.body_case = CAIRNPB__PEER_MESSAGE__BODY_SYNC;
    m.sync = &sy;
    frame(o, &m);
}

static void goodbye(struct out *o)
{
    static char why[] = "shutting down";
    Cairnpb__Goodbye g = CAIRNPB__GOODBYE__INIT;
    g.reason = why;
    Cairnpb__PeerMessage m = CAIRNPB__PEER_MESSAGE__INIT;
    m.body_case = CAIRNPB__PEER_MESSAGE__BODY_GOODBYE;
    m.goodbye = &g;
    frame(o, &m);
}

static void write_seed(const char *dir, const char *name, const struct out *o)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    check(f && fwrite(o->b, 1, o->n, f) == o->n && fclose(f) == 0);
}

/* The peer: this node's first change, then edits of its own. */
static cairn_doc *peer_doc(void)
{
    cairn_doc *d, *mine = replica();
    cairn_actor a = actor(2);
    check(cairn_doc_new(&d, &a) == 0);
    cairn_change *c;
    check(cairn_dag_load(&c, cairn_doc_dag(mine), 0) == 0);
    check(cairn_doc_receive(d, c, NULL) == 0);
    cairn_doc_free(mine);
    put(d, 200, "a", "peer");
    put(d, 201, "c", "peer");
    return d;
}

/* Hello, then the peer's side of a whole sync exchange with the target's
 * replica (the target's answers fed back), then a goodbye. */
static void exchange(struct out *o, int push)
{
    cairn_doc *p = peer_doc();
    cairn_sync_state *pst;
    check(cairn_sync_state_new(&pst, NULL) == 0);
    struct stream *s = stream_new();
    o->n = 0;
    hello(o, PEER_PROTOCOL_VERSION, CLUSTER_ID, CAIRN_ACTOR_LEN);
    dispatch(s, o->b + 2, o->n - 2);
    if (push) {
        cairn_change *cs[2];
        const cairn_change *ccs[2];
        for (int i = 0; i < 2; i++) {
            check(cairn_dag_load(&cs[i], cairn_doc_dag(p),
                                 cairn_dag_count(cairn_doc_dag(p)) - 2 + (uint64_t)i) == 0);
            ccs[i] = cs[i];
        }
        uint8_t *m;
        size_t len, np;
        check(cairn_sync_push(&m, &len, &np, p, pst, ccs, 2) == 0 && m);
        size_t at = o->n;
        sync_msg(o, m, len);
        dispatch(s, o->b + at + 2, o->n - at - 2);
        free(m);
        for (int i = 0; i < 2; i++)
            cairn_change_free(cs[i]);
    }
    uint8_t salt[CAIRN_BLOOM_SALT_LEN] = {0x77};
    for (int round = 0; round < 8; round++) {
        uint8_t *m;
        size_t len;
        salt[1] = (uint8_t)round;
        check(cairn_sync_generate(&m, &len, p, pst, salt) == 0);
        if (!m && !s->answer)
            break;
        if (m) {
            size_t at = o->n;
            sync_msg(o, m, len);
            free(s->answer);
            s->answer = NULL;
            dispatch(s, o->b + at + 2, o->n - at - 2);
            free(m);
        }
        if (s->answer) {
            cairn_change **cs;
            size_t n;
            check(cairn_sync_receive(&cs, &n, pst, p, s->answer, s->answer_len) == 0);
            for (size_t i = 0; i < n; i++) {
                check(cairn_doc_receive(p, cs[i], NULL) == 0);
                cs[i] = NULL;
            }
            cairn_sync_changes_free(cs, n);
            free(s->answer);
            s->answer = NULL;
        }
    }
    const cairn_hash *hp, *hs;
    size_t np = cairn_dag_heads(cairn_doc_dag(p), &hp),
           ns = cairn_dag_heads(cairn_doc_dag(s->doc), &hs);
    check(np == ns && memcmp(hp, hs, np * sizeof *hp) == 0); /* the exchange converged */
    goodbye(o);
    stream_free(s);
    cairn_sync_state_free(pst);
    cairn_doc_free(p);
}

/* An op-less change by actor |a| (all bytes), seq |seq|, on |deps|. */
static cairn_change *bare_change(uint8_t a, uint64_t seq, const cairn_hash *deps, uint32_t ndeps)
{
    cairn_change t;
    memset(&t, 0, sizeof t);
    cairn_actor act = actor(a);
    t.actor = act;
    t.seq = seq;
    t.start_op = 1;
    t.time_ms = 1;
    t.ndeps = ndeps;
    t.deps = (cairn_hash *)deps;
    t.nactors = 1;
    t.actors = &act;
    cairn_change *c;
    check(cairn_change_new(&c, &t) == 0);
    return c;
}

static size_t put_uv(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n++] = (uint8_t)(v & 0x7f) | (v > 0x7f ? 0x80 : 0);
        v >>= 7;
    } while (v);
    return n;
}

/* A sync message by hand (sync.c's table): no heads, need or filter, the
 * changes in full (none may depend on the one before it). */
static void sync_of(struct out *o, cairn_change *const *cs, size_t n)
{
    static uint8_t b[1 << 16];
    size_t k = 0;
    b[k++] = CAIRN_SYNC_VERSION;
    b[k++] = 0x00;
    b[k++] = 0; /* heads */
    b[k++] = 0; /* need */
    k += put_uv(b + k, n);
    for (size_t i = 0; i < n; i++) {
        k += put_uv(b + k, (uint64_t)cs[i]->len << 1);
        memcpy(b + k, cs[i]->bytes, cs[i]->len);
        k += cs[i]->len;
    }
    sync_msg(o, b, k);
}

/* A seq gap (actor 9's seq 2 on nothing), a descendant that comes first
 * (buffered, then refused with it) and a grandchild that comes after
 * (refused on arrival), then an honest change; then a fork of this
 * node's first change's author. */
static void hostile_seeds(struct out *o, const char *dir)
{
    cairn_change *gap = bare_change(9, 2, NULL, 0);
    cairn_change *desc = bare_change(10, 1, &gap->hash, 1);
    cairn_change *grand = bare_change(11, 1, &desc->hash, 1);
    cairn_change *honest = bare_change(12, 1, NULL, 0);
    cairn_change *fork = bare_change(1, 1, NULL, 0);
    cairn_change *fork_child = bare_change(13, 1, &fork->hash, 1);
    o->n = 0;
    hello(o, PEER_PROTOCOL_VERSION, CLUSTER_ID, CAIRN_ACTOR_LEN);
    sync_of(o, &desc, 1);
    sync_of(o, &gap, 1);
    hello(o, PEER_PROTOCOL_VERSION, CLUSTER_ID, CAIRN_ACTOR_LEN);
    sync_of(o, (cairn_change *[]){grand, honest}, 2);
    write_seed(dir, "descendants_of_a_refused_change", o);
    o->n = 0;
    hello(o, PEER_PROTOCOL_VERSION, CLUSTER_ID, CAIRN_ACTOR_LEN);
    sync_of(o, (cairn_change *[]){fork_child, fork, honest}, 3);
    write_seed(dir, "fork_and_its_child", o);
    /* A chain in full, which version 2 spells with the dependency cut out
     * (refused: not canonical), then as the encoder spells it, the heads
     * its last change. */
    cairn_change *next = bare_change(12, 2, &honest->hash, 1);
    o->n = 0;
    hello(o, PEER_PROTOCOL_VERSION, CLUSTER_ID, CAIRN_ACTOR_LEN);
    sync_of(o, (cairn_change *[]){honest, next}, 2);
    hello(o, PEER_PROTOCOL_VERSION, CLUSTER_ID, CAIRN_ACTOR_LEN);
    cairn_sync_msg m = {.heads = &next->hash,
                        .nheads = 1,
                        .changes = (cairn_change *[]){honest, next},
                        .nchanges = 2};
    uint8_t *b;
    size_t len;
    check(cairn_sync_msg_encode(&b, &len, &m) == 0);
    sync_msg(o, b, len);
    free(b);
    write_seed(dir, "chain_in_full_then_cut", o);
    cairn_change *all[] = {gap, desc, grand, honest, fork, fork_child, next};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cairn_change_free(all[i]);
}

int main(int argc, char **argv)
{
    check(argc == 2);
    static struct out o;
    exchange(&o, 0);
    write_seed(argv[1], "exchange", &o);
    exchange(&o, 1);
    write_seed(argv[1], "push_then_exchange", &o);
    o.n = 0;
    hello(&o, PEER_PROTOCOL_VERSION, CLUSTER_ID, CAIRN_ACTOR_LEN);
    hello(&o, PEER_PROTOCOL_VERSION, CLUSTER_ID, CAIRN_ACTOR_LEN);
    write_seed(argv[1], "hello_twice", &o);
    o.n = 0;
    hello(&o, PEER_PROTOCOL_VERSION + 1, CLUSTER_ID, CAIRN_ACTOR_LEN);
    hello(&o, PEER_PROTOCOL_VERSION - 1, CLUSTER_ID, CAIRN_ACTOR_LEN);
    hello(&o, PEER_PROTOCOL_VERSION, CLUSTER_ID + 1, CAIRN_ACTOR_LEN);
    hello(&o, PEER_PROTOCOL_VERSION, CLUSTER_ID, 15);
    goodbye(&o);
    write_seed(argv[1], "refused_hellos", &o);
    o.n = 0;
    sync_msg(&o, (const uint8_t *)"\x01", 1);
    o.b[o.n++] = 3;
    o.b[o.n++] = 0;
    memcpy(o.b + o.n, "\xff\xff\xff", 3);
    o.n += 3;
    hello(&o, PEER_PROTOCOL_VERSION, CLUSTER_ID, CAIRN_ACTOR_LEN);
    sync_msg(&o, (const uint8_t *)"\x01\x02\x03", 3);
    write_seed(argv[1], "before_hello_garbage_bad_sync", &o);
    hostile_seeds(&o, argv[1]);
    return 0;
}

#endif
