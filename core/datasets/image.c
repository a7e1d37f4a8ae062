/*
 * image.c - decode, crop and resize one image into a fixed-size RGB item
 * (see image.h for the steps and what they match in torchvision).
 *
 * JPEG goes through libjpeg-turbo's libjpeg API rather than its TurboJPEG
 * wrapper: only the former (in the version Debian ships) can skip the rows
 * above a crop and leave out the iMCU columns beside it, which is most of
 * the saving on a RandomResizedCrop. PNG goes through libpng.
 *
 * Errors: both libraries report a fatal error through a callback that must
 * not return; ours longjmps back to the decode call with the library's
 * message. Everything that outlives the jump lives in the ferry__image_dec
 * (heap), never in locals changed after setjmp. A JPEG that ends early
 * (libjpeg's "Premature end of JPEG file" warning, which libjpeg would
 * otherwise paper over with grey) is an error, as it is in PIL; libjpeg's
 * other warnings (a few bytes of junk before a marker) are not, as in PIL.
 * Only the rows a crop needs are decoded, so a file truncated below the
 * crop can still give that crop: what is delivered is always real pixels.
 *
 * Resampling follows the antialiased triangle filter PIL uses for BILINEAR
 * (the filter's support grows with the reduction), in fixed point with 14
 * fractional bits and 8-bit rounding between the passes; unlike PIL, the
 * vertical pass runs first (see resample). RandomResizedCrop crops before
 * it resizes, so its filter stops at the crop's edges; Resize + CenterCrop
 * resizes the whole image first, so its filter reaches past the crop. Both
 * are kept.
 *
 * This file needs nothing of ferry's but ferry_dataset.h, so the fuzz
 * target (tests/fuzz/fuzz_image.c) builds it alone.
 */
#include "image.h"

#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

#include "ferry_dataset.h"

/* Fixed-point bits of the filter weights: a weight (at most 1) fits an
 * int16, which the SIMD passes need (SSE2's pmaddwd multiplies int16 pairs
 * into int32 sums), and 255 * 2^14 * (sum of weights, ~1) fits an int32. */
#define PREC_BITS 14

/* Columns decoded beyond a crop on each side (see decode_jpeg). */
#define CROP_MARGIN 8

struct jpeg_failure {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

/* One pass's filter: out[i] = sum over t < n[i] of k[i*ks + t] * in[lo[i] + t]. */
typedef struct filter {
    int *lo, *n;
    int16_t *k;
    int ks, cap; /* taps per output, outputs allocated */
    int first, last; /* the input range [first, last) any output reads */
} filter;

/* The row kernel: rows[t] (t < n, `len` bytes each) weighted by k -> dst. */
typedef void weigh_fn(const uint8_t *const *rows, const int16_t *k, int n, size_t len,
                      uint8_t *dst);

struct ferry__image_dec {
    struct jpeg_decompress_struct jpeg; /* created with the decoder */
    struct jpeg_failure jerr;
    /* PNG: the failure's message (libpng keeps its own jump buffer). */
    char png_message[256];
    const uint8_t *png_data;
    size_t png_len, png_at;
    uint8_t *region; /* the decoded rows, 4 bytes a pixel */
    size_t region_cap;
    uint8_t *row; /* one CMYK row, or a PNG's row pointers */
    size_t row_cap;
    uint8_t *tmp; /* the passes' two planes (see resample) */
    size_t tmp_cap;
    const uint8_t **taps; /* the rows a pass weighs for one output */
    size_t taps_cap;
    weigh_fn *weigh; /* the kernel this CPU runs best */
    filter fx, fy;
};

/* --- Random draws --- */

uint64_t ferry__rng_next(ferry__rng *r)
{
    uint64_t v = ferry_mix64(r->state);
    r->state += 0x9e3779b97f4a7c15ULL;
    return v;
}

double ferry__rng_uniform(ferry__rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(ferry__rng_next(r) >> 11) * 0x1p-53);
}

uint64_t ferry__rng_below(ferry__rng *r, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)ferry__rng_next(r) * n) >> 64);
}

/* --- Crop boxes --- */

