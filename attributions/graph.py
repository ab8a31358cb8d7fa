"""The traced graph: every call site of a model as a node, canonicalised for the rules.

``trace(model)`` runs ``torch.fx`` symbolic tracing (the model itself is not changed, and none of
its hooks runs), maps each call site to a node *kind*, folds eval-mode BatchNorm into the conv /
linear layer before it, and treats in-place operations as out-of-place (the engine computes
every node functionally). Weights and other parameters are read from the model at call time, so
an explainer always sees their current values.

Only nodes that carry the signal (floating tensors computed from the input through
differentiable operations) get a kind that a rule acts on. Everything else is computed in the
forward pass and held constant in the backward pass: ``value`` nodes (sizes, shapes, asserts,
comparisons) and ``const`` nodes (parameters used in ``forward``, tensors made there, anything
computed from them alone).
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from attributions import attention
from attributions.errors import AttributionError

# Kinds whose output is linear in the input (plus a bias), with weights: the layers LRP rules act on.
LINEAR_KINDS = ("dense", "conv", "affine", "avgpool")
# Every kind that carries the signal, and the kinds that do not.
SIGNAL_KINDS = LINEAR_KINDS + ("relu", "leaky_relu", "maxpool", "add", "move", "mix", "activation", "product",
                               "norm", "softmax")
CONSTANT_KINDS = ("input", "value", "const")

SUPPORTED = ("Conv1d/2d (any padding mode, padding='same'), Linear, BatchNorm1d/2d (folded into the conv / linear "
             "before it, else an affine node; without running statistics a normalisation), LayerNorm, GroupNorm, "
             "ReLU, LeakyReLU, ReLU6, ELU, CELU, SELU, GELU, SiLU, Mish, Hardswish, Hardsigmoid, Hardtanh, Sigmoid, "
             "Tanh, Softplus, LogSigmoid, Softmax, MaxPool1d/2d, AvgPool1d/2d, AdaptiveAvgPool1d/2d, Dropout, "
             "Identity, Flatten, Unflatten; functions and methods: indexing and slicing, view / reshape / flatten "
             "/ unflatten, permute / transpose / mT / T, expand / repeat, squeeze / unsqueeze, chunk / split / "
             "unbind, cat / stack, pad, roll, flip, narrow, contiguous / clone, + - * / (by constants or of two "
             "signals), mean / sum over dims, matmul / bmm / einsum, the activations above, softmax, layer_norm, "
             "group_norm, dropout and stochastic_depth (identities in eval), sizes, shapes and asserts")


@dataclass
class Node:
    """One call site.

    ``inputs`` names the signal-carrying nodes it reads (in argument order, each once); ``run(env,
    replace)`` computes its value from the values of all nodes it reads, with ``replace`` overriding
    some of them (the backward passes of the generic rules differentiate through it).
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    module: nn.Module | None = None
    bn: nn.Module | None = None  # an eval-mode BatchNorm folded after this conv / linear
    run: Callable[..., Any] | None = None
    params: dict = field(default_factory=dict)
    # inputs renamed by BatchNorm folding: {name the traced call reads: node that now computes it}
    aliases: dict[str, str] = field(default_factory=dict)

    def evaluate(self, env: dict, replace: dict | None = None) -> Any:
        """The node's value from ``env`` (and ``replace``, which wins over it)."""
        assert self.run is not None, f"node {self.name!r} of kind {self.kind!r} has no traced operation"
        replace = replace or {}
        if self.aliases:  # a replaced input must reach the call under the name it was traced with
            replace = {**replace, **{old: replace[new] for old, new in self.aliases.items() if new in replace}}
        return self.run(env, replace)


# --- what each call site is -----------------------------------------------------------------------

_IDENTITIES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout, nn.Identity)
_ACTIVATION_MODULES = (nn.ReLU6, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid,
                       nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Softplus, nn.LogSigmoid)
