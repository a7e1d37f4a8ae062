/*
 * worker.c - the worker loop (see worker.h).
 *
 * The batch is built in place: the worker sizes the payload frame from the
 * dataset's schema, lets the dataset write every field into it, and hands
 * the frame to ZeroMQ, so no byte of a batch is copied on this side.
 *
 * A local worker may instead be given room in the loader's batch slots
 * (TASK.shm_offset/shm_bytes, in the memfd of --shm-fd, or of a thread
 * worker's options): the fields
 * go there, the BATCH says shm and carries an empty payload frame, and the
 * trainer reads the slot itself, so a batch is never copied at all. The
 * slots are mapped once (and again only should the memory grow), and each
 * slot's pages in one call the first time this worker writes into it, so
 * a batch in steady state costs no mapping and no page fault.
 *
 * Field placement: every field starts at a 64-byte boundary counted from a
 * lead offset. The lead is chosen so the field lands 64-byte aligned in this
 * process's frame buffer; ZeroMQ gives the receiver's buffer the same
 * alignment in practice (same allocator, same header in front of the data),
 * so the loader can use the bytes where they are. The loader checks and
 * copies when that guess is wrong; nothing breaks either way.
 */
#include "worker.h"

#include <errno.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "clock.h"
#include "dataset.h"
#include "alloc.h"
#include "endpoint.h"
#include "error.h"
#include "retire.h"
#include "shm.h"
#include "zsock.h"

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

/* Every send goes through here: it holds the socket and notes the time. */
static int send_msg(worker_session *w, zmq_msg_t *payload, int flags)
{
    pthread_mutex_lock(&w->sock_mu);
    int rc = ferry__zsock_send(w->sock, NULL, w->seal, &w->out, payload, flags);
    if (rc == FERRY_OK)
        w->sent_ms = ferry__now_ms();
    pthread_mutex_unlock(&w->sock_mu);
    return rc;
}

/* The heartbeat thread: while the main thread is busy in dataset code, it
 * keeps the loader from taking this worker for dead. Its own message
 * struct, so it never touches the main thread's. */
static void *heartbeat_main(void *arg)
{
    worker_session *w = arg;
    ferry__msg hb;
    memset(&hb, 0, sizeof hb);
    hb.type = FERRY__MSG_HEARTBEAT;
    pthread_mutex_lock(&w->sock_mu);
    while (!w->hb_stop) {
        uint64_t now = ferry__now_ms();
        if (now - w->sent_ms >= w->hb_ms) {
            if (ferry__zsock_send(w->sock, NULL, w->seal, &hb, NULL, ZMQ_DONTWAIT) == FERRY_OK)
                w->sent_ms = now;
        }
        uint64_t due = w->sent_ms + w->hb_ms;
        struct timespec ts = ferry__deadline_ts(CLOCK_MONOTONIC, due > now ? due - now : w->hb_ms);
        pthread_cond_timedwait(&w->hb_cv, &w->sock_mu, &ts);
    }
    pthread_mutex_unlock(&w->sock_mu);
    return NULL;
}

static int start_heartbeats(worker_session *w, uint32_t ms, uint32_t liveness)
{
    if (w->hb_live || ms == 0)
        return FERRY_OK;
    w->hb_ms = ms;
    w->dead_ms = (uint64_t)ms * (liveness ? liveness : 1);
    int e = pthread_create(&w->hb_thread, NULL, heartbeat_main, w);
    if (e)
        return ferry__syserr(FERRY_ESYS, "starting the heartbeat thread", e);
    w->hb_live = 1;
    return FERRY_OK;
}

static void stop_heartbeats(worker_session *w)
{
    if (!w->hb_live)
        return;
    pthread_mutex_lock(&w->sock_mu);
    w->hb_stop = 1;
    pthread_cond_signal(&w->hb_cv);
    pthread_mutex_unlock(&w->sock_mu);
    pthread_join(w->hb_thread, NULL);
    w->hb_live = 0;
}

/* Whether to end the session: told to, or the loader that started this
 * process is gone. getppid is a system call and this is asked after every
 * message, so the parent is looked at at most once per POLL_MS (an orphan
 * notices within two idle polls; PR_SET_PDEATHSIG usually ends it first). */
static int should_quit(worker_session *w)
{
    if (w->o->cancel && atomic_load(w->o->cancel))
        return 1;
    if (!w->o->parent)
        return 0;
    uint64_t now = ferry__now_ms();
    if (now - w->parent_ms < POLL_MS)
        return 0;
    w->parent_ms = now;
    return getppid() != w->o->parent;
}

static int send_simple(worker_session *w, ferry__msg_type type)
{
    w->out.type = type;
    return send_msg(w, NULL, 0);
}

static int send_fail(worker_session *w, uint64_t id, int code, uint64_t index, const char *msg)
{
    memset(&w->out.u.fail, 0, sizeof w->out.u.fail);
    w->out.type = FERRY__MSG_FAIL;
    w->out.u.fail.id = id;
    w->out.u.fail.code = code < 0 ? code : FERRY_EBATCH;
    w->out.u.fail.index = index;
    snprintf(w->out.u.fail.message, sizeof w->out.u.fail.message, "%s", msg);
    return send_msg(w, NULL, 0);
}

/* Waits up to `ms` for a message. FERRY_OK with *got set when one came,
 * FERRY_ETIMEDOUT when told to quit. Malformed messages are dropped. */
