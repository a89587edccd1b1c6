/*
 * cairnctl: a command line for cairn's Replication service
 * (proto/cairnpb/replication.proto), with etcdctl's conventions: a
 * comma-separated --endpoints list of which the first that answers is used,
 * -w simple|json|table, "Error: ..." on stderr with exit code 1 for a
 * failed call or no reachable endpoint and 128 for bad arguments (etcdctl
 * 3.4's ExitError and ExitBadArgs, measured).
 *
 * Hashes are printed and read as 64 hex digits. One gRPC call per run, on
 * the gRPC core C API, waited for (rpc/client.h): the calls are unary, so
 * there is nothing to drive in between.
 */

#include <ctype.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cairnpb/replication.pb-c.h"
#include "server/rpc/client.h"

#define EXIT_ERROR 1      /* etcdctl: ExitError */
#define EXIT_BAD_ARGS 128 /* etcdctl: ExitBadArgs */
#define MAX_HEADS 4096

enum { OUT_SIMPLE, OUT_JSON, OUT_TABLE };

typedef struct opts {
    char *endpoints;
    int out;
    long dial_ms, cmd_ms;
} opts;

static void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("Error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

static void usage(FILE *f)
{
    fputs("Usage: cairnctl [--endpoints=127.0.0.1:2379,...] [-w simple|json|table]\n"
          "                [--dial-timeout=2s] [--command-timeout=5s] COMMAND\n"
          "Commands:\n"
          "  heads                                 the member's heads\n"
          "  rev-to-hash REV                       the change that made a local revision\n"
          "  hash-to-rev HASH                      the local revision of a change\n"
          "  status [REV | --heads H,...]          which members hold a state durably\n"
          "  wait [REV | --heads H,...] --n N [--timeout 5s]\n"
          "                                        until N other members hold it durably\n"
          "  get-at-heads KEY [RANGE_END] --heads H,... [--prefix] [--keys-only] [--limit N]\n"
          "                                        the key space at a set of heads\n"
          "With no REV and no --heads, a state is the member's current heads.\n",
          f);
}

/* "5s", "500ms", "2m", or seconds. */
static long parse_ms(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0)
        die(EXIT_BAD_ARGS, "invalid duration %s", s);
    if (!*end || !strcmp(end, "s"))
        return (long)(v * 1000);
    if (!strcmp(end, "ms"))
        return (long)v;
    if (!strcmp(end, "m"))
        return (long)(v * 60000);
    die(EXIT_BAD_ARGS, "invalid duration %s", s);
}

static int64_t parse_int(const char *s, const char *what)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end)
        die(EXIT_BAD_ARGS, "bad %s %s", what, s);
    return v;
}

static void parse_hash(uint8_t out[32], const char *s, size_t len)
{
    if (len != 64)
        die(EXIT_BAD_ARGS, "a change hash is 64 hex digits: %.*s", (int)len, s);
    for (size_t i = 0; i < 32; i++) {
        unsigned v;
        char two[3] = {s[2 * i], s[2 * i + 1], 0};
        if (!isxdigit((unsigned char)two[0]) || !isxdigit((unsigned char)two[1]) ||
            sscanf(two, "%x", &v) != 1)
            die(EXIT_BAD_ARGS, "a change hash is 64 hex digits: %.*s", (int)len, s);
        out[i] = (uint8_t)v;
    }
}

/* "h1,h2,...": the hashes as protobuf bytes (static storage). */
static size_t parse_heads(ProtobufCBinaryData *out, const char *list)
{
    static uint8_t buf[MAX_HEADS][32];
    size_t n = 0;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len) {
            if (n == MAX_HEADS)
                die(EXIT_BAD_ARGS, "too many heads");
            parse_hash(buf[n], p, len);
            out[n].data = buf[n];
            out[n].len = 32;
            n++;
        }
        p += len + (e ? 1 : 0);
    }
    if (!n)
        die(EXIT_BAD_ARGS, "--heads needs at least one hash");
    return n;
}

static void hex(const ProtobufCBinaryData *b)
{
    for (size_t i = 0; i < b->len; i++)
        printf("%02x", b->data[i]);
}

/* A JSON string of bytes: printable ASCII as is, the rest escaped. */
static void json_str(const uint8_t *p, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '"' || p[i] == '\\')
            printf("\\%c", p[i]);
        else if (p[i] < 0x20 || p[i] >= 0x7f)
            printf("\\u%04x", p[i]);
        else
            putchar(p[i]);
    }
    putchar('"');
}

