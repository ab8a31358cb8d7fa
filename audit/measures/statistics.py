"""Bootstrap confidence intervals, and per-method summaries of the tidy result tables."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from audit.errors import AuditError

METRICS = ("ssim", "spearman", "spearman_abs", "hog", "median", "score", "entropy", "relative_l2")
ID_COLUMNS = ("model", "method", "stage", "layer", "inject_at", "depth")


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


def summarize(df: pd.DataFrame, level: float = 0.99, n_resamples: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """Median and ``level`` bootstrap interval of each metric column, per method (and per stage,
    layer, injection layer and model where the table has them).

    Returns one row per group with columns ``<metric>``, ``<metric>_low``, ``<metric>_high`` and ``n``.
    """
    keys = [c for c in ID_COLUMNS if c in df.columns]
    metrics = [c for c in METRICS if c in df.columns]
    if not keys or not metrics:
        raise AuditError(f"summarize needs a result table with a method column and metric columns "
                         f"({', '.join(METRICS)}); got columns {list(df.columns)}")
    rows = []
    for group, part in df.groupby(keys, sort=False):
        row = dict(zip(keys, group if isinstance(group, tuple) else (group,)))
        for m in metrics:
            est, low, high = bootstrap_ci(part[m].to_numpy(), level, n_resamples, seed)
            row |= {m: est, f"{m}_low": low, f"{m}_high": high}
        row["n"] = len(part)
        rows.append(row)
    return pd.DataFrame(rows)
