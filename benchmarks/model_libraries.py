"""The engine on the image classifiers of torchvision, timm and Hugging Face transformers (enumerated by
``tests.model_libraries``, built small, random, perturbed, float64, eval), two seeded images each:

the checks of ``tests.model_libraries.check``: (a) ``gradient`` = autograd, (b) ``deeplift`` complete,
(c) ``lrp-epsilon`` (with ``--all-methods``: every method) finite and deterministic, (d) the model unchanged
and none of its hooks called.

A model is ``exact`` (a, b <= 1e-8, c, d hold), ``inexact`` (ran, failed a check), ``refused`` (an
AttributionError), ``crash`` (any other error) or ``skipped`` (not enumerated, or over the time limit).
Each model runs in a forked child, so a hang, a crash of the interpreter or its memory ends with it.
The test suite runs the same checks (``tests/test_model_libraries.py``); this sweep also times them.

    python -m benchmarks.model_libraries [--library torchvision|timm|hf] [--limit N] [--out FILE.csv]
        [--all-methods] [--parallel N]
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from typing import Any

import torch

from attributions.methods import BUILDERS
from benchmarks.timing import table
from tests.model_libraries import LIBRARIES, check_all, enumerate_models

FIELDS = ("library", "name", "class", "stage", "reason", "model_class", "params", "input", "nodes", "build_s",
          "capture_s", "run_s", "tolerance", "gradient_err", "deeplift_err", "failing", "unchanged", "hook_calls", "logit_max",
          "gradient_max", "note")


def reason_group(row: dict[str, Any], words: int = 16) -> str:
    """A reason's first words with what differs between models masked (the model's names, node and module
    paths, numbers and numbered names), so that one cause met in many models groups as one."""
    text = row["reason"].split(" Supported:")[0]  # the engine's list of what it supports is the same everywhere
    for name in {row["name"], row.get("model_class") or row["name"]}:
        text = re.sub(rf"\b{re.escape(name)}\b", "…", text)
    text = re.sub(r"\b(node|module) '[^']*'|'[^' ]*\.[^' ]*'|\(module [^)]*\)?", "…", text)
    text = re.sub(r"\b\w*_\w*\d\w*\b|\b\d[\d.e+x-]*\b", "…", text)  # getitem_6, vit_base_patch16_224, 3x28x28, 1e-08
    return " ".join(text.split()[:words])


def summary(library: str, rows: list[dict[str, Any]]) -> str:
    classes = Counter(r["class"] for r in rows)
    out = [f"{library}: {len(rows)} models",
           table([(c, classes[c]) for c in ("exact", "inexact", "refused", "crash", "skipped")], ("class", "models"))]
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in rows:
        if r["class"] != "exact":
            groups[(r["class"], r.get("stage", ""), reason_group(r))].append(r["name"])
    if groups:
        ranked = sorted(groups.items(), key=lambda g: (g[0][0], -len(g[1])))
        out.append(table([(c, s, g, len(n), ", ".join(n[:3]) + (", …" if len(n) > 3 else "")) for (c, s, g), n in ranked],
                         ("class", "stage", "reason (first words)", "models", "e.g.")))
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", choices=LIBRARIES, action="append", help="repeatable; default: all three")
    parser.add_argument("--limit", type=int, default=None, help="the first N models of each library")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "model_libraries.csv"))
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all-methods", action="store_true", help="check every method finite and deterministic "
                        "(default: lrp-epsilon only)")
    parser.add_argument("--parallel", type=int, default=1, help="models checked at once (one thread each)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a correctness sweep: one thread is deterministic and leaves the machine's others be
    start = time.perf_counter()
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS, extrasaction="ignore")
        writer.writeheader()
        for library in args.library or ("torchvision", "hf", "timm"):
            began = time.perf_counter()
            listing = enumerate_models(library)
            print(f"{library}: {len(listing.entries)} models, {len(listing.skipped)} skipped, enumerated in "
                  f"{time.perf_counter() - began:.0f} s", file=sys.stderr)
            rows: list[dict[str, Any]] = [{"library": library, "name": n, "class": "skipped", "stage": "enumerate", "reason": why}
                                          for n, why in listing.skipped.items()]
            entries = listing.entries[:args.limit]

            def report(i: int, row: dict[str, Any], n: int = len(entries)) -> None:
                print(f"[{row['library']} {i + 1}/{n}] {row['name']}: {row['class']} ({row['run_s']} s) {row['reason']}",
                      file=sys.stderr, flush=True)
                writer.writerow(row)
                f.flush()
            rows += check_all(entries, args.seed, tuple(BUILDERS) if args.all_methods else (), args.timeout,
                              args.parallel, report)
            writer.writerows(rows[:len(listing.skipped)])
            print(summary(library, rows) + "\n", flush=True)
    print(f"total {time.perf_counter() - start:.0f} s; rows in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
