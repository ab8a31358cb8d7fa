"""Tracing: every graph the engine accepts is explained exactly, everything else is a clear error at
trace time; the user's model and its hooks are never touched."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attributions import Explainer
from attributions.errors import AttributionError
from attributions.graph import trace
from tests.engine_models import MaskedAttention


def _autograd(model, x, target):
    xr = x.clone().requires_grad_(True)
    return torch.autograd.grad(model(xr)[:, target].sum(), xr)[0]


def _exact(model, x, target=1, same_forward=False):
    """Gradient = autograd, DeepLIFT complete; with ``same_forward`` the graph's logits = the model's, bit for bit."""
    if same_forward:
        torch.testing.assert_close(Explainer(model, "gradient").forward(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=target), _autograd(model, x, target),
                               rtol=0, atol=1e-10)
    dl = Explainer(model, "deeplift")
    assert float(dl.compute_convergence_delta(dl.attribute(x, target=target), x, target).abs().max()) < 1e-8


class _Lambda(nn.Module):
    """fc -> fn -> fc2, in float64."""

    def __init__(self, fn, width=4, mid=4, classes=3):
        super().__init__()
        self.fn = fn
        self.fc, self.fc2 = nn.Linear(width, width), nn.Linear(mid, classes)

    def forward(self, x):
        return self.fc2(self.fn(self.fc(x)))


@pytest.mark.parametrize("fn,mid", [
    (lambda h: h[:, [3, 2, 1, 0]], 4),                                  # advanced indexing: was a reshape
    (lambda h: h.reshape(-1, 2, 2).mT.reshape(-1, 4), 4),                # attribute access mT
    (lambda h: h[:, :2], 2),                                             # slicing: was a reshape
    (lambda h: torch.add(h, h.flip(1), alpha=2), 4),                    # add with alpha: was dropped
    (lambda h: torch.cat([h, h], 1), 8),                                 # repeated input: crashed
    (lambda h: torch.stack([h, -h], 0).sum(0) + h[..., None].expand(-1, -1, 2).mean(-1), 4),
    (lambda h: F.pad(h[:, None], (1, 1), mode="reflect")[:, 0, 1:-1] * 3 - h / 2, 4),
    (lambda h: torch.roll(h, 1, dims=1).unsqueeze(1).squeeze(1).contiguous(), 4),
    (lambda h: torch.cat(h.chunk(2, dim=1)[::-1], 1) + torch.stack(h.unbind(1), 1), 4),
    (lambda h: (h.reshape(-1, 2, 2) @ h.reshape(-1, 2, 2).transpose(1, 2)).flatten(1), 4),
    (lambda h: torch.einsum("bi,bj->bij", h, torch.sigmoid(h)).flatten(1)[:, :4], 4),
    (lambda h: h * torch.tanh(h) + h ** 2 - 1.0 / (1.0 + h * h), 4),
    (lambda h: h / (h.abs() + 1.0), 4),
])
def test_data_movement_mixing_and_products_are_exact(fn, mid):
    torch.manual_seed(0)
    _exact(_Lambda(fn, mid=mid).double(), torch.randn(5, 4, dtype=torch.float64))


def test_batchnorm_without_running_statistics_normalises_with_the_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3, track_running_stats=False), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 16, 2)).double().eval()
    x = torch.rand(4, 1, 6, 6, dtype=torch.float64)
    kinds = [n.kind for n in trace(model, x).nodes if n.kind not in ("const", "value")]
    assert kinds[1:3] == ["conv", "norm"]  # not folded with mean 0 / var 1
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=1), _autograd(model, x, 1),
                               rtol=0, atol=1e-10)


@pytest.mark.parametrize("padding,mode,kernel", [("same", "zeros", 4), ("same", "reflect", 3), (2, "replicate", 3),
                                                 (1, "circular", 3), ("valid", "zeros", 3)])
def test_conv_padding_modes_are_explicit_pads(padding, mode, kernel):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, kernel, padding=padding, padding_mode=mode, bias=False), nn.ReLU(),
                          nn.Flatten(), nn.LazyLinear(2, bias=False)).double()
    x = torch.rand(2, 2, 7, 7, dtype=torch.float64)
    model(x)
    model.eval()
    _exact(model, x)
    ex = Explainer(model, "lrp-epsilon", epsilon=1e-12)
    assert float(ex.compute_convergence_delta(ex.attribute(x, target=1), x, 1).abs().max()) < 1e-8


class _ShapeChecks(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        torch._assert(x.shape[1] == 2, "two channels")
        torch._assert(x.dim() == 3, "(B, C, W) inputs")
        b, c, w = x.shape[0], x.shape[1], x.size(2)
        half = w // 2
        h = x[:, :, :half].reshape(b, c * half)
        return self.fc(torch.cat([h, h.new_zeros(b, 8 - c * half)], 1))


def test_shape_arithmetic_and_asserts_are_evaluated_not_refused():
    model = _ShapeChecks().double().eval()
    x = torch.rand(3, 2, 6, dtype=torch.float64)
    kinds = {n.kind for n in trace(model, x).nodes}
    assert "value" in kinds and "const" in kinds
    _exact(model, x)


class _Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.GELU())
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.block(x) if not self.training else self.block(x) * 0)


def test_hooks_run_only_in_the_captures_check_and_the_model_is_left_as_it_was():
    """The engine never runs hooks to explain; each capture runs the model's own forward once, in eval mode, to
    compare it with the graph (:mod:`attributions.hook_check`): the hooks see that one forward, nothing else."""
    model = _Hooked().double().train()
    calls = []
    model.block.register_forward_hook(lambda *a: calls.append("block"))
    model.block.register_forward_pre_hook(lambda *a: calls.append("pre"))
    model.block[2].register_forward_hook(lambda *a: calls.append("gelu"))
    model.register_forward_hook(lambda *a: calls.append("root"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(3, 4, dtype=torch.float64)
    for method in ("gradient", "lrp-epsilon", "deeplift", "guided-backprop"):
        Explainer(model, method).attribute(x, target=0)
    assert calls == ["pre", "gelu", "block", "root"] * 4 and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model.eval()  # eval semantics: the traced graph took the eval branch and dropout is the identity
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=0), _autograd(model, x, 0))


class _Sorted(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.sort(self.fc(x), dim=1).values


def test_unsupported_operations_and_outputs_are_errors_at_trace_or_call_time():
    with pytest.raises(AttributionError, match=r"unsupported operation: aten.sort.default on 1 signal\(s\) at node "
                                               r"'sort'.*Supported"):
        Explainer(_Sorted(), "gradient").attribute(torch.rand(2, 4), target=0)
    flat = nn.Sequential(nn.Conv2d(1, 2, 3))
    with pytest.raises(AttributionError, match=r"output must be \(B, classes\) logits, got shape \(2, 2, 3, 3\)"):
        Explainer(flat, "gradient").attribute(torch.rand(2, 1, 5, 5), target=0)
    model = nn.Sequential(nn.Linear(4, 3))
    ex = Explainer(model, "gradient")
    x = torch.rand(2, 4)
    with pytest.raises(AttributionError, match="target must be integer class indices.*not rounded"):
        ex.attribute(x, target=2.9)
    with pytest.raises(AttributionError, match="integer class indices"):
        ex.attribute(x, target=torch.tensor([True, False]))
    with pytest.raises(AttributionError, match="tuple of 2 inputs"):
        ex.attribute((x, x), target=0)
    assert ex.attribute(x, target=np.int64(2)).shape == x.shape
    assert ex.attribute(x, target=np.array([0, 2])).shape == x.shape


_OPS = [
    ("permute", lambda h: h.reshape(-1, 2, 4).permute(0, 2, 1).reshape(-1, 8)),
    ("flip", lambda h: h.flip(1)),
    ("roll", lambda h: h.roll(3, 1)),
    ("index", lambda h: h[:, [7, 0, 3, 3, 1, 2, 6, 5]]),
    ("cat-slices", lambda h: torch.cat([h[:, 4:], h[:, :4]], 1)),
    ("expand-mean", lambda h: h[:, None, :].expand(-1, 3, -1).mean(1)),
    ("scale", lambda h: 0.5 * h - h / 4),
    ("sigmoid-gate", lambda h: h * torch.sigmoid(h.flip(1))),
    ("layer-norm", lambda h: F.layer_norm(h, (8,))),
    ("softmax-weighted", lambda h: h * torch.softmax(h, dim=1)),
    ("gelu", F.gelu),
    ("silu", F.silu),
]


class _Chain(nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(len(ops) + 1))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.layers[0](x)
        for op, layer in zip(self.ops, self.layers[1:]):
            h = layer(op(h))
        return self.head(h)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(range(len(_OPS))), min_size=1, max_size=4), st.integers(0, 2 ** 16))
def test_random_chains_of_operations_are_exact(picks, seed):
    torch.manual_seed(seed)
    model = _Chain([_OPS[i][1] for i in picks]).double().eval()
    _exact(model, torch.randn(3, 8, dtype=torch.float64), target=seed % 3)


class _MHA(nn.Module):
    def __init__(self, batch_first=True, use_weights=False):
        super().__init__()
        self.batch_first, self.use_weights = batch_first, use_weights
        self.fc, self.mha, self.head = nn.Linear(4, 8), nn.MultiheadAttention(8, 2, batch_first=batch_first), \
            nn.Linear(8, 3)

    def forward(self, x):
        h = self.fc(x) if self.batch_first else self.fc(x).transpose(0, 1)
        out, weights = self.mha(h, h, h)
        out = out if self.batch_first else out.transpose(0, 1)
        return self.head(out.mean(1) + (weights.mean((1, 2))[:, None] if self.use_weights else 0))


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_is_expanded_into_exact_primitives(batch_first):
    torch.manual_seed(0)
    model = _MHA(batch_first).double().eval()
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    graph = trace(model, x)
    kinds = [n.kind for n in graph.nodes]
    assert kinds.count("product") == 2 and kinds.count("softmax") == 1  # QK^T, softmax, times V
    # batch and heads merged: DeepLIFT's reference runs at the batch's size (reading a layout must not
    # specialise the symbolic batch)
    assert graph.dynamic_batch and graph.batch_sized
    _exact(model, x)
    _exact(_MHA(batch_first, use_weights=True).double().eval(), x)  # the attention weights used too: still exact


def test_attention_weights_gate_the_values_in_lrp():
    # AH rule: the softmax output holds constant in its product with V, so no relevance reaches the
    # scores' product; the relevance that reaches V is conserved
    torch.manual_seed(0)
    model = _MHA().double().eval()
    ex = Explainer(model, "lrp-epsilon", graph=trace(model, torch.randn(3, 5, 4, dtype=torch.float64)))
    product = [n for n in ex.graph.nodes if n.kind == "product"]
    assert [n.record.gates for n in product] == [(False, False), (True, False)]


class _LayerNorm2d(nn.LayerNorm):
    """torchvision's LayerNorm2d: a LayerNorm over channels, by permuting around F.layer_norm."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


