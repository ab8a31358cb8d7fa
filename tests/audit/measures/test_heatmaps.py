"""Comparable heatmaps: the signed maps behind the signed Spearman, the sign rule of the flip-invariant SSIM, and
what a map may follow without the model (the input's magnitude and edges), against scipy and scikit-image."""
import numpy as np
import pytest
import torch
from scipy import stats
from skimage.filters import sobel
from skimage.metrics import structural_similarity

from audit.measures.heatmaps import ComparableMaps, ReferenceMaps, follows, heatmaps, input_structure, signed_heatmaps
from audit.measures.similarity import map_signs, normalize_map, sign_flip_allowed


def _maps(n=4, c=3, size=16, seed=0):
    return torch.randn(n, c, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_the_signed_spearman_of_a_max_abs_method_reads_its_signed_channel_sum():
    """The gradient's heatmap is max |.| over channels, which has no sign: the signed ("diverging") Spearman of
    Adebayo et al. reads the signed channel sum instead. A map and its negation: signed -1, magnitudes 1."""
    g = _maps()
    model, twin = heatmaps({"gradient": g})["gradient"], heatmaps({"gradient": -g})["gradient"]
    assert signed_heatmaps({"gradient": g, "lrp-epsilon": g}).keys() == {"gradient"}  # a signed sum is kept as is
    own, other = signed_heatmaps({"gradient": g})["gradient"], signed_heatmaps({"gradient": -g})["gradient"]
    scores = ReferenceMaps(model, signed=own).compare(ComparableMaps(twin, other))
    np.testing.assert_allclose(scores["spearman"], -1.0, atol=1e-12)
    np.testing.assert_allclose(scores["spearman_abs"], 1.0, atol=1e-12)
    for i in range(len(g)):  # scipy on the maps themselves
        h = torch.randn(16, 16, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
        got = ReferenceMaps(model[i:i + 1], signed=own[i:i + 1]).compare(ComparableMaps(h[None].abs(), h[None]))
        assert got["spearman"][0] == pytest.approx(stats.spearmanr(own[i].ravel(), h.ravel())[0], abs=1e-12)
        assert got["spearman_abs"][0] == pytest.approx(stats.spearmanr(model[i].ravel(), h.abs().ravel())[0], abs=1e-12)


def test_ssim_flips_a_sign_only_between_maps_not_of_one_sign():
    """Two non-negative maps, one the other's contrast inversion, are different maps: no flip (scikit-image's
    plain SSIM). A signed map and its negation are one map up to the sign a rank-1 chain may flip: SSIM 1."""
    a = _maps(n=3, c=1)[:, 0]
    positive = a.abs()
    inverted = positive.amax(dim=(1, 2), keepdim=True) - positive  # non-negative too
    got = ReferenceMaps(positive).compare(inverted)["ssim"]
    x, y = normalize_map(positive).numpy(), normalize_map(inverted).numpy()
    for i in range(3):
        assert got[i] == pytest.approx(structural_similarity(x[i], y[i], win_size=5, data_range=1.0), abs=1e-9)
    assert (got < 0.5).all()
    np.testing.assert_allclose(ReferenceMaps(a).compare(-a)["ssim"], 1.0, atol=1e-12)
    # a non-negative map and a non-positive one: a sign apart, so flipped
    np.testing.assert_allclose(ReferenceMaps(positive).compare(-positive)["ssim"], 1.0, atol=1e-12)


def test_map_signs_and_the_pairs_that_may_flip():
    maps = torch.tensor([[[0.0, 1.0]], [[0.0, -2.0]], [[-1.0, 1.0]], [[0.0, 0.0]]])
    assert map_signs(maps).tolist() == [1, -1, 0, 1]
    a, b = np.array([1, 1, -1, 0, -1]), np.array([1, -1, -1, 1, 0])
    assert sign_flip_allowed(a, b).tolist() == [False, True, False, True, True]


def test_input_structure_ranks_the_inputs_magnitude_and_its_sobel_edges():
    x = _maps(n=2, c=3, size=12)
    structure = input_structure(x)
    maps = ComparableMaps(heatmaps({"gradient": _maps(n=2, c=3, size=12, seed=1)})["gradient"])
    got = follows(maps, structure)
    for i in range(2):
        magnitude = x[i].abs().amax(0).numpy()
        assert got["input_spearman_abs"][i] == pytest.approx(
            stats.spearmanr(maps.raw[i].ravel(), magnitude.ravel())[0], abs=1e-12)
        # the edge control's map: the Sobel magnitude per channel, max over channels; scikit-image's sobel
        # scales by 1/4 and normalises the magnitude, which ranks do not see (the border is reflected, not
        # replicated: the interior is compared)
        edges = np.max([np.hypot(*[sobel(x[i, c].numpy(), axis=k) for k in (0, 1)]) for c in range(3)], 0)
        ours = structure["edge_spearman_abs"][i].reshape(12, 12)
        inner = stats.spearmanr(ours[1:-1, 1:-1].ravel(), edges[1:-1, 1:-1].ravel())[0]
        assert inner == pytest.approx(1.0, abs=1e-9)
