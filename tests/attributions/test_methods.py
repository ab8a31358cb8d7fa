"""Our maps against captum's, in float64: max |difference| <= 1e-5 of the map's max |value|."""
import copy

import pytest
import torch
from captum.attr import (
    Deconvolution,
    DeepLift,
    GuidedBackprop,
    InputXGradient,
    IntegratedGradients,
    NoiseTunnel,
    Saliency,
)
from torch import nn

from attributions import Explainer, available_methods
from attributions.engines import SmoothGradEngine
from attributions.errors import AttributionError
from attributions.graph import trace
from attributions.rules import WinnerTakeAll
from attributions.shared_pass import SharedPass
from audit.models import build
from tests.engine_models import (
    ConvPoolNet,
    ResidualNet,
    randomize_batchnorm,
    set_biases,
)
from tests.engine_zoo import ZOO, zoo_model
from tests.model_libraries import CHEAP


def _close(ours, ref, tolerance=1e-5):
    ref = ref.detach()
    scale = float(ref.abs().max())
    assert scale > 0
    assert float((ours - ref).abs().max()) <= tolerance * scale


def _models():
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    out = {"cnn": build("cnn"), "vgg": build("vgg"), "vgg-bn": randomize_batchnorm(build("vgg", batch_norm=True), gen),
           "resnet": randomize_batchnorm(build("resnet"), gen),
           "convpool": randomize_batchnorm(set_biases(ConvPoolNet(), -0.3, 0.3), gen),
           "residual": set_biases(ResidualNet(), -0.3, 0.3)}
    return {k: m.double().eval() for k, m in out.items()}


MODELS = _models()


