/*
 * seal.c - AES-256-GCM over a session's data connection (see seal.h).
 */
#include "seal.h"

#include <errno.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "alloc.h"
#include "error.h"

/* One direction: its cipher context keyed once, and its counter (the
 * last sealed, or the last opened). */
typedef struct seal_dir {
    EVP_CIPHER_CTX *ctx;
    uint64_t counter;
} seal_dir;

struct ferry__seal {
    seal_dir out, in;
};

/* EVP takes an int length: a frame goes through in pieces of this. */
#define SEAL_CHUNK (1 << 30)

enum { FRAME_HEADER = 0, FRAME_PAYLOAD = 1 };

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The 96-bit nonce of frame f of message `counter`: unique per key, since
 * counters only rise and a message has two frames at most. */
static void nonce_of(unsigned char nonce[12], uint32_t f, uint64_t counter)
{
    for (int i = 0; i < 4; i++)
        nonce[i] = (unsigned char)(f >> (8 * i));
    put_u64(nonce + 4, counter);
}

/* The header's additional data: its counter and whether a payload
 * follows. */
static void header_aad(unsigned char aad[9], uint64_t counter, int has_payload)
{
    put_u64(aad, counter);
    aad[8] = has_payload ? 1 : 0;
}

static int ssl_failed(const char *what)
{
    return ferry__seterr(FERRY_ESYS, "OpenSSL could not %s (AES-256-GCM)", what);
}

/* Encrypts (enc 1) or decrypts buf in place under ctx with nonce (f,
 * counter) and aad, writing or checking tag. 1 on success; 0 when a tag
 * does not match or OpenSSL fails. */
static int seal_crypt(EVP_CIPHER_CTX *ctx, int enc, uint32_t f, uint64_t counter,
                 const unsigned char *aad, int aadlen, unsigned char *buf, size_t len,
                 unsigned char tag[FERRY__SEAL_TAG])
{
    unsigned char nonce[12];
    nonce_of(nonce, f, counter);
    int n;
    if (!EVP_CipherInit_ex(ctx, NULL, NULL, NULL, nonce, enc))
        return 0;
    if (aadlen && !EVP_CipherUpdate(ctx, NULL, &n, aad, aadlen))
        return 0;
    for (size_t done = 0; done < len;) {
        int step = len - done > SEAL_CHUNK ? SEAL_CHUNK : (int)(len - done);
        if (!EVP_CipherUpdate(ctx, buf + done, &n, buf + done, step))
            return 0;
        done += (size_t)step;
    }
    if (!enc && !EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, FERRY__SEAL_TAG, tag))
        return 0;
    if (EVP_CipherFinal_ex(ctx, buf + len, &n) <= 0)
        return 0;
    return !enc || EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, FERRY__SEAL_TAG, tag);
}

