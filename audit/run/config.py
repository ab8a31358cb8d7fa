"""The audit configuration: defaults, a TOML file, and command-line overrides, validated.

The general keys are the fields of :class:`AuditConfig`; every check adds its own keys, declared once as the
fields of its :class:`~audit.checks.options.Options` class (:func:`audit.checks.check_options`). Keys are flat in
TOML, on the command line and in the manifest. A check receives its own typed options
(``check.options_from(config.options)``), never the configuration. The configuration is frozen: a changed one
is a new one (``dataclasses.replace``).
"""
from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from attributions.errors import unknown_name
from audit.checks import CHECKS, check_options, get_check
from audit.checks.options import SMALLEST_LOOK, Option
from audit.data.preprocess import preprocess_from
from audit.errors import ConfigError
from audit.inputs import resolve_methods
from audit.run.patterns import pattern_source
from audit.run.protocols import PROTOCOLS, protocol_options
from audit.run.resources import parse_size

DEVICES = ("cpu", "cuda")


def key(default: Any = None, *, help: str, factory: Callable[[], Any] | None = None,
        valid: Callable[[Any], bool] | None = None, rule: str = "", **flag: Any) -> Any:
    """A general key of :class:`AuditConfig`, declared once: its default, its command-line flag (``help`` and
    argparse's ``type``, ``choices``, ``action``, ``metavar``) and what values are valid: the flag's ``type``
    (an int), a boolean action (true or false), its ``choices``, ``valid``, a predicate, with ``rule`` its wording;
    :func:`general_keys` lists them, :meth:`AuditConfig.validated` checks each value against its declaration
    (:func:`declared`, the checks' :class:`~audit.checks.options.Option`)."""
    metadata = {"help": help, "flag": flag, "valid": valid, "rule": rule}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


_BOOLEAN_ACTIONS = (argparse.BooleanOptionalAction, "store_true")


def declared(key_field: Field[Any]) -> Option:
    """A general key's declaration as the checks' options have theirs (:class:`~audit.checks.options.Option`,
    whose ``check`` validates a value): its type from the flag's ``type`` (an int), a boolean action, or a ``str``
    annotation; ``object`` where the key's own normalisation checks it (lists, tables, a preset or its table)."""
    flag = key_field.metadata["flag"]
    kind = int if flag.get("type") is int else bool if flag.get("action") in _BOOLEAN_ACTIONS else \
        str if key_field.type in ("str", "str | None") else object  # the annotation's text (postponed annotations)
    default = key_field.default if key_field.default is not MISSING else key_field.default_factory()  # type: ignore[operator]
    return Option(key_field.name, default, key_field.metadata["help"], choices=tuple(flag.get("choices", ())),
                  valid=key_field.metadata["valid"], rule=key_field.metadata["rule"], kind=kind)


def general_keys(config: type[AuditConfig] | None = None) -> list[Field[Any]]:
    """The general keys of ``config`` (default :class:`AuditConfig`), in order: its fields declared with
    :func:`key`, besides the checks' ``options``."""
    return [f for f in fields(config or AuditConfig) if "help" in f.metadata]


# check options that no verdict reads any more, and why: a configuration that gives one is refused with the reason,
# a manifest that records one (a run written before) still loads
RETIRED = {name: "the verdict reads the controls' scale measured in the run (the edge map's score: unchanged; the "
                 "random map's: unrelated), not a fixed value"
           for name in ("randomization_threshold", "data_randomization_threshold", "smprt_threshold")}


