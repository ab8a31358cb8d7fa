"""The engine on the image classifiers of torchvision, timm and Hugging Face transformers (enumerated by
``tests.model_libraries``, built small, random, perturbed, float64, eval), two seeded images each:

(a) ``gradient`` against the plain autograd input gradient (relative max error), for the predicted class;
(b) ``deeplift`` completeness: each map's sum against f(x)[t] - f(0)[t], relative to |f(x)[t]|;
(c) ``lrp-epsilon`` maps finite; (d) the model's state_dict, training flags and hooks unchanged.

A model is ``exact`` (a, b <= 1e-8, c, d hold), ``inexact`` (ran, failed a check), ``refused`` (an
AttributionError), ``crash`` (any other error) or ``skipped`` (not enumerated, or over the time limit).
Each model runs in a forked child, so a hang, a crash of the interpreter or its memory ends with it.

    python -m benchmarks.model_libraries [--library torchvision|timm|hf] [--limit N] [--out FILE.csv]
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import multiprocessing
import os
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict

import torch
from torch import nn

from attributions.errors import AttributionError
from attributions.explainer import Explainer
from benchmarks.timing import table
from tests.model_libraries import LIBRARIES, Entry, count, enumerate_models

TOLERANCE = 1e-8
BATCH = 2
FIELDS = ("library", "name", "class", "stage", "reason", "model_class", "params", "input", "build_s", "run_s",
          "gradient_err", "deeplift_err", "lrp_finite", "unchanged", "logit_max", "gradient_max", "note")
HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def snapshot(model: nn.Module) -> tuple:
    """What an explainer must leave as it found it: a digest of every state_dict tensor, each module's training
    flag and hook counts (and the global hooks), each parameter's requires_grad and whether it has a grad."""
    digest = hashlib.blake2b()
    for name, t in model.state_dict().items():
        digest.update(name.encode())
        digest.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())  # hashed in place, no copy
    modules = tuple((m.training, *(len(getattr(m, h)) for h in HOOKS)) for m in model.modules())
    global_hooks = tuple(len(getattr(torch.nn.modules.module, f"_global{h}")) for h in HOOKS)
    params = tuple((p.requires_grad, p.grad is None) for p in model.parameters())
    return digest.hexdigest(), modules, global_hooks, params


def relative(error: torch.Tensor, scale: torch.Tensor) -> float:
    return float(error.abs().max() / scale.abs().max().clamp_min(torch.finfo(scale.dtype).tiny))


