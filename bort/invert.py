"""Bort's invertibility experiment: reconstruct a layer's input from its output by transposed weights.

For a conv layer y = W * x + b, each output position holds W p + b for the input patch p. With
bounded orthogonal rows, p is recovered (on W's row space) by sum_o w_o (y_o - b_o) / ||w_o||^2;
overlapping patches are folded back and averaged. ReLU and dropout are taken as the identity,
pooling is undone by nearest-neighbour upsampling, BatchNorm (eval) by its inverse affine map.
Orthogonal weights reconstruct well; unconstrained ones do not.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from skimage.metrics import structural_similarity
from torch import nn

from bort.errors import BortError

_IDENTITY = (nn.ReLU, nn.LeakyReLU, nn.Dropout, nn.Identity)
_POOLS = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)


def _chain(model: nn.Module, x: torch.Tensor, layer: str) -> list[tuple[str, nn.Module, torch.Tensor, torch.Tensor]]:
    """(name, module, input, output) of each leaf module run, in order, up to ``layer``; checks it is a chain."""
    names = dict(model.named_modules())
    if layer not in names:
        raise BortError(f"no module named {layer!r} in the model; modules: {', '.join(n for n in names if n)}")
    calls, handles = [], []
    for name, module in model.named_modules():
        if name and not list(module.children()):
            handles.append(module.register_forward_hook(
                lambda m, inp, out, name=name: calls.append((name, m, inp[0], out))))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    chain = []
    for call in calls:
        chain.append(call)
        if call[0] == layer:
            break
    previous = x
    for name, _, inp, out in chain:
        if inp is not previous and not (inp.shape == previous.shape and torch.equal(inp, previous)):
            raise BortError(f"reconstruct needs a plain chain of modules up to {layer!r}; the input of {name!r} "
                             "is not the previous module's output (branching or functional code in forward)")
        previous = out
    return chain


def _invert(module: nn.Module, y: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    if isinstance(module, nn.Conv2d):
        w = module.weight.reshape(module.out_channels, -1)
        if module.groups != 1:
            raise BortError("reconstruct supports ungrouped convolutions only")
        if isinstance(module.padding, str):  # F.fold needs the padding as numbers, not "same" / "valid"
            raise BortError(f"reconstruct supports numeric convolution padding only, got padding={module.padding!r}")
        b = module.bias if module.bias is not None else torch.zeros(module.out_channels)
        y = (y - b[:, None, None]) / w.pow(2).sum(1)[:, None, None]
        cols = torch.einsum("oi,bol->bil", w, y.flatten(2))
        spec: dict[str, Any] = dict(output_size=inp.shape[-2:], kernel_size=module.kernel_size, dilation=module.dilation,
                    padding=module.padding, stride=module.stride)
        k = module.kernel_size[0] * module.kernel_size[1]
        count = F.fold(torch.ones(1, k, cols.shape[-1], dtype=y.dtype), **spec)
        return F.fold(cols, **spec) / count.clamp_min(1)
    if isinstance(module, nn.Linear):
        b = module.bias if module.bias is not None else torch.zeros(module.out_features)
        return ((y - b) / module.weight.pow(2).sum(1)) @ module.weight
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        if module.running_mean is None or module.running_var is None:
            raise BortError("reconstruct needs BatchNorm running statistics (track_running_stats=True)")
        shape = (1, -1) + (1,) * (y.ndim - 2)
        scale = (module.running_var + module.eps).sqrt()
        if module.affine:  # without affine parameters BatchNorm only standardises
            scale = scale / module.weight
            y = y - module.bias.view(shape)
        return y * scale.view(shape) + module.running_mean.view(shape)
    if isinstance(module, _POOLS):
        return F.interpolate(y, size=inp.shape[-2:], mode="nearest")
    if isinstance(module, nn.Flatten):
        return y.reshape(inp.shape)
    if isinstance(module, _IDENTITY):
        return y
    raise BortError(f"reconstruct cannot invert a {type(module).__name__}; supported: Conv2d, Linear, BatchNorm, "
                     "pooling, Flatten, ReLU, Dropout, Identity")


def reconstruct(model: nn.Module, x: torch.Tensor, layer: str) -> torch.Tensor:
    """Reconstruct the input ``x`` (B, C, H, W) from the output of module ``layer``.

    Every module from the input up to ``layer`` is inverted in turn (see the module docstring).
    The model is not changed when in eval mode (see ``model``). Returns a tensor shaped like ``x``.

    Parameters
    ----------
    model : nn.Module
        Run once on ``x`` as it is (put it in eval mode first: in training mode the pass updates
        BatchNorm's running statistics and applies dropout), with forward hooks on its leaf modules that
        are removed afterwards. Its leaf modules up to ``layer`` must form a plain chain, each reading the
        previous one's output, of Conv2d (ungrouped, numeric padding), Linear, BatchNorm, pooling, Flatten,
        ReLU, LeakyReLU, Dropout and Identity.
    x : Tensor
        (B, C, H, W) inputs.
    layer : str
        The name (as ``model.named_modules()`` gives it) of the leaf module whose output is inverted. A
        module with submodules is never matched: the chain then runs through every leaf module to the
        model's output.

    Returns
    -------
    Tensor
        (B, C, H, W) the reconstruction.

    Raises
    ------
    BortError
        For an unknown ``layer``, a model that is not a chain up to it, or a module that cannot be inverted.
    """
    with torch.no_grad():
        chain = _chain(model, x, layer)
        y = chain[-1][3]
        for _, module, inp, _ in reversed(chain):
            y = _invert(module, y, inp)
    return y


def reconstruction_quality(model: nn.Module, x: torch.Tensor, layer: str) -> pd.DataFrame:
    """SSIM between each image and its reconstruction from ``layer`` (min-max scaled to [0, 1]).

    Returns a DataFrame with columns image, layer, ssim (scikit-image, data_range 1).

    Parameters
    ----------
    model, layer
        As :func:`reconstruct`.
    x : Tensor
        (B, C, H, W) images in [0, 1], compared as they are; only the reconstruction is min-max scaled.
        scikit-image's default 7 x 7 window needs H, W >= 7.

    Returns
    -------
    pandas.DataFrame
        One row per image: image (its index), layer, ssim (over the channels, ``channel_axis=0``).
    """
    rec = reconstruct(model, x, layer)
    rows = []
    for i in range(len(x)):
        a = x[i].double().numpy()
        r = rec[i].double().numpy()
        r = (r - r.min()) / max(r.max() - r.min(), 1e-12)
        rows.append({"image": i, "layer": layer,
                     "ssim": float(structural_similarity(a, r, data_range=1.0, channel_axis=0))})  # type: ignore[no-untyped-call]
    return pd.DataFrame(rows)
