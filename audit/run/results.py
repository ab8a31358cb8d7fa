"""Where a run's files live and how to read them back: unit files, joined results, the manifest."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from audit.checks import CHECKS
from audit.errors import ConfigError
from audit.run.config import AuditConfig

MODELS_FILE = "models.csv"


@dataclass
class AuditResult:
    """The tables of a finished audit (``tables``: check name or "models" -> DataFrame) and where they live."""

    out: Path
    config: AuditConfig
    tables: dict = field(default_factory=dict)


def unit_path(out: Path, model: str, test: str, method: str) -> Path:
    """The file of one unit: ``units/<model>/<test>/<method>.csv`` (example heatmaps beside it as .npz)."""
    return out / "units" / model / test / f"{method}.csv"


def read_table(path: Path) -> pd.DataFrame:
    """A unit or result CSV; a file with no columns (an empty table) reads as an empty frame."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def example_maps(out: Path, model: str, test: str, methods: list[str]) -> tuple[dict[str, np.ndarray],
                                                                               np.ndarray | None]:
    """The example heatmaps the run kept for ``model`` and ``test``, {method: (stages, images, H, W)},
    and the model inputs they explain, (images, C, H, W) (None when no map was kept)."""
    maps, images = {}, None
    for m in methods:
        path = unit_path(out, model, test, m).with_suffix(".npz")
        if path.exists():
            with np.load(path, allow_pickle=False) as npz:
                maps[m] = npz["maps"]
                images = npz["images"] if images is None and "images" in npz else images
    return maps, images


def load_results(out: str | os.PathLike) -> AuditResult:
    """Read a finished run's tables back (for ``attribution-audit report``)."""
    out = Path(out)
    manifest_path = out / "manifest.json"
    if not manifest_path.exists():
        raise ConfigError(f"{out} holds no audit run (no manifest.json); run `attribution-audit run --out {out}`")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("status") != "complete":
        raise ConfigError(f"the run in {out} did not finish; rerun it with --resume")
    config = AuditConfig.from_dict(manifest["config"])
    tables = {}
    for name, check in CHECKS.items():
        path = out / "results" / check.result_file
        if path.exists():
            table = read_table(path)
            if not table.empty:
                tables[name] = table
    tables["models"] = read_table(out / "results" / MODELS_FILE)
    return AuditResult(out, config, tables)
