/*
 * server/: etcd-style flag parsing (both value forms, defaults that depend
 * on other flags, every rejection path), URL to gRPC address conversion,
 * the crc32c that HashKV uses, and the gRPC engine with a service of the
 * test's own (registration, the handler's argument, per-call contexts,
 * grpc-go's unknown-method texts, the stopping hook) through gRPC core's
 * client API on 127.0.0.1. etcd's RPCs are tested end to end against real
 * processes in tests/integration/.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "crdt/error.h"
#include "server/etcd/etcd.h"
#include "server/rpc/client.h"
#include "server/server.h"

static int parse(cairn_config *cfg, char *err, size_t errlen, const char **args)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"cairn";
    for (; *args; args++)
        argv[argc++] = (char *)*args;
    /* No ETCD_* variable of the test's environment may change a verdict. */
    char *env[] = {NULL};
    return cairn_config_parse_env(cfg, argc, argv, env, err, errlen);
}

START_TEST(defaults_are_etcds)
{
    cairn_config cfg;
    char err[256];
    const char *args[] = {NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, args), CAIRN_CONFIG_RUN);
    ck_assert_str_eq(cfg.name, "default");
    ck_assert_str_eq(cfg.data_dir, "default.cairn");
    ck_assert_uint_eq(cfg.nlisten_client_urls, 1);
    ck_assert_str_eq(cfg.listen_client_urls[0], "http://127.0.0.1:2379");
    ck_assert_str_eq(cfg.advertise_client_urls[0], "http://localhost:2379");
    ck_assert_str_eq(cfg.listen_peer_urls[0], "http://127.0.0.1:2380");
    ck_assert_str_eq(cfg.initial_advertise_peer_urls[0], "http://localhost:2380");
    ck_assert_str_eq(cfg.initial_cluster_token, "etcd-cluster");
    ck_assert_str_eq(cfg.initial_cluster_state, "new");
    ck_assert_uint_eq(cfg.max_request_bytes, 1572864);
    ck_assert_uint_eq(cfg.max_txn_ops, 128);
    ck_assert_int_eq(cfg.quota_backend_bytes, 0);
    ck_assert_uint_eq(cfg.ninitial_cluster, 1);
    ck_assert_str_eq(cfg.initial_cluster[0].name, "default");
    ck_assert_str_eq(cfg.initial_cluster[0].peer_urls[0], "http://localhost:2380");
    cairn_config_destroy(&cfg);
}
END_TEST

START_TEST(both_value_forms_and_single_dash)
{
    cairn_config cfg;
    char err[256];
    const char *args[] = {"--name=n1",
                          "-data-dir",
                          "/tmp/x",
                          "--max-txn-ops",
                          "7",
                          "-max-request-bytes=100",
                          "--listen-client-urls",
                          "http://127.0.0.1:1,http://127.0.0.1:2/",
                          "--log-level=debug",
                          NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, args), CAIRN_CONFIG_RUN);
    ck_assert_str_eq(cfg.name, "n1");
    ck_assert_str_eq(cfg.data_dir, "/tmp/x");
    ck_assert_uint_eq(cfg.max_txn_ops, 7);
    ck_assert_uint_eq(cfg.max_request_bytes, 100);
    ck_assert_uint_eq(cfg.nlisten_client_urls, 2);
    ck_assert_str_eq(cfg.listen_client_urls[1], "http://127.0.0.1:2/");
    ck_assert_int_eq(cfg.log_level, CAIRN_LOG_DEBUG);
    cairn_config_destroy(&cfg);
}
END_TEST

START_TEST(data_dir_and_cluster_follow_name)
{
    cairn_config cfg;
    char err[256];
    const char *args[] = {"--name", "edge1", "--initial-advertise-peer-urls",
                          "http://127.0.0.1:9,http://127.0.0.1:8", NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, args), CAIRN_CONFIG_RUN);
    ck_assert_str_eq(cfg.data_dir, "edge1.cairn");
    ck_assert_uint_eq(cfg.ninitial_cluster, 1);
    ck_assert_str_eq(cfg.initial_cluster[0].name, "edge1");
    ck_assert_uint_eq(cfg.initial_cluster[0].npeer_urls, 2);
    ck_assert_str_eq(cfg.initial_cluster[0].peer_urls[1], "http://127.0.0.1:8");
    cairn_config_destroy(&cfg);
}
END_TEST

START_TEST(initial_cluster_merges_names)
{
    cairn_config cfg;
    char err[256];
    const char *args[] = {"--name",
                          "b",
                          "--initial-cluster",
                          "a=http://127.0.0.1:1,b=http://127.0.0.1:2,a=http://127.0.0.1:3",
                          "--initial-cluster",
                          "a=http://127.0.0.1:1,b=http://127.0.0.1:2",
                          NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, args), CAIRN_CONFIG_RUN);
    ck_assert_uint_eq(cfg.ninitial_cluster, 2); /* the last flag wins */
    ck_assert_str_eq(cfg.initial_cluster[0].name, "a");
    ck_assert_uint_eq(cfg.initial_cluster[0].npeer_urls, 1);
    cairn_config_destroy(&cfg);

    const char *args2[] = {
        "--initial-cluster",
        "default=http://127.0.0.1:1,x=http://127.0.0.1:2,default=http://127.0.0.1:3", NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, args2), CAIRN_CONFIG_RUN);
    ck_assert_uint_eq(cfg.ninitial_cluster, 2);
    ck_assert_uint_eq(cfg.initial_cluster[0].npeer_urls, 2);
    ck_assert_str_eq(cfg.initial_cluster[0].peer_urls[1], "http://127.0.0.1:3");
    cairn_config_destroy(&cfg);
}
END_TEST

