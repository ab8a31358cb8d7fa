"""Twins: the models of the data-randomization test (Adebayo et al. 2018, section 5).

A permuted-label twin has the architecture of the model it is the twin of, trained on the training labels
permuted once (``TrainConfig.permute_labels``) until it fits them. Its control twin is the same recipe (the same
subset, epochs and settings) on the true labels from another seed: how alike the model's maps and those of a
model that learned the same labels this way are, the reference the calibrated verdict reads the permuted twin
against. A shipped checkpoint's twins are the shipped checkpoints whose metadata say ``twin_of`` it (the role
from their labels); any other model's are named by the user (``AuditConfig.twins``, ``AuditConfig.controls``).
Twins are draws too (a training seed and a permutation): a model may have several pairs (the CNN and the VGG ship
three), the k-th permuted-label twin paired with the k-th control twin.
A pair is compared only if the two are the same architecture: the same module class and the same parameter and
buffer names and shapes.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attributions.errors import unknown_name
from audit.data.tags import ROLES as SHORTCUT_ROLES
from audit.errors import ConfigError
from audit.models.catalog import available_checkpoints
from audit.models.checkpoint import load_checkpoint, resolve_model
from audit.models.libraries import is_library_spec

# the data-randomization test's twins, then the planted-shortcut check's (:mod:`audit.models.shortcut_twins`)
ROLES = {"permuted": "permuted-label twin", "control": "control twin", **SHORTCUT_ROLES}


def twin_role(meta: dict[str, Any]) -> str:
    """A twin checkpoint's role (:data:`ROLES`) from its metadata: ``twin`` where recorded, else its labels."""
    data = meta.get("data")
    labels = data.get("labels") if isinstance(data, dict) else None
    return str(meta.get("twin") or ("permuted" if labels == "permuted" else "control"))


def _pair_order(name: str) -> tuple[int, str]:
    """How shipped twins of one model and role are ordered: ``cnn-permuted`` (pair 1), then ``cnn-permuted-2``..."""
    match = re.search(r"-(\d+)$", name)
    return (int(match.group(1)) if match else 1, name)


def shipped_twins(spec: str, role: str = "permuted") -> list[str]:
    """The shipped checkpoints trained as ``role`` twins (:data:`ROLES`) of the shipped model ``spec``, pair 1 first
    (``cnn-permuted``, ``cnn-permuted-2``, ...); empty when it has none.

    Parameters
    ----------
    spec : a shipped checkpoint's name
    role : ``permuted`` (the permuted-label twins) or ``control`` (the control twins, trained on the true labels)
    """
    if role not in ROLES:
        raise unknown_name("twin role", role, ROLES, ConfigError)
    return sorted((name for name, meta in available_checkpoints().items()
                   if meta.get("twin_of") == spec and twin_role(meta) == role), key=_pair_order)


def shipped_twin(spec: str, role: str = "permuted") -> str | None:
    """The first of :func:`shipped_twins` (the ``role`` twin of pair 1), if any.

    Parameters
    ----------
    spec : a shipped checkpoint's name
    role : ``permuted`` or ``control``
    """
    return next(iter(shipped_twins(spec, role)), None)


def twin_specs(spec: str, given: Mapping[str, str | Sequence[str]], role: str = "permuted") -> list[str]:
    """The ``role`` twins (:data:`ROLES`) of the model ``spec``, one per pair: the user's (``given``), else the
    shipped ones.

    Parameters
    ----------
    spec : str
        The model as the configuration names it (a shipped name, a checkpoint path, a library model or
        ``module:factory``).
    given : dict
        Model spec -> twin spec or list of twin specs (one per pair), the user's (``AuditConfig.twins`` for the
        permuted-label twins, ``AuditConfig.controls`` for the control twins).
    role : str, default "permuted"
        ``permuted`` or ``control``.

    Returns
    -------
    list of str
        The twins' specs in pair order; empty when the user gives none and no shipped checkpoint is ``spec``'s twin
        of that role (:func:`shipped_twins`).

    Raises
    ------
    ConfigError
        When a twin the user gives is a library model (``timm:``, ``torchvision:``, ``hf:``), which would load
        the model's own weights or fresh ones.
    """
    if spec not in given:
        return shipped_twins(spec, role)
    value = given[spec]
    twins = [value] if isinstance(value, str) else [str(t) for t in value]
    for twin in twins:
        if is_library_spec(twin):
            raise ConfigError(f"the {ROLES[role]} of {spec} is {twin!r}, a library model: it would load the model's "
                              "own weights (or fresh ones); give the twin as a checkpoint path or module:factory that "
                              "loads its weights")
    return twins


