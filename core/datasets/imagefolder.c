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

#include "image.h"
#include "kinds.h"
#include "log.h"

#define IF_MAX_DEPTH 64
#define IF_MAX_FILE_BYTES (1ull << 30)
#define IF_SKIP_TRIES 16

/* torchvision's IMG_EXTENSIONS. */
static const char *const image_extensions[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                               ".pgm", ".tif",  ".tiff", ".webp"};

typedef struct if_item {
    uint32_t dir, name; /* offsets into the pool */
    uint32_t label;
} if_item;

typedef struct imagefolder {
    char root[PATH_MAX];
    ferry__image_opts img;
    int f32, on_error_skip, with_box;
    float table[3][256]; /* float32: ((v / 255) - mean) / std per channel */
    char *pool;        /* NUL-terminated names */
    size_t pool_len, pool_cap;
    if_item *items;
    size_t nitems, items_cap;
    uint32_t nclasses;
    ferry__image_dec *dec;
    uint8_t *file; /* the file being decoded */
    size_t file_cap;
    uint8_t *u8; /* one item before float conversion */
    uint64_t skipped;
} imagefolder;

/* --- Options --- */

/* Parses "A:B[:C...]" (exactly n numbers) into v. */
static int parse_doubles(const char *s, size_t len, double *v, int n)
{
    char buf[128], *end;
    if (len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    const char *p = buf;
    for (int i = 0; i < n; i++) {
        errno = 0;
        v[i] = strtod(p, &end);
        if (end == p || errno || !isfinite(v[i]))
            return -1;
        if (i < n - 1 && *end != ':')
            return -1;
        p = end + (i < n - 1);
    }
    return *end == '\0' ? 0 : -1;
}

static int is_word(const char *tok, size_t len, const char *word)
{
    return strlen(word) == len && memcmp(tok, word, len) == 0;
}

/* Sets one KEY=VALUE. *flip_set says whether flip= was given. */
static int if_option(imagefolder *h, const char *tok, size_t len, int *flip_set, int *seen_mean,
                     double mean[3], double stdv[3], char *errbuf, size_t errlen)
{
    const char *eq = memchr(tok, '=', len);
    if (eq == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "imagefolder: option '%.*s' is not KEY=VALUE", (int)len, tok);
    size_t klen = (size_t)(eq - tok), vlen = len - klen - 1;
    const char *v = eq + 1;
    uint64_t u;
    double d[3];
#define KEY(k) is_word(tok, klen, k)
#define BAD(what)                                                                                \
    ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "imagefolder: %.*s=%.*s: expected %s",    \
                       (int)klen, tok, (int)vlen, v, what)
    if (KEY("root")) {
        if (vlen == 0 || vlen >= sizeof h->root)
            return BAD("a folder");
        memcpy(h->root, v, vlen);
        h->root[vlen] = '\0';
    } else if (KEY("size")) {
        if (ferry__parse_u64(v, vlen, 1, FERRY__IMAGE_MAX_SIZE, &u))
            return BAD("an integer in 1..4096");
        h->img.size = (int)u;
    } else if (KEY("resize")) {
        if (ferry__parse_u64(v, vlen, 1, 65535, &u))
            return BAD("an integer in 1..65535");
        h->img.resize = (int)u;
    } else if (KEY("crop")) {
        if (is_word(v, vlen, "random"))
            h->img.random_crop = 1;
        else if (is_word(v, vlen, "center"))
            h->img.random_crop = 0;
        else
            return BAD("random or center");
    } else if (KEY("scale") || KEY("ratio")) {
        if (parse_doubles(v, vlen, d, 2) || !(d[0] > 0) || d[0] > d[1])
            return BAD("LO:HI with 0 < LO <= HI");
        if (KEY("scale")) {
            if (d[1] > 1)
                return BAD("LO:HI with 0 < LO <= HI <= 1");
            h->img.scale_lo = d[0], h->img.scale_hi = d[1];
        } else {
            h->img.ratio_lo = d[0], h->img.ratio_hi = d[1];
        }
    } else if (KEY("flip") || KEY("box") || KEY("dct")) {
        if (ferry__parse_u64(v, vlen, 0, 1, &u))
            return BAD("0 or 1");
        if (KEY("flip"))
            h->img.flip = (int)u, *flip_set = 1;
        else if (KEY("box"))
            h->with_box = (int)u;
        else
            h->img.dct_scale = (int)u;
    } else if (KEY("layout")) {
        if (is_word(v, vlen, "chw") || is_word(v, vlen, "hwc"))
            h->img.hwc = v[0] == 'h';
        else
            return BAD("chw or hwc");
    } else if (KEY("dtype")) {
        if (is_word(v, vlen, "uint8") || is_word(v, vlen, "float32"))
            h->f32 = v[0] == 'f';
        else
            return BAD("uint8 or float32");
    } else if (KEY("mean") || KEY("std")) {
        if (parse_doubles(v, vlen, d, 3))
            return BAD("three numbers A:B:C");
        if (KEY("std") && !(d[0] != 0 && d[1] != 0 && d[2] != 0))
            return BAD("three non-zero numbers A:B:C");
        memcpy(KEY("mean") ? mean : stdv, d, sizeof d);
        *seen_mean = 1;
    } else if (KEY("on_error")) {
        if (is_word(v, vlen, "fail") || is_word(v, vlen, "skip"))
            h->on_error_skip = v[0] == 's';
        else
            return BAD("fail or skip");
    } else {
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "imagefolder: unknown key '%.*s' (expected root, size, crop, "
                                  "scale, ratio, resize, flip, layout, dtype, mean, std, "
                                  "on_error, box, dct)",
                                  (int)klen, tok);
    }
