"""The live views of a weighted op's tensors: what a conv, linear or BatchNorm node of the graph reads."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attributions.errors import AttributionError


class OpTensors:
    """The tensors one conv / linear / BatchNorm op reads, looked up in the live model at every use.

    ``tensor(role)`` gives "weight", "bias" (and for BatchNorm "running_mean", "running_var") or
    None; ``sources()`` the model tensors they are computed from (for caches of derived weights);
    ``module`` the module holding the weight (what a randomization stage re-initialises), ``path``
    its name.
    """

    def __init__(self, getters: dict[str, Callable[[], torch.Tensor | None]], sources: Callable[[], list[torch.Tensor]],
                 module: nn.Module | None, path: str, *, stride: tuple[int, ...] = (1,),
                 padding: tuple[int, ...] | str = (0,), dilation: tuple[int, ...] = (1,), groups: int = 1,
                 eps: float = 1e-5):
        self._getters, self._sources = getters, sources
        self.module, self.path = module, path
        # a convolution's arguments (as torch's modules name them), a BatchNorm's eps: the rules read an op's
        # tensors as they would read its module
        self.stride, self.padding, self.dilation, self.groups, self.eps = stride, padding, dilation, groups, eps
        self.padding_mode = "zeros"

    def tensor(self, role: str) -> torch.Tensor | None:
        """The live tensor of ``role`` ("weight", "bias", "running_mean", "running_var"), or None."""
        get = self._getters.get(role)
        return get() if get is not None else None

    def sources(self) -> list[torch.Tensor]:
        """The floating model tensors the op's tensors are computed from."""
        return [t for t in self._sources() if isinstance(t, torch.Tensor) and t.is_floating_point()]

    def required(self, role: str) -> torch.Tensor:
        """The live tensor of ``role``, which the op must have (a convolution's or linear layer's weight)."""
        held = self.tensor(role)
        if held is None:
            raise AttributionError(f"the op at {self.path or 'the model'!r} has no {role}")
        return held

    @property
    def weight(self) -> torch.Tensor | None:
        return self.tensor("weight")

    @property
    def bias(self) -> torch.Tensor | None:
        return self.tensor("bias")

    @property
    def running_mean(self) -> torch.Tensor | None:
        return self.tensor("running_mean")

    @property
    def running_var(self) -> torch.Tensor | None:
        return self.tensor("running_var")

    def _shape(self) -> torch.Size:
        """The weight's shape (a BatchNorm's running mean's, without an affine weight)."""
        held = self.weight
        held = held if held is not None else self.running_mean  # each read computes a derived weight anew: read once
        if held is None:
            raise AttributionError(f"the op at {self.path or 'the model'!r} reads no weight")
        return held.shape

    @property
    def kernel_size(self) -> tuple[int, ...]:
        return tuple(self._shape()[2:])

    @property
    def out_channels(self) -> int:
        return int(self._shape()[0])

    @property
    def out_features(self) -> int:
        return self.out_channels

    @property
    def in_channels(self) -> int:
        return int(self._shape()[1]) * self.groups

    @property
    def num_features(self) -> int:
        return int(self._shape()[0])
