/*
 * One message of a peer stream (peer_msg.h): protobuf-c decodes it, the
 * stream's state says which bodies may come, and the hello's own fields
 * are checked against this node before the owner sees it.
 */
#include "server/peer/peer_msg.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/change.h"
#include "crdt/error.h"
#include "crdt/sync.h"

_Static_assert(CAIRN_SYNC_VERSION == 2, "a new crdt/sync version is a new PEER_PROTOCOL_VERSION");

int peer_hello_check(const Cairnpb__Hello *h, const peer_self *self, char *why, size_t whylen)
{
    const char *name = h->name ? h->name : "?";
    if (h->protocol_version != PEER_PROTOCOL_VERSION) {
        snprintf(why, whylen, "peer protocol version %" PRIu32 ", this node speaks %u",
                 h->protocol_version, PEER_PROTOCOL_VERSION);
        return -1;
    }
    if (h->cluster_id != self->cluster_id) {
        snprintf(why, whylen,
                 "member %s is in cluster %016" PRIx64 ", this node in cluster %016" PRIx64, name,
                 h->cluster_id, self->cluster_id);
        return -1;
    }
    if (h->token_hash.len != 32 || memcmp(h->token_hash.data, self->token_hash, 32) != 0) {
        snprintf(why, whylen, "member %s has another --initial-cluster-token", name);
        return -1;
    }
    if (h->actor_id.len != CAIRN_ACTOR_LEN) {
        snprintf(why, whylen, "the hello's actor id is not 16 bytes");
        return -1;
    }
    return 0;
}

int peer_verdict_refuses(int rc)
{
    return rc < 0 && rc != CAIRN_EFORK && rc != CAIRN_EFORKPAST && rc != CAIRN_ELIMIT &&
           rc != CAIRN_ENOMEM;
}

void peer_msg_dispatch(const uint8_t *buf, size_t len, int hello_in, const peer_self *self,
                       const peer_handlers *h)
{
    Cairnpb__PeerMessage *m = cairnpb__peer_message__unpack(NULL, len, buf);
    if (!m) {
        h->refuse(h->arg, "a peer message that does not decode");
        return;
    }
    char why[256];
    if (!hello_in) {
        if (m->body_case != CAIRNPB__PEER_MESSAGE__BODY_HELLO)
            h->refuse(h->arg, "the first message is not a hello");
        else if (peer_hello_check(m->hello, self, why, sizeof why))
            h->refuse(h->arg, why);
        else
            h->hello(h->arg, m->hello);
    } else if (m->body_case == CAIRNPB__PEER_MESSAGE__BODY_SYNC) {
        h->sync(h->arg, m->sync->msg.data, m->sync->msg.len);
    } else if (m->body_case == CAIRNPB__PEER_MESSAGE__BODY_MEMBERS) {
        h->members(h->arg, m->members);
    } else if (m->body_case == CAIRNPB__PEER_MESSAGE__BODY_GOODBYE) {
        h->goodbye(h->arg, m->goodbye->reason ? m->goodbye->reason : "");
    } else {
        h->reset(h->arg, "an unexpected peer message");
    }
    cairnpb__peer_message__free_unpacked(m, NULL);
}

/* ---- Join ------------------------------------------------------------------
 * The checks are etcd 3.4's (ValidateClusterAndAssignIDs, measured: a new
 * member started with an --initial-cluster that disagrees with the
 * cluster's exits 1 with "error validating peerURLs <cluster>: <reason>"),
 * made here on the answering side where etcd's new member makes them
 * itself after fetching the table: as many members in the joiner's
 * --initial-cluster as in the table, and each member of the table matched
 * by its peer URLs there. Then what etcd leaves unchecked but a document
 * needs: the token (another token is another genesis: etcd 3.4 starts and
 * then fails to find its peers), and a member with the joiner's own
 * advertised URLs (etcd 3.4 panics). */

/* cairn_store_member_list_free's twin, so that this file (and its fuzz
 * target) needs no store library. */