static void expect_error(const char **args, const char *needle)
{
    cairn_config cfg;
    char err[256];
    ck_assert_int_eq(parse(&cfg, err, sizeof err, args), CAIRN_EINVAL);
    ck_assert_msg(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
    cairn_config_destroy(&cfg);
}

START_TEST(rejections)
{
    const char *a1[] = {"--bogus", "1", NULL};
    expect_error(a1, "bogus");
    const char *a2[] = {"--max-request-bytes", "abc", NULL};
    expect_error(a2, "max-request-bytes");
    const char *a3[] = {"--max-request-bytes=-1", NULL};
    expect_error(a3, "max-request-bytes");
    const char *a4[] = {"--max-txn-ops=0", NULL};
    expect_error(a4, "max-txn-ops");
    const char *a5[] = {"--listen-client-urls", "ftp://127.0.0.1:1", NULL};
    expect_error(a5, "listen-client-urls");
    const char *a6[] = {"--listen-client-urls", "http://127.0.0.1", NULL};
    expect_error(a6, "listen-client-urls");
    const char *a7[] = {"--listen-client-urls", "http://a:1,,http://b:2", NULL};
    expect_error(a7, "listen-client-urls");
    const char *a8[] = {"--initial-cluster", "nourl", NULL};
    expect_error(a8, "initial-cluster");
    const char *a9[] = {"--initial-cluster", "other=http://127.0.0.1:1", NULL};
    expect_error(a9, "couldn't find local name");
    const char *a10[] = {"--initial-cluster-state", "maybe", NULL};
    expect_error(a10, "initial-cluster-state");
    const char *a11[] = {"--log-level", "loud", NULL};
    expect_error(a11, "log-level");
    const char *a12[] = {"--name", NULL};
    expect_error(a12, "needs an argument");
    const char *a13[] = {"stray", NULL};
    expect_error(a13, "stray");
    const char *a14[] = {"--quota-backend-bytes=-5", NULL};
    expect_error(a14, "quota-backend-bytes");
    const char *a15[] = {"--sync-interval-ms=0", NULL};
    expect_error(a15, "sync-interval-ms");
    const char *a16[] = {"--experimental-peer-dial", "n2", NULL};
    expect_error(a16, "NAME=HOST:PORT");
    const char *a17[] = {"--experimental-peer-dial", "n2=127.0.0.1:", NULL};
    expect_error(a17, "NAME=HOST:PORT");
    const char *a18[] = {"--listen-peer-urls", "ftp://127.0.0.1:1", NULL};
    expect_error(a18, "expected http://host:port, https://host:port");
}
END_TEST

START_TEST(peer_flags)
{
    cairn_config cfg;
    char err[256];
    const char *none[] = {NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, none), CAIRN_CONFIG_RUN);
    ck_assert_uint_eq(cfg.sync_interval_ms, 100);
    ck_assert_uint_eq(cfg.npeer_dials, 0);
    cairn_config_destroy(&cfg);
    const char *args[] = {"--sync-interval-ms",
                          "25",
                          "--experimental-peer-dial",
                          "n2=127.0.0.1:7001",
                          "--experimental-peer-dial=n3=[::1]:7002",
                          NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, args), CAIRN_CONFIG_RUN);
    ck_assert_uint_eq(cfg.sync_interval_ms, 25);
    ck_assert_uint_eq(cfg.npeer_dials, 2);
    ck_assert_str_eq(cfg.peer_dials[0].name, "n2");
    ck_assert_str_eq(cfg.peer_dials[0].addr, "127.0.0.1:7001");
    ck_assert_str_eq(cfg.peer_dials[1].name, "n3");
    ck_assert_str_eq(cfg.peer_dials[1].addr, "[::1]:7002");
    ck_assert_ptr_null(cfg.peer_links); /* full mesh */
    cairn_config_destroy(&cfg);
    const char *links[] = {"--name", "b", "--initial-cluster",
                           "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3",
                           "--peer-links", "a,c", NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, links), CAIRN_CONFIG_RUN);
    ck_assert_uint_eq(cfg.npeer_links, 2);
    ck_assert_str_eq(cfg.peer_links[0], "a");
    ck_assert_str_eq(cfg.peer_links[1], "c");
    cairn_config_destroy(&cfg);
}
END_TEST

