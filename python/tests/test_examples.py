"""The Python quick start in docs/python.md is examples/quickstart.py, byte
for byte, and it runs; the README's ferry.Loader example runs as it is."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


def _python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_python_guide_quotes_the_quickstart_whole():
    guide = _read(os.path.join("docs", "python.md"))
    assert _read(os.path.join("examples", "quickstart.py")) in _python_blocks(guide)
    # The quick start comes first in the guide, and the README points to it.
    assert guide.index("## Quick start") < guide.index("## Getting it")
    assert "docs/python.md" in _read("README.md")


def test_readme_loader_example_runs(tmp_path):
    """The README's ferry.Loader example: six lines, the first block that
    imports ferry, before any C; run as it is, it reads three epochs."""
    readme = _read("README.md")
    blocks = [b for b in _python_blocks(readme) if b.startswith("import ferry\n")]
    assert blocks, "README.md has no ```python block starting with `import ferry`"
    example = blocks[0]
    assert len([line for line in example.splitlines() if line.strip()]) == 6
    assert readme.index(example) < readme.index("docs/c-api.md")
    script = example + "print(epoch, x.shape, x.dtype, y.dtype)\n"
    p = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["2", "(96,", "784)", "uint8", "int64"]


def test_quickstart_runs(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[:3] == ["epoch 0: 4 batches", "epoch 1: 4 batches", "epoch 2: 4 batches"]
    assert lines[3].startswith("batch 0 from worker") and "y[:3] = [0, 1, 4]" in lines[3]
    assert lines[-1].startswith('resume state, as JSON: {"ferry": "RlJZU')  # base64 of FRYS


def test_torch_imagefolder_example_repeats_and_resumes():
    """examples/torch_imagefolder.py: an ImageFolder with torchvision's
    training transforms trains a CNN through ferry.torch.DataLoader; two
    runs under torch.manual_seed(0) see identical batches, and a resumed
    run the uninterrupted run's."""
    import pytest
    pytest.importorskip("torchvision")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "torch_imagefolder.py")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("trained 12 batches")
    assert lines[1] == "second run under torch.manual_seed(0): identical batches"
    assert lines[2] == "stopped after 7 batches and resumed: the uninterrupted run's batches"
