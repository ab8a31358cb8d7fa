"""A check's options, declared once: a frozen dataclass per check whose fields carry their help and rule.

Each field is declared with :func:`option` (default, help, choices or a validity rule, in one place). From
those declarations come the command line's flags, the TOML keys, the manifest's configuration, the methods
text and the validation of every value (:meth:`Options.declared`); a check's unit, verdict and report receive
an instance of its own class (:meth:`Options.parse`), never the whole configuration. Keys are flat: a key two
checks share (the randomization checks' ``bn``) is one field of a common base class.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from torch import nn

from audit.errors import ConfigError

if TYPE_CHECKING:
    from audit.models.shortcut_twins import ShortcutPair

OptionsT = TypeVar("OptionsT", bound="Options")


@dataclass(frozen=True)
class Option:
    """A configuration key a check reads: its default, its help text, and what values are valid.

    Parameters
    ----------
    name : the key (TOML and manifest; ``--name-with-dashes`` on the command line)
    default : its value when not given; its type is the key's type (an int is widened to a float default)
    help : what it sets, for the command line and the methods text
    choices : the allowed values, when they are a fixed set
    valid : a predicate for numbers (e.g. ``lambda v: 0 < v <= 1``)
    rule : the predicate's wording in the error
    source : where a threshold's default comes from: a citation, a calibration measured in the run, or
        :data:`NO_SOURCE` with what shows its effect instead (every verdict threshold declares one)
    kind : the value's type where the default does not show it: a key whose default is None (None is then valid
        too), or ``object`` for a key whose value its own normalisation checks (a list, a table)
    """

    name: str
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    valid: Callable[[Any], bool] | None = None
    rule: str = ""
    source: str = ""
    kind: type | None = None

    def check(self, value: Any) -> Any:
        """``value`` (an int widened to float where the default is a float), or a :class:`ConfigError`."""
        if value is None and self.default is None:
            return value
        kind = self.kind or type(self.default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is bool and not isinstance(value, bool):
            raise ConfigError(f"{self.name} must be true or false, got {value!r}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{self.name} must be a {kind.__name__}, got {value!r} ({type(value).__name__})")
        if self.choices and value not in self.choices:
            raise ConfigError(f"invalid {self.name}={value!r}; valid: {', '.join(map(str, self.choices))}")
        if self.valid is not None and not self.valid(value):
            raise ConfigError(f"invalid {self.name}={value!r}: it must be {self.rule}")
        return value


# the source of a threshold that has none: the report's sensitivity table shows which outcomes it decides
NO_SOURCE = "none: not derived from the model or a paper; the report's sensitivity table shows the outcomes it decides"


def option(default: Any, help: str, *, choices: tuple[Any, ...] = (), valid: Callable[[Any], bool] | None = None,
           rule: str = "", source: str = "") -> Any:
    """A field of an :class:`Options` class: its default and what :class:`Option` says of it.

    Parameters
    ----------
    default : Any
        The key's value when not given; its type is the key's type (an int given for a float default is
        widened).
    help : str
        What the key sets, for the command line and the methods text.
    choices : tuple, default ()
        The allowed values, when they are a fixed set (also the command line's choices).
    valid : callable, optional
        A predicate the value must satisfy (e.g. ``lambda v: 0 < v <= 1``).
    rule : str, default ""
        ``valid`` in words, for the error message (e.g. ``"in (0, 1]"``).
    source : str, default ""
        Where a threshold's default comes from (:attr:`Option.source`).

    Returns
    -------
    dataclasses.Field
        A field with ``default`` and, in its metadata, ``help``, ``choices``, ``valid`` and ``rule``;
        :meth:`Options.declared` turns it into an :class:`Option`.
    """
    return field(default=default, metadata={"help": help, "choices": tuple(choices), "valid": valid, "rule": rule,
                                            "source": source})


CONFIDENCE = 0.99  # the level of a verdict's interval in a run of one look and a few readings
FAMILY_ERROR = 0.05  # the most a method's verdict may be wrongly rejected, over every reading of every check run
# The percentile bootstrap's one-sided error (an interval wholly on one side of the true median) measured at most
# this many times its nominal (1 - level) / 2 on 16 to 64 images, over skewed, tied, discrete and heavy-tailed
# scores and seed spreads (tests/reports/test_verdict.py): what the family-wise bound multiplies.
INFLATION = 3.0
SMALLEST_LOOK = 16  # the fewest images of a look of a sequential run: the bound above is measured from 16 on


def one_sided_error(level: float) -> float:
    """The one-sided error of an interval at ``level``, as bounded by simulation: :data:`INFLATION` x (1 - level)/2."""
    return INFLATION * (1 - level) / 2


def look_level(looks: int, family: int = 1) -> float:
    """The level of one look's interval in a design of ``looks`` looks, in a run whose checks read ``family``
    rejecting intervals per method in all: the largest level of :data:`CONFIDENCE` and the level at which ``family``
    readings keep a method's family-wise error at :data:`FAMILY_ERROR` (Bonferroni: each reading's one-sided error,
    :func:`one_sided_error`, at most FAMILY_ERROR / family), then split over the looks (Bonferroni), so that a
    decision taken at any look keeps the error of one interval of a run of one look."""
    return 1 - min(1 - CONFIDENCE, 2 * FAMILY_ERROR / (INFLATION * family)) / looks


@dataclass(frozen=True)
class Options:
    """The options of a check (a check without options has this class itself).

    Parameters
    ----------
    looks : not a key of its own: how many times the run's sequential design reads a verdict (``max_images``
        over ``n_images``, :class:`~audit.run.config.AuditConfig`); each look's interval is at
        :attr:`interval_level`
    family : not a key of its own: how many rejecting intervals the run's checks read per method in all
        (:attr:`~audit.run.config.AuditConfig.family`), over which the family-wise error is held
    """

    looks: int = field(default=1, metadata={"derived": True})
    family: int = field(default=1, metadata={"derived": True})

    @property
    def interval_level(self) -> float:
        """The level of a verdict's interval at one look (:func:`look_level` of :attr:`looks` and :attr:`family`)."""
        return look_level(self.looks, self.family)

    @classmethod
    def declared(cls) -> tuple[Option, ...]:
        """The declarations of the fields, in their order (a base class's first); ``looks`` is not one."""
        return tuple(Option(f.name, f.default, **f.metadata) for f in dataclasses.fields(cls)
                     if not f.metadata.get("derived"))

    @classmethod
    def parse(cls: type[OptionsT], values: Mapping[str, Any], looks: int = 1, family: int = 1) -> OptionsT:
        """The options from a configuration's flat keys (the others ignored; a missing one takes its default),
        each value checked (:meth:`Option.check`), read ``looks`` times by the run's design, in a ``family`` of
        rejecting intervals."""
        return cls(looks=looks, family=family, **{o.name: o.check(values.get(o.name, o.default))
                                                  for o in cls.declared()})


@dataclass(frozen=True)
class UnitContext:
    """What every unit receives besides its check's options.

    Parameters
    ----------
    seed : the run's seed (each unit's global seed is set from it and the unit's key by the runner)
    heatmap_examples : how many of the unit's first images keep their raw heatmaps for the report
    progress : whether to show progress bars
    twins : the model's permuted-label twins, one per pair, for a check that needs them (else empty)
    controls : the model's control twins (the twins' recipe on the true labels), one per pair (else empty)
    first_image : the run's index of the unit's first image (a block's start): what a check that shares seeds out
        over the images reads, so that a block's images keep the seeds they have in the whole run
    params : {method: {name: value}}, the parameters the run gives each method's explainers (the pattern methods'
        patterns and the data they are fitted on), passed on by the check to every explainer it builds
    shortcut : the model's shortcut twin and tag control twin, their tag and gate, for a check that reads them
        (:class:`~audit.models.shortcut_twins.ShortcutPair`; else None)
    """

    seed: int = 0
    heatmap_examples: int = 0
    progress: bool = False
    twins: tuple[nn.Module, ...] = ()
    controls: tuple[nn.Module, ...] = ()
    first_image: int = 0
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    shortcut: ShortcutPair | None = None
