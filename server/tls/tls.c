/*
 * TLS policy for both links (tls.h), on OpenSSL. The peer links run their
 * TLS inside gRPC (peer/peer.c) and the client links here; the decisions
 * that must agree between them — which cipher names mean what, how an
 * auto-TLS certificate looks, and when a peer's certificate is refused —
 * are made only in this file.
 *
 * THE CHECKS. cairn_tls_check_pem runs after a handshake on a certificate
 * the other side presented: the chain to the trusted CA with the validity
 * dates (gRPC checked it already on a peer link, but the reason it gives
 * is lost; here it is etcd's), then the CRL by serial number as etcd's
 * listener does it (any entry with the serial revokes the certificate,
 * whoever issued the list), then --peer-cert-allowed-cn and
 * --peer-cert-allowed-hostname.
 *
 * THE PUMP. One thread and one epoll set for every client TLS connection.
 * A connection is a nonblocking TLS socket and the near end of a
 * socketpair; the far end goes to the listener at once, and bytes appear on
 * it only once the handshake and the checks passed. Each direction has one
 * buffer of PUMP_BUF bytes: the pump reads a side only while that
 * direction's buffer is empty, so a slow reader holds the sender back
 * through TCP instead of through memory (at most 2 * PUMP_BUF per
 * connection). Interest is level-triggered and recomputed after each
 * service of a connection, which makes at most PUMP_ROUNDS passes before
 * yielding to the next ready connection.
 *
 * THE CN OF A CALL. gRPC names a connection it was handed by its fd
 * ("fd:<n>"), and an fd number is reused as soon as it is closed: the
 * listener's end may be closed and its number given to a later
 * connection (TLS or not) while the pump still holds the old one, whose
 * TLS side can stay open. So a connection is found by its fd number and
 * the socket's cookie (SO_COOKIE, unique for the boot and never reused),
 * read back from the fd at lookup, and it forgets its CN once the
 * listener's end is closed.
 */
#include "server/tls/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crdt/error.h"
#include "server/server.h"

#define PUMP_BUF 16384
#define PUMP_ROUNDS 8
#define PUMP_HANDSHAKE_MS 10000

#ifndef SO_COOKIE
#define SO_COOKIE 57 /* Linux 4.12 */
#endif

/* ---- cipher suites ----------------------------------------------------- */

/* etcd: --cipher-suites takes the names of Go's crypto/tls (TLS 1.3 ones
 * included, which Go does not let a config restrict). */
