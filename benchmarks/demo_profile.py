"""Where ``make demo``'s time goes: the demo run as a new user runs it (``python -m audit demo`` in a fresh process,
its output to a pipe, so that it prints one plain line per unit and per report stage), timed from outside, and its
lines read back: the seconds of each check's units per model, each report stage's, and the rest (the interpreter,
the imports, loading the models and twins, planning, the looks' decisions).
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

UNIT = re.compile(r"^([^/\s]+)/([\w-]+)/[^:@\s]+(@\S+)?: .*\((\d+\.\d+) s; ")
STAGE = re.compile(r"^report: (.+) \((\d+\.\d+) s\)$")
BUDGET = 120.0  # seconds: make demo on 2 cores


def profile(out: Path) -> tuple[float, str]:
    """Run the demo into ``out``; (its wall-clock seconds, what it printed)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "audit", "demo", "--out", str(out)], capture_output=True, text=True,
                          check=True)
    return time.perf_counter() - start, done.stdout


def tables(wall: float, printed: str) -> str:
    """The profile's Markdown: the wall time against the budget, the units' seconds per check and model, the report's
    stages, and the rest."""
    units: dict[tuple[str, str], list[float]] = defaultdict(list)
    stages: list[tuple[str, float]] = []
    for line in printed.splitlines():
        if unit := UNIT.match(line):
            units[(unit[2], unit[1])].append(float(unit[4]))
        elif stage := STAGE.match(line):
            name = re.sub(r" to /\S+", "", stage[1]).split(" (")[0]
            name = "PDF passes" if name.startswith("PDF pass") else "text files written" if "," in name else name
            stages.append((name, float(stage[2])))
    in_units = sum(sum(v) for v in units.values())
    merged: dict[str, float] = defaultdict(float)
    for name, seconds in stages:
        merged[name] += seconds
    in_report = sum(merged.values())
    lines = [f"`python -m audit demo`: **{wall:.0f} s** wall (the budget: {BUDGET:.0f} s on 2 cores): "
             f"{in_units:.0f} s in the checks' units, {in_report:.0f} s building the report, {wall - in_units - in_report:.0f} s "
             "the rest (the interpreter and imports, loading the models and twins, planning, the looks' decisions).", "",
             "| check | model | units | seconds | share of the wall time |", "| --- | --- | --- | --- | --- |"]
    for (check, model), each in sorted(units.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {check} | {model} | {len(each)} | {sum(each):.1f} | {sum(each) / wall:.0%} |")
    lines += ["", "| report stage | seconds |", "| --- | --- |"]
    lines += [f"| {name} | {seconds:.1f} |" for name, seconds in merged.items()]
    return "\n".join(lines)


def run() -> str:
    with tempfile.TemporaryDirectory() as scratch:
        wall, printed = profile(Path(scratch) / "demo")
    return tables(wall, printed)
