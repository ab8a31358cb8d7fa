"""The report in LaTeX: ``tables.tex`` (booktabs), ``figures.tex`` (figure environments) and
``standalone.tex``, which inputs them with ``methods.tex`` and compiles to ``report.pdf``.

``tables.tex`` and ``figures.tex`` are meant to be ``\\input`` into a paper: every table and
figure has a caption and a label (``tab:<label>``, ``fig:<name>``); figures as wide as a page
are ``figure*`` so that they span both columns of a two-column paper.
"""
from __future__ import annotations

import re
import textwrap

from audit import style
from audit.sections import Figure, Section, Table
from reports.tables import rows

_ESCAPE = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
           "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
           "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
           # characters pdflatex's default input encoding does not know
           "\u2264": r"$\leq$", "\u2265": r"$\geq$", "\u00d7": r"$\times$", "\u03c3": r"$\sigma$",
           "\u2013": "--", "\u2014": "---", "\u2212": "-", "\u2717": r"$\times$", "\u00b1": r"$\pm$",
           "\u2026": r"\ldots{}", "\u2192": r"$\rightarrow$"}

LONG = 40  # rows from which a table breaks across pages (longtable) instead of floating
FITS = 100  # characters a row of natural-width (l) columns holds at the floating tables' small size
# A wider table is set on landscape pages as a longtable at script size (it may run over several) with its text
# wrapped in p columns, rather than shrunk below print size or run off the page: columns whose cells are at most SHORT
# characters keep their natural width (CHAR_PT a character at script size, a safe over-estimate), the others share
# the rest of the line in proportion to their longest cell, capped at CAP characters
SHORT, CAP, CHAR_PT, SEP_PT = 24, 48, 3.6, 3
APPENDIX_HEIGHT = 0.5  # of the text height: an appendix figure's largest
PORTRAIT = 6  # a wide table of more columns than this turns to landscape (the verdict table: one per check)


def escape(text: object) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_ESCAPE.get(ch, ch) for ch in str(text))


def widths(header: list[str], body: list[list[str]]) -> list[int]:
    """Each column's width in characters: its longest cell, or its heading's longest word (a heading wraps)."""
    return [max([len(cell) for cell in column[1:]] + [max(map(len, column[0].split()), default=0)])
            for column in zip(header, *body)]


def column_spec(longest: list[int]) -> str:
    """The columns of a table too wide for its line, from their :func:`widths`: ``l`` for the short ones,
    ragged-right ``p`` columns sharing the rest of the line for the others (see :data:`SHORT`)."""
    fixed = sum(n * CHAR_PT + 2 * SEP_PT for n in longest if n <= SHORT)
    weights = [min(n, CAP) for n in longest if n > SHORT]
    total = sum(weights)
    spec, k = [], 0
    for n in longest:
        if n <= SHORT:
            spec.append("l")
            continue
        spec.append(rf">{{\raggedright\arraybackslash}}p{{\dimexpr(\linewidth-{fixed:.0f}pt)*{weights[k]}/{total}"
                    rf"-2\tabcolsep\relax}}")
        k += 1
    return "".join(spec)


def _stacked(heading: str, width: int) -> str:
    """A column heading broken into lines no wider than the column's cells (``l`` columns do not wrap)."""
    lines = textwrap.wrap(heading, max(width, 8)) or [""]
    if len(lines) == 1:
        return escape(heading)
    return r"\begin{tabular}[b]{@{}l@{}}" + r" \\ ".join(escape(line) for line in lines) + r"\end{tabular}"


def tabular(table: Table, turn: bool = True) -> str:
    """A booktabs table: a floating ``table`` when it fits its line in :data:`FITS` characters and has fewer than
    :data:`LONG` rows, else a ``longtable`` at script size that breaks across pages, its long cells wrapped
    (:func:`column_spec`) where it is wider than :data:`FITS`, on landscape pages where it also has more than
    :data:`PORTRAIT` columns and ``turn`` (the report's main part stays portrait: its wide tables wrap)."""
    header, body = rows(table.frame)
    longest = widths(header, body)
    head = " & ".join(_stacked(c, w) for c, w in zip(header, longest)) + r" \\"
    lines = [" & ".join(escape(v) for v in row) + r" \\" for row in body]
    caption = rf"\caption{{{escape(table.caption)}}}\label{{tab:{table.label}}}"
    wide = sum(longest) > FITS
    if wide or len(body) >= LONG:
        spec = column_spec(longest) if wide else "l" * len(header)
        longtable = [rf"{{\scriptsize\setlength{{\tabcolsep}}{{{SEP_PT}pt}}", rf"\begin{{longtable}}{{{spec}}}",
                     caption + r" \\", r"\toprule", head, r"\midrule", r"\endfirsthead", r"\toprule", head,
                     r"\midrule", r"\endhead", r"\bottomrule", r"\endlastfoot", *lines, r"\end{longtable}}"]
        turned = turn and wide and len(header) > PORTRAIT
        return "\n".join([r"\begin{landscape}", *longtable, r"\end{landscape}", ""] if turned else [*longtable, ""])
    return "\n".join([r"\begin{table}[htbp]", r"\centering", r"\small", caption,
                      rf"\begin{{tabular}}{{{'l' * len(header)}}}", r"\toprule", head,
                      r"\midrule", *lines, r"\bottomrule", r"\end{tabular}", r"\end{table}", ""])