void ferry__image_random_box(int width, int height, const ferry__image_opts *o, ferry__rng *r,
                             ferry__image_box *box)
{
    double area = (double)width * height;
    double lr0 = log(o->ratio_lo), lr1 = log(o->ratio_hi);
    long w, h;

    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * ferry__rng_uniform(r, o->scale_lo, o->scale_hi);
        double aspect = exp(ferry__rng_uniform(r, lr0, lr1));
        /* Python's round(): halves to even, which lrint does by default. */
        w = lrint(sqrt(target * aspect));
        h = lrint(sqrt(target / aspect));
        if (w > 0 && w <= width && h > 0 && h <= height) {
            box->top = (int64_t)ferry__rng_below(r, (uint64_t)(height - h + 1));
            box->left = (int64_t)ferry__rng_below(r, (uint64_t)(width - w + 1));
            box->height = h;
            box->width = w;
            return;
        }
    }
    /* torchvision's fallback: the largest centred box of a ratio in range. */
    double in_ratio = (double)width / height;
    w = width;
    h = height;
    if (in_ratio < o->ratio_lo)
        h = lrint(w / o->ratio_lo);
    else if (in_ratio > o->ratio_hi)
        w = lrint(h * o->ratio_hi);
    h = h < 1 ? 1 : h > height ? height : h;
    w = w < 1 ? 1 : w > width ? width : w;
    box->top = (height - h) / 2;
    box->left = (width - w) / 2;
    box->height = h;
    box->width = w;
}

/* The source rectangle [x0, x1) x [y0, y1) (fractional) that becomes the
 * S x S output, and how far the filter may reach: [cx0, cx1) x [cy0, cy1). */
typedef struct source_box {
    double x0, y0, x1, y1;
    double cx0, cy0, cx1, cy1;
} source_box;

/* Draws the crop for a width x height image: RandomResizedCrop (the filter
 * stops at the crop) or Resize(resize) + CenterCrop(size) (the resize saw
 * the whole image, so the filter reaches past the crop). */
static void pick_box(int width, int height, const ferry__image_opts *o, ferry__rng *r,
                     source_box *sb, ferry__image_box *box)
{
    if (o->random_crop) {
        ferry__image_random_box(width, height, o, r, box);
        sb->x0 = sb->cx0 = (double)box->left;
        sb->y0 = sb->cy0 = (double)box->top;
        sb->x1 = sb->cx1 = (double)(box->left + box->width);
        sb->y1 = sb->cy1 = (double)(box->top + box->height);
    } else {
        /* torchvision's Resize(int): the shorter side becomes `resize`, the
         * longer int(resize * long / short); CenterCrop rounds its offsets. */
        long nw, nh;
        if (width <= height) {
            nw = o->resize;
            nh = (long)((double)o->resize * height / width);
        } else {
            nh = o->resize;
            nw = (long)((double)o->resize * width / height);
        }
        long top = lrint((nh - o->size) / 2.0), left = lrint((nw - o->size) / 2.0);
        double sx = (double)width / nw, sy = (double)height / nh;
        sb->x0 = left * sx;
        sb->x1 = (left + o->size) * sx;
        sb->y0 = top * sy;
        sb->y1 = (top + o->size) * sy;
        sb->cx0 = sb->cy0 = 0;
        sb->cx1 = width;
        sb->cy1 = height;
        box->top = (int64_t)floor(sb->y0);
        box->left = (int64_t)floor(sb->x0);
        box->height = (int64_t)ceil(sb->y1) - box->top;
        box->width = (int64_t)ceil(sb->x1) - box->left;
    }
    box->flipped = o->flip && ferry__rng_uniform(r, 0, 1) < 0.5;
}

/* --- Resampling --- */

static int grow(void *pp, size_t *cap, size_t want)
{
    void **p = pp;
    if (want <= *cap)
        return 0;
    void *q = realloc(*p, want);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = want;
    return 0;
}

static inline double tri(double x)
{
    x = fabs(x);
    return x < 1 ? 1 - x : 0;
}

/* Builds the filter that takes input samples [in0, in1) (of an axis of
 * `size` samples, reaching no further than [c0, c1)) to `out` samples: the
 * triangle filter of PIL's BILINEAR, widened by the reduction. */
