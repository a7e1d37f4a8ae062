/*
 * test_readme.c - the C code the README and docs/c-api.md show is the code
 * that is compiled: every ```c block in them is a quote of a file under
 * examples/, announced by a line `<!-- quote: PATH -->` right above it, and
 * equal to that file to the byte. The example programs themselves are
 * built and run by ctest (examples/CMakeLists.txt), so what a reader copies
 * from the docs builds and works. And the README's first screen says what
 * a newcomer does first: the two set-up commands (the test one is the
 * command CI runs) and the one-import switch from torch.
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

/* The documents whose ```c blocks must all be quotes, and the example
 * programs each must quote in full (NULL-terminated). */
static const struct quoting_doc {
    const char *doc;
    const char *must_quote[3];
} quoting_docs[] = {
    {"README.md", {NULL}},
    {"docs/c-api.md", {"examples/basic_loop.c", "examples/resume.c", NULL}},
};

/* The lines a reader sees before scrolling: where the README's set-up
 * commands and the torch switch must be. */
#define FIRST_SCREEN_LINES 50

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

/* Checks the block of `doc` that starts at the ```c line `open` against
 * the file named by the marker line `mark`; returns the line after the
 * block. */
static const char *check_quote(const char *doc, const char *mark, const char *open, unsigned line)
{
    char rel[256];
    const char *name = mark + strlen(QUOTE_MARK), *stop = strstr(name, " -->");
    if (!stop || stop > next_line(mark) || (size_t)(stop - name) >= sizeof rel)
        fail_msg("%s:%u: the quote mark above the block is malformed", doc, line);
    snprintf(rel, sizeof rel, "%.*s", (int)(stop - name), name);

    const char *body = next_line(open), *end = body;
    while (*end && !line_is(end, "```"))
        end = next_line(end);
    if (!*end)
        fail_msg("%s:%u: the ```c block quoting %s never closes", doc, line, rel);
    char *file = read_source(rel);
    size_t len = (size_t)(end - body);
    int same = strlen(file) == len && memcmp(file, body, len) == 0;
    /* Where they part: the file's line number, for the message. */
    unsigned file_line = 1;
    for (size_t i = 0; !same && i < len && file[i] == body[i]; i++)
        file_line += file[i] == '\n';
    free(file);
    if (!same)
        fail_msg("%s:%u quotes %s, but they differ from the file's line %u on: copy the "
                 "file into %s again",
                 doc, line, rel, file_line, doc);
    print_message("%s:%u quotes %s as it is\n", doc, line, rel);
    return next_line(end);
}

/* Checks every ```c block of one document against the file it quotes,
 * and that it quotes each of the files it must. */
static void check_doc(const struct quoting_doc *qd)
{
    char *text = read_source(qd->doc);
    int quoted[sizeof qd->must_quote / sizeof qd->must_quote[0]] = {0};
    const char *prev = NULL;
    unsigned line = 1;
    for (const char *p = text; *p;) {
        if (line_is(p, "```c")) {
            if (!prev || strncmp(prev, QUOTE_MARK, strlen(QUOTE_MARK)) != 0)
                fail_msg("%s:%u: a ```c block that quotes no file: C examples live in "
                         "examples/ (compiled and run by ctest) and the docs quote them "
                         "under a line <!-- quote: examples/NAME.c -->",
                         qd->doc, line);
            for (size_t i = 0; qd->must_quote[i]; i++) {
                size_t n = strlen(qd->must_quote[i]);
                const char *name = prev + strlen(QUOTE_MARK);
                quoted[i] |=
                    strncmp(name, qd->must_quote[i], n) == 0 && strncmp(name + n, " -->", 4) == 0;
            }
            const char *after = check_quote(qd->doc, prev, p, line);
            for (; p < after; p = next_line(p))
                line++;
            prev = NULL;
            continue;
        }
        prev = p;
        p = next_line(p);
        line++;
    }
    for (size_t i = 0; qd->must_quote[i]; i++) {
        if (!quoted[i])
            fail_msg("%s does not quote %s", qd->doc, qd->must_quote[i]);
    }
    free(text);
}

static void test_docs_c_blocks_are_the_example_files_verbatim(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof quoting_docs / sizeof quoting_docs[0]; i++)
        check_doc(&quoting_docs[i]);
}

/* Whether a line that starts with `start` is among the first `lines` lines
 * of text: inside a ``` block (a command shown, not one mentioned in prose)
 * when `in_block`, anywhere otherwise. */
static int first_lines_have(const char *text, unsigned lines, const char *start, int in_block)
{
    int inside = 0;
    unsigned line = 1;
    for (const char *p = text; *p && line <= lines; p = next_line(p), line++) {
        if (strncmp(p, "```", 3) == 0) {
            inside = !inside;
            continue;
        }
        if ((!in_block || inside) && strncmp(p, start, strlen(start)) == 0)
            return 1;
    }
    return 0;
}

static void test_readme_first_screen_has_the_set_up_commands_and_the_torch_switch(void **state)
{
    (void)state;
    char *readme = read_source("README.md");
    static const char *const wanted[] = {"tools/setup.sh bench ", "tools/setup.sh test ",
                                         "from ferry.torch import DataLoader "};
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        if (!first_lines_have(readme, FIRST_SCREEN_LINES, wanted[i], 1))
            fail_msg("README.md: no code line starting \"%s\" in its first %d lines: a newcomer's "
                     "first screen has the two set-up commands and the torch switch",
                     wanted[i], FIRST_SCREEN_LINES);
    }
    free(readme);
    /* The test command the README gives is the one CI runs. */
    char *ci = read_source(".ci/run");
    if (!first_lines_have(ci, UINT32_MAX, "tools/setup.sh test\n", 0))
        fail_msg(".ci/run no longer runs `tools/setup.sh test`, the README's test command");
    free(ci);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_c_blocks_are_the_example_files_verbatim),
        cmocka_unit_test(test_readme_first_screen_has_the_set_up_commands_and_the_torch_switch),
    };
    return ft_run_each(tests, sizeof tests / sizeof tests[0]) ? 1 : 0;
}
