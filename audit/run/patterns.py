"""Where an audit's PatternNet and PatternAttribution take their patterns from.

Kindermans et al. fit the signal patterns on the training data. ``pattern_data`` chooses: "explained" (the
images each check explains, the methods' own default), "train" (the training split of the audited data
set; for the embedded sample, the embedded sample's own training part) or "<data set>:<split>" (a named
sample, e.g. "fashion-mnist:train"); ``pattern_images`` of them, a seeded draw. The trained model's
patterns are fitted once and kept beside its checkpoint (in the run folder's ``patterns/`` for the shipped
checkpoints and when there is no writable checkpoint folder), named by the weights' fingerprint, and read
again by later units and runs; every randomized model is refitted on the same images
(:class:`attributions.patterns.PatternSource`).
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attributions.patterns import fingerprint
from audit.data.datasets import DATASETS, SPLITS, load_dataset
from audit.errors import ConfigError
from audit.models.catalog import SHIPPED
from audit.models.checkpoint import model_files

PATTERN_METHODS = ("patternnet", "patternattribution")
EXPLAINED = "explained"


def pattern_source(value: str, data: str) -> tuple[str, str] | None:
    """(data set, split) that ``pattern_data`` = ``value`` names for audit data ``data``, or None for the
    explained images; a :class:`ConfigError` for anything else."""
    if value == EXPLAINED:
        return None
    if value == "train":
        if data == "imagefolder":
            raise ConfigError("pattern_data train: an image folder has no training split the audit knows; give "
                              "pattern_data <data set>:train, or explained")
        return ("fashion-mnist-sample" if data == "embedded" else data), "train"
    name, sep, split = value.partition(":")
    if not sep or name not in DATASETS or name == "imagefolder" or split not in SPLITS:
        raise ConfigError(f"pattern_data must be {EXPLAINED!r}, 'train' or '<data set>:<split>' with a data set of "
                          f"{', '.join(d for d in DATASETS if d != 'imagefolder')} and a split of {', '.join(SPLITS)}; "
                          f"got {value!r}")
    return name, split


def pattern_images(value: str, data: str, n: int, seed: int, root: str | None = None) -> tuple[torch.Tensor, str] | None:
    """(images (n, C, H, W) float32, what they are) that the pattern methods are fitted on, or None for the
    explained images: a seeded draw of ``n`` from the split ``value`` names (:func:`pattern_source`)."""
    named = pattern_source(value, data)
    if named is None:
        return None
    name, split = named
    x, _ = load_dataset(name, split, root)
    if n > len(x):
        raise ConfigError(f"pattern_images={n}, but the {split} split of {name} holds {len(x)} images; ask for at "
                          f"most {len(x)}")
    order = np.random.default_rng(seed).permutation(len(x))[:n]
    return torch.from_numpy(x[np.sort(order)]), f"{n} images of the {split} split of {name} (seed {seed})"


def cache_file(spec: str, weights: str | None, label: str, value: str, data: torch.Tensor, trained: str, *,
               out: Path) -> Path:
    """Where the trained model's patterns are kept: beside its checkpoint (or weights file) when that folder is
    writable, else in ``out``/patterns; named by the model, the data, the number of images, the images' own
    sha256 (another seed draws other images) and the weights' fingerprint, so that other weights or data never
    read them."""
    files = [f for f in model_files(spec, weights) if f.suffix in (".pt", ".pth", ".safetensors", ".bin")]
    # the package's own checkpoint folder stays as shipped: the run folder keeps their patterns
    beside = files and files[0].parent.resolve() != Path(str(SHIPPED)).resolve() and os.access(files[0].parent, os.W_OK)
    folder = files[0].parent if beside else out / "patterns"
    folder.mkdir(parents=True, exist_ok=True)
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", value)
    images = hashlib.sha256(data.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:12]
    return folder / f"{label}.patterns-{tag}-{len(data)}-{images}-{trained[:16]}.pt"


def pattern_params(methods: list[str], spec: str, model: nn.Module, label: str, images: tuple[torch.Tensor, str] | None,
                  value: str, *, weights: str | None, out: Path) -> dict[str, dict[str, Any]]:
    """{pattern method: its parameters} for the audit of ``model`` (empty when the methods fit on the
    explained images, or none is audited)."""
    wanted = [m for m in methods if m in PATTERN_METHODS]
    if images is None or not wanted:
        return {}
    data, what = images
    trained = fingerprint(model)
    cache = cache_file(spec, weights, label, value, data, trained, out=out)
    return {m: {"data": data.to(next(iter(model.parameters()), data).device), "cache": cache, "cache_for": trained,
                "source": what} for m in wanted}
