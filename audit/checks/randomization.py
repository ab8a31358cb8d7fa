"""Model parameter randomization (Adebayo et al. 2018; Sixt et al. 2020; Hedstrom et al. 2023).

Stage 0 is the trained model; each later stage re-initialises one part of the model: a layer or a
block (:mod:`audit.checks.stages`; together the stages hold every parameter tensor), taken in
forward order from the traced graph: cumulatively from the logits down (``cascading``), one at a
time (``independent``) or cumulatively from the input up (``bottom-up``). Each part's draw comes from
a generator seeded by (seed, part name) (:mod:`audit.checks.reinit`), so stages are reproducible and
independent of the global RNG. BatchNorm is ``reset`` (gamma 1, beta 0, mean 0, var 1, as Sixt) or
keeps its statistics and parameters (``keep-stats``, as Adebayo). All work happens on copies of the
model, and each stage's forward pass is shared by all methods. Each stage's rows carry ``share``:
the fraction of the model's parameters (elements) re-initialised in that stage's model.
"""
from __future__ import annotations

import functools
import textwrap
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure
from torch import nn
from tqdm.auto import tqdm

from attributions import memory
from attributions.explainer import Explainer, attribute_many
from attributions.graph import Graph, trace
from attributions.hygiene import leaves_process_alone
from attributions.kinds import SIGNAL_KINDS
from attributions.records import Const
from attributions.shared_pass import SharedPass
from audit import style
from audit.checks.base import (
    INCONCLUSIVE,
    NOT_REJECTED,
    REJECTED,
    Check,
    Reading,
    UnitResult,
    VerdictCell,
    VerdictRule,
    looked,
    seed_spread,
    too_few,
)
from audit.checks.calibration import nearer
from audit.checks.coverage import paragraph as coverage_paragraph
from audit.checks.coverage import record as coverage_record
from audit.checks.options import CONFIDENCE, Options, UnitContext, option
from audit.checks.passes import Params, model_errors, prepare
from audit.checks.reinit import BN_POLICIES, INITS, reinitialise, reinitialise_part, reset_batchnorm
from audit.checks.replicates import joined, per_seed
from audit.checks.scale import Scale, nearer_unchanged, reading, scale_of
from audit.checks.stage_options import GRID_SCALES, ORDERS, StageOptions, StageSettings, measures_option, stage_settings
from audit.checks.stages import Part, Stage, randomization_plan
from audit.data.preprocess import Preprocess, preprocess_from
from audit.errors import AuditError
from audit.inputs import Images, Labels, Methods, Reduction, check_count, check_inputs, resolve_methods
from audit.measures.heatmaps import ComparableMaps, ReferenceMaps, follows, heatmaps, input_structure, signed_heatmaps
from audit.measures.measure_sets import MeasureSet
from audit.measures.statistics import bootstrap_ci, summarize
from audit.models.copying import copy_model
from audit.panels import family_panels, floor_line, floor_of, method_legend, threshold_line
from audit.progress import bars
from audit.sections import Figure, ReportContext, Section, print_first

__all__ = ["BN_POLICIES", "INITS", "ORDERS", "StageSettings", "parameter_randomization", "randomization_stages",
           "reinitialise", "reset_batchnorm", "stage_maps"]

COLUMNS = ["method", "stage", "layer", "image", "replicate", "ssim", "spearman", "spearman_abs", "hog", "input_spearman_abs",
           "edge_spearman_abs", "share"]
COMPARE_BYTES = 1 << 23  # maps per batch of measures (their buffers are about ten times as large)


def randomization_stages(model: nn.Module, stages: StageSettings, *, plan: list[Stage],
                         start: nn.Module | None = None) -> Iterator[tuple[int, str, nn.Module]]:
    """Yield (stage, stage name, model copy) for stage 0 (the original) and each randomisation stage: one copy,
    modified in place from stage to stage (read each stage before asking for the next).

    ``stages``: the order, BatchNorm policy, re-initialisation scheme and seed (:mod:`audit.checks.reinit`);
    ``plan``: the stages in forward order (:func:`audit.checks.stages.randomization_plan` of ``start``
    when given, else of ``model``); ``start``: an unmodified copy of ``model`` to randomize (made here
    when None).
    """
    sequence = list(reversed(plan)) if stages.order in ("cascading", "independent") else plan
    current = start if start is not None else copy_model(model)
    yield 0, "original", current
    previous: tuple[Part, ...] = ()
    for stage, step in enumerate(sequence, start=1):
        if stages.order == "independent":  # one copy: the last stage's parts trained again, then this stage's drawn
            restore_parts(current, model, previous)
            previous = step.parts
        for part in step.parts:
            reinitialise_part(current, part, stages.seed, stages.init, stages.bn)
        yield stage, step.name, current


def restore_parts(target: nn.Module, source: nn.Module, parts: tuple[Part, ...]) -> None:
    """Copy the tensors a re-initialisation of ``parts`` writes (their parameters; a BatchNorm's statistics too)
    from ``source`` into ``target``, a copy of it: ``target`` as it was before those parts were drawn."""
    with torch.no_grad():
        for part in parts:
            for t in part.tensors:
                target.get_parameter(t).copy_(source.get_parameter(t))
            if part.batchnorm:
                mine = dict(target.get_submodule(part.holder).named_buffers(recurse=False))
                for name, value in source.get_submodule(part.holder).named_buffers(recurse=False):
                    mine[name].copy_(value)


def untrained_copy(model: nn.Module, x: torch.Tensor, seed: int, init: str = "reset") -> nn.Module:
    """A copy of ``model`` with every parameter tensor re-initialised (the last stage of cascading randomization,
    BatchNorm reset): the model that learned nothing, seeded by ``seed``; ``x`` (B, C, H, W) traces the graph
    the stages are read from. ``model`` is not modified."""
    copy = copy_model(model)
    for stage in randomization_plan(copy, trace(copy, x[:1].detach()), "auto"):
        for part in stage.parts:
            reinitialise_part(copy, part, seed, init, "reset")
    return copy


