"""Where ``make test``'s time goes: ``make test`` run as CI runs it, timed from outside, and its output read back:
each job's wall-clock seconds (the main suite, the model-library suite and mypy run at once on the two cores) and
each suite's slowest tests.

Run it on a quiet machine; it takes as long as ``make test`` (the budget: 15 minutes on 2 cores).
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

BUDGET = 15 * 60.0  # seconds: make test on 2 cores
SUMMARY = re.compile(r"^=*\s*(\d+) passed.* in (\d+\.\d+)s")
SLOW = re.compile(r"^(\d+\.\d+)s (call|setup|teardown)\s+(.+)$")
MYPY = re.compile(r"^mypy took (\d+) s$")
LIBRARY_LOG = "--- model-library suite"
SHOWN = 5  # the slowest tests shown per suite


def _short(test: str) -> str:
    """A test's id without a long parameter (the examples' tests carry a whole code block)."""
    name, _, param = test.partition("[")
    return name if len(param) > 40 else test


def read(printed: str) -> tuple[dict[str, float], dict[str, int], dict[str, list[tuple[float, str]]]]:
    """({job: wall seconds}, {suite: tests passed}, {suite: [(seconds, test)] slowest first}) of ``make test``'s
    output: the main suite's lines come before the model-library suite's log, which is printed at the end."""
    walls: dict[str, float] = {}
    passed: dict[str, int] = {}
    slowest: dict[str, list[tuple[float, str]]] = {"main suite": [], "model-library suite": []}
    suite = "main suite"
    for line in printed.splitlines():
        if line.startswith(LIBRARY_LOG):
            suite = "model-library suite"
        elif summary := SUMMARY.match(line):  # the library suite runs in two pytest processes, one after the other
            passed[suite] = passed.get(suite, 0) + int(summary[1])
            walls[suite] = walls.get(suite, 0.0) + float(summary[2])
        elif slow := SLOW.match(line):
            slowest[suite].append((float(slow[1]), _short(slow[3])))
        elif mypy := MYPY.match(line):
            walls["mypy"] = float(mypy[1])
    return walls, passed, {k: sorted(v, reverse=True)[:SHOWN] for k, v in slowest.items()}


def tables(wall: float, printed: str) -> str:
    """The Markdown: the wall time against the budget, each job's seconds and each suite's slowest tests."""
    walls, passed, slowest = read(printed)
    lines = [f"`make test`: **{wall / 60:.1f} min** wall (the budget: {BUDGET / 60:.0f} min on 2 cores), ruff first, "
             "then the main suite, the model-library suite and mypy at once:", "",
             "| job | tests passed | wall seconds |", "| --- | --- | --- |"]
    lines += [f"| {job} | {passed.get(job, '')} | {seconds:.0f} |" for job, seconds in walls.items()]
    for suite, rows in slowest.items():
        lines += ["", f"| the {suite}'s slowest tests | seconds |", "| --- | --- |"]
        lines += [f"| `{test}` | {seconds:.1f} |" for seconds, test in rows]
    return "\n".join(lines)


def run() -> str:
    root = Path(__file__).resolve().parents[1]
    # mypy from an empty cache, as in CI's fresh clone: a working tree's cache made it 2 s against 65
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        done = subprocess.run(["make", "test"], cwd=root, capture_output=True, text=True, check=False,
                              env={**os.environ, "MYPY_CACHE_DIR": cache})
        wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"make test failed (exit {done.returncode}); its output ends:\n{done.stdout[-3000:]}")
    return tables(wall, done.stdout)
