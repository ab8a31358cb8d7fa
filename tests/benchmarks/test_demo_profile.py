"""The demo's profile reads its own lines back: each unit's seconds to its check and model, each report stage's."""
from benchmarks.demo_profile import tables

PRINTED = """cnn-sgd/csc/gradient: min median |cos| 0.259, max 0.752 (1.5 s; 139 units left, about 3 min 30 s)
cnn-sgd/csc/lrp-zplus: min median |cos| 0.335, max 1.000 (2.5 s; 138 units left, about 2 min)
cnn-bort/cascading/rectgrad@0-16: median SSIM after the first stage 0.612, at full 0.215 (0.4 s; 36 units left, about 22 s)
cnn-bort/cascading/rectgrad@16-32: median SSIM after the first stage 0.612 (0.6 s; 35 units left, about 22 s)
report: 16 sections with 30 figures drawn (13.7 s)
report: figures written to /tmp/demo/figures (PDF and PNG) (21.0 s)
report: index.html, report.md, verdict.csv written (0.1 s)
report: PDF pass 1 of 4 (pdflatex) done (0.3 s)
report: PDF pass 2 of 4 (bibtex) done (0.1 s)
demo finished in 42 s
"""


def test_the_profile_sums_each_checks_units_and_each_report_stage():
    text = tables(50.0, PRINTED)
    # units 1.5 + 2.5 + 0.4 + 0.6 = 5.0 s; the report 13.7 + 21.0 + 0.1 + 0.4 = 35.2 s; the rest 50 - 40.2
    assert text.startswith("`python -m audit demo`: **50 s** wall (the budget: 120 s on 2 cores): 5 s in the checks' "
                           "units, 35 s building the report, 10 s the rest")
    assert "| csc | cnn-sgd | 2 | 4.0 | 8% |" in text and "| cascading | cnn-bort | 2 | 1.0 | 2% |" in text
    assert text.index("| csc |") < text.index("| cascading |")  # the costliest first
    assert "| 16 sections with 30 figures drawn | 13.7 |" in text and "| figures written | 21.0 |" in text
    assert "| text files written | 0.1 |" in text and "| PDF passes | 0.4 |" in text
