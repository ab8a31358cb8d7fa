"""tables.tex: the verdict, Bort comparison and model tables as booktabs tabulars."""
from __future__ import annotations

import pandas as pd

_ESCAPE = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
           "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}"}


def escape(text) -> str:
    return "".join(_ESCAPE.get(ch, ch) for ch in str(text))


def tabular(df: pd.DataFrame, caption: str, label: str) -> str:
    """A table environment with a booktabs tabular (needs \\usepackage{booktabs})."""
    cols = "l" * len(df.columns)
    lines = [r"\begin{table}[ht]", r"\centering", r"\small", rf"\caption{{{escape(caption)}}}",
             rf"\label{{{label}}}", rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
             " & ".join(escape(c) for c in df.columns) + r" \\", r"\midrule"]
    for row in df.itertuples(index=False):
        lines.append(" & ".join(escape(_fmt(v)) for v in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return "" if v != v else f"{v:.3g}"
    return str(v)
