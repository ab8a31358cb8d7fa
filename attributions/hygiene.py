"""A library call leaves the caller's process as it found it.

The toolkit's public calls draw from torch's global generator (SmoothGrad's noise, an audit's per-unit seeds),
torch.export sets ``TORCHINDUCTOR_CACHE_DIR`` in the environment, every tqdm bar (a disabled one too) starts tqdm's
monitor thread, and a pass may switch gradients on or silence a warning. :func:`untouched` snapshots what a caller
can observe of that, runs the body, and puts it back however the body returns: torch's RNG (the CPU's and every
CUDA device's), the environment variables, tqdm's monitor thread, grad mode, the default dtype, the deterministic-
algorithms flags, torch's thread count and the warning filters. :func:`leaves_process_alone` wraps a public function
in it.

Only the outermost call snapshots: a public call made inside another (the units of an audit, the stages of a
randomization check) runs as it would without the wrapper, so that the draws inside a run follow one another as
they always did. For a caller this means that two calls in a row see the same generator state: SmoothGrad called
twice on the same input, without a draw of the caller's in between, gives the same map.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm

BARS = (tqdm, auto_tqdm)  # each class keeps its own monitor thread
F = TypeVar("F", bound=Callable[..., Any])
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("attributions_untouched", default=False)


@contextlib.contextmanager
def untouched() -> Iterator[None]:
    """Run the body, then restore what it changed of the process (module docstring); within another
    :func:`untouched`, just run the body."""
    if _INSIDE.get():
        yield
        return
    token = _INSIDE.set(True)
    environ = dict(os.environ)
    monitors = [bar.__dict__.get("monitor") for bar in BARS]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    grad, dtype, threads = torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_num_threads()
    deterministic = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=devices):
            yield
    finally:
        _INSIDE.reset(token)
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
        torch.set_grad_enabled(grad)
        if torch.get_default_dtype() != dtype:
            torch.set_default_dtype(dtype)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) \
                != deterministic:
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        for bar, monitor in zip(BARS, monitors):
            started = bar.__dict__.get("monitor")
            if monitor is None and started is not None and not getattr(bar, "_instances", None):
                started.exit()
                bar.monitor = None


def leaves_process_alone(function: F) -> F:
    """``function`` run within :func:`untouched`: a public call of the toolkit."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with untouched():
            return function(*args, **kwargs)
    return wrapper  # type: ignore[return-value]
