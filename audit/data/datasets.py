"""Data sets: lookup on disk, optional verified download, and the embedded Fashion-MNIST sample.

``load_dataset(name, split)`` returns ``x`` float32 (N, C, H, W) in [0, 1] and ``y`` int64 (N,).
Files are looked for, in order, in ``root``, ``$AUDIT_DATA``, the user cache folder
(``$XDG_CACHE_HOME/attribution-audit`` or ``~/.cache/attribution-audit``) and, for
Fashion-MNIST, Debian's ``/usr/share/datasets/fashion-mnist`` (package ``dataset-fashion-mnist``).
Each base folder is tried as is and with the data set's name appended.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, cast

import numpy as np

from attributions.errors import unknown_name
from audit.atomic import atomic_write
from audit.data.download import fetch
from audit.data.formats import IMAGE_SUFFIXES, open_image, read_cifar_batch, read_idx, read_image_folder
from audit.data.preprocess import DEEP_MODES, Preprocess, preprocess_from
from audit.errors import ConfigError, DataError

SPLITS = ("train", "test")
_IDX_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
_CIFAR_NAMES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}


@dataclass(frozen=True)
class Source:
    """Where a data set's official files live and how to check them.

    ``files`` maps each downloadable file name to its sha256. ``archive`` names the one file that
    is a tar archive to unpack (CIFAR); ``subdir`` is the folder the readable files sit in.
    """

    base_url: str
    files: dict[str, Any]
    apt: str | None = None
    system_dirs: tuple[Any, ...] = ()
    archive: str | None = None
    subdir: str | None = None


SOURCES: dict[str, Source] = {
    "fashion-mnist": Source(
        base_url="http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        files={
            "train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
            "train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
            "t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
            "t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        },
        apt="dataset-fashion-mnist",
        system_dirs=(Path("/usr/share/datasets/fashion-mnist"),),
    ),
    "mnist": Source(
        base_url="https://storage.googleapis.com/cvdf-datasets/mnist/",
        files={
            "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
            "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
            "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
            "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        },
    ),
    "cifar10": Source(
        base_url="https://www.cs.toronto.edu/~kriz/",
        files={"cifar-10-python.tar.gz": "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"},
        archive="cifar-10-python.tar.gz",
        subdir="cifar-10-batches-py",
    ),
}
DATASETS = tuple(SOURCES) + ("imagefolder", "fashion-mnist-sample")


def cache_dir() -> Path:
    """The user cache folder where downloads go by default."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attribution-audit"


