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
model-dependent".
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from audit.checks.base import VerdictCell
from audit.checks.randomization import CHECKS as RANDOMIZATION
from audit.checks.randomization import stage_maps
from audit.checks.stage_options import StageSettings
from audit.errors import ConfigError
from audit.inputs import Images, Labels, check_inputs
from audit.measures.heatmaps import ComparableMaps, ReferenceMaps


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
    for w in weights:
        if not 0 <= w <= 1:
            raise ConfigError(f"a mixture's weight must lie in [0, 1], got {w}")
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
    assert check.verdict is not None
    options = check.options_from({})
    controls = rows[rows.method.isin(["edge", "random"])]
    curve = []
    for name, w in zip(names, weights):
        cell: VerdictCell = check.verdict.evaluate(rows[rows.method == name], options, controls=controls)
        curve.append({"weight": w, "outcome": cell.outcome, "score": cell.score, "images": len(x), "text": cell.text})
    return pd.DataFrame(curve), rows


def resolution(curve: pd.DataFrame) -> float | None:
    """The largest weight up to which every mixture of ``curve`` is rejected ("rejects maps up to N %
    model-dependent"), or None where even the edge map (weight 0) is not."""
    rejected = None
    for w, outcome in zip(curve.weight, curve.outcome):
        if outcome != "rejected":
            break
        rejected = float(w)
    return rejected
