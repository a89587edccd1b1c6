#ifndef CAIRN_SERVER_TLS_H
#define CAIRN_SERVER_TLS_H

/*
 * Internal to server/: TLS policy, in one place for both links (tls.c).
 *
 * - cairn_tls_cipher_list: etcd's --cipher-suites (Go's names) as an
 *   OpenSSL cipher list, for the client listener's context and for gRPC's
 *   GRPC_SSL_CIPHER_SUITES on the peer links.
 * - cairn_tls_self_cert: --auto-tls / --peer-auto-tls, a self-signed
 *   certificate made as etcd makes it.
 * - cairn_tls_checker: the checks on a peer's certificate that both links
 *   apply after the handshake (chain to the trusted CA, expiry, CRL, the
 *   allowed CN and hostname), each failure with etcd's reason.
 * - cairn_tls_server + cairn_tls_pump: client links. The pump terminates
 *   TLS on an accepted socket and hands back a plaintext socket for the
 *   listener to serve as if the client had connected in the clear.
 *
 * Only server/ includes this header; it does not expose OpenSSL's types.
 */

#include <stddef.h>

/* etcd's TLS flags for one link (client or peer). Strings are borrowed. */
typedef struct cairn_tls_options {
    const char *cert_file;
    const char *key_file;
    const char *trusted_ca_file;
    const char *crl_file;
    int client_cert_auth;
    const char *allowed_cn;           /* peers only; NULL = any */
    const char *allowed_hostname;     /* peers only; NULL = any */
    const char *const *cipher_suites; /* Go's names; none = OpenSSL's defaults */
    size_t ncipher_suites;
} cairn_tls_options;

/* Go's cipher suite names (--cipher-suites) as an OpenSSL cipher list
 * ("A:B") in |out|, in the given order.
 * TLS 1.3 suites (TLS_AES_128_GCM_SHA256, ...) are accepted and, as in Go,
 * do not restrict TLS 1.3; *tls13_only is set when only such names were
 * given (no TLS 1.2 suite is then allowed). CAIRN_EINVAL with
 * etcd's message in |err| for an unknown name. */
int cairn_tls_cipher_list(char *out, size_t outlen, int *tls13_only, const char *const *names,
                          size_t nnames, char *err, size_t errlen);

struct cairn_config;
/* Checks cfg's --cipher-suites (CAIRN_EINVAL with etcd's message) and,
 * with |set_env|, gives them to gRPC's TLS (the peer links) through
 * GRPC_SSL_CIPHER_SUITES: before gRPC makes its first TLS credentials. */
int cairn_tls_grpc_ciphers(const struct cairn_config *cfg, int set_env, char *err, size_t errlen);

/* etcd: --auto-tls: <dir>/cert.pem and <dir>/key.pem (dir is
 * <data-dir>/fixtures/client or /peer), an ECDSA P-521 key and a
 * self-signed certificate (organization "etcd", one year, SHA-512,
 * serverAuth, the |hosts| as IP or DNS subject alternative names). Files
 * that exist are kept, as etcd keeps them. Makes |dir|. CAIRN_EIO with a
 * message in |err|. */
int cairn_tls_self_cert(const char *dir, const char *const *hosts, size_t nhosts, char *err,
                        size_t errlen);

/* One side's options from the daemon's config: |t| (cfg->client_tls or
 * cfg->peer_tls) with --cipher-suites; with --auto-tls and no cert file,
 * the self-signed pair in <data-dir>/fixtures/<side> (made if missing)
 * for the hosts of |urls|, its paths kept in |paths| (which |o| then
 * points into). CAIRN_EIO with a message. */
struct cairn_tls_config;
typedef struct cairn_tls_paths {
    char cert[4096], key[4096];
} cairn_tls_paths;
int cairn_tls_options_from(cairn_tls_options *o, cairn_tls_paths *paths,
                           const struct cairn_config *cfg, const struct cairn_tls_config *t,
                           const char *side, char *const *urls, size_t nurls, char *err,
                           size_t errlen);

/* "https://host:port/" -> "host" in |out| (an IPv6 address without its
 * brackets): the name a certificate is checked against. -1 if none. */
int cairn_tls_url_host(char *out, size_t outlen, const char *url);

/* ---- checking a peer's certificate ------------------------------------- */

typedef struct cairn_tls_checker cairn_tls_checker;

/* Loads o->trusted_ca_file and o->crl_file (either may be NULL) and keeps
 * the allowed CN / hostname. CAIRN_EIO with a message for a file that does
 * not load; CAIRN_ENOMEM. */
int cairn_tls_checker_new(cairn_tls_checker **out, const cairn_tls_options *o, char *err,
                          size_t errlen);
