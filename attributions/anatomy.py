"""Where things are in a traced model: its feature maps, its attention weights and its tokens.

Read from one forward pass's values (shapes) and the graph's kinds; nothing here parses node names.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from attributions.errors import AttributionError
from attributions.kinds import Kind
from attributions.records import Move

if TYPE_CHECKING:  # the graph module reads anatomy: imported for the annotations only
    from attributions.graph import Graph, Node

# kinds whose output keeps the axes of their signal inputs (element-wise maps, normalisations, sums)
_KEEPING = (Kind.RELU, Kind.LEAKY_RELU, Kind.ACTIVATION, Kind.AFFINE, Kind.NORM, Kind.ADD, Kind.PRODUCT)


def _permutation(node: Node, values: dict[str, Any]) -> tuple[int, ...] | None:
    """The axes ``node`` (a move of one signal) permutes, found by running it on a probe of distinct
    integers shaped like its input: p with output = input.permute(p), or None for any other move
    (a reshape, a flatten, an index)."""
    source, out = values[node.inputs[0]], values[node.name]
    if not isinstance(out, torch.Tensor) or out.ndim != source.ndim or out.numel() != source.numel():
        return None
    probe = torch.arange(source.numel(), device=source.device).reshape(source.shape)
    try:
        moved = node.evaluate(values, {node.inputs[0]: probe})
    except (RuntimeError, TypeError):
        return None
    for p in itertools.permutations(range(source.ndim)):
        if probe.permute(p).shape == moved.shape and torch.equal(probe.permute(p), moved):
            return p
    return None


def feature_maps(graph: Graph, values: dict[str, Any], ndim: int, positions: int = 2) -> list[str]:
    """The nodes whose outputs are channels-first feature maps (B, C, *spatial) with at least ``positions``
    positions, in forward order; ``values`` a forward pass's {node: value}, ``ndim`` the input's axes.

    Each node's layout (which of the input's axes each of its axes is) is followed from the input:
    convolutions and pooling put out channels-first maps, element-wise ops, norms and sums keep their
    inputs' common layout, a linear layer over the channel axis keeps it (a channels-last block), a
    permute reorders it (found by running the node on a probe), and any other move (a reshape to
    tokens, a flatten) ends it. So a channels-last stretch that returns to channels-first (ConvNeXt)
    still counts, and the 4-D tensors inside attention (heads x tokens) never do. A node whose first axis is not
    the input's batch (patches folded into it, as MobileViT's and MViT's blocks do) is never one: its map would
    not be one per input; nor is a node the logits do not depend on (a pooled output the classifier does not read,
    as TextNet's): no gradient reaches it."""
    canonical = tuple(range(ndim))
    layout: dict[str, tuple[int, ...]] = {graph.nodes[0].name: canonical}
    batch = values[graph.nodes[0].name].shape[0]
    for node in graph.nodes[1:]:
        value = values.get(node.name)
        if not isinstance(value, torch.Tensor) or value.ndim != ndim or value.shape[0] != batch:
            continue
        inputs = [layout.get(i) for i in node.inputs if isinstance(values.get(i), torch.Tensor)
                  and values[i].ndim == ndim]
        same = inputs[0] if inputs and all(i is not None and i == inputs[0] for i in inputs) else None
        found = None
        if node.kind in (Kind.CONV, Kind.MAXPOOL, Kind.AVGPOOL):
            found = canonical
        elif node.kind in _KEEPING or node.is_elementwise_mix:
            found = same
        elif node.kind == Kind.DENSE:
            found = same if same is not None and same[-1] == 1 else None
        elif node.kind == Kind.MOVE and same is not None:
            if node.is_identity or (isinstance(node.record, Move) and node.record.cat):
                found = same
            elif len(node.inputs) == 1:
                p = _permutation(node, values)
                found = tuple(same[a] for a in p) if p is not None else None
        if found is not None:
            layout[node.name] = found
    read = _ancestors(graph, graph.output) | {graph.output}
    return [n for n, v in layout.items() if v == canonical and n != graph.nodes[0].name and n in read
            and math.prod(values[n].shape[2:]) >= positions]


def cam_layer(graph: Graph, values: dict[str, Any], layer: str | None, ndim: int) -> str:
    """The node whose output Grad-CAM weighs: ``layer`` as a node name, else the last node of the module
    path ``layer`` (its output), else (``auto`` or None) the last feature map (:func:`feature_maps`);
    ``values`` is a forward pass's {node: value}, ``ndim`` the input's number of axes."""
    if ndim < 3:
        raise AttributionError(f"Grad-CAM needs inputs with spatial axes (B, C, H, ...), got {ndim}-D inputs")
    maps = feature_maps(graph, values, ndim)
    if layer in (None, "auto"):
        if not maps:
            raise AttributionError("Grad-CAM found no channels-first feature map (B, C, *spatial) with more than one "
                                   "position in the model; pass layer= with a node or module name")
        return maps[-1]
    chosen = _resolve(graph, layer, "Grad-CAM")
    if chosen not in maps:
        value = values.get(chosen)
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else None
        raise AttributionError(f"Grad-CAM layer {layer!r} (node {chosen!r}, output shape {shape}) is not a "
                               "channels-first feature map (B, C, *spatial) with more than one position that keeps "
                               "the inputs' batch axis and that the logits depend on; choose one of the last feature "
                               f"maps: {', '.join(maps[-5:]) or 'none'}")
    return chosen


def _resolve(graph: Graph, layer: str, what: str) -> str:
    """The node ``layer`` names: a node, else the last node run inside the module path ``layer`` (its output)."""
    layers = graph.layers
    if layer in graph.by_name and layer in layers:
        return layer
    inside = [n for n in layers if graph.by_name[n].path == layer or graph.by_name[n].path.startswith(layer + ".")]
    if not inside:
        paths = sorted({graph.by_name[n].path for n in layers if graph.by_name[n].path})
        raise AttributionError(f"{what} layer {layer!r} is neither a node nor a module of the model; "
                               f"modules: {', '.join(paths[:40])}{' ...' if len(paths) > 40 else ''}")
    found: str = inside[-1]
    return found


def attention_nodes(graph: Graph, values: dict[str, Any]) -> list[str]:
    """The softmax nodes that put out attention weights (B, heads, T, T) which then weigh the values (a
    product), in forward order: one per attention layer, whether traced from
    ``scaled_dot_product_attention`` or written out."""
    out = []
    for node in graph.nodes:
        value = values.get(node.name)
        if node.kind == Kind.SOFTMAX and isinstance(value, torch.Tensor) and value.ndim == 4 \
                and value.shape[-1] == value.shape[-2] \
                and any(graph.by_name[c].kind in (Kind.PRODUCT, Kind.MIX) for c in graph.consumers[node.name]):
            out.append(node.name)
    return out


@dataclass(frozen=True)
class TokenLayout:
    """How a vision transformer lays out its T tokens: ``prefix`` tokens (class, distillation, registers)
    first, then one per cell of the patch ``grid`` in row-major order."""

    prefix: int
    grid: tuple[int, ...]


MAX_PREFIX = 16  # class, distillation and register tokens: a few; more means the tokens are not the patch grid


def token_layout(graph: Graph, values: dict[str, Any], tokens: int, ndim: int) -> TokenLayout:
    """The layout of ``tokens`` tokens: the patch grid is the last feature map before the tokens (the patch
    embedding's output), the prefix whatever precedes it. An error names what does not fit (windowed
    attention, a token count unrelated to the grid)."""
    maps = feature_maps(graph, values, ndim, positions=1)
    if not maps:
        raise AttributionError("the model has no patch embedding (a channels-first feature map before its tokens); "
                               "attention and token maps need a vision transformer")
    grid = tuple(values[maps[-1]].shape[2:])
    prefix = tokens - math.prod(grid)
    if not 0 <= prefix <= MAX_PREFIX:
        raise AttributionError(f"{tokens} tokens do not match the patch grid {grid} of {maps[-1]!r} (plus up to "
                               f"{MAX_PREFIX} class or register tokens); windowed or pooled attention (Swin, MViT, "
                               "PiT) has no global token map")
    return TokenLayout(prefix, grid)


def on_grid(tokens: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """Token values (K, B, T, D) laid out channels-first on the patch grid: (K, B, D, *grid), prefix dropped."""
    k, b, _, d = tokens.shape
    cells = tokens[:, :, layout.prefix:]
    return cells.reshape(k, b, *layout.grid, d).movedim(-1, 2)


def token_node(graph: Graph, values: dict[str, Any], layer: str | None, ndim: int) -> str:
    """The node of token activations (B, T, D) a token Grad-CAM weighs: ``layer`` (a node or a module path),
    or by default (``auto``) the last block's first norm, i.e. the last norm that feeds the last attention (and
    no earlier one) and holds tokens of one input each on the patch grid. Where none does (tokens folded into the batch axis, as
    MobileViT's; pooled, as MViT's), an error names why and the token nodes ``layer=`` may take."""
    batch = values[graph.nodes[0].name].shape[0]
    if layer not in (None, "auto"):
        chosen = _resolve(graph, layer, "token")
        problem = _token_problem(graph, values, chosen, ndim, batch)
        if problem is not None:
            raise AttributionError(f"token layer {layer!r} (node {chosen!r}) {problem}; "
                                   + _token_candidates(graph, values, ndim, batch))
        return chosen
    attention = attention_nodes(graph, values)
    if not attention:
        raise AttributionError("the model has no attention layer (softmax weights of shape (B, heads, T, T)); "
                               "pass layer= with a token node or module name")
    # the last block's norms: those feeding the last attention and not an earlier one
    earlier = _ancestors(graph, attention[-2]) | {attention[-2]} if len(attention) > 1 else set()
    feeding = _ancestors(graph, attention[-1]) - earlier
    norms = [n.name for n in graph.nodes if n.kind == Kind.NORM and n.name in feeding]
    if not norms:
        raise AttributionError(f"no norm feeds the last attention {attention[-1]!r}; pass layer= with a token node")
    problems = {n: _token_problem(graph, values, n, ndim, batch) for n in norms}
    usable = [n for n in norms if problems[n] is None]
    if not usable:
        raise AttributionError(f"no norm that feeds the last attention holds tokens of one input each on the patch "
                               f"grid: the last, {norms[-1]!r}, {problems[norms[-1]]}; "
                               + _token_candidates(graph, values, ndim, batch))
    return str(usable[-1])


def _token_problem(graph: Graph, values: dict[str, Any], node: str, ndim: int, batch: int) -> str | None:
    """Why ``node``'s output is not tokens (B, T, D) of one input each on the patch grid; None where it is."""
    value = values.get(node)
    if not (isinstance(value, torch.Tensor) and value.ndim == 3):
        return f"has output shape {tuple(value.shape) if isinstance(value, torch.Tensor) else None}, not tokens (B, T, D)"
    if value.shape[0] != batch:  # MobileViT's blocks fold the patches into the batch axis
        return (f"holds {value.shape[0]} rows for {batch} input(s): its tokens fold patches into the batch axis, and "
                "their map would not be one per input")
    try:
        token_layout(graph, values, value.shape[1], ndim)
    except AttributionError as exc:
        return f"holds tokens off the patch grid ({exc})"
    return None


def _token_candidates(graph: Graph, values: dict[str, Any], ndim: int, batch: int) -> str:
    """What to do instead: the last token nodes (norms) that hold tokens of one input each on the patch grid."""
    fit = [n.name for n in graph.nodes if n.kind == Kind.NORM and _token_problem(graph, values, n.name, ndim, batch) is None]
    if not fit:
        return "no node of the model holds such tokens: use grad-cam, whose automatic layer keeps the batch axis"
    return f"pass layer= with one that does, e.g. {', '.join(fit[-3:])}, or use grad-cam"


def _ancestors(graph: Graph, name: str) -> set[str]:
    """Every node ``name``'s value depends on through signal inputs."""
    seen, stack = set(), [name]
    while stack:
        for i in graph.by_name[stack.pop()].inputs:
            if i not in seen:
                seen.add(i)
                stack.append(i)
    return seen
