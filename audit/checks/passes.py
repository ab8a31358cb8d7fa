"""The forward pass every map-based check starts from: one traced graph, an explainer per method on
it, their shared forward pass and the logits, checked (finite; labels in range)."""
from __future__ import annotations

import torch
from torch import nn

from attributions.explainer import Explainer, shared_forward
from attributions.graph import Graph, trace
from audit.inputs import check_labels, check_logits


def prepare(model: nn.Module, x: torch.Tensor, methods: list[str], y: torch.Tensor | None = None,
            graph: Graph | None = None, seed: int = 0) -> tuple[Graph, dict[str, Explainer], tuple | None, torch.Tensor]:
    """(graph, {method: Explainer}, shared forward pass or None, logits (B, classes)) for ``x`` (B, ...).

    ``graph``: reuse a trace of ``model``; ``seed``: the random control's. With labels ``y`` (B,), the
    logits must be finite and the labels index the model's classes (else an :class:`AuditError`).
    """
    graph = graph if graph is not None else trace(model)
    params: dict[str, dict] = {"random": {"seed": seed}}
    explainers = {m: Explainer(model, m, graph=graph, **params.get(m, {})) for m in methods}
    envs = shared_forward(explainers, x)
    logits = envs[0][graph.output] if envs else Explainer(model, "gradient", graph=graph).forward(x).detach()
    if y is not None:
        check_logits(logits)
        check_labels(y, logits.shape[1])
    return graph, explainers, envs, logits