static int filter_make(filter *f, int out, double in0, double in1, double c0, double c1,
                       int size)
{
    double scale = (in1 - in0) / out, fscale = scale < 1 ? 1 : scale, inv = 1 / fscale;
    double support = fscale;
    int ks = (int)ceil(support) * 2 + 1;
    int lo_limit = (int)floor(c0), hi_limit = (int)ceil(c1);
    if (lo_limit < 0)
        lo_limit = 0;
    if (lo_limit > size - 1)
        lo_limit = size - 1;
    if (hi_limit > size)
        hi_limit = size;
    if (hi_limit <= lo_limit)
        hi_limit = lo_limit + 1;
    if (out > f->cap) {
        int *lo = realloc(f->lo, (size_t)out * sizeof *lo);
        if (lo)
            f->lo = lo;
        int *n = realloc(f->n, (size_t)out * sizeof *n);
        if (n)
            f->n = n;
        if (!lo || !n)
            return -1;
        f->cap = out;
    }
    int16_t *k = realloc(f->k, (size_t)out * (size_t)ks * sizeof *k);
    if (k == NULL)
        return -1;
    f->k = k;
    f->ks = ks;
    f->first = hi_limit;
    f->last = lo_limit;
    for (int i = 0; i < out; i++) {
        double center = in0 + (i + 0.5) * scale, sum = 0;
        int lo = (int)floor(center - support + 0.5), hi = (int)floor(center + support + 0.5);
        if (lo < lo_limit)
            lo = lo_limit;
        if (hi > hi_limit)
            hi = hi_limit;
        if (hi - lo > ks)
            hi = lo + ks;
        for (int t = 0; t < hi - lo; t++)
            sum += tri((lo + t - center + 0.5) * inv);
        if (hi <= lo || sum <= 0) { /* nothing in reach: the nearest sample */
            lo = (int)floor(center);
            lo = lo < lo_limit ? lo_limit : lo >= hi_limit ? hi_limit - 1 : lo;
            hi = lo + 1;
            k[(size_t)i * ks] = 1 << PREC_BITS;
        } else {
            double norm = (1 << PREC_BITS) / sum;
            for (int t = 0; t < hi - lo; t++)
                k[(size_t)i * ks + t] = (int16_t)lrint(tri((lo + t - center + 0.5) * inv) * norm);
        }
        f->lo[i] = lo;
        f->n[i] = hi - lo;
        if (lo < f->first)
            f->first = lo;
        if (hi > f->last)
            f->last = hi;
    }
    return 0;
}

/* Both axes' filters for box sb of a w x h image (decoded at that size). */
static int make_filters(ferry__image_dec *d, const source_box *sb, int size, int w, int h)
{
    return filter_make(&d->fx, size, sb->x0, sb->x1, sb->cx0, sb->cx1, w) ||
           filter_make(&d->fy, size, sb->y0, sb->y1, sb->cy0, sb->cy1, h);
}

static inline uint8_t clip8(int32_t v)
{
    v >>= PREC_BITS;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* Resampling works on 4-byte pixels (RGB + a padding byte the decoders
 * fill), and every pass is the same kernel: a weighted sum of whole rows,
 * which SIMD does 16 bytes at a time. The vertical pass runs first and
 * writes its result transposed, so that the horizontal pass is that same
 * row kernel again (a per-pixel horizontal kernel cost 2-3x more per tap).
 * The kernel has a scalar form, an SSE2 form (x86-64's baseline) and an
 * AVX2 form, which compute the same integers: the output is the same bytes
 * on every machine. */

/* Bytes e.. of rows[t] (t < n, `len` bytes each) weighted by k -> dst. */
static void weigh_rows_from(size_t e, const uint8_t *const *rows, const int16_t *k, int n,
                            size_t len, uint8_t *dst)
{
#ifdef __SSE2__
    const __m128i zero = _mm_setzero_si128(), half = _mm_set1_epi32(1 << (PREC_BITS - 1));
    for (; e + 16 <= len; e += 16) {
        __m128i a0 = half, a1 = half, a2 = half, a3 = half;
        for (int t = 0; t < n; t += 2) { /* rows t and t+1 interleaved: (s0 s1) x (w0 w1) */
            __m128i r0 = _mm_loadu_si128((const __m128i *)(rows[t] + e));
            __m128i r1 = t + 1 < n ? _mm_loadu_si128((const __m128i *)(rows[t + 1] + e)) : zero;
            int16_t w1 = t + 1 < n ? k[t + 1] : 0;
            __m128i w = _mm_set1_epi32((int32_t)(((uint32_t)(uint16_t)w1 << 16) | (uint16_t)k[t]));
            __m128i lo = _mm_unpacklo_epi8(r0, r1), hi = _mm_unpackhi_epi8(r0, r1);
            a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), w));
            a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), w));
            a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), w));
            a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), w));
        }
        a0 = _mm_srai_epi32(a0, PREC_BITS), a1 = _mm_srai_epi32(a1, PREC_BITS);
        a2 = _mm_srai_epi32(a2, PREC_BITS), a3 = _mm_srai_epi32(a3, PREC_BITS);
        _mm_storeu_si128((__m128i *)(dst + e),
                         _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3)));
    }
