/*
 * test_shm.c - local process workers' batches through shared memory
 * (transport/shm.h): what the trainer gets are views of the loader's batch
 * slots; every batch still arrives exactly once and intact, through slot
 * reuse, workers killed while writing, a trainer that keeps or releases
 * batches in any order from any thread, and close; the option turns it off,
 * and a batch that does not fit goes by message.
 *
 * Whether a batch is in a slot is read from /proc/self/maps: the loader's
 * mapping of its memfd is named "memfd:ferry-slots". Each case runs in its
 * own child under a hard time limit (ft_begin), and ends with the harness's
 * leak check (no child, the same fds and threads) plus no slot mapping.
 */
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"
#include "harness.h"

#if defined(__SANITIZE_ADDRESS__)
#define FT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FT_SANITIZED 1
#endif
#endif

#define N_ITEMS 1000
#define DIM 40
#define BATCH 32

/* The address ranges of this process's mappings of the batch slots. */
typedef struct slot_maps {
    int n;
    uintptr_t lo[8], hi[8];
} slot_maps;

static slot_maps read_slot_maps(void)
{
    slot_maps m = {.n = 0};
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (strstr(line, "memfd:ferry-slots") && sscanf(line, "%lx-%lx", &lo, &hi) == 2 &&
            m.n < 8) {
            m.lo[m.n] = lo;
            m.hi[m.n] = hi;
            m.n++;
        }
    }
    fclose(f);
    return m;
}

/* The bytes of memory the batch slots' memfd holds now (its blocks), -1
 * when this process has no such fd. */
static long long slot_memory(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    long long bytes = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[300], link[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        struct stat st;
        if (n <= 0)
            continue;
        link[n] = '\0';
        if (strstr(link, "memfd:ferry-slots") && stat(path, &st) == 0)
            bytes = (long long)st.st_blocks * 512;
    }
    closedir(d);
    return bytes;
}

/* Polls slot_memory until it is at most `bytes`; how long that took in
 * ms, or -1 if it did not within `ms`. */
static int64_t wait_slot_memory_at_most(long long bytes, uint64_t ms)
{
    uint64_t t0 = ft_now_ms();
    for (;;) {
        long long now = slot_memory();
        if (now >= 0 && now <= bytes)
            return (int64_t)(ft_now_ms() - t0);
        if (ft_now_ms() - t0 > ms)
            return -1;
        ft_sleep_ms(20);
    }
}

/* Whether every field of b lies in one of the slot mappings. */
static int in_slots(const slot_maps *m, const ferry_batch *b)
{
    for (int f = 0; f < ferry_batch_nfields(b); f++) {
        ferry_tensor t;
        assert_int_equal(ferry_batch_field_at(b, f, &t), FERRY_OK);
        uintptr_t p = (uintptr_t)t.data;
        int inside = 0;
        for (int k = 0; k < m->n; k++)
            inside |= p >= m->lo[k] && p + t.nbytes <= m->hi[k];
        if (!inside)
            return 0;
    }
    return 1;
}

/* Whether every field of b lies in [data, data + len). */
static int fields_within(const ferry_batch *b, const void *data, size_t len)
{
    uintptr_t lo = (uintptr_t)data, hi = lo + len;
    for (int f = 0; f < ferry_batch_nfields(b); f++) {
        ferry_tensor t;
        assert_int_equal(ferry_batch_field_at(b, f, &t), FERRY_OK);
        if ((uintptr_t)t.data < lo || (uintptr_t)t.data + t.nbytes > hi)
            return 0;
    }
    return 1;
}

static ferry_config *shm_cfg(int workers, int prefetch, const char *dataset)
{
    ferry_config *cfg = ft_config(dataset, workers, BATCH);
    assert_int_equal(ferry_config_set_int(cfg, "prefetch", prefetch), FERRY_OK);
    return cfg;
}

static const char *synthetic(const char *extra)
{
    static char spec[128];
    snprintf(spec, sizeof spec, "synthetic:n=%d,dim=%d%s", N_ITEMS, DIM, extra);
    return spec;
}

/* The stream a loader with seed 7 over N_ITEMS should deliver. */
static void expected_stream(ft_stream *c, uint64_t epochs)
{
    ferry__sampler_opts o = {
        .batch_size = BATCH, .shuffle = 1, .seed = 7, .world_size = 1, .epochs = epochs};
    assert_int_equal(ft_stream_init(c, N_ITEMS, &o, 0), 0);
}

