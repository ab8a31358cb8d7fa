"""Graph capture: ``torch.export`` (non-strict) of ``model(x)`` into a graph of torch-level ops.

Non-strict export runs the model's Python code on fake tensors, so Python control flow over
shapes, optional forward arguments, in-place ops, functional layers and each library's own modules
are all seen as the ops they compute; every op node carries the module it came from
(``nn_module_stack``), under the names users know (``layer4.1.conv2``, ``blocks.3.attn``).

The capture never changes the user's model and never calls its hooks: training flags are set to
eval and every hook is set aside for the duration, then both are restored. A forward hook or
pre-hook that may change what the model computes (one that returns a value) is refused by name,
since the explained function must be ``model(x)`` as its module code computes it; so is one that writes
into its arguments in place (read from its code) and the classic spectral_norm / weight_norm pre-hooks,
which recompute a weight on every call.

Parameters and buffers, which export lifts to graph inputs, are bound by their fully qualified
names to the live model (:meth:`Capture.value`): weights are read when a pass runs, never copied
at capture, so in-place changes to the model (a randomization stage) are seen.
"""
from __future__ import annotations

import contextlib
import dis
import functools
import io
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from attributions.errors import AttributionError

_WRAPPED = "model"  # the user's model inside the capture's wrapper: stripped from every name


@dataclass(frozen=True)
class Source:
    """Where a graph input comes from: ``kind`` "input" (the image batch), "parameter", "buffer"
    or "constant" (a tensor made in ``forward``); ``target`` its fully qualified name in the model
    (for constants, the key of the exported program's constants)."""

    kind: str
    target: str


class Capture:
    """The captured graph of one model at one input shape.

    Attributes
    ----------
    graph : torch.fx.Graph of torch-level ops (``torch.ops.aten.*``), in forward order
    sources : {placeholder name: Source}, every graph input
    input : name of the placeholder that receives the images (B, C, H, W)
    output : the node whose value is the logits (B, classes)
    dynamic_batch : whether the batch axis is symbolic (one graph for every batch size), else the
        graph is specialised to ``shape[0]``
    shape : the example input's shape
    """

    def __init__(self, model: nn.Module, program: torch.export.ExportedProgram, dynamic_batch: bool,
                 shape: torch.Size):
        self.model = model
        self.graph = program.graph
        self.graph_module = program.graph_module  # holds the subgraphs of higher-order ops (autocast regions)
        self.dynamic_batch = dynamic_batch
        self.shape = shape
        self._constants = dict(program.constants)
        kinds = {"USER_INPUT": "input", "PARAMETER": "parameter", "BUFFER": "buffer", "CONSTANT_TENSOR": "constant",
                 "CUSTOM_OBJ": "constant"}
        self.sources: dict[str, Source] = {}
        for spec in program.graph_signature.input_specs:
            kind = kinds.get(spec.kind.name)
            if kind is None:
                raise AttributionError(f"the captured model takes an input of kind {spec.kind.name} "
                                       f"({spec.arg.name}); the engine explains models of one image batch")
            target = spec.target or ""
            if kind in ("parameter", "buffer"):
                target = _strip(target)
            self.sources[spec.arg.name] = Source(kind, target)
        inputs = [name for name, s in self.sources.items() if s.kind == "input"]
        if len(inputs) != 1:
            raise AttributionError(f"the model takes {len(inputs)} tensor inputs; the engine explains models of one "
                                   "image batch (wrap the other inputs into the model)")
        self.input = inputs[0]
        mutated = [_strip(spec.target or "?") for spec in program.graph_signature.output_specs
                   if spec.kind.name != "USER_OUTPUT"] + self._written_state()
        if mutated:
            raise AttributionError(f"the model's forward changes {', '.join(dict.fromkeys(mutated))} "
                                   "when called; the engine explains a forward that leaves the model as it is "
                                   "(in eval mode)")
        out = next(n for n in self.graph.nodes if n.op == "output").args[0]
        self.output = out[0] if isinstance(out, (tuple, list)) else out

    def _written_state(self) -> list[str]:
        """The parameters and buffers an in-place op of the graph writes to (directly or through a
        view): export keeps such writes as ops on the lifted inputs."""
        written = []
        for node in self.ops():
            schema = getattr(node.target, "_schema", None)
            if schema is None or not schema.arguments or not (schema.arguments[0].alias_info or None) \
                    or not schema.arguments[0].alias_info.is_write:
                continue
            base = node.args[0]
            while isinstance(base, torch.fx.Node) and base.op == "call_function" and is_view(base):
                base = base.args[0]
            if isinstance(base, torch.fx.Node) and base.op == "placeholder" and \
                    self.sources[base.name].kind != "input":
                written.append(self.sources[base.name].target)
        return written

    def value(self, name: str) -> Any:
        """The current value of the graph input ``name`` that is not the images: the live
        parameter or buffer of the model, or the captured constant."""
        source = self.sources[name]
        if source.kind == "parameter":
            return self.model.get_parameter(source.target)
        if source.kind == "buffer":
            return self.model.get_buffer(source.target)
        if source.kind == "constant":
            return self._constants[source.target]
        raise AttributionError(f"{name!r} is the images, not a value of the model")

    @staticmethod
    def module_path(node: torch.fx.Node) -> str:
        """The dotted path of the innermost module ``node`` was computed in ("" for the model's own
        ``forward``)."""
        stack = node.meta.get("nn_module_stack") or {}
        if not stack:
            return ""
        path = list(stack.values())[-1]
        path = path[0] if isinstance(path, tuple) else path
        return "" if path.startswith("_empty_nn_module_stack") else _strip(path)

    @staticmethod
    def module_type(node: torch.fx.Node) -> str:
        """The qualified class name of the innermost module ``node`` was computed in."""
        stack = node.meta.get("nn_module_stack") or {}
        if not stack:
            return ""
        path = list(stack.values())[-1]
        return str(path[1]) if isinstance(path, tuple) and len(path) > 1 else ""

    def ops(self) -> list[torch.fx.Node]:
        """The op nodes (``call_function``) in forward order."""
        return [n for n in self.graph.nodes if n.op == "call_function"]