def test_a_known_layer_whose_forward_is_overridden_is_traced_through():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), _LayerNorm2d(4), nn.GELU(), nn.Flatten(), nn.Linear(4 * 16, 3))
    model = model.double().eval()
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
    kinds = [n.kind for n in trace(model, torch.rand(3, 1, 6, 6, dtype=torch.float64)).nodes
             if n.kind not in ("const", "value")]
    assert kinds[1:5] == ["conv", "move", "norm", "move"]  # permute, layer_norm, permute
    _exact(model, torch.rand(3, 1, 6, 6, dtype=torch.float64))
    bias_free = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), _LayerNorm2d(4, bias=False), nn.Flatten(),
                              nn.Linear(4 * 16, 3, bias=False)).double().eval()
    ex = Explainer(bias_free, "lrp-epsilon", epsilon=1e-12)
    x = torch.rand(3, 1, 6, 6, dtype=torch.float64)
    assert float(ex.compute_convergence_delta(ex.attribute(x, target=1), x, 1).abs().max()) < 1e-8


class _Library(nn.Module):
    """What the model libraries do: an in-place activation after a BatchNorm (torchvision's MobileNet),
    ``fc(x + x)``, a functional batch_norm (timm's BatchNormAct2d), an optional forward argument and
    an output with ``.logits`` (Hugging Face)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.bn2 = nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x, mask=None):
        h = F.hardswish(self.bn(self.conv(x)), inplace=True)
        h = F.batch_norm(h, self.bn2.running_mean, self.bn2.running_var, self.bn2.weight, self.bn2.bias, False)
        h = F.relu6(h, inplace=True).mean((2, 3))
        return SimpleNamespace(logits=self.fc(h + h))


def test_the_patterns_of_the_model_libraries_are_exact():
    torch.manual_seed(0)
    model = _Library().double().eval()
    with torch.no_grad():
        for bn in (model.bn, model.bn2):
            bn.running_mean.uniform_(-0.3, 0.3)
            bn.running_var.uniform_(0.5, 1.5)
    x = torch.rand(3, 1, 6, 6, dtype=torch.float64)
    graph = trace(model, x)
    assert sum(n.bn is not None for n in graph.nodes) == 1 and "affine" in {n.kind for n in graph.nodes}
    wrapped = lambda t: model(t).logits  # noqa: E731 - autograd's reference on the logits
    torch.testing.assert_close(Explainer(model, "gradient").attribute(x, target=1), _autograd(wrapped, x, 1),
                               rtol=0, atol=1e-10)
    dl = Explainer(model, "deeplift")
    assert float(dl.compute_convergence_delta(dl.attribute(x, target=1), x, 1).abs().max()) < 1e-8
    for method in ("lrp-epsilon", "guided-backprop", "lrp-zplus"):
        assert torch.isfinite(Explainer(model, method).attribute(x, target=1)).all()


def test_a_graph_serves_every_batch_size_and_is_recaptured_for_another_image_size():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 3))
    ex = Explainer(model.double().eval(), "gradient")
    for shape in ((1, 1, 8, 8), (5, 1, 8, 8), (2, 1, 12, 12)):
        x = torch.rand(shape, dtype=torch.float64)
        torch.testing.assert_close(ex.attribute(x, target=0), _autograd(model, x, 0), rtol=0, atol=1e-12)
    assert ex.graph is not None and ex.graph.dynamic_batch and ex.graph.shape[1:] == (1, 12, 12)
    assert len(ex._graphs) == 2  # one capture per image size, every batch size on each


class _Masked(nn.Module):
    """A mask written slice by slice into a tensor made in forward (as Swin's shifted windows do)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        mask = x.new_zeros(x.shape[-1])
        mask[:2] = 1.0
        mask[3:] = -2.0
        return self.fc(x * mask)


class _Overwritten(nn.Module):
    def forward(self, x):
        y = x * 2
        head = y[:, :2]  # a view, taken before y is overwritten
        y.relu_()
        return y[:, 2:] + head  # eager: head holds the ReLU's values


@pytest.mark.parametrize("make, width, refused, message", [
    # a constant filled slice by slice is run as written; an in-place op on a signal whose old values a
    # view still holds is refused
    (_Masked, 4, lambda: _Overwritten().double(), r"in-place aten.relu_.default .* overwrites a tensor"),
    # writes into views of a signal read later are seen; a product written into one is refused
    (lambda: _WrittenInto(), 6, lambda: _Lambda(lambda t: (t[:, :2].mul_(t[:, 2:]), t)[1]).double(),
     r"writes into a view of a signal: only copies")])
def test_in_place_writes(make, width, refused, message):
    torch.manual_seed(0)
    _exact(make().double().eval(), torch.rand(3, width, dtype=torch.float64), same_forward=True)
    with pytest.raises(AttributionError, match=message):
        Explainer(refused(), "gradient").attribute(torch.randn(2, 4, dtype=torch.float64), target=0)


@pytest.mark.parametrize("boolean", [False, True])
def test_attention_with_a_constant_mask_is_exact(boolean):
    torch.manual_seed(0)
    _exact(MaskedAttention(boolean).double().eval(), torch.randn(3, 5, 4, dtype=torch.float64))


class _ShapedLike(nn.Module):
    """Moves shaped by another signal (LeViT's reshape_as): that signal gives only the shape."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):
        h, g = self.a(x), self.b(x)
        return self.head(h.reshape(h.shape[0], 2, 3).reshape_as(g).type_as(g) + g[:, :1].expand_as(g))


def test_moves_shaped_like_another_signal_are_exact():
    torch.manual_seed(0)
    _exact(_ShapedLike().double().eval(), torch.randn(4, 4, dtype=torch.float64))


class _GatedByBatchNorm(nn.Module):
    """A product whose operand is a folded conv + BatchNorm (GhostNet's and RexNet's gates)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.gate = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Conv2d(1, 2, 3)
        self.fc = nn.Linear(2, 3)

    def forward(self, x):
        return self.fc((self.bn(self.conv(x)) * torch.sigmoid(self.gate(x))).mean((2, 3)))


def test_a_product_of_a_folded_layer_is_exact():
    torch.manual_seed(0)
    model = _GatedByBatchNorm().double().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.3, 0.3)
    x = torch.rand(3, 1, 6, 6, dtype=torch.float64)
    assert any(n.bn is not None for n in trace(model, x).nodes)
    _exact(model, x)
    assert torch.isfinite(Explainer(model, "lrp-epsilon").attribute(x, target=1)).all()


