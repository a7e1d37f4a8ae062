/*
 * worker_internal.h - the worker session's state, shared by the worker's
 * three files and nothing else:
 *   worker.c        the session loop: messages, idle time, the run
 *   worker_batch.c  building a batch in place (TASK -> BATCH or FAIL)
 *   worker_link.c   the connection: sending, waiting, heartbeats, TCP join
 * Calls run one way: worker.c -> worker_batch.c -> worker_link.c -> here.
 */
#ifndef FERRY_CORE_WORKER_INTERNAL_H
#define FERRY_CORE_WORKER_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <zmq.h>

#include "dataset.h"
#include "endpoint.h"
#include "protocol.h"
#include "retire.h"
#include "seal.h"
#include "worker.h"

/* How long the worker waits for a message before it looks at its parent. */
#define POLL_MS 200

typedef struct worker_session {
    const ferry__worker_opts *o;
    void *ctx;
    void *sock;
    /* Plain TCP: the loader's data port, once CONFIG named one; until the
     * loader is first heard there, joining is set. */
    char data_ep[FERRY__HOST_MAX + 16];
    int joining;
    /* Under CURVE: what seals and opens every message on the data
     * connection (seal.h), from the keys in CONFIG; NULL before that and on
     * plain TCP. Used under sock_mu. */
    ferry__seal *seal;
    /* The socket is shared with the heartbeat thread: whoever uses it holds
     * sock_mu (the mutex is also the memory barrier ZeroMQ asks for when a
     * socket changes threads). */
    pthread_mutex_t sock_mu;
    pthread_cond_t hb_cv;
    pthread_t hb_thread;
    int hb_live;
    int hb_stop;
    uint64_t hb_ms, dead_ms;
    uint64_t sent_ms;              /* last send, under sock_mu */
    uint64_t heard_ms;             /* last message from the loader */
    uint64_t task_ms;              /* when the last task was done */
    int trimmed;                   /* the heap was trimmed since that task */
    uint64_t parent_ms;            /* when should_quit last looked at the parent */
    char refusal[FERRY__TEXT_MAX]; /* why the dataset did not open here, for the log */
    ferry__dataset ds;
    int ds_open;
    uint64_t seed;
    uint64_t max_message; /* the loader's, from CONFIG: no payload frame may be larger */
    uint64_t *indices;
    size_t indices_cap;
    unsigned char *shm_base; /* the batch slots as mapped here (o->shm_fd), or NULL */
    size_t shm_len;
    unsigned char *shm_seen; /* per slot: mapped here in one go already */
    size_t shm_nseen;
    ferry_var_field var[FERRY_MAX_FIELDS]; /* what the dataset gave fields of variable shape */
    int has_var;                           /* the schema has such fields */
    ferry__retire retire;                  /* when to leave on its own (retire.h) */
    ferry__retire_reason retiring;         /* decided after the last task: leave now */
    ferry__msg out; /* replies are built here: keeps the 4 KiB+ struct off the stack */
    ferry__msg in;
} worker_session;

/* ---- worker_batch.c ---- */

/* Handles TASK: builds the batch in the shared memory the task names or
 * else in a new payload frame, and sends it, or says FAIL when it cannot. */
int ferry__worker_on_task(worker_session *w, zmq_msg_t *task_payload);

/* ---- worker_link.c ---- */

/* Sends w->out (and payload, when not NULL, as its frame). */
int ferry__worker_send(worker_session *w, zmq_msg_t *payload, int flags);
int ferry__worker_send_simple(worker_session *w, ferry__msg_type type);
int ferry__worker_send_fail(worker_session *w, uint64_t id, int code, uint64_t index,
                            const char *msg);
/* Waits at most ms for the loader's next message into w->in (*got 1) and
 * its frame into payload. */
int ferry__worker_wait(worker_session *w, int ms, zmq_msg_t *payload, int *got);
/* Whether the worker should go: its parent is gone, or it was told to. */
int ferry__worker_should_quit(worker_session *w);
int ferry__worker_start_heartbeats(worker_session *w, uint32_t ms, uint32_t liveness);
void ferry__worker_stop_heartbeats(worker_session *w);
int ferry__worker_heartbeat_if_due(worker_session *w);
/* Plain TCP: joins the loader's data port CONFIG named. */
int ferry__worker_join_data(worker_session *w, const ferry__config_msg *c);
int ferry__worker_setup_hello_socket(worker_session *w);
void ferry__worker_say_bye(worker_session *w);

#endif
