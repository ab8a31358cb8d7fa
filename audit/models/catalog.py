"""The models in words, without torch (the command line lists them at once): the zoo's architectures and the
shipped checkpoints with their metadata."""
from __future__ import annotations

import json
from importlib import resources
from typing import Any

SHIPPED = resources.files("audit.models").joinpath("checkpoints")

# what each architecture of the zoo (audit.models.zoo.ARCHS) is
ARCHITECTURES: dict[str, str] = {
    "cnn": "Sixt et al. small CNN: 4 conv + 2 dense, max-pooling",
    "vgg": "VGG-11 style, 8 conv + 3 dense; batch_norm=True adds BatchNorm",
    "resnet": "ResNet-20: 3x3 basic blocks with BatchNorm and residual adds",
    "vit": "ViT: 4x4 patches, class token, 4 pre-LN blocks of multi-head attention, dim 64",
    "vgg16": "VGG-16, torchvision state_dict layout",
    "resnet50": "ResNet-50, torchvision state_dict layout",
}


def available_checkpoints() -> dict[str, dict[str, Any]]:
    """Shipped checkpoint names -> their metadata."""
    out: dict[str, dict[str, Any]] = {}
    if not SHIPPED.is_dir():
        return out
    for entry in sorted(SHIPPED.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            out[entry.name[:-5]] = json.loads(entry.read_text())
    return out
