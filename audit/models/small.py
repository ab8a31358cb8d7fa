"""Small architectures for 28x28 / 32x32 data, trainable on a CPU.

Channel widths keep conv and linear weights *wide* (out <= in * k * k) wherever the input allows,
so Bort can make their rows orthogonal; the first 3x3 conv on a 1-channel input and the 1x1
residual projections are necessarily tall (Bort then constrains their columns).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


def init_orthogonal(module: nn.Module) -> None:
    """Orthogonal weights (ReLU gain sqrt 2) and zero biases for every conv / linear layer.

    Measured here: with PyTorch's default init the small CNN reaches 47 % test accuracy after one
    SGD epoch on 5,000 Fashion-MNIST images; with this init 75-79 % over four seeds.
    """
    for m in module.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(m.weight.view(m.weight.shape[0], -1), gain=2 ** 0.5)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class SmallCNN(nn.Module):
    """The small net of Sixt et al. (2020): 4 conv + 2 dense layers, ReLU, max-pooling.

    Input (B, C, H, W) with H, W >= 8; output (B, num_classes) logits.
    """

    def __init__(self, in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10):
        super().__init__()
        c, h, w = in_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(64 * (h // 8) * (w // 8), 128), nn.ReLU(), nn.Linear(128, num_classes),
        )
        init_orthogonal(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.classifier(self.flatten(self.features(x)))
        return result


def _vgg_features(cfg: list[Any], in_channels: int, batch_norm: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
            continue
        layers.append(nn.Conv2d(in_channels, v, 3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(v))
        layers.append(nn.ReLU(inplace=True))
        in_channels = v
    return nn.Sequential(*layers)


class SmallVGG(nn.Module):
    """VGG-11 layout (8 conv in 5 blocks + 3 dense) scaled to 28x28 inputs; optional BatchNorm.

    Three max-pools instead of five keep the last block's 3x3 convolutions on a 3x3 map.
    Input (B, C, H, W) with H, W >= 8; output (B, num_classes).
    """

    CFG = [16, "M", 32, "M", 64, 64, "M", 64, 64, 64, 64]

    def __init__(self, in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10,
                 batch_norm: bool = False, dropout: float = 0.3):
        super().__init__()
        c, h, w = in_shape
        self.features = _vgg_features(self.CFG, c, batch_norm)
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(64 * (h // 8) * (w // 8), 128), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(128, 128), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(128, num_classes),
        )
        init_orthogonal(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.classifier(self.flatten(self.features(x)))
        return result


class BasicBlock(nn.Module):
    """Two 3x3 convs with BatchNorm and an identity (or 1x1-projection) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out + identity
        result: torch.Tensor = self.relu2(out)
        return result


class SmallResNet(nn.Module):
    """ResNet-20 (He et al. 2016, CIFAR variant): 3 stages x 3 basic blocks, 16/32/64 channels.

    Input (B, C, H, W) with H, W >= 4; output (B, num_classes).
    """

    def __init__(self, in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10,
                 blocks: int = 3, width: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(in_shape[0], width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        stages, planes = [], width
        for i, mult in enumerate((1, 2, 4)):
            out = width * mult
            stages.append(nn.Sequential(*[BasicBlock(planes if j == 0 else out, out, 2 if (i and not j) else 1)
                                          for j in range(blocks)]))
            planes = out
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        result: torch.Tensor = self.fc(self.flatten(self.avgpool(x)))
        return result
