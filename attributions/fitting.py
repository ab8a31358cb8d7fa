"""Fitting PatternNet's patterns once, for reuse: :func:`fit_patterns` (above the explainer, which the
pattern rules of :mod:`attributions.patterns` sit below)."""
from __future__ import annotations

import torch
from torch import nn

from attributions.errors import AttributionError
from attributions.explainer import Explainer, check_input
from attributions.patterns import ESTIMATORS, Patterns, fingerprint, fit_nodes


def fit_patterns(model: nn.Module, data: torch.Tensor, estimator: str = "relu", batch: int = 64,
                 source: str = "") -> Patterns:
    """Patterns of every conv and dense layer of ``model`` fitted on ``data`` (N, ...) in batches of ``batch``;
    ``source`` says what the images are (recorded with them)."""
    if estimator not in ESTIMATORS:
        raise AttributionError(f"pattern estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    data = check_input(data)
    ex = Explainer(model, "gradient")
    with torch.no_grad():
        patterns = fit_nodes(ex, data, estimator, batch)
    return Patterns(patterns, estimator, len(data), source or f"{len(data)} images", fingerprint(model))
