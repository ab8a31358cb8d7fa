"""Our AttnLRP and CP-LRP against LXT 2.1 ("LRP eXplains Transformers", Achtibat et al. 2024) on torchvision's
``vit_b_16``, measured side by side in one run on this machine's CPU (random weights, seeded, float32, 224 x 224):

* time: seconds per batch of maps, every candidate once per round, the median over interleaved rounds, and its
  time over LXT's in the same round (:func:`benchmarks.timing.paired_times`), with the command line's allocator
  setting (:func:`audit.run.resources.keep_freed_memory`); our capture (``torch.export``, once per model) apart.
  Target: ours <= 1.0x LXT's. LXT's torchvision patch computes only CP-LRP; ``LXT, attention differentiated`` is
  the same patch with ``nn.MultiheadAttention``'s own forward restored (gradients through the query and key, as
  AttnLRP's chain takes them): the passes an implementation of AttnLRP in LXT's way makes, the measured floor
  our ``attnlrp`` is compared with too. CP-LRP skips the query and key projections' backward (2 of the 24
  matmul units of a block), which AttnLRP's chain must compute;
* memory: the peak resident memory a batch adds, each candidate in a fresh process, measured as
  :func:`benchmarks.library_costs.batch_peak_mb` does (VmHWM after a heap trim). Target: ours <= 1.0x LXT's;
* agreement: cosine similarity and relative L2 distance of our maps to LXT's, per image (mean and worst).

LXT runs as its efficient API does: ``lxt.efficient.monkey_patch(torchvision.models.vision_transformer)``, then
input x gradient of the target logit. Its torchvision map, ``cp_LRP``, holds the attention weights constant (query
and key detached before ``nn.MultiheadAttention``), takes the identity rule through GELU and holds LayerNorm's
standard deviation constant; linear layers, the patch embedding and the residual sums keep their gradient (LRP-0).
That is CP-LRP inside attention with AttnLRP's rules outside it, the rules of our ``cp-lrp``: its pair. Both
compute it in factor form (relevance = value x factor: a gradient with the held operands held); ours stabilises the
identity rule's ratio with epsilon 1e-6, LXT with its own. Our ``attnlrp`` (relevance through the softmax, halves
through both attention products) computes another map. LXT's ViT example adds zennit's Gamma rule on the linear
layers: left out here, as in our two methods. The patch replaces the ``forward`` of torch.nn's GELU, LayerNorm and
MultiheadAttention for the whole process: ours are captured before it.

Needs torchvision and LXT: ``PYTHONPATH=. .venv-libraries/bin/python -m benchmarks.transformer_lrp [--batch N]
[--rounds N]`` (``make test`` builds that venv, LXT with it).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch

from audit.run.resources import keep_freed_memory
from benchmarks.library_costs import batch_peak_mb
from benchmarks.timing import paired_times, table

METHODS = ("cp-lrp", "attnlrp")
PAIR = "cp-lrp"  # the method LXT's torchvision patch computes
LXT = "LXT"
FLOOR = "LXT, attention differentiated"  # LXT's patch with the query and key not held: AttnLRP's passes
ROUNDS = 11  # a map takes about a second: five rounds left the ratios 0.05 apart between runs

_SETUP = """
from benchmarks.transformer_lrp import candidate
run = candidate({name!r})
"""


def vit() -> torch.nn.Module:
    """torchvision's ViT-B/16, random weights (seed 0), frozen. torchvision initialises the classifier to
    zeros (every logit 0, nothing to explain): it gets normal weights of std 0.02 here, as timm's ViT."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(weights=None).eval()
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    for p in model.parameters():
        p.requires_grad_(False)
    return cast(torch.nn.Module, model)  # Any where torchvision is not installed (mypy's venv)


def patch_lxt() -> None:
    """``lxt.efficient.monkey_patch(torchvision.models.vision_transformer)``. lxt 2.1's package ``__init__`` imports
    its BERT patch, which needs transformers 4 (``transformers.modeling_attn_mask_utils``), so the torchvision
    map is imported with lxt's package ``__init__`` modules skipped and applied as ``monkey_patch`` does."""
    spec = importlib.util.find_spec("lxt")
    if spec is None or spec.origin is None:
        raise ImportError("LXT is not installed: pip install --no-deps -c constraints-libraries.txt lxt")
    root = Path(spec.origin).parent
    for name in ("lxt", "lxt.efficient", "lxt.efficient.models"):
        package = sys.modules.setdefault(name, types.ModuleType(name))
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
    from lxt.efficient.models.vit_torch import cp_LRP

    for cls, patch in cp_LRP.items():
        if not patch(cls):
            raise RuntimeError(f"LXT could not patch {cls.__name__}")


