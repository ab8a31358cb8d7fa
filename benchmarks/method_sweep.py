"""Every method on every enumerated library model: a map of the input's shape, or the toolkit's refusal.

The models are those the model-library suite enumerates (:mod:`tests.model_libraries`: torchvision, timm and
Hugging Face transformers, the smallest of each structure, built small, random, perturbed, float64, eval),
two seeded images each, explained for their predicted class by every registered method. Each (model,
method) cell is

* ``exact``: a finite map of the input's shape (B, C, H, W), the same bit for bit when computed again, the
  model unchanged; where the method promises a number, that number within :data:`TOLERANCE` (the
  gradient equals autograd's, DeepLIFT's and RevealCancel's maps sum to f(x) - f(x0));
* ``refused``: the toolkit's :class:`~attributions.errors.AttributionError`, with its reason (the method
  does not apply to the model, as an attention map on a CNN, or the capture has no rule for an op);
* ``failed``: anything else: a map of another shape, not finite, not deterministic, a broken promise, a
  raw exception, a crash of the process or the time limit.

Each model runs in a forked child of its own under a time limit (a hang or a crash ends with it).

    python -m benchmarks.method_sweep [--library torchvision|timm|hf] [--models a,b] [--limit N]
        [--out DIR] [--parallel N] [--timeout S] [--publish FOLDER] [--retry] [--redo METHODS]
        [--fresh] [--only-publish]

writes DIR/sweep.csv (one row per model x method) and prints the summary; ``--publish FOLDER`` also writes
sweep.csv, summary.md and sweep.json (date, commit, command, counts) as the documentation shows them.
``make sweep`` runs it in full.
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch

from attributions.methods import BUILDERS, build_method
from benchmarks.model_libraries import reason_group
from benchmarks.timing import head_commit, table

OUTCOMES = ("exact", "refused", "failed")
COLUMNS = ("library", "model", "family", "method", "outcome", "reason", "error", "seconds")
# the methods whose maps promise a number the sweep computes another way: the gradient autograd's, the sums
# of the exact DeepLIFT rules the output difference (integrated gradients' sum is a quadrature's, not exact)
PROMISES = {"gradient": "autograd", "deeplift": "difference", "deeplift-revealcancel": "difference"}


def _params(method: str, entry: Any, seed: int, dtype: torch.dtype) -> dict[str, Any]:
    """The method's parameters in the sweep: the costly ones' sample counts cut (a map's shape and finiteness
    do not depend on them), the pattern methods fitted on images of their own."""
    from audit.run.patterns import PATTERN_METHODS
    from tests.model_libraries import CHEAP, PATTERN_IMAGES

    if method in PATTERN_METHODS:  # two images leave a dense layer's covariances degenerate
        return {"data": torch.randn(PATTERN_IMAGES, *entry.input_shape, dtype=dtype,
                                    generator=torch.Generator().manual_seed(seed + 1))}
    return dict(CHEAP.get(method, {}))


def cell(model: torch.nn.Module, graph: Any, x: torch.Tensor, target: torch.Tensor, method: str,
         params: dict[str, Any], *, reference: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """One (model, method) cell: ``{"outcome", "reason", "error"}``.

    Parameters
    ----------
    model, graph : the model and its captured graph for inputs like ``x``
    x : (B, C, H, W) the images; ``target`` (B,) their classes
    reference : ``plain`` (B, C, H, W) autograd's input gradient, ``difference`` (B,) f(x) - f(0) for the
        targets, ``scale`` (B,) what a sum's error is relative to (each image's largest |logit|, at least 1), ``tolerance`` the
        relative error a promise keeps
    """
    from attributions.errors import AttributionError
    from attributions.explainer import Explainer
    from tests.model_libraries import relative, snapshot

    before = snapshot(model)
    try:
        probe = Explainer(model, method, graph=graph, **params)
        why = probe.method.engine.fits(probe, x)
        if why is not None:
            return {"outcome": "refused", "reason": why, "error": None}
        maps = []
        for _ in range(2):  # same seed, same numbers: a fresh explainer each time (noise draws afresh per call)
            torch.manual_seed(seed)
            maps.append(Explainer(model, method, graph=graph, **params).attribute(x, target=target).detach())
    except AttributionError as exc:
        return {"outcome": "refused", "reason": str(exc).splitlines()[0], "error": None}
    except Exception as exc:  # the engine's own failure: a raw exception is never an answer
        return {"outcome": "failed", "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                "error": None}
    first, again = maps
    problems, error = [], None
    if first.shape != x.shape:
        problems.append(f"a map of shape {tuple(first.shape)} for inputs of shape {tuple(x.shape)}")
    elif not torch.isfinite(first).all():
        problems.append("not finite")
    elif not torch.equal(first, again):
        problems.append("not the same bit for bit when computed again")
    elif PROMISES.get(method) == "autograd":
        error = relative(first - reference["plain"], reference["plain"])
    elif PROMISES.get(method) == "difference":
        sums = first.reshape(len(x), -1).sum(1)
        error = float(((sums - reference["difference"]).abs() / reference["scale"]).max())
    if error is not None and not error <= reference["tolerance"]:
        problems.append(f"{PROMISES[method]} missed by {error:.1e} > {reference['tolerance']:.0e}")
    if snapshot(model) != before:
        problems.append("the model changed")
    return {"outcome": "failed" if problems else "exact", "reason": "; ".join(problems), "error": error}


def _work(entry: Any, row: dict[str, Any], seed: int, methods: tuple[str, ...], budget: int | None = None) -> None:
    """The sweep's job in a forked child (``tests.model_libraries.check_all``): build, perturb, capture,
    then every cell, the passes held to ``budget`` bytes. A refusal at capture refuses every method."""
    from attributions import memory
    from attributions.graph import trace
    from audit.models.cautions import narrowed_dtypes
    from tests.model_libraries import BATCH, FLOAT32_TOLERANCE, TOLERANCE

    model = entry.perturb(entry.build(), seed)
    x = torch.randn(BATCH, *entry.input_shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rows = torch.arange(len(x))
    xg = x.clone().requires_grad_()
    logits = model(xg)
    target = logits.detach().argmax(1)
    plain = torch.autograd.grad(logits[rows, target].sum(), xg)[0]
    fx = logits.detach()[rows, target]
    with torch.no_grad():
        f0 = model(torch.zeros_like(x))[rows, target]
    # a sum's error relative to the image's largest |logit|, and absolute under 1: the explained logit may sit at zero
    # behind a final ReLU (SqueezeNet), every logit may (a void check, rounding's 1e-16 then no relative error)
    scale = logits.detach().abs().amax(1).clamp_min(1.0)
    reference = {"plain": plain, "difference": fx - f0, "scale": scale,
                 "tolerance": FLOAT32_TOLERANCE if narrowed_dtypes(model, x[:1]) else TOLERANCE}
    row["stage"] = "capture"
    graph = trace(model, x)
    row["cells"] = {}
    with memory.limit(budget):
        for method in methods:
            row["stage"] = method
            start = time.perf_counter()
            row["cells"][method] = cell(model, graph, x, target, method, _params(method, entry, seed, x.dtype),
                                        reference=reference, seed=seed) | {"seconds": round(time.perf_counter() - start, 2)}
    row["stage"] = ""


def _judge(row: dict[str, Any]) -> tuple[str, str]:
    return "swept", ""


def rows_of(r: dict[str, Any], methods: tuple[str, ...]) -> list[dict[str, Any]]:
    """The sweep's rows (one per method) of one model's result from ``check_all``: a model refused at capture
    refuses every method with that reason; one that crashed or went over the time limit fails every method
    it did not finish."""
    base = {"library": r["library"], "model": r["name"], "family": r.get("note", "").removeprefix("module ")}
    cells = r.get("cells", {})
    out = []
    for method in methods:
        if method in cells:
            out.append(base | {"method": method} | cells[method])
            continue
        outcome = "refused" if r["class"] == "refused" else "failed"
        where = f" (at {r['stage']})" if r.get("stage") else ""
        out.append(base | {"method": method, "outcome": outcome, "reason": f"{r['class']}{where}: {r['reason']}",
                           "error": None, "seconds": None})
    return out


def sweep(entries: list[Any], methods: tuple[str, ...], seed: int = 0, parallel: int = 2, limit: float = 900.0,
          report: Any = None) -> list[dict[str, Any]]:
    """Every (entry, method) row, each entry in a forked child of its own, ``parallel`` at once;
    ``report(i, result, rows)`` is called as each entry finishes, with its rows."""
    from audit.host import available_bytes  # where it is defined: audit.run.resources does not re-export it
    from tests.model_libraries import check_all

    def each(i: int, r: dict[str, Any]) -> None:
        if report is not None:
            report(i, r, rows_of(r, methods))

    # the children at once share half of the memory free now
    work = functools.partial(_work, budget=max(1, available_bytes(torch.device("cpu")) // (2 * parallel)))
    return [row for r in check_all(entries, seed, methods, limit, parallel, each, work=work, judge=_judge)
            for row in rows_of(r, methods)]


def _short(row: dict[str, Any]) -> str:
    """A reason as the summary groups it (:func:`benchmarks.model_libraries.reason_group`)."""
    return reason_group({"name": row["model"], "reason": str(row.get("reason") or "")}, words=18)


def summary(rows: list[dict[str, Any]]) -> str:
    """The sweep's counts as markdown: models x methods by outcome per library, then each refusal's and each
    failure's reason (grouped over the models it met) with its methods and an example model."""
    libraries = list(dict.fromkeys(r["library"] for r in rows))
    counts = Counter((r["library"], r["outcome"]) for r in rows)
    models = {lib: len({r["model"] for r in rows if r["library"] == lib}) for lib in libraries}
    methods = len({r["method"] for r in rows})
    lines = [table([(lib, models[lib], methods, *(counts[(lib, o)] for o in OUTCOMES)) for lib in libraries]
                   + [("all", sum(models.values()), methods, *(sum(counts[(lib, o)] for lib in libraries)
                                                              for o in OUTCOMES))],
                   ("library", "models", "methods", *OUTCOMES))]
    for outcome in ("failed", "refused"):
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            if r["outcome"] == outcome:
                groups[_short(r)].append(r)
        if not groups:
            lines.append(f"No cell {outcome}.")
            continue
        ranked = sorted(groups.items(), key=lambda g: -len(g[1]))
        lines.append(f"**{outcome.capitalize()}**, by reason:\n\n" + table(
            [(reason.replace("|", "\\|"), len(cells), len({c["model"] for c in cells}),
              ", ".join(sorted({c["method"] for c in cells}))[:90], f"{cells[0]['library']} {cells[0]['model']}")
             for reason, cells in ranked],
            ("reason (first words)", "cells", "models", "methods", "e.g.")))
    return "\n\n".join(lines)


