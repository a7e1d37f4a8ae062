/*
 * replies.c - what the scheduler does with each message from a worker
 * (see sched_internal.h): HELLO is answered with CONFIG (or refused: STOP,
 * or REFUSE to a worker of another protocol version), READY starts the run
 * once enough workers are ready and fixes the dataset's length and schema
 * (and so the size of the shared batch slots), BATCH and FAIL are filed in
 * the window as the answer to their task (a batch in a slot as a view of
 * it; a slot the answer did not use is free again), BYE ends a session
 * (a local worker's that says it retires is replaced as planned:
 * supervise.c). Anything else, or anything from a worker that may not
 * send it now, is counted as malformed or stale and dropped; a BATCH that
 * is not what its task asked for (count, schema) is counted as malformed
 * and charged to its worker: nothing a peer sends can crash the loader or
 * reach the trainer unchecked.
 *
 * On plain TCP a remote worker's session moves, after CONFIG, from the
 * HELLO socket to the data socket (remote.h): its first message there,
 * on the connection its session token let in, binds it (bind_data).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "batch.h"
#include "clock.h"
#include "error.h"
#include "sched_internal.h"

static sched_worker *find_by_ident(ferry__scheduler *s, void *sock, const ferry__ident *id)
{
    for (uint32_t i = 0; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        if (w->p.sock == sock && w->p.ident.len == id->len && w->p.state != FERRY__PEER_GONE &&
            w->p.state != FERRY__PEER_EMPTY && memcmp(w->p.ident.id, id->id, id->len) == 0)
            return w;
    }
    return NULL;
}

/* The answer that makes a refused worker (of protocol `version`) stop at
 * once instead of waiting for a CONFIG or a TASK that will not come. A
 * worker from FERRY__REFUSE_SINCE on, this version included, gets REFUSE
 * with the reason, so the host's operator reads why (the remote slots are
 * all taken, its data differs) where the worker runs: REFUSE, like HELLO,
 * never changes, so every such version decodes it. A version-1 worker,
 * which knows no REFUSE, gets STOP, which before CONFIG means the same.
 * On a sealed data connection the answer is sealed with the session's
 * seal, as everything there is: the reason names the dataset. */
static void answer_refusal(ferry__scheduler *s, void *sock, const ferry__ident *id,
                           ferry__seal *seal, uint32_t version, const char *why)
{
    if (version >= FERRY__REFUSE_SINCE) {
        s->out.type = FERRY__MSG_REFUSE;
        s->out.u.refuse.version = FERRY_PROTOCOL_VERSION;
        snprintf(s->out.u.refuse.reason, sizeof s->out.u.refuse.reason, "%s", why);
    } else {
        s->out.type = FERRY__MSG_STOP;
    }
    ferry__zsock_send(sock, id, seal, &s->out, NULL, ZMQ_DONTWAIT);
}

/* A remote worker refused: counted, said so (rate-limited), and answered
 * (answer_refusal) on sock, sealed with seal where the connection is, so
 * it backs off at once. */
static void reject_remote(ferry__scheduler *s, void *sock, const ferry__ident *id,
                          ferry__seal *seal, uint32_t version, const char *why)
{
    ferry__remote_log_refusal(s->remote, ferry__window_count(s->win, FERRY__STAT_REJECTED), why);
    snprintf(s->last_refusal, sizeof s->last_refusal, "%s", why);
    if (id)
        answer_refusal(s, sock, id, seal, version, why);
}

void ferry__sched_zap_refused(void *arg, const char *why)
{
    reject_remote(arg, NULL, NULL, NULL, FERRY_PROTOCOL_VERSION, why);
}

