"""The verdict per model x method, and the paired baseline-vs-Bort comparison, both derived from the
checks' verdict rules (:attr:`audit.checks.base.Check.verdict`)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from audit.checks import CHECKS
from audit.models.training import OPTIMIZERS


def verdict_table(tables: dict, config) -> pd.DataFrame:
    """One row per model x method: for each check with a verdict rule among ``tables``, its score and
    display text; then ``verdict``: "pass", or "fail: " and every failing check's reason. A check
    that says nothing for a pair (no rows) neither passes nor fails it. Only checks that were run
    (among ``tables`` or the configuration's tests) get columns."""
    run = set(tables) | set(getattr(config, "tests", ()))
    rules = [(name, check.verdict) for name, check in CHECKS.items() if check.verdict is not None and name in run]
    present = [t for name, t in tables.items() if name in CHECKS and t is not None and not t.empty]
    if not present:
        return pd.DataFrame(columns=["model", "method", "verdict"])
    pairs = pd.concat([t[["model", "method"]] for t in present]).drop_duplicates()
    rows = []
    for model, method in pairs.itertuples(index=False):
        row: dict = {"model": model, "method": method}
        fails, undefined = [], []
        for name, rule in rules:
            table = tables.get(name)
            part = table[(table.model == model) & (table.method == method)] if table is not None and not table.empty \
                else pd.DataFrame()
            if part.empty:
                row |= {rule.score_column: np.nan, rule.text_column: "n/a"}
                continue
            cell = rule.evaluate(part, config)
            row |= {rule.score_column: cell.score, rule.text_column: cell.text}
            if cell.failed:
                fails.append(rule.failure)
            elif cell.failed is None and cell.text == "undefined":
                undefined.append(name)
        # a check that ran but could score no image says neither pass nor fail
        row["verdict"] = ("fail: " + ", ".join(fails) if fails else
                          f"undefined: {', '.join(undefined)} (maps constant or non-finite)" if undefined else "pass")
        rows.append(row)
    order = {m: i for i, m in enumerate(config.methods)}
    model_order = {m: i for i, m in enumerate(dict.fromkeys(pairs.model))}
    rows.sort(key=lambda r: (model_order[r["model"]], order.get(r["method"], len(order))))
    return pd.DataFrame(rows)


def display_columns(verdict: pd.DataFrame) -> list[str]:
    """The verdict table's columns a reader sees: model, method, each rule's text, the verdict."""
    texts = [r.text_column for r in (c.verdict for c in CHECKS.values()) if r is not None and r.text_column in verdict]
    return ["model", "method"] + texts + ["verdict"]


def score_columns(verdict: pd.DataFrame) -> list[str]:
    """The verdict table's score columns (one per check with a verdict rule) that hold a value."""
    scores = [r.score_column for r in (c.verdict for c in CHECKS.values()) if r is not None]
    return [c for c in scores if c in verdict and verdict[c].notna().any()]


def twins(models: pd.DataFrame) -> list[tuple[str, str]]:
    """(baseline, Bort) pairs: the same architecture trained with an unconstrained and a constrained
    (Bort) optimizer, as the trainer's optimizer registry classifies them."""
    constrained = models.optimizer.map(lambda o: bool(getattr(OPTIMIZERS.get(str(o)), "constrained", False)))
    pairs = []
    for _, part in models.assign(constrained=constrained).groupby("arch", sort=False):
        pairs += [(p, b) for p in part[~part.constrained].model for b in part[part.constrained].model]
    return pairs


def bort_comparison(tables: dict) -> pd.DataFrame:
    """Paired Wilcoxon signed-rank tests (scipy) of the per-image scores behind each per-image verdict
    (random-logit SSIM, SSIM at full cascading randomization, eMPRT's score, sMPRT's Spearman, input
    invariance's relative L2), baseline vs Bort twin, per method; each row names its score and which
    of its values are the better ones."""
    rows = []
    models = tables.get("models", pd.DataFrame())
    if models.empty:
        return pd.DataFrame()
    for base, bort in twins(models):
        for name, check in CHECKS.items():
            frame = tables.get(name)
            if check.verdict is None or frame is None or frame.empty:
                continue
            for method in frame.method.unique():
                base_scores = check.verdict.per_image(frame[(frame.model == base) & (frame.method == method)])
                bort_scores = check.verdict.per_image(frame[(frame.model == bort) & (frame.method == method)])
                if base_scores is None or bort_scores is None or len(base_scores) == 0 \
                        or len(base_scores) != len(bort_scores):
                    continue
                a, b = base_scores.to_numpy(), bort_scores.to_numpy()
                diff = b - a
                p = float(stats.wilcoxon(a, b).pvalue) if np.any(diff != 0) else 1.0
                rows.append({"baseline": base, "bort": bort, "test": name, "method": method,
                             "score": check.verdict.score_name, "better": check.verdict.better,
                             "baseline_score": float(np.median(a)), "bort_score": float(np.median(b)),
                             "median_difference": float(np.median(diff)), "wilcoxon_p": p, "n": len(a)})
    return pd.DataFrame(rows)
