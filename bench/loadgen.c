/* cairn-loadgen: a load generator for etcd's v3 KV API, run unchanged
 * against cairn and against etcd.
 *
 * This file is the command line: flags, the loopback-only rule, the
 * optional preload phase, and the report (human text, JSON or CSV). The
 * engine that talks gRPC is in loadgen_rpc.c; key choice in loadgen_keys.c;
 * the histogram in loadgen_hist.c.
 *
 * The program is bounded: the measured window is at most LG_MAX_SECONDS,
 * the preload phase at most PRELOAD_MAX_S, each call has a deadline, and an
 * alarm() set from those bounds ends the process if anything ever hangs.
 * It only sends to 127.0.0.1, ::1 or localhost unless --allow-remote says
 * otherwise: the team's rule is that load only ever goes to loopback. */
#include <errno.h>
#include <getopt.h>
#include <grpc/grpc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loadgen.h"

#define PRELOAD_MAX_S 120.0
#define PRELOAD_CLIENTS 32

typedef enum out_format { OUT_TEXT, OUT_JSON, OUT_CSV } out_format;

typedef struct options {
    lg_config cfg;
    int preload;
    int allow_remote;
    out_format format;
    int csv_header;
    const char *label;
    const char *cdf_path;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cairn-loadgen [flags]\n"
            "  --endpoint HOST:PORT   etcd/cairn client URL (default 127.0.0.1:2379);\n"
            "                         only 127.0.0.1, ::1, localhost unless --allow-remote\n"
            "  --workload W           a|b|c (YCSB A 50/50, B 95/5 read/update, C read-only),\n"
            "                         load (insert keys 0..keys-1 once), put, range,\n"
            "                         range-prefix (100-key prefix), txn-cas (read, then\n"
            "                         Txn(mod_revision==seen ? put : get), retry)  [put]\n"
            "  --rate R               open loop at R ops/s (latency from the scheduled time)\n"
            "  --clients N            closed loop: N clients as fast as possible [16]\n"
            "  --max-inflight N       open loop: requests in flight at most [4096]\n"
            "  --conns N              gRPC connections [4]\n"
            "  --threads N            completion-queue threads [1]\n"
            "  --duration S           measured seconds [10], at most %.0f\n"
            "  --warmup S             unmeasured seconds before [0]\n"
            "  --timeout S            per-request deadline [5]\n"
            "  --keys N               key space [10000]\n"
            "  --key-size B           [18]    --value-size B  [32]\n"
            "  --dist uniform|zipfian [uniform]   --zipf-theta T [0.99]\n"
            "  --serializable         serializable reads (default linearizable)\n"
            "  --preload              insert every key once (unmeasured) before the run\n"
            "  --seed N               [1]\n"
            "  --format text|json|csv report on stdout [text]; with json/csv the text\n"
            "                         report goes to stderr\n"
            "  --no-header            csv: no header line\n"
            "  --label S              a tag copied into json/csv (e.g. etcd, cairn)\n"
            "  --verify               decode read replies and count those without exactly the\n"
            "                         expected keys (every key must exist: use --preload)\n"
            "  --allow-remote         allow a non-loopback endpoint\n"
            "  --cacert FILE          TLS: trust this CA (https:// endpoints need it)\n"
            "  --cert FILE --key FILE TLS: the client certificate and its key\n"
            "  --first-key N          load: start at key N (insert N..keys-1), to split a\n"
            "                         large load into bounded runs [0]\n"
            "  --cdf FILE             write the latency CDF of all operations to FILE\n"
            "                         (lines: latency_ms fraction_at_or_below)\n",
            LG_MAX_SECONDS);
}

static int parse_double(double *out, const char *s, double lo, double hi)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

