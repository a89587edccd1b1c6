/*
 * Command-line flags with etcd's names, defaults and meaning, so that a
 * script that starts etcd can start cairn by changing the binary name.
 *
 * Like etcd (Go's flag package) a flag may be written --flag value,
 * --flag=value, -flag value or -flag=value; a boolean takes no value. An
 * unknown flag or a bad value is an error with a one-line message; the
 * caller prints it and exits non-zero. A few etcd flags that have no meaning
 * without raft (heartbeat, election timeout, snapshot count) and logger
 * selection are accepted and ignored, so etcd command lines keep working;
 * --help says which.
 *
 * Defaults that depend on other flags are filled after parsing: the data
 * dir is "<name>.cairn" (etcd: "<name>.etcd"), and without --initial-cluster
 * the cluster is this member alone with its advertised peer URLs.
 */
#include "server/server.h"

#include "crdt/error.h"
#include "server/tls/tls.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

/* etcd's defaults (embed/config.go). */
#define DEFAULT_NAME "default"
#define DEFAULT_LISTEN_CLIENT "http://127.0.0.1:2379"
#define DEFAULT_ADVERTISE_CLIENT "http://localhost:2379"
#define DEFAULT_LISTEN_PEER "http://127.0.0.1:2380"
#define DEFAULT_ADVERTISE_PEER "http://localhost:2380"
#define DEFAULT_TOKEN "etcd-cluster"
#define DEFAULT_MAX_REQUEST_BYTES (1536u * 1024u)
#define DEFAULT_MAX_TXN_OPS 128u

/* How a flag's value is checked, as Go's flag package does for etcd's
 * flag of that type (an ignored flag's value is checked too: etcd refuses
 * --snapshot-count=abc, so cairn does). */
enum flag_type { T_STRING, T_BOOL, T_UINT, T_INT, T_DURATION };

enum flag_kind {
    F_STRING,
    F_URLS,
    F_CLUSTER,
    F_U64,
    F_I64,
    F_U32,
    F_LOGLEVEL,
    F_INT,
    F_BATCH,
    F_SYNC_MS,
    F_PEER_DIAL,
    F_DEBUG,       /* --debug: true = --log-level debug */
    F_CONFIG_FILE, /* --config-file */
    F_TLS_PATH,    /* a char * in cairn_tls_config, at |off| */
    F_TLS_BOOL,    /* an int in cairn_tls_config, at |off| */
    F_CIPHERS,
    F_PEER_LINKS,
    F_DURATION_MS, /* an int64_t of ms in cairn_config, at |off| */
    F_STREAMS,     /* --max-concurrent-streams */
    F_IGNORED,     /* accepted; a note says why it does not apply (|help|) */
    F_REFUSED      /* accepted at |dflt| (or empty); any other value is refused (|help|) */
};

struct flag {
    const char *name;
    enum flag_kind kind;
    enum flag_type type;
    /* --help text; for F_IGNORED and F_REFUSED the reason. */
    const char *help;
    size_t off;       /* F_TLS_*, F_DURATION_MS: offset in cairn_config */
    const char *dflt; /* F_REFUSED: the one value accepted besides "" */
};

#define CTLS(field) offsetof(cairn_config, client_tls.field)
#define PTLS(field) offsetof(cairn_config, peer_tls.field)
#define RAFT "raft only; cairn has no raft (members converge by CRDT sync)"
#define BBOLT "bbolt backend tuning; cairn's store is LevelDB"
#define NO_HTTP "cairn serves no HTTP/JSON gateway, only gRPC"
#define NO_AUTH "cairn has no authentication yet (the Auth service answers Unimplemented)"
#define V2_PROXY "v2 proxy only; cairn is not a proxy"

/* Every flag of `etcd --help` (etcd 3.4.23) and cairn's own, in --help's
 * order; docs/FLAGS.md is this table for people, with the reasons. */
