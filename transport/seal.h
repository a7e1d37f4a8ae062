/*
 * seal.h - the encryption of a CURVE session's data connection.
 *
 * Under CURVE a remote worker says HELLO on the CURVE socket, where its
 * key is checked and CONFIG comes back encrypted; the session then goes
 * on, as on plain TCP, over a data connection of its own (ZeroMQ's PLAIN
 * with a one-use session token). What makes that connection private is
 * here: the loader draws two random AES-256 keys for the session (one per
 * direction) and sends them inside CONFIG, and every message on the data
 * connection is sealed with AES-256-GCM under its sender's key.
 *
 * Why not libzmq's CURVE all the way: it costs the loader 2x plain TCP's
 * CPU per batch (XSalsa20-Poly1305 through libsodium's portable code, plus
 * two zeroed buffers and two copies of every message), where OpenSSL's
 * AES-GCM runs at several GB/s per core and opens a batch in place, in the
 * frame that backs it.
 *
 * A sealed message is the plain one with its frames encrypted in place and
 * a trailer on the header frame: [header ciphertext][counter: 8][header
 * tag: 16][payload tag: 16, zero without a payload]. Frame f of message
 * number c is encrypted with the nonce (f, c); the header's additional
 * data is the counter and whether a payload frame follows. So a frame
 * changed, moved between messages, added or dropped fails to open, and
 * counters must rise: a message replayed or reordered is refused. The
 * counter starts at 1 for each direction of each session, whose keys are
 * never used again.
 *
 * Thread safety: a seal is used by one thread at a time (the worker's
 * socket mutex, the loader's scheduler thread).
 */
#ifndef FERRY_SEAL_H
#define FERRY_SEAL_H

#include <stddef.h>
#include <stdint.h>

#define FERRY__SEAL_KEY 32                           /* bytes of one AES-256 key */
#define FERRY__SEAL_KEYS_HEX (2 * 2 * FERRY__SEAL_KEY) /* both keys, hex, as CONFIG has them */
#define FERRY__SEAL_TAG 16
#define FERRY__SEAL_TRAILER (8 + 2 * FERRY__SEAL_TAG)

typedef struct ferry__seal ferry__seal;

/* Which end of the session a seal is for: which of the two keys seals
 * (the other opens). */
typedef enum { FERRY__SEAL_LOADER = 0, FERRY__SEAL_WORKER = 1 } ferry__seal_side;

/* Fills hex (2 x nbytes + 1 bytes) with nbytes from the kernel's random
 * source in lowercase hex: a session token, or a session's two keys
 * (nbytes 2 x FERRY__SEAL_KEY, as ferry__seal_new takes them). FERRY_ESYS
 * should that fail. */
int ferry__random_hex(char *hex, size_t nbytes);

/* A seal for `side` of the session whose keys are `hex` (as drawn above).
 * FERRY_EPROTO when hex is not such keys, FERRY_ENOMEM, FERRY_ESYS when
 * OpenSSL refuses. */
int ferry__seal_new(ferry__seal **out, const char *hex, ferry__seal_side side);
void ferry__seal_free(ferry__seal *s);

/* Seals one outgoing message: hdr's *len bytes are encrypted and the
 * trailer appended (cap must leave FERRY__SEAL_TRAILER bytes of room);
 * with has_payload, payload's plen bytes are encrypted in place. FERRY_OK,
 * or FERRY_ESYS when OpenSSL fails. */
int ferry__seal_message(ferry__seal *s, unsigned char *hdr, size_t *len, size_t cap,
                        int has_payload, void *payload, size_t plen);

/* What opening a header leaves for its payload. */
typedef struct ferry__seal_opened {
    uint64_t counter;
    unsigned char payload_tag[FERRY__SEAL_TAG];
} ferry__seal_opened;

/* Opens a received header frame in place: *len becomes the header's own
 * length. has_payload: whether a payload frame follows it. FERRY_EPROTO
 * (with the reason) when the frame is too short, does not authenticate, or
 * repeats or goes back on a counter already opened. */
int ferry__seal_open_header(ferry__seal *s, unsigned char *frame, size_t *len, int has_payload,
                            ferry__seal_opened *op);

/* Opens the payload frame of the header opened into op, in place.
 * FERRY_EPROTO when it does not authenticate. */
int ferry__seal_open_payload(ferry__seal *s, const ferry__seal_opened *op, void *payload,
                             size_t len);

#endif