class _Upsampling(nn.Module):
    """A transposed convolution (LowFormer's upsampling), F.fold (MobileViT v2, VOLO) and attention whose
    output a later ``view`` reads in sdpa's memory layout (BEiT / Data2Vec: permute, then view)."""

    def __init__(self):
        super().__init__()
        self.down, self.up = nn.Conv2d(2, 4, 3, stride=2), nn.ConvTranspose2d(4, 2, 3, stride=2)
        self.qkv, self.fc = nn.Linear(2, 12), nn.Linear(4 * 9 * 9, 3)

    def forward(self, x):
        h = self.up(F.relu(self.down(x)))  # (B, 2, 9, 9)
        h = F.fold(F.unfold(h, 3, padding=1), (9, 9), 3, padding=1) / 9
        q, k, v = self.qkv(h.flatten(2).transpose(1, 2)).reshape(len(x), 81, 3, 2, 2).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).permute(0, 2, 1, 3).view(len(x), 81, 4)
        return self.fc(a.flatten(1))


def test_transposed_convolution_fold_and_the_attention_layout_are_exact():
    torch.manual_seed(0)
    model = _Upsampling().double().eval()
    x = torch.rand(3, 2, 9, 9, dtype=torch.float64)
    kinds = {n.name: n.kind for n in trace(model, x).nodes}
    assert kinds["up"] == "mix" and any(k.endswith("col2im") and v == "mix" for k, v in kinds.items())
    _exact(model, x)
    for method in ("lrp-epsilon", "lrp-alpha2beta1", "guided-backprop"):
        assert torch.isfinite(Explainer(model, method).attribute(x, target=1)).all()


