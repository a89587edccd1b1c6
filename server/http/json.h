#ifndef CAIRN_SERVER_JSON_H
#define CAIRN_SERVER_JSON_H

/*
 * Internal to server/: protobuf messages as etcd 3.4's JSON gateway writes
 * and reads them (json.c), driven by protobuf-c's descriptors, so one
 * mapper serves every message: field names as declared in the .proto
 * (grpc-gateway's OrigName; lowerCamelCase accepted on input), bytes as
 * base64, 64-bit integers as strings, enums by name, fields at their
 * default value left out.
 */

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "crdt/wire.h"

/* JSON nesting a request may use (a Txn holds Txns). */
#define PBJSON_MAX_DEPTH 32

/* Parses the JSON object |json| (|len| bytes) as a |desc| message and
 * appends its protobuf encoding to |out|. Unknown fields are ignored, as
 * etcd's gateway does. On bad input returns CAIRN_EINVAL with a one-line
 * reason in |err| (etcd answers such requests with code 3); CAIRN_ENOMEM. */
int pbjson_decode(wire_wr *out, const ProtobufCMessageDescriptor *desc, const char *json,
                  size_t len, char *err, size_t errlen);

/* A stream's requests (etcd's gateway reads a body of several JSON
 * values, one message each): decodes the first value of |json| like
 * pbjson_decode and sets |*used| to the bytes it took. Returns
 * PBJSON_END when only whitespace is left. */
enum { PBJSON_END = 1 };
int pbjson_decode_next(wire_wr *out, size_t *used, const ProtobufCMessageDescriptor *desc,
                       const char *json, size_t len, char *err, size_t errlen);

/* |m| as compact JSON text (malloc()ed, NUL-terminated; the caller frees
 * it), or NULL when out of memory. */
char *pbjson_encode(const ProtobufCMessage *m);
/* The |n| bytes at |s| as a JSON string literal (quoted, escaped;
 * malloc()ed), or NULL when out of memory or not UTF-8. */
char *pbjson_quote(const char *s, size_t n);

#endif
