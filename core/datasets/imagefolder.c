/*
 * imagefolder.c - the built-in dataset over a folder of images in
 * torchvision's ImageFolder layout, decoded and cropped in C (image.c).
 *
 * Spec: imagefolder:root=DIR[,KEY=VAL...], keys:
 *   size=S          output S x S (default 224)
 *   crop=random     RandomResizedCrop(S) + RandomHorizontalFlip (default)
 *   crop=center     Resize(resize) + CenterCrop(S), no flip
 *   scale=LO:HI     RandomResizedCrop's scale (default 0.08:1)
 *   ratio=LO:HI     and ratio (default 0.75:1.3333333333333333)
 *   resize=R        crop=center's shorter side before the crop (default S/0.875)
 *   flip=0|1        the horizontal flip (default: 1 with crop=random)
 *   layout=chw|hwc  image's layout (default chw)
 *   dtype=uint8|float32  float32 is ToTensor (/255) then Normalize(mean, std)
 *   mean=A:B:C, std=A:B:C  for float32 (default 0:0:0 and 1:1:1)
 *   on_error=fail|skip  a file that does not decode fails its batch (default),
 *                   or is replaced by another item drawn from (seed, epoch,
 *                   index), with a warning
 *   box=0|1         adds field "box" (i64[5]: top, left, height, width,
 *                   flipped) with the crop in the source image's pixels
 *   dct=0|1         decode JPEGs at a reduced DCT scale where that still
 *                   covers the output (default 1; 0: always full size)
 * Fields: "image" (uint8 or float32, [3,S,S] or [S,S,3]), "label" (i64).
 *
 * The listing is torchvision's: classes are root's subfolders (symlinks
 * followed) sorted by name, label = rank; each class's files are those of
 * sorted(os.walk(class, followlinks=True)) with an image extension
 * (case-insensitive; torchvision's list), in that order; a class with no
 * such file is an error, as in torchvision. So item i is torchvision's item
 * i. Files with an extension it lists but that are neither JPEG nor PNG
 * (.bmp, .webp, .tif...) fail when read, naming the file. Paths are kept
 * as offsets into one pool of names: about 12 bytes + the file name per
 * item.
 *
 * Randomness: item i of epoch e is cropped from ferry_sample_seed(seed, e,
 * i) alone, so it is the same bytes whatever the workers or the resume.
 *
 * The options, the schema and the batch loop are shared with the other
 * image kind (imagekind.c); this file lists the folder and reads a file.
 *
 * Threads: a handle is one worker's (its decoder scratch and file buffer);
 * nothing is global.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "imagekind.h"

#define IF_MAX_DEPTH 64
#define IF_MAX_FILE_BYTES (1ull << 30)

/* torchvision's IMG_EXTENSIONS. */
static const char *const image_extensions[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                               ".pgm", ".tif",  ".tiff", ".webp"};

typedef struct if_item {
    uint32_t dir, name; /* offsets into the pool */
    uint32_t label;
} if_item;

typedef struct imagefolder {
    ferry__image_kind k; /* options, decoder, the batch loop */
    char root[PATH_MAX];
    char *pool; /* NUL-terminated names */
    size_t pool_len, pool_cap;
    if_item *items;
    size_t nitems, items_cap;
    uint8_t *file; /* the file being decoded */
    size_t file_cap;
} imagefolder;

/* --- The listing --- */

/* Appends `len` bytes of s and a NUL to the pool; its offset in *off. */
static int pool_add(imagefolder *h, const char *s, size_t len, uint32_t *off)
{
    if (h->pool_len + len + 1 > UINT32_MAX ||
        ferry__grow(&h->pool, &h->pool_cap, h->pool_len + len + 1, 1))
        return -1;
    memcpy(h->pool + h->pool_len, s, len);
    h->pool[h->pool_len + len] = '\0';
    *off = (uint32_t)h->pool_len;
    h->pool_len += len + 1;
    return 0;
}

static int has_image_extension(const char *name)
{
    size_t n = strlen(name);
    for (size_t e = 0; e < FERRY__ARRAY_LEN(image_extensions); e++) {
        size_t el = strlen(image_extensions[e]);
        if (n >= el && strcasecmp(name + n - el, image_extensions[e]) == 0)
            return 1;
    }
    return 0;
}

/* Whether entry `name` of open directory `dirfd` is a directory, following
 * symlinks as os.walk(followlinks=True) and Path.is_dir() do. */
static int entry_is_dir(int dirfd, const struct dirent *e)
{
    struct stat st;
    if (e->d_type == DT_DIR)
        return 1;
    if (e->d_type != DT_LNK && e->d_type != DT_UNKNOWN)
        return 0;
    return fstatat(dirfd, e->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode);
}

