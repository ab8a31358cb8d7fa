"""The image classifiers of torchvision, timm and Hugging Face transformers, enumerated (never hand-picked)
and built small for CPU checks: every torchvision classification builder (:func:`distinct` keeps the
smallest of each structure), the smallest timm model of each architecture module (at most 60 M
parameters), every class ``AutoModelForImageClassification`` maps, built from its config with few layers
and narrow widths. Each entry is built randomly initialised, float64, eval.

Sizes are found on the ``meta`` device (no memory, no arithmetic): a model is "built" with its parameters
and buffers there and run on a meta input, so shape errors show without the cost of a real forward pass.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import multiprocessing
import signal
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.utils._python_dispatch
import torch.utils._pytree
from torch import nn

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkProcess

    from transformers import PretrainedConfig

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
    :class:`Logits`); ``input_shape`` is (C, H, W); ``params`` was counted at that size; ``structure``: what
    :func:`distinct` compares, ``ops``: what :func:`covering` does (empty: not recorded); ``volume``: the
    elements its forward pass writes on one image, its cost."""

    library: str
    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, int, int]
    params: int
    note: str = ""
    perturb: Callable[..., nn.Module] = perturb
    structure: frozenset[str] = frozenset()
    ops: frozenset[str] = frozenset()
    volume: int = 0


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
        self.key = cast(str, model.main_input_name)  # a plain attribute: torch types it Tensor | Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(**{self.key: x})
        logits: torch.Tensor = out.logits if "logits" in out else out[0]  # PP-LCNet returns its logits as last_hidden_state
        return logits


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Register every parameter and buffer on the meta device. Unlike ``torch.device("meta")`` this leaves
    the other tensors a constructor makes on the CPU, so constructors that read values (``.tolist()``,
    ``.item()``) still work."""
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def parameter(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register_parameter(self, name, None if param is None else nn.Parameter(param.to("meta"), param.requires_grad))

    def buffer(self: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        register_buffer(self, name, None if tensor is None else tensor.to("meta"), persistent)

    nn.Module.register_parameter, nn.Module.register_buffer = parameter, buffer  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter, nn.Module.register_buffer = register_parameter, register_buffer  # type: ignore[method-assign]


# in-place ops that change a tensor's shape or identity: these must run even on the meta device
_RESHAPING = {"resize_", "resize_as_", "squeeze_", "unsqueeze_", "t_", "transpose_", "swapdims_", "swapaxes_",
              "as_strided_", "set_", "requires_grad_", "share_memory_"}


class _NoMetaWrites(torch.overrides.TorchFunctionMode):
    """In-place writes into meta tensors return at once: a weight initialiser (``trunc_normal_``, ``uniform_``)
    on the meta device otherwise runs its reference kernels in Python, most of the enumeration's time."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.endswith("__") and name not in _RESHAPING:
            written = args[0] if args else next(iter(kwargs.values()), None)  # nn.init's take tensor= by name
            if isinstance(written, torch.Tensor) and written.is_meta:
                return written
        return func(*args, **kwargs)


