"""Model zoo: ``build(name)`` for the architectures we audit."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from attributions.errors import unknown_name
from audit.errors import ModelError
from audit.models.catalog import ARCHITECTURES
from audit.models.imagenet import VGG16, ResNet50
from audit.models.small import SmallCNN, SmallResNet, SmallVGG
from audit.models.vit import SmallViT


@dataclass(frozen=True)
class Arch:
    """An architecture: its constructor, the smallest spatial input it accepts, and a description."""

    factory: Callable[..., nn.Module]
    min_size: int
    description: str


ARCHS: dict[str, Arch] = {name: Arch(factory, min_size, ARCHITECTURES[name]) for name, (factory, min_size) in {
    "cnn": (SmallCNN, 8), "vgg": (SmallVGG, 8), "resnet": (SmallResNet, 4), "vit": (SmallViT, 4), "vgg16": (VGG16, 32),
    "resnet50": (ResNet50, 32)}.items()}


def build(name: str, in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10, **options: Any) -> nn.Module:
    """Build an untrained model of the zoo.

    Parameters
    ----------
    name : str
        One of ``ARCHS``: cnn, vgg, resnet, vgg16, resnet50.
    in_shape : (C, H, W)
        Shape of one input image.
    num_classes : int
        Number of logits.
    **options
        Architecture options, e.g. ``batch_norm=True`` for ``vgg``.

    Returns
    -------
    nn.Module mapping (B, C, H, W) to (B, num_classes).
    """
    arch = ARCHS.get(name)
    if arch is None:
        raise unknown_name("architecture", name, ARCHS, ModelError)
    try:
        shape = tuple(int(s) for s in in_shape)
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != 3 or min(shape) < 1 or shape != tuple(in_shape):
        raise ModelError(f"in_shape must be (channels, height, width) of positive ints, got {in_shape!r}")
    if min(shape[1:]) < arch.min_size:
        raise ModelError(f"architecture {name!r} needs images of at least {arch.min_size}x{arch.min_size}, "
                         f"got in_shape {shape}; resize the data or pick a smaller architecture")
    if int(num_classes) < 1:
        raise ModelError(f"num_classes must be >= 1, got {num_classes}")
    accepted = set(inspect.signature(arch.factory).parameters) - {"in_shape", "num_classes"}
    bad = set(options) - accepted
    if bad:
        raise ModelError(f"architecture {name!r} has no option {', '.join(sorted(bad))}; "
                         f"options: {', '.join(sorted(accepted)) or 'none'}")
    return arch.factory(in_shape=shape, num_classes=int(num_classes), **options)
