"""Permuted-label twins: the model of the data-randomization test (Adebayo et al. 2018, section 5).

A twin has the architecture and recipe of the model it is the twin of, trained on the training labels
permuted once (``TrainConfig.permute_labels``) until it fits them. A shipped checkpoint's twin is the
shipped checkpoint whose metadata says ``twin_of`` it; any other model's twin is named by the user
(``AuditConfig.twins``). A pair is compared only if the two are the same architecture: the same module
class and the same parameter and buffer names and shapes.
"""
from __future__ import annotations

from torch import nn

from audit.errors import ConfigError
from audit.models.checkpoint import available_checkpoints, load_checkpoint
from audit.models.libraries import is_library_spec
from audit.models.training import TrainConfig


def shipped_twin(spec: str) -> str | None:
    """The shipped checkpoint trained as the permuted-label twin of the shipped model ``spec``, if any."""
    return next((name for name, meta in available_checkpoints().items() if meta.get("twin_of") == spec), None)


def twin_spec(spec: str, given: dict[str, str]) -> str | None:
    """The twin of the model ``spec``: the user's (``given``, model spec -> twin spec), else the shipped one.

    Parameters
    ----------
    spec : str
        The model as the configuration names it (a shipped name, a checkpoint path, a library model or
        ``module:factory``).
    given : dict
        Model spec -> twin spec, the user's pairs (``AuditConfig.twins``).

    Returns
    -------
    str or None
        The twin's spec; None when the user gives none and no shipped checkpoint is ``spec``'s twin
        (:func:`shipped_twin`).

    Raises
    ------
    ConfigError
        When the user's twin is a library model (``timm:``, ``torchvision:``, ``hf:``), which would load
        the model's own weights or fresh ones.
    """
    if spec in given:
        twin = given[spec]
        if is_library_spec(twin):
            raise ConfigError(f"the twin of {spec} is {twin!r}, a library model: it would load the model's own weights "
                              "(or fresh ones); give the twin as a checkpoint path or module:factory that loads its "
                              "weights")
        return twin
    return shipped_twin(spec)


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


def twin_facts(twin: nn.Module) -> dict:
    """What the report says of a twin: its training subset, label seed and accuracies (None where the twin
    carries no trainer metadata)."""
    meta = getattr(twin, "metadata", None) or {}
    data = meta.get("data", {}) if isinstance(meta.get("data"), dict) else {}
    return {"labels": data.get("labels"), "label_seed": data.get("label_seed"), "train_size": data.get("train_size"),
            "train_accuracy": meta.get("train_accuracy"), "test_accuracy": meta.get("test_accuracy"),
            "optimizer": meta.get("optimizer"), "epochs": meta.get("epochs")}


def twin_architecture(config: TrainConfig, twin_of: str) -> None:
    """Refuse to train the twin of checkpoint ``twin_of`` with another architecture than the checkpoint's.

    Parameters
    ----------
    config : TrainConfig
        The twin's training configuration; its ``arch`` is compared with the checkpoint's metadata
        (the architecture name only, not ``arch_options``).
    twin_of : str
        The checkpoint (shipped name or ``.pt`` path) the twin is trained for; it is loaded.

    Raises
    ------
    ConfigError
        When the architectures differ, or when ``config.permute_labels`` is None (a twin is trained on
        permuted labels).
    """
    model = load_checkpoint(twin_of)
    meta = getattr(model, "metadata", {})
    if meta.get("arch") != config.arch:
        raise ConfigError(f"--twin-of {twin_of}: that checkpoint is a {meta.get('arch')!r}, this run trains a "
                          f"{config.arch!r}; pass --arch {meta.get('arch')}")
    if config.permute_labels is None:
        raise ConfigError(f"--twin-of {twin_of} trains a permuted-label twin: add --permute-labels SEED")
