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

    Parameters
    ----------
    values : array_like
        The sample, of any shape (flattened); NaN entries are dropped.
    level : float, default 0.99
        The interval's coverage: the ``(1 - level) / 2`` and ``1 - (1 - level) / 2`` quantiles of the
        resampled statistics.
    n_resamples : int, default 10000
        Bootstrap resamples (each of the sample's size, drawn with replacement).
    seed : int, default 0
        Seeds the resampling (``numpy.random.default_rng``).
    statistic : callable, default numpy.median
        ``statistic(array, axis=1)`` of each resample's row; called without ``axis`` for the estimate.

    Returns
    -------
    estimate : float
        ``statistic`` of the sample itself.
    low, high : float
        The percentile interval's bounds.
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

    Parameters
    ----------
    df : DataFrame
        A tidy result table: grouped by those of :data:`ID_COLUMNS` it has (model, method, stage, layer,
        inject_at, depth), summarising those of :data:`METRICS` it has.
    level, n_resamples, seed
        As :func:`bootstrap_ci`, for every metric of every group.

    Returns
    -------
    DataFrame
        One row per group, in order of first appearance: the group's key columns, then for each metric
        its median ``<metric>`` and interval ``<metric>_low``, ``<metric>_high`` (NaN values dropped; all
        NaN when none is left), then ``n``, the group's row count (NaN rows included).

    Raises
    ------
    AuditError
        When the table has no key column or no metric column.
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
