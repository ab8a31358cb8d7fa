"""The sanity checks and their registry.

A check is one module of this package that defines ``CHECK`` (or ``CHECKS``, several checks from
one parameterised definition) as :class:`~audit.checks.base.Check` objects. The registry finds
them by scanning the package, so adding a check adds a module; the configuration, the runner,
the verdict table, the CLI's ``--tests`` and the report all read :data:`CHECKS`.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from attributions.errors import unknown_name
from audit.checks.base import Check, MedianScore, UnitResult, VerdictCell, VerdictRule
from audit.checks.convergence import chain_convergence
from audit.checks.coverage import coverage
from audit.checks.data_randomization import data_randomization
from audit.checks.emprt import efficient_mprt
from audit.checks.input_invariance import input_invariance
from audit.checks.options import Option, Options, UnitContext, option
from audit.checks.random_logit import random_logit_test
from audit.checks.randomization import parameter_randomization, randomization_with_maps
from audit.checks.smprt import smooth_mprt
from audit.checks.stage_options import StageSettings
from audit.checks.stages import randomization_plan
from audit.errors import ConfigError

# modules of this package that hold no check
_SUPPORT = {"base", "passes", "stages", "reinit", "coverage", "options", "stage_options"}


def discover(package: str, path: list[str]) -> dict[str, Check[Any]]:
    """The checks defined by the modules of ``package`` (found on ``path``), in registry order.

    Parameters
    ----------
    package : str
        The dotted name the modules are imported under (``audit.checks``).
    path : list of str
        The folders holding its modules (the package's ``__path__``). Every module found there is
        imported except the support modules (``base``, ``passes``, ``stages``, ...); each contributes its
        ``CHECK``, or the checks in its ``CHECKS``, or none.

    Returns
    -------
    dict
        Check name -> :class:`~audit.checks.base.Check`, ordered by ``(order, name)``.

    Raises
    ------
    RuntimeError
        When two checks share a name.
    """
    found: list[Check[Any]] = []
    for info in pkgutil.iter_modules(path):
        if info.name in _SUPPORT:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        found += [module.CHECK] if hasattr(module, "CHECK") else list(getattr(module, "CHECKS", []))
    names = [c.name for c in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two checks share a name: {sorted(names)}")
    return {c.name: c for c in sorted(found, key=lambda c: (c.order, c.name))}


CHECKS: dict[str, Check[Any]] = discover(__name__, list(__path__))


def get_check(name: str) -> Check[Any]:
    """The registered check ``name`` (a ``--tests`` name), or a :class:`ConfigError` naming the valid ones.

    Parameters
    ----------
    name : the check's name, as ``--tests`` spells it (``random-logit``, ``cascading``, ...)
    """
    if name not in CHECKS:
        raise unknown_name("test", name, CHECKS, ConfigError)
    return CHECKS[name]


def check_options() -> dict[str, Option]:
    """Every configuration key the registered checks read (one entry per name, in registry order)."""
    out: dict[str, Option] = {}
    for check in CHECKS.values():
        for declared in check.options.declared():
            if declared.name in out and out[declared.name].default != declared.default:
                raise RuntimeError(f"checks disagree on the default of option {declared.name!r}")
            out.setdefault(declared.name, declared)
    return out


__all__ = ["CHECKS", "Check", "MedianScore", "Option", "Options", "StageSettings", "UnitContext", "UnitResult",
           "VerdictCell", "VerdictRule", "chain_convergence", "check_options", "coverage", "data_randomization",
           "discover", "efficient_mprt", "get_check", "input_invariance", "option", "parameter_randomization",
           "random_logit_test", "randomization_plan", "randomization_with_maps", "smooth_mprt"]
