/*
 * ferry-worker - the worker program, local or remote.
 *
 * Local: started by a loader (posix_spawn, with --slot and --parent); the
 * loader names the dataset in the handshake, so the command line only says
 * where to connect. Runs one session of the worker loop (core/worker.c) and
 * exits. It must never outlive its loader: PR_SET_PDEATHSIG kills it when
 * the parent goes, the getppid() check right after closes the race where
 * the parent died before prctl ran, and the worker loop checks again each
 * time it is idle. SIGINT is ignored: Ctrl-C in a terminal goes to the whole
 * process group, and it is the trainer's to handle.
 *
 * Remote (`--connect tcp://HOST:PORT`, no --slot): a daemon started by
 * whatever runs the host (docs/remote.md). It serves one loader after
 * another: after a session ends (the loader closed, refused it, or went
 * silent) it connects again, backing off while nothing answers. CURVE keys
 * (--key, --server-key) are required unless --insecure. `--processes N` runs
 * N such workers under one supervisor, which restarts any that dies and
 * passes SIGTERM on. SIGTERM or SIGINT: the current batch is finished, the
 * loader gets BYE (it requeues what this worker held), and the process
 * exits.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"
#include "keys.h"
#include "process.h"
#include "worker.h"

/* What the worker is doing, kept up to date by the worker loop so that a
 * crash inside dataset code can say which batch it was on. */
static char note[256] = "starting";
static char head[96]; /* "ferry-worker N (pid P): crashed while ", made at start */
static atomic_int stop_flag;

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

