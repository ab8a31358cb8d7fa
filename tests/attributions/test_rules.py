"""Hand-derived single-layer answers, LRP identities, and property tests over random nets."""
import importlib.util
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attributions import Explainer
from attributions import rules as R
from attributions.errors import AttributionError
from attributions.graph import trace
from audit.models import build
from tests.engine_models import ResidualNet


def _dense(weight, bias):
    layer = nn.Linear(len(weight), 1).double()
    layer.weight.data = torch.tensor([weight], dtype=torch.float64)
    layer.bias.data = torch.tensor([bias], dtype=torch.float64)
    return layer


# One output z = 2 x0 - x1 + 3 x2 + 0.5 at x = (1, 2, -1): contributions 2, -2, -3.
# Split by the signs of inputs AND weights: positive part x+w+ + x-w- = 2 (only i = 0), plus b+ = 0.5;
# negative part x+w- + x-w+ = -2 - 3. The explained logit is z = -2.5.
X = torch.tensor([[1.0, 2.0, -1.0]], dtype=torch.float64)
LAYER = _dense([2.0, -1.0, 3.0], 0.5)


@pytest.mark.parametrize("method,expected", [
    # alpha2beta1: 2 * (2 / 2.5) z on input 0; -1 * (-2 / -5) z and -1 * (-3 / -5) z on inputs 1, 2.
    ("lrp-alpha2beta1", [2 * 2 / 2.5, -(-2 / -5), -(-3 / -5)]),
    # alpha1beta0 keeps the positive bias in the denominator: 2 / 2.5 of z.
    ("lrp-alpha1beta0", [2 / 2.5, 0.0, 0.0]),
    # z+ ignores the bias: all of z to input 0.
    ("lrp-zplus", [1.0, 0.0, 0.0]),
    # z rule: each contribution over z (bias absorbs its share).
    ("lrp-z", [2 / -2.5, -2 / -2.5, -3 / -2.5]),
    # alpha5beta4: 5 * (2 / 2.5) z, then -4 * (c / -5) z for the negative contributions.
    ("lrp-alpha5beta4", [5 * 2 / 2.5, -4 * (-2 / -5), -4 * (-3 / -5)]),
])
def test_single_dense_layer_by_hand(method, expected):
    z = -2.5
    relevance = Explainer(LAYER, method, stabilizer=1e-12).attribute(X, target=0)
    torch.testing.assert_close(relevance, torch.tensor([expected], dtype=torch.float64) * z, rtol=1e-9, atol=1e-9)


def test_single_layer_flat_and_wsquare_and_zb():
    # w^2 rule: shares 4 : 1 : 9 of z; flat: thirds; zB with bounds [-1, 2]:
    # z = x.w - l.w+ - h.w- = (2 - 2 - 3) - (-1)(2 + 3) - 2(-1) = 4, shares x w - l w+ - h w- per input.
    from attributions.graph import trace
    from attributions.linear_ops import DenseOp
    from attributions.rules import Context

    node = next(n for n in trace(nn.Sequential(LAYER), X).nodes if n.kind == "dense")
    ctx = Context(node=node, inputs=[X], output=LAYER(X).detach(), op=DenseOp(node))
    signal = torch.tensor([[[7.0]]], dtype=torch.float64)
    with torch.no_grad():  # as the engine calls rules
        wsquare, flat = R.WSquare().backward(ctx, signal)[0][0], R.Flat().backward(ctx, signal)[0][0]
        zb = R.ZB(low=-1.0, high=2.0, stabilizer=0.0).backward(ctx, signal)[0][0]
    torch.testing.assert_close(wsquare, torch.tensor([[4, 1, 9]]) * 7 / 14.0, check_dtype=False)
    torch.testing.assert_close(flat, torch.full((1, 3), 7 / 3.0), check_dtype=False)
    shares = torch.tensor([[2 - (-1) * 2, -2 - 2 * (-1), -3 - (-1) * 3]], dtype=torch.float64)
    torch.testing.assert_close(zb, shares / 4.0 * 7)


def _two_layer(w1: list[list[float]], w2: list[float]) -> nn.Module:
    first, second = nn.Linear(len(w1[0]), len(w1), bias=False), nn.Linear(len(w2), 1, bias=False)
    first.weight.data = torch.tensor(w1, dtype=torch.float64)
    second.weight.data = torch.tensor([w2], dtype=torch.float64)
    return nn.Sequential(first, nn.ReLU(), second).double()


# x = (1, 2): pre-activations W1 x = (2, -1, 1, 3), activations a = (2, 0, 1, 3); the gradient arriving at the ReLU
# is w2 = (1, 3, -1, 0.5), so a * s = (2, 0, -1, 1.5), sorted (-1, 0, 1.5, 2).
W1 = [[2.0, 0.0], [1.0, -1.0], [-1.0, 1.0], [1.0, 1.0]]
W2 = [1.0, 3.0, -1.0, 0.5]
RECT_X = torch.tensor([[1.0, 2.0]], dtype=torch.float64)


@pytest.mark.parametrize("q,passed", [
    # 98th percentile: position 0.98 * 3 = 2.94, 1.5 + 0.94 * (2 - 1.5) = 1.97: only unit 0 (2 > 1.97) passes
    (98.0, [1.0, 0.0, 0.0, 0.0]),
    # median: 0 + 0.5 * 1.5 = 0.75: units 0 and 3
    (50.0, [1.0, 0.0, 0.0, 1.0]),
    # the minimum, -1: every unit above it, the inactive unit 1 (a * s = 0 > -1) included, as the rule is written
    (0.0, [1.0, 1.0, 0.0, 1.0]),
])
def test_rectgrad_on_a_two_layer_net_by_hand(q, passed):
    model = _two_layer(W1, W2)
    expected = (torch.tensor([W2], dtype=torch.float64) * torch.tensor([passed], dtype=torch.float64)) @ \
        torch.tensor(W1, dtype=torch.float64)
    torch.testing.assert_close(Explainer(model, "rectgrad", q=q).attribute(RECT_X, target=0), expected,
                               rtol=1e-12, atol=1e-12)


