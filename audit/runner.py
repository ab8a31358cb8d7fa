"""The audit runner: models x methods x tests as resumable units, tidy tables, a manifest.

Each unit (one model, one test, one method) is computed with its own seed and written
atomically to ``DIR/units/<model>/<test>/<method>.csv``; ``resume`` skips the units already
written, so a run killed at any point finishes with the same files as an uninterrupted one.
The unit tables are then joined into ``DIR/results/<test>.csv`` beside ``manifest.json``.
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import re
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from audit.atomic import atomic_write_bytes
from audit.config import AuditConfig
from audit.errors import ConfigError, ModelError

RESULT_FILES = {"csc": "csc.csv", "random-logit": "random_logit.csv", "cascading": "randomization_cascading.csv",
                "independent": "randomization_independent.csv", "bottom-up": "randomization_bottom_up.csv"}


@dataclass
class AuditResult:
    """The tables of a finished audit (``tables``: name -> DataFrame) and where they live."""

    out: Path
    config: AuditConfig
    tables: dict = field(default_factory=dict)

    def write_report(self, directory: str | os.PathLike | None = None) -> Path:
        """Write index.html, report.md, tables.tex and figures/ (default: the run folder)."""
        from reports import build_report

        return build_report(self.out, Path(directory) if directory else self.out)


def label_for(spec: str) -> str:
    """A folder-safe label for a model specification."""
    base = Path(spec).stem if (os.sep in spec or spec.endswith(".pt")) else spec
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base)


def resolve_model(spec: str, weights: str | None = None) -> nn.Module:
    """A shipped checkpoint name, a checkpoint path, or ``module:factory`` (weights from ``weights``)."""
    from audit.zoo import load_checkpoint

    if ":" in spec and not Path(spec).exists():
        module_name, _, factory = spec.partition(":")
        try:
            model = getattr(importlib.import_module(module_name), factory)()
        except (ImportError, AttributeError) as exc:
            raise ModelError(f"cannot build {spec!r}: {exc}; give module:factory with an importable module "
                             "and a function returning an nn.Module") from exc
        if not isinstance(model, nn.Module):
            raise ModelError(f"{spec!r} returned {type(model).__name__}, not an nn.Module")
        if weights:
            try:
                model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
            except Exception as exc:
                raise ModelError(f"cannot load weights {weights} into {spec!r}: {exc}") from exc
        return model.eval()
    return load_checkpoint(spec)


def audit_images(config: AuditConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_images`` class-balanced images: the first of each class in order, round-robin."""
    from audit.data import embedded_sample, load_dataset

    if config.data == "embedded":
        x, y = embedded_sample()
    else:
        x, y = load_dataset(config.data, "test", config.data_root)
    order = []
    per_class = {c: list(np.flatnonzero(y == c)) for c in np.unique(y)}
    while len(order) < config.n_images and any(per_class.values()):
        for c in sorted(per_class):
            if per_class[c] and len(order) < config.n_images:
                order.append(per_class[c].pop(0))
    idx = np.array(order)
    return torch.from_numpy(x[idx]), torch.from_numpy(y[idx])


def _csv_bytes(df: pd.DataFrame) -> bytes:
    return df.to_csv(index=False, float_format="%.10g").encode()


def _run_unit(test: str, model: nn.Module, x, y, method: str, config: AuditConfig, progress: bool = False):
    from audit import chain_convergence, parameter_randomization, random_logit_test
    from attributions.methods import build_method

    if test == "csc":
        if not build_method(method).chain:
            return pd.DataFrame(), None
        return chain_convergence(model, x, y, [method], n_vectors=config.n_vectors, seed=config.seed,
                                 threshold=config.csc_threshold, progress=progress), None
    if test == "random-logit":
        return random_logit_test(model, x, y, [method], seed=config.seed, progress=progress), None
    return parameter_randomization(model, x, y, [method], order=test, bn=config.bn, target=config.target,
                                   seed=config.seed, progress=progress, keep_maps=config.heatmap_examples)


def _summary_line(test: str, df: pd.DataFrame) -> str:
    if df.empty:
        return "not a backward chain: skipped"
    if test == "csc":
        top = df[df.inject_at == df.inject_at.iloc[0]]
        return f"min median |cos| {top['median'].min():.3f}, max {top['median'].max():.3f}"
    if test == "random-logit":
        return f"median SSIM {df.ssim.median():.3f}"
    last = df[df.stage == df.stage.max()]
    return f"median SSIM at full randomization {last.ssim.median():.3f}"