static const struct {
    const char *go, *openssl;
} suites[] = {
    {"TLS_RSA_WITH_RC4_128_SHA", "RC4-SHA"},
    {"TLS_RSA_WITH_3DES_EDE_CBC_SHA", "DES-CBC3-SHA"},
    {"TLS_RSA_WITH_AES_128_CBC_SHA", "AES128-SHA"},
    {"TLS_RSA_WITH_AES_256_CBC_SHA", "AES256-SHA"},
    {"TLS_RSA_WITH_AES_128_CBC_SHA256", "AES128-SHA256"},
    {"TLS_RSA_WITH_AES_128_GCM_SHA256", "AES128-GCM-SHA256"},
    {"TLS_RSA_WITH_AES_256_GCM_SHA384", "AES256-GCM-SHA384"},
    {"TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", "ECDHE-ECDSA-RC4-SHA"},
    {"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", "ECDHE-ECDSA-AES128-SHA"},
    {"TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", "ECDHE-ECDSA-AES256-SHA"},
    {"TLS_ECDHE_RSA_WITH_RC4_128_SHA", "ECDHE-RSA-RC4-SHA"},
    {"TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", "ECDHE-RSA-DES-CBC3-SHA"},
    {"TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "ECDHE-RSA-AES128-SHA"},
    {"TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", "ECDHE-RSA-AES256-SHA"},
    {"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", "ECDHE-ECDSA-AES128-SHA256"},
    {"TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", "ECDHE-RSA-AES128-SHA256"},
    {"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-GCM-SHA256"},
    {"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256"},
    {"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "ECDHE-RSA-AES256-GCM-SHA384"},
    {"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "ECDHE-ECDSA-AES256-GCM-SHA384"},
    {"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", "ECDHE-RSA-CHACHA20-POLY1305"},
    {"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-RSA-CHACHA20-POLY1305"},
    {"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", "ECDHE-ECDSA-CHACHA20-POLY1305"},
    {"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305"},
    {"TLS_AES_128_GCM_SHA256", NULL},
    {"TLS_AES_256_GCM_SHA384", NULL},
    {"TLS_CHACHA20_POLY1305_SHA256", NULL},
};

int cairn_tls_grpc_ciphers(const struct cairn_config *cfg, int set_env, char *err, size_t errlen)
{
    if (!cfg->ncipher_suites)
        return 0;
    char list[2048];
    int only13;
    int rc =
        cairn_tls_cipher_list(list, sizeof list, &only13, (const char *const *)cfg->cipher_suites,
                              cfg->ncipher_suites, err, errlen);
    /* read by gRPC when it first makes TLS credentials; it has no
     * setting for TLS 1.3's suites */
    if (!rc && set_env && !only13)
        setenv("GRPC_SSL_CIPHER_SUITES", list, 1);
    return rc;
}

int cairn_tls_cipher_list(char *out, size_t outlen, int *tls13_only, const char *const *names,
                          size_t nnames, char *err, size_t errlen)
{
    size_t len = 0;
    int any12 = 0;
    *tls13_only = 0;
    if (outlen)
        out[0] = '\0';
    for (size_t k = 0; k < nnames; k++) {
        size_t i = 0;
        while (i < sizeof suites / sizeof suites[0] && strcmp(suites[i].go, names[k]) != 0)
            i++;
        if (i == sizeof suites / sizeof suites[0]) {
            /* etcd: `unexpected TLS cipher suite "X"`, at start */
            snprintf(err, errlen, "unexpected TLS cipher suite \"%s\"", names[k]);
            return CAIRN_EINVAL;
        }
        if (!suites[i].openssl)
            continue;
        size_t n = strlen(suites[i].openssl);
        if (len + n + 2 > outlen) {
            snprintf(err, errlen, "--cipher-suites: too many suites");
            return CAIRN_EINVAL;
        }
        if (len)
            out[len++] = ':';
        memcpy(out + len, suites[i].openssl, n + 1);
        len += n;
        any12 = 1;
    }
    *tls13_only = nnames && !any12;
    return 0;
}

/* ---- auto TLS ---------------------------------------------------------- */

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int mkdirs(const char *dir)
{
    char path[4096];
    if (strlen(dir) >= sizeof path)
        return -1;
    strcpy(path, dir);
    for (char *p = path + 1;; p++)
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(path, 0700) != 0 && errno != EEXIST)
                return -1;
            *p = saved;
            if (!saved)
                return 0;
        }
}

static int is_ip(const char *host)
{
    unsigned char buf[16];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

static int add_ext(X509 *x, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!ext)
        return -1;
    int ok = X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    return ok ? 0 : -1;
}

static int write_pem(const char *path, mode_t mode, X509 *x, EVP_PKEY *k)
{
    BIO *b = BIO_new(BIO_s_mem());
    int ok = b && (x ? PEM_write_bio_X509(b, x)
                     : PEM_write_bio_PrivateKey_traditional(b, k, NULL, NULL, 0, 0, 0));
    char *data = NULL;
    long len = ok ? BIO_get_mem_data(b, &data) : 0;
    int fd = ok ? open(path, O_WRONLY | O_CREAT | O_TRUNC, mode) : -1;
    ok = fd >= 0 && len > 0 && write(fd, data, (size_t)len) == (ssize_t)len;
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    BIO_free(b);
    return ok ? 0 : -1;
}

int cairn_tls_self_cert(const char *dir, const char *const *hosts, size_t nhosts, char *err,
                        size_t errlen)
{
    char cert[4096], key[4096];
    snprintf(cert, sizeof cert, "%s/cert.pem", dir);
    snprintf(key, sizeof key, "%s/key.pem", dir);
    if (exists(cert) && exists(key))
        return 0; /* etcd: kept across restarts */
    if (mkdirs(dir) != 0) {
        snprintf(err, errlen, "cannot generate cert: mkdir %s: %s", dir, strerror(errno));
        return CAIRN_EIO;
    }
    int rc = CAIRN_EIO;
    char san[4096] = "";
    size_t sl = 0;
    for (size_t i = 0; i < nhosts; i++) {
        int ip = is_ip(hosts[i]);
        int n = snprintf(san + sl, sizeof san - sl, "%s%s:%s", sl ? "," : "", ip ? "IP" : "DNS",
                         hosts[i]);
        if (n < 0 || (size_t)n >= sizeof san - sl)
            break;
        sl += (size_t)n;
    }
    EVP_PKEY *k = EVP_EC_gen("P-521");
    X509 *x = X509_new();
    BIGNUM *bn = BN_new();
    ASN1_INTEGER *serial = NULL;
    if (!k || !x || !bn || !BN_rand(bn, 128, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
        !(serial = BN_to_ASN1_INTEGER(bn, NULL)))
        goto out;
    X509_NAME *name = X509_get_subject_name(x);
    if (!X509_set_version(x, 2) || !X509_set_serialNumber(x, serial) ||
        !X509_gmtime_adj(X509_getm_notBefore(x), 0) ||
        !X509_gmtime_adj(X509_getm_notAfter(x), 365L * 24 * 3600) ||
        !X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"etcd", -1, -1,
                                    0) ||
        !X509_set_issuer_name(x, name) || !X509_set_pubkey(x, k))
        goto out;
    if (add_ext(x, NID_key_usage, "critical,digitalSignature,keyEncipherment") ||
        add_ext(x, NID_ext_key_usage, "serverAuth") ||
        add_ext(x, NID_basic_constraints, "critical,CA:FALSE") ||
        (sl && add_ext(x, NID_subject_alt_name, san)))
        goto out;
    if (!X509_sign(x, k, EVP_sha512()))
        goto out;
    if (write_pem(key, 0600, NULL, k) || write_pem(cert, 0644, x, NULL)) {
        snprintf(err, errlen, "cannot generate cert: write %s: %s", dir, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (rc && !err[0])
        snprintf(err, errlen, "cannot generate cert in %s: openssl failed", dir);
    ASN1_INTEGER_free(serial);
    BN_free(bn);
    X509_free(x);
    EVP_PKEY_free(k);
    return rc;
}

int cairn_tls_url_host(char *out, size_t outlen, const char *url)
{
    const char *h = strstr(url, "://");
    h = h ? h + 3 : url;
    const char *end;
    if (*h == '[') {
        h++;
        end = strchr(h, ']');
    } else {
        end = strrchr(h, ':');
        const char *slash = strchr(h, '/');
        if (!end || (slash && slash < end))
            end = slash ? slash : h + strlen(h);
    }
    if (!end || end == h || (size_t)(end - h) >= outlen)
        return -1;
    memcpy(out, h, (size_t)(end - h));
    out[end - h] = '\0';
    return 0;
}

int cairn_tls_options_from(cairn_tls_options *o, cairn_tls_paths *paths,
                           const struct cairn_config *cfg, const struct cairn_tls_config *t,
                           const char *side, char *const *urls, size_t nurls, char *err,
                           size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->cert_file = t->cert_file;
    o->key_file = t->key_file;
    o->trusted_ca_file = t->trusted_ca_file;
    o->crl_file = t->crl_file;
    o->client_cert_auth = t->client_cert_auth;
    o->allowed_cn = t->allowed_cn;
    o->allowed_hostname = t->allowed_hostname;
    o->cipher_suites = (const char *const *)cfg->cipher_suites;
    o->ncipher_suites = cfg->ncipher_suites;
    if (!t->auto_tls || (t->cert_file && t->key_file))
        return 0; /* etcd: given files win over --auto-tls */
    char dir[4000];
    snprintf(dir, sizeof dir, "%s/fixtures/%s", cfg->data_dir, side);
    const char *hosts[16];
    char hbuf[16][256];
    size_t nh = 0;
    for (size_t i = 0; i < nurls && nh < 16; i++)
        if (cairn_tls_url_host(hbuf[nh], sizeof hbuf[nh], urls[i]) == 0) {
            size_t j = 0;
            while (j < nh && strcmp(hosts[j], hbuf[nh]) != 0)
                j++;
            if (j == nh) {
                hosts[nh] = hbuf[nh];
                nh++;
            }
        }
    int rc = cairn_tls_self_cert(dir, hosts, nh, err, errlen);
    if (rc)
        return rc;
    snprintf(paths->cert, sizeof paths->cert, "%s/cert.pem", dir);
    snprintf(paths->key, sizeof paths->key, "%s/key.pem", dir);
    o->cert_file = paths->cert;
    o->key_file = paths->key;
    /* etcd: an auto-TLS side trusts no CA (peers skip verification) */
    o->trusted_ca_file = NULL;
    return 0;
}

/* ---- checking a peer's certificate ------------------------------------- */

struct cairn_tls_checker {
    X509_STORE *store; /* NULL: no trusted CA given */
    STACK_OF(X509_CRL) * crls;
    char *allowed_cn, *allowed_hostname;
};

void cairn_tls_checker_free(cairn_tls_checker *c)
{
    if (!c)
        return;
    X509_STORE_free(c->store);
    sk_X509_CRL_pop_free(c->crls, X509_CRL_free);
    free(c->allowed_cn);
    free(c->allowed_hostname);
    free(c);
}

static int load_crls(cairn_tls_checker *c, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    c->crls = sk_X509_CRL_new_null();
    X509_CRL *crl;
    while (c->crls && (crl = PEM_read_X509_CRL(f, NULL, NULL, NULL)))
        if (!sk_X509_CRL_push(c->crls, crl))
            X509_CRL_free(crl);
    ERR_clear_error(); /* the end of the file */
    fclose(f);
    if (c->crls && sk_X509_CRL_num(c->crls) == 0) {
        /* etcd reads a DER CRL as well */
        f = fopen(path, "rb");
        crl = f ? d2i_X509_CRL_fp(f, NULL) : NULL;
        if (f)
            fclose(f);
        if (crl && !sk_X509_CRL_push(c->crls, crl))
            X509_CRL_free(crl);
        ERR_clear_error();
    }
    return c->crls && sk_X509_CRL_num(c->crls) > 0 ? 0 : -1;
}

int cairn_tls_checker_new(cairn_tls_checker **out, const cairn_tls_options *o, char *err,
                          size_t errlen)
{
    *out = NULL;
    cairn_tls_checker *c = calloc(1, sizeof *c);
    if (!c)
        return CAIRN_ENOMEM;
    if (o->trusted_ca_file && o->trusted_ca_file[0]) {
        c->store = X509_STORE_new();
        if (!c->store || X509_STORE_load_file(c->store, o->trusted_ca_file) != 1) {
            snprintf(err, errlen, "cannot load the trusted CA file %s", o->trusted_ca_file);
            cairn_tls_checker_free(c);
            return CAIRN_EIO;
        }
    }
    if (o->crl_file && o->crl_file[0] && load_crls(c, o->crl_file) != 0) {
        snprintf(err, errlen, "cannot load the CRL file %s", o->crl_file);
        cairn_tls_checker_free(c);
        return CAIRN_EIO;
    }
    if (o->allowed_cn && o->allowed_cn[0] && o->allowed_hostname && o->allowed_hostname[0]) {
        /* etcd: refused when the TLS config is built (exit 1) */
        snprintf(
            err, errlen,
            "AllowedCN and AllowedHostname are mutually exclusive (cn=\"%s\", hostname=\"%s\")",
            o->allowed_cn, o->allowed_hostname);
        cairn_tls_checker_free(c);
        return CAIRN_EINVAL;
    }
    if ((o->allowed_cn && o->allowed_cn[0] && !(c->allowed_cn = strdup(o->allowed_cn))) ||
        (o->allowed_hostname && o->allowed_hostname[0] &&
         !(c->allowed_hostname = strdup(o->allowed_hostname)))) {
        cairn_tls_checker_free(c);
        return CAIRN_ENOMEM;
    }
    *out = c;
    ERR_clear_error();
    return 0;
}

static void common_name(X509 *x, char *cn, size_t cnlen)
{
    if (!cn || !cnlen)
        return;
    cn[0] = '\0';
    int n = X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, (int)cnlen);
    if (n < 0)
        cn[0] = '\0';
}

/* An X509_V_ERR_* as Go words it. */
static void verify_reason(int e, char *why, size_t whylen)
{
    switch (e) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
    case X509_V_ERR_CERT_NOT_YET_VALID:
        snprintf(why, whylen, "x509: certificate has expired or is not yet valid");
        break;
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
        snprintf(why, whylen, "x509: certificate signed by unknown authority");
        break;
    default:
        snprintf(why, whylen, "x509: %s", X509_verify_cert_error_string(e));
    }
}

/* The chain of |x| to the trusted CA, as Go words a failure; |untrusted|
 * (may be NULL) holds the intermediates the peer sent with it: only the
 * trusted CA file anchors the chain. */
static int verify_chain(const cairn_tls_checker *c, X509 *x, STACK_OF(X509) * untrusted, char *why,
                        size_t whylen)
{
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    if (!ctx || X509_STORE_CTX_init(ctx, c->store, x, untrusted) != 1) {
        X509_STORE_CTX_free(ctx);
        snprintf(why, whylen, "cannot verify the certificate: out of memory");
        return CAIRN_ENOMEM;
    }
    int ok = X509_verify_cert(ctx) == 1;
    int e = X509_STORE_CTX_get_error(ctx);
    X509_STORE_CTX_free(ctx);
    if (ok)
        return 0;
    verify_reason(e, why, whylen);
    return CAIRN_EINVAL;
}

/* etcd: "transport: certificate serial <hex> revoked" — by serial alone. */
static int check_revoked(const cairn_tls_checker *c, X509 *x, char *why, size_t whylen)
{
    const ASN1_INTEGER *serial = X509_get0_serialNumber(x);
    for (int i = 0; c->crls && i < sk_X509_CRL_num(c->crls); i++) {
        STACK_OF(X509_REVOKED) *rev = X509_CRL_get_REVOKED(sk_X509_CRL_value(c->crls, i));
        for (int j = 0; rev && j < sk_X509_REVOKED_num(rev); j++) {
            if (ASN1_INTEGER_cmp(X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(rev, j)),
                                 serial) != 0)
                continue;
            BIGNUM *bn = ASN1_INTEGER_to_BN(serial, NULL);
            char *hex = bn ? BN_bn2hex(bn) : NULL;
            for (char *h = hex; h && *h; h++)
                if (*h >= 'A' && *h <= 'F')
                    *h = (char)(*h - 'A' + 'a');
            snprintf(why, whylen, "transport: certificate serial %s revoked", hex ? hex : "?");
            OPENSSL_free(hex);
            BN_free(bn);
            return CAIRN_EINVAL;
        }
    }
    return 0;
}

