"""The options every randomization check shares, and the one value its stages are built from.

The cascading, independent and bottom-up checks, eMPRT and sMPRT re-initialise a model stage by stage
(:mod:`audit.checks.stages`, :mod:`audit.checks.reinit`); how they do it is one frozen
:class:`StageSettings` (order, BatchNorm policy, re-initialisation, granularity, explained class, seed), built
from their common :class:`StageOptions` and each check's own order.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from audit.checks.options import Options, option
from audit.checks.reinit import BN_POLICIES, INITS
from audit.checks.stages import GRANULARITIES
from audit.inputs import check_option
from audit.measures.measure_sets import MEASURE_SETS

ORDERS = ("cascading", "independent", "bottom-up")
TARGETS = ("true", "predicted")
GRID_SCALES = ("map", "row")


@dataclass(frozen=True)
class StageSettings:
    """How a randomization check builds and explains its stages.

    Parameters
    ----------
    order : ``cascading`` (from the logits down, cumulatively), ``independent`` (one part at a time) or ``bottom-up``
    bn : reset (a re-initialised BatchNorm gets gamma 1, beta 0, mean 0, var 1, as Sixt) | keep-stats (kept
        trained, as Adebayo)
    init : ``reset``, ``gaussian`` or ``permute``, the re-initialisation scheme (:mod:`audit.checks.reinit`)
    granularity : ``layer``, ``block`` or ``auto`` (block for a model with blocks), what one stage re-initialises
    target : true (the label, as Sixt) | predicted (each stage's own prediction, as Adebayo)
    seed : seeds the re-initialisations
    images_per_seed : how many consecutive images share one re-initialisation seed (:mod:`audit.checks.replicates`:
        the seeds grow with the images); as many as the images given is one seed for all
    first_image : the run's index of the first image given (a block of a run keeps the seeds its images have in
        the whole run)
    """

    order: str = "cascading"
    bn: str = "reset"
    init: str = "reset"
    granularity: str = "auto"
    target: str = "true"
    seed: int = 0
    images_per_seed: int = 2
    first_image: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.images_per_seed, int) or self.images_per_seed < 1:
            raise ValueError(f"images_per_seed must be a positive integer, got {self.images_per_seed!r}")
        check_option("order", self.order, ORDERS)
        check_option("BatchNorm policy", self.bn, BN_POLICIES)
        check_option("re-initialisation", self.init, INITS)
        check_option("granularity", self.granularity, GRANULARITIES)
        check_option("target", self.target, TARGETS)



def measures_option() -> Any:
    """The key of every check that compares maps by Adebayo et al.'s four measures (one declaration, a field of
    each such class)."""
    return option("toolkit", "how SSIM and HOG compare two maps: toolkit (clipped maps in [0, 1], flip-invariant "
                  "SSIM, HOG by Pearson) or adebayo2018 (signed maps in [-1, 1], SSIM data range 2 without flip, HOG "
                  "by Spearman, as the paper's authors computed them); the rank correlations are the same in both",
                  choices=tuple(MEASURE_SETS))


def images_per_seed_option() -> Any:
    """The key of every check that re-initialises a model (one declaration, a field of each such class)."""
    return option(2, "consecutive images that share one re-initialisation seed: the seeds grow with the images (8 "
                  "for 16 images), and the verdict's interval resamples the seeds, then the images within each, so "
                  "that it holds the spread between seeds (a fixed 3 seeds do not keep the stated error, by "
                  "simulation)", valid=lambda v: v >= 1, rule=">= 1")


def heatmap_scale() -> Any:
    """The key of every check whose report shows heatmap grids (one declaration, a field of each such class)."""
    return option("map", "colour scale of the report's heatmap grids: each map its own (map, as Adebayo et al.'s "
                  "figures) or one per method row (row)", choices=GRID_SCALES)


@dataclass(frozen=True)
class StageOptions(Options):
    """The keys of every randomization check (each check adds its own order and scores)."""

    bn: str = option("reset", "BatchNorm of a re-initialised stage: reset (Sixt) or keep-stats (its statistics and "
                     "affine parameters kept trained, Adebayo)", choices=BN_POLICIES)
    target: str = option("true", "explained class: the true label (Sixt) or each stage's prediction (Adebayo)",
                         choices=TARGETS)
    init: str = option("reset", "re-initialisation: reset (each module's reset_parameters, as Quantus, else the "
                       "library's _init_weights; tokens, embeddings and layer scales from a truncated normal with "
                       "their trained sigma), gaussian (that truncated normal for every tensor, biases zero, after "
                       "Adebayo) or permute (every trained tensor shuffled: same distribution)", choices=INITS)
    granularity: str = option("auto", "what one randomization stage re-initialises: a block of the model's module "
                              "tree (block), one weighted layer (layer, the order of earlier versions) or block where "
                              "the model has blocks (auto)", choices=GRANULARITIES)
    images_per_seed: int = images_per_seed_option()
    heatmap_scale: str = heatmap_scale()

    def stages(self, order: str, seed: int, first_image: int = 0) -> StageSettings:
        """The settings of a check that randomizes in ``order``, seeded by ``seed``, over images from the run's
        ``first_image`` on."""
        return StageSettings(order=order, bn=self.bn, init=self.init, granularity=self.granularity,
                             target=self.target, seed=seed, images_per_seed=self.images_per_seed,
                             first_image=first_image)


def stage_settings(stages: StageSettings | None, overrides: dict[str, Any], *, order: str = "cascading") -> StageSettings:
    """The settings a randomization function runs with: ``stages`` (default: every field's default, in ``order``)
    with the fields a caller gave as keywords (``overrides``: order, bn, init, granularity, target, seed)."""
    base = stages if stages is not None else StageSettings(order=order)
    unknown = sorted(set(overrides) - set(StageSettings.__dataclass_fields__))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}: the stage settings are "
                        f"{', '.join(StageSettings.__dataclass_fields__)}")
    return dataclasses.replace(base, **overrides) if overrides else base
