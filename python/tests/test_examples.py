"""The README's Python quick start is examples/quickstart.py, byte for
byte, and it runs."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_quotes_the_quickstart_whole():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(ROOT, "examples", "quickstart.py")) as f:
        example = f.read()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert example in blocks
    # The Python quick start comes before the C material.
    assert readme.index("## Python quick start") < readme.index("## Using the library")


def test_quickstart_runs(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[:3] == ["epoch 0: 4 batches", "epoch 1: 4 batches", "epoch 2: 4 batches"]
    assert lines[3].startswith("batch 0 from worker") and "y[:3] = [0, 1, 4]" in lines[3]
    assert lines[-1] == "resume state: 64 bytes"


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
