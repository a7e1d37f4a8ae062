#!/usr/bin/env bash
# ferry's one set-up script: installs what is missing (Debian packages),
# configures and builds, then runs the job asked for.
#
#   tools/setup.sh bench [ferry-bench args...]   build, then run ferry-bench
#   tools/setup.sh test                          build, then run the test suite
#   tools/setup.sh build                         build only
#   tools/setup.sh fuzz [SECONDS]                libFuzzer on the protocol decoders
#   tools/setup.sh release                       Release builds with gcc and clang, warnings
#                                                as errors (what CI checks builds everywhere)
#
# Environment: BUILD_DIR (default: build/ in the repository; a relative
# path is taken from the directory you run this from), FERRY_SANITIZE (e.g.
# address,undefined), JOBS (default: number of cores), PYTHON (the
# interpreter to build the Python package for; default Debian's
# /usr/bin/python3, where python3-numpy and python3-torch install).
#
# bench runs ferry-bench in the directory you run this from, so relative
# paths in its arguments (--dataset npy:x=data.npy, --csv waits.csv) are
# yours, not the repository's.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: tools/setup.sh [JOB] [args...]
  build                      install missing Debian packages, build (the default)
  bench [ferry-bench args]   build, then run ferry-bench in this directory
  test [ctest args]          build, then run the test suite (C and Python)
  fuzz [SECONDS]             libFuzzer on the protocol decoders (default 60 s)
  release                    Release builds with gcc and clang (build-release-CC)
Environment: BUILD_DIR (default build/ in the repository), FERRY_SANITIZE,
JOBS, PYTHON. See README.md, "Two commands", and docs/install.md.
EOF
}

# The job is checked before anything is installed or built.
job=${1:-build}
case "$job" in
    build | bench | test | fuzz | release) ;;
    -h | --help | help) usage; exit 0 ;;
    *) echo "setup: unknown job '$job'" >&2; usage >&2; exit 2 ;;
esac
[ $# -gt 0 ] && shift

caller=$PWD
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$here/build}
case "$build" in /*) ;; *) build=$caller/$build ;; esac
cd "$here"
jobs=${JOBS:-$(nproc)}

# Debian packages ferry needs: compiler and build tools, the libraries
# (ZeroMQ transport, msgpack wire encoding, OpenSSL's libcrypto for the
# AES-GCM of CURVE sessions' data, cmocka tests), libjpeg-turbo and
# libpng (the imagefolder dataset's decoders), Python headers
# and numpy for the Python package, pytest, torch, torchvision, PIL and cloudpickle
# for its tests (and the imagefolder benchmark), prometheus-client for the
# metrics endpoint (Loader(metrics=...)) and its test, gnuplot
# for ferry-bench --plot (and its test), matplotlib for python -m
# ferry.bench --plot (and its test), tmux for the live view's tests (a
# terminal the test reads back), pandas for the test that a DataFrame's
# columns reach the workers without a copy, and clang for the fuzz target.
packages=(build-essential cmake pkg-config libzmq3-dev libmsgpack-dev libssl-dev libcmocka-dev iproute2
          libjpeg-dev libpng-dev python3-dev python3-numpy)
[ "$job" = test ] && packages+=(python3-pytest python3-torch python3-torchvision python3-pil python3-cloudpickle
                                   python3-pip python3-setuptools python3-prometheus-client
                                   python3-matplotlib tmux python3-pandas)
case "$job" in test | bench) packages+=(gnuplot-nox) ;; esac
case "$job" in fuzz | release) packages+=(clang) ;; esac
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "$job" = fuzz ]; then
    # Its own build folder, with clang; runs on a scratch copy of the seed
    # corpus so the repository's corpus is never rewritten. The seeds are
    # written by build/ferry_fuzz_seeds (tests/fuzz/make_seeds.c).
    cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DFERRY_FUZZ=ON -DFERRY_WERROR=ON \
        -DFERRY_BUILD_TESTS=OFF >/dev/null
    cmake --build build-fuzz -j "$jobs" --target fuzz_protocol fuzz_image
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    # The time is shared: two thirds on the protocol decoders, a third on
    # the image decoders (seeds: tests/fuzz/images, small valid files).
    total=${1:-60}
    mkdir "$scratch/protocol" "$scratch/image"
    cp tests/fuzz/corpus/* "$scratch/protocol"/
    cp tests/fuzz/images/* "$scratch/image"/
    build-fuzz/fuzz_protocol "$scratch/protocol" -max_total_time=$((total * 2 / 3)) \
        -print_final_stats=1
    build-fuzz/fuzz_image "$scratch/image" -max_total_time=$((total - total * 2 / 3)) \
        -print_final_stats=1 -rss_limit_mb=4096
    exit $?
fi

python_arg=()
[ -n "${PYTHON:-}" ] && python_arg=(-DPython3_EXECUTABLE="$(command -v "$PYTHON")")

if [ "$job" = release ]; then
    # -O3's flow analysis warns where -O2 does not (maybe-uninitialized):
    # a user's Release build must build.
    for cc in gcc clang; do
        echo "setup: Release build with $cc"
        cmake -S . -B "build-release-$cc" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" \
            -DFERRY_WERROR=ON "${python_arg[@]}" >/dev/null
        cmake --build "build-release-$cc" -j "$jobs" >/dev/null
    done
    exit 0
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_WERROR=ON \
    -DFERRY_SANITIZE="${FERRY_SANITIZE:-}" "${python_arg[@]}" >/dev/null
cmake --build "$build" -j "$jobs"

case "$job" in
    build) ;;
    bench) cd "$caller" && exec "$build/ferry-bench" "$@" ;;
    test) cd "$build" && exec ctest --output-on-failure --timeout 600 "$@" ;;
esac