static int check_x509(const cairn_tls_checker *c, X509 *x, STACK_OF(X509) * untrusted, char *cn,
                      size_t cnlen, char *why, size_t whylen)
{
    common_name(x, cn, cnlen);
    int rc = c->store ? verify_chain(c, x, untrusted, why, whylen) : 0;
    if (!rc)
        rc = check_revoked(c, x, why, whylen);
    if (rc)
        return rc;
    /* etcd: "client certificate authentication failed" on either end of
     * the link (the dialed member's certificate is checked too); the
     * parenthesis says which check */
    if (c->allowed_cn) {
        char got[256];
        common_name(x, got, sizeof got);
        if (strcmp(got, c->allowed_cn) != 0) {
            snprintf(why, whylen,
                     "client certificate authentication failed (certificate CN \"%s\" is not the "
                     "allowed CN \"%s\")",
                     got, c->allowed_cn);
            return CAIRN_EINVAL;
        }
    }
    if (c->allowed_hostname) {
        /* etcd: Go's VerifyHostname: SANs only (a name with no DNS SAN
         * never falls back to the subject's CN), no partial wildcards */
        int ok = is_ip(c->allowed_hostname)
                     ? X509_check_ip_asc(x, c->allowed_hostname, 0) == 1
                     : X509_check_host(x, c->allowed_hostname, 0,
                                       X509_CHECK_FLAG_NEVER_CHECK_SUBJECT |
                                           X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS,
                                       NULL) == 1;
        if (!ok) {
            snprintf(why, whylen,
                     "client certificate authentication failed (certificate is not valid for the "
                     "allowed hostname %s)",
                     c->allowed_hostname);
            return CAIRN_EINVAL;
        }
    }
    return 0;
}

