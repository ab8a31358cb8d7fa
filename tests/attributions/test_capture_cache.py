"""Programs kept per model: a model is exported once per input shape and structure, and its deep copies use its
program while reading their own tensors."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from attributions import Explainer, capture_cache
from attributions.capture import capture
from audit.models import load_checkpoint
from audit.models.copying import copy_model


class _Net(nn.Module):
    def __init__(self, slope: float = 0.1):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.act = nn.LeakyReLU(slope)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(4 * 2 * 2, 3)
        self.register_buffer("shift", torch.zeros(3))
        self.scale = torch.full((3,), 2.0)  # a tensor attribute: a constant of the program

    def forward(self, x):
        return self.fc(self.pool(self.act(self.conv(x))).flatten(1)) * self.scale + self.shift


@pytest.fixture
def exports(monkeypatch):
    """The number of torch.export calls made so far."""
    count = [0]
    export = torch.export.export

    def counted(*args, **kwargs):
        count[0] += 1
        return export(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    return count


def _gradient(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return Explainer(model, "gradient").attribute(x, target=1)


def _autograd(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_()
    return torch.autograd.grad(model(x)[:, 1].sum(), x)[0]


def test_a_model_is_exported_once_per_input_shape(exports):
    model = _Net()
    x = torch.rand(3, 1, 8, 8)
    first = _gradient(model, x)
    assert exports[0] == 1
    again = _gradient(model, torch.rand(5, 1, 8, 8))  # another batch size: the batch axis is dynamic
    assert exports[0] == 1 and again.shape == (5, 1, 8, 8)
    torch.testing.assert_close(_gradient(model, x), first, rtol=0, atol=0)
    assert exports[0] == 1
    _gradient(model, torch.rand(2, 1, 9, 9))  # another image size: exported at it
    assert exports[0] == 2


def test_a_deep_copy_uses_the_program_and_reads_its_own_tensors(exports):
    model = _Net()
    x = torch.rand(4, 1, 8, 8)
    _gradient(model, x)
    twin = copy_model(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.copy_(torch.randn_like(p))
    twin.scale.mul_(-3.0)  # a tensor attribute of the copy, changed in place: read from the copy
    torch.testing.assert_close(_gradient(twin, x), _autograd(twin, x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(_gradient(model, x), _autograd(model, x), rtol=1e-5, atol=1e-6)
    assert exports[0] == 1
    # a copy of the copy goes to the same original
    assert capture_cache.lookup(copy_model(twin), x) is not None


@pytest.mark.parametrize("change", ["replaced layer", "plain attribute", "instance forward", "dtype"])
def test_a_changed_structure_is_exported_anew(exports, change):
    model = _Net()
    x = torch.rand(2, 1, 8, 8)
    _gradient(model, x)
    if change == "replaced layer":
        model.act = nn.Tanh()
    elif change == "plain attribute":
        model.act.negative_slope = 0.5  # the slope is a constant of the exported graph
    elif change == "instance forward":
        plain = model.forward
        model.forward = lambda x: plain(x) * 3.0
    else:
        model.double()
        x = x.double()
    assert capture_cache.lookup(model, x) is None
    torch.testing.assert_close(_gradient(model, x), _autograd(model, x), rtol=1e-5, atol=1e-6)
    assert exports[0] == 2


def test_forget_and_the_models_lifetime(exports):
    model = _Net()
    x = torch.rand(2, 1, 8, 8)
    capture(model, x)
    capture_cache.forget(model)
    capture(model, x)
    assert exports[0] == 2
    # the kept program refers to no model: it goes with the model it was exported from
    gone = weakref.ref(model)
    twin = copy_model(model)
    capture(twin, x)
    del model, twin
    gc.collect()
    assert gone() is None


def test_a_fixed_batch_program_serves_only_its_batch(exports):
    class Fixed(_Net):
        def forward(self, x):
            return super().forward(x.reshape(4, 1, 8, 8))  # the batch size written in the code

    model = Fixed()
    assert not capture(model, torch.rand(4, 1, 8, 8)).dynamic_batch
    capture(model, torch.rand(4, 1, 8, 8))
    assert exports[0] == 2  # the dynamic attempt fails, then the static export; the second call is served
    assert capture_cache.lookup(model, torch.rand(2, 1, 8, 8)) is None


def test_a_checkpoint_copy_has_the_fingerprint_of_its_original():
    model = load_checkpoint("vit-sgd")
    twin = copy_model(model)
    assert capture_cache.fingerprint(twin) == capture_cache.fingerprint(model)
    twin.blocks[0].attn.num_heads = 1
    assert capture_cache.fingerprint(twin) != capture_cache.fingerprint(model)