static int parse_u64(uint64_t *out, const char *s, uint64_t lo, uint64_t hi)
{
    char *end;
    if (*s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_int(int *out, const char *s, int lo, int hi)
{
    uint64_t v;
    if (parse_u64(&v, s, (uint64_t)lo, (uint64_t)hi) != 0)
        return -1;
    *out = (int)v;
    return 0;
}

/* Splits "[http://]host:port" and checks the loopback rule; builds the
 * gRPC target. */
static int parse_endpoint(lg_config *cfg, const char *ep, int allow_remote)
{
    char host[256];
    const char *p = ep;
    if (strncmp(p, "http://", 7) == 0)
        p += 7;
    if (strncmp(p, "https://", 8) == 0) {
        if (!cfg->cacert) {
            fprintf(stderr, "cairn-loadgen: an https:// endpoint needs --cacert\n");
            return -1;
        }
        p += 8;
    }
    const char *port;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (!close || close[1] != ':')
            goto bad;
        if ((size_t)(close - p - 1) >= sizeof host)
            goto bad;
        memcpy(host, p + 1, (size_t)(close - p - 1));
        host[close - p - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(p, ':');
        if (!colon || (size_t)(colon - p) >= sizeof host)
            goto bad;
        memcpy(host, p, (size_t)(colon - p));
        host[colon - p] = '\0';
        port = colon + 1;
    }
    uint64_t portv;
    if (host[0] == '\0' || parse_u64(&portv, port, 1, 65535) != 0)
        goto bad;
    int v6 = strchr(host, ':') != NULL;
    int loopback = strcmp(host, "127.0.0.1") == 0 || strcmp(host, "::1") == 0 ||
                   strcmp(host, "localhost") == 0;
    if (!loopback && !allow_remote) {
        fprintf(stderr,
                "cairn-loadgen: refusing to send load to %s: only 127.0.0.1, ::1 and localhost "
                "are allowed without --allow-remote\n",
                host);
        return -1;
    }
    snprintf(cfg->endpoint, sizeof cfg->endpoint, "%s", ep);
    if (strcmp(host, "127.0.0.1") == 0)
        snprintf(cfg->target, sizeof cfg->target, "ipv4:127.0.0.1:%u", (unsigned)portv);
    else if (v6)
        snprintf(cfg->target, sizeof cfg->target, "ipv6:[%s]:%u", host, (unsigned)portv);
    else
        snprintf(cfg->target, sizeof cfg->target, "dns:///%s:%u", host, (unsigned)portv);
    return 0;
bad:
    fprintf(stderr, "cairn-loadgen: bad endpoint '%s' (want host:port)\n", ep);
    return -1;
}

enum {
    OPT_ENDPOINT = 256,
    OPT_WORKLOAD,
    OPT_RATE,
    OPT_CLIENTS,
    OPT_MAX_INFLIGHT,
    OPT_CONNS,
    OPT_THREADS,
    OPT_DURATION,
    OPT_WARMUP,
    OPT_TIMEOUT,
    OPT_KEYS,
    OPT_KEY_SIZE,
    OPT_VALUE_SIZE,
    OPT_DIST,
    OPT_THETA,
    OPT_SERIALIZABLE,
    OPT_PRELOAD,
    OPT_SEED,
    OPT_FORMAT,
    OPT_NO_HEADER,
    OPT_LABEL,
    OPT_ALLOW_REMOTE,
    OPT_VERIFY,
    OPT_HELP,
    OPT_CDF,
    OPT_FIRST_KEY,
    OPT_CACERT,
    OPT_CERT,
    OPT_KEY
};

static int parse_args(options *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"endpoint", required_argument, NULL, OPT_ENDPOINT},
        {"workload", required_argument, NULL, OPT_WORKLOAD},
        {"rate", required_argument, NULL, OPT_RATE},
        {"clients", required_argument, NULL, OPT_CLIENTS},
        {"max-inflight", required_argument, NULL, OPT_MAX_INFLIGHT},
        {"conns", required_argument, NULL, OPT_CONNS},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"duration", required_argument, NULL, OPT_DURATION},
        {"warmup", required_argument, NULL, OPT_WARMUP},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"keys", required_argument, NULL, OPT_KEYS},
        {"key-size", required_argument, NULL, OPT_KEY_SIZE},
        {"value-size", required_argument, NULL, OPT_VALUE_SIZE},
        {"dist", required_argument, NULL, OPT_DIST},
        {"zipf-theta", required_argument, NULL, OPT_THETA},
        {"serializable", no_argument, NULL, OPT_SERIALIZABLE},
        {"preload", no_argument, NULL, OPT_PRELOAD},
        {"seed", required_argument, NULL, OPT_SEED},
        {"format", required_argument, NULL, OPT_FORMAT},
        {"no-header", no_argument, NULL, OPT_NO_HEADER},
        {"label", required_argument, NULL, OPT_LABEL},
        {"allow-remote", no_argument, NULL, OPT_ALLOW_REMOTE},
        {"verify", no_argument, NULL, OPT_VERIFY},
        {"help", no_argument, NULL, OPT_HELP},
        {"cdf", required_argument, NULL, OPT_CDF},
        {"first-key", required_argument, NULL, OPT_FIRST_KEY},
        {"cacert", required_argument, NULL, OPT_CACERT},
        {"cert", required_argument, NULL, OPT_CERT},
        {"key", required_argument, NULL, OPT_KEY},
        {NULL, 0, NULL, 0}};
    lg_config *c = &o->cfg;
    const char *endpoint = "127.0.0.1:2379";
    uint64_t u;
    memset(o, 0, sizeof *o);
    c->workload = LG_WL_PUT;
    c->clients = 16;
    c->max_inflight = 4096;
    c->conns = 4;
    c->threads = 1;
    c->duration_s = 10;
    c->timeout_s = 5;
    c->keys = 10000;
    c->key_size = 18;
    c->value_size = 32;
    c->dist = LG_DIST_UNIFORM;
    c->theta = 0.99;
    c->seed = 1;
    o->csv_header = 1;
    o->label = "";
    int opt;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        const char *a = optarg;
        int bad = 0;
        switch (opt) {
        case OPT_ENDPOINT:
            endpoint = a;
            break;
        case OPT_WORKLOAD:
            bad = lg_workload_parse(&c->workload, a);
            break;
        case OPT_RATE:
            bad = parse_double(&c->rate, a, 0.001, 10e6);
            c->open_loop = 1;
            break;
        case OPT_CLIENTS:
            bad = parse_int(&c->clients, a, 1, LG_MAX_CLIENTS);
            break;
        case OPT_MAX_INFLIGHT:
            bad = parse_int(&c->max_inflight, a, 1, LG_MAX_INFLIGHT);
            break;
        case OPT_CONNS:
            bad = parse_int(&c->conns, a, 1, LG_MAX_CONNS);
            break;
        case OPT_THREADS:
            bad = parse_int(&c->threads, a, 1, LG_MAX_THREADS);
            break;
        case OPT_DURATION:
            bad = parse_double(&c->duration_s, a, 0.1, LG_MAX_SECONDS);
            break;
        case OPT_WARMUP:
            bad = parse_double(&c->warmup_s, a, 0, 60);
            break;
        case OPT_TIMEOUT:
            bad = parse_double(&c->timeout_s, a, 0.001, 60);
            break;
        case OPT_KEYS:
            bad = parse_u64(&c->keys, a, 1, LG_MAX_KEYS);
            break;
        case OPT_KEY_SIZE:
            bad = parse_u64(&u, a, 3, LG_MAX_KEY_SIZE);
            c->key_size = (size_t)u;
            break;
        case OPT_VALUE_SIZE:
            bad = parse_u64(&u, a, 0, LG_MAX_VALUE_SIZE);
            c->value_size = (size_t)u;
            break;
        case OPT_DIST:
            if (strcmp(a, "uniform") == 0)
                c->dist = LG_DIST_UNIFORM;
            else if (strcmp(a, "zipfian") == 0 || strcmp(a, "zipf") == 0)
                c->dist = LG_DIST_ZIPFIAN;
            else
                bad = 1;
            break;
        case OPT_THETA:
            bad = parse_double(&c->theta, a, 0.01, 0.9999);
            break;
        case OPT_SERIALIZABLE:
            c->serializable = 1;
            break;
        case OPT_PRELOAD:
            o->preload = 1;
            break;
        case OPT_SEED:
            bad = parse_u64(&c->seed, a, 0, UINT64_MAX);
            break;
        case OPT_FORMAT:
            if (strcmp(a, "text") == 0)
                o->format = OUT_TEXT;
            else if (strcmp(a, "json") == 0)
                o->format = OUT_JSON;
            else if (strcmp(a, "csv") == 0)
                o->format = OUT_CSV;
            else
                bad = 1;
            break;
        case OPT_NO_HEADER:
            o->csv_header = 0;
            break;
        case OPT_LABEL:
            o->label = a;
            break;
        case OPT_ALLOW_REMOTE:
            o->allow_remote = 1;
            break;
        case OPT_VERIFY:
            c->verify = 1;
            break;
        case OPT_CACERT:
            c->cacert = a;
            break;
        case OPT_CERT:
            c->cert = a;
            break;
        case OPT_KEY:
            c->key = a;
            break;
        case OPT_FIRST_KEY:
            bad = parse_u64(&c->first_key, a, 0, LG_MAX_KEYS);
            break;
        case OPT_CDF:
            o->cdf_path = a;
            break;
        case OPT_HELP:
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "cairn-loadgen: bad value '%s' for --%s\n", a,
                    longopts[opt - OPT_ENDPOINT].name);
            return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "cairn-loadgen: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (c->key_size < lg_key_min_size(c->keys)) {
        fprintf(stderr, "cairn-loadgen: --key-size %zu cannot hold %llu distinct keys (need %zu)\n",
                c->key_size, (unsigned long long)c->keys, lg_key_min_size(c->keys));
        return -1;
    }
    if (c->first_key >= c->keys) {
        fprintf(stderr, "cairn-loadgen: --first-key must be below --keys\n");
        return -1;
    }
    if (c->workload == LG_WL_RANGE_PREFIX && (c->keys < 100 || c->key_size < 4)) {
        fprintf(stderr, "cairn-loadgen: range-prefix needs --keys >= 100 and --key-size >= 4\n");
        return -1;
    }
    if (!c->open_loop && c->conns > c->clients)
        c->conns = c->clients;
    if (c->threads > c->conns)
        c->threads = c->conns;
    return parse_endpoint(c, endpoint, o->allow_remote);
}

