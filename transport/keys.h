/*
 * keys.h - CURVE key files: the key pairs that authenticate remote workers
 * and loaders, and the loader's allow-list of worker public keys.
 *
 * Where it sits: before any socket exists. A loader reads its own key pair
 * and the allow-list when it opens; a remote worker reads its key pair and
 * the loader's public key (--server-key) when it starts. ferry-keygen makes
 * the files. Nothing here touches a socket: callers hand the Z85 strings to
 * ZMQ_CURVE_* options and the decoded allow-list to their ZAP handler.
 *
 * Files are text, one key per line, written by ferry-keygen as
 *
 *   BASE.key (mode 0600)                BASE.pub (mode 0644)
 *   # ferry CURVE key pair ...          # ferry CURVE public key ...
 *   public-key = <40 Z85 chars>         public-key = <40 Z85 chars>
 *   secret-key = <40 Z85 chars>
 *
 * and every reader goes through one line parser: `name = KEY` with spaces
 * allowed around `=`, or a bare KEY (allow-lists and .pub files); `#` starts
 * a comment, on its own line or after the key; blank lines, CRLF and a last
 * line without a newline are fine; a line over 1 KiB or a file over 1 MiB is
 * FERRY_EFORMAT. A `#` can never begin a valid Z85 key (its first group
 * would exceed 32 bits), so a line starting with `#` is always a comment.
 *
 * Secret keys are wiped (explicit_bzero) from every buffer this module
 * used once it is done with them; the caller's own copy is the caller's to
 * wipe. Thread safety: none needed; no state outside the arguments (errors
 * go to the calling thread's ferry_last_error()).
 */
#ifndef FERRY_KEYS_H
#define FERRY_KEYS_H

#include <stddef.h>

#define FERRY__Z85_KEY 40 /* a Z85-encoded 32-byte CURVE key */
#define FERRY__KEY_BYTES 32

/* Reads a key pair file (BASE.key). Refuses, with FERRY_EOPTION, a missing
 * or unreadable file (strerror in the message) and anything but a regular
 * file. FERRY_EFORMAT, naming path:line, for a malformed line, a missing or
 * second public-key/secret-key line (a public key alone is said to look
 * like a .pub file), a key that is not valid Z85, or a public key that does
 * not belong to the secret key. Then, with FERRY_EOPTION, a file that group
 * or others have any access to (as ssh does; the message names the path
 * and mode and says `chmod 600 PATH`): the content is judged first, so that
 * a .pub file given by mistake is not told to be made private. On FERRY_OK
 * pub and sec hold NUL-terminated Z85 keys; on failure they are
 * unchanged. */
int ferry__key_pair_load(const char *path, char pub[FERRY__Z85_KEY + 1],
                         char sec[FERRY__Z85_KEY + 1]);

/* A public key given either as its 40 Z85 characters or as the path of a
 * file holding one public key (a .pub file). A valid Z85 string is taken as
 * the key unless a file of that name exists. Errors as
 * ferry__key_pair_load, without the permission check (public keys are
 * public); a file with two public keys, or with a secret key (a key pair
 * file, whose secret belongs on its own host only: the message says to pass
 * the .pub file), is FERRY_EFORMAT. pub is written only on FERRY_OK. */
int ferry__key_public_load(const char *path_or_z85, char pub[FERRY__Z85_KEY + 1]);

/* The public keys a loader accepts from workers, decoded. */
typedef struct ferry__allow {
    unsigned char (*keys)[FERRY__KEY_BYTES];
    size_t n;
} ferry__allow;

/* Loads an allow-list from a file, or from a directory whose *.pub files are
 * read (not recursively; other names are ignored; order does not matter).
 * Each key line is `public-key = KEY` or a bare KEY; a secret-key line or
 * any other line is FERRY_EFORMAT naming path:line. A list with no key at all
 * is FERRY_EOPTION ("allows no worker"); duplicates are kept. Errors opening
 * or reading as ferry__key_public_load, FERRY_ENOMEM when an allocation
 * fails. On FERRY_OK *out owns the keys (ferry__allow_free); on failure
 * *out is unchanged and nothing is held. */
int ferry__allow_load(const char *path, ferry__allow *out);

/* 1 if key is on the list, else 0. Every listed key is compared in full,
 * whatever matches, so the time taken says nothing about the keys. */
int ferry__allow_has(const ferry__allow *a, const unsigned char key[FERRY__KEY_BYTES]);

/* Frees the keys and empties *a; safe on a zeroed or already freed list. */
void ferry__allow_free(ferry__allow *a);

/* Makes a new key pair and writes BASE.key (mode 0600, both keys) and
 * BASE.pub (mode 0644, the public key), modes set with fchmod whatever the
 * umask. Each file is written in full to a fresh temporary file beside it
 * and only then given its name: without force by link() (which, like
 * O_EXCL, fails if the name exists), with force by rename(). On failure no
 * file this call made is left: its temporary files are removed, and so is
 * the BASE.key it named if BASE.pub then cannot be named (with force, the
 * old BASE.key is then gone too; it was to be replaced). Returns FERRY_EOPTION if a file exists and
 * !force (the message says to use --force), FERRY_ESYS with strerror for
 * anything else (FERRY_ELIMIT at the open-file limit). On FERRY_OK pub_out
 * holds the new public key. */
int ferry__key_pair_write(const char *base, int force, char pub_out[FERRY__Z85_KEY + 1]);

#endif
