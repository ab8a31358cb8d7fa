"""The report's figures (matplotlib, Agg): each saved as PNG and PDF; PNG bytes kept for embedding."""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from audit.summary import summarize  # noqa: E402


def _save(fig, directory: Path, name: str) -> bytes:
    directory.mkdir(parents=True, exist_ok=True)
    fig.savefig(directory / f"{name}.pdf", bbox_inches="tight")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    (directory / f"{name}.png").write_bytes(buffer.getvalue())
    plt.close(fig)
    return buffer.getvalue()


def csc_figure(csc: pd.DataFrame, model: str, directory: Path) -> bytes:
    """1 - median |cos| per recorded layer (log axis) for the logit injection, one line per method,
    with the random-vector baseline dashed; a collapsed chain drops toward 0."""
    part = csc[csc.model == model]
    part = part[part.inject_at == part.inject_at.iloc[0]]
    fig, ax = plt.subplots(figsize=(7, 4))
    for method, rows in part.groupby("method", sort=False):
        rows = rows.sort_values("depth")
        ax.plot(rows.depth, (1 - rows["median"]).clip(lower=1e-6), marker=".", label=method)
    base = part.drop_duplicates("depth").sort_values("depth")
    ax.plot(base.depth, 1 - base.baseline, "k--", label="random baseline")
    ax.set_yscale("log")
    ax.set_xlabel("layer depth (input = 0)")
    ax.set_ylabel("1 - median |cos|")
    ax.set_title(f"{model}: convergence of the backward chain from the logits")
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, directory, f"csc_{model}")


def random_logit_figure(logit: pd.DataFrame, model: str, directory: Path) -> bytes:
    part = logit[logit.model == model]
    methods = list(dict.fromkeys(part.method))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.boxplot([part[part.method == m].ssim for m in methods])
    ax.set_xticks(range(1, len(methods) + 1), methods, rotation=70, fontsize=7)
    ax.set_ylabel("SSIM, true vs random class")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{model}: random-logit test")
    return _save(fig, directory, f"random_logit_{model}")


def randomization_figure(frame: pd.DataFrame, model: str, order: str, directory: Path) -> bytes:
    """Median SSIM to the trained model's maps per stage, with the 99 % bootstrap band."""
    part = frame[frame.model == model]
    summary = summarize(part[["method", "stage", "layer", "image", "ssim"]], n_resamples=2000)
    fig, ax = plt.subplots(figsize=(7, 4))
    for method, rows in summary.groupby("method", sort=False):
        rows = rows.sort_values("stage")
        ax.plot(rows.stage, rows.ssim, marker=".", label=method)
        ax.fill_between(rows.stage, rows.ssim_low, rows.ssim_high, alpha=0.15)
    stages = summary.drop_duplicates("stage").sort_values("stage")
    ax.set_xticks(stages.stage, stages.layer, rotation=60, fontsize=7)
    ax.set_ylabel("SSIM to the trained model's map")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{model}: {order} parameter randomization")
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, directory, f"randomization_{order}_{model}")


def heatmap_grid(maps: dict[str, np.ndarray], stage_names: list[str], model: str, image: int,
                 directory: Path) -> bytes:
    """Adebayo-style grid: one row per method, one column per randomization stage."""
    methods = list(maps)
    n_stages = len(stage_names)
    fig, axes = plt.subplots(len(methods), n_stages, figsize=(1.1 * n_stages, 1.1 * len(methods)), squeeze=False)
    for r, m in enumerate(methods):
        for c in range(n_stages):
            ax = axes[r, c]
            heat = maps[m][c, image]
            scale = float(np.abs(heat).max()) or 1.0  # symmetric around 0: signed maps keep their sign
            ax.imshow(heat, cmap="coolwarm", vmin=-scale, vmax=scale)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(m, fontsize=6, rotation=0, ha="right", va="center")
            if r == 0:
                ax.set_title(stage_names[c], fontsize=6, rotation=60)
    fig.suptitle(f"{model}, image {image}: maps as layers are randomized from the top", fontsize=8, y=1.04)
    return _save(fig, directory, f"heatmaps_{model}_image{image}")


def bort_figure(comparison: pd.DataFrame, directory: Path) -> bytes | None:
    if comparison.empty:
        return None
    part = comparison[comparison.test == "random-logit"]
    if part.empty:
        part = comparison
    pair = part[["baseline", "bort"]].drop_duplicates().iloc[0]
    part = part[(part.baseline == pair.baseline) & (part.bort == pair.bort)]
    y = np.arange(len(part))
    fig, ax = plt.subplots(figsize=(6, 0.25 * len(part) + 1.2))
    ax.barh(y - 0.2, part.baseline_ssim, height=0.4, label=pair.baseline)
    ax.barh(y + 0.2, part.bort_ssim, height=0.4, label=pair.bort)
    ax.set_yticks(y, part.method, fontsize=7)
    ax.set_xlabel(f"median SSIM ({part.test.iloc[0]})")
    ax.legend(fontsize=7)
    return _save(fig, directory, f"bort_vs_{pair.baseline}")
