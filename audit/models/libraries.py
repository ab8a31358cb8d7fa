"""Models named as the model libraries name them: ``timm:NAME``, ``torchvision:NAME``, ``hf:FOLDER``.

    timm:convnext_tiny          timm.create_model("convnext_tiny", pretrained=False, num_classes=...)
    torchvision:resnet50        torchvision.models.get_model("resnet50", weights=None, num_classes=...)
    hf:./my-vit                 transformers.AutoModelForImageClassification.from_pretrained(folder)

Offline first: nothing is downloaded. timm and torchvision models are built with random weights and
take theirs from ``weights`` (a state_dict saved by ``torch.save`` or a ``.safetensors`` file); a Hugging
Face model is read from a folder written by ``save_pretrained`` or from a model already in the Hugging
Face cache (``local_files_only``). The libraries are optional: only a model that names one imports it.

Each model carries ``metadata`` (library, its version, the name, the weight files and their sha256), which
the audit's manifest and model table record.
"""
from __future__ import annotations

import copy
import difflib
import importlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from audit.data.datasets import file_sha256
from audit.errors import ModelError
from audit.host import available_bytes
from audit.models.cautions import caution

# prefix -> the module it imports (and whose version is recorded)
LIBRARIES = {"timm": "timm", "torchvision": "torchvision", "hf": "transformers"}
HF_WEIGHTS = ("*.safetensors", "*.bin")


def is_library_spec(spec: str) -> bool:
    """Whether ``spec`` names a model of a library (``timm:...``), not a file that happens to exist."""
    prefix, sep, _ = spec.partition(":")
    return bool(sep) and prefix in LIBRARIES and not Path(spec).exists()


def _library(prefix: str) -> Any:
    name = LIBRARIES[prefix]
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModelError(f"{prefix}: models need the {name} package ({exc}); pip install {name}") from None


def weights_file(path: str | Path) -> Path:
    """``path`` as a Path, or a clear error when it is no file."""
    if not Path(path).is_file():
        raise ModelError(f"weights file {path} not found; give a state_dict saved with torch.save(model.state_dict(), "
                         "path) or a .safetensors file")
    return Path(path)


