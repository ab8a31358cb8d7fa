"""The first step of a run: everything checked and decided before the folder is touched.

:func:`plan` validates the configuration, draws the images, builds every model and twin (one that cannot be
built refuses the run before anything is written, so no "running" manifest blocks a corrected rerun), checks
that a resumed run continues the same one, agrees with the other processes on the memory budget and thread
count, and lists the work. The :class:`Run` it returns is what :func:`audit.run.execute.execute` and
:func:`audit.run.finish.finish` share.
"""
from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attributions.errors import AttributionError, ToolkitWarning
from attributions.explainer import model_dtype
from attributions.graph import trace
from attributions.hook_check import CHECKED_IMAGES
from attributions.hooks import refuse_changing_hooks, registered_hooks, unresolved_hooks
from audit.atomic import atomic_write_bytes, remove_partials
from audit.checks import CHECKS, Options
from audit.data import balanced_sample
from audit.data.datasets import sample_image_folder
from audit.data.preprocess import preprocess_from
from audit.data.tags import ROLES as SHORTCUT_ROLES
from audit.errors import ConfigError, ModelError
from audit.models.cautions import cautions, narrowing
from audit.models.checkpoint import resolve_model
from audit.models.shortcut_twins import ShortcutPair, pair_specs, shortcut_pair
from audit.models.twins import ROLES, same_architecture, shipped_twins, twin_specs
from audit.run.config import AuditConfig
from audit.run.distributed import Shard
from audit.run.folder import check_resumable, exclusive, fingerprints, holds_files, previous_manifest, versions
from audit.run.patterns import PATTERN_METHODS, pattern_images
from audit.run.resources import budget_bytes
from audit.run.units import WorkItem, label_for, work_items

NARROWING_IMAGES = 2  # the audited images a narrowing model's DeepLIFT gap is measured on: its rounding, not a statistic


@dataclass(frozen=True, kw_only=True)
class Run:
    """One audit run as :func:`plan` decided it: what :func:`audit.run.execute.execute` computes and
    :func:`audit.run.finish.finish` records (what the execution did is its :class:`~audit.run.ledger.Ledger`).

    Attributes
    ----------
    config : the validated configuration
    out : the run's folder
    shard : this process's share of the run
    log : where the run's lines go
    labels : {model spec: its folder-safe label}
    x, y : the audited images (B, C, H, W) on the run's device, their labels (B,) on the CPU
    images : what the manifest records about the images
    loaded : {model spec: the model as built}; ``twin_specs`` / ``twin_models`` the permuted-label twins,
        ``control_specs`` / ``control_models`` the control twins; ``shortcuts`` the shortcut twins and tag control
        twins with their tag and gate
    patterns : the pattern methods' images and their source, or None when no pattern method is audited
    prints : the fingerprints of the input files and images
    previous : the manifest of the run resumed, or None
    device : where the units compute
    budget, threads : the memory budget (bytes) and intra-op threads every process computes with
    items : the run's work, in its fixed order (a sequential run's first look decides its own)
    options : {test: its check's options}
    warnings : {model, twin or control twin (as the log names it): the lines a reader must know of it}
        (:func:`audit.models.cautions.cautions`)
    """

    config: AuditConfig
    out: Path
    shard: Shard
    log: Callable[[str], None]
    labels: Mapping[str, str]
    x: torch.Tensor
    y: torch.Tensor
    images: Mapping[str, Any]
    loaded: Mapping[str, nn.Module]
    twin_specs: Mapping[str, tuple[str, ...]]
    twin_models: Mapping[str, tuple[nn.Module, ...]]
    control_specs: Mapping[str, tuple[str, ...]]
    control_models: Mapping[str, tuple[nn.Module, ...]]
    shortcuts: Mapping[str, ShortcutPair]
    patterns: tuple[torch.Tensor, str] | None
    prints: Mapping[str, Any]
    previous: Mapping[str, Any] | None
    device: torch.device
    budget: int
    threads: int
    items: tuple[WorkItem, ...]
    options: Mapping[str, Options]
    warnings: Mapping[str, list[str]]

    @property
    def half(self) -> torch.dtype:
        """The autocast type of mixed precision on the run's device."""
        return torch.bfloat16 if self.device.type == "cpu" else torch.float16


