/*
 * fuzz_image.c - libFuzzer target on the image decoders (JPEG through
 * libjpeg-turbo, PNG through libpng, then ferry's crop and resample), the
 * code that reads files a dataset's owner never vetted.
 *
 * Input: one byte of options, then the file. The byte picks the output
 * size (1..32), the crop (random or centre), the flip, the layout and
 * whether JPEGs decode at a reduced DCT scale, so every path of
 * ferry__image_decode is reached. A decode either succeeds or fails with a
 * message; anything else (a crash, a read outside the input, a leak,
 * undefined behaviour) is a bug.
 *
 * Build and run: tools/setup.sh fuzz (seeds: tests/fuzz/images, one small
 * valid file of each colour space and format, each behind its option
 * byte).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ferry__image_dec *dec;
    static uint8_t out[32 * 32 * 3];
    char err[256];

    if (size < 1)
        return 0;
    if (dec == NULL && (dec = ferry__image_dec_new()) == NULL)
        abort();
    uint8_t b = data[0];
    ferry__image_opts o = {
        .size = 1 + (b & 31),
        .random_crop = (b >> 5) & 1,
        .scale_lo = 0.08,
        .scale_hi = 1.0,
        .ratio_lo = 3.0 / 4.0,
        .ratio_hi = 4.0 / 3.0,
        .flip = (b >> 6) & 1,
        .hwc = (b >> 7) & 1,
        .dct_scale = (b & 1) ^ ((b >> 6) & 1),
        .max_pixels = 1u << 22, /* a fuzzer's memory is bounded */
    };
    o.resize = o.size + (b & 3);
    /* The file alone, in a block of its own size, so that ASan sees any
     * read past its end. */
    uint8_t *file = malloc(size - 1 ? size - 1 : 1);
    memcpy(file, data + 1, size - 1);
    if (ferry__image_decode(dec, file, size - 1, &o, b, out, NULL, err, sizeof err) != 0 &&
        memchr(err, '\0', sizeof err) == NULL)
        abort(); /* the message must be a string */
    free(file);
    return 0;
}
