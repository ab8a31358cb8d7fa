"""Atomic file writes: a temporary file in the target folder, renamed into place when complete."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

# the one step that makes a write visible (a module attribute, so that fault-injection tests can
# fail or kill the process exactly there)
_rename = os.replace


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it to ``path``.

    If ``write`` raises, nothing is left behind and ``path`` keeps its old content. The file
    gets the permissions a plain ``open`` would give it (0666 less the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        _rename(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda f: f.write(data))


def remove_partials(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that writes killed mid-way left under ``folder`` (``.<name>.*.part``,
    as :func:`atomic_write` names them); returns what was removed."""
    stale = [p for p in Path(folder).rglob(".*.part") if is_partial(p) and p.is_file()]
    for p in stale:
        p.unlink()
    return stale


def is_partial(path: Path) -> bool:
    """Whether ``path`` is the temporary file of a write (as :func:`atomic_write` names them)."""
    return path.name.startswith(".") and path.name.endswith(".part")
