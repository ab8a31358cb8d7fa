"""The traced graph: every call site of a model as a node, canonicalised for the rules.

``trace(model)`` runs ``torch.fx`` symbolic tracing (the model itself is not changed), maps each
call site to a node *kind*, folds eval-mode BatchNorm into the conv / linear layer before it,
and treats in-place operations as out-of-place (the engine computes every node functionally).
Weights are read from the model at call time, so an explainer always sees its current values.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from attributions.errors import AttributionError

SUPPORTED = ("Conv1d, Conv2d, Linear, BatchNorm1d/2d (folded into the conv / linear before it, else an "
             "affine node), ReLU (module, functional, in-place), LeakyReLU, MaxPool1d/2d, AvgPool1d/2d, "
             "AdaptiveAvgPool1d/2d, Flatten / view / reshape / flatten, residual + (add), cat, Dropout, Identity")

# Kinds whose output is linear in the input (plus a bias): the layers LRP rules act on.
LINEAR_KINDS = ("dense", "conv", "affine", "avgpool")


@dataclass
class Node:
    """One call site. ``inputs`` names the nodes whose tensors it reads (in argument order)."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    module: nn.Module | None = None
    bn: nn.Module | None = None  # an eval-mode BatchNorm folded after this conv / linear
    evaluate: Callable[[dict], Any] | None = None  # shape ops and non-tensor values: run the original op
    params: dict = field(default_factory=dict)


_MODULE_KINDS: list[tuple[tuple[type, ...], str]] = [
    ((nn.Linear,), "dense"),
    ((nn.Conv1d, nn.Conv2d), "conv"),
    ((nn.BatchNorm1d, nn.BatchNorm2d), "affine"),
    ((nn.ReLU,), "relu"),
    ((nn.LeakyReLU,), "leaky_relu"),
    ((nn.MaxPool1d, nn.MaxPool2d), "maxpool"),
    ((nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d), "avgpool"),
    ((nn.Flatten, nn.Unflatten), "reshape"),
    ((nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Identity), "pass"),
]
_FUNCTION_KINDS = {
    operator.add: "add", torch.add: "add", operator.iadd: "add",
    F.relu: "relu", torch.relu: "relu", torch.relu_: "relu",
    F.leaky_relu: "leaky_relu",
    torch.flatten: "reshape", torch.reshape: "reshape",
    torch.cat: "cat", torch.concat: "cat",
    F.max_pool1d: "maxpool", F.max_pool2d: "maxpool",
    F.avg_pool1d: "avgpool", F.avg_pool2d: "avgpool",
    F.adaptive_avg_pool1d: "avgpool", F.adaptive_avg_pool2d: "avgpool",
    F.dropout: "pass",
    operator.getitem: "value", getattr: "value",
}
_METHOD_KINDS = {"view": "reshape", "reshape": "reshape", "flatten": "reshape", "contiguous": "pass",
                 "relu": "relu", "relu_": "relu", "add": "add", "add_": "add", "size": "value", "dim": "value"}


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
        """Names of the tensor-valued nodes, in forward order (the input excluded)."""
        return [n.name for n in self.nodes if n.kind not in ("input", "value")]

    def first_layers(self) -> set[str]:
        """Linear nodes that read the input directly (through shape-only nodes)."""
        out, frontier = set(), [self.nodes[0].name]
        while frontier:
            for c in self.consumers[frontier.pop()]:
                kind = self.by_name[c].kind
                if kind in LINEAR_KINDS:
                    out.add(c)
                elif kind in ("reshape", "pass"):
                    frontier.append(c)
        return out


def _module_kind(module: nn.Module) -> str | None:
    for types, kind in _MODULE_KINDS:
        if isinstance(module, types):
            return kind
    return None