def _x(name, seed=1):
    size = 8 if name in ("convpool", "residual") else 28
    return torch.rand(3, 1, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("method,peer", [
    ("gradient", lambda m, x, t: Saliency(m).attribute(x, target=t, abs=False)),
    ("input-x-gradient", lambda m, x, t: InputXGradient(m).attribute(x, target=t)),
    ("guided-backprop", lambda m, x, t: GuidedBackprop(m).attribute(x, target=t)),
    ("deconvnet", lambda m, x, t: Deconvolution(m).attribute(x, target=t)),
    ("integrated-gradients", lambda m, x, t: IntegratedGradients(m).attribute(x, target=t, n_steps=16)),
])
def test_gradient_family_matches_captum(name, method, peer):
    model, x, t = MODELS[name], _x(name), torch.tensor([0, 1, 2])
    kwargs = {"n_steps": 16} if method == "integrated-gradients" else {}
    _close(Explainer(model, method, **kwargs).attribute(x, target=t), peer(model, x, t))


# captum's DeepLift applies its rule to a nonlinearity only through a tensor hook on the layer's
# input; when a hooked nonlinearity feeds another (ReLU -> MaxPool), the later rule's change is
# dropped (the earlier module records the gradient before it). These models keep hooked
# nonlinearities apart, or (zero biases) make the max-pooling rule coincide with the gradient.
@pytest.mark.parametrize("name", ["cnn", "vgg", "resnet", "convpool", "residual"])
def test_deeplift_matches_captum(name):
    model, x = MODELS[name], _x(name)
    _close(Explainer(model, "deeplift").attribute(x, target=2), DeepLift(model).attribute(x, target=2))


def test_deeplift_maxpool_rule_is_exercised():
    """In ConvPoolNet the reference beats the input in some pooling windows, where captum's
    max-pooling rule differs from the plain gradient: our match is not a coincidence."""
    model, x = MODELS["convpool"], _x("convpool")
    ours = Explainer(model, "deeplift").attribute(x, target=2)
    grad_pool = Explainer(model, "deeplift", rules={"maxpool": WinnerTakeAll()})
    assert float((grad_pool.attribute(x, target=2) - ours).abs().max()) > 1e-3 * float(ours.abs().max())


@pytest.mark.parametrize("name", list(MODELS))
def test_deeplift_sums_to_output_difference(name):
    model, x = MODELS[name], _x(name)
    attr = Explainer(model, "deeplift").attribute(x, target=1)
    delta = model(x)[:, 1] - model(torch.zeros_like(x[:1]))[:, 1]
    torch.testing.assert_close(attr.flatten(1).sum(1), delta.detach(), rtol=1e-9, atol=1e-9)


def test_noise_tunnel_wraps_our_methods():
    model, x = MODELS["cnn"], _x("cnn")
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    ours = Explainer(model, "smoothgrad", samples=8, seed=5).attribute(x, target=1)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's generator as it was
    ref = []  # seeded: each image on its own, its noise seeded by the seed and its values, sigma from its range
    for image in x:
        torch.manual_seed(SmoothGradEngine(seed=5).image_seed(image))
        ref.append(NoiseTunnel(Saliency(model)).attribute(image[None], nt_type="smoothgrad", nt_samples=8,
                                                          stdevs=0.15 * float(image.max() - image.min()), target=1,
                                                          abs=False))
    _close(ours, torch.cat(ref))
    torch.manual_seed(5)  # seed None: the global generator as it goes, for the batch, captum's own way
    sigma = 0.15 * float(x.max() - x.min())
    batch = NoiseTunnel(Saliency(model)).attribute(x, nt_type="smoothgrad", nt_samples=8, stdevs=sigma, target=1,
                                                   abs=False)
    torch.manual_seed(5)
    _close(Explainer(model, "smoothgrad", samples=8, seed=None).attribute(x, target=1), batch)
    smoothed_lrp = NoiseTunnel(Explainer(model, "lrp-epsilon")).attribute(x, nt_type="smoothgrad", nt_samples=4,
                                                                           stdevs=0.1, target=1)
    assert smoothed_lrp.shape == x.shape and torch.isfinite(smoothed_lrp).all()


@pytest.mark.parametrize("name", ["cnn", "resnet"])
def test_smoothgrad_over_integrated_gradients_matches_captum(name):
    """Adebayo et al.'s SmoothGrad over IG: captum's NoiseTunnel around IntegratedGradients, same seed, same noise."""
    model, x = MODELS[name], _x(name)
    target = torch.tensor([1, 0, 2])
    ours = Explainer(model, "smoothgrad-ig", samples=5, n_steps=8, noise=0.2, seed=7).attribute(x, target=target)
    ref = []
    for image, t in zip(x, target):
        torch.manual_seed(SmoothGradEngine(seed=7).image_seed(image))
        ref.append(NoiseTunnel(IntegratedGradients(model)).attribute(
            image[None], nt_type="smoothgrad", nt_samples=5, stdevs=0.2 * float(image.max() - image.min()),
            target=t[None], n_steps=8))
    _close(ours, torch.cat(ref), 1e-6)
    baseline = Explainer(model, "smoothgrad-ig", samples=5, n_steps=8, noise=0.0).attribute(x, target=target)
    _close(baseline, IntegratedGradients(model).attribute(x, target=target, n_steps=8), 1e-6)  # no noise: IG itself


# --- the architectures people audit (tests/engine_zoo.py), in float64 --------------------------------

@pytest.fixture(scope="module", params=list(ZOO))
def zoo(request):
    torch.manual_seed(1)
    return request.param, zoo_model(request.param), torch.rand(3, 1, 8, 8, dtype=torch.float64)


def test_zoo_gradient_is_autograd(zoo):
    _, model, x = zoo
    xr = x.clone().requires_grad_(True)
    expected = torch.autograd.grad(model(xr)[:, 2].sum(), xr)[0]
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=2), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("method,peer", [("input-x-gradient", InputXGradient), ("integrated-gradients",
                                                                                 IntegratedGradients)])
def test_zoo_input_x_gradient_and_integrated_gradients_are_captum(zoo, method, peer):
    _, model, x = zoo
    kwargs = {"n_steps": 8} if method == "integrated-gradients" else {}
    _close(Explainer(model, method).attribute(x, target=2, **kwargs), peer(model).attribute(x, target=2, **kwargs))


def test_zoo_deeplift_is_complete(zoo):
    _, model, x = zoo
    ex = Explainer(model, "deeplift")
    delta = ex.compute_convergence_delta(ex.attribute(x, target=2), x, target=2)
    assert float(delta.abs().max()) < 1e-8


