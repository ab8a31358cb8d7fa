"""Bootstrap intervals and per-method summaries of the result tables."""
import numpy as np
import pytest

from audit import summarize
from audit.errors import AuditError
from audit.measures.statistics import bootstrap_ci, cluster_median_ci, nested_median_ci


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



def test_the_cluster_bootstrap_of_a_pooled_median_resamples_images_not_values():
    """Against a brute-force cluster bootstrap (each resample pools the values of images drawn with replacement):
    the same interval up to one quantile bin. Resampling the values alone would be far narrower: the spread is
    between images."""
    rng = np.random.default_rng(1)
    shifts = rng.normal(0, 0.1, 16)
    values = np.concatenate([rng.normal(s, 0.05, 500) for s in shifts])
    images = np.repeat(np.arange(16), 500)
    est, low, high = cluster_median_ci(values, images, 0.99, n_resamples=4000)
    draws = rng.integers(0, 16, size=(4000, 16))
    brute = np.quantile([np.median(np.concatenate([values[images == i] for i in d])) for d in draws], [0.005, 0.995])
    width = high - low
    assert est == np.median(values)
    assert abs(low - brute[0]) < 0.05 * width and abs(high - brute[1]) < 0.05 * width
    _, naive_low, naive_high = bootstrap_ci(values, 0.99, n_resamples=2000)
    assert naive_high - naive_low < 0.2 * width


def test_the_cluster_interval_covers_the_pooled_median_at_about_its_level():
    """Simulated audits whose images' medians scatter around a known centre: the 90 % interval of 60 audits of
    20 images covers the population's pooled median in about 90 % of them (a binomial 99.9 % band for 60 draws)."""
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(60):
        centres = rng.normal(0.0, 1.0, 20)
        values = (centres[:, None] + rng.normal(0, 0.2, (20, 50))).ravel()
        _, low, high = cluster_median_ci(values, np.repeat(np.arange(20), 50), 0.9, n_resamples=1000, bins=400)
        covered += low <= 0.0 <= high  # the pooled median of the population: its symmetric centre
    assert 44 <= covered <= 59


def test_the_cluster_interval_refuses_mismatched_clusters_and_is_nan_without_values():
    with pytest.raises(AuditError, match="one non-negative integer cluster per value"):
        cluster_median_ci([0.1, 0.2], [0])
    assert all(np.isnan(cluster_median_ci([np.nan], [0])))


@pytest.mark.parametrize("sizes", [(2,) * 8, (8,) * 3, (3, 1, 5, 2)])
def test_the_nested_bootstrap_is_bit_for_bit_the_two_stage_draw_it_describes(sizes):
    """Each resample, written out one group at a time from the same random stream: the groups drawn, then each drawn
    group's values (the ``j``-th drawn value at floor(u x its size)), pooled, their median; the vectorised interval
    must be those numbers exactly, whether the groups are the same size or not."""
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    values = rng.normal(0, 1, len(groups))
    members = [values[groups == g] for g in range(len(sizes))]
    k, m, resamples = len(sizes), max(sizes), 300
    stream = np.random.default_rng(11)
    drawn = stream.integers(0, k, size=(resamples, k))
    u = stream.random((resamples, k, m))
    medians = [np.median(np.concatenate([members[g][(u[r, j, :sizes[g]] * sizes[g]).astype(np.int64)]
                                          for j, g in enumerate(drawn[r])])) for r in range(resamples)]
    low, high = np.quantile(medians, [0.05, 0.95])
    assert nested_median_ci(values, groups, 0.9, n_resamples=resamples, seed=11) == (np.median(values), low, high)


def test_the_nested_bootstrap_resamples_the_groups_then_the_values_in_each():
    """Against a brute-force two-stage bootstrap (draw the groups with replacement, then each drawn group's values
    with replacement, pool, take the median): the same interval within a few percent of its width. Where the
    groups' levels differ, the interval is wider than the plain bootstrap's over the values; one group gives the
    plain bootstrap's interval itself."""
    rng = np.random.default_rng(3)
    groups = np.arange(40) % 4
    values = rng.normal(0, 0.1, 40) + np.array([0.0, 0.3, 0.1, 0.25])[groups]
    est, low, high = nested_median_ci(values, groups, 0.95, n_resamples=4000, seed=1)
    members = [values[groups == g] for g in range(4)]
    brute = []
    for _ in range(4000):
        pooled = np.concatenate([members[g][rng.integers(0, 10, 10)] for g in rng.integers(0, 4, 4)])
        brute.append(np.median(pooled))
    want = np.quantile(brute, [0.025, 0.975])
    assert est == np.median(values)
    assert abs(low - want[0]) < 0.05 * (high - low) and abs(high - want[1]) < 0.05 * (high - low)
    _, plain_low, plain_high = bootstrap_ci(values, 0.95, n_resamples=4000, seed=1)
    assert high - low > 1.5 * (plain_high - plain_low)
    assert bootstrap_ci(values, 0.95, groups=groups, seed=1) == nested_median_ci(values, groups, 0.95, seed=1)
    assert bootstrap_ci(values, 0.95, groups=np.zeros(40), seed=1) == bootstrap_ci(values, 0.95, seed=1)
    with_nan = np.r_[values, np.nan]
    assert bootstrap_ci(with_nan, 0.95, groups=np.r_[groups, 9], seed=1) == nested_median_ci(values, groups, 0.95,
                                                                                            seed=1)
    with pytest.raises(AuditError, match="one group per value"):
        bootstrap_ci(values, groups=groups[:3])
    with pytest.raises(AuditError, match="median only"):
        bootstrap_ci(values, groups=groups, statistic=np.mean)
    assert np.isnan(nested_median_ci([np.nan], [0])[0])
