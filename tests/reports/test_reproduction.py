"""The papers' tables compare like with like: the paper's measure, its value, an inconclusive cell apart from a
differing one, and a differing cell that names what was measured to differ; on tables made by hand."""
import numpy as np
import pandas as pd

from audit.checks.base import INCONCLUSIVE
from audit.run.config import load_config
from reports.reproduction import ADEBAYO, SIXT, _counts, adebayo_table, adebayo_tables, measure_cell, sixt_table, sixt_tables

CONFIG = load_config(models=["m"], methods="gradient,guided-backprop,input-x-gradient,integrated-gradients",
                     tests="cascading,data-randomization")


def _stages(method, **medians):
    """A cascading table of 20 images: the trained model (stage 0) and two stages, each measure's values narrowly
    around the median given for it (a pair: its stage 1 and stage 2 medians)."""
    rows = []
    for stage in (0, 1, 2):
        for i in range(20):
            row = {"model": "m", "method": method, "stage": stage, "layer": f"s{stage}", "image": i}
            for measure, (first, last) in medians.items():
                centre = 1.0 if stage == 0 else first if stage == 1 else last
                row[measure] = centre + 0.01 * np.linspace(-1, 1, 20)[i]
            rows.append(row)
    return rows


def test_each_measure_the_paper_concluded_by_is_compared_and_inconclusive_is_never_differs():
    cascade = pd.DataFrame(
        _stages("guided-backprop", ssim=(0.9, 0.2), spearman_abs=(0.9, 0.3), spearman=(0.8, 0.1))
        + _stages("input-x-gradient", ssim=(0.8, 0.4), spearman_abs=(0.9, 0.8), spearman=(0.05, 0.0))
        + _stages("gradient", ssim=(0.9, 0.1), spearman_abs=(0.2, 0.1), spearman=(0.7, 0.1)))
    cascade = pd.concat([cascade, pd.DataFrame(_stages("integrated-gradients", ssim=(0.7, 0.4), spearman_abs=(0.9, 0.8),
                                                       spearman=(0.0, 0.0)))])
    table = adebayo_table({"cascading": cascade}, ["m"], "cascading", CONFIG).set_index("method")
    assert table.loc["guided-backprop", "m"].startswith("agrees: SSIM rejected (after s1: 0.900")
    # measure-dependent: signed Spearman drops (not rejected), SSIM and the Spearman of |map| stay high
    assert table.loc["input-x-gradient", "Adebayo et al. 2018"].startswith("measure-dependent")
    cell = table.loc["input-x-gradient", "m"]
    assert cell.startswith("agrees: signed Spearman not rejected") and "SSIM rejected" in cell
    # an SSIM interval around its survival level ((1 + 0.4) / 2 = 0.7) leaves the cell inconclusive, not differing
    assert table.loc["integrated-gradients", "m"].startswith("inconclusive: ")
    assert "SSIM inconclusive (after s1: 0.700" in table.loc["integrated-gradients", "m"]
    # the gradient survives the logit layer here: differs, and the cell says what was measured to differ
    gradient = table.loc["gradient", "m"]
    assert gradient.startswith("differs: SSIM rejected") and "[why: measure: Spearman of |map| gives the paper's " \
        "outcome; model: 2 stages (Inception v3: 17 blocks), the verdict reads the first 1; SSIM of the maps clipped " \
        "at their 0.5 / 99.5 percentiles in [0, 1], flip-invariant, and HOG by Pearson (the paper: signed maps in " \
        "[-1, 1], data range 2, no flip; HOG by Spearman in its code); explained class: the " \
        "true label (the paper: the randomized model's prediction); BatchNorm reset" in gradient
    # the compact table: the conclusion, then per model the result, and for a differing cell the first measure that
    # differs with this run's outcome by it (the measures, intervals and reasons stay in the full table)
    compact = adebayo_tables({"cascading": cascade}, ["m"], "cascading", CONFIG)[1].set_index("method")
    assert compact.loc["gradient", "m"] == "differs: SSIM rejected"
    assert compact.loc["input-x-gradient", "m"] == "agrees" and compact.loc["integrated-gradients", "m"] == INCONCLUSIVE
    assert compact.loc["input-x-gradient", "Adebayo et al. 2018"] == "measure-dependent"
    assert _counts(compact.reset_index(), ["m"]) == _counts(table.reset_index(), ["m"])
    # under the paper's protocol settings the protocol is no longer named
    adebayo = load_config(models=["m"], methods="gradient", tests="cascading", target="predicted", bn="keep-stats",
                          measures="adebayo2018")
    assert "explained class" not in adebayo_table({"cascading": cascade}, ["m"], "cascading", adebayo).set_index(
        "method").loc["gradient", "m"]


