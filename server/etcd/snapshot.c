/*
 * Maintenance.Snapshot: a consistent copy of the data dir, streamed as a tar
 * archive that cairn can start from (`mkdir d && tar -xf snap.db -C d &&
 * cairn --data-dir d`).
 *
 * Consistency. The store keeps one LevelDB database in <data-dir>/db. Its
 * table files (*.ldb, *.sst) never change once written, so they are hard
 * linked into a private working dir; CURRENT, the MANIFEST and the write-ahead
 * logs grow, so they are copied. While this happens writes are frozen (the
 * write gate in node.c: new writes wait, and the freeze starts once every
 * write in flight is durable), so the logs hold exactly the acknowledged
 * writes. LevelDB may still finish a background compaction meanwhile; it
 * records every change of files in the MANIFEST before it deletes anything,
 * so the copy is retried if CURRENT or the MANIFEST's size moved while it
 * was made. The freeze lasts as long as the copy of the logs (a few MB);
 * streaming happens afterwards, from the working dir, with writes flowing.
 * The store's own threads (lease expiry, coalesced keepalives) are not
 * frozen: a record one of them appends while the log is copied is either
 * whole in the copy or a torn tail, which LevelDB drops when it opens the
 * copy — the copy is then the state just before that write.
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

#include <dirent.h>
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
#define SNAP_PREFIX "snapshot.tmp."
#define FREEZE_ATTEMPTS 5
/* The marker's content; only its presence matters. */
#define MARK_TEXT                                                                                  \
    "restored from a cairn snapshot: the first open gives this data dir a new actor id\n"

struct snap_file {
    char name[256]; /* in the archive: "db/<file>" */
    char *path;     /* in the working dir */
    uint64_t size;
};

enum { PH_MARK = 0, PH_DIR, PH_HEADER, PH_DATA, PH_PAD, PH_TRAILER, PH_SHA, PH_DONE };

typedef struct snapshot_stream snapshot_stream;

struct snapshot_stream {
    char *dir; /* the working dir, removed by snapshot_stream_free */
    struct snap_file *files;
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

/* ---- working dir --------------------------------------------------------- */

static void remove_tree(const char *dir)
{
    /* Two levels at most: <snap>/db/<files>. */
    char path[4096];
    snprintf(path, sizeof path, "%s/db", dir);
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char f[4096];
            if (snprintf(f, sizeof f, "%s/%s", path, e->d_name) < (int)sizeof f)
                unlink(f);
        }
        closedir(d);
        rmdir(path);
    }
    rmdir(dir);
}

void snapshot_cleanup_dir(const char *data_dir)
{
    DIR *d = opendir(data_dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, SNAP_PREFIX, strlen(SNAP_PREFIX)) != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", data_dir, e->d_name);
        remove_tree(path);
    }
    closedir(d);
}

static void snapshot_stream_free(snapshot_stream *s)
{
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    for (size_t i = 0; i < s->nfiles; i++)
        free(s->files[i].path);
    free(s->files);
    if (s->dir) {
        remove_tree(s->dir);
        free(s->dir);
    }
    free(s);
}

static int copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -errno;
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) {
        int e = errno;
        close(in);
        return -e;
    }
    char buf[65536];
    int rc = 0;
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        if (n == 0)
            break;
        for (ssize_t w = 0; w < n;) {
            ssize_t k = write(out, buf + w, (size_t)(n - w));
            if (k < 0) {
                if (errno == EINTR)
                    continue;
                rc = -errno;
                break;
            }
            w += k;
        }
        if (rc)
            break;
    }
    close(in);
    if (close(out) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* CURRENT's content and the size of the MANIFEST it names, to notice a
 * LevelDB version edit during the copy. */
static int manifest_state(const char *db, char *current, size_t len, off_t *size)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/CURRENT", db);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, current, len - 1);
    close(fd);
    if (n <= 0)
        return -EIO;
    current[n] = '\0';
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(current, "\n"), current);
    snprintf(path, sizeof path, "%s/%s", db, name);
    struct stat st;
    if (stat(path, &st) != 0)
        return -errno;
    *size = st.st_size;
    return 0;
}

