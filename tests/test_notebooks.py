"""The notebooks run headless, with small settings, without error."""
import importlib.util
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} == {"quickstart.ipynb", "rank_one_collapse.ipynb", "bort_vs_sgd.ipynb",
                                          "transformers.ipynb", "seed_methods.ipynb", "collapse_atlas.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("AUDIT_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # one intra-op thread: on a busy 2-core machine torch's two threads wait on each other (10-30x slower)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(path, as_version=4)
    missing = [m for m in nb.metadata.get("audit", {}).get("requires", []) if importlib.util.find_spec(m) is None]
    if missing:  # the collapse atlas builds timm models: make test runs it in .venv-libraries
        if os.environ.get("MODEL_LIBRARIES") == "required":
            pytest.fail(f"{path.name} needs {', '.join(missing)} (make test installs them into .venv-libraries)")
        pytest.skip(f"{path.name} needs {', '.join(missing)}, not installed here (make test runs it in .venv-libraries)")
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


OUTCOMES = ("rejected", "not rejected", "inconclusive")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebooks_show_a_map_and_a_verdict_first(path):
    """The stored outputs (the docs render them unexecuted) show a saliency map and a verdict in the first screen:
    among the first three code cells, a PNG and a text naming an outcome of the checks."""
    first = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"][:3]
    outputs = [o for c in first for o in c.get("outputs", []) if o.output_type != "error"]
    texts = [o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "") for o in outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name}: no map in its first code cells"
    assert any(word in text for text in texts for word in OUTCOMES), f"{path.name}: no verdict in its first code cells"
