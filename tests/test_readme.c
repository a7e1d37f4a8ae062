/*
 * test_readme.c - the C code README.md shows is the code that is compiled:
 * every ```c block in it is a quote of a file under examples/, announced by
 * a line `<!-- quote: PATH -->` right above it, and equal to that file to
 * the byte. The example programs themselves are built and run by ctest
 * (examples/CMakeLists.txt), so what a reader copies from the README builds
 * and works.
 *
 * No process, no loader: plain file reads under FERRY_SOURCE_DIR.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

#define QUOTE_MARK "<!-- quote: "

/* The example programs the README must quote in full. */
static const char *const quoted_examples[] = {"examples/basic_loop.c", "examples/resume.c"};

/* The whole of FERRY_SOURCE_DIR/rel, NUL-terminated; the caller frees it. */
static char *read_source(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", FERRY_SOURCE_DIR, rel);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    assert_non_null(buf);
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 == cap) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
    }
    assert_int_equal(ferror(f), 0);
    fclose(f);
    buf[len] = '\0';
    return buf;
}

/* The line after the one at p (or the end of the text). */
static const char *next_line(const char *p)
{
    const char *nl = strchr(p, '\n');
    return nl ? nl + 1 : p + strlen(p);
}

static int line_is(const char *p, const char *text)
{
    size_t n = strlen(text);
    return strncmp(p, text, n) == 0 && (p[n] == '\n' || p[n] == '\0');
}

/* Checks the block that starts at the ```c line `open` against the file
 * named by the marker line `mark`; returns the line after the block. */
static const char *check_quote(const char *mark, const char *open, unsigned line)
{
    char rel[256];
    const char *name = mark + strlen(QUOTE_MARK), *stop = strstr(name, " -->");
    if (!stop || stop > next_line(mark) || (size_t)(stop - name) >= sizeof rel)
        fail_msg("README.md:%u: the quote mark above the block is malformed", line);
    snprintf(rel, sizeof rel, "%.*s", (int)(stop - name), name);

    const char *body = next_line(open), *end = body;
    while (*end && !line_is(end, "```"))
        end = next_line(end);
    if (!*end)
        fail_msg("README.md:%u: the ```c block quoting %s never closes", line, rel);
    char *file = read_source(rel);
    size_t len = (size_t)(end - body);
    int same = strlen(file) == len && memcmp(file, body, len) == 0;
    /* Where they part: the file's line number, for the message. */
    unsigned file_line = 1;
    for (size_t i = 0; !same && i < len && file[i] == body[i]; i++)
        file_line += file[i] == '\n';
    free(file);
    if (!same)
        fail_msg("README.md:%u quotes %s, but they differ from the file's line %u on: copy the "
                 "file into the README again",
                 line, rel, file_line);
    print_message("README.md:%u quotes %s as it is\n", line, rel);
    return next_line(end);
}

static void test_readme_c_blocks_are_the_example_files_verbatim(void **state)
{
    (void)state;
    char *readme = read_source("README.md");
    int quoted[sizeof quoted_examples / sizeof quoted_examples[0]] = {0};
    const char *prev = NULL;
    unsigned line = 1;
    for (const char *p = readme; *p;) {
        if (line_is(p, "```c")) {
            if (!prev || strncmp(prev, QUOTE_MARK, strlen(QUOTE_MARK)) != 0)
                fail_msg("README.md:%u: a ```c block that quotes no file: C examples live in "
                         "examples/ (compiled and run by ctest) and the README quotes them "
                         "under a line <!-- quote: examples/NAME.c -->",
                         line);
            for (size_t i = 0; i < sizeof quoted_examples / sizeof quoted_examples[0]; i++) {
                size_t n = strlen(quoted_examples[i]);
                const char *name = prev + strlen(QUOTE_MARK);
                quoted[i] |=
                    strncmp(name, quoted_examples[i], n) == 0 && strncmp(name + n, " -->", 4) == 0;
            }
            const char *after = check_quote(prev, p, line);
            for (; p < after; p = next_line(p))
                line++;
            prev = NULL;
            continue;
        }
        prev = p;
        p = next_line(p);
        line++;
    }
    for (size_t i = 0; i < sizeof quoted_examples / sizeof quoted_examples[0]; i++) {
        if (!quoted[i])
            fail_msg("README.md does not quote %s", quoted_examples[i]);
    }
    free(readme);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_c_blocks_are_the_example_files_verbatim),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
