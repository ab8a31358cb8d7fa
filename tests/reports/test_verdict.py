"""The verdict table's pass / fail logic, and the baseline-vs-Bort pairing, on tables made by hand."""
import numpy as np
import pandas as pd

from audit.run.config import load_config
from reports.verdict import bort_comparison, display_columns, twins, verdict_table

CONFIG = load_config(models=["m"], methods="gradient,lrp-zplus,deeplift",
                     tests="csc,random-logit,cascading")


def _csc(method, medians, logits=True, model="m"):
    return [{"model": model, "method": method, "inject_at": "fc" if logits else "conv2", "is_logits": logits,
             "layer": f"l{d}", "depth": d, "median": m} for d, m in enumerate(medians)]


def _per_image(method, values, model="m", stage=None):
    rows = [{"model": model, "method": method, "image": i, "ssim": v} for i, v in enumerate(values)]
    return [r | {"stage": stage, "layer": "x"} for r in rows] if stage is not None else rows


def test_each_check_fails_a_method_on_its_own_and_reasons_are_joined():
    csc = pd.DataFrame(_csc("gradient", [0.3, 0.5]) + _csc("lrp-zplus", [0.999, 0.995, 0.4])
                       + _csc("deeplift", [0.999, 0.5], logits=False) + _csc("deeplift", [0.6, 0.7]))
    logit = pd.DataFrame(_per_image("gradient", [0.1, 0.2, 0.3]) + _per_image("lrp-zplus", [0.95, 0.9, 0.99])
                         + _per_image("deeplift", [0.5, 0.81, 0.85]))
    cascade = pd.DataFrame(_per_image("gradient", [0.9] * 3, stage=0) + _per_image("gradient", [0.1] * 3, stage=2)
                           + _per_image("lrp-zplus", [0.2] * 3, stage=0) + _per_image("lrp-zplus", [0.7] * 3, stage=2)
                           + _per_image("deeplift", [0.6, 0.4, 0.5], stage=2))
    v = verdict_table({"csc": csc, "random-logit": logit, "cascading": cascade}, CONFIG).set_index("method")
    assert v.loc["gradient", "verdict"] == "pass"
    # z+: collapse reached at the layer nearest the logits with median >= 0.99 (depth 1, 0.995)
    assert v.loc["lrp-zplus", "verdict"] == "fail: rank-1 collapse, class-insensitive, weight-insensitive"
    assert v.loc["lrp-zplus", "collapse_layer"] == "l1 (0.995)"
    assert v.loc["lrp-zplus", "csc_max_median"] == 0.999
    # deeplift: a collapse at a deeper injection point does not count; median 0.81 >= 0.8 does;
    # the full-randomization median 0.5 reaches the 0.5 threshold (>=)
    assert v.loc["deeplift", "collapse_layer"] == "none (max 0.700)"
    assert v.loc["deeplift", "verdict"] == "fail: class-insensitive, weight-insensitive"
    assert v.loc["deeplift", "random_logit"].startswith("0.810 [")
    assert list(v.reset_index()[display_columns(v.reset_index())].columns) == [
        "model", "method", "collapse_layer", "random_logit", "full_randomization", "verdict"]


def test_a_check_without_rows_neither_passes_nor_fails():
    logit = pd.DataFrame(_per_image("gradient", [0.9, 0.95]) + _per_image("edge", [1.0, 1.0]))
    v = verdict_table({"random-logit": logit}, CONFIG).set_index("method")
    assert v.loc["gradient", "verdict"] == "fail: class-insensitive"
    assert v.loc["gradient", "collapse_layer"] == "n/a" and np.isnan(v.loc["gradient", "csc_max_median"])
    assert list(v.index) == ["gradient", "edge"]  # configured methods first, others after


def test_thresholds_come_from_the_configuration():
    logit = pd.DataFrame(_per_image("gradient", [0.6, 0.6, 0.6]))
    strict = load_config(models=["m"], methods="gradient", random_logit_threshold=0.5)
    assert verdict_table({"random-logit": logit}, CONFIG).verdict[0] == "pass"
    assert verdict_table({"random-logit": logit}, strict).verdict[0] == "fail: class-insensitive"


def test_twins_are_told_apart_by_the_optimizer_registry_and_compared_per_image():
    models = pd.DataFrame({"model": ["a-sgd", "a-bort", "a-adamw", "b-sgd", "x"],
                           "arch": ["a", "a", "a", "b", "SomeNet"],
                           "optimizer": ["sgd", "bort", "adamw", "sgd", "unknown"]})
    assert twins(models) == [("a-sgd", "a-bort"), ("a-adamw", "a-bort")]
    logit = pd.DataFrame(_per_image("gradient", [0.1, 0.2, 0.3, 0.4], model="a-sgd")
                         + _per_image("gradient", [0.2, 0.4, 0.6, 0.8], model="a-bort"))
    cmp = bort_comparison({"models": models.iloc[:2], "random-logit": logit})
    assert len(cmp) == 1 and cmp.test[0] == "random-logit"
    assert cmp.baseline_score[0] == 0.25 and cmp.bort_score[0] == 0.5 and cmp.median_difference[0] == 0.25
    assert 0 < cmp.wilcoxon_p[0] <= 1


def test_a_check_with_no_defined_score_makes_the_verdict_undefined():
    logit = pd.DataFrame(_per_image("gradient", [np.nan, np.nan]) + _per_image("lrp-zplus", [0.95, np.nan])
                         + _per_image("deeplift", [np.nan, np.nan]))
    cascade = pd.DataFrame(_per_image("deeplift", [0.9, 0.9], stage=2))
    v = verdict_table({"random-logit": logit, "cascading": cascade}, CONFIG).set_index("method")
    assert v.loc["gradient", "random_logit"] == "undefined"
    assert v.loc["gradient", "verdict"] == "undefined: random-logit (maps constant or non-finite)"
    assert v.loc["lrp-zplus", "verdict"] == "fail: class-insensitive"  # the one defined image decides
    assert v.loc["deeplift", "verdict"] == "fail: weight-insensitive"  # a failure outranks an undefined check


def test_each_comparison_names_its_score_and_which_values_are_better():
    models = pd.DataFrame({"model": ["a-sgd", "a-bort"], "arch": ["a", "a"], "optimizer": ["sgd", "bort"]})
    logit = pd.DataFrame(_per_image("gradient", [0.1, 0.2, 0.3], model="a-sgd")
                         + _per_image("gradient", [0.2, 0.3, 0.5], model="a-bort"))
    emprt = pd.DataFrame([{"model": m, "method": "gradient", "image": i, "stage": stage, "layer": "x",
                           "score": 1.0 + stage * (i + 1) * (2 if m == "a-bort" else 1)}
                          for m in ("a-sgd", "a-bort") for i in range(3) for stage in (0, 3)])
    cmp = bort_comparison({"models": models, "random-logit": logit, "emprt": emprt}).set_index("test")
    assert (cmp.loc["random-logit", "score"], cmp.loc["random-logit", "better"]) == ("SSIM", "lower")
    assert cmp.loc["emprt", "score"].startswith("eMPRT score") and cmp.loc["emprt", "better"] == "higher"
    assert cmp.loc["emprt", "baseline_score"] == 7.0 and cmp.loc["emprt", "bort_score"] == 13.0  # the last stage