_MODULE_KINDS: list[tuple[tuple[type, ...], str]] = [
    ((nn.Linear,), "dense"),
    ((nn.Conv1d, nn.Conv2d), "conv"),
    ((nn.BatchNorm1d, nn.BatchNorm2d), "affine"),
    ((nn.ReLU,), "relu"),
    ((nn.LeakyReLU,), "leaky_relu"),
    ((nn.MaxPool1d, nn.MaxPool2d), "maxpool"),
    ((nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d), "avgpool"),
    ((nn.Flatten, nn.Unflatten, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout, nn.Identity), "move"),
    (_ACTIVATION_MODULES, "activation"),
    ((nn.Softmax,), "softmax"),
    ((nn.LayerNorm, nn.GroupNorm), "norm"),
]
_ACTIVATION_FUNCTIONS = {F.relu6, F.elu, F.celu, F.selu, F.gelu, F.silu, F.mish, F.hardswish, F.hardsigmoid,
                         F.hardtanh, F.softplus, F.logsigmoid, torch.sigmoid, F.sigmoid, torch.tanh, F.tanh,
                         torch.exp, torch.sqrt, torch.rsqrt, torch.reciprocal, torch.square, torch.log, torch.erf,
                         torch.abs, torch.selu, torch.celu}
_ACTIVATION_METHODS = {"sigmoid", "tanh", "exp", "sqrt", "rsqrt", "reciprocal", "square", "log", "erf", "abs",
                       "pow"}
_MOVE_FUNCTIONS = {operator.getitem, torch.permute, torch.transpose, torch.reshape, torch.flatten, torch.unflatten,
                   torch.squeeze, torch.unsqueeze, torch.cat, torch.concat, torch.stack, torch.chunk, torch.split,
                   torch.unbind, torch.tensor_split, F.pad, torch.roll, torch.flip, torch.narrow, torch.movedim,
                   torch.swapaxes, torch.t, torch.clone, torch.select, torch.index_select, torch.tile, F.dropout,
                   F.dropout1d, F.dropout2d, F.alpha_dropout, torch.broadcast_to}
_MOVE_METHODS = {"view", "reshape", "flatten", "unflatten", "permute", "transpose", "squeeze", "unsqueeze", "expand",
                 "expand_as", "repeat", "chunk", "split", "unbind", "tensor_split", "contiguous", "clone", "narrow",
                 "movedim", "flip", "roll", "t", "swapaxes", "view_as", "reshape_as", "select", "index_select",
                 "tile", "float", "double", "type_as", "to", "__getitem__", "broadcast_to"}
_MOVE_ATTRIBUTES = {"mT", "T", "mH", "H", "real"}
_MIX_FUNCTIONS = {operator.add, operator.iadd, torch.add, operator.sub, operator.isub, torch.sub, torch.subtract,
                  operator.neg, torch.neg, torch.mean, torch.sum, operator.mul, operator.imul, torch.mul,
                  torch.multiply, operator.truediv, operator.itruediv, torch.div, torch.true_divide, operator.matmul,
                  torch.matmul, torch.bmm, torch.mm, torch.einsum, F.linear}
_MIX_METHODS = {"add", "sub", "neg", "mean", "sum", "mul", "div", "matmul", "bmm", "mm", "__add__", "__radd__",
                "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__neg__", "__matmul__"}
# Products of two signals: bilinear (matmul family, mul) or a quotient (div: bilinear in a and 1 / b).
_PRODUCT_TARGETS = {operator.mul, operator.imul, torch.mul, torch.multiply, operator.matmul, torch.matmul, torch.bmm,
                    torch.mm, torch.einsum, operator.truediv, operator.itruediv, torch.div, torch.true_divide, "mul",
                    "matmul", "bmm", "mm", "div", "__mul__", "__rmul__", "__matmul__", "__truediv__"}
_QUOTIENTS = {operator.truediv, operator.itruediv, torch.div, torch.true_divide, "div", "__truediv__"}
_MULTIPLICATIVE = _PRODUCT_TARGETS | {F.linear, operator.pow, torch.pow, "pow", "__pow__", "__rpow__"}
_POWERS = {operator.pow, torch.pow}
_SOFTMAX = {F.softmax, torch.softmax, "softmax"}
_NORM_FUNCTIONS = {F.layer_norm, F.group_norm}
_ADDS = {operator.add, operator.iadd, torch.add, "add", "__add__", "__radd__"}
_RELUS = {F.relu, torch.relu, torch.relu_, "relu"}
_POOL_FUNCTIONS = {F.max_pool1d: "maxpool", F.max_pool2d: "maxpool", F.avg_pool1d: "avgpool", F.avg_pool2d: "avgpool",
                   F.adaptive_avg_pool1d: "avgpool", F.adaptive_avg_pool2d: "avgpool"}
