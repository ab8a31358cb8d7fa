"""The data-randomization test (Adebayo et al. 2018, section 5): a map must change when the labels the model
learned are permuted.

Each method explains the same images on the model and on its permuted-label twin (the same architecture
trained on the training labels permuted once until it fits them: :mod:`audit.models.twins`); the two maps of
each image are compared with the parameter-randomization measures (flip-invariant SSIM, Spearman signed and
of magnitudes, HOG). A map that depends on what the model learned changes; a map that does not (the edge
detector) stays the same and is rejected. The explained class is the true label on both (Adebayo et al.), or
each model's own prediction.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from attributions.explainer import attribute_many
from attributions.hygiene import leaves_process_alone
from audit.checks.base import Check, UnitResult
from audit.checks.calibration import Calibrated, OnScale
from audit.checks.options import Options, UnitContext, option
from audit.checks.passes import Params, prepare
from audit.checks.randomization import heatmap_pages, untrained_copy
from audit.checks.replicates import replicates, seed_groups
from audit.checks.scale import controls_in, scale_of
from audit.checks.stage_options import TARGETS, heatmap_scale, images_per_seed_option, measures_option
from audit.data.preprocess import preprocess_from
from audit.errors import AuditError, ConfigError
from audit.inputs import Images, Labels, Methods, Reduction, check_count, check_inputs, check_option, resolve_methods
from audit.measures.heatmaps import ComparableMaps, ReferenceMaps, follows, heatmaps, input_structure, signed_heatmaps
from audit.measures.measure_sets import MeasureSet
from audit.measures.similarity import correlation, undefined_where
from audit.models.twins import same_architecture
from audit.panels import floor_of, score_boxes
from audit.progress import bars
from audit.sections import Figure, ReportContext, Section, Table, print_first

# Adebayo et al. (2018, section 5, the rank-correlation figure) compared the maps of the MNIST / Fashion-MNIST
# models and their permuted-label twins by the Spearman rank correlation with and without absolute values; SSIM
# and HOG were computed on ImageNet only, where this test was not run.
MEASURE_WHY = ("the measure Adebayo et al. (2018, section 5) used for this test: the Spearman rank correlation of "
               "the maps' magnitudes (the signed correlation, their other measure, is shown beside it)")
# the references of the calibrated verdict, each compared with the model's maps by the verdict's measure: the
# control twin (the twin's recipe on the true labels: what a model that learned the same labels gives) and the
# untrained model (every tensor re-initialised: what a model that learned nothing gives)
REFERENCES = ("control", "untrained")
COLUMNS = ["method", "image", "ssim", "spearman", "spearman_abs", "hog", "input_spearman_abs", "edge_spearman_abs",
           "control_spearman_abs", "untrained_spearman_abs", "untrained_replicate", "twin_pair"]


@leaves_process_alone
def data_randomization(model: nn.Module, twin: nn.Module | Sequence[nn.Module], x: Images, y: Labels,
                       methods: Methods = "all", *, target: str = "true", seed: int = 0,
                       reduction: Reduction | None = None, progress: bool = True, keep_maps: int = 0,
                       measures: str | MeasureSet = "toolkit",
                       control: nn.Module | Sequence[nn.Module] | None = None, images_per_seed: int = 2,
                       first_image: int = 0, params: Params | None = None) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Similarity of each method's maps on ``model`` and on its permuted-label ``twin`` (and, with a ``control``
    twin, on the control and on the untrained model: the calibrated verdict's references).

    Parameters
    ----------
    model : nn.Module, not modified
    twin : nn.Module or a sequence of them, the permuted-label twins (one per pair: twins are training draws too),
        each of the model's architecture (else a :class:`~audit.errors.ConfigError`); not modified. With several,
        the images are shared out over the pairs as over the re-initialisation seeds: image i of the run belongs to
        the seed replicate ``i // images_per_seed`` and to the pair of that replicate modulo the pairs, so that the
        pairs, like the seeds, grow with the images and the verdict's interval resamples them
    control : the control twins (the twins' recipe on the true labels, another seed), one per twin, in the twins'
        order; with them the maps are also computed on them and on untrained copies of the model (every tensor
        re-initialised: consecutive images share a seed, :mod:`audit.checks.replicates`), and compared with the
        model's by the Spearman of ``|map|``
    images_per_seed, first_image : how many consecutive images share an untrained copy's seed (and a pair), and
        the run's index of the first image given (as the randomization checks')
    x : (B, C, H, W) images
    y : (B,) labels
    methods : names, "all" or a comma-separated string
    target : true (the label on both, as Adebayo et al.) | predicted (each model's own prediction)
    seed : the random control's draw (the twin's is the next seed: a fresh draw)
    reduction : {method: "sum" | "max-abs"} overrides of the heatmap reduction
    keep_maps : how many images' heatmaps to keep, for the report's grid
    measures : how SSIM and HOG compare the maps: a :class:`~audit.measures.measure_sets.MeasureSet` or its name
        (``toolkit``, ``adebayo2018``)
    progress : whether to show progress bars
    params : {method: {name: value}}, parameters given to each method's explainer (an audit's pattern methods'
        patterns and their data), optional

    Returns
    -------
    DataFrame, one row per method x image: method, image, ssim (flip-invariant where the maps are not of one
    sign), spearman (the signed maps: channel sums), spearman_abs (the heatmaps' magnitudes), hog,
    input_spearman_abs and edge_spearman_abs (Spearman of the twin's ``|map|`` with the input's magnitude and with
    its edges: :func:`~audit.measures.heatmaps.input_structure`), control_spearman_abs and untrained_spearman_abs
    (the model's ``|map|`` against the control twin's and the untrained model's; NaN without a control),
    untrained_replicate (the replicate of the image's untrained copy), twin_pair (the pair of its twins, from 0);
    and {method: (2, keep_maps, H, W)}, the model's and the twin's heatmaps.
    """
    twins, controls = as_pairs(twin, control)
    x, y = checked_pair(model, twins, controls, x, y, target=target, keep_maps=keep_maps)
    names = resolve_methods(methods)
    floor = replicates(first_image, len(x), images_per_seed)
    pair = twin_pairs(floor, len(twins))
    roles = role_maps(model, twins, controls, x, y, names, seed=seed, target=target, reduction=reduction,
                      first_image=first_image, images_per_seed=images_per_seed, params=params, progress=progress)
    maps = {m: [role[m][0] for role in roles] for m in names}
    signed = {m: [s for role in roles[:2] if (s := role[m][1]) is not None] for m in names}
    # how far the twin's map follows the input's magnitude and edges: what a map that survives label permutation
    # may be carried by (the mechanism the verdict names)
    structure = input_structure(x)
    rows = []
    for m in names:
        scores = pair_scores(maps[m], signed[m], structure, measures)
        rows += [{"method": m, "image": i, **{k: float(v[i]) for k, v in scores.items()},
                  "untrained_replicate": int(floor[i]), "twin_pair": int(pair[i])} for i in range(len(x))]
    kept = {m: torch.stack([v[:keep_maps] for v in maps[m][:2]]).numpy() for m in names}
    return pd.DataFrame(rows, columns=COLUMNS), kept


