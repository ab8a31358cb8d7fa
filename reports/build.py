"""Build the report of a finished run: index.html, report.md, the methods text (methods.md,
methods.tex, references.bib), the LaTeX sources (tables.tex, figures.tex for a paper; main.tex,
appendix.tex and standalone.tex for the report; with ``pdf=True`` also report.pdf) and figures/
(PDF and PNG).

The report is a list of sections (:mod:`audit.sections`): the answer (the verdict matrix, one
sentence per rejected method, the undecided cells, how to read the checks), the compact verdict
table, the papers' comparison and the baseline-vs-Bort comparison; then the appendix: the verdict
in full (with one score across models when the audit has more than two), each check's own sections
in registry order, the models and the configuration. Each renderer turns the same list into its
format.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from audit import style
from audit.atomic import atomic_write_bytes, remove_partials
from audit.checks import CHECKS
from audit.errors import ConfigError
from audit.run.config import AuditConfig
from audit.run.hygiene import fonts_released
from audit.run.results import AuditResult, example_maps, load_results
from audit.sections import Figure, ReportContext, Section, Table
from reports import html, latex, markdown, methods_text
from reports.answer import compact_table, how_to_read, rejected_sentences, undecided
from reports.appendix import verdict_section
from reports.figures import Renderer, bort_figure, score_figure, verdict_matrix
from reports.references import bibtex
from reports.reproduction import reproduction_sections
from reports.verdict import (
    bort_comparison,
    dependent_pairs,
    family_bound,
    score_columns,
    summary_line,
    verdict_table,
)

TITLE = "Attribution audit"


def report_sections(run: str | Path, score: str | None = None) -> list[Section]:
    """Every section of the report of the run in ``run``; ``score``: the verdict's score column
    drawn across models (default: the first one with a value).

    Parameters
    ----------
    run : str or Path
        The folder of a finished run (:func:`audit.run.results.load_results`).
    score : str, optional
        A score column of the verdict table (e.g. ``random_logit_ssim``), drawn across models when the run
        has more than two; default: the first of :func:`reports.verdict.score_columns`.

    Returns
    -------
    list of Section
        In the report's order: the reproduction sections, the verdict, each check's sections, the Bort vs
        baseline comparison (when the run has such pairs), the models, the configuration and versions.

    Raises
    ------
    ConfigError
        When the run did not finish, or ``score`` is not a score column of this run.
    """
    return _sections(load_results(run), score)[0]


def _sections(result: AuditResult, score: str | None,
              drawn: Callable[[list[Figure]], None] | None = None) -> tuple[list[Section], pd.DataFrame]:
    """The report's sections and the verdict table they read; ``drawn(figures)`` is called with the figures of the
    sections built so far, in order, as they are drawn (a :class:`~reports.figures.Renderer` renders them meanwhile)."""
    with style.styled():
        return _build_sections(result, score, drawn or (lambda figures: None))


def _answer_sections(verdict: pd.DataFrame, tables: dict[str, Any], config: AuditConfig) -> list[Section]:
    """The report's first sections (:mod:`reports.answer`): the summary, the verdict matrix and how to read the
    checks; then why each method was rejected, the undecided cells and the error rate."""
    readings = sum(c.verdict.readings for c in CHECKS.values() if c.verdict is not None and c.name in tables)
    answer = Section("Answer", summary_line(verdict) + ". A sanity check can reject a method; it cannot certify one.",
                     figures=[verdict_matrix(verdict)] if not verdict.empty else [],
                     tables=[Table(how_to_read(verdict, config), "How to read the checks: each check's question, the "
                                   "measure its verdict reads and what rejects (each rule in full: the caption of its "
                                   "table in the appendix; the statistics: the methods text).", "how_to_read")])
    why = " ".join([*rejected_sentences(verdict), undecided(verdict),
                    f"The chance that a method no check should reject is rejected by one is at most "
                    f"{family_bound(readings):.1%} (Bonferroni over the {readings} rejecting intervals each method is "
                    "read on)." if readings else ""])
    return [answer, Section("Why", why)]


def _main_verdict_section(verdict: pd.DataFrame) -> Section:
    """The compact verdict table: each cell at most about 40 characters."""
    dependent = len(dependent_pairs(verdict))
    return Section("Verdict", "Each check's cell: its outcome's mark, what it read (a stage, a reference model), the "
                   "median and its interval; the verdict and the mechanisms' letters as in the matrix. Every cell in "
                   "full (references, seeds, looks, images read, the other measures) and the scales the "
                   "randomization checks read on: the appendix and verdict.csv"
                   + (f"; there too the {dependent} pairs whose outcome depends on the measure." if dependent else "."),
                   tables=[Table(compact_table(verdict), "Verdict per model and method, compact.", "verdict_compact")])


def _bort_sections(tables: dict[str, Any]) -> list[Section]:
    """The Bort vs baseline sections (the compact table and the figure; the tests in full in the appendix), in a
    list; empty when the run has no baseline-Bort pair to compare."""
    comparison = bort_comparison(tables)
    if comparison.empty:
        return []
    fig = bort_figure(comparison)
    return [Section("Bort vs baseline", "Each check's per-image score per method, baseline against its Bort twin: "
                    "the two medians and the paired Wilcoxon test's p-value, Holm-adjusted over each check's methods "
                    "(the tests in full, with the images and units each read: the appendix).",
                    tables=[Table(bort_brief(comparison), "Bort vs baseline: each check's median score on the "
                                  "baseline, then on its Bort twin, and the Holm-adjusted p of the paired Wilcoxon "
                                  "test.", "bort_brief")],
                    figures=[fig] if fig else []),
            Section("Bort vs baseline in full", "The median of each check's per-image score (named in the "
                    "score column, with which values are the better ones) per method for each baseline "
                    "and its Bort twin, with a paired Wilcoxon signed-rank test on the per-image scores "
                    "(scipy) of the images both models read (a sequential run may read more of one: the rest are "
                    "counted as dropped); where images share a re-initialisation seed, each seed's mean "
                    "difference is one unit, since the seed's draw moves its images together; its p-value "
                    "adjusted by Holm's step-down procedure over the methods of each check: read the adjusted p "
                    "against a level, and the chance of a false difference among a check's methods stays at that "
                    "level.",
                    tables=[Table(comparison, "Bort vs baseline: paired Wilcoxon tests on each check's "
                                              "per-image scores.", "bort", printed=False)], appendix=True)]


def bort_brief(comparison: pd.DataFrame) -> pd.DataFrame:
    """:func:`~reports.verdict.bort_comparison` compact: one row per method, a column per baseline-Bort pair and
    check, each cell ``"baseline → Bort (p)"`` at two decimals ("n/a" where the test has no value)."""
    cells: dict[str, dict[str, str]] = {}
    for row in comparison.to_dict("records"):
        column = f"{row['baseline']} vs {row['bort']}: {row['test']} ({row['score']}, {row['better']} better)"
        values = (row["baseline_score"], row["bort_score"], row["holm_p"])
        cells.setdefault(str(row["method"]), {"method": str(row["method"])})[column] = (
            "n/a" if any(v != v for v in values) else f"{values[0]:.2f} \u2192 {values[1]:.2f} (p {values[2]:.2f})")
    return pd.DataFrame(list(cells.values())).fillna("n/a")


def _models_section(manifest: dict[str, Any], tables: dict[str, Any]) -> Section:
    """The models section: the run's warnings about the models, and the models table."""
    said = manifest.get("warnings", {})
    return Section("Models", "Warnings, each also in the run's log and manifest: " + " ".join(
        f"{spec}: {line}." for spec, lines in said.items() for line in lines) if said else "", appendix=True,
        tables=[Table(tables["models"], "Models: accuracy and orthogonality error; where DeepLIFT or RevealCancel "
                                        "is audited, the largest relative gap between a map's sum and f(x) - f(x0) on two "
                                        "audited images (their rules are exact: the gap is the model's own rounding).",
                                        "models")])


