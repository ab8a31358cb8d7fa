"""The Explainer: one object per (model, method), with captum's ``attribute`` interface.

The forward pass runs every node of the traced graph functionally and keeps its output; the
backward pass walks the nodes in reverse, asking each node's rule for its inputs' signals. The
signal carries a leading K axis, so ``propagate`` pushes K injected vectors through ONE backward
pass over one forward pass. The user's model is only read: no hooks, no mode switches, no copies.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from captum.log import log_usage
from torch import nn
from torch.autograd.graph import get_gradient_edge

from attributions import fusion, liveness, memory
from attributions.derived import Derived
from attributions.errors import AttributionError, unknown_name
from attributions.graph import Graph, Node, laid_out, trace
from attributions.hygiene import leaves_process_alone
from attributions.kinds import LINEAR_KINDS, SIGNAL_KINDS, Kind
from attributions.linear_ops import OPS, DenseOp, pool
from attributions.liveness import Lean
from attributions.methods import FIRST, Method, RuleKey, build_method
from attributions.records import Const, LeakyReLU
from attributions.rules import Context, Rule, resolve, stabilize
from attributions.shared_pass import CONNECTED, SharedPass
from attributions.validation import named, nonfinite_tensors

# (an earlier forward pass's values, the names of the nodes whose values may be taken from it)
Reuse = tuple[dict[Any, Any], frozenset[str]]


def _entries(node: Node) -> tuple[Any, ...]:
    """The keys under which a forward pass holds a node's values: its output, max pooling's winners,
    its recorded autograd graph, and the names of the folded BatchNorm calls that read its output."""
    return (node.name, (node.name, "indices"), (node.name, "graph"), *node.folded)


RULE_KINDS = SIGNAL_KINDS  # every node that carries the signal has a rule


class ForwardPass:
    """One forward pass of an explainer's graph on ``x`` (B, ...), for checks that read inside the chain.

    Attributes
    ----------
    values : {node name: its output (B, ...)} for every node
    reference : the same for the method's reference input (DeepLIFT), else None
    """

    def __init__(self, explainer: Explainer, x: torch.Tensor, values: dict[Any, Any], reference: dict[Any, Any] | None = None):
        self.explainer, self.x, self.values, self.reference = explainer, x, values, reference

    def signals(self, start: str, vectors: torch.Tensor, keep: set[str] | None = None) -> dict[str, torch.Tensor]:
        """The method's backward of K signals ``vectors`` (K, B, ...) shaped like ``start``'s output injected at
        node ``start``: {node: (K, B, ...)} for ``start`` and every node below it (or those in ``keep``); for
        DeepLIFT the multipliers times each node's difference from the reference."""
        self.explainer.method.engine.prepare(self.explainer, self.x)
        return self.explainer._signals(self.x, start, lambda env: vectors,
                                       shared=SharedPass(self.values, self.reference), keep=keep)


if TYPE_CHECKING:
    class Attribution:
        """captum's base class as this module uses it (captum ships no types): its constructor, which keeps the
        forward function captum's wrappers (NoiseTunnel, ...) call."""

        forward_func: Callable[..., Any]

        def __init__(self, forward_func: Callable[..., Any]) -> None: ...
else:
    from captum.attr import Attribution