static int wait_msg(worker_session *w, int ms, zmq_msg_t *payload, int *got)
{
    *got = 0;
    pthread_mutex_lock(&w->sock_mu);
    /* A task already queued is taken without polling: zmq_poll costs
     * system calls even when a message is waiting, and with several
     * credits there usually is one. */
    int n = 1, e = 0;
    ferry__zsock_opener sealed = {.seal = w->seal};
    const ferry__zsock_opener *open = w->seal ? &sealed : NULL;
    int rc = ferry__zsock_recv(w->sock, NULL, open, &w->in, payload, ZMQ_DONTWAIT);
    if (rc == FERRY_EAGAIN) {
        zmq_pollitem_t it = {.socket = w->sock, .events = ZMQ_POLLIN};
        n = zmq_poll(&it, 1, ms);
        e = errno;
        rc = n > 0 ? ferry__zsock_recv(w->sock, NULL, open, &w->in, payload, ZMQ_DONTWAIT)
                   : FERRY_OK;
    }
    pthread_mutex_unlock(&w->sock_mu);
    if (n < 0) {
        if (e == EINTR)
            return FERRY_OK;
        return ferry__seterr(FERRY_ESYS, "zmq_poll: %s", zmq_strerror(e));
    }
    if (n == 0)
        return should_quit(w) ? ferry__seterr(FERRY_ETIMEDOUT, "worker told to quit") : FERRY_OK;
    /* On a sealed connection, a message that does not open means the
     * stream can no longer be trusted (a task may have been lost): the
     * session ends, and the loader requeues what it had sent here. The
     * detail is copied out first: ferry_last_error() is the very buffer
     * the new message is written into, so formatting from it in place
     * wrote the prefix over the detail before reading it (issue 36.4). */
    if (rc == FERRY_EPROTO && open) {
        char why[FERRY__ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", ferry_last_error());
        return ferry__seterr(FERRY_EPROTO, "the loader's data connection %s: %s", w->data_ep, why);
    }
    if (rc == FERRY_EPROTO) {
        fprintf(stderr, "ferry-worker: dropped a malformed message: %s\n", ferry_last_error());
        return FERRY_OK;
    }
    if (rc == FERRY_EAGAIN)
        return FERRY_OK;
    if (rc != FERRY_OK)
        return rc;
    *got = 1;
    w->joining = 0;
    w->heard_ms = ferry__now_ms();
    return FERRY_OK;
}

/* A remote worker loads plugins only from its own plugin_dir, and only by
 * file name: the network never names a path to dlopen. Writes the spec to
 * open into out. */
static int confine_plugin(const ferry__worker_opts *o, const char *spec, char *out, size_t cap,
                          char *err, size_t errcap)
{
    if (!o->confine_plugins || strncmp(spec, "plugin:", 7) != 0) {
        snprintf(out, cap, "%s", spec);
        return FERRY_OK;
    }
    const char *name = spec + 7;
    size_t len = strcspn(name, "?");
    if (!o->plugin_dir || !o->plugin_dir[0]) {
        snprintf(err, errcap, "this worker loads no plugins (start it with --plugin-dir DIR)");
        return FERRY_EDATASET;
    }
    if (len == 0 || memchr(name, '/', len) || (len == 1 && name[0] == '.') ||
        (len == 2 && name[0] == '.' && name[1] == '.')) {
        snprintf(err, errcap, "plugin '%.*s' must be a file name in this worker's plugin directory",
                 (int)len, name);
        return FERRY_EDATASET;
    }
    int n = snprintf(out, cap, "plugin:%s/%s", o->plugin_dir, name);
    if (n < 0 || (size_t)n >= cap) {
        snprintf(err, errcap, "plugin path is too long");
        return FERRY_EDATASET;
    }
    return FERRY_OK;
}

/* Handles CONFIG: opens the dataset and answers READY with its length and
 * schema (or with the error when it does not open; the loader decides what
 * happens next). */
static int on_config(worker_session *w)
{
    const ferry__config_msg *c = &w->in.u.config;
    ferry_dataset_ctx ctx = {
        .seed = c->seed, .worker_index = c->worker_index, .num_workers = c->num_workers};
    char err[FERRY__TEXT_MAX] = "";
    w->seed = c->seed;
    w->max_message = c->max_message;
    int rc = ferry__retire_set(&w->retire, c->retire_rss, c->retire_batches);
    if (rc != FERRY_OK)
        return rc;

    if (w->ds_open) {
        ferry__dataset_close(&w->ds);
        w->ds_open = 0;
    }
    rc = start_heartbeats(w, c->heartbeat_ms, c->liveness);
    if (rc != FERRY_OK)
        return rc;
    char spec[FERRY__SPEC_MAX + PATH_MAX];
    rc = confine_plugin(w->o, c->dataset, spec, sizeof spec, err, sizeof err);
    memset(&w->out.u.ready, 0, sizeof w->out.u.ready);
    if (rc == FERRY_OK)
        rc = ferry__dataset_open_flags(&w->ds, spec, &ctx,
                                       w->o->keep_plugins ? FERRY__DATASET_KEEP_LOADED : 0, err,
                                       sizeof err);
    if (rc == FERRY_OK) {
        w->ds_open = 1;
        w->has_var = 0;
        for (int f = 0; f < w->ds.schema.nfields; f++)
            w->has_var |= w->ds.schema.fields[f].ndim == FERRY_NDIM_VAR;
        w->out.u.ready.length = w->ds.length;
        ferry__dataset_wire_schema(&w->ds, &w->out.u.ready.schema);
    } else {
        w->out.u.ready.code = rc;
        snprintf(w->out.u.ready.error, sizeof w->out.u.ready.error, "%s",
                 err[0] ? err : ferry_strerror(rc));
        snprintf(w->refusal, sizeof w->refusal, "could not open dataset '%s': %s", c->dataset,
                 w->out.u.ready.error);
    }
    w->out.type = FERRY__MSG_READY;
    return send_msg(w, NULL, 0);
}

/* The bytes of a batch of `count` items laid out from a 64-byte boundary:
 * every field rounded up to FERRY__FIELD_ALIGN. item_bytes is at most
 * 1 GiB and count at most FERRY__MAX_BATCH, so nothing overflows. */
static size_t fields_bytes(const worker_session *w, uint32_t count)
{
    size_t total = 0;
    for (int f = 0; f < w->ds.schema.nfields; f++)
        total += FERRY__ROUND_UP(w->ds.item_bytes[f] * count, FERRY__FIELD_ALIGN);
    return total;
}

/* The size of the payload frame for a batch of `count` items: room for the
 * lead, then the fields. */
static size_t payload_bytes(const worker_session *w, uint32_t count)
{
    return FERRY__FIELD_ALIGN + fields_bytes(w, count);
}

/* How far from base the first 64-byte boundary is. */
static size_t lead_of(const void *base)
{
    return (FERRY__FIELD_ALIGN - (uintptr_t)base % FERRY__FIELD_ALIGN) % FERRY__FIELD_ALIGN;
}

/* Fills the BATCH header for task t with its fields laid out in the bytes
 * at base: every field starts 64-byte aligned in this process's memory (see
 * the top of this file). dst[f] is where the dataset writes field f. */
static void lay_out_fields(worker_session *w, const ferry__task *t, unsigned char *base, void **dst)
{
    const ferry_dataset_schema *s = &w->ds.schema;
    size_t off = lead_of(base);
    ferry__batch_hdr *h = &w->out.u.batch;
    memset(h, 0, sizeof *h);
    h->id = t->id;
    h->count = t->count;
    h->nfields = (uint32_t)s->nfields;
    for (int f = 0; f < s->nfields; f++) {
        ferry__field_desc *d = &h->fields[f];
        memcpy(d->name, s->fields[f].name, FERRY_NAME_MAX);
        d->dtype = s->fields[f].dtype;
        if (s->fields[f].ndim == FERRY_NDIM_VAR) { /* placed once filled: place_var */
            d->var = 1;
            memset(&w->var[f], 0, sizeof w->var[f]);
            dst[f] = &w->var[f];
            continue;
        }
        d->ndim = s->fields[f].ndim + 1;
        d->shape[0] = t->count;
        memcpy(&d->shape[1], s->fields[f].shape, sizeof(int64_t) * (size_t)s->fields[f].ndim);
        d->offset = off;
        d->nbytes = w->ds.item_bytes[f] * t->count;
        dst[f] = base + off;
        off += FERRY__ROUND_UP(d->nbytes, FERRY__FIELD_ALIGN);
    }
}

/* A batch too big for the loader's max_message: ZeroMQ would drop it and
 * this worker's connection without a word, and the trainer would wait
 * forever. FAIL (FERRY_ELIMIT: no index is to blame) says instead what is
 * wrong and what to change. */
static int fail_too_big(worker_session *w, const ferry__task *t, size_t bytes)
{
    char msg[256];
    snprintf(msg, sizeof msg,
             "its %u items make %zu bytes, more than the loader's max_message %llu; raise "
             "max_message or lower batch_size",
             t->count, bytes, (unsigned long long)w->max_message);
    return send_fail(w, t->id, FERRY_ELIMIT, w->indices[0], msg);
}

/* The shapes and sizes of the fields of variable shape, as the dataset
 * filled them, into the BATCH header; *total is the bytes they take, each
 * from a 64-byte boundary. FERRY_EBATCH with why said when the dataset
 * gave something no batch may hold. */
static int var_sizes(worker_session *w, size_t *total, char *why, size_t cap)
{
    const ferry_dataset_schema *s = &w->ds.schema;
    ferry__batch_hdr *h = &w->out.u.batch;
    *total = 0;
    for (int f = 0; f < s->nfields; f++) {
        if (!h->fields[f].var)
            continue;
        const ferry_var_field *v = &w->var[f];
        ferry__field_desc *d = &h->fields[f];
        size_t n = 0;
        int ok = v->data != NULL && v->ndim >= 1 && v->ndim <= FERRY_MAX_DIMS;
        for (int k = 0; ok && k < v->ndim; k++)
            ok = v->shape[k] >= 1;
        if (ok)
            ok = ferry__shape_bytes(ferry_dtype_size(d->dtype), v->shape, v->ndim, &n) == 0 &&
                 n <= SIZE_MAX / 2;
        if (!ok) {
            snprintf(why, cap,
                     "field '%s' of variable shape: the dataset gave %s (%d dims; 1..%d dims, "
                     "each >= 1, are allowed)",
                     d->name, v->data ? "a shape no batch can hold" : "no data", v->ndim,
                     FERRY_MAX_DIMS);
            return FERRY_EBATCH;
        }
        d->ndim = v->ndim;
        memcpy(d->shape, v->shape, sizeof d->shape[0] * (size_t)v->ndim);
        d->nbytes = n;
        *total += FERRY__ROUND_UP(n, FERRY__FIELD_ALIGN);
        if (*total > SIZE_MAX / 2) {
            snprintf(why, cap, "the fields of variable shape add up to more than memory holds");
            return FERRY_EBATCH;
        }
    }
    return FERRY_OK;
}

/* Copies the fields of variable shape in after the fixed ones: into the
 * room the batch was built in when they fit there, else into a new payload
 * frame that takes the fixed fields too (the batch then goes by message).
 * `base` is where the fixed fields were laid out (room, or *payload's
 * data), `cap` its size. 1 when the batch is ready to send; 0 when FAIL
 * was answered instead, *rc saying how sending it went. */
static int place_var(worker_session *w, const ferry__task *t, unsigned char *base, size_t cap,
                     zmq_msg_t *payload, int *rc)
{
    char why[256];
    size_t var_total;
    *rc = var_sizes(w, &var_total, why, sizeof why);
    if (*rc != FERRY_OK) {
        *rc = send_fail(w, t->id, *rc, w->indices[0], why);
        return 0;
    }
    ferry__batch_hdr *h = &w->out.u.batch;
    size_t lead = lead_of(base), fixed = fields_bytes(w, t->count);
    size_t end = lead + fixed;
    if (var_total > cap - end) {
        size_t bytes = FERRY__FIELD_ALIGN + fixed + var_total;
        zmq_msg_t bigger;
        if (bytes > w->max_message) {
            *rc = fail_too_big(w, t, bytes);
            return 0;
        }
        if (zmq_msg_init_size(&bigger, bytes) != 0) {
            *rc = send_fail(w, t->id, FERRY_ENOMEM, w->indices[0],
                            "worker out of memory for batch");
            return 0;
        }
        unsigned char *nb = zmq_msg_data(&bigger);
        size_t nlead = lead_of(nb);
        memcpy(nb + nlead, base + lead, fixed);
        for (uint32_t f = 0; f < h->nfields; f++)
            if (!h->fields[f].var)
                h->fields[f].offset = h->fields[f].offset - lead + nlead;
        zmq_msg_move(payload, &bigger); /* releases what payload held */
        zmq_msg_close(&bigger);
        h->shm = 0;
        base = nb;
        end = nlead + fixed;
    }
    for (uint32_t f = 0; f < h->nfields; f++) {
        ferry__field_desc *d = &h->fields[f];
        if (!d->var)
            continue;
        d->offset = end;
        memcpy(base + end, w->var[f].data, d->nbytes);
        end += FERRY__ROUND_UP(d->nbytes, FERRY__FIELD_ALIGN);
    }
    return 1;
}

/* Makes the payload frame for task t (`total` bytes, from payload_bytes)
 * and lays the fields out in it. FERRY_ENOMEM when the frame cannot be
 * had. */
static int lay_out_batch(worker_session *w, const ferry__task *t, size_t total, zmq_msg_t *payload,
                         void **dst)
{
    if (zmq_msg_init_size(payload, total) != 0)
        return FERRY_ENOMEM;
    lay_out_fields(w, t, zmq_msg_data(payload), dst);
    return FERRY_OK;
}

/* The first time this worker is given room in slot number k (the room's
 * offset over its size), the pages of the batch's fixed fields are
 * allocated and mapped in one call rather than faulted in one by one as
 * the batch is written (the loader leaves a slot's memory to the worker
 * that first writes into it). Fields of variable shape are faulted in as
 * they are written: their reserve may be far larger than what a batch
 * puts there (a stream's byte field reserves 64 MiB), and populating it
 * would allocate and zero all of it. 0, or -1 when the memory is not
 * there: that batch goes by message, and the room is tried again next
 * time. A kernel without MADV_POPULATE_WRITE (before 5.14) faults the
 * pages in as they are written. */
static int populate_room(worker_session *w, const ferry__task *t, unsigned char *room)
{
#ifdef MADV_POPULATE_WRITE
    if (t->shm_offset % t->shm_bytes)
        return 0;
    uint64_t k = t->shm_offset / t->shm_bytes;
    if (k >= w->shm_nseen) {
        size_t n = (size_t)(w->shm_len / t->shm_bytes) + 1;
        unsigned char *seen = realloc(w->shm_seen, n);
        if (!seen || k >= n)
            return 0;
        memset(seen + w->shm_nseen, 0, n - w->shm_nseen);
        w->shm_seen = seen;
        w->shm_nseen = n;
    }
    if (w->shm_seen[k])
        return 0;
    size_t n = payload_bytes(w, t->count);
    if (n > t->shm_bytes)
        n = (size_t)t->shm_bytes;
    if (madvise(room, n, MADV_POPULATE_WRITE) != 0 && errno != EINVAL)
        return -1;
    w->shm_seen[k] = 1;
#else
    (void)w;
    (void)t;
    (void)room;
#endif
    return 0;
}

/* Where task t's batch goes in the shared batch slots, or NULL when it
 * goes in a payload frame: the task names no room, this worker has no
 * slots, or the room is too small for the batch. The slots are mapped
 * whole the first time a task names room in them, and again only when a
 * task names room past what is mapped (the loader grew the memory); each
 * room's pages are mapped the first time it is given (populate_room). */
static unsigned char *shm_room(worker_session *w, const ferry__task *t)
{
    int fd = w->o->shm_fd;
    if (fd <= 0 || t->shm_bytes == 0)
        return NULL;
    uint64_t end = t->shm_offset + t->shm_bytes; /* each below 2^63: no wrap */
    if (end > w->shm_len && w->o->shm) {
        /* A thread: the loader's mapping, sized before any task names room
         * in it (the task came after, through the loader's socket). */
        size_t len;
        unsigned char *base = ferry__shm_mapping(w->o->shm, &len);
        if (!base || len < end)
            return NULL;
        w->shm_base = base;
        w->shm_len = len;
    } else if (end > w->shm_len) {
        struct stat st;
        if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < end)
            return NULL;
        if (w->shm_base)
            munmap(w->shm_base, w->shm_len);
        w->shm_base = NULL;
        w->shm_len = 0;
        /* A new mapping: no room is mapped in it yet. */
        free(w->shm_seen);
        w->shm_seen = NULL;
        w->shm_nseen = 0;
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "ferry-worker: mapping the batch slots: %s; batches go by message\n",
                    strerror(errno));
            return NULL;
        }
        w->shm_base = m;
        w->shm_len = (size_t)st.st_size;
    }
    unsigned char *room = w->shm_base + t->shm_offset;
    if (lead_of(room) + fields_bytes(w, t->count) > t->shm_bytes)
        return NULL;
    return populate_room(w, t, room) == 0 ? room : NULL;
}

