/*
 * libFuzzer target for the store's history record decoder (cairn_store_krec_parse)
 * and the check of a body reference against a change body
 * (cairn_store_krec_body_value). Both read bytes from disk, so a damaged
 * record must be CAIRN_ECORRUPT, never a crash or a read outside the record.
 *
 * Input: u8 kvs map counter ++ u8 key length ++ key ++ u8 record length ++
 * record ++ change body. A body that does not decode (or is empty) is
 * replaced by a fixed change built here with the crdt API, whose ops are the
 * cases a reference can meet: a SET of kvs[key], a DEL, a SET in another
 * map, a MAKE_MAP, a non-bytes SET.
 *
 * Checked: the parse result is 0 or CAIRN_ECORRUPT; an accepted record has
 * exactly one kind (tombstone, body reference, inline value); create_rev and
 * version fit an int64 (they are read back as one); its value lies
 * inside the record and is empty unless inline; its canonical re-encoding
 * parses to the same fields; a body reference is accepted exactly when op
 * |pos| exists and sets kvs[key], and its value then lies inside that op's
 * value.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crdt/change.h"
#include "crdt/error.h"
#include "store/store_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

/* The fixed change: actor 0x11.., seq 1, ops counted from 10; kvs is the map
 * made by op counter 2 of actor 0. */
static cairn_change *fixed_change(void)
{
    static cairn_change *c;
    if (c)
        return c;
    static cairn_op ops[6];
    static cairn_actor actors[1];
    memset(actors[0].b, 0x11, sizeof actors[0].b);
    const cairn_opid kvs = {2, 0}, other = {3, 0};
    ops[0] = (cairn_op){.action = CAIRN_OP_SET,
                        .obj = kvs,
                        .key = (const uint8_t *)"a",
                        .key_len = 1,
                        .value = {.type = CAIRN_V_BYTES, .v.bytes = {(const uint8_t *)"\0v1", 3}}};
    ops[1] =
        (cairn_op){.action = CAIRN_OP_DEL, .obj = kvs, .key = (const uint8_t *)"b", .key_len = 1};
    ops[2] =
        (cairn_op){.action = CAIRN_OP_SET,
                   .obj = kvs,
                   .key = (const uint8_t *)"k",
                   .key_len = 1,
                   .value = {.type = CAIRN_V_BYTES, .v.bytes = {(const uint8_t *)"\x05hello", 6}}};
    ops[3] = (cairn_op){.action = CAIRN_OP_SET,
                        .obj = other,
                        .key = (const uint8_t *)"a",
                        .key_len = 1,
                        .value = {.type = CAIRN_V_BYTES, .v.bytes = {(const uint8_t *)"\0x", 2}}};
    ops[4] = (cairn_op){
        .action = CAIRN_OP_MAKE_MAP, .obj = kvs, .key = (const uint8_t *)"m", .key_len = 1};
    ops[5] = (cairn_op){.action = CAIRN_OP_SET,
                        .obj = kvs,
                        .key = (const uint8_t *)"",
                        .key_len = 0,
                        .value = {.type = CAIRN_V_INT, .v.i = 7}};
    cairn_change t = {.actor = actors[0],
                      .seq = 1,
                      .start_op = 10,
                      .nactors = 1,
                      .actors = actors,
                      .nops = 6,
                      .ops = ops};
    check(cairn_change_new(&c, &t) == 0 && cairn_change_encode(c) == 0);
    return c;
}

static void check_body(const cairn_change *c, uint64_t kvs, const cairn_store_krec *r,
                       const uint8_t *key, size_t key_len)
{
    const uint8_t *val = (const uint8_t *)"x";
    size_t vl = 1;
    int rc = cairn_store_krec_body_value(c, kvs, r->pos, key, key_len, &val, &vl);
    int want = r->pos < c->nops && c->ops[r->pos].action == CAIRN_OP_SET &&
               c->ops[r->pos].obj.counter == kvs && c->ops[r->pos].key_len == key_len &&
               (!key_len || memcmp(c->ops[r->pos].key, key, key_len) == 0);
    check(want ? rc == 0 : rc == CAIRN_ECORRUPT);
    if (rc) {
        check(val == NULL && vl == 0);
        return;
    }
    const cairn_value *v = &c->ops[r->pos].value;
    if (v->type == CAIRN_V_BYTES || v->type == CAIRN_V_STR) {
        const uint8_t *b = v->v.bytes.ptr, *e = b + v->v.bytes.len;
        check(val >= b && val <= e && vl <= (size_t)(e - val));
    } else {
        check(vl == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    if (end - p < 2)
        return 0;
    uint64_t kvs = *p++;
    size_t key_len = *p++;
    if ((size_t)(end - p) < key_len + 1)
        return 0;
    const uint8_t *key = p;
    p += key_len;
    size_t rl = *p++;
    if ((size_t)(end - p) < rl)
        return 0;
    /* A copy of exactly rl bytes, so ASan sees any read past the record. */
    uint8_t *rec = malloc(rl ? rl : 1);
    if (!rec)
        return 0;
    memcpy(rec, p, rl);
    p += rl;

    cairn_store_krec r;
    int rc = cairn_store_krec_parse(&r, rec, rl);
    if (rc) {
        check(rc == CAIRN_ECORRUPT);
        free(rec);
        return 0;
    }
    check(rl >= 1 && r.del + r.body <= 1 && r.cr <= INT64_MAX && r.ver <= INT64_MAX);
    check(r.val >= rec && r.val <= rec + rl && r.val_len == (size_t)(rec + rl - r.val));
    if (r.del || r.body)
        check(r.val_len == 0);

    /* The canonical encoding of the fields parses back to the same record. */
    uint8_t canon[1 + 50 + 256];
    size_t cl = 0;
    canon[cl++] = rec[0];
    cl += cairn_store_put_varint(canon + cl, r.sub);
    cl += cairn_store_put_varint(canon + cl, r.cr);
    cl += cairn_store_put_varint(canon + cl, r.ver);
    cl += cairn_store_put_varint(canon + cl, r.lease);
    if (r.body)
        cl += cairn_store_put_varint(canon + cl, r.pos);
    check(cl <= (size_t)(r.val - rec));
    memcpy(canon + cl, r.val, r.val_len);
    cl += r.val_len;
    cairn_store_krec r2;
    check(cairn_store_krec_parse(&r2, canon, cl) == 0);
    check(r2.del == r.del && r2.body == r.body && r2.sub == r.sub && r2.cr == r.cr &&
          r2.ver == r.ver && r2.lease == r.lease && r2.pos == r.pos && r2.val_len == r.val_len &&
          (!r.val_len || memcmp(r2.val, r.val, r.val_len) == 0));

    if (r.body) {
        cairn_change *c = NULL;
        if (p < end && cairn_change_decode(&c, p, (size_t)(end - p), NULL) == 0) {
            check_body(c, kvs, &r, key, key_len);
            cairn_change_free(c);
        }
        check_body(fixed_change(), kvs, &r, key, key_len);
    }
    free(rec);
    return 0;
}
