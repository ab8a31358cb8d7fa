"""Checkpoints: a ``.pt`` state_dict beside a ``.json`` metadata file, written atomically.

The metadata says how to rebuild the model (``arch``, ``in_shape``, ``num_classes``,
``arch_options``) and how it was trained (optimizer, hyper-parameters, seed, data, accuracy).
"""
from __future__ import annotations

import importlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attributions.errors import unknown_name
from attributions.hygiene import leaves_process_alone
from attributions.validation import named, nonfinite_tensors
from audit.atomic import atomic_write, atomic_write_bytes
from audit.errors import ModelError
from audit.models.catalog import SHIPPED, available_checkpoints
from audit.models.cautions import caution
from audit.models.libraries import check_dtypes, is_library_spec, library_files, load_library_model, read_state, weights_file
from audit.models.zoo import build


def save_checkpoint(model: nn.Module, metadata: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``path`` (.pt, the state_dict) and its .json metadata, each atomically.

    Parameters
    ----------
    model : nn.Module
        Its ``state_dict`` is saved (``torch.save``) as detached CPU copies; the model is not changed.
    metadata : dict
        JSON-serialisable; written indented, keys sorted (the trainer's metadata: architecture,
        hyperparameters, data, accuracies, history).
    path : str or PathLike
        The checkpoint's path; its suffix is replaced by ``.pt`` (the metadata goes beside it as
        ``.json``). Missing parent folders are made; existing files are replaced.

    Returns
    -------
    Path
        The ``.pt`` file written.
    """
    try:  # before anything is written: a pair with a .pt and no .json would not load
        text = json.dumps(metadata, indent=2, sort_keys=True) + "\n"
    except (TypeError, ValueError) as exc:
        raise ModelError(f"the metadata of checkpoint {path} is not JSON-serialisable ({exc}); give a dict of "
                         "strings, numbers, lists and dicts") from None
    pt = Path(path).with_suffix(".pt")
    pt.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    atomic_write(pt, lambda f: torch.save(state, f))
    atomic_write_bytes(pt.with_suffix(".json"), text.encode())
    return pt


def _resolve(name_or_path: str | os.PathLike[str]) -> tuple[Path, Path]:
    text = str(name_or_path)
    path = Path(text)
    # files only: a folder that happens to carry a shipped model's name does not hide the model
    local = path.is_file() or path.with_suffix(".pt").is_file()
    if path.is_dir() and text not in available_checkpoints():
        raise ModelError(f"checkpoint {text} is a folder; give the .pt file of a checkpoint (a state_dict beside a "
                         ".json metadata file, as written by `attribution-audit train`)")
    if local and isinstance(name_or_path, str) and text in available_checkpoints() and os.sep not in text:
        raise ModelError(f"{text!r} is a shipped checkpoint, and {path.with_suffix('.pt')} exists here too; give "
                         f"./{path.with_suffix('.pt')} for the file, or move it to use the shipped one")
    if path.suffix in (".pt", ".json") or local:
        pt, meta = path.with_suffix(".pt"), path.with_suffix(".json")
        for f in (pt, meta):
            if not f.exists():
                raise ModelError(f"checkpoint {text}: {f} not found (a checkpoint is a .pt state_dict "
                                 "beside a .json metadata file, as written by `attribution-audit train`)")
        return pt, meta
    names = available_checkpoints()
    if text not in names:
        raise unknown_name("checkpoint (neither a shipped name nor an existing path)", text, names, ModelError)
    with resources.as_file(SHIPPED.joinpath(f"{text}.pt")) as pt, resources.as_file(SHIPPED.joinpath(f"{text}.json")) as meta:
        return Path(pt), Path(meta)


def _read_metadata(meta_path: Path) -> dict[str, Any]:
    """The checkpoint's metadata, refused unless they hold arch, in_shape, num_classes (and arch_options, model) of
    the right types."""
    try:
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        _, in_shape, classes = meta["arch"], meta["in_shape"], meta["num_classes"]  # arch: required, read when building
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ModelError(f"{meta_path}: metadata must be JSON with arch, in_shape, num_classes ({exc})") from exc
    options = meta.get("arch_options", {})
    if not isinstance(options, dict) or not isinstance(in_shape, list) or not isinstance(classes, int):
        raise ModelError(f"{meta_path}: in_shape must be a list, num_classes an integer and arch_options a table, got "
                         f"{in_shape!r}, {classes!r}, {options!r}")
    spec = meta.get("model")
    if spec is not None and not isinstance(spec, str):
        raise ModelError(f"{meta_path}: model must be a model specification (e.g. timm:resnet18), got {spec!r}")
    return meta


def _fresh_from_metadata(meta: dict[str, Any], meta_path: Path) -> nn.Module:
    """The model the checkpoint's (checked) metadata describe, with fresh weights: a library's or a factory's model,
    else a zoo architecture."""
    arch, in_shape, classes = meta["arch"], meta["in_shape"], meta["num_classes"]
    spec = meta.get("model")
    if spec is not None:  # a model of a library or a factory, trained by `train --model`
        c, h, w = in_shape
        return fresh_model(spec, (c, h, w), classes)
    options = meta.get("arch_options", {})
    try:
        return build(arch, tuple(in_shape), classes, **options)
    except (TypeError, ValueError) as exc:  # an option the architecture does not take, or of the wrong type
        raise ModelError(f"{meta_path}: cannot build {arch!r} from its metadata (in_shape {in_shape}, {classes} "
                         f"classes, arch_options {options}): {exc}") from exc


@leaves_process_alone
def load_checkpoint(name_or_path: str | os.PathLike[str]) -> nn.Module:
    """Load a shipped checkpoint by name, or one written by the trainer by path.

    A tensor stored in lower precision than the model's is cast up, said as a
    :class:`~attributions.errors.ToolkitWarning` and kept in ``model.metadata["warnings"]``.

    Parameters
    ----------
    name_or_path : a shipped checkpoint's name (``cnn-sgd``, ...) or the path of a ``.pt`` file with its ``.json``

    Returns
    -------
    nn.Module
        The model in eval mode, with the metadata dict attached as ``model.metadata``.

    Raises
    ------
    ModelError
        When the checkpoint is missing, unreadable or does not fit its metadata, when a tensor is stored as an
        integer where the model's is floating point, or when a weight is NaN or infinite.
    """
    pt, meta_path = _resolve(name_or_path)
    meta = _read_metadata(meta_path)
    model = _fresh_from_metadata(meta, meta_path)
    try:
        state = torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a corrupt file
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{pt}: not a readable state_dict ({line})") from exc
    if not isinstance(state, dict):
        raise ModelError(f"{pt}: holds a {type(state).__name__}, not a state_dict (a dict of parameter name -> tensor, "
                         "as torch.save(model.state_dict(), path) writes)")
    notes = check_dtypes(model, {k: v.dtype for k, v in state.items() if isinstance(v, torch.Tensor)}, pt)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise ModelError(f"{pt}: weights do not match the metadata ({meta['arch']}, in_shape {meta['in_shape']}, "
                         f"{meta['num_classes']} classes): {' '.join(s.strip() for s in first[:4])}") from None
    model.eval()
    model.metadata = meta  # type: ignore[assignment]  # a plain attribute; torch types Module attributes as Tensor | Module
    for note in notes:
        caution(model, note)
    return finite_parameters(model, str(name_or_path))


def fresh_model(spec: str, in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The architecture ``spec`` names with fresh weights, for ``num_classes`` classes and inputs of ``in_shape``
    (C, H, W): a library model built without weights (a Hugging Face one from its folder's configuration), a
    ``module:factory``'s model as the factory returns it, a checkpoint's zoo architecture from its metadata. The
    weights come from the global RNG (seed it first); the caller's RNG state is what the draw leaves.

    Raises
    ------
    ModelError
        When ``spec`` names no model, or a ``module:factory`` model with another number of outputs than
        ``num_classes`` is asked for (a factory takes no class count).
    """
    if is_library_spec(spec):
        return load_library_model(spec, num_classes=num_classes, fresh=True).train()
    if ":" in spec and not Path(spec).exists():
        return _resolve_model(spec, None, None, False).train()
    meta = getattr(load_checkpoint(spec), "metadata", {})
    if meta.get("model"):
        return fresh_model(str(meta["model"]), in_shape, num_classes)
    return build(meta["arch"], in_shape, num_classes, **meta.get("arch_options", {}))


