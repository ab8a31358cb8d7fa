"""The audit's exception types.

Every error the audit raises on bad input is an :class:`AuditError` (a
:class:`~attributions.errors.ToolkitError`, like the engine's and Bort's errors); the
subclasses say which part of the input was wrong.
"""
from __future__ import annotations

from attributions.errors import ToolkitError


class AuditError(ToolkitError):
    """Bad input to an audit: what was wrong, where, and what to do about it."""


class DataError(AuditError):
    """A data set could not be found, read or verified."""


class ModelError(AuditError):
    """A model, architecture or checkpoint is invalid."""


class ConfigError(AuditError):
    """An option, name or hyper-parameter is invalid."""