class _WrittenInto(nn.Module):
    """A signal written into through views and read afterwards (MViT v2's relative position terms): a copy,
    an addition, an in-place ReLU through a reshape."""

    def __init__(self):
        super().__init__()
        self.fc, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        attn = self.fc(x)
        attn[:, 2:] = attn[:, 2:] * 2 + x[:, :4]
        attn[:, :1] += x[:, 5:]
        return self.fc2(attn.view(len(x), 6).relu_().softmax(1) * attn)



class _ZeroedBias(nn.Module):
    """A layer's bias copied and partly zeroed in forward before F.linear reads it (Swin v2's qkv bias)."""

    def __init__(self):
        super().__init__()
        self.qkv, self.fc = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):
        bias = self.qkv.bias.clone()
        bias[2:4].zero_()
        return self.fc(torch.relu(F.linear(x, self.qkv.weight, bias)))


def test_a_weight_written_in_place_in_forward_is_read_as_written():
    torch.manual_seed(0)
    model = _ZeroedBias().double().eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    _exact(model, x, same_forward=True)


def test_the_shipped_vit_keeps_its_symbolic_batch():
    # nn.MultiheadAttention's sdpa output is laid out sequence-first, with the batch size in its strides:
    # reading that layout must not specialise the batch, or DeepLIFT's reference would be one broadcast
    # image where batch and heads are merged
    from audit.models import load_checkpoint

    model = load_checkpoint("vit-sgd")
    graph = trace(model, torch.rand(4, 1, 28, 28))
    assert graph.dynamic_batch and graph.batch_sized