# Calls whose result is not a signal even when their arguments are: sizes, shapes, comparisons, indices.
_VALUE_TARGETS = {"size", "dim", "numel", "shape", "dtype", "device", "ndim", "is_floating_point", "argmax", "argmin",
                  "eq", "ne", "gt", "lt", "ge", "le", "isnan", "isfinite", torch._assert, torch.argmax, torch.argmin,
                  operator.eq, operator.ne, operator.gt, operator.lt, operator.ge, operator.le, operator.floordiv,
                  operator.mod, torch.eq, torch.ne, torch.gt, torch.lt, torch.ge, torch.le, torch.isnan,
                  torch.isfinite, operator.not_, getattr, len, math.sqrt}
# Activations whose output gates another signal in a product (LRP's "gate as constant" convention).
GATES = {"sigmoid", "Sigmoid", "hardsigmoid", "Hardsigmoid", "softmax", "Softmax"}
# Tensors made from a signal's shape, dtype or device only: constants of the backward pass.
_CONSTANT_TARGETS = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", torch.zeros_like, torch.ones_like,
                     torch.full_like, torch.empty_like}
_TUPLE_TARGETS = {torch.chunk, torch.split, torch.unbind, torch.tensor_split, "chunk", "split", "unbind",
                  "tensor_split"}


def _target_name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _module_kind(module: nn.Module) -> str | None:
    """The kind of a layer the engine knows; None for any other module, and for a subclass of a known
    layer that overrides ``forward`` (torchvision's LayerNorm2d permutes around its LayerNorm): those
    are traced through, so the rules see the operations they really compute."""
    for types, kind in _MODULE_KINDS:
        base: Any = next((t for t in types if isinstance(module, t)), None)
        if base is None:
            continue
        if type(module).forward is not base.forward:
            return None
        if kind == "affine" and getattr(module, "running_mean", None) is None:
            return "norm"  # without running statistics it normalises with the batch's: not an affine map
        return kind
    return None


def _call_kind(fx_node: torch.fx.Node, slots: list) -> str | None:
    """The kind of a function or method call whose arguments hold signals at ``slots`` (None: unsupported)."""
    target: Any = fx_node.target
    n_signals = len(slots)
    name = _target_name(target)
    if fx_node.op == "call_method" and target in ("relu", "relu_"):
        return "relu"
    if target in _RELUS:
        return "relu"
    if target is F.leaky_relu or target in ("leaky_relu", "leaky_relu_"):
        return "leaky_relu"
    if target in _POOL_FUNCTIONS:
        return _POOL_FUNCTIONS[target]
    if name == "stochastic_depth":  # torchvision's, an identity in eval
        return "move"
    if target in _SOFTMAX:
        return "softmax"
    if target in _NORM_FUNCTIONS:
        return "norm"
    if n_signals == 2 and target in _ADDS and "alpha" not in fx_node.kwargs and len(fx_node.args) == 2:
        return "add"
    method = target.rstrip("_") if fx_node.op == "call_method" and not target.endswith("__") else target
    if n_signals >= 2 and (target in _MULTIPLICATIVE or method in _MULTIPLICATIVE):
        return "product" if n_signals == 2 and (target in _PRODUCT_TARGETS or method in _PRODUCT_TARGETS) else None
    if target in _POWERS or method in ("pow", "__pow__", "__rpow__") or (
            (target in _QUOTIENTS or method in _QUOTIENTS) and (0,) not in slots):
        return "activation" if n_signals == 1 else None  # x ** c, c ** x, c / x: element-wise nonlinear
    if target in _MIX_FUNCTIONS or (fx_node.op == "call_method" and target.rstrip("_") in _MIX_METHODS):
        return "mix"
    if target in _MOVE_FUNCTIONS or (fx_node.op == "call_method" and target in _MOVE_METHODS):
        return "move"
    if target is getattr and fx_node.args[1] in _MOVE_ATTRIBUTES:
        return "move"
    if target in _ACTIVATION_FUNCTIONS or (fx_node.op == "call_method" and target.rstrip("_") in _ACTIVATION_METHODS):
        return "activation"
    if fx_node.op == "call_method" and target.rstrip("_") in ("softmax",):
        return "softmax"
    return None


def _is_value_call(fx_node: torch.fx.Node) -> bool:
    target: Any = fx_node.target
    if target is getattr:
        return fx_node.args[1] not in _MOVE_ATTRIBUTES
    return (target in _VALUE_TARGETS) if not isinstance(target, str) else target in _VALUE_TARGETS


