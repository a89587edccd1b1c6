/*
 * Leases kept in the CRDT document. leases[id] is a map {ttl, deadline}
 * (store.h, DOCUMENT LAYOUT): grant, keepalive and revoke are changes, so
 * they replicate like writes, a keepalive on any node pushes the deadline
 * out for every node, and any node whose clock passes the deadline revokes
 * the lease with one change deleting the lease and all its keys. Two nodes
 * revoking the same lease concurrently both delete things the other deleted
 * too: the merge changes nothing visible and takes no revision.
 *
 * This file makes the changes (grant, keepalive, revoke, expiry) and reads
 * the lease table (lease_table.c), which is derived from applied changes
 * only. The only memory-only state is local_deadline, the two things etcd
 * keeps out of its log too:
 *
 *  - Keepalive coalescing. Writing every keepalive would turn a client's
 *    stream into a flood of replicated changes. A keepalive at time t sets
 *    local_deadline = t + TTL (what the client is promised, so this node
 *    never expires the lease early) and writes deadline = t + TTL into the
 *    document only when the stored deadline is more than TTL/2 behind it.
 *    Bound: two writes for one lease are more than TTL/2 apart in time, so a
 *    keepalive stream of any rate over T ms writes at most 1 + 2T/TTL_ms
 *    changes (etcd's clients renew every TTL/3: every second keepalive
 *    writes). A peer that only sees the document may expire the lease up to
 *    TTL/2 before this node would — within the slack of a partition anyway.
 *  - The restart rule. etcd does not persist remaining TTLs: on start (its
 *    lessor's Promote on becoming leader) every lease is refreshed to its
 *    full TTL plus one election timeout, and time spent down is forgotten
 *    (measured: a 10 s lease with 5 s left answers 10 s right after a
 *    restart). cairn follows it: open sets local_deadline = now + TTL +
 *    lease_restart_extend_ms for every recovered lease, without writing a
 *    change (a restart must not extend the lease on other nodes).
 *
 * A lease's effective deadline is max(deadline, local_deadline). The expiry
 * tick is O(1) while nothing is due (next_due) and O(leases) when it scans.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crdt/error.h"
#include "store/store_int.h"

static int commit(cairn_store *s)
{
    cairn_doc_observer obs;
    int rc = cairn_doc_commit(s->doc, NULL, cairn_store_observer(s, &obs));
    return rc ? rc : s->obs_rc;
}

/* Sets the lease map's fields; makes the map first when |make|. */
static int write_lease(cairn_store *s, int64_t id, int make, cairn_objid obj, int64_t ttl,
                       int64_t deadline)
{
    uint8_t k[8];
    cairn_lease_doc_key(k, id);
    if (!s->kvs_known)
        return CAIRN_ESTATE; /* a joined store before its genesis came */
    int rc = cairn_doc_begin(s->doc, cairn_store_now_ms(s));
    if (rc)
        return rc;
    cairn_value v = {.type = CAIRN_V_INT};
    if (make) {
        rc = cairn_doc_put_object(s->doc, &obj, s->leases, k, 8, CAIRN_OBJ_MAP);
        v.v.i = ttl;
        if (!rc)
            rc = cairn_doc_put(s->doc, obj, (const uint8_t *)LEASE_TTL_KEY, strlen(LEASE_TTL_KEY),
                               &v);
    }
    v.v.i = deadline;
    if (!rc)
        rc = cairn_doc_put(s->doc, obj, (const uint8_t *)LEASE_DEADLINE_KEY,
                           strlen(LEASE_DEADLINE_KEY), &v);
    if (rc) {
        cairn_doc_rollback(s->doc);
        return rc;
    }
    return commit(s);
}

static int kentry_cmp(const void *a, const void *b)
{
    const kentry *x = *(const kentry *const *)a, *y = *(const kentry *const *)b;
    return cairn_store_keycmp(kentry_key(x), x->key_len, kentry_key(y), y->key_len);
}

/* One change: every key attached to |l| (in key order: etcd's event order)
 * and leases[id] if it exists. The observer may free |l|. */
