"""Grad-CAM (Selvaraju et al. 2017) and Guided Grad-CAM over the traced graph.

The class activation map of a layer with activations A (B, C, *spatial) is

    cam = sum_c alpha_c A_c,    alpha_c = mean over the spatial positions of d y_t / d A_c,

then (``relu``) max(cam, 0), upsampled to the input's size. The gradient is the engine's exact one
(the ``gradient`` method's chain), taken at the layer's node for K targets in one batched backward.

The conventions differ between the implementations in use, and SSIM and rank correlations between
maps depend on them, so each is a parameter and recorded:

* ``layer``: a node or a module path of the model; by default the last node whose output still has
  the input's spatial axes with more than one position (the last feature map before global pooling);
* ``relu``: on in Selvaraju et al., captum's ``relu_attributions`` is off by default;
* ``upsample``: ``nearest`` (captum's ``LayerAttribution.interpolate`` default) or ``bilinear``
  (pytorch-grad-cam, which resizes with OpenCV's bilinear filter: half-pixel centres, as
  ``align_corners=False``);
* ``normalise``: ``none``, or min-max per map ``before`` upsampling or ``after`` it. pytorch-grad-cam
  min-maxes after its ReLU and before resizing, then once more after (when it averages its layers): ``before``
  plus one more min-max of the result reproduces it.

Maps are shaped like the inputs: every channel carries the map (Guided Grad-CAM: guided backprop's
channels, each multiplied by the ReLU'd map, as captum's ``GuidedGradCam``).
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F

from attributions.anatomy import cam_layer, on_grid, token_layout, token_node
from attributions.engines import Engine
from attributions.errors import AttributionError, NotApplicable
from attributions.explaining import Explaining
from attributions.shared_pass import SharedPass

UPSAMPLING = ("nearest", "bilinear")
NORMALISATIONS = ("none", "before", "after")


def _minmax(maps: torch.Tensor) -> torch.Tensor:
    """Each map of (N, 1, *spatial) shifted and scaled to [0, 1] (a constant map to zeros)."""
    flat = maps.reshape(maps.shape[0], -1)
    low, high = flat.amin(1, keepdim=True), flat.amax(1, keepdim=True)
    span = torch.where(high > low, high - low, torch.ones_like(high))
    return ((flat - low) / span).reshape(maps.shape)


def target_signals(ex: Explaining, x: torch.Tensor, targets: list[Any], nodes: set[str], method: str = "gradient"
                   ) -> tuple[Any, dict[str, torch.Tensor]]:
    """The forward pass of ``method`` (a chain method, on the explainer's model) on ``x`` (B, ...) and its
    backward signals at ``nodes`` for the K explained outputs, started as that method starts its maps
    (one-hot, or one-hot times the logit): (the pass, {node: (K, B, ...)}), in one batched backward.
    For ``gradient`` these are the exact gradients."""
    chain = ex.sibling(method)
    forward = chain.forward_pass(x, reference=False)
    logits = forward.values[chain.traced.output]
    onehots = torch.stack([torch.zeros_like(logits).scatter_(1, ex.targets(logits, t)[:, None], 1.0)
                           for t in targets])
    with torch.no_grad():
        start = onehots * logits if chain.method.output == "logit" else onehots
        signals = forward.signals(chain.traced.output, start, keep=nodes)
    return forward, {n: signals[n] for n in nodes}


def upsampled(maps: torch.Tensor, x: torch.Tensor, upsample: str, normalise: str = "none") -> torch.Tensor:
    """Maps (K, B, 1, *grid) at the input's resolution, (K, B, C, *spatial) with every channel the map;
    ``normalise``: min-max per map before or after the interpolation, or none."""
    k, b = maps.shape[:2]
    flat = maps.reshape(k * b, 1, *maps.shape[3:])
    if normalise == "before":
        flat = _minmax(flat)
    flat = F.interpolate(flat, size=x.shape[2:], mode=_mode(upsample, x.ndim - 2))
    if normalise == "after":
        flat = _minmax(flat)
    return flat.reshape(k, b, 1, *x.shape[2:]).expand(k, b, *x.shape[1:])


class PerGraph:
    """What an engine finds in a model once per traced graph, from a forward pass of two images:
    ``find(graph, values, ndim)``, its answer kept with the graph (shapes, not values, decide it)."""

    def __init__(self, find: Any):
        self.find = find
        self._found: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def get(self, ex: Explaining, x: torch.Tensor) -> tuple[Any, Any]:
        """(the explainer's graph for inputs like ``x`` (B, ...), what ``find`` found in it)."""
        graph = ex.graph if ex.graph is not None and ex.graph.accepts(x.shape) else None
        if graph is None or graph not in self._found:
            gradient = ex.sibling("gradient")
            # two images: a node that folds another axis into the batch axis (patches, heads) is told apart from
            # one that keeps it, which one image cannot do where the folded axis is 1 long at that image
            probe = x[:2] if len(x) >= 2 else x[:1].expand(2, *x.shape[1:])
            values = gradient.forward_pass(probe, reference=False).values
            graph = gradient.graph
            try:
                self._found[graph] = self.find(graph, values, x.ndim)
            except NotApplicable:
                raise
            except AttributionError as exc:  # the model traced and ran: what it lacks is what the method reads
                raise NotApplicable(str(exc)) from exc
        return graph, self._found[graph]


class GradCam(Engine):
    """Grad-CAM maps (K, B, ...) for K targets; ``guided``: Guided Grad-CAM (guided backprop x the map);
    ``tokens``: the layer holds tokens (B, T, D) of a vision transformer, laid out on the patch grid first
    (:func:`attributions.anatomy.token_layout`; ``auto`` is then the last block's first norm, as
    pytorch-grad-cam's ViT example). See the module docstring for the conventions."""

    chunked = True

    def __init__(self, layer: str = "auto", relu: bool = True, upsample: str = "bilinear",
                 normalise: str = "none", guided: bool = False, tokens: bool = False):
        if upsample not in UPSAMPLING:
            raise AttributionError(f"Grad-CAM upsample must be one of {', '.join(UPSAMPLING)}, got {upsample!r}")
        if normalise not in NORMALISATIONS:
            raise AttributionError(f"Grad-CAM normalise must be one of {', '.join(NORMALISATIONS)}, got {normalise!r}")
        self.layer, self.relu, self.upsample, self.normalise = layer, relu, upsample, normalise
        self.guided, self.tokens = guided, tokens
        self.rectifies = guided  # guided backprop's factor clips the signal at every ReLU
        find = token_node if tokens else cam_layer
        self._layers = PerGraph(lambda graph, values, ndim: find(graph, values, layer, ndim))  # the node weighed

    def layer_of(self, ex: Explaining, x: torch.Tensor) -> str:
        """The node this engine weighs on the explainer's model for inputs like ``x`` (B, ...)."""
        return self._locate(ex, x)[1]

    def _locate(self, ex: Explaining, x: torch.Tensor) -> tuple[Any, str]:
        """(the graph for inputs like ``x``, the node weighed in it)."""
        return self._layers.get(ex, x)

    def fits(self, ex: Explaining, x: torch.Tensor) -> str | None:
        try:
            self._locate(ex, x)
        except NotApplicable as exc:
            return str(exc)
        return None

    def conventions(self, ex: Explaining, x: torch.Tensor) -> dict[str, Any]:
        graph, node = self._locate(ex, x)
        return {"layer": node, "module": graph.by_name[node].path, "relu": self.relu or self.guided,
                "upsample": self.upsample, "normalise": self.normalise}

    def maps(self, ex: Explaining, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
             **kwargs: Any) -> torch.Tensor:
        layer = self.layer_of(ex, x)
        forward, grads = target_signals(ex, x, targets, {layer})
        grad, acts = grads[layer], forward.values[layer]
        if self.tokens:
            layout = token_layout(forward.explainer.graph, forward.values, acts.shape[1], x.ndim)
            grad, acts = on_grid(grad, layout), on_grid(acts[None], layout)[0]
        with torch.no_grad():
            spatial = tuple(range(3, grad.ndim))
            cam = (grad.mean(spatial, keepdim=True) * acts).sum(2, keepdim=True)  # (K, B, 1, *spatial)
            if self.relu or self.guided:
                cam = cam.clamp(min=0)
            cam = upsampled(cam, x, self.upsample, self.normalise)
        if self.guided:
            guided: torch.Tensor = ex.sibling("guided-backprop").maps_for_targets(x, targets)
            return guided * cam[:, :, :1]
        return cam.clone()
def _mode(upsample: str, axes: int) -> str:
    """torch's name of the ``upsample`` interpolation over ``axes`` spatial axes (bilinear in 2-D)."""
    if upsample == "nearest":
        return "nearest"
    linear = {1: "linear", 2: "bilinear", 3: "trilinear"}
    if axes not in linear:
        raise AttributionError(f"Grad-CAM cannot interpolate {upsample} over {axes} spatial axes; use upsample='nearest'")
    return linear[axes]