/* Sends CONFIG (or, while closing, STOP) to a worker that said HELLO. */
static void configure_worker(ferry__scheduler *s, sched_worker *w)
{
    if (s->closing) {
        /* It started just before close: no dataset to open, just go. */
        sched_send_simple(s, w, FERRY__MSG_STOP);
        w->p.state = FERRY__PEER_CONFIGURED;
        return;
    }
    ferry__config_msg *c = &s->out.u.config;
    memset(c, 0, sizeof *c);
    s->out.type = FERRY__MSG_CONFIG;
    memcpy(c->dataset, s->cfg.dataset, sizeof s->cfg.dataset);
    c->worker_index = w->p.index;
    c->num_workers = s->nworkers;
    c->seed = (uint64_t)s->cfg.seed;
    c->credits = ferry__flow_credits(s->flow, w->p.index);
    /* Local workers are watched through their pidfds (or are threads). */
    c->heartbeat_ms = w->p.remote ? (uint32_t)s->cfg.heartbeat_ms : 0;
    c->liveness = (uint32_t)s->cfg.heartbeat_liveness;
    c->max_message = (uint64_t)s->cfg.max_message;
    /* Only the loader's own worker processes retire: a remote host's
     * memory is its own to bound (docs/options.md), and a worker that
     * predates these keys would take the CONFIG for malformed. */
    if (!w->p.remote && s->cfg.worker_mode == FERRY__PLACE_PROCESS) {
        c->retire_rss = (uint64_t)s->cfg.worker_max_rss_bytes;
        c->retire_batches = (uint64_t)s->cfg.max_batches_per_worker;
    }
    if (w->p.remote) {
        c->data_port = ferry__remote_data_port(s->remote);
        if (ferry__remote_token_issue(s->remote, w->p.index - s->nlocal, c->token, c->seal) !=
            FERRY_OK) {
            ferry__logf(&s->log, FERRY_LOG_WARN, "turned a remote worker away: %s",
                        ferry_last_error());
            sched_send_simple(s, w, FERRY__MSG_STOP);
            ferry__sched_end_remote(s, w);
            return;
        }
    }
    int rc = sched_send(s, w, NULL);
    explicit_bzero(c->token, sizeof c->token);
    explicit_bzero(c->seal, sizeof c->seal);
    if (rc == FERRY_OK) {
        w->p.state = FERRY__PEER_CONFIGURED;
        w->p.sent_ms = ferry__now_ms();
    }
}

/* A free remote slot: this connection's own if it had one, else the
 * first that is empty; NULL when max_remote are taken. */
static sched_worker *free_remote_slot(ferry__scheduler *s, sched_worker *own)
{
    if (own && own->p.state == FERRY__PEER_EMPTY)
        return own;
    for (uint32_t i = s->nlocal; i < s->nworkers; i++) {
        if (s->w[i].p.state == FERRY__PEER_EMPTY || s->w[i].p.state == FERRY__PEER_GONE)
            return &s->w[i];
    }
    return NULL;
}

static void on_hello_remote(ferry__scheduler *s, const ferry__ident *id)
{
    const ferry__hello *h = &s->in.u.hello;
    char why[FERRY__ERRMSG_MAX];
    if (!ferry__remote_hello_ok(h, why, sizeof why)) {
        reject_remote(s, ferry__remote_socket(s->remote), id, NULL, h->version, why);
        return;
    }
    sched_worker *w = find_by_ident(s, ferry__remote_socket(s->remote), id);
    if (w) /* a second HELLO on one connection: a new session; the old one ends */
        ferry__sched_lose_remote(s, w, "it started a new session", FERRY__CHARGE_NONE, 0);
    w = free_remote_slot(s, w);
    if (!w) {
        snprintf(why, sizeof why, "%s (pid %u): all %lld remote slots are taken (max_remote)",
                 h->host, h->pid, (long long)s->cfg.max_remote);
        reject_remote(s, ferry__remote_socket(s->remote), id, NULL, FERRY_PROTOCOL_VERSION, why);
        return;
    }
    w->p.sock = ferry__remote_socket(s->remote); /* until its data connection binds it */
    w->p.ident = *id;
    w->p.unreachable = 0;
    w->p.delivered_any = 0;
    w->p.rpid = h->pid;
    snprintf(w->p.host, sizeof w->p.host, "%s", h->host);
    ferry__sched_name_remote(s, w); /* for ferry_loader_worker_host */
    w->p.heard_ms = ferry__now_ms();
    configure_worker(s, w);
}

/* Local worker w, the very process the loader started, speaks another
 * protocol version (worker_path is another ferry's ferry-worker): it is
 * told to stop, and the loader fails now with both versions named, not
 * after start_timeout_ms. */
static void refuse_local(ferry__scheduler *s, sched_worker *w, void *sock, const ferry__ident *id)
{
    const ferry__hello *h = &s->in.u.hello;
    char who[96], msg[FERRY__ERRMSG_MAX];
    sched_describe(s, w, who, sizeof who);
    snprintf(msg, sizeof msg, FERRY__VERSION_MISMATCH ": %s is '%s', from %s (worker_path)",
             h->version, FERRY_PROTOCOL_VERSION, who, h->program, s->worker_path);
    answer_refusal(s, sock, id, NULL, h->version, msg);
    ferry__window_fail(s->win, FERRY_EVERSION, msg);
}

