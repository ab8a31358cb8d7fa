"""What every entry point checks of a model before computing with it: one test, raised as each package's error.

A NaN or an infinite weight makes every map of the model NaN or meaningless, and a check would blame the method;
the test is one reduction per tensor, and the exact per-tensor test runs only when a sum is not finite.
"""
from __future__ import annotations

import torch
from torch import nn


def nonfinite_tensors(model: nn.Module) -> list[str]:
    """The names of ``model``'s floating-point parameters and buffers that hold a NaN or an infinity, in
    ``named_parameters`` then ``named_buffers`` order (empty when there is none)."""
    tensors = [(name, t.detach()) for name, t in [*model.named_parameters(), *model.named_buffers()]
               if t.is_floating_point()]
    if not tensors:
        return []
    # a NaN or inf makes a sum non-finite; a sum past the dtype's range (finite values) sends every tensor to the
    # exact test below, which names the tensors at fault
    device = tensors[0][1].device
    if bool(torch.isfinite(torch.stack([t.sum().float().to(device) for _, t in tensors])).all()):
        return []
    return [name for name, t in tensors if not bool(torch.isfinite(t).all())]


def named(names: list[str], shown: int = 3) -> str:
    """``names`` as a short list for a message: the first ``shown`` and how many more."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
