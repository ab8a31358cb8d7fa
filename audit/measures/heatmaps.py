"""From attribution maps to comparable heatmaps, and the similarity scores between two sets."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from attributions.controls import sobel_magnitude
from attributions.methods import build_method
from audit.errors import AuditError
from audit.measures.measure_sets import MeasureSet, measure_set
from audit.measures.similarity import (
    by_largest_magnitude,
    correlation,
    hog_features,
    local_means,
    map_signs,
    normalized_from_sorted,
    reduce_map,
    screen,
    sign_flip_allowed,
    ssim,
    undefined_where,
    unit_centred,
    unit_ranks,
)


def heatmaps(maps: dict[str, torch.Tensor], reduction: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """{method: (N, C, H, W) maps} -> {method: (N, H, W) raw heatmaps}.

    Each method's own reduction (:attr:`attributions.Method.heatmap`: the signed channel sum for
    relevance and contributions, the largest magnitude for gradient-like maps) unless
    ``reduction`` names another for it.

    Parameters
    ----------
    maps : dict
        Method name -> its (N, C, H, W) attribution maps; the names must be method names
        (:func:`attributions.methods.build_method` gives their default reduction).
    reduction : dict, optional
        Method name -> ``"sum"`` or ``"max-abs"`` (:func:`~audit.measures.similarity.reduce_map`),
        overriding the method's own reduction.

    Returns
    -------
    dict
        Method name -> (N, H, W) float64 heatmaps on the CPU, detached.
    """
    reduction = reduction or {}
    return {m: reduce_map(v.detach().cpu().double(), reduction.get(m, build_method(m).heatmap))
            for m, v in maps.items()}


def signed_heatmaps(maps: dict[str, torch.Tensor], reduction: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """{method: (N, C, H, W) maps} -> {method: (N, H, W) signed channel sums}, for the methods whose heatmap
    reduction drops the sign (``max-abs``): the signed ("diverging") Spearman correlation of Adebayo et al. (2018)
    is computed on a map that keeps its sign. Methods whose reduction is the signed sum are left out (their
    heatmap is already signed)."""
    reduction = reduction or {}
    return {m: reduce_map(v.detach().cpu().double(), "sum") for m, v in maps.items()
            if reduction.get(m, build_method(m).heatmap) != "sum"}


# what a map may follow without the model: the result column of its Spearman correlation with each, and its name
FOLLOWED = {"input_spearman_abs": "|input|", "edge_spearman_abs": "the input's edges"}


def input_structure(x: torch.Tensor) -> dict[str, np.ndarray]:
    """What a map may follow without the model (:data:`FOLLOWED`), as rank vectors: the input's magnitude (max
    ``|.|`` over channels) and its edges (the Sobel magnitude, max over channels: the edge control's heatmap) ->
    {column: (B, H * W)} (:func:`follows`)."""
    x = x.detach().double().cpu()
    magnitude, edges = x.abs().amax(1), sobel_magnitude(x).amax(1)
    return dict(zip(FOLLOWED, (unit_ranks(magnitude), unit_ranks(edges))))


def follows(maps: ComparableMaps, structure: dict[str, np.ndarray], start: int = 0) -> dict[str, np.ndarray]:
    """The Spearman correlations of the magnitudes of ``maps[start:]`` (any multiple of the images, sets stacked)
    with each of the input's :func:`input_structure` -> {column: (M,)}."""
    ranks = maps.abs_ranks[start:]
    return {column: correlation(reference, ranks) for column, reference in structure.items()}


class ComparableMaps:
    """Raw heatmaps (N, H, W) with what the similarity measures read, computed once: which maps are
    :func:`~audit.measures.similarity.degenerate`, each map's sign (:func:`~audit.measures.similarity.map_signs`),
    the rank vectors of the signed maps and of their magnitudes (:func:`~audit.measures.similarity.unit_ranks`),
    the normalised maps and (when first read) the rank vectors of their HOG descriptors. One sort of each map gives
    its ranks and the percentiles its normalisation clips at.

    ``signed``: (N, H, W) signed channel sums of maps whose heatmap ``raw`` dropped the sign (a max-abs
    reduction, :func:`signed_heatmaps`): the signed ranks are theirs, the magnitudes' ranks ``raw``'s.
    ``measures``: the :class:`~audit.measures.measure_sets.MeasureSet` (or its name) that says which maps SSIM and
    HOG read (``normalized``)."""

    def __init__(self, raw: torch.Tensor, signed: torch.Tensor | None = None,
                 measures: str | MeasureSet = "toolkit"):
        self.measures = measure_set(measures)
        self.bad, self.raw = screen(raw)
        flat = self.raw.reshape(len(raw), -1).double()
        values = flat.numpy()
        order = np.argsort(values, axis=1)
        ordered = np.take_along_axis(values, order, 1)
        self.ranks = unit_ranks(values, order, ordered)
        self.signs = map_signs(values)
        # maps without negative values (the max-abs reduction's) are their own magnitudes
        self.abs_ranks = self.ranks if (self.signs == 1).all() else unit_ranks(np.abs(values))
        signed_maps = None if signed is None else screen(signed)[1]
        if signed_maps is not None:
            self.ranks = unit_ranks(signed_maps)
        if self.measures.ssim_maps == "signed-max":
            self.normalized = by_largest_magnitude(self.raw if signed_maps is None else signed_maps)
        else:
            self.normalized = normalized_from_sorted(flat, torch.from_numpy(ordered)).reshape(self.raw.shape)

    @functools.cached_property
    def hog_units(self) -> np.ndarray:
        """(N, F) the normalised maps' HOG descriptors, centred and of unit length (their dot products are Pearson
        correlations) or their centred unit ranks (Spearman), as the measure set says; computed when first read
        (a quarter of the measures' time, which a comparison without HOG does not pay)."""
        features = hog_features(self.normalized)
        return unit_ranks(features) if self.measures.hog_correlation == "spearman" else unit_centred(features)

    def __len__(self) -> int:
        return len(self.raw)

    def _take_head(self, source: ComparableMaps, n: int) -> None:
        """The first ``n`` maps' measures of ``source`` as this object's (views; nothing recomputed)."""
        self.measures = source.measures
        for name in ("bad", "raw", "signs", "ranks", "abs_ranks", "normalized", "hog_units"):
            setattr(self, name, getattr(source, name)[:n])


class ReferenceMaps(ComparableMaps):
    """The maps (N, H, W) that later sets of maps are compared with: raw heatmaps, or the first N of
    a :class:`ComparableMaps` (a batch whose first set is the reference, prepared with the others).

    Parameters
    ----------
    raw : Tensor or ComparableMaps
        (N, H, W) raw heatmaps, or a :class:`ComparableMaps` whose first ``n`` maps are the reference
        (their measures are taken as views, nothing recomputed).
    n : int, optional
        How many leading maps of a :class:`ComparableMaps` are the reference; default all of them.
        Ignored for raw heatmaps.
    signed : Tensor, optional
        (N, H, W) signed channel sums of raw heatmaps that dropped the sign (:class:`ComparableMaps`).
    measures : str or MeasureSet, default "toolkit"
        How SSIM and HOG compare the maps (:mod:`audit.measures.measure_sets`); a :class:`ComparableMaps` given
        as ``raw`` brings its own.

    Attributes
    ----------
    bad : numpy.ndarray
        (N,) bool, the :func:`~audit.measures.similarity.degenerate` maps (constant or non-finite).
    raw : Tensor
        (N, H, W) the heatmaps, NaN / inf set to 0.
    signs : numpy.ndarray
        (N,) int8, each map's sign (:func:`~audit.measures.similarity.map_signs`).
    ranks, abs_ranks : numpy.ndarray
        (N, H * W) unit-length centred ranks of the signed maps and of their magnitudes.
    normalized : Tensor
        (N, H, W) the maps SSIM and HOG read: clipped at their 0.5 / 99.5 percentiles and scaled to [0, 1], or
        (the ``signed-max`` measure set) the signed maps divided by their largest magnitude.
    hog_units : numpy.ndarray
        (N, F) the normalised maps' HOG descriptors, centred and of unit length, or their centred unit ranks.
    measures : MeasureSet
        As given.
    means : Tensor
        (2, N, H - w + 1, W - w + 1) float64, SSIM's local means of the normalised maps and of their
        squares (:func:`~audit.measures.similarity.local_means`), computed once.
    """

    def __init__(self, raw: torch.Tensor | ComparableMaps, n: int | None = None,
                 signed: torch.Tensor | None = None, measures: str | MeasureSet = "toolkit"):
        if isinstance(raw, ComparableMaps):
            self._take_head(raw, len(raw) if n is None else n)
        else:
            super().__init__(raw, signed, measures)
        # SSIM's local means of the reference, filtered once
        self.means = local_means(self.normalized, self.measures.window)

    def compare(self, other: torch.Tensor | ComparableMaps) -> dict[str, np.ndarray]:
        """SSIM of the normalised maps (flip-invariant, where the measure set says so, for pairs not of one sign:
        :func:`~audit.measures.similarity.sign_flip_allowed`), Spearman of the signed maps and of their
        magnitudes, and the correlation (Pearson or Spearman, as the measure set says) of the normalised maps' HOG
        descriptors; each (M,), NaN where either map is :func:`~audit.measures.similarity.degenerate`.

        Parameters
        ----------
        other : raw heatmaps (M, H, W), or their :class:`ComparableMaps` prepared with the same measure set; M
            may be any multiple of N (several sets stacked, each compared with the reference)
        """
        other = other if isinstance(other, ComparableMaps) else ComparableMaps(other, measures=self.measures)
        if other.measures != self.measures:
            raise AuditError(f"maps prepared for the {other.measures.name!r} measures cannot be compared with a "
                             f"reference prepared for {self.measures.name!r}")
        times = len(other) // len(self)
        if times * len(self) != len(other):
            raise AuditError(f"{len(other)} maps cannot be compared with {len(self)} reference maps: the number must "
                             "be a multiple")
        bad = other.bad | np.tile(self.bad, times)
        reference, means = ((self.normalized.repeat(times, 1, 1), self.means.repeat(1, times, 1, 1)) if times > 1
                            else (self.normalized, self.means))
        flips = (sign_flip_allowed(np.tile(self.signs, times), other.signs) if self.measures.flip_invariant
                 else False)
        return undefined_where(bad, {
            "ssim": ssim(reference, other.normalized, win_size=self.measures.window,
                         data_range=self.measures.data_range, flip_invariant=flips, a_means=means).numpy(),
            "spearman": correlation(self.ranks, other.ranks), "spearman_abs": correlation(self.abs_ranks,
                                                                                          other.abs_ranks),
            "hog": correlation(self.hog_units, other.hog_units)})
