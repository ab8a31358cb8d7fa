"""Small models for the engine tests: BatchNorm, max-pooling, residual adds, functional ops, attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def randomize_batchnorm(model: nn.Module, generator: torch.Generator | None = None) -> nn.Module:
    """Give every BatchNorm non-trivial running statistics and affine parameters."""
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.running_mean.uniform_(-0.5, 0.5, generator=generator)
            m.running_var.uniform_(0.5, 2.0, generator=generator)
            m.weight.data.uniform_(0.5, 1.5, generator=generator)
            m.bias.data.uniform_(-0.5, 0.5, generator=generator)
    return model


def set_biases(model: nn.Module, low: float, high: float) -> nn.Module:
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None:
            m.bias.data.uniform_(low, high)
    return model


class ConvPoolNet(nn.Module):
    """conv -> ReLU -> conv -> BN -> max-pool -> flatten -> linear: max-pooling after a linear layer."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, padding=1)
        self.r1 = nn.ReLU()
        self.c2 = nn.Conv2d(4, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.pool = nn.MaxPool2d(2)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(self.flat(self.pool(self.bn(self.c2(self.r1(self.c1(x)))))))


class ResidualNet(nn.Module):
    """A residual block with BatchNorm, average pooling and a linear head."""

    def __init__(self, bias: bool = True):
        super().__init__()
        self.c0 = nn.Conv2d(1, 4, 3, padding=1, bias=bias)
        self.r0 = nn.ReLU()
        self.c1 = nn.Conv2d(4, 4, 3, padding=1, bias=bias)
        self.r1 = nn.ReLU()
        self.c2 = nn.Conv2d(4, 4, 3, padding=1, bias=bias)
        self.r2 = nn.ReLU()
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 3, bias=bias)

    def forward(self, x):
        h = self.r0(self.c0(x))
        out = self.c2(self.r1(self.c1(h)))
        out = self.r2(out + h)
        return self.fc(torch.flatten(self.pool(out), 1))


class FunctionalNet(nn.Module):
    """Functional ReLU, in-place ops, a reused module, view/size, cat and adaptive pooling."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(1, 3, 3, padding=1)
        self.b = nn.Conv2d(1, 3, 5, padding=2)
        self.shared = nn.Conv2d(6, 6, 3, padding=1)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(6 * 2 * 2, 4)

    def forward(self, x):
        h = torch.cat([F.relu(self.a(x)), torch.relu(self.b(x))], dim=1)
        h = self.shared(h).relu_()
        h = F.relu(self.shared(h), inplace=True)
        h = F.adaptive_avg_pool2d(F.max_pool2d(h, 2), 2)
        return self.fc(self.drop(h.view(h.size(0), -1)))


class MaskedAttention(nn.Module):
    """F.scaled_dot_product_attention over ``tokens`` tokens of 4 features with a constant mask, additive (float)
    or boolean; ``heads`` heads of ``width`` channels (None: one, without a head axis)."""

    def __init__(self, boolean: bool, tokens: int = 5, width: int = 4, heads: int | None = None):
        super().__init__()
        n = width * (heads or 1)
        self.heads = heads
        self.qkv, self.head = nn.Linear(4, 3 * n), nn.Linear(n, 3)
        mask = torch.rand(tokens, tokens) > 0.4
        mask.fill_diagonal_(True)  # every query sees itself
        self.register_buffer("mask", mask if boolean else torch.where(mask, 0.0, -3.0).double())

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.heads:
            q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        return self.head((a.transpose(1, 2).flatten(2) if self.heads else a).mean(1))
