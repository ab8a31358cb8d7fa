"""The second step of a run: the unit loop.

Each work item this process owns and has not yet written is computed with its own seed (from the run's seed and
the unit's key), under the memory budget, and written atomically, its table last (its presence marks it done);
a line per item says what it found and how long the rest should take.
"""
from __future__ import annotations

import time
import zlib
from typing import Any

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from attributions import memory
from attributions.errors import AttributionError
from attributions.explainer import Explainer
from audit.atomic import atomic_write_bytes
from audit.checks import Check, Options, UnitContext, UnitResult
from audit.checks.base import INCONCLUSIVE
from audit.durations import duration
from audit.errors import ModelError
from audit.faults import kill_point
from audit.progress import bars
from audit.run.patterns import pattern_params
from audit.run.plan import Run
from audit.run.resources import Peak
from audit.run.results import read_table
from audit.run.units import WorkItem, csv_bytes, look_items, npz_bytes, remaining_seconds


def execute(run: Run, *, progress: bool) -> None:
    """Compute and write every work item of ``run`` this process owns that is not written yet: the run's items,
    or for a sequential run (``max_images``) look after look, each look's items for the cells still undecided
    (:func:`undecided`), added to ``run.items``."""
    config = run.config
    if config.looks == 1:
        _execute_items(run, run.items, progress)
        return
    units = {item.key(run.labels): (item.spec, item.check, item.method) for item in run.items}
    done: dict[str, list[WorkItem]] = {key: [] for key in units}
    run.items = []
    for look in range(1, config.looks + 1):
        items = look_items(list(units.values()), look=look, n_images=config.n_images, max_images=len(run.x))
        for item in items:
            done[item.key(run.labels).split("@")[0]].append(item)
        run.items += items
        _execute_items(run, items, progress, f"look {look} of {config.looks}")
        run.shard.barrier()  # every rank's blocks of this look are written: each reads them and decides alike
        units = {key: unit for key, unit in units.items() if unit[1].per_image and undecided(run, done[key])}
        if not units:
            break


def undecided(run: Run, items: list[WorkItem]) -> bool:
    """Whether the verdict of the cell whose blocks are ``items`` is still inconclusive, or not yet final, on the
    images they hold (read from their files, so that every rank and a resumed run decide alike); a cell the check
    says nothing of is decided."""
    check = items[0].check
    if check.verdict is None or items[0].unit(run.out, run.labels).exists():  # joined by a finished run
        return False
    tables = [t for t in (read_table(item.path(run.out, run.labels)) for item in items) if not t.empty]
    if not tables:
        return False
    cell = check.verdict.evaluate(pd.concat(tables, ignore_index=True), run.options[check.name])
    return cell.outcome == INCONCLUSIVE or not cell.final


def _execute_items(run: Run, items: list[WorkItem], progress: bool, stage: str = "") -> None:
    """Compute and write the ``items`` this process owns that are not written yet."""
    out, labels, shard = run.out, run.labels, run.shard
    desc = "audit" if shard.world == 1 else f"audit (rank {shard.rank} of {shard.world})"
    bar = tqdm(items, desc=f"{desc}, {stage}" if stage else desc, disable=not bars(progress), position=shard.rank)
    # this process's work still to do, looked up once (a resumed run skips the rest)
    pending = [i for i, item in enumerate(items)
               if shard.mine(i) and not item.path(out, labels).exists() and not item.unit(out, labels).exists()]
    todo = set(pending)
    peak = Peak(run.device)
    for index, item in enumerate(bar):
        if index not in todo:
            continue
        table = _compute(run, item, peak, progress)
        kill_point(len(run.timings), shard.rank)
        left = [(items[i].check.name, items[i].method) for i in pending if i > index]
        line = _line(run, item, table, left)
        (bar.write if bars(progress) else run.log)(line)


