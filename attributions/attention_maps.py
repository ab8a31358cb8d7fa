"""Maps read from a vision transformer's attention weights A_l (B, heads, T, T), one per block.

* Attention rollout (Abnar & Zuidema 2020): heads fused (mean by default, or max / min), optionally
  the lowest ``discard_ratio`` of each fused matrix set to 0 (sparing the class token's own entry, as
  the widely used vit-explain code does), then A~ = (A + I) row-normalised, multiplied through the
  blocks: J = A~_L ... A~_1. The explained class plays no part.
* Generic attention explainability (Chefer, Gur, Wolf, ICCV 2021): from R = I, for every block in
  forward order R <- R + mean_h[(dy_t/dA * A)+] R, the gradient the engine's exact one.
* Transformer attribution (Chefer, Gur, Wolf, CVPR 2021): the same accumulation, C <- C + mean_h[(dy_t/dA
  * R_A)+] C, with R_A the relevance that Chefer et al.'s LRP (the ``chefer-lrp`` method) brings to the
  weights.
* Attention Grad-CAM (Chefer et al.'s baseline, CVPR 2021): the last block's attention of the class
  token to the patches per head, weighted by that row's mean gradient, averaged over heads, ReLU'd. Where
  the head never reads the class token (mean pooling, an attention-pooling head), the mean of the patch
  tokens' rows, which it reads, stands in for it.

The map is the class token's row (the mean over rows for a model without one) at the patch tokens,
laid out on the patch grid and upsampled to the input (:mod:`attributions.anatomy`). Every channel
carries the map. Rollout multiplies non-negative row-stochastic matrices: Sixt et al.'s argument
predicts that such a product converges to rank 1, whatever the weights.
"""
from __future__ import annotations

from typing import Any

import torch

from attributions.anatomy import TokenLayout, attention_nodes, token_layout
from attributions.cam import UPSAMPLING, PerGraph, target_signals, upsampled
from attributions.engines import Engine
from attributions.errors import AttributionError, NotApplicable
from attributions.explaining import Explaining
from attributions.shared_pass import SharedPass

FUSIONS = ("mean", "max", "min")
RELEVANCE_METHOD = "chefer-lrp"  # whose relevance at the attention weights Chefer et al.'s attribution weighs
# what each block contributes: its weights, gradient x weights, or gradient x the weights' LRP relevance
WEIGHTINGS = ("attention", "gradient", "relevance")


def _fuse(a: torch.Tensor, fusion: str) -> torch.Tensor:
    """Heads fused: (..., heads, T, T) -> (..., T, T)."""
    if fusion == "mean":
        return a.mean(-3)
    return a.amax(-3) if fusion == "max" else a.amin(-3)


def _discard(a: torch.Tensor, ratio: float) -> torch.Tensor:
    """The lowest ``ratio`` of each (T, T) matrix of (N, T, T) set to 0, entry (0, 0) kept."""
    n, t = a.shape[0], a.shape[-1]
    drop = int(t * t * ratio)
    if drop == 0:
        return a
    flat = a.reshape(n, t * t).clone()
    lowest = flat.topk(drop, dim=1, largest=False).indices
    keep = flat[:, :1].clone()
    flat.scatter_(1, lowest, 0.0)
    flat[:, :1] = keep
    return flat.reshape(a.shape)


def _row(joint: torch.Tensor, layout: TokenLayout, patches: bool = False) -> torch.Tensor:
    """The class token's row at the patch tokens (without a class token, or with ``patches``, the mean of the
    patch tokens' rows): (..., T, T) -> (..., 1, *grid)."""
    row = joint[..., layout.prefix:, :].mean(-2) if patches or not layout.prefix else joint[..., 0, :]
    return row[..., layout.prefix:].reshape(*row.shape[:-1], 1, *layout.grid)


def _located(graph: Any, values: dict[str, Any], ndim: int) -> tuple[list[str], TokenLayout]:
    """(the attention nodes in forward order, the token layout) of a graph, from one forward pass's values (B, ...)."""
    nodes = attention_nodes(graph, values)
    if not nodes:
        raise AttributionError("the model has no attention layer (softmax weights of shape (B, heads, T, T) that "
                               "weigh values); attention maps need a transformer")
    # more than one attention matrix per head and image means the tokens are windows of the image
    batch = values[graph.nodes[0].name].shape[0]
    windowed = next((n for n in nodes if values[n].shape[0] != batch), None)
    if windowed is not None:
        raise AttributionError(f"the attention layer {windowed!r} attends within {values[windowed].shape[0] // batch} windows "
                               "of each image: windowed or grid attention (Swin, MaxViT) has no single token map of the "
                               "whole image to roll out")
    sizes = {values[n].shape[-1] for n in nodes}
    if len(sizes) > 1:
        raise AttributionError(f"the attention layers attend over different numbers of tokens ({sorted(sizes)}): "
                               "a multi-scale or multi-branch transformer has no single token map to roll out")
    return nodes, token_layout(graph, values, sizes.pop(), ndim)


class _OnAttention(Engine):
    """An engine that reads the attention layers: it fits the models that have them over the patch grid,
    which it finds once per traced graph."""

    chunked = True

    def __init__(self) -> None:
        self._attention = PerGraph(_located)

    def fits(self, ex: Explaining, x: torch.Tensor) -> str | None:
        try:
            self._attention.get(ex, x)
        except NotApplicable as exc:
            return str(exc)
        return None


