/*
 * supervise.c - what a worker's death, silence or timeout means for the run
 * (see sched_internal.h). A dead local worker's tasks go back to the window
 * (the one it was on charged an attempt) and the slot is started again
 * under the restart policy; a remote worker gone silent is given up and its
 * slot freed; a worker past timeout_ms is killed (local) or given up
 * (remote); a loader that cannot start, or is left with no worker, fails
 * with a sentence that says why. A local worker that retired (retire.h)
 * goes the same way as a dead one, but as planned: nothing is charged or
 * counted against it, under either policy, and it is said at info level.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <inttypes.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "process.h"
#include "sched_internal.h"

#define SETTLE_MS 500 /* the longest a dead worker's last replies are waited for */

/* A worker's death (or a remote worker's lost connection) is acted on (its
 * tasks requeued, the one it was on charged) only once every reply it sent
 * before going has been read, or the charge would fall on a batch it had
 * already answered. Its routing id is probed: while ZeroMQ still holds its
 * pipe (a send succeeds, or fails with EAGAIN), replies may still be in it
 * and are filed as usual; once the send fails with EHOSTUNREACH the pipe
 * has ended after its last message. Bounded by SETTLE_MS. */
static void start_settling(ferry__scheduler *s, sched_worker *w)
{
    w->p.unreachable = 1; /* no task goes to it meanwhile */
    if (w->settling)
        return;
    w->settling = 1;
    w->settle_by_ms = ferry__now_ms() + SETTLE_MS;
    s->settling++;
}

static void stop_settling(ferry__scheduler *s, sched_worker *w)
{
    if (!w->settling)
        return;
    w->settling = 0;
    s->settling--;
}

void ferry__sched_on_death(ferry__scheduler *s, const ferry__pool_event *ev)
{
    sched_worker *w = &s->w[ev->index];
    w->death = *ev;
    start_settling(s, w);
}

void ferry__sched_on_disconnect(ferry__scheduler *s, sched_worker *w, const char *why)
{
    snprintf(w->gone_why, sizeof w->gone_why, "%s", why);
    start_settling(s, w);
}

void ferry__sched_on_send_failure(ferry__scheduler *s, sched_worker *w, int err)
{
    char why[128];
    if (err == EHOSTUNREACH) /* ZeroMQ's word for a peer whose connection has closed */
        snprintf(why, sizeof why,
                 "its connection closed (the process exited or was killed, or the link dropped)");
    else
        snprintf(why, sizeof why, "its connection failed (%s)", ferry_last_error());
    ferry__sched_on_disconnect(s, w, why);
}

void ferry__sched_on_parent_death(ferry__scheduler *s, const ferry__pool_event *ev)
{
    if (s->closing)
        return;
    char how[256], msg[FERRY__ERRMSG_MAX];
    if (ev->status == -1)
        snprintf(how, sizeof how, "exited (its exit status is unknown)");
    else
        ferry__describe_status(ev->status, how, sizeof how);
    snprintf(msg, sizeof msg, "the workers' clean parent (pid %d) %s%s%s", (int)ev->pid, how,
             ev->words[0] ? "; its last words: " : "", ev->words);
    /* Before open too: the workers it forked go on, and the next one forks
     * those it had not (a clean parent killed as the loader opens). */
    if (s->cfg.on_worker_failure == FERRY__ON_FAILURE_FAIL ||
        ferry__window_phase(s->win) == FERRY__PHASE_FAILED) {
        ferry__window_fail(s->win, FERRY_EWORKER, msg);
        return;
    }
    ferry__window_count(s->win, FERRY__STAT_RESTARTS);
    ferry__logf(&s->log, FERRY_LOG_WARN, "%s; starting another (the workers go on)", msg);
    ferry__pool_parent_restart(s->pool);
}

