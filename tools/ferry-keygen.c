/*
 * ferry-keygen - makes a CURVE key pair for a remote worker or a loader.
 *
 * Writes BASE.key (the pair, mode 0600: stays on the machine that owns it)
 * and BASE.pub (the public key, mode 0644: handed to the other side), and
 * prints the public key line. A worker's BASE.pub goes on the loader's
 * allow-list; a loader's BASE.pub goes to its workers as --server-key.
 * BASE given as NAME.key or NAME.pub means NAME, so that `ferry-keygen
 * loader.key` writes loader.key and loader.pub, not loader.key.key.
 * The work is transport/keys.c's; this file only reads the command line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "keys.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry-keygen [--force] BASE\n"
               "  writes a new CURVE key pair to BASE.key (secret, mode 600) and its public key\n"
               "  to BASE.pub (mode 644), and prints the public key; BASE may be given as\n"
               "  BASE.key or BASE.pub\n"
               "  --force    replace BASE.key and BASE.pub if they exist\n"
               "  --help     this text\n"
               "  --version  the ferry version\n");
}

int main(int argc, char **argv)
{
    const char *base = NULL;
    int force = 0, options = 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && (!strcmp(a, "--help") || !strcmp(a, "-h"))) {
            usage(stdout);
            return 0;
        } else if (options && !strcmp(a, "--version")) {
            printf("ferry-keygen %s\n", ferry_version());
            return 0;
        } else if (options && !strcmp(a, "--force")) {
            force = 1;
        } else if (options && !strcmp(a, "--")) {
            options = 0;
        } else if ((options && a[0] == '-') || !a[0] || base) {
            fprintf(stderr, "ferry-keygen: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            base = a;
        }
    }
    if (!base) {
        fprintf(stderr, "ferry-keygen: BASE is required\n");
        usage(stderr);
        return 2;
    }

    /* NAME.key or NAME.pub is NAME, unless nothing of the file name would
     * be left (".key", "dir/.pub"). */
    char *name = strdup(base);
    if (!name) {
        fprintf(stderr, "ferry-keygen: out of memory\n");
        return 1;
    }
    size_t n = strlen(name);
    if (n > 4 && name[n - 5] != '/' &&
        (!strcmp(name + n - 4, ".key") || !strcmp(name + n - 4, ".pub")))
        name[n - 4] = '\0';
    base = name;

    char pub[FERRY__Z85_KEY + 1];
    if (ferry__key_pair_write(base, force, pub) != FERRY_OK) {
        fprintf(stderr, "ferry-keygen: %s\n", ferry_last_error());
        free(name);
        return 1;
    }
    printf("public-key = %s\n", pub);
    fprintf(stderr,
            "ferry-keygen: wrote %s.key (the key pair: keep it secret) and %s.pub; "
            "%s.pub goes on the loader's allow-list (a worker key) or to the workers as "
            "--server-key (a loader key)\n",
            base, base, base);
    free(name);
    return fflush(stdout) == 0 ? 0 : 1;
}
