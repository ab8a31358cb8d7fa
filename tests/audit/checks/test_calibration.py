"""The calibrated verdict on constructed per-image scores: the midpoint, on Fisher's z scale, between the control
twin's and the untrained model's similarity decides, each case derived by hand; without a separation of the
references by Cohen's small difference, the fixed threshold decides and the cell says why."""
import numpy as np
import pandas as pd
import pytest

from audit.checks.base import INCONCLUSIVE, NOT_REJECTED, REJECTED
from audit.checks.calibration import SMALLEST_GAP, Calibrated, fisher_z
from audit.checks.data_randomization import DataRandomizationOptions

RULE = Calibrated("score", "text", "survives", "data_randomization_threshold", score_name="Spearman of |map|")
OPTIONS = DataRandomizationOptions()


def _rows(twin, control, untrained, n=40, noise=0.02, seed=0):
    rng = np.random.default_rng(seed)
    jitter = lambda: rng.normal(0, noise, n)  # noqa: E731
    return pd.DataFrame({"image": np.arange(n), "spearman_abs": twin + jitter(),
                         "control_spearman_abs": control + jitter(), "untrained_spearman_abs": untrained + jitter()})


# control 0.8 and untrained 0.2: the midpoint on Fisher's z scale, tanh((atanh 0.8 + atanh 0.2) / 2) = 0.5266
MIDPOINT = float(np.tanh((np.arctanh(0.8) + np.arctanh(0.2)) / 2))


@pytest.mark.parametrize("twin, outcome", [(0.75, REJECTED), (0.25, NOT_REJECTED), (MIDPOINT, INCONCLUSIVE)])
def test_the_twin_is_judged_by_the_reference_it_lies_nearer_to(twin, outcome):
    """Control 0.8, untrained 0.2. A twin at 0.75 is nearer to the model that learned the labels (rejected:
    permuting them left the map as retraining would), at 0.25 nearer to the one that learned nothing; at the
    midpoint of the two on the z scale the interval holds 0."""
    part = _rows(twin, 0.8, 0.2, noise=0.0 if outcome != INCONCLUSIVE else 0.02)
    cell = RULE.evaluate(part, OPTIONS)
    assert cell.outcome == outcome, cell.text
    z = fisher_z(part[["spearman_abs", "control_spearman_abs", "untrained_spearman_abs"]].to_numpy())
    assert cell.score == pytest.approx(np.median(z[:, 0] - (z[:, 1] + z[:, 2]) / 2))
    assert "twin" in cell.text and "control 0.8" in cell.text


def test_differences_of_correlations_are_read_on_fishers_z_scale():
    """Near 1, correlations crowd together: a twin at 0.955 between a control at 0.99 and an untrained model at 0.90
    is above their arithmetic midpoint 0.945, yet on z (1.886 against 2.647 and 1.472, midpoint 2.059) it is nearer
    the untrained model: not rejected."""
    assert (np.arctanh(0.99) + np.arctanh(0.90)) / 2 == pytest.approx(2.0594, abs=1e-4)
    assert np.arctanh(0.955) == pytest.approx(1.8857, abs=1e-4)
    assert RULE.evaluate(_rows(0.955, 0.99, 0.90, noise=0.0), OPTIONS).outcome == NOT_REJECTED


def test_the_fixed_threshold_is_named_where_it_disagrees():
    """A twin at 0.4 between control 0.45 and untrained 0.1 is rejected by the references (0.4 > 0.275) while the
    fixed threshold 0.5 would not reject it: the cell says both."""
    cell = RULE.evaluate(_rows(0.4, 0.45, 0.1, noise=0.0), OPTIONS)
    assert cell.outcome == REJECTED and cell.text.endswith("fixed threshold 0.5: not rejected")
    agreeing = RULE.evaluate(_rows(0.9, 0.95, 0.1, noise=0.0), OPTIONS)
    assert agreeing.outcome == REJECTED and "fixed threshold" not in agreeing.text


@pytest.mark.parametrize("level, outcome", [(1.0, REJECTED), (0.0, NOT_REJECTED)])
def test_without_a_reference_gap_the_fixed_threshold_decides_and_says_why(level, outcome):
    """The edge detector (the same map on every model: all 1) and the random map (all 0) give no gap between the
    control and the untrained model: nothing to calibrate against."""
    cell = RULE.evaluate(_rows(level, level, level, noise=0.0 if level == 1.0 else 0.02), OPTIONS)
    assert cell.outcome == outcome
    assert "fixed threshold: the control twin and an untrained model do not separate" in cell.text


def test_a_gap_smaller_than_cohens_small_difference_does_not_calibrate():
    """0.910 against 0.905 on 40 images without noise: a detectable gap of z 0.03, under Cohen's small difference
    0.1: the references do not separate, and the fixed threshold decides."""
    assert np.arctanh(0.910) - np.arctanh(0.905) < SMALLEST_GAP
    cell = RULE.evaluate(_rows(0.906, 0.910, 0.905, noise=0.0), OPTIONS)
    assert cell.outcome == REJECTED and "do not separate, z gap 0.03" in cell.text


def test_a_fallback_is_final_only_where_the_gap_cannot_reach_the_smallest_difference():
    """A gap of z 0.03 on 40 noiseless images: its interval lies wholly under 0.1, the fallback is final. The same
    references 0.1 apart on z with noise on 8 images: the gap's interval reaches over 0.1, the fixed threshold
    decides for now, and a sequential run reads another look (not final). A calibrated cell is final."""
    assert RULE.evaluate(_rows(0.906, 0.910, 0.905, noise=0.0), OPTIONS).final
    control = float(np.tanh(np.arctanh(0.6) + SMALLEST_GAP))
    provisional = RULE.evaluate(_rows(0.9, control, 0.6, n=8, noise=0.05, seed=3), OPTIONS)
    assert "do not separate" in provisional.text and provisional.outcome == REJECTED and not provisional.final
    assert RULE.evaluate(_rows(0.75, 0.8, 0.2, noise=0.0), OPTIONS).final


def test_without_a_control_twin_the_fixed_threshold_decides():
    part = _rows(0.9, np.nan, np.nan)
    cell = RULE.evaluate(part, OPTIONS)
    assert cell.outcome == REJECTED and cell.text.endswith("fixed threshold: no control twin")
    assert RULE.evaluate(part.drop(columns=["control_spearman_abs", "untrained_spearman_abs"]), OPTIONS).outcome \
        == REJECTED
    # a paired comparison of two models reads the scores against the twin, not the calibrated differences
    assert RULE.per_image(part).tolist() == part.spearman_abs.tolist()


def test_too_few_defined_images_are_inconclusive():
    part = _rows(0.9, 0.95, 0.1)
    part.loc[:30, "control_spearman_abs"] = np.nan
    assert RULE.evaluate(part, OPTIONS).outcome == INCONCLUSIVE
