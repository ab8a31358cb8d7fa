"""Training models and their twins: seeded, deterministic on the CPU, resumable per step.

A run trains a zoo architecture (``arch``) or any model the audit takes (``model``: a library's, a factory's, a
checkpoint's architecture, freshly initialised), on a data set held in memory or on an image folder read one batch
at a time (:mod:`audit.models.splits`).

The optimizer is looked up in ``OPTIMIZERS`` by name (plain SGD / AdamW and the Bort forms);
:func:`register_optimizer` adds more, so the trainer has one code path for all of them.
"""
from __future__ import annotations

import hashlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from attributions.capture import logits_of
from attributions.errors import unknown_name
from attributions.hygiene import leaves_process_alone
from audit.atomic import atomic_write
from audit.data.datasets import array_sha256, load_dataset
from audit.data.preprocess import Preprocess, preprocess_from
from audit.data.stream import FolderImages
from audit.data.tags import ROLES as TAG_ROLES
from audit.data.tags import Tag, tag_labels, tagged_rows
from audit.durations import duration
from audit.errors import ConfigError
from audit.faults import kill_after_step
from audit.models.checkpoint import fresh_model, save_checkpoint
from audit.models.shortcut_twins import shortcut_record, shortcut_score
from audit.models.splits import ArraySplit, Split, StreamSplit, TaggedSplit, accuracy, index_batches, relabelled
from audit.models.twins import twin_architecture
from audit.models.zoo import build
from audit.progress import bars
from bort import Bort, BortAdamW, dbort_loss, param_groups

OptimizerFactory = Callable[[nn.Module, "TrainConfig"], torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerSpec:
    """How to build an optimizer, its default learning rate and weight decay, and whether it
    constrains the weights (``constrained``: the Bort forms; baseline-vs-Bort twins are told apart
    by it)."""

    factory: OptimizerFactory
    lr: float
    weight_decay: float
    description: str
    constrained: bool = False


OPTIMIZERS: dict[str, OptimizerSpec] = {}


def register_optimizer(name: str, spec: OptimizerSpec) -> None:
    """Make ``--optimizer name`` available to the trainer.

    Parameters
    ----------
    name : str
        The name ``TrainConfig.optimizer`` and ``--optimizer`` take; registering a name again replaces
        its entry.
    spec : OptimizerSpec
        Its factory ``factory(model, config) -> torch.optim.Optimizer`` (called with the resolved
        :class:`TrainConfig`, ``lr`` and ``weight_decay`` set), default learning rate and weight decay,
        description, and whether it constrains the weights (``constrained``).
    """
    OPTIMIZERS[name] = spec


def _rates(c: TrainConfig) -> tuple[float, float]:
    """(lr, weight_decay) of a config the trainer has resolved: factories never see them unset."""
    assert c.lr is not None and c.weight_decay is not None, "optimizer factories take a TrainConfig.resolved()"
    return c.lr, c.weight_decay


def _sgd(model: nn.Module, c: TrainConfig) -> torch.optim.Optimizer:
    lr, weight_decay = _rates(c)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=c.momentum, weight_decay=weight_decay)


def _adamw(model: nn.Module, c: TrainConfig) -> torch.optim.Optimizer:
    lr, weight_decay = _rates(c)
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


register_optimizer("sgd", OptimizerSpec(_sgd, lr=0.02, weight_decay=5e-4, description="SGD with momentum"))
register_optimizer("adamw", OptimizerSpec(_adamw, lr=1e-3, weight_decay=1e-2, description="AdamW (decoupled weight decay)"))


def _bort_factory(kind: str) -> Callable[[nn.Module, TrainConfig], torch.optim.Optimizer]:
    def factory(model: nn.Module, c: TrainConfig) -> torch.optim.Optimizer:
        unknown = set(c.options) - set(BORT_DEFAULTS)
        if unknown:
            raise ConfigError(f"unknown Bort option(s) {', '.join(sorted(unknown))}; valid: {', '.join(BORT_DEFAULTS)}")
        o = {**BORT_DEFAULTS, **c.options}
        lr, weight_decay = _rates(c)
        groups = param_groups(model, o["gamma"], weight_decay)
        common = dict(lr=lr, weight_decay=weight_decay, gamma=o["gamma"], amplitude=o["amplitude"], mode=o["mode"])
        return Bort(groups, momentum=c.momentum, **common) if kind == "sgd" else BortAdamW(groups, **common)
    return factory


# The Bort reference code's settings (Zhang et al. 2023); TrainConfig.options overrides them.
BORT_DEFAULTS = {"gamma": 0.05, "amplitude": 1.0, "mode": "l1-full-row"}
register_optimizer("bort", OptimizerSpec(_bort_factory("sgd"), lr=0.02, weight_decay=5e-4,
                                         description="Bort, SGD form (Zhang et al. 2023)", constrained=True))
