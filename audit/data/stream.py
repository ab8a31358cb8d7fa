"""Image folders read one image at a time: training on folders of any size without holding them in memory.

A :class:`FolderImages` lists the files of a folder with one sub-folder per class (the listing and the labels are
all it keeps) and reads an image only when it is asked for, through the audit's own :class:`Preprocess`, so that a
model trained on a folder sees its images exactly as an audit of that folder does. Wrapped in a DataLoader with
worker processes, the images of a batch are read in parallel and dropped once the batch is used: memory stays flat
as the folder grows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from audit.data.formats import IMAGE_SUFFIXES, open_image
from audit.data.preprocess import DEEP_MODES, Preprocess
from audit.errors import DataError

GRAY_MODES = ("L", "1", *DEEP_MODES)


class FolderImages(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """The images of ``root`` (one sub-folder per class, classes in sorted order), read on demand.

    Parameters
    ----------
    root : path
        The folder; its sub-folders are the classes, their image files the images (sorted by name).
    preprocess : Preprocess, default none
        How a file becomes a model input (resize, crop, normalisation), as in an audit of the folder.
    channels : int or None, default None
        1 (grayscale) or 3 (RGB); None: 1 when the first image is grayscale, else 3 (every image is converted to
        it).

    Attributes
    ----------
    files : list of Path, the images in index order
    labels : numpy.ndarray, (N,) int64, each image's class index
    classes : list of str, the class-folder names
    """

    def __init__(self, root: str | Path, preprocess: Preprocess | None = None, channels: int | None = None) -> None:
        root = Path(root)
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        listed = [(f, i) for i, c in enumerate(self.classes) for f in sorted((root / c).iterdir())
                  if f.suffix.lower() in IMAGE_SUFFIXES]
        if not listed:
            raise DataError(f"{root}: no images found; expected one sub-folder per class holding image files "
                            f"({', '.join(sorted(IMAGE_SUFFIXES))})")
        self.root = root
        self.files = [f for f, _ in listed]
        self.labels = np.array([i for _, i in listed], dtype=np.int64)
        self.preprocess = preprocess or Preprocess()
        if channels is None:
            with Image.open(self.files[0]) as first:  # the header only
                channels = 1 if first.mode in GRAY_MODES else 3
        if channels not in (1, 3):
            raise DataError(f"channels must be 1 or 3, got {channels!r}")
        self.channels = channels
        self.shape = self._read(0).shape

    def __len__(self) -> int:
        return len(self.files)

    def _read(self, index: int) -> np.ndarray:
        return self.preprocess(open_image(self.files[index]), self.channels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """Image ``index`` as a (C, H, W) float32 tensor, and its label."""
        image = self._read(index)
        if image.shape != self.shape:
            raise DataError(f"{self.files[index]} gives an input of shape {list(image.shape)}, the folder's first image "
                            f"{list(self.shape)}; resize the images to one size, or give a preprocessing that resizes "
                            "and crops (e.g. --preprocess imagenet)")
        return torch.from_numpy(image), int(self.labels[index])