Maps = dict[str, tuple[torch.Tensor, torch.Tensor | None]]  # {method: ((B, H, W) heatmaps, signed sums or None)}


def role_maps(model: nn.Module, twins: list[nn.Module], controls: list[nn.Module], x: torch.Tensor, y: torch.Tensor,
              names: list[str], *, seed: int, target: str, reduction: Reduction | None, first_image: int,
              images_per_seed: int, params: Params | None, progress: bool) -> list[Maps]:
    """The maps of the test's roles, in order: the model's, the permuted-label twins', then (with controls) the
    control twins' and the untrained copies'; each :data:`Maps` of all B images. The model explains every image;
    pair k's twin and control the images of pair k (replicate mod the pairs); each untrained copy the images of
    its seed. ``seed``: the random control's (the k-th role draws from seed + k)."""
    pair = twin_pairs(replicates(first_image, len(x), images_per_seed), len(twins))
    shares = [np.flatnonzero(pair == k) for k in range(len(twins))]
    jobs: list[Iterable[tuple[nn.Module, slice | np.ndarray]]] = [[(model, slice(0, len(x)))], list(zip(twins, shares))]
    if controls:  # the untrained copies made one at a time, a copy per seed
        jobs += [list(zip(controls, shares)),
                 ((untrained_copy(model, x, drawn), images)
                  for images, _, drawn in seed_groups(first_image, len(x), images_per_seed, seed))]
    return [pooled_maps(parts, x, y, names, seed=seed + k, target=target, reduction=reduction, params=params).maps
            for k, parts in enumerate(tqdm(jobs, desc="data randomization", disable=not bars(progress), leave=False))]