int cairn_tls_check_pem(const cairn_tls_checker *c, const char *pem, size_t len, char *cn,
                        size_t cnlen, char *why, size_t whylen)
{
    if (cn && cnlen)
        cn[0] = '\0';
    if (!pem || !len) {
        snprintf(why, whylen, "the peer presented no certificate");
        return CAIRN_EINVAL;
    }
    /* the peer's certificate first, then the intermediates it sent */
    BIO *b = BIO_new_mem_buf(pem, len > 0x7fffffff ? 0x7fffffff : (int)len);
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    STACK_OF(X509) *chain = x ? sk_X509_new_null() : NULL;
    int rc = 0;
    for (int i = 0; chain && i < CAIRN_TLS_MAX_CHAIN; i++) {
        X509 *y = PEM_read_bio_X509(b, NULL, NULL, NULL);
        if (!y)
            break;
        if (!sk_X509_push(chain, y)) {
            X509_free(y);
            rc = CAIRN_ENOMEM;
            break;
        }
    }
    BIO_free(b);
    if (rc) {
        snprintf(why, whylen, "cannot read the peer's certificate chain: out of memory");
    } else if (!x || !chain) {
        snprintf(why, whylen, "the peer's certificate does not parse");
        rc = CAIRN_EINVAL;
    } else {
        rc = check_x509(c, x, chain, cn, cnlen, why, whylen);
    }
    sk_X509_pop_free(chain, X509_free);
    X509_free(x);
    ERR_clear_error();
    return rc;
}

/* ---- a dialing member's certificate against its address --------------- */

/* "ipv4:1.2.3.4:5", "ipv6:[::1]:5" (or with %5B %5D) -> the address in
 * |out|; -1 for any other peer (unix:, fd:). */
static int grpc_peer_host(char *out, size_t outlen, const char *peer)
{
    const char *p;
    if (strncmp(peer, "ipv4:", 5) == 0) {
        p = peer + 5;
        const char *colon = strrchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : 0;
        if (!n || n >= outlen)
            return -1;
        memcpy(out, p, n);
        out[n] = '\0';
        return 0;
    }
    if (strncmp(peer, "ipv6:", 5) != 0)
        return -1;
    p = peer + 5;
    size_t skip = *p == '[' ? 1 : strncmp(p, "%5B", 3) == 0 ? 3 : 0;
    if (!skip)
        return -1;
    p += skip;
    const char *end = strstr(p, skip == 1 ? "]" : "%5D");
    size_t n = end ? (size_t)(end - p) : 0;
    if (!n || n >= outlen)
        return -1;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

/* Go's words for a failed lookup of |what|. */
static void lookup_failed(char *err, size_t errlen, const char *what, int not_found,
                          const char *other)
{
    snprintf(err, errlen, "lookup %.200s: %.46s", what, not_found ? "no such host" : other);
}

/* ---- lookups with a deadline ----------------------------------------------
 * The resolver may take seconds (a DNS server that does not answer), and
 * the SAN check runs on the peer thread, which every link waits on. So
 * each lookup runs on a thread of its own while the caller waits for it
 * until the check's deadline (SAN_LOOKUP_MS for all of a check's lookups
 * together); past it the lookup fails as Go's does when its resolver
 * times out ("i/o timeout"), and the thread finishes and frees the job by
 * itself. A lookup that answers in time gives the verdict it always gave.
 * At most SAN_LOOKUPS_MAX threads are left behind at once: past that a
 * new lookup fails at once the same way, so a dead resolver cannot pile
 * up threads. The job is the only thing the two threads share, under its
 * mutex, and the last of them to let go frees it. */
#define SAN_LOOKUP_MS 1000
#define SAN_LOOKUPS_MAX 8
#define LOOKUP_NAMES 16
#define LOOKUP_ADDRS 64

static atomic_int lookups_live;
static atomic_int test_delay_ms; /* cairn_tls_test_slow_resolver_ */

/* What a lookup found: reverse names (trailing dot dropped) or addresses,
 * or why not. */
typedef struct lookup_answer {
    int ok, not_found;
    int skip; /* not an address: no lookup, nothing to say */
    char err[128];
    char names[LOOKUP_NAMES][256];
    int nnames;
    int fam[LOOKUP_ADDRS];
    unsigned char addr[LOOKUP_ADDRS][16];
    int naddrs;
} lookup_answer;

typedef struct lookup_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs, done;
    int reverse; /* else forward; set before the thread starts, as |query| */
    char query[256];
    lookup_answer ans;
} lookup_job;

static void job_release(lookup_job *j)
{
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) {
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j);
    }
}

/* The lookup itself, the resolver's own (blocking) calls. */
static void resolve(lookup_answer *a, int reverse, const char *query)
{
    memset(a, 0, sizeof *a);
    int delay = atomic_load(&test_delay_ms);
    if (delay > 0)
        usleep((useconds_t)delay * 1000);
    if (reverse) {
        unsigned char ip[16];
        int fam = inet_pton(AF_INET, query, ip) == 1 ? AF_INET : AF_INET6;
        if (fam == AF_INET6 && inet_pton(AF_INET6, query, ip) != 1) {
            a->skip = 1;
            return;
        }
        struct hostent he, *res = NULL;
        char buf[8192];
        int herr = 0;
        if (gethostbyaddr_r(ip, fam == AF_INET ? 4 : 16, fam, &he, buf, sizeof buf, &res, &herr) !=
                0 ||
            !res) {
            a->not_found = herr == HOST_NOT_FOUND || herr == NO_DATA;
            snprintf(a->err, sizeof a->err, "%s", hstrerror(herr));
            return;
        }
        a->ok = 1;
        for (int k = -1;
             a->nnames < LOOKUP_NAMES && (k < 0 || (res->h_aliases && res->h_aliases[k])); k++) {
            char *name = a->names[a->nnames];
            snprintf(name, sizeof a->names[0], "%s", k < 0 ? res->h_name : res->h_aliases[k]);
            size_t nl = strlen(name);
            if (nl && name[nl - 1] == '.')
                name[--nl] = '\0';
            a->nnames += nl > 0;
        }
        return;
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int e = getaddrinfo(query, NULL, &hints, &res);
    if (e) {
        a->not_found = e == EAI_NONAME;
        snprintf(a->err, sizeof a->err, "%s", gai_strerror(e));
        return;
    }
    a->ok = 1;
    for (struct addrinfo *ai = res; ai && a->naddrs < LOOKUP_ADDRS; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET)
            memcpy(a->addr[a->naddrs], &((struct sockaddr_in *)ai->ai_addr)->sin_addr, 4);
        else if (ai->ai_family == AF_INET6)
            memcpy(a->addr[a->naddrs], &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, 16);
        else
            continue;
        a->fam[a->naddrs++] = ai->ai_family;
    }
    freeaddrinfo(res);
}

static void *lookup_main(void *arg)
{
    lookup_job *j = arg;
    lookup_answer *a = malloc(sizeof *a);
    if (a)
        resolve(a, j->reverse, j->query);
    pthread_mutex_lock(&j->mu);
    if (a)
        j->ans = *a;
    else
        snprintf(j->ans.err, sizeof j->ans.err, "out of memory");
    j->done = 1;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    free(a);
    atomic_fetch_sub(&lookups_live, 1);
    job_release(j);
    return NULL;
}