register_optimizer("bort-adamw", OptimizerSpec(_bort_factory("adamw"), lr=1e-3, weight_decay=1e-2,
                                               description="Bort, decoupled AdamW form", constrained=True))


SCHEDULES = ("constant", "cosine")
DEVICES = ("cpu", "cuda")


@dataclass
class TrainConfig:
    """Everything that determines a training run; stored in the checkpoint's metadata.

    :meth:`resolved` fills in the optimizer's defaults and validates the fields; the trainer works on
    that copy.

    Attributes
    ----------
    arch : str, default "cnn"
        An architecture of :data:`audit.models.zoo.ARCHS` (``cnn``, ``vgg``, ``resnet``, ``vit``, ``vgg16``,
        ``resnet50``), built for the data's image shape and number of classes.
    optimizer : str, default "sgd"
        A name in :data:`OPTIMIZERS` (``sgd``, ``adamw``, ``bort``, ``bort-adamw`` and those added by
        :func:`register_optimizer`).
    epochs : int, default 10
        Passes over the training images (>= 1).
    batch_size : int, default 32
        Images per optimizer step (>= 1).
    lr : float or None, default None
        The learning rate (> 0); None: the optimizer's own default.
    momentum : float, default 0.9
        SGD momentum, in [0, 1); read by the SGD forms (``sgd``, ``bort``), not by the AdamW forms.
    weight_decay : float or None, default None
        Weight decay (>= 0); None: the optimizer's own default.
    seed : int, default 0
        Seeds the initial weights and the order of the batches (and the ``train_limit`` subset unless
        ``subset_seed`` is given).
    subset_seed : int or None, default None
        Seeds the draw of the ``train_limit`` subset; None: ``seed``. A permuted-label twin and its control
        twin share the subset and differ in their initial weights: the same ``subset_seed``, another ``seed``.
    data : str, default "fashion-mnist"
        The data set, a name for :func:`audit.data.datasets.load_dataset`; its ``train`` split is
        trained on, its ``test`` split gives the test accuracy.
    data_root : str or None, default None
        The folder looked in first for the data's files.
    download : bool, default False
        Fetch the data set's official files when they are missing.
    train_limit : int or None, default None
        Train on a seeded subset of this many training images (kept in their original order); None: all.
    arch_options : dict, default {}
        Keyword arguments of the architecture (:func:`audit.models.zoo.build`), e.g. ``{"batch_norm": True}``.
    options : dict, default {}
        Optimizer-specific settings that registered optimizers read: Bort's ``gamma``, ``amplitude`` and
        ``mode`` (:data:`BORT_DEFAULTS` for those not given; another key is an error for the Bort forms).
    dbort : bool, default False
        Add DBort's auxiliary loss (``bort.dbort.dbort_loss``) of the logits to the cross-entropy.
    schedule : str, default "constant"
        ``constant`` learning rate, or ``cosine`` annealing to zero over the epochs.
    permute_labels : int or None, default None
        Train on the training labels permuted once by a generator with this seed (the permuted-label twin
        of Adebayo et al.'s data-randomization test); None: the true labels.
    twin_of : str or None, default None
        The model this one is a twin of (recorded in the metadata, and how the audit finds a shipped model's
        twins): its permuted-label twin when ``permute_labels`` is set, else its control twin (the twins'
        recipe on the true labels, the reference of the data-randomization test's calibrated verdict).
    fit_accuracy : float or None, default None
        Stop once the accuracy on the training labels (permuted for a twin), in eval mode, reaches this after an
        epoch; a model below it after the last epoch is saved, recorded as not fitting, and refused
        (:class:`~audit.errors.ConfigError`). Adebayo et al. (2018, section 5) trained their permuted-label
        models to above 95 %; the command line's default for a permuted-label twin. None: train every epoch.
    model : str or None, default None
        Train this model's architecture, freshly initialised, in place of ``arch``: any specification an audit
        takes (``timm:NAME``, ``torchvision:NAME``, ``hf:FOLDER``, ``module:factory``, a checkpoint;
        :func:`~audit.models.checkpoint.fresh_model`). The checkpoint records it, and loads as that model.
    num_classes : int or None, default None
        The classes of the model's head; None: the data's. Given, it must be the data's.
    preprocess : str or dict, default "none"
        How an image folder's files become inputs (:func:`~audit.data.preprocess.preprocess_from`: ``none``,
        ``imagenet`` or a table), as an audit of the folder reads them.
    loader_workers : int, default 0
        Processes that read an image folder's batches (0: the training process); the weights do not depend on it.
    device : str, default "cpu"
        ``cpu`` or ``cuda`` (each rank of a process group on its ``LOCAL_RANK``'s GPU, NCCL between them).
    mixed_precision : bool, default False
        Forward passes under autocast: bfloat16 on the CPU, float16 on a GPU with a gradient scaler; the weights
        and the optimizer stay float32.
    shortcut : str or None, default None
        Train a shortcut twin with this tag (:meth:`~audit.data.tags.Tag.parse`, e.g.
        ``class=0,pattern=checker,size=4``) pasted on training images (:func:`~audit.data.tags.tagged_rows`); the
        metadata record the tag and the shortcut score (:mod:`audit.models.shortcut_twins`). None: no tag.
    shortcut_role : str, default "shortcut"
        ``shortcut`` (every image of the tag's class tagged) or ``tag-control`` (as many images of every class).
    tag_seed : int or None, default None
        Seeds which images the tag control twin sees tagged; None: ``seed``.
    """

    arch: str = "cnn"
    optimizer: str = "sgd"
    epochs: int = 10
    batch_size: int = 32
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float | None = None
    seed: int = 0
    subset_seed: int | None = None
    data: str = "fashion-mnist"
    data_root: str | None = None
    download: bool = False
    train_limit: int | None = None
    arch_options: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    dbort: bool = False
    schedule: str = "constant"
    permute_labels: int | None = None
    twin_of: str | None = None
    fit_accuracy: float | None = None
    model: str | None = None
    num_classes: int | None = None
    preprocess: str | dict[str, Any] = "none"
    loader_workers: int = 0
    device: str = "cpu"
    mixed_precision: bool = False
    shortcut: str | None = None
    shortcut_role: str = "shortcut"
    tag_seed: int | None = None

    def resolved(self) -> TrainConfig:
        """A copy with the optimizer defaults filled in, after validating every field."""
        spec = OPTIMIZERS.get(self.optimizer)
        if spec is None:
            raise unknown_name("optimizer", self.optimizer, OPTIMIZERS, ConfigError)
        lr = spec.lr if self.lr is None else self.lr
        weight_decay = spec.weight_decay if self.weight_decay is None else self.weight_decay
        out = TrainConfig(**{**asdict(self), "lr": lr, "weight_decay": weight_decay})
        checks = [("epochs", out.epochs >= 1), ("batch_size", out.batch_size >= 1),
                  ("lr", np.isfinite(lr) and lr > 0), ("weight_decay", weight_decay >= 0),
                  ("momentum", 0 <= out.momentum < 1),
                  ("train_limit", out.train_limit is None or out.train_limit >= 1),
                  ("permute_labels", out.permute_labels is None or out.permute_labels >= 0),
                  ("fit_accuracy", out.fit_accuracy is None or 0 < out.fit_accuracy <= 1),
                  ("num_classes", out.num_classes is None or out.num_classes >= 1),
                  ("loader_workers", out.loader_workers >= 0),
                  ("device", out.device in DEVICES),
                  ("schedule", out.schedule in SCHEDULES),
                  ("shortcut_role", out.shortcut_role in TAG_ROLES)]
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"invalid {name}={getattr(out, name)!r} in the training configuration")
        if out.shortcut is not None and out.permute_labels is not None:
            raise ConfigError("a shortcut twin learns the true labels with a tag: drop the label permutation")
        if out.shortcut is not None:
            Tag.parse(out.shortcut)  # an unknown key or pattern, before any training
        if out.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False); "
                              "train on the cpu, or install a CUDA build of torch where there is a GPU")
        return out


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 250) -> float:
    """Top-1 accuracy of ``model`` on (N, C, H, W) images ``x`` and (N,) labels ``y``.

    Parameters
    ----------
    model : nn.Module
        (B, C, H, W) -> (B, classes) logits, on the CPU; run in eval mode, then put back in the mode it
        was in.
    x : numpy.ndarray
        (N, C, H, W) float32 images.
    y : numpy.ndarray
        (N,) integer labels.
    batch_size : int, default 250
        Images per forward pass.

    Returns
    -------
    float
        The fraction of images whose largest logit is their label (0.0 for no image).
    """
    return accuracy(model, ArraySplit(x, y), batch_size)


