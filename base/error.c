/*
 * error.c - error codes to text, and the per-thread detail of the last
 * failure. The table lives in ferry.h (FERRY_ERRNO_MAP) so the enum and the
 * text cannot drift apart.
 */
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

static __thread char last_error[FERRY__ERRMSG_MAX];

const char *ferry_strerror(int err)
{
    switch (err) {
#define FERRY__ERR_MSG(name, value, msg)                                                           \
    case FERRY_##name:                                                                             \
        return msg;
        FERRY_ERRNO_MAP(FERRY__ERR_MSG)
#undef FERRY__ERR_MSG
    }
    return "unknown error";
}

const char *ferry_err_name(int err)
{
    switch (err) {
#define FERRY__ERR_NAME(name, value, msg)                                                          \
    case FERRY_##name:                                                                             \
        return "FERRY_" #name;
        FERRY_ERRNO_MAP(FERRY__ERR_NAME)
#undef FERRY__ERR_NAME
    }
    return "FERRY_UNKNOWN";
}

const char *ferry_last_error(void)
{
    return last_error;
}

const char *ferry_version(void)
{
#define FERRY__STR2(x) #x
#define FERRY__STR(x) FERRY__STR2(x)
    return FERRY__STR(FERRY_VERSION_MAJOR) "." FERRY__STR(FERRY_VERSION_MINOR) "." FERRY__STR(
        FERRY_VERSION_PATCH);
}

/* Formatted apart, then copied: an argument may be ferry_last_error()
 * itself (a detail wrapped in more context), which a format straight into
 * last_error would overwrite while reading it. */
int ferry__seterr(int code, const char *fmt, ...)
{
    char text[FERRY__ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(last_error, text, sizeof text);
    return code;
}

int ferry__seterr_str(int code, const char *msg)
{
    if (msg != last_error)
        snprintf(last_error, sizeof last_error, "%s", msg ? msg : "");
    return code;
}

void ferry__clearerr(void)
{
    last_error[0] = '\0';
}

size_t ferry_dtype_size(int dtype)
{
    switch (dtype) {
    case FERRY_DTYPE_U8:
    case FERRY_DTYPE_I8:
    case FERRY_DTYPE_BOOL:
        return 1;
    case FERRY_DTYPE_U16:
    case FERRY_DTYPE_I16:
    case FERRY_DTYPE_F16:
        return 2;
    case FERRY_DTYPE_U32:
    case FERRY_DTYPE_I32:
    case FERRY_DTYPE_F32:
        return 4;
    case FERRY_DTYPE_U64:
    case FERRY_DTYPE_I64:
    case FERRY_DTYPE_F64:
        return 8;
    }
    return 0;
}

/* numpy's names: the one spelling of a dtype in ferry (see ferry.h). */
static const char *const dtype_names[] = {
    [FERRY_DTYPE_U8] = "uint8",     [FERRY_DTYPE_I8] = "int8",
    [FERRY_DTYPE_U16] = "uint16",   [FERRY_DTYPE_I16] = "int16",
    [FERRY_DTYPE_U32] = "uint32",   [FERRY_DTYPE_I32] = "int32",
    [FERRY_DTYPE_U64] = "uint64",   [FERRY_DTYPE_I64] = "int64",
    [FERRY_DTYPE_F16] = "float16",  [FERRY_DTYPE_F32] = "float32",
    [FERRY_DTYPE_F64] = "float64",  [FERRY_DTYPE_BOOL] = "bool",
};
#define DTYPE_COUNT ((int)(sizeof dtype_names / sizeof dtype_names[0]))

const char *ferry_dtype_name(int dtype)
{
    if (dtype <= 0 || dtype >= DTYPE_COUNT)
        return NULL;
    return dtype_names[dtype];
}

int ferry_dtype_from_name(const char *name)
{
    for (int d = 1; name && d < DTYPE_COUNT; d++)
        if (strcmp(dtype_names[d], name) == 0)
            return d;
    return 0;
}

int ferry__syserr(int code, const char *what, int e)
{
    if (e == EMFILE || e == ENFILE || e == EAGAIN) {
        int files = e != EAGAIN;
        struct rlimit rl = {0, 0};
        getrlimit(files ? RLIMIT_NOFILE : RLIMIT_NPROC, &rl);
        return ferry__seterr(FERRY_ELIMIT, "%s: %s (the %s limit is %llu)", what, strerror(e),
                             files ? "open file (RLIMIT_NOFILE)" : "process (RLIMIT_NPROC)",
                             (unsigned long long)rl.rlim_cur);
    }
    return ferry__seterr(code, "%s: %s", what, strerror(e));
}
