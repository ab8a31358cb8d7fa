"""The data-randomization verdict on constructed per-image scores, each case derived by hand: the untrained copy
and the twin read on the controls' scale (midpoint 0.5 between the measure's own ends 1 and 0, or between the
controls' measured scores), then the midpoint, on Fisher's z scale, between the control twin's and the untrained
model's similarity where they separate by Cohen's small difference. No case reads a fixed threshold."""
import numpy as np
import pandas as pd
import pytest

from audit.checks.base import INCONCLUSIVE, NOT_REJECTED, REJECTED
from audit.checks.calibration import SMALLEST_GAP, Calibrated, OnScale, fisher_z
from audit.checks.data_randomization import DataRandomizationOptions

RULE = Calibrated("score", "text", "survives", score_name="Spearman of |map|")
OPTIONS = DataRandomizationOptions()


def _rows(twin, control, untrained, n=40, noise=0.02, seed=0):
    rng = np.random.default_rng(seed)
    jitter = lambda: rng.normal(0, noise, n)  # noqa: E731
    return pd.DataFrame({"image": np.arange(n), "spearman_abs": twin + jitter(),
                         "control_spearman_abs": control + jitter(), "untrained_spearman_abs": untrained + jitter()})


def _controls(unchanged, unrelated, n=16):
    """Control rows: the edge map scoring ``unchanged`` and the random map ``unrelated`` on every image."""
    return pd.DataFrame({"method": ["edge"] * n + ["random"] * n, "image": list(range(n)) * 2,
                         "spearman_abs": [unchanged] * n + [unrelated] * n})


# control 0.45 and untrained 0.05, both nearer the unrelated end than 0.5: the midpoint on Fisher's z scale,
# tanh((atanh 0.45 + atanh 0.05) / 2) = 0.2612; their z gap atanh 0.45 - atanh 0.05 = 0.435 separates them
MIDPOINT = float(np.tanh((np.arctanh(0.45) + np.arctanh(0.05)) / 2))


@pytest.mark.parametrize("twin, outcome", [(0.40, REJECTED), (0.10, NOT_REJECTED), (MIDPOINT, INCONCLUSIVE)])
def test_the_twin_is_judged_by_the_reference_it_lies_nearer_to(twin, outcome):
    """Control 0.45, untrained 0.05. A twin at 0.40 is nearer to the model that learned the labels (rejected:
    permuting them left the map as retraining would), at 0.10 nearer to the one that learned nothing; at the
    midpoint of the two on the z scale the interval holds it."""
    assert MIDPOINT == pytest.approx(0.2612, abs=1e-4) and np.arctanh(0.45) - np.arctanh(0.05) > SMALLEST_GAP
    part = _rows(twin, 0.45, 0.05, noise=0.0 if outcome != INCONCLUSIVE else 0.02)
    cell = RULE.evaluate(part, OPTIONS)
    assert cell.outcome == outcome, cell.text
    assert cell.score == pytest.approx(np.median(part.spearman_abs))
    assert "nearer the control than the untrained copy" in cell.text and "control 0.4" in cell.text


def test_differences_of_correlations_are_read_on_fishers_z_scale():
    part = _rows(0.3, 0.45, 0.05)
    z = fisher_z(part[["spearman_abs", "control_spearman_abs", "untrained_spearman_abs"]].to_numpy())
    assert np.allclose(RULE.differences(part), z[:, 0] - (z[:, 1] + z[:, 2]) / 2)


def test_a_map_an_untrained_copy_reproduces_is_rejected_whatever_the_twin():
    """Integrated gradients on cnn-sgd: twin 0.908, control 0.910, untrained 0.907. The references do not separate,
    and the twin lies nearer the untrained copy than the control; but an untrained copy keeps 0.91 of the map's
    ranking, nearer the unchanged end (1) than the unrelated end (0): the map does not depend on what the model
    learned."""
    cell = RULE.evaluate(_rows(0.908, 0.910, 0.907, noise=0.005), OPTIONS)
    assert cell.outcome == REJECTED and cell.reason.startswith("an untrained copy keeps the map")


