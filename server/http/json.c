/*
 * proto3 JSON as etcd 3.4's gateway speaks it (json.h), for any message
 * protobuf-c describes.
 *
 * Decoding goes from jansson's tree straight to protobuf wire bytes, field
 * by field from the descriptor: no message struct is built, so nothing
 * needs protobuf-c's ownership rules, and the bytes then take the same
 * path as a gRPC request (the gateway sends them over gRPC). A nested
 * message is encoded into its own buffer and appended length-delimited;
 * the depth is bounded by PBJSON_MAX_DEPTH.
 *
 * Encoding walks an unpacked message: what etcd's grpc-gateway (jsonpb
 * with OrigName, EmitDefaults off) writes — fields in declaration order,
 * zero values, empty strings and bytes, empty repeated fields and unset
 * messages left out, a oneof member written when it is the one set.
 */
#include "server/http/json.h"

#include "crdt/error.h"

#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names --------------------------------------------------------------- */

/* "sort_order" -> "sortOrder" (protoc's json_name) in |out|. */
static void camel(char *out, size_t outlen, const char *name)
{
    size_t j = 0;
    int up = 0;
    for (const char *p = name; *p && j + 1 < outlen; p++) {
        if (*p == '_') {
            up = 1;
            continue;
        }
        out[j++] = up && *p >= 'a' && *p <= 'z' ? (char)(*p - 'a' + 'A') : *p;
        up = 0;
    }
    out[j] = '\0';
}

static const ProtobufCFieldDescriptor *field_named(const ProtobufCMessageDescriptor *d,
                                                   const char *key)
{
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (strcmp(f->name, key) == 0)
            return f;
        char c[128];
        camel(c, sizeof c, f->name);
        if (strcmp(c, key) == 0)
            return f;
    }
    return NULL;
}

/* Go's name for a JSON value's kind, as in "cannot unmarshal number". */
static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "bool";
    default:
        return "null";
    }
}

/* Go's name for a field's type. */
static const char *go_type(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return "int32";
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return "int64";
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return "uint32";
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return "uint64";
    case PROTOBUF_C_TYPE_FLOAT:
        return "float32";
    case PROTOBUF_C_TYPE_DOUBLE:
        return "float64";
    case PROTOBUF_C_TYPE_BOOL:
        return "bool";
    case PROTOBUF_C_TYPE_STRING:
        return "string";
    case PROTOBUF_C_TYPE_BYTES:
        return "[]uint8";
    case PROTOBUF_C_TYPE_ENUM:
        return ((const ProtobufCEnumDescriptor *)f->descriptor)->name;
    default:
        return ((const ProtobufCMessageDescriptor *)f->descriptor)->name;
    }
}

/* ---- decoding ------------------------------------------------------------ */

typedef struct dec {
    char *err;
    size_t errlen;
} dec;

static int bad_type(dec *d, const json_t *v, const ProtobufCFieldDescriptor *f)
{
    snprintf(d->err, d->errlen, "json: cannot unmarshal %s into Go value of type %s", json_kind(v),
             go_type(f));
    return CAIRN_EINVAL;
}

/* A JSON number or decimal string as an integer in [lo, hi]. */
static int int_of(dec *d, const json_t *v, const ProtobufCFieldDescriptor *f, int is_unsigned,
                  uint64_t *out)
{
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (is_unsigned && x < 0)
            goto range;
        *out = (uint64_t)x;
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end = NULL;
        if (!*s || (*s != '-' && (*s < '0' || *s > '9')))
            goto syntax;
        errno = 0;
        if (is_unsigned) {
            if (*s == '-')
                goto range;
            *out = strtoull(s, &end, 10);
        } else
            *out = (uint64_t)strtoll(s, &end, 10);
        if (*end)
            goto syntax;
        if (errno == ERANGE)
            goto range;
    } else
        return bad_type(d, v, f);
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        if ((int64_t)*out < INT32_MIN || (int64_t)*out > INT32_MAX)
            goto range;
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        if (*out > UINT32_MAX)
            goto range;
        break;
    default:
        break;
    }
    return 0;
syntax:
    snprintf(d->err, d->errlen, "invalid value for %s field %s", go_type(f), f->name);
    return CAIRN_EINVAL;
