/*
 * keys.c - CURVE key files and allow-lists (see keys.h).
 *
 * Every file goes through read_keys(): it streams the file through a fixed
 * buffer on the stack (no allocation, so no copy of a secret key is left on
 * the heap), splits it into lines within the size limits, parses each line
 * (parse_line) and hands each key to a callback for the file's format. The
 * callbacks decide what a format allows: a key pair file one public-key and
 * one secret-key line, a public key file one public key, an allow-list any
 * number of public keys.
 *
 * Writing a key pair never leaves a half-written file under a real name:
 * each file is complete (mode set, contents synced) in a temporary file
 * before link() or rename() gives it its name.
 */
#include "keys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "alloc.h"
#include "error.h"

#define LINE_MAX_BYTES 1024
#define FILE_MAX_BYTES (1024 * 1024)

static const char z85_alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz"
                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/* Decodes a NUL-terminated 40-character Z85 key. The alphabet is checked
 * here, and only the canonical encoding is accepted (the key must encode
 * back to the same text), so that a group whose value overflows 32 bits is
 * refused whatever a given libzmq's decoder checks. Returns 0, or -1 with
 * key zeroed. */
static int z85_key_decode(const char *z85, unsigned char key[FERRY__KEY_BYTES])
{
    char again[FERRY__Z85_KEY + 1];
    int ok;

    for (size_t i = 0; i < FERRY__Z85_KEY; i++)
        if (z85[i] == '\0' || !strchr(z85_alphabet, z85[i]))
            return -1;
    if (z85[FERRY__Z85_KEY] != '\0')
        return -1;
    ok = zmq_z85_decode(key, z85) && zmq_z85_encode(again, key, FERRY__KEY_BYTES) &&
         memcmp(again, z85, FERRY__Z85_KEY) == 0;
    explicit_bzero(again, sizeof again);
    if (!ok)
        explicit_bzero(key, FERRY__KEY_BYTES);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------------
 * The line parser
 */

typedef enum key_kind { KEY_BARE, KEY_PUBLIC, KEY_SECRET } key_kind;

static const char *kind_name(key_kind kind)
{
    return kind == KEY_SECRET ? "secret-key" : "public-key";
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* Parses one line of len bytes (no '\n'). Returns 1 for a key line, with
 * *kind, z85 (NUL-terminated) and key (decoded) filled in; 0 for a blank or
 * comment line; FERRY_EFORMAT naming path:lineno for anything else. The
 * message never quotes the line: it may hold a secret key. */
static int parse_line(const char *s, size_t len, const char *path, unsigned lineno, key_kind *kind,
                      char z85[FERRY__Z85_KEY + 1], unsigned char key[FERRY__KEY_BYTES])
{
    static const key_kind named[] = {KEY_PUBLIC, KEY_SECRET};
    size_t i = 0, start, n;

    while (i < len && is_blank(s[i]))
        i++;
    if (i == len || s[i] == '#')
        return 0;

    *kind = KEY_BARE;
    for (size_t k = 0; k < sizeof named / sizeof named[0]; k++) {
        const char *name = kind_name(named[k]);
        size_t j = i + strlen(name);
        if (j > len || memcmp(s + i, name, j - i) != 0)
            continue;
        while (j < len && is_blank(s[j]))
            j++;
        if (j < len && s[j] == '=') {
            *kind = named[k];
            for (i = j + 1; i < len && is_blank(s[i]); i++)
                ;
            break;
        }
    }

    /* The key runs to the next blank; '#' is a Z85 character, so a comment
     * glued to the key is recognised only where the key must end. */
    start = i;
    while (i < len && !is_blank(s[i]) && !(i - start == FERRY__Z85_KEY && s[i] == '#'))
        i++;
    n = i - start;
    while (i < len && is_blank(s[i]))
        i++;

    if (*kind == KEY_BARE && (n != FERRY__Z85_KEY || (i < len && s[i] != '#')))
        return ferry__seterr(FERRY_EFORMAT,
                             "%s:%u: not a key line (expected `public-key = KEY` or a bare KEY "
                             "of 40 Z85 characters)",
                             path, lineno);
    if (n != FERRY__Z85_KEY)
        return ferry__seterr(FERRY_EFORMAT,
                             "%s:%u: the %s is %zu characters long; a Z85 key has 40", path, lineno,
                             kind_name(*kind), n);
    if (i < len && s[i] != '#')
        return ferry__seterr(FERRY_EFORMAT, "%s:%u: unexpected text after the %s", path, lineno,
                             kind_name(*kind));
    memcpy(z85, s + start, FERRY__Z85_KEY);
    z85[FERRY__Z85_KEY] = '\0';
    if (z85_key_decode(z85, key) != 0) {
        explicit_bzero(z85, FERRY__Z85_KEY + 1);
        return ferry__seterr(FERRY_EFORMAT, "%s:%u: the %s is not valid Z85", path, lineno,
                             *kind == KEY_BARE ? "key" : kind_name(*kind));
    }
    return 1;
}

/* ------------------------------------------------------------------------
 * The line reader
 */

/* Called for each key line; returns FERRY_OK to go on or an error code (its
 * message set) to stop. z85 and key are wiped after the call. */
typedef int (*key_fn)(void *ctx, const char *path, unsigned lineno, key_kind kind, const char *z85,
                      const unsigned char *key);

typedef struct line_reader {
    int fd;
    const char *path;
    unsigned lineno; /* lines returned so far */
    size_t total;    /* bytes read so far */
    size_t pos, len; /* the unread part of buf */
    int eof;
    char buf[4096];
    char line[LINE_MAX_BYTES];
} line_reader;

/* The next line into r->line (without its '\n'), its length in *len.
 * Returns 1, 0 at the end of the file, or an error code. */
static int next_line(line_reader *r, size_t *len)
{
    size_t n = 0;
    int newline = 0;

    for (;;) {
        if (r->pos == r->len) {
            if (r->eof)
                break;
            ssize_t got = read(r->fd, r->buf, sizeof r->buf);
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0)
                return ferry__syserr(FERRY_EOPTION, r->path, errno);
            if (got == 0) {
                r->eof = 1;
                break;
            }
            r->total += (size_t)got;
            if (r->total > FILE_MAX_BYTES)
                return ferry__seterr(FERRY_EFORMAT,
                                     "%s: larger than 1 MiB, too large for a key file", r->path);
            r->pos = 0;
            r->len = (size_t)got;
        }
        char c = r->buf[r->pos++];
        if (c == '\n') {
            newline = 1;
            break;
        }
        if (n == sizeof r->line)
            return ferry__seterr(FERRY_EFORMAT, "%s:%u: line longer than %d bytes", r->path,
                                 r->lineno + 1, LINE_MAX_BYTES);
        r->line[n++] = c;
    }
    if (!newline && n == 0)
        return 0;
    r->lineno++;
    *len = n;
    return 1;
}

/* Reads every line of the open file fd (named path in messages), calling fn
 * for each key. *nlines gets the number of lines (for "missing line"
 * messages). Returns FERRY_OK or the first error. */
static int read_keys(int fd, const char *path, key_fn fn, void *ctx, unsigned *nlines)
{
    line_reader r = {.fd = fd, .path = path};
    size_t len = 0;
    int rc;

    while ((rc = next_line(&r, &len)) == 1) {
        key_kind kind;
        char z85[FERRY__Z85_KEY + 1];
        unsigned char key[FERRY__KEY_BYTES];
        rc = parse_line(r.line, len, path, r.lineno, &kind, z85, key);
        if (rc == 1)
            rc = fn(ctx, path, r.lineno, kind, z85, key);
        explicit_bzero(z85, sizeof z85);
        explicit_bzero(key, sizeof key);
        if (rc < 0)
            break;
    }
    if (nlines)
        *nlines = r.lineno;
    explicit_bzero(&r, sizeof r);
    return rc < 0 ? rc : FERRY_OK;
}

/* Opens path for reading. O_NONBLOCK so that a FIFO cannot block the open;
 * anything but a regular file (or a directory, if dir_ok) is refused. On
 * FERRY_OK *fd is open, and *is_dir (if given) says whether it is a
 * directory. */
static int open_key_file(const char *path, int dir_ok, int *fd, int *is_dir)
{
    struct stat st;
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    int rc = FERRY_OK;

    if (f < 0)
        return ferry__syserr(FERRY_EOPTION, path, errno);
    if (fstat(f, &st) != 0)
        rc = ferry__syserr(FERRY_EOPTION, path, errno);
    else if (S_ISDIR(st.st_mode) && !dir_ok)
        rc = ferry__seterr(FERRY_EOPTION, "%s: is a directory, not a key file", path);
    else if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        rc = ferry__seterr(FERRY_EOPTION, "%s: not a regular file", path);
    else if (S_ISREG(st.st_mode) && st.st_size > FILE_MAX_BYTES)
        rc = ferry__seterr(FERRY_EFORMAT, "%s: larger than 1 MiB, too large for a key file", path);
    if (rc != FERRY_OK) {
        close(f);
        return rc;
    }
    *fd = f;
    if (is_dir)
        *is_dir = S_ISDIR(st.st_mode);
    return FERRY_OK;
}

/* FERRY_OK if the open file fd (named path) gives group and others no
 * access at all, as a file holding a secret key must; else FERRY_EOPTION
 * with the mode and the chmod that fixes it. */
static int check_secret_mode(int fd, const char *path)
{
    struct stat st;

    if (fstat(fd, &st) != 0)
        return ferry__syserr(FERRY_EOPTION, path, errno);
    if (st.st_mode & 077)
        return ferry__seterr(FERRY_EOPTION,
                             "%s: mode %04o is too open: group or others may access this secret "
                             "key; run `chmod 600 %s`",
                             path, (unsigned)(st.st_mode & 07777), path);
    return FERRY_OK;
}

/* ------------------------------------------------------------------------
 * Key pairs and public keys
 */

typedef struct pair_ctx {
    char pub[FERRY__Z85_KEY + 1];
    char sec[FERRY__Z85_KEY + 1];
    unsigned pub_line, sec_line; /* 0: not seen */
} pair_ctx;

static int pair_key(void *ctx, const char *path, unsigned lineno, key_kind kind, const char *z85,
                    const unsigned char *key)
{
    pair_ctx *c = ctx;
    unsigned *seen = kind == KEY_SECRET ? &c->sec_line : &c->pub_line;

    if (kind == KEY_BARE)
        return ferry__seterr(FERRY_EFORMAT,
                             "%s:%u: a key without a name (a key pair file has "
                             "`public-key = KEY` and `secret-key = KEY` lines)",
                             path, lineno);
    if (*seen)
        return ferry__seterr(FERRY_EFORMAT, "%s:%u: a second %s line (the first is line %u)", path,
                             lineno, kind_name(kind), *seen);
    *seen = lineno;
    memcpy(kind == KEY_SECRET ? c->sec : c->pub, z85, FERRY__Z85_KEY + 1);
    return FERRY_OK;
}

int ferry__key_pair_load(const char *path, char pub[FERRY__Z85_KEY + 1],
                         char sec[FERRY__Z85_KEY + 1])
{
    pair_ctx c;
    char derived[FERRY__Z85_KEY + 1];
    unsigned nlines = 0;
    int fd = -1, rc;

    if (!path || !pub || !sec)
        return ferry__seterr(FERRY_EINVAL, "key pair: no file named");
    rc = open_key_file(path, 0, &fd, NULL);
    if (rc != FERRY_OK)
        return rc;
    memset(&c, 0, sizeof c);
    memset(derived, 0, sizeof derived);
    /* What the file is comes first, then its mode: a .pub file given by
     * mistake is told to be a public key, not to be made private. */
    rc = read_keys(fd, path, pair_key, &c, &nlines);
    if (rc == FERRY_OK && c.pub_line && !c.sec_line)
        rc = ferry__seterr(FERRY_EFORMAT,
                           "%s:%u: no secret-key line: this file holds a public key only (a .pub "
                           "file?); a key pair file (BASE.key from ferry-keygen) has "
                           "`public-key = KEY` and `secret-key = KEY` lines",
                           path, nlines + 1);
    else if (rc == FERRY_OK && !c.pub_line)
        rc = ferry__seterr(FERRY_EFORMAT,
                           "%s:%u: no public-key line (a key pair file has `public-key = KEY` and "
                           "`secret-key = KEY` lines)",
                           path, nlines + 1);
    if (rc == FERRY_OK)
        rc = check_secret_mode(fd, path);
    close(fd);
    if (rc != FERRY_OK)
        goto done;
    if (zmq_curve_public(derived, c.sec) != 0) {
        rc = ferry__seterr(FERRY_ESYS, "zmq_curve_public: %s", zmq_strerror(errno));
        goto done;
    }
    if (memcmp(derived, c.pub, FERRY__Z85_KEY) != 0) {
        rc = ferry__seterr(FERRY_EFORMAT,
                           "%s:%u: the public key does not belong to the secret key on line %u",
                           path, c.pub_line, c.sec_line);
        goto done;
    }
    memcpy(pub, c.pub, FERRY__Z85_KEY + 1);
    memcpy(sec, c.sec, FERRY__Z85_KEY + 1);
done:
    explicit_bzero(&c, sizeof c);
    explicit_bzero(derived, sizeof derived);
    return rc;
}

typedef struct public_ctx {
    char pub[FERRY__Z85_KEY + 1];
    unsigned line; /* 0: none yet */
} public_ctx;

static int public_key(void *ctx, const char *path, unsigned lineno, key_kind kind, const char *z85,
                      const unsigned char *key)
{
    public_ctx *c = ctx;

    if (kind == KEY_SECRET)
        return ferry__seterr(FERRY_EFORMAT,
                             "%s:%u: this file holds a secret key (a key pair file), where only a "
                             "public key belongs: pass the .pub file; the secret key must stay "
                             "on the host it belongs to (the loader's on the trainer host)",
                             path, lineno);
    if (c->line)
        return ferry__seterr(FERRY_EFORMAT,
                             "%s:%u: a second public key (the first is on line %u; a public key "
                             "file holds one)",
                             path, lineno, c->line);
    c->line = lineno;
    memcpy(c->pub, z85, FERRY__Z85_KEY + 1);
    return FERRY_OK;
}

int ferry__key_public_load(const char *path_or_z85, char pub[FERRY__Z85_KEY + 1])
{
    const char *arg = path_or_z85;
    public_ctx c = {.line = 0};
    unsigned char key[FERRY__KEY_BYTES];
    struct stat st;
    unsigned nlines = 0;
    int fd = -1, rc, is_key;

    if (!arg || !pub)
        return ferry__seterr(FERRY_EINVAL, "public key: none given");
    is_key = strlen(arg) == FERRY__Z85_KEY && z85_key_decode(arg, key) == 0;
    if (stat(arg, &st) != 0) {
        int e = errno;
        if (is_key) {
            memcpy(pub, arg, FERRY__Z85_KEY + 1);
            return FERRY_OK;
        }
        if (e == ENOENT)
            return ferry__seterr(FERRY_EOPTION,
                                 "%s: %s, and not a public key (40 Z85 characters) either", arg,
                                 strerror(e));
    }
    rc = open_key_file(arg, 0, &fd, NULL);
    if (rc != FERRY_OK)
        return rc;
    rc = read_keys(fd, arg, public_key, &c, &nlines);
    close(fd);
    if (rc == FERRY_OK && !c.line)
        rc = ferry__seterr(FERRY_EFORMAT, "%s:%u: no public key in the file", arg, nlines + 1);
    if (rc == FERRY_OK)
        memcpy(pub, c.pub, FERRY__Z85_KEY + 1);
    return rc;
}

/* ------------------------------------------------------------------------
 * Allow-lists
 */

typedef struct allow_ctx {
    ferry__allow a;
    size_t cap;
} allow_ctx;

static int allow_key(void *ctx, const char *path, unsigned lineno, key_kind kind, const char *z85,
                     const unsigned char *key)
{
    allow_ctx *c = ctx;

    if (kind == KEY_SECRET)
        return ferry__seterr(FERRY_EFORMAT,
                             "%s:%u: a secret key in an allow-list (list public keys only: the "
                             ".pub file)",
                             path, lineno);
    if (c->a.n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        void *keys = NULL;
        if (cap <= SIZE_MAX / sizeof *c->a.keys)
            keys = ferry__realloc(c->a.keys, cap * sizeof *c->a.keys);
        if (!keys)
            return ferry__seterr(FERRY_ENOMEM, "%s:%u: out of memory for the allow-list", path,
                                 lineno);
        c->a.keys = keys;
        c->cap = cap;
    }
    memcpy(c->a.keys[c->a.n++], key, FERRY__KEY_BYTES);
    return FERRY_OK;
}

static int allow_load_file(const char *path, allow_ctx *c)
{
    int fd = -1;
    int rc = open_key_file(path, 0, &fd, NULL);

    if (rc != FERRY_OK)
        return rc;
    rc = read_keys(fd, path, allow_key, c, NULL);
    close(fd);
    return rc;
}

/* Reads every *.pub file in the directory open as fd (which it closes). */
static int allow_load_dir(int fd, const char *path, allow_ctx *c)
{
    const char *sep = path[strlen(path) - 1] == '/' ? "" : "/";
    struct dirent *e;
    int rc = FERRY_OK;
    DIR *d = fdopendir(fd);

    if (!d) {
        int err = errno;
        close(fd);
        return ferry__syserr(err == ENOMEM ? FERRY_ENOMEM : FERRY_EOPTION, path, err);
    }
    for (;;) {
        char file[PATH_MAX];
        errno = 0;
        if ((e = readdir(d)) == NULL) {
            if (errno)
                rc = ferry__syserr(FERRY_EOPTION, path, errno);
            break;
        }
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 4, ".pub") != 0)
            continue;
        if (snprintf(file, sizeof file, "%s%s%s", path, sep, e->d_name) >= (int)sizeof file) {
            rc = ferry__syserr(FERRY_EOPTION, path, ENAMETOOLONG);
            break;
        }
        rc = allow_load_file(file, c);
        if (rc != FERRY_OK)
            break;
    }
    closedir(d);
    return rc;
}

