"""The traced graph: every op of ``model(x)`` as a node, canonicalised for the rules.

``trace(model, x)`` captures the model with ``torch.export`` (:mod:`attributions.capture`: the
model is not changed and none of its hooks runs) and maps each exported op to a node *kind*
(:mod:`attributions.kinds`): through one table (:data:`OPS`) where the op's name decides, through
:meth:`_Builder.describe` where its arguments do (a convolution, a BatchNorm in eval or training mode, a
product of two signals). The pieces of split / chunk ops are fused into their readers as they are built; then
the named graph passes (:data:`PASSES`) run in order: the gating operands of products marked, eval-mode
BatchNorm folded into the conv / linear layer before it. In-place ops are computed out-of-place. Weights and
other parameters are read from the live model at call time (:class:`OpTensors`), so an explainer always
sees their current values.

Only nodes that carry the signal (floating tensors computed from the input) get a kind that a rule
acts on. Everything else is computed in the forward pass and held constant in the backward pass:
``value`` nodes (sizes, shapes, asserts) and ``const`` nodes (parameters, buffers, tensors made
in ``forward`` and anything computed from them alone).

Node names are the module paths users know: an op that is what its module computes (the
convolution of an ``nn.Conv2d``, the ReLU of an ``nn.ReLU``) takes the module's name
(``layer4.1.conv2``); any other op ``<module path>.<op>`` (``layer1.0.add``); a repeated name gets
``#1``, ``#2``...

Words, one meaning each: a *layer* is a signal-carrying node (what :attr:`Graph.layers` lists, CSC records
and ``propagate`` injects at); the tensors a weighted op reads are its :class:`OpTensors`; the interface the
rules see a weighted op through is a :class:`~attributions.linear_ops.LinearOp`; a randomization *stage*
(:mod:`audit.checks.stages`) is the set of modules re-initialised together.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
import torch.fx
from torch import nn

from attributions import attention
from attributions.capture import Capture, capture, is_view
from attributions.errors import AttributionError
from attributions.kinds import LINEAR_KINDS, SIGNAL_KINDS, check, default
from attributions.records import Activation, Const, LeakyReLU, Mix, Move, Norm, Product, Record, Reduce, Softmax


@dataclass
class Node:
    """One op.

    ``inputs`` names the signal-carrying nodes it reads (in argument order, each once); ``run(env,
    replace)`` computes its value from the values of all nodes it reads, with ``replace`` overriding
    some of them (the backward passes of the generic rules differentiate through it). ``record`` is
    what its kind records about the op (:mod:`attributions.records`: a softmax's axis, a product's
    operands); ``reads`` the constant nodes it reads (parameters, masks); ``folded`` the BatchNorm
    nodes folded into it, whose value it now computes; ``tokens``: its value's last axis is the
    channel axis (attention's nodes: per head and token, a vector of the head's width).
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    module: Any = None  # the OpTensors (conv, dense, affine) or a pooling module (maxpool, avgpool)
    bn: Any = None  # the OpTensors of an eval-mode BatchNorm folded after this conv / linear
    run: Callable[..., Any] | None = None
    record: Record | None = None  # None: the kind's default record
    reads: tuple[str, ...] = ()
    folded: tuple[str, ...] = ()
    tokens: bool = False
    # inputs renamed by BatchNorm folding: {name the traced call reads: node that now computes it}
    aliases: dict[str, str] = field(default_factory=dict)
    path: str = ""  # the module the op ran in ("" for the model's own forward), as named in the model
    fused: attention.Fused | None = None  # an attention's output node: its nodes as one op (attributions.fusion)
    # a dense node whose output other nodes read only as this many pieces, through data movement alone (the packed
    # query / key / value projection of an attention): a rule that holds some of them leaves blocks of its
    # output's gradient zero, which its transpose need not multiply (attributions.linear_ops.DenseOp)
    pieces: int = 0

    def __post_init__(self) -> None:
        if self.record is None:
            self.record = default(self.kind)
        check(self.name, self.kind, self.record)

    @property
    def is_identity(self) -> bool:
        """Whether the node passes its value on unchanged (dropout in eval, an alias)."""
        return isinstance(self.record, Move) and self.record.identity

    @property
    def is_reshape(self) -> bool:
        return isinstance(self.record, Move) and self.record.reshape

    @property
    def is_elementwise_mix(self) -> bool:
        return isinstance(self.record, Mix) and self.record.elementwise

    def evaluate(self, env: dict[str, Any], replace: dict[str, Any] | None = None) -> Any:
        """The node's value from ``env`` (and ``replace``, which wins over it)."""
        assert self.run is not None, f"node {self.name!r} of kind {self.kind!r} has no traced operation"
        replace = replace or {}
        if self.aliases:  # a replaced input must reach the call under the name it was traced with
            replace = {**replace, **{old: replace[new] for old, new in self.aliases.items() if new in replace}}
        return self.run(env, replace)


class Graph:
    """The canonical graph of a model at one input shape: nodes in forward (topological) order.

    Attributes
    ----------
    nodes : list of Node, the first of kind ``input``
    output : str, name of the node whose value the model returns
    shape : the input shape it was captured at (B, C, H, W); ``dynamic_batch``: whether it serves
        every batch size
    """

    def __init__(self, nodes: list[Node], output: str, shape: tuple[Any, ...] = (), dynamic_batch: bool = True,
                 batch_sized: bool = False):
        self.nodes = nodes
        # whether the graph computes sizes from the batch (attention merging batch and heads): a
        # reference pass must then run at the batch's size, not as one image broadcast against it
        self.batch_sized = batch_sized or not dynamic_batch
        self.output = output
        self.shape = tuple(shape)
        self.dynamic_batch = dynamic_batch
        self.by_name = {n.name: n for n in nodes}
        self.consumers: dict[str, list[str]] = {n.name: [] for n in nodes}
        for n in nodes:
            for i in n.inputs:
                self.consumers[i].append(n.name)

    @property
    def layers(self) -> list[str]:
        """Names of the signal-carrying nodes, in forward order (the input excluded)."""
        return [n.name for n in self.nodes if n.kind in SIGNAL_KINDS]

    def accepts(self, shape: torch.Size | tuple[Any, ...]) -> bool:
        """Whether inputs of ``shape`` (B, ...) run on this graph (sizes other than the batch are specialised)."""
        shape = tuple(shape)
        return shape[1:] == self.shape[1:] and (self.dynamic_batch or shape[0] == self.shape[0])

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

    def weighted_layers(self) -> list[tuple[str, nn.Module, nn.Module | None]]:
        """The modules whose weights the conv, dense and affine nodes read, once each in forward
        order: (module path, the module, the folded BatchNorm's module or None)."""
        seen: set[int] = set()
        out = []
        for node in self.nodes:
            if node.kind in ("conv", "dense", "affine") and node.module.module is not None \
                    and id(node.module.module) not in seen:
                seen.add(id(node.module.module))
                out.append((node.module.path, node.module.module, node.bn.module if node.bn is not None else None))
        return out

    def parameter_uses(self) -> dict[str, int]:
        """{name of a model parameter or buffer: index into ``nodes`` of the first signal node whose
        value depends on it}: the forward order of the model's tensors (a tensor no signal node reads
        is absent)."""
        sources: dict[str, frozenset[str]] = {}  # a constant node: the model tensors it is computed from
        first: dict[str, int] = {}
        for k, node in enumerate(self.nodes):
            attribute = node.record.attribute if isinstance(node.record, Const) else None
            names = {attribute} if attribute is not None else set()
            for r in node.reads:
                names |= sources.get(r, frozenset())
            if node.kind not in SIGNAL_KINDS:
                sources[node.name] = frozenset(names)
                continue
            for tensors in (node.module, node.bn):  # a folded BatchNorm's tensors are read through its own
                if isinstance(tensors, OpTensors) and tensors.module is not None:
                    names |= {f"{tensors.path}.{n}" if tensors.path else n
                              for n, _ in tensors.module.named_parameters(recurse=False)}
            for n in names:
                first.setdefault(n, k)
        return first


