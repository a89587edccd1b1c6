/*
 * server/http: the HTTP/1.1 parser (http.c) and the gateway's JSON mapping
 * (json.c), without sockets.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/error.h"
#include "etcdserverpb/rpc.pb-c.h"
#include "server/http/http.h"
#include "server/http/json.h"

static int parse(const char *s, http_request *r, size_t *used, uint64_t cap)
{
    return http_parse(r, used, (const uint8_t *)s, strlen(s), cap);
}

START_TEST(whole_request_and_pipelining)
{
    const char *s = "POST /v3/kv/put?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
                    "Content-Type: application/json\r\n\r\nabcGET /health HTTP/1.0\r\n\r\n";
    http_request r;
    size_t used;
    ck_assert_int_eq(parse(s, &r, &used, 100), 0);
    ck_assert(http_method_is(&r, "POST"));
    ck_assert(http_path_is(&r, "/v3/kv/put"));
    ck_assert_int_eq((int)r.query_len, 3);
    ck_assert_int_eq(r.minor, 1);
    ck_assert(r.has_host && r.keep_alive);
    ck_assert_int_eq((int)r.body_len, 3);
    ck_assert(memcmp(r.body, "abc", 3) == 0);
    ck_assert_int_eq((int)r.content_type_len, 16);
    ck_assert_int_eq(parse(s + used, &r, &used, 100), 0);
    ck_assert(http_path_is(&r, "/health"));
    ck_assert(!r.has_host && !r.keep_alive && r.minor == 0);
}
END_TEST

START_TEST(waits_for_the_rest)
{
    http_request r;
    size_t used;
    ck_assert_int_eq(parse("GET /health HTTP/1.1\r\nHost: a\r\n", &r, &used, 10), HTTP_MORE);
    ck_assert_int_eq(parse("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", &r, &used, 10),
                     HTTP_MORE);
    ck_assert_int_eq(parse("GE", &r, &used, 10), HTTP_MORE);
    /* a broken request line need not wait for its end */
    ck_assert_int_eq(parse("\x01\x02", &r, &used, 10), -400);
}
END_TEST

START_TEST(refusals)
{
    http_request r;
    size_t used;
    ck_assert_int_eq(parse("GARBAGE\r\n\r\n", &r, &used, 10), -400);
    ck_assert_int_eq(parse("GET x HTTP/1.1\r\n\r\n", &r, &used, 10), -400);
    ck_assert_int_eq(parse("GET / HTTP/2.0\r\n\r\n", &r, &used, 10), -505);
    ck_assert_int_eq(parse("GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", &r, &used, 10), -400);
    ck_assert_int_eq(parse("GET / HTTP/1.1\r\nA b: c\r\n\r\n", &r, &used, 10), -400);
    ck_assert_int_eq(
        parse("GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", &r, &used, 10),
        -400);
    ck_assert_int_eq(parse("GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", &r, &used, 10), -400);
    ck_assert_int_eq(parse("GET / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", &r, &used, 10), -413);
    ck_assert_int_eq(parse("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", &r, &used, 10),
                     -501);
    char *big = malloc(HTTP_MAX_HEAD + 100);
    memset(big, 'a', HTTP_MAX_HEAD + 99);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    big[HTTP_MAX_HEAD + 99] = '\0';
    ck_assert_int_eq(parse(big, &r, &used, 10), -431);
    free(big);
}
END_TEST

START_TEST(connection_header)
{
    http_request r;
    size_t used;
    ck_assert_int_eq(parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n\r\n", &r, &used, 0),
                     0);
    ck_assert(!r.keep_alive);
    ck_assert_int_eq(parse("GET / HTTP/1.0\r\nConnection: foo, keep-alive\r\n\r\n", &r, &used, 0),
                     0);
    ck_assert(r.keep_alive);
}
END_TEST

/* JSON in, protobuf through, JSON out: etcd's gateway forms. */
static char *roundtrip(const ProtobufCMessageDescriptor *d, const char *json, int *rc)
{
    wire_wr w = {0};
    char err[256];
    *rc = pbjson_decode(&w, d, json, strlen(json), err, sizeof err);
    if (*rc != 0) {
        free(w.p);
        return strdup(err);
    }
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, w.len, w.p);
    free(w.p);
    ck_assert_ptr_nonnull(m);
    char *out = pbjson_encode(m);
    protobuf_c_message_free_unpacked(m, NULL);
    return out;
}

START_TEST(json_mapping)
{
    int rc;
    char *s = roundtrip(&etcdserverpb__range_request__descriptor,
                        "{\"key\":\"Zm9v\",\"rangeEnd\":\"AA\",\"limit\":\"5\",\"sort_order\":"
                        "\"DESCEND\",\"keys_only\":true,\"unknown\":[1],\"revision\":7}",
                        &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_str_eq(s,
                     "{\"key\":\"Zm9v\",\"range_end\":\"AA==\",\"limit\":\"5\",\"revision\":\"7\","
                     "\"sort_order\":\"DESCEND\",\"keys_only\":true}");
    free(s);
    s = roundtrip(&etcdserverpb__txn_request__descriptor,
                  "{\"success\":[{\"request_put\":{\"key\":\"YQ==\"}},{\"requestRange\":{}}]}",
                  &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_str_eq(s,
                     "{\"success\":[{\"request_put\":{\"key\":\"YQ==\"}},{\"request_range\":{}}]}");
    free(s);
    s = roundtrip(&etcdserverpb__range_request__descriptor, "{\"key\":5}", &rc);
    ck_assert_int_eq(rc, CAIRN_EINVAL);
    ck_assert_str_eq(s, "json: cannot unmarshal number into Go value of type []uint8");
    free(s);
    s = roundtrip(&etcdserverpb__lease_grant_request__descriptor, "{\"TTL\":\"x1\"}", &rc);
    ck_assert_int_eq(rc, CAIRN_EINVAL);
    free(s);
    s = roundtrip(&etcdserverpb__range_request__descriptor, "{\"key\":\"%%%\"}", &rc);
    ck_assert_int_eq(rc, CAIRN_EINVAL);
    free(s);
    s = roundtrip(&etcdserverpb__range_request__descriptor, "[]", &rc);
    ck_assert_int_eq(rc, CAIRN_EINVAL);
    free(s);
    char *q = pbjson_quote("a\"b\n", 4);
    ck_assert_str_eq(q, "\"a\\\"b\\n\"");
    free(q);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("http");
    tcase_add_test(tc, whole_request_and_pipelining);
    tcase_add_test(tc, waits_for_the_rest);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, connection_header);
    tcase_add_test(tc, json_mapping);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
