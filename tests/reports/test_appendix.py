"""The appendix's verdict section: each check's cells in full under its rule, the side measures compact, and what
the print leaves to the HTML."""
import pandas as pd

from audit.checks import CHECKS
from audit.checks.base import NOT_REJECTED, REJECTED
from audit.run.config import load_config
from reports.appendix import check_tables, side_table, verdict_section

CONFIG = load_config(models=["m"], methods="gradient,lrp-zplus", tests="random-logit,cascading")


def _verdict():
    rows = []
    for method, outcome in (("gradient", NOT_REJECTED), ("lrp-zplus", REJECTED), ("edge", REJECTED)):
        rows.append({"model": "m", "method": method, "role": "control" if method == "edge" else "method",
                     "unsourced": 0, "outcome": outcome, "verdict": outcome, "mechanisms": {},
                     "mechanism": "", "control_check": "as expected" if method == "edge" else "",
                     "measure_dependent": "cascading: SSIM rejected, signed Spearman not rejected"
                     if method == "lrp-zplus" else "",
                     "outcome_random-logit": outcome, "random_logit": f"{outcome} (0.9 [0.8, 1.0]; 16 images)",
                     "outcome_cascading": outcome, "cascading": f"{outcome} (after fc: 0.9 [0.8, 1.0]; 8 seeds)",
                     "short_cascading_spearman_abs": "\u2717 0.91 [0.80, 0.97]",
                     "short_cascading_spearman": "\u2013 0.10 [0.02, 0.20]"})
    return pd.DataFrame(rows)


def test_each_check_has_its_cells_in_full_under_its_rule():
    tables = check_tables(_verdict(), CONFIG)
    assert [t.label for t in tables] == ["verdict_random-logit", "verdict_cascading"]
    cascading = tables[1]
    options = CHECKS["cascading"].options_from(CONFIG.options, CONFIG.looks, CONFIG.family)
    assert cascading.caption == f"cascading, every cell: {CHECKS['cascading'].verdict.rule_text(options)}."
    assert list(cascading.frame.columns) == ["model", "method", "SSIM, in full"]
    assert cascading.frame["SSIM, in full"].tolist() == _verdict().cascading.tolist()


def test_the_measures_that_do_not_carry_the_verdict_stand_compact_beside_each_other():
    table = side_table(_verdict())
    assert list(table.columns) == ["model", "method", "cascading: Spearman of |map|", "cascading: signed Spearman"]
    assert table.loc[1, "cascading: Spearman of |map|"] == "\u2717 0.91 [0.80, 0.97]"
    assert side_table(_verdict().drop(columns=["short_cascading_spearman_abs", "short_cascading_spearman"])).empty


def test_the_print_leaves_the_matrix_table_the_evidence_and_the_sensitivity_to_the_html():
    section = verdict_section(_verdict(), {"random-logit": pd.DataFrame(), "cascading": pd.DataFrame()}, CONFIG, [])
    assert section.appendix and "A method is rejected when any check rejects it" in section.text
    printed = {t.label: t.printed for t in section.tables}
    assert printed["matrix"] is False and printed["verdict_cascading"] and printed["side_measures"]
    assert printed["measure_dependent"] and printed["controls"]
    assert printed["mechanisms"] is False  # the evidence of a rejected method's mechanisms: looked up on screen
    assert "scales" not in printed  # no check table to read the scales from: left out, not shown empty
