/*
 * shm.c - the shared-memory batch slots (see shm.h).
 *
 * Free slots are a stack, so giving and taking back are O(1) and the slot
 * given next is the one most recently used (its pages warm in the cache).
 * The mapping's lifetime is counted: the loader's reference (until
 * ferry__shm_close) plus one per held slot.
 */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"

enum { SLOT_FREE = 0, SLOT_GIVEN, SLOT_HELD };

typedef struct shm_slot {
    ferry__shm *m;  /* the backing context handed out: &slots[i] */
    uint32_t owner; /* SLOT_GIVEN: the worker it was given to */
    uint8_t state;
    uint8_t touched;  /* given since it was last trimmed: it has memory */
    uint64_t mapped;  /* bytes from its start the trainer has mapped (under mu) */
    uint64_t free_ms; /* SLOT_FREE: since when */
    uint64_t bytes;   /* SLOT_HELD: the batch's extent in it (0: the whole slot) */
} shm_slot;

struct ferry__shm {
    pthread_mutex_t mu;
    int fd;
    unsigned char *base;
    size_t slot_bytes;
    uint32_t nslots;
    shm_slot *slots;
    int32_t *free; /* a stack of free slot numbers */
    uint32_t nfree;
    uint32_t held;
    int open; /* the loader has not closed it */
    int keep_pages; /* slots keep their pages (ferry__shm_keep) */
    int draining;   /* the stream ended: a slot's memory goes as it comes free */
    void **staged;  /* per slot: a private copy of its held batch, made for a fork */
    void (*on_free)(void *); /* while draining: told (under mu) that a slot came free */
    void *on_free_arg;
    ferry__shm *next_live, *prev_live;
};

/* ------------------------------------------------------------------------
 * fork(): a child gets its own copy of every batch held at the fork.
 *
 * A batch in a slot is a view of MAP_SHARED memory, which fork() does not
 * copy: without this a forked child (multiprocessing, a DataLoader with
 * fork workers, os.fork()) and the trainer would write into each other's
 * batches, and once the trainer released one and the slot was reused, the
 * child's array would silently turn into another batch. So each held
 * slot's batch is copied into private anonymous memory by the parent,
 * before the fork, while every pool's lock is held (no held slot can be
 * released meanwhile, so no worker can be writing into one); the child
 * moves each copy, at the same address, over its slot (mremap), and the
 * parent unmaps its own after the fork. The copy must be made before the
 * fork: made in the child, it read memory the parent was already reusing
 * (the trainer releases a batch the moment fork() returns, a worker
 * writes the next one there) and now and then got a byte of another batch.
 * The cost is a copy of what is held at the fork, in the forking thread.
 * The pools are found through a list of every live one.
 */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static ferry__shm *live;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* The bytes of slot i a child keeps: its held batch's, whole pages; 0 for
 * a slot that holds none. Under mu. */
static size_t held_extent(const ferry__shm *m, uint32_t i)
{
    if (m->slots[i].state != SLOT_HELD)
        return 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t keep = m->slots[i].bytes ? (size_t)m->slots[i].bytes : m->slot_bytes;
    keep = (keep + page - 1) / page * page;
    return keep > m->slot_bytes ? m->slot_bytes : keep;
}

/* In the parent, before the fork (mu held): each held batch copied into
 * private memory. A copy that cannot be made is NULL: that slot stays
 * shared in the child (best effort, as a fork without this would be). */
