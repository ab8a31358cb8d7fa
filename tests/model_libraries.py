"""The image classifiers of torchvision, timm and Hugging Face transformers, enumerated (never hand-picked)
and built small for CPU checks: every torchvision classification builder, the smallest timm model of each
architecture module (at most 60 M parameters), every class ``AutoModelForImageClassification`` maps, built
from its config with few layers and narrow widths. Each entry is built randomly initialised, float64, eval.

Sizes are found on the ``meta`` device (no memory, no arithmetic): a model is "built" with its parameters
and buffers there and run on a meta input, so shape errors show without the cost of a real forward pass.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

LIBRARIES = ("torchvision", "timm", "hf")
CLASSES = 5
MAX_TIMM_PARAMS = 60_000_000
# Square input sizes tried, smallest first; below 28 px the stride-32 networks have shrunk to 1x1 maps
# before their last stages, whose spatial operations would then go untested.
SIZES = (28, 32, 48, 56, 64, 75, 96, 112, 128, 160, 192, 224, 256, 288, 299, 320, 384, 448, 512, 600, 640)


def perturb(model: nn.Module, seed: int = 0, scale: float = 0.5, floor: float = 0.1) -> nn.Module:
    """Add seeded Gaussian noise to every floating parameter, in place.

    Parameters
    ----------
    model : the model (its parameters are changed)
    seed : the noise's seed; the parameters are visited in ``named_parameters`` order
    scale : the noise's std as a fraction of each tensor's std
    floor : the noise's std for constant tensors (zero-initialised heads and biases, norm weights of one,
        1e-6 layer scales), whose std would add nothing
    """
    generator = torch.Generator().manual_seed(seed)

    def noise(t: torch.Tensor) -> torch.Tensor:
        return torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.dtype)

    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.is_floating_point() and p.numel():
                constant = p.numel() == 1 or bool(p.max() == p.min())
                p.add_(noise(p) * (floor if constant else scale * float(p.std())))
        for name, b in model.named_buffers():  # BatchNorm starts at mean 0, var 1: folding it would be a no-op
            if name.endswith("running_mean"):
                b.add_(noise(b) * floor)
            elif name.endswith("running_var"):
                b.mul_(torch.exp(noise(b) * 2 * floor))
    return model


@dataclass(frozen=True)
class Entry:
    """One classifier: ``build()`` returns it seeded, float64, eval (a Hugging Face model wrapped in
    :class:`Logits`); ``input_shape`` is (C, H, W); ``params`` was counted at that size."""

    library: str
    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, int, int]
    params: int
    note: str = ""
    perturb: Callable[..., nn.Module] = perturb


@dataclass
class Listing:
    """A library's entries, and the models (or modules) not built, with why."""

    library: str
    entries: list[Entry] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


class Logits(nn.Module):
    """A Hugging Face classifier as a tensor-to-logits module; the raw model is ``.model``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.key = model.main_input_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(**{self.key: x})
        return out.logits if "logits" in out else out[0]  # PP-LCNet returns its logits as last_hidden_state


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Register every parameter and buffer on the meta device. Unlike ``torch.device("meta")`` this leaves
    the other tensors a constructor makes on the CPU, so constructors that read values (``.tolist()``,
    ``.item()``) still work."""
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def parameter(self, name, param):
        register_parameter(self, name, None if param is None else nn.Parameter(param.to("meta"), param.requires_grad))

    def buffer(self, name, tensor, persistent=True):
        register_buffer(self, name, None if tensor is None else tensor.to("meta"), persistent)

    nn.Module.register_parameter, nn.Module.register_buffer = parameter, buffer  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter, nn.Module.register_buffer = register_parameter, register_buffer  # type: ignore


