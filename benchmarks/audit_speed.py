"""Audit-test speed: our batched SSIM over a scikit-image loop, and our randomization and
random-logit tests over Quantus's MPRT and RandomLogit on the same model, images and method.

Quantus is installed only for this benchmark (``pip install .[bench]``); without it those rows
say so. Our functions compute more per call (SSIM, two Spearman correlations and HOG
similarity; Quantus computes one similarity), so the ratios are conservative.
"""
from __future__ import annotations

import torch
from skimage.metrics import structural_similarity

from audit.data import embedded_sample
from audit.measures.similarity import ssim
from audit.models import load_checkpoint
from benchmarks.timing import median_times, table


def _ssim_rows(rounds: int) -> list[tuple]:
    rows = []
    for n, side in ((1000, 28), (64, 224)):
        g = torch.Generator().manual_seed(0)
        a = torch.rand(n, side, side, generator=g, dtype=torch.float64)
        b = torch.rand(n, side, side, generator=g, dtype=torch.float64)
        an, bn = a.numpy(), b.numpy()
        t = median_times({
            "ours": lambda: ssim(a, b, win_size=5, data_range=1.0),
            "skimage": lambda: [structural_similarity(x, y, win_size=5, data_range=1.0) for x, y in zip(an, bn)],
        }, rounds=rounds)
        rows.append((f"SSIM, {n} maps {side}x{side}", f"{t['skimage'] / t['ours']:.1f}x", ">= 10x"))
    return rows


def _quantus_rows(rounds: int, n_images: int = 16) -> list[tuple]:
    try:
        import quantus
    except ImportError:
        return [("MPRT / RandomLogit vs Quantus", "quantus not installed (pip install .[bench])", ">= 3x")]
    from audit import parameter_randomization, random_logit_test

    model = load_checkpoint("cnn-sgd")
    x, y = embedded_sample()
    x, y = x[:: 1000 // n_images][:n_images], y[:: 1000 // n_images][:n_images]

    def quantus_mprt():
        # Quantus's default similarity (Spearman): its SSIM path fails in MPRT 0.6.0 (a list has no
        # .tolist()), and Quantus flattens maps to 1-D before SSIM anyway.
        mprt = quantus.MPRT(layer_order="top_down", disable_warnings=True, display_progressbar=False)
        return mprt(model=model, x_batch=x, y_batch=y, a_batch=None, explain_func=quantus.explain,
                    explain_func_kwargs={"method": "Saliency"}, device="cpu")

    def quantus_random_logit():
        return quantus.RandomLogit(num_classes=10, disable_warnings=True, display_progressbar=False)(
            model=model, x_batch=x, y_batch=y, a_batch=None, explain_func=quantus.explain,
            explain_func_kwargs={"method": "Saliency"}, device="cpu")

    t = median_times({
        "ours mprt": lambda: parameter_randomization(model, x, y, ["gradient"], progress=False),
        "quantus mprt": quantus_mprt,
        "ours logit": lambda: random_logit_test(model, x, y, ["gradient"], progress=False),
        "quantus logit": quantus_random_logit,
    }, rounds=rounds)
    return [(f"parameter_randomization vs Quantus MPRT ({n_images} images, gradient)",
             f"{t['quantus mprt'] / t['ours mprt']:.1f}x", ">= 3x"),
            (f"random_logit_test vs Quantus RandomLogit ({n_images} images, gradient)",
             f"{t['quantus logit'] / t['ours logit']:.1f}x", ">= 3x")]


def run(rounds: int = 5) -> str:
    rows = _ssim_rows(rounds) + _quantus_rows(max(3, rounds // 2))
    return "Audit speed (ours faster by)\n\n" + table(rows, ("comparison", "speed-up", "target"))


if __name__ == "__main__":
    print(run())