def test_data_randomization_is_judged_by_the_rank_correlations_and_a_visual_caution_is_marked_so():
    rows = [{"model": "m", "method": method, "image": i, "ssim": 0.36 + 0.001 * i, "spearman_abs": 0.91 + 0.001 * i,
             "spearman": 0.01 + 0.001 * i} for method in ("integrated-gradients", "gradient") for i in range(20)]
    table = adebayo_table({"data-randomization": pd.DataFrame(rows)}, ["m"], "data-randomization",
                          CONFIG).set_index("method")
    ig = table.loc["integrated-gradients"]
    assert "not a measured claim" in ig["Adebayo et al. 2018"]
    # SSIM 0.36 would say "changed"; the paper's rank correlations say the structure stayed and the signs changed
    # a visual caution is shown, not counted among the agreements
    assert ig["m"].startswith("not counted, a visual caution (agrees): Spearman of |map| rejected (twin: 0.91")
    assert "signed Spearman not rejected" in ig["m"]
    assert table.loc["gradient", "m"].startswith("differs: Spearman of |map| rejected")
    assert _counts(table.reset_index(), ["m"]) == "0 agree, 1 differ, 0 inconclusive"
    compact = adebayo_tables({"data-randomization": pd.DataFrame(rows)}, ["m"], "data-randomization",
                             CONFIG)[1].set_index("method")
    assert compact.loc["integrated-gradients", "m"] == "not counted: agrees"  # not counted in the compact counts either
    assert _counts(compact.reset_index(), ["m"]) == "0 agree, 1 differ, 0 inconclusive"


def test_sixt_compares_the_csc_interval_with_the_papers_099_whatever_the_runs_threshold():
    def row(method, median, low, high):
        return {"model": "m", "method": method, "is_logits": True, "layer": "features.0", "depth": 0,
                "median": median, "median_low": low, "median_high": high}
    csc = pd.DataFrame([row("lrp-zplus", 0.999, 0.995, 1.0), row("guided-backprop", 0.98999, 0.986, 0.993),
                        row("deconvnet", 0.95, 0.94, 0.96), row("deeplift", 0.87, 0.85, 0.89)])
    table = sixt_table({"csc": csc}, ["m"]).set_index("method")
    assert list(table.index) == ["lrp-zplus", "deconvnet", "guided-backprop", "deeplift"]
    assert table.loc["lrp-zplus", "m"] == "agrees: 0.9990 [0.9950, 1.0000] at features.0"
    compact = sixt_tables({"csc": csc}, ["m"])[1].set_index("method")
    assert compact.loc["lrp-zplus", "m"] == "agrees: 0.9990" and compact.loc["deconvnet", "m"] == "differs: 0.9500"
    assert compact.loc["lrp-zplus", "Sixt et al. 2020"] == "CSC >= 0.99"
    assert table.loc["guided-backprop", "m"].startswith("inconclusive: 0.9900 [0.9860, 0.9930]")
    # the abstract counts deconvnet among the converging; the cell names where its chain came nearest 0.99
    assert table.loc["deconvnet", "m"] == ("differs: 0.9500 [0.9400, 0.9600] at features.0 [why: chain: its highest "
                                           "median 0.9500 at features.0 (depth 0)]")
    assert "CSC >= 0.99 at the input (abstract)" in table.loc["deconvnet", "Sixt et al. 2020"]
    assert table.loc["deeplift", "m"].startswith("agrees")


def test_every_claim_names_where_it_stands_and_a_measure_it_rests_on():
    claims = [c for check in ADEBAYO.values() for c in check] + SIXT
    assert all(c.where and c.expected for c in claims)
    assert {c.method for c in SIXT} >= {"deep-taylor", "lrp-zplus", "excitation-backprop", "patternattribution",
                                        "deconvnet", "rectgrad", "guided-backprop", "deeplift"}


def test_the_papers_table_reads_each_measure_with_the_verdicts_rule():
    """Input x gradient whose fully randomized model keeps 0.91 of its |map| ranking, beside the controls (the edge
    map at 1, the random map at 0): the verdict table's Spearman-of-|map| cell and the papers' table's read the same
    rule on the same scale, and both reject; the signed Spearman, which drops, is not rejected by either."""
    from reports.verdict import verdict_table

    cascade = pd.DataFrame(_stages("input-x-gradient", ssim=(0.5, 0.3), spearman_abs=(0.93, 0.91), spearman=(0.05, 0.0))
                           + _stages("edge", ssim=(1.0, 1.0), spearman_abs=(1.0, 1.0), spearman=(1.0, 1.0))
                           + _stages("random", ssim=(0.0, 0.0), spearman_abs=(0.0, 0.0), spearman=(0.0, 0.0)))
    config = load_config(models=["m"], methods="input-x-gradient,edge,random", tests="cascading")
    verdict = verdict_table({"cascading": cascade}, config).set_index("method")
    part = cascade[cascade.method == "input-x-gradient"]
    controls = cascade[cascade.method.isin(["edge", "random"])]
    for measure, column in (("spearman_abs", "cascading_spearman_abs"), ("spearman", "cascading_spearman"),
                            ("ssim", "cascading")):
        ours = measure_cell("cascading", part, measure, config, controls)
        assert verdict.loc["input-x-gradient", column].startswith(ours.outcome + " ") or \
            verdict.loc["input-x-gradient", column].startswith(ours.outcome + ":"), measure
    assert measure_cell("cascading", part, "spearman_abs", config, controls).outcome == "rejected"
    assert measure_cell("cascading", part, "spearman", config, controls).outcome == "not rejected"
    assert "cascading: SSIM not rejected, Spearman of |map| rejected" in verdict.loc["input-x-gradient",
                                                                                     "measure_dependent"]
    table = adebayo_table({"cascading": cascade}, ["m"], "cascading", config).set_index("method")
    assert table.loc["input-x-gradient", "m"].startswith("differs:")  # SSIM, which the paper saw stay high, drops here
    assert "Spearman of |map| rejected" in table.loc["input-x-gradient", "m"]
