"""Validation of what a user hands the audit: models, images, labels, method lists, options."""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from attributions.errors import AttributionError, unknown_name
from attributions.explainer import check_input, model_dtype
from attributions.methods import BUILDERS
from attributions.validation import named, nonfinite_tensors
from audit.errors import AuditError, ConfigError

# what the checks take: images and labels as tensors or arrays, methods as names
Images = torch.Tensor | np.ndarray
Labels = torch.Tensor | np.ndarray | None
Methods = str | Sequence[str]
Reduction = dict[str, str]  # {method: "sum" | "max-abs"}, overrides of the heatmap reduction


def check_inputs(model: torch.nn.Module, x: Images, y: Labels = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x as a float tensor (B, ...) and y as an int64 tensor (B,), or a clear error.

    ``x`` may be a tensor or an array; the checks on it are the engine's own (finite, floating
    point, a batch axis), reported as :class:`AuditError`.
    """
    if not isinstance(model, torch.nn.Module):
        raise AuditError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_finite_model(model)
    x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    dtype = model_dtype(model) or torch.float32
    if x.is_floating_point() and x.dtype != dtype:  # e.g. float16 images for a float32 model: said, not silent
        warnings.warn(f"x is {x.dtype}; the audit computes in the model's {dtype}", stacklevel=2)
        x = x.to(dtype)
    try:
        x = check_input(x)
    except AttributionError as exc:
        raise AuditError(f"x: {exc}") from None
    if y is not None:
        y = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
        if y.is_floating_point() or y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise AuditError(f"y must be integer labels of shape ({x.shape[0]},) to match x, got {y.dtype} "
                             f"{tuple(y.shape)}")
        y = y.long()
    return x, y


def check_finite_model(model: torch.nn.Module) -> None:
    """Every floating-point parameter and buffer finite: a model with NaN / inf weights would make
    every map NaN or meaningless, and a check would blame the method."""
    bad = nonfinite_tensors(model)
    if bad:
        raise AuditError(f"the model has NaN or infinite values in {len(bad)} tensor(s): {named(bad, 5)}; repair or "
                         "retrain it before auditing")


def check_logits(logits: torch.Tensor) -> None:
    """The model's outputs on the audited images must be finite (else no map means anything)."""
    if not bool(torch.isfinite(logits).all()):
        rows = torch.nonzero(~torch.isfinite(logits).all(1)).flatten().tolist()
        raise AuditError(f"the model's outputs are NaN or infinite for image(s) {rows[:10]}; check the inputs' "
                         "range and the model before auditing")


def check_labels(y: torch.Tensor, num_classes: int) -> None:
    """Labels must index the model's classes."""
    if bool(((y < 0) | (y >= num_classes)).any()):
        raise AuditError(f"labels out of range: the model has {num_classes} classes, labels span "
                         f"{int(y.min())}..{int(y.max())}")


def resolve_methods(methods: Methods) -> list[str]:
    """A list of method names from a name, a comma-separated string, a list, or "all"."""
    if isinstance(methods, str):
        methods = list(BUILDERS) if methods == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    methods = list(methods)
    if not methods:
        raise ConfigError("no attribution method given")
    for m in methods:
        if m not in BUILDERS:
            raise unknown_name("attribution method", m, BUILDERS, ConfigError)
    return methods


def check_count(name: str, value: int) -> int:
    """``value`` when it is an integer >= 0, else an :class:`AuditError` naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AuditError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def check_option(kind: str, value: str, valid: tuple[str, ...]) -> str:
    """``value`` when it is one of ``valid``, else a :class:`ConfigError` naming the valid ones."""
    if value not in valid:
        raise unknown_name(kind, value, valid, ConfigError)
    return value