range:
    snprintf(d->err, d->errlen, "value out of range for %s field %s", go_type(f), f->name);
    return CAIRN_EINVAL;
}

static int encode_message(dec *d, wire_wr *w, const ProtobufCMessageDescriptor *desc,
                          const json_t *obj, int depth);

static void put_tag(wire_wr *w, uint32_t id, int wt)
{
    wire_uv_w(w, ((uint64_t)id << 3) | (uint64_t)wt);
}

static void put_fixed(wire_wr *w, uint64_t v, int n)
{
    uint8_t b[8];
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    wire_bytes_w(w, b, (size_t)n);
}

/* One value of field |f| (an element, for a repeated one). */
static int encode_value(dec *d, wire_wr *w, const ProtobufCFieldDescriptor *f, const json_t *v,
                        int depth)
{
    uint64_t u = 0;
    int rc;
    switch (f->type) {
    case PROTOBUF_C_TYPE_BOOL:
        if (!json_is_boolean(v))
            return bad_type(d, v, f);
        put_tag(w, f->id, 0);
        wire_uv_w(w, json_is_true(v));
        return 0;
    case PROTOBUF_C_TYPE_ENUM:
        if (json_is_string(v)) {
            const ProtobufCEnumValue *ev =
                protobuf_c_enum_descriptor_get_value_by_name(f->descriptor, json_string_value(v));
            if (!ev) {
                snprintf(d->err, d->errlen, "unknown value \"%s\" for enum %s",
                         json_string_value(v), go_type(f));
                return CAIRN_EINVAL;
            }
            u = (uint64_t)(int64_t)ev->value;
        } else if ((rc = int_of(d, v, f, 0, &u)) != 0)
            return rc;
        put_tag(w, f->id, 0);
        wire_uv_w(w, u);
        return 0;
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_UINT64:
        if ((rc = int_of(d, v, f,
                         f->type == PROTOBUF_C_TYPE_UINT32 || f->type == PROTOBUF_C_TYPE_UINT64,
                         &u)) != 0)
            return rc;
        put_tag(w, f->id, 0);
        wire_uv_w(w, u);
        return 0;
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SINT64:
        if ((rc = int_of(d, v, f, 0, &u)) != 0)
            return rc;
        put_tag(w, f->id, 0);
        wire_uv_w(w, (u << 1) ^ (uint64_t)((int64_t)u >> 63));
        return 0;
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
        if ((rc = int_of(d, v, f, f->type == PROTOBUF_C_TYPE_FIXED32, &u)) != 0)
            return rc;
        put_tag(w, f->id, 5);
        put_fixed(w, u, 4);
        return 0;
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
        if ((rc = int_of(d, v, f, f->type == PROTOBUF_C_TYPE_FIXED64, &u)) != 0)
            return rc;
        put_tag(w, f->id, 1);
        put_fixed(w, u, 8);
        return 0;
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
        if (!json_is_number(v))
            return bad_type(d, v, f);
        double x = json_number_value(v);
        if (f->type == PROTOBUF_C_TYPE_FLOAT) {
            float fl = (float)x;
            uint32_t b;
            memcpy(&b, &fl, 4);
            put_tag(w, f->id, 5);
            put_fixed(w, b, 4);
        } else {
            memcpy(&u, &x, 8);
            put_tag(w, f->id, 1);
            put_fixed(w, u, 8);
        }
        return 0;
    }
    case PROTOBUF_C_TYPE_STRING:
        if (!json_is_string(v))
            return bad_type(d, v, f);
        put_tag(w, f->id, 2);
        wire_uv_w(w, json_string_length(v));
        wire_bytes_w(w, json_string_value(v), json_string_length(v));
        return 0;
    case PROTOBUF_C_TYPE_BYTES: {
        if (!json_is_string(v))
            return bad_type(d, v, f);
        const char *s = json_string_value(v);
        size_t n = json_string_length(v), bl = 0;
        uint8_t *bin = malloc(n / 4 * 3 + 3);
        if (!bin)
            return CAIRN_ENOMEM;
        /* jsonpb: standard base64, else URL-safe; padding optional */
        static const int variants[] = {
            sodium_base64_VARIANT_ORIGINAL, sodium_base64_VARIANT_ORIGINAL_NO_PADDING,
            sodium_base64_VARIANT_URLSAFE, sodium_base64_VARIANT_URLSAFE_NO_PADDING};
        int ok = 0;
        for (size_t i = 0; i < 4 && !ok; i++) {
            const char *end = NULL;
            ok = sodium_base642bin(bin, n / 4 * 3 + 3, s, n, NULL, &bl, &end, variants[i]) == 0 &&
                 end == s + n;
        }
        if (!ok) {
            free(bin);
            snprintf(d->err, d->errlen, "illegal base64 data in field %s", f->name);
            return CAIRN_EINVAL;
        }
        put_tag(w, f->id, 2);
        wire_uv_w(w, bl);
        wire_bytes_w(w, bin, bl);
        free(bin);
        return 0;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        if (!json_is_object(v))
            return bad_type(d, v, f);
        wire_wr sub = {0};
        rc = encode_message(d, &sub, f->descriptor, v, depth + 1);
        if (rc == 0 && sub.err)
            rc = sub.err;
        if (rc == 0) {
            put_tag(w, f->id, 2);
            wire_uv_w(w, sub.len);
            wire_bytes_w(w, sub.p, sub.len);
        }
        free(sub.p);
        return rc;
    }
    }
    snprintf(d->err, d->errlen, "field %s: unsupported type", f->name);
    return CAIRN_EINVAL;
}