def test_a_view_merging_the_batch_with_another_axis_takes_a_batch_sized_reference():
    class Merge(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.head = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, x):
            h = torch.relu(self.fc(x).reshape(-1, 2) + 0.1)  # (2 B, 2): the batch merged with an axis
            return self.head(h.reshape(-1, 4))

    torch.manual_seed(0)
    model = Merge().double().eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    graph = trace(model, x)
    assert graph.batch_sized and graph.dynamic_batch
    ex = Explainer(model, "deeplift", graph=graph)
    target = torch.tensor([0, 2, 1])
    onehot = F.one_hot(target, 3).to(x.dtype)[None]  # (K = 1, B, classes)
    taps = ex.forward_pass(x).signals(graph.output, onehot)  # every node's signal, the merged ones included
    assert all(torch.isfinite(t).all() for t in taps.values())
    torch.testing.assert_close(taps["input"][0], ex.attribute(x, target=target), rtol=1e-12, atol=1e-14)
    _exact(model, x)


class _SimpleNormNet(nn.Module):
    """timm's simple (RMS-like) norm: x * rsqrt(var(x) + eps) * w, then a std-scaled ReLU."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.w = nn.Linear(6, 8), nn.Linear(8, 3), nn.Parameter(torch.randn(8))

    def forward(self, x):
        h = self.fc1(x)
        h = h * torch.rsqrt(torch.var(h, dim=(-1,), keepdim=True) + 1e-5) * self.w
        return self.fc2(torch.relu(h) / (torch.std(h, dim=-1, keepdim=True, unbiased=False) + 1))


def test_variance_and_standard_deviation_are_reductions_exact_for_every_rule_family():
    torch.manual_seed(0)
    model = _SimpleNormNet().double().eval()
    x = torch.randn(4, 6, dtype=torch.double, requires_grad=True)
    t = torch.tensor([0, 1, 2, 0])
    kinds = {n.kind for n in trace(model, x.detach()).nodes}
    assert "reduce" in kinds
    expected = torch.autograd.grad(model(x)[range(4), t].sum(), x)[0]
    assert torch.equal(Explainer(model, "gradient").attribute(x.detach(), target=t), expected)
    deeplift = Explainer(model, "deeplift").attribute(x.detach(), target=t)
    with torch.no_grad():
        difference = model(x)[range(4), t] - model(torch.zeros_like(x))[range(4), t]
    torch.testing.assert_close(deeplift.sum(1), difference, rtol=0, atol=1e-12)


class _StoppedNet(nn.Module):
    """A branch cut from the gradient, by .detach() or under torch.no_grad(), as autograd sees it."""

    def __init__(self, mode: str):
        super().__init__()
        self.a, self.b, self.mode = nn.Linear(5, 6), nn.Linear(6, 3), mode

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.mode == "detach":
            gate = h.detach() * 2
        else:
            with torch.no_grad():
                gate = torch.sigmoid(h) * 2
        return self.b(h * gate + h)


@pytest.mark.parametrize("mode", ["detach", "no_grad"])
def test_no_gradient_flows_through_detach_or_a_no_grad_region(mode):
    torch.manual_seed(0)
    model = _StoppedNet(mode).double().eval()
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    expected = torch.autograd.grad(model(x)[:, 1].sum(), x)[0]
    assert torch.equal(Explainer(model, "gradient").attribute(x.detach(), target=1), expected)
    # the cut branch is a constant: a gate of the product, not a second path of the signal
    graph = trace(model, x.detach())
    assert all(n.kind in ("const", "value") for n in graph.nodes if "sigmoid" in n.name or "detach" in n.name)


class _GatedConv(nn.Module):
    """conv -> BatchNorm (eval) -> x * sigmoid(x); a second conv whose output two BatchNorms read."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)
        self.shared, self.bn_a, self.bn_b = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.BatchNorm2d(2)
        self.fc = nn.Linear(2 * 2 * 2, 3)

    def forward(self, x):
        h = self.bn(self.conv(x))
        h = h * torch.sigmoid(h)
        s = self.shared(h)
        return self.fc(F.max_pool2d(self.bn_a(s) + self.bn_b(s), 2).flatten(1))


