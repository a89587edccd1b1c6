/*
 * cairn's main(): parse etcd-style flags, open the store, serve until
 * SIGTERM or SIGINT, then shut down cleanly and exit 0.
 *
 * Signals are blocked in every thread (they inherit main's mask, set before
 * gRPC starts its own threads) and main waits for them with sigwait, so no
 * handler ever runs inside gRPC or the store.
 */
#include "server/server.h"

#include "crdt/error.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

/* How long calls in flight may take to finish after SIGTERM. */
#define SHUTDOWN_GRACE_MS 5000

/* gRPC's mutexes are abseil's. Debian builds abseil without NDEBUG, so
 * every lock and unlock also feeds abseil's lock-order graph (deadlock
 * detection, a debug aid: ~5% of the server's CPU under peak put, in
 * GraphCycles and its hashing). Switch it to abseil's release default,
 * kIgnore (0), before gRPC takes its first lock. Looked up at run time, so
 * an abseil with another inline namespace (or none) just leaves it on. */
static void absl_deadlock_detection_off(void)
{
    static const char *const names[] = {
        "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
        "_ZN4absl12lts_2022062329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
        "_ZN4absl29SetMutexDeadlockDetectionModeENS_15OnDeadlockCycleE",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void (*set_mode)(int);
        *(void **)&set_mode = dlsym(RTLD_DEFAULT, names[i]);
        if (set_mode) {
            set_mode(0); /* absl::OnDeadlockCycle::kIgnore */
            return;
        }
    }
}

int main(int argc, char **argv)
{
    absl_deadlock_detection_off();
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    cairn_config cfg;
    char err[16384];
    int rc = cairn_config_parse(&cfg, argc, argv, err, sizeof err);
    if (rc == CAIRN_CONFIG_HELP) {
        cairn_config_usage(stdout);
        cairn_config_destroy(&cfg);
        return 0;
    }
    if (rc == CAIRN_CONFIG_VERSION) {
        printf("cairn Version: %s\netcd API Version: %s\n", CAIRN_VERSION, CAIRN_ETCD_VERSION);
        cairn_config_destroy(&cfg);
        return 0;
    }
    if (rc < 0) {
        /* etcd: 2 for a command line its flag package refuses, 1 for
         * the checks after it */
        int code = cfg.usage_error ? 2 : 1;
        fprintf(stderr, "cairn: %s\n", err[0] ? err : cairn_strerror(rc));
        cairn_config_destroy(&cfg);
        return code;
    }
    cairn_log_set_level(cfg.log_level);
    for (size_t i = 0; i < cfg.nnotes; i++)
        cairn_log(cfg.notes[i].level, "%s", cfg.notes[i].text);

    cairn_server *srv;
    rc = cairn_server_new(&srv, &cfg, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "cairn: %s\n", err[0] ? err : cairn_strerror(rc));
        cairn_config_destroy(&cfg);
        return 1;
    }
    rc = cairn_server_start(srv);
    if (rc != 0) {
        fprintf(stderr, "cairn: cannot start: %s\n", cairn_strerror(rc));
        cairn_server_free(srv);
        cairn_config_destroy(&cfg);
        return 1;
    }
    int sig = 0;
    if (cairn_server_joining(srv)) {
        /* etcd: a new member serves clients once it caught up */
        rc = cairn_server_join_wait(srv, &sigs);
        if (rc < 0) {
            fprintf(stderr, "cairn: cannot start: %s\n", cairn_strerror(rc));
            cairn_server_free(srv);
            cairn_config_destroy(&cfg);
            return 1;
        }
        sig = rc;
    }
    if (!sig) {
        cairn_log(CAIRN_LOG_INFO,
                  "cairn %s: member %s, data dir %s, ready to serve client requests", CAIRN_VERSION,
                  cfg.name, cfg.data_dir);
        sigwait(&sigs, &sig);
    }
    cairn_log(CAIRN_LOG_INFO, "received %s, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    cairn_server_stop(srv, SHUTDOWN_GRACE_MS);
    cairn_server_free(srv);
    cairn_config_destroy(&cfg);
    cairn_log(CAIRN_LOG_INFO, "stopped");
    return 0;
}