static void on_hello(ferry__scheduler *s, void *sock, const ferry__ident *id)
{
    if (s->remote && sock == ferry__remote_socket(s->remote)) {
        on_hello_remote(s, id);
        return;
    }
    if (s->remote && sock == ferry__remote_data_socket(s->remote)) {
        /* A session starts on the HELLO socket, never here. */
        ferry__window_count(s->win, FERRY__STAT_MALFORMED);
        return;
    }
    const ferry__hello *h = &s->in.u.hello;
    if (h->slot < 0 || (uint32_t)h->slot >= s->nlocal) {
        ferry__logf(&s->log, FERRY_LOG_WARN,
                    "refused a HELLO on the local socket (protocol version %u, slot %d, pid %u, "
                    "host %s): no local worker has that slot",
                    h->version, h->slot, (unsigned)h->pid, h->host);
        ferry__window_count(s->win, FERRY__STAT_MALFORMED);
        return;
    }
    sched_worker *w = &s->w[h->slot];
    pid_t pid = ferry__pool_pid(s->pool, w->p.index);
    if (!pid && w->p.state == FERRY__PEER_SPAWNED) {
        ferry__pool_await_fork(s->pool, w->p.index, 500);
        pid = ferry__pool_pid(s->pool, w->p.index);
        if (!pid) /* no answer: the fork's own word, if its clean parent died first */
            pid = ferry__pool_said(s->pool, w->p.index);
    }
    if (w->p.state != FERRY__PEER_SPAWNED || (pid_t)h->pid != (pid ? pid : getpid())) {
        /* The HELLO of the process this slot had before (it died or was
         * killed just after saying it) is late, not forged. */
        int late = w->death.pid && (pid_t)h->pid == w->death.pid && (pid_t)h->pid != pid;
        ferry__window_count(s->win, late ? FERRY__STAT_STALE : FERRY__STAT_MALFORMED);
        return;
    }
    if (h->version != FERRY_PROTOCOL_VERSION) {
        refuse_local(s, w, sock, id);
        return;
    }
    w->p.ident = *id;
    configure_worker(s, w);
}

/* The window runs from the first READY (the dataset's length is known
 * then), so the first batch is under way while the other workers start;
 * open returns once open_local_ready local workers (all by default) and
 * at least min_workers in all are ready. Until then a start past
 * start_timeout_ms, or the death of a worker still starting, fails the
 * loader, as a failed start (a ready worker's death is handled as after
 * open: supervise.c). After open, a worker still starting that dies or
 * overstays start_timeout_ms is replaced as any other (one that keeps
 * dying without delivering a batch fails the loader). */
static void maybe_start(ferry__scheduler *s, uint32_t ready)
{
    if (ferry__window_phase(s->win) == FERRY__PHASE_STARTING &&
        ferry__window_start(s->win, s->n) != FERRY_OK)
        return;
    if (ready < s->min_workers || s->opened)
        return;
    uint32_t local = 0;
    for (uint32_t i = 0; i < s->nlocal; i++)
        local += s->w[i].p.state == FERRY__PEER_READY;
    if (local < s->open_local)
        return;
    s->opened = 1;
    ferry__window_open(s->win);
}

/* The batch slots, sized from the schema the first READY fixed: each
 * holds a full batch laid out as the worker lays it out (every field from
 * a 64-byte boundary), and there are as many as fit shm_max_bytes (at most
 * SLOTS_MAX). A slot's memory is allocated only when a batch is first
 * written into it, and the slot given next is always the one freed last,
 * so the memory used grows with what is in flight and in the trainer's
 * hands (the window plus what the trainer keeps), never past
 * shm_max_bytes. None when not even one fits, or the memory cannot be
 * mapped: batches then go by message, as they would from a remote
 * worker. */
