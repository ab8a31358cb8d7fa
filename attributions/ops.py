"""The op table: what each exported op is, as data.

An op of the exported graph that computes from signals is classified by :data:`SPECS`, an ordered table of
:class:`OpSpec` entries: the first entry that accepts the op's occurrence (:class:`Call`: its name, which of its
arguments are signals) gives its node kind (:mod:`attributions.kinds`), its record (:mod:`attributions.records`)
and, for a weighted op or a pooling, the tensors or module it computes with; no entry accepting is the
toolkit's error naming the node, the op and :data:`SUPPORTED`, which lists the table's op names. Entries are keyed
by the op's name (its overload packet's, without the in-place underscore); where the name does not decide (a
convolution, a BatchNorm in eval or training mode, a product of two signals, a residual sum), the entry's
``accepts`` reads the arguments. Adding an op is one entry here and its test. In-place ops are found from
their schema (:func:`in_place`).

Ops that shape the graph rather than compute a value (attention, split-like ops whose pieces are fused into
their readers, regions export keeps as subgraphs) are built by :class:`attributions.graph._Builder` itself;
their names are in :data:`STRUCTURAL`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.fx
from torch import nn

from attributions.errors import AttributionError
from attributions.kinds import Kind, default
from attributions.records import Activation, LeakyReLU, Mix, Move, Norm, Product, Record, Reduce, Softmax
from attributions.refs import resolve

if TYPE_CHECKING:
    from attributions.op_tensors import OpTensors

ACTIVATIONS = frozenset({
    "gelu", "silu", "hardswish", "hardsigmoid", "sigmoid", "tanh", "hardtanh", "relu6", "elu", "celu", "selu", "mish",
    "softplus", "log_sigmoid", "exp", "sqrt", "rsqrt", "reciprocal", "log", "erf", "abs", "square", "pow", "prelu",
    "clamp", "clamp_min", "clamp_max", "sin", "cos", "glu_jvp"})
MOVES = frozenset({
    "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "flatten", "unflatten", "squeeze", "unsqueeze",
    "expand", "expand_as", "repeat", "select", "slice", "narrow", "contiguous", "clone", "pad", "constant_pad_nd",
    "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d", "roll", "flip", "alias",
    "movedim", "tile", "index_select", "index", "gather", "_to_copy", "to", "type_as", "dropout", "feature_dropout",
    "alpha_dropout", "upsample_nearest1d", "upsample_nearest2d", "pixel_shuffle", "pixel_unshuffle",
    "channel_shuffle", "repeat_interleave", "unfold", "im2col", "split", "split_with_sizes", "chunk", "unbind",
    "tensor_split", "swapaxes", "diagonal", "as_strided", "zero_pad2d", "mT", "mH", "T", "H", "adjoint", "conj",
    "real", "resolve_conj", "resolve_neg", "lift_fresh_copy"})
JOINS = frozenset({"cat", "concat", "stack"})  # data movement that joins branches (CSC records it)
MIXES = frozenset({
    "add", "sub", "rsub", "neg", "mul", "div", "mean", "sum", "matmul", "bmm", "mm", "einsum", "addmm", "baddbmm",
    "upsample_bilinear2d", "upsample_bicubic2d", "upsample_linear1d", "masked_fill", "where", "cumsum", "linear",
    "avg_pool3d", "col2im"})
ELEMENTWISE = frozenset({"add", "sub", "rsub", "neg", "mul", "div", "masked_fill", "where"})  # cheap to recompute
RESHAPES = frozenset({"view", "reshape", "_unsafe_view", "flatten", "unflatten", "contiguous"})
IDENTITIES = frozenset({"dropout", "feature_dropout", "alpha_dropout", "alias"})
PRODUCTS = frozenset({"mul", "matmul", "bmm", "mm", "einsum", "div"})
LIKE = frozenset({"reshape_as", "view_as", "expand_as", "type_as"})  # a move shaped by a second tensor
TUPLES = frozenset({"split", "split_with_sizes", "chunk", "unbind", "tensor_split"})
# ops that make a tensor from a signal's shape, dtype or device only: constants of the backward pass
SHAPE_ONLY = frozenset({"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "zeros_like", "ones_like",
                        "full_like", "empty_like", "rand_like", "randn_like", "scalar_tensor"})
# nonlinear reductions of one signal over some of its axes: where the axes sit among the arguments
REDUCTIONS = {"linalg_vector_norm": 2, "norm": 2, "amax": 1, "amin": 1, "max": 1, "min": 1, "logsumexp": 1, "var": 1,
              "std": 1}
POOLS = {"max_pool2d": Kind.MAXPOOL, "max_pool1d": Kind.MAXPOOL, "avg_pool2d": Kind.AVGPOOL,
         "avg_pool1d": Kind.AVGPOOL, "adaptive_avg_pool2d": Kind.AVGPOOL, "adaptive_avg_pool1d": Kind.AVGPOOL}
CONVOLUTIONS = frozenset({"conv2d", "conv1d", "convolution"})
NORMS = frozenset({"layer_norm", "group_norm"})
SOFTMAXES = frozenset({"softmax", "_softmax"})
# ops the graph builder handles itself, by what they do to the graph
STRUCTURAL = frozenset({"scaled_dot_product_attention", *TUPLES})
# Activations whose output gates another signal in a product (LRP's "gate as constant" convention).
GATES = frozenset({"sigmoid", "hardsigmoid", "softmax"})

Described = tuple[Kind, Record, "OpTensors | nn.Module | None"]


class Reader(Protocol):
    """What an entry reads from the graph being built."""

    def ref(self, value: Any) -> Any:
        """``value`` (op arguments) with each fx node replaced by a reference to its graph node's value."""

    def name_of(self, value: torch.fx.Node) -> str:
        """The graph node that computes ``value``."""

    def op_tensors(self, fx_node: torch.fx.Node, op: str) -> OpTensors:
        """The live tensors of a convolution, linear layer or BatchNorm."""


