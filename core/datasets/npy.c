/*
 * npy.c - the built-in dataset over numpy .npy files: one field per file,
 * item i of a field is row i of its file.
 *
 * Spec: npy:[NAME=]PATH[,[NAME=]PATH...]  One field per file, named after the
 * file's basename without ".npy" unless NAME= is given (a prefix before '='
 * counts as a name only if it has no '/'; paths cannot contain ','). Every
 * worker on a host reads the same copy in the page cache. A file of small
 * rows is mapped read-only and private and its rows are copied out of the
 * mapping (its fd is closed right after mapping); a file of rows of
 * NPY_PREAD_MIN or more keeps its fd too. A mapping costs a page fault (a
 * page-table update: several us under a virtual machine) for every page the
 * first time it is read, in every worker, which made the first epoch of
 * ImageNet-shaped rows 3-5x slower than later ones and the first batch 10
 * ms late. So a large row is mapped in one call the first time this worker
 * reads it (MADV_POPULATE_READ, a bit per row says which are), at about
 * the cost of the pread it replaces, and copied out of the mapping from
 * then on: twice pread's speed or more (the kernel's copy out of the page
 * cache walks it page by page: 4.9 against 9-14 GB/s here for 147 KiB
 * rows). A file larger than a quarter of the machine's memory, or a kernel
 * before 5.14, keeps pread() straight into the batch: its page tables, one
 * set per worker, would grow with the file. A row past the file's end (it
 * was truncated after open) is a clear FERRY_EDATASET from pread, not the
 * SIGBUS a mapping gives; one mapped here before the truncation does give
 * SIGBUS, and the worker's replacement, which has mapped nothing, reports
 * the truncation.
 *
 * The header is parsed here, strictly: numpy's format is small, and
 * anything we do not understand is refused rather than misread. Whatever is
 * wrong with a file's own bytes is FERRY_EFORMAT; a missing file or files
 * that disagree with each other are FERRY_EDATASET. Every message names the
 * file.
 *
 * Invariants of an open handle: 1..FERRY_MAX_FIELDS files, each mapped
 * whole and exactly as long as its header says, all with the same number
 * (>= 1) of items; get_batch only copies rows out (indices are checked
 * against that number by core/dataset.c before it is called).
 *
 * Threads: after open a handle changes only in its bits of mapped rows,
 * which only the worker that opened it touches; there is no global state,
 * so each worker (thread or process) opens its own.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kinds.h"

/* Rows this long or longer are read with pread rather than copied out of a
 * mapping (see the top of the file). */
#define NPY_PREAD_MIN (64 * 1024)

typedef struct npy_file {
    void *map; /* the whole file, or NULL */
    size_t map_len;
    const uint8_t *data; /* the first item, inside map */
    size_t row_bytes;    /* one item */
    uint64_t items;      /* shape[0] */
    int fd;              /* large rows: pread from here, or mapped as they are first read */
    const char *path;    /* for pread's errors; owned by the npy handle */
    uint8_t *mapped;     /* large rows: a bit per row mapped here already; NULL: pread them */
} npy_file;

typedef struct npy {
    int nfiles;
    npy_file files[FERRY_MAX_FIELDS];
} npy;

/* The element types we accept, by numpy's two-letter code. */
static const struct npy_type {
    char code[3];
    ferry_dtype dtype;
} npy_types[] = {
    {"u1", FERRY_DTYPE_U8},  {"i1", FERRY_DTYPE_I8},  {"b1", FERRY_DTYPE_BOOL},
    {"u2", FERRY_DTYPE_U16}, {"i2", FERRY_DTYPE_I16}, {"u4", FERRY_DTYPE_U32},
    {"i4", FERRY_DTYPE_I32}, {"u8", FERRY_DTYPE_U64}, {"i8", FERRY_DTYPE_I64},
    {"f2", FERRY_DTYPE_F16}, {"f4", FERRY_DTYPE_F32}, {"f8", FERRY_DTYPE_F64},
};

/* A cursor over the header's dict literal. */
typedef struct scan {
    const char *p, *end;
} scan;

