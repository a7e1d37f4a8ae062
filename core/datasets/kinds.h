/*
 * kinds.h - what a dataset kind is, for core/dataset.c and the kinds in
 * core/datasets/ (synthetic.c, npy.c, plugin.c); nothing else includes it.
 *
 * A spec reads "KIND:ARGS". core/dataset.c looks KIND up in its table of
 * ferry__dataset_kind entries, has the kind open ARGS, then validates what it
 * got (schema, length) the same way for every kind. A kind only has to turn
 * its text into an open ferry_dataset_ops table + handle. The built-ins keep
 * a static ferry_dataset_ops table, the shape a plugin exports, and are opened
 * through it by ferry__dataset_open_builtin; the plugin kind finds its table
 * in a shared object.
 *
 * Also here: the few helpers more than one kind needs (messages, integers,
 * comma lists, array sizes), defined once in core/dataset.c.
 *
 * Threads: kinds keep no global state; a ferry__dataset belongs to one worker.
 */
#ifndef FERRY_CORE_DATASETS_KINDS_H
#define FERRY_CORE_DATASETS_KINDS_H

#include <stddef.h>
#include <stdint.h>

#include "dataset.h"

/* Datasets hand ferry raw little-endian bytes (the synthetic fill stores
 * whole words, npy '<' data is used as is). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ferry assumes a little-endian host");

#define FERRY__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

typedef struct ferry__dataset_kind ferry__dataset_kind;

typedef struct ferry__span {
    size_t off, len;
} ferry__span;

struct ferry__dataset_kind {
    const char *name; /* the KIND of "KIND:ARGS", without the ':' */

    /* The kind's own table, when it has a static one (the built-ins); NULL
     * when open finds it elsewhere (a plugin's shared object). */
    const ferry_dataset_ops *ops;

    /* Opens the dataset `args` describes. On success sets d->ops, d->handle
     * and d->schema (and d->dl for a plugin) and returns FERRY_OK. On failure
     * returns a negative code with a message in errbuf (NUL-terminated when
     * errlen > 0), leaves d->ops and d->dl as they were and nothing open (a
     * plugin whose own open failed stays loaded if d->keep_loaded); d->handle
     * and d->schema may have been written, and mean nothing while d->ops is
     * NULL. */
    int (*open)(const ferry__dataset_kind *kind, ferry__dataset *d, const char *args,
                const ferry_dataset_ctx *ctx, char *errbuf, size_t errlen);

    /* Where ARGS names files, for ferry__dataset_absolute: fills path[i]
     * with the offset and length in args of up to `max` file paths and
     * returns how many; NULL for a kind that names none. Only paths that
     * open would take relative to the working directory count (a plugin's
     * bare file name is searched for by dlopen, not relative). */
    int (*paths)(const char *args, ferry__span *path, int max);
};

extern const ferry__dataset_kind ferry__synthetic_kind;
extern const ferry__dataset_kind ferry__npy_kind;
extern const ferry__dataset_kind ferry__plugin_kind;
extern const ferry__dataset_kind ferry__imagefolder_kind;
extern const ferry__dataset_kind ferry__wds_kind;
extern const ferry__dataset_kind ferry__concat_kind;

/* --- Shared by the kinds, defined in core/dataset.c --- */

/* Calls ops->open(args) and, on success, sets d->ops. A failure code that
 * is not one of ferry's becomes FERRY_EDATASET; the message in errbuf is
 * NUL-terminated either way. Leaves d->ops unchanged on failure. */
int ferry__dataset_open_ops(ferry__dataset *d, const ferry_dataset_ops *ops, const char *args,
                            const ferry_dataset_ctx *ctx, char *errbuf, size_t errlen);

/* The open of a kind with a static table: ferry__dataset_open_ops(kind->ops). */
int ferry__dataset_open_builtin(const ferry__dataset_kind *kind, ferry__dataset *d,
                                const char *args, const ferry_dataset_ctx *ctx, char *errbuf,
                                size_t errlen);

/* Formats a message into buf (always NUL-terminated when len > 0) and
 * returns `code`, so a failure reads `return ferry__dataset_err(buf, len,
 * code, ...)`. */
int ferry__dataset_err(char *buf, size_t len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The file paths that spec[0..len) (a whole "KIND:ARGS") names, as
 * ferry__dataset_kind.paths gives them but offset by `base` + the kind's
 * prefix: what a kind made of other specs (concat) reports for each.
 * Returns how many were written (at most max). */
int ferry__dataset_spec_paths(const char *spec, size_t len, size_t base, ferry__span *path,
                              int max);

/* Parses exactly `len` decimal digits (no sign, no spaces, no empty string)
 * into *out. Returns 0, or -1 if the text is not a number or lies outside
 * lo..hi; *out is untouched then. */
int ferry__parse_u64(const char *s, size_t len, uint64_t lo, uint64_t hi, uint64_t *out);

/* Grows *pp (an array of *cap elements of `elem` bytes) to hold at least
 * `want`, doubling from 64. Returns 0, or -1 with *pp and *cap as they were
 * when out of memory or when the size overflows. */
int ferry__grow(void *pp, size_t *cap, size_t want, size_t elem);

/* Reads exactly `len` bytes at `off` with pread, however many calls that
 * takes (EINTR retried). Returns 0, -1 with errno set, or -2 when the file
 * ends first. */
int ferry__pread_full(int fd, void *buf, size_t len, uint64_t off);

/* Walks a comma-separated list: sets *tok and *len to the next element (which
 * may be empty) and moves *cur past it. Returns 0 once the list is exhausted;
 * start with *cur = NULL for an empty list. */
int ferry__next_comma_token(const char **cur, const char **tok, size_t *len);

#endif
