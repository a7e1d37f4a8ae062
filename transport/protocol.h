/*
 * protocol.h - the wire protocol between a loader and its workers.
 *
 * Position in the data flow: between the scheduler (loader side) and the
 * worker loop. A message is a multipart ZeroMQ message: one msgpack header
 * frame (a map with a "type" key, see docs/protocol.md), then, for TASK and
 * BATCH only, one raw payload frame. This module only encodes and decodes
 * (and compares a BATCH with the schema a READY announced); it knows
 * nothing of sockets or epochs' meaning.
 *
 * Decoding is strict: every key must be known and present once, every value
 * must have the expected msgpack type and lie in its range, strings must fit
 * their buffers. Nothing in a message drives an allocation: the decoded
 * message is a fixed-size struct. Any violation returns FERRY_EPROTO with a
 * detail (ferry__seterr), and *out is then unspecified. On success the
 * message's own struct is written whole (string tails, unused dims and
 * padding zero) except for the elements of an array of maps (BATCH's
 * fields, READY's schema) past its length, which are left as they were:
 * clearing them cost every small BATCH a 2 KB memset.
 *
 * Thread safety: pure functions over caller-owned buffers.
 */
#ifndef FERRY_PROTOCOL_H
#define FERRY_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "seal.h"

/* Version 2: CONFIG carries max_message, READY the dataset's schema, and
 * REFUSE exists. Version 3: BATCH carries make_ns. Version 4: CONFIG
 * carries data_port and token (plain TCP's admission, docs/remote.md).
 * Version 5: TASK carries shm_offset and shm_bytes, BATCH shm (batches
 * through shared memory, transport/shm.h). HELLO and REFUSE never change
 * (docs/protocol.md section 7). */
#define FERRY_PROTOCOL_VERSION 6
/* The first version that knows REFUSE; an older worker is refused with STOP. */
#define FERRY__REFUSE_SINCE 2
/* How a version mismatch is said, on both sides: worker's, then loader's. */
#define FERRY__VERSION_MISMATCH "protocol version %u worker, version %u loader"

/* Largest header frame accepted or produced. */
#define FERRY__HDR_MAX 8192
#define FERRY__SPEC_MAX 4096 /* dataset spec, including the NUL */
#define FERRY__TEXT_MAX 4096 /* error messages (a Python traceback), including the NUL */
#define FERRY__HOST_MAX 256
#define FERRY__PROGRAM_MAX 64
#define FERRY__MAX_CREDITS 64
#define FERRY__MAX_BATCH 1048576u /* items in one batch */
/* One item of one field may be at most this big, in every dataset and in
 * every READY: a batch is count * item bytes, and this bound keeps that
 * product (and a slot's size) far from overflow. */
#define FERRY__ITEM_BYTES_MAX ((uint64_t)1 << 30)
#define FERRY__TOKEN_HEX 64        /* a session token: 32 random bytes in lowercase hex */
/* The smallest max_message: every header a worker sends fits it (the
 * largest, a BATCH of 16 fields of 8 dims with 63-byte names, is about
 * 3.2 KB). */
#define FERRY__MIN_MESSAGE 4096

typedef enum ferry__msg_type {
    FERRY__MSG_HELLO = 1,
    FERRY__MSG_CONFIG = 2,
    FERRY__MSG_READY = 3,
    FERRY__MSG_TASK = 4,
    FERRY__MSG_BATCH = 5,
    FERRY__MSG_FAIL = 6,
    FERRY__MSG_HEARTBEAT = 7,
    FERRY__MSG_STOP = 8,
    FERRY__MSG_BYE = 9,
    FERRY__MSG_REFUSE = 10,
} ferry__msg_type;

/* worker -> loader, first message. slot: the index the loader gave a local
 * worker when starting it, -1 for a worker that came by itself. */
typedef struct ferry__hello {
    uint32_t version;
    uint32_t pid;
    int32_t slot;
    char host[FERRY__HOST_MAX];
    char program[FERRY__PROGRAM_MAX];
} ferry__hello;

