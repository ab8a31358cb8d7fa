"""Cosine-similarity convergence (CSC) of backward chains, after Sixt et al. 2020, section 3.1.

For each method and injection layer L, K Gaussian vectors replace the backward signal at L's
output and are propagated down in one batched pass. At every recorded layer, per image and
position, the channel vectors of the K signals are compared pairwise by ``|cos|``; a chain that
converges to rank 1 maps every vector to the same direction, so ``|cos|`` -> 1. The spectrum of the
K x D matrix of one image's flattened signals (K >= 8) estimates the chain's top singular values.

Signals are recorded at every node's output. Right before a max-pooling layer only the winning
positions of each channel carry signal, so channel vectors there are sparse and their ``|cos|`` is
inflated whatever the method; the chain is best read where it enters each conv / dense layer
(e.g. at the pooling outputs), which :func:`layer_inputs` names.
"""
from __future__ import annotations

import functools
import math
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.lines import Line2D
from scipy import integrate, optimize, stats
from torch import nn
from tqdm.auto import tqdm

from attributions import memory
from attributions.errors import NotApplicable, unknown_name
from attributions.explainer import Explainer, ForwardPass, shared_forward
from attributions.graph import Graph, Node, trace
from attributions.hygiene import leaves_process_alone
from attributions.kinds import ELEMENTWISE_KINDS, RECORDED_KINDS, Kind
from attributions.methods import build_method
from attributions.records import Move, Norm
from audit import style
from audit.checks.base import (
    INCONCLUSIVE,
    NOT_REJECTED,
    REJECTED,
    Check,
    Reading,
    UnitResult,
    VerdictCell,
    VerdictRule,
)
from audit.checks.options import Options, UnitContext, option
from audit.checks.passes import Params, explainer, model_errors
from audit.errors import AuditError
from audit.inputs import Images, Labels, Methods, check_inputs, resolve_methods
from audit.measures.statistics import cluster_median_ci
from audit.panels import family_panels, method_legend
from audit.progress import bars
from audit.sections import Figure, ReportContext, Section

COLUMNS = ["method", "inject_at", "is_logits", "layer", "depth", "kind", "channels", "median", "median_low",
           "median_high", "interval_level", "p10", "p25", "p75", "p90", "mean", "baseline", "sigma2_over_sigma1",
           "effective_rank", "collapsed"]


def _joins(node: Node) -> bool:
    """Whether a data-movement node joins branches (a concatenation): CSC records it as a layer."""
    return isinstance(node.record, Move) and node.record.cat


def random_cosine_median(d: int) -> float:
    """Median ``|cos|`` between two independent isotropic Gaussian vectors in dimension d (exact).

    cos^2 follows Beta(1/2, (d - 1) / 2), so the median ``|cos|`` is the square root of that law's median.
    """
    if d <= 1:
        return 1.0
    return math.sqrt(stats.beta.ppf(0.5, 0.5, (d - 1) / 2))


@functools.lru_cache(maxsize=16)
def rank_one_ratio(threshold: float) -> float:
    """The largest sigma2 / sigma1 of a chain whose two leading directions alone bring the median ``|cos|`` of its
    signals to ``threshold``: the spectrum bound a converged chain meets when its CSC reaches ``threshold`` by
    rank-1 convergence.

    A chain with singular values 1 and rho maps a Gaussian vector to a u + rho b v (a, b independent standard
    normals), at the angle theta = atan(rho b / a), whose law is P(theta <= phi) = 1/2 + atan(tan(phi) / rho) / pi.
    Two signals have ``|cos(theta1 - theta2)|``; the bound is the rho at which its median equals ``threshold``
    (quadrature of that law, and a root in rho): 0.0716 for 0.99. Any further direction lowers the CSC, so a
    chain that reaches the threshold by convergence has a ratio at most this; a high CSC with a larger ratio comes
    from elsewhere (sparse channel vectors: one channel alive at a position gives ``|cos|`` = 1 whatever the
    chain).
    """
    if not 0 < threshold < 1:
        raise AuditError(f"the CSC threshold must lie in (0, 1) for a spectrum bound, got {threshold}")
    gap = math.acos(threshold)

    def law(phi: float, rho: float) -> float:
        return 0.5 + math.atan(math.tan(phi) / rho) / math.pi

    def close(rho: float) -> float:  # P(|cos(theta1 - theta2)| >= threshold): theta2 within gap of theta1 modulo pi
        def within(w: float) -> float:  # theta1 at the w-quantile of its law: the integral over w is smooth
            phi = math.atan(rho * math.tan(math.pi * (w - 0.5)))
            total = 0.0
            for shift in (-math.pi, 0.0, math.pi):
                a, b = max(phi - gap + shift, -math.pi / 2), min(phi + gap + shift, math.pi / 2)
                if b > a:
                    total += law(b, rho) - law(a, rho)
            return total
        return float(integrate.quad(within, 0.0, 1.0, limit=400, points=[0.5])[0])

    if close(1.0) >= 0.5:  # two equal directions already reach a threshold this low (up to cos(pi / 4))
        return 1.0
    return float(optimize.brentq(lambda rho: close(rho) - 0.5, 1e-6, 1.0, xtol=1e-10))


