#!/usr/bin/env bash
# install_test.sh - `cmake --install` gives a tree that works wherever it
# is put. Run by ctest (test "install"; CMakeLists.txt sets the variables
# below), about 5 s.
#
# It installs the build into a fresh temporary prefix and then MOVES the
# prefix, so anything that kept the install path breaks. From the moved
# prefix:
#   - tests/install/install_app.c is built with pkg-config (plus the -rpath
#     a user adds) and with a CMake project using find_package(ferry), and
#     both run a 2-worker loader with nothing in the environment but
#     PATH=/usr/bin:/bin (env -i): the library must find its ferry-worker
#     relative to itself;
#   - the installed ferry-bench runs the same way ($ORIGIN RPATH);
#   - the worker lookup order: FERRY_WORKER is taken over the library's own
#     worker, a bad one is an error naming it, and with the worker moved
#     away the search goes to PATH, and failing that names every place;
#   - the installed Python package (when built) runs a 2-worker loader.
# Afterwards no process from the prefix is left and the temporary folder
# is gone. Exit 77 (ctest: skipped) only when pkg-config or cmake is missing.
#
# Environment (from ctest): FERRY_BUILD (the build folder), FERRY_SOURCE,
# FERRY_CC, FERRY_VERSION (x.y.z; x.y is asked of find_package), FERRY_LIBDIR (relative to the prefix),
# FERRY_GENERATOR, FERRY_SANITIZE (the build's sanitizers: the programs
# built here get the same ones, since the installed library needs their
# runtime loaded first), FERRY_PYTHON_EXE and FERRY_PYTHON_DIR (empty when
# the Python package is not built), CMAKE, PKG_CONFIG.
set -euo pipefail

for tool in "$CMAKE" "$PKG_CONFIG"; do
    if ! command -v "$tool" >/dev/null; then
        echo "install_test: SKIPPED: '$tool' is not installed (Debian: cmake, pkg-config)"
        exit 77
    fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-install.XXXXXX")
tmp=$(cd "$tmp" && pwd -P) # the paths /proc shows are resolved ones
staged=$tmp/staged
prefix=$tmp/moved
app_src=$FERRY_SOURCE/tests/install
clean_env=(env -i PATH=/usr/bin:/bin)
san=()
[ -n "$FERRY_SANITIZE" ] && san=(-fsanitize="$FERRY_SANITIZE")

# On any exit: no process running from the temporary folder may be left,
# and the folder must be gone. Either failing fails the test.
finish() {
    local rc=$? left
    if left=$(pgrep -a -f -- "$tmp/"); then
        echo "install_test: FAIL: processes left running from $tmp:"
        echo "$left"
        pkill -KILL -f -- "$tmp/" || true
        rc=1
    fi
    rm -rf "$tmp"
    if [ -e "$tmp" ]; then
        echo "install_test: FAIL: $tmp could not be removed"
        rc=1
    fi
    exit "$rc"
}
trap finish EXIT

fail() {
    echo "install_test: FAIL: $*"
    exit 1
}

# step WHAT CMD...: runs CMD (under a hard time limit) with its output in
# $tmp/out; on failure shows the output and fails naming WHAT.
step() {
    local what=$1
    shift
    if ! timeout -k 5 60 "$@" >"$tmp/out" 2>&1; then
        cat "$tmp/out"
        fail "$what"
    fi
}

# expect_workers WHAT PROGRAM: the app's output says both workers ran PROGRAM.
expect_workers() {
    local n
    n=$(grep -c -x -F -e "worker 0: $2" -e "worker 1: $2" "$tmp/out" || true)
    if [ "$n" != 2 ]; then
        cat "$tmp/out"
        fail "$1: the workers did not run $2"
    fi
}

# ---- install, then move ----
step "cmake --install" "$CMAKE" --install "$FERRY_BUILD" --prefix "$staged"
mv "$staged" "$prefix"
if grep -r -l -F -- "$staged" "$prefix" >"$tmp/out"; then
    cat "$tmp/out"
    fail "these installed files hold the path they were installed to"
fi
readelf -d "$prefix/bin/ferry-bench" | grep -q 'R.*PATH.*\[\$ORIGIN/' ||
    fail "the installed ferry-bench's RPATH is not relative to \$ORIGIN"

# ---- a program built with pkg-config ----
export PKG_CONFIG_PATH=$prefix/$FERRY_LIBDIR/pkgconfig
libdir=$("$PKG_CONFIG" --variable=libdir ferry)
[ "$(cd "$libdir" && pwd -P)" = "$prefix/$FERRY_LIBDIR" ] ||
    fail "ferry.pc's libdir is $libdir, not in the moved prefix"
