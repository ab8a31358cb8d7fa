"""Verdicts calibrated by references measured in the run, in place of a fixed threshold.

A similarity score says little alone: 0.36 between a model's maps and its permuted-label twin's is "changed" only if
a model that learned the true labels the same way would give more. The calibrated verdict reads each image's score
against two references measured on the same image with the same measure:

* the **ceiling**: the model's map against that of a model that learned the same thing by the same recipe (the
  control twin: the twin's recipe on the true labels, another seed);
* the **floor**: the model's map against that of a model that learned nothing (every tensor re-initialised).

The scores are correlations, compared on Fisher's z scale (z = atanh r, on which differences of correlations are
comparable whatever their level: 0.98 against 0.97 is as far apart as 0.50 against 0.41). The score is judged by
the reference it lies nearer to: per image, ``d = z(score) - (z(ceiling) + z(floor)) / 2``. The method is rejected
when the 99 % interval of the median ``d`` lies at or above 0 (the map on the twin is nearer to a model that learned
the true labels than to one that learned nothing: permuting the labels left it as a retrained model would), not
rejected when it lies below 0, inconclusive when it contains 0. The margin of equivalence is half the reference gap
of each image, measured, not chosen.

The references must separate for the reading to mean anything: the 99 % interval of the median gap
``z(ceiling) - z(floor)`` must lie at or above :data:`SMALLEST_GAP`, Cohen's (1988) "small" difference between two
correlations (q = 0.1). A statistically detectable but smaller gap (0.910 against 0.908 on 128 images) would let
noise-level differences decide.

Where the references do not separate, they still carry the answer, read on the controls' scale
(:mod:`audit.checks.scale`: the edge map fixes what "unchanged" scores, the random map what "unrelated" scores):
both near the unchanged end (input x gradient's magnitudes, set by the input: 0.91) say the map is the same whether
the model learned the labels, other labels or nothing, and the map is rejected for that; both near the unrelated
end (the gradient on a small CNN: 0.12) say the map changes as much under a retrain on the same labels as under
permutation, and the twin's own place on the scale decides. No reading rests on a fixed threshold.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from audit.checks.base import INCONCLUSIVE, NOT_REJECTED, REJECTED, MedianScore, VerdictCell, VerdictRule, scored_cell, too_few
from audit.checks.options import Options
from audit.checks.scale import Scale, nearer_unchanged, reading, scale_of
from audit.measures.statistics import bootstrap_ci

# Cohen (1988), Statistical Power Analysis for the Behavioral Sciences, section 4.2: q = z1 - z2, the difference of
# two correlations on Fisher's z scale; 0.1 is a "small" effect. The references must differ by at least this much.
SMALLEST_GAP = 0.1
_EDGE = 1 - 1e-9  # a correlation of exactly 1 (the edge detector's) has no finite z: held just below


def nearer(score: np.ndarray, ceiling: np.ndarray | float, floor: np.ndarray | float) -> np.ndarray:
    """Per image, how much nearer ``score`` lies to ``ceiling`` than to ``floor``, on the measure's own scale:
    ``score - (ceiling + floor) / 2`` (all (n,) or scalars; NaN where any is undefined). At or above 0: the score is
    at least as near the ceiling as the floor. The randomization checks' ceiling is a map's similarity to itself
    (1), where Fisher's z has no finite value, hence the measure's own scale there."""
    out: np.ndarray = np.asarray(score, dtype=float) - (np.asarray(ceiling, dtype=float) + np.asarray(floor, dtype=float)) / 2
    return out


def fisher_z(r: np.ndarray) -> np.ndarray:
    """Fisher's z = atanh(r) of correlations ``r`` (NaN kept), ``r`` held within [-1 + 1e-9, 1 - 1e-9]."""
    return np.asarray(np.arctanh(np.clip(r, -_EDGE, _EDGE)), dtype=float)