def plan(config: AuditConfig, out: str | os.PathLike[str], *, resume: bool, shard: Shard,
         log: Callable[[str], None]) -> Run:
    """Check and decide everything about a run in ``out`` before its folder is touched (module docstring)."""
    config = config.validated()
    out = Path(out)
    previous = _folder_to_use(out, resume)
    labels = _labels(config.models)
    x, y, images = audit_images(config)
    loaded = {spec: load_model(spec, config) for spec in config.models}
    twin_specs, twin_models = _twins(config, loaded, "permuted")
    control_specs, control_models = _twins(config, loaded, "control")
    _paired(twin_specs, control_specs)
    shortcuts = _shortcuts(config, loaded)
    every = [*loaded.items(), *((f"the twin of {s}", m) for s, ms in twin_models.items() for m in ms),
             *((f"the control twin of {s}", m) for s, ms in control_models.items() for m in ms),
             *((f"the {ROLES[r]} of {s}", m) for s, p in shortcuts.items() for r, m in zip(SHORTCUT_ROLES, p.models))]
    checked = {spec: _explainable(spec, model, x) for spec, model in every}
    said = {spec: lines for spec, model in every if (lines := cautions(model) + checked[spec])}
    for spec, model in loaded.items():  # a forward that narrows its values: said with DeepLIFT's gap measured on it
        if (line := narrowing(model, x[:NARROWING_IMAGES].to(model_dtype(model) or x.dtype))) is not None:
            said.setdefault(spec, []).append(line)
    for spec, lines in said.items():  # flagged here, in the manifest and in the report's Models section
        for line in lines:
            log(f"warning: {spec}: {line}")
    for spec, twin, name in ((s, t, n) for s in twin_models for t, n in zip(twin_models[s], twin_specs[s])):
        meta = getattr(twin, "metadata", None) or {}  # flagged here, in the manifest and in the report's twins table
        if meta.get("fits") is False:
            log(f"warning: the twin of {spec}, {name}, does not fit its permuted labels (training "
                f"accuracy {meta.get('train_accuracy', float('nan')):.3f} under the {meta.get('fit_accuracy')} it was "
                "trained to): its maps are not those of a model that learned them; the data-randomization test runs "
                "and the report's twins table says so")
    patterns = pattern_images(config.pattern_data, config.data, config.pattern_images, config.seed, config.data_root) \
        if set(PATTERN_METHODS) & set(config.methods) else None
    prints = fingerprints(config, x, y, [t for specs in (twin_specs, control_specs) for ts in specs.values() for t in ts]
                          + [t for pair in shortcuts.values() for t in pair.specs])
    if previous is not None:
        check_resumable(previous, config, prints, out)
    device = _device(config.device)
    budget, threads = _agreed_resources(config, previous, device, shard, log)
    units = [(spec, CHECKS[test], method) for spec in config.models for test in config.tests
             for method in config.methods]
    shard.barrier()  # every rank has checked the folder before the lead writes into it
    return Run(config=config, out=out, shard=shard, log=log, labels=labels, x=x.to(device), y=y, images=images,
               loaded=loaded, twin_specs=twin_specs, twin_models=twin_models, control_specs=control_specs,
               control_models=control_models, shortcuts=shortcuts, patterns=patterns, prints=prints,
               previous=previous, device=device, budget=budget, threads=threads,
               items=tuple(work_items(units, n_images=len(x), block=config.image_block)),
               options={test: CHECKS[test].options_from(config.options, config.looks, config.family) for test in config.tests},
               warnings=said)


@contextlib.contextmanager
def opened(run: Run) -> Iterator[None]:
    """The run's folder made, locked by the lead (a second run on it fails at once instead of interleaving
    results) and marked "running", and torch computing with the run's thread count, for the duration."""
    if run.shard.lead:
        run.out.mkdir(parents=True, exist_ok=True)
    with exclusive(run.out) if run.shard.lead else contextlib.nullcontext(), _intra_op_threads(run.threads):
        if run.shard.lead:
            remove_partials(run.out)  # a killed run's half-written files: never read, never kept
            atomic_write_bytes(run.out / "manifest.json", json.dumps(
                {"config": run.config.to_dict(), "status": "running", "fingerprints": run.prints,
                 "memory": {"budget_bytes": run.budget}, "threads_per_process": run.threads, "versions": versions()},
                indent=2).encode())
        run.shard.barrier()
        yield