#define SLOTS_MAX 4096
static uint64_t batch_bytes(const ferry__scheduler *s)
{
    uint64_t bytes = 0;
    for (uint32_t f = 0; f < s->schema.nfields; f++) {
        uint64_t item = ferry__item_field_bytes(&s->schema.fields[f]);
        /* The schema's item is at most 1 GiB, a batch at most 2^20 items. */
        bytes += FERRY__ROUND_UP(item * (uint64_t)s->cfg.batch_size, FERRY__FIELD_ALIGN);
    }
    return bytes;
}

static void size_slots(ferry__scheduler *s)
{
    uint64_t bytes = FERRY__ROUND_UP(batch_bytes(s), FERRY__SHM_SLOT_ALIGN);
    uint64_t fit = (uint64_t)s->cfg.shm_max_bytes / bytes;
    uint32_t n = (uint32_t)(fit < SLOTS_MAX ? fit : SLOTS_MAX);
    if (n == 0) {
        ferry__logf(&s->log, FERRY_LOG_INFO,
                    "a batch takes %llu bytes, more than shm_max_bytes %lld: batches go by "
                    "message",
                    (unsigned long long)bytes, (long long)s->cfg.shm_max_bytes);
        return;
    }
    if (ferry__shm_size(s->shm, bytes, n) != FERRY_OK) {
        ferry__logf(&s->log, FERRY_LOG_WARN, "%s; batches go by message", ferry_last_error());
        return;
    }
    ferry__logf(&s->log, FERRY_LOG_DEBUG, "%u batch slots of %llu bytes in shared memory", n,
                (unsigned long long)bytes);
}

/* Worker w is ready: the first READY fixes the dataset's length and
 * schema; the run starts once enough workers are. */
static void worker_ready(ferry__scheduler *s, sched_worker *w, const char *who)
{
    const ferry__ready *r = &s->in.u.ready;
    if (!s->schema.nfields) { /* set once: the trainer reads it after open */
        s->n = r->length;
        s->schema = r->schema;
        ferry__flow_batch_bytes(s->flow, batch_bytes(s));
        if (s->shm)
            size_slots(s);
    }
    w->p.state = FERRY__PEER_READY;
    uint32_t ready = ferry__window_add_workers(s->win, +1);
    ferry__flow_join(s->flow, w->p.index, ferry__now_ns(), s->shm && !w->p.remote);
    w->p.rtt_ms = 0;
    sched_flow_publish(s);
    ferry__logf(&s->log, FERRY_LOG_DEBUG, "%s is ready (%u ready)", who, ready);
    s->idle_since_ms = 0;
    if (w->p.remote) {
        ferry__window_count(s->win, FERRY__STAT_JOINED);
        ferry__logf(&s->log, FERRY_LOG_INFO, "%s joined (%u workers ready)", who, ready);
    }
    maybe_start(s, ready);
}

/* READY: the worker's dataset opened with the same length and schema as
 * everyone else's, or it did not. A local worker that cannot open the
 * dataset, or sees other data, fails the loader; a remote host with the
 * wrong data is turned away. */
static void on_ready(ferry__scheduler *s, sched_worker *w);

/* Whether remote worker w's READY must wait: the loader has local workers
 * and none has fixed the dataset's length and schema yet. The loader's own
 * workers decide what the data is; a remote host that answers first
 * (it may have been waiting for the port to open) is checked against that,
 * and turned away if it differs, rather than deciding for the run and
 * getting the honest local workers blamed. Kept in w->held_ready; 1 when
 * kept (or dropped for want of memory: the host is then never ready, as
 * with any READY lost on the way, and is dropped when silent). */
static int hold_remote_ready(ferry__scheduler *s, sched_worker *w)
{
    if (!w->p.remote || s->schema.nfields || !s->nlocal || s->in.u.ready.code != 0)
        return 0;
    if (!w->held_ready)
        w->held_ready = ferry__malloc(sizeof *w->held_ready);
    if (w->held_ready)
        *w->held_ready = s->in.u.ready;
    return 1;
}

/* The READYs remote hosts sent before the dataset was fixed, checked now
 * as if they had just come. */
static void check_held_readies(ferry__scheduler *s)
{
    for (uint32_t i = s->nlocal; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        if (!w->held_ready)
            continue;
        s->in.type = FERRY__MSG_READY;
        s->in.u.ready = *w->held_ready;
        free(w->held_ready);
        w->held_ready = NULL;
        on_ready(s, w);
    }
}