def run_audit(config: AuditConfig, out: str | os.PathLike = "audit-report", resume: bool = False,
              progress: bool = True, log=print) -> AuditResult:
    """Run every unit of ``config`` into ``out`` and join the results (see the module docstring)."""
    config = config.validated()
    out = Path(out)
    manifest_path = out / "manifest.json"
    if out.exists() and any(out.iterdir()) and not resume:
        raise ConfigError(f"{out} is not empty; pass resume=True (--resume) to continue that run, or choose "
                          "another folder")
    if resume and manifest_path.exists():
        previous = json.loads(manifest_path.read_text())["config"]
        if previous != json.loads(json.dumps(asdict(config))):
            raise ConfigError(f"{out} holds a run with another configuration; resume needs the same one")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(manifest_path, json.dumps({"config": asdict(config), "status": "running"}, indent=2).encode())
    device = _device(config.device)
    x, y = audit_images(config)
    x = x.to(device)
    labels = {spec: label_for(spec) for spec in config.models}
    units = [(spec, test, method) for spec in config.models for test in config.tests for method in config.methods]
    timings = {}
    models: dict[str, nn.Module] = {}
    bar = tqdm(units, desc="audit", disable=not progress)
    for spec, test, method in bar:
        unit = out / "units" / labels[spec] / test / f"{method}.csv"
        key = f"{labels[spec]}/{test}/{method}"
        if unit.exists():
            continue
        if spec not in models:
            models[spec] = resolve_model(spec, config.weights).to(device)
        torch.manual_seed(zlib.crc32(f"{config.seed}:{key}".encode()))
        start = time.perf_counter()
        df, maps = _run_unit(test, models[spec], x, y, method, config, progress)
        timings[key] = round(time.perf_counter() - start, 3)
        if maps is not None and config.heatmap_examples:
            buffer = _npz_bytes(maps[method], x[: config.heatmap_examples].cpu().numpy())
            atomic_write_bytes(unit.with_suffix(".npz"), buffer)
        atomic_write_bytes(unit, _csv_bytes(df))  # last: its presence marks the unit finished
        (bar.write if progress else log)(f"{key}: {_summary_line(test, df)} ({timings[key]:.1f} s)")
    tables = _join(out, config, labels)
    for spec in config.models:  # units all resumed: the models were not needed until now
        if spec not in models:
            models[spec] = resolve_model(spec, config.weights).to(device)
    info = model_table(models, labels, x, y)
    atomic_write_bytes(out / "results" / "models.csv", _csv_bytes(info))
    tables["models"] = info
    old = json.loads(manifest_path.read_text()).get("timings_s", {}) if resume and manifest_path.exists() else {}
    manifest = {"config": asdict(config), "status": "complete", "seeds": {"audit": config.seed},
                "images": {"source": config.data, "n": len(x), "labels": y.tolist()},
                "versions": versions(), "timings_s": {**old, **timings},
                "units": len(units), "results": sorted(str(p.relative_to(out)) for p in (out / "results").glob("*.csv"))}
    atomic_write_bytes(manifest_path, json.dumps(manifest, indent=2).encode())
    return AuditResult(out, config, tables)


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but torch sees no CUDA device here; use --device cpu")
    return torch.device(name)


def _npz_bytes(maps: np.ndarray, images: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.savez_compressed(buffer, maps=maps.astype(np.float32), images=images.astype(np.float32))
    return buffer.getvalue()


def _join(out: Path, config: AuditConfig, labels: dict) -> dict[str, pd.DataFrame]:
    tables = {}
    for test in config.tests:
        parts = []
        for spec in config.models:
            for method in config.methods:
                path = out / "units" / labels[spec] / test / f"{method}.csv"
                if path.stat().st_size > 1:
                    df = pd.read_csv(path)
                    if not df.empty:
                        parts.append(df.assign(model=labels[spec]))
        table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        if not table.empty:
            table = table[["model"] + [c for c in table.columns if c != "model"]]
        atomic_write_bytes(out / "results" / RESULT_FILES[test], _csv_bytes(table))
        tables[test] = table
    return tables


def model_table(models: dict, labels: dict, x: torch.Tensor, y: torch.Tensor) -> pd.DataFrame:
    """Per model: recorded training facts, accuracy on the audit images, constraint error."""
    from bort.metrics import constraint_error

    rows = []
    for spec, model in models.items():
        meta = getattr(model, "metadata", {}) or {}
        err = constraint_error(model)
        with torch.no_grad():
            from attributions import Explainer
            pred = Explainer(model, "gradient").forward(x).argmax(1)
        rows.append({"model": labels[spec], "arch": meta.get("arch", type(model).__name__),
                     "optimizer": meta.get("optimizer", "unknown"), "test_accuracy": meta.get("test_accuracy"),
                     "epochs": meta.get("epochs"), "orth_error_mean": float(err.orth_error.mean()) if len(err) else None,
                     "orth_error_max": float(err.orth_error.max()) if len(err) else None,
                     "audit_accuracy": float((pred.cpu() == y).double().mean())})
    return pd.DataFrame(rows)


def versions() -> dict:
    import captum
    import scipy
    import skimage

    return {"python": platform.python_version(), "torch": torch.__version__, "captum": captum.__version__,
            "numpy": np.__version__, "scipy": scipy.__version__, "scikit-image": skimage.__version__,
            "pandas": pd.__version__}


def load_results(out: str | os.PathLike) -> AuditResult:
    """Read a finished run's tables back (for ``attribution-audit report``)."""
    out = Path(out)
    manifest_path = out / "manifest.json"
    if not manifest_path.exists():
        raise ConfigError(f"{out} holds no audit run (no manifest.json); run `attribution-audit run --out {out}`")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("status") != "complete":
        raise ConfigError(f"the run in {out} did not finish; rerun it with --resume")
    config = AuditConfig(**manifest["config"])
    tables = {}
    for test, name in RESULT_FILES.items():
        path = out / "results" / name
        if path.exists() and path.stat().st_size > 1:
            tables[test] = pd.read_csv(path)
    tables["models"] = pd.read_csv(out / "results" / "models.csv")
    return AuditResult(out, config, tables)
