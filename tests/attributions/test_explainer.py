"""The Explainer's API: graph handling, propagate, the user's model left untouched, bad input."""
import copy

import pytest
import torch
from torch import nn

from attributions import Explainer, available_methods, memory
from attributions import rules as R
from attributions.errors import AttributionError
from attributions.explainer import CONNECTED, ForwardPass, attribute_many, shared_forward
from attributions.graph import trace
from attributions.methods import build_method
from attributions.records import Const
from audit.models import build
from tests.engine_models import FunctionalNet, ResidualNet
from tests.model_libraries import CHEAP

METHODS = list(available_methods())
GRAPH_METHODS = [m for m in METHODS if build_method(m).chain]


def test_available_methods_lists_every_method_with_a_reference():
    expected = {"gradient", "input-x-gradient", "integrated-gradients", "smoothgrad", "smoothgrad-ig",
                "guided-backprop", "deconvnet", "rectgrad", "patternnet", "patternattribution", "lrp-z", "lrp-epsilon",
                "cp-lrp", "attnlrp", "lrp-zplus", "lrp-alpha1beta0", "lrp-alpha2beta1", "lrp-alpha5beta4", "lrp-gamma",
                "lrp-epsilon-plus", "lrp-epsilon-alpha2beta1", "lrp-cmp-alpha1beta0", "chefer-lrp", "deep-taylor",
                "excitation-backprop", "deeplift", "deeplift-ablation", "deeplift-revealcancel", "grad-cam",
                "guided-grad-cam", "vit-grad-cam", "attention-rollout", "generic-attention", "transformer-attribution",
                "attention-grad-cam", "edge", "random"}
    methods = available_methods()
    assert set(methods) == expected
    assert all("[" in text and "]" in text for text in methods.values())


def test_functional_ops_reuse_and_layer_names():
    torch.manual_seed(0)
    model = FunctionalNet().eval()
    x = torch.rand(2, 1, 8, 8)
    ex = Explainer(model, "gradient", graph=trace(model, x))
    assert ex.layers[:4] == ["a", "relu", "b", "relu#1"]
    assert "shared" in ex.layers and "shared#1" in ex.layers  # one node per call site
    xg = x.clone().requires_grad_()
    grad, = torch.autograd.grad(model(xg)[:, 3].sum(), xg)
    torch.testing.assert_close(ex.attribute(x, target=3), grad)
    for method in METHODS:
        ex = Explainer(model, method)
        if ex.method.engine.fits(ex, x) is not None:  # attention maps of a CNN: refused, clearly
            with pytest.raises(AttributionError, match="attention"):
                ex.attribute(x, target=1)
            continue
        assert ex.attribute(x, target=1).shape == x.shape


def test_batchnorm_is_folded_into_the_layer_before_it():
    graph = trace(build("resnet").eval(), torch.rand(2, 1, 28, 28))
    kinds = {n.kind for n in graph.nodes}
    assert "affine" not in kinds
    assert sum(n.bn is not None for n in graph.nodes) == 21
    # A BatchNorm that follows an add cannot be folded: it stays an affine node.
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.BatchNorm1d(8),
                          nn.Linear(8, 2)).eval()
    nodes = trace(model, torch.rand(2, 1, 4, 4)).nodes
    assert [n.kind for n in nodes if n.kind != "const"] == ["input", "conv", "relu", "move", "affine", "dense"]


@pytest.mark.parametrize("arch,shape", [("resnet50", (1, 3, 32, 32)), ("vgg16", (1, 3, 32, 32))])
def test_imagenet_zoo_models_trace_and_explain(arch, shape):
    torch.manual_seed(0)
    model = build(arch, shape[1:], 10).eval()
    x = torch.rand(*shape)
    xg = x.clone().requires_grad_()
    grad, = torch.autograd.grad(model(xg)[:, 4].sum(), xg)
    ours = Explainer(model, "gradient").attribute(x, target=4)
    assert float((ours - grad).abs().max()) <= 1e-5 * float(grad.abs().max())
    assert Explainer(model, "lrp-epsilon-plus").attribute(x, target=4).shape == x.shape


