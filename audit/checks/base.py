"""What a sanity check declares: its options, its unit of work, its result columns, its summary
line, its verdict contribution and its report sections. The runner, the configuration, the
verdict table, the CLI and the report are all derived from these declarations."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import numpy as np
import pandas as pd
import torch
from torch import nn

from audit.checks.options import CONFIDENCE, Options, UnitContext
from audit.measures.statistics import bootstrap_ci
from audit.sections import ReportContext, Section


@dataclass(frozen=True)
class UnitResult:
    """What one unit of work (one model, one method) returns: its tidy rows, and optionally example
    heatmaps to show in the report, (stages, images, H, W).

    Attributes
    ----------
    table : DataFrame
        The unit's rows, with the check's ``columns`` (the runner adds ``model`` when it joins the units).
    maps : numpy.ndarray or None, default None
        (stages, images, H, W) example heatmaps for the report, saved beside the unit's table; None: none
        kept.
    """

    table: pd.DataFrame
    maps: np.ndarray | None = None


# A sanity check can reject a method; it cannot certify one (Adebayo et al. 2018 call theirs "sanity checks" for
# this reason): the three outcomes of a check for one model x method.
REJECTED, NOT_REJECTED, INCONCLUSIVE = "rejected", "not rejected", "inconclusive"
OUTCOMES = (REJECTED, NOT_REJECTED, INCONCLUSIVE)
# each outcome's mark, for grey-scale prints and compact cells (no tick: a sanity check never certifies a method)
MARKS = {REJECTED: "\u2717", NOT_REJECTED: "\u2013", INCONCLUSIVE: "?"}
# the start of the reason of a cell whose check could not be read at all (what it needs is missing: a shortcut that
# was not planted): inconclusive, and no statement about the method, nor about the check when the method is a control
NOT_READ = "not read"
MIN_DEFINED = 3  # fewer images with a defined score than this (or than half of them): inconclusive


SHORT_LABEL = 20  # characters of a reading's name in a compact cell: a longer one (a layer's path) is cut


@dataclass(frozen=True)
class Reading:
    """The interval a verdict's outcome rests on: what was read (``label``: a stage, a reference model), its
    median ``estimate`` and the interval [``low``, ``high``]; the report's compact cells show it.

    Attributes
    ----------
    label : str
        What was read, e.g. ``"after fc"``, ``"untrained"``; "" where the check's score says it.
    estimate, low, high : float
        The median and its interval (NaN where undefined).
    at : float, default NaN
        The value the interval is read against (a threshold, a scale's midpoint); NaN where none is one number.
    images : int, default 0
        The images the interval was read on (0: not read on images, e.g. CSC's random vectors).
    """

    label: str
    estimate: float
    low: float
    high: float
    at: float = float("nan")
    images: int = 0

    def images_needed(self) -> int | None:
        """About how many images would decide an interval that contains :attr:`at`: the images read, times the
        square of the interval's half-width over the estimate's distance from :attr:`at` (a median's interval
        narrows as one over the square root of the images); None where that cannot be said (no images, no
        decision point, the estimate at it)."""
        distance = abs(self.estimate - self.at)
        if not (self.images and np.isfinite(distance) and distance > 0 and np.isfinite(self.high - self.low)):
            return None
        return int(np.ceil(round(self.images * ((self.high - self.low) / 2 / distance) ** 2, 9)))  # not 64.000001

    def short(self, labelled: bool = True) -> str:
        """The reading in at most about 40 characters: its label (cut at :data:`SHORT_LABEL`; none where not
        ``labelled``) and the median with its interval at two decimals, e.g. ``"untrained 0.91 [0.75, 0.98]"``."""
        label = "" if not labelled else self.label if len(self.label) <= SHORT_LABEL \
            else "…" + self.label[-(SHORT_LABEL - 1):]
        numbers = f"{self.estimate:.2f}" + (f" [{self.low:.2f}, {self.high:.2f}]"
                                            if np.isfinite(self.low) and self.low != self.high else "")
        return f"{label} {numbers}".strip()


@dataclass(frozen=True)
class VerdictCell:
    """A check's verdict for one model x method: a score, its display text, its outcome (one of
    :data:`OUTCOMES`; None when the check says nothing, e.g. no rows) and how many images gave no
    defined score (constant or non-finite maps).

    Attributes
    ----------
    score : float
        The score the verdict is read from (e.g. the median over images); NaN when there is none.
    text : str
        The verdict table's text, e.g. ``"rejected (0.912 [0.880, 0.934])"``, or ``"n/a"``.
    outcome : str or None
        :data:`REJECTED`, :data:`NOT_REJECTED` or :data:`INCONCLUSIVE`; None when the check says nothing.
    undefined : int, default 0
        Images without a defined score (constant or non-finite maps).
    final : bool, default True
        Whether more images could not change how the outcome is read: False for a calibrated verdict whose
        references might still separate on more images; a sequential run reads another look for such a cell, as
        for an inconclusive one.
    decided_by : str, default ""
        The option whose fixed value decided the outcome (a threshold), or "" where the outcome was read on a scale
        measured in the run (:mod:`audit.checks.scale`): the report counts the cells decided by a value without a
        source.
    reason : str, default ""
        Why it rejected, where that is not the rule's own failure (:attr:`VerdictRule.failure`): e.g. the fully
        randomized model keeps the map.
    reading : Reading or None, default None
        The interval the outcome rests on, for the report's compact cells; None where there is none (no rows, too
        few defined images).
    """

    score: float
    text: str
    outcome: str | None
    undefined: int = 0
    final: bool = True
    decided_by: str = ""
    reason: str = ""
    reading: Reading | None = None

    def short(self, labelled: bool = True) -> str:
        """The cell in at most about 40 characters: its outcome's mark and its :attr:`reading` (``labelled``: with
        what was read; or the outcome's word where it has none); "n/a" where the check says nothing."""
        if self.outcome is None:
            return "n/a"
        return f"{MARKS[self.outcome]} " + (self.reading.short(labelled) if self.reading is not None else self.outcome)