@dataclass(frozen=True)
class Call:
    """One occurrence of an op on signals, as the table's entries read it.

    Parameters
    ----------
    node : the exported op
    op : its name (:func:`op_name`)
    signals : the signal nodes it reads, once each
    slots : where its arguments hold signals, (i,) for args[i] and (i, j) for args[i][j], a repeated one each time
    where : the op and its module, for errors
    reader : the graph being built
    """

    node: torch.fx.Node
    op: str
    signals: tuple[str, ...]
    slots: tuple[tuple[int, ...], ...]
    where: str
    reader: Reader

    @property
    def args(self) -> tuple[Any, ...]:
        return tuple(self.node.args)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.node.kwargs)

    @property
    def on_signal(self) -> list[bool]:
        """For each positional argument, whether it is a signal."""
        return [(i,) in self.slots for i in range(len(self.node.args))]

    @property
    def alone(self) -> bool:
        """The first argument is a signal and no other argument is (a layer applied to its input)."""
        on = self.on_signal
        return bool(on) and on[0] and not any(on[1:])

    @property
    def single(self) -> bool:
        """It reads one signal."""
        return len(self.signals) == 1

    def argument(self, position: int, keyword: str, fallback: Any = None) -> Any:
        """The argument at ``position``, else the keyword ``keyword``, else ``fallback``."""
        args = self.node.args
        return args[position] if len(args) > position else self.node.kwargs.get(keyword, fallback)


@dataclass(frozen=True)
class OpSpec:
    """One entry of the op table.

    Parameters
    ----------
    ops : the op names it covers (None: any op, its ``accepts`` deciding)
    make : the (kind, record, op tensors or pooling module) of an accepted occurrence
    accepts : whether it is this occurrence's entry
    about : when it applies and what it makes, for the docs' op list
    """

    ops: frozenset[str] | None
    make: Callable[[Call], Described]
    accepts: Callable[[Call], bool]
    about: str

    def matches(self, call: Call) -> bool:
        """Whether the entry is ``call``'s: it covers the op's name and accepts the occurrence."""
        return (self.ops is None or call.op in self.ops) and self.accepts(call)


def _plain(kind: Kind) -> Callable[[Call], Described]:
    return lambda call: (kind, default(kind), None)


def _transposed(call: Call) -> bool:
    return call.op.startswith("conv_transpose") or (call.op == "convolution" and bool(call.argument(6, "transposed")))


def _eval_batch_norm(call: Call) -> bool:
    return not call.argument(5, "training", False) and call.argument(3, "running_mean") is not None \
        and call.argument(4, "running_var") is not None