def test_zoo_lrp_conserves_on_bias_free_variants(zoo):
    name, _, x = zoo
    model = zoo_model(name, bias=False)
    for method, params in (("lrp-epsilon", {"epsilon": 1e-12}), ("lrp-z", {"stabilizer": 1e-12})):
        ex = Explainer(model, method, **params)
        delta = ex.compute_convergence_delta(ex.attribute(x, target=2), x, target=2)
        assert float(delta.abs().max()) < 1e-8, (method, delta)


def test_zoo_every_method_is_finite_and_deterministic(zoo):
    name, model, x = zoo
    graph = trace(model, x)  # captured once: every explainer below shares it
    for method in available_methods():
        params = CHEAP.get(method, {})
        probe = Explainer(model, method, graph=graph, **params)
        if probe.method.engine.fits(probe, x) is not None:  # attention maps of a CNN; every method fits a ViT
            assert not name.startswith("vit"), (name, method, probe.method.engine.fits(probe, x))
            continue
        first = probe.attribute(x, target=1)
        again = Explainer(model, method, graph=graph, **params).attribute(x, target=1)
        assert first.shape == x.shape and bool(torch.isfinite(first).all()), method
        assert torch.equal(first, again), method  # SmoothGrad's noise too: seeded, the same on every call


def test_deeplift_matches_captum_on_smooth_activation_modules():
    # captum's DeepLift rescales these module nonlinearities as we do: (f(x) - f(x0)) / (x - x0)
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(6, 8), nn.Sigmoid(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.ELU(),
                          nn.Linear(8, 8), nn.Softplus(), nn.Linear(8, 3)).double().eval()
    x = torch.randn(4, 6, dtype=torch.float64)
    _close(Explainer(model, "deeplift").attribute(x, target=1), DeepLift(model).attribute(x, target=1))


def test_zoo_recorded_forward_graph_equals_rerunning_each_op(zoo):
    # The forward pass keeps the autograd graph of the nodes whose rule differentiates them; the backward
    # then calls autograd on it (batched over K targets) instead of re-running the op: same maps.
    _, model, x = zoo
    targets = [0, 2, torch.tensor([1, 0, 2])]
    for method in ("gradient", "guided-backprop", "lrp-epsilon", "deeplift", "lrp-epsilon-plus"):
        ex = Explainer(model, method)
        recorded = ex.maps_for_targets(x, targets, SharedPass(*ex._forward_envs(x)))
        assert ex.recorded or method != "gradient"  # every zoo model has a traced op the gradient records
        rerun = ex.maps_for_targets(x, targets, SharedPass(*ex._forward_envs(x, record=frozenset())))
        torch.testing.assert_close(recorded, rerun, rtol=1e-12, atol=1e-12, msg=method)
        if method == "gradient":
            xr = x.clone().requires_grad_(True)
            expected = torch.autograd.grad(model(xr)[:, 2].sum(), xr)[0]
            torch.testing.assert_close(recorded[1], expected, rtol=0, atol=1e-10)


# not "cnn": a ReLU feeding a max-pooling layer, where captum drops the later rule (see above) and a
# reference other than zero no longer makes the max-pooling rule coincide with the gradient
@pytest.mark.parametrize("name", ["resnet", "convpool", "residual"])
def test_a_reference_input_other_than_zero_matches_captum(name):
    model, x = MODELS[name], _x(name)
    ref = torch.full_like(x[:1], 0.3)
    _close(Explainer(model, "deeplift", baseline=0.3).attribute(x, target=2),
           DeepLift(model).attribute(x, target=2, baselines=ref))
    _close(Explainer(model, "integrated-gradients", n_steps=16, baseline=0.3).attribute(x, target=2),
           IntegratedGradients(model).attribute(x, target=2, baselines=ref, n_steps=16))
    ex = Explainer(model, "deeplift", baseline=0.3)
    delta = ex.compute_convergence_delta(ex.attribute(x, target=2), x, target=2)
    assert float(delta.abs().max()) < 1e-9  # completeness against f(x) - f(x0), x0 = 0.3 everywhere


