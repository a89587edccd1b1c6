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

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* etcd's defaults (embed/config.go). */
#define DEFAULT_NAME "default"
#define DEFAULT_LISTEN_CLIENT "http://127.0.0.1:2379"
#define DEFAULT_ADVERTISE_CLIENT "http://localhost:2379"
#define DEFAULT_LISTEN_PEER "http://127.0.0.1:2380"
#define DEFAULT_ADVERTISE_PEER "http://localhost:2380"
#define DEFAULT_TOKEN "etcd-cluster"
#define DEFAULT_MAX_REQUEST_BYTES (1536u * 1024u)
#define DEFAULT_MAX_TXN_OPS 128u

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
    F_IGNORED
};

struct flag {
    const char *name;
    enum flag_kind kind;
    const char *help;
};

static const struct flag flags[] = {
    {"name", F_STRING, "Human-readable name for this member (default \"default\")."},
    {"data-dir", F_STRING, "Path to the data directory (default \"${name}.cairn\")."},
    {"listen-client-urls", F_URLS,
     "List of URLs to listen on for client traffic (default \"" DEFAULT_LISTEN_CLIENT "\")."},
    {"advertise-client-urls", F_URLS,
     "List of this member's client URLs to advertise (default \"" DEFAULT_ADVERTISE_CLIENT "\")."},
    {"listen-peer-urls", F_URLS,
     "List of URLs to listen on for peer traffic (default \"" DEFAULT_LISTEN_PEER "\")."},
    {"listen-metrics-urls", F_URLS,
     "List of additional URLs to listen on that answer /metrics and /health (and /version)."},
    {"initial-advertise-peer-urls", F_URLS,
     "List of this member's peer URLs to advertise (default \"" DEFAULT_ADVERTISE_PEER "\")."},
    {"initial-cluster", F_CLUSTER,
     "Initial cluster configuration, name=url,... (default \"${name}=<advertised peer "
     "URLs>\")."},
    {"initial-cluster-state", F_STRING, "Initial cluster state (\"new\" or \"existing\")."},
    {"initial-cluster-token", F_STRING,
     "Initial cluster token; part of the member and cluster ids (default \"etcd-cluster\")."},
    {"max-request-bytes", F_U64,
     "Maximum client request size in bytes the server will accept (default 1572864)."},
    {"max-txn-ops", F_U32,
     "Maximum number of operations permitted in a transaction (default 128)."},
    {"quota-backend-bytes", F_I64,
     "Raise the NOSPACE alarm when the backend size exceeds this (0 = 2 GiB)."},
    {"log-level", F_LOGLEVEL, "debug, info, warn, error, panic or fatal (default info)."},
    {"threads", F_INT, "cairn: gRPC worker threads (default: one per CPU core)."},
    {"experimental-batch-writes", F_BATCH,
     "cairn, for benchmarks only: coalesce up to N concurrent plain Puts into one change\n"
     "        (one revision for all of them, which breaks etcd's one revision per Put;\n"
     "        N <= --max-txn-ops). 0 = off (default)."},
    {"sync-interval-ms", F_SYNC_MS,
     "cairn: period of the Bloom-filter sync with each peer, in ms (default 100)."},
    {"experimental-peer-dial", F_PEER_DIAL,
     "cairn, for tests only: NAME=HOST:PORT dials member NAME at HOST:PORT instead of\n"
     "        its advertised peer URL (e.g. through a fault-injecting proxy); repeatable."},
    {"logger", F_IGNORED, NULL},
    {"log-outputs", F_IGNORED, NULL},
    {"heartbeat-interval", F_IGNORED, NULL},
    {"election-timeout", F_IGNORED, NULL},
    {"snapshot-count", F_IGNORED, NULL},
};

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
    static const char scheme[] = "http://";
    if (strncmp(url, scheme, sizeof scheme - 1) != 0)
        return CAIRN_EINVAL;
    const char *host = url + sizeof scheme - 1;
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
    if (len + 1 > outlen)
        return CAIRN_EINVAL;
    memcpy(out, host, len);
    out[len] = '\0';
    return 0;
}

static int check_urls(char **urls, size_t n, const char *flag, char *err, size_t errlen)
{
    char addr[256];
    for (size_t i = 0; i < n; i++)
        if (cairn_url_to_addr(addr, sizeof addr, urls[i]) != 0)
            return fail(err, errlen,
                        "invalid value \"%s\" for flag --%s: expected http://host:port "
                        "(cairn does not serve TLS yet)",
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

static int apply(cairn_config *cfg, const struct flag *f, const char *v, char *err, size_t errlen)
{
    int rc = 0;
    uint64_t u;
    int64_t i;
    const char *name = f->name;
    switch (f->kind) {
    case F_IGNORED:
        return 0;
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
        m->name = strdup(cfg->name);
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

int cairn_config_parse(cairn_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->max_request_bytes = DEFAULT_MAX_REQUEST_BYTES;
    cfg->max_txn_ops = DEFAULT_MAX_TXN_OPS;
    cfg->log_level = CAIRN_LOG_INFO;
    cfg->sync_interval_ms = 100;
    if (errlen)
        err[0] = '\0';
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (arg[0] != '-' || arg[1] == '\0')
            return fail(err, errlen, "'%s' is not a valid flag", arg);
        const char *name = arg + 1 + (arg[1] == '-');
        if (strcmp(name, "help") == 0 || strcmp(name, "h") == 0)
            return CAIRN_CONFIG_HELP;
        if (strcmp(name, "version") == 0)
            return CAIRN_CONFIG_VERSION;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const struct flag *f = NULL;
        for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
            if (strlen(flags[i].name) == nlen && strncmp(flags[i].name, name, nlen) == 0)
                f = &flags[i];
        if (!f)
            return fail(err, errlen, "flag provided but not defined: %.*s (see --help)",
                        (int)nlen + 1 + (arg[1] == '-'), arg);
        const char *v;
        if (eq)
            v = eq + 1;
        else if (a + 1 < argc)
            v = argv[++a];
        else
            return fail(err, errlen, "flag needs an argument: --%s", f->name);
        int rc = apply(cfg, f, v, err, errlen);
        if (rc != 0) {
            if (rc == CAIRN_ENOMEM)
                snprintf(err, errlen, "out of memory");
            return rc < 0 ? rc : CAIRN_EINVAL;
        }
    }
    int rc = fill_defaults(cfg);
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
    return CAIRN_CONFIG_RUN;
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
    memset(cfg, 0, sizeof *cfg);
}

void cairn_config_usage(FILE *out)
{
    fprintf(out, "Usage: cairn [flags]\n\n"
                 "cairn " CAIRN_VERSION " serves etcd's v3 API (etcd " CAIRN_ETCD_VERSION
                 ") from a CRDT: every node accepts reads and\n"
                 "writes on its own. Flags follow etcd's names; both --flag value and "
                 "--flag=value work.\n\n");
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (flags[i].kind != F_IGNORED)
            fprintf(out, "  --%s\n        %s\n", flags[i].name, flags[i].help);
    fprintf(out, "  --help\n        Show this help.\n  --version\n        Print the version.\n\n"
                 "Accepted for compatibility with etcd and ignored (no raft, plain log "
                 "lines):\n ");
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (flags[i].kind == F_IGNORED)
            fprintf(out, " --%s", flags[i].name);
    fprintf(out, "\n");
}
