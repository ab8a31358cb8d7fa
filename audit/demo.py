"""The main job on the embedded sample, extended as the audit components land.

Today: train the small CNN on 800 embedded Fashion-MNIST images, report its accuracy on the 200
held-out ones, and evaluate every shipped checkpoint on all 1,000 (they never saw them: the
sample comes from the official test split).
"""
from __future__ import annotations

import time

from audit.data import embedded_sample
from audit.train import TrainConfig, evaluate, train
from audit.zoo import available_checkpoints, load_checkpoint


def run_demo(seed: int = 0, progress: bool = True) -> dict:
    """Run the demo and print a summary. Returns {model name: accuracy}."""
    start = time.perf_counter()
    _, meta = train(TrainConfig(arch="cnn", data="fashion-mnist-sample", epochs=8, seed=seed), progress=progress)
    results = {"cnn (trained now, 800 images)": meta["test_accuracy"]}
    x, y = embedded_sample()
    for name in available_checkpoints():
        results[f"{name} (shipped)"] = evaluate(load_checkpoint(name), x, y)
    print("\naccuracy on held-out embedded Fashion-MNIST images:")
    for name, acc in results.items():
        print(f"  {name:32s} {acc:.4f}")
    print(f"demo finished in {time.perf_counter() - start:.1f} s")
    return results
