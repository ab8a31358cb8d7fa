"""tables.tex: every table of the report as a booktabs tabular."""
from __future__ import annotations

from audit.sections import Section, Table
from reports.tables import rows

_ESCAPE = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
           "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}"}


def escape(text: object) -> str:
    return "".join(_ESCAPE.get(ch, ch) for ch in str(text))


def tabular(table: Table) -> str:
    """A table environment with a booktabs tabular (needs \\usepackage{booktabs})."""
    header, body = rows(table.frame)
    lines = [r"\begin{table}[ht]", r"\centering", r"\small", rf"\caption{{{escape(table.caption)}}}",
             rf"\label{{tab:{table.label}}}", rf"\begin{{tabular}}{{{'l' * len(header)}}}", r"\toprule",
             " & ".join(escape(c) for c in header) + r" \\", r"\midrule"]
    lines += [" & ".join(escape(v) for v in row) + r" \\" for row in body]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def render(sections: list[Section]) -> str:
    return "% requires \\usepackage{booktabs}\n" + "\n".join(tabular(t) for s in sections for t in s.tables)
