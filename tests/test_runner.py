"""The runner, CLI and report end to end on tiny configurations."""
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from audit.cli import main
from audit.config import load_config
from audit.errors import ConfigError, ModelError
from audit.runner import run_audit

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
    index = result.write_report()
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


def _results(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted((out / "results").glob("*.csv"))}


def test_resume_after_sigkill_gives_identical_results(tmp_path):
    args = ["--models", "cnn-sgd", "--methods", "gradient,lrp-zplus,deeplift,lrp-epsilon,edge",
            "--tests", "random-logit,cascading", "--n-images", "4", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "audit", "run", *args, "--out", str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def written() -> int:
        return len(list((killed / "units").rglob("*.csv"))) if (killed / "units").exists() else 0

    deadline = time.time() + 120
    while time.time() < deadline and written() < 3 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = written()
    assert 0 < done < 10, f"the kill should land part way ({done} of 10 units written)"
    assert not (killed / "results").exists()
    assert main(["run", *args, "--out", str(killed), "--resume"]) == 0
    fresh = tmp_path / "fresh"
    assert main(["run", *args, "--out", str(fresh)]) == 0
    assert _results(killed) == _results(fresh)


def test_bad_configurations(tmp_path, capsys):
    toml = tmp_path / "audit.toml"
    toml.write_text('models = ["cnn-sgd"]\nn_imagse = 4\n')
    with pytest.raises(ConfigError, match="unknown configuration key 'n_imagse'; did you mean 'n_images'"):
        load_config(toml)
    with pytest.raises(ConfigError, match="unknown test 'cascade'.*Did you mean 'cascading'"):
        load_config(tests="csc,cascade")
    with pytest.raises(ConfigError, match="unknown attribution method"):
        load_config(methods="gradient,lrp-zplsu")
    with pytest.raises(ConfigError, match="invalid n_images"):
        load_config(n_images=1)
    assert main(["run", "--models", "no-such-model", "--methods", "gradient", "--tests", "random-logit",
                 "--n-images", "2", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "unknown checkpoint" in capsys.readouterr().err
    with pytest.raises(ModelError, match="cannot build 'nomodule:make'"):
        run_audit(load_config(models=["nomodule:make"], methods=["gradient"], tests=["random-logit"], n_images=2),
                  tmp_path / "y", progress=False, log=lambda s: None)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        run_audit(load_config(models=["cnn-sgd"], **TINY), tmp_path / "busy", progress=False)


def test_user_model_from_a_factory_and_a_checkpoint_file_left_unchanged(tmp_path, monkeypatch):
    from audit.zoo import build, save_checkpoint

    path = save_checkpoint(build("cnn"), {"arch": "cnn", "in_shape": [1, 28, 28], "num_classes": 10},
                           tmp_path / "mine.pt")
    (tmp_path / "mymodels.py").write_text("from audit.zoo import build\n\ndef make():\n    return build('cnn')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    config = load_config(models=[str(path), "mymodels:make"], weights=None, methods=["gradient", "lrp-zplus"],
                         tests=["random-logit"], n_images=2)
    result = run_audit(config, tmp_path / "run", progress=False, log=lambda s: None)
    assert set(result.tables["random-logit"].model) == {"mine", "mymodels_make"}
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_tables_tex_compiles_when_latex_is_installed(finished, tmp_path):
    import shutil

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed (apt-get install texlive-latex-recommended)")
    out, result = finished
    result.write_report()
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
    index = result.write_report()
    run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
                          "--dump-dom", index.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert "<h2>Verdict</h2>" in run.stdout
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
