"""One forward pass of a traced graph, shared by the explainers built on it."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# the key that marks a forward pass recorded whole, for autograd's backward (Explainer._forward_envs(connected=True))
CONNECTED = ("input", "connected")


@dataclass(frozen=True)
class SharedPass:
    """A forward pass of a graph on inputs x (B, ...), made once for several methods
    (:func:`attributions.explainer.shared_forward`).

    Parameters
    ----------
    values : {node: its value (B, ...)} for the nodes the methods' backward passes read (and the keys of
        max pooling's winners and recorded autograd graphs)
    reference : the same for the reference input where a DeepLIFT method needs it, else None
    release : handed to its last reader: that backward pass drops each value once passed (as autograd frees
        what it saved), so memory freed early is reused by the next allocations instead of being returned to the
        system and faulted in again; a pass not released is kept for the readers after it
    """

    values: dict[Any, Any]
    reference: dict[Any, Any] | None = None
    release: bool = False

    @property
    def connected(self) -> bool:
        """Whether the pass was recorded whole, so that autograd can run the backward through it."""
        return CONNECTED in self.values

    def for_reader(self, *, reference: bool, last: bool) -> SharedPass:
        """The pass as one method reads it: with its reference values only for a method that reads them
        (``reference``), released when the method is its ``last`` reader."""
        return replace(self, reference=self.reference if reference else None, release=last)