/* The death message: who, how, and what it said last. */
static void death_message(const sched_worker *w, ferry__peer_state was, char *msg, size_t cap)
{
    char how[256];
    const ferry__pool_event *ev = &w->death;
    if (ev->status == -1)
        snprintf(how, sizeof how,
                 "exited; its exit status is unknown (the program ignores SIGCHLD or reaps "
                 "children itself)");
    else if (ev->kill_reason[0] && WIFSIGNALED(ev->status)) {
        char sig[32];
        snprintf(how, sizeof how, "was killed by ferry (%s)",
                 ferry__signal_name(WTERMSIG(ev->status), sig, sizeof sig));
    } else
        ferry__describe_status(ev->status, how, sizeof how);
    snprintf(msg, cap, "worker %u (pid %d) %s%s%s%s%s%s", w->p.index, (int)ev->pid, how,
             was == FERRY__PEER_SPAWNED || was == FERRY__PEER_CONFIGURED ? " while starting" : "",
             ev->kill_reason[0] ? " because " : "", ev->kill_reason,
             ev->words[0] ? "; its last words: " : "", ev->words);
}

#define RESTART_DELAY_MIN_MS 100
#define RESTART_DELAY_MAX_MS 2000

/* Starts local worker w's replacement. One that cannot be started now (the
 * fd table full, say, or memory short) is tried again later, the delay
 * doubling up to RESTART_DELAY_MAX_MS, while the other workers serve:
 * what is short now is usually back soon, and a loader that still has
 * workers has no reason to fail. check_restarts fails it once no worker is
 * left to serve and this one has been down for start_timeout_ms. */
static void try_restart(ferry__scheduler *s, sched_worker *w, uint64_t now)
{
    int rc = ferry__pool_start(s->pool, w->p.index);
    if (rc == FERRY_OK) {
        if (w->restart_tries)
            ferry__logf(&s->log, FERRY_LOG_INFO,
                        "worker %u started again after %u failed tries (%llu ms)", w->p.index,
                        w->restart_tries, (unsigned long long)(now - w->down_since_ms));
        w->restart_at_ms = 0;
        w->restart_tries = 0;
        w->p.state = FERRY__PEER_SPAWNED;
        return;
    }
    if (!w->restart_tries++)
        w->down_since_ms = now;
    w->restart_rc = rc;
    snprintf(w->restart_err, sizeof w->restart_err, "%s", ferry_last_error());
    uint32_t d = w->restart_delay_ms * 2;
    w->restart_delay_ms = d < RESTART_DELAY_MIN_MS   ? RESTART_DELAY_MIN_MS
                          : d > RESTART_DELAY_MAX_MS ? RESTART_DELAY_MAX_MS
                                                     : d;
    w->restart_at_ms = now + w->restart_delay_ms;
    if (ferry__log_nth(w->restart_tries, 1))
        ferry__logf(&s->log, FERRY_LOG_WARN,
                    "could not start worker %u again (%u tries so far): %s; trying again in "
                    "%u ms (%u other workers serve meanwhile)",
                    w->p.index, w->restart_tries, w->restart_err, w->restart_delay_ms,
                    ferry__window_add_workers(s->win, 0));
}

/* ------------------------------------------------------------------------
 * Retirement: a worker that leaves on purpose (retire.h)
 */

void ferry__sched_on_retire(ferry__scheduler *s, sched_worker *w)
{
    w->retired = s->in.u.bye;
    w->p.unreachable = 1; /* it takes no task more: it is on its way out */
    /* Its dataset closes and its sockets flush (200 ms at most): a process
     * still there after close_grace_ms is stuck in teardown. */
    w->retire_by_ms = ferry__now_ms() + (uint64_t)s->cfg.close_grace_ms + 500;
}

/* "2.10 GiB", "312.43 MiB", "900 KiB": two decimals, so a figure just past
 * the budget does not read as the budget. */
static const char *human_bytes(uint64_t b, char *buf, size_t cap)
{
    static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB"};
    double v = (double)b / 1024;
    int u = 0;
    while (v >= 1024 && u < 3) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
    return buf;
}

/* What retired worker w did and why: "worker 3 (pid 77) retired after 812
 * batches at 2.10 GiB of private memory (worker_max_rss_bytes 2.00 GiB)". A
 * process the pool had to kill, or that did not end cleanly after its
 * BYE, is said so. */