static void json_heads(const char *name, ProtobufCBinaryData *h, size_t n)
{
    printf("\"%s\":[", name);
    for (size_t i = 0; i < n; i++) {
        printf(i ? ",\"" : "\"");
        hex(&h[i]);
        putchar('"');
    }
    putchar(']');
}

/* ---- one unary call ------------------------------------------------------------------------ */

typedef rpc_client_reply reply;

static gpr_timespec in_ms(long ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Calls |method| on |target|; 0 with *r filled (status OK or not), or -1
 * when the endpoint could not be reached within the dial timeout. */
static int call_one(reply *r, const opts *o, const char *target, const char *method,
                    const uint8_t *req, size_t len, long extra_ms)
{
    memset(r, 0, sizeof *r);
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, cr, NULL);
    grpc_channel_credentials_release(cr);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    /* the dial: wait until the channel is ready or the dial timeout */
    gpr_timespec dial_dl = in_ms(o->dial_ms);
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(ch, 1);
    while (st != GRPC_CHANNEL_READY) {
        grpc_channel_watch_connectivity_state(ch, st, dial_dl, cq, (void *)1);
        grpc_event ev =
            grpc_completion_queue_pluck(cq, (void *)1, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (!ev.success)
            break; /* timed out */
        st = grpc_channel_check_connectivity_state(ch, 1);
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    int rc = -1;
    if (st == GRPC_CHANNEL_READY &&
        rpc_client_unary(r, ch, method, req, len, o->cmd_ms + extra_ms) == 0)
        rc = 0;
    grpc_channel_destroy(ch);
    return rc;
}

/* The first endpoint that answers; a failed status is fatal (etcdctl's
 * "Error: <the server's message>"). Returns the reply bytes. */
static reply call(const opts *o, const char *method, const ProtobufCMessage *req, long extra_ms)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    protobuf_c_message_pack(req, buf);
    char *list = strdup(o->endpoints);
    reply r;
    int reached = 0;
    for (char *save = NULL, *ep = strtok_r(list, ",", &save); ep && !reached;
         ep = strtok_r(NULL, ",", &save)) {
        if (!strncmp(ep, "http://", 7))
            ep += 7;
        else if (!strncmp(ep, "https://", 8))
            die(EXIT_BAD_ARGS, "cairnctl speaks plaintext only: %s", ep);
        reached = call_one(&r, o, ep, method, buf, len, extra_ms) == 0;
    }
    free(list);
    free(buf);
    if (!reached)
        die(EXIT_ERROR, "context deadline exceeded"); /* etcdctl's words for no endpoint */
    if (r.status != GRPC_STATUS_OK)
        die(EXIT_ERROR, "%s", r.details && *r.details ? r.details : "rpc failed");
    return r;
}

/* The reply decoded into |m|; its bytes are freed. */
#define UNPACK(type, fn, r)                                                                        \
    type *m = fn(NULL, (r).len, (r).bytes);                                                        \
    rpc_client_reply_destroy(&(r));                                                                \
    if (!m)                                                                                        \
        die(EXIT_ERROR, "cannot decode the response");

/* ---- the commands ------------------------------------------------------------------------- */

static void table_line(const int *w, int ncol)
{
    for (int i = 0; i < ncol; i++) {
        putchar('+');
        for (int j = 0; j < w[i] + 2; j++)
            putchar('-');
    }
    puts("+");
}

static void table_row(const int *w, int ncol, const char *const *cells)
{
    for (int i = 0; i < ncol; i++)
        printf("| %-*s ", w[i], cells[i]);
    puts("|");
}

static void cmd_heads(const opts *o)
{
    Cairnpb__HeadsRequest q = CAIRNPB__HEADS_REQUEST__INIT;
    reply r = call(o, "/cairnpb.Replication/Heads", &q.base, 0);
    UNPACK(Cairnpb__HeadsResponse, cairnpb__heads_response__unpack, r);
    if (o->out == OUT_JSON) {
        printf("{\"member_id\":%" PRIu64 ",", m->member_id);
        json_heads("heads", m->heads, m->n_heads);
        puts("}");
    } else if (o->out == OUT_TABLE) {
        int w[1] = {64};
        const char *hdr[1] = {"HEAD"};
        table_line(w, 1);
        table_row(w, 1, hdr);
        table_line(w, 1);
        for (size_t i = 0; i < m->n_heads; i++) {
            printf("| ");
            hex(&m->heads[i]);
            puts(" |");
        }
        table_line(w, 1);
    } else {
        for (size_t i = 0; i < m->n_heads; i++) {
            hex(&m->heads[i]);
            putchar('\n');
        }
    }
    cairnpb__heads_response__free_unpacked(m, NULL);
}

static void cmd_rev_to_hash(const opts *o, int64_t rev)
{
    Cairnpb__RevisionToHashRequest q = CAIRNPB__REVISION_TO_HASH_REQUEST__INIT;
    q.revision = rev;
    reply r = call(o, "/cairnpb.Replication/RevisionToHash", &q.base, 0);
    UNPACK(Cairnpb__RevisionToHashResponse, cairnpb__revision_to_hash_response__unpack, r);
    if (o->out == OUT_JSON) {
        printf("{\"member_id\":%" PRIu64 ",\"revision\":%" PRId64 ",\"hash\":\"", m->member_id,
               rev);
        hex(&m->hash);
        puts("\"}");
    } else {
        hex(&m->hash);
        putchar('\n');
    }
    cairnpb__revision_to_hash_response__free_unpacked(m, NULL);
}

static void cmd_hash_to_rev(const opts *o, const char *h)
{
    uint8_t b[32];
    parse_hash(b, h, strlen(h));
    Cairnpb__HashToRevisionRequest q = CAIRNPB__HASH_TO_REVISION_REQUEST__INIT;
    q.hash.data = b;
    q.hash.len = 32;
    reply r = call(o, "/cairnpb.Replication/HashToRevision", &q.base, 0);
    UNPACK(Cairnpb__HashToRevisionResponse, cairnpb__hash_to_revision_response__unpack, r);
    if (o->out == OUT_JSON)
        printf("{\"member_id\":%" PRIu64 ",\"revision\":%" PRId64 ",\"took_revision\":%s}\n",
               m->member_id, m->revision, m->took_revision ? "true" : "false");
    else
        printf("%" PRId64 "%s\n", m->revision,
               m->took_revision ? "" : " (the change made no revision of its own)");
    cairnpb__hash_to_revision_response__free_unpacked(m, NULL);
}

static void cmd_status(const opts *o, int64_t rev, ProtobufCBinaryData *heads, size_t nh)
{
    Cairnpb__StatusRequest q = CAIRNPB__STATUS_REQUEST__INIT;
    q.revision = rev;
    q.heads = heads;
    q.n_heads = nh;
    reply r = call(o, "/cairnpb.Replication/ReplicationStatus", &q.base, 0);
    UNPACK(Cairnpb__StatusResponse, cairnpb__status_response__unpack, r);
    if (o->out == OUT_JSON) {
        printf("{\"member_id\":%" PRIu64 ",", m->member_id);
        json_heads("heads", m->heads, m->n_heads);
        printf(",\"holding\":%u,\"members\":[", m->holding);
        for (size_t i = 0; i < m->n_members; i++) {
            const Cairnpb__MemberStatus *s = m->members[i];
            printf("%s{\"ID\":%" PRIu64 ",\"name\":", i ? "," : "", s->id);
            json_str((const uint8_t *)s->name, strlen(s->name));
            printf(",\"holds\":%s,\"self\":%s,\"connected\":%s,", s->holds ? "true" : "false",
                   s->is_self ? "true" : "false", s->connected ? "true" : "false");
            json_heads("acked_heads", s->acked_heads, s->n_acked_heads);
            putchar('}');
        }
        puts("]}");
    } else if (o->out == OUT_TABLE) {
        int w[4] = {16, 4, 5, 9};
        for (size_t i = 0; i < m->n_members; i++)
            if ((int)strlen(m->members[i]->name) > w[1])
                w[1] = (int)strlen(m->members[i]->name);
        const char *hdr[4] = {"ID", "NAME", "HOLDS", "CONNECTED"};
        table_line(w, 4);
        table_row(w, 4, hdr);
        table_line(w, 4);
        for (size_t i = 0; i < m->n_members; i++) {
            const Cairnpb__MemberStatus *s = m->members[i];
            char id[17];
            snprintf(id, sizeof id, "%" PRIx64, s->id);
            const char *row[4] = {id, s->name, s->holds ? "true" : "false",
                                  s->is_self     ? "self"
                                  : s->connected ? "true"
                                                 : "false"};
            table_row(w, 4, row);
        }
        table_line(w, 4);
    } else {
        /* etcdctl member list's simple form: comma-separated fields */
        for (size_t i = 0; i < m->n_members; i++) {
            const Cairnpb__MemberStatus *s = m->members[i];
            printf("%" PRIx64 ", %s, %s, %s\n", s->id, s->name, s->holds ? "holds" : "lacks",
                   s->is_self     ? "self"
                   : s->connected ? "connected"
                                  : "disconnected");
        }
    }
    cairnpb__status_response__free_unpacked(m, NULL);
}

static void cmd_wait(const opts *o, int64_t rev, ProtobufCBinaryData *heads, size_t nh, long n,
                     long timeout_ms)
{
    Cairnpb__WaitRequest q = CAIRNPB__WAIT_REQUEST__INIT;
    q.revision = rev;
    q.heads = heads;
    q.n_heads = nh;
    q.n = (uint32_t)n;
    q.timeout_ms = (uint32_t)timeout_ms;
    reply r = call(o, "/cairnpb.Replication/WaitReplicated", &q.base, timeout_ms);
    UNPACK(Cairnpb__WaitResponse, cairnpb__wait_response__unpack, r);
    if (o->out == OUT_JSON) {
        putchar('{');
        json_heads("heads", m->heads, m->n_heads);
        printf(",\"holding\":%u,\"members\":[", m->holding);
        for (size_t i = 0; i < m->n_members; i++)
            printf("%s%" PRIu64, i ? "," : "", m->members[i]);
        puts("]}");
    } else {
        printf("replicated on %u members:", m->holding);
        for (size_t i = 0; i < m->n_members; i++)
            printf("%s%" PRIx64, i ? "," : " ", m->members[i]);
        putchar('\n');
    }
    cairnpb__wait_response__free_unpacked(m, NULL);
}

/* etcd's prefix rule: the key with its last byte below 0xff incremented. */
static size_t prefix_end(uint8_t *out, const char *key)
{
    size_t n = strlen(key);
    memcpy(out, key, n);
    while (n && out[n - 1] == 0xff)
        n--;
    if (!n) {
        out[0] = 0;
        return 1;
    }
    out[n - 1]++;
    return n;
}

static void cmd_get_at_heads(const opts *o, const char *key, const char *end, int prefix,
                             int keys_only, int64_t limit, ProtobufCBinaryData *heads, size_t nh)
{
    Cairnpb__RangeRequest q = CAIRNPB__RANGE_REQUEST__INIT;
    q.heads = heads;
    q.n_heads = nh;
    q.key.data = (uint8_t *)key;
    q.key.len = strlen(key);
    uint8_t *pe = malloc(strlen(key) + 1);
    if (prefix) {
        q.range_end.data = pe;
        q.range_end.len = prefix_end(pe, key);
    } else if (end) {
        q.range_end.data = (uint8_t *)end;
        q.range_end.len = strlen(end);
    }
    q.limit = limit;
    q.keys_only = keys_only;
    reply r = call(o, "/cairnpb.Replication/Range", &q.base, 0);
    free(pe);
    UNPACK(Cairnpb__RangeResponse, cairnpb__range_response__unpack, r);
    if (o->out == OUT_JSON) {
        printf("{\"member_id\":%" PRIu64 ",\"revision\":%" PRId64 ",\"count\":%" PRId64
               ",\"more\":%s,\"kvs\":[",
               m->member_id, m->revision, m->count, m->more ? "true" : "false");
        for (size_t i = 0; i < m->n_kvs; i++) {
            printf("%s{\"key\":", i ? "," : "");
            json_str(m->kvs[i]->key.data, m->kvs[i]->key.len);
            if (!keys_only) {
                printf(",\"value\":");
                json_str(m->kvs[i]->value.data, m->kvs[i]->value.len);
            }
            printf(",\"lease\":%" PRId64 "}", m->kvs[i]->lease);
        }
        puts("]}");
    } else {
        /* etcdctl get's simple form: key, then value, one line each */
        for (size_t i = 0; i < m->n_kvs; i++) {
            fwrite(m->kvs[i]->key.data, 1, m->kvs[i]->key.len, stdout);
            putchar('\n');
            if (!keys_only) {
                fwrite(m->kvs[i]->value.data, 1, m->kvs[i]->value.len, stdout);
                putchar('\n');
            }
        }
    }
    cairnpb__range_response__free_unpacked(m, NULL);
}

/* ---- arguments ---------------------------------------------------------------------------- */

/* --name=value or --name value; *i advanced past what was used. */
static const char *flag_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n))
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n])
        return NULL;
    if (*i + 1 >= argc)
        die(EXIT_BAD_ARGS, "flag needs an argument: %s", name);
    return argv[++*i];
}

