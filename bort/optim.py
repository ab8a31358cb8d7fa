"""Bort optimizers (Zhang et al., ICLR 2023): SGD and AdamW with a bounded-orthogonality correction.

Each constrained parameter (ndim >= 2) is viewed as W (out, n) and corrected by
gamma * Delta(W) (see :mod:`bort.corrections`); a packed projection (``nn.MultiheadAttention``'s
``in_proj_weight``, the query, key and value maps stacked) as its ``maps`` linear maps, each
corrected on its own (param group key ``maps``):

* :class:`Bort` (SGD form): g <- grad + gamma Delta(W) + wd W; momentum; W <- W - lr g.
* :class:`BortAdamW` (decoupled): W <- W (1 - lr wd); W <- W - lr gamma Delta(W); then Adam on grad.

With gamma = 0 they are exactly ``torch.optim.SGD`` and ``torch.optim.AdamW``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from bort.corrections import check_amplitude, check_mode, correction, feasible_mode
from bort.errors import BortError


def _check(name: str, value: float, upper: float | None = None) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (upper and value >= upper):
        bound = f" and < {upper}" if upper else ""
        raise BortError(f"Bort: {name} must be finite, >= 0{bound}; got {value!r}")


class _BortBase(torch.optim.Optimizer):
    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        for group in [defaults] + [g for g in (params if isinstance(params, list) else []) if isinstance(g, dict)]:
            self._validate(group)
        super().__init__(params, defaults)

    @staticmethod
    def _validate(group: dict[str, Any]) -> None:
        for key in ("lr", "weight_decay", "gamma"):
            if key in group:
                _check(key, group[key])
        if "momentum" in group:
            _check("momentum", group["momentum"], 1.0)
        if "mode" in group:
            check_mode(group["mode"])
        if "amplitude" in group:
            group["amplitude"] = check_amplitude(group["amplitude"])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self._validate(param_group)
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.nn.Parameter, group: dict[str, Any]) -> None:
        raise NotImplementedError

    @staticmethod
    def _delta(p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor | None:
        """gamma * Delta(W) shaped like p, or None when p is not constrained."""
        if group["gamma"] == 0 or p.ndim < 2:
            return None
        maps = group.get("maps", 1)
        out = []
        for w in p.detach().reshape(p.shape[0], -1).chunk(maps):  # a packed projection: one map at a time
            mode = feasible_mode(group["mode"], w.shape) if group["feasible_side"] else group["mode"]
            out.append(correction(w, mode, group["amplitude"]))
        return torch.cat(out).reshape(p.shape).mul_(group["gamma"])


class Bort(_BortBase):
    """Bort, SGD form: the correction joins the gradient before momentum.

    Parameters
    ----------
    params : iterable of parameters or param groups (see :func:`param_groups`)
    lr, momentum, weight_decay : as ``torch.optim.SGD`` (no dampening, no Nesterov)
    gamma : float
        Strength of the correction; 0 disables it.
    amplitude : float or "adaptive"
        c in W W^T = c I; "adaptive" recomputes the squared mean row norm each step.
    mode : str
        One of :data:`bort.corrections.MODES`.
    feasible_side : bool
        Apply row modes to the columns of tall weights (out > in k k), the only feasible side.
    """

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 gamma: float = 0.05, amplitude: float | str = 1.0, mode: str = "l1-full-row",
                 feasible_side: bool = True):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, gamma=gamma,
                                      amplitude=amplitude, mode=mode, feasible_side=feasible_side))

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        g = cast(torch.Tensor, p.grad)  # step() updates only the parameters that have a gradient
        delta = self._delta(p, group)
        if delta is not None:
            g = g.add(delta)
        if group["weight_decay"]:
            g = g.add(p, alpha=group["weight_decay"])
        if group["momentum"]:
            state = self.state[p]
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = torch.clone(g).detach()
            else:
                buf.mul_(group["momentum"]).add_(g)
            g = buf
        p.add_(g, alpha=-group["lr"])


class BortAdamW(_BortBase):
    """Bort, AdamW form: decoupled weight decay, then the correction, then Adam on the task gradient.

    Parameters
    ----------
    params : iterable of parameters or param groups (see :func:`param_groups`)
    lr, weight_decay : as ``torch.optim.AdamW`` (the decay decoupled)
    betas, eps : as ``torch.optim.AdamW``
    gamma, amplitude, mode, feasible_side : as :class:`Bort`
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, gamma: float = 0.05,
                 amplitude: float | str = 1.0, mode: str = "l1-full-row", feasible_side: bool = True):
        for b in betas:
            _check("betas", b, 1.0)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, gamma=gamma,
                                      amplitude=amplitude, mode=mode, feasible_side=feasible_side))

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        p.mul_(1 - group["lr"] * group["weight_decay"])
        delta = self._delta(p, group)
        if delta is not None:
            p.sub_(delta, alpha=group["lr"])
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        step = float(state["step"])
        grad = cast(torch.Tensor, p.grad)  # step() updates only the parameters that have a gradient
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = group["lr"] / (1 - beta1 ** step)
        denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2 ** step)).add_(group["eps"])
        p.addcdiv_(state["exp_avg"], denom, value=-step_size)


