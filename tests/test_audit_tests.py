"""The audit tests: CSC theory and replication, random-logit, parameter randomization, summaries."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from audit import chain_convergence, parameter_randomization, random_logit_test, summarize
from audit.convergence import COLUMNS as CSC_COLUMNS
from audit.convergence import layer_inputs, pairwise_abs_cos, random_cosine_median
from audit.errors import AuditError, ConfigError
from audit.random_logit import random_classes
from audit.randomization import parameterised_layers, randomization_stages
from audit.zoo import build

ZPLUS_FAMILY = ["lrp-zplus", "lrp-alpha1beta0", "deep-taylor", "excitation-backprop", "deeplift-ablation"]


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


def _first_wide_conv_input(model, ex_layers_inputs, width=16):
    from attributions.graph import trace

    graph = trace(model)
    for node in graph.nodes:
        if node.kind == "conv" and node.module.in_channels >= width:
            return ex_layers_inputs[node.name]
    raise AssertionError("no conv with enough input channels")


def test_csc_replication_on_a_random_init_vgg():
    torch.manual_seed(0)
    model = build("vgg").eval()
    x = torch.rand(8, 1, 28, 28)
    df = chain_convergence(model, x, None, ZPLUS_FAMILY + ["gradient", "deeplift", "lrp-z"], progress=False)
    assert list(df.columns) == CSC_COLUMNS
    from attributions import Explainer
    layer = _first_wide_conv_input(model, layer_inputs(Explainer(model, "gradient")))
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


@pytest.fixture(scope="module")
def trained():
    from audit.data import embedded_sample
    from audit.zoo import load_checkpoint

    x, y = embedded_sample()
    return load_checkpoint("cnn-sgd"), torch.from_numpy(x[::125]), torch.from_numpy(y[::125])


def test_random_logit_separates_converging_methods_from_the_gradient(trained):
    model, x, y = trained
    df = random_logit_test(model, x, y, ["gradient", "lrp-zplus", "deeplift-ablation", "edge"], seed=0,
                           progress=False)
    assert list(df.columns) == ["method", "image", "true_class", "random_class", "ssim", "spearman", "spearman_abs"]
    assert (df.random_class != df.true_class).all()
    med = df.groupby("method").ssim.median()
    assert med["lrp-zplus"] > med["gradient"] and med["deeplift-ablation"] > med["gradient"]
    assert med["edge"] == pytest.approx(1.0)
    again = random_logit_test(model, x, y, ["gradient", "lrp-zplus", "deeplift-ablation", "edge"], seed=0,
                              progress=False)
    assert df.equals(again)


def test_random_classes_differ_from_labels_and_cover_the_rest():
    y = torch.zeros(5000, dtype=torch.long)
    r = random_classes(y, 10, seed=3)
    assert (r != 0).all() and set(r.tolist()) == set(range(1, 10))


def test_cascading_randomization(trained):
    model, x, y = trained
    before = copy.deepcopy(model.state_dict())
    torch.manual_seed(123)
    df = parameter_randomization(model, x, y, ["gradient", "edge", "lrp-zplus"], seed=0, progress=False)
    assert list(df.columns) == ["method", "stage", "layer", "image", "ssim", "spearman", "spearman_abs", "hog"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    layers = [n for n, _, _ in parameterised_layers(model)]
    assert layers == ["features.0", "features.3", "features.5", "features.8", "classifier.0", "classifier.2"]
    order = df[df.method == "gradient"].drop_duplicates("stage").layer.tolist()
    assert order == ["original"] + layers[::-1]
    med = df.groupby(["method", "stage"]).ssim.median()
    assert (df[df.method == "edge"].ssim >= 0.99).all()
    assert med["gradient", len(layers)] < 0.5
    torch.manual_seed(999)  # the global RNG does not matter: each layer has its own seeded generator
    again = parameter_randomization(model, x, y, ["gradient", "edge", "lrp-zplus"], seed=0, progress=False)
    assert df.equals(again)


def test_independent_and_bottom_up_orders_and_batchnorm_policy():
    torch.manual_seed(0)
    model = build("resnet").eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
    stages = list((s, n, {k: v.clone() for k, v in m.state_dict().items()})
                  for s, n, m in randomization_stages(model, "independent", "keep-stats", seed=1))
    original = stages[0][2]
    for stage, name, state in stages[1:4]:
        changed = {k.rsplit(".", 1)[0] for k in state if not torch.equal(state[k], original[k])}
        assert changed == {name}, (name, changed)  # one layer at a time; BatchNorm statistics kept
    bottom = [n for _, n, _ in randomization_stages(model, "bottom-up", seed=1)]
    assert bottom[1] == "conv1" and bottom[-1] == "fc"
    _, _, reset_model = next(s for s in randomization_stages(model, "cascading", "reset", seed=1) if s[1] == "layer3.2.conv2")
    bn = reset_model.layer3[2].bn2
    assert torch.equal(bn.running_mean, torch.zeros(64)) and torch.equal(bn.weight.data, torch.ones(64))


def test_randomization_bad_input(trained):
    model, x, y = trained
    with pytest.raises(ConfigError, match="unknown order 'top-down'"):
        parameter_randomization(model, x, y, "gradient", order="top-down", progress=False)
    with pytest.raises(ConfigError, match="unknown BatchNorm policy"):
        parameter_randomization(model, x, y, "gradient", bn="freeze", progress=False)
    with pytest.raises(ConfigError, match="unknown target"):
        parameter_randomization(model, x, y, "gradient", target="random", progress=False)
    with pytest.raises(AuditError, match="labels out of range"):
        parameter_randomization(model, x, y + 20, "gradient", progress=False)
    with pytest.raises(AuditError, match="shape"):
        random_logit_test(model, x, y[:-1], "gradient", progress=False)


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