static void scan_ws(scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

/* Consumes `c` after optional whitespace; returns whether it was there. */
static int scan_char(scan *s, char c)
{
    scan_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

/* Consumes the bare word `w` (True, False) if it is next. */
static int scan_word(scan *s, const char *w)
{
    size_t n = strlen(w);
    scan_ws(s);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0)
        return 0;
    if ((size_t)(s->end - s->p) > n && (isalnum((unsigned char)s->p[n]) || s->p[n] == '_'))
        return 0;
    s->p += n;
    return 1;
}

/* A quoted Python string without escapes (numpy writes none in these
 * fields; one with a backslash is refused rather than half-understood). */
static int scan_string(scan *s, const char **str, size_t *len)
{
    char quote;
    scan_ws(s);
    if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
        return 0;
    quote = *s->p++;
    *str = s->p;
    while (s->p < s->end && *s->p != quote) {
        if (*s->p == '\\')
            return 0;
        s->p++;
    }
    if (s->p >= s->end)
        return 0;
    *len = (size_t)(s->p - *str);
    s->p++;
    return 1;
}

/* A tuple of non-negative ints: "(5,)", "(5, 3)", "( 5 ,3, )", Python 2's
 * "(5L, 3L)". Stores at most FERRY_MAX_DIMS of them but counts them all in
 * *ndim, so the caller can say how many there were. */
static int scan_shape(scan *s, int64_t shape[FERRY_MAX_DIMS], int *ndim)
{
    *ndim = 0;
    if (!scan_char(s, '('))
        return 0;
    for (;;) {
        const char *digits;
        uint64_t v;
        if (scan_char(s, ')'))
            return 1;
        scan_ws(s);
        digits = s->p;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
        if (ferry__parse_u64(digits, (size_t)(s->p - digits), 0, INT64_MAX, &v) != 0)
            return 0;
        if (s->p < s->end && *s->p == 'L')
            s->p++;
        if (*ndim < FERRY_MAX_DIMS)
            shape[*ndim] = (int64_t)v;
        (*ndim)++;
        if (!scan_char(s, ','))
            return scan_char(s, ')');
    }
}

/* The 'descr' value: a byte-order char and a two-letter code. Byte order is
 * meaningless for 1-byte types; wider ones must be little-endian ('<', or
 * '=' which is native here). */
static int npy_descr(scan *s, const char *path, ferry_field_spec *f, char *errbuf, size_t errlen)
{
    const struct npy_type *type = NULL;
    const char *d;
    size_t len;

    scan_ws(s);
    if (s->p < s->end && *s->p == '[')
        return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                  "npy: %s: structured dtypes are not supported", path);
    if (!scan_string(s, &d, &len))
        return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                  "npy: %s: malformed header ('descr' is not a string)", path);
    for (size_t t = 0; len == 3 && t < FERRY__ARRAY_LEN(npy_types); t++) {
        if (memchr("<=|>", d[0], 4) != NULL && memcmp(d + 1, npy_types[t].code, 2) == 0)
            type = &npy_types[t];
    }
    if (type != NULL && ferry_dtype_size(type->dtype) > 1 && d[0] == '>')
        return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                  "npy: %s: big-endian dtype '%.*s' is not supported", path,
                                  (int)len, d);
    if (type == NULL || (ferry_dtype_size(type->dtype) > 1 && d[0] == '|'))
        return ferry__dataset_err(
            errbuf, errlen, FERRY_EFORMAT,
            "npy: %s: unsupported dtype '%.*s' (expected a little-endian bool, int, "
            "uint or float)",
            path, (int)len, d);
    f->dtype = type->dtype;
    return FERRY_OK;
}

enum { NPY_DESCR = 1, NPY_FORTRAN = 2, NPY_SHAPE = 4, NPY_ALL = 7 };

/* Parses the header dict in [hdr, hdr + len) into f's dtype and the full
 * shape (shape[0] = items). Longer than most functions here: it is one loop
 * over the dict's keys with each key's check inline, so the accepted header
 * reads in one place. */
