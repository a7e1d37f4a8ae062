/*
 * plugin.c - the dataset kind that loads its ops table from a shared object:
 * the user's own dataset, built against include/ferry_dataset.h only.
 *
 * Spec: plugin:PATH[?ARGS]  PATH goes to dlopen as is (so a bare file name
 * is searched on the library path); ARGS, the text after the first '?', goes
 * to the plugin's open unchanged ("" when there is none).
 *
 * Nothing in the table is called before it has been checked: the exported
 * ferry_dataset_plugin() must return a table with abi_version in
 * FERRY_DATASET_ABI_OLDEST..FERRY_DATASET_ABI and all four functions. A failure of the plugin's own
 * open is reported as "plugin PATH: <its message>", with its code kept only
 * if it is one of ferry's. While the dataset is open d->dl holds the dlopen
 * handle; ferry__dataset_close unloads it, unless the dataset was opened with
 * FERRY__DATASET_KEEP_LOADED (then a failed open of the plugin leaves it
 * loaded too).
 *
 * Threads: one worker's ferry__dataset at a time; dlopen and dlclose are
 * thread-safe, and thread workers may load the same plugin side by side
 * (the ABI asks plugins to keep no unsynchronised global state).
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kinds.h"

/* Loads the shared object at `path` and checks the ops table it exports. On
 * success sets *ops_out and *dl_out. On failure nothing stays loaded and the
 * outputs are untouched. */
static int plugin_load(const char *path, const ferry_dataset_ops **ops_out, void **dl_out,
                       char *errbuf, size_t errlen)
{
    const ferry_dataset_ops *ops;
    ferry_dataset_plugin_fn entry;
    void *dl = NULL, *sym;
    int rc;

    if (path[0] == '\0')
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                  "plugin: no path given (expected plugin:PATH[?ARGS])");
    dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "plugin: cannot load %s: %s",
                                  path, dlerror());
    dlerror();
    sym = dlsym(dl, FERRY_DATASET_PLUGIN_SYMBOL);
    if (sym == NULL) {
        const char *why = dlerror();
        rc =
            ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "plugin %s does not export %s(): %s",
                               path, FERRY_DATASET_PLUGIN_SYMBOL, why ? why : "symbol is NULL");
        goto fail;
    }
    entry = (ferry_dataset_plugin_fn)sym;
    ops = entry();
    if (ops == NULL) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET,
                                "plugin %s: %s() returned no ops table", path,
                                FERRY_DATASET_PLUGIN_SYMBOL);
        goto fail;
    }
    if (!ferry__dataset_abi_ok(ops->abi_version)) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EVERSION,
                                "plugin %s has ABI version %" PRIu32 ", this ferry supports %d..%d",
                                path, ops->abi_version, FERRY_DATASET_ABI_OLDEST,
                                FERRY_DATASET_ABI);
        goto fail;
    }
    if (!ops->open || !ops->length || !ops->get_batch || !ops->close) {
        rc = ferry__dataset_err(errbuf, errlen, FERRY_EDATASET, "plugin %s: ops table lacks %s()",
                                path,
                                !ops->open        ? "open"
                                : !ops->length    ? "length"
                                : !ops->get_batch ? "get_batch"
                                                  : "close");
        goto fail;
    }
    *ops_out = ops;
    *dl_out = dl;
    return FERRY_OK;

fail:
    dlclose(dl);
    return rc;
}

/* The kind's open (see ferry__dataset_kind): splits PATH?ARGS, loads PATH
 * and has its table open ARGS. */
static int plugin_open(const ferry__dataset_kind *kind, ferry__dataset *d, const char *spec_args,
                       const ferry_dataset_ctx *ctx, char *errbuf, size_t errlen)
{
    const char *q = strchr(spec_args, '?');
    const char *args = q ? q + 1 : "";
    const ferry_dataset_ops *ops = NULL;
    void *dl = NULL;
    char *path;
    int rc;

    path = strndup(spec_args, q ? (size_t)(q - spec_args) : strlen(spec_args));
    if (path == NULL)
        return ferry__dataset_err(errbuf, errlen, FERRY_ENOMEM, "plugin: out of memory");
    rc = plugin_load(path, &ops, &dl, errbuf, errlen);
    if (rc != FERRY_OK)
        goto fail;
    rc = ferry__dataset_open_ops(d, ops, args, ctx, errbuf, errlen);
    if (rc != FERRY_OK) {
        /* The plugin's message, NUL-terminated by ferry__dataset_open_ops,
         * gets the path in front so the user knows whose it is. */
        char inner[FERRY__ERRMSG_MAX];
        snprintf(inner, sizeof inner, "%s", errlen > 0 ? errbuf : "");
        rc = ferry__dataset_err(errbuf, errlen, rc, "plugin %s: %s", path,
                                inner[0] ? inner : "open failed without a message");
        goto fail;
    }
    d->dl = dl;
    free(path);
    return FERRY_OK;

fail:
    if (dl != NULL && !d->keep_loaded)
        dlclose(dl);
    free(path);
    return rc;
}

/* The kind's paths (see ferry__dataset_kind): PATH, when it has a '/'. */
static int plugin_paths(const char *args, ferry__span *path, int max)
{
    size_t len = strcspn(args, "?");
    if (max < 1 || !memchr(args, '/', len))
        return 0;
    path[0] = (ferry__span){0, len};
    return 1;
}

const ferry__dataset_kind ferry__plugin_kind = {
    .name = "plugin",
    .ops = NULL, /* each plugin brings its own */
    .open = plugin_open,
    .paths = plugin_paths,
};
