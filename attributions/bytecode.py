"""What a hook's code does with its arguments, read from its bytecode (the hook is never run).

A symbolic pass over the code's value stack follows each value back to the hook's arguments: through
attributes, items, local names, loops, comprehensions and unpacking, into the Python helpers the hook calls with
them, and into in-place calls of any kind (``out.mul_(2)``, ``torch.nn.init.zeros_(out)``,
``F.relu(out, inplace=True)``, ``out *= 2``, ``out[0] = 1``, ``out.data = ...``). A library's function is taken
to write in place only under torch's in-place naming (a trailing underscore) or with ``inplace=True``, which the
call itself shows; the caller's own helpers are followed into.

What the pass cannot resolve is said, not taken as "not writing": an argument handed to a callable it cannot name
(a local variable, a value returned by another call), passed on through ``*args`` / ``**kwargs`` to the caller's
own code, followed through helpers nested deeper than :data:`HELPER_DEPTH`, or consumed by an instruction whose
stack effect it does not know. :func:`read_hook` returns those reasons beside the finding.

The reading knows the instruction forms of CPython 3.11, 3.12 and 3.13 (``PRECALL`` and ``KW_NAMES`` before
``CALL``; ``LOAD_ATTR``'s method flag; ``CALL_KW``, ``LOAD_FAST_LOAD_FAST`` and the other paired local
instructions), the versions the package declares; the tests read the same hooks on each of those interpreters.
This module imports nothing but the standard library, so that they can.
"""
from __future__ import annotations

import builtins
import dis
import functools
import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any

HELPER_DEPTH = 4  # how deep helpers called with an argument are followed
# calls whose value is None: a lambda returning one of them (``lambda *a: acts.append(a)``,
# ``lambda m, i, o: store.__setitem__(name, o)``) observes, unless it calls them on its own arguments
OBSERVING_CALLS = {"append", "extend", "add", "update", "write", "print", "put", "put_nowait", "info", "debug",
                   "warning", "set", "__setitem__", "setdefault"}
COPIES = {"clone", "copy", "deepcopy", "tolist", "item"}  # an argument's methods that return no view of it
_TERMINAL = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD", "JUMP_BACKWARD",
             "JUMP_ABSOLUTE", "JUMP_BACKWARD_NO_INTERRUPT"}
_CALLS = ("CALL", "CALL_KW")


@dataclass(frozen=True)
class Reading:
    """What the code of a hook was read to do with its arguments.

    Attributes
    ----------
    writes : bool
        It writes into one of them in place (or a helper it hands one to does).
    unresolved : tuple of str
        What the reading could not follow, each with where and why; empty when it followed everything.
    """

    writes: bool
    unresolved: tuple[str, ...] = ()


@dataclass
class _Pass:
    """The state shared by the reading of a hook and of the helpers it calls."""

    seen: set[Any] = field(default_factory=set)
    unresolved: list[str] = field(default_factory=list)

    def cannot(self, function: types.FunctionType, reason: str) -> None:
        where = f"{function.__qualname__} ({function.__code__.co_filename}:{function.__code__.co_firstlineno})"
        line = f"{where}: {reason}"
        if line not in self.unresolved:
            self.unresolved.append(line)


def read_hook(hook: Any) -> Reading:
    """Whether ``hook`` (a function, a method, a partial, a callable object) writes into its arguments in place,
    and what of its code could not be followed. A bound method's ``self`` is not one of its arguments: a hook
    object may keep state on itself. A hook without Python code is read as unresolved."""
    function = python_function(hook)
    if function is None:
        return Reading(False, (f"{type(hook).__name__}: has no Python code to read",))
    code = function.__code__
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    state = _Pass()
    hook = _unwrap(hook)
    if isinstance(hook, types.FunctionType):
        writes = _writes(function, set(names), HELPER_DEPTH, state, {})
    else:
        receiver = getattr(hook, "__self__", hook)  # a bound method's object, or the callable object itself
        writes = _writes(function, set(names[1:]), HELPER_DEPTH, state, {names[0]: receiver} if names else {})
    return Reading(writes, () if writes else tuple(state.unresolved))


def returns_only_none(hook: Any) -> bool:
    """Whether every ``return`` of the hook's code returns None (an observer); False when that cannot
    be read from its code (a callable object without Python code, a lambda returning a value)."""
    function = python_function(hook)
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
    return (len(returns) == 1 and returns[0] > 0 and instructions[returns[0] - 1].opname in _CALLS
            and bool(loads) and loads[0].opname in ("LOAD_METHOD", "LOAD_ATTR", "LOAD_GLOBAL")
            and (loads[0].argval in OBSERVING_CALLS if loads[0].opname != "LOAD_GLOBAL" else loads[0].argval == "print"
                 or len(loads) > 1 and loads[1].argval in OBSERVING_CALLS))