def test_rectgrad_percentile_is_numpys_and_is_taken_per_sample_and_signal():
    import numpy as np

    t = torch.randn(6, 1001, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for q in (0.0, 37.5, 98.0, 100.0):
        torch.testing.assert_close(R.percentile(t, q)[:, 0], torch.from_numpy(np.percentile(t.numpy(), q, axis=1)))
    # two images whose products differ in scale: each keeps its own top 2 %, one image's larger values do not
    # take the other's
    model = nn.Sequential(nn.Linear(3, 50), nn.ReLU(), nn.Linear(50, 4)).double()
    x = torch.rand(2, 3, dtype=torch.float64)
    x[1] *= 100.0
    both = Explainer(model, "rectgrad").maps_for_targets(x, [0, 1])
    for k, t in enumerate((0, 1)):
        for b in range(2):
            alone = Explainer(model, "rectgrad").attribute(x[b:b + 1], target=t)
            torch.testing.assert_close(both[k, b:b + 1], alone, rtol=1e-12, atol=1e-12)
    with pytest.raises(AttributionError, match="percentile q must lie in"):
        Explainer(model, "rectgrad", q=120.0)


def test_cmp_composite_is_epsilon_on_dense_and_alpha1beta0_with_bias_on_convolutions():
    model = _small_cnn()
    graph = trace(model, torch.rand(2, 1, 8, 8, dtype=torch.float64))
    ex = Explainer(model, "lrp-cmp-alpha1beta0", graph=graph)
    convs = [n.name for n in graph.nodes if n.kind == "conv"]
    dense = [n.name for n in graph.nodes if n.kind == "dense"]
    assert convs and dense
    for name in convs:
        rule = ex.rule_for(name)
        assert isinstance(rule, R.AlphaBeta) and (rule.alpha, rule.beta, rule.bias) == (1.0, 0.0, True)
    assert all(isinstance(ex.rule_for(n), R.Epsilon) and ex.rule_for(n).epsilon == 0.1 for n in dense)
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    composed = Explainer(model, "lrp-epsilon", rules={"conv": "alpha1beta0", "dense": R.Epsilon(0.1)}).attribute(x, target=1)
    torch.testing.assert_close(ex.attribute(x, target=1), composed, rtol=0, atol=0)


def test_zb_with_each_images_own_bounds_and_the_normalised_residual_split_by_hand():
    from attributions.graph import trace
    from attributions.linear_ops import DenseOp
    from attributions.rules import Context

    node = next(n for n in trace(nn.Sequential(LAYER), X).nodes if n.kind == "dense")
    ctx = Context(node=node, inputs=[X], output=LAYER(X).detach(), op=DenseOp(node))
    signal = torch.tensor([[[7.0]]], dtype=torch.float64)
    with torch.no_grad():  # X = (1, 2, -1): its own bounds are [-1, 2], as the fixed bounds of the zB case above
        torch.testing.assert_close(R.ZB(None, None, 0.0).backward(ctx, signal)[0],
                                   R.ZB(-1.0, 2.0, 0.0).backward(ctx, signal)[0], rtol=0, atol=0)
    # a = (1, 2), b = (3, -1), z = (4, 1), R = (2, 5): z-rule shares (0.5, 10) and (1.5, -5), sums 10.5 and -3.5;
    # rescaled to 10.5 / 14 and 3.5 / 14 of the total 7: (0.25, 5) and (-0.75, 2.5)
    a, b = torch.tensor([[1.0, 2.0]], dtype=torch.float64), torch.tensor([[3.0, -1.0]], dtype=torch.float64)
    add = Context(node=None, inputs=[a, b], output=a + b)
    ra, rb = R.NormalisedSplit(0.0).backward(add, torch.tensor([[[2.0, 5.0]]], dtype=torch.float64))
    torch.testing.assert_close(ra, torch.tensor([[[0.25, 5.0]]], dtype=torch.float64))
    torch.testing.assert_close(rb, torch.tensor([[[-0.75, 2.5]]], dtype=torch.float64))


def test_chefer_lrp_conserves_the_one_hot_relevance_on_a_transformer():
    """Every rule of the set conserves (zB, identity through norms, GELU and softmax, halves through the bilinear
    attention products, the normalised residual split; z+ wherever an output has a positive contribution): on a
    ViT without class token and with a zero position embedding nothing absorbs relevance, so each map sums to
    the one-hot's 1 but for what z+ drops at the few query / key units whose inputs all contribute negatively
    (LayerNorm outputs have both signs): under 2 % here (1.1-1.3 %)."""
    from tests.attributions.test_attention_maps import TinyViT

    torch.manual_seed(0)
    model = TinyViT(depth=2, class_token=False).double().eval()
    with torch.no_grad():
        model.pos.zero_()
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) + 0.1
    maps = Explainer(model, "chefer-lrp").attribute(x, target=torch.tensor([0, 3, 1]))
    total = maps.sum((1, 2, 3))
    assert bool(((total > 0.98) & (total <= 1 + 1e-9)).all()), total
    kept = Explainer(model, "lrp-zplus", rules={"product": R.GateProduct(gates=True)}).attribute(x, target=0)
    assert not torch.allclose(kept, maps[:1])  # attention held constant, the other convention, differs


