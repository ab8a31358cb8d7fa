"""The toolkit's exception base and the engine's own error.

Every error the toolkit raises on bad input derives from :class:`ToolkitError`, so a caller can
catch them all at once. It lives here, in the lowest package, so that every package can derive
its own errors from it without importing a package above it.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class ToolkitError(ValueError):
    """Bad input to the toolkit: what was wrong, where, and what to do about it."""


class ToolkitWarning(UserWarning):
    """Something the toolkit did not refuse but a reader of its results must know: a weight cast on loading, a
    hook whose code could not be read to the end. A run records each in its log, manifest and report."""


class AttributionError(ToolkitError):
    """A model or request the attribution engine cannot handle: the node, its type, what to do."""


class NotApplicable(AttributionError):
    """A method that cannot explain this model at all, though both are sound: a Grad-CAM without a feature map
    of more than one position, attention maps of a model without (whole-image) attention. An audit leaves such
    a unit empty and records why (its manifest's ``not_applicable``)."""


def unknown_name(kind: str, name: object, valid: Iterable[str], error: type[ToolkitError]) -> ToolkitError:
    """The error for an unknown name, listing the valid ones and the closest match.

    Parameters
    ----------
    kind : what was named, e.g. "attribution method"
    name : the name given
    valid : the names that exist
    error : the exception type to build (the caller's package's own)
    """
    valid = sorted(valid)
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return error(f"unknown {kind} {name!r}; valid: {', '.join(valid)}.{hint}")
