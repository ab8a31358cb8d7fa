"""The toolkit's own exception types.

Every error the toolkit raises on bad input is an :class:`AuditError`, so a caller can catch
them all at once; the subclasses say which part of the input was wrong.
"""
from __future__ import annotations

import difflib
from typing import Iterable


class AuditError(ValueError):
    """Bad input to the toolkit: what was wrong, where, and what to do about it."""


class DataError(AuditError):
    """A data set could not be found, read or verified."""


class ModelError(AuditError):
    """A model, architecture or checkpoint is invalid."""


class ConfigError(AuditError):
    """An option, name or hyper-parameter is invalid."""


def unknown_name(kind: str, name: object, valid: Iterable[str], error: type[AuditError] = ConfigError) -> AuditError:
    """Build the error for an unknown name, listing the valid ones and the closest match."""
    valid = sorted(valid)
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return error(f"unknown {kind} {name!r}; valid: {', '.join(valid)}.{hint}")


class AttributionError(AuditError):
    """A model or request the attribution engine cannot handle: the node, its type, what to do."""
