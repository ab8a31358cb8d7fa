"""Interleaved timing: every candidate runs once per round, medians over rounds, so machine noise
hits all candidates alike and only the ratios are reported."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_times(candidates: dict[str, Callable[[], object]], rounds: int = 7, warmup: int = 1) -> dict[str, float]:
    """Median wall time in seconds of each zero-argument callable, measured round-robin."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


def table(rows: list[tuple], header: tuple) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
