"""The traced graph: every op of ``model(x)`` as a node, canonicalised for the rules.

``trace(model, x)`` captures the model with ``torch.export`` (:mod:`attributions.capture`: the
model is not changed and none of its hooks runs) and maps each exported op to a node *kind*
(:mod:`attributions.kinds`) through the op table (:data:`attributions.ops.SPECS`: the first entry that
accepts the op, by its name and which of its arguments are signals). The pieces of split / chunk ops are
fused into their readers as they are built; then the named graph passes (:data:`PASSES`) run in order, each
returning a new graph: the gating operands of products marked, eval-mode BatchNorm folded into the conv /
linear layer before it. In-place ops are computed out-of-place. Weights and
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
from typing import Any, TypeVar, cast

import torch
import torch.fx
from torch import nn

from attributions import attention, ops
from attributions.capture import Capture, capture, is_view
from attributions.errors import AttributionError
from attributions.kinds import LINEAR_KINDS, SIGNAL_KINDS, WEIGHT_KINDS, Kind, check, default
from attributions.op_tensors import OpTensors
from attributions.records import Activation, Const, Mix, Move, Product, Record, Reduce
from attributions.refs import Ref, resolve

RecordT = TypeVar("RecordT", bound=Record)


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
    kind: Kind
    inputs: tuple[str, ...]
    module: OpTensors | nn.Module | None = None  # the OpTensors (conv, dense, affine) or a pooling module (pools)
    bn: OpTensors | None = None  # the OpTensors of an eval-mode BatchNorm folded after this conv / linear
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
    # the memory order of its value's axes where the traced op's is not contiguous (sdpa's output, (B, H, L, D) laid
    # out as (B, L, H, D)): a view the model takes later may rely on it, so whatever computes the value lays it out alike
    layout: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.record is None:
            self.record = default(self.kind)
        check(self.name, self.kind, self.record)

    def recorded(self, kind: type[RecordT]) -> RecordT:
        """The node's record as the record type ``kind`` (:mod:`attributions.records`), or the toolkit's error."""
        if not isinstance(self.record, kind):
            raise AttributionError(f"node {self.name!r} of kind {self.kind!r} records a "
                                   f"{type(self.record).__name__}, not a {kind.__name__}")
        return self.record

    @property
    def tensors(self) -> OpTensors:
        """The live tensors of a conv, dense or affine node (an error for a node without them)."""
        if not isinstance(self.module, OpTensors):
            raise AttributionError(f"node {self.name!r} of kind {self.kind!r} reads no layer's tensors")
        return self.module

    @property
    def pool(self) -> nn.Module:
        """The pooling module of a maxpool or avgpool node (an error for a node without one)."""
        if not isinstance(self.module, nn.Module):
            raise AttributionError(f"node {self.name!r} of kind {self.kind!r} has no pooling module")
        return self.module

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
                elif kind == Kind.MOVE:
                    frontier.append(c)
        return out

    def weighted_layers(self) -> list[tuple[str, nn.Module, nn.Module | None]]:
        """The modules whose weights the conv, dense and affine nodes read, once each in forward
        order: (module path, the module, the folded BatchNorm's module or None)."""
        seen: set[int] = set()
        out = []
        for node in self.nodes:
            tensors = node.tensors if node.kind in WEIGHT_KINDS else None
            if tensors is not None and tensors.module is not None and id(tensors.module) not in seen:
                seen.add(id(tensors.module))
                out.append((tensors.path, tensors.module, node.bn.module if node.bn is not None else None))
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


# higher-order ops whose subgraph is built inline: where its submodule sits among the arguments
_REGIONS = {"wrap_with_autocast": 4, "wrap_with_set_grad_enabled": 1}
# the torch.nn layers whose name their main op takes, with the kind of that op
_LEAF_KINDS = {"Linear": Kind.DENSE, "Conv1d": Kind.CONV, "Conv2d": Kind.CONV, "BatchNorm1d": Kind.AFFINE,
               "BatchNorm2d": Kind.AFFINE,
               "ReLU": Kind.RELU, "LeakyReLU": Kind.LEAKY_RELU, "MaxPool1d": Kind.MAXPOOL, "MaxPool2d": Kind.MAXPOOL,
               "AvgPool1d": Kind.AVGPOOL, "AvgPool2d": Kind.AVGPOOL, "AdaptiveAvgPool1d": Kind.AVGPOOL,
               "AdaptiveAvgPool2d": Kind.AVGPOOL, "Flatten": Kind.MOVE, "Unflatten": Kind.MOVE, "Dropout": Kind.MOVE,
               "Dropout1d": Kind.MOVE, "Dropout2d": Kind.MOVE, "AlphaDropout": Kind.MOVE, "Softmax": Kind.SOFTMAX,
               "LayerNorm": Kind.NORM, "GroupNorm": Kind.NORM, "ConvTranspose1d": Kind.MIX, "ConvTranspose2d": Kind.MIX,
               **{m: Kind.ACTIVATION for m in (
                   "ReLU6", "ELU", "CELU", "SELU", "GELU", "SiLU", "Mish", "Hardswish", "Hardsigmoid", "Hardtanh",
                   "Sigmoid", "Tanh", "Softplus", "LogSigmoid")}}

def _under_views(value: Any) -> tuple[list[torch.fx.Node], Any]:
    """(the views ``value`` is taken through, outermost last; the tensor under them): ``x[:, 1:].view(...)``
    gives ([view, slice], x); a value that is no view gives ([], value)."""
    chain = []
    while isinstance(value, torch.fx.Node) and value.op == "call_function" and is_view(value) \
            and not ops.in_place(value.target) and value.args and isinstance(value.args[0], torch.fx.Node):
        chain.append(value)
        value = value.args[0]
    return chain, value


def _through(tensor: torch.Tensor, steps: list[tuple[Any, Any, Any]], env: dict[Any, Any],
             replace: dict[Any, Any]) -> torch.Tensor:
    """``tensor`` taken through the views ``steps`` ((op, args, kwargs), innermost first)."""
    for target, args, kwargs in steps:
        tensor = target(tensor, *resolve(args, env, replace), **resolve(kwargs, env, replace))
    return tensor


def _runner(function: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Callable[[dict[Any, Any], dict[Any, Any]], Any]:
    """``function(*args, **kwargs)`` with node references resolved from env / replace."""
    return lambda env, replace: function(*resolve(args, env, replace), **resolve(kwargs, env, replace))


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
        if ops.op_name(user.target) != "select" or len(user.args) < 3 or not isinstance(user.args[2], int) or \
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
        if node.kind == Kind.INPUT:  # the graph's first node, before the parameters export lists first
            self.nodes.insert(0, node)
        else:
            self.nodes.append(node)
        self.by_name[node.name] = node
        if fx_node is not None:
            self.names[fx_node] = node.name
            node.path = node.path or self.c.module_path(fx_node)
        if node.kind in SIGNAL_KINDS or node.kind == Kind.INPUT:
            self.signal.add(node.name)
        return node

    def ref(self, value: Any) -> Any:
        as_ref: Any = lambda n: Ref(self.names[n])  # noqa: E731 - fx's map_arg types its callback narrowly
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
            self.add(Node("input", Kind.INPUT, ()), fx_node)
            return
        name = self.unique(source.target if source.kind != "constant" else f"constant.{source.target}")
        get = self.c.value
        owner = source.target.rsplit(".", 1)[0] if source.kind != "constant" and "." in source.target else ""
        self.add(Node(name, Kind.CONST, (), run=lambda env, replace, p=fx_node.name: get(p),
                      record=Const(source.target), path=owner), fx_node)

    def call(self, fx_node: torch.fx.Node) -> None:
        target = fx_node.target
        reads = [self.names[a] for a in fx_node.all_input_nodes if a in self.names]
        # autograd gives no gradient through .detach() or under torch.no_grad(): what they compute is a constant
        stopped = self.no_grad > 0 or ops.op_name(target) == "detach"
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
        op = ops.op_name(target)
        if not signals or not is_float or op in ops.SHAPE_ONLY:
            self.held(fx_node, op, reads)
            return
        if op == "scaled_dot_product_attention":
            self.attention(fx_node)
            return
        if op in ops.TUPLES or (op in ("max", "min") and isinstance(val, tuple)):  # max.dim: (values, indices)
            run = _runner(ops.functional(target), self.ref(fx_node.args), self.ref(fx_node.kwargs))
            self.tuples[fx_node] = (run, signals, None if op in ops.TUPLES else ops.reduction(fx_node, op))
            return
        if ops.in_place(target):
            chain, base = _under_views(fx_node.args[0])
            if chain and self.names.get(base) in self.signal and any(self.order[u] > self.order[fx_node]
                                                                     for u in base.users):
                self.write_through(fx_node, op, chain)
                return
            self.check_out_of_place(fx_node)
        kind, record, module = self.describe(fx_node, op, signals)
        first = fx_node.args[0] if fx_node.args else None
        if op in ops.LIKE and isinstance(first, torch.fx.Node) and self.names.get(first) in self.signal:
            signals = (self.names[first],)  # the other tensor gives only a shape or dtype
        name = self.unique(self.path_name(fx_node, op, kind))
        run = _runner(ops.functional(target), self.ref(fx_node.args), self.ref(fx_node.kwargs))
        group = _select_group(fx_node) if op == "select" and signals else None
        if group is not None:
            run = self.selected(fx_node, *group)
        if isinstance(record, Move) and record.identity:
            source = signals[0]

            def run(env: dict[str, Any], replace: dict[str, Any]) -> Any:
                return replace.get(source, env[source])
        constants = tuple(r for r in reads if r not in self.signal)  # the constants it reads (parameters)
        self.add(Node(name, kind, signals, module=module, run=run, record=record, reads=constants), fx_node)

    def held(self, fx_node: torch.fx.Node, op: str, reads: list[str]) -> None:
        """An op computed in the forward pass alone: a ``const`` node (tensors) or a ``value`` node (sizes).
        Constants are recomputed in order at every pass, so their in-place ops run as written: a mask filled
        slice by slice (Swin's) is read through the tensor it was written into."""
        val = fx_node.meta.get("val")
        kind = Kind.CONST if isinstance(val, torch.Tensor) or (isinstance(val, (tuple, list)) and val and
                                                             isinstance(val[0], torch.Tensor)) else Kind.VALUE
        name = self.unique(self.path_name(fx_node, op, None))
        run = _runner(cast(Any, fx_node.target), self.ref(fx_node.args), self.ref(fx_node.kwargs))
        self.add(Node(name, kind, (), run=run, reads=tuple(reads)), fx_node)
        if ops.in_place(fx_node.target):  # a write (zero_, fill_...) into the tensor under the views it is made through
            written = _under_views(fx_node.args[0])[1]
            if written in self.names:
                self.writers.setdefault(self.names[written], []).append(name)

    def selected(self, fx_node: torch.fx.Node, dim: int, index: int,
                 size: int) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
        """The run of one of ``size`` selects that take every index of a tensor along ``dim``: its piece of one
        ``unbind`` the selects share (:func:`_shared`)."""
        parent = self.names[cast(Any, fx_node.args[0])]
        unbind = _shared(_runner(torch.ops.aten.unbind.int, (Ref(parent), dim), {}), (parent, "pieces"),
                         (parent,), size)
        if index == 0:
            self.mark_packed(cast(Any, fx_node.args[0]), size)
        return lambda env, replace: unbind(env, replace)[index]

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
            kind = Kind.MOVE  # values moved into place
        elif op in ("add", "sub") or (op in ("mul", "div") and not others):
            kind = Kind.MIX  # linear in the tensor and what is added
        elif (op in ops.ACTIVATIONS or op in ("relu", "leaky_relu")) and not others:
            kind = Kind.ACTIVATION  # element-wise: f on the view, the identity elsewhere
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
        base_ref, args, kwargs, function = Ref(self.names[base]), self.ref(rest), self.ref(fx_node.kwargs), fx_node.target

        def run(env: dict[str, Any], replace: dict[str, Any]) -> Any:
            out = resolve(base_ref, env, replace).clone()
            cast(Any, function)(_through(out, steps, env, replace), *resolve(args, env, replace),
                                **resolve(kwargs, env, replace))
            return out
        name = self.unique(self.path_name(fx_node, op, None))
        reads = [self.names[a] for a in fx_node.all_input_nodes if a in self.names and self.names[a] not in self.signal]
        inputs = tuple(dict.fromkeys([self.names[base], *others]))
        record = Activation(op) if kind == Kind.ACTIVATION else default(kind)
        self.add(Node(name, kind, inputs, run=run, record=record, reads=tuple(reads), path=self.c.module_path(fx_node)))
        self.names[base] = name  # later readers of the tensor see it written

        def view(env: dict[str, Any], replace: dict[str, Any]) -> Any:  # the op's own result: the view, as written
            return _through(resolve(Ref(name), env, replace), steps, env, replace)
        self.add(Node(self.unique(f"{name}.view"), Kind.MOVE, (name,), run=view, reads=tuple(reads)), fx_node)

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
            kind, record = Kind.CONST, Const()
        else:
            kind, record = (Kind.MOVE, Move()) if reduction is None else (Kind.REDUCE, reduction)
        op = "getitem" if reduction is None else ops.op_name(parent.target)
        name = self.unique(self.path_name(fx_node, op, None))
        if signals:  # the pieces of one call: one backward node (the inputs are this call's signals)
            readers = sum(1 for u in parent.users if u.target is operator.getitem)
            run = _shared(run, (parent.name, "pieces of"), signals, readers)
            source = parent.args[0] if parent.args else None
            if index == 0 and isinstance(source, torch.fx.Node) and len(source.users) == 1:
                self.mark_packed(source, readers)
        self.add(Node(name, kind, signals if kind != Kind.CONST else (), run=lambda env, replace: run(env, replace)[index],
                      record=record, reads=signals if kind == Kind.CONST else ()), fx_node)

    def mark_packed(self, tensor: torch.fx.Node, pieces: int) -> None:
        """``tensor`` is read only as ``pieces`` pieces: the dense node it is computed from through single-reader data
        movement alone, if any, records how many (:attr:`Node.pieces`). Which blocks of the dense output the pieces
        are does not matter: the transpose tests its gradient's blocks for zeros, and only cost rides on the mark."""
        while True:
            node = self.by_name.get(self.names.get(tensor, ""))
            if node is None:
                return
            if node.kind == Kind.DENSE:
                node.pieces = pieces if node.tensors.out_features % pieces == 0 else 0
                return
            source = tensor.args[0] if tensor.args else None
            if node.kind != Kind.MOVE or len(node.inputs) != 1 or not isinstance(source, torch.fx.Node) \
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
        bound = {k: (v if not isinstance(v, torch.fx.Node) else Ref(self.names[v])) for k, v in bound.items()}
        specs = attention.sdpa_specs(name, bound, operands, self.signal)
        order = _layout(fx_node.meta.get("val"))
        mask = bound.get("attn_mask")
        query = nodes["query"].meta.get("val")
        sizes = [s if isinstance(s, int) else None for s in query.shape[-2:]] if isinstance(query, torch.Tensor) \
            else [None, None]
        fused = attention.fused_run(bound.get("scale"), mask.name if mask is not None else None)
        if order is not None:  # a view the model takes later may rely on the layout
            last = specs[-1]
            specs[-1] = (*last[:3], (lambda f: lambda env, replace: laid_out(f(env, replace), order))(last[3]), last[4])
            fused = (lambda f: lambda env, q, k, v: laid_out(f(env, q, k, v), order))(fused)
        for i, (suffix, kind, inputs, run, record) in enumerate(specs):
            own = name if i == len(specs) - 1 else f"{name}.{suffix}"
            self.taken[own] = self.taken.get(own, 0) + 1
            self.add(Node(own, kind, inputs, run=run, record=record, tokens=True, path=self.c.module_path(fx_node),
                          fused=attention.Fused(tuple(f"{name}.{s[0]}" for s in specs[:-1]), fused, *sizes)
                          if own == name else None, layout=order if own == name else None))
        self.names[fx_node] = name

    def describe(self, fx_node: torch.fx.Node, op: str, signals: tuple[str, ...]) -> ops.Described:
        """(kind, record, op tensors or pooling module) of an op on signals: the op table's
        (:func:`attributions.ops.classify`), or its error for an op without a rule."""
        call = ops.Call(fx_node, op, signals, tuple(self.slots(tuple(fx_node.args))),
                        f"{op} at {self.c.module_path(fx_node) or 'the model'}", self)
        return ops.classify(call, self.path_name(fx_node, op, None), self.c.module_type(fx_node))

    def name_of(self, value: torch.fx.Node) -> str:
        return self.names[value]

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


def laid_out(t: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """``t``'s values laid out in memory in ``order`` (as :func:`_layout` gives it)."""
    inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    return t.permute(order).contiguous().permute(inverse)


def _ints(value: Any, d: int) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value) if len(value) == d else tuple(int(value[0]) for _ in range(d))
    return tuple(int(value) for _ in range(d))


# --- graph passes: Graph -> Graph, in order, each with its own test ---------------------------------

def mark_gates(graph: Graph) -> Graph:
    """For each product, which operands a gating function computed (its record's ``gates``), data movement after
    it included: written-out attentions (timm's Swin, XCiT, CoaT...) pass their weights through an eval-mode
    dropout, and a gate moved is still the gate.

    Before: products' records have ``gates`` (False, False). After: a new graph whose products' records mark
    their gate operands; every other node the same object; ``graph`` unchanged.
    """
    def producer(name: str) -> Node:
        node = graph.by_name[name]
        while node.kind == Kind.MOVE and len(node.inputs) == 1:
            node = graph.by_name[node.inputs[0]]
        return node

    def marked(node: Node) -> Node:
        if not isinstance(node.record, Product):
            return node
        gates = tuple(p.kind == Kind.SOFTMAX or (isinstance(p.record, Activation) and p.record.function in ops.GATES)
                      for p in map(producer, node.record.operands))
        return replace(node, record=replace(node.record, gates=cast(tuple[bool, bool], gates)),
                       aliases=dict(node.aliases))
    return Graph([marked(n) for n in graph.nodes], graph.output, graph.shape, graph.dynamic_batch,
                 graph.batch_sized)


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold each BatchNorm whose input is a conv / linear used only by it into that layer.

    Before: eval-mode BatchNorms are ``affine`` nodes. After: a new graph without the folded ones; the layer
    before each holds its tensors (``bn``) and its name (``folded``: the forward pass also stores the value under
    it), and the nodes that read it read the layer (``aliases`` maps the name they were traced with); ``graph``
    unchanged.
    """
    drop: dict[str, str] = {}
    for node in graph.nodes:
        if node.kind != Kind.AFFINE or len(node.inputs) != 1:
            continue
        src = graph.by_name[node.inputs[0]]
        if src.kind in (Kind.CONV, Kind.DENSE) and src.bn is None and graph.consumers[src.name] == [node.name]:
            drop[node.name] = src.name
    if not drop:
        return graph
    into = {src: bn for bn, src in drop.items()}

    def folded(node: Node) -> Node:
        changes: dict[str, Any] = {}
        if node.name in into:
            changes |= {"bn": graph.by_name[into[node.name]].tensors, "folded": (*node.folded, into[node.name])}
        if any(i in drop for i in node.inputs):
            changes |= {"aliases": {**node.aliases, **{i: drop[i] for i in node.inputs if i in drop}},
                        "inputs": tuple(drop.get(i, i) for i in node.inputs)}
            if isinstance(node.record, Product):  # a product's operand names name its inputs too
                operands = cast(tuple[str, str], tuple(drop.get(o, o) for o in node.record.operands))
                changes["record"] = replace(node.record, operands=operands)
        return replace(node, **({"aliases": dict(node.aliases)} | changes)) if changes else node
    nodes = [folded(n) for n in graph.nodes if n.name not in drop]
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
