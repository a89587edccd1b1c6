/*
 * The error table's functions. All data comes from CAIRN_ERRORS in error.h,
 * so a new error is one line there.
 */
#include "crdt/error.h"

#include <stddef.h>

struct row {
    const char *name;
    int grpc;
    const char *msg;
};

static const struct row rows[] = {
#define ROW_(name, grpc, msg) {#name, grpc, msg},
    CAIRN_ERRORS(ROW_)
#undef ROW_
};

static const struct row *find(int rc)
{
    int i = rc - CAIRN_ERROR_BASE_ - 1;
    if (i < 0 || (size_t)i >= sizeof rows / sizeof rows[0])
        return NULL;
    return &rows[i];
}

const char *cairn_strerror(int rc)
{
    if (rc == CAIRN_OK)
        return "ok";
    const struct row *r = find(rc);
    return r ? r->msg : "cairn: unknown error";
}

int cairn_error_grpc_status(int rc)
{
    if (rc == CAIRN_OK)
        return 0;
    const struct row *r = find(rc);
    return r ? r->grpc : 2;
}

const char *cairn_error_name(int rc)
{
    if (rc == CAIRN_OK)
        return "OK";
    const struct row *r = find(rc);
    return r ? r->name : "EUNKNOWN";
}
