"""Values derived from tensors that may change in place: kept until one of their sources changes.

The sign-split weights of a layer and the forward pass of the reference input depend only on the
model's tensors, not on the explained inputs; recomputing them per call doubles the cost of the
rules that need them. A source counts as changed when its identity, storage, version counter or a
strided sample of its values differs (``p.data.copy_(...)`` does not bump the version counter, so
the sample catches a re-initialisation written that way).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

import torch

T = TypeVar("T")
_SAMPLES = 1024


def _view(t: torch.Tensor) -> torch.Tensor:
    """A strided sample of ``t``'s values as a view on its storage: read again later, it shows the values then."""
    flat = t.detach()
    if flat.is_contiguous():
        flat = flat.view(-1)
        return flat[:: max(1, flat.numel() // _SAMPLES)]
    return flat  # rare (a transposed parameter): read whole


class Snapshot:
    """What :class:`Derived` compares: each source tensor's identity, storage and version counter, and a
    strided sample of its values read through views kept on its storage, one concatenation per dtype and
    device (a call reads every sample in a few operations, not four per tensor)."""

    def __init__(self, tensors: Iterable[torch.Tensor]):
        self.tensors = tuple(tensors)
        self.keys = [(t.data_ptr(), t._version) for t in self.tensors]
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in self.tensors:
            groups.setdefault((t.dtype, t.device), []).append(_view(t))
        self._groups = list(groups.values())
        self._sample = self._read()

    def _read(self) -> list[torch.Tensor]:
        return [torch.cat([v.reshape(-1) for v in views]) for views in self._groups]

    def holds(self, tensors: tuple[torch.Tensor, ...]) -> bool:
        """Whether ``tensors`` are the same tensors as then, on the same storage, unchanged since."""
        return (len(tensors) == len(self.tensors) and all(a is b for a, b in zip(tensors, self.tensors))
                and [(t.data_ptr(), t._version) for t in tensors] == self.keys
                and all(torch.equal(a, b) for a, b in zip(self._read(), self._sample)))


class Derived(Generic[T]):
    """One cached value, recomputed when its sources or its key change."""

    def __init__(self) -> None:
        self._state: tuple[Hashable, Snapshot, T] | None = None

    def get(self, sources: Iterable[torch.Tensor], make: Callable[[], T], key: Hashable = None) -> T:
        """The value ``make()`` returned for these sources, recomputed if any of them (or ``key``) changed."""
        tensors = tuple(sources)
        if self._state is None or self._state[0] != key or not self._state[1].holds(tensors):
            self._state = (key, Snapshot(tensors), make())
        return self._state[2]
