"""Graph capture by torch.export: what it captures, what it binds to the live model, what it refuses."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from attributions import Explainer
from attributions.capture import capture, logits_of
from attributions.errors import AttributionError
from attributions.hooks import forward_changing_hooks
from audit.models import load_checkpoint
from tests.engine_zoo import ZOO, zoo_model


def _targets(c) -> set[str]:
    return {str(n.target) for n in c.ops()}


@pytest.mark.parametrize("name", ["cnn-sgd", "resnet-sgd", "vit-sgd"])
def test_the_shipped_models_are_captured_with_a_dynamic_batch(name):
    model = load_checkpoint(name)
    c = capture(model, torch.rand(1, 1, 28, 28))
    assert c.dynamic_batch and c.output.op == "call_function" and "aten.linear.default" in _targets(c)
    # every parameter and buffer is bound to the live tensor of the model, by its name
    bound = {s.target: c.value(k) for k, s in c.sources.items() if s.kind in ("parameter", "buffer")}
    assert set(bound) == {k for k, _ in model.named_parameters()} | {k for k, _ in model.named_buffers()}
    assert all(bound[k] is model.get_parameter(k) for k, _ in model.named_parameters())
    paths = {c.module_path(n) for n in c.ops()}
    assert {p for p in paths if p} <= {k for k, _ in model.named_modules()}


def test_weights_are_read_live_not_copied():
    model = load_checkpoint("cnn-sgd")
    c = capture(model, torch.rand(2, 1, 28, 28))
    name = next(k for k, s in c.sources.items() if s.target == "features.0.weight")
    with torch.no_grad():
        model.features[0].weight.mul_(2)
    assert torch.equal(c.value(name), model.features[0].weight)
    # a tensor replaced on its module (as a user re-initialising by assignment would) is the one read
    model.features[0].weight = nn.Parameter(torch.randn_like(model.features[0].weight))
    assert c.value(name) is model.features[0].weight
    bias = next(k for k, s in c.sources.items() if s.target == "features.0.bias")
    del model.features[0].bias  # removed from the model after the capture: named, not a raw AttributeError
    with pytest.raises(AttributionError, match="no parameter 'features.0.bias' any more"):
        c.value(bias)


def test_attention_arrives_as_linear_and_sdpa():
    c = capture(load_checkpoint("vit-sgd"), torch.rand(2, 1, 28, 28))
    assert {"aten.scaled_dot_product_attention.default", "aten.layer_norm.default", "aten.gelu.default"} <= _targets(c)
    assert {c.module_path(n) for n in c.ops() if "scaled_dot" in str(n.target)} == {f"blocks.{i}.attn" for i in range(4)}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_model_of_the_test_zoo_is_captured(name):
    model = zoo_model(name)
    c = capture(model, torch.rand(2, 1, 8, 8, dtype=torch.float64))
    assert c.ops() and c.shape == (2, 1, 8, 8)
    with pytest.raises(AttributionError, match=r"forward fails on inputs of shape \(2, 3, 28, 28\).*channels"):
        capture(model, torch.rand(2, 3, 28, 28, dtype=torch.float64))


@dataclass
class _Output:
    logits: torch.Tensor
    hidden: torch.Tensor


class _Returns(nn.Module):
    """A linear classifier returning its logits the way ``kind`` says; forward takes an optional mask."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.fc = kind, nn.Linear(6, 3)

    def forward(self, x, mask=None):
        z = self.fc(x if mask is None else x * mask)
        return {"tensor": z, "tuple": (z, x), "dict": {"logits": z, "hidden": x}, "object": _Output(z, x),
                "text": "z"}[self.kind]


@pytest.mark.parametrize("kind", ["tensor", "tuple", "dict", "object"])
def test_outputs_as_libraries_define_them_and_optional_arguments(kind):
    c = capture(_Returns(kind), torch.rand(3, 6))
    assert c.output.target == torch.ops.aten.linear.default
    assert [s.kind for s in c.sources.values()].count("input") == 1  # the mask is not an input


def test_an_output_without_logits_is_refused():
    with pytest.raises(AttributionError, match="returns a str, not the logits"):
        capture(_Returns("text"), torch.rand(3, 6))
    assert torch.equal(logits_of((torch.ones(1), "x")), torch.ones(1))


