"""Attention as primitive nodes: ``scaled_dot_product_attention`` (which export records for
``F.scaled_dot_product_attention`` and inside ``nn.MultiheadAttention``, after its projections and
head split) is expanded at trace time into the operations it computes (Q K^T, scaling, softmax,
times V), so every method's rules for data movement,
linear mixing, products and softmax apply to them unchanged: gradients stay exact, DeepLIFT stays
complete, and LRP holds the attention weights constant (a softmax output gates its product with V).

Weights are read from the module at call time, as for every other layer.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attributions.errors import AttributionError
from attributions.kinds import Kind
from attributions.records import Mix, Move, Product, Record, Softmax

SDPA_ARGUMENTS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")

# A node description for the graph builder: (suffix, kind, inputs, run, record). Every node marks its
# value's last axis as the channel axis (``tokens``): per head and token, a vector of the head's width.
Spec = tuple[str, Kind, tuple[str, ...], Callable[[dict[str, Any], dict[str, Any]], Any], Record]


def _value(env: dict[str, Any], replace: dict[str, Any], name: str) -> Any:
    return replace[name] if name in replace else env[name]


def _product(a: str, b: str, function: Callable[[Any, Any], Any], signal: set[str]) -> tuple[
        Kind, Callable[[dict[str, Any], dict[str, Any]], Any], Record]:
    """The kind, run function and record of a node computing ``function(a, b)``: a product of two signals,
    or a linear mix when one of them is constant."""
    def run(env: dict[Any, Any], replace: dict[Any, Any]) -> Any:
        return function(_value(env, replace, a), _value(env, replace, b))

    if a in signal and b in signal:
        return Kind.PRODUCT, run, Product((a, b), lambda env, x, y: function(x, y),
                                       op="matmul" if function is torch.matmul else "")
    return Kind.MIX, run, Mix()


def attention_specs(prefix: str, q: str, k: str, v: str, scale: float | None, signal: set[str], *,
                    mask: str | None = None) -> list[Spec]:
    """softmax(q k^T * scale + mask) v over the last two dims, as primitive nodes (the last one is the
    output); ``mask`` names a constant: added when floating, else where False the score is -inf."""
    specs: list[Spec] = []
    kt = f"{prefix}.key_t"
    specs.append(("key_t", Kind.MOVE, (k,), lambda env, r: _value(env, r, k).transpose(-2, -1), Move()))
    signal = signal | {kt}
    kind, run, record = _product(q, kt, torch.matmul, signal)
    specs.append(("scores", kind, tuple(n for n in (q, kt) if n in signal), run, record))
    scores, scaled, weights = f"{prefix}.scores", f"{prefix}.scaled", f"{prefix}.weights"

    def scale_scores(env: dict[Any, Any], r: dict[Any, Any]) -> Any:
        s = _value(env, r, scores)
        return s * (scale if scale is not None else _value(env, r, q).shape[-1] ** -0.5)

    specs.append(("scaled", Kind.MIX, (scores,), scale_scores, Mix(elementwise=True)))
    if mask is not None:
        masked = f"{prefix}.masked"

        def apply_mask(env: dict[Any, Any], r: dict[Any, Any], source: str = scaled) -> Any:
            s, m = _value(env, r, source), env[mask]
            return s + m if m.is_floating_point() else s.masked_fill(~m, float("-inf"))

        specs.append(("masked", Kind.MIX, (scaled,), apply_mask, Mix(elementwise=True)))
        signal = signal | {scaled}
        scaled = masked
    specs.append(("weights", Kind.SOFTMAX, (scaled,), lambda env, r: torch.softmax(_value(env, r, scaled), dim=-1),
                  Softmax(-1)))
    signal = signal | {scores, scaled, weights}
    kind, run, record = _product(weights, v, torch.matmul, signal)
    specs.append(("context", kind, tuple(n for n in (weights, v) if n in signal), run, record))
    return specs


@dataclass(frozen=True)
class Fused:
    """The attention's nodes as one op, for a pass whose backward autograd computes: ``inner`` the nodes it
    stands in for (K^T, Q K^T, its scaling and mask, the softmax: none of them then holds a value), ``run(env,
    q, k, v)`` the attention's output from the query, key and value. Torch's fused kernel keeps Q, K, V, the
    output and one log-sum-exp per row for its backward, not the (B, heads, T, T) weights of every block.
    ``tokens`` and ``width``: the queries' T and d as captured (None where unknown)."""

    inner: tuple[str, ...]
    run: Callable[[dict[str, Any], torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    tokens: int | None = None
    width: int | None = None

    @property
    def holds_less(self) -> bool:
        """Whether the fused kernel's backward keeps less than the expanded nodes' where both need the query, key
        and value: an output and a log-sum-exp, T (d + 1), against the weights, T T, per batch and head."""
        return self.tokens is not None and self.width is not None and self.width + 1 < self.tokens


def fused_run(scale: float | None, mask: str | None) -> Callable[
        [dict[str, Any], torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """``run(env, q, k, v)``: softmax(q k^T * scale + mask) v by ``F.scaled_dot_product_attention``."""
    def run(env: dict[str, Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        m = env[mask] if mask is not None else None
        flat = q.ndim == 3  # the fused CPU kernel takes (B, heads, T, d); on (B * heads, T, d) SDPA runs unfused
        if flat:
            q, k, v = q[None], k[None], v[None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale)
        return out[0] if flat else out
    return run


def sdpa_specs(prefix: str, bound: dict[str, Any], names: dict[str, str], signal: set[str]) -> list[Spec]:
    """F.scaled_dot_product_attention with a constant mask or none, without dropout or causal masking
    (else an error)."""
    unsupported = [k for k, default in (("dropout_p", 0.0), ("is_causal", False), ("enable_gqa", False))
                   if bound.get(k, default) != default]
    mask = bound.get("attn_mask")
    if mask is not None and (not hasattr(mask, "name") or mask.name in signal):
        unsupported.append("an attention mask computed from the input")
    if unsupported:
        raise AttributionError(f"scaled_dot_product_attention at {prefix!r}: {', '.join(unsupported)} not supported; "
                               "attention masks and dropout are not explained yet")
    scale = bound.get("scale")
    if scale is not None and not isinstance(scale, (int, float)):
        raise AttributionError(f"scaled_dot_product_attention at {prefix!r} needs a constant scale")
    return attention_specs(prefix, names["query"], names["key"], names["value"], scale, signal,
                           mask=mask.name if mask is not None else None)
