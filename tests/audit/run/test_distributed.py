"""Runs sharded over torch.distributed ranks (gloo, localhost): the files of one process, and
--resume after a rank is killed."""
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from audit.cli import _without_workers, main
from audit.errors import ConfigError
from audit.faults import KILL_AFTER_UNITS
from audit.run.config import load_config
from audit.run.distributed import Shard, launch
from audit.run.runner import run_audit

ROOT = Path(__file__).resolve().parents[3]
ARGS = ["--models", "cnn-sgd,cnn-bort", "--methods", "gradient,lrp-zplus,deeplift",
        "--tests", "csc,random-logit,cascading", "--n-images", "4", "--quiet"]


def files(out: Path) -> dict[str, bytes]:
    """The run's tables: joined results and every unit."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted([*(out / "results").glob("*.csv"),
                                                                      *(out / "units").rglob("*.csv")])}


@contextlib.contextmanager
def one_thread():
    """One intra-op thread, as torchrun gives each rank: float32 kernels block their sums by thread
    count, so a process with other threads differs from the ranks in the last bits."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("single") / "run"
    with one_thread():
        assert main(["run", *ARGS, "--no-report", "--out", str(out)]) == 0
    return files(out)


def test_shards_split_the_units_without_overlap():
    shards = [Shard(r, 3) for r in range(3)]
    assert [[s.mine(i) for s in shards].count(True) for i in range(10)] == [1] * 10
    assert Shard().lead and Shard().mine(7) and not Shard(1, 2).lead
    assert _without_workers(["run", "--workers", "2", "--out", "x", "--workers=3"]) == ["run", "--out", "x"]
    with pytest.raises(ConfigError, match="--workers must be at least 1, got 0"):
        launch(0, ["run"])


def test_two_ranks_write_the_files_of_one_process(single, tmp_path, capsys, monkeypatch):
    temp = tmp_path / "temp"  # the temporary folder the caller's process uses
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile reads TMPDIR anew
    environ, threads = dict(os.environ), torch.get_num_threads()
    assert main(["run", *ARGS, "--workers", "2", "--out", str(tmp_path / "two")]) == 0
    assert list(temp.iterdir()) == []  # the launcher's folders (torchelastic's) are gone with it
    # the launcher runs in a process of its own: the caller's environment and threads stay as they were
    assert dict(os.environ) == environ and torch.get_num_threads() == threads
    assert files(tmp_path / "two") == single
    assert (tmp_path / "two" / "index.html").exists() and not list((tmp_path / "two").rglob("*.part"))
    assert not (tmp_path / "two" / ".lock").exists()  # the lock lives as long as the run holds it


@pytest.mark.parametrize("kill", ["2@1", "6@0"])
def test_resume_after_a_rank_is_killed(single, tmp_path, kill):
    """A rank kills itself after its k-th unit file (``k@rank``): the same point on any machine."""
    out = tmp_path / "killed"
    env = {**os.environ, KILL_AFTER_UNITS: kill, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "audit", "run", *ARGS, "--workers", "2", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "failed (exit code" in done.stderr, done.stderr[-3000:]
    written = len(list((out / "units").rglob("*.csv")))
    assert int(kill.split("@")[0]) <= written < len([k for k in single if k.startswith("units")])
    assert not (out / "results").exists()
    assert main(["run", *ARGS, "--no-report", "--workers", "2", "--out", str(out), "--resume"]) == 0
    assert files(out) == single


def test_a_run_object_in_one_process_is_the_single_shard(tmp_path):
    result = run_audit(load_config(models=["cnn-sgd"], methods=["gradient"], tests=["random-logit"], n_images=2),
                       tmp_path / "one", progress=False, log=lambda s: None, shard=Shard())
    assert set(result.tables) == {"random-logit", "models"}


BLOCKED = ["--models", "cnn-sgd", "--methods", "gradient,lrp-zplus", "--tests", "csc,random-logit,cascading",
           "--n-images", "6", "--image-block", "2", "--quiet", "--no-report"]


def _maps(out: Path) -> dict[str, list]:
    import numpy as np
    found = {}
    for p in sorted((out / "units").rglob("*.npz")):
        with np.load(p) as npz:
            found[str(p.relative_to(out))] = [npz["maps"], npz["images"]]
    return found


def test_the_images_of_a_unit_are_shared_among_ranks_in_blocks(tmp_path):
    import numpy as np
    one, two = tmp_path / "one", tmp_path / "two"
    (tmp_path / "audit.toml").write_text("heatmap_examples = 3\n")
    blocked = [*BLOCKED, "--config", str(tmp_path / "audit.toml")]
    with one_thread():
        assert main(["run", *blocked, "--out", str(one)]) == 0
    assert main(["run", *blocked, "--workers", "2", "--out", str(two)]) == 0
    assert files(one) == files(two)
    assert not list(two.rglob("*@*"))  # the blocks were joined into their units and removed
    cascading = files(one)["units/cnn-sgd/cascading/gradient.csv"].decode().splitlines()
    assert len(cascading) > 1 and sorted({int(line.split(",")[3]) for line in cascading[1:]}) == list(range(6))
    a, b = _maps(one), _maps(two)
    assert a.keys() == b.keys() == {"units/cnn-sgd/cascading/gradient.npz", "units/cnn-sgd/cascading/lrp-zplus.npz"}
    for k in a:
        assert a[k][0].shape[1] == 3 and a[k][1].shape[0] == 3  # three example images, from two blocks
        assert all(np.array_equal(u, v) for u, v in zip(a[k], b[k]))


def test_a_sequential_run_on_two_ranks_writes_the_files_of_one_process(tmp_path):
    """Each look's blocks are shared among the ranks; every rank reads them after the look and decides alike which
    cells take the next."""
    sequential = ["--models", "cnn-sgd", "--methods", "gradient,guided-backprop", "--tests", "random-logit",
                  "--n-images", "16", "--max-images", "48", "--quiet", "--no-report"]
    one, two = tmp_path / "one", tmp_path / "two"
    with one_thread():
        assert main(["run", *sequential, "--out", str(one)]) == 0
    assert main(["run", *sequential, "--workers", "2", "--out", str(two)]) == 0
    assert files(one) == files(two)
    manifest = json.loads((two / "manifest.json").read_text())
    assert manifest["sequential"]["images"] == {"cnn-sgd/random-logit/gradient": 16,
                                                "cnn-sgd/random-logit/guided-backprop": 48}