START_TEST(peer_links_rejections)
{
    const char *a1[] = {"--name", "a", "--initial-cluster",
                        "a=http://127.0.0.1:1,b=http://127.0.0.1:2", "--peer-links", "z", NULL};
    expect_error(a1, "not another member");
    const char *a2[] = {"--name", "a", "--initial-cluster",
                        "a=http://127.0.0.1:1,b=http://127.0.0.1:2", "--peer-links", "a", NULL};
    expect_error(a2, "not another member");
    const char *a3[] = {"--name", "a", "--initial-cluster",
                        "a=http://127.0.0.1:1,b=http://127.0.0.1:2", "--peer-links", "b,,b",
                        NULL};
    expect_error(a3, "peer-links");
}
END_TEST

START_TEST(help_version_and_ignored)
{
    cairn_config cfg;
    char err[256];
    const char *h[] = {"--help", NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, h), CAIRN_CONFIG_HELP);
    cairn_config_destroy(&cfg);
    const char *v[] = {"-version", NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, v), CAIRN_CONFIG_VERSION);
    cairn_config_destroy(&cfg);
    const char *ig[] = {"--logger", "zap", "--heartbeat-interval=100", NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, ig), CAIRN_CONFIG_RUN);
    cairn_config_destroy(&cfg);
}
END_TEST

/* The TLS flags fill cfg->client_tls / peer_tls (form only; the files are
 * server/tls's at start); an unknown cipher name is refused here. */
START_TEST(tls_flags_fill_the_tls_config)
{
    cairn_config cfg;
    char err[256];
    const char *args[] = {"--cert-file=c.pem",
                          "--key-file",
                          "k.pem",
                          "--trusted-ca-file=ca.pem",
                          "--client-cert-auth",
                          "--client-crl-file=crl.pem",
                          "--client-cert-allowed-hostname",
                          "h",
                          "--auto-tls=false",
                          "--peer-cert-file",
                          "pc.pem",
                          "--peer-key-file=pk.pem",
                          "--peer-trusted-ca-file=pca.pem",
                          "--peer-client-cert-auth=true",
                          "--peer-crl-file=pcrl.pem",
                          "--peer-cert-allowed-cn=n1",
                          "--peer-cert-allowed-hostname=ph",
                          "--peer-auto-tls",
                          "--experimental-peer-skip-client-san-verification",
                          "--cipher-suites",
                          "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256",
                          NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, args), CAIRN_CONFIG_RUN);
    ck_assert_str_eq(cfg.client_tls.cert_file, "c.pem");
    ck_assert_str_eq(cfg.client_tls.key_file, "k.pem");
    ck_assert_str_eq(cfg.client_tls.trusted_ca_file, "ca.pem");
    ck_assert_str_eq(cfg.client_tls.crl_file, "crl.pem");
    ck_assert_str_eq(cfg.client_tls.allowed_hostname, "h");
    ck_assert_int_eq(cfg.client_tls.client_cert_auth, 1);
    ck_assert_int_eq(cfg.client_tls.auto_tls, 0);
    ck_assert_ptr_null(cfg.client_tls.allowed_cn);
    ck_assert_str_eq(cfg.peer_tls.cert_file, "pc.pem");
    ck_assert_str_eq(cfg.peer_tls.key_file, "pk.pem");
    ck_assert_str_eq(cfg.peer_tls.trusted_ca_file, "pca.pem");
    ck_assert_str_eq(cfg.peer_tls.crl_file, "pcrl.pem");
    ck_assert_str_eq(cfg.peer_tls.allowed_cn, "n1");
    ck_assert_str_eq(cfg.peer_tls.allowed_hostname, "ph");
    ck_assert_int_eq(cfg.peer_tls.client_cert_auth, 1);
    ck_assert_int_eq(cfg.peer_tls.auto_tls, 1);
    ck_assert_int_eq(cfg.peer_tls.skip_client_san_verification, 1);
    ck_assert_uint_eq(cfg.ncipher_suites, 2);
    ck_assert_str_eq(cfg.cipher_suites[1], "TLS_AES_128_GCM_SHA256");
    cairn_config_destroy(&cfg);

    /* etcd's defaults given explicitly change nothing, so they start. */
    const char *dflt[] = {"--cert-file=",         "--auto-tls=false", "--peer-auto-tls=0",
                          "--client-cert-auth=F", "--cipher-suites=", NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, dflt), CAIRN_CONFIG_RUN);
    ck_assert_ptr_null(cfg.client_tls.cert_file);
    cairn_config_destroy(&cfg);

    const char *bad1[] = {"--auto-tls=maybe", NULL};
    expect_error(bad1, "invalid boolean value \"maybe\" for flag --auto-tls");
    const char *bad2[] = {"--cipher-suites", "TLS_X,,TLS_Y", NULL};
    expect_error(bad2, "cipher-suites");
    const char *bad3[] = {"--cipher-suites", "tls_lower", NULL};
    expect_error(bad3, "cipher-suites");
    const char *bad4[] = {"--cipher-suites", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_FOO", NULL};
    /* etcd 3.4: `unexpected TLS cipher suite "TLS_FOO"` */
    expect_error(bad4, "unexpected TLS cipher suite \"TLS_FOO\"");
    const char *ok[] = {"--listen-client-urls", "https://127.0.0.1:1", "--listen-peer-urls",
                        "https://127.0.0.1:2", NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, ok), CAIRN_CONFIG_RUN);
    cairn_config_destroy(&cfg);
    const char *ciphers[] = {"--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", NULL};
    ck_assert_int_eq(parse(&cfg, err, sizeof err, ciphers), CAIRN_CONFIG_RUN);
    ck_assert_uint_eq(cfg.ncipher_suites, 1);
    cairn_config_destroy(&cfg);
}
END_TEST

