/*
 * worker_batch.c - a batch built in place (see worker_internal.h).
 *
 * The worker sizes the payload frame from the dataset's schema (layout.h),
 * lets the dataset write every field into it, and hands the frame to
 * ZeroMQ, so no byte of a batch is copied on this side.
 *
 * A local worker may instead be given room in the loader's batch slots
 * (TASK.shm_offset/shm_bytes, in the memfd of --shm-fd, or of a thread
 * worker's options): the fields go there, the BATCH says shm and carries
 * an empty payload frame, and the trainer reads the slot itself, so a
 * batch is never copied at all. The slots are mapped once (and again only
 * should the memory grow), and each slot's pages in one call the first
 * time this worker writes into it, so a batch in steady state costs no
 * mapping and no page fault.
 *
 * Field placement: every field starts at a 64-byte boundary counted from a
 * lead offset. The lead is chosen so the field lands 64-byte aligned in this
 * process's frame buffer; ZeroMQ gives the receiver's buffer the same
 * alignment in practice (same allocator, same header in front of the data),
 * so the loader can use the bytes where they are. The loader checks and
 * copies when that guess is wrong; nothing breaks either way.
 */
#include "worker_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "layout.h"
#include "shm.h"

/* The bytes of a batch of `count` items' fixed fields (layout.h). */
static size_t fields_bytes(const worker_session *w, uint32_t count)
{
    return ferry__layout_fixed_bytes(&w->ds.schema, w->ds.item_bytes, count);
}

/* Fills the BATCH header for task t with its fields laid out in the bytes
 * at base (layout.h). dst[f] is where the dataset writes field f: in base,
 * or for a field of variable shape, the var record it fills. */
static void lay_out_fields(worker_session *w, const ferry__task *t, unsigned char *base, void **dst)
{
    ferry__batch_hdr *h = &w->out.u.batch;
    ferry__layout_fixed(&w->ds.schema, w->ds.item_bytes, t->count, base, h);
    h->id = t->id;
    for (uint32_t f = 0; f < h->nfields; f++) {
        if (h->fields[f].var) { /* placed once filled: place_var */
            memset(&w->var[f], 0, sizeof w->var[f]);
            dst[f] = &w->var[f];
        } else {
            dst[f] = base + h->fields[f].offset;
        }
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
    return ferry__worker_send_fail(w, t->id, FERRY_ELIMIT, w->indices[0], msg);
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
    *rc = ferry__layout_var_sizes(&w->out.u.batch, w->var, &var_total, why, sizeof why);
    if (*rc != FERRY_OK) {
        *rc = ferry__worker_send_fail(w, t->id, *rc, w->indices[0], why);
        return 0;
    }
    ferry__batch_hdr *h = &w->out.u.batch;
    size_t lead = ferry__layout_lead(base), fixed = fields_bytes(w, t->count);
    size_t end = lead + fixed;
    if (var_total > cap - end) {
        size_t bytes = FERRY__FIELD_ALIGN + fixed + var_total;
        zmq_msg_t bigger;
        if (bytes > w->max_message) {
            *rc = fail_too_big(w, t, bytes);
            return 0;
        }
        if (zmq_msg_init_size(&bigger, bytes) != 0) {
            *rc = ferry__worker_send_fail(w, t->id, FERRY_ENOMEM, w->indices[0],
                            "worker out of memory for batch");
            return 0;
        }
        unsigned char *nb = zmq_msg_data(&bigger);
        size_t nlead = ferry__layout_lead(nb);
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
    ferry__layout_place_var(h, end);
    for (uint32_t f = 0; f < h->nfields; f++)
        if (h->fields[f].var)
            memcpy(base + h->fields[f].offset, w->var[f].data, h->fields[f].nbytes);
    return 1;
}

/* Makes the payload frame for task t (`total` bytes: ferry__layout_frame_bytes)
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
    size_t n = ferry__layout_frame_bytes(&w->ds.schema, w->ds.item_bytes, t->count);
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
    if (!ferry__layout_fits(&w->ds.schema, w->ds.item_bytes, t->count, room, t->shm_bytes))
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
int ferry__worker_on_task(worker_session *w, zmq_msg_t *task_payload)
{
    const ferry__task t = w->in.u.task;
    uint64_t t0 = ferry__now_ns();
    if (!w->ds_open)
        return ferry__worker_send_fail(w, t.id, FERRY_EDATASET, 0, "worker has no open dataset");
    if (take_indices(w, &t, task_payload) != FERRY_OK)
        return ferry__worker_send_fail(w, t.id, FERRY_ENOMEM, 0, "worker out of memory for indices");
    zmq_msg_t payload;
    void *dst[FERRY_MAX_FIELDS];
    unsigned char *room = shm_room(w, &t);
    if (room) {
        lay_out_fields(w, &t, room, dst);
        w->out.u.batch.shm = 1;
        zmq_msg_init(&payload); /* BATCH's frame, empty */
    } else {
        size_t bytes = ferry__layout_frame_bytes(&w->ds.schema, w->ds.item_bytes, t.count);
        if (bytes > w->max_message)
            return fail_too_big(w, &t, bytes);
        if (lay_out_batch(w, &t, bytes, &payload, dst) != FERRY_OK)
            return ferry__worker_send_fail(w, t.id, FERRY_ENOMEM, w->indices[0],
                             "worker out of memory for batch");
    }
    ferry_dataset_error derr;
    int rc = fill_batch(w, &t, dst, &derr);
    if (rc != FERRY_OK) {
        zmq_msg_close(&payload);
        return ferry__worker_send_fail(w, t.id, rc, derr.index, derr.message);
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
    rc = ferry__worker_send(w, &payload, 0);
    if (rc != FERRY_OK)
        zmq_msg_close(&payload);
    return rc;
}
