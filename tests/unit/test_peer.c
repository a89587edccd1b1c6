/*
 * server/peer: two cairn servers in this process on 127.0.0.1 peer ports,
 * one cluster. A put on one reaches the other, and peer_net_stats counts
 * what went over the stream on both ends (a connect each, messages and
 * bytes both ways, a push or a sync round); a member that stops leaves a
 * stream that is no longer connected, and its counters stay readable.
 * The log lines of a clean departure (Goodbye) are checked with real
 * processes in tests/integration/test_cluster_compaction.py.
 */
#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../store/store_test.h"
#include "server/node.h"
#include "server/peer/peer.h"
#include "server/peer/peer_msg.h"
#include "server/server.h"

/* A peer port no other test takes meanwhile: below the kernel's ephemeral
 * range (where a client connection of a test beside this one could be given
 * it) and reserved by an flock under /tmp/cairn-test-ports for this
 * process's lifetime. The convention of tests/integration/ports.py, so the C
 * and Python tests running side by side share it. */
static int free_port(void)
{
    mkdir("/tmp/cairn-test-ports", 01777);
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    for (int attempt = 0; attempt < 1000; attempt++) {
        int port = 10000 + (int)(rand_r(&seed) % 22768u); /* [10000, 32768) */
        char path[64];
        snprintf(path, sizeof path, "/tmp/cairn-test-ports/%d", port);
        int lock = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0666);
        if (lock < 0)
            continue;
        if (flock(lock, LOCK_EX | LOCK_NB) != 0) {
            close(lock);
            continue;
        }
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        ck_assert_int_ge(fd, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)port);
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return port; /* |lock| stays open: the reservation */
        close(lock);
    }
    ck_abort_msg("no free port on 127.0.0.1 in [10000, 32768)");
    return -1;
}

typedef struct member {
    char name[8], dir[128], peer[64], cluster[160];
    cairn_config cfg;
    cairn_server *srv;
} member;

static void member_start(member *m, const char *name, const char *dir, const char *peer,
                         const char *cluster)
{
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    snprintf(m->peer, sizeof m->peer, "%s", peer);
    snprintf(m->cluster, sizeof m->cluster, "%s", cluster);
    char *argv[] = {"cairn",
                    "--name",
                    m->name,
                    "--data-dir",
                    m->dir,
                    "--listen-client-urls",
                    "http://127.0.0.1:0",
                    "--advertise-client-urls",
                    "http://127.0.0.1:0",
                    "--listen-peer-urls",
                    m->peer,
                    "--initial-advertise-peer-urls",
                    m->peer,
                    "--initial-cluster",
                    m->cluster,
                    "--initial-cluster-token",
                    "peer-unit",
                    "--sync-interval-ms",
                    "50"};
    char err[256] = "";
    ck_assert_int_eq(
        cairn_config_parse(&m->cfg, (int)(sizeof argv / sizeof *argv), argv, err, sizeof err), 0);
    int rc = cairn_server_new(&m->srv, &m->cfg, err, sizeof err);
    ck_assert_msg(rc == 0, "server %s: %s", name, err);
    ck_assert_int_eq(cairn_server_start(m->srv), 0);
}

static void member_stop(member *m)
{
    cairn_server_stop(m->srv, 1000);
    cairn_server_free(m->srv);
    cairn_config_destroy(&m->cfg);
    m->srv = NULL;
}

static int has_key(cairn_store *s, const char *k)
{
    cairn_range_req r;
    memset(&r, 0, sizeof r);
    r.key = (const uint8_t *)k;
    r.key_len = strlen(k);
    cairn_range_resp resp;
    ck_assert_int_eq(cairn_store_range(s, &resp, &r), 0);
    int n = (int)resp.nkvs;
    cairn_range_resp_destroy(&resp);
    return n;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000L};
    nanosleep(&ts, NULL);
}

static peer_stats stats_of(member *m)
{
    peer_stats st[2];
    ck_assert_uint_eq(peer_net_stats(m->srv->peer, NULL, 0), 1); /* sizing call */
    ck_assert_uint_eq(peer_net_stats(m->srv->peer, st, 2), 1);
    return st[0];
}

/* Which verdicts on a received change refuse the peer that sent it: those
 * that judge the change, not a fork's other side (an honest peer may relay
 * it) nor this node's own limits (a full pending buffer: a third peer's
 * made-up dependencies can fill it, and an honest sender must not then be
 * refused and held off for it). */