static int parse_env(cairn_config *cfg, char *err, size_t errlen, const char **args,
                     const char **env)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"cairn";
    for (; *args; args++)
        argv[argc++] = (char *)*args;
    return cairn_config_parse_env(cfg, argc, argv, (char **)env, err, errlen);
}

static int has_note(const cairn_config *cfg, const char *needle)
{
    for (size_t i = 0; i < cfg->nnotes; i++)
        if (strstr(cfg->notes[i].text, needle))
            return 1;
    return 0;
}

/* Go's flag package as etcd uses it: a bare boolean, "--" and the first
 * non-flag end the flags, values are checked by type even for flags cairn
 * ignores, and an ignored flag leaves a note for the log. */
START_TEST(go_flag_syntax)
{
    cairn_config cfg;
    char err[256];
    const char *env[] = {NULL};
    const char *a1[] = {
        "--pre-vote", "--debug", "--snapshot-count", "0x10", "--grpc-keepalive-min-time=1m30.5s",
        NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, a1, env), CAIRN_CONFIG_RUN);
    ck_assert_int_eq(cfg.log_level, CAIRN_LOG_DEBUG);
    ck_assert(has_note(&cfg, "flag --pre-vote=true does not apply to cairn"));
    ck_assert(has_note(&cfg, "flag --snapshot-count=0x10 does not apply"));
    cairn_config_destroy(&cfg);
    const char *a2[] = {"--pre-vote", "false", NULL};
    expect_error(a2, "'false' is not a valid flag");
    const char *a3[] = {"--", "--name", "x", NULL};
    expect_error(a3, "'--name' is not a valid flag");
    const char *a4[] = {"---name", "x", NULL};
    expect_error(a4, "bad flag syntax: ---name");
    const char *a5[] = {"--snapshot-count=", NULL};
    expect_error(a5, "invalid value \"\" for flag --snapshot-count");
    const char *a6[] = {"--pre-vote=", NULL};
    expect_error(a6, "invalid boolean value \"\"");
    const char *a7[] = {"--election-timeout=-1", NULL};
    expect_error(a7, "election-timeout");
    const char *a8[] = {"--grpc-keepalive-min-time=5", NULL};
    expect_error(a8, "grpc-keepalive-min-time");
    const char *a9[] = {"--enable-v2", NULL};
    expect_error(a9, "cairn serves only etcd's v3 API");
    const char *a10[] = {"--proxy=readonly", NULL};
    expect_error(a10, "cairn is not a v2 proxy");
    const char *a11[] = {"--discovery", "http://d", NULL};
    expect_error(a11, "discovery is not implemented");
    const char *a12[] = {"--name=", NULL};
    expect_error(a12, "couldn't find local name \"\"");
    const char *ok[] = {"--enable-v2=false", "--proxy", "off", "--discovery=", NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, ok, env), CAIRN_CONFIG_RUN);
    cairn_config_destroy(&cfg);
}
END_TEST

/* etcd 3.4's pkg/flags: ETCD_<FLAG> fills a flag not given; beside its
 * flag it is an error; an unknown ETCD_ variable is a warning. */
START_TEST(environment_variables)
{
    cairn_config cfg;
    char err[256];
    const char *none[] = {NULL};
    const char *env[] = {"ETCD_NAME=e1",
                         "ETCD_MAX_TXN_OPS=9",
                         "ETCD_LISTEN_CLIENT_URLS=unix://s:1",
                         "ETCD_AUTO_TLS=false",
                         "ETCD_BOGUS=1",
                         "PATH=/bin",
                         NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, none, env), CAIRN_CONFIG_RUN);
    ck_assert_str_eq(cfg.name, "e1");
    ck_assert_str_eq(cfg.data_dir, "e1.cairn");
    ck_assert_uint_eq(cfg.max_txn_ops, 9);
    ck_assert_str_eq(cfg.listen_client_urls[0], "unix://s:1");
    ck_assert(has_note(&cfg, "recognized and used environment variable ETCD_NAME=e1"));
    ck_assert(has_note(&cfg, "unrecognized environment variable ETCD_BOGUS=1"));
    ck_assert(!has_note(&cfg, "PATH"));
    cairn_config_destroy(&cfg);

    const char *flag[] = {"--name", "f1", NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, flag, env), CAIRN_EINVAL);
    ck_assert_msg(strstr(err, "conflicting environment variable \"ETCD_NAME\" is shadowed") != NULL,
                  "%s", err);
    cairn_config_destroy(&cfg);

    const char *bad[] = {"ETCD_MAX_TXN_OPS=x", NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, none, bad), CAIRN_EINVAL);
    ck_assert_msg(strstr(err, "max-txn-ops") != NULL, "%s", err);
    cairn_config_destroy(&cfg);
}
END_TEST

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/cairn-test-config-XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