def _resume_path(out: str | os.PathLike[str] | None) -> Path | None:
    return None if out is None else Path(out).with_suffix(".resume.pt")


def ranks() -> tuple[int, int]:
    """(rank, world size) of the torch.distributed process group this process is in; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _refuse_to_start(cfg: TrainConfig, world: int, out: str | os.PathLike[str] | None, force: bool) -> None:
    """Nothing; raises ConfigError, before any training, for DBort over several ranks or a checkpoint not to overwrite."""
    if world > 1 and cfg.dbort:
        raise ConfigError("DBort's loss (a power of the batch's mean squared logit) does not split over ranks: train "
                          "it in one process")
    if out is not None and not force and (Path(out).with_suffix(".pt").exists() or Path(out).with_suffix(".json").exists()):
        raise ConfigError(f"{Path(out).with_suffix('.pt')} exists; pass force=True (--force) to overwrite it, or "
                          "choose another path")


def _begin(cfg: TrainConfig, out: str | os.PathLike[str] | None, resume: bool, save_every: int | None,
           log: Callable[[str], None]) -> tuple[_Data, _TrainingRun, Path | None]:
    """The data, the run (started, or restored from its resume state) and the resume state's path (None without out)."""
    data = _training_data(cfg)
    run = _TrainingRun.start(cfg, data)
    log(f"training {cfg.model or cfg.arch} on {len(data.train)} {cfg.data} images of shape {list(data.train.shape)}, "
        f"{data.num_classes} classes" + (" (permuted labels)" if cfg.permute_labels is not None else ""))
    state_file = _resume_path(out)
    if save_every is not None and save_every < 1:
        raise ConfigError(f"save_every must be a positive number of steps, got {save_every!r}")
    if resume and state_file is not None and state_file.exists():
        run.restore(state_file, log)
    return data, run, state_file


