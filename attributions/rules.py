"""Rules: the backward of one node kind, given the node's stored forward tensors.

A rule maps the signal at a node's output, shaped (K, B, ...), to the signals at its tensor
inputs. Signals are relevance for LRP rules, (modified) gradients for gradient rules and
multipliers for DeepLIFT. Conventions follow zennit / iNNvestigate: a stabiliser adds epsilon
with the sign of the denominator (sign(0) = +1); alpha-beta splits inputs and weights by sign.

Each rule class names the node kinds it can act on (``kinds``); :data:`NAMED` lists the rules a
user can pick by name in ``Explainer(..., rules={...})``, and :func:`available` their formulas.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._pytree import tree_leaves, tree_map

from attributions.errors import AttributionError, unknown_name
from attributions.graph import Graph, Node
from attributions.kinds import ACTIVATION_KINDS, LINEAR_KINDS, LINEAR_TRACED_KINDS, TRACED_KINDS, WEIGHT_KINDS, Kind
from attributions.linear_ops import LinearOp, to_winners
from attributions.records import LeakyReLU, Norm, Product, Record, Reduce, Softmax

R = TypeVar("R", bound=Record)



@dataclass(frozen=True, kw_only=True)
class Context:
    """What a rule may read: the node's op, its inputs and output, and (DeepLIFT) their references; built by
    keyword."""

    node: Node
    inputs: list[torch.Tensor]
    output: torch.Tensor
    op: LinearOp | None = None
    ref_inputs: list[torch.Tensor] | None = None
    ref_output: torch.Tensor | None = None
    indices: torch.Tensor | None = None  # max pooling: the winners of the forward pass
    ref_indices: torch.Tensor | None = None
    env: dict[Any, Any] | None = None  # every node's value: the generic rules re-run the node's operation on it
    graph: Graph | None = None  # the traced graph, for rules that look at a node's neighbours (RevealCancel)

    @property
    def x(self) -> torch.Tensor:
        return self.inputs[0]

    @property
    def layer(self) -> LinearOp:
        """The weighted layer's operator (the rules of weighted kinds only get nodes that have one)."""
        if self.op is None:
            raise AttributionError(f"node {self.node.name!r} has no weighted layer for its rule")
        return self.op

    @property
    def values(self) -> dict[Any, Any]:
        """Every node's forward value (the generic rules re-run a node's operation on them)."""
        if self.env is None:
            raise AttributionError(f"the rule of node {self.node.name!r} needs the forward pass's values")
        return self.env

    @property
    def winners(self) -> torch.Tensor:
        """Max pooling's winners in the forward pass."""
        if self.indices is None:
            raise AttributionError(f"node {self.node.name!r}: max pooling's winners were not recorded")
        return self.indices

    @property
    def references(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The inputs and output of the node on the reference (DeepLIFT's rules only run with one)."""
        if self.ref_inputs is None or self.ref_output is None:
            raise AttributionError(f"the rule of node {self.node.name!r} needs the reference's forward pass")
        return self.ref_inputs, self.ref_output

    @property
    def recorded(self) -> bool:
        """Whether the forward pass recorded the node's autograd graph."""
        return self.env is not None and (self.node.name, "graph") in self.env

    def apply(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The node's operation with its signal inputs set to ``inputs`` (the rest from the forward pass)."""
        out: torch.Tensor = self.node.evaluate(self.values, dict(zip(self.node.inputs, inputs)))
        return out

    def vjp(self, signal: torch.Tensor, at: list[torch.Tensor] | None = None,
            function: Callable[..., torch.Tensor] | None = None) -> list[torch.Tensor]:
        """The exact vector-Jacobian products of ``function`` (default: the node's operation) at ``at``
        (default: its forward inputs) for K signals (K, B, ...) at once -> one (K, B, ...) per input.

        The node's own operation at its forward inputs uses the autograd graph recorded in the forward
        pass when there is one (``env[(name, "graph")]``): nothing is re-run."""
        recorded = self.env.get((self.node.name, "graph")) if self.env is not None else None
        if recorded is not None and at is None and function is None:
            leaves, edge = recorded
            return _autograd_vjp(edge, leaves, signal, retain_graph=True)
        primals = at if at is not None else self.inputs
        pullback = torch.func.vjp(function or self.apply, *primals)[1]
        if tree_leaves(signal)[0].shape[0] == 1:  # one signal (a map): no batching; tuples (chunks) stay tuples
            return [tree_map(lambda t: t[None], g) for g in pullback(tree_map(lambda t: t[0], signal))]
        return list(torch.func.vmap(pullback)(signal))

    def linear_vjp(self, signal: torch.Tensor) -> list[torch.Tensor]:
        """The vector-Jacobian products of an op linear in its signal inputs, which do not depend on
        where they are taken: at stand-ins of one element (through a view this costs nothing), or at
        zeros where the op needs real strides. signal (K, B, ...) -> one (K, B, ...) per input."""
        def at(point: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
            with torch.enable_grad():
                points = [point(t) for t in self.inputs]
                out = self.apply(*points)
            return _autograd_vjp(out, points, signal)

        try:
            return at(lambda t: t.new_zeros(()).requires_grad_().expand(t.shape))
        except RuntimeError:  # an op the stride-0 stand-in cannot take (a view needing real strides)
            return at(lambda t: torch.zeros(t.shape, dtype=t.dtype, device=t.device).requires_grad_())


def _autograd_vjp(root: Any, inputs: list[torch.Tensor], signal: torch.Tensor, retain_graph: bool = False
                  ) -> list[torch.Tensor]:
    """Autograd's vector-Jacobian products from ``root`` (a tensor or its gradient edge) to ``inputs``
    for K signals (K, B, ...) at once -> one (K, B, ...) per input (zeros where an input is unused)."""
    batched = signal.shape[0] > 1
    grads = torch.autograd.grad([root], inputs, [signal if batched else signal[0]], retain_graph=retain_graph,
                                allow_unused=True, is_grads_batched=batched)
    return [signal.new_zeros((signal.shape[0], *t.shape)) if g is None else (g if batched else g[None])
            for g, t in zip(grads, inputs)]


def stabilize(z: torch.Tensor, epsilon: float) -> torch.Tensor:
    """z + epsilon * sign(z), with sign(0) = +1 (copysign of +0 is +)."""
    return torch.copysign(torch.tensor(epsilon, dtype=z.dtype), z).add_(z)


def ratio(signal: torch.Tensor, z: torch.Tensor, epsilon: float, scale: float = 1.0,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """scale * signal / stabilize(z, epsilon): signal (K, B, ...), z (B, ...) -> (K, B, ...), into ``out``
    if given; ``epsilon=0`` for a z already kept away from 0. Written to touch each activation-sized
    tensor as few times as possible: on large feature maps these element-wise passes, not the
    convolutions, decide a rule's cost."""
    result = torch.div(signal, stabilize(z, epsilon) if epsilon else z, out=out)
    return result if scale == 1.0 else result.mul_(scale)


def _signed(x: torch.Tensor, probe: int = 4096) -> bool:
    """Whether ``x`` holds a value that is not >= 0 (a negative or NaN). A leading slice is looked at first (a
    layer's inputs are mostly of both signs, or of none after a ReLU); the whole only when the slice has none."""
    if x.numel() > probe:
        head = x.view(-1)[:probe] if x.is_contiguous() else x[(0,) * (x.ndim - 1)]
        if not bool(head.amin() >= 0):
            return True
    return x.numel() > 0 and not bool(x.amin() >= 0)


def _scaled(signal: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """A signal (K, B, ...) times a freshly computed ``factor`` (B, ...), written into ``factor`` when K = 1 (one
    allocation and its page faults fewer on large feature maps)."""
    return factor.mul_(signal[0]).unsqueeze(0) if signal.shape[0] == 1 else signal * factor


class Rule:
    """Backward of one node: ``backward(ctx, signal) -> [signal per tensor input]``, called under
    ``torch.no_grad()`` (rules write into preallocated buffers).

    ``kinds``: the node kinds the rule can act on (a rule map that puts it elsewhere is refused).
    """

    kinds: tuple[Kind, ...] = ()
    records = False  # reads the node's vector-Jacobian product at its forward inputs (Context.vjp)
    # the forward values it reads beyond their shapes ("inputs", "output"): a forward pass made for one
    # backward frees the others once no later op reads them, as autograd saves only what a backward needs
    reads: tuple[str, ...] = ("inputs", "output")
    # whether the backward is linear in the propagated signal (the condition of Sixt et al.'s Theorem 1: a chain of
    # such rules is a product of matrices and can converge to rank 1); a ReLU or threshold on the signal is not
    linear_in_signal = True
    # whether its backward is a non-negative matrix (the z+ family's shares, DeepLIFT-Ablation's W+): the chains
    # Sixt et al.'s Theorem 1 proves converge to rank 1 are products of such matrices
    nonnegative = False
    # whether the relevance it hands an input is that input times a factor, R_in = x * c (the epsilon / z / z+ /
    # alpha-beta / gamma forms): at the first layer it makes an LRP map an input multiplier (Kindermans et al. 2019)
    proportional_to_input = False
    # whether the backward is the node's exact gradient (the vector-Jacobian product autograd computes): a
    # chain of such rules is the model's gradient, which the engine then takes from autograd in one call
    exact_gradient = False
    # whether the backward is autograd's gradient through :meth:`surrogate` (a rule in factor form: the op with
    # parts held constant); a chain of such rules and exact gradients, too, runs as one autograd call
    traceable = False

    def backward(self, ctx: Context, signal: torch.Tensor) -> Sequence[torch.Tensor | None]:
        """The signal (K, B, ...) of each input (in ``ctx.node.inputs`` order); None for an input no signal
        reaches (an operand held constant), which spares the passes below it on that path."""
        raise NotImplementedError

    def surrogate(self, ctx: Context) -> torch.Tensor:
        """The node's output from its inputs ``ctx.inputs`` (tensors autograd records), of the op's value, whose
        gradient is :meth:`backward` (rules with :attr:`traceable` only)."""
        raise NotImplementedError(f"{type(self).__name__} has no surrogate")

    def reads_for(self, node: Node) -> tuple[str, ...]:
        """What the rule reads at ``node`` (:attr:`reads`, or less where the node's op makes it so)."""
        return self.reads

    def inputs_read(self, node: Node) -> tuple[str, ...]:
        """The inputs of ``node`` whose values the rule reads when :meth:`reads_for` names "inputs"."""
        return tuple(node.inputs)

    def silent(self, node: Node) -> frozenset[str]:
        """The inputs of ``node`` the rule never passes a signal (returns None for)."""
        return frozenset()

    def gradient_scales(self, node: Node) -> tuple[float, ...] | None:
        """The backward as the exact gradient times a constant per input (per operand of a product, in its
        record's order), or None where it is not one: fused ops then stand in for the node
        (:mod:`attributions.fusion`)."""
        if not self.exact_gradient:
            return None
        return (1.0,) * len(node.record.operands if isinstance(node.record, Product) else node.inputs)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


# --- linear layers ---------------------------------------------------------------------------------

class Gradient(Rule):
    """The plain vector-Jacobian product W^T s (also DeepLIFT's multipliers through linear layers)."""

    kinds = LINEAR_KINDS
    reads = ()
    exact_gradient = True

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        w, _ = ctx.layer.weights()
        return [ctx.layer.transpose(signal, w, ctx.x.shape)]


class Epsilon(Rule):
    """LRP-epsilon: R_in = x * W^T (R / stab(z)), z = W x + b. With a tiny epsilon: LRP-z.

    Parameters
    ----------
    epsilon : float
        added to each denominator with its sign (1e-6; a tiny value gives LRP-z)
    """

    kinds = LINEAR_KINDS
    proportional_to_input = True

    def __init__(self, epsilon: float = 1e-6):
        self.epsilon = epsilon

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        w, _ = ctx.layer.weights()
        return [ctx.layer.transpose(ratio(signal, ctx.output, self.epsilon), w, ctx.x.shape).mul_(ctx.x)]


class AlphaBeta(Rule):
    """LRP-alpha-beta, alpha - beta = 1, inputs and weights split by sign.

    z+ = x+ w+ + x- w- (+ b+), z- = x+ w- + x- w+ (+ b-); positive relevance flows along z+
    scaled by alpha, negative along z- scaled by beta. ``bias=False`` drops the bias (the
    classic z+ rule). alpha = 1, beta = 0 is z+.

    Parameters
    ----------
    alpha : float
        weight of the positive relevance (alpha - beta must be 1)
    beta : float
        weight of the negative relevance
    bias : bool
        whether the bias takes part in z+ and z- (False: the classic z+ rule)
    stabilizer : float
        added to each denominator, away from 0
    """

    kinds = WEIGHT_KINDS
    proportional_to_input = True

    def __init__(self, alpha: float = 1.0, beta: float = 0.0, bias: bool = True, stabilizer: float = 1e-6):
        if abs(alpha - beta - 1.0) > 1e-9:
            raise ValueError(f"alpha - beta must be 1, got alpha={alpha}, beta={beta}")
        self.alpha, self.beta, self.bias, self.stabilizer = alpha, beta, bias, stabilizer

    @property
    def nonnegative(self) -> bool:  # type: ignore[override]  # z+ (beta = 0): each input's share of z+ is >= 0
        return not self.beta

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        op, x = ctx.layer, ctx.x
        w, b = op.weights()
        if not _signed(x):
            # Inputs after a ReLU: x- = 0, so z+ = W+ x + b+ >= 0 and z- = z - z+ <= 0 have known signs
            # (stabilised away from 0 without a sign pass), and z- needs no second forward.
            wp, wn = op.signed()
            zp = op.forward(x, wp, b.clamp(min=0) if self.bias and b is not None else None)
            if not self.beta:
                return [op.transpose(ratio(signal, zp.add_(self.stabilizer), 0.0, self.alpha), wp, x.shape).mul_(x)]
            # -z- >= 0 up to rounding; alpha R+ - beta R- = W+^T (alpha s / z+) + W-^T (beta s / -z-)
            zn = (zp - ctx.output).clamp_(min=0) if self.bias else op.forward(x, wn).neg_()
            buffer, sp, sn = op.halves(signal)
            ratio(signal, zp.add_(self.stabilizer), 0.0, self.alpha, out=sp)
            ratio(signal, zn.add_(self.stabilizer), 0.0, self.beta, out=sn)
            return [op.transpose_stacked(buffer, x.shape).mul_(x)]
        # Inputs of both signs. Term by term x+ w+ + x- w- = (|x||w| + xw) / 2 and x+ w- + x- w+ = (xw - |x||w|) / 2,
        # so with z = W x + b from the forward pass, one more pass t = |W||x| + |b| (b+ - b- = |b|; -b without the
        # bias) gives 2 z+ = z + t and 2 z- = z - t, where the split takes four; and the relevance
        # alpha s+ c+ - beta s- c- sums to |x| |W|^T(q+ + q-) + x W^T(q+ - q-), q = scale s / (2 z): two transposes,
        # not four. The stabiliser rides in that pass's bias (the product adds it in place): with t + 2 stabilizer,
        # 2 z+ + 2 stabilizer and 2 z- - 2 stabilizer come out of one pass each, clamped at +-2 stabilizer (z+ >= 0
        # and z- <= 0 up to the sum's rounding).
        ax, aw = x.abs(), op.absolute()
        e2 = 2 * self.stabilizer
        shift = torch.full((aw.shape[0],), e2, dtype=aw.dtype, device=aw.device)
        t = op.forward(ax, aw, shift if b is None else shift.add_(b.abs() if self.bias else -b))
        if self.beta:
            # without the bias t + z holds xw + |x||w|: 2 z- = xw - |x||w| is that less 2 |x||w|
            twice_zn = torch.sub(ctx.output, t) if self.bias else \
                torch.add(ctx.output, t).sub_(2 * op.forward(ax, aw)).sub_(2 * e2)
            qn = ratio(signal, twice_zn.clamp_(max=-e2), 0.0, self.beta)
        qp = ratio(signal, t.add_(ctx.output).clamp_(min=e2), 0.0, self.alpha)
        if self.beta:
            qp, qn = qp + qn, qp.sub_(qn)
        else:
            qn = qp
        return [op.transpose(qp, aw, x.shape).mul_(ax).addcmul_(op.transpose(qn, w, x.shape), x)]


class Gamma(Rule):
    """LRP-gamma in its generalized form for inputs of both signs (Andeol et al. 2021; zennit >= 0.5), which on
    non-negative inputs and positive outputs is Montavon et al.'s W + gamma W+, b + gamma b+.

    An output z = W x + b > 0 shares its relevance in proportion to the contributions that favour it:
    z_up = (W + gW+) x+ + (b + gb+) + (W + gW-) x-; an output z < 0 in proportion to
    z_down = (W + gW-) x+ + (b + gb-) + (W + gW+) x-; an output of exactly 0 passes none. Each denominator is
    stabilised by epsilon. The classic form, W + gW+ for every output and input, explodes on signed inputs
    (transformer activations), where its denominator crosses zero.

    Parameters
    ----------
    gamma : float
        how much the favouring contributions are boosted (0: LRP-epsilon)
    epsilon : float
        added to each denominator with its sign
    """

    kinds = WEIGHT_KINDS
    proportional_to_input = True
    reads = ("inputs", "output")

    def __init__(self, gamma: float = 0.25, epsilon: float = 1e-6):
        self.gamma, self.epsilon = gamma, epsilon

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        op, x, g = ctx.layer, ctx.x, self.gamma
        w, b = op.weights()
        assert w is not None and b is not None, "Gamma acts on conv and dense layers (a zero bias where none)"
        wp, wn = op.signed()
        up, down = w + g * wp, w + g * wn
        xp, xn = x.clamp(min=0), x.clamp(max=0)
        signed = _signed(x)
        z_up = op.forward(xp, up, b + g * b.clamp(min=0)) + (op.forward(xn, down) if signed else 0)
        z_down = op.forward(xp, down, b + g * b.clamp(max=0)) + (op.forward(xn, up) if signed else 0)
        s_up = torch.where(ctx.output > 0, signal / stabilize(z_up, self.epsilon), 0.0)
        s_down = torch.where(ctx.output < 0, signal / stabilize(z_down, self.epsilon), 0.0)
        out = xp * (op.transpose(s_up, up, x.shape) + op.transpose(s_down, down, x.shape))
        if signed:
            out = out + xn * (op.transpose(s_up, down, x.shape) + op.transpose(s_down, up, x.shape))
        return [out]


class _InputFree(Rule):
    """Relevance shared by fixed non-negative weights V: R_in = V^T (R / (V 1))."""

    kinds = WEIGHT_KINDS
    reads = ()

    def _weights(self, w: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        w, _ = ctx.layer.weights()
        assert w is not None, "the input-free rules act on layers with weights"
        v = self._weights(w)
        z = ctx.layer.forward(torch.ones_like(ctx.x), v)
        return [ctx.layer.transpose(signal / stabilize(z, 1e-12), v, ctx.x.shape)]


class WSquare(_InputFree):
    """LRP-w^2: relevance shared in proportion to the squared weights (input-independent)."""

    def _weights(self, w: torch.Tensor) -> torch.Tensor:
        return w * w


class Flat(_InputFree):
    """LRP-flat: relevance shared uniformly over each output's receptive field."""

    def _weights(self, w: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(w)


class ZB(Rule):
    """Deep Taylor zB for inputs bounded in [low, high]:
    z = W x - W+ low - W- high, R_in = x W^T s - low W+^T s - high W-^T s, s = R / stab(z).
    ``low`` / ``high`` None: each image's own minimum / maximum (Chefer et al.'s code for RGB inputs).

    Parameters
    ----------
    low, high : float or None
        the input's bounds; None: each image's own minimum / maximum
    stabilizer : float
        added to each denominator with its sign
    """

    kinds = WEIGHT_KINDS
    reads = ("inputs",)

    def __init__(self, low: float | None = 0.0, high: float | None = 1.0, stabilizer: float = 1e-6):
        self.low, self.high, self.stabilizer = low, high, stabilizer

    @staticmethod
    def _bound(x: torch.Tensor, value: float | None, largest: bool) -> torch.Tensor:
        """The bound as a tensor broadcasting against x (B, ...): the value, or each image's extreme."""
        if value is not None:
            return torch.tensor(value, dtype=x.dtype, device=x.device)
        flat = x.reshape(len(x), -1)
        return (flat.amax(1) if largest else flat.amin(1)).reshape(-1, *[1] * (x.ndim - 1))

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        op, x = ctx.layer, ctx.x
        w, _ = op.weights()
        wp, wn = op.signed()
        lo, hi = self._bound(x, self.low, False), self._bound(x, self.high, True)
        low, high = lo.expand_as(x).contiguous(), hi.expand_as(x).contiguous()
        z = op.forward(x, w) - op.forward(low, wp) - op.forward(high, wn)
        s = signal / stabilize(z, self.stabilizer)
        buffer, sp, sn = op.halves(s)
        torch.mul(s, lo if lo.ndim == 0 else lo.reshape(1, -1, *[1] * (s.ndim - 2)), out=sp)
        torch.mul(s, hi if hi.ndim == 0 else hi.reshape(1, -1, *[1] * (s.ndim - 2)), out=sn)
        return [x * op.transpose(s, w, x.shape) - op.transpose_stacked(buffer, x.shape)]


class DeepLiftAblation(Rule):
    """DeepLIFT multipliers without the sign intermixing (Sixt et al. 2020, cross_mxts=False).

    Units with delta_x != 0 receive multipliers only through W+ (positive multipliers for
    delta_x > 0, negative for delta_x < 0, which in the Rescale form are the same multipliers),
    so the chain is non-negative. Units with delta_x = 0 would keep the full W, but their
    contribution (multiplier x delta) is zero, and their multiplier only travels on through units
    whose difference is zero as well (Rescale gives 0 wherever delta_in != 0): the recorded
    signals are the same with W+ alone, which saves a second transposed convolution.
    """

    kinds = LINEAR_KINDS
    reads = ()
    nonnegative = True

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        wp = ctx.layer.signed()[0] if ctx.layer.has_negative_weights else ctx.layer.weights()[0]
        return [ctx.layer.transpose(signal, wp, ctx.x.shape)]


# --- nonlinearities, pooling, residual adds ----------------------------------------------------------

class Pass(Rule):
    """Identity: relevance passes an activation unchanged (LRP, Deep Taylor; for every element-wise
    activation, as zennit and LXT do); also through a norm or a softmax, as Chefer et al. 2021 propagate."""

    kinds = ACTIVATION_KINDS + (Kind.NORM, Kind.SOFTMAX)
    reads = ()

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        return [signal]


class ReLUGradient(Rule):
    """Gradient of ReLU / LeakyReLU; ``guided`` keeps only positive results (Guided Backprop),
    ``deconv`` ignores the forward mask and keeps positive signals (DeconvNet).

    Parameters
    ----------
    mode : str
        "gradient" (the plain derivative), "guided" or "deconv"
    """

    kinds = (Kind.RELU, Kind.LEAKY_RELU)
    reads = ("inputs",)

    def __init__(self, mode: str = "gradient"):
        self.mode = mode

    @property
    def linear_in_signal(self) -> bool:  # type: ignore[override]  # guided and deconv clip the signal
        return self.mode == "gradient"

    @property
    def exact_gradient(self) -> bool:  # type: ignore[override]
        return self.mode == "gradient"

    @property
    def traceable(self) -> bool:  # type: ignore[override]  # guided and deconv: a ReLU with its backward clipped
        return self.mode != "gradient"

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        return [self._pullback(ctx, ctx.x)(signal)]

    def surrogate(self, ctx: Context) -> torch.Tensor:
        out: torch.Tensor = _Surrogate.apply(ctx.x, lambda x: (ctx.apply(x), self._pullback(ctx, x)))  # type: ignore[no-untyped-call]
        return out

    def _pullback(self, ctx: Context, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """The backward at input ``x``: signals (..., B, ...) -> same."""
        if self.mode == "deconv":
            return lambda signal: signal.clamp(min=0)
        slope = ctx.node.record.negative_slope if isinstance(ctx.node.record, LeakyReLU) else 0.0

        def pullback(signal: torch.Tensor) -> torch.Tensor:
            # autograd's own ReLU kernel (one pass, broadcast over K) where the slope is 0
            out = (torch.ops.aten.threshold_backward(signal, x, 0) if slope == 0
                   else torch.where(x > 0, signal, slope * signal))
            return out.clamp_(min=0) if self.mode == "guided" else out
        return pullback


def percentile(t: torch.Tensor, q: float) -> torch.Tensor:
    """The ``q``-th percentile (0-100, linear interpolation as numpy's default) of each row of (N, P) -> (N, 1).

    Two order statistics by selection, not a sort and not ``torch.quantile``, which refuses rows of more
    than 2^24 elements (a feature map of a few images)."""
    position = q / 100 * (t.shape[1] - 1)
    low, high = int(position), min(int(position) + 1, t.shape[1] - 1)
    below = t.kthvalue(low + 1, dim=1, keepdim=True).values
    if high == low or position == low:
        return below
    return below.lerp(t.kthvalue(high + 1, dim=1, keepdim=True).values, position - low)


class RectGrad(Rule):
    """RectGrad (Kim et al. 2019, "Why are saliency maps noisy?"): at a ReLU the signal passes only where
    activation x signal exceeds its ``q``-th percentile over the layer's units, per sample and per signal:
    s_in = 1[a * s > tau] s, a the ReLU's output, tau the percentile of a * s. The ReLU's own mask is part
    of the rule: an inactive unit has a * s = 0, which passes only when tau < 0 (fewer than 100 - q percent
    of the products positive), as the rule is written.

    Parameters
    ----------
    q : float
        the percentile (0-100) of activation x signal over the layer that a unit must exceed
    """

    kinds = (Kind.RELU, Kind.LEAKY_RELU)
    reads = ("output",)
    linear_in_signal = False  # the threshold tau depends on the signal

    def __init__(self, q: float = 98.0):
        if not 0 <= q <= 100:
            raise AttributionError(f"RectGrad's percentile q must lie in [0, 100], got {q}")
        self.q = q

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        importance = signal * ctx.output  # (K, B, ...)
        flat = importance.reshape(signal.shape[0] * signal.shape[1], -1)
        tau = percentile(flat, self.q).reshape(signal.shape[0], signal.shape[1], *[1] * (signal.ndim - 2))
        return [torch.where(importance > tau, signal, 0.0)]


class Rescale(Rule):
    """DeepLIFT's Rescale rule: the multiplier delta_y / delta_x.

    For a ReLU or LeakyReLU ``|delta_y|`` <= ``|delta_x|`` holds exactly in floating point, so the quotient
    never blows up; only delta_x = 0 exactly is undefined (0 / 0). There the multiplier is set to
    0 where captum falls back to the gradient: such a unit contributes multiplier x 0 = 0, and its
    multiplier could only travel on to units whose difference is zero as well (delta_x = 0 arises
    where a unit's whole receptive field equals the reference), so maps and recorded signals are
    the same, at half the cost of the fallback's extra passes.
    """

    kinds = (Kind.RELU, Kind.LEAKY_RELU)

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        multiplier = (ctx.output - ctx.references[1]).div_(ctx.x - ctx.references[0][0]).nan_to_num_(nan=0.0)
        return [_scaled(signal, multiplier)]


def _feeds_relu(ctx: Context, linear: str) -> str | None:
    """The ReLU that is the only reader of the dense / conv node ``linear``, if there is one."""
    if ctx.graph is None or ctx.graph.by_name[linear].kind not in (Kind.DENSE, Kind.CONV):
        return None
    readers = ctx.graph.consumers[linear]
    return readers[0] if len(readers) == 1 and ctx.graph.by_name[readers[0]].kind == Kind.RELU else None


class RevealCancelReLU(Rescale):
    """DeepLIFT RevealCancel at a ReLU (Shrikumar et al. 2017, section 3.5.3): where the ReLU's only input is
    a dense or conv layer read by nothing else, the multiplier passes unchanged and that layer's rule
    (:class:`RevealCancelLinear`) splits it into its positive and negative parts; elsewhere Rescale."""

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        if _feeds_relu(ctx, ctx.node.inputs[0]) == ctx.node.name:
            return [signal]
        return super().backward(ctx, signal)


class RevealCancelLinear(Rule):
    """DeepLIFT RevealCancel through a dense / conv layer z = W x + b that feeds a ReLU f, from the reference:
    dz+ = W+ dx+ + W- dx-, dz- = W+ dx- + W- dx+ (the positive and negative terms w_i dx_i), then

        dy+ = (f(z0 + dz+) - f(z0)) / 2 + (f(z0 + dz- + dz+) - f(z0 + dz-)) / 2, dy- alike with + and - swapped,

    m+ = dy+ / dz+, m- = dy- / dz- (0 where the part is 0), and to each input the multipliers of the terms it
    makes: W+^T (m+ s) + W-^T (m- s) where dx > 0, W+^T (m- s) + W-^T (m+ s) where dx < 0, W^T ((m+ + m-) s) / 2
    where dx = 0. Complete: m+ dz+ + m- dz- = dy+ + dy- = f(z) - f(z0). Elsewhere the plain W^T s."""

    kinds = (Kind.DENSE, Kind.CONV)

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        op, x = ctx.layer, ctx.x
        w, _ = op.weights()
        relu = _feeds_relu(ctx, ctx.node.name)
        if relu is None:
            return [op.transpose(signal, w, x.shape)]
        wp, wn = op.signed()
        dx = x - ctx.references[0][0]
        up, down = dx.clamp(min=0), dx.clamp(max=0)
        dz_pos, dz_neg = op.forward(up, wp) + op.forward(down, wn), op.forward(down, wp) + op.forward(up, wn)
        z0 = ctx.references[1].expand_as(dz_pos)
        f = torch.relu
        dy_pos = (f(z0 + dz_pos) - f(z0) + f(z0 + dz_neg + dz_pos) - f(z0 + dz_neg)) / 2
        dy_neg = (f(z0 + dz_neg) - f(z0) + f(z0 + dz_pos + dz_neg) - f(z0 + dz_pos)) / 2
        m_pos = torch.where(dz_pos == 0, 0.0, dy_pos / torch.where(dz_pos == 0, 1.0, dz_pos))
        m_neg = torch.where(dz_neg == 0, 0.0, dy_neg / torch.where(dz_neg == 0, 1.0, dz_neg))
        sp, sn = signal * m_pos, signal * m_neg
        through_pos = op.transpose(sp, wp, x.shape) + op.transpose(sn, wn, x.shape)  # inputs with dx > 0
        through_neg = op.transpose(sn, wp, x.shape) + op.transpose(sp, wn, x.shape)  # inputs with dx < 0
        still = op.transpose((sp + sn) / 2, w, x.shape)  # inputs with dx = 0: they contribute nothing
        return [torch.where(dx > 0, through_pos, torch.where(dx < 0, through_neg, still))]


def _unpool(signal: torch.Tensor, indices: torch.Tensor, in_shape: torch.Size, into: torch.Tensor | None = None
            ) -> torch.Tensor:
    """Scatter-add (K, B, C, *out) signals to the max positions given by indices (B, C, *out), into a
    (K, B, *in_shape[1:]) result of an earlier call if given."""
    k, b, c = signal.shape[:3]
    idx = indices.reshape(1, b, c, -1).expand(k, b, c, -1)
    out = torch.zeros(k, b, c, in_shape[2:].numel(), dtype=signal.dtype, device=signal.device) if into is None \
        else into.view(k, b, c, -1)
    return out.scatter_add_(3, idx, signal.reshape(k, b, c, -1)).reshape(k, b, *in_shape[1:])


class WinnerTakeAll(Rule):
    """Max pooling: the whole signal goes to the winning input (the max-pooling gradient)."""

    kinds = (Kind.MAXPOOL,)
    reads = ("inputs",)
    exact_gradient = True

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        return [_to_winners(ctx, signal)]


def _to_winners(ctx: Context, signal: torch.Tensor) -> torch.Tensor:
    """Signals (K, B, C, *out) of a max pooling node scattered to its inputs at its forward winners ->
    (K, B, *in): torch's own kernel for a single signal on images, else :func:`_unpool`."""
    if signal.shape[0] == 1 and ctx.x.ndim == 4:
        return to_winners(signal[0], ctx.x, ctx.node.pool, ctx.winners)[None]
    return _unpool(signal, ctx.winners, ctx.x.shape)


class DeepLiftMaxPool(Rule):
    """Max pooling as captum's DeepLift treats it: multipliers from the change of the cross
    maximum of input and reference outputs, the gradient where ``|delta_x|`` < eps.

    Computed per pooling window (on the pooled grid, then scattered to the winners), which is the
    same as captum's unpool-then-divide: every numerator sits at a winner, so dividing by that
    winner's delta_x before or after scattering gives the same sums.

    Parameters
    ----------
    eps : float
        ``|delta_x|`` below which the gradient replaces the difference quotient
    """

    kinds = (Kind.MAXPOOL,)

    def __init__(self, eps: float = 1e-10):
        self.eps = eps

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        x, ref = ctx.x, ctx.references[0][0]
        out, out_ref = ctx.output, ctx.references[1]
        idx = ctx.winners
        b, c = idx.shape[:2]
        # the change of each window's maximum, max(out, out_ref) - out_ref, split where the reference's is larger
        delta = out - out_ref
        reference_wins = delta.numel() > 0 and bool(delta.min() < 0)
        below = delta.clamp(max=0) if reference_wins else None  # out - max(out, out_ref)
        above = delta.clamp_(min=0) if reference_wins else delta
        at = torch.gather(ref.reshape(ref.shape[0], c, -1).expand(b, -1, -1), 2, idx.reshape(b, c, -1))
        dx = torch.sub(out, at.view(out.shape), out=at.view(out.shape))  # x at its winner is out
        # a quotient whose divisor is (nearly) 0 is replaced afterwards, its inf or nan with it; where the input's
        # maximum wins everywhere, dx >= out - out_ref >= 0 (the reference at x's winner is at most its maximum)
        small = dx.abs() < self.eps if reference_wins else dx < self.eps
        grad = _to_winners(ctx, _scaled(signal, above.div_(dx).masked_fill_(small, 1.0)))
        if below is not None:  # windows where the reference's maximum is the larger one
            assert ctx.ref_indices is not None, "DeepLIFT's max pooling records the reference's winners"
            idx_ref = ctx.ref_indices.expand_as(idx)
            dx_ref = torch.gather(x.reshape(b, c, -1), 2, idx_ref.reshape(b, c, -1)).reshape(out.shape) - out_ref
            q_ref = below.div_(dx_ref).masked_fill_(dx_ref.abs() < self.eps, 0.0)
            _unpool(_scaled(signal, q_ref), idx_ref, x.shape, into=grad)
        return [grad]


class ProportionalSplit(Rule):
    """A residual add a + b: relevance split in proportion to each branch's value (stabilised).

    Parameters
    ----------
    epsilon : float
        added to the sum a + b with its sign
    """

    kinds = (Kind.ADD,)

    def __init__(self, epsilon: float = 1e-6):
        self.epsilon = epsilon

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        s = ratio(signal, ctx.output, self.epsilon)
        return [s * x for x in ctx.inputs]


class NormalisedSplit(Rule):
    """A residual add a + b as Chefer et al. 2021 split it: the z rule's shares R_a = a R / z, R_b = b R / z,
    each rescaled so that per sample the branches keep the relevance total R in proportion ``|sum R_a|`` :
    ``|sum R_b|`` (conservative whatever the signs: R_a sums to ``|sum R_a|`` / (``|sum R_a|`` + ``|sum R_b|``) sum R).

    Parameters
    ----------
    epsilon : float
        added to the sum a + b with its sign
    """

    kinds = (Kind.ADD,)

    def __init__(self, epsilon: float = 1e-9):
        self.epsilon = epsilon

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        s = ratio(signal, ctx.output, self.epsilon)
        parts = [s * x for x in ctx.inputs]
        axes = tuple(range(2, signal.ndim))
        total = signal.sum(axes, keepdim=True)
        sums = [p.sum(axes, keepdim=True) for p in parts]
        weight = sum(t.abs() for t in sums)
        return [p * _safe(q.abs() * total, weight * q) for p, q in zip(parts, sums)]


def _safe(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b, 0 where b = 0 (Chefer et al.'s safe_divide)."""
    return torch.where(b == 0, torch.zeros_like(a), a / torch.where(b == 0, torch.ones_like(b), b))


class Copy(Rule):
    """The gradient of an add: the same signal to every input."""

    kinds = (Kind.ADD,)
    reads = ()
    exact_gradient = True

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        return [signal for _ in ctx.inputs]


# --- traced operations: data movement, linear mixing, activations, products, normalisation, softmax -----

class VJP(Rule):
    """The exact vector-Jacobian product of the traced operation (autograd, batched over K): the
    gradient of any node, and the adjoint that every method uses for data movement (indexing,
    permutes, reshapes, expand, cat, pad, roll...), since moving values neither creates nor mixes them."""

    kinds = TRACED_KINDS
    records = True
    reads = ("inputs",)
    exact_gradient = True

    def reads_for(self, node: Node) -> tuple[str, ...]:
        linear = node.kind in LINEAR_TRACED_KINDS or node.is_identity or node.is_reshape
        return () if linear else self.reads

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        if ctx.node.is_identity:
            return [signal]
        if ctx.node.is_reshape:  # a plain reshape: its adjoint is the inverse reshape
            return [signal.reshape(signal.shape[0], *ctx.x.shape)]
        if ctx.node.kind in LINEAR_TRACED_KINDS and not ctx.recorded:  # its inputs may have been freed
            return ctx.linear_vjp(signal)
        return ctx.vjp(signal)


class ActivationGradient(Rule):
    """An element-wise activation's backward for the modified-gradient methods, applied at every
    activation as zennit does for ReLU: ``guided`` clips the gradient below at 0 (Springenberg et al.),
    ``deconv`` clips the incoming signal and ignores the forward derivative (Zeiler & Fergus).

    Parameters
    ----------
    mode : str
        "guided" or "deconv"
    """

    kinds = (Kind.ACTIVATION,)
    records = True
    reads = ("inputs",)

    linear_in_signal = False  # both modes clip the signal

    def __init__(self, mode: str = "guided"):
        self.mode = mode

    traceable = True

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        if self.mode == "deconv":
            return [signal.clamp(min=0)]
        return [ctx.vjp(signal)[0].clamp(min=0)]

    def surrogate(self, ctx: Context) -> torch.Tensor:
        def run(x: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
            if self.mode == "deconv":
                return ctx.apply(x), lambda signal: signal.clamp(min=0)
            with torch.enable_grad():  # the derivative, element-wise: the gradient of the sum
                leaf = x.detach().requires_grad_()
                y = ctx.apply(leaf)
                y.backward(torch.ones_like(y))  # type: ignore[no-untyped-call]
            slope = leaf.grad
            assert slope is not None
            return y.detach(), lambda signal: (signal * slope).clamp_(min=0)
        out: torch.Tensor = _Surrogate.apply(ctx.x, run)  # type: ignore[no-untyped-call]
        return out


class LinearZ(Rule):
    """LRP's z rule through a linear operation of the signals (sums, means, scaling, subtraction, a product
    with a constant): R_i = x_i * (J_i^T (R / stab(z)))[i], z the node's output. Constants the operation
    adds (a position embedding, a bias) absorb their share; on data movement it equals the adjoint.
    On a reduction that is positively homogeneous of degree one (a p-norm, a max) it conserves too, by
    Euler's theorem: sum_i x_i df/dx_i = f.

    Parameters
    ----------
    epsilon : float
        added to the node's output with its sign
    """

    kinds = (Kind.MIX, Kind.REDUCE)
    records = True

    def __init__(self, epsilon: float = 1e-6):
        self.epsilon = epsilon

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        s = signal / stabilize(ctx.output, self.epsilon)
        return [x * g for x, g in zip(ctx.inputs, ctx.vjp(s))]


class RescaleAny(Rule):
    """DeepLIFT's Rescale for any element-wise activation: (f(x) - f(x0)) / (x - x0), and the derivative
    f'(x) where x = x0 (Shrikumar et al. 2017). Keeps completeness.

    Parameters
    ----------
    tolerance : float
        ``|x - x0|`` at or below which the derivative replaces the secant
    """

    kinds = (Kind.ACTIVATION,)

    def __init__(self, tolerance: float = 1e-10):
        self.tolerance = tolerance

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        secant = _rescale(ctx.output - ctx.references[1], ctx.x - ctx.references[0][0], self.tolerance,
                          lambda: ctx.vjp(torch.ones_like(ctx.output)[None])[0][0])  # f'(x), element-wise
        return [_scaled(signal, secant)]


def _rescale(dy: torch.Tensor, dx: torch.Tensor, tolerance: float, derivative: Callable[[], torch.Tensor]
             ) -> torch.Tensor:
    """DeepLIFT's Rescale multiplier dy / dx, and ``derivative()`` (computed only if needed) where |dx| <= tolerance.
    ``dy`` and ``dx`` are the caller's temporaries: the passes write into them. Whether any |dx| is that small is
    read from its minimum (NaN when dx holds NaN, which is not small either): a quarter of the time of a
    comparison's boolean pass and any()."""
    secant = dy.div_(dx)  # where dx = 0: NaN, replaced below
    magnitude = dx.abs_()
    if magnitude.numel() and bool(magnitude.amin() <= tolerance):
        secant = torch.where(magnitude <= tolerance, derivative(), secant)
    return secant


def _secant(ctx: Context, signal: torch.Tensor, dims: tuple[int, ...] | None, rows: bool = False) -> torch.Tensor:
    """DeepLIFT multipliers of a node whose outputs each read one group of inputs (the axes ``dims``, None
    for all): the gradient at the midpoint m = (x + x0) / 2, plus the residual of its linearisation spread
    along the difference,

        mult_ij = dy_j/dx_i (m) + (dy_j - J(m) dx)_j * dx_i / sum_{k in group(j)} dx_k^2,

    so that sum_i mult_ij dx_i = dy_j exactly, for any function of the group; it tends to the gradient as
    x0 -> x. One output per group (a reduction), or with ``rows`` one output per input of the group (a
    softmax). A group with dx = 0 has dy = 0 and gets the gradient. signal (K, B, ...) -> (K, B, ...)."""
    x, dx = ctx.x, ctx.x - ctx.references[0][0]
    mid = x - dx / 2
    along = torch.func.jvp(ctx.apply, (mid,), (dx,))[1]
    squares = (dx * dx).sum(dim=dims, keepdim=True) if dims is not None else (dx * dx).sum().reshape([1] * x.ndim)
    residual = ctx.output - ctx.references[1] - along
    coefficient = torch.where(squares > 0, residual.reshape(residual.shape if rows else squares.shape)
                              / torch.where(squares > 0, squares, 1.0), 0.0)
    weighted = signal.reshape(signal.shape[0], *coefficient.shape) * coefficient
    if rows:
        weighted = weighted.sum(dim=[d % x.ndim + 1 for d in (dims or range(x.ndim))], keepdim=True)
    return ctx.vjp(signal, at=[mid])[0] + dx * weighted


class SecantReduce(Rule):
    """DeepLIFT through a nonlinear reduction (a norm, a max, logsumexp): :func:`_secant`, complete
    for any reduction."""

    kinds = (Kind.REDUCE,)

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        return [_secant(ctx, signal, _record(ctx, Reduce).dims)]


def _record(ctx: Context, expected: type[R]) -> R:
    """The node's record, which its kind fixes (a rule's ``kinds`` say which)."""
    record = ctx.node.record
    assert isinstance(record, expected), f"node {ctx.node.name!r}: {type(record).__name__}, not {expected.__name__}"
    return record


def _operands(ctx: Context) -> list[str]:
    return list(_record(ctx, Product).operands)


def _operand_values(ctx: Context, reference: bool = False) -> list[torch.Tensor]:
    """The two operands' values (or the reference's), in slot order (x * x gives x twice)."""
    values = ctx.ref_inputs if reference else ctx.inputs
    assert values is not None, "DeepLIFT rules run with a reference"
    by_name = dict(zip(ctx.node.inputs, values))
    return [by_name[n] for n in _operands(ctx)]


def _product_of(ctx: Context) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    env = ctx.env or {}
    pair = _record(ctx, Product).pair
    return lambda a, b: pair(env, a, b)


def _product_vjp(ctx: Context, signal: torch.Tensor, slot: int, at: torch.Tensor, other: torch.Tensor
                 ) -> torch.Tensor:
    """The vector-Jacobian product of the node's product in operand ``slot`` (0 or 1, at ``at``, whose values a
    product linear in it does not read) with the other operand held at ``other``, for K signals (K, B, ...).
    Written out for a matrix product of operands with one batch shape and an element-wise product of operands of
    one shape: autograd's would compute the product itself first, a pass the transpose does not need."""
    op = _record(ctx, Product).op
    a, b = (at, other) if slot == 0 else (other, at)
    if op in ("matmul", "bmm", "mm") and a.ndim == b.ndim >= 2 and a.shape[:-2] == b.shape[:-2]:
        return torch.matmul(signal, b.mT) if slot == 0 else torch.matmul(a.mT, signal)
    if op == "mul" and a.shape == b.shape:
        return signal * other
    pair = _product_of(ctx)
    return ctx.vjp(signal, [at], (lambda t: pair(t, other)) if slot == 0 else (lambda t: pair(other, t)))[0]


def _held(node: Node, gates_on: bool) -> tuple[int | None, list[str]]:
    """(the operand slot a product rule holds constant: 0, 1 or None for neither, the operands' node names)."""
    record = node.recorded(Product)
    gates = record.gates if gates_on else (False, False)
    names = list(record.operands)
    if record.quotient:
        return 1, names
    return ((0 if gates[0] else 1) if gates[0] != gates[1] else None), names


def _silent(node: Node, gates_on: bool) -> frozenset[str]:
    held, names = _held(node, gates_on)
    return frozenset() if held is None or names[0] == names[1] else frozenset({names[held]})


def _gather(ctx: Context, per_operand: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Signals per operand slot -> signals per input node (a signal used twice, as in x * x, sums; None: none)."""
    out: dict[str, torch.Tensor | None] = {}
    for name, s in zip(_operands(ctx), per_operand):
        before = out.get(name)
        out[name] = s if before is None else before if s is None else before + s
    return [out[name] for name in ctx.node.inputs]


class GateProduct(Rule):
    """LRP through the product of two signals, "gate as constant" (Ali et al. 2022; Achtibat et al. 2024):
    an operand computed by a gating function (sigmoid, hardsigmoid, softmax: SE gates, GLU, attention
    weights) is held constant and the relevance goes to the other operand by the z rule; when neither
    or both are gates, each operand gets half (AttnLRP's uniform rule for bilinear products).
    ``gates=False``: every product splits in halves, attention weights included (Chefer et al. 2021,
    whose attention relevance is what reaches the weights).

    Parameters
    ----------
    epsilon : float
        added to the product with its sign
    gates : bool
        hold gating operands constant (False: every product splits in halves)
    """

    kinds = (Kind.PRODUCT,)

    def __init__(self, epsilon: float = 1e-6, gates: bool = True):
        self.epsilon, self.gates = epsilon, gates

    def silent(self, node: Node) -> frozenset[str]:
        return _silent(node, self.gates)

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor | None]:
        a, b = _operand_values(ctx)
        record = _record(ctx, Product)
        gates = record.gates if self.gates else (False, False)
        s = signal / stabilize(ctx.output, self.epsilon)

        def z_rule(i: int) -> torch.Tensor:  # operand i's relevance, the other held at its value
            return a * _product_vjp(ctx, s, 0, a, b) if i == 0 else b * _product_vjp(ctx, s, 1, b, a)

        # a / b: b is never a signal operand of the z rule; a gate beside a signal is held constant. The operand
        # held constant gets no signal: neither its vector-Jacobian product nor anything below it on its path
        # is computed (attention: the softmax, the scores' product and the query and key moves of every block)
        only = 0 if record.quotient else (1 if gates[0] else 0) if gates[0] != gates[1] else None
        if only is not None:
            kept = z_rule(only)
            return _gather(ctx, [kept, None] if only == 0 else [None, kept])
        return _gather(ctx, [0.5 * z_rule(0), 0.5 * z_rule(1)])


# --- LRP in factor form: the relevance R = value * c, the backward carries c ---------------------------------
# Where a rule's relevance is the z rule through a map linear at its forward point (a linear layer, a residual sum,
# a product with one operand held, a normalisation with its standard deviation held, AttnLRP's softmax rule), the
# factor it hands on is that map's gradient: R_in = x * J^T (R / z) with R = z * c gives c_in = J^T c. The chain
# then runs as a gradient with the held operands held, LRP-0 on the linear layers (the epsilon-free limit, which
# has no quotient to stabilise), and reads no layer's input or output: the memory of autograd's gradient.

class IdentityFactor(Rule):
    """LRP's identity rule through an element-wise activation (relevance passes unchanged, as :class:`Pass`) in
    factor form: c_in = c * y / x, the denominator stabilised.

    Parameters
    ----------
    epsilon : float
        added to the activation's input with its sign
    """

    kinds = ACTIVATION_KINDS
    reads = ("inputs",)  # the output is recomputed (one element-wise op): a forward pass holds half as much
    traceable = True

    def __init__(self, epsilon: float = 1e-6):
        self.epsilon = epsilon

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        return [signal * self._output_and_ratio(ctx, ctx.x)[1]]

    def surrogate(self, ctx: Context) -> torch.Tensor:
        def run(x: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
            y, ratio = self._output_and_ratio(ctx, x)
            return y, ratio.mul
        out: torch.Tensor = _Surrogate.apply(ctx.x, run)  # type: ignore[no-untyped-call]
        return out

    def _output_and_ratio(self, ctx: Context, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, y / x stabilised) at input ``x`` (B, ...)."""
        y = ctx.apply(x)
        return y, y / stabilize(x, self.epsilon)


class HeldGradient(Rule):
    """:class:`GateProduct` in factor form: the gradient to the operand that is not held (a gate beside a signal,
    or a quotient's numerator), half the gradient to each operand where neither or both are gates (AttnLRP's
    uniform rule); ``gates=False`` splits every product in halves."""

    kinds = (Kind.PRODUCT,)
    reads = ("inputs",)
    traceable = True

    def __init__(self, gates: bool = True):
        self.gates = gates

    def silent(self, node: Node) -> frozenset[str]:
        return _silent(node, self.gates)

    def inputs_read(self, node: Node) -> tuple[str, ...]:
        # the gradient to one operand is linear in it: only the operand held is read
        held, names = _held(node, self.gates)
        return tuple(node.inputs) if held is None else (names[held],)

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor | None]:
        a, b = _operand_values(ctx)
        held, _ = _held(ctx.node, self.gates)
        if held == 1:
            return _gather(ctx, [_product_vjp(ctx, signal, 0, a, b), None])
        if held == 0:
            return _gather(ctx, [None, _product_vjp(ctx, signal, 1, b, a)])
        half = 0.5 * signal
        return _gather(ctx, [_product_vjp(ctx, half, 0, a, b), _product_vjp(ctx, half, 1, b, a)])

    def surrogate(self, ctx: Context) -> torch.Tensor:
        a, b = _operand_values(ctx)
        scale_a, scale_b = self.gradient_scales(ctx.node)
        return _product_of(ctx)(scaled_gradient(a, scale_a), scaled_gradient(b, scale_b))

    def gradient_scales(self, node: Node) -> tuple[float, float]:
        held, _ = _held(node, self.gates)
        return (0.5, 0.5) if held is None else (0.0, 1.0) if held == 0 else (1.0, 0.0)


class NormFactor(Rule):
    """:class:`NormLRP` (the LN rule) in factor form: the gradient of the normalisation with its standard
    deviation held, c_in = centre(weight * c) / std."""

    kinds = (Kind.NORM,)
    reads = ("inputs",)
    traceable = True

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        return [_std_held(ctx, ctx.x)(signal)]

    def surrogate(self, ctx: Context) -> torch.Tensor:
        def run(x: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
            if _record(ctx, Norm).type != "layer":
                return ctx.apply(x), _std_held(ctx, x)
            # LayerNorm's own kernel gives the output and the inverse deviation in one pass
            _, dims, weight, bias, eps, _ = _norm_axes(ctx)
            y, _, inverse = torch.ops.aten.native_layer_norm(x, x.shape[dims[0]:], weight, bias, eps)
            return y, _std_held(ctx, x, inverse.reciprocal_())
        out: torch.Tensor = _Surrogate.apply(ctx.x, run)  # type: ignore[no-untyped-call]
        return out


def _std_held(ctx: Context, x: torch.Tensor, std: torch.Tensor | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The transpose of the normalisation at ``x`` with its standard deviation (``std``, computed if None) held:
    (..., B, ...) -> same."""
    group, dims, weight, _, _, ungroup = _norm_axes(ctx)
    kdims = tuple(d - x.ndim if d >= 0 else d for d in dims)  # counted from the end: a K axis may lead
    if std is None:
        std = _deviation(ctx, x)

    def transpose(signal: torch.Tensor) -> torch.Tensor:
        s = group(_affine(signal, weight))
        return ungroup((s - s.mean(dim=kdims, keepdim=True)).div_(std))
    return transpose


class _Surrogate(torch.autograd.Function):
    """``run(x) -> (value, pullback)``: the value, whose gradient autograd takes as ``pullback`` (the rule's
    transpose, holding only what it closes over)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, run: Callable[[torch.Tensor], Any]) -> torch.Tensor:
        value: torch.Tensor
        value, ctx.pullback = run(x)
        return value

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.pullback(grad), None


def scaled_gradient(t: torch.Tensor, scale: float) -> torch.Tensor:
    """``t``, whose gradient autograd multiplies by ``scale`` (0: held constant; a half: AttnLRP's uniform rule
    for a product of two signals)."""
    if scale == 1.0:
        return t
    if scale == 0.0:
        return t.detach()
    out: torch.Tensor = _ScaledGradient.apply(t, scale)  # type: ignore[no-untyped-call]
    return out


class _ScaledGradient(torch.autograd.Function):
    """The identity whose gradient is scaled by a constant."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.scale * grad, None


class DeepLiftProduct(Rule):
    """DeepLIFT through a product of two signals, exact: for a bilinear f, f(a, b) - f(a0, b0) =
    f(da, (b + b0) / 2) + f((a + a0) / 2, db), so the multipliers are those of the two linear maps
    (Shrikumar et al. 2017, section 3.5). A quotient a / b is bilinear in a and r = 1 / b, with
    Rescale on r(b). Keeps completeness.

    Parameters
    ----------
    tolerance : float
        ``|b - b0|`` at or below which a quotient's 1 / b takes its derivative
    """

    kinds = (Kind.PRODUCT,)

    def __init__(self, tolerance: float = 1e-10):
        self.tolerance = tolerance

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor | None]:
        a, b = _operand_values(ctx)
        a0, b0 = _operand_values(ctx, reference=True)
        if not _record(ctx, Product).quotient:
            return _gather(ctx, [_product_vjp(ctx, signal, 0, a, (b + b0) / 2),
                                 _product_vjp(ctx, signal, 1, b, (a + a0) / 2)])
        pair = _product_of(ctx)
        r, r0 = 1 / b, 1 / b0
        ma = _product_vjp(ctx, signal, 0, a, 1 / ((r + r0) / 2))
        mr = ctx.vjp(signal, [r], lambda t: pair((a + a0) / 2, 1 / t))[0]  # a / (1 / t) = a * t
        return _gather(ctx, [ma, mr * _rescale(r - r0, b - b0, self.tolerance, lambda: -r * r)])


def _deviation(ctx: Context, x: torch.Tensor) -> torch.Tensor:
    """The standard deviation a normalisation node divides its input ``x`` (B, ...) by, per group, shaped to
    divide the grouped input (:func:`_norm_axes`). LayerNorm's from its own kernel (its inverse deviation): on
    the channels-last LayerNorm of a ConvNeXt, ``var`` over the last axis of 96 takes seven times as long."""
    group, dims, _, _, eps, _ = _norm_axes(ctx)
    if _record(ctx, Norm).type == "layer":
        inverse: torch.Tensor = torch.ops.aten.native_layer_norm(x, x.shape[dims[0]:], None, None, eps)[2]
        return inverse.reciprocal_()
    return torch.sqrt(group(x).var(dim=dims, keepdim=True, unbiased=False) + eps)


def _norm_axes(ctx: Context) -> tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...], torch.Tensor | None,
                                        torch.Tensor | None, float, Callable[[torch.Tensor], torch.Tensor]]:
    """How a normalisation node groups its input: (view into groups, the reduced dims, weight, bias, eps,
    view back). LayerNorm reduces the trailing normalised dims, GroupNorm each group of channels and
    positions, BatchNorm without running statistics each channel over the batch and positions."""
    x, norm, env = ctx.x, _record(ctx, Norm), ctx.env or {}
    spec = norm.arguments

    def value(v: Any) -> Any:
        return env[v.name] if hasattr(v, "name") and not isinstance(v, str) else v

    weight, bias, eps = value(spec.get("weight")), value(spec.get("bias")), float(spec["eps"])
    if norm.type == "layer":
        dims = tuple(range(x.ndim - len(value(spec["normalized_shape"])), x.ndim))
        return (lambda t: t), dims, weight, bias, eps, (lambda t: t)
    channel_shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    weight = None if weight is None else weight.reshape(channel_shape)
    bias = None if bias is None else bias.reshape(channel_shape)
    if norm.type == "group":
        groups = int(value(spec["num_groups"]))
        nd, rest = x.ndim, tuple(x.shape[1:])

        def group(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(*t.shape[:t.ndim - nd], t.shape[t.ndim - nd], groups, -1)

        def ungroup(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(*t.shape[:-2], *rest)

        return group, (-1,), weight, bias, eps, ungroup
    return (lambda t: t), (0,) + tuple(range(2, x.ndim)), weight, bias, eps, (lambda t: t)


def _affine(t: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    t = t if weight is None else t * weight
    return t if bias is None else t + bias


class NormLRP(Rule):
    """The LN rule (Ali et al. 2022) for LayerNorm, GroupNorm and BatchNorm without running statistics:
    the standard deviation is held constant, so the normalisation is the linear map x -> (x - mean(x)) /
    std * weight; the z rule through it conserves the relevance up to what the bias absorbs.

    Parameters
    ----------
    epsilon : float
        added to the normalised output with its sign
    """

    kinds = (Kind.NORM,)

    def __init__(self, epsilon: float = 1e-6):
        self.epsilon = epsilon

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        group, dims, weight, _, _, ungroup = _norm_axes(ctx)
        kdims = tuple(d - ctx.x.ndim if d >= 0 else d for d in dims)  # counted from the end: a K axis leads
        std = _deviation(ctx, ctx.x)
        # the linear map's transpose written out: centring is symmetric, so J^T s = centre(weight * s) / std
        s = group(_affine(signal / stabilize(ctx.output, self.epsilon), weight))
        return [ctx.x * ungroup((s - s.mean(dim=kdims, keepdim=True)).div_(std))]


def _norm_secant(ctx: Context, signal: torch.Tensor) -> torch.Tensor:
    """:func:`_secant` with ``rows`` for a normalisation, its Jacobian written out: at the midpoint m of
    a group, with n = (m - mean m) r the normalised midpoint, J t = r (t - mean t - n mean(n t)) before the
    affine weight. J is symmetric, so the residual's weight sum_j s_j (dy - weight J dx)_j is s . dy - g . dx
    with g = J (weight s), the transpose the multipliers need anyway: the tangent J dx is never formed.
    signal (K, B, ...) -> (K, B, ...)."""
    group, dims, weight, _, eps, ungroup = _norm_axes(ctx)
    kdims = tuple(d - ctx.x.ndim if d >= 0 else d for d in dims)  # counted from the end: a K axis may lead
    x, dx = group(ctx.x), group(ctx.x - ctx.references[0][0])
    mid = torch.add(x, dx, alpha=-0.5)
    if kdims == tuple(range(-len(kdims), 0)):  # trailing groups: the normalised midpoint in LayerNorm's kernel
        nm, _, rm = torch.ops.aten.native_layer_norm(mid, mid.shape[-len(kdims):], None, None, eps)
        rm = rm.reshape(*mid.shape[:-len(kdims)], *(1,) * len(kdims))
    else:
        um = mid - mid.mean(dim=kdims, keepdim=True)
        rm = torch.rsqrt((um * um).mean(dim=kdims, keepdim=True) + eps)
        nm = um * rm

    def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sum(dim=kdims, keepdim=True)

    t = group(_affine(signal, weight))
    # g = J t = r t - r mean(t) - r mean(n t) n, in two passes of t's size
    g = torch.addcmul(t.mean(dim=kdims, keepdim=True).mul_(-rm), t, rm)
    g.addcmul_(nm, dot(nm, t).mul_(rm).div_(-math.prod(nm.shape[d] for d in kdims)))
    squares = dot(dx, dx)
    spread = dot(group(signal), group(ctx.output - ctx.references[1])).sub_(dot(g, dx))
    coefficient = torch.where(squares > 0, spread / torch.where(squares > 0, squares, 1.0), 0.0)
    return ungroup(g.addcmul_(dx, coefficient))


class NormDeepLift(Rule):
    """DeepLIFT through a normalisation, exact: with u = x - mean(x), v = mean(u^2) and r = (v + eps)^-1/2,
    y = u r weight + bias; the product u r takes the bilinear rule, v = mean(u u) too, and r(v) Rescale,
    so the multipliers are linear in the differences and sum to y - y0. Where r and r0 differ by more than
    ``conditioning`` times (LayerNorm), the secant rule (:func:`_secant`), complete too.

    r(v)'s Rescale multiplier (r - r0) / (v - v0) is written with v = r^-2 - eps as -r^2 r0^2 / (r + r0):
    the same value without the cancellation of v - v0, and at v = v0 the derivative -r^3 / 2 itself.

    Parameters
    ----------
    conditioning : float
        the ratio of r to r0 above which the secant rule replaces the exact one
    """

    kinds = (Kind.NORM,)

    def __init__(self, conditioning: float = 4.0):
        self.conditioning = conditioning

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        group, dims, weight, _, eps, ungroup = _norm_axes(ctx)
        x, x0 = group(ctx.x), group(ctx.references[0][0])
        u, u0 = x - x.mean(dim=dims, keepdim=True), x0 - x0.mean(dim=dims, keepdim=True)
        r, r0 = (torch.rsqrt((t * t).mean(dim=dims, keepdim=True) + eps) for t in (u, u0))
        # A reference of (nearly) no variance, as a zero-initialised bias gives (r0 = eps^-1/2): the mean
        # r's multipliers grow by r0 / r and cancel, and chained over layers lose completeness to rounding;
        # there, for LayerNorm, the secant rule, whose gradient is the midpoint's
        ill = torch.maximum(r, r0) > self.conditioning * torch.minimum(r, r0)
        secant = _record(ctx, Norm).type == "layer" and bool(ill.any())
        if secant and bool(ill.all()):
            return [_norm_secant(ctx, signal)]
        n = math.prod(x.shape[d] for d in dims)
        t = group(_affine(signal, weight))  # the multiplier at z = u r
        kdims = tuple(d - x.ndim if d >= 0 else d for d in dims)  # the same dims counted from the end
        # m_u = t (r + r0) / 2 + sum(t (u + u0) / 2) slope (u + u0) / n, centred: u + u0 is centred already,
        # so m_x = (t - mean t) (r + r0) / 2 + k (u + u0), one pass each for the two terms
        half, w = (r + r0) / 2, u + u0
        k = (t * w).sum(dim=kdims, keepdim=True).mul_(-(r * r0) ** 2 / ((r + r0) * (2 * n)))
        m_x = torch.addcmul(t.mean(dim=kdims, keepdim=True).mul_(-half), t, half).addcmul_(w, k)
        m_x = ungroup(m_x)
        if secant:
            m_x = torch.where(ill, _norm_secant(ctx, signal), m_x)
        return [m_x]


class SoftmaxGradient(Rule):
    """The softmax's gradient from its output alone, s * (g - sum(g s)), by autograd's own kernel: the
    scores it was computed from need not be kept."""

    kinds = (Kind.SOFTMAX,)
    reads = ("output",)
    exact_gradient = True

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        dim = _record(ctx, Softmax).dim % ctx.output.ndim + 1
        out = ctx.output.expand_as(signal)
        return [torch.ops.aten._softmax_backward_data(signal, out, dim, out.dtype)]


class SoftmaxLRP(Rule):
    """AttnLRP's softmax rule (Achtibat et al. 2024, Prop. 3.1): R_in = x * (R - s * sum(R)), s the
    softmax output, the sum over the softmax dimension."""

    kinds = (Kind.SOFTMAX,)

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        dim = _record(ctx, Softmax).dim % ctx.output.ndim + 1
        return [ctx.x * (signal - ctx.output * signal.sum(dim=dim, keepdim=True))]


class SoftmaxDeepLift(Rule):
    """DeepLIFT through a softmax, exact: with e = exp(x - c) (c one constant per row for x and the
    reference), S = sum(e) and q = 1 / S, y = e q takes the bilinear rule, q(S) and e(x) Rescale.

    Parameters
    ----------
    tolerance : float
        differences at or below which Rescale takes the derivative
    underflow : float
        a row's sum of shifted exponentials below which the secant rule replaces the exact one (the exact terms would cancel)
    """

    kinds = (Kind.SOFTMAX,)

    def __init__(self, tolerance: float = 1e-10, underflow: float = 1e-4):
        self.tolerance, self.underflow = tolerance, underflow

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        d = _record(ctx, Softmax).dim % ctx.output.ndim
        x, reference = ctx.x, ctx.references[0][0]  # the reference's rows, (1, ...) or (B, ...)
        c = torch.maximum(x.amax(dim=d, keepdim=True), reference.amax(dim=d, keepdim=True))
        e, e0 = torch.exp(x - c), torch.exp(reference - c)
        big_s, big_s0 = e.sum(dim=d, keepdim=True), e0.sum(dim=d, keepdim=True)
        q, q0 = 1 / big_s, 1 / big_s0
        dq = _rescale(q - q0, big_s - big_s0, self.tolerance, lambda: -q * q)
        # m_e = s (q + q0) / 2 + sum(s (e + e0) / 2) dq: the row sum's term added to the product in one pass
        m_e = torch.addcmul((signal * (e + e0)).sum(dim=d + 1, keepdim=True).mul_(dq / 2), signal, (q + q0) / 2)
        dx = (x - reference).nan_to_num_(nan=0.0)  # -inf at both (a boolean mask): e = e0 = 0, no contribution
        out = m_e.mul_(_rescale(e - e0, dx, self.tolerance, lambda: e))  # e(x)'s derivative is e
        # rows where the exponentials of x or of x0 all but underflow at their shared shift (scores some 10
        # or more apart): the terms of the exact rule grow as 1 / S and cancel, so the secant rule instead; and
        # rows the exact rule leaves non-finite, looked for row by row only when the sum of all is not finite
        bad = torch.minimum(big_s, big_s0) < self.underflow
        if not bool(torch.isfinite(out.sum())):
            bad = bad | ~torch.isfinite(out).all(dim=d + 1, keepdim=True)
        return [torch.where(bad, _secant(ctx, signal, (d,), rows=True), out) if bad.any() else out]


@dataclass(frozen=True)
class NamedRule:
    """A rule a user can choose by name: how to build it and what it computes."""

    build: Callable[[], Rule]
    formula: str


# z = W x + b is the layer's pre-activation, s = R / stab(z); R_in is the relevance of the inputs.
NAMED: dict[str, NamedRule] = {
    "gradient": NamedRule(Gradient, "s_in = W^T s (the plain vector-Jacobian product)"),
    "epsilon": NamedRule(lambda: Epsilon(1e-6), "R_in = x * W^T (R / (z + eps sign z)), eps = 1e-6"),
    "zplus": NamedRule(lambda: AlphaBeta(1.0, 0.0, bias=False),
                       "R_in = x+ * W+^T (R / z+) + x- * W-^T (R / z+), z+ = W+ x+ + W- x-, bias ignored"),
    "alpha1beta0": NamedRule(lambda: AlphaBeta(1.0, 0.0), "alpha-beta with alpha = 1, beta = 0, positive bias kept"),
    "alpha2beta1": NamedRule(lambda: AlphaBeta(2.0, 1.0),
                             "R_in = 2 (positive contributions / z+) R - 1 (negative contributions / z-) R"),
    "gamma": NamedRule(lambda: Gamma(0.25, 1e-6), "generalized gamma: positive outputs through (W + gamma W+) x+ + "
                       "(W + gamma W-) x-, negative ones the reverse, gamma = 0.25"),
    "flat": NamedRule(Flat, "R_in = 1^T (R / (1 1)): uniform over each output's receptive field"),
    "wsquare": NamedRule(WSquare, "R_in = (W*W)^T (R / ((W*W) 1)): in proportion to the squared weights"),
    "zbox": NamedRule(lambda: ZB(0.0, 1.0),
                      "R_in = (x W^T - l W+^T - h W-^T) (R / (W x - W+ l - W- h)), inputs in [l, h] = [0, 1]"),
    "pass": NamedRule(Pass, "R_in = R (identity through an activation)"),
}


def available() -> dict[str, str]:
    """Rule name -> its formula and the node kinds it acts on."""
    return {name: f"{spec.formula} [{', '.join(spec.build().kinds)}]" for name, spec in NAMED.items()}


def resolve(rule: str | Rule) -> Rule:
    """A rule object from a name in :data:`NAMED` or a :class:`Rule` instance."""
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, str) and rule in NAMED:
        return NAMED[rule].build()
    raise unknown_name("rule", rule, NAMED, AttributionError)
