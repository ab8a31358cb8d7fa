"""The verdict per model x method, and the paired baseline-vs-Bort comparison."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from audit.stats import bootstrap_ci


def _ci_text(values) -> tuple[float, str]:
    est, low, high = bootstrap_ci(values, 0.99)
    return est, (f"{est:.3f} [{low:.3f}, {high:.3f}]" if not np.isnan(est) else "n/a")


def verdict_table(tables: dict, config) -> pd.DataFrame:
    """One row per model x method: collapse (and the layer nearest the logits where it is reached),
    random-logit SSIM median [99 % CI], SSIM at full cascading randomization [99 % CI], and pass/fail
    against the configured thresholds."""
    rows = []
    csc, logit = tables.get("csc", pd.DataFrame()), tables.get("random-logit", pd.DataFrame())
    cascade = tables.get("cascading", pd.DataFrame())
    models = pd.concat([t[["model", "method"]] for t in (csc, logit, cascade) if not t.empty]).drop_duplicates()
    for model, method in models.itertuples(index=False):
        row = {"model": model, "method": method, "collapsed": None, "collapse_layer": "", "random_logit_ssim": np.nan,
               "random_logit": "n/a", "full_randomization_ssim": np.nan, "full_randomization": "n/a"}
        if not csc.empty:
            part = csc[(csc.model == model) & (csc.method == method)]
            if not part.empty:
                logits = part[part.inject_at == part.inject_at.iloc[0]].sort_values("depth", ascending=False)
                hit = logits[logits["median"] >= config.csc_threshold]
                row["collapsed"] = bool(len(hit))
                row["collapse_layer"] = hit.layer.iloc[0] if len(hit) else ""
        if not logit.empty:
            part = logit[(logit.model == model) & (logit.method == method)]
            if not part.empty:
                row["random_logit_ssim"], row["random_logit"] = _ci_text(part.ssim)
        if not cascade.empty:
            part = cascade[(cascade.model == model) & (cascade.method == method)]
            if not part.empty:
                last = part[part.stage == part.stage.max()]
                row["full_randomization_ssim"], row["full_randomization"] = _ci_text(last.ssim)
        fails = []
        if row["collapsed"]:
            fails.append("rank-1 collapse")
        if row["random_logit_ssim"] >= config.random_logit_pass:
            fails.append("class-insensitive")
        if row["full_randomization_ssim"] >= config.randomization_pass:
            fails.append("weight-insensitive")
        row["verdict"] = "fail: " + ", ".join(fails) if fails else "pass"
        rows.append(row)
    order = {m: i for i, m in enumerate(config.methods)}
    model_order = {m: i for i, m in enumerate(dict.fromkeys(models.model))}
    rows.sort(key=lambda r: (model_order[r["model"]], order.get(r["method"], len(order))))
    return pd.DataFrame(rows)


def twins(models: pd.DataFrame) -> list[tuple[str, str]]:
    """(baseline, Bort) pairs: the same architecture trained with a plain and a Bort optimizer."""
    pairs = []
    for arch, part in models.groupby("arch", sort=False):
        plain = part[~part.optimizer.astype(str).str.startswith("bort")]
        bort = part[part.optimizer.astype(str).str.startswith("bort")]
        pairs += [(p, b) for p in plain.model for b in bort.model]
    return pairs


def bort_comparison(tables: dict) -> pd.DataFrame:
    """Paired Wilcoxon signed-rank tests (scipy) of per-image scores, baseline vs Bort twin, per method:
    random-logit SSIM and SSIM at full cascading randomization."""
    rows = []
    models = tables.get("models", pd.DataFrame())
    if models.empty:
        return pd.DataFrame()
    for base, bort in twins(models):
        for test, frame in (("random-logit", tables.get("random-logit")), ("cascading", tables.get("cascading"))):
            if frame is None or frame.empty:
                continue
            if test == "cascading":
                frame = frame[frame.stage == frame.groupby("model").stage.transform("max")]
            for method in frame.method.unique():
                a = frame[(frame.model == base) & (frame.method == method)].sort_values("image").ssim.to_numpy()
                b = frame[(frame.model == bort) & (frame.method == method)].sort_values("image").ssim.to_numpy()
                if len(a) == 0 or len(a) != len(b):
                    continue
                diff = b - a
                p = float(stats.wilcoxon(a, b).pvalue) if np.any(diff != 0) else 1.0
                rows.append({"baseline": base, "bort": bort, "test": test, "method": method,
                             "baseline_ssim": float(np.median(a)), "bort_ssim": float(np.median(b)),
                             "median_difference": float(np.median(diff)), "wilcoxon_p": p, "n": len(a)})
    return pd.DataFrame(rows)