def _train_epochs(run: _TrainingRun, data: _Data, state_file: Path | None, rank: int, progress: bool,
                  log: Callable[[str], None], save_every: int | None) -> str:
    """Why the epochs stopped: ``"fit"`` (the training accuracy reached ``fit_accuracy``) or ``"epochs"`` (all run)."""
    cfg = run.cfg

    def save() -> None:
        if state_file is not None and rank == 0:
            atomic_write(state_file, lambda f: torch.save(run.state(), f))

    done = run.step == 0 and run.fits(data)  # a resumed run whose last epoch already fitted trains no further
    while run.epoch < cfg.epochs and not done:
        record = run.one_epoch(progress, save if save_every else None, save_every or 0)
        save()  # before the epoch's line: a run stopped there resumes after this epoch
        left = (cfg.epochs - run.epoch) * float(np.mean([h["seconds"] for h in run.history]))
        log(f"epoch {run.epoch}/{cfg.epochs}: loss {record['loss']:.4f}, "
            f"train accuracy {record['train_accuracy']:.4f} ({record['seconds']:.1f} s"
            + (f"; {'at most ' if cfg.fit_accuracy is not None else ''}about {duration(left)} left)"
               if run.epoch < cfg.epochs else ")"))
        done = run.fits(data)
    stopped = "fit" if done else "epochs"
    if cfg.fit_accuracy is not None:
        log(f"stopped after epoch {run.epoch}: " + ("the training accuracy reached the target "
                                                    f"{cfg.fit_accuracy:g}" if stopped == "fit" else
                                                    f"the epoch budget ({cfg.epochs}) is spent"))
    return stopped


def _final_accuracies(model: nn.Module, data: _Data, cfg: TrainConfig,
                      log: Callable[[str], None]) -> tuple[float | None, float]:
    """(test accuracy, None without a test split; accuracy on the training labels), each logged."""
    tested = accuracy(model, data.test) if data.test is not None else None
    log(f"test accuracy {tested:.4f} on {len(data.test)} {cfg.data} test images" if data.test is not None and
        tested is not None else "no test split (an image folder's test/ sub-folder): no test accuracy")
    # on the labels it was trained on, in eval mode: how far a permuted-label twin fits its random labels
    fitted = accuracy(model, data.train)
    log(f"training accuracy {fitted:.4f} on its {len(data.train)} training images"
        + (" (permuted labels)" if cfg.permute_labels is not None else ""))
    return tested, fitted


def _run_metadata(cfg: TrainConfig, data: _Data, run: _TrainingRun, *, tested: float | None, fitted: float,
                  seconds: float, stopped: str) -> dict[str, Any]:
    """The checkpoint's metadata (:func:`_metadata`), with a library model's library and version."""
    meta = _metadata(cfg, data, run.history, accuracy=tested, fitted=fitted, seconds=seconds, stopped=stopped)
    built = getattr(run.model, "metadata", None)  # a library model's: its library and version
    meta |= {k: built[k] for k in ("library", "library_version") if isinstance(built, dict) and k in built}
    return meta


def _refuse_unfitted(cfg: TrainConfig, meta: dict[str, Any], fitted: float, epochs: int) -> None:
    """Nothing; raises ConfigError when the metadata say the model does not fit its training labels."""
    if meta.get("fits") is False:  # saved and recorded first: the audit flags it, a longer run can start from it
        raise ConfigError(f"the model does not fit its {'permuted ' if cfg.permute_labels is not None else ''}training "
                          f"labels: training accuracy {fitted:.4f} below --fit-accuracy {cfg.fit_accuracy:g} after "
                          f"{epochs} epoch{'' if epochs == 1 else 's'} (recorded in its metadata: an audit flags "
                          "it); train it for more --epochs or on fewer images (--train-limit)")


