/*
 * make_seeds.c - writes the fuzz target's seed corpus: one valid message of
 * each type (READY twice: a dataset, and an error), laid out as
 * fuzz_protocol.c splits its input: a first byte giving the header's share,
 * the header frame as ferry's encoder makes it, then the payload frame of a
 * TASK or BATCH. Run it after changing the protocol:
 *
 *   build/ferry_fuzz_seeds tests/fuzz/corpus
 *
 * test_protocol checks that every seed in tests/fuzz/corpus still decodes
 * and that every message type has one.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "protocol.h"

static void item_field(ferry__item_field *f, const char *name, ferry_dtype dtype, int64_t dim)
{
    snprintf(f->name, sizeof f->name, "%s", name);
    f->dtype = dtype;
    f->ndim = dim ? 1 : 0;
    f->shape[0] = dim;
}

static void batch_field(ferry__field_desc *f, const char *name, ferry_dtype dtype, int64_t dim,
                        uint64_t offset)
{
    snprintf(f->name, sizeof f->name, "%s", name);
    f->dtype = dtype;
    f->ndim = dim ? 2 : 1;
    f->shape[0] = 4;
    f->shape[1] = dim;
    f->offset = offset;
    f->nbytes = 4 * ferry_dtype_size(dtype) * (uint64_t)(dim ? dim : 1);
}

/* The first byte b such that fuzz_protocol.c's split, (size - 1) * b / 255,
 * gives exactly hlen bytes of header; -1 if none does. */
static int split_byte(size_t hlen, size_t plen)
{
    for (int b = 0; b < 256; b++) {
        if ((hlen + plen) * (size_t)b / 255 == hlen)
            return b;
    }
    return -1;
}

/* Writes dir/name: the split byte, m's header, then the plen bytes of
 * payload, padded with zeros until some split byte fits. 0, or -1. */
static int write_seed(const char *dir, const char *name, const ferry__msg *m,
                      const unsigned char *payload, size_t plen)
{
    unsigned char hdr[FERRY__HDR_MAX];
    size_t hlen;
    if (ferry__msg_encode(m, hdr, sizeof hdr, &hlen) != FERRY_OK) {
        fprintf(stderr, "make_seeds: %s: %s\n", name, ferry_last_error());
        return -1;
    }
    size_t pad = 0;
    int b;
    while ((b = split_byte(hlen, plen + pad)) < 0)
        pad++;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return -1;
    }
    fputc(b, f);
    fwrite(hdr, 1, hlen, f);
    if (plen)
        fwrite(payload, 1, plen, f);
    for (size_t i = 0; i < pad; i++)
        fputc(0, f);
    return fclose(f) == 0 ? 0 : -1;
}

