"""PatternNet and PatternAttribution (Kindermans et al., ICLR 2018): signal patterns learned from data.

For a linear layer y = W x (its bias left out) and each output unit j, the signal estimator S(x) = a_j y_j
takes the pattern

    a_j = cov[x, y_j] / (w_j^T cov[x, y_j])

over all samples (the linear estimator S_a), over the samples where y_j > 0 only (``relu``: the
two-component estimator's positive regime, the part a following ReLU passes; innvestigate's ``relu``
patterns), or both regimes apart (``two-component``: S_a+- takes a+_j where y_j > 0 and a-_j, fitted
over y_j <= 0, elsewhere; behind a ReLU of a bias-free layer it equals ``relu``). For a convolution
x is each output position's input patch, and the statistics pool positions and images; for a linear
layer on tokens, tokens and images. The sums are the weight gradients of the layer for the output
signals y and 1 (one vector-Jacobian product each), so any conv or dense layer the engine captures is
fitted the same way, BatchNorm folded in.

PatternNet's backward replaces W^T by A^T through every linear layer (it reconstructs the signal);
PatternAttribution's by (W * A)^T (it attributes). ReLUs pass the gradient's mask, max pooling its
winner, every other op its exact adjoint; maps start from one-hot.

Patterns depend on the weights: a method fits them on its ``data`` (default: the images it explains,
all of them together) and fits them again whenever a tensor of the model changes, so each stage of a
parameter randomization is explained with patterns of its own model. (Sixt et al.'s code kept the
trained patterns in the randomized models' backward pass.) :func:`attributions.fitting.fit_patterns` fits once for reuse,
:class:`Patterns` saves them with the fingerprint of the weights they belong to.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attributions.derived import Derived
from attributions.engines import RuleChain
from attributions.errors import AttributionError
from attributions.explaining import Explaining
from attributions.kinds import Kind
from attributions.linear_ops import OPS
from attributions.rules import Context, Rule

ESTIMATORS = ("relu", "linear", "two-component")
FITTED_KINDS = (Kind.DENSE, Kind.CONV)


def fingerprint(model: nn.Module) -> str:
    """sha256 of the model's parameters and buffers (names, shapes, values)."""
    digest = hashlib.sha256()
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@dataclass
class Patterns:
    """Fitted patterns: {node name: A, shaped like the node's (folded) weight}, the ``estimator``, the number
    of images ``n`` they were fitted on, what those images were (``source``) and the ``fingerprint`` of the
    weights they belong to."""

    patterns: dict[str, torch.Tensor]
    estimator: str
    n: int
    source: str
    fingerprint: str = ""
    extra: dict[str, Any] = field(default_factory=dict[str, Any])

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write to ``path`` atomically (a partial file never stands in for a finished one)."""
        path = Path(path)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")  # ranks of one run may write the same file
        torch.save({"patterns": self.patterns, "estimator": self.estimator, "n": self.n, "source": self.source,
                    "fingerprint": self.fingerprint}, tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Patterns:
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            return cls(saved["patterns"], saved["estimator"], int(saved["n"]), saved["source"], saved["fingerprint"])
        except (OSError, RuntimeError, KeyError, TypeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
            raise AttributionError(f"{path} is not a patterns file written by Patterns.save: {exc}") from None

    def check(self, model: nn.Module) -> None:
        """An error unless these patterns were fitted on ``model``'s current weights."""
        if self.fingerprint and self.fingerprint != fingerprint(model):
            raise AttributionError("these patterns were fitted on other weights than the model's (fingerprint "
                                   f"{self.fingerprint[:12]}...); fit them again with fit_patterns(model, data), or pass "
                                   "data= to the method so that it fits its own")


def _statistics(op: Any, x: torch.Tensor, estimator: str, channel_axis: int) -> list[torch.Tensor]:
    """[count (out,), sum of y (out,), sum of x (like W), sum of x y (like W)] over the samples where the
    estimator looks (y > 0 for ``relu``), for inputs x of one linear node; for ``two-component`` those of
    y > 0, then those of y <= 0."""
    w, _ = op.weights()
    with torch.enable_grad():
        y, pullback = torch.func.vjp(lambda weight: op.forward(x, weight), w)[:2]
    positive = (y > 0).to(y.dtype)
    masks = {"relu": [positive], "linear": [torch.ones_like(y)], "two-component": [positive, 1 - positive]}[estimator]
    axes = tuple(a for a in range(y.ndim) if a != channel_axis % y.ndim)
    return [t for mask in masks for t in (mask.sum(axes), (y * mask).sum(axes), pullback(mask)[0].detach(),
                                          pullback(y * mask)[0].detach())]