def twin_pairs(replicate: np.ndarray, pairs: int) -> np.ndarray:
    """(B,) the twin pair of each image from its re-initialisation seed's ``replicate`` (B,): the replicate modulo
    the ``pairs``, so that the pairs, like the seeds, grow with the images."""
    return replicate % pairs


def as_pairs(twin: nn.Module | Sequence[nn.Module], control: nn.Module | Sequence[nn.Module] | None
              ) -> tuple[list[nn.Module], list[nn.Module]]:
    """(twins, controls) as lists, one of each per pair (no controls: empty); a :class:`ConfigError` where there
    is no twin, or the controls are not one per twin."""
    twins = [twin] if isinstance(twin, nn.Module) else list(twin)
    controls = [] if control is None else [control] if isinstance(control, nn.Module) else list(control)
    if not twins:
        raise ConfigError("data_randomization needs at least one permuted-label twin")
    if controls and len(controls) != len(twins):
        raise ConfigError(f"data_randomization got {len(twins)} permuted-label twins and {len(controls)} control "
                          "twins: give one control twin per twin, in the same order (pair k: the k-th of each)")
    return twins, controls


def checked_pair(model: nn.Module, twins: list[nn.Module], controls: list[nn.Module], x: Images, y: Labels, *,
                 target: str, keep_maps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (B, C, H, W), y (B,)) checked, after the options and the twins' architectures: the audit's own errors."""
    check_option("target", target, TARGETS)
    check_count("keep_maps", keep_maps)
    for k, twin in enumerate(twins):
        same_architecture(model, twin, "the model", "the twin" if len(twins) == 1 else f"twin {k + 1}")
    for k, control in enumerate(controls):
        same_architecture(model, control, "the model", "the control twin" if len(controls) == 1
                          else f"control twin {k + 1}")
    x, y = check_inputs(model, x, y)
    if y is None:
        raise AuditError("data_randomization needs the labels y")
    return x, y


def pair_scores(maps: list[torch.Tensor], signed: list[torch.Tensor], structure: dict[str, np.ndarray],
                measures: str | MeasureSet) -> dict[str, np.ndarray]:
    """{score: (B,) values} of one method: its maps on the model, the twin, then the control and the untrained
    copies where computed (each (B, H, W)), and the model's and the twin's signed maps (or none)."""
    own, twin_signed = (signed[0], signed[1]) if signed else (None, None)
    other = ComparableMaps(maps[1], twin_signed, measures)
    reference = ReferenceMaps(maps[0], signed=own, measures=measures)
    scores = reference.compare(other)
    scores |= follows(other, structure)
    for k, name in enumerate(REFERENCES, start=2):
        if len(maps) > k:  # undefined where either map is constant or non-finite, as the twin's scores
            against = ComparableMaps(maps[k])
            scores |= undefined_where(reference.bad | against.bad, {
                f"{name}_spearman_abs": correlation(reference.abs_ranks, against.abs_ranks)})
        else:
            scores[f"{name}_spearman_abs"] = np.full(len(maps[0]), np.nan)
    return scores


def _explained(net: nn.Module, x: torch.Tensor, y: torch.Tensor, names: list[str], seed: int, target: str,
               reduction: Reduction | None, *, params: Params | None) -> tuple[Maps, torch.Tensor]:
    """({method: ((B, H, W) heatmap, (B, H, W) signed channel sum or None)}, (B,) the net's predictions) of ``x`` on
    ``net``, explaining the label ``y`` or (``target`` "predicted") the net's prediction; ``seed``: the random
    control's."""
    _, explainers, shared, logits = prepare(net, x, names, y, seed=seed, params=params)
    predicted = logits.argmax(1).cpu()
    t = y if target == "true" else predicted.to(logits.device)
    raw = {m: v[0] for m, v in attribute_many(explainers, x, [t], shared).items()}
    signed = signed_heatmaps(raw, reduction)
    return {m: (v, signed.get(m)) for m, v in heatmaps(raw, reduction).items()}, predicted


class Pooled(NamedTuple):
    """The maps of :func:`pooled_maps` and each image's predicted class, (B,), from the same forward pass."""

    maps: Maps
    predicted: torch.Tensor


def pooled_maps(parts: Iterable[tuple[nn.Module, slice | np.ndarray]], x: torch.Tensor, y: torch.Tensor,
                names: list[str], *, seed: int, target: str, reduction: Reduction | None, params: Params | None
                ) -> Pooled:
    """{method: ((B, H, W) heatmaps, (B, H, W) signed channel sums or None)} of ``x`` and the (B,) predictions, each
    net of ``parts`` explaining its own images (a slice or an index array of ``x``); ``seed``: the random
    control's."""
    out: Maps = {}
    predicted = torch.full((len(x),), -1, dtype=torch.long)
    for net, images in parts:
        if isinstance(images, np.ndarray) and not images.size:
            continue
        index = images if isinstance(images, slice) else torch.as_tensor(images)
        maps, predicted[index] = _explained(net, x[index], y[index], names, seed, target, reduction, params=params)
        for m, (v, s) in maps.items():
            if m not in out:
                out[m] = (v.new_empty((len(x), *v.shape[1:])),
                          s.new_empty((len(x), *s.shape[1:])) if s is not None else None)
            whole, signed = out[m]
            whole[index] = v
            if s is not None and signed is not None:
                signed[index] = s
    return Pooled(out, predicted)


@dataclass(frozen=True)
class DataRandomizationOptions(Options):
    """The data-randomization test's keys."""

    data_target: str = option("true", "explained class of the data-randomization test: the true label on both models "
                              "(Adebayo et al.) or each model's prediction", choices=TARGETS)
    measures: str = measures_option()
    images_per_seed: int = images_per_seed_option()
    heatmap_scale: str = heatmap_scale()


def _run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, options: DataRandomizationOptions,
         unit: UnitContext) -> UnitResult:
    if not unit.twins:  # the runner skips a model without a twin before it gets here
        raise AuditError("the data-randomization test needs the model's permuted-label twin")
    df, maps = data_randomization(model, unit.twins, x, y, [method], target=options.data_target, seed=unit.seed,
                                  progress=unit.progress, keep_maps=unit.heatmap_examples, measures=options.measures,
                                  control=unit.controls or None, images_per_seed=options.images_per_seed,
                                  first_image=unit.first_image, params=unit.params)
    return UnitResult(df, maps[method] if unit.heatmap_examples else None)


