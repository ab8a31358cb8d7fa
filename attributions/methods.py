"""Methods as data: a rule table (which rule runs at which node kind), an output convention, and
the engine that computes the maps.

A graph method's rule table maps node kinds (``dense``, ``conv``, ``affine``, ``avgpool``,
``relu``, ``leaky_relu``, ``maxpool``, ``add``, and ``first`` for the linear layers that read the
input) to rules; ``Explainer(..., rules={...})`` overrides entries by kind or by node name. The
methods outside the rule engine (integrated gradients, SmoothGrad, the controls) carry their
own engine object, so the explainer never branches on a method's name.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from attributions import rules as R
from attributions.attention_maps import AttentionFlow, AttentionGradCam
from attributions.cam import GradCam
from attributions.catalog import ABOUT, FAMILIES
from attributions.controls import EdgeControl, NoiseControl
from attributions.engines import CHAIN, Engine, IntegratedGradientsEngine, SmoothGradEngine
from attributions.errors import AttributionError, unknown_name
from attributions.kinds import SIGNAL_KINDS, Kind
from attributions.patterns import PatternChain, PatternRule, PatternSource

# A rule table's keys: the node kinds, and FIRST, the linear layers that read the input (LRP's input-layer rules)
FIRST: Final = "first"
RuleKey = Kind | Literal["first"]
Rules = dict[RuleKey, "R.Rule"]


@dataclass(frozen=True)
class Method:
    """One attribution method.

    Built by :func:`build_method`; checked on creation (a known ``family``; for a rule chain, a rule
    for every node kind that carries the signal, :data:`attributions.kinds.SIGNAL_KINDS`).

    Parameters
    ----------
    name : str
        The method's name, as :func:`build_method` takes it.
    description : str
        One line on what it computes (:func:`available_methods`).
    reference : str
        The paper it follows, in words.
    signal : str, default "gradient"
        What the backward chain carries: ``relevance`` (LRP / DTD: starts as the explained logit, or
        one-hot), ``gradient`` (starts one-hot), ``multiplier`` (DeepLIFT: starts one-hot; the recorded
        signal is the multiplier times the difference from the reference), ``factor`` (LRP with the relevance
        written R = value * c: the chain carries c, starting as the relevance over the start's value, and
        records c times each node's value; rules whose relevance is a z rule through a locally linear map
        then hand on that map's gradient, and read no layer's values; relevance injected on a value of
        zero, as ``propagate`` at a ReLU's output could, has no factor and is not carried).
    rules : dict, default {}
        The rule table of a rule chain: node kind (or ``"first"``, the linear layers reading the input)
        -> :class:`~attributions.rules.Rule`; empty for the methods with an engine of their own.
    output : str, default "onehot"
        Where the chain starts: ``onehot`` (the one-hot vector of the explained class) or ``logit``
        (that vector times the logits).
    times_input : bool, default False
        Multiply the chain's signal at the input by the input (input x gradient).
    engine : Engine, default CHAIN
        What computes the maps: the rule chain (:data:`attributions.engines.CHAIN`, PatternNet's
        :class:`~attributions.patterns.PatternChain`), captum (integrated gradients, SmoothGrad),
        Grad-CAM and the attention maps, or a model-independent control.
    params : dict, default {}
        Parameters the method was built with, stated in the report's methods text (e.g. ``{"q": 98.0}``).
    heatmap : str, default "sum"
        How maps become heatmaps for the similarity checks (:func:`audit.measures.similarity.reduce_map`):
        ``sum`` of channels for relevance and contributions, ``max-abs`` for gradient-like maps.
    completeness : str or None, default None
        What a map's sum equals where the method promises it: ``difference``: f(x) - f(x0) for the
        explained output, x0 the ``baseline`` input; ``output``: f(x); None: no promise
        (:meth:`Explainer.compute_convergence_delta <attributions.explainer.Explainer.compute_convergence_delta>`).
    family : str, default "gradient-based"
        One of :data:`FAMILIES`, the group the report draws and colours the method in.
    cite : tuple of str, default ()
        BibTeX keys of the method's references (``reports.references``).
    baseline : float or tuple of float, default 0.0
        The reference input of DeepLIFT and integrated gradients, a constant or one value per channel.

    Raises
    ------
    AttributionError
        For an unknown ``family``, or a rule chain whose table misses a signal-carrying node kind.
    """

    name: str
    description: str
    reference: str
    signal: str = "gradient"
    rules: Rules = field(default_factory=dict[RuleKey, "R.Rule"])
    output: str = "onehot"
    times_input: bool = False
    engine: Engine = CHAIN
    params: dict[str, Any] = field(default_factory=dict[str, Any])
    heatmap: str = "sum"
    completeness: str | None = None
    family: str = "gradient-based"
    cite: tuple[str, ...] = ()
    baseline: float | tuple[float, ...] = 0.0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise AttributionError(f"method {self.name!r}: family {self.family!r} is not one of {', '.join(FAMILIES)}")
        missing = [k for k in SIGNAL_KINDS if k not in self.rules] if self.chain else []
        if missing:  # else the first graph holding such a node would find no rule for it
            raise AttributionError(f"method {self.name!r}: its rule table has no rule for the node kind"
                                   f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}; every kind that carries "
                                   "the signal needs one (attributions.kinds)")

    @property
    def chain(self) -> bool:
        """Whether the method is a backward chain of rules that ``propagate`` can follow."""
        return self.engine.chain

    @property
    def linear_in_signal(self) -> bool:
        """Whether the method is a backward chain linear in the propagated signal (every rule declares
        :attr:`~attributions.rules.Rule.linear_in_signal`): the condition under which Sixt et al.'s Theorem 1
        makes a converged chain a rank-1 collapse."""
        return self.chain and all(getattr(r, "linear_in_signal", True) for r in self.rules.values())

    @property
    def nonnegative_chain(self) -> bool:
        """Whether the chain is one Sixt et al.'s Theorem 1 covers: linear in the signal, with a non-negative
        backward matrix at its weighted layers (:attr:`~attributions.rules.Rule.nonnegative`: the z+ family,
        DeepLIFT-Ablation; the convolutions alone suffice, as in LRP-CMP, whose dense layers are signed): such a
        product converges to rank 1 as it grows."""
        return self.linear_in_signal and any(getattr(self.rules.get(k), "nonnegative", False) for k in (Kind.DENSE, Kind.CONV))

    @property
    def rectifies_signal(self) -> bool:
        """Whether a ReLU or threshold acts on the backward signal (guided backprop, deconvnet, RectGrad, Guided
        Grad-CAM's guided factor): the partial input recovery of Nie, Zhang & Patel (2018) can follow."""
        return self.engine.rectifies or any(not getattr(r, "linear_in_signal", True) for r in self.rules.values())

    @property
    def input_multiplier(self) -> bool:
        """Whether the map is (x - reference) times a model-dependent factor (input x gradient, integrated
        gradients, DeepLIFT's multipliers times the difference, LRP whose first layer hands each input x times a
        factor): the map keeps the input's structure whatever the factor (Adebayo et al. 2018; Kindermans et al.
        2019)."""
        if self.times_input or self.engine.times_input or self.signal in ("multiplier", "factor"):
            return True
        first = self.rules.get(FIRST, self.rules.get(Kind.CONV))
        return self.signal == "relevance" and bool(getattr(first, "proportional_to_input", False))


# Data movement takes its exact adjoint in every method; the other traced kinds get each family's rule.
def _traced(mix: R.Rule, activation: R.Rule, product: R.Rule, norm: R.Rule, softmax: R.Rule,
            reduce: R.Rule | None = None) -> Rules:
    """``reduce`` defaults to the ``mix`` rule: the gradient's VJP, LRP's z rule (exact on a norm or a max)."""
    return {Kind.MOVE: R.VJP(), Kind.MIX: mix, Kind.ACTIVATION: activation, Kind.PRODUCT: product, Kind.NORM: norm,
            Kind.SOFTMAX: softmax, Kind.REDUCE: reduce or mix}


def _gradient_rules(relu: R.Rule, activation: R.Rule | None = None) -> Rules:
    g, exact = R.Gradient(), R.VJP()
    return {Kind.DENSE: g, Kind.CONV: g, Kind.AFFINE: g, Kind.AVGPOOL: g, Kind.RELU: relu, Kind.LEAKY_RELU: relu,
            Kind.MAXPOOL: R.WinnerTakeAll(), Kind.ADD: R.Copy(),
            **_traced(exact, activation or exact, exact, exact, R.SoftmaxGradient())}


def _lrp_rules(dense: R.Rule, conv: R.Rule, first: R.Rule | None = None, stabilizer: float = 1e-6) -> Rules:
    """Products hold a gate (attention weights, SE gates) constant (CP-LRP); the LN rule through norms."""
    rules = {Kind.DENSE: dense, Kind.CONV: conv, Kind.AFFINE: R.Epsilon(stabilizer), Kind.AVGPOOL: R.Epsilon(stabilizer),
             Kind.RELU: R.Pass(), Kind.LEAKY_RELU: R.Pass(), Kind.MAXPOOL: R.WinnerTakeAll(),
             Kind.ADD: R.ProportionalSplit(stabilizer),
             **_traced(R.LinearZ(stabilizer), R.Pass(), R.GateProduct(stabilizer), R.NormLRP(stabilizer),
                       R.SoftmaxLRP())}
    if first is not None:
        rules[FIRST] = first
    return rules


def _deeplift_rules(linear: R.Rule, eps: float) -> Rules:
    return {Kind.DENSE: linear, Kind.CONV: linear, Kind.AFFINE: linear, Kind.AVGPOOL: linear, Kind.RELU: R.Rescale(),
            Kind.LEAKY_RELU: R.Rescale(), Kind.MAXPOOL: R.DeepLiftMaxPool(eps), Kind.ADD: R.Copy(),
            **_traced(R.VJP(), R.RescaleAny(), R.DeepLiftProduct(), R.NormDeepLift(), R.SoftmaxDeepLift(),
                      R.SecantReduce())}


def _method(name: str, **how: Any) -> Method:
    """The method ``name`` in the catalog's words (:data:`attributions.catalog.ABOUT`), computed as ``how`` says."""
    about = ABOUT[name]
    return Method(name, about.description, about.reference, family=about.family, cite=about.cite, **how)


def _gradient() -> Method:
    return _method("gradient", rules=_gradient_rules(R.ReLUGradient("gradient")), heatmap="max-abs")


def _input_x_gradient() -> Method:
    return _method("input-x-gradient", rules=_gradient_rules(R.ReLUGradient("gradient")), times_input=True)


def _guided_backprop() -> Method:
    return _method("guided-backprop", rules=_gradient_rules(R.ReLUGradient("guided"), R.ActivationGradient("guided")),
                   heatmap="max-abs")


def _deconvnet() -> Method:
    return _method("deconvnet", rules=_gradient_rules(R.ReLUGradient("deconv"), R.ActivationGradient("deconv")),
                   heatmap="max-abs")


def _rectgrad(q: float = 98.0) -> Method:
    return _method("rectgrad", rules=_gradient_rules(R.RectGrad(q)), params={"q": q}, heatmap="max-abs")


def _pattern_method(name: str, mode: str) -> Callable[..., Method]:
    def build(estimator: str = "relu", patterns: Any = None, data: Any = None, cache: Any = None, cache_for: str = "",
              source: str = "") -> Method:
        fitted = PatternSource(estimator, patterns, data, cache=cache, cache_for=cache_for, source=source)
        rule = PatternRule(fitted, mode)
        return _method(name, rules=_gradient_rules(R.ReLUGradient("gradient")) | {Kind.DENSE: rule, Kind.CONV: rule},
                       engine=PatternChain(fitted), params={"estimator": estimator})
    return build


def _lrp(name: str, dense: R.Rule, conv: R.Rule, first: R.Rule | None = None, output: str = "logit",
         stabilizer: float = 1e-6) -> Method:
    return _method(name, signal="relevance", output=output, rules=_lrp_rules(dense, conv, first, stabilizer),
                   completeness="output" if output == "logit" else None)


def _lrp_z(stabilizer: float = 1e-9) -> Method:
    return _lrp("lrp-z", R.Epsilon(stabilizer), R.Epsilon(stabilizer), stabilizer=stabilizer)


def _lrp_epsilon(epsilon: float = 1e-6) -> Method:
    return _lrp("lrp-epsilon", R.Epsilon(epsilon), R.Epsilon(epsilon), stabilizer=epsilon)


def _lrp_factor(name: str, epsilon: float, gates: bool) -> Method:
    """LRP-0 through the linear layers with the transformer rules (the LN rule, the identity rule through
    activations; products with their gates held, or in halves), computed in factor form (signal "factor")."""
    gradient = R.Gradient()
    rules = {Kind.DENSE: gradient, Kind.CONV: gradient, Kind.AFFINE: gradient, Kind.AVGPOOL: gradient,
             Kind.RELU: R.ReLUGradient("gradient"), Kind.LEAKY_RELU: R.ReLUGradient("gradient"), Kind.MAXPOOL: R.WinnerTakeAll(),
             Kind.ADD: R.Copy(), **_traced(R.VJP(), R.IdentityFactor(epsilon), R.HeldGradient(gates), R.NormFactor(),
                                        R.SoftmaxGradient())}
    return _method(name, signal="factor", output="logit", rules=rules, completeness="output",
                   params={"epsilon": epsilon})


def _cp_lrp(epsilon: float = 1e-6) -> Method:
    return _lrp_factor("cp-lrp", epsilon, gates=True)


def _attnlrp(epsilon: float = 1e-6) -> Method:
    return _lrp_factor("attnlrp", epsilon, gates=False)


def _zplus(stabilizer: float = 1e-6) -> Method:
    rule = R.AlphaBeta(1.0, 0.0, bias=False, stabilizer=stabilizer)
    return _lrp("lrp-zplus", rule, rule, stabilizer=stabilizer)


def _alpha_beta(alpha: float, beta: float) -> Callable[..., Method]:
    def build(stabilizer: float = 1e-6) -> Method:
        rule = R.AlphaBeta(alpha, beta, bias=True, stabilizer=stabilizer)
        return _lrp(f"lrp-alpha{alpha:g}beta{beta:g}", rule, rule, stabilizer=stabilizer)
    return build


def _cmp_alpha1beta0(epsilon: float = 0.1, stabilizer: float = 1e-6) -> Method:
    return _lrp("lrp-cmp-alpha1beta0", R.Epsilon(epsilon), R.AlphaBeta(1.0, 0.0, bias=True, stabilizer=stabilizer),
                stabilizer=stabilizer)


def _chefer_lrp(stabilizer: float = 1e-9) -> Method:
    zplus = R.AlphaBeta(1.0, 0.0, bias=False, stabilizer=stabilizer)
    rules = {Kind.DENSE: zplus, Kind.CONV: zplus, FIRST: R.ZB(None, None, stabilizer), Kind.AFFINE: R.Epsilon(stabilizer),
             Kind.AVGPOOL: R.Epsilon(stabilizer), Kind.RELU: R.Pass(), Kind.LEAKY_RELU: R.Pass(), Kind.MAXPOOL: R.WinnerTakeAll(),
             Kind.ADD: R.NormalisedSplit(stabilizer),
             **_traced(R.LinearZ(stabilizer), R.Pass(), R.GateProduct(stabilizer, gates=False), R.Pass(), R.Pass())}
    return _method("chefer-lrp", signal="relevance", rules=rules)


def _lrp_gamma(gamma: float = 0.25, epsilon: float = 1e-6) -> Method:
    rule = R.Gamma(gamma, epsilon)
    return _lrp("lrp-gamma", rule, rule, stabilizer=epsilon)


def _epsilon_plus(epsilon: float = 1e-6, stabilizer: float = 1e-6) -> Method:
    return _lrp("lrp-epsilon-plus", R.Epsilon(epsilon), R.AlphaBeta(1.0, 0.0, bias=False, stabilizer=stabilizer),
                stabilizer=stabilizer)


def _epsilon_alpha2beta1(epsilon: float = 1e-6, stabilizer: float = 1e-6) -> Method:
    return _lrp("lrp-epsilon-alpha2beta1", R.Epsilon(epsilon), R.AlphaBeta(2.0, 1.0, stabilizer=stabilizer),
                stabilizer=stabilizer)


def _deep_taylor(low: float = 0.0, high: float = 1.0, stabilizer: float = 1e-6) -> Method:
    zplus = R.AlphaBeta(1.0, 0.0, bias=False, stabilizer=stabilizer)
    return _lrp("deep-taylor", zplus, zplus, first=R.ZB(low, high, stabilizer), stabilizer=stabilizer)


def _excitation_backprop(stabilizer: float = 1e-6) -> Method:
    rule = R.AlphaBeta(1.0, 0.0, bias=False, stabilizer=stabilizer)
    return _lrp("excitation-backprop", rule, rule, output="onehot", stabilizer=stabilizer)


def _baseline(value: Any) -> float | tuple[float, ...]:
    """A reference input: one number, or one per channel."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                          for v in value):
        return tuple(float(v) for v in value)
    raise AttributionError(f"baseline must be a number or one number per input channel, got {value!r}")


def _deeplift(eps: float = 1e-10, baseline: float | tuple[float, ...] = 0.0) -> Method:
    return _method("deeplift", signal="multiplier", rules=_deeplift_rules(R.Gradient(), eps), completeness="difference",
                   baseline=_baseline(baseline))


def _deeplift_ablation(eps: float = 1e-10, baseline: float | tuple[float, ...] = 0.0) -> Method:
    return _method("deeplift-ablation", signal="multiplier", rules=_deeplift_rules(R.DeepLiftAblation(), eps),
                   baseline=_baseline(baseline))


def _deeplift_revealcancel(eps: float = 1e-10, baseline: float | tuple[float, ...] = 0.0) -> Method:
    reveal = R.RevealCancelLinear()
    return _method("deeplift-revealcancel", signal="multiplier",
                   rules=_deeplift_rules(R.Gradient(), eps) | {Kind.DENSE: reveal, Kind.CONV: reveal,
                                                               Kind.RELU: R.RevealCancelReLU()},
                   completeness="difference", baseline=_baseline(baseline))


def _integrated_gradients(n_steps: int = 50, baseline: float | tuple[float, ...] = 0.0) -> Method:
    return _method("integrated-gradients", engine=IntegratedGradientsEngine(n_steps), params={"n_steps": n_steps},
                   completeness="difference", baseline=_baseline(baseline))


def _smoothgrad(noise: float = 0.15, samples: int = 50, seed: int | None = 0) -> Method:
    return _method("smoothgrad", engine=SmoothGradEngine(noise, samples, seed=seed),
                   params={"noise": noise, "samples": samples, "seed": seed}, heatmap="max-abs")


def _smoothgrad_ig(noise: float = 0.15, samples: int = 50, n_steps: int = 50,
                   baseline: float | tuple[float, ...] = 0.0, seed: int | None = 0) -> Method:
    return _method("smoothgrad-ig", engine=SmoothGradEngine(noise, samples, "integrated-gradients", n_steps, seed),
                   params={"noise": noise, "samples": samples, "n_steps": n_steps, "seed": seed},
                   baseline=_baseline(baseline))


def _grad_cam(layer: str = "auto", relu: bool = True, upsample: str = "bilinear", normalise: str = "none") -> Method:
    return _method("grad-cam", engine=GradCam(layer, relu, upsample, normalise),
                   params={"layer": layer, "relu": relu, "upsample": upsample, "normalise": normalise})


def _guided_grad_cam(layer: str = "auto", upsample: str = "bilinear") -> Method:
    return _method("guided-grad-cam", engine=GradCam(layer, True, upsample, "none", guided=True),
                   params={"layer": layer, "upsample": upsample}, heatmap="max-abs")


def _vit_grad_cam(layer: str = "auto", relu: bool = True, upsample: str = "bilinear", normalise: str = "none") -> Method:
    return _method("vit-grad-cam", engine=GradCam(layer, relu, upsample, normalise, tokens=True),
                   params={"layer": layer, "relu": relu, "upsample": upsample, "normalise": normalise})


def _attention_rollout(head_fusion: str = "mean", discard_ratio: float = 0.0, upsample: str = "bilinear") -> Method:
    return _method("attention-rollout",
                   engine=AttentionFlow("attention", "rollout", head_fusion, discard_ratio, upsample),
                   params={"head_fusion": head_fusion, "discard_ratio": discard_ratio, "upsample": upsample})


def _generic_attention(upsample: str = "bilinear") -> Method:
    return _method("generic-attention", engine=AttentionFlow("gradient", "generic", "mean", 0.0, upsample),
                   params={"upsample": upsample})


def _transformer_attribution(upsample: str = "bilinear") -> Method:
    return _method("transformer-attribution", engine=AttentionFlow("relevance", "generic", "mean", 0.0, upsample),
                   params={"upsample": upsample})


def _attention_grad_cam(upsample: str = "bilinear") -> Method:
    return _method("attention-grad-cam", engine=AttentionGradCam(upsample), params={"upsample": upsample})


def _edge() -> Method:
    return _method("edge", engine=EdgeControl(), heatmap="max-abs")


def _random(seed: int = 0) -> Method:
    return _method("random", engine=NoiseControl(seed), params={"seed": seed})


BUILDERS: dict[str, Callable[..., Method]] = {
    "gradient": _gradient,
    "input-x-gradient": _input_x_gradient,
    "integrated-gradients": _integrated_gradients,
    "smoothgrad": _smoothgrad,
    "smoothgrad-ig": _smoothgrad_ig,
    "guided-backprop": _guided_backprop,
    "deconvnet": _deconvnet,
    "rectgrad": _rectgrad,
    "patternnet": _pattern_method("patternnet", "net"),
    "patternattribution": _pattern_method("patternattribution", "attribution"),
    "lrp-z": _lrp_z,
    "lrp-epsilon": _lrp_epsilon,
    "cp-lrp": _cp_lrp,
    "attnlrp": _attnlrp,
    "lrp-zplus": _zplus,
    "lrp-alpha1beta0": _alpha_beta(1.0, 0.0),
    "lrp-alpha2beta1": _alpha_beta(2.0, 1.0),
    "lrp-alpha5beta4": _alpha_beta(5.0, 4.0),
    "lrp-gamma": _lrp_gamma,
    "lrp-epsilon-plus": _epsilon_plus,
    "lrp-epsilon-alpha2beta1": _epsilon_alpha2beta1,
    "lrp-cmp-alpha1beta0": _cmp_alpha1beta0,
    "chefer-lrp": _chefer_lrp,
    "deep-taylor": _deep_taylor,
    "excitation-backprop": _excitation_backprop,
    "deeplift": _deeplift,
    "deeplift-ablation": _deeplift_ablation,
    "deeplift-revealcancel": _deeplift_revealcancel,
    "grad-cam": _grad_cam,
    "guided-grad-cam": _guided_grad_cam,
    "vit-grad-cam": _vit_grad_cam,
    "attention-rollout": _attention_rollout,
    "generic-attention": _generic_attention,
    "transformer-attribution": _transformer_attribution,
    "attention-grad-cam": _attention_grad_cam,
    "edge": _edge,
    "random": _random,
}


@functools.cache
def _parameters(builder: Callable[..., Method]) -> tuple[str, ...]:
    """A builder's parameter names (read once: every explainer builds its method)."""
    return tuple(inspect.signature(builder).parameters)


def build_method(name: str, **params: Any) -> Method:
    """The method ``name`` with its parameters (e.g. ``epsilon=1e-6``); errors name the valid ones.

    Parameters
    ----------
    name : str
        A key of :data:`BUILDERS` (:func:`available_methods` lists them with their descriptions).
    **params
        Keyword arguments of that method's builder (``epsilon`` for ``lrp-epsilon``, ``n_steps`` and
        ``baseline`` for ``integrated-gradients``, ...); omitted ones take the builder's defaults.

    Returns
    -------
    Method
        A new method object on every call.

    Raises
    ------
    AttributionError
        For an unknown name (naming the closest valid one) or a parameter the builder does not take
        (listing those it does).
    """
    builder = BUILDERS.get(name)
    if builder is None:
        raise unknown_name("attribution method", name, BUILDERS, AttributionError)
    accepted = _parameters(builder)
    bad = set(params) - set(accepted)
    if bad:
        raise AttributionError(f"method {name!r} has no parameter {', '.join(sorted(bad))}; "
                          f"parameters: {', '.join(accepted) or 'none'}")
    for key, value in params.items():
        _check_type(name, key, value, _hints(builder).get(key))
    return builder(**params)


# the types a parameter's value is checked against; a parameter of another type (a baseline: a number or a sequence)
# is normalised by its builder, with an error of its own
_SIMPLE = {int, float, bool, str, type(None)}


@functools.cache
def _hints(builder: Callable[..., Method]) -> dict[str, Any]:
    """A builder's parameter types ({} where they cannot be read)."""
    try:
        return typing.get_type_hints(builder)
    except (NameError, TypeError):
        return {}


def _check_type(method: str, key: str, value: Any, hint: Any) -> None:
    """An :class:`AttributionError` where ``value`` is not of the builder's declared type for ``key`` (an integer
    is a float, numpy's scalars count, a bool is no number); a type other than the simple ones (:data:`_SIMPLE`)
    is left to the builder."""
    kinds = {typing.get_origin(k) or k for k in (typing.get_args(hint) if typing.get_origin(hint) in
                                                  (typing.Union, types.UnionType) else (hint,))}
    if hint is None or not kinds <= _SIMPLE:
        return
    numeric = {int: numbers.Integral, float: numbers.Real}  # numpy's scalars too; a float parameter takes an int
    fits = any(isinstance(value, numeric.get(k, k)) and not (k in numeric and isinstance(value, bool))
               for k in kinds)
    if not fits:
        wanted = " or ".join(sorted("None" if k is type(None) else k.__name__ for k in kinds))
        raise AttributionError(f"method {method!r}: parameter {key} must be {wanted}, got {value!r} "
                               f"({type(value).__name__})")


def takes_baseline(name: str) -> bool:
    """Whether the method ``name`` has a reference input (DeepLIFT, integrated gradients)."""
    builder = BUILDERS.get(name)
    return builder is not None and "baseline" in _parameters(builder)


def available_methods() -> dict[str, str]:
    """Method name -> one-line description and reference."""
    out = {}
    for name in BUILDERS:
        m = build_method(name)
        out[name] = f"{m.description} [{m.reference}]"
    return out
