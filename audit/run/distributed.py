"""Sharding a run over processes with torch.distributed (gloo on CPU, nccl on GPU).

The units of a run are independent and each is seeded by its own key, so ranks split them and
the files are those of one process: rank r computes the units whose index i in the run's fixed
order has ``i % world == r``, writes them atomically, and rank 0 (the lead) checks the folder,
holds the lock, writes the manifest and joins the results once every rank is done. Started by
``torchrun --nproc-per-node N -m audit run ...`` (several nodes: torchrun's ``--nnodes``,
``--node-rank``, ``--rdzv-endpoint``), or by ``attribution-audit run --workers N``, which starts
the same through torch's launcher.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from audit.errors import ConfigError


@dataclass(frozen=True)
class Shard:
    """This process's place among ``world`` processes (``rank`` 0 leads)."""

    rank: int = 0
    world: int = 1

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def mine(self, index: int) -> bool:
        """Whether the unit at ``index`` of the run's order is this rank's."""
        return index % self.world == self.rank

    def barrier(self) -> None:
        """Wait until every rank gets here (nothing to wait for alone)."""
        if self.world > 1:
            dist.barrier()

    def gather(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        """``value`` of every rank, in rank order (on every rank)."""
        if self.world == 1:
            return [value]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value)
        return out


SINGLE = Shard()


def from_environment(device: str = "cpu") -> Shard:
    """The shard torchrun describes in the environment (``RANK``, ``WORLD_SIZE``), with its process
    group started (nccl for ``device="cuda"``, gloo otherwise); one process without torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return SINGLE
    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" and torch.cuda.is_available() else "gloo"
        if device == "cuda" and torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return Shard(dist.get_rank(), dist.get_world_size())


@contextmanager
def sharded(device: str = "cpu") -> Iterator[Shard]:
    """:func:`from_environment` for the duration, the process group ended after it (every rank
    tears its gloo / nccl connections down itself, instead of at interpreter exit, where a rank
    still connected to one that already left can abort)."""
    shard = from_environment(device)
    try:
        yield shard
    finally:
        if shard.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def launch(workers: int, argv: Sequence[str]) -> int:
    """Run ``attribution-audit <argv>`` in ``workers`` processes on this machine through torch's
    launcher, started in a process of its own (:mod:`audit.run.launcher`): the caller's environment,
    thread count and signal handlers stay as they were. Returns 0, or raises a :class:`ConfigError`
    naming the failed rank."""
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    with tempfile.TemporaryDirectory(prefix="audit-launch-") as tmp:
        report = Path(tmp) / "failure.json"
        # the launcher's own temporary folders (torchelastic's logs) go in ours, removed with it
        scratch = Path(tmp) / "tmp"
        scratch.mkdir()
        env = {**os.environ, "TMPDIR": str(scratch)}
        proc = subprocess.Popen([sys.executable, "-m", "audit.run.launcher", str(report), str(workers), *argv], env=env)
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the launcher ends its ranks on SIGINT; wait for it rather than orphan them
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
        if code == 0:
            return 0
        failure = json.loads(report.read_text()) if report.exists() else {}
    if failure:
        rank = f"rank {failure['rank']}" if failure.get("rank") is not None else "a rank"
        raise ConfigError(f"{rank} of {workers} failed (exit code {failure.get('exitcode', '?')}); its error "
                          "is printed above; finished units are kept (--resume continues)")
    how = f"was killed by signal {-code}" if code < 0 else f"ended with exit code {code}"
    raise ConfigError(f"the launcher of the {workers} ranks {how}; finished units are kept (--resume continues)")
