"""ImageNet-shaped VGG-16 and ResNet-50 whose ``state_dict`` keys and shapes match torchvision's.

Defined here so torchvision is not a dependency; a user can still load torchvision weights with
``model.load_state_dict(weights)``. Initialisation follows torchvision's.
"""
from __future__ import annotations

import torch
from torch import nn

from audit.models.small import _vgg_features


class VGG16(nn.Module):
    """VGG-16 (configuration D, no BatchNorm). Input (B, C, H, W), H, W >= 32; output (B, num_classes)."""

    CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]

    def __init__(self, in_shape: tuple[int, int, int] = (3, 224, 224), num_classes: int = 1000,
                 dropout: float = 0.5):
        super().__init__()
        self.features = _vgg_features(self.CFG, in_shape[0], batch_norm=False)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                assert m.bias is not None  # _vgg_features builds its convs with a bias
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        result: torch.Tensor = self.classifier(torch.flatten(x, 1))
        return result


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (strided, as torchvision's v1.5) -> 1x1 with expansion 4 and a projection shortcut."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_planes != out:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out = out + identity
        result: torch.Tensor = self.relu(out)
        return result


class ResNet50(nn.Module):
    """ResNet-50. Input (B, C, H, W), H, W >= 32; output (B, num_classes)."""

    # set with setattr in __init__; declared so the type checker knows them
    layer1: nn.Sequential
    layer2: nn.Sequential
    layer3: nn.Sequential
    layer4: nn.Sequential

    def __init__(self, in_shape: tuple[int, int, int] = (3, 224, 224), num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(in_shape[0], 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        in_planes = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
            layer = []
            for j in range(blocks):
                layer.append(Bottleneck(in_planes, planes, 2 if (i and not j) else 1))
                in_planes = planes * Bottleneck.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        result: torch.Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return result
