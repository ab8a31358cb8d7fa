"""Memory for a run: the budget the explainer's passes are held to, the peak each unit used, and
how the process's allocator keeps freed memory.

The budget (``max_memory``: "4GB", "512MB", or None for half of what is available now: free RAM,
or free GPU memory for ``device="cuda"``) is resolved once when a run starts and recorded in its
manifest; ranks and resumed runs use that recorded value, so the passes are chunked alike and the
numbers are the same (:mod:`attributions.memory`).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attributions import memory
from attributions.errors import AttributionError
from audit.errors import ConfigError
from audit.host import available_bytes

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(mmap_threshold: int = 32 * 2**20, trim_threshold: int = 128 * 2**20) -> bool:
    """Have glibc's allocator keep freed memory for the next allocations; True where it applied.

    By default glibc maps every block over a threshold afresh and returns freed memory at the top
    of the heap to the system, so each pass over the same shapes faults its pages in again. An
    attribution pass holds its whole forward pass (shared by the methods) and frees it at once, so
    that cost is large: up to 1.4x the pass on 160 images of 28 x 28 (``benchmarks/audit_speed.py``).
    Here blocks under ``mmap_threshold`` come from the heap and up to ``trim_threshold`` free bytes
    stay at its top: freed blocks are reused. Numbers do not change; resident memory may stay up to
    ``trim_threshold`` higher. The command line applies it; ``AUDIT_SYSTEM_MALLOC=1`` leaves the
    allocator alone. Off glibc (or with that variable set) nothing happens and False is returned.
    """
    if os.environ.get("AUDIT_SYSTEM_MALLOC", "") not in ("", "0"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def parse_size(text: str) -> int:
    """Bytes in a size such as "4GB", "512 MB", "1.5GiB" or "1073741824" (powers of 1024):
    :func:`attributions.memory.parse_size`, its error a :class:`ConfigError`."""
    try:
        return memory.parse_size(text)
    except AttributionError as exc:
        raise ConfigError(str(exc)) from None


def budget_bytes(max_memory: str | None, device: torch.device) -> int:
    """The run's budget: ``max_memory`` parsed, or half of the memory available now."""
    return parse_size(max_memory) if max_memory is not None else available_bytes(device) // 2


@dataclass
class Peak:
    """The peak memory of the last block measured by :meth:`track`, in bytes: resident memory of
    this process (Linux's VmHWM, reset before the block) or allocated GPU memory."""

    device: torch.device
    nbytes: int | None = field(default=None)

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_resident_peak()
        yield
        self.nbytes = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" \
            else _resident_peak()


def _reset_resident_peak() -> None:
    with contextlib.suppress(OSError):  # not Linux, or not allowed: the peak then counts from the start
        Path("/proc/self/clear_refs").write_text("5")


def _resident_peak() -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None