@leaves_process_alone
def parameter_randomization(model: nn.Module, x: Images, y: Labels, methods: Methods = "all", *,
                            stages: StageSettings | None = None, reduction: Reduction | None = None,
                            progress: bool = True, measures: str | MeasureSet = "toolkit",
                            params: Params | None = None, **settings: Any) -> pd.DataFrame:
    """Similarity of each method's maps at every randomisation stage to the trained model's maps.

    Parameters
    ----------
    model : nn.Module; never modified (stages are copies)
    x : (B, C, H, W) images
    y : (B,) labels
    methods : names, "all" or a comma-separated string
    stages : the :class:`~audit.checks.stage_options.StageSettings` (default cascading)
    reduction : {method: "sum" | "max-abs"} overrides of the heatmap reduction
    progress : whether to show progress bars
    measures : how SSIM and HOG compare the maps (a measure set or its name)
    params : {method: {name: value}}, parameters given to each method's explainer (an audit's pattern methods'
        patterns and their data), optional
    **settings : any field of the stage settings by keyword, in place of ``stages``

    Returns
    -------
    DataFrame
        As :func:`randomization_with_maps`'s table.
    """
    return randomization_with_maps(model, x, y, methods, stages=stage_settings(stages, settings),
                                   reduction=reduction, progress=progress, measures=measures, params=params)[0]


