"""Attention as primitive nodes: ``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention`` are
expanded at trace time into the operations they compute (projections, head split, Q K^T, scaling,
softmax, times V, head merge, output projection), so every method's rules for data movement,
linear mixing, products and softmax apply to them unchanged: gradients stay exact, DeepLIFT stays
complete, and LRP holds the attention weights constant (a softmax output gates its product with V).

Weights are read from the module at call time, as for every other layer.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attributions.errors import AttributionError

MHA_ARGUMENTS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
                 "is_causal")
SDPA_ARGUMENTS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")

# A node description for the graph builder: (suffix, kind, inputs, run, params). Every node marks its
# value's last axis as the channel axis (``tokens``): per head and token, a vector of the head's width.
Spec = tuple[str, str, tuple[str, ...], Callable[[dict, dict], Any], dict]


def _value(env: dict, replace: dict, name: str) -> Any:
    return replace[name] if name in replace else env[name]


def _product(a: str, b: str, function: Callable[[Any, Any], Any]) -> tuple[Callable[[dict, dict], Any], dict]:
    """The run function and parameters of a product node computing ``function(a, b)``."""
    def run(env, replace):
        return function(_value(env, replace, a), _value(env, replace, b))

    return run, {"pair": lambda env, x, y: function(x, y), "operands": [a, b], "quotient": False}


def attention_specs(prefix: str, q: str, k: str, v: str, scale: float | None, signal: set[str]) -> list[Spec]:
    """softmax(q k^T * scale) v over the last two dims, as primitive nodes (the last one is the output)."""
    specs: list[Spec] = []

    def mul_kind(a: str, b: str) -> str:
        return "product" if a in signal and b in signal else "mix"

    kt = f"{prefix}.key_t"
    specs.append(("key_t", "move", (k,), lambda env, r: _value(env, r, k).transpose(-2, -1), {}))
    signal = signal | {kt}
    run, params = _product(q, kt, torch.matmul)
    specs.append(("scores", mul_kind(q, kt), tuple(n for n in (q, kt) if n in signal), run,
                  params if mul_kind(q, kt) == "product" else {}))
    scores, scaled, weights = f"{prefix}.scores", f"{prefix}.scaled", f"{prefix}.weights"

    def scale_scores(env, r):
        s = _value(env, r, scores)
        return s * (scale if scale is not None else _value(env, r, q).shape[-1] ** -0.5)

    specs.append(("scaled", "mix", (scores,), scale_scores, {}))
    specs.append(("weights", "softmax", (scaled,), lambda env, r: torch.softmax(_value(env, r, scaled), dim=-1),
                  {"dim": -1}))
    signal = signal | {scores, scaled, weights}
    run, params = _product(weights, v, torch.matmul)
    specs.append(("context", mul_kind(weights, v), tuple(n for n in (weights, v) if n in signal), run,
                  params if mul_kind(weights, v) == "product" else {}))
    return specs


def sdpa_specs(prefix: str, bound: dict, names: dict[str, str], signal: set[str]) -> list[Spec]:
    """F.scaled_dot_product_attention without a mask, dropout or causal masking (else an error)."""
    unsupported = [k for k, default in (("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False),
                                        ("enable_gqa", False)) if bound.get(k, default) != default]
    if unsupported:
        raise AttributionError(f"scaled_dot_product_attention at {prefix!r}: {', '.join(unsupported)} not supported; "
                               "attention masks and dropout are not explained yet")
    scale = bound.get("scale")
    if scale is not None and not isinstance(scale, (int, float)):
        raise AttributionError(f"scaled_dot_product_attention at {prefix!r} needs a constant scale")
    return attention_specs(prefix, names["query"], names["key"], names["value"], scale, signal)


def mha_specs(prefix: str, module: nn.MultiheadAttention, bound: dict, names: dict[str, str],
              signal: set[str]) -> list[Spec]:
    """nn.MultiheadAttention (either input layout, packed or separate projections), without masks,
    added key / value biases or zero attention (else an error); the attention weights it may also
    return are not part of the graph."""
    if module.bias_k is not None or module.add_zero_attn:
        raise AttributionError(f"nn.MultiheadAttention {prefix!r}: add_bias_kv / add_zero_attn are not supported")
    for key in ("key_padding_mask", "attn_mask"):
        if bound.get(key) is not None:
            raise AttributionError(f"nn.MultiheadAttention {prefix!r}: {key} is not supported yet")
    if bound.get("is_causal"):
        raise AttributionError(f"nn.MultiheadAttention {prefix!r}: is_causal is not supported yet")
    e, h = module.embed_dim, module.num_heads
    d = e // h
    first = module.batch_first
    specs: list[Spec] = []

    def weight(i: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor | None]]:
        def get():
            if module._qkv_same_embed_dim:
                w = module.in_proj_weight[i * e:(i + 1) * e]
            else:
                w = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)[i]
            b = module.in_proj_bias[i * e:(i + 1) * e] if module.in_proj_bias is not None else None
            return w, b
        return get

    heads = []
    for i, role in enumerate(("query", "key", "value")):
        src, get = names[role], weight(i)
        proj, split = f"{prefix}.{role}_proj", f"{prefix}.{role}_heads"

        def project(env, r, src=src, get=get):
            w, b = get()
            return F.linear(_value(env, r, src), w, b)

        def to_heads(env, r, proj=proj):
            t = _value(env, r, proj)
            t = t if first else t.transpose(0, 1)  # (B, L, E)
            return t.reshape(t.shape[0], t.shape[1], h, d).transpose(1, 2)

        specs.append((f"{role}_proj", "mix", (src,), project, {}))
        specs.append((f"{role}_heads", "move", (proj,), to_heads, {}))
        heads.append(split)
    signal = signal | set(heads)
    specs += attention_specs(prefix, heads[0], heads[1], heads[2], None, signal)
    context, merged = f"{prefix}.context", f"{prefix}.merged"

    def merge(env, r):
        t = _value(env, r, context).transpose(1, 2)
        t = t.reshape(t.shape[0], t.shape[1], e)
        return t if first else t.transpose(0, 1)

    specs.append(("merged", "move", (context,), merge, {}))

    def out_proj(env, r):
        return F.linear(_value(env, r, merged), module.out_proj.weight, module.out_proj.bias)

    specs.append(("out_proj", "mix", (merged,), out_proj, {}))
    return specs
