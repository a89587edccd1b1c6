#ifndef CAIRN_SERVER_H
#define CAIRN_SERVER_H

/*
 * The daemon's internal interface: configuration from etcd-style flags,
 * logging, and the gRPC server that serves etcd's v3 API from a cairn_store.
 * Only server/ includes this header (and tests that link cairn_server_core).
 *
 * Lifecycle: cairn_config_parse -> cairn_server_new (opens the store, binds
 * the client URLs) -> cairn_server_start (worker threads) ->
 * cairn_server_stop (stop accepting, finish in-flight calls, close the
 * store) -> cairn_server_free.
 */

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The etcd release whose API cairn serves; reported by Maintenance.Status.
 * etcd: `etcdctl endpoint status` prints it verbatim and checks nothing. */
#define CAIRN_ETCD_VERSION "3.4.23"
#define CAIRN_VERSION "0.1.0"

/* ---- logging ------------------------------------------------------------- */

enum { CAIRN_LOG_DEBUG = 0, CAIRN_LOG_INFO = 1, CAIRN_LOG_WARN = 2, CAIRN_LOG_ERROR = 3 };

/* Sets the minimum level written to stderr (default info). */
void cairn_log_set_level(int level);
/* Parses etcd's --log-level names (debug, info, warn, error, panic, fatal);
 * -1 if unknown. */
int cairn_log_level_parse(const char *s);
void cairn_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- configuration ------------------------------------------------------- */

/* One member of --initial-cluster (name=url, repeated names merged). */
typedef struct cairn_config_member {
    char *name;
    char **peer_urls;
    size_t npeer_urls;
} cairn_config_member;

/* --experimental-peer-dial NAME=HOST:PORT (tests only). */
typedef struct cairn_config_dial {
    char *name;
    char *addr;
} cairn_config_dial;

/* One side's TLS settings, etcd's --cert-file ... (client) and
 * --peer-cert-file ... (peer) flags and the config file's
 * client-transport-security / peer-transport-security maps. NULL/0 = not
 * set. Parsing checks form only (a path is non-empty, a boolean is Go's);
 * whether the files exist and hold what they should is for the TLS code. */
typedef struct cairn_tls_config {
    char *cert_file;        /* --cert-file / --peer-cert-file */
    char *key_file;         /* --key-file / --peer-key-file */
    char *trusted_ca_file;  /* --trusted-ca-file / --peer-trusted-ca-file */
    char *crl_file;         /* --client-crl-file / --peer-crl-file */
    char *allowed_cn;       /* --peer-cert-allowed-cn (peer only) */
    char *allowed_hostname; /* --client-cert-allowed-hostname / --peer-cert-allowed-hostname */
    int client_cert_auth;   /* --client-cert-auth / --peer-client-cert-auth */
    int auto_tls;           /* --auto-tls / --peer-auto-tls */
    /* --experimental-peer-skip-client-san-verification (peer only). */
    int skip_client_san_verification;
} cairn_tls_config;

/* A line for the log, at CAIRN_LOG_*. */
typedef struct cairn_config_note {
    int level;
    char *text;
} cairn_config_note;

/* Every string is owned by the config (cairn_config_destroy frees it). */
typedef struct cairn_config {
    char *name;
    char *data_dir;
    char **listen_client_urls;
    size_t nlisten_client_urls;
    char **advertise_client_urls;
    size_t nadvertise_client_urls;
    char **listen_peer_urls;
    size_t nlisten_peer_urls;
    char **listen_metrics_urls; /* /metrics, /health, /version only */
    size_t nlisten_metrics_urls;
    char **initial_advertise_peer_urls;
    size_t ninitial_advertise_peer_urls;
    cairn_config_member *initial_cluster;
    size_t ninitial_cluster;
    char *initial_cluster_state; /* "new" or "existing" */
    char *initial_cluster_token;
    uint64_t max_request_bytes;
    uint32_t max_txn_ops;
    int64_t quota_backend_bytes; /* 0 = etcd's default, 2 GiB */
    int log_level;
    int threads; /* gRPC worker threads; 0 = one per core */
    /* Benchmarks only (--experimental-batch-writes): up to this many
     * concurrent plain Puts share one change and one revision
     * (etcd/kv_batch.c).
     * 0 = off: one change per Put, as etcd numbers them. */
    uint32_t batch_writes;
    uint32_t sync_interval_ms; /* --sync-interval-ms; 100 */
    /* etcd's gRPC keepalive on client links, in ms: the least time between
     * a client's pings (5 s), the server's ping interval (2 h) and how long
     * it waits for the answer (20 s); 0 or less: gRPC's default, as etcd
     * then leaves grpc-go's. */
    int64_t grpc_keepalive_min_time_ms;
    int64_t grpc_keepalive_interval_ms;
    int64_t grpc_keepalive_timeout_ms;
    /* --max-concurrent-streams: streams per client connection (etcd's
     * default math.MaxUint32; 0 = no limit, as grpc-go takes it). */
    uint64_t max_concurrent_streams;
    cairn_config_dial *peer_dials;
    size_t npeer_dials;
    /* --peer-links: the members this node links to (a partial mesh);
     * NULL = every other member (the default full mesh). */
    char **peer_links;
    size_t npeer_links;
    cairn_tls_config client_tls;
    cairn_tls_config peer_tls;
    /* --cipher-suites: Go's names (TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
     * both sides; none = the TLS library's defaults. */
    char **cipher_suites;
    size_t ncipher_suites;
    /* What parsing has to say once the log is up (an etcd flag that does
     * not apply to cairn, an ETCD_* variable used or unknown, the config
     * file loaded): main logs each once at start. */
    cairn_config_note *notes;
    size_t nnotes;
    char *config_file; /* --config-file / ETCD_CONFIG_FILE, or NULL */
    /* Set with an error from the command line itself, one Go's flag
     * package would refuse (etcd exits 2); other errors exit 1. */
    int usage_error;
} cairn_config;