@dataclass(frozen=True)
class Calibrated(VerdictRule):
    """The data-randomization verdict, every reading on the controls' scale (:mod:`audit.checks.scale`) or between
    references measured on the same images (module docstring).

    In this order, each per image with the 99 % interval of its median:

    1. the untrained copy's similarity (the floor) nearer the unchanged end: rejected, the map does not depend on
       what the model learned (a model that learned nothing gives it);
    2. the permuted-label twin's similarity nearer the unchanged end: rejected, the map survives label permutation;
    3. where the control twin and the untrained copy separate (Cohen's small difference, :data:`SMALLEST_GAP`):
       the twin nearer the control than the untrained copy on Fisher's z scale rejects, nearer the untrained copy
       does not;
    4. else the twin's reading of step 2 decides: below the midpoint, not rejected (the map changed; where the
       control twin's maps change as much, the test cannot tell the labels from the seed, and the cell says so).

    A reading that cannot reject (the floor or the twin wholly below the midpoint) still leaves the cell
    inconclusive where another reading is. Without a control twin only steps 2 and 4 are read.

    Parameters
    ----------
    score_column, text_column, failure, score_name, why
        As :class:`~audit.checks.base.VerdictRule`; ``threshold`` is not read ("").
    metric : str, default "spearman_abs"
        The column of per-image scores against the twin.
    ceiling, floor : str
        The columns of the per-image scores against the ceiling and the floor references.
    floor_seed : str
        The column of each image's replicate of the floor's re-initialisation seed: the floor's interval resamples
        the seeds, then the images (:func:`~audit.measures.statistics.nested_median_ci`).
    pair : str
        The column of each image's twin pair (a permuted-label twin and its control twin: one training draw of
        each). With several pairs the readings of the twin resample the pairs, then the images (the seeds nested in
        them); with one, the twin's reading resamples the images alone, the references' the seeds, and the cell
        says that it rests on one pair.
    """

    threshold: str = ""
    metric: str = "spearman_abs"
    ceiling: str = "control_spearman_abs"
    floor: str = "untrained_spearman_abs"
    floor_seed: str = "untrained_replicate"
    pair: str = "twin_pair"

    @property
    def readings(self) -> int:
        return 2  # the untrained copy on the controls' scale, and the twin (on the scale or between the references)

    def scale(self, controls: pd.DataFrame | None) -> Scale:
        return scale_of(controls, self.metric)

    def per_image(self, part: pd.DataFrame) -> pd.Series:
        """The per-image scores against the twin (not the calibrated differences: a paired comparison of two models
        compares what each model's maps did)."""
        rows = part.sort_values("image")
        return pd.Series(rows[self.metric].to_numpy(), index=rows.image.to_numpy())

    def references(self, part: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(score, ceiling, floor) per image, sorted by image; None when the rows carry no reference."""
        if self.ceiling not in part or self.floor not in part or not np.isfinite(part[self.ceiling]).any():
            return None
        rows = part.sort_values("image")
        return tuple(rows[c].to_numpy(dtype=float) for c in (self.metric, self.ceiling, self.floor))  # type: ignore[return-value]

    def replicates(self, part: pd.DataFrame) -> np.ndarray | None:
        """Each image's floor seed's replicate, sorted by image; None where the rows carry none."""
        return part.sort_values("image")[self.floor_seed].to_numpy() if self.floor_seed in part else None

    def pairs(self, part: pd.DataFrame) -> int:
        """How many twin pairs the rows were read on (1 where they carry no pair)."""
        return int(part[self.pair].nunique()) if self.pair in part and part[self.pair].notna().any() else 1

    def twin_groups(self, part: pd.DataFrame) -> np.ndarray | None:
        """What the readings of the twin resample, per image sorted by image: the twin pairs where there are
        several, else the floor's seeds (None where the rows carry neither)."""
        if self.pairs(part) > 1:
            return part.sort_values("image")[self.pair].to_numpy()
        return self.replicates(part)

    def floor_scores(self, part: pd.DataFrame, scale: Scale) -> np.ndarray:
        """The floor's per-image scores, sorted by image; where one is undefined while the model's map is not (its
        twin's or its control's score is defined: the untrained copy's map is constant, e.g. Grad-CAM's after its
        ReLU, and shares nothing with the model's), the ``scale``'s unrelated end."""
        rows = part.sort_values("image")
        floor = rows[self.floor].to_numpy(dtype=float)
        seen = np.isfinite(rows[self.metric].to_numpy(dtype=float)) | np.isfinite(rows[self.ceiling].to_numpy(dtype=float))
        return np.where(np.isnan(floor) & seen, scale.unrelated, floor)

    def differences(self, part: pd.DataFrame) -> np.ndarray:
        """Per image, sorted by image: z(score) - (z(ceiling) + z(floor)) / 2, NaN where any of the three is
        undefined (the rows must carry the references: :meth:`references`)."""
        measured = self.references(part)
        assert measured is not None, "differences need rows with the references"
        z, z_ceiling, z_floor = (fisher_z(v) for v in measured)
        return np.asarray(z - (z_ceiling + z_floor) / 2, dtype=float)

    def gap(self, part: pd.DataFrame, options: Options) -> tuple[float, float, float]:
        """The median z gap between the ceiling and the floor over the images where all three scores are defined,
        and the bounds of its interval at the options' level (the references separate when the lower bound is at
        least :data:`SMALLEST_GAP`; they may still separate on more images while the upper bound is)."""
        measured = self.references(part)
        assert measured is not None, "a gap needs rows with the references"
        _, z_ceiling, z_floor = (fisher_z(v) for v in measured)
        defined = np.isfinite(self.differences(part))
        groups = self.twin_groups(part)
        return bootstrap_ci((z_ceiling - z_floor)[defined], options.interval_level,
                            groups=groups[defined] if groups is not None else None)

    def evaluate(self, part: pd.DataFrame, options: Options, controls: pd.DataFrame | None = None) -> VerdictCell:
        """The outcome of the readings in the class docstring's order.

        Parameters
        ----------
        part : DataFrame
            The rows of one model x method.
        options : Options
            The check's options (the interval's level).
        controls : DataFrame, optional
            The same model's control rows: the scale's ends (:func:`~audit.checks.scale.scale_of`).

        Returns
        -------
        VerdictCell
            Score: the median similarity to the permuted-label twin.
        """
        if self.metric not in part:
            return VerdictCell(float("nan"), "n/a", None)
        level, seeds, groups = options.interval_level, self.replicates(part), self.twin_groups(part)
        scale = self.scale(controls)
        rows = part.sort_values("image")
        pairs = self.pairs(part)
        twin = nearer_unchanged(rows[self.metric].to_numpy(float), scale, "twin", level=level,
                                groups=groups if pairs > 1 else None)
        measured = self.references(part)
        floor = nearer_unchanged(self.floor_scores(part, scale), scale, "untrained", level=level, groups=seeds) \
            if measured is not None else None
        if floor is not None and floor.outcome == REJECTED:
            return _cell(twin.score, REJECTED, f"an untrained copy keeps the map, {reading(floor)}{scale.note()}", floor,
                         reason="an untrained copy keeps the map: it does not depend on what the model learned")
        where = scale.note() + pair_note(pairs)
        alone = "; no control twin" if measured is None else ""
        if twin.outcome == REJECTED:
            return _cell(twin.score, REJECTED, f"{reading(twin)} nearer unchanged{where}{alone}", twin)
        if measured is None:
            return _cell(twin.score, twin.outcome, f"{reading(twin)}{where}{alone}", twin)
        score, ceiling, untrained = measured
        d = self.differences(part)
        defined = np.isfinite(d)
        medians = (f"twin {np.nanmedian(score):.3f}, control {np.nanmedian(ceiling):.3f}, "
                   f"untrained {np.nanmedian(untrained):.3f}")
        if too_few(int(defined.sum()), len(d)):
            return _cell(twin.score, INCONCLUSIVE, f"{len(d) - int(defined.sum())} of {len(d)} images undefined",
                         twin)
        gap, low_gap, high_gap = self.gap(part, options)
        assert floor is not None
        if low_gap >= SMALLEST_GAP:
            cell = scored_cell(d, 0.0, label="nearer the control than the untrained copy by (z)", level=level,
                               groups=groups, short="nearer control (z)")
            outcome = _both(cell.outcome, floor.outcome)
            return _cell(twin.score, outcome, f"{reading(cell)}; {medians}{where}", cell)
        outcome = _both(twin.outcome, floor.outcome)
        same = (f"the control twin and an untrained copy do not separate (z gap {gap:.2f} [{low_gap:.2f}, "
                f"{high_gap:.2f}], under {SMALLEST_GAP:g}): the maps change with the seed as much as with the labels")
        return _cell(twin.score, outcome, f"{reading(twin)}; {medians}; {same}{where}", twin,
                     final=not high_gap >= SMALLEST_GAP)

    def rejects_when(self, options: Options) -> str:
        return ("an untrained copy or the permuted-label twin nearer the edge map's score than the random map's, or "
                "the twin nearer the control twin than the untrained copy")

    def rule_text(self, options: Options) -> str:
        return (f"rejected when an untrained copy's {self.score_name} to the model's map lies nearer the edge map's "
                "score (unchanged) than the random map's (unrelated), both measured in the run (the map does not "
                "depend on what the model learned), or when the permuted-label twin's does "
                f"({self.failure}); else, where the control twin (the same "
                "recipe on the true labels) and the untrained copy separate by Cohen's small difference (z gap "
                f"{SMALLEST_GAP:g}), rejected when the twin lies nearer the control than the untrained copy on "
                "Fisher's z scale, not rejected when nearer the untrained copy; where they do not separate, not "
                "rejected when the twin lies nearer the unrelated end; inconclusive where a reading's interval "
                "contains its midpoint; each reading per image, on the interval of the median (with several twin "
                "pairs, the readings of the twins resample the pairs, then the images)"
                + (f"; the {self.score_name} is {self.why}" if self.why else ""))


def pair_note(pairs: int) -> str:
    """What a cell read on the twins adds: how many pairs its interval resampled, or that it rests on one."""
    return f"; {pairs} twin pairs resampled" if pairs > 1 else "; rests on one twin pair"


def _both(reading: str | None, floor: str | None) -> str | None:
    """A cell's outcome from a reading that may reject and the floor's reading, which did not: the reading's where
    it rejects or both do not, else inconclusive."""
    if reading == REJECTED or (reading == NOT_REJECTED and floor == NOT_REJECTED):
        return reading
    return INCONCLUSIVE


def _cell(score: float, outcome: str | None, text: str, reading: VerdictCell, *, reason: str = "",
          final: bool = True) -> VerdictCell:
    """A verdict cell with its outcome leading its text (and a rejection's ``reason`` after it)."""
    head = f"{outcome}: {reason}" if reason else str(outcome)
    return VerdictCell(score, f"{head} ({text})", outcome, reading.undefined, final and reading.final, reason=reason,
                       reading=reading.reading)


@dataclass(frozen=True)
class NearerThanUnrelated(MedianScore):
    """A verdict read, image by image, between a map's similarity to itself (1, the ceiling) and the same measure
    against an unrelated map (column ``floor``: another image's map under the same comparison, so that what every
    map of the method shares on this data, an object's place or the input's background, is in the floor too).

    Rejected when the score lies nearer the ceiling: the 99 % interval of the median of
    ``score - (1 + floor) / 2`` (:func:`nearer`) at or above 0; not rejected when it lies below 0; inconclusive when
    it contains 0. Without a floor measured (one image per seed), the score is read on the controls' scale
    (:mod:`audit.checks.scale`), marked so.

    Parameters
    ----------
    score_column, text_column, failure, score_name, metric, select
        As :class:`~audit.checks.base.MedianScore`; ``threshold`` is not read ("").
    floor : str, default "unrelated_spearman"
        The column of per-image scores against an unrelated map.
    """

    threshold: str = ""
    floor: str = "unrelated_spearman"

    def scale(self, controls: pd.DataFrame | None) -> Scale:
        return scale_of(controls, self.metric, self.select)

    def evaluate(self, part: pd.DataFrame, options: Options, controls: pd.DataFrame | None = None) -> VerdictCell:
        """The calibrated outcome; the score read on the controls' scale where no floor was measured. Score: the
        median ``metric``."""
        if self.metric not in part:
            return VerdictCell(float("nan"), "n/a", None)
        rows = self.select(part).sort_values("image")
        score = rows[self.metric].to_numpy(float)
        groups = self.replicates(part)
        if self.floor not in rows or not np.isfinite(rows[self.floor].to_numpy(float)).any():
            scale = self.scale(controls)
            cell = nearer_unchanged(score, scale, self.score_name, level=options.interval_level, groups=groups)
            return dataclasses.replace(cell, text=f"{cell.text[:-1]}; no unrelated map measured (one image per "
                                                  f"seed): read on the controls' scale{scale.note()})")
        floor = rows[self.floor].to_numpy(float)
        cell = scored_cell(nearer(score, 1.0, floor), 0.0, label="nearer its trained map than an unrelated one by",
                           level=options.interval_level, groups=groups, short="nearer trained")
        medians = f"{self.score_name} {np.nanmedian(score):.3f}, unrelated {np.nanmedian(floor):.3f}"
        median = float(np.nanmedian(score)) if np.isfinite(score).any() else float("nan")
        return VerdictCell(median, f"{cell.text[:-1]}; {medians})", cell.outcome, cell.undefined, reading=cell.reading)

    def rejects_when(self, options: Options) -> str:
        return f"the {self.score_name} nearer a map's own (1) than an unrelated map's"

    def rule_text(self, options: Options) -> str:
        return (f"rejected ({self.failure}) when, image by image, the {self.score_name} lies nearer to a map's "
                "similarity to itself (1) than to its similarity to an unrelated map (another image's, compared the "
                f"same way): the interval of the median of {self.score_name} - (1 + unrelated) / 2 at or above "
                "0; not rejected when it lies below 0, inconclusive when it contains 0; without an unrelated map "
                "(one image per seed), read on the controls' scale: rejected when nearer the edge map's score than "
                "the random map's")


@dataclass(frozen=True)
class OnScale(MedianScore):
    """A verdict read on the controls' scale (:mod:`audit.checks.scale`): rejected when the 99 % interval of the
    median ``metric`` over the rows ``select`` keeps lies at or above the midpoint between the edge map's score
    (unchanged) and the random map's (unrelated), not rejected when it lies below, inconclusive when it contains it.

    Parameters
    ----------
    score_column, text_column, failure, score_name, metric, select, why
        As :class:`~audit.checks.base.MedianScore`; ``threshold`` is not read ("").
    """

    threshold: str = ""

    def scale(self, controls: pd.DataFrame | None) -> Scale:
        return scale_of(controls, self.metric, self.select)

    def evaluate(self, part: pd.DataFrame, options: Options, controls: pd.DataFrame | None = None) -> VerdictCell:
        if self.metric not in part:
            return VerdictCell(float("nan"), "n/a", None)
        scale = self.scale(controls)
        cell = nearer_unchanged(self.per_image(part).to_numpy(float), scale, "", level=options.interval_level,
                                groups=self.replicates(part))
        pairs = f"{pair_note(int(part.twin_pair.nunique()))}" if "twin_pair" in part else ""
        return dataclasses.replace(cell, text=f"{cell.text[:-1]}{scale.note()}{pairs})")

    def rejects_when(self, options: Options) -> str:
        return f"the median {self.score_name} nearer the edge map's score than the random map's"

    def rule_text(self, options: Options) -> str:
        return (f"rejected ({self.failure}) when the interval of the median {self.score_name} lies nearer the "
                "edge map's score (unchanged) than the random map's (unrelated), both measured in the run; not "
                "rejected when it lies nearer the random map's; inconclusive when it contains the midpoint"
                + (f"; the {self.score_name} is {self.why}" if self.why else ""))
