"""The audit runner: models x checks x methods as resumable units, tidy tables, a manifest.

A run is three steps: :func:`~audit.run.plan.plan` checks and decides everything before the folder is touched
(a frozen :class:`~audit.run.plan.Run`), :func:`~audit.run.execute.execute` computes the units and returns what
it did (a :class:`~audit.run.ledger.Ledger`), :func:`~audit.run.finish.finish` reads both, joins the units and
writes the manifest. Each unit (one model, one check, one method)
is computed with its own seed and written atomically to ``DIR/units/<model>/<test>/<method>.csv``; ``resume``
skips the units already written, so a run killed at any point finishes with the same files as an uninterrupted
one. What a unit computes, and how it is summarised, is the check's (:mod:`audit.checks`).
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable

from attributions.errors import ToolkitWarning
from audit.run.config import AuditConfig
from audit.run.distributed import SINGLE, Shard
from audit.run.execute import execute
from audit.run.finish import finish
from audit.run.hygiene import untouched
from audit.run.plan import opened, plan
from audit.run.results import AuditResult


def run_audit(config: AuditConfig, out: str | os.PathLike[str] = "audit-report", resume: bool = False,
              progress: bool = True, log: Callable[[str], None] = print, shard: Shard = SINGLE) -> AuditResult:
    """Run every unit of ``config`` into ``out`` and join the results (see the module docstring).

    Parameters
    ----------
    config : the audit's configuration (:func:`audit.run.config.load_config`)
    out : the run's folder; refused when it holds anything but this run's files
    resume : continue the run in ``out``: the units already written are kept (same configuration, inputs and
        software, else a :class:`~audit.errors.ConfigError`)
    progress : show progress bars (else one line per unit goes to ``log``)
    log : where the run's lines go
    shard : this process's share of a run over several (:mod:`audit.run.distributed`); the files are the same
        as one process's

    Returns
    -------
    AuditResult : the joined tables, the configuration and the manifest

    The caller's process is left as it was: its global RNG state, its environment, no thread left running
    (:func:`audit.run.hygiene.untouched`).
    """
    with untouched():
        warnings.simplefilter("ignore", ToolkitWarning)  # the run says each itself: in its log, manifest and report
        run = plan(config, out, resume=resume, shard=shard, log=log)
        with opened(run):
            ledger = execute(run, progress=progress)
            return finish(run, ledger)
