"""Readers for the on-disk image formats: IDX (MNIST family), CIFAR python batches, image folders.

Each reader returns plain numpy arrays and raises :class:`audit.errors.DataError` naming the file
and what is wrong with it when the file is corrupt or truncated.
"""
from __future__ import annotations

import gzip
import io
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image, UnidentifiedImageError

from audit.data.preprocess import DEEP_MODES
from audit.errors import DataError

_IDX_DTYPES: dict[int, npt.DTypeLike] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


def read_bytes(path: Path) -> bytes:
    """The file's content, transparently gunzipped when it starts with the gzip magic."""
    raw = Path(path).read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt or truncated gzip file ({exc}); delete it and fetch it again") from exc


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (raw or gzipped).

    Returns
    -------
    numpy.ndarray
        Shape given by the file header, e.g. (N, 28, 28) uint8 for images, (N,) for labels.
    """
    data = read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number {data[:4].hex() or 'empty'})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header ({len(data)} bytes, need {header})")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise DataError(f"{path}: IDX file is {len(data)} bytes but its header {shape} needs {expected}; "
                        "the file is truncated or corrupt, fetch it again")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays, dicts, lists and strings only: a batch file cannot run code."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"), ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 python batch.

    Returns
    -------
    images : numpy.ndarray, (N, 3, 32, 32) uint8
    labels : numpy.ndarray, (N,) int64
    """
    try:
        batch = _ArrayOnlyUnpickler(io.BytesIO(read_bytes(path)), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise DataError(f"{path}: not a readable CIFAR python batch ({exc}); fetch it again") from exc
    if not isinstance(batch, dict):
        raise DataError(f"{path}: CIFAR batch should hold a dict, found {type(batch).__name__}")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise DataError(f"{path}: CIFAR batch lacks 'data' or 'labels' (keys: {sorted(batch)})")
    data, labels = np.asarray(batch["data"]), np.asarray(batch["labels"])
    for name, values in (("data", data), ("labels", labels)):
        if not (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)):
            raise DataError(f"{path}: CIFAR batch {name!r} holds {values.dtype} values, not numbers; fetch it again")
    if not np.isfinite(data).all() or not np.isfinite(labels).all() or (labels != np.round(labels)).any():
        raise DataError(f"{path}: CIFAR batch holds non-finite pixel values or non-integer labels; fetch it again")
    labels = labels.astype(np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise DataError(f"{path}: CIFAR batch has data {data.shape} and {labels.shape[0]} labels; "
                        "expected (N, 3072) and N labels")
    return data.astype(np.uint8).reshape(-1, 3, 32, 32), labels


def open_image(path: Path) -> Image.Image:
    """The image in ``path``, fully read (the file is closed), or a :class:`DataError` naming it."""
    try:
        with Image.open(path) as im:
            im.load()
            return im.copy()
    except Image.DecompressionBombError as exc:
        raise DataError(f"{path}: refused, its pixel count is beyond PIL's safety limit against decompression bombs "
                        f"({exc}); if the image is genuine, resize it or raise PIL.Image.MAX_IMAGE_PIXELS") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"{path}: not a readable image ({exc})") from exc


def eight_bits(image: Image.Image, gray: bool) -> np.ndarray:
    """``image`` as uint8 (H, W) or (H, W, 3); a 16-bit image scaled over its full range (65535 -> 255), where
    PIL's own conversion would clip it at 255."""
    if image.mode in DEEP_MODES:
        array = np.clip(np.round(np.asarray(image, dtype=np.float64) / 257.0), 0, 255).astype(np.uint8)
        return array if gray else np.repeat(array[..., None], 3, axis=2)
    return np.asarray(image.convert("L" if gray else "RGB"))


def read_image_folder(root: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Read one folder per class of equally sized images.

    Returns
    -------
    images : numpy.ndarray, (N, C, H, W) uint8, C = 1 when every image is grayscale, else 3
    labels : numpy.ndarray, (N,) int64, index into ``classes``
    classes : list of str, the sorted class-folder names
    """
    root = Path(root)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    files = [(f, i) for i, c in enumerate(classes) for f in sorted((root / c).iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise DataError(f"{root}: no images found; expected one sub-folder per class holding image files "
                        f"({', '.join(sorted(IMAGE_SUFFIXES))})")
    images = [open_image(f) for f, _ in files]
    gray = all(im.mode in ("L", "1", *DEEP_MODES) for im in images)
    arrays = [eight_bits(im, gray) for im in images]
    sizes = {a.shape[:2] for a in arrays}
    if len(sizes) > 1:
        raise DataError(f"{root}: images have different sizes {sorted(sizes)}; resize them to one size first")
    x = np.stack(arrays)
    x = x[:, None] if gray else x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x), np.array([i for _, i in files], dtype=np.int64), classes
