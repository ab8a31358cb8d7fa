"""Batched SSIM against scikit-image, normalisation, reduction, Spearman and HOG against scipy."""
import numpy as np
import pytest
import torch
from scipy import stats
from skimage.feature import hog
from skimage.metrics import structural_similarity

from audit.errors import AuditError, ConfigError
from audit.measures.heatmaps import ComparableMaps, ReferenceMaps
from audit.measures.similarity import (
    degenerate,
    hog_features,
    hog_similarity,
    local_means,
    normalize_map,
    ranks,
    reduce_map,
    screen,
    spearman,
    ssim,
)


def _pairs(n=5, size=28, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(n, size, size, generator=g, dtype=torch.float64)
    b = (a + 0.4 * torch.rand(n, size, size, generator=g, dtype=torch.float64)).clamp(0, 1)
    return a, b


@pytest.mark.parametrize("ours,theirs", [
    (dict(win_size=5), dict(win_size=5)),
    (dict(win_size=7), dict(win_size=7)),
    (dict(win_size=3), dict(win_size=3)),
    (dict(gaussian=True), dict(gaussian_weights=True, sigma=1.5)),
    (dict(win_size=5, use_sample_covariance=False), dict(win_size=5, use_sample_covariance=False)),
])
def test_ssim_matches_scikit_image(ours, theirs):
    a, b = _pairs()
    got = ssim(a, b, data_range=1.0, **ours).numpy()
    want = np.array([structural_similarity(x.numpy(), y.numpy(), data_range=1.0, **theirs) for x, y in zip(a, b)])
    assert np.abs(got - want).max() <= 1e-6


def test_ssim_data_range_and_rectangular_maps():
    a, b = _pairs(3, 28)
    a, b = 4 * a[:, :, :20], 4 * b[:, :, :20]
    want = [structural_similarity(x.numpy(), y.numpy(), data_range=4.0, win_size=5) for x, y in zip(a, b)]
    assert np.abs(ssim(a, b, data_range=4.0).numpy() - want).max() <= 1e-6


def test_flip_invariant_ssim_takes_the_better_sign():
    a, _ = _pairs(4)
    flipped = 1.0 - a
    assert (ssim(a, flipped) < 0.5).all()
    torch.testing.assert_close(ssim(a, flipped, flip_invariant=True), torch.ones(4, dtype=torch.float64))
    # On raw maps: normalising -m with symmetric clipping gives 1 - normalise(m).
    raw = torch.randn(4, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(normalize_map(-raw), 1 - normalize_map(raw))


@pytest.mark.parametrize("options", [dict(win_size=5), dict(gaussian=True), dict(win_size=3, flip_invariant=True)])
def test_ssim_with_the_first_maps_local_means_given_is_the_same(options):
    a, b = _pairs(6)
    means = local_means(a, **{k: v for k, v in options.items() if k != "flip_invariant"})
    assert torch.equal(ssim(a, b, a_means=means, **options), ssim(a, b, **options))
    with pytest.raises(AuditError, match="a_means"):
        ssim(a, b, a_means=means[:, :3], **options)


def test_screen_marks_the_degenerate_maps_and_zeroes_non_finite_values():
    maps = torch.rand(5, 6, 6, dtype=torch.float64)
    maps[1] = 0.25  # constant
    finite_mask, finite_maps = screen(maps)
    np.testing.assert_array_equal(finite_mask, degenerate(maps))
    np.testing.assert_array_equal(finite_mask, [False, True, False, False, False])
    assert torch.equal(finite_maps, maps)
    maps[2, 0, 0], maps[3, 1, 1] = float("nan"), float("-inf")
    mask, cleaned = screen(maps)
    np.testing.assert_array_equal(mask, [False, True, True, True, False])
    assert torch.isfinite(cleaned).all() and cleaned[2, 0, 0] == 0 and cleaned[3, 1, 1] == 0
    assert torch.equal(cleaned[4], maps[4])


def test_ssim_bad_shapes():
    with pytest.raises(AuditError, match="one shape"):
        ssim(torch.zeros(2, 8, 8), torch.zeros(2, 8, 9))
    with pytest.raises(AuditError, match="win_size"):
        ssim(torch.zeros(2, 4, 4), torch.zeros(2, 4, 4), win_size=5)


def test_normalize_map_clips_and_rescales():
    m = torch.arange(1000, dtype=torch.float64).reshape(1, 10, 100)
    m[0, 0, 0] = -1e6  # an outlier below the 0.5th percentile
    n = normalize_map(m)
    assert float(n.min()) == 0.0 and float(n.max()) == 1.0
    assert float(n[0, 0, 1]) == 0.0  # clipped together with the outlier
    assert float(normalize_map(torch.ones(1, 5, 5)).abs().max()) == 0.0


def test_reduce_map():
    maps = torch.tensor([[[[1.0]], [[-3.0]], [[0.5]]]])  # (1, 3, 1, 1)
    assert float(reduce_map(maps, "sum")) == -1.5 and float(reduce_map(maps, "max-abs")) == 3.0
    with pytest.raises(ConfigError, match="valid: sum, max-abs"):
        reduce_map(maps, "mean")


def test_spearman_and_hog_match_scipy():
    a, b = _pairs(3, 16)
    a[0, :4] = 0.0
    b[0, :4] = 0.0  # ties
    got = spearman(a, b)
    want = [stats.spearmanr(x.flatten(), y.flatten()).statistic for x, y in zip(a.numpy(), b.numpy())]
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert np.isnan(spearman(torch.ones(1, 4, 4), torch.rand(1, 4, 4)))[0]
    with_nan = a.clone()
    with_nan[1, 0, 0] = float("nan")
    assert np.isnan(spearman(with_nan, b)).tolist() == [False, True, False]
    h = hog_similarity(a, a)
    np.testing.assert_allclose(h, 1.0)
    other = torch.rand(3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert (hog_similarity(a, other) < 0.9).all()
    # Adebayo et al.'s HOG measure: the Pearson correlation of the two descriptors, as scipy computes it
    want = [stats.pearsonr(x, y).statistic for x, y in zip(hog_features(a), hog_features(other))]
    np.testing.assert_allclose(hog_similarity(a, other), want, rtol=1e-10)



def test_ranks_average_ties_as_scipy():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.integers(0, 4, (3, 40)), rng.normal(size=(2, 40))]).astype(float)
    np.testing.assert_array_equal(ranks(values), stats.rankdata(values, axis=1))


def test_tie_runs_at_row_ends_stay_in_their_row():
    # a run closing one row and a run opening the next hold the same value: two runs, not one
    values = np.array([[3.0, 1.0, 2.0, 2.0], [2.0, 2.0, 5.0, 4.0], [7.0, 7.0, 7.0, 7.0], [0.0, -0.0, 1.0, 0.0]])
    np.testing.assert_array_equal(ranks(values), stats.rankdata(values, axis=1))
    np.testing.assert_array_equal(ranks(values[:, :1]), np.ones((4, 1)))


def test_unit_ranks_give_scipy_spearman_with_ties_and_nan():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 5, (6, 30)).astype(float)
    b = np.where(rng.random((6, 30)) < 0.5, a, rng.integers(0, 5, (6, 30)))
    a[2, 7], b[4] = np.nan, 1.0  # a NaN row and a constant row: undefined
    got = spearman(a, b)
    want = [stats.spearmanr(x, y).statistic for x, y in zip(a, b)]
    np.testing.assert_allclose(np.delete(got, [2, 4]), np.delete(want, [2, 4]), rtol=1e-12)
    assert np.isnan(got[[2, 4]]).all()