/* The task's indices, out of its payload into w->indices. FERRY_ENOMEM
 * when there is no room for them. */
static int take_indices(worker_session *w, const ferry__task *t, zmq_msg_t *task_payload)
{
    if (t->count > w->indices_cap) {
        uint64_t *p = ferry__realloc(w->indices, t->count * sizeof *p);
        if (!p)
            return FERRY_ENOMEM;
        w->indices = p;
        w->indices_cap = t->count;
    }
    ferry__indices_unpack(zmq_msg_data(task_payload), t->count, w->indices);
    return FERRY_OK;
}

/* Appends text, or the decimal digits of v, to out[*len] within cap. */
static void note_put(char *out, size_t cap, size_t *len, const char *text)
{
    while (*text && *len + 1 < cap)
        out[(*len)++] = *text++;
}

static void note_put_u64(char *out, size_t cap, size_t *len, uint64_t v)
{
    char digits[21];
    int n = 0;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0 && *len + 1 < cap)
        out[(*len)++] = digits[--n];
}

size_t ferry__worker_note_format(const ferry__worker_note *n, char *out, size_t cap)
{
    size_t len = 0;
    if (!cap)
        return 0;
    switch (n->state) {
    case FERRY__NOTE_BUILDING:
        note_put(out, cap, &len, "building batch ");
        note_put_u64(out, cap, &len, n->seq);
        note_put(out, cap, &len, " (epoch ");
        note_put_u64(out, cap, &len, n->epoch);
        note_put(out, cap, &len, ", batch ");
        note_put_u64(out, cap, &len, n->batch_in_epoch);
        note_put(out, cap, &len, ", ");
        note_put_u64(out, cap, &len, n->count);
        note_put(out, cap, &len, " items from index ");
        note_put_u64(out, cap, &len, n->first_index);
        note_put(out, cap, &len, ")");
        break;
    case FERRY__NOTE_IDLE:
        note_put(out, cap, &len, "idle");
        break;
    default:
        note_put(out, cap, &len, "starting");
    }
    out[len] = '\0';
    return len;
}