def _build_sections(result: AuditResult, score: str | None,
                    drawn: Callable[[list[Figure]], None]) -> tuple[list[Section], pd.DataFrame]:
    run = result.out
    tables, config = result.tables, result.config
    manifest = result.manifest
    verdict = verdict_table(tables, config)
    # the answer and the compact tables first; what is looked up (every cell in full, each check's own sections,
    # the models, the configuration) in the appendix
    brief = methods_text.author_year(methods_text.summary(manifest, tables["models"]))
    papers, bort = reproduction_sections(verdict, tables, config), _bort_sections(tables)
    sections = [*_answer_sections(verdict, tables, config), _main_verdict_section(verdict),
                *[s for s in papers + bort if not s.appendix],
                Section("Methods in brief", brief + " The methods in full: methods.md and methods.tex."),
                verdict_section(verdict, tables, config, _across_models(verdict, score)),
                *[s for s in papers + bort if s.appendix]]
    given = 0  # the sections whose figures drawn() has had

    def give() -> None:
        nonlocal given
        drawn([f for s in sections[given:] for f in s.figures])
        given = len(sections)

    give()
    context = ReportContext(config, run, partial(example_maps, run))
    for name, check in CHECKS.items():
        if name in tables:
            sections += [_appendix(s, printed=check.verdict is not None) for s in check.sections(
                tables[name], context, check.options_from(config.options, config.looks, config.family))]
            give()
    sections.append(_models_section(manifest, tables))
    config_text = json.dumps({k: manifest[k] for k in ("config", "seeds", "versions") if k in manifest}, indent=2)
    sections.append(Section("Configuration and versions", code=config_text, appendix=True))
    give()
    return sections, verdict