def test_propagate_records_every_node_below_the_injection_point():
    torch.manual_seed(0)
    model = build("cnn").eval()
    ex = Explainer(model, "lrp-zplus")
    x = torch.rand(3, 1, 28, 28)
    taps = ex.propagate(x, "classifier.0", torch.randn(5, 3, 128))
    below = ex.layers[: ex.layers.index("classifier.0")]
    assert set(taps) == set(below) | {"input"}
    assert taps["features.3"].shape == (5, 3, 32, 14, 14) and taps["input"].shape == (5, 3, 1, 28, 28)


@pytest.mark.parametrize("method", ["gradient", "guided-backprop", "cp-lrp", "attnlrp"])
@pytest.mark.parametrize("name", ["cnn", "resnet", "vit"])
def test_an_exact_gradient_chain_is_taken_from_autograd(name, method, monkeypatch):
    # every rule of the chain the node's exact gradient, or that of a surrogate op (LRP in factor form: the op with
    # parts held; guided backprop: ReLUs with their backward clipped): one autograd call per vector, the same maps
    # and taps as the rule chain's (which runs under a memory budget), BatchNorm folded and attention included
    torch.manual_seed(0)
    model = build(name).double().eval()
    x = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    explainers = {m: Explainer(model, m).capture(x) for m in
                  ("gradient", "input-x-gradient", "guided-backprop", "deeplift", "lrp-epsilon", "cp-lrp", "attnlrp")}
    assert [m for m, e in explainers.items() if e.by_autograd] == ["gradient", "input-x-gradient", "guided-backprop",
                                                                   "cp-lrp", "attnlrp"]
    assert not Explainer(model, "gradient", rules={"dense": "epsilon"}).capture(x).by_autograd
    ex = explainers[method]
    calls = []
    grad = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append(1) or grad(*a, **k))
    targets = [torch.tensor([0, 1, 2]), 3]
    fast = ex.maps_for_targets(x, targets)
    assert len(calls) == 2
    assert fast.abs().sum() > 0
    with memory.limit(2**40):
        torch.testing.assert_close(fast, ex.maps_for_targets(x, targets), rtol=1e-10, atol=1e-13 * fast.abs().max())
    if method == "gradient":
        xr = x.clone().requires_grad_()
        torch.testing.assert_close(fast[1], torch.autograd.grad(model(xr)[:, 3].sum(), xr)[0])
    else:  # a pass in surrogate form is the gradient of its method only: shared with another, none is recorded whole
        graph = explainers["gradient"].graph
        both = {"gradient": Explainer(model, "gradient", graph=graph), method: Explainer(model, method, graph=graph)}
        assert shared_forward(both, x).connected == (not ex.surrogates)  # cp-lrp on a CNN: no op to replace
        assert ex.surrogates == (name == "vit" or method == "guided-backprop")
        shared = attribute_many(both, x, targets)
        torch.testing.assert_close(shared[method], fast, rtol=1e-10, atol=1e-13 * fast.abs().max())
        torch.testing.assert_close(shared["gradient"], explainers["gradient"].maps_for_targets(x, targets))
    # from a layer inside, for the layers below it that a check keeps (CSC), on one shared pass
    layer = ex.layers[len(ex.layers) // 2]
    made = shared_forward({method: ex}, x)
    assert CONNECTED in made.values and made.connected
    vectors = torch.randn(2, *made.values[layer].shape, dtype=torch.float64)
    keep = {"input", ex.layers[1], layer, ex.layers[-1]}
    taps = ForwardPass(ex, x, made.values, made.reference).signals(layer, vectors, keep=keep)
    with memory.limit(2**40):
        chain = ForwardPass(ex, x, *ex._forward_envs(x)).signals(layer, vectors, keep=keep)
    assert list(taps) == list(chain) and set(taps) == keep - {ex.layers[-1]}
    for k in taps:
        torch.testing.assert_close(taps[k], chain[k], rtol=1e-10, atol=1e-13 * chain[k].abs().max())


def test_capture_before_any_map_lets_every_entry_point_answer_in_any_order():
    torch.manual_seed(0)
    model = build("cnn").eval()
    x = torch.rand(3, 1, 28, 28)
    fresh = Explainer(model, "lrp-zplus")
    with pytest.raises(AttributionError, match=r"layers: the model is not captured yet.*capture\(x\)"):
        _ = fresh.layers
    ex = Explainer(model, "lrp-zplus").capture(x[:1])
    assert ex.layers == Explainer(model, "lrp-zplus", graph=trace(model, x)).layers
    assert repr(ex.rule_for("features.0")) == repr(Explainer(model, "lrp-zplus", graph=ex.graph).rule_for("features.0"))
    taps = ex.propagate(x, ex.layers[-1], torch.randn(2, 3, 10))  # three images on a graph captured at one
    assert taps["input"].shape == (2, 3, 1, 28, 28)
    torch.testing.assert_close(ex.attribute(x, target=1), Explainer(model, "lrp-zplus").attribute(x, target=1))
    with pytest.raises(AttributionError, match="capture is not available for the control method 'random'"):
        Explainer(model, "random").capture(x)


def test_a_forward_pass_gives_every_value_and_the_chain_below_a_node():
    torch.manual_seed(0)
    model = build("cnn").eval()
    x, vectors = torch.rand(3, 1, 28, 28), torch.randn(5, 3, 128)
    for method in ("lrp-zplus", "deeplift"):
        ex = Explainer(model, method)
        forward = ex.forward_pass(x)
        assert (forward.reference is not None) == (method == "deeplift")
        torch.testing.assert_close(forward.values[ex.graph.output], model(x), rtol=0, atol=0)
        taps, expected = forward.signals("classifier.0", vectors), ex.propagate(x, "classifier.0", vectors)
        assert set(taps) == set(expected) | {"classifier.0"}  # the injection point too
        for name in expected:
            torch.testing.assert_close(taps[name], expected[name], rtol=0, atol=0)


def test_nodes_name_the_module_they_ran_in():
    model = ResidualNet().eval()
    graph = trace(model, torch.rand(2, 1, 8, 8))
    for node in graph.nodes[1:]:
        if node.kind in ("conv", "dense"):
            assert node.path == node.module.path and model.get_submodule(node.path) is node.module.module
        elif isinstance(node.record, Const) and "." in (node.record.attribute or ""):
            assert node.path == node.record.attribute.rsplit(".", 1)[0]  # a parameter: the module holding it
    assert any(n.kind == "add" and n.path == "" for n in graph.nodes)  # the residual sum: the model's own forward


def test_propagate_is_one_batched_backward(monkeypatch):
    calls = []
    original = R.AlphaBeta.backward

    def counting(self, ctx, signal):
        calls.append(signal.shape[0])
        return original(self, ctx, signal)

    monkeypatch.setattr(R.AlphaBeta, "backward", counting)
    model = build("cnn").eval()
    ex = Explainer(model, "lrp-zplus")
    x = torch.rand(2, 1, 28, 28)
    ex.propagate(x, "classifier.2", torch.randn(1, 2, 10))
    once = len(calls)
    calls.clear()
    ex.propagate(x, "classifier.2", torch.randn(9, 2, 10))
    assert len(calls) == once == 6 and set(calls) == {9}


def test_deeplift_taps_are_contributions():
    model = ResidualNet().double().eval()
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    ex = Explainer(model, "deeplift")
    logits = model(x).detach()
    taps = ex.propagate(x, "fc", torch.eye(3, dtype=torch.float64)[1].expand(1, 2, 3))
    delta = (logits[:, 1] - model(torch.zeros_like(x[:1]))[:, 1]).detach()
    for name in ("r2", "r0", "c0", "input"):  # contributions sum to the output difference at every full cut
        torch.testing.assert_close(taps[name][0].flatten(1).sum(1), delta)


def _snapshot(model):
    return (copy.deepcopy(model.state_dict()), [p.requires_grad for p in model.parameters()], model.training,
            {n: (dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks))
             for n, m in model.named_modules()})