@dataclass(frozen=True)
class AuditConfig:
    """What to audit and how. Every field is recorded in the run's manifest.

    The general keys (``models``, ``methods``, ``tests``, ``data``, ``n_images``, ...) are the fields declared
    with :func:`key`, each declaration holding the key's default, its help text and its command-line flag in one
    place; :func:`general_keys` returns them. ``attribution-audit run --help`` lists every key with its help (the
    general keys, then the checks' options), so they are not repeated here. In a TOML file (:func:`load_config`)
    and in the manifest the keys are flat, with underscores; on the command line with dashes.

    Attributes
    ----------
    options : dict
        The checks' own keys, {key: value}, declared by each check's :class:`~audit.checks.options.Options`
        class (:func:`audit.checks.check_options`); :meth:`validated` checks every value and fills in the
        declared defaults; :meth:`option` reads one (``config.option("csc_threshold")``).
    """

    models: list[Any] = key(factory=lambda: ["cnn-sgd", "cnn-bort"], help="comma-separated: shipped names, checkpoint "
                       "paths, timm:NAME, torchvision:NAME, hf:FOLDER (saved by save_pretrained, or a hub id in the local "
                       "cache), module:factory")
    methods: list[Any] | str = key("all", help='comma-separated method names, or "all"')
    tests: list[Any] = key(factory=lambda: ["csc", "random-logit", "cascading"], help="comma-separated: " + "; ".join(
        f"{c.name} ({c.description})" for c in CHECKS.values()))
    n_images: int = key(32, help="images audited per model, class-balanced: the first images of each class in order "
                          "(imagefolder: a seeded draw per class)", type=int, valid=lambda v: v >= 2, rule="at least 2")
    max_images: int | None = key(None, help="the image budget of a sequential run (default: none, n_images once): "
                                 "the images are read in looks of n_images (the first n_images, then the next, up to "
                                 "max_images), and a model x check x method cell gets the next look only while its "
                                 "verdict is undecided; every look's interval is at the level 1 - 0.01 / K for K "
                                 "looks (Bonferroni over the looks), so a decision taken at any look keeps the error "
                                 "of one interval at 99 percent", type=int)
    seed: int = key(0, help="the run's seed", type=int, valid=lambda v: v >= 0, rule=">= 0")
    protocol: str = key("toolkit", help="the checks' settings: toolkit (default), adebayo2018 (the randomized "
                        "model's prediction explained, BatchNorm statistics kept, Gaussian re-initialisation, their "
                        "SSIM and HOG) or sixt2020 (the true label, BatchNorm reset, K = 5, CSC threshold 0.99); an option given "
                        "explicitly wins over the protocol's, and the report names the difference",
                        choices=list(PROTOCOLS))
    device: str = key("cpu", help="where the maps are computed", choices=list(DEVICES))
    data: str = key("embedded", help='"embedded" (default), a data set name, or "imagefolder" (with --data-root)')
    data_root: str | None = key(None, help="the data's folder; for imagefolder one sub-folder per class")
    preprocess: str | dict[str, Any] = key("none", help="imagefolder: none (default) or imagenet (resize 256, centre crop 224, "
                                 "ImageNet mean/std); a table with resize, crop, mean, std in --config")
    weights: str | None = key(None, help="state_dict (torch.save or .safetensors) for a timm:, torchvision: or "
                              "module:factory model")
    num_classes: int | None = key(None, help="the classifier's outputs of a timm:, torchvision: or hf: model "
                                  "(default: the library's)", type=int, valid=lambda v: v >= 1, rule="a positive integer")
    heatmap_examples: int = key(2, help="images whose heatmaps the randomization checks keep for the report", type=int,
                                valid=lambda v: v >= 0, rule=">= 0")
    max_memory: str | None = key(None, help="the memory the passes are held to, e.g. 4GB (default: half of the free "
                                 "RAM, or GPU memory, when the run starts); images and vectors go in chunks to fit")
    image_block: int = key(0, help="images per work item of the checks scored per image (default 0: a unit's images "
                           "together); smaller blocks share a unit's images among ranks; each block is seeded by its unit "
                           "and first image, so the files depend on the blocks, not on the number of ranks", type=int,
                           valid=lambda v: v >= 0, rule=">= 0")
    mixed_precision: bool = key(False, help="compute the maps under autocast (bfloat16 on CPU, float16 on GPU; default "
                                "off); the manifest records each method's agreement with float32",
                                action=argparse.BooleanOptionalAction)
    pattern_data: str = key("explained", help="what PatternNet / PatternAttribution fit their patterns on: explained "
                            "(default: the images each check explains), train (the data set's training split) or "
                            "DATASET:SPLIT; the trained model's patterns are kept beside its checkpoint")
    pattern_images: int = key(256, help="images the patterns are fitted on (default 256, a seeded draw)", type=int,
                              valid=lambda v: v >= 1, rule="at least 1")
    twins: dict[str, Any] = key(factory=dict, help="the permuted-label twin of each model for the data-randomization test (a "
                      "checkpoint path, shipped name or module:factory; a list, or the model named again, for several "
                      "pairs); the shipped models' twins are found without it", metavar="MODEL=TWIN,...")
    controls: dict[str, Any] = key(factory=dict, help="the control twin of each model (its twin's recipe on the true labels, "
                         "another seed), the reference of the data-randomization test's calibrated verdict; one per "
                         "pair, in the twins' order; the shipped models' control twins are found without it",
                         metavar="MODEL=CONTROL,...")
    shortcuts: dict[str, Any] = key(factory=dict, help="the shortcut twins of each model for the planted-shortcut check: "
                                    "the --out of attribution-audit train --shortcut (OUT-shortcut.pt and "
                                    "OUT-tag-control.pt), or the two named (the model named twice, the shortcut twin "
                                    "first); the shipped models' are found without it", metavar="MODEL=OUT,...")
    allow_partial_weights: bool = key(False, help="load a library model whose weights leave tensors missing, unexpected "
                                      "or of another shape (e.g. a head of another size), keeping those freshly "
                                      "initialised; what was left out is recorded in the manifest's model_sources (default: an "
                                      "error)", action="store_true")
    options: dict[str, Any] = field(default_factory=dict)

    def option(self, name: str) -> Any:
        """A check's option by its key (``config.option("csc_threshold")``): its value, else its declared default."""
        if name in self.options:
            return self.options[name]
        known = check_options()
        if name not in known:
            raise unknown_name("check option", name, known, ConfigError)
        return known[name].default

    def validated(self) -> AuditConfig:
        """A copy with list fields normalised and option defaults filled in, after checking every value."""
        self._check_types()
        twins, controls = _as_pairs(self.twins, "twins"), _as_pairs(self.controls, "controls")
        shortcuts = _as_pairs(self.shortcuts, "shortcuts")
        models, tests = _as_list(self.models, "models"), _as_list(self.tests, "tests")
        methods = resolve_methods(self.methods if isinstance(self.methods, str) else _as_list(self.methods, "methods"))
        for name, listed in (("models", models), ("tests", tests), ("methods", methods)):
            repeated = sorted({v for v in listed if listed.count(v) > 1})
            if repeated:
                raise ConfigError(f"{name} lists {', '.join(map(repr, repeated))} more than once")
        if not models:
            raise ConfigError("no model given")
        if not tests:
            raise ConfigError("no test given")
        for t in tests:
            get_check(t)
        known = check_options()
        for name in self.options:
            if name not in known:
                raise unknown_name("check option", name, known, ConfigError)
        values = protocol_options(self.protocol, self.options, {name: option.default for name, option in known.items()})
        options = {name: option.check(values[name]) for name, option in known.items()}
        out = replace(self, models=models, tests=tests, methods=methods, twins=twins, controls=controls,
                      shortcuts=shortcuts, options=options)
        out._check_ranges()
        return out

    def _check_types(self) -> None:
        """A :class:`ConfigError` for a general key that is not what its declaration says (:func:`key`), or that
        names what does not exist (a preprocessing preset, a pattern source, a memory size)."""
        if self.protocol not in PROTOCOLS:  # named with the closest protocol
            raise unknown_name("protocol", str(self.protocol), list(PROTOCOLS), ConfigError)
        for key_field in general_keys(type(self)):
            declared(key_field).check(getattr(self, key_field.name))
        preprocess_from(self.preprocess)  # a clear error for an unknown preset or a bad table
        pattern_source(self.pattern_data, self.data)
        if self.max_memory is not None:
            parse_size(self.max_memory)

    def _check_ranges(self) -> None:
        """A :class:`ConfigError` for general keys that do not go together."""
        if self.heatmap_examples > self.n_images:
            raise ConfigError(f"invalid heatmap_examples={self.heatmap_examples!r} in the audit configuration: it "
                              f"must be at most n_images ({self.n_images})")
        if self.max_images is not None:
            if self.max_images < self.n_images:
                raise ConfigError(f"max_images must be an integer of at least n_images ({self.n_images}), got "
                                  f"{self.max_images!r}")
            if self.image_block:
                raise ConfigError("max_images reads the images in looks of n_images, which are the blocks of the "
                                  "work: drop image_block")
            if self.n_images < SMALLEST_LOOK:
                raise ConfigError(f"max_images reads the images in looks of n_images ({self.n_images}), and a look "
                                  f"must hold at least {SMALLEST_LOOK} images: the error a decision at any look keeps "
                                  f"is measured from {SMALLEST_LOOK} images on (on fewer, the bootstrap interval's "
                                  f"error exceeds its bound); set n_images to {SMALLEST_LOOK} or more")

    @property
    def family(self) -> int:
        """How many rejecting intervals the run's checks read per method in all (each check's verdict rule's
        ``readings``): the family over which a method's error is held (:func:`~audit.checks.options.look_level`)."""
        return family_of(self.tests)

    @property
    def looks(self) -> int:
        """How many looks the run's design takes at each cell: ceil(max_images / n_images), 1 without a budget."""
        return looks_of(self.n_images, self.max_images)

    def to_dict(self) -> dict[str, Any]:
        """The flat form (general keys, then the checks' keys) written to the manifest."""
        general = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "options"}
        return {**general, **self.options}

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, recorded: bool = False) -> AuditConfig:
        """The inverse of :meth:`to_dict` (unvalidated); unknown keys are a :class:`ConfigError`, and so are
        retired ones (:data:`RETIRED`) unless the values were ``recorded`` by a run (a manifest written before they
        were retired), which leaves them out."""
        general = {f.name for f in fields(cls)} - {"options"}
        known = check_options()
        for key in values:
            if key in RETIRED and not recorded:
                raise ConfigError(f"the check option {key!r} is retired: {RETIRED[key]}; leave it out")
        values = {k: v for k, v in values.items() if k not in RETIRED}
        for key in values:
            if key not in general and key not in known:
                raise unknown_name("configuration key", key, sorted(general | set(known)), ConfigError)
        return cls(**{k: v for k, v in values.items() if k in general},
                   options={k: v for k, v in values.items() if k in known})