/* Has the dataset fill dst[] with task t's items; the note says meanwhile
 * which batch this worker is on, for a crash handler. */
static int fill_batch(worker_session *w, const ferry__task *t, void **dst,
                      ferry_dataset_error *derr)
{
    ferry_batch_request req = {.epoch = t->epoch,
                               .batch_in_epoch = t->batch_in_epoch,
                               .seq = t->seq,
                               .seed = w->seed,
                               .indices = w->indices,
                               .count = t->count};
    /* Said before the dataset runs: if it kills this process, the loader
     * reads here which task did it. */
    if (w->o->task_word)
        atomic_store_explicit(w->o->task_word, t->id + 1, memory_order_release);
    ferry__worker_note *note = w->o->note;
    if (note) {
        note->seq = t->seq;
        note->epoch = t->epoch;
        note->batch_in_epoch = t->batch_in_epoch;
        note->count = t->count;
        note->first_index = w->indices[0];
        note->state = FERRY__NOTE_BUILDING;
    }
    memset(derr, 0, sizeof *derr);
    int rc = ferry__dataset_get_batch(&w->ds, &req, dst, derr);
    if (w->o->task_word)
        atomic_store_explicit(w->o->task_word, 0, memory_order_release);
    if (note)
        note->state = FERRY__NOTE_IDLE;
    return rc;
}

