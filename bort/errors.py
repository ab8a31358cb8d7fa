"""Bort's own error type."""
from __future__ import annotations

from attributions.errors import ToolkitError


class BortError(ToolkitError):
    """An invalid optimizer setting, or a model the Bort metrics cannot read."""
