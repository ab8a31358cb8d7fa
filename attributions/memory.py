"""A byte budget for the explainer's passes, and how many images or vectors fit in it.

A backward pass with K vectors holds K signals as large as the forward pass's values, so a
batched pass over B images and K vectors costs about ``B * (1 + K) * bytes per image``. Under a
budget (:func:`limit`) the explainer splits its passes: the K vectors into chunks that share one
forward pass, and the images into chunks each with its own forward pass. Each image's and each
vector's signal is computed by the same operations whatever the chunk, so the maps agree with
one batched pass up to the rounding of the batched kernels, which pick their blocking by batch
size (about 1e-6 relative on the CPU, ``tests/attributions/test_memory.py``): a run is
reproducible bit for bit under the same budget.

Every call computes under a budget: the one :func:`limit` sets (a run sets its ``--max-memory``), else
:func:`default_budget`, half of the memory available when this process first sized a pass (the command line's
default too); ``limit(None)`` lifts it, and nothing is split. ``Explainer(..., max_memory=...)`` sets one for an
explainer's own calls.
"""
from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar, cast

import torch

from attributions.errors import AttributionError

_DEFAULT = -1  # the ContextVar's "no limit set": the default budget applies
_BUDGET: ContextVar[int | None] = ContextVar("attribution_memory_budget", default=_DEFAULT)
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}
MIN_SIZE = 64 * 2**20  # below this even one small image's pass does not fit: a typo, most likely


def parse_size(text: str | int) -> int:
    """Bytes in a size such as "4GB", "512 MB", "1.5GiB" or 1073741824 (powers of 1024), at least 64 MiB."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise AttributionError(f"max_memory must be a size such as 4GB or 512MB, got {text!r}")
    nbytes = int(float(match.group(1)) * _UNITS[unit])
    if nbytes < MIN_SIZE:
        raise AttributionError(f"max_memory={text!r} is {nbytes} bytes; give at least 64MB (e.g. 4GB)")
    return nbytes


def available_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA ``device``, else the RAM the kernel reports available (MemAvailable); None where
    it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with contextlib.suppress(OSError), open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


@functools.cache
def default_budget() -> int | None:
    """Half of the memory available when first asked in this process (and of the current CUDA device's free
    memory, where CUDA is in use), as a run's default; None where neither can be read. Read once, so that the
    passes of one process are split alike from call to call."""
    free = [b for b in (available_bytes(torch.device("cpu")),
                        available_bytes(torch.device("cuda")) if torch.cuda.is_initialized() else None)  # type: ignore[no-untyped-call]
            if b is not None]
    return min(free) // 2 if free else None


@contextlib.contextmanager
def limit(nbytes: int | str | None) -> Iterator[None]:
    """Within the block, the explainer's passes aim to hold at most ``nbytes`` (bytes, or a size such as
    "2GB"; None: no limit, nothing split)."""
    if isinstance(nbytes, str):
        nbytes = parse_size(nbytes)
    if nbytes is not None and nbytes <= 0:
        raise ValueError(f"a memory budget must be positive, got {nbytes} bytes")
    token = _BUDGET.set(nbytes)
    try:
        yield
    finally:
        _BUDGET.reset(token)


def budget() -> int | None:
    """The budget in force (bytes): :func:`limit`'s, else :func:`default_budget`; None under ``limit(None)``."""
    value = _BUDGET.get()
    return default_budget() if value == _DEFAULT else value


def is_set() -> bool:
    """Whether a :func:`limit` is in force (else the default applies)."""
    return _BUDGET.get() != _DEFAULT


def tensor_bytes(values: Any) -> int:
    """Bytes of every tensor in ``values`` (a forward pass's dict, with tuples and lists inside), each
    storage counted once."""
    seen: set[int] = set()
    total = 0
    stack = list(values.values()) if isinstance(values, dict) else [values]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            key = v.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += v.untyped_storage().nbytes()
        elif isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return total


def fitting(total: int, per_item: int | Callable[[], int], fixed: int = 0) -> int:
    """How many of ``total`` items fit in the budget beside ``fixed`` bytes when each costs ``per_item``
    (bytes, or a function measuring them, called only under a budget): between 1 (an item that does
    not fit alone still runs, alone) and ``total``; ``total`` without a budget."""
    nbytes = budget()
    if nbytes is None:
        return total
    cost = per_item() if callable(per_item) else per_item
    return total if cost <= 0 else max(1, min(total, (nbytes - fixed) // cost))


Joined = TypeVar("Joined", torch.Tensor, dict[Any, torch.Tensor])


def joined(parts: list[Joined], dim: int) -> Joined:
    """Chunk results joined along ``dim``: tensors, or dicts of tensors with the same keys."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], dict):
        return cast(Joined, {k: torch.cat([p[k] for p in parts], dim)
                             for k in parts[0]})
    return torch.cat(parts, dim)


def spans(total: int, size: int) -> list[tuple[int, int]]:
    """[start, stop) pairs covering ``range(total)`` in chunks of ``size``."""
    return [(i, min(i + size, total)) for i in range(0, total, max(1, size))]


def stand_in(value: torch.Tensor) -> torch.Tensor:
    """A stand-in for a value a pass has freed: its shape, dtype and device, one element of memory
    (strides 0); the rules that read only shapes take it in the value's place."""
    return value.new_zeros(()).expand(value.shape)


def is_stand_in(value: Any) -> bool:
    """Whether ``value`` is a :func:`stand_in` (a tensor of several elements on one of memory)."""
    return isinstance(value, torch.Tensor) and value.numel() > 1 and all(s == 0 for s in value.stride())


# values a pass for one backward keeps whatever the plan: freeing them saves little, and recomputing
# them or re-running their op costs the backward more per node than on large maps
SMALL = 1 << 20


def is_small(value: Any) -> bool:
    """Whether ``value`` holds less than :data:`SMALL` bytes (anything but a tensor counts as small)."""
    return not isinstance(value, torch.Tensor) or value.numel() * value.element_size() < SMALL
