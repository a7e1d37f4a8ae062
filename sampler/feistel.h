/*
 * feistel.h - the keyed bijection both index streams use (sampler.c, mix.c).
 *
 * A balanced Feistel network on 2*h bits, applied until the value falls
 * back in [0, n) (cycle-walking): a bijection on [0, n) computed one
 * position at a time in O(1) memory. Keys come from one 64-bit base, which
 * the caller derives from (seed, what is being permuted).
 */
#ifndef FERRY_SAMPLER_FEISTEL_H
#define FERRY_SAMPLER_FEISTEL_H

#include <stdint.h>

#include "ferry_dataset.h"

/* Rounds. Luby-Rackoff needs 4 on wide halves, but small n means halves of
 * a few bits, where a round mixes little: for n = 5 over 240000 epochs, 6
 * rounds made some orders twice as likely as others, 8 keep every order
 * within about 20% of uniform. A round is one ferry_mix64; 8 rounds cost
 * about 170 ns per index at n = 1.28M (~3.3 cycle-walk passes). */
#define FERRY__FEISTEL_ROUNDS 8

/* The round keys of one base. Each step is a bijection of its input, so
 * distinct bases give distinct key schedules. */
static inline void ferry__feistel_keys(uint64_t base, uint64_t k[FERRY__FEISTEL_ROUNDS])
{
    int r;

    for (r = 0; r < FERRY__FEISTEL_ROUNDS; r++)
        k[r] = ferry_mix64(base + (uint64_t)r);
}

/* The smallest h >= 1 with 4^h >= n; 32 covers every uint64_t. The domain
 * is then < 4n, so cycle-walking takes under 4 steps on average. */
static inline unsigned ferry__feistel_half_bits(uint64_t n)
{
    unsigned h = 1;

    while (h < 32 && (UINT64_C(1) << (2 * h)) < n)
        h++;
    return h;
}

/* The permutation of [0, 4^h), applied until the value falls back in
 * [0, n). Requires i < n: the walk then ends because i's cycle contains i
 * itself. Only shifts, masks and multiplies: this runs for every index. */
static inline uint64_t ferry__feistel_walk(const uint64_t k[FERRY__FEISTEL_ROUNDS], unsigned h,
                                           uint64_t n, uint64_t i)
{
    const uint64_t mask = (UINT64_C(1) << h) - 1;
    uint64_t x = i;
    int r;

    do {
        uint64_t left = x >> h;
        uint64_t right = x & mask;
        for (r = 0; r < FERRY__FEISTEL_ROUNDS; r++) {
            uint64_t next = left ^ (ferry_mix64(k[r] ^ right) & mask);
            left = right;
            right = next;
        }
        x = (left << h) | right;
    } while (x >= n);
    return x;
}

#endif