class Graph:
    """The canonical graph of a model: nodes in forward (topological) order.

    Attributes
    ----------
    nodes : list of Node, the first of kind ``input``
    output : str, name of the node whose value the model returns
    """

    def __init__(self, nodes: list[Node], output: str):
        self.nodes = nodes
        self.output = output
        self.by_name = {n.name: n for n in nodes}
        self.consumers: dict[str, list[str]] = {n.name: [] for n in nodes}
        for n in nodes:
            for i in n.inputs:
                self.consumers[i].append(n.name)

    @property
    def layers(self) -> list[str]:
        """Names of the signal-carrying nodes, in forward order (the input excluded)."""
        return [n.name for n in self.nodes if n.kind in SIGNAL_KINDS]

    def first_layers(self) -> set[str]:
        """Linear nodes that read the input directly (through data-movement nodes)."""
        out, frontier = set(), [self.nodes[0].name]
        while frontier:
            for c in self.consumers[frontier.pop()]:
                kind = self.by_name[c].kind
                if kind in LINEAR_KINDS:
                    out.add(c)
                elif kind == "move":
                    frontier.append(c)
        return out


def _path_name(fx_node: torch.fx.Node) -> str:
    stack = fx_node.meta.get("nn_module_stack") or {}
    prefix = ""
    if stack:
        path = list(stack.values())[-1]
        path = path[0] if isinstance(path, tuple) else path
        prefix = f"{path}." if path else ""
    base = fx_node.name.rstrip("_0123456789") or fx_node.name
    return prefix + base


class _Tracer(torch.fx.Tracer):
    """fx's tracer with two changes: the layers the engine knows are leaves, and a container module is
    traced through its ``forward`` rather than its ``__call__``, so the user's hooks never run."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return (_module_kind(m) is not None or isinstance(m, nn.MultiheadAttention)
                or super().is_leaf_module(m, module_qualified_name))

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return super().call_module(m, m.forward, args, kwargs)


def _symbolic_trace(model: nn.Module) -> torch.fx.Graph:
    """The fx graph of ``model`` traced with eval semantics: every module's ``training`` flag is set to
    False while tracing (forwards that branch on it take the eval branch) and restored afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        for m, _ in flags:
            m.training = False
        return _Tracer().trace(model)
    finally:
        for m, flag in flags:
            m.training = flag


def _fetch(model: nn.Module, target: str) -> Any:
    value: Any = model
    for part in target.split("."):
        value = getattr(value, part)
    return value


