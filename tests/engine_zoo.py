"""Small models that mirror the families people audit, written here (no torchvision): MobileNetV2,
MobileNetV3, EfficientNet, RegNet-Y, MNASNet, ShuffleNet, ConvNeXt and a ViT with hand-written attention.
``bias=False`` builds a variant without biases, BatchNorm, affine shifts or added constants, on which
LRP conserves relevance exactly."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.engine_models import randomize_batchnorm


def _norm(c: int, bias: bool) -> nn.Module:
    """BatchNorm (its shift is a bias) or, in the bias-free variant, nothing."""
    return nn.BatchNorm2d(c) if bias else nn.Identity()


class InvertedResidual(nn.Module):
    """MobileNetV2: 1x1 expand, 3x3 depthwise, 1x1 project, ReLU6, a residual add when shapes allow."""

    def __init__(self, c: int, expand: int = 3, bias: bool = True):
        super().__init__()
        h = c * expand
        self.block = nn.Sequential(nn.Conv2d(c, h, 1, bias=bias), nn.ReLU6(), nn.Conv2d(h, h, 3, padding=1, groups=h, bias=bias),
                                   nn.ReLU6(), nn.Conv2d(h, c, 1, bias=bias))

    def forward(self, x):
        return x + self.block(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes: int = 5, bias: bool = True):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1, bias=bias), nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(8, bias=bias), InvertedResidual(8, bias=bias))
        self.head = nn.Linear(8, classes, bias=bias)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class MobileNetV3(nn.Module):
    """MobileNetV3: Conv-BatchNorm-Hardswish (the activation module reads the folded BatchNorm's
    output), an SE gate with a functional Hardsigmoid, a shape read off a BatchNorm's output."""

    def __init__(self, classes: int = 5, bias: bool = True):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1, bias=False), _norm(8, bias), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 5, padding=2, groups=8, bias=False), _norm(8, bias), nn.ReLU6())
        self.se_reduce, self.se_expand = nn.Conv2d(8, 4, 1, bias=bias), nn.Conv2d(4, 8, 1, bias=bias)
        self.project = nn.Sequential(nn.Conv2d(8, 8, 1, bias=False), _norm(8, bias))
        self.head = nn.Sequential(nn.Linear(8, 16, bias=bias), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(16, classes, bias=bias))

    def forward(self, x):
        h = self.dw(self.stem(x))
        h = h * F.hardsigmoid(self.se_expand(F.relu(self.se_reduce(h.mean((2, 3), keepdim=True)))))
        h = self.project(h)
        return self.head(h.reshape(h.shape[0], h.shape[1], -1).mean(-1))


class SqueezeExcite(nn.Module):
    """EfficientNet's SE gate: x * sigmoid(W2 silu(W1 mean(x)))."""

    def __init__(self, c: int, bias: bool = True):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c // 2, 1, bias=bias), nn.Conv2d(c // 2, c, 1, bias=bias)

    def forward(self, x):
        g = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(g))))