def test_the_users_model_is_never_changed():
    torch.manual_seed(0)
    model = build("vgg", batch_norm=True)
    model.train()
    model.features[0].weight.requires_grad_(False)
    fired = []
    model.features[2].register_forward_hook(lambda *a: fired.append(1))
    before = _snapshot(model)
    x = torch.rand(2, 1, 28, 28)
    graph = None  # captured by the first method that needs it, then shared: the capture is the same for all
    for method in METHODS:
        ex = Explainer(model, method, graph=graph, **CHEAP.get(method, {}))
        if ex.method.engine.fits(ex, x) is not None:  # attention maps of a CNN: refused before running it
            with pytest.raises(AttributionError):
                ex.attribute(x, target=1)
            continue
        ex.attribute(x, target=1)
        graph = graph or ex.graph
        if ex.method.chain:
            ex.propagate(x, ex.layers[-1], torch.randn(2, 2, 10))
        if ex.method.engine.needs_graph:
            with pytest.raises(AttributionError):
                ex.attribute(x, target=10)
    after = _snapshot(model)
    assert before[1:3] == after[1:3] and before[3].keys() == after[3].keys()
    assert all(before[3][k] == after[3][k] for k in before[3])
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert fired == [1]  # the graph is captured once, and its check runs the model's own forward once