static int revoke_locked(cairn_store *s, lease_ent *l)
{
    kentry **ks = NULL;
    size_t n = 0;
    if (l->nkeys) {
        ks = malloc(l->nkeys * sizeof *ks);
        if (!ks)
            return CAIRN_ENOMEM;
        for (size_t i = 0; i < l->kcap; i++)
            if (l->keys[i])
                ks[n++] = l->keys[i];
        qsort(ks, n, sizeof *ks, kentry_cmp);
    }
    int live = l->live;
    uint8_t k[8];
    cairn_lease_doc_key(k, l->id);
    int rc = cairn_doc_begin(s->doc, cairn_store_now_ms(s));
    for (size_t i = 0; i < n && !rc; i++) {
        rc = cairn_doc_delete(s->doc, s->kvs, kentry_key(ks[i]), ks[i]->key_len);
        if (rc == CAIRN_ENOTFOUND)
            rc = 0;
    }
    if (!rc && live)
        rc = cairn_doc_delete(s->doc, s->leases, k, 8);
    free(ks);
    if (rc) {
        cairn_doc_rollback(s->doc);
        return rc;
    }
    return commit(s);
}

/* etcd's id generator (pkg/idutil): the low 16 bits of the member id, then
 * 40 bits of the time in ms and an 8-bit counter, incremented as one 48-bit
 * suffix; a lease id is that with the top bit cleared, never 0 and never
 * one in use. */
static int64_t next_id(cairn_store *s)
{
    lease_table *t = &s->lt;
    if (!t->next_gen)
        t->next_gen = (cairn_store_now_ms(s) & ((1ull << 40) - 1)) << 8;
    for (;;) {
        t->next_gen = (t->next_gen + 1) & ((1ull << 48) - 1);
        uint64_t v = ((s->member_id & 0xffffu) << 48 | t->next_gen) & ((1ull << 63) - 1);
        lease_ent *l = cairn_lease_find(t, (int64_t)v);
        if (v && !(l && l->live))
            return (int64_t)v;
    }
}

int cairn_store_lease_create_async(cairn_store *s, cairn_lease_grant_resp *resp, int64_t id,
                                   int64_t ttl, cairn_store_done_cb cb, void *arg)
{
    memset(resp, 0, sizeof *resp);
    /* etcd: > 9e9 s -> "too large lease TTL"; below the minimum (also 0 and
     * negative) -> raised to it, no error */
    if (ttl > CAIRN_LEASE_MAX_TTL)
        return CAIRN_ELEASETTLTOOLARGE;
    pthread_rwlock_wrlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    if (ttl < s->lt.min_ttl)
        ttl = s->lt.min_ttl;
    if (!rc && id == 0)
        id = next_id(s);
    lease_ent *l = rc ? NULL : cairn_lease_find(&s->lt, id);
    if (!rc && l && l->live)
        rc = CAIRN_ELEASEEXIST;
    cairn_objid none = {0, 0};
    if (!rc)
        rc = write_lease(s, id, 1, none, ttl, (int64_t)cairn_store_now_ms(s) + ttl * 1000);
    if (!rc) {
        /* filled before the completion is queued: it may run at once. A
         * grant takes no revision: the one everything before it made. */
        cairn_store_fill_header(s, &resp->header, s->rev);
        resp->id = id;
        resp->ttl = ttl;
        rc = cairn_store_enqueue_wait(s, cb, arg, NULL);
        if (rc)
            memset(resp, 0, sizeof *resp);
    }
    pthread_rwlock_unlock(&s->rw);
    return rc;
}

int cairn_store_lease_create(cairn_store *s, cairn_lease_grant_resp *resp, int64_t id, int64_t ttl)
{
    cairn_store_sync_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    int rc = cairn_store_lease_create_async(s, resp, id, ttl, cairn_store_sync_done, &w);
    if (!rc)
        rc = cairn_store_sync_wait_for(&w);
    if (rc)
        memset(resp, 0, sizeof *resp);
    return rc;
}

int cairn_store_lease_grant(cairn_store *s, int64_t id, int64_t ttl)
{
    cairn_lease_grant_resp r;
    if (id == 0)
        return CAIRN_EINVAL;
    return cairn_store_lease_create(s, &r, id, ttl);
}

int cairn_store_lease_revoke_async(cairn_store *s, cairn_header *h, int64_t id,
                                   cairn_store_done_cb cb, void *arg)
{
    memset(h, 0, sizeof *h);
    pthread_rwlock_wrlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    lease_ent *l = rc ? NULL : cairn_lease_find(&s->lt, id);
    if (!rc && !(l && l->live))
        rc = CAIRN_ELEASENOTFOUND;
    if (!rc)
        rc = revoke_locked(s, l);
    if (!rc) {
        cairn_store_fill_header(s, h, s->rev); /* before the completion can run */
        rc = cairn_store_enqueue_wait(s, cb, arg, NULL);
        if (rc)
            memset(h, 0, sizeof *h);
    }
    pthread_rwlock_unlock(&s->rw);
    return rc;
}