def is_view(node: torch.fx.Node) -> bool:
    """Whether an op's output aliases its first argument (a view, or an in-place op's result)."""
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None)


def _strip(path: str) -> str:
    """A path inside the capture's wrapper as the user's model names it."""
    if path == _WRAPPED:
        return ""
    return path[len(_WRAPPED) + 1:] if path.startswith(_WRAPPED + ".") else path


def logits_of(out: Any) -> torch.Tensor:
    """The logits in a model's output: a tensor; an output with ``.logits`` (Hugging Face's
    ``ModelOutput``); a mapping with ``"logits"``; a tuple or list whose first item is a tensor."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, Mapping) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise AttributionError(f"the model returns a {type(out).__name__}, not the logits; return a tensor (B, classes), "
                           "an output with .logits, a dict with 'logits', or a tuple whose first item is the logits")


class _Logits(nn.Module):
    """``model(x)`` reduced to its logits; the model is held, not changed."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return logits_of(self.model(x))


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_state_dict_hooks", "_load_state_dict_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _returns_only_none(hook: Any) -> bool:
    """Whether every ``return`` of the hook's code returns None (an observer); False when that cannot
    be read from its code (a callable object without Python code, a lambda returning a value)."""
    code = _code(hook)
    if code is None:
        return False
    instructions = list(dis.get_instructions(code))
    if code.co_name == "<lambda>" and _observes(instructions):
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


# calls whose value is None: a lambda returning one of them (``lambda *a: acts.append(a)``,
# ``lambda m, i, o: store.__setitem__(name, o)``) observes, unless it calls them on its own arguments
_OBSERVING_CALLS = {"append", "extend", "add", "update", "write", "print", "put", "put_nowait", "info", "debug",
                    "warning", "set", "__setitem__", "setdefault"}
_LOADS = ("LOAD_FAST", "LOAD_ATTR", "LOAD_METHOD")