def test_the_passes_run_in_order_and_each_does_its_part():
    from attributions.graph import PASSES, fold_batchnorm, mark_gates
    from attributions.records import Product

    assert PASSES == (mark_gates, fold_batchnorm)
    model = _GatedConv().eval()
    graph = trace(model, torch.rand(2, 1, 6, 6))
    product = next(n for n in graph.nodes if isinstance(n.record, Product))
    assert product.record.gates == (False, True)  # the sigmoid's operand is the gate
    kinds = {n.name: n.kind for n in graph.nodes}
    # the BatchNorm after a conv used only by it is folded into the conv; two BatchNorms reading one conv are not
    assert "bn" not in kinds and graph.by_name["conv"].folded == ("bn",) and graph.by_name["conv"].bn is not None
    assert kinds["bn_a"] == kinds["bn_b"] == "affine" and graph.by_name["shared"].bn is None
    assert product.record.operands[0] == "conv"  # the product's operand renamed to the node that computes it
    _exact(model.double(), torch.rand(2, 1, 6, 6, dtype=torch.float64))


def test_each_pass_returns_a_new_graph_and_leaves_its_input_as_it_was(monkeypatch):
    from attributions import graph as graph_module
    from attributions.records import Product

    monkeypatch.setattr(graph_module, "PASSES", ())
    raw = trace(_GatedConv().eval(), torch.rand(2, 1, 6, 6))
    before = [(n.name, n.kind, n.inputs, n.record, n.bn, n.folded, dict(n.aliases)) for n in raw.nodes]
    gated = graph_module.mark_gates(raw)
    product = next(n for n in gated.nodes if isinstance(n.record, Product))
    assert product.record.gates == (False, True) and raw.by_name[product.name].record.gates == (False, False)
    folded = graph_module.fold_batchnorm(gated)
    assert "bn" in gated.by_name and "bn" not in folded.by_name and folded.by_name["conv"].folded == ("bn",)
    assert gated.by_name["conv"].bn is None and folded.by_name["conv"].bn is gated.by_name["bn"].module
    assert folded.by_name[product.name].record.operands[0] == "conv" == folded.by_name[product.name].inputs[0]
    assert folded.by_name[product.name].aliases == {"bn": "conv"} and gated.by_name[product.name].aliases == {}
    assert [(n.name, n.kind, n.inputs, n.record, n.bn, n.folded, dict(n.aliases)) for n in raw.nodes] == before


