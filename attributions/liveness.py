"""What a forward pass made for one backward holds: the values the rules read, as autograd saves only what its
backward needs.

Each rule says what it reads beyond shapes (:meth:`~attributions.rules.Rule.reads_for`: its inputs, its
output, nothing) and which of its inputs it passes no signal (:meth:`~attributions.rules.Rule.silent`: an
operand held constant); the nodes no signal reaches are neither read nor recorded. A value no rule reads goes
once the last op that consumes it has run; it leaves a stand-in of its shape
(:func:`~attributions.memory.stand_in`) for the rules that read shapes. A value that a rule reads but that an
element-wise op (an activation, a normalisation, a softmax, data movement, an element-wise mix) recomputes
cheaply from values held anyway goes too, and is recomputed where it is read ("rematerialised"). A node's
autograd graph is recorded where its inputs are held anyway (it keeps them, and what autograd saves, not the
output); elsewhere its rule differentiates the op again. Values under :data:`~attributions.memory.SMALL` bytes
stay whatever the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attributions.fusion import Fusion
from attributions.graph import Graph
from attributions.kinds import RECOMPUTED_KINDS, SIGNAL_KINDS

# cheap to recompute from their inputs: one or a few element-wise passes
MAX_CHAIN = 3  # ops recomputed in a row for one value, at most


@dataclass(frozen=True)
class Lean:
    """The plan of a forward pass for one backward.

    Attributes
    ----------
    free : {node position: the values that go once that node, their last consumer, has run}
    remat : the values recomputed where a rule reads them (from held values, in chains of at most
        :data:`MAX_CHAIN` ops)
    """

    free: dict[int, list[str]]
    remat: frozenset[str]
    reached: frozenset[str] = frozenset()  # the nodes the backward can reach (below the rest, no rule passes a signal)
    fused: dict[str, Fusion] = field(default_factory=dict[str, "Fusion"])  # attentions run as one op, by output
    skipped: frozenset[str] = frozenset()  # the nodes those fused ops stand in for: the pass computes none of them

    @property
    def freed(self) -> frozenset[str]:
        """Every value the pass frees."""
        return frozenset(n for names in self.free.values() for n in names)


def _cheap(node: Any) -> bool:
    return node.kind in RECOMPUTED_KINDS or node.is_elementwise_mix


def plan(graph: Graph, rules: dict[str, Any], keep: frozenset[str], fused: dict[str, Fusion] | None = None) -> Lean:
    """The plan for ``graph`` under ``rules`` ({node: rule}) when the backward returns the signals at
    ``keep``; ``fused``: attentions run as one op (:func:`attributions.fusion.plan`), which read their query,
    key and value in place of the nodes they stand in for."""
    fused = fused or {}
    skipped = frozenset(n for f in fused.values() for n in f.inner)
    protected = set(keep) | {graph.output, "input"}  # read after the backward: never freed
    # the nodes a signal can reach from where the backward may start (the output, or a node kept), as the rules
    # pass it: an operand a rule holds constant (a gate) gets none, nor what lies below it on that path alone
    reached = (set(keep) | {graph.output}) - {"input"}
    for node in reversed(graph.nodes):
        rule = rules.get(node.name)
        if node.name in reached and rule is not None:
            reached.update(set(node.inputs) - rule.silent(node))
    needed = set(protected)
    for node in graph.nodes:
        rule = rules.get(node.name)
        if rule is None or node.name not in reached:
            continue
        reads = rule.reads_for(node)
        if "output" in reads:
            needed.add(node.name)
        if "inputs" in reads:
            needed.update(rule.inputs_read(node))
    depth: dict[str, int] = {}  # of the recomputation chain behind each rematerialised value
    for node in graph.nodes:  # in forward order: what a recomputation reads is held or recomputed itself
        if node.name in protected or not _cheap(node):
            continue
        chain = 1 + max((depth.get(i, 0) for i in node.inputs), default=0)
        if chain <= MAX_CHAIN and all(i in depth or i in needed for i in node.inputs):
            depth[node.name] = chain
    remat = set(depth)
    held = needed - remat
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    consumers: dict[str, list[str]] = {n.name: [] for n in graph.nodes}
    for node in graph.nodes:
        if node.name not in skipped:
            for i in fused[node.name].operands if node.name in fused else node.inputs:
                consumers[i].append(node.name)
    free: dict[int, list[str]] = {}
    for node in graph.nodes:
        if node.kind in SIGNAL_KINDS and node.name not in held and node.name not in skipped:
            last = max((position[c] for c in consumers[node.name]), default=position[node.name])
            free.setdefault(last, []).append(node.name)
    return Lean(free, frozenset(remat), frozenset(reached | {"input"}), fused, skipped)
