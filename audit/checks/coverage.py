"""What a randomization check re-initialised: one row per parameter tensor, with its stage.

The record is made by drawing every stage's tensors as the check draws them (the same seeds) on a
copy of the model, so it says what the stages did, not what they were meant to do: ``changed`` is
whether the tensor's values differ from the trained ones afterwards.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from attributions.graph import trace
from attributions.hygiene import leaves_process_alone
from audit.checks.base import Coverage
from audit.checks.reinit import CONSTANT, KEPT, reinitialise_part
from audit.checks.stage_options import StageOptions, StageSettings
from audit.checks.stages import randomization_plan, resolve_granularity
from audit.inputs import check_inputs
from audit.models.copying import copy_model

COLUMNS = ["stage", "name", "tensor", "elements", "share", "how", "changed"]


@leaves_process_alone
def coverage(model: nn.Module, x: torch.Tensor, order: str = "cascading", *, granularity: str = "auto", seed: int = 0,
             init: str = "reset", bn: str = "reset") -> pd.DataFrame:
    """What a randomization check re-initialises in ``model``, tensor by tensor; ``model`` is not modified.

    Parameters
    ----------
    model : nn.Module
    x : (B, ...) inputs, traced at their shape
    order : ``cascading``, ``independent`` or ``bottom-up``
    granularity, seed, init, bn : as :class:`~audit.checks.stage_options.StageSettings`

    Returns
    -------
    DataFrame, one row per parameter tensor: the ``stage`` that re-initialises it under ``order`` (1 = the first
    randomized), the stage's ``name``, the ``tensor``'s name, its ``elements``, their ``share`` of all
    parameters, ``how`` it was drawn (:mod:`audit.checks.reinit`) and whether it ``changed``.
    """
    StageSettings(order=order, bn=bn, init=init, granularity=granularity, seed=seed)  # the checks' own errors
    x, _ = check_inputs(model, x)
    twin = copy_model(model)
    plan = randomization_plan(twin, trace(twin, x[:1].detach()), granularity)
    sizes = {n: p.numel() for n, p in twin.named_parameters()}
    total = sum(sizes.values()) or 1
    rows = []
    for index, stage in enumerate(plan):
        number = index + 1 if order == "bottom-up" else len(plan) - index
        for part in stage.parts:
            before = {t: twin.get_parameter(t).detach().clone() for t in part.tensors}
            drawn = reinitialise_part(twin, part, seed, init, bn)
            rows += [{"stage": number, "name": stage.name, "tensor": t, "elements": sizes[t],
                      "share": sizes[t] / total, "how": drawn[t],
                      "changed": not torch.equal(before[t], twin.get_parameter(t).detach())} for t in part.tensors]
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(["stage", "tensor"], kind="stable", ignore_index=True)


def summary(table: pd.DataFrame, granularity: str) -> dict[str, Any]:
    """The manifest's record of one model's coverage: stages, the share of parameters re-initialised
    after the last stage, and the tensors left trained or reset to a constant default (by name)."""
    drawn = table[table.how != KEPT]
    return {"granularity": granularity, "stages": int(table.stage.nunique()), "tensors": len(table),
            "share_reinitialised": round(float(drawn.share.sum()), 6),
            "kept_trained": table[table.how == KEPT].tensor.tolist(),
            "constant_default": table[table.how.str.endswith(CONSTANT)].tensor.tolist(),
            "unchanged": table[~table.changed].tensor.tolist()}


def recorded_in(order: Callable[[Any], str]) -> Coverage[Any]:
    """The coverage of a check whose order is an option of its own (``order(options)``, e.g. eMPRT's)."""
    return lambda model, x, options, seed: record(model, x, options, seed, order=order(options))


def record(model: nn.Module, x: torch.Tensor, options: StageOptions, seed: int, *,
           order: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A randomization check's record of ``model`` under its ``options`` and ``order``, seeded by the run's
    ``seed``: the :func:`coverage` table and its manifest :func:`summary`."""
    stages = options.stages(order, seed)
    table = coverage(model, x, order, granularity=stages.granularity, seed=seed, init=stages.init, bn=stages.bn)
    return table, summary(table, resolve_granularity(model, stages.granularity))


def describe(table: pd.DataFrame, most: int = 12) -> str:
    """One model's coverage rows as the report states them: each stage with its share of the
    parameters (the first and last ``most`` // 2 when there are more), the share all stages
    re-initialise, and the tensors reset to a constant default or left trained."""
    stages = table.groupby(["stage", "name"], sort=True).share.sum().reset_index()
    items = [f"stage {stage}: {name} ({100 * share:.1f} %)"
             for stage, name, share in zip(stages.stage, stages.name, stages.share)]
    if len(items) > most:
        items = items[: most // 2] + [f"... {len(items) - most} more ..."] + items[-(most // 2):]
    drawn = table[table.how != KEPT]
    text = (f"{'; '.join(items)}. Together the stages re-initialise {100 * drawn.share.sum():.1f} % of the parameters "
            f"({len(drawn)} of {len(table)} tensors)")
    constant = table[table.how.str.endswith(CONSTANT)]
    if len(constant):
        text += (f"; {len(constant)} tensors ({100 * constant.share.sum():.1f} %) are reset to a constant untrained "
                 "default (normalisation weights 1, biases 0), not drawn at random")
    kept = table[table.how == KEPT]
    if len(kept):
        text += f"; {len(kept)} BatchNorm tensors ({100 * kept.share.sum():.1f} %) stay trained (bn=keep-stats)"
    unchanged = table[(table.how != KEPT) & ~table.changed]
    if len(unchanged):
        text += f"; {len(unchanged)} tensors come out equal to the trained ones (e.g. {unchanged.tensor.iloc[0]})"
    return text + "."


def paragraph(run: Path, file: str, models: list[str]) -> str:
    """The report's paragraph on what the stages re-initialised, model by model, from the coverage
    rows the run wrote to ``results/<file>`` ("" when it wrote none)."""
    path = run / "results" / file
    if not path.exists():
        return ""
    table = pd.read_csv(path)
    return " ".join(f"On {m}: {describe(table[table.model == m])}" for m in models if (table.model == m).any())
