"""Bootstrap intervals and per-method summaries of the result tables."""
import numpy as np
import pytest

from audit import summarize
from audit.errors import AuditError
from audit.measures.statistics import bootstrap_ci


def test_summarize_gives_medians_with_intervals():
    import pandas as pd

    df = pd.DataFrame({"method": ["a"] * 50 + ["b"] * 50, "image": list(range(50)) * 2,
                       "ssim": np.r_[np.linspace(0, 1, 50), np.full(50, 0.3)]})
    s = summarize(df).set_index("method")
    assert s.loc["a", "ssim"] == pytest.approx(0.5) and s.loc["a", "ssim_low"] < 0.5 < s.loc["a", "ssim_high"]
    assert s.loc["b", "ssim_low"] == s.loc["b", "ssim_high"] == pytest.approx(0.3)
    assert s.loc["a", "n"] == 50
    with pytest.raises(AuditError, match="method column"):
        summarize(pd.DataFrame({"x": [1]}))



def test_bootstrap_ci():
    rng = np.random.default_rng(0)
    values = rng.normal(0.5, 0.1, 200)
    est, low, high = bootstrap_ci(values, level=0.99, seed=1)
    assert est == pytest.approx(np.median(values)) and low < est < high
    assert bootstrap_ci(values, seed=1) == (est, low, high)  # seeded: bit for bit
    narrow = bootstrap_ci(values, level=0.5, seed=1)
    assert narrow[2] - narrow[1] < high - low
    wide = bootstrap_ci(values[:20], level=0.99, seed=1)
    assert wide[2] - wide[1] > high - low
    assert np.isnan(bootstrap_ci([np.nan])[0])
    assert bootstrap_ci([1.0, np.nan, 3.0], seed=0)[0] == 2.0

