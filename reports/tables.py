"""The one table formatter: every renderer (HTML, Markdown, LaTeX) shows a cell the same way."""
from __future__ import annotations

import pandas as pd


def cell_text(value: object) -> str:
    """Floats to 4 significant digits, NaN and None to an empty cell, everything else as str."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if value != value else f"{value:.4g}"
    return str(value)


def rows(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """(header, body) of ``df`` as text cells."""
    return [str(c) for c in df.columns], [[cell_text(v) for v in row] for row in df.itertuples(index=False)]
