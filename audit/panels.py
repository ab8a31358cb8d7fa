"""Small multiples by method family: the layout every per-method figure of the report shares.

One panel per family (columns), optionally one row per model, shared axes; methods keep their
colour, marker and line style from :mod:`audit.style`; the legend sits under the panels, one
column per family, never over the data.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure
from matplotlib.lines import Line2D

from audit import style


def family_panels(methods: Sequence[str], rows: Sequence[str] = ("",), width: float = style.TWO_COLUMN,
                  panel_height: float = 1.45, sharey: bool = True,
                  sharex: bool = True) -> tuple[MplFigure, np.ndarray, dict[str, list[str]]]:
    """A figure with one panel per family of ``methods`` and one row per entry of ``rows``.

    Returns
    -------
    figure, axes of shape (len(rows), families), and {family: its methods} in column order.
    Row labels (e.g. model names) are written left of each row when given.
    """
    groups = style.by_family(list(methods))
    fig = MplFigure(figsize=(width, panel_height * len(rows) + 0.55), layout="constrained")
    axes = fig.subplots(len(rows), max(len(groups), 1), squeeze=False, sharey=sharey, sharex=sharex)
    for c, name in enumerate(groups):
        axes[0, c].set_title(name)
    for r, label in enumerate(rows):
        if label:
            axes[r, 0].annotate(label, (-0.42, 0.5), xycoords="axes fraction", rotation=90, ha="center",
                                va="center", fontweight="bold")
    return fig, axes, groups


def handle(method: str, kind: str = "line") -> Line2D:
    """A legend entry for ``method``: its line and marker (``kind="line"``) or its marker alone."""
    if kind == "line":
        return Line2D([], [], color=style.color(method), marker=style.marker(method),
                      linestyle=style.linestyle(method), label=method)
    return Line2D([], [], color=style.color(method), marker=style.marker(method), linestyle="none", label=method)


def method_legend(fig: MplFigure, groups: dict[str, list[str]], kind: str = "line",
                  extra: Sequence[Line2D] = ()) -> None:
    """The figure's legend under its panels: one column per family (``extra`` entries, e.g. a
    baseline, in a last column)."""
    columns = [[handle(m, kind) for m in ms] for ms in groups.values()] + ([list(extra)] if extra else [])
    depth = max(len(c) for c in columns)
    blank = Line2D([], [], linestyle="none", label="")
    # a legend fills column by column: pad each family to the same depth so that one column is one family
    handles = [h for column in columns for h in column + [blank] * (depth - len(column))]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(columns), handlelength=2.2,
               columnspacing=1.0)


def strip(ax: Axes, x: float, values: np.ndarray, color: str, width: float = 0.25, seed: int = 0) -> None:
    """Per-image values as points at ``x``, spread sideways by a fixed jitter (same seed, same figure)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    jitter = np.random.default_rng(seed).uniform(-width / 2, width / 2, len(values))
    ax.scatter(x + jitter, values, s=2.5, color=color, alpha=0.45, linewidths=0, zorder=3)


def method_boxes(ax: Axes, methods: list[str], values: dict[str, np.ndarray], log: bool = False) -> None:
    """One box per method (median, quartiles, 1.5 IQR whiskers, no outlier marks: every image is
    drawn as a point over its box), method names under the boxes."""
    data = [np.asarray(values[m], dtype=float) for m in methods]
    data = [d[np.isfinite(d)] for d in data]
    positions = np.arange(len(methods), dtype=float)
    kept = [i for i, d in enumerate(data) if len(d)]
    if kept:
        parts = ax.boxplot([data[i] for i in kept], positions=positions[kept], widths=0.55, showfliers=False,
                           patch_artist=True, medianprops={"color": "black", "linewidth": 1.0})
        for i, box in zip(kept, parts["boxes"]):
            box.set_facecolor(style.color(methods[i]))
            box.set_alpha(0.35)
    for i, m in enumerate(methods):
        strip(ax, positions[i], data[i], style.color(m), seed=i)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(positions, methods, rotation=60, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(methods) - 0.4)


def threshold_line(ax: Axes, value: float, label: str | None = None) -> Line2D:
    """The check's threshold as a grey dashed line across ``ax``; returns it (for a legend entry)."""
    return ax.axhline(value, color="0.35", linestyle=(0, (4, 2)), linewidth=0.8, zorder=1, label=label)


REFERENCE_MARKERS = ("^", "v")  # the ceiling's and the floor's median, beside each method's box
FLOOR = "random"  # the control whose scores are the floor drawn on every panel: a map unrelated to the model's


def floor_of(part: pd.DataFrame, metric: str, by: str | None = None) -> pd.Series | None:
    """The random-map control's median ``metric`` in ``part`` (per value of column ``by``, e.g. per stage), the
    floor a map unrelated to the model scores; None where the control was not run."""
    rows = part[part.method == FLOOR]
    if rows.empty or metric not in rows:
        return None
    return rows.groupby(by)[metric].median() if by else pd.Series([rows[metric].median()])


def floor_line(ax: Axes, x: np.ndarray | None, values: np.ndarray) -> None:
    """The floor across ``ax``: a dotted grey curve over ``x`` (a stage's), or a dotted line at ``values[0]``
    where ``x`` is None."""
    if x is None:
        ax.axhline(float(values[0]), color="0.55", linestyle=":", linewidth=0.9, zorder=1)
    else:
        ax.plot(x, values, color="0.55", linestyle=":", linewidth=0.9, zorder=1)


def score_boxes(part: Any, metric: str, threshold: float, ylabel: str,
                references: dict[str, str] | None = None) -> MplFigure:
    """Per-image ``metric`` of one model's table ``part``: a box and every image's point per method, one panel per
    family, on [0, 1] with the dashed ``threshold`` and, where the random-map control ran, its median dotted in
    every panel (:func:`floor_of`); ``references`` ({legend label: column}, at most two): each column's median per
    method as a black marker beside the box (up, then down triangles)."""
    fig, axes, groups = family_panels(list(part.method), sharex=False, panel_height=1.6)
    references = {label: c for label, c in (references or {}).items() if c in part and part[c].notna().any()}
    floor = floor_of(part, metric)
    for ax, methods in zip(axes[0], groups.values()):
        method_boxes(ax, methods, {m: part[part.method == m][metric].to_numpy() for m in methods})
        threshold_line(ax, threshold)
        if floor is not None:
            floor_line(ax, None, floor.to_numpy())
        for (label, column), marker in zip(references.items(), REFERENCE_MARKERS):
            medians = [float(np.nanmedian(part[part.method == m][column])) for m in methods]
            ax.plot(np.arange(len(methods)) + 0.36, medians, linestyle="none", marker=marker, color="black",
                    markersize=3.5, label=label, zorder=4)
    if references:  # the controls' panel, last, has room between its 0 and its 1
        handles, labels = axes[0, 0].get_legend_handles_labels()
        axes[0, -1].legend(handles, labels, loc="center", fontsize="x-small", frameon=False)
    axes[0, 0].set_ylim(-0.05, 1.05)
    axes[0, 0].set_ylabel(ylabel)
    return fig
