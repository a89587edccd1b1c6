/*
 * Maintenance.Snapshot: a consistent copy of the data dir, streamed as a tar
 * archive that cairn can start from (`mkdir d && tar -xf snap.db -C d &&
 * cairn --data-dir d`).
 *
 * Consistency is the store's: cairn_store_snapshot (store/snapshot.c)
 * freezes its writers and its own threads, hard-links LevelDB's tables and
 * copies the log and the MANIFEST into a working dir, so the copy holds
 * exactly the durable changes. This file only streams that copy, with
 * writes flowing again, and cairn_store_snap_free removes it at the end.
 *
 * Format. etcd: `etcdctl snapshot save` accepts a stream whose length is a
 * multiple of 512 plus 32: the data, then its SHA-256 (it checks exactly
 * that, clientv3/snapshot: hasChecksum). A ustar archive is made of
 * 512-byte blocks, so cairn sends the archive (a "db/" directory entry, one
 * entry per file, two zero blocks), then the SHA-256 of the archive as a
 * last message with remaining_bytes 0, as etcd does. Chunks are 32 KiB like
 * etcd's.
 *
 * Identity. The archive starts with a small file, CAIRN_STORE_RESTORE_MARKER
 * (store.h), next to db/: the store's first open of a restored dir draws a
 * new actor id, so the copy never writes changes under the original's actor
 * (same actor and seq, different change: a fork the CRDT rejects). Keys,
 * revisions and leases are kept, and so are the member and cluster id —
 * etcd: `etcdctl snapshot restore` (3.4) derives them from its --name,
 * --initial-cluster and --initial-cluster-token flags, so a restore with the
 * original's flags gives the original's ids (measured: same member_id,
 * cluster_id, revision and lease); cairn has no restore step, so it keeps
 * the stored ones. The restored node can replace the original, and with its
 * new actor it can also run beside it without forking the document.
 */
#include "server/etcd/etcd.h"

#include "crdt/error.h"
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#define CHUNK_BYTES (32u * 1024u)
/* The marker's content; only its presence matters. */
#define MARK_TEXT                                                                                  \
    "restored from a cairn snapshot: the first open gives this data dir a new actor id\n"

enum { PH_MARK = 0, PH_DIR, PH_HEADER, PH_DATA, PH_PAD, PH_TRAILER, PH_SHA, PH_DONE };

typedef struct snapshot_stream snapshot_stream;

struct snapshot_stream {
    cairn_store_snap *copy; /* the store's copy, removed by snapshot_stream_free */
    const cairn_store_snap_file *files;
    size_t nfiles;
    uint64_t total; /* archive bytes */
    uint64_t sent;
    size_t fi;
    int phase;
    int fd;
    uint64_t off;   /* within the current file or padding */
    uint64_t trail; /* trailer bytes written */
    uint64_t mtime; /* of every entry: when the copy was made */
    crypto_hash_sha256_state sha;
    uint8_t buf[CHUNK_BYTES];
};

/* ---- the copy ------------------------------------------------------------ */

static void snapshot_stream_free(snapshot_stream *s)
{
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    cairn_store_snap_free(s->copy);
    free(s);
}

