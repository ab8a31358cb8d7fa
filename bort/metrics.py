"""How far a model's weights are from bounded orthogonality."""
from __future__ import annotations

import pandas as pd
import torch
from torch import nn

from bort.optim import constrained_parameters


def constraint_error(model: nn.Module, amplitude: float | None = None) -> pd.DataFrame:
    """Per conv / linear layer (and per query, key and value map of an attention projection):
    orthogonality and boundedness errors on the feasible side.

    W is viewed as (out, n). The feasible side is the rows when out <= n (G = W W^T, out x out),
    else the columns (G = W^T W, n x n). With c the amplitude (default: tr(G) / dim, the c that
    best fits G, which makes the error scale-free):

    * ``orth_error`` = ||G - cI||_F / ||cI||_F
    * ``bound_error`` = RMS over rows (columns) of (||w_i|| - sqrt(c)) / sqrt(c)

    Parameters
    ----------
    model : nn.Module
        Read only: its conv and linear weights and its ``nn.MultiheadAttention`` projections
        (:func:`bort.optim.constrained_parameters`), each viewed as (out, n), n = in * k * k.
    amplitude : float, optional
        The c of every layer's errors; None: each layer's own best-fitting c, tr(G) / dim.

    Returns
    -------
    pandas.DataFrame
        One row per layer (a packed query / key / value projection as three rows, ``<name>.q``, ``.k``,
        ``.v``), with columns layer (the weight's name without ``.weight`` / ``_weight``), out, n, side
        (``rows`` or ``columns``), c, orth_error, bound_error.
    """
    rows = []
    maps = []
    for weight in constrained_parameters(model):
        w = weight.parameter.detach().double().reshape(weight.parameter.shape[0], -1)
        layer = weight.name.removesuffix(".weight").removesuffix("_weight")  # in_proj_weight: the in_proj maps
        maps += list(zip([f"{layer}.{q}" for q in "qkv"], w.chunk(3))) if weight.maps == 3 else [(layer, w)]
    for name, w in maps:
        side = "rows" if w.shape[0] <= w.shape[1] else "columns"
        gram = w @ w.T if side == "rows" else w.T @ w
        dim = gram.shape[0]
        c = float(gram.diagonal().mean()) if amplitude is None else float(amplitude)
        eye = torch.eye(dim, dtype=gram.dtype)
        orth = float((gram - c * eye).norm() / (c * dim ** 0.5))
        norms = gram.diagonal().clamp_min(0).sqrt()
        bound = float(((norms - c ** 0.5) / c ** 0.5).pow(2).mean().sqrt())
        rows.append({"layer": name, "out": w.shape[0], "n": w.shape[1], "side": side,
                     "c": c, "orth_error": orth, "bound_error": bound})
    return pd.DataFrame(rows, columns=["layer", "out", "n", "side", "c", "orth_error", "bound_error"])
