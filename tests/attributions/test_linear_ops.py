"""The layer operations' transposes against autograd's input gradients."""
import pytest
import torch
from torch import nn

from attributions.explainer import Explainer
from attributions.graph import trace
from attributions.linear_ops import OPS


@pytest.mark.parametrize("conv,shape", [
    (nn.Conv2d(3, 6, 3, stride=2, padding=1), (2, 3, 9, 9)),
    (nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2), (2, 4, 8, 8)),
    (nn.Conv2d(2, 3, 4, stride=3), (2, 2, 11, 11)),  # the last rows and columns are read by no window
    (nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), (2, 2, 7, 7)),
    (nn.Conv2d(2, 3, (3, 2), padding="same", bias=False), (2, 2, 6, 5)),
    (nn.Conv1d(2, 3, 3, stride=2, padding=1), (2, 2, 9)),
])
def test_convolution_transpose_is_its_input_gradient(conv, shape):
    torch.manual_seed(0)
    conv = conv.double()
    model = nn.Sequential(conv)
    node = next(n for n in trace(model, torch.zeros(shape, dtype=torch.float64)).nodes if n.kind == "conv")
    # the convolution's own input: a padding mode other than zeros is an op of its own before it
    x = Explainer(model, "gradient")._forward_envs(torch.randn(shape, dtype=torch.float64))[0][node.inputs[0]]
    x = x.clone().requires_grad_(True)
    y = OPS["conv"](node).forward(x, conv.weight, conv.bias)
    signals = torch.randn(3, *y.shape, dtype=torch.float64)  # K = 3 signals at once
    got = OPS["conv"](node).transpose(signals, conv.weight, x.shape)
    want = torch.stack([torch.autograd.grad(y, x, s, retain_graph=True)[0] for s in signals])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