static int encode_message(dec *d, wire_wr *w, const ProtobufCMessageDescriptor *desc,
                          const json_t *obj, int depth)
{
    if (depth > PBJSON_MAX_DEPTH) {
        snprintf(d->err, d->errlen, "json: nested too deeply");
        return CAIRN_EINVAL;
    }
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        const ProtobufCFieldDescriptor *f = field_named(desc, key);
        if (!f || json_is_null(v))
            continue; /* etcd: unknown fields are ignored */
        int rc = 0;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            if (!json_is_array(v)) {
                snprintf(d->err, d->errlen, "json: cannot unmarshal %s into Go value of type []%s",
                         json_kind(v), go_type(f));
                return CAIRN_EINVAL;
            }
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e)
            {
                if ((rc = encode_value(d, w, f, e, depth)) != 0)
                    return rc;
            }
        } else if ((rc = encode_value(d, w, f, v, depth)) != 0)
            return rc;
        if (w->err)
            return w->err;
    }
    return 0;
}

/* Takes |root| (a reference). */
static int decode_root(wire_wr *out, const ProtobufCMessageDescriptor *desc, json_t *root,
                       char *err, size_t errlen)
{
    dec d = {err, errlen};
    int rc;
    if (json_is_null(root))
        rc = 0;
    else if (!json_is_object(root)) {
        /* etcd: Go's own text for a request that is not an object */
        snprintf(err, errlen,
                 "json: cannot unmarshal %s into Go value of type map[string]json.RawMessage",
                 json_kind(root));
        rc = CAIRN_EINVAL;
    } else
        rc = encode_message(&d, out, desc, root, 0);
    json_decref(root);
    if (rc == 0 && out->err)
        rc = out->err;
    return rc;
}

int pbjson_decode(wire_wr *out, const ProtobufCMessageDescriptor *desc, const char *json,
                  size_t len, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_DECODE_ANY, &je);
    if (!root) {
        snprintf(err, errlen, "%s", je.text);
        return CAIRN_EINVAL;
    }
    return decode_root(out, desc, root, err, errlen);
}

int pbjson_decode_next(wire_wr *out, size_t *used, const ProtobufCMessageDescriptor *desc,
                       const char *json, size_t len, char *err, size_t errlen)
{
    *used = 0;
    size_t skip = 0;
    while (skip < len &&
           (json[skip] == ' ' || json[skip] == '\t' || json[skip] == '\n' || json[skip] == '\r'))
        skip++;
    if (skip == len)
        return PBJSON_END;
    json_error_t je;
    json_t *root =
        json_loadb(json + skip, len - skip, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &je);
    if (!root) {
        snprintf(err, errlen, "%s", je.text);
        return CAIRN_EINVAL;
    }
    /* jansson: with the EOF check off, the position is the bytes read */
    *used = skip + (size_t)je.position;
    if (*used > len)
        *used = len;
    return decode_root(out, desc, root, err, errlen);
}