static const struct flag flags[] = {
    {"config-file", F_CONFIG_FILE, T_STRING,
     "Path to an etcd YAML configuration file; when set, other flags and ETCD_* variables\n"
     "        are ignored (as etcd does).",
     0, NULL},
    /* Member */
    {"name", F_STRING, T_STRING, "Human-readable name for this member (default \"default\").", 0,
     NULL},
    {"data-dir", F_STRING, T_STRING, "Path to the data directory (default \"${name}.cairn\").", 0,
     NULL},
    {"wal-dir", F_IGNORED, T_STRING, "cairn has no WAL: every change is in --data-dir", 0, NULL},
    {"snapshot-count", F_IGNORED, T_UINT, RAFT, 0, NULL},
    {"heartbeat-interval", F_IGNORED, T_UINT, RAFT, 0, NULL},
    {"election-timeout", F_IGNORED, T_UINT, RAFT, 0, NULL},
    {"initial-election-tick-advance", F_IGNORED, T_BOOL, RAFT, 0, NULL},
    {"listen-peer-urls", F_URLS, T_STRING,
     "List of URLs to listen on for peer traffic (default \"" DEFAULT_LISTEN_PEER "\").", 0, NULL},
    {"listen-client-urls", F_URLS, T_STRING,
     "List of URLs to listen on for client traffic (default \"" DEFAULT_LISTEN_CLIENT "\").", 0,
     NULL},
    {"max-snapshots", F_IGNORED, T_UINT, RAFT, 0, NULL},
    {"max-wals", F_IGNORED, T_UINT, "cairn has no WAL", 0, NULL},
    {"quota-backend-bytes", F_I64, T_INT,
     "Raise the NOSPACE alarm when the backend size exceeds this (0 = 2 GiB).", 0, NULL},
    {"backend-batch-interval", F_IGNORED, T_DURATION, BBOLT, 0, NULL},
    {"backend-batch-limit", F_IGNORED, T_INT, BBOLT, 0, NULL},
    {"max-txn-ops", F_U32, T_UINT,
     "Maximum number of operations permitted in a transaction (default 128).", 0, NULL},
    {"max-request-bytes", F_U64, T_UINT,
     "Maximum client request size in bytes the server will accept (default 1572864).", 0, NULL},
    {"max-concurrent-streams", F_STREAMS, T_UINT,
     "Maximum concurrent streams that each client can open at a time (default 4294967295;\n"
     "        0 = no limit).",
     0, NULL},
    {"grpc-keepalive-min-time", F_DURATION_MS, T_DURATION,
     "Minimum duration interval that a client should wait before pinging server (default 5s).",
     offsetof(cairn_config, grpc_keepalive_min_time_ms), NULL},
    {"grpc-keepalive-interval", F_DURATION_MS, T_DURATION,
     "Frequency duration of server-to-client ping to check if a connection is alive (default\n"
     "        2h; 0 = gRPC's default, 2h).",
     offsetof(cairn_config, grpc_keepalive_interval_ms), NULL},
    {"grpc-keepalive-timeout", F_DURATION_MS, T_DURATION,
     "Additional duration of wait before closing a non-responsive connection (default 20s;\n"
     "        0 = gRPC's default, 20s).",
     offsetof(cairn_config, grpc_keepalive_timeout_ms), NULL},
    /* Clustering */
    {"initial-advertise-peer-urls", F_URLS, T_STRING,
     "List of this member's peer URLs to advertise (default \"" DEFAULT_ADVERTISE_PEER "\").", 0,
     NULL},
    {"initial-cluster", F_CLUSTER, T_STRING,
     "Initial cluster configuration, name=url,... (default \"${name}=<advertised peer "
     "URLs>\").",
     0, NULL},
    {"initial-cluster-state", F_STRING, T_STRING,
     "Initial cluster state (\"new\" or \"existing\").", 0, NULL},
    {"initial-cluster-token", F_STRING, T_STRING,
     "Initial cluster token; part of the member and cluster ids (default \"etcd-cluster\").", 0,
     NULL},
    {"advertise-client-urls", F_URLS, T_STRING,
     "List of this member's client URLs to advertise (default \"" DEFAULT_ADVERTISE_CLIENT "\").",
     0, NULL},
    {"discovery", F_REFUSED, T_STRING,
     "discovery is not implemented: cairn's members are --initial-cluster", 0, ""},
    {"discovery-fallback", F_IGNORED, T_STRING, "only used with --discovery", 0, NULL},
    {"discovery-proxy", F_IGNORED, T_STRING, "only used with --discovery", 0, NULL},
    {"discovery-srv", F_REFUSED, T_STRING,
     "DNS discovery is not implemented: cairn's members are --initial-cluster", 0, ""},
    {"discovery-srv-name", F_IGNORED, T_STRING, "only used with --discovery-srv", 0, NULL},
    {"strict-reconfig-check", F_IGNORED, T_BOOL,
     "raft only; cairn's membership is --initial-cluster", 0, NULL},
    {"pre-vote", F_IGNORED, T_BOOL, RAFT, 0, NULL},
    {"auto-compaction-retention", F_IGNORED, T_STRING,
     "auto compaction is not implemented: history is kept until a Compact call", 0, NULL},
    {"auto-compaction-mode", F_IGNORED, T_STRING,
     "auto compaction is not implemented: history is kept until a Compact call", 0, NULL},
    {"enable-v2", F_REFUSED, T_BOOL, "cairn serves only etcd's v3 API", 0, "false"},
    /* Security: server/tls (client links) and server/peer (peer links). */
    {"cert-file", F_TLS_PATH, T_STRING, "Path to the client server TLS cert file.", CTLS(cert_file),
     NULL},
    {"key-file", F_TLS_PATH, T_STRING, "Path to the client server TLS key file.", CTLS(key_file),
     NULL},
    {"client-cert-auth", F_TLS_BOOL, T_BOOL, "Enable client cert authentication.",
     CTLS(client_cert_auth), NULL},
    {"client-crl-file", F_TLS_PATH, T_STRING,
     "Path to the client certificate revocation list file.", CTLS(crl_file), NULL},
    {"client-cert-allowed-hostname", F_TLS_PATH, T_STRING,
     "Allowed TLS hostname for client cert authentication.", CTLS(allowed_hostname), NULL},
    {"trusted-ca-file", F_TLS_PATH, T_STRING, "Path to the client server TLS trusted CA cert file.",
     CTLS(trusted_ca_file), NULL},
    {"auto-tls", F_TLS_BOOL, T_BOOL, "Client TLS using generated certificates.", CTLS(auto_tls),
     NULL},
    {"peer-cert-file", F_TLS_PATH, T_STRING, "Path to the peer server TLS cert file.",
     PTLS(cert_file), NULL},
    {"peer-key-file", F_TLS_PATH, T_STRING, "Path to the peer server TLS key file.", PTLS(key_file),
     NULL},
    {"peer-client-cert-auth", F_TLS_BOOL, T_BOOL, "Enable peer client cert authentication.",
     PTLS(client_cert_auth), NULL},
    {"peer-trusted-ca-file", F_TLS_PATH, T_STRING, "Path to the peer server TLS trusted CA file.",
     PTLS(trusted_ca_file), NULL},
    {"peer-cert-allowed-cn", F_TLS_PATH, T_STRING,
     "Required CN for client certs connecting to the peer endpoint.", PTLS(allowed_cn), NULL},
    {"peer-cert-allowed-hostname", F_TLS_PATH, T_STRING,
     "Allowed TLS hostname for inter peer authentication.", PTLS(allowed_hostname), NULL},
    {"peer-auto-tls", F_TLS_BOOL, T_BOOL, "Peer TLS using self-generated certificates.",
     PTLS(auto_tls), NULL},
    {"peer-crl-file", F_TLS_PATH, T_STRING, "Path to the peer certificate revocation list file.",
     PTLS(crl_file), NULL},
    {"cipher-suites", F_CIPHERS, T_STRING,
     "Comma-separated list of TLS cipher suites (Go's names), client and peer.", 0, NULL},
    {"cors", F_IGNORED, T_STRING, NO_HTTP, 0, NULL},
    {"host-whitelist", F_IGNORED, T_STRING, NO_HTTP, 0, NULL},
    /* Auth */
    {"auth-token", F_IGNORED, T_STRING, NO_AUTH, 0, NULL},
    {"bcrypt-cost", F_IGNORED, T_UINT, NO_AUTH, 0, NULL},
    {"auth-token-ttl", F_IGNORED, T_UINT, NO_AUTH, 0, NULL},
    /* Profiling and monitoring */
    {"enable-pprof", F_IGNORED, T_BOOL, "Go runtime profiling; cairn is not a Go program", 0, NULL},
    {"metrics", F_IGNORED, T_STRING, "cairn serves one metrics set (docs/METRICS.md)", 0, NULL},
    {"listen-metrics-urls", F_URLS, T_STRING,
     "List of additional URLs to listen on that answer /metrics, /health and /version.", 0, NULL},
    /* Logging */
    {"logger", F_IGNORED, T_STRING, "cairn writes plain log lines to stderr", 0, NULL},
    {"log-outputs", F_IGNORED, T_STRING, "cairn writes plain log lines to stderr", 0, NULL},
    {"log-level", F_LOGLEVEL, T_STRING, "debug, info, warn, error, panic or fatal (default info).",
     0, NULL},
    /* v2 proxy */
    {"proxy", F_REFUSED, T_STRING, "cairn is not a v2 proxy", 0, "off"},
    {"proxy-failure-wait", F_IGNORED, T_UINT, V2_PROXY, 0, NULL},
    {"proxy-refresh-interval", F_IGNORED, T_UINT, V2_PROXY, 0, NULL},
    {"proxy-dial-timeout", F_IGNORED, T_UINT, V2_PROXY, 0, NULL},
    {"proxy-write-timeout", F_IGNORED, T_UINT, V2_PROXY, 0, NULL},
    {"proxy-read-timeout", F_IGNORED, T_UINT, V2_PROXY, 0, NULL},
    /* Experimental */
    {"experimental-initial-corrupt-check", F_IGNORED, T_BOOL,
     "raft only; cairn checks each change's hash as it applies it", 0, NULL},
    {"experimental-corrupt-check-time", F_IGNORED, T_DURATION,
     "raft only; cairn checks each change's hash as it applies it", 0, NULL},
    {"experimental-enable-v2v3", F_REFUSED, T_STRING, "cairn serves only etcd's v3 API", 0, ""},
    {"experimental-backend-bbolt-freelist-type", F_IGNORED, T_STRING, BBOLT, 0, NULL},
    {"experimental-enable-lease-checkpoint", F_IGNORED, T_BOOL,
     "raft only; a lease's expiry is in the replicated store", 0, NULL},
    {"experimental-compaction-batch-limit", F_IGNORED, T_INT, BBOLT, 0, NULL},
    {"experimental-peer-skip-client-san-verification", F_TLS_BOOL, T_BOOL,
     "Skip verification of SAN field in client certificate for peer connections.",
     PTLS(skip_client_san_verification), NULL},
    {"experimental-watch-progress-notify-interval", F_IGNORED, T_DURATION,
     "periodic progress notifications are not sent (a progress request is answered)", 0, NULL},
    {"experimental-warning-apply-duration", F_IGNORED, T_DURATION, RAFT, 0, NULL},
    /* Unsafe */
    {"force-new-cluster", F_IGNORED, T_BOOL,
     "raft only; there is no quorum to override, each member serves alone", 0, NULL},
    /* To be deprecated */
    {"debug", F_DEBUG, T_BOOL, "Same as --log-level=debug.", 0, NULL},
    {"log-package-levels", F_IGNORED, T_STRING, "cairn has one log level, --log-level", 0, NULL},
    /* cairn's own */
    {"threads", F_INT, T_INT, "cairn: gRPC worker threads (default: one per CPU it may run on, less one, at least one).", 0, NULL},
    {"experimental-batch-writes", F_BATCH, T_INT,
     "cairn, for benchmarks only: coalesce up to N concurrent plain Puts into one change\n"
     "        (one revision for all of them, which breaks etcd's one revision per Put;\n"
     "        N <= --max-txn-ops). 0 = off (default).",
     0, NULL},
    {"sync-interval-ms", F_SYNC_MS, T_INT,
     "cairn: period of the Bloom-filter sync with each peer, in ms (default 100).", 0, NULL},
    {"experimental-peer-dial", F_PEER_DIAL, T_STRING,
     "cairn, for tests only: NAME=HOST:PORT dials member NAME at HOST:PORT instead of\n"
     "        its advertised peer URL (e.g. through a fault-injecting proxy); repeatable.",
     0, NULL},
    {"peer-links", F_PEER_LINKS, T_STRING,
     "cairn: NAME,NAME,... links this node to these members only (a partial mesh:\n"
     "        hub and spoke, a line of edge sites); changes travel on through the\n"
     "        linked members, which relay what they receive (give the flag to every\n"
     "        node of a partial mesh, the hub too). List each link on both of its\n"
     "        ends. Default: every other member (full mesh, no relaying).",
     0, NULL},
};

