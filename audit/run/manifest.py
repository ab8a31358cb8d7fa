"""What a finished run's manifest records beyond its configuration: one contributor per fact.

A contributor is a function ``(run, ledger) -> {manifest key: value}`` (the run as planned, what its execution
did) (an empty dict when it has nothing to say);
:data:`CONTRIBUTORS` lists them in the manifest's order. Adding a fact to the manifest adds a function here.
Contributors run on the lead process after the units are joined, with every model on the device.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

from attributions.explainer import Explainer
from attributions.graph import trace
from audit.atomic import atomic_write_bytes
from audit.checks import CHECKS
from audit.checks.options import look_level
from audit.models.cautions import completeness_gap
from audit.models.twins import twin_facts
from audit.run.folder import versions
from audit.run.ledger import Ledger
from audit.run.plan import Run
from audit.run.units import csv_bytes
from bort import constraint_error

Contributor = Callable[[Run, Ledger], dict[str, Any]]


def model_sources(run: Run, ledger: Ledger) -> dict[str, Any]:
    """A library's model: which library, its version, the weight files' sha256."""
    sources = {spec: model.metadata for spec, model in ledger.placed.every().items()
               if "library" in (getattr(model, "metadata", None) or {})}
    return {"model_sources": sources} if sources else {}


def cautions(run: Run, ledger: Ledger) -> dict[str, Any]:
    """What a reader must know of the models (a weight cast on loading, a hook not read to the end), as logged."""
    return {"warnings": run.warnings} if run.warnings else {}


def coverage(run: Run, ledger: Ledger) -> dict[str, Any]:
    """Each check's coverage rows (what its stages re-initialised in every model), written beside its results;
    {test: {model label: summary}}, with a line for every tensor left trained."""
    record: dict[str, dict[str, dict[str, Any]]] = {}
    for name in run.config.tests:
        check = CHECKS[name]
        if check.coverage is None:
            continue
        frames = []
        for spec in run.config.models:
            table, summary = check.coverage(ledger.placed.model(spec), run.x, run.options[name], run.config.seed)
            label = run.labels[spec]
            frames.append(table.assign(model=label)[["model", *table.columns]])
            record.setdefault(name, {})[label] = summary
            if summary["kept_trained"]:
                run.log(f"{label}/{name}: {len(summary['kept_trained'])} parameter tensors stay trained through "
                        f"every stage ({1 - summary['share_reinitialised']:.1%} of the parameters), e.g. "
                        f"{', '.join(summary['kept_trained'][:3])}")
        atomic_write_bytes(run.out / "results" / check.coverage_file, csv_bytes(pd.concat(frames, ignore_index=True)))
    return {"coverage": record} if record else {}


def twins(run: Run, ledger: Ledger) -> dict[str, Any]:
    """For the checks that need a twin: each model's twin pairs ("twins": {model: {"pairs": [...]}}, each pair's
    permuted-label twin and its training facts, with its control twin's under "control" where there is one), and
    why the models without a twin were skipped ("skipped", a line for each)."""
    record: dict[str, dict[str, Any]] = {}
    skipped: dict[str, dict[str, str]] = {}
    shortcuts: dict[str, dict[str, Any]] = {}
    for name in (t for t in run.config.tests if CHECKS[t].twins == "shortcut"):
        for spec in run.config.models:
            if spec in run.shortcuts:
                shortcuts[run.labels[spec]] = run.shortcuts[spec].record()
                continue
            why = ("no shortcut twins: train them with attribution-audit train --shortcut SPEC --twin-of MODEL --out "
                   "OUT and give them with shortcuts (--shortcuts MODEL=OUT)")
            skipped.setdefault(name, {})[run.labels[spec]] = why
            run.log(f"{run.labels[spec]}/{name}: skipped, {why}")
    for name in (t for t in run.config.tests if CHECKS[t].twins == "labels"):
        for spec in run.config.models:
            label = run.labels[spec]
            if spec in run.twin_specs:
                pairs = [{"spec": twin_spec, **twin_facts(twin)}
                         for twin_spec, twin in zip(run.twin_specs[spec], run.twin_models[spec])]
                for pair, control_spec, control in zip(pairs, run.control_specs.get(spec, ()),
                                                       run.control_models.get(spec, ())):
                    pair["control"] = {"spec": control_spec, **twin_facts(control)}
                record[label] = {"pairs": pairs}
                if spec not in run.control_specs:
                    run.log(f"{label}/{name}: no control twin (give one with controls, --controls MODEL=CONTROL): "
                            "the verdict reads the twin on the controls' scale alone")
                continue
            why = ("no permuted-label twin: give one with twins (--twins MODEL=TWIN), trained by attribution-audit "
                   "train --permute-labels SEED --twin-of MODEL")
            skipped.setdefault(name, {})[label] = why
            run.log(f"{label}/{name}: skipped, {why}")
    return {**({"twins": record} if record else {}), **({"shortcuts": shortcuts} if shortcuts else {}),
            **({"skipped": skipped} if skipped else {})}


def conventions(run: Run, ledger: Ledger) -> dict[str, Any]:
    """The choices each method made on each model where they depend on it (Grad-CAM's layer: "conventions"), and
    why a method does not fit a model (an attention map of a CNN, whose units are empty: "not_applicable"),
    read on one image."""
    chosen: dict[str, dict[str, dict[str, Any]]] = {}
    unfit: dict[str, dict[str, str]] = {}
    for name in run.config.methods:
        for spec in run.config.models:
            ex = Explainer(ledger.placed.model(spec), name)
            reason = ex.method.engine.fits(ex, run.x[:1])
            if reason is not None:
                unfit.setdefault(name, {})[run.labels[spec]] = reason
                run.log(f"{run.labels[spec]}/{name}: not applicable ({reason}); its units are empty")
                continue
            facts = ex.method.engine.conventions(ex, run.x[:1])
            if facts:
                chosen.setdefault(name, {})[run.labels[spec]] = facts
    return {**({"conventions": chosen} if chosen else {}), **({"not_applicable": unfit} if unfit else {})}


def patterns(run: Run, ledger: Ledger) -> dict[str, Any]:
    """The pattern methods' patterns: the images they were fitted on, and per model the file kept."""
    if run.patterns is None:
        return {}
    files = {run.labels[spec]: str(next(iter(params.values()))["cache"]) for spec, params in ledger.placed.given.items()
             if params}
    return {"patterns": {"data": run.patterns[1], "n": len(run.patterns[0]), "files": files}}


def images(run: Run, ledger: Ledger) -> dict[str, Any]:
    return {"images": run.images}


def memory(run: Run, ledger: Ledger) -> dict[str, Any]:
    """The budget, and the peak of every unit (those of the run resumed too)."""
    old_peaks = run.previous.get("memory", {}).get("peak_mb", {}) if run.previous is not None else {}
    return {"memory": {"budget_bytes": run.budget, "peak_mb": {**old_peaks, **ledger.peaks},
                       "peak_of": "allocated GPU memory" if run.device.type == "cuda" else "resident memory of the process"}}


def precision(run: Run, ledger: Ledger) -> dict[str, Any]:
    """Whether the maps were computed in mixed precision, and then how far each method's maps move from float32."""
    record: dict[str, object] = {"mixed": run.config.mixed_precision}
    if run.config.mixed_precision:
        record |= {"dtype": str(run.half).removeprefix("torch."),
                   "agreement": half_precision_agreement(ledger.placed.every(), run.labels, list(run.config.methods),
                                                         run.x, run.y, half=run.half, log=run.log)}
    return {"precision": record}


def software(run: Run, ledger: Ledger) -> dict[str, Any]:
    """The processes and threads (float32 kernels block their sums by thread count: the last bits depend on
    it), the versions, and the time of every unit (those of the run resumed too)."""
    old = run.previous.get("timings_s", {}) if run.previous is not None else {}
    return {"processes": run.shard.world, "threads_per_process": run.threads, "versions": versions(),
            "timings_s": {**old, **ledger.timings}}


def units(run: Run, ledger: Ledger) -> dict[str, Any]:
    """How many units, and the result files written."""
    return {"units": len({(i.spec, i.check.name, i.method) for i in ledger.items}),
            "results": sorted(str(p.relative_to(run.out)) for p in (run.out / "results").glob("*.csv"))}


def design(run: Run, ledger: Ledger) -> dict[str, Any]:
    """A sequential run's design (:attr:`~audit.run.config.AuditConfig.max_images`): its looks, each look's
    interval level and the images each model x check x method cell read before it was decided or the budget
    was spent ("sequential"); nothing for a run of one look."""
    config = run.config
    if config.looks == 1:
        return {}
    read: dict[str, int] = {}
    for item in ledger.items:
        key = f"{run.labels[item.spec]}/{item.check.name}/{item.method}"
        read[key] = max(read.get(key, 0), item.stop)
    return {"sequential": {"looks": config.looks, "look_images": config.n_images, "max_images": config.max_images,
                           "level": look_level(config.looks, config.family),
                           "correction": "Bonferroni over the looks and the readings",
                           "images": read}}


CONTRIBUTORS: tuple[Contributor, ...] = (model_sources, cautions, coverage, twins, conventions, patterns, images, memory,
                                         precision, design, software, units)


def half_precision_agreement(models: Mapping[str, nn.Module], labels: Mapping[str, str], methods: list[str], x: torch.Tensor,
                             y: torch.Tensor, *, half: torch.dtype, log: Callable[[str], None]) -> dict[str, float]:
    """Per model and method, the lowest cosine similarity over the first two images between their maps
    under autocast to ``half`` and in float32 (1: unchanged); a warning for those under 0.99."""
    out = {}
    for spec, model in models.items():
        graph = trace(model, x[:2])
        for method in methods:
            ex = Explainer(model, method, graph=graph)
            maps = []
            for enabled in (False, True):
                torch.manual_seed(0)  # the noise of SmoothGrad and the random control: drawn alike both times
                with torch.autocast(x.device.type, dtype=half, enabled=enabled):
                    maps.append(ex.attribute(x[:2], target=y[:2].to(x.device)).flatten(1).double())
            cos = torch.nn.functional.cosine_similarity(maps[0], maps[1], dim=1, eps=1e-30)
            key = f"{labels[spec]}/{method}"
            out[key] = round(float(cos.min()), 6)
            if out[key] < 0.99:
                log(f"mixed precision: {key} maps move from float32 (cosine {out[key]:.3f}); audit this method in "
                    "float32")
    return out


def model_table(models: dict[str, nn.Module], labels: Mapping[str, str], x: torch.Tensor, y: torch.Tensor,
                methods: Sequence[str] = ()) -> pd.DataFrame:
    """Per model: recorded training facts, accuracy on the audit images, constraint error; where ``methods`` holds a
    method whose maps must sum to f(x) - f(x0) exactly (DeepLIFT, RevealCancel), the gap measured on the first
    :data:`GAP_IMAGES` images (``completeness_gap``: a model's own rounding, large where it divides by a small
    difference in float32)."""
    exact = [m for m in EXACT_SUMS if m in methods]
    rows = []
    for spec, model in models.items():
        meta = getattr(model, "metadata", {}) or {}
        err = constraint_error(model)
        with torch.no_grad():
            pred = Explainer(model, "gradient").forward(x).argmax(1)
        rows.append({"model": labels[spec], "arch": meta.get("arch", type(model).__name__),
                     "optimizer": meta.get("optimizer", "unknown"), "test_accuracy": meta.get("test_accuracy"),
                     "epochs": meta.get("epochs"), "orth_error_mean": float(err.orth_error.mean()) if len(err) else None,
                     "orth_error_max": float(err.orth_error.max()) if len(err) else None,
                     "audit_accuracy": float((pred.cpu() == y).double().mean())}
                    | {f"{m}_completeness_gap": completeness_gap(model, x[:GAP_IMAGES], m) for m in exact})
    return pd.DataFrame(rows)


GAP_IMAGES = 2  # the images a completeness gap is measured on: rounding, not a statistic over images
EXACT_SUMS = ("deeplift", "deeplift-revealcancel")  # rules that distribute f(x) - f(x0) exactly, to rounding