def interval_outcome(low: float, high: float, threshold: float, rejects_at_or_above: bool = True) -> str:
    """The outcome of a score's interval [low, high] against ``threshold``: rejected when the whole interval lies
    on the rejecting side (the threshold itself counts as rejecting), not rejected when it lies wholly on the
    other side, inconclusive when it contains the threshold."""
    if rejects_at_or_above:
        return REJECTED if low >= threshold else NOT_REJECTED if high < threshold else INCONCLUSIVE
    return REJECTED if high <= threshold else NOT_REJECTED if low > threshold else INCONCLUSIVE


def looked(level: float, images: int) -> str:
    """The text a verdict cell adds for an interval of a sequential run's look: its level and the images it read
    ("" at the one-look level)."""
    return "" if level == CONFIDENCE else f"; {level:.2%} interval, {images} images"


def too_few(defined: int, total: int) -> bool:
    """Whether ``defined`` of ``total`` images are too few to conclude: under :data:`MIN_DEFINED` or under half."""
    return defined < MIN_DEFINED or 2 * defined < total


def seed_spread(values: np.ndarray, groups: np.ndarray | None) -> str:
    """The medians of per-image ``values`` (NaN dropped) per re-initialisation seed's replicate ``groups`` (both
    (n,)), for a verdict's text: "" with one replicate."""
    if groups is None or len(np.unique(groups)) < 2:
        return ""
    medians = [np.median(v[np.isfinite(v)]) for v in (values[groups == g] for g in np.unique(groups))
               if np.isfinite(v).any()]
    return f"; {len(np.unique(groups))} seeds, their medians {min(medians):.3f} to {max(medians):.3f}" if medians else ""