def test_revealcancel_on_one_neuron_by_hand():
    """y = ReLU(x1 - x2) at x = (2, 1) from 0: dz+ = 2, dz- = -1; dy+ = (ReLU(2) - 0) / 2 + (ReLU(1) - ReLU(-1)) / 2
    = 1.5, dy- = (ReLU(-1) - 0) / 2 + (ReLU(1) - ReLU(2)) / 2 = -0.5; contributions 1.5 and -0.5 (Rescale:
    multiplier 1, contributions 2 and -1), both summing to y = 1."""
    first = nn.Linear(2, 1, bias=False).double()
    first.weight.data = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    model = nn.Sequential(first, nn.ReLU(), nn.Linear(1, 1, bias=False).double())
    model[2].weight.data = torch.tensor([[1.0]], dtype=torch.float64)
    x = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(Explainer(model, "deeplift-revealcancel").attribute(x, target=0),
                               torch.tensor([[1.5, -0.5]], dtype=torch.float64))
    torch.testing.assert_close(Explainer(model, "deeplift").attribute(x, target=0),
                               torch.tensor([[2.0, -1.0]], dtype=torch.float64))


@pytest.mark.parametrize("x2", [0.5, 1.0], ids=["secant", "derivative"])
def test_deeplift_rescale_on_gelu_by_hand(x2):
    """y = GELU(z), z = x1 - x2 + b, from the zero input: the multiplier is the secant (GELU(z) - GELU(b)) / (z - b),
    and where z = b exactly (x1 = x2) the derivative GELU'(b), so the contributions are +-(x1 multiplier) and
    not 0 / 0 (NaN)."""
    first = nn.Linear(2, 1).double()
    first.weight.data, first.bias.data = (torch.tensor([[1.0, -1.0]], dtype=torch.float64),
                                          torch.tensor([0.3], dtype=torch.float64))
    model = nn.Sequential(first, nn.GELU())
    x = torch.tensor([[1.0, x2]], dtype=torch.float64)
    b = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    z = b.detach() + (1.0 - x2)
    if z == b:
        multiplier = torch.autograd.grad(nn.functional.gelu(b), b)[0]
    else:
        multiplier = (nn.functional.gelu(z) - nn.functional.gelu(b.detach())) / (z - b.detach())
    maps = Explainer(model, "deeplift").attribute(x, target=0)
    torch.testing.assert_close(maps, torch.stack([multiplier, -multiplier * x2])[None].detach())


@pytest.mark.parametrize("name", ["vgg", "resnet"])
def test_revealcancel_is_complete_on_deep_nets(name):
    from audit.models import build

    torch.manual_seed(0)
    model = build(name).double().eval()
    x = torch.rand(3, 1, 28, 28, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ex = Explainer(model, "deeplift-revealcancel")
    maps = ex.attribute(x, target=torch.tensor([1, 4, 7]))
    delta = ex.compute_convergence_delta(maps, x, target=torch.tensor([1, 4, 7]))
    scale = model(x).abs().max()
    assert float(delta.abs().max() / scale) < 1e-8
    assert not torch.allclose(maps, Explainer(model, "deeplift").attribute(x, target=torch.tensor([1, 4, 7])))


def test_conv_zplus_by_hand():
    conv = nn.Conv2d(1, 1, (1, 2), bias=False).double()
    conv.weight.data = torch.tensor([[[[1.0, -2.0]]]], dtype=torch.float64)
    x = torch.tensor([[[[3.0, 1.0, 2.0]]]], dtype=torch.float64)
    model = nn.Sequential(conv, nn.Flatten(), _dense([1.0, 1.0], 0.0))
    # outputs: 3 - 2 = 1 and 1 - 4 = -3; logit -2 with unit dense weights, relevance -2 split by z+ of
    # the dense layer (inputs 1 and -3 are not both non-negative: x+w+ = 1, x-w- = 0) -> all on output 0,
    # then z+ of the conv sends output 0's relevance to pixel 0 (3 * 1 is its only positive contribution).
    relevance = Explainer(model, "lrp-zplus", stabilizer=1e-12).attribute(x, target=0)
    torch.testing.assert_close(relevance, torch.tensor([[[[-2.0, 0.0, 0.0]]]], dtype=torch.float64))


def test_zplus_takes_the_signed_form_for_a_negative_input_past_the_probed_slice():
    # 5000 inputs, non-negative but the last: the sign check looks at a leading slice first, and must still see it
    n = 5000
    x = torch.rand(1, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[0, -1] = -3.0
    w = torch.randn(2, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w[0, -1] = -2.0
    layer = nn.Linear(n, 2).double()
    layer.weight.data, layer.bias.data = w, torch.tensor([0.5, -0.5], dtype=torch.float64)
    contributions = torch.where(x * w[0] > 0, x * w[0], 0.0)  # x+ w+ and x- w-: the contributions that favour z+
    expected = contributions / (contributions.sum() + 1e-12) * layer(x)[0, 0].detach()
    relevance = Explainer(layer, "lrp-zplus", stabilizer=1e-12).attribute(x, target=0)
    torch.testing.assert_close(relevance, expected)
    assert float(relevance[0, -1]) > 0  # the x- w- term: the unsigned form would give x w+ = 0 here


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_the_sign_check_sees_every_value(layout):
    x = torch.zeros(64, 100)
    x[-1, -1] = -1e-30
    if layout == "strided":
        x = x.t().contiguous().t()
        assert not x.is_contiguous()
    assert R._signed(x)
    x[-1, -1] = float("nan")  # not >= 0, as the check of the whole has always counted it
    assert R._signed(x)
    x[-1, -1] = 0.0
    assert not R._signed(x)


def _bias_free_residual():
    torch.manual_seed(0)
    return ResidualNet(bias=False).double().eval()


def test_lrp_z_equals_input_times_gradient_on_bias_free_relu_nets():
    model = _bias_free_residual()
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64)
    lrp = Explainer(model, "lrp-z", stabilizer=1e-15).attribute(x, target=2)
    ixg = Explainer(model, "input-x-gradient").attribute(x, target=2)
    assert float((lrp - ixg).abs().max()) <= 1e-5 * float(ixg.abs().max())


def test_z_rule_conserves_relevance_on_bias_free_nets():
    model = _bias_free_residual()
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64)
    relevance = Explainer(model, "lrp-z", stabilizer=1e-15).attribute(x, target=1)
    torch.testing.assert_close(relevance.flatten(1).sum(1), model(x)[:, 1].detach(), rtol=1e-8, atol=1e-10)


def test_excitation_backprop_starts_from_a_probability_of_one():
    # Without residual adds (where a negative branch can carry relevance z+ cannot pass on), the
    # bias-free z+ chain conserves the initial probability mass of 1.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.ReLU(), nn.Conv2d(4, 4, 3, bias=False), nn.ReLU(),
                          nn.AvgPool2d(2), nn.Flatten(), nn.Linear(16, 3, bias=False)).double().eval()
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    eb = Explainer(model, "excitation-backprop", stabilizer=1e-15).attribute(x, target=0)
    torch.testing.assert_close(eb.flatten(1).sum(1), torch.ones(2, dtype=torch.float64), rtol=1e-5, atol=1e-6)