def test_eval_semantics_whatever_the_models_mode():
    torch.manual_seed(0)
    model = build("vgg", batch_norm=True)
    x = torch.rand(4, 1, 28, 28)
    model.eval()
    expected = Explainer(model, "gradient").attribute(x, target=0)
    model.train()
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=0), expected)


class _Branchy(nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x


class _CumMax(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x).cummax(1).values


def test_bad_models_and_requests_are_clear_errors():
    with pytest.raises(AttributionError, match="could not capture _Branchy with torch.export"):
        Explainer(_Branchy(), "gradient").attribute(torch.rand(2, 4), target=0)
    with pytest.raises(AttributionError, match=r"unsupported operation: aten.cummax.default .* at node 'cummax'.*Supported"):
        Explainer(_CumMax(), "gradient").attribute(torch.rand(2, 4), target=0)
    with pytest.raises(AttributionError, match="unknown attribution method 'lrp-epsilonplus'.*Did you mean 'lrp-epsilon-plus'"):
        Explainer(build("cnn"), "lrp-epsilonplus")
    with pytest.raises(AttributionError, match="has no parameter gamma"):
        Explainer(build("cnn"), "lrp-epsilon", gamma=0.1)
    ex = Explainer(build("cnn").eval(), "lrp-epsilon")
    x = torch.rand(2, 1, 28, 28)
    with pytest.raises(AttributionError, match="target out of range"):
        ex.attribute(x, target=torch.tensor([1, 12]))
    with pytest.raises(AttributionError, match=r"shape \(2,\)"):
        ex.attribute(x, target=[1, 2, 3])
    with pytest.raises(AttributionError, match="NaN"):
        ex.attribute(x.masked_fill(x > 0.9, float("nan")), target=1)
    with pytest.raises(AttributionError, match="floating-point"):
        ex.attribute(torch.ones(2, 1, 28, 28, dtype=torch.long))
    with pytest.raises(AttributionError, match="unknown layer 'classifier.9'"):
        ex.propagate(x, "classifier.9", torch.randn(1, 2, 10))
    with pytest.raises(AttributionError, match=r"vectors must be \(K, 2, 10\)"):
        ex.propagate(x, "classifier.2", torch.randn(3, 2, 9))
    with pytest.raises(AttributionError, match="not a backward chain"):
        Explainer(build("cnn"), "integrated-gradients").propagate(x, "classifier.2", torch.randn(1, 2, 10))


def test_controls():
    x = torch.zeros(1, 1, 6, 6)
    x[..., 3:] = 1.0
    edge = Explainer(nn.Identity(), "edge").attribute(x)
    assert float(edge[..., 0].abs().max()) == 0.0 and float(edge[0, 0, 2, 2]) == 4.0 and float(edge[0, 0, 2, 3]) == 4.0
    a = Explainer(nn.Identity(), "random", seed=3)
    b = Explainer(nn.Identity(), "random", seed=3)
    first = a.attribute(x)
    torch.testing.assert_close(first, b.attribute(x))
    assert not torch.equal(first, a.attribute(x))  # a fresh draw per call, reproducible per seed


def test_conv1d_batchnorm1d_leaky_relu_and_pooling_1d():
    from captum.attr import DeepLift

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.BatchNorm1d(4), nn.LeakyReLU(0.1), nn.Conv1d(4, 4, 3),
                          nn.MaxPool1d(2), nn.AvgPool1d(2), nn.Flatten(), nn.Linear(24, 3)).double().eval()
    model[1].running_mean.uniform_(-0.5, 0.5)
    x = torch.randn(3, 2, 26, dtype=torch.float64)
    xg = x.clone().requires_grad_()
    grad, = torch.autograd.grad(model(xg)[:, 2].sum(), xg)
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=2), grad)
    ref = DeepLift(model).attribute(x, target=2).detach()
    ours = Explainer(model, "deeplift").attribute(x, target=2)
    assert float((ours - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    delta = (model(x)[:, 2] - model(torch.zeros_like(x[:1]))[:, 2]).detach()
    torch.testing.assert_close(ours.flatten(1).sum(1), delta)


def test_convergence_delta_where_the_method_promises_a_sum():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(1, 3, 3, bias=False), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 6 * 6, 4, bias=False)).double().eval()
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    # the epsilon rule's stabiliser absorbs relevance in proportion to epsilon: tiny here
    tiny = {"stabilizer": 1e-12}
    for method, params in (("deeplift", {}), ("lrp-z", {}), ("lrp-epsilon", {"epsilon": 1e-12}), ("lrp-zplus", tiny),
                           ("lrp-alpha2beta1", tiny)):
        ex = Explainer(model, method, **params)
        assert ex.has_convergence_delta()
        delta = ex.compute_convergence_delta(ex.attribute(x, target=2), x, target=2)
        assert delta.shape == (3,) and float(delta.abs().max()) < 1e-8, (method, delta)
    ig = Explainer(model, "integrated-gradients")
    assert float(ig.compute_convergence_delta(ig.attribute(x, target=2, n_steps=200), x, 2).abs().max()) < 1e-3
    # with biases, DeepLIFT stays complete and the LRP sum loses what the biases absorb
    biased = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2)).double().eval()
    xb = torch.rand(6, 5, dtype=torch.float64)
    dl = Explainer(biased, "deeplift")
    assert float(dl.compute_convergence_delta(dl.attribute(xb, target=1), xb, 1).abs().max()) < 1e-8
    eps = Explainer(biased, "lrp-epsilon")
    assert float(eps.compute_convergence_delta(eps.attribute(xb, target=1), xb, 1).abs().max()) > 1e-6
    grad = Explainer(model, "gradient")
    assert not grad.has_convergence_delta()
    with pytest.raises(AttributionError, match="promises no completeness"):
        grad.compute_convergence_delta(x, x, 0)


def test_inputs_of_another_dtype_than_the_model_are_a_clear_error():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2)).double()
    with pytest.raises(AttributionError, match=r"inputs are torch.float32 but the model computes in torch.float64"):
        Explainer(model, "gradient").attribute(torch.rand(1, 1, 2, 2), target=0)
    with pytest.raises(AttributionError, match=r"torch.float16 but the model computes in torch.float64"):
        Explainer(model, "deeplift").attribute(torch.rand(1, 1, 2, 2).half(), target=0)


def test_inputs_the_model_cannot_take_are_a_clear_error():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 6 * 6, 3))
    with pytest.raises(AttributionError, match=r"forward fails on inputs of shape \(2, 3, 8, 8\).*channels"):
        Explainer(model, "lrp-epsilon").attribute(torch.rand(2, 3, 8, 8), target=0)
    with pytest.raises(AttributionError, match=r"inputs of shape \(2, 1, 9, 9\)"):
        Explainer(model, "gradient").attribute(torch.rand(2, 1, 9, 9), target=0)