def data_figure(table: pd.DataFrame, model: str) -> Figure:
    """Per-image Spearman of ``|map|`` between each method's maps on the model and on its permuted-label twin (the
    verdict's measure): a box and every image's point per method, one panel per family; dashed: the controls' scale's
    midpoint (:mod:`audit.checks.scale`); triangles: the medians of the calibrated verdict's references, where the
    model has a control twin."""
    part = table[table.model == model]
    scale = scale_of(controls_in(part), "spearman_abs")  # the verdict's measure
    references = {"control twin": "control_spearman_abs", "untrained": "untrained_spearman_abs"}
    fig = score_boxes(part, "spearman_abs", scale.midpoint, "Spearman of |map|, model vs twin", references)
    calibrated = "control_spearman_abs" in part and part.control_spearman_abs.notna().any()
    return Figure(f"data_randomization_{model}", fig, f"Data randomization on {model}: Spearman rank correlation of "
                  "the magnitudes of each image's maps on the model and on its twin trained on permuted labels (the "
                  "measure of Adebayo et al., section 5), per image (points) and per method (boxes). Dashed: the "
                  f"midpoint ({scale.midpoint:.2f}) of the {scale.text()}; a map whose twin lies above it is nearer "
                  "unchanged"
                  + ("; beside each box, the median of the model's maps against its control twin's (up triangle: "
                     "a model that learned the same labels) and against an untrained copy's (down triangle: a model "
                     "that learned nothing). A method whose untrained copy lies above the midpoint does not depend "
                     "on what the model learned; where the two references separate, a twin nearer the control than "
                     "the untrained copy is rejected (the verdict's rule)." if calibrated else ".")
                  + (" Dotted grey, in every panel: the random-map control's median, the floor a map unrelated to "
                     "the model's scores." if floor_of(part, "spearman_abs") is not None else ""))


def _fits(record: dict[str, Any]) -> str:
    """Whether a twin reached the training accuracy it was trained to (``train --fit-accuracy``): "yes", "NO (0.83
    under 0.95): its maps are not those of a model that learned the labels", or "not recorded"."""
    if record.get("fits") is None:
        return "not recorded"
    if record["fits"]:
        return f"yes ({record.get('fit_accuracy')})"
    return (f"NO ({record.get('train_accuracy', float('nan')):.3f} under {record.get('fit_accuracy')}): not a model that "
            "fits its labels")


