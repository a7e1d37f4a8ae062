/*
 * test_image.c - the imagefolder and wds kinds and their decoder
 * (core/datasets/image.c): the listing in torchvision's order, colour
 * spaces, every kind of bad file, determinism per (seed, epoch, index), the
 * crop draws, the options, and tar shards whole and damaged.
 *
 * Images are written here with libjpeg and libpng into a private temporary
 * folder. Most are one flat colour that encodes what the test expects (the
 * item's position in the listing), so that any crop of them must come out
 * that colour within JPEG's error.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <jpeglib.h>
#include <png.h>

#include "dataset.h"
#include "datasets/image.h"
#include "harness.h"

/* --- Writing images --- */

typedef void (*pixel_fn)(int x, int y, uint8_t *px, void *arg);

/* Writes a JPEG of `comps` components (1 grey, 3 RGB, 4 CMYK with libjpeg's
 * Adobe marker) with px() giving each pixel. */
static void write_jpeg(const char *path, int w, int h, int comps, pixel_fn px, void *arg,
                       int progressive)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = comps;
    c.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    if (progressive)
        jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    uint8_t *row = malloc((size_t)w * comps + 4); /* px() writes up to 4 bytes */
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++)
            px(x, y, row + (size_t)x * comps, arg);
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    free(row);
    fclose(f);
}

/* Writes an 8-bit PNG of format `fmt` (libpng's simplified API). */
static void write_png(const char *path, int w, int h, png_uint_32 fmt, pixel_fn px, void *arg)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)w;
    img.height = (png_uint_32)h;
    img.format = fmt;
    int comps = (int)PNG_IMAGE_PIXEL_CHANNELS(fmt);
    uint8_t *buf = malloc((size_t)w * h * comps + 4);
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++)
            px(x, y, buf + ((size_t)y * w + x) * comps, arg);
    }
    assert_true(png_image_write_to_file(&img, path, 0, buf, 0, NULL));
    free(buf);
}

static void flat(int x, int y, uint8_t *px, void *arg)
{
    const uint8_t *c = arg;
    (void)x, (void)y;
    memcpy(px, c, 4);
}

/* A smooth pattern with detail, so crops and flips show. */
static void pattern(int x, int y, uint8_t *px, void *arg)
{
    (void)arg;
    px[0] = (uint8_t)(x * 255 / 300);
    px[1] = (uint8_t)(y * 255 / 200);
    px[2] = (uint8_t)(128 + 100 * sin(x / 9.0) * cos(y / 7.0));
}

