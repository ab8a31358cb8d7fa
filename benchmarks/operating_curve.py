"""Each check's operating curve on constructed maps of known model dependence (:mod:`audit.checks.known_answer`).

The mixture (1 - w) x edge map + w x gradient map, each image's map scaled to a largest magnitude of 1, run through
the cascading check's stages, measures and verdict rule on the shipped cnn-sgd and vgg-sgd (64 Fashion-MNIST test
images, one re-initialisation seed): the outcome and the median SSIM after the logit layer for each weight, and the
check's resolution, the largest weight up to which every mixture is rejected. Then the same mixtures through the
data-randomization check, on each model's three shipped twin pairs and its untrained copies (two images per
seed): the outcome and the median Spearman of |map| to the permuted-label twin.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from audit import embedded_sample, load_checkpoint
from audit.checks.known_answer import cascading_curve, data_randomization_curve, resolution
from audit.models import shipped_twins

MODELS = ("cnn-sgd", "vgg-sgd")
WEIGHTS = tuple(float(w) for w in np.round(np.arange(0.0, 1.01, 0.1), 2))
IMAGES = 64
MARKER = "<!-- data-randomization -->"


def run() -> str:
    x, y = embedded_sample()
    x_t, y_t = torch.from_numpy(x[:IMAGES]), torch.from_numpy(y[:IMAGES])
    cascading = {m: cascading_curve(load_checkpoint(m), x_t, y_t, WEIGHTS)[0] for m in MODELS}
    data = {m: data_randomization_curve(load_checkpoint(m), _twins(m, "permuted"), x_t, y_t, WEIGHTS,
                                        control=_twins(m, "control"))[0] for m in MODELS}
    # the marker splits the file between the two checks' pages (each includes its own table)
    return (_table(cascading, "Cascading randomization", "the median SSIM after the logit layer") + "\n\n"
            + f"{MARKER}\n\n" + _table(data, "Data randomization", "the median Spearman of |map| to the permuted-label "
                                         "twin (three twin pairs resampled)"))


def _twins(model: str, role: str) -> list[torch.nn.Module]:
    return [load_checkpoint(name) for name in shipped_twins(model, role)]


def _table(curves: dict[str, Any], check: str, score: str) -> str:
    lines = ["| w | " + " | ".join(MODELS) + " |", "|---|" + "---|" * len(MODELS)]
    for k, w in enumerate(WEIGHTS):
        cells = [f"{c.outcome.iloc[k]} ({c.score.iloc[k]:.2f})" for c in curves.values()]
        lines.append(f"| {w:g} | " + " | ".join(cells) + " |")
    said = "; ".join(f"{m}: rejects the mixtures up to w = {resolution(c)}" for m, c in curves.items())
    return (f"{check} on the mixtures (1 - w) x edge map + w x gradient map, {IMAGES} images: each cell the outcome "
            f"and {score}. Resolution: {said}.\n\n" + "\n".join(lines))
