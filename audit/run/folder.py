"""A run's folder: who may write to it (the lock), whether a resume may continue it (same configuration,
inputs and software), and what identifies its inputs (fingerprints, versions)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import captum
import numpy as np
import pandas as pd
import scipy
import skimage
import torch

from audit.atomic import is_partial
from audit.data.datasets import array_sha256, file_sha256
from audit.errors import ConfigError
from audit.models.checkpoint import model_files
from audit.run.config import AuditConfig
from audit.run.results import read_manifest


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """Hold an advisory lock on ``out`` (``out/.lock``, flock) for the duration, and remove the file
    when done; a clear error when another run holds it."""
    lock = out / ".lock"
    while True:
        handle = open(lock, "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise ConfigError(f"another audit run is writing to {out}; wait for it to finish or choose another "
                              "folder") from None
        # the run before us may have removed the file between our open and our lock: we would hold a
        # lock nobody else sees, so take the file that is there now
        try:
            if os.stat(lock).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)  # before the lock is released: a waiting run then opens a new file
        handle.close()


def holds_files(out: Path) -> bool:
    """Whether ``out`` holds anything besides our lock and the temporary files of killed writes (a
    run that failed at its first write leaves only those, and must not block a rerun)."""
    return out.is_dir() and any(p.name != ".lock" and not is_partial(p) for p in out.iterdir())


def previous_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest of the run to resume: None for an empty or missing folder; a refusal for a folder
    that holds something else (so that resuming never overwrites files that are not ours)."""
    if not holds_files(out):
        return None
    try:
        return read_manifest(out)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; resume only continues a folder written by run_audit, choose another folder") \
            from None


def check_resumable(previous: dict[str, Any], config: AuditConfig, prints: dict[str, Any], out: Path) -> None:
    """Refuse to resume the run ``previous`` (its manifest) with another configuration, other input files or
    images (``prints``: :func:`fingerprints`), or other software."""
    if _without_budget(previous["config"]) != _without_budget(json.loads(json.dumps(config.to_dict()))):
        raise ConfigError(f"{out} holds a run with another configuration; resume needs the same one")
    before = previous.get("fingerprints", {})
    for name, digest in before.get("files", {}).items():
        if prints["files"].get(name) != digest:
            raise ConfigError(f"{name} changed since the run in {out} started (sha256 differs); resuming would mix "
                              "results of two models: start a new run")
    if "data" in before and before["data"] != prints["data"]:
        raise ConfigError(f"the audited images differ from those of the run in {out}; start a new run")
    _same_software(previous, out)


def _without_budget(config: dict[str, Any]) -> dict[str, Any]:
    """A run's configuration without ``max_memory``, which a resumed run may change (after running out
    of memory): it only sets how the passes are chunked."""
    return {k: v for k, v in config.items() if k != "max_memory"}


def _same_software(previous: dict[str, Any], out: Path) -> None:
    """Refuse to resume a run started with other versions of the software that computes it (the
    units would differ in the last bits from those already written)."""
    before, now = previous.get("versions"), versions()
    if not before:
        return
    changed = [f"{k} {before.get(k)} -> {now.get(k)}" for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    if changed:
        raise ConfigError(f"the run in {out} was started with other software ({', '.join(changed)}); its units would "
                          "differ from those written so far in the last bits: resume it with the versions it started "
                          "with, or start a new run")


def fingerprints(config: AuditConfig, x: torch.Tensor, y: torch.Tensor, twins: list[str] | None = None) -> dict[str, Any]:
    """sha256 of every file the models (and their ``twins``) are read from and of the audited images and labels."""
    files = {str(f): file_sha256(f) for spec in config.models for f in model_files(spec, config.weights)}
    files |= {str(f): file_sha256(f) for spec in twins or [] for f in model_files(spec)}
    data = array_sha256(x.cpu().numpy(), y.cpu().numpy())
    return {"files": files, "data": data}


def versions() -> dict[str, Any]:
    """The versions of the software that computed the results."""
    return {"python": platform.python_version(), "torch": torch.__version__, "captum": captum.__version__,
            "numpy": np.__version__, "scipy": scipy.__version__,
            "scikit-image": skimage.__version__,  # type: ignore[attr-defined]  # set at runtime, missing from its .pyi
            "pandas": pd.__version__}
