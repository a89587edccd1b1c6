/* Helpers shared by the Check suites that drive cairn_replica sessions
 * (static: each suite is its own binary). */
#ifndef CAIRN_TESTS_REPLICA_TEST_H
#define CAIRN_TESTS_REPLICA_TEST_H

#include <check.h>
#include <pthread.h>

#include "crdt/error.h"
#include "store/replica.h"

/* A receive's completion: set by on_done once what it carried is durable. */
typedef struct done_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, rc;
} done_wait;

static inline void on_done(void *arg, int rc)
{
    done_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    w->rc = rc;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Delivers |msg| to |to| and waits until what it carried is durable. */
static inline void replica_deliver(cairn_replica *to, const uint8_t *msg, size_t len)
{
    done_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    int rejected = -1;
    int rc = cairn_replica_receive(to, msg, len, &rejected, on_done, &w);
    ck_assert_msg(rc == 0, "receive: %s", cairn_strerror(rc));
    ck_assert_int_eq(rejected, 0);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    ck_assert_int_eq(w.rc, 0);
}

#endif
