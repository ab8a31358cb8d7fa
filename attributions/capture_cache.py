"""Exported programs kept per model, so that a model is exported once per input shape, not once per check.

``torch.export`` takes 0.1-2 s per model, more than a whole check on a small model. A program depends on
the model's structure (its modules' classes and code, their parameters' shapes and dtypes, their
plain attributes), never on parameter values: a program kept for a model serves it again while that structure
is unchanged, and serves the deep copies the audit checks make of it (:func:`share`), whose structure is the
same. Each use compares the model's :func:`fingerprint` with the one the program was exported at; any
difference (a replaced layer, a changed attribute, a monkeypatched ``forward``) exports anew.

The programs are held by a weak reference to the model they were exported from (a deep copy's go to its
original): they go with it. What a fingerprint cannot see is Python state outside the model (a global flag
its forward reads); after changing such state, :func:`forget` the model's programs.
"""
from __future__ import annotations

import enum
import functools
import weakref
from collections.abc import Hashable
from typing import Any

import torch
from torch import nn

_KEPT_PER_MODEL = 4  # input shapes kept per model, the most recently used
_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # bookkeeping every module has: parameters, hooks, flags
_PLAIN = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size, enum.Enum)

# {model: [((input shape, dtype, device; batch or None), fingerprint, program, dynamic)]}, most recently used last
_PROGRAMS: weakref.WeakKeyDictionary[nn.Module, list[tuple[Hashable, Hashable, Any, bool]]] = \
    weakref.WeakKeyDictionary()
# {deep copy: its original}: a copy reads and adds to its original's programs
_ORIGINS: weakref.WeakKeyDictionary[nn.Module, weakref.ref[nn.Module]] = weakref.WeakKeyDictionary()


def share(original: nn.Module, copy: nn.Module) -> None:
    """Let ``copy``, a deep copy of ``original``, use the programs exported for ``original`` (and add to them)."""
    _ORIGINS[copy] = weakref.ref(_owner(original))


def forget(model: nn.Module | None = None) -> None:
    """Drop the programs kept for ``model`` (and its copies), or for every model when None: the next map exports
    anew. Needed only after changing state the model's forward reads from outside the model."""
    if model is None:
        _PROGRAMS.clear()
    else:
        _PROGRAMS.pop(_owner(model), None)


def lookup(model: nn.Module, example: torch.Tensor) -> tuple[Any, bool] | None:
    """(program, dynamic batch) kept for ``model`` at inputs shaped like ``example`` (B, ...) and its present
    structure, or None."""
    entries = _PROGRAMS.get(_owner(model))
    if not entries:
        return None
    keys, present = ((_key(example), None), (_key(example), example.shape[0])), fingerprint(model)
    found = next((e for e in entries if e[0] in keys and e[1] == present), None)
    if found is None:
        return None
    entries.remove(found)
    entries.append(found)
    return found[2], found[3]


def store(model: nn.Module, example: torch.Tensor, program: Any, dynamic: bool) -> None:
    """Keep ``program``, exported from ``model`` at ``example``'s shape (B, ...); ``dynamic``: it serves every
    batch size, else only B."""
    owner, present = _owner(model), fingerprint(model)
    key = _key(example), None if dynamic else example.shape[0]
    entries = [e for e in _PROGRAMS.get(owner, []) if e[0] != key or e[1] != present]
    entries.append((key, present, program, dynamic))
    _PROGRAMS[owner] = entries[-_KEPT_PER_MODEL:]


def _owner(model: nn.Module) -> nn.Module:
    ref = _ORIGINS.get(model)
    original = ref() if ref is not None else None
    return original if original is not None else model


def _key(example: torch.Tensor) -> Hashable:
    return tuple(example.shape[1:]), example.dtype, example.device.type


def fingerprint(model: nn.Module) -> Hashable:
    """What the exported program of ``model`` depends on besides parameter values: per module (in order) its
    path, class, the class's ``forward``, its parameters' and buffers' shapes, dtypes and devices, and its
    attributes that are not modules (plain values, callables by identity, other objects by their plain
    attributes); tensors held in containers (caches a forward fills) are left out."""
    seen: dict[int, Hashable] = {}
    return tuple((path, type(m), _identity(type(m).forward),
                  tuple((n, None if t is None else (tuple(t.shape), t.dtype, t.device.type, type(t)))
                        for n, t in (*m._parameters.items(), *m._buffers.items())),
                  tuple((k, _value(v, seen, 0)) for k, v in vars(m).items() if k not in _MODULE_INTERNALS))
                 for path, m in model.named_modules())


def _identity(function: Any) -> Hashable:
    """A callable by the identity of its code: deep copies of a bound method or a partial keep it."""
    while isinstance(function, functools.partial):
        function = function.func
    function = getattr(function, "__func__", function)
    return id(function), id(getattr(function, "__code__", None))


def _value(v: Any, seen: dict[int, Hashable], depth: int) -> Hashable:
    """A module attribute as a hashable description (see :func:`fingerprint`)."""
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, torch.Tensor):
        return "tensor", tuple(v.shape), v.dtype, v.device.type
    if isinstance(v, nn.Module):
        return "module", type(v)
    if isinstance(v, (tuple, list, set, frozenset)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return type(v).__name__, tuple(_value(i, seen, depth + 1) for i in items if not isinstance(i, torch.Tensor))
    if isinstance(v, dict):
        return "dict", tuple((repr(k), _value(i, seen, depth + 1)) for k, i in v.items()
                             if not isinstance(i, torch.Tensor))
    if isinstance(v, functools.partial):
        return "partial", _identity(v), _value(v.args, seen, depth + 1), _value(v.keywords, seen, depth + 1)
    if callable(v) and not hasattr(v, "__dict__") or isinstance(v, type) or hasattr(v, "__code__") \
            or hasattr(v, "__func__"):
        return "callable", _identity(v)
    if depth > 2 or not hasattr(v, "__dict__"):
        return "object", type(v)
    # an object such as a model's config, often shared by many modules: described once
    if id(v) not in seen:
        seen[id(v)] = ("object", type(v), tuple((k, _value(i, seen, depth + 1)) for k, i in vars(v).items()))
    return seen[id(v)]
