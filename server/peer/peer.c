/*
 * The peer transport (peer.h): a gRPC server on the peer URLs and a client
 * channel per member, both on one completion queue that one thread drives,
 * so no lock guards the links and peers (only the push queues, which the
 * store's completer fills). Each stream starts with a Hello each way
 * (proto/cairnpb/peer.proto); a refused one is cancelled with the reason
 * as its status, and the refusing side logs it.
 *
 * ONE STREAM PER PAIR. Both members dial while they have no stream to the
 * other. When a second stream to the same member passes its hello, the one
 * dialed by the member with the lower member id wins (both ends compute
 * the same), and between two dialed by the same member the newer wins (the
 * older is a stream the dialer already gave up on). The loser is cancelled.
 *
 * PUSH AND SYNC. The store's subscriber copies every durable change into
 * each connected peer's queue, bounded at PEER_QUEUE_BYTES: when it is
 * full the change is dropped for that peer and the periodic sync, which
 * works from the document, sends it later (the completer never waits). The
 * thread sends one message at a time per stream: the queued changes this
 * node authored as one push (changes from other members reach a peer by its
 * own links or by sync), else a sync message every --sync-interval-ms, at
 * once after a (re)connect or a message that asks for an answer, and after
 * a received message was made durable (an acknowledgement). Each period
 * first ticks the session (cairn_sync_tick), which keeps the links quiet:
 * pushes are answered by one heads-only acknowledgement per PEER_TICK_MS
 * at most, however many arrived meanwhile (sent once what they carried is
 * durable, so a peer's heads always name changes durable there:
 * peer_net_acked_heads); news of our heads alone waits for the period;
 * changes of other authors wait a period too, so that in a full mesh each
 * reaches a peer from its author only, not relayed by every member that
 * has it.
 *
 * WAKING. Between events the thread waits in grpc_completion_queue_next
 * for up to PEER_TICK_MS, and a change queued meanwhile would wait there
 * too (half a tick on average, between the fsync and the push). So the
 * committer wakes it: gRPC's C core has no public alarm, and the wake is
 * a client call on a channel that never connects (wake_ch), with only a
 * RECV_STATUS_ON_CLIENT started. A call reaches a transport with its
 * initial metadata, which this one never sends, so only a cancel
 * completes it; grpc_call_cancel is safe from any thread, and posts the
 * completion and kicks the poller (an eventfd write). The thread arms
 * it (wake_armed) just before it waits with nothing to send, and takes
 * the flag back when it wakes for any reason; the first push queued in
 * between takes the flag and cancels, the others see it taken. So a
 * burst of durable groups costs one wakeup per wait of the thread, not
 * one per group, and the committer only ever cancels a call the thread
 * left pending for it (the thread makes the next one once the cancelled
 * one completed). What the push then carries is what queued until the
 * thread got there; one message in flight per stream, and a push per
 * PEER_PUSH_GAP_US at most, batch the rest (the thread is not armed while
 * a push waits for its gap: it comes back for it).
 *
 * PARTIAL MESH. With --peer-links a node dials and accepts only the members
 * named there (a hello from another is refused), and its pushes relay: they
 * carry every queued change except those the peer authored or sent us
 * (replica.h), so a change crosses a line of sites hop by hop at push speed
 * instead of one sync interval per hop. In a full mesh every member hears
 * each change from its author, and a relay would only send duplicates.
 * Such a node also tells its links the client URLs it knows of every
 * member (a Members message, again whenever they change; of two reports on
 * a member the one from its later start wins), so MemberList names them
 * on nodes with no link to that member.
 * REFUSALS. A message that does not decode or does not fit the stream, a
 * sync message crdt/sync refuses (not canonical, over a limit,
 * truncated), or a change the document refuses (its sequence rule, an op
 * outside its causal past, a refused change in its past: doc.h): nothing
 * of that change is applied, a WARN line names the peer (its address
 * before its hello) and why, and the stream is refused: a Goodbye saying
 * "refused: <why>", then PERMISSION_DENIED with the same words (the peer
 * is not denied one call but refused as a peer for a while, and gRPC's
 * clients retry neither; INVALID_ARGUMENT would say "fix this message and
 * send again"). A refused member, once it is known to be who it says
 * (dialed by us, or its hello passed, the certificate's check included),
 * is not dialed nor accepted for PEER_REFUSE_MS (its hellos meanwhile get
 * the same goodbye, logged at debug level), so a hostile peer costs a
 * refusal every PEER_REFUSE_MS at most; a peer that refused us is not
 * dialed for as long. An unnamed one (a bad hello, a refused certificate)
 * cannot be told from the members sharing its address, so only its
 * stream is refused. A fork's other side (CAIRN_EFORK, CAIRN_EFORKPAST)
 * is no refusal: an honest peer may hold it (README, "Forks"); it is
 * logged (log_fork) and not applied, and the stream stays.
 *
 * LEAVING. On shutdown every live stream gets a Goodbye and its clean
 * close (the client's half-close, the server's OK status), and the thread
 * waits up to PEER_GOODBYE_MS for the peers to end theirs before it
 * cancels what is left: the peer logs a departure, not a broken stream,
 * and dials again with its backoff. Per-peer counters (peer_stats) are
 * atomics the peer thread and the committer bump and any thread reads;
 * the line logged when a stream closes carries them.
 *
 * MEMBERSHIP. The peers start as --initial-cluster names them and then
 * follow the store's member table (store/members.c) on this thread: a
 * member added there gets a peer (dialed and accepted like the others), a
 * member whose peer URLs changed is dialed at the new address (its dialed
 * stream is closed so the next dial goes there; a --peer-dials address
 * stands for the member's --initial-cluster URL only), and a removed
 * member is still pushed to for PEER_REMOVE_GRACE_MS (the table moves when
 * the removal is applied, its push follows the fsync: so the removal
 * reaches it), then sent what is left queued and a Goodbye; after that it
 * is never dialed or synced with again and its hellos are refused with
 * etcd's "the member has been permanently removed from the cluster". A
 * node that sees itself removed (from its table, once it was in it, or in
 * such a refusal) logs that line and stops as on SIGTERM, as etcd's
 * removed member exits. Peer slots are never reused (etcd never reuses a
 * removed id either), at most PEER_MAX_MEMBERS per process.
 *
 * JOIN. A node started with --initial-cluster-state existing on an empty
 * data dir has no identity yet: before its store opens it calls
 * cairnpb.Peer/Join (unary) on the other members of --initial-cluster in
 * turn, on a scratch peer_net that only holds the TLS settings
 * (peer_net_join). A member serves the call on this thread: the request's
 * checks and the answer are peer_msg.c's (sans-I/O, fuzzed), from the
 * member table and heads read from the store, after the same certificate
 * checks as a stream's. The joiner's peers are then the answered table
 * (add_peers' seed), whose ids --initial-cluster cannot give for members
 * that were added (etcd: their ids carry the time of the add).
 *
 * TLS. An https:// peer URL is served and dialed with gRPC's TLS
 * credentials from the --peer-* flags; the server asks for a client
 * certificate but leaves every check of it to tls/ (cairn_tls_check_pem,
 * the same checks as the client links, with etcd's reasons), run on the
 * certificate in the call's auth context first thing once the hello
 * decoded and names this cluster (peer_msg.c), before the member it names
 * is looked at: a refused certificate is logged and the stream cancelled
 * before anything the peer sent is applied. The dialing side checks the
 * answering member's certificate the same way (gRPC verified its chain
 * and host already).
 */
#include "server/peer/peer.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cairnpb/peer.pb-c.h"
#include "crdt/error.h"
#include "server/peer/peer_msg.h"
#include "server/rpc/client.h"
#include "server/rpc/rpc.h"
#include "server/tls/tls.h"
#include "store/replica.h"

#define PEER_METHOD "/cairnpb.Peer/Stream"
#define PEER_JOIN_METHOD "/cairnpb.Peer/Join"
/* A joining node asks each member this long (dial and answer). */
#define PEER_JOIN_MS 5000
#define PEER_QUEUE_BYTES (8u << 20)
#define PEER_BACKOFF_MIN_MS 20u
#define PEER_BACKOFF_MAX_MS 2000u
#define PEER_TICK_MS 10
/* At most one log line per peer this often for its changes this node could
 * not take for its own limits (a full pending buffer). */
#define PEER_LIMIT_LOG_MS 10000
/* Pushes to one peer are this far apart at least: a change that finds the
 * link quiet goes at once, one made during a stream of writes waits for
 * the gap and shares the push. A push costs ~26 bytes besides its changes
 * (HTTP/2 and gRPC framing 14, the PeerMessage 6, the sync header 4, a
 * length per change), and every change after the first that depends on
 * the one before it travels without that 32-byte id (crdt/sync.c, version
 * 2): at one change of ~150 bytes per push the links would carry ~1.2x the
 * changes' bytes, acknowledgements and window updates included; at four,
 * about 1.0x (bench figure d). */
#define PEER_PUSH_GAP_US 2000u
/* With no other member there is nothing to tick for: the thread only
 * answers (and refuses) dials, and wakes this often to see a stop. A
 * thread in grpc_completion_queue_next is one of gRPC's pollers (epoll1
 * polls one epoll set for every fd), which picks up client connections'
 * I/O and hands each request on to a worker with a wakeup: so while idle
 * the thread sleeps and only takes, without waiting, what its queue holds
 * (the client workers poll the peer sockets meanwhile). Measured under
 * etcd's benchmark put: the thread had a sixth of the server's CPU. */
#define PEER_IDLE_MS 100
#define PEER_GOODBYE_MS 500
/* A peer refused for what it sent (REFUSALS above) is neither dialed nor
 * accepted again for this long, so a hostile one cannot spin the node. */
#define PEER_REFUSE_MS 2000u
/* Peer slots for the life of the process (members ever known, this one
 * excluded): slots are filled in place, so other threads may walk them. */
#define PEER_MAX_MEMBERS 64
/* etcd's line and refusal for a removed member (measured: etcd logs it
 * and exits). */
/* A removed member is still pushed to this long before its Goodbye: the
 * table moves when the removal is applied, the push follows its fsync. */
#define PEER_REMOVE_GRACE_MS 1000
#define PEER_REMOVED "the member has been permanently removed from the cluster"
/* crdt/sync's largest message, and room for the framing. */
#define PEER_MAX_MSG_BYTES (96 << 20)

enum { T_ACCEPT, T_SEND, T_RECV, T_CLOSE, T_SHUTDOWN, T_WAKE, T_JOIN };

/* The wake call's life (peer_net.wake_state, the peer thread's alone). */
enum {
    W_NONE,  /* no call: not made yet, or stopping (ticks only) */
    W_IDLE,  /* pending, the thread's: not armed */
    W_ARMED, /* pending, wake_armed set: the committer may take it */
    W_TAKEN  /* the committer took it (and cancels it): a T_WAKE is due */
};

typedef struct ptag {
    int what;
    struct plink *l;
} ptag;

typedef struct plink {
    struct peer_net *n;
    struct ppeer *p; /* dialed: its target; accepted: set by the hello */
    int dialed;
    grpc_call *call;
    grpc_metadata_array md; /* accepted: the request's; dialed: the answer's */
    grpc_metadata_array trailing;
    grpc_status_code status;
    grpc_slice status_details;
    int cancelled;
    grpc_byte_buffer *rbuf, *sbuf;
    ptag t_send, t_recv, t_close;
    int pending; /* batches in flight */
    int sending;
    int hello_in; /* the peer's hello was accepted */
    int dead;     /* cancelled: freed once nothing is pending */
    int bye;      /* this side said goodbye (shutting down) */
    int closed;   /* its status / close completed */
    /* A refusal's goodbye is due or sent: the peer's messages are ignored. */
    int refusing;
    /* That goodbye's reason, while a send is in flight. */
    const char *bye_due;
    /* A refusal's status (PERMISSION_DENIED; OK for --peer-links), its
     * goodbye ("refused: why") and when it began (killed PEER_GOODBYE_MS
     * later if the peer does not close). */
    grpc_status_code refuse_status;
    char refuse_why[320];
    uint64_t refuse_ms;
    /* the goodbye was to a removed member: kill on close */
    int bye_removed;
    size_t sbuf_len;
    grpc_slice bye_details; /* the OK status's details (accepted side) */
    struct plink *next;
} plink;

/* A Join call being served (JOIN below): the request's receive, then the
 * answer with the status; freed when that batch completes. */
typedef struct pjoin {
    ptag t; /* first: on_event's tag is the pjoin */
    grpc_call *call;
    grpc_byte_buffer *rbuf, *sbuf;
    grpc_slice details;
    int cancelled;
    int answering;
} pjoin;

typedef struct qchange {
    struct qchange *next;
    size_t len;
    uint8_t bytes[];
} qchange;