static void retirement_message(const ferry__scheduler *s, const sched_worker *w, char *msg,
                               size_t cap)
{
    const ferry__bye *r = &w->retired;
    const ferry__pool_event *ev = &w->death;
    char rss[32], budget[32], why[96], how[300] = "";
    if (r->retired == FERRY__RETIRE_MEMORY)
        snprintf(why, sizeof why, " at %s of private memory (worker_max_rss_bytes %s)",
                 human_bytes(r->rss, rss, sizeof rss),
                 human_bytes((uint64_t)s->cfg.worker_max_rss_bytes, budget, sizeof budget));
    else if (r->rss)
        snprintf(why, sizeof why, " (max_batches_per_worker), at %s of private memory",
                 human_bytes(r->rss, rss, sizeof rss));
    else
        snprintf(why, sizeof why, " (max_batches_per_worker)");
    if (ev->kill_reason[0])
        snprintf(how, sizeof how, "; it was killed because %s", ev->kill_reason);
    else if (ev->status != -1 && !(WIFEXITED(ev->status) && WEXITSTATUS(ev->status) == 0)) {
        char st[256];
        ferry__describe_status(ev->status, st, sizeof st);
        snprintf(how, sizeof how, "; then it %s", st);
    }
    snprintf(msg, cap, "worker %u (pid %d) retired after %" PRIu64 " batch%s%s%s", w->p.index,
             (int)ev->pid, r->batches, r->batches == 1 ? "" : "es", why, how);
}

/* The settled exit of local worker w, which had retired: what it had been
 * sent and not answered (tasks queued behind its last batch, never
 * started) goes back to the window uncharged, and the slot is started
 * again, whatever the failure policy: nothing failed. */
static void replace_retired(ferry__scheduler *s, sched_worker *w)
{
    char msg[FERRY__ERRMSG_MAX];
    retirement_message(s, w, msg, sizeof msg);
    w->retire_by_ms = 0;
    /* Counted before the requeue, as a restart is (handle_death). */
    ferry__window_count(s->win, FERRY__STAT_RETIREMENTS);
    ferry__window_requeue(s->win, w->p.index, FERRY__CHARGE_NONE, 0, msg);
    /* Over budget after its first batch: a fresh worker holds about that
     * much already, and every batch would cost a process. */
    int early = w->retired.retired == FERRY__RETIRE_MEMORY && w->retired.batches <= 1;
    if (early && ferry__log_nth(++s->early_retirements, 1))
        ferry__logf(&s->log, FERRY_LOG_WARN,
                    "%s; a fresh worker holds about that much already, so each batch "
                    "costs a new process: raise worker_max_rss_bytes (%llu such retirements so "
                    "far)",
                    msg, (unsigned long long)s->early_retirements);
    else
        ferry__logf(&s->log, FERRY_LOG_INFO, "%s; starting a replacement", msg);
    w->retired = (ferry__bye){0};
    w->p.delivered_any = 0;
    w->p.failed_starts = 0;
    w->p.ident.len = 0;
    w->p.unreachable = 0;
    w->restart_tries = 0;
    w->restart_delay_ms = 0;
    try_restart(s, w, ferry__now_ms());
}

/* The settled death of local worker w: its tasks go back to the window
 * (the one it was on charged), and under the restart policy the slot is
 * started again, unless it keeps dying without delivering anything. */
