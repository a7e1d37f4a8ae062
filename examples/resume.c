/*
 * resume.c - saving a loader's position and resuming from it.
 *
 * A first loader delivers SAVE_AT batches and saves its position with
 * ferry_loader_state(). A second loader, opened with that state through
 * ferry_config_set_state(), starts right after it and reads to the end of
 * the stream. In a real job the state is saved with each checkpoint and read
 * back by the next process. The exit status is 0 only if the second loader
 * went on at batch SAVE_AT and every batch up to the end arrived.
 */
#include <ferry.h>
#include <inttypes.h>
#include <stdio.h>

#define SAVE_AT 10
#define TOTAL 40 /* max_batches: where the stream ends */

static int failed(const char *what, int rc)
{
    fprintf(stderr, "resume: %s: %s: %s\n", what, ferry_err_name(rc), ferry_last_error());
    return 1;
}

/* Opens a loader on cfg and takes batches until seq `stop` (or the end of
 * the stream), each of which must be the next from `first`. With `state`,
 * then saves the position after the last batch delivered into it. Returns
 * the exit status; the seq it stopped at in *end. */
static int take(const ferry_config *cfg, uint64_t first, uint64_t stop, unsigned char *state,
                size_t *len, uint64_t *end)
{
    ferry_loader *ld;
    int rc = ferry_loader_open(&ld, cfg);
    if (rc != FERRY_OK)
        return failed("open", rc);
    int status = 0;
    uint64_t seq = first, skipped = 0;
    ferry_batch *b;
    while (status == 0 && seq < stop && (rc = ferry_loader_next(ld, &b)) != FERRY_EOF) {
        if (rc == FERRY_EBATCH || rc == FERRY_ERANGE) { /* that batch failed; the stream goes on */
            fprintf(stderr, "resume: skipped: %s\n", ferry_last_error());
            skipped++;
            seq++;
            continue;
        }
        if (rc != FERRY_OK) { /* the loader cannot go on */
            status = failed("next", rc);
            break;
        }
        ferry_batch_info info;
        ferry_batch_get_info(b, &info);
        ferry_batch_release(b);
        if (info.seq != seq++) {
            fprintf(stderr, "resume: batch %" PRIu64 " came where %" PRIu64 " was due\n", info.seq,
                    seq - 1);
            status = 1;
        }
    }
    if (status == 0 && skipped > 0) {
        fprintf(stderr, "resume: %" PRIu64 " batches skipped\n", skipped);
        status = 1;
    }
    if (status == 0 && state &&
        (rc = ferry_loader_state(ld, state, FERRY_STATE_MAX, len)) != FERRY_OK)
        status = failed("state", rc);
    if ((rc = ferry_loader_close(ld)) != FERRY_OK)
        status = failed("close", rc);
    *end = seq;
    return status;
}

int main(void)
{
    ferry_config *cfg = ferry_config_new();
    if (cfg == NULL) {
        fprintf(stderr, "resume: out of memory\n");
        return 1;
    }
    int rc;
    if ((rc = ferry_config_set(cfg, "dataset", "synthetic:n=2000,dim=16")) != FERRY_OK ||
        (rc = ferry_config_set_int(cfg, "batch_size", 64)) != FERRY_OK ||
        (rc = ferry_config_set_int(cfg, "seed", 7)) != FERRY_OK ||
        (rc = ferry_config_set_int(cfg, "max_batches", TOTAL)) != FERRY_OK) {
        ferry_config_free(cfg);
        return failed("config", rc);
    }

    unsigned char state[FERRY_STATE_MAX]; /* a few integers: save it with the checkpoint */
    size_t len = 0;
    uint64_t end = 0;
    int status = take(cfg, 0, SAVE_AT, state, &len, &end);
    /* ... later, in a new process, with the state read back ... */
    if (status == 0 && (rc = ferry_config_set_state(cfg, state, len)) != FERRY_OK)
        status = failed("set_state", rc);
    if (status == 0)
        status = take(cfg, SAVE_AT, UINT64_MAX, NULL, NULL, &end);
    ferry_config_free(cfg);
    if (status == 0 && end != TOTAL) {
        fprintf(stderr, "resume: the stream ended at batch %" PRIu64 ", not %d\n", end, TOTAL);
        status = 1;
    }
    if (status == 0)
        printf("resume: saved after %d batches, resumed at batch %d, ended at %d\n", SAVE_AT,
               SAVE_AT, TOTAL);
    return status;
}
