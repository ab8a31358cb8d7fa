"""What the machine has free: the memory a run may use, read when it is asked for."""
from __future__ import annotations

import torch

from audit.errors import ConfigError


def available_bytes(device: torch.device) -> int:
    """Free GPU memory of ``device``, or the RAM the kernel reports available (MemAvailable)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise ConfigError("cannot read the available memory (/proc/meminfo); give --max-memory")