/* ft_end, and no mapping of the slots left either. */
static void end_without_slots(ft_snapshot *snap)
{
    assert_int_equal(read_slot_maps().n, 0);
    ft_end(snap);
}

/* ------------------------------------------------------------------------
 * The path itself
 */

/* Process workers write into the slots: every batch the trainer gets is a
 * view of them, in its place in the stream, intact, every item once per
 * epoch; and many more batches than slots pass through the same few
 * slots, in one mapping that never grows. */
static void test_batches_are_views_of_reused_slots_exactly_once(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    const uint64_t epochs = 8; /* 8 x 32 = 256 batches through 2 x 4 slots */
    ferry_config *cfg = shm_cfg(2, 4, synthetic(""));
    assert_int_equal(ferry_config_set_int(cfg, "seed", 7), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", (int64_t)epochs), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    slot_maps m = read_slot_maps();
    assert_int_equal(m.n, 1);

    ft_stream c;
    expected_stream(&c, epochs);
    const void *seen[64];
    int nseen = 0;
    ferry_batch *b;
    int rc;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
        ft_assert_in_stream(&c, b);
        ft_assert_synthetic(b, DIM);
        assert_true(in_slots(&m, b));
        ferry_tensor x;
        assert_int_equal(ferry_batch_field(b, "x", &x), FERRY_OK);
        int known = 0;
        for (int i = 0; i < nseen; i++)
            known |= seen[i] == x.data;
        if (!known) {
            assert_true(nseen < 8); /* 2 x prefetch slots, no more */
            seen[nseen++] = x.data;
        }
        ferry_batch_release(b);
    }
    assert_int_equal(rc, FERRY_EOF);
    assert_int_equal(c.taken, epochs * ((N_ITEMS + BATCH - 1) / BATCH));
    slot_maps after = read_slot_maps();
    assert_int_equal(after.n, 1);
    assert_true(after.lo[0] == m.lo[0] && after.hi[0] == m.hi[0]);
    ft_stream_free(&c);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    end_without_slots(&snap);
}

/* A batch is a view of its slot, so the slot must not be written again
 * while the trainer holds it: batches kept while 150 more pass are intact
 * when read at the end, and then released in an odd order from another
 * thread, after which the stream goes on in slots again. */
typedef struct release_job {
    ferry_batch **b;
    int n;
} release_job;

/* Releases the odd-numbered batches first, then the even ones from the
 * last: 1, 2, 0 for three. */
static void *release_odd_order(void *arg)
{
    release_job *j = arg;
    for (int i = 1; i < j->n; i += 2)
        ferry_batch_release(j->b[i]);
    for (int i = (j->n - 1) / 2 * 2; i >= 0; i -= 2)
        ferry_batch_release(j->b[i]);
    return NULL;
}

static void test_held_slots_are_never_reused_and_come_back_from_any_thread(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = shm_cfg(2, 4, synthetic(""));
    assert_int_equal(ferry_config_set_int(cfg, "seed", 7), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    slot_maps m = read_slot_maps();
    ft_stream c;
    expected_stream(&c, 0);
    enum { KEEP = 3 };
    ferry_batch *kept[KEEP], *b;
    for (int i = 0; i < KEEP; i++) {
        assert_int_equal(ferry_loader_next(ld, &kept[i]), FERRY_OK);
        ft_assert_in_stream(&c, kept[i]);
        assert_true(in_slots(&m, kept[i]));
    }
    for (int i = 0; i < 150; i++) {
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ft_assert_in_stream(&c, b);
        ft_assert_synthetic(b, DIM);
        assert_true(in_slots(&m, b));
        ferry_batch_release(b);
    }
    for (int i = 0; i < KEEP; i++)
        ft_assert_synthetic(kept[i], DIM);
    release_job j = {.b = kept, .n = KEEP};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, release_odd_order, &j), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    for (int i = 0; i < 40; i++) {
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ft_assert_in_stream(&c, b);
        ft_assert_synthetic(b, DIM);
        assert_true(in_slots(&m, b));
        ferry_batch_release(b);
    }
    ft_stream_free(&c);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    end_without_slots(&snap);
}

/* Takes n batches and keeps them, each checked against the stream when
 * one is given, each within 5 s: the stream must not wait for the trainer
 * to let go. Returns how many are in slots. */
