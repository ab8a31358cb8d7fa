"""From attribution maps to comparable heatmaps, and the similarity scores between two sets."""
from __future__ import annotations

import numpy as np
import torch

from attributions.methods import build_method
from audit.measures.similarity import (
    WINDOW,
    hog_features,
    hog_similarity,
    normalize_map,
    reduce_map,
    screen,
    spearman,
    ssim,
    undefined_where,
)


def heatmaps(maps: dict[str, torch.Tensor], reduction: dict | None = None) -> dict[str, torch.Tensor]:
    """{method: (N, C, H, W) maps} -> {method: (N, H, W) raw heatmaps}.

    Each method's own reduction (:attr:`attributions.Method.heatmap`: the signed channel sum for
    relevance and contributions, the largest magnitude for gradient-like maps) unless
    ``reduction`` names another for it.
    """
    reduction = reduction or {}
    return {m: reduce_map(v.detach().cpu().double(), reduction.get(m, build_method(m).heatmap))
            for m, v in maps.items()}


class ReferenceMaps:
    """Raw heatmaps (N, H, W) that later maps are compared with; their normalised form and HOG
    descriptors are computed once."""

    def __init__(self, raw: torch.Tensor, win_size: int = WINDOW):
        (self.bad, self.raw), self.win_size = screen(raw), win_size
        self.normalized = normalize_map(self.raw)
        self.hog = hog_features(self.normalized)

    def compare(self, other: torch.Tensor) -> dict[str, np.ndarray]:
        """Flip-invariant SSIM of the normalised maps, Spearman of the raw maps (signed and of
        |.|), and Spearman of the normalised maps' HOG descriptors; each (N,), NaN where either map
        is :func:`~audit.measures.similarity.degenerate`."""
        bad, other = screen(other)
        bad = bad | self.bad
        norm = normalize_map(other)
        return undefined_where(bad, {
            "ssim": ssim(self.normalized, norm, win_size=self.win_size, data_range=1.0, flip_invariant=True).numpy(),
            "spearman": spearman(self.raw, other), "spearman_abs": spearman(self.raw.abs(), other.abs()),
            "hog": hog_similarity(self.hog, norm)})
