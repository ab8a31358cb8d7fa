"""The report of a finished run: files, sections, rebuild, LaTeX and browser rendering."""
import re
import subprocess

import pandas as pd
import pytest

from audit.cli import main
from audit.run.config import load_config
from audit.run.runner import run_audit
from reports import build_report

TINY = dict(methods=["gradient", "lrp-zplus", "deeplift", "edge"], tests=["csc", "random-logit", "cascading"],
            n_images=4)


SECTIONS = ["Verdict", "Cosine-similarity convergence", "Random-logit test", "Parameter randomization (cascading)",
            "Heatmaps under cascading randomization", "Bort vs baseline", "Models", "Configuration and versions"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "audit"
    result = run_audit(load_config(models=["cnn-sgd", "cnn-bort"], **TINY), out, progress=False, log=lambda s: None)
    return out, result


def test_report_files_and_sections(finished):
    out, result = finished
    index = build_report(result.out)
    html = index.read_text()
    for heading in SECTIONS:
        assert f"<h2>{heading}</h2>" in html, heading
    assert not re.search(r"(src|href)=[\"'](https?:)?//", html) and "http://" not in html and "https://" not in html
    assert "<script" not in html
    for name in ("report.md", "tables.tex", "manifest.json", "results/csc.csv", "results/random_logit.csv",
                 "results/randomization_cascading.csv", "results/models.csv", "figures/csc_cnn-sgd.pdf",
                 "figures/heatmaps_cnn-bort_image1.png"):
        assert (out / name).exists(), name
    tex = (out / "tables.tex").read_text()
    assert tex.count(r"\toprule") == tex.count(r"\bottomrule") == 3 and r"\begin{tabular}" in tex
    csc = pd.read_csv(out / "results" / "csc.csv")
    assert set(csc.model) == {"cnn-sgd", "cnn-bort"} and "edge" not in set(csc.method)
    assert set(result.tables) == {"csc", "random-logit", "cascading", "models"}


def test_report_is_rebuilt_without_recomputing(finished, capsys):
    out, _ = finished
    units = {p: p.stat().st_mtime_ns for p in (out / "units").rglob("*.csv")}
    (out / "index.html").unlink(missing_ok=True)
    assert main(["report", str(out)]) == 0
    assert (out / "index.html").exists() and "report:" in capsys.readouterr().out
    assert units == {p: p.stat().st_mtime_ns for p in (out / "units").rglob("*.csv")}


def test_tables_tex_compiles_when_latex_is_installed(finished, tmp_path):
    import shutil

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed (apt-get install texlive-latex-recommended)")
    out, result = finished
    build_report(result.out)
    doc = tmp_path / "doc.tex"
    doc.write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage[margin=1cm,landscape]{geometry}\n"
                   f"\\begin{{document}}\n\\input{{{out / 'tables.tex'}}}\n\\end{{document}}\n")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    assert (tmp_path / "doc.pdf").exists()


def test_index_html_renders_in_headless_chromium_without_console_errors(finished, tmp_path):
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    out, result = finished
    index = build_report(result.out)
    run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
                          "--dump-dom", index.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert "<h2>Verdict</h2>" in run.stdout
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console

