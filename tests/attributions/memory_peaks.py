"""The memory each method adds to the process, with and without a budget: run by ``test_memory.py`` in a fresh
process (``MALLOC_MMAP_THRESHOLD_`` fixed, so that freed tensors leave the resident set and each method's peak is
its own). Prints one JSON line per method: the resident-memory peak (Linux's VmHWM, reset before the call, less
the resident memory then, in MiB) it added on IMAGES images under the budget, without one, and on one image
without one (what a pass that cannot be split costs).

Usage: python memory_peaks.py BUDGET_MIB IMAGES
"""
import json
import sys
import warnings
from pathlib import Path

import torch

from attributions import Explainer, available_methods, memory
from audit.models import build

SMALL = {"smoothgrad": {"samples": 16}, "smoothgrad-ig": {"samples": 4, "n_steps": 8},
         "integrated-gradients": {"n_steps": 32}}  # fewer passes than the defaults: the same batching, faster


def resident() -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def added(ex: Explainer, x: torch.Tensor, nbytes: int | None) -> float:
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from the resident memory now
    before, _ = resident()
    with memory.limit(nbytes):
        ex.attribute(x, target=1)
    return (resident()[1] - before) / 2**20


if __name__ == "__main__":
    warnings.simplefilter("ignore")  # PatternNet's on one image: what is measured here is memory
    budget, images = int(sys.argv[1]) * 2**20, int(sys.argv[2])
    torch.manual_seed(0)
    cnn, vit = build("vgg", (3, 64, 64), 10).eval(), build("vit", (3, 64, 64), 10).eval()
    x = torch.rand(images, 3, 64, 64)
    for name in available_methods():
        model = vit if "attention" in name or name in ("vit-grad-cam", "transformer-attribution") else cnn
        ex = Explainer(model, name, **SMALL.get(name, {}))
        # what a first call makes once (the captures at each chunk's batch size, the kernels, the patterns, the
        # passes' plans) is made before measuring: the budget is for the passes
        added(ex, x, budget)
        added(ex, x[:2], None)
        print(json.dumps({"method": name, "budget": added(ex, x, budget), "none": added(ex, x, None),
                          "one_image": added(ex, x[:1], None)}), flush=True)
