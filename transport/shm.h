/*
 * shm.h - the loader's pool of shared-memory batch slots.
 *
 * Position in the data flow: between the local workers (processes, and
 * threads, which map the same memfd again) and the trainer. Instead of sending a batch's bytes through a socket, a local
 * worker writes them straight into a slot of memory it shares with the
 * loader; the BATCH message carries only the header, and the trainer's
 * batch is a view of the slot until it is released. The memory is one
 * memfd: no /dev/shm space is used, and nothing is left behind when the
 * trainer dies, however it dies.
 *
 * One pool per loader, shared by all its local workers (each is given a
 * slot with each TASK, by offset): the slots then follow the prefetch
 * window, not each worker's credits, and a worker's replacement needs
 * nothing new. The pool is created before the workers start (they get the
 * fd at spawn) and sized once the schema is known (the first READY), so
 * the workers started before that find it sized by their first TASK.
 *
 * A slot is free, given (with a task, to a worker), or held (by a batch,
 * in the window or in the trainer's hands). Only the scheduler gives and
 * takes back given slots; a held slot comes back when its batch is
 * released, from any thread. The loader's mapping stays until the pool is
 * closed and every held slot is back, so a batch outlives both the worker
 * that wrote it and the loader (ferry_loader_close's promise).
 *
 * Steady state costs nothing per batch: slots are reused, each slot's
 * memory is allocated and mapped once, when the first batch is written
 * into it (so sizing is instant and the first batch waits for its own slot
 * only), and holding or releasing one allocates nothing. Slots left free
 * for a while beyond what the window reuses are trimmed (ferry__shm_trim),
 * so the memory follows what is in flight and held, down as well as up.
 *
 * Thread safety: one mutex; ferry__shm_release from any thread, the rest
 * from the scheduler thread.
 */
#ifndef FERRY_SHM_H
#define FERRY_SHM_H

#include <stddef.h>
#include <stdint.h>

typedef struct ferry__shm ferry__shm;

/* Slots start on this boundary in the memfd (and so in every mapping). */
#define FERRY__SHM_SLOT_ALIGN 4096

/* An empty pool: a memfd of size 0, to pass to workers before it is
 * sized. FERRY_ESYS or FERRY_ENOMEM; *out untouched on failure. */
int ferry__shm_new(ferry__shm **out);

/* The memfd (close-on-exec), for workers to inherit at spawn; -1 once the
 * pool is closed. */
int ferry__shm_fd(const ferry__shm *m);

/* Sizes the pool once: nslots slots of slot_bytes (rounded up to
 * FERRY__SHM_SLOT_ALIGN) each, memory allocated slot by slot as the
 * workers first write into them. FERRY_EINVAL if already sized or 0 slots, FERRY_ESYS (with errno
 * detail) when the memfd cannot be grown or mapped; the pool stays unsized
 * then and is still usable as one that gives no slots. */
int ferry__shm_size(ferry__shm *m, size_t slot_bytes, uint32_t nslots);

/* Gives the memory of free slots back to the system: those below the
 * `keep` freed last on the free stack (the ones given next) that have been
 * free for idle_ms or more, at most 64 per call. A trainer that held many
 * batches at once and let them go leaves the pool's memory at that high
 * mark until this runs; a trimmed slot gets new memory when next given
 * (its worker then faults its pages in as it writes). Only from the
 * thread that gives slots. Returns how many were trimmed. */
uint32_t ferry__shm_trim(ferry__shm *m, uint32_t keep, uint64_t idle_ms);

/* The bytes of each slot (0 while unsized) and their number. */
size_t ferry__shm_slot_bytes(const ferry__shm *m);
uint32_t ferry__shm_nslots(const ferry__shm *m);

/* The pool's size, held slots and the bytes of memory its memfd holds now,
 * for the stats; from any thread. */
void ferry__shm_usage(ferry__shm *m, uint64_t *slot_bytes, uint32_t *nslots, uint32_t *held,
                      uint64_t *memory);

/* Gives a free slot to `owner` (a worker index). -1 when none is free (or
 * the pool is unsized): the task then goes the message way. */
int32_t ferry__shm_give(ferry__shm *m, uint32_t owner);

/* Given slot `slot` comes back free (its task was answered without it, or
 * failed). */
void ferry__shm_take_back(ferry__shm *m, int32_t slot);

/* Every slot given to `owner` comes back free: that worker is dead, and its
 * tasks are being sent again. Returns how many. */
uint32_t ferry__shm_reclaim(ferry__shm *m, uint32_t owner);

/* Where slot `slot` lies: its offset in the memfd, and its bytes in the
 * loader's mapping. */
uint64_t ferry__shm_offset(const ferry__shm *m, int32_t slot);
void *ferry__shm_data(const ferry__shm *m, int32_t slot);

/* The loader's mapping of every slot and its length, NULL before the pool
 * is sized. It stays until the pool is destroyed: for thread workers,
 * which write through it (one set of page-table entries in the process).
 * From any thread. */
unsigned char *ferry__shm_mapping(ferry__shm *m, size_t *len);

/* Given slot `slot` now backs a batch whose fields end `bytes` into it:
 * returns the context to pass to ferry__shm_release (a
 * ferry__batch_backing's release) when the batch goes. Never fails,
 * allocates nothing; maps here those of the bytes' pages that are not
 * mapped yet (none, once a slot is in steady use). Scheduler thread. */
void *ferry__shm_hold(ferry__shm *m, int32_t slot, uint64_t bytes);
void ferry__shm_release(void *held);

/* The slot a ferry__shm_hold context stands for: its whole range in the
 * loader's mapping. From any thread while the slot is held. */
void ferry__shm_range(const void *held, void **data, size_t *len);

/* The stream has ended: no slot will be given again, so the free slots'
 * memory goes back now (unless ferry__shm_keep), and from now on each slot
 * that comes free is said to on_free, whose owner calls this again. From
 * the scheduler thread (it punches holes: not for the trainer's). */
void ferry__shm_drain(ferry__shm *m);

/* fn(arg), called under the pool's lock (it must take no lock of ours:
 * an eventfd write) whenever a slot comes free once the pool drains; until
 * ferry__shm_close. */
void ferry__shm_on_free(ferry__shm *m, void (*fn)(void *), void *arg);

/* From now on every slot keeps the pages it has: none is trimmed or
 * drained. For slots page-locked by a device
 * runtime (cudaHostRegister pins the pages a range has when it is
 * registered; a trimmed slot would get new pages the device never sees).
 * The memory then stays at the most that was ever in flight and held at
 * once. From any thread. */
void ferry__shm_keep(ferry__shm *m);

/* The loader is done with the pool: the memfd is closed now, the mapping
 * once the last held slot is released (at once if none is). NULL is fine. */
void ferry__shm_close(ferry__shm *m);

#endif
