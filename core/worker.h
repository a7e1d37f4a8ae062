/*
 * worker.h - the worker loop: one loop for every placement.
 *
 * Position in the data flow: between the transport and the dataset. A worker
 * connects a DEALER socket to the loader, says HELLO, gets CONFIG (which
 * names the dataset), opens the dataset and says READY (with its length and
 * schema); then for each TASK it builds the batch straight into the message
 * it will send, or into the shared memory the TASK names (local process
 * workers), and replies BATCH, or FAIL when the dataset fails or the
 * batch would be larger than the loader's max_message; STOP ends the
 * session with BYE, REFUSE (another protocol version) at once.
 * Threads (inproc://), local processes (ipc://) and remote hosts (tcp://)
 * run this same function.
 *
 * Every wait is bounded: the loop polls with a timeout and checks, each time
 * round, whether it was told to stop and whether its parent process is
 * still there.
 */
#ifndef FERRY_CORE_WORKER_H
#define FERRY_CORE_WORKER_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

/* Task words (see task_word below): local worker i's word is the uint64 at
 * byte i * FERRY__TASK_WORD_BYTES of the memory the loader shares with its
 * workers (one cache line each). */
#define FERRY__TASK_WORD_BYTES 64

/* What a worker is doing, for a crash handler to print: kept up to date
 * with plain stores around each batch (no formatting on the batch's path);
 * the handler formats it (ferry__worker_note_format). */
typedef struct ferry__worker_note {
    volatile int state; /* FERRY__NOTE_STARTING, _IDLE or _BUILDING */
    volatile uint64_t seq, epoch, batch_in_epoch, first_index;
    volatile uint32_t count;
} ferry__worker_note;

enum { FERRY__NOTE_STARTING = 0, FERRY__NOTE_IDLE, FERRY__NOTE_BUILDING };

/* Writes note n as text ("building batch 7 (epoch 0, batch 7, 16 items
 * from index 112)", "idle", "starting") into out (cap bytes, NUL-ended,
 * cut short where it does not fit); returns its length. Async-signal-safe. */
size_t ferry__worker_note_format(const ferry__worker_note *n, char *out, size_t cap);

typedef struct ferry__worker_opts {
    const char *endpoint;
    int slot;                 /* the loader's index for a local worker, -1 otherwise */
    void *zctx;               /* a ZeroMQ context to share (threads), or NULL */
    pid_t parent;             /* exit when getppid() differs; 0: no check */
    const atomic_int *cancel; /* exit when it becomes non-zero; NULL: none */
    int handshake_ms;         /* give up when no CONFIG comes within this */
    int keep_plugins;         /* never unload a dataset plugin (every placement) */
    _Atomic uint64_t *task_word; /* if set: the id + 1 of the task being built, 0 between */
    int shm_fd;               /* > 0: the loader's batch slots (memfd), where a TASK names
                               * room in it; 0: every batch goes in a payload frame */
    struct ferry__shm *shm;   /* thread workers: the slots, written through the loader's
                               * own mapping (not a mapping of shm_fd of their own) */
    ferry__worker_note *note; /* if set, what the worker is doing, before each batch */
    /* Remote workers (tcp://). */
    const char *server_key; /* the loader's CURVE public key (Z85); NULL: plain TCP */
    const char *public_key; /* this worker's key pair (Z85), with server_key */
    const char *secret_key;
    const char *plugin_dir; /* plugins only from here, by file name; NULL: none at all */
    int confine_plugins;    /* apply plugin_dir (remote); 0: any path (local workers) */
    int *configured;        /* if set, becomes 1 once CONFIG came and the dataset opened */
} ferry__worker_opts;

/* Runs one session. Returns FERRY_OK after STOP, FERRY_ECLOSED when the
 * loader answered HELLO with STOP (it refused this worker or is closing),
 * FERRY_EVERSION when it answered REFUSE (it speaks another protocol
 * version; the detail names both), or a negative code when the loader went away or fell silent past
 * its heartbeat liveness, the handshake timed out, or a socket failed (with detail). When `cancel`
 * becomes set the worker says BYE and returns FERRY_ETIMEDOUT. Never exits the process.
 *
 * With a heartbeat interval in CONFIG the worker sends HEARTBEAT whenever it
 * has sent nothing for that long, from a second thread while the dataset is
 * busy, and gives the session up when the loader has been silent for
 * interval x liveness. */
int ferry__worker_run(const ferry__worker_opts *o);

#endif