def _unwrap(hook: Any) -> Any:
    while isinstance(hook, functools.partial):
        hook = hook.func
    return hook


def python_function(hook: Any) -> types.FunctionType | None:
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
    where it is a known global, closure variable or attribute of one, the attribute name it was loaded as, and
    whether it was looked up on an argument (a method of the argument's own, named by torch's conventions)."""

    rooted: bool = False
    obj: Any = None
    name: str = ""
    null: bool = False  # the NULL that a call expects beside a plain callable
    on_argument: bool = False


_UNKNOWN = _Value()


def _writes(function: types.FunctionType, arguments: set[str], depth: int, state: _Pass,
            objects: dict[str, Any]) -> bool:
    """Whether ``function`` writes in place into a value reached from the parameters named ``arguments``;
    ``objects``: the known values of other parameters (a method's ``self``), to resolve the helpers it calls.
    What it cannot follow goes to ``state.unresolved``."""
    code = function.__code__
    if (code, frozenset(arguments)) in state.seen or not arguments:
        return False
    state.seen.add((code, frozenset(arguments)))
    cells = dict(zip(code.co_freevars, function.__closure__ or ()))
    rooted = set(arguments)  # locals holding a value reached from an argument
    stack: list[_Value] = []
    at_target: dict[int, list[_Value]] = {}  # the stack a jump leaves at its target
    kw_names: tuple[str, ...] = ()
    previous = ""

    def load(name: str) -> None:
        stack.append(_Value(rooted=name in rooted, obj=objects.get(name)))

    def store(name: str) -> None:
        (rooted.add if _pop(stack).rooted else rooted.discard)(name)

    for ins in dis.get_instructions(code):
        if previous in _TERMINAL or ins.is_jump_target and ins.offset in at_target and not stack:
            stack = list(at_target.get(ins.offset, stack))
        op, name = ins.opname, ins.argval
        previous = op
        if op in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR"):
            load(name)
        elif op == "LOAD_FAST_LOAD_FAST":  # 3.13: two locals, the first pushed first
            load(name[0])
            load(name[1])
        elif op == "STORE_FAST":
            store(name)
        elif op == "STORE_FAST_STORE_FAST":  # 3.13: the top into the first name, the next into the second
            store(name[0])
            store(name[1])
        elif op == "STORE_FAST_LOAD_FAST":  # 3.13
            store(name[0])
            load(name[1])
        elif op == "LOAD_CONST":
            stack.append(_Value(obj=name))
        elif op in ("LOAD_GLOBAL", "LOAD_NAME"):
            if op == "LOAD_GLOBAL" and ins.arg is not None and ins.arg & 1:
                stack.append(_Value(null=True))
            stack.append(_Value(obj=function.__globals__.get(name, getattr(builtins, str(name), None)), name=str(name)))
        elif op in ("LOAD_DEREF", "LOAD_CLOSURE"):
            stack.append(_Value(rooted=name in rooted, obj=_cell(cells.get(name)), name=str(name)))
        elif op == "STORE_DEREF":
            store(name)
        elif op in ("LOAD_ATTR", "LOAD_METHOD"):
            base = _pop(stack)
            method = op == "LOAD_METHOD" or sys.version_info >= (3, 12) and ins.arg is not None and ins.arg & 1
            if _in_place_name(str(name)) and base.rooted and method:
                return True
            attribute = _Value(rooted=base.rooted, obj=_attribute(base.obj, str(name)), name=str(name),
                               on_argument=base.rooted)
            if method and isinstance(base.obj, (types.ModuleType, type)):  # a module's function: called plainly
                stack += [_Value(null=True), attribute]
            else:
                stack += [attribute, base] if method else [attribute]
        elif op in ("STORE_ATTR", "DELETE_ATTR", "STORE_SUBSCR", "DELETE_SUBSCR"):
            # ``out.data = ...``, ``out[0] = 1``, ``del module.weight``: an item's key on top, then the object
            # written into, then the value stored
            if op.endswith("SUBSCR"):
                _pop(stack)
            if _pop(stack).rooted:
                return True
            if op.startswith("STORE"):
                _pop(stack)
        elif op == "BINARY_SUBSCR":
            _pop(stack)
            stack.append(_Value(rooted=_pop(stack).rooted))
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
        elif op == "MAKE_FUNCTION":  # 3.11's comprehensions are such functions, called at once with the iterator
            made = _pop(stack).obj
            for _ in range(bin((ins.arg or 0) & 0xF).count("1") if sys.version_info < (3, 13) else 0):
                _pop(stack)  # defaults, keyword defaults, annotations, closure (3.13 sets them one by one)
            plain = isinstance(made, types.CodeType) and not made.co_freevars
            stack.append(_Value(obj=types.FunctionType(made, function.__globals__) if plain else None,
                                name=made.co_name if isinstance(made, types.CodeType) else ""))
        elif op == "PUSH_NULL":
            stack.append(_Value(null=True))
        elif op == "KW_NAMES":  # 3.11, 3.12: the keywords of the next CALL
            kw_names = tuple(code.co_consts[ins.arg]) if ins.arg is not None else ()
        elif op == "PRECALL":
            pass
        elif op in _CALLS:
            if op == "CALL_KW":  # 3.13: the keywords' names on top of the arguments
                kw_names = tuple(_pop(stack).obj or ())
            count = ins.arg or 0
            args = [_pop(stack) for _ in range(count)][::-1]
            callee, receiver = _callee(_pop(stack), _pop(stack))
            positional = ([receiver] if receiver is not None else []) + args[:count - len(kw_names)]
            keywords = dict(zip(kw_names, args[count - len(kw_names):]))
            kw_names = ()
            if _call_writes(function, callee, positional, keywords, depth, state, method=receiver is not None):
                return True
            # an argument's method may return a view of it (``out.view(-1)``, ``out.detach()``): written
            # through, it writes the argument
            stack.append(_Value(rooted=callee.on_argument and callee.name not in COPIES))
        elif op == "CALL_FUNCTION_EX":  # f(*args) / f(*args, **kwargs): which parameter gets what is not read
            spread = [_pop(stack) for _ in range(1 + ((ins.arg or 0) & 1))]
            callee, receiver = _callee(_pop(stack), _pop(stack))
            if any(v.rooted for v in spread) or receiver is not None and receiver.rooted:
                if _in_place_name(callee.name) and (callee.on_argument or receiver is None):
                    return True
                if callee.obj is None or _is_user_code(callee.obj) or len(spread) > 1:
                    state.cannot(function, f"passes an argument through *args / **kwargs to {_named(callee)}, "
                                           "whose use of it is not read")
            stack.append(_UNKNOWN)
        else:
            try:
                effect = dis.stack_effect(ins.opcode, ins.arg, jump=False) if ins.opcode >= dis.HAVE_ARGUMENT \
                    else dis.stack_effect(ins.opcode)
            except ValueError:
                if stack and any(v.rooted for v in stack):
                    state.cannot(function, f"instruction {op} is not read, with an argument on the stack")
                effect = 0
            popped = [_pop(stack) for _ in range(max(0, -effect))]
            stack += [_Value(rooted=any(v.rooted for v in popped))] * max(0, effect)
        if ins.opcode in dis.hasjrel + dis.hasjabs and isinstance(ins.argval, int):
            at_target.setdefault(ins.argval, list(stack))
    return False


def _callee(second: _Value, first: _Value) -> tuple[_Value, _Value | None]:
    """The called value and the object it was looked up on (None for a plain call), from the two values below a
    call's arguments: 3.11 and 3.12 put the NULL of a plain call below the callable, 3.13 above it."""
    if first.null:
        return second, None
    if second.null:
        return first, None
    return first, second


def _call_writes(caller: types.FunctionType, callee: _Value, positional: list[_Value], keywords: dict[str, _Value],
                 depth: int, state: _Pass, *, method: bool) -> bool:
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
    if target is None:
        if not callee.on_argument:  # an argument's own method is named by torch's conventions, read above
            state.cannot(caller, f"hands an argument to {_named(callee)}, a callable the reading cannot resolve")
        return False
    if not _is_user_code(target):
        return False
    function = python_function(target)
    if function is None:
        return False
    if depth <= 0:
        state.cannot(caller, f"hands an argument to {function.__qualname__}, deeper than the {HELPER_DEPTH} "
                             "helpers the reading follows")
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
    return _writes(function, named, depth - 1, state, objects)


def _named(callee: _Value) -> str:
    return repr(callee.name) if callee.name else "a value computed in the hook"


def _in_place_name(name: str) -> bool:
    """torch's naming of in-place ops and methods (``mul_``, ``zeros_``) and item assignment."""
    return name == "__setitem__" or name.endswith("_") and not name.startswith("_")


def _is_user_code(target: Any) -> bool:
    """Whether ``target`` is the caller's Python code rather than a library's (torch, numpy, the standard
    library): only the caller's helpers are followed; a library function writes in place only under its
    in-place name or ``inplace=True``, which the call itself shows."""
    function = python_function(target)
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
