"""eMPRT: the entropy measure by hand, the controls, the plumbing against the randomization's own maps."""
import copy

import numpy as np
import pytest
import torch
from scipy import stats

from attributions.graph import trace
from audit import efficient_mprt, randomization_with_maps
from audit.checks.emprt import discrete_entropy, histograms
from audit.errors import ConfigError


def test_discrete_entropy_by_hand():
    maps = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    h = discrete_entropy(maps, n_bins=2)
    np.testing.assert_allclose(h, [np.log(2), np.log(2), 0.0], atol=1e-12)  # halves; halves; one bin
    np.testing.assert_allclose(discrete_entropy(maps[1:2], n_bins=4), [np.log(4)], atol=1e-12)
    g = torch.Generator().manual_seed(0)
    noisy = torch.randn(6, 12, 12, generator=g, dtype=torch.float64) ** 3
    peer = [stats.entropy(np.histogram(m.numpy().ravel(), bins=100)[0]) for m in noisy]  # scipy's, per map
    np.testing.assert_allclose(discrete_entropy(noisy), peer, rtol=1e-12)
    with pytest.raises(ConfigError, match="n_bins"):
        discrete_entropy(maps, n_bins=0)


@pytest.mark.parametrize("bins", [1, 2, 7, 100])
def test_histograms_equal_numpy_row_by_row(bins):
    rng = np.random.default_rng(0)
    rows = np.concatenate([rng.normal(size=(4, 300)) ** 3,  # heavy tails
                           rng.integers(0, 6, (3, 300)).astype(float),  # values on the edges
                           np.zeros((1, 300)), rng.uniform(size=(2, 300)) * 1e-12 + 5.0])  # constant; tiny range
    want = np.stack([np.histogram(r, bins=bins)[0] for r in rows])
    np.testing.assert_array_equal(histograms(rows, bins), want)


def test_efficient_mprt_controls_order_and_determinism(trained):
    model, x, y = trained
    before = copy.deepcopy(model.state_dict())
    methods = ["gradient", "lrp-zplus", "edge", "random"]
    df = efficient_mprt(model, x, y, methods, seed=0, progress=False)
    assert list(df.columns) == ["method", "stage", "layer", "image", "replicate", "entropy", "score", "share"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    layers = [n for n, _, _ in trace(model, x).weighted_layers()]
    assert df[df.method == "gradient"].drop_duplicates("stage").layer.tolist() == ["original"] + layers  # bottom-up
    assert (df[df.stage == 0].score == 0).all()
    assert (df[df.method == "edge"].score == 0).all()  # the model-independent map: exactly 0
    last = df[df.stage == df.stage.max()].groupby("method").score.median()
    assert 0 < abs(last["random"]) < last["gradient"]  # the gradient's entropy rises more than a random map's
    assert df.equals(efficient_mprt(model, x, y, methods, seed=0, progress=False))


def test_efficient_mprt_scores_the_randomization_maps(trained):
    # the same stages as parameter randomization (bottom-up): entropy of its kept heatmaps, by hand
    model, x, y = trained
    df = efficient_mprt(model, x, y, ["deeplift"], seed=3, n_bins=30, init="permute", progress=False)
    _, maps = randomization_with_maps(model, x, y, ["deeplift"], order="bottom-up", seed=3, progress=False,
                                      keep_maps=len(x), init="permute")
    h0 = np.array([discrete_entropy(torch.from_numpy(m)[None], 30)[0] for m in maps["deeplift"][0]])
    for stage in (1, maps["deeplift"].shape[0] - 1):
        h = np.array([discrete_entropy(torch.from_numpy(m)[None], 30)[0] for m in maps["deeplift"][stage]])
        got = df[(df.stage == stage)].sort_values("image").score.to_numpy()
        np.testing.assert_allclose(got, (h - h0) / h0, rtol=1e-12)


def test_efficient_mprt_without_the_curve_scores_the_same(trained):
    model, x, y = trained
    full = efficient_mprt(model, x, y, ["gradient", "edge"], seed=0, progress=False)
    short = efficient_mprt(model, x, y, ["gradient", "edge"], seed=0, progress=False, curve=False)
    assert sorted(short.stage.unique()) == [0, full.stage.max()]
    key = ["method", "stage", "image"]
    merged = short.merge(full, on=key, suffixes=("", "_full"))
    assert len(merged) == len(short) and np.array_equal(merged.score, merged.score_full, equal_nan=True)