def publish(rows: list[dict[str, Any]], folder: Path, command: str, limit: float, enumerated: dict[str, int]) -> None:
    """The sweep as the documentation shows it, written atomically into ``folder``: sweep.csv, summary.md and
    sweep.json (the date, the commit, the command that regenerates them, the time limit, the models each
    library enumerates (``enumerated``) and the counts)."""
    import datetime
    import json

    import pandas as pd

    from audit.atomic import atomic_write_bytes

    commit = head_commit()
    about = {"date": datetime.date.today().isoformat(), "commit": commit, "command": command, "limit_s": limit,
             "enumerated": enumerated,
             "models": len({(r["library"], r["model"]) for r in rows}), "methods": len({r["method"] for r in rows}),
             "cells": dict(Counter(r["outcome"] for r in rows))}
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / "sweep.csv", pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False).encode())
    atomic_write_bytes(folder / "summary.md", (summary(rows) + "\n").encode())
    atomic_write_bytes(folder / "sweep.json", (json.dumps(about, indent=1) + "\n").encode())


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    """Add ``rows`` to the csv at ``path`` (its header written first when it is new)."""
    import csv

    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)


def _read(path: Path, methods: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows kept at ``path`` (none when it is missing) of the models swept with every one of ``methods``."""
    import csv

    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    have: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in rows:
        have[(r["library"], r["model"])].add(r["method"])
    return [r for r in rows if have[(r["library"], r["model"])] >= set(methods)]


def _parser(libraries: tuple[str, ...]) -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--library", choices=libraries, action="append", help="repeatable; default: all three")
    parser.add_argument("--models", default="", help="comma-separated model names: these only")
    parser.add_argument("--limit", type=int, default=None, help="the first N models of each library")
    parser.add_argument("--methods", default="", help="comma-separated methods (default: every registered one)")
    parser.add_argument("--out", default="sweep", help="folder for sweep.csv")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per model, all its methods")
    parser.add_argument("--parallel", type=int, default=2, help="models swept at once (one thread each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--publish", default="", help="also write sweep.csv, summary.md and sweep.json into this "
                        "folder, as the documentation shows them")
    parser.add_argument("--fresh", action="store_true", help="sweep every model again (default: keep the rows of "
                        "the models DIR/sweep.rows.csv holds)")
    parser.add_argument("--retry", action="store_true", help="sweep again the models a crash or the time limit "
                        "stopped (default: keep their cells, failed)")
    parser.add_argument("--redo", default="", help="comma-separated methods swept again on the models already swept "
                        "(their cells replaced)")
    parser.add_argument("--only-publish", action="store_true", help="sweep nothing: summarise and publish the rows "
                        "DIR/sweep.rows.csv holds (the models not swept yet are counted as enumerated, not swept)")
    return parser


def _resumed(kept: Path, methods: tuple[str, ...], *, fresh: bool, retry: bool, published: str) -> list[dict[str, Any]]:
    """The rows kept from earlier sweeps in ``kept`` (none when ``fresh``; a fresh checkout's are the ``published``
    folder's), without the models a crash or the time limit stopped when ``retry``."""
    if fresh:
        kept.unlink(missing_ok=True)
    elif not kept.exists() and published and (Path(published) / "sweep.csv").exists():
        kept.write_bytes((Path(published) / "sweep.csv").read_bytes())  # a fresh checkout resumes the published
    rows = _read(kept, methods)
    if retry:  # the models a crash or the time limit stopped are swept again, their rows dropped
        stopped = {(r["library"], r["model"]) for r in rows if str(r["reason"]).startswith(("crash", "skipped"))}
        rows = [r for r in rows if (r["library"], r["model"]) not in stopped]
        kept.unlink(missing_ok=True)
        _append(kept, rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    from tests.model_libraries import LIBRARIES, distinct, enumerate_models, warm, within

    args = _parser(LIBRARIES).parse_args(argv)
    methods = tuple(m for m in args.methods.split(",") if m) or tuple(BUILDERS)
    for m in methods:
        build_method(m)  # an unknown name stops here, with the registry's list
    chosen = {m for m in args.models.split(",") if m}
    redo = tuple(m for m in args.redo.split(",") if m)
    for m in redo:
        build_method(m)
    torch.set_num_threads(1)  # a correctness sweep: one thread is deterministic and leaves the machine's others be
    warm()
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kept = out / "sweep.rows.csv"  # each model's rows as it finishes: a rerun sweeps only the models missing
    rows = _resumed(kept, methods, fresh=args.fresh, retry=args.retry, published=args.publish)
    done = {(r["library"], r["model"]) for r in rows}
    enumerated = {}
    for library in args.library or LIBRARIES:
        listing = enumerate_models(library)
        entries = [e for e in distinct(within(listing.entries)) if not chosen or e.name in chosen][:args.limit]
        enumerated[library] = len(entries)
        todo = [] if args.only_publish else [e for e in entries if (library, e.name) not in done]
        print(f"{library}: {len(entries)} models x {len(methods)} methods ({len(entries) - len(todo)} swept before)",
              file=sys.stderr, flush=True)

        def report(i: int, r: dict[str, Any], new: list[dict[str, Any]], n: int = len(todo),
                   library: str = library) -> None:
            counts = Counter(c["outcome"] for c in new)
            print(f"[{library} {i + 1}/{n}] {r['name']}: {r['run_s']} s, {dict(counts)} {r.get('reason', '')[:100]}",
                  file=sys.stderr, flush=True)
            _append(kept, new)
        rows += sweep(todo, methods, args.seed, args.parallel, args.timeout, report)
        again = [e for e in entries if (library, e.name) in done] if redo and not args.only_publish else []
        if again:  # the methods named in --redo swept again on the models kept, their rows replaced
            print(f"{library}: {', '.join(redo)} again on {len(again)} models", file=sys.stderr, flush=True)
            new = sweep(again, redo, args.seed, args.parallel, args.timeout)
            replaced = {(r["library"], r["model"], r["method"]) for r in new}
            rows = [r for r in rows if (r["library"], r["model"], r["method"]) not in replaced] + new
            kept.unlink(missing_ok=True)
            _append(kept, rows)
    rows = [r for r in rows if r["method"] in methods]
    import pandas as pd

    from audit.atomic import atomic_write_bytes

    atomic_write_bytes(out / "sweep.csv", pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False).encode())
    if args.publish:
        publish(rows, Path(args.publish), "python -m benchmarks.method_sweep " + " ".join(
            argv if argv is not None else sys.argv[1:]), args.timeout, enumerated)
    print(summary(rows))
    print(f"total {time.perf_counter() - start:.0f} s; rows in {out / 'sweep.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
