"""Engine cost: each method's time over one plain input gradient, and captum's over ours.

VGG-style net on 32x32 RGB inputs, batch 64, CPU. Floors (the convolutions a rule cannot avoid,
in units of one forward + input-backward): gradient-like, epsilon, DeepLIFT 1.0x; z+ 1.5x;
alpha-beta 2.0x. The gradient-like floor is also measured: the plain gradient with max pooling run as the engine
runs it (under :func:`engine_pooling`), and guided backprop's and DeepLIFT's, as that gradient plus the element-wise work
their rules add at each ReLU (:func:`guided_floor`, :func:`deeplift_floor`).
``propagate`` with K = 5 is compared with one plain gradient of a 5x batch. Each candidate's time over
the plain gradient's in the same round, the median over rounds; the process keeps freed memory for reuse
as the command line does (:func:`audit.run.resources.keep_freed_memory`; glibc's defaults fault a freed
forward pass's pages in again on the next call, which costs every candidate alike and moved DeepLIFT's
ratio from 1.31x to 1.52x on this 2-core machine).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import torch
from captum.attr import DeepLift, GuidedBackprop
from torch import nn

from attributions import Explainer
from attributions.linear_ops import max_pool
from audit.models import build
from audit.run.resources import keep_freed_memory
from benchmarks.timing import paired_times, table

T = TypeVar("T")
METHODS = {"gradient": 1.0, "guided-backprop": 1.0, "lrp-epsilon": 1.0, "deeplift": 1.0, "deeplift-ablation": 1.0,
           "lrp-zplus": 1.5, "lrp-epsilon-plus": 1.5, "lrp-alpha2beta1": 2.0}
TARGETS = {"gradient": 1.3, "guided-backprop": 1.1, "lrp-epsilon": 1.3, "deeplift": 1.3, "deeplift-ablation": 1.3,
           "lrp-zplus": 1.7, "lrp-epsilon-plus": 1.7, "lrp-alpha2beta1": 2.3}


def plain_gradient(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    xg = x.clone().requires_grad_()
    out = model(xg).gather(1, target[:, None]).sum()
    return torch.autograd.grad(out, xg)[0]


@contextlib.contextmanager
def engine_pooling() -> Iterator[None]:
    """Within it, nn.MaxPool2d runs on (B, C, H, W) CPU inputs as the engine runs it: by torch's channels-last
    kernel (:func:`attributions.linear_ops.max_pool`), three times faster at this size than the kernel the model's
    own layout takes. The floors run under it, so that no method goes below its floor by pooling faster."""
    original = nn.MaxPool2d.forward

    def forward(self: nn.MaxPool2d, input: torch.Tensor) -> torch.Tensor:  # torch's parameter name: callers may pass it by name
        if input.ndim == 4 and not self.return_indices:
            return max_pool(input, self)[0]
        out: torch.Tensor = original(self, input)
        return out

    nn.MaxPool2d.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.MaxPool2d.forward = original  # type: ignore[method-assign]


def _pooled(run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` under :func:`engine_pooling`."""
    def pooled() -> Any:
        with engine_pooling():
            return run()
    return pooled


def _relus(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.ReLU)]


def _hooked(model: nn.Module, run: Callable[[], T], pre: Callable[..., None] | None = None,
            post: Callable[..., None] | None = None) -> T:
    """``run()`` with ``pre`` / ``post`` as forward pre-hook / forward hook on every ReLU of ``model``."""
    handles = [m.register_forward_pre_hook(pre) for m in _relus(model) if pre is not None]
    handles += [m.register_forward_hook(post) for m in _relus(model) if post is not None]
    try:
        return run()
    finally:
        for h in handles:
            h.remove()


def guided_floor(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The plain gradient with each ReLU's incoming gradient clipped at 0 by a tensor hook: guided backprop
    in autograd's own kernels, one clipping pass per ReLU more than the gradient."""
    def clip(module: nn.Module, inputs: object, out: torch.Tensor) -> None:
        out.register_hook(lambda g: g.clamp(min=0))  # type: ignore[no-untyped-call]
    return _hooked(model, lambda: plain_gradient(model, x, target), post=clip)


def relu_values(model: nn.Module, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of every ReLU for inputs ``x``, in forward order (the input read before an in-place
    ReLU overwrites it)."""
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    with torch.no_grad():
        _hooked(model, lambda: model(x), pre=lambda m, i: inputs.append(i[0].clone()),
                post=lambda m, i, o: outputs.append(o.clone()))
    return list(zip(inputs, outputs))


def deeplift_floor(model: nn.Module, x: torch.Tensor, target: torch.Tensor,
                   values: list[tuple[torch.Tensor, torch.Tensor]],
                   reference: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """A lower bound of DeepLIFT's time: the plain gradient plus, at each ReLU, the passes its Rescale multiplier
    needs and no gradient does (x - x0, y - y0, their quotient, the product with the signal, for which the
    ReLU's output stands in), on the ReLUs' recorded values (``values``; ``reference``: the zero image's, as
    :func:`relu_values` gives them); max pooling's DeepLIFT rule and the 0 / 0 guard left out."""
    plain_gradient(model, x, target)
    for (pre, post), (pre0, post0) in zip(values, reference):
        (post - post0).div_(pre - pre0).mul_(post)


def run(batch: int = 64, rounds: int = 21) -> str:
    kept = keep_freed_memory()
    torch.manual_seed(0)
    model = build("vgg", (3, 32, 32), 10).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    x = torch.rand(batch, 3, 32, 32)
    target = torch.randint(0, 10, (batch,))
    explainers = {m: Explainer(model, m) for m in METHODS}
    candidates: dict[str, Callable[[], object]] = {"plain gradient": lambda: plain_gradient(model, x, target)}
    # mypy cannot infer a lambda's defaults
    candidates |= {m: cast(Callable[[], torch.Tensor], lambda e=e: e.attribute(x, target=target)) for m, e in explainers.items()}
    values, reference = relu_values(model, x), relu_values(model, torch.zeros_like(x[:1]))
    candidates["gradient floor"] = _pooled(lambda: plain_gradient(model, x, target))
    candidates["guided floor"] = _pooled(lambda: guided_floor(model, x, target))
    candidates["deeplift floor"] = _pooled(lambda: deeplift_floor(model, x, target, values, reference))
    candidates["captum DeepLift"] = lambda: DeepLift(model).attribute(x, target=target)
    candidates["captum GuidedBackprop"] = lambda: GuidedBackprop(model).attribute(x, target=target)
    x5, t5 = x.repeat(5, 1, 1, 1), target.repeat(5)
    vectors = torch.randn(5, batch, 10)
    candidates["plain gradient, 5x batch"] = lambda: plain_gradient(model, x5, t5)
    candidates["propagate K=5 (lrp-zplus)"] = lambda: explainers["lrp-zplus"].propagate(x, "classifier.6", vectors)
    t, seconds = paired_times(candidates, "plain gradient", rounds=rounds)
    measured = {m: t["gradient floor"] for m in ("gradient", "lrp-epsilon")}
    measured |= {"guided-backprop": t["guided floor"], "deeplift": t["deeplift floor"],
                 "deeplift-ablation": t["deeplift floor"]}
    rows = [(m, f"{t[m]:.2f}x", f"{METHODS[m]:.1f}x" + (f", measured {measured[m]:.2f}x" if m in measured else ""),
             f"<= {TARGETS[m]:.1f}x") for m in METHODS]
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
