"""What the methods cost on the model libraries' ImageNet models, against a plain autograd input gradient
of the same batch, measured side by side in one run on this machine's CPU (random weights, float32,
224 x 224):

* time: each method's ``attribute`` over the plain gradient in the same round, the median over interleaved
  rounds, on timm's ``vit_base_patch16_224`` and ``convnext_tiny`` (targets: gradient <= 1.15x, LRP-epsilon
  and DeepLIFT <= 1.5x, the z+ family <= 1.7x; the floor of z+ on inputs of both signs, four passes of each
  linear layer where the plain gradient takes two, is 2.0x); the capture (``torch.export``, paid once per
  model and input size) separately.
  With the command line's allocator setting (:func:`audit.run.resources.keep_freed_memory`: freed
  blocks reused, not faulted in again), or glibc's defaults with ``--system-malloc``;
* memory: the peak resident memory a batch adds, each method in a fresh process, on
  ``convmixer_768_32`` and ``vit_base_patch16_224`` (target: <= 2x the plain gradient's). A process first
  builds the model and captures it on one image, then trims its heap; the peak (Linux's VmHWM, reset
  through /proc/self/clear_refs) over the resident memory at that point is the batch's own.

Needs timm: ``.venv-libraries/bin/python -m benchmarks.library_costs [--batch N] [--rounds N]``
(``make test`` builds that venv).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import cast

import torch

from audit.run.resources import keep_freed_memory
from benchmarks.architectures import plain_gradient
from benchmarks.timing import paired_times, table

TIME_MODELS = ("vit_base_patch16_224", "convnext_tiny")
MEMORY_MODELS = ("convmixer_768_32", "vit_base_patch16_224")
METHODS = ("gradient", "guided-backprop", "deeplift", "lrp-epsilon", "lrp-zplus", "lrp-epsilon-plus")
TARGETS = {"gradient": 1.15, "lrp-epsilon": 1.5, "deeplift": 1.5, "lrp-zplus": 1.7, "lrp-epsilon-plus": 1.7}
FLOORS = {"lrp-zplus": "2.0x (inputs of both signs)"}
MEMORY_TARGET = 2.0

_PEAK = """
import ctypes, gc, torch

def status(key):  # kB, from /proc/self/status
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":"))

{setup}
x = torch.rand({batch}, 3, 224, 224, generator=torch.Generator().manual_seed(1))
run(x[:1])  # the capture and one image, so that what is measured is the batch's own
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory back to the system: the baseline is what is in use
base = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) from here
run(x)
print(base, status("VmHWM"))
"""

_TIMM = """
import timm
from attributions import Explainer

torch.manual_seed(0)
model = timm.create_model({name!r}, num_classes=1000).eval()
for p in model.parameters():
    p.requires_grad_(False)
method = {method!r}
if method == "plain gradient":
    def run(t):
        t = t.clone().requires_grad_()
        return torch.autograd.grad(model(t)[:, 0].sum(), t)[0]
else:
    explainer = Explainer(model, method)
    run = lambda t: explainer.attribute(t, target=0)
"""


def _model(name: str) -> torch.nn.Module:
    import timm

    torch.manual_seed(0)
    model: torch.nn.Module = timm.create_model(name, num_classes=1000).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def time_ratios(name: str, batch: int, rounds: int) -> tuple[list[tuple[str, ...]], float]:
    """(method, seconds, time over the plain gradient, target) rows and the capture's seconds."""
    from attributions import Explainer
    from attributions.graph import trace

    model = _model(name)
    x = torch.rand(batch, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 1000, (batch,), generator=torch.Generator().manual_seed(2))
    start = time.perf_counter()
    graph = trace(model, x)
    capture = time.perf_counter() - start
    explainers = {m: Explainer(model, m, graph=graph) for m in METHODS}
    candidates: dict[str, Callable[[], object]] = {"plain gradient": lambda: plain_gradient(model, x, target)}
    # mypy cannot infer a lambda's defaults
    candidates |= {m: cast(Callable[[], torch.Tensor], lambda e=e: e.attribute(x, target=target)) for m, e in explainers.items()}
    ratio, seconds = paired_times(candidates, "plain gradient", rounds=rounds)
    rows: list[tuple[str, ...]] = [(m, f"{seconds[m]:.2f}", f"{ratio[m]:.2f}x", FLOORS.get(m, ""),
                                    f"<= {TARGETS[m]:.2f}x" if m in TARGETS else "") for m in candidates]
    return rows, capture


def batch_peak_mb(setup: str, batch: int) -> float:
    """The resident MB a batch of ``batch`` random 224 x 224 images adds to a fresh process that ran
    ``setup`` (Python code, torch imported, that defines ``run(x)``) and ``run`` on one image first."""
    # a fixed mmap threshold: glibc's moving one would serve freed large blocks from the heap, where
    # fragmentation, not the tensors alive, sets the resident size (runs of one method 10 % apart)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}
    out = subprocess.run([sys.executable, "-c", _PEAK.format(setup=setup, batch=batch)], check=True,
                         capture_output=True, text=True, env=env)
    base, peak = (int(v) for v in out.stdout.split()[-2:])
    return max(peak - base, 0) / 1024


def peak_mb(name: str, method: str, batch: int) -> float:
    """The resident MB a batch adds to a process that holds the timm model ``name`` and its capture."""
    return batch_peak_mb(_TIMM.format(name=name, method=method), batch)


def run(batch: int = 4, memory_batch: int = 4, rounds: int = 5, measure_time: bool = True, measure_memory: bool = True,
        system_malloc: bool = False) -> str:
    """The time and memory tables (Markdown)."""
    kept = False if system_malloc else keep_freed_memory()
    out = [f"timm models on the CPU ({torch.get_num_threads()} threads), 224 x 224, random weights, float32; times "
           f"with {'freed memory kept for reuse, as the command line runs' if kept else 'glibc defaults'}"]
    for name in TIME_MODELS if measure_time else ():
        rows, capture = time_ratios(name, batch, rounds)
        out.append(f"{name}, batch {batch}, median of {rounds} interleaved rounds (capture: {capture:.1f} s, once)\n\n"
                   + table(rows, ("method", "seconds", "time / plain gradient", "floor", "target")))
    for name in MEMORY_MODELS if measure_memory else ():
        base = peak_mb(name, "plain gradient", memory_batch)
        rows = [("plain gradient", f"{base:.0f}", "1.00x", "")]
        for method in METHODS:
            mb = peak_mb(name, method, memory_batch)
            rows.append((method, f"{mb:.0f}", f"{mb / base:.2f}x", f"<= {MEMORY_TARGET:.1f}x"))
        out.append(f"{name}, batch {memory_batch}: resident memory the batch adds (peak, a process each)\n\n"
                   + table(rows, ("method", "MB", "over the plain gradient", "target")))
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="images per call (time)")
    parser.add_argument("--memory-batch", type=int, default=4, help="images per call (memory)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--system-malloc", action="store_true", help="time with glibc's default allocator settings")
    args = parser.parse_args(argv)
    print(run(args.batch, args.memory_batch, args.rounds, not args.skip_time, not args.skip_memory, args.system_malloc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