static int snapshot_open(snapshot_stream **out, cairn_server *srv)
{
    *out = NULL;
    snapshot_stream *s = malloc(sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    memset(s, 0, sizeof *s);
    s->fd = -1;
    int rc = cairn_store_snapshot(srv->store, &s->copy);
    if (rc != 0) {
        cairn_log(CAIRN_LOG_ERROR, "snapshot of %s failed: %s", srv->cfg->data_dir,
                  cairn_strerror(rc));
        snapshot_stream_free(s);
        return rc;
    }
    s->nfiles = cairn_store_snap_files(s->copy, &s->files);
    s->total = 512 + 512 + 512 + 1024; /* marker (header, data), db/, trailer */
    for (size_t i = 0; i < s->nfiles; i++)
        s->total += 512 + (s->files[i].size + 511) / 512 * 512;
    crypto_hash_sha256_init(&s->sha);
    s->mtime = (uint64_t)time(NULL);
    cairn_log(CAIRN_LOG_INFO, "sending a snapshot of %zu files, %" PRIu64 " bytes", s->nfiles,
              s->total);
    *out = s;
    return 0;
}

/* ---- ustar --------------------------------------------------------------- */

static void octal(char *field, size_t width, uint64_t v)
{
    /* width-1 octal digits and a NUL, zero padded. */
    field[width - 1] = '\0';
    for (size_t i = width - 1; i-- > 0;) {
        field[i] = (char)('0' + (v & 7));
        v >>= 3;
    }
}

static void tar_header(uint8_t block[512], const char *name, uint64_t size, int dir,
                       uint64_t mtime)
{
    memset(block, 0, 512);
    char *b = (char *)block;
    snprintf(b, 100, "%s", name);
    octal(b + 100, 8, dir ? 0700 : 0600);
    octal(b + 108, 8, 0);
    octal(b + 116, 8, 0);
    octal(b + 124, 12, size);
    octal(b + 136, 12, mtime);
    b[156] = dir ? '5' : '0';
    memcpy(b + 257, "ustar", 6);
    memcpy(b + 263, "00", 2);
    memset(b + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += block[i];
    octal(b + 148, 7, sum);
    b[155] = ' ';
}

/* Fills up to |cap| bytes of the archive; returns the count (0 at the end)
 * or a negative errno. */
static ssize_t fill(snapshot_stream *s, uint8_t *out, size_t cap)
{
    size_t n = 0;
    while (n < cap && s->phase < PH_SHA) {
        switch (s->phase) {
        case PH_MARK:
            if (cap - n < 1024)
                return (ssize_t)n;
            tar_header(out + n, CAIRN_STORE_RESTORE_MARKER, sizeof MARK_TEXT - 1, 0, s->mtime);
            memset(out + n + 512, 0, 512);
            memcpy(out + n + 512, MARK_TEXT, sizeof MARK_TEXT - 1);
            n += 1024;
            s->phase = PH_DIR;
            break;
        case PH_DIR:
            if (cap - n < 512)
                return (ssize_t)n;
            tar_header(out + n, "db/", 0, 1, s->mtime);
            n += 512;
            s->phase = PH_HEADER;
            break;
        case PH_HEADER:
            if (s->fi == s->nfiles) {
                s->phase = PH_TRAILER;
                break;
            }
            if (cap - n < 512)
                return (ssize_t)n;
            char name[256];
            snprintf(name, sizeof name, "db/%s", s->files[s->fi].name);
            tar_header(out + n, name, s->files[s->fi].size, 0, s->mtime);
            n += 512;
            s->fd = open(s->files[s->fi].path, O_RDONLY | O_CLOEXEC);
            if (s->fd < 0)
                return -errno;
            s->off = 0;
            s->phase = PH_DATA;
            break;
        case PH_DATA: {
            uint64_t left = s->files[s->fi].size - s->off;
            if (left == 0) {
                close(s->fd);
                s->fd = -1;
                s->off = 0;
                s->phase = PH_PAD;
                break;
            }
            size_t want = cap - n < left ? cap - n : (size_t)left;
            ssize_t k = read(s->fd, out + n, want);
            if (k < 0 && errno == EINTR)
                break;
            if (k <= 0) /* the file shrank: the archive would lie */
                return k < 0 ? -errno : -EIO;
            n += (size_t)k;
            s->off += (uint64_t)k;
            break;
        }
        case PH_PAD: {
            uint64_t pad = (512 - s->files[s->fi].size % 512) % 512;
            size_t k = cap - n < pad - s->off ? cap - n : (size_t)(pad - s->off);
            memset(out + n, 0, k);
            n += k;
            s->off += k;
            if (s->off == pad) {
                s->fi++;
                s->phase = PH_HEADER;
            }
            break;
        }
        case PH_TRAILER: {
            size_t k = cap - n < 1024 - s->trail ? cap - n : (size_t)(1024 - s->trail);
            memset(out + n, 0, k);
            n += k;
            s->trail += k;
            if (s->trail == 1024)
                s->phase = PH_SHA;
            break;
        }
        default:
            return (ssize_t)n;
        }
    }
    return (ssize_t)n;
}

/* ---- the RPC ------------------------------------------------------------- */

static void snap_ctx_free(rpc_call *c)
{
    snapshot_stream_free(c->ctx);
}

static void snap_next(rpc_call *c, int ok)
{
    snapshot_stream *s = c->ctx;
    if (!ok) {
        rpc_fail(c, CAIRN_ESTOPPED, "cairn: snapshot stream closed before it was sent");
        return;
    }
    Etcdserverpb__SnapshotResponse out;
    etcdserverpb__snapshot_response__init(&out);
    if (s->phase == PH_DONE) {
        rpc_reply(c, NULL);
        return;
    }
    if (s->phase == PH_SHA) {
        uint8_t digest[crypto_hash_sha256_BYTES];
        crypto_hash_sha256_final(&s->sha, digest);
        s->phase = PH_DONE;
        out.remaining_bytes = 0;
        out.blob.data = digest;
        out.blob.len = sizeof digest;
        rpc_stream_send(c, &out.base, snap_next);
        return;
    }
    ssize_t n = fill(s, s->buf, sizeof s->buf);
    if (n < 0) {
        cairn_log(CAIRN_LOG_ERROR, "snapshot: reading the copy failed: %s", strerror((int)-n));
        rpc_fail(c, CAIRN_EIO, NULL);
        return;
    }
    crypto_hash_sha256_update(&s->sha, s->buf, (unsigned long long)n);
    s->sent += (uint64_t)n;
    out.remaining_bytes = s->total - s->sent;
    out.blob.data = s->buf;
    out.blob.len = (size_t)n;
    rpc_stream_send(c, &out.base, snap_next);
}

void maint_snapshot(rpc_call *c, const uint8_t *req, size_t len)
{
    if (!rpc_unpack(c, &etcdserverpb__snapshot_request__descriptor, req, len))
        return;
    snapshot_stream *s;
    int rc = snapshot_open(&s, etcd_node(c));
    if (rc != 0) {
        rpc_fail(c, rc, NULL);
        return;
    }
    c->ctx = s;
    c->ctx_free = snap_ctx_free;
    snap_next(c, 1);
}