def read_state(path: str | Path) -> dict[str, torch.Tensor]:
    """A state_dict from ``path``: a ``.safetensors`` file or one saved by ``torch.save``."""
    path = weights_file(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            result: dict[str, torch.Tensor] = load_file(str(path))
            return result
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # several types for a corrupt or foreign file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "unreadable"
        raise ModelError(f"{path}: not a readable state_dict ({type(exc).__name__}: {first})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"{path}: holds a {type(state).__name__}, not a state_dict (parameter name -> tensor)")
    return state


def _names(keys: list[str]) -> str:
    return f"{keys[:3]}{'...' if len(keys) > 3 else ''} ({len(keys)})"


def check_dtypes(model: nn.Module, stored: dict[str, torch.dtype], path: str | Path, renamed: bool = False
                 ) -> list[str]:
    """Compare the dtypes a weight file stores (``stored``: tensor name -> dtype) with the model's: an integer or
    boolean tensor where the model holds a floating-point one is refused (a cast would make numbers up); a tensor
    of lower floating-point precision than the model's (cast up exactly, but rounded when it was stored) gives the
    warning line returned. A name the model lacks is left to the loader, unless ``renamed``: a library that renames
    a file's tensors as it loads them (transformers) has put it into one of the model's tensors, compared then
    with the model's widest floating-point dtype, and an integer one with no integer tensor of that name in the
    model is refused."""
    own = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    widest = max((t for t in own.values() if t.is_floating_point()), key=lambda t: torch.finfo(t.dtype).bits,
                 default=None)
    lower = []
    for name, dtype in stored.items():
        target = own.get(name, widest if renamed else None)
        if target is None or not target.is_floating_point():
            continue
        if not dtype.is_floating_point:
            raise ModelError(f"{path}: tensor {name} is {str(dtype).removeprefix('torch.')}, the model's "
                             f"{str(target.dtype).removeprefix('torch.')}; save the weights as floating point")
        if torch.finfo(dtype).bits < torch.finfo(target.dtype).bits:
            lower.append(f"{name} stored as {str(dtype).removeprefix('torch.')}")
    return [f"{path}: {len(lower)} tensors of lower precision than the model's {_model_dtype(own)}, cast up on "
            f"loading: {', '.join(lower[:3])}{'...' if len(lower) > 3 else ''}"] if lower else []


def _model_dtype(own: dict[str, torch.Tensor]) -> str:
    kinds = sorted({str(t.dtype).removeprefix("torch.") for t in own.values() if t.is_floating_point()})
    return " / ".join(kinds)


# the dtypes of a safetensors header (the format's own names)
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}


def stored_dtypes(path: Path) -> dict[str, torch.dtype]:
    """Tensor name -> dtype as ``path`` stores it, read without loading the tensors: a safetensors file's header,
    or a torch.save file mapped into memory."""
    try:
        if path.suffix == ".safetensors":
            with path.open("rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
            return {k: SAFETENSORS_DTYPES[v["dtype"]] for k, v in header.items()
                    if k != "__metadata__" and v.get("dtype") in SAFETENSORS_DTYPES}
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # several types for a corrupt or foreign file
        raise ModelError(f"{path}: not a readable weight file ({type(exc).__name__}: {exc})") from None
    return {k: v.dtype for k, v in state.items() if isinstance(v, torch.Tensor)} if isinstance(state, dict) else {}


def under_model_names(model: nn.Module, stored: dict[str, torch.dtype]) -> dict[str, torch.dtype]:
    """``stored`` under the names of ``model``'s tensors where a name can be matched: a Hugging Face file saved
    from the base model lacks the task model's prefix (``base_model_prefix``), one saved from the task model has
    it; other names (those the library renames as it loads them) are kept as the file has them."""
    own = model.state_dict().keys()
    prefix = getattr(model, "base_model_prefix", "") or ""
    return {next((c for c in (name, f"{prefix}.{name}", name.removeprefix(f"{prefix}.")) if c in own), name): dtype
            for name, dtype in stored.items()}


def _load(model: nn.Module, path: str | Path, spec: str, partial: bool) -> dict[str, Any]:
    """Load ``path`` into ``model``: every tensor must fit, unless ``partial`` allows missing, unexpected and
    mismatched ones (returned, for the manifest, with the dtype warnings, under ``warnings``)."""
    state = read_state(path)
    notes = check_dtypes(model, {k: v.dtype for k, v in state.items()}, path)
    own = model.state_dict()
    mismatched = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    if mismatched and not partial:
        raise ModelError(f"{path} does not fit {spec}: {mismatched[0]} is {list(state[mismatched[0]].shape)} in the "
                         f"file and {list(own[mismatched[0]].shape)} in the model; is --num-classes right? "
                         "(--allow-partial-weights loads the rest and keeps those freshly initialised)")
    result = model.load_state_dict({k: v for k, v in state.items() if k not in mismatched}, strict=False)
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if (missing or unexpected) and not partial:
        raise ModelError(f"{path} does not fit {spec}: missing {_names(missing)}, unexpected {_names(unexpected)}; "
                         "--allow-partial-weights loads it anyway (the missing tensors keep their fresh initialisation, "
                         "and the manifest records them)")
    return {"missing": missing, "unexpected": unexpected, "mismatched": mismatched, "warnings": notes}


def _hf_folder(name: str) -> Path:
    """The local folder of a Hugging Face model: ``name`` itself, or its snapshot in the cache."""
    if Path(name).is_dir():
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not in the cache (or not a hub id at all)
        raise ModelError(f"hf:{name}: no such folder, and no model of that id in the Hugging Face cache; give a folder "
                         "written by save_pretrained (nothing is downloaded)") from None


def _nearest(name: str, known: list[str]) -> str:
    """"; the nearest: a, b, c" (the library's model names closest to ``name``), or a pointer to the listing."""
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    return f"; the nearest: {', '.join(close)}" if close else f"; none is close ({len(known)} models known)"


def refuse_remote_code(folder: Path, spec: str) -> None:
    """Refuse a Hugging Face folder whose configuration points at code of its own (``auto_map``, or a
    ``custom_pipelines`` entry): transformers would import that code (or ask on stdin whether to run it) when the
    model type is not one it knows. An audit never executes code from a model folder."""
    for name in ("config.json", "preprocessor_config.json", "processor_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelError(f"{spec}: {path} is not readable JSON ({type(exc).__name__}: {exc})") from None
        keys = [k for k in ("auto_map", "custom_pipelines") if isinstance(config, dict) and k in config]
        if keys:
            raise ModelError(f"{spec}: {path} points at code of its own ({', '.join(keys)}); the audit never runs code "
                             "from a model folder. Load the model yourself (you decide whether to trust its code) and "
                             "pass the nn.Module, or use module:factory")


DEPTH_KEYS = ("num_hidden_layers", "num_layers", "depths")  # where Hugging Face configs state their depth


def _meta_bytes(library: Any, config: Any) -> int:
    """The float32 bytes of the parameters of the model ``config`` describes, built on the meta device (no
    memory is allocated)."""
    with torch.device("meta"):
        model = library.AutoModelForImageClassification.from_config(config, trust_remote_code=False)
    result: int = sum(p.numel() for p in model.parameters()) * 4
    return result


def hf_parameter_bytes(library: Any, config: Any) -> int:
    """The float32 bytes of a Hugging Face model's parameters, estimated before it is built: the model is built on
    the meta device at depths 1 and 2 (per stage, for a list of depths) and the difference scaled to the
    configured depth, so that a config of absurd depth costs two small builds, not its own."""
    key = next((k for k in DEPTH_KEYS if isinstance(getattr(config, k, None), (int, list, tuple))), None)
    if key is None:
        return _meta_bytes(library, config)
    depth = getattr(config, key)

    def at(value: Any) -> int:
        changed = copy.deepcopy(config)
        setattr(changed, key, value)
        return _meta_bytes(library, changed)

    if isinstance(depth, int):
        one = at(1)
        return one + max(depth - 1, 0) * (at(2) - one)
    ones = [1] * len(depth)
    base = at(ones)
    return base + sum(max(int(d) - 1, 0) * (at(ones[:i] + [2] + ones[i + 1:]) - base) for i, d in enumerate(depth))


def refuse_oversized(library: Any, folder: Path, spec: str, labels: dict[str, Any]) -> None:
    """Refuse a Hugging Face model whose float32 parameters alone exceed the memory available now, before
    building it (a config with absurd sizes would otherwise hang and grow memory until the machine gives out)."""
    try:
        config = library.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                                    **({"num_labels": labels["num_labels"]} if labels else {}))
        needed = hf_parameter_bytes(library, config)
    except Exception as exc:  # the library's own error for a broken config: reported by the build that follows
        if isinstance(exc, ModelError):
            raise
        return
    free = available_bytes(torch.device("cpu"))
    if needed > free:
        raise ModelError(f"{spec}: its config describes {needed / 2**30:.3g} GiB of float32 parameters, more than the "
                         f"{free / 2**30:.3g} GiB of memory available; check the config's sizes "
                         f"({', '.join(f'{k}={getattr(config, k)}' for k in DEPTH_KEYS if hasattr(config, k))}, "
                         f"hidden_size={getattr(config, 'hidden_size', '?')})")


def _build_model(library: Any, prefix: str, name: str, spec: str, num_classes: int | None,
                 fresh: bool) -> tuple[Any, list[Path], dict[str, Any]]:
    """(the library's model, the weight files it was built from, what their weights left out), or the library's error
    as a ModelError."""
    files: list[Path] = []
    report: dict[str, Any] = {}  # what the weights left out, where the user allows it
    classes = {} if num_classes is None else {"num_classes": int(num_classes)}
    try:
        if prefix == "timm":
            if not library.is_model(name):
                raise ModelError(f"timm has no model {name!r}{_nearest(name, library.list_models())}")
            model = library.create_model(name, pretrained=False, **classes)
        elif prefix == "torchvision":
            known = library.models.list_models()
            if name not in known:
                raise ModelError(f"torchvision has no model {name!r}{_nearest(name, known)}")
            model = library.models.get_model(name, weights=None, **classes)
        else:
            model, files, report = _hugging_face(library, name, spec, num_classes, fresh)
    except ModelError:
        raise
    except Exception as exc:  # the library's own error: a bad folder, an option the model does not take
        raise ModelError(f"cannot build {spec}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}") from None
    return model, files, report


def load_library_model(spec: str, weights: str | None = None, num_classes: int | None = None,
                       partial: bool = False, fresh: bool = False) -> nn.Module:
    """The model ``spec`` names (``timm:NAME``, ``torchvision:NAME``, ``hf:FOLDER``), in eval mode.

    Parameters
    ----------
    weights : a state_dict (``torch.save`` or ``.safetensors``) loaded into it; timm and torchvision
        models without one keep their random initialisation
    num_classes : the classifier's outputs (default: the library's, 1000 for ImageNet models; a Hugging
        Face model's from its config)
    partial : allow weights that leave tensors missing, unexpected or of another shape (a head of another
        size); otherwise each is an error. What was left out is recorded in ``metadata["partial_weights"]``.
    fresh : a Hugging Face model built from its folder's configuration with freshly initialised weights (the folder's
        weights are not read), as timm and torchvision models are without ``weights``; the architecture of a twin
    """
    prefix, _, name = spec.partition(":")
    if not name:
        raise ModelError(f"{spec!r} names no model; e.g. timm:convnext_tiny, torchvision:resnet50, hf:./folder")
    library = _library(prefix)
    model, files, report = _build_model(library, prefix, name, spec, num_classes, fresh)
    if prefix == "hf" and not weights and any(report.get(k) for k in ("missing", "unexpected", "mismatched")) \
            and not partial:
        raise ModelError(f"{spec}: the folder's weights do not fit the model: missing {_names(report['missing'])}, "
                         f"unexpected {_names(report['unexpected'])}, of another shape {_names(report['mismatched'])} "
                         "(a missing tensor would be freshly initialised); --allow-partial-weights loads it anyway and "
                         "the manifest records what was left out")
    if weights:
        report = _load(model, weights, spec, partial)
        files = [Path(weights)]
    elif files:  # the folder's files, loaded by the library, which casts them to the config's dtype unsaid
        report["warnings"] = [line for f in files for line in check_dtypes(model, under_model_names(
            model, stored_dtypes(f)), f, renamed=True)]
    notes = report.pop("warnings", [])
    model.eval()
    model.metadata = {"arch": spec, "library": LIBRARIES[prefix], "library_version": library.__version__,
                      "weights": {str(f): file_sha256(f) for f in files} or "random initialisation"}
    if report and any(report.values()):
        model.metadata["partial_weights"] = report
    for note in notes:
        caution(model, note)
    built: nn.Module = model  # the library's builders are untyped
    return built


def _hugging_face(library: Any, name: str, spec: str, num_classes: int | None,
                  fresh: bool = False) -> tuple[nn.Module, list[Path], dict[str, Any]]:
    """A Hugging Face folder's model (never its code), its weight files, and what its weights left out; ``fresh``:
    built from the folder's configuration alone, with fresh weights (no file read, nothing left out)."""
    folder = _hf_folder(name)
    refuse_remote_code(folder, spec)
    labels = {} if num_classes is None else {"num_labels": int(num_classes), "ignore_mismatched_sizes": True}
    refuse_oversized(library, folder, spec, labels)
    if fresh:
        config = library.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                                    **({"num_labels": int(num_classes)} if num_classes else {}))
        return library.AutoModelForImageClassification.from_config(config, trust_remote_code=False), [], {}
    # trust_remote_code=False: never run a folder's code, and never ask on stdin whether to
    model, info = library.AutoModelForImageClassification.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=False, output_loading_info=True, **labels)
    files = sorted(f for pattern in HF_WEIGHTS for f in folder.glob(pattern))
    report = {"missing": list(info.get("missing_keys", [])), "unexpected": list(info.get("unexpected_keys", [])),
              "mismatched": [str(k[0]) if isinstance(k, tuple) else str(k) for k in info.get("mismatched_keys", [])]}
    return model, files, report


def library_files(spec: str, weights: str | None = None) -> list[Path]:
    """The files a library model is read from (its weights), for the run's fingerprints."""
    if weights:
        return [Path(weights)]
    prefix, _, name = spec.partition(":")
    if prefix == "hf" and Path(name).is_dir():
        return sorted(f for pattern in HF_WEIGHTS for f in Path(name).glob(pattern))
    return []
