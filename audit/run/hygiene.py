"""A library call leaves the caller's process as it found it: the global RNG, the environment, no thread.

An audit re-seeds torch's global generator for each unit, torch.export sets TORCHINDUCTOR_CACHE_DIR in the
environment, and every tqdm bar (disabled ones too) starts tqdm's monitor thread; :func:`untouched` undoes all
three when the call returns, however it returns.
"""
from __future__ import annotations

import contextlib
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