def search_dirs(name: str, root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Folders searched for data set ``name``, in lookup order."""
    source = SOURCES.get(name)
    bases = [Path(b) for b in (root, os.environ.get("AUDIT_DATA")) if b] + [cache_dir()]
    dirs = [d for b in bases for d in (b, b / name)]
    dirs += list(source.system_dirs) if source else []
    if source and source.subdir:
        dirs = [e for d in dirs for e in (d / source.subdir, d)]
    return list(dict.fromkeys(dirs))


def _find(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def locate(name: str, split: str, root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Paths of the files holding ``split`` of ``name``, all from the first folder that has them all.

    Parameters
    ----------
    name : str
        A downloadable data set, a key of :data:`SOURCES`: ``fashion-mnist``, ``mnist`` or ``cifar10``.
    split : str
        ``train`` or ``test``.
    root : str or PathLike, optional
        The folder searched first (:func:`search_dirs` gives the order). When given but not an existing
        folder, only the folders under it are searched, so that a mistyped root never falls back to another
        copy.

    Returns
    -------
    list of Path
        Each file raw or gzipped: the images and the labels (MNIST formats), or the CIFAR batches of the
        split.

    Raises
    ------
    DataError
        Naming the missing file, every folder searched, and how to obtain the data; or when a folder
        under ``root`` holds only part of the split (copies are never mixed).
    """
    stems = _IDX_NAMES[split] if name in ("fashion-mnist", "mnist") else _CIFAR_NAMES[split]
    dirs = search_dirs(name, root)
    mine = {d for d in dirs if root is not None and Path(root) in (d, *d.parents)}  # folders under --data-root
    if root is not None and not Path(root).is_dir():  # a mistyped --data-root must not fall back to another copy
        dirs = [d for d in dirs if d in mine]
    for d in dirs:
        found = [_find(d, s) for s in stems]
        if all(found):
            return cast(list[Path], found)
        if any(found) and d in mine:  # the user's own folder holds part of the split: never mix copies
            missing = [s for s, f in zip(stems, found) if f is None]
            raise DataError(f"{d} holds part of the {name} {split} split but not {', '.join(missing)} (raw or .gz); "
                            "add the missing file, or point --data-root at a complete copy")
    source = SOURCES[name]
    how = [f"pass download=True (or --download) to fetch {', '.join(source.files)} from {source.base_url}"]
    if source.apt:
        how.insert(0, f"install Debian's package: apt-get install {source.apt}")
    raise DataError(f"{name} {split} split not found: missing {stems[0]} (raw or .gz); searched "
                    f"{', '.join(str(d) for d in dirs)}. To get it: " + "; or ".join(how) +
                    "; or place the files in one of those folders.")


def download_dataset(name: str, root: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """Fetch the official files of ``name`` into ``root/name`` (default: the cache), verified.

    Returns the folder the data set now lives in.
    """
    source = SOURCES.get(name)
    if source is None:
        raise unknown_name("downloadable data set", name, SOURCES, DataError)
    target = Path(root or cache_dir()) / name
    for file, digest in source.files.items():
        dest = target / file
        if not dest.exists():
            fetch(source.base_url + file, dest, digest, progress=progress)
    if source.archive:
        assert source.subdir is not None, f"{name}: a Source with an archive must name its subdir"
        _unpack(target / source.archive, target, source.subdir)
    return target


def _unpack(archive: Path, target: Path, member_dir: str) -> None:
    """Extract ``member_dir`` from a tar archive into ``target`` atomically (rename at the end)."""
    if (target / member_dir).is_dir():
        return
    tmp = Path(tempfile.mkdtemp(prefix=".unpack.", dir=target))
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.split("/")[0] == member_dir]
            bad = [m.name for m in members if m.name.startswith("/") or ".." in m.name.split("/")
                   or not (m.isfile() or m.isdir())]
            if bad or not members:
                raise DataError(f"{archive}: unexpected archive content {bad or 'without ' + member_dir}")
            tar.extractall(tmp, members=members, filter="data")
        os.replace(tmp / member_dir, target / member_dir)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataError(f"{archive}: corrupt archive ({exc}); delete it and download again") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_dataset(name: str, split: str, root: str | os.PathLike[str] | None = None,
                 download: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Load one split of a data set.

    Parameters
    ----------
    name : str
        ``fashion-mnist``, ``mnist``, ``cifar10``, ``imagefolder`` (``root`` is the folder, with
        one sub-folder per class, or ``root/split`` when that exists) or ``fashion-mnist-sample``
        (the embedded sample: 80 images per class for train, 20 for test).
    split : str
        ``train`` or ``test``.
    root : path, optional
        Folder looked in first.
    download : bool
        Fetch the official files (sha256-verified) when they are not found.

    Returns
    -------
    x : numpy.ndarray, (N, C, H, W) float32 in [0, 1]
    y : numpy.ndarray, (N,) int64
    """
    if name not in DATASETS:
        raise unknown_name("data set", name, DATASETS, DataError)
    if split not in SPLITS:
        raise unknown_name("split", split, SPLITS, ConfigError)
    if name == "fashion-mnist-sample":
        x, y = embedded_sample()
        test = _sample_test_mask(y)
        keep = test if split == "test" else ~test
        return x[keep], y[keep]
    if name == "imagefolder":
        if root is None:
            raise DataError("imagefolder needs root=the folder holding one sub-folder per class")
        folder = Path(root) / split if (Path(root) / split).is_dir() else Path(root)
        images, labels, _ = read_image_folder(folder)
        return _to_float(images), labels
    try:
        paths = locate(name, split, root)
    except DataError:
        if not download:
            raise
        download_dataset(name, root)
        paths = locate(name, split, root)
    if name == "cifar10":
        parts = [read_cifar_batch(p) for p in paths]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
    else:
        images, labels = read_idx(paths[0]), read_idx(paths[1]).astype(np.int64)
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise DataError(f"{paths[0]} / {paths[1]}: images {images.shape} and labels {labels.shape} do not "
                            "form an (N, H, W) / (N,) pair")
        images = images[:, None]
    return _to_float(images), labels


def _to_float(images: np.ndarray) -> np.ndarray:
    return (images.astype(np.float32) / np.float32(255.0)) if images.dtype == np.uint8 else images.astype(np.float32)


SAMPLE_FILE = "fashion_mnist_sample.npz"


def embedded_sample() -> tuple[np.ndarray, np.ndarray]:
    """The embedded real sample: 1,000 Fashion-MNIST test images, 100 per class (MIT licence).

    The images are, for each class, the first 100 of that class in the official test split, in
    their original order (see ``make_embedded_sample``); ``audit/data/assets/FASHION-MNIST-LICENSE``
    holds the licence notice.

    Returns
    -------
    x : numpy.ndarray, (1000, 1, 28, 28) float32 in [0, 1]
    y : numpy.ndarray, (1000,) int64
    """
    with resources.files("audit.data").joinpath("assets", SAMPLE_FILE).open("rb") as f, np.load(f) as npz:
        return _to_float(npz["images"][:, None]), npz["labels"].astype(np.int64)


def embedded_sample_indices() -> np.ndarray:
    """Indices of the embedded images in the official Fashion-MNIST test split, (1000,) int64."""
    with resources.files("audit.data").joinpath("assets", SAMPLE_FILE).open("rb") as f, np.load(f) as npz:
        result: np.ndarray = npz["indices"].astype(np.int64)
        return result


def _sample_test_mask(y: np.ndarray, test_per_class: int = 20) -> np.ndarray:
    """The held-out part of the embedded sample: the last ``test_per_class`` images of each class."""
    mask = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        mask[np.flatnonzero(y == c)[-test_per_class:]] = True
    return mask


def make_embedded_sample(out: Path, per_class: int = 100, root: str | os.PathLike[str] | None = None) -> Path:
    """Write the embedded sample from the full Fashion-MNIST test split (provenance, reproducible)."""
    paths = locate("fashion-mnist", "test", root)
    images, labels = read_idx(paths[0]), read_idx(paths[1]).astype(np.int64)
    idx = np.sort(np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in range(10)]))
    return atomic_write(out, lambda f: np.savez_compressed(f, images=images[idx], labels=labels[idx].astype(np.uint8),
                                                           indices=idx.astype(np.int32)))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, read in 1 MB blocks (weight files run to gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def array_sha256(*arrays: np.ndarray) -> str:
    """sha256 over the bytes of the given arrays: identifies the exact data a model saw."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def balanced_sample(name: str, n: int, root: str | os.PathLike[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` class-balanced test images of data set ``name`` ("embedded": the shipped sample): the first
    of each class in order, round-robin. Returns x (n, C, H, W) float32 and y (n,) int64.

    Parameters
    ----------
    name : str
        ``"embedded"`` (the shipped 1,000-image sample, :func:`embedded_sample`), or a data set name for
        :func:`load_dataset`, whose ``test`` split is sampled.
    n : int
        How many images, from 1 to the split's size. Each round takes the next image of every class, in
        the order of the labels, until ``n`` are taken; a class that runs out drops out of the rounds.
    root : str or PathLike, optional
        The folder looked in first for the data's files (:func:`load_dataset`).

    Returns
    -------
    x : numpy.ndarray
        (n, C, H, W) float32 images in [0, 1].
    y : numpy.ndarray
        (n,) int64 labels.

    Raises
    ------
    DataError
        When ``n`` is not a positive integer or exceeds the split's size (and as :func:`load_dataset`).
    """
    x, y = embedded_sample() if name == "embedded" else load_dataset(name, "test", root)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise DataError(f"the number of images must be a positive integer, got {n!r}")
    if n > len(y):
        raise DataError(f"{n} images asked for, but the {name} test data hold {len(y)}; ask for at most {len(y)}")
    order: list[np.intp] = []
    per_class = {c: list(np.flatnonzero(y == c)) for c in np.unique(y)}
    while len(order) < n and any(per_class.values()):
        for c in sorted(per_class):
            if per_class[c] and len(order) < n:
                order.append(per_class[c].pop(0))
    idx = np.array(order)
    return x[idx], y[idx]


@dataclass
class FolderSample:
    """Images drawn from a class-per-folder tree: inputs ``x`` (n, C, H, W) float32, labels ``y``
    (n,) int64 indexing ``classes``, and ``files`` (paths relative to the root, in sample order)."""

    x: np.ndarray
    y: np.ndarray
    files: list[str]
    classes: list[str]


def sample_image_folder(root: str | os.PathLike[str], n: int, seed: int = 0,
                        preprocess: str | dict[str, Any] | Preprocess = "none") -> FolderSample:
    """``n`` images of the folder ``root`` (one sub-folder per class, as torchvision's ImageFolder),
    stratified: classes take turns, each giving its files in a seeded random order; only the drawn
    files are read, through ``preprocess`` (:func:`audit.data.preprocess.preprocess_from`).
    Images are RGB unless every drawn one is grayscale."""
    root = Path(root)
    spec = preprocess_from(preprocess)
    if not root.is_dir():
        raise DataError(f"image folder {root} not found; give --data-root the folder holding one sub-folder per class")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    rng = np.random.default_rng(seed)
    per_class = []
    for c in classes:
        files = sorted(f for f in (root / c).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        per_class.append([files[i] for i in rng.permutation(len(files))])
    total = sum(len(f) for f in per_class)
    if total == 0:
        raise DataError(f"{root}: no images found; expected one sub-folder per class holding image files "
                        f"({', '.join(sorted(IMAGE_SUFFIXES))})")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 or n > total:
        raise DataError(f"{n!r} images asked for, but {root} holds {total} in {len(classes)} classes; ask for 1 to "
                        f"{total}")
    drawn: list[tuple[Path, int]] = []
    turn = 0
    while len(drawn) < n:
        for label, files in enumerate(per_class):
            if turn < len(files) and len(drawn) < n:
                drawn.append((files[turn], label))
        turn += 1
    images = [open_image(f) for f, _ in drawn]
    channels = 1 if all(im.mode in ("L", "1", *DEEP_MODES) for im in images) else 3
    arrays = [spec(im, channels) for im in images]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise DataError(f"{root}: the drawn images have different sizes after preprocessing {sorted(shapes)}; give "
                        "a preprocess with resize and crop (e.g. preset imagenet)")
    return FolderSample(np.stack(arrays), np.array([label for _, label in drawn], dtype=np.int64),
                        [str(f.relative_to(root)) for f, _ in drawn], classes)
