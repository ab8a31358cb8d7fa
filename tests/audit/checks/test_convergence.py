"""Cosine-similarity convergence: the exact baseline, the rank-1 theory, replication on real models."""
import numpy as np
import pandas as pd
import pytest
import torch

from attributions import Explainer, memory
from attributions.graph import trace
from audit import (
    chain_convergence,
)
from audit.checks.convergence import COLUMNS as CSC_COLUMNS
from audit.checks.convergence import (
    layer_inputs,
    pairwise_abs_cos,
    random_cosine_median,
    signal_plan,
)
from audit.errors import AuditError, ConfigError
from audit.models import build

ZPLUS_FAMILY = ["lrp-zplus", "lrp-alpha1beta0", "deep-taylor", "excitation-backprop", "deeplift-ablation"]


def _first_wide_conv_input(model, x, ex_layers_inputs, width=16):
    graph = trace(model, x)
    for node in graph.nodes:
        if node.kind == "conv" and node.module.in_channels >= width:
            return ex_layers_inputs[node.name]
    raise AssertionError("no conv with enough input channels")


def test_random_cosine_baseline_is_exact():
    assert random_cosine_median(3) == pytest.approx(0.5, abs=1e-12)  # 0.6745 / sqrt(3) would say 0.39
    g = torch.Generator().manual_seed(0)
    for d in (2, 10, 64):
        v = torch.randn(2, 200_000, d, generator=g, dtype=torch.float64)
        cos = ((v[0] * v[1]).sum(1) / (v[0].norm(dim=1) * v[1].norm(dim=1))).abs()
        assert random_cosine_median(d) == pytest.approx(float(cos.median()), abs=0.005)
    assert random_cosine_median(1) == 1.0


def test_theory_nonnegative_products_converge_gaussian_products_do_not():
    g = torch.Generator().manual_seed(0)
    k = 8

    def chain_cos(d, factors, make):
        r = torch.randn(k, d, generator=g, dtype=torch.float64)
        for _ in range(factors):
            r = r @ make(d)
        return float(np.median(pairwise_abs_cos(r[:, None, :])))

    def nonneg(d):
        return torch.rand(d, d, generator=g, dtype=torch.float64)

    def gaussian(d):
        return torch.randn(d, d, generator=g, dtype=torch.float64) / d ** 0.5

    assert chain_cos(32, 20, nonneg) >= 0.999
    assert chain_cos(256, 20, nonneg) >= 0.999
    # Gaussian products align only slowly (their Lyapunov spectrum spreads): far from rank 1 after
    # 20 factors in a wide layer, and near the random baseline after a few.
    assert chain_cos(256, 20, gaussian) < 0.3
    assert chain_cos(256, 3, gaussian) < 2.5 * random_cosine_median(256)


def test_csc_replication_on_a_random_init_vgg():
    torch.manual_seed(0)
    model = build("vgg").eval()
    x = torch.rand(8, 1, 28, 28)
    df = chain_convergence(model, x, None, ZPLUS_FAMILY + ["gradient", "deeplift", "lrp-z"], progress=False)
    assert list(df.columns) == CSC_COLUMNS
    from attributions import Explainer
    layer = _first_wide_conv_input(model, x, layer_inputs(Explainer(model, "gradient", graph=trace(model, x))))
    at = df[(df.inject_at == "classifier.6") & (df.layer == layer)].set_index("method")
    assert at.loc["gradient", "channels"] == 16
    for m in ZPLUS_FAMILY:
        assert at.loc[m, "median"] >= 0.99 and at.loc[m, "collapsed"], (m, at.loc[m, "median"])
        assert at.loc[m, "sigma2_over_sigma1"] < 0.05 and at.loc[m, "effective_rank"] < 1.2
    assert at.loc["gradient", "median"] <= 2 * at.loc["gradient", "baseline"]
    assert at.loc["gradient", "baseline"] == pytest.approx(random_cosine_median(10))  # min(16 channels, 10 logits)
    for m in ("deeplift", "lrp-z"):
        assert at.loc[m, "median"] < 0.99 and not at.loc[m, "collapsed"]
    assert set(df.inject_at) == {"classifier.6", "features.17", "features.11"}


def test_csc_is_reproducible_and_checks_its_input():
    torch.manual_seed(0)
    model = build("cnn").eval()
    x = torch.rand(3, 1, 28, 28)
    a = chain_convergence(model, x, None, "lrp-epsilon,gradient", inject_at="classifier.0", progress=False)
    b = chain_convergence(model, x, None, ["lrp-epsilon", "gradient"], inject_at="classifier.0", progress=False)
    assert a.equals(b)
    with pytest.raises(AuditError, match="unknown layer 'fc9'"):
        chain_convergence(model, x, None, "gradient", inject_at="fc9", progress=False)
    with pytest.raises(AuditError, match="NaN"):
        chain_convergence(model, x * float("nan"), None, "gradient", progress=False)
    with pytest.raises(ConfigError, match="unknown attribution method"):
        chain_convergence(model, x, None, "gradients", progress=False)
    with pytest.raises(AuditError, match="not a backward chain|none of"):
        chain_convergence(model, x, None, "integrated-gradients", progress=False)