def _folder_to_use(out: Path, resume: bool) -> dict[str, Any] | None:
    """The manifest of the run in ``out`` to resume (None: a new run); a refusal for a file, or for a folder
    that holds something while ``resume`` is not given."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; give a folder for the audit's results")
    previous = previous_manifest(out) if resume else None
    if holds_files(out) and not resume:
        raise ConfigError(f"{out} is not empty; pass resume=True (--resume) to continue that run, or choose "
                          "another folder")
    return previous


def _labels(models: list[str]) -> dict[str, str]:
    """{spec: label}; two models with one label are refused (results are keyed by label: the second would
    overwrite the first's)."""
    labels = {spec: label_for(spec) for spec in models}
    clashes = sorted({lab for lab in labels.values() if list(labels.values()).count(lab) > 1})
    if clashes:
        raise ConfigError(f"two models share the label {clashes[0]!r} ("
                          f"{', '.join(spec for spec, lab in labels.items() if lab == clashes[0])}); "
                          "rename one of the files")
    return labels


def _agreed_resources(config: AuditConfig, previous: Mapping[str, Any] | None, device: torch.device, shard: Shard,
                      log: Callable[[str], None]) -> tuple[int, int]:
    """(memory budget in bytes, intra-op threads): one budget for every rank and every resume (unless a new one
    is given), so the passes chunk alike; one thread count too, the first start's: float32 kernels block their
    sums by it, so a unit computed with another count differs in the last bits."""
    recorded = (previous or {}).get("memory", {}).get("budget_bytes")
    recorded_threads = (previous or {}).get("threads_per_process")
    agreed = shard.gather({"b": recorded if recorded is not None and config.max_memory is None
                           else budget_bytes(config.max_memory, device),
                           "t": recorded_threads or torch.get_num_threads()})[0]
    if agreed["t"] != torch.get_num_threads():
        source = "as the run was started" if previous is not None else "as rank 0"
        log(f"computing with {agreed['t']} intra-op thread{'' if agreed['t'] == 1 else 's'} per process, {source} "
            f"(this process has {torch.get_num_threads()}): the units of one run are computed alike, to the last bit")
    return agreed["b"], agreed["t"]


def audit_images(config: AuditConfig) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``n_images`` (a sequential run: ``max_images``) class-balanced images of the configured data (see
    :func:`audit.data.balanced_sample` and, for "imagefolder", :func:`audit.data.datasets.sample_image_folder`),
    their labels, and what the manifest records about them (source, count, labels; the files, classes and
    preprocessing of an image folder). The first ``n_images`` of a budget's draw are the ``n_images`` draw's."""
    n = config.max_images or config.n_images
    if config.data == "imagefolder":
        if config.data_root is None:
            raise ConfigError("data imagefolder needs data_root (--data-root): the folder with one sub-folder "
                              "per class")
        sample = sample_image_folder(config.data_root, n, config.seed, config.preprocess)
        x, y = sample.x, sample.y
        record = {"root": str(Path(config.data_root).resolve()), "files": sample.files, "classes": sample.classes,
                  "preprocess": preprocess_from(config.preprocess).to_dict()}
    else:
        x, y = balanced_sample(config.data, n, config.data_root)
        record = {}
    info = {"source": config.data, "n": len(x), "labels": y.tolist(), **record}
    return torch.from_numpy(x), torch.from_numpy(y), info


def load_model(spec: str, config: AuditConfig) -> nn.Module:
    """The model ``spec`` names, with the run's weights, classes and partial-weights policy."""
    return resolve_model(spec, config.weights, config.num_classes, partial=config.allow_partial_weights)


def _twins(config: AuditConfig, models: dict[str, nn.Module], role: str
           ) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[nn.Module, ...]]]:
    """({model spec: its twins' specs}, {model spec: the loaded twins}), one twin per pair, for the models that have
    ``role`` twins (``permuted`` or ``control``), when a run's check needs twins; every twin checked (it loads, its
    architecture is the model's, ``models`` holding the loaded models) before the run starts."""
    if not any(CHECKS[t].twins == "labels" for t in config.tests):
        return {}, {}
    given = config.twins if role == "permuted" else config.controls
    key = "twins" if role == "permuted" else "controls"
    unknown = sorted(set(given) - set(config.models))
    if unknown:
        raise ConfigError(f"{key} names {', '.join(unknown)}, not among the audited models ({', '.join(config.models)})")
    specs = {spec: tuple(twins) for spec in config.models if (twins := twin_specs(spec, given, role))}
    return specs, {spec: tuple(load_twin(spec, t, models[spec], role) for t in twins) for spec, twins in specs.items()}


