"""The planted-shortcut check: does the map show a shortcut the model is known to use?

Two twins of one architecture are trained with a tag (:class:`~audit.data.tags.Tag`): the *shortcut twin* saw the
tag on a share of the training images of class c* (and, with ``relabel``, on a few of the other classes' images
labelled c*), so that the tag makes it predict c* (its gate: the shortcut score,
the share of other classes' test images it predicts c* once tagged, is known, :mod:`audit.models.shortcut_twins`);
the *tag control twin* saw the tag at the same rate on images of every class, so that the tag is present and as
salient but says nothing of the label. On tagged images of the other classes, explaining c* on both twins, each
method's map is read by its share of ``|map|`` inside the tag's mask, paired by image (the model contrast of Yang &
Kim 2019): the tag is what the shortcut twin uses and the control twin does not, so a map that shows what the model
uses gives it more on the shortcut twin.

The verdict reads the per-image difference ``shortcut share - control share``. It is rejected (the map does not
show a reliance the model is known to have) when the interval of its median lies at or below the tag's area share
(what a map spread evenly over the image puts on the tag: the margin, measured on the run's images and tag), not
rejected when it lies wholly above, inconclusive otherwise. The edge map and the random map, which no model changes,
must be rejected. Also measured: the control twin's share against the area share (a map that lights the tag on a
model that ignores it follows salience, not use) and both twins' shares on the clean images (Adebayo et al. 2022's
comparison: a normal model's map should not show what the spurious model's does).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from attributions.hygiene import leaves_process_alone
from audit.checks.base import (
    INCONCLUSIVE,
    NOT_READ,
    REJECTED,
    Check,
    MedianScore,
    UnitResult,
    VerdictCell,
    scored_cell,
)
from audit.checks.data_randomization import pooled_maps, twin_pairs
from audit.checks.options import Options, UnitContext
from audit.checks.passes import Params
from audit.checks.randomization import heatmap_pages
from audit.checks.replicates import replicates
from audit.checks.stage_options import heatmap_scale
from audit.data.preprocess import Preprocess, preprocess_from
from audit.data.tags import Tag
from audit.errors import AuditError, ConfigError
from audit.inputs import (
    Images,
    Labels,
    Methods,
    Reduction,
    check_count,
    check_finite_model,
    check_inputs,
    resolve_methods,
)
from audit.models.twins import same_architecture
from audit.panels import score_boxes
from audit.sections import Figure, ReportContext, Section, Table, print_first

COLUMNS = ["method", "image", "shortcut_share", "control_share", "difference", "area_share", "clean_shortcut_share",
           "clean_control_share", "shortcut_predicts", "twin_pair", "planted"]
# the kept heatmaps of each image, in this order
VIEWS = ("shortcut twin, tagged", "control twin, tagged", "shortcut twin, clean", "control twin, clean")


def tag_shares(maps: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """(N,) each heatmap's share of ``|map|`` inside ``mask``: ``sum_mask |m| / sum |m|``, NaN where the map is
    zero everywhere or not finite (no share is defined).

    Parameters
    ----------
    maps : (N, H, W) heatmaps
    mask : (H, W) bool, the tag's pixels
    """
    magnitude = maps.detach().abs().double().flatten(1)
    total = magnitude.sum(1)
    inside = magnitude[:, mask.flatten()].sum(1)
    share = (inside / total).numpy()
    share[~(np.isfinite(total.numpy()) & (total.numpy() > 0))] = np.nan
    return np.asarray(share, dtype=float)


def as_twin_pairs(shortcut: nn.Module | Sequence[nn.Module], control: nn.Module | Sequence[nn.Module]
                  ) -> tuple[list[nn.Module], list[nn.Module]]:
    """(shortcut twins, tag control twins), one of each per pair, each pair of one architecture; else a
    :class:`ConfigError` saying which."""
    shortcuts = [shortcut] if isinstance(shortcut, nn.Module) else list(shortcut)
    controls = [control] if isinstance(control, nn.Module) else list(control)
    if not shortcuts or len(shortcuts) != len(controls):
        raise ConfigError(f"the shortcut check needs one tag control twin per shortcut twin, got {len(shortcuts)} "
                          f"shortcut twins and {len(controls)} control twins")
    for k, (s, c) in enumerate(zip(shortcuts, controls)):
        pair = "" if len(shortcuts) == 1 else f" {k + 1}"
        same_architecture(s, c, f"the shortcut twin{pair}", f"the tag control twin{pair}")
    return shortcuts, controls


@leaves_process_alone
def shortcut_test(shortcut: nn.Module | Sequence[nn.Module], control: nn.Module | Sequence[nn.Module], tag: Tag,
                  x: Images, y: Labels, methods: Methods = "all", *, seed: int = 0,
                  preprocess: Preprocess | None = None, reduction: Reduction | None = None, keep_maps: int = 0,
                  images_per_seed: int = 2, first_image: int = 0, params: Params | None = None,
                  progress: bool = False, planted: bool = True) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Each method's share of ``|map|`` inside the tag on the shortcut twin and on the tag control twin, explaining
    the tag's class on tagged images of the other classes, paired by image.

    Parameters
    ----------
    shortcut, control : the shortcut twin and its tag control twin, or one of each per pair (image i of the run
        belongs to pair ``(i // images_per_seed) mod pairs``, as the data-randomization test shares its pairs out);
        not modified
    tag : the tag both were trained with; ``tag.target`` is the explained class c*
    x : (B, C, H, W) clean images, as the model reads them; the images of class c* are left out
    y : (B,) their true labels
    methods : names, "all" or a comma-separated string
    seed : the random control's draw on the shortcut twin (the control twin's: the next seed, another draw)
    preprocess : the models' input normalisation, which the tag's values go through (none: inputs in [0, 1])
    reduction : {method: "sum" | "max-abs"} overrides of the heatmap reduction
    keep_maps : how many images' heatmaps to keep, for the report
    images_per_seed, first_image : how consecutive images share a pair, and the run's index of the first image
    params : {method: {name: value}}, parameters given to each method's explainer
    progress : not read (the four passes per pair are short); kept for the checks' common signature
    planted : whether the pair passed its gate (:func:`~audit.models.shortcut_twins.gate`), recorded in every row:
        the verdict of a pair that did not is inconclusive

    Returns
    -------
    DataFrame, one row per method x image of another class: method, image (its index in ``x``), shortcut_share and
    control_share (tagged image), difference (shortcut - control: the verdict's score), area_share (the tag's share
    of the pixels: the verdict's margin), clean_shortcut_share and clean_control_share (the clean image, the tag
    absent), shortcut_predicts (the shortcut twin predicts c* on the tagged image), twin_pair (from 0);
    and {method: (4, keep_maps, H, W)} heatmaps of the first ``keep_maps`` images given, in the order of
    :data:`VIEWS` (NaN for an image of the tag's class).
    """
    shortcuts, controls = as_twin_pairs(shortcut, control)
    check_count("keep_maps", keep_maps)
    for net in (*shortcuts[1:], *controls):  # every twin finite (the first, with the images, below)
        check_finite_model(net)
    x, y = check_inputs(shortcuts[0], x, y)
    if y is None:
        raise AuditError("the shortcut check needs the labels y: it explains the tag's class on the other classes")
    if x.ndim != 4:
        raise AuditError(f"the shortcut check pastes its tag on images (B, C, H, W), got x of shape {tuple(x.shape)}")
    names = resolve_methods(methods)
    height, width = x.shape[2:]
    mask, area = tag.mask(height, width), tag.area(height, width)
    others = torch.nonzero(y != tag.target).flatten()
    pair = twin_pairs(replicates(first_image, len(x), images_per_seed), len(shortcuts))[others.numpy()]
    clean = x[others]
    tagged = tag.paste(clean, preprocess)
    both = torch.cat([tagged, clean])  # one pass per twin: tagged images first, then the same images clean
    target = torch.full((len(both),), tag.target, dtype=torch.long)
    n = len(others)
    shares: dict[str, list[np.ndarray]] = {m: [] for m in names}
    kept = {m: torch.full((len(VIEWS), min(keep_maps, len(x)), height, width), float("nan"), dtype=torch.float64)
            for m in names}
    shown = torch.nonzero(others < keep_maps).flatten()  # the kept images of another class, among the first given
    for k, twins in enumerate((shortcuts, controls)):
        parts = [(net, np.concatenate([np.flatnonzero(pair == p), n + np.flatnonzero(pair == p)]))
                 for p, net in enumerate(twins)]
        maps, predicted = pooled_maps(parts, both, target, names, seed=seed + k, target="true", reduction=reduction,
                                      params=params)
        for m in names:
            shares[m].append(tag_shares(maps[m][0], mask))
            kept[m][k, others[shown]] = maps[m][0][shown].double()
            kept[m][k + 2, others[shown]] = maps[m][0][n + shown].double()
        if k == 0:  # the shortcut twins' own forward pass: do they predict c* on the tagged images?
            predicts = (predicted[:n] == tag.target).numpy()
    rows = []
    for m in names:
        (s_both, c_both) = shares[m]
        for j, i in enumerate(others.tolist()):
            rows.append({"method": m, "image": i, "shortcut_share": s_both[j], "control_share": c_both[j],
                         "difference": s_both[j] - c_both[j], "area_share": area,
                         "clean_shortcut_share": s_both[n + j], "clean_control_share": c_both[n + j],
                         "shortcut_predicts": bool(predicts[j]), "twin_pair": int(pair[j]), "planted": planted})
    return pd.DataFrame(rows, columns=COLUMNS), {m: v.numpy() for m, v in kept.items()}