/* Starts the lookup thread of |j|: 1, or 0 when it is too late, too many
 * are left behind, or no thread could be made. */
static int lookup_start(lookup_job *j, const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > deadline->tv_sec ||
        (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec))
        return 0;
    if (atomic_fetch_add(&lookups_live, 1) >= SAN_LOOKUPS_MAX) {
        atomic_fetch_sub(&lookups_live, 1);
        return 0;
    }
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int started = pthread_create(&t, &at, lookup_main, j) == 0;
    pthread_attr_destroy(&at);
    if (!started)
        atomic_fetch_sub(&lookups_live, 1);
    return started;
}

/* Runs the lookup of |query| (a reverse one for an address, else a
 * forward one) on a thread of its own, waiting for it until |deadline|
 * (CLOCK_MONOTONIC). 1 with the answer in *out; 0 with the failure's
 * words in |err| (past the deadline: Go's "i/o timeout"). */
static int run_lookup(lookup_answer *out, int reverse, const char *query,
                      const struct timespec *deadline, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    lookup_job *j = calloc(1, sizeof *j);
    if (!j) {
        lookup_failed(err, errlen, query, 0, "out of memory");
        return 0;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->reverse = reverse;
    snprintf(j->query, sizeof j->query, "%s", query);
    j->refs = 2;
    if (!lookup_start(j, deadline))
        j->refs = 1;
    pthread_mutex_lock(&j->mu);
    while (j->refs == 2 && !j->done)
        if (pthread_cond_timedwait(&j->cv, &j->mu, deadline) == ETIMEDOUT)
            break;
    int done = j->done;
    if (done)
        *out = j->ans;
    pthread_mutex_unlock(&j->mu);
    job_release(j);
    if (!done) {
        lookup_failed(err, errlen, query, 0, "i/o timeout");
        return 0;
    }
    if (!out->ok && !out->skip)
        lookup_failed(err, errlen, query, out->not_found, out->err);
    return out->ok;
}

void cairn_tls_test_slow_resolver_(int ms)
{
    atomic_store(&test_delay_ms, ms);
}

/* etcd: a reverse name of |host| that is one of the DNS SANs, or that ends
 * in the ".d" of a wildcard SAN "*.d" (the names of a reverse lookup, its
 * trailing dot dropped). A failed lookup's words go to |err|. */
static int reverse_matches(const GENERAL_NAMES *sans, const char *host,
                           const struct timespec *deadline, char *err, size_t errlen)
{
    lookup_answer *r = malloc(sizeof *r);
    if (!r) {
        lookup_failed(err, errlen, host, 0, "out of memory");
        return 0;
    }
    int ok = 0;
    if (run_lookup(r, 1, host, deadline, err, errlen)) {
        for (int k = 0; !ok && k < r->nnames; k++) {
            const char *name = r->names[k];
            size_t nl = strlen(name);
            for (int i = 0; !ok && i < sk_GENERAL_NAME_num(sans); i++) {
                const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
                if (g->type != GEN_DNS)
                    continue;
                const char *d = (const char *)ASN1_STRING_get0_data(g->d.dNSName);
                size_t dl = (size_t)ASN1_STRING_length(g->d.dNSName);
                if (dl > 2 && d[0] == '*' && d[1] == '.')
                    ok = nl >= dl - 1 && memcmp(name + nl - (dl - 1), d + 1, dl - 1) == 0;
                else
                    ok = dl == nl && memcmp(name, d, nl) == 0;
            }
        }
    }
    free(r);
    return ok;
}

/* Whether |name| resolves to |host| (forward lookup, as etcd's). The
 * last failure's words go to |err|. */
static int name_has_addr(const char *name, const char *host, const struct timespec *deadline,
                         char *err, size_t errlen)
{
    unsigned char want[16];
    int fam = inet_pton(AF_INET, host, want) == 1 ? AF_INET : AF_INET6;
    if (fam == AF_INET6 && inet_pton(AF_INET6, host, want) != 1)
        return 0;
    lookup_answer *r = malloc(sizeof *r);
    if (!r) {
        lookup_failed(err, errlen, name, 0, "out of memory");
        return 0;
    }
    int ok = 0;
    if (run_lookup(r, 0, name, deadline, err, errlen))
        for (int k = 0; !ok && k < r->naddrs; k++)
            ok = r->fam[k] == fam && memcmp(r->addr[k], want, fam == AF_INET ? 4 : 16) == 0;
    free(r);
    return ok;
}

int cairn_tls_check_peer_san(const char *pem, size_t len, const char *grpc_peer, char *why,
                             size_t whylen)
{
    char host[64];
    if (!pem || !len || !grpc_peer || grpc_peer_host(host, sizeof host, grpc_peer) != 0)
        return 0;
    BIO *b = BIO_new_mem_buf(pem, len > 0x7fffffff ? 0x7fffffff : (int)len);
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    ERR_clear_error();
    if (!x)
        return 0; /* the checker refused it already */
    GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    char ips[256] = "", dns[512] = "", lookup[256] = "";
    size_t nips = 0, ndns = 0, li = 0, ld = 0;
    int ok = 0;
    for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        if (g->type == GEN_IPADD) {
            const ASN1_OCTET_STRING *o = g->d.iPAddress;
            char a[64] = "?";
            if (o->length == 4 || o->length == 16)
                inet_ntop(o->length == 4 ? AF_INET : AF_INET6, o->data, a, sizeof a);
            li += (size_t)snprintf(ips + li, li < sizeof ips ? sizeof ips - li : 0, "%s%s",
                                   nips ? ", " : "", a);
            if (li >= sizeof ips)
                li = sizeof ips - 1;
            nips++;
        } else if (g->type == GEN_DNS) {
            const char *d = (const char *)ASN1_STRING_get0_data(g->d.dNSName);
            int dl = ASN1_STRING_length(g->d.dNSName);
            char name[256];
            snprintf(name, sizeof name, "%.*s", dl, d);
            ld += (size_t)snprintf(dns + ld, ld < sizeof dns ? sizeof dns - ld : 0, "%s\"%s\"",
                                   ndns ? " " : "", name);
            if (ld >= sizeof dns)
                ld = sizeof dns - 1;
            ndns++;
        }
    }
    /* etcd: an IP SAN that is the address passes; else a DNS SAN that
     * resolves to it; a certificate with no SAN passes */
    if (!nips && !ndns)
        ok = 1;
    if (!ok && nips)
        ok = X509_check_ip_asc(x, host, 0) == 1;
    /* etcd: the address's reverse names first, then each DNS SAN but the
     * wildcards forward; the last failure is the one told. All of them
     * within SAN_LOOKUP_MS. */
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += SAN_LOOKUP_MS / 1000;
    deadline.tv_nsec += (long)(SAN_LOOKUP_MS % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    if (!ok && ndns)
        ok = reverse_matches(sans, host, &deadline, lookup, sizeof lookup);
    for (int i = 0; !ok && ndns && i < sk_GENERAL_NAME_num(sans); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        if (g->type != GEN_DNS)
            continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", ASN1_STRING_length(g->d.dNSName),
                 (const char *)ASN1_STRING_get0_data(g->d.dNSName));
        if (strncmp(name, "*.", 2) != 0)
            ok = name_has_addr(name, host, &deadline, lookup, sizeof lookup);
    }
    GENERAL_NAMES_free(sans);
    X509_free(x);
    if (ok)
        return 0;
    if (!ndns)
        snprintf(why, whylen, "x509: certificate is valid for %s, not %s", ips, host);
    else
        snprintf(why, whylen, "tls: \"%s\" does not match any of DNSNames [%s]%s%s%s", host, dns,
                 lookup[0] ? " (" : "", lookup, lookup[0] ? ")" : "");
    return CAIRN_EINVAL;
}

