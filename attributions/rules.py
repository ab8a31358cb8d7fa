"""Rules: the backward of one node kind, given the node's stored forward tensors.

A rule maps the signal at a node's output, shaped (K, B, ...), to the signals at its tensor
inputs. Signals are relevance for LRP rules, (modified) gradients for gradient rules and
multipliers for DeepLIFT. Conventions follow zennit / iNNvestigate: a stabiliser adds epsilon
with the sign of the denominator (sign(0) = +1); alpha-beta splits inputs and weights by sign.

Each rule class names the node kinds it can act on (``kinds``); :data:`NAMED` lists the rules a
user can pick by name in ``Explainer(..., rules={...})``, and :func:`available` their formulas.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attributions.errors import AttributionError, unknown_name
from attributions.graph import LINEAR_KINDS
from attributions.layers import LinearOp

WEIGHTED_KINDS = ("dense", "conv", "affine")  # linear kinds with a weight tensor
ACTIVATION_KINDS = ("relu", "leaky_relu")


@dataclass
class Context:
    """What a rule may read: the node's op, its inputs and output, and (DeepLIFT) their references."""

    node: object
    inputs: list[torch.Tensor]
    output: torch.Tensor
    op: LinearOp | None = None
    ref_inputs: list[torch.Tensor] | None = None
    ref_output: torch.Tensor | None = None
    indices: torch.Tensor | None = None  # max pooling: the winners of the forward pass
    ref_indices: torch.Tensor | None = None

    @property
    def x(self) -> torch.Tensor:
        return self.inputs[0]


def stabilize(z: torch.Tensor, epsilon: float) -> torch.Tensor:
    """z + epsilon * sign(z), with sign(0) = +1 (copysign of +0 is +)."""
    return z + torch.copysign(torch.tensor(epsilon, dtype=z.dtype), z)


