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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

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
    """Whether ``function`` writes in place into a value reached from the parameters named ``arguments``.

    Parameters
    ----------
    function : types.FunctionType
        The code read (never run).
    arguments : set of str
        The parameters whose values are followed.
    depth : int
        How many more levels of helpers are followed.
    state : _Pass
        The state of the whole reading; what cannot be followed goes to ``state.unresolved``.
    objects : dict
        The known values of other parameters (a method's ``self``), to resolve the helpers it calls.

    Returns
    -------
    bool
        It writes into one of them (a code already read with the same arguments is not read again: False).
    """
    code = function.__code__
    if (code, frozenset(arguments)) in state.seen or not arguments:
        return False
    state.seen.add((code, frozenset(arguments)))
    return _Interpreter(function, arguments, depth, state, objects).run()


_Handler = Callable[["_Interpreter", dis.Instruction], "bool | None"]


class _Interpreter:
    """The symbolic reading of one function's code, an instruction at a time.

    Each instruction goes to its handler in :attr:`HANDLERS` (instructions handled alike share one), any other
    to :meth:`other`, by its stack effect. A handler returns True where the instruction writes into an argument.

    Attributes
    ----------
    function : types.FunctionType
        The function read.
    depth : int
        How many more levels of helpers are followed.
    state : _Pass
        The state of the whole reading.
    objects : dict
        The known values of parameters other than the arguments (a method's ``self``).
    cells : dict
        The function's closure cells, by name.
    rooted : set of str
        The locals holding a value reached from an argument.
    stack : list of _Value
        The symbolic value stack.
    at_target : dict
        The stack a jump leaves at its target, by the target's offset.
    kw_names : tuple of str
        The keywords' names of the next call (``KW_NAMES``, 3.11 and 3.12).
    """

    def __init__(self, function: types.FunctionType, arguments: set[str], depth: int, state: _Pass,
                 objects: dict[str, Any]) -> None:
        self.function = function
        self.depth = depth
        self.state = state
        self.objects = objects
        self.cells = dict(zip(function.__code__.co_freevars, function.__closure__ or ()))
        self.rooted = set(arguments)
        self.stack: list[_Value] = []
        self.at_target: dict[int, list[_Value]] = {}
        self.kw_names: tuple[str, ...] = ()

    def run(self) -> bool:
        """Read the code's instructions in order.

        Returns
        -------
        bool
            One of them writes into an argument.
        """
        previous = ""
        for ins in dis.get_instructions(self.function.__code__):
            if previous in _TERMINAL or ins.is_jump_target and ins.offset in self.at_target and not self.stack:
                self.stack = list(self.at_target.get(ins.offset, self.stack))
            previous = ins.opname
            if _Interpreter.HANDLERS.get(ins.opname, _Interpreter.other)(self, ins):
                return True
            if ins.opcode in dis.hasjrel + dis.hasjabs and isinstance(ins.argval, int):
                self.at_target.setdefault(ins.argval, list(self.stack))
        return False

    def load(self, name: str) -> None:
        """Push the local ``name``."""
        self.stack.append(_Value(rooted=name in self.rooted, obj=self.objects.get(name)))

    def store(self, name: str) -> None:
        """Pop the top into the local ``name`` (rooted where the value is)."""
        (self.rooted.add if _pop(self.stack).rooted else self.rooted.discard)(name)

    def load_fast(self, ins: dis.Instruction) -> None:
        """``LOAD_FAST`` and its checking and clearing forms: a local."""
        self.load(ins.argval)

    def load_fast_load_fast(self, ins: dis.Instruction) -> None:
        """3.13: two locals, the first pushed first."""
        self.load(ins.argval[0])
        self.load(ins.argval[1])

    def store_fast(self, ins: dis.Instruction) -> None:
        """``STORE_FAST``, ``STORE_DEREF``: the top into a local."""
        self.store(ins.argval)

    def store_fast_store_fast(self, ins: dis.Instruction) -> None:
        """3.13: the top into the first name, the next into the second."""
        self.store(ins.argval[0])
        self.store(ins.argval[1])

    def store_fast_load_fast(self, ins: dis.Instruction) -> None:
        """3.13: the top into the first name, then the second pushed."""
        self.store(ins.argval[0])
        self.load(ins.argval[1])

    def load_const(self, ins: dis.Instruction) -> None:
        """A constant, known."""
        self.stack.append(_Value(obj=ins.argval))

    def load_global(self, ins: dis.Instruction) -> None:
        """``LOAD_GLOBAL``, ``LOAD_NAME``: a global or builtin, known; ``LOAD_GLOBAL``'s low bit pushes a call's NULL
        first."""
        name = ins.argval
        if ins.opname == "LOAD_GLOBAL" and ins.arg is not None and ins.arg & 1:
            self.stack.append(_Value(null=True))
        builtin = getattr(builtins, str(name), None)
        self.stack.append(_Value(obj=self.function.__globals__.get(name, builtin), name=str(name)))

    def load_deref(self, ins: dis.Instruction) -> None:
        """``LOAD_DEREF``, ``LOAD_CLOSURE``: a closure variable, known from its cell."""
        name = ins.argval
        self.stack.append(_Value(rooted=name in self.rooted, obj=_cell(self.cells.get(name)), name=str(name)))

    def load_attr(self, ins: dis.Instruction) -> bool:
        """``LOAD_ATTR``, ``LOAD_METHOD``: an attribute, or a method with its object (3.12 and later flag a method
        in ``LOAD_ATTR``'s low bit); an argument's in-place method is a write."""
        name = str(ins.argval)
        base = _pop(self.stack)
        method = ins.opname == "LOAD_METHOD" or sys.version_info >= (3, 12) and ins.arg is not None and ins.arg & 1
        if _in_place_name(name) and base.rooted and method:
            return True
        attribute = _Value(rooted=base.rooted, obj=_attribute(base.obj, name), name=name, on_argument=base.rooted)
        if method and isinstance(base.obj, (types.ModuleType, type)):  # a module's function: called plainly
            self.stack += [_Value(null=True), attribute]
        else:
            self.stack += [attribute, base] if method else [attribute]
        return False

    def store_into(self, ins: dis.Instruction) -> bool:
        """``STORE_ATTR``, ``DELETE_ATTR``, ``STORE_SUBSCR``, ``DELETE_SUBSCR``: a write into an argument."""
        # ``out.data = ...``, ``out[0] = 1``, ``del module.weight``: an item's key on top, then the object
        # written into, then the value stored
        if ins.opname.endswith("SUBSCR"):
            _pop(self.stack)
        if _pop(self.stack).rooted:
            return True
        if ins.opname.startswith("STORE"):
            _pop(self.stack)
        return False

    def binary_subscr(self, ins: dis.Instruction) -> None:
        """An item: rooted where its container is."""
        _pop(self.stack)
        self.stack.append(_Value(rooted=_pop(self.stack).rooted))

    def binary_op(self, ins: dis.Instruction) -> bool:
        """A binary operator; an augmented assignment to an argument is a write."""
        _pop(self.stack)
        left = _pop(self.stack)
        if ins.argrepr.endswith("=") and ins.argrepr not in ("==", "!=", "<=", ">=") and left.rooted:
            return True  # ``out *= 2``: a tensor's augmented assignment is in place
        self.stack.append(_UNKNOWN)
        return False

    def derive(self, ins: dis.Instruction) -> None:
        """``GET_ITER``, ``UNARY_NEGATIVE``, ``UNARY_POSITIVE``: a value rooted where the top was."""
        self.stack.append(_Value(rooted=_pop(self.stack).rooted))

    def for_iter(self, ins: dis.Instruction) -> None:
        """The next item of the iterator on top, rooted where it is."""
        self.stack.append(_Value(rooted=self.stack[-1].rooted if self.stack else False))

    def unpack(self, ins: dis.Instruction) -> None:
        """``UNPACK_SEQUENCE``, ``UNPACK_EX``: the items, rooted where the sequence is."""
        value = _pop(self.stack)
        arg = ins.arg or 0
        count = arg if ins.opname == "UNPACK_SEQUENCE" else (arg & 0xFF) + (arg >> 8) + 1
        self.stack += [_Value(rooted=value.rooted)] * count

    def build(self, ins: dis.Instruction) -> None:
        """``BUILD_TUPLE``, ``BUILD_LIST``: rooted where one of the items is."""
        items = [_pop(self.stack) for _ in range(ins.arg or 0)]
        self.stack.append(_Value(rooted=any(v.rooted for v in items)))

    def copy(self, ins: dis.Instruction) -> None:
        """The value ``arg`` from the top, pushed again."""
        self.stack.append(self.stack[-(ins.arg or 1)] if len(self.stack) >= (ins.arg or 1) else _UNKNOWN)

    def swap(self, ins: dis.Instruction) -> None:
        """The top exchanged with the value ``arg`` from the top."""
        k = ins.arg or 1
        if len(self.stack) >= k:
            self.stack[-1], self.stack[-k] = self.stack[-k], self.stack[-1]

    def make_function(self, ins: dis.Instruction) -> None:
        """A function made from a code object: known where it needs no closure."""
        # 3.11's comprehensions are such functions, called at once with the iterator
        made = _pop(self.stack).obj
        for _ in range(bin((ins.arg or 0) & 0xF).count("1") if sys.version_info < (3, 13) else 0):
            _pop(self.stack)  # defaults, keyword defaults, annotations, closure (3.13 sets them one by one)
        plain = isinstance(made, types.CodeType) and not made.co_freevars
        self.stack.append(_Value(obj=types.FunctionType(made, self.function.__globals__) if plain else None,
                                 name=made.co_name if isinstance(made, types.CodeType) else ""))

    def push_null(self, ins: dis.Instruction) -> None:
        """The NULL beside a plain call's callable."""
        self.stack.append(_Value(null=True))

    def keywords(self, ins: dis.Instruction) -> None:
        """``KW_NAMES`` (3.11, 3.12): the keywords of the next ``CALL``."""
        self.kw_names = tuple(self.function.__code__.co_consts[ins.arg]) if ins.arg is not None else ()

    def nothing(self, ins: dis.Instruction) -> None:
        """``PRECALL`` (3.11): nothing to read; its ``CALL`` follows."""

    def call(self, ins: dis.Instruction) -> bool:
        """``CALL``, ``CALL_KW``: a call that may write into the arguments it is given."""
        if ins.opname == "CALL_KW":  # 3.13: the keywords' names on top of the arguments
            self.kw_names = tuple(_pop(self.stack).obj or ())
        count, named = ins.arg or 0, len(self.kw_names)
        args = [_pop(self.stack) for _ in range(count)][::-1]
        callee, receiver = _callee(_pop(self.stack), _pop(self.stack))
        positional = ([receiver] if receiver is not None else []) + args[:count - named]
        keywords = dict(zip(self.kw_names, args[count - named:]))
        self.kw_names = ()
        if _call_writes(self.function, callee, positional, keywords, self.depth, self.state,
                        method=receiver is not None):
            return True
        # an argument's method may return a view of it (``out.view(-1)``, ``out.detach()``): written
        # through, it writes the argument
        self.stack.append(_Value(rooted=callee.on_argument and callee.name not in COPIES))
        return False

    def call_function_ex(self, ins: dis.Instruction) -> bool:
        """``f(*args)``, ``f(*args, **kwargs)``: which parameter gets what is not read."""
        spread = [_pop(self.stack) for _ in range(1 + ((ins.arg or 0) & 1))]
        callee, receiver = _callee(_pop(self.stack), _pop(self.stack))
        if any(v.rooted for v in spread) or receiver is not None and receiver.rooted:
            if _in_place_name(callee.name) and (callee.on_argument or receiver is None):
                return True
            if callee.obj is None or _is_user_code(callee.obj) or len(spread) > 1:
                self.state.cannot(self.function, f"passes an argument through *args / **kwargs to {_named(callee)}, "
                                                 "whose use of it is not read")
        self.stack.append(_UNKNOWN)
        return False

    def other(self, ins: dis.Instruction) -> None:
        """Any other instruction, by its stack effect: what it pushes is rooted where what it pops is; an
        instruction whose effect is not known is said to be unread where an argument is on the stack."""
        try:
            effect = dis.stack_effect(ins.opcode, ins.arg, jump=False) if ins.opcode >= dis.HAVE_ARGUMENT \
                else dis.stack_effect(ins.opcode)
        except ValueError:
            if self.stack and any(v.rooted for v in self.stack):
                self.state.cannot(self.function, f"instruction {ins.opname} is not read, with an argument on the stack")
            effect = 0
        popped = [_pop(self.stack) for _ in range(max(0, -effect))]
        self.stack += [_Value(rooted=any(v.rooted for v in popped))] * max(0, effect)

    HANDLERS: ClassVar[dict[str, _Handler]] = {
        "LOAD_FAST": load_fast, "LOAD_FAST_CHECK": load_fast, "LOAD_FAST_AND_CLEAR": load_fast,
        "LOAD_FAST_LOAD_FAST": load_fast_load_fast,
        "STORE_FAST": store_fast, "STORE_DEREF": store_fast,
        "STORE_FAST_STORE_FAST": store_fast_store_fast, "STORE_FAST_LOAD_FAST": store_fast_load_fast,
        "LOAD_CONST": load_const, "LOAD_GLOBAL": load_global, "LOAD_NAME": load_global,
        "LOAD_DEREF": load_deref, "LOAD_CLOSURE": load_deref,
        "LOAD_ATTR": load_attr, "LOAD_METHOD": load_attr,
        "STORE_ATTR": store_into, "DELETE_ATTR": store_into, "STORE_SUBSCR": store_into, "DELETE_SUBSCR": store_into,
        "BINARY_SUBSCR": binary_subscr, "BINARY_OP": binary_op,
        "GET_ITER": derive, "UNARY_NEGATIVE": derive, "UNARY_POSITIVE": derive,
        "FOR_ITER": for_iter, "UNPACK_SEQUENCE": unpack, "UNPACK_EX": unpack,
        "BUILD_TUPLE": build, "BUILD_LIST": build, "COPY": copy, "SWAP": swap,
        "MAKE_FUNCTION": make_function, "PUSH_NULL": push_null, "KW_NAMES": keywords, "PRECALL": nothing,
        "CALL": call, "CALL_KW": call, "CALL_FUNCTION_EX": call_function_ex,
    }
    """The handler of each instruction read otherwise than by its stack effect."""


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
