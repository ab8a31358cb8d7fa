"""Engine cost on the architectures people audit: each method's time over one plain autograd input
gradient, side by side in one run (VGG-16 and ResNet-50 at 224x224, batch 4; the small ViT at
28x28, batch 32). Targets: gradient and guided-backprop <= 1.10x, deeplift <= 1.30x,
lrp-epsilon-plus <= 1.70x, lrp-alpha2beta1 <= 2.30x; the ViT's gradient <= 1.20x."""
from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from attributions import Explainer
from audit.models import build
from benchmarks.timing import median_times, table

TARGETS = {"gradient": 1.10, "guided-backprop": 1.10, "deeplift": 1.30, "lrp-epsilon-plus": 1.70,
           "lrp-alpha2beta1": 2.30}
VIT_TARGETS = {"gradient": 1.20}


def plain_gradient(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    xg = x.clone().requires_grad_()
    out = model(xg).gather(1, target[:, None]).sum()
    return torch.autograd.grad(out, xg)[0]


def _ratios(model: nn.Module, x: torch.Tensor, targets: dict[str, float], rounds: int) -> list[tuple[str, str, str]]:
    for p in model.parameters():
        p.requires_grad_(False)
    target = torch.randint(0, 10, (x.shape[0],), generator=torch.Generator().manual_seed(0))
    explainers = {m: Explainer(model, m) for m in targets}
    candidates: dict[str, Callable[[], object]] = {"plain gradient": lambda: plain_gradient(model, x, target)}
    # mypy cannot infer a lambda's defaults
    candidates |= {m: cast(Callable[[], torch.Tensor], lambda e=e: e.attribute(x, target=target)) for m, e in explainers.items()}
    t = median_times(candidates, rounds=rounds)
    return [(m, f"{t[m] / t['plain gradient']:.2f}x", f"<= {goal:.2f}x") for m, goal in targets.items()] + [
        ("(plain gradient)", f"{t['plain gradient'] * 1000:.0f} ms", "")]


def run(rounds: int = 5) -> str:
    torch.manual_seed(0)
    out = []
    for arch in ("vgg16", "resnet50"):
        model = build(arch, (3, 224, 224), 10).eval()
        out.append(f"{arch}, 224x224, batch 4\n\n" + table(_ratios(model, torch.rand(4, 3, 224, 224), TARGETS, rounds),
                                                            ("method", "time / plain gradient", "target")))
    vit = build("vit").eval()
    out.append("small ViT, 28x28, batch 32\n\n" + table(_ratios(vit, torch.rand(32, 1, 28, 28), VIT_TARGETS, rounds),
                                                         ("method", "time / plain gradient", "target")))
    return f"Engine cost by architecture, CPU ({torch.get_num_threads()} threads)\n\n" + "\n\n".join(out)


if __name__ == "__main__":
    print(run())
