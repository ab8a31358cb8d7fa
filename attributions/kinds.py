"""The node kinds of the traced graph: one entry per kind, from which every kind table of the engine comes.

A node's kind says which rule of a method acts at it and what it records about its op
(:mod:`attributions.records`). Each kind's :class:`KindSpec` states, once, the facts other modules used to
spell as their own tuples: whether the kind carries the signal (a rule acts at it) or is a constant of the
backward pass, whether it is a weighted layer (the layers LRP's rules split), whether CSC records the backward
signal at it, whether a backward pass recomputes its value rather than keeping it, and whether it maps values
position by position (keeping the channel layout). Adding a kind adds one entry here, its rules in every
method's table (a table that misses a kind is refused when the method is built) and their tests.

Whether a backward pass is linear in the signal is not a kind's property but its rule's
(:attr:`attributions.rules.Rule.linear_in_signal`): a ReLU is linear in the signal under the gradient's rule and
not under guided backprop's.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from attributions.records import Activation, Const, LeakyReLU, Mix, Move, Norm, Plain, Product, Record, Reduce, Softmax


class Kind(StrEnum):
    """The node kinds (each equal to its name, the string rule tables and records key it by)."""

    INPUT = "input"
    VALUE = "value"
    CONST = "const"
    DENSE = "dense"
    CONV = "conv"
    AFFINE = "affine"
    AVGPOOL = "avgpool"
    RELU = "relu"
    LEAKY_RELU = "leaky_relu"
    MAXPOOL = "maxpool"
    ADD = "add"
    MOVE = "move"
    MIX = "mix"
    ACTIVATION = "activation"
    PRODUCT = "product"
    NORM = "norm"
    SOFTMAX = "softmax"
    REDUCE = "reduce"

    def __repr__(self) -> str:  # read as its name in messages, as the string it is equal to
        return repr(self.value)


@dataclass(frozen=True)
class KindSpec:
    """What a kind is.

    Parameters
    ----------
    record : the record type its nodes hold (:mod:`attributions.records`)
    signal : it carries the signal, so every method's rule table has a rule for it; else it is the input or a
        constant of the backward pass
    weighted : linear in its input with weights of a layer (conv, dense, BatchNorm, average pooling): the
        layers LRP's rules split by the sign of their contributions
    recorded : CSC records the backward signal at it (a layer, a nonlinearity, a join of branches)
    recomputed : a backward pass recomputes its value from its inputs rather than keep it (cheap and
        element-wise, or data movement)
    elementwise : it maps values position by position, so its output keeps its input's channel layout
    weight : it reads a weight tensor of a layer (conv, dense, BatchNorm), which the weight-splitting rules split
    activation : an element-wise nonlinearity of one signal (ReLU, leaky ReLU, the others)
    traced : the generic rules run its traced op itself (data movement, mixing, activations, products,
        normalisations, softmax, reductions)
    linear : its op is linear in its signals (weighted layers, data movement, linear mixing): its adjoint is the same
        wherever it is taken
    """

    record: type[Record]
    signal: bool = True
    weighted: bool = False
    recorded: bool = False
    recomputed: bool = False
    elementwise: bool = False
    weight: bool = False
    activation: bool = False
    traced: bool = False
    linear: bool = False


KINDS: dict[Kind, KindSpec] = {
    Kind.INPUT: KindSpec(Plain, signal=False, recorded=True),
    Kind.VALUE: KindSpec(Plain, signal=False),
    Kind.CONST: KindSpec(Const, signal=False),
    Kind.DENSE: KindSpec(Plain, weighted=True, recorded=True, weight=True, linear=True),
    Kind.CONV: KindSpec(Plain, weighted=True, recorded=True, weight=True, linear=True),
    Kind.AFFINE: KindSpec(Plain, weighted=True, recorded=True, weight=True, linear=True),
    Kind.AVGPOOL: KindSpec(Plain, weighted=True, recorded=True, linear=True),
    Kind.RELU: KindSpec(Plain, recorded=True, elementwise=True, activation=True),
    Kind.LEAKY_RELU: KindSpec(LeakyReLU, recorded=True, elementwise=True, activation=True),
    Kind.MAXPOOL: KindSpec(Plain, recorded=True),
    Kind.ADD: KindSpec(Plain, recorded=True, elementwise=True),
    Kind.MOVE: KindSpec(Move, recomputed=True, traced=True, linear=True),
    Kind.MIX: KindSpec(Mix, recorded=True, elementwise=True, traced=True, linear=True),
    Kind.ACTIVATION: KindSpec(Activation, recorded=True, recomputed=True, elementwise=True, activation=True,
                              traced=True),
    Kind.PRODUCT: KindSpec(Product, recorded=True, elementwise=True, traced=True),
    Kind.NORM: KindSpec(Norm, recorded=True, recomputed=True, traced=True),
    Kind.SOFTMAX: KindSpec(Softmax, recorded=True, recomputed=True, elementwise=True, traced=True),
    Kind.REDUCE: KindSpec(Reduce, traced=True),
}


def _kinds(**facts: bool) -> tuple[Kind, ...]:
    return tuple(k for k, spec in KINDS.items() if all(getattr(spec, f) == v for f, v in facts.items()))


# the weighted layers; every kind that carries the signal (each has a rule); the others
LINEAR_KINDS = _kinds(weighted=True)
SIGNAL_KINDS = _kinds(signal=True)
CONSTANT_KINDS = _kinds(signal=False)
RECORDED_KINDS = _kinds(recorded=True)  # CSC's recorded layers
RECOMPUTED_KINDS = _kinds(recomputed=True)  # recomputed in a backward pass (a mix only when element-wise)
ELEMENTWISE_KINDS = _kinds(elementwise=True)
WEIGHT_KINDS = _kinds(weight=True)  # the layers with a weight tensor
ACTIVATION_KINDS = _kinds(activation=True)
TRACED_KINDS = _kinds(traced=True)  # the generic rules run the traced op itself
LINEAR_TRACED_KINDS = _kinds(traced=True, linear=True)  # of those, linear in their signals
RECORDS: dict[Kind, type[Record]] = {k: spec.record for k, spec in KINDS.items()}


def default(kind: Kind) -> Record:
    """The record of a ``kind`` node with nothing to say (a TypeError for kinds whose record has required
    fields, and for unknown kinds)."""
    if kind not in RECORDS:
        raise TypeError(f"unknown kind {kind!r}: the kinds are {', '.join(RECORDS)}")
    return RECORDS[kind]()


def check(name: str, kind: Kind, record: Record) -> None:
    """Raise TypeError unless ``record`` is the record type ``kind`` takes."""
    expected = RECORDS.get(kind)
    if expected is None:
        raise TypeError(f"node {name!r}: unknown kind {kind!r}")
    if type(record) is not expected:
        raise TypeError(f"node {name!r} of kind {kind!r} takes a {expected.__name__} record, "
                        f"got {type(record).__name__}")
