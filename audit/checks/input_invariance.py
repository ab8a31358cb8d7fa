"""Input invariance (Kindermans et al. 2017 / 2019, "The (Un)reliability of Saliency Methods").

Shift the input by a constant and compensate in the first layer's bias, so the model computes
exactly the same function of the original input; a method is not rejected when its map does not change.
Theory: gradient, Guided Backprop and DeconvNet are invariant; input x gradient, LRP-z / epsilon,
and Integrated Gradients and DeepLIFT with a zero reference are not (with the shifted reference
they would be). The controls are not rejected, trivially: the Sobel edge map ignores constant shifts and
the noise map ignores the input, so escaping this check is necessary, not sufficient.

A first convolution that pads with zeros would see unshifted zeros at the border: in the shifted
copy it pads explicitly with the shifted background (pad(u - s) + s), so the compensation is exact
there too. The logits of the shifted model on the shifted input are checked against the original's.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from attributions.explainer import Explainer, attribute_many
from attributions.graph import Graph, Node, trace
from attributions.hygiene import leaves_process_alone
from attributions.kinds import Kind
from attributions.linear_ops import explicit_padding
from attributions.methods import takes_baseline
from audit.checks.base import Check, MedianScore, UnitResult
from audit.checks.options import Options, UnitContext, option
from audit.checks.passes import Params, prepare
from audit.errors import AuditError
from audit.inputs import Images, Labels, Methods, Reduction, check_inputs, check_option, resolve_methods
from audit.measures.heatmaps import heatmaps
from audit.measures.similarity import WINDOW, normalize_map, screen, ssim
from audit.models.copying import copy_model
from audit.panels import family_panels, method_boxes, threshold_line
from audit.progress import bars
from audit.sections import Figure, ReportContext, Section

COLUMNS = ["method", "image", "relative_l2", "ssim"]
LOGIT_TOLERANCE = 1e-5  # of the largest logit magnitude


class ShiftPadded(nn.Module):
    """A convolution whose zero padding becomes padding with the shifted background ``shift`` (1, C, 1, 1)."""

    def __init__(self, conv: nn.Module, pads: tuple[int, ...], shift: torch.Tensor):
        super().__init__()
        self.conv, self.pads = conv, pads
        self.register_buffer("shift", shift)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        shift = self.get_buffer("shift")
        out: torch.Tensor = self.conv(F.pad(u - shift, self.pads) + shift)
        return out


def _shift_tensor(shift: float | Sequence[float], x: torch.Tensor) -> torch.Tensor:
    values = torch.as_tensor(shift, dtype=x.dtype).reshape(-1)
    if values.numel() not in (1, x.shape[1]):
        raise AuditError(f"shift must be one number or one per input channel ({x.shape[1]}), got {values.numel()}")
    return values.reshape(1, -1, *([1] * (x.ndim - 2))).expand(1, *x.shape[1:]).clone()


def shifted_model(model: nn.Module, x: torch.Tensor, shift: float | Sequence[float] = -1.0) -> nn.Module:
    """A copy of ``model`` that computes on ``x + shift`` exactly what ``model`` computes on ``x``:
    the first layer's bias absorbs W shift (Kindermans et al.). ``x`` (B, C, ...) gives the shapes.

    Raises
    ------
    AuditError
        When the input reaches more than one layer first, the first layer is not a convolution or
        dense layer used once, or the logits of the copy differ (naming the first layer).
    """
    graph = trace(model, x)
    node, path = _first_layer(model, graph)
    s = _shift_tensor(shift, x)
    with torch.no_grad():
        # the shift as the layer sees it
        seen = Explainer(model, "gradient", graph=graph).forward_pass(s, reference=False).values[node.inputs[0]]
    shifted = copy_model(model)
    layer: Any = shifted.get_submodule(path)  # a Conv / Linear (checked above); typed loosely for its fields
    w = layer.weight.detach()
    bias = layer.bias.detach() if layer.bias is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
    replacement: nn.Module = layer
    if node.kind == Kind.DENSE:
        offset = seen.reshape(1, -1) @ w.T
    else:
        if layer.groups != 1 or seen.ndim != w.ndim:
            raise AuditError(f"input invariance: the first convolution {node.name!r} must have groups=1 and read the "
                             "input directly")
        per_channel = seen.reshape(seen.shape[1], -1)
        if not torch.equal(per_channel, per_channel[:, :1].expand_as(per_channel)):
            raise AuditError(f"input invariance: the shift reaches the first convolution {node.name!r} unevenly")
        c = per_channel[:, 0].reshape(1, -1, *([1] * (w.ndim - 2)))
        offset = (w * c).sum(dim=tuple(range(1, w.ndim)))[None]
        pads, mode, _ = explicit_padding(layer)
        zero_pads = layer.padding_mode == "zeros" and (pads is not None or any(p != 0 for p in layer.padding))
        if zero_pads:
            pads = pads if pads is not None else tuple(p for p in reversed(layer.padding) for _ in range(2))
            layer.padding = (0,) * (w.ndim - 2)
            replacement = ShiftPadded(layer, pads, c.clone())
    layer.bias = nn.Parameter((bias - offset.reshape(-1)).clone(), requires_grad=False)
    if replacement is not layer:
        parent, _, child = path.rpartition(".")
        setattr(shifted.get_submodule(parent) if parent else shifted, child, replacement)
    with torch.no_grad():  # through the traced graphs: the user's hooks never run
        before = Explainer(model, "gradient", graph=graph).forward(x)
        after = Explainer(shifted, "gradient").forward(x + s)
    scale = float(before.abs().max()) or 1.0
    if not torch.allclose(before, after, rtol=0.0, atol=LOGIT_TOLERANCE * scale):
        raise AuditError(f"input invariance: compensating the shift in {node.name!r} does not reproduce the logits "
                         f"(max difference {float((before - after).abs().max()):.3g}, allowed "
                         f"{LOGIT_TOLERANCE * scale:.3g}); a normalisation or nonlinearity before it depends on the shift")
    return shifted


def _first_layer(model: nn.Module, graph: Graph) -> tuple[Node, str]:
    """The graph node of the one layer that reads the input, and its module's path: a convolution or dense layer
    called once (else an :class:`AuditError` saying what the model has instead)."""
    firsts = sorted(graph.first_layers())
    if len(firsts) != 1:
        raise AuditError(f"input invariance compensates the shift in the one layer that reads the input; this "
                         f"model's input reaches {len(firsts)}: {', '.join(firsts) or 'none'}")
    node = graph.by_name[firsts[0]]
    owner = node.tensors.module if node.kind in (Kind.CONV, Kind.DENSE) else None
    names = [n for n, m in model.named_modules() if m is owner and isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]
    uses = sum(1 for n in graph.nodes if n.kind in (Kind.CONV, Kind.DENSE) and n.tensors.module is owner)
    if node.kind not in (Kind.CONV, Kind.DENSE) or len(names) != 1 or uses != 1:
        raise AuditError(f"input invariance: the first layer {node.name!r} ({node.kind}) must be a convolution or a "
                         "dense layer called once, whose bias can absorb the shift")
    return node, names[0]


REFERENCES = ("zero", "shifted")


@leaves_process_alone
def input_invariance(model: nn.Module, x: Images, y: Labels, methods: Methods = "all", *,
                     shift: float | Sequence[float] = -1.0, seed: int = 0, reduction: Reduction | None = None,
                     progress: bool = True, reference: str = "zero", params: Params | None = None) -> pd.DataFrame:
    """Whether each method's maps survive a constant input shift that the model compensates.

    Parameters
    ----------
    model : nn.Module; never modified (the shifted model is a copy)
    x : (B, C, H, W) images
    y : (B,) labels (the explained class)
    shift : the constant added to the input, one number or one per channel (-1 on [0, 1] images)
    methods : names, "all" or a comma-separated string
    seed : both passes draw the same noise from it (SmoothGrad), so only the shift differs
    reduction : {method: "sum" | "max-abs"} overrides of the heatmap reduction
    progress : whether to show progress bars
    reference : the reference input of DeepLIFT and integrated gradients on the shifted input: "zero"
        (as on the original, the methods' default: not invariant) or "shifted" (the shift itself, the
        image of the original zero reference: invariant, Kindermans et al.)
    params : {method: {name: value}}, parameters given to each method's explainer (an audit's pattern methods'
        patterns and their data), optional

    Returns
    -------
    DataFrame, one row per method x image: method, image, relative_l2 (||h' - h|| / ||h|| of the
    heatmaps; 0 for an invariant method, NaN where the original map is zero), ssim (of the two
    heatmaps, clipped at the 0.5 / 99.5 percentiles and scaled to [0, 1]).
    """
    x, y = check_inputs(model, x, y)
    if y is None:
        raise AuditError("input_invariance needs the labels y")
    names = resolve_methods(methods)
    check_option("reference", reference, REFERENCES)
    shifted = shifted_model(model, x, shift)
    x_shifted = x + _shift_tensor(shift, x)
    moved = {}
    if reference == "shifted":
        values = _shift_tensor(shift, x).reshape(x.shape[1], -1)[:, 0].tolist()
        moved = {m: {"baseline": values[0] if len(set(values)) == 1 else values} for m in names if takes_baseline(m)}
    maps = []
    for m_, inputs, labels, given in ((model, x, y, {}), (shifted, x_shifted, None, moved)):
        _, explainers, shared, _ = prepare(m_, inputs, names, labels, params={**(params or {}), **given})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            raw = attribute_many(explainers, inputs, [y], shared)
        maps.append(heatmaps({m: v[0] for m, v in raw.items()}, reduction))
    rows = []
    for m in tqdm(names, desc="input invariance", disable=not bars(progress), leave=False):
        (bad, h), (bad2, h2) = screen(maps[0][m]), screen(maps[1][m])
        bad = bad | bad2  # constant or non-finite maps: undefined scores
        norm = h.reshape(len(h), -1).norm(dim=1)
        diff = (h2 - h).reshape(len(h), -1).norm(dim=1)
        rel = np.where(bad, np.nan, (diff / norm.clamp(min=1e-300)).numpy())
        s = np.where(bad, np.nan, ssim(normalize_map(h), normalize_map(h2), win_size=WINDOW, data_range=1.0).numpy())
        rows += [{"method": m, "image": i, "relative_l2": float(rel[i]), "ssim": float(s[i])} for i in range(len(h))]
    return pd.DataFrame(rows, columns=COLUMNS)


@dataclass(frozen=True)
class InvarianceOptions(Options):
    """The input-invariance test's keys."""

    shift: float = option(-1.0, "constant added to every input value (compensated in the first layer's bias)")
    invariance_reference: str = option("zero", "reference input of DeepLIFT and integrated gradients on the shifted "
                                       "input: zero (their default) or shifted (the shift, which makes them invariant)",
                                       choices=REFERENCES)
    invariance_tolerance: float = option(0.01, "median relative L2 change of the maps from which a method counts as "
                                         "not input-invariant", valid=lambda v: v > 0, rule="> 0",
                                         source="Kindermans et al. 2019 ask for equal maps; 0.01 of the map's norm "
                                         "allows for rounding: the edge control, invariant by construction, must "
                                         "not be rejected in every run with controls")