def same_architecture(model: nn.Module, twin: nn.Module, model_name: str, twin_name: str) -> None:
    """Refuse a pair whose architectures differ: another module class, or another parameter / buffer name or
    shape (the first difference named).

    Parameters
    ----------
    model : nn.Module
        The audited model.
    twin : nn.Module
        Its permuted-label twin.
    model_name, twin_name : str
        How the error names the two.

    Raises
    ------
    ConfigError
        When the two are of different classes, or their ``state_dict`` entries differ in name or shape
        (the first in sorted order named).
    """
    if type(model) is not type(twin):
        raise ConfigError(f"{twin_name} cannot be the twin of {model_name}: it is a {type(twin).__name__}, the model a "
                          f"{type(model).__name__}; the data-randomization test compares one architecture trained on "
                          "true and on permuted labels")
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in twin.state_dict().items()}
    for name in sorted(set(ours) | set(theirs)):
        if ours.get(name) != theirs.get(name):
            what = (f"{name} is missing from the twin" if name not in theirs else
                    f"the twin has {name}, the model does not" if name not in ours else
                    f"{name} is {list(ours[name])} in the model and {list(theirs[name])} in the twin")
            raise ConfigError(f"{twin_name} cannot be the twin of {model_name}: their architectures differ ({what}); "
                              "train the twin with the model's architecture (attribution-audit train --twin-of)")


def twin_facts(twin: nn.Module) -> dict[str, Any]:
    """What the report says of a twin: its training subset, label seed and accuracies, and whether it reached the
    training accuracy it was trained to (``fits``; None where it was not trained to one, or carries no trainer
    metadata)."""
    meta = getattr(twin, "metadata", None) or {}
    data = meta.get("data", {}) if isinstance(meta.get("data"), dict) else {}
    return {"labels": data.get("labels"), "label_seed": data.get("label_seed"), "train_size": data.get("train_size"),
            "train_accuracy": meta.get("train_accuracy"), "test_accuracy": meta.get("test_accuracy"),
            "optimizer": meta.get("optimizer"), "epochs": meta.get("epochs"), "seed": meta.get("seed"),
            "subset_seed": meta.get("subset_seed"), "fit_accuracy": meta.get("fit_accuracy"), "fits": meta.get("fits")}


def twin_architecture(twin: nn.Module, twin_of: str, num_classes: int | None = None) -> None:
    """Refuse to train ``twin`` as a twin of ``twin_of`` when their architectures differ (:func:`same_architecture`).

    Parameters
    ----------
    twin : nn.Module
        The model the run trains (freshly built).
    twin_of : str
        The model it is the twin of: a checkpoint (shipped name or ``.pt`` path) or a model specification
        (``timm:NAME``, ``torchvision:NAME``, ``hf:FOLDER``, ``module:factory``), built without its weights.
    num_classes : int, optional
        The classes of a library model's head (default: the library's).

    Raises
    ------
    ConfigError
        When the architectures differ: the first differing tensor named, and the option that trains the right one.
    """
    with torch.random.fork_rng(devices=[]):  # building the reference draws weights: the twin's seed stays its own
        if is_library_spec(twin_of) or (":" in twin_of and not Path(twin_of).exists()):
            reference, hint = resolve_model(twin_of, num_classes=num_classes if is_library_spec(twin_of) else None), \
                f"--model {twin_of}"
        else:
            reference = load_checkpoint(twin_of)
            meta = getattr(reference, "metadata", {})
            hint = f"--model {meta['model']}" if meta.get("model") else f"--arch {meta.get('arch')}"
    try:
        same_architecture(reference, twin, twin_of, "the model this run trains")
    except ConfigError as exc:
        raise ConfigError(f"--twin-of {twin_of}: {exc}; pass {hint} (and the model's --num-classes)") from None
