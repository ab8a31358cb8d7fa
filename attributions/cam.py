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
* ``normalise``: ``none``, or min-max per map ``before`` upsampling (pytorch-grad-cam) or ``after``.

Maps are shaped like the inputs: every channel carries the map (Guided Grad-CAM: guided backprop's
channels, each multiplied by the ReLU'd map, as captum's ``GuidedGradCam``).
"""
from __future__ import annotations

import itertools
import math
import weakref
from typing import Any

import torch
import torch.nn.functional as F

from attributions.engines import Engine
from attributions.errors import AttributionError

UPSAMPLING = ("nearest", "bilinear")
NORMALISATIONS = ("none", "before", "after")


# kinds whose output keeps the axes of their signal inputs (element-wise maps, normalisations, sums)
_KEEPING = ("relu", "leaky_relu", "activation", "affine", "norm", "add", "product")


def _permutation(node: Any, values: dict) -> tuple[int, ...] | None:
    """The axes ``node`` (a move of one signal) permutes, found by running it on a probe of distinct
    integers shaped like its input: p with output = input.permute(p), or None for any other move
    (a reshape, a flatten, an index)."""
    source, out = values[node.inputs[0]], values[node.name]
    if not isinstance(out, torch.Tensor) or out.ndim != source.ndim or out.numel() != source.numel():
        return None
    probe = torch.arange(source.numel(), device=source.device).reshape(source.shape)
    try:
        moved = node.evaluate(values, {node.inputs[0]: probe})
    except (RuntimeError, TypeError):
        return None
    for p in itertools.permutations(range(source.ndim)):
        if probe.permute(p).shape == moved.shape and torch.equal(probe.permute(p), moved):
            return p
    return None


def feature_maps(graph: Any, values: dict, ndim: int) -> list[str]:
    """The nodes whose outputs are channels-first feature maps (B, C, *spatial) with more than one
    position, in forward order; ``values`` a forward pass's {node: value}, ``ndim`` the input's axes.

    Each node's layout (which of the input's axes each of its axes is) is followed from the input:
    convolutions and pooling put out channels-first maps, element-wise ops, norms and sums keep their
    inputs' common layout, a linear layer over the channel axis keeps it (a channels-last block), a
    permute reorders it (found by running the node on a probe), and any other move (a reshape to
    tokens, a flatten) ends it. So a channels-last stretch that returns to channels-first (ConvNeXt)
    still counts, and the 4-D tensors inside attention (heads x tokens) never do."""
    canonical = tuple(range(ndim))
    layout: dict[str, tuple[int, ...]] = {graph.nodes[0].name: canonical}
    for node in graph.nodes[1:]:
        value = values.get(node.name)
        if not isinstance(value, torch.Tensor) or value.ndim != ndim:
            continue
        inputs = [layout.get(i) for i in node.inputs if isinstance(values.get(i), torch.Tensor)
                  and values[i].ndim == ndim]
        same = inputs[0] if inputs and all(i is not None and i == inputs[0] for i in inputs) else None
        found = None
        if node.kind in ("conv", "maxpool", "avgpool"):
            found = canonical
        elif node.kind in _KEEPING or (node.kind == "mix" and node.params.get("elementwise")):
            found = same
        elif node.kind == "dense":
            found = same if same is not None and same[-1] == 1 else None
        elif node.kind == "move" and same is not None:
            if node.params.get("identity") or node.params.get("cat"):
                found = same
            elif len(node.inputs) == 1:
                p = _permutation(node, values)
                found = tuple(same[a] for a in p) if p is not None else None
        if found is not None:
            layout[node.name] = found
    return [n for n, v in layout.items() if v == canonical and n != graph.nodes[0].name
            and math.prod(values[n].shape[2:]) > 1]


def cam_layer(graph: Any, values: dict, layer: str | None, ndim: int) -> str:
    """The node whose output Grad-CAM weighs: ``layer`` as a node name, else the last node of the module
    path ``layer`` (its output), else (``auto`` or None) the last feature map (:func:`feature_maps`);
    ``values`` is a forward pass's {node: value}, ``ndim`` the input's number of axes."""
    if ndim < 3:
        raise AttributionError(f"Grad-CAM needs inputs with spatial axes (B, C, H, ...), got {ndim}-D inputs")
    maps = feature_maps(graph, values, ndim)
    if layer in (None, "auto"):
        if not maps:
            raise AttributionError("Grad-CAM found no channels-first feature map (B, C, *spatial) with more than one "
                                   "position in the model; pass layer= with a node or module name")
        return maps[-1]
    layers = graph.layers
    if layer in graph.by_name and layer in layers:
        chosen = layer
    else:
        inside = [n for n in layers if graph.by_name[n].path == layer or graph.by_name[n].path.startswith(layer + ".")]
        if not inside:
            paths = sorted({graph.by_name[n].path for n in layers if graph.by_name[n].path})
            raise AttributionError(f"Grad-CAM layer {layer!r} is neither a node nor a module of the model; "
                                   f"modules: {', '.join(paths[:40])}{' ...' if len(paths) > 40 else ''}")
        chosen = inside[-1]
    if chosen not in maps:
        value = values.get(chosen)
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else None
        raise AttributionError(f"Grad-CAM layer {layer!r} (node {chosen!r}, output shape {shape}) is not a "
                               "channels-first feature map (B, C, *spatial) with more than one position; choose "
                               f"one of the last feature maps: {', '.join(maps[-5:]) or 'none'}")
    return chosen


def _minmax(maps: torch.Tensor) -> torch.Tensor:
    """Each map of (N, 1, *spatial) shifted and scaled to [0, 1] (a constant map to zeros)."""
    flat = maps.reshape(maps.shape[0], -1)
    low, high = flat.amin(1, keepdim=True), flat.amax(1, keepdim=True)
    span = torch.where(high > low, high - low, torch.ones_like(high))
    return ((flat - low) / span).reshape(maps.shape)


class GradCam(Engine):
    """Grad-CAM maps (K, B, ...) for K targets; ``guided``: Guided Grad-CAM (guided backprop x the map).
    See the module docstring for the conventions."""

    chunked = True

    def __init__(self, layer: str = "auto", relu: bool = True, upsample: str = "bilinear",
                 normalise: str = "none", guided: bool = False):
        if upsample not in UPSAMPLING:
            raise AttributionError(f"Grad-CAM upsample must be one of {', '.join(UPSAMPLING)}, got {upsample!r}")
        if normalise not in NORMALISATIONS:
            raise AttributionError(f"Grad-CAM normalise must be one of {', '.join(NORMALISATIONS)}, got {normalise!r}")
        self.layer, self.relu, self.upsample, self.normalise, self.guided = layer, relu, upsample, normalise, guided
        self._layers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # {graph: the node weighed}

    def layer_of(self, ex: Any, x: torch.Tensor) -> str:
        """The node this engine weighs on the explainer's model for inputs like ``x`` (B, ...)."""
        return self._locate(ex, x)[1]

    def _locate(self, ex: Any, x: torch.Tensor) -> tuple[Any, str]:
        """(the graph for inputs like ``x``, the node weighed in it), found once per traced graph, on one image."""
        graph = ex.graph if ex.graph is not None and ex.graph.accepts(x.shape) else None
        if graph is None or graph not in self._layers:
            gradient = ex.sibling("gradient")
            forward = gradient.forward_pass(x[:1], reference=False)
            graph = gradient.graph
            self._layers[graph] = cam_layer(graph, forward.values, self.layer, x.ndim)
        return graph, self._layers[graph]

    def conventions(self, ex: Any, x: torch.Tensor) -> dict:
        graph, node = self._locate(ex, x)
        return {"layer": node, "module": graph.by_name[node].path, "relu": self.relu or self.guided,
                "upsample": self.upsample, "normalise": self.normalise}

    def maps(self, ex, x, targets, envs=None, **kwargs):
        layer = self.layer_of(ex, x)
        gradient = ex.sibling("gradient")
        forward = gradient.forward_pass(x, reference=False)
        graph = gradient.graph
        logits = forward.values[graph.output]
        onehots = torch.stack([torch.zeros_like(logits).scatter_(1, ex.targets(logits, t)[:, None], 1.0)
                               for t in targets])
        with torch.no_grad():
            grads = forward.signals(graph.output, onehots, keep={layer})[layer]  # (K, B, C, *spatial)
            acts = forward.values[layer]
            spatial = tuple(range(3, grads.ndim))
            cam = (grads.mean(spatial, keepdim=True) * acts).sum(2, keepdim=True)  # (K, B, 1, *spatial)
            if self.relu or self.guided:
                cam = cam.clamp(min=0)
            k, b = cam.shape[:2]
            cam = cam.reshape(k * b, 1, *cam.shape[3:])
            if self.normalise == "before":
                cam = _minmax(cam)
            cam = F.interpolate(cam, size=x.shape[2:], mode=_mode(self.upsample, x.ndim - 2))
            if self.normalise == "after":
                cam = _minmax(cam)
            cam = cam.reshape(k, b, 1, *x.shape[2:])
        if self.guided:
            return ex.sibling("guided-backprop").maps_for_targets(x, targets) * cam
        return cam.expand(k, b, *x.shape[1:]).clone()


def _mode(upsample: str, axes: int) -> str:
    """torch's name of the ``upsample`` interpolation over ``axes`` spatial axes (bilinear in 2-D)."""
    if upsample == "nearest":
        return "nearest"
    linear = {1: "linear", 2: "bilinear", 3: "trilinear"}
    if axes not in linear:
        raise AttributionError(f"Grad-CAM cannot interpolate {upsample} over {axes} spatial axes; use upsample='nearest'")
    return linear[axes]
