/*
 * test_keys.c - CURVE key files and allow-lists (transport/keys.c) and the
 * ferry-keygen program.
 *
 * Each case runs in its own child (ft_run_each: umask changes and the
 * allocation fault injector stay inside it) between ft_begin() and ft_end():
 * its files live in the private directory ft_begin() makes under /tmp, and
 * are removed before ft_end() checks that it is empty (so a stray temporary
 * file from a key write fails the case) and that no fd or child is left.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "alloc.h"
#include "ferry.h"
#include "harness.h"
#include "keys.h"

extern char **environ;

/* ------------------------------------------------------------------------
 * Helpers
 */

typedef char z85key[FERRY__Z85_KEY + 1];

static const char *path_in(const ft_snapshot *s, const char *name)
{
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", s->tmpdir, name);
    return p;
}

static void write_bytes(const char *path, mode_t mode, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(fchmod(fd, mode), 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    assert_int_equal(close(fd), 0);
}

static void write_text(const char *path, mode_t mode, const char *text)
{
    write_bytes(path, mode, text, strlen(text));
}

/* printf into a file of the given mode. */
static void write_fmt(const char *path, mode_t mode, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void write_fmt(const char *path, mode_t mode, const char *fmt, ...)
{
    char text[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof text);
    write_text(path, mode, text);
}

static void read_text(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    ssize_t n = read(fd, buf, cap - 1);
    assert_true(n >= 0);
    buf[n] = '\0';
    close(fd);
}

static unsigned file_mode(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (unsigned)(st.st_mode & 07777);
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Empties the private directory, so that ft_end() can check and remove it. */
static void clean(const ft_snapshot *s)
{
    assert_true(ft_empty_dir(s->tmpdir, "") >= 0);
}

static void new_pair(z85key pub, z85key sec)
{
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
}

static void decode(const char *z85, unsigned char key[FERRY__KEY_BYTES])
{
    assert_non_null(zmq_z85_decode(key, z85));
}

/* "PATH:LINE:", the prefix every format error starts with. */
static const char *at_line(const char *path, unsigned line)
{
    static char buf[600];
    snprintf(buf, sizeof buf, "%s:%u:", path, line);
    return buf;
}

static int pair_load_file(const char *path, mode_t mode, const char *text, z85key pub, z85key sec)
{
    write_text(path, mode, text);
    return ferry__key_pair_load(path, pub, sec);
}

/* Runs ferry-keygen with argv (argv[0] included, NULL-terminated); returns
 * its exit status with its stdout and stderr in out and err. */
static int run_keygen(char *const argv[], char *out, size_t outcap, char *err, size_t errcap)
{
    int po[2], pe[2];
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int st;

    assert_int_equal(pipe2(po, O_CLOEXEC), 0);
    assert_int_equal(pipe2(pe, O_CLOEXEC), 0);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    assert_int_equal(posix_spawn(&pid, FERRY_TEST_KEYGEN, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(po[1]);
    close(pe[1]);
    /* The outputs are a few lines: far below a pipe's capacity, so reading
     * one to its end before the other cannot block the child. */
    int fds[2] = {po[0], pe[0]};
    char *bufs[2] = {out, err};
    size_t caps[2] = {outcap, errcap};
    for (int i = 0; i < 2; i++) {
        size_t len = 0;
        ssize_t n;
        while ((n = read(fds[i], bufs[i] + len, caps[i] - 1 - len)) > 0 ||
               (n < 0 && errno == EINTR))
            len += n > 0 ? (size_t)n : 0;
        bufs[i][len] = '\0';
        close(fds[i]);
    }
    while (waitpid(pid, &st, 0) < 0)
        assert_int_equal(errno, EINTR);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* ------------------------------------------------------------------------
 * Writing and reading key pairs
 */

static void test_written_pair_loads_back_and_public_key_by_path_or_z85(void **state)
{
    ft_snapshot s;
    z85key pub, pub2, sec, derived, got;
    char text[512], want[512];

    ft_begin(&s, 30);
    const char *base = path_in(&s, "worker");
    const char *key = path_in(&s, "worker.key"), *pubf = path_in(&s, "worker.pub");
    assert_int_equal(ferry__key_pair_write(base, 0, pub), FERRY_OK);
    assert_int_equal(strlen(pub), FERRY__Z85_KEY);
    assert_int_equal(ft_count_entries(s.tmpdir), 2); /* no temporary file left */

    assert_int_equal(ferry__key_pair_load(key, pub2, sec), FERRY_OK);
    assert_string_equal(pub2, pub);
    assert_int_equal(strlen(sec), FERRY__Z85_KEY);
    assert_int_equal(zmq_curve_public(derived, sec), 0);
    assert_string_equal(derived, pub);

    /* The files are exactly the documented text. */
    read_text(key, text, sizeof text);
    snprintf(want, sizeof want,
             "# ferry CURVE key pair (ferry-keygen). Keep this file secret.\n"
             "public-key = %s\nsecret-key = %s\n",
             pub, sec);
    assert_string_equal(text, want);
    read_text(pubf, text, sizeof text);
    snprintf(want, sizeof want, "# ferry CURVE public key (ferry-keygen)\npublic-key = %s\n", pub);
    assert_string_equal(text, want);

    /* A public key from the .pub file or given as is (not from the pair
     * file: test_swapped_key_files_are_named_for_what_they_hold). */
    assert_int_equal(ferry__key_public_load(pubf, got), FERRY_OK);
    assert_string_equal(got, pub);
    memset(got, 0, sizeof got);
    assert_int_equal(ferry__key_public_load(pub, got), FERRY_OK);
    assert_string_equal(got, pub);

    /* Two calls make two different pairs. */
    assert_int_equal(ferry__key_pair_write(path_in(&s, "other"), 0, pub2), FERRY_OK);
    assert_string_not_equal(pub2, pub);
    clean(&s);
    ft_end(&s);
}

static void test_key_files_get_exact_modes_whatever_the_umask(void **state)
{
    static const mode_t masks[] = {0, 077, 022, 0777};
    ft_snapshot s;
    z85key pub, pub2, sec;

    ft_begin(&s, 30);
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        mode_t old = umask(masks[i]);
        int rc = ferry__key_pair_write(path_in(&s, "k"), 1, pub);
        umask(old);
        assert_int_equal(rc, FERRY_OK);
        assert_int_equal(file_mode(path_in(&s, "k.key")), 0600);
        assert_int_equal(file_mode(path_in(&s, "k.pub")), 0644);
        assert_int_equal(ferry__key_pair_load(path_in(&s, "k.key"), pub2, sec), FERRY_OK);
        assert_string_equal(pub2, pub);
    }
    assert_int_equal(ft_count_entries(s.tmpdir), 2);
    clean(&s);
    ft_end(&s);
}

static void test_existing_files_are_refused_without_force_and_replaced_with_force(void **state)
{
    ft_snapshot s;
    z85key pub, pub2, sec, out;
    char before[512], after[512];

    ft_begin(&s, 30);
    const char *base = path_in(&s, "w");
    const char *key = path_in(&s, "w.key"), *pubf = path_in(&s, "w.pub");
    assert_int_equal(ferry__key_pair_write(base, 0, pub), FERRY_OK);
    read_text(key, before, sizeof before);

    /* Both exist: refused, nothing changed, the caller's buffer untouched. */
    memset(out, 'x', sizeof out);
    FT_EXPECT_ERROR(ferry__key_pair_write(base, 0, out), FERRY_EOPTION, key, "--force", NULL);
    assert_int_equal(out[0], 'x');
    read_text(key, after, sizeof after);
    assert_string_equal(after, before);
    assert_int_equal(ft_count_entries(s.tmpdir), 2);

    /* Only the .pub exists: refused, and the .key it had made is gone again. */
    assert_int_equal(unlink(key), 0);
    FT_EXPECT_ERROR(ferry__key_pair_write(base, 0, out), FERRY_EOPTION, pubf, "--force", NULL);
    assert_false(exists(key));
    assert_int_equal(ft_count_entries(s.tmpdir), 1);

    /* Only the .key exists: refused as well, the .key kept as it was. */
    assert_int_equal(unlink(pubf), 0);
    write_text(key, 0600, before);
    FT_EXPECT_ERROR(ferry__key_pair_write(base, 0, out), FERRY_EOPTION, key, NULL);
    assert_false(exists(pubf));
    read_text(key, after, sizeof after);
    assert_string_equal(after, before);

    /* With force: a new pair replaces the old one, both files agree. */
    assert_int_equal(ferry__key_pair_write(base, 1, out), FERRY_OK);
    assert_string_not_equal(out, pub);
    assert_int_equal(ferry__key_pair_load(key, pub2, sec), FERRY_OK);
    assert_string_equal(pub2, out);
    assert_int_equal(ferry__key_public_load(pubf, pub2), FERRY_OK);
    assert_string_equal(pub2, out);
    assert_int_equal(file_mode(key), 0600);
    assert_int_equal(ft_count_entries(s.tmpdir), 2);
    clean(&s);
    ft_end(&s);
}

static void test_failed_write_leaves_no_file(void **state)
{
    ft_snapshot s;
    z85key out;
    char base[5000];

    ft_begin(&s, 30);
    /* A directory that does not exist. */
    FT_EXPECT_ERROR(ferry__key_pair_write(path_in(&s, "nodir/w"), 0, out), FERRY_ESYS,
                    "No such file or directory", NULL);
    /* A name too long for any file. */
    memset(base, 'a', sizeof base - 1);
    base[sizeof base - 1] = '\0';
    FT_EXPECT_ERROR(ferry__key_pair_write(base, 0, out), FERRY_ESYS, "File name too long", NULL);
    /* BASE.pub is a directory: even with force it cannot be replaced, and
     * the BASE.key already named is removed again. */
    assert_int_equal(mkdir(path_in(&s, "w.pub"), 0755), 0);
    FT_EXPECT_ERROR(ferry__key_pair_write(path_in(&s, "w"), 1, out), FERRY_ESYS, "w.pub", NULL);
    assert_false(exists(path_in(&s, "w.key")));
    assert_int_equal(ft_count_entries(s.tmpdir), 1);
    FT_EXPECT_ERROR(ferry__key_pair_write(path_in(&s, "w"), 0, out), FERRY_EOPTION, "--force",
                    NULL);
    assert_int_equal(ft_count_entries(s.tmpdir), 1);
    clean(&s);
    ft_end(&s);
}

static void test_pair_file_open_to_group_or_others_is_refused_with_chmod_hint(void **state)
{
    static const mode_t bad[] = {0640, 0604, 0620, 0602, 0660, 0644, 0610};
    ft_snapshot s;
    z85key pub, pub2, sec;
    char mode[16], hint[600];

    ft_begin(&s, 30);
    const char *key = path_in(&s, "w.key");
    assert_int_equal(ferry__key_pair_write(path_in(&s, "w"), 0, pub), FERRY_OK);
    snprintf(hint, sizeof hint, "chmod 600 %s", key);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(chmod(key, bad[i]), 0);
        snprintf(mode, sizeof mode, "%04o", (unsigned)bad[i]);
        memset(pub2, 'x', sizeof pub2);
        memset(sec, 'x', sizeof sec);
        FT_EXPECT_ERROR(ferry__key_pair_load(key, pub2, sec), FERRY_EOPTION, key, mode, hint, NULL);
        assert_int_equal(pub2[0], 'x');
        assert_int_equal(sec[0], 'x');
    }
    assert_int_equal(chmod(key, 0400), 0);
    assert_int_equal(ferry__key_pair_load(key, pub2, sec), FERRY_OK);
    assert_int_equal(chmod(key, 0600), 0);
    assert_int_equal(ferry__key_pair_load(key, pub2, sec), FERRY_OK);
    assert_string_equal(pub2, pub);
    clean(&s);
    ft_end(&s);
}

/* The two files of a pair given the wrong way round: a .pub file where the
 * key pair belongs is said to hold a public key only (not told to be
 * chmod-ed, whatever its mode), and a key pair file where a public key
 * belongs is refused, saying it holds a secret key and to pass the .pub. */
static void test_swapped_key_files_are_named_for_what_they_hold(void **state)
{
    ft_snapshot s;
    z85key pub, pub2, sec;

    ft_begin(&s, 30);
    const char *key = path_in(&s, "w.key"), *pubf = path_in(&s, "w.pub");
    assert_int_equal(ferry__key_pair_write(path_in(&s, "w"), 0, pub), FERRY_OK);

    memset(pub2, 'x', sizeof pub2);
    memset(sec, 'x', sizeof sec);
    FT_EXPECT_ERROR(ferry__key_pair_load(pubf, pub2, sec), FERRY_EFORMAT, at_line(pubf, 3),
                    "no secret-key line", "public key only", NULL);
    assert_null(strstr(ferry_last_error(), "chmod"));
    assert_int_equal(pub2[0], 'x');
    assert_int_equal(sec[0], 'x');

    static const mode_t modes[] = {0600, 0644};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        assert_int_equal(chmod(key, modes[i]), 0);
        FT_EXPECT_ERROR(ferry__key_public_load(key, pub2), FERRY_EFORMAT, at_line(key, 3),
                        "holds a secret key", "pass the .pub file", NULL);
        assert_int_equal(pub2[0], 'x');
    }
    clean(&s);
    ft_end(&s);
}

static void test_malformed_pair_files_are_eformat_naming_path_and_line(void **state)
{
    ft_snapshot s;
    z85key pub, sec, pub2, sec2, bad, out_pub, out_sec;
    char text[4096];

    ft_begin(&s, 30);
    new_pair(pub, sec);
    new_pair(pub2, sec2);
    const char *f = path_in(&s, "bad.key");
    const char *head = "# ferry CURVE key pair\n";
#define CHECK(text_, line_, detail_)                                                               \
    do {                                                                                           \
        memset(out_pub, 'x', sizeof out_pub);                                                      \
        int rc_ = pair_load_file(f, 0600, (text_), out_pub, out_sec);                              \
        FT_EXPECT_ERROR(rc_, FERRY_EFORMAT, at_line(f, (line_)), (detail_), NULL);                 \
        assert_int_equal(out_pub[0], 'x');                                                         \
        /* The message never shows the secret key. */                                              \
        assert_null(strstr(ferry_last_error(), sec));                                              \
    } while (0)

    /* A character that is not Z85 in the secret key. */
    memcpy(bad, sec, sizeof bad);
    bad[7] = '~';
    snprintf(text, sizeof text, "%spublic-key = %s\nsecret-key = %s\n", head, pub, bad);
    CHECK(text, 3, "secret-key is not valid Z85");
    /* Z85 characters, but a group past 32 bits ('#' first is always too big). */
    memcpy(bad, pub, sizeof bad);
    bad[0] = '#';
    snprintf(text, sizeof text, "%spublic-key = %s\nsecret-key = %s\n", head, bad, sec);
    CHECK(text, 2, "public-key is not valid Z85");
    /* A NUL byte inside the key. */
    snprintf(text, sizeof text, "%spublic-key = %s\nsecret-key = %s\n", head, pub, sec);
    size_t total = strlen(text);
    text[strlen(head) + strlen("public-key = ") + 7] = '\0';
    write_bytes(f, 0600, text, total);
    FT_EXPECT_ERROR(ferry__key_pair_load(f, out_pub, out_sec), FERRY_EFORMAT, at_line(f, 2), NULL);
    /* The public key of another pair. */
    snprintf(text, sizeof text, "%spublic-key = %s\nsecret-key = %s\n", head, pub2, sec);
    CHECK(text, 2, "does not belong to the secret key on line 3");
    /* Lines missing. */
    snprintf(text, sizeof text, "%spublic-key = %s\n", head, pub);
    CHECK(text, 3, "no secret-key line");
    snprintf(text, sizeof text, "%spublic-key = %s", head, pub);
    CHECK(text, 3, "no secret-key line");
    snprintf(text, sizeof text, "%ssecret-key = %s\n\n", head, sec);
    CHECK(text, 4, "no public-key line");
    CHECK("", 1, "no public-key line");
    /* Lines twice, or without a name. */
    snprintf(text, sizeof text, "%spublic-key = %s\npublic-key = %s\nsecret-key = %s\n", head, pub,
             pub, sec);
    CHECK(text, 3, "second public-key line (the first is line 2)");
    snprintf(text, sizeof text, "%s%s\nsecret-key = %s\n", head, pub, sec);
    CHECK(text, 2, "without a name");
    /* Wrong lengths, extra text, lines that are no key at all. */
    snprintf(text, sizeof text, "%spublic-key = %.39s\nsecret-key = %s\n", head, pub, sec);
    CHECK(text, 2, "39 characters");
    snprintf(text, sizeof text, "%spublic-key = %sA\nsecret-key = %s\n", head, pub, sec);
    CHECK(text, 2, "41 characters");
    snprintf(text, sizeof text, "%spublic-key = %s\nsecret-key = %s extra\n", head, pub, sec);
    CHECK(text, 3, "unexpected text after the secret-key");
    snprintf(text, sizeof text, "%spublic-key =\nsecret-key = %s\n", head, sec);
    CHECK(text, 2, "0 characters");
    snprintf(text, sizeof text, "%spublic-key = %s\nsecret-key: %s\n", head, pub, sec);
    CHECK(text, 3, "not a key line");
    snprintf(text, sizeof text, "%spublic-key = %s\n[keys]\nsecret-key = %s\n", head, pub, sec);
    CHECK(text, 3, "not a key line");
    /* A line over 1 KiB, even a comment. */
    int n = snprintf(text, sizeof text, "%spublic-key = %s\n#", head, pub);
    memset(text + n, 'c', 1100);
    snprintf(text + n + 1100, sizeof text - (size_t)n - 1100, "\nsecret-key = %s\n", sec);
    CHECK(text, 3, "longer than 1024 bytes");
#undef CHECK

    /* A file over 1 MiB. */
    int fd = open(f, O_WRONLY | O_TRUNC | O_CLOEXEC);
    assert_true(fd >= 0);
    memset(text, '#', sizeof text);
    for (size_t i = 63; i < sizeof text; i += 64)
        text[i] = '\n';
    for (int i = 0; i < 257; i++)
        assert_int_equal(write(fd, text, sizeof text), (ssize_t)sizeof text);
    close(fd);
    FT_EXPECT_ERROR(ferry__key_pair_load(f, out_pub, out_sec), FERRY_EFORMAT, f,
                    "larger than 1 MiB", NULL);
    FT_EXPECT_ERROR(ferry__key_public_load(f, out_pub), FERRY_EFORMAT, "larger than 1 MiB", NULL);
    clean(&s);
    ft_end(&s);
}

static void test_pair_parser_tolerates_spaces_crlf_comments_and_no_final_newline(void **state)
{
    ft_snapshot s;
    z85key pub, sec, got_pub, got_sec;
    char text[1024];

    ft_begin(&s, 30);
    new_pair(pub, sec);
    const char *f = path_in(&s, "ok.key");

    snprintf(text, sizeof text,
             "\r\n   # a comment, indented\r\n\r\n\tpublic-key=%s\r\n"
             "secret-key   =\t %s   # trailing comment",
             pub, sec);
    assert_int_equal(pair_load_file(f, 0600, text, got_pub, got_sec), FERRY_OK);
    assert_string_equal(got_pub, pub);
    assert_string_equal(got_sec, sec);

    /* A comment glued to the key: '#' is Z85, but a key ends at 40. */
    snprintf(text, sizeof text, "secret-key = %s#comment\npublic-key = %s#\n", sec, pub);
    memset(got_pub, 0, sizeof got_pub);
    assert_int_equal(pair_load_file(f, 0600, text, got_pub, got_sec), FERRY_OK);
    assert_string_equal(got_pub, pub);
    assert_string_equal(got_sec, sec);
    clean(&s);
    ft_end(&s);
}

static void test_missing_or_wrong_kind_of_file_is_eoption_with_reason(void **state)
{
    ft_snapshot s;
    z85key pub, sec;
    ferry__allow a = {NULL, 0};

    ft_begin(&s, 30);
    const char *none = path_in(&s, "none.key");
    FT_EXPECT_ERROR(ferry__key_pair_load(none, pub, sec), FERRY_EOPTION, none,
                    "No such file or directory", NULL);
    FT_EXPECT_ERROR(ferry__key_public_load(none, pub), FERRY_EOPTION, none,
                    "No such file or directory", "not a public key", NULL);
    FT_EXPECT_ERROR(ferry__allow_load(none, &a), FERRY_EOPTION, none, "No such file or directory",
                    NULL);
    assert_null(a.keys);

    /* A directory where a key file belongs. */
    assert_int_equal(mkdir(path_in(&s, "d.key"), 0700), 0);
    FT_EXPECT_ERROR(ferry__key_pair_load(path_in(&s, "d.key"), pub, sec), FERRY_EOPTION,
                    "is a directory", NULL);
    FT_EXPECT_ERROR(ferry__key_public_load(path_in(&s, "d.key"), pub), FERRY_EOPTION,
                    "is a directory", NULL);

    /* A FIFO is refused at once instead of blocking the open. */
    const char *fifo = path_in(&s, "fifo.key");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    FT_EXPECT_ERROR(ferry__key_pair_load(fifo, pub, sec), FERRY_EOPTION, fifo, "not a regular file",
                    NULL);
    FT_EXPECT_ERROR(ferry__allow_load(fifo, &a), FERRY_EOPTION, "not a regular file", NULL);

    /* Unreadable (root reads anything, so only checked as another user). */
    if (geteuid() != 0) {
        const char *key = path_in(&s, "locked.key");
        write_text(key, 0200, "");
        FT_EXPECT_ERROR(ferry__key_pair_load(key, pub, sec), FERRY_EOPTION, key,
                        "Permission denied", NULL);
    }
    clean(&s);
    ft_end(&s);
}

static void test_public_key_is_z85_text_or_a_file_holding_one(void **state)
{
    ft_snapshot s;
    z85key pub, pub2, sec, got;
    char text[512], cwd[4096];

    ft_begin(&s, 30);
    new_pair(pub, sec);
    new_pair(pub2, sec);

    /* Not a key and not a file. */
    memcpy(got, "unchanged", 10);
    FT_EXPECT_ERROR(ferry__key_public_load("tooshort", got), FERRY_EOPTION, "tooshort",
                    "not a public key (40 Z85 characters)", NULL);
    snprintf(text, sizeof text, "%.39s~", pub);
    FT_EXPECT_ERROR(ferry__key_public_load(text, got), FERRY_EOPTION, "not a public key", NULL);
    assert_string_equal(got, "unchanged");

    /* A file with bare key, or named key, and comments. */
    const char *f = path_in(&s, "a.pub");
    write_fmt(f, 0644, "# loader key\n\n  %s  # the loader\n", pub);
    assert_int_equal(ferry__key_public_load(f, got), FERRY_OK);
    assert_string_equal(got, pub);

    /* Two keys, no key, a secret key only. */
    write_fmt(f, 0644, "public-key = %s\n\n%s\n", pub, pub2);
    FT_EXPECT_ERROR(ferry__key_public_load(f, got), FERRY_EFORMAT, at_line(f, 3),
                    "a second public key (the first is on line 1", NULL);
    write_fmt(f, 0644, "# nothing here\n");
    FT_EXPECT_ERROR(ferry__key_public_load(f, got), FERRY_EFORMAT, at_line(f, 2), "no public key",
                    NULL);
    write_fmt(f, 0600, "secret-key = %s\n", sec);
    FT_EXPECT_ERROR(ferry__key_public_load(f, got), FERRY_EFORMAT, at_line(f, 1),
                    "holds a secret key", NULL);
    assert_string_equal(got, pub);

    /* A file whose name is a valid key is read as a file. */
    while (strchr(pub2, '/'))
        new_pair(pub2, sec);
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(s.tmpdir), 0);
    write_fmt(pub2, 0644, "public-key = %s\n", pub);
    assert_int_equal(ferry__key_public_load(pub2, got), FERRY_OK);
    assert_string_equal(got, pub);
    assert_int_equal(unlink(pub2), 0);
    assert_int_equal(ferry__key_public_load(pub2, got), FERRY_OK);
    assert_string_equal(got, pub2);
    assert_int_equal(chdir(cwd), 0);
    clean(&s);
    ft_end(&s);
}

/* ------------------------------------------------------------------------
 * Allow-lists
 */

static void test_allow_list_file_reads_comments_bare_and_named_keys_and_crlf(void **state)
{
    ft_snapshot s;
    z85key k[5], sec;
    unsigned char raw[FERRY__KEY_BYTES];
    ferry__allow a = {NULL, 0};

    ft_begin(&s, 30);
    for (int i = 0; i < 5; i++)
        new_pair(k[i], sec);
    const char *f = path_in(&s, "allow");
    write_fmt(f, 0644,
              "# workers allowed to join\r\n"
              "\r\n"
              "%s\r\n"
              "public-key = %s  # gpu box 1\r\n"
              "   %s# glued comment\n"
              "\t# indented comment\n"
              "%s\n" /* a duplicate */
              "public-key=%s",
              k[0], k[1], k[2], k[0], k[3]);
    assert_int_equal(ferry__allow_load(f, &a), FERRY_OK);
    assert_int_equal(a.n, 5);
    for (int i = 0; i < 4; i++) {
        decode(k[i], raw);
        assert_true(ferry__allow_has(&a, raw));
    }
    decode(k[4], raw);
    assert_false(ferry__allow_has(&a, raw));
    ferry__allow_free(&a);
    assert_null(a.keys);
    assert_int_equal(a.n, 0);
    ferry__allow_free(&a); /* twice is harmless */
    clean(&s);
    ft_end(&s);
}

static void test_allow_list_bad_lines_name_path_and_line(void **state)
{
    ft_snapshot s;
    z85key k, sec;
    unsigned char sentinel[1][FERRY__KEY_BYTES];
    ferry__allow a = {sentinel, 7};

    ft_begin(&s, 30);
    new_pair(k, sec);
    const char *f = path_in(&s, "allow");

    write_fmt(f, 0644, "%s\nworker-7\n", k);
    FT_EXPECT_ERROR(ferry__allow_load(f, &a), FERRY_EFORMAT, at_line(f, 2), "not a key line", NULL);
    write_fmt(f, 0644, "# keys\n%s\nsecret-key = %s\n", k, sec);
    FT_EXPECT_ERROR(ferry__allow_load(f, &a), FERRY_EFORMAT, at_line(f, 3), "secret key", NULL);
    assert_null(strstr(ferry_last_error(), sec));
    write_fmt(f, 0644, "%s %s\n", k, k);
    FT_EXPECT_ERROR(ferry__allow_load(f, &a), FERRY_EFORMAT, at_line(f, 1), NULL);
    write_fmt(f, 0644, "\n\npublic-key = %.30s\n", k);
    FT_EXPECT_ERROR(ferry__allow_load(f, &a), FERRY_EFORMAT, at_line(f, 3), "30 characters", NULL);
    /* A failed load leaves *out as it was. */
    assert_ptr_equal(a.keys, sentinel);
    assert_int_equal(a.n, 7);
    clean(&s);
    ft_end(&s);
}

static void test_allow_list_directory_reads_only_its_pub_files(void **state)
{
    ft_snapshot s;
    z85key wa, wb1, wb2, sub, other, sec;
    unsigned char raw[FERRY__KEY_BYTES];
    ferry__allow a = {NULL, 0};
    char dir_slash[600];

    ft_begin(&s, 30);
    const char *dir = path_in(&s, "workers");
    assert_int_equal(mkdir(dir, 0755), 0);
    /* ferry-keygen's output: the .key beside the .pub must be ignored. */
    assert_int_equal(ferry__key_pair_write(path_in(&s, "workers/a"), 0, wa), FERRY_OK);
    new_pair(wb1, sec);
    new_pair(wb2, sec);
    new_pair(sub, sec);
    new_pair(other, sec);
    write_fmt(path_in(&s, "workers/b.pub"), 0644, "%s\n%s\n", wb1, wb2);
    write_fmt(path_in(&s, "workers/notes.txt"), 0644, "not keys at all\n");
    write_fmt(path_in(&s, "workers/b.pub.bak"), 0644, "junk\n");
    write_fmt(path_in(&s, "workers/pub"), 0644, "%s\n", other);
    assert_int_equal(mkdir(path_in(&s, "workers/sub"), 0755), 0);
    write_fmt(path_in(&s, "workers/sub/s.pub"), 0644, "%s\n", sub);

    snprintf(dir_slash, sizeof dir_slash, "%s/", dir);
    const char *paths[] = {dir, dir_slash};
    for (int p = 0; p < 2; p++) {
        assert_int_equal(ferry__allow_load(paths[p], &a), FERRY_OK);
        assert_int_equal(a.n, 3);
        const char *in[] = {wa, wb1, wb2}, *out[] = {sub, other};
        for (int i = 0; i < 3; i++) {
            decode(in[i], raw);
            assert_true(ferry__allow_has(&a, raw));
        }
        for (int i = 0; i < 2; i++) {
            decode(out[i], raw);
            assert_false(ferry__allow_has(&a, raw));
        }
        ferry__allow_free(&a);
    }

    /* A bad .pub in it is named with its line. */
    const char *badf = path_in(&s, "workers/bad.pub");
    write_fmt(badf, 0644, "# ok\n%s\nnope\n", other);
    FT_EXPECT_ERROR(ferry__allow_load(dir, &a), FERRY_EFORMAT, at_line(badf, 3), NULL);
    assert_null(a.keys);
    clean(&s);
    ft_end(&s);
}

static void test_empty_allow_list_allows_no_worker(void **state)
{
    ft_snapshot s;
    ferry__allow a = {NULL, 0};
    z85key pub;

    ft_begin(&s, 30);
    const char *f = path_in(&s, "allow");
    write_text(f, 0644, "");
    FT_EXPECT_ERROR(ferry__allow_load(f, &a), FERRY_EOPTION, f, "allows no worker", NULL);
    write_text(f, 0644, "# nobody yet\n\n   \n");
    FT_EXPECT_ERROR(ferry__allow_load(f, &a), FERRY_EOPTION, "allows no worker", NULL);

    const char *dir = path_in(&s, "workers");
    assert_int_equal(mkdir(dir, 0755), 0);
    FT_EXPECT_ERROR(ferry__allow_load(dir, &a), FERRY_EOPTION, dir, "allows no worker", NULL);
    /* Only a key pair's secret half and other files: still nobody. */
    assert_int_equal(ferry__key_pair_write(path_in(&s, "workers/w"), 0, pub), FERRY_OK);
    assert_int_equal(unlink(path_in(&s, "workers/w.pub")), 0);
    write_text(path_in(&s, "workers/README"), 0644, "keys go here\n");
    write_text(path_in(&s, "workers/empty.pub"), 0644, "# placeholder\n");
    FT_EXPECT_ERROR(ferry__allow_load(dir, &a), FERRY_EOPTION, "allows no worker", NULL);
    assert_null(a.keys);
    clean(&s);
    ft_end(&s);
}

static void test_allow_has_is_true_only_for_listed_keys(void **state)
{
    enum { N = 20 };
    ft_snapshot s;
    z85key k[N], sec, other;
    char text[N * 64];
    unsigned char raw[FERRY__KEY_BYTES];
    ferry__allow a = {NULL, 0};
    size_t len = 0;

    ft_begin(&s, 30);
    for (int i = 0; i < N; i++) {
        new_pair(k[i], sec);
        len += (size_t)snprintf(text + len, sizeof text - len, "%s\n", k[i]);
    }
    write_text(path_in(&s, "allow"), 0644, text);
    assert_int_equal(ferry__allow_load(path_in(&s, "allow"), &a), FERRY_OK);
    assert_int_equal(a.n, N);
    for (int i = 0; i < N; i++) {
        decode(k[i], raw);
        assert_int_equal(ferry__allow_has(&a, raw), 1);
        /* One bit off, anywhere, is another key. */
        for (size_t b = 0; b < FERRY__KEY_BYTES; b += 31) {
            raw[b] ^= 0x80;
            assert_int_equal(ferry__allow_has(&a, raw), 0);
            raw[b] ^= 0x80;
        }
    }
    new_pair(other, sec);
    decode(other, raw);
    assert_int_equal(ferry__allow_has(&a, raw), 0);
    memset(raw, 0, sizeof raw);
    assert_int_equal(ferry__allow_has(&a, raw), 0);
    ferry__allow_free(&a);
    /* An empty list has nobody on it. */
    assert_int_equal(ferry__allow_has(&a, raw), 0);
    clean(&s);
    ft_end(&s);
}

/* Every allocation allow_load makes is made to fail in turn, for a file and
 * for a directory: FERRY_ENOMEM, *out untouched, nothing held (ASan checks
 * memory, ft_end the fds of the directory stream). */
static void test_allow_load_fails_cleanly_when_any_allocation_fails(void **state)
{
    enum { FILES = 5, PER_FILE = 10 };
    ft_snapshot s;
    z85key k, sec;
    char text[PER_FILE * 64];

    ft_begin(&s, 60);
    const char *dir = path_in(&s, "workers");
    assert_int_equal(mkdir(dir, 0755), 0);
    for (int f = 0; f < FILES; f++) {
        size_t len = 0;
        for (int i = 0; i < PER_FILE; i++) {
            new_pair(k, sec);
            len += (size_t)snprintf(text + len, sizeof text - len, "public-key = %s\n", k);
        }
        char name[32];
        snprintf(name, sizeof name, "workers/w%d.pub", f);
        write_text(path_in(&s, name), 0644, text);
    }
    write_text(path_in(&s, "one"), 0644, text);

    const char *paths[] = {dir, path_in(&s, "one")};
    const size_t want[] = {FILES * PER_FILE, PER_FILE};
    for (int p = 0; p < 2; p++) {
        int reached_end = 0;
        uint64_t k_fail;
        for (k_fail = 1; k_fail < 100 && !reached_end; k_fail++) {
            unsigned char sentinel[1][FERRY__KEY_BYTES];
            ferry__allow a = {sentinel, 3};
            int nfds = ft_count_fds();
            ferry__alloc_fail_at(k_fail);
            int rc = ferry__allow_load(paths[p], &a);
            int fired = ferry__alloc_failed();
            ferry__alloc_fail_at(0);
            assert_int_equal(ft_count_fds(), nfds);
            if (rc == FERRY_OK) {
                reached_end = !fired;
                assert_int_equal(a.n, want[p]);
                ferry__allow_free(&a);
            } else {
                assert_true(fired);
                FT_EXPECT_ERROR(rc, FERRY_ENOMEM, "out of memory", NULL);
                assert_ptr_equal(a.keys, sentinel);
                assert_int_equal(a.n, 3);
            }
        }
        assert_true(reached_end);
        assert_true(k_fail > 2); /* some allocation did fail on the way */
    }
    clean(&s);
    ft_end(&s);
}

/* ------------------------------------------------------------------------
 * The ferry-keygen program
 */

static void test_keygen_program_writes_files_and_prints_a_loadable_key(void **state)
{
    ft_snapshot s;
    char out[1024], err[2048], line[128];
    z85key pub, pub2, sec, printed;

    ft_begin(&s, 60);
    char base[600];
    snprintf(base, sizeof base, "%s/loader", s.tmpdir);
    const char *key = path_in(&s, "loader.key"), *pubf = path_in(&s, "loader.pub");

    char *gen[] = {"ferry-keygen", base, NULL};
    assert_int_equal(run_keygen(gen, out, sizeof out, err, sizeof err), 0);
    assert_int_equal(strlen(out), strlen("public-key = ") + FERRY__Z85_KEY + 1);
    assert_int_equal(sscanf(out, "public-key = %40s", printed), 1);
    assert_int_equal(ferry__key_public_load(pubf, pub), FERRY_OK);
    assert_string_equal(printed, pub);
    assert_int_equal(ferry__key_public_load(printed, pub2), FERRY_OK);
    assert_int_equal(ferry__key_pair_load(key, pub2, sec), FERRY_OK);
    assert_string_equal(pub2, printed);
    assert_int_equal(file_mode(key), 0600);
    assert_int_equal(file_mode(pubf), 0644);
    assert_non_null(strstr(err, pubf));
    assert_non_null(strstr(err, "allow-list"));
    assert_non_null(strstr(err, "--server-key"));

    /* Again: refused without --force (exit 1, says why), replaced with it. */
    assert_int_equal(run_keygen(gen, out, sizeof out, err, sizeof err), 1);
    assert_string_equal(out, "");
    assert_non_null(strstr(err, "--force"));
    char *force[] = {"ferry-keygen", "--force", base, NULL};
    assert_int_equal(run_keygen(force, out, sizeof out, err, sizeof err), 0);
    assert_int_equal(ferry__key_pair_load(key, pub2, sec), FERRY_OK);
    assert_string_not_equal(pub2, printed);
    snprintf(line, sizeof line, "public-key = %s\n", pub2);
    assert_string_equal(out, line);

    /* Usage errors exit 2; --help and --version exit 0. */
    char *none[] = {"ferry-keygen", NULL};
    char *bogus[] = {"ferry-keygen", "--bogus", base, NULL};
    char *two[] = {"ferry-keygen", base, base, NULL};
    char *empty[] = {"ferry-keygen", "", NULL};
    char *help[] = {"ferry-keygen", "--help", NULL};
    char *version[] = {"ferry-keygen", "--version", NULL};
    assert_int_equal(run_keygen(none, out, sizeof out, err, sizeof err), 2);
    assert_non_null(strstr(err, "usage"));
    assert_int_equal(run_keygen(bogus, out, sizeof out, err, sizeof err), 2);
    assert_non_null(strstr(err, "--bogus"));
    assert_int_equal(run_keygen(two, out, sizeof out, err, sizeof err), 2);
    assert_int_equal(run_keygen(empty, out, sizeof out, err, sizeof err), 2);
    assert_int_equal(run_keygen(help, out, sizeof out, err, sizeof err), 0);
    assert_non_null(strstr(out, "usage: ferry-keygen"));
    assert_int_equal(run_keygen(version, out, sizeof out, err, sizeof err), 0);
    assert_non_null(strstr(out, ferry_version()));
    /* An error from the library: exit 1 with its message. */
    char nodir[600];
    snprintf(nodir, sizeof nodir, "%s/nodir/w", s.tmpdir);
    char *fails[] = {"ferry-keygen", nodir, NULL};
    assert_int_equal(run_keygen(fails, out, sizeof out, err, sizeof err), 1);
    assert_non_null(strstr(err, "No such file or directory"));
    assert_int_equal(ft_count_entries(s.tmpdir), 2);
    clean(&s);
    ft_end(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_written_pair_loads_back_and_public_key_by_path_or_z85),
        cmocka_unit_test(test_key_files_get_exact_modes_whatever_the_umask),
        cmocka_unit_test(test_existing_files_are_refused_without_force_and_replaced_with_force),
        cmocka_unit_test(test_failed_write_leaves_no_file),
        cmocka_unit_test(test_pair_file_open_to_group_or_others_is_refused_with_chmod_hint),
        cmocka_unit_test(test_swapped_key_files_are_named_for_what_they_hold),
        cmocka_unit_test(test_malformed_pair_files_are_eformat_naming_path_and_line),
        cmocka_unit_test(test_pair_parser_tolerates_spaces_crlf_comments_and_no_final_newline),
        cmocka_unit_test(test_missing_or_wrong_kind_of_file_is_eoption_with_reason),
        cmocka_unit_test(test_public_key_is_z85_text_or_a_file_holding_one),
        cmocka_unit_test(test_allow_list_file_reads_comments_bare_and_named_keys_and_crlf),
        cmocka_unit_test(test_allow_list_bad_lines_name_path_and_line),
        cmocka_unit_test(test_allow_list_directory_reads_only_its_pub_files),
        cmocka_unit_test(test_empty_allow_list_allows_no_worker),
        cmocka_unit_test(test_allow_has_is_true_only_for_listed_keys),
        cmocka_unit_test(test_allow_load_fails_cleanly_when_any_allocation_fails),
        cmocka_unit_test(test_keygen_program_writes_files_and_prints_a_loadable_key),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
