"""The forward pass every map-based check starts from: one traced graph, an explainer per method on
it, their shared forward pass and the logits, checked (finite; labels in range)."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from attributions.errors import AttributionError, NotApplicable
from attributions.explainer import Explainer, Reuse, shared_forward
from attributions.graph import Graph, trace
from attributions.shared_pass import SharedPass
from audit.errors import ModelError
from audit.inputs import check_labels, check_logits


@contextmanager
def model_errors() -> Iterator[None]:
    """Within the block, the engine refusing the model (an op it does not support) or the inputs (a
    shape or channel count the model does not take) is a :class:`ModelError`, the audit's own."""
    try:
        yield
    except NotApplicable:  # the runner leaves the unit empty and the manifest says why
        raise
    except AttributionError as exc:
        raise ModelError(str(exc)) from exc


# methods' parameters, {method: {name: value}}: what an audit gives every explainer of a unit (the pattern methods'
# data and cache), carried in the unit's context (audit.checks.options.UnitContext.params)
Params = Mapping[str, Mapping[str, Any]]


def explainer(model: nn.Module, method: str, graph: Graph | None = None, params: Params | None = None) -> Explainer:
    """``Explainer(model, method, graph=graph)`` with the parameters ``params`` gives ``method``."""
    return Explainer(model, method, graph=graph, **(params or {}).get(method, {}))


def prepare(model: nn.Module, x: torch.Tensor, methods: list[str], y: torch.Tensor | None = None,
            graph: Graph | None = None, seed: int = 0, *, params: Params | None = None,
            reuse: Reuse | None = None, previous: dict[str, Explainer] | None = None
            ) -> tuple[Graph, dict[str, Explainer], SharedPass | None, torch.Tensor]:
    """(graph, {method: Explainer}, shared forward pass or None, logits (B, classes)) for ``x`` (B, ...).

    ``graph``: reuse a trace of ``model``; ``seed``: the random control's; ``params``: methods'
    parameters, {method: {name: value}}; ``reuse``: node values an earlier shared pass on ``x`` gives
    (:func:`~attributions.explainer.shared_forward`); ``previous``: the explainers of an earlier call on
    this same model object and graph (a model whose layers were re-initialised in place since), kept
    for the methods without parameters given here. With labels ``y`` (B,), the
    logits must be finite and the labels index the model's classes (else an :class:`AuditError`); a
    model the engine cannot trace, or inputs it does not take, are a :class:`ModelError`.
    """
    with model_errors():
        graph = graph if graph is not None else trace(model, x)
        given: dict[str, Mapping[str, Any]] = {"random": {"seed": seed}} | dict(params or {})
        kept = {m: e for m, e in (previous or {}).items() if e.model is model and e.graph is graph and m not in given}
        explainers = {m: kept[m] if m in kept else Explainer(model, m, graph=graph, **given.get(m, {})) for m in methods}
        shared = shared_forward(explainers, x, reuse)
        logits = shared.values[graph.output] if shared is not None else \
            Explainer(model, "gradient", graph=graph).forward(x).detach()
    if y is not None:
        check_logits(logits)
        check_labels(y, logits.shape[1])
    return graph, explainers, shared, logits
