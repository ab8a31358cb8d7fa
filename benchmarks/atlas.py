"""The collapse atlas: where each chain method's backward signal reaches the input, how close to rank 1 it
is, across every architecture family the engine captures.

For each model (one small timm model per architecture module, random initialisation with perturbed
parameters, float64, two seeded inputs; and the shipped trained checkpoints on the embedded sample) and
each chain method (a rule chain, or a product of per-block operators such as attention rollout), CSC
injects K Gaussian vectors at the logits (for a product chain: over the class token's row) and reports
the median |cos| where the chain arrives at the input, the largest median on the way down and
sigma2 / sigma1 of the K signals there. PatternNet and PatternAttribution are fitted on 16 more Gaussian
images drawn as the inputs (two would leave a dense layer's covariances degenerate), on the shipped
checkpoints on 256 images of the sample's training part. Sixt et al.'s theorem says which chains must collapse whatever
the weights (non-negative chains: the z+ family, DeepLIFT-Ablation, rollout); the atlas measures which
architectures (LayerNorm, attention, gating) break or keep it.

    python -m benchmarks.atlas [--fast] [--out DIR] [--parallel N] [--limit SECONDS] [--redo METHODS] [--retry]
                               [--publish FOLDER] [--fresh]

writes DIR/atlas.csv (one row per model x method) and DIR/atlas.png (``--publish FOLDER``: also a small copy of
both with their provenance, as the documentation shows them); ``make atlas`` runs it in full. Each
model's rows are kept in DIR/atlas.rows.csv as it finishes, and a rerun on DIR measures only the models
not measured, refused or over the time limit in it (``--retry`` tries those over it again; ``--fresh`` starts
over; ``--redo a,b`` measures methods a and b again on
the models measured): the full atlas takes hours on 2 cores.
"""
from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import torch

from attributions.errors import AttributionError
from attributions.methods import BUILDERS, build_method
from benchmarks.timing import head_commit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tests.model_libraries import Entry

COLUMNS = ["source", "model", "family", "method", "method_family", "csc_at_input", "csc_max", "baseline",
           "sigma2_over_sigma1", "collapsed", "status", "reason"]
FAST_MODELS = ["test_resnet", "test_vit"]
FAST_METHODS = ["gradient", "lrp-zplus", "deeplift", "attention-rollout"]
PATTERN_IMAGES = 16  # the pattern methods' fit on a library model; the shipped ones use their training images
SHIPPED_PATTERN_IMAGES = 256


def chain_methods() -> list[str]:
    """Every registered method with a backward chain CSC can follow, in registry order."""
    return [m for m in BUILDERS if build_method(m).chain or build_method(m).engine.product]


def collapse(model: torch.nn.Module, x: torch.Tensor, methods: list[str], threshold: float = 0.99,
             patterns: tuple[torch.Tensor, str] | None = None) -> list[dict[str, Any]]:
    """One row per method that fits ``model``: CSC from the logits at the input end (see the module docstring).
    ``patterns``: (images, what they are) the pattern methods are fitted on (default: ``x``)."""
    from attributions import Explainer
    from attributions.graph import trace
    from audit.checks.convergence import chain_convergence
    from audit.run.patterns import PATTERN_METHODS

    graph = trace(model, x)
    fitting = []
    for m in methods:
        ex = Explainer(model, m, graph=graph)
        if ex.method.engine.fits(ex, x) is None:
            fitting.append(m)
    if not fitting:
        return []
    given = {m: {"data": patterns[0].to(x), "source": patterns[1]} for m in PATTERN_METHODS} if patterns else {}
    df = chain_convergence(model, x, None, fitting, inject_at=[graph.output], threshold=threshold, progress=False,
                           params=given)
    rows = []
    for method, part in df[df.is_logits.astype(bool)].groupby("method", sort=False):
        part = part.dropna(subset=["median"]).sort_values("depth")
        if part.empty:
            continue
        first = part.iloc[0]
        rows.append({"method": method, "method_family": build_method(cast(str, method)).family,  # grouped by a str column
                     "csc_at_input": float(first["median"]), "csc_max": float(part["median"].max()),
                     "baseline": float(first["baseline"]), "sigma2_over_sigma1": float(first["sigma2_over_sigma1"]),
                     "collapsed": bool(part["median"].max() >= threshold)})
    return rows


