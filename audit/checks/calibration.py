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
noise-level differences decide. Where the references do not separate, the method's maps do not tell a model that
learned the labels from one that learned nothing, and there is nothing to calibrate against: a map the same on
every model (the edge detector; input x gradient's magnitudes, set by the input) and a map different on every model
(the random map; the gradient on a small CNN) both give no gap. The fixed threshold then decides, and the cell says
so; likewise without a control twin.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from audit.checks.base import MedianScore, VerdictCell, VerdictRule, scored_cell, too_few
from audit.checks.options import Options
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
    """A verdict read between a ceiling and a floor measured per image (module docstring); without them (no
    control twin), the ``fixed`` rule's verdict, marked so.

    Parameters
    ----------
    score_column, text_column, failure, threshold, score_name, why
        As :class:`~audit.checks.base.VerdictRule`; ``threshold`` is the fixed rule's, read only where the
        references are missing and shown beside the calibrated outcome where the two differ.
    metric : str, default "spearman_abs"
        The column of per-image scores against the twin.
    ceiling, floor : str
        The columns of the per-image scores against the ceiling and the floor references.
    floor_seed : str
        The column of each image's replicate of the floor's re-initialisation seed: the intervals resample the
        seeds, then the images (:func:`~audit.measures.statistics.nested_median_ci`).
    """

    metric: str = "spearman_abs"
    ceiling: str = "control_spearman_abs"
    floor: str = "untrained_spearman_abs"
    floor_seed: str = "untrained_replicate"

    @property
    def fixed(self) -> MedianScore:
        """The fixed-threshold rule on the same measure: the verdict where no reference was measured."""
        return MedianScore(self.score_column, self.text_column, self.failure, self.threshold,
                           score_name=self.score_name, metric=self.metric, why=self.why)

    def per_image(self, part: pd.DataFrame) -> pd.Series:
        """The per-image scores against the twin (not the calibrated differences: a paired comparison of two models
        compares what each model's maps did)."""
        return self.fixed.per_image(part)

    def references(self, part: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(score, ceiling, floor) per image, sorted by image; None when the rows carry no reference."""
        if self.ceiling not in part or self.floor not in part or not np.isfinite(part[self.ceiling]).any():
            return None
        rows = part.sort_values("image")
        return tuple(rows[c].to_numpy(dtype=float) for c in (self.metric, self.ceiling, self.floor))  # type: ignore[return-value]

    def replicates(self, part: pd.DataFrame) -> np.ndarray | None:
        """Each image's floor seed's replicate, sorted by image; None where the rows carry none."""
        return part.sort_values("image")[self.floor_seed].to_numpy() if self.floor_seed in part else None

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
        groups = self.replicates(part)
        return bootstrap_ci((z_ceiling - z_floor)[defined], options.interval_level,
                            groups=groups[defined] if groups is not None else None)

    def evaluate(self, part: pd.DataFrame, options: Options) -> VerdictCell:
        """The calibrated outcome (module docstring), the fixed threshold's named beside it where it differs; the
        fixed rule's cell, marked, where the rows carry no reference or the references do not separate.

        Parameters
        ----------
        part : DataFrame
            The rows of one model x method.
        options : Options
            The check's options; the fixed rule reads ``threshold`` from them.

        Returns
        -------
        VerdictCell
            Score: the median of ``d`` (the fixed rule's median without a calibration).
        """
        fixed = self.fixed.evaluate(part, options)
        measured = self.references(part)
        if measured is None:
            return _marked(fixed, "fixed threshold: no control twin")
        d = self.differences(part)
        defined = np.isfinite(d)
        if too_few(int(defined.sum()), len(d)):
            return scored_cell(d, 0.0, level=options.interval_level, groups=self.replicates(part))  # inconclusive
        score, ceiling, floor = (v[defined] for v in measured)
        medians = f"twin {np.median(score):.3f}, control {np.median(ceiling):.3f}, untrained {np.median(floor):.3f}"
        gap, low_gap, high_gap = self.gap(part, options)
        if not low_gap >= SMALLEST_GAP:
            # final only where the gap's whole interval lies under the smallest gap: else more images may separate
            return _marked(fixed, f"fixed threshold: the control twin and an untrained model do not separate, z gap "
                                  f"{gap:.2f} [{low_gap:.2f}, {high_gap:.2f}] (not wholly at or above "
                                  f"{SMALLEST_GAP:g}); {medians}", final=not high_gap >= SMALLEST_GAP)
        cell = scored_cell(d, 0.0, label="nearer the control by (z)", level=options.interval_level,
                           groups=self.replicates(part))
        differs = beside_fixed(getattr(options, self.threshold), fixed.outcome, cell.outcome)
        return VerdictCell(cell.score, f"{cell.text[:-1]}; {medians}){differs}", cell.outcome, cell.undefined)

    def rule_text(self, options: Options) -> str:
        return (f"rejected ({self.failure}) when, image by image, the {self.score_name} to the twin lies nearer to "
                "the control twin's (the same recipe on the true labels) than to an untrained model's, on Fisher's z "
                "scale: the 99 % interval of the median of z(score) - (z(control) + z(untrained)) / 2 at or above 0; "
                "not rejected when it lies below 0, inconclusive when it contains 0; where the two references do not "
                f"separate by at least Cohen's small difference (z gap {SMALLEST_GAP:g}) or there is no control twin, "
                "the fixed threshold "
                f"{getattr(options, self.threshold)}"
                + (f"; the {self.score_name} is {self.why}" if self.why else ""))


def beside_fixed(threshold: float, fixed: str | None, calibrated: str | None) -> str:
    """What the fixed threshold would have decided, for a calibrated cell's text: "; fixed threshold T: outcome"
    where it differs from the calibrated outcome, else nothing."""
    return f"; fixed threshold {threshold}: {fixed}" if fixed != calibrated else ""


def _marked(cell: VerdictCell, why: str, final: bool = True) -> VerdictCell:
    """``cell`` with ``why`` added to its text: a fixed-threshold outcome standing where no calibration was
    possible (``final`` False: not yet, :attr:`~audit.checks.base.VerdictCell.final`)."""
    return VerdictCell(cell.score, f"{cell.text}; {why}", cell.outcome, cell.undefined, final)


@dataclass(frozen=True)
class NearerThanUnrelated(MedianScore):
    """A verdict read, image by image, between a map's similarity to itself (1, the ceiling) and the same measure
    against an unrelated map (column ``floor``: another image's map under the same comparison, so that what every
    map of the method shares on this data, an object's place or the input's background, is in the floor too).

    Rejected when the score lies nearer the ceiling: the 99 % interval of the median of
    ``score - (1 + floor) / 2`` (:func:`nearer`) at or above 0; not rejected when it lies below 0; inconclusive when
    it contains 0. Without a floor measured (one image per seed), the fixed threshold, marked so.

    Parameters
    ----------
    score_column, text_column, failure, threshold, score_name, metric, select
        As :class:`~audit.checks.base.MedianScore`; ``threshold`` is the fixed rule's, read only where no floor was
        measured and shown beside the calibrated outcome where the two differ.
    floor : str, default "unrelated_spearman"
        The column of per-image scores against an unrelated map.
    """

    floor: str = "unrelated_spearman"

    def evaluate(self, part: pd.DataFrame, options: Options) -> VerdictCell:
        """The calibrated outcome; the fixed rule's cell, marked, where no floor was measured. Score: the median
        ``metric`` (as the fixed rule's)."""
        fixed = super().evaluate(part, options)
        rows = self.select(part).sort_values("image")
        if fixed.outcome is None:
            return fixed
        if self.floor not in rows or not np.isfinite(rows[self.floor].to_numpy(float)).any():
            return _marked(fixed, "fixed threshold: no unrelated map measured (one image per seed)")
        score, floor = rows[self.metric].to_numpy(float), rows[self.floor].to_numpy(float)
        cell = scored_cell(nearer(score, 1.0, floor), 0.0, label="nearer its trained map than an unrelated one by",
                           level=options.interval_level, groups=self.replicates(part))
        medians = f"{self.score_name} {np.nanmedian(score):.3f}, unrelated {np.nanmedian(floor):.3f}"
        differs = beside_fixed(getattr(options, self.threshold), fixed.outcome, cell.outcome)
        return VerdictCell(fixed.score, f"{cell.text[:-1]}; {medians}){differs}", cell.outcome, cell.undefined)

    def rule_text(self, options: Options) -> str:
        return (f"rejected ({self.failure}) when, image by image, the {self.score_name} lies nearer to a map's "
                "similarity to itself (1) than to its similarity to an unrelated map (another image's, compared the "
                f"same way): the 99 % interval of the median of {self.score_name} - (1 + unrelated) / 2 at or above "
                "0; not rejected when it lies below 0, inconclusive when it contains 0; without an unrelated map "
                f"(one image per seed), the fixed threshold {getattr(options, self.threshold)}")