# --- live views of a weighted op's tensors ---------------------------------------------------------

class OpTensors:
    """The tensors one conv / linear / BatchNorm op reads, looked up in the live model at every use.

    ``tensor(role)`` gives "weight", "bias" (and for BatchNorm "running_mean", "running_var") or
    None; ``sources()`` the model tensors they are computed from (for caches of derived weights);
    ``module`` the module holding the weight (what a randomization stage re-initialises), ``path``
    its name.
    """

    def __init__(self, getters: dict[str, Callable[[], torch.Tensor | None]], sources: Callable[[], list[torch.Tensor]],
                 module: nn.Module | None, path: str, **static: Any):
        self._getters, self._sources = getters, sources
        self.module, self.path = module, path
        self.padding_mode = "zeros"
        for k, v in static.items():
            setattr(self, k, v)

    def tensor(self, role: str) -> torch.Tensor | None:
        get = self._getters.get(role)
        return get() if get is not None else None

    def sources(self) -> list[torch.Tensor]:
        return [t for t in self._sources() if isinstance(t, torch.Tensor) and t.is_floating_point()]

    weight = property(lambda self: self.tensor("weight"))
    bias = property(lambda self: self.tensor("bias"))
    running_mean = property(lambda self: self.tensor("running_mean"))
    running_var = property(lambda self: self.tensor("running_var"))

    @property
    def kernel_size(self) -> tuple[int, ...]:
        return tuple(self.weight.shape[2:])

    @property
    def out_channels(self) -> int:
        return int(self.weight.shape[0])

    out_features = out_channels

    @property
    def in_channels(self) -> int:
        return int(self.weight.shape[1]) * getattr(self, "groups", 1)

    @property
    def num_features(self) -> int:
        return int((self.weight if self.weight is not None else self.running_mean).shape[0])


# --- what each exported op is ----------------------------------------------------------------------

_ACTIVATIONS = {"gelu", "silu", "hardswish", "hardsigmoid", "sigmoid", "tanh", "hardtanh", "relu6", "elu", "celu",
                "selu", "mish", "softplus", "log_sigmoid", "exp", "sqrt", "rsqrt", "reciprocal", "log", "erf", "abs",
                "square", "pow", "prelu", "clamp", "clamp_min", "clamp_max", "sin", "cos", "glu_jvp"}
_MOVES = {"view", "reshape", "_unsafe_view", "permute", "transpose", "t", "flatten", "unflatten", "squeeze",
          "unsqueeze", "expand", "expand_as", "repeat", "cat", "concat", "stack", "select", "slice", "narrow",
          "contiguous", "clone", "pad", "constant_pad_nd", "reflection_pad1d", "reflection_pad2d",
          "replication_pad1d", "replication_pad2d", "roll", "flip", "alias", "movedim", "tile", "index_select",
          "index", "gather", "_to_copy", "to", "type_as", "dropout", "feature_dropout", "alpha_dropout",
          "upsample_nearest1d", "upsample_nearest2d", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle",
          "repeat_interleave", "unfold", "im2col", "split", "split_with_sizes", "chunk", "unbind", "tensor_split",
          "swapaxes", "diagonal", "as_strided", "zero_pad2d", "mT", "mH", "T", "H", "adjoint", "conj",
          "real", "resolve_conj", "resolve_neg", "lift_fresh_copy"}
_MIXES = {"add", "sub", "rsub", "neg", "mul", "div", "mean", "sum", "matmul", "bmm", "mm", "einsum", "addmm",
          "baddbmm", "upsample_bilinear2d", "upsample_bicubic2d", "upsample_linear1d", "masked_fill", "where",
          "cumsum", "linear", "avg_pool3d", "col2im"}
_ELEMENTWISE = {"add", "sub", "rsub", "neg", "mul", "div", "masked_fill", "where"}  # mixes cheap to recompute
# ops that make a tensor from a signal's shape, dtype or device only: constants of the backward pass
_SHAPE_ONLY = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "zeros_like", "ones_like", "full_like",
               "empty_like", "rand_like", "randn_like", "scalar_tensor"}
# nonlinear reductions of one signal over some of its axes (a Reduce record's dims, None for all)
_REDUCTIONS = {"linalg_vector_norm": 2, "norm": 2, "amax": 1, "amin": 1, "max": 1, "min": 1, "logsumexp": 1, "var": 1,
               "std": 1}
# higher-order ops whose subgraph is built inline: where its submodule sits among the arguments
_REGIONS = {"wrap_with_autocast": 4, "wrap_with_set_grad_enabled": 1}
_PRODUCTS = {"mul", "matmul", "bmm", "mm", "einsum", "div"}
_LIKE = {"reshape_as", "view_as", "expand_as", "type_as"}  # a move shaped by a second tensor
_RESHAPES = {"view", "reshape", "_unsafe_view", "flatten", "unflatten", "contiguous"}
_IDENTITIES = {"dropout", "feature_dropout", "alpha_dropout", "alias"}
_TUPLES = {"split", "split_with_sizes", "chunk", "unbind", "tensor_split"}
_POOLS = {"max_pool2d": "maxpool", "max_pool1d": "maxpool", "avg_pool2d": "avgpool", "avg_pool1d": "avgpool",
          "adaptive_avg_pool2d": "avgpool", "adaptive_avg_pool1d": "avgpool"}
_SIMPLE = {"relu": "relu", "leaky_relu": "leaky_relu", "conv2d": "conv", "conv1d": "conv", "convolution": "conv",
           "linear": "dense", "layer_norm": "norm", "group_norm": "norm", "softmax": "softmax", "_softmax": "softmax",
           **_POOLS}