int ferry__allow_load(const char *path, ferry__allow *out)
{
    allow_ctx c = {.a = {NULL, 0}, .cap = 0};
    int fd = -1, is_dir = 0, rc;

    if (!path || !*path || !out)
        return ferry__seterr(FERRY_EINVAL, "allow-list: no file named");
    rc = open_key_file(path, 1, &fd, &is_dir);
    if (rc != FERRY_OK)
        return rc;
    if (is_dir) {
        rc = allow_load_dir(fd, path, &c);
    } else {
        rc = read_keys(fd, path, allow_key, &c, NULL);
        close(fd);
    }
    if (rc == FERRY_OK && c.a.n == 0)
        rc = ferry__seterr(FERRY_EOPTION, "%s: the allow-list allows no worker (%s)", path,
                           is_dir ? "no key in any *.pub file in it" : "no key in it");
    if (rc != FERRY_OK) {
        ferry__allow_free(&c.a);
        return rc;
    }
    *out = c.a;
    return FERRY_OK;
}

int ferry__allow_has(const ferry__allow *a, const unsigned char key[FERRY__KEY_BYTES])
{
    unsigned found = 0;

    for (size_t i = 0; i < a->n; i++) {
        unsigned diff = 0;
        for (size_t j = 0; j < FERRY__KEY_BYTES; j++)
            diff |= (unsigned)(a->keys[i][j] ^ key[j]);
        /* diff is 0..255: (diff - 1) >> 8 has its low bit set only for 0,
         * with no branch on the comparison. */
        found |= 1u & ((diff - 1u) >> 8);
    }
    return (int)found;
}