#endif
    for (; e < len; e++) {
        int32_t a = 1 << (PREC_BITS - 1);
        for (int t = 0; t < n; t++)
            a += k[t] * rows[t][e];
        dst[e] = clip8(a);
    }
}

static void weigh_rows(const uint8_t *const *rows, const int16_t *k, int n, size_t len,
                       uint8_t *dst)
{
    weigh_rows_from(0, rows, k, n, len, dst);
}

/* dst (cols x rows) = src (rows x cols) transposed: 4 x 4 blocks in SSE2
 * registers, 32 x 32 tiles so that both sides stay in cache. */
static void transpose32(const uint32_t *src, size_t rows, size_t cols, uint32_t *dst)
{
    for (size_t r0 = 0; r0 < rows; r0 += 32) {
        size_t r1 = r0 + 32 < rows ? r0 + 32 : rows;
        for (size_t c0 = 0; c0 < cols; c0 += 32) {
            size_t c1 = c0 + 32 < cols ? c0 + 32 : cols, r = r0;
#ifdef __SSE2__
            for (; r + 4 <= r1; r += 4) {
                size_t c = c0;
                for (; c + 4 <= c1; c += 4) {
                    const uint32_t *p = src + r * cols + c;
                    __m128i x0 = _mm_loadu_si128((const __m128i *)p);
                    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + cols));
                    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 2 * cols));
                    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 3 * cols));
                    __m128i t0 = _mm_unpacklo_epi32(x0, x1), t1 = _mm_unpackhi_epi32(x0, x1);
                    __m128i t2 = _mm_unpacklo_epi32(x2, x3), t3 = _mm_unpackhi_epi32(x2, x3);
                    uint32_t *q = dst + c * rows + r;
                    _mm_storeu_si128((__m128i *)q, _mm_unpacklo_epi64(t0, t2));
                    _mm_storeu_si128((__m128i *)(q + rows), _mm_unpackhi_epi64(t0, t2));
                    _mm_storeu_si128((__m128i *)(q + 2 * rows), _mm_unpacklo_epi64(t1, t3));
                    _mm_storeu_si128((__m128i *)(q + 3 * rows), _mm_unpackhi_epi64(t1, t3));
                }
                for (; c < c1; c++) {
                    for (size_t k = r; k < r + 4; k++)
                        dst[c * rows + k] = src[k * cols + c];
                }
            }
#endif
            for (; r < r1; r++) {
                for (size_t c = c0; c < c1; c++)
                    dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
}

/* n RGBA pixels -> R, G and B planes (`plane` bytes apart) from dst. */
static void deinterleave(const uint8_t *px, size_t n, uint8_t *dst, size_t plane)
{
    size_t i = 0;
#ifdef __SSE2__
    const __m128i low = _mm_set1_epi32(0xff);
    /* The batch's memory is written once and read by another process:
     * aligned stores go around the cache. */
    int aligned = (((uintptr_t)dst | plane) & 15) == 0;
    for (; i + 16 <= n; i += 16) {
        const __m128i *p = (const __m128i *)(px + 4 * i);
        __m128i p0 = _mm_loadu_si128(p), p1 = _mm_loadu_si128(p + 1);
        __m128i p2 = _mm_loadu_si128(p + 2), p3 = _mm_loadu_si128(p + 3);
        /* channel c of 16 pixels: its byte of each 32-bit pixel, packed 32 -> 16 -> 8 */
        __m128i r = _mm_packus_epi16(
            _mm_packs_epi32(_mm_and_si128(p0, low), _mm_and_si128(p1, low)),
            _mm_packs_epi32(_mm_and_si128(p2, low), _mm_and_si128(p3, low)));
        __m128i g = _mm_packus_epi16(
            _mm_packs_epi32(_mm_and_si128(_mm_srli_epi32(p0, 8), low),
                            _mm_and_si128(_mm_srli_epi32(p1, 8), low)),
            _mm_packs_epi32(_mm_and_si128(_mm_srli_epi32(p2, 8), low),
                            _mm_and_si128(_mm_srli_epi32(p3, 8), low)));
        __m128i b = _mm_packus_epi16(
            _mm_packs_epi32(_mm_and_si128(_mm_srli_epi32(p0, 16), low),
                            _mm_and_si128(_mm_srli_epi32(p1, 16), low)),
            _mm_packs_epi32(_mm_and_si128(_mm_srli_epi32(p2, 16), low),
                            _mm_and_si128(_mm_srli_epi32(p3, 16), low)));
        if (aligned) {
            _mm_stream_si128((__m128i *)(dst + i), r);
            _mm_stream_si128((__m128i *)(dst + plane + i), g);
            _mm_stream_si128((__m128i *)(dst + 2 * plane + i), b);
        } else {
            _mm_storeu_si128((__m128i *)(dst + i), r);
            _mm_storeu_si128((__m128i *)(dst + plane + i), g);
            _mm_storeu_si128((__m128i *)(dst + 2 * plane + i), b);
        }
    }
    _mm_sfence();
#endif
    for (; i < n; i++) {
        dst[i] = px[4 * i];
        dst[plane + i] = px[4 * i + 1];
        dst[2 * plane + i] = px[4 * i + 2];
    }
}

