"""Engine cost: each method's time over one plain input gradient, and captum's over ours.

VGG-style net on 32x32 RGB inputs, batch 64, CPU. Floors (the convolutions a rule cannot avoid,
in units of one forward + input-backward): gradient-like, epsilon, DeepLIFT 1.0x; z+ 1.5x;
alpha-beta 2.0x. ``propagate`` with K = 5 is compared with one plain gradient of a 5x batch. Each
candidate's time over the plain gradient's in the same round, the median over rounds; the process keeps
freed memory for reuse as the command line does (:func:`audit.run.resources.keep_freed_memory`; glibc's
defaults fault a freed forward pass's pages in again on the next call, which costs every candidate alike
and moved DeepLIFT's ratio from 1.31x to 1.52x on this 2-core machine).
"""
from __future__ import annotations

import torch
from captum.attr import DeepLift, GuidedBackprop

from attributions import Explainer
from audit.models import build
from audit.run.resources import keep_freed_memory
from benchmarks.timing import paired_times, table

METHODS = {"gradient": 1.0, "guided-backprop": 1.0, "lrp-epsilon": 1.0, "deeplift": 1.0, "deeplift-ablation": 1.0,
           "lrp-zplus": 1.5, "lrp-epsilon-plus": 1.5, "lrp-alpha2beta1": 2.0}
TARGETS = {"gradient": 1.3, "guided-backprop": 1.1, "lrp-epsilon": 1.3, "deeplift": 1.3, "deeplift-ablation": 1.3,
           "lrp-zplus": 1.7, "lrp-epsilon-plus": 1.7, "lrp-alpha2beta1": 2.3}


def plain_gradient(model, x, target):
    xg = x.clone().requires_grad_()
    out = model(xg).gather(1, target[:, None]).sum()
    return torch.autograd.grad(out, xg)[0]


def run(batch: int = 64, rounds: int = 21) -> str:
    kept = keep_freed_memory()
    torch.manual_seed(0)
    model = build("vgg", (3, 32, 32), 10).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    x = torch.rand(batch, 3, 32, 32)
    target = torch.randint(0, 10, (batch,))
    explainers = {m: Explainer(model, m) for m in METHODS}
    candidates = {"plain gradient": lambda: plain_gradient(model, x, target)}
    candidates |= {m: (lambda e=e: e.attribute(x, target=target)) for m, e in explainers.items()}
    candidates["captum DeepLift"] = lambda: DeepLift(model).attribute(x, target=target)
    candidates["captum GuidedBackprop"] = lambda: GuidedBackprop(model).attribute(x, target=target)
    x5, t5 = x.repeat(5, 1, 1, 1), target.repeat(5)
    vectors = torch.randn(5, batch, 10)
    candidates["plain gradient, 5x batch"] = lambda: plain_gradient(model, x5, t5)
    candidates["propagate K=5 (lrp-zplus)"] = lambda: explainers["lrp-zplus"].propagate(x, "classifier.6", vectors)
    t, seconds = paired_times(candidates, "plain gradient", rounds=rounds)
    rows = [(m, f"{t[m]:.2f}x", f"{METHODS[m]:.1f}x", f"<= {TARGETS[m]:.1f}x") for m in METHODS]
    rows.append(("captum DeepLift / ours", f"{t['captum DeepLift'] / t['deeplift']:.2f}x", "", ""))
    rows.append(("captum GuidedBackprop / ours", f"{t['captum GuidedBackprop'] / t['guided-backprop']:.2f}x", "", ""))
    rows.append(("propagate K=5 / plain gradient of a 5x batch",
                 f"{t['propagate K=5 (lrp-zplus)'] / t['plain gradient, 5x batch']:.2f}x", "0.6x", "<= 1.0x"))
    memory = "kept for reuse" if kept else "returned: glibc defaults"
    head = (f"Engine cost on a VGG-style 32x32 net, batch {batch}, CPU ({torch.get_num_threads()} threads; freed memory "
            f"{memory}); plain gradient {seconds['plain gradient'] * 1000:.1f} ms; medians of {rounds} rounds\n\n")
    return head + table(rows, ("method", "time / plain gradient", "floor", "target"))


if __name__ == "__main__":
    print(run())
