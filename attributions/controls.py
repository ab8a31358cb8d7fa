"""Model-independent control maps for the sanity checks: what a method looks like that ignores
the model entirely (the Sobel edge map) or everything (seeded noise)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from attributions.engines import Engine
from attributions.explaining import Explaining
from attributions.shared_pass import SharedPass

_SOBEL = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.0, -2.0], [1.0, 0.0, -1.0]])


def sobel_magnitude(x: torch.Tensor) -> torch.Tensor:
    """Per-channel Sobel gradient magnitude of images x (B, C, H, W) -> (B, C, H, W).

    Borders are replicated, so a constant image has zero magnitude everywhere.
    """
    b, c, h, w = x.shape
    kernels = torch.stack([_SOBEL, _SOBEL.T]).to(x).unsqueeze(1)  # (2, 1, 3, 3)
    flat = F.pad(x.reshape(b * c, 1, h, w), (1, 1, 1, 1), mode="replicate")
    g = F.conv2d(flat, kernels)
    return g.pow(2).sum(1).sqrt().reshape(b, c, h, w)


class EdgeControl(Engine):
    """The Sobel magnitude of the input, the same for every target and every model."""

    needs_graph = False

    def maps(self, ex: Explaining, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
             **kwargs: Any) -> torch.Tensor:
        return torch.stack([sobel_magnitude(x) for _ in targets])


class NoiseControl(Engine):
    """Gaussian noise from a generator seeded once per engine: a fresh draw per map."""

    needs_graph = False

    def __init__(self, seed: int = 0):
        self.seed = seed
        # private: state, not a parameter of the method, so its repr (printed in the docs) stays the same
        self._generator = torch.Generator().manual_seed(seed)

    def maps(self, ex: Explaining, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
             **kwargs: Any) -> torch.Tensor:
        return torch.stack([torch.randn(x.shape, generator=self._generator).to(x) for _ in targets])