def scored_cell(values: np.ndarray, threshold: float, rejects_at_or_above: bool = True, label: str = "",
                level: float = CONFIDENCE, groups: np.ndarray | None = None, *, short: str | None = None) -> VerdictCell:
    """The verdict on per-image ``values`` (NaN: undefined): the median with its ``level`` bootstrap interval
    against ``threshold`` (:func:`interval_outcome`), inconclusive when too few are defined (:func:`too_few`). The
    text starts with ``label`` (e.g. the stage it is read at) and ends with the undefined count; an interval of
    another level than 99 % (a sequential run's look) says its level and the images it read. ``groups`` (n,): each
    image's re-initialisation seed's replicate, where the images share seeds out: the interval resamples the seeds
    too (:func:`~audit.measures.statistics.nested_median_ci`) and the text gives each seed's median. ``short``: the
    reading's name in a compact cell (default ``label``)."""
    values = np.asarray(values, dtype=float)
    finite = np.isfinite(values)
    bad = int((~finite).sum())
    kept = groups[finite] if groups is not None else None
    est, low, high = bootstrap_ci(values[finite], level, groups=kept)
    prefix = f"{label}: " if label else ""
    suffix = (f"; {bad} of {len(values)} undefined" if bad else "") + seed_spread(values, groups) \
        + looked(level, len(values))
    if too_few(len(values) - bad, len(values)):
        return VerdictCell(est, f"{INCONCLUSIVE} ({prefix}{bad} of {len(values)} images undefined: constant or "
                                "non-finite maps)", INCONCLUSIVE, bad)
    outcome = interval_outcome(low, high, threshold, rejects_at_or_above)
    return VerdictCell(est, f"{outcome} ({prefix}{est:.3f} [{low:.3f}, {high:.3f}]{suffix})", outcome, bad,
                       reading=Reading(label if short is None else short, est, low, high, threshold, len(values)))


@dataclass(frozen=True)
class VerdictRule:
    """How a check's table becomes a verdict for one model x method: one of :data:`OUTCOMES`.

    Subclasses implement :meth:`evaluate` (and override :attr:`comparison`, :attr:`reads` and
    :meth:`per_image` where they differ).

    Parameters
    ----------
    score_column : str
        The verdict table's column for the score (e.g. ``random_logit_ssim``).
    text_column : str
        The verdict table's column for the verdict's text.
    failure : str
        The reason given when it rejects.
    threshold : str
        The name of the field of the check's options compared with the score.
    score_name : str, default "SSIM"
        What the score measures, as the report labels it.
    why : str, default ""
        Why this measure carries the verdict (e.g. the source paper's measure for the check's setting), for the
        report's rule text.
    read_against : str, default "on the controls' scale"
        What a rule that reads no option reads its scores against, in a few words (the methods text's summary).
    """

    score_column: str
    text_column: str
    failure: str
    threshold: str
    score_name: str = "SSIM"
    why: str = ""

    @property
    def reads(self) -> tuple[str, ...]:
        """The fields of the check's options the rule reads (none for a rule read on the controls' scale)."""
        return (self.threshold,) if self.threshold else ()

    read_against: str = "on the controls' scale"

    def scale(self, controls: pd.DataFrame | None) -> Any:
        """The :class:`~audit.checks.scale.Scale` the rule reads its scores on, from the model's ``controls`` rows;
        None for a rule read against a threshold."""
        return None

    @property
    def readings(self) -> int:
        """How many intervals the rule reads that can each reject (the family-wise error counts them)."""
        return 1

    def replicates(self, part: pd.DataFrame) -> np.ndarray | None:
        """The draw each image's score rests on (a re-initialisation seed's replicate), in image order; None for a
        rule whose scores rest on no draw of their own."""
        return None

    @property
    def better(self) -> str:
        """Which scores are the better ones, for the report: "lower" or "higher"."""
        return "higher" if self.comparison == "<=" else "lower"

    def evaluate(self, part: pd.DataFrame, options: Options, controls: pd.DataFrame | None = None) -> VerdictCell:
        """The verdict on one model x method's rows ``part``, under the check's ``options``.

        Parameters
        ----------
        part : DataFrame
            The rows of the check's result table for one model and one method (not empty).
        options : Options
            The check's own options; the rule reads the fields it names in :attr:`reads`.
        controls : DataFrame, optional
            The same model's rows of the controls (the edge and the random map) under the same check: the ends of
            the scale a rule read on it takes (:mod:`audit.checks.scale`); without them, the measure's own ends.

        Returns
        -------
        VerdictCell
            The score, its text and the outcome.
        """
        raise NotImplementedError

    @property
    def comparison(self) -> str:
        """How the score rejects against the threshold, for the report: ">=" or "<="."""
        return ">="

    def rejects_when(self, options: Options) -> str:
        """What rejects, in a few words, for the report's how-to-read table (:meth:`rule_text` in full)."""
        return (f"the median {self.score_name}'s interval at or {'above' if self.comparison == '>=' else 'below'} "
                f"{getattr(options, self.threshold)}")

    def rule_text(self, options: Options) -> str:
        """The rule in one sentence, for the report."""
        return (f"rejected ({self.failure}) when the interval of the median {self.score_name} lies at or "
                f"{'above' if self.comparison == '>=' else 'below'} {getattr(options, self.threshold)}, not rejected "
                "when it lies wholly on the other side, inconclusive when it contains the threshold"
                + (f"; the {self.score_name} is {self.why}" if self.why else ""))

    def per_image(self, part: pd.DataFrame) -> pd.Series | None:
        """The per-image scores behind the verdict (indexed by image), for paired comparisons; None
        when the score is not per image."""
        return None


