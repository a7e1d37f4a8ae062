/*
 * alloc.h - the loader's allocations, with a fault injector for tests.
 *
 * Every allocation on the loader's side (loader, task table, batches,
 * options, thread workers) goes through these, so a test can make the k-th
 * one fail and prove that every failure path frees what it took and reports
 * FERRY_ENOMEM (the SQLite way of testing out-of-memory). Counting is atomic:
 * the scheduler and worker threads allocate too.
 */
#ifndef FERRY_BASE_ALLOC_H
#define FERRY_BASE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* x rounded up to a multiple of a. */
#define FERRY__ROUND_UP(x, a) (((x) + (a)-1) / (a) * (a))

void *ferry__malloc(size_t n);
void *ferry__calloc(size_t n, size_t size);
void *ferry__realloc(void *p, size_t n);
void *ferry__aligned_alloc(size_t align, size_t n);

/* Tests only: the k-th allocation from now fails (k = 0: none does). */
void ferry__alloc_fail_at(uint64_t k);
/* Whether the injected failure has happened since ferry__alloc_fail_at. */
int ferry__alloc_failed(void);

#endif