# Activations whose output gates another signal in a product (LRP's "gate as constant" convention).
GATES = {"sigmoid", "hardsigmoid", "softmax"}
# the torch.nn layers whose name their main op takes, with the kind of that op
_LEAF_KINDS = {"Linear": "dense", "Conv1d": "conv", "Conv2d": "conv", "BatchNorm1d": "affine", "BatchNorm2d": "affine",
               "ReLU": "relu", "LeakyReLU": "leaky_relu", "MaxPool1d": "maxpool", "MaxPool2d": "maxpool",
               "AvgPool1d": "avgpool", "AvgPool2d": "avgpool", "AdaptiveAvgPool1d": "avgpool",
               "AdaptiveAvgPool2d": "avgpool", "Flatten": "move", "Unflatten": "move", "Dropout": "move",
               "Dropout1d": "move", "Dropout2d": "move", "AlphaDropout": "move", "Softmax": "softmax",
               "LayerNorm": "norm", "GroupNorm": "norm", "ConvTranspose1d": "mix", "ConvTranspose2d": "mix",
               **{m: "activation" for m in (
                   "ReLU6", "ELU", "CELU", "SELU", "GELU", "SiLU", "Mish", "Hardswish", "Hardsigmoid", "Hardtanh",
                   "Sigmoid", "Tanh", "Softplus", "LogSigmoid")}}

@dataclass(frozen=True)
class OpKind:
    """What an op is wherever it appears: its node ``kind`` and ``record(op)``; ``single``: only when it acts on
    one signal (an activation of two signals, x ** y, is no activation)."""

    kind: str
    record: Callable[[str], Record]
    single: bool = True


# The ops whose kind and record follow from their name alone, keyed by name (the overload packet's, without
# the in-place underscore); those whose kind depends on their arguments (a convolution, a BatchNorm in eval
# or training mode, a product of two signals, a residual sum) are told apart in _Builder.describe.
OPS: dict[str, OpKind] = {
    **{op: OpKind("mix", lambda op: Mix(elementwise=op in _ELEMENTWISE), single=False) for op in _MIXES},
    **{op: OpKind("move", lambda op: Move(reshape=op in _RESHAPES, identity=op in _IDENTITIES)) for op in _MOVES},
    # a concatenation joins branches (CSC records it), of any number of signals
    **{op: OpKind("move", lambda op: Move(cat=True), single=False) for op in ("cat", "concat", "stack")},
    **{op: OpKind("activation", Activation) for op in _ACTIVATIONS},
    "relu": OpKind("relu", lambda op: default("relu")),
}

SUPPORTED = ("the torch-level ops torch.export records: " + ", ".join(sorted(
    set(_SIMPLE) | _ACTIVATIONS | _MOVES | _MIXES | set(_REDUCTIONS) | {
        "batch_norm", "scaled_dot_product_attention", "maximum", "minimum", "conv_transpose1d", "conv_transpose2d",
        "addcmul", "addcdiv"})) +
    "; sizes, shapes and asserts")


def _op_name(target: Any) -> str:
    """The op's name without overload and without the in-place underscore: "relu" for aten.relu_.default."""
    name = getattr(target, "__name__", str(target))
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        name = packet.__name__
    return name[:-1] if name.endswith("_") and not name.endswith("__") and name != "_" else name


def _in_place(target: Any) -> bool:
    """Whether ``target`` is an in-place aten op (aten.relu_.default, aten.copy_.default)."""
    packet = getattr(target, "_overloadpacket", None)
    return packet is not None and packet.__name__.endswith("_") and not packet.__name__.endswith("__")


def _functional(target: Any) -> Any:
    """The out-of-place overload of an in-place aten op (aten.relu_.default -> aten.relu.default)."""
    if not _in_place(target):
        return target
    packet = target._overloadpacket
    base = getattr(torch.ops.aten, packet.__name__[:-1], None)
    overload = getattr(base, target._overloadname, None) if base is not None else None
    if overload is None:
        raise AttributionError(f"in-place op {target} has no out-of-place form the engine can compute")
    return overload


@dataclass(frozen=True)
class _Ref:
    """A reference to another node's value inside an op's arguments."""

    name: str


def _resolve(value: Any, env: dict[str, Any], replace: dict[str, Any]) -> Any:
    """``value`` (an op's arguments) with its node references replaced by their values."""
    if isinstance(value, _Ref):
        return replace[value.name] if value.name in replace else env[value.name]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, env, replace) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, env, replace) for k, v in value.items()}
    return value


def _under_views(value: Any) -> tuple[list[torch.fx.Node], Any]:
    """(the views ``value`` is taken through, outermost last; the tensor under them): ``x[:, 1:].view(...)``
    gives ([view, slice], x); a value that is no view gives ([], value)."""
    chain = []
    while isinstance(value, torch.fx.Node) and value.op == "call_function" and is_view(value) \
            and not _in_place(value.target) and value.args and isinstance(value.args[0], torch.fx.Node):
        chain.append(value)
        value = value.args[0]
    return chain, value


def _through(tensor: torch.Tensor, steps: list[tuple[Any, Any, Any]], env: dict[Any, Any],
             replace: dict[Any, Any]) -> torch.Tensor:
    """``tensor`` taken through the views ``steps`` ((op, args, kwargs), innermost first)."""
    for target, args, kwargs in steps:
        tensor = target(tensor, *_resolve(args, env, replace), **_resolve(kwargs, env, replace))
    return tensor