class Constrained(NamedTuple):
    """A weight Bort constrains: its ``name`` in the model, the ``parameter``, and how many linear maps
    it stacks along its first axis (``maps``: 3 for a packed query / key / value projection)."""

    name: str
    parameter: nn.Parameter
    maps: int = 1


def constrained_parameters(model: nn.Module) -> list[Constrained]:
    """The conv and linear weights of ``model`` and the attention projections of its
    ``nn.MultiheadAttention`` modules (packed or separate): the parameters Bort constrains.

    Parameters
    ----------
    model : the model whose parameters are listed (not changed)
    """
    kinds = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
    out = []
    for name, m in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(m, kinds) and m.weight is not None:
            # torch types a conv / linear weight as a plain Tensor; it is registered as a Parameter
            out.append(Constrained(f"{prefix}weight", cast(nn.Parameter, m.weight)))
        elif isinstance(m, nn.MultiheadAttention):
            if m.in_proj_weight is not None:
                out.append(Constrained(f"{prefix}in_proj_weight", m.in_proj_weight, 3))
            out += [Constrained(f"{prefix}{k}", getattr(m, k)) for k in ("q_proj_weight", "k_proj_weight",
                                                                         "v_proj_weight") if getattr(m, k) is not None]
    return out


def param_groups(model: nn.Module, gamma: float, weight_decay: float = 0.0) -> list[dict[str, Any]]:
    """Param groups: conv / linear weights and attention projections with ``gamma`` (packed projections
    in a group of their own, ``maps`` 3); everything else (biases, norms, tokens) gamma 0.

    Every group gets ``weight_decay``, so with gamma = 0 training equals the plain optimizer's.

    Parameters
    ----------
    model : nn.Module
        Its parameters are sorted into the groups (:func:`constrained_parameters` names the constrained ones).
    gamma : float
        The correction strength of the constrained weights' groups.
    weight_decay : float, default 0.0
        The weight decay of every group.

    Returns
    -------
    list of dict
        Param groups for :class:`Bort` / :class:`BortAdamW`: the constrained weights (``gamma``), the packed
        projections (``gamma``, ``maps`` 3), the other parameters (gamma 0), each with ``weight_decay``;
        empty groups are left out.
    """
    weights = {id(c.parameter): c.maps for c in constrained_parameters(model)}
    groups = [{"params": [p for p in model.parameters() if weights.get(id(p)) == 1], "gamma": gamma,
               "weight_decay": weight_decay},
              {"params": [p for p in model.parameters() if weights.get(id(p), 1) > 1], "gamma": gamma,
               "weight_decay": weight_decay, "maps": 3},
              {"params": [p for p in model.parameters() if id(p) not in weights], "gamma": 0.0,
               "weight_decay": weight_decay}]
    return [g for g in groups if g["params"]]