def attention_differentiated(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with each ``nn.MultiheadAttention`` running torch's own forward after :func:`patch_lxt` (which
    holds the query and key for CP-LRP): LXT's rules elsewhere, the attention's exact gradient."""
    for module in model.modules():
        if isinstance(module, torch.nn.MultiheadAttention):
            original = getattr(type(module), "original_forward", type(module).forward)
            module.forward = types.MethodType(original, module)  # type: ignore[method-assign]
    return model


def lxt_map(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """LXT's relevance of ``target`` (B,) at the input: input x gradient of the target logit in the patched model."""
    x = x.clone().requires_grad_()
    return x * torch.autograd.grad(model(x).gather(1, target[:, None]).sum(), x)[0]


def candidate(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``run(x)`` for a memory process: LXT's map or one of our methods', of class 0."""
    from attributions import Explainer

    model = vit()
    if name in (LXT, FLOOR):
        patch_lxt()
        model = attention_differentiated(model) if name == FLOOR else model
        return lambda x: lxt_map(model, x, torch.zeros(len(x), dtype=torch.long))
    explainer = Explainer(model, name)
    return lambda x: explainer.attribute(x, target=0)


def agreement(ours: torch.Tensor, lxt: torch.Tensor) -> str:
    """Cosine similarity and relative L2 distance per image, mean and worst."""
    a, b = ours.flatten(1).double(), lxt.flatten(1).double()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=1)
    relative = (a - b).norm(dim=1) / b.norm(dim=1)
    return (f"cosine {cosine.mean():.6f} (worst {cosine.min():.6f}), "
            f"relative L2 distance {relative.mean():.2e} (worst {relative.max():.2e})")


def time_and_agreement(batch: int, rounds: int) -> tuple[dict[str, float], dict[str, float], float, dict[str, str]]:
    """(time over LXT's, seconds, our capture's seconds, {method: agreement with LXT's map})."""
    from attributions import Explainer
    from attributions.graph import trace

    model = vit()
    x = torch.rand(batch, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 1000, (batch,), generator=torch.Generator().manual_seed(2))
    start = time.perf_counter()
    graph = trace(model, x)
    capture = time.perf_counter() - start
    # mypy cannot infer a lambda's defaults
    ours = {m: cast(Callable[[], torch.Tensor], lambda e=Explainer(model, m, graph=graph): e.attribute(x, target=target))
            for m in METHODS}
    before = {m: fn() for m, fn in ours.items()}
    patch_lxt()
    lxt = lxt_map(model, x, target)
    floor = attention_differentiated(vit())
    floor_map = lxt_map(floor, x, target)
    for m, fn in ours.items():  # and the warm-up
        if not torch.equal(fn(), before[m]):
            raise RuntimeError(f"LXT's patch of torch.nn changed our {m} maps")
    candidates = {LXT: lambda: lxt_map(model, x, target), FLOOR: lambda: lxt_map(floor, x, target), **ours}
    ratio, seconds = paired_times(candidates, LXT, rounds=rounds, warmup=0)
    if torch.equal(floor_map, lxt):
        raise RuntimeError("the floor's map equals LXT's CP-LRP map: its attention is still held")
    return ratio, seconds, capture, {m: agreement(before[m], lxt) for m in METHODS}


def run(batch: int = 4, rounds: int = ROUNDS) -> str:
    """The table and the agreement lines (Markdown)."""
    kept = keep_freed_memory()
    ratio, seconds, capture, agree = time_and_agreement(batch, rounds)
    peak = {name: batch_peak_mb(_SETUP.format(name=name), batch) for name in (LXT, FLOOR, *METHODS)}
    rows = [(name, f"{seconds[name]:.2f}", f"{ratio[name]:.2f}x", "<= 1.00x" if name in METHODS else "",
             f"{peak[name]:.0f}", f"{peak[name] / peak[LXT]:.2f}x", "<= 1.00x" if name in METHODS else "")
            for name in (LXT, FLOOR, *METHODS)]
    rows.append(("attnlrp over the floor (LXT, attention differentiated)", "", f"{ratio['attnlrp'] / ratio[FLOOR]:.2f}x",
                 "<= 1.00x", "", f"{peak['attnlrp'] / peak[FLOOR]:.2f}x", "<= 1.00x"))
    lines = [f"- {m}{' (the method LXT computes)' if m == PAIR else ''} against LXT: {agree[m]}" for m in METHODS]
    return (f"torchvision vit_b_16 on the CPU ({torch.get_num_threads()} threads), 224 x 224, random weights, float32, "
            f"batch {batch}; time: median of {rounds} interleaved rounds"
            f"{', freed memory kept for reuse' if kept else ''} (our capture: {capture:.1f} s, once); "
            f"memory: the peak resident memory the batch adds, a process each\n\n"
            + table(rows, ("candidate", "seconds", "time / LXT's", "target", "peak MB", "peak / LXT's", "target"))
            + "\n\nAgreement of the maps (per image, input x 3 channels):\n\n" + "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="images per call")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds")
    args = parser.parse_args(argv)
    print(run(args.batch, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
