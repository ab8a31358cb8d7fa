"""The documentation's generated pages, written when Sphinx reads ``conf.py``.

What the code declares is read from the code, so the site cannot drift from it: each check's options
(:meth:`audit.checks.options.Options.declared`), each method family's methods with their rule tables and
references (:mod:`attributions.methods`), the bibliography (:mod:`reports.references`), the collapse atlas's
summary from its published table (``docs/atlas``, written by ``make atlas``), the method sweep's
(``docs/sweep``, written by ``make sweep``), and the notebooks, copied beside
the pages that render them.
"""
from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def options_table(check: str) -> str:
    """A Markdown table of one check's options: key, command-line flag, default, allowed values, help, and where a
    threshold's default comes from."""
    from audit.checks import CHECKS
    spec = CHECKS[check]
    declared = spec.options.declared() if spec.options is not None else []
    if not declared:
        return "This check has no options of its own.\n"
    rows = ["| key (TOML) | flag | default | allowed | what it sets | source of the default |",
            "| --- | --- | --- | --- | --- | --- |"]
    for o in declared:
        allowed = ", ".join(f"`{c}`" for c in o.choices) if o.choices else (o.rule or "")
        rows.append(f"| `{o.name}` | `--{o.name.replace('_', '-')}` | `{o.default!r}` | {_cell(allowed)} | "
                    f"{_cell(o.help)} | {_cell(o.source)} |")
    return "\n".join(rows) + "\n"


def method_table(family: str) -> str:
    """One family's methods: a Markdown table (name, what it computes, references), then each method's rule table
    by node kind (kinds that share a rule listed together) or the engine that computes it."""
    from attributions.methods import BUILDERS, build_method
    methods = [m for m in (build_method(name) for name in BUILDERS) if m.family == family]
    rows = ["| method | what it computes | references |", "| --- | --- | --- |"]
    for m in methods:
        cite = ", ".join(f"{{cite:t}}`{key}`" for key in m.cite) or _cell(m.reference)
        rows.append(f"| `{m.name}` | {_cell(m.description)} | {cite} |")
    details = ["", "What computes each method's maps:", ""]
    for m in methods:
        how = _grouped_rules(m.rules) if m.chain else f"its own engine, `{m.engine!r}`"
        details.append(f"* `{m.name}`: {how}")
    return "\n".join(rows + details) + "\n"


def op_table() -> str:
    """The engine's op table (:data:`attributions.ops.SPECS`) in the order its entries are tried: the op names
    each covers and when it applies."""
    from attributions.ops import SPECS, STRUCTURAL
    rows = ["| entry | ops | when, and what it makes |", "| --- | --- | --- |"]
    for k, spec in enumerate(SPECS, 1):
        names = ", ".join(f"`{op}`" for op in sorted(spec.ops)) if spec.ops is not None else "any op"
        rows.append(f"| {k} | {names} | {_cell(spec.about)} |")
    built = ", ".join(f"`{op}`" for op in sorted(STRUCTURAL))
    return "\n".join(rows) + f"\n\nBuilt by the graph builder itself: {built}.\n"


def _grouped_rules(rules: dict) -> str:
    """The rule table with the kinds that share a rule listed together: "conv, dense: `AlphaBeta(...)`"."""
    kinds: dict[str, list[str]] = {}
    for kind, rule in rules.items():
        kinds.setdefault(repr(rule), []).append(kind)
    return "; ".join(f"{', '.join(k)}: `{r}`" for r, k in kinds.items())


ATLAS = ROOT / "docs" / "atlas"


