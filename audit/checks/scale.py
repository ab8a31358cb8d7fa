"""One scale for every similarity a verdict reads, its ends measured in the run by the two controls.

A similarity score (SSIM, a Spearman correlation) between two maps means little alone: 0.91 is "unchanged" only if
a map that cannot change scores about as much. The run's controls fix the scale on every check, model and measure:

* the **unchanged** end: the model-independent map (the edge detector: a Sobel filter of the input) compared the
  way the check compares a method's maps; it scores what "the model's change left the map as it was" means (1 for
  every measure here, less where the measure itself is noisy);
* the **unrelated** end: the random map, drawn afresh for every model the check compares; it scores what "the two
  maps have nothing to do with each other" means (about 0).

A score is read by the end it lies nearer: per image, ``score - (unchanged + unrelated) / 2``. The ends are the
medians of the controls' scores on the same rows (a check that compares several stages pools the stages after the
trained model). Where the run has no control rows (a Python call that audits methods alone), the measure's own
ends stand in: 1, what a map scores against itself, and 0, the expected correlation of two independent maps; the
verdict's text says which ends it read. The ends' own sampling error is not propagated: the edge map scores
exactly 1 on every image, and the random map's median over the images and stages read moves by about 0.01.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from audit.checks.base import VerdictCell, scored_cell
from audit.checks.options import CONFIDENCE

UNCHANGED, UNRELATED = "edge", "random"  # the controls whose scores are the scale's ends


@dataclass(frozen=True)
class Scale:
    """The two ends of a similarity's scale and where they come from.

    Attributes
    ----------
    unchanged : float
        The model-independent map's median score (the edge control's), or 1 where it was not run.
    unrelated : float
        The random map's median score (the random control's), or 0 where it was not run.
    measured : bool
        Whether both ends were measured in the run (else the measure's own ends, 1 and 0).
    """

    unchanged: float = 1.0
    unrelated: float = 0.0
    measured: bool = False

    @property
    def midpoint(self) -> float:
        """The score equally near both ends: above it a map lies nearer "unchanged"."""
        return (self.unchanged + self.unrelated) / 2

    def text(self) -> str:
        """The ends in words, for a figure's caption."""
        how = "the controls" if self.measured else "the measure's own ends (no controls run)"
        return f"scale {self.unrelated:.2f} (unrelated) to {self.unchanged:.2f} (unchanged), {how}"

    def note(self) -> str:
        """What a verdict cell adds about its scale: nothing where the controls measured the ends (the report's
        table of scales gives them, once per check, model and measure), else that the measure's own ends stood."""
        return "" if self.measured else "; the measure's own ends 1 and 0 (no controls run)"


def scale_of(controls: pd.DataFrame | None, metric: str,
             select: Callable[[pd.DataFrame], pd.DataFrame] = lambda rows: rows) -> Scale:
    """The scale of ``metric`` from the control rows of one model under one check (column ``method``: the
    controls' names), read on the rows ``select`` keeps; the measure's own ends (1, 0) where either control is
    missing or undefined, or where the controls do not order (the unchanged end must lie above the unrelated one:
    else the check is broken, which the controls' own outcomes show)."""
    if controls is None or controls.empty or metric not in controls or "method" not in controls:
        return Scale()
    ends = []
    for name in (UNCHANGED, UNRELATED):
        values = select(controls[controls.method == name])[metric].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        if not len(values):
            return Scale()
        ends.append(float(np.median(values)))
    unchanged, unrelated = ends
    return Scale(unchanged, unrelated, True) if unchanged > unrelated else Scale()


def nearer_unchanged(values: np.ndarray, scale: Scale, label: str, *, level: float = CONFIDENCE,
                     groups: np.ndarray | None = None, short: str | None = None) -> VerdictCell:
    """The reading of per-image scores ``values`` (n,) on ``scale``: rejected when the ``level`` interval of their
    median lies at or above the midpoint (nearer the unchanged end), not rejected when it lies below, inconclusive
    when it contains the midpoint or too few scores are defined (:func:`~audit.checks.base.scored_cell`, ``label``,
    ``groups`` and ``short`` as there)."""
    return scored_cell(np.asarray(values, dtype=float), scale.midpoint, label=label, level=level, groups=groups,
                       short=short)


def reading(cell: VerdictCell, notes: bool = True) -> str:
    """What a reading's cell text holds between its outcome's parentheses, to be quoted in another cell's text: its
    median and interval, and (``notes``) what follows them (the seeds' spread, the look, the undefined images, which
    the quoting cell may give once for all its readings); the whole text where it has none."""
    inner = cell.text.split("(", 1)[1].rsplit(")", 1)[0] if "(" in cell.text else cell.text
    return inner if notes else inner.split(";")[0]


def controls_in(table: pd.DataFrame | None, model: str | None = None) -> pd.DataFrame | None:
    """The rows of the controls (the edge and the random map) in a check's ``table``, of ``model`` where the table
    holds several (column ``model``); None where there are none."""
    if table is None or table.empty or "method" not in table:
        return None
    rows = table[table.method.isin([UNCHANGED, UNRELATED])]
    if model is not None and "model" in rows:
        rows = rows[rows.model == model]
    return rows if not rows.empty else None
