/*
 * fuzz_protocol.c - libFuzzer target on the wire protocol's decoders.
 *
 * The input is split as the loader would see a message: the first byte says
 * how long the header frame is (as a share of the input), the rest is the
 * payload frame. Every header goes through ferry__msg_decode; one that
 * decodes must re-encode, decode again to the same struct, and have its
 * payload checked by ferry__msg_check_payload. Anything else is a bug.
 *
 * Build: cmake -DCMAKE_C_COMPILER=clang -DFERRY_FUZZ=ON; run:
 *   build-fuzz/fuzz_protocol tests/fuzz/corpus -max_total_time=60
 * (tools/setup.sh fuzz runs it on a scratch copy of the corpus). The seeds
 * in tests/fuzz/corpus, one valid message of each type in this layout, are
 * written by tests/fuzz/make_seeds.c (build/ferry_fuzz_seeds
 * tests/fuzz/corpus) after a protocol change; test_protocol checks that
 * they all still decode.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t hlen = (size - 1) * data[0] / 255;
    const uint8_t *hdr = data + 1;
    size_t plen = size - 1 - hlen;

    static ferry__msg m, again;
    if (ferry__msg_decode(hdr, hlen, &m) != FERRY_OK)
        return 0;
    if (ferry__msg_has_payload(m.type))
        (void)ferry__msg_check_payload(&m, plen);

    static unsigned char buf[FERRY__HDR_MAX];
    size_t len;
    if (ferry__msg_encode(&m, buf, sizeof buf, &len) != FERRY_OK)
        abort(); /* accepted on input, refused on output: the rules disagree */
    if (ferry__msg_decode(buf, len, &again) != FERRY_OK)
        abort();
    static unsigned char buf2[FERRY__HDR_MAX];
    size_t len2;
    if (ferry__msg_encode(&again, buf2, sizeof buf2, &len2) != FERRY_OK || len2 != len ||
        memcmp(buf, buf2, len) != 0)
        abort(); /* not a fixed point */
    return 0;
}