typedef struct ppeer {
    struct peer_net *net;
    char *name;
    uint64_t id;
    char *addr;
    grpc_channel *ch;
    cairn_replica *rep;
    plink *live, *dial;
    uint64_t next_dial_ms, next_sync_ms;
    uint32_t backoff_ms;
    atomic_int answer_due; /* a received message asks for something: answer now */
    atomic_int ack_due;    /* what a received message carried is durable */
    uint64_t answered_ms;  /* our last sync message to it (heads and all) */
    uint64_t pushed_us;    /* our last push to it */
    atomic_int connected;  /* the subscriber queues pushes only then */
    int linked;            /* in --peer-links (every member without it) */
    atomic_int removed;    /* gone from the member table: never dialed again */
    uint64_t removed_ms;   /* when this node saw it go */
    char *url;             /* the peer URL addr came from */
    cairn_actor actor;     /* from its hello */
    char **client_urls;    /* from its last hello or Members; under peer_net.info_mu */
    size_t nclient_urls;
    uint64_t urls_incarnation; /* the start they are from (Hello.incarnation) */
    uint64_t urls_sent_gen;    /* peer_net.urls_gen last sent to it in a Members */
    cairn_hash *acked;         /* its heads as its last message reported them: durable
                                  on it (replica.h); under peer_net.info_mu */
    size_t nacked;
    pthread_mutex_t qmu;
    qchange *qhead, **qtail;
    size_t qbytes;
    /* peer_stats: bumped by the peer thread (dropped: by the committer) */
    _Atomic uint64_t connects, msgs_sent, bytes_sent, msgs_received, bytes_received, pushes,
        dropped, sync_rounds;
    /* It does not list us in its --peer-links (its goodbye said so): we
     * dial it at the longest backoff and log its comings and goings at
     * debug level, until it sends a sync message (it lists us now). */
    int not_linked;
    /* We refused it for our --peer-links: said once. */
    int refused_logged;
    uint64_t limit_logged_ms; /* a change of its not applied for our limits */
    /* REFUSALS: its hellos are refused until refused_until_ms (we refused
     * it), and it is not dialed before hold_ms (we refused it, or it us). */
    uint64_t refused_until_ms, hold_ms;
    /* Our dial's TLS handshake failed (its certificate): said once until
     * a dial of ours gets through the handshake. */
    int tls_refused_logged;
} ppeer;

struct peer_net {
    const cairn_config *cfg;
    cairn_store *store;
    grpc_server *server;
    grpc_completion_queue *cq;
    int *ports;
    size_t nports;
    ptag t_accept, t_shutdown, t_wake;
    /* Waking the thread for a push (WAKING above): a call on wake_ch
     * that only a cancel completes. */
    grpc_channel *wake_ch;
    grpc_call *wake_call;
    grpc_metadata_array wake_md;
    grpc_status_code wake_status;
    grpc_slice wake_details;
    int wake_state;
    atomic_int wake_armed;  /* set: the next push cancels wake_call */
    _Atomic uint64_t wakes; /* wake calls completed (peer_net_wakes) */
    grpc_call *acall;
    grpc_call_details adetails;
    grpc_metadata_array amd;
    int accepting;
    int shut_done; /* the server's shutdown completed */
    int njoins;    /* Join calls being served */
    /* PEER_MAX_MEMBERS slots, the first npeers filled */
    ppeer *peers;
    _Atomic size_t npeers;
    uint64_t members_gen; /* the store's members_gen last followed + 1 */
    int saw_self, self_removed;
    plink *links;
    pthread_t th;
    int started, stopped;
    atomic_int stop;
    pthread_mutex_t info_mu;   /* the peers' client URLs and acked heads */
    void (*ack_cb)(void *arg); /* peer_net_set_ack_cb */
    void *ack_arg;
    uint64_t my_id, cluster_id;
    /* A join catching up (JOIN above): only the member that answered it
     * is synced with until peer_net_joined, so that the history comes
     * once, not once per member; 0 when not joining. */
    _Atomic uint64_t join_from;
    /* Set from the seed until peer_net_joined: the member table applied so
     * far is a past state of the cluster's (the history arrives in order),
     * in which members added since are missing; following it would take
     * them for removed, refuse them, and so stop them. */
    atomic_int catching_up;
    uint64_t join_from_seen_ms; /* its stream was last up then */
    uint64_t incarnation;       /* this start, in ms since the epoch */
    uint64_t urls_gen;          /* bumped when a member's client URLs change */
    cairn_actor actor;
    uint8_t token_hash[32];
    /* TLS (https:// peer URLs): PEM text of the --peer-* files */
    int tls;            /* a cert and key are set (given or --peer-auto-tls) */
    int verify_clients; /* accepted peers must present a certificate */
    int skip_verify;    /* --peer-auto-tls: a dialed peer's chain is not checked */
    char *tls_ca, *tls_cert, *tls_key;
    cairn_tls_checker *checker;
};

