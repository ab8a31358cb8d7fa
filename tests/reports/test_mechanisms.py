"""The mechanisms a rejection is named for, derived on constructed cases (a rank-1 chain, a sparse full-rank one,
an input multiplier) and on the shipped CNN's measurements."""
import numpy as np
import pandas as pd
import pytest
import torch

from audit import chain_convergence, embedded_sample, load_checkpoint, random_logit_test
from audit.checks.convergence import image_spectra, pairwise_abs_cos, pairwise_abs_cos_by_image, rank_one_ratio
from audit.measures.statistics import cluster_median_ci
from audit.run.config import load_config
from reports.mechanisms import check_mechanisms, follows_input, rank_one


def _csc_row(method: str, signal: torch.Tensor) -> pd.DataFrame:
    """One CSC row at the input from signals (K, B, C, H, W), through the check's own measures."""
    cos, images = pairwise_abs_cos_by_image(signal)
    _, low, high = cluster_median_ci(cos, images)
    ratio, directions = image_spectra(signal)
    return pd.DataFrame([{"model": "m", "method": method, "is_logits": True, "layer": "l0", "depth": 0,
                          "median": float(np.median(cos)), "median_low": low, "median_high": high,
                          "sigma2_over_sigma1": float(np.median(ratio)), "effective_rank": float(np.median(directions))}])


def test_a_rank_one_chain_and_a_sparse_full_rank_one_both_reach_csc_1_and_only_one_is_rank_1():
    gen = torch.Generator().manual_seed(0)
    k, b, c, h, w = 8, 4, 6, 5, 5
    direction = torch.rand(b, c, h, w, generator=gen, dtype=torch.float64)
    rank1 = torch.randn(k, 1, 1, 1, 1, generator=gen, dtype=torch.float64) * direction  # s_k = a_k c
    # one channel alive per position, its value drawn anew for every vector: every channel vector is 1-sparse
    alive = torch.nn.functional.one_hot(torch.randint(0, c, (b, h, w), generator=gen), c).permute(0, 3, 1, 2)
    sparse = torch.randn(k, b, 1, h, w, generator=gen, dtype=torch.float64) * alive
    for signal in (rank1, sparse):
        assert np.allclose(pairwise_abs_cos(signal), 1.0)
    holds, text = rank_one(_csc_row("lrp-zplus", rank1), "m", "lrp-zplus", 0.99)
    assert holds and "sigma2/sigma1 0.000" in text
    holds, text = rank_one(_csc_row("lrp-zplus", sparse), "m", "lrp-zplus", 0.99)
    ratio = float(text.split("sigma2/sigma1 ")[1].split(" ")[0])
    assert holds is False and ratio > rank_one_ratio(0.99)
    # a nonlinear pass is outside Theorem 1 whatever its signals
    assert rank_one(_csc_row("guided-backprop", rank1), "m", "guided-backprop", 0.99)[0] is False


def test_the_spectrum_bound_is_the_ratio_at_which_two_directions_reach_the_threshold():
    """Simulated: a chain with singular values 1 and the bound maps Gaussian vectors to signals whose median
    |cos| is the threshold."""
    rng = np.random.default_rng(0)
    for threshold in (0.9, 0.99):
        rho = rank_one_ratio(threshold)
        a = rng.standard_normal((4, 400_000))
        first, second = np.stack([a[0], rho * a[1]]), np.stack([a[2], rho * a[3]])
        cos = np.abs((first * second).sum(0)) / np.linalg.norm(first, axis=0) / np.linalg.norm(second, axis=0)
        assert np.median(cos) == pytest.approx(threshold, abs=1e-3)  # the simulation's own error: about 3e-4
    assert rank_one_ratio(0.99) == pytest.approx(0.0716, abs=1e-4)
    assert rank_one_ratio(0.5) == 1.0  # two equal directions already reach it


@pytest.fixture(scope="module")
def measured():
    x, y = embedded_sample()
    x, y = torch.from_numpy(x[::125]), torch.from_numpy(y[::125])
    model = load_checkpoint("cnn-sgd")
    csc = chain_convergence(model, x, y, ["gradient", "lrp-zplus", "rectgrad"], progress=False).assign(model="m")
    logit = random_logit_test(model, x, y, ["gradient", "input-x-gradient", "lrp-zplus", "random", "edge"],
                              progress=False).assign(model="m")
    return {"csc": csc, "random-logit": logit}


def test_on_the_shipped_cnn_z_plus_is_rank_1_rectgrad_and_the_gradient_are_not(measured):
    csc = measured["csc"]
    assert rank_one(csc, "m", "lrp-zplus", 0.99)[0] is True
    assert rank_one(csc, "m", "rectgrad", 0.99)[0] is False
    assert rank_one(csc, "m", "gradient", 0.99)[0] is False


def test_an_input_multiplier_follows_the_input_more_than_the_gradient_and_the_random_map_does_not(measured):
    logit = measured["random-logit"]
    assert follows_input(logit, "m", "input-x-gradient", lambda rows: rows)[0] is True
    assert follows_input(logit, "m", "random", lambda rows: rows)[0] is False
    assert follows_input(logit, "m", "gradient", lambda rows: rows)[0] is None  # the reference itself
    config = load_config(models=["m"], methods="gradient,input-x-gradient,lrp-zplus", tests="csc,random-logit")
    assert check_mechanisms("random-logit", "m", "input-x-gradient", measured, config) == ["input multiplier"]
    # z+ on the random logit: both hold; surviving label permutation is never put down to chain convergence
    both = check_mechanisms("random-logit", "m", "lrp-zplus", measured, config)
    assert both == ["rank-1 chain convergence", "input multiplier"]
    twin = measured["random-logit"].assign()  # the same columns as the data-randomization table's
    permuted = check_mechanisms("data-randomization", "m", "lrp-zplus", measured | {"data-randomization": twin},
                                config)
    assert permuted == ["input multiplier"]
