"""The threshold sensitivity table: outcomes re-read at thresholds around the run's, derived by hand on
constructed scores; controls left out."""
import numpy as np
import pandas as pd

from audit.run.config import load_config
from reports.sensitivity import sensitivity_table, threshold_grid


def _table():
    rng = np.random.default_rng(0)
    rows = [{"model": "m", "method": method, "image": i, "ssim": level + rng.normal(0, 0.005)}
            for method, level in (("gradient", 0.45), ("guided-backprop", 0.9), ("edge", 1.0)) for i in range(30)]
    return pd.DataFrame(rows)


def test_outcomes_at_each_threshold_and_the_pairs_that_change():
    """The random-logit test at 0.5: the gradient's median 0.45 is below 0.5 (not rejected) and above 0.3 and 0.4
    (rejected there); guided backprop's 0.9 is rejected at every value; the edge control is not counted. The checks
    read on the controls' scale (cascading, data randomization) have no threshold and no rows."""
    config = load_config(models=["m"], methods="gradient,guided-backprop,edge", tests="random-logit",
                         random_logit_threshold=0.5)
    table = sensitivity_table({"random-logit": _table(), "data-randomization": _table().rename(
        columns={"ssim": "spearman_abs"})}, config).set_index("value")
    assert list(table.index) == [0.3, 0.4, 0.5, 0.6, 0.7] and table.loc[0.5, "run"]
    assert table.loc[0.5, ["rejected", "not rejected", "inconclusive"]].tolist() == [1, 1, 0]
    assert table.loc[0.4, "rejected"] == 2 and table.loc[0.4, "changed"] == "m/gradient: not rejected -> rejected"
    assert table.loc[0.7, "changed"] == "" and table.loc[0.7, "rejected"] == 1
    # where the run's threshold comes from, on its row only
    assert table.loc[0.5, "source"].startswith("Sixt et al. 2020") and table.loc[0.4, "source"] == ""


def test_the_grid_keeps_to_the_values_the_option_accepts():
    assert threshold_grid("csc", 0.99) == [0.79, 0.89, 0.99]  # the CSC threshold is at most 1
    assert threshold_grid("random-logit", 0.1) == [0.1, 0.2, 0.3]  # and above 0
    assert sensitivity_table({}, load_config(models=["m"], methods="gradient", tests="csc")).empty