def model_files(spec: str, weights: str | None = None) -> list[Path]:
    """The files a model specification is read from: a checkpoint's .pt and .json (shipped or a
    path), the weights of a library model, or the ``weights`` file of a ``module:factory``."""
    if is_library_spec(spec):
        return library_files(spec, weights)
    if ":" in spec and not Path(spec).exists():
        return [weights_file(weights)] if weights else []
    return list(_resolve(spec))


def finite_parameters(model: nn.Module, spec: str) -> nn.Module:
    """``model``, or a :class:`ModelError` naming its parameters and buffers that hold NaN or infinite values
    (every map of such a model is meaningless, and the audit would report numbers all the same)."""
    bad = nonfinite_tensors(model)
    if bad:
        raise ModelError(f"{spec}: {len(bad)} tensors hold NaN or infinite values ({named(bad)}); the weights are "
                         "corrupt or the training diverged")
    return model


@leaves_process_alone
def resolve_model(spec: str, weights: str | None = None, num_classes: int | None = None,
                  partial: bool = False) -> nn.Module:
    """A shipped checkpoint name, a checkpoint path, a library's model (``timm:NAME``, ``torchvision:NAME``,
    ``hf:FOLDER``: :mod:`audit.models.libraries`), or ``module:factory`` (weights from ``weights``); refused when a
    tensor is not finite. ``partial``: a library model's weights may leave tensors out (recorded in its metadata)."""
    return finite_parameters(_resolve_model(spec, weights, num_classes, partial), spec)


def _resolve_model(spec: str, weights: str | None, num_classes: int | None, partial: bool) -> nn.Module:
    if is_library_spec(spec):
        return load_library_model(spec, weights, num_classes, partial)
    if num_classes is not None:
        raise ModelError(f"--num-classes applies to timm:, torchvision: and hf: models, not to {spec!r}")
    if ":" in spec and not Path(spec).exists():
        module_name, _, factory = spec.partition(":")
        try:
            build = getattr(importlib.import_module(module_name), factory)
        except (ImportError, AttributeError) as exc:
            raise ModelError(f"cannot build {spec!r}: {exc}; give module:factory with an importable module "
                             "and a function returning an nn.Module") from exc
        if not callable(build):
            raise ModelError(f"{spec!r} is a {type(build).__name__}, not a factory; give a function (or class) that "
                             "returns an nn.Module")
        model = build()
        if not isinstance(model, nn.Module):
            raise ModelError(f"{spec!r} returned {type(model).__name__}, not an nn.Module")
        if weights:
            try:
                model.load_state_dict(read_state(weights))
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ModelError(f"cannot load weights {weights} into {spec!r}: {first}") from exc
        return model.eval()
    return load_checkpoint(spec)