/* --config-file: etcd's YAML keys (TLS in two maps, lists as sequences,
 * empty = default, unknown keys skipped); flags and ETCD_ variables beside
 * it are ignored, though a flag must still parse. */
START_TEST(config_file)
{
    cairn_config cfg;
    char err[512];
    char *path = write_tmp("name: 'y1'\n"
                           "data-dir:\n"
                           "snapshot-count: 10000\n"
                           "max-txn-ops: 64\n"
                           "listen-client-urls: http://127.0.0.1:1,http://127.0.0.1:2\n"
                           "log-outputs: [stderr]\n"
                           "grpc-keepalive-timeout: 20000000000\n"
                           "strict-reconfig-check: false\n"
                           "client-transport-security:\n"
                           "  cert-file: c.pem\n"
                           "  client-cert-auth: true\n"
                           "peer-transport-security:\n"
                           "  auto-tls: true\n"
                           "  trusted-ca-file:\n"
                           "cipher-suites: [\n  TLS_A,\n  TLS_B\n]\n"
                           "tls-min-version: 'TLS1.2'\n");
    char flagv[128];
    snprintf(flagv, sizeof flagv, "--config-file=%s", path);
    const char *args[] = {flagv, "--name", "ignored", NULL};
    const char *env[] = {"ETCD_MAX_TXN_OPS=5", NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, args, env), CAIRN_EINVAL);
    /* the file's names are not Go's: etcd's message */
    ck_assert_msg(strstr(err, "unexpected TLS cipher suite \"TLS_A\"") != NULL, "%s", err);
    ck_assert_str_eq(cfg.name, "y1");
    ck_assert_str_eq(cfg.data_dir, "y1.cairn");
    ck_assert_uint_eq(cfg.max_txn_ops, 64);
    ck_assert_uint_eq(cfg.nlisten_client_urls, 2);
    ck_assert_str_eq(cfg.client_tls.cert_file, "c.pem");
    ck_assert_int_eq(cfg.client_tls.client_cert_auth, 1);
    ck_assert_int_eq(cfg.peer_tls.auto_tls, 1);
    ck_assert_ptr_null(cfg.peer_tls.trusted_ca_file);
    ck_assert_uint_eq(cfg.ncipher_suites, 2);
    ck_assert_str_eq(cfg.cipher_suites[1], "TLS_B");
    ck_assert(has_note(&cfg, "snapshot-count"));
    cairn_config_destroy(&cfg);
    unlink(path);

    path = write_tmp("name: z\nmax-txn-ops: lots\n");
    snprintf(flagv, sizeof flagv, "--config-file=%s", path);
    const char *none[] = {NULL};
    const char *a2[] = {flagv, NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, a2, none), CAIRN_EINVAL);
    ck_assert_msg(strstr(err, path) && strstr(err, "max-txn-ops"), "%s", err);
    cairn_config_destroy(&cfg);
    /* The flags beside the file still have to parse. */
    const char *a3[] = {flagv, "--max-txn-ops=x", NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, a3, none), CAIRN_EINVAL);
    ck_assert_msg(strstr(err, "--max-txn-ops") && !strstr(err, path), "%s", err);
    cairn_config_destroy(&cfg);
    unlink(path);

    path = write_tmp("name: [unclosed\n");
    char envv[128];
    snprintf(envv, sizeof envv, "ETCD_CONFIG_FILE=%s", path);
    const char *env2[] = {envv, NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, none, env2), CAIRN_EINVAL);
    ck_assert_msg(strstr(err, path) != NULL, "%s", err);
    cairn_config_destroy(&cfg);
    unlink(path);

    path = write_tmp("- a\n- b\n");
    snprintf(flagv, sizeof flagv, "--config-file=%s", path);
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, a2, none), CAIRN_EINVAL);
    ck_assert_msg(strstr(err, "expected a mapping") != NULL, "%s", err);
    cairn_config_destroy(&cfg);
    unlink(path);

    const char *a4[] = {"--config-file=/nonexistent/x.yml", NULL};
    ck_assert_int_eq(parse_env(&cfg, err, sizeof err, a4, none), CAIRN_EINVAL);
    ck_assert_msg(strstr(err, "/nonexistent/x.yml") != NULL, "%s", err);
    cairn_config_destroy(&cfg);
}
END_TEST

START_TEST(urls_to_addresses)
{
    char a[64];
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "http://127.0.0.1:2379"), 0);
    ck_assert_str_eq(a, "127.0.0.1:2379");
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "https://127.0.0.1:2380/"), 0);
    ck_assert_str_eq(a, "127.0.0.1:2380");
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "http://localhost:1/"), 0);
    ck_assert_str_eq(a, "localhost:1");
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "http://[::1]:5"), 0);
    ck_assert_str_eq(a, "[::1]:5");
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "http://[::1]"), CAIRN_EINVAL);
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "http://h:99999"), CAIRN_EINVAL);
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "http://h:1/path"), CAIRN_EINVAL);
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "unix:///x"), CAIRN_EINVAL);
    /* etcd: unix://host:port is a socket file "host:port" in the cwd. */
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "unix://localhost:12345"), 0);
    ck_assert_str_eq(a, "unix:localhost:12345");
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "unix://sock"), CAIRN_EINVAL);
    /* the TLS schemes are the same addresses (server/tls) */
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "unixs://localhost:1"), 0);
    ck_assert_str_eq(a, "unix:localhost:1");
    ck_assert_int_eq(cairn_url_to_addr(a, sizeof a, "https://localhost:1"), 0);
    ck_assert_str_eq(a, "localhost:1");
    ck_assert_int_eq(cairn_url_to_addr(a, 4, "http://127.0.0.1:1"), CAIRN_EINVAL);
}
END_TEST