#ifdef HAVE_AVX2_PATH
/* weigh_rows with 32 bytes a step where the CPU has AVX2: every AVX2
 * unpack and pack works within 128-bit halves, so each half computes
 * exactly what the SSE2 step computes for its 16 bytes. */
__attribute__((target("avx2"))) static void weigh_rows_avx2(const uint8_t *const *rows,
                                                            const int16_t *k, int n, size_t len,
                                                            uint8_t *dst)
{
    const __m256i zero = _mm256_setzero_si256(), half = _mm256_set1_epi32(1 << (PREC_BITS - 1));
    size_t e = 0;
    for (; e + 32 <= len; e += 32) {
        __m256i a0 = half, a1 = half, a2 = half, a3 = half;
        for (int t = 0; t < n; t += 2) {
            __m256i r0 = _mm256_loadu_si256((const __m256i *)(rows[t] + e));
            __m256i r1 =
                t + 1 < n ? _mm256_loadu_si256((const __m256i *)(rows[t + 1] + e)) : zero;
            int16_t w1 = t + 1 < n ? k[t + 1] : 0;
            __m256i w =
                _mm256_set1_epi32((int32_t)(((uint32_t)(uint16_t)w1 << 16) | (uint16_t)k[t]));
            __m256i lo = _mm256_unpacklo_epi8(r0, r1), hi = _mm256_unpackhi_epi8(r0, r1);
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), w));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), w));
            a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), w));
            a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), w));
        }
        a0 = _mm256_srai_epi32(a0, PREC_BITS), a1 = _mm256_srai_epi32(a1, PREC_BITS);
        a2 = _mm256_srai_epi32(a2, PREC_BITS), a3 = _mm256_srai_epi32(a3, PREC_BITS);
        _mm256_storeu_si256((__m256i *)(dst + e),
                            _mm256_packus_epi16(_mm256_packs_epi32(a0, a1),
                                                _mm256_packs_epi32(a2, a3)));
    }
    weigh_rows_from(e, rows, k, n, len, dst); /* the rest: 16 bytes a step, then 1 */
}
#endif

/* The row kernel this CPU runs best (the same bytes either way). */
static weigh_fn *pick_weigh(void)
{
#ifdef HAVE_AVX2_PATH
    if (__builtin_cpu_supports("avx2"))
        return weigh_rows_avx2;
#endif
    return weigh_rows;
}

/* Resamples the decoded region (rows fy->first.. of the axis, pixels from
 * x_at, `stride` bytes a row, 4 bytes a pixel) to S x S into out. */