void cairn_tls_checker_free(cairn_tls_checker *c);
/* Intermediates read after a peer's certificate, at most. */
#define CAIRN_TLS_MAX_CHAIN 8
/* Checks a certificate (PEM, as gRPC's auth context gives it; |pem| NULL
 * or empty when the peer sent none; the peer's certificate first, then
 * the intermediates it sent, as in gRPC's x509_pem_cert_chain property):
 * signed through them by the trusted CA (when one is set) and valid now, not revoked by the CRL,
 * with the allowed CN and valid for the allowed hostname. 0, or CAIRN_EINVAL with the reason in
 * |why|. Writes the certificate's Common Name to |cn| when |cn| is not
 * NULL ("" if none). Any thread. */
int cairn_tls_check_pem(const cairn_tls_checker *c, const char *pem, size_t len, char *cn,
                        size_t cnlen, char *why, size_t whylen);

/* etcd: the accepting end of a peer link checks the certificate of the
 * member that dialed (the leaf of |pem|) against the address it dialed
 * from (|grpc_peer|, grpc_call_get_peer's "ipv4:a.b.c.d:port" or
 * "ipv6:[...]:port"): an IP SAN equal to it passes, else a DNS SAN that
 * is one of its reverse names (a wildcard "*.d" matches a name ending in
 * ".d") or that resolves to it; a certificate with no SAN passes, and so
 * does any other kind of peer (unix:). The lookups wait for the resolver
 * one second at most, all of them together (past it: refused, Go's
 * "lookup <name>: i/o timeout"). 0, or CAIRN_EINVAL with etcd's reason in
 * |why|. Any thread. */
int cairn_tls_check_peer_san(const char *pem, size_t len, const char *grpc_peer, char *why,
                             size_t whylen);
/* Tests: every lookup of cairn_tls_check_peer_san waits |ms| first (a
 * resolver that does not answer); 0 turns it off. */
void cairn_tls_test_slow_resolver_(int ms);

/* ---- client links ------------------------------------------------------ */

typedef struct cairn_tls_server cairn_tls_server;

/* A server context from |o| (cert and key required; a trusted CA makes a
 * client certificate required, as etcd does), TLS 1.2 at least. Takes the
 * checks of |o| for after the handshake. CAIRN_EIO/EINVAL with a message;
 * CAIRN_ENOMEM. */
int cairn_tls_server_new(cairn_tls_server **out, const cairn_tls_options *o, char *err,
                         size_t errlen);
void cairn_tls_server_free(cairn_tls_server *s);

typedef struct cairn_tls_pump cairn_tls_pump;

/* One thread that runs every client TLS connection: the handshake, the
 * checks, then bytes both ways between the TLS socket and a plaintext
 * socketpair. |max_conns| bounds the connections it holds (more are
 * closed at once, with a log line). */
int cairn_tls_pump_new(cairn_tls_pump **out, size_t max_conns);
/* Closes every connection and joins the thread. */
void cairn_tls_pump_free(cairn_tls_pump *p);
/* Takes |fd| (an accepted TCP socket; closed on failure too) and returns,
 * in *plain, the (non-blocking) local end of a socketpair that carries the connection's
 * plaintext once the handshake and the checks passed (a refused client
 * shows as EOF on it). The caller owns *plain. |srv| must outlive |p|'s
 * use of it. 0, CAIRN_EIO or CAIRN_ENOMEM. */
int cairn_tls_pump_add(cairn_tls_pump *p, cairn_tls_server *srv, int fd, int *plain);
/* The Common Name of the client certificate of the connection whose
 * plaintext socket is |plain| (the fd cairn_tls_pump_add returned; gRPC
 * names such a connection's peer "fd:<plain>"), written to |cn|.
 * CAIRN_ENOTFOUND when that connection has no certificate or is gone,
 * when |plain| is closed, or when it is a later socket that took the
 * number (checked by the socket's cookie: a CN is never given to another
 * connection). |plain| must be open while this runs, as it is during a
 * call. Any thread. */
int cairn_tls_pump_peer_cn(cairn_tls_pump *p, int plain, char *cn, size_t cnlen);
/* The same from a gRPC call's peer string (grpc_call_get_peer): "fd:<n>"
 * for a connection the listener handed to gRPC by its fd. For the auth
 * layer (etcd: with --client-cert-auth the CN is the user name).
 * CAIRN_ENOTFOUND for any other peer.
 * Exact per call while the caller holds the call (before grpc_call_unref):
 * every stream holds a ref on its chttp2 transport, which closes the fd
 * only when the last ref goes, so "fd:<n>" names that call's connection
 * for the whole call, and the cookie tells it from an earlier holder of
 * the number; the CN is set before the first plaintext byte reaches gRPC,
 * so no call of a connection with a certificate sees it unset. */
int cairn_tls_pump_call_cn(cairn_tls_pump *p, const char *grpc_peer, char *cn, size_t cnlen);

#endif
