"""The layer operations' transposes against autograd's input gradients."""
import pytest
import torch
from torch import nn

from attributions.explainer import Explainer
from attributions.graph import trace
from attributions.linear_ops import OPS, DenseOp
from tests.engine_models import MaskedAttention


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


@pytest.mark.parametrize("pool", [nn.MaxPool2d(2), nn.MaxPool2d(3, 2, 1), nn.MaxPool2d(3, 2, ceil_mode=True),
                                  nn.MaxPool2d(3, 1, 1, dilation=2), nn.MaxPool2d((2, 3), (1, 2))])
@pytest.mark.parametrize("data", ["relu", "ties", "nan"])
@pytest.mark.parametrize("channels_last", [True, False])
def test_max_pool_takes_torchs_values_winners_and_gradient(pool, data, channels_last, monkeypatch):
    from attributions import linear_ops
    from attributions.linear_ops import max_pool

    if channels_last:  # the kernel for large inputs, on a small one
        monkeypatch.setattr(linear_ops, "CHANNELS_LAST_POOLING", 0)
    torch.manual_seed(0)
    x = torch.randn(3, 5, 17, 13, dtype=torch.float64)
    if data == "relu":  # windows of zeros: the first zero wins
        x = x.clamp(min=0)
    elif data == "ties":
        x = torch.randint(0, 3, x.shape).double()
    else:
        x[x > 1.5] = float("nan")
    expected, winners = torch.nn.functional.max_pool2d(x, pool.kernel_size, pool.stride, pool.padding, pool.dilation,
                                                       ceil_mode=pool.ceil_mode, return_indices=True)
    out, indices = max_pool(x, pool)
    assert torch.equal(indices, winners) and indices.is_contiguous() and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    g = torch.randn_like(out)
    leaf = x.clone().requires_grad_()
    torch.autograd.backward(max_pool(leaf, pool)[0], g)
    reference = x.clone().requires_grad_()
    torch.autograd.backward(pool(reference), g)
    assert torch.equal(leaf.grad, reference.grad)


@pytest.mark.parametrize("zero,read", [((0, 1), (2,)), ((1, 2), (0,)), ((1,), (0, 2)), ((), (0, 1, 2)),
                                       ((0, 1, 2), ()), ((0, 1, 3, 4), (2, 5)), ((0, 5), (1, 2, 3, 4))])
def test_dense_transpose_multiplies_only_the_blocks_with_a_signal(zero, read):
    # a projection read as three pieces (Node.pieces): the blocks of its signal that are all zero are not multiplied,
    # so weights there never reach the result, not even a NaN; blocks 3 to 5 are those of a stacked signal
    # ([W+; W-], the sign-split rules), whose halves have the pieces' blocks each
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 12)).double()
    node = next(n for n in trace(model, torch.zeros(2, 5, dtype=torch.float64)).nodes if n.kind == "dense")
    op = OPS["dense"](node)
    op.blocks = 3
    width = 24 if max(zero + read, default=0) > 2 else 12
    signal = torch.randn(2, 7, width, dtype=torch.float64)
    signal.view(2, 7, -1, 4)[:, :, list(zero)] = 0.0
    w = torch.randn(width, 5, dtype=torch.float64)
    poisoned = torch.full_like(w, float("nan"))
    rows = [r for b in read for r in range(4 * b, 4 * b + 4)]
    poisoned[rows] = w[rows]
    torch.testing.assert_close(op.transpose(signal, poisoned, torch.Size((7, 5))), signal @ w, rtol=1e-14, atol=1e-14)
    signal.view(2, 7, -1, 4)[0, 0, 0, 0] = float("nan")  # a NaN is a signal: its block is multiplied
    assert op.transpose(signal, w, torch.Size((7, 5)))[0, 0].isnan().all()


def test_cp_lrp_skips_the_query_and_key_rows_of_a_packed_projection(monkeypatch):
    torch.manual_seed(0)
    model = MaskedAttention(boolean=False, heads=2).double().eval()
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    ex = Explainer(model, "cp-lrp").capture(x)
    qkv = ex._ops["qkv"]
    assert ex.graph.by_name["qkv"].pieces == 3 and qkv.blocks == 3
    widths = []
    live = DenseOp._live
    monkeypatch.setattr(DenseOp, "_live", lambda self, flat, w: widths.append(live(self, flat, w)[1].shape[0])
                        or live(self, flat, w))
    qkv.blocks = 0  # every row multiplied: the reference
    reference = ex.attribute(x, target=1)
    assert widths == []
    qkv.blocks = 3
    torch.testing.assert_close(ex.attribute(x, target=1), reference, rtol=1e-13, atol=1e-15)
    assert widths == [8]  # the value's rows of 24: no signal reaches the query and the key
    assert Explainer(model, "gradient").capture(x)._ops["qkv"].blocks == 0  # no rule holds a signal