class Rule:
    """Backward of one node: ``backward(ctx, signal) -> [signal per tensor input]``.

    ``kinds``: the node kinds the rule can act on (a rule map that puts it elsewhere is refused).
    """

    kinds: tuple[str, ...] = ()

    def backward(self, ctx: Context, signal: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


# --- linear layers ---------------------------------------------------------------------------------

class Gradient(Rule):
    """The plain vector-Jacobian product W^T s (also DeepLIFT's multipliers through linear layers)."""

    kinds = LINEAR_KINDS

    def backward(self, ctx, signal):
        w, _ = ctx.op.weights()
        return [ctx.op.transpose(signal, w, ctx.x.shape)]


class Epsilon(Rule):
    """LRP-epsilon: R_in = x * W^T (R / stab(z)), z = W x + b. With a tiny epsilon: LRP-z."""

    kinds = LINEAR_KINDS

    def __init__(self, epsilon: float = 1e-6):
        self.epsilon = epsilon

    def backward(self, ctx, signal):
        w, _ = ctx.op.weights()
        s = signal / stabilize(ctx.output, self.epsilon)
        return [ctx.x * ctx.op.transpose(s, w, ctx.x.shape)]


class AlphaBeta(Rule):
    """LRP-alpha-beta, alpha - beta = 1, inputs and weights split by sign.

    z+ = x+ w+ + x- w- (+ b+), z- = x+ w- + x- w+ (+ b-); positive relevance flows along z+
    scaled by alpha, negative along z- scaled by beta. ``bias=False`` drops the bias (the
    classic z+ rule). alpha = 1, beta = 0 is z+.
    """

    kinds = WEIGHTED_KINDS

    def __init__(self, alpha: float = 1.0, beta: float = 0.0, bias: bool = True, stabilizer: float = 1e-6):
        if abs(alpha - beta - 1.0) > 1e-9:
            raise ValueError(f"alpha - beta must be 1, got alpha={alpha}, beta={beta}")
        self.alpha, self.beta, self.bias, self.stabilizer = alpha, beta, bias, stabilizer

    def backward(self, ctx, signal):
        op, x = ctx.op, ctx.x
        w, b = op.weights()
        wp, wn = w.clamp(min=0), w.clamp(max=0)
        bp = b.clamp(min=0) if self.bias else None
        bn = b.clamp(max=0) if self.bias else None
        if bool((x >= 0).all()):
            # Inputs after a ReLU: x- = 0, so z- follows from z without a second forward.
            zp = op.forward(x, wp, bp)
            pairs = [(signal * (self.alpha / stabilize(zp, self.stabilizer)), wp)]
            if self.beta:
                zn = (ctx.output - zp) if self.bias else op.forward(x, wn)
                pairs.append((signal * (-self.beta / stabilize(zn, self.stabilizer)), wn))
            return [x * op.transpose_sum(pairs, x.shape)]
        xp, xn = x.clamp(min=0), x.clamp(max=0)
        zp = op.forward(xp, wp, bp) + op.forward(xn, wn)
        sp = signal * (self.alpha / stabilize(zp, self.stabilizer))
        out = xp * op.transpose(sp, wp, x.shape) + xn * op.transpose(sp, wn, x.shape)
        if self.beta:
            zn = op.forward(xp, wn, bn) + op.forward(xn, wp)
            sn = signal * (self.beta / stabilize(zn, self.stabilizer))
            out = out - xp * op.transpose(sn, wn, x.shape) - xn * op.transpose(sn, wp, x.shape)
        return [out]


class Gamma(Rule):
    """LRP-gamma: weights and bias W + gamma W+, b + gamma b+, stabilised by epsilon."""

    kinds = WEIGHTED_KINDS

    def __init__(self, gamma: float = 0.25, epsilon: float = 1e-6):
        self.gamma, self.epsilon = gamma, epsilon

    def backward(self, ctx, signal):
        w, b = ctx.op.weights()
        wg, bg = w + self.gamma * w.clamp(min=0), b + self.gamma * b.clamp(min=0)
        z = ctx.op.forward(ctx.x, wg, bg)
        s = signal / stabilize(z, self.epsilon)
        return [ctx.x * ctx.op.transpose(s, wg, ctx.x.shape)]


class _InputFree(Rule):
    """Relevance shared by fixed non-negative weights V: R_in = V^T (R / (V 1))."""

    kinds = WEIGHTED_KINDS

    def _weights(self, w):
        raise NotImplementedError

    def backward(self, ctx, signal):
        w, _ = ctx.op.weights()
        v = self._weights(w)
        z = ctx.op.forward(torch.ones_like(ctx.x), v)
        return [ctx.op.transpose(signal / stabilize(z, 1e-12), v, ctx.x.shape)]


class WSquare(_InputFree):
    """LRP-w^2: relevance shared in proportion to the squared weights (input-independent)."""

    def _weights(self, w):
        return w * w


class Flat(_InputFree):
    """LRP-flat: relevance shared uniformly over each output's receptive field."""

    def _weights(self, w):
        return torch.ones_like(w)


class ZB(Rule):
    """Deep Taylor zB for inputs bounded in [low, high]:
    z = W x - W+ low - W- high, R_in = x W^T s - low W+^T s - high W-^T s, s = R / stab(z)."""

    kinds = WEIGHTED_KINDS

    def __init__(self, low: float = 0.0, high: float = 1.0, stabilizer: float = 1e-6):
        self.low, self.high, self.stabilizer = low, high, stabilizer

    def backward(self, ctx, signal):
        op, x = ctx.op, ctx.x
        w, _ = op.weights()
        wp, wn = w.clamp(min=0), w.clamp(max=0)
        low, high = torch.full_like(x, self.low), torch.full_like(x, self.high)
        z = op.forward(x, w) - op.forward(low, wp) - op.forward(high, wn)
        s = signal / stabilize(z, self.stabilizer)
        return [x * op.transpose(s, w, x.shape) - low * op.transpose(s, wp, x.shape)
                - high * op.transpose(s, wn, x.shape)]


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

    def backward(self, ctx, signal):
        w, _ = ctx.op.weights()
        wp = w.clamp(min=0) if ctx.op.has_negative_weights else w
        return [ctx.op.transpose(signal, wp, ctx.x.shape)]


# --- nonlinearities, pooling, residual adds ----------------------------------------------------------

class Pass(Rule):
    """Identity: relevance passes a ReLU unchanged (LRP, Deep Taylor)."""

    kinds = ACTIVATION_KINDS

    def backward(self, ctx, signal):
        return [signal]


class ReLUGradient(Rule):
    """Gradient of ReLU / LeakyReLU; ``guided`` keeps only positive results (Guided Backprop),
    ``deconv`` ignores the forward mask and keeps positive signals (DeconvNet)."""

    kinds = ACTIVATION_KINDS

    def __init__(self, mode: str = "gradient"):
        self.mode = mode

    def backward(self, ctx, signal):
        if self.mode == "deconv":
            return [signal.clamp(min=0)]
        slope = ctx.node.params.get("negative_slope", 0.0)
        out = signal * (ctx.x > 0) if slope == 0 else signal * torch.where(ctx.x > 0, 1.0, slope).to(signal.dtype)
        return [out.clamp(min=0) if self.mode == "guided" else out]


class Rescale(Rule):
    """DeepLIFT's Rescale rule: the multiplier delta_y / delta_x.

    For a ReLU or LeakyReLU |delta_y| <= |delta_x| holds exactly in floating point, so the quotient
    never blows up; only delta_x = 0 exactly is undefined (0 / 0). There the multiplier is set to
    0 where captum falls back to the gradient: such a unit contributes multiplier x 0 = 0, and its
    multiplier could only travel on to units whose difference is zero as well (delta_x = 0 arises
    where a unit's whole receptive field equals the reference), so maps and recorded signals are
    the same, at half the cost of the fallback's extra passes.
    """

    kinds = ACTIVATION_KINDS

    def backward(self, ctx, signal):
        ratio = (ctx.output - ctx.ref_output).div_(ctx.x - ctx.ref_inputs[0]).nan_to_num_(nan=0.0)
        return [signal * ratio]


def _pair(v) -> list[int]:
    return list(v) if isinstance(v, (tuple, list)) else [v, v]


def _unpool(signal: torch.Tensor, indices: torch.Tensor, in_shape: torch.Size) -> torch.Tensor:
    """Scatter-add (K, B, C, *out) signals to the max positions given by indices (B, C, *out)."""
    k, b, c = signal.shape[:3]
    idx = indices.reshape(1, b, c, -1).expand(k, b, c, -1)
    out = torch.zeros(k, b, c, in_shape[2:].numel(), dtype=signal.dtype, device=signal.device)
    return out.scatter_add_(3, idx, signal.reshape(k, b, c, -1)).reshape(k, b, *in_shape[1:])


class WinnerTakeAll(Rule):
    """Max pooling: the whole signal goes to the winning input (the max-pooling gradient)."""

    kinds = ("maxpool",)

    def backward(self, ctx, signal):
        m = ctx.node.module
        if signal.shape[0] == 1 and ctx.x.ndim == 4:  # torch's own kernel for a single signal
            grad = torch.ops.aten.max_pool2d_with_indices_backward(
                signal[0], ctx.x, _pair(m.kernel_size), _pair(m.stride or m.kernel_size), _pair(m.padding),
                _pair(m.dilation), m.ceil_mode, ctx.indices)
            return [grad[None]]
        return [_unpool(signal, ctx.indices, ctx.x.shape)]


class DeepLiftMaxPool(Rule):
    """Max pooling as captum's DeepLift treats it: multipliers from the change of the cross
    maximum of input and reference outputs, the gradient where |delta_x| < eps.

    Computed per pooling window (on the pooled grid, then scattered to the winners), which is the
    same as captum's unpool-then-divide: every numerator sits at a winner, so dividing by that
    winner's delta_x before or after scattering gives the same sums.
    """

    kinds = ("maxpool",)

    def __init__(self, eps: float = 1e-10):
        self.eps = eps

    def backward(self, ctx, signal):
        x, ref = ctx.x, ctx.ref_inputs[0]
        out, out_ref = ctx.output, ctx.ref_output
        idx = ctx.indices
        b, c = idx.shape[:2]
        flat_x = x.reshape(b, c, -1)
        flat_ref = ref.reshape(ref.shape[0], c, -1).expand(b, -1, -1)
        cross = torch.maximum(out, out_ref)
        dx = (out - torch.gather(flat_ref, 2, idx.reshape(b, c, -1)).reshape(out.shape))  # x at its winner is out
        small = dx.abs() < self.eps
        q = torch.where(small, 1.0, (cross - out_ref) / torch.where(small, 1.0, dx))
        grad = _unpool(signal * q, idx, x.shape)
        if bool((out < out_ref).any()):  # windows where the reference's maximum is the larger one
            idx_ref = ctx.ref_indices.expand_as(idx)
            dx_ref = torch.gather(flat_x, 2, idx_ref.reshape(b, c, -1)).reshape(out.shape) - out_ref
            small_ref = dx_ref.abs() < self.eps
            q_ref = torch.where(small_ref, 0.0, (out - cross) / torch.where(small_ref, 1.0, dx_ref))
            grad = grad + _unpool(signal * q_ref, idx_ref, x.shape)
        return [grad]


class ProportionalSplit(Rule):
    """A residual add a + b: relevance split in proportion to each branch's value (stabilised)."""

    kinds = ("add",)

    def __init__(self, epsilon: float = 1e-6):
        self.epsilon = epsilon

    def backward(self, ctx, signal):
        s = signal / stabilize(ctx.output, self.epsilon)
        return [s * x for x in ctx.inputs]


class Copy(Rule):
    """The gradient of an add: the same signal to every input."""

    kinds = ("add",)

    def backward(self, ctx, signal):
        return [signal for _ in ctx.inputs]


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
    "gamma": NamedRule(lambda: Gamma(0.25, 1e-6), "epsilon rule on W + gamma W+, b + gamma b+, gamma = 0.25"),
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
