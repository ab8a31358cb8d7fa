"""``report.pdf``: ``standalone.tex`` compiled with pdflatex and BibTeX, checked for what a
reader would notice (undefined references or citations, missing bibliography entries)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audit.atomic import atomic_write_bytes
from audit.errors import AuditError

INPUTS = ("standalone.tex", "main.tex", "appendix.tex", "references.bib")
PROBLEMS = re.compile(r"LaTeX Warning: (Reference|Citation) .* undefined|There were undefined (references|citations)"
                      r"|I didn't find a database entry|Warning--I didn't find|! ")


class ReportError(AuditError):
    """The report could not be built as asked (e.g. no TeX installation for ``--pdf``)."""


def compile_pdf(folder: Path, timeout: float = 300, log: Callable[[str], None] = lambda text: None) -> tuple[Path, str]:
    """Compile ``folder/standalone.tex`` to ``folder/report.pdf`` (pdflatex, bibtex, pdflatex x2),
    in a scratch folder so that a failed build leaves no partial file; returns the PDF and the
    last pdflatex log; ``log`` is told as each pass ends. Raises :class:`ReportError` naming the first
    problems of the log."""
    latex, bibtex = shutil.which("pdflatex"), shutil.which("bibtex")
    if latex is None or bibtex is None:
        raise ReportError("--pdf needs pdflatex and bibtex (Debian: apt-get install texlive-latex-recommended); "
                          f"the LaTeX sources are in {folder}")
    missing = [name for name in INPUTS if not (folder / name).exists()]
    if missing:
        raise ReportError(f"{folder} lacks {', '.join(missing)}; rebuild the report first")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for name in INPUTS:
            shutil.copy(folder / name, work / name)
        if (folder / "figures").exists():
            shutil.copytree(folder / "figures", work / "figures")
        latex_run = [latex, "-interaction=nonstopmode", "-halt-on-error", "standalone.tex"]
        steps = (latex_run, [bibtex, "standalone"], latex_run, latex_run)
        output = ""
        for k, step in enumerate(steps):
            done = subprocess.run(step, cwd=work, capture_output=True, text=True, timeout=timeout,
                                  errors="replace")
            output = done.stdout
            if done.returncode != 0:
                raise ReportError(f"{Path(step[0]).name} failed on {folder / 'standalone.tex'}: "
                                  + _first_problems(done.stdout + done.stderr))
            log(f"PDF pass {k + 1} of {len(steps)} ({Path(step[0]).name}) done")
        bibtex_log = (work / "standalone.blg").read_text(errors="replace")
        problems = _first_problems(output + bibtex_log, strict=True)
        if problems:
            raise ReportError(f"report.pdf of {folder} has problems: {problems}")
        atomic_write_bytes(folder / "report.pdf", (work / "standalone.pdf").read_bytes())
    return folder / "report.pdf", output


def _first_problems(log: str, strict: bool = False, limit: int = 3) -> str:
    found = [line.strip() for line in log.splitlines() if PROBLEMS.search(line)]
    if not found and not strict:
        return log.strip().splitlines()[-1] if log.strip() else "no output"
    return "; ".join(found[:limit])


INK = 200  # of 255: at 30 dpi a 10 pt glyph is a light-to-mid grey smudge, the paper 255


@dataclass(frozen=True)
class Page:
    """A printed page of a PDF as a reader sees it: its text (pdftotext) and ``ink``, the share of its pixel rows
    (pdftoppm, 30 dpi, grey) that hold a pixel darker than :data:`INK` (a full page of 10 pt text about 0.4; a
    header and one table row under 0.1)."""

    text: str
    ink: float


def printed_pages(pdf: Path, dpi: int = 30, timeout: float = 120) -> list[Page]:
    """Each page of ``pdf``, rendered as it prints (needs poppler's pdftoppm and pdftotext; raises
    :class:`ReportError` without them)."""
    tools = {name: shutil.which(name) for name in ("pdftoppm", "pdftotext")}
    if None in tools.values():
        raise ReportError("reading a PDF's pages needs pdftoppm and pdftotext (Debian: apt-get install poppler-utils)")
    read = subprocess.run([str(tools["pdftotext"]), "-layout", str(pdf), "-"], capture_output=True, text=True,
                          timeout=timeout, errors="replace")
    if read.returncode != 0:
        raise ReportError(f"{pdf} could not be read as a PDF: {read.stderr.strip() or 'pdftotext failed'}")
    text = read.stdout.split("\f")
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([str(tools["pdftoppm"]), "-r", str(dpi), "-gray", str(pdf), f"{scratch}/page"], check=True,
                       capture_output=True, timeout=timeout)
        inks = []
        for image in sorted(Path(scratch).glob("page-*.pgm"), key=lambda p: int(p.stem.rsplit("-", 1)[1])):
            pixels = _pgm(image.read_bytes())
            inks.append(float((pixels < INK).any(axis=1).mean()))
    return [Page(t, ink) for t, ink in zip(text, inks)]


def appendix_page(pages: list[Page]) -> int | None:
    """The page (from 1) whose heading line is "Appendix": where the report's main part ends; None without one."""
    return next((k + 1 for k, page in enumerate(pages) if re.search(r"^\s*Appendix\s*$", page.text, re.M)), None)


def _pgm(data: bytes) -> np.ndarray:
    """A binary (P5, 8-bit) PGM image as a (rows, columns) array."""
    fields = data.split(maxsplit=4)
    if fields[0] != b"P5":
        raise ReportError("pdftoppm -gray did not write a binary PGM")
    width, height = int(fields[1]), int(fields[2])
    return np.frombuffer(fields[4][-width * height:], dtype=np.uint8).reshape(height, width)
