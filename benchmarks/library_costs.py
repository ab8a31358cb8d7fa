"""What the methods cost on the model libraries' ImageNet models, against a plain autograd input gradient
of the same batch, measured side by side in one run on this machine's CPU (random weights, float32,
224 x 224):

* time: the median over interleaved rounds of each method's ``attribute`` over the plain gradient, on
  timm's ``vit_base_patch16_224`` and ``convnext_tiny`` (targets: gradient <= 1.15x, LRP-epsilon and
  DeepLIFT <= 1.5x); the capture (``torch.export``, paid once per model and input size) separately.
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

import torch

from audit.run.resources import keep_freed_memory
from benchmarks.architectures import plain_gradient
from benchmarks.timing import median_times, table

TIME_MODELS = ("vit_base_patch16_224", "convnext_tiny")
MEMORY_MODELS = ("convmixer_768_32", "vit_base_patch16_224")
METHODS = ("gradient", "guided-backprop", "deeplift", "lrp-epsilon", "lrp-zplus", "lrp-epsilon-plus")
TARGETS = {"gradient": 1.15, "lrp-epsilon": 1.5, "deeplift": 1.5}
MEMORY_TARGET = 2.0

_PEAK = """
import ctypes, gc, sys, torch, timm
from attributions import Explainer

def status(key):  # kB, from /proc/self/status
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":"))

torch.manual_seed(0)
model = timm.create_model({name!r}, num_classes=1000).eval()
for p in model.parameters():
    p.requires_grad_(False)
x = torch.rand({batch}, 3, 224, 224, generator=torch.Generator().manual_seed(1))
method = {method!r}
if method == "plain gradient":
    def run(t):
        t = t.clone().requires_grad_()
        return torch.autograd.grad(model(t)[:, 0].sum(), t)[0]
else:
    explainer = Explainer(model, method)
    run = lambda t: explainer.attribute(t, target=0)
run(x[:1])  # the capture and one image, so that what is measured is the batch's own
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory back to the system: the baseline is what is in use
base = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) from here
run(x)
print(base, status("VmHWM"))
"""


def _model(name: str) -> torch.nn.Module:
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=1000).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def time_ratios(name: str, batch: int, rounds: int) -> tuple[list[tuple], float]:
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
    candidates = {"plain gradient": lambda: plain_gradient(model, x, target)}
    candidates |= {m: (lambda e=e: e.attribute(x, target=target)) for m, e in explainers.items()}
    t = median_times(candidates, rounds=rounds)
    rows = [(m, f"{t[m]:.2f}", f"{t[m] / t['plain gradient']:.2f}x",
             f"<= {TARGETS[m]:.2f}x" if m in TARGETS else "") for m in candidates]
    return rows, capture


def peak_mb(name: str, method: str, batch: int) -> float:
    """The resident MB a batch adds to a process that holds the model and its capture."""
    # a fixed mmap threshold: glibc's moving one would serve freed large blocks from the heap, where
    # fragmentation, not the tensors alive, sets the resident size (runs of one method 10 % apart)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}
    out = subprocess.run([sys.executable, "-c", _PEAK.format(name=name, batch=batch, method=method)], check=True,
                         capture_output=True, text=True, env=env)
    base, peak = (int(v) for v in out.stdout.split()[-2:])
    return max(peak - base, 0) / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="images per call (time)")
    parser.add_argument("--memory-batch", type=int, default=4, help="images per call (memory)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--system-malloc", action="store_true", help="time with glibc's default allocator settings")
    args = parser.parse_args(argv)
    kept = False if args.system_malloc else keep_freed_memory()
    print(f"timm models on the CPU ({torch.get_num_threads()} threads), 224 x 224, random weights, float32; "
          f"times with {'freed memory kept for reuse, as the command line runs' if kept else 'glibc defaults'}")
    if not args.skip_time:
        for name in TIME_MODELS:
            rows, capture = time_ratios(name, args.batch, args.rounds)
            print(f"\n{name}, batch {args.batch}, median of {args.rounds} interleaved rounds "
                  f"(capture: {capture:.1f} s, once)\n")
            print(table(rows, ("method", "seconds", "time / plain gradient", "target")))
    if not args.skip_memory:
        for name in MEMORY_MODELS:
            base = peak_mb(name, "plain gradient", args.memory_batch)
            rows = [("plain gradient", f"{base:.0f}", "1.00x", "")]
            for method in METHODS:
                mb = peak_mb(name, method, args.memory_batch)
                rows.append((method, f"{mb:.0f}", f"{mb / base:.2f}x", f"<= {MEMORY_TARGET:.1f}x"))
            print(f"\n{name}, batch {args.memory_batch}: resident memory the batch adds (peak, a process each)\n")
            print(table(rows, ("method", "MB", "over the plain gradient", "target")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
