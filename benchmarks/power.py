"""The power of each check: how many images a verdict needs to decide, measured on the shipped models.

An audit of cnn-sgd and vgg-sgd on 64 images (the demo's methods; the random-logit test, cascading randomization
and the calibrated data-randomization test) is re-read on random subsets of its images: for each check, model and
method, the share of 50 seeded subsets of 16, 32 and 48 images on which the verdict decides (rejected or not
rejected), beside its outcome on all 64. The effect is how far the method's median score lies from what decides
it (the threshold, or for the calibrated verdict 0 of its midpoint difference), in units of the per-image scores'
interquartile range: the images needed grow as the effect shrinks. The audit is kept in ``benchmarks/.power-run``
and resumed on a rerun.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from audit.checks import CHECKS
from audit.checks.base import INCONCLUSIVE
from audit.checks.calibration import SMALLEST_GAP, Calibrated
from audit.checks.options import Options
from audit.checks.scale import controls_in
from audit.cli import DEMO_METHODS
from audit.run import AuditConfig, load_config, run_audit

RUN = Path(__file__).resolve().parent / ".power-run"
SIZES = (16, 32, 48)  # and the whole 64, on which the verdict is the run's (a look holds 16 images or more)
SUBSETS = 50
TESTS = ("random-logit", "cascading", "data-randomization")
DECIDED = 0.8  # the share of subsets that must decide for a size to count as enough


def _effect(check: str, part: pd.DataFrame, options: Options, controls: pd.DataFrame | None = None) -> str:
    """|median - what decides| / IQR of the per-image scores the verdict reads: the calibrated differences on
    Fisher's z scale where the calibrated rule decided, else the scores against the fixed threshold ("n/a" where
    the scores have no spread, "> 100" far from it)."""
    rule = CHECKS[check].verdict
    if rule is None:  # power_table reads only the checks with a verdict
        raise ValueError(f"check {check!r} has no verdict")
    if isinstance(rule, Calibrated) and rule.references(part) is not None and \
            rule.gap(part, options)[1] >= SMALLEST_GAP:
        values, at = rule.differences(part), 0.0
    else:
        scores = rule.per_image(part)
        if scores is None:  # a verdict on a score that is not per image has no spread to measure against
            raise ValueError(f"check {check!r}: its verdict's score is not per image")
        scale = rule.scale(controls)  # a verdict read on the controls' scale, else against its threshold
        at = scale.midpoint if scale is not None else getattr(options, rule.threshold)
        values = scores.to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    spread = float(np.subtract(*np.percentile(values, [75, 25]))) if len(values) else np.nan
    if not spread > 0:
        return "n/a"
    effect = abs(float(np.median(values)) - at) / spread
    return "> 100" if effect > 100 else f"{effect:.2f}"


def power_table(tables: dict[str, pd.DataFrame], config: AuditConfig) -> pd.DataFrame:
    """One row per check x model x method: the outcome on all images, the effect, the share of subsets of each size
    that decide, and the smallest size at which at least :data:`DECIDED` of them do."""
    rng = np.random.default_rng(0)
    rows = []
    for check in TESTS:
        table, rule = tables.get(check), CHECKS[check].verdict
        if table is None or table.empty or rule is None:
            continue
        options = CHECKS[check].options_from(config.options, family=config.family)
        for (model, method), part in table.groupby(["model", "method"], sort=False):
            controls = controls_in(table, str(model))
            images = np.sort(part.image.unique())
            row = {"check": check, "model": model, "method": method,
                   "outcome (64 images)": rule.evaluate(part, options, controls=controls).outcome,
                   "effect (IQR)": _effect(check, part, options, controls)}
            needed = None
            for n in SIZES:
                subsets = [rng.choice(images, size=min(n, len(images)), replace=False) for _ in range(SUBSETS)]
                decided = np.mean([rule.evaluate(part[part.image.isin(s)], options, controls=controls).outcome
                                   != INCONCLUSIVE
                                   for s in subsets])
                row[f"decided at {n}"] = round(float(decided), 2)
                if needed is None and decided >= DECIDED:
                    needed = n
            row["images needed"] = str(needed) if needed is not None else \
                "64" if row["outcome (64 images)"] != INCONCLUSIVE else "> 64"
            rows.append(row)
    return pd.DataFrame(rows)


def run() -> str:
    config = load_config(models=["cnn-sgd", "vgg-sgd"], methods=DEMO_METHODS, tests=list(TESTS), n_images=64,
                         heatmap_examples=0)
    result = run_audit(config, RUN, resume=(RUN / "manifest.json").exists(), progress=False, log=lambda s: None)
    table = power_table(result.tables, result.config)
    return (f"Share of {SUBSETS} seeded subsets of the images on which each verdict decides, and the smallest "
            f"subset size at which {DECIDED:.0%} of them do. The effect is the distance of the method's median "
            "from what decides the verdict, in interquartile ranges of its per-image scores.\n\n"
            + table.to_markdown(index=False) + "\n")