class AttentionFlow(_OnAttention):
    """Attention rollout (``weighting="attention"``, ``accumulate="rollout"``) and generic attention
    explainability (``"gradient"``, ``"generic"``) over every attention layer; see the module docstring."""

    product = True

    def __init__(self, weighting: str = "attention", accumulate: str = "rollout", fusion: str = "mean",
                 discard_ratio: float = 0.0, upsample: str = "bilinear"):
        if weighting not in WEIGHTINGS:
            raise AttributionError(f"attention weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
        if accumulate not in ("rollout", "generic"):
            raise AttributionError(f"accumulate must be rollout or generic, got {accumulate!r}")
        if fusion not in FUSIONS:
            raise AttributionError(f"head fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}")
        if not 0 <= discard_ratio < 1:
            raise AttributionError(f"discard_ratio must lie in [0, 1), got {discard_ratio}")
        if upsample not in UPSAMPLING:
            raise AttributionError(f"upsample must be one of {', '.join(UPSAMPLING)}, got {upsample!r}")
        super().__init__()
        self.weighting, self.accumulate, self.fusion = weighting, accumulate, fusion
        self.passes = 2 if weighting == "relevance" else 1  # the gradient's signals and the LRP relevance's
        self.discard_ratio, self.upsample = discard_ratio, upsample

    def operators(self, ex: Explaining, x: torch.Tensor, targets: list[Any]) -> tuple[list[str], list[torch.Tensor], TokenLayout]:
        """(the attention nodes in forward order, each block's operator (K, B, T, T), the token layout): the map
        is the class token's row of their product, the last block's on the left. Rollout's operator is the
        fused, discarded, (A + I) row-normalised matrix; generic attention's I + mean_h[(grad A * A)+], Chefer
        et al.'s transformer attribution's I + mean_h[(grad A * R_A)+] with R_A the LRP relevance at the
        weights. All are non-negative, so a backward pass through them is a product of non-negative matrices."""
        k = len(targets)
        _, (nodes, layout) = self._attention.get(ex, x)
        if self.weighting == "attention":  # the same for every target
            values = ex.sibling("gradient").forward_pass(x, reference=False).values
            blocks = [_fuse(values[n], self.fusion)[None].expand(k, -1, -1, -1) for n in nodes]
        else:
            forward, grads = target_signals(ex, x, targets, set(nodes))
            values = forward.values
            if self.weighting == "relevance":  # the LRP relevance that reaches each block's weights
                values = target_signals(ex, x, targets, set(nodes), RELEVANCE_METHOD)[1]
            blocks = [_fuse((grads[n] * values[n]).clamp(min=0), self.fusion) for n in nodes]
        with torch.no_grad():
            t = blocks[0].shape[-1]
            eye = torch.eye(t, dtype=blocks[0].dtype, device=blocks[0].device)
            if self.accumulate == "generic":
                return nodes, [eye + block for block in blocks], layout
            out = []
            for block in blocks:
                fused = _discard(block.reshape(-1, t, t), self.discard_ratio).reshape(block.shape) + eye
                out.append(fused / fused.sum(-1, keepdim=True))
            return nodes, out, layout

    def maps(self, ex: Explaining, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
             **kwargs: Any) -> torch.Tensor:
        _, operators, layout = self.operators(ex, x, targets)
        with torch.no_grad():
            joint = operators[0]
            for operator in operators[1:]:
                joint = operator @ joint
            return upsampled(_row(joint, layout), x, self.upsample).clone()


class AttentionGradCam(_OnAttention):
    """Chefer et al.'s attention Grad-CAM: the last attention layer's class-token row per head, weighted by
    the row's mean gradient, averaged over heads and ReLU'd (K, B, ...); see the module docstring."""

    def __init__(self, upsample: str = "bilinear"):
        if upsample not in UPSAMPLING:
            raise AttributionError(f"upsample must be one of {', '.join(UPSAMPLING)}, got {upsample!r}")
        super().__init__()
        self.upsample = upsample

    def maps(self, ex: Explaining, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
             **kwargs: Any) -> torch.Tensor:
        _, (nodes, layout) = self._attention.get(ex, x)
        last = nodes[-1]
        forward, grads = target_signals(ex, x, targets, {last})
        with torch.no_grad():
            grad = grads[last]  # (K, B, heads, T, T)
            # a head that never reads the class token (mean pooling, an attention-pooling head): the rows it reads,
            # the patch tokens', stand in for the class token's, as for a model without one. (Where the output
            # depends on no row of the layer, a saturated gate, the gradient and so the map are zero.)
            patches = bool(layout.prefix) and not bool(grad[..., 0, :].any()) and bool(grad.any())
            a, g = _row(forward.values[last][None], layout, patches), _row(grad, layout, patches)  # (K, B, heads, 1, *grid)
            weights = g.mean(tuple(range(4, g.ndim)), keepdim=True)
            cam = (a * weights).mean(2).clamp(min=0)  # (K, B, 1, *grid)
            return upsampled(cam, x, self.upsample).clone()
