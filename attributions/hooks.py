"""Which forward hooks may change what a model computes, read from their code (they are never run).

The engine explains ``model(x)`` as the modules' code computes it and never runs hooks, so a hook that changes
the computation must be refused by name. A hook changes it when it returns a value, when it recomputes a weight
(the classic spectral_norm / weight_norm pre-hooks), or when it writes into its arguments (the module, its input
or its output) in place while returning None. The last is read from the hook's bytecode by a symbolic pass over
its value stack that follows each value back to the hook's arguments: through attributes, items, local names,
loops and unpacking, into the Python helpers the hook calls with them, and into in-place calls of any kind
(``out.mul_(2)``, ``torch.nn.init.zeros_(out)``, ``F.relu(out, inplace=True)``, ``out *= 2``, ``out[0] = 1``).
Running a hook to see what it does would run the user's code with its side effects (an observer would store one
more activation), so the code is read instead; what it cannot resolve (a call through a value it cannot name)
counts as not writing.
"""
from __future__ import annotations

import builtins
import dis
import functools
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from attributions.errors import AttributionError

# pre-hooks that recompute a parameter from others on every call: the engine never runs hooks, so it would read
# a stale weight and randomizing the parameters behind it would change nothing
_RECOMPUTING = (SpectralNorm, WeightNorm)

# calls whose value is None: a lambda returning one of them (``lambda *a: acts.append(a)``,
# ``lambda m, i, o: store.__setitem__(name, o)``) observes, unless it calls them on its own arguments
_OBSERVING_CALLS = {"append", "extend", "add", "update", "write", "print", "put", "put_nowait", "info", "debug",
                    "warning", "set", "__setitem__", "setdefault"}
_HELPER_DEPTH = 4  # how deep helpers called with an argument are followed
_TERMINAL = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD", "JUMP_BACKWARD",
             "JUMP_ABSOLUTE", "JUMP_BACKWARD_NO_INTERRUPT"}


def forward_changing_hooks(model: nn.Module) -> list[str]:
    """The forward hooks and pre-hooks of ``model`` (and the global ones) that may change what it computes:
    "<module path>: <kind> <hook name>" for each hook that returns a value, writes into its arguments in place,
    or recomputes a weight (the classic spectral_norm and weight_norm)."""
    found = []
    for path, module in model.named_modules():
        for kind in ("_forward_pre_hooks", "_forward_hooks"):
            found += [f"{path or 'the model'}: {_describe(kind, hook)}" for hook in getattr(module, kind).values()
                      if changes(hook)]
    for kind in ("_global_forward_pre_hooks", "_global_forward_hooks"):
        found += [f"every module: {_describe(kind, hook)}" for hook in getattr(nn.modules.module, kind).values()
                  if changes(hook)]
    return found


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
    return isinstance(hook, _RECOMPUTING) or not returns_only_none(hook) or writes_arguments(hook)


def returns_only_none(hook: Any) -> bool:
    """Whether every ``return`` of the hook's code returns None (an observer); False when that cannot
    be read from its code (a callable object without Python code, a lambda returning a value)."""
    function = _function(hook)
    if function is None:
        return False
    instructions = list(dis.get_instructions(function.__code__))
    if function.__code__.co_name == "<lambda>" and _observes(instructions):
        return True
    previous = None
    for ins in instructions:
        if ins.opname == "RETURN_CONST" and ins.argval is not None:
            return False
        if ins.opname == "RETURN_VALUE" and not (previous is not None and previous.opname == "LOAD_CONST"
                                                 and previous.argval is None):
            return False
        previous = ins
    return True


def _observes(instructions: list[dis.Instruction]) -> bool:
    """Whether a lambda's body is one call of an observing function or method (its result, None, is
    what the lambda returns)."""
    loads = [i for i in instructions if i.opname in ("LOAD_METHOD", "LOAD_ATTR", "LOAD_GLOBAL", "LOAD_NAME")]
    returns = [k for k, i in enumerate(instructions) if i.opname == "RETURN_VALUE"]
    return (len(returns) == 1 and returns[0] > 0 and instructions[returns[0] - 1].opname == "CALL"
            and bool(loads) and loads[0].opname in ("LOAD_METHOD", "LOAD_ATTR", "LOAD_GLOBAL")
            and (loads[0].argval in _OBSERVING_CALLS if loads[0].opname != "LOAD_GLOBAL" else loads[0].argval == "print"
                 or len(loads) > 1 and loads[1].argval in _OBSERVING_CALLS))


def writes_arguments(hook: Any) -> bool:
    """Whether the hook's code (or a Python helper it passes an argument to) writes into one of its arguments
    in place. A bound method's ``self`` is not one of them: a hook object may keep state on itself."""
    function = _function(hook)
    if function is None:
        return False
    code = function.__code__
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    hook = _unwrap(hook)
    if isinstance(hook, types.FunctionType):
        return _writes(function, set(names), _HELPER_DEPTH, set(), {})
    receiver = getattr(hook, "__self__", hook)  # a bound method's object, or the callable object itself
    return _writes(function, set(names[1:]), _HELPER_DEPTH, set(), {names[0]: receiver} if names else {})


