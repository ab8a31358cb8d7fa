"""Build the report of a finished run: index.html, report.md, tables.tex and figures/.

The report is a list of sections (:mod:`audit.sections`): the verdict, then each check's own
sections in registry order, the baseline-vs-Bort comparison, the models and the configuration;
each renderer turns the same list into its format.
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from audit.atomic import atomic_write_bytes
from audit.checks import CHECKS
from audit.run.results import example_maps, load_results
from audit.sections import ReportContext, Section, Table
from reports import html, latex, markdown
from reports.figures import bort_figure, save
from reports.verdict import bort_comparison, display_columns, verdict_table

TITLE = "Attribution audit"


def report_sections(run: str | Path) -> list[Section]:
    """Every section of the report of the run in ``run``."""
    result = load_results(run)
    run = Path(run)
    tables, config = result.tables, result.config
    manifest = json.loads((run / "manifest.json").read_text())
    verdict = verdict_table(tables, config)
    thresholds = ("Thresholds: " + "; ".join(
        f"{c.verdict.failure} when {c.verdict.score_column} {c.verdict.comparison} {getattr(config, c.verdict.threshold)}"
        for c in CHECKS.values() if c.verdict is not None and c.name in tables)
        + ". CSC scores the chain injected at the logits; SSIM scores are medians over images with their 99 % "
          "bootstrap interval (10,000 resamples).")
    sections = [Section("Verdict", thresholds, tables=[Table(verdict[display_columns(verdict)],
                                                             "Verdict per model and method.", "verdict")])]
    context = ReportContext(config, run, partial(example_maps, run))
    for name, check in CHECKS.items():
        if name in tables:
            sections += check.sections(tables[name], context)
    comparison = bort_comparison(tables)
    if not comparison.empty:
        fig = bort_figure(comparison)
        sections.append(Section("Bort vs baseline", "Median SSIM per method for each baseline and its Bort twin, "
                                "with a paired Wilcoxon signed-rank test on the per-image scores (scipy).",
                                tables=[Table(comparison, "Bort vs baseline: paired Wilcoxon tests on per-image "
                                                          "SSIM.", "bort")],
                                figures=[fig] if fig else []))
    sections.append(Section("Models", tables=[Table(tables["models"], "Models: accuracy and orthogonality error.",
                                                    "models")]))
    config_text = json.dumps({k: manifest[k] for k in ("config", "seeds", "versions") if k in manifest}, indent=2)
    sections.append(Section("Configuration and versions", code=config_text))
    return sections


def build_report(run: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of the run in ``run`` to ``out`` (default: the same folder); returns index.html."""
    out = Path(out) if out else Path(run)
    sections = report_sections(run)
    pngs = {f.name: save(f, out / "figures") for s in sections for f in s.figures}
    atomic_write_bytes(out / "index.html", html.render(TITLE, sections, pngs).encode())
    atomic_write_bytes(out / "report.md", markdown.render(TITLE, sections).encode())
    atomic_write_bytes(out / "tables.tex", latex.render(sections).encode())
    return out / "index.html"
