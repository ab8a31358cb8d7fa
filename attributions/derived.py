"""Values derived from tensors that may change in place: kept until one of their sources changes.

The sign-split weights of a layer and the forward pass of the reference input depend only on the
model's tensors, not on the explained inputs; recomputing them per call doubles the cost of the
rules that need them. A source counts as changed when its identity, storage, version counter or a
strided sample of its values differs (``p.data.copy_(...)`` does not bump the version counter, so
the sample catches a re-initialisation written that way).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")
_SAMPLES = 1024


def _sample(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    return flat[:: max(1, flat.numel() // _SAMPLES)].clone()


def snapshot(tensors: Iterable[torch.Tensor]) -> list[tuple[Any, ...]]:
    """What :class:`Derived` compares: (tensor, storage, version, value sample) per tensor."""
    return [(t, t.data_ptr(), t._version, _sample(t)) for t in tensors]


def _same(before: list[tuple[Any, ...]], now: list[tuple[Any, ...]]) -> bool:
    return len(before) == len(now) and all(
        a[0] is b[0] and a[1:3] == b[1:3] and torch.equal(a[3], b[3]) for a, b in zip(before, now))


class Derived(Generic[T]):
    """One cached value, recomputed when its sources or its key change."""

    def __init__(self) -> None:
        self._state: tuple[Hashable, list[tuple[Any, ...]], T] | None = None

    def get(self, sources: Iterable[torch.Tensor], make: Callable[[], T], key: Hashable = None) -> T:
        """The value ``make()`` returned for these sources, recomputed if any of them (or ``key``) changed."""
        now = snapshot(sources)
        if self._state is None or self._state[0] != key or not _same(self._state[1], now):
            self._state = (key, now, make())
        return self._state[2]
