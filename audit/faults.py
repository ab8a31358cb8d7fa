"""A fault the runner and the trainer inject into themselves when the environment asks: the kill points of the
resume tests, at the same place of a run on any machine, however fast.

``AUDIT_KILL_AFTER_UNITS=k`` sends SIGKILL to the process right after it wrote its k-th unit (or
block) file; ``k@r`` only in rank ``r`` of a sharded run. ``AUDIT_KILL_AFTER_STEPS=k`` sends it to a training
run right after it saved its resume state at its k-th optimizer step (counted from the first epoch). Unset,
nothing happens.
"""
from __future__ import annotations

import os
import signal

KILL_AFTER_UNITS = "AUDIT_KILL_AFTER_UNITS"
KILL_AFTER_STEPS = "AUDIT_KILL_AFTER_STEPS"


def kill_point(written: int, rank: int = 0) -> None:
    """Kill this process if ``written`` (units this process has written so far) is the count that
    :data:`KILL_AFTER_UNITS` names for this ``rank``."""
    spec = os.environ.get(KILL_AFTER_UNITS, "").strip()
    if not spec:
        return
    count, _, at_rank = spec.partition("@")
    if written == int(count) and (not at_rank or int(at_rank) == rank):
        os.kill(os.getpid(), signal.SIGKILL)


def kill_after_step(step: int) -> None:
    """Kill this process if ``step`` (the training run's optimizer steps so far, its state just saved) is the one
    :data:`KILL_AFTER_STEPS` names."""
    spec = os.environ.get(KILL_AFTER_STEPS, "").strip()
    if spec and step == int(spec):
        os.kill(os.getpid(), signal.SIGKILL)
