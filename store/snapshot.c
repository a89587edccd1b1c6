/*
 * Snapshots and the size of the database on disk: the two things outside
 * store/ that need to know which files LevelDB keeps in <data dir>/db.
 *
 * Consistency. LevelDB's table files (*.ldb, *.sst) never change once
 * written, so a snapshot hard-links them into a private working dir next to
 * db/; CURRENT, the MANIFEST and the write-ahead log grow, so they are
 * copied. While that happens the store is frozen: the snapshot holds the
 * rwlock's read side, so no writer (Put, Txn, a peer's burst, a lease
 * grant, a coalesced keepalive, the expiry tick, a compaction) can apply a
 * change, and it first waits until the committer has written everything
 * queued before, so the committer has nothing to do either. The copy then
 * holds exactly the applied changes, all durable. Reads go on beside it
 * (until a writer queues behind the freeze: the lock prefers writers).
 * LevelDB may still finish a background compaction meanwhile; it records
 * every change of files in the MANIFEST before it deletes anything, so the
 * copy is made again if CURRENT or the MANIFEST's size moved. The freeze
 * lasts as long as the copy of the log and the MANIFEST (a few MB).
 *
 * The working dir is <data dir>/snapshot.tmp.<pid>.<n>/db; the caller
 * streams it and cairn_store_snap_free removes it. Open removes any left by
 * a crash. The archive format (tar, etcd's SHA-256 trailer) is the
 * server's business.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crdt/error.h"
#include "store/store_int.h"

#define SNAP_PREFIX "snapshot.tmp."
#define SNAP_ATTEMPTS 5

struct cairn_store_snap {
    char *dir; /* the working dir (removed by cairn_store_snap_free) */
    cairn_store_snap_file *files;
    size_t nfiles;
};

/* Removes <dir>/db/<files>, <dir>/db and <dir> (two levels, no more). */
static void remove_tree(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/db", dir) >= (int)sizeof path)
        return;
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

void cairn_store_snap_cleanup(const char *data_dir)
{
    DIR *d = opendir(data_dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, SNAP_PREFIX, strlen(SNAP_PREFIX)) != 0)
            continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", data_dir, e->d_name) < (int)sizeof path)
            remove_tree(path);
    }
    closedir(d);
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

/* One attempt at copying |db| into |workdb|: -EAGAIN if LevelDB changed its
 * files meanwhile. */
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

/* Fills sn->files from the working copy. */
static int list_copy(cairn_store_snap *sn, const char *workdb)
{
    DIR *d = opendir(workdb);
    if (!d)
        return -errno;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        cairn_store_snap_file *grown = realloc(sn->files, (sn->nfiles + 1) * sizeof *grown);
        if (!grown) {
            rc = -ENOMEM;
            break;
        }
        sn->files = grown;
        cairn_store_snap_file *f = &sn->files[sn->nfiles];
        memset(f, 0, sizeof *f);
        size_t plen = strlen(workdb) + strlen(e->d_name) + 2;
        char *path = malloc(plen);
        char *name = strdup(e->d_name);
        if (!path || !name) {
            free(path);
            free(name);
            rc = -ENOMEM;
            break;
        }
        snprintf(path, plen, "%s/%s", workdb, e->d_name);
        f->path = path;
        f->name = name;
        sn->nfiles++;
        struct stat st;
        if (stat(path, &st) != 0) {
            rc = -errno;
            break;
        }
        f->size = (uint64_t)st.st_size;
    }
    closedir(d);
    return rc;
}

/* The freeze (see the top): no writer applies anything while the read side
 * is held, and nothing applied before waits for the committer. */
static int freeze(cairn_store *s)
{
    pthread_rwlock_rdlock(&s->rw);
    pthread_mutex_lock(&s->qmu);
    while ((s->batch_n || s->writing) && !atomic_load(&s->failed))
        pthread_cond_wait(&s->dcv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
    int rc = cairn_store_failed_rc(s);
    if (rc)
        pthread_rwlock_unlock(&s->rw);
    return rc;
}

void cairn_store_snap_free(cairn_store_snap *sn)
{
    if (!sn)
        return;
    for (size_t i = 0; i < sn->nfiles; i++) {
        free((char *)sn->files[i].name);
        free((char *)sn->files[i].path);
    }
    free(sn->files);
    if (sn->dir) {
        remove_tree(sn->dir);
        free(sn->dir);
    }
    free(sn);
}

int cairn_store_snapshot(cairn_store *s, cairn_store_snap **out)
{
    *out = NULL;
    cairn_store_snap *sn = calloc(1, sizeof *sn);
    if (!sn)
        return CAIRN_ENOMEM;
    size_t len = strlen(s->datadir) + 64;
    sn->dir = malloc(len);
    char *workdb = malloc(len + 4);
    int rc = 0, err = 0;
    if (!sn->dir || !workdb) {
        rc = CAIRN_ENOMEM;
        goto out;
    }
    snprintf(sn->dir, len, "%s/" SNAP_PREFIX "%ld.%u", s->datadir, (long)getpid(),
             atomic_fetch_add(&s->snap_seq, 1));
    snprintf(workdb, len + 4, "%s/db", sn->dir);
    for (int attempt = 0; attempt < SNAP_ATTEMPTS; attempt++) {
        remove_tree(sn->dir);
        if (mkdir(sn->dir, 0700) != 0 || mkdir(workdb, 0700) != 0) {
            err = -errno;
            break;
        }
        if ((rc = freeze(s)))
            goto out;
        err = copy_db(s->dir, workdb);
        pthread_rwlock_unlock(&s->rw);
        if (err != -EAGAIN)
            break;
    }
    if (err == 0)
        err = list_copy(sn, workdb);
    if (err != 0) {
        cairn_store_log(s, CAIRN_STORE_LOG_ERROR, "snapshot of %s failed: %s", s->dir,
                        strerror(-err));
        rc = err == -ENOMEM ? CAIRN_ENOMEM : CAIRN_EIO;
    }
out:
    free(workdb);
    if (rc) {
        cairn_store_snap_free(sn);
        return rc;
    }
    *out = sn;
    return 0;
}

size_t cairn_store_snap_files(const cairn_store_snap *sn, const cairn_store_snap_file **files)
{
    *files = sn->files;
    return sn->nfiles;
}

uint64_t cairn_store_disk_bytes(cairn_store *s)
{
    /* every file of db/ but LevelDB's info log: its own estimate
     * (leveldb_approximate_sizes) leaves out the write-ahead log, so a
     * young store would weigh 0 bytes */
    DIR *d = opendir(s->dir);
    if (!d)
        return 0;
    uint64_t total = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (e->d_name[0] == '.' || strncmp(e->d_name, "LOG", 3) == 0)
            continue;
        if (fstatat(dirfd(d), e->d_name, &st, 0) == 0 && S_ISREG(st.st_mode))
            total += (uint64_t)st.st_size;
    }
    closedir(d);
    return total;
}