static int npy_dict(const char *hdr, size_t len, const char *path, ferry_field_spec *f,
                    int64_t shape[FERRY_MAX_DIMS], int *ndim, char *errbuf, size_t errlen)
{
    scan s = {hdr, hdr + len};
    unsigned seen = 0;
    int rc;

    if (!scan_char(&s, '{'))
        return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                  "npy: %s: malformed header (no dict)", path);
    while (!scan_char(&s, '}')) {
        const char *key;
        size_t klen;
        unsigned bit;
        if (!scan_string(&s, &key, &klen) || !scan_char(&s, ':'))
            return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                      "npy: %s: malformed header (expected 'key': value)", path);
        if (klen == 5 && memcmp(key, "descr", 5) == 0) {
            bit = NPY_DESCR;
            rc = npy_descr(&s, path, f, errbuf, errlen);
            if (rc != FERRY_OK)
                return rc;
        } else if (klen == 13 && memcmp(key, "fortran_order", 13) == 0) {
            bit = NPY_FORTRAN;
            if (scan_word(&s, "True"))
                return ferry__dataset_err(
                    errbuf, errlen, FERRY_EFORMAT,
                    "npy: %s: fortran_order is True (only C order is supported)", path);
            if (!scan_word(&s, "False"))
                return ferry__dataset_err(
                    errbuf, errlen, FERRY_EFORMAT,
                    "npy: %s: malformed header (fortran_order is not True or False)", path);
        } else if (klen == 5 && memcmp(key, "shape", 5) == 0) {
            bit = NPY_SHAPE;
            if (!scan_shape(&s, shape, ndim))
                return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                          "npy: %s: malformed shape (expected a tuple of integers)",
                                          path);
        } else {
            return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                      "npy: %s: unexpected header key '%.*s'", path, (int)klen,
                                      key);
        }
        if (seen & bit)
            return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                      "npy: %s: header key '%.*s' given twice", path, (int)klen,
                                      key);
        seen |= bit;
        if (!scan_char(&s, ',')) {
            if (!scan_char(&s, '}'))
                return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                          "npy: %s: malformed header (expected ',' or '}')", path);
            break;
        }
    }
    scan_ws(&s);
    if (s.p != s.end)
        return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                  "npy: %s: malformed header (text after the dict)", path);
    if (seen != NPY_ALL)
        return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT, "npy: %s: header lacks '%s'", path,
                                  !(seen & NPY_DESCR)   ? "descr"
                                  : !(seen & NPY_SHAPE) ? "shape"
                                                        : "fortran_order");
    if (*ndim < 1 || *ndim > FERRY_MAX_DIMS)
        return ferry__dataset_err(
            errbuf, errlen, FERRY_EFORMAT,
            "npy: %s: shape has %d dims (expected 1..%d; the first counts the items)", path, *ndim,
            FERRY_MAX_DIMS);
    return FERRY_OK;
}

/* Checks the preamble and header of the `size`-byte file at `map`, and that
 * the data that follows is exactly as long as the shape says. Fills f (dtype,
 * item shape) and file's data, row_bytes and items. */
static int npy_parse(npy_file *file, const uint8_t *map, size_t size, const char *path,
                     ferry_field_spec *f, char *errbuf, size_t errlen)
{
    int64_t shape[FERRY_MAX_DIMS];
    size_t hdr_at, hdr_len, data_bytes, expected;
    int ndim = 0, rc;

    if (size < 10 || memcmp(map, "\x93NUMPY", 6) != 0)
        return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT,
                                  "npy: %s is not a .npy file (bad magic)", path);
    if (map[6] == 1 && map[7] == 0) {
        hdr_at = 10;
        hdr_len = (size_t)map[8] | (size_t)map[9] << 8;
    } else if ((map[6] == 2 || map[6] == 3) && map[7] == 0 && size >= 12) {
        hdr_at = 12;
        hdr_len =
            (size_t)map[8] | (size_t)map[9] << 8 | (size_t)map[10] << 16 | (size_t)map[11] << 24;
    } else {
        return ferry__dataset_err(
            errbuf, errlen, FERRY_EFORMAT,
            "npy: %s: unsupported format version %u.%u (expected 1.0, 2.0 or 3.0)", path, map[6],
            map[7]);
    }
    if (hdr_len > size - hdr_at)
        return ferry__dataset_err(
            errbuf, errlen, FERRY_EFORMAT,
            "npy: %s: header length %zu runs past the end of the file (%zu bytes)", path, hdr_len,
            size);

    rc = npy_dict((const char *)map + hdr_at, hdr_len, path, f, shape, &ndim, errbuf, errlen);
    if (rc != FERRY_OK)
        return rc;
    if (ferry__shape_bytes(ferry_dtype_size(f->dtype), shape, ndim, &data_bytes) != 0 ||
        __builtin_add_overflow(hdr_at + hdr_len, data_bytes, &expected))
        return ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT, "npy: %s: shape is too large",
                                  path);
    if (size != expected)
        return ferry__dataset_err(
            errbuf, errlen, FERRY_EFORMAT,
            "npy: %s: %s: file has %zu bytes, expected %zu (%zu header + %zu data)", path,
            size < expected ? "truncated" : "trailing bytes after the data", size, expected,
            hdr_at + hdr_len, data_bytes);

    f->ndim = ndim - 1;
    memcpy(f->shape, shape + 1, sizeof shape[0] * (size_t)f->ndim);
    file->data = map + hdr_at + hdr_len;
    file->items = (uint64_t)shape[0];
    /* Cannot overflow: it divides data_bytes, or shape[0] is 0. */
    ferry__shape_bytes(ferry_dtype_size(f->dtype), shape + 1, f->ndim, &file->row_bytes);
    return FERRY_OK;
}

