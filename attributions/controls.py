"""Model-independent control maps for the sanity checks."""
from __future__ import annotations

import torch
import torch.nn.functional as F

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