/* One attempt at copying <data>/db into <work>/db. */
static int copy_db(const char *db, const char *workdb)
{
    char cur0[256], cur1[256];
    off_t size0, size1;
    int rc = manifest_state(db, cur0, sizeof cur0, &size0);
    if (rc != 0)
        return rc;
    /* Pass 0: CURRENT and MANIFEST; pass 1: logs; pass 2: tables. */
    for (int pass = 0; pass < 3; pass++) {
        DIR *d = opendir(db);
        if (!d)
            return -errno;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            const char *n = e->d_name;
            int table = ends_with(n, ".ldb") || ends_with(n, ".sst");
            int log = ends_with(n, ".log");
            int meta = strcmp(n, "CURRENT") == 0 || strncmp(n, "MANIFEST-", 9) == 0;
            if ((pass == 0 && !meta) || (pass == 1 && !log) || (pass == 2 && !table))
                continue;
            char from[4096], to[4096];
            snprintf(from, sizeof from, "%s/%s", db, n);
            snprintf(to, sizeof to, "%s/%s", workdb, n);
            if (table && link(from, to) == 0)
                continue;
            rc = copy_file(from, to);
            if (rc == -ENOENT) /* deleted by a compaction: the check below retries */
                rc = 0;
            if (rc != 0)
                break;
        }
        closedir(d);
        if (rc != 0)
            return rc;
    }
    rc = manifest_state(db, cur1, sizeof cur1, &size1);
    if (rc != 0)
        return rc;
    return strcmp(cur0, cur1) == 0 && size0 == size1 ? 0 : -EAGAIN;
}

static int list_work(snapshot_stream *s, const char *workdb)
{
    DIR *d = opendir(workdb);
    if (!d)
        return -errno;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (strlen(e->d_name) > 200)
            continue;
        struct snap_file *grown = realloc(s->files, (s->nfiles + 1) * sizeof *grown);
        if (!grown) {
            rc = -ENOMEM;
            break;
        }
        s->files = grown;
        struct snap_file *f = &s->files[s->nfiles];
        memset(f, 0, sizeof *f);
        if (snprintf(f->name, sizeof f->name, "db/%s", e->d_name) >= (int)sizeof f->name) {
            rc = -ENAMETOOLONG;
            break;
        }
        size_t plen = strlen(workdb) + strlen(e->d_name) + 2;
        f->path = malloc(plen);
        if (!f->path) {
            rc = -ENOMEM;
            break;
        }
        snprintf(f->path, plen, "%s/%s", workdb, e->d_name);
        s->nfiles++;
        struct stat st;
        if (stat(f->path, &st) != 0) {
            rc = -errno;
            break;
        }
        f->size = (uint64_t)st.st_size;
    }
    closedir(d);
    return rc;
}

static void freeze(cairn_server *srv)
{
    pthread_mutex_lock(&srv->gate_mu);
    srv->frozen++;
    while (srv->inflight_writes > 0)
        pthread_cond_wait(&srv->gate_cv, &srv->gate_mu);
    pthread_mutex_unlock(&srv->gate_mu);
}

static void thaw(cairn_server *srv)
{
    pthread_mutex_lock(&srv->gate_mu);
    srv->frozen--;
    pthread_cond_broadcast(&srv->gate_cv);
    pthread_mutex_unlock(&srv->gate_mu);
}

static int snapshot_open(snapshot_stream **out, cairn_server *srv)
{
    *out = NULL;
    snapshot_stream *s = malloc(sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    memset(s, 0, sizeof *s);
    s->fd = -1;
    const char *data = srv->cfg->data_dir;
    size_t len = strlen(data) + 64;
    s->dir = malloc(len);
    char *workdb = malloc(len + 4);
    char *db = malloc(len);
    int rc = 0;
    if (!s->dir || !workdb || !db) {
        rc = CAIRN_ENOMEM;
        goto out;
    }
    snprintf(s->dir, len, "%s/" SNAP_PREFIX "%ld.%u", data, (long)getpid(),
             atomic_fetch_add(&srv->snapshot_seq, 1));
    snprintf(workdb, len + 4, "%s/db", s->dir);
    snprintf(db, len, "%s/db", data);
    int err = 0;
    for (int attempt = 0; attempt < FREEZE_ATTEMPTS; attempt++) {
        remove_tree(s->dir);
        if (mkdir(s->dir, 0700) != 0 || mkdir(workdb, 0700) != 0) {
            err = -errno;
            break;
        }
        freeze(srv);
        err = copy_db(db, workdb);
        thaw(srv);
        if (err != -EAGAIN)
            break;
    }
    if (err == 0)
        err = list_work(s, workdb);
    if (err != 0) {
        cairn_log(CAIRN_LOG_ERROR, "snapshot of %s failed: %s", db, strerror(-err));
        rc = err == -ENOMEM ? CAIRN_ENOMEM : CAIRN_EIO;
        goto out;
    }
    s->total = 512 + 512 + 512 + 1024; /* marker (header, data), db/, trailer */
    for (size_t i = 0; i < s->nfiles; i++)
        s->total += 512 + (s->files[i].size + 511) / 512 * 512;
    crypto_hash_sha256_init(&s->sha);
    s->mtime = (uint64_t)time(NULL);
    cairn_log(CAIRN_LOG_INFO, "sending a snapshot of %zu files, %" PRIu64 " bytes", s->nfiles,
              s->total);
out:
    free(workdb);
    free(db);
    if (rc != 0) {
        snapshot_stream_free(s);
        return rc;
    }
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
            tar_header(out + n, s->files[s->fi].name, s->files[s->fi].size, 0, s->mtime);
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