def test_normalize_map_clips_at_torch_quantiles():
    g = torch.Generator().manual_seed(1)
    m = torch.randn(3, 17, 13, generator=g, dtype=torch.float64) ** 3
    flat = m.reshape(3, -1)
    q = torch.quantile(flat, torch.tensor([0.005, 0.995], dtype=flat.dtype), dim=1)
    clipped = flat.clamp(min=q[0][:, None], max=q[1][:, None])
    want = (clipped - q[0][:, None]) / (q[1] - q[0])[:, None]
    torch.testing.assert_close(normalize_map(m), want.reshape(m.shape), rtol=0, atol=1e-15)


@pytest.mark.parametrize("shape", [(4, 28, 28), (3, 16, 16), (2, 30, 22), (2, 64, 64)])
def test_hog_features_match_scikit_image(shape):
    g = torch.Generator().manual_seed(2)
    maps = normalize_map(torch.randn(*shape, generator=g, dtype=torch.float64))
    maps[0, : shape[1] // 3] = 0.0  # a flat region: zero gradients, empty bins
    cell = max(2, min(shape[1:]) // 4)
    want = np.stack([hog(m, orientations=9, pixels_per_cell=(cell, cell), cells_per_block=(2, 2))
                     for m in maps.numpy()])
    got = hog_features(maps)
    assert got.shape == want.shape
    # scikit-image sums each cell in single precision, pixel by pixel; ours sums in double, then rounds
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    ours = spearman(torch.from_numpy(got), torch.from_numpy(got[::-1].copy()))
    theirs = [stats.spearmanr(a, b).statistic for a, b in zip(want, want[::-1])]
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_reference_compares_stacked_sets_as_one_at_a_time():
    g = torch.Generator().manual_seed(3)
    reference = ReferenceMaps(torch.randn(3, 20, 20, generator=g, dtype=torch.float64))
    sets = [torch.randn(3, 20, 20, generator=g, dtype=torch.float64) for _ in range(3)]
    sets[1][0] = 0.0  # a degenerate map: NaN scores
    stacked = reference.compare(torch.cat(sets))
    for k, part in enumerate(sets):
        alone = reference.compare(ComparableMaps(part))
        for name, scores in alone.items():
            np.testing.assert_allclose(stacked[name][3 * k:3 * k + 3], scores, rtol=1e-12, equal_nan=True)
    assert np.isnan(stacked["ssim"][3]) and not np.isnan(stacked["ssim"][4])
    with pytest.raises(AuditError, match="multiple"):
        reference.compare(torch.cat(sets)[:4])


def test_reference_taken_from_a_prepared_batch_scores_as_one_prepared_alone():
    g = torch.Generator().manual_seed(4)
    batch = torch.randn(12, 20, 20, generator=g, dtype=torch.float64)
    batch[5] = 0.0
    prepared = ComparableMaps(batch)
    from_batch = ReferenceMaps(prepared, n=4).compare(prepared)
    alone = ReferenceMaps(batch[:4]).compare(batch)
    for name, scores in alone.items():
        np.testing.assert_array_equal(from_batch[name], scores)
    assert np.allclose(from_batch["spearman"][:4], 1.0) and np.isnan(from_batch["ssim"][5])


def test_hog_of_maps_too_small_for_two_cells_is_a_clear_error():
    with pytest.raises(AuditError, match="HOG needs maps of at least 4 x 4, got 3 x 3"):
        hog_features(torch.rand(1, 3, 3))