@st.composite
def nets(draw):
    """Small random conv nets: optional max-pooling, average pooling, residual add, BatchNorm."""
    width = draw(st.integers(2, 5))
    layers: list[nn.Module] = [nn.Conv2d(1, width, 3, padding=1)]
    if draw(st.booleans()):
        layers.append(nn.BatchNorm2d(width))
    layers.append(nn.ReLU())
    residual = draw(st.booleans())
    pool = draw(st.sampled_from(["max", "avg", "none"]))
    seed = draw(st.integers(0, 10_000))
    return layers, width, residual, pool, seed


class _Net(nn.Module):
    def __init__(self, spec):
        super().__init__()
        layers, width, residual, pool, seed = spec
        torch.manual_seed(seed)
        self.stem = nn.Sequential(*layers)
        self.body = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.residual = residual
        self.pool = {"max": nn.MaxPool2d(2), "avg": nn.AvgPool2d(2), "none": nn.Identity()}[pool]
        side = 3 if pool != "none" else 6
        self.head = nn.Linear(width * side * side, 3)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        h = self.stem(x)
        h = self.body(h) + h if self.residual else self.body(h)
        return self.head(torch.flatten(self.pool(h), 1))


@settings(max_examples=15, deadline=None)
@given(nets())
def test_properties_over_random_architectures(spec):
    model = _Net(spec).double().eval()
    x = torch.rand(2, 1, 6, 6, dtype=torch.float64)
    xg = x.clone().requires_grad_()
    grad, = torch.autograd.grad(model(xg)[:, 1].sum(), xg)
    ours = Explainer(model, "gradient").attribute(x, target=1)
    assert float((ours - grad).abs().max()) <= 1e-10 + 1e-8 * float(grad.abs().max())
    dl = Explainer(model, "deeplift").attribute(x, target=1)
    delta = (model(x)[:, 1] - model(torch.zeros_like(x[:1]))[:, 1]).detach()
    torch.testing.assert_close(dl.flatten(1).sum(1), delta, rtol=1e-8, atol=1e-10)
    for method in ("lrp-epsilon-plus", "deeplift-ablation", "guided-backprop"):
        ex = Explainer(model, method, graph=trace(model, x))
        vectors = torch.randn(3, 2, 3, dtype=torch.float64)
        together = ex.propagate(x, ex.graph.output, vectors)["input"]
        apart = torch.cat([ex.propagate(x, ex.graph.output, vectors[k:k + 1])["input"] for k in range(3)])
        torch.testing.assert_close(together, apart, rtol=1e-10, atol=1e-12)


# --- rule maps: rules chosen by node kind or name, as zennit's composites do ---------------------------

def _small_cnn():
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 6), nn.ReLU(), nn.Linear(6, 3)).double().eval()


def test_available_rules_list_formulas_and_kinds():
    listed = R.available()
    assert {"epsilon", "zplus", "alpha2beta1", "gamma", "flat", "wsquare", "zbox", "pass"} <= set(listed)
    assert "[dense, conv, affine]" in listed["flat"] and "relu" in listed["pass"]


def test_epsilon_with_zplus_on_convolutions_is_exactly_epsilon_plus():
    model, x = _small_cnn(), torch.rand(3, 1, 8, 8, dtype=torch.float64)
    mapped = Explainer(model, "lrp-epsilon", rules={"conv": "zplus"}).attribute(x, target=1)
    assert torch.equal(mapped, Explainer(model, "lrp-epsilon-plus").attribute(x, target=1))
    # and the map really changed: the override is not a no-op
    assert not torch.allclose(mapped, Explainer(model, "lrp-epsilon").attribute(x, target=1))


def test_names_win_over_kinds_and_kinds_over_first():
    model = _small_cnn()
    graph = trace(model, torch.rand(2, 1, 8, 8, dtype=torch.float64))
    ex = Explainer(model, "lrp-epsilon", graph=graph, rules={"conv": "zplus", "0": "flat", "dense": R.Gamma(0.5)})
    assert isinstance(ex.rule_for("0"), R.Flat)  # the first conv, by its name
    assert isinstance(ex.rule_for("2"), R.AlphaBeta) and isinstance(ex.rule_for("5"), R.Gamma)
    first = Explainer(model, "deep-taylor", graph=graph, rules={"conv": "epsilon"})
    assert isinstance(first.rule_for("0"), R.Epsilon)  # a kind override replaces the method's first rule
    assert isinstance(Explainer(model, "deep-taylor", graph=graph).rule_for("0"), R.ZB)
    assert isinstance(Explainer(model, "lrp-epsilon", graph=graph, rules={"first": "wsquare"}).rule_for("0"), R.WSquare)