def family_of(tests: list[Any]) -> int:
    """How many rejecting intervals the checks ``tests`` read per method in all (their verdict rules' ``readings``;
    at least 1)."""
    rules = [rule for t in tests if t in CHECKS and (rule := CHECKS[t].verdict) is not None]
    return max(1, sum(rule.readings for rule in rules))


def looks_of(n_images: int, max_images: int | None) -> int:
    """How many looks a design of looks of ``n_images`` up to ``max_images`` takes (1 without a budget)."""
    return 1 if max_images is None else -(-max_images // n_images)


def _as_pairs(value: Any, name: str) -> dict[str, Any]:
    """{model: twin, or [twin, ...] for several pairs} from a table or "model=twin,model=twin" (a model named
    more than once has a twin of each pair)."""
    if isinstance(value, str):
        pairs = [p.strip() for p in value.split(",") if p.strip()]
        if any(p.count("=") != 1 for p in pairs):
            raise ConfigError(f"{name} must be model=twin pairs separated by commas, got {value!r}")
        listed: dict[str, list[str]] = {}
        for p in pairs:
            model, twin = p.split("=")
            listed.setdefault(model, []).append(twin)
        value = {k: v[0] if len(v) == 1 else v for k, v in listed.items()}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and _twin_names(v) for k, v in value.items()):
        raise ConfigError(f"{name} must map model names to twin names, one or a list of them (a TOML table or "
                          f"model=twin,...), got {value!r}")
    return {k.strip(): v.strip() if isinstance(v, str) else [t.strip() for t in v] for k, v in value.items()}


