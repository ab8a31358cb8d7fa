"""Measure sets: how two sets of maps are compared, the toolkit's way or a paper's.

The rank correlations (of the signed maps and of their magnitudes) are the same in every set: on one-channel
images, Adebayo et al.'s (2018) released code ranks the maps divided by their largest magnitude, which leaves the
ranks unchanged. SSIM and HOG differ:

* ``toolkit``: SSIM of the heatmaps clipped at their 0.5 / 99.5 percentiles and scaled to [0, 1], uniform 5 x 5
  window, data range 1, flip-invariant between maps not of one sign (a relevance map and its negation explain
  the same evidence); HOG of those maps, compared by the Pearson correlation of the descriptors (the paper's
  text, section 4).
* ``adebayo2018``: SSIM as the first author gave it for the paper's figures (sanity_checks_saliency issue 2):
  the signed maps divided by their largest magnitude, in [-1, 1], uniform 5 x 5 window, data range 2, no flip;
  HOG of the same maps compared by the Spearman correlation of the descriptors, as the released notebooks
  compute it (``spr(normal_hog, rand_hog)``; the text says Pearson). The notebooks' own SSIM call (maps min-max
  scaled to [0, 1], Gaussian window, scikit-image's float default range 2) differs from the author's answer;
  the answer is taken, as the one stated for the paper.
"""
from __future__ import annotations

from dataclasses import dataclass

from audit.errors import ConfigError

SSIM_MAPS = ("clipped", "signed-max")
HOG_CORRELATIONS = ("pearson", "spearman")


@dataclass(frozen=True)
class MeasureSet:
    """How SSIM and HOG compare two maps (the rank correlations are the same in every set).

    Attributes
    ----------
    name : str
        The set's name (:data:`MEASURE_SETS`).
    ssim_maps : str
        ``clipped``: the heatmap clipped at its 0.5 / 99.5 percentiles, scaled to [0, 1]; ``signed-max``: the
        signed map (the channel sum) divided by its largest magnitude, in [-1, 1]. HOG reads the same maps.
    window : int
        The side of SSIM's uniform window (odd).
    data_range : float
        SSIM's data range (the constants' scale): 1 for maps in [0, 1], 2 for maps in [-1, 1].
    flip_invariant : bool
        SSIM takes the larger of the map and its sign flip, for pairs not of one sign.
    hog_correlation : str
        ``pearson`` or ``spearman``: how two HOG descriptors are correlated.
    """

    name: str
    ssim_maps: str = "clipped"
    window: int = 5
    data_range: float = 1.0
    flip_invariant: bool = True
    hog_correlation: str = "pearson"

    def __post_init__(self) -> None:
        if self.ssim_maps not in SSIM_MAPS or self.hog_correlation not in HOG_CORRELATIONS or self.window % 2 != 1:
            raise ConfigError(f"invalid measure set {self}: ssim_maps in {SSIM_MAPS}, hog_correlation in "
                              f"{HOG_CORRELATIONS}, an odd window")


MEASURE_SETS = {s.name: s for s in (
    MeasureSet("toolkit"),
    MeasureSet("adebayo2018", ssim_maps="signed-max", data_range=2.0, flip_invariant=False,
               hog_correlation="spearman"),
)}


def measure_set(name: str | MeasureSet) -> MeasureSet:
    """The :class:`MeasureSet` called ``name`` (a set is returned as it is); a :class:`ConfigError` naming the sets
    for an unknown name."""
    if isinstance(name, MeasureSet):
        return name
    if name not in MEASURE_SETS:
        raise ConfigError(f"unknown measure set {name!r}; valid: {', '.join(MEASURE_SETS)}")
    return MEASURE_SETS[name]