def test_flat_and_wsquare_through_the_explainer_match_the_hand_answers():
    # w^2 shares 4 : 1 : 9 of the explained logit, flat thirds (LAYER, X above; z = -2.5)
    wsq = Explainer(LAYER, "lrp-epsilon", rules={"dense": "wsquare"}).attribute(X, target=0)
    torch.testing.assert_close(wsq, torch.tensor([[4.0, 1.0, 9.0]], dtype=torch.float64) / 14 * -2.5)
    flat = Explainer(LAYER, "lrp-epsilon", rules={"dense": "flat"}).attribute(X, target=0)
    torch.testing.assert_close(flat, torch.full((1, 3), -2.5 / 3, dtype=torch.float64))


def test_bad_rule_maps_are_clear_errors():
    model = _small_cnn()
    with pytest.raises(AttributionError, match="unknown rule 'zplsu'.*Did you mean 'zplus'"):
        Explainer(model, "lrp-epsilon", rules={"conv": "zplsu"})
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    with pytest.raises(AttributionError, match="unknown rule key.*'conv9'"):  # node names are known once captured
        Explainer(model, "lrp-epsilon", rules={"conv9": "zplus"}).attribute(x, target=0)
    with pytest.raises(AttributionError, match="cannot act on node '1' of kind 'relu'"):
        Explainer(model, "lrp-epsilon", graph=trace(model, x), rules={"relu": "zplus"})
    with pytest.raises(AttributionError, match="not a chain of rules"):
        Explainer(model, "integrated-gradients", rules={"conv": "zplus"})


# --- hand-derived answers for the transformer-era rules -----------------------------------------------

class _Op(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def test_ln_rule_by_hand():
    # x = (1, 2, 6): mean 3, centred (-2, -1, 3), std s = sqrt(14 / 3), y = centred / s. With s held
    # constant LayerNorm is the linear map C / s (C the centring matrix), and the z rule from R = (y0, 0, 0)
    # gives x * C e0 / s = (1 * 2/3, 2 * -1/3, 6 * -1/3) / s, which sums to y0 = -2 / s.
    x = torch.tensor([[1.0, 2.0, 6.0]], dtype=torch.float64)
    s = (14 / 3 + 1e-5) ** 0.5
    model = nn.LayerNorm(3, elementwise_affine=False).double()
    relevance = Explainer(model, "lrp-epsilon", epsilon=1e-12).attribute(x, target=0)
    torch.testing.assert_close(relevance, torch.tensor([[2 / 3, -2 / 3, -2.0]], dtype=torch.float64) / s)


def test_gate_as_constant_and_the_exact_deeplift_product_by_hand():
    # y = a * sigmoid(g) with a = x0, g = x1: LRP gives all of y to a, nothing to the gate's input;
    # DeepLIFT (reference 0: a0 = 0, sigmoid(0) = 1/2) splits y = a (s + 1/2) / 2 + a / 2 (s - 1/2).
    model = _Op(lambda x: (x[:, :1] * torch.sigmoid(x[:, 1:])))
    x = torch.tensor([[3.0, 0.8]], dtype=torch.float64)
    sig = 1 / (1 + torch.exp(torch.tensor(-0.8, dtype=torch.float64)))
    lrp = Explainer(model, "lrp-epsilon", epsilon=1e-12).attribute(x, target=0)
    torch.testing.assert_close(lrp, torch.tensor([[3.0 * float(sig), 0.0]], dtype=torch.float64))
    dl = Explainer(model, "deeplift").attribute(x, target=0)
    expected = torch.tensor([[3.0 * (float(sig) + 0.5) / 2, 1.5 * (float(sig) - 0.5)]], dtype=torch.float64)
    torch.testing.assert_close(dl, expected)


@pytest.mark.parametrize("b_shape", [(1, 2, 1), (2, 1)], ids=["batched", "broadcast"])
def test_deeplift_matrix_product_by_hand(b_shape):
    # y = a . b (a matrix product), a = x[:2], b = x[2:], from 0: the bilinear rule gives each factor the mean of
    # the other's ends, so contributions a_i b_i / 2 and b_i a_i / 2; written out for operands of one batch shape,
    # by autograd where the product broadcasts
    model = _Op(lambda t: (t[:, :2].reshape(1, 1, 2) @ t[:, 2:].reshape(b_shape)).reshape(1, 1))
    x = torch.tensor([[3.0, -2.0, 0.5, 4.0]], dtype=torch.float64)
    dl = Explainer(model, "deeplift").attribute(x, target=0)
    torch.testing.assert_close(dl, torch.tensor([[0.75, -4.0, 0.75, -4.0]], dtype=torch.float64))


def test_softmax_rule_by_hand():
    # AttnLRP: R_in = x * (R - s * sum(R)); from the explained output R = (s0, 0, 0)
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    e = torch.exp(x)
    s = e / e.sum()
    model = _Op(lambda t: torch.softmax(t, dim=1))
    relevance = Explainer(model, "lrp-epsilon").attribute(x, target=0)
    r = torch.tensor([[float(s[0, 0]), 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(relevance, x * (r - s * float(s[0, 0])))
    dl = Explainer(model, "deeplift")
    assert float(dl.compute_convergence_delta(dl.attribute(x, target=0), x, 0).abs().max()) < 1e-12


def test_two_norm_by_hand():
    # ||(3, 4)|| = 5. LRP-z (Euler: sum x_i df/dx_i = f) gives x_i^2 / ||x||: (9/5, 16/5). DeepLIFT from 0:
    # the gradient at the midpoint (1.5, 2) is (0.6, 0.8), whose linearisation already gives dy = 5.
    model = _Op(lambda t: torch.linalg.vector_norm(t, dim=1, keepdim=True))
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    expected = torch.tensor([[9 / 5, 16 / 5]], dtype=torch.float64)
    torch.testing.assert_close(Explainer(model, "lrp-epsilon", epsilon=1e-12).attribute(x, target=0), expected)
    torch.testing.assert_close(Explainer(model, "deeplift").attribute(x, target=0), expected)
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=0),
                               torch.tensor([[0.6, 0.8]], dtype=torch.float64))


def test_max_secant_by_hand():
    # u = x + (0, 2, -1), y = max u. At x = (3, 0, 0): u = (3, 2, -1), y = 3; at the reference x0 = 0:
    # u0 = (0, 2, -1), y0 = 2. The midpoint (1.5, 2, -1) has its max at index 1, where du = 0, so the
    # linearisation misses dy = 1 entirely; the residual goes along du = (3, 0, 0) / |du|^2: the multipliers
    # are e1 + (1/9) du = (1/3, 1, 0), and the contributions du * mult = (1, 0, 0), summing to dy.
    shift = torch.tensor([0.0, 2.0, -1.0], dtype=torch.float64)
    for reduce in (lambda u: u.amax(dim=1, keepdim=True), lambda u: u.max(dim=1)[0][:, None]):
        model = _Op(lambda t, reduce=reduce: reduce(t + shift))
        dl = Explainer(model, "deeplift").attribute(torch.tensor([[3.0, 0.0, 0.0]], dtype=torch.float64), target=0)
        torch.testing.assert_close(dl, torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))


def test_reductions_are_exact_in_a_network():
    # F.normalize (a norm, clamped, divided into its input), a global max, an elementwise maximum with a
    # constant, logsumexp and addcmul: gradient = autograd, DeepLIFT complete, LRP finite
    torch.manual_seed(0)
    conv, head = nn.Conv2d(3, 6, 3).double(), nn.Linear(6, 4).double()

    def forward(t):
        h = conv(t)
        h = nn.functional.normalize(h, dim=1) * 3 + h
        h = h + h.amax(dim=(2, 3), keepdim=True) + torch.maximum(h, torch.tensor(0.1, dtype=h.dtype))
        h = h * torch.logsumexp(h, dim=1, keepdim=True)
        h = torch.addcmul(h, torch.full_like(h[:1], 0.5), h)  # timm's GlobalResponseNorm: one signal factor
        return head(h.max(dim=3)[0].mean(2))
    model = _Op(forward)
    x, target = torch.randn(3, 3, 8, 8, dtype=torch.float64), torch.tensor([0, 1, 3])
    xg = x.clone().requires_grad_()
    plain = torch.autograd.grad(model(xg)[range(3), target].sum(), xg)[0]
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=target), plain, rtol=0, atol=1e-12)
    kinds = {n.kind for n in trace(model, x).nodes}
    assert {"reduce", "activation", "const"} <= kinds
    dl = Explainer(model, "deeplift")
    assert float(dl.compute_convergence_delta(dl.attribute(x, target=target), x, target).abs().max()) < 1e-10
    assert torch.isfinite(Explainer(model, "lrp-epsilon").attribute(x, target=target)).all()