static void removed_self(peer_net *n);
static void say_goodbye(plink *l, const char *reason);
static grpc_channel *open_channel(peer_net *n, const char *addr, const char *url);

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static gpr_timespec in_ms(int ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static const char *peer_name(const plink *l)
{
    return l->p ? l->p->name : "(an unknown peer)";
}

/* ---- links ------------------------------------------------------------- */

static plink *link_new(peer_net *n, ppeer *p, int dialed)
{
    plink *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->n = n;
    l->p = p;
    l->dialed = dialed;
    grpc_metadata_array_init(&l->md);
    grpc_metadata_array_init(&l->trailing);
    l->status_details = grpc_empty_slice();
    l->bye_details = grpc_slice_from_static_string("goodbye: shutting down");
    l->t_send = (ptag){T_SEND, l};
    l->t_recv = (ptag){T_RECV, l};
    l->t_close = (ptag){T_CLOSE, l};
    l->next = n->links;
    n->links = l;
    return l;
}

static int link_batch(plink *l, const grpc_op *ops, size_t nops, ptag *tag)
{
    if (grpc_call_start_batch(l->call, ops, nops, tag, NULL) != GRPC_CALL_OK)
        return -1;
    l->pending++;
    return 0;
}

/* Ends |l| (once): cancels its call with |why| as the status, and frees
 * its peer's slot so the peer is dialed again after the backoff. */
static void link_kill(plink *l, const char *why)
{
    if (l->dead)
        return;
    l->dead = 1;
    if (l->call && l->refusing && l->refuse_status != GRPC_STATUS_OK)
        grpc_call_cancel_with_status(l->call, l->refuse_status, l->refuse_why, NULL);
    else if (l->call)
        grpc_call_cancel_with_status(l->call, GRPC_STATUS_UNAVAILABLE, why, NULL);
    ppeer *p = l->p;
    if (!p)
        return;
    if (p->dial == l)
        p->dial = NULL;
    if (p->live == l) {
        p->live = NULL;
        atomic_store(&p->connected, 0);
        cairn_log(p->not_linked ? CAIRN_LOG_DEBUG : CAIRN_LOG_INFO,
                  "peer %s: stream closed: %s (since start: %" PRIu64 " messages / %" PRIu64
                  " bytes sent, %" PRIu64 " / %" PRIu64 " received, %" PRIu64 " pushes, %" PRIu64
                  " sync rounds, %" PRIu64 " pushes dropped)",
                  p->name, why, atomic_load(&p->msgs_sent), atomic_load(&p->bytes_sent),
                  atomic_load(&p->msgs_received), atomic_load(&p->bytes_received),
                  atomic_load(&p->pushes), atomic_load(&p->sync_rounds), atomic_load(&p->dropped));
    }
    if (!p->live && !p->dial) {
        /* jittered exponential backoff: [b/2, b) */
        uint32_t b = p->backoff_ms;
        p->next_dial_ms = now_ms() + b / 2 + randombytes_uniform(b / 2 + 1);
        if (p->next_dial_ms < p->hold_ms)
            p->next_dial_ms = p->hold_ms;
        p->backoff_ms = b * 2 > PEER_BACKOFF_MAX_MS ? PEER_BACKOFF_MAX_MS : b * 2;
    }
}

static void link_free(plink *l)
{
    if (l->call)
        grpc_call_unref(l->call);
    grpc_metadata_array_destroy(&l->md);
    grpc_metadata_array_destroy(&l->trailing);
    grpc_slice_unref(l->status_details);
    grpc_slice_unref(l->bye_details);
    if (l->rbuf)
        grpc_byte_buffer_destroy(l->rbuf);
    if (l->sbuf)
        grpc_byte_buffer_destroy(l->sbuf);
    free(l);
}

/* Frees the dead links nothing is pending on. */
static void links_sweep(peer_net *n)
{
    for (plink **pl = &n->links; *pl;) {
        plink *l = *pl;
        if (l->dead && l->pending == 0) {
            *pl = l->next;
            link_free(l);
        } else {
            pl = &l->next;
        }
    }
}

static void post_recv(plink *l)
{
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t k = 0;
    if (l->dialed && !l->hello_in) {
        ops[k].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[k++].data.recv_initial_metadata.recv_initial_metadata = &l->md;
    }
    ops[k].op = GRPC_OP_RECV_MESSAGE;
    ops[k++].data.recv_message.recv_message = &l->rbuf;
    if (link_batch(l, ops, k, &l->t_recv))
        link_kill(l, "cannot receive");
}

/* Sends one PeerMessage (packed here); the first also sends the initial
 * metadata. */
static int link_send(plink *l, const Cairnpb__PeerMessage *m, int first)
{
    l->sbuf = rpc_pack(&m->base);
    if (!l->sbuf)
        return CAIRN_ENOMEM;
    l->sbuf_len = grpc_byte_buffer_length(l->sbuf);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t k = 0;
    if (first)
        ops[k++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[k].op = GRPC_OP_SEND_MESSAGE;
    ops[k++].data.send_message.send_message = l->sbuf;
    if (link_batch(l, ops, k, &l->t_send)) {
        grpc_byte_buffer_destroy(l->sbuf);
        l->sbuf = NULL;
        return CAIRN_EIO;
    }
    l->sending = 1;
    return 0;
}

static int send_sync(plink *l, uint8_t *bytes, size_t len)
{
    Cairnpb__Sync s = CAIRNPB__SYNC__INIT;
    s.msg.data = bytes;
    s.msg.len = len;
    Cairnpb__PeerMessage m = CAIRNPB__PEER_MESSAGE__INIT;
    m.body_case = CAIRNPB__PEER_MESSAGE__BODY_SYNC;
    m.sync = &s;
    int rc = link_send(l, &m, 0);
    free(bytes);
    return rc;
}

/* Starts a stream: hello out, first receive, and the status watch. */
static void link_start(plink *l)
{
    peer_net *n = l->n;
    Cairnpb__Hello h = CAIRNPB__HELLO__INIT;
    h.protocol_version = PEER_PROTOCOL_VERSION;
    h.cluster_id = n->cluster_id;
    h.member_id = n->my_id;
    h.actor_id.data = n->actor.b;
    h.actor_id.len = CAIRN_ACTOR_LEN;
    h.token_hash.data = n->token_hash;
    h.token_hash.len = sizeof n->token_hash;
    h.name = n->cfg->name;
    h.client_urls = n->cfg->advertise_client_urls;
    h.n_client_urls = n->cfg->nadvertise_client_urls;
    h.incarnation = n->incarnation;
    Cairnpb__PeerMessage m = CAIRNPB__PEER_MESSAGE__INIT;
    m.body_case = CAIRNPB__PEER_MESSAGE__BODY_HELLO;
    m.hello = &h;
    if (link_send(l, &m, 1)) {
        link_kill(l, "cannot send the hello");
        return;
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    if (l->dialed) {
        op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        op.data.recv_status_on_client.trailing_metadata = &l->trailing;
        op.data.recv_status_on_client.status = &l->status;
        op.data.recv_status_on_client.status_details = &l->status_details;
    } else {
        op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        op.data.recv_close_on_server.cancelled = &l->cancelled;
    }
    if (link_batch(l, &op, 1, &l->t_close)) {
        link_kill(l, "cannot watch the stream's status");
        return;
    }
    post_recv(l);
}

static void dial(peer_net *n, ppeer *p)
{
    plink *l = link_new(n, p, 1);
    if (!l)
        return;
    grpc_slice method = grpc_slice_from_static_string(PEER_METHOD);
    l->call = grpc_channel_create_call(p->ch, NULL, GRPC_PROPAGATE_DEFAULTS, n->cq, method, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    p->dial = l;
    if (!l->call) {
        link_kill(l, "cannot create a call");
        return;
    }
    link_start(l);
}

/* ---- hello ------------------------------------------------------------- */

static void free_urls(char **v, size_t k)
{
    for (size_t i = 0; i < k; i++)
        free(v[i]);
    free(v);
}

/* A copy of |k| strings; NULL (and *ok 0) when out of memory. */
static char **copy_urls(char *const *v, size_t k, int *ok)
{
    *ok = 1;
    if (!k)
        return NULL;
    char **c = calloc(k, sizeof *c);
    for (size_t i = 0; c && i < k; i++)
        if (!(c[i] = strdup(v[i]))) {
            free_urls(c, i);
            c = NULL;
        }
    *ok = c != NULL;
    return c;
}

static ppeer *peer_by_id(peer_net *n, uint64_t id)
{
    for (size_t i = 0; i < n->npeers; i++)
        if (n->peers[i].id == id)
            return &n->peers[i];
    return NULL;
}

/* The member whose side dialed |l|. */
static uint64_t dialer_of(const plink *l)
{
    return l->dialed ? l->n->my_id : l->p->id;
}

static void make_live(ppeer *p, plink *l)
{
    p->live = l;
    if (p->dial == l)
        p->dial = NULL;
    /* The backoff is not reset here: both hellos passed on this end, but
     * the peer may still refuse ours (our certificate, its member table)
     * and close; resetting now would redial such a peer at the shortest
     * backoff forever. Its first sync message (on_sync) proves it took
     * us. */
    /* what we had in flight on an older stream may be lost */
    cairn_replica_reset(p->rep);
    pthread_mutex_lock(&p->qmu);
    while (p->qhead) {
        qchange *q = p->qhead;
        p->qhead = q->next;
        free(q);
    }
    p->qtail = &p->qhead;
    p->qbytes = 0;
    pthread_mutex_unlock(&p->qmu);
    atomic_store(&p->connected, 1);
    atomic_fetch_add(&p->connects, 1);
    p->tls_refused_logged = 0;
    p->next_sync_ms = 0;  /* sync at once */
    p->urls_sent_gen = 0; /* and tell it the members' client URLs */
    cairn_log(p->not_linked ? CAIRN_LOG_DEBUG : CAIRN_LOG_INFO,
              "peer %s (%016" PRIx64 "): connected (%s)", p->name, p->id,
              l->dialed ? "dialed" : "accepted");
}

/* Ends |l| as a refusal (REFUSALS above): a Goodbye saying "refused:
 * |what|", then the stream's end with PERMISSION_DENIED and the same words
 * (the dialing side half-closes: a client has no status to send; the
 * peer's end, or PEER_GOODBYE_MS, closes it). With |hold| and a peer that
 * is known to be who it is (we dialed it, or its hello passed), it is not
 * dialed or accepted for PEER_REFUSE_MS. What it sends meanwhile is
 * dropped unread. */
static void refuse_stream(plink *l, const char *what, int hold)
{
    if (l->dead || l->refusing)
        return;
    ppeer *p = l->p;
    uint64_t now = now_ms();
    if (hold && p && (l->dialed || l->hello_in)) {
        p->refused_until_ms = p->hold_ms = now + PEER_REFUSE_MS;
        if (p->next_dial_ms < p->hold_ms)
            p->next_dial_ms = p->hold_ms;
        if (p->dial && p->dial != l)
            link_kill(p->dial, "refused");
    }
    snprintf(l->refuse_why, sizeof l->refuse_why, "refused: %s", what);
    l->refusing = 1;
    l->refuse_status = GRPC_STATUS_PERMISSION_DENIED;
    l->refuse_ms = now;
    if (!l->call) {
        link_kill(l, l->refuse_why);
    } else if (l->sending) {
        l->bye_due = l->refuse_why;
    } else {
        say_goodbye(l, l->refuse_why);
        if (!l->bye)
            link_kill(l, l->refuse_why); /* could not send: the status says it */
    }
}

/* Logs and refuses a stream whose peer broke the protocol or sent what
 * this node refuses, naming the peer (its address while it has not said
 * who it is) and why. */
static void refuse(plink *l, const char *what)
{
    char *addr = l->p || !l->call ? NULL : grpc_call_get_peer(l->call);
    cairn_log(CAIRN_LOG_WARN, "peer %s: refused: %s", addr ? addr : peer_name(l), what);
    gpr_free(addr);
    refuse_stream(l, what, 1);
}

/* A hello from a member this node's --peer-links leaves out: a Goodbye that
 * says so (PEER_BYE_NOT_LINKED), so that the member backs off for good
 * instead of redialing at once; logged once per member, then at debug
 * level (it dials again every PEER_BACKOFF_MAX_MS at most). The goodbye
 * waits for our hello's send if that is still in flight. */
static void refuse_unlinked(plink *l, ppeer *p)
{
    cairn_log(p->refused_logged ? CAIRN_LOG_DEBUG : CAIRN_LOG_WARN,
              "peer %s: refused: not in this node's --peer-links (told it in a goodbye; its "
              "next attempts are logged at debug level)",
              p->name);
    p->refused_logged = 1;
    l->refusing = 1;
    l->refuse_status = GRPC_STATUS_OK;
    l->refuse_ms = now_ms();
    if (l->sending)
        l->bye_due = "member is " PEER_BYE_NOT_LINKED;
    else
        say_goodbye(l, "member is " PEER_BYE_NOT_LINKED);
}

/* tls/'s checks on the certificate |l|'s peer presented; 0 if it passes
 * (or this link is plaintext, or an accepted peer need not present one). */
static int check_call_cert(peer_net *n, grpc_call *call, int dialed, char *why, size_t whylen)
{
    grpc_auth_context *ac = grpc_call_auth_context(call);
    const grpc_auth_property *leaf = NULL, *chain = NULL;
    int secure = 0;
    if (ac) {
        grpc_auth_property_iterator it =
            grpc_auth_context_find_properties_by_name(ac, GRPC_X509_PEM_CERT_PROPERTY_NAME);
        leaf = grpc_auth_property_iterator_next(&it);
        /* what the peer sent besides (the intermediates; on the accepting
         * side OpenSSL leaves the certificate itself out of it) */
        it = grpc_auth_context_find_properties_by_name(ac, GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME);
        chain = grpc_auth_property_iterator_next(&it);
        it = grpc_auth_context_find_properties_by_name(ac,
                                                       GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
        const grpc_auth_property *t = grpc_auth_property_iterator_next(&it);
        secure = t && strcmp(t->value, GRPC_SSL_TRANSPORT_SECURITY_TYPE) == 0;
    }
    int rc = 0;
    if (secure && n->checker && (leaf || dialed || n->verify_clients)) {
        /* tls/ takes the certificate first, then the intermediates; one
         * repeated among them does no harm */
        size_t len = 0;
        char *pem = NULL;
        if (leaf) {
            size_t clen = chain ? chain->value_length : 0;
            pem = malloc(leaf->value_length + 1 + clen);
            if (pem) {
                memcpy(pem, leaf->value, leaf->value_length);
                len = leaf->value_length;
                pem[len++] = '\n';
                if (clen)
                    memcpy(pem + len, chain->value, clen);
                len += clen;
            }
        }
        char r[200];
        if (leaf && !pem) {
            snprintf(r, sizeof r, "out of memory");
            rc = CAIRN_ENOMEM;
        } else {
            rc = cairn_tls_check_pem(n->checker, pem, len, NULL, 0, r, sizeof r);
        }
        /* etcd: the listener checks a dialing member's SANs against the
         * address it came from, unless
         * --experimental-peer-skip-client-san-verification */
        if (!rc && leaf && !dialed && !n->cfg->peer_tls.skip_client_san_verification) {
            char *addr = grpc_call_get_peer(call);
            rc = cairn_tls_check_peer_san(pem, len, addr, r, sizeof r);
            gpr_free(addr);
        }
        free(pem);
        if (rc)
            snprintf(why, whylen, "certificate refused: %s", r);
    }
    grpc_auth_context_release(ac);
    return rc;
}

static int check_cert(plink *l, char *why, size_t whylen)
{
    return check_call_cert(l->n, l->call, l->dialed, why, whylen);
}

/* |p|'s client URLs are now |v| (copied), as of its start |incarnation|. */
static void set_client_urls(peer_net *n, ppeer *p, char *const *v, size_t k, uint64_t incarnation)
{
    int ok;
    char **urls = copy_urls(v, k, &ok);
    if (!ok)
        return;
    pthread_mutex_lock(&n->info_mu);
    free_urls(p->client_urls, p->nclient_urls);
    p->client_urls = urls;
    p->nclient_urls = k;
    pthread_mutex_unlock(&n->info_mu);
    p->urls_incarnation = incarnation;
    n->urls_gen++;
}

/* A hello that passed peer_hello_check (peer_msg.c): who it is. */
static void on_hello(void *arg, const Cairnpb__Hello *h)
{
    plink *l = arg;
    peer_net *n = l->n;
    char why[256];
    if (l->dialed)
        l->p->tls_refused_logged = 0; /* this dial's handshake passed */
    if (check_cert(l, why, sizeof why)) {
        if (!l->dialed && h->name) {
            char named[512];
            snprintf(named, sizeof named, "%s (its hello says member %.40s)", why, h->name);
            refuse(l, named);
        } else {
            refuse(l, why);
        }
        return;
    }
    ppeer *p = peer_by_id(n, h->member_id);
    if (!p) {
        snprintf(why, sizeof why, "member id %016" PRIx64 " is not another member of this cluster",
                 h->member_id);
        refuse(l, why);
        return;
    }
    if (atomic_load(&p->removed)) {
        refuse(l, PEER_REMOVED);
        return;
    }
    if (l->dialed && l->p != p) {
        snprintf(why, sizeof why, "dialed member %s but member %016" PRIx64 " answered", l->p->name,
                 h->member_id);
        refuse(l, why);
        return;
    }
    if (!p->linked) {
        refuse_unlinked(l, p);
        return;
    }
    uint64_t now = now_ms();
    if (!l->dialed && now < p->refused_until_ms) {
        /* refused lately: turned away until the hold ends, which this
         * does not extend (logged once per refusal, at the refusal) */
        snprintf(why, sizeof why, "member %s was refused lately: accepted again in %" PRIu64 " ms",
                 p->name, p->refused_until_ms - now);
        cairn_log(CAIRN_LOG_DEBUG, "peer %s: refused: %s", p->name, why);
        refuse_stream(l, why, 0);
        return;
    }
    l->p = p;
    l->hello_in = 1;
    memcpy(p->actor.b, h->actor_id.data, CAIRN_ACTOR_LEN);
    set_client_urls(n, p, h->client_urls, h->n_client_urls, h->incarnation);
    plink *old = p->live;
    if (old && old != l) {
        uint64_t lower = n->my_id < p->id ? n->my_id : p->id;
        int new_wins = dialer_of(l) == lower || dialer_of(l) == dialer_of(old);
        plink *loser = new_wins ? old : l;
        if (new_wins)
            p->live = NULL; /* not a lost connection: no log line, no backoff */
        loser->p = p;
        if (loser->dialed && p->dial == loser)
            p->dial = NULL;
        loser->dead = 1;
        grpc_call_cancel_with_status(loser->call, GRPC_STATUS_ALREADY_EXISTS,
                                     "duplicate stream: the lower member id's dialed stream wins",
                                     NULL);
        if (!new_wins) {
            if (p->dial == l)
                p->dial = NULL;
            return;
        }
    }
    make_live(p, l);
}

/* ---- receiving --------------------------------------------------------- */

/* Set on the peer thread: a completion called there is a receive's that
 * carried no change, run inside cairn_replica_receive (on_sync decides). */
static _Thread_local int on_peer_thread, inline_done;

static void wake_thread(peer_net *n);

/* Carried changes, now durable: acknowledge, and wake the thread for it
 * (else the acknowledgement waited for its next tick, up to PEER_TICK_MS,
 * and with it every WaitReplicated on the peer). */
static void received_durable(void *arg, int rc)
{
    ppeer *p = arg;
    if (on_peer_thread)
        inline_done = !rc;
    else if (!rc && !atomic_exchange(&p->ack_due, 1))
        wake_thread(p->net);
}

/* A fork the last receive from |p| met: both hashes, so that an operator
 * can find the author's two data dirs (README, limits). */
static void log_fork(ppeer *p)
{
    cairn_store_fork f;
    if (!cairn_replica_last_fork(p->rep, &f))
        return;
    char rej[2 * CAIRN_HASH_LEN + 1], held[2 * CAIRN_HASH_LEN + 1] = "(not found)";
    char actor[2 * CAIRN_ACTOR_LEN + 1];
    cairn_hash_hex(rej, &f.rejected);
    if (f.held_known)
        cairn_hash_hex(held, &f.held);
    for (size_t i = 0; i < CAIRN_ACTOR_LEN; i++)
        snprintf(actor + 2 * i, 3, "%02x", f.actor.b[i]);
    cairn_log(CAIRN_LOG_ERROR,
              "peer %s: fork: author %s made two changes with seq %" PRIu64
              ": %s (from this peer, refused) and %s (held here, kept)",
              p->name, actor, f.seq, rej, held);
}

/* Keeps the heads a message from |p| reported (durable on |p|: a node
 * tells its heads only once they are on its disk) for
 * peer_net_acked_heads, and tells the ack callback. */
static void note_acked(peer_net *n, ppeer *p)
{
    cairn_hash *h;
    size_t nh;
    if (cairn_replica_their_heads(p->rep, &h, &nh) || !nh)
        return;
    pthread_mutex_lock(&n->info_mu);
    int same = nh == p->nacked && memcmp(h, p->acked, nh * sizeof *h) == 0;
    free(p->acked);
    p->acked = h;
    p->nacked = nh;
    pthread_mutex_unlock(&n->info_mu);
    if (!same && n->ack_cb)
        n->ack_cb(n->ack_arg);
}

static void on_sync(void *arg, const uint8_t *msg, size_t len)
{
    plink *l = arg;
    ppeer *p = l->p;
    if (p->not_linked) {
        p->not_linked = 0;
        cairn_log(CAIRN_LOG_INFO, "peer %s: accepts this node now (in its --peer-links)", p->name);
    }
    /* it accepted this stream: a later loss redials at the shortest backoff */
    p->backoff_ms = PEER_BACKOFF_MIN_MS;
    int rejected = 0;
    inline_done = 0;
    int rc = cairn_replica_receive(p->rep, msg, len, &rejected, received_durable, p);
    /* A message without changes is answered at once only if it asks for
     * something (need, filter, hello): a heads-only acknowledgement is
     * not, so that it costs no generate (whose wait for the committer
     * holds the store's read side, and local writers out). */
    if (!rc && inline_done && cairn_replica_wants_answer(p->rep))
        atomic_store(&p->answer_due, 1);
    inline_done = 0;
    if (!rc)
        note_acked(l->n, p);
    char why[160];
    if (rc) {
        snprintf(why, sizeof why, "a malformed sync message (%s)", cairn_strerror(rc));
        refuse(l, why);
    } else if (rejected) {
        log_fork(p);
        if (peer_verdict_refuses(rejected)) {
            snprintf(why, sizeof why, "a change the document refuses (%s)",
                     cairn_strerror(rejected));
            refuse(l, why);
        } else if (rejected == CAIRN_EFORK || rejected == CAIRN_EFORKPAST) {
            /* a fork's other side: the peer may be honest (it took that
             * side first); log_fork said it, its descendants are refused
             * quietly and the stream stays */
            cairn_log(CAIRN_LOG_DEBUG, "peer %s: not applied: %s", p->name,
                      cairn_strerror(rejected));
        } else if (now_ms() >= p->limit_logged_ms + PEER_LIMIT_LOG_MS) {
            /* this node's limit, not the peer's fault: the stream stays,
             * and sync sends the change again */
            p->limit_logged_ms = now_ms();
            cairn_log(CAIRN_LOG_WARN, "peer %s: not applied for now: %s", p->name,
                      cairn_strerror(rejected));
        }
    }
}

#define PEER_MAX_URLS 64
#define PEER_MAX_URL_LEN 1024

/* A Members message: what a link knows of the members' client URLs; a
 * report on a member from a later start than ours replaces it. An entry
 * out of bounds is ignored (MemberList is informative). */
static void on_members(void *arg, const Cairnpb__Members *ms)
{
    plink *l = arg;
    peer_net *n = l->n;
    for (size_t i = 0; i < ms->n_members; i++) {
        const Cairnpb__MemberUrls *e = ms->members[i];
        ppeer *p = peer_by_id(n, e->member_id);
        if (!p || e->incarnation <= p->urls_incarnation || e->n_client_urls > PEER_MAX_URLS)
            continue;
        size_t j = 0;
        while (j < e->n_client_urls && strlen(e->client_urls[j]) <= PEER_MAX_URL_LEN)
            j++;
        if (j == e->n_client_urls)
            set_client_urls(n, p, e->client_urls, e->n_client_urls, e->incarnation);
    }
}

/* Sends on |l| the client URLs this node knows of every member, itself
 * included. */
static int send_members(peer_net *n, plink *l)
{
    Cairnpb__MemberUrls *es = calloc(n->npeers + 1, sizeof *es);
    Cairnpb__MemberUrls **ep = calloc(n->npeers + 1, sizeof *ep);
    int rc = CAIRN_ENOMEM;
    if (es && ep) {
        size_t k = 0;
        cairnpb__member_urls__init(&es[k]);
        es[k].member_id = n->my_id;
        es[k].incarnation = n->incarnation;
        es[k].client_urls = n->cfg->advertise_client_urls;
        es[k].n_client_urls = n->cfg->nadvertise_client_urls;
        ep[k] = &es[k];
        k++;
        for (size_t i = 0; i < n->npeers; i++) {
            ppeer *p = &n->peers[i];
            if (!p->urls_incarnation)
                continue;
            cairnpb__member_urls__init(&es[k]);
            es[k].member_id = p->id;
            es[k].incarnation = p->urls_incarnation;
            es[k].client_urls = p->client_urls;
            es[k].n_client_urls = p->nclient_urls;
            ep[k] = &es[k];
            k++;
        }
        Cairnpb__Members ms = CAIRNPB__MEMBERS__INIT;
        ms.members = ep;
        ms.n_members = k;
        Cairnpb__PeerMessage m = CAIRNPB__PEER_MESSAGE__INIT;
        m.body_case = CAIRNPB__PEER_MESSAGE__BODY_MEMBERS;
        m.members = &ms;
        rc = link_send(l, &m, 0);
    }
    free(es);
    free(ep);
    return rc;
}

static void on_goodbye(void *arg, const char *reason)
{
    plink *l = arg;
    ppeer *p = l->p;
    if (p && strstr(reason, PEER_BYE_NOT_LINKED)) {
        /* it will refuse us until its flags change: dial it seldom, say so once */
        if (!p->not_linked)
            cairn_log(CAIRN_LOG_WARN,
                      "peer %s: it does not list this node in its --peer-links (goodbye: %.100s): "
                      "dialing it every %u ms, logged at debug level, until it accepts",
                      p->name, reason, PEER_BACKOFF_MAX_MS);
        p->not_linked = 1;
        p->backoff_ms = PEER_BACKOFF_MAX_MS;
        link_kill(l, "not in the peer's --peer-links");
        return;
    }
    if (strncmp(reason, PEER_BYE_REFUSED, strlen(PEER_BYE_REFUSED)) == 0) {
        /* it refused us: not dialed again for PEER_REFUSE_MS */
        if (strstr(reason, PEER_REMOVED)) {
            link_kill(l, PEER_REMOVED);
            removed_self(l->n);
            return;
        }
        if (p)
            p->hold_ms = now_ms() + PEER_REFUSE_MS;
        char why[400];
        snprintf(why, sizeof why, "the peer refused this node (goodbye: %.300s)", reason);
        cairn_log(CAIRN_LOG_WARN, "peer %s: %s: dialing it again in %u ms at the earliest",
                  peer_name(l), why, PEER_REFUSE_MS);
        link_kill(l, why);
        return;
    }
    /* a clean departure: link_kill's line says it, and the peer is dialed
     * again after the backoff */
    char why[160];
    snprintf(why, sizeof why, "the peer left (goodbye: %.100s)", reason);
    link_kill(l, why);
}

static void on_refuse(void *arg, const char *why)
{
    refuse(arg, why);
}

static void on_reset(void *arg, const char *why)
{
    refuse(arg, why);
}

static void on_recv(plink *l, int ok)
{
    if (l->dead)
        return;
    if (l->refusing) {
        /* what it says no longer matters; the stream ends with our goodbye */
        if (l->rbuf)
            grpc_byte_buffer_destroy(l->rbuf);
        l->rbuf = NULL;
        if (!ok)
            link_kill(l, "refused");
        else
            post_recv(l);
        return;
    }
    if (!ok || !l->rbuf) {
        link_kill(l, l->bye ? "shutting down (said goodbye)" : "the peer closed the stream");
        return;
    }
    grpc_byte_buffer_reader rd;
    grpc_slice all = grpc_empty_slice();
    int read = grpc_byte_buffer_reader_init(&rd, l->rbuf);
    if (read) {
        all = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
    }
    grpc_byte_buffer_destroy(l->rbuf);
    l->rbuf = NULL;
    if (!read) {
        refuse(l, "a peer message that does not decode");
        return;
    }
    const peer_self self = {l->n->cluster_id, l->n->token_hash};
    const peer_handlers h = {.arg = l,
                             .hello = on_hello,
                             .sync = on_sync,
                             .members = on_members,
                             .goodbye = on_goodbye,
                             .refuse = on_refuse,
                             .reset = on_reset};
    size_t rlen = GRPC_SLICE_LENGTH(all);
    peer_msg_dispatch(GRPC_SLICE_START_PTR(all), rlen, l->hello_in, &self, &h);
    grpc_slice_unref(all);
    if (l->p) {
        atomic_fetch_add(&l->p->msgs_received, 1);
        atomic_fetch_add(&l->p->bytes_received, rlen);
    }
    if (!l->dead)
        post_recv(l);
}

/* Whether a dialed call's status details (gRPC's words for why the
 * channel could not connect) say that the TLS handshake failed, rather
 * than the connection. */
static int tls_failed(const char *details)
{
    return strstr(details, "Handshake failed") || strstr(details, "peer certificate") ||
           strstr(details, "SSL_ERROR") || strstr(details, "certificate verify");
}

static void on_close(plink *l)
{
    l->closed = 1;
    if (l->refusing) {
        link_kill(l, "refused");
        return;
    }
    if (l->bye && !l->bye_removed)
        return; /* shutting down: link_kill comes after the goodbyes */
    if (l->dialed && l->status != GRPC_STATUS_OK) {
        char *d = grpc_slice_to_c_string(l->status_details);
        if (!l->hello_in && l->n->tls && tls_failed(d)) {
            /* etcd: a dial whose handshake refuses the member's
             * certificate (its chain, or a name that is not the peer
             * URL's host) is logged with the reason, as a refusal; once
             * until a dial passes the handshake, then at debug level. Also when
             * the failed send of the hello killed the link first: the
             * status is still the transport's. */
            cairn_log(l->p->tls_refused_logged ? CAIRN_LOG_DEBUG : CAIRN_LOG_WARN,
                      "peer %s: refused: certificate refused: the TLS handshake failed: %s",
                      peer_name(l), d);
            l->p->tls_refused_logged = 1;
        } else if (!l->dead) {
            cairn_log(l->hello_in && !l->p->not_linked ? CAIRN_LOG_INFO : CAIRN_LOG_DEBUG,
                      "peer %s: stream ended: %s", peer_name(l), d);
            if (strstr(d, PEER_REMOVED))
                removed_self(l->n);
        }
        gpr_free(d);
    }
    link_kill(l, "the stream ended");
}

/* ---- JOIN (the answering side; peer_msg.c has the checks) -------------- */

static void join_free(peer_net *n, pjoin *j)
{
    if (j->rbuf)
        grpc_byte_buffer_destroy(j->rbuf);
    if (j->sbuf)
        grpc_byte_buffer_destroy(j->sbuf);
    grpc_slice_unref(j->details);
    grpc_call_unref(j->call);
    free(j);
    n->njoins--;
}

static void join_start(peer_net *n, grpc_call *call)
{
    pjoin *j = calloc(1, sizeof *j);
    if (!j) {
        grpc_call_cancel_with_status(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL);
        grpc_call_unref(call);
        return;
    }
    j->t = (ptag){T_JOIN, NULL};
    j->call = call;
    j->details = grpc_empty_slice();
    n->njoins++;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &j->rbuf;
    if (grpc_call_start_batch(call, ops, 2, &j->t, NULL) != GRPC_CALL_OK)
        join_free(n, j);
}

/* The answer to request |req|: a packed JoinResponse, or the refusal. */
static int join_answer(peer_net *n, grpc_call *call, const uint8_t *req, size_t len, uint8_t **out,
                       size_t *outlen, uint64_t *who, char *why, size_t whylen)
{
    if (check_call_cert(n, call, 0, why, whylen))
        return -1;
    cairn_member_info *v = NULL;
    size_t k = 0;
    cairn_hash *heads = NULL;
    size_t nh = 0;
    int rc = cairn_store_member_list(n->store, &v, &k);
    if (!rc)
        rc = cairn_store_heads(n->store, &heads, &nh);
    if (!rc) {
        peer_join_self self = {n->cluster_id, n->token_hash, v, k, heads, nh};
        rc = peer_join_answer(out, outlen, who, req, len, &self, why, whylen);
    }
    if (rc > 0 || rc < -1)
        snprintf(why, whylen, "cannot answer: %s", cairn_strerror(rc));
    cairn_store_member_list_free(v, k);
    free(heads);
    return rc;
}

/* The request arrived (or the call ended): the answer or the refusal,
 * with the status; then the call is freed. */
static void on_join(peer_net *n, pjoin *j, int ok)
{
    if (j->answering || !ok || !j->rbuf) {
        join_free(n, j);
        return;
    }
    j->answering = 1;
    grpc_byte_buffer_reader rd;
    grpc_slice all = grpc_empty_slice();
    int read = grpc_byte_buffer_reader_init(&rd, j->rbuf);
    if (read) {
        all = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
    }
    char why[16384] = "a join request that does not decode";
    uint8_t *ans = NULL;
    size_t alen = 0;
    uint64_t who = 0;
    int rc = read ? join_answer(n, j->call, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all), &ans,
                                &alen, &who, why, sizeof why)
                  : -1;
    grpc_slice_unref(all);
    char *addr = grpc_call_get_peer(j->call);
    grpc_status_code st = GRPC_STATUS_OK;
    if (rc == 0) {
        grpc_slice sl = grpc_slice_from_copied_buffer((const char *)ans, alen);
        j->sbuf = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
        cairn_log(CAIRN_LOG_INFO, "member %016" PRIx64 " at %s joins: answered it the member table",
                  who, addr ? addr : "?");
    } else {
        /* etcd: the new member exits with the reason; a refusal is the
         * joiner's configuration, not this node's trouble */
        st = rc == -1 ? GRPC_STATUS_FAILED_PRECONDITION : GRPC_STATUS_UNAVAILABLE;
        j->details = grpc_slice_from_copied_string(why);
        cairn_log(CAIRN_LOG_WARN, "refused a join from %s: %s", addr ? addr : "?", why);
    }
    gpr_free(addr);
    free(ans);
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t k = 0;
    if (j->sbuf) {
        ops[k].op = GRPC_OP_SEND_MESSAGE;
        ops[k++].data.send_message.send_message = j->sbuf;
    }
    ops[k].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[k].data.send_status_from_server.status = st;
    ops[k++].data.send_status_from_server.status_details = &j->details;
    ops[k].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[k++].data.recv_close_on_server.cancelled = &j->cancelled;
    if (grpc_call_start_batch(j->call, ops, k, &j->t, NULL) != GRPC_CALL_OK)
        join_free(n, j);
}

static void post_accept(peer_net *n)
{
    grpc_call_details_init(&n->adetails);
    grpc_metadata_array_init(&n->amd);
    n->acall = NULL;
    if (grpc_server_request_call(n->server, &n->acall, &n->adetails, &n->amd, n->cq, n->cq,
                                 &n->t_accept) == GRPC_CALL_OK)
        n->accepting = 1;
}

static void on_accept(peer_net *n, int ok)
{
    n->accepting = 0;
    grpc_call *call = n->acall;
    int ours = ok && call && grpc_slice_str_cmp(n->adetails.method, PEER_METHOD) == 0;
    int join = ok && call && grpc_slice_str_cmp(n->adetails.method, PEER_JOIN_METHOD) == 0;
    if (join && !atomic_load(&n->stop)) {
        join_start(n, call);
    } else if (join) {
        grpc_call_cancel_with_status(call, GRPC_STATUS_UNAVAILABLE, "shutting down", NULL);
        grpc_call_unref(call);
    } else if (ok && call && !ours) {
        /* the peer port serves nothing else (etcd's services are on the
         * client URLs) */
        grpc_call_cancel_with_status(call, GRPC_STATUS_UNIMPLEMENTED,
                                     "unknown service: the peer URL serves cairnpb.Peer only",
                                     NULL);
        grpc_call_unref(call);
    }
    grpc_call_details_destroy(&n->adetails);
    grpc_metadata_array_destroy(&n->amd);
    if (ours && atomic_load(&n->stop)) {
        /* saying goodbye: a peer that dials again at once is turned away */
        grpc_call_cancel_with_status(call, GRPC_STATUS_UNAVAILABLE, "shutting down", NULL);
        grpc_call_unref(call);
    } else if (ours) {
        plink *l = link_new(n, NULL, 0);
        if (!l) {
            grpc_call_cancel_with_status(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory",
                                         NULL);
            grpc_call_unref(call);
        } else {
            l->call = call;
            link_start(l);
        }
    }
    if (!atomic_load(&n->stop))
        post_accept(n);
}

/* ---- waking (WAKING above) ----------------------------------------- */

/* A new wake call, pending and the thread's (else W_NONE: ticks only). */
static void wake_new(peer_net *n)
{
    n->wake_state = W_NONE;
    n->wake_call = grpc_channel_create_call(n->wake_ch, NULL, GRPC_PROPAGATE_DEFAULTS, n->cq,
                                            grpc_slice_from_static_string("/cairnpb.Peer/Wake"),
                                            NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (!n->wake_call)
        return;
    grpc_metadata_array_init(&n->wake_md);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &n->wake_md;
    op.data.recv_status_on_client.status = &n->wake_status;
    op.data.recv_status_on_client.status_details = &n->wake_details;
    if (grpc_call_start_batch(n->wake_call, &op, 1, &n->t_wake, NULL) != GRPC_CALL_OK) {
        grpc_metadata_array_destroy(&n->wake_md);
        grpc_call_unref(n->wake_call);
        n->wake_call = NULL;
        return;
    }
    n->wake_state = W_IDLE;
}

/* The wake call completed (cancelled): the next one, unless stopping. */
static void wake_done(peer_net *n)
{
    grpc_metadata_array_destroy(&n->wake_md);
    grpc_slice_unref(n->wake_details);
    grpc_call_unref(n->wake_call);
    n->wake_call = NULL;
    n->wake_state = W_NONE;
    atomic_fetch_add(&n->wakes, 1);
    if (!atomic_load(&n->stop))
        wake_new(n);
}

/* Takes the flag back; 0 if the committer took it (a T_WAKE is due). */
static int wake_disarm(peer_net *n)
{
    if (n->wake_state != W_ARMED)
        return n->wake_state != W_TAKEN;
    n->wake_state = atomic_exchange(&n->wake_armed, 0) ? W_IDLE : W_TAKEN;
    return n->wake_state == W_IDLE;
}

/* In how many ms a link that could send has a push due (0: now; past
 * PEER_PUSH_GAP_US since its last) or an acknowledgement (past
 * PEER_TICK_MS since its last sync message), or -1 if none has either. */
static int push_wait_ms(peer_net *n)
{
    uint64_t now = now_us();
    int best = -1;
    for (size_t i = 0; i < n->npeers; i++) {
        ppeer *p = &n->peers[i];
        plink *l = p->live;
        if (!l || l->dead || l->sending || l->refusing || l->bye)
            continue;
        if (atomic_load(&p->ack_due)) {
            uint64_t at = (p->answered_ms + PEER_TICK_MS) * 1000;
            int ms = at > now ? (int)((at - now + 999) / 1000) : 0;
            if (best < 0 || ms < best)
                best = ms;
        }
        pthread_mutex_lock(&p->qmu);
        int q = p->qhead != NULL;
        pthread_mutex_unlock(&p->qmu);
        if (!q)
            continue;
        uint64_t at = p->pushed_us + PEER_PUSH_GAP_US;
        int ms = at > now ? (int)((at - now + 999) / 1000) : 0;
        if (best < 0 || ms < best)
            best = ms;
    }
    return best;
}

/* How long the thread may wait for events: until a push is due if one
 * is queued (not armed: the thread comes back for it anyway), else
 * PEER_TICK_MS with the wake armed. The committer queues before it looks
 * at the flag and the thread arms before it looks at the queues
 * (sequentially consistent), so a change is seen by one or the other. */
static int wake_arm(peer_net *n)
{
    int ms = push_wait_ms(n);
    if (ms >= 0)
        return ms;
    if (n->wake_state != W_IDLE)
        return PEER_TICK_MS; /* none (ticks only), or a T_WAKE is due */
    n->wake_state = W_ARMED;
    atomic_store(&n->wake_armed, 1);
    if ((ms = push_wait_ms(n)) >= 0) {
        wake_disarm(n);
        return ms;
    }
    return PEER_TICK_MS;
}

/* The committer's half: cancels the wake call if the thread armed it. */
static void wake_thread(peer_net *n)
{
    if (atomic_load(&n->wake_armed) && atomic_exchange(&n->wake_armed, 0))
        grpc_call_cancel(n->wake_call, NULL);
}

static void on_event(peer_net *n, ptag *t, int ok)
{
    plink *l = t->l;
    switch (t->what) {
    case T_ACCEPT:
        on_accept(n, ok);
        return;
    case T_SHUTDOWN:
        n->shut_done = 1;
        return;
    case T_WAKE:
        wake_done(n);
        return;
    case T_JOIN:
        on_join(n, (pjoin *)t, ok);
        return;
    case T_SEND:
        l->pending--;
        l->sending = 0;
        grpc_byte_buffer_destroy(l->sbuf);
        l->sbuf = NULL;
        if (ok && l->p) {
            atomic_fetch_add(&l->p->msgs_sent, 1);
            atomic_fetch_add(&l->p->bytes_sent, l->sbuf_len);
        }
        if (!ok && !l->bye)
            link_kill(l, "a send failed");
        else if (l->bye_due && !l->dead)
            say_goodbye(l, l->bye_due);
        return;
    case T_RECV:
        l->pending--;
        on_recv(l, ok);
        return;
    case T_CLOSE:
        l->pending--;
        on_close(l);
        return;
    }
}

/* ---- sending ----------------------------------------------------------- */

/* The changes queued for |p| as one push: those this node authored, and
 * with --peer-links those of others too but |p|'s own. */
static int push_queued(peer_net *n, ppeer *p, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    pthread_mutex_lock(&p->qmu);
    qchange *q = p->qhead;
    p->qhead = NULL;
    p->qtail = &p->qhead;
    p->qbytes = 0;
    pthread_mutex_unlock(&p->qmu);
    size_t cnt = 0;
    for (qchange *x = q; x; x = x->next)
        cnt++;
    cairn_change **chs = cnt ? calloc(cnt, sizeof *chs) : NULL;
    size_t k = 0;
    int rc = cnt && !chs ? CAIRN_ENOMEM : 0;
    while (q) {
        qchange *next = q->next;
        cairn_change *c;
        if (!rc && cairn_change_decode(&c, q->bytes, q->len, NULL) == 0) {
            int mine = memcmp(c->actor.b, n->actor.b, CAIRN_ACTOR_LEN) == 0;
            int theirs = memcmp(c->actor.b, p->actor.b, CAIRN_ACTOR_LEN) == 0;
            if (mine || (n->cfg->peer_links && !theirs))
                chs[k++] = c;
            else
                cairn_change_free(c);
        }
        free(q);
        q = next;
    }
    if (!rc && k)
        rc = cairn_replica_push(p->rep, out, len, (const cairn_change *const *)chs, k);
    cairn_sync_changes_free(chs, k);
    return rc;
}

/* ---- the member table ---------------------------------------------------- */

static void removed_self(peer_net *n)
{
    if (n->self_removed)
        return;
    n->self_removed = 1;
    /* etcd: logs this and stops serving */
    cairn_log(CAIRN_LOG_ERROR, "%s", PEER_REMOVED);
    kill(getpid(), SIGTERM); /* main's sigwait: the clean shutdown */
}

/* A removed member: what is queued for it (the removal among it) goes out,
 * then a Goodbye; its dialed stream in the making is dropped. */
static void leave_removed(ppeer *p)
{
    if (p->dial && p->dial != p->live)
        link_kill(p->dial, PEER_REMOVED);
    plink *l = p->live;
    if (!l || l->dead || l->bye || l->sending)
        return;
    uint8_t *msg = NULL;
    size_t len = 0;
    if (push_queued(l->n, p, &msg, &len) == 0 && msg) {
        atomic_fetch_add(&p->pushes, 1);
        if (send_sync(l, msg, len))
            link_kill(l, "cannot send");
        return;
    }
    free(msg);
    l->bye_removed = 1;
    say_goodbye(l, "removed from the cluster");
    if (!l->bye) /* could not send: nothing to wait for */
        link_kill(l, PEER_REMOVED);
}

/* Fills the next slot for member |m|. */
static int add_member(peer_net *n, const cairn_member_info *m)
{
    if (n->npeers >= PEER_MAX_MEMBERS) {
        cairn_log(CAIRN_LOG_ERROR,
                  "member %016" PRIx64 ": more than %d members known since start: "
                  "not linked (restart this node)",
                  m->id, PEER_MAX_MEMBERS);
        return CAIRN_ELIMIT;
    }
    char addr[256];
    if (!m->npeer_urls || cairn_url_to_addr(addr, sizeof addr, m->peer_urls[0]))
        return CAIRN_EINVAL;
    /* a --peer-dials address stands for the member of that name */
    for (size_t j = 0; j < n->cfg->npeer_dials; j++)
        if (m->name[0] && strcmp(n->cfg->peer_dials[j].name, m->name) == 0)
            snprintf(addr, sizeof addr, "%s", n->cfg->peer_dials[j].addr);
    ppeer *p = &n->peers[n->npeers];
    memset(p, 0, sizeof *p);
    p->net = n;
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, m->id);
    p->name = strdup(m->name[0] ? m->name : hex);
    p->addr = strdup(addr);
    p->url = strdup(m->peer_urls[0]);
    p->id = m->id;
    pthread_mutex_init(&p->qmu, NULL);
    p->qtail = &p->qhead;
    p->backoff_ms = PEER_BACKOFF_MIN_MS;
    p->linked = !n->cfg->peer_links;
    for (size_t j = 0; j < n->cfg->npeer_links; j++)
        p->linked |= strcmp(n->cfg->peer_links[j], m->name) == 0;
    if (p->name && p->addr && p->url && cairn_replica_new(&p->rep, n->store, NULL) == 0)
        p->ch = open_channel(n, p->addr, p->url);
    if (!p->ch) { /* the slot stays unfilled */
        cairn_replica_free(p->rep);
        pthread_mutex_destroy(&p->qmu);
        free(p->name);
        free(p->addr);
        free(p->url);
        memset(p, 0, sizeof *p);
        return CAIRN_ENOMEM;
    }
    n->npeers++; /* seq_cst: the slot is whole before other threads see it */
    cairn_log(CAIRN_LOG_INFO, "peer %s (%016" PRIx64 "): added to the cluster, at %s", p->name,
              p->id, p->url);
    return 0;
}

/* Member |m|'s peer URLs changed: dial the new address from now on. */
static void readdress(peer_net *n, ppeer *p, const cairn_member_info *m)
{
    if (!m->npeer_urls)
        return;
    for (size_t j = 0; j < m->npeer_urls; j++)
        if (p->url && strcmp(p->url, m->peer_urls[j]) == 0)
            return; /* still one of its URLs */
    char addr[256];
    char *url = strdup(m->peer_urls[0]);
    if (!url || cairn_url_to_addr(addr, sizeof addr, url)) {
        free(url);
        return;
    }
    char *a = strdup(addr);
    grpc_channel *ch = a ? open_channel(n, a, url) : NULL;
    if (!ch) {
        free(a);
        free(url);
        return;
    }
    if (p->dial)
        link_kill(p->dial, "the member's peer URLs changed");
    if (p->live && p->live->dialed)
        link_kill(p->live, "the member's peer URLs changed");
    /* the old channel's calls are all cancelled; it goes at peer_net_free */
    grpc_channel_destroy(p->ch);
    p->ch = ch;
    free(p->addr);
    free(p->url);
    p->addr = a;
    p->url = url;
    p->next_dial_ms = 0;
    p->backoff_ms = PEER_BACKOFF_MIN_MS;
    cairn_log(CAIRN_LOG_INFO, "peer %s (%016" PRIx64 "): peer URLs changed, dialing %s", p->name,
              p->id, url);
}

/* The peer set after the store's member table, when that moved. Bounded:
 * one list read of the table (a few entries) per change of it. */
static void follow_members(peer_net *n)
{
    if (atomic_load(&n->catching_up))
        return; /* the answered table stands until then */
    uint64_t gen = cairn_store_members_gen(n->store) + 1;
    if (gen == n->members_gen)
        return;
    cairn_member_info *v;
    size_t k;
    if (cairn_store_member_list(n->store, &v, &k))
        return; /* again at the next tick */
    n->members_gen = gen;
    if (k == 0) { /* a store without a table (no members change): keep the flags' */
        cairn_store_member_list_free(v, k);
        return;
    }
    int self = 0;
    for (size_t i = 0; i < k; i++) {
        if (v[i].id == n->my_id) {
            self = 1;
            continue;
        }
        ppeer *p = peer_by_id(n, v[i].id);
        if (!p)
            add_member(n, &v[i]);
        else if (!atomic_load(&p->removed))
            readdress(n, p, &v[i]);
    }
    for (size_t i = 0; i < n->npeers; i++) {
        ppeer *p = &n->peers[i];
        int in = 0;
        for (size_t j = 0; j < k && !in; j++)
            in = v[j].id == p->id;
        if (!in && !atomic_load(&p->removed)) {
            p->removed_ms = now_ms();
            atomic_store(&p->removed, 1);
            cairn_log(CAIRN_LOG_INFO, "peer %s (%016" PRIx64 "): removed from the cluster", p->name,
                      p->id);
        }
    }
    cairn_store_member_list_free(v, k);
    if (self)
        n->saw_self = 1;
    else if (n->saw_self)
        removed_self(n);
}

static void tick(peer_net *n)
{
    uint64_t now = now_ms();
    follow_members(n);
    for (size_t i = 0; i < n->npeers; i++) {
        ppeer *p = &n->peers[i];
        int gone = atomic_load(&p->removed);
        if (gone && now >= p->removed_ms + PEER_REMOVE_GRACE_MS) {
            leave_removed(p);
            continue;
        }
        if (!p->linked)
            continue;
        if (!p->live && !p->dial && now >= p->next_dial_ms) {
            if (!gone)
                dial(n, p);
            continue;
        }
        plink *l = p->live;
        uint64_t from = atomic_load(&n->join_from);
        if (from && p->id == from && l && !l->dead)
            n->join_from_seen_ms = now;
        if (from && now > n->join_from_seen_ms + PEER_JOIN_MS) {
            cairn_log(CAIRN_LOG_WARN,
                      "joining: no stream to the member that answered the join for %d ms: "
                      "catching up from every member",
                      PEER_JOIN_MS);
            atomic_store(&n->join_from, 0);
            from = 0;
        }
        if (!l || l->dead || l->sending || l->refusing || l->bye)
            continue;
        /* joining: the others hear nothing from us yet but pushes (their
         * answers to our sync messages would each be the whole history) */
        int quiet = from && p->id != from;
        uint8_t *msg = NULL;
        size_t len = 0;
        int rc = 0;
        uint64_t us = now_us();
        if (us >= p->pushed_us + PEER_PUSH_GAP_US) {
            rc = push_queued(n, p, &msg, &len);
            if (!rc && msg) {
                atomic_fetch_add(&p->pushes, 1);
                p->pushed_us = us;
            }
        }
        if (!rc && !msg && n->cfg->peer_links && p->urls_sent_gen != n->urls_gen) {
            p->urls_sent_gen = n->urls_gen;
            if (send_members(n, l))
                link_kill(l, "cannot send");
            continue;
        }
        int periodic = now >= p->next_sync_ms;
        /* One acknowledgement per PEER_TICK_MS at most, for however many
         * pushes became durable meanwhile: during a burst every push
         * would otherwise get its own (the thread ticks after every
         * event). Any sync message carries our heads, so it counts. */
        int ack = now >= p->answered_ms + PEER_TICK_MS && atomic_load(&p->ack_due);
        if (!rc && !msg && !quiet && (atomic_exchange(&p->answer_due, 0) || ack || periodic)) {
            atomic_store(&p->ack_due, 0);
            p->answered_ms = now;
            if (periodic) {
                p->next_sync_ms = now + n->cfg->sync_interval_ms;
                cairn_replica_tick(p->rep);
            }
            rc = cairn_replica_generate(p->rep, &msg, &len);
            if (!rc && msg)
                atomic_fetch_add(&p->sync_rounds, 1);
        }
        if (rc) {
            cairn_log(CAIRN_LOG_ERROR, "peer %s: cannot make a sync message: %s", p->name,
                      cairn_strerror(rc));
            free(msg);
            continue;
        }
        if (msg && send_sync(l, msg, len))
            link_kill(l, "cannot send");
    }
    /* a refused peer that does not end its side: ended here */
    for (plink *l = n->links; l; l = l->next)
        if (l->refusing && !l->dead && now >= l->refuse_ms + PEER_GOODBYE_MS)
            link_kill(l, "refused");
    links_sweep(n);
}

static void drain(peer_net *n, int ms)
{
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(n->cq, in_ms(ms), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            return;
        on_event(n, ev.tag, ev.success);
        ms = 0;
    }
}

/* A Goodbye saying |reason| (static) and the stream's clean close on |l|,
 * which sends nothing now. */
static void say_goodbye(plink *l, const char *reason)
{
    Cairnpb__Goodbye g = CAIRNPB__GOODBYE__INIT;
    l->bye_due = NULL;
    g.reason = (char *)reason;
    if (l->refusing) {
        grpc_slice_unref(l->bye_details);
        l->bye_details = grpc_slice_from_copied_string(reason);
    }
    Cairnpb__PeerMessage m = CAIRNPB__PEER_MESSAGE__INIT;
    m.body_case = CAIRNPB__PEER_MESSAGE__BODY_GOODBYE;
    m.goodbye = &g;
    l->sbuf = rpc_pack(&m.base);
    if (!l->sbuf) {
        l->closed = 1;
        return;
    }
    l->sbuf_len = grpc_byte_buffer_length(l->sbuf);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_MESSAGE;
    ops[0].data.send_message.send_message = l->sbuf;
    if (l->dialed) {
        ops[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    } else {
        ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[1].data.send_status_from_server.status =
            l->refusing ? l->refuse_status : GRPC_STATUS_OK;
        ops[1].data.send_status_from_server.status_details = &l->bye_details;
    }
    l->bye = 1;
    if (link_batch(l, ops, 2, &l->t_send)) {
        grpc_byte_buffer_destroy(l->sbuf);
        l->sbuf = NULL;
        l->closed = 1; /* nothing to wait for: cancelled with the rest */
        return;
    }
    l->sending = 1;
}

/* Shutting down: a goodbye on every live stream once its send in flight
 * completed, then up to PEER_GOODBYE_MS for the streams to close (the
 * peer ends its side when it reads the goodbye). */
static void say_goodbyes(peer_net *n)
{
    uint64_t until = now_ms() + PEER_GOODBYE_MS;
    for (;;) {
        int waiting = 0;
        for (size_t i = 0; i < n->npeers; i++) {
            plink *l = n->peers[i].live;
            if (!l || l->dead || l->closed)
                continue;
            if (!l->bye && !l->sending)
                say_goodbye(l, "shutting down");
            waiting |= l->bye || l->sending;
        }
        if (!waiting || now_ms() >= until)
            return;
        drain(n, PEER_TICK_MS);
    }
}

static void *peer_main(void *arg)
{
    peer_net *n = arg;
    on_peer_thread = 1;
    wake_new(n);
    while (!atomic_load(&n->stop)) {
        if (n->npeers) {
            drain(n, wake_arm(n));
            wake_disarm(n);
        } else {
            /* Not a poller while idle: take what is queued, then sleep. */
            drain(n, 0);
            struct timespec ts = {0, PEER_IDLE_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        tick(n);
    }
    say_goodbyes(n);
    /* the wake call: cancelled here unless the committer took it */
    if (wake_disarm(n) && n->wake_state == W_IDLE) {
        n->wake_state = W_TAKEN;
        grpc_call_cancel(n->wake_call, NULL);
    }
    /* end every stream, wait until nothing is pending */
    grpc_server_shutdown_and_notify(n->server, n->cq, &n->t_shutdown);
    grpc_server_cancel_all_calls(n->server);
    for (plink *l = n->links; l; l = l->next)
        link_kill(l, "shutting down");
    for (int tries = 0; tries < 500; tries++) {
        drain(n, 10);
        links_sweep(n);
        if (!n->links && !n->accepting && n->shut_done && n->wake_state == W_NONE && !n->njoins)
            break;
    }
    return NULL;
}

/* ---- the store's subscriber (completer thread) ------------------------ */

static void on_durable(void *arg, int64_t rev, const cairn_hash *hash, const uint8_t *change,
                       size_t change_len, const cairn_event *ev, size_t nev)
{
    (void)rev;
    (void)hash;
    (void)ev;
    (void)nev;
    peer_net *n = arg;
    /* In a full mesh only this node's own changes are pushed (PUSH AND
     * SYNC): the others are neither copied nor woken for. The author is
     * bytes 1..16 of a change (change.c). */
    if (!n->cfg->peer_links &&
        (change_len < 1 + CAIRN_ACTOR_LEN || memcmp(change + 1, n->actor.b, CAIRN_ACTOR_LEN) != 0))
        return;
    int queued = 0;
    for (size_t i = 0; i < n->npeers; i++) {
        ppeer *p = &n->peers[i];
        if (!atomic_load(&p->connected))
            continue;
        pthread_mutex_lock(&p->qmu);
        if (p->qbytes + change_len > PEER_QUEUE_BYTES) {
            atomic_fetch_add(&p->dropped, 1); /* periodic sync sends it later */
        } else {
            qchange *q = malloc(sizeof *q + change_len);
            if (q) {
                q->next = NULL;
                q->len = change_len;
                memcpy(q->bytes, change, change_len);
                *p->qtail = q;
                p->qtail = &q->next;
                p->qbytes += change_len;
                queued = 1;
            } else {
                atomic_fetch_add(&p->dropped, 1);
            }
        }
        pthread_mutex_unlock(&p->qmu);
    }
    if (queued)
        wake_thread(n);
}

/* ---- life cycle -------------------------------------------------------- */

static int is_https(const char *url)
{
    return strncmp(url, "https://", 8) == 0;
}

static grpc_channel_credentials *channel_creds(peer_net *n)
{
    grpc_ssl_pem_key_cert_pair kp = {n->tls_key, n->tls_cert};
    if (!n->skip_verify)
        return grpc_ssl_credentials_create_ex(n->tls_ca, n->tls_key ? &kp : NULL, NULL, NULL);
    /* etcd: --peer-auto-tls dials without verifying the peer's chain */
    grpc_tls_credentials_options *o = grpc_tls_credentials_options_create();
    grpc_tls_identity_pairs *pairs = grpc_tls_identity_pairs_create();
    grpc_tls_identity_pairs_add_pair(pairs, n->tls_key, n->tls_cert);
    grpc_tls_certificate_provider *prov =
        grpc_tls_certificate_provider_static_data_create(NULL, pairs);
    grpc_tls_credentials_options_set_certificate_provider(o, prov);
    grpc_tls_credentials_options_watch_identity_key_cert_pairs(o);
    grpc_tls_credentials_options_set_verify_server_cert(o, 0);
    grpc_tls_credentials_options_set_check_call_host(o, 0);
    grpc_channel_credentials *cr = grpc_tls_credentials_create(o);
    grpc_tls_certificate_provider_release(prov);
    return cr;
}

static grpc_channel *open_channel(peer_net *n, const char *addr, const char *url)
{
    grpc_arg a[7];
    memset(a, 0, sizeof a);
    const struct {
        const char *key;
        int v;
    } kv[6] = {
        {GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, (int)PEER_BACKOFF_MIN_MS},
        {GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, (int)PEER_BACKOFF_MIN_MS},
        {GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, (int)PEER_BACKOFF_MAX_MS},
        {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, PEER_MAX_MSG_BYTES},
        {GRPC_ARG_KEEPALIVE_TIME_MS, 2000},
        {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000},
    };
    for (int i = 0; i < 6; i++) {
        a[i].type = GRPC_ARG_INTEGER;
        a[i].key = (char *)kv[i].key;
        a[i].value.integer = kv[i].v;
    }
    size_t na = 6;
    char host[256];
    grpc_channel_credentials *cr;
    if (is_https(url)) {
        /* the name checked is the peer URL's host, wherever we dial */
        if (cairn_tls_url_host(host, sizeof host, url) == 0) {
            a[na].type = GRPC_ARG_STRING;
            a[na].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
            a[na++].value.string = host;
        }
        cr = channel_creds(n);
    } else {
        cr = grpc_insecure_credentials_create();
    }
    grpc_channel_args args = {na, a};
    grpc_channel *ch = cr ? grpc_channel_create(addr, cr, &args) : NULL;
    grpc_channel_credentials_release(cr);
    return ch;
}

static char *read_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0;
    if (f) {
        char chunk[4096];
        size_t k;
        while ((k = fread(chunk, 1, sizeof chunk, f)) > 0 && len < (1u << 20)) {
            char *g = realloc(buf, len + k + 1);
            if (!g) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = g;
            memcpy(buf + len, chunk, k);
            len += k;
            buf[len] = '\0';
        }
        fclose(f);
    }
    if (!buf)
        snprintf(err, errlen, "cannot read %s", path);
    return buf;
}

/* The --peer-* TLS settings: PEM text for gRPC and tls/'s checker. */
static int tls_setup(peer_net *n, char *err, size_t errlen)
{
    const cairn_config *cfg = n->cfg;
    int any = 0;
    for (size_t i = 0; i < cfg->nlisten_peer_urls; i++)
        any |= is_https(cfg->listen_peer_urls[i]);
    for (size_t i = 0; i < cfg->ninitial_cluster; i++)
        for (size_t j = 0; j < cfg->initial_cluster[i].npeer_urls; j++)
            any |= is_https(cfg->initial_cluster[i].peer_urls[j]);
    if (!any)
        return 0;
    cairn_tls_options o;
    cairn_tls_paths paths;
    int rc = cairn_tls_options_from(&o, &paths, cfg, &cfg->peer_tls, "peer", cfg->listen_peer_urls,
                                    cfg->nlisten_peer_urls, err, errlen);
    if (rc)
        return rc;
    if ((o.cert_file && !(n->tls_cert = read_file(o.cert_file, err, errlen))) ||
        (o.key_file && !(n->tls_key = read_file(o.key_file, err, errlen))) ||
        (o.trusted_ca_file && !(n->tls_ca = read_file(o.trusted_ca_file, err, errlen))))
        return CAIRN_EIO;
    n->tls = n->tls_cert && n->tls_key;
    n->skip_verify = cfg->peer_tls.auto_tls && o.cert_file == paths.cert;
    /* etcd: a trusted CA makes the client certificate required, as does
     * --peer-client-cert-auth; an allowed CN or hostname needs one too */
    n->verify_clients =
        o.trusted_ca_file || o.client_cert_auth || o.allowed_cn || o.allowed_hostname;
    return cairn_tls_checker_new(&n->checker, &o, err, errlen);
}

static grpc_server_credentials *server_creds(peer_net *n, const char *url, char *err, size_t errlen)
{
    if (!is_https(url))
        return grpc_insecure_server_credentials_create();
    if (!n->tls) {
        /* etcd: an https peer URL needs --peer-cert-file and --peer-key-file
         * (or --peer-auto-tls) */
        snprintf(err, errlen,
                 "cannot serve %s: https:// needs --peer-cert-file and --peer-key-file, or "
                 "--peer-auto-tls",
                 url);
        return NULL;
    }
    grpc_ssl_pem_key_cert_pair kp = {n->tls_key, n->tls_cert};
    /* asked for, checked by check_cert with the reason logged */
    return grpc_ssl_server_credentials_create_ex(
        n->tls_ca, &kp, 1,
        n->verify_clients ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY
                          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
}

/* Equal as sets. */
static int same_urls(char *const *a, size_t na, char *const *b, size_t nb)
{
    if (na != nb)
        return 0;
    for (size_t i = 0; i < na; i++) {
        int in = 0;
        for (size_t j = 0; j < nb && !in; j++)
            in = strcmp(a[i], b[j]) == 0;
        if (!in)
            return 0;
    }
    return 1;
}

static int add_peers(peer_net *n, const peer_join *seed, char *err, size_t errlen)
{
    const cairn_config *cfg = n->cfg;
    n->peers = calloc(PEER_MAX_MEMBERS, sizeof *n->peers);
    if (!n->peers)
        return CAIRN_ENOMEM;
    if (seed) {
        /* a join: the table the cluster answered (the ids of added members
         * are not --initial-cluster's) */
        atomic_store(&n->catching_up, 1);
        for (size_t i = 0; i < seed->nmembers; i++) {
            if (seed->members[i].name && strcmp(seed->members[i].name, seed->from) == 0) {
                atomic_store(&n->join_from, seed->members[i].id);
                n->join_from_seen_ms = now_ms();
            }
            if (seed->members[i].id == n->my_id)
                continue;
            int rc = add_member(n, &seed->members[i]);
            if (rc) {
                snprintf(err, errlen, "member %016" PRIx64 " of the joined cluster: %s",
                         seed->members[i].id, cairn_strerror(rc));
                return rc;
            }
        }
        return 0;
    }
    if (cfg->ninitial_cluster > PEER_MAX_MEMBERS) {
        snprintf(err, errlen, "more than %d members in --initial-cluster", PEER_MAX_MEMBERS);
        return CAIRN_EINVAL;
    }
    /* A restart: a member of --initial-cluster that the table holds at the
     * same peer URLs under another id was added later (its id carries the
     * time of the add, which the flags cannot give): it comes through
     * follow_members under its real id. (One the table lacks altogether
     * was removed: it is added, so that follow_members marks it removed
     * and its hellos get etcd's refusal.) */
    cairn_member_info *tab = NULL;
    size_t ntab = 0;
    if (cairn_store_member_list(n->store, &tab, &ntab))
        ntab = 0;
    int rc = 0;
    for (size_t i = 0; i < cfg->ninitial_cluster && !rc; i++) {
        const cairn_config_member *m = &cfg->initial_cluster[i];
        if (strcmp(m->name, cfg->name) == 0)
            continue;
        uint64_t id = cairn_store_member_id_of((const char *const *)m->peer_urls, m->npeer_urls,
                                               cfg->initial_cluster_token);
        int later = 0;
        for (size_t j = 0; j < ntab && !later; j++)
            later = tab[j].id != id &&
                    same_urls(tab[j].peer_urls, tab[j].npeer_urls, m->peer_urls, m->npeer_urls);
        if (later)
            continue;
        ppeer *p = &n->peers[n->npeers];
        p->net = n;
        char addr[256];
        const char *dial_at = NULL;
        for (size_t j = 0; j < cfg->npeer_dials; j++)
            if (strcmp(cfg->peer_dials[j].name, m->name) == 0)
                dial_at = cfg->peer_dials[j].addr;
        if (!dial_at) {
            if (m->npeer_urls == 0 || cairn_url_to_addr(addr, sizeof addr, m->peer_urls[0])) {
                snprintf(err, errlen, "member %s has no usable peer URL", m->name);
                rc = CAIRN_EINVAL;
                break;
            }
            dial_at = addr;
        }
        p->name = strdup(m->name);
        p->addr = strdup(dial_at);
        p->url = m->npeer_urls ? strdup(m->peer_urls[0]) : NULL;
        p->id = id;
        pthread_mutex_init(&p->qmu, NULL);
        p->qtail = &p->qhead;
        p->backoff_ms = PEER_BACKOFF_MIN_MS;
        p->linked = !cfg->peer_links;
        for (size_t j = 0; j < cfg->npeer_links; j++)
            p->linked |= strcmp(cfg->peer_links[j], m->name) == 0;
        atomic_init(&p->answer_due, 0);
        atomic_init(&p->connected, 0);
        n->npeers++;
        if (!p->name || !p->addr || cairn_replica_new(&p->rep, n->store, NULL))
            rc = CAIRN_ENOMEM;
        else if (!(p->ch = open_channel(n, p->addr, m->npeer_urls ? m->peer_urls[0] : "")))
            rc = CAIRN_ENOMEM;
    }
    cairn_store_member_list_free(tab, ntab);
    return rc;
}

int peer_net_new(peer_net **out, const cairn_config *cfg, cairn_store *store, const peer_join *seed,
                 char *err, size_t errlen)
{
    *out = NULL;
    peer_net *n = calloc(1, sizeof *n);
    if (!n)
        return CAIRN_ENOMEM;
    grpc_init();
    n->cfg = cfg;
    n->store = store;
    n->my_id = cairn_store_member_id(store);
    n->cluster_id = cairn_store_cluster_id(store);
    cairn_store_actor(store, &n->actor);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    n->incarnation = (uint64_t)wall.tv_sec * 1000u + (uint64_t)wall.tv_nsec / 1000000u;
    n->urls_gen = 1;
    crypto_generichash(n->token_hash, sizeof n->token_hash,
                       (const uint8_t *)cfg->initial_cluster_token,
                       strlen(cfg->initial_cluster_token), NULL, 0);
    atomic_init(&n->stop, 0);
    pthread_mutex_init(&n->info_mu, NULL);
    n->t_accept = (ptag){T_ACCEPT, NULL};
    n->t_shutdown = (ptag){T_SHUTDOWN, NULL};
    n->t_wake = (ptag){T_WAKE, NULL};
    atomic_init(&n->wake_armed, 0);
    n->cq = grpc_completion_queue_create_for_next(NULL);
    /* never connected (WAKING): a path nothing listens on, in case */
    grpc_channel_credentials *wcr = grpc_insecure_credentials_create();
    n->wake_ch = grpc_channel_create("unix:/nonexistent/cairn-peer-wake", wcr, NULL);
    grpc_channel_credentials_release(wcr);
    grpc_arg a[3];
    memset(a, 0, sizeof a);
    a[0].type = a[1].type = a[2].type = GRPC_ARG_INTEGER;
    a[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    a[0].value.integer = PEER_MAX_MSG_BYTES;
    a[1].key = (char *)GRPC_ARG_HTTP2_MAX_PING_STRIKES;
    a[1].value.integer = 0;
    a[2].key = (char *)GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS;
    a[2].value.integer = 500;
    grpc_channel_args args = {3, a};
    n->server = grpc_server_create(&args, NULL);
    grpc_server_register_completion_queue(n->server, n->cq, NULL);
    int rc = tls_setup(n, err, errlen);
    if (!rc)
        rc = add_peers(n, seed, err, errlen);
    n->ports = calloc(cfg->nlisten_peer_urls ? cfg->nlisten_peer_urls : 1, sizeof *n->ports);
    if (!rc && !n->ports)
        rc = CAIRN_ENOMEM;
    for (size_t i = 0; !rc && i < cfg->nlisten_peer_urls; i++) {
        char addr[256];
        if (cairn_url_to_addr(addr, sizeof addr, cfg->listen_peer_urls[i])) {
            snprintf(err, errlen, "invalid listen peer URL %s", cfg->listen_peer_urls[i]);
            rc = CAIRN_EINVAL;
            break;
        }
        cairn_unix_remove_stale(addr);
        grpc_server_credentials *cr = server_creds(n, cfg->listen_peer_urls[i], err, errlen);
        if (!cr) {
            rc = CAIRN_EINVAL;
            break;
        }
        n->ports[i] = grpc_server_add_http2_port(n->server, addr, cr);
        grpc_server_credentials_release(cr);
        if (n->ports[i] == 0) {
            snprintf(err, errlen, "cannot listen for peer traffic on %s (address in use?)",
                     cfg->listen_peer_urls[i]);
            rc = CAIRN_EIO;
            break;
        }
        n->nports++;
    }
    if (!rc)
        rc = cairn_store_subscribe(store, on_durable, n);
    if (rc) {
        if (!err[0])
            snprintf(err, errlen, "cannot set up the peer transport: %s", cairn_strerror(rc));
        peer_net_free(n);
        return rc;
    }
    *out = n;
    return 0;
}

int peer_net_client_urls(peer_net *n, uint64_t id, char ***urls, size_t *nurls)
{
    *urls = NULL;
    *nurls = 0;
    ppeer *p = n ? peer_by_id(n, id) : NULL;
    if (!p)
        return CAIRN_ENOTFOUND;
    pthread_mutex_lock(&n->info_mu);
    int ok;
    *urls = copy_urls(p->client_urls, p->nclient_urls, &ok);
    *nurls = ok ? p->nclient_urls : 0;
    pthread_mutex_unlock(&n->info_mu);
    return ok ? 0 : CAIRN_ENOMEM;
}

void peer_net_urls_free(char **urls, size_t nurls)
{
    free_urls(urls, nurls);
}

int peer_net_acked_heads(peer_net *n, uint64_t id, cairn_hash **heads, size_t *nheads)
{
    *heads = NULL;
    *nheads = 0;
    ppeer *p = n ? peer_by_id(n, id) : NULL;
    if (!p)
        return CAIRN_ENOTFOUND;
    int rc = 0;
    pthread_mutex_lock(&n->info_mu);
    if (p->nacked) {
        *heads = malloc(p->nacked * sizeof **heads);
        if (*heads) {
            memcpy(*heads, p->acked, p->nacked * sizeof **heads);
            *nheads = p->nacked;
        } else {
            rc = CAIRN_ENOMEM;
        }
    }
    pthread_mutex_unlock(&n->info_mu);
    return rc;
}

void peer_net_set_ack_cb(peer_net *n, void (*cb)(void *arg), void *arg)
{
    n->ack_cb = cb;
    n->ack_arg = arg;
}

size_t peer_net_stats(peer_net *n, peer_stats *out, size_t max)
{
    if (!n)
        return 0;
    for (size_t i = 0; i < n->npeers && i < max; i++) {
        ppeer *p = &n->peers[i];
        peer_stats *o = &out[i];
        memset(o, 0, sizeof *o);
        o->id = p->id;
        snprintf(o->name, sizeof o->name, "%s", p->name);
        o->connected = atomic_load(&p->connected);
        o->connects = atomic_load(&p->connects);
        o->msgs_sent = atomic_load(&p->msgs_sent);
        o->bytes_sent = atomic_load(&p->bytes_sent);
        o->msgs_received = atomic_load(&p->msgs_received);
        o->bytes_received = atomic_load(&p->bytes_received);
        o->pushes = atomic_load(&p->pushes);
        o->pushes_dropped = atomic_load(&p->dropped);
        o->sync_rounds = atomic_load(&p->sync_rounds);
    }
    return n->npeers;
}

int peer_net_lag(peer_net *n, size_t i, uint64_t *changes, uint64_t *age_ms)
{
    *changes = 0;
    *age_ms = 0;
    if (!n || i >= n->npeers)
        return CAIRN_ENOTFOUND;
    ppeer *p = &n->peers[i];
    if (atomic_load(&p->removed))
        return CAIRN_ENOTFOUND;
    return cairn_replica_lag(p->rep, changes, age_ms);
}

void peer_net_joined(peer_net *n)
{
    if (n)
        atomic_store(&n->catching_up, 0);
    if (n && atomic_exchange(&n->join_from, 0))
        cairn_log(CAIRN_LOG_DEBUG, "joined: syncing with every member");
}

int peer_net_port(const peer_net *n, size_t i)
{
    return n && i < n->nports ? n->ports[i] : 0;
}

int peer_net_start(peer_net *n)
{
    grpc_server_start(n->server);
    post_accept(n);
    if (pthread_create(&n->th, NULL, peer_main, n) != 0)
        return CAIRN_ENOMEM;
    n->started = 1;
    size_t nlinked = 0;
    for (size_t i = 0; i < n->npeers; i++)
        nlinked += n->peers[i].linked;
    cairn_log(CAIRN_LOG_INFO, "serving peers on %s (%zu other members, linked to %zu)",
              n->cfg->listen_peer_urls[0], n->npeers, nlinked);
    return 0;
}

void peer_net_stop(peer_net *n)
{
    if (!n || n->stopped)
        return;
    n->stopped = 1;
    atomic_store(&n->stop, 1);
    if (n->started)
        pthread_join(n->th, NULL);
}

void peer_net_free(peer_net *n)
{
    if (!n)
        return;
    peer_net_stop(n);
    if (!n->started && n->server) {
        grpc_server_shutdown_and_notify(n->server, n->cq, &n->t_shutdown);
        grpc_server_cancel_all_calls(n->server);
        for (int tries = 0; tries < 500 && !n->shut_done; tries++)
            drain(n, 10);
    }
    for (size_t i = 0; i < n->npeers; i++) {
        ppeer *p = &n->peers[i];
        if (p->ch)
            grpc_channel_destroy(p->ch);
        cairn_replica_free(p->rep);
        while (p->qhead) {
            qchange *q = p->qhead;
            p->qhead = q->next;
            free(q);
        }
        pthread_mutex_destroy(&p->qmu);
        free_urls(p->client_urls, p->nclient_urls);
        free(p->acked);
        free(p->name);
        free(p->addr);
        free(p->url);
    }
    free(n->peers);
    if (n->wake_ch)
        grpc_channel_destroy(n->wake_ch);
    if (n->server)
        grpc_server_destroy(n->server);
    grpc_completion_queue_shutdown(n->cq);
    while (grpc_completion_queue_next(n->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(n->cq);
    free(n->ports);
    cairn_tls_checker_free(n->checker);
    free(n->tls_ca);
    free(n->tls_cert);
    free(n->tls_key);
    pthread_mutex_destroy(&n->info_mu);
    free(n);
    grpc_shutdown();
}

/* ---- JOIN (the joining side) --------------------------------------------- */

/* One Join call to |url| (dialed at |addr|): 0 and *out; -1 refused (the
 * reason in |err|); CAIRN_EIO no answer (logged, as etcd logs "could not
 * get cluster response from ..."). */
static int join_one(peer_net *scratch, peer_join *out, const char *addr, const char *url,
                    const uint8_t *req, size_t len, char *err, size_t errlen)
{
    grpc_channel *ch = open_channel(scratch, addr, url);
    if (!ch)
        return CAIRN_ENOMEM;
    rpc_client_reply r;
    int rc = rpc_client_unary(&r, ch, PEER_JOIN_METHOD, req, len, PEER_JOIN_MS);
    grpc_channel_destroy(ch);
    if (rc)
        return rc == CAIRN_ENOMEM ? rc : CAIRN_EIO;
    rc = CAIRN_EIO;
    if (r.status == GRPC_STATUS_OK && r.bytes) {
        char why[256];
        rc = peer_join_decode(out, r.bytes, r.len, why, sizeof why);
        if (rc == -1) {
            cairn_log(CAIRN_LOG_WARN, "could not get cluster response from %s: %s", url, why);
            rc = CAIRN_EIO;
        }
    } else if (r.status == GRPC_STATUS_FAILED_PRECONDITION) {
        snprintf(err, errlen, "%s", r.details);
        rc = -1;
    } else {
        cairn_log(CAIRN_LOG_WARN, "could not get cluster response from %s: %s (status %d)", url,
                  r.details, (int)r.status);
    }
    rpc_client_reply_destroy(&r);
    return rc;
}

int peer_net_join(peer_join *out, const cairn_config *cfg, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    err[0] = 0;
    grpc_init();
    /* only the TLS settings and the channel maker of a peer_net */
    peer_net scratch;
    memset(&scratch, 0, sizeof scratch);
    scratch.cfg = cfg;
    int rc = tls_setup(&scratch, err, errlen);
    Cairnpb__JoinPeer *ps = calloc(cfg->ninitial_cluster ? cfg->ninitial_cluster : 1, sizeof *ps);
    Cairnpb__JoinPeer **pp = calloc(cfg->ninitial_cluster ? cfg->ninitial_cluster : 1, sizeof *pp);
    uint8_t *req = NULL;
    size_t len = 0;
    uint8_t th[32];
    if (!rc && (!ps || !pp))
        rc = CAIRN_ENOMEM;
    if (!rc) {
        crypto_generichash(th, sizeof th, (const uint8_t *)cfg->initial_cluster_token,
                           strlen(cfg->initial_cluster_token), NULL, 0);
        for (size_t i = 0; i < cfg->ninitial_cluster; i++) {
            cairnpb__join_peer__init(&ps[i]);
            ps[i].name = cfg->initial_cluster[i].name;
            ps[i].peer_urls = cfg->initial_cluster[i].peer_urls;
            ps[i].n_peer_urls = cfg->initial_cluster[i].npeer_urls;
            pp[i] = &ps[i];
        }
        Cairnpb__JoinRequest r = CAIRNPB__JOIN_REQUEST__INIT;
        r.protocol_version = PEER_PROTOCOL_VERSION;
        r.token_hash.data = th;
        r.token_hash.len = sizeof th;
        r.name = cfg->name;
        r.peer_urls = cfg->initial_advertise_peer_urls;
        r.n_peer_urls = cfg->ninitial_advertise_peer_urls;
        r.initial_cluster = pp;
        r.n_initial_cluster = cfg->ninitial_cluster;
        len = cairnpb__join_request__get_packed_size(&r);
        req = malloc(len ? len : 1);
        if (req)
            cairnpb__join_request__pack(&r, req);
        else
            rc = CAIRN_ENOMEM;
    }
    /* etcd: the members of --initial-cluster other than this one, in turn,
     * each at every peer URL; the first answer decides */
    int answered = 0;
    for (size_t i = 0; !rc && !answered && i < cfg->ninitial_cluster; i++) {
        const cairn_config_member *m = &cfg->initial_cluster[i];
        if (strcmp(m->name, cfg->name) == 0)
            continue;
        const char *dial_at = NULL;
        for (size_t j = 0; j < cfg->npeer_dials; j++)
            if (strcmp(cfg->peer_dials[j].name, m->name) == 0)
                dial_at = cfg->peer_dials[j].addr;
        for (size_t u = 0; !rc && !answered && u < m->npeer_urls; u++) {
            char addr[256];
            if (!dial_at && cairn_url_to_addr(addr, sizeof addr, m->peer_urls[u]))
                continue;
            int r1 = join_one(&scratch, out, dial_at ? dial_at : addr, m->peer_urls[u], req, len,
                              err, errlen);
            if (r1 == 0) {
                answered = 1;
                snprintf(out->from, sizeof out->from, "%s", m->name);
            } else if (r1 != CAIRN_EIO) {
                rc = r1 == -1 ? CAIRN_EINVAL : r1;
            }
        }
    }
    if (!rc && !answered) {
        /* etcd's words */
        snprintf(err, errlen,
                 "cannot fetch cluster info from peer urls: could not retrieve cluster "
                 "information from the given URLs");
        rc = CAIRN_EIO;
    }
    free(req);
    free(ps);
    free(pp);
    cairn_tls_checker_free(scratch.checker);
    free(scratch.tls_ca);
    free(scratch.tls_cert);
    free(scratch.tls_key);
    grpc_shutdown();
    return rc;
}