def _run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, options: InvarianceOptions,
         unit: UnitContext) -> UnitResult:
    return UnitResult(input_invariance(model, x, y, [method], shift=options.shift, seed=unit.seed,
                                       progress=unit.progress, reference=options.invariance_reference,
                                       params=unit.params))


def invariance_figure(table: pd.DataFrame, model: str, tolerance: float) -> Figure:
    """Per-image relative L2 change of the maps under the shift (log axis): a box and every image's
    point per method, one panel per family; dashed: the tolerance."""
    part = table[table.model == model]
    fig, axes, groups = family_panels(list(part.method), sharex=False, panel_height=1.6)
    floor = 1e-12  # an exactly invariant map changes by 0: the log axis needs a floor
    for ax, methods in zip(axes[0], groups.values()):
        method_boxes(ax, methods, {m: np.clip(part[part.method == m].relative_l2.to_numpy(), floor, None)
                                   for m in methods}, log=True)
        threshold_line(ax, tolerance)
    axes[0, 0].set_ylabel("||map' - map|| / ||map||")
    return Figure(f"input_invariance_{model}", fig, f"Input invariance on {model}: relative L2 change of each "
                  f"image's map when the input is shifted by a constant the first layer's bias compensates (log "
                  f"axis, exact invariance drawn at {floor:g}); above the dashed line ({tolerance:g}) in the median "
                  f"a method is not input-invariant.")


def _sections(table: pd.DataFrame, context: ReportContext, options: InvarianceOptions) -> list[Section]:
    tolerance = options.invariance_tolerance
    return [Section("Input invariance", text="The input is shifted by a constant that the first layer's bias "
                    "compensates; an invariant method's map does not change. Not being rejected is necessary, not "
                    "sufficient: the edge control is not rejected either.",
                    figures=[invariance_figure(table, m, tolerance) for m in table.model.unique()])]


CHECK = Check(
    name="input-invariance", cite=("kindermans2019",), title="Input invariance", reference="Kindermans et al. 2017/2019",
    result_file="input_invariance.csv", columns=COLUMNS, run=_run, sections=_sections, order=45,
    summary=lambda df: f"median relative L2 change {df.relative_l2.median():.3g}",
    verdict=MedianScore("invariance_l2", "input_invariance", "not input-invariant", "invariance_tolerance",
                        score_name="relative L2 change", metric="relative_l2"),
    question="Does the map ignore a constant shift the model ignores?",
    description="the input shifted by a constant compensated in the first layer's bias; maps compared before/after",
    options=InvarianceOptions, controls={"edge": "not rejected"})