def meta_build(make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` with its weights on the meta device: under :func:`on_meta`, or, for the constructors that run
    a trial forward pass (timm's hybrid ViTs measure their backbone), with every new tensor there. Values
    written into meta tensors are not computed (:class:`_NoMetaWrites`): only shapes count here."""
    try:
        with on_meta(), _NoMetaWrites():
            return make()
    except RuntimeError as exc:
        if "meta" not in str(exc):
            raise
    with torch.device("meta"), _NoMetaWrites():
        return make()


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def first_line(exc: BaseException, typed: bool = True) -> str:
    """An error's first line (300 characters at most), after its type unless ``typed`` is False."""
    line = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {line}" if typed else line


@dataclass(frozen=True)
class Probe:
    """What one forward pass of a model at one input size showed: its parameters (0: it did not run, ``why``
    says why), the ops it called (:func:`op_kinds`) and its cost (the elements its ops wrote)."""

    params: int
    why: str = ""
    ops: frozenset[str] = frozenset()
    volume: int = 0


def op_kinds(func: torch._ops.OpOverload, args: tuple[Any, ...]) -> str:
    """The name an op is covered under: the aten overload, a convolution's grouping, transposition and
    dilation with it (the engine's convolution rules treat those apart)."""
    name = str(func)
    # aten.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if func._overloadpacket is torch.ops.aten.convolution:
        groups = args[8]
        name += ("/depthwise" if groups == args[0].shape[1] else "/grouped") if groups > 1 else ""
        name += "/transposed" if args[6] else ""
        name += "/dilated" if any(d > 1 for d in args[5]) else ""
    return name


class _Record(torch.utils._python_dispatch.TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The op kinds a forward pass calls, below autograd, and the elements their outputs hold."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: set[str] = set()
        self.volume = 0

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops.add(op_kinds(func, args))
        self.volume += sum(t.numel() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def _runs(make: Callable[[], nn.Module], shape: tuple[int, int, int], meta: bool = True) -> Probe:
    """The probe of ``make()`` on one (1, *shape) input: its parameters when its forward maps it to
    (1, CLASSES), else 0 and why not. On the meta device unless ``meta`` is False; a model that reads values
    (``.item()``) has to run for real."""
    try:
        model = (meta_build(make) if meta else make()).eval()
        record = _Record()
        with torch.device("meta") if meta else contextlib.nullcontext(), torch.no_grad(), record:
            out = model(torch.empty(1, *shape) if meta else torch.rand(1, *shape))
        if tuple(out.shape) != (1, CLASSES):
            return Probe(0, f"output shape {tuple(out.shape)}")
        return Probe(count(model), "", frozenset(record.ops), record.volume)
    except Exception as exc:  # any failure means: not at this size
        return Probe(0, first_line(exc))


def _smallest(make: Callable[[int], nn.Module], channels: int, default: int, low: int = 0,
              meta: bool = True) -> tuple[int, Probe]:
    """(size, probe) for the smallest square size in ``SIZES`` (from ``low``, up to the default) at which
    ``make(size)`` runs, else the default size and the last failure's probe."""
    probe = Probe(0)
    for size in [s for s in SIZES if low <= s < default] + [default]:
        probe = _runs(lambda: make(size), (channels, size, size), meta)
        if probe.params:
            return size, probe
    return default, probe


def _seeded(make: Callable[[], nn.Module], seed: int = 0) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(seed)
        return make().double().eval()
    return build


def structure(model: nn.Module) -> frozenset[str]:
    """The module classes ``model`` is made of, a convolution's grouping (depthwise, grouped) and dilation
    named with it: what sets the ops the engine sees, not the depth or the widths."""
    kinds = set()
    for module in model.modules():
        kind = type(module).__qualname__
        if isinstance(module, nn.modules.conv._ConvNd):
            kind += ("/depthwise" if module.groups == module.in_channels else "/grouped") if module.groups > 1 else ""
            kind += "/dilated" if any(d > 1 for d in module.dilation) else ""
        kinds.add(kind)
    return frozenset(kinds)


def _accepts(cls: type[Any], name: str) -> bool:
    return name in inspect.signature(cls.__init__).parameters


# --- torchvision ---------------------------------------------------------------------------------


# A window every stage's feature map is partitioned into (MaxViT's): the builder fixes it (7), and with it the
# input size (a multiple of 32 x 7 = 224 px). The class is built with the builder's other settings and a 2 x 2
# window, which runs at 64 px with the same modules and ops, an eighth of the cost.
WINDOW = "partition_size"
SMALLEST_WINDOW = 2


def _settings(builder: Callable[..., nn.Module], cls: type[nn.Module]) -> dict[str, Any]:
    """The arguments ``builder`` constructs ``cls`` with (recorded on the meta device), but the classes count and
    the input size, which the listing sets."""
    seen: dict[str, Any] = {}
    original = cls.__init__

    def record(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        seen.update(inspect.signature(original).bind(self, *args, **kwargs).arguments)
        original(self, *args, **kwargs)

    cls.__init__ = record  # type: ignore[method-assign]
    try:
        meta_build(lambda: builder(num_classes=CLASSES))
    finally:
        cls.__init__ = original  # type: ignore[method-assign]
    return {k: v for k, v in seen.items() if k not in ("self", "num_classes", "input_size", "image_size")}


def _torchvision() -> Listing:
    import torchvision.models as models

    listing = Listing("torchvision")
    for name in models.list_models(module=models):
        builder = models.get_model_builder(name)
        default = meta_build(lambda: builder(num_classes=CLASSES))
        cls = type(default)
        # ViT and MaxViT fix their input size at construction; the others adapt (adaptive pooling)
        key = next((k for k in ("image_size", "input_size") if _accepts(cls, k)), None)
        note = f"module {builder.__module__.rsplit('.', 1)[-1]}"
        if _accepts(cls, WINDOW):  # the class built with the builder's settings and the smallest window
            builder = partial(cls, **{**_settings(builder, cls), WINDOW: SMALLEST_WINDOW})
            note += f", {WINDOW}={SMALLEST_WINDOW}"

        def make(size: int, builder: Callable[..., nn.Module] = builder, key: str | None = key) -> nn.Module:
            return builder(num_classes=CLASSES, **({key: size if key == "image_size" else (size, size)} if key else {}))

        size, probe = _smallest(make, 3, 224)
        if not probe.params:
            listing.skipped[name] = f"no input size runs: {probe.why}"
            continue
        build = cast(Callable[[], nn.Module], lambda make=make, size=size: make(size))  # mypy cannot infer a lambda's defaults
        listing.entries.append(Entry("torchvision", name, _seeded(build),
                                     (3, size, size), probe.params, note=note,
                                     structure=structure(default), ops=probe.ops, volume=probe.volume))
    return listing


# --- timm ----------------------------------------------------------------------------------------


def _timm() -> Listing:
    import timm

    listing = Listing("timm")
    modules = timm.list_modules()
    # every model is built once on meta to count its parameters: the enumeration's cost, shared by two workers
    # one thread each: a forked child that enters the parent's OpenMP pool waits on it for ever
    with multiprocessing.get_context("fork").Pool(2, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        counted = pool.map(_timm_counts, modules, chunksize=1)
    for module, (counts, why) in zip(modules, counted):
        small = {n: c for n, c in counts.items() if c <= MAX_TIMM_PARAMS}
        if not small:
            listing.skipped[module] = why if not counts else \
                f"every model has over {MAX_TIMM_PARAMS // 10**6} M parameters " \
                f"(smallest: {min(counts, key=counts.__getitem__)}, {min(counts.values()) / 1e6:.0f} M)"
            continue
        name = min(small, key=lambda n: (small[n], n))
        _add_timm(listing, module, name)
    return listing


def _timm_counts(module: str) -> tuple[dict[str, int], str]:
    """({model: parameters} of the models of one timm architecture module that build, why none does)."""
    import timm

    counts: dict[str, int] = {}
    why = "holds no model"
    for name in timm.list_models(module=module):
        try:
            counts[name] = count(meta_build(lambda: timm.create_model(name, pretrained=False, num_classes=CLASSES)))
        except Exception as exc:  # a model that cannot be built with a fresh head
            why = f"no model builds with {CLASSES} classes ({name}: {first_line(exc)})"
    return counts, why


# timm's halo attention attends within blocks of 8 x 8 features (and a halo of 3 around them), which fixes HaloNet's
# input at 256 px; blocks of 4 x 4 with a halo of 1 build the same modules and call the same ops at 128 px, whose
# ops write a tenth of the elements (73 M against 699 M; as torchvision's MaxViT with a 2 x 2 window, :data:`WINDOW`)
HALO = {"block_size": 4, "halo_size": 1}


def _halo_settings(name: str) -> Any:
    """The ByobNet settings of the timm model ``name`` with :data:`HALO`'s blocks, None where it has no halo attention."""
    import importlib

    import timm

    module = importlib.import_module(timm.models.model_entrypoint(name).__module__)
    settings: Any = getattr(module, "model_cfgs", {}).get(name)
    if getattr(settings, "self_attn_layer", None) != "halo":  # other modules' model_cfgs are other classes
        return None
    return dataclasses.replace(settings, self_attn_kwargs={**settings.self_attn_kwargs, **HALO})


def _add_timm(listing: Listing, module: str, name: str) -> None:
    import timm
    from timm.models.byobnet import ByobNet

    cfg = timm.get_pretrained_cfg(name)
    channels, height, _ = cfg.input_size if cfg else (3, 224, 224)
    halo = _halo_settings(name)
    low = (cfg.min_input_size or (0, 0, 0))[1] if cfg and halo is None else 0
    cls = type(meta_build(lambda: timm.create_model(name, pretrained=False, num_classes=CLASSES)))
    key = "img_size" if _accepts(cls, "img_size") else None

    def make(size: int) -> nn.Module:
        if halo is not None:
            built: nn.Module = ByobNet(cfg=halo, num_classes=CLASSES, img_size=size)
            return built
        model: nn.Module = timm.create_model(name, pretrained=False, num_classes=CLASSES, **({key: size} if key else {}))
        return model

    size, probe = _smallest(make, channels, height, low)
    if not probe.params:
        listing.skipped[f"{module}/{name}"] = f"no input size runs on meta: {probe.why}"
        return
    listing.entries.append(Entry("timm", name, _seeded(lambda: make(size)), (channels, size, size), probe.params,
                                 note=f"module {module}", ops=probe.ops, volume=probe.volume))


def timm_entries(names: list[str]) -> list[Entry]:
    """Entries of the timm models ``names``, built as the enumeration builds each module's smallest."""
    import timm

    listing = Listing("timm")
    for name in names:
        _add_timm(listing, timm.models.model_entrypoint(name).__module__.rsplit(".", 1)[-1], name)
    return listing.entries


# --- Hugging Face transformers -------------------------------------------------------------------


def _heads(v: int | list[int] | tuple[int, ...]) -> int | list[int]:
    return [1] * len(v) if isinstance(v, (list, tuple)) else min(v, 2)


def _narrow(v: float | list[float] | tuple[float, ...]) -> int | list[Any]:
    """A width divided by 8, a multiple of 8 (lists element-wise)."""
    return [_narrow(u) for u in v] if isinstance(v, (list, tuple)) else max(8, 8 * round(v / 64))


def _shallow(v: int | list[int] | tuple[int, ...]) -> int | list[int]:
    return [1] * len(v) if isinstance(v, (list, tuple)) else min(v, 2)


# Config keys the configs name their sizes by, in the order they are shrunk (heads before the widths they
# must divide); a shrink that breaks the model is undone.
SHRINK: tuple[tuple[tuple[str, ...], Callable[[Any], object]], ...] = (
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


def _numbers(value: object) -> bool:
    """Whether ``value`` is a number or a flat list of numbers (not a flag, not nested)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return bool(items) and all(isinstance(u, (int, float)) and not isinstance(u, bool) for u in items)


def _shrinks(config: PretrainedConfig) -> dict[tuple[str, ...], object]:
    """{path: smaller value} for the size settings of ``config`` and its sub-configs, in :data:`SHRINK` order."""
    out: dict[tuple[str, ...], object] = {}
    for keys, smaller in SHRINK:
        for path, value in _config_keys(config):
            if path[-1] in keys and _numbers(value):
                new = smaller(value)
                if new != (list(value) if isinstance(value, (list, tuple)) else value):
                    out[path] = new
    return out


def _config_keys(config: PretrainedConfig, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """(path, value) of every setting of ``config`` and its sub-configs (CLIP's ``vision_config``, ...)."""
    from transformers import PretrainedConfig

    for key, value in vars(config).items():
        if isinstance(value, PretrainedConfig):
            yield from _config_keys(value, path + (key,))
        elif not key.startswith("_"):
            yield path + (key,), value


def _nested(edits: dict[tuple[str, ...], object]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in edits.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def _image_size(config: PretrainedConfig) -> tuple[tuple[str, ...] | None, int, int]:
    """(path of the image size setting or None, its value, input channels)."""
    found: dict[tuple[str, ...], Any] = dict(_config_keys(config))  # a config's settings are untyped
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

    def make(edits: dict[tuple[str, ...], object], size: int = default_size) -> nn.Module:
        if image_key:
            edits = {**edits, image_key: [size, size] if as_list else size}
        return Logits(model_class(config_class(**_nested(edits), num_labels=CLASSES)))

    shrinks = _shrinks(default)
    probe = _runs(lambda: make(shrinks), (channels, default_size, default_size))
    meta = "meta" not in probe.why  # a model that reads values on the way (Perceiver's .item()) is checked for real
    if not meta:
        probe = _runs(lambda: make(shrinks), (channels, default_size, default_size), meta)
    edits = shrinks
    if not probe.params:  # some settings must agree (depths and per-layer lists): keep each shrink that still runs
        edits = {}
        for path, value in shrinks.items():
            if _runs(lambda: make({**edits, path: value}), (channels, default_size, default_size), meta).params:
                edits[path] = value
    size, probe = _smallest(lambda s: make(edits, s), channels, default_size, meta=meta)
    if not probe.params:
        raise ValueError(f"no config runs on {channels}x{default_size}x{default_size}: {probe.why}")
    note = f"{len(edits)}/{len(shrinks)} shrinks kept" if len(edits) < len(shrinks) else ""
    return Entry("hf", class_name, _seeded(lambda: make(edits, size)), (channels, size, size), probe.params, note=note,
                 ops=probe.ops, volume=probe.volume)


def _hf() -> Listing:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES

    listing = Listing("hf")
    for model_type, names in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES.items():
        for class_name in (names,) if isinstance(names, str) else names:
            try:
                listing.entries.append(_hf_entry(model_type, class_name))
            except Exception as exc:  # a class that cannot be built from its config alone
                listing.skipped[class_name] = first_line(exc) if not isinstance(exc, ValueError) else str(exc)[:300]
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


# --- the checks on one model ---------------------------------------------------------------------

TOLERANCE = 1e-8
# for a model that computes part of its forward in float32 whatever its parameters' dtype (timm's LiteMLA
# casts its attention to float32): float32 rounding, one ulp of 1.2e-7, taken in another order
FLOAT32_TOLERANCE = 1e-5
BATCH = 2
# the costly methods' sample counts, cut for a check of finiteness and determinism
CHEAP = {"integrated-gradients": {"n_steps": 4}, "smoothgrad": {"samples": 4}, "smoothgrad-ig": {"samples": 2, "n_steps": 3}}
PATTERN_IMAGES = 8  # the images the pattern methods are fitted on, besides the two explained
# the maps read from attention layers: one of them checked on every model that has them (they fit no other)
ON_ATTENTION = ("vit-grad-cam", "attention-rollout", "generic-attention", "transformer-attribution", "attention-grad-cam")
HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


@dataclass(frozen=True, eq=False)
class Snapshot:
    """What an explainer must leave as it found it (:func:`snapshot`): equal when every state_dict tensor holds
    the same bytes and the flags, hook counts and gradients' presence are the same."""

    tensors: tuple[tuple[str, torch.Tensor], ...]  # (name, the tensor's bytes, a copy)
    modules: tuple[tuple[int, ...], ...]
    global_hooks: tuple[int, ...]
    params: tuple[tuple[bool, bool], ...]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshot):
            return NotImplemented
        return (self.modules, self.global_hooks, self.params) == (other.modules, other.global_hooks, other.params) \
            and [n for n, _ in self.tensors] == [n for n, _ in other.tensors] \
            and all(torch.equal(a, b) for (_, a), (_, b) in zip(self.tensors, other.tensors))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """(n,) uint8, a copy of ``t``'s bytes: compared bit for bit (a NaN equals itself), a memcpy where a digest
    cost a fifth of a transformer's sweep."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).clone()


def snapshot(model: nn.Module) -> Snapshot:
    """What an explainer must leave as it found it: a copy of every state_dict tensor's bytes, each module's
    training flag and hook counts (and the global hooks), each parameter's requires_grad and whether it has a grad."""
    modules = tuple((int(m.training), *(len(getattr(m, h)) for h in HOOKS)) for m in model.modules())
    global_hooks = tuple(len(getattr(torch.nn.modules.module, f"_global{h}")) for h in HOOKS)
    params = tuple((p.requires_grad, p.grad is None) for p in model.parameters())
    return Snapshot(tuple((name, _bytes(t)) for name, t in model.state_dict().items()), modules, global_hooks, params)


def relative(error: torch.Tensor, scale: torch.Tensor) -> float:
    return float(error.abs().max() / scale.abs().max().clamp_min(torch.finfo(scale.dtype).tiny))


def check(entry: Entry, row: dict[str, Any], seed: int = 0, methods: tuple[str, ...] = ()) -> None:
    """Check ``entry`` on two seeded images, filling ``row`` as it goes (``stage`` names the step running):

    (a) ``gradient`` against the plain autograd input gradient (relative max error), for the predicted class;
    (b) ``deeplift`` completeness: each map's sum against f(x)[t] - f(0)[t], relative to |f(x)[t]|;
    both to :data:`TOLERANCE`, or :data:`FLOAT32_TOLERANCE` where the model casts its values to float32;
    (c) ``lrp-epsilon``, every method in ``methods`` that fits the model (``unfit``: those that do not, e.g. an
        attention map on a CNN) and on a model with attention one of the :data:`ON_ATTENTION` maps (chosen by
        the model's name) of the input's shape, finite, and the same bit for bit when called again
        (``failing``: the methods that were not); the pattern methods are fitted on :data:`PATTERN_IMAGES` more seeded images;
    (d) the model's state_dict, training flags and hooks unchanged, and no hook called while the maps are
        computed (an observing hook is put on every module after the capture).

    An AttributionError (the model refused) propagates, as does any other failure.
    """
    from attributions.explainer import Explainer
    from attributions.graph import trace
    from audit.models.cautions import narrowed_dtypes
    from audit.run.patterns import PATTERN_METHODS

    row["stage"] = "build"
    start = time.perf_counter()
    model = entry.perturb(entry.build(), seed)
    row.update(params=count(model), build_s=round(time.perf_counter() - start, 2), model_class=type(model).__name__)
    x = torch.randn(BATCH, *entry.input_shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rows = torch.arange(BATCH)
    row["stage"] = "reference"
    xg = x.clone().requires_grad_()
    logits = model(xg)  # one forward pass for the class, its gradient and f(x)
    target = logits.detach().argmax(1)  # the predicted class: a random one may sit at zero behind a final ReLU (SqueezeNet)
    plain = torch.autograd.grad(logits[rows, target].sum(), xg)[0]
    fx = logits.detach()[rows, target]
    with torch.no_grad():
        f0 = model(torch.zeros_like(x))[rows, target]
    row.update(logit_max=float(fx.abs().max()), gradient_max=float(plain.abs().max()),
               tolerance=FLOAT32_TOLERANCE if narrowed_dtypes(model, x[:1]) else TOLERANCE)
    calls: list[str] = []
    handles: list[Any] = []
    before = snapshot(model)
    try:
        row["stage"] = "capture"
        start = time.perf_counter()
        graph = trace(model, x)
        row.update(capture_s=round(time.perf_counter() - start, 2), nodes=len(graph.nodes))
        # observed from here: a capture of a model with hooks runs its own forward once, to compare (docs/engine.md)
        handles = [m.register_forward_hook(lambda m, i, o, name=name: calls.append(name))
                   for name, m in model.named_modules()]
        row["stage"] = "gradient"
        maps = Explainer(model, "gradient", graph=graph).attribute(x, target=target).detach()
        row["gradient_err"] = relative(maps - plain, plain)
        row["stage"] = "deeplift"
        sums = Explainer(model, "deeplift", graph=graph).attribute(x, target=target).detach().reshape(BATCH, -1).sum(1)
        row["deeplift_err"] = float(((sums - (fx - f0)).abs() / fx.abs().clamp_min(torch.finfo(fx.dtype).tiny)).max())
        failing, unfit = [], []
        # the rotation's methods, and on a model with attention over its patches one of the attention maps, in
        # turn by the model's name (each map meets a share of the transformers; all of them: --all-methods)
        attention = ON_ATTENTION[zlib.crc32(entry.name.encode()) % len(ON_ATTENTION)]
        for method in dict.fromkeys(("lrp-epsilon", *methods, attention)):
            row["stage"] = method
            params: dict[str, Any] = CHEAP.get(method, {})
            if method in PATTERN_METHODS:  # fitted on images of their own: two leave a dense layer's covariances degenerate
                params = {"data": torch.randn(PATTERN_IMAGES, *entry.input_shape, dtype=x.dtype,
                                              generator=torch.Generator().manual_seed(seed + 1))}
            probe = Explainer(model, method, graph=graph, **params)
            if probe.method.engine.fits(probe, x) is not None:  # a method that does not apply to this model
                unfit += [method] if method not in ON_ATTENTION else []
                continue
            maps = []
            for _ in range(2):  # same seed, same numbers: a fresh explainer each time (noise draws afresh per call)
                torch.manual_seed(seed)
                maps.append(Explainer(model, method, graph=graph, **params).attribute(x, target=target))
            first, again = maps
            if not (first.shape == x.shape and torch.isfinite(first).all() and torch.equal(first, again)):
                failing.append(method)
        row["failing"] = " ".join(failing)
        row["unfit"] = " ".join(unfit)
        row["hook_calls"] = len(calls)
    finally:
        for h in handles:
            h.remove()
    row["unchanged"] = snapshot(model) == before
    row["stage"] = ""


def verdict(row: dict[str, Any]) -> tuple[str, str]:
    """(class, reason) of a row whose checks all ran: "exact" or "inexact"."""
    failed = [] if row["gradient_max"] > 0 else ["the input gradient is zero: the checks are void"]
    failed += [f"{k} {row[k]:.1e} > {row['tolerance']:.0e}" for k in ("gradient_err", "deeplift_err")
               if not row[k] <= row["tolerance"]]
    failed += [f"not of the input's shape, not finite or not deterministic: {row['failing']}"] if row["failing"] else []
    failed += [] if row["unchanged"] else ["model changed"]
    failed += [f"{row['hook_calls']} hook call(s)"] if row["hook_calls"] else []
    return ("inexact", "; ".join(failed)) if failed else ("exact", "")


# what a child does with its entry: fill a row (``check`` by default), then judge it (class, reason)
Work = Callable[[Entry, dict[str, Any], int, tuple[str, ...]], None]
# what start_one hands finish_one: the entry, its child, the row's end of the pipe, when it started
Started = tuple[Entry, "ForkProcess", "Connection[dict[str, Any], dict[str, Any]]", float]


def _child(entry: Entry, seed: int, methods: tuple[str, ...], pipe: Connection[dict[str, Any], dict[str, Any]],
           work: Work | None = None, judge: Callable[[dict[str, Any]], tuple[str, str]] | None = None) -> None:
    from attributions.errors import AttributionError

    torch.set_num_threads(1)
    row: dict[str, Any] = {}
    try:
        (work or check)(entry, row, seed, methods)
        row["class"], row["reason"] = (judge or verdict)(row)
    except AttributionError as exc:
        row.update({"class": "refused", "reason": first_line(exc, typed=False)})
    except Exception as exc:  # any other failure is the engine's (or the library's) crash: keep its type
        row.update({"class": "crash", "reason": first_line(exc)})
    pipe.send(row)


def start_one(entry: Entry, seed: int = 0, methods: tuple[str, ...] = (), work: Work | None = None,
              judge: Callable[[dict[str, Any]], tuple[str, str]] | None = None) -> Started:
    """Start checking ``entry`` in a forked child (a hang, a crash of the interpreter or its memory ends
    with it); :func:`finish_one` collects its row. ``work`` / ``judge``: another job than :func:`check`
    and :func:`verdict` (the collapse atlas's)."""
    context = multiprocessing.get_context("fork")  # the child inherits the entry's builder closure
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(entry, seed, methods, send, work, judge), daemon=True)
    child.start()
    send.close()
    return entry, child, receive, time.perf_counter()


def finish_one(started: Started, limit: float = 120.0) -> dict[str, Any]:
    """The row of a child from :func:`start_one`, which is killed after ``limit`` seconds in all."""
    entry, child, receive, start = started
    row: dict[str, Any] = {"library": entry.library, "name": entry.name, "params": entry.params, "note": entry.note,
           "input": "x".join(map(str, entry.input_shape))}
    try:
        left = max(0.0, limit - (time.perf_counter() - start))
        row |= receive.recv() if receive.poll(left) else {"class": "skipped", "reason": f"over the {limit:.0f} s limit"}
    except EOFError:  # the child died without a word: killed for memory, or a crash in native code
        child.join()
        row |= {"class": "crash", "reason": _death(child.exitcode)}
    if child.is_alive():
        child.kill()
    child.join()
    return row | {"run_s": round(time.perf_counter() - start, 1)}


def _death(code: int | None) -> str:
    """Why a child that sent no row ended, from its exit code (negative: the signal that killed it)."""
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        why = " (on Linux most likely the out-of-memory killer)" if -code == signal.SIGKILL else ""
        return f"the child process was killed by {name}{why}"
    return f"the child process died (exit code {code})"


def within(entries: list[Entry], limit: int = MAX_TIMM_PARAMS) -> list[Entry]:
    """The entries of at most ``limit`` parameters, and of each architecture module (``note``) with none, its
    smallest: every family once at least, without the cost of building its widest variants."""
    kept = [e for e in entries if e.params <= limit]
    covered = {e.note for e in kept}
    for note in dict.fromkeys(e.note for e in entries if e.note not in covered):
        kept.append(min((e for e in entries if e.note == note), key=lambda e: (e.params, e.name)))
    return sorted(kept, key=entries.index)


def distinct(entries: list[Entry]) -> list[Entry]:
    """The smallest entry of each architecture module (``note``) and structure: a deeper or wider variant of a
    structure already checked (ResNet-101 beside ResNet-50) adds its cost, not an op. Entries without a
    recorded structure are all kept."""
    firsts: dict[tuple[str, frozenset[str]], Entry] = {}
    for e in sorted(entries, key=lambda e: (e.params, e.name)):
        firsts.setdefault((e.note, e.structure) if e.structure else (e.note, frozenset({e.name})), e)
    kept = set(map(id, firsts.values()))
    return [e for e in entries if id(e) in kept]


def cost(entry: Entry) -> int:
    """What checking ``entry`` costs, in elements: its parameters (built, perturbed, hashed) and what its
    forward pass writes on one image."""
    return entry.params + entry.volume


def covering(entries: list[Entry]) -> list[Entry]:
    """The entries that call an op kind no cheaper entry calls: cheapest first (:func:`cost`), each kept
    when it adds an op kind (:func:`op_kinds`) to those of the entries kept before it. A model whose every
    op the sweep already meets on cheaper models adds their cost, not a rule; ``make test`` checks these,
    ``MODEL_LIBRARIES_ALL=1`` every entry. Entries without recorded ops are all kept."""
    seen: set[str] = set()
    kept = set()
    for e in sorted(entries, key=lambda e: (cost(e), e.name)):
        if not e.ops or e.ops - seen:
            kept.add(id(e))
            seen |= e.ops
    return [e for e in entries if id(e) in kept]


def warm() -> None:
    """Import the engine and capture and explain one tiny model in this process, on one thread, so that the
    children :func:`start_one` forks (the checks' and the atlas's) find torch.export's lazily built machinery
    ready (it costs each child seconds otherwise)."""
    from attributions.explainer import Explainer
    from attributions.graph import trace
    from audit.run.patterns import PATTERN_METHODS  # noqa: F401  (imported for the children)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no OpenMP pool for a forked child to inherit
    try:
        model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2)).double().eval()
        x = torch.randn(2, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        Explainer(model, "deeplift", graph=trace(model, x)).attribute(x, target=torch.tensor([0, 1]))
    finally:
        torch.set_num_threads(threads)


def check_all(entries: list[Entry], seed: int = 0, methods: tuple[str, ...] | list[tuple[str, ...]] = (),
              limit: float = 120.0, parallel: int = 1, report: Callable[[int, dict[str, Any]], None] | None = None,
              work: Work | None = None, judge: Callable[[dict[str, Any]], tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """Every entry's row (in the entries' order), ``parallel`` children at a time (the costliest first), each
    on one thread;
    ``methods``: the methods checked on every entry, or a list of them per entry; ``report(i, row)`` is
    called as each finishes; ``work`` / ``judge``: as :func:`start_one`."""
    from multiprocessing.connection import wait

    warm()
    rows: dict[int, dict[str, Any]] = {}
    running: dict[int, Started] = {}
    pending = sorted(enumerate(entries), key=lambda item: -cost(item[1]))  # the longest first: none left alone at the end
    while pending or running:
        while pending and len(running) < parallel:
            i, entry = pending.pop(0)
            running[i] = start_one(entry, seed, methods[i] if isinstance(methods, list) else methods, work, judge)
        deadline = min(started[3] for started in running.values()) + limit
        ready = wait([started[2] for started in running.values()], max(0.0, deadline - time.perf_counter()))
        done = [i for i, started in running.items() if started[2] in ready or time.perf_counter() - started[3] >= limit]
        for i in done:
            rows[i] = finish_one(running.pop(i), limit)
            if report is not None:
                report(i, rows[i])
    return [rows[i] for i in sorted(rows)]
