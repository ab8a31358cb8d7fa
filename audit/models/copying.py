"""Copies of a user's model that every check can modify: ``copy.deepcopy`` that works on models caching tensors.

Some library models cache tensors computed from their parameters on themselves during a forward pass (timm's
EfficientFormer and EfficientViT-M, Hugging Face's LeViT keep an attention-bias cache in eval mode).
``copy.deepcopy`` refuses such tensors (they are not graph leaves), and a copied cache would be stale as soon
as the copy's parameters are re-initialised. :func:`copy_model` gives the copy an empty cache instead (the
model rebuilds it from the copy's own parameters) and a detached copy of any other cached non-leaf tensor.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from attributions import capture_cache


def _cached(value: Any) -> bool:
    """Whether ``value`` holds a tensor that is no graph leaf (directly or in a dict / list / tuple)."""
    if isinstance(value, torch.Tensor):
        return not value.is_leaf
    if isinstance(value, dict):
        return any(_cached(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_cached(v) for v in value)
    return False


def copy_model(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` (never modified); caches of non-leaf tensors on its modules start empty in the copy
    (a dict or list attribute) or as a detached clone (a bare tensor attribute)."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        for value in vars(module).values():
            if not _cached(value):
                continue
            if isinstance(value, torch.Tensor):
                memo[id(value)] = value.detach().clone()
            else:  # a cache: the copy recomputes it from its own parameters
                memo[id(value)] = type(value)()
    twin: nn.Module = copy.deepcopy(model, memo)
    capture_cache.share(model, twin)  # same structure: the model's captures serve the copy
    return twin
