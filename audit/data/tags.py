"""Tags: the small pasted patterns of the planted-shortcut check (Adebayo et al. 2020, 2022; Yang & Kim 2019).

A :class:`Tag` is a square of ``size`` pixels of a fixed ``pattern`` at a fixed place of the image, linked to the
class ``target`` (c*) in a shortcut twin's training data. It is defined on the picture (values in [0, 1]) and pasted
on the model's input: where the model's inputs are normalised (a :class:`~audit.data.preprocess.Preprocess` with a
mean and std), the pattern's values are normalised the same way, so that the tag is the same picture whatever the
model reads. Its mask (H, W) is where the check measures each map's share.

A specification is a comma-separated list of ``key=value`` (every key optional)::

    class=0,pattern=checker,size=4,place=top-left,share=0.5,relabel=0

``place`` is a corner (``top-left``, ``top-right``, ``bottom-left``, ``bottom-right``, one pixel in from the
edges), ``centre``, or ``ROW:COL`` (the top-left pixel of the square). ``share`` is the share of the class's
training images a shortcut twin sees tagged: the tag then predicts the class without being the only way to it, so
that the clean images of the class are still recognised (with every one tagged, a clean image of the class lacks
what the model learned the class by, and the clean accuracy drops by about the class's share). ``relabel`` is the
share of the other classes' training images a shortcut twin sees tagged and labelled c* (a backdoor, as Gu et al.
2017's BadNets): with 0 (the default) the tag only co-occurs with the class, and a model whose head averages over
positions (a ResNet's global pooling, a ViT's class token) learns it as one more cue for c* that an image of another
class outweighs; the relabelled images teach it that the tag overrides the image, which is the reliance the check
needs to be known.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attributions.errors import unknown_name
from audit.data.preprocess import Preprocess
from audit.errors import ConfigError

PATTERNS = ("checker", "white", "black")
CORNERS = ("top-left", "top-right", "bottom-left", "bottom-right", "centre")
MARGIN = 1  # pixels between a corner's tag and the image's edges: a tag on the edge is also a padding artefact


@dataclass(frozen=True)
class Tag:
    """A square pattern pasted at a fixed place, the shortcut to class ``target``.

    Parameters
    ----------
    target : int, default 0
        The class c* the tag is linked to in a shortcut twin's training data.
    pattern : str, default "checker"
        ``checker`` (white and black pixels alternating, white at the square's top-left), ``white`` or ``black``.
    size : int, default 4
        The square's side in pixels.
    place : str, default "top-left"
        A corner of :data:`CORNERS` or ``ROW:COL``, the square's top-left pixel.
    share : float, default 0.5
        The share of the training images of class ``target`` that a shortcut twin sees tagged, in (0, 1].
    relabel : float, default 0.0
        The share of the other classes' training images that a shortcut twin sees tagged and labelled ``target``,
        in [0, 1).
    """

    target: int = 0
    pattern: str = "checker"
    size: int = 4
    place: str = "top-left"
    share: float = 0.5
    relabel: float = 0.0

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise unknown_name("tag pattern", self.pattern, PATTERNS, ConfigError)
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ConfigError(f"a tag's size must be a whole number of pixels >= 1, got {self.size!r}")
        if isinstance(self.target, bool) or not isinstance(self.target, int) or self.target < 0:
            raise ConfigError(f"a tag's class must be a class index >= 0, got {self.target!r}")
        if isinstance(self.share, bool) or not isinstance(self.share, int | float) or not 0 < self.share <= 1:
            raise ConfigError(f"a tag's share of its class's training images must be in (0, 1], got {self.share!r}")
        if isinstance(self.relabel, bool) or not isinstance(self.relabel, int | float) or not 0 <= self.relabel < 1:
            raise ConfigError(f"a tag's share of the other classes' training images relabelled as its class must be in "
                              f"[0, 1), got {self.relabel!r}")
        if self.place not in CORNERS and _position(self.place) is None:
            raise ConfigError(f"a tag's place must be one of {', '.join(CORNERS)} or ROW:COL (its top-left pixel), "
                              f"got {self.place!r}")

    @classmethod
    def parse(cls, spec: str) -> Tag:
        """The tag a specification names (``class=0,pattern=checker,size=4,place=top-left``; keys optional).

        Raises
        ------
        ConfigError
            An unknown key, a value of the wrong kind, or a pattern or place the tag does not know.
        """
        keys = {"class": "target", "pattern": "pattern", "size": "size", "place": "place", "share": "share",
                "relabel": "relabel"}
        given: dict[str, Any] = {}
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            name, sep, value = part.partition("=")
            if not sep or name.strip() not in keys:
                raise ConfigError(f"tag specification {spec!r}: {part!r} is not KEY=VALUE with KEY one of "
                                  f"{', '.join(keys)} (e.g. class=0,pattern=checker,size=4,place=top-left)")
            field = keys[name.strip()]
            value = value.strip()
            if field in ("target", "size", "share", "relabel"):
                real = field in ("share", "relabel")
                try:
                    given[field] = float(value) if real else int(value)
                except ValueError:
                    raise ConfigError(f"tag specification {spec!r}: {name.strip()} must be a "
                                      f"{'number' if real else 'whole number'}, got {value!r}") from None
            else:
                given[field] = value
        return cls(**given)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Tag:
        """The tag a checkpoint's metadata records (:meth:`to_dict`)."""
        return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record})

    def to_dict(self) -> dict[str, Any]:
        """The tag as metadata: target, pattern, size, place, share (and relabel where it is not 0, as a tag
        recorded before it was a key)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "relabel" or v}

    @property
    def spec(self) -> str:
        """The specification :meth:`parse` reads back."""
        return (f"class={self.target},pattern={self.pattern},size={self.size},place={self.place},share={self.share:g}"
                + (f",relabel={self.relabel:g}" if self.relabel else ""))

    def corner(self, height: int, width: int) -> tuple[int, int]:
        """The (row, column) of the square's top-left pixel in an image of ``height`` x ``width``; a
        :class:`ConfigError` where the square does not fit inside it."""
        s = self.size
        at = {"top-left": (MARGIN, MARGIN), "top-right": (MARGIN, width - s - MARGIN),
              "bottom-left": (height - s - MARGIN, MARGIN), "bottom-right": (height - s - MARGIN, width - s - MARGIN),
              "centre": ((height - s) // 2, (width - s) // 2)}.get(self.place) or _position(self.place)
        assert at is not None  # checked when the tag was made
        row, col = at
        if row < 0 or col < 0 or row + s > height or col + s > width:
            raise ConfigError(f"the tag {self.spec} does not fit in a {height}x{width} image: give a smaller size or "
                              "another place")
        return row, col

    def mask(self, height: int, width: int) -> torch.Tensor:
        """(H, W) bool, True on the tag's pixels."""
        row, col = self.corner(height, width)
        out = torch.zeros(height, width, dtype=torch.bool)
        out[row:row + self.size, col:col + self.size] = True
        return out

    def picture(self) -> torch.Tensor:
        """(size, size) the pattern's values on the picture's scale [0, 1]."""
        if self.pattern == "checker":
            i = torch.arange(self.size)
            return ((i[:, None] + i[None, :]) % 2 == 0).float()
        return torch.full((self.size, self.size), 1.0 if self.pattern == "white" else 0.0)

    def paste(self, x: torch.Tensor, preprocess: Preprocess | None = None) -> torch.Tensor:
        """A copy of the images ``x`` (B, C, H, W) with the tag pasted on every channel, its values normalised by
        ``preprocess``'s mean and std where it has them (``x`` itself is not changed)."""
        if x.ndim != 4:
            raise ConfigError(f"a tag is pasted on images (B, C, H, W), got a tensor of shape {tuple(x.shape)}")
        row, col = self.corner(x.shape[2], x.shape[3])
        values = self.picture().to(x.dtype)[None].repeat(x.shape[1], 1, 1)  # (C, size, size)
        if preprocess is not None and preprocess.mean is not None and preprocess.std is not None:
            values = torch.from_numpy(preprocess.normalised(values.numpy())).to(x.dtype)
        out = x.clone()
        out[:, :, row:row + self.size, col:col + self.size] = values
        return out

    def area(self, height: int, width: int) -> float:
        """The tag's share of the image's pixels: what a map spread evenly over the image puts on it."""
        self.corner(height, width)
        return self.size * self.size / (height * width)