class Explainer(Attribution):
    """Attribution maps and backward-chain signals of one method on one model.

    Parameters
    ----------
    model : nn.Module
        Any traceable model mapping (B, ...) inputs to (B, classes) logits. Evaluated with eval
        semantics (BatchNorm running statistics, no dropout) whatever its mode; never modified.
    method : str
        A name from :func:`attributions.available_methods`.
    graph : Graph, optional
        The model's traced graph, when several explainers share one (see :func:`attributions.graph.trace`).
    rules : dict, optional
        Overrides of the method's rule table: keys are node kinds (``"conv"``, ``"dense"``,
        ``"affine"``, ``"avgpool"``, ``"relu"``, ``"maxpool"``, ``"add"``, ``"first"`` for the
        linear layers reading the input) or node / module names (names win; the user's entries win
        over the method's; see :meth:`_rule_table`); values are rule names from
        :func:`attributions.rules.available` or :class:`~attributions.rules.Rule` objects.
    max_memory : int or str, optional
        The memory its passes aim to hold (bytes, or a size such as ``"2GB"``, at least 64 MiB): images, noisy
        copies, path points and backward vectors are split into passes that fit. None: the budget in force
        (:func:`attributions.memory.limit`, as a run sets it), else :func:`attributions.memory.default_budget`,
        half of the memory available.
    **params
        The method's parameters, e.g. ``epsilon=1e-6``.

    Examples
    --------
    >>> ex = Explainer(model, "lrp-epsilon-plus", epsilon=1e-6)
    >>> maps = ex.attribute(x, target=y)                 # shaped like x
    >>> taps = ex.propagate(x, inject_at="classifier.2", vectors=torch.randn(5, *logits.shape))
    >>> Explainer(model, "lrp-zplus").capture(x).layers     # the nodes, before any map
    >>> zennit_like = Explainer(model, "lrp-epsilon", rules={"conv": "zplus", "first": "flat"})
    """

    def __init__(self, model: nn.Module, method: str, graph: Graph | None = None, rules: dict[Any, Any] | None = None,
                 max_memory: int | str | None = None, **params: Any) -> None:
        if not isinstance(model, nn.Module):
            raise AttributionError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.max_memory = memory.parse_size(max_memory) if max_memory is not None else None
        self.method: Method = build_method(method, **params)
        if rules and not self.method.chain:
            raise AttributionError(f"{self.method.name!r} is not a chain of rules; rules= applies to the graph "
                                   "methods only")
        self._overrides = dict(rules or {})
        for value in self._overrides.values():  # rule names are checked at once; node names once captured
            resolve(value)
        self.graph: Graph | None = None
        self._graphs: dict[tuple[Any, ...], Graph] = {}  # captured graphs by input shape (sizes are specialised)
        self._ops: dict[Any, Any] = {}
        self._rules: dict[str, Rule] = {}
        self.by_autograd = False  # set with the rules (_bind)
        self.surrogates = False  # a pass recorded whole for this chain takes ops in surrogate form (_bind)
        self.recorded: frozenset[str] = frozenset()
        self._plans: dict[tuple[frozenset[str], bool], Lean] = {}
        if self.method.engine.needs_graph and graph is not None:
            self._bind(graph)
        self._reference: Derived[dict[Any, Any]] = Derived()
        self._image_bytes: dict[tuple[Any, ...], int] = {}
        self._siblings: dict[Any, Explainer] = {}
        Attribution.__init__(self, self.forward)

    def _bind(self, graph: Graph) -> None:
        """Use ``graph``: its linear ops, the rule of every node, the nodes whose autograd graph to record."""
        self.graph = graph
        self._graphs[_shape_key(graph.shape, graph.dynamic_batch)] = graph
        self._ops = {n.name: OPS[n.kind](n) for n in graph.nodes if n.kind in LINEAR_KINDS}
        self._rules = self._rule_table(self._overrides) if self.method.chain else {}
        # where a rule holds an input (CP-LRP's attention weights), the pieces of a packed projection it leaves
        # without a signal are zero blocks of the projection's gradient: its transpose looks for them
        if any(rule.silent(graph.by_name[name]) for name, rule in self._rules.items()):
            for name, op in self._ops.items():
                if isinstance(op, DenseOp):
                    op.blocks = graph.by_name[name].pieces
        # every rule the node's exact gradient, or that of a surrogate op (factor form): the chain is the gradient
        # of the model with those ops in its place, taken from autograd
        self.by_autograd = self.method.signal in ("gradient", "factor") and bool(self._rules) and \
            all(r.exact_gradient or r.traceable for r in self._rules.values())
        self.surrogates = self.by_autograd and any(r.traceable for r in self._rules.values())
        # nodes whose rule reads the node's own gradient: the forward pass records their autograd graph
        self.recorded = frozenset(n.name for n in graph.nodes if n.name in self._rules and self._rules[n.name].records
                                  and not (n.is_identity or n.is_reshape))
        self._plans = {}

    def _graph_for(self, x: torch.Tensor) -> None:
        """Bind the graph of inputs shaped like ``x``, capturing the model at that shape the first time."""
        if not self.method.engine.needs_graph or (self.graph is not None and self.graph.accepts(x.shape)):
            return
        graph = self._graphs.get(_shape_key(x.shape, True)) or self._graphs.get(_shape_key(x.shape, False))
        self._bind(graph if graph is not None else trace(self.model, x))

    def _rule_table(self, overrides: dict[Any, Any]) -> dict[str, Rule]:
        """The rule of every rule-driven node, by precedence: the user's rule for its name, the user's
        ``first`` rule (layers reading the input), the user's rule for its kind, then the method's
        ``first`` rule and the method's rule for its kind."""
        graph = self.traced
        nodes = [n for n in graph.nodes if n.kind in RULE_KINDS]
        names = {n.name for n in nodes} | {n.name.split("#")[0] for n in nodes}
        by_kind: dict[RuleKey, Rule] = {}
        by_name: dict[str, Rule] = {}
        for key, value in overrides.items():
            if key in RULE_KINDS or key == FIRST:
                by_kind[FIRST if key == FIRST else Kind(key)] = resolve(value)
            elif key in names:
                by_name[key] = resolve(value)
            else:
                raise unknown_name("rule key (a node kind or a node name)", key,
                                   [*RULE_KINDS, FIRST, *sorted(names)], AttributionError)
        first = graph.first_layers()
        out = {}
        for node in nodes:
            # the user's choices before the method's; within each, the first layers' rule before the kind's
            candidates = [by_name.get(node.name, by_name.get(node.name.split("#")[0]))]
            for table in (by_kind, self.method.rules):
                candidates += [table.get(FIRST) if node.name in first else None, table.get(node.kind)]
            rule = next(r for r in candidates if r is not None)
            if node.kind not in rule.kinds:
                raise AttributionError(f"rule {rule!r} cannot act on node {node.name!r} of kind {node.kind!r}; it "
                                       f"acts on {', '.join(rule.kinds)}")
            out[node.name] = rule
        return out

    def rule_for(self, node: str) -> Rule:
        """The rule that runs at ``node``.

        Parameters
        ----------
        node : a node's name, from :attr:`layers`
        """
        if node not in self._rules:
            raise unknown_name("rule-driven node", node, self._rules, AttributionError)
        return self._rules[node]

    def sibling(self, method: str, **params: Any) -> Explainer:
        """An explainer of another method on the same model and traced graph.

        Parameters
        ----------
        method : str
            A name from :func:`attributions.available_methods`.
        **params
            The other method's parameters, e.g. ``epsilon=1e-6``. This explainer's ``rules`` overrides
            are not passed on.

        Returns
        -------
        Explainer
            On ``self.model``, sharing this explainer's traced graph (None before the first call: the
            sibling then captures its own); the same one for the same method and parameters, so that the
            chunks of a call under a memory budget do not each leave an explainer (and the passes it keeps)
            for the garbage collector.
        """
        key: Any = (method, tuple(sorted(params.items())))
        try:
            known = self._siblings.get(key)
        except TypeError:  # a parameter that cannot be a key: a new sibling each time
            known, key = None, None
        if known is None or known.graph is not self.graph and self.graph is not None:
            known = Explainer(self.model, method, graph=self.graph, max_memory=self.max_memory, **params)
            if key is not None:
                self._siblings[key] = known
        return known

    def capture(self, x: torch.Tensor) -> Explainer:
        """Capture the model at inputs shaped like ``x`` now, before any map, so that :attr:`layers`,
        :meth:`rule_for` and :meth:`propagate` answer in any order.

        Parameters
        ----------
        x : torch.Tensor
            (B, ...) example inputs; only their shape and dtype count (a batch of another size is accepted
            later where the graph allows it, another image size is captured again on its first call).

        Returns
        -------
        Explainer
            ``self``, so that ``Explainer(model, "lrp-zplus").capture(x).layers`` reads in one line.
        """
        self._need_graph_engine("capture")
        self._graph_for(self._check_input(x))
        return self

    # --- introspection -----------------------------------------------------------------------------

    @property
    def layers(self) -> list[str]:
        """Recordable / injectable node names, in forward order."""
        return self._need_graph("layers").layers

    def has_convergence_delta(self) -> bool:
        """Whether the method promises what its maps sum to (captum's API); see :meth:`compute_convergence_delta`."""
        return self.method.completeness is not None

    def compute_convergence_delta(self, attributions: torch.Tensor, inputs: torch.Tensor, target: Any = None
                                  ) -> torch.Tensor:
        """How far each map's sum is from what the method promises, (B,).

        DeepLIFT and integrated gradients: sum - (f(x) - f(x0)) for the explained output, x0 the
        method's baseline (completeness; exact for DeepLIFT, the quadrature's error for IG). LRP from the
        logit: sum - f(x) (conservation; biases, stabilisers and constants absorb part of it, so it
        is exact only on bias-free models).

        Parameters
        ----------
        attributions : Tensor
            (B, ...) maps of ``inputs``, e.g. from :meth:`attribute` with the same ``target``; each
            image's map is summed over all its entries.
        inputs : Tensor
            (B, ...) the explained inputs.
        target : int, (B,) tensor or sequence, or None, default None
            The explained class per image, as in :meth:`attribute`; None: the predicted class.

        Returns
        -------
        Tensor
            (B,) the sum of each map minus what the method promises, in the logits' dtype.

        Raises
        ------
        AttributionError
            When the method promises nothing (:meth:`has_convergence_delta` is False).
        """
        if not self.has_convergence_delta():
            raise AttributionError(f"{self.method.name!r} promises no completeness or conservation")
        x = self._check_input(inputs)
        with torch.no_grad():
            logits = self.forward(x)
            t = self.targets(logits, target)
            expected = logits.gather(1, t[:, None])[:, 0]
            if self.method.completeness == "difference":
                expected = expected - self.forward(self.baseline_like(x))[0, t]
        return attributions.detach().reshape(len(x), -1).sum(1).to(expected.dtype) - expected

    @property
    def multiplies_by_inputs(self) -> bool:
        return self.method.signal != "gradient" or self.method.times_input

    def __repr__(self) -> str:
        return f"Explainer({type(self.model).__name__}, {self.method.name!r})"

    # --- forward -----------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output computed by the graph (eval semantics); differentiable.

        Parameters
        ----------
        x : (B, ...) inputs

        Returns
        -------
        Tensor
            (B, classes) the logits.
        """
        self._graph_for(x)
        graph = self._need_graph("forward")
        n = len(x) if torch.is_grad_enabled() else memory.fitting(len(x), lambda: self.bytes_per_image(x))
        # logits only (no autograd graph to keep): one chunk's values at a time
        parts: list[torch.Tensor] = [self._run(x[i:j])[graph.output] for i, j in memory.spans(len(x), n)]
        return memory.joined(parts, 0)

    def bytes_per_image(self, x: torch.Tensor) -> int:
        """Bytes one image of ``x`` takes in this method's forward pass (its values and the autograd graphs its
        rules read), measured once per input shape.

        Parameters
        ----------
        x : (B, ...) inputs
        """
        self._graph_for(x)
        key = (tuple(x.shape[1:]), x.dtype, x.device)
        if key not in self._image_bytes:
            env = self._forward_envs(x[:1], with_ref=False, batch=x.shape)[0] if self.graph is not None \
                else {"input": x[:1]}
            self._image_bytes[key] = memory.tensor_bytes(env)
        return self._image_bytes[key]

    def images_per_pass(self, x: torch.Tensor, vectors: int) -> int:
        """How many images of ``x`` one forward and backward pass with ``vectors`` signals may take under
        the memory budget (:mod:`attributions.memory`): each costs its forward values and one signal as
        large per vector.

        Parameters
        ----------
        x : Tensor
            (B, ...) inputs; an image's cost is measured on ``x[:1]`` (:meth:`bytes_per_image`).
        vectors : int
            K, the number of signals each backward pass carries.

        Returns
        -------
        int
            Between 1 (an image that does not fit alone still goes alone) and B; B without a budget.
        """
        return memory.fitting(len(x), lambda: self.bytes_per_image(x) * (1 + vectors))

    def _lean(self, keep: frozenset[str], autograd: bool = False) -> Lean:
        """The plan of a forward pass for one backward that returns the signals at ``keep``
        (:mod:`attributions.liveness`), made once per graph; ``autograd``: for autograd's backward through a
        pass recorded whole, which holds what it saves itself (no rule reads a value)."""
        if (keep, autograd) not in self._plans:
            fused = fusion.plan(self.traced, self._rules, keep) if autograd else {}
            self._plans[keep, autograd] = liveness.plan(self.traced, {} if autograd else self._rules, keep, fused)
        return self._plans[keep, autograd]

    def _run(self, x: torch.Tensor, record: frozenset[str] = frozenset(), reuse: Reuse | None = None,
             lean: Lean | None = None) -> dict[Any, Any]:
        """Every node's value; for the nodes in ``record`` also their autograd graph, (leaves, the output's
        gradient edge) under ``(name, "graph")``, so that the backward pass need not re-run them.
        ``reuse``: (an earlier pass's values for the same ``x``, the nodes whose values it may give), for
        a model that differs from the earlier one only downstream of those nodes. ``lean``: the plan of a
        pass for one backward (:mod:`attributions.liveness`): values it frees leave a stand-in of their
        shape once their last consumer has run, unless smaller than :data:`memory.SMALL`, and a graph is
        recorded only where it keeps no value alive that the pass frees."""
        self._graph_for(x)
        env: dict[Any, Any] = {"input": x}
        connected = torch.is_grad_enabled()  # a pass recorded whole (_forward_envs(connected=True))
        freed = lean.freed if lean is not None else frozenset()

        def held(name: str) -> Any:
            return name not in freed or memory.is_small(env[name])

        for position, node in enumerate(self.traced.nodes[1:], start=1):
            if lean is not None and node.name in lean.skipped:
                continue
            if lean is not None and node.name in lean.fused:
                env[node.name] = fusion.run(node, lean.fused[node.name], env)
            elif reuse is not None and node.name in reuse[1]:
                for key in _entries(node):
                    if key in reuse[0]:
                        env[key] = reuse[0][key]
            elif node.name in record and (lean is None or node.name in lean.reached) and \
                    all(isinstance(env[i], torch.Tensor) and held(i) for i in node.inputs):
                leaves = [env[i].detach().requires_grad_() for i in node.inputs]
                with torch.enable_grad():
                    out = node.evaluate(env, dict(zip(node.inputs, leaves)))
                if isinstance(out, torch.Tensor) and out.requires_grad:
                    # the graph's root edge, not its output: the output's memory stays free to go
                    env[(node.name, "graph")] = (leaves, get_gradient_edge(out))
                    out = out.detach()
                env[node.name] = out
            elif connected and (rule := self._rules.get(node.name)) is not None and rule.traceable:
                inputs = [env[i] for i in node.inputs]  # the output is the surrogate's to compute: a stand-in
                out = rule.surrogate(Context(node=node, inputs=inputs, output=inputs[0], op=self._ops.get(node.name),
                                             env=env, graph=self.traced))
                env[node.name] = laid_out(out, node.layout) if node.layout is not None else out
            else:
                env[node.name] = self._eval(node, env)
                if connected and node.kind not in SIGNAL_KINDS and isinstance(env[node.name], torch.Tensor):
                    # a constant of the backward pass (detached, or under torch.no_grad() in the model)
                    env[node.name] = env[node.name].detach()
            for alias in node.folded:  # calls traced to read a folded BatchNorm's output
                env[alias] = env[node.name]
            for name in lean.free.get(position, ()) if lean is not None else ():
                value = env[name]
                if isinstance(value, torch.Tensor) and not memory.is_small(value):
                    stand_in = memory.stand_in(value)
                    for key in (name, *self.traced.by_name[name].folded):
                        env[key] = stand_in
        return env

    def _eval(self, node: Node, env: dict[Any, Any]) -> Any:
        kind = node.kind
        if kind in LINEAR_KINDS:
            op = self._ops[node.name]
            w, b = op.weights()
            if torch.is_grad_enabled():  # a pass recorded whole: autograd saves only what the input's gradient needs
                w, b = (None if t is None else t.detach() for t in (w, b))
            return op.forward(env[node.inputs[0]], w, b)
        if kind == Kind.RELU:
            return F.relu(env[node.inputs[0]])
        if kind == Kind.LEAKY_RELU:
            return F.leaky_relu(env[node.inputs[0]], node.recorded(LeakyReLU).negative_slope)
        if kind == Kind.MAXPOOL:  # the winners are kept for the backward pass
            out, env[(node.name, "indices")] = pool(node, env[node.inputs[0]], return_indices=True)
            return out
        if kind == Kind.ADD:
            return env[node.inputs[0]] + env[node.inputs[1]]
        return node.evaluate(env)  # the traced operation itself (modules through forward, not their hooks)

    # --- backward ----------------------------------------------------------------------------------

    def _backward(self, env: dict[Any, Any], ref: dict[Any, Any] | None, start: str, signal: torch.Tensor,
                  keep: set[str] | None = None, release: bool = False, remat: frozenset[str] = frozenset()
                  ) -> dict[str, torch.Tensor]:
        """Propagate ``signal`` (K, B, ...) from node ``start`` down to the input; every node's signal
        (only those named in ``keep``: the others are freed as soon as they have been passed on).
        ``release`` also drops each forward value from ``env`` once the backward has passed its node
        (no later node reads it), as autograd frees what it saved: the peak memory, and with it the
        allocation cost on large feature maps, stays that of one forward pass. ``remat``: values the
        forward pass freed, recomputed where a rule reads them (:mod:`attributions.liveness`)."""

        recomputed: set[str] = set()

        def value(name: str) -> Any:
            if name not in remat or name in recomputed or not memory.is_stand_in(env[name]):
                return env[name]
            node = self.traced.by_name[name]
            out = node.evaluate(env, {i: value(i) for i in node.inputs if i in remat})
            if release:  # held until the backward passes the node, which then drops it
                env[name] = out
                recomputed.add(name)
            return out

        pending: dict[str, Any] = {start: signal}
        taps: dict[str, torch.Tensor] = {}
        nodes = self.traced.nodes
        names = [n.name for n in nodes]
        for node in reversed(nodes[: names.index(start) + 1]):
            s = pending.pop(node.name, _UNREACHED)
            if s is None:  # reached with no signal (a rule held it constant): nor do the nodes it reads get one
                if keep is None or node.name in keep:
                    taps[node.name] = signal.new_zeros((len(signal), *env[node.name].shape))
                if node.kind == Kind.INPUT:
                    break
                for name in node.inputs:
                    pending.setdefault(name, None)
            elif s is not _UNREACHED:
                if keep is None or node.name in keep:
                    taps[node.name] = s
                if node.kind == Kind.INPUT:
                    break
                key = (node.name, "indices")
                rule = self._rules[node.name]
                reads = rule.reads_for(node) if remat else ()  # what to recompute for it, if freed
                ctx = Context(node=node, inputs=[value(i) if "inputs" in reads else env[i] for i in node.inputs],
                              output=value(node.name) if "output" in reads else env[node.name],
                              op=self._ops.get(node.name), ref_inputs=[ref[i] for i in node.inputs] if ref else None,
                              ref_output=ref[node.name] if ref else None, indices=env.get(key),
                              ref_indices=ref.get(key) if ref else None, env=env, graph=self.traced)
                outs = rule.backward(ctx, s)
                for name, o in zip(node.inputs, outs):
                    before = pending.get(name)
                    pending[name] = o if before is None else before if o is None else before + o
            if release and keep is not None and node.name not in keep:
                for name in _entries(node):
                    env.pop(name, None)
        return taps

    def _forward_envs(self, x: torch.Tensor, with_ref: bool | None = None, record: frozenset[str] | None = None,
                      batch: torch.Size | None = None, reuse: Reuse | None = None,
                      lean: Lean | None = None, connected: bool = False) -> tuple[dict[Any, Any], dict[Any, Any] | None]:
        """Every node's output for x and (DeepLIFT, or ``with_ref``) for the reference (the method's baseline):
        one image, broadcast against the batch. ``record``: nodes whose autograd graph to keep (default: those
        this method's rules differentiate); ``batch``: the shape of the inputs ``x`` was taken from, which
        an error names (the user's, not a probe's); ``reuse``: as :meth:`_run`; ``lean``: the plan of a
        pass for one backward, which holds only what that backward reads (:meth:`_lean`). ``connected``:
        the pass recorded by autograd as one graph from the input instead (marked :data:`CONNECTED`), with the
        rules' surrogate ops in place, for the chains autograd runs (:attr:`by_autograd`); values reused from an earlier
        connected pass bring its input leaf, so that gradients reach it through them."""
        with_ref = self.method.signal == "multiplier" if with_ref is None else with_ref
        if connected:
            earlier = reuse is not None and CONNECTED in reuse[0]
            x = reuse[0]["input"] if reuse is not None and earlier else x.detach().requires_grad_()
            reuse, record = reuse if earlier else None, frozenset()
            lean = None if reuse is not None else lean
        with torch.no_grad(), torch.set_grad_enabled(connected):
            try:
                env = self._run(x, self.recorded if record is None else record, reuse, lean)
            except RuntimeError as exc:  # most often inputs of a shape or channel count the model does not take
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise AttributionError(f"the model's forward pass failed on inputs of shape {tuple(batch or x.shape)}: "
                                       f"{first}; check the input shape and channels the model expects") from None
            ref = self._reference_env(x) if with_ref else None
        if connected:
            env[CONNECTED] = True
        return env, ref

    def baseline_like(self, x: torch.Tensor) -> torch.Tensor:
        """The method's reference input for inputs like ``x``: (1, C, ...), a constant or one value per channel
        (:attr:`Method.baseline`; zero by default); (B, C, ...) for a graph whose sizes depend on the batch
        (:attr:`Graph.batch_sized`), where one image cannot be broadcast.

        Parameters
        ----------
        x : (B, C, ...) inputs
        """
        value = self.method.baseline
        if self.graph is not None and self.graph.batch_sized and len(x) > 1:
            return self.baseline_like(x[:1]).expand_as(x).clone()
        if isinstance(value, float):
            return torch.full_like(x[:1], value)
        if x.ndim < 2 or len(value) != x.shape[1]:
            raise AttributionError(f"{self.method.name!r}: the baseline has {len(value)} values but the inputs have "
                                   f"{x.shape[1] if x.ndim > 1 else 0} channels (shape {tuple(x.shape)})")
        per_channel = torch.tensor(value, dtype=x.dtype, device=x.device).reshape(1, -1, *([1] * (x.ndim - 2)))
        return per_channel.expand_as(x[:1]).clone()

    def _reference_env(self, x: torch.Tensor) -> dict[Any, Any]:
        """The forward pass of the reference input (1, ...): it depends on the model's tensors only, so it
        is kept until one of them changes (:mod:`attributions.derived`)."""
        graph = self.traced
        consts = [v for n in graph.nodes if isinstance(n.record, Const) and n.record.attribute is not None
                  for v in [n.evaluate({})]
                  if isinstance(v, torch.Tensor)]
        sources = [*self.model.parameters(), *self.model.buffers(), *consts]
        return self._reference.get(sources, lambda: self._run(self.baseline_like(x)),
                                   key=(tuple(x.shape[1:]), x.dtype, x.device, self.method.baseline,
                                        len(x) if self.traced.batch_sized else 1))

    def _signals(self, x: torch.Tensor, start: str, make_signal: Any, shared: SharedPass | None = None,
                 keep: Any = None) -> dict[Any, Any]:
        """Every node's signal (or only those named in ``keep``) for the signal ``make_signal(env)`` at
        ``start``. A forward pass made here (no ``shared`` pass), or handed over to be released, is released
        during the backward."""
        if keep is not None and self.by_autograd and (shared is None and self._fits_whole(x)
                                                      or shared is not None and shared.connected):
            return self._autograd_signals(x, start, make_signal, keep, shared)
        lean = None
        if shared is None and keep is not None:
            self._graph_for(x)
            lean = self._lean(frozenset(keep) | {start})
        env, ref = (shared.values, shared.reference) if shared is not None else self._forward_envs(x, lean=lean)
        factor = self.method.signal == "factor"
        with torch.no_grad():
            signal = self._start_signal(make_signal(env), env[start])
            # each vector's signals are as large as the forward values: chunks of vectors share the forward
            # (measured only under a budget: walking the forward pass's values costs a small map some percent)
            size = len(signal) if memory.budget() is None else memory.fitting(
                len(signal), held := memory.tensor_bytes(env), held)
            chunks = memory.spans(len(signal), size)
            parts = []
            for i, j in chunks:
                last = j == len(signal)
                taps = self._backward(env, ref, start, signal[i:j], keep,
                                      release=(shared is None or shared.release) and last,
                                      remat=lean.remat if lean is not None else frozenset())
                if ref is not None:  # DeepLIFT's signal: multiplier times the difference from the reference
                    taps = {k: v * (env[k] - ref[k]) for k, v in taps.items()}
                elif factor:  # the relevance: the factor times the value
                    taps = {k: v * env[k] for k, v in taps.items()}
                parts.append(taps)
        return memory.joined(parts, 0)

    def _start_signal(self, signal: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """The chain's signal (K, B, ...) at a start node of forward ``value`` (B, ...): as made, or for a chain in
        factor form (:attr:`Method.signal`) the relevance over the value."""
        if self.method.signal != "factor":
            return signal
        return signal / stabilize(value, self.method.params["epsilon"])

    def _autograd_signals(self, x: torch.Tensor, start: str, make_signal: Any, keep: Any,
                          shared: SharedPass | None = None) -> dict[Any, Any]:
        """:meth:`_signals` of a chain autograd can run (:attr:`by_autograd`): autograd's backward through a
        forward pass recorded whole (``_forward_envs(connected=True)``; ``shared``: one made beforehand), one
        call per signal vector. The rules compute the same products one node at a time, each with its own call."""
        if shared is None:  # values go once their last consumer has run: autograd keeps what it saves
            self._graph_for(x)
            env = self._forward_envs(x, connected=True, lean=self._lean(frozenset(keep) | {start}, autograd=True))[0]
        else:
            env = shared.values
        factor = self.method.signal == "factor"
        with torch.no_grad():
            signal = self._start_signal(make_signal(env), env[start].detach())
        root = env[start]
        # as the rule chain: signals for the nodes the backward from ``start`` passes (zeros where it brings none)
        below, frontier = {start}, [start]
        while frontier:
            for name in self.traced.by_name[frontier.pop()].inputs:
                if name not in below:
                    below.add(name)
                    frontier.append(name)
        names = [n.name for n in reversed(self.traced.nodes) if n.name in below and n.name in keep]  # the rules' order
        values = [env[n] for n in names]
        wanted = [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]
        # the pass is kept while another method or a later stage may read it, else autograd frees it as it goes
        retain = shared is not None and not shared.release
        grads: list[list[torch.Tensor | None]] = []
        for k, vector in enumerate(signal):
            grads.append(list(torch.autograd.grad(root, wanted, vector, retain_graph=retain or k < len(signal) - 1,
                                                  allow_unused=True)) if root.requires_grad and wanted
                         else [None] * len(wanted))
        taps = {}
        for name, value in zip(names, values):
            at = next((i for i, w in enumerate(wanted) if w is value), None)
            parts = [g[at] if at is not None else None for g in grads]
            taps[name] = torch.stack([torch.zeros_like(value) if g is None else g for g in parts])
            if factor:
                taps[name] = taps[name] * value.detach()
        return taps

    # --- public API --------------------------------------------------------------------------------

    def forward_pass(self, x: torch.Tensor, reference: bool | None = None, batch: torch.Size | None = None
                     ) -> ForwardPass:
        """Every node's value for ``x`` (B, ...), and with ``reference`` the reference input's.

        Parameters
        ----------
        x : Tensor
            (B, ...) inputs.
        reference : bool or None, default None
            Also run the method's reference input (:meth:`baseline_like`); None: when the method has
            one (DeepLIFT's multiplier signal).
        batch : torch.Size, optional
            The shape of the inputs ``x`` was taken from, named in the error when the forward pass fails
            (the user's inputs, not a probe's); default ``x.shape``.

        Returns
        -------
        ForwardPass
            ``values`` {node name: its output (B, ...)}, with the autograd graphs this method's rules
            read; ``reference`` the same for the reference input, else None.
        """
        self._graph_for(x)
        values, ref = self._forward_envs(x, with_ref=reference, batch=batch)
        return ForwardPass(self, x, values, ref)

    def maps_for_targets(self, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
                         **kwargs: Any) -> torch.Tensor:
        """Maps for several targets at once: (K, B, ...) for K target specifications.

        For the graph methods the K explained outputs travel down in ONE batched backward pass
        over one forward pass; the method's engine decides for the others.

        Parameters
        ----------
        x : Tensor
            (B, ...) inputs, in the model's floating-point dtype.
        targets : list
            K target specifications, each as :meth:`attribute`'s ``target``: an int, a (B,) tensor or
            sequence, or None for the predicted class.
        shared : SharedPass, optional
            A forward pass of the graph methods made beforehand (:func:`shared_forward`; one marked ``release``
            is freed during the backward); read by the rule-chain engines only. With it ``x`` is not checked
            again and the images are not split into chunks; None: the passes are made here, in chunks of images
            under a memory budget.
        **kwargs
            Passed to the method's engine; only integrated gradients reads them (captum's
            ``IntegratedGradients.attribute`` keywords, e.g. ``n_steps``, ``baselines``,
            ``internal_batch_size``).

        Returns
        -------
        Tensor
            (K, B, ...) the maps, shaped like ``x`` for each target, in ``x``'s dtype.
        """
        with self._budget():
            return self._maps_for_targets(x, targets, shared, prepared=False, **kwargs)

    def _maps_for_targets(self, x: torch.Tensor, targets: list[Any], shared: SharedPass | None, *, prepared: bool,
                          **kwargs: Any) -> torch.Tensor:
        """:meth:`maps_for_targets` within the explainer's budget; ``prepared``: a chunk's call, the method
        prepared for the whole batch."""
        x = self._check_input(x) if shared is None else x  # else checked when its forward pass was made
        if not prepared:
            self.method.engine.prepare(self, x)
        engine = self.method.engine
        n = self.images_per_pass(x, len(targets) * engine.passes) if engine.chunked and shared is None else len(x)
        if n < len(x):  # under a memory budget: images in chunks, each with its own forward pass
            return memory.joined([self._maps_for_targets(x[i:j], [_rows(t, i, j, len(x)) for t in targets], None,
                                                         prepared=True, **kwargs)
                                  for i, j in memory.spans(len(x), n)], 1)
        # under autocast (mixed precision) the passes run at half width; maps keep the inputs' dtype
        maps = self.method.engine.maps(self, x, targets, shared, **kwargs).to(x.dtype)
        if tuple(maps.shape) != (len(targets), *x.shape):  # never a map of another shape: an error, not a tensor
            layer = self.method.engine.conventions(self, x).get("layer")
            raise AttributionError(
                f"{self.method.name} gave maps of shape {tuple(maps.shape[1:])} for inputs of shape {tuple(x.shape)}"
                + (f": the layer it reads, {layer!r}, does not keep the inputs' batch axis and grid; give one that "
                   f"does (Explainer(model, {self.method.name!r}, layer=NODE), a node of .layers)" if layer else "")
                + ", or choose another method")
        return maps

    def chain_maps(self, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None) -> torch.Tensor:
        """The rule chain's maps for K targets (K, B, ...): one forward, one batched backward.

        The engine's step behind :meth:`maps_for_targets` (which checks ``x``, prepares the method and
        splits the images under a memory budget; this does none of these). Each target's signal starts
        at the logits as its one-hot vector, times the logits where the method starts from the logit
        (``Method.output``); the input's signal is multiplied by ``x`` for ``times_input`` methods, and
        for DeepLIFT is the multiplier times the difference from the reference.

        Parameters
        ----------
        x : Tensor
            (B, ...) inputs, already checked.
        targets : list
            K target specifications, as in :meth:`maps_for_targets`.
        shared : SharedPass, optional
            A forward pass made beforehand, as in :meth:`maps_for_targets`; None: one is made here,
            holding only what the backward reads, and released during it.

        Returns
        -------
        Tensor
            (K, B, ...) the maps, shaped like ``x`` for each target.
        """
        m = self.method

        def start(env: dict[Any, Any]) -> torch.Tensor:
            logits = env[self.traced.output]
            onehots = torch.stack([torch.zeros_like(logits).scatter_(1, self.targets(logits, t)[:, None], 1.0)
                                   for t in targets])
            return onehots * logits if m.output == "logit" else onehots

        taps = self._signals(x, self.traced.output, start, shared, keep={"input"})
        out: torch.Tensor = taps["input"]
        return out * x if m.times_input else out

    # captum's NoiseTunnel calls ``attribute.__wrapped__``, which captum's own decorator provides:
    # without it NoiseTunnel(Explainer(...)) fails. Its usage logging is inert outside captum.
    @log_usage()  # type: ignore[untyped-decorator]  # captum's decorator is untyped
    @leaves_process_alone
    def attribute(self, inputs: Any, target: Any = None, **kwargs: Any) -> torch.Tensor | tuple[torch.Tensor]:
        """Attribution maps for ``inputs`` (B, ...), shaped like the inputs.

        Parameters
        ----------
        inputs : tensor (B, ...), or a 1-tuple of it (captum style)
        target : int, (B,) tensor or list, or None for the predicted class
        **kwargs : passed to captum for ``integrated-gradients`` (e.g. ``n_steps``)
        """
        as_tuple = isinstance(inputs, tuple)
        if as_tuple and len(inputs) != 1:
            raise AttributionError(f"the engine explains single-input models; got a tuple of {len(inputs)} inputs")
        maps = self.maps_for_targets(inputs[0] if as_tuple else inputs, [target], **kwargs)[0]
        return (maps,) if as_tuple else maps

    def propagate(self, x: torch.Tensor, inject_at: str, vectors: torch.Tensor) -> dict[str, torch.Tensor]:
        """Inject K vectors as the backward signal at ``inject_at`` and record the signal below.

        Parameters
        ----------
        x : (B, ...) inputs
        inject_at : a name from :attr:`layers`
        vectors : (K, B, ...) shaped like that node's output

        Returns
        -------
        dict : {node name: (K, B, ...)} for every node below ``inject_at`` that the signal
            reaches, plus ``"input"``. One forward pass and one batched backward pass.
        """
        with self._budget():
            return self._propagate(x, inject_at, vectors, prepared=False)

    def _propagate(self, x: torch.Tensor, inject_at: str, vectors: torch.Tensor, *, prepared: bool
                   ) -> dict[str, torch.Tensor]:
        """:meth:`propagate` within the explainer's budget; ``prepared``: a chunk's call, the method prepared for
        the whole batch."""
        if not self.method.chain:
            raise AttributionError(f"{self.method.name!r} is not a backward chain of rules; propagate supports "
                                   f"the graph methods only")
        x = self._check_input(x)
        if not prepared:
            self.method.engine.prepare(self, x)
        if inject_at not in self.traced.layers:
            raise unknown_name("layer", inject_at, self.traced.layers, AttributionError)
        n = self.images_per_pass(x, len(vectors)) if vectors.ndim >= 2 and vectors.shape[1] == len(x) else len(x)
        if n < len(x):  # under a memory budget: images in chunks, each with its own forward pass
            return memory.joined([self._propagate(x[i:j], inject_at, vectors[:, i:j], prepared=True)
                                  for i, j in memory.spans(len(x), n)], 1)

        def start(env: dict[Any, Any]) -> torch.Tensor:
            expected = (env[inject_at].shape[0],) + tuple(env[inject_at].shape[1:])
            if vectors.ndim < 2 or tuple(vectors.shape[1:]) != expected:
                raise AttributionError(f"vectors must be (K, {', '.join(map(str, expected))}) for layer "
                                       f"{inject_at!r}, got {tuple(vectors.shape)}")
            return vectors.to(env[inject_at].dtype)

        taps = self._signals(x, inject_at, start)
        taps.pop(inject_at, None)
        return {k: v.to(x.dtype) for k, v in taps.items()}

    def _fits_whole(self, x: torch.Tensor) -> bool:
        """Whether a pass of all of ``x`` through autograd (the forward values and one signal at a time, however
        many vectors: one autograd call each) fits the memory budget: autograd's backward cannot be split."""
        return memory.fitting(len(x), lambda: 2 * self.bytes_per_image(x)) >= len(x)

    def _budget(self) -> contextlib.AbstractContextManager[None]:
        """The explainer's own budget (``max_memory``) for its calls, else nothing: the one in force applies."""
        return memory.limit(self.max_memory) if self.max_memory is not None else contextlib.nullcontext()

    # --- checks ------------------------------------------------------------------------------------

    def _need_graph_engine(self, what: str) -> None:
        if not self.method.engine.needs_graph:
            raise AttributionError(f"{what} is not available for the control method {self.method.name!r}")

    def _need_graph(self, what: str) -> Graph:
        self._need_graph_engine(what)
        if self.graph is None:
            raise AttributionError(f"{what}: the model is not captured yet (it is captured at its input shape); call "
                                   "capture(x) with example inputs first, or compute a map")
        return self.graph

    @property
    def traced(self) -> Graph:
        """The traced graph, once a pass has traced it (what the engines read after their forward pass); the
        toolkit's error before."""
        if self.graph is None:
            raise AttributionError(f"{self!r} has not captured its model yet: call attribute, forward_pass or "
                                   "capture(x) first")
        return self.graph

    def _check_input(self, given: Any) -> torch.Tensor:
        x = check_input(given)
        bad = nonfinite_tensors(self.model)
        if bad:
            raise AttributionError(f"the model has NaN or infinite values in {len(bad)} tensor(s) ({named(bad)}); "
                                   "its maps would mean nothing: repair or retrain it")
        dtype = model_dtype(self.model)
        if dtype is not None and x.dtype != dtype:  # else torch's own "expected scalar type" error, deep inside
            raise AttributionError(f"inputs are {x.dtype} but the model computes in {dtype}; convert them with "
                                   f"x.to({dtype}) (half-precision maps are not supported: use float32 or float64)")
        self._graph_for(x)
        return x

    @staticmethod
    def targets(logits: torch.Tensor, target: Any) -> torch.Tensor:
        """The explained class per sample (B,): ``target`` as an int, a (B,) sequence, or None (argmax). A
        one-element tensor or sequence stands for every sample, as captum reads it (its NoiseTunnel hands a
        single image's target on so to the noisy copies)."""
        if logits.ndim != 2:
            raise AttributionError(f"the model's output must be (B, classes) logits, got shape {tuple(logits.shape)}; "
                                   "wrap the model so that it returns them, e.g. nn.Sequential(model, nn.Flatten())")
        b, classes = logits.shape[0], logits.shape[1]
        if target is None:
            return logits.argmax(1)
        t = torch.as_tensor(np.asarray(target) if not isinstance(target, torch.Tensor) else target)
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise AttributionError(f"target must be integer class indices, got {t.dtype} {t.tolist()}; a float "
                                   "target is not rounded for you")
        t = t.to(device=logits.device, dtype=torch.long)
        if t.ndim <= 1 and t.numel() == 1:
            t = t.reshape(()).expand(b)
        if t.shape != (b,):
            raise AttributionError(f"target must be an int or have shape ({b},), got shape {tuple(t.shape)}")
        if bool(((t < 0) | (t >= classes)).any()):
            raise AttributionError(f"target out of range: the model has {classes} classes, got {t.tolist()}")
        return t