/* ---- the client links' context ----------------------------------------- */

struct cairn_tls_server {
    SSL_CTX *ctx;
    cairn_tls_checker *checker;
    int verify; /* a client certificate is required */
};

void cairn_tls_server_free(cairn_tls_server *s)
{
    if (!s)
        return;
    SSL_CTX_free(s->ctx);
    cairn_tls_checker_free(s->checker);
    free(s);
}

/* gRPC clients require h2 by ALPN; etcd's listener offers h2 and
 * http/1.1. */
static int select_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    (void)ssl;
    (void)arg;
    static const unsigned char ours[] = "\x02h2\x08http/1.1";
    unsigned char *sel = NULL;
    if (SSL_select_next_proto(&sel, outlen, ours, sizeof ours - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK;
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

static int ssl_fail(cairn_tls_server *s, int rc, char *err, size_t errlen, const char *what,
                    const char *file)
{
    unsigned long e = ERR_get_error();
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    snprintf(err, errlen, "%s %s: %s", what, file ? file : "", e ? buf : "failed");
    ERR_clear_error();
    cairn_tls_server_free(s);
    return rc;
}

int cairn_tls_server_new(cairn_tls_server **out, const cairn_tls_options *o, char *err,
                         size_t errlen)
{
    *out = NULL;
    if (!o->cert_file || !o->key_file || !o->cert_file[0] || !o->key_file[0]) {
        snprintf(err, errlen, "TLS needs both a certificate and a key file");
        return CAIRN_EINVAL;
    }
    cairn_tls_server *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    s->ctx = SSL_CTX_new(TLS_server_method());
    if (!s->ctx)
        return ssl_fail(s, CAIRN_ENOMEM, err, errlen, "cannot make a TLS context", NULL);
    /* etcd: TLS 1.2 at least ("client offered only unsupported versions") */
    SSL_CTX_set_min_proto_version(s->ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(s->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(s->ctx, o->cert_file) != 1)
        return ssl_fail(s, CAIRN_EIO, err, errlen, "cannot load the certificate", o->cert_file);
    if (SSL_CTX_use_PrivateKey_file(s->ctx, o->key_file, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(s->ctx) != 1)
        return ssl_fail(s, CAIRN_EIO, err, errlen, "cannot load the key", o->key_file);
    if (o->ncipher_suites) {
        char list[2048];
        int only13;
        int rc = cairn_tls_cipher_list(list, sizeof list, &only13, o->cipher_suites,
                                       o->ncipher_suites, err, errlen);
        if (rc) {
            cairn_tls_server_free(s);
            return rc;
        }
        if (only13)
            SSL_CTX_set_min_proto_version(s->ctx, TLS1_3_VERSION);
        else if (SSL_CTX_set_cipher_list(s->ctx, list) != 1)
            return ssl_fail(s, CAIRN_EINVAL, err, errlen,
                            "no cipher of --cipher-suites is available", NULL);
    }
    int has_ca = o->trusted_ca_file && o->trusted_ca_file[0];
    if (has_ca) {
        if (SSL_CTX_load_verify_locations(s->ctx, o->trusted_ca_file, NULL) != 1)
            return ssl_fail(s, CAIRN_EIO, err, errlen, "cannot load the trusted CA file",
                            o->trusted_ca_file);
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->trusted_ca_file);
        if (names)
            SSL_CTX_set_client_CA_list(s->ctx, names);
    } else if (o->client_cert_auth) {
        SSL_CTX_set_default_verify_paths(s->ctx);
    }
    /* etcd: a trusted CA alone already makes a client certificate
     * required ("tls: client didn't provide a certificate") */
    s->verify = has_ca || o->client_cert_auth;
    SSL_CTX_set_verify(s->ctx, s->verify ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0,
                       NULL);
    SSL_CTX_set_alpn_select_cb(s->ctx, select_alpn, NULL);
    /* the CRL is checked after the handshake, as etcd does (the client
     * sees the handshake pass, then the connection close) */
    cairn_tls_options co = {0};
    co.crl_file = o->crl_file;
    co.allowed_cn = o->allowed_cn;
    co.allowed_hostname = o->allowed_hostname;
    int rc = cairn_tls_checker_new(&s->checker, &co, err, errlen);
    if (rc) {
        cairn_tls_server_free(s);
        return rc;
    }
    ERR_clear_error();
    *out = s;
    return 0;
}

/* ---- the pump ---------------------------------------------------------- */

typedef struct pconn {
    struct pconn *next;
    SSL *ssl;
    cairn_tls_server *srv;
    int fd, plain;    /* the TLS socket; our end of the socketpair */
    int plain_remote; /* the listener's end: the key of the CN lookup */
    uint64_t cookie;  /* plain_remote's SO_COOKIE: which socket that fd is */
    int handshaking;
    int hs_events;            /* what the handshake waits for */
    int rd_events, wr_events; /* what SSL_read / SSL_write wait for */
    int tls_eof, plain_eof;
    int dead;
    int closed; /* on the grave list: freed after the epoll batch */
    uint64_t deadline_ms;
    char cn[256];
    int has_cn;
    size_t up_len, up_off;     /* TLS -> plain */
    size_t down_len, down_off; /* plain -> TLS */
    unsigned char up[PUMP_BUF], down[PUMP_BUF];
    char addr[64];
} pconn;

struct cairn_tls_pump {
    int ep;
    int wake; /* an eventfd-like pipe: stop */
    int wake_w;
    pthread_t th;
    int started;
    atomic_int stop;
    pthread_mutex_t mu; /* the list (adds come from the listener) and CNs */
    pconn *conns;
    size_t nconns, max_conns;
    /* closed during an epoll batch whose later events may still name
     * them: freed once the batch is done (pump thread only) */
    pconn *grave;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int want_of(SSL *ssl, int r)
{
    int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        return EPOLLIN;
    if (e == SSL_ERROR_WANT_WRITE)
        return EPOLLOUT;
    return -1;
}

static const char *ssl_reason(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (!e)
        return "the connection closed";
    ERR_error_string_n(e, buf, len);
    ERR_clear_error();
    return buf;
}

static void reject(pconn *c, const char *why)
{
    /* etcd: "rejected connection from "<addr>" (error "<why>")" */
    cairn_log(CAIRN_LOG_INFO, "rejected connection from \"%s\" (error \"%s\")", c->addr, why);
    c->dead = 1;
}

/* What the handshake's failure was, in the words etcd's listener logs. */
static const char *handshake_reason(pconn *c, char *buf, size_t len)
{
    unsigned long e = ERR_peek_error();
    int reason = ERR_GET_REASON(e);
    long v = SSL_get_verify_result(c->ssl);
    if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
        ERR_clear_error();
        return "tls: client didn't provide a certificate";
    }
    if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED && v != X509_V_OK) {
        ERR_clear_error();
        char why[200];
        verify_reason((int)v, why, sizeof why);
        snprintf(buf, len, "tls: failed to verify client certificate: %s", why);
        return buf;
    }
    if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_HTTP_REQUEST ||
        reason == SSL_R_HTTPS_PROXY_REQUEST) {
        ERR_clear_error();
        return "tls: first record does not look like a TLS handshake";
    }
    if (reason == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE || reason == SSL_R_TLSV1_ALERT_UNKNOWN_CA) {
        /* the client does not trust our certificate */
        ERR_clear_error();
        return "remote error: tls: bad certificate";
    }
    if (reason == SSL_R_UNSUPPORTED_PROTOCOL) {
        ERR_clear_error();
        return "tls: client offered only unsupported versions";
    }
    return ssl_reason(buf, len);
}

static void handshake(cairn_tls_pump *p, pconn *c)
{
    ERR_clear_error();
    int r = SSL_do_handshake(c->ssl);
    if (r != 1) {
        int w = want_of(c->ssl, r);
        char buf[256];
        if (w < 0)
            reject(c, handshake_reason(c, buf, sizeof buf));
        c->hs_events = w < 0 ? 0 : w;
        return;
    }
    c->handshaking = 0;
    X509 *x = SSL_get1_peer_certificate(c->ssl);
    if (x) {
        char why[256];
        /* the handshake verified the chain the client sent; the checker
         * verifies it again beside its CRL, CN and hostname checks */
        int rc = check_x509(c->srv->checker, x, SSL_get_peer_cert_chain(c->ssl), c->cn,
                            sizeof c->cn, why, sizeof why);
        X509_free(x);
        if (rc) {
            reject(c, why);
            return;
        }
        pthread_mutex_lock(&p->mu);
        c->has_cn = 1;
        pthread_mutex_unlock(&p->mu);
    }
}

/* Moves what can move without blocking; returns 1 if anything moved. */
static int pump_once(cairn_tls_pump *p, pconn *c)
{
    int moved = 0;
    /* TLS -> plain */
    if (!c->up_len && !c->tls_eof) {
        ERR_clear_error();
        int r = SSL_read(c->ssl, c->up, sizeof c->up);
        if (r > 0) {
            c->up_len = (size_t)r;
            c->up_off = 0;
            c->rd_events = EPOLLIN;
            moved = 1;
        } else {
            int w = want_of(c->ssl, r);
            if (w < 0) {
                c->tls_eof = 1;
                shutdown(c->plain, SHUT_WR);
                moved = 1;
            } else {
                c->rd_events = w;
            }
        }
    }
    if (c->up_len) {
        ssize_t n = send(c->plain, c->up + c->up_off, c->up_len - c->up_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->up_off += (size_t)n;
            if (c->up_off == c->up_len)
                c->up_len = c->up_off = 0;
            moved = 1;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c->dead = 1;
            return 0;
        }
    }
    /* plain -> TLS */
    if (!c->down_len && !c->plain_eof) {
        ssize_t n = recv(c->plain, c->down, sizeof c->down, 0);
        if (n > 0) {
            c->down_len = (size_t)n;
            c->down_off = 0;
            moved = 1;
        } else if (n == 0) {
            /* the listener closed its end: that fd number can now name
             * another connection */
            pthread_mutex_lock(&p->mu);
            c->has_cn = 0;
            pthread_mutex_unlock(&p->mu);
            c->plain_eof = 1;
            SSL_shutdown(c->ssl);
            shutdown(c->fd, SHUT_WR);
            moved = 1;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c->dead = 1;
            return 0;
        }
    }
    if (c->down_len) {
        ERR_clear_error();
        int r = SSL_write(c->ssl, c->down + c->down_off, (int)(c->down_len - c->down_off));
        if (r > 0) {
            c->down_off += (size_t)r;
            if (c->down_off == c->down_len)
                c->down_len = c->down_off = 0;
            c->wr_events = EPOLLOUT;
            moved = 1;
        } else {
            int w = want_of(c->ssl, r);
            if (w < 0) {
                c->dead = 1;
                return 0;
            }
            c->wr_events = w;
        }
    }
    if (c->tls_eof && c->plain_eof && !c->up_len)
        c->dead = 1;
    return moved;
}

static void set_interest(cairn_tls_pump *p, pconn *c)
{
    struct epoll_event ev = {0};
    ev.data.ptr = c;
    if (c->handshaking) {
        ev.events = (uint32_t)c->hs_events;
    } else {
        if (!c->up_len && !c->tls_eof)
            ev.events |= (uint32_t)c->rd_events;
        if (c->down_len)
            ev.events |= (uint32_t)c->wr_events;
    }
    epoll_ctl(p->ep, EPOLL_CTL_MOD, c->fd, &ev);
    struct epoll_event pe = {0};
    pe.data.ptr = c;
    if (!c->handshaking) {
        if (c->up_len)
            pe.events |= EPOLLOUT;
        if (!c->down_len && !c->plain_eof)
            pe.events |= EPOLLIN;
    }
    epoll_ctl(p->ep, EPOLL_CTL_MOD, c->plain, &pe);
}

static void conn_close(cairn_tls_pump *p, pconn *c)
{
    epoll_ctl(p->ep, EPOLL_CTL_DEL, c->fd, NULL);
    epoll_ctl(p->ep, EPOLL_CTL_DEL, c->plain, NULL);
    pthread_mutex_lock(&p->mu);
    for (pconn **pc = &p->conns; *pc; pc = &(*pc)->next)
        if (*pc == c) {
            *pc = c->next;
            break;
        }
    p->nconns--;
    pthread_mutex_unlock(&p->mu);
    SSL_free(c->ssl);
    c->ssl = NULL;
    close(c->fd);
    close(c->plain);
    c->closed = 1;
    c->next = p->grave;
    p->grave = c;
}

static void bury(cairn_tls_pump *p)
{
    while (p->grave) {
        pconn *c = p->grave;
        p->grave = c->next;
        free(c);
    }
}

static void service(cairn_tls_pump *p, pconn *c, uint32_t events)
{
    if (c->closed)
        return;
    int moved = 0;
    if (c->handshaking)
        handshake(p, c);
    if (!c->handshaking && !c->dead)
        for (int i = 0; i < PUMP_ROUNDS && pump_once(p, c); i++)
            moved = 1;
    /* a hang-up nothing can be moved past would wake us forever */
    if (!c->dead && !moved && !c->handshaking && (events & (EPOLLHUP | EPOLLERR)))
        c->dead = 1;
    if (c->dead)
        conn_close(p, c);
    else
        set_interest(p, c);
}

static void sweep_handshakes(cairn_tls_pump *p)
{
    uint64_t now = now_ms();
    for (;;) {
        pconn *late = NULL;
        pthread_mutex_lock(&p->mu);
        for (pconn *c = p->conns; c && !late; c = c->next)
            if (c->handshaking && now > c->deadline_ms)
                late = c;
        pthread_mutex_unlock(&p->mu);
        if (!late)
            return;
        reject(late, "tls: handshake timed out");
        conn_close(p, late);
        bury(p);
    }
}

static void *pump_main(void *arg)
{
    cairn_tls_pump *p = arg;
    /* OpenSSL writes with write(2): a peer gone is EPIPE here, not a
     * signal to the process */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    struct epoll_event evs[64];
    uint64_t last_sweep = now_ms();
    while (!atomic_load(&p->stop)) {
        int n = epoll_wait(p->ep, evs, 64, 1000);
        for (int i = 0; i < n; i++) {
            if (!evs[i].data.ptr)
                continue; /* the wake pipe */
            service(p, evs[i].data.ptr, evs[i].events);
        }
        bury(p);
        if (now_ms() - last_sweep >= 1000) {
            sweep_handshakes(p);
            last_sweep = now_ms();
        }
    }
    return NULL;
}

int cairn_tls_pump_new(cairn_tls_pump **out, size_t max_conns)
{
    *out = NULL;
    cairn_tls_pump *p = calloc(1, sizeof *p);
    if (!p)
        return CAIRN_ENOMEM;
    p->max_conns = max_conns;
    pthread_mutex_init(&p->mu, NULL);
    atomic_init(&p->stop, 0);
    int fds[2];
    p->ep = epoll_create1(EPOLL_CLOEXEC);
    if (p->ep < 0 || pipe(fds) != 0) {
        if (p->ep >= 0)
            close(p->ep);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return CAIRN_EIO;
    }
    p->wake = fds[0];
    p->wake_w = fds[1];
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    struct epoll_event ev = {0};
    ev.events = EPOLLIN;
    ev.data.ptr = NULL;
    epoll_ctl(p->ep, EPOLL_CTL_ADD, p->wake, &ev);
    if (pthread_create(&p->th, NULL, pump_main, p) != 0) {
        p->started = 0;
        cairn_tls_pump_free(p);
        return CAIRN_ENOMEM;
    }
    p->started = 1;
    *out = p;
    return 0;
}

void cairn_tls_pump_free(cairn_tls_pump *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    if (p->started) {
        ssize_t w = write(p->wake_w, "x", 1);
        (void)w;
        pthread_join(p->th, NULL);
    }
    while (p->conns)
        conn_close(p, p->conns);
    bury(p);
    close(p->wake);
    close(p->wake_w);
    close(p->ep);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static void peer_addr(int fd, char *out, size_t outlen)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[48] = "?";
    int port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            port = ntohs(a->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            port = ntohs(a->sin6_port);
        }
    }
    snprintf(out, outlen, "%s:%d", host, port);
}

