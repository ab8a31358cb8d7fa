"""What a sanity check declares: its options, its unit of work, its result columns, its summary
line, its verdict contribution and its report sections. The runner, the configuration, the
verdict table, the CLI and the report are all derived from these declarations."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from audit.errors import ConfigError
from audit.measures.statistics import bootstrap_ci
from audit.sections import ReportContext, Section


@dataclass(frozen=True)
class Option:
    """A configuration key a check reads: its default, its help text, and what values are valid.

    ``choices``: the allowed values, when they are a fixed set; ``valid``: a predicate for
    numbers (e.g. ``lambda v: 0 < v <= 1``) and ``rule``: its wording in the error.
    """

    name: str
    default: Any
    help: str
    choices: tuple = ()
    valid: Callable[[Any], bool] | None = None
    rule: str = ""

    def check(self, value: Any) -> Any:
        """``value`` (an int widened to float where the default is a float), or a :class:`ConfigError`."""
        kind = type(self.default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{self.name} must be a {kind.__name__}, got {value!r} ({type(value).__name__})")
        if self.choices and value not in self.choices:
            raise ConfigError(f"invalid {self.name}={value!r}; valid: {', '.join(map(str, self.choices))}")
        if self.valid is not None and not self.valid(value):
            raise ConfigError(f"invalid {self.name}={value!r}: it must be {self.rule}")
        return value


@dataclass(frozen=True)
class UnitResult:
    """What one unit of work (one model, one method) returns: its tidy rows, and optionally example
    heatmaps to show in the report, (stages, images, H, W)."""

    table: pd.DataFrame
    maps: np.ndarray | None = None


@dataclass(frozen=True)
class VerdictCell:
    """A check's verdict for one model x method: a score, its display text, and whether it failed
    (None when the check says nothing, e.g. no rows)."""

    score: float
    text: str
    failed: bool | None


class VerdictRule:
    """How a check's table becomes a verdict for one model x method.

    ``score_column`` / ``text_column`` name the two columns it adds to the verdict table;
    ``failure`` is the reason printed when it fails; ``threshold`` names the configuration option
    compared with the score; ``score_name`` what the score measures, as the report labels it.
    """

    score_column: str
    text_column: str
    failure: str
    threshold: str
    score_name: str

    @property
    def better(self) -> str:
        """Which scores are the better ones, for the report: "lower" or "higher"."""
        return "higher" if self.comparison == "<" else "lower"

    def evaluate(self, part: pd.DataFrame, config) -> VerdictCell:
        raise NotImplementedError

    @property
    def comparison(self) -> str:
        """How the score fails against the threshold, for the report: ">=" or "<"."""
        return ">="

    def per_image(self, part: pd.DataFrame) -> pd.Series | None:
        """The per-image scores behind the verdict (indexed by image), for paired comparisons; None
        when the score is not per image."""
        return None


@dataclass(frozen=True)
class MedianScore(VerdictRule):
    """Fails when the median over images of ``metric`` (in the rows ``select`` keeps) reaches the
    threshold (the maps did not change enough), or with ``fails_below`` when it stays under it (a
    score where higher is better). Shown as the median with its 99 % bootstrap interval."""

    score_column: str
    text_column: str
    failure: str
    threshold: str
    score_name: str = "SSIM"
    metric: str = "ssim"
    select: Callable[[pd.DataFrame], pd.DataFrame] = lambda df: df
    fails_below: bool = False

    @property
    def comparison(self) -> str:
        return "<" if self.fails_below else ">="

    def per_image(self, part):
        rows = self.select(part).sort_values("image")
        return pd.Series(rows[self.metric].to_numpy(), index=rows.image.to_numpy())

    def evaluate(self, part, config):
        est, low, high = bootstrap_ci(self.per_image(part).to_numpy(), 0.99)
        if np.isnan(est):  # rows, but no image with a defined score (constant or non-finite maps)
            return VerdictCell(est, "undefined", None)
        threshold = getattr(config, self.threshold)
        return VerdictCell(est, f"{est:.3f} [{low:.3f}, {high:.3f}]",
                           bool(est < threshold if self.fails_below else est >= threshold))


RunUnit = Callable[[nn.Module, torch.Tensor, torch.Tensor, str, Any, bool], UnitResult]


@dataclass(frozen=True)
class Check:
    """One sanity check, as the registry (:mod:`audit.checks`) sees it.

    Parameters
    ----------
    name : the CLI's ``--tests`` name, e.g. ``"random-logit"``
    title : the report's heading
    reference : whom the protocol follows
    result_file : ``results/<result_file>`` holds the joined table
    columns : the unit table's columns (the runner adds ``model``)
    options : configuration keys the check reads
    run : the unit of work ``run(model, x, y, method, config, progress) -> UnitResult``, one model
        and one method
    summary : one line about a unit's table, printed as the run goes
    sections : ``sections(table, context) -> [Section]`` for the report (``table`` holds every model)
    verdict : its contribution to the verdict table, or None
    applies : whether a method can be checked at all (e.g. CSC needs a chain of rules); other units
        are written empty
    order : position in the registry (the configuration's, the report's and the verdict's order)
    description : the protocol in one line (the CLI's listing and the report's methods text)
    cite : BibTeX keys of the protocol's references (``reports.references``)
    per_image : whether every row describes one image (column ``image``), so that a unit's images can be
        computed in blocks (``image_block``); False for statistics pooled over images
    coverage : ``coverage(model, x, config) -> (rows, summary)``, what the check changes in a model
        besides its units (the randomization checks: which tensors each stage re-initialised), or None;
        the runner writes the rows to ``results/<result file>_coverage.csv`` and the summary to the
        manifest's ``coverage``
    """

    name: str
    title: str
    reference: str
    result_file: str
    columns: Sequence[str]
    options: Sequence[Option]
    run: RunUnit
    summary: Callable[[pd.DataFrame], str]
    sections: Callable[[pd.DataFrame, ReportContext], list[Section]]
    verdict: VerdictRule | None = None
    applies: Callable[[str], bool] = lambda method: True
    order: int = 100
    description: str = field(default="")
    cite: tuple[str, ...] = ()
    per_image: bool = True
    coverage: Callable[[nn.Module, torch.Tensor, Any], tuple[pd.DataFrame, dict]] | None = None

    @property
    def coverage_file(self) -> str:
        """Where the runner writes the coverage rows, beside the result file."""
        return self.result_file.removesuffix(".csv") + "_coverage.csv"