void ferry__allow_free(ferry__allow *a)
{
    if (!a)
        return;
    free(a->keys);
    a->keys = NULL;
    a->n = 0;
}

/* ------------------------------------------------------------------------
 * Writing a key pair
 */

static int write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Writes text to a new file FINAL.XXXXXX with exactly `mode`, synced. On
 * FERRY_OK tmp holds its name; on failure no file is left and tmp is "". */
static int write_temp(const char *final, const char *text, mode_t mode, char tmp[PATH_MAX])
{
    char what[PATH_MAX + 16];
    int fd, e;

    snprintf(what, sizeof what, "writing %s", final);
    if (snprintf(tmp, PATH_MAX, "%s.XXXXXX", final) >= PATH_MAX) {
        tmp[0] = '\0';
        return ferry__syserr(FERRY_ESYS, what, ENAMETOOLONG);
    }
    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        e = errno;
        tmp[0] = '\0';
        return ferry__syserr(FERRY_ESYS, what, e);
    }
    if (fchmod(fd, mode) != 0 || write_all(fd, text, strlen(text)) != 0 || fsync(fd) != 0) {
        e = errno;
        close(fd);
        goto fail;
    }
    if (close(fd) != 0 && errno != EINTR) {
        e = errno;
        goto fail;
    }
    return FERRY_OK;