/* loader -> worker, answer to HELLO. */
typedef struct ferry__config_msg {
    char dataset[FERRY__SPEC_MAX];
    uint32_t worker_index;
    uint32_t num_workers;
    uint64_t seed;
    uint32_t credits;      /* 1..FERRY__MAX_CREDITS */
    uint32_t heartbeat_ms; /* 0 = off */
    uint32_t liveness;     /* intervals of silence before a peer is given up; 1..1000 */
    uint64_t max_message;  /* the largest frame the loader takes; FERRY__MIN_MESSAGE.. */
    /* Plain TCP: the port (on the host the worker reached) where the
     * session goes on, and the token that opens it (ZeroMQ's PLAIN
     * password). 0 and "": the session stays on this connection. */
    uint32_t data_port;
    char token[FERRY__TOKEN_HEX + 1];
    /* Under CURVE: the session's two keys (seal.h), which seal everything
     * on the data connection; "" on plain TCP. */
    char seal[FERRY__SEAL_KEYS_HEX + 1];
    /* Optional (sent only when set, so a peer that predates them sees the
     * CONFIG it knows): a worker the loader started itself retires, after
     * the batch it is on, once its private resident memory passes
     * retire_rss bytes or it has answered retire_batches tasks; 0: never
     * (options worker_max_rss_bytes, max_batches_per_worker). */
    uint64_t retire_rss;
    uint64_t retire_batches;
} ferry__config_msg;

/* One field of a dataset's schema: its name, dtype and the shape of one
 * item (the batch dim left out; ndim 0 is a scalar per item). */
typedef struct ferry__item_field {
    char name[FERRY_NAME_MAX];
    ferry_dtype dtype;
    int ndim; /* 0..FERRY_MAX_DIMS-1 */
    int64_t shape[FERRY_MAX_DIMS - 1];
    /* 1: a field of variable shape (FERRY_NDIM_VAR); its shape is [] or
     * [the bytes per item a batch slot reserves for it]. */
    uint32_t var;
} ferry__item_field;

typedef struct ferry__schema {
    uint32_t nfields; /* 1..FERRY_MAX_FIELDS in a schema that opened */
    ferry__item_field fields[FERRY_MAX_FIELDS];
} ferry__schema;

/* worker -> loader, after CONFIG. code == 0: the dataset opened and has
 * `length` items of `schema`; otherwise code is a FERRY_E* code, error says
 * why, and the schema is empty. */
typedef struct ferry__ready {
    uint64_t length;
    int32_t code;
    char error[FERRY__TEXT_MAX];
    ferry__schema schema;
} ferry__ready;

/* loader -> worker. The payload frame holds `count` little-endian uint64
 * sample indices. shm_bytes > 0: the worker may write the batch into
 * [shm_offset, shm_offset + shm_bytes) of the memory the loader shares
 * with it (a local worker's --shm-fd) instead of a payload frame; 0 (with
 * shm_offset 0): there is no such room. */
typedef struct ferry__task {
    uint64_t id;
    uint64_t epoch;
    uint64_t batch_in_epoch;
    uint64_t seq;
    uint32_t count; /* 1..FERRY__MAX_BATCH */
    uint64_t shm_offset;
    uint64_t shm_bytes;
} ferry__task;

/* One field of a BATCH: where its bytes lie in the payload frame (or, for
 * a BATCH with shm set, in the task's shared memory). */
typedef struct ferry__field_desc {
    char name[FERRY_NAME_MAX];
    ferry_dtype dtype;
    int ndim; /* 1..FERRY_MAX_DIMS, shape[0] == count unless var */
    int64_t shape[FERRY_MAX_DIMS];
    uint64_t offset; /* from the start of the payload frame, or of the task's shm room */
    uint64_t nbytes; /* == product(shape) * dtype size */
    uint32_t var;    /* 1: a field of variable shape; shape[0] is not the count */
} ferry__field_desc;

/* worker -> loader. */
typedef struct ferry__batch_hdr {
    uint64_t id;
    uint64_t make_ns; /* the worker's time from the TASK to this reply */
    uint32_t count;
    uint32_t shm;     /* 1: the bytes are in the task's shm room, the payload frame is empty */
    uint32_t nfields; /* 1..FERRY_MAX_FIELDS */
    ferry__field_desc fields[FERRY_MAX_FIELDS];
} ferry__batch_hdr;

/* worker -> loader: the dataset failed on task id. */
typedef struct ferry__fail {
    uint64_t id;
    int32_t code;   /* negative FERRY_E* */
    uint64_t index; /* first failing sample index */
    char message[FERRY__TEXT_MAX];
} ferry__fail;

/* Why a worker ended its own session (BYE's `retired`): it is done, not
 * broken, and wants replacing. */
