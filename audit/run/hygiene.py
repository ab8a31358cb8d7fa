"""A library call leaves the caller's process as it found it.

:func:`untouched` (:mod:`attributions.hygiene`) restores torch's RNG, the environment, tqdm's monitor thread and
torch's settings after an audit. :func:`fonts_released` closes the font files matplotlib opened for a report's
figures (its font cache keeps each one open for the life of the process).
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from attributions.hygiene import untouched

__all__ = ["fonts_released", "untouched"]

@contextlib.contextmanager
def fonts_released() -> Iterator[None]:
    """Run the body, then close the font files it made matplotlib open, however it returns.

    matplotlib keeps one open FreeType face per font file for the life of the process, in its font cache and in
    the parsed mathtext it caches; a report build is a library call, so the files it opened are closed. The caches
    are emptied only where they were empty before, so a caller's own plotting keeps its fonts.
    """
    from matplotlib import font_manager, mathtext

    # private caches: where another matplotlib lacks one, there is nothing of it to close
    caches = [c for c in (getattr(font_manager, "_get_font", None),
                          getattr(getattr(mathtext, "MathTextParser", None), "_parse_cached", None))
              if c is not None and hasattr(c, "cache_info") and c.cache_info().currsize == 0]
    try:
        yield
    finally:
        for cache in caches:
            cache.cache_clear()
        if caches:
            gc.collect()  # a face closes its file when it is collected
