"""Efficient model parameter randomization test, eMPRT (Hedstroem et al. 2023, "Sanity Checks
Revisited"; 2024, "A Fresh Look at Sanity Checks for Saliency Maps").

Instead of comparing maps before and after randomization (which depends on a similarity measure
and its normalisation), eMPRT measures how much the maps' complexity rises: a map that depends on
the learned weights should look like noise once every layer is randomized. Complexity is the
discrete entropy (scipy, natural log) of the histogram of the map's values in ``n_bins`` equal-width
bins; the score is (H(e_rand) - H(e)) / H(e), e the trained model's map and e_rand the map after
randomizing every layer (bottom-up by default). Higher is better. Controls: the edge map does not
depend on the model (score exactly 0); a random map has the same entropy before and after (about 0).
The per-stage curve (the same ratio after each stage) is reported too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy import special

from attributions.hygiene import leaves_process_alone
from audit.checks.base import Check, MedianScore, UnitResult
from audit.checks.coverage import paragraph as coverage_paragraph
from audit.checks.coverage import recorded_in
from audit.checks.options import UnitContext, option
from audit.checks.passes import Params
from audit.checks.randomization import frame, stage_batches, stage_columns, stage_figure, stage_maps
from audit.checks.replicates import joined, per_seed
from audit.checks.stage_options import ORDERS, StageOptions, StageSettings, stage_settings
from audit.errors import ConfigError
from audit.inputs import Images, Labels, Methods, Reduction, check_inputs
from audit.measures.similarity import degenerate
from audit.sections import ReportContext, Section

COLUMNS = ["method", "stage", "layer", "image", "replicate", "entropy", "score", "share"]


def discrete_entropy(maps: torch.Tensor, n_bins: int = 100) -> np.ndarray:
    """Entropy of the histogram of each map's values: (N, ...) -> (N,).

    ``n_bins`` equal-width bins between each map's minimum and maximum (numpy's ``histogram``);
    natural logarithm (``scipy.stats.entropy`` of the counts). A constant map has entropy 0; a map
    with NaN / inf values, NaN (undefined, as the eMPRT score of a constant trained map).
    """
    if n_bins < 1:
        raise ConfigError(f"n_bins must be a positive integer, got {n_bins}")
    flat = maps.reshape(maps.shape[0], -1).detach().cpu().double()
    finite = torch.isfinite(flat).all(1).numpy()
    counts = histograms(torch.nan_to_num(flat, 0.0, 0.0, 0.0).numpy(), n_bins)
    # scipy.stats.entropy of each row's counts, without its per-call overhead (it dominated eMPRT's time)
    return np.where(finite, special.entr(counts / counts.sum(1, keepdims=True)).sum(1), np.nan)


def histograms(rows: np.ndarray, n_bins: int) -> np.ndarray:
    """``np.histogram(row, bins=n_bins)`` counts of every row of (N, P) at once -> (N, n_bins) float64.

    numpy's binning exactly: equal-width edges from ``linspace`` between the row's extremes (widened
    by 0.5 each way for a constant row), each value's bin from its scaled offset, then moved by one
    where it falls on the wrong side of an edge by rounding; the last bin includes its right edge.
    """
    n = len(rows)
    low, high = rows.min(1), rows.max(1)
    constant = low == high
    low, high = np.where(constant, low - 0.5, low), np.where(constant, high + 0.5, high)
    edges = np.linspace(low, high, n_bins + 1, axis=1)  # (N, n_bins + 1)
    index = ((rows - low[:, None]) / (high - low)[:, None] * n_bins).astype(np.intp)
    index[index == n_bins] -= 1
    index -= rows < np.take_along_axis(edges, index, 1)
    index += (rows >= np.take_along_axis(edges, index + 1, 1)) & (index != n_bins - 1)
    offsets = (np.arange(n) * n_bins)[:, None]
    return np.bincount((index + offsets).ravel(), minlength=n * n_bins).reshape(n, n_bins).astype(np.float64)


@leaves_process_alone
def efficient_mprt(model: torch.nn.Module, x: Images, y: Labels, methods: Methods = "all", *, n_bins: int = 100,
                   stages: StageSettings | None = None, reduction: Reduction | None = None, progress: bool = True,
                   curve: bool = True, params: Params | None = None, **settings: Any) -> pd.DataFrame:
    """eMPRT: the relative rise in the maps' entropy as the model's layers are randomized.

    Parameters
    ----------
    model : nn.Module; never modified (stages are copies)
    x : (B, C, H, W) images
    y : (B,) labels
    methods : names, "all" or a comma-separated string
    n_bins : histogram bins of the entropy
    stages : the :class:`~audit.checks.stage_options.StageSettings` (bottom-up by default, as Hedstroem et al.),
        or any of its fields as keywords (order, bn, init, granularity, target, seed)
    curve : explain every stage (the per-stage curve); False explains only the trained and the fully
        randomized model, which is all the score needs (Quantus's ``skip_layers``)
    reduction : {method: "sum" | "max-abs"} overrides of the heatmap reduction
    progress : whether to show progress bars
    params : {method: {name: value}}, parameters given to each method's explainer (an audit's pattern methods'
        patterns and their data), optional
    **settings : any field of the stage settings by keyword, in place of ``stages``

    Returns
    -------
    DataFrame, one row per method x stage x image: method, stage (0 = trained), layer (re-initialised
    at that stage), image, replicate (of the image's re-initialisation seed: :mod:`audit.checks.replicates`),
    entropy (of the map at that stage), score ((H_stage - H_0) / H_0; the eMPRT
    score is the last stage's, every layer randomized), share (of the parameters re-initialised).
    """
    stages = stage_settings(stages, settings, order="bottom-up")
    x, y = check_inputs(model, x, y)
    return joined(per_seed(model, x, y, stages, "efficient_mprt",
                           lambda p: _one_seed(model, p.x, p.y, methods, p.stages, n_bins, reduction, progress, curve,
                                               params=params)),
                  COLUMNS)


def _one_seed(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, methods: Methods, stages: StageSettings,
              n_bins: int, reduction: Reduction | None, progress: bool, curve: bool, *,
              params: Params | None) -> pd.DataFrame:
    """:func:`efficient_mprt` of images drawn with one seed, ``stages.seed``, without the ``replicate`` column."""
    parts: list[dict[str, np.ndarray]] = []
    first: dict[str, np.ndarray] = {}
    n = len(x)
    for batch in stage_batches(stage_maps(model, x, y, methods, stages, reduction=reduction, progress=progress,
                                          name="efficient_mprt", every_stage=curve, params=params)):
        measured: dict[str, dict[str, np.ndarray]] = {}
        for m in batch[0].maps:
            v = torch.cat([s.maps[m] for s in batch])  # the batch's stages measured at once
            h = np.where(degenerate(v), np.nan, discrete_entropy(v, n_bins))  # constant / non-finite: undefined
            h0 = np.tile(first.setdefault(m, h[:n]), len(batch))  # the trained model's, for each stage
            with np.errstate(invalid="ignore", divide="ignore"):
                # a constant trained map: undefined
                measured[m] = {"entropy": h, "score": np.where(h0 > 0, (h - h0) / h0, np.nan)}
        parts.append(stage_columns(batch, n, measured))
    return frame(parts, [c for c in COLUMNS if c != "replicate"])


@dataclass(frozen=True)
class EmprtOptions(StageOptions):
    """eMPRT's keys: the stage keys, its order, bins, curve and threshold."""

    emprt_order: str = option("bottom-up", "layer order of eMPRT's randomization", choices=ORDERS)
    emprt_bins: int = option(100, "histogram bins of eMPRT's entropy", valid=lambda v: v >= 2, rule=">= 2")
    emprt_curve: bool = option(True, "explain every randomization stage for eMPRT's curve (False: only the trained "
                               "and the fully randomized model, all the score needs)")
    emprt_threshold: float = option(0.0, "eMPRT score at or below which a method is rejected when the interval "
                                    "of its median lies there (default 0: the score of the model-independent edge "
                                    "control; Hedstroem et al. give eMPRT as a ranking, without a threshold)",
                                    valid=lambda v: v > -1, rule="> -1",
                                    source="a control: the edge map, which does not depend on the model, scores "
                                    "exactly 0 (its check in every run with controls); Hedstroem et al. 2023 rank "
                                    "methods by the score and give no threshold")


def _run(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, options: EmprtOptions,
         unit: UnitContext) -> UnitResult:
    return UnitResult(efficient_mprt(model, x, y, [method], n_bins=options.emprt_bins, progress=unit.progress,
                                     stages=options.stages(options.emprt_order, unit.seed, unit.first_image),
                                     curve=options.emprt_curve, params=unit.params))


def _sections(table: pd.DataFrame, context: ReportContext, options: EmprtOptions) -> list[Section]:
    threshold = options.emprt_threshold
    figures = [stage_figure(table, m, "score", "entropy rise (H - H_0) / H_0", f"emprt_{m}",
                            f"eMPRT on {m}: relative rise of each map's histogram entropy as layers are randomized",
                            threshold=threshold, meaning="a method whose interval lies at or under it after the last "
                            "stage is rejected")
               for m in table.model.unique()]
    return [Section("Efficient MPRT (eMPRT)", text="Relative rise of the maps' histogram entropy as layers are "
                    "randomized; the score is the last stage's. Higher is better; the edge control scores 0. Hedstroem "
                    "et al. rank methods by it and give no threshold: a method is rejected only where the interval "
                    "of its median lies at or below the threshold (by default 0, the model-independent edge control's "
                    "score), inconclusive where the interval contains it. "
                    + coverage_paragraph(context.run, "emprt_coverage.csv", list(table.model.unique())),
                    figures=figures)]


CHECK = Check(
    coverage=recorded_in(lambda options: options.emprt_order), options=EmprtOptions,
    name="emprt", cite=("hedstrom2024",), title="Efficient MPRT (eMPRT)", reference="Hedstroem et al. 2023, 2024",
    result_file="emprt.csv",
    columns=COLUMNS, run=_run, sections=_sections, order=40,
    summary=lambda df: f"median eMPRT score {df[df.stage == df.stage.max()].score.median():.3f}",
    verdict=MedianScore("emprt_score", "emprt", "complexity does not rise", "emprt_threshold",
                        score_name="eMPRT score (entropy ratio)", metric="score",
                        select=lambda df: df[df.stage == df.stage.max()], fails_below=True),
    question="Does the map grow more complex as the weights are randomized?",
    description="entropy of each map's histogram after randomizing every layer, relative to the trained model's",
    controls={"edge": "rejected"})
