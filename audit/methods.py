"""Resolving method lists for the audit tests, and how each method's maps become heatmaps."""
from __future__ import annotations

from attributions.methods import BUILDERS, build_method
from audit.errors import ConfigError, unknown_name


def resolve_methods(methods) -> list[str]:
    """A list of method names from a name, a comma-separated string, a list, or "all"."""
    if isinstance(methods, str):
        methods = list(BUILDERS) if methods == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    methods = list(methods)
    if not methods:
        raise ConfigError("no attribution method given")
    for m in methods:
        if m not in BUILDERS:
            raise unknown_name("attribution method", m, BUILDERS)
    return methods


def default_reduction(method: str) -> str:
    """Per DESIGN 3.2: signed channel sum for relevance / contribution maps, max |.| for gradient-like maps."""
    m = build_method(method)
    gradient_like = (m.signal == "gradient" and not m.times_input and m.name != "integrated-gradients"
                     and m.engine != "control") or m.name in ("smoothgrad", "edge")
    return "max-abs" if gradient_like else "sum"


def check_option(kind: str, value: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise unknown_name(kind, value, valid, ConfigError)
    return value
