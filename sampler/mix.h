/*
 * mix.h - several sources in one stream, drawn by weight.
 *
 * Position in the data flow: inside the sampler. With option `mix` the
 * dataset is K sources laid end to end (source k's items are indices
 * offset[k] .. offset[k] + size[k] - 1, as ferry.Mix and a `concat:` dataset
 * number them), and the epoch's order is not a permutation of them but a
 * draw: global position g (counted over the whole run, all ranks, g = epoch
 * * length + position in the epoch) -> one index. Sharding, batching,
 * padding, resume and reshaping are the sampler's, unchanged: they only see
 * an order of `length` positions per epoch.
 *
 * The draw, a pure function of (mix, seed, shuffle, g):
 *  - The schedule cuts the positions into segments, each with one weight
 *    per source (a segment starts at its step, in positions of the global
 *    order; the first at 0).
 *  - A segment is cut into blocks of FERRY__MIX_BLOCK positions (its last
 *    one short when the next step is not a multiple away). A block gives
 *    each source a quota: its weight's share of the block, rounded by
 *    largest remainder, so the quotas add up to the block's size and every
 *    block realizes the weights to 1/4096. A keyed bijection of the block
 *    (seed, segment, block) lays the quotas out at random, so any stride of
 *    positions (one rank's share) sees the weights too.
 *  - Source k's draws are numbered j = 0, 1, 2, ... in block order: j is
 *    the draws of k in earlier segments and blocks (arithmetic on the
 *    quotas) plus the slot's place in k's quota. So every j is drawn once.
 *  - Draw j of source k is item j % size[k] of k's epoch j / size[k]: its
 *    own keyed permutation (seed, k, that epoch) with shuffle, else in
 *    order. A small source repeats while a large one is still in its first
 *    pass, and each pass serves each of its items once.
 * Nothing is counted as the stream goes: the state of a mixed stream is the
 * sampler's position, whatever K and however long the run.
 *
 * The spec (option `mix`), e.g. "60000,6000,30000;0:0.7,0.2,0.1;100000:0.5,0.3,0.2":
 *   SIZES ";" STEP ":" WEIGHTS { ";" STEP ":" WEIGHTS } [ ";" "length=" L ]
 * SIZES and WEIGHTS are comma-separated, one per source; weights are
 * non-negative and are normalized per segment; steps increase from 0.
 * length (default: the sum of the sizes) is the mixed order's epoch.
 *
 * Thread safety: a parsed mix is only read; a cursor is one caller's.
 */
#ifndef FERRY_SAMPLER_MIX_H
#define FERRY_SAMPLER_MIX_H

#include <stdint.h>

#include "feistel.h"

#define FERRY__MIX_BLOCK 4096u
#define FERRY__MIX_SOURCES_MAX 1024
#define FERRY__MIX_STEPS_MAX 1024
#define FERRY__MIX_SPEC_MAX 16384

typedef struct ferry__mix ferry__mix;

/* Parses and checks a spec: FERRY_OK and *out (ferry__mix_free it), or
 * FERRY_EINVAL / FERRY_ENOMEM with a detail naming what is wrong. */
int ferry__mix_parse(const char *spec, ferry__mix **out);
void ferry__mix_free(ferry__mix *m);

uint32_t ferry__mix_sources(const ferry__mix *m);
/* Items of every source together: the dataset's length. */
uint64_t ferry__mix_total(const ferry__mix *m);
/* Positions in one epoch of the mixed order. */
uint64_t ferry__mix_length(const ferry__mix *m);
/* 32 bits over what the draws before global position g depend on (the
 * sizes, the length, the schedule up to the block holding g), equal, but
 * for chance, only between mixes that drew those positions alike: kept in
 * a position blob, so that a resume refuses a foreign mix yet takes a
 * schedule changed only after the saved position. */
uint32_t ferry__mix_fingerprint_at(const ferry__mix *m, uint64_t g);

/* What consecutive draws of one batch share: the last block's key
 * schedule, and the pass each source was last drawn in (by source % 8).
 * Zero it (ferry__mix_cursor_init) before the first draw; it is valid for
 * one (mix, seed, shuffle) only. */
#define FERRY__MIX_CACHED 8
typedef struct ferry__mix_pass {
    int valid;
    uint32_t source;
    uint64_t first; /* its first draw: pass * the source's size */
    uint64_t keys[FERRY__FEISTEL_ROUNDS];
} ferry__mix_pass;

typedef struct ferry__mix_cursor {
    uint64_t block_tag; /* (segment, block) + 1 of block_keys; 0: none */
    uint64_t block_keys[FERRY__FEISTEL_ROUNDS];
    ferry__mix_pass pass[FERRY__MIX_CACHED];
} ferry__mix_cursor;

void ferry__mix_cursor_init(ferry__mix_cursor *c);

/* The index of source k's draw j (< its size: pass j / size, item
 * j % size of that pass's order). ferry__mix_draw ends in it. */
uint64_t ferry__mix_item(const ferry__mix *m, uint64_t seed, int shuffle, uint32_t k, uint64_t j,
                         ferry__mix_cursor *c);

/* The index at global position g, and (when source is not NULL) which
 * source it is of. */
uint64_t ferry__mix_draw(const ferry__mix *m, uint64_t seed, int shuffle, uint64_t g,
                         ferry__mix_cursor *c, uint32_t *source);

#endif