static int socket_cookie(int fd, uint64_t *cookie)
{
    socklen_t len = sizeof *cookie;
    *cookie = 0;
    return getsockopt(fd, SOL_SOCKET, SO_COOKIE, cookie, &len) == 0 && len == sizeof *cookie ? 0
                                                                                             : -1;
}

int cairn_tls_pump_add(cairn_tls_pump *p, cairn_tls_server *srv, int fd, int *plain)
{
    *plain = -1;
    pthread_mutex_lock(&p->mu);
    int full = p->max_conns && p->nconns >= p->max_conns;
    pthread_mutex_unlock(&p->mu);
    if (full) {
        cairn_log(CAIRN_LOG_WARN, "TLS: %zu client connections already: closing a new one",
                  p->max_conns);
        close(fd);
        return CAIRN_EIO;
    }
    pconn *c = calloc(1, sizeof *c);
    int sv[2];
    if (!c) {
        close(fd);
        return CAIRN_ENOMEM;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        free(c);
        close(fd);
        return CAIRN_EIO;
    }
    c->fd = fd;
    c->plain = sv[0];
    c->plain_remote = sv[1];
    if (socket_cookie(sv[1], &c->cookie) != 0) {
        free(c);
        close(fd);
        close(sv[0]);
        close(sv[1]);
        return CAIRN_EIO;
    }
    c->srv = srv;
    c->handshaking = 1;
    c->hs_events = EPOLLIN;
    c->rd_events = EPOLLIN;
    c->wr_events = EPOLLOUT;
    c->deadline_ms = now_ms() + PUMP_HANDSHAKE_MS;
    peer_addr(fd, c->addr, sizeof c->addr);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    /* the listener's end is non-blocking like an accepted socket */
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    c->ssl = SSL_new(srv->ctx);
    if (!c->ssl || SSL_set_fd(c->ssl, fd) != 1) {
        SSL_free(c->ssl);
        close(fd);
        close(sv[0]);
        close(sv[1]);
        free(c);
        return CAIRN_ENOMEM;
    }
    SSL_set_accept_state(c->ssl);
    pthread_mutex_lock(&p->mu);
    c->next = p->conns;
    p->conns = c;
    p->nconns++;
    pthread_mutex_unlock(&p->mu);
    /* registered last: from here on the pump thread owns |c| */
    struct epoll_event pe = {0};
    pe.data.ptr = c;
    epoll_ctl(p->ep, EPOLL_CTL_ADD, c->plain, &pe);
    struct epoll_event ev = {0};
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev);
    *plain = sv[1];
    return 0;
}

