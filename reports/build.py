"""Build the report of a finished run: index.html, report.md, tables.tex and figures/."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from reports import figures
from reports.html import image_html, page, table_html
from reports.latex import tabular
from reports.verdict import bort_comparison, verdict_table

VERDICT_COLUMNS = ["model", "method", "collapsed", "collapse_layer", "random_logit", "full_randomization", "verdict"]


def _examples(run: Path, model: str, test: str, methods: list[str]) -> dict[str, np.ndarray]:
    out = {}
    for m in methods:
        path = run / "units" / model / test / f"{m}.npz"
        if path.exists():
            with np.load(path) as npz:
                out[m] = npz["maps"]
    return out


def build_report(run: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of the run in ``run`` to ``out`` (default: the same folder); returns index.html."""
    from audit.runner import load_results

    result = load_results(run)
    run = Path(run)
    out = Path(out) if out else run
    figdir = out / "figures"
    tables, config = result.tables, result.config
    manifest = json.loads((run / "manifest.json").read_text())
    verdict = verdict_table(tables, config)
    comparison = bort_comparison(tables)
    models = tables["models"]
    thresholds = (f"Thresholds: a chain is collapsed when the median |cos| reaches {config.csc_threshold} at some "
                  f"layer (random vectors injected at the logits); a method is class-insensitive when its "
                  f"random-logit SSIM median is >= {config.random_logit_pass}, and weight-insensitive when the "
                  f"SSIM after randomizing every layer is >= {config.randomization_pass}. Intervals: 99 % "
                  f"bootstrap of the median (10,000 resamples).")
    sections = [("Verdict", f"<p>{thresholds}</p>" + table_html(verdict[VERDICT_COLUMNS] if not verdict.empty
                                                                else verdict))]
    md = ["# Attribution audit", "", "## Verdict", "", thresholds, "", _markdown(verdict[VERDICT_COLUMNS])
          if not verdict.empty else "(no rows)", ""]
    csc = tables.get("csc")
    if csc is not None and not csc.empty:
        imgs = [image_html(figures.csc_figure(csc, m, figdir), f"CSC {m}") for m in csc.model.unique()]
        sections.append(("Cosine-similarity convergence", "<p>1 - median |cos| between backward signals of "
                         "independent random vectors injected at the logits (log axis); the dashed line is the "
                         "exact random-vector baseline.</p>" + "".join(imgs)))
        md += ["## Cosine-similarity convergence", ""] + [f"![CSC {m}](figures/csc_{m}.png)" for m in csc.model.unique()]
    logit = tables.get("random-logit")
    if logit is not None and not logit.empty:
        imgs = [image_html(figures.random_logit_figure(logit, m, figdir), f"random logit {m}")
                for m in logit.model.unique()]
        sections.append(("Random-logit test", "".join(imgs)))
        md += ["", "## Random-logit test", ""] + [f"![random logit {m}](figures/random_logit_{m}.png)"
                                                  for m in logit.model.unique()]
    for order in ("cascading", "independent", "bottom-up"):
        frame = tables.get(order)
        if frame is None or frame.empty:
            continue
        imgs = [image_html(figures.randomization_figure(frame, m, order, figdir), f"{order} {m}")
                for m in frame.model.unique()]
        grids = []
        for m in frame.model.unique():
            maps = _examples(run, m, order, list(frame.method.unique()))
            if maps:
                stages = list(frame[frame.model == m].drop_duplicates("stage").sort_values("stage").layer)
                n = next(iter(maps.values())).shape[1]
                grids += [image_html(figures.heatmap_grid(maps, stages, m, i, figdir), f"heatmaps {m} {i}")
                          for i in range(n)]
        sections.append((f"Parameter randomization ({order})", "".join(imgs)))
        if grids:
            sections.append((f"Heatmaps under {order} randomization", "".join(grids)))
        md += ["", f"## Parameter randomization ({order})", ""] + [
            f"![{order} {m}](figures/randomization_{order}_{m}.png)" for m in frame.model.unique()]
    if not comparison.empty:
        fig = figures.bort_figure(comparison, figdir)
        sections.append(("Bort vs baseline", "<p>Median SSIM per method for each baseline and its Bort twin, "
                         "with a paired Wilcoxon signed-rank test on the per-image scores (scipy).</p>"
                         + (image_html(fig, "bort vs baseline") if fig else "") + table_html(comparison)))
        md += ["", "## Bort vs baseline", "", _markdown(comparison)]
    sections.append(("Models", table_html(models)))
    md += ["", "## Models", "", _markdown(models)]
    config_text = json.dumps({k: manifest[k] for k in ("config", "seeds", "versions") if k in manifest}, indent=2)
    sections.append(("Configuration and versions", f"<pre>{_escape(config_text)}</pre>"))
    md += ["", "## Configuration and versions", "", "```json", config_text, "```", ""]
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(page("Attribution audit", sections))
    (out / "report.md").write_text("\n".join(md))
    tex = [tabular(verdict[VERDICT_COLUMNS], "Verdict per model and method.", "tab:verdict")
           if not verdict.empty else ""]
    if not comparison.empty:
        tex.append(tabular(comparison, "Bort vs baseline: paired Wilcoxon tests on per-image SSIM.", "tab:bort"))
    tex.append(tabular(models, "Models: accuracy and orthogonality error.", "tab:models"))
    (out / "tables.tex").write_text("% requires \\usepackage{booktabs}\n" + "\n".join(tex))
    return out / "index.html"


def _escape(text: str) -> str:
    import html
    return html.escape(text)


def _markdown(df: pd.DataFrame) -> str:
    if df.empty:
        return "(no rows)"
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines)
