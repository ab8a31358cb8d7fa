"""How a method turns inputs into maps: the rule chain, or a captum method run over the graph.

Every method carries one engine object; :meth:`Explainer.maps_for_targets` hands it the work,
so adding a method outside the rule engine adds an engine class, not a branch.
"""
from __future__ import annotations

import contextlib
import zlib
from typing import Any

import torch
from captum.attr import IntegratedGradients, NoiseTunnel

from attributions import memory
from attributions.explaining import Explaining
from attributions.shared_pass import SharedPass


class Engine:
    """Computes maps for K target specifications: ``maps(ex, x, targets, shared) -> (K, B, ...)``.

    ``chain``: whether the maps come from the rule chain (then ``propagate`` can follow it).
    ``needs_graph``: whether the engine runs the model (controls do not). ``product``: whether the maps
    are a row of a product of non-negative per-block operators, which ``operators`` returns (attention
    rollout; CSC follows that product). ``chunked``: whether the
    explainer hands it images in chunks that fit the memory budget; ``passes``: how many sets of backward
    signals, each as large as a forward pass's values, it holds at once per target (what a chunk is sized by).
    """

    chain = False
    needs_graph = True
    chunked = False
    passes = 1
    product = False  # whether the maps are a row of a product of per-block operators (``operators``)
    times_input = False  # whether the maps are (x - baseline) times a model-dependent factor
    rectifies = False  # whether a ReLU or threshold acts on the backward signal (Guided Grad-CAM's guided factor)

    def maps(self, ex: Explaining, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
             **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError

    def prepare(self, ex: Explaining, x: torch.Tensor) -> None:
        """Make what the maps of the whole batch ``x`` (B, ...) depend on besides the weights, before any chunk
        of it is explained (PatternNet's patterns); nothing for most engines."""

    def operators(self, ex: Explaining, x: torch.Tensor, targets: list[Any]) -> tuple[list[str], list[torch.Tensor], Any]:
        """For a ``product`` engine: (the nodes of the blocks, each block's operator (K, B, T, T), the token
        layout), the maps being a row of the operators' product."""
        raise NotImplementedError(f"{type(self).__name__} is not a product of per-block operators")

    def fits(self, ex: Explaining, x: torch.Tensor) -> str | None:
        """Why the method cannot explain the explainer's model on inputs like ``x`` (B, ...) (a Grad-CAM
        without a feature map, attention maps of a CNN), or None where it can."""
        return None

    def conventions(self, ex: Explaining, x: torch.Tensor) -> dict[str, Any]:
        """The choices this engine makes on the explainer's model for inputs like ``x`` (B, ...) that its
        parameters leave open (Grad-CAM's layer), for the run's manifest; {} for none."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in vars(self).items() if not k.startswith('_'))})"


class RuleChain(Engine):
    """The method's rule table, run by the explainer's reverse-mode interpreter."""

    chain = True
    chunked = True

    def maps(self, ex: Explaining, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
             **kwargs: Any) -> torch.Tensor:
        return ex.chain_maps(x, targets, shared)


CHAIN = RuleChain()


class IntegratedGradientsEngine(Engine):
    """captum's IntegratedGradients from the method's baseline over the graph's forward (captum's default
    Gauss-Legendre quadrature, ``n_steps`` points). Under a memory budget the explainer hands it images in
    chunks of which one pass fits, and captum's internal batch takes as many path points as fit (never fewer
    than the images: captum refuses that)."""

    times_input = True  # (x - baseline) times the path-averaged gradient
    chunked = True

    def __init__(self, n_steps: int = 50):
        self.n_steps = n_steps

    def maps(self, ex: Explaining, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
             **kwargs: Any) -> torch.Tensor:
        logits = ex.forward(x).detach()
        n_steps = kwargs.pop("n_steps", self.n_steps)
        ig = IntegratedGradients(ex.forward)
        if memory.budget() is not None:  # steps x images in chunks that fit
            kwargs.setdefault("internal_batch_size", memory.fitting(n_steps * len(x), lambda: 2 * ex.bytes_per_image(x)))
        kwargs.setdefault("baselines", ex.baseline_like(x))
        return torch.stack([ig.attribute(x, target=ex.targets(logits, t), n_steps=n_steps, **kwargs).detach()
                            for t in targets])


class SmoothGradEngine(Engine):
    """captum's NoiseTunnel (smoothgrad) around a base method: the plain gradient (SmoothGrad,
    Smilkov et al. 2017), or integrated gradients from the method's baseline with ``n_steps`` steps
    (SmoothGrad over IG, as Adebayo et al. 2018 audit it). ``noise`` is sigma as a fraction of each image's range
    (Smilkov et al.'s noise level); every noisy copy is explained for the same target. ``seed``: each image's noise
    is drawn with the global generator seeded at :meth:`image_seed` (the seed and the image's values; the caller's
    generator restored after), so an image gets the same noise whatever images it is explained beside, on every
    model, stage, twin, block and target, and a map's similarity to itself is 1, the ceiling the randomization
    checks read against; None draws from the global generator as it goes, for the whole batch (captum's own way)."""

    BASES = ("gradient", "integrated-gradients")
    chunked = True  # images in chunks of which one pass fits; the noisy copies (and IG's steps) batched within

    def __init__(self, noise: float = 0.15, samples: int = 50, base: str = "gradient", n_steps: int = 50,
                 seed: int | None = 0):
        if base not in self.BASES:
            raise ValueError(f"SmoothGrad's base must be one of {', '.join(self.BASES)}, got {base!r}")
        self.noise, self.samples, self.base, self.n_steps, self.seed = noise, samples, base, n_steps, seed
        self.times_input = base == "integrated-gradients"

    def maps(self, ex: Explaining, x: torch.Tensor, targets: list[Any], shared: SharedPass | None = None,
             **kwargs: Any) -> torch.Tensor:
        logits = ex.forward(x).detach()
        if self.base == "gradient":
            tunnel = NoiseTunnel(ex.sibling("gradient"))
            steps, extra = 1, {}
        else:
            tunnel = NoiseTunnel(IntegratedGradients(ex.forward))
            steps, extra = self.n_steps, {"n_steps": self.n_steps}
        # seeded: one image per call, its own noise; else the batch at once, as captum draws it
        parts = [slice(i, i + 1) for i in range(len(x))] if self.seed is not None else [slice(0, len(x))]
        # the passes (noisy copies x IG's steps x images) in batches that fit the memory budget: whole noisy
        # copies of the call's images where they fit, else one copy at a time with IG's steps in internal batches,
        # which captum keeps no smaller than the copy's images (one pass of the images fits: the explainer chunks)
        size = parts[0].stop - parts[0].start
        fit = memory.fitting(self.samples * steps * size, lambda: 2 * ex.bytes_per_image(x))
        per_sample = max(1, min(self.samples, fit // (steps * size)))
        batch = None if per_sample >= self.samples else per_sample
        if steps > 1 and memory.budget() is not None:
            extra["internal_batch_size"] = max(per_sample * size, min(fit, per_sample * steps * size))
        maps = []
        for t in targets:
            classes = ex.targets(logits, t)
            out = []
            for part in parts:
                xs = x[part]
                sigma = self.noise * float(xs.max() - xs.min())
                base = {"baselines": ex.baseline_like(xs)} if steps > 1 else {}
                with self._noise(xs):
                    out.append(tunnel.attribute(xs, nt_type="smoothgrad", nt_samples=self.samples, stdevs=sigma,
                                                nt_samples_batch_size=batch, target=classes[part],
                                                **(extra | base)).detach())
            maps.append(torch.cat(out))
        return torch.stack(maps)

    def image_seed(self, image: torch.Tensor) -> int:
        """The seed of one image's noise: the engine's :attr:`seed` and the image's values (C, H, W) relative to its
        range on 256 levels, through CRC-32. Relative, so that the image shifted by a constant (the input-invariance
        check) or scaled gets the same noise, as it gets the same sigma; on 256 levels, so that the rounding of the
        shift does not change them (an 8-bit image's values sit on the levels)."""
        values = image.detach().to("cpu", torch.float64)
        span = float(values.max() - values.min())
        levels = ((values - values.min()) * (255 / span if span > 0 else 0.0)).round().to(torch.uint8)
        data = str(tuple(image.shape)).encode() + levels.contiguous().numpy().tobytes()
        return zlib.crc32(data, zlib.crc32(str(self.seed).encode()))

    def _noise(self, x: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
        """Where the noise of one call on ``x`` (one image, (1, C, H, W), where seeded) is drawn: the global
        generator seeded at the image's :meth:`image_seed` and restored after (on ``x``'s device too), or as it is
        (``seed`` None)."""
        if self.seed is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []))
        torch.manual_seed(self.image_seed(x[0]))
        return stack