/* ---- report --------------------------------------------------------------- */

static uint64_t total_errors(const lg_result *r)
{
    uint64_t n = r->cas_exhausted;
    for (int i = 0; i < LG_NCODES; i++)
        n += r->errors[i];
    return n;
}

static double us(uint64_t ns)
{
    return (double)ns / 1000.0;
}
static double throughput(const lg_result *r)
{
    return r->window_s > 0 ? (double)r->ok / r->window_s : 0.0;
}

static const char *mode_name(const lg_config *c)
{
    return c->open_loop ? "open" : "closed";
}

static void print_lat_text(FILE *f, const char *name, const lg_hist *h)
{
    if (h->count == 0)
        return;
    fprintf(f,
            "  %-6s n=%-9llu p50 %9.3f  p90 %9.3f  p99 %9.3f  p99.9 %9.3f  max %9.3f  mean %9.3f\n",
            name, (unsigned long long)h->count, us(lg_hist_percentile(h, 50)) / 1000,
            us(lg_hist_percentile(h, 90)) / 1000, us(lg_hist_percentile(h, 99)) / 1000,
            us(lg_hist_percentile(h, 99.9)) / 1000, us(h->max) / 1000, lg_hist_mean(h) / 1e6);
}

static void print_text(FILE *f, const options *o, const lg_result *r)
{
    const lg_config *c = &o->cfg;
    fprintf(f, "cairn-loadgen: workload %s, %s loop", lg_workload_name(c->workload), mode_name(c));
    if (c->open_loop)
        fprintf(f, " at %.1f ops/s (max %d in flight)", c->rate, c->max_inflight);
    else
        fprintf(f, " with %d clients", c->clients);
    fprintf(f, ", %d conns, %d threads\n", c->conns, c->threads);
    fprintf(f,
            "endpoint %s, %llu keys %s, key %zu B, value %zu B, reads %s, window %.2f s (+%.1f s "
            "warm-up)\n",
            c->endpoint, (unsigned long long)c->keys,
            c->dist == LG_DIST_ZIPFIAN ? "zipfian" : "uniform", c->key_size, c->value_size,
            c->serializable ? "serializable" : "linearizable", r->window_s, c->warmup_s);
    fprintf(f, "ok %llu ops, throughput %.1f ops/s, errors %llu\n", (unsigned long long)r->ok,
            throughput(r), (unsigned long long)total_errors(r));
    for (int i = 0; i < LG_NCODES; i++) {
        if (r->errors[i])
            fprintf(f, "  error %-20s %llu  (first: %s)\n", lg_status_name(i),
                    (unsigned long long)r->errors[i], r->first_error[i]);
    }
    if (c->workload == LG_WL_TXN_CAS)
        fprintf(f,
                "cas: %llu compare failures (retried), %llu ops gave up after %d attempts, %llu "
                "cut short at the end\n",
                (unsigned long long)r->cas_conflicts, (unsigned long long)r->cas_exhausted,
                LG_CAS_MAX_ATTEMPTS, (unsigned long long)r->abandoned);
    if (c->workload == LG_WL_LOAD)
        fprintf(f, "load: %llu of %llu keys inserted%s\n", (unsigned long long)r->inserted,
                (unsigned long long)(c->keys - c->first_key), r->load_done ? "" : " (INCOMPLETE)");
    if (c->verify)
        fprintf(f, "verify: %llu bad read replies%s%s\n", (unsigned long long)r->verify_failures,
                r->verify_failures ? "; first: " : "",
                r->verify_failures ? r->first_verify_failure : "");
    if (c->open_loop) {
        fprintf(f, "open loop: %llu sends >1 ms behind schedule, %llu scheduled sends never made\n",
                (unsigned long long)r->late, (unsigned long long)r->unsent);
        if (r->unsent > 0)
            fprintf(f,
                    "WARNING: the target rate was not held: %d requests in flight were not enough "
                    "(server saturated, or raise --max-inflight)\n",
                    c->max_inflight);
        else if (r->late * 20 > r->ok + r->late)
            fprintf(f, "NOTE: over 5%% of sends left late (loadgen short of CPU?); their latency "
                       "still counts "
                       "from the scheduled time\n");
    }
    fprintf(f, "latency (ms, from the %s time):\n", c->open_loop ? "scheduled send" : "send");
    print_lat_text(f, "all", &r->all);
    if (r->by_kind[LG_KIND_READ].count && r->by_kind[LG_KIND_WRITE].count) {
        print_lat_text(f, "read", &r->by_kind[LG_KIND_READ]);
        print_lat_text(f, "write", &r->by_kind[LG_KIND_WRITE]);
    }
    if (r->drain_timed_out)
        fprintf(f, "WARNING: requests were still in flight after the drain\n");
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_lat(FILE *f, const lg_hist *h)
{
    fprintf(f,
            "{\"count\":%llu,\"p50_us\":%.3f,\"p90_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,"
            "\"max_us\":%.3f,\"min_us\":%.3f,\"mean_us\":%.3f}",
            (unsigned long long)h->count, us(lg_hist_percentile(h, 50)),
            us(lg_hist_percentile(h, 90)), us(lg_hist_percentile(h, 99)),
            us(lg_hist_percentile(h, 99.9)), us(h->max), h->count ? us(h->min) : 0.0,
            lg_hist_mean(h) / 1000.0);
}

static void print_json(FILE *f, const options *o, const lg_result *r)
{
    const lg_config *c = &o->cfg;
    fprintf(f, "{\"label\":");
    json_str(f, o->label);
    fprintf(f, ",\"endpoint\":");
    json_str(f, c->endpoint);
    fprintf(f,
            ",\"workload\":\"%s\",\"mode\":\"%s\",\"rate\":%.3f,\"clients\":%d,\"max_inflight\":%d,"
            "\"conns\":%d,\"threads\":%d,\"duration_s\":%.3f,\"warmup_s\":%.3f,\"window_s\":%.6f,"
            "\"keys\":%llu,\"key_size\":%zu,\"value_size\":%zu,\"dist\":\"%s\",\"zipf_theta\":%.4f,"
            "\"serializable\":%s,\"seed\":%llu,",
            lg_workload_name(c->workload), mode_name(c), c->open_loop ? c->rate : 0.0, c->clients,
            c->max_inflight, c->conns, c->threads, c->duration_s, c->warmup_s, r->window_s,
            (unsigned long long)c->keys, c->key_size, c->value_size,
            c->dist == LG_DIST_ZIPFIAN ? "zipfian" : "uniform", c->theta,
            c->serializable ? "true" : "false", (unsigned long long)c->seed);
    fprintf(f, "\"ok\":%llu,\"throughput\":%.3f,\"errors_total\":%llu,\"errors\":{",
            (unsigned long long)r->ok, throughput(r), (unsigned long long)total_errors(r));
    int first = 1;
    for (int i = 0; i < LG_NCODES; i++) {
        if (!r->errors[i])
            continue;
        fprintf(f, "%s\"%s\":{\"count\":%llu,\"first\":", first ? "" : ",", lg_status_name(i),
                (unsigned long long)r->errors[i]);
        json_str(f, r->first_error[i]);
        fputc('}', f);
        first = 0;
    }
    fprintf(f,
            "},\"cas_conflicts\":%llu,\"cas_exhausted\":%llu,\"abandoned\":%llu,\"late\":%llu,"
            "\"unsent\":%llu,\"inserted\":%llu,\"verify_failures\":%llu,\"latency\":{\"all\":",
            (unsigned long long)r->cas_conflicts, (unsigned long long)r->cas_exhausted,
            (unsigned long long)r->abandoned, (unsigned long long)r->late,
            (unsigned long long)r->unsent, (unsigned long long)r->inserted,
            (unsigned long long)r->verify_failures);
    json_lat(f, &r->all);
    for (int k = 0; k < LG_KIND_COUNT; k++) {
        if (!r->by_kind[k].count)
            continue;
        fprintf(f, ",\"%s\":", lg_kind_name((lg_kind)k));
        json_lat(f, &r->by_kind[k]);
    }
    fprintf(f, "},\"timeline_ops_per_s\":[");
    for (int t = 0; t < r->timeline_len; t++)
        fprintf(f, "%s%llu", t ? "," : "", (unsigned long long)r->timeline[t]);
    /* by slot second: the window's whole seconds (duration), not the drain */
    int slots = (int)(c->duration_s + 0.999);
    if (slots > LG_TIMELINE_MAX)
        slots = LG_TIMELINE_MAX;
    fprintf(f, "],\"window_start_unix\":%.6f,\"timeline_by_slot\":{\"ok\":[", r->window_start_unix);
    for (int t = 0; t < slots; t++)
        fprintf(f, "%s%llu", t ? "," : "", (unsigned long long)r->slot_ok[t]);
    fprintf(f, "],\"errors\":[");
    for (int t = 0; t < slots; t++)
        fprintf(f, "%s%llu", t ? "," : "", (unsigned long long)r->slot_errors[t]);
    fprintf(f, "],\"mean_ms\":[");
    for (int t = 0; t < slots; t++)
        fprintf(f, "%s%.3f", t ? "," : "",
                r->slot_ok[t] ? (double)r->slot_lat_sum[t] / (double)r->slot_ok[t] / 1e6 : 0.0);
    fprintf(f, "],\"max_ms\":[");
    for (int t = 0; t < slots; t++)
        fprintf(f, "%s%.3f", t ? "," : "", (double)r->slot_lat_max[t] / 1e6);
    fprintf(f, "]}}\n");
}

static void print_csv(FILE *f, const options *o, const lg_result *r)
{
    const lg_config *c = &o->cfg;
    if (o->csv_header)
        fprintf(
            f, "label,workload,mode,rate,clients,conns,threads,duration_s,window_s,keys,key_size,"
               "value_size,"
               "dist,serializable,ok,errors,throughput,p50_us,p90_us,p99_us,p999_us,max_us,mean_us,"
               "read_p50_us,read_p99_us,write_p50_us,write_p99_us,late,unsent,cas_conflicts\n");
    const lg_hist *rd = &r->by_kind[LG_KIND_READ], *wr = &r->by_kind[LG_KIND_WRITE];
    /* the label is the caller's; keep the row parseable */
    for (const char *s = o->label; *s; s++)
        fputc(*s == ',' || *s == '\n' ? '_' : *s, f);
    fprintf(f,
            ",%s,%s,%.3f,%d,%d,%d,%.3f,%.6f,%llu,%zu,%zu,%s,%d,%llu,%llu,%.3f,%.3f,%.3f,%.3f,%.3f,%"
            ".3f,%.3f,"
            "%.3f,%.3f,%.3f,%.3f,%llu,%llu,%llu\n",
            lg_workload_name(c->workload), mode_name(c), c->open_loop ? c->rate : 0.0,
            c->open_loop ? 0 : c->clients, c->conns, c->threads, c->duration_s, r->window_s,
            (unsigned long long)c->keys, c->key_size, c->value_size,
            c->dist == LG_DIST_ZIPFIAN ? "zipfian" : "uniform", c->serializable,
            (unsigned long long)r->ok, (unsigned long long)total_errors(r), throughput(r),
            us(lg_hist_percentile(&r->all, 50)), us(lg_hist_percentile(&r->all, 90)),
            us(lg_hist_percentile(&r->all, 99)), us(lg_hist_percentile(&r->all, 99.9)),
            us(r->all.max), lg_hist_mean(&r->all) / 1000.0, us(lg_hist_percentile(rd, 50)),
            us(lg_hist_percentile(rd, 99)), us(lg_hist_percentile(wr, 50)),
            us(lg_hist_percentile(wr, 99)), (unsigned long long)r->late,
            (unsigned long long)r->unsent, (unsigned long long)r->cas_conflicts);
}

/* ---- main ------------------------------------------------------------------ */

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "cairn-loadgen: hard time limit reached, exiting\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(3);
}