#undef KEY
#undef BAD
    return FERRY_OK;
}

/* --- The listing --- */

/* Appends `len` bytes of s and a NUL to the pool; its offset in *off. */
static int pool_add(imagefolder *h, const char *s, size_t len, uint32_t *off)
{
    if (h->pool_len + len + 1 > UINT32_MAX)
        return -1;
    if (h->pool_len + len + 1 > h->pool_cap) {
        size_t cap = h->pool_cap ? h->pool_cap * 2 : 1 << 16;
        while (cap < h->pool_len + len + 1)
            cap *= 2;
        char *p = realloc(h->pool, cap);
        if (p == NULL)
            return -1;
        h->pool = p;
        h->pool_cap = cap;
    }
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
    return strcmp((const char *)pool + *(const uint32_t *)a, (const char *)pool + *(const uint32_t *)b);
}

static int by_dir_then_name(const void *a, const void *b, void *pool)
{
    const if_item *x = a, *y = b;
    int c = strcmp((const char *)pool + x->dir, (const char *)pool + y->dir);
    return c ? c : strcmp((const char *)pool + x->name, (const char *)pool + y->name);
}

static int push_item(imagefolder *h, uint32_t dir, uint32_t name, uint32_t label)
{
    if (h->nitems == h->items_cap) {
        size_t cap = h->items_cap ? h->items_cap * 2 : 1024;
        if_item *p = realloc(h->items, cap * sizeof *p);
        if (p == NULL)
            return -1;
        h->items = p;
        h->items_cap = cap;
    }
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
        if (ncls == cap) {
            cap = cap ? cap * 2 : 64;
            uint32_t *p = realloc(classes, cap * sizeof *p);
            if (p == NULL) {
                rc = FERRY_ENOMEM;
                break;
            }
            classes = p;
        }
        if (pool_add(h, e->d_name, strlen(e->d_name), &classes[ncls++])) {
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
    h->nclasses = (uint32_t)ncls;
    free(classes);
    return rc;
}

/* --- Open, batches --- */

static void if_close(void *handle)
{
    imagefolder *h = handle;
    if (h == NULL)
        return;
    ferry__image_dec_free(h->dec);
    free(h->pool);
    free(h->items);
    free(h->file);
    free(h->u8);
    free(h);
}

static int if_open(void **handle, const char *args, const ferry_dataset_ctx *ctx,
                   ferry_dataset_schema *schema, char *errbuf, size_t errlen)
{
    imagefolder *h = calloc(1, sizeof *h);
    const char *cur = args[0] ? args : NULL, *tok;
    double mean[3] = {0, 0, 0}, stdv[3] = {1, 1, 1};
    int flip_set = 0, seen_mean = 0, rc;
    size_t len;

    if (h == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "imagefolder: out of memory");
    h->img = (ferry__image_opts){.size = 224, .random_crop = 1, .scale_lo = 0.08,
                                 .scale_hi = 1.0, .ratio_lo = 3.0 / 4.0, .ratio_hi = 4.0 / 3.0,
                                 .dct_scale = 1, .max_pixels = FERRY__IMAGE_MAX_PIXELS};
    while (ferry__next_comma_token(&cur, &tok, &len)) {
        rc = if_option(h, tok, len, &flip_set, &seen_mean, mean, stdv, errbuf, errlen);
        if (rc != FERRY_OK)
            goto fail;
    }
    if (h->root[0] == '\0') {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                "imagefolder: root=DIR is required (imagefolder:root=DIR,size=S)");
        goto fail;
    }
    if (!flip_set)
        h->img.flip = h->img.random_crop;
    if (h->img.resize == 0)
        h->img.resize = (int)lrint(h->img.size / 0.875);
    if (h->img.resize < h->img.size) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                "imagefolder: resize=%d is smaller than size=%d", h->img.resize,
                                h->img.size);
        goto fail;
    }
    if (seen_mean && !h->f32) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                "imagefolder: mean and std go with dtype=float32");
        goto fail;
    }
    for (int c = 0; c < 3; c++)
        ferry__image_norm_table((float)mean[c], (float)stdv[c], h->table[c]);
    h->dec = ferry__image_dec_new();
    h->u8 = malloc((size_t)h->img.size * h->img.size * 3);
    if (h->dec == NULL || h->u8 == NULL) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "imagefolder: out of memory");
        goto fail;
    }
    rc = list_root(h, errbuf, errlen);
    if (rc != FERRY_OK)
        goto fail;

    int64_t S = h->img.size;
    ferry_field_spec *f = &schema->fields[0];
    snprintf(f->name, sizeof f->name, "image");
    f->dtype = h->f32 ? FERRY_DTYPE_F32 : FERRY_DTYPE_U8;
    f->ndim = 3;
    f->shape[0] = h->img.hwc ? S : 3;
    f->shape[1] = S;
    f->shape[2] = h->img.hwc ? 3 : S;
    f = &schema->fields[1];
    snprintf(f->name, sizeof f->name, "label");
    f->dtype = FERRY_DTYPE_I64;
    f->ndim = 0;
    schema->nfields = 2;
    if (h->with_box) {
        f = &schema->fields[2];
        snprintf(f->name, sizeof f->name, "box");
        f->dtype = FERRY_DTYPE_I64;
        f->ndim = 1;
        f->shape[0] = 5;
        schema->nfields = 3;
    }
    (void)ctx;
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