static void on_ready(ferry__scheduler *s, sched_worker *w)
{
    const ferry__ready *r = &s->in.u.ready;
    char who[96], why[256], msg[FERRY__ERRMSG_MAX];
    if (w->p.state != FERRY__PEER_CONFIGURED) {
        ferry__window_count(s->win, FERRY__STAT_MALFORMED);
        return;
    }
    if (hold_remote_ready(s, w))
        return;
    sched_describe(s, w, who, sizeof who);
    if (r->code != 0) {
        snprintf(msg, sizeof msg, "%s could not open dataset '%s': %s", who, s->cfg.dataset,
                 r->error);
    } else if (w->p.remote && r->length == 0) {
        /* Refused before it can fix the length: a host with empty data
         * must not make the run's stream empty (the first READY decides). */
        snprintf(msg, sizeof msg, "%s sees no items in dataset '%s'", who, s->cfg.dataset);
    } else if (s->n && r->length != s->n) {
        snprintf(msg, sizeof msg, "%s sees %llu items in dataset '%s', others see %llu", who,
                 (unsigned long long)r->length, s->cfg.dataset, (unsigned long long)s->n);
    } else if (s->schema.nfields && ferry__schema_diff(&s->schema, &r->schema, why, sizeof why)) {
        snprintf(msg, sizeof msg, "%s sees another schema in dataset '%s' than the others: %s", who,
                 s->cfg.dataset, why);
    } else {
        int fixes = !s->schema.nfields;
        worker_ready(s, w, who);
        if (fixes)
            check_held_readies(s);
        return;
    }
    if (!w->p.remote) {
        ferry__window_fail(s->win, r->code != 0 ? r->code : FERRY_EMISMATCH, msg);
        return;
    }
    reject_remote(s, w->p.sock, &w->p.ident, sched_seal(s, w), FERRY_PROTOCOL_VERSION, msg);
    ferry__sched_end_remote(s, w);
}

/* The worker delivered (or failed on) a task: it is alive and useful. */
static void credit_worker(sched_worker *w)
{
    w->p.delivered_any = 1;
    w->p.failed_starts = 0;
}

/* The batch's fields as views into the received payload. */
static void field_views(const ferry__batch_hdr *h, const unsigned char *base, ferry_tensor *out)
{
    for (uint32_t f = 0; f < h->nfields; f++) {
        const ferry__field_desc *d = &h->fields[f];
        out[f] = (ferry_tensor){.name = d->name,
                                .dtype = d->dtype,
                                .ndim = d->ndim,
                                .data = base + d->offset,
                                .nbytes = d->nbytes};
        memcpy(out[f].shape, d->shape, sizeof out[f].shape);
    }
}

/* Whether BATCH h is what task e asked for: e's number of items, and the
 * fields of the dataset's schema, in its order, with its dtypes and item
 * shapes. The decoder has checked the rest: shape[0] is h->count, and each
 * field's nbytes is what its shape and dtype give (so here, count times
 * the schema's item size). 0 with why said otherwise. */
static int batch_matches(const ferry__scheduler *s, const ferry__batch_hdr *h,
                         const ferry__window_entry *e, char *why, size_t cap)
{
    if (h->count != e->t.count) {
        snprintf(why, cap, "it holds %u items, the task %u", h->count, e->t.count);
        return 0;
    }
    return !ferry__batch_schema_diff(&s->schema, h, why, cap);
}

/* A BATCH that is not what its task asked for: counted as malformed, and
 * never delivered. A remote worker is charged with it as with a crash: it
 * is given up, its tasks go to the others, and this one is charged an
 * attempt. A local worker runs ferry's own worker on the schema it
 * announced, so a wrong batch from it is a bug that would only repeat
 * after a restart: that batch fails with FERRY_EBATCH saying what differed,
 * and the stream goes on (docs/failures.md). */
static void on_wrong_batch(ferry__scheduler *s, sched_worker *w, ferry__window_entry *e,
                           const char *why)
{
    char what[384], who[96];
    ferry__window_count(s->win, FERRY__STAT_MALFORMED);
    snprintf(what, sizeof what,
             "its reply to batch %llu (epoch %llu, batch %llu) does not match the task and the "
             "dataset's schema: %s",
             (unsigned long long)e->t.seq, (unsigned long long)e->t.epoch,
             (unsigned long long)e->t.batch_in_epoch, why);
    if (w->p.remote) {
        /* Charged for the batch it got wrong, not its oldest. */
        ferry__sched_lose_remote(s, w, what, FERRY__CHARGE_TASK, e->id);
        return;
    }
    sched_describe(s, w, who, sizeof who);
    char *msg = ferry__malloc(FERRY__ERRMSG_MAX);
    if (msg)
        snprintf(msg, FERRY__ERRMSG_MAX, "%s: %s", who, what);
    ferry__window_complete(s->win, e, NULL, FERRY_EBATCH, msg, ferry__now_ms());
}