def _unwrap(hook: Any) -> Any:
    while isinstance(hook, functools.partial):
        hook = hook.func
    return hook


def _function(hook: Any) -> types.FunctionType | None:
    """The Python function behind a hook (a function, a method, a partial, a callable object), or None."""
    hook = _unwrap(hook)
    function = getattr(hook, "__func__", hook)
    if isinstance(function, types.FunctionType):
        return function
    call = inspect.getattr_static(type(hook), "__call__", None)  # a callable object's own method
    return call if isinstance(call, types.FunctionType) else None


@dataclass(frozen=True)
class _Value:
    """What the symbolic stack knows of a value: whether it is (reached from) an argument, the object itself
    where it is a known global, closure variable or attribute of one, and the attribute name it was loaded as."""

    rooted: bool = False
    obj: Any = None
    name: str = ""
    null: bool = False  # the NULL that CALL expects below a plain callable


_UNKNOWN = _Value()


def _writes(function: types.FunctionType, arguments: set[str], depth: int, seen: set[Any],
            objects: dict[str, Any]) -> bool:
    """Whether ``function`` writes in place into a value reached from the parameters named ``arguments``;
    ``objects``: the known values of other parameters (a method's ``self``), to resolve the helpers it calls."""
    code = function.__code__
    if (code, frozenset(arguments)) in seen or not arguments:
        return False
    seen.add((code, frozenset(arguments)))
    cells = dict(zip(code.co_freevars, function.__closure__ or ()))
    rooted = set(arguments)  # locals holding a value reached from an argument
    stack: list[_Value] = []
    at_target: dict[int, list[_Value]] = {}  # the stack a jump leaves at its target
    kw_names: tuple[str, ...] = ()
    previous = ""
    for ins in dis.get_instructions(code):
        if previous in _TERMINAL or ins.is_jump_target and ins.offset in at_target and not stack:
            stack = list(at_target.get(ins.offset, stack))
        op, name = ins.opname, ins.argval
        previous = op
        if op in ("LOAD_FAST", "LOAD_FAST_CHECK"):
            stack.append(_Value(rooted=name in rooted, obj=objects.get(name)))
        elif op == "STORE_FAST":
            value = _pop(stack)
            (rooted.add if value.rooted else rooted.discard)(name)
        elif op == "LOAD_CONST":
            stack.append(_Value(obj=name))
        elif op in ("LOAD_GLOBAL", "LOAD_NAME"):
            if op == "LOAD_GLOBAL" and ins.arg is not None and ins.arg & 1:
                stack.append(_Value(null=True))
            stack.append(_Value(obj=function.__globals__.get(name, getattr(builtins, str(name), None)), name=str(name)))
        elif op in ("LOAD_DEREF", "LOAD_CLOSURE"):
            cell = cells.get(name)
            stack.append(_Value(rooted=name in rooted, obj=_cell(cell), name=str(name)))
        elif op == "STORE_DEREF":
            value = _pop(stack)
            (rooted.add if value.rooted else rooted.discard)(name)
        elif op in ("LOAD_ATTR", "LOAD_METHOD"):
            base = _pop(stack)
            method = op == "LOAD_METHOD" or sys.version_info >= (3, 12) and ins.arg is not None and ins.arg & 1
            if _in_place_name(str(name)) and base.rooted and method:
                return True
            attribute = _Value(rooted=base.rooted, obj=_attribute(base.obj, str(name)), name=str(name))
            if method and isinstance(base.obj, (types.ModuleType, type)):  # a module's function: called plainly
                stack += [_Value(null=True), attribute]
            else:
                stack += [attribute, base] if method else [attribute]
        elif op == "BINARY_SUBSCR":
            _pop(stack)
            stack.append(_Value(rooted=_pop(stack).rooted))
        elif op in ("STORE_SUBSCR", "DELETE_SUBSCR"):  # key on top, the container below it (then the value)
            _pop(stack)
            if _pop(stack).rooted:
                return True
            if op == "STORE_SUBSCR":
                _pop(stack)
        elif op == "BINARY_OP":
            _pop(stack)
            left = _pop(stack)
            if ins.argrepr.endswith("=") and ins.argrepr not in ("==", "!=", "<=", ">=") and left.rooted:
                return True  # ``out *= 2``: a tensor's augmented assignment is in place
            stack.append(_UNKNOWN)
        elif op in ("GET_ITER", "UNARY_NEGATIVE", "UNARY_POSITIVE"):
            stack.append(_Value(rooted=_pop(stack).rooted))
        elif op == "FOR_ITER":
            stack.append(_Value(rooted=stack[-1].rooted if stack else False))
        elif op in ("UNPACK_SEQUENCE", "UNPACK_EX"):
            value = _pop(stack)
            arg = ins.arg or 0
            count = arg if op == "UNPACK_SEQUENCE" else (arg & 0xFF) + (arg >> 8) + 1
            stack += [_Value(rooted=value.rooted)] * count
        elif op in ("BUILD_TUPLE", "BUILD_LIST"):
            items = [_pop(stack) for _ in range(ins.arg or 0)]
            stack.append(_Value(rooted=any(v.rooted for v in items)))
        elif op == "COPY":
            stack.append(stack[-(ins.arg or 1)] if len(stack) >= (ins.arg or 1) else _UNKNOWN)
        elif op == "SWAP":
            k = ins.arg or 1
            if len(stack) >= k:
                stack[-1], stack[-k] = stack[-k], stack[-1]
        elif op == "PUSH_NULL":
            stack.append(_Value(null=True))
        elif op == "KW_NAMES":
            kw_names = tuple(code.co_consts[ins.arg]) if ins.arg is not None else ()
        elif op == "PRECALL":
            pass
        elif op == "CALL":
            count = ins.arg or 0
            args = [_pop(stack) for _ in range(count)][::-1]
            second, first = _pop(stack), _pop(stack)
            callee, receiver = (second, None) if first.null else (first, second)
            positional = ([receiver] if receiver is not None else []) + args[:count - len(kw_names)]
            keywords = dict(zip(kw_names, args[count - len(kw_names):]))
            kw_names = ()
            if _call_writes(callee, positional, keywords, depth, seen, method=receiver is not None):
                return True
            stack.append(_UNKNOWN)
        else:
            try:
                effect = dis.stack_effect(ins.opcode, ins.arg, jump=False) if ins.opcode >= dis.HAVE_ARGUMENT \
                    else dis.stack_effect(ins.opcode)
            except ValueError:
                effect = 0
            for _ in range(max(0, -effect)):
                _pop(stack)
            stack += [_UNKNOWN] * max(0, effect)
        if ins.opcode in dis.hasjrel + dis.hasjabs and isinstance(ins.argval, int):
            at_target.setdefault(ins.argval, list(stack))
    return False