/* ---- encoding ------------------------------------------------------------ */

static json_t *message_json(const ProtobufCMessage *m);

static json_t *u64_str(uint64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    return json_string(b);
}

static json_t *i64_str(int64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%lld", (long long)v);
    return json_string(b);
}

/* The value at |p| of field |f|, or NULL when it is the default and
 * |keep_default| is not set (a repeated element, a oneof member). */
static json_t *value_json(const ProtobufCFieldDescriptor *f, const void *p, int keep_default)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: {
        int32_t v = *(const int32_t *)p;
        return v || keep_default ? json_integer(v) : NULL;
    }
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: {
        uint32_t v = *(const uint32_t *)p;
        return v || keep_default ? json_integer(v) : NULL;
    }
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: {
        int64_t v = *(const int64_t *)p;
        return v || keep_default ? i64_str(v) : NULL;
    }
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t v = *(const uint64_t *)p;
        return v || keep_default ? u64_str(v) : NULL;
    }
    case PROTOBUF_C_TYPE_FLOAT: {
        float v = *(const float *)p;
        return v != 0 || keep_default ? json_real(v) : NULL;
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
        double v = *(const double *)p;
        return v != 0 || keep_default ? json_real(v) : NULL;
    }
    case PROTOBUF_C_TYPE_BOOL: {
        protobuf_c_boolean v = *(const protobuf_c_boolean *)p;
        return v || keep_default ? json_boolean(v) : NULL;
    }
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        if (!v && !keep_default)
            return NULL;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
        return ev ? json_string(ev->name) : json_integer(v);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        if (!s || (!*s && !keep_default))
            return keep_default ? json_string("") : NULL;
        return json_string(s);
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        if (!b->len && !keep_default)
            return NULL;
        size_t n = sodium_base64_ENCODED_LEN(b->len, sodium_base64_VARIANT_ORIGINAL);
        char *s = malloc(n);
        if (!s)
            return NULL;
        sodium_bin2base64(s, n, b->data ? b->data : (const unsigned char *)"", b->len,
                          sodium_base64_VARIANT_ORIGINAL);
        json_t *j = json_string(s);
        free(s);
        return j;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        return sub ? message_json(sub) : NULL;
    }
    }
    return NULL;
}

static size_t elem_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM:
        return sizeof(int);
    default:
        return 4;
    }
}

static json_t *message_json(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    json_t *o = json_object();
    if (!o)
        return NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *base = (const char *)m;
        const void *p = base + f->offset;
        json_t *v = NULL;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            if (n == 0)
                continue;
            v = json_array();
            const char *arr = *(char *const *)p;
            for (size_t k = 0; v && k < n; k++) {
                json_t *e = value_json(f, arr + k * elem_size(f), 1);
                if (!e || json_array_append_new(v, e) != 0) {
                    json_decref(v);
                    v = NULL;
                }
            }
            if (!v)
                goto oom;
        } else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)(base + f->quantifier_offset) != f->id)
                continue;
            v = value_json(f, p, 1);
            if (!v)
                goto oom;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset &&
                   f->type != PROTOBUF_C_TYPE_MESSAGE && f->type != PROTOBUF_C_TYPE_STRING) {
            if (!*(const protobuf_c_boolean *)(base + f->quantifier_offset))
                continue;
            v = value_json(f, p, 1);
            if (!v)
                goto oom;
        } else {
            v = value_json(f, p, 0);
            if (!v)
                continue; /* the default (or out of memory: a field less) */
        }
        if (json_object_set_new(o, f->name, v) != 0)
            goto oom;
    }
    return o;
oom:
    json_decref(o);
    return NULL;
}

char *pbjson_encode(const ProtobufCMessage *m)
{
    json_t *o = message_json(m);
    if (!o)
        return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

char *pbjson_quote(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (!j)
        return NULL;
    char *q = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(j);
    return q;
}
