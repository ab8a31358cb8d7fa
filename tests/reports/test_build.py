"""The report of a finished run: files, sections, rebuild, LaTeX and browser rendering."""
import gc
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from audit import style
from audit.cli import main
from audit.run.config import load_config
from audit.run.runner import run_audit
from reports import build_report, report_sections
from reports.figures import VERDICT_COLOURS
from reports.pdf import appendix_page, printed_pages
from tests.helpers import legend_outside_axes, require_tool

TINY = dict(methods=["gradient", "lrp-zplus", "deeplift", "edge"], tests=["csc", "random-logit", "cascading"],
            n_images=4)


# the main part, read first, then the appendix, looked up (collapsed in the HTML)
SECTIONS = ["Answer", "Why", "Verdict", "The source papers, reproduced", "Bort vs baseline"]
APPENDIX = ["Verdict in full", "The source papers in full", "Bort vs baseline in full",
            "Cosine-similarity convergence", "Random-logit test",
            "Parameter randomization (cascading)", "Heatmaps under cascading randomization", "Models",
            "Configuration and versions"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "audit"
    result = run_audit(load_config(models=["cnn-sgd", "cnn-bort"], **TINY), out, progress=False, log=lambda s: None)
    return out, result


@pytest.fixture(scope="module")
def built(finished):
    """The finished run with its report built once (for the tests that only read it)."""
    out, result = finished
    return out, build_report(result.out)


def test_report_files_and_sections(built, finished):
    out, index = built
    _, result = finished
    html = index.read_text()
    where = [html.index(f"<h2>{heading}</h2>") for heading in SECTIONS]
    where += [html.index(f"<details><summary>{heading}</summary>") for heading in APPENDIX]
    assert where == sorted(where) and html.index("<h2>Appendix</h2>") == where[len(SECTIONS)] - len("<h2>Appendix</h2>")
    assert html.index("<figcaption>Verdict matrix:") < html.index("<h2>Verdict</h2>")  # the matrix opens the report
    assert not re.search(r"(src|href)=[\"'](https?:)?//", html) and "http://" not in html and "https://" not in html
    assert "<script" not in html
    for name in ("report.md", "tables.tex", "figures.tex", "main.tex", "appendix.tex", "standalone.tex", "methods.md",
                 "methods.tex",
                 "references.bib", "manifest.json", "results/csc.csv", "results/random_logit.csv",
                 "results/randomization_cascading.csv", "results/models.csv", "figures/csc.pdf",
                 "figures/heatmaps_cnn-bort_image1.png"):
        assert (out / name).exists(), name
    tex = (out / "tables.tex").read_text()
    # the main part: how to read the checks, the compact verdict, the two papers' tables (Sixt's CSC, Adebayo's
    # cascading), Bort vs baseline; the appendix: the matrix as a table, each check's cells in full, the measures
    # that do not carry the verdict, the scales, the pairs whose outcome depends on the measure, the mechanisms'
    # measurements, the thresholds' sensitivity, the controls, the papers' and Bort's tables in full, the models
    labels = re.findall(r"\\label\{tab:([^}]+)\}", tex)
    assert labels == ["how_to_read", "verdict_compact", "reproduction_sixt_brief", "reproduction_adebayo_cascading_brief",
                      "bort_brief", "matrix", "verdict_csc", "verdict_random-logit", "verdict_cascading",
                      "side_measures", "scales", "measure_dependent", "mechanisms", "sensitivity", "controls",
                      "reproduction_sixt", "reproduction_adebayo_cascading", "bort", "models"], labels
    assert tex.count(r"\bottomrule") == len(labels) and r"\begin{tabular}" in tex
    verdict = pd.read_csv(out / "verdict.csv")  # every column of the verdict table, the cells in full
    assert len(verdict) == 8 and {"cascading", "cascading_spearman_abs", "short_cascading", "reason_csc"} <= set(verdict)
    csc = pd.read_csv(out / "results" / "csc.csv")
    assert set(csc.model) == {"cnn-sgd", "cnn-bort"} and "edge" not in set(csc.method)
    assert set(result.tables) == {"csc", "random-logit", "cascading", "models"}


def test_every_markdown_table_parses_with_as_many_cells_in_each_row_as_its_header(built):
    """report.md read by a CommonMark parser with GFM tables: every table's header, separator and rows have the same
    number of columns (a "|" inside a cell, as in "Spearman of |map|", is escaped), and the compact tables' cells
    stay within about 40 characters."""
    from markdown_it import MarkdownIt

    out, _ = built
    text = (out / "report.md").read_text()
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    tables: list[list[int]] = []
    inside: list[int] | None = None
    cells = 0
    for token in tokens:
        if token.type == "table_open":
            inside = []
        elif token.type == "tr_open":
            cells = 0
        elif token.type in ("th_open", "td_open"):
            cells += 1
        elif token.type == "tr_close" and inside is not None:
            inside.append(cells)
        elif token.type == "table_close":
            tables.append(inside)
            inside = None
    assert len(tables) == text.count("\n| --- ") > 10
    assert all(len(set(counts)) == 1 for counts in tables), tables
    compact = text.split("## Verdict\n", 1)[1].split("\n\n| ", 1)[1].split("\n\n", 1)[0]  # its first table
    body = [line for line in ("| " + compact).splitlines() if not line.startswith("| ---")]
    longest = max(len(c.strip()) for line in body[1:] for c in line.strip("|").split(" | "))
    assert 20 < longest <= 44, longest


def test_report_is_rebuilt_without_recomputing(finished, capsys):
    out, _ = finished
    units = {p: p.stat().st_mtime_ns for p in (out / "units").rglob("*.csv")}
    (out / "index.html").unlink(missing_ok=True)
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (out / "index.html").exists() and "report:" in printed
    # a line per stage: the sections and figures drawn, the figures and the files written
    assert re.search(r"report: \d+ sections with \d+ figures drawn \(\d+\.\d s\)", printed)
    assert "figures written" in printed and "standalone.tex, verdict.csv written" in printed
    assert units == {p: p.stat().st_mtime_ns for p in (out / "units").rglob("*.csv")}


def test_a_report_build_leaves_no_font_file_open(finished, tmp_path):
    """matplotlib keeps each font it renders open for the life of the process; a build closes what it opened."""
    from matplotlib import font_manager, mathtext

    def open_fonts():
        fds = Path("/proc/self/fd")
        return sorted(os.readlink(fd) for fd in fds.iterdir() if fd.exists() and fd.resolve().suffix == ".ttf")

    font_manager._get_font.cache_clear()  # an earlier test's figures: the caller's fonts, kept by design
    mathtext.MathTextParser._parse_cached.cache_clear()
    gc.collect()
    assert open_fonts() == []
    build_report(finished[0], tmp_path / "report")
    assert open_fonts() == []


def test_latex_report_compiles_without_undefined_references(finished):
    require_tool("pdflatex", package="texlive-latex-recommended")
    require_tool("bibtex", package="texlive-latex-recommended")
    out, result = finished
    assert main(["report", str(out), "--pdf"]) == 0  # compile_pdf raises on undefined references / citations
    pdf = (out / "report.pdf").read_bytes()
    assert pdf[:5] == b"%PDF-" and len(pdf) > 50_000
    figures = (out / "figures.tex").read_text()
    for name in re.findall(r"\\includegraphics\[[^]]*\]\{figures/([^}]+)\.pdf\}", figures):
        assert (out / "figures" / f"{name}.pdf").exists(), name
    bib = (out / "references.bib").read_text()
    for key in re.findall(r"\\citep\{([^}]+)\}", (out / "methods.tex").read_text()):
        for k in key.split(","):
            assert f"{{{k}," in bib, k
    # read as it prints: the matrix on page 1 or 2, a main part of at most 6 pages, at most 15 in all, and no page
    # but a part's last that is nearly empty (a table's one row carried over, a heading left alone)
    require_tool("pdftoppm", package="poppler-utils")
    pages = printed_pages(out / "report.pdf")
    appendix = appendix_page(pages)
    assert appendix is not None
    assert any("Figure 1: Verdict matrix" in page.text for page in pages[:2])
    assert 2 <= appendix <= 7 and len(pages) <= 15, (appendix, len(pages))  # a main part of 1 to 6 pages
    # page numbers from 1: the main part's last is appendix - 1, the report's last len(pages)
    sparse = [k for k, page in enumerate(pages, 1) if page.ink < 0.2 and k not in (appendix - 1, len(pages))]
    assert not sparse, [(k, pages[k - 1].ink) for k in sparse]


def test_index_html_renders_in_headless_chromium(built, tmp_path):
    browser = require_tool("chromium", "chromium-browser", package="chromium")
    out, index = built
    shot = tmp_path / "page.png"
    run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
                          "--hide-scrollbars", "--window-size=1400,900", f"--screenshot={shot}",
                          index.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    with Image.open(shot) as picture:
        assert picture.size == (1400, 900)
        colours = np.asarray(picture.convert("RGB"), dtype=float)
    pixels = colours.mean(axis=2)
    assert (pixels < 200).mean() > 0.02 and pixels.std() > 20  # text, tables and figures, not a blank page
    # the verdict matrix on the first screen: its cells, rejected (orange) and not rejected (blue)
    for rgb in (VERDICT_COLOURS["rejected"], VERDICT_COLOURS["not rejected"]):
        target = np.array([int(rgb[i:i + 2], 16) for i in (1, 3, 5)], dtype=float)
        assert (np.abs(colours - target).max(axis=2) < 12).mean() > 0.003, rgb
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p2'}",
                          "--dump-dom", index.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert "<h2>Verdict</h2>" in dom.stdout and "<figcaption>" in dom.stdout


def test_every_figure_keeps_legends_outside_and_each_method_its_colour(finished):
    out, _ = finished
    figures = [f for s in report_sections(out) for f in s.figures]
    assert {"csc", "random_logit_cnn-sgd", "randomization_cascading_cnn-bort", "bort_vs_cnn-sgd"} <= {f.name for f in figures}
    seen = 0
    for figure in figures:
        assert legend_outside_axes(figure.figure), figure.name
        for legend in figure.figure.legends:
            for handle, text in zip(legend.legend_handles, legend.get_texts()):
                if text.get_text() in TINY["methods"]:
                    assert handle.get_color() == style.color(text.get_text()), (figure.name, text.get_text())
                    seen += 1
    assert seen >= 3 * len(TINY["methods"]) - 1


def test_an_audit_of_three_models_gets_a_verdict_matrix_and_a_score_across_models(tmp_path, capsys):
    out = tmp_path / "three"
    config = load_config(models=["cnn-sgd", "cnn-bort", "cnn-dbort"], methods=["gradient", "lrp-zplus"],
                         tests=["random-logit"], n_images=2, heatmap_examples=0)
    run_audit(config, out, progress=False, log=lambda s: None)
    assert main(["report", str(out), "--score", "random_logit_ssim"]) == 0
    assert (out / "figures" / "verdict_matrix.pdf").exists() and (out / "figures" / "score_random_logit_ssim.png").exists()
    assert "\\label{fig:verdict_matrix}" in (out / "figures.tex").read_text()
    capsys.readouterr()
    assert main(["report", str(out), "--score", "accuracy"]) != 0
    assert "no verdict score 'accuracy'" in capsys.readouterr().err

