"""What the machine has free: the memory a run may use, read when it is asked for."""
from __future__ import annotations

import torch

from attributions import memory
from audit.errors import ConfigError


def available_bytes(device: torch.device) -> int:
    """Free GPU memory of ``device``, or the RAM the kernel reports available (MemAvailable)
    (:func:`attributions.memory.available_bytes`); a :class:`ConfigError` where it cannot be read."""
    free = memory.available_bytes(device)
    if free is None:
        raise ConfigError("cannot read the available memory (/proc/meminfo); give --max-memory")
    return free