static void on_stop(int sig)
{
    (void)sig;
    atomic_store(&stop_flag, 1);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry-worker --connect ENDPOINT [options]\n"
               "  --connect ENDPOINT  the loader's endpoint (tcp://HOST:PORT for a remote worker)\n"
               "remote workers:\n"
               "  --key FILE          this worker's key pair (from ferry-keygen)\n"
               "  --server-key KEY    the loader's public key: a .pub file or 40 Z85 characters\n"
               "  --insecure          plain TCP without CURVE (trusted networks only)\n"
               "  --processes N       run N workers on this host (default 1)\n"
               "  --plugin-dir DIR    load dataset plugins from DIR only (default: none)\n"
               "  --once              serve one loader, then exit\n"
               "local workers (set by the loader that starts them):\n"
               "  --slot N            index the loader gave this worker\n"
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

/* Sleeps up to ms, waking early when told to stop. */
static void nap(unsigned ms)
{
    while (ms > 0 && !atomic_load(&stop_flag)) {
        unsigned step = ms < 50 ? ms : 50;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
    }
}

/* A remote worker's life: sessions, one loader after another. A session
 * that ran (the dataset opened) is followed by a quick reconnect; one that did not
 * (nobody there, refused, key not allowed) by a backoff that doubles up to
 * 8 s, with jitter so a rack of workers does not knock in step. */
static int serve(ferry__worker_opts *o, int once)
{
    unsigned backoff = 250;
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    while (!atomic_load(&stop_flag)) {
        int configured = 0;
        o->configured = &configured;
        int rc = ferry__worker_run(o);
        if (atomic_load(&stop_flag))
            break;
        if (rc == FERRY_OK && once)
            return 0;
        if (configured) {
            if (rc != FERRY_OK)
                fprintf(stderr, "ferry-worker (pid %d): session ended: %s; reconnecting\n",
                        (int)getpid(), ferry_last_error());
            backoff = 250;
            nap(100);
            continue;
        }
        fprintf(stderr, "ferry-worker (pid %d): %s; trying again in %u ms\n", (int)getpid(),
                ferry_last_error(), backoff);
        nap(backoff + (unsigned)rand() % (backoff / 4 + 1));
        if (backoff < 8000)
            backoff *= 2;
    }
    return 0;
}

/* --processes N: N children, each serving; one that dies is restarted
 * (after a second, so a crash loop does not spin); SIGTERM or SIGINT is
 * passed on and the children are waited for, killed after 10 s. */
static int supervise(long n, ferry__worker_opts *o, int once)
{
    pid_t *kids = calloc((size_t)n, sizeof *kids);
    if (!kids) {
        fprintf(stderr, "ferry-worker: out of memory\n");
        return 1;
    }
    pid_t me = getpid();
    for (;;) {
        for (long i = 0; i < n && !atomic_load(&stop_flag); i++) {
            if (kids[i])
                continue;
            pid_t pid = fork();
            if (pid < 0) {
                fprintf(stderr, "ferry-worker: fork: %s\n", strerror(errno));
                continue;
            }
            if (pid == 0) {
                prctl(PR_SET_PDEATHSIG, SIGTERM);
                if (getppid() != me)
                    _exit(0);
                snprintf(head, sizeof head, "ferry-worker (pid %d): crashed while ", (int)getpid());
                _exit(serve(o, once));
            }
            kids[i] = pid;
        }
        /* Polled, not a blocking wait(): a SIGTERM that lands between two
         * calls must not be missed. */
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) == 0 && !atomic_load(&stop_flag))
            nap(50);
        if (pid < 0 && errno == ECHILD)
            break;
        if (atomic_load(&stop_flag))
            break;
        for (long i = 0; i < n; i++) {
            if (pid > 0 && kids[i] == pid) {
                kids[i] = 0;
                if (once && WIFEXITED(status) && WEXITSTATUS(status) == 0)
                    kids[i] = -1; /* done */
                else {
                    char how[256];
                    ferry__describe_status(status, how, sizeof how);
                    fprintf(stderr, "ferry-worker: worker process %d %s; starting another\n",
                            (int)pid, how);
                    nap(1000);
                }
            }
        }
        int live = 0;
        for (long i = 0; i < n; i++)
            live += kids[i] != -1;
        if (!live)
            break;
    }
    for (long i = 0; i < n; i++) {
        if (kids[i] > 0)
            kill(kids[i], SIGTERM);
    }
    for (int t = 0; t < 200; t++) {
        int left = 0;
        for (long i = 0; i < n; i++) {
            if (kids[i] > 0 && waitpid(kids[i], NULL, WNOHANG) == 0)
                left++;
            else
                kids[i] = 0;
        }
        if (!left)
            break;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    for (long i = 0; i < n; i++) {
        if (kids[i] > 0) {
            kill(kids[i], SIGKILL);
            waitpid(kids[i], NULL, 0);
        }
    }
    free(kids);
    return 0;
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *key = NULL, *server_key = NULL, *plugin_dir = NULL;
    long slot = -1, parent = 0, processes = 1;
    int insecure = 0, once = 0;
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
        } else if (!strcmp(a, "--processes") && v && parse_int(v, 1, 1024, &processes) == 0) {
            i++;
        } else if (!strcmp(a, "--key") && v) {
            key = v;
            i++;
        } else if (!strcmp(a, "--server-key") && v) {
            server_key = v;
            i++;
        } else if (!strcmp(a, "--plugin-dir") && v) {
            plugin_dir = v;
            i++;
        } else if (!strcmp(a, "--insecure")) {
            insecure = 1;
        } else if (!strcmp(a, "--once")) {
            once = 1;
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
    int remote = slot < 0 && !parent;
    int tcp = strncmp(endpoint, "tcp://", 6) == 0;

    char pub[FERRY__Z85_KEY + 1], sec[FERRY__Z85_KEY + 1], srv[FERRY__Z85_KEY + 1];
    ferry__worker_opts o = {.endpoint = endpoint,
                            .slot = (int)slot,
                            .parent = (pid_t)parent,
                            .handshake_ms = remote ? 30000 : 60000,
                            .keep_plugins = 1,
                            .note = note,
                            .note_len = sizeof note,
                            .cancel = &stop_flag,
                            .plugin_dir = plugin_dir,
                            .confine_plugins = remote};
    if (tcp && !insecure) {
        if (!key || !server_key) {
            fprintf(stderr, "ferry-worker: tcp:// needs --key (this worker's key pair) and "
                            "--server-key (the loader's public key), or --insecure\n");
            return 2;
        }
        if (ferry__key_pair_load(key, pub, sec) != FERRY_OK ||
            ferry__key_public_load(server_key, srv) != FERRY_OK) {
            fprintf(stderr, "ferry-worker: %s\n", ferry_last_error());
            return 2;
        }
        o.public_key = pub;
        o.secret_key = sec;
        o.server_key = srv;
    } else if (tcp) {
        fprintf(stderr,
                "ferry-worker: WARNING: --insecure: this worker's connection to %s is "
                "neither authenticated nor encrypted\n",
                endpoint);
    }

    signal(SIGPIPE, SIG_IGN);
    snprintf(head, sizeof head, "ferry-worker %ld (pid %d): crashed while ", slot, (int)getpid());
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        sigaction(fatal[i], &sa, NULL);

    if (remote) {
        struct sigaction st;
        memset(&st, 0, sizeof st);
        st.sa_handler = on_stop;
        sigaction(SIGTERM, &st, NULL);
        sigaction(SIGINT, &st, NULL);
        int rc = processes > 1 ? supervise(processes, &o, once) : serve(&o, once);
        explicit_bzero(sec, sizeof sec);
        return rc;
    }

    signal(SIGINT, SIG_IGN);
    if (parent) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != (pid_t)parent)
            return 3; /* the loader is already gone */
    }
    o.cancel = NULL;
    int rc = ferry__worker_run(&o);
    if (rc != FERRY_OK) {
        fprintf(stderr, "ferry-worker %d (pid %d): %s\n", (int)slot, (int)getpid(),
                ferry_last_error());
        return 1;
    }
    return 0;
}
