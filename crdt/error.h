#ifndef CAIRN_ERROR_H
#define CAIRN_ERROR_H

/*
 * Every error cairn can return, in one table. Each row gives the enum name,
 * the gRPC status code a client sees for it, and the message. Rows marked
 * "etcd:" carry etcd 3.4's exact status and text (etcdserver/api/v3rpc/
 * rpctypes), so that clients matching on them behave as against etcd.
 *
 * Codes are negative; 0 is success. gRPC status numbers: 1 CANCELLED,
 * 3 INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED, 5 NOT_FOUND, 6 ALREADY_EXISTS, 8 RESOURCE_EXHAUSTED,
 * 9 FAILED_PRECONDITION, 11 OUT_OF_RANGE, 12 UNIMPLEMENTED, 13 INTERNAL,
 * 14 UNAVAILABLE, 15 DATA_LOSS.
 */
#define CAIRN_ERRORS(X)                                                                            \
    X(ENOMEM, 8, "cairn: out of memory")                                                           \
    X(EINVAL, 3, "cairn: invalid argument")                                                        \
    X(ETRUNCATED, 3, "cairn: truncated input")                                                     \
    X(ELIMIT, 3, "cairn: input exceeds a size limit")                                              \
    X(ENONCANON, 3, "cairn: non-canonical encoding")                                               \
    X(EBADVERSION, 3, "cairn: unknown format version")                                             \
    X(EBADHASH, 3, "cairn: change bytes do not match its hash")                                    \
    X(EUNSORTED, 3, "cairn: dependencies not sorted or duplicated")                                \
    X(ESEQGAP, 3, "cairn: change sequence number skips")                                           \
    X(EFORK, 3, "cairn: two different changes with one actor and sequence number")                 \
    X(EBADOP, 3, "cairn: malformed operation")                                                     \
    X(ENOOBJ, 5, "cairn: no such object")                                                          \
    X(ENOTFOUND, 5, "cairn: not found")                                                            \
    X(EDUPLICATE, 6, "cairn: already present")                                                     \
    X(EMISSINGDEP, 9, "cairn: missing dependency")                                                 \
    X(ESTATE, 9, "cairn: operation not valid in this state")                                       \
    X(EIO, 13, "cairn: I/O error")                                                                 \
    X(ECORRUPT, 15, "cairn: corrupt data on disk")                                                 \
    X(EUNIMPLEMENTED, 12, "cairn: not implemented")                                                \
    /* etcd: the errors below are etcd's own (status and message). */                              \
    X(EEMPTYKEY, 3, "etcdserver: key is not provided")                                             \
    X(EKEYNOTFOUND, 3, "etcdserver: key not found")                                                \
    X(EVALUEPROVIDED, 3, "etcdserver: value is provided")                                          \
    X(ELEASEPROVIDED, 3, "etcdserver: lease is provided")                                          \
    X(ETOOMANYOPS, 3, "etcdserver: too many operations in txn request")                            \
    X(EDUPKEY, 3, "etcdserver: duplicate key given in txn request")                                \
    X(ECOMPACTED, 11, "etcdserver: mvcc: required revision has been compacted")                    \
    X(EFUTUREREV, 11, "etcdserver: mvcc: required revision is a future revision")                  \
    X(ENOSPACE, 8, "etcdserver: mvcc: database space exceeded")                                    \
    X(ELEASENOTFOUND, 5, "etcdserver: requested lease not found")                                  \
    X(ELEASEEXIST, 9, "etcdserver: lease already exists")                                          \
    X(ELEASETTLTOOLARGE, 11, "etcdserver: too large lease TTL")                                    \
    X(EWATCHCANCELED, 1, "etcdserver: watch canceled")                                             \
    /* etcd mvcc: a watch create answered "canceled" with this reason. */                          \
    X(EWATCHEMPTYRANGE, 3, "mvcc: watcher range is empty")                                         \
    X(EWATCHDUPID, 3, "mvcc: duplicate watch ID provided on the WatchStream")                      \
    X(EMEMBERNOTFOUND, 5, "etcdserver: member not found")                                          \
    X(EREQUESTTOOLARGE, 3, "etcdserver: request is too large")                                     \
    X(ETOOMANYREQUESTS, 8, "etcdserver: too many requests")                                        \
    X(ESTOPPED, 14, "etcdserver: server stopped")                                                  \
    X(ETIMEOUT, 14, "etcdserver: request timed out")                                               \
    X(ECORRUPTCLUSTER, 15, "etcdserver: corrupt cluster")                                          \
    /* grpc-go's own errors as etcd's server sends them (server/ only). */                         \
    X(EUNMARSHAL, 13, "grpc: error unmarshalling request: malformed message")                      \
    X(EMSGTOOLARGE, 8, "grpc: received message larger than max")                                   \
    X(ENOSUCHMETHOD, 12, "unknown method")                                                         \
    /* crdt, added last so that no other code's number moves. */                                   \
    X(ENOTPAST, 3, "cairn: change names an op outside its causal past")                            \
    /* the Replication service */                                                                  \
    X(ENOTHERE, 9, "cairn: not here yet")                                                          \
    X(EREPLAY, 8, "cairn: too many changes to replay for these heads")                             \
    X(ENOTREPLICATED, 4, "cairn: not replicated before the deadline")                              \
    /* etcd: membership (rpctypes), added last too. */                                             \
    X(EMEMBEREXIST, 9, "etcdserver: member ID already exist")                                      \
    X(EPEERURLEXIST, 9, "etcdserver: Peer URLs already exists")                                    \
    X(EMEMBERBADURLS, 3, "etcdserver: given member URLs are invalid")                              \
    X(EMEMBERNOTLEARNER, 9, "etcdserver: can only promote a learner member")                       \
    X(ELEARNERNOTREADY, 9,                                                                         \
      "etcdserver: can only promote a learner member which is in sync with leader")                \
    X(ETOOMANYLEARNERS, 9, "etcdserver: too many learner members in cluster")                      \
    X(ENOTFORLEARNER, 14, "etcdserver: rpc not supported for learner")                             \
    /* crdt: a change whose causal past holds a refused change (added last). */                    \
    X(EPASTREFUSED, 3, "cairn: change depends on a refused change")                                \
    X(EFORKPAST, 3, "cairn: change depends on the refused side of a fork")                         \
    /* etcd: v3lock / v3election (clientv3 concurrency errors: code Unknown) */                    \
    X(ENOTLEADER, 2, "election: not leader")                                                       \
    X(ENOLEADER, 2, "election: no leader")                                                         \
    X(ENOLEADERKEY, 2, "\"leader\" field must be provided")                                        \
    X(ESESSIONEXPIRED, 2, "mutex: session is expired")                                             \
    X(ECAMPAIGNLOST, 2, "election: session is expired")                                            \
    /* etcd: a store error seen through v3client: its text, code Unknown */                        \
    X(EPASSED, 2, "etcdserver: unknown error")                                                     \
    X(ECANCELLED, 1, "context canceled")

enum {
    CAIRN_OK = 0,
    CAIRN_ERROR_BASE_ = -1000,
#define CAIRN_ERROR_ENUM_(name, grpc, msg) CAIRN_##name,
    CAIRN_ERRORS(CAIRN_ERROR_ENUM_)
#undef CAIRN_ERROR_ENUM_
        CAIRN_ERROR_END_
};

/* The message for |rc| (static storage). Unknown codes give a generic text. */
const char *cairn_strerror(int rc);

/* The gRPC status code for |rc|: 0 for CAIRN_OK, 2 (UNKNOWN) if unknown. */
int cairn_error_grpc_status(int rc);

/* The enum's name without prefix ("ENOMEM"), for logs and tests. */
const char *cairn_error_name(int rc);

#endif