/* Opens and maps `path`, then parses it into file and f. On failure nothing
 * stays open or mapped. */
static int npy_map(npy_file *file, const char *path, ferry_field_spec *f, char *errbuf,
                   size_t errlen)
{
    struct stat st;
    void *map = MAP_FAILED;
    int fd, rc;

    /* O_NONBLOCK: a FIFO or a device named by mistake must not block the
     * open (it is refused just below); a regular file is unaffected. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "npy: cannot open %s: %s", path,
                                  strerror(errno));
    if (fstat(fd, &st) != 0) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "npy: cannot stat %s: %s", path,
                                strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "npy: %s is not a regular file",
                                path);
        goto fail;
    }
    if (st.st_size == 0) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EFORMAT, "npy: %s is empty", path);
        goto fail;
    }
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "npy: cannot map %s: %s", path,
                                strerror(errno));
        goto fail;
    }
    rc = npy_parse(file, map, (size_t)st.st_size, path, f, errbuf, errlen);
    if (rc != FERRY_OK)
        goto fail;
    file->fd = -1;
    if (file->row_bytes >= NPY_PREAD_MIN) {
        file->path = strdup(path);
        if (file->path == NULL) {
            rc = ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "npy: out of memory");
            goto fail;
        }
        file->fd = fd;
#ifdef MADV_POPULATE_READ
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0 && (uint64_t)st.st_size <= (uint64_t)pages * (uint64_t)page / 4)
            file->mapped = calloc((size_t)(file->items / 8 + 1), 1); /* NULL: pread them */
#endif
    } else {
        close(fd);
    }
    file->map = map;
    file->map_len = (size_t)st.st_size;
    return FERRY_OK;

fail:
    if (map != MAP_FAILED)
        munmap(map, (size_t)st.st_size);
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Where the path of list element tok (len bytes) starts: after a NAME=
 * prefix, which counts as a name only if it has no '/'. */
static const char *npy_path_start(const char *tok, size_t len)
{
    const char *eq = memchr(tok, '=', len);
    if (eq != NULL && eq > tok && memchr(tok, '/', (size_t)(eq - tok)) == NULL)
        return eq + 1;
    return tok;
}

/* The kind's paths (see ferry__dataset_kind): every file of the list. */
static int npy_paths(const char *args, ferry__span *path, int max)
{
    const char *cur = args, *tok;
    size_t len;
    int n = 0;
    while (n < max && ferry__next_comma_token(&cur, &tok, &len)) {
        const char *p = npy_path_start(tok, len);
        path[n].off = (size_t)(p - args);
        path[n].len = len - (size_t)(p - tok);
        n++;
    }
    return n;
}

/* Splits one list element into the path (NUL-terminated, in path[PATH_MAX])
 * and the field name. */
static int npy_name_path(const char *tok, size_t len, char *path, char name[FERRY_NAME_MAX],
                         char *errbuf, size_t errlen)
{
    const char *p = npy_path_start(tok, len), *eq = p > tok ? p - 1 : NULL, *base;
    size_t plen = len - (size_t)(p - tok), nlen;

    if (plen == 0)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "npy: empty path in file list (expected npy:PATH[,PATH...])");
    if (plen >= PATH_MAX)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "npy: path '%.*s...' is too long",
                                  64, p);
    memcpy(path, p, plen);
    path[plen] = '\0';

    if (eq != NULL) {
        base = tok;
        nlen = (size_t)(eq - tok);
    } else {
        base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        nlen = strlen(base);
        if (nlen > 4 && strcmp(base + nlen - 4, ".npy") == 0)
            nlen -= 4;
    }
    if (nlen == 0 || nlen >= FERRY_NAME_MAX)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "npy: %s: field name '%.*s' must be 1..%d bytes (use NAME=PATH)",
                                  path, (int)nlen, base, FERRY_NAME_MAX - 1);
    memcpy(name, base, nlen);
    name[nlen] = '\0';
    return FERRY_OK;
}

static void npy_close(void *handle)
{
    npy *h = handle;
    if (h == NULL)
        return;
    for (int f = 0; f < h->nfiles; f++) {
        munmap(h->files[f].map, h->files[f].map_len);
        if (h->files[f].fd >= 0)
            close(h->files[f].fd);
        free((char *)h->files[f].path);
        free(h->files[f].mapped);
    }
    free(h);
}