def trace(model: nn.Module) -> Graph:
    """Trace ``model`` into a canonical :class:`Graph`.

    Raises
    ------
    AttributionError
        When the model cannot be traced, or a node's operation is not supported (naming the node,
        its type and the supported set).
    """
    if _module_kind(model) is not None:
        model = nn.Sequential(model)  # a bare layer: trace it as a call site, not through its forward
    try:
        fx_graph = _symbolic_trace(model)
    except AttributionError:
        raise
    except Exception as exc:  # fx raises several types for data-dependent control flow
        raise AttributionError(
            f"could not trace {type(model).__name__} with torch.fx ({type(exc).__name__}: {exc}). The engine "
            "needs a forward without data-dependent Python control flow; move such logic out of forward "
            "or wrap it in a module") from None
    modules = dict(model.named_modules())
    nodes: list[Node] = []
    fx_to_name: dict[torch.fx.Node, str] = {}
    signal: set[str] = set()  # names of the signal-carrying nodes
    tuple_outputs: set[str] = set()  # expanded modules whose traced value is (output, extras)
    taken: dict[str, int] = {}
    output = None

    def unique(name: str) -> str:
        count = taken.get(name, 0)
        taken[name] = count + 1
        return name if count == 0 else f"{name}#{count}"

    for fx_node in fx_graph.nodes:
        if fx_node.op == "placeholder":
            if nodes:
                raise AttributionError(f"the model takes more than one input ({fx_node.name!r}); the engine "
                                       "explains single-input models (wrap the others in the model)")
            fx_to_name[fx_node] = "input"
            signal.add("input")
            nodes.append(Node("input", "input", ()))
            continue
        if fx_node.op == "output":
            arg = fx_node.args[0]
            if not isinstance(arg, torch.fx.Node) or fx_to_name[arg] not in signal:
                raise AttributionError("the model must return one tensor computed from its input (the logits), not "
                                       "a tuple, a dict or a constant; wrap it to return the logits")
            output = fx_to_name[arg]
            continue
        reads = [fx_to_name[a] for a in fx_node.all_input_nodes]
        signal_inputs = tuple(dict.fromkeys(r for r in reads if r in signal))
        if fx_node.target is operator.getitem and signal_inputs and signal_inputs[0] in tuple_outputs:
            if fx_node.args[1] == 0:
                fx_to_name[fx_node] = signal_inputs[0]
                continue
            if fx_node.users:
                raise AttributionError(f"{signal_inputs[0]!r}: only the attention output (item 0) can be used; its "
                                       "attention weights are not part of the explained graph")
            name = unique(_path_name(fx_node))  # an unused item (``out, _ = attn(...)``)
            fx_to_name[fx_node] = name
            nodes.append(Node(name, "value", (), run=lambda env, replace: None))
            continue
        if signal_inputs and _is_attention(fx_node, modules):
            name = unique(fx_node.target if fx_node.op == "call_module" else _path_name(fx_node))
            expanded = _expand(fx_node, modules, fx_to_name, signal, name)
            for i, (suffix, kind, inputs, run, params) in enumerate(expanded):
                own = name if i == len(expanded) - 1 else f"{name}.{suffix}"
                taken[own] = taken.get(own, 0) + 1
                nodes.append(Node(own, kind, inputs, run=run, params={**params, "tokens": True}))
                signal.add(own)
            if fx_node.op == "call_module":
                tuple_outputs.add(name)
            fx_to_name[fx_node] = name
            continue
        if fx_node.op == "get_attr":
            name = unique(fx_node.target)
            target = fx_node.target
            node = Node(name, "const", (), params={"attribute": target},
                        run=lambda env, replace, target=target: _fetch(model, target))
        elif fx_node.op == "call_module":
            module = modules[fx_node.target]
            name = unique(fx_node.target)
            kind = _module_kind(module) if signal_inputs else "const"
            if kind is None:
                raise AttributionError(f"unsupported operation: module {fx_node.target!r} of type "
                                       f"{type(module).__name__}. Supported: {SUPPORTED}. Rewrite this part of the "
                                       "model with supported layers, or explain a sub-model")
            node = Node(name, kind, signal_inputs, module, run=_module_runner(fx_node, fx_to_name, module))
            if isinstance(module, _IDENTITIES):
                node.params["identity"] = True  # eval semantics whatever the module's mode
                node.run = lambda env, replace, source=signal_inputs[0]: replace.get(source, env[source])
            if isinstance(module, (nn.Flatten, nn.Unflatten)):
                node.params["reshape"] = True
            if kind == "leaky_relu":
                node.params["negative_slope"] = float(module.negative_slope)
            if kind == "activation":
                node.params["function"] = type(module).__name__
            if kind == "softmax":
                if module.dim is None:
                    raise AttributionError(f"nn.Softmax at {name!r} needs an explicit dim")
                node.params["dim"] = module.dim
        else:
            name = unique(_path_name(fx_node))
            if not signal_inputs or _is_value_call(fx_node) or fx_node.target in _CONSTANT_TARGETS:
                kind = "value" if _is_value_call(fx_node) else "const"
                node = Node(name, kind, (), run=_evaluator(fx_node, fx_to_name))
            else:
                slots = _signal_slots(fx_node, fx_to_name, signal)
                kind = _call_kind(fx_node, slots)
                if kind is None:
                    what = (f"method Tensor.{fx_node.target}" if fx_node.op == "call_method"
                            else f"function {_target_name(fx_node.target)!r}")
                    raise AttributionError(f"unsupported operation: {what} at node {name!r} on "
                                           f"{len(signal_inputs)} signal(s). Supported: {SUPPORTED}. Rewrite this "
                                           "part of the model with supported operations, or explain a sub-model")
                node = Node(name, kind, signal_inputs, run=_evaluator(fx_node, fx_to_name))
                _describe_call(node, fx_node, slots, fx_to_name)
        fx_to_name[fx_node] = name
        if node.kind in SIGNAL_KINDS:
            signal.add(name)
        nodes.append(node)
    if output is None:
        raise AttributionError("the traced model returns nothing")
    _mark_gates(nodes)
    return _fold_batchnorm(Graph(_fuse_tuples(nodes, fx_graph, fx_to_name), output))


