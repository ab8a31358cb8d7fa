"""What a node of each kind records about its op, beyond its inputs: one small typed record per kind.

The graph builder fills them from the exported op's arguments; the graph passes replace them (records
are frozen, so a pass that changes one makes a new one); the rules read them. A kind with nothing to
record takes :class:`Plain`. Which record each kind takes is the kind's (:mod:`attributions.kinds`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Record:
    """Base of the per-kind records."""


@dataclass(frozen=True)
class Plain(Record):
    """Nothing beyond the node's inputs and layer: the input, values, ReLU, pooling, sums, weighted layers."""


@dataclass(frozen=True)
class Const(Record):
    """A constant of the backward pass.

    attribute : the model tensor it is (a parameter or buffer's fully-qualified name, ``constant.<name>``
        for a tensor export lifted), or None for a value computed in ``forward``.
    """

    attribute: str | None = None


@dataclass(frozen=True)
class Move(Record):
    """Data movement (a view, an index, a concatenation): linear, each output value one input value.

    reshape : a plain reshape (its adjoint is the inverse reshape); identity : the value unchanged
    (dropout in eval, an alias); cat : it joins branches (a concatenation or stack).
    """

    reshape: bool = False
    identity: bool = False
    cat: bool = False


@dataclass(frozen=True)
class Mix(Record):
    """A linear op without a layer's weights (sums, means, matmul by a constant, bilinear upsampling).

    elementwise : it maps values position by position (add, mul by a constant, where), cheap to recompute.
    """

    elementwise: bool = False


@dataclass(frozen=True)
class Activation(Record):
    """An element-wise nonlinearity of one signal: ``function`` is the op's name ("gelu", "div" for c / x)."""

    function: str


@dataclass(frozen=True)
class LeakyReLU(Record):
    negative_slope: float = 0.01


@dataclass(frozen=True)
class Softmax(Record):
    dim: int = -1


@dataclass(frozen=True)
class Reduce(Record):
    """A nonlinear reduction (a norm, a max) over ``dims``, or over every axis when None."""

    dims: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Norm(Record):
    """A normalisation computing its statistics from the signal.

    type : "layer", "group" or "batch" (BatchNorm in training mode, or without running statistics);
    arguments : the op's other arguments by name (weight, bias, eps, normalized_shape, num_groups...),
        node references for those computed in the graph.
    """

    type: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Product(Record):
    """A product (or quotient) of two signals.

    operands : the names of the two signal operands, in argument order; pair(env, a, b) : the op on
        operands a and b, its other arguments from env; quotient : a / b; gates : for each operand,
        whether a gating function (sigmoid, softmax) computed it (set by the ``mark_gates`` pass); op : the
        aten op's name ("mul", "matmul", ...) where the operands are its only two arguments, in order, else "".
    """

    operands: tuple[str, str]
    pair: Callable[[dict[str, Any], Any, Any], Any]
    quotient: bool = False
    gates: tuple[bool, bool] = (False, False)
    op: str = ""
