"""Bootstrap confidence intervals, and per-method summaries of the tidy result tables."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from audit.errors import AuditError

METRICS = ("ssim", "spearman", "spearman_abs", "hog", "median", "score", "entropy", "relative_l2")
ID_COLUMNS = ("model", "method", "stage", "layer", "inject_at", "depth")


def check_interval(level: float, n_resamples: int) -> None:
    """An :class:`AuditError` unless ``level`` is in (0, 1) and ``n_resamples`` a positive integer."""
    if not 0 < level < 1:
        raise AuditError(f"level must lie strictly between 0 and 1 (e.g. 0.99), got {level!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise AuditError(f"n_resamples must be a positive integer, got {n_resamples!r}")


def bootstrap_ci(values: Any, level: float = 0.99, n_resamples: int = 10_000, seed: int = 0,
                 statistic: Callable[..., Any] = np.median, groups: Any = None) -> tuple[float, float, float]:
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
    groups : array_like or None
        The group of each value (same shape as ``values``), where the values are nested in a few random draws
        of something else (images in re-initialisation seeds): with more than one group, the interval of the
        median is :func:`nested_median_ci`'s, whose resamples draw the groups too (``statistic`` must then be
        the median).

    Returns
    -------
    estimate : float
        ``statistic`` of the sample itself.
    low, high : float
        The percentile interval's bounds.
    """
    check_interval(level, n_resamples)
    v = np.asarray(values, dtype=float).ravel()
    keep = ~np.isnan(v)
    if groups is not None:
        g = np.asarray(groups).ravel()
        if g.shape != v.shape:
            raise AuditError(f"bootstrap_ci needs one group per value, got {v.shape} values and {g.shape} groups")
        if len(np.unique(g[keep])) > 1:
            if statistic is not np.median:
                raise AuditError("bootstrap_ci with groups resamples the median only")
            return nested_median_ci(v, g, level, n_resamples, seed)
    v = v[keep]
    if v.size == 0:
        return (float("nan"),) * 3
    return _percentile_interval(v.tobytes(), level, n_resamples, seed, statistic)