static int resample(ferry__image_dec *d, const uint8_t *region, size_t stride, int x_at,
                    const ferry__image_opts *o, int flip, uint8_t *out)
{
    const filter *fx = &d->fx, *fy = &d->fy;
    size_t S = (size_t)o->size, cols = (size_t)(fx->last - fx->first);
    size_t ks = (size_t)(fx->ks > fy->ks ? fx->ks : fy->ks);

    /* tmp holds two planes of max(cols, S) x S pixels, a and b, used in turn. */
    size_t plane = (cols > S ? cols : S) * S;
    if (grow(&d->tmp, &d->tmp_cap, 2 * plane * 4) ||
        grow(&d->taps, &d->taps_cap, ks * sizeof *d->taps))
        return -1;
    uint32_t *a = (uint32_t *)(void *)d->tmp, *b = a + plane;
    const uint8_t **taps = d->taps;
    const uint8_t *left = region + (size_t)(fx->first - x_at) * 4;

    /* Vertical: region -> a (S rows x cols), transposed into b (cols x S). */
    for (size_t j = 0; j < S; j++) {
        for (int t = 0; t < fy->n[j]; t++)
            taps[t] = left + (size_t)(fy->lo[j] - fy->first + t) * stride;
        d->weigh(taps, fy->k + j * fy->ks, fy->n[j], cols * 4, (uint8_t *)(a + j * cols));
    }
    transpose32(a, S, cols, b);
    /* Horizontal, as rows of b: -> a (S x S, row x = output column x,
     * mirrored here when flipping), transposed into b (row j = output row
     * j). */
    for (size_t i = 0; i < S; i++) {
        size_t x = flip ? S - 1 - i : i;
        for (int t = 0; t < fx->n[i]; t++)
            taps[t] = (const uint8_t *)(b + (size_t)(fx->lo[i] - fx->first + t) * S);
        d->weigh(taps, fx->k + i * fx->ks, fx->n[i], S * 4, (uint8_t *)(a + x * S));
    }
    transpose32(a, S, S, b);
    for (size_t j = 0; j < S; j++) {
        const uint8_t *px = (const uint8_t *)(b + j * S);
        if (o->hwc) {
            uint8_t *dst = out + j * S * 3;
            for (size_t i = 0; i < S; i++)
                memcpy(dst + 3 * i, px + 4 * i, 3);
        } else {
            deinterleave(px, S, out + j * S, S * S);
        }
    }
    return 0;
}

/* --- JPEG --- */

static void jpeg_fail(j_common_ptr c)
{
    struct jpeg_failure *f = (struct jpeg_failure *)c->err;
    (*c->err->format_message)(c, f->message);
    longjmp(f->jump, 1);
}

/* Warnings are silent, except the end of the data before the end of the
 * image: that is a truncated file, an error as in PIL. */
static void jpeg_note(j_common_ptr c, int level)
{
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF)
        jpeg_fail(c);
}

/* PIL's CMYK -> RGB: each channel (255 - K) - (C * (255 - K) / 255 rounded).
 * An Adobe-marked file stores the inks inverted, as PIL reads it. */
static void cmyk_to_rgbx(const uint8_t *in, uint8_t *out, size_t n, int inverted)
{
    for (size_t i = 0; i < n; i++, in += 4, out += 4) {
        out[3] = 0;
        unsigned k = inverted ? in[3] : 255u - in[3];
        for (int c = 0; c < 3; c++) {
            unsigned ink = inverted ? 255u - in[c] : in[c], t = ink * k + 128;
            out[c] = (uint8_t)(k - (((t >> 8) + t) >> 8));
        }
    }
}

/* The smallest n of n/8 in {2, 4} at which the box still spans `size`
 * pixels both ways; 8 when none does. Only these scales have libjpeg-turbo's
 * SIMD inverse DCTs: 3/8, 5/8, 6/8 and 7/8 use plain C ones (7x7, 14x14 for
 * subsampled chroma...) that cost more than the full-size decode they save.
 * 1/8 is left out too: in libjpeg-turbo 2.1 it leaves columns near a
 * subsampled image's right edge undefined (valgrind shows reads of
 * uninitialised memory), and an item must be the same bytes everywhere. */
static int dct_scale(const source_box *sb, int size)
{
    for (int n = 2; n < 8; n *= 2) {
        if ((sb->x1 - sb->x0) * n / 8 >= size && (sb->y1 - sb->y0) * n / 8 >= size)
            return n;
    }
    return 8;
}

static void scale_box(source_box *sb, double f)
{
    sb->x0 *= f, sb->x1 *= f, sb->y0 *= f, sb->y1 *= f;
    sb->cx0 *= f, sb->cx1 *= f, sb->cy0 *= f, sb->cy1 *= f;
}

