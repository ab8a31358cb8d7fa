"""Model parameter randomization (Adebayo et al. 2018; Sixt et al. 2020; Hedstrom et al. 2023).

Stage 0 is the trained model; each later stage re-initialises parameterised layers, taken in
forward execution order from the traced graph: cumulatively from the logits down
(``cascading``), one at a time (``independent``) or cumulatively from the input up
(``bottom-up``). Each layer's own ``reset_parameters`` draws from a generator seeded by
(seed, layer name), so stages are reproducible and independent of the global RNG. BatchNorm
that follows a re-initialised layer is ``reset`` (gamma 1, beta 0, mean 0, var 1, as Sixt) or
keeps its statistics (``keep-stats``, as Adebayo). All work happens on copies of the model, and
each stage's forward pass is shared by all methods.
"""
from __future__ import annotations

import copy
import zlib

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from attributions.explainer import Explainer, attribute_many, shared_forward
from attributions.graph import trace
from audit.errors import AuditError
from audit.inputs import check_inputs, check_labels
from audit.maps import ReferenceMaps, heatmaps
from audit.methods import check_option, resolve_methods

ORDERS = ("cascading", "independent", "bottom-up")
BN_POLICIES = ("reset", "keep-stats")
TARGETS = ("true", "predicted")
COLUMNS = ["method", "stage", "layer", "image", "ssim", "spearman", "spearman_abs", "hog"]


def parameterised_layers(model: nn.Module) -> list[tuple[str, nn.Module, nn.Module | None]]:
    """(name, module, folded BatchNorm or None) of each conv / dense / BatchNorm layer, in forward order."""
    graph = trace(model)
    out, seen = [], set()
    for node in graph.nodes:
        if node.kind in ("conv", "dense", "affine") and id(node.module) not in seen:
            seen.add(id(node.module))
            out.append((node.name.split("#")[0], node.module, node.bn))
    return out


def reinitialise(module: nn.Module, name: str, seed: int) -> None:
    """``module.reset_parameters()`` with a generator seeded by (seed, name); global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
        module.reset_parameters()


def reset_batchnorm(bn: nn.Module) -> None:
    with torch.no_grad():
        if bn.weight is not None:
            bn.weight.fill_(1.0)
            bn.bias.zero_()
        bn.running_mean.zero_()
        bn.running_var.fill_(1.0)


def randomization_stages(model: nn.Module, order: str = "cascading", bn: str = "reset", seed: int = 0,
                         layers: list | None = None):
    """Yield (stage, layer name, model copy) for stage 0 (the original) and each randomisation stage.

    ``layers``: the result of :func:`parameterised_layers` when the caller already has it.
    """
    check_option("order", order, ORDERS)
    check_option("BatchNorm policy", bn, BN_POLICIES)
    layers = layers if layers is not None else parameterised_layers(model)
    sequence = list(reversed(layers)) if order in ("cascading", "independent") else layers
    current = copy.deepcopy(model)
    yield 0, "original", current
    for stage, (name, _, _) in enumerate(sequence, start=1):
        target = copy.deepcopy(model) if order == "independent" else current
        modules = dict(target.named_modules())
        module = modules[name]
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            if bn == "reset":
                reset_batchnorm(module)
        else:
            reinitialise(module, name, seed)
            folded = next((b for n, m, b in layers if n == name), None)
            if folded is not None and bn == "reset":
                reset_batchnorm(modules[_module_name(model, folded)])
        current = target
        yield stage, name, target


def _module_name(model: nn.Module, module: nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is module)


def parameter_randomization(model: nn.Module, x, y, methods="all", order: str = "cascading", bn: str = "reset",
                            target: str = "true", seed: int = 0, reduction: dict | None = None,
                            progress: bool = True, keep_maps: int = 0):
    """Similarity of each method's maps at every randomisation stage to the trained model's maps.

    Parameters
    ----------
    model : nn.Module; never modified (stages are copies)
    x : (B, C, H, W) images; y : (B,) labels
    methods : names, "all" or a comma-separated string
    order : cascading | independent | bottom-up
    bn : reset | keep-stats (BatchNorm after a re-initialised layer)
    target : true (the label, as Sixt) | predicted (each stage's own prediction, as Adebayo)
    seed : seeds the re-initialisations
    reduction : {method: "sum" | "max-abs"} overrides of the heatmap reduction
    keep_maps : also return the raw heatmaps of the first ``keep_maps`` images at every stage

    Returns
    -------
    DataFrame, one row per method x stage x image: method, stage, layer (the layer re-initialised at
    that stage; "original" for stage 0), image, ssim (flip-invariant), spearman, spearman_abs, hog.
    With ``keep_maps``: (DataFrame, {method: (stages, keep_maps, H, W) array}).
    """
    x, y = check_inputs(model, x, y)
    if y is None:
        raise AuditError("parameter_randomization needs the labels y")
    check_option("target", target, TARGETS)
    names = resolve_methods(methods)
    layers = parameterised_layers(model)
    reference, graph = None, None
    rows, kept = [], {m: [] for m in names}
    stages = randomization_stages(model, order, bn, seed, layers)  # lazily: cascading stages share one copy
    for stage, layer, stage_model in tqdm(stages, total=1 + len(layers), desc=f"randomization ({order})",
                                          disable=not progress, leave=False):
        if graph is None or order == "independent":  # cascading stages modify one copy: trace it once
            graph = trace(stage_model)
        # the random control draws afresh at every stage (seeded by the stage), a floor for the scores
        explainers = {m: Explainer(stage_model, m, graph=graph, **({"seed": seed + stage} if m == "random" else {}))
                      for m in names}
        envs = shared_forward(explainers, x)
        logits = envs[0][graph.output] if envs else Explainer(stage_model, "gradient", graph=graph).forward(x).detach()
        if stage == 0:
            check_labels(y, logits.shape[1])
        t = y if target == "true" else logits.argmax(1)
        maps = heatmaps({m: v[0] for m, v in attribute_many(explainers, x, [t], envs).items()}, reduction)
        if reference is None:
            reference = {m: ReferenceMaps(v) for m, v in maps.items()}
        for m in names:
            if keep_maps:
                kept[m].append(maps[m][:keep_maps].numpy())
            sims = reference[m].compare(maps[m])
            for i in range(len(x)):
                rows.append({"method": m, "stage": stage, "layer": layer, "image": i,
                             **{k: float(v[i]) for k, v in sims.items()}})
    df = pd.DataFrame(rows, columns=COLUMNS)
    return (df, {m: np.stack(v) for m, v in kept.items()}) if keep_maps else df