def test_where_the_references_sit_at_the_unrelated_end_the_twins_place_decides():
    """The gradient on cnn-sgd: control 0.118, untrained 0.117, twin 0.11: the map changes as much under a retrain
    as under permutation; the twin lies nearer the unrelated end: not rejected, and the cell says the references do
    not separate. The gap's interval lies wholly under Cohen's small difference: final."""
    cell = RULE.evaluate(_rows(0.11, 0.118, 0.117, noise=0.0), OPTIONS)
    assert cell.outcome == NOT_REJECTED and cell.final
    assert "do not separate (z gap 0.00" in cell.text and "as much as with the labels" in cell.text


@pytest.mark.parametrize("level, outcome", [(1.0, REJECTED), (0.0, NOT_REJECTED)])
def test_the_controls_get_the_outcomes_they_must_have(level, outcome):
    """The edge detector (the same map on every model: all 1) is rejected by its untrained copy; the random map
    (all about 0) is not rejected."""
    cell = RULE.evaluate(_rows(level, level, level, noise=0.0 if level == 1.0 else 0.02), OPTIONS)
    assert cell.outcome == outcome, cell.text


def test_a_gap_still_open_on_few_images_is_not_final():
    """References 0.1 apart on z with noise on 8 images: the gap's interval reaches over 0.1, so a sequential run
    reads another look (not final); the twin's own reading stands meanwhile."""
    control = float(np.tanh(np.arctanh(0.2) + SMALLEST_GAP))
    provisional = RULE.evaluate(_rows(0.1, control, 0.2, n=8, noise=0.05, seed=3), OPTIONS)
    assert "do not separate" in provisional.text and not provisional.final
    assert RULE.evaluate(_rows(0.40, 0.45, 0.05, noise=0.0), OPTIONS).final


@pytest.mark.parametrize("twin, outcome", [(0.9, REJECTED), (0.1, NOT_REJECTED)])
def test_without_a_control_twin_the_twin_is_read_on_the_scale(twin, outcome):
    part = _rows(twin, np.nan, np.nan)
    cell = RULE.evaluate(part, OPTIONS)
    assert cell.outcome == outcome and "no control twin" in cell.text
    assert RULE.evaluate(part.drop(columns=["control_spearman_abs", "untrained_spearman_abs"]), OPTIONS).outcome \
        == outcome
    # a paired comparison of two models reads the scores against the twin
    assert RULE.per_image(part).tolist() == part.spearman_abs.tolist()


def test_the_scale_is_the_controls_where_they_ran():
    """The random map scoring 0.3 and the edge map 1.0 put the midpoint at 0.65: a twin at 0.6 without a control
    twin lies nearer the unrelated end (not rejected), where the measure's own ends (midpoint 0.5) would reject."""
    part = _rows(0.6, np.nan, np.nan, noise=0.0)
    measured = RULE.evaluate(part, OPTIONS, controls=_controls(1.0, 0.3))
    assert measured.outcome == NOT_REJECTED and "no controls run" not in measured.text
    assert RULE.scale(_controls(1.0, 0.3)).midpoint == pytest.approx(0.65)
    assert RULE.evaluate(part, OPTIONS).outcome == REJECTED
    # controls that do not order (the edge below the random map) are no scale: the measure's own ends stand
    assert "no controls run" in RULE.evaluate(part, OPTIONS, controls=_controls(0.2, 0.3)).text


def test_a_side_measure_is_read_on_its_own_scale():
    rule = OnScale("s", "t", "survives", metric="spearman_abs")
    assert rule.reads == ()
    assert rule.evaluate(_rows(0.6, 0, 0, noise=0.0), OPTIONS).outcome == REJECTED
    assert rule.evaluate(_rows(0.6, 0, 0, noise=0.0), OPTIONS, controls=_controls(1.0, 0.3)).outcome == NOT_REJECTED


def test_too_few_defined_images_are_inconclusive():
    part = _rows(0.1, 0.45, 0.05)
    part.loc[:30, "control_spearman_abs"] = np.nan
    assert RULE.evaluate(part, OPTIONS).outcome == INCONCLUSIVE