/* What cairn_config_parse asks the caller to do. */
enum { CAIRN_CONFIG_RUN = 0, CAIRN_CONFIG_HELP = 1, CAIRN_CONFIG_VERSION = 2 };

/* Parses argv (etcd's flag names; "--flag value" and "--flag=value"; a
 * single leading dash works too) into |cfg|, filling defaults. Returns
 * CAIRN_CONFIG_RUN/HELP/VERSION, or a negative code (CAIRN_EINVAL) with a
 * one-line explanation written to |err| (size |errlen|). |cfg| must be
 * destroyed in every case. */
int cairn_config_parse(cairn_config *cfg, int argc, char **argv, char *err, size_t errlen);
/* The same with the environment |envp| (NULL-terminated "K=V" strings)
 * instead of the process's: a flag not given takes its ETCD_* variable
 * (etcd's names: --listen-client-urls <- ETCD_LISTEN_CLIENT_URLS); a
 * variable beside its flag is an error, as in etcd 3.4. --config-file (or
 * ETCD_CONFIG_FILE) loads etcd's YAML keys instead, and then other flags
 * and variables are ignored (etcd 3.4). */
int cairn_config_parse_env(cairn_config *cfg, int argc, char **argv, char **envp, char *err,
                           size_t errlen);
void cairn_config_destroy(cairn_config *cfg);
/* Writes the --help text. */
void cairn_config_usage(FILE *out);

/* "http://127.0.0.1:2379" -> "127.0.0.1:2379" and "unix://sock:1" ->
 * "unix:sock:1" (gRPC's address forms) in |out|. CAIRN_EINVAL for another
 * scheme, a missing port or a path. */
int cairn_url_to_addr(char *out, size_t outlen, const char *url);
/* Before binding |addr| (cairn_url_to_addr's form): a socket file left by
 * an earlier run is removed, as etcd does, so a restart can bind again. */
void cairn_unix_remove_stale(const char *addr);

/* ---- the server ---------------------------------------------------------- */

typedef struct cairn_server cairn_server;

/* Opens the store in cfg->data_dir and binds every client URL. |cfg| is
 * borrowed and must outlive the server. On failure writes a message to
 * |err|: CAIRN_EIO (data dir unusable, port in use), CAIRN_ECORRUPT,
 * CAIRN_EINVAL. */
int cairn_server_new(cairn_server **out, const cairn_config *cfg, char *err, size_t errlen);
/* Starts the worker threads; calls are served from here on (a joining
 * node's: once cairn_server_join_wait returned 0). */
int cairn_server_start(cairn_server *srv);
/* 1 for a node joining a running cluster (--initial-cluster-state
 * existing on a new data dir) until it serves clients. */
int cairn_server_joining(const cairn_server *srv);
/* A joining node: waits until it holds every head the member that
 * answered its join held then (it caught up; etcd's new member serves
 * once it applied the cluster's log), taking the signals in |sigs|
 * meanwhile; then publishes its name and client URLs and serves clients.
 * 0 once serving, the signal's number if one came first, < 0 an error. */
int cairn_server_join_wait(cairn_server *srv, const sigset_t *sigs);
/* The port actually bound for listen client URL |i| (useful with port 0). */
int cairn_server_port(const cairn_server *srv, size_t i);
/* Stops accepting calls, lets in-flight calls finish (cancelling those that
 * take longer than |grace_ms|), joins the workers and closes the store. */
void cairn_server_stop(cairn_server *srv, int grace_ms);
void cairn_server_free(cairn_server *srv);

#endif
