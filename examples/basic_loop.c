/*
 * basic_loop.c - a complete training loop over ferry: open a loader, take
 * every batch of a few epochs, read its fields, close.
 *
 *     basic_loop [DATASET]
 *
 * DATASET is the built-in synthetic dataset unless given; any dataset whose
 * items have fields "x" and "y" will do (the example plugin's, for one).
 * Every call that can fail is checked. A batch the dataset failed on
 * (FERRY_EBATCH, FERRY_ERANGE) is reported and skipped, and the run goes on
 * (docs/failures.md); any other error ends it. The exit status is 0 only if
 * every batch of every epoch arrived.
 */
#include <ferry.h>
#include <inttypes.h>
#include <stdio.h>

#define EPOCHS 3

/* Says what failed, with ferry's sentence; returns 1, the exit status. */
static int failed(const char *what, int rc)
{
    fprintf(stderr, "basic_loop: %s: %s: %s\n", what, ferry_err_name(rc), ferry_last_error());
    return 1;
}

/* Takes every batch of an open loader; returns the exit status. */
static int train(ferry_loader *ld)
{
    uint64_t items, per_epoch;
    int rc = ferry_loader_length(ld, &items, &per_epoch);
    if (rc != FERRY_OK)
        return failed("length", rc);

    uint64_t taken = 0, skipped = 0;
    ferry_batch *b;
    while ((rc = ferry_loader_next(ld, &b)) != FERRY_EOF) {
        if (rc == FERRY_EBATCH || rc == FERRY_ERANGE) { /* one batch failed; the run goes on */
            fprintf(stderr, "basic_loop: skipped: %s\n", ferry_last_error());
            skipped++;
            continue;
        }
        if (rc != FERRY_OK) /* the loader cannot go on */
            return failed("next", rc);
        ferry_batch_info info;
        ferry_batch_get_info(b, &info); /* epoch, batch_in_epoch, last_in_epoch */
        ferry_tensor x, y;              /* views, no copy: x.data, x.dtype, x.shape */
        if ((rc = ferry_batch_field(b, "x", &x)) != FERRY_OK ||
            (rc = ferry_batch_field(b, "y", &y)) != FERRY_OK) {
            ferry_batch_release(b);
            return failed("field", rc);
        }
        /* ... train on x and y: valid until the batch is released ... */
        if (info.last_in_epoch)
            printf("epoch %" PRIu64 ": %" PRIu64 " batches, the last of %" PRId64 " items\n",
                   info.epoch, info.batch_in_epoch + 1, x.shape[0]);
        ferry_batch_release(b);
        taken++;
    }
    if (skipped > 0 || taken != EPOCHS * per_epoch) {
        fprintf(stderr, "basic_loop: %" PRIu64 " of %" PRIu64 " batches arrived\n", taken,
                EPOCHS * per_epoch);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *dataset = argc > 1 ? argv[1] : "synthetic:n=6000,dim=784";
    ferry_config *cfg = ferry_config_new();
    if (cfg == NULL) {
        fprintf(stderr, "basic_loop: out of memory\n");
        return 1;
    }
    int rc;
    if ((rc = ferry_config_set(cfg, "dataset", dataset)) != FERRY_OK ||
        (rc = ferry_config_set_int(cfg, "batch_size", 256)) != FERRY_OK ||
        (rc = ferry_config_set_int(cfg, "workers", 2)) != FERRY_OK ||  /* worker processes */
        (rc = ferry_config_set_int(cfg, "prefetch", 8)) != FERRY_OK || /* batches in flight */
        (rc = ferry_config_set_int(cfg, "seed", 1234)) != FERRY_OK ||  /* shuffle when seeded */
        (rc = ferry_config_set_int(cfg, "epochs", EPOCHS)) != FERRY_OK) {
        ferry_config_free(cfg);
        return failed("config", rc);
    }
    ferry_loader *ld;
    rc = ferry_loader_open(&ld, cfg);
    ferry_config_free(cfg);
    if (rc != FERRY_OK)
        return failed("open", rc);

    int status = train(ld);
    rc = ferry_loader_close(ld);
    if (rc != FERRY_OK)
        return failed("close", rc);
    return status;
}