def _signal_slots(fx_node: torch.fx.Node, fx_to_name: dict, signal: set[str]) -> list[tuple[int, ...]]:
    """Where the call's arguments hold signals: (i,) for args[i], (i, j) for args[i][j] (einsum's list
    form), ("k", name) for keyword arguments. A signal passed twice (x * x) counts twice."""
    slots: list[tuple[Any, ...]] = []
    for i, a in enumerate(fx_node.args):
        if isinstance(a, torch.fx.Node) and fx_to_name[a] in signal:
            slots.append((i,))
        elif isinstance(a, (list, tuple)):
            slots += [(i, j) for j, b in enumerate(a) if isinstance(b, torch.fx.Node) and fx_to_name[b] in signal]
    slots += [("k", k) for k, a in fx_node.kwargs.items() if isinstance(a, torch.fx.Node) and fx_to_name[a] in signal]
    return slots


def _is_attention(fx_node: torch.fx.Node, modules: dict) -> bool:
    if fx_node.op == "call_module":
        return isinstance(modules[fx_node.target], nn.MultiheadAttention)
    return fx_node.target is F.scaled_dot_product_attention


def _expand(fx_node: torch.fx.Node, modules: dict, fx_to_name: dict, signal: set[str], where: str) -> list:
    """The primitive nodes of an attention call (see :mod:`attributions.attention`), the last its output."""
    is_mha = fx_node.op == "call_module"
    names = attention.MHA_ARGUMENTS if is_mha else attention.SDPA_ARGUMENTS
    bound = dict(zip(names, fx_node.args)) | dict(fx_node.kwargs)
    operands = {}
    for role in ("query", "key", "value"):
        arg = bound.get(role)
        if not isinstance(arg, torch.fx.Node) or fx_to_name[arg] not in signal:
            raise AttributionError(f"attention at {where!r}: the {role} must be computed from the input")
        operands[role] = fx_to_name[arg]
    if is_mha:
        return attention.mha_specs(where, modules[fx_node.target], bound, operands, signal)
    return attention.sdpa_specs(where, bound, operands, signal)


def _mark_gates(nodes: list[Node]) -> None:
    """For each product, which operands a gating function computed (``params["gates"]``)."""
    by_name = {n.name: n for n in nodes}
    for node in nodes:
        if node.kind == "product":
            producers = [by_name[name] for name in node.params["operands"]]
            node.params["gates"] = [p.kind == "softmax" or (p.kind == "activation" and p.params.get("function") in GATES)
                                    for p in producers]


def _describe_call(node: Node, fx_node: torch.fx.Node, slots: list, fx_to_name: dict) -> None:
    """Record what the fast paths and rules need to know about a call: pooling as a module, LeakyReLU's
    slope, whether a data movement is a plain reshape, where a product's two operands sit."""
    target: Any = fx_node.target
    if node.kind in ("maxpool", "avgpool"):
        node.module = _pool_module(fx_node, node.name)
    if node.kind == "leaky_relu":
        node.params["negative_slope"] = float(cast(Any, fx_node.kwargs.get(
            "negative_slope", fx_node.args[1] if len(fx_node.args) > 1 else 0.01)))
    if node.kind == "move" and target in ("view", "reshape", "flatten", torch.flatten, torch.reshape, "contiguous"):
        node.params["reshape"] = True
    if node.kind == "move" and target in (torch.cat, torch.concat, torch.stack):
        node.params["cat"] = True  # recorded by CSC, as a layer joining branches
    if node.kind == "move" and (target in (F.dropout, F.dropout1d, F.dropout2d, F.alpha_dropout)
                                or _target_name(target) == "stochastic_depth"):
        node.params["identity"] = True  # identities in eval, whatever their training argument says
        source = node.inputs[0]
        node.run = lambda env, replace: replace.get(source, env[source])
    if node.kind == "product":
        node.params["quotient"] = target in _QUOTIENTS or target in ("div", "__truediv__")
        node.params["pair"] = _pair_runner(fx_node, fx_to_name, slots)
        node.params["operands"] = [fx_to_name[_slot_value(fx_node, slot)] for slot in slots]
    if node.kind == "activation":
        node.params["function"] = _target_name(target)
    if node.kind == "softmax":
        dim = fx_node.kwargs.get("dim", fx_node.args[1] if len(fx_node.args) > 1 else None)
        if not isinstance(dim, int):
            raise AttributionError(f"softmax at node {node.name!r} needs a constant int dim")
        node.params["dim"] = dim
    if node.kind == "norm":
        node.params["norm"] = _functional_norm(fx_node, fx_to_name, node.name)


