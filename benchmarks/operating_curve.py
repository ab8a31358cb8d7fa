"""Each check's operating curve on constructed maps of known model dependence (:mod:`audit.checks.known_answer`).

The mixture (1 - w) x edge map + w x gradient map, each image's map scaled to a largest magnitude of 1, run through
the cascading check's stages, measures and verdict rule on the shipped cnn-sgd and vgg-sgd (64 Fashion-MNIST test
images, one re-initialisation seed): the outcome and the median SSIM after the logit layer for each weight, and the
check's resolution, the largest weight up to which every mixture is rejected.
"""
from __future__ import annotations

import numpy as np
import torch

from audit import embedded_sample, load_checkpoint
from audit.checks.known_answer import cascading_curve, resolution

MODELS = ("cnn-sgd", "vgg-sgd")
WEIGHTS = tuple(float(w) for w in np.round(np.arange(0.0, 1.01, 0.1), 2))
IMAGES = 64


def run() -> str:
    x, y = embedded_sample()
    x_t, y_t = torch.from_numpy(x[:IMAGES]), torch.from_numpy(y[:IMAGES])
    lines = ["| w | " + " | ".join(MODELS) + " |", "|---|" + "---|" * len(MODELS)]
    curves = {m: cascading_curve(load_checkpoint(m), x_t, y_t, WEIGHTS)[0] for m in MODELS}
    for k, w in enumerate(WEIGHTS):
        cells = [f"{c.outcome.iloc[k]} ({c.score.iloc[k]:.2f})" for c in curves.values()]
        lines.append(f"| {w:g} | " + " | ".join(cells) + " |")
    said = "; ".join(f"{m}: rejects the mixtures up to w = {resolution(c)}" for m, c in curves.items())
    return ("Cascading randomization on the mixtures (1 - w) x edge map + w x gradient map, "
            f"{IMAGES} images: each cell the outcome and the median SSIM after the logit layer. "
            f"Resolution: {said}.\n\n" + "\n".join(lines))