static int keep_batches(ferry_loader *ld, ferry_batch **kept, int n, const slot_maps *m,
                        ft_stream *c)
{
    int in_shm = 0;
    for (int i = 0; i < n; i++) {
        uint64_t t0 = ft_now_ms();
        assert_int_equal(ferry_loader_next(ld, &kept[i]), FERRY_OK);
        assert_true(ft_now_ms() - t0 < 5000);
        if (c)
            ft_assert_in_stream(c, kept[i]);
        in_shm += in_slots(m, kept[i]);
    }
    return in_shm;
}

/* Every kept batch still intact when the trainer lets go of them all. */
static void release_kept(ferry_batch **kept, int n)
{
    for (int i = 0; i < n; i++) {
        ft_assert_synthetic(kept[i], DIM);
        ferry_batch_release(kept[i]);
    }
}

/* A trainer that keeps every batch it gets takes all the slots (4 here:
 * a batch takes one 4 KiB page): the stream does not stall, later batches
 * come by message, each intact, one warning says why and what to change,
 * and once the trainer lets go they are in slots again. */
static void test_a_trainer_keeping_every_slot_gets_batches_by_message(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    static ft_log_capture cap = {.mu = PTHREAD_MUTEX_INITIALIZER};
    cap.n = 0;
    ferry_config *cfg = shm_cfg(2, 2, synthetic(""));
    assert_int_equal(ferry_config_set_int(cfg, "seed", 7), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "shm_max_bytes", 4 * 4096), FERRY_OK);
    assert_int_equal(ferry_config_set_log(cfg, ft_capture_log, &cap), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    slot_maps m = read_slot_maps();
    ft_stream c;
    expected_stream(&c, 0);
    enum { KEEP = 24 };
    ferry_batch *kept[KEEP];
    int in_shm = keep_batches(ld, kept, KEEP, &m, &c);
    /* 4 slots: the first batches took them; no slot is given twice. */
    assert_true(in_shm >= 1 && in_shm <= 4);
    assert_false(in_slots(&m, kept[KEEP - 1]));
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_WARN, "all 4 batch slots (shm_max_bytes 16384) "
                                                        "are in flight or held by the trainer"),
                     1);
    assert_int_equal(ft_count_log(&cap, FERRY_LOG_WARN, ""), 1);
    release_kept(kept, KEEP);
    /* Slots again, once the window has turned over. */
    ferry_batch *b;
    int last_in_shm = 0;
    for (int i = 0; i < 20; i++) {
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        ft_assert_in_stream(&c, b);
        ft_assert_synthetic(b, DIM);
        last_in_shm = in_slots(&m, b);
        ferry_batch_release(b);
    }
    assert_true(last_in_shm);
    ft_stream_free(&c);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    end_without_slots(&snap);
}

/* Within shm_max_bytes the slots follow what the trainer keeps: one that
 * holds 24 batches with a window of 2 still gets every one in its own
 * slot, and once it releases as it goes, a handful of slots serve the
 * stream again (the slot freed last is given next, so the memory in use
 * is what is in flight and held, not the limit). */