static void stage_held(ferry__shm *m)
{
    for (uint32_t i = 0; m->base && m->staged && i < m->nslots; i++) {
        m->staged[i] = NULL;
        size_t keep = held_extent(m, i);
        if (!keep)
            continue;
        void *copy = mmap(NULL, keep, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (copy == MAP_FAILED)
            continue;
        memcpy(copy, m->base + (size_t)i * m->slot_bytes, keep);
        m->staged[i] = copy;
    }
}

/* In the parent, after the fork: its copies go (the child has its own). */
static void unstage(ferry__shm *m)
{
    for (uint32_t i = 0; m->staged && i < m->nslots; i++) {
        if (m->staged[i])
            munmap(m->staged[i], held_extent(m, i));
        m->staged[i] = NULL;
    }
}

/* In the child: each held slot becomes its private copy, the rest of
 * every slot is unmapped and the memfd closed, so the child keeps none of
 * the loader's memory alive once the trainer closes it: only what it
 * holds, as its own. A slot's reserve may be far larger than its batch (a
 * field of variable shape): only the batch was copied. */
static void private_copies(ferry__shm *m)
{
    for (uint32_t i = 0; m->base && i < m->nslots; i++) {
        unsigned char *at = m->base + (size_t)i * m->slot_bytes;
        size_t keep = held_extent(m, i);
        void *copy = m->staged ? m->staged[i] : NULL;
        if (m->staged)
            m->staged[i] = NULL;
        if (keep < m->slot_bytes) /* nothing here refers to the rest */
            (void)munmap(at + keep, m->slot_bytes - keep);
        if (!keep)
            continue;
        /* A range registered with a device runtime may not be in the
         * child at all (MADV_DONTFORK): the copy is dropped, and the place
         * is kept (no access), so that no later mapping lands where the
         * child's views of the batch point. */
        if (madvise(at, keep, MADV_NORMAL) != 0) {
            if (copy)
                munmap(copy, keep);
            (void)mmap(at, keep, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            continue;
        }
        if (copy && mremap(copy, keep, keep, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED)
            munmap(copy, keep);
    }
}

static void fork_prepare(void)
{
    pthread_mutex_lock(&live_mu);
    for (ferry__shm *m = live; m; m = m->next_live) {
        pthread_mutex_lock(&m->mu);
        stage_held(m);
    }
}

static void fork_parent(void)
{
    for (ferry__shm *m = live; m; m = m->next_live) {
        unstage(m);
        pthread_mutex_unlock(&m->mu);
    }
    pthread_mutex_unlock(&live_mu);
}

static void fork_child(void)
{
    for (ferry__shm *m = live; m; m = m->next_live) {
        private_copies(m);
        if (m->fd >= 0)
            close(m->fd);
        m->fd = -1;
        pthread_mutex_unlock(&m->mu);
    }
    pthread_mutex_unlock(&live_mu);
}

static void install_atfork(void)
{
    (void)pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void add_live(ferry__shm *m)
{
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&live_mu);
    m->next_live = live;
    if (live)
        live->prev_live = m;
    live = m;
    pthread_mutex_unlock(&live_mu);
}

static void remove_live(ferry__shm *m)
{
    pthread_mutex_lock(&live_mu);
    if (m->prev_live)
        m->prev_live->next_live = m->next_live;
    else
        live = m->next_live;
    if (m->next_live)
        m->next_live->prev_live = m->prev_live;
    pthread_mutex_unlock(&live_mu);
}

int ferry__shm_new(ferry__shm **out)
{
    ferry__shm *m = ferry__calloc(1, sizeof *m);
    if (!m)
        return ferry__seterr(FERRY_ENOMEM, "out of memory for the batch slots");
    m->fd = memfd_create("ferry-slots", MFD_CLOEXEC);
    if (m->fd < 0) {
        int e = errno;
        free(m);
        return ferry__syserr(FERRY_ESYS, "memfd_create for the batch slots", e);
    }
    pthread_mutex_init(&m->mu, NULL);
    m->open = 1;
    add_live(m);
    *out = m;
    return FERRY_OK;
}

int ferry__shm_fd(const ferry__shm *m)
{
    return m->fd;
}

int ferry__shm_size(ferry__shm *m, size_t slot_bytes, uint32_t nslots)
{
    if (m->base || !nslots || !slot_bytes || m->fd < 0)
        return ferry__seterr(FERRY_EINVAL, "the batch slots are sized once, with some slots");
    slot_bytes = FERRY__ROUND_UP(slot_bytes, FERRY__SHM_SLOT_ALIGN);
    if (slot_bytes > SIZE_MAX / nslots)
        return ferry__seterr(FERRY_ELIMIT, "%u batch slots of %zu bytes overflow", nslots,
                             slot_bytes);
    size_t total = slot_bytes * nslots;
    shm_slot *slots = ferry__calloc(nslots, sizeof *slots);
    int32_t *fr = ferry__calloc(nslots, sizeof *fr);
    void **staged = ferry__calloc(nslots, sizeof *staged); /* no allocation at a fork */
    if (!slots || !fr || !staged) {
        free(slots);
        free(fr);
        free(staged);
        return ferry__seterr(FERRY_ENOMEM, "out of memory for %u batch slots", nslots);
    }
    /* Sparse: a slot's memory is allocated by the worker that first writes
     * a batch into it (and mapped here when that batch arrives), so opening
     * a loader with large batches waits for no slot, and the first batch
     * only for its own. */
    int e = ftruncate(m->fd, (off_t)total) == 0 ? 0 : errno;
    void *base = MAP_FAILED;
    if (e == 0) {
        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
        if (base == MAP_FAILED)
            e = errno;
    }
    if (e != 0) {
        free(slots);
        free(fr);
        free(staged);
        int ignored = ftruncate(m->fd, 0);
        (void)ignored;
        return ferry__seterr(FERRY_ESYS, "%u batch slots of %zu bytes in shared memory: %s", nslots,
                             slot_bytes, strerror(e));
    }
    pthread_mutex_lock(&m->mu);
    m->base = base;
    m->slot_bytes = slot_bytes;
    m->nslots = nslots;
    m->slots = slots;
    m->free = fr;
    m->staged = staged;
    for (uint32_t i = 0; i < nslots; i++) {
        slots[i].m = m;
        fr[i] = (int32_t)(nslots - 1 - i); /* slot 0 on top */
    }
    m->nfree = nslots;
    pthread_mutex_unlock(&m->mu);
    return FERRY_OK;
}

unsigned char *ferry__shm_mapping(ferry__shm *m, size_t *len)
{
    pthread_mutex_lock(&m->mu);
    unsigned char *base = m->base;
    *len = m->slot_bytes * m->nslots;
    pthread_mutex_unlock(&m->mu);
    return base;
}

size_t ferry__shm_slot_bytes(const ferry__shm *m)
{
    return m->slot_bytes;
}

uint32_t ferry__shm_nslots(const ferry__shm *m)
{
    return m->nslots;
}

void ferry__shm_usage(ferry__shm *m, uint64_t *slot_bytes, uint32_t *nslots, uint32_t *held,
                      uint64_t *memory)
{
    pthread_mutex_lock(&m->mu);
    *slot_bytes = m->slot_bytes;
    *nslots = m->nslots;
    *held = m->held;
    pthread_mutex_unlock(&m->mu);
    struct stat sb;
    *memory = fstat(m->fd, &sb) == 0 ? (uint64_t)sb.st_blocks * 512 : 0;
}

/* Under mu: slot goes back on the free stack. */
static void put_free(ferry__shm *m, int32_t slot)
{
    m->slots[slot].state = SLOT_FREE;
    m->slots[slot].free_ms = ferry__now_ms();
    m->free[m->nfree++] = slot;
}

int32_t ferry__shm_give(ferry__shm *m, uint32_t owner)
{
    int32_t slot = -1;
    pthread_mutex_lock(&m->mu);
    if (m->nfree) {
        slot = m->free[--m->nfree];
        m->slots[slot].state = SLOT_GIVEN;
        m->slots[slot].owner = owner;
        m->slots[slot].touched = 1;
    }
    pthread_mutex_unlock(&m->mu);
    return slot;
}

void ferry__shm_take_back(ferry__shm *m, int32_t slot)
{
    pthread_mutex_lock(&m->mu);
    if (slot >= 0 && (uint32_t)slot < m->nslots && m->slots[slot].state == SLOT_GIVEN)
        put_free(m, slot);
    pthread_mutex_unlock(&m->mu);
}

uint32_t ferry__shm_reclaim(ferry__shm *m, uint32_t owner)
{
    uint32_t n = 0;
    pthread_mutex_lock(&m->mu);
    for (uint32_t i = 0; i < m->nslots; i++) {
        if (m->slots[i].state == SLOT_GIVEN && m->slots[i].owner == owner) {
            put_free(m, (int32_t)i);
            n++;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}

uint64_t ferry__shm_offset(const ferry__shm *m, int32_t slot)
{
    return (uint64_t)slot * m->slot_bytes;
}

void *ferry__shm_data(const ferry__shm *m, int32_t slot)
{
    return m->base + (size_t)slot * m->slot_bytes;
}

void *ferry__shm_hold(ferry__shm *m, int32_t slot, uint64_t bytes)
{
    shm_slot *sl = &m->slots[slot];
    uint64_t extent = bytes && bytes < m->slot_bytes ? bytes : m->slot_bytes;
    pthread_mutex_lock(&m->mu);
    uint64_t mapped = sl->mapped;
    if (extent > mapped)
        sl->mapped = extent;
    sl->state = SLOT_HELD;
    sl->bytes = bytes < m->slot_bytes ? bytes : 0;
    m->held++;
    pthread_mutex_unlock(&m->mu);
    /* The worker has allocated the batch's memory by writing it. The part
     * of the slot this process has not mapped yet (the slot's first batch,
     * or a batch reaching further than any before, or the first since its
     * memory was given back) is mapped here in one call, so the trainer
     * reading it never faults. The rest stays mapped from earlier batches:
     * a steady stream takes no page fault and no syscall here. Held now,
     * so nothing punches the slot meanwhile. Best effort: before Linux 5.14
     * the trainer's first reads fault the pages in. */
#ifdef MADV_POPULATE_READ
    if (extent > mapped)
        (void)madvise(m->base + (size_t)slot * m->slot_bytes + mapped, (size_t)(extent - mapped),
                      MADV_POPULATE_READ);
#endif
    return sl;
}

/* Under mu: slot sl's memory is about to be given back (punch). The hole
 * also unmaps its pages from every process: the next hold maps them again. */
static void forget(shm_slot *sl)
{
    sl->touched = 0;
    sl->mapped = 0;
}

/* Gives slot `slot`'s memory back to the system; the caller has forgotten
 * it, and nobody writes into it meanwhile (m->mu held, or only the
 * caller's thread gives slots). */
static void punch(ferry__shm *m, int32_t slot)
{
    if (m->fd >= 0)
        (void)fallocate(m->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        (off_t)ferry__shm_offset(m, slot), (off_t)m->slot_bytes);
}

uint32_t ferry__shm_trim(ferry__shm *m, uint32_t keep, uint64_t idle_ms)
{
    enum { MAX_PER_CALL = 64 }; /* bounds the time one call takes */
    int32_t cut[MAX_PER_CALL];
    uint32_t n = 0;
    uint64_t now = ferry__now_ms();
    if (__atomic_load_n(&m->keep_pages, __ATOMIC_RELAXED))
        return 0;
    pthread_mutex_lock(&m->mu);
    /* The bottom of the stack was freed first and is given last. */
    for (uint32_t i = 0; i + keep < m->nfree && n < MAX_PER_CALL; i++) {
        shm_slot *sl = &m->slots[m->free[i]];
        if (!sl->touched || now - sl->free_ms < idle_ms)
            continue;
        forget(sl);
        cut[n++] = m->free[i];
    }
    pthread_mutex_unlock(&m->mu);
    /* Outside the lock: only this thread gives slots, so none of these can
     * be given meanwhile, and a release elsewhere need not wait. */
    for (uint32_t k = 0; k < n; k++)
        punch(m, cut[k]);
    return n;
}

/* Unmaps and frees m: closed and nothing held. */
static void destroy(ferry__shm *m)
{
    remove_live(m);
    if (m->base)
        munmap(m->base, m->slot_bytes * m->nslots);
    pthread_mutex_destroy(&m->mu);
    free(m->slots);
    free(m->free);
    free(m->staged);
    free(m);
}

void ferry__shm_drain(ferry__shm *m)
{
    if (__atomic_load_n(&m->keep_pages, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&m->mu);
    m->draining = 1;
    for (uint32_t i = 0; i < m->nfree; i++) {
        shm_slot *sl = &m->slots[m->free[i]];
        if (sl->touched) {
            forget(sl);
            punch(m, m->free[i]);
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void ferry__shm_on_free(ferry__shm *m, void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&m->mu);
    m->on_free = fn;
    m->on_free_arg = arg;
    pthread_mutex_unlock(&m->mu);
}

void ferry__shm_keep(ferry__shm *m)
{
    __atomic_store_n(&m->keep_pages, 1, __ATOMIC_RELAXED);
}

void ferry__shm_range(const void *held, void **data, size_t *len)
{
    const shm_slot *s = held;
    *data = s->m->base + (size_t)(s - s->m->slots) * s->m->slot_bytes;
    *len = s->m->slot_bytes;
}

void ferry__shm_release(void *held)
{
    shm_slot *s = held;
    ferry__shm *m = s->m;
    /* The trainer keeps its view of the slot's pages: the next batch
     * written there is read through the same page-table entries, with no
     * fault and no syscall. Those pages are the slot's shared memory,
     * counted once on the machine (a process's PSS shares them out); an
     * RSS figure counts them in full in every process that maps them. They
     * go back to the system when the slot idles (ferry__shm_trim) or the
     * stream ends (ferry__shm_drain), in the scheduler's thread: once the
     * stream has ended, a slot that comes free is said (on_free) and given
     * back there, never here, on the path every batch takes. */
    int32_t slot = (int32_t)(s - m->slots);
    pthread_mutex_lock(&m->mu);
    put_free(m, slot);
    if (m->draining && m->on_free)
        m->on_free(m->on_free_arg);
    int last = --m->held == 0 && !m->open;
    pthread_mutex_unlock(&m->mu);
    if (last)
        destroy(m);
}

void ferry__shm_close(ferry__shm *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    if (m->fd >= 0)
        close(m->fd);
    m->fd = -1;
    m->open = 0;
    m->on_free = NULL; /* the loader goes: a batch released later tells no one */
    int last = m->held == 0;
    pthread_mutex_unlock(&m->mu);
    if (last)
        destroy(m);
}
