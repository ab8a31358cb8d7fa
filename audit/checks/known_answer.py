"""Known-answer controls for the checks themselves: maps of a stated model dependence, and each check's operating curve.

A check is held to maps whose answer is known by construction (cf. MetaQuantus, Hedstroem et al. 2023: a metric
must react to a disruptive change and not to a minor one). The mixture

    m_w = (1 - w) * e / max|e| + w * g / max|g|

of the model-independent map ``e`` (the edge detector: a Sobel filter of the input) and the gradient's map ``g``
(each image's heatmap scaled to a largest magnitude of 1) depends on the model to the degree ``w``: at ``w = 0`` it
is the edge map, which no randomization changes and every check must reject; at ``w = 1`` it is the gradient, whose
maps change as soon as the logit layer is randomized and which the cascading check must not reject. Run through the
check's own stages, measures and verdict rule (with the run's controls for the scale), the outcome against ``w`` is
the check's operating curve, and the largest ``w`` it still rejects is its resolution: "rejects maps up to N %
model-dependent". The data-randomization check reads the same mixtures formed on the model, its twins and the
untrained copies: the edge map is the same on all of them (rejected at ``w = 0``), and the gradient's changes with
the labels the model learned.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from audit.checks.base import Check, VerdictCell
from audit.checks.data_randomization import CHECK as DATA_RANDOMIZATION
from audit.checks.data_randomization import as_pairs, checked_pair, pair_scores, role_maps, twin_pairs
from audit.checks.randomization import CHECKS as RANDOMIZATION
from audit.checks.randomization import stage_maps
from audit.checks.replicates import replicates
from audit.checks.stage_options import StageSettings
from audit.errors import ConfigError
from audit.inputs import Images, Labels, check_inputs
from audit.measures.heatmaps import ComparableMaps, ReferenceMaps, input_structure


def mixture(edge: torch.Tensor, gradient: torch.Tensor, weight: float) -> torch.Tensor:
    """``(1 - weight) * edge + weight * gradient`` of heatmaps (N, H, W), each image's map first scaled to a largest
    magnitude of 1 (a constant zero map stays zero)."""
    def unit(maps: torch.Tensor) -> torch.Tensor:
        top = maps.abs().flatten(1).amax(1).clamp_min(torch.finfo(maps.dtype).tiny)
        return maps / top[:, None, None]
    return (1 - weight) * unit(edge) + weight * unit(gradient)


def cascading_curve(model: nn.Module, x: Images, y: Labels, weights: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0), *,
                    stages: StageSettings | None = None, progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cascading check's operating curve: its verdict on the mixture maps of each weight.

    The model's stages are randomized once; at each stage the edge map, the gradient's map and the two controls
    (the edge and the random map, the scale's ends) are computed, the mixtures formed from the first two, and every
    mixture compared with its own trained-model map by the check's measures.

    Parameters
    ----------
    model : nn.Module; never modified (the stages are copies)
    x : (B, C, H, W) images
    y : (B,) labels
    weights : the mixtures' weights ``w`` in [0, 1]
    stages : the stage settings (default: cascading, the run's defaults)
    progress : whether to show progress bars

    Returns
    -------
    curve : DataFrame
        One row per weight: weight, outcome, score (the verdict's score: the median SSIM after the logit layer),
        images, text (the verdict cell's text).
    rows : DataFrame
        The check's rows of every mixture (method ``mixture@<w>``) and of the controls, as the check writes them.
    """
    _weights(weights)
    x, y = check_inputs(model, x, y)
    settings = stages if stages is not None else StageSettings(order="cascading")
    names = [f"mixture@{w:g}" for w in weights]
    reference: dict[str, ReferenceMaps] = {}
    parts = []
    for stage in stage_maps(model, x, y, ["edge", "gradient", "random"], settings, progress=progress,
                            name="known-answer curve"):
        maps = {name: mixture(stage.maps["edge"], stage.maps["gradient"], w) for name, w in zip(names, weights)}
        maps |= {"edge": stage.maps["edge"], "random": stage.maps["random"]}
        for method, values in maps.items():
            comparable = ComparableMaps(values)
            if stage.stage == 0:  # the trained model's maps, prepared once as the reference
                reference[method] = ReferenceMaps(comparable)
            scores = reference[method].compare(comparable)
            parts.append(pd.DataFrame({"method": method, "stage": stage.stage, "layer": stage.layer,
                                       "image": np.arange(len(x)), "replicate": 0, **scores}))
    rows = pd.concat(parts, ignore_index=True)
    check = next(c for c in RANDOMIZATION if c.name == "cascading")
    return _curve(check, rows, names, weights, len(x)), rows