static int by_name(const void *a, const void *b, void *pool)
{
    const char *names = pool;
    return strcmp(names + *(const uint32_t *)a, names + *(const uint32_t *)b);
}

static int by_dir_then_name(const void *a, const void *b, void *pool)
{
    const if_item *x = a, *y = b;
    const char *names = pool;
    int c = strcmp(names + x->dir, names + y->dir);
    return c ? c : strcmp(names + x->name, names + y->name);
}

static int push_item(imagefolder *h, uint32_t dir, uint32_t name, uint32_t label)
{
    if (ferry__grow(&h->items, &h->items_cap, h->nitems + 1, sizeof *h->items))
        return -1;
    h->items[h->nitems++] = (if_item){dir, name, label};
    return 0;
}

/* Adds the image files under relative folder `rel` (root/rel) and its
 * subfolders as items of `label`, in any order (sorted afterwards). */
static int walk(imagefolder *h, const char *rel, uint32_t label, int depth, char *errbuf,
                size_t errlen)
{
    char path[PATH_MAX];
    uint32_t dir_off;
    int rc = FERRY_OK;

    if (depth > IF_MAX_DEPTH)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "imagefolder: %s/%s is more than %d folders deep (a symlink "
                                  "loop?)",
                                  h->root, rel, IF_MAX_DEPTH);
    if ((size_t)snprintf(path, sizeof path, "%s/%s", h->root, rel) >= sizeof path)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "imagefolder: path %s/%s is too long", h->root, rel);
    DIR *dir = opendir(path);
    if (dir == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "imagefolder: %s: %s", path,
                                  strerror(errno));
    if (pool_add(h, rel, strlen(rel), &dir_off)) {
        closedir(dir);
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM,
                                  "imagefolder: out of memory listing %s", path);
    }
    struct dirent *e;
    errno = 0;
    while (rc == FERRY_OK && (e = readdir(dir)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (entry_is_dir(dirfd(dir), e)) {
            char sub[PATH_MAX];
            if ((size_t)snprintf(sub, sizeof sub, "%s/%s", rel, e->d_name) >= sizeof sub)
                rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                        "imagefolder: path %s/%s/%s is too long", h->root, rel,
                                        e->d_name);
            else
                rc = walk(h, sub, label, depth + 1, errbuf, errlen);
        } else if (has_image_extension(e->d_name)) {
            uint32_t name_off;
            if (pool_add(h, e->d_name, strlen(e->d_name), &name_off) ||
                push_item(h, dir_off, name_off, label))
                rc = ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM,
                                        "imagefolder: out of memory listing %s", path);
        }
        errno = 0;
    }
    if (rc == FERRY_OK && errno != 0)
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "imagefolder: reading %s: %s",
                                path, strerror(errno));
    closedir(dir);
    return rc;
}

/* Lists root's classes and their files, in torchvision's order. */
static int list_root(imagefolder *h, char *errbuf, size_t errlen)
{
    uint32_t *classes = NULL;
    size_t ncls = 0, cap = 0;
    int rc = FERRY_OK;
    DIR *dir = opendir(h->root);

    if (dir == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "imagefolder: root %s: %s",
                                  h->root, strerror(errno));
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            !entry_is_dir(dirfd(dir), e))
            continue;
        if (ferry__grow(&classes, &cap, ncls + 1, sizeof *classes) ||
            pool_add(h, e->d_name, strlen(e->d_name), &classes[ncls++])) {
            rc = FERRY_ENOMEM;
            break;
        }
    }
    closedir(dir);
    if (rc != FERRY_OK) {
        free(classes);
        return ferry__dataset_err(errbuf, errlen, rc, "imagefolder: out of memory listing %s",
                                  h->root);
    }
    if (ncls == 0) {
        free(classes);
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "imagefolder: root %s has no class folders (expected "
                                  "ROOT/<class>/<image>)",
                                  h->root);
    }
    qsort_r(classes, ncls, sizeof *classes, by_name, h->pool);
    for (size_t c = 0; c < ncls && rc == FERRY_OK; c++) {
        size_t from = h->nitems;
        char rel[NAME_MAX + 1];
        snprintf(rel, sizeof rel, "%s", h->pool + classes[c]);
        rc = walk(h, rel, (uint32_t)c, 0, errbuf, errlen);
        if (rc == FERRY_OK && h->nitems == from)
            rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                    "imagefolder: class folder %s/%s has no image files (.jpg, "
                                    ".jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp)",
                                    h->root, rel);
        if (rc == FERRY_OK)
            qsort_r(h->items + from, h->nitems - from, sizeof *h->items, by_dir_then_name,
                    h->pool);
    }
    free(classes);
    return rc;
}

/* --- Open, batches --- */

