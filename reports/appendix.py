"""The appendix's verdict section: every cell in full, looked up rather than read.

One table per check (its rule in the caption, where it is read): each model x method's cell of the measure the
verdict reads, in full (the reading, the references, the seeds' range, the looks and the images read), beside the
compact cells of the measures that do not carry the verdict; then the matrix as a table, the scales the verdicts
read on, the measure-dependent pairs, the mechanisms' evidence, the sensitivity to the fixed thresholds and the
controls. The whole verdict table, every column, is also written as ``verdict.csv``.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from audit.checks import CHECKS
from audit.checks.options import look_level
from audit.run.config import AuditConfig
from audit.sections import Section, Table
from reports.answer import LEGEND, checks_in, matrix_table
from reports.mechanisms import MECHANISMS, evidence_table
from reports.sensitivity import sensitivity_table
from reports.verdict import broken_checks, dependent_pairs, family_wise_error, scales_table, summary_line


def statistics_text(verdict: pd.DataFrame, tables: dict[str, Any], config: AuditConfig) -> str:
    """The section's text: the summary, how the intervals are read (level, looks), the controls and the
    family-wise error; each check's own rule stands in its table's caption."""
    ran = [c for c in CHECKS.values() if c.verdict is not None and c.name in tables]
    broken = broken_checks(verdict)
    looks = (f" The images were read in up to {config.looks} looks of {config.n_images}, up to {config.max_images}, "
             f"each cell until it was decided; each interval is at {look_level(config.looks, config.family):.2%}, "
             "the level split over the looks, and each cell names the images it read." if config.looks > 1 else "")
    return (summary_line(verdict) + ". A method is rejected when any check rejects it; each check's rule is in its "
            f"table's caption. Medians over images with their bootstrap interval (10,000 resamples) at "
            f"{look_level(1, config.family):.2%}.{looks} Images whose maps are constant or non-finite have no defined "
            "score and are counted in the cell. The controls are not counted; each must have the outcome its check "
            "names, else the check is broken." + (" BROKEN: " + "; ".join(broken) + "." if broken else "")
            + (f" {family_wise_error(len(ran), sum(c.verdict.readings for c in ran if c.verdict))}." if ran else ""))


def check_tables(verdict: pd.DataFrame, config: AuditConfig) -> list[Table]:
    """One table per check with a verdict: model, method and the verdict measure's cell in full; the caption states
    the check's rule."""
    out = []
    for name in checks_in(verdict):
        check = CHECKS[name]
        rule = check.verdict
        assert rule is not None  # checks_in keeps the checks with a verdict
        options = check.options_from(config.options, config.looks, config.family)
        out.append(Table(pd.DataFrame({"model": verdict.model, "method": verdict.method,
                                       f"{rule.score_name}, in full": verdict[rule.text_column]}),
                         f"{name}, every cell: {rule.rule_text(options)}.", f"verdict_{name}"))
    return out


def side_table(verdict: pd.DataFrame) -> pd.DataFrame:
    """The measures that do not carry a verdict, compact (``short_<text column>``: the outcome's mark, the median
    and its interval): model, method and a column ``"<check>: <measure>"`` per side rule."""
    columns = {f"{name}: {r.score_name}": f"short_{r.text_column}" for name in checks_in(verdict)
               for r in CHECKS[name].side_rules if f"short_{r.text_column}" in verdict}
    return pd.DataFrame({"model": verdict.model, "method": verdict.method,
                         **{heading: verdict[column] for heading, column in columns.items()}}) if columns \
        else pd.DataFrame()


def verdict_section(verdict: pd.DataFrame, tables: dict[str, Any], config: AuditConfig,
                    figures: list[Any]) -> Section:
    """The appendix's "Verdict in full": :func:`statistics_text`, the tables named in the module's text and
    ``figures`` (one score across models, for an audit of more than two)."""
    scales = scales_table(tables, config)
    evidence = evidence_table(verdict, tables, config)
    sensitivity = sensitivity_table(tables, config)
    dependent = dependent_pairs(verdict)
    controls = verdict[verdict.role == "control"]
    found: list[Table] = [
        Table(matrix_table(verdict), f"Verdict matrix as a table; {LEGEND}.", "matrix", printed=False),
        *check_tables(verdict, config),
        Table(side_table(verdict), "The measures that do not carry the verdict, read by the same rule as their "
                                   "check's (each cell in full: verdict.csv).", "side_measures"),
        Table(scales, "The scales the randomization verdicts read on: per check, measure and model, the random "
                      "map's median score (unrelated), the edge map's (unchanged) and their midpoint; a score nearer "
                      "the unchanged end is read as unchanged.", "scales"),
        Table(dependent[["model", "method", "measure_dependent"]].rename(
            columns={"measure_dependent": "outcome by measure"}),
            "Measure-dependent outcomes: the pairs where one measure of a check rejects and another does not (the "
            "verdict reads each check's own measure).", "measure_dependent"),
        Table(evidence, "The measurements behind the mechanism letters: for each rejected method and each check that "
                        "rejected it, every mechanism that could explain it, whether it holds, and what was measured. "
                        "The mechanisms: " + MECHANISMS, "mechanisms", printed=False),
        Table(sensitivity, "How far the outcomes rest on the fixed thresholds: each check's outcomes over the "
                           "audited methods (controls left out) re-read at thresholds around the run's (marked run), "
                           "and the pairs whose outcome changes. The intervals do not move with the threshold; only "
                           "the side they fall on. The verdicts read on the controls' scale (cascading, data "
                           "randomization, sMPRT) have no fixed threshold and are not listed.", "sensitivity",
              printed=False),
        Table(controls[["model", "method", "control_check"]].rename(
            columns={"method": "control", "control_check": "outcome its checks name"}),
            "The controls: whether each check gave each control the outcome it must have (else the check is "
            "broken on that model).", "controls")]
    return Section("Verdict in full", statistics_text(verdict, tables, config) + " Every column of the verdict "
                   "table: verdict.csv.", tables=[t for t in found if not t.frame.empty], figures=figures,
                   appendix=True)