static void handle_death(ferry__scheduler *s, sched_worker *w)
{
    ferry__peer_state was = w->p.state;
    w->p.state = FERRY__PEER_GONE;
    /* Its process is reaped, so nothing writes to the slots it was given
     * any more: they are free for the tasks sent again. What it delivered
     * is held by batches and stays. */
    if (s->shm)
        ferry__shm_reclaim(s->shm, w->p.index);
    if (s->closing)
        return;
    char msg[FERRY__ERRMSG_MAX];
    death_message(w, was, msg, sizeof msg);
    if (was == FERRY__PEER_READY)
        sched_unready(s, w);
    if (w->retired.retired) {
        if (ferry__window_phase(s->win) == FERRY__PHASE_RUNNING)
            replace_retired(s, w);
        return;
    }
    /* Before open, a worker that dies still starting is a failed start (its
     * dataset crashed as it opened, say: the next would too), unless it was
     * SIGKILLed from outside (the OOM killer as the workers start, a user):
     * that one, and one that was ready (serving the first tasks while
     * others start), is replaced as after open. Before the first READY
     * (phase STARTING) no task is out to requeue. */
    ferry__phase ph = ferry__window_phase(s->win);
    int failed_start = !s->opened && was != FERRY__PEER_READY &&
        !(ferry__sigkilled(w->death.status) && !w->death.kill_reason[0]);
    if (failed_start || ph == FERRY__PHASE_FAILED ||
        s->cfg.on_worker_failure == FERRY__ON_FAILURE_FAIL) {
        ferry__window_fail(s->win, FERRY_EWORKER, msg);
        return;
    }
    /* Decided and counted before the requeue: the requeue may finish the
     * stream (a poison batch given up), and a trainer that then reads the
     * stats must find this death's restart counted. */
    int hopeless = !w->p.delivered_any && ++w->p.failed_starts > (uint32_t)s->cfg.max_attempts + 2;
    if (hopeless) {
        char m2[FERRY__ERRMSG_MAX];
        snprintf(m2, sizeof m2,
                 "worker %u died %u times in a row without delivering a batch; the last: %s",
                 w->p.index, w->p.failed_starts, msg);
        ferry__window_fail(s->win, FERRY_EWORKER, m2);
        return;
    }
    ferry__window_count(s->win, FERRY__STAT_RESTARTS);
    /* Charged to the task its word names; none when it died between tasks
     * (killed from outside, say). */
    uint64_t task = w->death.task;
    if (ph == FERRY__PHASE_RUNNING)
        ferry__window_requeue(s->win, w->p.index, task ? FERRY__CHARGE_TASK : FERRY__CHARGE_NONE,
                              task - 1, msg);
    ferry__logf(&s->log, FERRY_LOG_WARN, "%s; starting a replacement", msg);
    w->p.delivered_any = 0;
    w->p.ident.len = 0;
    w->p.unreachable = 0;
    w->restart_tries = 0;
    w->restart_delay_ms = 0;
    try_restart(s, w, ferry__now_ms());
}

static void settle_one(ferry__scheduler *s, sched_worker *w)
{
    if (!w->settling)
        return;
    if (!s->closing && w->p.ident.len && ferry__now_ms() < w->settle_by_ms) {
        if (sched_send_simple(s, w, FERRY__MSG_HEARTBEAT) == FERRY_OK || errno != EHOSTUNREACH)
            return;
    }
    stop_settling(s, w);
    if (w->p.remote)
        /* Charged: a remote process that crashed on a batch looks just like
         * this, and a poison batch must still be given up. */
        ferry__sched_lose_remote(s, w, w->gone_why, FERRY__CHARGE_OLDEST, 0);
    else
        handle_death(s, w);
}

void ferry__sched_settle(ferry__scheduler *s)
{
    for (uint32_t i = 0; s->settling && i < s->nworkers; i++)
        settle_one(s, &s->w[i]);
}

void ferry__sched_end_remote(ferry__scheduler *s, sched_worker *w)
{
    free(w->held_ready);
    w->held_ready = NULL;
    w->fails_retried = 0;
    w->p.state = FERRY__PEER_EMPTY;
    w->p.ident.len = 0;
    ferry__remote_token_revoke(s->remote, w->p.index - s->nlocal);
}

/* A remote worker is given up: gone silent past heartbeat_ms x liveness (a
 * cut link, a frozen host, a stopped process), unreachable, past its
 * timeout, or it said BYE. Its tasks go to the others, exactly like a dead
 * local worker's: the batch it was on is charged unless it said BYE
 * (silence or a dropped connection may be a crash on that batch). Its slot
 * is free for the next remote worker, and anything it sends later is
 * dropped as stale (its routing id is no longer known). */