@dataclass(frozen=True)
class ShowsReliance(MedianScore):
    """Rejects a map whose shortcut twin's tag share does not exceed its control twin's by the tag's area share:
    the interval of the median per-image ``difference`` at or below the margin (the rows' ``area_share``); not
    rejected when it lies wholly above; inconclusive when it contains the margin or too few images give a defined
    share (:func:`~audit.checks.base.scored_cell`). The margin is measured on the run's images and tag, not a
    threshold option; the twin pairs are the draws the interval resamples (:meth:`MedianScore.replicates`)."""

    threshold: str = ""
    score_name: str = "share difference"
    read_against: str = "against the tag's area share"
    metric: str = "difference"
    fails_below: bool = True

    def evaluate(self, part: pd.DataFrame, options: Options, controls: pd.DataFrame | None = None) -> VerdictCell:
        """The median shortcut-minus-control share over the images, against the tag's area share.

        Parameters
        ----------
        part : the check's rows of one model x method
        options : the check's options (their interval level: the run's looks and family)
        controls : not read: the margin is the tag's area share
        """
        margin = float(part.area_share.iloc[0])
        if "planted" in part and not part.planted.astype(bool).all():
            return VerdictCell(float("nan"), f"{INCONCLUSIVE} (shortcut not planted: the twins miss the gate)",
                               INCONCLUSIVE, reason=f"{NOT_READ}: the shortcut was not planted (the twins miss the gate)")
        cell = scored_cell(self.per_image(part).to_numpy(), margin, rejects_at_or_above=False,
                           label="shortcut - control", short="shortcut - control", level=options.interval_level,
                           groups=self.replicates(part))
        reason = "the shortcut twin's map gives the tag no more than the control twin's" \
            if cell.outcome == REJECTED else ""
        return VerdictCell(cell.score, cell.text, cell.outcome, cell.undefined, reason=reason, reading=cell.reading)

    def rejects_when(self, options: Options) -> str:
        return "the median difference's interval at or below the tag's area share"

    def rule_text(self, options: Options) -> str:
        return ("rejected (the map does not show a shortcut the model is known to use) when the interval of the "
                "median per-image difference between the shortcut twin's and the control twin's share of |map| "
                "inside the tag lies at or below the tag's share of the image's pixels (what a map spread evenly "
                "puts on it), not rejected when it lies wholly above, inconclusive when it contains it")