/* Reads item i's file whole into h->file; its length in *len. */
static int read_file(imagefolder *h, const char *path, size_t *len, char *err, size_t errlen)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if ((uint64_t)st.st_size > IF_MAX_FILE_BYTES) {
        snprintf(err, errlen, "the file is %lld bytes, more than the %llu allowed",
                 (long long)st.st_size, IF_MAX_FILE_BYTES);
        close(fd);
        return -1;
    }
    size_t want = (size_t)st.st_size, got = 0;
    if (want > h->file_cap) {
        uint8_t *p = realloc(h->file, want);
        if (p == NULL) {
            snprintf(err, errlen, "out of memory for %zu bytes", want);
            close(fd);
            return -1;
        }
        h->file = p;
        h->file_cap = want;
    }
    while (got < want) {
        ssize_t n = read(fd, h->file + got, want - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(err, errlen, "%s", n < 0 ? strerror(errno) : "the file shrank while read");
            close(fd);
            return -1;
        }
        got += (size_t)n;
    }
    close(fd);
    *len = got;
    return 0;
}

static void item_path(const imagefolder *h, uint64_t i, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s/%s", h->root, h->pool + h->items[i].dir,
             h->pool + h->items[i].name);
}

/* Decodes item i with the crop seeded by `seed` into the k-th place of
 * dst[]. Returns 0, or -1 with the reason in err. */