def test_a_baseline_per_channel_and_bad_baselines():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(3 * 4 * 4, 4)).double().eval()
    x = torch.rand(2, 2, 6, 6, dtype=torch.float64)
    ex = Explainer(model, "deeplift", baseline=[0.1, -0.2])
    assert ex.baseline_like(x)[0, :, 0, 0].tolist() == [0.1, -0.2]
    ref = ex.baseline_like(x)
    _close(ex.attribute(x, target=1), DeepLift(model).attribute(x, target=1, baselines=ref))
    with pytest.raises(AttributionError, match="baseline has 3 values but the inputs have 2 channels"):
        Explainer(model, "deeplift", baseline=[0.1, 0.2, 0.3]).attribute(x, target=1)
    for bad in ("zero", [], [0.1, "a"], True):
        with pytest.raises(AttributionError, match="baseline must be a number or one number per input channel"):
            Explainer(model, "integrated-gradients", baseline=bad)


def test_smoothgrads_noise_is_the_same_on_every_model_so_a_map_meets_itself():
    """The same images get the same noise draws on every call and every model: two calls on one model give one map
    (the ceiling the randomization checks read against is 1), while a model with other weights gives another map
    from the same noise; another seed draws other noise."""
    model, x = MODELS["cnn"], _x("cnn")
    first = Explainer(model, "smoothgrad", samples=4).attribute(x, target=1)
    torch.manual_seed(99)  # the global generator's state does not enter
    assert torch.equal(first, Explainer(model, "smoothgrad", samples=4).attribute(x, target=1))
    assert not torch.equal(first, Explainer(model, "smoothgrad", samples=4, seed=1).attribute(x, target=1))
    # the last linear layer's weight and bias doubled: every logit, and so every gradient at every noisy point,
    # doubles, and the map doubles exactly only where both models saw the same noise
    other = copy.deepcopy(model)
    last = [m for m in other.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(2.0)
        last.bias.mul_(2.0)
    _close(Explainer(other, "smoothgrad", samples=4).attribute(x, target=1), 2 * first)


@pytest.mark.parametrize("method", ["smoothgrad", "smoothgrad-ig"])
def test_smoothgrads_noise_of_an_image_does_not_depend_on_the_images_beside_it(method):
    """An image explained alone, in a batch, or in another batch order gets the same map: a check that explains a
    share of its images on another model (a twin pair, an untrained copy's seed, a block) compares maps of the same
    noise."""
    model, x = MODELS["cnn"], _x("cnn")
    kwargs = {"samples": 4} | ({"n_steps": 4} if method == "smoothgrad-ig" else {})
    batch = Explainer(model, method, **kwargs).attribute(x, target=1)
    alone = torch.cat([Explainer(model, method, **kwargs).attribute(x[i:i + 1], target=1) for i in range(len(x))])
    reordered = Explainer(model, method, **kwargs).attribute(x.flip(0), target=1).flip(0)
    _close(alone, batch)
    _close(reordered, batch)
    # the seed enters: another seed is other noise for the same image
    assert not torch.allclose(Explainer(model, method, seed=3, **kwargs).attribute(x[:1], target=1), batch[:1])


@pytest.mark.parametrize("name, params, message", [
    ("smoothgrad", {"seed": "x"}, "parameter seed must be None or int, got 'x'"),
    ("smoothgrad", {"seed": 1.5}, "parameter seed must be None or int, got 1.5"),
    ("smoothgrad", {"samples": True}, "parameter samples must be int, got True"),
    ("grad-cam", {"relu": 1}, "parameter relu must be bool, got 1"),
    ("rectgrad", {"q": "98"}, "parameter q must be float, got '98'")])
def test_a_parameter_of_the_wrong_type_is_the_toolkits_error(name, params, message):
    import numpy as np

    from attributions.errors import AttributionError
    from attributions.methods import build_method
    with pytest.raises(AttributionError, match=message):
        build_method(name, **params)
    # what the types allow: an integer for a float, numpy's scalars, None where declared
    for ok in ({"noise": 1}, {"samples": np.int64(4)}, {"noise": np.float32(0.1)}, {"seed": None}):
        build_method("smoothgrad", **ok)
