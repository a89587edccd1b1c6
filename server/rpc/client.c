/*
 * One blocking unary call (client.h): a pluck queue of the call's own, the
 * six operations of rpc_unary_ops in one batch, and a wait for that batch.
 * gRPC completes the batch in every case (answer, status, the deadline
 * passing, the channel failing), so the wait needs no timeout of its own:
 * the call's deadline is the bound.
 */
#include "server/rpc/client.h"

#include "crdt/error.h"
#include "server/rpc/unary_ops.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdlib.h>
#include <string.h>

/* The answer's bytes into |r| (0 or CAIRN_ENOMEM). */
static int take_answer(rpc_client_reply *r, grpc_byte_buffer *recv)
{
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, recv))
        return CAIRN_EIO;
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    size_t n = GRPC_SLICE_LENGTH(all);
    r->bytes = malloc(n ? n : 1);
    if (r->bytes) {
        memcpy(r->bytes, GRPC_SLICE_START_PTR(all), n);
        r->len = n;
    }
    grpc_slice_unref(all);
    return r->bytes ? 0 : CAIRN_ENOMEM;
}

int rpc_client_unary(rpc_client_reply *out, grpc_channel *ch, const char *method,
                     const uint8_t *req, size_t len, int64_t timeout_ms)
{
    memset(out, 0, sizeof *out);
    gpr_timespec deadline = timeout_ms < 0
                                ? gpr_inf_future(GPR_CLOCK_MONOTONIC)
                                : gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                               gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_call *call =
        grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                 grpc_slice_from_static_string(method), NULL, deadline, NULL);
    grpc_slice body = grpc_slice_from_copied_buffer((const char *)req, len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array imd, tmd;
    grpc_metadata_array_init(&imd);
    grpc_metadata_array_init(&tmd);
    grpc_slice details = grpc_empty_slice();
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_op ops[6];
    rpc_unary_ops(ops, send, &imd, &recv, &tmd, &status, &details);
    int rc = CAIRN_EIO;
    if (call && grpc_call_start_batch(call, ops, 6, ops, NULL) == GRPC_CALL_OK) {
        grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        char *d = grpc_slice_to_c_string(details);
        out->status = status;
        out->details = strdup(d);
        gpr_free(d);
        rc = out->details ? 0 : CAIRN_ENOMEM;
        if (!rc && recv)
            rc = take_answer(out, recv);
    }
    if (call)
        grpc_call_unref(call);
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_metadata_array_destroy(&imd);
    grpc_metadata_array_destroy(&tmd);
    grpc_slice_unref(details);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    if (rc)
        rpc_client_reply_destroy(out);
    return rc;
}

void rpc_client_reply_destroy(rpc_client_reply *r)
{
    free(r->details);
    free(r->bytes);
    memset(r, 0, sizeof *r);
}
