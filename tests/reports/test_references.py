"""The bibliography: every key a method or a check cites exists, and the BibTeX is well formed."""
import re

from attributions.methods import BUILDERS, build_method
from audit.checks import CHECKS
from reports.references import REFERENCES, bibtex, plain, short


def test_every_method_and_check_cites_known_works():
    for name in BUILDERS:
        method = build_method(name)
        assert method.cite and set(method.cite) <= set(REFERENCES), name
    for name, check in CHECKS.items():
        assert check.cite and set(check.cite) <= set(REFERENCES), name
    assert {"sixt2020", "adebayo2018", "zhang2023bort", "bach2015", "montavon2017", "montavon2019", "shrikumar2017",
            "springenberg2015", "sundararajan2017", "smilkov2017", "kohlbrenner2020", "kindermans2019",
            "hedstrom2024", "binder2023"} <= set(REFERENCES)


def test_bibtex_entries_are_balanced_and_complete():
    text = bibtex()
    entries = re.findall(r"@(\w+)\{([^,]+),", text)
    assert [k for _, k in entries] == list(REFERENCES)
    assert text.count("{") == text.count("}")
    for block in text.split("\n@")[0:]:
        assert "author = {" in block and "title = {" in block and "year = {" in block
    assert bibtex(["sixt2020"]).startswith("@inproceedings{sixt2020,")


def test_short_citations_read_as_author_year():
    assert short("sixt2020") == "Sixt et al., 2020"
    assert short("zeiler2014") == "Zeiler and Fergus, 2014"
    assert short("wilcoxon1945") == "Wilcoxon, 1945"
    assert short("paszke2019") == "Paszke et al., 2019"
    assert plain("M{\\\"u}ller, Gr{\\'e}goire") == "Müller, Grégoire"