/* The batch slot task e was sent with (if any) is no longer the worker's:
 * freed when the answer did not use it. Returns the slot, -1 for none. */
static int32_t answer_slot(ferry__scheduler *s, ferry__window_entry *e, int used)
{
    int32_t slot = e->shm_slot;
    e->shm_slot = -1;
    if (slot >= 0 && !used)
        ferry__shm_take_back(s->shm, slot);
    return slot;
}

/* Whether BATCH h's shared-memory claim holds: a batch in shared memory
 * must answer a task sent with a slot, and lie inside that slot. */
static int shm_matches(const ferry__scheduler *s, const ferry__batch_hdr *h,
                       const ferry__window_entry *e, char *why, size_t cap)
{
    if (!h->shm)
        return 1;
    if (e->shm_slot < 0) {
        snprintf(why, cap, "it says it is in shared memory, but its task had no slot");
        return 0;
    }
    if (ferry__batch_check_layout(h, ferry__shm_slot_bytes(s->shm)) != FERRY_OK) {
        snprintf(why, cap, "%s", ferry_last_error());
        return 0;
    }
    return 1;
}

/* The batch's backing: the payload frame, or the slot it was written in.
 * *data is where its fields' offsets start. FERRY_ENOMEM with nothing
 * taken. */
static int batch_backing(ferry__scheduler *s, const ferry__batch_hdr *h, int32_t slot,
                         zmq_msg_t *payload, ferry__batch_backing *backing, const void **data)
{
    if (!h->shm) {
        backing->release = ferry__zsock_payload_release;
        return ferry__zsock_payload_keep(payload, &backing->ctx, data);
    }
    uint64_t end = 0; /* where the batch's last field ends in the slot */
    for (uint32_t f = 0; f < h->nfields; f++)
        if (h->fields[f].offset + h->fields[f].nbytes > end)
            end = h->fields[f].offset + h->fields[f].nbytes;
    backing->release = ferry__shm_release;
    backing->ctx = ferry__shm_hold(s->shm, slot, end);
    *data = ferry__shm_data(s->shm, slot);
    return FERRY_OK;
}

static void on_batch(ferry__scheduler *s, sched_worker *w, zmq_msg_t *payload)
{
    const ferry__batch_hdr *h = &s->in.u.batch;
    ferry__window_entry *e = ferry__window_find(s->win, w->p.index, h->id);
    if (!e) {
        ferry__window_count(s->win, FERRY__STAT_STALE);
        return;
    }
    char why[256];
    if (!batch_matches(s, h, e, why, sizeof why) || !shm_matches(s, h, e, why, sizeof why)) {
        answer_slot(s, e, 0);
        on_wrong_batch(s, w, e, why);
        return;
    }
    int32_t slot = answer_slot(s, e, h->shm);
    uint64_t now = ferry__now_ns();
    ferry_batch_info info = {.epoch = e->t.epoch,
                             .batch_in_epoch = e->t.batch_in_epoch,
                             .seq = e->t.seq,
                             .size = e->t.count,
                             .last_in_epoch = e->t.last_in_epoch,
                             .worker = w->p.index,
                             .attempts = e->sends,
                             .make_ns = h->make_ns,
                             .flight_ns = now - e->sent_ns};
    ferry_tensor fields[FERRY_MAX_FIELDS];
    ferry__batch_backing backing;
    ferry_batch *b = NULL;
    const void *data;
    int rc = batch_backing(s, h, slot, payload, &backing, &data);
    if (rc == FERRY_OK) {
        field_views(h, data, fields); /* after the move: see payload_keep */
        rc = ferry__batch_new(&b, fields, (int)h->nfields, &info, e->indices, backing);
        if (rc != FERRY_OK) {
            backing.release(backing.ctx);
        } else {
            b->arrived_ns = now;
            b->shared = h->shm != 0;
        }
    }
    if (rc != FERRY_OK) {
        ferry__window_fail(s->win, FERRY_ENOMEM, "out of memory receiving a batch");
        return;
    }
    credit_worker(w);
    if (ferry__flow_reply(s->flow, w->p.index, now, h->make_ns, info.flight_ns,
                          ferry__window_full(s->win)))
        sched_flow_publish(s);
    w->p.rtt_ms = ferry__flow_round_trip_ms(s->flow, w->p.index);
    ferry__window_complete(s->win, e, b, 0, NULL, ferry__now_ms());
}

