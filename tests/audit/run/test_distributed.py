"""Runs sharded over torch.distributed ranks (gloo, localhost): the files of one process, and
--resume after a rank is killed."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from audit.cli import _without_workers, main
from audit.errors import ConfigError
from audit.run.config import load_config
from audit.run.distributed import Shard, launch
from audit.run.runner import run_audit

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
        assert main(["run", *ARGS, "--out", str(out)]) == 0
    return files(out)


def test_shards_split_the_units_without_overlap():
    shards = [Shard(r, 3) for r in range(3)]
    assert [[s.mine(i) for s in shards].count(True) for i in range(10)] == [1] * 10
    assert Shard().lead and Shard().mine(7) and not Shard(1, 2).lead
    assert _without_workers(["run", "--workers", "2", "--out", "x", "--workers=3"]) == ["run", "--out", "x"]
    with pytest.raises(ConfigError, match="--workers must be at least 1, got 0"):
        launch(0, ["run"])


def test_two_ranks_write_the_files_of_one_process(single, tmp_path, capsys):
    assert main(["run", *ARGS, "--workers", "2", "--out", str(tmp_path / "two")]) == 0
    assert files(tmp_path / "two") == single
    assert (tmp_path / "two" / "index.html").exists() and not list((tmp_path / "two").rglob("*.part"))


def _children(pid: int) -> list[int]:
    """Every descendant process of ``pid`` (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for c, p in parents.items() if p in frontier]
        found += frontier
    return found


def test_resume_after_a_rank_is_killed(single, tmp_path):
    out = tmp_path / "killed"
    launcher = subprocess.Popen([sys.executable, "-m", "audit", "run", *ARGS, "--workers", "2", "--out", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list((out / "units").rglob("*.csv"))) < 4:
        time.sleep(0.2)
    workers = [p for p in _children(launcher.pid) if "audit" in Path(f"/proc/{p}/cmdline").read_bytes().decode(
        errors="replace")]
    assert workers, "no rank found"
    os.kill(workers[-1], signal.SIGKILL)  # one rank dies; the launcher ends the others
    assert launcher.wait(timeout=240) != 0
    done = len(list((out / "units").rglob("*.csv")))
    assert 4 <= done < len([k for k in single if k.startswith("units")])
    assert main(["run", *ARGS, "--workers", "2", "--out", str(out), "--resume"]) == 0
    assert files(out) == single


def test_a_run_object_in_one_process_is_the_single_shard(tmp_path):
    result = run_audit(load_config(models=["cnn-sgd"], methods=["gradient"], tests=["random-logit"], n_images=2),
                       tmp_path / "one", progress=False, log=lambda s: None, shard=Shard())
    assert set(result.tables) == {"random-logit", "models"}


BLOCKED = ["--models", "cnn-sgd", "--methods", "gradient,lrp-zplus", "--tests", "csc,random-logit,cascading",
           "--n-images", "6", "--image-block", "2", "--quiet"]


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