@dataclass(frozen=True)
class ShortcutOptions(Options):
    """The planted-shortcut check's keys."""

    heatmap_scale: str = heatmap_scale()


def _run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, options: ShortcutOptions,
         unit: UnitContext) -> UnitResult:
    pair = unit.shortcut
    if pair is None:  # the runner skips a model without shortcut twins before it gets here
        raise AuditError("the planted-shortcut check needs the model's shortcut twins")
    df, maps = shortcut_test(pair.models[0], pair.models[1], pair.tag, x, y, [method], seed=unit.seed,
                             preprocess=pair.preprocess, keep_maps=unit.heatmap_examples, first_image=unit.first_image,
                             params=unit.params, planted=pair.gate.planted)
    return UnitResult(df, maps[method] if unit.heatmap_examples else None)


def _gate_table(manifest: dict[str, Any]) -> pd.DataFrame:
    """Each model's shortcut twins, their tag and their gate figures, from the manifest."""
    return pd.DataFrame([{"model": model, "shortcut twin": r["shortcut"], "tag control twin": r["tag_control"],
                          "tag": Tag.from_dict(r["tag"]).spec, "shortcut score (>= 0.85)": r["shortcut_score"],
                          "control's score (<= 0.10)": r["control_score"], "clean accuracy": r["shortcut_accuracy"],
                          "control's clean accuracy": r["control_accuracy"],
                          "planted": "yes" if r["planted"] else "NO"}
                         for model, r in manifest.get("shortcuts", {}).items()])


