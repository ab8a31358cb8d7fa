"""The report's first section: the answer at a glance.

The verdict matrix (methods x checks and models: each cell's outcome by colour and mark, the mechanism by a
letter; the controls' rows show the checks sound), the compact table (each check's cell in at most about 40
characters: its mark, what it read, the median and its interval), one sentence per rejected method, the undecided
cells with about the images that would decide them, and how to read the checks (one row per check: its question,
its measure, what rejects). Every cell is read from the verdict table's data (``outcome_<check>``,
``short_<check>``, ``needed_<check>``, ``mechanisms``), never parsed back from its text; the full cells (references,
seeds, looks) stay in the appendix's verdict table, the results CSV files and the manifest.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pandas as pd

from audit.checks import CHECKS
from audit.checks.base import INCONCLUSIVE, MARKS, REJECTED
from audit.run.config import AuditConfig
from reports.mechanisms import MULTIPLIER, RANK_ONE, RECOVERY

# a letter per mechanism, for the matrix's cells; its legend says them in words
MECHANISM_MARKS = {RANK_ONE: "C", RECOVERY: "R", MULTIPLIER: "M"}
LEGEND = ("marks: \u2717 rejected, \u2013 not rejected (not a certificate), ? inconclusive, blank: not run or not "
          "applicable; letters after a rejection: the mechanism the measurements support, C rank-1 chain convergence, "
          "R partial input recovery, M input multiplier (none: none measured)")


def checks_in(verdict: pd.DataFrame) -> list[str]:
    """The checks with a verdict in ``verdict`` (its ``outcome_<check>`` columns), in the registry's order."""
    return [name for name in CHECKS if f"outcome_{name}" in verdict]


def _mark(row: dict[str, Any], check: str) -> str:
    """A matrix cell: the outcome's mark, and after a rejection the mechanisms' letters."""
    outcome = row.get(f"outcome_{check}")
    if not outcome:
        return ""
    found = row["mechanisms"].get(check, []) if isinstance(row.get("mechanisms"), dict) else []
    return MARKS[outcome] + "".join(MECHANISM_MARKS.get(name, "") for name in found)


def matrix_table(verdict: pd.DataFrame) -> pd.DataFrame:
    """The verdict matrix as a table: one row per method (the controls last), a column per model and check
    (``"<model>: <check>"``), each cell :func:`_mark`'s mark."""
    return _matrix(verdict, _mark)


def matrix_outcomes(verdict: pd.DataFrame) -> pd.DataFrame:
    """:func:`matrix_table`'s layout with each cell's outcome ("" where the check says nothing)."""
    return _matrix(verdict, lambda row, check: str(row.get(f"outcome_{check}") or ""))


def _matrix(verdict: pd.DataFrame, cell: Callable[[dict[str, Any], str], str]) -> pd.DataFrame:
    """Methods (the controls last) x ``"<model>: <check>"`` columns, each ``cell(row, check)``; a check that says
    nothing on a model is left out."""
    checks, models = checks_in(verdict), list(dict.fromkeys(verdict.model))
    ordered = pd.concat([verdict[verdict.role == "method"], verdict[verdict.role == "control"]])
    rows: dict[str, dict[str, str]] = {}
    for record in cast(list[dict[str, Any]], ordered.to_dict("records")):
        cells = rows.setdefault(str(record["method"]), {"method": str(record["method"])})
        for check in checks:
            cells[f"{record['model']}: {check}"] = cell(record, check)
    columns = ["method"] + [f"{model}: {check}" for model in models for check in checks]
    matrix = pd.DataFrame(list(rows.values())).reindex(columns=columns).fillna("")
    return matrix[[c for c in columns if c == "method" or matrix[c].astype(bool).any()]]  # not run on a model: left out


def compact_table(verdict: pd.DataFrame) -> pd.DataFrame:
    """The main table: model, method, each check's compact cell (mark, reading, median and interval), the verdict's
    outcome and the mechanisms' letters; every cell at most about 40 characters."""
    checks = checks_in(verdict)
    rows = []
    for record in verdict.to_dict("records"):
        found = record["mechanisms"] if isinstance(record["mechanisms"], dict) else {}
        letters = sorted({MECHANISM_MARKS[name] for names in found.values() for name in names
                          if name in MECHANISM_MARKS})
        rows.append({"model": record["model"], "method": record["method"],
                     **{check: record[f"short_{check}"] for check in checks},
                     "verdict": record["outcome"],
                     "mechanism": ", ".join(letters) if letters else ("none measured" if found else "")})
    return pd.DataFrame(rows, columns=["model", "method", *checks, "verdict", "mechanism"])


def rejected_sentences(verdict: pd.DataFrame) -> list[str]:
    """One sentence per rejected method: each check that rejected it, on which models, why (the rule's reason,
    ``reason_<check>``) and the mechanisms the measurements support there (``mechanisms``)."""
    methods = verdict[verdict.role == "method"]
    every = set(methods.model)
    out = []
    for method, rows in methods[methods.outcome == REJECTED].groupby("method", sort=False):
        parts = []
        for check in checks_in(verdict):
            hit = rows[rows[f"outcome_{check}"] == REJECTED]
            if hit.empty:
                continue
            models = list(hit.model)
            where = ("on both models" if len(every) == 2 else "on every model") \
                if set(models) == every and len(every) > 1 else "on " + _listed(models)
            reasons = list(dict.fromkeys(str(r) for r in hit[f"reason_{check}"] if r))
            found = list(dict.fromkeys(name for names in hit.mechanisms for name in
                                       (names.get(check, []) if isinstance(names, dict) else [])))
            parts.append(f"{check} {where} ({'; '.join(reasons)}"
                         + (f"; mechanism: {_listed(found)}" if found else "; no mechanism measured") + ")")
        out.append(f"{method} is rejected by {_listed(parts, ', ')}.")
    return out


def _listed(items: list[str], comma: str = ", ") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else comma.join(items[:-1]) + " and " + items[-1]


def undecided(verdict: pd.DataFrame) -> str:
    """The inconclusive cells of the methods (controls not counted), with about the images each would need."""
    cells = []
    for record in verdict[verdict.role == "method"].to_dict("records"):
        for check in checks_in(verdict):
            if record[f"outcome_{check}"] != INCONCLUSIVE:
                continue
            needed = record[f"needed_{check}"]
            cells.append(f"{record['method']} on {record['model']} ({check}"
                         + (f", about {int(needed)} images" if needed is not None and needed == needed else "") + ")")
    if not cells:
        return "No cell is inconclusive."
    return (f"{len(cells)} cells are inconclusive; each with about the images that would decide it where its interval "
            "can say (its width scaled as one over the square root of the images to its distance from what decides "
            "it): " + "; ".join(cells) + ".")


def how_to_read(verdict: pd.DataFrame, config: AuditConfig) -> pd.DataFrame:
    """One row per check with a verdict: its question, the measure its verdict reads and what rejects."""
    rows = []
    for name in checks_in(verdict):
        check, rule = CHECKS[name], CHECKS[name].verdict
        assert rule is not None  # checks_in keeps the checks with a verdict
        options = check.options_from(config.options, config.looks, config.family)
        rows.append({"check": name, "question": check.question, "measure": rule.score_name,
                     "rejected when": rule.rejects_when(options)})
    return pd.DataFrame(rows, columns=["check", "question", "measure", "rejected when"])
