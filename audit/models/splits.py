"""What the trainer trains and evaluates on: a split of images and labels, held in memory or read from files.

Both kinds give batches of images for given indices and keep their labels apart (a permuted-label twin trains on
the same images with other labels). :class:`ArraySplit` holds a data set loaded as arrays (Fashion-MNIST, CIFAR-10);
:class:`StreamSplit` reads an image folder one batch at a time (:class:`~audit.data.stream.FolderImages`), in a
DataLoader with worker processes, so that the folder is never in memory.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attributions.capture import logits_of
from audit.data.datasets import array_sha256
from audit.data.preprocess import Preprocess
from audit.data.stream import FolderImages
from audit.data.tags import Tag


@dataclass(frozen=True)
class ArraySplit:
    """Images ``x`` (N, C, H, W) float32 and labels ``y`` (N,) int64, in memory."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    @property
    def shape(self) -> tuple[int, int, int]:
        """One image's (C, H, W)."""
        c, h, w = self.x.shape[1:]
        return c, h, w

    def images(self, batches: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """The (B, C, H, W) images of each index batch, in order."""
        x = torch.from_numpy(self.x)
        for idx in batches:
            yield x[idx]

    def fingerprint(self) -> str:
        """The sha256 of the images and labels."""
        return array_sha256(self.x, self.y)


@dataclass(frozen=True)
class StreamSplit:
    """The images ``indices`` (M,) of a :class:`~audit.data.stream.FolderImages` ``folder``, with labels ``y`` (M,)
    (the folder's, or permuted), read batch by batch by ``workers`` processes (0: in this process)."""

    folder: FolderImages
    indices: np.ndarray
    y: np.ndarray
    workers: int = 0

    def __len__(self) -> int:
        return len(self.y)

    @property
    def shape(self) -> tuple[int, int, int]:
        c, h, w = self.folder.shape
        return c, h, w

    def images(self, batches: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """The (B, C, H, W) images of each index batch (indices into this split), in order, read by the workers."""
        sampler = [self.indices[idx.numpy()].tolist() for idx in batches]
        loader = torch.utils.data.DataLoader(self.folder, batch_sampler=sampler, num_workers=self.workers,
                                             collate_fn=lambda items: torch.stack([image for image, _ in items]))
        yield from loader

    def fingerprint(self) -> str:
        """The sha256 of the image files' names, sizes and modification times in order, and of the labels: a
        change to the folder changes it, without reading every image."""
        digest = hashlib.sha256()
        for i in self.indices:
            stat = self.folder.files[i].stat()
            digest.update(f"{self.folder.files[i].relative_to(self.folder.root)}:{stat.st_size}:{stat.st_mtime_ns};"
                          .encode())
        digest.update(np.ascontiguousarray(self.y).tobytes())
        return digest.hexdigest()


@dataclass(frozen=True)
class TaggedSplit:
    """The images of ``base`` with ``tag`` pasted on those of ``rows`` (N,) bool, as the model reads its inputs
    (``preprocess``'s normalisation): a shortcut twin's training images (:func:`~audit.data.tags.tagged_rows`), or
    the tagged test images its gate is read on. The labels are the base split's."""

    base: ArraySplit | StreamSplit
    rows: np.ndarray
    tag: Tag
    preprocess: Preprocess | None = None

    def __len__(self) -> int:
        return len(self.base)

    @property
    def y(self) -> np.ndarray:
        """(N,) the base split's labels."""
        return self.base.y

    @property
    def shape(self) -> tuple[int, int, int]:
        """One image's (C, H, W)."""
        return self.base.shape

    def images(self, batches: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """The (B, C, H, W) images of each index batch, in order, the tagged rows with the tag pasted."""
        for idx, x in zip(batches, self.base.images(batches)):
            tagged = torch.from_numpy(self.rows[idx.numpy()])
            if tagged.any():
                x = x.clone()
                x[tagged] = self.tag.paste(x[tagged], self.preprocess)
            yield x

    def fingerprint(self) -> str:
        """The sha256 of the base split's fingerprint, the tag and which rows carry it."""
        return hashlib.sha256(f"{self.base.fingerprint()};{self.tag.spec};".encode()
                              + np.packbits(self.rows).tobytes()).hexdigest()


Split = ArraySplit | StreamSplit | TaggedSplit


def relabelled(split: ArraySplit | StreamSplit, keep: np.ndarray, y: np.ndarray) -> ArraySplit | StreamSplit:
    """The images ``keep`` (M,) indices of ``split``, with the labels ``y`` (M,) in place of theirs."""
    if isinstance(split, ArraySplit):
        return ArraySplit(split.x[keep], y)
    return StreamSplit(split.folder, split.indices[keep], y, split.workers)


def index_batches(order: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """``order`` (N,) cut into consecutive batches of ``batch_size`` (the last may be shorter)."""
    return list(torch.split(order, batch_size))


def accuracy(model: nn.Module, split: Split, batch_size: int = 250) -> float:
    """Top-1 accuracy of ``model`` on ``split`` (in eval mode; the model's mode restored): the fraction of images
    whose largest logit is their label (0.0 for no image)."""
    was_training = model.training
    model.eval()
    correct = 0
    batches = index_batches(torch.arange(len(split)), batch_size)
    device = next(model.parameters(), torch.empty(0)).device
    with torch.no_grad():
        for idx, x in zip(batches, split.images(batches)):
            correct += int((logits_of(model(x.to(device))).argmax(1).cpu().numpy() == split.y[idx.numpy()]).sum())
    model.train(was_training)
    return correct / max(len(split), 1)