class _Pieces(nn.Module):
    """Pieces of one tensor: every index selected (nn.MultiheadAttention's packed query, key and value), an
    unbind, a chunk, and two of three selects (which stay separate)."""

    def __init__(self, how):
        super().__init__()
        self.how, self.fc, self.head = how, nn.Linear(4, 12), nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x).unflatten(1, (3, 4)).transpose(0, 1).contiguous()  # (3, B, 4)
        a, b, c = {"select": lambda: (h[0], h[1], h[2]), "unbind": lambda: h.unbind(0),
                   "chunk": lambda: self.fc(x).chunk(3, 1), "partial": lambda: (h[0], h[2], h[0])}[self.how]()
        return self.head(a * torch.tanh(b) + c)


@pytest.mark.parametrize("how,shared", [("select", True), ("unbind", True), ("chunk", True), ("partial", False)])
def test_the_pieces_of_one_tensor_share_one_backward_node(how, shared):
    torch.manual_seed(0)
    model = _Pieces(how).double().eval()
    x = torch.randn(5, 4, dtype=torch.float64)
    _exact(model, x)
    ex = Explainer(model, "gradient")
    env = ex._forward_envs(x, connected=True)[0]
    product = next(n for n in ex.graph.nodes if n.kind == "product")
    pieces = [env[i] for i in (*product.inputs, next(n for n in ex.graph.nodes if n.kind == "add").inputs[1])]
    nodes = {id(p.grad_fn) for p in pieces if p.grad_fn is not None and p.grad_fn.name().startswith(
        ("Unbind", "Split", "Select"))}
    # one autograd node assembles all the pieces' gradients, where one per piece would each fill a whole zero gradient
    assert (len(nodes) == 1) == shared
    assert not any(isinstance(k, tuple) and k[-1] in ("pieces", "pieces of") for k in env)  # released once taken