def _shape_key(shape: tuple[Any, ...] | torch.Size, dynamic: bool) -> tuple[Any, ...]:
    """The key of a graph captured at ``shape``: sizes other than the batch, and the batch if fixed."""
    return (tuple(shape[1:]), None if dynamic else shape[0])


def _rows(target: Any, start: int, stop: int, batch: int) -> Any:
    """The part of a target specification for the images [start, stop) of a batch of ``batch``."""
    if target is None or isinstance(target, int) or (isinstance(target, torch.Tensor) and target.ndim == 0):
        return target
    if len(target) != batch:  # a bad shape: left whole, so the usual error names it
        return target
    return target[start:stop]


def model_dtype(model: nn.Module) -> torch.dtype | None:
    """The floating-point dtype the model computes in (its first floating parameter's); None without one."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def check_input(x: Any) -> torch.Tensor:
    """``x`` detached, after checking it is a finite floating-point tensor (B, ...) with B >= 1."""
    if not isinstance(x, torch.Tensor):
        hint = " (torch.from_numpy(x) makes one of a numpy array)" if type(x).__module__ == "numpy" else ""
        raise AttributionError(f"inputs must be a torch.Tensor (B, ...), got a {type(x).__module__}."
                               f"{type(x).__qualname__}; pass a floating-point tensor{hint}")
    if not x.is_floating_point():
        raise AttributionError(f"inputs must be a floating-point tensor (B, ...), got dtype {x.dtype}; convert it "
                               "with x.float()")
    if x.ndim < 2 or x.shape[0] == 0:
        raise AttributionError(f"inputs must have a batch axis and at least one sample, got shape {tuple(x.shape)}")
    # one reduction instead of three elementwise passes: a NaN or an infinity makes the sum non-finite; a
    # finite sum that overflowed is told apart by the exact test, run only then
    if not torch.isfinite(x.sum()) and not torch.isfinite(x).all():
        raise AttributionError("inputs contain NaN or infinite values")
    return x.detach()


_UNREACHED = object()  # a node the backward pass has not reached (None: reached with no signal)


def shared_forward(explainers: dict[str, Explainer], x: torch.Tensor, reuse: Reuse | None = None
                   ) -> SharedPass | None:
    """One forward pass (and one reference pass, if a DeepLIFT method needs it) for all the graph
    methods among ``explainers``, which must share one traced graph (build them with ``graph=``).

    ``reuse``: (the values of an earlier shared pass on ``x``, the nodes it may give): the nodes a
    model change left upstream of (a randomization stage's untouched lower layers) are not recomputed.
    """
    chains = [e for e in explainers.values() if e.method.chain]
    if not chains:
        return None
    if len({id(e.graph) for e in chains}) > 1:
        raise AttributionError("explainers sharing a forward pass must be built on one traced graph (pass graph=)")
    if memory.fitting(len(x), lambda: 2 * max(e.bytes_per_image(x) for e in chains)) < len(x):
        # over the memory budget: each explainer goes in chunks of images
        return None
    x = chains[0]._check_input(x) if reuse is None else x  # else checked for the earlier pass
    values, reference = chains[0]._forward_envs(
        x, any(e.method.signal == "multiplier" for e in chains), frozenset().union(*(e.recorded for e in chains)),
        reuse=reuse,
        # ops in surrogate form (factor chains, guided backprop) serve one method only
        connected=all(e.by_autograd for e in chains) and (len(chains) == 1 or not any(e.surrogates for e in chains)))
    return SharedPass(values, reference)


def attribute_many(explainers: dict[str, Explainer], x: torch.Tensor, targets: list[Any],
                   shared: SharedPass | None = None) -> dict[str, torch.Tensor]:
    """Maps of several methods on ONE model for K targets: {label: (K, B, ...)}.

    The graph methods share one forward pass (see :func:`shared_forward`; ``shared`` reuses one) and
    each explains all K targets in one batched backward pass.
    """
    made = shared is None
    shared = shared if shared is not None else shared_forward(explainers, x)
    last = next((label for label, ex in reversed(explainers.items()) if ex.method.chain), None)
    out = {}
    for label, ex in explainers.items():
        own = None  # controls, or over the memory budget: each method its own (chunked) passes
        if ex.method.chain and shared is not None:
            # nobody reads the pass made here after the last method: it is released
            own = shared.for_reader(reference=ex.method.signal == "multiplier", last=made and label == last)
        out[label] = ex.maps_for_targets(x, targets, own)
    return out
