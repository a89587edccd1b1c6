/*
 * etcd's Auth service: registered so that every method answers with what
 * cairn lacks (it has no users, roles or tokens), UNIMPLEMENTED, rather
 * than grpc-go's "unknown method".
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"

static void auth_unimplemented(rpc_call *c, const uint8_t *req, size_t len)
{
    if (etcd_learner_refuses(c))
        return;
    (void)req;
    (void)len;
    etcd_unsupported(c, ": cairn has no authentication (Auth service)");
}

static const rpc_method auth_methods[] = {
    {"/etcdserverpb.Auth/AuthEnable", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/AuthDisable", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/Authenticate", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/UserAdd", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/UserGet", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/UserList", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/UserDelete", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/UserChangePassword", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/UserGrantRole", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/UserRevokeRole", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/RoleAdd", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/RoleGet", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/RoleList", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/RoleDelete", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/RoleGrantPermission", RPC_UNARY, auth_unimplemented, 1},
    {"/etcdserverpb.Auth/RoleRevokePermission", RPC_UNARY, auth_unimplemented, 1},
};

const rpc_service etcd_auth_service = {"etcdserverpb.Auth", auth_methods,
                                       sizeof auth_methods / sizeof auth_methods[0], NULL};
