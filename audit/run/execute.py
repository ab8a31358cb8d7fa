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
from attributions.errors import AttributionError, NotApplicable
from audit.atomic import atomic_write_bytes
from audit.checks import Check, Options, UnitContext, UnitResult
from audit.checks.base import INCONCLUSIVE
from audit.checks.scale import UNCHANGED, UNRELATED
from audit.durations import duration
from audit.errors import ModelError
from audit.faults import kill_point
from audit.progress import bars
from audit.run.ledger import Ledger
from audit.run.placement import Placement
from audit.run.plan import Run
from audit.run.resources import Peak
from audit.run.results import read_table
from audit.run.units import WorkItem, csv_bytes, look_items, npz_bytes, remaining_seconds


def execute(run: Run, *, progress: bool) -> Ledger:
    """Compute and write every work item of ``run`` this process owns that is not written yet: the run's items,
    or for a sequential run (``max_images``) look after look, each look's items for the cells still undecided
    (:func:`undecided`); what it did, as its :class:`~audit.run.ledger.Ledger`."""
    config = run.config
    work = _Work(run, Placement(run), progress)
    if config.looks == 1:
        work.compute(run.items)
        return work.ledger(run.items)
    units = {item.key(run.labels): (item.spec, item.check, item.method) for item in run.items}
    done: dict[str, list[WorkItem]] = {key: [] for key in units}
    looked: list[WorkItem] = []
    for look in range(1, config.looks + 1):
        items = look_items(list(units.values()), look=look, n_images=config.n_images, max_images=len(run.x))
        for item in items:
            done[item.key(run.labels).split("@")[0]].append(item)
        looked += items
        work.compute(items, f"look {look} of {config.looks}")
        run.shard.barrier()  # every rank's blocks of this look are written: each reads them and decides alike
        scales: dict[str, pd.DataFrame] = {}  # the controls' rows per model x check, read once per look
        units = {key: unit for key, unit in units.items()
                 if unit[1].per_image and undecided(run, done[key], _controls(run, done, key, scales))}
        if not units:
            break
    return work.ledger(tuple(looked))


def controls_of(done: dict[str, list[WorkItem]], key: str) -> list[WorkItem]:
    """The blocks written so far of the controls (the edge and the random map) of the cell ``key``
    ("model/test/method"): the ends of the scale its verdict reads (:mod:`audit.checks.scale`)."""
    base = key.rsplit("/", 1)[0]
    return [item for name in (UNCHANGED, UNRELATED) for item in done.get(f"{base}/{name}", [])]


