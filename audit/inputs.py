"""Validation of the images and labels handed to the audit tests."""
from __future__ import annotations

import numpy as np
import torch

from audit.errors import AuditError


def check_inputs(model, x, y=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x as a float tensor (B, ...) and y as an int64 tensor (B,), or a clear error."""
    if not isinstance(model, torch.nn.Module):
        raise AuditError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    if not x.is_floating_point() or x.ndim < 2 or x.shape[0] == 0:
        raise AuditError(f"x must be a non-empty float array (B, C, H, W), got {x.dtype} {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise AuditError("x contains NaN or infinite values")
    if y is not None:
        y = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
        if y.is_floating_point() or y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise AuditError(f"y must be integer labels of shape ({x.shape[0]},) to match x, got {y.dtype} "
                             f"{tuple(y.shape)}")
        y = y.long()
    return x.detach(), y


def check_labels(y: torch.Tensor, num_classes: int) -> None:
    if bool(((y < 0) | (y >= num_classes)).any()):
        raise AuditError(f"labels out of range: the model has {num_classes} classes, labels span "
                         f"{int(y.min())}..{int(y.max())}")