def _compute(run: Run, item: WorkItem, peak: Peak, progress: bool) -> pd.DataFrame:
    """Compute one work item with its seed, time it, write its files; its table."""
    spec, key, config = item.spec, item.key(run.labels), run.config
    model, twin, control = _models_for(run, item)
    torch.manual_seed(zlib.crc32(f"{config.seed}:{key}".encode()))
    xs, ys = run.x[item.start:item.stop], run.y[item.start:item.stop]
    shown = max(0, min(config.heatmap_examples - item.start, len(xs)))  # example heatmaps among these images
    unit = UnitContext(seed=config.seed, heatmap_examples=shown, progress=progress, twin=twin, control=control,
                       first_image=item.start, params=run.given[spec])
    start = time.perf_counter()
    with memory.limit(run.budget), peak.track(), \
            torch.autocast(run.device.type, dtype=run.half, enabled=config.mixed_precision):
        result = run_unit(item.check, model, xs, ys, item.method, options=run.options[item.check.name], unit=unit,
                          key=key)
    run.timings[key] = round(time.perf_counter() - start, 3)
    run.peaks[key] = round(peak.nbytes / 2**20, 1) if peak.nbytes is not None else None
    table = result.table
    if item.start and "image" in table:
        table = table.assign(image=table["image"] + item.start)
    path = item.path(run.out, run.labels)
    if result.maps is not None and shown:
        atomic_write_bytes(path.with_suffix(".npz"), npz_bytes(result.maps, xs[:shown].cpu().numpy()))
    atomic_write_bytes(path, csv_bytes(table))  # last: its presence marks the work finished
    return table


def _models_for(run: Run, item: WorkItem) -> tuple[nn.Module, nn.Module | None, nn.Module | None]:
    """The item's model on the run's device (and its permuted-label and control twins where the check needs them),
    moved there and given its methods' parameters the first time a unit needs them."""
    spec = item.spec
    on_device(run, spec)
    if item.check.needs_twin:
        for specs, loaded, placed in ((run.twin_specs, run.twin_models, run.twins),
                                      (run.control_specs, run.control_models, run.controls)):
            if spec in specs and spec not in placed:
                placed[spec] = loaded[spec].to(run.device)
    return run.models[spec], run.twins.get(spec), run.controls.get(spec) if item.check.needs_twin else None


def on_device(run: Run, spec: str) -> nn.Module:
    """Model ``spec`` on the run's device, with the parameters the run gives its methods (the pattern methods'
    patterns), the first time this process needs it."""
    if spec not in run.models:
        run.models[spec] = run.loaded[spec].to(run.device)
        run.given[spec] = _given_to(run, spec)
    return run.models[spec]


def _given_to(run: Run, spec: str) -> dict[str, dict[str, Any]]:
    """The parameters the run gives the methods of model ``spec`` (the pattern methods' patterns)."""
    return pattern_params(list(run.config.methods), spec, run.models[spec], run.labels[spec], run.patterns,
                          run.config.pattern_data, weights=run.config.weights, out=run.out)


def run_unit(check: Check[Any], model: nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, *, options: Options,
             unit: UnitContext, key: str) -> UnitResult:
    """One unit's result: empty where the check does not apply to the method, needs a twin the model lacks, or
    the method does not fit the model (the manifest says why); the engine's refusal as a :class:`ModelError`
    naming the unit (``key``)."""
    if not check.applies(method) or (check.needs_twin and unit.twin is None):
        return UnitResult(pd.DataFrame(columns=list(check.columns)))
    probe = Explainer(model, method)
    if probe.method.engine.fits(probe, x[:1]) is not None:  # an attention map of a CNN
        return UnitResult(pd.DataFrame(columns=list(check.columns)))
    try:
        return check.run(model, x, y, method, options, unit)
    except AttributionError as exc:
        raise ModelError(f"{key}: {exc}") from exc


def _line(run: Run, item: WorkItem, table: pd.DataFrame, left: list[tuple[str, str]]) -> str:
    """What a work item found, how long it took and how long the rest should take."""
    check, key = item.check, item.key(run.labels)
    line = check.summary(table) if not table.empty else \
        "no permuted-label twin: skipped" if check.needs_twin and item.spec not in run.twins else \
        f"does not apply to {item.method}: skipped"
    metric = getattr(check.verdict, "metric", None)
    if metric in table and table[metric].isna().any():  # say why the verdict may be undefined
        line += f"; {int(table[metric].isna().sum())} of {len(table)} scores undefined (maps constant or non-finite)"
    eta = remaining_seconds(left, run.timings)
    noun = "block" if run.config.image_block else "unit"
    return (f"{key}: {line} ({run.timings[key]:.1f} s; {len(left)} {noun}{'' if len(left) == 1 else 's'} left"
            + (f", about {duration(eta)})" if left else ")"))

