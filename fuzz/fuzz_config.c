/*
 * The daemon's configuration: etcd-style flags, ETCD_* variables and the
 * YAML config file (libyaml). The input is NUL-separated tokens, then two
 * NULs, then a config file: a token "ETCD_..." goes to the environment, any
 * other to argv; the file is passed as --config-file when the tokens ask
 * for it with a token "@". Every input must give a verdict (run, help,
 * version or an error with a message), never a crash or a leak.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "crdt/error.h"
#include "server/server.h"

#define MAX_TOKENS 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16)
        return 0;
    const uint8_t *sep = NULL;
    for (size_t i = 0; i + 1 < size; i++)
        if (data[i] == 0 && data[i + 1] == 0) {
            sep = data + i;
            break;
        }
    size_t tlen = sep ? (size_t)(sep - data) : size;
    char *argv[MAX_TOKENS + 2], *envp[MAX_TOKENS + 1];
    int argc = 0, envc = 0;
    argv[argc++] = (char *)"cairn";
    char path[64] = "";
    int fd = -1;
    if (sep) {
        fd = memfd_create("cairn-config", 0);
        if (fd >= 0) {
            size_t rest = size - tlen - 2;
            if (write(fd, sep + 2, rest) == (ssize_t)rest)
                snprintf(path, sizeof path, "--config-file=/proc/self/fd/%d", fd);
        }
    }
    for (size_t off = 0; off < tlen && argc < MAX_TOKENS && envc < MAX_TOKENS;) {
        const char *t = (const char *)data + off;
        size_t len = strnlen(t, tlen - off);
        char *tok = strndup(t, len);
        if (!tok)
            break;
        if (strcmp(tok, "@") == 0 && path[0]) {
            argv[argc++] = path;
            free(tok);
        } else if (strncmp(tok, "ETCD_", 5) == 0)
            envp[envc++] = tok;
        else
            argv[argc++] = tok;
        off += len + 1;
    }
    argv[argc] = NULL;
    envp[envc] = NULL;
    cairn_config cfg;
    char err[512];
    int rc = cairn_config_parse_env(&cfg, argc, argv, envp, err, sizeof err);
    if (rc < 0 && rc != CAIRN_ENOMEM && err[0] == '\0')
        __builtin_trap(); /* every refusal says why */
    cairn_config_destroy(&cfg);
    for (int i = 1; i < argc; i++)
        if (argv[i] != path)
            free(argv[i]);
    for (int i = 0; i < envc; i++)
        free(envp[i]);
    if (fd >= 0)
        close(fd);
    return 0;
}