#define NFLAGS (sizeof flags / sizeof flags[0])

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return CAIRN_EINVAL;
}

static void free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Splits "a,b,c" into owned strings; empty items are an error. */
static int split_list(char ***out, size_t *nout, const char *s)
{
    *out = NULL;
    *nout = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    char **v = calloc(cap, sizeof *v);
    if (!v)
        return CAIRN_ENOMEM;
    size_t n = 0;
    const char *p = s;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0) {
            free_list(v, n);
            return CAIRN_EINVAL;
        }
        v[n] = strndup(p, len);
        if (!v[n]) {
            free_list(v, n);
            return CAIRN_ENOMEM;
        }
        n++;
        if (!end)
            break;
        p = end + 1;
    }
    *out = v;
    *nout = n;
    return 0;
}

int cairn_url_to_addr(char *out, size_t outlen, const char *url)
{
    /* etcd: a unix:// URL names a socket file "host:port", relative to the
     * working directory (etcd 3.4 refuses unix:///path: "URL address does
     * not have the form host:port"); gRPC's form is "unix:host:port". */
    /* https:// and unixs:// are the same addresses with TLS (server/tls) */
    static const char http[] = "http://", unix_[] = "unix://", https[] = "https://",
                      unixs[] = "unixs://";
    const char *host;
    size_t pre = 0;
    if (strncmp(url, http, sizeof http - 1) == 0)
        host = url + sizeof http - 1;
    else if (strncmp(url, https, sizeof https - 1) == 0)
        host = url + sizeof https - 1;
    else if (strncmp(url, unix_, sizeof unix_ - 1) == 0)
        host = url + sizeof unix_ - 1, pre = 5;
    else if (strncmp(url, unixs, sizeof unixs - 1) == 0)
        host = url + sizeof unixs - 1, pre = 5;
    else
        return CAIRN_EINVAL;
    size_t len = strlen(host);
    if (len > 0 && host[len - 1] == '/')
        len--;
    if (len == 0 || memchr(host, '/', len))
        return CAIRN_EINVAL;
    /* The port is after the last ':' (and after a closing ']' for IPv6). */
    const char *colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (host[i] == ':')
            colon = host + i;
    const char *bracket = memchr(host, ']', len);
    if (!colon || (bracket && colon < bracket) || colon == host + len - 1)
        return CAIRN_EINVAL;
    for (const char *p = colon + 1; p < host + len; p++)
        if (*p < '0' || *p > '9')
            return CAIRN_EINVAL;
    if (strtol(colon + 1, NULL, 10) > 65535)
        return CAIRN_EINVAL;
    if (pre + len + 1 > outlen)
        return CAIRN_EINVAL;
    memcpy(out, "unix:", pre);
    memcpy(out + pre, host, len);
    out[pre + len] = '\0';
    return 0;
}