/* Handles TASK: builds the batch in the shared memory the task names or
 * else in a new payload frame, and sends it, or says FAIL when it cannot. */
static int on_task(worker_session *w, zmq_msg_t *task_payload)
{
    const ferry__task t = w->in.u.task;
    uint64_t t0 = ferry__now_ns();
    if (!w->ds_open)
        return send_fail(w, t.id, FERRY_EDATASET, 0, "worker has no open dataset");
    if (take_indices(w, &t, task_payload) != FERRY_OK)
        return send_fail(w, t.id, FERRY_ENOMEM, 0, "worker out of memory for indices");
    zmq_msg_t payload;
    void *dst[FERRY_MAX_FIELDS];
    unsigned char *room = shm_room(w, &t);
    if (room) {
        lay_out_fields(w, &t, room, dst);
        w->out.u.batch.shm = 1;
        zmq_msg_init(&payload); /* BATCH's frame, empty */
    } else {
        size_t bytes = payload_bytes(w, t.count);
        if (bytes > w->max_message)
            return fail_too_big(w, &t, bytes);
        if (lay_out_batch(w, &t, bytes, &payload, dst) != FERRY_OK)
            return send_fail(w, t.id, FERRY_ENOMEM, w->indices[0],
                             "worker out of memory for batch");
    }
    ferry_dataset_error derr;
    int rc = fill_batch(w, &t, dst, &derr);
    if (rc != FERRY_OK) {
        zmq_msg_close(&payload);
        return send_fail(w, t.id, rc, derr.index, derr.message);
    }
    if (w->has_var) {
        /* A message frame was sized for the fixed fields only: a frame
         * reserving room for the variable ones would send that room too
         * (a remote worker's bandwidth), so place_var makes a new one. */
        unsigned char *base = room ? room : zmq_msg_data(&payload);
        size_t cap = room ? (size_t)t.shm_bytes : zmq_msg_size(&payload);
        if (!place_var(w, &t, base, cap, &payload, &rc)) {
            zmq_msg_close(&payload);
            return rc;
        }
    }
    w->out.type = FERRY__MSG_BATCH;
    w->out.u.batch.make_ns = ferry__now_ns() - t0;
    rc = send_msg(w, &payload, 0);
    if (rc != FERRY_OK)
        zmq_msg_close(&payload);
    return rc;
}

