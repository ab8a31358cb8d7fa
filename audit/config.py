"""The audit configuration: defaults, a TOML file, and command-line overrides, validated."""
from __future__ import annotations

import difflib
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from audit.errors import ConfigError
from audit.methods import resolve_methods

TESTS = ("csc", "random-logit", "cascading", "independent", "bottom-up")


@dataclass
class AuditConfig:
    """What to audit and how. Every field is recorded in the run's manifest.

    models : shipped checkpoint names, checkpoint paths, or ``module:factory`` (with ``weights``)
    methods : method names or "all"
    tests : any of csc, random-logit, cascading, independent, bottom-up
    data : "embedded" (the shipped Fashion-MNIST sample) or a data set name for ``load_dataset``
    n_images : images audited per model (class-balanced, first of each class in order)
    """

    models: list = field(default_factory=lambda: ["cnn-sgd", "cnn-bort"])
    methods: list | str = "all"
    tests: list = field(default_factory=lambda: ["csc", "random-logit", "cascading"])
    n_images: int = 32
    seed: int = 0
    device: str = "cpu"
    data: str = "embedded"
    data_root: str | None = None
    weights: str | None = None
    n_vectors: int = 5
    csc_threshold: float = 0.99
    bn: str = "reset"
    target: str = "true"
    random_logit_pass: float = 0.8
    randomization_pass: float = 0.5
    heatmap_examples: int = 2

    def validated(self) -> "AuditConfig":
        """A copy with list fields normalised, after checking every value."""
        out = AuditConfig(**asdict(self))
        out.models = _as_list(out.models)
        out.tests = _as_list(out.tests)
        out.methods = resolve_methods(out.methods)
        if not out.models:
            raise ConfigError("no model given")
        for t in out.tests:
            if t not in TESTS:
                close = difflib.get_close_matches(t, TESTS, n=1)
                raise ConfigError(f"unknown test {t!r}; valid: {', '.join(TESTS)}"
                                  + (f". Did you mean {close[0]!r}?" if close else ""))
        checks = [("n_images", out.n_images >= 2), ("n_vectors", out.n_vectors >= 2),
                  ("csc_threshold", 0 < out.csc_threshold <= 1), ("device", out.device in ("cpu", "cuda")),
                  ("bn", out.bn in ("reset", "keep-stats")), ("target", out.target in ("true", "predicted")),
                  ("heatmap_examples", 0 <= out.heatmap_examples <= out.n_images)]
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"invalid {name}={getattr(out, name)!r} in the audit configuration")
        return out


def _as_list(value) -> list:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def load_config(path: str | Path | None = None, **overrides) -> AuditConfig:
    """Defaults, then the TOML file (top-level keys = field names), then ``overrides`` (None skipped).

    An unknown key is an error naming the closest valid one.
    """
    values: dict = {}
    if path is not None:
        try:
            values = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read the configuration {path}: {exc}") from exc
    values |= {k: v for k, v in overrides.items() if v is not None}
    valid = [f.name for f in fields(AuditConfig)]
    for key in values:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            raise ConfigError(f"unknown configuration key {key!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                              + f" (valid keys: {', '.join(valid)})")
    return AuditConfig(**values).validated()
