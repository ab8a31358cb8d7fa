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


# a reader's name for the columns whose data name says too little; any other column is shown with spaces for
# underscores (the CSV files keep the data names)
HEADINGS = {"collapse_layer": "CSC", "random_logit": "random logit", "control_check": "control's check",
            "cascading_spearman_abs": "cascading (Spearman of |map|)",
            "data_randomization_spearman_abs": "data randomization (Spearman of |map|)",
            "csc_max_median": "CSC: largest median |cos|", "random_logit_ssim": "random logit: median SSIM",
            "cascading_ssim": "cascading: median SSIM at the top stage", "arch": "architecture",
            "audit_accuracy": "accuracy on the audited images", "orth_error_max": "orthogonality error (max)",
            "orth_error_mean": "orthogonality error (mean)", "wilcoxon_p": "Wilcoxon p",
            "holm_p": "Holm-adjusted p (over the methods)", "n": "images", "units": "independent units (seeds)",
            "images_dropped": "images read by one model only",
            "median_difference": "median difference (Bort - baseline)", "better": "better values",
            "deeplift_completeness_gap": "DeepLIFT: completeness gap",
            "deeplift-revealcancel_completeness_gap": "RevealCancel: completeness gap"}


def heading(column: object) -> str:
    """The name a reader sees for ``column``."""
    return HEADINGS.get(str(column), str(column).replace("_", " "))


def rows(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """(header, body) of ``df`` as text cells, the header in the reader's names (:func:`heading`)."""
    return [heading(c) for c in df.columns], [[cell_text(v) for v in row] for row in df.itertuples(index=False)]