static int npy_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                    ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    char path[PATH_MAX], first[PATH_MAX];
    const char *cur = args[0] ? args : NULL, *tok;
    size_t len;
    npy *h;
    int rc;

    if (cur == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "npy: no files given (expected npy:PATH[,PATH...])");
    h = calloc(1, sizeof *h);
    if (h == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "npy: out of memory");
    while (ferry__next_comma_token(&cur, &tok, &len)) {
        ferry_field_spec *f;
        npy_file *file;
        if (h->nfiles == FERRY_MAX_FIELDS) {
            rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "npy: more than %d files",
                                    FERRY_MAX_FIELDS);
            goto fail;
        }
        f = &schema->fields[h->nfiles];
        file = &h->files[h->nfiles];
        rc = npy_name_path(tok, len, path, f->name, errbuf, errlen);
        if (rc != FERRY_OK)
            goto fail;
        rc = npy_map(file, path, f, errbuf, errlen);
        if (rc != FERRY_OK)
            goto fail;
        h->nfiles++;
        if (file->items == 0) {
            rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                    "npy: %s has no items (shape[0] is 0)", path);
            goto fail;
        }
        if (h->nfiles == 1) {
            memcpy(first, path, strlen(path) + 1);
        } else if (file->items != h->files[0].items) {
            rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                    "npy: %s has %" PRIu64 " items but %s has %" PRIu64
                                    " (every file needs the same first dimension)",
                                    path, file->items, first, h->files[0].items);
            goto fail;
        }
    }
    schema->nfields = h->nfiles;
    *handle = h;
    return FERRY_OK;

fail:
    npy_close(h);
    return rc;
}

static uint64_t npy_length(void *handle)
{
    return ((const npy *)handle)->files[0].items;
}

/* Reads row i of file into out with pread, however many calls that takes.
 * FERRY_EDATASET, with the index, when the file cannot be read or ends
 * before the row does (it was truncated after open). */
static int npy_pread_row(const npy_file *file, uint64_t i, uint8_t *out, ferry_dataset_error *err)
{
    uint64_t at = (uint64_t)(file->data - (const uint8_t *)file->map) + i * file->row_bytes;
    int r = ferry__pread_full(file->fd, out, file->row_bytes, at);
    if (r == 0)
        return FERRY_OK;
    err->index = i;
    snprintf(err->message, sizeof err->message, "npy: reading item %" PRIu64 " of %s: %s", i,
             file->path, r == -1 ? strerror(errno) : "the file ends before it (truncated?)");
    return FERRY_EDATASET;
}

/* Whether large row i of file is mapped here, mapping it now (whole pages,
 * one call) the first time. 0 when it cannot be (the kernel has no
 * MADV_POPULATE_READ: every row is pread from then on; or the row lies past
 * the file's end: pread says so). */
static int npy_row_mapped(npy_file *file, uint64_t i)
{
    uint8_t bit = (uint8_t)(1u << (i % 8));
    if (file->mapped[i / 8] & bit)
        return 1;
#ifdef MADV_POPULATE_READ
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)(file->data + i * file->row_bytes);
    uintptr_t hi = lo + file->row_bytes;
    lo = lo / page * page;
    hi = (hi + page - 1) / page * page;
    if (madvise((void *)lo, hi - lo, MADV_POPULATE_READ) == 0) {
        file->mapped[i / 8] |= bit;
        return 1;
    }
    if (errno == EINVAL) { /* before Linux 5.14 */
        free(file->mapped);
        file->mapped = NULL;
    }
#endif
    return 0;
}

static int npy_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                         ferry_dataset_error *err)
{
    npy *h = handle;
    for (int f = 0; f < h->nfiles; f++) {
        npy_file *file = &h->files[f];
        uint8_t *out = dst[f];
        for (size_t k = 0; k < req->count; k++, out += file->row_bytes) {
            uint64_t i = req->indices[k];
            if (file->fd < 0 || (file->mapped && npy_row_mapped(file, i))) {
                memcpy(out, file->data + i * file->row_bytes, file->row_bytes);
                continue;
            }
            int rc = npy_pread_row(file, i, out, err);
            if (rc != FERRY_OK)
                return rc;
        }
    }
    return FERRY_OK;
}

static const ferry_dataset_ops npy_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "npy",
    .open = npy_open,
    .length = npy_length,
    .get_batch = npy_get_batch,
    .close = npy_close,
};

const ferry__dataset_kind ferry__npy_kind = {
    .name = "npy",
    .ops = &npy_ops,
    .open = ferry__dataset_open_builtin,
    .paths = npy_paths,
};