int ferry__random_hex(char *hex, size_t nbytes)
{
    unsigned char raw[4 * FERRY__SEAL_KEY];
    if (nbytes > sizeof raw)
        return ferry__seterr(FERRY_EINVAL, "%zu random bytes asked for, at most %zu", nbytes,
                             sizeof raw);
    size_t got = 0;
    while (got < nbytes) {
        ssize_t r = getrandom(raw + got, nbytes - got, 0);
        if (r < 0 && errno != EINTR)
            return ferry__syserr(FERRY_ESYS, "getrandom (a session's token or keys)", errno);
        if (r > 0)
            got += (size_t)r;
    }
    for (size_t i = 0; i < nbytes; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    hex[2 * nbytes] = '\0';
    explicit_bzero(raw, sizeof raw);
    return FERRY_OK;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* keys[k] from hex, which must be exactly both keys in lowercase hex. */
static int parse_keys(const char *hex, unsigned char keys[2][FERRY__SEAL_KEY])
{
    if (strnlen(hex, FERRY__SEAL_KEYS_HEX + 1) != FERRY__SEAL_KEYS_HEX)
        return 0;
    unsigned char *raw = &keys[0][0];
    for (size_t i = 0; i < 2 * FERRY__SEAL_KEY; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return 0;
        raw[i] = (unsigned char)(hi << 4 | lo);
    }
    return 1;
}

static int dir_init(seal_dir *d, const unsigned char *key, int enc)
{
    d->ctx = EVP_CIPHER_CTX_new();
    return d->ctx && EVP_CipherInit_ex(d->ctx, EVP_aes_256_gcm(), NULL, key, NULL, enc);
}

int ferry__seal_new(ferry__seal **out, const char *hex, ferry__seal_side side)
{
    unsigned char keys[2][FERRY__SEAL_KEY];
    if (!parse_keys(hex, keys))
        return ferry__seterr(FERRY_EPROTO, "a session's keys are not %d lowercase hex digits",
                             FERRY__SEAL_KEYS_HEX);
    ferry__seal *s = ferry__calloc(1, sizeof *s);
    if (!s) {
        explicit_bzero(keys, sizeof keys);
        return ferry__seterr(FERRY_ENOMEM, "out of memory for a session's keys");
    }
    /* keys[0] seals what the loader sends, keys[1] what the worker sends. */
    int mine = side == FERRY__SEAL_LOADER ? 0 : 1;
    int ok = dir_init(&s->out, keys[mine], 1) && dir_init(&s->in, keys[1 - mine], 0);
    explicit_bzero(keys, sizeof keys);
    if (!ok) {
        ferry__seal_free(s);
        return ssl_failed("set up a session's keys");
    }
    *out = s;
    return FERRY_OK;
}

void ferry__seal_free(ferry__seal *s)
{
    if (!s)
        return;
    EVP_CIPHER_CTX_free(s->out.ctx); /* wipes the key schedule */
    EVP_CIPHER_CTX_free(s->in.ctx);
    free(s);
}

int ferry__seal_message(ferry__seal *s, unsigned char *hdr, size_t *len, size_t cap,
                        int has_payload, void *payload, size_t plen)
{
    if (cap - *len < FERRY__SEAL_TRAILER || *len > INT_MAX)
        return ferry__seterr(FERRY_ELIMIT, "no room for a sealed header's trailer");
    uint64_t c = ++s->out.counter;
    unsigned char aad[9], *t = hdr + *len;
    header_aad(aad, c, has_payload);
    put_u64(t, c);
    memset(t + 8 + FERRY__SEAL_TAG, 0, FERRY__SEAL_TAG);
    if (!seal_crypt(s->out.ctx, 1, FRAME_HEADER, c, aad, sizeof aad, hdr, *len, t + 8))
        return ssl_failed("seal a header");
    if (has_payload && !seal_crypt(s->out.ctx, 1, FRAME_PAYLOAD, c, NULL, 0, payload, plen,
                          t + 8 + FERRY__SEAL_TAG))
        return ssl_failed("seal a payload");
    *len += FERRY__SEAL_TRAILER;
    return FERRY_OK;
}

int ferry__seal_open_header(ferry__seal *s, unsigned char *frame, size_t *len, int has_payload,
                            ferry__seal_opened *op)
{
    if (*len < FERRY__SEAL_TRAILER)
        return ferry__seterr(FERRY_EPROTO, "a sealed header of %zu bytes is shorter than its "
                                           "trailer",
                             *len);
    size_t hlen = *len - FERRY__SEAL_TRAILER;
    unsigned char *t = frame + hlen;
    uint64_t c = get_u64(t);
    if (c <= s->in.counter)
        return ferry__seterr(FERRY_EPROTO,
                             "a sealed message numbered %llu after %llu (replayed or reordered)",
                             (unsigned long long)c, (unsigned long long)s->in.counter);
    unsigned char aad[9];
    header_aad(aad, c, has_payload);
    if (!seal_crypt(s->in.ctx, 0, FRAME_HEADER, c, aad, sizeof aad, frame, hlen, t + 8))
        return ferry__seterr(FERRY_EPROTO, "a sealed header does not authenticate (changed on "
                                           "the way, or not sealed with this session's key)");
    s->in.counter = c;
    op->counter = c;
    memcpy(op->payload_tag, t + 8 + FERRY__SEAL_TAG, FERRY__SEAL_TAG);
    *len = hlen;
    return FERRY_OK;
}

int ferry__seal_open_payload(ferry__seal *s, const ferry__seal_opened *op, void *payload,
                             size_t len)
{
    unsigned char tag[FERRY__SEAL_TAG];
    memcpy(tag, op->payload_tag, sizeof tag);
    if (!seal_crypt(s->in.ctx, 0, FRAME_PAYLOAD, op->counter, NULL, 0, payload, len, tag))
        return ferry__seterr(FERRY_EPROTO, "a sealed payload does not authenticate (changed on "
                                           "the way, or not that header's)");
    return FERRY_OK;
}
