"""References to other nodes' values inside an op's arguments, resolved as the graph's nodes run."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ref:
    """A reference to the value of the graph node ``name``."""

    name: str


def resolve(value: Any, env: dict[str, Any], replace: dict[str, Any]) -> Any:
    """``value`` (an op's arguments) with its node references replaced by their values, ``replace`` winning
    over ``env``."""
    if isinstance(value, Ref):
        return replace[value.name] if value.name in replace else env[value.name]
    if isinstance(value, (list, tuple)):
        return type(value)(resolve(v, env, replace) for v in value)
    if isinstance(value, dict):
        return {k: resolve(v, env, replace) for k, v in value.items()}
    return value
