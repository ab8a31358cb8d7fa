"""Hooks whose reading is known, for :mod:`attributions.bytecode` on every interpreter the package declares.

Standard library only: run by ``test_bytecode.py`` under CPython 3.11, 3.12 and 3.13 (each compiles these hooks to
its own instruction forms), it prints one JSON line per case: its name, what was expected and what was read.
Tensors are stood for by any object: the reading looks at names and calls, never at types.
"""
import functools
import json
import logging
import operator
import sys
import types

from attributions.bytecode import read_hook

STORE: dict = {}
LOG = logging.getLogger("bytecode-cases")
init = types.ModuleType("init")  # stands for torch.nn.init: a module of in-place functions
functional = types.ModuleType("functional")  # stands for torch.nn.functional: inplace= keywords


def _zeros_(tensor):
    return tensor


def _relu(tensor, inplace=False):
    return tensor


def _mul(tensor, factor, out=None):
    return tensor


def _flatten(tensor):
    return tensor


def _zeros_like(tensor):
    return tensor


class Tensor:  # stands for torch.Tensor: its in-place methods looked up on the class
    def mul_(self, factor):
        return self

    def zero_(self):
        return self


init.zeros_ = _zeros_
functional.relu = _relu
functional.mul = _mul
functional.flatten = _flatten
functional.zeros_like = _zeros_like
METHOD = "mul_"  # a method's name in a global: read as the reading reads globals


def _scale(tensor, factor):
    tensor.mul_(factor)


def _scale_first(values):
    _scale(values[0], 2.0)


def _remember(name, tensor):
    STORE[name] = tensor.detach().clone()


def _deep(tensor, level=0):  # a chain of helpers longer than the reading follows
    return _deeper(tensor)


def _deeper(tensor):
    return _deepest(tensor)


def _deepest(tensor):
    return _bottom(tensor)


def _bottom(tensor):
    return _below(tensor)


def _below(tensor):
    return tensor.sum()


class _Scaler:
    def __call__(self, module, args, out):
        self.calls = getattr(self, "calls", 0) + 1
        self.halve(out)

    def halve(self, tensor):
        tensor.div_(2)


class _Recorder:
    def __init__(self):
        self.kept = []

    def __call__(self, module, args, out):
        self.kept.append(out.detach())


def _closure_writer():
    def hook(module, args, out):
        _scale(out, 3.0)
    return hook


def _with_factor(factor, module, args, out):
    out.mul_(factor)


def method_in_place(module, args, out):
    out.mul_(2)


def function_in_place(module, args, out):
    init.zeros_(out)


def inplace_keyword(module, args, out):
    functional.relu(out, inplace=True)


def augmented(module, args, out):
    out *= 2


def item_assignment(module, args, out):
    out[0] = 1.0


def attribute_assignment(module, args, out):
    out.data = out * 2


def helper(module, args, out):
    _scale(out, 2.0)


def nested_helper(module, args):
    _scale_first(args)


def alias(module, args, out):
    first = out[0]
    first.clamp_(min=0)


def view(module, args, out):
    flat = out.view(-1)
    flat.zero_()


def loop(module, args):
    for tensor in args:
        tensor.zero_()


def comprehension(module, args):
    [tensor.zero_() for tensor in args]


def unpacking(module, args):
    (x,) = args
    x[0] = 1.0


def paired_locals(module, args, out):
    a, b = out, 2.0
    _scale(a, b)


def store(module, args, out):
    STORE["out"] = out.detach()


def rebinding(module, args, out):
    out = out * 2
    STORE["doubled"] = out


def logging_(module, args, out):
    LOG.info("shape %s, norm %s", tuple(out.shape), out.norm().item())


def observer_helper(module, args, out):
    _remember("conv", out)


def copy_then_write(module, args, out):
    copy = out.clone()
    copy.zero_()
    STORE["zeros"] = copy


def getattr_known_name(module, args, out):
    getattr(out, METHOD)(2.0)


def getattr_unknown_name(module, args, out):
    getattr(out, STORE.get("op", "mul_"))(2.0)


def bound_method_in_dict(module, args, out):
    methods = {"scale": out.mul_}
    methods["scale"](2.0)


def bound_method_local(module, args, out):
    scale = out.mul_
    scale(2.0)