def _mutates_arguments(hook: Any) -> bool:
    """Whether the hook's code writes into one of its arguments (the module, its input or output): an in-place
    method (``output.mul_(2)``, ``inputs[0].copy_(...)``, ``output.__setitem__``) or an item assignment
    (``output[0] = ...``) on an argument or on what is reached from it by attributes or items. Such a hook
    changes what the model computes while returning None."""
    code = _code(hook)
    if code is None:
        return False
    arguments = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    instructions = list(dis.get_instructions(code))

    def rooted(k: int) -> bool:  # the value loaded at instruction k comes from an argument (through attributes)
        while k >= 0 and instructions[k].opname in ("LOAD_ATTR", "BINARY_SUBSCR", "LOAD_CONST"):
            k -= 1 if instructions[k].opname == "LOAD_ATTR" else 2
        return k >= 0 and instructions[k].opname == "LOAD_FAST" and instructions[k].argval in arguments

    for k, ins in enumerate(instructions):
        name = str(ins.argval)
        if ins.opname in ("LOAD_METHOD", "LOAD_ATTR") and k and (
                name == "__setitem__" or name.endswith("_") and not name.startswith("_")) and rooted(k - 1):
            return True
        if ins.opname == "STORE_SUBSCR" and k >= 2 and rooted(k - 2):
            return True
    return False


def _code(hook: Any) -> Any:
    """The Python code object of a hook (a function, a method, a partial, a callable object), or None."""
    while isinstance(hook, functools.partial):
        hook = hook.func
    code = getattr(getattr(hook, "__func__", hook), "__code__", None)
    return code if code is not None else getattr(type(hook).__call__, "__code__", None)


# pre-hooks that recompute a parameter from others on every call: the engine never runs hooks, so it would read
# a stale weight and randomizing the parameters behind it would change nothing
_RECOMPUTING = (SpectralNorm, WeightNorm)


def _observes(instructions: list[dis.Instruction]) -> bool:
    """Whether a lambda's body is one call of an observing function or method (its result, None, is
    what the lambda returns)."""
    loads = [i for i in instructions if i.opname in ("LOAD_METHOD", "LOAD_ATTR", "LOAD_GLOBAL", "LOAD_NAME")]
    returns = [k for k, i in enumerate(instructions) if i.opname == "RETURN_VALUE"]
    return (len(returns) == 1 and returns[0] > 0 and instructions[returns[0] - 1].opname == "CALL"
            and bool(loads) and loads[0].opname in ("LOAD_METHOD", "LOAD_ATTR", "LOAD_GLOBAL")
            and (loads[0].argval in _OBSERVING_CALLS if loads[0].opname != "LOAD_GLOBAL" else loads[0].argval == "print"
                 or len(loads) > 1 and loads[1].argval in _OBSERVING_CALLS))


def _changes(hook: Any) -> bool:
    return isinstance(hook, _RECOMPUTING) or not _returns_only_none(hook) or _mutates_arguments(hook)


def forward_changing_hooks(model: nn.Module) -> list[str]:
    """The forward hooks and pre-hooks of ``model`` (and the global ones) that may change what it
    computes: "<module path>: <hook>" for each hook whose code returns a value, writes into its
    arguments in place, or recomputes a weight (the classic spectral_norm and weight_norm)."""
    found = []
    for path, module in model.named_modules():
        for kind in ("_forward_pre_hooks", "_forward_hooks"):
            for hook in getattr(module, kind).values():
                if _changes(hook):
                    where = path or "the model"
                    found.append(f"{where}: {kind.strip('_').replace('_', ' ')[:-1]} "
                                 f"{getattr(hook, '__qualname__', type(hook).__name__)}")
    for kind in ("_global_forward_pre_hooks", "_global_forward_hooks"):
        for hook in getattr(nn.modules.module, kind).values():
            if _changes(hook):
                found.append(f"every module: {kind.strip('_').replace('_', ' ')[:-1]} "
                             f"{getattr(hook, '__qualname__', type(hook).__name__)}")
    return found


