"""Run benchmarks, print their tables and write each to ``--out`` as a Markdown fragment that the docs'
speed page includes, headed by the date, the commit, the machine and the command that made it.

``python -m benchmarks [--out DIR] [NAME ...]``: the names are modules of this package with a ``run() -> str``
(default: those that need only the toolkit's own venv; ``library_costs`` and ``transformer_lrp`` need timm,
torchvision and LXT, ``make bench`` runs them in ``.venv-libraries``).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from audit.atomic import atomic_write_bytes

DEFAULT = ("engine", "audit_speed", "architectures", "distributed", "power", "twins", "operating_curve",
           "shipped_verdicts", "shortcut_outcomes", "demo_profile", "suite_times")
LIBRARIES = ("library_costs", "transformer_lrp", "twins_library")  # need timm, torchvision and LXT: run in .venv-libraries


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False).stdout.strip()
    sha = git("rev-parse", "--short", "HEAD") or "unknown"
    # the tables this run has written so far are not changes to the code measured
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/benchmarks")
    return sha + (" with uncommitted changes" if changed else "")


def _cpu() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{os.cpu_count()} cores ({model})"


def header(name: str) -> str:
    """Where a result comes from: date, commit, machine, torch, command."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"<!-- written by `make bench` ({name}); regenerate, do not edit -->\n"
            f"Measured {now} at commit {_commit()} on {_cpu()}, torch {torch.__version__}; "
            f"`python -m benchmarks {name}` in {Path(sys.prefix).name}.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=list(DEFAULT), help=f"benchmark modules (default: {' '.join(DEFAULT)})")
    parser.add_argument("--out", type=Path, help="folder for one Markdown file per benchmark (docs/_bench)")
    args = parser.parse_args(argv)
    for name in args.names:
        print(f"--- {name} ---", flush=True)
        run = importlib.import_module(f"benchmarks.{name}").run
        # a benchmark that draws a figure takes the folder to write it to
        text = run(args.out) if "out" in inspect.signature(run).parameters else run()
        print(text + "\n", flush=True)
        if args.out is not None:
            atomic_write_bytes(args.out / f"{name}.md", (header(name) + "\n" + text.rstrip() + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
