"""The LaTeX tables: a table that fits its line floats in l columns; a wider one wraps its long cells in p columns
sharing the line (on landscape pages when it has many columns) instead of shrinking or running off the page."""
import re

import pandas as pd
from matplotlib.figure import Figure as MplFigure

from audit.sections import Figure, Section, Table, print_first
from reports.latex import APPENDIX_HEIGHT, FITS, PORTRAIT, SHORT, column_spec, escape, part, tabular, widths


def test_a_table_that_fits_floats_in_natural_width_columns():
    tex = tabular(Table(pd.DataFrame({"method": ["gradient"], "ssim": [0.5]}), "small", "small"))
    assert r"\begin{table}" in tex and r"\begin{tabular}{ll}" in tex and "landscape" not in tex


def test_a_wide_table_wraps_its_long_cells_and_keeps_the_short_ones_whole():
    long_text = "rejected (after classifier.2: 0.871 [0.802, 0.903]; survives 4 of 6 stages, stops at features.3)"
    frame = pd.DataFrame({"model": ["cnn-sgd"], "method": ["lrp-epsilon-alpha2beta1"], "cascading": [long_text],
                          "random_logit": [long_text[:30]]})
    tex = tabular(Table(frame, "wide", "wide"))
    assert len(long_text) + 30 + 30 > FITS and r"\begin{longtable}" in tex
    spec = re.search(r"\\begin\{longtable\}\{(.*)\}\n", tex).group(1)
    assert spec.startswith("ll") and spec.count("p{") == 2  # model and method (<= SHORT) are not wrapped
    # the two wrapped columns share what the short ones leave, in proportion to their (capped) longest cells
    shares = [tuple(map(int, m)) for m in re.findall(r"\*(\d+)/(\d+)", spec)]
    assert sum(a for a, _ in shares) == shares[0][1] and shares[0][0] > shares[1][0]
    assert "landscape" not in tex  # four columns stay portrait
    many = pd.concat([frame] + [frame[["cascading"]].rename(columns={"cascading": f"check {k}"})
                                for k in range(PORTRAIT)], axis=1)
    assert r"\begin{landscape}" in tabular(Table(many, "many", "many"))
    assert "landscape" not in tabular(Table(many, "many", "many"), turn=False)  # the main part stays portrait


def test_a_heading_longer_than_its_cells_is_broken_onto_lines():
    tex = tabular(Table(pd.DataFrame({"orthogonality error (mean)": [0.0002]}), "h", "h"))
    assert r"\begin{tabular}[b]{@{}l@{}}orthogonality \\ error (mean)\end{tabular}" in tex


def test_column_spec_counts_a_headings_longest_word_not_its_length():
    assert column_spec(widths(["a very long heading of short words"], [["x" * (SHORT + 1)]])).count("p{") == 1
    assert column_spec(widths(["a very long heading of short words"], [["x"]])) == "l"


def test_a_part_prints_what_is_marked_printed_and_names_the_rest_once():
    frame = pd.DataFrame({"method": ["gradient"], "ssim": [0.5]})
    grids = print_first([Figure(f"grid{k}", MplFigure(figsize=(6.9, 6)), f"grid {k}") for k in range(3)])
    sections = [Section("Main", "read first", tables=[Table(frame, "Main table.", "main")]),
                Section("Gallery", figures=grids, appendix=True),
                Section("Looked up", tables=[Table(frame, "In full: every cell.", "full", printed=False)],
                        appendix=True)]
    main, appendix = part(sections, appendix=False), part(sections, appendix=True)
    assert "read first" in main and r"\label{tab:main}" in main and "Not printed" not in main
    assert appendix.count(r"\includegraphics") == 1 and "figures/grid0.pdf" in appendix
    assert rf"height={APPENDIX_HEIGHT:g}\textheight" in appendix  # room for another figure on its page
    assert r"\subsection*{Looked up}" not in appendix and r"\label{tab:full}" not in appendix  # nothing printed
    note = appendix.split("\n", 1)[0]
    assert note == escape("Not printed here, in the HTML and Markdown reports (every table also in tables.tex, every "
                          "figure in figures/): 2 more figures of gallery (grid1 and the like); In full.")
