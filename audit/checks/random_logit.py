"""The random-logit test (Sixt et al. 2020): maps for the true class and for a random other class.

A method whose backward chain has collapsed to rank 1 gives (up to sign and scale) the same map
for every class, so the two maps are nearly identical (SSIM near 1); class-sensitive methods
score lower (0.4-0.8 in the paper).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from attributions.explainer import attribute_many
from attributions.hygiene import leaves_process_alone
from audit.checks.base import Check, MedianScore, UnitResult
from audit.checks.options import Options, UnitContext, option
from audit.checks.passes import Params, prepare
from audit.errors import AuditError
from audit.inputs import Images, Labels, Methods, Reduction, check_inputs, resolve_methods
from audit.measures.heatmaps import ComparableMaps, follows, heatmaps, input_structure, signed_heatmaps
from audit.measures.similarity import WINDOW, correlation, sign_flip_allowed, ssim, undefined_where
from audit.panels import floor_of, score_boxes
from audit.progress import bars
from audit.sections import Figure, ReportContext, Section

COLUMNS = ["method", "image", "true_class", "random_class", "ssim", "spearman", "spearman_abs", "input_spearman_abs",
           "edge_spearman_abs"]


def random_classes(y: torch.Tensor, num_classes: int, seed: int) -> torch.Tensor:
    """One class per image, uniformly among the classes other than its label (seeded)."""
    rng = np.random.default_rng(seed)
    offsets = rng.integers(1, num_classes, size=len(y))
    return (y + torch.from_numpy(offsets)) % num_classes


@leaves_process_alone
def random_logit_test(model: torch.nn.Module, x: Images, y: Labels, methods: Methods = "all", *, seed: int = 0,
                      reduction: Reduction | None = None, progress: bool = True,
                      params: Params | None = None) -> pd.DataFrame:
    """Similarity of each method's maps for the true class and a random other class.

    Parameters
    ----------
    model : nn.Module (B, C, H, W) -> (B, classes); never modified
    x : (B, C, H, W) images
    y : (B,) labels
    methods : names, "all" or a comma-separated string
    seed : seeds the random other class of each image
    reduction : {method: "sum" | "max-abs"} overrides of the heatmap reduction
    progress : show a progress bar
    params : {method: {name: value}}, parameters given to each method's explainer (an audit's pattern methods'
        patterns and their data), optional

    Returns
    -------
    DataFrame, one row per method x image: method, image, true_class, random_class, ssim
    (flip-invariant where the two maps are not of one sign, uniform 5x5 window, data_range 1, on maps clipped at
    the 0.5 / 99.5 percentiles and scaled to [0, 1]), spearman (the signed maps: the channel sum, also for the
    methods whose heatmap is max-abs), spearman_abs (the heatmaps' magnitudes), input_spearman_abs and
    edge_spearman_abs (Spearman of the random class's ``|map|`` with the input's magnitude and with its edges:
    :func:`~audit.measures.heatmaps.input_structure`).
    """
    x, y = check_inputs(model, x, y)
    if y is None:
        raise AuditError("random_logit_test needs the labels y")
    names = resolve_methods(methods)
    _, explainers, shared, logits = prepare(model, x, names, y, params=params)
    r = random_classes(y, logits.shape[1], seed)
    n, parts = len(x), []
    structure = input_structure(x)
    for m in tqdm(names, desc="random-logit", disable=not bars(progress), leave=False):
        both = attribute_many({m: explainers[m]}, x, [y, r], shared)[m]  # one batched backward for both classes
        # the two sets of maps prepared in one batch: one sort per map gives its ranks and its normalisation
        flat = {m: both.reshape(2 * n, *both.shape[2:])}
        maps = ComparableMaps(heatmaps(flat, reduction)[m], signed_heatmaps(flat, reduction).get(m))
        scores = undefined_where(maps.bad[:n] | maps.bad[n:], {  # constant or non-finite maps: undefined scores
            "ssim": ssim(maps.normalized[:n], maps.normalized[n:], win_size=WINDOW, data_range=1.0,
                         flip_invariant=sign_flip_allowed(maps.signs[:n], maps.signs[n:])).numpy(),
            "spearman": correlation(maps.ranks[:n], maps.ranks[n:]),
            "spearman_abs": correlation(maps.abs_ranks[:n], maps.abs_ranks[n:]), **follows(maps, structure, n)})
        parts.append(pd.DataFrame({"method": m, "image": np.arange(n), "true_class": y.numpy(),
                                   "random_class": r.numpy(), **scores}, columns=COLUMNS))
    return pd.concat(parts, ignore_index=True)  # resolve_methods refuses an empty list


@dataclass(frozen=True)
class RandomLogitOptions(Options):
    """The random-logit test's key."""

    random_logit_threshold: float = option(0.8, "SSIM at or above which a method is rejected as class-insensitive "
                                           "when the interval of its median lies there (Sixt et al.: near 1 "
                                           "for converging chains, 0.4-0.8 for the others)",
                                           valid=lambda v: 0 < v <= 1, rule="in (0, 1]",
                                           source="Sixt et al. 2020, the random-logit figure: the top of the range "
                                           "(0.4 to 0.8) of the methods whose chains do not converge; not derived "
                                           "from the model at hand")


def _run(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, options: RandomLogitOptions,
         unit: UnitContext) -> UnitResult:
    return UnitResult(random_logit_test(model, x, y, [method], seed=unit.seed, progress=unit.progress,
                                        params=unit.params))


def random_logit_figure(logit: pd.DataFrame, model: str, threshold: float) -> Figure:
    """Per-image SSIM between the true-class and random-class maps: a box and every image's point
    per method, one panel per family; dashed: the threshold (at or above: class-insensitive)."""
    fig = score_boxes(logit[logit.model == model], "ssim", threshold, "SSIM, true vs random class")
    return Figure(f"random_logit_{model}", fig, f"Random-logit test on {model}: SSIM between the maps of the true "
                  f"and a random other class, per image (points) and per method (boxes); a method whose median's 99 % "
                  f"interval lies at or above the dashed line ({threshold:g}) is rejected as class-insensitive"
                  + ("; dotted grey, in every panel: the random-map control's median, the floor a map unrelated to the "
                     "model's scores." if floor_of(logit[logit.model == model], "ssim") is not None else "."))


def _sections(table: pd.DataFrame, context: ReportContext, options: RandomLogitOptions) -> list[Section]:
    threshold = options.random_logit_threshold
    return [Section("Random-logit test", figures=[random_logit_figure(table, m, threshold)
                                                  for m in table.model.unique()])]


CHECK = Check(
    name="random-logit", cite=("sixt2020",), title="Random-logit test", reference="Sixt et al. 2020",
    result_file="random_logit.csv",
    columns=COLUMNS, run=_run, summary=lambda df: f"median SSIM {df.ssim.median():.3f}", sections=_sections,
    verdict=MedianScore("random_logit_ssim", "random_logit", "class-insensitive", "random_logit_threshold"), order=20,
    question="Does the map change with the explained class?",
    description="maps for the true class and a random other class compared by flip-invariant SSIM and Spearman",
    options=RandomLogitOptions, controls={"edge": "rejected", "random": "not rejected"})