class _Branching(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x


class _Sized(nn.Module):
    """Control flow on sizes (fine for export) and a batch fixed in the code (a static capture)."""

    def forward(self, x):
        if x.shape[-1] > 4:
            x = x[..., :4]
        return x.reshape(3, -1)


def test_control_flow_on_values_gets_a_clear_error_and_on_sizes_is_followed(capfd):
    with pytest.raises(AttributionError, match=r"could not capture _Branching with torch.export.*branching on tensor "
                                               "values is not"):
        capture(_Branching(), torch.rand(3, 4))
    assert "def forward" not in capfd.readouterr().err  # export's partial graph is not printed at the user
    c = capture(_Sized(), torch.rand(3, 6))
    assert not c.dynamic_batch and "aten.slice.Tensor" in _targets(c)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 2, 3), nn.Linear(8, 3)
        self.norm = nn.BatchNorm2d(2)

    def forward(self, x):
        return self.fc(torch.relu_(self.norm(self.conv(x))).flatten(1))


def test_the_model_is_left_unchanged_and_observing_hooks_run_only_in_the_check():
    model = _Net().train()
    called = []

    def observe(module, args, out):
        called.append((module, module.training))

    handles = [model.conv.register_forward_hook(observe), model.register_forward_pre_hook(lambda m, a: None)]
    before = copy.deepcopy(model.state_dict())
    c = capture(model, torch.rand(2, 1, 4, 4))
    # the export runs no hook; the check after it runs the model's own forward once, in eval mode
    assert called == [(model.conv, False)] and model.training and model.norm.training  # flags restored
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # running stats untouched
    assert len(model.conv._forward_hooks) == 1 and len(model._forward_pre_hooks) == 1
    assert "aten.relu_.default" in _targets(c) and "aten.batch_norm.default" in _targets(c)
    for h in handles:  # the handles still reach the hooks they registered
        h.remove()
    assert not model.conv._forward_hooks and not model._forward_pre_hooks


def test_hooks_that_may_change_the_output_are_refused_by_name():
    model = _Net().eval()

    def mask(module, args, out):
        return out * 0

    model.conv.register_forward_hook(mask)
    assert forward_changing_hooks(model) == ["conv: forward hook test_hooks_that_may_change_the_output_are_refused_by_"
                                             "name.<locals>.mask"]
    with pytest.raises(AttributionError, match=r"hooks that may change what it computes \(conv: forward hook .*mask\)"):
        capture(model, torch.rand(2, 1, 4, 4))
    handle = nn.modules.module.register_module_forward_pre_hook(lambda m, a: a)
    try:
        assert [h.split(" test_")[0] for h in forward_changing_hooks(_Net())] == ["every module: global forward pre hook"]
    finally:
        handle.remove()


def test_hooks_that_write_in_place_are_refused_and_lambdas_that_store_are_not():
    store: dict = {}

    def scale_in_place(module, args, out):  # returns None, changes the output all the same
        out.mul_(2)

    def zero_first_input(module, args):
        args[0][0] = 0

    def keep(module, args, out):
        store["conv"] = out.detach()

    for changing in (scale_in_place, lambda m, a, o: o.__setitem__(0, 1.0), lambda m, a, o: o.data.clamp_(min=0)):
        model = _Net().eval()
        model.conv.register_forward_hook(changing)
        assert len(forward_changing_hooks(model)) == 1, changing
    model = _Net().eval()
    model.register_forward_pre_hook(zero_first_input)
    assert forward_changing_hooks(model) == [f"the model: forward pre hook {zero_first_input.__qualname__}"]
    for observing in (keep, lambda m, a, o: store.__setitem__("conv", o), lambda m, a, o: store.setdefault("c", o)):
        model = _Net().eval()
        model.conv.register_forward_hook(observing)
        assert forward_changing_hooks(model) == [], observing
        capture(model, torch.rand(2, 1, 4, 4))
    assert store.keys() == {"conv", "c"}  # they ran once, in the capture's check of the model's own forward


def test_classic_spectral_norm_is_refused_and_its_parametrization_followed():
    """The classic spectral_norm recomputes the weight in a forward pre-hook from weight_orig: the engine, which
    never runs hooks, would read a stale weight, and randomizing weight_orig would change no map. The
    parametrization (torch.nn.utils.parametrizations) is part of the forward and is followed exactly."""
    torch.manual_seed(0)
    x = torch.rand(2, 1, 4, 4)
    classic = _Net().eval()
    classic.conv = nn.utils.spectral_norm(classic.conv)
    with pytest.raises(AttributionError, match="SpectralNorm.*use torch.nn.utils.parametrizations.spectral_norm"):
        capture(classic, x)
    model = _Net().eval()
    model.conv = nn.utils.parametrizations.spectral_norm(model.conv)
    xg = x.clone().requires_grad_()
    expected = torch.autograd.grad(model(xg)[:, 0].sum(), xg)[0]
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=0), expected, rtol=1e-6, atol=1e-7)


def test_a_forward_that_changes_the_model_is_refused():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return x

    with pytest.raises(AttributionError, match="forward changes calls"):
        capture(Counter(), torch.rand(2, 3))
