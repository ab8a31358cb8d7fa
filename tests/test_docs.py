"""The documentation site builds with warnings as errors, and its generated pages say what the code declares."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attributions.catalog import FAMILIES
from attributions.methods import BUILDERS, build_method
from audit.checks import CHECKS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-a", "-q", "-b", "html",
                           str(ROOT / "docs"), str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_every_check_has_a_page_listing_its_options(site):
    for name, check in CHECKS.items():
        page = (site / "checks" / f"{name}.html").read_text()
        for option in check.options.declared() if check.options is not None else []:
            assert f"--{option.name.replace('_', '-')}" in page, (name, option.name)


def test_every_method_is_on_its_familys_page(site):
    pages = {family: (site / "methods" / f"{family.replace(' ', '-').replace('+', 'plus').lower()}.html").read_text()
             for family in FAMILIES}
    for name in BUILDERS:
        assert f">{name}<" in pages[build_method(name).family], name


def test_the_notebooks_and_the_bibliography_are_rendered(site):
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        assert (site / "tutorials" / f"{notebook.stem}.html").exists(), notebook.name
    references = (site / "references.html").read_text().lower()  # the style sets titles in sentence case
    assert "when explanations lie" in references and "sanity checks for saliency maps" in references


def test_the_atlas_page_shows_the_published_figure_table_and_provenance(site):
    import json

    import pandas as pd

    about = json.loads((ROOT / "docs" / "atlas" / "atlas.json").read_text())
    page = (site / "atlas.html").read_text()
    assert (site / "_images" / "atlas.png").exists() and "atlas.png" in page
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())  # the words as a reader sees them
    assert f"at commit {about['commit']} with {about['command']}" in text and about["date"] in text
    for run in about.get("earlier_rows", []):  # a partial redo names the runs its other rows come from
        assert f"come from {run['date']} at commit {run['commit']} with {run['command']}" in text, run
    table = pd.read_csv(ROOT / "docs" / "atlas" / "atlas.csv")
    for method in table[table.status == "measured"].method.unique():  # a row per method measured
        assert re.search(rf"<tr[^>]*>\s*<td><p><code[^>]*><span class=\"pre\">{method}</span>", page), method
    for model in about["not_measured"]:
        assert model in text, model


def test_the_sweep_page_shows_the_published_counts_and_provenance(site):
    import json

    import pandas as pd

    about = json.loads((ROOT / "docs" / "sweep" / "sweep.json").read_text())
    text = " ".join(re.sub(r"<[^>]+>", " ", (site / "sweep.html").read_text()).split())
    assert f"at commit {about['commit']} with {about['command']}" in text and about["date"] in text
    table = pd.read_csv(ROOT / "docs" / "sweep" / "sweep.csv")
    assert len(table) == sum(about["cells"].values()) and len(table[["library", "model"]].drop_duplicates()) == about["models"]
    counts = table.outcome.value_counts()
    total = " ".join(str(int(counts.get(o, 0))) for o in ("exact", "refused", "failed"))
    assert f"all {about['models']} {about['methods']} {total}" in text  # the counts row of the table, as read


def test_the_speed_page_shows_every_table_make_bench_writes_with_its_provenance(site):
    """Every table make bench writes is committed and included by a page: the speed page, the verdicts page for
    the checks' power, the twins page for what a twin costs, the cascading page for its operating curve, the
    planted-shortcut page for its outcomes on the shipped pairs, the front page for the shipped models' verdict
    matrix (its figure beside it)."""
    from benchmarks.__main__ import DEFAULT, LIBRARIES

    pages = {"power": "verdicts", "twins": "twins", "twins_library": "twins", "operating_curve": "checks/cascading",
             "shipped_verdicts": "index", "shortcut_outcomes": "checks/shortcut"}
    for name in (*DEFAULT, *LIBRARIES):
        where = pages.get(name, "speed")
        page = " ".join(re.sub(r"<[^>]+>", " ", (site / f"{where}.html").read_text()).split())
        source = (ROOT / "docs" / f"{where}.md").read_text()
        written = (ROOT / "docs" / "benchmarks" / f"{name}.md").read_text()
        assert re.search(r"\{include\} (\.\./)?benchmarks/" + name + r"\.md", source), name
        provenance = re.search(r"Measured (\S+ \S+ UTC) at commit (\w+)", written)
        assert provenance is not None and f"Measured {provenance[1]} at commit {provenance[2]}" in page, name
        assert "|" in written and "| ---" not in page, name  # a Markdown table, rendered as one
    assert 'alt="The verdict matrix of the shipped models"' in (site / "index.html").read_text()
    assert (site / "_images" / "shipped_verdicts.png").exists()
    # the operating curves split between the two checks' pages: each shows its own table only
    for page, own, other in (("cascading", "Cascading randomization on", "Data randomization on"),
                             ("data-randomization", "Data randomization on", "Cascading randomization on")):
        text = " ".join(re.sub(r"<[^>]+>", " ", (site / "checks" / f"{page}.html").read_text()).split())
        assert own in text and other not in text, page