def _slot_value(fx_node: torch.fx.Node, slot: tuple) -> Any:
    if slot[0] == "k":
        return fx_node.kwargs[slot[1]]
    value = fx_node.args[slot[0]]
    return value[slot[1]] if len(slot) == 2 else value


def _pair_runner(fx_node: torch.fx.Node, fx_to_name: dict, slots: list) -> Callable[[dict, Any, Any], Any]:
    """``pair(env, a, b)``: the product with its first signal operand set to ``a`` and its second to ``b``
    (the other arguments from ``env``): what the product rules differentiate, operand by operand."""
    args, kwargs, resolve = _resolver(fx_node, fx_to_name)
    invoke = _invoker(fx_node)

    def pair(env, a, b):
        values, named = list(resolve(args, env, {})), dict(resolve(kwargs, env, {}))
        for slot, operand in zip(slots, (a, b)):
            if slot[0] == "k":
                named[slot[1]] = operand
            elif len(slot) == 1:
                values[slot[0]] = operand
            else:
                inner = list(values[slot[0]])
                inner[slot[1]] = operand
                values[slot[0]] = inner
        return invoke(values, named)

    return pair


def _invoker(fx_node: torch.fx.Node) -> Callable[[list, dict], Any]:
    """Call the node's function or method on resolved arguments (in-place forms made out-of-place)."""
    target: Any = fx_node.target
    if fx_node.op == "call_method":
        method = target.rstrip("_") if target.endswith("_") and not target.endswith("__") else target
        return lambda values, named: getattr(values[0], method)(*values[1:], **named)
    function: Any = _OUT_OF_PLACE.get(target, target)
    return lambda values, named: function(*values, **named)


_OUT_OF_PLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                 operator.itruediv: operator.truediv, torch.relu_: torch.relu}


def _functional_norm(fx_node: torch.fx.Node, fx_to_name: dict, name: str) -> dict | None:
    """For F.layer_norm / F.group_norm: their arguments by name (node references as _Ref); None for modules."""
    if fx_node.op != "call_function":
        return None
    names = ("input", "normalized_shape", "weight", "bias", "eps") if fx_node.target is F.layer_norm \
        else ("input", "num_groups", "weight", "bias", "eps")
    args, kwargs, _ = _resolver(fx_node, fx_to_name)
    bound = dict(zip(names, args)) | kwargs
    bound["type"] = "layer" if fx_node.target is F.layer_norm else "group"
    bound.setdefault("eps", 1e-5)
    return bound


def _fuse_tuples(nodes: list[Node], fx_graph: torch.fx.Graph, fx_to_name: dict) -> list[Node]:
    """Ops that return a tuple of signals (chunk, split, unbind) are fused into each ``getitem`` that reads
    them: the getitem node computes ``op(...)[i]`` from the op's own inputs. The tuple node goes."""
    by_name = {n.name: n for n in nodes}
    tuples = {fx_to_name[f] for f in fx_graph.nodes if f.target in _TUPLE_TARGETS and fx_to_name.get(f) in by_name
              and by_name[fx_to_name[f]].kind == "move"}
    if not tuples:
        return nodes
    out = []
    for node in nodes:
        if node.name in tuples:
            continue
        if any(i in tuples for i in node.inputs):
            if len(node.inputs) != 1 or node.kind != "move":
                raise AttributionError(f"node {node.name!r} reads the tuple of {node.inputs[0]!r} other than by "
                                       "indexing it; index the pieces (a, b = x.chunk(2)) before using them")
            parent = by_name[node.inputs[0]]
            own = node.run

            def run(env, replace, parent=parent, own=own, name=node.inputs[0]):
                return own({**env, name: parent.evaluate(env, replace)}, {})

            node.inputs, node.run = parent.inputs, run
        out.append(node)
    return out


