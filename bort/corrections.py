"""The Bort corrections Delta(W): (sub)gradients of the bounded-orthogonality penalties.

A parameter is viewed as a matrix W of shape (out, n), n = in * k * k: one row per output
filter. With G = W W^T (rows) or G = W^T W (columns) and amplitude c, each mode is the
(sub)gradient of a penalty:

=============  ===============================  ==============================
mode           penalty                          Delta(W)
=============  ===============================  ==============================
l2-full        1/4 ||W W^T - cI||_F^2           W W^T W - c W
l1-full-row    1/2 ||W W^T - cI||_1             sign(W W^T - cI) W
l1-full-col    1/2 ||W^T W - cI||_1             W sign(W^T W - cI)
l2-row         1/4 sum_i (||w_i||^2 - c)^2      diag(W W^T - cI) W
l2-col         1/4 sum_j (||w_:j||^2 - c)^2     W diag(W^T W - cI)
l1-row         1/2 sum_i | ||w_i||^2 - c |      sign(diag(W W^T - cI)) W
l1-col         1/2 sum_j | ||w_:j||^2 - c |     W sign(diag(W^T W - cI))
=============  ===============================  ==============================

(||.||_1 is the entry-wise sum of absolute values.) The row modes constrain rows, which is
feasible only for wide W (out <= n); for a tall W the optimizer applies the column form instead
(``feasible_side``), since only its columns can be orthogonal.
"""
from __future__ import annotations

import math
from typing import cast

import torch

from attributions.errors import unknown_name
from bort.errors import BortError

MODES = ("l2-full", "l1-full-row", "l1-full-col", "l2-row", "l2-col", "l1-row", "l1-col")
_COLUMN_TWIN = {"l1-full-row": "l1-full-col", "l2-row": "l2-col", "l1-row": "l1-col"}


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise unknown_name("Bort mode", mode, MODES, BortError)
    return mode


def check_amplitude(amplitude: float | str) -> float | str:
    if amplitude == "adaptive":
        return amplitude
    if isinstance(amplitude, str) or not math.isfinite(float(amplitude)) or float(amplitude) <= 0:
        raise BortError(f"amplitude must be a positive finite number or 'adaptive', got {amplitude!r}")
    return float(amplitude)


def feasible_mode(mode: str, shape: tuple[int, ...]) -> str:
    """The column twin of a row mode when W (out, n) is tall (out > n); else ``mode``."""
    return _COLUMN_TWIN.get(mode, mode) if shape[0] > shape[1] else mode


def _uses_columns(mode: str) -> bool:
    return mode.endswith("-col")


def amplitude_value(w: torch.Tensor, mode: str, amplitude: float | str) -> float | torch.Tensor:
    """c: the fixed amplitude, or (adaptive) the squared mean norm of the constrained rows / columns."""
    if amplitude != "adaptive":
        return cast(float, amplitude)  # mypy does not narrow a str | float by comparison with "adaptive"
    result: torch.Tensor = w.norm(dim=0 if _uses_columns(mode) else 1).mean() ** 2
    return result


def correction(w: torch.Tensor, mode: str, amplitude: float | str = 1.0) -> torch.Tensor:
    """Delta(W) for a matrix ``w`` of shape (out, n); returns the same shape.

    Parameters
    ----------
    w : Tensor
        (out, n) the weight viewed as a matrix (one row per output unit, n = in * k * k).
    mode : str
        One of :data:`MODES` (see the module docstring's table), applied as given: the row modes are not
        switched to their column twins here (:func:`feasible_mode` does that); another name is a
        :class:`BortError`.
    amplitude : float or "adaptive", default 1.0
        c; ``"adaptive"``: the squared mean norm of the rows, or of the columns for a column mode
        (:func:`amplitude_value`).

    Returns
    -------
    Tensor
        (out, n) Delta(W), the (sub)gradient of the mode's penalty.
    """
    c = amplitude_value(w, check_mode(mode), amplitude)
    if mode == "l2-full":
        return w @ (w.T @ w) - c * w if w.shape[0] > w.shape[1] else (w @ w.T) @ w - c * w
    if _uses_columns(mode):
        gram = w.T @ w
        gram.diagonal().sub_(c)
        if mode == "l1-full-col":
            return w @ torch.sign(gram)
        d = gram.diagonal()
        return w * (torch.sign(d) if mode == "l1-col" else d)
    gram = w @ w.T
    gram.diagonal().sub_(c)
    if mode == "l1-full-row":
        return torch.sign(gram) @ w
    d = gram.diagonal()
    return (torch.sign(d) if mode == "l1-row" else d)[:, None] * w


def penalty(w: torch.Tensor, mode: str, amplitude: float = 1.0) -> torch.Tensor:
    """The scalar penalty whose (sub)gradient is ``correction`` (fixed amplitude); for tests and logs.

    Parameters
    ----------
    w : Tensor
        (out, n) the weight viewed as a matrix.
    mode : str
        One of :data:`MODES` (see the module docstring's table), applied as given; another name is a
        :class:`BortError`.
    amplitude : float, default 1.0
        c, fixed (no ``"adaptive"`` form).

    Returns
    -------
    Tensor
        The penalty, a 0-dim tensor.
    """
    c = amplitude
    if check_mode(mode) == "l2-full":
        return 0.25 * ((w @ w.T) - c * torch.eye(w.shape[0], dtype=w.dtype)).pow(2).sum()
    gram = w.T @ w if _uses_columns(mode) else w @ w.T
    eye = torch.eye(gram.shape[0], dtype=w.dtype)
    if mode in ("l1-full-row", "l1-full-col"):
        return 0.5 * (gram - c * eye).abs().sum()
    d = gram.diagonal() - c
    return 0.25 * d.pow(2).sum() if mode.startswith("l2") else 0.5 * d.abs().sum()
