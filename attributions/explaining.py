"""What an engine may ask of the explainer that runs it, as protocols: the engines sit below the explainer (it
imports them), so they name what they read of it here, and the explainer satisfies these (mypy checks it where
the explainer hands itself to its engine)."""
from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from attributions.graph import Graph
from attributions.shared_pass import SharedPass


class MethodFacts(Protocol):
    """What an engine reads of a method: its name and where its signal starts (``onehot`` or ``logit``)."""

    @property
    def name(self) -> str: ...

    @property
    def output(self) -> str: ...


class Pass(Protocol):
    """A forward pass an engine runs backward signals through (:class:`attributions.explainer.ForwardPass`)."""

    @property
    def values(self) -> dict[Any, Any]: ...

    @property
    def explainer(self) -> Explaining: ...

    def signals(self, start: str, vectors: torch.Tensor, keep: set[str] | None = None) -> dict[str, torch.Tensor]: ...


class Explaining(Protocol):
    """What an engine may ask of the explainer that runs it (:class:`attributions.explainer.Explainer`)."""

    @property
    def model(self) -> nn.Module: ...

    @property
    def graph(self) -> Graph | None: ...

    @property
    def traced(self) -> Graph: ...

    @property
    def method(self) -> MethodFacts: ...

    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

    def targets(self, logits: torch.Tensor, target: Any) -> torch.Tensor: ...

    def chain_maps(self, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None) -> torch.Tensor: ...

    def sibling(self, method: str, **params: Any) -> Explaining: ...

    def forward_pass(self, x: torch.Tensor, reference: bool | None = None, batch: torch.Size | None = None) -> Pass: ...

    def maps_for_targets(self, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
                         **kwargs: Any) -> torch.Tensor: ...

    def bytes_per_image(self, x: torch.Tensor) -> int: ...

    def images_per_pass(self, x: torch.Tensor, vectors: int) -> int: ...

    def baseline_like(self, x: torch.Tensor) -> torch.Tensor: ...