def test_csc_on_transformers_compares_token_vectors_and_injects_at_the_class_token():
    from tests.engine_zoo import zoo_model

    torch.manual_seed(0)
    model = zoo_model("vit_mha").float()
    x = torch.rand(4, 1, 8, 8)
    df = chain_convergence(model, x, None, ["gradient", "lrp-zplus"], progress=False)
    assert set(df.inject_at) == {"head", "add#2[0]"}  # the logits, and the class token of the block output
    tokens = df[df.layer.isin(["norm2", "cat", "attn.mha.linear#1"])]  # linear#1: the output projection
    assert set(tokens.channels) == {8}  # a token's 8-vector, not the 5 tokens of a channel
    assert set(df[df.layer == "attn.mha.linear"].channels) == {24}  # the packed q, k, v projection
    per_head = df[df.layer == "attn.mha.attention"]
    assert set(per_head.channels) == {4}  # per head and token: the head's width
    # the class-token injection reaches 8-vectors: the baseline is in dimension min(8, 8)
    assert np.allclose(df[df.inject_at == "add#2[0]"].query("channels == 8").baseline, random_cosine_median(8))
    assert df.loc[df.is_logits & (df.method == "lrp-zplus") & (df.layer == "attn.mha.attention.scores"), "median"].isna().all()


def test_attention_rollout_is_a_product_of_stochastic_matrices_and_collapses():
    """Sixt et al.'s argument applied to rollout: each block's operator is non-negative and row-stochastic, so the
    product of eight of them maps every vector to one direction (|cos| -> 1, sigma2 / sigma1 -> 0), whatever the
    weights; generic attention's operators I + mean_h[(grad A * A)+] stay near the identity and do not."""
    from tests.attributions.test_attention_maps import TinyViT

    torch.manual_seed(0)
    model = TinyViT(depth=8).double().eval()
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    df = chain_convergence(model, x, None, ["attention-rollout", "generic-attention"], progress=False)
    rollout = df[df.method == "attention-rollout"].sort_values("depth", ascending=False)
    assert list(rollout.layer) == [f"blocks.{i}.softmax" for i in range(7, -1, -1)] and rollout.is_logits.all()
    assert rollout["median"].is_monotonic_increasing and rollout["median"].iloc[-1] > 0.99
    assert rollout.sigma2_over_sigma1.iloc[-1] < 0.02 and rollout.collapsed.iloc[-1]
    generic = df[df.method == "generic-attention"]
    assert (generic["median"] < 2 * generic.baseline).all() and not generic.collapsed.any()
    # the operators the chain multiplies: non-negative and row-stochastic, one per block
    ex = Explainer(model, "attention-rollout")
    nodes, operators, _ = ex.method.engine.operators(ex, x, [None])
    assert len(nodes) == 8
    for op in operators:
        assert bool((op >= 0).all()) and torch.allclose(op.sum(-1), torch.ones_like(op[..., 0]))


def test_spectra_are_scale_free_and_leave_out_non_finite_signals():
    from audit.checks.convergence import image_spectra

    gen = torch.Generator().manual_seed(0)
    signal = torch.randn(6, 3, 5, 7, generator=gen, dtype=torch.float64)  # K, B, ...
    ratio, rank = image_spectra(signal)
    big = signal * torch.tensor([1e200, 1.0, 1e-200], dtype=torch.float64)[None, :, None, None]
    big_ratio, big_rank = image_spectra(big)  # the plain Gram matrix of the first image overflows
    np.testing.assert_allclose(big_ratio, ratio, rtol=1e-12)
    np.testing.assert_allclose(big_rank, rank, rtol=1e-12)
    signal[2, 1, 0, 0] = float("inf")
    signal[:, 2] = 0.0
    kept_ratio, _ = image_spectra(signal)
    np.testing.assert_allclose(kept_ratio, ratio[:1], rtol=1e-12)  # image 1 non-finite, image 2 zero
    assert 0 < ratio.min() and ratio.max() < 1


def test_the_signal_plan_chunks_images_then_splits_layers_under_a_budget():
    # an image costs its forward pass (100 bytes) plus 2.5 K = 20 times its recorded signals (60 bytes)
    recorded = {"a": 10, "b": 20, "c": 30}
    assert signal_plan(4, 100, recorded, 8) == (4, [{"a", "b", "c"}])  # no budget
    with memory.limit(3000):
        assert signal_plan(4, 100, recorded, 8) == (2, [{"a", "b", "c"}])
    with memory.limit(1300):
        assert signal_plan(4, 100, recorded, 8) == (1, [{"a", "b", "c"}])
    with memory.limit(1000):  # one image does not fit: from the output down, c (600), then b and a (400 + 200)
        assert signal_plan(4, 100, recorded, 8) == (1, [{"c"}, {"a", "b"}])
    with memory.limit(1):  # each layer alone
        assert signal_plan(4, 100, recorded, 8) == (1, [{"c"}, {"b"}, {"a"}])


def test_the_collapse_verdict_reads_each_layers_interval_and_passes_over_layers_without_one():
    from audit.checks.convergence import Collapse, ConvergenceOptions

    def chain(*layers):  # (median, low, high) from the input (depth 0) up
        return pd.DataFrame([{"is_logits": True, "layer": f"l{d}", "depth": d, "median": m, "median_low": lo,
                              "median_high": hi} for d, (m, lo, hi) in enumerate(layers)])
    options, rule = ConvergenceOptions(), Collapse()
    nan = float("nan")
    assert rule.evaluate(chain((0.995, 0.991, 0.998), (0.5, 0.4, 0.6)), options).outcome == "rejected"
    unsure = rule.evaluate(chain((0.990, 0.986, 0.993), (nan, nan, nan), (0.5, 0.4, 0.6)), options)
    assert unsure.outcome == "inconclusive" and unsure.text == "inconclusive (at l0: 0.990 [0.986, 0.993]; 0.990 at " \
                                                               "the input)"
    # a layer no signal reached (attention scores under a held gate) has no median: passed over
    assert rule.evaluate(chain((0.9, 0.85, 0.95), (nan, nan, nan)), options).outcome == "not rejected"
    assert rule.evaluate(chain((nan, nan, nan)), options).outcome is None
