/*
 * harness.h - what every ferry test that starts workers checks.
 *
 * ft_begin() takes a snapshot (open fds, threads, /dev/shm entries), points
 * TMPDIR at a fresh private directory (so the loader's ipc directory lands
 * somewhere we can inspect) and arms a hard time limit; ft_end() asserts that
 * everything is back: no child process (running or zombie), the same fds
 * and threads, nothing left in the private TMPDIR or /dev/shm.
 */
#ifndef FERRY_TEST_HARNESS_H
#define FERRY_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ft_snapshot {
    int nfds;
    int nthreads;
    int nshm;
    char tmpdir[256];
} ft_snapshot;

/* Snapshot, private TMPDIR, and an alarm that kills the test process after
 * `limit_s` seconds (a hang fails the test instead of blocking CI). */
void ft_begin(ft_snapshot *s, unsigned limit_s);
/* Asserts (cmocka) that nothing leaked since ft_begin, removes the TMPDIR,
 * disarms the alarm. */
void ft_end(ft_snapshot *s);

/* Runs each test in its own child process (so a failing case, and whatever
 * it left running, cannot spill into the next), each under cmocka, and
 * prints "N passed, M failed". Returns the number failed. A child that dies
 * or runs past its alarm counts as failed. */
struct CMUnitTest;
int ft_run_each(const struct CMUnitTest *tests, size_t n);

int ft_count_fds(void);
int ft_count_threads(void);
/* Entries in a directory (not . and ..), -1 if it cannot be read. */
int ft_count_entries(const char *dir);
uint64_t ft_now_ms(void);

#endif