int main(int argc, char **argv)
{
    opts o = {"127.0.0.1:2379", OUT_SIMPLE, 2000, 5000};
    const char *env = getenv("ETCDCTL_ENDPOINTS");
    if (env && *env)
        o.endpoints = (char *)env;
    const char *pos[4] = {0};
    int npos = 0, prefix = 0, keys_only = 0;
    long n = -1, timeout_ms = 5000;
    int64_t limit = 0;
    static ProtobufCBinaryData heads[MAX_HEADS];
    size_t nh = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if ((v = flag_value(argc, argv, &i, "--endpoints"))) {
            o.endpoints = (char *)v;
        } else if ((v = flag_value(argc, argv, &i, "-w")) ||
                   (v = flag_value(argc, argv, &i, "--write-out"))) {
            if (!strcmp(v, "simple"))
                o.out = OUT_SIMPLE;
            else if (!strcmp(v, "json"))
                o.out = OUT_JSON;
            else if (!strcmp(v, "table"))
                o.out = OUT_TABLE;
            else
                die(EXIT_BAD_ARGS, "unsupported output format %s", v);
        } else if ((v = flag_value(argc, argv, &i, "--dial-timeout"))) {
            o.dial_ms = parse_ms(v);
        } else if ((v = flag_value(argc, argv, &i, "--command-timeout"))) {
            o.cmd_ms = parse_ms(v);
        } else if ((v = flag_value(argc, argv, &i, "--heads"))) {
            nh = parse_heads(heads, v);
        } else if ((v = flag_value(argc, argv, &i, "--n"))) {
            n = (long)parse_int(v, "--n");
        } else if ((v = flag_value(argc, argv, &i, "--timeout"))) {
            timeout_ms = parse_ms(v);
        } else if ((v = flag_value(argc, argv, &i, "--limit"))) {
            limit = parse_int(v, "--limit");
        } else if (!strcmp(argv[i], "--prefix")) {
            prefix = 1;
        } else if (!strcmp(argv[i], "--keys-only")) {
            keys_only = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            die(EXIT_BAD_ARGS, "unknown flag: %s", argv[i]);
        } else if (npos < 4) {
            pos[npos++] = argv[i];
        } else {
            die(EXIT_BAD_ARGS, "too many arguments");
        }
    }
    if (!npos) {
        usage(stderr);
        return EXIT_BAD_ARGS;
    }
    const char *cmd = pos[0];
    grpc_init();
    if (!strcmp(cmd, "heads")) {
        cmd_heads(&o);
    } else if (!strcmp(cmd, "rev-to-hash")) {
        if (npos != 2)
            die(EXIT_BAD_ARGS, "rev-to-hash command needs one argument as revision");
        cmd_rev_to_hash(&o, parse_int(pos[1], "revision"));
    } else if (!strcmp(cmd, "hash-to-rev")) {
        if (npos != 2)
            die(EXIT_BAD_ARGS, "hash-to-rev command needs one argument as change hash");
        cmd_hash_to_rev(&o, pos[1]);
    } else if (!strcmp(cmd, "status") || !strcmp(cmd, "wait")) {
        if (npos > 2 || (npos == 2 && nh))
            die(EXIT_BAD_ARGS, "%s command takes a revision or --heads, not both", cmd);
        int64_t rev = npos == 2 ? parse_int(pos[1], "revision") : 0;
        if (!strcmp(cmd, "status")) {
            cmd_status(&o, rev, heads, nh);
        } else {
            if (n < 0)
                die(EXIT_BAD_ARGS, "wait command needs --n, the members to wait for");
            cmd_wait(&o, rev, heads, nh, n, timeout_ms);
        }
    } else if (!strcmp(cmd, "get-at-heads")) {
        if (npos < 2 || npos > 3)
            die(EXIT_BAD_ARGS,
                "get-at-heads command needs one argument as key and an optional argument as "
                "range_end");
        if (!nh)
            die(EXIT_BAD_ARGS, "get-at-heads command needs --heads");
        if (prefix && npos == 3)
            die(EXIT_BAD_ARGS,
                "too many arguments, only accept one argument when `--prefix` is set.");
        cmd_get_at_heads(&o, pos[1], npos == 3 ? pos[2] : NULL, prefix, keys_only, limit, heads,
                         nh);
    } else {
        fprintf(stderr,
                "Error: unknown command \"%s\" for \"cairnctl\"\n"
                "Run 'cairnctl --help' for usage.\n",
                cmd);
        return EXIT_ERROR;
    }
    grpc_shutdown();
    return 0;
}
