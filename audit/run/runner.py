"""The audit runner: models x checks x methods as resumable units, tidy tables, a manifest.

Each unit (one model, one check, one method) is computed with its own seed and written
atomically to ``DIR/units/<model>/<test>/<method>.csv``; ``resume`` skips the units already
written, so a run killed at any point finishes with the same files as an uninterrupted one.
The unit tables are then joined into ``DIR/results/<check's result file>`` beside ``manifest.json``.
What a unit computes, and how it is summarised, is the check's (:mod:`audit.checks`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import json
import os
import platform
import re
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import captum
import numpy as np
import pandas as pd
import scipy
import skimage
import torch
from torch import nn
from tqdm.auto import tqdm

from attributions import memory
from attributions.errors import AttributionError
from attributions.explainer import Explainer
from attributions.graph import trace
from audit.atomic import atomic_write_bytes, is_partial, remove_partials
from audit.checks import CHECKS, Check, UnitResult
from audit.checks.passes import given_params
from audit.data import balanced_sample
from audit.data.datasets import array_sha256, file_sha256, sample_image_folder
from audit.data.preprocess import preprocess_from
from audit.errors import ConfigError, ModelError
from audit.models.checkpoint import model_files, resolve_model
from audit.models.twins import same_architecture, twin_facts, twin_spec
from audit.run.config import AuditConfig
from audit.run.distributed import SINGLE, Shard
from audit.run.faults import kill_point
from audit.run.hygiene import untouched
from audit.run.patterns import PATTERN_METHODS, pattern_images, pattern_params
from audit.run.resources import Peak, budget_bytes
from audit.run.results import MODELS_FILE, AuditResult, load_results, read_manifest, read_table, unit_path
from bort import constraint_error


def label_for(spec: str) -> str:
    """A folder-safe label for a model specification."""
    base = Path(spec).stem if (os.sep in spec or spec.endswith(".pt")) else spec
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base)


def audit_images(config: AuditConfig) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``n_images`` class-balanced images of the configured data (see :func:`audit.data.balanced_sample`
    and, for "imagefolder", :func:`audit.data.datasets.sample_image_folder`), their labels, and
    what the manifest records about them (source, count, labels; the files, classes and
    preprocessing of an image folder)."""
    if config.data == "imagefolder":
        if config.data_root is None:
            raise ConfigError("data imagefolder needs data_root (--data-root): the folder with one sub-folder "
                              "per class")
        sample = sample_image_folder(config.data_root, config.n_images, config.seed, config.preprocess)
        x, y = sample.x, sample.y
        record = {"root": str(Path(config.data_root).resolve()), "files": sample.files, "classes": sample.classes,
                  "preprocess": preprocess_from(config.preprocess).to_dict()}
    else:
        x, y = balanced_sample(config.data, config.n_images, config.data_root)
        record = {}
    info = {"source": config.data, "n": len(x), "labels": y.tolist(), **record}
    return torch.from_numpy(x), torch.from_numpy(y), info


def _csv_bytes(df: pd.DataFrame) -> bytes:
    return df.to_csv(index=False, float_format="%.10g").encode()


