"""The source papers' results beside this run's: Sixt et al.'s CSC at the input and Adebayo et al.'s outcomes.

Each table has one row per method the paper reports and the run audited, the paper's result, and per model this
run's number with "agrees" or "differs". The papers' results are what their text states (DESIGN 3.3c): nothing
here is tuned to agree, and a shipped model that differs from a paper is shown as differing.
"""
from __future__ import annotations

import pandas as pd

from audit.checks.base import REJECTED
from audit.checks.convergence import ConvergenceOptions
from audit.run.config import AuditConfig
from audit.sections import Section, Table
from reports.verdict import csc_at_input

# Sixt, Granz & Landgraf 2020 (VGG-16 and ResNet-50 on ImageNet): whether the chain's CSC at the input reaches 0.99.
# Every analysed modified-backprop method does (guided backprop and RectGrad by another mechanism), except LRP-z
# and DeepLIFT; the gradient does not converge.
SIXT_CSC = {"lrp-zplus": True, "lrp-alpha1beta0": True, "deep-taylor": True, "excitation-backprop": True,
            "lrp-cmp-alpha1beta0": True, "deeplift-ablation": True, "patternattribution": True,
            "guided-backprop": True, "rectgrad": True, "lrp-z": False, "deeplift": False, "gradient": False}

# Adebayo et al. 2018 (Inception v3 on ImageNet; a CNN and an MLP on MNIST / Fashion-MNIST): the outcome each
# method had. Cascading: "Gradients & GradCAM pass the sanity checks, while Guided BackProp & Guided GradCAM are
# invariant to higher layer parameters"; input x gradient and IG keep a high SSIM (look-alikes, carried by the
# input). Data randomization: gradient, SmoothGrad and Grad-CAM changed; guided backprop, IG and input x gradient
# kept the input's structure.
ADEBAYO = {"cascading": {"gradient": "not rejected", "grad-cam": "not rejected", "guided-backprop": REJECTED,
                         "guided-grad-cam": REJECTED, "input-x-gradient": REJECTED, "integrated-gradients": REJECTED},
           "data-randomization": {"gradient": "not rejected", "smoothgrad": "not rejected",
                                  "grad-cam": "not rejected", "guided-backprop": REJECTED,
                                  "integrated-gradients": REJECTED, "input-x-gradient": REJECTED}}
TEXT_COLUMNS = {"cascading": "cascading", "data-randomization": "data_randomization"}


def sixt_table(verdict: pd.DataFrame, csc: pd.DataFrame | None, threshold: float) -> pd.DataFrame:
    """Sixt et al.'s CSC at the input (>= ``threshold`` or not) per method beside this run's per model."""
    models = list(dict.fromkeys(verdict.model))
    rows = []
    for method, converges in SIXT_CSC.items():
        if method not in set(verdict.method):
            continue
        row = {"method": method, "Sixt et al. 2020": f"{'>=' if converges else '<'} {threshold:g}"}
        for model in models:
            cos = csc_at_input(csc, model, method)
            row[model] = "" if cos != cos else \
                f"{cos:.3f}, {'agrees' if (cos >= threshold) == converges else 'differs'}"
        rows.append(row)
    return pd.DataFrame(rows)


def adebayo_table(verdict: pd.DataFrame, test: str) -> pd.DataFrame:
    """Adebayo et al.'s outcome per method under ``test`` beside this run's outcome (with its numbers) per model."""
    models = list(dict.fromkeys(verdict.model))
    column = TEXT_COLUMNS[test]
    rows = []
    for method, outcome in ADEBAYO[test].items():
        part = verdict[verdict.method == method]
        if part.empty or column not in verdict:
            continue
        row = {"method": method, "Adebayo et al. 2018": outcome}
        for model in models:
            cell = part[part.model == model]
            text = str(cell[column].iloc[0]) if not cell.empty else "n/a"
            if ";" in text:  # the score and its interval; the stages are in the verdict table (a table for print)
                text = text.split(";")[0] + ")"
            ours = str(cell[f"outcome_{test}"].iloc[0]) if not cell.empty and f"outcome_{test}" in cell else ""
            row[model] = text if not ours else f"{'agrees' if ours == outcome else 'differs'}: {text}"
        rows.append(row)
    return pd.DataFrame(rows)


def reproduction_sections(verdict: pd.DataFrame, tables: dict, config: AuditConfig) -> list[Section]:
    """The report's opening section: the two papers' tables, for the checks the run made."""
    out = []
    threshold = ConvergenceOptions.parse(config.options).csc_threshold
    if "csc" in tables:
        sixt = sixt_table(verdict, tables.get("csc"), threshold)
        if not sixt.empty:
            out.append(Table(sixt, f"Sixt et al. (2020), CSC at the input: the paper (VGG-16, ResNet-50 on ImageNet) "
                                   f"and this run's median |cos| at the input per model; agrees when both are on the "
                                   f"same side of {threshold:g}. A high CSC of a nonlinear backward pass (guided "
                                   "backprop, RectGrad) is convergence by another mechanism, not rank-1 collapse.",
                             "reproduction_sixt"))
    for test in ("cascading", "data-randomization"):
        if test in tables:
            table = adebayo_table(verdict, test)
            if not table.empty:
                out.append(Table(table, f"Adebayo et al. (2018), {test}: the paper's outcome per method and this run's "
                                        "outcome with its numbers per model; agrees when the outcomes are equal (an "
                                        "inconclusive outcome differs).", f"reproduction_adebayo_{test}"))
    if not out:
        return []
    return [Section("The source papers, reproduced", "What Sixt et al. (2020) and Adebayo et al. (2018) report, beside "
                    "this run's measurements on its models. The rules are not tuned to agree: a model that differs "
                    "from a paper is shown as differing.", tables=out)]
