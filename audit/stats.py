"""Bootstrap confidence intervals."""
from __future__ import annotations

from typing import Callable

import numpy as np


def bootstrap_ci(values, level: float = 0.99, n_resamples: int = 10_000, seed: int = 0,
                 statistic: Callable = np.median) -> tuple[float, float, float]:
    """Percentile bootstrap interval of ``statistic`` (default: the median) over ``values``.

    NaN values are dropped. Returns (estimate, low, high); all NaN when no value remains.
    Resampling is seeded and vectorised (``n_resamples`` x n indices at once).
    """
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    draws = statistic(v[rng.integers(0, v.size, size=(n_resamples, v.size))], axis=1)
    alpha = (1 - level) / 2
    low, high = np.quantile(draws, [alpha, 1 - alpha])
    return float(statistic(v)), float(low), float(high)
