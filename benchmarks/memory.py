"""ImageNet-size models: maps per second, K-vector propagation against a plain batched gradient,
and peak memory of a CSC pass with K = 8 with and without a memory budget.

Measured side by side in one run on this machine's CPU (zoo VGG-16 and ResNet-50 at 224 x 224,
random weights):
* maps per second of each method at batch 8 and its time over one plain autograd input gradient;
* ``propagate`` with K = 8 vectors for one image (every node's signal recorded) over one plain
  gradient of a batch of 8 (the same number of backward signals); target <= 1.0x;
* peak resident memory (the child process's ru_maxrss) of CSC on VGG-16 with K = 8 over
  ``IMAGES`` images without a budget and under 4 GB and 2 GB, and over twice as many under the
  runner's default budget (half of the free RAM), with their times.
"""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import cast

import torch

from attributions import Explainer
from audit.models import build
from audit.run.resources import budget_bytes
from benchmarks.architectures import plain_gradient
from benchmarks.timing import median_times, table

METHODS = ["gradient", "guided-backprop", "deeplift", "lrp-epsilon-plus", "lrp-zplus", "lrp-alpha2beta1"]
IMAGES = 4

_CSC = """
import resource, sys, time, torch
from attributions import memory
from audit.checks.convergence import chain_convergence
from audit.models import build
torch.manual_seed(0)
model = build("vgg16", (3, 224, 224), 1000).eval()
x = torch.rand({images}, 3, 224, 224)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
with memory.limit({budget}):
    chain_convergence(model, x, methods=["lrp-zplus"], n_vectors=5, spectrum_vectors=8, progress=False)
print(time.perf_counter() - start, base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build(arch, (3, 224, 224), 1000).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def maps_per_second(arch: str, batch: int = 8, rounds: int = 3) -> list[tuple[str, str, str]]:
    """(method, maps per second, time over the plain gradient) at 224 x 224."""
    model = _model(arch)
    x = torch.rand(batch, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 1000, (batch,), generator=torch.Generator().manual_seed(2))
    explainers = {m: Explainer(model, m) for m in METHODS}
    candidates: dict[str, Callable[[], object]] = {"plain gradient": lambda: plain_gradient(model, x, target)}
    # mypy cannot infer a lambda's defaults
    candidates |= {m: cast(Callable[[], torch.Tensor], lambda e=e: e.attribute(x, target=target)) for m, e in explainers.items()}
    t = median_times(candidates, rounds=rounds)
    return [(m, f"{batch / t[m]:.2f}", f"{t[m] / t['plain gradient']:.2f}x") for m in candidates]


def propagate_ratio(arch: str, k: int = 8, rounds: int = 3) -> tuple[float, float]:
    """(time of propagate with K vectors for one image / time of a plain gradient of K images, the
    same for the LRP-z+ chain)."""
    model = _model(arch)
    x = torch.rand(k, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    target = torch.zeros(k, dtype=torch.long)
    one = x[:1]
    vectors = torch.randn(k, 1, 1000, generator=torch.Generator().manual_seed(4))
    grad, zplus = Explainer(model, "gradient"), Explainer(model, "lrp-zplus")
    top = grad.layers[-1]
    t = median_times({"plain gradient of K images": lambda: plain_gradient(model, x, target),
                      "propagate gradient": lambda: grad.propagate(one, top, vectors),
                      "propagate lrp-zplus": lambda: zplus.propagate(one, top, vectors)}, rounds=rounds)
    base = t["plain gradient of K images"]
    return t["propagate gradient"] / base, t["propagate lrp-zplus"] / base


def csc_peak(budget: int | None, images: int = IMAGES) -> tuple[float, float, float]:
    """(seconds, resident MB before the pass, peak resident MB) of CSC with K = 8 on VGG-16 224 in a
    fresh process."""
    out = subprocess.run([sys.executable, "-c", _CSC.format(images=images, budget=budget)], check=True,
                         capture_output=True, text=True)
    seconds, base, peak = out.stdout.split()
    return float(seconds), int(base) / 1024, int(peak) / 1024


def run() -> str:
    lines = [f"ImageNet-size models on the CPU ({torch.get_num_threads()} threads), 224 x 224, random weights"]
    for arch in ("vgg16", "resnet50"):
        lines += ["", f"{arch}, batch 8", "", table(maps_per_second(arch), ("method", "maps / s", "time / plain gradient"))]
    rows = []
    for arch in ("vgg16", "resnet50"):
        g, z = propagate_ratio(arch)
        rows.append((arch, f"{g:.2f}x", f"{z:.2f}x", "<= 1.00x"))
    lines += ["", "propagate K = 8 vectors for 1 image (every node's signal kept) / plain gradient of 8 images", "",
              table(rows, ("model", "gradient chain", "lrp-zplus chain", "target"))]
    peaks = []
    default = budget_bytes(None, torch.device("cpu"))
    for label, images, budget in (("none", IMAGES, None), ("4 GB", IMAGES, 4 * 2**30), ("2 GB", IMAGES, 2 * 2**30),
                                  (f"default (half of free RAM: {default / 2**30:.1f} GB)", 2 * IMAGES, default)):
        seconds, base, peak = csc_peak(budget, images)
        peaks.append((label, images, f"{peak / 1024:.2f}", f"{(peak - base) / 1024:.2f}", f"{seconds:.0f}"))
    lines += ["", "CSC (lrp-zplus, K = 8, 3 injection layers) on VGG-16 224: peak resident memory of the process",
              "", table(peaks, ("--max-memory", "images", "peak GB", "peak - model loaded GB", "seconds"))]
    return "\n".join(lines)


if __name__ == "__main__":
    t0 = time.perf_counter()
    print(run())
    print(f"\n({time.perf_counter() - t0:.0f} s)")
