"""What each attribution method is, in words: its description, the paper it follows, its family and its references.

The catalog holds no rule and imports no torch, so that listing the methods (``attribution-audit methods``, the
documentation) is instant; :mod:`attributions.methods` builds each method's rules and engine and takes its words from
here (a test checks that both name the same methods).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The report's method groups, in drawing order: Sixt et al.'s z+ family collapses by construction.
ZPLUS, CAM, ATTENTION, CONTROLS = "LRP z+ family", "class activation maps", "attention", "controls"
FAMILIES = ("gradient-based", "DeepLIFT", ZPLUS, "other LRP", CAM, ATTENTION, CONTROLS)


@dataclass(frozen=True)
class About:
    """A method in words.

    Parameters
    ----------
    description : str
        One line on what it computes (:func:`attributions.methods.available_methods`).
    reference : str
        The paper it follows, in words.
    family : str, default "gradient-based"
        One of :data:`FAMILIES`, the group the report draws and colours the method in.
    cite : tuple of str, default ()
        BibTeX keys of the method's references (``reports.references``).
    """

    description: str
    reference: str
    family: str = "gradient-based"
    cite: tuple[str, ...] = ()


ABOUT: dict[str, About] = {
    "gradient": About(
        "plain input gradient (saliency)",
        "Simonyan et al. 2014",
        cite=("simonyan2014",)),
    "input-x-gradient": About(
        "gradient times input",
        "Shrikumar et al. 2016",
        cite=("shrikumar2016",)),
    "integrated-gradients": About(
        "integrated gradients from a baseline input (zero by default; captum)",
        "Sundararajan et al. 2017 (ICML)",
        cite=("sundararajan2017",)),
    "smoothgrad": About(
        "gradient averaged over Gaussian-noised inputs (captum NoiseTunnel); noise is sigma as a fraction of "
        "the input range",
        "Smilkov et al. 2017",
        cite=("smilkov2017",)),
    "smoothgrad-ig": About(
        "integrated gradients averaged over Gaussian-noised inputs (captum NoiseTunnel over "
        "IntegratedGradients); noise is sigma as a fraction of the input range",
        "Smilkov et al. 2017; Adebayo et al. 2018",
        cite=("smilkov2017", "sundararajan2017")),
    "guided-backprop": About(
        "gradient with negative signals removed at every ReLU",
        "Springenberg et al. 2015",
        cite=("springenberg2015",)),
    "deconvnet": About(
        "ReLU applied to the backward signal, forward mask ignored",
        "Zeiler & Fergus 2014",
        cite=("zeiler2014",)),
    "rectgrad": About(
        "RectGrad: at every ReLU the gradient passes only where activation x gradient exceeds its q-th "
        "percentile over the layer, per sample",
        "Kim et al. 2019",
        cite=("kim2019",)),
    "patternnet": About(
        "PatternNet: the signal estimate, patterns A in place of the weights through every linear layer "
        "(fitted on the explained images, refitted when the weights change)",
        "Kindermans et al. 2018 (ICLR)",
        cite=("kindermans2018",)),
    "patternattribution": About(
        "PatternAttribution: W * A through every linear layer, A the layer's signal pattern (fitted as "
        "PatternNet's)",
        "Kindermans et al. 2018 (ICLR)",
        family="other LRP",
        cite=("kindermans2018",)),
    "lrp-z": About(
        "LRP-z: relevance in proportion to each input's contribution z_ij",
        "Bach et al. 2015, On Pixel-Wise Explanations by LRP (PLoS ONE)",
        family="other LRP",
        cite=("bach2015",)),
    "lrp-epsilon": About(
        "LRP-epsilon: the z rule with a stabiliser epsilon",
        "Bach et al. 2015, On Pixel-Wise Explanations by LRP (PLoS ONE)",
        family="other LRP",
        cite=("bach2015",)),
    "cp-lrp": About(
        "CP-LRP for transformers: LRP-0 on linear layers, attention weights (and every gate) held constant,"
        " the identity rule through activations, the LN rule through norms",
        "Ali et al. 2022 (ICML)",
        family="other LRP",
        cite=("ali2022",)),
    "attnlrp": About(
        "AttnLRP: LRP-0 on linear layers, both products of attention split in halves, AttnLRP's softmax "
        "rule, the identity rule through activations, the LN rule through norms",
        "Achtibat et al. 2024 (ICML)",
        family="other LRP",
        cite=("achtibat2024",)),
    "lrp-zplus": About(
        "LRP-z+: positive contributions only, bias ignored",
        "Montavon et al. 2019, Layer-Wise Relevance Propagation: An Overview",
        family=ZPLUS,
        cite=("montavon2019",)),
    "lrp-alpha1beta0": About(
        "LRP-alpha1beta0: positive contributions x1, negative x0",
        "Bach et al. 2015, On Pixel-Wise Explanations by LRP (PLoS ONE)",
        family=ZPLUS,
        cite=("bach2015",)),
    "lrp-alpha2beta1": About(
        "LRP-alpha2beta1: positive contributions x2, negative x1",
        "Bach et al. 2015, On Pixel-Wise Explanations by LRP (PLoS ONE)",
        family="other LRP",
        cite=("bach2015",)),
    "lrp-alpha5beta4": About(
        "LRP-alpha5beta4: positive contributions x5, negative x4",
        "Bach et al. 2015, On Pixel-Wise Explanations by LRP (PLoS ONE)",
        family="other LRP",
        cite=("bach2015",)),
    "lrp-gamma": About(
        "LRP-gamma: positive weights favoured by gamma",
        "Montavon et al. 2019, Layer-Wise Relevance Propagation: An Overview",
        family="other LRP",
        cite=("montavon2019",)),
    "lrp-epsilon-plus": About(
        "LRP-epsilon on dense layers, z+ on convolutions",
        "Kohlbrenner et al. 2020, Towards Best Practice in Explaining Neural Network Decisions with LRP",
        family=ZPLUS,
        cite=("kohlbrenner2020",)),
    "lrp-epsilon-alpha2beta1": About(
        "LRP-epsilon on dense layers, alpha2beta1 on convolutions",
        "Kohlbrenner et al. 2020, Towards Best Practice in Explaining Neural Network Decisions with LRP",
        family="other LRP",
        cite=("kohlbrenner2020",)),
    "lrp-cmp-alpha1beta0": About(
        "LRP-CMP: epsilon on dense layers, alpha1beta0 (bias kept) on convolutions (iNNvestigate's sequential"
        " preset A)",
        "Kohlbrenner et al. 2020, Towards Best Practice in Explaining Neural Network Decisions with LRP",
        family=ZPLUS,
        cite=("kohlbrenner2020", "alber2019")),
    "chefer-lrp": About(
        "Chefer et al.'s LRP for transformers: alpha1beta0 (no bias) on linear layers, zB with each image's "
        "bounds on the first, identity through norms, activations and softmax, halves through both attention "
        "products, normalised residual splits; from a one-hot relevance",
        "Chefer, Gur & Wolf 2021 (CVPR)",
        family=ZPLUS,
        cite=("chefer2021", "montavon2017")),
    "deep-taylor": About(
        "Deep Taylor decomposition: z+ on hidden layers, zB on the input layer",
        "Montavon et al. 2017, Explaining Nonlinear Classification Decisions with Deep Taylor Decomposition",
        family=ZPLUS,
        cite=("montavon2017",)),
    "excitation-backprop": About(
        "Excitation Backprop: marginal winning probabilities via positive weights, starting from a one-hot "
        "probability",
        "Zhang et al. 2016 (ECCV)",
        family=ZPLUS,
        cite=("zhang2016",)),
    "deeplift": About(
        "DeepLIFT Rescale from a reference input (zero by default, as captum's DeepLift)",
        "Shrikumar et al. 2017 (ICML)",
        family="DeepLIFT",
        cite=("shrikumar2017",)),
    "deeplift-ablation": About(
        "DeepLIFT without positive/negative intermixing (non-negative chain)",
        "Sixt, Granz, Landgraf 2020, When Explanations Lie (ICML)",
        family="DeepLIFT",
        cite=("shrikumar2017", "sixt2020")),
    "deeplift-revealcancel": About(
        "DeepLIFT RevealCancel: at each ReLU after a dense or conv layer the positive and negative parts of "
        "the difference get their own multipliers (Rescale elsewhere)",
        "Shrikumar et al. 2017 (ICML)",
        family="DeepLIFT",
        cite=("shrikumar2017",)),
    "grad-cam": About(
        "Grad-CAM: a layer's activations weighted by their spatially averaged gradient, summed over channels,"
        " upsampled to the input (every channel carries the map)",
        "Selvaraju et al. 2017 (ICCV)",
        family=CAM,
        cite=("selvaraju2017",)),
    "guided-grad-cam": About(
        "Guided Grad-CAM: guided backprop times the upsampled ReLU'd Grad-CAM map",
        "Selvaraju et al. 2017 (ICCV)",
        family=CAM,
        cite=("selvaraju2017", "springenberg2015")),
    "vit-grad-cam": About(
        "Grad-CAM on a vision transformer's token activations (by default the last block's first norm, as "
        "pytorch-grad-cam), laid out on the patch grid",
        "Selvaraju et al. 2017; Gildenblat 2021",
        family=CAM,
        cite=("selvaraju2017", "gildenblat2021")),
    "attention-rollout": About(
        "attention rollout: heads fused, (A + I) row-normalised, multiplied through the blocks; the class "
        "token's row (class-agnostic)",
        "Abnar & Zuidema 2020 (ACL)",
        family=ATTENTION,
        cite=("abnar2020",)),
    "generic-attention": About(
        "generic attention explainability: R <- R + mean_h[(grad A * A)+] R from R = I, the class token's row",
        "Chefer, Gur & Wolf 2021 (ICCV)",
        family=ATTENTION,
        cite=("chefer2021generic",)),
    "transformer-attribution": About(
        "Chefer et al.'s transformer attribution: C <- (I + mean_h[(grad A * R_A)+]) C from C = I, R_A the "
        "chefer-lrp relevance at each block's attention weights; the class token's row",
        "Chefer, Gur & Wolf 2021 (CVPR)",
        family=ATTENTION,
        cite=("chefer2021",)),
    "attention-grad-cam": About(
        "Grad-CAM on the last block's attention: the class token's attention per head weighted by its mean "
        "gradient (Chefer et al.'s baseline)",
        "Chefer, Gur & Wolf 2021 (CVPR)",
        family=ATTENTION,
        cite=("chefer2021", "selvaraju2017")),
    "edge": About(
        "control: Sobel gradient magnitude of the input, model-independent",
        "Adebayo et al. 2018 (NeurIPS)",
        family=CONTROLS,
        cite=("adebayo2018",)),
    "random": About(
        "control: seeded Gaussian noise, a fresh draw per call",
        "Adebayo et al. 2018 (NeurIPS)",
        family=CONTROLS,
        cite=("adebayo2018",)),
}


def family(method: str) -> str:
    """The family a method is drawn in (``controls`` for a name the catalog does not know)."""
    about = ABOUT.get(method)
    return about.family if about is not None else CONTROLS


def members(name: str) -> list[str]:
    """The methods of family ``name``, in catalog order."""
    return [m for m, about in ABOUT.items() if about.family == name]


def by_family(methods: Iterable[str]) -> dict[str, list[str]]:
    """``methods`` grouped by family, families in :data:`FAMILIES` order, methods in catalog order; families
    without a method are left out."""
    order = {m: i for i, m in enumerate(ABOUT)}
    groups: dict[str, list[str]] = {f: [] for f in FAMILIES}
    for m in sorted(dict.fromkeys(methods), key=lambda m: order.get(m, len(order))):
        groups[family(m)].append(m)
    return {f: ms for f, ms in groups.items() if ms}