def stochastic_depth(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """torchvision's stochastic_depth (row mode): an identity in eval."""
    if not training or p == 0.0:
        return x
    keep = torch.empty((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype).bernoulli_(1 - p)
    return x * keep / (1 - p)


class MBConv(nn.Module):
    def __init__(self, c: int, bias: bool = True):
        super().__init__()
        self.expand = nn.Conv2d(c, 2 * c, 1, bias=bias)
        self.depthwise = nn.Conv2d(2 * c, 2 * c, 3, padding="same", groups=2 * c, bias=bias)
        self.se = SqueezeExcite(2 * c, bias=bias)
        self.project = nn.Conv2d(2 * c, c, 1, bias=bias)

    def forward(self, x):
        h = self.se(F.silu(self.depthwise(nn.functional.silu(self.expand(x)))))
        return x + stochastic_depth(self.project(h), 0.2, self.training)


class EfficientNet(nn.Module):
    def __init__(self, classes: int = 5, bias: bool = True):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, stride=2, padding=1, padding_mode="reflect", bias=bias)
        self.act = nn.SiLU()
        self.blocks = nn.Sequential(MBConv(8, bias=bias), MBConv(8, bias=bias))
        self.head = nn.Linear(8, classes, bias=bias)

    def forward(self, x):
        h = self.blocks(self.act(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class RegNetYBlock(nn.Module):
    """RegNet-Y: 1x1, grouped 3x3 (group width 4), SE gate (ReLU, Sigmoid), 1x1, BatchNorm after each
    convolution, ReLU after the residual add."""

    def __init__(self, c: int, bias: bool = True):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), _norm(c, bias), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c // 4, bias=False), _norm(c, bias), nn.ReLU())
        self.se_reduce, self.se_expand = nn.Conv2d(c, c // 4, 1, bias=bias), nn.Conv2d(c // 4, c, 1, bias=bias)
        self.c = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), _norm(c, bias))
        self.act = nn.ReLU()

    def forward(self, x):
        h = self.b(self.a(x))
        g = torch.sigmoid(self.se_expand(F.relu(self.se_reduce(F.adaptive_avg_pool2d(h, 1)))))
        return self.act(x + self.c(h * g))


class RegNetY(nn.Module):
    def __init__(self, classes: int = 5, bias: bool = True):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1, bias=False), _norm(8, bias), nn.ReLU())
        self.blocks = nn.Sequential(RegNetYBlock(8, bias), RegNetYBlock(8, bias))
        self.fc = nn.Linear(8, classes, bias=bias)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), (1, 1)).flatten(1))


class MNASNet(nn.Module):
    """MNASNet: a depthwise-separable stem, an inverted residual with a 5x5 depthwise convolution,
    BatchNorm throughout, in-place ReLUs, dropout before the classifier."""

    def __init__(self, classes: int = 5, bias: bool = True):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, 8, 3, stride=2, padding=1, bias=False), _norm(8, bias), nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), _norm(8, bias), nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 1, bias=False), _norm(8, bias))
        self.expand = nn.Sequential(nn.Conv2d(8, 24, 1, bias=False), _norm(24, bias), nn.ReLU(inplace=True),
                                    nn.Conv2d(24, 24, 5, padding=2, groups=24, bias=False), _norm(24, bias),
                                    nn.ReLU(inplace=True), nn.Conv2d(24, 8, 1, bias=False), _norm(8, bias))
        self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(8, classes, bias=bias))

    def forward(self, x):
        h = self.layers(x)
        return self.classifier((h + self.expand(h)).mean([2, 3]))


class ShuffleUnit(nn.Module):
    """ShuffleNet: split the channels, transform one half, concatenate, shuffle by view / transpose."""

    def __init__(self, c: int, bias: bool = True):
        super().__init__()
        self.branch = nn.Sequential(nn.Conv2d(c // 2, c // 2, 1, bias=bias), nn.Hardswish(),
                                    nn.Conv2d(c // 2, c // 2, 3, padding=1, groups=c // 2, bias=bias))

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        out = torch.cat((a, self.branch(b)), dim=1)
        n, c, h, w = out.size()
        return out.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class ShuffleNet(nn.Module):
    def __init__(self, classes: int = 5, bias: bool = True):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1, bias=bias), nn.Hardsigmoid(), nn.Tanh())
        self.units = nn.Sequential(ShuffleUnit(8, bias), ShuffleUnit(8, bias))
        self.head = nn.Linear(8, classes, bias=bias)

    def forward(self, x):
        return self.head(self.units(self.stem(x)).mean([2, 3]))


class ConvNeXtBlock(nn.Module):
    """ConvNeXt: 7x7 depthwise, LayerNorm over channels via permute, GELU MLP, layer scale, residual."""

    def __init__(self, c: int, bias: bool = True):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c, bias=bias)
        self.norm = nn.LayerNorm(c, elementwise_affine=True, bias=bias)
        self.up, self.down = nn.Linear(c, 2 * c, bias=bias), nn.Linear(2 * c, c, bias=bias)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        h = self.dw(x).permute(0, 2, 3, 1)
        h = self.down(F.gelu(self.up(self.norm(h))))
        return x + (self.gamma * h).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, classes: int = 5, bias: bool = True):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 4, stride=4, bias=bias)
        self.norm = nn.GroupNorm(2, 8, affine=True)
        if not bias:
            self.norm.bias = None
        self.blocks = nn.Sequential(ConvNeXtBlock(8, bias), ConvNeXtBlock(8, bias))
        self.head = nn.Linear(8, classes, bias=bias)

    def forward(self, x):
        return self.head(self.blocks(self.norm(self.stem(x))).mean((-2, -1)))