_NORM_ARGUMENTS = {"layer": ("input", "normalized_shape", "weight", "bias", "eps"),
                   "group": ("input", "num_groups", "weight", "bias", "eps"),
                   "batch": ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")}


def _norm(call: Call) -> Described:
    """A normalisation computing its statistics from the signal, its other arguments by name."""
    kind = "batch" if call.op == "batch_norm" else call.op.split("_")[0]
    bound: dict[str, Any] = dict(zip(_NORM_ARGUMENTS[kind], call.reader.ref(call.args))) \
        | dict(call.reader.ref(call.kwargs))
    bound.pop("input", None)
    bound.setdefault("eps", 1e-5)
    return Kind.NORM, Norm(kind, bound), None


def _weighted(call: Call) -> Described:
    kind = {"linear": Kind.DENSE, "batch_norm": Kind.AFFINE}.get(call.op, Kind.CONV)
    return kind, default(kind), call.reader.op_tensors(call.node, call.op)


def _residual(call: Call) -> bool:
    """A sum of two distinct signals of one shape (a broadcasting one is a linear mix)."""
    args = call.args
    return len(call.signals) == 2 and sum(call.on_signal) == 2 and args[0] is not args[1] \
        and call.kwargs.get("alpha", 1) == 1 and _same_shape(args[0], args[1], call.node)


def _product(call: Call) -> Described:
    """A product or quotient of two signals: its record computes the op on any two operands."""
    if len(call.slots) != 2:
        raise AttributionError(f"{call.where}: a product of {len(call.slots)} signal operands is not supported")
    args, kwargs, slots = call.args, call.kwargs, call.slots
    operands = (call.reader.name_of(_at(args, slots[0])), call.reader.name_of(_at(args, slots[1])))
    function = functional(call.node.target)
    ref_args, ref_kwargs = call.reader.ref(args), call.reader.ref(kwargs)
    def pair(env: dict[str, Any], a: Any, b: Any) -> Any:
        values = resolve(ref_args, env, {})
        for slot, operand in zip(slots, (a, b)):
            values = _put(values, slot, operand)
        return function(*values, **resolve(ref_kwargs, env, {}))
    alone = slots == ((0,), (1,)) and len(args) == 2 and not kwargs
    return Kind.PRODUCT, Product(operands, pair, quotient=call.op == "div", op=call.op if alone else ""), None


def _by_name(kind: Kind, record: Callable[[str], Record]) -> Callable[[Call], Described]:
    return lambda call: (kind, record(call.op), None)


def _against_constant(call: Call) -> bool:
    """An element-wise op of a signal and a constant (maximum, minimum, an op's ``.other`` overload)."""
    return call.single and (call.op in ("maximum", "minimum")
                            or getattr(call.node.target, "_overloadname", "") == "other")


SPECS: tuple[OpSpec, ...] = (
    # linear in the signal: exact adjoints, and LRP's z rule (its weights are not split by sign)
    OpSpec(frozenset({"conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution"}), _plain(Kind.MIX),
           lambda c: _transposed(c) and c.alone, "a transposed convolution of the signal: a linear mix"),
    OpSpec(CONVOLUTIONS | {"linear"}, _weighted, lambda c: c.alone,
           "a convolution or linear layer of the signal: conv / dense, its weights read live"),
    OpSpec(frozenset({"batch_norm"}), _weighted, lambda c: c.alone and _eval_batch_norm(c),
           "BatchNorm with running statistics in eval mode: affine (folded into the layer before it)"),
    OpSpec(frozenset({"batch_norm"}) | NORMS, _norm, lambda c: c.alone,
           "BatchNorm in training mode or without running statistics, LayerNorm, GroupNorm: norm"),
    OpSpec(frozenset({"leaky_relu"}), lambda c: (Kind.LEAKY_RELU,
                                                 LeakyReLU(float(c.argument(1, "negative_slope", 0.01))), None),
           lambda c: c.single, "leaky ReLU of one signal"),
    OpSpec(frozenset(POOLS), lambda c: (POOLS[c.op], default(POOLS[c.op]), _pool_module(c)),
           lambda c: c.single, "max and average pooling of one signal, with constant arguments"),
    OpSpec(SOFTMAXES, lambda c: (Kind.SOFTMAX, Softmax(int(c.args[1])), None), lambda c: c.single,
           "softmax of one signal"),
    OpSpec(frozenset({"add"}), _plain(Kind.ADD), _residual, "a residual sum of two signals of one shape"),
    OpSpec(PRODUCTS, _product, lambda c: len(c.slots) >= 2,
           "a product or quotient of two signals (more than two: refused)"),
    OpSpec(frozenset({"div"}), lambda c: (Kind.ACTIVATION, Activation("div"), None),
           lambda c: c.on_signal == [False, True], "a constant divided by a signal: element-wise nonlinear"),
    # the other tensor gives only a shape or dtype (the builder drops it from the inputs)
    OpSpec(LIKE, lambda c: (Kind.MOVE, Move(reshape=c.op in ("reshape_as", "view_as")), None),
           lambda c: c.on_signal[0], "data movement shaped like another tensor"),
    OpSpec(MIXES, _by_name(Kind.MIX, lambda op: Mix(elementwise=op in ELEMENTWISE)), lambda c: True,
           "linear ops without a layer's weights, of any number of signals: mix"),
    OpSpec(JOINS, _by_name(Kind.MOVE, lambda op: Move(cat=True)), lambda c: True,
           "a concatenation or stack of any number of signals: a move that joins branches"),
    OpSpec(MOVES, _by_name(Kind.MOVE, lambda op: Move(reshape=op in RESHAPES, identity=op in IDENTITIES)),
           lambda c: c.single, "data movement of one signal: move"),
    OpSpec(ACTIVATIONS, _by_name(Kind.ACTIVATION, Activation), lambda c: c.single,
           "element-wise nonlinearities of one signal: activation"),
    OpSpec(frozenset({"relu"}), _plain(Kind.RELU), lambda c: c.single, "ReLU of one signal"),
    OpSpec(frozenset({"addcmul", "addcdiv"}), _plain(Kind.MIX),
           lambda c: sum(c.on_signal[1:3]) <= 1 and not (c.op == "addcdiv" and c.on_signal[2:3] == [True]),
           "self + value * t1 * t2 (or / t2) with at most one signal factor: linear"),
    OpSpec(frozenset({"maximum", "minimum"}), lambda c: (Kind.ACTIVATION, Activation(c.op), None),
           lambda c: c.single, "the element-wise maximum or minimum of a signal and a constant"),
    OpSpec(None, lambda c: (Kind.ACTIVATION, Activation(c.op), None), _against_constant,
           "any other element-wise op of a signal and a constant (an ``.other`` overload)"),
    OpSpec(frozenset(REDUCTIONS), lambda c: (Kind.REDUCE, reduction(c.node, c.op), None),
           lambda c: c.single and c.on_signal[:1] == [True] and not _against_constant(c),
           "norms, maxima, minima, logsumexp, variance of one signal over some axes: reduce"),
)

SUPPORTED = ("the torch-level ops torch.export records: " + ", ".join(sorted(
    set().union(*(spec.ops for spec in SPECS if spec.ops is not None), STRUCTURAL))) + "; sizes, shapes and asserts")


def classify(call: Call, label: str, module_type: str) -> Described:
    """(kind, record, op tensors or pooling module) of ``call``: the first entry of :data:`SPECS` that accepts it.

    Raises
    ------
    AttributionError
        When no entry accepts it, naming the node ``label``, the op, its module and the supported ops.
    """
    for spec in SPECS:
        if spec.matches(call):
            return spec.make(call)
    raise AttributionError(f"unsupported operation: {call.node.target} on {len(call.signals)} signal(s) at node "
                           f"{label!r} (module {module_type or '?'}). Supported: {SUPPORTED}. Rewrite this part of "
                           "the model with supported operations, or explain a sub-model")


def op_name(target: Any) -> str:
    """The op's name without overload and without the in-place underscore: "relu" for aten.relu_.default."""
    name = getattr(target, "__name__", str(target))
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        name = packet.__name__
    return name[:-1] if in_place(target) and name.endswith("_") else name


def in_place(target: Any) -> bool:
    """Whether ``target`` is an aten op that writes into its first argument, as its schema declares
    (aten.relu_.default, aten.copy_.default)."""
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.arguments or getattr(target, "_overloadpacket", None) is None:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write and not schema.name.endswith("__")


def functional(target: Any) -> Any:
    """The out-of-place overload of an in-place aten op (aten.relu_.default -> aten.relu.default)."""
    if not in_place(target):
        return target
    packet = target._overloadpacket
    base = getattr(torch.ops.aten, packet.__name__[:-1], None)
    overload = getattr(base, target._overloadname, None) if base is not None else None
    if overload is None:
        raise AttributionError(f"in-place op {target} has no out-of-place form the engine can compute")
    return overload


def reduction(fx_node: torch.fx.Node, op: str) -> Reduce:
    """A reduction's record: its axes, or None for all."""
    args: Any = fx_node.args
    position = REDUCTIONS[op]
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


_POOL_ARGS: dict[str, tuple[type[nn.Module], tuple[str, ...]]] = {
    "max_pool2d": (nn.MaxPool2d, ("kernel_size", "stride", "padding", "dilation", "ceil_mode")),
    "max_pool1d": (nn.MaxPool1d, ("kernel_size", "stride", "padding", "dilation", "ceil_mode")),
    "avg_pool2d": (nn.AvgPool2d, ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                                  "divisor_override")),
    "avg_pool1d": (nn.AvgPool1d, ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")),
    "adaptive_avg_pool2d": (nn.AdaptiveAvgPool2d, ("output_size",)),
    "adaptive_avg_pool1d": (nn.AdaptiveAvgPool1d, ("output_size",))}


def _pool_module(call: Call) -> nn.Module:
    """An equivalent pooling module for an exported pooling op (arguments bound by name)."""
    cls, names = _POOL_ARGS[call.op]
    bound = dict(zip(names, call.args[1:])) | call.kwargs
    if any(isinstance(v, torch.fx.Node) for v in bound.values()):
        raise AttributionError(f"{call.where}: pooling with non-constant arguments is not supported")
    if "stride" in bound and not bound["stride"]:  # aten's empty stride means the kernel size
        bound.pop("stride")
    bound = {k: tuple(v) if isinstance(v, list) else v for k, v in bound.items()}
    module: nn.Module = cls(**bound)
    return module
