"""How a randomization stage re-initialises a part's tensors, and what each draw means.

Every draw comes from the CPU generator seeded by (seed, part name) and is made on a CPU copy, so a
stage is reproducible, independent of the global RNG and the same on a GPU. Schemes (``init``):

* ``reset``: the part's module's own ``reset_parameters`` / ``_reset_parameters`` (PyTorch's
  default initialisation, as Quantus); where the module has none, the library's initialiser
  (the ``_init_weights`` of the nearest enclosing Hugging Face or timm model, applied to the
  module); for a tensor neither
  draws (a class token, a position embedding, a layer scale), a normal distribution truncated at
  2 sigma, sigma the trained tensor's standard deviation (its root mean square where all its entries
  are equal), as libraries draw embeddings and tokens;
* ``gaussian``: every tensor from that truncated normal, biases zero (after Adebayo et al. 2018);
* ``permute``: every tensor's trained entries in a random order (the same distribution).

Only the part's own tensors change: an initialiser that also writes other tensors
(``nn.MultiheadAttention`` zeroes its output projection's bias) runs on a copy. A BatchNorm follows
the BatchNorm policy instead: ``reset`` (weight 1, bias 0, statistics 0 / 1, as Sixt et al.) or
``keep-stats`` (left trained, as Adebayo et al.). Each tensor's record says which draw it got, and
marks a constant result (LayerNorm's 1 / 0): the untrained default, not a random draw.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from audit.checks.stages import Part
from audit.errors import AuditError
from audit.inputs import check_option
from audit.models.copying import copy_model

INITS = ("reset", "gaussian", "permute")
BN_POLICIES = ("reset", "keep-stats")
CONSTANT = "; constant: the untrained default, not a random draw"
KEPT = "kept trained (bn=keep-stats)"


@contextmanager
def seeded(seed: int, name: str) -> Iterator[None]:
    """The CPU generator seeded by (``seed``, ``name``) for the duration; the global RNG restored after."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
        yield


def _sigma(t: torch.Tensor) -> float:
    """The trained tensor's standard deviation; its root mean square where all entries are equal; else 1."""
    if t.numel() <= 1:
        return 1.0
    sigma = float(t.std())
    return sigma or float(t.pow(2).mean().sqrt()) or 1.0


def _truncated_normal(t: torch.Tensor) -> str:
    sigma = _sigma(t)
    nn.init.trunc_normal_(t, 0.0, sigma, -2.0 * sigma, 2.0 * sigma)
    return f"truncated normal (sigma {sigma:.3g}, the trained tensor's)"


def _scheme_draw(t: torch.Tensor, name: str, init: str) -> str:
    """Draw ``t`` (a CPU copy of the trained tensor ``name``) in place by ``init`` (gaussian | permute)."""
    if init == "permute":
        t.copy_(t.flatten()[torch.randperm(t.numel())].reshape(t.shape))
        return "permutation of the trained entries"
    if name.rsplit(".", 1)[-1] == "bias":
        t.zero_()
        return "zeros (a bias)"
    return _truncated_normal(t)


def _module_reset(module: nn.Module) -> str | None:
    # nn.MultiheadAttention keeps its own as _reset_parameters
    for name in ("reset_parameters", "_reset_parameters"):
        if callable(getattr(module, name, None)):
            return name
    return None


def _library_init(model: nn.Module, holder: str) -> tuple[str, Callable[[nn.Module], None]] | None:
    """The library's initialiser of the module at ``holder``: the ``_init_weights(module)`` of its
    nearest ancestor that has one (a Hugging Face ``PreTrainedModel``, a timm model), with that
    ancestor's class name; None for the model's own tensors or when no ancestor has one."""
    names = holder.split(".") if holder else []
    for k in range(len(names) - 1, -1, -1):
        ancestor = model.get_submodule(".".join(names[:k]))
        init = getattr(ancestor, "_init_weights", None)
        if callable(init):
            return type(ancestor).__name__, init
    return None


