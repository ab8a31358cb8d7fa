"""The planted-shortcut check on the shipped models: each -sgd model's shortcut twins (tag and gate), and each of the
demo's methods' outcome and median shares inside the tag, read on the embedded Fashion-MNIST sample with the demo's
images and looks (``run --tests shortcut``)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from audit.cli import DEMO
from audit.data.tags import Tag
from audit.models.recipes import SHORTCUT_PAIRS
from audit.run import load_config, run_audit
from audit.sections import Table
from reports.markdown import table_markdown
from reports.verdict import verdict_table

MODELS = [f"{arch}-sgd" for arch in SHORTCUT_PAIRS]


def run(out: Path | None = None) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        result = run_audit(load_config(**(DEMO | {"models": MODELS, "tests": ["shortcut"]})), Path(scratch) / "audit",
                           progress=False, log=lambda text: None)
        verdict = verdict_table(result.tables, result.config)
        shares = result.tables["shortcut"]
    gates = pd.DataFrame([{"model": model, "tag": Tag.from_dict(r["tag"]).spec,
                           "shortcut score": f"{r['shortcut_score']:.3f}", "control's score": f"{r['control_score']:.3f}",
                           "clean accuracies": f"{r['shortcut_accuracy']:.3f} / {r['control_accuracy']:.3f}",
                           "planted": "yes" if r["planted"] else "no"}
                          for model, r in result.manifest.get("shortcuts", {}).items()])
    medians = shares.groupby(["model", "method"], sort=False)[
        ["shortcut_share", "control_share", "clean_shortcut_share", "clean_control_share"]].median()
    used = shares.groupby(["model", "method"], sort=False).image.count()
    rows = []
    for (model, method), row in medians.iterrows():
        cell = verdict.set_index(["model", "method"]).loc[(model, method)]
        rows.append({"model": model, "method": method, "outcome": cell.outcome_shortcut,
                     "shortcut - control [interval]": cell.short_shortcut.split(" ", 1)[1].removeprefix("shortcut - control "),
                     "share, shortcut twin": f"{row.shortcut_share:.3f}", "share, control twin": f"{row.control_share:.3f}",
                     "clean: shortcut / control": f"{row.clean_shortcut_share:.3f} / {row.clean_control_share:.3f}",
                     "images": int(used[(model, method)])})
    area = float(shares.area_share.iloc[0])
    return (f"The demo's {len(result.config.methods)} methods on {', '.join(MODELS)}, {result.config.n_images} to "
            f"{result.config.max_images} images of the embedded sample (the tag's class left out), the tag's area share "
            f"{area:.4f} the margin.\n\n" + table_markdown(Table(gates, "", "gates")) + "\n\n"
            + table_markdown(Table(pd.DataFrame(rows), "", "outcomes")))