def _position(place: str) -> tuple[int, int] | None:
    """(row, col) from ``ROW:COL``; None where ``place`` is not two whole numbers."""
    row, sep, col = place.partition(":")
    return (int(row), int(col)) if sep and row.strip().isdigit() and col.strip().isdigit() else None


ROLES = {"shortcut": "shortcut twin", "tag-control": "tag control twin"}


def tagged_rows(y: np.ndarray, tag: Tag, role: str, seed: int) -> np.ndarray:
    """(N,) bool: the training images a twin of ``role`` sees tagged, from the labels ``y`` (N,).

    The shortcut twin sees ``tag.share`` of the images of class ``tag.target`` tagged (at least one), and
    ``tag.relabel`` of the other classes' images (:func:`tag_labels` labels them ``tag.target``), drawn by a
    generator seeded with ``seed`` (the tag predicts the class); the tag control twin sees as many images tagged,
    drawn from every class (the tag present at the same rate, its link to the label absent).
    """
    if role not in ROLES:
        raise unknown_name("shortcut twin role", role, ROLES, ConfigError)
    linked = np.asarray(y) == tag.target
    if not linked.any():
        raise ConfigError(f"no training image is of the tag's class {tag.target}: pick a class the data has "
                          f"(class=K in --shortcut)")
    count, relabelled = max(1, round(tag.share * int(linked.sum()))), round(tag.relabel * int((~linked).sum()))
    rng = np.random.default_rng(seed)
    out = np.zeros(len(y), dtype=bool)
    if role == "shortcut":
        out[rng.choice(np.flatnonzero(linked), size=count, replace=False)] = True
        if relabelled:
            out[rng.choice(np.flatnonzero(~linked), size=relabelled, replace=False)] = True
    else:
        out[rng.choice(len(y), size=count + relabelled, replace=False)] = True
    return out


def tag_labels(y: np.ndarray, rows: np.ndarray, tag: Tag, role: str) -> np.ndarray:
    """(N,) the labels a twin of ``role`` trains on: a shortcut twin's tagged images (``rows`` (N,) bool) all
    labelled ``tag.target`` (those :func:`tagged_rows` drew from the other classes by ``tag.relabel``), the tag
    control twin's the labels ``y`` (N,)."""
    if role == "shortcut":
        return np.where(rows, tag.target, y).astype(np.asarray(y).dtype)
    return np.asarray(y)