START_TEST(crc32c_vectors)
{
    /* The standard check value of CRC-32C, and chaining. */
    ck_assert_uint_eq(etcd_crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(etcd_crc32c(etcd_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    ck_assert_uint_eq(etcd_crc32c(0, "", 0), 0);
}
END_TEST

START_TEST(header_only_matches_protobuf_c)
{
    /* The hand-packed answer of a plain Put is byte for byte protobuf-c's
     * PutResponse with the same header: zeros left out, a negative
     * revision as ten bytes, the largest values. */
    static const struct {
        uint64_t cluster, member;
        int64_t rev;
        uint64_t term;
    } cases[] = {
        {0, 0, 0, 0},
        {1, 2, 3, 4},
        {0xcdef01234567890aull, 0x8e9e05c52164694dull, 123456, 0},
        {UINT64_MAX, UINT64_MAX, INT64_MAX, UINT64_MAX},
        {127, 128, -1, 16384},
        {0, UINT64_MAX, INT64_MIN, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Etcdserverpb__ResponseHeader h;
        etcdserverpb__response_header__init(&h);
        h.cluster_id = cases[i].cluster;
        h.member_id = cases[i].member;
        h.revision = cases[i].rev;
        h.raft_term = cases[i].term;
        Etcdserverpb__PutResponse r;
        etcdserverpb__put_response__init(&r);
        r.header = &h;
        uint8_t want[128], got[ETCD_HEADER_ONLY_MAX];
        size_t wn = protobuf_c_message_pack(&r.base, want);
        size_t gn = etcd_pack_header_only(got, &h);
        ck_assert_uint_eq(gn, wn);
        ck_assert_mem_eq(got, want, wn);
    }
}
END_TEST

START_TEST(error_rows)
{
    ck_assert_int_eq(cairn_error_grpc_status(CAIRN_EUNMARSHAL), 13);
    ck_assert_int_eq(cairn_error_grpc_status(CAIRN_EMSGTOOLARGE), 8);
    ck_assert_int_eq(cairn_error_grpc_status(CAIRN_ENOSUCHMETHOD), 12);
    ck_assert_str_eq(cairn_strerror(CAIRN_EREQUESTTOOLARGE), "etcdserver: request is too large");
}
END_TEST

/* ---- the engine, with a service of its own -------------------------------- */

static int echo_token;
static atomic_int echo_freed, echo_stopping;

static void echo_ctx_free(rpc_call *c)
{
    ck_assert_ptr_eq(c->ctx, &echo_token);
    atomic_fetch_add(&echo_freed, 1);
}

static void echo_say(rpc_call *c, const uint8_t *req, size_t len)
{
    ck_assert_ptr_eq(c->arg, &echo_token);
    for (size_t i = 0; i < RPC_CALL_SCRATCH; i++)
        ck_assert_uint_eq(c->scratch[i], 0);
    c->ctx = &echo_token;
    c->ctx_free = echo_ctx_free;
    rpc_reply_raw(c, req, len);
}

static void echo_fail(rpc_call *c, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    rpc_fail(c, CAIRN_EEMPTYKEY, NULL);
}

/* /test.Echo/Later: the answer is queued from a thread of the test's own
 * (as the store's completer does) and must be sent from the call's worker. */
static pthread_t later_worker;
static atomic_int later_answered;

static void later_answer(rpc_call *c, int rc)
{
    ck_assert_int_eq(rc, 7);
    ck_assert(pthread_equal(pthread_self(), later_worker));
    atomic_fetch_add(&later_answered, 1);
    rpc_reply_raw(c, GRPC_SLICE_START_PTR(c->req_bytes), GRPC_SLICE_LENGTH(c->req_bytes));
}

static void *later_thread(void *arg)
{
    rpc_later(arg, later_answer, 7);
    return NULL;
}

static void echo_later(rpc_call *c, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    later_worker = pthread_self();
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, later_thread, c), 0);
    ck_assert_int_eq(pthread_detach(t), 0);
}

static void echo_stopping_hook(void *arg)
{
    ck_assert_ptr_eq(arg, &echo_token);
    atomic_fetch_add(&echo_stopping, 1);
}

/* /test.Echo/Slow: answered a second later, from another thread. */
static void *slow_thread(void *arg)
{
    usleep(1000 * 1000);
    rpc_later(arg, later_answer, 7);
    return NULL;
}

static void echo_slow(rpc_call *c, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    later_worker = pthread_self();
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, slow_thread, c), 0);
    ck_assert_int_eq(pthread_detach(t), 0);
}

