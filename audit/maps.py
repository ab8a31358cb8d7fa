"""From attribution maps to comparable heatmaps, and the similarity scores between two sets."""
from __future__ import annotations

import numpy as np
import torch

from audit.methods import default_reduction
from audit.similarity import hog_similarity, normalize_map, reduce_map, spearman, ssim


def heatmaps(maps: dict[str, torch.Tensor], reduction: dict | None = None) -> dict[str, torch.Tensor]:
    """{method: (N, C, H, W) maps} -> {method: (N, H, W) raw heatmaps}, reduced per DESIGN 3.2."""
    reduction = reduction or {}
    return {m: reduce_map(v.detach().double(), reduction.get(m, default_reduction(m))) for m, v in maps.items()}


def map_similarities(a: torch.Tensor, b: torch.Tensor, win_size: int = 5) -> dict[str, np.ndarray]:
    """Scores between raw heatmaps a and b (N, H, W): flip-invariant SSIM of the normalised maps,
    Spearman of the raw maps (signed and of |.|), Spearman of the normalised maps' HOG features."""
    na, nb = normalize_map(a), normalize_map(b)
    return {"ssim": ssim(na, nb, win_size=win_size, data_range=1.0, flip_invariant=True).numpy(),
            "spearman": spearman(a, b), "spearman_abs": spearman(a.abs(), b.abs()),
            "hog": hog_similarity(na, nb)}