void ferry__sched_lose_remote(ferry__scheduler *s, sched_worker *w, const char *why,
                              ferry__charge charge, uint64_t id)
{
    char who[96], msg[FERRY__ERRMSG_MAX];
    sched_describe(s, w, who, sizeof who);
    snprintf(msg, sizeof msg, "%s left: %s", who, why);
    ferry__peer_state was = w->p.state;
    stop_settling(s, w); /* a BYE or a new session settles it too */
    ferry__sched_end_remote(s, w);
    if (was == FERRY__PEER_READY) {
        sched_unready(s, w);
        ferry__window_count(s->win, FERRY__STAT_LOST);
    }
    /* Under the fail policy the failure goes first, so the trainer never
     * sees a batch given up by this requeue before the reason for it. */
    if (charge != FERRY__CHARGE_NONE && was == FERRY__PEER_READY &&
        s->cfg.on_worker_failure == FERRY__ON_FAILURE_FAIL)
        ferry__window_fail(s->win, FERRY_EWORKER, msg);
    ferry__window_requeue(s->win, w->p.index, charge, id, msg);
    if (was == FERRY__PEER_READY && !s->closing)
        ferry__logf(&s->log, FERRY_LOG_WARN, "%s", msg);
}

/* ------------------------------------------------------------------------
 * Deadlines
 */

static void check_start_deadline(ferry__scheduler *s, uint64_t now)
{
    if (now < s->start_deadline_ms)
        return;
    ferry_stats st;
    ferry__window_stats(s->win, &st);
    uint32_t local_ready = 0;
    for (uint32_t i = 0; i < s->nlocal; i++)
        local_ready += s->w[i].p.state == FERRY__PEER_READY;
    char msg[FERRY__ERRMSG_MAX];
    if (s->remote)
        snprintf(msg, sizeof msg,
                 "only %u workers were ready after %lld ms (%u of %u local, %u remote on %s); "
                 "open waits for %u local workers and min_workers %u in all%s%s",
                 st.workers, (long long)s->cfg.start_timeout_ms, local_ready, s->nlocal,
                 st.workers - local_ready, ferry__remote_endpoint(s->remote), s->open_local,
                 s->min_workers,
                 s->last_refusal[0] ? "; the last remote worker refused: " : "",
                 s->last_refusal);
    else
        snprintf(msg, sizeof msg, "only %u of %u workers were ready after %lld ms", st.workers,
                 s->nworkers, (long long)s->cfg.start_timeout_ms);
    ferry__window_fail(s->win, FERRY_ETIMEDOUT, msg);
}

/* With no worker at all (every remote host gone, and no local ones, which
 * are replaced under their own limits), next() would wait forever: after
 * start_timeout_ms of that the loader fails. */
static void check_idle(ferry__scheduler *s, uint64_t now)
{
    if (s->nlocal || ferry__window_add_workers(s->win, 0))
        return;
    if (!s->idle_since_ms) {
        s->idle_since_ms = now;
    } else if (now - s->idle_since_ms >= (uint64_t)s->cfg.start_timeout_ms) {
        char msg[256];
        snprintf(msg, sizeof msg, "no worker has been ready for %llu ms (start_timeout_ms)",
                 (unsigned long long)(now - s->idle_since_ms));
        ferry__window_fail(s->win, FERRY_ETIMEDOUT, msg);
    }
}

/* A local worker past timeout_ms on its current task: under restart
 * (process workers) it is killed, and its death requeues the task;
 * otherwise the loader fails with a timeout naming the worker and the
 * task. A remote one cannot be killed from here: it is given up. */
static void on_timeout(ferry__scheduler *s, sched_worker *w, const ferry__window_entry *cur,
                       uint64_t busy_ms)
{
    char who[96], why[256], msg[FERRY__ERRMSG_MAX];
    ferry__window_count(s->win, FERRY__STAT_TIMEOUTS);
    if (w->p.remote) {
        snprintf(why, sizeof why, "it spent %llu ms on one batch, past timeout_ms %lld",
                 (unsigned long long)busy_ms, (long long)s->cfg.timeout_ms);
        ferry__sched_lose_remote(s, w, why, FERRY__CHARGE_OLDEST, 0);
        return;
    }
    snprintf(why, sizeof why,
             "it spent %llu ms on batch %llu (epoch %llu, batch %llu), past timeout_ms %lld",
             (unsigned long long)busy_ms, (unsigned long long)cur->t.seq,
             (unsigned long long)cur->t.epoch, (unsigned long long)cur->t.batch_in_epoch,
             (long long)s->cfg.timeout_ms);
    if (s->cfg.on_worker_failure == FERRY__ON_FAILURE_RESTART &&
        ferry__pool_kill(s->pool, w->p.index, why))
        return;
    sched_describe(s, w, who, sizeof who);
    snprintf(msg, sizeof msg, "%s timed out: %s", who, why);
    ferry__window_fail(s->win, FERRY_ETIMEDOUT, msg);
}

