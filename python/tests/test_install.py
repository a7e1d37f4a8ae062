"""The package installed, not imported from the build tree: with
`cmake --install` into a fresh prefix and with `pip install
--no-build-isolation` (Debian's setuptools, nothing from PyPI), then used
by a script with no ferry path in its environment: a 2-worker loader over a
Python dataset defined in the script itself."""

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("FERRY_TEST_BUILD")

SCRIPT = """
    import numpy as np, ferry
    class Ten:
        def __len__(self): return 10
        def __getitem__(self, i): return {"v": np.int32(i)}
    if __name__ == "__main__":
        with ferry.Loader(Ten, batch_size=5, workers=2, epochs=1) as ld:
            print(ferry.__file__)
            print(sorted(int(v) for b in ld for v in b["v"]))
    """


def py_files(top):
    """The .py files under top (a ferry package), by path inside it."""
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, names in os.walk(top)
                  for f in names if f.endswith(".py"))


def run_installed(tmp_path, site):
    # every module installed, the subpackages' (ferry/torch/) too
    assert py_files(os.path.join(site, "ferry")) == py_files(os.path.join(ROOT, "python",
                                                                          "ferry"))
    script = tmp_path / "use_ferry.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    p = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    where, values = p.stdout.splitlines()[:2]
    assert where.startswith(str(site))
    assert values == str(list(range(10)))


@pytest.mark.skipif(not BUILD, reason="needs FERRY_TEST_BUILD (ctest sets it)")
def test_cmake_install_into_a_fresh_prefix(tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], check=True,
                   capture_output=True, timeout=120)
    sites = [os.path.dirname(p) for p in
             subprocess.run(["find", str(prefix), "-name", "__init__.py", "-path",
                             "*/ferry/__init__.py"], capture_output=True,
                            text=True).stdout.split()]
    assert len(sites) == 1, sites
    run_installed(tmp_path, os.path.dirname(sites[0]))


def have(module):
    import importlib.util
    return importlib.util.find_spec(module) is not None


@pytest.mark.skipif(shutil.which("pkg-config") is None or not have("pip") or
                    not have("setuptools"), reason="needs pkg-config, pip and setuptools")
def test_pip_install_no_build_isolation(tmp_path):
    src = tmp_path / "src"
    for d in ("include", "base", "core", "transport", "sampler", "python"):
        shutil.copytree(os.path.join(ROOT, d), src / d,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copy(os.path.join(ROOT, "CMakeLists.txt"), src / "CMakeLists.txt")
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-deps", "--no-index", "--target", str(target),
                        str(src / "python")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert sysconfig.get_config_var("EXT_SUFFIX") in " ".join(os.listdir(target / "ferry"))
    assert (target / "bin" / "ferry-top").is_file()  # the live view's console script
    run_installed(tmp_path, target)
