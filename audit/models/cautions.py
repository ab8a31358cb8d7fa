"""What loading a model did not refuse but a reader of its audit must know (a weight cast up from a lower
precision, a hook whose code could not be read to the end).

A loader records each such line on the model (``model.metadata["warnings"]``) and says it as a
:class:`~attributions.errors.ToolkitWarning`; a run logs the lines of every model it audits, records them in its
manifest (``warnings``) and shows them in its report's Models section.
"""
from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from attributions.errors import ToolkitWarning
from attributions.hooks import unresolved_hooks


def caution(model: nn.Module, line: str) -> None:
    """Record ``line`` in ``model.metadata["warnings"]`` and say it as a :class:`ToolkitWarning`."""
    metadata: Any = getattr(model, "metadata", None)
    if not isinstance(metadata, dict):
        metadata = {}
        model.metadata = metadata
    metadata.setdefault("warnings", []).append(line)
    warnings.warn(line, ToolkitWarning, stacklevel=3)


def cautions(model: nn.Module) -> list[str]:
    """Every line a reader of ``model``'s audit must know: its loader's, then its hooks' (read now: a hook
    registered after loading counts)."""
    recorded = (getattr(model, "metadata", None) or {}).get("warnings", [])
    return [*recorded, *unresolved_hooks(model)]
