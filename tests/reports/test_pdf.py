"""The PDF read as it prints: pages rendered with pdftoppm, a near-empty page told from a full one."""
import subprocess
from pathlib import Path

import pytest

from reports.pdf import ReportError, printed_pages
from tests.helpers import require_tool

ROWS = "\n".join(rf"row {k} & {k * 0.5:.2f} & a cell of words \\" for k in range(60))
DOCUMENT = rf"""\documentclass{{article}}
\usepackage{{longtable,booktabs}}
\begin{{document}}
\begin{{longtable}}{{lll}}
\toprule name & value & note \\ \midrule \endhead
\bottomrule \endlastfoot
{ROWS}
\end{{longtable}}
\end{{document}}
"""


def test_a_page_holding_one_table_row_reads_near_empty_and_a_full_page_full(tmp_path):
    latex = require_tool("pdflatex", package="texlive-latex-recommended")
    require_tool("pdftoppm", package="poppler-utils")
    (tmp_path / "t.tex").write_text(DOCUMENT)
    subprocess.run([latex, "-interaction=nonstopmode", "t.tex"], cwd=tmp_path, check=True, capture_output=True)
    pages = printed_pages(tmp_path / "t.pdf")
    # 60 rows of a longtable: a full first page, then the rest; the last row sits on the last page
    assert len(pages) >= 2 and "row 0 " in pages[0].text and "row 59 " in pages[-1].text
    assert pages[0].ink > 0.3
    (tmp_path / "t.tex").write_text(DOCUMENT.replace(ROWS, "\n".join(ROWS.splitlines()[:1]) + "\n"))
    subprocess.run([latex, "-interaction=nonstopmode", "t.tex"], cwd=tmp_path, check=True, capture_output=True)
    [page] = printed_pages(tmp_path / "t.pdf")
    assert page.ink < 0.1 and "row 0 " in page.text  # a header, one row and the page number


def test_a_file_that_is_no_pdf_gets_the_toolkits_error(tmp_path):
    require_tool("pdftotext", package="poppler-utils")
    (tmp_path / "notes.pdf").write_text("not a PDF")
    for path in (tmp_path / "notes.pdf", tmp_path / "missing.pdf"):
        with pytest.raises(ReportError, match="could not be read as a PDF"):
            printed_pages(path)


def test_reading_pages_without_poppler_says_what_to_install(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ReportError, match="poppler-utils"):
        printed_pages(Path("missing.pdf"))