/* A DEALER for endpoint: limits, then for tcp:// ZeroMQ's heartbeats (a
 * dead connection is closed and redialled) and a reconnect interval that
 * backs off to 2 s. */
static int setup_socket(void *sock, const char *endpoint)
{
    /* A TASK is at most a header and FERRY__MAX_BATCH indices. */
    int rc = ferry__socket_setup(sock, FERRY__HDR_MAX + (int64_t)FERRY__MAX_BATCH * 8);
    if (rc != FERRY_OK || strncmp(endpoint, "tcp://", 6) != 0)
        return rc;
    rc = ferry__sockopt_int(sock, ZMQ_HEARTBEAT_IVL, 1000, "ZMQ_HEARTBEAT_IVL");
    if (rc == FERRY_OK)
        rc = ferry__sockopt_int(sock, ZMQ_HEARTBEAT_TIMEOUT, 5000, "ZMQ_HEARTBEAT_TIMEOUT");
    if (rc == FERRY_OK) /* redial backs off to 2 s */
        rc = ferry__sockopt_int(sock, ZMQ_RECONNECT_IVL_MAX, 2000, "ZMQ_RECONNECT_IVL_MAX");
    return rc;
}

/* The loader's endpoint with another port: the host is the one this
 * worker reached, whatever address the loader bound. */
static int with_port(const char *endpoint, uint32_t port, char *out, size_t cap)
{
    const char *colon = strrchr(endpoint, ':');
    if (strncmp(endpoint, "tcp://", 6) != 0 || !colon || colon < endpoint + 6)
        return ferry__seterr(FERRY_EPROTO, "CONFIG names a data port, but %s is not tcp://HOST:PORT",
                             endpoint);
    int n = snprintf(out, cap, "%.*s:%u", (int)(colon - endpoint), endpoint, (unsigned)port);
    if (n < 0 || (size_t)n >= cap)
        return ferry__seterr(FERRY_ELIMIT, "the loader's endpoint %s is too long", endpoint);
    return FERRY_OK;
}

/* CONFIG admitted this worker and named the port and token of its data
 * connection. The session moves there (a new DEALER, PLAIN with the token
 * as password) and says so with a HEARTBEAT, so the loader binds it before
 * the dataset is even open; the HELLO connection, which takes nothing
 * larger than a header, is closed. Under CURVE, CONFIG also brought the
 * session's keys, and everything on the data connection is sealed with
 * them; a loader that would have a CURVE worker go on unsealed is refused. */
static int join_data(worker_session *w, const ferry__config_msg *c)
{
    if (w->o->server_key && !c->seal[0])
        return ferry__seterr(FERRY_EPROTO,
                             "the loader at %s would have this CURVE worker send its batches "
                             "unencrypted (CONFIG brought no session keys): refused",
                             w->o->endpoint);
    int rc = with_port(w->o->endpoint, c->data_port, w->data_ep, sizeof w->data_ep);
    if (rc != FERRY_OK)
        return rc;
    ferry__seal *seal = NULL;
    if (c->seal[0] && (rc = ferry__seal_new(&seal, c->seal, FERRY__SEAL_WORKER)) != FERRY_OK)
        return rc;
    void *s = zmq_socket(w->ctx, ZMQ_DEALER);
    if (!s) {
        ferry__seal_free(seal);
        return ferry__syserr(FERRY_ESYS, "zmq_socket", errno);
    }
    rc = setup_socket(s, w->data_ep);
    if (rc == FERRY_OK)
        rc = ferry__sockopt(s, ZMQ_PLAIN_USERNAME, "ferry-worker", 12, "ZMQ_PLAIN_USERNAME");
    if (rc == FERRY_OK)
        rc = ferry__sockopt(s, ZMQ_PLAIN_PASSWORD, c->token, strlen(c->token),
                            "ZMQ_PLAIN_PASSWORD");
    if (rc == FERRY_OK && zmq_connect(s, w->data_ep) != 0)
        rc = ferry__seterr(FERRY_ESYS, "connecting to %s: %s", w->data_ep, zmq_strerror(errno));
    if (rc != FERRY_OK) {
        zmq_close(s);
        ferry__seal_free(seal);
        return rc;
    }
    pthread_mutex_lock(&w->sock_mu);
    ferry__sockopt_int(w->sock, ZMQ_LINGER, 0, "ZMQ_LINGER");
    zmq_close(w->sock);
    w->sock = s;
    w->seal = seal;
    pthread_mutex_unlock(&w->sock_mu);
    w->joining = 1;
    w->heard_ms = ferry__now_ms();
    return send_simple(w, FERRY__MSG_HEARTBEAT);
}

/* The HELLO connection's DEALER: setup_socket, and CURVE when a server
 * key is given. */
static int setup_hello_socket(worker_session *w)
{
    const ferry__worker_opts *o = w->o;
    int rc = setup_socket(w->sock, o->endpoint);
    if (rc != FERRY_OK || !o->server_key || strncmp(o->endpoint, "tcp://", 6) != 0)
        return rc;
    if (zmq_setsockopt(w->sock, ZMQ_CURVE_SERVERKEY, o->server_key, 40) != 0 ||
        zmq_setsockopt(w->sock, ZMQ_CURVE_PUBLICKEY, o->public_key, 40) != 0 ||
        zmq_setsockopt(w->sock, ZMQ_CURVE_SECRETKEY, o->secret_key, 40) != 0)
        return ferry__seterr(FERRY_EOPTION, "setting the CURVE keys: %s", zmq_strerror(errno));
    return FERRY_OK;
}