def _path_name(fx_node: torch.fx.Node) -> str:
    stack = fx_node.meta.get("nn_module_stack") or {}
    prefix = ""
    if stack:
        path = list(stack.values())[-1]
        path = path[0] if isinstance(path, tuple) else path
        prefix = f"{path}." if path else ""
    base = fx_node.name.rstrip("_0123456789") or fx_node.name
    return prefix + base


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
        gm = torch.fx.symbolic_trace(model)
    except Exception as exc:  # fx raises several types for data-dependent control flow
        raise AttributionError(
            f"could not trace {type(model).__name__} with torch.fx ({type(exc).__name__}: {exc}). The engine "
            "needs a forward without data-dependent Python control flow; move such logic out of forward "
            "or wrap it in a module") from None
    modules = dict(model.named_modules())
    nodes: list[Node] = []
    fx_to_name: dict[torch.fx.Node, str] = {}
    taken: dict[str, int] = {}
    output = None

    def unique(name: str) -> str:
        count = taken.get(name, 0)
        taken[name] = count + 1
        return name if count == 0 else f"{name}#{count}"

    for fx_node in gm.graph.nodes:
        tensor_inputs = tuple(fx_to_name[a] for a in fx_node.all_input_nodes)
        if fx_node.op == "placeholder":
            if nodes:
                raise AttributionError(f"the model takes more than one input ({fx_node.name!r}); the engine "
                                       "explains single-input models")
            fx_to_name[fx_node] = "input"
            nodes.append(Node("input", "input", ()))
            continue
        if fx_node.op == "output":
            arg = fx_node.args[0]
            if not isinstance(arg, torch.fx.Node):
                raise AttributionError("the model must return one tensor (the logits), not a tuple or dict")
            output = fx_to_name[arg]
            continue
        if fx_node.op == "call_module":
            module = modules[fx_node.target]
            kind = _module_kind(module)
            name, what = unique(fx_node.target), f"module {fx_node.target!r} of type {type(module).__name__}"
        elif fx_node.op == "call_function":
            module, kind = None, _FUNCTION_KINDS.get(fx_node.target)
            name = unique(_path_name(fx_node))
            what = f"function {getattr(fx_node.target, '__name__', fx_node.target)!r} at node {name!r}"
        elif fx_node.op == "call_method":
            module, kind = None, _METHOD_KINDS.get(fx_node.target)
            name = unique(_path_name(fx_node))
            what = f"method Tensor.{fx_node.target} at node {name!r}"
        else:
            module, kind, name = None, None, fx_node.name
            what = f"{fx_node.op} {fx_node.target!r} (a parameter or constant used in forward)"
        if kind is None:
            raise AttributionError(f"unsupported operation: {what}. Supported: {SUPPORTED}. Rewrite this part "
                                   "of the model with supported layers, or explain a sub-model")
        if kind == "add" and len(tensor_inputs) != 2:
            raise AttributionError(f"node {name!r} adds a constant to a tensor; only tensor + tensor (residual) "
                                   "adds are supported")
        if kind in ("maxpool", "avgpool") and module is None:
            module = _pool_module(fx_node, name)
        node = Node(name, kind, tensor_inputs, module)
        if kind in ("reshape", "value", "cat") and module is None:
            node.evaluate = _evaluator(fx_node, fx_to_name)
        if kind == "leaky_relu":
            slope = module.negative_slope if module is not None else fx_node.kwargs.get(
                "negative_slope", fx_node.args[1] if len(fx_node.args) > 1 else 0.01)
            node.params["negative_slope"] = float(slope)
        if kind == "cat":
            node.params["dim"] = fx_node.kwargs.get("dim", fx_node.args[1] if len(fx_node.args) > 1 else 0)
        fx_to_name[fx_node] = name
        nodes.append(node)
    if output is None:
        raise AttributionError("the traced model returns nothing")
    return _fold_batchnorm(Graph(nodes, output))


_MAX = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_AVG = ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
_POOL_MODULES: dict[Callable[..., Any] | str, tuple[type[nn.Module], tuple[str, ...]]] = {
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


def _evaluator(fx_node: torch.fx.Node, fx_to_name: dict) -> Callable[[dict], Any]:
    """Run the original operation on the computed values (in-place methods made out-of-place)."""
    args = torch.fx.node.map_arg(fx_node.args, lambda n: fx_to_name[n])
    kwargs = dict(torch.fx.node.map_arg(fx_node.kwargs, lambda n: fx_to_name[n]))
    kwargs.pop("inplace", None)
    names = set(fx_to_name.values())

    def resolve(value, env):
        if isinstance(value, str) and value in names and value in env:
            return env[value]
        if isinstance(value, (list, tuple)):
            return type(value)(resolve(v, env) for v in value)
        return value

    target = fx_node.target
    if fx_node.op == "call_method":
        assert isinstance(target, str)  # torch.fx: a call_method's target is the method name
        method = target.rstrip("_") if target.endswith("_") else target
        return lambda env: getattr(resolve(args[0], env), method)(*resolve(args[1:], env), **resolve(kwargs, env))
    assert callable(target)  # only call_function nodes remain (the caller passes no module nodes)
    return lambda env: target(*resolve(args, env), **{k: resolve(v, env) for k, v in kwargs.items()})


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
        node.inputs = tuple(drop.get(i, i) for i in node.inputs)
        nodes.append(node)
    return Graph(nodes, drop.get(graph.output, graph.output))
