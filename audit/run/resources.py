"""Memory for a run: the budget the explainer's passes are held to, and the peak each unit used.

The budget (``max_memory``: "4GB", "512MB", or None for half of what is available now: free RAM,
or free GPU memory for ``device="cuda"``) is resolved once when a run starts and recorded in its
manifest; ranks and resumed runs use that recorded value, so the passes are chunked alike and the
numbers are the same (:mod:`attributions.memory`).
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from audit.errors import ConfigError

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}
_MIN = 64 * 2**20  # below this even one small image's pass does not fit: a typo, most likely


def parse_size(text: str) -> int:
    """Bytes in a size such as "4GB", "512 MB", "1.5GiB" or "1073741824" (powers of 1024)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(f"max_memory must be a size such as 4GB or 512MB, got {text!r}")
    nbytes = int(float(match.group(1)) * _UNITS[unit])
    if nbytes < _MIN:
        raise ConfigError(f"max_memory={text!r} is {nbytes} bytes; give at least 64MB (e.g. 4GB)")
    return nbytes


def available_bytes(device: torch.device) -> int:
    """Free GPU memory of ``device``, or the RAM the kernel reports available (MemAvailable)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise ConfigError("cannot read the available memory (/proc/meminfo); give --max-memory")


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
