"""Fetch a file over HTTP(S), verify its sha256, and write it atomically.

Nothing partial is ever left at the destination: the bytes go to a temporary file in the same
folder, which is renamed into place only once the checksum matches.
"""
from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from audit.atomic import atomic_write
from audit.errors import DataError
from audit.progress import bars

CHUNK = 1 << 16


def fetch(url: str, dest: Path, sha256: str, progress: bool = True, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` and verify it.

    Parameters
    ----------
    url : str
        Where to fetch from.
    dest : Path
        Final path; its folder is created if needed.
    sha256 : str
        Expected hex digest; on mismatch nothing is written and :class:`DataError` is raised.
    progress : bool
        Show a progress bar (bytes).
    """
    dest = Path(dest)

    def write(out: Any) -> None:
        h = hashlib.sha256()
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "attribution-audit"})
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                total = int(resp.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, disable=not bars(progress)) as bar:
                    for block in iter(lambda: resp.read(CHUNK), b""):
                        out.write(block)
                        h.update(block)
                        bar.update(len(block))
        except (urllib.error.URLError, OSError) as exc:
            raise DataError(f"could not download {url} ({exc}); without network, fetch the file elsewhere "
                            f"and place it at {dest}") from exc
        if h.hexdigest() != sha256.lower():
            raise DataError(f"checksum mismatch for {url}: got sha256 {h.hexdigest()}, expected {sha256}; "
                            "the file was not kept (a corrupt download or a changed mirror)")

    atomic_write(dest, write)
    return dest