def atlas_summary(folder: Path = ATLAS) -> str:
    """The collapse atlas's published result (``make atlas``) in words and tables: where it comes from, per chain
    method the share of architectures where its backward signals collapse, where the z+ family does not, and
    the models not measured with why."""
    import json

    import pandas as pd

    from attributions.catalog import family
    about = json.loads((folder / "atlas.json").read_text())
    table = pd.read_csv(folder / "atlas.csv")
    measured = table[table.status == "measured"].assign(
        collapsed=lambda t: t.collapsed.astype(str).str.lower() == "true")
    lines = [f"Measured on {about['date']} at commit `{about['commit']}` with `{about['command']}` (each model within "
             f"{about['limit_s']:.0f} s on 2 cores): {about['measured']} models, {len(measured)} model x method rows. "
             "The table and the figure are `docs/atlas/atlas.csv` and `docs/atlas/atlas.png`." +
             "".join(f" The rows it did not measure again come from {run['date']} at commit `{run['commit']}` with "
                     f"`{run['command']}`." for run in about.get("earlier_rows", [])), "",
             r"| method | family | models it fits | collapsed (largest median \|cos\| along the chain >= 0.99) | "
             r"median \|cos\| at the input, over the models |", "| --- | --- | --- | --- | --- |"]
    for method, part in measured.groupby("method", sort=False):
        lines.append(f"| `{method}` | {family(str(method))} | {len(part)} | {int(part.collapsed.sum())} "
                     f"({part.collapsed.mean():.0%}) | {part.csc_at_input.median():.3f} |")
    zplus = measured[measured.method.map(family) == "LRP z+ family"]
    kept = zplus[~zplus.collapsed].groupby("model", sort=False).method.apply(lambda m: ", ".join(f"`{x}`" for x in m))
    lines += ["", "Where a method of the LRP z+ family does not collapse:", ""]
    lines += [f"* `{model}`: {methods}" for model, methods in kept.items()] or ["* nowhere"]
    lines += ["", "Models not measured:", ""]
    # the first sentence of why: a refusal goes on to list every supported op
    lines += [f"* `{model}`: {_cell(why.split('. ')[0])}" for model, why in about["not_measured"].items()] or ["* none"]
    return "\n".join(lines) + "\n"


SWEEP = ROOT / "docs" / "sweep"


def sweep_summary(folder: Path = SWEEP) -> str:
    """The method sweep's published result (``make sweep``): where it comes from, how many of the enumerated models
    it covers, then its summary (``docs/sweep/summary.md``: the cells by outcome, the refusals' and failures'
    reasons)."""
    import json

    about = json.loads((folder / "sweep.json").read_text())
    enumerated = sum(about["enumerated"].values())
    swept = (f"all {enumerated} enumerated models" if about["models"] == enumerated else
             f"{about['models']} of the {enumerated} enumerated models (the others not swept yet)")
    head = (f"Published on {about['date']} at commit `{about['commit']}` with `{about['command']}` (each model within "
            f"{about['limit_s']:.0f} s, on one core): {swept} ("
            + ", ".join(f"{library} {n}" for library, n in about["enumerated"].items())
            + f") x {about['methods']} methods. Every cell is in `docs/sweep/sweep.csv`.")
    return head + "\n\n" + (folder / "summary.md").read_text()


def write_all(out: Path) -> None:
    """Write every generated page into ``out`` and copy the notebooks to ``docs/tutorials``."""
    from attributions.catalog import FAMILIES
    from audit.checks import CHECKS
    from reports.references import bibtex
    out.mkdir(exist_ok=True)
    files = {"references.bib": bibtex()}
    files |= {f"options-{name}.md": options_table(name) for name in CHECKS}
    files["atlas-summary.md"] = atlas_summary()
    files["sweep-summary.md"] = sweep_summary()
    files["ops.md"] = op_table()
    files |= {f"methods-{family.replace(' ', '-').replace('+', 'plus')}.md": method_table(family)
              for family in FAMILIES}
    for name, text in files.items():
        path = out / name
        if not path.exists() or path.read_text() != text:  # unchanged files keep their time: no needless rebuild
            path.write_text(text)
    tutorials = Path(__file__).parent / "tutorials"
    tutorials.mkdir(exist_ok=True)
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        target = tutorials / notebook.name
        if not target.exists() or target.read_bytes() != notebook.read_bytes():
            shutil.copyfile(notebook, target)
