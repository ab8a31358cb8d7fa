"""Where a run's files live and how to read them back: unit files, joined results, the manifest."""
from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from audit.checks import CHECKS
from audit.errors import ConfigError
from audit.run.config import AuditConfig

MODELS_FILE = "models.csv"


@dataclass
class AuditResult:
    """The tables of a finished audit (``tables``: check name or "models" -> DataFrame) and where they live.

    Made by the run's last step (:func:`audit.run.finish.finish`) and by :func:`load_results`.

    Attributes
    ----------
    out : Path
        The run folder (``results/``, ``units/``, ``manifest.json``, the report).
    config : AuditConfig
        The run's validated configuration.
    tables : dict, default {}
        Check name -> its joined result table (``results/<result file>``, a ``model`` column first), and
        ``"models"`` -> the models table (``results/models.csv``). :func:`load_results` leaves out the checks
        whose table is missing or empty.
    manifest : dict, default {}
        The contents of ``manifest.json``: ``config``, ``status``, ``fingerprints``, ``seeds`` and what each
        contributor (:data:`audit.run.manifest.CONTRIBUTORS`) adds.
    """

    out: Path
    config: AuditConfig
    tables: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


def unit_path(out: Path, model: str, test: str, method: str) -> Path:
    """The file of one unit: ``units/<model>/<test>/<method>.csv`` (example heatmaps beside it as .npz)."""
    return out / "units" / model / test / f"{method}.csv"


def read_table(path: Path) -> pd.DataFrame:
    """A unit or result CSV; a file with no columns (an empty table) reads as an empty frame."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not a results table of ours ({type(exc).__name__}); delete it and rerun "
                          "with --resume to recompute it") from None


def read_manifest(out: Path) -> dict[str, Any]:
    """The run's ``manifest.json`` as a dict holding a ``config`` table, or a :class:`ConfigError`
    saying what is wrong with it (missing, not JSON, not a manifest of ours)."""
    path = out / "manifest.json"
    if not path.exists():
        raise ConfigError(f"{out} holds no audit run (no manifest.json); run `attribution-audit run --out {out}`")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable or not JSON ({type(exc).__name__}); it is not a manifest written "
                          "by an audit run") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise ConfigError(f"{path} is not a manifest of an audit run (no configuration table in it)")
    return manifest


def example_maps(out: Path, model: str, test: str, methods: list[str]) -> tuple[dict[str, np.ndarray],
                                                                               np.ndarray | None]:
    """The example heatmaps the run kept for ``model`` and ``test``, {method: (stages, images, H, W)},
    and the model inputs they explain, (images, C, H, W) (None when no map was kept)."""
    maps, images = {}, None
    for m in methods:
        path = unit_path(out, model, test, m).with_suffix(".npz")
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as npz:
                    maps[m] = npz["maps"]
                    images = npz["images"] if images is None and "images" in npz else images
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
                raise ConfigError(f"{path} is not example maps of ours ({type(exc).__name__}); delete it and rerun "
                                  "with --resume to recompute the unit") from None
    return maps, images


def load_results(out: str | os.PathLike[str]) -> AuditResult:
    """Read a finished run's tables back (for ``attribution-audit report``).

    Parameters
    ----------
    out : the run's folder
    """
    out = Path(out)
    manifest = read_manifest(out)
    if manifest.get("status") != "complete":
        raise ConfigError(f"the run in {out} did not finish; rerun it with --resume")
    try:
        config = AuditConfig.from_dict(manifest["config"], recorded=True).validated()
    except ConfigError as exc:
        raise ConfigError(f"{out / 'manifest.json'}: {exc}") from None
    tables = {}
    for name, check in CHECKS.items():
        path = out / "results" / check.result_file
        if path.exists():
            table = read_table(path)
            if not table.empty:
                tables[name] = table
    tables["models"] = read_table(out / "results" / MODELS_FILE)
    return AuditResult(out, config, tables, manifest)