@dataclass(frozen=True)
class MedianScore(VerdictRule):
    """Rejects when the 99 % bootstrap interval of the median over images of ``metric`` (in the rows
    ``select`` keeps) lies at or above the threshold (the maps did not change enough), or with
    ``fails_below`` at or below it (a score where higher is better); inconclusive when the interval
    contains the threshold or too few images give a defined score (:func:`scored_cell`).

    Parameters
    ----------
    score_column, text_column, failure, threshold, score_name, why, read_against
        As :class:`VerdictRule`.
    metric : str, default "ssim"
        The column of per-image scores (NaN: undefined).
    select : callable, default identity
        ``select(part) -> rows``: the rows the score is read from (e.g. one stage's), one per image
        (column ``image``).
    fails_below : bool, default False
        Reject at or below the threshold instead of at or above it.
    """

    metric: str = "ssim"
    select: Callable[[pd.DataFrame], pd.DataFrame] = lambda df: df
    fails_below: bool = False

    @property
    def comparison(self) -> str:
        return "<=" if self.fails_below else ">="

    def per_image(self, part: pd.DataFrame) -> pd.Series:
        rows = self.select(part).sort_values("image")
        return pd.Series(rows[self.metric].to_numpy(), index=rows.image.to_numpy())

    def replicates(self, part: pd.DataFrame) -> np.ndarray | None:
        """The draw each image's score rests on, in :meth:`per_image`'s order: its re-initialisation seed's
        replicate (column ``replicate``), else its twin pair (``twin_pair``: a data-randomization table); None when
        the table has neither (a check that draws nothing)."""
        rows = self.select(part).sort_values("image")
        column = next((c for c in ("replicate", "twin_pair") if c in rows), None)
        return rows[column].to_numpy() if column is not None else None

    def evaluate(self, part: pd.DataFrame, options: Options, controls: pd.DataFrame | None = None) -> VerdictCell:
        """The median of ``metric`` over the images ``select`` keeps, against the threshold (:func:`scored_cell`).

        Parameters
        ----------
        part : DataFrame
            The rows of the check's result table for one model and one method.
        options : Options
            The check's own options; ``getattr(options, threshold)`` is the threshold.
        controls : DataFrame, optional
            Not read: the threshold is the option's.

        Returns
        -------
        VerdictCell
            The median, its text with the 99 % interval and the undefined count, and the outcome; score NaN,
            text ``"n/a"`` and outcome None when the table has no ``metric`` column (written before the
            check measured it).
        """
        if self.metric not in part:  # a table written before the check measured it
            return VerdictCell(float("nan"), "n/a", None)
        cell = scored_cell(self.per_image(part).to_numpy(), getattr(options, self.threshold), not self.fails_below,
                           level=options.interval_level, groups=self.replicates(part))
        return dataclasses.replace(cell, decided_by=self.threshold)


# a check's own Options class: what its unit, its report sections and its coverage receive
OptionsT = TypeVar("OptionsT", bound=Options)
RunUnit = Callable[[nn.Module, torch.Tensor, torch.Tensor, str, OptionsT, UnitContext], UnitResult]
Sections = Callable[[pd.DataFrame, ReportContext, OptionsT], list[Section]]
Coverage = Callable[[nn.Module, torch.Tensor, OptionsT, int], tuple[pd.DataFrame, dict[str, Any]]]