void cairn_unix_remove_stale(const char *addr)
{
    struct stat st;
    if (strncmp(addr, "unix:", 5) == 0 && lstat(addr + 5, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(addr + 5);
}

static int check_urls(char **urls, size_t n, const char *flag, char *err, size_t errlen)
{
    char addr[256];
    for (size_t i = 0; i < n; i++)
        if (cairn_url_to_addr(addr, sizeof addr, urls[i]) != 0)
            return fail(err, errlen,
                        "invalid value \"%s\" for flag --%s: expected http://host:port, "
                        "https://host:port, unix://host:port or unixs://host:port",
                        urls[i], flag);
    return 0;
}

static void free_cluster(cairn_config_member *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(m[i].name);
        free_list(m[i].peer_urls, m[i].npeer_urls);
    }
    free(m);
}

/* "NAME=HOST:PORT" (--experimental-peer-dial): a later one for the same
 * name replaces the earlier. */
static int add_peer_dial(cairn_config *cfg, const char *v, char *err, size_t errlen)
{
    const char *eq = strchr(v, '=');
    const char *colon = eq ? strrchr(eq, ':') : NULL;
    if (!eq || eq == v || !colon || colon == eq + 1 || colon[1] == '\0')
        return fail(
            err, errlen,
            "invalid value \"%s\" for flag --experimental-peer-dial: expected NAME=HOST:PORT", v);
    cairn_config_dial *d = realloc(cfg->peer_dials, (cfg->npeer_dials + 1) * sizeof *d);
    if (!d)
        return CAIRN_ENOMEM;
    cfg->peer_dials = d;
    d = &cfg->peer_dials[cfg->npeer_dials];
    d->name = strndup(v, (size_t)(eq - v));
    d->addr = strdup(eq + 1);
    if (!d->name || !d->addr) {
        free(d->name);
        free(d->addr);
        return CAIRN_ENOMEM;
    }
    cfg->npeer_dials++;
    return 0;
}

/* "n1=u1,n1=u2,n2=u3" -> members in first-seen order. */
static int parse_cluster(cairn_config *cfg, const char *s, char *err, size_t errlen)
{
    char **items;
    size_t nitems;
    int rc = split_list(&items, &nitems, s);
    if (rc == CAIRN_ENOMEM)
        return rc;
    if (rc != 0)
        return fail(err, errlen, "invalid value \"%s\" for flag --initial-cluster", s);
    cairn_config_member *m = calloc(nitems, sizeof *m);
    size_t n = 0;
    if (!m) {
        rc = CAIRN_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nitems; i++) {
        char *eq = strchr(items[i], '=');
        if (!eq || eq == items[i] || !eq[1]) {
            rc = fail(err, errlen,
                      "invalid value \"%s\" for flag --initial-cluster: expected name=url",
                      items[i]);
            goto out;
        }
        *eq = '\0';
        const char *url = eq + 1;
        char addr[256];
        if (cairn_url_to_addr(addr, sizeof addr, url) != 0) {
            rc = fail(err, errlen, "invalid URL \"%s\" in --initial-cluster", url);
            goto out;
        }
        size_t j = 0;
        while (j < n && strcmp(m[j].name, items[i]) != 0)
            j++;
        if (j == n) {
            m[n].name = strdup(items[i]);
            if (!m[n].name) {
                rc = CAIRN_ENOMEM;
                goto out;
            }
            n++;
        }
        char **grown = realloc(m[j].peer_urls, (m[j].npeer_urls + 1) * sizeof *grown);
        if (!grown) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
        m[j].peer_urls = grown;
        m[j].peer_urls[m[j].npeer_urls] = strdup(url);
        if (!m[j].peer_urls[m[j].npeer_urls]) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
        m[j].npeer_urls++;
    }
    free_cluster(cfg->initial_cluster, cfg->ninitial_cluster);
    cfg->initial_cluster = m;
    cfg->ninitial_cluster = n;
    m = NULL;
    n = 0;
    rc = 0;
out:
    free_cluster(m, n);
    free_list(items, nitems);
    return rc;
}

static int parse_u64(uint64_t *out, const char *s)
{
    if (!*s || *s == '-' || *s == '+')
        return CAIRN_EINVAL;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return CAIRN_EINVAL;
    *out = v;
    return 0;
}

static int parse_i64(int64_t *out, const char *s)
{
    if (!*s)
        return CAIRN_EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return CAIRN_EINVAL;
    *out = v;
    return 0;
}

static int set_string(char **dst, const char *v)
{
    char *s = strdup(v);
    if (!s)
        return CAIRN_ENOMEM;
    free(*dst);
    *dst = s;
    return 0;
}

static int set_urls(char ***dst, size_t *ndst, const char *v)
{
    char **urls;
    size_t n;
    int rc = split_list(&urls, &n, v);
    if (rc != 0)
        return rc;
    free_list(*dst, *ndst);
    *dst = urls;
    *ndst = n;
    return 0;
}

static int add_note(cairn_config *cfg, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int add_note(cairn_config *cfg, int level, const char *fmt, ...)
{
    cairn_config_note *n = realloc(cfg->notes, (cfg->nnotes + 1) * sizeof *n);
    if (!n)
        return CAIRN_ENOMEM;
    cfg->notes = n;
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *text = malloc((size_t)len + 1);
    if (!text)
        return CAIRN_ENOMEM;
    va_start(ap, fmt);
    vsnprintf(text, (size_t)len + 1, fmt, ap);
    va_end(ap);
    n[cfg->nnotes].level = level;
    n[cfg->nnotes].text = text;
    cfg->nnotes++;
    return 0;
}

/* Go's strconv.ParseBool. */
static int parse_bool(int *out, const char *s)
{
    static const char *const yes[] = {"1", "t", "T", "true", "TRUE", "True"};
    static const char *const no[] = {"0", "f", "F", "false", "FALSE", "False"};
    for (size_t i = 0; i < 6; i++) {
        if (strcmp(s, yes[i]) == 0)
            return *out = 1, 0;
        if (strcmp(s, no[i]) == 0)
            return *out = 0, 0;
    }
    return CAIRN_EINVAL;
}

/* Go's time.ParseDuration: "0", or [-+] then one or more <number><unit>
 * with a decimal fraction allowed and units ns us µs ms s m h. The value
 * goes to *ms (NULL: only checked), rounded down and clamped to +-INT64_MAX
 * ns as Go's would overflow. */
static int parse_duration(const char *s, int64_t *ms)
{
    static const char *const units[] = {"ns", "us", "\xc2\xb5s", "\xce\xbcs", "ms", "s", "m", "h"};
    static const double unit_ns[] = {1, 1e3, 1e3, 1e3, 1e6, 1e9, 60e9, 3600e9};
    double sign = 1, ns = 0;
    if (*s == '-' || *s == '+')
        sign = *s++ == '-' ? -1 : 1;
    if (strcmp(s, "0") == 0) {
        if (ms)
            *ms = 0;
        return 0;
    }
    if (!*s)
        return CAIRN_EINVAL;
    while (*s) {
        const char *num = s;
        size_t digits = strspn(s, "0123456789");
        s += digits;
        if (*s == '.') {
            size_t frac = strspn(s + 1, "0123456789");
            if (digits == 0 && frac == 0)
                return CAIRN_EINVAL;
            s += 1 + frac;
        } else if (digits == 0)
            return CAIRN_EINVAL;
        double v = strtod(num, NULL);
        size_t best = 0, bi = 0;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
            size_t ul = strlen(units[i]);
            if (ul > best && strncmp(s, units[i], ul) == 0)
                best = ul, bi = i;
        }
        if (best == 0)
            return CAIRN_EINVAL; /* Go: missing or unknown unit */
        s += best;
        ns += v * unit_ns[bi];
    }
    if (ns > 9.2e18)
        return CAIRN_EINVAL; /* Go: "invalid duration" */
    if (ms)
        *ms = (int64_t)(sign * ns / 1e6);
    return 0;
}

static int check_duration(const char *s)
{
    return parse_duration(s, NULL);
}

/* Checks |v| as Go's flag of type |t| would parse it (base 0 integers). */
static int check_type(enum flag_type t, const char *v)
{
    int b;
    char *end;
    switch (t) {
    case T_STRING:
        return 0;
    case T_BOOL:
        return parse_bool(&b, v);
    case T_UINT:
        if (!*v || *v == '-' || *v == '+')
            return CAIRN_EINVAL;
        errno = 0;
        (void)strtoull(v, &end, 0);
        return errno || *end ? CAIRN_EINVAL : 0;
    case T_INT:
        if (!*v)
            return CAIRN_EINVAL;
        errno = 0;
        (void)strtoll(v, &end, 0);
        return errno || *end ? CAIRN_EINVAL : 0;
    case T_DURATION:
        return check_duration(v);
    }
    return CAIRN_EINVAL;
}

/* "A,B" of Go cipher suite names: checked for form (upper case, digits and
 * '_'); the TLS code maps the names and refuses an unknown one. */
static int set_ciphers(cairn_config *cfg, const char *v, char *err, size_t errlen)
{
    if (!*v) {
        free_list(cfg->cipher_suites, cfg->ncipher_suites);
        cfg->cipher_suites = NULL;
        cfg->ncipher_suites = 0;
        return 0;
    }
    char **names;
    size_t n;
    int rc = split_list(&names, &n, v);
    if (rc == CAIRN_ENOMEM)
        return rc;
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (strspn(names[i], "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != strlen(names[i]))
            rc = CAIRN_EINVAL;
    if (rc != 0) {
        free_list(names, n);
        return fail(err, errlen,
                    "invalid value \"%s\" for flag --cipher-suites: expected Go's names, e.g. "
                    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,...",
                    v);
    }
    free_list(cfg->cipher_suites, cfg->ncipher_suites);
    cfg->cipher_suites = names;
    cfg->ncipher_suites = n;
    return 0;
}

static int apply(cairn_config *cfg, const struct flag *f, const char *v, char *err, size_t errlen)
{
    int rc = 0;
    uint64_t u;
    int64_t i;
    int b;
    const char *name = f->name;
    if (f->type != T_STRING && check_type(f->type, v) != 0)
        return fail(err, errlen, "invalid %svalue \"%s\" for flag --%s: parse error",
                    f->type == T_BOOL ? "boolean " : "", v, name);
    switch (f->kind) {
    case F_IGNORED:
        return add_note(cfg, CAIRN_LOG_INFO, "flag --%s=%s does not apply to cairn (%s); ignored",
                        name, v, f->help);
    case F_REFUSED:
        if (*v && strcmp(v, f->dflt) != 0 &&
            !(f->type == T_BOOL && parse_bool(&b, v) == 0 && b == 0))
            return fail(err, errlen, "flag --%s=%s is not supported: %s", name, v, f->help);
        return 0;
    case F_CONFIG_FILE:
        return set_string(&cfg->config_file, v);
    case F_DEBUG:
        parse_bool(&b, v);
        if (b)
            cfg->log_level = CAIRN_LOG_DEBUG;
        return 0;
    case F_TLS_PATH: {
        char **dst = (char **)((char *)cfg + f->off);
        if (!*v) {
            free(*dst);
            *dst = NULL;
            return 0;
        }
        return set_string(dst, v);
    }
    case F_TLS_BOOL:
        parse_bool((int *)((char *)cfg + f->off), v);
        return 0;
    case F_CIPHERS:
        return set_ciphers(cfg, v, err, errlen);
    case F_STRING:
        if (strcmp(name, "name") == 0)
            rc = set_string(&cfg->name, v);
        else if (strcmp(name, "data-dir") == 0)
            rc = set_string(&cfg->data_dir, v);
        else if (strcmp(name, "initial-cluster-state") == 0) {
            if (strcmp(v, "new") != 0 && strcmp(v, "existing") != 0)
                return fail(err, errlen,
                            "invalid value \"%s\" for flag --initial-cluster-state: expected "
                            "\"new\" or \"existing\"",
                            v);
            rc = set_string(&cfg->initial_cluster_state, v);
        } else
            rc = set_string(&cfg->initial_cluster_token, v);
        break;
    case F_URLS: {
        char ***dst;
        size_t *n;
        if (strcmp(name, "listen-client-urls") == 0)
            dst = &cfg->listen_client_urls, n = &cfg->nlisten_client_urls;
        else if (strcmp(name, "advertise-client-urls") == 0)
            dst = &cfg->advertise_client_urls, n = &cfg->nadvertise_client_urls;
        else if (strcmp(name, "listen-peer-urls") == 0)
            dst = &cfg->listen_peer_urls, n = &cfg->nlisten_peer_urls;
        else if (strcmp(name, "listen-metrics-urls") == 0)
            dst = &cfg->listen_metrics_urls, n = &cfg->nlisten_metrics_urls;
        else
            dst = &cfg->initial_advertise_peer_urls, n = &cfg->ninitial_advertise_peer_urls;
        rc = set_urls(dst, n, v);
        if (rc == CAIRN_EINVAL)
            return fail(err, errlen, "invalid value \"%s\" for flag --%s", v, name);
        if (rc == 0)
            rc = check_urls(*dst, *n, name, err, errlen);
        break;
    }
    case F_CLUSTER:
        return parse_cluster(cfg, v, err, errlen);
    case F_U64:
        if (parse_u64(&u, v) != 0 || u == 0 || u > INT32_MAX)
            return fail(err, errlen, "invalid value \"%s\" for flag --%s", v, name);
        cfg->max_request_bytes = u;
        break;
    case F_U32:
        if (parse_u64(&u, v) != 0 || u == 0 || u > UINT32_MAX)
            return fail(err, errlen, "invalid value \"%s\" for flag --%s", v, name);
        cfg->max_txn_ops = (uint32_t)u;
        break;
    case F_I64:
        if (parse_i64(&i, v) != 0 || i < 0)
            return fail(err, errlen, "invalid value \"%s\" for flag --%s", v, name);
        cfg->quota_backend_bytes = i;
        break;
    case F_LOGLEVEL:
        cfg->log_level = cairn_log_level_parse(v);
        if (cfg->log_level < 0)
            return fail(err, errlen, "invalid value \"%s\" for flag --log-level", v);
        break;
    case F_INT:
        if (parse_i64(&i, v) != 0 || i < 0 || i > 256)
            return fail(err, errlen, "invalid value \"%s\" for flag --%s", v, name);
        cfg->threads = (int)i;
        break;
    case F_BATCH:
        if (parse_i64(&i, v) != 0 || i < 0 || i > UINT32_MAX)
            return fail(err, errlen, "invalid value \"%s\" for flag --%s", v, name);
        cfg->batch_writes = (uint32_t)i;
        break;
    case F_SYNC_MS:
        if (parse_i64(&i, v) != 0 || i < 1 || i > 3600000)
            return fail(err, errlen, "invalid value \"%s\" for flag --%s", v, name);
        cfg->sync_interval_ms = (uint32_t)i;
        break;
    case F_PEER_DIAL:
        return add_peer_dial(cfg, v, err, errlen);
    case F_DURATION_MS:
        parse_duration(v, (int64_t *)((char *)cfg + f->off));
        return 0;
    case F_STREAMS: {
        /* etcd: a uint32 flag, base 0 as Go's strconv */
        char *end;
        errno = 0;
        u = strtoull(v, &end, 0);
        if (errno || *end || u > UINT32_MAX)
            return fail(err, errlen, "invalid value \"%s\" for flag --%s: value out of range", v,
                        name);
        cfg->max_concurrent_streams = u;
        break;
    }
    case F_PEER_LINKS:
        rc = set_urls(&cfg->peer_links, &cfg->npeer_links, v);
        if (rc == CAIRN_EINVAL)
            return fail(err, errlen, "invalid value \"%s\" for flag --%s", v, name);
        break;
    }
    return rc;
}

/* Fills what depends on other flags. */
static int fill_defaults(cairn_config *cfg)
{
    int rc = 0;
    if (!cfg->name)
        rc = set_string(&cfg->name, DEFAULT_NAME);
    if (rc == 0 && !cfg->data_dir) {
        size_t len = strlen(cfg->name) + sizeof ".cairn";
        cfg->data_dir = malloc(len);
        if (!cfg->data_dir)
            return CAIRN_ENOMEM;
        snprintf(cfg->data_dir, len, "%s.cairn", cfg->name);
    }
    if (rc == 0 && !cfg->listen_client_urls)
        rc = set_urls(&cfg->listen_client_urls, &cfg->nlisten_client_urls, DEFAULT_LISTEN_CLIENT);
    if (rc == 0 && !cfg->advertise_client_urls)
        rc = set_urls(&cfg->advertise_client_urls, &cfg->nadvertise_client_urls,
                      DEFAULT_ADVERTISE_CLIENT);
    if (rc == 0 && !cfg->listen_peer_urls)
        rc = set_urls(&cfg->listen_peer_urls, &cfg->nlisten_peer_urls, DEFAULT_LISTEN_PEER);
    if (rc == 0 && !cfg->initial_advertise_peer_urls)
        rc = set_urls(&cfg->initial_advertise_peer_urls, &cfg->ninitial_advertise_peer_urls,
                      DEFAULT_ADVERTISE_PEER);
    if (rc == 0 && !cfg->initial_cluster_state)
        rc = set_string(&cfg->initial_cluster_state, "new");
    if (rc == 0 && !cfg->initial_cluster_token)
        rc = set_string(&cfg->initial_cluster_token, DEFAULT_TOKEN);
    if (rc == 0 && cfg->ninitial_cluster == 0) {
        /* etcd: the default initial cluster is "<name>=<advertised peer URLs>". */
        cfg->initial_cluster = calloc(1, sizeof *cfg->initial_cluster);
        if (!cfg->initial_cluster)
            return CAIRN_ENOMEM;
        cfg->ninitial_cluster = 1;
        cairn_config_member *m = &cfg->initial_cluster[0];
        /* etcd: an empty --name still gives "default=..." (and then no
         * member has the local name). */
        m->name = strdup(cfg->name[0] ? cfg->name : DEFAULT_NAME);
        m->peer_urls = calloc(cfg->ninitial_advertise_peer_urls, sizeof *m->peer_urls);
        if (!m->name || !m->peer_urls)
            return CAIRN_ENOMEM;
        for (size_t i = 0; i < cfg->ninitial_advertise_peer_urls; i++) {
            m->peer_urls[i] = strdup(cfg->initial_advertise_peer_urls[i]);
            if (!m->peer_urls[i])
                return CAIRN_ENOMEM;
            m->npeer_urls++;
        }
    }
    return rc;
}

static const struct flag *find_flag(const char *name, size_t len);

/* A YAML scalar or a sequence of scalars (joined with ',', as etcd's
 * list flags take them) as a flag value; NULL for null or empty, which
 * leaves the default (etcd: an empty "data-dir:" is the default). */
static char *yaml_value(yaml_document_t *doc, yaml_node_t *n)
{
    if (n->type == YAML_SCALAR_NODE) {
        const char *v = (const char *)n->data.scalar.value;
        size_t len = n->data.scalar.length;
        if (len == 0 || (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                         (strcmp(v, "~") == 0 || strcmp(v, "null") == 0)))
            return NULL;
        return strndup(v, len);
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return NULL;
    size_t total = 1;
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(doc, *it);
        if (!item || item->type != YAML_SCALAR_NODE)
            return NULL;
        total += item->data.scalar.length + 1;
    }
    char *out = calloc(1, total);
    if (!out)
        return NULL;
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(doc, *it);
        if (out[0])
            strcat(out, ",");
        strncat(out, (const char *)item->data.scalar.value, item->data.scalar.length);
    }
    if (!out[0]) {
        free(out);
        return NULL;
    }
    return out;
}

/* etcd's YAML keys are its flag names, but the TLS ones sit in two maps:
 * client-transport-security: {cert-file, key-file, client-cert-auth,
 * trusted-ca-file, auto-tls} and peer-transport-security with the same keys
 * for the --peer-* flags. */
static const char *tls_key_flag(int peer, const char *key, char *buf, size_t buflen)
{
    static const char *const keys[] = {"cert-file", "key-file", "client-cert-auth",
                                       "trusted-ca-file", "auto-tls"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(key, keys[i]) == 0) {
            snprintf(buf, buflen, "%s%s", peer ? "peer-" : "", key);
            return buf;
        }
    return NULL;
}

/* Applies one key of the file; an unknown key is skipped, as etcd 3.4
 * does (its YAML decoding is not strict). */
static int yaml_apply(cairn_config *cfg, yaml_document_t *doc, const char *key, yaml_node_t *val,
                      char *err, size_t errlen)
{
    const struct flag *f = find_flag(key, strlen(key));
    if (!f || f->kind == F_CONFIG_FILE)
        return 0;
    char *v = yaml_value(doc, val);
    if (!v)
        return 0;
    int rc;
    /* etcd's YAML holds a duration as integer nanoseconds. */
    if (f->type == T_DURATION && check_type(T_INT, v) == 0)
        rc = f->kind == F_IGNORED
                 ? add_note(cfg, CAIRN_LOG_INFO,
                            "config key %s: %s does not apply to cairn (%s); ignored", key, v,
                            f->help)
                 : 0;
    else
        rc = apply(cfg, f, v, err, errlen);
    free(v);
    return rc;
}

static int config_from_file(cairn_config *cfg, const char *path, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return fail(err, errlen, "cannot read config file %s: %s", path, strerror(errno));
    yaml_parser_t parser;
    yaml_document_t doc;
    int rc = 0;
    if (!yaml_parser_initialize(&parser)) {
        fclose(fp);
        return CAIRN_ENOMEM;
    }
    yaml_parser_set_input_file(&parser, fp);
    if (!yaml_parser_load(&parser, &doc)) {
        rc = fail(err, errlen, "config file %s: %s at line %zu", path,
                  parser.problem ? parser.problem : "invalid YAML", parser.problem_mark.line + 1);
        yaml_parser_delete(&parser);
        fclose(fp);
        return rc;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root && root->type != YAML_MAPPING_NODE)
        rc = fail(err, errlen, "config file %s: expected a mapping of etcd's keys", path);
    for (yaml_node_pair_t *p = root && !rc ? root->data.mapping.pairs.start : NULL;
         p && p < root->data.mapping.pairs.top && rc == 0; p++) {
        yaml_node_t *k = yaml_document_get_node(&doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&doc, p->value);
        if (!k || !v || k->type != YAML_SCALAR_NODE)
            continue;
        const char *key = (const char *)k->data.scalar.value;
        int peer = strcmp(key, "peer-transport-security") == 0;
        if (peer || strcmp(key, "client-transport-security") == 0) {
            if (v->type != YAML_MAPPING_NODE)
                continue;
            for (yaml_node_pair_t *q = v->data.mapping.pairs.start;
                 q < v->data.mapping.pairs.top && rc == 0; q++) {
                yaml_node_t *k2 = yaml_document_get_node(&doc, q->key);
                yaml_node_t *v2 = yaml_document_get_node(&doc, q->value);
                char name[64];
                const char *fname =
                    k2 && v2 && k2->type == YAML_SCALAR_NODE
                        ? tls_key_flag(peer, (const char *)k2->data.scalar.value, name, sizeof name)
                        : NULL;
                if (fname)
                    rc = yaml_apply(cfg, &doc, fname, v2, err, errlen);
            }
        } else
            rc = yaml_apply(cfg, &doc, key, v, err, errlen);
    }
    if (rc == CAIRN_EINVAL && err[0]) {
        char why[400];
        snprintf(why, sizeof why, "%s", err);
        rc = fail(err, errlen, "config file %s: %s", path, why);
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(fp);
    return rc;
}

static const struct flag *find_flag(const char *name, size_t len)
{
    for (size_t i = 0; i < NFLAGS; i++)
        if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0)
            return &flags[i];
    return NULL;
}

/* Returns 0 (flag applied), 1 (not a flag: parsing stops), 2 (help), 3
 * (version) or a negative code. |set| marks the flags given. */
static int parse_one(cairn_config *cfg, int argc, char **argv, int *a, unsigned char *set,
                     char *err, size_t errlen)
{
    const char *arg = argv[*a];
    /* etcd (Go's flag package): parsing stops at the first argument that
     * is not a flag ("-" counts as one) and after "--". */
    if (arg[0] != '-' || arg[1] == '\0')
        return 1;
    if (strcmp(arg, "--") == 0) {
        (*a)++;
        return 1;
    }
    const char *name = arg + 1 + (arg[1] == '-');
    /* etcd: Go's flag package exits 2 on what it cannot parse on the
     * command line (bad syntax, an unknown flag, a missing value, a value
     * the flag's type refuses); the checks etcd makes after parsing exit 1
     * (measured, etcd 3.4.23) */
    cfg->usage_error = 1;
    if (name[0] == '-' || name[0] == '=')
        return fail(err, errlen, "bad flag syntax: %s", arg);
    const char *eq = strchr(name, '=');
    size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
    if ((nlen == 4 && strncmp(name, "help", 4) == 0) || (nlen == 1 && name[0] == 'h'))
        return 2;
    if (nlen == 7 && strncmp(name, "version", 7) == 0)
        return 3;
    const struct flag *f = find_flag(name, nlen);
    if (!f)
        return fail(err, errlen, "flag provided but not defined: -%.*s (see --help)", (int)nlen,
                    name);
    const char *v;
    if (eq)
        v = eq + 1;
    else if (f->type == T_BOOL)
        v = "true"; /* a bare boolean never takes the next argument */
    else if (*a + 1 < argc)
        v = argv[++*a];
    else
        return fail(err, errlen, "flag needs an argument: -%s", f->name);
    set[f - flags] = 1;
    /* etcd keeps --initial-cluster and --cipher-suites as strings and
     * checks them later; a refused flag is one etcd takes */
    cfg->usage_error = !(f->kind == F_CLUSTER || f->kind == F_CIPHERS || f->kind == F_REFUSED);
    int rc = apply(cfg, f, v, err, errlen);
    if (rc == 0 || rc == CAIRN_ENOMEM)
        cfg->usage_error = 0;
    return rc;
}

/* "listen-client-urls" -> "ETCD_LISTEN_CLIENT_URLS" (etcd's pkg/flags). */
static void env_name(char *out, size_t outlen, const char *flag)
{
    size_t n = (size_t)snprintf(out, outlen, "ETCD_");
    for (; *flag && n + 1 < outlen; flag++)
        out[n++] = *flag == '-' ? '_' : (char)(*flag >= 'a' && *flag <= 'z' ? *flag - 32 : *flag);
    out[n] = '\0';
}

/* etcd 3.4's pkg/flags.SetFlagsFromEnv: every flag not given takes its
 * ETCD_* variable; a variable beside its flag is fatal; an unknown ETCD_*
 * variable is a warning. */
static int apply_env(cairn_config *cfg, char **envp, const unsigned char *set, char *err,
                     size_t errlen)
{
    char key[128];
    for (size_t i = 0; i < NFLAGS; i++) {
        if (flags[i].kind == F_CONFIG_FILE)
            continue;
        env_name(key, sizeof key, flags[i].name);
        size_t klen = strlen(key);
        for (char **e = envp; *e; e++) {
            if (strncmp(*e, key, klen) != 0 || (*e)[klen] != '=')
                continue;
            /* etcd: exits with this line (measured, etcd 3.4.23). */
            if (set[i])
                return fail(err, errlen,
                            "conflicting environment variable \"%s\" is shadowed by "
                            "corresponding command-line flag (either unset environment "
                            "variable or disable flag)",
                            key);
            const char *v = *e + klen + 1;
            int rc = apply(cfg, &flags[i], v, err, errlen);
            if (rc == 0)
                rc = add_note(cfg, CAIRN_LOG_INFO, "recognized and used environment variable %s",
                              *e);
            if (rc != 0)
                return rc;
        }
    }
    for (char **e = envp; *e; e++) {
        if (strncmp(*e, "ETCD_", 5) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        size_t klen = eq ? (size_t)(eq - *e) : strlen(*e);
        int known =
            klen == strlen("ETCD_CONFIG_FILE") && strncmp(*e, "ETCD_CONFIG_FILE", klen) == 0;
        for (size_t i = 0; !known && i < NFLAGS; i++) {
            env_name(key, sizeof key, flags[i].name);
            known = strlen(key) == klen && strncmp(*e, key, klen) == 0;
        }
        if (!known) {
            int rc = add_note(cfg, CAIRN_LOG_WARN, "unrecognized environment variable %s", *e);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

/* The TLS settings' form (the files are loaded by server/tls at start):
 * etcd stops at start on an unknown cipher name. */
static int check_tls(const cairn_config *cfg, char *err, size_t errlen)
{
    return cairn_tls_grpc_ciphers(cfg, 0, err, errlen);
}

static void init_defaults(cairn_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->max_request_bytes = DEFAULT_MAX_REQUEST_BYTES;
    cfg->max_txn_ops = DEFAULT_MAX_TXN_OPS;
    /* etcd's defaults (embed/config.go) */
    cfg->grpc_keepalive_min_time_ms = 5000;
    cfg->grpc_keepalive_interval_ms = 2 * 3600 * 1000;
    cfg->grpc_keepalive_timeout_ms = 20000;
    cfg->max_concurrent_streams = UINT32_MAX;
    cfg->log_level = CAIRN_LOG_INFO;
    cfg->sync_interval_ms = 100;
}

int cairn_config_parse_env(cairn_config *cfg, int argc, char **argv, char **envp, char *err,
                           size_t errlen)
{
    init_defaults(cfg);
    if (errlen)
        err[0] = '\0';
    unsigned char set[NFLAGS] = {0};
    int a = 1, rc = 0;
    for (; a < argc; a++) {
        rc = parse_one(cfg, argc, argv, &a, set, err, errlen);
        if (rc != 0)
            break;
    }
    if (rc == 2)
        return CAIRN_CONFIG_HELP;
    if (rc == 3)
        return CAIRN_CONFIG_VERSION;
    if (rc < 0) {
        if (rc == CAIRN_ENOMEM)
            snprintf(err, errlen, "out of memory");
        return rc;
    }
    /* etcd: "error verifying flags, 'x' is not a valid flag". */
    if (a < argc)
        return fail(err, errlen, "'%s' is not a valid flag", argv[a]);
    if (!cfg->config_file) {
        for (char **e = envp; *e; e++)
            if (strncmp(*e, "ETCD_CONFIG_FILE=", 17) == 0 && (*e)[17])
                if ((rc = set_string(&cfg->config_file, *e + 17)) != 0)
                    return rc;
    }
    if (cfg->config_file) {
        /* etcd: with a config file, other flags (checked above all the
         * same) and ETCD_* variables are ignored. */
        char *path = cfg->config_file;
        cfg->config_file = NULL;
        cairn_config_destroy(cfg);
        init_defaults(cfg);
        cfg->config_file = path;
        rc = add_note(cfg, CAIRN_LOG_INFO,
                      "loading server configuration from \"%s\"; other configuration command "
                      "line flags and environment variables are ignored",
                      path);
        if (rc == 0)
            rc = config_from_file(cfg, path, err, errlen);
    } else
        rc = apply_env(cfg, envp, set, err, errlen);
    if (rc != 0) {
        if (rc == CAIRN_ENOMEM)
            snprintf(err, errlen, "out of memory");
        return rc < 0 ? rc : CAIRN_EINVAL;
    }
    rc = fill_defaults(cfg);
    if (rc != 0) {
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    /* A batch is one Txn in the store, so it obeys the Txn op limit. */
    if (cfg->batch_writes > cfg->max_txn_ops)
        return fail(err, errlen,
                    "--experimental-batch-writes %" PRIu32 " exceeds --max-txn-ops %" PRIu32,
                    cfg->batch_writes, cfg->max_txn_ops);
    int found = 0;
    for (size_t i = 0; i < cfg->ninitial_cluster; i++)
        found |= strcmp(cfg->initial_cluster[i].name, cfg->name) == 0;
    if (!found)
        return fail(err, errlen,
                    "couldn't find local name \"%s\" in the initial cluster configuration",
                    cfg->name);
    for (size_t i = 0; i < cfg->npeer_links; i++) {
        const char *l = cfg->peer_links[i];
        size_t j = 0;
        while (j < cfg->ninitial_cluster && strcmp(cfg->initial_cluster[j].name, l) != 0)
            j++;
        if (j == cfg->ninitial_cluster || strcmp(l, cfg->name) == 0)
            return fail(err, errlen,
                        "--peer-links names \"%s\", which is not another member of the initial "
                        "cluster",
                        l);
    }
    if ((rc = check_tls(cfg, err, errlen)) != 0)
        return rc;
    return CAIRN_CONFIG_RUN;
}

extern char **environ;

int cairn_config_parse(cairn_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    return cairn_config_parse_env(cfg, argc, argv, environ, err, errlen);
}

void cairn_config_destroy(cairn_config *cfg)
{
    free(cfg->name);
    free(cfg->data_dir);
    free_list(cfg->listen_client_urls, cfg->nlisten_client_urls);
    free_list(cfg->advertise_client_urls, cfg->nadvertise_client_urls);
    free_list(cfg->listen_peer_urls, cfg->nlisten_peer_urls);
    free_list(cfg->listen_metrics_urls, cfg->nlisten_metrics_urls);
    free_list(cfg->initial_advertise_peer_urls, cfg->ninitial_advertise_peer_urls);
    free_cluster(cfg->initial_cluster, cfg->ninitial_cluster);
    free(cfg->initial_cluster_state);
    free(cfg->initial_cluster_token);
    for (size_t i = 0; i < cfg->npeer_dials; i++) {
        free(cfg->peer_dials[i].name);
        free(cfg->peer_dials[i].addr);
    }
    free(cfg->peer_dials);
    free_list(cfg->peer_links, cfg->npeer_links);
    cairn_tls_config *sides[] = {&cfg->client_tls, &cfg->peer_tls};
    for (size_t i = 0; i < 2; i++) {
        free(sides[i]->cert_file);
        free(sides[i]->key_file);
        free(sides[i]->trusted_ca_file);
        free(sides[i]->crl_file);
        free(sides[i]->allowed_cn);
        free(sides[i]->allowed_hostname);
    }
    free_list(cfg->cipher_suites, cfg->ncipher_suites);
    for (size_t i = 0; i < cfg->nnotes; i++)
        free(cfg->notes[i].text);
    free(cfg->notes);
    free(cfg->config_file);
    memset(cfg, 0, sizeof *cfg);
}

void cairn_config_usage(FILE *out)
{
    fprintf(out, "Usage: cairn [flags]\n\n"
                 "cairn " CAIRN_VERSION " serves etcd's v3 API (etcd " CAIRN_ETCD_VERSION
                 ") from a CRDT: every node accepts reads and\n"
                 "writes on its own. Flags follow etcd's names and Go's syntax (--flag value,\n"
                 "--flag=value, -flag, a bare boolean); a flag not given takes its ETCD_*\n"
                 "variable (--data-dir <- ETCD_DATA_DIR).\n\n");
    for (size_t i = 0; i < NFLAGS; i++)
        if (flags[i].kind != F_IGNORED && flags[i].kind != F_REFUSED)
            fprintf(out, "  --%s\n        %s\n", flags[i].name, flags[i].help);
    fprintf(out, "  --help\n        Show this help.\n  --version\n        Print the version.\n\n"
                 "Accepted for compatibility with etcd, logged at start and ignored:\n");
    for (size_t i = 0; i < NFLAGS; i++)
        if (flags[i].kind == F_IGNORED)
            fprintf(out, "  --%s: %s\n", flags[i].name, flags[i].help);
    fprintf(out, "\nAccepted only at etcd's default (empty, false or off), refused otherwise:\n");
    for (size_t i = 0; i < NFLAGS; i++)
        if (flags[i].kind == F_REFUSED)
            fprintf(out, "  --%s: %s\n", flags[i].name, flags[i].help);
}