/* BYE, with a short, bounded linger so it is not dropped at close (nor
 * the BATCH sent just before it). Should the linger not take, the BYE may
 * be lost at close: the loader then finds this worker gone by its pidfd
 * or heartbeats, as it would a crash, so the session ends either way. A
 * retiring worker's BYE says why (w->retiring) with its figures. */
static void say_bye(worker_session *w)
{
    pthread_mutex_lock(&w->sock_mu);
    if (ferry__sockopt_int(w->sock, ZMQ_LINGER, 200, "ZMQ_LINGER") != FERRY_OK)
        fprintf(stderr, "ferry-worker: %s; BYE may be lost\n", ferry_last_error());
    pthread_mutex_unlock(&w->sock_mu);
    w->out.u.bye = (ferry__bye){0};
    if (w->retiring)
        w->out.u.bye = (ferry__bye){.retired = (uint32_t)w->retiring,
                                    .rss = w->retire.rss,
                                    .batches = w->retire.batches};
    send_simple(w, FERRY__MSG_BYE);
}

/* A HEARTBEAT if nothing has been sent for an interval. Checked after
 * every message as well as when idle: a worker that only ever receives (the
 * loader's own heartbeats) must still be heard. */
static int heartbeat_if_due(worker_session *w)
{
    if (!w->hb_ms)
        return FERRY_OK;
    pthread_mutex_lock(&w->sock_mu);
    uint64_t since = ferry__now_ms() - w->sent_ms;
    pthread_mutex_unlock(&w->sock_mu);
    return since >= w->hb_ms ? send_simple(w, FERRY__MSG_HEARTBEAT) : FERRY_OK;
}

/* A worker left without a task for this long gives its heap's free
 * memory back to the system: what building batches allocated and freed
 * (decoded images, a dataset's temporaries) stays in glibc's heap
 * otherwise, as part of this worker's memory, through an epoch's end, a
 * trainer that is the bottleneck, or a loader (a validation one) that
 * waits for its turn. Busy, it never trims: the next batch would fault
 * the same pages in again. */
#define IDLE_TRIM_MS 100

static void trim_when_idle(worker_session *w, uint64_t now)
{
#ifdef __GLIBC__
    /* A thread worker's heap is the trainer's: never trimmed from here. */
    if (!w->o->zctx && !w->trimmed && now - w->task_ms >= IDLE_TRIM_MS) {
        w->trimmed = 1;
        malloc_trim(0);
    }
#else
    (void)w;
    (void)now;
#endif
}

/* What the main loop does when no message came: heartbeats while idle,
 * and the end of the session when the loader has gone silent. */
static int on_idle(worker_session *w, int configured, uint64_t waited)
{
    if (!configured) {
        if (w->o->handshake_ms > 0 && waited >= (uint64_t)w->o->handshake_ms)
            return ferry__seterr(FERRY_ETIMEDOUT,
                                 "no CONFIG from %s within %d ms (no loader there yet, or it "
                                 "refused this worker's key or protocol)",
                                 w->o->endpoint, w->o->handshake_ms);
        return FERRY_OK;
    }
    uint64_t now = ferry__now_ms();
    trim_when_idle(w, now);
    uint64_t join_ms = w->hb_ms ? w->dead_ms : (uint64_t)w->o->handshake_ms;
    if (w->joining && join_ms && now - w->heard_ms >= join_ms)
        return ferry__seterr(FERRY_ETIMEDOUT,
                             "the loader at %s admitted this worker, but its data port %s did not "
                             "take the connection within %llu ms (is that port reachable through "
                             "the firewall? or the loader refused the session token)",
                             w->o->endpoint, w->data_ep, (unsigned long long)join_ms);
    if (!w->hb_ms)
        return FERRY_OK;
    if (now - w->heard_ms >= w->dead_ms)
        return ferry__seterr(
            FERRY_ETIMEDOUT, "the loader at %s has been silent for %llu ms (heartbeat %llu ms)",
            w->o->endpoint, (unsigned long long)(now - w->heard_ms), (unsigned long long)w->hb_ms);
    return heartbeat_if_due(w);
}

/* STOP: the session ends with BYE. FERRY_OK after a normal session, else
 * FERRY_ECLOSED saying why the loader turned this worker away. */
static int on_stop(worker_session *w, int configured)
{
    say_bye(w);
    if (w->ds_open)
        return FERRY_OK;
    if (configured)
        return ferry__seterr(FERRY_ECLOSED, "the loader at %s turned this worker away: %s",
                             w->o->endpoint, w->refusal);
    return ferry__seterr(FERRY_ECLOSED,
                         "the loader at %s refused this worker (it is full, closing, or speaks "
                         "another protocol)",
                         w->o->endpoint);
}

/* REFUSE: the loader will not have this worker, which speaks another
 * protocol version. The session ends at once and without BYE (the loader
 * has already forgotten this connection): FERRY_EVERSION naming both
 * versions, or FERRY_ECLOSED with the loader's reason should the versions
 * agree after all. */
static int on_refuse(worker_session *w)
{
    const ferry__refuse *r = &w->in.u.refuse;
    if (r->version != FERRY_PROTOCOL_VERSION)
        return ferry__seterr(FERRY_EVERSION,
                             "the loader at %s refused this worker: " FERRY__VERSION_MISMATCH,
                             w->o->endpoint, FERRY_PROTOCOL_VERSION, r->version);
    return ferry__seterr(FERRY_ECLOSED, "the loader at %s refused this worker: %s", w->o->endpoint,
                         r->reason);
}