def test_softmax_deeplift_stays_complete_when_the_reference_underflows():
    # scores 1e4 apart from the reference's: exp of the reference's row at the shared shift is 0 (1 / 0 in
    # the exact rule); the secant rule takes over those rows and completeness still holds
    model = _Op(lambda t: torch.softmax(t * 1e4, dim=1))
    x = torch.tensor([[1.0, 0.5, -0.2], [1e-5, 0.0, 2e-5]], dtype=torch.float64)
    dl = Explainer(model, "deeplift")
    for target in (0, 1):
        maps = dl.attribute(x, target=target)
        assert torch.isfinite(maps).all()
        assert float(dl.compute_convergence_delta(maps, x, target).abs().max()) < 1e-12


def _jacobian_reference(layer: nn.Module, x: torch.Tensor, signal: torch.Tensor, rule: str, alpha: float = 2.0,
                        beta: float = 1.0, gamma: float = 0.25, eps: float = 1e-12, bias: bool = True) -> torch.Tensor:
    """The LRP rules in matrix form, one image at a time (zennit's reference style: slow, explicit):
    z_ij = x_i w_ji with W the layer's Jacobian (bias off), relevance R_i = sum_j c_ij R_j; gamma in its
    generalized form for inputs of both signs; ``bias=False``: alpha-beta without the bias (z+)."""
    with_bias, bias = bias, layer.bias.detach() if layer.bias is not None else None
    out = []
    for xb, rb in zip(x, signal):
        with torch.no_grad():
            saved, layer.bias = layer.bias, None
            w = torch.autograd.functional.jacobian(lambda t: layer(t[None])[0], xb).reshape(-1, xb.numel())
            layer.bias = saved
        b = bias.repeat_interleave(w.shape[0] // len(bias)) if bias is not None else torch.zeros(w.shape[0], dtype=w.dtype)
        xi, r = xb.reshape(-1), rb.reshape(-1)
        if rule == "alpha-beta":
            z = w * xi[None, :]  # (out, in)
            zp, zn = z.clamp(min=0), z.clamp(max=0)
            b = b if with_bias else torch.zeros_like(b)
            dp, dn = zp.sum(1) + b.clamp(min=0), zn.sum(1) + b.clamp(max=0)
            c = alpha * zp / (dp + eps)[:, None] - beta * zn / (dn - eps)[:, None]
        else:  # the generalized gamma (gamma = 0: epsilon): each output's sign picks the contributions that favour it
            up, down = w + gamma * w.clamp(min=0), w + gamma * w.clamp(max=0)
            xp, xn = xi.clamp(min=0)[None, :], xi.clamp(max=0)[None, :]
            z_up, z_down = up * xp + down * xn, down * xp + up * xn
            d_up, d_down = z_up.sum(1) + b + gamma * b.clamp(min=0), z_down.sum(1) + b + gamma * b.clamp(max=0)
            actual = (w * xi[None, :]).sum(1) + b
            c = torch.where((actual > 0)[:, None], z_up / (d_up + eps * torch.where(d_up >= 0, 1.0, -1.0))[:, None],
                            torch.where((actual < 0)[:, None],
                                        z_down / (d_down + eps * torch.where(d_down >= 0, 1.0, -1.0))[:, None], 0.0))
        out.append((c * r[:, None]).sum(0).reshape(xb.shape))
    return torch.stack(out)


@pytest.mark.parametrize("positive", [True, False])  # x >= 0 takes the rules' fast path
@pytest.mark.parametrize("rule, kwargs", [("alpha-beta", {"alpha": 2.0, "beta": 1.0}),
                                          ("alpha-beta", {"alpha": 1.0, "beta": 0.0}),
                                          ("alpha-beta", {"alpha": 1.0, "beta": 0.0, "bias": False}),
                                          ("alpha-beta", {"alpha": 2.0, "beta": 1.0, "bias": False}),
                                          ("gamma", {"gamma": 0.25}), ("gamma", {"gamma": 0.0})])
def test_linear_rules_match_their_jacobian_form(positive, rule, kwargs):
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 3, 3, stride=2, padding=1).double()
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64)
    x = x.abs() if positive else x
    signal = torch.randn(1, 2, 3, 3, 3, dtype=torch.float64)
    ours = R.AlphaBeta(kwargs["alpha"], kwargs["beta"], bias=kwargs.get("bias", True), stabilizer=1e-12) \
        if rule == "alpha-beta" \
        else (R.Gamma(kwargs["gamma"], 1e-12) if kwargs["gamma"] else R.Epsilon(1e-12))
    model = nn.Sequential(conv, nn.Flatten()).eval()
    ex = Explainer(model, "lrp-epsilon", rules={"0": ours})
    maps = ex.propagate(x, "0", signal)["input"][0]
    torch.testing.assert_close(maps, _jacobian_reference(conv, x, signal[0], rule, **kwargs), rtol=1e-9, atol=1e-12)


