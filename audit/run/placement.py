"""The run's models on its device, in this process: each moved there, and given the parameters the run gives its
methods (the pattern methods' patterns), the first time a unit of this process needs it.

The one piece of a run that changes as it goes, and only as a cache: what it holds depends on which units this
process computed (another process, or the run resumed, may have computed the rest), never what a unit computes.
"""
from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from audit.checks.passes import Params
from audit.models.shortcut_twins import ShortcutPair
from audit.run.patterns import pattern_params
from audit.run.plan import Run


class Placement:
    """The models of ``run`` on its device, placed on first use (module docstring)."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._models: dict[str, nn.Module] = {}
        self._twins: dict[str, tuple[nn.Module, ...]] = {}
        self._controls: dict[str, tuple[nn.Module, ...]] = {}
        self._shortcuts: dict[str, ShortcutPair] = {}
        self._params: dict[str, Params] = {}

    def model(self, spec: str) -> nn.Module:
        """Model ``spec`` on the run's device."""
        if spec not in self._models:
            run = self._run
            self._models[spec] = model = run.loaded[spec].to(run.device)
            self._params[spec] = pattern_params(list(run.config.methods), spec, model, run.labels[spec], run.patterns,
                                                run.config.pattern_data, weights=run.config.weights, out=run.out)
        return self._models[spec]

    def every(self) -> dict[str, nn.Module]:
        """{model spec: the model on the device} for every model of the run, in the run's order."""
        return {spec: self.model(spec) for spec in self._run.config.models}

    def params(self, spec: str) -> Params:
        """The parameters the run gives the methods of model ``spec``, {method: {name: value}}."""
        self.model(spec)
        return self._params[spec]

    def twins(self, spec: str) -> tuple[tuple[nn.Module, ...], tuple[nn.Module, ...]]:
        """(permuted-label twins, control twins) of model ``spec`` on the run's device, one of each per pair; empty
        for a role it lacks."""
        run = self._run
        placed = []
        for specs, loaded, cache in ((run.twin_specs, run.twin_models, self._twins),
                                     (run.control_specs, run.control_models, self._controls)):
            if spec in specs and spec not in cache:
                cache[spec] = tuple(m.to(run.device) for m in loaded[spec])
            placed.append(cache.get(spec, ()))
        return placed[0], placed[1]

    def shortcut(self, spec: str) -> ShortcutPair | None:
        """The shortcut twins of model ``spec`` on the run's device; None where it has none."""
        pair = self._run.shortcuts.get(spec)
        if pair is not None and spec not in self._shortcuts:
            self._shortcuts[spec] = pair.to(self._run.device)
        return self._shortcuts.get(spec)

    @property
    def given(self) -> Mapping[str, Params]:
        """{model spec: its methods' parameters}, for the models placed so far."""
        return self._params