/* The flat colour of listing position k. */
static void colour_of(int k, uint8_t c[4])
{
    c[0] = (uint8_t)(20 + 30 * k);
    c[1] = (uint8_t)(230 - 25 * k);
    c[2] = (uint8_t)(60 + 15 * (k % 5));
    c[3] = 255;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void make_dir(const char *fmt, ...)
{
    char p[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof p, fmt, ap);
    va_end(ap);
    assert_true(mkdir(p, 0755) == 0 || errno == EEXIST);
}

static void *read_whole(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    rewind(f);
    void *p = malloc(*len ? *len : 1);
    assert_int_equal(fread(p, 1, *len, f), *len);
    fclose(f);
    return p;
}


/* --- Tar shards --- */

typedef struct tar_member {
    const char *name;
    const void *data;
    size_t len;
} tar_member;

/* Appends one ustar member (header + data padded to 512) to buf at *at. */
static void tar_add(uint8_t *buf, size_t *at, const tar_member *m)
{
    uint8_t *h = buf + *at;
    memset(h, 0, 512);
    snprintf((char *)h, 100, "%s", m->name);
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 124, 12, "%011zo", m->len);
    snprintf((char *)h + 136, 12, "%011o", 0);
    h[156] = '0';
    memcpy(h + 257, "ustar\0" "00", 8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    memcpy(h + 512, m->data, m->len);
    *at += 512 + (m->len + 511) / 512 * 512;
}

/* --- Opening and batches --- */

typedef struct batch {
    void *dst[3];
    size_t bytes[3];
} batch;

static void open_ok(ferry__dataset *ds, const char *fmt, ...)
{
    char spec[2048], err[1024] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(spec, sizeof spec, fmt, ap);
    va_end(ap);
    int rc = ferry__dataset_open(ds, spec, NULL, err, sizeof err);
    if (rc != FERRY_OK)
        fail_msg("open %s: %s (%s)", spec, ferry_err_name(rc), err);
}

static int get(ferry__dataset *ds, uint64_t seed, uint64_t epoch, const uint64_t *idx,
               size_t count, batch *b, ferry_dataset_error *err)
{
    ferry_batch_request req = {.epoch = epoch, .seed = seed, .indices = idx, .count = count};
    for (int f = 0; f < ds->schema.nfields; f++) {
        b->bytes[f] = count * ds->item_bytes[f];
        b->dst[f] = aligned_alloc(64, (b->bytes[f] + 63) / 64 * 64);
        memset(b->dst[f], 0xAA, b->bytes[f]);
    }
    return ferry__dataset_get_batch(ds, &req, b->dst, err);
}

static void batch_free(batch *b)
{
    for (int f = 0; f < 3; f++)
        free(b->dst[f]), b->dst[f] = NULL;
}

static void expect_open_fails(const char *spec, const char *words)
{
    ferry__dataset ds;
    char err[1024] = "";
    int rc = ferry__dataset_open(&ds, spec, NULL, err, sizeof err);
    assert_int_equal(rc, FERRY_EDATASET);
    if (strstr(err, words) == NULL)
        fail_msg("open %s: message '%s' lacks '%s'", spec, err, words);
}

static char tmp[512];

static int setup(void **state)
{
    (void)state;
    return ft_make_tmpdir(tmp, sizeof tmp, "image") == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return ft_remove_tree(tmp);
}

/* --- Tests --- */

/* Classes sorted by name (a hidden folder and a symlinked one count, as in
 * torchvision); files in sorted(os.walk()) order: a folder's own files
 * before its subfolders', whatever the full paths' order; extensions
 * case-insensitive; other files left out. */
static void test_listing_follows_torchvision_order(void **state)
{
    (void)state;
    char root[600], p[1024];
    uint8_t c[4];
    snprintf(root, sizeof root, "%s/list", tmp);
    make_dir("%s", root);
    make_dir("%s/.hidden", root);
    make_dir("%s/a_cls", root);
    make_dir("%s/a_cls/sub2", root);
    make_dir("%s/b_cls", root);
    make_dir("%s/b_cls/sub", root);
    make_dir("%s/elsewhere", tmp);
    snprintf(p, sizeof p, "%s/elsewhere", tmp);
    char link[1024];
    snprintf(link, sizeof link, "%s/c_link", root);
    assert_int_equal(symlink(p, link), 0);
    /* In the expected order (k = position). */
    const char *files[] = {".hidden/z.jpg", "a_cls/10.jpg", "a_cls/2.png", "a_cls/sub2/0.jpg",
                           "b_cls/x.JPG",   "b_cls/sub/a.jpeg", "c_link/only.Jpeg"};
    const int label[] = {0, 1, 1, 1, 2, 2, 3};
    for (int k = 0; k < 7; k++) {
        colour_of(k, c);
        snprintf(p, sizeof p, "%s/%s", root, files[k]);
        if (strstr(files[k], ".png"))
            write_png(p, 40, 30, PNG_FORMAT_RGBA, flat, c);
        else
            write_jpeg(p, 40, 30, 3, flat, c, 0);
    }
    snprintf(p, sizeof p, "%s/a_cls/notes.txt", root);
    write_file(p, "not an image", 12);

    ferry__dataset ds;
    open_ok(&ds, "imagefolder:root=%s,size=16,crop=center", root);
    assert_int_equal(ds.length, 7);
    uint64_t idx[7] = {0, 1, 2, 3, 4, 5, 6};
    batch b = {0};
    ferry_dataset_error err;
    assert_int_equal(get(&ds, 1, 0, idx, 7, &b, &err), FERRY_OK);
    for (int k = 0; k < 7; k++) {
        const uint8_t *img = (const uint8_t *)b.dst[0] + (size_t)k * 3 * 16 * 16;
        colour_of(k, c);
        for (int ch = 0; ch < 3; ch++) {
            int got = img[ch * 256 + 8 * 16 + 8];
            if (abs(got - c[ch]) > 6)
                fail_msg("item %d (%s) channel %d: %d, expected %d", k, files[k], ch, got,
                         c[ch]);
        }
        assert_int_equal(((int64_t *)b.dst[1])[k], label[k]);
    }
    batch_free(&b);
    ferry__dataset_close(&ds);
}

/* Grey and CMYK JPEGs (libjpeg marks CMYK with Adobe's inverted inks) and
 * grey+alpha, RGBA and palette PNGs all come out as RGB. */
static void test_grey_cmyk_and_png_kinds_become_rgb(void **state)
{
    (void)state;
    char root[600], p[1024];
    snprintf(root, sizeof root, "%s/colours", tmp);
    make_dir("%s", root);
    make_dir("%s/c", root);
    uint8_t grey[4] = {77, 0, 0, 0};
    snprintf(p, sizeof p, "%s/c/0_grey.jpg", root);
    write_jpeg(p, 33, 41, 1, flat, grey, 0);
    /* Red: no cyan, full magenta and yellow, no black, written inverted as
     * Adobe's marker (which libjpeg adds for CMYK) says they are. */
    uint8_t cmyk[4] = {255, 0, 0, 255};
    snprintf(p, sizeof p, "%s/c/1_cmyk.jpg", root);
    write_jpeg(p, 33, 41, 4, flat, cmyk, 0);
    uint8_t ga[4] = {200, 10, 0, 0};
    snprintf(p, sizeof p, "%s/c/2_ga.png", root);
    write_png(p, 20, 20, PNG_FORMAT_GA, flat, ga);
    uint8_t rgba[4] = {10, 120, 250, 0}; /* fully transparent: alpha dropped */
    snprintf(p, sizeof p, "%s/c/3_rgba.png", root);
    write_png(p, 20, 20, PNG_FORMAT_RGBA, flat, rgba);
    uint8_t prog[4] = {90, 180, 30, 0};
    snprintf(p, sizeof p, "%s/c/4_progressive.jpg", root);
    write_jpeg(p, 50, 50, 3, flat, prog, 1);
    const uint8_t want[5][3] = {{77, 77, 77}, {255, 0, 0}, {200, 200, 200}, {10, 120, 250},
                                {90, 180, 30}};

    ferry__dataset ds;
    open_ok(&ds, "imagefolder:root=%s,size=8,layout=hwc", root);
    uint64_t idx[5] = {0, 1, 2, 3, 4};
    batch b = {0};
    ferry_dataset_error err;
    assert_int_equal(get(&ds, 3, 0, idx, 5, &b, &err), FERRY_OK);
    for (int k = 0; k < 5; k++) {
        const uint8_t *img = (const uint8_t *)b.dst[0] + (size_t)k * 8 * 8 * 3;
        for (int px = 0; px < 64; px++) {
            for (int ch = 0; ch < 3; ch++) {
                if (abs(img[px * 3 + ch] - want[k][ch]) > 4)
                    fail_msg("item %d pixel %d channel %d: %d, expected %d", k, px, ch,
                             img[px * 3 + ch], want[k][ch]);
            }
        }
    }
    batch_free(&b);
    ferry__dataset_close(&ds);
}

/* Each bad file fails the batch it is in with FERRY_EBATCH, its index and a
 * message naming it and the reason; a batch of good items still decodes. */
static void test_bad_files_fail_their_batch_naming_the_file(void **state)
{
    (void)state;
    char root[600], p[1024];
    snprintf(root, sizeof root, "%s/bad", tmp);
    make_dir("%s", root);
    make_dir("%s/c", root);
    snprintf(p, sizeof p, "%s/c/0_good.jpg", root);
    write_jpeg(p, 64, 64, 3, pattern, NULL, 0);
    size_t len;
    uint8_t *good = read_whole(p, &len);
    snprintf(p, sizeof p, "%s/c/1_empty.jpg", root);
    write_file(p, "", 0);
    snprintf(p, sizeof p, "%s/c/2_truncated.jpg", root);
    write_file(p, good, len / 2);
    snprintf(p, sizeof p, "%s/c/3_html.jpg", root);
    write_file(p, "<!DOCTYPE html><html></html>", 28);
    snprintf(p, sizeof p, "%s/c/4_bitmap.bmp", root);
    write_file(p, "BM\x36\x00\x00\x00\x00\x00", 8);
    uint8_t junk[64] = {0xff, 0xd8, 0xff, 0x01, 0x02};
    snprintf(p, sizeof p, "%s/c/5_junk.jpg", root);
    write_file(p, junk, sizeof junk);
    /* A valid 1x1 JPEG whose frame header claims 65000 x 65000. */
    uint8_t *huge = malloc(len);
    memcpy(huge, good, len);
    for (size_t i = 0; i + 8 < len; i++) {
        if (huge[i] == 0xff && (huge[i + 1] == 0xc0 || huge[i + 1] == 0xc2)) {
            huge[i + 5] = huge[i + 7] = 0xfd;
            huge[i + 6] = huge[i + 8] = 0xe8;
            break;
        }
    }
    snprintf(p, sizeof p, "%s/c/6_huge.jpg", root);
    write_file(p, huge, len);
    free(huge);
    free(good);
    const char *why[] = {NULL, "the file is empty", "Premature end of JPEG file",
                         "not a JPEG or PNG file (it starts with 3c 21 44 4f",
                         "not a JPEG or PNG file (it starts with 42 4d", "5_junk.jpg",
                         "65000 x 65000 pixels is more than"};

    ferry__dataset ds;
    /* A centre crop of the whole square image reads every row. */
    open_ok(&ds, "imagefolder:root=%s,size=32,crop=center,resize=32", root);
    assert_int_equal(ds.length, 7);
    for (uint64_t i = 1; i < 7; i++) {
        uint64_t idx[2] = {0, i};
        batch b = {0};
        ferry_dataset_error err = {0};
        int rc = get(&ds, 0, 0, idx, 2, &b, &err);
        batch_free(&b);
        if (rc != FERRY_EBATCH)
            fail_msg("item %d: %s", (int)i, ferry_err_name(rc));
        assert_int_equal(err.index, i);
        if (!strstr(err.message, root) || !strstr(err.message, why[i]))
            fail_msg("item %d: message '%s' lacks the path or '%s'", (int)i, err.message,
                     why[i]);
    }
    uint64_t one = 0;
    batch b = {0};
    ferry_dataset_error err;
    assert_int_equal(get(&ds, 0, 0, &one, 1, &b, &err), FERRY_OK);
    batch_free(&b);
    ferry__dataset_close(&ds);

    /* on_error=skip: the batch is whole, the same bytes each time it is
     * made, and the bad items carry good items' labels and pixels. */
    open_ok(&ds, "imagefolder:root=%s,size=32,on_error=skip", root);
    uint64_t all[7] = {0, 1, 2, 3, 4, 5, 6};
    batch b1 = {0}, b2 = {0};
    assert_int_equal(get(&ds, 5, 2, all, 7, &b1, &err), FERRY_OK);
    assert_int_equal(get(&ds, 5, 2, all, 7, &b2, &err), FERRY_OK);
    assert_memory_equal(b1.dst[0], b2.dst[0], b1.bytes[0]);
    assert_memory_equal(b1.dst[1], b2.dst[1], b1.bytes[1]);
    batch_free(&b1);
    batch_free(&b2);
    ferry__dataset_close(&ds);
}

/* Item bytes depend on (seed, epoch, index) only: not on the batch they
 * are in, their place in it, or the handle (worker) that makes them; and
 * the crop changes between epochs. */
static void test_items_depend_on_seed_epoch_index_only(void **state)
{
    (void)state;
    char root[600], p[1024];
    snprintf(root, sizeof root, "%s/det", tmp);
    make_dir("%s", root);
    make_dir("%s/c", root);
    for (int k = 0; k < 6; k++) {
        snprintf(p, sizeof p, "%s/c/%d.jpg", root, k);
        write_jpeg(p, 300 - 20 * k, 200 + 10 * k, 3, pattern, NULL, 0);
    }
    ferry__dataset a, b;
    open_ok(&a, "imagefolder:root=%s,size=24", root);
    open_ok(&b, "imagefolder:root=%s,size=24", root);
    uint64_t fwd[6] = {0, 1, 2, 3, 4, 5}, rev[6] = {5, 4, 3, 2, 1, 0};
    batch x = {0}, y = {0}, z = {0};
    ferry_dataset_error err;
    size_t item = 3 * 24 * 24;
    assert_int_equal(get(&a, 9, 1, fwd, 6, &x, &err), FERRY_OK);
    assert_int_equal(get(&b, 9, 1, rev, 6, &y, &err), FERRY_OK);
    for (int k = 0; k < 6; k++)
        assert_memory_equal((uint8_t *)x.dst[0] + k * item, (uint8_t *)y.dst[0] + (5 - k) * item,
                            item);
    assert_int_equal(get(&a, 9, 2, fwd, 6, &z, &err), FERRY_OK);
    assert_memory_not_equal(x.dst[0], z.dst[0], x.bytes[0]);
    batch_free(&x);
    batch_free(&y);
    batch_free(&z);
    ferry__dataset_close(&a);
    ferry__dataset_close(&b);
}

/* The same item in HWC is CHW transposed; flip=1's flipped items are the
 * mirror of flip=0's (the box is drawn first, from the same stream); box=1
 * reports crops inside the image; float32 is exactly (v / 255 - mean) /
 * std of the uint8 item. */
static void test_layout_flip_box_and_float32_agree(void **state)
{
    (void)state;
    char root[600], p[1024];
    snprintf(root, sizeof root, "%s/agree", tmp);
    make_dir("%s", root);
    make_dir("%s/c", root);
    for (int k = 0; k < 8; k++) {
        snprintf(p, sizeof p, "%s/c/%d.jpg", root, k);
        write_jpeg(p, 300, 200, 3, pattern, NULL, 0);
    }
    enum { S = 20, N = 8 };
    uint64_t idx[N] = {0, 1, 2, 3, 4, 5, 6, 7};
    ferry__dataset chw, hwc, noflip, f32;
    open_ok(&chw, "imagefolder:root=%s,size=%d,box=1", root, S);
    open_ok(&hwc, "imagefolder:root=%s,size=%d,layout=hwc", root, S);
    open_ok(&noflip, "imagefolder:root=%s,size=%d,flip=0", root, S);
    open_ok(&f32, "imagefolder:root=%s,size=%d,dtype=float32,mean=0.5:0.25:0.125,std=0.5:2:4",
            root, S);
    assert_int_equal(chw.schema.nfields, 3);
    assert_int_equal(f32.schema.fields[0].dtype, FERRY_DTYPE_F32);
    batch a = {0}, b = {0}, c = {0}, d = {0};
    ferry_dataset_error err;
    assert_int_equal(get(&chw, 4, 0, idx, N, &a, &err), FERRY_OK);
    assert_int_equal(get(&hwc, 4, 0, idx, N, &b, &err), FERRY_OK);
    assert_int_equal(get(&noflip, 4, 0, idx, N, &c, &err), FERRY_OK);
    assert_int_equal(get(&f32, 4, 0, idx, N, &d, &err), FERRY_OK);
    const float mean[3] = {0.5f, 0.25f, 0.125f}, stdv[3] = {0.5f, 2, 4};
    int flipped = 0;
    for (int k = 0; k < N; k++) {
        const uint8_t *A = (uint8_t *)a.dst[0] + k * 3 * S * S;
        const uint8_t *B = (uint8_t *)b.dst[0] + k * 3 * S * S;
        const uint8_t *C = (uint8_t *)c.dst[0] + k * 3 * S * S;
        const float *D = (float *)d.dst[0] + k * 3 * S * S;
        const int64_t *box = (int64_t *)a.dst[2] + 5 * k;
        assert_true(box[0] >= 0 && box[1] >= 0 && box[2] >= 1 && box[3] >= 1);
        assert_true(box[0] + box[2] <= 200 && box[1] + box[3] <= 300);
        flipped += (int)box[4];
        for (int ch = 0; ch < 3; ch++) {
            for (int y = 0; y < S; y++) {
                for (int x = 0; x < S; x++) {
                    uint8_t v = A[(ch * S + y) * S + x];
                    assert_int_equal(v, B[(y * S + x) * 3 + ch]);
                    assert_int_equal(v, C[(ch * S + y) * S + (box[4] ? S - 1 - x : x)]);
                    float want = ((float)v / 255.0f - mean[ch]) / stdv[ch];
                    assert_true(D[(ch * S + y) * S + x] == want);
                }
            }
        }
    }
    assert_true(flipped > 0 && flipped < N); /* both happen in 8 draws at this seed */
    batch_free(&a);
    batch_free(&b);
    batch_free(&c);
    batch_free(&d);
    ferry__dataset_close(&chw);
    ferry__dataset_close(&hwc);
    ferry__dataset_close(&noflip);
    ferry__dataset_close(&f32);
}

/* RandomResizedCrop's draws: inside the image, areas within scale, ratios
 * within bounds (up to rounding), and torchvision's fallback for a shape
 * no try can fit. */
static void test_random_box_draws_and_fallback(void **state)
{
    (void)state;
    ferry__image_opts o = {.size = 224, .random_crop = 1, .scale_lo = 0.08, .scale_hi = 1,
                           .ratio_lo = 0.75, .ratio_hi = 4.0 / 3};
    double area = 0;
    int n = 20000;
    for (int t = 0; t < n; t++) {
        ferry__rng r = {ferry_sample_seed(1, 0, (uint64_t)t)};
        ferry__image_box b;
        ferry__image_random_box(400, 300, &o, &r, &b);
        assert_true(b.top >= 0 && b.left >= 0 && b.top + b.height <= 300 &&
                    b.left + b.width <= 400);
        double share = (double)b.width * b.height / (400.0 * 300.0);
        assert_true(share > 0.07 && share <= 1.0);
        area += share;
    }
    /* The mean of U(0.08, 1) is 0.54; the draws that do not fit (tall or
     * wide boxes near the whole area) are retried, pulling it down:
     * torchvision's get_params gives 0.435 on a 400 x 300 image (20,000
     * draws). python/tests/test_image.py compares the histograms. */
    area /= n;
    if (area < 0.42 || area > 0.45)
        fail_msg("mean area share %.3f", area);

    ferry__rng r = {7};
    ferry__image_box b;
    ferry__image_random_box(1000, 10, &o, &r, &b); /* too wide for any try */
    assert_int_equal(b.height, 10);
    assert_int_equal(b.width, 13); /* round(10 * 4/3) */
    assert_int_equal(b.top, 0);
    assert_int_equal(b.left, (1000 - 13) / 2);
}

/* Bad specs and folders are refused at open with a message naming the
 * problem. */
static void test_bad_options_and_folders_are_refused(void **state)
{
    (void)state;
    char spec[1024], root[600];
    expect_open_fails("imagefolder:size=32", "root=DIR is required");
    expect_open_fails("imagefolder:root=/nonexistent/ferry", "No such file");
    snprintf(root, sizeof root, "%s/opts", tmp);
    make_dir("%s", root);
    snprintf(spec, sizeof spec, "imagefolder:root=%s", root);
    expect_open_fails(spec, "has no class folders");
    make_dir("%s/empty_class", root);
    expect_open_fails(spec, "empty_class has no image files");
    const char *bad[][2] = {
        {"size=0", "size=0: expected an integer in 1..4096"},
        {"crop=middle", "crop=middle: expected random or center"},
        {"scale=0.9:0.1", "scale=0.9:0.1: expected LO:HI"},
        {"scale=0.5:2", "expected LO:HI with 0 < LO <= HI <= 1"},
        {"ratio=x", "ratio=x: expected LO:HI"},
        {"mean=0.5:0.5:0.5", "mean and std go with dtype=float32"},
        {"dtype=float32,std=1:0:1", "expected three non-zero numbers"},
        {"layout=nchw", "expected chw or hwc"},
        {"on_error=ignore", "expected fail or skip"},
        {"size=224,resize=100,crop=center", "resize=100 is smaller than size=224"},
        {"colour=1", "unknown key 'colour'"},
        {"flip", "is not KEY=VALUE"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(spec, sizeof spec, "imagefolder:root=%s,%s", root, bad[i][0]);
        expect_open_fails(spec, bad[i][1]);
    }
}

/* The decoder on every prefix of a valid JPEG and PNG, and on the files
 * with bytes flipped: an error or an image, never a crash (ASan checks
 * the reads). */
static void test_decoder_survives_prefixes_and_flipped_bytes(void **state)
{
    (void)state;
    char p[1024];
    snprintf(p, sizeof p, "%s/prefix.jpg", tmp);
    write_jpeg(p, 48, 40, 3, pattern, NULL, 1);
    size_t jlen, plen;
    uint8_t *jpg = read_whole(p, &jlen);
    snprintf(p, sizeof p, "%s/prefix.png", tmp);
    write_png(p, 30, 20, PNG_FORMAT_RGB, pattern, NULL);
    uint8_t *png = read_whole(p, &plen);
    ferry__image_opts o = {.size = 16, .random_crop = 1, .scale_lo = 0.08, .scale_hi = 1,
                           .ratio_lo = 0.75, .ratio_hi = 4.0 / 3, .flip = 1, .dct_scale = 1,
                           .max_pixels = FERRY__IMAGE_MAX_PIXELS};
    ferry__image_dec *d = ferry__image_dec_new();
    uint8_t out[16 * 16 * 3];
    char err[256];
    uint8_t *files[2] = {jpg, png};
    size_t lens[2] = {jlen, plen};
    for (int f = 0; f < 2; f++) {
        assert_int_equal(ferry__image_decode(d, files[f], lens[f], &o, 1, out, NULL, err,
                                             sizeof err),
                         0);
        for (size_t n = 0; n < lens[f]; n += 1 + n / 16) {
            uint8_t *copy = malloc(n ? n : 1); /* exactly n bytes: ASan sees overreads */
            memcpy(copy, files[f], n);
            (void)ferry__image_decode(d, copy, n, &o, n, out, NULL, err, sizeof err);
            free(copy);
        }
        for (size_t at = 0; at < lens[f]; at += 7) {
            uint8_t *copy = malloc(lens[f]);
            memcpy(copy, files[f], lens[f]);
            copy[at] ^= 0x5a;
            (void)ferry__image_decode(d, copy, lens[f], &o, at, out, NULL, err, sizeof err);
            free(copy);
        }
    }
    ferry__image_dec_free(d);
    free(jpg);
    free(png);
}


/* wds over a shard written here: the samples and labels; then the shard
 * cut at every 512-byte boundary and inside headers, and with bytes
 * flipped: each open fails with a message or gives samples that decode or
 * fail their batch, never a crash (ASan checks the reads). */
static void test_wds_shard_and_its_damaged_copies(void **state)
{
    (void)state;
    char p[1024], spec[1200];
    snprintf(p, sizeof p, "%s/one.jpg", tmp);
    write_jpeg(p, 40, 30, 3, pattern, NULL, 0);
    size_t jlen;
    uint8_t *jpg = read_whole(p, &jlen);
    const tar_member m[] = {
        {"a/000.jpg", jpg, jlen}, {"a/000.cls", "7\n", 2},
        {"a/001.jpg", jpg, jlen}, {"a/001.cls", "12", 2}, {"a/001.json", "{}", 2},
        {"b/002.jpg", jpg, jlen},
    };
    size_t cap = 16 * 512 + 6 * (jlen + 512), len = 0;
    uint8_t *tar = calloc(1, cap);
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        tar_add(tar, &len, &m[i]);
    len += 1024; /* the end-of-archive blocks */
    snprintf(p, sizeof p, "%s/shard.tar", tmp);
    write_file(p, tar, len);
    snprintf(spec, sizeof spec, "wds:shards=%s,size=8", p);

    ferry__dataset ds;
    open_ok(&ds, "%s", spec);
    assert_int_equal(ds.length, 3);
    uint64_t idx[3] = {0, 1, 2};
    batch b = {0};
    ferry_dataset_error err;
    assert_int_equal(get(&ds, 1, 0, idx, 3, &b, &err), FERRY_OK);
    const int64_t *label = b.dst[1];
    assert_int_equal(label[0], 7);
    assert_int_equal(label[1], 12);
    assert_int_equal(label[2], -1);
    batch_free(&b);
    ferry__dataset_close(&ds);

    for (size_t cut = 0; cut < len; cut += cut < 2048 ? 37 : 512) {
        write_file(p, tar, cut);
        char msg[1024];
        if (ferry__dataset_open(&ds, spec, NULL, msg, sizeof msg) == FERRY_OK) {
            uint64_t one = 0;
            (void)get(&ds, 1, 0, &one, 1, &b, &err);
            batch_free(&b);
            ferry__dataset_close(&ds);
        } else if (!strstr(msg, "shard.tar") && !strstr(msg, "no samples")) {
            fail_msg("cut at %zu: message '%s' does not name the shard", cut, msg);
        }
    }
    for (size_t at = 0; at < len; at += 61) {
        uint8_t *copy = malloc(len);
        memcpy(copy, tar, len);
        copy[at] ^= 0xa5;
        write_file(p, copy, len);
        free(copy);
        char msg[1024];
        if (ferry__dataset_open(&ds, spec, NULL, msg, sizeof msg) == FERRY_OK) {
            uint64_t all[3] = {0, 1, 2};
            size_t n = ds.length < 3 ? ds.length : 3;
            (void)get(&ds, 1, 0, all, n, &b, &err);
            batch_free(&b);
            ferry__dataset_close(&ds);
        }
    }
    free(tar);
    free(jpg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listing_follows_torchvision_order),
        cmocka_unit_test(test_grey_cmyk_and_png_kinds_become_rgb),
        cmocka_unit_test(test_bad_files_fail_their_batch_naming_the_file),
        cmocka_unit_test(test_items_depend_on_seed_epoch_index_only),
        cmocka_unit_test(test_layout_flip_box_and_float32_agree),
        cmocka_unit_test(test_random_box_draws_and_fallback),
        cmocka_unit_test(test_bad_options_and_folders_are_refused),
        cmocka_unit_test(test_decoder_survives_prefixes_and_flipped_bytes),
        cmocka_unit_test(test_wds_shard_and_its_damaged_copies),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
