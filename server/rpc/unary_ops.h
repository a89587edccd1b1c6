#ifndef CAIRN_SERVER_UNARY_OPS_H
#define CAIRN_SERVER_UNARY_OPS_H

/*
 * The six operations of one unary gRPC call made as a client (gRPC's core
 * API): send the metadata, the request and the close; receive the
 * metadata, the answer and the status. Header only, gRPC only, so that
 * the JSON gateway (server/http/gateway.c), the load generator
 * (bench/loadgen_rpc.c), cairnctl and test_server share it without
 * sharing a library.
 */

#include <grpc/grpc.h>
#include <string.h>

/* Fills |ops| for grpc_call_start_batch(call, ops, 6, ...). Every pointer
 * is borrowed and must stay valid until the batch completes: |send| the
 * request, then where the answer's parts go. */
static inline void rpc_unary_ops(grpc_op ops[6], grpc_byte_buffer *send, grpc_metadata_array *md,
                                 grpc_byte_buffer **recv, grpc_metadata_array *trailing,
                                 grpc_status_code *status, grpc_slice *details)
{
    memset(ops, 0, 6 * sizeof *ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = trailing;
    ops[5].data.recv_status_on_client.status = status;
    ops[5].data.recv_status_on_client.status_details = details;
}

#endif