def draw(model: nn.Module, part: Part, init: str) -> dict[str, tuple[torch.Tensor, str]]:
    """{tensor name: (its new value on the CPU, how it was drawn)} for ``part`` of ``model`` under
    ``init``, drawn from the current CPU generator; ``model`` is not changed."""
    holder = model.get_submodule(part.holder)
    own = {id(p): n for n, p in holder.named_parameters(recurse=False)}
    # the holder's own names (a tensor tied to another module's is named after that module in the model)
    local = {t: own.get(id(model.get_parameter(t)), t) for t in part.tensors}
    trained = {t: model.get_parameter(t).detach().cpu() for t in part.tensors}
    if init != "reset":
        out = {}
        for t in part.tensors:
            value = trained[t].clone()
            out[t] = (value, _scheme_draw(value, t, init))
        return out
    reset = _module_reset(holder)
    owns_all = set(local.values()) == set(own.values())
    if reset is not None and owns_all:
        twin = copy_model(holder).cpu()
        with torch.no_grad():
            getattr(twin, reset)()
        how = f"{type(holder).__name__}.{reset}"
        return {t: (twin.get_parameter(local[t]).detach(), how) for t in part.tensors}
    out = {}
    library = _library_init(model, part.holder)
    if library is not None:
        owner, initialise = library
        twin = copy_model(holder).cpu()
        try:
            with torch.no_grad():
                initialise(twin)
            drew = True
        except TypeError:  # an initialiser that is not applied module by module: none to use here
            drew = False
        for t in part.tensors if drew else ():
            value = twin.get_parameter(local[t]).detach()
            if not torch.equal(value, trained[t]):  # the library's initialiser drew it
                out[t] = (value, f"{owner}._init_weights")
    with torch.no_grad():
        for t in part.tensors:
            if t not in out:
                value = trained[t].clone()
                out[t] = (value, _truncated_normal(value))
    return out


def reset_batchnorm(bn: nn.Module) -> None:
    """A BatchNorm to its untrained state: weight 1, bias 0, running mean 0, running variance 1."""
    assert isinstance(bn, _BatchNorm)
    with torch.no_grad():
        if bn.weight is not None:
            bn.weight.fill_(1.0)
            bn.bias.zero_()
        # a BatchNorm built with track_running_stats=False has no statistics to reset
        if bn.running_mean is not None:
            bn.running_mean.zero_()
        if bn.running_var is not None:
            bn.running_var.fill_(1.0)


def reinitialise_part(model: nn.Module, part: Part, seed: int, init: str = "reset",
                      bn: str = "reset") -> dict[str, str]:
    """Re-initialise ``part`` of ``model`` in place; {tensor name: how it was drawn} (:func:`draw`).

    A BatchNorm part follows ``bn`` (reset | keep-stats) whatever ``init``.
    """
    check_option("re-initialisation", init, INITS)
    check_option("BatchNorm policy", bn, BN_POLICIES)
    if part.batchnorm:
        if bn == "keep-stats":
            return {t: KEPT for t in part.tensors}
        reset_batchnorm(model.get_submodule(part.holder))
        return {t: "reset to weight 1, bias 0, statistics 0 / 1 (bn=reset)" + CONSTANT for t in part.tensors}
    with seeded(seed, part.path):
        drawn = draw(model, part, init)
    record = {}
    with torch.no_grad():
        for t, (value, how) in drawn.items():
            model.get_parameter(t).copy_(value)
            record[t] = how + (CONSTANT if value.numel() > 1 and bool((value == value.flatten()[0]).all()) else "")
    return record


def reinitialise(module: nn.Module, name: str, seed: int, init: str = "reset") -> None:
    """Re-initialise all of ``module``'s own parameters in place, seeded by (``seed``, ``name``), as a
    layer stage does (:func:`draw`); a clear error for ``init="reset"`` on a module with no initialiser."""
    check_option("re-initialisation", init, INITS)
    if init == "reset" and _module_reset(module) is None:
        raise AuditError(f"layer {name!r} ({type(module).__name__}) has no reset_parameters; use init "
                         "'gaussian' or 'permute'")
    tensors = tuple(n for n, _ in module.named_parameters(recurse=False))
    reinitialise_part(module, Part(name, "", tensors), seed, init)
