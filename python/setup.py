"""/usr/bin/python3 -m pip install --no-build-isolation --no-deps --target DIR ./python

(or into a venv made with --system-site-packages; see docs/python.md).

Builds the ferry package with Debian's setuptools: the _ferry extension
from python/src plus the C core (the same files CMake builds, read from
CMakeLists.txt and ../CMakeLists.txt), linked against libzmq, msgpack-c, libcrypto,
libjpeg-turbo and libpng found with pkg-config. Needs: build-essential pkg-config
libzmq3-dev libmsgpack-dev libssl-dev libjpeg-dev libpng-dev python3-dev python3-numpy (tools/setup.sh build installs them). Nothing
is fetched from PyPI.
"""

import os
import re
import subprocess

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def core_sources():
    """FERRY_SOURCES from the top CMakeLists.txt: one list for both builds."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        text = f.read()
    m = re.search(r"set\(FERRY_SOURCES\s+(.*?)\)", text, re.S)
    if not m:
        raise SystemExit("setup.py: FERRY_SOURCES not found in ../CMakeLists.txt")
    return [os.path.relpath(os.path.join(ROOT, s), HERE) for s in m.group(1).split()]


def extension_sources():
    """The _ferry extension's own sources, from python/CMakeLists.txt."""
    with open(os.path.join(HERE, "CMakeLists.txt")) as f:
        text = f.read()
    m = re.search(r"Python3_add_library\(_ferry MODULE\s+(.*?)\)", text, re.S)
    if not m:
        raise SystemExit("setup.py: the _ferry sources not found in CMakeLists.txt")
    return m.group(1).split()


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "libzmq", "msgpack", "libcrypto", "libjpeg",
                              "libpng16"],
                             check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("setup.py: pkg-config could not find libzmq, msgpack, libcrypto, libjpeg "
                         "and libpng16 (Debian: apt-get install pkg-config libzmq3-dev "
                         "libmsgpack-dev libssl-dev libjpeg-dev libpng-dev): %s" % e)
    return out.split()


def version():
    with open(os.path.join(ROOT, "include", "ferry.h")) as f:
        text = f.read()
    parts = [re.search(r"#define FERRY_VERSION_%s (\d+)" % p, text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


flags = pkg_config("--cflags")
libs = pkg_config("--libs")
ext = Extension(
    "ferry._ferry",
    sources=extension_sources() + core_sources(),
    include_dirs=[os.path.relpath(os.path.join(ROOT, d), HERE)
                  for d in ("include", "base", "core", "transport", "sampler")],
    define_macros=[("_GNU_SOURCE", None), ("FERRY_BUILDING", None)],
    extra_compile_args=["-std=gnu11", "-fvisibility=hidden"] +
    [f for f in flags if not f.startswith("-I")],
    libraries=[f[2:] for f in libs if f.startswith("-l")] + ["dl", "pthread", "m"],
    library_dirs=[f[2:] for f in libs if f.startswith("-L")],
)

setup(
    name="ferry",
    version=version(),
    description="A data loader for machine-learning training: persistent workers, "
                "prefetch across epochs, zero-copy numpy batches",
    license="MIT",
    packages=["ferry", "ferry.torch"],
    ext_modules=[ext],
    entry_points={"console_scripts": ["ferry-top = ferry.top:main"]},  # python -m ferry.top
    python_requires=">=3.9",
    install_requires=["numpy"],
)