@contextlib.contextmanager
def _quiet(model: nn.Module) -> Iterator[None]:
    """Eval flags and no hooks on ``model`` for the duration; the model as it was afterwards."""
    modules = list(model.modules())
    flags = [m.training for m in modules]
    hooks = [[getattr(m, name) for name in _HOOK_DICTS if hasattr(m, name)] for m in modules]
    global_hooks = [getattr(nn.modules.module, name) for name in _GLOBAL_HOOKS]
    saved = [[dict(d) for d in ds] for ds in hooks]
    saved_global = [dict(d) for d in global_hooks]
    try:
        for m, ds in zip(modules, hooks):
            m.training = False
            for d in ds:
                d.clear()
        for d in global_hooks:
            d.clear()
        yield
    finally:
        for m, flag, ds, kept in zip(modules, flags, hooks, saved):
            m.training = flag
            for d, k in zip(ds, kept):
                d.clear()
                d.update(k)
        for d, k in zip(global_hooks, saved_global):
            d.clear()
            d.update(k)


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """torch's export and symbolic-shape loggers silenced for the duration: a failed attempt
    (the dynamic batch before the static one) logs graphs and guards a user has no use for; the
    error we raise says what went wrong."""
    names = ("torch.fx.experimental.symbolic_shapes", "torch._export", "torch.export", "torch._subclasses.fake_tensor",
             "torch._dynamo", "torch.__trace")
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
        with contextlib.redirect_stderr(io.StringIO()):  # export prints a failed attempt's partial graph there
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def capture(model: nn.Module, example: torch.Tensor) -> Capture:
    """Capture ``model(x)`` for inputs shaped like ``example`` (B, C, H, W): image sizes
    specialised, the batch axis dynamic where the model allows it (else specialised to B).

    Raises
    ------
    AttributionError
        When export cannot capture the model (its own message and where in the model code), when a
        hook may change the model's output, or when the output holds no logits.
    """
    if not isinstance(model, nn.Module):
        raise AttributionError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    changing = forward_changing_hooks(model)
    if changing:
        recomputing = any(name in h for h in changing for name in ("SpectralNorm", "WeightNorm"))
        raise AttributionError(f"the model has hooks that may change what it computes ({'; '.join(changing)}): the "
                               "engine explains model(x) as its modules compute it and never runs hooks; remove them "
                               "(handle.remove()) or move what they do into a module's forward"
                               + ("; for spectral_norm / weight_norm use torch.nn.utils.parametrizations.spectral_norm "
                                  "/ weight_norm, which the engine follows" if recomputing else ""))
    wrapper = _Logits(model)
    batch = example.shape[0]
    # export specialises sizes 0 and 1, so a symbolic batch is declared on an example of two
    sample = example[:1].expand(2, *example.shape[1:]).clone() if batch < 2 else example
    # grad enabled: a torch.no_grad() region of the forward is then recorded as one (through which no gradient flows)
    with _quiet(model), _silenced(), torch.enable_grad():
        try:
            program = torch.export.export(wrapper, (sample,), dynamic_shapes=({0: torch.export.Dim("batch")},),
                                          strict=False)
            dynamic = True
        except AttributionError:
            raise
        except Exception as first:  # the model fixes its batch size, or cannot be captured at all
            try:
                program = torch.export.export(wrapper, (example,), strict=False)
                dynamic = False
            except AttributionError:
                raise
            except Exception as second:
                if not _is_capture_limit(second):  # the forward itself fails on such inputs
                    raise AttributionError(f"the model's forward fails on inputs of shape {tuple(example.shape)} "
                                           f"({_export_message(second)}); check the input shape and channels the model "
                                           "expects") from None
                raise AttributionError(f"could not capture {type(model).__name__} with torch.export: "
                                       f"{_export_message(first)}. The engine needs a forward that export can follow: "
                                       "Python control flow on sizes is fine, branching on tensor values is not (use "
                                       "torch.where, or explain a sub-model)") from None
    captured = Capture(model, program, dynamic, example.shape)
    return captured


def _is_capture_limit(exc: Exception) -> bool:
    """Whether export failed where the model's code leaves what export can follow (data-dependent
    control flow, an op or object it cannot trace), rather than because the forward itself fails."""
    from torch._dynamo.exc import TorchDynamoException, Unsupported, UserError
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return isinstance(exc, (GuardOnDataDependentSymNode, UserError, Unsupported, TorchDynamoException, NotImplementedError,
                            TypeError))


def _export_message(exc: Exception) -> str:
    """export's error in a few lines: its first line and where in the model's code it arose."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    where = [line for line in lines if line.startswith("File ") and "site-packages/torch" not in line]
    head = lines[0] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {head[:300]}" + (f" (at {where[-1]})" if where else "")
