"""Measure sets: the toolkit's SSIM and HOG and Adebayo et al.'s, each against scikit-image and scipy computed the
way the set states; the rank correlations the same in both."""
import numpy as np
import pytest
import torch
from scipy import stats
from skimage.metrics import structural_similarity

from audit.errors import AuditError, ConfigError
from audit.measures.heatmaps import ComparableMaps, ReferenceMaps
from audit.measures.measure_sets import MEASURE_SETS, MeasureSet, measure_set
from audit.measures.similarity import hog_features, normalize_map


def _signed(n=3, size=20, seed=0):
    return torch.randn(n, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_adebayo_ssim_is_the_authors_call_on_maps_scaled_to_minus_one_one():
    """The first author's statement for the paper: both maps divided by their largest magnitude into [-1, 1], then
    scikit-image's SSIM with a 5 x 5 window and data range 2; no sign flip, so a map against its negation is far
    from 1 (the toolkit's flip-invariant SSIM gives 1 there)."""
    a, b = _signed(seed=0), _signed(seed=1)
    b = 0.7 * a + 0.3 * b
    got = ReferenceMaps(a, measures="adebayo2018").compare(b)["ssim"]
    scale = lambda m: (m / m.abs().max()).numpy()  # noqa: E731
    want = [structural_similarity(scale(x), scale(y), win_size=5, data_range=2.0) for x, y in zip(a, b)]
    np.testing.assert_allclose(got, want, rtol=1e-10)
    # a map against its negation: scikit-image's SSIM as it is, far from the flip-invariant toolkit's 1
    flipped = ReferenceMaps(a, measures="adebayo2018").compare(-a)["ssim"]
    np.testing.assert_allclose(flipped, [structural_similarity(scale(x), scale(-x), win_size=5, data_range=2.0)
                                         for x in a], rtol=1e-10)
    assert (flipped < 0.6).all()
    np.testing.assert_allclose(ReferenceMaps(a).compare(-a)["ssim"], 1.0, atol=1e-12)
    # the toolkit's: clipped at the 0.5 / 99.5 percentiles into [0, 1], data range 1, flip allowed (signed maps)
    toolkit = ReferenceMaps(a).compare(b)["ssim"]
    na, nb = normalize_map(a).numpy(), normalize_map(b).numpy()
    want = [max(structural_similarity(x, y, win_size=5, data_range=1.0),
                structural_similarity(x, 1.0 - y, win_size=5, data_range=1.0)) for x, y in zip(na, nb)]
    np.testing.assert_allclose(toolkit, want, rtol=1e-10)


def test_a_max_abs_heatmap_is_scaled_from_its_signed_channel_sum_under_adebayo():
    """"Without absolute values": a gradient's heatmap (max |.|, no sign) is compared through its signed map."""
    signed_a, signed_b = _signed(seed=2), _signed(seed=3)
    got = ReferenceMaps(signed_a.abs(), signed=signed_a, measures="adebayo2018").compare(
        ComparableMaps(signed_b.abs(), signed_b, "adebayo2018"))["ssim"]
    scale = lambda m: (m / m.abs().max()).numpy()  # noqa: E731
    want = [structural_similarity(scale(x), scale(y), win_size=5, data_range=2.0) for x, y in zip(signed_a, signed_b)]
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_hog_by_pearson_in_the_toolkit_and_by_spearman_under_adebayo():
    a, b = _signed(seed=4), _signed(seed=5)
    b = 0.5 * a + 0.5 * b
    fa, fb = hog_features(normalize_map(a)), hog_features(normalize_map(b))
    toolkit = ReferenceMaps(a).compare(b)["hog"]
    np.testing.assert_allclose(toolkit, [stats.pearsonr(x, y).statistic for x, y in zip(fa, fb)], rtol=1e-10)
    scale = lambda m: m / m.abs().amax(dim=(1, 2), keepdim=True)  # noqa: E731
    fa, fb = hog_features(scale(a)), hog_features(scale(b))
    adebayo = ReferenceMaps(a, measures="adebayo2018").compare(b)["hog"]
    np.testing.assert_allclose(adebayo, [stats.spearmanr(x, y).statistic for x, y in zip(fa, fb)], rtol=1e-10)


def test_the_rank_correlations_are_the_same_in_every_set():
    a, b = _signed(seed=6), _signed(seed=7)
    toolkit = ReferenceMaps(a).compare(b)
    adebayo = ReferenceMaps(a, measures=MEASURE_SETS["adebayo2018"]).compare(b)
    for column in ("spearman", "spearman_abs"):
        np.testing.assert_array_equal(toolkit[column], adebayo[column])


def test_sets_are_named_checked_and_never_mixed():
    assert measure_set("toolkit") is MEASURE_SETS["toolkit"]
    with pytest.raises(ConfigError, match="unknown measure set 'sixt'; valid: toolkit, adebayo2018"):
        measure_set("sixt")
    with pytest.raises(ConfigError, match="an odd window"):
        MeasureSet("mine", window=4)
    a = _signed()
    with pytest.raises(AuditError, match="prepared for the 'toolkit' measures cannot be compared with a reference "
                                         "prepared for 'adebayo2018'"):
        ReferenceMaps(a, measures="adebayo2018").compare(ComparableMaps(a))
