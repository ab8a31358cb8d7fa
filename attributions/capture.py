"""Graph capture: ``torch.export`` (non-strict) of ``model(x)`` into a graph of torch-level ops.

Non-strict export runs the model's Python code on fake tensors, so Python control flow over
shapes, optional forward arguments, in-place ops, functional layers and each library's own modules
are all seen as the ops they compute; every op node carries the module it came from
(``nn_module_stack``), under the names users know (``layer4.1.conv2``, ``blocks.3.attn``).

The capture never changes the user's model, and the export never calls its hooks: training flags are set to
eval and every hook is set aside for the duration, then both are restored. A forward hook or
pre-hook that may change what the model computes (one that returns a value) is refused by name,
since the explained function must be ``model(x)`` as its module code computes it; so is one that writes
into its arguments in place and the classic spectral_norm / weight_norm pre-hooks, which recompute a weight
on every call (:mod:`attributions.hooks` reads that from the hooks' code). Where the model has forward hooks, each
capture then runs its own forward once, hooks and all (the model left as it was after), and refuses it when its
logits differ from the captured graph's (:mod:`attributions.hook_check`): a hook whose code does not show that it
changes the output.

Parameters and buffers, which export lifts to graph inputs, are bound by their fully qualified
names to the live model (:meth:`Capture.value`): weights are read when a pass runs, never copied
at capture, so in-place changes to the model (a randomization stage) are seen.
"""
from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn

from attributions import capture_cache
from attributions.errors import AttributionError
from attributions.hook_check import CHECKED_IMAGES, check_hooked_forward
from attributions.hooks import refuse_changing_hooks, warn_unresolved_hooks

_WRAPPED = "model"  # the user's model inside the capture's wrapper: stripped from every name


@dataclass(frozen=True)
class Program:
    """What the engine keeps of an exported program: its graph (in ``graph_module``, which also holds the
    subgraphs of higher-order ops), lifted constants and signature; nothing that refers to the model, so one
    program serves the model's deep copies (:mod:`attributions.capture_cache`)."""

    graph_module: torch.fx.GraphModule
    constants: dict[str, Any]
    input_specs: tuple[Any, ...]
    output_specs: tuple[Any, ...]

    @classmethod
    def of(cls, program: torch.export.ExportedProgram) -> Program:
        signature = program.graph_signature
        return cls(program.graph_module, dict(program.constants), tuple(signature.input_specs),
                   tuple(signature.output_specs))


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

    def __init__(self, model: nn.Module, program: Program, dynamic_batch: bool, shape: torch.Size):
        self.model = model
        self.graph_module = program.graph_module  # holds the subgraphs of higher-order ops (autocast regions)
        self.graph = program.graph_module.graph
        self.dynamic_batch = dynamic_batch
        self.shape = shape
        self._constants = program.constants
        self._values: dict[str, Callable[[], Any]] = {}  # how each non-image graph input is read (value)
        kinds = {"USER_INPUT": "input", "PARAMETER": "parameter", "BUFFER": "buffer", "CONSTANT_TENSOR": "constant",
                 "CUSTOM_OBJ": "constant"}
        self.sources: dict[str, Source] = {}
        for spec in program.input_specs:
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
        mutated = [_strip(spec.target or "?") for spec in program.output_specs
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

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The captured program's logits (B, classes) on ``x`` (B, ...), with the model's current parameters and
        buffers: its modules' code as exported, none of its hooks."""
        args = [x if source.kind == "input" else self.value(name) for name, source in self.sources.items()]
        out = self.graph_module(*args)
        logits: torch.Tensor = out[0] if isinstance(out, (tuple, list)) else out
        return logits

    def value(self, name: str) -> Any:
        """The current value of the graph input ``name`` that is not the images: the live
        parameter or buffer of the model, or the captured constant."""
        get = self._values.get(name)
        if get is None:
            get = self._values[name] = self._getter(name)
        return get()

    def _getter(self, name: str) -> Callable[[], Any]:
        """How to read ``name``'s value: a parameter or buffer from its module, found once (the attribute is
        read at every call, so a tensor re-initialised or replaced on its module is seen), a constant as is."""
        source = self.sources[name]
        if source.kind in ("parameter", "buffer"):
            owner, _, leaf = source.target.rpartition(".")
            module = self.model.get_submodule(owner)
            if not hasattr(module, leaf):
                raise AttributionError(f"the model has no {source.kind} {source.target!r} any more; it was captured "
                                       "with one: capture the model again")
            return lambda: getattr(module, leaf)
        if source.kind == "constant":
            # a tensor attribute of a module is read from the model (a deep copy reads its own); a tensor made in
            # forward is the one captured
            path, _, attribute = _strip(source.target).rpartition(".")
            holder = _submodule(self.model, path)
            if holder is not None and isinstance(getattr(holder, attribute, None), torch.Tensor):
                return lambda: getattr(holder, attribute)
            constant = self._constants[source.target]
            return lambda: constant
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


def _submodule(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


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
        found: torch.Tensor = out["logits"]
        return found
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
        hook's code shows that it may change the model's output, when the model's own forward with its hooks
        gives other logits than the captured graph, or when the output holds no logits.
    """
    if not isinstance(model, nn.Module):
        raise AttributionError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    refuse_changing_hooks(model)
    warn_unresolved_hooks(model)
    kept = capture_cache.lookup(model, example)
    if kept is not None:
        return _checked(Capture(model, kept[0], kept[1], example.shape), example)
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
    kept_program = Program.of(program)
    captured = Capture(model, kept_program, dynamic, example.shape)  # refuses a program it cannot use: not kept
    capture_cache.store(model, example, kept_program, dynamic)
    return _checked(captured, example)


def _checked(captured: Capture, example: torch.Tensor) -> Capture:
    """``captured``, once the model's own forward (its hooks run) gives its logits on ``example`` (B, ...), or on
    its first :data:`~attributions.hook_check.CHECKED_IMAGES` images where the graph serves any batch
    (:func:`~attributions.hook_check.check_hooked_forward`)."""
    x = example[:CHECKED_IMAGES] if captured.dynamic_batch else example
    model = captured.model  # called itself, not through a wrapper module that global hooks would also see
    check_hooked_forward(model, lambda images: logits_of(model(images)), captured.run, x)
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
