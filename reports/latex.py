"""The report in LaTeX: ``tables.tex`` (booktabs), ``figures.tex`` (figure environments) and
``standalone.tex``, which inputs them with ``methods.tex`` and compiles to ``report.pdf``.

``tables.tex`` and ``figures.tex`` are meant to be ``\\input`` into a paper: every table and
figure has a caption and a label (``tab:<label>``, ``fig:<name>``); figures as wide as a page
are ``figure*`` so that they span both columns of a two-column paper.
"""
from __future__ import annotations

from audit import style
from audit.sections import Figure, Section, Table
from reports.tables import rows

_ESCAPE = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
           "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
           "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
           # characters pdflatex's default input encoding does not know
           "\u2264": r"$\leq$", "\u2265": r"$\geq$", "\u00d7": r"$\times$", "\u03c3": r"$\sigma$",
           "\u2013": "--", "\u2014": "---", "\u2212": "-", "\u2717": "rejected", "\u00b1": r"$\pm$"}

LONG = 40  # rows from which a table breaks across pages (longtable) instead of floating


def escape(text: object) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_ESCAPE.get(ch, ch) for ch in str(text))


def tabular(table: Table) -> str:
    """A booktabs table: a floating ``table`` shrunk to the line width when wider, or a
    ``longtable`` (no shrinking; breaks across pages) from :data:`LONG` rows."""
    header, body = rows(table.frame)
    head = " & ".join(escape(c) for c in header) + r" \\"
    lines = [" & ".join(escape(v) for v in row) + r" \\" for row in body]
    caption = rf"\caption{{{escape(table.caption)}}}\label{{tab:{table.label}}}"
    if len(body) >= LONG:
        return "\n".join([r"{\scriptsize\setlength{\tabcolsep}{3pt}", rf"\begin{{longtable}}{{{'l' * len(header)}}}",
                          caption + r" \\", r"\toprule", head, r"\midrule", r"\endfirsthead", r"\toprule", head,
                          r"\midrule", r"\endhead", r"\bottomrule", r"\endlastfoot", *lines,
                          r"\end{longtable}}", ""])
    return "\n".join([r"\begin{table}[tbp]", r"\centering", r"\small", caption,
                      r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
                      rf"\begin{{tabular}}{{{'l' * len(header)}}}", r"\toprule", head, r"\midrule", *lines,
                      r"\bottomrule", r"\end{tabular}}", r"\end{table}", ""])


def figure(fig: Figure, directory: str = "figures") -> str:
    """A figure environment including ``<directory>/<name>.pdf`` at most the line width and 85 %
    of the text height, with the figure's caption and the label ``fig:<name>``."""
    width, _ = fig.figure.get_size_inches()
    wide = width > style.ONE_COLUMN + 0.1
    env = "figure*" if wide else "figure"
    size = r"width=\linewidth" if wide else rf"width={width:.2f}in"
    return "\n".join([rf"\begin{{{env}}}[tbp]", r"\centering",
                      rf"\includegraphics[{size},height=0.85\textheight,keepaspectratio]{{{directory}/{fig.name}.pdf}}",
                      rf"\caption{{{escape(fig.caption)}}}\label{{fig:{fig.name}}}", rf"\end{{{env}}}", ""])


def render(sections: list[Section]) -> str:
    """``tables.tex``: every table of the report."""
    return ("% requires \\usepackage{booktabs,longtable,graphicx}\n"
            + "\n".join(tabular(t) for s in sections for t in s.tables))


def render_figures(sections: list[Section]) -> str:
    """``figures.tex``: every figure of the report."""
    return ("% requires \\usepackage{graphicx}; the PDFs are in figures/\n"
            + "\n".join(figure(f) for s in sections for f in s.figures))


def standalone(title: str) -> str:
    """``standalone.tex``: the methods text, the tables and the figures, with the bibliography."""
    return "\n".join([
        r"\documentclass[10pt]{article}",
        r"\usepackage[T1]{fontenc}",
        r"\usepackage[margin=0.9in]{geometry}",
        r"\usepackage{booktabs,longtable,graphicx}",
        r"\usepackage[round]{natbib}",
        r"\setcounter{topnumber}{4}\setcounter{totalnumber}{6}",
        r"\renewcommand{\topfraction}{0.95}\renewcommand{\textfraction}{0.05}\renewcommand{\floatpagefraction}{0.8}",
        rf"\title{{{escape(title)}}}", r"\date{}", r"\begin{document}", r"\maketitle",
        r"\section*{Methods}", r"\input{methods.tex}",
        # \suppressfloats: no float above its section's heading on that page
        r"\clearpage", r"\section*{Tables}\suppressfloats[t]", r"\input{tables.tex}", r"\clearpage",
        r"\section*{Figures}\suppressfloats[t]", r"\input{figures.tex}", r"\clearpage",
        r"\bibliographystyle{plainnat}", r"\bibliography{references}", r"\end{document}", ""])