def check(entry: Entry, row: dict, seed: int = 0) -> None:
    """Run checks (a) to (d) on ``entry``, filling ``row`` as they go (``stage`` names the one running)."""
    row["stage"] = "build"
    start = time.perf_counter()
    model = entry.perturb(entry.build(), seed)
    row.update(params=count(model), build_s=round(time.perf_counter() - start, 2), model_class=type(model).__name__)
    x = torch.randn(BATCH, *entry.input_shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rows = torch.arange(BATCH)
    before = snapshot(model)
    row["stage"] = "reference"
    with torch.no_grad():  # the predicted class: a random one may sit at zero behind a final ReLU (SqueezeNet)
        target = model(x).argmax(1)
    xg = x.clone().requires_grad_()
    plain = torch.autograd.grad(model(xg)[rows, target].sum(), xg)[0]
    with torch.no_grad():
        fx, f0 = model(x)[rows, target], model(torch.zeros_like(x))[rows, target]
    row.update(logit_max=float(fx.abs().max()), gradient_max=float(plain.abs().max()))
    row["stage"] = "gradient"
    maps = Explainer(model, "gradient").attribute(x, target=target).detach()
    row["gradient_err"] = relative(maps - plain, plain)
    row["stage"] = "deeplift"
    sums = Explainer(model, "deeplift").attribute(x, target=target).detach().reshape(BATCH, -1).sum(1)
    row["deeplift_err"] = float(((sums - (fx - f0)).abs() / fx.abs().clamp_min(torch.finfo(fx.dtype).tiny)).max())
    row["stage"] = "lrp-epsilon"
    row["lrp_finite"] = bool(torch.isfinite(Explainer(model, "lrp-epsilon").attribute(x, target=target)).all())
    row["unchanged"] = snapshot(model) == before
    row["stage"] = ""


def verdict(row: dict) -> tuple[str, str]:
    """(class, reason) of a row whose checks all ran."""
    failed = [] if row["gradient_max"] > 0 else ["the input gradient is zero: the checks are void"]
    failed += [f"{k} {row[k]:.1e} > {TOLERANCE:.0e}" for k in ("gradient_err", "deeplift_err") if not row[k] <= TOLERANCE]
    failed += [] if row["lrp_finite"] else ["lrp-epsilon maps not finite"]
    failed += [] if row["unchanged"] else ["model changed"]
    return ("inexact", "; ".join(failed)) if failed else ("exact", "")


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _child(entry: Entry, seed: int, pipe) -> None:
    torch.set_num_threads(1)
    row: dict = {}
    try:
        check(entry, row, seed)
        row["class"], row["reason"] = verdict(row)
    except AttributionError as exc:
        row.update({"class": "refused", "reason": first_line(exc)})
    except Exception as exc:  # any other failure is the engine's (or the library's) crash: keep its type
        row.update({"class": "crash", "reason": f"{type(exc).__name__}: {first_line(exc)}"})
    pipe.send(row)


def run_one(entry: Entry, seed: int = 0, limit: float = 120.0) -> dict:
    """One model's row, checked in a forked child that is killed after ``limit`` seconds."""
    row = {"library": entry.library, "name": entry.name, "params": entry.params, "note": entry.note,
           "input": "x".join(map(str, entry.input_shape))}
    context = multiprocessing.get_context("fork")  # the child inherits the entry's builder closure
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(entry, seed, send), daemon=True)
    start = time.perf_counter()
    child.start()
    send.close()
    try:
        row |= receive.recv() if receive.poll(limit) else {"class": "skipped", "reason": f"over the {limit:.0f} s limit"}
    except EOFError:  # the child died without a word: killed for memory, or a crash in native code
        child.join()
        row |= {"class": "crash", "reason": f"the child process died (exit code {child.exitcode})"}
    if child.is_alive():
        child.kill()
    child.join()
    return row | {"run_s": round(time.perf_counter() - start, 1)}


def reason_group(row: dict, words: int = 16) -> str:
    """A reason's first words with what differs between models masked (the model's names, node and module
    paths, numbers and numbered names), so that one cause met in many models groups as one."""
    text = row["reason"].split(" Supported:")[0]  # the engine's list of what it supports is the same everywhere
    for name in {row["name"], row.get("model_class") or row["name"]}:
        text = re.sub(rf"\b{re.escape(name)}\b", "…", text)
    text = re.sub(r"\b(node|module) '[^']*'|'[^' ]*\.[^' ]*'|\(module [^)]*\)?", "…", text)
    text = re.sub(r"\b\w*_\w*\d\w*\b|\b\d[\d.e+x-]*\b", "…", text)  # getitem_6, vit_base_patch16_224, 3x28x28, 1e-08
    return " ".join(text.split()[:words])


def summary(library: str, rows: list[dict]) -> str:
    classes = Counter(r["class"] for r in rows)
    out = [f"{library}: {len(rows)} models",
           table([(c, classes[c]) for c in ("exact", "inexact", "refused", "crash", "skipped")], ("class", "models"))]
    groups: dict[tuple, list[str]] = defaultdict(list)
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
            rows = [{"library": library, "name": n, "class": "skipped", "stage": "enumerate", "reason": why}
                    for n, why in listing.skipped.items()]
            entries = listing.entries[:args.limit]
            for i, entry in enumerate(entries, 1):
                row = run_one(entry, args.seed, args.timeout)
                print(f"[{library} {i}/{len(entries)}] {entry.name}: {row['class']} ({row['run_s']} s) {row['reason']}",
                      file=sys.stderr, flush=True)
                rows.append(row)
                writer.writerow(row)
                f.flush()
            writer.writerows(rows[:len(listing.skipped)])
            print(summary(library, rows) + "\n", flush=True)
    print(f"total {time.perf_counter() - start:.0f} s; rows in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