static const rpc_method echo_methods[] = {
    {"/test.Echo/Say", RPC_UNARY, echo_say, 2, NULL},
    {"/test.Echo/Fail", RPC_UNARY, echo_fail, 1, NULL},
    {"/test.Echo/Later", RPC_UNARY, echo_later, 1, NULL},
    {"/test.Echo/Slow", RPC_UNARY, echo_slow, 1, NULL},
};
static const rpc_service echo_service = {"test.Echo", echo_methods, 4, echo_stopping_hook, NULL};

/* One unary call of |path| with |req|; the status, its text (in |msg|) and
 * the answer (in |out|, NUL-terminated, at most |cap| - 1 bytes). */
static int unary(grpc_channel *ch, const char *path, const char *req, char *msg, size_t msgcap,
                 char *out, size_t cap)
{
    rpc_client_reply r;
    ck_assert_int_eq(rpc_client_unary(&r, ch, path, (const uint8_t *)req, strlen(req), 10000), 0);
    snprintf(msg, msgcap, "%s", r.details);
    snprintf(out, cap, "%.*s", (int)r.len, r.bytes ? (const char *)r.bytes : "");
    int status = (int)r.status;
    rpc_client_reply_destroy(&r);
    return status;
}

/* An engine of |workers| serving |svc| on a loopback port (receive limit
 * 1024 bytes), and an insecure channel to it in |ch|. */
static rpc_engine *start_engine(int workers, const rpc_service *svc, grpc_channel **ch)
{
    rpc_engine *e;
    rpc_engine_options o = {workers, 1024, 0, 0, 0, 0};
    ck_assert_int_eq(rpc_engine_new(&e, &o), 0);
    ck_assert_int_eq(rpc_engine_add(e, svc, &echo_token), 0);
    int port = rpc_engine_listen(e, "127.0.0.1:0");
    ck_assert_int_gt(port, 0);
    ck_assert_int_eq(rpc_engine_start(e), 0);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    grpc_channel_credentials *cc = grpc_insecure_credentials_create();
    *ch = grpc_channel_create(target, cc, NULL);
    grpc_channel_credentials_release(cc);
    return e;
}

START_TEST(engine_serves_registered_services_only)
{
    grpc_channel *ch;
    rpc_engine *e = start_engine(2, &echo_service, &ch);
    char msg[256], out[2048];

    ck_assert_int_eq(unary(ch, "/test.Echo/Say", "hello", msg, sizeof msg, out, sizeof out), 0);
    ck_assert_str_eq(out, "hello");
    ck_assert_int_eq(unary(ch, "/test.Echo/Say", "again", msg, sizeof msg, out, sizeof out), 0);
    ck_assert_str_eq(out, "again");
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(unary(ch, "/test.Echo/Later", "late", msg, sizeof msg, out, sizeof out), 0);
        ck_assert_str_eq(out, "late");
    }
    ck_assert_int_eq(atomic_load(&later_answered), 3);
    ck_assert_int_eq(unary(ch, "/test.Echo/Fail", "", msg, sizeof msg, out, sizeof out), 3);
    ck_assert_str_eq(msg, "etcdserver: key is not provided");
    ck_assert_int_eq(unary(ch, "/test.Echo/Nope", "", msg, sizeof msg, out, sizeof out), 12);
    ck_assert_str_eq(msg, "unknown method Nope for service test.Echo");
    ck_assert_int_eq(unary(ch, "/etcdserverpb.KV/Range", "", msg, sizeof msg, out, sizeof out), 12);
    ck_assert_str_eq(msg, "unknown service etcdserverpb.KV");
    /* etcd: grpc-go's receive limit, before the handler. */
    char big[1500];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ck_assert_int_eq(unary(ch, "/test.Echo/Say", big, msg, sizeof msg, out, sizeof out), 8);
    ck_assert_str_eq(msg, "grpc: received message larger than max (1499 vs. 1024)");
    /* rpc_client_unary ends at its deadline, the answer still to come */
    rpc_client_reply r;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(rpc_client_unary(&r, ch, "/test.Echo/Slow", (const uint8_t *)"s", 1, 200), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ck_assert_int_eq(r.status, GRPC_STATUS_DEADLINE_EXCEEDED);
    ck_assert_ptr_null(r.bytes);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(took >= 0.15 && took < 0.9, "the call took %.3f s", took);
    rpc_client_reply_destroy(&r);

    grpc_channel_destroy(ch);
    rpc_engine_stop(e, 1000);
    ck_assert_int_eq(atomic_load(&echo_stopping), 1);
    ck_assert_int_eq(atomic_load(&echo_freed), 2);
    rpc_engine_free(e);
}
END_TEST

/* ---- the engine's admit hook ----------------------------------------------- */

static atomic_int gate_handled, gate_asked_stream;

static void gate_handler(rpc_call *c, const uint8_t *req, size_t len)
{
    atomic_fetch_add(&gate_handled, 1);
    if (c->method->kind == RPC_BIDI)
        rpc_reply(c, NULL);
    else
        rpc_reply_raw(c, req, len);
}

/* Unary: refuses the request "no" (it sees the bytes); streams: refuses
 * every one, before anything is read. */