def pairwise_abs_cos(signal: torch.Tensor, k: int | None = None, channel_axis: int = 1) -> np.ndarray:
    """``|cos|`` of all k(k-1)/2 pairs of channel vectors, pooled over images and positions.

    signal : (K, B, C, *spatial), (K, B, tokens, D) with ``channel_axis=-1`` (a token's vector plays a
    pixel's part), or (K, B, D) for dense layers; the first ``k`` (default all K) vectors are compared.
    ``channel_axis`` counts in the node's own value (B, ...). Zero vectors are dropped. Returned
    pair-major: (pairs, B, positions) flattened, in float64.
    """
    return pairwise_abs_cos_by_image(signal, k, channel_axis)[0]


def pairwise_abs_cos_by_image(signal: torch.Tensor, k: int | None = None,
                              channel_axis: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pairwise_abs_cos` and the image of each value (0 to B - 1), for intervals that resample images."""
    k = signal.shape[0] if k is None else k
    s = signal[:k].detach().cpu()
    if s.ndim == 3:
        view = s.reshape(k, s.shape[1], 1, -1)
    else:
        s = s.movedim(channel_axis % (s.ndim - 1) + 1, -1)
        view = s.reshape(k, s.shape[1], -1, s.shape[-1])  # (K, B, P, C)
    # one copy, in float64 with C adjacent for the products
    vectors = view.to(torch.float64, memory_format=torch.contiguous_format)
    # one Gram matrix per image and position holds every pair's dot product and both norms
    gram = torch.einsum("kbpc,lbpc->bpkl", vectors, vectors)
    sq = gram.diagonal(dim1=-2, dim2=-1)  # (B, P, K) squared norms
    i, j = torch.triu_indices(k, k, offset=1)
    cos = (gram[..., i, j] / (sq[..., i] * sq[..., j]).sqrt().clamp_min(1e-300)).abs().permute(2, 0, 1)
    keep = ((sq[..., i] > 0) & (sq[..., j] > 0)).permute(2, 0, 1)
    return cos[keep].numpy(), torch.arange(keep.shape[1]).reshape(1, -1, 1).expand_as(keep)[keep].numpy()


def image_spectra(signal: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """sigma2 / sigma1 and the effective rank of each image's K x D signal matrix (images with a zero or
    non-finite signal left out): two arrays of at most B values.

    The singular values are the square roots of the eigenvalues of the K x K Gram matrix (D is up to
    millions, K about 8): exact in float64 for ratios above about 1e-7. Each image's matrix is divided by
    its largest ``|value|`` first (both measures are scale-free), so that a signal of 1e200 does not overflow
    the Gram matrix."""
    k, b = signal.shape[:2]
    flat = signal.reshape(k, b, -1).transpose(0, 1)  # (B, K, D)
    # the largest |value| is one of the values: exact in the signal's dtype; NaN or inf where any value is
    scale = flat.abs().amax(dim=(1, 2)).double()
    keep = torch.isfinite(scale) & (scale > 0)
    mats = flat[keep].double() / scale[keep, None, None]
    sv = torch.linalg.eigvalsh(mats @ mats.transpose(1, 2)).flip(-1).clamp_min(0).sqrt()
    sv = sv[sv[:, 0] > 0]
    ratio = sv[:, 1] / sv[:, 0]
    p = sv / sv.sum(1, keepdim=True)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(1)
    return ratio.cpu().numpy(), torch.exp(entropy).cpu().numpy()


def channel_axes(graph: Graph, env: dict[str, Any]) -> dict[str, int]:
    """The channel axis of every signal node's value (B, ...): 1 for convolutional feature maps, -1 for
    token sequences (B, tokens, D).

    Read from the layers that produce or consume a value: convolutions, pooling and BatchNorm /
    GroupNorm work on axis 1, dense layers and LayerNorm on the last; element-wise kinds keep their
    input's axis; data movement (a transpose, a flatten) takes the axis its consumer reads.
    """
    axes: dict[str, int | None] = {}

    def own(node: Node) -> int | None:
        if node.kind in (Kind.CONV, Kind.AVGPOOL, Kind.MAXPOOL, Kind.AFFINE) or (
                node.kind == Kind.NORM and not isinstance(node.module, nn.LayerNorm)
                and not (isinstance(node.record, Norm) and node.record.type == "layer")):
            return 1
        if node.kind == Kind.DENSE or node.kind == Kind.NORM or node.tokens:
            return -1
        return None

    nodes = [n for n in graph.nodes if isinstance(env.get(n.name), torch.Tensor) and env[n.name].ndim >= 3]
    axes = {n.name: own(n) for n in nodes}
    for _ in range(len(nodes)):  # to a fixed point: each sweep settles at least one node or none is left
        changed = False
        for node in nodes:
            if axes[node.name] is not None:
                continue
            known = []
            if node.kind in ELEMENTWISE_KINDS:  # keeps the layout of any input whose layout is known
                known += [axes[i] for i in node.inputs if axes.get(i) is not None]
            for c in graph.consumers[node.name]:  # else the layout a consumer reads
                consumer = graph.by_name[c]
                known += [own(consumer)] if own(consumer) is not None else (
                    [axes[c]] if consumer.kind in ELEMENTWISE_KINDS and axes.get(c) is not None else [])
            if known:
                axes[node.name], changed = known[0], True
        if not changed:
            break
    return {name: 1 if axis is None else axis for name, axis in axes.items()}


def block_outputs(graph: Graph) -> list[str]:
    """Transformer blocks' outputs: the residual adds whose branch is an MLP (a dense layer reading an
    activation)."""
    def mlp(name: str) -> bool:
        node = graph.by_name[name]
        return node.kind == Kind.DENSE and any(graph.by_name[i].kind == Kind.ACTIVATION for i in node.inputs)

    return [n.name for n in graph.nodes if n.kind == Kind.ADD and any(mlp(i) for i in n.inputs)]


def default_injection_layers(ex: Explainer) -> list[str]:
    """The logits plus, for a transformer (a graph with a softmax between products), the class token
    (token 0) of each block's output; else the deepest conv layer and one about half-way down."""
    graph = ex.graph
    assert graph is not None, f"{ex!r} has no traced graph; injection layers exist for the graph methods only"
    linear = [n.name for n in graph.nodes if n.kind in (Kind.CONV, Kind.DENSE) and n.name != graph.output]
    convs = [n.name for n in graph.nodes if n.kind == Kind.CONV]
    picks = [graph.output]
    if any(n.kind == Kind.SOFTMAX for n in graph.nodes) and block_outputs(graph):
        picks += [f"{name}[0]" for name in block_outputs(graph)]
    elif convs:
        picks += [convs[-1], convs[len(convs) // 2]]
    elif linear:
        picks.append(linear[-1])
    return list(dict.fromkeys(picks))


def layer_inputs(ex: Explainer) -> dict[str, str]:
    """For each conv / dense node, the node whose output it reads (where the chain enters it)."""
    assert ex.graph is not None, f"{ex!r} has no traced graph; layer inputs exist for the graph methods only"
    return {n.name: n.inputs[0] for n in ex.graph.nodes if n.kind in (Kind.CONV, Kind.DENSE)}


def _split_token(target: str) -> tuple[str, int | None]:
    """``"layer[3]"`` -> ("layer", 3): inject at one token of a (B, tokens, D) layer; ``"layer"`` -> ("layer", None)."""
    if target.endswith("]") and "[" in target:
        name, _, index = target[:-1].rpartition("[")
        if index.isdigit():
            return name, int(index)
    return target, None


def _vector_seed(seed: int, layer: str) -> int:
    return zlib.crc32(f"{seed}:{layer}".encode())


@leaves_process_alone
def chain_convergence(model: torch.nn.Module, x: Images, y: Labels = None, methods: Methods = "all", *,
                      inject_at: str | list[str] | None = None, n_vectors: int = 5, seed: int = 0,
                      threshold: float = 0.99, spectrum_vectors: int = 8, level: float = 0.99,
                      progress: bool = True, params: Params | None = None) -> pd.DataFrame:
    """Layer-wise cosine-similarity convergence of each method's backward chain.

    Parameters
    ----------
    model : nn.Module (B, ...) -> (B, classes)
    x : (B, ...) images
    y : (B,) labels (unused by the protocol; checked for consistency)
    methods : names, "all", or a comma-separated string; non-chain methods (integrated-gradients,
        smoothgrad, controls) are skipped
    inject_at : layer name(s); None = the logits plus a few deeper layers
    n_vectors : K, the Gaussian vectors compared pairwise (Sixt et al.: 5)
    seed : seeds the vectors (the same vectors for every method)
    threshold : a layer is ``collapsed`` when its median ``|cos|`` reaches it
    level : the level at which the verdict reads the chain from the logits, which rejects where any of its L
        layers' intervals reaches the threshold: each layer's interval is at 1 - (1 - level) / L (Bonferroni over
        the layers; column ``interval_level``)
    spectrum_vectors : vectors used for the spectrum estimate (at least 8; the first ``n_vectors``
        of them give the ``|cos|`` statistics)
    progress : whether to show progress bars
    params : {method: {name: value}}, parameters given to each method's explainer (an audit's pattern methods'
        patterns and their data), optional

    Returns
    -------
    DataFrame, one row per method x injection layer x recorded layer (columns: see ``COLUMNS``).
    """
    x, y = check_inputs(model, x, y)
    names = resolve_methods(methods)
    if n_vectors < 2:
        raise AuditError(f"n_vectors must be at least 2 (pairs are compared), got {n_vectors}")
    with model_errors():
        graph = trace(model, x)
    every = {m: explainer(model, m, graph, params) for m in names}
    explainers = {m: e for m, e in every.items() if e.method.chain}
    # maps that are a product of per-block operators (attention rollout): their chain is that product
    candidates = {m: e for m, e in every.items() if e.method.engine.product}
    unfit = {m: reason for m, e in candidates.items() if (reason := e.method.engine.fits(e, x)) is not None}
    products = {m: e for m, e in candidates.items() if m not in unfit}
    if not explainers and not products and unfit:  # attention rollout of a CNN: the runner leaves the unit empty
        raise NotApplicable("; ".join(f"{m}: {reason}" for m, reason in unfit.items()))
    if not explainers and not products:
        raise AuditError(f"none of {names} is a backward chain; CSC applies to the graph methods and to attention "
                         "rollout and its kin")
    k_total = max(n_vectors, spectrum_vectors)
    rows = [row for m, e in products.items()
            for row in _product_rows(m, e, graph, x, y, n_vectors, k_total, seed, threshold, level)]
    if not explainers:
        return pd.DataFrame(rows, columns=COLUMNS)
    any_ex = next(iter(explainers.values()))
    targets = _targets(any_ex, inject_at)
    vectors, shapes, recorded = _injected(any_ex, graph, x, targets, seed, k_total)
    forward = max(e.bytes_per_image(x) for e in explainers.values()) if memory.budget() is not None else 0
    pooled = _pooled_signals(explainers, graph, x, vectors, signal_plan(len(x), forward, recorded, k_total),
                             n_vectors=n_vectors, progress=progress)
    rows += _chain_rows(pooled, graph, shapes, ["input"] + any_ex.layers, threshold, level)
    return pd.DataFrame(rows, columns=COLUMNS)


def _chain_rows(pooled: dict[tuple[str, str, str], Any], graph: Graph, shapes: dict[str, Any], layers: list[str],
                threshold: float, level: float) -> list[dict[str, Any]]:
    """One row per (method, injection node, recorded layer) of the pooled chain statistics; ``layers``: the
    recorded layers in forward order (their depth); ``level``: the chain's, split over its layers."""
    depth = {name: i for i, name in enumerate(layers)}
    kinds = {n.name: n.kind for n in graph.nodes}
    chain = Counter((method, target) for method, target, _ in pooled)
    rows = []
    for (method, target, layer), (channels, cos_parts, ratios, ranks, images) in pooled.items():
        node, token = _split_token(target)
        size_l = shapes[node][-1] if token is not None else int(np.prod(shapes[node][1:]))
        rows.append({"method": method, "inject_at": target, "is_logits": target == graph.output, "layer": layer,
                     "depth": depth[layer], "kind": kinds.get(layer, "input"), "channels": channels,
                     **_statistics(np.concatenate(cos_parts), np.concatenate(ratios), np.concatenate(ranks),
                                   np.concatenate(images) if target == graph.output else None,
                                   layer_level(level, chain[method, target])),
                     "baseline": random_cosine_median(min(channels, size_l))})
        rows[-1]["collapsed"] = bool(rows[-1]["median"] >= threshold)
    return rows


def _targets(ex: Explainer, inject_at: str | list[str] | None) -> list[str]:
    """The injection points (``layer`` or ``layer@token``), each checked against the explainer's layers."""
    layers = ex.layers
    targets = [inject_at] if isinstance(inject_at, str) else (inject_at or default_injection_layers(ex))
    for t in targets:
        if _split_token(t)[0] not in layers:
            raise unknown_name("layer", _split_token(t)[0], layers, AuditError)
    return targets


def _injected(ex: Explainer, graph: Graph, x: torch.Tensor, targets: list[str], seed: int,
              k_total: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Size], dict[str, int]]:
    """The Gaussian vectors injected at each target, (K, B, ...) (drawn for every image at once, so the
    draw does not depend on how the images are chunked; a token's vector is zero at the other tokens), the
    shapes of the injection nodes, and the bytes per image of every recorded node's signal."""
    with model_errors():
        probe = ex.forward_pass(x[:1], reference=False, batch=x.shape).values
    vectors, shapes = {}, {}
    for target in targets:
        node, token = _split_token(target)
        gen = torch.Generator().manual_seed(_vector_seed(seed, target))
        v = torch.randn(k_total, len(x), *probe[node].shape[1:], generator=gen, dtype=torch.float64).to(probe[node])
        if token is not None:  # one token's vector: the others get no signal
            keep = torch.zeros(v.shape[2:-1], dtype=v.dtype, device=v.device)
            keep.view(-1)[token] = 1
            v = v * keep[..., None]
        vectors[target] = v
        shapes[node] = probe[node].shape
    # only the recorded layers' signals are kept (data movement, often the largest values, is passed on)
    recorded = {n.name: _bytes(probe.get(n.name)) for n in graph.nodes if n.kind in RECORDED_KINDS or _joins(n)}
    return vectors, shapes, recorded


def _pooled_signals(explainers: dict[str, Explainer], graph: Graph, x: torch.Tensor, vectors: dict[str, torch.Tensor],
                    plan: tuple[int, list[set[str]]], *, n_vectors: int, progress: bool) -> dict[tuple[str, str, str], list[Any]]:
    """Every method's backward signals of the injected ``vectors`` at its recorded layers, pooled per (method,
    target, layer) (:func:`_pool`); images in chunks and recorded layers in groups as ``plan`` says
    (:func:`signal_plan`), one shared forward pass per chunk."""
    chunk, groups = plan
    pooled: dict[tuple[str, str, str], list[Any]] = {}
    jobs = [(m, t) for m in explainers for t in vectors]
    for start, stop in tqdm(memory.spans(len(x), chunk), desc="CSC", disable=not bars(progress) or chunk == len(x),
                            leave=False):
        xs = x[start:stop]
        with model_errors():
            shared = shared_forward(explainers, xs)
        assert shared is not None  # every explainer left is a graph method
        env, ref = shared.values, shared.reference
        axes = channel_axes(graph, env)
        for method, target in tqdm(jobs, desc="CSC", disable=not bars(progress) or chunk < len(x), leave=False):
            ex = explainers[method]
            node = _split_token(target)[0]
            own_ref = ref if ex.method.signal == "multiplier" else None
            part = vectors[target][:, start:stop]
            for group in groups:  # several backward passes when one image's recorded signals exceed the budget
                taps = ForwardPass(ex, xs, env, own_ref).signals(node, part, keep=group)
                taps.pop(node, None)
                _pool(pooled, method, target, taps, axes, n_vectors, start)
                del taps
        del env, ref, shared
    return pooled


def layer_level(level: float, layers: int) -> float:
    """The level of each of a chain's ``layers`` intervals so that the chain's reading keeps ``level`` over them
    all: 1 - (1 - level) / layers (Bonferroni)."""
    return 1 - (1 - level) / max(layers, 1)


def _statistics(cos: np.ndarray, ratio: np.ndarray, rank: np.ndarray, images: np.ndarray | None,
                level: float) -> dict[str, float]:
    """The ``|cos|`` quantiles and mean of one layer's pooled pairs, the interval of their median at ``level`` (a
    cluster bootstrap over the ``images`` the values come from; NaN without them: the hidden injection points,
    which no verdict reads), and the median spectrum ratio and rank."""
    q = np.quantile(cos, [0.1, 0.25, 0.5, 0.75, 0.9]) if cos.size else [np.nan] * 5
    _, low, high = cluster_median_ci(cos, images, level) if images is not None else (np.nan,) * 3
    return {"median": q[2], "median_low": low, "median_high": high,
            "interval_level": level if images is not None else np.nan, "p10": q[0], "p25": q[1], "p75": q[3], "p90": q[4],
            "mean": float(cos.mean()) if cos.size else np.nan,
            "sigma2_over_sigma1": float(np.median(ratio)) if len(ratio) else np.nan,
            "effective_rank": float(np.median(rank)) if len(rank) else np.nan}


def _bytes(value: object) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def signal_plan(images: int, forward: int, recorded: dict[str, int], vectors: int) -> tuple[int, list[set[str]]]:
    """How CSC fits the memory budget (:mod:`attributions.memory`): (images per pass, groups of layers,
    one backward pass each).

    Parameters
    ----------
    images : B, the images to analyse
    forward : bytes of one image's forward pass
    recorded : {layer: bytes of its signal for one image and one vector}, in graph order
    vectors : K, the signals propagated at once

    Every recorded layer's signal is kept for each of the K vectors until the pass ends, and the analysis's
    float64 copies and the rules' buffers add 1.5 times that (peak measured on VGG-16), so an image costs
    its forward pass plus 2.5 K times its recorded signals. Without a budget: every image and every layer
    at once. When one image does not fit, the layers are split into groups that do, consecutive from the
    output down (a layer too large alone goes alone): the same signals, one more backward pass per group.
    """
    every = set(recorded)
    nbytes = memory.budget()
    if nbytes is None:
        return images, [every]
    per_vector = 5 * vectors // 2
    per_image = forward + per_vector * sum(recorded.values())
    if per_image <= nbytes:
        return memory.fitting(images, per_image), [every]
    groups: list[set[str]] = [set()]
    held = 0
    for layer, size in reversed(recorded.items()):  # the order the backward pass reaches them
        if groups[-1] and forward + held + per_vector * size > nbytes:
            groups.append(set())
            held = 0
        groups[-1].add(layer)
        held += per_vector * size
    return 1, groups


def _pool(pooled: dict[tuple[str, str, str], list[Any]], method: str, target: str, taps: dict[str, torch.Tensor],
          axes: dict[str, int], n_vectors: int, offset: int = 0) -> None:
    """Add each layer's ``|cos|`` (with the image of each value, counted from ``offset``: the chunk's first image)
    and spectra of one pass's signals ``taps`` {layer: (K, B, ...)} to ``pooled``."""
    for layer, signal in taps.items():
        axis = axes.get(layer, 1)
        channels = signal.shape[2] if signal.ndim == 3 else signal.shape[axis % (signal.ndim - 1) + 1]
        if channels == 1 and signal.ndim > 3:
            continue  # one channel: |cos| is trivially 1
        entry = pooled.setdefault((method, target, layer), [channels, [], [], [], []])
        cos, images = pairwise_abs_cos_by_image(signal, n_vectors, axis)
        entry[1].append(cos)
        entry[4].append(images + offset)
        ratio, rank = image_spectra(signal)
        entry[2].append(ratio)
        entry[3].append(rank)


def _product_rows(method: str, ex: Explainer, graph: Graph, x: torch.Tensor, y: torch.Tensor | None, n_vectors: int,
                  k_total: int, seed: int, threshold: float, level: float) -> list[dict[str, Any]]:
    """CSC of a map that is the class token's row of a product of per-block operators M_L ... M_1 (K = 1
    target: ``y``, else the prediction): K Gaussian row vectors over the tokens replace that row and are
    multiplied down, r <- r M_l, recorded after each block at its attention node (depth = the node's)."""
    nodes, operators, _ = ex.method.engine.operators(ex, x, [y])
    depth = {name: i for i, name in enumerate(["input"] + graph.layers)}
    tokens = operators[0].shape[-1]
    gen = torch.Generator().manual_seed(_vector_seed(seed, f"{method}:tokens"))
    r = torch.randn(k_total, len(x), tokens, generator=gen, dtype=torch.float64).to(operators[0])
    rows = []
    for node, operator in zip(reversed(nodes), reversed(operators)):
        r = (r[:, :, None, :] @ operator).squeeze(2)  # (K, B, T)
        cos, images = pairwise_abs_cos_by_image(r, n_vectors)
        ratio, rank = image_spectra(r)
        measured = _statistics(cos, ratio, rank, images, layer_level(level, len(nodes)))
        rows.append({"method": method, "inject_at": graph.output, "is_logits": True, "layer": node, "depth": depth[node],
                     "kind": graph.by_name[node].kind, "channels": tokens, **measured,
                     "baseline": random_cosine_median(tokens), "collapsed": bool(measured["median"] >= threshold)})
    return rows


def median_interval(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(median, low, high) of CSC rows, each (len(rows),): a row without an interval (a hidden injection point,
    a table written before intervals were measured) has its median as both bounds."""
    median = rows["median"].to_numpy(float)
    bounds = [rows[c].to_numpy(float) if c in rows else median for c in ("median_low", "median_high")]
    low, high = (np.where(np.isnan(b), median, b) for b in bounds)
    return median, low, high


def converged_row(csc: pd.DataFrame | None, model: str, method: str, threshold: float) -> pd.DataFrame:
    """The CSC row (one, or none) where the chain injected at the logits converged: the layer nearest the logits
    whose whole interval reaches ``threshold`` (the one the verdict rejected at), else the input's row
    (:func:`input_row`)."""
    if csc is None or csc.empty:
        return pd.DataFrame()
    part = csc[(csc.model == model) & (csc.method == method) & csc.is_logits.astype(bool)]
    part = part.sort_values("depth", ascending=False)
    reached = part[median_interval(part)[1] >= threshold]
    return reached.iloc[:1] if not reached.empty else part.iloc[-1:]


def input_row(csc: pd.DataFrame | None, model: str, method: str) -> pd.DataFrame:
    """The CSC row (one, or none) at the input of the chain injected at the logits: the recorded layer nearest
    the input."""
    if csc is None or csc.empty:
        return pd.DataFrame()
    part = csc[(csc.model == model) & (csc.method == method) & csc.is_logits.astype(bool)]
    return part.sort_values("depth").iloc[:1]


@dataclass(frozen=True)
class Collapse(VerdictRule):
    """Rejects when the chain injected at the logits reaches the collapse threshold at some layer (the
    map's direction no longer depends on the signal from above: Sixt et al.'s working threshold): the 99 %
    interval of that layer's median ``|cos|`` (a cluster bootstrap over images,
    :func:`~audit.measures.statistics.cluster_median_ci`) lies at or above it. Not rejected when every layer's
    interval lies below it; inconclusive otherwise. Shows the layer nearest the logits where it does, with its
    median ``|cos|`` and interval, and the median ``|cos|`` at the input. A table without intervals (written
    before they were measured) reads the medians alone. Whether the convergence is a rank-1 collapse depends on
    the method's backward pass and on the chain's spectrum: the verdict's mechanism column says."""

    score_column: str = "csc_max_median"
    text_column: str = "collapse_layer"
    failure: str = "chain converges"
    threshold: str = "csc_threshold"
    score_name: str = "CSC (median |cos| of the chain from the logits)"

    def evaluate(self, part: pd.DataFrame, options: Options, controls: pd.DataFrame | None = None) -> VerdictCell:
        logits = part[part.is_logits.astype(bool)].sort_values("depth", ascending=False)
        if logits.empty:
            return VerdictCell(float("nan"), "n/a", None)
        threshold = getattr(options, self.threshold)
        median, low, high = median_interval(logits)
        defined = ~np.isnan(low) & ~np.isnan(high)
        if not defined.any():
            return VerdictCell(float("nan"), "n/a", None)
        top, at_input = float(np.nanmax(median)), float(median[-1])

        def where(i: int) -> str:
            interval = f" [{low[i]:.3f}, {high[i]:.3f}]" if low[i] != high[i] else ""
            return f"{logits.layer.iloc[i]}: {median[i]:.3f}{interval}"

        def read(i: int, label: str) -> Reading:
            return Reading(f"{label} {logits.layer.iloc[i]}", float(median[i]), float(low[i]), float(high[i]),
                           threshold)

        tail = f"; {at_input:.3f} at the input"
        hit = np.flatnonzero(defined & (low >= threshold))
        if hit.size:
            return VerdictCell(top, f"{REJECTED} (from {where(int(hit[0]))}{tail})", REJECTED,
                               reading=read(int(hit[0]), "from"))
        unsure = np.flatnonzero(defined & (high >= threshold))
        if not unsure.size:
            return VerdictCell(top, f"{NOT_REJECTED} (max {top:.3f}{tail})", NOT_REJECTED,
                               reading=read(int(np.nanargmax(median)), "max at"))
        return VerdictCell(top, f"{INCONCLUSIVE} (at {where(int(unsure[0]))}{tail})", INCONCLUSIVE,
                           reading=read(int(unsure[0]), "at"))

    def rule_text(self, options: Options) -> str:
        return (f"rejected (chain converges) when the interval of the median |cos| of the chain injected at the "
                f"logits lies at or above {getattr(options, self.threshold)} at some layer, not rejected when it lies "
                "below at every layer, else inconclusive; each of the chain's L layers' intervals at the check's "
                "level split over them (1 - (1 - level) / L, Bonferroni), so that the chain's reading keeps the "
                "check's level")


@dataclass(frozen=True)
class ConvergenceOptions(Options):
    """CSC's keys."""

    n_vectors: int = option(5, "K, the Gaussian vectors compared pairwise", valid=lambda v: v >= 2, rule="at least 2")
    csc_threshold: float = option(0.99, "median |cos| at which a layer counts as collapsed", valid=lambda v: 0 < v <= 1,
                                  rule="in (0, 1]", source="Sixt et al. 2020, section 3.1: a chain whose CSC reaches "
                                  "0.99 counts as converged")


def _run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, options: ConvergenceOptions,
         unit: UnitContext) -> UnitResult:
    return UnitResult(chain_convergence(model, x, y, [method], n_vectors=options.n_vectors, seed=unit.seed,
                                        threshold=options.csc_threshold, level=options.interval_level,
                                        progress=unit.progress,
                                        params=unit.params))


def _summary(df: pd.DataFrame) -> str:
    top = df[df.is_logits.astype(bool)]
    return f"min median |cos| {top['median'].min():.3f}, max {top['median'].max():.3f}"


def csc_figure(csc: pd.DataFrame, models: list[str] | None = None, threshold: float = 0.99) -> Figure:
    """1 - median ``|cos|`` per layer (log axis): one row per model, one panel per method family.

    Solid: the chain injected at the logits, with the 25-75 % band over vector pairs; dashed: the
    first hidden injection point the run lists; black: the exact random-vector baseline; grey: the collapse
    threshold (``1 - threshold``). A collapsed chain drops toward 0, below the grey line.
    """
    models = list(dict.fromkeys(csc.model)) if models is None else models
    fig, axes, groups = family_panels(list(csc.method), models, panel_height=1.35)
    floor = 1e-6  # 1 - |cos| can be exactly 0: the log axis needs a floor
    for r, model in enumerate(models):
        part = csc[csc.model == model]
        hidden = [i for i in dict.fromkeys(part.inject_at) if not part[part.inject_at == i].is_logits.astype(bool).any()]
        for c, methods in enumerate(groups.values()):
            ax = axes[r, c]
            for method in methods:
                rows = part[part.method == method]
                logits = rows[rows.is_logits.astype(bool)].sort_values("depth")
                ax.plot(logits.depth, (1 - logits["median"]).clip(lower=floor), color=style.color(method),
                        marker=style.marker(method), markersize=2)
                ax.fill_between(logits.depth, (1 - logits.p75).clip(lower=floor), (1 - logits.p25).clip(lower=floor),
                                color=style.color(method), alpha=0.15, linewidth=0)
                if hidden:
                    deep = rows[rows.inject_at == hidden[0]].sort_values("depth")
                    ax.plot(deep.depth, (1 - deep["median"]).clip(lower=floor), color=style.color(method),
                            linestyle=(0, (2, 1.5)), linewidth=0.8)
            base = part[part.is_logits.astype(bool)].drop_duplicates("depth").sort_values("depth")
            ax.plot(base.depth, 1 - base.baseline, color="black", linestyle=(0, (1, 1)), linewidth=0.8)
            ax.axhline(1 - threshold, color="0.55", linestyle=(0, (5, 2, 1, 2)), linewidth=0.8)
            ax.set_yscale("log")
            ax.set_xlabel("layer depth (input = 0)" if r == len(models) - 1 else "")
        axes[r, 0].set_ylabel("1 - median\n|cos|")  # two short lines: a row is too low for one long label
    extra = [Line2D([], [], color="0.3", label="injected at the logits (25-75 % band)"),
             Line2D([], [], color="0.3", linestyle=(0, (2, 1.5)), label="injected at a hidden layer"),
             Line2D([], [], color="black", linestyle=(0, (1, 1)), label="random-vector baseline"),
             Line2D([], [], color="0.55", linestyle=(0, (5, 2, 1, 2)), label=f"collapse threshold (|cos| = {threshold:g})")]
    method_legend(fig, groups, "marker", extra)
    return Figure("csc", fig, "Cosine-similarity convergence of the backward chains: 1 - median |cos| between the "
                  "signals of independent random vectors, per layer, for each model (rows) and method family "
                  f"(panels); a chain that collapses to rank one drops toward 0, below the grey line at the collapse "
                  f"threshold (median |cos| {threshold:g}).")


def _sections(table: pd.DataFrame, context: ReportContext, options: ConvergenceOptions) -> list[Section]:
    return [Section("Cosine-similarity convergence", "1 - median |cos| between backward signals of independent "
                    "random vectors injected at the logits (solid, with the 25-75 % band) and at a hidden layer "
                    "(dashed), per layer on a log axis; the dotted line is the exact random-vector baseline.",
                    figures=[csc_figure(table, threshold=options.csc_threshold)])]


CHECK = Check(
    name="csc", cite=("sixt2020",), title="Cosine-similarity convergence", reference="Sixt et al. 2020, section 3.1",
    result_file="csc.csv", columns=COLUMNS, run=_run, summary=_summary, sections=_sections, verdict=Collapse(),
    applies=lambda method: build_method(method).chain or build_method(method).engine.product, order=10, per_image=False,
    question="Does the backward chain keep the class and the top layers apart (or converge)?",
    description="K Gaussian vectors injected at the logits and deeper layers; median |cos| of the backward "
                "signals per layer against the exact random baseline",
    options=ConvergenceOptions)
