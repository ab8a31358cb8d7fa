"""How far the verdict rests on its fixed thresholds: each check's outcomes re-read at thresholds around the run's.

A fixed threshold without a derivation from the model at hand (the random-logit test's 0.8, eMPRT's 0) is shown
with the outcomes it decides: for each value of a grid around the run's, how many model x method pairs each check
rejects, does not reject or leaves inconclusive, and which pairs change outcome against the run's value. The
intervals do not depend on the threshold; only the side they fall on does.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from attributions.catalog import CONTROLS
from attributions.methods import build_method
from audit.checks import CHECKS
from audit.checks.base import INCONCLUSIVE, NOT_REJECTED, REJECTED
from audit.errors import ConfigError
from audit.run.config import AuditConfig

STEPS = (-0.2, -0.1, 0.0, 0.1, 0.2)  # absolute offsets from the run's threshold: every threshold here is a score in [-1, 1]


def threshold_grid(check: str, value: float) -> list[float]:
    """The run's ``value`` and the offsets :data:`STEPS` around it that the check's option accepts (rounded to
    1e-9: 0.5 + 0.1 is 0.6)."""
    rule = CHECKS[check].verdict
    assert rule is not None
    option = next(o for o in CHECKS[check].options.declared() if o.name == rule.threshold)
    grid = []
    for step in STEPS:
        candidate = round(value + step, 9)
        try:
            grid.append(option.check(candidate))
        except ConfigError:
            continue
    return grid


def sensitivity_table(tables: dict[str, Any], config: AuditConfig) -> pd.DataFrame:
    """One row per check x threshold value: the counts of each outcome over the audited methods (controls left
    out) and the pairs whose outcome differs from the one at the run's threshold.

    Parameters
    ----------
    tables : dict
        Check name -> its result table (columns ``model``, ``method`` and the check's own).
    config : AuditConfig
        The run's configuration: the checks' options (the run's thresholds).

    Returns
    -------
    DataFrame
        Columns check, threshold (the option's name), value, run (whether it is the run's value), rejected, not
        rejected, inconclusive, changed ("model/method: outcome at the run's value -> outcome here", semicolon
        separated), source (where the default comes from, :attr:`~audit.checks.options.Option.source`; on the run's
        row); no rows when no check with a threshold has a table.
    """
    rows = []
    for name, check in CHECKS.items():
        table = tables.get(name)
        rule = check.verdict
        if rule is None or table is None or table.empty or not rule.threshold:
            continue
        options = check.options_from(config.options, config.looks, config.family)
        value = getattr(options, rule.threshold)
        source = next(o.source for o in check.options.declared() if o.name == rule.threshold)
        parts = [(model, method, part) for (model, method), part in table.groupby(["model", "method"], sort=False)
                 if build_method(method).family != CONTROLS]
        at_run = {(m, k): rule.evaluate(p, options).outcome for m, k, p in parts}
        for candidate in threshold_grid(name, value):
            moved = check.options_from({**config.options, rule.threshold: candidate}, config.looks,
                                        config.family)
            outcomes = {(m, k): rule.evaluate(p, moved).outcome if candidate != value else at_run[(m, k)]
                        for m, k, p in parts}
            changed = [f"{m}/{k}: {at_run[(m, k)]} -> {o}" for (m, k), o in outcomes.items() if o != at_run[(m, k)]]
            counts = {o: sum(v == o for v in outcomes.values()) for o in (REJECTED, NOT_REJECTED, INCONCLUSIVE)}
            rows.append({"check": name, "threshold": rule.threshold, "value": candidate, "run": candidate == value,
                         **counts, "changed": "; ".join(changed), "source": source if candidate == value else ""})
    return pd.DataFrame(rows, columns=["check", "threshold", "value", "run", REJECTED, NOT_REJECTED, INCONCLUSIVE,
                                       "changed", "source"])
