/*
 * error.h - the per-thread error detail behind ferry_last_error().
 *
 * Any module that fails records a sentence with ferry__seterr() and returns
 * its code; the public layer passes both on. Touched by every thread, each
 * its own copy (thread-local storage).
 */
#ifndef FERRY_BASE_ERROR_H
#define FERRY_BASE_ERROR_H

#include "ferry.h"

#define FERRY__ERRMSG_MAX 4096

/* Records the detail for `code` and returns `code`, so a failure reads
 * `return ferry__seterr(FERRY_EINVAL, "batch_size must be > 0");`. */
int ferry__seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records a detail already formatted (e.g. from an error buffer). */
int ferry__seterr_str(int code, const char *msg);

/* Records a failed system call. EMFILE/ENFILE become FERRY_ELIMIT naming the
 * open-file limit and its value, EAGAIN (fork, clone, pthread_create) becomes
 * FERRY_ELIMIT naming the process limit; anything else is `code` with
 * "what: strerror(e)". Returns the code chosen. */
int ferry__syserr(int code, const char *what, int e);

/* Clears the detail (after a successful call that must not leave a stale one). */
void ferry__clearerr(void);

#endif