static int make_item(imagefolder *h, uint64_t i, uint64_t seed, size_t k, void *const dst[],
                     char *path, size_t path_cap, char *err, size_t errlen)
{
    size_t len, px = (size_t)h->img.size * h->img.size * 3;
    ferry__image_box box;
    uint8_t *out = h->f32 ? h->u8 : (uint8_t *)dst[0] + k * px;

    item_path(h, i, path, path_cap);
    if (read_file(h, path, &len, err, errlen) ||
        ferry__image_decode(h->dec, h->file, len, &h->img, seed, out, &box, err, errlen))
        return -1;
    if (h->f32) {
        float *o = (float *)dst[0] + k * px;
        if (h->img.hwc) {
            for (size_t p = 0; p < px; p++)
                o[p] = h->table[p % 3][out[p]];
        } else {
            size_t plane = px / 3;
            for (int c = 0; c < 3; c++)
                ferry__image_normalize(out + c * plane, plane, h->table[c], o + c * plane);
        }
    }
    int64_t label = h->items[i].label;
    memcpy((uint8_t *)dst[1] + k * sizeof label, &label, sizeof label);
    if (h->with_box) {
        int64_t b[5] = {box.top, box.left, box.height, box.width, box.flipped};
        memcpy((uint8_t *)dst[2] + k * sizeof b, b, sizeof b);
    }
    return 0;
}

static int if_get_batch(void *handle, const ferry_batch_request *req, void *const dst[],
                        ferry_dataset_error *err)
{
    imagefolder *h = handle;
    char path[PATH_MAX + NAME_MAX + 2], why[512];

    for (size_t k = 0; k < req->count; k++) {
        uint64_t i = req->indices[k], seed = ferry_sample_seed(req->seed, req->epoch, i);
        if (make_item(h, i, seed, k, dst, path, sizeof path, why, sizeof why) == 0)
            continue;
        if (!h->on_error_skip) {
            err->index = i;
            snprintf(err->message, sizeof err->message, "imagefolder: %s: %s", path, why);
            return FERRY_EBATCH;
        }
        /* Replaced by other items drawn from the same seed, so the batch
         * is the same bytes every time it is made. */
        char bad[sizeof path];
        snprintf(bad, sizeof bad, "%s", path);
        ferry__rng r = {seed ^ 0x5bd1e9955bd1e995ULL};
        int done = 0;
        for (int t = 0; t < IF_SKIP_TRIES && !done; t++) {
            uint64_t j = ferry__rng_below(&r, h->nitems);
            char why2[512];
            done = make_item(h, j, ferry_mix64(seed + (uint64_t)t + 1), k, dst, path,
                             sizeof path, why2, sizeof why2) == 0;
            if (done && ferry__log_nth(++h->skipped, 8))
                ferry__logf(NULL, FERRY_LOG_WARN,
                            "imagefolder: %s does not decode (%s): item %" PRIu64
                            " replaced by item %" PRIu64 " (%" PRIu64
                            " replaced by this worker so far)",
                            bad, why, i, j, h->skipped);
        }
        if (!done) {
            err->index = i;
            snprintf(err->message, sizeof err->message,
                     "imagefolder: %s: %s; and %d items drawn to replace it failed too", bad, why,
                     IF_SKIP_TRIES);
            return FERRY_EBATCH;
        }
    }
    return FERRY_OK;
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
