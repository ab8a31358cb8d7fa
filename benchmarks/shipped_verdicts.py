"""The verdict matrix of the shipped models: the demo's methods and checks on the shipped CNN and VGG, each trained
with SGD and with Bort, read on the embedded Fashion-MNIST sample (the demo's images and looks; the twins and
controls the catalog ships for each).

Writes ``shipped_verdicts.png`` (the matrix as the report draws it) beside the Markdown when given a folder, and
where pdflatex and poppler are installed the report's first two printed pages as ``shipped_report-1.png`` and
``-2.png``; the Markdown holds the summary line, the PDF's page count and where its appendix starts, the matrix as a
table with its legend, and one sentence per rejected method.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from audit.atomic import atomic_write_bytes
from audit.cli import DEMO
from audit.run import load_config, run_audit
from audit.sections import Table
from reports import build_report
from reports.answer import LEGEND, matrix_table, rejected_sentences, undecided
from reports.figures import render, verdict_matrix
from reports.markdown import table_markdown
from reports.pdf import appendix_page, printed_pages
from reports.verdict import summary_line, verdict_table

MODELS = ["cnn-sgd", "cnn-bort", "vgg-sgd", "vgg-bort"]
FIGURE = "shipped_verdicts"


def run(out: Path | None = None) -> str:
    printed = ""
    with tempfile.TemporaryDirectory() as scratch:
        result = run_audit(load_config(**(DEMO | {"models": MODELS})), Path(scratch) / "audit", progress=False,
                           log=lambda text: None)
        verdict = verdict_table(result.tables, result.config)
        if all(shutil.which(tool) for tool in ("pdflatex", "bibtex", "pdftoppm", "pdftotext")):
            pdf = build_report(result.out, pdf=True).with_name("report.pdf")
            pages = printed_pages(pdf)
            printed = (f" The report's PDF: {len(pages)} pages, the appendix from page {appendix_page(pages)}"
                       + ("; its first two pages below." if out is not None else "."))
            if out is not None:
                subprocess.run(["pdftoppm", "-r", "60", "-png", "-f", "1", "-l", "2", str(pdf),
                                f"{scratch}/page"], check=True)
                for k, image in enumerate(sorted(Path(scratch).glob("page-*.png")), 1):  # page-01 or page-1
                    shutil.copyfile(image, out / f"shipped_report-{k}.png")
    if out is not None:
        atomic_write_bytes(out / f"{FIGURE}.png", render(verdict_matrix(verdict))[1])  # the docs show the PNG
    return (f"{summary_line(verdict)}; {', '.join(MODELS)}, {len(result.config.methods)} methods, the checks "
            f"{', '.join(result.config.tests)}, {result.config.n_images} to {result.config.max_images} images."
            + printed + "\n\n" + table_markdown(Table(matrix_table(verdict), "", "matrix"))
            + f"\n\nThe cells' {LEGEND}.\n\n" + " ".join(rejected_sentences(verdict)) + " " + undecided(verdict))
