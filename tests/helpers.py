"""Writers for small data files in the real on-disk formats, for the reader tests."""
from __future__ import annotations

import gzip
import os
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    """Write a uint8 array as an IDX file (big-endian dims), optionally gzipped."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    raw = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def write_mnist_split(folder: Path, split: str, n: int, seed: int, gz: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Write images (n, 28, 28) and labels (n,) of one split in MNIST file names."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    prefix = "train" if split == "train" else "t10k"
    suffix = ".gz" if gz else ""
    write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", images, gz)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels, gz)
    return images, labels


def write_cifar_batches(folder: Path, per_batch: int, seed: int) -> dict[str, tuple[np.ndarray, list]]:
    """Write data_batch_1..5 and test_batch as CIFAR-10 python pickles."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"data": data, b"labels": labels}, f, protocol=2)
        out[name] = (data, labels)
    return out


def require_tool(*names: str, package: str) -> str:
    """The path of the first of ``names`` on PATH: required in CI (`make test` installs ``package``),
    skipped elsewhere when absent."""
    found = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{names[0]} is missing in CI: `make reportdeps` should have installed {package}")
        pytest.skip(f"{names[0]} not installed (apt-get install {package})")
    return found


def legend_outside_axes(fig) -> bool:
    """No axes holds a legend, and every figure legend's box overlaps no axes' box."""
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    if any(ax.get_legend() is not None for ax in fig.axes):
        return False
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        if any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes):
            return False
    return True
