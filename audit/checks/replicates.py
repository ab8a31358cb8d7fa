"""Re-initialisation seeds shared out over the images.

A check that re-initialises the model (the randomization stages, the untrained floor of the data-randomization
test) draws its new weights from a seed. One seed for every image makes the verdict a statement about that one
draw: the images vary, the draw does not, and the interval says nothing about another seed. Here consecutive
images share a seed, ``images_per_seed`` of them each (image i of the run has replicate i // images_per_seed and
the seed :func:`replicate_seed` of it), so that the seeds grow with the images: each score is one draw of an
(image, seed) pair, a sequential run that reads more images reads more seeds, and the verdict's interval
resamples the seeds, then the images within each (:func:`~audit.measures.statistics.nested_median_ci`). A block of
a run keeps the seeds its images have in the whole run (``first_image``).
"""
from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import numpy as np
import pandas as pd
import torch
from torch import nn

from attributions.graph import trace
from audit.checks.passes import model_errors
from audit.errors import AuditError, ModelError

if TYPE_CHECKING:
    from audit.checks.stage_options import StageSettings


def replicates(first_image: int, n: int, images_per_seed: int) -> np.ndarray:
    """(n,) the replicate of each of ``n`` images from the run's index ``first_image`` on: the run's image index
    divided by ``images_per_seed``, rounded down."""
    return (first_image + np.arange(n)) // images_per_seed


def replicate_seed(seed: int, replicate: int) -> int:
    """The re-initialisation seed of ``replicate``: ``seed`` itself for the first, one derived from it and the
    replicate for the others (distinct, and never the run's next seed)."""
    return seed if replicate == 0 else zlib.crc32(f"{seed}:replicate {replicate}".encode())


def seed_groups(first_image: int, n: int, images_per_seed: int, seed: int) -> list[tuple[slice, int, int]]:
    """The ``n`` images given, from the run's index ``first_image`` on, in runs of one seed each: (the images' slice,
    their replicate, its seed from the run's ``seed``), in image order (a replicate's images are consecutive)."""
    groups = replicates(first_image, n, images_per_seed)
    out = []
    for r in np.unique(groups):
        where = np.flatnonzero(groups == r)
        out.append((slice(int(where[0]), int(where[-1]) + 1), int(r), replicate_seed(seed, int(r))))
    return out


class SeededPart(NamedTuple):
    """Images of one re-initialisation seed: ``x`` (b, C, H, W) and ``y`` (b,), their ``images`` (a slice of the
    images given), their ``replicate`` and the one-seed ``stages`` that draw it."""

    x: torch.Tensor
    y: torch.Tensor
    images: slice
    replicate: int
    stages: StageSettings


T = TypeVar("T")


def per_seed(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None, stages: StageSettings, name: str,
             run: Callable[[SeededPart], T]) -> list[tuple[T, SeededPart]]:
    """``run`` on the images given in runs of one seed each (:class:`SeededPart`, in image order), with its result.

    Parameters
    ----------
    model : the audited model (not modified)
    x : (B, C, H, W) images, the run's images ``stages.first_image`` to ``stages.first_image + B - 1``
    y : (B,) labels (None: an :class:`~audit.errors.AuditError` naming the check, ``name``)
    stages : the check's settings; their ``seed`` is the run's, ``images_per_seed`` how many images share one
    run : the check on one seed's images

    Inputs the model does not take fail in the first seed's run: the model is then traced on all of them, so that
    the error names the inputs as given, not that seed's share of them.
    """
    if y is None:
        raise AuditError(f"{name} needs the labels y")
    out = []
    for k, (images, r, seed) in enumerate(seed_groups(stages.first_image, len(x), stages.images_per_seed,
                                                        stages.seed)):
        part = SeededPart(x[images], y[images], images, r,
                          dataclasses.replace(stages, seed=seed, first_image=0, images_per_seed=max(len(x), 1)))
        try:
            out.append((run(part), part))
        except ModelError:
            if k == 0:
                with model_errors():
                    trace(model, x)
            raise
    return out


def image_order(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a table joined from parts of its images in the order of the whole: grouped by the columns
    before ``image`` (method, stage, layer), groups in order of first appearance, images ascending in each."""
    key = list(table.columns[: list(table.columns).index("image")])
    if not key:
        return table.sort_values("image", kind="stable", ignore_index=True)
    rank = table.groupby(key, sort=False, dropna=False).ngroup()
    return table.assign(_group=rank).sort_values(["_group", "image"], kind="stable", ignore_index=True) \
        .drop(columns="_group")


def joined(parts: list[tuple[pd.DataFrame, SeededPart]], columns: list[str]) -> pd.DataFrame:
    """One table of ``columns`` from the tables of :func:`per_seed`'s runs, each with its part, its ``image``
    numbered from 0 in its run. Images are numbered as given, each row carries its ``replicate``, and the rows are in
    the order of one run over all the images (:func:`image_order`)."""
    tables = [t.assign(image=t["image"] + part.images.start, replicate=part.replicate) for t, part in parts
              if not t.empty]
    if not tables:
        return pd.DataFrame(columns=columns)
    return image_order(pd.concat(tables, ignore_index=True)[columns])
