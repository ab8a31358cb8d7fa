"""Attention as one fused op in a forward pass whose backward autograd computes.

The graph expands attention into its primitive nodes (:mod:`attributions.attention`), so that every rule can act
on each of them. Where the chain is one autograd call (:attr:`~attributions.explainer.Explainer.by_autograd`) and
the rules at those nodes are the exact gradient times a constant per operand (the plain gradient; AttnLRP's
uniform rule: halves through both products), the
pass runs ``F.scaled_dot_product_attention`` on the query, key and value, each with its gradient scaled by the
product of the constants on its path. The gradient is the same; torch's fused kernel keeps for its backward the
query, key, value, output and one log-sum-exp per row, where the expanded nodes keep the (B, heads, T, T) weights
of every block beside the query and key: less where the sequence is longer than the head's width plus one
(:attr:`~attributions.attention.Fused.holds_less`), else the attention stays expanded. It stays expanded too where
the weights are held (CP-LRP: no gradient reaches the query and key), which are then all the expanded nodes keep.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attributions.errors import AttributionError
from attributions.graph import Graph, Node
from attributions.kinds import Kind
from attributions.records import Product
from attributions.rules import scaled_gradient


@dataclass(frozen=True)
class Fusion:
    """One attention run fused: ``inner`` the nodes it stands in for, ``operands`` the query, key and value
    nodes, ``scales`` the constant each one's gradient is multiplied by."""

    inner: tuple[str, ...]
    operands: tuple[str, str, str]
    scales: tuple[float, float, float]


def plan(graph: Graph, rules: dict[str, Any], keep: frozenset[str]) -> dict[str, Fusion]:
    """{attention output node: its fusion} for the attentions of ``graph`` that ``rules`` ({node: rule}) let run
    fused when the backward returns the signals at ``keep`` (none of the inner nodes may be kept)."""
    out = {}
    for node in graph.nodes:
        fusion = _fusion(graph, rules, node)
        if fusion is not None and not keep & set(fusion.inner):
            out[node.name] = fusion
    return out


def _fusion(graph: Graph, rules: dict[str, Any], node: Node) -> Fusion | None:
    """The fusion of attention output ``node``, or None where it cannot or need not run fused."""
    if node.fused is None or not node.fused.holds_less or node.kind != Kind.PRODUCT or \
            any(c not in node.fused.inner and c != node.name for n in node.fused.inner for c in graph.consumers[n]):
        return None  # short sequences; a product with a constant operand; a value of an inner node read elsewhere
    nodes = [graph.by_name[n] for n in node.fused.inner] + [node]
    key_t, scores = nodes[0], nodes[1]
    scales = {}
    for n in nodes:
        scale = rules[n.name].gradient_scales(n) if n.name in rules else None
        if scale is None or (n.name not in (scores.name, node.name) and scale != (1.0,) * len(scale)):
            return None  # a rule that is not the gradient there
        scales[n.name] = scale
    if scores.kind != Kind.PRODUCT or len(key_t.inputs) != 1:
        return None  # the query or the key a constant of the model
    (q, kt), (weights, v) = _operands(scores), _operands(node)
    (s_q, s_k), (s_w, s_v) = scales[scores.name], scales[node.name]
    if kt != key_t.name or weights != nodes[-2].name or s_w * s_q == s_w * s_k == 0.0:
        # not the order attention_specs builds; or the weights held (CP-LRP), all the expanded nodes then keep
        return None
    return Fusion(node.fused.inner, (q, key_t.inputs[0], v), (s_w * s_q, s_w * s_k, s_v))


def run(node: Node, fusion: Fusion, env: dict[Any, Any]) -> torch.Tensor:
    """The value of attention output ``node`` from its operands' values in ``env``, with their gradients scaled."""
    q, k, v = (scaled_gradient(env[o], s) for o, s in zip(fusion.operands, fusion.scales))
    if node.fused is None:
        raise AttributionError(f"node {node.name!r} is not an attention's output: it has no fused run")
    out: torch.Tensor = node.fused.run(env, q, k, v)
    return out


def _operands(node: Node) -> tuple[str, str]:
    record = node.record
    assert isinstance(record, Product)
    return record.operands