/* A remote host's dataset failed on task e (`what` says how): the host
 * has its own copy of the data (its disk, its mount, its decoder), so the
 * batch may well build elsewhere. It goes to another worker (charged an
 * attempt; see ferry__window_retry), and is filed as failed only when it
 * has used its attempts. Local workers share one dataset: their failures
 * are filed at once. Said for a host's first three such failures, then at
 * each power of two. 1 when e was sent on. */
static int retry_elsewhere(ferry__scheduler *s, sched_worker *w, ferry__window_entry *e,
                           const char *what)
{
    if (!ferry__window_retry(s->win, e, ferry__now_ms()))
        return 0;
    uint32_t n = ++w->fails_retried;
    if (ferry__log_nth(n, 3))
        ferry__logf(&s->log, FERRY_LOG_WARN,
                    "%s; the batch goes to another worker (%u such failures on this host so far)",
                    what, n);
    return 1;
}

static void on_fail(ferry__scheduler *s, sched_worker *w)
{
    const ferry__fail *f = &s->in.u.fail;
    ferry__window_entry *e = ferry__window_find(s->win, w->p.index, f->id);
    if (!e) {
        ferry__window_count(s->win, FERRY__STAT_STALE);
        return;
    }
    answer_slot(s, e, 0);
    char who[96], what[FERRY__ERRMSG_MAX];
    sched_describe(s, w, who, sizeof who);
    if (f->code == FERRY_ELIMIT) /* the batch as a whole: too large to send */
        snprintf(what, sizeof what, "%s could not send batch %llu (epoch %llu, batch %llu): %s",
                 who, (unsigned long long)e->t.seq, (unsigned long long)e->t.epoch,
                 (unsigned long long)e->t.batch_in_epoch, f->message);
    else
        snprintf(what, sizeof what, "%s failed on index %llu (epoch %llu, batch %llu): %s", who,
                 (unsigned long long)f->index, (unsigned long long)e->t.epoch,
                 (unsigned long long)e->t.batch_in_epoch, f->message);
    if (w->p.remote && f->code != FERRY_ELIMIT && retry_elsewhere(s, w, e, what))
        return;
    char *msg = ferry__malloc(FERRY__ERRMSG_MAX);
    if (msg)
        memcpy(msg, what, sizeof what);
    credit_worker(w);
    ferry__window_complete(s->win, e, NULL, f->code == FERRY_ERANGE ? FERRY_ERANGE : FERRY_EBATCH,
                           msg, ferry__now_ms());
}

/* The first message on a data connection: the ZAP handler let it in with
 * the session token of the remote slot whose worker it is (its user id),
 * so that worker's session goes on there from now on. The slot must still
 * be waiting for it: a token outlives no session. NULL when the message is
 * no such thing (stale). The worker hears at once that it got through. */
static sched_worker *bind_data(ferry__scheduler *s, void *sock, const ferry__ident *id)
{
    if (!s->remote || sock != ferry__remote_data_socket(s->remote))
        return NULL;
    int k = ferry__remote_token_owner(s->remote, id->user);
    if (k < 0)
        return NULL;
    sched_worker *w = &s->w[s->nlocal + (uint32_t)k];
    if (w->p.state != FERRY__PEER_CONFIGURED || w->p.sock == sock)
        return NULL;
    w->p.sock = sock;
    w->p.ident = *id;
    if (sched_send_simple(s, w, FERRY__MSG_HEARTBEAT) == FERRY_OK)
        w->p.sent_ms = ferry__now_ms();
    return w;
}

/* A message that only a ready worker may send. */
static int ready_or_malformed(ferry__scheduler *s, const sched_worker *w)
{
    if (w->p.state == FERRY__PEER_READY)
        return 1;
    ferry__window_count(s->win, FERRY__STAT_MALFORMED);
    return 0;
}

