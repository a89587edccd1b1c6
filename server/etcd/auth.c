/*
 * etcd's Auth service: registered so that every method answers with what
 * cairn lacks (it has no users, roles or tokens), UNIMPLEMENTED, rather
 * than grpc-go's "unknown method".
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"

static void auth_unimplemented(rpc_call *c, const uint8_t *req, size_t len)
{
    (void)req;
    (void)len;
    etcd_unsupported(c, ": cairn has no authentication (Auth service)");
}

static const rpc_method auth_methods[] = {
    {"/etcdserverpb.Auth/AuthEnable", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_enable_request__descriptor},
    {"/etcdserverpb.Auth/AuthDisable", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_disable_request__descriptor},
    {"/etcdserverpb.Auth/Authenticate", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__authenticate_request__descriptor},
    {"/etcdserverpb.Auth/UserAdd", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_user_add_request__descriptor},
    {"/etcdserverpb.Auth/UserGet", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_user_get_request__descriptor},
    {"/etcdserverpb.Auth/UserList", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_user_list_request__descriptor},
    {"/etcdserverpb.Auth/UserDelete", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_user_delete_request__descriptor},
    {"/etcdserverpb.Auth/UserChangePassword", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_user_change_password_request__descriptor},
    {"/etcdserverpb.Auth/UserGrantRole", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_user_grant_role_request__descriptor},
    {"/etcdserverpb.Auth/UserRevokeRole", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_user_revoke_role_request__descriptor},
    {"/etcdserverpb.Auth/RoleAdd", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_role_add_request__descriptor},
    {"/etcdserverpb.Auth/RoleGet", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_role_get_request__descriptor},
    {"/etcdserverpb.Auth/RoleList", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_role_list_request__descriptor},
    {"/etcdserverpb.Auth/RoleDelete", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_role_delete_request__descriptor},
    {"/etcdserverpb.Auth/RoleGrantPermission", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_role_grant_permission_request__descriptor},
    {"/etcdserverpb.Auth/RoleRevokePermission", RPC_UNARY, auth_unimplemented, 1,
     &etcdserverpb__auth_role_revoke_permission_request__descriptor},
};

const rpc_service etcd_auth_service = {"etcdserverpb.Auth", auth_methods,
                                       sizeof auth_methods / sizeof auth_methods[0], NULL,
                                       etcd_admit};