def _run_unit(check: Check, model: nn.Module, x, y, method: str, config: AuditConfig, progress: bool,
              key: str, twin: nn.Module | None = None) -> UnitResult:
    if not check.applies(method) or (check.needs_twin and twin is None):  # no twin: the manifest says so
        return UnitResult(pd.DataFrame(columns=list(check.columns)))
    probe = Explainer(model, method)
    if probe.method.engine.fits(probe, x[:1]) is not None:  # an attention map of a CNN: the manifest says why
        return UnitResult(pd.DataFrame(columns=list(check.columns)))
    try:
        return check.run(model, x, y, method, config, progress, **({"twin": twin} if check.needs_twin else {}))
    except AttributionError as exc:  # the engine refused this model or these inputs: the audit's error, in context
        raise ModelError(f"{key}: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class WorkItem:
    """One model, check and method over the images [start, stop): a whole unit, or one block of it."""

    spec: str
    check: Check
    method: str
    start: int
    stop: int
    blocked: bool

    def unit(self, out: Path, labels: dict[str, str]) -> Path:
        return unit_path(out, labels[self.spec], self.check.name, self.method)

    def path(self, out: Path, labels: dict[str, str]) -> Path:
        """The unit's file, or for a block ``<method>@<start>-<stop>.csv`` beside it."""
        unit = self.unit(out, labels)
        return unit.with_name(f"{self.method}@{self.start}-{self.stop}.csv") if self.blocked else unit

    def key(self, labels: dict[str, str]) -> str:
        """"model/test/method", with "@start-stop" for a block: the seed's and the timings' key."""
        base = f"{labels[self.spec]}/{self.check.name}/{self.method}"
        return f"{base}@{self.start}-{self.stop}" if self.blocked else base


def work_items(units: list[tuple[str, Check, str]], n_images: int, block: int) -> list[WorkItem]:
    """The run's work in its fixed order: each unit whole, or (``block`` > 0, a check scored per image)
    as blocks of ``block`` images. The order and the blocks depend on the configuration only."""
    items = []
    for spec, check, method in units:
        split = block > 0 and check.per_image and block < n_images
        spans = memory.spans(n_images, block) if split else [(0, n_images)]
        items += [WorkItem(spec, check, method, a, b, split) for a, b in spans]
    return items


def _assemble(unit: Path, blocks: list[Path]) -> None:
    """Join a unit's block files (in image order) into its own files, unless a run killed after
    writing them left the blocks behind; then remove the blocks."""
    if not unit.exists():
        parts = []
        for m in (b.with_suffix(".npz") for b in blocks):
            if m.exists():
                with np.load(m) as npz:
                    parts.append((npz["maps"], npz["images"]))
        if parts:
            atomic_write_bytes(unit.with_suffix(".npz"), _npz_bytes(np.concatenate([p[0] for p in parts], axis=1),
                                                                    np.concatenate([p[1] for p in parts])))
        tables = [read_table(b) for b in blocks]
        filled = [t for t in tables if not t.empty]
        atomic_write_bytes(unit, _csv_bytes(_image_order(pd.concat(filled, ignore_index=True)) if filled
                                            else tables[0]))
    for b in blocks:  # the unit's file is written: the blocks are no longer needed
        b.unlink(missing_ok=True)
        b.with_suffix(".npz").unlink(missing_ok=True)


def _image_order(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a unit's blocks in the order of the whole unit: grouped by the columns before
    ``image`` (method, stage, layer), groups in order of first appearance, images ascending in each."""
    key = list(table.columns[: list(table.columns).index("image")])
    if not key:
        return table.sort_values("image", kind="stable", ignore_index=True)
    rank = table.groupby(key, sort=False, dropna=False).ngroup()
    return table.assign(_group=rank).sort_values(["_group", "image"], kind="stable", ignore_index=True) \
        .drop(columns="_group")


def remaining_seconds(left: list[tuple[str, str]], timings: dict[str, float]) -> float:
    """Seconds the units ``left`` ((test, method) pairs) should take, from the units measured so far
    (``timings``: "model/test/method" -> seconds): the mean of the same test and method on other
    models, else of the same test, else of every unit."""
    if not timings:
        return float("nan")
    by_pair: dict[tuple[str, str], list[float]] = {}
    by_test: dict[str, list[float]] = {}
    for key, v in timings.items():
        test, method = key.split("@")[0].split("/")[-2:]  # a model label holds no "/"; "@" marks a block
        by_pair.setdefault((test, method), []).append(v)
        by_test.setdefault(test, []).append(v)
    overall = sum(timings.values()) / len(timings)
    total = 0.0
    for test, method in left:
        same = by_pair.get((test, method)) or by_test.get(test)
        total += sum(same) / len(same) if same else overall
    return total


def _duration(seconds: float) -> str:
    if seconds != seconds:
        return "unknown"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def run_audit(config: AuditConfig, out: str | os.PathLike = "audit-report", resume: bool = False,
              progress: bool = True, log: Callable[[str], None] = print, shard: Shard = SINGLE) -> AuditResult:
    """Run every unit of ``config`` into ``out`` and join the results (see the module docstring).

    ``shard``: this process's share of a run over several (:mod:`audit.run.distributed`); the
    files are the same as one process's. The caller's process is left as it was: its global RNG state, its
    environment, no thread left running (:func:`audit.run.hygiene.untouched`).
    """
    with untouched():
        return _run_audit(config, out, resume, progress, log, shard)


def _run_audit(config: AuditConfig, out: str | os.PathLike, resume: bool, progress: bool, log: Callable[[str], None],
               shard: Shard) -> AuditResult:
    config = config.validated()
    out = Path(out)
    manifest_path = out / "manifest.json"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; give a folder for the audit's results")
    previous = _previous_manifest(out) if resume else None
    if _holds_files(out) and not resume:
        raise ConfigError(f"{out} is not empty; pass resume=True (--resume) to continue that run, or choose "
                          "another folder")
    labels = {spec: label_for(spec) for spec in config.models}
    clashes = sorted({lab for lab in labels.values() if list(labels.values()).count(lab) > 1})
    if clashes:  # results are keyed by label: the second model would overwrite the first's
        raise ConfigError(f"two models share the label {clashes[0]!r} ("
                          f"{', '.join(spec for spec, lab in labels.items() if lab == clashes[0])}); "
                          "rename one of the files")
    x, y, images = audit_images(config)
    # every model (and twin) is built before the folder is touched: one that cannot be refuses the run cleanly,
    # leaving no "running" manifest behind to block a corrected rerun
    loaded = {spec: load_model(spec, config) for spec in config.models}
    twin_specs, twin_models = _twins(config, loaded)
    patterns = pattern_images(config.pattern_data, config.data, config.pattern_images, config.seed, config.data_root) \
        if set(PATTERN_METHODS) & set(config.methods) else None
    prints = fingerprints(config, x, y, list(twin_specs.values()))
    if previous is not None:
        if _without_budget(previous["config"]) != _without_budget(json.loads(json.dumps(config.to_dict()))):
            raise ConfigError(f"{out} holds a run with another configuration; resume needs the same one")
        _same_inputs(previous.get("fingerprints", {}), prints, out)
    device = _device(config.device)
    if previous is not None:
        _same_software(previous, out)
    # one budget for every rank and every resume (unless a new one is given): the passes chunk alike;
    # one intra-op thread count too, the first start's: float32 kernels block their sums by it, so a
    # unit computed with another count differs in the last bits
    recorded = (previous or {}).get("memory", {}).get("budget_bytes")
    recorded_threads = (previous or {}).get("threads_per_process")
    agreed = shard.gather({"b": recorded if recorded is not None and config.max_memory is None
                           else budget_bytes(config.max_memory, device),
                           "t": recorded_threads or torch.get_num_threads()})[0]
    budget, threads = agreed["b"], agreed["t"]
    if threads != torch.get_num_threads():
        source = "as the run was started" if previous is not None else "as rank 0"
        log(f"computing with {threads} intra-op thread{'' if threads == 1 else 's'} per process, {source} (this "
            f"process has {torch.get_num_threads()}): the units of one run are computed alike, to the last bit")
    shard.barrier()  # every rank has checked the folder before the lead writes into it
    # everything checked: only now is the folder made, so a refused run leaves nothing behind
    if shard.lead:
        out.mkdir(parents=True, exist_ok=True)
    # a second run on this folder fails at once instead of interleaving results (the lead holds the lock)
    with exclusive(out) if shard.lead else contextlib.nullcontext(), intra_op_threads(threads):
        if shard.lead:
            remove_partials(out)  # a killed run's half-written files: never read, never kept
            atomic_write_bytes(manifest_path, json.dumps({"config": config.to_dict(), "status": "running",
                                                          "fingerprints": prints, "memory": {"budget_bytes": budget},
                                                          "threads_per_process": threads, "versions": versions()},
                                                         indent=2).encode())
        shard.barrier()
        x = x.to(device)
        peak = Peak(device)
        peaks: dict[str, float | None] = {}
        half = torch.bfloat16 if device.type == "cpu" else torch.float16
        units = [(spec, CHECKS[test], method) for spec in config.models for test in config.tests
                 for method in config.methods]
        items = work_items(units, len(x), config.image_block)
        timings = {}
        models: dict[str, nn.Module] = {}
        twins: dict[str, nn.Module] = {}  # per model with one, its permuted-label twin
        given: dict[str, dict[str, dict]] = {}  # per model, the parameters the run gives its methods
        bar = tqdm(items, desc="audit" if shard.world == 1 else f"audit (rank {shard.rank} of {shard.world})",
                   disable=not progress, position=shard.rank)
        # this process's work still to do, looked up once (a resumed run skips the rest)
        pending = [i for i, item in enumerate(items)
                   if shard.mine(i) and not item.path(out, labels).exists() and not item.unit(out, labels).exists()]
        todo = set(pending)
        written = 0
        for index, item in enumerate(bar):
            if index not in todo:
                continue
            spec, check, method = item.spec, item.check, item.method
            key = item.key(labels)
            if spec not in models:
                models[spec] = loaded[spec].to(device)
                given[spec] = pattern_params(list(config.methods), spec, models[spec], labels[spec], patterns,
                                            config.pattern_data, config.weights, out)
            if check.needs_twin and spec in twin_specs and spec not in twins:
                twins[spec] = twin_models[spec].to(device)
            torch.manual_seed(zlib.crc32(f"{config.seed}:{key}".encode()))
            xs, ys = x[item.start:item.stop], y[item.start:item.stop]
            shown = max(0, min(config.heatmap_examples - item.start, len(xs)))  # example heatmaps among these images
            part = dataclasses.replace(config, heatmap_examples=shown) if item.blocked else config
            start = time.perf_counter()
            with memory.limit(budget), peak.track(), given_params(given[spec]), \
                    torch.autocast(device.type, dtype=half, enabled=config.mixed_precision):
                result = _run_unit(check, models[spec], xs, ys, method, part, progress, key, twins.get(spec))
            timings[key] = round(time.perf_counter() - start, 3)
            peaks[key] = round(peak.nbytes / 2**20, 1) if peak.nbytes is not None else None
            table = result.table
            if item.start and "image" in table:
                table = table.assign(image=table["image"] + item.start)
            path = item.path(out, labels)
            if result.maps is not None and shown:
                atomic_write_bytes(path.with_suffix(".npz"), _npz_bytes(result.maps, xs[:shown].cpu().numpy()))
            atomic_write_bytes(path, _csv_bytes(table))  # last: its presence marks the work finished
            written += 1
            kill_point(written, shard.rank)
            line = check.summary(table) if not table.empty else \
                "no permuted-label twin: skipped" if check.needs_twin and spec not in twins else \
                f"does not apply to {method}: skipped"
            metric = getattr(check.verdict, "metric", None)
            if metric in table and table[metric].isna().any():  # say why the verdict may be undefined
                line += (f"; {int(table[metric].isna().sum())} of {len(table)} scores undefined "
                         "(maps constant or non-finite)")
            left = [(items[i].check.name, items[i].method) for i in pending if i > index]
            eta = remaining_seconds(left, timings)
            noun = "block" if config.image_block else "unit"
            (bar.write if progress else log)(f"{key}: {line} ({timings[key]:.1f} s; {len(left)} {noun}"
                                             f"{'' if len(left) == 1 else 's'} left"
                                             + (f", about {_duration(eta)})" if left else ")"))
        shard.barrier()  # every rank's units are written
        timings = {k: v for part in shard.gather(timings) for k, v in part.items()}
        peaks = {k: v for part in shard.gather(peaks) for k, v in part.items()}
        if not shard.lead:
            shard.barrier()  # the lead joins and writes the results and the manifest
            return load_results(out)
        blocks: dict[Path, list[Path]] = {}  # a unit computed in blocks: its blocks joined into the unit's files
        for item in items:
            if item.blocked:
                blocks.setdefault(item.unit(out, labels), []).append(item.path(out, labels))
        for unit, paths in blocks.items():
            _assemble(unit, paths)
        tables = _join(out, config, labels)
        for spec in config.models:  # units all resumed: the models were not needed until now
            if spec not in models:
                models[spec] = loaded[spec].to(device)
            if spec not in given:  # another rank's model, or a resumed one: where its patterns are kept
                given[spec] = pattern_params(list(config.methods), spec, models[spec], labels[spec], patterns,
                                            config.pattern_data, config.weights, out)
        twin_record, skipped = _twin_record(config, labels, twin_specs, twin_models, log)
        coverage = _coverage(config, models, labels, x, out, log)
        conventions, unfit = _conventions(config, models, labels, x, log)
        # in the run's order, whichever process loaded which model first
        info = model_table({spec: models[spec] for spec in config.models}, labels, x, y)
        atomic_write_bytes(out / "results" / MODELS_FILE, _csv_bytes(info))
        tables["models"] = info
        old = previous.get("timings_s", {}) if previous is not None else {}  # the units timed before the resume
        old_peaks = previous.get("memory", {}).get("peak_mb", {}) if previous is not None else {}
        memory_record = {"budget_bytes": budget, "peak_mb": {**old_peaks, **peaks},
                         "peak_of": "allocated GPU memory" if device.type == "cuda" else "resident memory of the process"}
        precision: dict[str, object] = {"mixed": config.mixed_precision}
        if config.mixed_precision:
            precision |= {"dtype": str(half).removeprefix("torch."),
                          "agreement": half_precision_agreement(models, labels, list(config.methods), x, y, half, log)}
        # a library's model: which library, its version, the weight files' sha256
        sources = {spec: models[spec].metadata for spec in config.models
                   if "library" in (getattr(models[spec], "metadata", None) or {})}
        manifest = {"config": config.to_dict(), "status": "complete", "fingerprints": prints, "seeds": {"audit": config.seed},
                    **({"model_sources": sources} if sources else {}), **({"coverage": coverage} if coverage else {}),
                    **({"twins": twin_record} if twin_record else {}), **({"skipped": skipped} if skipped else {}),
                    **({"conventions": conventions} if conventions else {}),
                    **({"not_applicable": unfit} if unfit else {}),
                    **({"patterns": _patterns_record(patterns, given, labels)} if patterns is not None else {}),
                    "images": images, "memory": memory_record, "precision": precision,
                    # float32 kernels block their sums by thread count: the last bits depend on it
                    "processes": shard.world, "threads_per_process": threads,
                    "versions": versions(), "timings_s": {**old, **timings},
                    "units": len(units), "results": sorted(str(p.relative_to(out)) for p in (out / "results").glob("*.csv"))}
        atomic_write_bytes(manifest_path, json.dumps(manifest, indent=2).encode())
        shard.barrier()
        return AuditResult(out, config, tables, json.loads(json.dumps(manifest)))


def _twins(config: AuditConfig, models: dict[str, nn.Module]) -> tuple[dict[str, str], dict[str, nn.Module]]:
    """({model spec: twin spec}, {model spec: the loaded twin}) for the models that have a twin, when a run's check
    needs one; every pair checked (the twin loads, its architecture is the model's, ``models`` holding the loaded
    models) before the run starts."""
    if not any(CHECKS[t].needs_twin for t in config.tests):
        return {}, {}
    unknown = sorted(set(config.twins) - set(config.models))
    if unknown:
        raise ConfigError(f"twins names {', '.join(unknown)}, not among the audited models ({', '.join(config.models)})")
    specs = {spec: twin for spec in config.models if (twin := twin_spec(spec, config.twins)) is not None}
    return specs, {spec: load_twin(spec, twin, models[spec]) for spec, twin in specs.items()}


def load_model(spec: str, config: AuditConfig) -> nn.Module:
    """The model ``spec`` names, with the run's weights, classes and partial-weights policy."""
    return resolve_model(spec, config.weights, config.num_classes, partial=config.allow_partial_weights)


def load_twin(spec: str, twin: str, model: nn.Module) -> nn.Module:
    """The twin ``twin`` of the model ``spec`` (already loaded as ``model``), refused when its architecture
    differs."""
    try:
        loaded = resolve_model(twin)
    except ModelError as exc:
        raise ConfigError(f"the twin of {spec}: {exc}") from None
    same_architecture(model, loaded, spec, twin)
    return loaded


def _twin_record(config: AuditConfig, labels: dict[str, str], specs: dict[str, str], twins: dict[str, nn.Module],
                 log: Callable[[str], None]) -> tuple[dict[str, dict], dict[str, dict[str, str]]]:
    """({model label: its twin and the twin's training facts}, {test: {model label: why it was skipped}}) for the
    checks that need a twin; a line for every model skipped."""
    record: dict[str, dict] = {}
    skipped: dict[str, dict[str, str]] = {}
    for name in (t for t in config.tests if CHECKS[t].needs_twin):
        for spec in config.models:
            if spec in specs:
                record[labels[spec]] = {"spec": specs[spec], **twin_facts(twins[spec])}
                continue
            why = ("no permuted-label twin: give one with twins (--twins MODEL=TWIN), trained by attribution-audit "
                   "train --permute-labels SEED --twin-of MODEL")
            skipped.setdefault(name, {})[labels[spec]] = why
            log(f"{labels[spec]}/{name}: skipped, {why}")
    return record, skipped


def _coverage(config: AuditConfig, models: dict[str, nn.Module], labels: dict[str, str], x: torch.Tensor, out: Path,
              log: Callable[[str], None]) -> dict[str, dict[str, dict]]:
    """Write each check's coverage rows (what its stages re-initialised in every model) beside its
    results; {test: {model label: summary}} for the manifest, with a line for every tensor left trained."""
    record: dict[str, dict[str, dict]] = {}
    for name in config.tests:
        check = CHECKS[name]
        if check.coverage is None:
            continue
        frames = []
        for spec in config.models:
            table, summary = check.coverage(models[spec], x, config)
            frames.append(table.assign(model=labels[spec])[["model", *table.columns]])
            record.setdefault(name, {})[labels[spec]] = summary
            if summary["kept_trained"]:
                log(f"{labels[spec]}/{name}: {len(summary['kept_trained'])} parameter tensors stay trained through "
                    f"every stage ({1 - summary['share_reinitialised']:.1%} of the parameters), e.g. "
                    f"{', '.join(summary['kept_trained'][:3])}")
        atomic_write_bytes(out / "results" / check.coverage_file, _csv_bytes(pd.concat(frames, ignore_index=True)))
    return record


def _conventions(config: AuditConfig, models: dict[str, nn.Module], labels: dict[str, str], x: torch.Tensor,
                 log: Callable[[str], None]) -> tuple[dict[str, dict[str, dict]], dict[str, dict[str, str]]]:
    """({method: {model label: the choices the method made on that model}} for the methods whose conventions
    depend on the model (Grad-CAM's layer), {method: {model label: why it does not apply}} for the methods
    that do not fit a model (an attention map of a CNN: their units are empty)), read on one image."""
    chosen: dict[str, dict[str, dict]] = {}
    unfit: dict[str, dict[str, str]] = {}
    for name in config.methods:
        for spec in config.models:
            ex = Explainer(models[spec], name)
            reason = ex.method.engine.fits(ex, x[:1])
            if reason is not None:
                unfit.setdefault(name, {})[labels[spec]] = reason
                log(f"{labels[spec]}/{name}: not applicable ({reason}); its units are empty")
                continue
            facts = ex.method.engine.conventions(ex, x[:1])
            if facts:
                chosen.setdefault(name, {})[labels[spec]] = facts
    return chosen, unfit


def half_precision_agreement(models: dict[str, nn.Module], labels: dict[str, str], methods: list[str], x: torch.Tensor,
                             y: torch.Tensor, half: torch.dtype, log: Callable[[str], None]) -> dict[str, float]:
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
            out[f"{labels[spec]}/{method}"] = round(float(cos.min()), 6)
            if out[f"{labels[spec]}/{method}"] < 0.99:
                log(f"mixed precision: {labels[spec]}/{method} maps move from float32 (cosine "
                    f"{out[f'{labels[spec]}/{method}']:.3f}); audit this method in float32")
    return out


def _patterns_record(patterns: tuple[torch.Tensor, str], given: dict[str, dict[str, dict]],
                     labels: dict[str, str]) -> dict:
    """What the manifest says of the pattern methods' patterns: the images, and per model the file kept."""
    files = {labels[spec]: str(next(iter(params.values()))["cache"]) for spec, params in given.items() if params}
    return {"data": patterns[1], "n": len(patterns[0]), "files": files}


def _without_budget(config: dict) -> dict:
    """A run's configuration without ``max_memory``, which a resumed run may change (after running out
    of memory): it only sets how the passes are chunked."""
    return {k: v for k, v in config.items() if k != "max_memory"}


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


@contextlib.contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` for the duration, then restored."""
    before = torch.get_num_threads()
    if threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _same_software(previous: dict, out: Path) -> None:
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


def fingerprints(config: AuditConfig, x: torch.Tensor, y: torch.Tensor, twins: list[str] | None = None) -> dict:
    """sha256 of every file the models (and their ``twins``) are read from and of the audited images and labels."""
    files = {str(f): file_sha256(f) for spec in config.models for f in model_files(spec, config.weights)}
    files |= {str(f): file_sha256(f) for spec in twins or [] for f in model_files(spec)}
    data = array_sha256(x.cpu().numpy(), y.cpu().numpy())
    return {"files": files, "data": data}


def _holds_files(out: Path) -> bool:
    """Whether ``out`` holds anything besides our lock and the temporary files of killed writes (a
    run that failed at its first write leaves only those, and must not block a rerun)."""
    return out.is_dir() and any(p.name != ".lock" and not is_partial(p) for p in out.iterdir())


def _previous_manifest(out: Path) -> dict | None:
    """The manifest of the run to resume: None for an empty or missing folder; a refusal for a folder
    that holds something else (so that resuming never overwrites files that are not ours)."""
    if not _holds_files(out):
        return None
    try:
        return read_manifest(out)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; resume only continues a folder written by run_audit, choose another folder") \
            from None


def _same_inputs(before: dict, now: dict, out: Path) -> None:
    for name, digest in before.get("files", {}).items():
        if now["files"].get(name) != digest:
            raise ConfigError(f"{name} changed since the run in {out} started (sha256 differs); resuming would mix "
                              "results of two models: start a new run")
    if "data" in before and before["data"] != now["data"]:
        raise ConfigError(f"the audited images differ from those of the run in {out}; start a new run")


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but torch sees no CUDA device here; use --device cpu")
    return torch.device(name)


def _npz_bytes(maps: np.ndarray, images: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, maps=maps.astype(np.float32), images=images.astype(np.float32))
    return buffer.getvalue()


def _join(out: Path, config: AuditConfig, labels: dict) -> dict[str, pd.DataFrame]:
    tables = {}
    for test in config.tests:
        check = CHECKS[test]
        parts = []
        for spec in config.models:
            for method in config.methods:
                df = read_table(unit_path(out, labels[spec], test, method))
                if not df.empty:
                    parts.append(df.assign(model=labels[spec]))
        table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(check.columns))
        table = table[["model"] + [c for c in table.columns if c != "model"]] if parts else table
        atomic_write_bytes(out / "results" / check.result_file, _csv_bytes(table))
        tables[test] = table
    return tables


def model_table(models: dict, labels: dict, x: torch.Tensor, y: torch.Tensor) -> pd.DataFrame:
    """Per model: recorded training facts, accuracy on the audit images, constraint error."""
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
                     "audit_accuracy": float((pred.cpu() == y).double().mean())})
    return pd.DataFrame(rows)


def versions() -> dict:
    """The versions of the software that computed the results."""
    return {"python": platform.python_version(), "torch": torch.__version__, "captum": captum.__version__,
            "numpy": np.__version__, "scipy": scipy.__version__,
            "scikit-image": skimage.__version__,  # type: ignore[attr-defined]  # set at runtime, missing from its .pyi
            "pandas": pd.__version__}