static void check_timeouts(ferry__scheduler *s, uint64_t now)
{
    for (uint32_t i = 0; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        uint64_t since;
        const ferry__window_entry *cur;
        if (w->p.state != FERRY__PEER_READY || w->settling ||
            (!w->p.remote && ferry__pool_killing(s->pool, i)) ||
            !(cur = ferry__window_current(s->win, i, &since)) ||
            now - since < (uint64_t)s->cfg.timeout_ms)
            continue;
        on_timeout(s, w, cur, now - since);
        if (ferry__window_phase(s->win) != FERRY__PHASE_RUNNING)
            return;
    }
}

/* Replacements due another try (see try_restart). With no worker left to
 * serve, one down for start_timeout_ms fails the loader: nothing else
 * would. With pin_tasks the others cannot serve its tasks (the stream
 * waits for them), so it fails the loader whatever else is alive. */
static void check_restarts(ferry__scheduler *s, uint64_t now)
{
    for (uint32_t i = 0; i < s->nlocal; i++) {
        sched_worker *w = &s->w[i];
        if (!w->restart_at_ms || now < w->restart_at_ms)
            continue;
        try_restart(s, w, now);
        if (!w->restart_at_ms ||
            (!s->cfg.pin_tasks && ferry__window_add_workers(s->win, 0)) ||
            now - w->down_since_ms < (uint64_t)s->cfg.start_timeout_ms)
            continue;
        char msg[FERRY__ERRMSG_MAX];
        snprintf(msg, sizeof msg,
                 "%s, and worker %u could not be started again in %llu ms (%u tries; "
                 "start_timeout_ms %lld): %s",
                 s->cfg.pin_tasks ? "its tasks are pinned to it (pin_tasks)"
                                  : "no worker is left to serve",
                 w->p.index, (unsigned long long)(now - w->down_since_ms), w->restart_tries,
                 (long long)s->cfg.start_timeout_ms, w->restart_err);
        ferry__window_fail(s->win, w->restart_rc, msg);
        return;
    }
}

/* A worker that retired and has not exited by retire_by_ms (stuck closing
 * its dataset, say) is killed; its death is still a retirement. */
static void check_retiring(ferry__scheduler *s, uint64_t now)
{
    for (uint32_t i = 0; i < s->nlocal; i++) {
        sched_worker *w = &s->w[i];
        if (!w->retired.retired || w->settling || now < w->retire_by_ms)
            continue;
        char why[128];
        snprintf(why, sizeof why, "it retired but had not exited %lld ms later",
                 (long long)s->cfg.close_grace_ms + 500);
        ferry__pool_kill(s->pool, i, why);
    }
}

/* A replacement that does not get ready (stopped, stuck opening the
 * dataset) is killed; its death counts as a failed start. */
static void check_replacements(ferry__scheduler *s, uint64_t now)
{
    for (uint32_t i = 0; i < s->nlocal; i++) {
        ferry__peer_state st = s->w[i].p.state;
        if (st != FERRY__PEER_SPAWNED && st != FERRY__PEER_CONFIGURED)
            continue;
        if (ferry__pool_ready_overdue(s->pool, i, now)) {
            char why[128];
            snprintf(why, sizeof why, "it was not ready within start_timeout_ms %lld",
                     (long long)s->cfg.start_timeout_ms);
            ferry__pool_kill(s->pool, i, why);
        } else if (ferry__pool_start_overdue(s->pool, i, now)) {
            /* No process to kill and start again (the clean parent never
             * forked it, or a thread is stuck opening the dataset): the
             * loader fails, as open did when it waited for every worker. */
            char msg[FERRY__ERRMSG_MAX];
            snprintf(msg, sizeof msg,
                     "worker %u was not ready within start_timeout_ms %lld (%s)", i,
                     (long long)s->cfg.start_timeout_ms,
                     s->cfg.fork_server ? "its clean parent never forked it"
                                        : "its thread is still opening the dataset");
            ferry__window_fail(s->win, FERRY_ETIMEDOUT, msg);
            return;
        }
    }
}