def _work(entry: Entry, row: dict[str, Any], seed: int, methods: tuple[str, ...], budget: int | None = None) -> None:
    """The atlas's job in a forked child (``tests.model_libraries.check_all``): build, perturb, measure, the
    passes held to ``budget`` bytes (CSC over every chain method of HaloNet took 23 GB without one)."""
    from attributions import memory

    model = entry.perturb(entry.build(), seed)
    x = torch.randn(2, *entry.input_shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    # the patterns' own images, drawn as x is: two images leave a dense layer's covariances degenerate
    fit = torch.randn(PATTERN_IMAGES, *entry.input_shape, generator=torch.Generator().manual_seed(seed + 1),
                      dtype=torch.float64)
    with memory.limit(budget):
        row["csc"] = collapse(model, x, list(methods), patterns=(fit, f"{PATTERN_IMAGES} Gaussian images"))


def _judge(row: dict[str, Any]) -> tuple[str, str]:
    return "measured", ""


def _rows_of(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The atlas rows of one model's result from ``check_all``."""
    base = {"source": r["library"], "model": r["name"], "family": r.get("note", "").removeprefix("module ")}
    if r["class"] != "measured":
        return [base | {"status": r["class"], "reason": r.get("reason", "")}]
    return [base | c | {"status": "measured", "reason": ""} for c in r["csc"]]


def library_rows(entries: list[Entry], methods: list[list[str]], *, seed: int = 0, parallel: int = 2, limit: float = 600.0,
                 report: Callable[[int, dict[str, Any]], None] | None = None,
                 finished: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """The atlas rows of library ``entries`` (``tests.model_libraries.Entry``), each model in its own child;
    ``methods``: the methods of each entry; ``finished(rows)`` is called with each model's rows as it finishes."""
    from tests.model_libraries import check_all

    def each(i: int, r: dict[str, Any]) -> None:
        if finished is not None:
            finished(_rows_of(r))
        if report is not None:
            report(i, r)

    from audit.host import available_bytes  # where it is defined: audit.run.resources does not re-export it

    # the children at once share half of the memory free now
    work = functools.partial(_work, budget=max(1, available_bytes(torch.device("cpu")) // (2 * parallel)))
    return [row for r in check_all(entries, seed, [tuple(m) for m in methods], limit, parallel, each, work=work,
                                   judge=_judge)
            for row in _rows_of(r)]


def shipped_rows(methods: list[str], names: list[str] | None = None, n: int = 8) -> list[dict[str, Any]]:
    """The atlas rows of the shipped trained checkpoints, on ``n`` images of the embedded sample."""
    from audit import embedded_sample, load_checkpoint
    from audit.run.patterns import pattern_images

    sample, _ = embedded_sample()
    x = torch.from_numpy(sample[:: max(1, len(sample) // n)][:n])
    # as an audit with pattern_data train: a seeded draw of the sample's own training part
    fit = pattern_images("train", "embedded", SHIPPED_PATTERN_IMAGES, seed=0)
    out = []
    for name in names if names is not None else _shipped_sgd():
        model = load_checkpoint(name)
        base = {"source": "shipped", "model": name, "family": name.split("-")[0]}
        try:
            rows = collapse(model, x.to(next(model.parameters())), methods, patterns=fit)
            out += [base | c | {"status": "measured", "reason": ""} for c in rows]
        except AttributionError as exc:
            out.append(base | {"status": "refused", "reason": str(exc).splitlines()[0]})
    return out


class RowsError(Exception):
    """A kept rows file that cannot be resumed from: what is wrong and where."""


UNIT_COLUMNS = ("csc_at_input", "csc_max", "baseline")  # |cos| statistics: finite, in [0, 1], on a measured row


def read_rows(path: Path) -> pd.DataFrame:
    """The rows kept in ``path`` by an earlier run, checked: a :class:`RowsError` naming the file, the row and the
    value when it is not a CSV of the atlas's columns, or a measured row holds a value no measurement gives."""
    hint = "; delete it or rerun with --fresh to measure every model again"
    try:
        rows = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise RowsError(f"{path}: not a CSV of atlas rows ({type(exc).__name__}: {str(exc).splitlines()[0]})"
                        f"{hint}") from None
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise RowsError(f"{path}: lacks the columns {', '.join(missing)}{hint}")
    measured = rows[rows.status == "measured"]
    for column in UNIT_COLUMNS + ("sigma2_over_sigma1",):
        values = pd.to_numeric(measured[column], errors="coerce")
        bad = values.isna() & (measured[column].notna() | (column in UNIT_COLUMNS)) | (values < 0) | (values > 1 + 1e-9)
        if bad.any():
            line = int(cast(int, bad.idxmax()))  # read_csv's index: a RangeIndex
            raise RowsError(f"{path}: row {line + 2} ({measured.model[line]}, {measured.method[line]}) has {column} = "
                            f"{str(measured[column][line])!r}, not a value in [0, 1]{hint}")
    flags = measured.collapsed.astype(str).str.lower()
    if not flags.isin(["true", "false"]).all():
        line = int(cast(int, (~flags.isin(["true", "false"])).idxmax()))
        raise RowsError(f"{path}: row {line + 2} has collapsed = {measured.collapsed[line]!r}, not True or False{hint}")
    if rows.status.isna().any() or rows.model.isna().any():
        raise RowsError(f"{path}: a row without a model or a status{hint}")
    return rows.assign(collapsed=rows.collapsed.map(lambda v: str(v).lower() == "true" if pd.notna(v) else v))


def atlas(fast: bool = False, *, parallel: int = 2, limit: float = 600.0,
          report: Callable[[int, dict[str, Any]], None] | None = None, keep: Path | None = None,
          redo: list[str] | None = None, retry: bool = False, models: list[str] | None = None) -> pd.DataFrame:
    """The atlas table: every timm architecture module's smallest model (``fast``: two) and the shipped
    checkpoints, every chain method (``fast``: four). ``keep``: a CSV of the rows measured so far, extended
    as each model finishes; the models already in it are not measured again, except for the methods in
    ``redo``, whose rows are measured again on every model measured (``models``: on those named only, after a
    fix that changes what those methods compute on them), and, with ``retry``, those that went over the time
    limit."""
    from audit.atomic import atomic_write_bytes
    from tests.model_libraries import enumerate_models, timm_entries, within

    kept = read_rows(keep) if keep is not None and keep.exists() else pd.DataFrame(columns=COLUMNS)
    # measured or refused models are done, and one over the time limit unless asked (the same limit would
    # cost as long again to refuse it again); one whose child crashed is tried again
    done = set(kept.model[kept.status.isin(["measured", "refused"] + ([] if retry else ["skipped"]))])
    redo = [m for m in redo or [] if m in (FAST_METHODS if fast else chain_methods())]
    again = set(kept.model[kept.status == "measured"]) if redo else set()
    if models is not None:
        unknown = sorted(set(models) - set(kept.model))
        if redo and unknown:
            raise RowsError(f"{keep}: no rows of {', '.join(unknown)} to measure again")
        again &= set(models)
    rows = cast(list[dict[str, Any]],  # the columns are COLUMNS: str keys
                kept[kept.model.isin(done) & ~(kept.model.isin(again) & kept.method.isin(redo))].to_dict("records"))

    def finished(new: list[dict[str, Any]]) -> None:
        rows.extend(new)
        if keep is not None:
            atomic_write_bytes(keep, pd.DataFrame(rows).reindex(columns=COLUMNS).to_csv(index=False).encode())

    methods = FAST_METHODS if fast else chain_methods()
    entries = timm_entries(FAST_MODELS) if fast else within(enumerate_models("timm").entries)
    if not fast:  # one model per architecture module: the smallest
        firsts: dict[str, Entry] = {}
        for e in sorted(entries, key=lambda e: e.params):
            firsts.setdefault(e.note, e)
        entries = list(firsts.values())
    wanted = (lambda name: True) if models is None else set(models).__contains__
    todo = [(e, methods) for e in entries if e.name not in done and wanted(e.name)] + \
        [(e, redo) for e in entries if e.name in again]
    library_rows([e for e, _ in todo], [list(m) for _, m in todo], parallel=parallel, limit=limit, report=report,
                 finished=finished)
    shipped = ["cnn-sgd", "vit-sgd"] if fast else _shipped_sgd()
    for names, measure in (([n for n in shipped if n not in done and wanted(n)], methods),
                           ([n for n in shipped if n in again], redo)):
        if names:
            finished(shipped_rows(measure, names, n=2 if fast else 8))
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def _shipped_sgd() -> list[str]:
    from audit import available_checkpoints

    return [k for k in available_checkpoints() if k.endswith("-sgd")]


def figure(table: pd.DataFrame, threshold: float = 0.99) -> Figure:
    """Models (rows) x methods (columns), coloured by 1 - the largest median |cos| along the chain on a log scale,
    as CSC judges a collapse: dark = collapsed to rank 1 (the threshold marked on the colour bar); grey = the
    method does not fit the model."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    from audit import style

    measured = table[table.status == "measured"]
    grid = measured.pivot_table(index="model", columns="method", values="csc_max", aggfunc="first")
    methods = [m for m in BUILDERS if m in grid.columns]
    # the shipped trained checkpoints first, then the library models by name
    source = measured.drop_duplicates("model").set_index("model").source
    rows = sorted(grid.index, key=lambda m: (source.get(m) != "shipped", m))
    grid = grid.loc[rows, methods]
    with style.styled():
        fig, ax = plt.subplots(figsize=(style.TWO_COLUMN, max(2.0, 0.14 * len(grid) + 1.2)))
        values = np.clip(1 - grid.to_numpy(dtype=float), 1e-6, 1)
        cmap = plt.get_cmap("viridis").with_extremes(bad="0.85")
        ax.imshow(np.ma.masked_invalid(values), aspect="auto", cmap=cmap, norm=LogNorm(1e-4, 1))
        ax.set_xticks(range(len(methods)), methods, rotation=90)
        ax.set_yticks(range(len(grid)), grid.index)
        bar = fig.colorbar(ax.images[0], ax=ax, label="1 - largest median |cos| along the chain (log);\n"
                           f"white line: the collapse threshold, 1 - {threshold}")
        bar.ax.axhline(1 - threshold, color="white", linewidth=1.5)
        ax.set_title("Collapse atlas: chain methods x architectures")
        fig.tight_layout()
    return fig


PUBLISHED = ["source", "model", "family", "method", "csc_at_input", "csc_max", "baseline", "sigma2_over_sigma1",
             "collapsed", "status", "reason"]


def publish(table: pd.DataFrame, folder: Path, command: str, limit: float, fig: Figure | None = None,
            partial: bool = False) -> None:
    """The atlas as the documentation shows it, written atomically into ``folder``: atlas.csv (the table, its
    statistics to 4 significant digits), atlas.png (``fig``, default :func:`figure` of the table), and atlas.json
    (the date, the commit, the command that regenerates them, the time limit, and the models measured and not:
    over the limit, refused, crashed). ``partial``: the command measured some rows again and kept the others
    (``--redo``): the runs they may come from (the date, commit and command of the folder's atlas.json, and its
    own ``earlier_rows``) are listed under ``earlier_rows``."""
    import datetime
    import json

    from audit.atomic import atomic_write, atomic_write_bytes

    small = table.reindex(columns=PUBLISHED).copy()
    for column in ("csc_at_input", "csc_max", "baseline", "sigma2_over_sigma1"):
        small[column] = pd.to_numeric(small[column]).map(lambda v: float(f"{v:.4g}") if pd.notna(v) else v)
    commit = head_commit()
    models = table.drop_duplicates("model")
    earlier = None
    if partial and (folder / "atlas.json").exists():
        before = json.loads((folder / "atlas.json").read_text())
        earlier = [*before.get("earlier_rows", []), {k: before.get(k) for k in ("date", "commit", "command")}]
    about = {"date": datetime.date.today().isoformat(), "commit": commit, "command": command, "limit_s": limit,
             **({"earlier_rows": earlier} if earlier else {}),
             "measured": int((models.status == "measured").sum()),
             "not_measured": {row.model: f"{row.status}: {row.reason}" for row in models.itertuples()
                              if row.status != "measured"}}
    fig = fig if fig is not None else figure(table)
    atomic_write_bytes(folder / "atlas.csv", small.to_csv(index=False).encode())
    atomic_write(folder / "atlas.png", lambda f: fig.savefig(f, dpi=110, format="png", bbox_inches="tight"))
    atomic_write_bytes(folder / "atlas.json", (json.dumps(about, indent=1) + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="two timm models, four methods")
    parser.add_argument("--out", default="atlas", help="folder for atlas.csv and atlas.png")
    parser.add_argument("--parallel", type=int, default=2, help="models measured at once")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per model")
    parser.add_argument("--redo", default="", help="comma-separated methods measured again on the models already "
                        "measured (their rows replaced)")
    parser.add_argument("--models", default="", help="comma-separated models: measure these only (with --redo, its "
                        "methods again on these only; default: every model)")
    parser.add_argument("--retry", action="store_true", help="measure again the models that went over the time "
                        "limit in DIR/atlas.rows.csv (default: keep them listed as over it)")
    parser.add_argument("--publish", default="", help="also write the table, the figure and their provenance "
                        "(date, commit, command) into this folder, as the documentation shows them")
    parser.add_argument("--fresh", action="store_true", help="measure every model again (default: keep the rows "
                        "of the models DIR/atlas.rows.csv holds)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keep = out / ("atlas-fast.rows.csv" if args.fast else "atlas.rows.csv")
    if args.fresh:
        keep.unlink(missing_ok=True)

    def report(i: int, row: dict[str, Any]) -> None:
        print(f"[{i + 1}] {row['name']}: {row['class']} ({row.get('run_s')} s) {row.get('reason', '')[:120]}",
              file=sys.stderr, flush=True)

    try:
        table = atlas(args.fast, parallel=args.parallel, limit=args.limit, report=report, keep=keep,
                      redo=[m for m in args.redo.split(",") if m], retry=args.retry,
                      models=[m for m in args.models.split(",") if m] or None)
    except RowsError as exc:
        print(f"atlas: error: {exc}", file=sys.stderr)
        return 2
    from audit.atomic import atomic_write, atomic_write_bytes

    fig = figure(table)
    atomic_write_bytes(out / "atlas.csv", table.to_csv(index=False).encode())
    atomic_write(out / "atlas.png", lambda f: fig.savefig(f, dpi=150, format="png", bbox_inches="tight"))
    if args.publish:
        publish(table, Path(args.publish), "python -m benchmarks.atlas " + " ".join(argv if argv is not None
                                                                                  else sys.argv[1:]), args.limit, fig,
                partial=bool(args.redo))
    measured = table[table.status == "measured"]
    print(measured.pivot_table(index="method", values="collapsed", aggfunc="mean").round(2).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
