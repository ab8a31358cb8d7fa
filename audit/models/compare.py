"""Baseline vs Bort twins: accuracy, constraint error and reconstruction quality side by side."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from audit.data.datasets import embedded_sample
from audit.models.catalog import available_checkpoints
from audit.models.checkpoint import load_checkpoint
from bort import BortError, constraint_error, reconstruction_quality


def first_conv(model: nn.Module) -> str:
    """Name of the first Conv2d module in definition order."""
    result: str = next(name for name, m in model.named_modules() if isinstance(m, nn.Conv2d))
    return result


def model_summary(name: str, model: nn.Module, x: np.ndarray) -> dict[str, Any]:
    """One row: recorded training facts, the mean and max orthogonality error now, and the median
    SSIM of reconstructing ``x`` (N, C, H, W) from the first conv layer (NaN where not a chain)."""
    meta = getattr(model, "metadata", {})
    err = constraint_error(model)
    try:
        ssim = float(reconstruction_quality(model, torch.from_numpy(x), first_conv(model)).ssim.median())
    except BortError:
        ssim = float("nan")
    return {"model": name, "arch": meta.get("arch"), "optimizer": meta.get("optimizer"),
            "dbort": meta.get("hyperparameters", {}).get("dbort", False),
            "test_accuracy": meta.get("test_accuracy"), "epochs": meta.get("epochs"),
            "train_minutes": round(meta.get("wall_time_s", float("nan")) / 60, 1),
            "orth_error_mean": float(err.orth_error.mean()), "orth_error_max": float(err.orth_error.max()),
            "reconstruction_ssim": ssim}


def shipped_summary(n_images: int = 100) -> pd.DataFrame:
    """``model_summary`` for every shipped checkpoint, on the first ``n_images`` embedded images."""
    x, _ = embedded_sample()
    return pd.DataFrame([model_summary(n, load_checkpoint(n), x[:n_images]) for n in available_checkpoints()])