static void members_free(cairn_member_info *m, size_t n)
{
    for (size_t i = 0; m && i < n; i++) {
        free(m[i].name);
        for (size_t j = 0; j < m[i].npeer_urls; j++)
            free(m[i].peer_urls[j]);
        free(m[i].peer_urls);
        for (size_t j = 0; j < m[i].nclient_urls; j++)
            free(m[i].client_urls[j]);
        free(m[i].client_urls);
    }
    free(m);
}

void peer_join_destroy(peer_join *j)
{
    members_free(j->members, j->nmembers);
    free(j->heads);
    memset(j, 0, sizeof *j);
}

/* Equal as sets (each list is a handful of URLs). */
static int urls_equal(char *const *a, size_t na, char *const *b, size_t nb)
{
    if (na != nb)
        return 0;
    for (size_t i = 0; i < na; i++) {
        int in_a = 0, in_b = 0;
        for (size_t j = 0; j < na; j++) {
            in_a += strcmp(a[i], a[j]) == 0;
            in_b += strcmp(a[i], b[j]) == 0;
        }
        if (in_a != in_b)
            return 0;
    }
    return 1;
}

/* Appends to |buf| (NUL-terminated, |cap| bytes); cut at the end. */
static void cat(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void cat(char *buf, size_t cap, const char *fmt, ...)
{
    size_t l = strlen(buf);
    if (l + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, cap - l, fmt, ap);
    va_end(ap);
}

static void cat_urls(char *buf, size_t cap, char *const *v, size_t k)
{
    cat(buf, cap, "[");
    for (size_t i = 0; i < k; i++)
        cat(buf, cap, "%s%s", i ? " " : "", v[i]);
    cat(buf, cap, "]");
}

/* etcd: "error validating peerURLs %s: %v", the cluster as Go prints it
 * (ids in hex without padding, as types.ID does). The dump is cut at
 * REFUSAL_DUMP bytes so that the reason after it always fits in the
 * status (gRPC's metadata limit is 8 KiB). */
#define REFUSAL_DUMP 3072
static void refusal(char *why, size_t whylen, const peer_join_self *self, const char *reason)
{
    char dump[REFUSAL_DUMP];
    dump[0] = 0;
    cat(dump, sizeof dump, "{ClusterID:%" PRIx64 " Members:[", self->cluster_id);
    for (size_t i = 0; i < self->nmembers; i++) {
        const cairn_member_info *m = &self->members[i];
        cat(dump, sizeof dump, "%s&{ID:%" PRIx64 " RaftAttributes:{PeerURLs:", i ? " " : "", m->id);
        cat_urls(dump, sizeof dump, m->peer_urls, m->npeer_urls);
        cat(dump, sizeof dump,
            " IsLearner:%s} Attributes:{Name:%s ClientURLs:", m->learner ? "true" : "false",
            m->name ? m->name : "");
        cat_urls(dump, sizeof dump, m->client_urls, m->nclient_urls);
        cat(dump, sizeof dump, "}}");
    }
    cat(dump, sizeof dump, "] RemovedMemberIDs:[]}");
    if (strlen(dump) + 1 >= sizeof dump)
        memcpy(dump + sizeof dump - 5, "...}", 5);
    snprintf(why, whylen, "error validating peerURLs %s: %s", dump, reason);
}

static int urls_ok(char *const *v, size_t k)
{
    if (k > PEER_JOIN_MAX_URLS)
        return 0;
    for (size_t i = 0; i < k; i++)
        if (!v[i] || strlen(v[i]) > PEER_JOIN_MAX_URL_LEN)
            return 0;
    return 1;
}

static int join_check(const Cairnpb__JoinRequest *rq, const peer_join_self *self, uint64_t *who,
                      char *why, size_t whylen)
{
    if (rq->protocol_version != PEER_PROTOCOL_VERSION) {
        snprintf(why, whylen, "peer protocol version %" PRIu32 ", this node speaks %u",
                 rq->protocol_version, PEER_PROTOCOL_VERSION);
        return -1;
    }
    if (rq->token_hash.len != 32 || memcmp(rq->token_hash.data, self->token_hash, 32) != 0) {
        snprintf(why, whylen,
                 "the --initial-cluster-token differs from the cluster's: a new member joins "
                 "with the token the cluster was started with");
        return -1;
    }
    if (!urls_ok(rq->peer_urls, rq->n_peer_urls) || rq->n_initial_cluster > PEER_JOIN_MAX_MEMBERS) {
        snprintf(why, whylen, "a join request out of bounds");
        return -1;
    }
    for (size_t j = 0; j < rq->n_initial_cluster; j++)
        if (!urls_ok(rq->initial_cluster[j]->peer_urls, rq->initial_cluster[j]->n_peer_urls)) {
            snprintf(why, whylen, "a join request out of bounds");
            return -1;
        }
    if (!self->nmembers) {
        snprintf(why, whylen, "this member has no member table yet (it is joining itself)");
        return -1;
    }
    char reason[2048];
    reason[0] = 0;
    if (rq->n_initial_cluster != self->nmembers)
        snprintf(reason, sizeof reason, "member count is unequal");
    for (size_t i = 0; i < self->nmembers && !reason[0]; i++) {
        const cairn_member_info *m = &self->members[i];
        int found = 0;
        for (size_t j = 0; j < rq->n_initial_cluster && !found; j++)
            found = urls_equal(m->peer_urls, m->npeer_urls, rq->initial_cluster[j]->peer_urls,
                               rq->initial_cluster[j]->n_peer_urls);
        if (!found) {
            snprintf(reason, sizeof reason,
                     "PeerURLs: no match found for existing member (%" PRIx64 ", ", m->id);
            cat_urls(reason, sizeof reason, m->peer_urls, m->npeer_urls);
            cat(reason, sizeof reason, ")");
        }
    }
    const cairn_member_info *me = NULL;
    for (size_t i = 0; i < self->nmembers && !me && !reason[0]; i++)
        if (urls_equal(self->members[i].peer_urls, self->members[i].npeer_urls, rq->peer_urls,
                       rq->n_peer_urls))
            me = &self->members[i];
    if (!reason[0] && !me) {
        snprintf(reason, sizeof reason, "no member has this member's peer URLs ");
        cat_urls(reason, sizeof reason, rq->peer_urls, rq->n_peer_urls);
        cat(reason, sizeof reason,
            " (--initial-advertise-peer-urls): add it first with etcdctl "
            "member add");
    }
    if (reason[0]) {
        refusal(why, whylen, self, reason);
        return -1;
    }
    *who = me->id;
    return 0;
}

int peer_join_answer(uint8_t **out, size_t *outlen, uint64_t *who, const uint8_t *req, size_t len,
                     const peer_join_self *self, char *why, size_t whylen)
{
    *out = NULL;
    *outlen = 0;
    *who = 0;
    if (len > PEER_JOIN_MAX_BYTES) {
        snprintf(why, whylen, "a join request of %zu bytes (at most %u)", len, PEER_JOIN_MAX_BYTES);
        return -1;
    }
    Cairnpb__JoinRequest *rq = cairnpb__join_request__unpack(NULL, len, req);
    if (!rq) {
        snprintf(why, whylen, "a join request that does not decode");
        return -1;
    }
    int rc = join_check(rq, self, who, why, whylen);
    cairnpb__join_request__free_unpacked(rq, NULL);
    if (rc)
        return rc;
    size_t nm = self->nmembers;
    Cairnpb__JoinMember *ms = calloc(nm, sizeof *ms);
    Cairnpb__JoinMember **mp = calloc(nm, sizeof *mp);
    ProtobufCBinaryData *hs = calloc(self->nheads ? self->nheads : 1, sizeof *hs);
    rc = CAIRN_ENOMEM;
    if (ms && mp && hs) {
        for (size_t i = 0; i < nm; i++) {
            cairnpb__join_member__init(&ms[i]);
            ms[i].id = self->members[i].id;
            ms[i].name = self->members[i].name ? self->members[i].name : "";
            ms[i].peer_urls = self->members[i].peer_urls;
            ms[i].n_peer_urls = self->members[i].npeer_urls;
            ms[i].learner = self->members[i].learner;
            mp[i] = &ms[i];
        }
        for (size_t i = 0; i < self->nheads; i++) {
            hs[i].data = (uint8_t *)self->heads[i].b;
            hs[i].len = CAIRN_HASH_LEN;
        }
        Cairnpb__JoinResponse r = CAIRNPB__JOIN_RESPONSE__INIT;
        r.cluster_id = self->cluster_id;
        r.member_id = *who;
        r.members = mp;
        r.n_members = nm;
        r.heads = hs;
        r.n_heads = self->nheads;
        size_t sz = cairnpb__join_response__get_packed_size(&r);
        *out = malloc(sz ? sz : 1);
        if (*out) {
            *outlen = cairnpb__join_response__pack(&r, *out);
            rc = 0;
        }
    }
    free(ms);
    free(mp);
    free(hs);
    if (rc)
        *who = 0;
    return rc;
}

static char **copy_strs(char *const *v, size_t k)
{
    char **c = calloc(k ? k : 1, sizeof *c);
    for (size_t i = 0; c && i < k; i++)
        if (!(c[i] = strdup(v[i]))) {
            for (size_t j = 0; j < i; j++)
                free(c[j]);
            free(c);
            c = NULL;
        }
    return c;
}

int peer_join_decode(peer_join *out, const uint8_t *buf, size_t len, char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    if (len > PEER_JOIN_MAX_BYTES) {
        snprintf(why, whylen, "a join answer of %zu bytes (at most %u)", len, PEER_JOIN_MAX_BYTES);
        return -1;
    }
    Cairnpb__JoinResponse *r = cairnpb__join_response__unpack(NULL, len, buf);
    if (!r) {
        snprintf(why, whylen, "a join answer that does not decode");
        return -1;
    }
    int rc = 0;
    int me = 0;
    if (r->n_members > PEER_JOIN_MAX_MEMBERS || r->n_heads > PEER_JOIN_MAX_HEADS || !r->cluster_id)
        rc = -1;
    for (size_t i = 0; i < r->n_members && !rc; i++) {
        if (!urls_ok(r->members[i]->peer_urls, r->members[i]->n_peer_urls) ||
            !r->members[i]->n_peer_urls || strlen(r->members[i]->name) > PEER_JOIN_MAX_URL_LEN)
            rc = -1;
        for (size_t j = 0; j < i && !rc; j++)
            if (r->members[j]->id == r->members[i]->id)
                rc = -1;
        me |= r->members[i]->id == r->member_id;
    }
    for (size_t i = 0; i < r->n_heads && !rc; i++)
        if (r->heads[i].len != CAIRN_HASH_LEN)
            rc = -1;
    if (!rc && !me)
        rc = -1;
    if (rc) {
        snprintf(why, whylen, "a join answer out of bounds (or not naming this member)");
        cairnpb__join_response__free_unpacked(r, NULL);
        return rc;
    }
    out->cluster_id = r->cluster_id;
    out->member_id = r->member_id;
    out->members = calloc(r->n_members ? r->n_members : 1, sizeof *out->members);
    out->heads = calloc(r->n_heads ? r->n_heads : 1, sizeof *out->heads);
    rc = out->members && out->heads ? 0 : CAIRN_ENOMEM;
    for (size_t i = 0; i < r->n_members && !rc; i++) {
        cairn_member_info *m = &out->members[i];
        out->nmembers++;
        m->id = r->members[i]->id;
        m->learner = r->members[i]->learner;
        m->name = strdup(r->members[i]->name);
        m->peer_urls = copy_strs(r->members[i]->peer_urls, r->members[i]->n_peer_urls);
        if (!m->name || !m->peer_urls)
            rc = CAIRN_ENOMEM;
        else
            m->npeer_urls = r->members[i]->n_peer_urls;
    }
    for (size_t i = 0; i < r->n_heads && !rc; i++)
        memcpy(out->heads[i].b, r->heads[i].data, CAIRN_HASH_LEN);
    if (!rc)
        out->nheads = r->n_heads;
    cairnpb__join_response__free_unpacked(r, NULL);
    if (rc)
        peer_join_destroy(out);
    return rc;
}