def data_randomization_curve(model: nn.Module, twin: nn.Module | Sequence[nn.Module], x: Images, y: Labels,
                             weights: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0), *,
                             control: nn.Module | Sequence[nn.Module], images_per_seed: int = 2, seed: int = 0,
                             progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The data-randomization check's operating curve: its calibrated verdict on the mixture maps of each weight.

    The edge map, the gradient's map and the random map are computed on the model, on each pair's permuted-label
    twin and control twin and on the untrained copies (each role explaining its images, as the check shares them
    out), the mixtures formed on each, and every mixture's maps compared as the check compares a method's.

    Parameters
    ----------
    model : nn.Module, not modified
    twin, control : the permuted-label twins and the control twins, one of each per pair
    x : (B, C, H, W) images
    y : (B,) labels
    weights : the mixtures' weights ``w`` in [0, 1]
    images_per_seed, seed : as :func:`~audit.checks.data_randomization.data_randomization`
    progress : whether to show progress bars

    Returns
    -------
    curve : DataFrame
        One row per weight: weight, outcome, score (the median Spearman of ``|map|`` to the twin), images, text.
    rows : DataFrame
        The check's rows of every mixture (method ``mixture@<w>``) and of the controls.
    """
    _weights(weights)
    twins, controls = as_pairs(twin, control)
    x, y = checked_pair(model, twins, controls, x, y, target="true", keep_maps=0)
    roles = role_maps(model, twins, controls, x, y, ["edge", "gradient", "random"], seed=seed, target="true",
                      reduction=None, first_image=0, images_per_seed=images_per_seed, params=None, progress=progress)
    floor = replicates(0, len(x), images_per_seed)
    structure = input_structure(x)
    names = [f"mixture@{w:g}" for w in weights]
    per_method = {name: [mixture(role["edge"][0], role["gradient"][0], w) for role in roles]
                  for name, w in zip(names, weights)}
    per_method |= {c: [role[c][0] for role in roles] for c in ("edge", "random")}
    rows = pd.concat([pd.DataFrame({"method": method, "image": np.arange(len(x)),
                                    **pair_scores(maps, [], structure, "toolkit"),
                                    "untrained_replicate": floor, "twin_pair": twin_pairs(floor, len(twins))})
                      for method, maps in per_method.items()], ignore_index=True)
    return _curve(DATA_RANDOMIZATION, rows, names, weights, len(x)), rows


def _weights(weights: Sequence[float]) -> None:
    """A :class:`ConfigError` for a weight outside [0, 1]."""
    for w in weights:
        if not 0 <= w <= 1:
            raise ConfigError(f"a mixture's weight must lie in [0, 1], got {w}")


def _curve(check: Check[Any], rows: pd.DataFrame, names: list[str], weights: Sequence[float],
           images: int) -> pd.DataFrame:
    """The ``check``'s verdict on each mixture's rows, read on the scale of the controls' rows: one row per weight
    (weight, outcome, score, images, text)."""
    assert check.verdict is not None
    options = check.options_from({})
    controls = rows[rows.method.isin(["edge", "random"])]
    curve = []
    for name, w in zip(names, weights):
        cell: VerdictCell = check.verdict.evaluate(rows[rows.method == name], options, controls=controls)
        curve.append({"weight": w, "outcome": cell.outcome, "score": cell.score, "images": images, "text": cell.text})
    return pd.DataFrame(curve)


def resolution(curve: pd.DataFrame) -> float | None:
    """The largest weight up to which every mixture of ``curve`` is rejected ("rejects maps up to N %
    model-dependent"), or None where even the edge map (weight 0) is not."""
    rejected = None
    for w, outcome in zip(curve.weight, curve.outcome):
        if outcome != "rejected":
            break
        rejected = float(w)
    return rejected
