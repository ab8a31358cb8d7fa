"""The engine bench's floors (benchmarks/engine.py)."""
import torch
from torch import nn

from attributions import linear_ops
from benchmarks.engine import engine_pooling


def test_engine_pooling_pools_as_the_model_does_and_is_undone(monkeypatch):
    monkeypatch.setattr(linear_ops, "CHANNELS_LAST_POOLING", 0)  # the channels-last kernel on a small input
    pool = nn.MaxPool2d(3, 2, 1)
    x = torch.randn(2, 3, 9, 9).clamp(min=0).requires_grad_()
    expected = pool(x)
    (grad,) = torch.autograd.grad(expected.sum(), x)
    original = nn.MaxPool2d.forward
    with engine_pooling():
        assert nn.MaxPool2d.forward is not original
        out = pool(x)
        assert torch.equal(out, expected) and torch.equal(torch.autograd.grad(out.sum(), x)[0], grad)
        assert torch.equal(pool(x[0]), expected[0])  # 3-D inputs take the model's own kernel
    assert nn.MaxPool2d.forward is original
