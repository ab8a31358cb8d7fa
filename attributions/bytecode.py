"""What a hook's code does with its arguments, read from its bytecode (the hook is never run).

A symbolic pass over the code's value stack follows each value back to the hook's arguments: through
attributes, items, local names, loops, comprehensions and unpacking, into the Python helpers the hook calls with
them, and into in-place calls of any kind (``out.mul_(2)``, ``torch.nn.init.zeros_(out)``,
``F.relu(out, inplace=True)``, ``out *= 2``, ``out[0] = 1``, ``out.data = ...``). A library's function is taken
to write in place only under torch's in-place naming (a trailing underscore) or with ``inplace=True``, which the
call itself shows; the caller's own helpers are followed into.

What the pass cannot resolve is said, not taken as "not writing": an argument handed to a callable it cannot name
(a local variable, a value returned by another call), a value reached from an argument called as a function
(``getattr(out, name)(2)`` with a name it cannot see, a bound method kept in a dict, ``functools.partial(...)``
of an argument), an in-place write into a value a library call returned from an argument (which may be the
argument, a view of it or a new tensor: ``torch.flatten(out).zero_()``), an argument handed to a library call
beside a callable that may be called on it (``map(torch.Tensor.zero_, args)``), passed on through ``*args`` /
``**kwargs`` to the caller's own code, followed through helpers nested deeper than :data:`HELPER_DEPTH`, or
consumed by an instruction whose stack effect it does not know. :func:`read_hook` returns those reasons beside
the finding. What it can name it reads: ``getattr`` under a name it knows (a constant, a global), a function the
hook defines (its closure's arguments followed into it), ``setattr``, the ``operator`` module's in-place functions
and an ``out=`` keyword.

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
import operator
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

HELPER_DEPTH = 4  # how deep helpers called with an argument are followed
# calls whose value is None: a lambda returning one of them (``lambda *a: acts.append(a)``,
# ``lambda m, i, o: store.__setitem__(name, o)``) observes, unless it calls them on its own arguments
OBSERVING_CALLS = {"append", "extend", "add", "update", "write", "print", "put", "put_nowait", "info", "debug",
                   "warning", "set", "__setitem__", "setdefault"}
COPIES = {"clone", "copy", "deepcopy", "tolist", "item"}  # an argument's methods that return no view of it
# builtins whose result holds none of its arguments (a size, a string, a flag, a new number)
_FRESH = (len, str, repr, format, int, float, complex, bool, hash, id, type, isinstance, issubclass, callable, hasattr,
          print, abs, round, sum, any, all, divmod, pow, ascii)
# builtins whose result holds its arguments' own items (the same objects): reached from an argument as surely as they
_ITEMS = (list, tuple, iter, next, reversed, sorted, zip, enumerate, min, max, vars, dict, set, frozenset, filter)
# functions that write into their first argument under a name that is not torch's in-place naming
_WRITERS = (setattr, delattr, operator.setitem, operator.delitem, operator.iadd, operator.isub, operator.imul,
            operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow, operator.ilshift, operator.irshift,
            operator.iand, operator.ior, operator.ixor, operator.imatmul, operator.iconcat)
_IN_PLACE_DUNDERS = {"__setitem__", "__delitem__", "__setattr__", "__delattr__", *(f"__i{op}__" for op in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and", "or", "xor", "matmul"))}
_COMPREHENSIONS = {"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"}  # 3.11 makes each a function it calls
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
    spread = bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount + spread]  # ``*args`` holds them too
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
    # reached from an argument only through a call the reading does not follow (``source``): it may be the argument,
    # a view of it or a callable bound to it, or a new value; a write into it is unresolved, not a finding
    unsure: bool = False
    source: str = ""
    free: frozenset[str] = frozenset()  # a function made in the hook: its closure's variables reached from an argument


_UNKNOWN = _Value()


def _joined(values: list[_Value]) -> _Value:
    """A value computed from ``values``: rooted where one of them is, unsure where every rooted one is."""
    rooted = [v for v in values if v.rooted]
    unsure = bool(rooted) and all(v.unsure for v in rooted)
    return _Value(rooted=bool(rooted), unsure=unsure, source=rooted[0].source if unsure else "")


def _like(value: _Value) -> _Value:
    """A part of ``value`` (an item, an iterator's next value): reached from an argument where it is, as surely."""
    return _Value(rooted=value.rooted, unsure=value.unsure, source=value.source)


def _is_one_of(obj: Any, group: tuple[Any, ...]) -> bool:
    return any(obj is member for member in group)  # by identity: an object's __eq__ is never run


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
    values : dict
        What each local assigned in the code holds (a function defined in the hook, a bound method), by name.
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
        self.values: dict[str, _Value] = {}
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
        """Push the local ``name``: what was stored in it, else a parameter."""
        kept = self.values.get(name)
        self.stack.append(replace(kept, null=False) if kept is not None else
                          _Value(rooted=name in self.rooted, obj=self.objects.get(name)))

    def store(self, name: str) -> None:
        """Pop the top into the local ``name`` (rooted where the value is)."""
        value = _pop(self.stack)
        self.values[name] = value
        (self.rooted.add if value.rooted else self.rooted.discard)(name)

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
        """``LOAD_DEREF``, ``LOAD_CLOSURE``: a closure variable, known from its cell (or what the code stored in it)."""
        name = ins.argval
        kept = self.values.get(name)
        self.stack.append(replace(kept, null=False) if kept is not None else
                          _Value(rooted=name in self.rooted, obj=_cell(self.cells.get(name)), name=str(name)))

    def load_attr(self, ins: dis.Instruction) -> bool:
        """``LOAD_ATTR``, ``LOAD_METHOD``: an attribute, or a method with its object (3.12 and later flag a method
        in ``LOAD_ATTR``'s low bit); an argument's in-place method is a write."""
        name = str(ins.argval)
        base = _pop(self.stack)
        method = ins.opname == "LOAD_METHOD" or sys.version_info >= (3, 12) and ins.arg is not None and ins.arg & 1
        if _in_place_name(name) and base.rooted and method and _written(self.state, self.function, base, f"{name}()"):
            return True
        attribute = _Value(rooted=base.rooted, obj=_attribute(base.obj, name), name=name, on_argument=base.rooted,
                           unsure=base.unsure, source=base.source)
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
        target = _pop(self.stack)
        if target.rooted and _written(self.state, self.function, target, ins.opname):
            return True
        if ins.opname.startswith("STORE"):
            _pop(self.stack)
        return False

    def binary_subscr(self, ins: dis.Instruction) -> None:
        """An item: rooted where its container is."""
        _pop(self.stack)
        self.stack.append(_like(_pop(self.stack)))

    def binary_op(self, ins: dis.Instruction) -> bool:
        """A binary operator; an augmented assignment to an argument is a write."""
        _pop(self.stack)
        left = _pop(self.stack)
        if ins.argrepr.endswith("=") and ins.argrepr not in ("==", "!=", "<=", ">=") and left.rooted \
                and _written(self.state, self.function, left, f"'{ins.argrepr}'"):
            return True  # ``out *= 2``: a tensor's augmented assignment is in place
        self.stack.append(_UNKNOWN)
        return False

    def derive(self, ins: dis.Instruction) -> None:
        """``GET_ITER``, ``UNARY_NEGATIVE``, ``UNARY_POSITIVE``: a value rooted where the top was."""
        self.stack.append(_like(_pop(self.stack)))

    def for_iter(self, ins: dis.Instruction) -> None:
        """The next item of the iterator on top, rooted where it is."""
        self.stack.append(_like(self.stack[-1]) if self.stack else _UNKNOWN)

    def unpack(self, ins: dis.Instruction) -> None:
        """``UNPACK_SEQUENCE``, ``UNPACK_EX``: the items, rooted where the sequence is."""
        value = _pop(self.stack)
        arg = ins.arg or 0
        count = arg if ins.opname == "UNPACK_SEQUENCE" else (arg & 0xFF) + (arg >> 8) + 1
        self.stack += [_like(value)] * count

    def build(self, ins: dis.Instruction) -> None:
        """``BUILD_TUPLE``, ``BUILD_LIST``, ``BUILD_MAP`` and the like: rooted where one of the items is."""
        n = ins.arg or 0
        count = 2 * n if ins.opname == "BUILD_MAP" else n + 1 if ins.opname == "BUILD_CONST_KEY_MAP" else n
        self.stack.append(_joined([_pop(self.stack) for _ in range(count)]))

    def add_to(self, ins: dis.Instruction) -> None:
        """``LIST_APPEND``, ``MAP_ADD``, ``LIST_EXTEND`` and the like: the top (a key and a value for ``MAP_ADD``)
        put into the container ``arg`` below, which is then rooted where they are."""
        added = [_pop(self.stack) for _ in range(2 if ins.opname == "MAP_ADD" else 1)]
        k = ins.arg or 1
        if len(self.stack) >= k:
            self.stack[-k] = _joined([self.stack[-k], *added])

    def copy(self, ins: dis.Instruction) -> None:
        """The value ``arg`` from the top, pushed again."""
        self.stack.append(self.stack[-(ins.arg or 1)] if len(self.stack) >= (ins.arg or 1) else _UNKNOWN)

    def swap(self, ins: dis.Instruction) -> None:
        """The top exchanged with the value ``arg`` from the top."""
        k = ins.arg or 1
        if len(self.stack) >= k:
            self.stack[-1], self.stack[-k] = self.stack[-k], self.stack[-1]

    def make_function(self, ins: dis.Instruction) -> None:
        """A function made from a code object (a nested ``def``, a lambda, 3.11's comprehensions): known, with the
        variables of its closure that hold a value reached from an argument, which a call of it follows."""
        made = _pop(self.stack).obj
        for _ in range(bin((ins.arg or 0) & 0xF).count("1") if sys.version_info < (3, 13) else 0):
            _pop(self.stack)  # defaults, keyword defaults, annotations, closure (3.13 sets them one by one)
        if not isinstance(made, types.CodeType):
            self.stack.append(_UNKNOWN)
            return
        cells = tuple(types.CellType() for _ in made.co_freevars)  # empty: the reading never runs the code
        function = types.FunctionType(made, self.function.__globals__, made.co_name, None, cells or None)
        free = frozenset(n for n in made.co_freevars if n in self.rooted)
        self.stack.append(_Value(obj=function, name=made.co_name, free=free))

    def set_function_attribute(self, ins: dis.Instruction) -> None:
        """3.13: a default or the closure set on the function made below it; the function stays."""
        function = _pop(self.stack)
        _pop(self.stack)
        self.stack.append(function)

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
        if callee.obj is getattr and receiver is None and positional and positional[0].rooted:
            self.stack.append(_got(positional))
            return False
        if _call_writes(self.function, callee, positional, keywords, self.depth, self.state,
                        method=receiver is not None):
            return True
        self.stack.append(_returned(callee, positional, keywords))
        return False

    def call_function_ex(self, ins: dis.Instruction) -> bool:
        """``f(*args)``, ``f(*args, **kwargs)``: which parameter gets what is not read."""
        spread = [_pop(self.stack) for _ in range(1 + ((ins.arg or 0) & 1))]
        callee, receiver = _callee(_pop(self.stack), _pop(self.stack))
        if receiver is None and _calls_reached(self.state, self.function, callee):
            return True
        handed = [v for v in [*spread, receiver] if v is not None and v.rooted]
        if handed or callee.free:
            if _in_place_name(callee.name) and (callee.on_argument or receiver is None) \
                    and _written(self.state, self.function, handed[0] if handed else callee, f"{callee.name}(*args)"):
                return True
            if callee.obj is None or _is_user_code(callee.obj) or len(spread) > 1:
                self.state.cannot(self.function, f"passes an argument through *args / **kwargs to {_named(callee)}, "
                                                 "whose use of it is not read")
        self.stack.append(_Value(rooted=True, unsure=True, source=_named(callee)) if handed else _UNKNOWN)
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
        self.stack += [_joined(popped)] * max(0, effect)

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
        "BUILD_TUPLE": build, "BUILD_LIST": build, "BUILD_SET": build, "BUILD_MAP": build, "BUILD_CONST_KEY_MAP": build,
        "BUILD_STRING": build, "BUILD_SLICE": build,
        **dict.fromkeys(("LIST_APPEND", "SET_ADD", "MAP_ADD", "LIST_EXTEND", "SET_UPDATE", "DICT_UPDATE", "DICT_MERGE"),
                        add_to),
        "COPY": copy, "SWAP": swap,
        "MAKE_FUNCTION": make_function, "SET_FUNCTION_ATTRIBUTE": set_function_attribute, "PUSH_NULL": push_null,
        "KW_NAMES": keywords, "PRECALL": nothing,
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
    """Whether a call writes into a value reached from an argument: a call of such a value that is an argument's
    in-place method, an in-place function (``zeros_(out)``, ``setattr(out, ...)``, ``inplace=True``, ``out=``), or
    a Python helper that writes into the parameter it receives the value as. ``method``: the first of
    ``positional`` is the object a method was looked up on (whose in-place methods are found where they are looked
    up). What it cannot name goes to ``state``: a called value reached from an argument, a callable handed one."""
    if not method and _calls_reached(state, caller, callee):
        return True
    handed = [v for v in [*positional, *keywords.values()] if v.rooted]
    if not handed and not callee.free:
        return False
    first = positional[0] if positional and positional[0].rooted else None
    if not method and first is not None and (_in_place_name(callee.name) or _is_one_of(callee.obj, _WRITERS)):
        return _written(state, caller, first, f"{callee.name or 'an in-place function'}(...)")
    if keywords.get("inplace", _UNKNOWN).obj is True and handed:
        return _written(state, caller, first or handed[0], f"{callee.name or 'a function'}(..., inplace=True)")
    if keywords.get("out", _UNKNOWN).rooted:
        return _written(state, caller, keywords["out"], f"{callee.name or 'a function'}(..., out=...)")
    target = callee.obj
    if target is None or not _is_user_code(target):
        if target is None and not callee.on_argument:  # an argument's own method is named by torch's conventions
            state.cannot(caller, f"hands an argument to {_named(callee)}, a callable the reading cannot resolve")
        elif handed:
            _handed_callables(caller, callee, [*positional, *keywords.values()], depth, state)
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
    named |= {k for k, v in keywords.items() if v.rooted} | callee.free
    if code.co_flags & inspect.CO_VARARGS and any(v.rooted for v in positional[len(params):]):
        named.add(code.co_varnames[code.co_argcount + code.co_kwonlyargcount])
    writes = _writes(function, named, depth - 1, state, objects)
    if writes and handed and not callee.free and all(v.unsure for v in handed):
        state.cannot(caller, f"hands {function.__qualname__}, which writes into it in place, a value {handed[0].source} "
                             "returned from an argument: whether that value is the argument or a view of it is not read")
        return False
    return writes


def _calls_reached(state: _Pass, caller: types.FunctionType, callee: _Value) -> bool:
    """For a plain call of ``callee``: whether it is an argument's in-place method (``getattr(out, "mul_")(2)``,
    ``f = out.mul_; f(2)``), a write; a called value reached from an argument that the reading cannot name
    (``getattr(out, name)`` under a name it cannot see, a bound method kept in a dict, a ``functools.partial`` of
    an argument) is said to ``state``."""
    if not callee.rooted:
        return False
    if callee.on_argument and callee.name:
        return _in_place_name(callee.name) and _written(state, caller, callee, f"its method {callee.name}()")
    through = f" through {callee.source}" if callee.source else ""
    state.cannot(caller, f"calls a value reached from an argument{through} as a function, whose target the reading "
                         "cannot name")
    return False


def _written(state: _Pass, caller: types.FunctionType, value: _Value, how: str) -> bool:
    """An in-place write (``how``) into ``value``, reached from an argument: a finding where it surely is, else
    (a value a library call returned from one) said to ``state`` and not a finding."""
    if not value.unsure:
        return True
    state.cannot(caller, f"writes in place ({how}) into a value that {value.source} returned from an argument: "
                         "whether that value is the argument or a view of it is not read")
    return False


def _handed_callables(caller: types.FunctionType, callee: _Value, handed: list[_Value], depth: int, state: _Pass) -> None:
    """A library call (``map``, ``functools.partial``, a module's ``apply``) handed a value reached from an
    argument beside a callable may call the callable on it: said to ``state`` where that callable is an in-place
    function or the caller's code that writes into its arguments in place."""
    for value in handed:
        function = python_function(value.obj) if value.obj is not None else None
        if _in_place_name(value.name) and (value.rooted and value.on_argument or callable(value.obj)):
            state.cannot(caller, f"hands {_named(callee)} an argument and the in-place {value.name!r}, which it may "
                                 "call on it: what it calls is not read")
        elif function is not None and _is_user_code(value.obj) and depth > 0:
            code = function.__code__
            every = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]) | value.free
            if _writes(function, every, depth - 1, _Pass(), {}):  # its own reading: only whether it writes
                state.cannot(caller, f"hands {_named(callee)} an argument and {function.__qualname__}, which writes "
                                     "into its arguments in place and which it may call on it: what it calls is not read")