fail:
    unlink(tmp);
    tmp[0] = '\0';
    return ferry__syserr(FERRY_ESYS, what, e);
}

/* Gives the temporary file tmp the name final: link() when !force, which
 * fails if final exists, rename() when force. tmp is gone either way. */
static int name_file(const char *tmp, const char *final, int force)
{
    int e;

    if (force) {
        if (rename(tmp, final) == 0)
            return FERRY_OK;
        e = errno;
        unlink(tmp);
    } else {
        e = link(tmp, final) == 0 ? 0 : errno;
        unlink(tmp);
        if (e == 0)
            return FERRY_OK;
        if (e == EEXIST)
            return ferry__seterr(FERRY_EOPTION, "%s exists; use --force to replace it", final);
    }
    char what[PATH_MAX + 16];
    snprintf(what, sizeof what, "naming %s", final);
    return ferry__syserr(FERRY_ESYS, what, e);
}

int ferry__key_pair_write(const char *base, int force, char pub_out[FERRY__Z85_KEY + 1])
{
    char pub[FERRY__Z85_KEY + 1], sec[FERRY__Z85_KEY + 1], text[256];
    char key_path[PATH_MAX], pub_path[PATH_MAX], key_tmp[PATH_MAX] = "", pub_tmp[PATH_MAX] = "";
    int rc;

    if (!base || !*base || !pub_out)
        return ferry__seterr(FERRY_EINVAL, "key pair: no file name given");
    if (snprintf(key_path, sizeof key_path, "%s.key", base) >= (int)sizeof key_path ||
        snprintf(pub_path, sizeof pub_path, "%s.pub", base) >= (int)sizeof pub_path)
        return ferry__seterr(FERRY_ESYS, "%s (%zu bytes): %s", strerror(ENAMETOOLONG), strlen(base),
                             base);
    if (zmq_curve_keypair(pub, sec) != 0)
        return ferry__seterr(FERRY_ESYS, "zmq_curve_keypair: %s (libzmq without CURVE?)",
                             zmq_strerror(errno));

    snprintf(text, sizeof text,
             "# ferry CURVE key pair (ferry-keygen). Keep this file secret.\n"
             "public-key = %s\n"
             "secret-key = %s\n",
             pub, sec);
    rc = write_temp(key_path, text, 0600, key_tmp);
    explicit_bzero(text, sizeof text);
    explicit_bzero(sec, sizeof sec);
    if (rc != FERRY_OK)
        goto fail;
    snprintf(text, sizeof text,
             "# ferry CURVE public key (ferry-keygen)\n"
             "public-key = %s\n",
             pub);
    rc = write_temp(pub_path, text, 0644, pub_tmp);
    if (rc != FERRY_OK)
        goto fail;

    rc = name_file(key_tmp, key_path, force);
    key_tmp[0] = '\0';
    if (rc != FERRY_OK)
        goto fail;
    rc = name_file(pub_tmp, pub_path, force);
    pub_tmp[0] = '\0';
    if (rc != FERRY_OK) {
        unlink(key_path);
        goto fail;
    }
    memcpy(pub_out, pub, FERRY__Z85_KEY + 1);
    return FERRY_OK;
fail:
    if (key_tmp[0])
        unlink(key_tmp);
    if (pub_tmp[0])
        unlink(pub_tmp);
    return rc;
}
