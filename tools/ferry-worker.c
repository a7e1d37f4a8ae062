/*
 * ferry-worker - the worker program.
 *
 * Started by a loader (posix_spawn, with --slot and --parent) for local
 * workers; the loader names the dataset in the handshake, so the command
 * line only says where to connect. Runs one session of the worker loop
 * (core/worker.c) and exits.
 *
 * Lifetime: the worker must never outlive its loader. PR_SET_PDEATHSIG
 * kills it when the parent goes; the getppid() check right after closes the
 * race where the parent died before prctl ran, and the worker loop checks
 * again each time it is idle. SIGINT is ignored: Ctrl-C in a terminal goes to
 * the whole process group, and it is the trainer's to handle (closing the
 * loader stops the workers in order).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "ferry.h"
#include "worker.h"

/* What the worker is doing, kept up to date by the worker loop so that a
 * crash inside dataset code can say which batch it was on. */
static char note[256] = "starting";
static char head[96]; /* "ferry-worker N (pid P): crashed while ", made at start */

/* Last words on a fatal signal: async-signal-safe writes only, then the
 * default action, so the loader still sees the real signal. */
static void on_fatal(int sig)
{
    if (write(2, head, strnlen(head, sizeof head)) < 0 ||
        write(2, note, strnlen(note, sizeof note)) < 0 || write(2, "\n", 1) < 0) {
        /* nothing more can be done */
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry-worker --connect ENDPOINT [--slot N] [--parent PID]\n"
               "  --connect ENDPOINT  the loader's endpoint (ipc://..., tcp://HOST:PORT)\n"
               "  --slot N            index the loader gave this worker (local workers)\n"
               "  --parent PID        exit when this process is no longer the parent\n");
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL;
    long slot = -1, parent = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("ferry-worker %s\n", ferry_version());
            return 0;
        } else if (!strcmp(a, "--connect") && v) {
            endpoint = v;
            i++;
        } else if (!strcmp(a, "--slot") && v && parse_int(v, 0, 65535, &slot) == 0) {
            i++;
        } else if (!strcmp(a, "--parent") && v && parse_int(v, 1, 1L << 30, &parent) == 0) {
            i++;
        } else {
            fprintf(stderr, "ferry-worker: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!endpoint) {
        fprintf(stderr, "ferry-worker: --connect is required\n");
        usage(stderr);
        return 2;
    }

    signal(SIGINT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    snprintf(head, sizeof head, "ferry-worker %ld (pid %d): crashed while ", slot, (int)getpid());
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        sigaction(fatal[i], &sa, NULL);
    if (parent) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != (pid_t)parent)
            return 3; /* the loader is already gone */
    }

    ferry__worker_opts o = {.endpoint = endpoint,
                            .slot = (int)slot,
                            .parent = (pid_t)parent,
                            .handshake_ms = 60000,
                            .keep_plugins = 1,
                            .note = note,
                            .note_len = sizeof note};
    int rc = ferry__worker_run(&o);
    if (rc != FERRY_OK) {
        fprintf(stderr, "ferry-worker %d (pid %d): %s\n", (int)slot, (int)getpid(),
                ferry_last_error());
        return 1;
    }
    return 0;
}
