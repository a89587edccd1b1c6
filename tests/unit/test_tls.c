/*
 * server/tls: Go's cipher names, the --auto-tls certificate, the checks on
 * a peer's certificate (each of etcd's refusals), and the client pump end
 * to end: an OpenSSL client on 127.0.0.1 against a pumped connection whose
 * plaintext end the test reads and writes. Certificates are made at test
 * time by tests/integration/tls_fixtures.py (the openssl CLI).
 */
#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crdt/error.h"
#include "server/tls/tls.h"

static char fx[256]; /* the fixtures' directory */

static void fixtures_setup(void)
{
    snprintf(fx, sizeof fx, "/tmp/cairn-test-tls-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(fx));
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 %s %s n1 n2 > /dev/null", CAIRN_TLS_FIXTURES, fx);
    ck_assert_int_eq(system(cmd), 0);
}

static void fixtures_teardown(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fx);
    ck_assert_int_eq(system(cmd), 0);
}

static const char *path(const char *rel)
{
    static char buf[64][512];
    static int k;
    k = (k + 1) % 64;
    snprintf(buf[k], sizeof buf[k], "%s/%s", fx, rel);
    return buf[k];
}

static char *slurp(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    static char buf[65536];
    *len = fread(buf, 1, sizeof buf - 1, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

START_TEST(cipher_names_map_to_openssl)
{
    char out[512], err[256];
    int only13;
    const char *names[] = {"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                           "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", "TLS_AES_128_GCM_SHA256"};
    ck_assert_int_eq(cairn_tls_cipher_list(out, sizeof out, &only13, names, 3, err, sizeof err), 0);
    ck_assert_str_eq(out, "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305");
    ck_assert_int_eq(only13, 0);
    ck_assert_int_eq(cairn_tls_cipher_list(out, sizeof out, &only13, names + 2, 1, err, sizeof err),
                     0);
    ck_assert_int_eq(only13, 1);
    const char *bad[] = {"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_FOO"};
    ck_assert_int_eq(cairn_tls_cipher_list(out, sizeof out, &only13, bad, 2, err, sizeof err),
                     CAIRN_EINVAL);
    /* etcd 3.4: `unexpected TLS cipher suite "TLS_FOO"` */
    ck_assert_str_eq(err, "unexpected TLS cipher suite \"TLS_FOO\"");
    /* every mapped name is one OpenSSL knows */
    SSL_CTX *ctx = SSL_CTX_new(TLS_method());
    const char *all[] = {"TLS_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
                         "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256"};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(
            cairn_tls_cipher_list(out, sizeof out, &only13, all + i, 1, err, sizeof err), 0);
        ck_assert_int_eq(SSL_CTX_set_cipher_list(ctx, out), 1);
    }
    SSL_CTX_free(ctx);
}
END_TEST

START_TEST(auto_tls_is_etcds_and_kept)
{
    char dir[300], err[256] = "";
    snprintf(dir, sizeof dir, "%s/data/fixtures/client", fx);
    const char *hosts[] = {"127.0.0.1", "localhost"};
    ck_assert_int_eq(cairn_tls_self_cert(dir, hosts, 2, err, sizeof err), 0);
    size_t len;
    char *pem = slurp(path("data/fixtures/client/cert.pem"), &len);
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    ck_assert_ptr_nonnull(x);
    char o[64];
    ck_assert_int_gt(
        X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_organizationName, o, sizeof o), 0);
    ck_assert_str_eq(o, "etcd");
    EVP_PKEY *k = X509_get0_pubkey(x);
    ck_assert_int_eq(EVP_PKEY_get_bits(k), 521);
    ck_assert_int_eq(X509_check_ip_asc(x, "127.0.0.1", 0), 1);
    ck_assert_int_eq(X509_check_host(x, "localhost", 0, 0, NULL), 1);
    ck_assert_int_eq(X509_check_purpose(x, X509_PURPOSE_SSL_SERVER, 0), 1);
    X509_free(x);
    struct stat st;
    ck_assert_int_eq(stat(path("data/fixtures/client/key.pem"), &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    char *first = strdup(pem);
    ck_assert_int_eq(cairn_tls_self_cert(dir, hosts, 2, err, sizeof err), 0);
    ck_assert_str_eq(slurp(path("data/fixtures/client/cert.pem"), &len), first);
    free(first);
}
END_TEST

static int check(const cairn_tls_checker *c, const char *cert, char *cn, char *why)
{
    size_t len = 0;
    const char *pem = cert ? slurp(path(cert), &len) : NULL;
    return cairn_tls_check_pem(c, pem, len, cn, 256, why, 256);
}

START_TEST(checker_refuses_with_etcds_reasons)
{
    cairn_tls_options o = {0};
    o.trusted_ca_file = path("ca/ca.pem");
    o.crl_file = path("ca/crl.pem");
    char err[256] = "", why[256], cn[256];
    cairn_tls_checker *c;
    ck_assert_int_eq(cairn_tls_checker_new(&c, &o, err, sizeof err), 0);
    ck_assert_int_eq(check(c, "ca/good.pem", cn, why), 0);
    ck_assert_str_eq(cn, "good");
    ck_assert_int_eq(check(c, "other-ca/other.pem", cn, why), CAIRN_EINVAL);
    ck_assert_str_eq(why, "x509: certificate signed by unknown authority");
    ck_assert_int_eq(check(c, "ca/expired.pem", cn, why), CAIRN_EINVAL);
    ck_assert_str_eq(why, "x509: certificate has expired or is not yet valid");
    ck_assert_int_eq(check(c, "ca/revoked.pem", cn, why), CAIRN_EINVAL);
    ck_assert_str_eq(why, "transport: certificate serial 1002 revoked");
    ck_assert_int_eq(check(c, NULL, cn, why), CAIRN_EINVAL);
    ck_assert_str_eq(why, "the peer presented no certificate");
    /* through an intermediate: with it, as a peer sends it; without it */
    ck_assert_int_eq(check(c, "inter-ca/chained-bundle.pem", cn, why), 0);
    ck_assert_str_eq(cn, "chained");
    ck_assert_int_eq(check(c, "inter-ca/chained.pem", cn, why), CAIRN_EINVAL);
    ck_assert_str_eq(why, "x509: certificate signed by unknown authority");
    ck_assert_int_eq(cairn_tls_check_pem(c, "junk", 4, cn, sizeof cn, why, sizeof why),
                     CAIRN_EINVAL);
    cairn_tls_checker_free(c);

    /* etcd: one or the other */
    o.allowed_cn = "n1";
    o.allowed_hostname = "127.0.0.1";
    ck_assert_int_eq(cairn_tls_checker_new(&c, &o, err, sizeof err), CAIRN_EINVAL);
    ck_assert_ptr_null(c);
    ck_assert_str_eq(err, "AllowedCN and AllowedHostname are mutually exclusive (cn=\"n1\", "
                          "hostname=\"127.0.0.1\")");
    o.allowed_hostname = NULL;
    ck_assert_int_eq(cairn_tls_checker_new(&c, &o, err, sizeof err), 0);
    ck_assert_int_eq(check(c, "ca/n1.pem", cn, why), 0);
    ck_assert_int_eq(check(c, "ca/n2.pem", cn, why), CAIRN_EINVAL);
    ck_assert_str_eq(why, "client certificate authentication failed (certificate CN \"n2\" is not "
                          "the allowed CN \"n1\")");
    cairn_tls_checker_free(c);
    o.allowed_cn = NULL;
    o.allowed_hostname = "example.com";
    ck_assert_int_eq(cairn_tls_checker_new(&c, &o, err, sizeof err), 0);
    ck_assert_int_eq(check(c, "ca/n1.pem", cn, why), CAIRN_EINVAL);
    ck_assert_str_eq(why, "client certificate authentication failed (certificate is not valid for "
                          "the allowed hostname example.com)");
    cairn_tls_checker_free(c);
    /* by SAN only: a certificate named localhost in its CN alone is not
     * valid for localhost (measured: etcd refuses it), one with the SAN is */
    o.allowed_hostname = "localhost";
    ck_assert_int_eq(cairn_tls_checker_new(&c, &o, err, sizeof err), 0);
    ck_assert_int_eq(check(c, "ca/cnonly.pem", cn, why), CAIRN_EINVAL);
    ck_assert_str_eq(cn, "localhost");
    ck_assert_int_eq(check(c, "ca/n1.pem", cn, why), 0);
    cairn_tls_checker_free(c);
    o.allowed_hostname = "127.0.0.1";
    ck_assert_int_eq(cairn_tls_checker_new(&c, &o, err, sizeof err), 0);
    ck_assert_int_eq(check(c, "ca/n1.pem", cn, why), 0);
    ck_assert_int_eq(check(c, "ca/wrongsan.pem", cn, why), CAIRN_EINVAL);
    cairn_tls_checker_free(c);
    o.allowed_hostname = NULL;

    o.trusted_ca_file = path("nope.pem");
    ck_assert_int_eq(cairn_tls_checker_new(&c, &o, err, sizeof err), CAIRN_EIO);
    ck_assert_ptr_null(c);
}
END_TEST

/* ---- the pump ---- */

typedef struct client {
    int port;
    const char *cert, *key; /* NULL: none */
    int plaintext;          /* send "ping" without TLS */
    int handshake_ok;
    char got[16];
    int hold; /* > 0: a pipe's read end; the TLS side stays open until it closes */
} client;

static void *client_main(void *arg)
{
    client *cl = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)cl->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        return NULL;
    if (cl->plaintext) {
        ssize_t w = write(fd, "GET / HTTP/1.1\r\n\r\n", 18);
        (void)w;
        ssize_t n = read(fd, cl->got, sizeof cl->got - 1);
        (void)n;
        close(fd);
        return NULL;
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(ctx, path("ca/ca.pem"), NULL);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (cl->cert) {
        SSL_CTX_use_certificate_file(ctx, cl->cert, SSL_FILETYPE_PEM);
        SSL_CTX_use_PrivateKey_file(ctx, cl->key, SSL_FILETYPE_PEM);
    }
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set1_host(ssl, "127.0.0.1");
    cl->handshake_ok = SSL_connect(ssl) == 1;
    if (cl->handshake_ok && SSL_write(ssl, "ping", 4) == 4) {
        int n = SSL_read(ssl, cl->got, sizeof cl->got - 1);
        if (n > 0)
            cl->got[n] = '\0';
    }
    char b;
    if (cl->hold > 0 && read(cl->hold, &b, 1) < 0)
        cl->got[0] = '\0';
    SSL_shutdown(ssl);
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    return NULL;
}

static int listen_any(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 8), 0);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    *port = ntohs(a.sin_port);
    return fd;
}

/* Runs |cl| against a pumped connection; returns what arrived on the
 * plaintext end (answering "pong" to "ping"). */
static void run_client(cairn_tls_pump *p, cairn_tls_server *s, client *cl, char *plain_got,
                       char *cn)
{
    int port;
    int lfd = listen_any(&port);
    cl->port = port;
    pthread_t th;
    pthread_create(&th, NULL, client_main, cl);
    int fd = accept(lfd, NULL, NULL);
    ck_assert_int_ge(fd, 0);
    int plain;
    ck_assert_int_eq(cairn_tls_pump_add(p, s, fd, &plain), 0);
    fcntl(plain, F_SETFL, fcntl(plain, F_GETFL) & ~O_NONBLOCK);
    ssize_t n = read(plain, plain_got, 15);
    plain_got[n > 0 ? n : 0] = '\0';
    cn[0] = '\0';
    if (n > 0) {
        ck_assert_int_eq(cairn_tls_pump_peer_cn(p, plain, cn, 256), 0);
        char peer[32], cn2[256];
        snprintf(peer, sizeof peer, "fd:%d", plain);
        ck_assert_int_eq(cairn_tls_pump_call_cn(p, peer, cn2, sizeof cn2), 0);
        ck_assert_str_eq(cn2, cn);
        ck_assert_int_eq(cairn_tls_pump_call_cn(p, "ipv4:127.0.0.1:1", cn2, sizeof cn2),
                         CAIRN_ENOTFOUND);
        ck_assert_int_eq(write(plain, "pong", 4), 4);
    }
    pthread_join(th, NULL);
    close(plain);
    close(lfd);
}

START_TEST(pump_carries_bytes_and_refuses)
{
    cairn_tls_options o = {0};
    o.cert_file = path("ca/server.pem");
    o.key_file = path("ca/server-key.pem");
    o.trusted_ca_file = path("ca/ca.pem");
    o.crl_file = path("ca/crl.pem");
    o.client_cert_auth = 1;
    char err[256] = "", got[16], cn[256];
    cairn_tls_server *s;
    ck_assert_int_eq(cairn_tls_server_new(&s, &o, err, sizeof err), 0);
    cairn_tls_pump *p;
    ck_assert_int_eq(cairn_tls_pump_new(&p, 16), 0);

    client good = {0, path("ca/good.pem"), path("ca/good-key.pem"), 0, 0, "", 0};
    run_client(p, s, &good, got, cn);
    ck_assert_str_eq(got, "ping");
    ck_assert_str_eq(cn, "good");
    ck_assert_str_eq(good.got, "pong");

    /* etcd: the handshake passes, then the connection closes */
    client revoked = {0, path("ca/revoked.pem"), path("ca/revoked-key.pem"), 0, 0, "", 0};
    run_client(p, s, &revoked, got, cn);
    ck_assert_str_eq(got, "");
    ck_assert_str_eq(revoked.got, "");

    client nocert = {0, NULL, NULL, 0, 0, "", 0};
    run_client(p, s, &nocert, got, cn);
    ck_assert_str_eq(got, "");
    ck_assert_str_eq(nocert.got, "");

    client other = {0, path("other-ca/other.pem"), path("other-ca/other-key.pem"), 0, 0, "", 0};
    run_client(p, s, &other, got, cn);
    ck_assert_str_eq(got, "");
    ck_assert_str_eq(other.got, "");

    client plaintext = {0, NULL, NULL, 1, 0, "", 0};
    run_client(p, s, &plaintext, got, cn);
    ck_assert_str_eq(got, "");

    cairn_tls_pump_free(p);
    cairn_tls_server_free(s);

    o.cert_file = path("nope.pem");
    ck_assert_int_eq(cairn_tls_server_new(&s, &o, err, sizeof err), CAIRN_EIO);
    ck_assert_ptr_null(s);
}
END_TEST

/* etcd: a dialing member's certificate against the address it came from */
START_TEST(peer_san_is_checked_against_the_address)
{
    static const struct {
        const char *cert, *peer;
        int rc;
        const char *why; /* the start of the reason */
    } cases[] = {
        {"ca/n1.pem", "ipv4:127.0.0.1:40000", 0, NULL},
        {"ca/n1.pem", "ipv4:10.1.2.3:40000", CAIRN_EINVAL,
         "tls: \"10.1.2.3\" does not match any of DNSNames [\"localhost\"]"},
        {"ca/nosan.pem", "ipv4:10.1.2.3:40000", 0, NULL},
        {"ca/dnssan.pem", "ipv4:127.0.0.1:40000", 0, NULL},
        {"ca/wrongsan.pem", "ipv4:127.0.0.1:40000", CAIRN_EINVAL,
         "tls: \"127.0.0.1\" does not match any of DNSNames [\"elsewhere.invalid\"]"},
        {"ca/wrongsan.pem", "ipv4:10.9.9.9:40000", 0, NULL},
        {"ca/wrongsan.pem", "ipv6:[::1]:40000", CAIRN_EINVAL, "tls: \"::1\" does not match"},
        {"ca/wrongsan.pem", "ipv6:%5B::1%5D:40000", CAIRN_EINVAL, "tls: \"::1\" does not match"},
        {"ca/wrongsan.pem", "unix:/tmp/x", 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        char *pem = slurp(path(cases[i].cert), &len);
        char why[512] = "";
        int rc = cairn_tls_check_peer_san(pem, len, cases[i].peer, why, sizeof why);
        ck_assert_msg(rc == cases[i].rc, "%s from %s: %d (%s)", cases[i].cert, cases[i].peer, rc,
                      why);
        if (cases[i].why)
            ck_assert_msg(strncmp(why, cases[i].why, strlen(cases[i].why)) == 0, "%s", why);
    }
}
END_TEST

/* A resolver that does not answer holds a SAN check (and the peer thread
 * it runs on) one second at most, with Go's words; an answer in time gives
 * the verdict it always gave. */
START_TEST(peer_san_lookups_are_bounded)
{
    size_t len;
    char *pem = slurp(path("ca/wrongsan.pem"), &len);
    char why[512] = "";
    struct timespec t0, t1;
    cairn_tls_test_slow_resolver_(3000);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = cairn_tls_check_peer_san(pem, len, "ipv4:127.0.0.1:40000", why, sizeof why);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(took >= 0.9 && took < 2.0, "the check took %.3f s", took);
    ck_assert_int_eq(rc, CAIRN_EINVAL);
    ck_assert_str_eq(why, "tls: \"127.0.0.1\" does not match any of DNSNames "
                          "[\"elsewhere.invalid\"] (lookup elsewhere.invalid: i/o timeout)");
    /* in time: the usual verdicts, a pass included */
    cairn_tls_test_slow_resolver_(100);
    pem = slurp(path("ca/dnssan.pem"), &len);
    ck_assert_int_eq(cairn_tls_check_peer_san(pem, len, "ipv4:127.0.0.1:40000", why, sizeof why),
                     0);
    cairn_tls_test_slow_resolver_(0);
}
END_TEST

/* Two clients with different certificates connected at once: each
 * connection's CN is its own, looked up from two threads at the same
 * time by fd and by gRPC's "fd:<n>" peer name, as two calls would. */
typedef struct cn_lookup {
    cairn_tls_pump *p;
    int plain[2];
    const char *want[2];
    int wrong;
} cn_lookup;

static void *lookup_main(void *arg)
{
    cn_lookup *l = arg;
    for (int i = 0; i < 2000; i++) {
        int k = i & 1;
        char cn[256] = "", peer[32];
        snprintf(peer, sizeof peer, "fd:%d", l->plain[k]);
        int rc = (i & 2) ? cairn_tls_pump_call_cn(l->p, peer, cn, sizeof cn)
                         : cairn_tls_pump_peer_cn(l->p, l->plain[k], cn, sizeof cn);
        if (rc != 0 || strcmp(cn, l->want[k]) != 0)
            l->wrong++;
    }
    return NULL;
}

START_TEST(cn_is_per_connection_with_two_clients_at_once)
{
    cairn_tls_options o = {0};
    o.cert_file = path("ca/server.pem");
    o.key_file = path("ca/server-key.pem");
    o.trusted_ca_file = path("ca/ca.pem");
    o.client_cert_auth = 1;
    char err[256] = "";
    cairn_tls_server *s;
    ck_assert_int_eq(cairn_tls_server_new(&s, &o, err, sizeof err), 0);
    cairn_tls_pump *p;
    ck_assert_int_eq(cairn_tls_pump_new(&p, 16), 0);
    int port, hold[2];
    int lfd = listen_any(&port);
    ck_assert_int_eq(pipe(hold), 0);
    client cl[2] = {
        {port, path("ca/good.pem"), path("ca/good-key.pem"), 0, 0, "", hold[0]},
        {port, path("ca/intruder.pem"), path("ca/intruder-key.pem"), 0, 0, "", hold[0]}};
    pthread_t th[2];
    cn_lookup l = {p, {-1, -1}, {"good", "intruder"}, 0};
    for (int k = 0; k < 2; k++) {
        /* one at a time, so that plain[k] is client k's */
        pthread_create(&th[k], NULL, client_main, &cl[k]);
        int fd = accept(lfd, NULL, NULL);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(cairn_tls_pump_add(p, s, fd, &l.plain[k]), 0);
        fcntl(l.plain[k], F_SETFL, fcntl(l.plain[k], F_GETFL) & ~O_NONBLOCK);
        char got[8];
        ck_assert_int_eq(read(l.plain[k], got, 4), 4);
    }
    /* both TLS sides are open (held); two threads ask at once */
    cn_lookup l2 = l;
    pthread_t q[2];
    pthread_create(&q[0], NULL, lookup_main, &l);
    pthread_create(&q[1], NULL, lookup_main, &l2);
    pthread_join(q[0], NULL);
    pthread_join(q[1], NULL);
    ck_assert_int_eq(l.wrong, 0);
    ck_assert_int_eq(l2.wrong, 0);
    for (int k = 0; k < 2; k++)
        ck_assert_int_eq(write(l.plain[k], "pong", 4), 4);
    close(hold[1]);
    for (int k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
        ck_assert_str_eq(cl[k].got, "pong");
        close(l.plain[k]);
    }
    close(hold[0]);
    close(lfd);
    cairn_tls_pump_free(p);
    cairn_tls_server_free(s);
}
END_TEST

/* gRPC names a connection "fd:<n>" and fd numbers are reused: a CN is
 * never given to a later socket that took a closed connection's number,
 * even while that connection's TLS side is still open. */
START_TEST(cn_never_goes_to_a_reused_fd)
{
    cairn_tls_options o = {0};
    o.cert_file = path("ca/server.pem");
    o.key_file = path("ca/server-key.pem");
    o.trusted_ca_file = path("ca/ca.pem");
    o.client_cert_auth = 1;
    char err[256] = "", cn[256];
    cairn_tls_server *s, *open_srv;
    ck_assert_int_eq(cairn_tls_server_new(&s, &o, err, sizeof err), 0);
    o.trusted_ca_file = NULL;
    o.client_cert_auth = 0;
    ck_assert_int_eq(cairn_tls_server_new(&open_srv, &o, err, sizeof err), 0);
    cairn_tls_pump *p;
    ck_assert_int_eq(cairn_tls_pump_new(&p, 16), 0);
    int port, hold[2];
    int lfd = listen_any(&port);
    ck_assert_int_eq(pipe(hold), 0);

    /* A: a certificate, its TLS side held open after the exchange */
    client a = {port, path("ca/good.pem"), path("ca/good-key.pem"), 0, 0, "", hold[0]};
    pthread_t th;
    pthread_create(&th, NULL, client_main, &a);
    int fd = accept(lfd, NULL, NULL), plain_a, plain_b;
    ck_assert_int_eq(cairn_tls_pump_add(p, s, fd, &plain_a), 0);
    fcntl(plain_a, F_SETFL, fcntl(plain_a, F_GETFL) & ~O_NONBLOCK);
    char got[8];
    ck_assert_int_eq(read(plain_a, got, 4), 4);
    ck_assert_int_eq(cairn_tls_pump_peer_cn(p, plain_a, cn, sizeof cn), 0);
    ck_assert_str_eq(cn, "good");
    ck_assert_int_eq(write(plain_a, "pong", 4), 4);

    /* the listener's end closes: its number names nothing, then another
     * socket (B's, no certificate: it must not inherit A's CN) */
    int n = plain_a;
    int devnull = open("/dev/null", O_RDONLY); /* while |n| is taken: not |n| */
    close(plain_a);
    ck_assert_int_eq(cairn_tls_pump_peer_cn(p, n, cn, sizeof cn), CAIRN_ENOTFOUND);
    /* |n| kept for B's listener end: B's accept must not take it */
    ck_assert_int_ne(devnull, n);
    ck_assert_int_eq(dup2(devnull, n), n);
    close(devnull);
    client b = {port, NULL, NULL, 0, 0, "", 0};
    pthread_t th2;
    pthread_create(&th2, NULL, client_main, &b);
    fd = accept(lfd, NULL, NULL);
    ck_assert_int_eq(cairn_tls_pump_add(p, open_srv, fd, &plain_b), 0);
    fcntl(plain_b, F_SETFL, fcntl(plain_b, F_GETFL) & ~O_NONBLOCK);
    ck_assert_int_eq(read(plain_b, got, 4), 4);
    ck_assert_int_ne(plain_b, n);
    ck_assert_int_eq(dup2(plain_b, n), n);
    close(plain_b);
    char peer[32];
    snprintf(peer, sizeof peer, "fd:%d", n);
    ck_assert_int_eq(cairn_tls_pump_peer_cn(p, n, cn, sizeof cn), CAIRN_ENOTFOUND);
    ck_assert_int_eq(cairn_tls_pump_call_cn(p, peer, cn, sizeof cn), CAIRN_ENOTFOUND);
    ck_assert_int_eq(write(n, "pong", 4), 4);
    pthread_join(th2, NULL);
    close(n);
    close(hold[1]);
    pthread_join(th, NULL);
    ck_assert_str_eq(a.got, "pong");
    close(hold[0]);
    close(lfd);
    cairn_tls_pump_free(p);
    cairn_tls_server_free(open_srv);
    cairn_tls_server_free(s);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("tls");
    TCase *tc = tcase_create("tls");
    tcase_add_checked_fixture(tc, fixtures_setup, fixtures_teardown);
    tcase_set_timeout(tc, 300); /* each test makes its fixtures with openssl: slow when loaded */
    tcase_add_test(tc, cipher_names_map_to_openssl);
    tcase_add_test(tc, auto_tls_is_etcds_and_kept);
    tcase_add_test(tc, checker_refuses_with_etcds_reasons);
    tcase_add_test(tc, pump_carries_bytes_and_refuses);
    tcase_add_test(tc, cn_never_goes_to_a_reused_fd);
    tcase_add_test(tc, cn_is_per_connection_with_two_clients_at_once);
    tcase_add_test(tc, peer_san_is_checked_against_the_address);
    tcase_add_test(tc, peer_san_lookups_are_bounded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* the refused clients write to closed sockets */
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
