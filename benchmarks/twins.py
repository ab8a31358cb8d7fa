"""What a twin costs: memory of streamed training as the image folder grows, and the epochs and time to fit
permuted labels against the training subset's size.

Measured in one run on this machine's CPU:
* **memory**: peak resident memory (the training process's ru_maxrss) of one epoch of ``train --data imagefolder``
  (the zoo CNN, batch 64) on generated folders of 64 x 64 RGB PNG files, 1,000 and 20,000 images, streamed; beside
  it, the bytes the same images take held in memory as float32 arrays (what reading the folder whole would add);
* **cost of a permuted-label twin**: the zoo CNN trained on ``SUBSETS`` Fashion-MNIST images with permuted labels
  by the shipped twin's recipe (SGD, lr 0.02, batch 128, cosine over 100 epochs, no weight decay) until the training
  accuracy reaches 0.95: the epochs and the time it took, and its test accuracy (chance is 0.10). The shipped twins'
  own (their metadata, measured when they were trained) are listed beside.
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from audit.models.catalog import available_checkpoints

FOLDERS = (1_000, 20_000)
SUBSETS = (250, 500, 1_000, 2_000)
SIDE = 64

_TRAIN = """
import resource, sys, time
from audit.models import TrainConfig, train
start = time.perf_counter()
train(TrainConfig(arch="cnn", data="imagefolder", data_root=sys.argv[1], epochs=1, batch_size=64,
                  loader_workers=int(sys.argv[2])), progress=False, log=lambda s: None)
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _folder(root: Path, n: int, classes: int = 10) -> Path:
    """``n`` random 64 x 64 RGB PNG files in ``classes`` class folders."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)).save(root / f"c{i % classes}" / f"{i}.png")
    return root


def memory_rows(workers: int = 1) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in FOLDERS:
            root = _folder(Path(tmp) / str(n), n)
            out = subprocess.run([sys.executable, "-c", _TRAIN, str(root), str(workers)], capture_output=True,
                                 text=True, check=True).stdout.split()
            seconds, peak_kib = float(out[0]), int(out[1])
            held = n * 3 * SIDE * SIDE * 4
            rows.append(f"| {n:,} | {peak_kib / 1024:.0f} MiB | {held / 2**20:.0f} MiB | {seconds:.0f} s |")
    return rows


def cost_rows() -> list[str]:
    from audit.errors import ConfigError
    from audit.models import train
    from audit.models.recipes import RECIPES

    rows = []
    for n in SUBSETS:
        config = dataclasses.replace(RECIPES["cnn-permuted"], train_limit=n, fit_accuracy=0.95, twin_of=None)
        try:
            _, meta = train(config, progress=False, log=lambda s: None)
        except ConfigError as exc:  # an unfit twin
            rows.append(f"| cnn (this run) | {n:,} | not within {config.epochs} ({str(exc)[:60]}) | | |")
            continue
        rows.append(f"| cnn (this run) | {n:,} | {len(meta['history'])} | {meta['wall_time_s']:.0f} s | "
                    f"{meta['test_accuracy']:.3f} |")
    for name, meta in available_checkpoints().items():
        if meta.get("data", {}).get("labels") == "permuted":
            rows.append(f"| {name} (shipped) | {meta['data']['train_size']:,} | {len(meta['history'])} | "
                        f"{meta['wall_time_s']:.0f} s | {meta['test_accuracy']:.3f} |")
    return rows


def run() -> str:
    memory = ["| images in the folder | peak RSS, streamed | the images as float32 arrays | one epoch |",
              "|---:|---:|---:|---:|", *memory_rows()]
    cost = ["| model | training images | epochs to 0.95 on permuted labels | time | test accuracy |",
            "|---|---:|---:|---:|---:|", *cost_rows()]
    return ("Streamed training of the zoo CNN on folders of 64 x 64 RGB PNG files, one epoch, batch 64, one loader "
            "worker:\n\n" + "\n".join(memory) + "\n\nThe cost of a permuted-label twin (the shipped cnn twin's "
            "recipe on subsets of Fashion-MNIST, labels permuted once, until 0.95 training accuracy):\n\n"
            + "\n".join(cost))