static void on_message(ferry__scheduler *s, void *sock, const ferry__ident *id, zmq_msg_t *payload)
{
    if (s->in.type == FERRY__MSG_HELLO) {
        on_hello(s, sock, id);
        return;
    }
    if (s->remote && sock == ferry__remote_socket(s->remote) && ferry__remote_data_socket(s->remote)) {
        /* On plain TCP the HELLO socket takes HELLO and nothing else. */
        ferry__window_count(s->win, FERRY__STAT_MALFORMED);
        return;
    }
    sched_worker *w = find_by_ident(s, sock, id);
    if (!w)
        w = bind_data(s, sock, id);
    if (!w) {
        ferry__window_count(s->win, FERRY__STAT_STALE);
        return;
    }
    w->p.heard_ms = ferry__now_ms();
    switch (s->in.type) {
    case FERRY__MSG_READY:
        on_ready(s, w);
        break;
    case FERRY__MSG_BATCH:
        if (ready_or_malformed(s, w))
            on_batch(s, w, payload);
        break;
    case FERRY__MSG_FAIL:
        if (ready_or_malformed(s, w))
            on_fail(s, w);
        break;
    case FERRY__MSG_BYE:
        if (w->p.remote && !s->closing)
            ferry__sched_lose_remote(s, w, "it said BYE", FERRY__CHARGE_NONE, 0);
        else if (s->in.u.bye.retired && !w->p.remote && !s->closing &&
                 w->p.state == FERRY__PEER_READY)
            ferry__sched_on_retire(s, w);
        else
            w->p.state = FERRY__PEER_GONE;
        break;
    case FERRY__MSG_HEARTBEAT:
        break;
    default:
        ferry__window_count(s->win, FERRY__STAT_MALFORMED);
        break;
    }
}

/* A message that did not decode (ferry_last_error says why), from `id` on
 * sock: counted. One from an admitted remote worker is charged to it as a
 * wrong batch is: the message may have been the answer to one of its
 * tasks, which would otherwise wait for it forever (the worker still
 * heartbeats), so it is given up and its tasks go to the others, its
 * oldest charged an attempt. From anyone else it is only counted: nothing
 * of the run waits on them. */
static void on_malformed(ferry__scheduler *s, void *sock, const ferry__ident *id)
{
    ferry__window_count(s->win, FERRY__STAT_MALFORMED);
    sched_worker *w = id->len ? find_by_ident(s, sock, id) : NULL;
    if (!w || !w->p.remote || w->p.state != FERRY__PEER_READY)
        return;
    char why[FERRY__ERRMSG_MAX];
    snprintf(why, sizeof why, "it sent a message that does not decode: %s", ferry_last_error());
    ferry__sched_lose_remote(s, w, why, FERRY__CHARGE_OLDEST, 0);
}

/* Under CURVE, the seal of the session whose data connection `from` is
 * (zsock.h's opener); NULL when that session has ended. */
static ferry__seal *sender_seal(void *arg, const ferry__ident *from)
{
    ferry__scheduler *s = arg;
    int k = ferry__remote_token_owner(s->remote, from->user);
    return k < 0 ? NULL : ferry__remote_seal(s->remote, (uint32_t)k);
}

/* Reads what is waiting on the socket, at most `budget` messages so the
 * loop also gets round to dispatching and to the pidfds. */
void ferry__sched_drain(ferry__scheduler *s, void *sock, int budget)
{
    ferry__zsock_opener sealed = {.seal_of = sender_seal, .arg = s};
    const ferry__zsock_opener *open =
        s->remote && !s->cfg.insecure && sock == ferry__remote_data_socket(s->remote) ? &sealed
                                                                                     : NULL;
    while (budget-- > 0) {
        ferry__ident id;
        id.len = 0;
        zmq_msg_t payload;
        int rc = ferry__zsock_recv(sock, &id, open, &s->in, &payload, ZMQ_DONTWAIT);
        if (rc == FERRY_EPROTO) {
            on_malformed(s, sock, &id);
            continue;
        }
        if (rc == FERRY_ECLOSED) { /* from a session that has ended */
            ferry__window_count(s->win, FERRY__STAT_STALE);
            continue;
        }
        if (rc != FERRY_OK)
            return; /* EAGAIN: nothing more */
        on_message(s, sock, &id, &payload);
        zmq_msg_close(&payload);
    }
}