static int preload(const options *o)
{
    lg_config pc = o->cfg;
    pc.workload = LG_WL_LOAD;
    pc.first_key = 0;
    pc.open_loop = 0;
    pc.clients = PRELOAD_CLIENTS;
    pc.conns = o->cfg.conns;
    pc.threads = o->cfg.threads;
    pc.duration_s = PRELOAD_MAX_S;
    pc.warmup_s = 0;
    lg_result *r = malloc(sizeof *r);
    if (r == NULL)
        return -1;
    int rc = lg_run(r, &pc);
    if (rc == 0) {
        fprintf(stderr, "cairn-loadgen: preloaded %llu of %llu keys in %.2f s (%llu errors)\n",
                (unsigned long long)r->inserted, (unsigned long long)pc.keys, r->window_s,
                (unsigned long long)total_errors(r));
        if (!r->load_done)
            rc = -1;
        if (r->drain_timed_out) {
            fflush(NULL);
            _exit(3);
        }
    }
    free(r);
    return rc;
}

/* Writes the CDF of |h|: one line per non-empty bucket, the bucket's upper
 * bound in ms and the fraction of values at or below it. */
static int write_cdf(const char *path, const lg_hist *h)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "cairn-loadgen: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "# latency_ms fraction (%llu operations)\n", (unsigned long long)h->count);
    uint64_t seen = 0;
    for (size_t i = 0; i < LG_HIST_BUCKETS && seen < h->count; i++) {
        if (h->buckets[i] == 0)
            continue;
        seen += h->buckets[i];
        uint64_t hi = lg_hist_highest(i);
        if (hi > h->max)
            hi = h->max;
        fprintf(f, "%.4f %.6f\n", (double)hi / 1e6, (double)seen / (double)h->count);
    }
    return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(&o, argc, argv) != 0)
        return 2;
    const lg_config *c = &o.cfg;

    /* Backstop for the hard cap: every phase plus its drain, then some. */
    double limit = (o.preload ? PRELOAD_MAX_S + 2 * (c->timeout_s + 1) + 10 : 0) + c->warmup_s +
                   c->duration_s + 2 * (c->timeout_s + 1) + 30;
    signal(SIGALRM, on_alarm);
    alarm((unsigned)limit + 1);

    grpc_init();
    if (o.preload && preload(&o) != 0) {
        fprintf(stderr, "cairn-loadgen: preload failed\n");
        grpc_shutdown();
        return 1;
    }
    lg_result *r = malloc(sizeof *r);
    if (r == NULL)
        return 1;
    if (lg_run(r, c) != 0) {
        free(r);
        grpc_shutdown();
        return 1;
    }
    FILE *text = o.format == OUT_TEXT ? stdout : stderr;
    print_text(text, &o, r);
    if (o.format == OUT_JSON)
        print_json(stdout, &o, r);
    if (o.format == OUT_CSV)
        print_csv(stdout, &o, r);
    if (o.cdf_path != NULL && write_cdf(o.cdf_path, &r->all) != 0)
        r->ok = 0;
    fflush(NULL);
    int rc = r->ok > 0 && r->verify_failures == 0 ? 0 : 1;
    if (r->drain_timed_out)
        _exit(3);
    free(r);
    grpc_shutdown();
    return rc;
}