@pytest.mark.parametrize("how,pieces", [("select", 3), ("unbind", 3), ("chunk", 3), ("partial", 0)])
def test_a_dense_node_read_only_as_pieces_is_marked_packed(how, pieces):
    model = _Pieces(how).double().eval()
    graph = trace(model, torch.zeros(5, 4, dtype=torch.float64))
    packed = "fc#1" if how == "chunk" else "fc"  # chunk's pieces are of a second call of fc
    assert {n.name: n.pieces for n in graph.nodes if n.kind == "dense"} == {**dict.fromkeys(("fc", "head"), 0),
                                                                           **({"fc#1": 0} if how == "chunk" else {}),
                                                                           packed: pieces}


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attentions_packed_projection_is_marked(batch_first):
    graph = trace(_MHA(batch_first).double().eval(), torch.zeros(3, 5, 4, dtype=torch.float64))
    assert {n.name: n.pieces for n in graph.nodes if n.kind == "dense"} == {"fc": 0, "mha.linear": 3,
                                                                             "mha.linear#1": 0, "head": 0}


class _DroppedAttention(nn.Module):
    """Attention written out, its weights through an eval-mode dropout (timm's Swin) or an added axis."""

    def __init__(self, between):
        super().__init__()
        self.between, self.qkv, self.drop, self.head = between, nn.Linear(4, 12), nn.Dropout(0.1), nn.Linear(4, 3)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        a = (q @ k.transpose(-2, -1)).softmax(-1)
        a = self.drop(a) @ v if self.between == "dropout" else (a.unsqueeze(1) @ v.unsqueeze(1)).squeeze(1)
        return self.head(a.mean(1))


@pytest.mark.parametrize("between", ["dropout", "unsqueeze"])
def test_attention_weights_moved_before_their_product_still_gate_it(between):
    model = _DroppedAttention(between).double().eval()
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    products = [n for n in trace(model, x).nodes if n.kind == "product"]
    assert [n.record.gates for n in products] == [(False, False), (True, False)]
    ex = Explainer(model, "cp-lrp").capture(x)  # so CP-LRP holds them: no signal reaches the query and the key
    assert ex.rule_for(products[1].name).silent(products[1]) == {products[1].record.operands[0]}
    assert ex._ops["qkv"].blocks == 3


class _ViewedAttention(nn.Module):
    """Attention whose output is permuted back and viewed, as BEiT's and Data2Vec's are: the view relies on
    scaled_dot_product_attention's output being laid out (B, L, H, D) in memory."""

    def __init__(self):
        super().__init__()
        self.qkv, self.head = nn.Linear(8, 24), nn.Linear(8, 3)

    def forward(self, x):  # x (B, L, 8)
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4).unbind(0)  # (B, 2 heads, L, 4) each
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.head(out.permute(0, 2, 1, 3).view(x.shape[0], x.shape[1], 8).mean(1))


@pytest.mark.parametrize("method", ["attnlrp", "cp-lrp", "gradient"])
def test_a_rule_that_computes_an_attentions_output_lays_it_out_as_the_model_does(method):
    torch.manual_seed(0)
    model = _ViewedAttention().double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    maps = Explainer(model, method).attribute(x, target=1)
    assert maps.shape == x.shape and torch.isfinite(maps).all()