int cairn_store_lease_revoke(cairn_store *s, cairn_header *h, int64_t id)
{
    cairn_store_sync_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    int rc = cairn_store_lease_revoke_async(s, h, id, cairn_store_sync_done, &w);
    if (!rc)
        rc = cairn_store_sync_wait_for(&w);
    if (rc)
        memset(h, 0, sizeof *h);
    return rc;
}

int cairn_store_lease_keepalive(cairn_store *s, int64_t *ttl, int64_t id)
{
    *ttl = 0;
    /* Most keepalives write nothing (coalescing), so they run under the read
     * side beside reads and other keepalives (local_deadline is atomic);
     * one that must write takes the write side and decides again. */
    for (int wr = 0;; wr = 1) {
        if (wr)
            pthread_rwlock_wrlock(&s->rw);
        else
            pthread_rwlock_rdlock(&s->rw);
        int rc = cairn_store_failed_rc(s);
        int64_t now = (int64_t)cairn_store_now_ms(s);
        lease_ent *l = rc ? NULL : cairn_lease_find(&s->lt, id);
        /* etcd: renewing a lease that is unknown, or expired and waiting for
         * its revoke, is "requested lease not found" */
        if (!rc && !(l && l->live && cairn_lease_deadline(l) > now))
            rc = CAIRN_ELEASENOTFOUND;
        if (!rc) {
            int64_t ttl_ms = l->ttl * 1000, target = now + ttl_ms;
            int64_t granted = l->ttl;
            int need = !l->has_obj || target - l->deadline > ttl_ms / 2;
            if (need && !wr) {
                pthread_rwlock_unlock(&s->rw);
                continue;
            }
            atomic_store(&l->local_deadline, target);
            if (need)
                rc = write_lease(s, id, !l->has_obj, l->obj, granted, target);
            if (!rc)
                *ttl = granted; /* etcd: the granted TTL, not what remained */
        }
        pthread_rwlock_unlock(&s->rw);
        return rc;
    }
}

int cairn_store_lease_ttl(cairn_store *s, cairn_lease_ttl_resp *resp, int64_t id, int keys)
{
    memset(resp, 0, sizeof *resp);
    resp->id = id;
    pthread_rwlock_rdlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    lease_ent *l = rc ? NULL : cairn_lease_find(&s->lt, id);
    if (!rc && !(l && l->live)) {
        resp->ttl = -1; /* etcd: unknown lease: TTL -1, no error */
    } else if (!rc) {
        int64_t left = cairn_lease_deadline(l) - (int64_t)cairn_store_now_ms(s);
        resp->ttl = left > 0 ? left / 1000 : 0; /* etcd truncates */
        resp->granted_ttl = l->ttl;
        if (keys && l->nkeys) {
            size_t bytes = l->nkeys * sizeof(cairn_lease_key) + l->nkeys * sizeof(kentry *);
            for (size_t i = 0; i < l->kcap; i++)
                if (l->keys[i])
                    bytes += l->keys[i]->key_len;
            uint8_t *mem = malloc(bytes);
            if (!mem) {
                rc = CAIRN_ENOMEM;
            } else {
                kentry **ks = (kentry **)mem;
                size_t n = 0;
                for (size_t i = 0; i < l->kcap; i++)
                    if (l->keys[i])
                        ks[n++] = l->keys[i];
                qsort(ks, n, sizeof *ks, kentry_cmp);
                cairn_lease_key *out = (cairn_lease_key *)(mem + n * sizeof(kentry *));
                uint8_t *p = (uint8_t *)(out + n);
                for (size_t i = 0; i < n; i++) {
                    memcpy(p, kentry_key(ks[i]), ks[i]->key_len);
                    out[i].key = p;
                    out[i].key_len = ks[i]->key_len;
                    p += ks[i]->key_len;
                }
                resp->keys = out;
                resp->nkeys = n;
                resp->mem_ = mem;
            }
        }
    }
    pthread_rwlock_unlock(&s->rw);
    if (rc) {
        cairn_lease_ttl_resp_destroy(resp);
        return rc;
    }
    cairn_store_header(s, &resp->header);
    return 0;
}

void cairn_lease_ttl_resp_destroy(cairn_lease_ttl_resp *r)
{
    free(r->mem_);
    memset(r, 0, sizeof *r);
}