def _call_writes(callee: _Value, positional: list[_Value], keywords: dict[str, _Value], depth: int,
                 seen: set[Any], *, method: bool) -> bool:
    """Whether a call writes into one of its rooted arguments: an in-place function (``zeros_(out)``,
    ``inplace=True``), or a Python helper that writes into the parameter it receives the value as. ``method``:
    the first of ``positional`` is the object a method was looked up on (whose in-place methods are found
    where they are looked up)."""
    if not any(v.rooted for v in [*positional, *keywords.values()]):
        return False
    if not method and _in_place_name(callee.name) and positional and positional[0].rooted:
        return True
    if keywords.get("inplace", _UNKNOWN).obj is True:
        return True
    target = callee.obj
    if depth <= 0 or target is None or not _is_user_code(target):
        return False
    function = _function(target)
    if function is None:
        return False
    code = function.__code__
    params = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    objects = {}
    if not isinstance(target, types.FunctionType) and params:  # a bound method or a callable object: self is known
        objects[params[0]] = getattr(target, "__self__", target)
        params = params[1:]
    elif positional and not positional[0].rooted and params and callee.name and params[0] == "self":
        objects[params[0]] = positional[0].obj  # a method looked up on its object: self comes first
    named = {params[k] for k, v in enumerate(positional) if v.rooted and k < len(params)}
    named |= {k for k, v in keywords.items() if v.rooted}
    if code.co_flags & inspect.CO_VARARGS and any(v.rooted for v in positional[len(params):]):
        named.add(code.co_varnames[code.co_argcount + code.co_kwonlyargcount])
    return _writes(function, named, depth - 1, seen, objects)


def _in_place_name(name: str) -> bool:
    """torch's naming of in-place ops and methods (``mul_``, ``zeros_``) and item assignment."""
    return name == "__setitem__" or name.endswith("_") and not name.startswith("_")


def _is_user_code(target: Any) -> bool:
    """Whether ``target`` is the caller's Python code rather than a library's (torch, numpy, the standard
    library): only the caller's helpers are followed; a library function writes in place only under its
    in-place name or ``inplace=True``, which the call itself shows."""
    function = _function(target)
    if function is None:
        return False
    filename = function.__code__.co_filename
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return not any(filename.startswith(p + "/lib") for p in prefixes) and "site-packages" not in filename


def _attribute(obj: Any, name: str) -> Any:
    """``obj.name`` read without running anything (no property, no ``__getattr__``), or None."""
    if obj is None:
        return None
    try:
        value = inspect.getattr_static(obj, name)
    except AttributeError:
        return None
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents if cell is not None else None
    except ValueError:  # an empty cell
        return None


def _pop(stack: list[_Value], depth: int = 1) -> _Value:
    """Remove and return the value ``depth`` from the top (1: the top); unknown where the stack is shorter
    (a path the linear reading does not follow exactly)."""
    if len(stack) < depth:
        stack.clear()
        return _UNKNOWN
    return stack.pop(-depth)