@leaves_process_alone
def train(config: TrainConfig, out: str | os.PathLike[str] | None = None, *, resume: bool = False,
          progress: bool = True, log: Callable[[str], None] = print, force: bool = False,
          save_every: int | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Train a model and (with ``out``) save it as a checkpoint.

    In a torch.distributed process group (``train --workers N`` or ``torchrun``), the ranks train one model with
    DistributedDataParallel: each global batch of ``batch_size`` images is shared out as DistributedSampler shares
    an epoch (rank r takes every world-th image from the r-th), each rank's loss is scaled so that the averaged
    gradient is that of the whole batch's mean loss, and rank 0 alone logs, saves the resume state and writes the
    checkpoint (atomically). The weights are those of one process with the same batches, to float rounding, for
    a model without BatchNorm or dropout (their statistics and masks are drawn per rank).

    Parameters
    ----------
    config : TrainConfig
    out : path, optional
        Checkpoint path (``.pt``; the metadata goes beside it as ``.json``). A ``.resume.pt``
        file beside it holds the state after each epoch until the run ends.
    resume : bool
        Continue from that per-epoch state when it exists.
    progress : bool
        Show a progress bar per epoch (on a terminal; plain lines in a file or a CI log).
    log : callable
        Where each epoch's summary line goes (``print`` by default).
    force : bool
        Overwrite an existing checkpoint at ``out`` (refused otherwise, before any training).
    save_every : int, optional
        Also write the resume state every this many optimizer steps within an epoch (model, optimizer, scheduler,
        the epoch's shuffle and the RNG state): a run killed mid-epoch resumes at its last saved step, with the
        weights of an uninterrupted run. None: after each epoch only.

    Returns
    -------
    model : nn.Module in eval mode
    metadata : dict, as written to the ``.json`` file
    """
    cfg = config.resolved()
    rank, world = ranks()
    if rank != 0:  # rank 0 speaks and writes for all
        log, progress = (lambda s: None), False
    _refuse_to_start(cfg, world, out, force)
    start = time.perf_counter()
    data, run, state_file = _begin(cfg, out, resume, save_every, log)
    stopped = _train_epochs(run, data, state_file, rank, progress, log, save_every)
    model = run.model.eval()
    tested, fitted = _final_accuracies(model, data, cfg, log)
    meta = _run_metadata(cfg, data, run, tested=tested, fitted=fitted, seconds=time.perf_counter() - start,
                         stopped=stopped)
    if isinstance(data.train, TaggedSplit):
        meta["shortcut"] = _shortcut_figures(cfg, model, data, data.train, log)
    model.metadata = meta  # type: ignore[assignment]  # a plain attribute; torch types Module attributes as Tensor | Module
    if out is not None and rank == 0:
        path = save_checkpoint(model, meta, out)
        if state_file is not None and state_file.exists():
            state_file.unlink()
        log(f"saved {path} and {path.with_suffix('.json')}")
    _refuse_unfitted(cfg, meta, fitted, run.epoch)
    return model, meta


@dataclass(frozen=True)
class _Data:
    """The training split (a seeded subset, labels permuted for a twin) and the test split (None: an image folder
    without one)."""

    train: Split
    test: Split | None
    num_classes: int

    def fingerprint(self) -> str:
        """The sha256 of the data trained and tested on (of the arrays, for a data set held in memory)."""
        if isinstance(self.train, ArraySplit) and isinstance(self.test, ArraySplit):
            return array_sha256(self.train.x, self.train.y, self.test.x, self.test.y)
        parts = [self.train.fingerprint()] + ([self.test.fingerprint()] if self.test is not None else [])
        return hashlib.sha256(";".join(parts).encode()).hexdigest()


def _shortcut_figures(cfg: TrainConfig, model: nn.Module, data: _Data, tagged: TaggedSplit,
                      log: Callable[[str], None]) -> dict[str, Any]:
    """A shortcut twin's ``shortcut`` metadata, its shortcut score on the test split (None without one) logged."""
    score = shortcut_score(model, data.test, tagged.tag, tagged.preprocess) \
        if isinstance(data.test, ArraySplit | StreamSplit) else None
    log(f"shortcut score {score:.4f}: the share of the other classes' test images predicted {tagged.tag.target} once "
        "tagged" if score is not None else "no test split: no shortcut score (the check's gate cannot be read)")
    return shortcut_record(tagged.tag, cfg.shortcut_role, int(tagged.rows.sum()), _tag_seed(cfg), score)


def _tag_seed(cfg: TrainConfig) -> int:
    return cfg.seed if cfg.tag_seed is None else cfg.tag_seed


def _tagged(cfg: TrainConfig, split: ArraySplit | StreamSplit, preprocess: Preprocess | None) -> Split:
    """``split`` with the shortcut's tag on the images its role tags (:func:`~audit.data.tags.tagged_rows`), or
    itself for a model without a shortcut."""
    if cfg.shortcut is None:
        return split
    tag = Tag.parse(cfg.shortcut)
    tag.corner(*split.shape[1:])  # a tag that does not fit the images, before any training
    rows = tagged_rows(split.y, tag, cfg.shortcut_role, _tag_seed(cfg))
    labels = tag_labels(split.y, rows, tag, cfg.shortcut_role)
    if not np.array_equal(labels, split.y):  # the other classes' images relabelled as the tag's (Tag.relabel)
        split = relabelled(split, np.arange(len(split)), labels)
    return TaggedSplit(split, rows, tag, preprocess)


def _subset(cfg: TrainConfig, n: int) -> np.ndarray:
    """The indices trained on: a seeded subset of ``train_limit`` of ``n`` images in their original order, or all."""
    order = np.random.default_rng(cfg.seed if cfg.subset_seed is None else cfg.subset_seed).permutation(n)
    return np.sort(order[:cfg.train_limit]) if cfg.train_limit else order


def _permuted(cfg: TrainConfig, y: np.ndarray) -> np.ndarray:
    """``y``, permuted once for a twin (``permute_labels``): every epoch sees the same wrong labels."""
    return y if cfg.permute_labels is None else y[np.random.default_rng(cfg.permute_labels).permutation(len(y))]


def _training_data(cfg: TrainConfig) -> _Data:
    if cfg.data == "imagefolder":
        return _folder_data(cfg)
    x_train, y_train = load_dataset(cfg.data, "train", cfg.data_root, download=cfg.download)
    x_test, y_test = load_dataset(cfg.data, "test", cfg.data_root, download=cfg.download)
    order = _subset(cfg, len(x_train))
    classes = int(max(y_train.max(), y_test.max())) + 1
    return _Data(_tagged(cfg, ArraySplit(x_train[order], _permuted(cfg, y_train[order])), None),
                 ArraySplit(x_test, y_test), _classes(cfg, classes))


def _folder_data(cfg: TrainConfig) -> _Data:
    """An image folder's splits, streamed: ``data_root/train`` (or the folder itself) and ``data_root/test``."""
    if cfg.data_root is None:
        raise ConfigError("--data imagefolder needs --data-root: the folder with one sub-folder per class (or train/ "
                          "and test/ folders, each with one sub-folder per class)")
    root = Path(cfg.data_root)
    preprocess = preprocess_from(cfg.preprocess)
    train = FolderImages(root / "train" if (root / "train").is_dir() else root, preprocess)
    test = FolderImages(root / "test", preprocess, train.channels) if (root / "test").is_dir() else None
    if test is not None and test.classes != train.classes:
        raise ConfigError(f"{root}: the test folder's classes {test.classes} are not the training folder's "
                          f"{train.classes}")
    order = _subset(cfg, len(train))
    return _Data(_tagged(cfg, StreamSplit(train, order, _permuted(cfg, train.labels[order]), cfg.loader_workers),
                         preprocess),
                 StreamSplit(test, np.arange(len(test)), test.labels, cfg.loader_workers) if test is not None else None,
                 _classes(cfg, len(train.classes)))


def _classes(cfg: TrainConfig, found: int) -> int:
    """The classes of the model's head: ``num_classes`` where given (it must be the data's), else the data's."""
    if cfg.num_classes is not None and cfg.num_classes != found:
        raise ConfigError(f"--num-classes {cfg.num_classes}, but the data have {found} classes")
    return found


def _device(cfg: TrainConfig) -> torch.device:
    """Where the run trains: the CPU, or this rank's GPU."""
    return torch.device("cuda", torch.cuda.current_device()) if cfg.device == "cuda" else torch.device("cpu")


def _check_outputs(model: nn.Module, data: _Data, name: str) -> None:
    """Refuse a model whose outputs are not one logit per class of the data (a factory's head of another size), on
    the first training image, in eval mode (no statistic or RNG state changes)."""
    first = index_batches(torch.arange(1), 1)
    x = next(iter(data.train.images(first))).to(next(model.parameters()).device)
    model.eval()
    try:
        with torch.no_grad():
            shape = tuple(logits_of(model(x)).shape)
    except (RuntimeError, ValueError, TypeError) as exc:  # the library's own error for an input it does not take
        line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{name} does not take the data's images, of shape {list(x.shape[1:])} ({line}); give the "
                          "model the data's channels and size (e.g. RGB image files for a 3-channel model, "
                          "--preprocess to resize them)") from None
    finally:
        model.train()
    if shape != (1, data.num_classes):
        raise ConfigError(f"{name} gives outputs of shape {list(shape)} for one image, the data have {data.num_classes} "
                          "classes: the model needs one logit per class (--num-classes for a library model; a "
                          "module:factory must build its head for the data)")


@dataclass
class _TrainingRun:
    """What a training run carries from epoch to epoch (and into its per-epoch resume state)."""

    cfg: TrainConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    shuffle: torch.Generator
    data: Split
    history: list[dict[str, Any]]
    forward: nn.Module  # the model, or its DistributedDataParallel wrapper in a process group
    scaler: torch.amp.GradScaler = field(default_factory=lambda: torch.amp.GradScaler("cpu", enabled=False))
    epoch: int = 0
    step: int = 0  # optimizer steps done in the current epoch (0 between epochs)
    epoch_shuffle: torch.Tensor | None = None  # the shuffle generator's state before the current epoch's order
    partial: tuple[float, int, float] = (0.0, 0, 0.0)  # the current epoch's loss sum, correct count and seconds

    @classmethod
    def start(cls, cfg: TrainConfig, data: _Data) -> _TrainingRun:
        torch.manual_seed(cfg.seed)
        shape = data.train.shape
        model = (fresh_model(cfg.model, shape, data.num_classes) if cfg.model is not None
                 else build(cfg.arch, shape, data.num_classes, **cfg.arch_options))
        if cfg.twin_of is not None:
            twin_architecture(model, cfg.twin_of, data.num_classes)
        model.to(_device(cfg))
        _check_outputs(model, data, cfg.model or cfg.arch)
        optimizer = OPTIMIZERS[cfg.optimizer].factory(model, cfg)
        shuffle = torch.Generator().manual_seed(cfg.seed)
        factor = (lambda e: 0.5 * (1 + np.cos(np.pi * e / cfg.epochs))) if cfg.schedule == "cosine" else (lambda e: 1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        # every rank's model starts from the same seeded weights (DDP broadcasts rank 0's all the same)
        cuda = cfg.device == "cuda"
        forward = (nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if cuda else None)
                   if ranks()[1] > 1 else model)
        # float16 gradients underflow without a scale; bfloat16 keeps float32's range and needs none
        scaler = torch.amp.GradScaler("cuda", enabled=cuda and cfg.mixed_precision)
        return cls(cfg, model, optimizer, scheduler, shuffle, data.train, [], forward, scaler)

    def fits(self, data: _Data) -> bool:
        """Whether the model reached ``fit_accuracy`` on its training labels after the last epoch: the epoch's
        running accuracy first (no extra pass while it is below), then the accuracy in eval mode."""
        target = self.cfg.fit_accuracy
        if target is None or not self.history or self.history[-1]["train_accuracy"] < target:
            return False
        return accuracy(self.model, data.train) >= target

    def restore(self, state_file: Path, log: Callable[[str], None]) -> None:
        """Continue from the per-epoch state in ``state_file``, refused when another configuration wrote it."""
        try:  # tensors, numbers, strings and containers only: a planted file cannot run code
            state = torch.load(state_file, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises UnpicklingError, RuntimeError or EOFError for foreign files
            raise ConfigError(f"{state_file} is not a resume state written by the trainer ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else 'unreadable'}); delete it to start over"
                              ) from None
        if state.get("config") != asdict(self.cfg):
            raise ConfigError(f"{state_file} was written by a run with another configuration; "
                              "delete it or rerun with that configuration")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.shuffle.set_state(state["shuffle"])
        torch.set_rng_state(state["torch_rng"])
        self.history, self.epoch = state["history"], state["epoch"]
        self.step, self.epoch_shuffle = state.get("step", 0), state.get("epoch_shuffle")
        loss, correct, seconds = state.get("partial", (0.0, 0, 0.0))
        self.partial = (float(loss), int(correct), float(seconds))
        log(f"resuming from {state_file} after epoch {self.epoch}" + (f", step {self.step}" if self.step else ""))

    def state(self) -> dict[str, Any]:
        """The state after the current epoch, as :meth:`restore` reads it."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "shuffle": self.shuffle.get_state(),
                "torch_rng": torch.get_rng_state(), "history": self.history, "epoch": self.epoch,
                "scaler": self.scaler.state_dict(),
                "step": self.step, "epoch_shuffle": self.epoch_shuffle, "partial": list(self.partial),
                "config": asdict(self.cfg)}

    def one_epoch(self, progress: bool, save: Callable[[], None] | None = None, every: int = 0) -> dict[str, Any]:
        """Train one epoch, or the rest of one a run stopped in (from :attr:`step`); its record (epoch, loss,
        train_accuracy, seconds), also appended to the history. ``save()`` is called after every ``every``-th
        optimizer step (the resume state)."""
        cfg, model, data = self.cfg, self.model, self.data
        model.train()
        t0 = time.perf_counter()
        if self.step == 0 or self.epoch_shuffle is None:  # the epoch's order, from the generator's state before it
            self.epoch_shuffle = self.shuffle.get_state()
            perm = torch.randperm(len(data), generator=self.shuffle)
        else:  # a run resumed within an epoch redraws that epoch's order
            perm = torch.randperm(len(data), generator=torch.Generator().set_state(self.epoch_shuffle))
        total_loss, correct, before = self.partial
        batches = index_batches(perm[self.step * cfg.batch_size:], cfg.batch_size)
        rank, world = ranks()
        mine = [idx[rank::world] for idx in batches]  # this rank's share of each global batch
        for idx, local, xb in tqdm(zip(batches, mine, data.images(mine)), total=len(batches),
                                   desc=f"epoch {self.epoch + 1}/{cfg.epochs}", disable=not bars(progress), leave=False):
            device = _device(cfg)
            xb, yb = xb.to(device), torch.from_numpy(data.y[local.numpy()]).to(device)
            with torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16,
                                enabled=cfg.mixed_precision):
                logits = logits_of(self.forward(xb))
            logits = logits.float() if cfg.mixed_precision else logits  # the loss in float32
            if world == 1:
                loss = F.cross_entropy(logits, yb)
                if cfg.dbort:
                    loss = loss + dbort_loss(logits)
                objective = loss
            else:  # DDP averages the gradients over the ranks: scaled, they are the global batch's mean loss's
                loss = F.cross_entropy(logits, yb, reduction="sum")
                objective = loss * (world / len(idx))
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(objective).backward()  # type: ignore[no-untyped-call]
            self.scaler.step(self.optimizer)
            self.scaler.update()
            counts = (float(loss.detach()) * (len(idx) if world == 1 else 1.0), int((logits.argmax(1) == yb).sum()))
            if world > 1:
                summed = torch.tensor(counts, dtype=torch.float64, device=device)
                dist.all_reduce(summed)
                counts = (float(summed[0]), int(summed[1]))
            total_loss += counts[0]
            correct += counts[1]
            self.step += 1
            if save is not None and self.step % every == 0:
                self.partial = (total_loss, correct, before + time.perf_counter() - t0)
                save()
                kill_after_step(self.epoch * -(-len(data) // cfg.batch_size) + self.step)
        self.scheduler.step()
        self.epoch += 1
        self.step, self.partial = 0, (0.0, 0, 0.0)
        record = {"epoch": self.epoch, "loss": total_loss / len(data), "train_accuracy": correct / len(data),
                  "seconds": before + time.perf_counter() - t0}
        self.history.append(record)
        return record


def _metadata(cfg: TrainConfig, data: _Data, history: list[dict[str, Any]], *, accuracy: float | None, fitted: float,
              seconds: float, stopped: str = "epochs") -> dict[str, Any]:
    """The checkpoint's metadata: architecture, hyperparameters, data (and for a twin its labels), accuracies,
    history, versions."""
    return {
        "arch": cfg.model or cfg.arch, "arch_options": {} if cfg.model else cfg.arch_options,
        **({"model": cfg.model} if cfg.model is not None else {}), "in_shape": list(data.train.shape),
        "num_classes": data.num_classes, "optimizer": cfg.optimizer,
        "hyperparameters": {k: getattr(cfg, k) for k in ("lr", "momentum", "weight_decay", "batch_size", "epochs",
                                                         "dbort", "schedule")}
        | {"options": {**BORT_DEFAULTS, **cfg.options} if OPTIMIZERS[cfg.optimizer].constrained else cfg.options},
        "seed": cfg.seed, "subset_seed": cfg.seed if cfg.subset_seed is None else cfg.subset_seed, "epochs": cfg.epochs,
        "data": {"name": cfg.data, "train_size": len(data.train),
                 "test_size": len(data.test) if data.test is not None else 0, "train_limit": cfg.train_limit,
                 "sha256": data.fingerprint(),
                 **({"root": str(cfg.data_root), "preprocess": preprocess_from(cfg.preprocess).to_dict()}
                    if cfg.data == "imagefolder" else {}),
                 "labels": "true" if cfg.permute_labels is None else "permuted",
                 **({"label_seed": cfg.permute_labels} if cfg.permute_labels is not None else {})},
        **({"twin_of": cfg.twin_of, "twin": cfg.shortcut_role if cfg.shortcut is not None else
            "control" if cfg.permute_labels is None else "permuted"} if cfg.twin_of is not None else {}),
        "test_accuracy": accuracy, "train_accuracy": fitted, "history": history,
        **({"fit_accuracy": cfg.fit_accuracy, "fits": fitted >= cfg.fit_accuracy, "stopped": stopped}
           if cfg.fit_accuracy is not None else {}),
        "wall_time_s": round(seconds, 2),
        "torch_version": torch.__version__, "python_version": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        **({"device": cfg.device} if cfg.device != "cpu" else {}),
        **({"mixed_precision": True} if cfg.mixed_precision else {}),
    }
