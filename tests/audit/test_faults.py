"""Faults at every file write of a small run and of its report: after a rerun (``--resume``), the
folder equals an uninterrupted run's, byte for byte; no partial (.part) or empty file is ever left."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import audit.atomic
from audit.run.config import load_config
from audit.run.runner import run_audit
from reports import build_report

ROOT = Path(__file__).resolve().parents[2]
CONFIG = dict(models=["cnn-sgd"], methods=["gradient"], tests=["random-logit", "cascading"], n_images=2,
              heatmap_examples=1)


def audit_and_report(out: Path, resume: bool = False) -> None:
    run_audit(load_config(**CONFIG), out, resume=resume, progress=False, log=lambda s: None)
    build_report(out)


def snapshot(out: Path) -> dict[str, object]:
    """Every file of a run folder: bytes, or for .npz the arrays (zip entries carry write times);
    the manifest without what it measured of the machine: timings, the peak memory of each unit and
    the default memory budget (half of the free RAM when the run started)."""
    files: dict[str, object] = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name != ".lock"):
        name = str(path.relative_to(out))
        if path.suffix == ".npz":
            with np.load(path) as npz:
                files[name] = {k: npz[k].tobytes() for k in npz.files}
        elif path.name == "manifest.json":
            manifest = json.loads(path.read_text())
            manifest.pop("timings_s", None)
            manifest.pop("memory", None)
            files[name] = manifest
        else:
            files[name] = path.read_bytes()
    return files


def assert_clean(out: Path) -> None:
    """No temporary file left, and no empty file (every write is all or nothing)."""
    leftovers = [p for p in out.rglob("*") if p.name.endswith(".part")]
    empty = [p for p in out.rglob("*") if p.is_file() and p.stat().st_size == 0 and p.name != ".lock"]
    assert not leftovers and not empty, (leftovers, empty)


class Fault(OSError):
    pass


@dataclass
class Reference:
    """An uninterrupted run: ``ran`` its folder before the report, ``files`` / ``ran_files`` the
    snapshots with / without the report, and the files the run and the report write, in order."""

    ran: Path
    files: dict
    ran_files: dict
    run_written: list[Path]
    report_written: list[Path]

    @property
    def run_writes(self) -> int:
        return len(self.run_written)

    @property
    def report_writes(self) -> int:
        return len(self.report_written)

    def faulted(self) -> list[int]:
        """The writes (1-based, the run's then the report's) a fault is injected at: every write of the run,
        each leaving the run at another point to resume from, and the first of each kind of report file
        (.png, .pdf, .html, .md, .tex, .bib): the report writes them all alike and rebuilds from the results."""
        first: dict[str, int] = {}
        for k, path in enumerate(self.report_written, start=self.run_writes + 1):
            first.setdefault(path.suffix, k)
        return [*range(1, self.run_writes + 1), *sorted(first.values())]


def _written(call) -> list[Path]:
    calls = []
    real = audit.atomic._rename

    def counting(src, dst):
        calls.append(Path(dst))
        real(src, dst)

    audit.atomic._rename = counting
    try:
        call()
    finally:
        audit.atomic._rename = real
    return calls


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    base = tmp_path_factory.mktemp("faults")
    out = base / "reference"
    run_written = _written(lambda: run_audit(load_config(**CONFIG), out, progress=False, log=lambda s: None))
    shutil.copytree(out, base / "ran")
    ran_files = snapshot(out)
    report_written = _written(lambda: build_report(out))
    return Reference(base / "ran", snapshot(out), ran_files, run_written, report_written)


def test_the_same_run_twice_gives_the_same_files(reference, tmp_path):
    audit_and_report(tmp_path / "again")
    assert reference.run_writes >= 8 and reference.report_writes >= 12
    assert snapshot(tmp_path / "again") == reference.files


def _faulty(k: int, when: str):
    real = audit.atomic._rename
    count = [0]

    def rename(src, dst):
        count[0] += 1
        if count[0] == k and when == "before":
            raise Fault(f"injected fault at write {k} ({dst})")
        real(src, dst)
        if count[0] == k:
            raise Fault(f"injected fault after write {k} ({dst})")
    return rename


@pytest.mark.parametrize("when,first", [("before", 0), ("after", 1)])
def test_a_failure_at_a_write_then_rerun_gives_the_uninterrupted_files(reference, tmp_path, monkeypatch, when, first):
    """``before``: the k-th write fails (the file keeps its old content); ``after``: it lands and the process
    fails right after it; the two take :meth:`Reference.faulted`'s writes in turn (``first``: where this one
    starts), so that each write meets one of them. Writes of the run are followed by ``--resume``, writes of
    the report by a rebuild."""
    real = audit.atomic._rename
    for k in reference.faulted()[first::2]:
        out = tmp_path / f"k{k}"
        in_run = k <= reference.run_writes
        if not in_run:
            shutil.copytree(reference.ran, out)
        monkeypatch.setattr(audit.atomic, "_rename", _faulty(k if in_run else k - reference.run_writes, when))
        with pytest.raises(Fault):
            if in_run:
                run_audit(load_config(**CONFIG), out, progress=False, log=lambda s: None)
            else:
                build_report(out)
        monkeypatch.setattr(audit.atomic, "_rename", real)
        if out.exists():
            assert_clean(out)
        if in_run:
            run_audit(load_config(**CONFIG), out, resume=True, progress=False, log=lambda s: None)
        else:
            build_report(out)
        assert_clean(out)
        assert snapshot(out) == (reference.ran_files if in_run else reference.files), f"fault {when} write {k}"


KILLER = """
import os, signal, sys
import audit.atomic
from tests.audit.test_faults import audit_and_report
k, real, count = int(sys.argv[2]), audit.atomic._rename, [0]
def kill(src, dst):
    count[0] += 1
    if count[0] == k:
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
audit.atomic._rename = kill
audit_and_report(__import__("pathlib").Path(sys.argv[1]))
"""


def test_sigkill_at_a_write_then_resume_gives_the_uninterrupted_files(reference, tmp_path):
    files = reference.files
    for k in (reference.run_writes // 2, reference.run_writes + reference.report_writes // 2):  # a unit, a figure
        out = tmp_path / f"kill{k}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", KILLER, str(out), str(k)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
        # a kill leaves the temporary file of the write it interrupted (no cleanup runs); the rerun
        # must neither read it nor keep it
        assert list(out.rglob(".*.part"))
        audit_and_report(out, resume=True)
        assert_clean(out)
        assert snapshot(out) == files, f"kill at write {k}"
