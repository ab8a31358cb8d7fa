"""Why a rejected method failed: the mechanism each rejecting check's measurements support, per (check, method).

Three mechanisms, not to be conflated (DESIGN 3.3c), each decided by a measurement, never by the method's name
alone:

* **rank-1 chain convergence** (Sixt et al. 2020, Theorem 1): the chain is one the theorem covers (linear in the
  signal, non-negative matrices at its weighted layers: :attr:`attributions.Method.nonnegative_chain`), its CSC
  reaches the threshold (the whole interval) at the layer nearest the logits where it does (the layer the verdict
  rejected at; else the input), and its spectrum there is that of one direction:
  sigma2 / sigma1 at most the bound a chain reaching the threshold by convergence meets
  (:func:`~audit.checks.convergence.rank_one_ratio`, 0.072 for 0.99; the effective rank is shown beside it, not
  read against a threshold of its own, since none is derived for it). A high CSC of sparse signals (one channel
  alive at a position) fails the spectrum test;
* **partial input recovery** (Nie, Zhang & Patel 2018): a ReLU or threshold on the backward signal, and the map
  follows the input more than the gradient's map does on the same model and images;
* **input multiplier** (Adebayo et al. 2018; Kindermans et al. 2019): the map is the input times a factor (input
  x gradient, integrated gradients, DeepLIFT, LRP whose first layer hands each input x times a factor), and it
  follows the input more than the gradient's map does on the same model and images.

"Follows the input" is measured, not assumed: the per-image Spearman correlation of ``|map|`` with the input's
magnitude and with its edges (:func:`audit.measures.heatmaps.input_structure`), paired with the gradient's on the
same model (the randomized stage, the twin), whose median difference must have its 99 % bootstrap interval above 0
for one of the two. The gradient is the reference because it is the map without the mechanism (no rectification,
no input factor); the edge control's values are shown beside.

Which mechanisms can explain which check: a chain that converges explains CSC, the random logit and the survival
of the top layers' randomization; it cannot explain the survival of label permutation (the twin's lower layers
are trained anew), which only what the map follows (the input) can. More than one may hold; "none measured" is an
answer.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from attributions.methods import build_method
from audit.checks.convergence import ConvergenceOptions, converged_row, median_interval, rank_one_ratio
from audit.checks.randomization import CascadingOptions
from audit.measures.heatmaps import FOLLOWED
from audit.measures.statistics import bootstrap_ci
from audit.run.config import AuditConfig

RANK_ONE, RECOVERY, MULTIPLIER = "rank-1 chain convergence", "partial input recovery", "input multiplier"
REFERENCE = "gradient"  # the paired reference of "follows the input"

MECHANISMS = ("rank-1 chain convergence (Sixt et al. 2020, Theorem 1: a chain of non-negative matrices, linear in "
              "the signal, whose CSC interval at the input reaches the threshold and whose spectrum is one "
              "direction: sigma2/sigma1 at most the bound of a chain that reaches the threshold by convergence; the "
              "effective rank is shown beside it); partial input recovery (Nie, Zhang & Patel 2018: a ReLU or "
              "threshold on the backward signal, and the map follows the input more than the gradient's map on the "
              "same model and images: the 99 % interval of the median paired difference of their Spearman "
              "correlations of |map| with |input| or with the input's edges lies above 0); input multiplier "
              "(Adebayo et al. 2018; Kindermans et al. 2019: the map is the input times a model-dependent factor, "
              "and it follows the input as above). "
              "Named per rejecting check: chain convergence can explain CSC, the random logit and the survival of the "
              "top layers' randomization, never the survival of label permutation; 'none measured' is an answer.")


def rank_one(csc: pd.DataFrame | None, model: str, method: str, threshold: float) -> tuple[bool | None, str]:
    """Whether the chain converges to rank 1 (see the module's text), and the evidence; None where CSC was not
    run."""
    rows = converged_row(csc, model, method, threshold)
    if rows.empty:
        return None, "CSC not run"
    if not build_method(method).nonnegative_chain:
        return False, "not a chain of non-negative matrices (outside Theorem 1)"
    row, low = rows.iloc[0], float(median_interval(rows)[1][0])
    where = "the input" if row["layer"] == "input" else str(row["layer"])
    ratio, directions = float(row.get("sigma2_over_sigma1", np.nan)), float(row.get("effective_rank", np.nan))
    if ratio != ratio or directions != directions:
        return None, f"CSC {row['median']:.3f} at {where}; its spectrum not measured"
    bound = rank_one_ratio(threshold)
    holds = low >= threshold and ratio <= bound
    return holds, (f"CSC {row['median']:.3f} at {where} (interval from {low:.3f}), sigma2/sigma1 {ratio:.3f} "
                   f"(bound {bound:.3f}), effective rank {directions:.2f}")


def follows_input(table: pd.DataFrame | None, model: str, method: str,
                  select: Callable[[pd.DataFrame], pd.DataFrame]) -> tuple[bool | None, str]:
    """Whether the map follows the input (its magnitude, or its edges: :data:`FOLLOWED`) more than the gradient's
    map on the same model and images: the 99 % bootstrap interval of the median paired difference of their
    Spearman correlations above 0 for one of the two; and the evidence. None where it cannot be measured (no such
    column, no gradient rows, the gradient itself)."""
    columns = [c for c in FOLLOWED if table is not None and c in table]
    if table is None or table.empty or not columns:
        return None, "not measured"
    if method == REFERENCE:
        return None, "the gradient is the paired reference"
    own = select(table[(table.model == model) & (table.method == method)])
    reference = select(table[(table.model == model) & (table.method == REFERENCE)])
    if own.empty or reference.empty:
        return None, "not measured (the gradient, the paired reference, was not run)"
    edge = select(table[(table.model == model) & (table.method == "edge")])
    paired = own.merge(reference, on="image", suffixes=("", "_reference"))
    holds: bool | None = None
    texts, controls = [], []
    for column in columns:
        est, low, high = bootstrap_ci((paired[column] - paired[f"{column}_reference"]).to_numpy(), 0.99)
        if est != est:
            continue
        holds = bool(holds) or bool(low > 0)
        texts.append(f"with {FOLLOWED[column]} {float(own[column].median()):.2f}, {est:+.2f} [{low:+.2f}, {high:+.2f}]")
        if not edge.empty:
            controls.append(f"{float(edge[column].median()):.2f}")
    if holds is None:
        return None, "not measured (no image with defined maps)"
    return holds, (f"Spearman of |map| {' and '.join(texts)} against the gradient's"
                   + (f"; edge control {', '.join(controls)}" if controls else ""))


def _input_mechanism(method: str) -> str:
    spec = build_method(method)
    return RECOVERY if spec.rectifies_signal else MULTIPLIER if spec.input_multiplier else "follows the input"


def _top_stage(config: AuditConfig) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """The rows of the last stage of the model's top part (the stage the cascading verdict reads)."""
    top = CascadingOptions.parse(config.options).randomization_top

    def select(rows: pd.DataFrame) -> pd.DataFrame:
        if rows.empty:
            return rows
        return rows[rows.stage == min(top, int(rows.stage.max()))]
    return select


def candidates(check: str, model: str, method: str, tables: dict[str, Any],
               config: AuditConfig) -> list[tuple[str, bool | None, str]]:
    """The mechanisms that could explain ``method``'s rejection by ``check``, each measured: (name, whether it
    holds (None: not measured), the evidence)."""
    threshold = ConvergenceOptions.parse(config.options).csc_threshold
    out: list[tuple[str, bool | None, str]] = []
    if check in ("csc", "random-logit", "cascading"):
        out.append((RANK_ONE, *rank_one(tables.get("csc"), model, method, threshold)))
    where = {"random-logit": [lambda rows: rows], "cascading": [_top_stage(config), _last_stage],
             "data-randomization": [lambda rows: rows]}
    if check in where:  # cascading: at the top part's last stage (survival), else at full randomization (the floor)
        found = [follows_input(tables.get(check), model, method, select) for select in where[check]]
        out.append((_input_mechanism(method), *next((f for f in found if f[0]), found[0])))
    return out


def _last_stage(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the fully randomized model (the last cascading stage)."""
    return rows[rows.stage == int(rows.stage.max())] if not rows.empty else rows


def check_mechanisms(check: str, model: str, method: str, tables: dict[str, Any],
                     config: AuditConfig) -> list[str]:
    """The names of the mechanisms the measurements support for ``method``'s rejection by ``check`` (none: []);
    :func:`evidence_table` holds the measurements."""
    return [name for name, holds, _ in candidates(check, model, method, tables, config) if holds]


def mechanisms(model: str, method: str, rejecting: list[str], tables: dict[str, Any],
               config: AuditConfig) -> dict[str, list[str]]:
    """For each rejecting check of a rejected method, :func:`check_mechanisms`."""
    return {check: check_mechanisms(check, model, method, tables, config) for check in rejecting}


def mechanism_text(found: dict[str, list[str]]) -> str:
    """The mechanism column's text of :func:`mechanisms`' result: per check, its names or "none measured"."""
    return ". ".join(f"{check}: {' and '.join(names) if names else 'none measured'}" for check, names in found.items())


def mechanism(model: str, method: str, rejecting: list[str], tables: dict[str, Any], config: AuditConfig) -> str:
    """The mechanism text of a rejected method: for each rejecting check, the mechanisms it supports."""
    return mechanism_text(mechanisms(model, method, rejecting, tables, config))


def evidence_table(verdict: pd.DataFrame, tables: dict[str, Any], config: AuditConfig) -> pd.DataFrame:
    """The measurements behind the verdict's mechanism column: one row per rejected method x rejecting check x
    candidate mechanism (model, method, check, mechanism, result: holds / does not hold / not measured, evidence).

    ``verdict``: :func:`reports.verdict.verdict_table`'s rows; a check rejected a row where its ``outcome_<check>``
    column says so."""
    rows = []
    outcomes = [c for c in verdict.columns if c.startswith("outcome_")]
    for _, row in verdict[verdict.role == "method"].iterrows():
        for column in outcomes:
            if row[column] != "rejected":
                continue
            check = column.removeprefix("outcome_")
            for name, holds, text in candidates(check, row.model, row.method, tables, config):
                rows.append({"model": row.model, "method": row.method, "check": check, "mechanism": name,
                             "result": "not measured" if holds is None else "holds" if holds else "does not hold",
                             "evidence": text})
    return pd.DataFrame(rows, columns=["model", "method", "check", "mechanism", "result", "evidence"])
