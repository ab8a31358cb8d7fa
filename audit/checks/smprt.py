"""Smooth model parameter randomization test, sMPRT (Hedstroem et al. 2023, "Sanity Checks
Revisited").

Gradient-like maps are noisy, and noise alone lowers the similarity between the trained model's
map and a randomized model's map, flattering a method. sMPRT denoises first: each map is the mean
of the method's maps over N noisy copies of the input (Gaussian, standard deviation ``noise`` times
the image's value range, the last copy noise-free), before and after each randomization stage
(bottom-up by default); maps are compared by the Spearman rank correlation of their magnitudes
(normalising by the second moment, as Quantus does, does not change ranks). The noise is drawn
once per image (seeded) and reused at every stage, so stages differ only by their weights. Lower
similarity after full randomization is better.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attributions.explainer import Explainer, attribute_many
from audit.checks.base import Check, MedianScore, Option, UnitResult
from audit.checks.coverage import paragraph as coverage_paragraph
from audit.checks.coverage import record as coverage_record
from audit.checks.randomization import ORDERS, STAGE_OPTIONS, stage_figure, stage_maps
from audit.errors import ConfigError
from audit.inputs import check_inputs
from audit.measures.similarity import correlation, screen, unit_ranks
from audit.sections import ReportContext, Section

COLUMNS = ["method", "stage", "layer", "image", "spearman", "share"]
CHUNK = 256  # images per attribution call: noisy copies are explained in batches of this size


def noisy_copies(x: torch.Tensor, n_samples: int, noise: float, seed: int) -> torch.Tensor:
    """N copies of each image with Gaussian noise of standard deviation ``noise`` x (max - min) of
    that image, the last copy noise-free: (B, ...) -> (N, B, ...). Seeded; the global RNG is untouched."""
    if n_samples < 1 or noise < 0:
        raise ConfigError(f"sMPRT needs n_samples >= 1 and noise >= 0, got {n_samples} and {noise}")
    flat = x.reshape(x.shape[0], -1)
    scale = (flat.max(1).values - flat.min(1).values).reshape(-1, *([1] * (x.ndim - 1)))
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn((n_samples, *x.shape), generator=gen, dtype=x.dtype).to(x.device) * (noise * scale)
    eps[-1] = 0.0
    return x[None] + eps


def smooth_mprt(model: torch.nn.Module, x, y, methods="all", seed: int = 0, n_samples: int = 50, noise: float = 0.1,
                order: str = "bottom-up", bn: str = "reset", target: str = "true", init: str = "reset",
                reduction: dict | None = None, progress: bool = True, granularity: str = "auto") -> pd.DataFrame:
    """sMPRT: Spearman correlation of denoised maps' magnitudes before and after each randomization stage.

    Parameters
    ----------
    model : nn.Module; never modified (stages are copies)
    x : (B, C, H, W) images; y : (B,) labels
    methods : names, "all" or a comma-separated string
    seed : seeds the noise and the re-initialisations
    n_samples : noisy copies averaged per map (the last one noise-free); 1 is the plain MPRT
    noise : standard deviation of the noise, as a fraction of each image's value range
    order, bn, target, init, granularity : as :func:`~audit.checks.randomization.randomization_with_maps`
        (bottom-up by default, as Hedstroem et al.)

    Returns
    -------
    DataFrame, one row per method x stage x image: method, stage (0 = trained), layer, image,
    spearman (of |denoised map| with the trained model's; 1 at stage 0), share (of the parameters
    re-initialised in that stage's model).
    """
    x, y = check_inputs(model, x, y)
    copies = noisy_copies(x, n_samples, noise, seed)
    batch = copies.reshape(-1, *x.shape[1:])

    def denoised(explainers: dict[str, Explainer], x: torch.Tensor, t: torch.Tensor, envs) -> dict[str, torch.Tensor]:
        # the stage's shared forward pass is for x alone: the noisy copies get their own, in chunks
        tt = t.repeat(n_samples)
        total: dict[str, torch.Tensor] = {}
        for start in range(0, len(batch), CHUNK):
            part = attribute_many(explainers, batch[start:start + CHUNK], [tt[start:start + CHUNK]])
            for m, v in part.items():
                total[m] = torch.cat([total[m], v[0]]) if m in total else v[0]
        return {m: v.reshape(n_samples, *x.shape).mean(0) for m, v in total.items()}

    rows: list[dict] = []
    first: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # the trained model's maps, ranked once
    for stage in stage_maps(model, x, y, methods, order, bn, target, seed, init, reduction, progress,
                            "smooth_mprt", explain=denoised, granularity=granularity):
        for m, v in stage.maps.items():
            bad, clean = screen(v.abs())
            ranked = unit_ranks(clean)
            bad_ref, ref_ranks = first.setdefault(m, (bad, ranked))
            rho = np.where(bad_ref | bad, np.nan, correlation(ref_ranks, ranked))
            rows += [{"method": m, "stage": stage.stage, "layer": stage.layer, "image": i, "spearman": float(rho[i]),
                      "share": stage.share} for i in range(len(rho))]
    return pd.DataFrame(rows, columns=COLUMNS)


def _run(model, x, y, method, config, progress) -> UnitResult:
    return UnitResult(smooth_mprt(model, x, y, [method], seed=config.seed, n_samples=config.smprt_samples,
                                  noise=config.smprt_noise, order=config.smprt_order, bn=config.bn, target=config.target,
                                  init=config.init, progress=progress, granularity=config.granularity))


def _sections(table: pd.DataFrame, context: ReportContext) -> list[Section]:
    threshold = getattr(context.config, "smprt_threshold", None)
    figures = [stage_figure(table, m, "spearman", "Spearman of |denoised map|", f"smprt_{m}",
                            f"sMPRT on {m}: Spearman correlation of each denoised map's magnitude with the trained "
                            "model's as layers are randomized", (-0.05, 1.05), threshold,
                            "a method whose interval lies at or above it after the last stage is rejected")
               for m in table.model.unique()]
    return [Section("Smooth MPRT (sMPRT)", text="Maps averaged over noisy inputs before comparison, so that noise "
                    "alone does not lower the similarity. Lower after full randomization is better. "
                    + coverage_paragraph(context.run, "smprt_coverage.csv", list(table.model.unique())),
                    figures=figures)]


def _last_stage(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.stage == df.stage.max()]


CHECK = Check(
    coverage=lambda model, x, config: coverage_record(model, x, config, config.smprt_order),
    name="smprt", cite=("hedstrom2024",), title="Smooth MPRT (sMPRT)", reference="Hedstroem et al. 2023", result_file="smprt.csv",
    columns=COLUMNS, run=_run, sections=_sections, order=41,
    summary=lambda df: f"median Spearman at full randomization {_last_stage(df).spearman.median():.3f}",
    verdict=MedianScore("smprt_spearman", "smprt", "weight-insensitive (denoised)", "smprt_threshold",
                        score_name="Spearman of magnitudes (sMPRT)", metric="spearman",
                        select=_last_stage),
    description="maps averaged over noisy inputs, compared by Spearman of magnitudes after each randomization stage",
    options=STAGE_OPTIONS + (
        Option("smprt_order", "bottom-up", "layer order of sMPRT's randomization", choices=ORDERS),
        Option("smprt_samples", 50, "noisy copies averaged per sMPRT map (the last noise-free)", valid=lambda v: v >= 1,
               rule=">= 1"),
        Option("smprt_noise", 0.1, "sMPRT noise, standard deviation as a fraction of the image's range",
               valid=lambda v: v >= 0, rule=">= 0"),
        Option("smprt_threshold", 0.5, "median Spearman at full randomization from which a method counts as "
               "weight-insensitive", valid=lambda v: 0 < v <= 1, rule="in (0, 1]")),
    controls={"edge": "rejected"})
