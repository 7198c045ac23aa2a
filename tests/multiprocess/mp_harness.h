/*
 * mp_harness.h — what the multi-process ledger tests share: starting ledger_worker (fork + exec, its
 * stdin and stdout on pipes), reading its one result line, ending it, a ledger name of the test's own
 * (name + pid, so that parallel CTest runs never share one), and CHECK, which counts failures (the
 * program's exit status is non-zero when any check failed).
 */
#ifndef GP_MP_HARNESS_H
#define GP_MP_HARNESS_H

#define _DEFAULT_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "provider/ledger.h"

static int mp_failures;

#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            mp_failures++;                                                                                     \
            fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);                                  \
            fprintf(stderr, __VA_ARGS__);                                                                      \
            fputc('\n', stderr);                                                                               \
        }                                                                                                      \
    } while (0)

typedef struct mp_worker {
    pid_t pid;
    int to_child, from_child;
    char line[256];
} mp_worker;

/* "t-<test>-<pid>": the ledger value (config `ledger:`); *shm gets its shm name. */
static inline void mp_ledger_name(const char *test, char value[48], char shm[GP_LEDGER_NAME_MAX])
{
    snprintf(value, 48, "t-%s-%d", test, (int)getpid());
    gp_ledger_shm_name(value, 0, NULL, shm);
    gp_ledger_unlink(shm);
}

/* Starts ledger_worker with argv (NULL-terminated, argv[0] ignored). */
static inline mp_worker mp_start(char *const argv[])
{
    int in[2], out[2];
    mp_worker w = {0};
    if (pipe(in) != 0 || pipe(out) != 0) {
        perror("pipe");
        exit(1);
    }
    w.pid = fork();
    if (w.pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        char *args[16];
        int n = 0;
        args[n++] = (char *)GP_LEDGER_WORKER;
        for (int i = 1; argv[i] != NULL && n < 15; i++)
            args[n++] = argv[i];
        args[n] = NULL;
        execv(GP_LEDGER_WORKER, args);
        perror("execv " GP_LEDGER_WORKER);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    w.to_child = in[1];
    w.from_child = out[0];
    return w;
}

/* Reads the worker's next line into w->line ("" at end of file). */
static inline const char *mp_read_line(mp_worker *w)
{
    size_t n = 0;
    char c;
    while (n < sizeof w->line - 1 && read(w->from_child, &c, 1) == 1 && c != '\n')
        w->line[n++] = c;
    w->line[n] = '\0';
    return w->line;
}

/* Closes the worker's stdin and waits for it; returns its exit status (128 + signal if killed). */
static inline int mp_finish(mp_worker *w)
{
    if (w->to_child >= 0)
        close(w->to_child);
    w->to_child = -1;
    int status = 0;
    waitpid(w->pid, &status, 0);
    close(w->from_child);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* Kills the worker with SIGKILL and reaps it; returns its exit status as mp_finish does. */
static inline int mp_kill(mp_worker *w)
{
    kill(w->pid, SIGKILL);
    return mp_finish(w);
}

/* The GPU-wide figures of tenant `name` in a locked view (0 if unknown). */
static inline uint64_t mp_tenant_held(gp_ledger *l, const char *name)
{
    static gp_ledger_view v;
    gp_ledger_view_read(l, &v, true);
    for (unsigned t = 0; t < v.num_tenants; t++)
        if (strcmp(v.tenants[t].name, name) == 0)
            return v.tenants[t].held;
    return 0;
}

#endif /* GP_MP_HARNESS_H */
