"""Which forward hooks may change what a model computes, read from their code (the reading runs none of them).

The engine explains ``model(x)`` as the modules' code computes it and never runs hooks to explain, so a hook that
changes the computation must be refused by name. A hook changes it when it returns a value, when it recomputes a
weight (the classic spectral_norm / weight_norm pre-hooks), or when it writes into its arguments (the module, its
input or its output) in place while returning None. The last is read from the hook's bytecode
(:mod:`attributions.bytecode`), before anything runs: the refusal names the hook and what it does.

Where the reading cannot follow what a hook does with its arguments (:func:`unresolved_hooks`), the model is not
refused: the hook may well be an observer that hands its output to a callback, and the maps are exact for the
model as its modules compute it either way. It is said instead: a :class:`~attributions.errors.ToolkitWarning`
when a graph is captured, and a line in a run's log, manifest and report. Whether any hook does change the
output is then checked without reading code: each capture runs the model's own forward once, hooks and all, and
compares its logits with the captured graph's (:mod:`attributions.hook_check`), which refuses what no reading saw.
"""
from __future__ import annotations

import warnings
from typing import Any

from torch import nn
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from attributions.bytecode import read_hook, returns_only_none
from attributions.errors import AttributionError, ToolkitWarning

# pre-hooks that recompute a parameter from others on every call: the engine never runs hooks, so it would read
# a stale weight and randomizing the parameters behind it would change nothing
_RECOMPUTING = (SpectralNorm, WeightNorm)


def forward_changing_hooks(model: nn.Module) -> list[str]:
    """The forward hooks and pre-hooks of ``model`` (and the global ones) that may change what it computes:
    "<module path>: <kind> <hook name>" for each hook that returns a value, writes into its arguments in place,
    or recomputes a weight (the classic spectral_norm and weight_norm)."""
    return [f"{where}: {_describe(kind, hook)}" for where, kind, hook in _hooks(model) if changes(hook)]


def refuse_changing_hooks(model: nn.Module) -> None:
    """An :class:`AttributionError` naming every hook of ``model`` that may change what it computes
    (:func:`forward_changing_hooks`) and what to do instead; nothing when there is none."""
    changing = forward_changing_hooks(model)
    if changing:
        recomputing = any(name in h for h in changing for name in ("SpectralNorm", "WeightNorm"))
        raise AttributionError(f"the model has hooks that may change what it computes ({'; '.join(changing)}): the "
                               "engine explains model(x) as its modules compute it and never runs hooks; remove them "
                               "(handle.remove()) or move what they do into a module's forward"
                               + ("; for spectral_norm / weight_norm use torch.nn.utils.parametrizations.spectral_norm "
                                  "/ weight_norm, which the engine follows" if recomputing else ""))


def _describe(kind: str, hook: Any) -> str:
    return f"{kind.strip('_').replace('_', ' ')[:-1]} {getattr(hook, '__qualname__', type(hook).__name__)}"


def changes(hook: Any) -> bool:
    """Whether ``hook`` may change what its module computes."""
    return isinstance(hook, _RECOMPUTING) or not returns_only_none(hook) or read_hook(hook).writes


def _hooks(model: nn.Module) -> list[tuple[str, str, Any]]:
    """(where, kind, hook) for every forward hook and pre-hook of ``model``'s modules, then the global ones."""
    found = [(path or "the model", kind, hook) for path, module in model.named_modules()
             for kind in ("_forward_pre_hooks", "_forward_hooks") for hook in getattr(module, kind).values()]
    return found + [("every module", kind, hook) for kind in ("_global_forward_pre_hooks", "_global_forward_hooks")
                    for hook in getattr(nn.modules.module, kind).values()]


def registered_hooks(model: nn.Module) -> list[str]:
    """Every forward hook and pre-hook of ``model``'s modules, then the global ones, whatever they do:
    "<module path>: <kind> <hook name>"."""
    return [f"{where}: {_describe(kind, hook)}" for where, kind, hook in _hooks(model)]


def unresolved_hooks(model: nn.Module) -> list[str]:
    """A line for each forward hook of ``model`` (or global one) that is not refused but whose code the reading
    could not follow entirely: where it is, and what was not followed."""
    lines = []
    for where, kind, hook in _hooks(model):
        if isinstance(hook, _RECOMPUTING) or not returns_only_none(hook):
            continue  # refused by forward_changing_hooks
        reading = read_hook(hook)
        if not reading.writes and reading.unresolved:
            lines.append(f"{where}: {_describe(kind, hook)} may write into its arguments, and its code could not be "
                         f"read to the end ({'; '.join(reading.unresolved)}); the maps explain the model as its "
                         "modules compute it, without this hook")
    return lines


def warn_unresolved_hooks(model: nn.Module) -> None:
    """A :class:`ToolkitWarning` for each line of :func:`unresolved_hooks`."""
    for line in unresolved_hooks(model):
        warnings.warn(line, ToolkitWarning, stacklevel=3)
