"""A run's work as units (one model, one check, one method), or blocks of a unit's images, and their files:
where each is written, how blocks are joined back into units and units into result tables, and how long the
rest should take."""
from __future__ import annotations

import dataclasses
import io
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attributions import memory
from audit.atomic import atomic_write_bytes
from audit.checks import CHECKS, Check
from audit.checks.replicates import image_order
from audit.run.results import read_table, unit_path


def label_for(spec: str) -> str:
    """A folder-safe label for a model specification."""
    base = Path(spec).stem if (os.sep in spec or spec.endswith(".pt")) else spec
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base)


@dataclasses.dataclass(frozen=True)
class WorkItem:
    """One model, check and method over the images [start, stop): a whole unit, or one block of it."""

    spec: str
    check: Check[Any]
    method: str
    start: int
    stop: int
    blocked: bool

    def unit(self, out: Path, labels: Mapping[str, str]) -> Path:
        return unit_path(out, labels[self.spec], self.check.name, self.method)

    def path(self, out: Path, labels: Mapping[str, str]) -> Path:
        """The unit's file, or for a block ``<method>@<start>-<stop>.csv`` beside it."""
        unit = self.unit(out, labels)
        return unit.with_name(f"{self.method}@{self.start}-{self.stop}.csv") if self.blocked else unit

    def key(self, labels: Mapping[str, str]) -> str:
        """"model/test/method", with "@start-stop" for a block: the seed's and the timings' key."""
        base = f"{labels[self.spec]}/{self.check.name}/{self.method}"
        return f"{base}@{self.start}-{self.stop}" if self.blocked else base


def work_items(units: list[tuple[str, Check[Any], str]], *, n_images: int, block: int) -> list[WorkItem]:
    """The run's work in its fixed order: each unit whole, or (``block`` > 0, a check scored per image)
    as blocks of ``block`` images. The order and the blocks depend on the configuration only."""
    items = []
    for spec, check, method in units:
        split = block > 0 and check.per_image and block < n_images
        spans = memory.spans(n_images, block) if split else [(0, n_images)]
        items += [WorkItem(spec, check, method, a, b, split) for a, b in spans]
    return items


def look_items(units: list[tuple[str, Check[Any], str]], *, look: int, n_images: int, max_images: int) -> list[WorkItem]:
    """The work of look ``look`` (1, 2, ...) of a sequential run, for the ``units`` still open: each unit scored
    per image over the look's images [(look - 1) n_images, look n_images), capped at ``max_images``, as a block;
    at the first look, a unit not scored per image over all ``max_images`` images, whole (it is read once)."""
    start, stop = (look - 1) * n_images, min(look * n_images, max_images)
    items = []
    for spec, check, method in units:
        if check.per_image:
            items.append(WorkItem(spec, check, method, start, stop, True))
        elif look == 1:
            items.append(WorkItem(spec, check, method, 0, max_images, False))
    return items


def csv_bytes(df: pd.DataFrame) -> bytes:
    return df.to_csv(index=False, float_format="%.10g").encode()


def npz_bytes(maps: np.ndarray, images: np.ndarray) -> bytes:
    """Example heatmaps (stages, images, H, W) and their images, compressed, in float32."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, maps=maps.astype(np.float32), images=images.astype(np.float32))
    return buffer.getvalue()


def assemble(items: Sequence[WorkItem], out: Path, labels: Mapping[str, str]) -> None:
    """Join the blocks of every unit computed in blocks into the unit's files."""
    blocks: dict[Path, list[Path]] = {}
    for item in items:
        if item.blocked:
            blocks.setdefault(item.unit(out, labels), []).append(item.path(out, labels))
    for unit, paths in blocks.items():
        _assemble_unit(unit, paths)


def _assemble_unit(unit: Path, blocks: list[Path]) -> None:
    """Join a unit's block files (in image order) into its own files, unless a run killed after
    writing them left the blocks behind; then remove the blocks."""
    if not unit.exists():
        parts = []
        for m in (b.with_suffix(".npz") for b in blocks):
            if m.exists():
                with np.load(m) as npz:
                    parts.append((npz["maps"], npz["images"]))
        if parts:
            atomic_write_bytes(unit.with_suffix(".npz"), npz_bytes(np.concatenate([p[0] for p in parts], axis=1),
                                                                   np.concatenate([p[1] for p in parts])))
        tables = [read_table(b) for b in blocks]
        filled = [t for t in tables if not t.empty]
        atomic_write_bytes(unit, csv_bytes(image_order(pd.concat(filled, ignore_index=True)) if filled
                                           else tables[0]))
    for b in blocks:  # the unit's file is written: the blocks are no longer needed
        b.unlink(missing_ok=True)
        b.with_suffix(".npz").unlink(missing_ok=True)


def join(out: Path, *, tests: list[str], models: list[str], methods: list[str],
         labels: Mapping[str, str]) -> dict[str, pd.DataFrame]:
    """Each check's unit tables joined (a ``model`` column first) into ``results/<its result file>``;
    {test: table}."""
    tables = {}
    for test in tests:
        check = CHECKS[test]
        parts = []
        for spec in models:
            for method in methods:
                df = read_table(unit_path(out, labels[spec], test, method))
                if not df.empty:
                    parts.append(df.assign(model=labels[spec]))
        table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(check.columns))
        table = table[["model"] + [c for c in table.columns if c != "model"]] if parts else table
        atomic_write_bytes(out / "results" / check.result_file, csv_bytes(table))
        tables[test] = table
    return tables


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
