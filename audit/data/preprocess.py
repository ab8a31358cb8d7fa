"""Preprocessing of image files into model inputs, and back into pictures for the report.

A :class:`Preprocess` is what torchvision users write as ``Resize(256), CenterCrop(224),
ToTensor(), Normalize(mean, std)``: the shorter side resized (bilinear, PIL), a centred square
crop, values scaled to [0, 1], then per-channel ``(x - mean) / std``. Maps are computed and
compared on the preprocessed grid; :meth:`Preprocess.picture` undoes the normalisation so that a
heatmap is drawn over the image as it looked.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from PIL import Image

from audit.errors import ConfigError

# PIL's modes of 16-bit grayscale images (PNG, TIFF): "I" holds them widened to 32 bits
DEEP_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


@dataclass(frozen=True)
class Preprocess:
    """``resize``: the shorter side's length, or None; ``crop``: the side of the centred square
    crop, or None; ``mean`` / ``std``: per-channel normalisation (one value, or one per channel),
    or None for none."""

    resize: int | None = None
    crop: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("resize", "crop"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"preprocess {name} must be a positive integer (pixels) or absent, got {value!r}")
        if (self.mean is None) != (self.std is None):
            raise ConfigError("preprocess needs both mean and std, or neither")
        if self.mean is not None and self.std is not None:
            if len(self.mean) != len(self.std) or len(self.mean) not in (1, 3):
                raise ConfigError(f"preprocess mean and std need one value or one per channel (3), got "
                                  f"{list(self.mean)} and {list(self.std)}")
            if any(s <= 0 for s in self.std):
                raise ConfigError(f"preprocess std must be positive, got {list(self.std)}")

    def __call__(self, image: Image.Image, channels: int) -> np.ndarray:
        """``image`` as a (channels, H, W) float32 model input (channels 1: grayscale, 3: RGB); a 16-bit image
        keeps its full range (65535 -> 1), not clipped to 8 bits."""
        deep = image.mode in DEEP_MODES
        image = image.convert("F") if deep else image.convert("L" if channels == 1 else "RGB")
        if self.resize is not None:
            w, h = image.size
            scale = self.resize / min(w, h)
            image = image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BILINEAR)
        if self.crop is not None:
            w, h = image.size
            if self.crop > min(w, h):
                raise ConfigError(f"preprocess crop {self.crop} is larger than the image ({w}x{h} after resizing)")
            left, top = (w - self.crop) // 2, (h - self.crop) // 2
            image = image.crop((left, top, left + self.crop, top + self.crop))
        x = np.asarray(image, dtype=np.float32) / (65535.0 if deep else 255.0)
        x = x[None] if x.ndim == 2 else x.transpose(2, 0, 1)
        if len(x) != channels:  # a grayscale 16-bit image among colour ones
            x = np.repeat(x, channels, axis=0)
        return np.ascontiguousarray(self.normalised(x), dtype=np.float32)

    def normalised(self, x: np.ndarray) -> np.ndarray:
        """A (C, H, W) picture in [0, 1] as the model reads it: ``(x - mean) / std`` per channel (unchanged without
        a mean and std)."""
        if self.mean is not None and self.std is not None:
            x = (x - self._channels(self.mean, x)) / self._channels(self.std, x)
        return x

    def picture(self, x: np.ndarray) -> np.ndarray:
        """A (C, H, W) model input back in [0, 1] (normalisation undone, then clipped)."""
        if self.mean is not None and self.std is not None:
            x = x * self._channels(self.std, x) + self._channels(self.mean, x)
        result: np.ndarray = np.clip(x, 0.0, 1.0)
        return result

    @staticmethod
    def _channels(values: tuple[float, ...], x: np.ndarray) -> np.ndarray:
        v = np.asarray(values, dtype=np.float32)
        if len(v) not in (1, x.shape[0]):
            raise ConfigError(f"preprocess has {len(v)} channel statistics, the images have {x.shape[0]} channels")
        return v.reshape(-1, 1, 1)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a plain table (for the manifest and TOML)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if v is not None}


PRESETS = {
    # torchvision's ImageNet evaluation transform
    "imagenet": Preprocess(resize=256, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
    "none": Preprocess(),
}


def preprocess_from(spec: str | Mapping[str, Any] | Preprocess) -> Preprocess:
    """A :class:`Preprocess` from a preset name (:data:`PRESETS`), a table with the fields
    ``resize``, ``crop``, ``mean``, ``std``, or a Preprocess."""
    if isinstance(spec, Preprocess):
        return spec
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ConfigError(f"unknown preprocess preset {spec!r}; presets: {', '.join(PRESETS)}, or a table with "
                              "resize, crop, mean, std")
        return PRESETS[spec]
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"resize", "crop", "mean", "std"}
        if unknown:
            raise ConfigError(f"preprocess has no key {', '.join(sorted(map(str, unknown)))}; keys: resize, crop, "
                              "mean, std")
        values = dict(spec)
        for key in ("mean", "std"):
            if key in values:
                v = values[key]
                v = [v] if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                if not isinstance(v, (list, tuple)) or not all(isinstance(e, (int, float)) and not isinstance(e, bool)
                                                               for e in v):
                    raise ConfigError(f"preprocess {key} must be a number or a list of numbers, got {values[key]!r}")
                values[key] = tuple(float(e) for e in v)
        return Preprocess(**values)
    raise ConfigError(f"preprocess must be a preset name or a table, got {spec!r} ({type(spec).__name__})")