static void test_slots_follow_what_the_trainer_keeps(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = shm_cfg(2, 2, synthetic(""));
    ferry_loader *ld = ft_open_ok(cfg);
    slot_maps m = read_slot_maps();
    enum { KEEP = 24 };
    ferry_batch *kept[KEEP];
    assert_int_equal(keep_batches(ld, kept, KEEP, &m, NULL), KEEP);
    assert_true(slot_memory() >= KEEP * 4096);
    for (int i = 0; i < KEEP; i++) {
        ferry_tensor t, u;
        assert_int_equal(ferry_batch_field_at(kept[i], 0, &t), FERRY_OK);
        for (int j = 0; j < i; j++) { /* each its own slot */
            assert_int_equal(ferry_batch_field_at(kept[j], 0, &u), FERRY_OK);
            assert_true(t.data != u.data);
        }
    }
    release_kept(kept, KEEP);
    /* Released in turn, batch after batch: a handful of slots serve them. */
    const void *seen[64];
    int nseen = 0;
    for (int i = 0; i < 200; i++) {
        ferry_batch *b;
        ferry_tensor t;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        assert_true(in_slots(&m, b));
        assert_int_equal(ferry_batch_field_at(b, 0, &t), FERRY_OK);
        int known = 0;
        for (int k = 0; k < nseen; k++)
            known |= seen[k] == t.data;
        if (!known && nseen < 64)
            seen[nseen++] = t.data;
        ferry_batch_release(b);
    }
    /* The window (2) plus those given to workers meanwhile, well under the
     * 24 the trainer once kept: the most recently freed slots come first. */
    assert_true(nseen <= 8);
    /* And the memory of the other slots goes back once they have been free
     * a while (TRIM_IDLE_MS, 1 s): at most the window's slots in use and
     * one spare keep theirs, where all 24 did before. */
    int64_t took = wait_slot_memory_at_most((2 + 1) * 4096, 10000);
    printf("slot memory down to %lld bytes after %lld ms\n", slot_memory(), (long long)took);
    assert_true(took >= 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    end_without_slots(&snap);
}

/* A stream with an end (epochs) gives back the memory of every slot once
 * its last batch has been delivered and released: the loader, still open,
 * will write none again. */
static void test_an_ended_stream_gives_its_slot_memory_back(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_config *cfg = shm_cfg(2, 4, synthetic(""));
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 2), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    ferry_batch *b;
    int n = 0, rc;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
        ferry_batch_release(b);
        n++;
    }
    assert_int_equal(rc, FERRY_EOF);
    assert_true(n > 8);
    /* Promptly: the last batch's delivery ended the stream, and the
     * scheduler's thread gives the free slots' memory back then, and the
     * last slot's once it is released (never the trainer's thread, on the
     * path every batch takes). */
    int64_t took = wait_slot_memory_at_most(0, 5000);
    printf("%d batches; slot memory given back %lld ms after the last release\n", n,
           (long long)took);
    assert_true(took >= 0 && took < 1000);
    /* The stats say the same: the pool is there, holds nothing, and has
     * given its memory back. */
    ferry_stats st = ft_stats(ld);
    assert_true(st.slot_bytes > 0 && st.slots > 0);
    assert_int_equal(st.slots_held, 0);
    assert_int_equal(st.slot_memory, 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    end_without_slots(&snap);
}

static int no_slot_memory(const ferry_stats *st, uint64_t unused)
{
    (void)unused;
    return st->slot_memory == 0;
}

/* Slots a device may have registered (ferry_loader_keep_slots) keep their
 * pages: two loaders run the same stream to its end, and once the one
 * without the call has given its slot memory back, the one with it still
 * holds its own, while the batches of both lie in the slots
 * ferry_batch_slot names. */