_MAX = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_AVG = ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
_POOL_MODULES: dict[Any, tuple[type[nn.Module], tuple[str, ...]]] = {
    F.max_pool1d: (nn.MaxPool1d, _MAX), F.max_pool2d: (nn.MaxPool2d, _MAX),
    F.avg_pool1d: (nn.AvgPool1d, _AVG[:-1]), F.avg_pool2d: (nn.AvgPool2d, _AVG),
    F.adaptive_avg_pool1d: (nn.AdaptiveAvgPool1d, ("input", "output_size")),
    F.adaptive_avg_pool2d: (nn.AdaptiveAvgPool2d, ("input", "output_size"))}


def _pool_module(fx_node: torch.fx.Node, name: str) -> nn.Module:
    """An equivalent pooling module for a functional pooling call (arguments bound by name)."""
    cls, names = _POOL_MODULES[fx_node.target]
    bound = dict(zip(names, fx_node.args)) | dict(fx_node.kwargs)
    bound.pop("input", None)
    if any(isinstance(v, torch.fx.Node) for v in bound.values()) or set(bound) - set(names):
        raise AttributionError(f"pooling at node {name!r} has non-constant or unknown arguments; use a pooling module")
    if bound.pop("return_indices", False):
        raise AttributionError(f"pooling at node {name!r} returns indices; only the pooled tensor is supported")
    return cls(**bound)


def _resolver(fx_node: torch.fx.Node, fx_to_name: dict) -> tuple[Any, dict, Callable[[Any, dict, dict], Any]]:
    """The call's arguments with node references as names, and a function resolving them from env / replace."""
    as_ref: Any = lambda n: _Ref(fx_to_name[n])  # noqa: E731 - fx's map_arg types its callback narrowly
    args = torch.fx.node.map_arg(fx_node.args, as_ref)
    kwargs = dict(torch.fx.node.map_arg(fx_node.kwargs, as_ref))
    kwargs.pop("inplace", None)

    def resolve(value, env, replace):
        if isinstance(value, _Ref):
            return replace[value.name] if value.name in replace else env[value.name]
        if isinstance(value, (list, tuple)):
            items = [resolve(v, env, replace) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if isinstance(value, slice):
            return slice(resolve(value.start, env, replace), resolve(value.stop, env, replace),
                         resolve(value.step, env, replace))
        if isinstance(value, dict):
            return {k: resolve(v, env, replace) for k, v in value.items()}
        return value

    return args, kwargs, resolve


@dataclass(frozen=True)
class _Ref:
    """A reference to another node's value inside a call's arguments."""

    name: str


def _evaluator(fx_node: torch.fx.Node, fx_to_name: dict) -> Callable[[dict, dict], Any]:
    """Run the original function or method on the computed values (in-place forms made out-of-place)."""
    if fx_node.target is torch._assert:
        return lambda env, replace: None  # the traced model's own check: nothing to compute
    args, kwargs, resolve = _resolver(fx_node, fx_to_name)
    invoke = _invoker(fx_node)
    return lambda env, replace: invoke(list(resolve(args, env, replace)), resolve(kwargs, env, replace))


def _module_runner(fx_node: torch.fx.Node, fx_to_name: dict, module: nn.Module) -> Callable[[dict, dict], Any]:
    """A leaf module's forward on the computed values; ``forward``, not ``__call__``, so no hook runs."""
    args, kwargs, resolve = _resolver(fx_node, fx_to_name)
    return lambda env, replace: module.forward(*resolve(args, env, replace), **resolve(kwargs, env, replace))


def _fold_batchnorm(graph: Graph) -> Graph:
    """Fold each BatchNorm whose input is a conv / linear used only by it into that layer."""
    drop: dict[str, str] = {}
    for node in graph.nodes:
        if node.kind != "affine" or len(node.inputs) != 1:
            continue
        src = graph.by_name[node.inputs[0]]
        if src.kind in ("conv", "dense") and src.bn is None and graph.consumers[src.name] == [node.name]:
            src.bn = node.module
            drop[node.name] = src.name
    if not drop:
        return graph
    nodes = []
    for node in graph.nodes:
        if node.name in drop:
            continue
        node.aliases.update({i: drop[i] for i in node.inputs if i in drop})
        node.inputs = tuple(drop.get(i, i) for i in node.inputs)
        nodes.append(node)
    for bn_name, src_name in drop.items():  # the forward pass also stores the value under the BatchNorm's name
        graph.by_name[src_name].params.setdefault("folded", []).append(bn_name)
    return Graph(nodes, drop.get(graph.output, graph.output))