def _runner(function: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Callable[[dict[Any, Any], dict[Any, Any]], Any]:
    """``function(*args, **kwargs)`` with node references resolved from env / replace."""
    return lambda env, replace: function(*_resolve(args, env, replace), **_resolve(kwargs, env, replace))


def _shared(run: Callable[[dict[Any, Any], dict[Any, Any]], Any], key: tuple[str, str], inputs: tuple[str, ...],
            readers: int) -> Callable[[dict[Any, Any], dict[Any, Any]], Any]:
    """``run`` (a split-like op's call) made once per pass for the ``readers`` nodes that each take one of its
    pieces: held in the pass's values under ``key`` with the input values it was made from (another input, a
    recorded leaf, makes it anew), until every reader has taken its piece. Autograd then has one backward node
    for all the pieces, which assembles their gradients at once, where each piece's own call would fill a whole
    input-sized gradient with zeros around its piece and add them up."""
    def pieces(env: dict[Any, Any], replace: dict[Any, Any]) -> Any:
        now = tuple(replace[i] if i in replace else env[i] for i in inputs)
        held = env.get(key)
        if held is None or any(a is not b for a, b in zip(held[0], now)):
            held = env[key] = [now, run(env, replace), 0]
        held[2] += 1
        if held[2] >= readers:
            del env[key]
        return held[1]
    return pieces


def _select_group(fx_node: torch.fx.Node) -> tuple[int, int, int] | None:
    """(dim, index, size) of an ``aten.select`` whose input is read only by selects along that dim, one for each
    index (the packed query, key and value of ``nn.MultiheadAttention``): pieces of one ``unbind``; else None."""
    parent, dim, index = (fx_node.args + (None, None, None))[:3]
    if not isinstance(parent, torch.fx.Node) or not isinstance(dim, int) or not isinstance(index, int):
        return None
    val = parent.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    dim, size = dim % val.dim(), val.shape[dim]
    if not isinstance(size, int):
        return None
    taken = []
    for user in parent.users:
        if _op_name(user.target) != "select" or len(user.args) < 3 or not isinstance(user.args[2], int) or \
                not isinstance(user.args[1], int) or user.args[1] % val.dim() != dim:
            return None
        taken.append(user.args[2] % size)
    return (dim, index % size, size) if sorted(taken) == list(range(size)) else None


class _Builder:
    """Turns the exported graph into nodes (one pass over its ops, in order)."""

    def __init__(self, captured: Capture):
        self.c = captured
        self.nodes: list[Node] = []
        self.names: dict[torch.fx.Node, str] = {}
        self.signal: set[str] = set()
        self.taken: dict[str, int] = {}
        # split-like ops and max / min along an axis, fused into their getitems: (run, signals, record of
        # the floating piece: None for a move, a reduction's otherwise)
        self.tuples: dict[torch.fx.Node, tuple[Callable[..., Any], tuple[str, ...], Reduce | None]] = {}
        self.by_name: dict[str, Node] = {}
        self.order: dict[torch.fx.Node, float] = {n: i for i, n in enumerate(captured.graph.nodes)}
        self.regions: dict[torch.fx.Node, list[Any]] = {}  # an inlined region's outputs, read by its getitems
        self.no_grad = 0  # inside a torch.no_grad() region: its ops' values are constants of the backward pass
        self.writers: dict[str, list[str]] = {}  # const node -> the in-place ops on it (or on its views)

    def unique(self, name: str) -> str:
        count = self.taken.get(name, 0)
        self.taken[name] = count + 1
        return name if count == 0 else f"{name}#{count}"

    def add(self, node: Node, fx_node: torch.fx.Node | None = None) -> Node:
        if node.kind == "input":  # the graph's first node, before the parameters export lists first
            self.nodes.insert(0, node)
        else:
            self.nodes.append(node)
        self.by_name[node.name] = node
        if fx_node is not None:
            self.names[fx_node] = node.name
            node.path = node.path or self.c.module_path(fx_node)
        if node.kind in SIGNAL_KINDS or node.kind == "input":
            self.signal.add(node.name)
        return node

    def ref(self, value: Any) -> Any:
        as_ref: Any = lambda n: _Ref(self.names[n])  # noqa: E731 - fx's map_arg types its callback narrowly
        return torch.fx.node.map_arg(value, as_ref)

    def constant(self, name: str) -> Any:
        """A const / value node's current value, computed from the model's tensors alone: the nodes it
        reads and those that write into them in place (``bias[n:2 * n].zero_()``), in graph order."""
        need: set[str] = set()
        stack = [name]
        while stack:
            n = stack.pop()
            if n not in need:
                need.add(n)
                stack += [*self.by_name[n].reads, *self.writers.get(n, ())]
        env: dict[str, Any] = {}
        for node in self.nodes:
            if node.name in need:
                env[node.name] = node.evaluate(env)
        return env[name]

    def upstream(self, fx_node: Any) -> list[str]:
        """The parameter / buffer placeholders a const value is computed from."""
        out, frontier, seen = [], [fx_node], set()
        while frontier:
            n = frontier.pop()
            if not isinstance(n, torch.fx.Node) or n in seen:
                continue
            seen.add(n)
            if n.op == "placeholder":
                out.append(n.name)
            frontier += n.all_input_nodes
        return out

    # --- the pass ----------------------------------------------------------------------------------

    def build(self) -> Graph:
        for fx_node in self.c.graph.nodes:
            if fx_node.op == "placeholder":
                self.placeholder(fx_node)
            elif fx_node.op == "call_function":
                self.call(fx_node)
        out = self.c.output
        name = self.names.get(out) if isinstance(out, torch.fx.Node) else None
        if name is None or name not in self.signal:
            raise AttributionError("the model must return one tensor computed from its input (the logits)")
        graph = Graph(self.nodes, name, self.c.shape, self.c.dynamic_batch, self.batch_sized())
        for graph_pass in PASSES:
            graph = graph_pass(graph)
        return graph

    def batch_sized(self) -> bool:
        """Whether a size the graph computes depends on the batch size (a symbolic batch), or a value merges
        the batch with another axis (LeViT's and Swin's (B * n, ...) views): one image of a reference
        cannot be broadcast against such a value."""
        val = next(n for n in self.c.graph.nodes if n.name == self.c.input).meta.get("val")
        batch = val.shape[0] if isinstance(val, torch.Tensor) else None
        if not isinstance(batch, torch.SymInt):
            return False
        expr = batch.node.expr
        symbol = expr.free_symbols
        for fx_node in self.c.graph.nodes:
            v = fx_node.meta.get("val")
            if fx_node.op == "call_function" and isinstance(v, torch.SymInt) and fx_node.target is not \
                    torch.ops.aten.sym_size.int and symbol & v.node.expr.free_symbols:
                return True
            if isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) and d.node.expr != expr
                                                   and symbol & d.node.expr.free_symbols for d in v.shape):
                return True
        return False

    def placeholder(self, fx_node: torch.fx.Node) -> None:
        source = self.c.sources[fx_node.name]
        if source.kind == "input":
            self.add(Node("input", "input", ()), fx_node)
            return
        name = self.unique(source.target if source.kind != "constant" else f"constant.{source.target}")
        get = self.c.value
        owner = source.target.rsplit(".", 1)[0] if source.kind != "constant" and "." in source.target else ""
        self.add(Node(name, "const", (), run=lambda env, replace, p=fx_node.name: get(p),
                      record=Const(source.target), path=owner), fx_node)

    def call(self, fx_node: torch.fx.Node) -> None:
        target = fx_node.target
        reads = [self.names[a] for a in fx_node.all_input_nodes if a in self.names]
        # autograd gives no gradient through .detach() or under torch.no_grad(): what they compute is a constant
        stopped = self.no_grad > 0 or _op_name(target) == "detach"
        signals = () if stopped else tuple(dict.fromkeys(r for r in reads if r in self.signal))
        if target is operator.getitem and fx_node.args[0] in self.tuples:
            self.piece(fx_node)
            return
        if target is operator.getitem and fx_node.args[0] in self.regions:
            self.names[fx_node] = self.names[self.regions[cast(Any, fx_node.args[0])][cast(int, fx_node.args[1])]]
            return
        if getattr(target, "__name__", "") in _REGIONS:
            self.inline(fx_node)
            return
        val = fx_node.meta.get("val")
        # a tuple with any floating tensor (sort's values and indices) carries the signal too
        is_float = isinstance(val, torch.Tensor) and val.is_floating_point() or (
            isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in val))
        op = _op_name(target)
        if not signals or not is_float or op in _SHAPE_ONLY:
            kind = "const" if isinstance(val, torch.Tensor) or (isinstance(val, (tuple, list)) and val and
                                                                 isinstance(val[0], torch.Tensor)) else "value"
            name = self.unique(self.path_name(fx_node, op, None))
            # constants are recomputed in order at every pass, so their in-place ops run as written: a mask
            # filled slice by slice (Swin's) is read through the tensor it was written into
            node = Node(name, kind, (), run=_runner(cast(Any, target), self.ref(fx_node.args), self.ref(fx_node.kwargs)),
                        reads=tuple(reads))
            self.add(node, fx_node)
            if _in_place(target):  # a write (zero_, fill_...) into the tensor under the views it is made through
                written = _under_views(fx_node.args[0])[1]
                if written in self.names:
                    self.writers.setdefault(self.names[written], []).append(name)
            return
        if op == "scaled_dot_product_attention":
            self.attention(fx_node)
            return
        if op in _TUPLES or (op in ("max", "min") and isinstance(val, tuple)):  # max.dim: (values, indices)
            run = _runner(_functional(target), self.ref(fx_node.args), self.ref(fx_node.kwargs))
            self.tuples[fx_node] = (run, signals, None if op in _TUPLES else _reduction(fx_node, op))
            return
        if _in_place(target):
            chain, base = _under_views(fx_node.args[0])
            if chain and self.names.get(base) in self.signal and any(self.order[u] > self.order[fx_node]
                                                                     for u in base.users):
                self.write_through(fx_node, op, chain)
                return
            self.check_out_of_place(fx_node)
        kind, record, module = self.describe(fx_node, op, signals)
        first = fx_node.args[0] if fx_node.args else None
        if op in _LIKE and isinstance(first, torch.fx.Node) and self.names.get(first) in self.signal:
            signals = (self.names[first],)  # the other tensor gives only a shape or dtype
        name = self.unique(self.path_name(fx_node, op, kind))
        run = _runner(_functional(target), self.ref(fx_node.args), self.ref(fx_node.kwargs))
        group = _select_group(fx_node) if op == "select" and signals else None
        if group is not None:
            dim, index, size = group
            parent = self.names[cast(Any, fx_node.args[0])]
            unbind = _shared(_runner(torch.ops.aten.unbind.int, (_Ref(parent), dim), {}), (parent, "pieces"),
                             (parent,), size)
            if index == 0:
                self.mark_packed(cast(Any, fx_node.args[0]), size)

            def run(env: dict[str, Any], replace: dict[str, Any]) -> Any:
                return unbind(env, replace)[index]
        if isinstance(record, Move) and record.identity:
            source = signals[0]

            def run(env: dict[str, Any], replace: dict[str, Any]) -> Any:
                return replace.get(source, env[source])
        constants = tuple(r for r in reads if r not in self.signal)  # the constants it reads (parameters)
        self.add(Node(name, kind, signals, module=module, run=run, record=record, reads=constants), fx_node)

    def check_out_of_place(self, fx_node: torch.fx.Node) -> None:
        """An in-place op on a signal is computed out of place: refused when a later op reads the
        tensor it overwrote, or a view of it, which would then see the old values (export already
        routes later uses of the tensor itself to the op's result)."""
        order = self.order
        aliases, frontier = set(), [fx_node.args[0]]
        while frontier:  # the tensor and the views taken of it
            n = frontier.pop()
            if isinstance(n, torch.fx.Node) and n not in aliases:
                aliases.add(n)
                frontier += [u for u in n.users if u is not fx_node and u.op == "call_function" and is_view(u)
                             and u.args and u.args[0] is n]
        later = [u for a in aliases for u in a.users if u is not fx_node and u not in aliases
                 and order[u] > order[fx_node]]
        if later:
            raise AttributionError(f"in-place {fx_node.target} at {self.c.module_path(fx_node) or 'the model'!r} "
                                   f"overwrites a tensor that {later[0].name!r} reads afterwards; the engine computes "
                                   "ops out of place: use the op's result (y = x.relu_()) or its out-of-place form")

    def inline(self, fx_node: torch.fx.Node) -> None:
        """The ops of a region export keeps as a subgraph (``with torch.autocast(enabled=False)``, a grad
        mode), built in place: inside it they compute as anywhere else (the casts it makes are ops too)."""
        kind = getattr(fx_node.target, "__name__", "")
        at = _REGIONS[kind]
        where = self.c.module_path(fx_node) or "the model"
        if kind == "wrap_with_autocast" and fx_node.args[2]:
            raise AttributionError(f"an enabled torch.autocast region at {where!r}: the engine computes in the "
                                   "model's own dtypes; explain the model with autocast disabled")
        sub = getattr(self.c.graph_module, cast(Any, fx_node.args[at]).target)
        inputs = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for placeholder, operand in zip(inputs, fx_node.args[at + 1:]):
            if not isinstance(operand, torch.fx.Node) or operand not in self.names:
                raise AttributionError(f"a {kind} region at {where!r} takes an argument the engine cannot follow")
            self.names[placeholder] = self.names[operand]
        ops = list(sub.graph.nodes)
        for k, n in enumerate(ops):  # between the region's op and the next
            self.order[n] = self.order[fx_node] + (k + 1) / (len(ops) + 1)
        frozen = kind == "wrap_with_set_grad_enabled" and not fx_node.args[0]  # torch.no_grad(): no gradient flows
        self.no_grad += frozen
        try:
            for n in ops:
                if n.op == "call_function":
                    self.call(n)
                elif n.op == "get_attr":
                    raise AttributionError(f"a nested region inside the {kind} region at {where!r} is not supported")
        finally:
            self.no_grad -= frozen
        out = next(n for n in ops if n.op == "output").args[0]
        self.regions[fx_node] = list(out if isinstance(out, (tuple, list)) else [out])

    def write_through(self, fx_node: torch.fx.Node, op: str, chain: list[torch.fx.Node]) -> None:
        """An in-place op on a view of a signal that is read afterwards (``attn[:, :, 1:, 1:] = ...``, MViT
        v2): one node computes the whole tensor after the write (the op run on a clone, through the same
        views), and every later op that reads the tensor reads that node."""
        base = chain[-1].args[0]
        assert isinstance(base, torch.fx.Node)
        rest: Any = fx_node.args[1:]
        others = [self.names[a] for a in fx_node.all_input_nodes[1:] if self.names.get(a) in self.signal]
        where = f"in-place {fx_node.target} at {self.c.module_path(fx_node) or 'the model'!r}"
        if op == "copy" and len(others) == 1 and len(rest) >= 1 and self.names.get(rest[0]) in self.signal:
            kind = "move"  # values moved into place
        elif op in ("add", "sub") or (op in ("mul", "div") and not others):
            kind = "mix"  # linear in the tensor and what is added
        elif (op in _ACTIVATIONS or op in ("relu", "leaky_relu")) and not others:
            kind = "activation"  # element-wise: f on the view, the identity elsewhere
        else:
            raise AttributionError(f"{where} writes into a view of a signal: only copies, additions, scalings and "
                                   "element-wise activations are supported there; write the result out of place "
                                   "(torch.cat, slice_scatter)")
        later = [u for v in chain for u in v.users if u is not fx_node and u not in chain
                 and self.order[u] > self.order[fx_node]]
        if later:
            raise AttributionError(f"{where} overwrites a view that {later[0].name!r} reads afterwards; the engine "
                                   "computes in-place writes into a fresh tensor")
        steps: list[tuple[Any, Any, Any]] = [(v.target, self.ref(v.args[1:]), self.ref(v.kwargs)) for v in reversed(chain)]
        base_ref, args, kwargs, function = _Ref(self.names[base]), self.ref(rest), self.ref(fx_node.kwargs), fx_node.target

        def run(env: dict[str, Any], replace: dict[str, Any]) -> Any:
            out = _resolve(base_ref, env, replace).clone()
            cast(Any, function)(_through(out, steps, env, replace), *_resolve(args, env, replace),
                                **_resolve(kwargs, env, replace))
            return out
        name = self.unique(self.path_name(fx_node, op, None))
        reads = [self.names[a] for a in fx_node.all_input_nodes if a in self.names and self.names[a] not in self.signal]
        inputs = tuple(dict.fromkeys([self.names[base], *others]))
        record = Activation(op) if kind == "activation" else default(kind)
        self.add(Node(name, kind, inputs, run=run, record=record, reads=tuple(reads), path=self.c.module_path(fx_node)))
        self.names[base] = name  # later readers of the tensor see it written

        def view(env: dict[str, Any], replace: dict[str, Any]) -> Any:  # the op's own result: the view, as written
            return _through(_resolve(_Ref(name), env, replace), steps, env, replace)
        self.add(Node(self.unique(f"{name}.view"), "move", (name,), run=view, reads=tuple(reads)), fx_node)

    def path_name(self, fx_node: torch.fx.Node, op: str, kind: str | None) -> str:
        path = self.c.module_path(fx_node)
        leaf = self.c.module_type(fx_node)
        if kind is not None and leaf.startswith("torch.nn.modules.") and _LEAF_KINDS.get(leaf.rsplit(".", 1)[-1]) == kind:
            return path
        return f"{path}.{op}" if path else op

    def piece(self, fx_node: torch.fx.Node) -> None:
        parent: Any = fx_node.args[0]
        run, signals, reduction = self.tuples[parent]
        index: Any = fx_node.args[1]
        val = fx_node.meta.get("val")
        record: Record
        if not (isinstance(val, torch.Tensor) and val.is_floating_point()):  # max's indices: held constant
            kind, record = "const", Const()
        else:
            kind, record = ("move", Move()) if reduction is None else ("reduce", reduction)
        op = "getitem" if reduction is None else _op_name(parent.target)
        name = self.unique(self.path_name(fx_node, op, None))
        if signals:  # the pieces of one call: one backward node (the inputs are this call's signals)
            readers = sum(1 for u in parent.users if u.target is operator.getitem)
            run = _shared(run, (parent.name, "pieces of"), signals, readers)
            source = parent.args[0] if parent.args else None
            if index == 0 and isinstance(source, torch.fx.Node) and len(source.users) == 1:
                self.mark_packed(source, readers)
        self.add(Node(name, kind, signals if kind != "const" else (), run=lambda env, replace: run(env, replace)[index],
                      record=record, reads=signals if kind == "const" else ()), fx_node)

    def mark_packed(self, tensor: torch.fx.Node, pieces: int) -> None:
        """``tensor`` is read only as ``pieces`` pieces: the dense node it is computed from through single-reader data
        movement alone, if any, records how many (:attr:`Node.pieces`). Which blocks of the dense output the pieces
        are does not matter: the transpose tests its gradient's blocks for zeros, and only cost rides on the mark."""
        while True:
            node = self.by_name.get(self.names.get(tensor, ""))
            if node is None:
                return
            if node.kind == "dense":
                node.pieces = pieces if node.module.out_features % pieces == 0 else 0
                return
            source = tensor.args[0] if tensor.args else None
            if node.kind != "move" or len(node.inputs) != 1 or not isinstance(source, torch.fx.Node) \
                    or len(source.users) != 1:
                return
            tensor = source

    def attention(self, fx_node: torch.fx.Node) -> None:
        name = self.unique(self.path_name(fx_node, "attention", None))
        bound: dict[str, Any] = dict(zip(attention.SDPA_ARGUMENTS, fx_node.args)) | dict(fx_node.kwargs)
        operands, nodes = {}, {}
        for role in ("query", "key", "value"):
            arg = bound.get(role)
            if not isinstance(arg, torch.fx.Node) or self.names.get(arg) not in self.signal:
                raise AttributionError(f"attention at {name!r}: the {role} must be computed from the input")
            operands[role], nodes[role] = self.names[arg], arg
        bound = {k: (v if not isinstance(v, torch.fx.Node) else _Ref(self.names[v])) for k, v in bound.items()}
        specs = attention.sdpa_specs(name, bound, operands, self.signal)
        order = _layout(fx_node.meta.get("val"))
        mask = bound.get("attn_mask")
        query = nodes["query"].meta.get("val")
        sizes = [s if isinstance(s, int) else None for s in query.shape[-2:]] if isinstance(query, torch.Tensor) \
            else [None, None]
        fused = attention.fused_run(bound.get("scale"), mask.name if mask is not None else None)
        if order is not None:  # a view the model takes later may rely on the layout
            last = specs[-1]
            specs[-1] = (*last[:3], (lambda f: lambda env, replace: _laid_out(f(env, replace), order))(last[3]), last[4])
            fused = (lambda f: lambda env, q, k, v: _laid_out(f(env, q, k, v), order))(fused)
        for i, (suffix, kind, inputs, run, record) in enumerate(specs):
            own = name if i == len(specs) - 1 else f"{name}.{suffix}"
            self.taken[own] = self.taken.get(own, 0) + 1
            self.add(Node(own, kind, inputs, run=run, record=record, tokens=True, path=self.c.module_path(fx_node),
                          fused=attention.Fused(tuple(f"{name}.{s[0]}" for s in specs[:-1]), fused, *sizes)
                          if own == name else None))
        self.names[fx_node] = name

    def describe(self, fx_node: torch.fx.Node, op: str, signals: tuple[str, ...]) -> tuple[str, Record, Any]:
        """(kind, record, module) of an op on signals; a clear error for an op without a rule."""
        args: Any = fx_node.args
        kwargs: Any = fx_node.kwargs
        slots = self.slots(args)
        on_signal = [(i,) in slots for i in range(len(args))]  # the positional arguments that are signals
        where = f"{op} at {self.c.module_path(fx_node) or 'the model'}"
        transposed = op.startswith("conv_transpose") or (op == "convolution" and bool(args[6] if len(args) > 6 else
                                                                                       kwargs.get("transposed")))
        if transposed and on_signal[0] and not any(on_signal[1:]):
            # linear in the signal: exact adjoints, and LRP's z rule (its weights are not split by sign)
            return "mix", Mix(), None
        if op in ("conv2d", "conv1d", "convolution", "linear") and on_signal[0] and not any(on_signal[1:]):
            kind = "dense" if op == "linear" else "conv"
            return kind, default(kind), self.op_tensors(fx_node, op)
        if op == "batch_norm" and on_signal[0] and not any(on_signal[1:]):
            training = args[5] if len(args) > 5 else kwargs.get("training", False)
            if not training and args[3] is not None and args[4] is not None:
                return "affine", default("affine"), self.op_tensors(fx_node, op)
            return "norm", self.norm_spec(fx_node, "batch"), None
        if op in ("layer_norm", "group_norm") and on_signal[0] and not any(on_signal[1:]):
            return "norm", self.norm_spec(fx_node, op.split("_")[0]), None
        if op == "leaky_relu" and len(signals) == 1:
            return "leaky_relu", LeakyReLU(float(args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01))), None
        if op in _POOLS and len(signals) == 1:
            return _POOLS[op], default(_POOLS[op]), _pool_module(fx_node, op, where)
        if op in ("softmax", "_softmax") and len(signals) == 1:
            return "softmax", Softmax(int(args[1])), None
        if op == "add" and len(signals) == 2 and sum(on_signal) == 2 and args[0] is not args[1] \
                and kwargs.get("alpha", 1) == 1 and _same_shape(args[0], args[1], fx_node):
            return "add", default("add"), None  # a residual sum (a broadcasting one is a linear mix)
        if op in _PRODUCTS and len(slots) >= 2:
            if len(slots) != 2:
                raise AttributionError(f"{where}: a product of {len(slots)} signal operands is not supported")
            operands = cast(tuple[str, str], tuple(self.names[_at(args, slot)] for slot in slots))
            function = _functional(fx_node.target)
            ref_args = self.ref(args)
            ref_kwargs = self.ref(kwargs)

            def pair(env: dict[Any, Any], a: Any, b: Any, slots: list[tuple[int, ...]] = slots) -> Any:
                values = _resolve(ref_args, env, {})
                for slot, operand in zip(slots, (a, b)):
                    values = _put(values, slot, operand)
                return function(*values, **_resolve(ref_kwargs, env, {}))
            alone = slots == [(0,), (1,)] and len(args) == 2 and not kwargs
            return "product", Product(operands, pair, quotient=op == "div", op=op if alone else ""), None
        if op == "div" and on_signal == [False, True]:
            return "activation", Activation("div"), None  # c / x: element-wise nonlinear
        if op in _LIKE and on_signal[0]:  # the other tensor gives only a shape or dtype (the caller drops it)
            return "move", Move(reshape=op in ("reshape_as", "view_as")), None
        entry = OPS.get(op)
        if entry is not None and (len(signals) == 1 or not entry.single):
            return entry.kind, entry.record(op), None
        if op in ("addcmul", "addcdiv") and sum(on_signal[1:3]) <= 1 and not (op == "addcdiv" and on_signal[2]):
            return "mix", Mix(), None  # self + value * t1 * t2 (or / t2) with one signal factor: linear
        elementwise = op in ("maximum", "minimum") or getattr(fx_node.target, "_overloadname", "") == "other"
        if elementwise and len(signals) == 1:
            return "activation", Activation(op), None  # against a constant
        if op in _REDUCTIONS and not elementwise and len(signals) == 1 and on_signal[0]:
            return "reduce", _reduction(fx_node, op), None
        raise AttributionError(f"unsupported operation: {fx_node.target} on {len(signals)} signal(s) at node "
                               f"{self.path_name(fx_node, op, None)!r} (module {self.c.module_type(fx_node) or '?'}). "
                               f"Supported: {SUPPORTED}. Rewrite this part of the model with supported operations, "
                               "or explain a sub-model")

    def slots(self, args: tuple[Any, ...]) -> list[tuple[int, ...]]:
        """Where the arguments hold signals: (i,) for args[i], (i, j) for args[i][j] (einsum's operands).
        A signal passed twice (x * x) counts twice."""
        out: list[tuple[int, ...]] = []
        for i, a in enumerate(args):
            if isinstance(a, torch.fx.Node) and self.names.get(a) in self.signal:
                out.append((i,))
            elif isinstance(a, (list, tuple)):
                out += [(i, j) for j, b in enumerate(a) if isinstance(b, torch.fx.Node) and self.names.get(b) in self.signal]
        return out

    def getter(self, value: Any) -> Callable[[], Any]:
        """The current value of an op argument that is not a signal."""
        if not isinstance(value, torch.fx.Node):
            return lambda: value
        if value.op == "placeholder":
            name = value.name
            return lambda: self.c.value(name)
        const = self.names[value]
        return lambda: self.constant(const)

    def op_tensors(self, fx_node: torch.fx.Node, op: str) -> OpTensors:
        args: Any = list(fx_node.args)
        names = {"conv2d": ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
                 "convolution": ("input", "weight", "bias", "stride", "padding", "dilation", "transposed",
                                 "output_padding", "groups"),
                 "linear": ("input", "weight", "bias"),
                 "batch_norm": ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
                                "cudnn_enabled")}
        names["conv1d"] = names["conv2d"]
        bound: dict[str, Any] = dict(zip(names[op], args)) | dict(fx_node.kwargs)
        roles = ("weight", "bias", "running_mean", "running_var") if op == "batch_norm" else ("weight", "bias")
        getters = {r: self.getter(bound.get(r)) for r in roles if bound.get(r) is not None}
        tensors = [p for r in roles for p in self.upstream(bound.get(r))]
        live = self.c.value
        fqns = [self.c.sources[p].target for p in tensors if self.c.sources[p].kind == "parameter"]
        owner = fqns[0].rsplit(".", 1)[0] if fqns and "." in fqns[0] else ""
        module = self.c.model.get_submodule(owner) if fqns else None
        static: dict[str, Any] = {}
        if op != "linear" and op != "batch_norm":
            d = 1 if op == "conv1d" else len(fx_node.meta["val"].shape) - 2
            static = {"stride": _ints(bound.get("stride", 1), d), "dilation": _ints(bound.get("dilation", 1), d),
                      "groups": int(bound.get("groups", 1)),
                      "padding": bound.get("padding", 0) if isinstance(bound.get("padding"), str)
                      else _ints(bound.get("padding", 0), d)}
        if op == "batch_norm":
            static = {"eps": float(bound.get("eps", 1e-5))}
        return OpTensors(getters, lambda: [live(p) for p in tensors], module, owner, **static)

    def norm_spec(self, fx_node: torch.fx.Node, kind: str) -> Norm:
        names = {"layer": ("input", "normalized_shape", "weight", "bias", "eps"),
                 "group": ("input", "num_groups", "weight", "bias", "eps"),
                 "batch": ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")}
        bound: dict[str, Any] = dict(zip(names[kind], self.ref(fx_node.args))) | dict(self.ref(fx_node.kwargs))
        bound.pop("input", None)
        bound.setdefault("eps", 1e-5)
        return Norm(kind, bound)


def _layout(val: Any) -> tuple[int, ...] | None:
    """The axes of a traced tensor from outermost to innermost in memory, when that is not their order
    (sdpa returns (B, H, L, D) laid out as (B, L, H, D)); None when contiguous or not known."""
    if not isinstance(val, torch.Tensor):
        return None
    # a symbolic stride (one holding the batch size) by its example value: int() would specialise the batch
    strides = [s.node.hint if isinstance(s, torch.SymInt) else int(s) for s in val.stride()]
    if any(s is None for s in strides):
        return None
    order = tuple(sorted(range(len(strides)), key=lambda d: (-strides[d], d)))
    return None if order == tuple(range(len(strides))) else order


def _laid_out(t: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """``t``'s values laid out in memory in ``order`` (as :func:`_layout` gives it)."""
    inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    return t.permute(order).contiguous().permute(inverse)


def _reduction(fx_node: torch.fx.Node, op: str) -> Reduce:
    """A reduction's record: its axes, or None for all."""
    args: Any = fx_node.args
    position = _REDUCTIONS[op]  # where the axes sit among the arguments
    dims: Any = args[position] if len(args) > position else fx_node.kwargs.get("dim")
    if isinstance(dims, int):
        dims = (dims,)
    return Reduce(tuple(int(d) for d in dims) if dims else None)


def _same_shape(*nodes: torch.fx.Node) -> bool:
    shapes = [getattr(n.meta.get("val"), "shape", None) for n in nodes]
    return shapes[0] is not None and all(s == shapes[0] for s in shapes)


def _at(args: tuple[Any, ...], slot: tuple[int, ...]) -> Any:
    return args[slot[0]] if len(slot) == 1 else args[slot[0]][slot[1]]


def _put(args: Any, slot: tuple[int, ...], value: Any) -> tuple[Any, ...]:
    """``args`` with the argument at ``slot`` replaced by ``value``."""
    out = list(args)
    if len(slot) == 1:
        out[slot[0]] = value
    else:
        inner = list(out[slot[0]])
        inner[slot[1]] = value
        out[slot[0]] = type(args[slot[0]])(inner)
    return tuple(out)


def _ints(value: Any, d: int) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value) if len(value) == d else tuple(int(value[0]) for _ in range(d))
    return tuple(int(value) for _ in range(d))


_POOL_ARGS = {"max_pool2d": (nn.MaxPool2d, ("kernel_size", "stride", "padding", "dilation", "ceil_mode")),
              "max_pool1d": (nn.MaxPool1d, ("kernel_size", "stride", "padding", "dilation", "ceil_mode")),
              "avg_pool2d": (nn.AvgPool2d, ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                                            "divisor_override")),
              "avg_pool1d": (nn.AvgPool1d, ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")),
              "adaptive_avg_pool2d": (nn.AdaptiveAvgPool2d, ("output_size",)),
              "adaptive_avg_pool1d": (nn.AdaptiveAvgPool1d, ("output_size",))}


def _pool_module(fx_node: torch.fx.Node, op: str, where: str) -> nn.Module:
    """An equivalent pooling module for an exported pooling op (arguments bound by name)."""
    cls, names = _POOL_ARGS[op]
    bound = dict(zip(names, fx_node.args[1:])) | dict(fx_node.kwargs)
    if any(isinstance(v, torch.fx.Node) for v in bound.values()):
        raise AttributionError(f"{where}: pooling with non-constant arguments is not supported")
    if "stride" in bound and not bound["stride"]:  # aten's empty stride means the kernel size
        bound.pop("stride")
    bound = {k: tuple(v) if isinstance(v, list) else v for k, v in bound.items()}
    module: nn.Module = cls(**bound)
    return module


# --- graph passes: Graph -> Graph, in order, each with its own test ---------------------------------

def mark_gates(graph: Graph) -> Graph:
    """For each product, which operands a gating function computed (its record's ``gates``), data movement after
    it included: written-out attentions (timm's Swin, XCiT, CoaT...) pass their weights through an eval-mode
    dropout, and a gate moved is still the gate."""
    def producer(name: str) -> Node:
        node = graph.by_name[name]
        while node.kind == "move" and len(node.inputs) == 1:
            node = graph.by_name[node.inputs[0]]
        return node

    for node in graph.nodes:
        if isinstance(node.record, Product):
            producers = [producer(name) for name in node.record.operands]
            gates = tuple(p.kind == "softmax" or (isinstance(p.record, Activation) and p.record.function in GATES)
                          for p in producers)
            node.record = replace(node.record, gates=cast(tuple[bool, bool], gates))
    return graph


def fold_batchnorm(graph: Graph) -> Graph:
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
        if isinstance(node.record, Product):  # a product's operand names name its inputs too
            operands = cast(tuple[str, str], tuple(drop.get(o, o) for o in node.record.operands))
            node.record = replace(node.record, operands=operands)
        nodes.append(node)
    for bn_name, src_name in drop.items():  # the forward pass also stores the value under the BatchNorm's name
        graph.by_name[src_name].folded += (bn_name,)
    return Graph(nodes, drop.get(graph.output, graph.output), graph.shape, graph.dynamic_batch, graph.batch_sized)


# the fusion of split / chunk pieces into their readers happens as the graph is built (_Builder.piece)
PASSES: tuple[Callable[[Graph], Graph], ...] = (mark_gates, fold_batchnorm)


def trace(model: nn.Module, x: torch.Tensor) -> Graph:
    """Capture ``model`` at inputs shaped like ``x`` (B, ...) into a canonical :class:`Graph`.

    Raises
    ------
    AttributionError
        When export cannot capture the model, or an op has no rule (naming the node, the op and the
        supported set).
    """
    if not isinstance(x, torch.Tensor):
        raise AttributionError(f"trace needs an example input tensor (B, ...), got {type(x).__name__}")
    return _Builder(capture(model, x.detach())).build()
