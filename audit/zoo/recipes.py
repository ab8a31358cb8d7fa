"""How the shipped checkpoints are trained: one recipe per name, retrained by `make checkpoints`.

Baseline and Bort twins share every setting but the optimizer, so their comparison isolates
Bort. Bort uses the reference settings (gamma 0.05, c = 1, l1-full-row); the learning rate,
batch size and epochs are scaled to what 2 CPU cores train in about an hour for all seven.
"""
from __future__ import annotations

from audit.train import TrainConfig

_COMMON = dict(data="fashion-mnist", batch_size=128, lr=0.02, momentum=0.9, weight_decay=5e-4, seed=0,
               schedule="cosine")
_EPOCHS = {"cnn": 15, "vgg": 15, "resnet": 6}

RECIPES: dict[str, TrainConfig] = {}
for _arch in ("cnn", "vgg", "resnet"):
    RECIPES[f"{_arch}-sgd"] = TrainConfig(arch=_arch, optimizer="sgd", epochs=_EPOCHS[_arch], **_COMMON)
    RECIPES[f"{_arch}-bort"] = TrainConfig(arch=_arch, optimizer="bort", epochs=_EPOCHS[_arch], **_COMMON)
RECIPES["cnn-dbort"] = TrainConfig(arch="cnn", optimizer="bort", dbort=True, epochs=_EPOCHS["cnn"], **_COMMON)