def _got(positional: list[_Value]) -> _Value:
    """``getattr(value, name[, default])`` of a value reached from an argument: its attribute, named where the name
    is a string the reading knows (a constant, a global), else a value whose call it cannot name."""
    base = positional[0]
    name = positional[1].obj if len(positional) > 1 and isinstance(positional[1].obj, str) else ""
    return _Value(rooted=True, name=name, on_argument=bool(name), unsure=base.unsure,
                  source=base.source if name or base.unsure else "getattr under a name the reading cannot see")


def _returned(callee: _Value, positional: list[_Value], keywords: dict[str, _Value]) -> _Value:
    """What a call returns, as far as the reading can tell whether it is reached from an argument: an argument's
    method may return a view of it (``out.view(-1)``, ``out.detach()``; written through, it writes the argument);
    some builtins return the argument's own items (``list(args)``) or nothing of it (``len(out)``); any other call
    handed one (a library function, a helper) may return it, a view of it, a callable bound to it or a new value."""
    if callee.on_argument:
        return _Value(rooted=callee.name not in COPIES, unsure=callee.unsure, source=callee.source)
    handed = [v for v in [*positional, *keywords.values()] if v.rooted]
    if not handed and not callee.free or _is_one_of(callee.obj, _FRESH) or callee.name in COPIES \
            or callee.name.endswith("_like"):
        return _UNKNOWN
    if _is_one_of(callee.obj, _ITEMS):
        return _joined(handed)
    if callee.name in _COMPREHENSIONS:  # 3.11: the items it was read to collect, as surely as the reading of it
        return _Value(rooted=True)
    return _Value(rooted=True, unsure=True, source=_named(callee))


def _named(callee: _Value) -> str:
    return repr(callee.name) if callee.name else "a value computed in the hook"


def _in_place_name(name: str) -> bool:
    """torch's naming of in-place ops and methods (``mul_``, ``zeros_``), item and attribute assignment and the
    in-place operators' methods (``__imul__``)."""
    return name in _IN_PLACE_DUNDERS or name.endswith("_") and not name.startswith("_")


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
