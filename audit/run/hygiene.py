"""A library call leaves the caller's process as it found it: the global RNG, the environment, no thread.

An audit re-seeds torch's global generator for each unit, torch.export sets TORCHINDUCTOR_CACHE_DIR in the
environment, and every tqdm bar (disabled ones too) starts tqdm's monitor thread; :func:`untouched` undoes all
three when the call returns, however it returns. :func:`fonts_released` closes the font files matplotlib opened
for a report's figures (its font cache keeps each one open for the life of the process).
"""
from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

import torch
from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm

BARS = (tqdm, auto_tqdm)  # each class keeps its own monitor thread


@contextlib.contextmanager
def untouched() -> Iterator[None]:
    """Run the body, then restore torch's global RNG state (CPU and every CUDA device), the environment variables,
    and stop tqdm's monitor thread if the body started it and no bar is left."""
    environ = dict(os.environ)
    monitors = [bar.__dict__.get("monitor") for bar in BARS]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
        for bar, monitor in zip(BARS, monitors):
            started = bar.__dict__.get("monitor")
            if monitor is None and started is not None and not getattr(bar, "_instances", None):
                started.exit()
                bar.monitor = None


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