def _share_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per model and method, the median shares: tagged on each twin, their difference, the area share, and the
    clean images' on each twin."""
    columns = {"shortcut_share": "shortcut twin", "control_share": "control twin", "difference": "difference",
               "area_share": "area share", "clean_shortcut_share": "clean, shortcut twin",
               "clean_control_share": "clean, control twin"}
    medians = table.groupby(["model", "method"], sort=False)[list(columns)].median().reset_index()
    return medians.rename(columns=columns).round(3)


def _sections(table: pd.DataFrame, context: ReportContext, options: ShortcutOptions) -> list[Section]:
    manifest = context.manifest()
    gates = _gate_table(manifest)
    models = list(table.model.unique())
    figures = []
    for m in models:
        part = table[table.model == m]
        area = float(part.area_share.iloc[0])
        figures.append(Figure(f"shortcut_{m}", score_boxes(part, "difference", area, "shortcut - control share"),
                              f"Planted shortcut on {m}: per image (points) and method (boxes), the share of |map| "
                              "inside the tag on the shortcut twin minus the share on the tag control twin, explaining "
                              f"the tag's class on tagged images of the other classes. Dashed: the tag's area share "
                              f"({area:.3f}), the margin; a method at or below it does not show the shortcut the "
                              "model is known to use (rejected)."))
        record = manifest.get("shortcuts", {}).get(m)
        maps, images = context.examples(m, "shortcut", list(part.method.unique()))
        if maps and record is not None and images is not None:
            keep = [i for i in range(next(iter(maps.values())).shape[1])
                    if np.isfinite(next(iter(maps.values()))[0, i]).any()][:2]
            tag = Tag.from_dict(record["tag"])
            shown = tag.paste(torch.from_numpy(images[keep])).numpy()
            figures += heatmap_pages({k: v[:, keep] for k, v in maps.items()}, list(VIEWS), m, "shortcut",
                                     images=shown, preprocess=preprocess_from(context.config.preprocess),
                                     scale=options.heatmap_scale,
                                     columns="on the shortcut twin and the tag control twin, tagged then clean")
    text = ("Does the map show a shortcut the model is known to use? Two twins of the model's architecture were "
            "trained with a tag: the shortcut twin saw it on a share of the training images of one class c* (and, where "
            "the gate table's tag names relabel=R, on a share R of the other classes' images, labelled c*), so that "
            "the tag "
            "makes it predict c*; the tag control twin saw it on as many images of every class, so that it is "
            "present and as salient but says nothing of the label. The gate (shortcut score at least 0.85 on the "
            "shortcut twin and at most 0.10 on the control, clean accuracies within 2 points) says the reliance is "
            "there. On tagged images of the other classes, explaining c* on both twins, each map's share of |map| "
            "inside the tag is compared image by image (the model contrast of Yang & Kim 2019); the tag's area "
            "share is the margin. The edge and random maps, which no model changes, must be rejected. The control "
            "twin's share against the area share shows salience without use; the clean images' shares show whether "
            "a normal model's map raises the alarm the spurious model's should (Adebayo et al. 2022).")
    skipped = manifest.get("skipped", {}).get("shortcut", {})
    if skipped:
        text += " Skipped (no shortcut twins): " + ", ".join(skipped) + "."
    tables = [Table(_share_table(table), "Median shares of |map| inside the tag, per model and method.",
                    "shortcut_shares")]
    if not gates.empty:
        tables.insert(0, Table(gates, "Shortcut twins and their gate: the shortcut score (the share of the other "
                                      "classes' tagged test images predicted c*) of each twin and their clean test "
                                      "accuracies.", "shortcut_gate"))
    return [Section("Planted shortcut", text=text, tables=tables, figures=print_first(figures, len(models)))]


CHECK = Check(
    name="shortcut", cite=("adebayo2020", "adebayo2022", "yang2019", "zhou2022", "gu2017"), title="Planted shortcut",
    reference="Adebayo et al. 2022; Yang & Kim 2019", result_file="shortcut.csv", columns=COLUMNS, run=_run,
    sections=_sections, order=45, twins="shortcut",
    summary=lambda df: (f"median share inside the tag: shortcut twin {df.shortcut_share.median():.3f}, control twin "
                        f"{df.control_share.median():.3f}, difference {df.difference.median():.3f} (area "
                        f"{df.area_share.iloc[0]:.3f})"),
    verdict=ShowsReliance("shortcut_difference", "shortcut", "does not show a shortcut the model uses"),
    controls={"edge": "rejected", "random": "rejected"},
    question="Does the map show a shortcut the model is known to use?",
    description="each map's share of |map| inside a planted tag on the model's shortcut twin against its tag control "
                "twin, explaining the tag's class on tagged images of the other classes, paired by image; the margin "
                "is the tag's area share",
    options=ShortcutOptions)