class _ConvNeXtLike(nn.Module):
    """A stem conv with a zero bias (the zero reference's LayerNorm input has no variance), then blocks
    x + 1e-6 * mlp(LayerNorm(x)) with a LayerNorm between them, as torchvision initialises ConvNeXt."""

    def __init__(self, width: int = 8, blocks: int = 4):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 4, stride=4)
        nn.init.zeros_(self.stem.bias)
        self.norms = nn.ModuleList(nn.LayerNorm(width, eps=1e-6) for _ in range(blocks + 1))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                  for _ in range(blocks))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        h = self.norms[0](self.stem(x).permute(0, 2, 3, 1))
        for norm, mlp in zip(self.norms[1:], self.mlps):
            h = norm(h + 1e-6 * mlp(h))
        return self.head(h.mean((1, 2)))


def test_deeplift_stays_complete_where_the_reference_has_no_variance():
    torch.manual_seed(0)
    model = _ConvNeXtLike().double().eval()
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    errors = {}
    for label, rules in (("secant where ill-conditioned", None),
                         ("mean r everywhere", {"norm": R.NormDeepLift(conditioning=float("inf"))})):
        dl = Explainer(model, "deeplift", rules=rules)
        errors[label] = float(dl.compute_convergence_delta(dl.attribute(x, target=1), x, 1).abs().max())
    assert errors["secant where ill-conditioned"] < 1e-12, errors
    assert errors["mean r everywhere"] > 1e3 * errors["secant where ill-conditioned"], errors  # what it mends