/* HELLO, CONFIG, READY (both forms), FAIL, REFUSE and the empty ones. */
static int plain_seeds(const char *dir)
{
    static ferry__msg m;
    int rc = 0;
    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_HELLO;
    m.u.hello = (ferry__hello){.version = FERRY_PROTOCOL_VERSION, .pid = 42, .slot = -1};
    strcpy(m.u.hello.host, "host");
    strcpy(m.u.hello.program, "ferry-worker 0.1.0");
    rc |= write_seed(dir, "hello", &m, NULL, 0);

    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_CONFIG;
    m.u.config = (ferry__config_msg){.worker_index = 1,
                                     .num_workers = 2,
                                     .seed = 7,
                                     .credits = 2,
                                     .heartbeat_ms = 1000,
                                     .liveness = 3,
                                     .max_message = UINT64_C(1) << 31};
    strcpy(m.u.config.dataset, "synthetic:n=10,dim=4");
    rc |= write_seed(dir, "config", &m, NULL, 0);
    /* Plain TCP's CONFIG: the data port and its session token. */
    m.u.config.data_port = 40123;
    memset(m.u.config.token, 'a', FERRY__TOKEN_HEX);
    rc |= write_seed(dir, "config_data", &m, NULL, 0);
    /* CURVE's: the session's keys too. */
    memset(m.u.config.seal, 'b', FERRY__SEAL_KEYS_HEX);
    rc |= write_seed(dir, "config_sealed", &m, NULL, 0);
    /* A local worker's, with the retirement keys. */
    memset(m.u.config.seal, 0, sizeof m.u.config.seal);
    memset(m.u.config.token, 0, sizeof m.u.config.token);
    m.u.config.data_port = 0;
    m.u.config.retire_rss = UINT64_C(1) << 31;
    m.u.config.retire_batches = 1000;
    rc |= write_seed(dir, "config_retire", &m, NULL, 0);

    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_READY;
    m.u.ready.length = 1000;
    m.u.ready.schema.nfields = 2;
    item_field(&m.u.ready.schema.fields[0], "x", FERRY_DTYPE_U8, 3);
    item_field(&m.u.ready.schema.fields[1], "y", FERRY_DTYPE_I64, 0);
    rc |= write_seed(dir, "ready", &m, NULL, 0);

    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_READY;
    m.u.ready.code = FERRY_EDATASET;
    strcpy(m.u.ready.error, "no such file");
    rc |= write_seed(dir, "ready_err", &m, NULL, 0);

    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_FAIL;
    m.u.fail = (ferry__fail){.id = 5, .code = FERRY_EBATCH, .index = 3};
    strcpy(m.u.fail.message, "decode error");
    rc |= write_seed(dir, "fail", &m, NULL, 0);

    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_REFUSE;
    m.u.refuse.version = FERRY_PROTOCOL_VERSION;
    snprintf(m.u.refuse.reason, sizeof m.u.refuse.reason, FERRY__VERSION_MISMATCH, 3u,
             (unsigned)FERRY_PROTOCOL_VERSION);
    rc |= write_seed(dir, "refuse", &m, NULL, 0);

    static const struct {
        ferry__msg_type type;
        const char *name;
    } empty[] = {
        {FERRY__MSG_HEARTBEAT, "heartbeat"}, {FERRY__MSG_STOP, "stop"}, {FERRY__MSG_BYE, "bye"}};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        memset(&m, 0, sizeof m);
        m.type = empty[i].type;
        rc |= write_seed(dir, empty[i].name, &m, NULL, 0);
    }
    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_BYE;
    m.u.bye = (ferry__bye){.retired = FERRY__RETIRE_MEMORY, .rss = UINT64_C(3) << 30, .batches = 812};
    rc |= write_seed(dir, "bye_retired", &m, NULL, 0);
    return rc;
}

/* TASK and BATCH, with their payloads. */
static int payload_seeds(const char *dir)
{
    static ferry__msg m;
    static unsigned char payload[128];
    int rc = 0;
    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_TASK;
    m.u.task = (ferry__task){.id = 5, .epoch = 1, .batch_in_epoch = 0, .seq = 5, .count = 4};
    const uint64_t idx[4] = {3, 1, 4, 1};
    ferry__indices_pack(idx, 4, payload);
    rc |= write_seed(dir, "task", &m, payload, 32);
    /* The same task with room in the batch slots. */
    m.u.task.shm_offset = 8192;
    m.u.task.shm_bytes = 4096;
    rc |= write_seed(dir, "task_shm", &m, payload, 32);

    memset(&m, 0, sizeof m);
    m.type = FERRY__MSG_BATCH;
    m.u.batch.id = 5;
    m.u.batch.make_ns = 250000;
    m.u.batch.count = 4;
    m.u.batch.nfields = 2;
    batch_field(&m.u.batch.fields[0], "x", FERRY_DTYPE_U8, 3, 0);   /* [0, 12) */
    batch_field(&m.u.batch.fields[1], "y", FERRY_DTYPE_I64, 0, 64); /* [64, 96) */
    for (size_t i = 0; i < 96; i++)
        payload[i] = (unsigned char)(i * 7);
    rc |= write_seed(dir, "batch", &m, payload, 96);
    /* Its answer in the slot: an empty payload frame. */
    m.u.batch.shm = 1;
    rc |= write_seed(dir, "batch_shm", &m, payload, 0);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    return plain_seeds(argv[1]) | payload_seeds(argv[1]) ? 1 : 0;
}