@dataclass(frozen=True)
class Check(Generic[OptionsT]):
    """One sanity check, as the registry (:mod:`audit.checks`) sees it, generic over its options class (``OptionsT``).

    Parameters
    ----------
    name : the CLI's ``--tests`` name, e.g. ``"random-logit"``
    title : the report's heading
    reference : whom the protocol follows
    result_file : ``results/<result_file>`` holds the joined table
    columns : the unit table's columns (the runner adds ``model``)
    options : the check's :class:`~audit.checks.options.Options` class: its configuration keys, declared once
    run : the unit of work ``run(model, x, y, method, options, unit) -> UnitResult``, one model and one method,
        with the check's options and the :class:`~audit.checks.options.UnitContext`
    summary : one line about a unit's table, printed as the run goes
    sections : ``sections(table, context, options) -> [Section]`` for the report (``table`` holds every model)
    verdict : its contribution to the verdict table, or None
    applies : whether a method can be checked at all (e.g. CSC needs a chain of rules); other units
        are written empty
    side_rules : more verdict rules shown beside ``verdict`` in the verdict table (another similarity, where
        it may disagree) that do not count in the verdict
    controls : the outcome each control method must have under this check (the edge detector, the random map);
        a control with another outcome marks the check as broken in the report
    twins : the twins the unit also takes: ``labels``, the model's permuted-label twins and control twins
        (``unit.twins``, ``unit.controls``), or ``shortcut``, its shortcut twin and tag control twin
        (``unit.shortcut``); "" none. A model without them is
        skipped, and the manifest and the report say so
    order : position in the registry (the configuration's, the report's and the verdict's order)
    description : the protocol in one line (the CLI's listing and the report's methods text)
    question : what the check asks of a map, in one short question (the report's how-to-read table)
    cite : BibTeX keys of the protocol's references (``reports.references``)
    per_image : whether every row describes one image (column ``image``), so that a unit's images can be
        computed in blocks (``image_block``); False for statistics pooled over images
    coverage : ``coverage(model, x, options, seed) -> (rows, summary)``, what the check changes in a model
        besides its units (the randomization checks: which tensors each stage re-initialised), or None;
        the runner writes the rows to ``results/<result file>_coverage.csv`` and the summary to the
        manifest's ``coverage``
    """

    name: str
    title: str
    reference: str
    result_file: str
    columns: Sequence[str]
    run: RunUnit[OptionsT]
    summary: Callable[[pd.DataFrame], str]
    sections: Sections[OptionsT]
    options: type[OptionsT] = cast(Any, Options)  # a check without keys of its own
    verdict: VerdictRule | None = None
    side_rules: tuple[VerdictRule, ...] = ()
    controls: dict[str, str] = field(default_factory=dict)
    twins: str = ""
    applies: Callable[[str], bool] = lambda method: True
    order: int = 100
    description: str = field(default="")
    question: str = ""
    cite: tuple[str, ...] = ()
    per_image: bool = True
    coverage: Coverage[OptionsT] | None = None

    def __post_init__(self) -> None:
        fields = {o.name for o in self.options.declared()}
        for rule in (self.verdict, *self.side_rules):
            missing = [n for n in (rule.reads if rule is not None else ()) if n not in fields]
            if missing:
                raise TypeError(f"check {self.name}: its verdict reads {missing[0]!r}, not a field of "
                                f"{self.options.__name__}")

    def options_from(self, values: Mapping[str, Any], looks: int = 1, family: int = 1) -> OptionsT:
        """The check's options from a configuration's flat keys (:meth:`Options.parse`), read ``looks`` times by
        a sequential run (a check whose units are not split by images is read once), in a run whose checks read
        ``family`` rejecting intervals per method."""
        return self.options.parse(values, looks if self.per_image else 1, family)

    @property
    def coverage_file(self) -> str:
        """Where the runner writes the coverage rows, beside the result file."""
        return self.result_file.removesuffix(".csv") + "_coverage.csv"