def figure(fig: Figure, directory: str = "figures", height: float = 0.85) -> str:
    """A figure environment including ``<directory>/<name>.pdf`` at most the line width and ``height`` of the text
    height, with the figure's caption and the label ``fig:<name>``."""
    width, _ = fig.figure.get_size_inches()
    wide = width > style.ONE_COLUMN + 0.1
    env = "figure*" if wide else "figure"
    size = r"width=\linewidth" if wide else rf"width={width:.2f}in"
    return "\n".join([rf"\begin{{{env}}}[htbp]", r"\centering",
                      rf"\includegraphics[{size},height={height:g}\textheight,keepaspectratio]"
                      rf"{{{directory}/{fig.name}.pdf}}",
                      rf"\caption{{{escape(fig.caption)}}}\label{{fig:{fig.name}}}", rf"\end{{{env}}}", ""])


def render(sections: list[Section]) -> str:
    """``tables.tex``: every table of the report."""
    return ("% requires \\usepackage{array,booktabs,longtable,graphicx,pdflscape}\n"
            + "\n".join(tabular(t) for s in sections for t in s.tables))


def render_figures(sections: list[Section]) -> str:
    """``figures.tex``: every figure of the report."""
    return ("% requires \\usepackage{graphicx}; the PDFs are in figures/\n"
            + "\n".join(figure(f) for s in sections for f in s.figures))


def part(sections: list[Section], appendix: bool) -> str:
    """``main.tex`` (``appendix`` False) or ``appendix.tex``: each section of that part in order, its heading, its
    text (the main part's), its printed figures and tables (portrait in the main part); a section with nothing
    printed has no heading. What is not printed is named in one paragraph at the part's start (the HTML and
    Markdown reports hold it, ``tables.tex`` every table and ``figures/`` every figure)."""
    out, unprinted = [], []
    for s in (s for s in sections if s.appendix == appendix):
        figures = [f for f in s.figures if f.printed]
        tables = [t for t in s.tables if t.printed]
        left = [re.split(r"[:;]", t.caption)[0].rstrip(".") for t in s.tables if not t.printed]
        if len(figures) < len(s.figures):
            left.append(f"{len(s.figures) - len(figures)} {'more ' if figures else ''}figures of "
                        f"{s.title.lower()} ({next(f.name for f in s.figures if not f.printed)} and the like)")
        unprinted += left
        if not (figures or tables or (s.text and not appendix)):
            continue
        out.append(rf"\subsection*{{{escape(s.title)}}}")
        if s.text and not appendix:
            out.append(escape(s.text) + "\n")
        # an appendix figure leaves room for another on its page: a gallery's grid beside a check's curves
        out += [figure(f, height=APPENDIX_HEIGHT if appendix else 0.85) for f in figures]
        out += [tabular(t, turn=appendix) for t in tables]
    note = [escape("Not printed here, in the HTML and Markdown reports (every table also in tables.tex, every "
                   "figure in figures/): " + "; ".join(unprinted) + ".") + "\n"] if unprinted else []
    return "\n".join(note + out) + "\n"


def standalone(title: str) -> str:
    """``standalone.tex``: the main part (the answer, the compact tables, the papers' comparison, the methods in
    brief), then the appendix (each check's cells in full, each check's sections, the models), with the works the
    methods text cites; the methods in full stay in ``methods.tex``, for a paper to input."""
    return "\n".join([
        r"\documentclass[10pt]{article}",
        r"\usepackage[T1]{fontenc}",
        r"\usepackage[margin=0.75in]{geometry}",
        r"\usepackage{array,booktabs,longtable,graphicx,pdflscape}",
        r"\usepackage[round]{natbib}",
        r"\setcounter{topnumber}{4}\setcounter{totalnumber}{6}",
        r"\renewcommand{\topfraction}{0.95}\renewcommand{\textfraction}{0.05}\renewcommand{\floatpagefraction}{0.8}",
        rf"\title{{{escape(title)}}}", r"\date{}", r"\begin{document}", r"\maketitle",
        r"\input{main.tex}",
        r"\clearpage", r"\appendix", r"\section*{Appendix}", r"\input{appendix.tex}",
        r"\nocite{*}", r"\renewcommand{\bibfont}{\footnotesize}\setlength{\bibsep}{1pt}",
        r"\bibliographystyle{plainnat}", r"\bibliography{references}", r"\end{document}", ""])