typedef enum ferry__retire_reason {
    FERRY__RETIRE_NONE = 0,    /* a plain BYE: the answer to STOP, or told to quit */
    FERRY__RETIRE_MEMORY = 1,  /* its private resident memory passed CONFIG.retire_rss */
    FERRY__RETIRE_BATCHES = 2, /* it answered CONFIG.retire_batches tasks */
} ferry__retire_reason;

/* worker -> loader, the session's end. Every key is optional: a plain BYE
 * carries only its type. A worker that retires (ferry__retire_reason)
 * says why, with its private resident memory then and the tasks it
 * answered, after its last BATCH and before it exits. */
typedef struct ferry__bye {
    uint32_t retired; /* ferry__retire_reason */
    uint64_t rss;     /* bytes */
    uint64_t batches;
} ferry__bye;

/* loader -> worker, instead of CONFIG: the worker speaks another protocol
 * version and is to stop now. Frozen like HELLO, so every version from
 * FERRY__REFUSE_SINCE on decodes it. */
typedef struct ferry__refuse {
    uint32_t version; /* the loader's */
    char reason[FERRY__TEXT_MAX];
} ferry__refuse;

typedef struct ferry__msg {
    ferry__msg_type type;
    union {
        ferry__hello hello;
        ferry__config_msg config;
        ferry__ready ready;
        ferry__task task;
        ferry__batch_hdr batch;
        ferry__fail fail;
        ferry__refuse refuse;
        ferry__bye bye;
    } u; /* HEARTBEAT and STOP carry nothing */
} ferry__msg;

/* Encodes m's header into buf (cap bytes; FERRY__HDR_MAX always suffices).
 * FERRY_EINVAL if m is not valid by the same rules the decoder applies (so an
 * encoder bug cannot put a message on the wire that its peer would reject),
 * FERRY_ELIMIT if cap is too small. No allocation. */
int ferry__msg_encode(const ferry__msg *m, void *buf, size_t cap, size_t *len);

/* Decodes a header frame. FERRY_EPROTO on any violation. */
int ferry__msg_decode(const void *buf, size_t len, ferry__msg *out);

/* Whether message type `type` has a payload frame (TASK, BATCH). */
int ferry__msg_has_payload(ferry__msg_type type);

/* Checks a decoded TASK or BATCH against its payload frame's length: TASK
 * needs exactly count * 8 bytes; BATCH needs every field inside the frame,
 * fields not overlapping, or with shm set an empty frame (its fields are
 * checked against the task's room with ferry__batch_check_layout).
 * FERRY_EPROTO otherwise. */
int ferry__msg_check_payload(const ferry__msg *m, size_t payload_len);

/* Every field of BATCH b inside `len` bytes, no two sharing a byte.
 * FERRY_EPROTO otherwise. */
int ferry__batch_check_layout(const ferry__batch_hdr *b, uint64_t len);

/* BATCH layout: every field starts on a multiple of this from the worker's
 * lead offset (see docs/protocol.md), and copies keep the same spacing. */
#define FERRY__FIELD_ALIGN 64

/* The TASK payload: `n` indices as little-endian uint64, 8 * n bytes. */
void ferry__indices_pack(const uint64_t *idx, size_t n, void *out);
void ferry__indices_unpack(const void *in, size_t n, uint64_t *idx);

/* The schema a BATCH's fields make: each field's name and dtype, and its
 * shape without the batch dim. */
void ferry__batch_schema(const ferry__batch_hdr *b, ferry__schema *out);

/* The bytes one item of field f takes in a batch slot (a READY's field,
 * as the decoder accepted it): its dtype's size times its item shape, or
 * what a field of variable shape reserves per item. */
uint64_t ferry__item_field_bytes(const ferry__item_field *f);

/* Compares schema `got` with `want`: 0 when they are the same (same
 * fields in the same order, with the same names, dtypes and item shapes),
 * else 1 with the first difference said in why ("field 1 'y' is i8, the
 * schema's is i64"). */
int ferry__schema_diff(const ferry__schema *want, const ferry__schema *got, char *why, size_t cap);

/* ferry__schema_diff(want, the schema of BATCH b's fields), without
 * building that schema. */
int ferry__batch_schema_diff(const ferry__schema *want, const ferry__batch_hdr *b, char *why,
                             size_t cap);

/* Name of a message type for logs ("TASK"), "?" if unknown. */
const char *ferry__msg_name(int type);

#endif
