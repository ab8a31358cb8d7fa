"""Audit-test speed: our batched SSIM over a scikit-image loop, and our randomization and
random-logit tests over Quantus's MPRT and RandomLogit on the same model, images and method.

The process keeps freed memory for reuse, as the command line does
(:func:`audit.run.resources.keep_freed_memory`); the floors run under the same allocator, and with max
pooling run as the engine runs it (:func:`benchmarks.engine.engine_pooling`).
Quantus is installed only for this benchmark (``pip install .[bench]``); without it those rows
say so. Our functions compute more per call (SSIM, two Spearman correlations and HOG
similarity; Quantus computes one similarity), so the ratios are conservative.
"""
from __future__ import annotations

import types

import numpy as np
import torch
from skimage.metrics import structural_similarity
from torch import nn

from audit.data import embedded_sample
from audit.measures.similarity import ssim
from audit.models import load_checkpoint
from audit.models.copying import copy_model
from audit.run.resources import keep_freed_memory
from benchmarks.engine import engine_pooling
from benchmarks.timing import median_ratios, median_times, table


def _sample(n_images: int) -> tuple[np.ndarray, np.ndarray]:
    """``n_images`` images of the embedded sample and their labels, spread over its classes (numpy)."""
    x, y = embedded_sample()
    return x[:: 1000 // n_images][:n_images], y[:: 1000 // n_images][:n_images]


def _ssim_rows(rounds: int) -> list[tuple[str, str, str]]:
    rows = []
    for n, side in ((1000, 28), (64, 224)):
        g = torch.Generator().manual_seed(0)
        a = torch.rand(n, side, side, generator=g, dtype=torch.float64)
        b = torch.rand(n, side, side, generator=g, dtype=torch.float64)
        an, bn = a.numpy(), b.numpy()
        t = median_times({
            "ours": lambda: ssim(a, b, win_size=5, data_range=1.0),
            "skimage": lambda: [structural_similarity(x, y, win_size=5, data_range=1.0)  # type: ignore[no-untyped-call]
                                for x, y in zip(an, bn)],
        }, rounds=rounds)
        rows.append((f"SSIM, {n} maps {side}x{side}", f"{t['skimage'] / t['ours']:.1f}x", ">= 10x"))
    return rows


def _quantus_rows(rounds: int, n_images: int = 16) -> list[tuple[str, str, str]]:
    quantus: types.ModuleType  # its metrics are re-exported by `import *`, which mypy --strict does not follow
    try:
        import quantus
    except ImportError:
        return [("MPRT / RandomLogit vs Quantus", "quantus not installed (pip install .[bench])", ">= 3x")]
    from audit import parameter_randomization, random_logit_test

    model = load_checkpoint("cnn-sgd")
    x, y = _sample(n_images)

    def quantus_mprt() -> object:
        # Quantus's default similarity (Spearman): its SSIM path fails in MPRT 0.6.0 (a list has no
        # .tolist()), and Quantus flattens maps to 1-D before SSIM anyway.
        mprt = quantus.MPRT(layer_order="top_down", disable_warnings=True, display_progressbar=False)
        return mprt(model=model, x_batch=x, y_batch=y, a_batch=None, explain_func=quantus.explain,
                    explain_func_kwargs={"method": "Saliency"}, device="cpu")

    def quantus_random_logit() -> object:
        return quantus.RandomLogit(num_classes=10, disable_warnings=True, display_progressbar=False)(
            model=model, x_batch=x, y_batch=y, a_batch=None, explain_func=quantus.explain,
            explain_func_kwargs={"method": "Saliency"}, device="cpu")

    # each pair timed back to back in its rounds (paired ratios): a call takes 0.02-0.2 s, where the machine's
    # drift between rounds would move a ratio of medians by a third
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    mprt = median_ratios({"quantus": quantus_mprt,
                          "ours": lambda: parameter_randomization(model, x, y, ["gradient"], progress=False),
                          "floor": lambda: _floor(model, xt, yt, "cascading")},
                         "ours", rounds=rounds)
    other = (yt + 1 + torch.randint(0, 9, yt.shape, generator=torch.Generator().manual_seed(0))) % 10

    def floor_logit() -> None:  # what any random-logit test computes: one forward pass, two input gradients
        xg = xt.clone().requires_grad_()
        with engine_pooling():
            out = model(xg)
            torch.autograd.grad(out.gather(1, yt[:, None]).sum(), xg, retain_graph=True)
            torch.autograd.grad(out.gather(1, other[:, None]).sum(), xg)

    logit = median_ratios({"quantus": quantus_random_logit,
                           "ours": lambda: random_logit_test(model, x, y, ["gradient"], progress=False),
                           "floor": floor_logit}, "ours", rounds=rounds)
    return [(f"parameter_randomization vs Quantus MPRT ({n_images} images, gradient)", f"{mprt['quantus']:.1f}x",
             ">= 3x"),
            ("(Quantus MPRT over parameter_randomization's floor: its stage models, a forward pass and an input "
             "gradient each)", f"{mprt['quantus'] / mprt['floor']:.1f}x (the most a check at its floor can be faster)",
             ""),
            (f"random_logit_test vs Quantus RandomLogit ({n_images} images, gradient)", f"{logit['quantus']:.1f}x",
             ">= 3x"),
            ("(Quantus RandomLogit over the passes any implementation makes: one forward, two input gradients)",
             f"{logit['quantus'] / logit['floor']:.1f}x (the most a test can be faster)", "")]


def _floor(model: nn.Module, x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, order: str,
           samples: int = 1) -> None:
    """A randomization check's floor: its stage models built as the check builds them (the model copied
    and traced, the copy using the model's kept program as the check's does; each stage's layer or block
    re-initialised), then one forward pass and one input gradient per stage model (on ``samples`` copies of
    the batch), by autograd."""
    from attributions.graph import trace
    from audit.checks.randomization import randomization_stages
    from audit.checks.stage_options import StageSettings
    from audit.checks.stages import randomization_plan
    start = copy_model(model)
    plan = randomization_plan(start, trace(start, torch.as_tensor(x)))
    xb, yb = torch.as_tensor(x).repeat(samples, 1, 1, 1), torch.as_tensor(y).repeat(samples)
    with engine_pooling():
        for _, _, m in randomization_stages(model, StageSettings(order=order), plan=plan, start=start):
            xg = xb.clone().requires_grad_()
            torch.autograd.grad(m(xg).gather(1, yb[:, None]).sum(), xg)


def _mprt_family_rows(rounds: int, n_images: int = 16, samples: int = 10) -> list[tuple[str, str, str]]:
    """eMPRT and sMPRT (gradient, bottom-up): ours over the floor (:func:`_floor`), and Quantus's over ours."""
    from audit import efficient_mprt, parameter_randomization, smooth_mprt

    model = load_checkpoint("cnn-sgd")
    x, y = _sample(n_images)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    # each comparison timed in its own group, paired per round (the first entry's time over the
    # second's): a call right after a heavy one (Quantus's SmoothMPRT) runs up to 1.7x slower on this
    # machine (allocator and caches), whichever it is, and the machine's speed drifts over minutes
    groups = [
        {"ours emprt": lambda: efficient_mprt(model, xt, yt, ["gradient"], progress=False),
         "floor emprt": lambda: _floor(model, xt, yt, "bottom-up")},
        {"ours mprt": lambda: parameter_randomization(model, xt, yt, ["gradient"], progress=False),
         "floor mprt": lambda: _floor(model, xt, yt, "cascading")},
        {"ours smprt": lambda: smooth_mprt(model, xt, yt, ["gradient"], n_samples=samples, progress=False),
         "floor smprt": lambda: _floor(model, xt, yt, "bottom-up", samples)}]
    quantus: types.ModuleType | None  # None: not installed; a plain module: see _quantus_rows
    try:
        import quantus
    except ImportError:
        quantus = None
    if quantus is not None:
        kwargs = {"explain_func": quantus.explain, "explain_func_kwargs": {"method": "Saliency"}, "device": "cpu",
                  "a_batch": None}
        groups.append({"quantus emprt": lambda: quantus.EfficientMPRT(disable_warnings=True)(
                           model=model, x_batch=x, y_batch=y, **kwargs),
                       "ours emprt score only": lambda: efficient_mprt(model, xt, yt, ["gradient"], progress=False,
                                                                       curve=False)})
        groups.append({"quantus smprt": lambda: quantus.SmoothMPRT(nr_samples=samples, disable_warnings=True)(
                           model=model, x_batch=x, y_batch=y, **kwargs),
                       "ours smprt (vs quantus)": lambda: smooth_mprt(model, xt, yt, ["gradient"], n_samples=samples,
                                                                      progress=False)})
    # the floors' groups are cheap (0.1-1 s a round) and their ratios are compared with a target: more rounds
    t = {k: v for n, group in enumerate(groups)
         for k, v in median_ratios(group, list(group)[1], rounds=max(21, rounds) if n < 3 else rounds).items()}
    rows = [(f"parameter_randomization over its floor ({n_images} images, gradient)",
             f"{t['ours mprt']:.2f}x (lower is better)", "<= 1.3x"),
            (f"efficient_mprt over its floor ({n_images} images, gradient)",
             f"{t['ours emprt']:.2f}x (lower is better)", "<= 1.3x"),
            (f"smooth_mprt over its floor ({n_images} images, {samples} samples, gradient)",
             f"{t['ours smprt']:.2f}x (lower is better)", "<= 1.3x")]
    if quantus is None:
        return rows + [("eMPRT / sMPRT vs Quantus", "quantus not installed (pip install .[bench])", ">= 2x")]
    return rows + [("efficient_mprt (curve=False, as its skip_layers) vs Quantus EfficientMPRT",
                    f"{t['quantus emprt']:.1f}x", ">= 2x"),
                   ("smooth_mprt vs Quantus SmoothMPRT", f"{t['quantus smprt']:.1f}x", ">= 2x")]


def _floor_by_model_rows(rounds: int, n_images: int = 16) -> list[tuple[str, str, str]]:
    """parameter_randomization (gradient, cascading) over its floor on the other shipped models and on a 224x224
    ResNet-50: how the ratio moves as the passes grow against the measures (which cost the same per map)."""
    from audit import parameter_randomization
    from audit.models import build

    xt, yt = (torch.from_numpy(a) for a in _sample(n_images))
    g = torch.Generator().manual_seed(0)
    # an ImageNet-size model (random weights): its passes dwarf the measures, the other end of the scale
    large = ("resnet50 at 224x224, random weights", build("resnet50", (3, 224, 224), 10).eval(),
             torch.rand(2, 3, 224, 224, generator=g), torch.tensor([1, 7]), max(3, rounds // 3))
    rows = []
    for name, model, x, y, n_rounds in [(n, load_checkpoint(n), xt, yt, rounds)
                                        for n in ("vgg-sgd", "resnet-sgd", "vit-sgd")] + [large]:
        t = median_ratios({
            "ours": lambda: parameter_randomization(model, x, y, ["gradient"], progress=False),
            "floor": lambda: _floor(model, x, y, "cascading"),
        }, "floor", rounds=n_rounds)
        rows.append((f"parameter_randomization over its floor on {name} ({len(x)} images, gradient)",
                     f"{t['ours']:.2f}x (lower is better)", "<= 1.3x"))
    return rows


def run(rounds: int = 5) -> str:
    keep_freed_memory()  # as the command line does; the floors run under it too
    rows = (_ssim_rows(rounds) + _quantus_rows(max(11, rounds)) + _mprt_family_rows(max(5, rounds))
            + _floor_by_model_rows(max(9, rounds)))
    return "Audit speed (ours faster by)\n\n" + table(rows, ("comparison", "speed-up", "target"))


if __name__ == "__main__":
    print(run())