def nested_median_ci(values: Any, groups: Any, level: float = 0.99, n_resamples: int = 10_000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Two-stage bootstrap interval of the median of values nested in groups (images in re-initialisation seeds).

    Each resample draws as many groups as there are, with replacement, then within each drawn group as many of its
    values as it holds, with replacement, and takes the median of the pooled draws (Davison and Hinkley 1997,
    section 3.8, resampling both stages with replacement). Its spread holds the spread between the groups as well
    as the spread within them, so a verdict read from it covers the draw of the seeds, not of the images alone;
    with both stages resampled it is the wider of their two strategies (the one that does not understate the
    variance when the groups are few). The coverage measured by simulation is in the tests
    (``tests/audit/measures/test_statistics.py``).

    Parameters
    ----------
    values : array_like
        (n,) values; NaN entries are dropped.
    groups : array_like
        (n,) the group of each value (any hashable labels).
    level, n_resamples, seed
        As :func:`bootstrap_ci`.

    Returns
    -------
    estimate, low, high : float
        The median of all values and the interval's bounds; all NaN when no value remains.
    """
    v = np.asarray(values, dtype=float).ravel()
    g = np.asarray(groups).ravel()
    keep = ~np.isnan(v)
    v, g = v[keep], g[keep]
    if v.size == 0:
        return (float("nan"),) * 3
    _, g = np.unique(g, return_inverse=True)
    order = np.argsort(g, kind="stable")
    return _nested_interval(v[order].tobytes(), np.bincount(g.ravel()).astype(np.int64).tobytes(), level, n_resamples, seed)


@functools.lru_cache(maxsize=4096)
def _nested_interval(sample: bytes, sizes: bytes, level: float, n_resamples: int,
                     seed: int) -> tuple[float, float, float]:
    """:func:`nested_median_ci` of the float64 values in ``sample``, sorted by group, the groups' int64 ``sizes``
    in that order; remembered, as :func:`_percentile_interval`."""
    v = np.frombuffer(sample, dtype=np.float64)
    n = np.frombuffer(sizes, dtype=np.int64)
    k, m = len(n), int(n.max())
    padded = np.full((k, m), np.inf)  # a group's unused slots sort last
    starts = np.concatenate([[0], np.cumsum(n)[:-1]])
    for j in range(k):
        padded[j, :n[j]] = v[starts[j]:starts[j] + n[j]]
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, k, size=(n_resamples, k))  # the groups of each resample
    sizes_drawn = n[drawn]
    within = rng.random((n_resamples, k, m))
    within *= sizes_drawn[..., None]  # in place: the draw of a value within its group, then its index
    # one flat gather (a row's groups, each's drawn values); the slots past a smaller group's size hold inf
    draws = padded.ravel()[(drawn * m)[..., None] + within.astype(np.int64)]
    if (n == m).all():
        count = np.full(n_resamples, k * m)
    else:
        draws[np.arange(m) >= sizes_drawn[..., None]] = np.inf
        count = sizes_drawn.sum(axis=1)
    draws = draws.reshape(n_resamples, k * m)
    draws.sort(axis=1)
    rows = np.arange(n_resamples)
    medians = (draws[rows, (count - 1) // 2] + draws[rows, count // 2]) / 2
    alpha = (1 - level) / 2
    low, high = np.quantile(medians, [alpha, 1 - alpha])
    return float(np.median(v)), float(low), float(high)


@functools.lru_cache(maxsize=4096)
def _percentile_interval(sample: bytes, level: float, n_resamples: int, seed: int,
                         statistic: Callable[..., Any]) -> tuple[float, float, float]:
    """:func:`bootstrap_ci` of the float64 values in ``sample``, remembered: a verdict re-read at another
    threshold (the sensitivity table) resamples the same scores, and the interval does not depend on it."""
    v = np.frombuffer(sample, dtype=np.float64)
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
        its median ``<metric>`` and interval ``<metric>_low``, ``<metric>_high`` (NaN values dropped; nested in the
        re-initialisation seeds, :func:`nested_median_ci`, where the table has a ``replicate`` column; all
        NaN when none is left), then ``n``, the group's row count (NaN rows included).

    Raises
    ------
    AuditError
        When the table has no key column or no metric column.
    """
    check_interval(level, n_resamples)
    keys = [c for c in ID_COLUMNS if c in df.columns]
    metrics = [c for c in METRICS if c in df.columns]
    if not keys or not metrics:
        raise AuditError(f"summarize needs a result table with a method column and metric columns "
                         f"({', '.join(METRICS)}); got columns {list(df.columns)}")
    rows = []
    for group, part in df.groupby(keys, sort=False):
        row = dict(zip(keys, group if isinstance(group, tuple) else (group,)))
        groups = part["replicate"].to_numpy() if "replicate" in part else None
        for m in metrics:
            est, low, high = bootstrap_ci(part[m].to_numpy(), level, n_resamples, seed, groups=groups)
            row |= {m: est, f"{m}_low": low, f"{m}_high": high}
        row["n"] = len(part)
        rows.append(row)
    return pd.DataFrame(rows)


def _histogram_bins(v: np.ndarray, bins: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(bins used, (bins + 1,) bin edges, (n,) bin of each of the (n,) values ``v``), as :func:`cluster_median_ci` bins."""
    low, high = np.quantile(v[::max(1, v.size // (50 * bins))], [0.01, 0.99])
    if high > low:
        inner = np.linspace(low, high, bins - 1)
        edges = np.concatenate([[min(v.min(), low)], inner, [max(v.max(), high)]])
        which = np.clip(np.floor((v - low) / (high - low) * (bins - 2)).astype(np.int64) + 1, 0, bins - 1)
        which[v < low] = 0
        which[v >= high] = bins - 1
    else:  # most values equal: three bins, below, at and above that value
        bins, edges = 3, np.array([v.min(), low, np.nextafter(low, np.inf), max(v.max(), np.nextafter(low, np.inf))])
        which = np.where(v < low, 0, np.where(v > low, 2, 1))
    return bins, edges, which


def _median_bins(weights: np.ndarray, cumulative: np.ndarray) -> np.ndarray:
    """(r,) each resample's median bin, from (r, k) resampled cluster counts and (k, bins) cumulative bin counts."""
    n_resamples, bins = weights.shape[0], cumulative.shape[1]
    half = weights @ cumulative[:, -1] / 2
    # each resample's median bin, the first whose cumulative count reaches half its total: a bisection over the
    # bins, one (resamples x clusters) product per step
    first, last = np.zeros(n_resamples, dtype=np.int64), np.full(n_resamples, bins - 1)
    while (first < last).any():
        middle = (first + last) // 2
        reached = np.einsum("rk,kr->r", weights, cumulative[:, middle]) >= half
        last, first = np.where(reached, middle, last), np.where(reached, first, middle + 1)
    return first


def cluster_median_ci(values: Any, clusters: Any, level: float = 0.99, n_resamples: int = 2000, seed: int = 0,
                      bins: int = 1000) -> tuple[float, float, float]:
    """Cluster bootstrap interval of the median of values pooled over clusters (images): each resample draws
    the clusters with replacement and pools all their values.

    A statistic pooled over the pairs and positions of a few images (CSC's median ``|cos|``) varies with the
    images, not with the pairs: resampling single values would give an interval far too narrow. The resampled
    medians are read from per-cluster histograms: ``bins`` - 2 equal bins between the 1st and 99th percentiles
    of the values (of an even subsample) and one bin beyond each, so the bounds are bin edges, the lower bound
    the lower edge of its bin and the upper bound the upper edge: at most one bin wider than exact, and as wide
    as the values reach where a resampled median falls beyond the central 98 %.

    Parameters
    ----------
    values : array_like
        (n,) values; NaN entries are dropped.
    clusters : array_like
        (n,) non-negative integer cluster (image) of each value.
    level, n_resamples, seed
        As :func:`bootstrap_ci`.
    bins : int, default 1000
        Histogram bins (at least 3).

    Returns
    -------
    estimate, low, high : float
        The pooled median and the interval's bounds; all NaN when no value remains.
    """
    v = np.asarray(values, dtype=float).ravel()
    g = np.asarray(clusters).ravel()
    if v.shape != g.shape or (g.size and (g.min() < 0 or not np.issubdtype(g.dtype, np.integer))):
        raise AuditError(f"cluster_median_ci needs one non-negative integer cluster per value, got {v.shape} values "
                         f"and {g.shape} clusters of {g.dtype}")
    keep = ~np.isnan(v)
    v, g = v[keep], g[keep]
    if v.size == 0:
        return (float("nan"),) * 3
    present = np.bincount(g)
    g = (np.cumsum(present > 0) - 1)[g]  # clusters numbered 0 .. k - 1
    k = int(g.max()) + 1
    bins, edges, which = _histogram_bins(v, bins)
    cumulative = np.cumsum(np.bincount(g * bins + which, minlength=k * bins).reshape(k, bins), axis=1).astype(float)
    rng = np.random.default_rng(seed)
    weights = np.zeros((n_resamples, k))
    np.add.at(weights, (np.arange(n_resamples)[:, None], rng.integers(0, k, size=(n_resamples, k))), 1.0)
    first = _median_bins(weights, cumulative)
    alpha = (1 - level) / 2
    low_bin = int(np.quantile(first, alpha, method="lower"))
    high_bin = int(np.quantile(first, 1 - alpha, method="higher"))
    return float(np.median(v)), float(edges[low_bin]), float(edges[high_bin + 1])