def meta_build(make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` with its weights on the meta device: under :func:`on_meta`, or, for the constructors that run
    a trial forward pass (timm's hybrid ViTs measure their backbone), with every new tensor there."""
    try:
        with on_meta():
            return make()
    except RuntimeError as exc:
        if "meta" not in str(exc):
            raise
    with torch.device("meta"):
        return make()


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def _runs(make: Callable[[], nn.Module], shape: tuple[int, int, int], meta: bool = True) -> tuple[int, str]:
    """(parameters, "") when ``make`` builds a model whose forward maps (1, *shape) to (1, CLASSES), else
    (0, why not). On the meta device unless ``meta`` is False; a model that reads values (``.item()``)
    has to run for real."""
    try:
        model = (meta_build(make) if meta else make()).eval()
        with torch.device("meta") if meta else contextlib.nullcontext(), torch.no_grad():
            out = model(torch.empty(1, *shape) if meta else torch.rand(1, *shape))
        if tuple(out.shape) != (1, CLASSES):
            return 0, f"output shape {tuple(out.shape)}"
        return count(model), ""
    except Exception as exc:  # any failure means: not at this size
        return 0, _first_line(exc)


def _smallest(make: Callable[[int], nn.Module], channels: int, default: int, low: int = 0,
              meta: bool = True) -> tuple[int, int, str]:
    """(size, parameters, why not) for the smallest square size in ``SIZES`` (from ``low``, up to the
    default) at which ``make(size)`` runs, else the default size with the last failure."""
    why = ""
    for size in [s for s in SIZES if low <= s < default] + [default]:
        params, why = _runs(lambda: make(size), (channels, size, size), meta)
        if params:
            return size, params, ""
    return default, 0, why


def _seeded(make: Callable[[], nn.Module], seed: int = 0) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(seed)
        return make().double().eval()
    return build


def _accepts(cls: type, name: str) -> bool:
    return name in inspect.signature(cls.__init__).parameters


# --- torchvision ---------------------------------------------------------------------------------


def _torchvision() -> Listing:
    import torchvision.models as models

    listing = Listing("torchvision")
    for name in models.list_models(module=models):
        builder = models.get_model_builder(name)
        cls = type(meta_build(lambda: builder(num_classes=CLASSES)))
        # ViT and MaxViT fix their input size at construction; the others adapt (adaptive pooling)
        key = next((k for k in ("image_size", "input_size") if _accepts(cls, k)), None)

        def make(size: int, builder=builder, key=key) -> nn.Module:
            return builder(num_classes=CLASSES, **({key: size if key == "image_size" else (size, size)} if key else {}))

        size, params, why = _smallest(make, 3, 224)
        if not params:
            listing.skipped[name] = f"no input size runs: {why}"
            continue
        listing.entries.append(Entry("torchvision", name, _seeded(lambda make=make, size=size: make(size)),
                                     (3, size, size), params))
    return listing


# --- timm ----------------------------------------------------------------------------------------


def _timm() -> Listing:
    import timm

    listing = Listing("timm")
    for module in timm.list_modules():
        counts, why = {}, "holds no model"
        for name in timm.list_models(module=module):
            try:
                counts[name] = count(meta_build(lambda: timm.create_model(name, pretrained=False, num_classes=CLASSES)))
            except Exception as exc:  # a model that cannot be built with a fresh head
                why = f"no model builds with {CLASSES} classes ({name}: {_first_line(exc)})"
        small = {n: c for n, c in counts.items() if c <= MAX_TIMM_PARAMS}
        if not small:
            listing.skipped[module] = why if not counts else \
                f"every model has over {MAX_TIMM_PARAMS // 10**6} M parameters (smallest: {min(counts, key=counts.get)}, " \
                f"{min(counts.values()) / 1e6:.0f} M)"
            continue
        name = min(small, key=lambda n: (small[n], n))
        _add_timm(listing, module, name)
    return listing


def _add_timm(listing: Listing, module: str, name: str) -> None:
    import timm

    cfg = timm.get_pretrained_cfg(name)
    channels, height, _ = cfg.input_size if cfg else (3, 224, 224)
    low = (cfg.min_input_size or (0, 0, 0))[1] if cfg else 0
    cls = type(meta_build(lambda: timm.create_model(name, pretrained=False, num_classes=CLASSES)))
    key = "img_size" if _accepts(cls, "img_size") else None

    def make(size: int) -> nn.Module:
        return timm.create_model(name, pretrained=False, num_classes=CLASSES, **({key: size} if key else {}))

    size, params, why = _smallest(make, channels, height, low)
    if not params:
        listing.skipped[f"{module}/{name}"] = f"no input size runs on meta: {why}"
        return
    listing.entries.append(Entry("timm", name, _seeded(lambda: make(size)), (channels, size, size), params,
                                 note=f"module {module}"))


# --- Hugging Face transformers -------------------------------------------------------------------


def _heads(v):
    return [1] * len(v) if isinstance(v, (list, tuple)) else min(v, 2)


def _narrow(v):
    """A width divided by 8, a multiple of 8 (lists element-wise)."""
    return [_narrow(u) for u in v] if isinstance(v, (list, tuple)) else max(8, 8 * round(v / 64))


def _shallow(v):
    return [1] * len(v) if isinstance(v, (list, tuple)) else min(v, 2)


# Config keys the configs name their sizes by, in the order they are shrunk (heads before the widths they
# must divide); a shrink that breaks the model is undone.
SHRINK: tuple[tuple[tuple[str, ...], Callable], ...] = (
    (("num_attention_heads", "num_heads", "n_head", "num_self_attention_heads"), _heads),
    (("num_cross_attention_heads",), lambda v: 1),  # Perceiver: its input channels (261, 322) are odd
    (("num_groups",), lambda v: min(v, 4)),  # BiT's GroupNorm: 32 groups would not divide the narrow widths
    (("hidden_size", "intermediate_size", "embed_dim", "embed_dims", "hidden_sizes", "neck_hidden_sizes",
      "embedding_size", "hidden_dim", "d_model", "d_latents", "n_embd", "stem_out_channels", "base_attn_unit_dims",
      "class_expand", "decoder_hidden_size", "aspp_out_channels", "auxiliary_channels", "projection_dim",
      "pooler_output_size", "stage_in_channels", "stage_mid_channels", "stage_out_channels"), _narrow),
    (("width_coefficient", "depth_multiplier", "width_multiplier", "scale"), lambda v: min(v, 0.25)),
    (("num_hidden_layers", "n_layer", "num_self_attends_per_block", "depths", "depth", "num_block_repeats",
      "n_attn_blocks", "stage_num_blocks", "stage_numb_of_layers"), _shallow),
    (("depth_coefficient",), lambda v: min(v, 0.1)),
    (("num_latents",), lambda v: min(v, 16)),
    (("window_size",), lambda v: min(v, 2)),  # Swin's last stage must hold a window: 7 would need 224 px
)


def _numbers(value) -> bool:
    """Whether ``value`` is a number or a flat list of numbers (not a flag, not nested)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return bool(items) and all(isinstance(u, (int, float)) and not isinstance(u, bool) for u in items)


def _shrinks(config) -> dict[tuple[str, ...], object]:
    """{path: smaller value} for the size settings of ``config`` and its sub-configs, in :data:`SHRINK` order."""
    out = {}
    for keys, smaller in SHRINK:
        for path, value in _config_keys(config):
            if path[-1] in keys and _numbers(value):
                new = smaller(value)
                if new != (list(value) if isinstance(value, (list, tuple)) else value):
                    out[path] = new
    return out


def _config_keys(config, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """(path, value) of every setting of ``config`` and its sub-configs (CLIP's ``vision_config``, ...)."""
    from transformers import PretrainedConfig

    for key, value in vars(config).items():
        if isinstance(value, PretrainedConfig):
            yield from _config_keys(value, path + (key,))
        elif not key.startswith("_"):
            yield path + (key,), value


def _nested(edits: dict[tuple[str, ...], object]) -> dict:
    out: dict = {}
    for path, value in edits.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def _image_size(config) -> tuple[tuple[str, ...] | None, int, int]:
    """(path of the image size setting or None, its value, input channels)."""
    found = dict(_config_keys(config))
    path = next((p for p in sorted(found, key=len) if p[-1] == "image_size"), None)
    channels = next((v for p, v in sorted(found.items(), key=lambda i: len(i[0])) if p[-1] == "num_channels"), 3)
    size = found[path] if path else 224
    return path, int(size[0] if isinstance(size, (list, tuple)) else size), int(channels)


def _hf_entry(model_type: str, class_name: str) -> Entry:
    """The classifier ``class_name`` built from its config made small, or raises ValueError saying why not."""
    import transformers
    from transformers import CONFIG_MAPPING

    config_class, model_class = CONFIG_MAPPING[model_type], getattr(transformers, class_name)
    if "ids" in model_class.main_input_name:
        raise ValueError(f"its input is token ids ({model_class.main_input_name}), not pixels")
    default = config_class()
    image_key, default_size, channels = _image_size(default)
    as_list = image_key is not None and isinstance(dict(_config_keys(default))[image_key], (list, tuple))

    def make(edits: dict, size: int = default_size) -> nn.Module:
        if image_key:
            edits = {**edits, image_key: [size, size] if as_list else size}
        return Logits(model_class(config_class(**_nested(edits), num_labels=CLASSES)))

    shrinks = _shrinks(default)
    params, why = _runs(lambda: make(shrinks), (channels, default_size, default_size))
    meta = "meta" not in why  # a model that reads values on the way (Perceiver's .item()) is checked for real
    if not meta:
        params, why = _runs(lambda: make(shrinks), (channels, default_size, default_size), meta)
    edits = shrinks
    if not params:  # some settings must agree (depths and per-layer lists): keep each shrink that still runs
        edits = {}
        for path, value in shrinks.items():
            if _runs(lambda: make({**edits, path: value}), (channels, default_size, default_size), meta)[0]:
                edits[path] = value
    size, params, why = _smallest(lambda s: make(edits, s), channels, default_size, meta=meta)
    if not params:
        raise ValueError(f"no config runs on {channels}x{default_size}x{default_size}: {why}")
    note = f"{len(edits)}/{len(shrinks)} shrinks kept" if len(edits) < len(shrinks) else ""
    return Entry("hf", class_name, _seeded(lambda: make(edits, size)), (channels, size, size), params, note=note)


def _hf() -> Listing:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES

    listing = Listing("hf")
    for model_type, names in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES.items():
        for class_name in (names,) if isinstance(names, str) else names:
            try:
                listing.entries.append(_hf_entry(model_type, class_name))
            except Exception as exc:  # a class that cannot be built from its config alone
                listing.skipped[class_name] = _first_line(exc) if not isinstance(exc, ValueError) else str(exc)[:300]
    return listing


def enumerate_models(library: str) -> Listing:
    """The classifiers of ``library`` (one of :data:`LIBRARIES`); empty, with the reason, when it is absent."""
    if library not in LIBRARIES:
        raise ValueError(f"unknown library {library!r}; valid: {', '.join(LIBRARIES)}")
    module = {"torchvision": "torchvision", "timm": "timm", "hf": "transformers"}[library]
    try:
        __import__(module)
    except ImportError as exc:
        return Listing(library, skipped={library: f"{module} is not installed ({exc})"})
    return {"torchvision": _torchvision, "timm": _timm, "hf": _hf}[library]()