static void if_close(void *handle)
{
    imagefolder *h = handle;
    if (h == NULL)
        return;
    ferry__image_kind_free(&h->k);
    free(h->pool);
    free(h->items);
    free(h->file);
    free(h);
}

/* Reads the file at `path` whole into h->file; its length in *len. Returns 0,
 * or -1 with the reason in err. */
static int read_file(imagefolder *h, const char *path, size_t *len, char *err, size_t errlen)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC), r = -1;
    if (fd < 0 || fstat(fd, &st) != 0)
        snprintf(err, errlen, "%s", strerror(errno));
    else if ((uint64_t)st.st_size > IF_MAX_FILE_BYTES)
        snprintf(err, errlen, "the file is %lld bytes, more than the %llu allowed",
                 (long long)st.st_size, IF_MAX_FILE_BYTES);
    else if (ferry__grow(&h->file, &h->file_cap, (size_t)st.st_size, 1))
        snprintf(err, errlen, "out of memory for %lld bytes", (long long)st.st_size);
    else if ((r = ferry__pread_full(fd, h->file, (size_t)st.st_size, 0)) != 0)
        snprintf(err, errlen, "%s", r == -1 ? strerror(errno) : "the file shrank while read");
    else
        *len = (size_t)st.st_size;
    if (fd >= 0)
        close(fd);
    return r == 0 ? 0 : -1;
}

static void item_path(const imagefolder *h, uint64_t i, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s/%s", h->root, h->pool + h->items[i].dir,
             h->pool + h->items[i].name);
}

/* The kind's fetch (see imagekind.h): item i's file, read whole. */
static int if_fetch(void *src, uint64_t i, const uint8_t **data, size_t *len, int64_t *label,
                    char *name, size_t namecap, char *err, size_t errlen)
{
    imagefolder *h = src;
    item_path(h, i, name, namecap);
    *label = h->items[i].label;
    if (read_file(h, name, len, err, errlen))
        return -1;
    *data = h->file;
    return 0;
}

/* The kind's own key (see ferry__image_key_fn): root. */
static int if_key(void *kind, const char *key, size_t klen, const char *v, size_t vlen,
                  char *errbuf, size_t errlen)
{
    imagefolder *h = kind;
    if (!ferry__is_word(key, klen, "root"))
        return 1;
    if (vlen == 0 || vlen >= sizeof h->root)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "imagefolder: root=%.*s: expected a folder", (int)vlen, v);
    memcpy(h->root, v, vlen);
    h->root[vlen] = '\0';
    return FERRY_OK;
}

static int if_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                   ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    imagefolder *h = calloc(1, sizeof *h);
    int rc;

    (void)ctx;
    if (h == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "imagefolder: out of memory");
    ferry__image_kind_init(&h->k, "imagefolder");
    rc = ferry__image_kind_parse(&h->k, args, if_key, h, "root", errbuf, errlen);
    if (rc != FERRY_OK)
        goto fail;
    if (h->root[0] == '\0') {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                "imagefolder: root=DIR is required (imagefolder:root=DIR,size=S)");
        goto fail;
    }
    rc = ferry__image_kind_ready(&h->k, errbuf, errlen);
    if (rc == FERRY_OK)
        rc = list_root(h, errbuf, errlen);
    if (rc != FERRY_OK)
        goto fail;
    h->k.n = h->nitems;
    h->k.fetch = if_fetch;
    h->k.src = h;
    ferry__image_kind_schema(&h->k, schema);
    *handle = h;
    return FERRY_OK;
fail:
    if_close(h);
    return rc;
}

static uint64_t if_length(void *handle)
{
    return ((const imagefolder *)handle)->nitems;
}

static int if_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                        ferry_dataset_error *err)
{
    return ferry__image_kind_batch(&((imagefolder *)handle)->k, req, dst, err);
}

static const ferry_dataset_ops imagefolder_ops = {
    .abi_version = FERRY_DATASET_ABI,
    .name = "imagefolder",
    .open = if_open,
    .length = if_length,
    .get_batch = if_get_batch,
    .close = if_close,
};

/* The kind's paths (see ferry__dataset_kind): root's value. */
static int if_paths(const char *args, ferry__span *path, int max)
{
    const char *cur = args[0] ? args : NULL, *tok;
    size_t len;
    while (max > 0 && ferry__next_comma_token(&cur, &tok, &len)) {
        if (len > 5 && memcmp(tok, "root=", 5) == 0) {
            path[0].off = (size_t)(tok + 5 - args);
            path[0].len = len - 5;
            return 1;
        }
    }
    return 0;
}

const ferry__dataset_kind ferry__imagefolder_kind = {
    .name = "imagefolder",
    .ops = &imagefolder_ops,
    .open = ferry__dataset_open_builtin,
    .paths = if_paths,
};