def partial_of_argument(module, args, out):
    functools.partial(Tensor.mul_, out)(2.0)


def methodcaller(module, args, out):
    operator.methodcaller("mul_", 2.0)(out)


def setattr_(module, args, out):
    setattr(out, STORE.get("field", "data"), out * 2)  # under a name only the running code knows: a write all the same


def operator_in_place(module, args, out):
    operator.imul(out, 2)


def out_keyword(module, args, out):
    functional.mul(out, 2, out=out)


def through_library_call(module, args, out):
    functional.flatten(out).zero_()


def map_in_place(module, args):
    list(map(Tensor.zero_, args))


def nested_def(module, args, out):
    def scale():
        out.mul_(2.0)
    scale()


def items_builtin(module, args):
    list(args)[0].zero_()


def star_args(*hooked):  # module, input and output all in *args
    hooked[2].mul_(2.0)


def zeros_like_mask(module, args, out):
    mask = functional.zeros_like(out)
    mask[0] = 1.0
    STORE["mask"] = mask


def nested_observer(module, args, out):
    def keep():
        STORE["out"] = out.detach()
    keep()


def rows_copied(module, args, out):
    STORE["rows"] = [out[k].clone() for k in range(2)]


def unnamed_callable(module, args, out):
    callback = STORE.get("callback")
    callback(out)


def through_star_args(module, args):
    _scale(*args)


def too_deep(module, args, out):
    _deep(out)


CASES = {  # name -> (hook, writes, something left unresolved)
    "method_in_place": (method_in_place, True, False), "function_in_place": (function_in_place, True, False),
    "inplace_keyword": (inplace_keyword, True, False), "augmented": (augmented, True, False),
    "item_assignment": (item_assignment, True, False), "attribute_assignment": (attribute_assignment, True, False),
    "helper": (helper, True, False), "nested_helper": (nested_helper, True, False), "alias": (alias, True, False),
    "view": (view, True, False), "loop": (loop, True, False), "comprehension": (comprehension, True, False),
    "unpacking": (unpacking, True, False), "paired_locals": (paired_locals, True, False),
    "closure": (_closure_writer(), True, False), "callable_object": (_Scaler(), True, False),
    "bound_method": (_Scaler().__call__, True, False), "partial": (functools.partial(_with_factor, 2.0), True, False),
    "store": (store, False, False), "rebinding": (rebinding, False, False), "logging": (logging_, False, False),
    "observer_helper": (observer_helper, False, False), "recorder": (_Recorder(), False, False),
    "lambda_store": (lambda m, a, o: STORE.__setitem__("c", o), False, False),
    "copy_then_write": (copy_then_write, False, False),
    "unnamed_callable": (unnamed_callable, False, True), "through_star_args": (through_star_args, False, True),
    "too_deep": (too_deep, False, True), "no_python_code": (print, False, True),
    # a call on an argument (or a value reached from one) whose target is named, or not
    "getattr_known_name": (getattr_known_name, True, False), "getattr_unknown_name": (getattr_unknown_name, False, True),
    "bound_method_in_dict": (bound_method_in_dict, False, True), "bound_method_local": (bound_method_local, True, False),
    "partial_of_argument": (partial_of_argument, False, True), "methodcaller": (methodcaller, False, True),
    "setattr": (setattr_, True, False), "operator_in_place": (operator_in_place, True, False),
    "out_keyword": (out_keyword, True, False), "through_library_call": (through_library_call, False, True),
    "map_in_place": (map_in_place, False, True), "nested_def": (nested_def, True, False),
    "items_builtin": (items_builtin, True, False), "zeros_like_mask": (zeros_like_mask, False, False),
    "nested_observer": (nested_observer, False, False), "rows_copied": (rows_copied, False, False),
    "star_args": (star_args, True, False), "star_args_observer": (lambda *a: STORE.setdefault("calls", []), False, False),
}

if __name__ == "__main__":
    for name, (hook, writes, unresolved) in CASES.items():
        reading = read_hook(hook)
        print(json.dumps({"case": name, "python": sys.version.split()[0], "expected": [writes, unresolved],
                          "read": [reading.writes, bool(reading.unresolved)], "why": list(reading.unresolved)}))