def _patterns_of(stats: list[torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    """The pattern from the sums: A (like W), or for the two-component estimator's two regimes (a+, a-)
    stacked (2, *W.shape)."""
    if len(stats) == 4:
        return _pattern(stats, w)
    return torch.stack([_pattern(stats[:4], w), _pattern(stats[4:], w)])


def _pattern(stats: list[torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    """A = cov[x, y] / (w^T cov[x, y]) per output unit from the sums (0 where undefined)."""
    n, sy, sx, sxy = stats
    shape = (-1,) + (1,) * (w.ndim - 1)
    count = n.clamp(min=1).reshape(shape)
    cov = sxy / count - (sx / count) * (sy.reshape(shape) / count)
    scale = (w * cov).sum(tuple(range(1, w.ndim)), keepdim=True)
    ok = (scale != 0) & (n.reshape(shape) > 0)
    return torch.where(ok, cov / torch.where(ok, scale, torch.ones_like(scale)), torch.zeros_like(cov))


def fit_nodes(ex: Explaining, data: torch.Tensor, estimator: str, batch: int) -> dict[str, torch.Tensor]:
    """{node: pattern} for every conv and dense node of the explainer's graph, from ``data`` in chunks."""
    gradient = ex.sibling("gradient") if ex.method.name != "gradient" else ex
    # under a memory budget the chunks are those whose forward pass and two pullbacks fit
    batch = min(batch, gradient.images_per_pass(data, 2))
    sums: dict[str, list[torch.Tensor]] = {}
    ops: dict[str, Any] = {}
    for start in range(0, len(data), batch):
        chunk = data[start:start + batch]
        values = gradient.forward_pass(chunk, reference=False).values
        for node in gradient.traced.nodes:
            if node.kind not in FITTED_KINDS:
                continue
            op = ops.setdefault(node.name, OPS[node.kind](node))
            stats = _statistics(op, values[node.inputs[0]], estimator, 1 if node.kind == Kind.CONV else -1)
            sums[node.name] = stats if node.name not in sums else [a + b for a, b in zip(sums[node.name], stats)]
    # a covariance needs two samples: a layer none of whose units has them passes no signal (an SE block's
    # reduction over a few pooled images, say); a warning, as its branch may not be the only path
    void = [name for name, stats in sums.items() if not (stats[0] >= 2).any()]
    if void:
        where = "" if estimator == "linear" else " with y > 0"
        more = f" (and {len(void) - 1} more layer(s))" if len(void) > 1 else ""
        warnings.warn(f"the patterns of {void[0]}{more} cannot be estimated from {len(data)} image(s): none of "
                      f"their output units has two samples{where}, so they pass no signal; fit the patterns on "
                      "more images (data=, or the audit's pattern_data train)", stacklevel=3)
    return {name: _patterns_of(stats, ops[name].weights()[0]) for name, stats in sums.items()}


class PatternSource:
    """The patterns a pattern method's rules read, for the model as it is now.

    ``patterns``: given, used while the model's weights are those they were fitted on; ``cache``: a file of
    patterns (:meth:`Patterns.save`) for the weights of fingerprint ``cache_for``, read when the model has
    those weights, else fitted on ``data`` and written there; ``data`` (N, ...): the images they are fitted
    on, by default the explained images. Patterns are fitted again whenever a model tensor (or those
    images) changes: a randomized model gets patterns of its own, on the same images.
    """

    def __init__(self, estimator: str = "relu", patterns: Patterns | None = None, data: torch.Tensor | None = None,
                 batch: int = 64, cache: str | os.PathLike[str] | None = None, cache_for: str = "", source: str = ""):
        if estimator not in ESTIMATORS:
            raise AttributionError(f"pattern estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
        if patterns is not None and not isinstance(patterns, Patterns):
            raise AttributionError(f"patterns must be a Patterns object (fit_patterns), got {type(patterns).__name__}")
        if cache is not None and (data is None or not cache_for):
            raise AttributionError("a patterns cache needs data= (the images the cached patterns are fitted on) and "
                                   "cache_for= (the fingerprint of the weights it holds patterns for)")
        self.estimator, self.given, self.data, self.batch = estimator, patterns, data, batch
        self.cache, self.cache_for = (Path(cache) if cache is not None else None), cache_for
        self.source = source or (f"{len(data)} given images" if data is not None else "the explained images")
        self._fitted: Derived[dict[str, torch.Tensor]] = Derived()
        self.current: dict[str, torch.Tensor] | None = None

    def prepare(self, ex: Explaining, x: torch.Tensor) -> None:
        """Make the patterns for the explainer's model as it is now, fitted on ``data`` or on ``x`` (B, ...)."""
        if self.given is not None and self.data is None:  # nothing to refit on: the given ones or an error
            self.given.check(ex.model)
            self.current = self.given.patterns
            return
        data = self.data if self.data is not None else x
        model = ex.model
        with torch.no_grad():
            self.current = self._fitted.get(
                [*model.parameters(), *model.buffers(), data], lambda: self._make(ex, data),
                key=(id(ex.graph), tuple(data.shape)))

    def _make(self, ex: Explaining, data: torch.Tensor) -> dict[str, torch.Tensor]:
        """The patterns for the model's current weights: given or cached ones when they belong to these weights,
        else fitted on ``data`` (and cached, when the cache file is still missing)."""
        if self.given is None and self.cache is None:
            return fit_nodes(ex, data, self.estimator, self.batch)
        current = fingerprint(ex.model)
        if self.given is not None and self.given.fingerprint == current:
            return self.given.patterns
        cache = self.cache if current == self.cache_for else None  # a randomized model's are never cached
        if cache is not None and cache.exists():
            kept = Patterns.load(cache)
            if kept.fingerprint == current and kept.estimator == self.estimator and kept.n == len(data) \
                    and kept.source == self.source:
                bad = [k for k, v in kept.patterns.items() if not isinstance(v, torch.Tensor)
                       or not bool(torch.isfinite(v).all())]
                if bad:
                    raise AttributionError(f"{cache} holds patterns that are not finite tensors ({', '.join(bad[:3])}); "
                                           "the file is damaged: delete it and the patterns are fitted again")
                return kept.patterns
        fitted = fit_nodes(ex, data, self.estimator, self.batch)
        if cache is not None:
            Patterns(fitted, self.estimator, len(data), self.source, current).save(cache)
        return fitted

    def pattern(self, node: str) -> torch.Tensor:
        if self.current is None or node not in self.current:
            raise AttributionError(f"no pattern for node {node!r}: the method's patterns were not fitted for this "
                                   "model (they are fitted when maps are computed)")
        return self.current[node]


class PatternRule(Rule):
    """A linear layer's backward through its pattern: ``net``: s_in = A^T s (PatternNet), ``attribution``:
    s_in = (W * A)^T s (PatternAttribution). With the two-component estimator each output unit's signal
    goes through a+ where the unit's y = w^T x is positive at the explained input, else through a-."""

    kinds = FITTED_KINDS
    reads = ()

    def reads_for(self, node: Any) -> tuple[str, ...]:
        return ("inputs",) if self.source.estimator == "two-component" else ()

    def __init__(self, source: PatternSource, mode: str = "attribution"):
        if mode not in ("net", "attribution"):
            raise AttributionError(f"pattern rule mode must be net or attribution, got {mode!r}")
        self.source, self.mode = source, mode

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        a = self.source.pattern(ctx.node.name).to(signal.dtype)
        op = ctx.layer
        w, _ = op.weights()
        assert w is not None, "the pattern rules act on layers with weights"
        if a.ndim == w.ndim:
            return [op.transpose(signal, a if self.mode == "net" else w * a, ctx.x.shape)]
        positive = (op.forward(ctx.x, w) > 0).to(signal.dtype)  # each unit's regime, per image
        on, off = (op.transpose(s, p if self.mode == "net" else w * p, ctx.x.shape)
                            for s, p in ((signal * positive, a[0]), (signal * (1 - positive), a[1])))
        return [on + off]

    def __repr__(self) -> str:
        return f"PatternRule(mode={self.mode}, estimator={self.source.estimator})"


class PatternChain(RuleChain):
    """The rule chain of a pattern method: its patterns are made for the model as it is, on the whole batch,
    before any chunk of it is explained."""

    def __init__(self, source: PatternSource):
        self.source = source

    def prepare(self, ex: Explaining, x: torch.Tensor) -> None:
        self.source.prepare(ex, x)

    def __repr__(self) -> str:
        return f"PatternChain(estimator={self.source.estimator})"