static int i64cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int cairn_store_lease_list(cairn_store *s, int64_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    pthread_rwlock_rdlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    lease_table *t = &s->lt;
    int64_t *v = rc || !t->n ? NULL : malloc(t->n * sizeof *v);
    size_t m = 0;
    if (!rc && t->n && !v)
        rc = CAIRN_ENOMEM;
    for (size_t i = 0; v && i < t->nb; i++)
        for (lease_ent *l = t->by_id[i]; l; l = l->next_id)
            if (l->live)
                v[m++] = l->id;
    pthread_rwlock_unlock(&s->rw);
    if (rc || !m) {
        free(v);
        return rc;
    }
    qsort(v, m, sizeof *v, i64cmp);
    *ids = v;
    *n = m;
    return 0;
}

int cairn_store_lease_expire(cairn_store *s, size_t *nrevoked, uint64_t now_ms)
{
    if (nrevoked)
        *nrevoked = 0;
    int64_t now = (int64_t)now_ms;
    lease_table *t = &s->lt;
    /* the common tick finds nothing due: decide that under the read side, so
     * a tick never stalls readers behind a writer-preferring lock */
    pthread_rwlock_rdlock(&s->rw);
    int rc = cairn_store_failed_rc(s);
    int idle = rc || (t->next_due && now < t->next_due);
    pthread_rwlock_unlock(&s->rw);
    if (idle)
        return rc;
    pthread_rwlock_wrlock(&s->rw);
    rc = cairn_store_failed_rc(s);
    if (rc || (t->next_due && now < t->next_due))
        goto out;
    /* collect first: each revoke's observer may free entries */
    int64_t due[CAIRN_LEASE_REVOKE_BATCH];
    size_t nd = 0;
    int64_t next = INT64_MAX;
    for (size_t i = 0; i < t->nb; i++) {
        for (lease_ent *l = t->by_id[i]; l; l = l->next_id) {
            int d = l->live ? cairn_lease_deadline(l) <= now : l->nkeys > 0;
            if (d && nd < CAIRN_LEASE_REVOKE_BATCH)
                due[nd++] = l->id;
            else if (d)
                next = 0; /* more than one batch is due: come back at once */
            else if (l->live && cairn_lease_deadline(l) < next)
                next = cairn_lease_deadline(l);
        }
    }
    t->next_due = next;
    for (size_t i = 0; i < nd && !rc; i++) {
        lease_ent *l = cairn_lease_find(t, due[i]);
        if (!l)
            continue;
        rc = revoke_locked(s, l);
        if (!rc && nrevoked)
            (*nrevoked)++;
    }
    /* return once the revokes are durable, as a revoke call does */
    cairn_store_sync_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    int waiting = !rc && nd && cairn_store_enqueue_wait(s, cairn_store_sync_done, &w, NULL) == 0;
    pthread_rwlock_unlock(&s->rw);
    return waiting ? cairn_store_sync_wait_for(&w) : rc;
out:
    pthread_rwlock_unlock(&s->rw);
    return rc;
}

static void *lease_main(void *arg)
{
    cairn_store *s = arg;
    pthread_mutex_lock(&s->lease_mu);
    while (!s->lease_stop) {
        pthread_mutex_unlock(&s->lease_mu);
        size_t n = 0;
        int rc = cairn_store_lease_expire(s, &n, cairn_store_now_ms(s));
        pthread_mutex_lock(&s->lease_mu);
        if (rc || n == CAIRN_LEASE_REVOKE_BATCH) {
            if (rc)
                break; /* the store failed: every later call would too */
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)s->lease_tick_ms % 1000 * 1000000L;
        until.tv_sec += s->lease_tick_ms / 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (!s->lease_stop)
            pthread_cond_timedwait(&s->lease_cv, &s->lease_mu, &until);
    }
    pthread_mutex_unlock(&s->lease_mu);
    return NULL;
}

int cairn_store_lease_thread_start(cairn_store *s, uint32_t tick_ms)
{
    s->lease_tick_ms = tick_ms;
    if (!tick_ms)
        return 0;
    if (pthread_create(&s->lease_thread, NULL, lease_main, s))
        return CAIRN_ENOMEM;
    s->lease_thread_started = 1;
    return 0;
}

void cairn_store_lease_thread_stop(cairn_store *s)
{
    if (!s->lease_thread_started)
        return;
    pthread_mutex_lock(&s->lease_mu);
    s->lease_stop = 1;
    pthread_cond_broadcast(&s->lease_cv);
    pthread_mutex_unlock(&s->lease_mu);
    pthread_join(s->lease_thread, NULL);
    s->lease_thread_started = 0;
}