int cairn_tls_pump_peer_cn(cairn_tls_pump *p, int plain, char *cn, size_t cnlen)
{
    int rc = CAIRN_ENOTFOUND;
    uint64_t cookie;
    /* the socket |plain| names now; a closed or reused number finds none,
     * or only the connection that holds it now */
    if (plain < 0 || socket_cookie(plain, &cookie) != 0)
        return rc;
    pthread_mutex_lock(&p->mu);
    for (pconn *c = p->conns; c; c = c->next)
        if (c->plain_remote == plain && c->cookie == cookie) {
            if (c->has_cn) {
                snprintf(cn, cnlen, "%s", c->cn);
                rc = 0;
            }
            break;
        }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int cairn_tls_pump_call_cn(cairn_tls_pump *p, const char *grpc_peer, char *cn, size_t cnlen)
{
    if (!p || !grpc_peer || strncmp(grpc_peer, "fd:", 3) != 0)
        return CAIRN_ENOTFOUND;
    char *end;
    long fd = strtol(grpc_peer + 3, &end, 10);
    if (end == grpc_peer + 3 || *end || fd < 0 || fd > 0x7fffffff)
        return CAIRN_ENOTFOUND;
    return cairn_tls_pump_peer_cn(p, (int)fd, cn, cnlen);
}