read -r -a pc_flags <<<"$("$PKG_CONFIG" --cflags --libs ferry)"
step "cc with pkg-config" "$FERRY_CC" -std=c11 -Wall -Wextra -Werror -pedantic "${san[@]}" \
    -o "$tmp/app_pc" "$app_src/install_app.c" "${pc_flags[@]}" "-Wl,-rpath,$libdir"
step "the pkg-config program" "${clean_env[@]}" "$tmp/app_pc"
expect_workers "pkg-config" "$prefix/bin/ferry-worker"

# ---- a program built with find_package ----
step "cmake configure with find_package" "$CMAKE" -S "$app_src" -B "$tmp/app-build" \
    -G "$FERRY_GENERATOR" -DCMAKE_C_COMPILER="$FERRY_CC" -DCMAKE_PREFIX_PATH="$prefix" \
    -DFERRY_WANT="${FERRY_VERSION%.*}" -DCMAKE_C_FLAGS="${san[*]}" -DCMAKE_EXE_LINKER_FLAGS="${san[*]}"
step "cmake build with find_package" "$CMAKE" --build "$tmp/app-build"
app=$tmp/app-build/install_app
step "the find_package program" "${clean_env[@]}" "$app"
expect_workers "find_package" "$prefix/bin/ferry-worker"

# ---- the installed tools ----
step "ferry-bench --version" "${clean_env[@]}" "$prefix/bin/ferry-bench" --version
grep -q -x -F "ferry-bench $FERRY_VERSION" "$tmp/out" || fail "ferry-bench --version: $(cat "$tmp/out")"
step "ferry-bench" "${clean_env[@]}" "$prefix/bin/ferry-bench" --dataset synthetic:n=512,dim=8 \
    --batch-size 64 --epochs 1 --workers 2 --no-progress

# ---- the worker lookup order ----
# A named program is taken over the library's own, and a bad one is an
# error naming it, not a reason to guess.
mkdir "$tmp/elsewhere"
cp "$prefix/bin/ferry-worker" "$tmp/elsewhere/"
step "FERRY_WORKER" "${clean_env[@]}" FERRY_WORKER="$tmp/elsewhere/ferry-worker" "$app"
expect_workers "FERRY_WORKER" "$tmp/elsewhere/ferry-worker"
if "${clean_env[@]}" FERRY_WORKER="$tmp/none" timeout 60 "$app" >"$tmp/out" 2>&1; then
    fail "a FERRY_WORKER that does not exist was passed over"
fi
grep -q -F "'$tmp/none' (FERRY_WORKER) cannot be run" "$tmp/out" ||
    fail "the error does not name FERRY_WORKER: $(cat "$tmp/out")"
# With no worker beside the library or in the install's bin: PATH.
rm "$prefix/bin/ferry-worker"
step "PATH" env -i PATH="$tmp/elsewhere:/usr/bin:/bin" "$app"
expect_workers "PATH" "$tmp/elsewhere/ferry-worker"
# Found nowhere: the error names every place looked (unless this machine
# has a ferry-worker in /usr/bin or /bin, which PATH then finds).
if [ ! -e /usr/bin/ferry-worker ] && [ ! -e /bin/ferry-worker ]; then
    if "${clean_env[@]}" timeout 60 "$app" >"$tmp/out" 2>&1; then
        fail "a loader opened with no ferry-worker anywhere"
    fi
    for place in "option worker_path: not set" "FERRY_WORKER: not set" \
        "$prefix/$FERRY_LIBDIR/ferry-worker (beside libferry" \
        "$prefix/bin/ferry-worker (the install's bin" "PATH=/usr/bin:/bin"; do
        grep -q -F -- "$place" "$tmp/out" || fail "the error does not name '$place': $(cat "$tmp/out")"
    done
fi
cp "$tmp/elsewhere/ferry-worker" "$prefix/bin/"

# ---- the Python package ----
if [ -n "$FERRY_PYTHON_DIR" ]; then
    step "the installed Python package" "${clean_env[@]}" \
        PYTHONPATH="$prefix/$FERRY_PYTHON_DIR" "$FERRY_PYTHON_EXE" -c '
import ferry
with ferry.Loader("synthetic:n=512,dim=8", batch_size=64, workers=2, epochs=1) as loader:
    n = sum(len(batch["y"]) for batch in loader)
assert n == 512, n
'
fi

echo "install_test: the install works from $prefix, moved from $staged"