def _twin_table(manifest: dict[str, Any], models: list[str]) -> pd.DataFrame:
    """The twins the run compared, each model's pairs of a permuted-label twin and its control twin: which
    checkpoint, its labels, seeds, training subset and accuracies."""
    twins = manifest.get("twins", {})
    rows = [{"model": m, "pair": k, "role": role, "twin": record["spec"], "labels": record.get("labels"),
             "label seed": record.get("label_seed"), "seed": record.get("seed"),
             "training images": record.get("train_size"), "training accuracy": record.get("train_accuracy"),
             "fits its labels": _fits(record), "test accuracy": record.get("test_accuracy")}
            for m in models if m in twins
            for k, pair in enumerate(twins[m].get("pairs", [twins[m]]), start=1)  # a run of one pair recorded it alone
            for role, record in (("permuted-label twin", pair), ("control twin", pair.get("control")))
            if record]
    return pd.DataFrame(rows)


def _sections(table: pd.DataFrame, context: ReportContext, options: DataRandomizationOptions) -> list[Section]:
    models = list(table.model.unique())
    manifest = context.manifest()
    twins = _twin_table(manifest, models)
    skipped = manifest.get("skipped", {}).get("data-randomization", {})
    text = ("Each method's maps of the same images on the model and on its permuted-label twin (the same "
            "architecture trained on the training labels permuted once, until it fits them; its test accuracy is at "
            "chance), compared by the Spearman rank correlation of their magnitudes and of the signed maps, as "
            "Adebayo et al. (2018, section 5) compared them on MNIST and Fashion-MNIST (SSIM and HOG, shown in the "
            "tables, were theirs on ImageNet only). Where the model has a control twin (the twin's recipe on the true "
            "labels, another seed), each image's similarity to the permuted-label twin is read against the model's "
            "similarity to the control twin and to an untrained copy: the verdict rejects a map nearer the control "
            "(see the verdict's rule). A map that depends on what the model learned changes; the edge "
            "control must be rejected. Adebayo et al. found that the gradient, SmoothGrad and Grad-CAM maps "
            "changed, and cautioned, from the figures, that guided backprop, integrated gradients and input x "
            "gradient still showed the input's structure, the last two with their signs changed.")
    if skipped:
        text += " Skipped (no twin): " + "; ".join(f"{m} ({why})" for m, why in skipped.items()) + "."
    grids = []
    for m in models:
        maps, images = context.examples(m, "data-randomization", list(table[table.model == m].method.unique()))
        if maps:
            grids += heatmap_pages(maps, ["model", "twin"], m, "data-randomization", images=images,
                                   preprocess=preprocess_from(context.config.preprocess), scale=options.heatmap_scale,
                                   columns="on the model and on its permuted-label twin (left to right)")
    return [Section("Data randomization", text=text,
                    tables=[Table(twins, "Twins: each model's permuted-label twin and its control twin (the same "
                                         "recipe and subset on the true labels), their seeds, training subset, "
                                         "training accuracy on their training labels and test accuracy on the true "
                                         "ones.", "twins")]
                    if not twins.empty else [],
                    figures=[data_figure(table, m) for m in models] + print_first(grids, 0))]


CHECK = Check(
    name="data-randomization", cite=("adebayo2018",), title="Data randomization", reference="Adebayo et al. 2018",
    result_file="data_randomization.csv", columns=COLUMNS, run=_run, sections=_sections, order=35, twins="labels",
    summary=lambda df: (f"median Spearman of |map| model vs twin {df.spearman_abs.median():.3f}, signed "
                        f"{df.spearman.median():.3f}, SSIM {df.ssim.median():.3f}"),
    verdict=Calibrated("data_randomization_spearman_abs", "data_randomization", "magnitudes survive label permutation",
                       score_name="Spearman of |map|", metric="spearman_abs", why=MEASURE_WHY),
    side_rules=(OnScale("data_randomization_spearman", "data_randomization_spearman",
                        "the signed map survives label permutation", score_name="Spearman (signed)", metric="spearman"),
                OnScale("data_randomization_ssim", "data_randomization_ssim", "survives label permutation (SSIM)")),
    controls={"edge": "rejected", "random": "not rejected"},
    question="Does the map depend on what the model learned from its labels?",
    description="maps of the model and of its twin trained on permuted labels compared by the Spearman rank "
                "correlation of their magnitudes (the verdict) and signed, flip-invariant SSIM and HOG",
    options=DataRandomizationOptions)
