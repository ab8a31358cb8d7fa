"""A small vision transformer for 28x28 / 32x32 data, trainable on a CPU.

Patch embedding by a strided convolution, a class token and learned position embeddings, pre-LN
blocks of ``nn.MultiheadAttention`` and a GELU MLP, the head on the class token: the layout of
Dosovitskiy et al. (2021) at a size two CPU cores train in minutes.
"""
from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        result: torch.Tensor = x + self.mlp(self.norm2(x))
        return result


class SmallViT(nn.Module):
    """ViT: (B, C, H, W) -> (B, num_classes); H and W multiples of ``patch``."""

    def __init__(self, in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10, patch: int = 4,
                 dim: int = 64, depth: int = 4, heads: int = 4, mlp: int = 128):
        super().__init__()
        c, h, w = in_shape
        self.patch = nn.Conv2d(c, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (h // patch) * (w // patch) + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1) + self.pos
        result: torch.Tensor = self.head(self.norm(self.blocks(tokens))[:, 0])
        return result