class _ChannelsLast(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _AsRule(R.Rule):
    kinds = ("norm",)

    def __init__(self, multipliers):
        self.multipliers = multipliers

    def backward(self, ctx, signal):
        return [self.multipliers(ctx, signal)]


def _norm_net(norm: nn.Module) -> tuple[nn.Module, torch.Tensor]:
    """A conv, ``norm`` (a LayerNorm over channels last), a dense layer; weights of std 0.5; inputs (2, 3, 6, 6)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), norm, nn.Flatten(), nn.Linear(6 * 4 * 4, 3)).double().eval()
    if isinstance(norm, nn.LayerNorm):
        model[1] = _ChannelsLast(norm).double()
    for p in model.parameters():
        nn.init.normal_(p, std=0.5)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    return model, x


@pytest.mark.parametrize("norm", [nn.LayerNorm(6), nn.GroupNorm(2, 6)], ids=["layer", "group"])
def test_norm_secant_is_the_generic_secant_written_out(norm):
    # the normalisation's Jacobian in closed form against the generic forward- and reverse-mode secant
    # (LayerNorm: its groups are trailing dims); both complete: the maps sum to f(x) - f(0) per sample
    model, x = _norm_net(norm)
    closed = Explainer(model, "deeplift", rules={"norm": _AsRule(R._norm_secant)})
    maps = closed.attribute(x, target=1)
    assert float(closed.compute_convergence_delta(maps, x, 1).abs().max()) < 1e-12
    if isinstance(norm, nn.LayerNorm):
        generic = _AsRule(lambda ctx, s: R._secant(ctx, s, R._norm_axes(ctx)[1], rows=True))
        torch.testing.assert_close(maps, Explainer(model, "deeplift", rules={"norm": generic}).attribute(x, target=1),
                                   rtol=1e-10, atol=1e-13)


def _norm_lrp_by_vjp(ctx, signal):
    """The LN rule as its definition reads: the z rule through the normalisation with the standard deviation
    held constant, its transpose taken by autograd."""
    group, dims, weight, _, eps, ungroup = R._norm_axes(ctx)
    std = torch.sqrt(group(ctx.x).var(dim=dims, keepdim=True, unbiased=False) + eps)

    def linear(t):
        u = group(t)
        return R._affine(ungroup((u - u.mean(dim=dims, keepdim=True)) / std), weight)

    return ctx.x * ctx.vjp(signal / R.stabilize(ctx.output, 1e-6), [ctx.x], linear)[0]


@pytest.mark.parametrize("norm", [nn.LayerNorm(6), nn.GroupNorm(2, 6), nn.BatchNorm2d(6, track_running_stats=False)],
                         ids=["layer", "group", "batch statistics"])
def test_the_ln_rule_written_out_is_its_definition(norm):
    model, x = _norm_net(norm)
    ours = Explainer(model, "lrp-epsilon", rules={"norm": R.NormLRP()})
    reference = Explainer(model, "lrp-epsilon", rules={"norm": _AsRule(_norm_lrp_by_vjp)})
    targets = [torch.tensor([0, 2]), 1]  # K = 2 signals through one backward
    expected = reference.maps_for_targets(x, targets)
    assert float(expected.abs().max()) > 0
    torch.testing.assert_close(ours.maps_for_targets(x, targets), expected, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("name", ["vit", "cnn", "resnet"])
@pytest.mark.parametrize("method", ["cp-lrp", "attnlrp"])
def test_lrp_in_factor_form_is_the_relevance_form(name, method):
    # R = value * c: the factor form's chain of gradients (products' gates held or halved, the LN rule's std held,
    # the identity rule as a ratio) gives the relevance form's maps (z rules divided by z) in the epsilon-free limit
    torch.manual_seed(0)
    model = build(name).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    gates = method == "cp-lrp"
    relevance = Explainer(model, "lrp-epsilon", epsilon=1e-12, rules={"product": R.GateProduct(1e-12, gates=gates)})
    targets = [torch.tensor([0, 4, 9]), 2]
    expected = relevance.maps_for_targets(x, targets)
    factor = Explainer(model, method, epsilon=1e-12)
    torch.testing.assert_close(factor.maps_for_targets(x, targets), expected, rtol=1e-7, atol=1e-9 * expected.abs().max())
    # the relevance at a layer inside, from vectors injected at a linear layer's output above it, as CSC injects
    # (relevance put on a value of zero, a ReLU's, has no factor: the two forms differ only there)
    graph = factor.capture(x).graph
    start = [n.name for n in graph.nodes if n.kind in ("conv", "dense")][-2]
    layer = factor.layers[len(factor.layers) // 4]
    vectors = torch.randn(2, *factor.forward_pass(x).values[start].shape, dtype=torch.float64)
    ours, theirs = (e.propagate(x, start, vectors) for e in (factor, relevance))
    torch.testing.assert_close(ours[layer], theirs[layer], rtol=1e-6, atol=1e-9 * theirs[layer].abs().max())


def test_generalized_gamma_matches_zennit_on_signed_inputs():
    """zennit's Gamma (>= 0.5, the generalized form) on a net whose every layer sees inputs of both signs, as a
    transformer's do: equal to 1e-10."""
    if importlib.util.find_spec("zennit") is None:
        if os.environ.get("MODEL_LIBRARIES") == "required":
            pytest.fail("zennit missing with MODEL_LIBRARIES=required (make test installs it into .venv-libraries)")
        pytest.skip("zennit needs torchvision, which does not import beside this torch build (make test runs this in "
                    ".venv-libraries)")
    from zennit.attribution import Gradient as ZennitGradient
    from zennit.composites import SpecialFirstLayerMapComposite
    from zennit.rules import Gamma as ZennitGamma
    from zennit.rules import Pass as ZennitPass

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)).double().eval()
    x = torch.randn(5, 6, dtype=torch.float64)  # signed inputs, and tanh keeps every layer's inputs signed
    target = torch.tensor([0, 1, 2, 3, 0])
    ours = Explainer(model, "lrp-epsilon", rules={"dense": "gamma", "activation": "pass"}).attribute(x, target=target)
    composite = SpecialFirstLayerMapComposite(layer_map=[(nn.Linear, ZennitGamma(0.25)), (nn.Tanh, ZennitPass())],
                                              first_map=[(nn.Linear, ZennitGamma(0.25))])
    with torch.no_grad():
        logits = model(x)
    with ZennitGradient(model, composite) as attributor:  # LRP's relevance starts as the explained logit
        _, theirs = attributor(x.clone().requires_grad_(), torch.eye(4, dtype=torch.float64)[target] * logits)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)


def test_deeplift_is_complete_through_efficientvits_linear_attention_where_the_model_computes_in_float64():
    """timm's EfficientViT divides one product of two signals by another (its linear attention) and computes that
    block in float32 whatever the model's dtype (``q.float()``): there its DeepLIFT maps miss f(x) - f(x0) by the
    model's own float32 rounding. With the block in float64 the product and quotient rules are complete to 1e-8 of
    the difference (random weights perturbed)."""
    timm = pytest.importorskip("timm")
    from timm.models import efficientvit_mit

    from tests.model_libraries import perturb

    def attention_in_float64(self, q, k, v):
        out = q @ (k.transpose(-1, -2) @ v)
        return out[..., :-1] / (out[..., -1:] + self.eps)

    model = perturb(timm.create_model("efficientvit_b0", num_classes=10).eval(), 0).double()
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(efficientvit_mit.LiteMLA, "_attn", attention_in_float64)
        total = Explainer(model, "deeplift").attribute(x, target=1).flatten(1).sum(1)
        with torch.no_grad():
            difference = model(x)[:, 1] - model(torch.zeros_like(x))[:, 1]
    assert float(((total - difference).abs() / difference.abs()).max()) < 1e-8
