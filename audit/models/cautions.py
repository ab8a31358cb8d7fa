"""What loading a model did not refuse but a reader of its audit must know (a weight cast up from a lower
precision, a hook whose code could not be read to the end, a forward that computes part of its values in a
narrower dtype than its inputs').

A loader records each such line on the model (``model.metadata["warnings"]``) and says it as a
:class:`~attributions.errors.ToolkitWarning`; a run logs the lines of every model it audits, records them in its
manifest (``warnings``) and shows them in its report's Models section.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from attributions.errors import ToolkitWarning
from attributions.hooks import unresolved_hooks


def caution(model: nn.Module, line: str) -> None:
    """Record ``line`` in ``model.metadata["warnings"]`` and say it as a :class:`ToolkitWarning`."""
    metadata: Any = getattr(model, "metadata", None)
    if not isinstance(metadata, dict):
        metadata = {}
        model.metadata = metadata
    metadata.setdefault("warnings", []).append(line)
    warnings.warn(line, ToolkitWarning, stacklevel=3)


def cautions(model: nn.Module) -> list[str]:
    """Every line a reader of ``model``'s audit must know: its loader's, then its hooks' (read now: a hook
    registered after loading counts)."""
    recorded = (getattr(model, "metadata", None) or {}).get("warnings", [])
    return [*recorded, *unresolved_hooks(model)]


def narrowed_dtypes(forward: Callable[[torch.Tensor], Any], x: torch.Tensor) -> set[torch.dtype]:
    """The floating dtypes that ops of ``forward(x)`` (a model, or an explainer's forward through its captured
    graph) narrow a wider floating input to (a float64 tensor cast to float32: timm's EfficientViT computes its
    linear attention so), recorded below autograd, by dispatch. Constants made narrow (a float32 position table)
    are not narrowing. ``x``: (B, ...) inputs."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    seen: set[torch.dtype] = set()

    def floats(tree: Any) -> list[torch.Tensor]:
        return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]

    class Record(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            widest = max((t.dtype.itemsize for t in floats((args, kwargs))), default=0)
            seen.update(t.dtype for t in floats(out) if t.dtype.itemsize < widest)
            return out

    with torch.no_grad(), Record():  # type: ignore[no-untyped-call]
        forward(x)
    return seen


def narrowing(model: nn.Module, x: torch.Tensor) -> str | None:
    """What a reader must know of a model whose forward narrows its values (:func:`narrowed_dtypes` through the
    engine's captured graph, which calls none of the model's hooks, on ``x``, (B, ...) inputs): the dtypes, and
    DeepLIFT's completeness gap measured on ``x`` for the predicted classes (its rules distribute f(x) - f(x0)
    exactly; what they miss is the model's own rounding, and every sum a method promises holds only to it). None
    when nothing narrows, or when the engine refuses the model (the run's units say why)."""
    from attributions.errors import AttributionError
    from attributions.explainer import Explainer

    try:
        narrow = narrowed_dtypes(Explainer(model, "deeplift").forward, x)
    except AttributionError:
        return None
    worst = completeness_gap(model, x) if narrow else None
    if worst is None:
        return None
    names = ", ".join(sorted(str(d).removeprefix("torch.") for d in narrow))
    return (f"computes part of its forward in {names}, narrower than its {str(x.dtype).removeprefix('torch.')} "
            "inputs: the sums a method promises (DeepLIFT's f(x) - f(x0), LRP's conservation) hold only to that "
            f"precision; DeepLIFT's maps miss it by up to {worst:.1e} of f(x) - f(x0) on {len(x)} of the audited "
            "images")


def completeness_gap(model: nn.Module, x: torch.Tensor, method: str = "deeplift") -> float | None:
    """The largest |sum of the map - (f(x) - f(x0))| / |f(x) - f(x0)| of ``method``'s maps of ``x`` (B, ...) for
    the predicted classes; None where the engine refuses the model (its units say why)."""
    from attributions.errors import AttributionError
    from attributions.explainer import Explainer

    try:
        explainer = Explainer(model, method)
        maps = explainer.attribute(x)
        gap = explainer.compute_convergence_delta(maps, x).abs()
        with torch.no_grad():
            logits = explainer.forward(x)
            target = logits.argmax(1)
            difference = logits.gather(1, target[:, None])[:, 0] - explainer.forward(explainer.baseline_like(x))[0, target]
    except AttributionError:
        return None
    return float((gap / difference.abs().clamp_min(torch.finfo(difference.dtype).tiny)).max())