def _twin_names(value: Any) -> bool:
    """Whether ``value`` names one twin or a non-empty list of them."""
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, list) and bool(value) and all(isinstance(t, str) and t.strip() for t in value)


def _as_list(value: Any, name: str = "value") -> list[Any]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{name} must be a list of names or a comma-separated string, got {value!r}")
    return list(value)


def load_config(path: str | Path | None = None, **overrides: Any) -> AuditConfig:
    """Defaults, then the TOML file (top-level keys = configuration keys), then ``overrides`` (None skipped).

    An unknown key is an error naming the closest valid one.

    Parameters
    ----------
    path : str or Path, optional
        A TOML file whose top-level keys are configuration keys (general keys and the checks' options, with
        underscores); None: defaults and ``overrides`` only.
    **overrides
        Configuration keys given by name (the command line's values), applied over the file's; an override
        whose value is None is skipped, so that an unset flag leaves the file's value or the default.

    Returns
    -------
    AuditConfig
        The validated configuration (:meth:`AuditConfig.validated`): lists normalised, the checks'
        option defaults filled in.

    Raises
    ------
    ConfigError
        When the file cannot be read or parsed, a key is unknown, or a value is invalid.
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read the configuration {path}: {exc}") from exc
    values |= {k: v for k, v in overrides.items() if v is not None}
    return AuditConfig.from_dict(values).validated()