/* A HEARTBEAT to remote worker w now. A failed send gives it up; a probe
 * (only looking for closed connections) gives it up only when its
 * connection has closed, not when its queue is full (EAGAIN: a busy
 * worker that probes keep sending to). */
static void send_heartbeat(ferry__scheduler *s, sched_worker *w, uint64_t now, int probe)
{
    /* Not yet on its data connection: the HELLO one is closed. */
    if (ferry__remote_data_socket(s->remote) && w->p.sock != ferry__remote_data_socket(s->remote))
        return;
    if (sched_send_simple(s, w, FERRY__MSG_HEARTBEAT) == FERRY_OK)
        w->p.sent_ms = now;
    else if (!probe || errno == EHOSTUNREACH)
        ferry__sched_on_send_failure(s, w, errno);
}

/* ZeroMQ drops a closed connection's pipe a little after it reports the
 * close, and until then a send to it succeeds: the probe is repeated after
 * 1, 2, 4 ... PROBE_MAX_MS. A close during a run of probes brings the next
 * one forward, and starts the run again when it began PROBE_LADDER_EVERY_MS
 * ago or more: a stream of closes (a flood's connections timing out) costs
 * a run every 100 ms at most, and a worker's close during a run is probed
 * at once and then at the run's next steps. */
#define PROBE_MAX_MS 256
#define PROBE_LADDER_EVERY_MS 100

void ferry__sched_probe_remote(ferry__scheduler *s)
{
    unsigned n = atomic_load(&s->closed_conns);
    uint64_t now = ferry__now_ms();
    if (n != s->closed_seen) {
        s->closed_seen = n;
        if (!s->probe_at_ms || now - s->probe_ladder_ms >= PROBE_LADDER_EVERY_MS) {
            s->probe_delay_ms = 0;
            s->probe_ladder_ms = now;
        }
        s->probe_at_ms = now;
    }
    if (!s->probe_at_ms || now < s->probe_at_ms)
        return;
    s->probe_delay_ms = s->probe_delay_ms ? s->probe_delay_ms * 2 : 1;
    s->probe_at_ms = s->probe_delay_ms > PROBE_MAX_MS ? 0 : now + s->probe_delay_ms;
    for (uint32_t i = s->nlocal; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        if ((w->p.state == FERRY__PEER_CONFIGURED || w->p.state == FERRY__PEER_READY) &&
            !w->settling)
            send_heartbeat(s, w, now, 1);
    }
}

/* Remote liveness, both ways: a HEARTBEAT to each remote worker that has
 * been sent nothing for heartbeat_ms, and the loss of any that has said
 * nothing for heartbeat_ms x liveness. */
static void check_remote(ferry__scheduler *s, uint64_t now)
{
    for (uint32_t i = s->nlocal; i < s->nworkers; i++) {
        sched_worker *w = &s->w[i];
        if ((w->p.state != FERRY__PEER_CONFIGURED && w->p.state != FERRY__PEER_READY) ||
            w->settling)
            continue;
        char why[160];
        switch (ferry__remote_liveness(s->remote, &w->p, now, why, sizeof why)) {
        case FERRY__LIVE_LOST:
            ferry__sched_lose_remote(s, w, why, FERRY__CHARGE_OLDEST, 0);
            break;
        case FERRY__LIVE_HEARTBEAT:
            send_heartbeat(s, w, now, 0);
            break;
        case FERRY__LIVE_OK:
            break;
        }
    }
}

void ferry__sched_check_deadlines(ferry__scheduler *s)
{
    uint64_t now = ferry__now_ms();
    ferry__phase ph = ferry__window_phase(s->win);
    if (!s->opened && ph != FERRY__PHASE_FAILED)
        check_start_deadline(s, now);
    if (ph == FERRY__PHASE_RUNNING) {
        check_idle(s, now);
        check_restarts(s, now);
        check_replacements(s, now);
        check_retiring(s, now);
        if (s->cfg.timeout_ms > 0 && s->opened) /* before: a start that failed */
            check_timeouts(s, now);
    }
    if (s->remote && ferry__window_phase(s->win) != FERRY__PHASE_FAILED)
        check_remote(s, now);
}
