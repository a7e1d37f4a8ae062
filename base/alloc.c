/*
 * alloc.c - allocation wrappers with a k-th-call fault injector (alloc.h).
 */
#include "alloc.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

static atomic_uint_fast64_t fail_at; /* 0: off */
static atomic_uint_fast64_t calls;
static atomic_int fired;

/* 1 if this call is the one to fail. One relaxed load when off. */
static int inject(void)
{
    uint64_t k = atomic_load_explicit(&fail_at, memory_order_relaxed);
    if (k == 0)
        return 0;
    if (atomic_fetch_add(&calls, 1) + 1 != k)
        return 0;
    atomic_store(&fired, 1);
    errno = ENOMEM;
    return 1;
}

void *ferry__malloc(size_t n)
{
    return inject() ? NULL : malloc(n);
}

void *ferry__calloc(size_t n, size_t size)
{
    return inject() ? NULL : calloc(n, size);
}

void *ferry__realloc(void *p, size_t n)
{
    return inject() ? NULL : realloc(p, n);
}

void *ferry__aligned_alloc(size_t align, size_t n)
{
    return inject() ? NULL : aligned_alloc(align, n);
}

void ferry__alloc_fail_at(uint64_t k)
{
    atomic_store(&calls, 0);
    atomic_store(&fired, 0);
    atomic_store(&fail_at, k);
}

int ferry__alloc_failed(void)
{
    return atomic_load(&fired);
}
