"""Interleaved timing: every candidate runs once per round, medians over rounds, so machine noise
hits all candidates alike and only the ratios are reported."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence


def median_times(candidates: Mapping[str, Callable[[], object]], rounds: int = 7, warmup: int = 1) -> dict[str, float]:
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


def paired_times(candidates: Mapping[str, Callable[[], object]], baseline: str, rounds: int = 21,
                 warmup: int = 1) -> tuple[dict[str, float], dict[str, float]]:
    """(median over rounds of each candidate's time over the ``baseline`` candidate's time in the same round,
    median seconds of each). The candidates run back to back, in alternating order, so a machine whose speed
    drifts over minutes (a shared host) moves both alike: steadier than a ratio of medians."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    ratios: dict[str, list[float]] = {name: [] for name in candidates}
    seconds: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            candidates[name]()
            seconds[name].append(time.perf_counter() - start)
        for name in names:
            ratios[name].append(seconds[name][-1] / seconds[baseline][-1])
    return ({name: statistics.median(r) for name, r in ratios.items()},
            {name: statistics.median(s) for name, s in seconds.items()})


def median_ratios(candidates: Mapping[str, Callable[[], object]], baseline: str, rounds: int = 21,
                  warmup: int = 1) -> dict[str, float]:
    """The paired ratios of :func:`paired_times`."""
    return paired_times(candidates, baseline, rounds, warmup)[0]


def table(rows: Sequence[tuple[object, ...]], header: tuple[str, ...]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def head_commit() -> str:
    """The short hash of the checkout's HEAD, for a published table's provenance; says so outside a git checkout."""
    import subprocess
    from pathlib import Path

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