/* Acts on one message from the loader; *stopped is set when it ended the
 * session (STOP, REFUSE). */
static int on_message(worker_session *w, zmq_msg_t *payload, int *configured, int *stopped)
{
    switch (w->in.type) {
    case FERRY__MSG_CONFIG: {
        *configured = 1;
        int rc = w->in.u.config.data_port && !w->data_ep[0] ? join_data(w, &w->in.u.config)
                                                             : FERRY_OK;
        explicit_bzero(w->in.u.config.seal, sizeof w->in.u.config.seal);
        if (rc == FERRY_OK)
            rc = on_config(w);
        if (rc == FERRY_OK && w->ds_open && w->o->configured)
            *w->o->configured = 1;
        return rc;
    }
    case FERRY__MSG_TASK: {
        int rc = on_task(w, payload);
        w->task_ms = ferry__now_ms();
        w->trimmed = 0;
        if (rc == FERRY_OK)
            w->retiring = ferry__retire_after_task(&w->retire);
        return rc;
    }
    case FERRY__MSG_HEARTBEAT:
        return FERRY_OK;
    case FERRY__MSG_STOP:
        *stopped = 1;
        return on_stop(w, *configured);
    case FERRY__MSG_REFUSE:
        *stopped = 1;
        return on_refuse(w);
    default:
        fprintf(stderr, "ferry-worker: unexpected %s from the loader, dropped\n",
                ferry__msg_name(w->in.type));
        return FERRY_OK;
    }
}

/* The session's loop: messages until STOP, a failure, silence, or being
 * told to quit (then BYE, so the loader requeues at once). */
static int serve(worker_session *w)
{
    int configured = 0, stopped = 0;
    uint64_t start = ferry__now_ms();
    for (;;) {
        zmq_msg_t payload;
        int got;
        /* Short enough polls that heartbeats go out on time. */
        int poll_ms = w->hb_ms && w->hb_ms / 2 < POLL_MS ? (int)(w->hb_ms / 2) : POLL_MS;
        int rc = wait_msg(w, poll_ms > 0 ? poll_ms : 1, &payload, &got);
        if (rc == FERRY_OK && !got) {
            rc = on_idle(w, configured, ferry__now_ms() - start);
            if (rc == FERRY_OK)
                continue;
            return rc;
        }
        if (rc == FERRY_OK) {
            rc = on_message(w, &payload, &configured, &stopped);
            zmq_msg_close(&payload);
            if (stopped)
                return rc;
        }
        if (rc == FERRY_OK && w->retiring) {
            /* Its last batch is sent; the tasks queued behind it were
             * never started, and go to the others (retire.h). */
            say_bye(w);
            return FERRY_OK;
        }
        if (rc == FERRY_OK)
            rc = heartbeat_if_due(w);
        if (rc == FERRY_OK && should_quit(w))
            rc = ferry__seterr(FERRY_ETIMEDOUT, "worker told to quit");
        if (rc != FERRY_OK) {
            if (should_quit(w) && configured)
                say_bye(w);
            return rc;
        }
    }
}

/* The DEALER, connected, and HELLO sent. */
static int open_session(worker_session *w, void *ctx)
{
    const ferry__worker_opts *o = w->o;
    w->sock = zmq_socket(ctx, ZMQ_DEALER);
    if (!w->sock)
        return ferry__syserr(FERRY_ESYS, "zmq_socket", errno);
    int rc = setup_hello_socket(w);
    if (rc != FERRY_OK)
        return rc;
    if (zmq_connect(w->sock, o->endpoint) != 0)
        return ferry__seterr(FERRY_ESYS, "connecting to %s: %s", o->endpoint, zmq_strerror(errno));
    memset(&w->out.u.hello, 0, sizeof w->out.u.hello);
    w->out.type = FERRY__MSG_HELLO;
    w->out.u.hello.version = FERRY_PROTOCOL_VERSION;
    w->out.u.hello.pid = (uint32_t)getpid();
    w->out.u.hello.slot = o->slot;
    gethostname(w->out.u.hello.host, sizeof w->out.u.hello.host - 1);
    snprintf(w->out.u.hello.program, sizeof w->out.u.hello.program, "ferry-worker %s",
             ferry_version());
    return send_msg(w, NULL, 0);
}

int ferry__worker_run(const ferry__worker_opts *o)
{
    worker_session *w = ferry__calloc(1, sizeof *w);
    if (!w)
        return ferry__seterr(FERRY_ENOMEM, "worker state");
    w->o = o;
    ferry__retire_init(&w->retire);
    pthread_mutex_init(&w->sock_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->hb_cv, &ca);
    pthread_condattr_destroy(&ca);

    int rc = FERRY_OK;
    void *ctx = o->zctx, *own_ctx = NULL;
    if (!ctx) {
        ctx = own_ctx = zmq_ctx_new();
        if (!ctx)
            rc = ferry__syserr(FERRY_ESYS, "zmq_ctx_new", errno);
    }
    w->ctx = ctx;
    if (rc == FERRY_OK)
        rc = open_session(w, ctx);
    if (rc == FERRY_OK)
        rc = serve(w);

    stop_heartbeats(w);
    ferry__retire_close(&w->retire);
    if (w->ds_open)
        ferry__dataset_close(&w->ds);
    if (w->sock)
        zmq_close(w->sock);
    ferry__seal_free(w->seal);
    if (own_ctx)
        zmq_ctx_term(own_ctx);
    pthread_cond_destroy(&w->hb_cv);
    pthread_mutex_destroy(&w->sock_mu);
    if (w->shm_base && !w->o->shm)
        munmap(w->shm_base, w->shm_len);
    free(w->shm_seen);
    free(w->indices);
    free(w);
    return rc;
}