static int decode_jpeg(ferry__image_dec *d, const uint8_t *data, size_t len,
                       const ferry__image_opts *o, ferry__rng *rng, uint8_t *out,
                       ferry__image_box *box, char *err, size_t errlen)
{
    struct jpeg_decompress_struct *c = &d->jpeg;
    source_box sb;

    if (setjmp(d->jerr.jump)) {
        jpeg_abort_decompress(c);
        snprintf(err, errlen, "%s", d->jerr.message);
        return -1;
    }
    jpeg_mem_src(c, data, (unsigned long)len);
    jpeg_read_header(c, TRUE);
    int width = (int)c->image_width, height = (int)c->image_height;
    if ((uint64_t)width * (uint64_t)height > o->max_pixels) {
        jpeg_abort_decompress(c);
        snprintf(err, errlen, "%d x %d pixels is more than the %llu allowed", width, height,
                 (unsigned long long)o->max_pixels);
        return -1;
    }
    pick_box(width, height, o, rng, &sb, box);
    int cmyk = c->jpeg_color_space == JCS_CMYK || c->jpeg_color_space == JCS_YCCK;
    c->out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGBA; /* the 4th byte defined (0xff) */
    c->scale_num = (unsigned)(o->dct_scale ? dct_scale(&sb, o->size) : 8);
    c->scale_denom = 8;
    jpeg_calc_output_dimensions(c);
    scale_box(&sb, c->scale_num / 8.0);
    int sw = (int)c->output_width, sh = (int)c->output_height;
    if (make_filters(d, &sb, o->size, sw, sh)) {
        jpeg_abort_decompress(c);
        snprintf(err, errlen, "out of memory");
        return -1;
    }

    jpeg_start_decompress(c);
    /* The crop asked of libjpeg has a margin of a few pixels each side:
     * libjpeg-turbo's fancy upsampling leaves the last columns of a cropped
     * row undefined (valgrind sees it), so they must not be ones we use. */
    int from = d->fx.first - CROP_MARGIN, to = d->fx.last + CROP_MARGIN;
    from = from < 0 ? 0 : from;
    to = to > sw ? sw : to;
    JDIMENSION x_at = (JDIMENSION)from, cols = (JDIMENSION)(to - from);
    if (cols < c->output_width)
        jpeg_crop_scanline(c, &x_at, &cols);
    int rows = d->fy.last - d->fy.first;
    size_t stride = (size_t)cols * 4;
    if (grow(&d->region, &d->region_cap, (size_t)rows * stride) ||
        (cmyk && grow(&d->row, &d->row_cap, (size_t)cols * 4))) {
        jpeg_abort_decompress(c);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (d->fy.first > 0)
        jpeg_skip_scanlines(c, (JDIMENSION)d->fy.first);
    for (int r = 0; r < rows; r++) {
        uint8_t *dst = d->region + (size_t)r * stride;
        JSAMPROW line = cmyk ? d->row : dst;
        if (jpeg_read_scanlines(c, &line, 1) != 1) {
            jpeg_abort_decompress(c);
            snprintf(err, errlen, "the decoder stopped at row %d", d->fy.first + r);
            return -1;
        }
        if (cmyk)
            cmyk_to_rgbx(d->row, dst, cols, c->saw_Adobe_marker);
    }
    jpeg_abort_decompress(c);
    if (resample(d, d->region, stride, (int)x_at, o, (int)box->flipped, out)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* --- PNG --- */

static void png_fail(png_structp png, png_const_charp msg)
{
    ferry__image_dec *d = png_get_error_ptr(png);
    snprintf(d->png_message, sizeof d->png_message, "%s", msg);
    png_longjmp(png, 1);
}

static void png_quiet(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

static void png_read_mem(png_structp png, png_bytep to, size_t n)
{
    ferry__image_dec *d = png_get_io_ptr(png);
    if (n > d->png_len - d->png_at)
        png_error(png, "the file ends inside the image data");
    memcpy(to, d->png_data + d->png_at, n);
    d->png_at += n;
}

/* Decodes the whole PNG (it has no reduced-scale decode) as RGB 8-bit:
 * palettes expanded, grey copied to three channels, alpha dropped and 16-bit
 * samples cut to their high byte, as PIL's convert("RGB") gives for RGB and
 * palette files. */
static int decode_png(ferry__image_dec *d, const uint8_t *data, size_t len,
                      const ferry__image_opts *o, ferry__rng *rng, uint8_t *out,
                      ferry__image_box *box, char *err, size_t errlen)
{
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, d, png_fail, png_quiet);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    source_box sb;
    volatile int rc = -1;

    if (info == NULL) {
        png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    d->png_data = data;
    d->png_len = len;
    d->png_at = 0;
    d->png_message[0] = '\0';
    if (setjmp(png_jmpbuf(png))) {
        snprintf(err, errlen, "%s", d->png_message[0] ? d->png_message : "PNG decoder error");
        goto done;
    }
    png_set_read_fn(png, d, png_read_mem);
    png_set_user_limits(png, 1u << 30, 1u << 30);
    png_read_info(png, info);
    png_uint_32 width = png_get_image_width(png, info), height = png_get_image_height(png, info);
    if ((uint64_t)width * height > o->max_pixels) {
        snprintf(err, errlen, "%u x %u pixels is more than the %llu allowed", (unsigned)width,
                 (unsigned)height, (unsigned long long)o->max_pixels);
        goto done;
    }
    png_set_expand(png);
    png_set_strip_16(png);
    png_set_strip_alpha(png);
    png_set_gray_to_rgb(png);
    png_set_filler(png, 0, PNG_FILLER_AFTER);
    (void)png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)width * 4 || png_get_bit_depth(png, info) != 8) {
        snprintf(err, errlen, "unexpected PNG layout after conversion");
        goto done;
    }
    size_t stride = (size_t)width * 4;
    if (grow(&d->region, &d->region_cap, stride * height) ||
        grow(&d->row, &d->row_cap, sizeof(png_bytep) * height)) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    png_bytep *rows = (png_bytep *)(void *)d->row;
    for (png_uint_32 y = 0; y < height; y++)
        rows[y] = d->region + y * stride;
    png_read_image(png, rows);
    pick_box((int)width, (int)height, o, rng, &sb, box);
    if (make_filters(d, &sb, o->size, (int)width, (int)height) ||
        resample(d, d->region + (size_t)d->fy.first * stride, stride, 0, o, (int)box->flipped,
                 out)) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    rc = 0;
done:
    png_destroy_read_struct(&png, &info, NULL);
    return rc;
}

/* --- Float output --- */

void ferry__image_norm_table(float mean, float std, float table[256])
{
    for (int v = 0; v < 256; v++)
        table[v] = ((float)v / 255.0f - mean) / std;
}

void ferry__image_normalize(const uint8_t *in, size_t n, const float table[256], float *out)
{
    size_t i = 0;
#ifdef __SSE2__
    /* Looked up (two divisions per value were slower: the divider is
     * shared with the SMT sibling), four at a time, and written around
     * the cache when aligned, as the bytes are: 4 bytes of batch for each
     * input byte, read by another process. */
    if (((uintptr_t)out & 15) == 0) {
        for (; i + 4 <= n; i += 4)
            _mm_stream_ps(out + i, _mm_setr_ps(table[in[i]], table[in[i + 1]],
                                               table[in[i + 2]], table[in[i + 3]]));
        _mm_sfence();
    }
#endif
    for (; i < n; i++)
        out[i] = table[in[i]];
}

/* --- The entry point --- */

/* jpeg_create_decompress, whose only failure (no memory) longjmps. */
static int create_jpeg(ferry__image_dec *d)
{
    d->jpeg.err = jpeg_std_error(&d->jerr.pub);
    d->jerr.pub.error_exit = jpeg_fail;
    d->jerr.pub.emit_message = jpeg_note;
    if (setjmp(d->jerr.jump))
        return -1;
    jpeg_create_decompress(&d->jpeg);
    return 0;
}

ferry__image_dec *ferry__image_dec_new(void)
{
    ferry__image_dec *d = calloc(1, sizeof *d);
    if (d == NULL || create_jpeg(d) != 0) {
        free(d);
        return NULL;
    }
    d->weigh = pick_weigh();
    return d;
}

void ferry__image_dec_free(ferry__image_dec *d)
{
    if (d == NULL)
        return;
    jpeg_destroy_decompress(&d->jpeg);
    free(d->region);
    free(d->row);
    free(d->tmp);
    free(d->taps);
    free(d->fx.lo), free(d->fx.n), free(d->fx.k);
    free(d->fy.lo), free(d->fy.n), free(d->fy.k);
    free(d);
}

int ferry__image_decode(ferry__image_dec *d, const uint8_t *data, size_t len,
                        const ferry__image_opts *o, uint64_t sample_seed, uint8_t *out,
                        ferry__image_box *box, char *err, size_t errlen)
{
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    ferry__rng rng = {sample_seed};
    ferry__image_box unused;

    if (box == NULL)
        box = &unused;
    if (len == 0) {
        snprintf(err, errlen, "the file is empty");
        return -1;
    }
    if (len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff)
        return decode_jpeg(d, data, len, o, &rng, out, box, err, errlen);
    if (len >= 8 && memcmp(data, png_magic, 8) == 0)
        return decode_png(d, data, len, o, &rng, out, box, err, errlen);
    char head[3 * 8 + 1] = "";
    for (size_t i = 0, at = 0; i < len && i < 8; i++)
        at += (size_t)snprintf(head + at, sizeof head - at, "%s%02x", i ? " " : "", data[i]);
    snprintf(err, errlen, "not a JPEG or PNG file (it starts with %s)", head);
    return -1;
}
