"""What a permuted-label twin of a library model costs: timm's ``resnet18`` trained with ``train --model`` on
Fashion-MNIST images written as an RGB image folder (28 x 28, streamed), labels permuted once, by the shipped
twins' recipe (SGD, lr 0.02, batch 128, cosine over 100 epochs, no weight decay) until the training accuracy
reaches 0.95: the epochs and the time against the subset's size. Needs timm (``.venv-libraries``).
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from audit.data.datasets import load_dataset
from audit.errors import ConfigError
from audit.models import train
from audit.models.recipes import RECIPES

MODEL = "timm:resnet18"
SUBSETS = (250, 500, 1_000)


def _folder(root: Path, n: int) -> Path:
    """The first ``n`` Fashion-MNIST training images as RGB PNG files, one folder per class."""
    x, y = load_dataset("fashion-mnist", "train")
    for i in range(n):
        (root / f"{y[i]:02d}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.round(x[i, 0] * 255).astype(np.uint8)).convert("RGB").save(root / f"{y[i]:02d}" / f"{i}.png")
    return root


def run() -> str:
    rows = ["| model | training images | epochs to 0.95 on permuted labels | time |", "|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        root = _folder(Path(tmp), max(SUBSETS))
        for n in SUBSETS:
            config = dataclasses.replace(RECIPES["cnn-permuted"], model=MODEL, data="imagefolder",
                                         data_root=str(root), train_limit=n, fit_accuracy=0.95, twin_of=None)
            try:
                _, meta = train(config, progress=False, log=lambda s: None)
            except ConfigError as exc:
                rows.append(f"| {MODEL} | {n:,} | not within {config.epochs} epochs ({str(exc)[:80]}) | |")
                continue
            rows.append(f"| {MODEL} | {n:,} | {len(meta['history'])} | {meta['wall_time_s']:.0f} s |")
    return ("A permuted-label twin of a timm model (random weights, the shipped cnn twin's recipe, streamed from an "
            "RGB image folder of Fashion-MNIST images):\n\n" + "\n".join(rows))
