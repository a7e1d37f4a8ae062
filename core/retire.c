/*
 * retire.c - a worker's own measure of itself, and its decision to retire
 * (see retire.h).
 */
#include "retire.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include "error.h"

void ferry__retire_init(ferry__retire *r)
{
    *r = (ferry__retire){.statm_fd = -1};
}

int ferry__retire_set(ferry__retire *r, uint64_t max_rss, uint64_t max_batches)
{
    ferry__retire_close(r);
    r->batches = 0;
    r->rss = 0;
    r->max_batches = max_batches;
    if (!max_rss)
        return FERRY_OK;
    r->statm_fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (r->statm_fd < 0) {
        r->max_batches = 0;
        return ferry__syserr(FERRY_ESYS, "opening /proc/self/statm for the memory budget", errno);
    }
    r->max_rss = max_rss;
    return FERRY_OK;
}

void ferry__retire_close(ferry__retire *r)
{
    if (r->statm_fd >= 0)
        close(r->statm_fd);
    r->statm_fd = -1;
    r->max_rss = 0;
    r->max_batches = 0;
}

int ferry__private_rss(int fd, uint64_t *bytes)
{
    /* "size resident shared text lib data dt", in pages; pread at 0 makes
     * the kernel write it afresh. */
    char buf[160];
    ssize_t n;
    do
        n = pread(fd, buf, sizeof buf - 1, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return ferry__syserr(FERRY_ESYS, "reading /proc/self/statm", n < 0 ? errno : EIO);
    buf[n] = '\0';
    uint64_t size, resident, shared;
    if (sscanf(buf, "%" SCNu64 " %" SCNu64 " %" SCNu64, &size, &resident, &shared) != 3)
        return ferry__seterr(FERRY_ESYS, "/proc/self/statm reads '%s', not three page counts", buf);
    long page = sysconf(_SC_PAGESIZE);
    *bytes = (resident > shared ? resident - shared : 0) * (uint64_t)(page > 0 ? page : 4096);
    return FERRY_OK;
}

ferry__retire_reason ferry__retire_after_task(ferry__retire *r)
{
    r->batches++;
    if (r->max_rss && ferry__private_rss(r->statm_fd, &r->rss) == FERRY_OK && r->rss > r->max_rss)
        return FERRY__RETIRE_MEMORY;
    if (r->max_batches && r->batches >= r->max_batches)
        return FERRY__RETIRE_BATCHES;
    return FERRY__RETIRE_NONE;
}