START_TEST(verdicts_refuse_only_the_changes_fault)
{
    ck_assert_int_eq(peer_verdict_refuses(0), 0);
    ck_assert_int_eq(peer_verdict_refuses(CAIRN_ESEQGAP), 1);
    ck_assert_int_eq(peer_verdict_refuses(CAIRN_ENOTPAST), 1);
    ck_assert_int_eq(peer_verdict_refuses(CAIRN_EPASTREFUSED), 1);
    ck_assert_int_eq(peer_verdict_refuses(CAIRN_EFORK), 0);
    ck_assert_int_eq(peer_verdict_refuses(CAIRN_EFORKPAST), 0);
    ck_assert_int_eq(peer_verdict_refuses(CAIRN_ELIMIT), 0);
    ck_assert_int_eq(peer_verdict_refuses(CAIRN_ENOMEM), 0);
}
END_TEST

START_TEST(stats_count_both_ends)
{
    char *root = make_tmpdir();
    char da[160], db[160], pa[64], pb[64], cluster[160];
    snprintf(da, sizeof da, "%s/a", root);
    snprintf(db, sizeof db, "%s/b", root);
    snprintf(pa, sizeof pa, "http://127.0.0.1:%d", free_port());
    snprintf(pb, sizeof pb, "http://127.0.0.1:%d", free_port());
    snprintf(cluster, sizeof cluster, "a=%s,b=%s", pa, pb);
    member a, b;
    member_start(&a, "a", da, pa, cluster);
    member_start(&b, "b", db, pb, cluster);

    peer_stats sa = stats_of(&a);
    ck_assert_str_eq(sa.name, "b");
    ck_assert_uint_ne(sa.id, 0);
    for (int i = 0; i < 500 && !(stats_of(&a).connected && stats_of(&b).connected); i++)
        sleep_ms(10);
    ck_assert_int_eq(stats_of(&a).connected, 1);
    /* both may have dialed: let the duplicate rule settle on one stream (a
     * replaced stream drops its queue, and the put would go by sync) */
    for (uint64_t was = 0; was != stats_of(&a).connects + stats_of(&b).connects;) {
        was = stats_of(&a).connects + stats_of(&b).connects;
        sleep_ms(300);
    }

    put_kv(a.srv->store, "k", "v");
    for (int i = 0; i < 500 && !has_key(b.srv->store, "k"); i++)
        sleep_ms(10);
    ck_assert_int_eq(has_key(b.srv->store, "k"), 1);
    sleep_ms(200); /* a few sync rounds after the push */

    sa = stats_of(&a);
    peer_stats sb = stats_of(&b);
    ck_assert_str_eq(sb.name, "a");
    /* 1, or 2 when both dialed at once and the duplicate rule replaced one */
    ck_assert_uint_ge(sa.connects, 1);
    ck_assert_uint_ge(sb.connects, 1);
    /* the put went out as a push, or in a sync message that came first
     * (then the push finds the peer has it already): not always a push */
    ck_assert_uint_ge(sa.pushes + sa.sync_rounds, 1);
    ck_assert_uint_ge(sb.sync_rounds, 1); /* at least b's first one */
    ck_assert_uint_eq(sa.pushes_dropped, 0);
    /* hello + push at least from a; every message a sent b received */
    ck_assert_uint_ge(sa.msgs_sent, 2);
    ck_assert_uint_ge(sb.msgs_received, 2);
    ck_assert_uint_gt(sa.bytes_sent, 0);
    ck_assert_uint_gt(sb.bytes_received, 0);
    ck_assert_uint_ge(sb.msgs_sent, 1);
    ck_assert_uint_gt(sa.bytes_received, 0);

    member_stop(&b);
    for (int i = 0; i < 300 && stats_of(&a).connected; i++)
        sleep_ms(10);
    peer_stats after = stats_of(&a);
    ck_assert_int_eq(after.connected, 0);
    ck_assert_uint_ge(after.msgs_sent, sa.msgs_sent); /* counters only grow */
    /* b's goodbye was a message a received */
    ck_assert_uint_gt(after.msgs_received, sa.msgs_received);
    member_stop(&a);
    rm_rf(root);
    free(root);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("peer");
    TCase *tv = tcase_create("verdicts");
    tcase_add_test(tv, verdicts_refuse_only_the_changes_fault);
    suite_add_tcase(s, tv);
    TCase *tc = tcase_create("stats");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, stats_count_both_ends);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