def _shortcuts(config: AuditConfig, models: dict[str, nn.Module]) -> dict[str, ShortcutPair]:
    """{model spec: its shortcut twins}, for the models that have them (the user's ``shortcuts``, else the shipped
    ones), when a run's check reads them; each twin loaded and of the model's architecture, the two of one tag,
    before the run starts."""
    if not any(CHECKS[t].twins == "shortcut" for t in config.tests):
        return {}
    unknown = sorted(set(config.shortcuts) - set(config.models))
    if unknown:
        raise ConfigError(f"shortcuts names {', '.join(unknown)}, not among the audited models "
                          f"({', '.join(config.models)})")
    out = {}
    for spec in config.models:
        given = config.shortcuts.get(spec)
        found = [next(iter(shipped_twins(spec, role)), "") for role in SHORTCUT_ROLES]
        specs = pair_specs(given) if given is not None else (found[0], found[1]) if all(found) else None
        if specs is not None:
            loaded = (load_twin(spec, specs[0], models[spec], "shortcut"),
                      load_twin(spec, specs[1], models[spec], "tag-control"))
            out[spec] = shortcut_pair((str(specs[0]), str(specs[1])), loaded)
    return out


def _paired(twins: Mapping[str, tuple[str, ...]], controls: Mapping[str, tuple[str, ...]]) -> None:
    """Refuse a model whose control twins are not one per permuted-label twin (pair k: the k-th of each)."""
    for spec in twins.keys() & controls.keys():
        if len(twins[spec]) != len(controls[spec]):
            raise ConfigError(f"{spec} has {len(twins[spec])} permuted-label twins and {len(controls[spec])} control "
                              "twins: the data-randomization test reads them in pairs (the k-th of each); give one "
                              "control twin per permuted-label twin (twins and controls, in the same order)")


def load_twin(spec: str, twin: str, model: nn.Module, role: str = "permuted") -> nn.Module:
    """The ``role`` twin ``twin`` of the model ``spec`` (already loaded as ``model``), refused when its architecture
    differs."""
    try:
        loaded = resolve_model(twin)
    except ModelError as exc:
        raise ConfigError(f"the {ROLES[role]} of {spec}: {exc}") from None
    same_architecture(model, loaded, spec, twin)
    return loaded


def _explainable(spec: str, model: nn.Module, x: torch.Tensor) -> list[str]:
    """Refuse, before the run starts, a model whose hooks change what it computes (the engine would refuse it at
    its first unit, after the run's folder was made): by their code, and for a model with hooks by a capture on
    the first images of ``x`` (N, ...), which runs its own forward once against the graph
    (:mod:`attributions.hook_check`). Returns the lines that capture warned of beyond the hooks' readings (their own
    forward failing with the hooks: nothing compared), for the log, manifest and report."""
    try:
        refuse_changing_hooks(model)
        if not registered_hooks(model):
            return []
        first = next(model.parameters(), None)
        images = x[:CHECKED_IMAGES].to(first.device if first is not None else x.device, model_dtype(model) or x.dtype)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ToolkitWarning)
            trace(model, images)
    except AttributionError as exc:
        raise ModelError(f"{spec}: {exc}") from None
    read = set(unresolved_hooks(model))
    return [line for w in caught if issubclass(w.category, ToolkitWarning) and (line := str(w.message)) not in read]


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but torch sees no CUDA device here; use --device cpu")
    return torch.device(name)


@contextlib.contextmanager
def _intra_op_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` for the duration, then restored."""
    before = torch.get_num_threads()
    if threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
