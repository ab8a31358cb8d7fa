"""What a run's execution did, as :func:`audit.run.execute.execute` returns it and :func:`audit.run.finish.finish`
reads it: the work items of the run, the time and peak memory of each unit this process computed, and the models
it placed on the device."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from audit.run.distributed import Shard
from audit.run.placement import Placement
from audit.run.units import WorkItem


@dataclass(frozen=True, kw_only=True)
class Ledger:
    """One process's account of a run's execution.

    Attributes
    ----------
    items : the run's work items, in their order (a sequential run's: each look's, as the looks went)
    timings : {unit key: seconds} of the units this process computed
    peaks : {unit key: peak memory in MiB, None where unmeasured} of those units
    placed : the models this process has on the device (placed on first use)
    """

    items: tuple[WorkItem, ...]
    timings: Mapping[str, float]
    peaks: Mapping[str, float | None]
    placed: Placement

    def gathered(self, shard: Shard) -> Ledger:
        """The ledger with every process's timings and peaks (every process calls it: a collective)."""
        timings = {k: v for part in shard.gather(dict(self.timings)) for k, v in part.items()}
        peaks = {k: v for part in shard.gather(dict(self.peaks)) for k, v in part.items()}
        return Ledger(items=self.items, timings=timings, peaks=peaks, placed=self.placed)