static void test_kept_slots_keep_their_pages(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_loader *ld[2];
    for (int k = 0; k < 2; k++) {
        ferry_config *cfg = shm_cfg(2, 4, synthetic(""));
        assert_int_equal(ferry_config_set_int(cfg, "epochs", 2), FERRY_OK);
        ld[k] = ft_open_ok(cfg);
    }
    assert_int_equal(ferry_loader_keep_slots(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_loader_keep_slots(ld[0]), FERRY_OK);
    for (int k = 0; k < 2; k++) {
        ferry_batch *b;
        int rc;
        while ((rc = ferry_loader_next(ld[k], &b)) == FERRY_OK) {
            void *data;
            size_t len;
            assert_int_equal(ferry_batch_slot(b, &data, &len), FERRY_OK);
            assert_true(fields_within(b, data, len));
            ferry_batch_release(b);
        }
        assert_int_equal(rc, FERRY_EOF);
    }
    int64_t took = ft_wait_stats(ld[1], no_slot_memory, 0, 10000);
    assert_true(took >= 0);
    ferry_stats kept = ft_stats(ld[0]);
    printf("slot memory %lld ms after the end: %llu bytes kept, 0 given back\n", (long long)took,
           (unsigned long long)kept.slot_memory);
    assert_true(kept.slot_memory >= kept.slot_bytes);
    for (int k = 0; k < 2; k++)
        assert_int_equal(ferry_loader_close(ld[k]), FERRY_OK);
    end_without_slots(&snap);
}

/* A steady stream costs the trainer no page fault: a slot's pages stay
 * mapped in the trainer between its batches (they are the memfd's, shared
 * with the workers), so reading a batch written into a slot it has read
 * before maps nothing again. Once every slot in use has been read, 1,000
 * more batches, each read page by page, take at most a few faults in the
 * whole process (the ZeroMQ messages' and the allocator's own). The
 * trainer used to unmap a slot at each release and map it again at the
 * next hold: a fault per page per batch, half the core's throughput. */
static void steady_batches_fault_nothing(const char *mode)
{
    /* 32 items of 16 KiB: 128 pages a batch. */
    enum { DIM_BYTES = 16384, WARM = 300, STEADY = 1000 };
    ferry_config *cfg = shm_cfg(2, 4, "synthetic:n=1024,dim=16384");
    assert_int_equal(ferry_config_set(cfg, "worker_mode", mode), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    slot_maps m = read_slot_maps();
    assert_true(m.n >= 1);
    long faults0 = 0;
    unsigned sum = 0;
    for (int i = 0; i < WARM + STEADY; i++) {
        if (i == WARM)
            faults0 = ft_minor_faults();
        ferry_batch *b;
        ferry_tensor t;
        assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
        assert_true(in_slots(&m, b));
        assert_int_equal(ferry_batch_field_at(b, 0, &t), FERRY_OK);
        assert_int_equal(t.nbytes, (size_t)BATCH * DIM_BYTES);
        const volatile unsigned char *x = t.data;
        for (size_t k = 0; k < t.nbytes; k += 4096)
            sum += x[k];
        ferry_batch_release(b);
    }
    long faults = ft_minor_faults() - faults0;
    printf("%s workers: %ld minor page faults in the trainer over %d steady batches of %d "
           "pages (sum %u)\n",
           mode, faults, STEADY, BATCH * DIM_BYTES / 4096, sum);
    /* A fault per page per batch would be 128,000 (8,000 with the kernel's
     * fault-around); one per batch 1,000. Thread workers are in this
     * process: a slot given back while idle (a stall on a loaded machine
     * lets the window reach a slot trimmed a second before) is written
     * page by page again by a worker thread, a slot's worth each time. */
    long bound = STEADY / 10;
    if (!strcmp(mode, "thread"))
        bound += 2 * BATCH * DIM_BYTES / 4096;
#ifdef FT_SANITIZED
    /* AddressSanitizer's allocator keeps freed memory out of use for a
     * while, so each message's allocations touch fresh pages: faults of
     * the sanitizer's own, a few per batch. The bound holds in the plain
     * build, which CI runs too. */
    (void)bound;
#else
    assert_true(faults < bound);
#endif
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
}

static void test_steady_batches_cost_the_trainer_no_page_fault(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    steady_batches_fault_nothing("process");
    steady_batches_fault_nothing("thread"); /* the process holds the workers too */
    end_without_slots(&snap);
}

/* One byte through a pipe, within 10 s: the byte, or 0 on timeout or EOF. */
static char pipe_wait(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    return poll(&p, 1, 10000) == 1 && read(fd, &c, 1) == 1 ? c : 0;
}

/* A child forked while the trainer holds a batch in a slot has its own copy
 * of it, as of any memory fork() copies: what the child writes stays in the
 * child, and when the trainer releases the batch and the slot is reused for
 * another, the child's view keeps its bytes. Shared mappings are not
 * copied by fork(), so both used to see each other's writes and the child's
 * batch turned into another one. */
static void test_a_forked_child_keeps_its_own_copy_of_held_batches(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    /* 4 slots of one page: a trainer that keeps every batch it gets
     * after this one has all of them given, this one's too, within 8. */
    ferry_config *cfg = shm_cfg(2, 2, synthetic(""));
    assert_int_equal(ferry_config_set_int(cfg, "shm_max_bytes", 4 * 4096), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    slot_maps m = read_slot_maps();
    ferry_batch *b;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    assert_true(in_slots(&m, b));
    ferry_tensor x;
    assert_int_equal(ferry_batch_field(b, "x", &x), FERRY_OK);
    unsigned char *orig = malloc(x.nbytes);
    assert_non_null(orig);
    memcpy(orig, x.data, x.nbytes);
    int to_child[2], to_parent[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(to_parent), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The child: keeps nothing of the slots but its copy of the held
         * batch (no memfd open, no slot mapped: #20.2); writes its batch,
         * then after the trainer has reused the slot checks that it still
         * reads what it wrote. */
        slot_maps mine = read_slot_maps();
        char said = slot_memory() < 0 && mine.n == 0 ? 'w' : 'k'; /* k: slots kept */
        memset((void *)x.data, 0x77, x.nbytes);
        int ok = write(to_parent[1], &said, 1) == 1 && said == 'w' && pipe_wait(to_child[0]);
        for (size_t i = 0; ok && i < x.nbytes; i++)
            ok = ((const unsigned char *)x.data)[i] == 0x77;
        _exit(ok ? 0 : 1);
    }
    close(to_child[0]); /* the child's ends: its exit is an EOF here */
    close(to_parent[1]);
    char said = pipe_wait(to_parent[0]);
    if (said != 'w') { /* reaped before failing, so nothing is left behind */
        kill(pid, SIGKILL);
        ft_wait_child(pid, 10000, NULL);
        close(to_child[1]);
        close(to_parent[0]);
        free(orig);
        ferry_batch_release(b);
        ferry_loader_close(ld);
        fail_msg("the forked child %s", said == 'k' ? "keeps the loader's slots (fd or mapping)"
                                                      : "said nothing");
    }
    /* The child's writes are not here. */
    assert_memory_equal(x.data, orig, x.nbytes);
    /* Released, and the next batches kept: the slot is given again, and
     * one of them lands where this one was. */
    const void *where = x.data;
    ferry_batch_release(b);
    enum { KEEP = 8 };
    ferry_batch *kept[KEEP];
    int reused = 0;
    for (int i = 0; i < KEEP; i++) {
        assert_int_equal(ferry_loader_next(ld, &kept[i]), FERRY_OK);
        assert_int_equal(ferry_batch_field(kept[i], "x", &x), FERRY_OK);
        reused |= x.data == where;
    }
    assert_true(reused);
    assert_int_equal(write(to_child[1], "r", 1), 1);
    int status;
    assert_int_equal(ft_wait_child(pid, 10000, &status), 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(to_child[1]);
    close(to_parent[0]);
    free(orig);
    release_kept(kept, KEEP);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    end_without_slots(&snap);
}

/* ------------------------------------------------------------------------
 * Failures
 */

/* A child forked while the trainer holds batches gets them whole, however
 * fast the trainer goes on: the trainer releases them the moment fork()
 * returns and its thread workers write new batches into those slots at
 * once, while the child is still being set up. The child's copies used to
 * be made after the fork, in the child, from memory the parent was
 * already reusing: once in a while a byte of another batch. Thread
 * workers, 512 KiB batches (a copy long enough to race), 40 forks. */
static void test_a_fork_racing_slot_reuse_gets_whole_batches(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 120);
    enum { FORKS = 40, HOLD = 3, DIM16 = 16384 };
    ferry_config *cfg = shm_cfg(2, 4, "synthetic:n=4096,dim=16384");
    assert_int_equal(ferry_config_set(cfg, "worker_mode", "thread"), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    int bad = 0;
    for (int f = 0; f < FORKS && !bad; f++) {
        ferry_batch *held[HOLD];
        for (int k = 0; k < HOLD; k++)
            assert_int_equal(ferry_loader_next(ld, &held[k]), FERRY_OK);
        int to_parent[2];
        assert_int_equal(pipe(to_parent), 0);
        fflush(stdout);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            char why[512], said = 'g';
            for (int k = 0; k < HOLD; k++)
                if (ft_check_synthetic(held[k], DIM16, why, sizeof why) != 0)
                    said = 'b';
            _exit(write(to_parent[1], &said, 1) == 1 ? 0 : 1);
        }
        close(to_parent[1]);
        /* At once: the slots go back and are written again. */
        for (int k = 0; k < HOLD; k++)
            ferry_batch_release(held[k]);
        for (int k = 0; k < 8; k++) {
            ferry_batch *b;
            assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
            ferry_batch_release(b);
        }
        char said = pipe_wait(to_parent[0]);
        close(to_parent[0]);
        int status;
        assert_int_equal(ft_wait_child(pid, 10000, &status), 0);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (said != 'g') {
            printf("fork %d: the child's held batches were not whole ('%c')\n", f, said);
            bad = 1;
        }
    }
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    assert_false(bad);
    end_without_slots(&snap);
}

/* Workers killed (SIGKILL) while they write batches into slots: their
 * tasks are sent again, and every batch still arrives once, in its place,
 * intact and in a slot; slots the dead held come back (the run would
 * otherwise fall back to messages for good). */
static void test_workers_killed_mid_write_lose_nothing(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 90);
    const uint64_t epochs = 3;
    /* Slow items: a kill lands while a batch is being written. */
    ferry_config *cfg = shm_cfg(2, 4, synthetic(",cost_us=100"));
    assert_int_equal(ferry_config_set_int(cfg, "seed", 7), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", (int64_t)epochs), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    slot_maps m = read_slot_maps();
    ft_stream c;
    expected_stream(&c, epochs);
    ferry_batch *b;
    int rc, kills = 0, since_kill = 0, in_shm_after = 0;
    uint64_t n = 0;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
        ft_assert_in_stream(&c, b);
        ft_assert_synthetic(b, DIM);
        int shm = in_slots(&m, b);
        ferry_batch_release(b);
        n++;
        since_kill++;
        if (kills > 0 && since_kill > 8)
            in_shm_after += shm;
        /* Every 12 batches, kill the worker that is on a task now. */
        if (n % 12 == 6 && kills < 5) {
            int pid = 0;
            if (ferry_loader_worker_pid(ld, (uint32_t)(kills % 2), &pid) == FERRY_OK && pid > 0) {
                kill(pid, SIGKILL);
                kills++;
                since_kill = 0;
            }
        }
    }
    if (rc != FERRY_EOF)
        fail_msg("next: %s: %s", ferry_err_name(rc), ferry_last_error());
    assert_int_equal(c.taken, epochs * ((N_ITEMS + BATCH - 1) / BATCH));
    assert_true(kills >= 3);
    assert_true(ft_stats(ld).restarts >= 1);
    assert_true(in_shm_after > 0);
    ft_stream_free(&c);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    end_without_slots(&snap);
}

/* A dataset that crashes its worker halfway through writing a batch into
 * its slot (item 37 of the batch of items 32..47), every time: after
 * max_attempts deaths that batch is given up, and every other batch comes
 * intact from a slot, those after the deaths too: the slots the dead were
 * writing are taken back. */
static void test_a_batch_that_crashes_mid_write_is_given_up_alone(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    char spec[512];
    snprintf(spec, sizeof spec, "plugin:%s?n=160,dim=%d,crash_at=37", FERRY_TEST_HOSTILE, DIM);
    ferry_config *cfg = ft_config(spec, 2, 16);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 1), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "close_grace_ms", 300), FERRY_OK);
    /* 4 slots: were a dead worker's slots not taken back, three deaths
     * would leave too few for a window of 2, and batches would come by
     * message. */
    assert_int_equal(ferry_config_set_int(cfg, "prefetch", 2), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    slot_maps m = read_slot_maps();
    ferry_batch *b;
    int rc, ok = 0, failed = 0, in = 0;
    while ((rc = ferry_loader_next(ld, &b)) != FERRY_EOF) {
        if (rc == FERRY_EBATCH) {
            assert_non_null(strstr(ferry_last_error(), "indices 32, 33"));
            failed++;
            continue;
        }
        assert_int_equal(rc, FERRY_OK);
        ft_assert_synthetic(b, DIM);
        in += in_slots(&m, b);
        ok++;
        ferry_batch_release(b);
    }
    assert_int_equal(failed, 1);
    assert_int_equal(ok, 9);
    assert_int_equal(in, 9);
    assert_true(ft_stats(ld).restarts >= 3);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    end_without_slots(&snap);
}

/* ------------------------------------------------------------------------
 * Close, options, sizes
 */

/* A batch kept past close stays readable (ferry_loader_close's promise);
 * its release unmaps the slots, and nothing of them is left: no mapping,
 * no fd (ft_end counts them). */
static void test_close_leaves_no_slot_memory_once_batches_are_released(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    ferry_loader *ld = ft_open_ok(shm_cfg(2, 4, synthetic("")));
    slot_maps m = read_slot_maps();
    ferry_batch *a, *b;
    assert_int_equal(ferry_loader_next(ld, &a), FERRY_OK);
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    assert_true(in_slots(&m, a) && in_slots(&m, b));
    ferry_batch_release(a);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    assert_int_equal(read_slot_maps().n, 1);
    ft_assert_synthetic(b, DIM);
    ferry_batch_release(b);
    end_without_slots(&snap);
}

/* Runs 3 epochs with `name` set to `value` and returns how many batches
 * were in slots; every batch is checked. */
static int batches_in_slots(const char *name, const char *value, const char *dataset, int dim)
{
    ferry_config *cfg = shm_cfg(2, 4, dataset);
    assert_int_equal(ferry_config_set_int(cfg, "epochs", 3), FERRY_OK);
    if (name)
        assert_int_equal(ferry_config_set(cfg, name, value), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    slot_maps m = read_slot_maps();
    ferry_batch *b;
    int rc, n = 0, in = 0;
    while ((rc = ferry_loader_next(ld, &b)) == FERRY_OK) {
        ft_assert_synthetic(b, dim);
        int here = in_slots(&m, b);
        /* ferry_batch_slot says the same, and names the slot's whole range. */
        void *data = NULL;
        size_t len = 0;
        assert_int_equal(ferry_batch_slot(b, &data, &len), here ? FERRY_OK : FERRY_EINVAL);
        if (here)
            assert_true(len == ft_stats(ld).slot_bytes && fields_within(b, data, len));
        in += here;
        n++;
        ferry_batch_release(b);
    }
    if (rc != FERRY_EOF)
        fail_msg("next: %s: %s", ferry_err_name(rc), ferry_last_error());
    assert_int_equal(n, 3 * ((N_ITEMS + BATCH - 1) / BATCH));
    assert_int_equal(ft_stats(ld).shared, (uint64_t)in); /* the count says what addresses say */
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    return in;
}

/* shm 0 is the message path of old: no slots at all. Slots that would
 * not fit shm_max_bytes: messages too. */
static void test_without_slots_batches_go_by_message(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    assert_int_equal(batches_in_slots("shm", "0", synthetic(""), DIM), 0);
    assert_int_equal(read_slot_maps().n, 0);
    /* A batch is 32 x 40 + 32 x 8 bytes: one 4 KiB page, more than 4000. */
    assert_int_equal(batches_in_slots("shm_max_bytes", "4000", synthetic(""), DIM), 0);
    assert_true(batches_in_slots("shm_max_bytes", "4096", synthetic(""), DIM) > 0);
    end_without_slots(&snap);
}

/* Thread workers write into the same slots (no message buffer per batch,
 * no copy): every batch is a view of them, and the workers' own mappings
 * of the slots are gone with the loader. With shm 0 they send messages. */
static void test_thread_workers_write_into_slots_too(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    int n = 3 * ((N_ITEMS + BATCH - 1) / BATCH);
    assert_int_equal(batches_in_slots("worker_mode", "thread", synthetic(""), DIM), n);
    assert_int_equal(read_slot_maps().n, 0);
    ferry_config *cfg = shm_cfg(2, 4, synthetic(""));
    assert_int_equal(ferry_config_set(cfg, "worker_mode", "thread"), FERRY_OK);
    assert_int_equal(ferry_config_set_int(cfg, "shm", 0), FERRY_OK);
    ferry_loader *ld = ft_open_ok(cfg);
    ferry_batch *b;
    assert_int_equal(ferry_loader_next(ld, &b), FERRY_OK);
    assert_int_equal(read_slot_maps().n, 0);
    ft_assert_synthetic(b, DIM);
    ferry_batch_release(b);
    assert_int_equal(ft_stats(ld).shared, 0);
    assert_int_equal(ferry_loader_close(ld), FERRY_OK);
    end_without_slots(&snap);
}

/* max_message bounds messages: a batch larger than it still arrives when
 * it goes through a slot. */
static void test_a_batch_over_max_message_goes_through_its_slot(void **state)
{
    (void)state;
    ft_snapshot snap;
    ft_begin(&snap, 60);
    /* 32 x 200 + 32 x 8 bytes a batch, over the 4096 limit. */
    int in = batches_in_slots("max_message", "4096", "synthetic:n=1000,dim=200", 200);
    assert_int_equal(in, 3 * ((N_ITEMS + BATCH - 1) / BATCH));
    end_without_slots(&snap);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batches_are_views_of_reused_slots_exactly_once),
        cmocka_unit_test(test_held_slots_are_never_reused_and_come_back_from_any_thread),
        cmocka_unit_test(test_a_trainer_keeping_every_slot_gets_batches_by_message),
        cmocka_unit_test(test_slots_follow_what_the_trainer_keeps),
        cmocka_unit_test(test_an_ended_stream_gives_its_slot_memory_back),
        cmocka_unit_test(test_kept_slots_keep_their_pages),
        cmocka_unit_test(test_steady_batches_cost_the_trainer_no_page_fault),
        cmocka_unit_test(test_a_forked_child_keeps_its_own_copy_of_held_batches),
        cmocka_unit_test(test_a_fork_racing_slot_reuse_gets_whole_batches),
        cmocka_unit_test(test_workers_killed_mid_write_lose_nothing),
        cmocka_unit_test(test_a_batch_that_crashes_mid_write_is_given_up_alone),
        cmocka_unit_test(test_close_leaves_no_slot_memory_once_batches_are_released),
        cmocka_unit_test(test_without_slots_batches_go_by_message),
        cmocka_unit_test(test_thread_workers_write_into_slots_too),
        cmocka_unit_test(test_a_batch_over_max_message_goes_through_its_slot),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
