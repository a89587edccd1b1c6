/*
 * Fuzz target: cairnpb.Peer/Join's two decoders (server/peer/peer_msg.c),
 * the code peer.c runs on bytes from the network. The first input byte
 * picks the side: even, the answering member's (peer_join_answer: a
 * JoinRequest from a would-be member, checked against a fixed cluster of
 * three members, one of them added and never started; 2 mod 4: of 64
 * members with long URLs, whose refusal must still fit a gRPC status);
 * odd, the joiner's
 * (peer_join_decode: a JoinResponse from whoever answered). Every failure
 * must be a refusal with a reason or ENOMEM, never a crash or a leak; an
 * answer that is given must decode on the joiner's side and name the
 * member it was given for.
 *
 * Built with -DPEER_JOIN_GEN it is instead the seed writer (a request
 * that is answered, one of each refusal, and an answer):
 *   cc -DPEER_JOIN_GEN -I. -Ibuild/proto-gen fuzz/fuzz_peer_join.c \
 *      server/peer/peer_msg.c build/server/libcairn_proto.a \
 *      build/crdt/libcairn_crdt.a -lprotobuf-c -lsodium -lpthread -o /tmp/gen \
 *      && /tmp/gen fuzz/corpus/peer_join
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "server/peer/peer_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char u1[] = "http://10.0.0.1:2380", u2[] = "http://10.0.0.2:2380",
            u3[] = "http://10.0.0.3:2380", c1[] = "http://10.0.0.1:2379";
static char *p1[] = {u1}, *p2[] = {u2}, *p3[] = {u3}, *cl1[] = {c1};
static char n1[] = "n1", n2[] = "n2", none[] = "";
static const cairn_member_info members[3] = {
    {0x1111, n1, p1, 1, cl1, 1, 0},
    {0x2222, n2, p2, 1, NULL, 0, 0},
    {0x3333, none, p3, 1, NULL, 0, 1}, /* added (a learner), never started */
};
static const uint8_t token_hash[32] = {7};
static const cairn_hash heads[2] = {{{1}}, {{2}}};
static const peer_join_self self = {0xc1c1, token_hash, members, 3, heads, 2};

/* A cluster of PEER_JOIN_MAX_MEMBERS members with long URLs: the
 * refusal's dump of it is cut (first byte 2 mod 4). */
static cairn_member_info big[PEER_JOIN_MAX_MEMBERS];
static char big_urls[PEER_JOIN_MAX_MEMBERS][200], *big_url[PEER_JOIN_MAX_MEMBERS];

static const peer_join_self *big_self(void)
{
    static peer_join_self b;
    if (!b.nmembers) {
        for (size_t i = 0; i < PEER_JOIN_MAX_MEMBERS; i++) {
            snprintf(big_urls[i], sizeof big_urls[i], "http://member-%03zu.%0150d:2380", i, 0);
            big_url[i] = big_urls[i];
            big[i] = (cairn_member_info){0x100 + i, n2, &big_url[i], 1, NULL, 0, 0};
        }
        b = (peer_join_self){0xc1c1, token_hash, big, PEER_JOIN_MAX_MEMBERS, heads, 2};
    }
    return &b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char why[16384];
    if (data[0] % 4 == 2) {
        uint8_t *out;
        size_t len;
        uint64_t who;
        int rc =
            peer_join_answer(&out, &len, &who, data + 1, size - 1, big_self(), why, sizeof why);
        if (rc == 0)
            free(out);
        else if (rc == -1 && strlen(why) > 8000) /* must fit a gRPC status */
            abort();
    } else if (data[0] % 2 == 0) {
        uint8_t *out;
        size_t len;
        uint64_t who;
        int rc = peer_join_answer(&out, &len, &who, data + 1, size - 1, &self, why, sizeof why);
        if (rc == 0) {
            peer_join j;
            char w2[256];
            if (peer_join_decode(&j, out, len, w2, sizeof w2) != 0 || j.member_id != who ||
                j.cluster_id != self.cluster_id || j.nmembers != 3 || j.nheads != 2)
                abort();
            peer_join_destroy(&j);
            free(out);
        } else if (rc != -1 && rc != CAIRN_ENOMEM) {
            abort();
        } else if (rc == -1 && !why[0]) {
            abort();
        }
    } else {
        peer_join j;
        int rc = peer_join_decode(&j, data + 1, size - 1, why, sizeof why);
        if (rc == 0) {
            int me = 0;
            for (size_t i = 0; i < j.nmembers; i++)
                me |= j.members[i].id == j.member_id && j.members[i].npeer_urls > 0;
            if (!me)
                abort();
            peer_join_destroy(&j);
        } else if (rc != -1 && rc != CAIRN_ENOMEM) {
            abort();
        }
    }
    return 0;
}

#ifdef PEER_JOIN_GEN
static void put(const char *dir, const char *name, uint8_t side, const uint8_t *b, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&side, 1, 1, f) != 1 || fwrite(b, 1, n, f) != n)
        exit(1);
    fclose(f);
}

static void request(const char *dir, const char *name, const uint8_t *th, char *const *adv,
                    size_t nic)
{
    Cairnpb__JoinPeer ps[3], *pp[3];
    char *names[3] = {n1, n2, (char *)"n3"};
    char **urls[3] = {p1, p2, p3};
    for (size_t i = 0; i < 3; i++) {
        cairnpb__join_peer__init(&ps[i]);
        ps[i].name = names[i];
        ps[i].peer_urls = urls[i];
        ps[i].n_peer_urls = 1;
        pp[i] = &ps[i];
    }
    Cairnpb__JoinRequest r = CAIRNPB__JOIN_REQUEST__INIT;
    r.protocol_version = PEER_PROTOCOL_VERSION;
    r.token_hash.data = (uint8_t *)th;
    r.token_hash.len = 32;
    r.name = (char *)"n3";
    r.peer_urls = (char **)adv;
    r.n_peer_urls = 1;
    r.initial_cluster = pp;
    r.n_initial_cluster = nic;
    uint8_t buf[4096];
    size_t n = cairnpb__join_request__pack(&r, buf);
    put(dir, name, 0, buf, n);
    if (strcmp(name, "answered") == 0) {
        uint8_t *out;
        size_t len;
        uint64_t who;
        char why[16384];
        if (peer_join_answer(&out, &len, &who, buf, n, &self, why, sizeof why))
            exit(2);
        put(dir, "answer", 1, out, len);
        free(out);
        put(dir, "big_cluster", 2, buf, n); /* refused by the big cluster */
    }
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    static const uint8_t other[32] = {8};
    static char wrong[] = "http://10.0.0.9:2380";
    static char *pw[] = {wrong};
    request(argv[1], "answered", token_hash, p3, 3);
    request(argv[1], "wrong_token", other, p3, 3);
    request(argv[1], "member_count", token_hash, p3, 2);
    request(argv[1], "unknown_urls", token_hash, pw, 3);
    return 0;
}
#endif