def _appendix(section: Section, printed: bool) -> Section:
    """A check's section in the appendix; where not ``printed`` (a check without a verdict), its figures and tables
    are left to the HTML and Markdown reports."""
    if printed:
        return dataclasses.replace(section, appendix=True)
    return dataclasses.replace(section, appendix=True, figures=[dataclasses.replace(f, printed=False)
                                                                for f in section.figures],
                               tables=[dataclasses.replace(t, printed=False) for t in section.tables])


def _across_models(verdict: Any, score: str | None) -> list[Any]:
    """One score across models, for an audit of more than two models (the verdict matrix opens the report)."""
    columns = score_columns(verdict)
    if score is not None and score not in columns:
        raise ConfigError(f"no verdict score {score!r} in this run; scores: {', '.join(columns) or 'none'}")
    if verdict.empty or verdict.model.nunique() <= 2:
        return []
    chosen = score or next(iter(columns), None)
    return [score_figure(verdict, chosen)] if chosen else []


def build_report(run: str | Path, out: str | Path | None = None, pdf: bool = False, score: str | None = None,
                 progress: bool = False) -> Path:
    """Write the report of the run in ``run`` to ``out`` (default: the same folder); returns index.html.

    Parameters
    ----------
    run : str or Path
        The folder of a finished run.
    out : str or Path, optional
        Where the report goes; default ``run``. Written there: ``index.html``, ``report.md``,
        ``methods.md``, ``methods.tex``, ``references.bib``, ``tables.tex``, ``figures.tex``,
        ``standalone.tex`` and ``figures/`` (figures of an earlier build that this one lacks are removed).
    pdf : bool, default False
        Also compile ``standalone.tex`` to ``report.pdf`` (needs pdflatex and bibtex).
    score : str, optional
        The verdict score drawn across models (see :func:`report_sections`).
    progress : bool, default False
        Print a line as each stage ends: the sections and their figures drawn, the files written, each
        LaTeX and BibTeX pass of the PDF.

    Returns
    -------
    Path
        ``out / "index.html"``.

    Raises
    ------
    ConfigError
        As :func:`report_sections`.
    """
    log = _stage_log() if progress else (lambda text: None)
    with fonts_released():
        return _build(Path(run), Path(out) if out else Path(run), pdf, score, log)


def _stage_log() -> Callable[[str], None]:
    """A printer of report stages, each with the seconds since the previous one."""
    last = [time.perf_counter()]

    def log(text: str) -> None:
        now = time.perf_counter()
        print(f"report: {text} ({now - last[0]:.1f} s)", flush=True)
        last[0] = now
    return log


def _build(run: Path, out: Path, pdf: bool, score: str | None, log: Callable[[str], None]) -> Path:
    result = load_results(run)
    renderer = Renderer()  # renders the figures drawn so far while the next sections are drawn
    try:
        sections, verdict = _sections(result, score, renderer.submit)
        log(f"{len(sections)} sections with {sum(len(s.figures) for s in sections)} figures drawn")
        remove_partials(out)  # an interrupted build's half-written files
        pngs = renderer.save(out / "figures")  # the figures of every section, in order: submitted as drawn
    finally:
        renderer.close()
    log(f"figures written to {out / 'figures'} (PDF and PNG)")
    for old in (out / "figures").glob("*.*") if pngs else ():  # figures of an earlier build that this one lacks
        if old.suffix in (".pdf", ".png") and old.stem not in pngs:
            old.unlink()
    text = methods_text.paragraphs(result.manifest, result.tables["models"])
    brief = methods_text.summary(result.manifest, result.tables["models"])  # also the report's "Methods in brief"
    files = {"index.html": html.render(TITLE, sections, pngs), "report.md": markdown.render(TITLE, sections),
             "methods.md": methods_text.markdown(text, brief), "methods.tex": methods_text.latex(text),
             "references.bib": bibtex(methods_text.cited([*text, ("", brief)])), "tables.tex": latex.render(sections),
             "figures.tex": latex.render_figures(sections), "main.tex": latex.part(sections, appendix=False),
             "appendix.tex": latex.part(sections, appendix=True), "standalone.tex": latex.standalone(TITLE)}
    files["verdict.csv"] = verdict.assign(mechanisms=verdict.get("mechanisms", pd.Series(dtype=object)).map(
        lambda found: json.dumps(found) if isinstance(found, dict) else "")).to_csv(index=False) \
        if not verdict.empty else verdict.to_csv(index=False)
    for name, content in files.items():
        atomic_write_bytes(out / name, content.encode())
    log(f"{', '.join(files)} written")
    if pdf:
        from reports.pdf import compile_pdf  # runs TeX: only when asked
        compile_pdf(out, log=log)
    return out / "index.html"
