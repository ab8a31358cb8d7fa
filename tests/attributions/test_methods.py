"""Our maps against captum's, in float64: max |difference| <= 1e-5 of the map's max |value|."""
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

from attributions import Explainer
from attributions.rules import WinnerTakeAll
from audit.models import build
from tests.engine_models import (
    ConvPoolNet,
    ResidualNet,
    randomize_batchnorm,
    set_biases,
)


def _close(ours, ref):
    ref = ref.detach()
    scale = float(ref.abs().max())
    assert scale > 0
    assert float((ours - ref).abs().max()) <= 1e-5 * scale


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
    torch.manual_seed(5)
    ours = Explainer(model, "smoothgrad", samples=8).attribute(x, target=1)
    torch.manual_seed(5)
    sigma = 0.15 * float(x.max() - x.min())
    ref = NoiseTunnel(Saliency(model)).attribute(x, nt_type="smoothgrad", nt_samples=8, stdevs=sigma, target=1,
                                                 abs=False)
    _close(ours, ref)
    smoothed_lrp = NoiseTunnel(Explainer(model, "lrp-epsilon")).attribute(x, nt_type="smoothgrad", nt_samples=4,
                                                                           stdevs=0.1, target=1)
    assert smoothed_lrp.shape == x.shape and torch.isfinite(smoothed_lrp).all()
