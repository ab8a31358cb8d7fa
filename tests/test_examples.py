"""Every Python block of the README and of the getting-started page runs as written, in a fresh interpreter, from
a folder of its own; the blocks that load a model library run where the libraries are (.venv-libraries)."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/getting-started.md"]
LIBRARIES = ("timm", "transformers", "torchvision")
BLOCKS = [(f"{page}#{i}", block) for page in PAGES
          for i, block in enumerate(re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S))]


def _needs(block: str) -> list[str]:
    return [lib for lib in LIBRARIES if re.search(rf"^\s*(import|from) {lib}\b", block, flags=re.M)]


def _run(block: str, folder: Path) -> None:
    # where a new user would run it: outside the repository, with the package installed in the venv; the suite's
    # thread count kept (make test runs one per process: two threads per example, spinning beside the suite's
    # processes, took the getting-started example from 25 to 45 CPU-seconds)
    threads = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]} if "OMP_NUM_THREADS" in os.environ else {}
    done = subprocess.run([sys.executable, "-c", block], cwd=folder, capture_output=True, text=True, timeout=900,
                          env={"PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg", "HOME": str(folder), **threads})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "the example prints its results"


def test_the_readme_is_a_front_page_with_an_example():
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) < 1500
    assert any(name.startswith("README.md") for name, _ in BLOCKS)
    assert "![" in text and (ROOT / re.search(r"!\[[^]]*\]\(([^)]+)\)", text).group(1)).exists()


@pytest.mark.parametrize("name,block", [b for b in BLOCKS if not _needs(b[1])], ids=lambda v: v if "#" in v else "")
def test_python_block_runs(name, block, tmp_path):
    _run(block, tmp_path)


@pytest.mark.parametrize("name,block", [b for b in BLOCKS if _needs(b[1])], ids=lambda v: v if "#" in v else "")
def test_model_library_block_runs(name, block, tmp_path):
    missing = [lib for lib in _needs(block) if importlib.util.find_spec(lib) is None]
    if missing:
        if os.environ.get("MODEL_LIBRARIES") == "required":
            pytest.fail(f"{name} needs {', '.join(missing)} (make test installs them into .venv-libraries)")
        pytest.skip(f"{name} needs {', '.join(missing)}: make test runs it in .venv-libraries")
    _run(block, tmp_path)