@leaves_process_alone
def randomization_with_maps(model: nn.Module, x: Images, y: Labels, methods: Methods = "all", *,
                            stages: StageSettings | None = None, reduction: Reduction | None = None,
                            progress: bool = True, keep_maps: int = 0, measures: str | MeasureSet = "toolkit",
                            params: Params | None = None, **settings: Any) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Similarity of each method's maps at every randomisation stage to the trained model's maps,
    and the raw heatmaps of the first ``keep_maps`` images at every stage.

    Parameters
    ----------
    model : nn.Module; never modified (stages are copies)
    x : (B, C, H, W) images
    y : (B,) labels
    methods : names, "all" or a comma-separated string
    stages : the :class:`~audit.checks.stage_options.StageSettings` (order, bn, init, granularity, target,
        seed; default cascading); or any of its fields as keywords (``order="independent", bn="keep-stats"``)
    reduction : {method: "sum" | "max-abs"} overrides of the heatmap reduction
    keep_maps : how many images' raw heatmaps to keep at every stage
    progress : whether to show progress bars
    measures : how SSIM and HOG compare the maps: a :class:`~audit.measures.measure_sets.MeasureSet` or its name
        (``toolkit``, ``adebayo2018``)
    params : {method: {name: value}}, parameters given to each method's explainer (an audit's pattern methods'
        patterns and their data), optional
    **settings : any field of the stage settings by keyword, in place of ``stages``

    Returns
    -------
    DataFrame, one row per method x stage x image: method, stage, layer (the layer or block
    re-initialised at that stage; "original" for stage 0), image, replicate (of the image's re-initialisation
    seed: :mod:`audit.checks.replicates`), ssim (flip-invariant where the two maps are not
    of one sign), spearman (the signed maps: channel sums), spearman_abs (the heatmaps' magnitudes), hog,
    input_spearman_abs and edge_spearman_abs (Spearman of the map's magnitude with the input's and with its edges,
    :func:`~audit.measures.heatmaps.input_structure`: how far the map follows the input's structure), share (of the
    parameters re-initialised in that stage's model);
    and {method: (stages, keep_maps, H, W) array} (empty arrays when ``keep_maps`` is 0).
    """
    stages = stage_settings(stages, settings)
    x, y = check_inputs(model, x, y)
    check_count("keep_maps", keep_maps)
    runs = per_seed(model, x, y, stages, "parameter_randomization",
                    lambda p: _one_seed(model, p.x, p.y, methods, p.stages, reduction, progress, keep_maps, measures,
                                        params=params))
    df = joined([(table, part) for (table, _), part in runs], COLUMNS)
    shape = (0, 0) + tuple(x.shape[2:])
    return df, {m: np.concatenate([kept[m] for (_, kept), _ in runs], axis=1)[:, :keep_maps] if keep_maps
                else np.zeros(shape) for m in runs[0][0][1]}


def _one_seed(model: nn.Module, x: torch.Tensor, y: torch.Tensor, methods: Methods, stages: StageSettings,
              reduction: Reduction | None, progress: bool, keep_maps: int, measures: str | MeasureSet, *,
              params: Params | None) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """:func:`randomization_with_maps` of images drawn with one seed, ``stages.seed``: the table without its
    ``replicate`` column and the kept maps."""
    reference: dict[str, ReferenceMaps] = {}
    parts: list[dict[str, np.ndarray]] = []
    kept: dict[str, list[np.ndarray]] = {}
    n = len(x)
    structure = input_structure(x)  # how far a stage's map still follows the input
    for batch in stage_batches(stage_maps(model, x, y, methods, stages, reduction=reduction, progress=progress,
                                          name="parameter_randomization", params=params)):
        stacked = {m: ComparableMaps(torch.cat([s.maps[m] for s in batch]),
                                     torch.cat([s.signed[m] for s in batch]) if m in batch[0].signed else None,
                                     measures)
                   for m in batch[0].maps}
        if not reference:  # stage 0 (the trained model's maps) leads the first batch: prepared with it
            reference = {m: ReferenceMaps(v, n=n) for m, v in stacked.items()}
        sims = {m: reference[m].compare(stacked[m]) for m in reference}
        for m in reference:  # the maps' magnitude ranks, computed once for the measures, against the input's
            sims[m] |= follows(stacked[m], structure)
        for s in batch if keep_maps else ():
            for m in reference:
                kept.setdefault(m, []).append(s.maps[m][:keep_maps].numpy())
        parts.append(stage_columns(batch, n, sims))
    df = frame(parts, [c for c in COLUMNS if c != "replicate"])
    shape = (0, 0) + tuple(x.shape[2:])
    return df, {m: np.stack(kept[m]) if m in kept else np.zeros(shape) for m in reference}


Explain = Callable[[dict[str, Explainer], torch.Tensor, torch.Tensor, SharedPass | None], dict[str, torch.Tensor]]


def _plain(explainers: dict[str, Explainer], x: torch.Tensor, t: torch.Tensor,
           shared: SharedPass | None) -> dict[str, torch.Tensor]:
    return {m: v[0] for m, v in attribute_many(explainers, x, [t], shared).items()}


class StageMaps(NamedTuple):
    """One stage's maps: ``stage`` (0 = trained), ``layer`` (the stage's name), ``maps`` {method:
    (B, H, W) heatmaps}, ``share``, the fraction of the parameters re-initialised in its model, ``signed``
    {method: (B, H, W) signed channel sums} for the methods whose heatmap dropped the sign
    (:func:`~audit.measures.heatmaps.signed_heatmaps`)."""

    stage: int
    layer: str
    maps: dict[str, torch.Tensor]
    share: float
    signed: dict[str, torch.Tensor] = {}


def kept_trained(plan: list[Stage], bn: str) -> list[str]:
    """The parameter tensors the stages of ``plan`` leave trained under BatchNorm policy ``bn``."""
    return [t for stage in plan for part in stage.parts if part.batchnorm and bn == "keep-stats" for t in part.tensors]


def stage_maps(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None, methods: Methods, stages: StageSettings, *,
               reduction: Reduction | None = None, progress: bool = True, name: str = "randomization", explain: Explain = _plain,
               every_stage: bool = True, params: Params | None = None) -> Iterator[StageMaps]:
    """Yield a :class:`StageMaps` for the trained model (stage 0, layer "original") and each
    randomisation stage: the one loop every randomization-based check runs, as ``stages`` says, with one
    seed, ``stages.seed`` (:func:`~audit.checks.replicates.per_seed` shares several out over the images).

    ``explain(explainers, x, t, shared) -> {method: (B, C, H, W) maps}`` computes a stage's maps
    (default: each method's attribution; sMPRT averages over noisy inputs). ``name`` names the
    calling check in errors and in the progress bar. ``every_stage=False`` yields only the trained
    model's maps and the last stage's (the intermediate stages are still applied, not explained).
    Each stage's forward pass is shared by the methods, whose explainers take ``params`` ({method: {name:
    value}}); the model is never modified (stages are copies).
    A tensor no stage re-initialises (a BatchNorm's under ``bn="keep-stats"``) is named in a warning.
    ``x`` and ``y`` are the caller's, checked (:func:`~audit.inputs.check_inputs`) once by it.
    """
    if y is None:
        raise AuditError(f"{name} needs the labels y")
    names = resolve_methods(methods)
    order, bn, seed = stages.order, stages.bn, stages.seed
    start = copy_model(model)
    with model_errors():
        graph = trace(start, x)  # the stages modify this one copy: traced once
    plan = randomization_plan(start, graph, stages.granularity)
    sizes = {n: p.numel() for n, p in start.named_parameters()}
    total = sum(sizes.values()) or 1
    kept = kept_trained(plan, bn)
    if kept:
        warnings.warn(f"{name}: bn='keep-stats' leaves {len(kept)} BatchNorm parameter tensors trained "
                      f"({sum(sizes[t] for t in kept) / total:.1%} of the parameters), e.g. {', '.join(kept[:3])}; "
                      "bn='reset' re-initialises them", stacklevel=2)
    models = randomization_stages(model, stages, plan=plan, start=start)  # lazily: stages share one copy
    trained = None  # the trained model's shared forward pass
    explainers: dict[str, Explainer] | None = None  # the last stage's: kept while the stages modify one model in place
    changed: set[str] = set()  # the parts re-initialised so far
    drawn: set[str] = set()  # the tensors re-initialised so far
    for stage, layer, stage_model in tqdm(models, total=1 + len(plan), desc=f"{name} ({order})",
                                          disable=not bars(progress), leave=False):
        if stage:
            step = plan[-stage] if order != "bottom-up" else plan[stage - 1]
            fresh = set(step.tensors).difference(kept)
            changed = step.paths if order == "independent" else changed | step.paths
            drawn = fresh if order == "independent" else drawn | fresh
        share = sum(sizes[t] for t in drawn) / total
        if not every_stage and 0 < stage < len(plan):
            continue
        # the nodes upstream of every re-initialised part hold the trained model's values: taken, not recomputed
        reuse = (trained.values, unchanged_nodes(graph, changed)) if trained is not None else None
        # the random control draws afresh at every stage (seeded by the stage), a floor for the scores;
        # logits and labels checked on the trained model
        graph, explainers, shared, logits = prepare(stage_model, x, names, y if stage == 0 else None, graph,
                                                  seed + stage, reuse=reuse, previous=explainers, params=params)
        if stage == 0 and shared is not None:
            # kept while the stages run: under a memory budget only if it leaves room for a stage's own passes
            limit = memory.budget()
            trained = shared if limit is None or 3 * memory.tensor_bytes(shared.values) <= limit else None
        t = y if stages.target == "true" else logits.argmax(1)
        raw = explain(explainers, x, t, shared)
        yield StageMaps(stage, layer, heatmaps(raw, reduction), share, signed_heatmaps(raw, reduction))


def stage_batches(stages: Iterator[StageMaps], limit: int = COMPARE_BYTES) -> Iterator[list[StageMaps]]:
    """The :class:`StageMaps` of :func:`stage_maps` in lists of consecutive
    stages whose maps take about ``limit`` bytes (at least one stage each), so that a check measures
    several stages' maps in one batch: the measures' per-call costs are paid once per batch."""
    batch: list[Any] = []
    size = 0
    for item in stages:
        batch.append(item)
        size += sum(v.numel() * v.element_size() for v in item.maps.values())
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def stage_columns(batch: list[StageMaps], n: int, scores: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """A batch of stages' rows as columns, one row per stage x method x image in that order: method, stage,
    layer, image, share and each score of ``scores`` {method: {score: (len(batch) * n,) values, stage by
    stage}}; ``n`` images per stage."""
    methods = list(scores)
    shape = (len(batch), len(methods), n)

    def per(values: list[Any], axis: int, dtype: Any = None) -> np.ndarray:  # one value per stage or method
        return np.broadcast_to(np.expand_dims(np.array(values, dtype=dtype), [a for a in range(3) if a != axis]),
                               shape).ravel()

    columns = {"method": per(methods, 1, object), "stage": per([s.stage for s in batch], 0),
               "layer": per([s.layer for s in batch], 0, object), "share": per([float(s.share) for s in batch], 0),
               "image": np.broadcast_to(np.arange(n), shape).ravel()}
    for name in scores[methods[0]] if methods else ():
        columns[name] = np.stack([np.asarray(scores[m][name], dtype=float).reshape(len(batch), n) for m in methods],
                                 1).ravel()
    return columns


def frame(parts: list[dict[str, np.ndarray]], columns: list[str]) -> pd.DataFrame:
    """One DataFrame of ``columns`` from the :func:`stage_columns` of every batch, in order."""
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame({c: np.concatenate([p[c] for p in parts]) for c in columns})


def unchanged_nodes(graph: Graph, changed: set[str]) -> frozenset[str]:
    """The signal nodes of ``graph`` whose values do not depend on the layers named in ``changed`` (nor
    on their parameters, which the graph reads as const nodes named by them): upstream of all of them."""
    dirty: set[str] = set()
    for node in graph.nodes[1:]:
        attribute = node.record.attribute if isinstance(node.record, Const) else None
        owners = {node.path, attribute or node.path}  # the module it ran in; a parameter's name
        if any(o == c or o.startswith(c + ".") for o in owners for c in changed) or \
                any(i in dirty for i in (*node.inputs, *node.reads)):
            dirty.add(node.name)
    return frozenset(n.name for n in graph.nodes[1:] if n.name not in dirty and n.kind in SIGNAL_KINDS)


def stage_intervals(part: pd.DataFrame, metric: str, level: float = CONFIDENCE) -> pd.DataFrame:
    """Per randomization stage after the trained model (stage > 0), in order: the stage's name, the median of
    ``metric`` over images with its ``level`` bootstrap interval, and the images with a defined and with an
    undefined score. ``part``: one model x method's rows; where it has a ``replicate`` column (the images share
    re-initialisation seeds out), the interval resamples the seeds too."""
    out = []
    for (stage, layer), rows in part[part.stage > 0].groupby(["stage", "layer"], sort=True):
        values = rows[metric].to_numpy(dtype=float)
        defined = int(np.isfinite(values).sum())
        est, low, high = bootstrap_ci(values, level, groups=rows["replicate"].to_numpy() if "replicate" in rows else None)
        out.append({"stage": stage, "layer": layer, "median": est, "low": low, "high": high, "defined": defined,
                    "undefined": len(values) - defined})
    return pd.DataFrame(out, columns=["stage", "layer", "median", "low", "high", "defined", "undefined"])


def survived(intervals: pd.DataFrame, threshold: float) -> int:
    """How many stages from the top the map survives: consecutive stages whose whole 99 % interval lies at or
    above ``threshold`` (with enough images defined)."""
    count = 0
    for low, defined, undefined in zip(intervals.low.to_numpy(float), intervals.defined.to_numpy(int),
                                       intervals.undefined.to_numpy(int)):
        if too_few(int(defined), int(defined + undefined)) or not low >= threshold:
            break
        count += 1
    return count


@dataclass(frozen=True)
class Survival(VerdictRule):
    """The cascading verdict, read along the whole curve of ``metric`` over the stages, on the controls' scale and
    between the curve's own ends.

    Two readings, per image with the 99 % interval of the median:

    1. **The floor**: the fully randomized model's map (the last stage) against the trained map, on the controls'
       scale (:mod:`audit.checks.scale`: the edge map scores "unchanged", the random map "unrelated"). Nearer the
       unchanged end: rejected, the map does not depend on the weights: a model that learned nothing gives nearly
       the same map (Adebayo et al.'s "input structure still prevalent"; input x gradient's |map| keeps 0.91 of its
       ranking on the shipped CNNs). Where the top part is the whole model, this reading is the check.
    2. **Survival of the top part**: each image's similarity at a stage read between the trained map's similarity
       to itself (1) and the floor (the same image's at the last stage; where that map is undefined, a constant
       map, the scale's midpoint stands for the survival level): a map *survives* a stage when it lies nearer 1
       (:func:`~audit.checks.calibration.nearer`). Rejected when it survives every stage of the top part: the first
       ``top`` cascading stages (option ``randomization_top``; default 1, the logit layer, the one part every
       classifier has and the one that defines the explained class). Adebayo et al. rejected guided backprop for
       being "invariant to higher layer parameters" although its maps changed once the lowest layers were
       randomized: a rule that reads only the last stage would let it through.

    Not rejected when the floor lies below the midpoint (or the fully randomized model's maps are constant) and some
    stage of the top part lies wholly below its survival level; else inconclusive. The text names the stage where
    the map stopped surviving.
    """

    threshold: str = ""
    metric: str = "ssim"
    top: str = "randomization_top"

    @property
    def reads(self) -> tuple[str, ...]:
        return (self.top,)

    @property
    def readings(self) -> int:
        return 2  # the floor on the controls' scale, and the survival of the top part

    def scale(self, controls: pd.DataFrame | None) -> Scale:
        return scale_of(controls, self.metric, lambda rows: rows[rows.stage > 0])  # at stage 0 every map meets itself

    def per_image(self, part: pd.DataFrame) -> pd.Series:
        rows = part[part.stage == 1].sort_values("image")  # after the logit layer is randomized
        return pd.Series(rows[self.metric].to_numpy(), index=rows.image.to_numpy())

    def replicates(self, part: pd.DataFrame) -> np.ndarray | None:
        rows = part[part.stage == 1].sort_values("image")
        return rows["replicate"].to_numpy() if "replicate" in rows else None

    def evaluate(self, part: pd.DataFrame, options: Options, controls: pd.DataFrame | None = None) -> VerdictCell:
        intervals = stage_intervals(part, self.metric, options.interval_level) if self.metric in part else pd.DataFrame()
        if intervals.empty:
            return VerdictCell(float("nan"), "n/a", None)
        level, top = options.interval_level, min(getattr(options, self.top), len(intervals))
        scale = self.scale(controls)
        last_rows = part[part.stage == part.stage.max()].sort_values("image")
        floors = floor_scores(part, self.metric, scale)
        floor = nearer_unchanged(floors.to_numpy(float), scale, "full randomization", level=level,
                                 groups=last_rows["replicate"].to_numpy() if "replicate" in last_rows else None,
                                 short="randomized")
        head = intervals.iloc[:top]
        last = head.iloc[-1]
        rows = part[part.stage == last.stage]
        spread = seed_spread(rows[self.metric].to_numpy(float), rows["replicate"].to_numpy() if "replicate" in rows
                             else None)
        undefined = int(head.undefined.sum())
        looks = looked(level, int(head.defined.iloc[-1] + head.undefined.iloc[-1]))
        score = f"after {last.layer}: {last['median']:.3f} [{last.low:.3f}, {last.high:.3f}]"
        where = scale.note()
        read = reading(floor, notes=False)  # the seeds' spread and the look are the cell's own
        constant = int(last_rows[self.metric].isna().sum() - floors.isna().sum())
        if constant:
            read += f"; {constant} constant maps of the fully randomized model read as unrelated"
        if floor.outcome == REJECTED:
            return VerdictCell(float(last["median"]), f"{REJECTED}: the map does not depend on the weights, the fully "
                               f"randomized model keeps it ({read}; {score}{where})", REJECTED, undefined,
                               reason=f"the fully randomized model keeps the map ({self.score_name})",
                               reading=floor.reading)
        if top >= len(intervals):  # no stage below the top part gives a floor: the floor's reading is the check
            return VerdictCell(float(last["median"]), f"{floor.outcome} ({read}; the top part is the whole "
                               f"model{where})", floor.outcome, undefined, reading=floor.reading)
        near = stage_intervals(nearness(part, self.metric, scale), self.metric, level)
        outcome, kept = _curve_outcome(near, 0.0, top)
        if outcome == NOT_REJECTED and floor.outcome != NOT_REJECTED:
            outcome = INCONCLUSIVE  # changed at the top, but the floor's own reading is open
        at = near.iloc[top - 1]
        return VerdictCell(float(last["median"]), f"{outcome} ({score}; nearer the trained map than the fully "
                           f"randomized model's by {at['median']:.3f} [{at.low:.3f}, {at.high:.3f}]; "
                           f"{_stop(near, kept)}; {read}{where}{spread}{looks})", outcome, undefined,
                           # read against its survival level, the median's distance from it (nearness) taken off
                           reading=Reading(f"after {last.layer}", float(last["median"]), float(last.low),
                                           float(last.high), float(last["median"] - at["median"]),
                                           int(head.defined.iloc[-1] + head.undefined.iloc[-1])))

    def rejects_when(self, options: Options) -> str:
        top = getattr(options, self.top)
        return ("the fully randomized model's map nearer the edge map's score than the random map's, or the map "
                + ("surviving the logit layer's randomization" if top == 1 else f"surviving the first {top} stages"))

    def rule_text(self, options: Options) -> str:
        top = getattr(options, self.top)
        part = "the logit layer (the first cascading stage)" if top == 1 else f"the first {top} cascading stages"
        return (f"rejected when the fully randomized model's map has a {self.score_name} to the trained map nearer the "
                "edge map's score (unchanged) than the random map's (unrelated), both measured in the run (the map "
                f"does not depend on the weights), or when it survives the randomization of {part} "
                f"({self.failure}): its {self.score_name} to the trained map lies nearer the trained map's own (1) "
                "than the fully randomized model's (the last stage) at each of them; not rejected when the fully "
                "randomized model's lies nearer the unrelated end and some stage of the top part lies below its "
                "survival level; else inconclusive; each reading per image, on the interval of the median")


def floor_scores(part: pd.DataFrame, metric: str, scale: Scale) -> pd.Series:
    """Each image's ``metric`` at the last stage (the fully randomized model's map against the trained one), by
    image; where it is undefined while the trained map is not (stage 0 scores it: a constant map of the randomized
    model, e.g. Grad-CAM's after its ReLU, which shares nothing with the trained map), the ``scale``'s unrelated
    end."""
    floor = part[part.stage == part.stage.max()].set_index("image")[metric].sort_index()
    trained = part[part.stage == 0].set_index("image")[metric].reindex(floor.index)
    filled: pd.Series = floor.where(floor.notna() | trained.isna(), scale.unrelated)
    return filled


def nearness(part: pd.DataFrame, metric: str, scale: Scale | None = None) -> pd.DataFrame:
    """One model x method's rows ``part`` of the randomized stages with ``metric`` replaced by each image's
    :func:`~audit.checks.calibration.nearer` (ceiling 1, floor: the image's score at the last stage,
    :func:`floor_scores` on ``scale``, default the measure's own ends); an image without a floor keeps its place
    at the median floor of the others."""
    floor = floor_scores(part, metric, scale if scale is not None else Scale())
    floor = floor.fillna(floor.median())
    rows = part[part.stage > 0].copy()
    rows[metric] = nearer(rows[metric].to_numpy(float), 1.0, floor.reindex(rows.image).to_numpy(float))
    return rows


def _curve_outcome(intervals: pd.DataFrame, threshold: float, top: int) -> tuple[str, int]:
    """The outcome of a curve's stage ``intervals`` (:func:`stage_intervals`) against ``threshold`` over its first
    ``top`` stages (:class:`Survival`), and the stages the map survives from the top (:func:`survived`)."""
    kept = survived(intervals, threshold)
    head = intervals.iloc[:top]
    if kept >= top:
        return REJECTED, kept
    if any(h < threshold and not too_few(d, d + u) for h, d, u in zip(head.high, head.defined, head.undefined)):
        return NOT_REJECTED, kept
    return INCONCLUSIVE, kept


def _stop(intervals: pd.DataFrame, kept: int) -> str:
    """Where a map stopped surviving, for a verdict's text."""
    return (f"survives all {len(intervals)} stages" if kept == len(intervals) else
            f"survives {kept} of {len(intervals)} stages, stops at {intervals.layer.iloc[kept]}")


def randomization_figure(frame: pd.DataFrame, model: str, order: str) -> Figure:
    """Median SSIM to the trained model's maps per stage, with the 99 % bootstrap band; under cascading
    randomization, each method's survival level and the stage where its map stopped surviving (:class:`Survival`)."""
    return stage_figure(frame, model, "ssim", "SSIM to the trained map", f"randomization_{order}_{model}",
                        f"{order.capitalize()} parameter randomization on {model}: SSIM between each image's map "
                        "and the trained model's as layers are re-initialised", ylim=(-0.05, 1.05),
                        survival=order == "cascading")


def stage_figure(frame: pd.DataFrame, model: str, metric: str, ylabel: str, name: str, caption: str, *,
                 ylim: tuple[float, float] | None = None, threshold: float | None = None,
                 meaning: str = "", survival: bool = False) -> Figure:
    """``metric`` per randomization stage, one panel per method family: every image's point, the
    median over images and its 99 % bootstrap band; dashed: the ``threshold`` (``meaning`` says how
    it reads); ``survival``: in its place, each method's survival level, halfway between 1 and its median at the
    last stage, dashed in its colour, and a ring on its curve at the stage where its map stopped surviving
    (:class:`Survival`)."""
    part = frame[frame.model == model]
    summary = summarize(part[["method", "stage", "layer", "image", metric]
                             + (["replicate"] if "replicate" in part else [])], n_resamples=2000)
    stages = summary.drop_duplicates("stage").sort_values("stage")
    # the stage names under each panel take about half its height: a taller panel keeps its plot and y-label whole
    fig, axes, groups = family_panels(list(part.method), panel_height=2.3)
    floor = floor_of(part, metric, "stage")
    if floor is not None:  # at stage 0 every map, the random one too, is compared with itself: no floor there
        floor = floor[floor.index > 0]
    for ax, methods in zip(axes[0], groups.values()):
        if floor is not None:
            floor_line(ax, floor.index.to_numpy(), floor.to_numpy())
        for k, method in enumerate(methods):
            rows = summary[summary.method == method].sort_values("stage")
            points = part[part.method == method]
            offset = 0.5 * (k - (len(methods) - 1) / 2) / max(len(methods), 1)  # side by side, not on top
            ax.scatter(points.stage + offset, points[metric], s=1.5, color=style.color(method), alpha=0.35,
                       linewidths=0, zorder=2)
            ax.plot(rows.stage, rows[metric], color=style.color(method), marker=style.marker(method),
                    linestyle=style.linestyle(method), zorder=3)
            ax.fill_between(rows.stage, rows[f"{metric}_low"], rows[f"{metric}_high"], color=style.color(method),
                            alpha=0.2, linewidth=0)
            if survival and len(rows) > 2:  # a floor below the first randomized stage
                ax.plot(rows.stage.iloc[[1, -1]], [(1 + rows[metric].iloc[-1]) / 2] * 2, color=style.color(method),
                        linestyle="--", linewidth=0.8, zorder=1)
                kept = survived(stage_intervals(nearness(points, metric), metric), 0.0)
                if kept < len(rows) - 1:
                    stop = rows.iloc[kept + 1]
                    ax.scatter([stop.stage + offset], [stop[metric]], s=40, facecolors="none",
                               edgecolors=style.color(method), linewidths=1.2, zorder=4)
        if threshold is not None:
            threshold_line(ax, threshold)
        ax.set_xticks(stages.stage, stages.layer, rotation=60, ha="right", rotation_mode="anchor")
    if ylim is not None:
        axes[0, 0].set_ylim(*ylim)
    axes[0, 0].set_ylabel(textwrap.fill(ylabel, 18))  # on two lines where long: the plot is short
    note = f"; dashed: the threshold ({threshold:g}), {meaning}" if threshold is not None else ""
    if survival:
        note += ("; dashed, in each method's colour: its survival level, halfway between the trained map's "
                 "similarity to itself (1) and its median at the last stage (the fully randomized model); a map "
                 "survives a stage while it lies nearer the trained map, image by image (the verdict's interval); "
                 "rings: the stage where each method's map stopped surviving")
    if floor is not None:
        note += "; dotted grey, in every panel: the random-map control's median, the floor a map unrelated to the model's scores"
    method_legend(fig, groups)
    return Figure(name, fig, f"{caption}. Points: images; lines: medians over images with their 99 % bootstrap "
                  f"band{note}.")


def _image_rgb(image: np.ndarray, preprocess: Preprocess | None = None) -> np.ndarray:
    """A (C, H, W) model input as an (H, W) or (H, W, 3) picture in [0, 1]: the normalisation of
    ``preprocess`` undone when it has one, else min-max per image."""
    if preprocess is not None and preprocess.mean is not None:
        image = preprocess.picture(image)
    else:
        low, high = float(image.min()), float(image.max())
        image = (image - low) / (high - low) if high > low else np.zeros_like(image)
    return image[0] if image.shape[0] == 1 else np.moveaxis(image[:3], 0, -1)




GRID_ROWS = 8  # method rows per heatmap page: at most 85 % of a page tall at full cell size, legible in print


def grid_pages(methods: list[str], rows: int = GRID_ROWS) -> list[list[str]]:
    """``methods`` in family order, split into pages of at most ``rows``: whole families kept together while they
    fit on a page, a family longer than a page continued on the next."""
    pages: list[list[str]] = [[]]
    for group in style.by_family(methods).values():
        if pages[-1] and len(pages[-1]) + len(group) > rows:
            pages.append([])
        for method in group:
            if len(pages[-1]) == rows:
                pages.append([])
            pages[-1].append(method)
    return [page for page in pages if page]


def heatmap_pages(maps: dict[str, np.ndarray], stage_names: list[str], model: str, order: str, *,
                  images: np.ndarray | None = None, preprocess: Preprocess | None = None, scale: str = "map",
                  columns: str | None = None) -> list[Figure]:
    """:func:`heatmap_grid` for every kept image, each split into pages of methods (:func:`grid_pages`).

    ``maps``: {method: (stages, images, H, W)}; the other parameters as :func:`heatmap_grid`'s.
    """
    pages = grid_pages(list(maps))
    return [heatmap_grid({m: maps[m] for m in page}, stage_names, model, i, order, images=images,
                         preprocess=preprocess, scale=scale, columns=columns, part=(k + 1, len(pages)))
            for i in range(next(iter(maps.values())).shape[1]) for k, page in enumerate(pages)]


def heatmap_grid(maps: dict[str, np.ndarray], stage_names: list[str], model: str, image: int, order: str, *,
                 images: np.ndarray | None = None, preprocess: Preprocess | None = None, scale: str = "map",
                 columns: str | None = None, part: tuple[int, int] = (1, 1)) -> Figure:
    """Adebayo-style grid: the input image first, then one row per method (grouped by family) and
    one column per randomization stage, each row with its colour bar. Colour scales, symmetric
    around 0 at the 99.5th percentile of ``|map|``: ``scale="map"`` each map its own (as Adebayo et al.'s
    figures: whether a late stage's map keeps its structure shows, however small its values);
    ``"row"`` one per method across the stages (magnitudes compare; late stages may look blank).

    ``maps``: {method: (stages, images, H, W)}; ``images``: (images, C, H, W) model inputs or None,
    shown as they looked before ``preprocess``'s normalisation; ``columns``: what the columns are, for the
    caption (default: the randomization stages of ``order``); ``part``: (k, n), this grid is page k of n of the
    image's methods (named and captioned so).
    """
    if scale not in GRID_SCALES:
        raise ValueError(f"scale must be one of {GRID_SCALES}, got {scale!r}")
    methods = [m for group in style.by_family(list(maps)).values() for m in group]
    # the column names stand rotated above the grid: a top margin as tall as the longest keeps each one whole
    # (a library model's stages are long module paths, "vit.embeddings.position_embeddings")
    grid = _Grid.sized(len(stage_names), len(methods), top=0.3 + 0.045 * max(map(len, [*stage_names, "input"])))
    if images is not None:
        picture = _image_rgb(images[image], preprocess)
        ax = grid.axes(0, 0, grid.cell)
        ax.imshow(picture, cmap="gray" if picture.ndim == 2 else None)
        ax.set_title("input", rotation=60, ha="left", rotation_mode="anchor")
    for r, m in enumerate(methods):
        grid.method_row(r, m, maps[m][:, image], stage_names, scale)
    scales = ("each map on its own symmetric colour scale (its 99.5th percentile of |value| at the ends of the "
              "bar: structure shows, magnitudes do not compare across stages)" if scale == "map" else
              "one symmetric colour scale per method row (magnitudes compare across stages)")
    k, n = part
    families = ", ".join(style.by_family(methods))
    return Figure(f"heatmaps_{model}_image{image}" + ("" if order == "cascading" else f"_{order}")
                  + (f"_part{k}" if n > 1 else ""), grid.fig,
                  f"Maps of image {image} on {model} "
                  f"{columns or f'as layers are randomized ({order}, left to right)'}, one row per "
                  f"method{f' (part {k} of {n}: {families})' if n > 1 else ''}, {scales}; red positive, blue negative.")


@dataclass(frozen=True)
class _Grid:
    """A heatmap grid's fixed geometry (inches): the input, then one row of stages per method and its colour bar.
    One image per row (the stages side by side, NaN between them, drawn blank): a layout engine over hundreds of
    axes takes minutes."""

    fig: MplFigure
    n_stages: int
    cell: float
    width: float
    height: float
    left: float = 1.25
    top: float = 0.6
    gap: float = 0.06

    @classmethod
    def sized(cls, n_stages: int, n_rows: int, *, left: float = 1.25, top: float = 0.6, bottom: float = 0.1,
              gap: float = 0.06, bar: float = 0.3) -> _Grid:
        cell = min(0.8, (style.TWO_COLUMN - left - bar) / (n_stages + 1) - gap)
        width = left + (n_stages + 1) * (cell + gap) + bar
        height = top + n_rows * (cell + gap) + bottom
        return cls(MplFigure(figsize=(width, height)), n_stages, cell, width, height, left, top, gap)

    def axes(self, row: int, column: int, w: float) -> Axes:
        y = self.height - self.top - (row + 1) * (self.cell + self.gap) + self.gap
        ax = self.fig.add_axes(((self.left + column * (self.cell + self.gap)) / self.width, y / self.height,
                                w / self.width, self.cell / self.height))
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_frame_on(False)
        return ax

    def method_row(self, r: int, method: str, row: np.ndarray, stage_names: list[str], scale: str) -> None:
        """Row ``r``: one method's maps (stages, H, W) side by side, its name, and its colour bar."""
        n_stages, cell, gap = self.n_stages, self.cell, self.gap
        if scale == "map":  # each stage's map on its own scale, in units of its 99.5th percentile
            row = np.stack([stage / (_percentile_scale(stage) or 1.0) for stage in row])
        h, w = row.shape[1:]
        pad = max(1, round(w * gap / cell))
        strip = np.full((h, n_stages * (w + pad) - pad), np.nan)
        for c in range(n_stages):
            strip[:, c * (w + pad): c * (w + pad) + w] = row[c]
        # symmetric around 0 (signed maps keep their sign); the 99.5th percentile so that one hot
        # pixel does not wash the row out
        limit = 1.0 if scale == "map" else (_percentile_scale(row) or 1.0)
        ax = self.axes(r, 1, n_stages * (cell + gap) - gap)
        shown = ax.imshow(strip, cmap=colormaps["coolwarm"].with_extremes(bad="white"), vmin=-limit, vmax=limit,
                          aspect="auto")
        self.fig.text((self.left - 0.06) / self.width, 1 - (self.top + (r + 0.5) * (cell + gap)) / self.height,
                      method, ha="right", va="center", color=style.color(method))
        if r == 0:
            ax.xaxis.tick_top()
            ax.set_xticks([c * (w + pad) + w / 2 for c in range(n_stages)], stage_names, rotation=60, ha="left",
                          rotation_mode="anchor")
            ax.tick_params(axis="x", length=0)
        colour_bar = self.fig.colorbar(shown, cax=self.axes(r, n_stages + 1, 0.06), ticks=[-limit, 0, limit])
        colour_bar.ax.set_yticklabels([f"{-limit:.2g}", "0", f"{limit:.2g}"])
        colour_bar.ax.tick_params(labelsize=4.5, length=1.5, pad=1)


def _percentile_scale(values: np.ndarray) -> float:
    """The 99.5th percentile of ``|values|`` (NaN ignored): one hot pixel does not wash a map out."""
    return float(np.nanpercentile(np.abs(values), 99.5))


@dataclass(frozen=True)
class MeasuredStageOptions(StageOptions):
    """The keys of the randomization checks that compare maps by Adebayo et al.'s measures (cascading,
    independent, bottom-up): the stage keys and the measure set."""

    measures: str = measures_option()


@dataclass(frozen=True)
class CascadingOptions(MeasuredStageOptions):
    """The cascading check's keys: the stage keys, and how its verdict reads the curve."""

    randomization_top: int = option(1, "cascading stages from the logits that form the model's top part: a map that "
                                    "survives all of them is rejected (1: the logit layer)", valid=lambda v: v >= 1,
                                    rule=">= 1", source="Adebayo et al. 2018, section 4: a map invariant to the "
                                    "randomization of the higher layers, from the logits, fails")


def _run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, options: MeasuredStageOptions, unit: UnitContext,
         *, order: str) -> UnitResult:
    df, maps = randomization_with_maps(model, x, y, [method], stages=options.stages(order, unit.seed, unit.first_image),
                                       progress=unit.progress, keep_maps=unit.heatmap_examples,
                                       measures=options.measures, params=unit.params)
    return UnitResult(df, maps[method] if unit.heatmap_examples else None)


def _sections(table: pd.DataFrame, context: ReportContext, options: StageOptions, *, order: str) -> list[Section]:
    models = list(table.model.unique())
    out = [Section(f"Parameter randomization ({order})",
                   text=coverage_paragraph(context.run, f"randomization_{order.replace('-', '_')}_coverage.csv", models),
                   figures=[randomization_figure(table, m, order) for m in models])]
    grids = []
    for m in models:
        maps, images = context.examples(m, order, list(table.method.unique()))
        if maps:
            stages = list(table[table.model == m].drop_duplicates("stage").sort_values("stage").layer)
            grids += heatmap_pages(maps, stages, m, order, images=images,
                                   preprocess=preprocess_from(context.config.preprocess), scale=options.heatmap_scale)
    if grids:
        out.append(Section(f"Heatmaps under {order} randomization", figures=print_first(grids)))
    return out


def _checks() -> list[Check[Any]]:
    verdict = Survival("cascading_ssim", "cascading", "survives the randomization of the top layers", score_name="SSIM")
    magnitudes = Survival("cascading_spearman_abs", "cascading_spearman_abs", "magnitudes survive the randomization of "
                          "the top layers", score_name="Spearman of |map|", metric="spearman_abs")
    signed = Survival("cascading_spearman", "cascading_spearman", "the signed map survives the randomization of the "
                      "top layers", score_name="signed Spearman", metric="spearman")
    out = []
    for position, order in enumerate(ORDERS):
        cascading = order == "cascading"
        out.append(Check(
            name=order, title=f"Parameter randomization ({order})", result_file=f"randomization_{order.replace('-', '_')}.csv",
            reference="Adebayo et al. 2018; Sixt et al. 2020" if order != "bottom-up" else "Hedstroem et al. 2023",
            cite=("adebayo2018", "sixt2020") if order != "bottom-up" else ("hedstrom2024", "binder2023"),
            columns=COLUMNS, run=functools.partial(_run, order=order),
            sections=functools.partial(_sections, order=order), order=30 + position,
            summary=lambda df: (f"median SSIM after the first stage {df[df.stage == 1].ssim.median():.3f}, at full "
                                 f"randomization {df[df.stage == df.stage.max()].ssim.median():.3f}"),
            verdict=verdict if cascading else None, side_rules=(magnitudes, signed) if cascading else (),
            controls={"edge": "rejected", "random": "not rejected"} if cascading else {},
            options=CascadingOptions if cascading else MeasuredStageOptions,
            question=f"Does the map change as the weights are randomized ({order})?",
            description=f"layers or blocks re-initialised {order} in forward order; maps compared with the trained "
                        "model's",
            coverage=functools.partial(coverage_record, order=order)))
    return out


CHECKS = _checks()