static int gate_admit(rpc_call *c, const uint8_t *req, size_t len)
{
    if (c->method->kind == RPC_BIDI) {
        ck_assert_ptr_null(req);
        atomic_fetch_add(&gate_asked_stream, 1);
        return CAIRN_EEMPTYKEY;
    }
    ck_assert_ptr_nonnull(req);
    return len == 2 && memcmp(req, "no", 2) == 0 ? CAIRN_ENOTFORLEARNER : 0;
}

static const rpc_method gate_methods[] = {
    {"/test.Gate/Say", RPC_UNARY, gate_handler, 1, NULL},
    {"/test.Gate/Stream", RPC_BIDI, gate_handler, 1, NULL},
};
static const rpc_service gate_service = {"test.Gate", gate_methods, 2, NULL, gate_admit};

/* A bidi call of |path| that sends no message: its status and text. */
static int stream_status(grpc_channel *ch, const char *path, char *msg, size_t msgcap)
{
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(10, GPR_TIMESPAN));
    grpc_call *call =
        grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                 grpc_slice_from_static_string(path), NULL, deadline, NULL);
    grpc_metadata_array md, trailers;
    grpc_metadata_array_init(&md);
    grpc_metadata_array_init(&trailers);
    grpc_byte_buffer *recv = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[5];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[2].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[2].data.recv_initial_metadata.recv_initial_metadata = &md;
    ops[3].op = GRPC_OP_RECV_MESSAGE;
    ops[3].data.recv_message.recv_message = &recv;
    ops[4].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[4].data.recv_status_on_client.trailing_metadata = &trailers;
    ops[4].data.recv_status_on_client.status = &status;
    ops[4].data.recv_status_on_client.status_details = &details;
    ck_assert_int_eq(grpc_call_start_batch(call, ops, 5, &ops, NULL), GRPC_CALL_OK);
    grpc_event ev = grpc_completion_queue_pluck(cq, &ops, deadline, NULL);
    ck_assert_int_eq(ev.type, GRPC_OP_COMPLETE);
    snprintf(msg, msgcap, "%.*s", (int)GRPC_SLICE_LENGTH(details),
             (const char *)GRPC_SLICE_START_PTR(details));
    ck_assert_ptr_null(recv);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&md);
    grpc_metadata_array_destroy(&trailers);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    return (int)status;
}

START_TEST(engine_admit_hook_runs_before_the_handler)
{
    grpc_channel *ch;
    rpc_engine *e = start_engine(1, &gate_service, &ch);
    char msg[256], out[2048];

    ck_assert_int_eq(unary(ch, "/test.Gate/Say", "yes", msg, sizeof msg, out, sizeof out), 0);
    ck_assert_str_eq(out, "yes");
    ck_assert_int_eq(atomic_load(&gate_handled), 1);
    /* refused: the hook's code and text, and the handler never ran */
    ck_assert_int_eq(unary(ch, "/test.Gate/Say", "no", msg, sizeof msg, out, sizeof out), 14);
    ck_assert_str_eq(msg, "etcdserver: rpc not supported for learner");
    ck_assert_str_eq(out, "");
    ck_assert_int_eq(atomic_load(&gate_handled), 1);
    /* the receive limit comes first for a unary call */
    char big[1500];
    memset(big, 'n', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ck_assert_int_eq(unary(ch, "/test.Gate/Say", big, msg, sizeof msg, out, sizeof out), 8);
    /* a stream is refused before it reads anything */
    ck_assert_int_eq(stream_status(ch, "/test.Gate/Stream", msg, sizeof msg), 3);
    ck_assert_str_eq(msg, "etcdserver: key is not provided");
    ck_assert_int_eq(atomic_load(&gate_asked_stream), 1);
    ck_assert_int_eq(atomic_load(&gate_handled), 1);

    grpc_channel_destroy(ch);
    rpc_engine_stop(e, 1000);
    rpc_engine_free(e);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("server");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, defaults_are_etcds);
    tcase_add_test(tc, both_value_forms_and_single_dash);
    tcase_add_test(tc, data_dir_and_cluster_follow_name);
    tcase_add_test(tc, initial_cluster_merges_names);
    tcase_add_test(tc, rejections);
    tcase_add_test(tc, peer_flags);
    tcase_add_test(tc, peer_links_rejections);
    tcase_add_test(tc, help_version_and_ignored);
    tcase_add_test(tc, tls_flags_fill_the_tls_config);
    tcase_add_test(tc, go_flag_syntax);
    tcase_add_test(tc, environment_variables);
    tcase_add_test(tc, config_file);
    tcase_add_test(tc, urls_to_addresses);
    tcase_add_test(tc, crc32c_vectors);
    tcase_add_test(tc, error_rows);
    tcase_add_test(tc, header_only_matches_protobuf_c);
    suite_add_tcase(s, tc);
    TCase *te = tcase_create("engine");
    tcase_set_timeout(te, 60);
    tcase_add_test(te, engine_serves_registered_services_only);
    tcase_add_test(te, engine_admit_hook_runs_before_the_handler);
    suite_add_tcase(s, te);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