class Attention(nn.Module):
    """Multi-head self-attention: written out (qkv projection, QK^T / sqrt(d), softmax, times V), through
    F.scaled_dot_product_attention, or nn.MultiheadAttention."""

    def __init__(self, d: int, heads: int = 2, bias: bool = True, kind: str = "manual"):
        super().__init__()
        self.heads, self.kind = heads, kind
        if kind == "mha":
            self.mha = nn.MultiheadAttention(d, heads, bias=bias, batch_first=True)
        else:
            self.qkv, self.proj = nn.Linear(d, 3 * d, bias=bias), nn.Linear(d, d, bias=bias)

    def forward(self, x):
        if self.kind == "mha":
            out, _ = self.mha(x, x, x, need_weights=False)
            return out
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        if self.kind == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
            out = attn.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class ViT(nn.Module):
    """A ViT: patch convolution, class token, position embedding, pre-LN blocks, GELU MLP, head on the
    class token. ``bias=False``: no biases, no LayerNorm shifts, no class token or position embedding."""

    def __init__(self, classes: int = 5, d: int = 8, patch: int = 4, size: int = 8, bias: bool = True,
                 attention: str = "manual"):
        super().__init__()
        self.bias = bias
        self.patch = nn.Conv2d(1, d, patch, stride=patch, bias=bias)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, d) * 0.5)
        self.norm1, self.norm2 = nn.LayerNorm(d, bias=bias), nn.LayerNorm(d, bias=bias)
        self.attn = Attention(d, bias=bias, kind=attention)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d, bias=bias), nn.GELU(), nn.Linear(2 * d, d, bias=bias))
        self.head = nn.Linear(d, classes, bias=bias)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        if self.bias:
            tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1) + self.pos
        h = tokens + self.attn(self.norm1(tokens))
        h = h + self.mlp(self.norm2(h))
        return self.head(h[:, 0])


ZOO = {"mobilenet_v2": MobileNetV2, "mobilenet_v3": MobileNetV3, "efficientnet": EfficientNet, "regnet_y": RegNetY,
       "mnasnet": MNASNet,
       "shufflenet": ShuffleNet, "convnext": ConvNeXt,
       "vit": ViT, "vit_mha": lambda bias=True: ViT(bias=bias, attention="mha"),
       "vit_sdpa": lambda bias=True: ViT(bias=bias, attention="sdpa")}


def zoo_model(name: str, bias: bool = True, seed: int = 0) -> nn.Module:
    """A float64 eval-mode model of the zoo with seeded weights."""
    torch.manual_seed(seed)
    model = ZOO[name](bias=bias).double().eval()
    with torch.no_grad():  # norms start at weight 1, bias 0 (BatchNorm: statistics 0, 1): make them matter
        randomize_batchnorm(model)
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
                if m.weight is not None:
                    m.weight.uniform_(0.5, 1.5)
                if m.bias is not None:
                    m.bias.uniform_(-0.3, 0.3)
    return model
