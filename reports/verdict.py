"""The verdict per model x method, and the paired baseline-vs-Bort comparison, both derived from the
checks' verdict rules (:attr:`audit.checks.base.Check.verdict`)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from attributions.catalog import CONTROLS
from attributions.methods import build_method
from audit.checks import CHECKS
from audit.checks.base import INCONCLUSIVE, NOT_READ, NOT_REJECTED, REJECTED, VerdictRule
from audit.checks.options import FAMILY_ERROR, INFLATION, NO_SOURCE, Options, look_level, one_sided_error
from audit.checks.scale import controls_in
from audit.models.training import OPTIMIZERS
from audit.run.config import AuditConfig
from reports.mechanisms import mechanism_text, mechanisms


def _rules(tables: dict[str, Any], config: AuditConfig) -> list[tuple[str, VerdictRule, bool, Options]]:
    """(check name, rule, counts in the verdict, the check's options) for each verdict rule of the checks that
    were run."""
    run = set(tables) | set(config.tests)
    return [(name, rule, rule is check.verdict, check.options_from(config.options, config.looks, config.family))
            for name, check in CHECKS.items()
            if name in run for rule in ((check.verdict,) if check.verdict is not None else ()) + tuple(check.side_rules)]


def _rule_cells(tables: dict[str, Any], rules: list[tuple[str, VerdictRule, bool, Options]], model: str,
                method: str) -> tuple[dict[str, Any], list[str], list[str], list[str]]:
    """(each rule's score, text and outcome columns; the rejecting checks with their failures; the inconclusive
    checks; the rejecting checks) for one model x method."""
    cells: dict[str, Any] = {"unsourced": 0}
    rejecting, unsure, rejected_by = [], [], []
    by_measure: dict[str, list[tuple[str, str]]] = {}
    for name, rule, counts, options in rules:
        table = tables.get(name)
        part = table[(table.model == model) & (table.method == method)] if table is not None and not table.empty \
            else pd.DataFrame()
        if part.empty:
            cells |= {rule.score_column: np.nan, rule.text_column: "n/a"}
            cells |= {} if counts else {f"short_{rule.text_column}": "n/a"}
            if counts:
                cells |= {f"outcome_{name}": "", f"short_{name}": "n/a", f"needed_{name}": None, f"reason_{name}": ""}
            continue
        cell = rule.evaluate(part, options, controls=controls_in(table, model))
        cells |= {rule.score_column: cell.score, rule.text_column: cell.text}
        if cell.decided_by and cell.outcome is not None and unsourced(name, cell.decided_by):
            cells["unsourced"] += 1
        if cell.outcome:
            by_measure.setdefault(name, []).append((rule.score_name, cell.outcome))
        if not counts:
            cells[f"short_{rule.text_column}"] = cell.short(labelled=False)
            continue
        cells[f"outcome_{name}"] = cell.outcome or ""
        cells[f"short_{name}"] = cell.short()
        cells[f"needed_{name}"] = cell.reading.images_needed() \
            if cell.outcome == INCONCLUSIVE and cell.reading is not None else None
        cells[f"reason_{name}"] = (cell.reason or rule.failure) if cell.outcome == REJECTED else \
            cell.reason if cell.reason.startswith(NOT_READ) else ""
        if cell.outcome == REJECTED:
            rejecting.append(f"{name} ({cells[f'reason_{name}']})")
            rejected_by.append(name)
        elif cell.outcome == INCONCLUSIVE:
            unsure.append(name)
    cells["measure_dependent"] = "; ".join(
        f"{name}: " + ", ".join(f"{measure} {outcome}" for measure, outcome in read)
        for name, read in by_measure.items() if {REJECTED, NOT_REJECTED} <= {outcome for _, outcome in read})
    return cells, rejecting, unsure, rejected_by


def _verdict_row(tables: dict[str, Any], config: AuditConfig, rules: list[tuple[str, VerdictRule, bool, Options]],
                 model: str, method: str) -> dict[str, Any]:
    """One model x method's row of :func:`verdict_table`: role, the rules' columns, verdict, mechanism, control check."""
    row: dict[str, Any] = {"model": model, "method": method,
                           "role": "control" if build_method(method).family == CONTROLS else "method"}
    cells, rejecting, unsure, rejected_by = _rule_cells(tables, rules, model, method)
    row |= cells
    outcomes = [row.get(f"outcome_{name}", "") for name, _, counts, _ in rules if counts]
    row["outcome"] = (REJECTED if rejecting else INCONCLUSIVE if unsure else
                      NOT_REJECTED if NOT_REJECTED in outcomes else "n/a")
    row["verdict"] = (f"{REJECTED}: " + ", ".join(rejecting) if rejecting else
                      f"{INCONCLUSIVE}: " + ", ".join(unsure) if unsure else row["outcome"])
    row["mechanisms"] = mechanisms(model, method, rejected_by, tables, config) \
        if rejecting and row["role"] == "method" else {}
    row["mechanism"] = mechanism_text(row["mechanisms"])
    row["control_check"] = control_check(row) if row["role"] == "control" else ""
    return row


def verdict_table(tables: dict[str, Any], config: AuditConfig) -> pd.DataFrame:
    """One row per model x method: for each check's verdict rule (and side rule) among ``tables``, its score and
    text; ``outcome_<check>``, each check's outcome (rejected / not rejected / inconclusive; empty where the check
    says nothing), ``short_<check>`` (its compact cell: mark, reading and interval,
    :meth:`~audit.checks.base.VerdictCell.short`; ``short_<text column>`` likewise, without the label, for each
    side rule), ``needed_<check>`` (for an inconclusive cell, about the images that would decide it, else None) and
    ``reason_<check>`` (for a rejecting check, why it rejects, else ""); ``role`` (method or control);
    ``verdict``: "rejected: " and every
    rejecting check's reason, else "inconclusive: " and the checks that could not conclude, else "not rejected"
    (``outcome``: that outcome alone);
    ``mechanisms`` (check -> the names of the mechanisms it supports) and ``mechanism``: for a
    rejected method, per rejecting check, the mechanisms the measurements support
    (:func:`reports.mechanisms.mechanism_text`); ``control_check``: for a
    control, whether each check gave the outcome it must have. A sanity check can reject a method, never
    certify it: no outcome says "pass".

    Parameters
    ----------
    tables : dict
        Check name -> its result table (columns ``model``, ``method`` and the check's own), as
        ``tables`` of :class:`~audit.run.results.AuditResult`; keys that are not registered checks
        (``"models"``) are ignored. The rows are the model x method pairs found in the non-empty tables.
    config : AuditConfig
        The run's configuration: the checks' options (thresholds), ``tests`` (a check that was run but has
        no table gives ``n/a``) and ``methods`` (the order of the rows within each model; models keep their
        order of first appearance).

    Returns
    -------
    DataFrame
        One row per model x method, with the columns above. The verdict is ``"n/a"`` where no check has an
        outcome. With no non-empty table: no rows, columns model, method, role, verdict, mechanism,
        control_check.
    """
    rules = _rules(tables, config)
    present = [t for name, t in tables.items() if name in CHECKS and t is not None and not t.empty]
    if not present:
        return pd.DataFrame(columns=["model", "method", "role", "verdict", "mechanism", "control_check"])
    pairs = pd.concat([t[["model", "method"]] for t in present]).drop_duplicates()
    rows = [_verdict_row(tables, config, rules, model, method) for model, method in pairs.itertuples(index=False)]
    order = {m: i for i, m in enumerate(config.methods)}
    model_order = {m: i for i, m in enumerate(dict.fromkeys(pairs.model))}
    rows.sort(key=lambda r: (model_order[r["model"]], order.get(r["method"], len(order))))
    return pd.DataFrame(rows)


def scales_table(tables: dict[str, Any], config: AuditConfig) -> pd.DataFrame:
    """The scales the verdicts read on (:mod:`audit.checks.scale`), once per check, rule's measure and model: the
    random map's score (unrelated), the edge map's (unchanged), their midpoint and where the ends come from; the
    verdict cells do not repeat them."""
    rows = []
    for name, rule, _, _ in _rules(tables, config):
        table = tables.get(name)
        if table is None or table.empty or getattr(rule, "metric", None) not in table:  # a measure not measured
            continue
        for model in dict.fromkeys(table.model):
            scale = rule.scale(controls_in(table, model))
            if scale is None:
                continue
            rows.append({"check": name, "measure": rule.score_name, "model": model,
                         "unrelated": round(scale.unrelated, 3), "unchanged": round(scale.unchanged, 3),
                         "midpoint": round(scale.midpoint, 3),
                         "ends": "the controls" if scale.measured else "the measure's own (no controls run)"})
    return pd.DataFrame(rows, columns=["check", "measure", "model", "unrelated", "unchanged", "midpoint", "ends"])


def unsourced(check: str, option: str) -> bool:
    """Whether the option ``option`` of ``check``, whose fixed value decided a cell, has no source (a paper's value
    or a calibration measured in the run: :attr:`~audit.checks.options.Option.source`)."""
    source = next((o.source for o in CHECKS[check].options.declared() if o.name == option), "")
    return not source or source == NO_SOURCE or source.startswith("none")


def control_check(row: dict[str, Any]) -> str:
    """Whether a control's outcome under each check is the one the check says it must have: "as expected", or
    "UNEXPECTED: " and each check that gave another outcome (that check is broken)."""
    wrong = [f"{name} gave {row[f'outcome_{name}']} (must be {expected})" for name, check in CHECKS.items()
             for control, expected in check.controls.items()
             if control == row["method"] and row.get(f"outcome_{name}") not in ("", None, expected)
             and not str(row.get(f"reason_{name}") or "").startswith(NOT_READ)]  # a check not read says nothing
    return "UNEXPECTED: " + "; ".join(wrong) if wrong else "as expected"


def broken_checks(verdict: pd.DataFrame) -> list[str]:
    """The lines naming each check a control contradicted (the check is broken on that model)."""
    if verdict.empty or "control_check" not in verdict:
        return []
    bad = verdict[verdict.control_check.str.startswith("UNEXPECTED")]
    return [f"{model}/{method}: {str(text).removeprefix('UNEXPECTED: ')}"
            for model, method, text in zip(bad.model, bad.method, bad.control_check)]


def summary_line(verdict: pd.DataFrame) -> str:
    """The verdict in one line: how many model x method pairs each outcome has (controls not counted), and
    whether the controls behaved."""
    methods = verdict[verdict.role == "method"] if "role" in verdict else verdict
    counts = {o: int(methods.verdict.str.startswith(o).sum()) for o in (REJECTED, NOT_REJECTED, INCONCLUSIVE)}
    line = (f"{len(methods)} model x method pairs: {counts[REJECTED]} rejected, {counts[NOT_REJECTED]} not rejected, "
            f"{counts[INCONCLUSIVE]} inconclusive (controls not counted)")
    if "unsourced" in verdict:  # every cell, side rules' and controls' included
        line += f"; {int(verdict.unsourced.sum())} cells decided by a value without a source"
    controls = verdict[verdict.role == "control"] if "role" in verdict else verdict.iloc[:0]
    broken = broken_checks(verdict)
    if broken:
        return line + "; BROKEN CHECK, a control had the wrong outcome: " + "; ".join(broken)
    return line + ("; controls as expected" if len(controls) else "")


def family_bound(readings: int) -> float:
    """The bound on a method's family-wise error over ``readings`` rejecting intervals, each at the level
    :func:`~audit.checks.options.look_level` gives that family: ``readings`` times each one's one-sided error."""
    return min(1.0, readings * one_sided_error(look_level(1, readings)))


def family_wise_error(checks: int, readings: int | None = None) -> str:
    """The family-wise error of a rejection across ``checks`` combined checks that read ``readings`` rejecting
    intervals in all (default one per check; a check read on the controls' scale reads two: its floor and its
    survival or twin reading), each at the level :func:`~audit.checks.options.look_level` gives that family, in one
    sentence (Bonferroni's bound: it holds whatever the dependence between them)."""
    readings = checks if readings is None else readings
    level = look_level(1, readings)
    each = one_sided_error(level)
    bound = family_bound(readings)
    intervals = (f"{readings} intervals ({checks} checks, those read on the controls' scale with two: the floor and "
                 "the survival or twin reading)" if readings != checks else f"{checks} checks")
    return (f"Family-wise error: a method is rejected when any of the {checks} checks run rejects it; each of its "
            f"{readings} rejecting intervals is at {level:.2%} (in a run of one look), at which one interval lies "
            f"wholly on the rejecting side of a true median that should not reject in at most {each:.2%} of "
            f"simulated audits ({INFLATION:g} times its nominal {(1 - level) / 2:.2%}: the most the percentile "
            "bootstrap exceeded its nominal on 16 to 64 images of skewed, tied, discrete and heavy-tailed scores, "
            "with re-initialisation seeds spread up to 0.8 times the images, its seeds resampled too); so the chance "
            f"that a method no check should reject is rejected by one is at most {readings} x {each:.2%} = "
            f"{bound:.1%} over the {intervals} (Bonferroni's bound, whatever the dependence between them), within "
            f"the {FAMILY_ERROR:.0%} the levels are set for")


def dependent_pairs(verdict: pd.DataFrame) -> pd.DataFrame:
    """The rows whose outcome depends on the measure (one measure of a check rejects, another does not)."""
    return verdict[verdict.get("measure_dependent", pd.Series("", index=verdict.index)).astype(bool)]


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


def bort_comparison(tables: dict[str, Any]) -> pd.DataFrame:
    """Paired Wilcoxon signed-rank tests (scipy) of the per-image scores behind each per-image verdict
    (random-logit SSIM, SSIM at full cascading randomization, eMPRT's score, sMPRT's Spearman, input
    invariance's relative L2), baseline vs Bort twin, per method, on the images both read, the images that share a
    re-initialisation seed one unit (:func:`_paired`); each row names its score, which of its values are the
    better ones, its images, its units and the images dropped. ``holm_p``: the p-values adjusted by Holm's
    step-down procedure over the methods of each (baseline, Bort, check) family, so that the chance of one false
    difference among a check's methods stays at the level read.

    Parameters
    ----------
    tables : {table name: DataFrame} of a finished run (:attr:`~audit.run.results.AuditResult.tables`)
    """
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
                row = _paired(check.verdict, frame[(frame.model == base) & (frame.method == method)],
                              frame[(frame.model == bort) & (frame.method == method)])
                if row is not None:
                    rows.append({"baseline": base, "bort": bort, "test": name, "method": method,
                                 "score": check.verdict.score_name, "better": check.verdict.better, **row})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out.insert(list(out.columns).index("n"), "holm_p",
               out.groupby(["baseline", "bort", "test"], sort=False).wilcoxon_p.transform(holm))
    return out


def _paired(rule: VerdictRule, base: pd.DataFrame, bort: pd.DataFrame) -> dict[str, Any] | None:
    """The paired comparison of one method's per-image scores on the baseline's rows and the Bort model's: on the
    images both read (a sequential run may read more on one; the others counted as ``images_dropped``), by the
    Wilcoxon signed-rank test of the differences, of each seed's mean difference where images share a
    re-initialisation seed (the seed's draw moves its images together: the seeds are the independent units,
    ``units``); None where no image is shared."""
    a, b = rule.per_image(base), rule.per_image(bort)
    if a is None or b is None:
        return None
    shared = a.index.intersection(b.index)
    if len(shared) == 0:
        return None
    diff = (b.loc[shared] - a.loc[shared]).to_numpy(dtype=float)
    seeds = rule.replicates(base)
    units = diff
    if seeds is not None and len(seeds) == len(a):
        cluster = pd.Series(seeds, index=a.index).loc[shared].to_numpy()
        if len(np.unique(cluster)) < len(shared):
            units = pd.Series(diff).groupby(cluster).mean().to_numpy()
    p = float(stats.wilcoxon(units).pvalue) if np.any(units != 0) else 1.0
    return {"baseline_score": float(np.median(a.loc[shared])), "bort_score": float(np.median(b.loc[shared])),
            "median_difference": float(np.median(diff)), "wilcoxon_p": p, "n": len(shared), "units": len(units),
            "images_dropped": len(a) + len(b) - 2 * len(shared)}


def holm(p: pd.Series) -> pd.Series:
    """Holm's step-down adjustment of a family's p-values -> the adjusted p-values, in the same order: the k-th
    smallest of m multiplied by m - k + 1, kept monotone, at most 1."""
    order = np.argsort(p.to_numpy(), kind="stable")
    m = len(p)
    scaled = np.maximum.accumulate(p.to_numpy()[order] * (m - np.arange(m)))
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(scaled, 1.0)
    return pd.Series(adjusted, index=p.index)
