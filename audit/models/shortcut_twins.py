"""Shortcut twins: the models of the planted-shortcut check, and the gate that says the shortcut is there.

``train --shortcut SPEC`` trains two twins of one architecture with one recipe and training subset, from two seeds:
the *shortcut twin* sees the tag (:class:`~audit.data.tags.Tag`) on a share of the training images of its class c* (and, with
``relabel``, on a few of the other classes' images, labelled c*); the *tag control twin* sees it on as many images
drawn from every class, with their own labels. Each records its tag, its role and its gate figures
in its metadata (``shortcut``): the *shortcut score*, the share of the other classes' test images it predicts c*
once tagged, and its clean test accuracy.

The check reads a pair only if the shortcut is known to be planted (:func:`gate`): the shortcut twin's score at
least :data:`LINKED`, the control's at most :data:`UNLINKED`, their clean test accuracies within
:data:`ACCURACY_GAP`. A pair that misses it leaves the check inconclusive ("shortcut not planted"): a map cannot be
blamed for missing a reliance the model does not have.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from audit.data.preprocess import Preprocess, preprocess_from
from audit.data.tags import ROLES, Tag
from audit.errors import ConfigError
from audit.models.splits import ArraySplit, StreamSplit, TaggedSplit, accuracy, relabelled

# the gate of the protocol (DESIGN 3.3e): the shortcut twin predicts c* on most tagged images of other classes (the
# reliance is known), the control twin on almost none (the tag's presence alone does not move it), and the tag
# costs neither twin its clean accuracy (they learned the same task)
LINKED = 0.85
UNLINKED = 0.10
ACCURACY_GAP = 0.02


def shortcut_score(model: nn.Module, test: ArraySplit | StreamSplit, tag: Tag, preprocess: Preprocess | None = None,
                   batch_size: int = 250) -> float:
    """The share of the test images of classes other than ``tag.target`` that ``model`` predicts ``tag.target``
    once tagged (NaN where the test split has no other class's image).

    Parameters
    ----------
    model : in eval mode for the passes, its mode restored
    test : the test split, (N,) labels
    tag : the tag, pasted as the model reads its inputs (``preprocess``)
    """
    others = np.flatnonzero(test.y != tag.target)
    if not len(others):
        return float("nan")
    relinked = relabelled(test, others, np.full(len(others), tag.target, dtype=np.int64))
    return accuracy(model, TaggedSplit(relinked, np.ones(len(others), dtype=bool), tag, preprocess), batch_size)


def shortcut_record(tag: Tag, role: str, tagged: int, tag_seed: int, score: float | None) -> dict[str, Any]:
    """A shortcut twin's ``shortcut`` metadata: its tag, role, how many training images carried the tag, the seed
    that drew them (the control's), and its shortcut score (None without a test split)."""
    return {"tag": tag.to_dict(), "role": role, "tagged_images": tagged, "tag_seed": tag_seed, "score": score}


@dataclass(frozen=True)
class Gate:
    """Whether a pair of shortcut twins has its shortcut planted, and the figures that say so.

    Attributes
    ----------
    planted : bool
        Every condition met.
    text : str
        The figures against the conditions, and the first one missed.
    figures : dict
        ``shortcut_score``, ``control_score``, ``shortcut_accuracy``, ``control_accuracy`` (NaN: not recorded).
    """

    planted: bool
    text: str
    figures: dict[str, float]


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else float("nan")


def gate(shortcut: dict[str, Any], control: dict[str, Any]) -> Gate:
    """The gate of a pair from the two twins' metadata (``shortcut``: the shortcut twin's).

    The shortcut score of the shortcut twin at least :data:`LINKED`, the control twin's at most :data:`UNLINKED`,
    and their clean test accuracies within :data:`ACCURACY_GAP`; the two of one tag, with the roles they claim.
    """
    records: list[dict[str, Any]] = [m["shortcut"] if isinstance(m.get("shortcut"), dict) else {}
                                     for m in (shortcut, control)]
    figures = {"shortcut_score": _number(records[0].get("score")), "control_score": _number(records[1].get("score")),
               "shortcut_accuracy": _number(shortcut.get("test_accuracy")),
               "control_accuracy": _number(control.get("test_accuracy"))}
    gap = abs(figures["shortcut_accuracy"] - figures["control_accuracy"])
    said = (f"shortcut score {figures['shortcut_score']:.3f} on the shortcut twin (at least {LINKED}) and "
            f"{figures['control_score']:.3f} on the control twin (at most {UNLINKED}); clean test accuracies "
            f"{figures['shortcut_accuracy']:.3f} and {figures['control_accuracy']:.3f} (within {ACCURACY_GAP})")
    missed = [why for why, bad in (
        ("the two twins are not a shortcut twin and its tag control twin",
         [r.get("role") for r in records] != list(ROLES)),
        ("the two twins were trained with different tags", records[0].get("tag") != records[1].get("tag")),
        ("the shortcut twin does not use the tag", not figures["shortcut_score"] >= LINKED),
        ("the control twin reacts to the tag", not figures["control_score"] <= UNLINKED),
        ("the tag changed what the twins learned", not gap <= ACCURACY_GAP + 1e-12)) if bad]
    return Gate(not missed, said + ("" if not missed else f": not planted ({missed[0]})"), figures)


@dataclass(frozen=True)
class ShortcutPair:
    """A model's shortcut twin and tag control twin, as an audit reads them: their specs, the models, their tag,
    the gate and the normalisation the tag's values go through (the twins' training images').

    Attributes
    ----------
    specs : (shortcut twin, tag control twin) as given or found
    models : the two loaded twins, in that order
    tag : the tag both were trained with
    gate : :func:`gate` of their metadata
    preprocess : the normalisation their training images had (None: inputs in [0, 1])
    """

    specs: tuple[str, str]
    models: tuple[nn.Module, nn.Module]
    tag: Tag
    gate: Gate
    preprocess: Preprocess | None = None

    def to(self, device: Any) -> ShortcutPair:
        """The pair with both twins on ``device``."""
        return dataclasses.replace(self, models=(self.models[0].to(device), self.models[1].to(device)))

    def record(self) -> dict[str, Any]:
        """What the manifest keeps of the pair: the twins, the tag, the gate's figures and outcome."""
        return {"shortcut": self.specs[0], "tag_control": self.specs[1], "tag": self.tag.to_dict(),
                "planted": self.gate.planted, "gate": self.gate.text, **self.gate.figures}


def pair_specs(given: str | list[str]) -> tuple[str, str]:
    """The two twins' specs from what an audit is given: the ``--out`` of ``train --shortcut`` (``OUT`` names
    ``OUT-shortcut.pt`` and ``OUT-tag-control.pt``), or the two, the shortcut twin first."""
    if isinstance(given, str):
        stem = given.removesuffix(".pt")
        return f"{stem}-shortcut.pt", f"{stem}-tag-control.pt"
    if len(given) != 2:
        raise ConfigError(f"shortcuts takes the --out of train --shortcut, or two twins (the shortcut twin, then the "
                          f"tag control twin), got {len(given)}: {given}")
    return given[0], given[1]


def shortcut_pair(specs: tuple[str, str], models: tuple[nn.Module, nn.Module]) -> ShortcutPair:
    """The pair of the loaded twins ``models`` (named ``specs``): its tag from their metadata (the same on both, or a
    :class:`ConfigError`), its gate, and the normalisation of their training images."""
    metas = [getattr(m, "metadata", None) or {} for m in models]
    records = [m.get("shortcut") for m in metas]
    for spec, record in zip(specs, records):
        if not isinstance(record, dict) or "tag" not in record:
            raise ConfigError(f"{spec} records no tag: it is not a shortcut twin; train the pair with "
                              "attribution-audit train --shortcut SPEC")
    tags = [Tag.from_dict(r["tag"]) for r in records if isinstance(r, dict)]
    if tags[0] != tags[1]:
        raise ConfigError(f"{specs[0]} and {specs[1]} were trained with different tags ({tags[0].spec} and "
                          f"{tags[1].spec}): train the pair together (train --shortcut SPEC)")
    data = metas[0].get("data") if isinstance(metas[0].get("data"), dict) else {}
    preprocess = preprocess_from(data["preprocess"]) if isinstance(data, dict) and data.get("preprocess") else None
    return ShortcutPair(specs, models, tags[0], gate(metas[0], metas[1]), preprocess)
