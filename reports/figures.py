"""Saving the report's figures (PNG and PDF), and the figure of the baseline-vs-Bort comparison."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from audit.atomic import atomic_write, atomic_write_bytes
from audit.sections import Figure, new_figure

PNG_DPI = 110


def save(figure: Figure, directory: Path) -> bytes:
    """Write ``figures/<name>.pdf`` and ``.png``; returns the PNG bytes for embedding."""
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / f"{figure.name}.pdf", lambda f: figure.figure.savefig(f, format="pdf", bbox_inches="tight"))
    buffer = io.BytesIO()
    figure.figure.savefig(buffer, format="png", dpi=PNG_DPI, bbox_inches="tight")
    atomic_write_bytes(directory / f"{figure.name}.png", buffer.getvalue())
    return buffer.getvalue()


def bort_figure(comparison: pd.DataFrame) -> Figure | None:
    """Median scores of the first baseline / Bort pair per method, side by side."""
    if comparison.empty:
        return None
    part = comparison[comparison.test == "random-logit"]
    if part.empty:
        part = comparison
    pair = part[["baseline", "bort"]].drop_duplicates().iloc[0]
    part = part[(part.baseline == pair.baseline) & (part.bort == pair.bort)]
    y = np.arange(len(part))
    fig, ax = new_figure(6, 0.25 * len(part) + 1.2)
    ax.barh(y - 0.2, part.baseline_ssim, height=0.4, label=pair.baseline)
    ax.barh(y + 0.2, part.bort_ssim, height=0.4, label=pair.bort)
    ax.set_yticks(y, part.method, fontsize=7)
    ax.set_xlabel(f"median SSIM ({part.test.iloc[0]})")
    ax.legend(fontsize=7)
    return Figure(f"bort_vs_{pair.baseline}", fig, "bort vs baseline")
