"""The live views of a weighted op's tensors: what a conv, linear or BatchNorm node of the graph reads."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class OpTensors:
    """The tensors one conv / linear / BatchNorm op reads, looked up in the live model at every use.

    ``tensor(role)`` gives "weight", "bias" (and for BatchNorm "running_mean", "running_var") or
    None; ``sources()`` the model tensors they are computed from (for caches of derived weights);
    ``module`` the module holding the weight (what a randomization stage re-initialises), ``path``
    its name.
    """

    def __init__(self, getters: dict[str, Callable[[], torch.Tensor | None]], sources: Callable[[], list[torch.Tensor]],
                 module: nn.Module | None, path: str, **static: Any):
        self._getters, self._sources = getters, sources
        self.module, self.path = module, path
        self.padding_mode = "zeros"
        for k, v in static.items():
            setattr(self, k, v)

    def tensor(self, role: str) -> torch.Tensor | None:
        get = self._getters.get(role)
        return get() if get is not None else None

    def sources(self) -> list[torch.Tensor]:
        return [t for t in self._sources() if isinstance(t, torch.Tensor) and t.is_floating_point()]

    weight = property(lambda self: self.tensor("weight"))
    bias = property(lambda self: self.tensor("bias"))
    running_mean = property(lambda self: self.tensor("running_mean"))
    running_var = property(lambda self: self.tensor("running_var"))

    @property
    def kernel_size(self) -> tuple[int, ...]:
        return tuple(self.weight.shape[2:])

    @property
    def out_channels(self) -> int:
        return int(self.weight.shape[0])

    out_features = out_channels

    @property
    def in_channels(self) -> int:
        return int(self.weight.shape[1]) * getattr(self, "groups", 1)

    @property
    def num_features(self) -> int:
        return int((self.weight if self.weight is not None else self.running_mean).shape[0])


# --- what each exported op is ----------------------------------------------------------------------