def _controls(run: Run, done: dict[str, list[WorkItem]], key: str, read: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The rows of the controls' blocks of the cell ``key``'s model and check, read once into ``read``."""
    base = key.rsplit("/", 1)[0]
    if base not in read:
        read[base] = _blocks(run, controls_of(done, key))
    return read[base]


def _blocks(run: Run, items: list[WorkItem]) -> pd.DataFrame:
    """The rows of the blocks ``items`` (with their ``method``), read from their files; empty where none has rows."""
    tables = [t for t in (read_table(item.path(run.out, run.labels)) for item in items) if not t.empty]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def undecided(run: Run, items: list[WorkItem], controls: pd.DataFrame | None = None) -> bool:
    """Whether the verdict of the cell whose blocks are ``items`` is still inconclusive, or not yet final, on the
    images they hold, read on the scale of its ``controls``' rows (both read from their files, so that every rank
    and a resumed run decide alike); a cell the check says nothing of is decided."""
    check = items[0].check
    if check.verdict is None or items[0].unit(run.out, run.labels).exists():  # joined by a finished run
        return False
    part = _blocks(run, items)
    if part.empty:
        return False
    cell = check.verdict.evaluate(part, run.options[check.name], controls=controls)
    return cell.outcome == INCONCLUSIVE or not cell.final


class _Work:
    """This process's computing of a run's items: the models it placed, the time and peak memory of each unit."""

    def __init__(self, run: Run, placed: Placement, progress: bool) -> None:
        self.run, self.placed, self.progress = run, placed, progress
        self.timings: dict[str, float] = {}
        self.peaks: dict[str, float | None] = {}
        self.peak = Peak(run.device)

    def ledger(self, items: tuple[WorkItem, ...]) -> Ledger:
        return Ledger(items=items, timings=dict(self.timings), peaks=dict(self.peaks), placed=self.placed)

    def compute(self, items: tuple[WorkItem, ...] | list[WorkItem], stage: str = "") -> None:
        """Compute and write the ``items`` this process owns that are not written yet."""
        run, progress = self.run, self.progress
        out, labels, shard = run.out, run.labels, run.shard
        desc = "audit" if shard.world == 1 else f"audit (rank {shard.rank} of {shard.world})"
        bar = tqdm(items, desc=f"{desc}, {stage}" if stage else desc, disable=not bars(progress), position=shard.rank)
        # this process's work still to do, looked up once (a resumed run skips the rest)
        pending = [i for i, item in enumerate(items)
                   if shard.mine(i) and not item.path(out, labels).exists() and not item.unit(out, labels).exists()]
        todo = set(pending)
        for index, item in enumerate(bar):
            if index not in todo:
                continue
            table = self._compute(item)
            kill_point(len(self.timings), shard.rank)
            left = [(items[i].check.name, items[i].method) for i in pending if i > index]
            line = self._line(item, table, left)
            (bar.write if bars(progress) else run.log)(line)

    def _compute(self, item: WorkItem) -> pd.DataFrame:
        """Compute one work item with its seed, time it, write its files; its table."""
        run, config = self.run, self.run.config
        spec, key = item.spec, item.key(run.labels)
        model = self.placed.model(spec)
        twins, controls = self.placed.twins(spec) if item.check.twins == "labels" else ((), ())
        shortcut = self.placed.shortcut(spec) if item.check.twins == "shortcut" else None
        torch.manual_seed(zlib.crc32(f"{config.seed}:{key}".encode()))
        xs, ys = run.x[item.start:item.stop], run.y[item.start:item.stop]
        shown = max(0, min(config.heatmap_examples - item.start, len(xs)))  # example heatmaps among these images
        unit = UnitContext(seed=config.seed, heatmap_examples=shown, progress=self.progress, twins=twins,
                           controls=controls, first_image=item.start, params=self.placed.params(spec),
                           shortcut=shortcut)
        start = time.perf_counter()
        with memory.limit(run.budget), self.peak.track(), \
                torch.autocast(run.device.type, dtype=run.half, enabled=config.mixed_precision):
            result = run_unit(item.check, model, xs, ys, item.method, options=run.options[item.check.name], unit=unit,
                              key=key)
        self.timings[key] = round(time.perf_counter() - start, 3)
        self.peaks[key] = round(self.peak.nbytes / 2**20, 1) if self.peak.nbytes is not None else None
        table = result.table
        if item.start and "image" in table:
            table = table.assign(image=table["image"] + item.start)
        path = item.path(run.out, run.labels)
        if result.maps is not None and shown:
            atomic_write_bytes(path.with_suffix(".npz"), npz_bytes(result.maps, xs[:shown].cpu().numpy()))
        atomic_write_bytes(path, csv_bytes(table))  # last: its presence marks the work finished
        return table

    def _line(self, item: WorkItem, table: pd.DataFrame, left: list[tuple[str, str]]) -> str:
        """What a work item found, how long it took and how long the rest should take."""
        run = self.run
        check, key = item.check, item.key(run.labels)
        line = check.summary(table) if not table.empty else \
            "no permuted-label twin: skipped" if check.twins == "labels" and item.spec not in run.twin_specs else \
            "no shortcut twins: skipped" if check.twins == "shortcut" and item.spec not in run.shortcuts else \
            f"does not apply to {item.method}: skipped"
        metric = getattr(check.verdict, "metric", None)
        if metric in table and table[metric].isna().any():  # say why the verdict may be undefined
            line += f"; {int(table[metric].isna().sum())} of {len(table)} scores undefined (maps constant or non-finite)"
        eta = remaining_seconds(left, self.timings)
        noun = "block" if run.config.image_block else "unit"
        return (f"{key}: {line} ({self.timings[key]:.1f} s; {len(left)} {noun}{'' if len(left) == 1 else 's'} left"
                + (f", about {duration(eta)})" if left else ")"))


def run_unit(check: Check[Any], model: nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, *, options: Options,
             unit: UnitContext, key: str) -> UnitResult:
    """One unit's result: empty where the check does not apply to the method, needs a twin the model lacks, or
    the method does not fit the model (the engine's :class:`NotApplicable`, an attention map of a CNN: the
    manifest says why); the engine's other refusals as a :class:`ModelError` naming the unit (``key``)."""
    empty = UnitResult(pd.DataFrame(columns=list(check.columns)))
    if not check.applies(method) or (check.twins == "labels" and not unit.twins) \
            or (check.twins == "shortcut" and unit.shortcut is None):
        return empty
    try:
        return check.run(model, x, y, method, options, unit)
    except NotApplicable:
        return empty
    except AttributionError as exc:
        raise ModelError(f"{key}: {exc}") from exc

