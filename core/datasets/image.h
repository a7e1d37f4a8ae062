/*
 * image.h - one encoded image (JPEG, PNG) in, one fixed-size RGB item out:
 * the crop and resize that torchvision's training and evaluation transforms
 * do, run in C for the image kinds (imagefolder.c, and the fuzz target).
 *
 * Position in the data flow: inside a worker's get_batch, once per item.
 * The crop is drawn from a stream seeded by ferry_sample_seed(seed, epoch,
 * index) only, so an item's pixels never depend on which worker makes it.
 *
 * What it does, in order:
 *   1. reads the header (size, colour space) and refuses what it cannot
 *      decode, with the decoder's own words;
 *   2. picks the crop box in the image's pixels: RandomResizedCrop's
 *      get_params (ten tries, then the centre fallback) or Resize(R) +
 *      CenterCrop(S) expressed as a box;
 *   3. for a JPEG, decodes at the smallest DCT scale (1/4, 1/2 or 1) at which the box
 *      still covers S x S pixels, and only the rows and the iMCU columns the
 *      resampling filter touches (libjpeg-turbo's jpeg_skip_scanlines and
 *      jpeg_crop_scanline);
 *   4. resamples the box to S x S with an antialiased triangle filter
 *      (support scaled by the reduction, as PIL's BILINEAR resize, which
 *      torchvision's transforms use), with 8-bit rounding between the two
 *      passes as PIL does (PIL runs them in the other order), flipping if
 *      drawn;
 *   5. writes uint8 RGB, CHW or HWC.
 * Grayscale becomes RGB by copying the channel, CMYK (Adobe-inverted or
 * not) by PIL's formula, palette PNGs as PIL reads them; 16-bit PNGs keep
 * their samples' high byte.
 *
 * Threads: a ferry__image_dec is one worker's scratch (decoder state and
 * buffers, reused between images); nothing here is global.
 */
#ifndef FERRY_CORE_DATASETS_IMAGE_H
#define FERRY_CORE_DATASETS_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* PIL's limit (twice its MAX_IMAGE_PIXELS warning threshold): an image with
 * more pixels is refused before anything is decoded. */
#define FERRY__IMAGE_MAX_PIXELS 178956970ull
#define FERRY__IMAGE_MAX_SIZE 4096

typedef struct ferry__image_opts {
    int size;        /* S: the output is S x S, 1..FERRY__IMAGE_MAX_SIZE */
    int random_crop; /* 1: RandomResizedCrop; 0: Resize(resize) + CenterCrop(size) */
    double scale_lo, scale_hi; /* RandomResizedCrop's scale (area share) */
    double ratio_lo, ratio_hi; /* and aspect ratio bounds (w / h) */
    int resize;      /* centre crop: the shorter side before the crop (>= size) */
    int flip;        /* a horizontal flip with p = 0.5 */
    int hwc;         /* layout: 1 HWC, 0 CHW */
    int dct_scale;   /* 1: decode JPEGs at a reduced DCT scale where it covers S */
    uint64_t max_pixels;
} ferry__image_opts;

/* The crop an item got, in the source image's pixels (for the `box` field). */
typedef struct ferry__image_box {
    int64_t top, left, height, width, flipped;
} ferry__image_box;

typedef struct ferry__image_dec ferry__image_dec;

/* A decoder's scratch, or NULL when out of memory. */
ferry__image_dec *ferry__image_dec_new(void);
void ferry__image_dec_free(ferry__image_dec *d);

/* Decodes `len` bytes of `data` into out (S * S * 3 bytes, the layout of
 * o->hwc), with the crop drawn from `sample_seed`. Fills *box when not NULL.
 * Returns 0, or -1 with the reason in err (e.g. "not a JPEG or PNG file (it
 * starts with 3c 21 44 4f)", "Premature end of JPEG file"); out is then
 * undefined. Never reads outside data[0..len). */
int ferry__image_decode(ferry__image_dec *d, const uint8_t *data, size_t len,
                        const ferry__image_opts *o, uint64_t sample_seed, uint8_t *out,
                        ferry__image_box *box, char *err, size_t errlen);

/* table[v] = (v / 255 - mean) / std in float32: the operations of
 * torchvision's ToTensor then Normalize, so the same floats. */
void ferry__image_norm_table(float mean, float std, float table[256]);

/* out[i] = table[in[i]] for n values. */
void ferry__image_normalize(const uint8_t *in, size_t n, const float table[256], float *out);

/* --- The pieces, exposed for tests --- */

/* A splitmix64 stream. */
typedef struct ferry__rng {
    uint64_t state;
} ferry__rng;

uint64_t ferry__rng_next(ferry__rng *r);
double ferry__rng_uniform(ferry__rng *r, double lo, double hi); /* [lo, hi) */
uint64_t ferry__rng_below(ferry__rng *r, uint64_t n);           /* [0, n), n >= 1 */

/* RandomResizedCrop.get_params for a width x height image: *box's top,
 * left, height, width (flipped untouched). */
void ferry__image_random_box(int width, int height, const ferry__image_opts *o, ferry__rng *r,
                             ferry__image_box *box);

#endif
